/* psm-test.c — gradient checker and small helpers for the Check tests. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "psm-test.h"

void
psm_test_fill (float *x, size_t n, float a, PsmRng *rng)
{
  for (size_t i = 0; i < n; i++)
    x[i] = (float) ((2.0 * psm_rng_uniform (rng) - 1.0) * a);
}

PsmTensor *
psm_test_project (PsmGraph *g, PsmTensor *y)
{
  PsmTensor *r = psm_tensor_new (g, y->ndim, y->shape, FALSE);
  PsmRng rng;
  psm_rng_seed (&rng, 4242);
  psm_test_fill (r->data, r->n, 1.0f, &rng);
  return psm_sum (g, psm_mul (g, y, r));
}

PsmTensor *
psm_test_first_rows (PsmGraph *g, PsmTensor *x, int R)
{
  int shape[2] = { R, psm_tensor_cols (x) };
  return R == psm_tensor_rows (x) ? x : psm_tensor_view (g, x, 0, 2, shape);
}

static void
same_rows (const char *what, const char *field, PsmTensor *full, PsmTensor *part, int R)
{
  ck_assert_msg ((full == NULL) == (part == NULL), "%s: %s on some rows only", what, field);
  if (!full)
    return;
  int C = psm_tensor_cols (full);
  ck_assert_msg (psm_tensor_rows (part) == R && psm_tensor_cols (part) == C, "%s: %s is [%d, %d], not [%d, %d]", what,
                 field, psm_tensor_rows (part), psm_tensor_cols (part), R, C);
  for (int i = 0; i < R * C; i++)
    ck_assert_msg (fabsf (full->data[i] - part->data[i]) <= 1e-6f * (1.0f + fabsf (full->data[i])),
                   "%s: %s [%d, %d]: %.9g on all rows, %.9g on %d", what, field, i / C, i % C, full->data[i],
                   part->data[i], R);
}

void
psm_test_decoder_rows (const char *what, const PsmDecoderClass *dk, PsmTestDecRun run, void *ud, int steps,
                       const int *rows)
{
  ck_assert_msg (PSM_STRUCT_FIELD (dk, flags, 0u) & PSM_DECODER_LIVE_ROWS, "%s: PSM_DECODER_LIVE_ROWS not set", what);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmDecStep *full = g_new0 (PsmDecStep, steps), *part = g_new0 (PsmDecStep, steps);
  run (ud, g, full, NULL);
  run (ud, g, part, rows);
  for (int t = 0; t < steps; t++) {
    char *w = g_strdup_printf ("%s, step %d on %d rows", what, t, rows[t]);
    same_rows (w, "carry", full[t].carry, part[t].carry, rows[t]);
    same_rows (w, "state", full[t].state, part[t].state, rows[t]);
    same_rows (w, "context", full[t].context, part[t].context, rows[t]);
    same_rows (w, "attn", full[t].attn, part[t].attn, rows[t]);
    same_rows (w, "coverage", full[t].coverage, part[t].coverage, rows[t]);
    same_rows (w, "input", full[t].input, part[t].input, rows[t]);
    g_free (w);
  }
  g_free (full);
  g_free (part);
  psm_graph_free (g);
}

static double
eval_loss (PsmLossFn f, void *ud)
{
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  double v = f (g, ud)->data[0];
  psm_graph_free (g);
  return v;
}

static gboolean no_directional;

void
psm_test_gradcheck_directional (gboolean on)
{
  no_directional = !on;
}

double
psm_test_gradcheck (const char *what, PsmLossFn f, void *ud, float *x, float *gx, size_t n,
                    float eps, double atol, double rtol, int max_checks)
{
  memset (gx, 0, n * sizeof (float));
  PsmGraph *g = psm_graph_new ();
  PsmTensor *loss = f (g, ud);
  ck_assert_msg (loss->grad != NULL, "%s: loss does not depend on the checked values", what);
  psm_backward (g, loss);
  psm_graph_free (g);
  float *analytic = g_memdup2 (gx, n * sizeof (float));
  size_t stride = n > (size_t) max_checks ? n / max_checks : 1;
  double worst = 0.0;
  for (size_t i = 0; i < n; i += stride) {
    float keep = x[i];
    x[i] = keep + eps;
    double lp = eval_loss (f, ud);
    x[i] = keep - eps;
    double lm = eval_loss (f, ud);
    x[i] = keep;
    double num = (lp - lm) / (2.0 * eps), an = analytic[i];
    double bound = atol + rtol * MAX (fabs (an), fabs (num));
    double ratio = fabs (an - num) / bound;
    ck_assert_msg (ratio <= 1.0, "%s: gradient mismatch at %zu: analytic %.6g, numeric %.6g (bound %.3g)",
                   what, i, an, num, bound);
    worst = MAX (worst, ratio);
  }
  /* Entry by entry, float32 differences cannot see a 1 % error (their
   * noise is about that). Along a direction v over every entry they can:
   * the derivative sum_i an_i v_i is large against the rounding of two
   * losses, so a fourth-order central difference with a small step h
   * agrees with it to about 1e-4 of sum_i |an_i v_i|; the bound is
   * PSM_GRADCHECK_DTOL of that. Directions: v_i = sign(an_i) u_i (no
   * cancellation) and random signs, u_i in [0.5, 1.5). A backward 1 % off
   * fails (tests/mutation.sh proves it op by op). */
  if (no_directional) {
    g_free (analytic);
    return worst;
  }
  PsmRng rng;
  psm_rng_seed (&rng, 977 + n);
  float *x0 = g_memdup2 (x, n * sizeof (float));
  float *v = g_new (float, n);
  for (int dir = 0; dir < 2; dir++) {
    double an_v = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
      double u = 0.5 + psm_rng_uniform (&rng);
      double sgn = dir == 0 ? (analytic[i] < 0 ? -1.0 : 1.0) : (psm_rng_uniform (&rng) < 0.5 ? -1.0 : 1.0);
      v[i] = (float) (sgn * u);
      an_v += (double) analytic[i] * v[i];
      scale += fabs ((double) analytic[i] * v[i]);
    }
    if (scale < 1e-6)
      continue;
    /* the step: 5e-3, or smaller where the loss is not smooth at that
     * scale along v (a kink, an argmax target that flips): the best of
     * three. A systematic 1 % error fails at every step. */
    double num = 0.0, ratio = INFINITY, bound = PSM_GRADCHECK_DTOL * scale + 1e-7;
    for (double h = 5e-3; h > 5e-4 && ratio > 1.0; h /= 2.5) {
      double l[4];
      const double steps[4] = { h, -h, 2 * h, -2 * h };
      for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < n; i++)
          x[i] = (float) (x0[i] + steps[k] * v[i]);
        l[k] = eval_loss (f, ud);
      }
      memcpy (x, x0, n * sizeof (float));
      double nh = (8.0 * (l[0] - l[1]) - (l[2] - l[3])) / (12.0 * h);
      if (fabs (an_v - nh) / bound < ratio) {
        ratio = fabs (an_v - nh) / bound;
        num = nh;
      }
    }
    if (g_getenv ("PSM_GRADCHECK_VERBOSE"))
      fprintf (stderr, "%s: direction %d: analytic %.9g numeric %.9g, relative %.3g\n", what, dir, an_v, num,
               fabs (an_v - num) / scale);
    ck_assert_msg (ratio <= 1.0, "%s: directional derivative mismatch (direction %d): analytic %.9g, numeric %.9g "
                   "(relative %.3g of sum |an v|, bound %.3g)", what, dir, an_v, num, fabs (an_v - num) / scale,
                   PSM_GRADCHECK_DTOL);
    worst = MAX (worst, ratio);
  }
  g_free (v);
  g_free (x0);
  g_free (analytic);
  return worst;
}

double
psm_test_gradcheck_params (const char *what, PsmLossFn f, void *ud, PsmParams *p, float eps, double atol,
                           double rtol, int max_checks)
{
  double worst = 0.0;
  float *data = psm_params_data (p), *grad = psm_params_grad (p);
  for (int id = 0; id < psm_params_count (p); id++) {
    size_t n = psm_params_numel (p, id), off = psm_params_offset (p, id);
    char *w = g_strdup_printf ("%s: %s", what, psm_params_name (p, id));
    memset (grad, 0, psm_params_size (p) * sizeof (float));
    worst = MAX (worst, psm_test_gradcheck (w, f, ud, data + off, grad + off, n, eps, atol, rtol, max_checks));
    g_free (w);
  }
  return worst;
}

void
psm_test_plugin_env (void)
{
  if (!g_getenv ("PSM_PLUGIN_PATH"))
    g_setenv ("PSM_PLUGIN_PATH", PSM_TEST_PLUGIN_DIR, TRUE);
}

static char *test_dir;

const char *
psm_test_dir (void)
{
  if (!test_dir)
    test_dir = g_dir_make_tmp ("psm-test-XXXXXX", NULL);
  ck_assert_msg (test_dir, "cannot make a temporary folder");
  return test_dir;
}

char *
psm_test_write_file (const char *name, const char *text)
{
  char *path = g_build_filename (psm_test_dir (), name, NULL);
  ck_assert_msg (g_file_set_contents (path, text, -1, NULL), "cannot write %s", path);
  return path;
}

void
psm_test_task_batch_of (const PsmTaskClass *k, void *t, PsmSplit split)
{
  int (*len) (void *, PsmSplit, int) = PSM_CLASS_HOOK (k, source_length);
  gboolean (*of) (void *, PsmSplit, const int *, int, PsmBatch *, GError **) = PSM_CLASS_HOOK (k, eval_batch_of);
  ck_assert (len && of);
  int n = k->n_examples (t, split);
  ck_assert_int_ge (n, 2);
  PsmBatch all, one;
  psm_batch_init (&all);
  psm_batch_init (&one);
  int *rev = g_new (int, n);
  for (int i = 0; i < n; i++)
    rev[i] = n - 1 - i;
  GError *e = NULL;
  ck_assert_msg (of (t, split, rev, n, &all, &e), "%s", e ? e->message : "");
  ck_assert_int_eq (all.B, n);
  for (int i = 0; i < n; i++) {
    int ex = rev[i];
    ck_assert_msg (psm_task_eval_batch (k, t, split, ex, 1, &one, &e), "%s", e ? e->message : "");
    ck_assert_int_eq (MAX (len (t, split, ex), 1), one.T);
    ck_assert_int_eq (all.example_id[i], ex);
    for (int s = 0; s < all.T; s++) {
      gboolean in = s < one.T && PSM_AT (one.src_mask, &one, s, 0) != 0.0f;
      ck_assert_int_eq (PSM_AT (all.src_mask, &all, s, i) != 0.0f, in);
      if (in)
        ck_assert_int_eq (PSM_AT (all.src, &all, s, i), PSM_AT (one.src, &one, s, 0));
    }
    for (int s = 0; s < one.Ty; s++)
      if (PSM_AT (one.tgt_mask, &one, s, 0) != 0.0f)
        ck_assert_int_eq (PSM_AT (all.tgt, &all, s, i), PSM_AT (one.tgt, &one, s, 0));
  }
  int bad[2] = { 0, n };
  ck_assert (!of (t, split, bad, 2, &all, &e));
  ck_assert (e && strstr (e->message, "example"));
  g_clear_error (&e);
  bad[1] = -1;
  ck_assert (!of (t, split, bad, 2, &all, &e));
  g_clear_error (&e);
  g_free (rev);
  psm_batch_clear (&all);
  psm_batch_clear (&one);
}

int
psm_test_run (Suite *s)
{
  /* made here, before the tests fork, so that this process removes it */
  test_dir = g_dir_make_tmp ("psm-test-XXXXXX", NULL);
  if (!test_dir) {
    fprintf (stderr, "cannot make a temporary folder\n");
    return EXIT_FAILURE;
  }
  SRunner *sr = srunner_create (s);
  srunner_run_all (sr, CK_NORMAL);
  int failed = srunner_ntests_failed (sr);
  srunner_free (sr);
  if (test_dir) {
    char *cmd = g_strdup_printf ("rm -rf '%s'", test_dir);
    if (system (cmd) != 0)
      failed++;
    g_free (cmd);
  }
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Sections stay reachable here until exit
 * (so LeakSanitizer does not report them). */
static GPtrArray *kept;

const PsmSection *
psm_test_section (const char *text, const char *path, const PsmParamSpec *spec, char **errors)
{
  GError *e = NULL;
  /* the text starts on line 2 of inline.cfg, as the tests' messages say */
  char *shifted = g_strconcat ("\n", text, NULL);
  PsmSection *sec = psm_section_from_text (shifted, "inline.cfg", path, spec, &e);
  g_free (shifted);
  if (!sec) {
    if (errors)
      *errors = g_strdup (e->message);
    g_error_free (e);
    return NULL;
  }
  if (!kept)
    kept = g_ptr_array_new ();
  g_ptr_array_add (kept, sec);
  return sec;
}

const PsmPluginDesc *
psm_test_plugin (PsmKind kind, const char *name)
{
  psm_test_plugin_env ();
  GError *e = NULL;
  const PsmPlugin *pl = psm_plugin_find (kind, name, &e);
  ck_assert_msg (pl != NULL, "cannot load plugin: %s", e ? e->message : "?");
  return pl->desc;
}

double
psm_test_metric_value (const PsmMetricClass *mk, void *m, const char *name)
{
  PsmMetricReport r;
  mk->report (m, &r);
  for (int i = 0; i < r.n; i++)
    if (strcmp (r.names[i], name) == 0)
      return r.values[i];
  ck_abort_msg ("no value %s", name);
  return NAN;
}
