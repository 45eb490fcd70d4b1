/* test-label_smoothing.c — the example head's unit test, with Check and
 * psm's public API only: a finite-difference gradient check of the loss in
 * every parameter and in the decoder states, epsilon = 0 giving the plain
 * cross-entropy, padding ignored, and configuration errors that name the
 * key and line. The plugin is found on PSM_PLUGIN_PATH (make check sets it
 * to the freshly built .libs). */
#include <check.h>
#include <math.h>
#include <string.h>
#include <psm/psm.h>

enum { TY = 2, B = 3, H = 4, V = 6 };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  float state[TY * B * H], gstate[TY * B * H];
  PsmBatch batch;
  PsmSection *sec;
} Fix;

static PsmTaskInfo info = { .size = sizeof (PsmTaskInfo), .src_vocab = 10, .tgt_vocab = V, .max_src_len = 10,
                            .ext_base = V, .max_tgt_len = 5, .eos_id = 2, .unk_id = -1, .bos_id = -1 };

static const PsmPluginDesc *
plugin (void)
{
  GError *e = NULL;
  const PsmPlugin *pl = psm_plugin_find (PSM_KIND_HEAD, "label_smoothing", &e);
  ck_assert_msg (pl, "%s", e ? e->message : "");
  return pl->desc;
}

static void
fix_init (Fix *f, const char *cfg)
{
  const PsmPluginDesc *d = plugin ();
  f->hk = d->klass;
  GError *e = NULL;
  f->sec = psm_section_from_text (cfg, "test.cfg", "model.head", d->params, &e);
  ck_assert_msg (f->sec, "%s", e ? e->message : "");
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { .size = sizeof ctx, .params = f->params, .prefix = "head.", .task = &info, .emb_dim = H,
                      .enc_dim = 4, .summary_dim = H, .state_dim = H, .context_dim = 0, .emb_param = -1 };
  f->head = f->hk->create (f->sec, &ctx, &e);
  ck_assert_msg (f->head, "%s", e ? e->message : "");
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  float *p = psm_params_data (f->params);
  for (size_t i = 0; i < psm_params_size (f->params); i++)
    p[i] = (float) (psm_rng_uniform (&rng) - 0.5);
  for (int i = 0; i < TY * B * H; i++)
    f->state[i] = (float) (2.0 * psm_rng_uniform (&rng) - 1.0);
  psm_batch_init (&f->batch);
  psm_batch_reserve (&f->batch, B, 5, TY);
  f->batch.B = B;
  f->batch.Ty = TY;
  for (int i = 0; i < TY * B; i++) {
    f->batch.tgt[i] = (i * 5 + 2) % V;
    f->batch.tgt_mask[i] = i == 5 ? 0.0f : 1.0f;   /* the last step of example 2 is padding */
  }
}

static void
fix_clear (Fix *f)
{
  f->hk->destroy (f->head);
  psm_params_free (f->params);
  psm_batch_clear (&f->batch);
  psm_section_destroy (f->sec);
}

static PsmTensor *
loss (PsmGraph *g, Fix *f)
{
  int s[3] = { TY, B, H };
  PsmDecOut out = { .Ty = TY, .B = B, .state = psm_tensor_wrap (g, f->state, f->gstate, 3, s) };
  return f->hk->loss (f->head, g, f->params, NULL, &out, &f->batch);
}

static double
loss_value (Fix *f)
{
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  double v = loss (g, f)->data[0];
  psm_graph_free (g);
  return v;
}

/* analytic gradient of n values x (gradient gx) against central differences */
static void
gradcheck (Fix *f, const char *what, float *x, const float *gx, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    const float eps = 1e-2f;
    float keep = x[i];
    x[i] = keep + eps;
    double lp = loss_value (f);
    x[i] = keep - eps;
    double lm = loss_value (f);
    x[i] = keep;
    double num = (lp - lm) / (2.0 * eps);
    ck_assert_msg (fabs (num - gx[i]) <= 1e-3 + 1e-2 * fabs (num), "%s[%zu]: analytic %.6g, numeric %.6g", what, i,
                   gx[i], num);
  }
}

START_TEST (test_gradient)
{
  Fix f;
  fix_init (&f, "epsilon = 0.3;");
  memset (f.gstate, 0, sizeof f.gstate);
  memset (psm_params_grad (f.params), 0, psm_params_size (f.params) * sizeof (float));
  PsmGraph *g = psm_graph_new ();
  psm_backward (g, loss (g, &f));
  psm_graph_free (g);
  float *gp = g_memdup2 (psm_params_grad (f.params), psm_params_size (f.params) * sizeof (float));
  gradcheck (&f, "parameters", psm_params_data (f.params), gp, psm_params_size (f.params));
  gradcheck (&f, "states", f.state, f.gstate, TY * B * H);
  g_free (gp);
  fix_clear (&f);
}
END_TEST

/* epsilon = 0 is the cross-entropy of the target; epsilon = 1 the mean
 * -log p over the vocabulary; padding counts for nothing */
START_TEST (test_values)
{
  Fix f;
  fix_init (&f, "epsilon = 0.0;");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  int s[3] = { TY, B, H };
  PsmDecOut out = { .Ty = 1, .B = B, .state = psm_tensor_wrap (g, f.state, NULL, 3, s) };
  double want_ce = 0.0, want_uniform = 0.0;
  for (int t = 0; t < TY; t++) {
    out.state = psm_tensor_wrap (g, f.state + t * B * H, NULL, 3, (int[3]) { 1, B, H });
    PsmTensor *lp = f.hk->scores (f.head, g, f.params, NULL, &out, &f.batch);
    for (int b = 0; b < B; b++) {
      if (f.batch.tgt_mask[t * B + b] == 0.0f)
        continue;
      want_ce -= lp->data[b * V + f.batch.tgt[t * B + b]] / 5.0;
      for (int v = 0; v < V; v++)
        want_uniform -= lp->data[b * V + v] / (5.0 * V);
    }
  }
  psm_graph_free (g);
  ck_assert_double_eq_tol (loss_value (&f), want_ce, 1e-5);
  fix_clear (&f);
  fix_init (&f, "epsilon = 1.0;");
  ck_assert_double_eq_tol (loss_value (&f), want_uniform, 1e-5);
  fix_clear (&f);
}
END_TEST

START_TEST (test_bad_config)
{
  const PsmPluginDesc *d = plugin ();
  GError *e = NULL;
  ck_assert (!psm_section_from_text ("\nepsilon = 1.5;", "test.cfg", "model.head", d->params, &e));
  ck_assert_msg (strstr (e->message, "test.cfg:2: model.head.epsilon: value 1.5 out of range"), "%s", e->message);
  g_clear_error (&e);
  ck_assert (!psm_section_from_text ("epsilom = 0.1;", "test.cfg", "model.head", d->params, &e));
  ck_assert_msg (strstr (e->message, "model.head.epsilom: unknown key"), "%s", e->message);
  g_clear_error (&e);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("label_smoothing");
  TCase *tc = tcase_create ("head");
  tcase_add_test (tc, test_gradient);
  tcase_add_test (tc, test_values);
  tcase_add_test (tc, test_bad_config);
  suite_add_tcase (s, tc);
  SRunner *sr = srunner_create (s);
  srunner_run_all (sr, CK_NORMAL);
  int failed = srunner_ntests_failed (sr);
  srunner_free (sr);
  return failed ? 1 : 0;
}
