/* test-head-softmax.c — softmax head: gradient check (with and without the
 * tanh layer; on an attention decoder's [s_t; c_t], and the maxout deep
 * output that also reads y_(t-1)) over Ty = 2 steps with a padded step,
 * scores, bad config. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { TY = 2, B = 3, H = 4, V = 6, C = 3 };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  float state[TY * B * H], gstate[TY * B * H];
  gboolean s2s;   /* an attention decoder: context [TY, B, C], input [TY, B, H] */
  float ctx[TY * B * C], gctx[TY * B * C], in[TY * B * H], gin[TY * B * H];
  PsmBatch batch;
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, V, 10, 5, 2, -1, -1, 0 };

/* The decoder's outputs of steps [t0, t0 + n) (gradients only for all). */
static PsmDecOut
outs (Fix *f, PsmGraph *g, int t0, int n)
{
  gboolean all = t0 == 0 && n == TY;
  int s[3] = { n, B, H }, cs[3] = { n, B, C };
  PsmDecOut out = { .Ty = n, .B = B, .state = psm_tensor_wrap (g, f->state + t0 * B * H, all ? f->gstate : NULL, 3, s) };
  if (f->s2s) {
    out.context = psm_tensor_wrap (g, f->ctx + t0 * B * C, all ? f->gctx : NULL, 3, cs);
    out.input = psm_tensor_wrap (g, f->in + t0 * B * H, all ? f->gin : NULL, 3, s);
  }
  return out;
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmDecOut out = outs (f, g, 0, TY);
  return f->hk->loss (f->head, g, f->params, NULL, &out, &f->batch);
}

/* with_cand: the batch's candidates are 5 of the 6 words (every real
 * target among them; word 3 only at the padded step). */
static const int32_t cand[5] = { 0, 1, 2, 4, 5 };

static void
run_full (const char *text, gboolean with_cand, gboolean s2s)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "softmax");
  Fix f;
  memset (&f, 0, sizeof f);
  f.hk = d->klass;
  f.s2s = s2s;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (text, "model.head", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f.params = psm_params_new ();
  int es[2] = { V, H };   /* the token embedding, for tie_embedding */
  int emb = psm_params_add (f.params, "embedding.src", 2, es, PSM_INIT_UNIFORM, 0.1f);
  PsmBuildCtx ctx = { sizeof ctx, f.params, "head.", &info, H, 4, H, H, s2s ? C : 0, s2s, emb };
  GError *e = NULL;
  f.head = f.hk->create (sec, &ctx, &e);
  ck_assert_msg (f.head, "%s", e ? e->message : "");
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  ck_assert (psm_params_finalize (f.params, &rng, NULL));
  psm_test_fill (psm_params_data (f.params), psm_params_size (f.params), 0.5f, &rng);
  psm_test_fill (f.state, TY * B * H, 1.0f, &rng);
  psm_test_fill (f.ctx, TY * B * C, 1.0f, &rng);
  psm_test_fill (f.in, TY * B * H, 1.0f, &rng);
  psm_batch_init (&f.batch);
  psm_batch_reserve (&f.batch, B, 5, TY);
  for (int i = 0; i < TY * B; i++) {
    f.batch.tgt[i] = (i * 5 + 2) % V;
    f.batch.tgt_mask[i] = i == 5 ? 0.0f : 1.0f;   /* last step of example 2 is padding */
  }
  if (with_cand)
    psm_batch_set_candidates (&f.batch, cand, 5);
  /* maxout's kinks: a step of 1e-2 can carry a unit's two pieces across each
   * other (the one-sided slopes then disagree), 1e-3 seldom does */
  float eps = strstr (text, "maxout") ? 1e-3f : 1e-2f;
  psm_test_gradcheck ("softmax params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), eps, 2e-3, 2e-2, 400);
  psm_test_gradcheck ("softmax state", f_loss, &f, f.state, f.gstate, TY * B * H, eps, 2e-3, 2e-2, 400);
  if (s2s) {
    psm_test_gradcheck ("softmax context", f_loss, &f, f.ctx, f.gctx, TY * B * C, eps, 2e-3, 2e-2, 400);
    psm_test_gradcheck ("softmax input", f_loss, &f, f.in, f.gin, TY * B * H, eps, 2e-3, 2e-2, 400);
  }
  /* padded step contributes nothing: its state gets no gradient */
  for (int j = 0; j < H; j++)
    ck_assert (f.gstate[5 * H + j] == 0.0f);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmDecOut out = outs (&f, g, 0, 1);
  PsmTensor *sc = f.hk->scores (f.head, g, f.params, NULL, &out, &f.batch);
  int S = with_cand ? 5 : V;
  ck_assert_int_eq (f.hk->space_size (f.head, &f.batch), S);
  f.batch.n_cand = 0;
  PsmTensor *full = f.hk->scores (f.head, g, f.params, NULL, &out, &f.batch);
  f.batch.n_cand = with_cand ? 5 : 0;
  for (int b = 0; b < B; b++) {
    double z = 0, zc = 0;
    for (int v = 0; v < S; v++)
      z += exp (sc->data[b * S + v]);
    ck_assert (fabs (z - 1.0) < 1e-5);
    ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, b, 4), with_cand ? 5 : 4);
    for (int k = 0; k < S; k++)
      zc += exp (full->data[b * V + (with_cand ? cand[k] : k)]);
    for (int k = 0; k < S; k++)   /* the candidates' softmax: the whole one renormalised */
      ck_assert (fabs (sc->data[b * S + k] - (full->data[b * V + (with_cand ? cand[k] : k)] - log (zc))) < 1e-5);
  }
  /* the loss is the mean of -log p(target) over the real steps */
  psm_graph_set_grad (g, FALSE);
  float loss = f_loss (g, &f)->data[0];
  double want = 0.0;
  for (int t = 0; t < TY; t++) {
    PsmDecOut o1 = outs (&f, g, t, 1);
    PsmTensor *st = f.hk->scores (f.head, g, f.params, NULL, &o1, &f.batch);
    for (int b = 0; b < B; b++)
      if (f.batch.tgt_mask[t * B + b] != 0.0f)
        want -= st->data[b * S + psm_batch_cand_index (&f.batch, f.batch.tgt[t * B + b])];
  }
  ck_assert_msg (fabs (loss - want / 5) < 1e-5, "loss %g, want %g", loss, want / 5);
  psm_graph_free (g);
  f.hk->destroy (f.head);
  psm_params_free (f.params);
  psm_batch_clear (&f.batch);
}

static void run_with (const char *text, gboolean with_cand) { run_full (text, with_cand, FALSE); }
static void run (const char *text) { run_with (text, FALSE); }

START_TEST (test_plain) { run ("plugin = \"softmax\";"); }
END_TEST

/* the large-vocabulary trick, untied and tied output weights */
START_TEST (test_candidates)
{
  run_with ("plugin = \"softmax\"; hidden = 3;", TRUE);
  run_with ("plugin = \"softmax\"; tie_embedding = true;", TRUE);
}
END_TEST

START_TEST (test_deep_output) { run ("plugin = \"softmax\"; hidden = 3;"); }
END_TEST

/* On an attention decoder: [s_t; c_t] through tanh, and Gulcehre et al.'s
 * eq. 3, f_o(s_t, y_(t-1), c_t) with maxout units (2 pieces each); with
 * the candidates too (the large-vocabulary trick). */
START_TEST (test_attention_decoder)
{
  run_full ("plugin = \"softmax\"; hidden = 3;", FALSE, TRUE);
  run_full ("plugin = \"softmax\"; hidden = 3; activation = \"maxout\"; prev_word = true;", FALSE, TRUE);
  run_full ("plugin = \"softmax\"; hidden = 3; activation = \"maxout\"; prev_word = true;", TRUE, TRUE);
  run_full ("plugin = \"softmax\"; hidden = 3; activation = \"maxout\";", FALSE, FALSE);
}
END_TEST

/* prev_word needs an attention decoder and a hidden layer; maxout needs
 * the layer */
START_TEST (test_deep_output_refusals)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "softmax");
  const PsmHeadClass *hk = d->klass;
  const char *texts[] = { "plugin = \"softmax\"; hidden = 3; prev_word = true;",
                          "plugin = \"softmax\"; activation = \"maxout\";" };
  const char *want[] = { "model.head.prev_word", "model.head.activation" };
  for (int i = 0; i < 2; i++) {
    char *errs = NULL;
    const PsmSection *sec = psm_test_section (texts[i], "model.head", d->params, &errs);
    ck_assert_msg (sec, "%s", errs);
    PsmParams *p = psm_params_new ();
    PsmBuildCtx ctx = { sizeof ctx, p, "head.", &info, H, 4, H, H, 0, FALSE, -1 };
    GError *e = NULL;
    ck_assert (!hk->create (sec, &ctx, &e));
    ck_assert_msg (strstr (e->message, want[i]), "%s", e->message);
    g_clear_error (&e);
    psm_params_free (p);
  }
}
END_TEST

/* the output weights are the embedding table: its gradient comes from the
 * softmax (checked with the other parameters) */
START_TEST (test_tied) { run ("plugin = \"softmax\"; tie_embedding = true;"); }
END_TEST

START_TEST (test_tied_mismatch)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "softmax");
  const PsmHeadClass *hk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"softmax\"; hidden = 3; tie_embedding = true;", "model.head",
                                            d->params, &errs);
  PsmParams *p = psm_params_new ();
  int es[2] = { V, H };
  PsmBuildCtx ctx = { sizeof ctx, p, "head.", &info, H, 4, H, H, 0, FALSE,
                      psm_params_add (p, "embedding.src", 2, es, PSM_INIT_UNIFORM, 0.1f) };
  GError *e = NULL;
  ck_assert (!hk->create (sec, &ctx, &e));
  ck_assert_msg (strstr (e->message, "model.head.tie_embedding") && strstr (e->message, "[6, 4]") &&
                 strstr (e->message, "[6, 3]"), "%s", e->message);
  g_clear_error (&e);
  psm_params_free (p);
}
END_TEST

START_TEST (test_bad_config)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "softmax");
  char *errs = NULL;
  ck_assert (!psm_test_section ("plugin = \"softmax\";\n  hidden = -1;\n  hiden = 3;", "model.head", d->params, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:3: model.head.hidden: value -1 out of range (expected [0, 16384])"), "%s", errs);
  ck_assert_msg (strstr (errs, "inline.cfg:4: model.head.hiden: unknown key (known keys: hidden, activation, prev_word, tie_embedding, plugin)"), "%s", errs);
  g_free (errs);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("head-softmax");
  TCase *tc = tcase_create ("softmax");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_plain);
  tcase_add_test (tc, test_candidates);
  tcase_add_test (tc, test_deep_output);
  tcase_add_test (tc, test_attention_decoder);
  tcase_add_test (tc, test_deep_output_refusals);
  tcase_add_test (tc, test_tied);
  tcase_add_test (tc, test_tied_mismatch);
  tcase_add_test (tc, test_bad_config);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
