/* bench-lm — the word-level LSTM language model of Merity et al.'s medium
 * setting in psm (pipelines/ptb_lstm.cfg or, with BENCH_LM_CFG,
 * ptb_sentinel.cfg), the computation bench/lm_torch.py does in PyTorch.
 *   bench-lm train SECONDS [k=v ...]  training steps on the real PTB training
 *                                     stream (batch 32 x BPTT 100, SGD,
 *                                     clip 1), after two warm-up steps
 *   bench-lm pair SECONDS [k=v ...]   ptb_lstm.cfg and ptb_sentinel.cfg
 *                                     trained in turns, an update each: the
 *                                     sentinel head's cost over the softmax
 *                                     as the median of the pairs' ratios
 *                                     (BENCH_LM_PAIRS=1: each pair's times
 *                                     on standard error)
 *   bench-lm eval [k=v ...]           the whole PTB test split, timed
 * k=v are --set assignments (e.g. model.encoder.zoneout=0). Run from the
 * build tree (PSM_PLUGIN_PATH=plugins/.libs); parameters at their random
 * initial values (the speed does not depend on them). Prints words/s,
 * GEMM GFLOP/s and their share of this machine's sgemm 2048^3 (GEMM FLOPs
 * as executed: in evaluation the first layer projects each distinct word
 * of a segment once, psm-ops.h; in training the products after a locked
 * dropout skip the dropped units, core/ops/linear-dropout.c). */
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

/* One model to train: its pipeline, optimiser and batch stream. */
typedef struct {
  const char *cfg, *head;
  PsmPipeline *pl;
  PsmModel *m;
  PsmOptim *o;
  PsmRng rng;
  int B, E, H, L, V, src_vocab;
  gboolean sentinel, dropout;
  long steps;   /* updates made (the optimiser's step count) */
  float loss;
  double words, skipped;   /* target words, input projection FLOPs not executed (lm_step) */
} Lm;

static void
lm_load (Lm *lm, const char *cfg, const char **sets, gboolean train)
{
  GError *e = NULL;
  memset (lm, 0, sizeof *lm);
  lm->cfg = cfg;
  if (!(lm->pl = psm_pipeline_load (cfg, sets, &e)) || !(lm->m = psm_model_new (lm->pl, FALSE, &e)))
    die (e);
  const PsmSection *enc = psm_pipeline_section (lm->pl, "model.encoder");
  lm->E = (int) psm_section_int (psm_pipeline_section (lm->pl, "model.embedding"), "dim");
  lm->H = (int) psm_section_int (enc, "hidden");
  lm->L = (int) psm_section_int (enc, "layers");
  lm->dropout = psm_section_float (enc, "dropout") > 0.0f;
  const PsmTaskClass *tk;
  void *task = psm_model_task (lm->m, &tk);
  PsmTaskInfo info = { .size = sizeof info };
  tk->info (task, &info);
  lm->V = info.tgt_vocab;
  lm->src_vocab = info.src_vocab;
  lm->head = psm_pipeline_plugin (lm->pl, "model.head")->desc->name;
  lm->sentinel = strcmp (lm->head, "pointer_sentinel") == 0;
  if (train) {
    PsmOptConfig oc = { .kind = PSM_OPT_SGD, .lr = 5.0 };
    lm->o = psm_optim_new (&oc, psm_model_params (lm->m));
    psm_rng_seed (&lm->rng, 1);
    lm->B = (int) psm_section_int (psm_pipeline_section (lm->pl, "train"), "batch");
  }
}

static void
lm_free (Lm *lm)
{
  if (lm->o)
    psm_optim_free (lm->o);
  psm_model_free (lm->m);
  psm_pipeline_free (lm->pl);
}

/* One training update (batch, forward, backward, clip 1, SGD); adds the
 * target words to lm->words and, with no dropout, the input projection's
 * FLOPs not executed (each distinct word projected once: see eval) to
 * lm->skipped. */
static void
lm_step (Lm *lm)
{
  GError *e = NULL;
  PsmParams *params = psm_model_params (lm->m);
  PsmGraph *g = psm_model_graph (lm->m);
  PsmBatch *b = psm_model_batch (lm->m);
  if (!psm_model_train_batch (lm->m, lm->B, &lm->rng, &e))
    die (e);
  psm_graph_reset (g);
  PsmTensor *loss = psm_model_loss (lm->m, g, b);
  lm->loss = loss->data[0];
  psm_backward (g, loss);
  psm_optim_step_zero (lm->o, lm->steps++, psm_clip_scale (psm_params_grad_norm (params), 1.0));
  for (int i = 0; i < b->Ty * b->B; i++)
    lm->words += b->tgt_mask[i];
  if (!lm->dropout)
    lm->skipped += 3 * 2.0 * lm->E * 4 * lm->H * (b->T * b->B - projected_rows (b->src, b->T * b->B, lm->src_vocab));
}

static int
cmp_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x > y) - (x < y);
}

static double
median (double *x, int n)
{
  qsort (x, n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* bench-lm pair: the softmax LM and the sentinel LM built side by side and
 * trained in turns, one update each, so that the host's drift over the
 * run (on a shared virtual machine a fifth or more within minutes) falls
 * on both alike: the sentinel's cost is the median over the pairs of its
 * update's time against the softmax update of the same pair. Both read the
 * same batches (same stream, same seed); every other pair the sentinel's
 * update goes first, so that neither pays more for the other's leftovers in
 * the caches. */
static int
pair (double secs, const char **sets)
{
  Lm lm[2];
  lm_load (&lm[0], "pipelines/ptb_lstm.cfg", sets, TRUE);
  lm_load (&lm[1], "pipelines/ptb_sentinel.cfg", sets, TRUE);
  int cap = 64, n = 0;
  double *t[2] = { g_new (double, cap), g_new (double, cap) }, *ratio = g_new (double, cap);
  gint64 t0 = 0;
  for (int warm = 2, i = 0;; i++) {
    if (i == warm)
      t0 = g_get_monotonic_time ();
    if (i > warm + 2 && g_get_monotonic_time () - t0 >= secs * 1e6)
      break;
    double dt[2];
    for (int j = 0; j < 2; j++) {
      int k = j ^ (i & 1);   /* every other pair the sentinel goes first */
      gint64 s = g_get_monotonic_time ();
      lm_step (&lm[k]);
      dt[k] = 1e-3 * (double) (g_get_monotonic_time () - s);
    }
    if (i < warm)
      continue;
    if (n == cap) {
      cap *= 2;
      t[0] = g_renew (double, t[0], cap);
      t[1] = g_renew (double, t[1], cap);
      ratio = g_renew (double, ratio, cap);
    }
    if (g_getenv ("BENCH_LM_PAIRS"))
      fprintf (stderr, "pair %d: softmax %.1f ms, sentinel %.1f ms%s\n", n + 1, dt[0], dt[1], i & 1 ? " (sentinel first)" : "");
    t[0][n] = dt[0];
    t[1][n] = dt[1];
    ratio[n++] = 100.0 * (dt[1] / dt[0] - 1.0);
  }
  double ms0 = median (t[0], n), ms1 = median (t[1], n), cost = median (ratio, n);
  /* sorted by median (): the ratios' range is their ends, and t[k][0] a
   * head's fastest update, the one the host disturbed least */
  double lo = ratio[0], hi = ratio[n - 1], fast = 100.0 * (t[1][0] / t[0][0] - 1.0);
  printf ("psm train pair, %s and %s in turns, %dx%d, V=%d: softmax %.1f ms/step, sentinel %.1f ms/step "
          "(medians of %d pairs, %d threads, peak RSS %.0f MB)\n", lm[0].cfg, lm[1].cfg, lm[0].L, lm[0].H, lm[0].V,
          ms0, ms1, n, omp_get_max_threads (), peak_rss_mb ());
  printf ("paired: sentinel head costs %.1f %% over the softmax (median of the pairs' ratios; %.1f to %.1f; "
          "fastest updates %.1f against %.1f ms, %.1f %%)\n", cost, lo, hi, t[1][0], t[0][0], fast);
  g_free (t[0]);
  g_free (t[1]);
  g_free (ratio);
  lm_free (&lm[0]);
  lm_free (&lm[1]);
  return 0;
}

int
main (int argc, char **argv)
{
  gboolean train = argc >= 3 && !strcmp (argv[1], "train"), pairs = argc >= 3 && !strcmp (argv[1], "pair");
  if (!train && !pairs && !(argc >= 2 && !strcmp (argv[1], "eval"))) {
    fprintf (stderr, "usage: bench-lm train SECONDS [k=v ...] | bench-lm pair SECONDS [k=v ...] | "
             "bench-lm eval [k=v ...]\n");
    return 2;
  }
  int first_set = train || pairs ? 3 : 2;
  const char **sets = g_new0 (const char *, argc + 2);
  int ns = 0;
  sets[ns++] = "run.dir=\"/nonexistent/bench-lm\"";
  for (int i = first_set; i < argc; i++)
    sets[ns++] = argv[i];
  if (pairs) {
    int rc = pair (atof (argv[2]), sets);
    g_free (sets);
    return rc;
  }
  GError *e = NULL;
  const char *cfg = g_getenv ("BENCH_LM_CFG") ? g_getenv ("BENCH_LM_CFG") : "pipelines/ptb_lstm.cfg";
  Lm lm;
  lm_load (&lm, cfg, sets, train);
  double fw = gemm_flops_word (lm.E, lm.H, lm.L, lm.V, lm.sentinel);
  if (train) {
    double secs = atof (argv[2]);
    gint64 t0 = 0;
    long warm = 2;
    for (;;) {
      if (lm.steps == warm) {
        t0 = g_get_monotonic_time ();
        lm.words = lm.skipped = 0;
        psm_dropout_flops_skipped = 0;
      }
      if (lm.steps > warm + 1 && g_get_monotonic_time () - t0 >= secs * 1e6)
        break;
      lm_step (&lm);
    }
    double words = lm.words, skipped = lm.skipped;
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0), wps = words / dt, peak = sgemm_peak ();
    printf ("psm train %s, head %s, %dx%d, V=%d: %.1f ms/step, %.0f words/s, loss %.3f, peak RSS %.0f MB "
            "(%ld timed steps, %d threads)\n", cfg, lm.head, lm.L, lm.H, lm.V, 1e3 * dt / (lm.steps - warm), wps,
            lm.loss, peak_rss_mb (), lm.steps - warm, omp_get_max_threads ());
    skipped += psm_dropout_flops_skipped;
    double gfs = (3 * fw * words - skipped) / dt / 1e9;
    printf ("psm train: %.1f GEMM GFLOP/s = %.1f %% of sgemm 2048^3 (%.1f GFLOP/s); %.1f %% of the model's GEMM "
            "FLOPs executed (the rest: units dropped)\n", gfs, 100 * gfs / peak, peak,
            100 * (1 - psm_dropout_flops_skipped / (3 * fw * words)));
  } else {
    PsmEvalOptions eo = { .decode = TRUE };
    PsmEvalResult r;
    gint64 t0 = g_get_monotonic_time ();
    if (!psm_model_evaluate (lm.m, PSM_SPLIT_TEST, &eo, &r, &e))
      die (e);
    double dt = 1e-6 * (double) (g_get_monotonic_time () - t0);
    /* the GEMM FLOPs executed: the first layer's input projection on each
     * segment's distinct words (projected_rows), the rest on every word; the
     * segments again, as psm_model_evaluate takes them */
    int EB = (int) psm_section_int (psm_pipeline_section (lm.pl, "eval"), "batch");
    PsmBatch *b = psm_model_batch (lm.m);
    const PsmTaskClass *tk;
    void *task = psm_model_task (lm.m, &tk);
    double skipped = 0.0;
    long rows = 0, proj = 0;
    for (int start = 0;; start++) {
      if (!psm_task_eval_batch (tk, task, PSM_SPLIT_TEST, start, EB, b, &e))
        die (e);
      if (b->T == 0)
        break;
      int R = b->T * b->B, U = projected_rows (b->src, R, lm.src_vocab);
      skipped += 2.0 * lm.E * 4 * lm.H * (R - U);
      rows += R;
      proj += U;
    }
    double flops = fw * r.n_examples - skipped;
    printf ("psm eval %s, head %s, %dx%d: PTB test (%ld words, eval batch %d) in %.2f s, %.0f words/s, "
            "%.1f GEMM GFLOP/s, peak RSS %.0f MB (%d threads)\n", cfg, lm.head, lm.L, lm.H, r.n_examples, EB, dt,
            r.n_examples / dt, flops / dt / 1e9, peak_rss_mb (), omp_get_max_threads ());
    printf ("psm eval: %.1f GEMM GFLOP (the input projection on %ld distinct words of the segments' %ld rows)\n",
            flops / 1e9, proj, rows);
  }
  g_free (sets);
  lm_free (&lm);
  return 0;
}
