/* bench-see — See et al. 2017's pointer-generator with coverage in psm, the
 * model of pipelines/cnndm_coverage.cfg with the vocabulary of the issue's
 * reference (20k): the same computation as bench/see_torch.py.
 *   bench-see train SECONDS [B T TY]   training steps on one batch (every
 *                                      source T tokens, every target TY;
 *                                      the sources from BENCH_SEE_ARTICLES,
 *                                      see fill_batch), then the per-phase
 *                                      profile
 *   bench-see vocab DIR                builds the vocabulary from the
 *                                      training split and saves it in DIR, as
 *                                      a training run saves it in its folder
 *   bench-see decode FILE [N [DIR]]    beam 4, exactly 100 tokens, over the
 *                                      first N articles of FILE (one a line;
 *                                      bench/run.sh writes the validation
 *                                      articles of ../shared/data/cnndm); with
 *                                      DIR, as psm-run --mode decode on a run
 *                                      folder: the vocabulary read from DIR,
 *                                      the training split not read
 * Run from the build tree (PSM_PLUGIN_PATH=plugins/.libs): it builds the
 * model from the pipeline (BENCH_SEE_CFG, default pipelines/cnndm_coverage.cfg)
 * as psm-run would, vocabulary from ../shared/data/cnndm's training split,
 * parameters at their random initial values. BENCH_LSTM_ROWS=1 turns off
 * the LSTM's split by columns at few rows a thread (psm_paths.lstm_cols),
 * for the A/B of BENCHMARKS.md j. */
#include "config.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "run/run-internal.h"
#include "bench-common.h"

static void
die (GError *e)
{
  fprintf (stderr, "bench-see: %s\n", e->message);
  exit (1);
}

/* One batch, every position real: sources of T words, targets of TY. The
 * sources are the first B articles of at least T tokens of a file (one
 * article a line; bench/run.sh writes the CNN/DailyMail validation articles),
 * tokenised and mapped as the task does: how often words repeat in a batch
 * sets the work of the encoder's input projection (each distinct word is
 * projected once, core/ops/matmul.c). Without a file, uniform random ids with
 * about 1 in 1000 outside the vocabulary (20 per-batch OOV words). Targets:
 * uniform random ids (the decoder's and head's work does not depend on the
 * words). */
static void
fill_batch (PsmBatch *b, const PsmTaskClass *tk, void *task, const PsmTaskInfo *in, const char *articles, int B,
            int T, int TY, PsmRng *rng)
{
  const int V = in->ext_base;
  int n_oov = 20;
  PsmBatch text;
  psm_batch_init (&text);
  if (articles) {
    GError *e = NULL;
    char **lines = psm_read_lines (articles, "articles", &e);
    if (!lines)
      die (e);
    GPtrArray *pick = g_ptr_array_new ();
    for (int i = 0; lines[i] && (int) pick->len < B; i++) {
      char **w = g_strsplit_set (lines[i], " \t", -1);
      int n = 0;
      for (int k = 0; w[k]; k++)
        n += w[k][0] != 0;
      if (n >= T)
        g_ptr_array_add (pick, lines[i]);
      g_strfreev (w);
    }
    if ((int) pick->len < B || !tk->text_batch
        || !tk->text_batch (task, (const char *const *) pick->pdata, B, &text, &e) || text.T < T) {
      fprintf (stderr, "bench-see: %s: no %d articles of %d tokens%s%s\n", articles, B, T, e ? ": " : "",
               e ? e->message : "");
      exit (1);
    }
    n_oov = text.oov_words ? (int) text.oov_words->len : 0;
    g_ptr_array_free (pick, TRUE);
    g_strfreev (lines);
  }
  psm_batch_reserve (b, B, T, TY);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < B; j++) {
      int i = t * B + j;
      int32_t w = articles ? text.src_ext[(size_t) t * text.B + j]
                           : 4 + (int32_t) (psm_rng_uniform (rng) * (V + n_oov - 4));
      b->src_ext[i] = w;
      b->src[i] = w < V ? w : in->unk_id;
      b->src_mask[i] = 1.0f;
    }
  for (int t = 0; t < TY; t++)
    for (int j = 0; j < B; j++) {
      int i = t * B + j;
      int32_t w = 4 + (int32_t) (psm_rng_uniform (rng) * (V + n_oov - 4));
      b->tgt_ext[i] = w;
      b->tgt[i] = w < V ? w : in->unk_id;
      b->tgt_mask[i] = 1.0f;
      b->tgt_switch[i] = w < V;
      b->tgt_loc[i] = -1;
      b->dec_in[i] = t == 0 ? in->bos_id : b->tgt[i - B];
    }
  b->ext_base = V;
  if (!b->oov_words)
    b->oov_words = g_ptr_array_new_with_free_func (g_free);
  for (int k = 0; k < n_oov; k++)
    g_ptr_array_add (b->oov_words, articles ? g_strdup (g_ptr_array_index (text.oov_words, k))
                                            : g_strdup_printf ("oov%d", k));
  for (int j = 0; j < B; j++)
    b->example_id[j] = -1;
  psm_batch_clear (&text);
}

/* GEMM FLOPs of one training step (forward; backward twice that: the
 * gradients of both operands), from the shapes of the model, as executed:
 * the encoder's input projection on the U distinct source words when
 * psm_linear projects each once (psm-ops.h; U = B T when it does not). */
static double
gemm_flops (int B, int T, int TY, int V, int U)
{
  const double E = 128, H = 256, A = 2 * H;
  double enc = 2.0 * 2 * U * E * 4 * H                          /* input projection, both directions */
               + 2.0 * 2 * B * T * H * 4 * H                    /* recurrence, both directions */
               + 2.0 * B * T * 2 * H * A;                      /* W_h h_i, once per article */
  double dec_row = (E + 2 * H) * E + E * 4 * H + H * 4 * H     /* cell input, LSTM */
                   + 2 * H * A                                 /* W_s [h_t; c_t] */
                   + 3 * H * H + H * V + (3 * H + E);          /* V[s_t; h*_t], V', p_gen */
  return 3.0 * (enc + 2.0 * B * TY * dec_row);
}

int
main (int argc, char **argv)
{
  if (getenv ("BENCH_LSTM_ROWS"))   /* the LSTM's steps split by rows whatever the rows a thread */
    psm_paths.lstm_cols = FALSE;
  if (argc < 3 || (strcmp (argv[1], "train") && strcmp (argv[1], "decode") && strcmp (argv[1], "vocab"))) {
    fprintf (stderr, "usage: bench-see train SECONDS [B T TY] | bench-see vocab DIR | bench-see decode FILE [N [DIR]]\n");
    return 2;
  }
  gboolean train = strcmp (argv[1], "train") == 0, vocab = strcmp (argv[1], "vocab") == 0;
  const char *run_dir = !train && !vocab && argc > 4 ? argv[4] : NULL;
  int B = argc > 3 ? atoi (argv[3]) : 16, T = argc > 4 ? atoi (argv[4]) : 400, TY = argc > 5 ? atoi (argv[5]) : 100;
  char *dir_set = g_strdup_printf ("run.dir=\"%s\"", run_dir ? run_dir : "/nonexistent/bench-see");
  /* BENCH_SEE_SET: one more assignment (e.g. train.precision="bf16") */
  const char *sets[] = { "task.vocab=20000", "model.decoder.coverage=true", "model.head.cov_loss_wt=1.0",
                         "decode.min_len=100", "decode.max_len=100", "decode.beam=4", "eval.batch=16",
                         dir_set, g_getenv ("BENCH_SEE_SET"), NULL };
  GError *e = NULL;
  const char *cfg = g_getenv ("BENCH_SEE_CFG") ? g_getenv ("BENCH_SEE_CFG") : "pipelines/cnndm_coverage.cfg";
  PsmPipeline *pl = psm_pipeline_load (cfg, sets, &e);
  if (!pl)
    die (e);
  g_free (dir_set);
  psm_pipeline_set_eval_only (pl, run_dir != NULL);
  PsmModel *m = psm_model_new (pl, FALSE, &e);
  if (!m)
    die (e);
  const PsmTaskClass *tk;
  void *task = psm_model_task (m, &tk);
  PsmTaskInfo info = { .size = sizeof info };
  tk->info (task, &info);

  if (vocab) {
    if (!tk->save) {
      fprintf (stderr, "bench-see: the task saves nothing\n");
      return 1;
    }
    if (!tk->save (task, argv[2], &e))
      die (e);
  } else if (train) {
    double secs = atof (argv[2]);
    PsmParams *params = psm_model_params (m);
    PsmOptConfig oc = { .kind = PSM_OPT_ADAGRAD, .lr = 0.15, .init_accum = 0.1 };
    PsmOptim *o = psm_optim_new (&oc, params);
    PsmGraph *g = psm_model_graph (m);
    PsmBatch *b = psm_model_batch (m);
    PsmRng rng;
    psm_rng_seed (&rng, 1);
    const char *articles = g_getenv ("BENCH_SEE_ARTICLES");
    fill_batch (b, tk, task, &info, articles && *articles ? articles : NULL, B, T, TY, &rng);
    if (!psm_batch_validate (b, &info, B, "bench-see", &e))
      die (e);
    PsmProfile *prof = g_new0 (PsmProfile, 1);
    gint64 t0 = 0;
    long steps = 0, warm = 2;
    float lv = 0;
    for (;; steps++) {
      if (steps == warm) {
        t0 = g_get_monotonic_time ();
        psm_graph_set_profile (g, prof);
      }
      if (steps > warm + 1 && g_get_monotonic_time () - t0 >= secs * 1e6)
        break;
      psm_graph_reset (g);
      PsmTensor *loss = psm_model_loss (m, g, b);
      lv = loss->data[0];
      psm_backward (g, loss);
      gint64 to = g_get_monotonic_time ();
      psm_optim_step_zero (o, steps, psm_clip_scale (psm_params_grad_norm (params), 2.0));
      prof->optim += steps >= warm ? 1e-6 * (double) (g_get_monotonic_time () - to) : 0;
    }
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0) / (double) (steps - warm);
    printf ("psm train B=%d T=%d Ty=%d V=%d: %.1f ms/step, %.0f target tokens/s, loss %.3f, peak RSS %.0f MB "
            "(%ld timed steps, %d threads; %zu parameters)\n", B, T, TY, info.ext_base, 1e3 * dt, B * TY / dt, lv,
            peak_rss_mb (), steps - warm, omp_get_max_threads (), psm_params_size (params));
    int U = projected_rows (b->src, b->T * b->B, info.src_vocab);
    double gf = gemm_flops (B, T, TY, info.ext_base, U), peak = sgemm_peak ();
    printf ("psm train: %d distinct source words of %d (the input projection's rows)\n", U, B * T);
    double gm = gemm_flops (B, T, TY, info.ext_base, B * T);   /* every row projected */
    printf ("psm train: %.1f GEMM GFLOP a step, %.1f GFLOP/s = %.1f %% of sgemm 2048^3 (%.1f GFLOP/s); "
            "the model's %.1f GFLOP (every source word projected): %.1f %%\n", gf / 1e9, gf / dt / 1e9,
            100 * gf / dt / 1e9 / peak, peak, gm / 1e9, 100 * gm / dt / 1e9 / peak);
    if (g_getenv ("BENCH_PROFILE"))
      psm_profile_print (prof, stdout);
    psm_graph_set_profile (g, NULL);
    g_free (prof);
    psm_optim_free (o);
  } else {
    char **texts = psm_read_lines (argv[2], "articles", &e);
    if (!texts)
      die (e);
    int have = (int) g_strv_length (texts) - 1;
    if (argc > 3)
      have = MIN (have, atoi (argv[3]));
    if (have < 1) {
      fprintf (stderr, "bench-see: %s: fewer than 2 articles\n", argv[2]);
      return 1;
    }
    PsmEvalOptions eo = { .decode = TRUE };
    if (!psm_model_decode_texts (m, (const char *const *) texts, 1, &eo, &e))   /* warm-up */
      die (e);
    gint64 t0 = g_get_monotonic_time ();
    if (!psm_model_decode_texts (m, (const char *const *) texts + 1, have, &eo, &e))
      die (e);
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0);
    printf ("psm decode beam 4, 100 tokens, T<=400: %.2f articles/s, peak RSS %.0f MB (%d articles, %d threads)\n",
            have / dt, peak_rss_mb (), have, omp_get_max_threads ());
    g_strfreev (texts);
  }
  psm_model_free (m);
  psm_pipeline_free (pl);
  return 0;
}
