/* bench-lm — the word-level LSTM language model of Merity et al.'s medium
 * setting in psm (pipelines/ptb_lstm.cfg or, with BENCH_LM_CFG,
 * ptb_sentinel.cfg), the computation bench/lm_torch.py does in PyTorch.
 *   bench-lm train SECONDS [k=v ...]  training steps on the real PTB training
 *                                     stream (batch 32 x BPTT 100, SGD,
 *                                     clip 1), after two warm-up steps
 *   bench-lm eval [k=v ...]           the whole PTB test split, timed
 * k=v are --set assignments (e.g. model.encoder.zoneout=0). Run from the
 * build tree (PSM_PLUGIN_PATH=plugins/.libs); parameters at their random
 * initial values (the speed does not depend on them). Prints words/s,
 * GEMM GFLOP/s and their share of this machine's sgemm 2048^3 (GEMM FLOPs
 * as executed: in evaluation the first layer projects each distinct word
 * of a segment once, psm-ops.h; in training the products after a locked
 * dropout skip the dropped units, core/ops/matmul.c). */
#include "config.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "psm-private.h"
#include "bench-common.h"

static void
die (GError *e)
{
  fprintf (stderr, "bench-lm: %s\n", e->message);
  exit (1);
}

/* GEMM FLOPs a word, forward: the input projections and recurrences of L
 * layers, the softmax's projection, and the sentinel's query. */
static double
gemm_flops_word (int E, int H, int L, int V, gboolean sentinel)
{
  double f = 2.0 * (E * 4.0 * H + H * 4.0 * H) + (L - 1) * 2.0 * (H * 4.0 * H + H * 4.0 * H) + 2.0 * H * V;
  return f + (sentinel ? 2.0 * H * H : 0.0);
}

int
main (int argc, char **argv)
{
  if (argc < 2 || (strcmp (argv[1], "train") && strcmp (argv[1], "eval")) || (!strcmp (argv[1], "train") && argc < 3)) {
    fprintf (stderr, "usage: bench-lm train SECONDS [k=v ...] | bench-lm eval [k=v ...]\n");
    return 2;
  }
  gboolean train = strcmp (argv[1], "train") == 0;
  int first_set = train ? 3 : 2;
  const char **sets = g_new0 (const char *, argc + 2);
  int ns = 0;
  sets[ns++] = "run.dir=\"/nonexistent/bench-lm\"";
  for (int i = first_set; i < argc; i++)
    sets[ns++] = argv[i];
  GError *e = NULL;
  const char *cfg = g_getenv ("BENCH_LM_CFG") ? g_getenv ("BENCH_LM_CFG") : "pipelines/ptb_lstm.cfg";
  PsmPipeline *pl = psm_pipeline_load (cfg, sets, &e);
  if (!pl)
    die (e);
  PsmModel *m = psm_model_new (pl, FALSE, &e);
  if (!m)
    die (e);
  const PsmSection *enc = psm_pipeline_section (pl, "model.encoder");
  int E = (int) psm_section_int (psm_pipeline_section (pl, "model.embedding"), "dim");
  int H = (int) psm_section_int (enc, "hidden"), L = (int) psm_section_int (enc, "layers");
  const PsmTaskClass *tk;
  void *task = psm_model_task (m, &tk);
  PsmTaskInfo info = { .size = sizeof info };
  tk->info (task, &info);
  const char *head = psm_pipeline_plugin (pl, "model.head")->desc->name;
  gboolean sentinel = strcmp (head, "pointer_sentinel") == 0;
  double fw = gemm_flops_word (E, H, L, info.tgt_vocab, sentinel);
  if (train) {
    double secs = atof (argv[2]);
    PsmParams *params = psm_model_params (m);
    PsmOptConfig oc = { .kind = PSM_OPT_SGD, .lr = 5.0 };
    PsmOptim *o = psm_optim_new (&oc, params);
    PsmGraph *g = psm_model_graph (m);
    PsmBatch *b = psm_model_batch (m);
    PsmRng rng;
    psm_rng_seed (&rng, 1);
    int B = (int) psm_section_int (psm_pipeline_section (pl, "train"), "batch");
    gint64 t0 = 0;
    long steps = 0, warm = 2;
    double words = 0, skipped = 0;   /* input projection FLOPs not executed (no dropout: see eval) */
    gboolean dropout = psm_section_float (enc, "dropout") > 0.0f;
    float lv = 0;
    for (;; steps++) {
      if (steps == warm) {
        t0 = g_get_monotonic_time ();
        words = skipped = 0;
        psm_dropout_flops_skipped = 0;
      }
      if (steps > warm + 1 && g_get_monotonic_time () - t0 >= secs * 1e6)
        break;
      if (!psm_model_train_batch (m, B, &rng, &e))
        die (e);
      psm_graph_reset (g);
      PsmTensor *loss = psm_model_loss (m, g, b);
      lv = loss->data[0];
      psm_backward (g, loss);
      psm_params_clip (params, 1.0);
      psm_optim_step (o, steps);
      psm_params_zero_grad (params);
      for (int i = 0; i < b->Ty * b->B; i++)
        words += b->tgt_mask[i];
      if (!dropout)
        skipped += 3 * 2.0 * E * 4 * H * (b->T * b->B - projected_rows (b->src, b->T * b->B, info.src_vocab));
    }
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0), wps = words / dt, peak = sgemm_peak ();
    printf ("psm train %s, head %s, %dx%d, V=%d: %.1f ms/step, %.0f words/s, loss %.3f, peak RSS %.0f MB "
            "(%ld timed steps, %d threads)\n", cfg, head, L, H, info.tgt_vocab, 1e3 * dt / (steps - warm), wps, lv,
            peak_rss_mb (), steps - warm, omp_get_max_threads ());
    skipped += psm_dropout_flops_skipped;
    double gfs = (3 * fw * words - skipped) / dt / 1e9;
    printf ("psm train: %.1f GEMM GFLOP/s = %.1f %% of sgemm 2048^3 (%.1f GFLOP/s); %.1f %% of the model's GEMM "
            "FLOPs executed (the rest: units dropped)\n", gfs, 100 * gfs / peak, peak,
            100 * (1 - psm_dropout_flops_skipped / (3 * fw * words)));
    psm_optim_free (o);
  } else {
    PsmEvalOptions eo = { 0, TRUE, NULL, NULL, NULL, FALSE };
    PsmEvalResult r;
    gint64 t0 = g_get_monotonic_time ();
    if (!psm_model_evaluate (m, PSM_SPLIT_TEST, &eo, &r, &e))
      die (e);
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0);
    /* the GEMM FLOPs executed: the first layer's input projection on each
     * segment's distinct words (projected_rows), the rest on every word; the
     * segments again, as psm_model_evaluate takes them */
    int EB = (int) psm_section_int (psm_pipeline_section (pl, "eval"), "batch");
    PsmBatch *b = psm_model_batch (m);
    double skipped = 0.0;
    long rows = 0, proj = 0;
    for (int start = 0;; start++) {
      if (!tk->eval_batch (task, PSM_SPLIT_TEST, start, EB, b, &e))
        die (e);
      if (b->T == 0)
        break;
      int R = b->T * b->B, U = projected_rows (b->src, R, info.src_vocab);
      skipped += 2.0 * E * 4 * H * (R - U);
      rows += R;
      proj += U;
    }
    double flops = fw * r.n_examples - skipped;
    printf ("psm eval %s, head %s, %dx%d: PTB test (%ld words, eval batch %d) in %.2f s, %.0f words/s, "
            "%.1f GEMM GFLOP/s, peak RSS %.0f MB (%d threads)\n", cfg, head, L, H, r.n_examples, EB, dt,
            r.n_examples / dt, flops / dt / 1e9, peak_rss_mb (), omp_get_max_threads ());
    printf ("psm eval: %.1f GEMM GFLOP (the input projection on %ld distinct words of the segments' %ld rows)\n",
            flops / 1e9, proj, rows);
  }
  g_free (sets);
  psm_model_free (m);
  psm_pipeline_free (pl);
  return 0;
}
