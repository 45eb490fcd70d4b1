/* test-head-pointer_sentinel.c — the pointer sentinel head (Merity et al.
 * 2016): finite-difference checks of its parameters and of this segment's
 * states with a window that reaches back into an earlier segment (P = L - 1
 * stored states, some of them before the stream's start); the loss of a
 * segment's second half given the first half as history equals the loss of
 * those positions computed in one segment (the window crosses the boundary
 * exactly); without the pointer loss the loss is the mean of -token_logp,
 * with it (the default) that plus the mean of -log(g + sum of the
 * target's attention), worked out here from the parameters; the mixed
 * distribution of scores sums to one; a task without streams is refused. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 2, H = 3, V = 5, L = 3, P = L - 1 };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  float state[T * B * H], gstate[T * B * H], past[P * B * H];
  int32_t past_ids[P * B];
  PsmBatch batch;
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), V, V, V, T, T, -1, -1, -1, TRUE };

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  int s[3] = { T, B, H }, ps[3] = { P, B, H };
  PsmDecOut out = { .Ty = T, .B = B, .state = psm_tensor_wrap (g, f->state, f->gstate, 3, s), .P = P,
                    .past = psm_tensor_wrap (g, f->past, NULL, 3, ps), .past_ids = f->past_ids };
  return f->hk->loss (f->head, g, f->params, NULL, &out, &f->batch);
}

static void
setup (Fix *f, const char *text)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_sentinel");
  f->hk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (text, "model.head", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  int es[2] = { V, H };
  int emb = psm_params_add (f->params, "embedding.src", 2, es, PSM_INIT_UNIFORM, 0.1f);
  PsmBuildCtx ctx = { sizeof ctx, f->params, "head.", &info, H, H, H, H, 0, FALSE, emb };
  GError *e = NULL;
  f->head = f->hk->create (sec, &ctx, &e);
  ck_assert_msg (f->head, "%s", e ? e->message : "");
  ck_assert_int_eq (f->hk->history (f->head), P);
  PsmRng rng;
  psm_rng_seed (&rng, 11);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  /* large enough that the window's scores matter against the sentinel */
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 1.0f, &rng);
  psm_test_fill (f->state, T * B * H, 1.0f, &rng);
  psm_test_fill (f->past, P * B * H, 1.0f, &rng);
  /* stream 0 has a full history; stream 1 started one position ago */
  int32_t pid[P * B] = { 2, -1, 4, 3 };
  memcpy (f->past_ids, pid, sizeof pid);
  psm_batch_init (&f->batch);
  psm_batch_reserve (&f->batch, B, T, T);
  int32_t src[T * B] = { 1, 3, 2, 4, 1, 0, 2, 2 }, tgt[T * B] = { 2, 4, 1, 0, 2, 2, 4, 3 };
  for (int i = 0; i < T * B; i++) {
    f->batch.src[i] = src[i];
    f->batch.tgt[i] = tgt[i];
    f->batch.src_mask[i] = f->batch.tgt_mask[i] = i == T * B - 1 ? 0.0f : 1.0f;   /* last of stream 1 padded */
  }
  /* targets that only the window can have: tgt 4 of stream 0 at t=0 is in
   * its history (id 4), tgt 2 at t=2 is its current input */
}

static void
teardown (Fix *f)
{
  f->hk->destroy (f->head);
  psm_params_free (f->params);
  psm_batch_clear (&f->batch);
}

static void
gradcheck (const char *text)
{
  Fix f;
  setup (&f, text);
  psm_test_gradcheck ("sentinel params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 1e-2f, 2e-3, 2e-2, 400);
  psm_test_gradcheck ("sentinel state", f_loss, &f, f.state, f.gstate, T * B * H, 1e-2f, 2e-3, 2e-2, 400);
  for (int j = 0; j < H; j++)   /* the padded position is no target and in no later window */
    ck_assert (f.gstate[(T * B - 1) * H + j] == 0.0f);
  teardown (&f);
}

START_TEST (test_gradients) { gradcheck ("plugin = \"pointer_sentinel\"; window = 3;"); }
END_TEST

START_TEST (test_gradients_no_pointer_loss)
{
  gradcheck ("plugin = \"pointer_sentinel\"; window = 3; pointer_loss = false;");
}
END_TEST

START_TEST (test_gradients_tied) { gradcheck ("plugin = \"pointer_sentinel\"; window = 3; tie_embedding = true;"); }
END_TEST

/* Positions 2..3 scored with positions 0..1 as history (P = 2) give the
 * same per-token log-probabilities as in one segment of 4 positions; the
 * loss is the weighted mean of -token_logp. */
START_TEST (test_boundary)
{
  Fix f;
  setup (&f, "plugin = \"pointer_sentinel\"; window = 3; pointer_loss = false;");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  int s4[3] = { T, B, H };
  /* whole: no history before the segment */
  int32_t none[P * B] = { -1, -1, -1, -1 };
  PsmDecOut whole = { .Ty = T, .B = B, .state = psm_tensor_wrap (g, f.state, NULL, 3, s4), .P = P,
                      .past = psm_tensor_wrap (g, f.past, NULL, 3, (int[]) { P, B, H }), .past_ids = none };
  float lp4[T * B], gt4[T * B];
  f.hk->token_logp (f.head, g, f.params, NULL, &whole, &f.batch, lp4, gt4);
  PsmTensor *loss = f.hk->loss (f.head, g, f.params, NULL, &whole, &f.batch);
  double sum = 0.0, w = 0.0;
  for (int r = 0; r < T * B; r++)
    if (f.batch.tgt_mask[r] != 0.0f) {
      sum -= lp4[r];
      w += 1.0;
      ck_assert (gt4[r] > 0.0f && gt4[r] < 1.0f);
    }
  ck_assert_msg (fabs (sum / w - loss->data[0]) < 1e-5, "mean -logp %g vs loss %g", sum / w, loss->data[0]);
  /* second half, the first half as history */
  PsmBatch half;
  psm_batch_init (&half);
  psm_batch_reserve (&half, B, 2, 2);
  int32_t hid[2 * B];
  for (int i = 0; i < 2 * B; i++) {
    half.src[i] = f.batch.src[2 * B + i];
    half.tgt[i] = f.batch.tgt[2 * B + i];
    half.src_mask[i] = f.batch.src_mask[2 * B + i];
    half.tgt_mask[i] = f.batch.tgt_mask[2 * B + i];
    hid[i] = f.batch.src[i];
  }
  PsmDecOut second = { .Ty = 2, .B = B, .state = psm_tensor_wrap (g, f.state + 2 * B * H, NULL, 3, (int[]) { 2, B, H }),
                       .P = P, .past = psm_tensor_wrap (g, f.state, NULL, 3, (int[]) { P, B, H }), .past_ids = hid };
  float lp2[2 * B], gt2[2 * B];
  f.hk->token_logp (f.head, g, f.params, NULL, &second, &half, lp2, gt2);
  for (int r = 0; r < 2 * B; r++)
    if (half.tgt_mask[r] != 0.0f)
      ck_assert_msg (fabs (lp2[r] - lp4[2 * B + r]) < 1e-5 && fabs (gt2[r] - gt4[2 * B + r]) < 1e-6,
                     "row %d: %g vs %g", r, lp2[r], lp4[2 * B + r]);
  /* the mixed distribution of the first position sums to one */
  PsmDecOut one = { .Ty = 1, .B = B, .state = psm_tensor_wrap (g, f.state, NULL, 3, (int[]) { 1, B, H }), .P = P,
                    .past = whole.past, .past_ids = f.past_ids };
  PsmTensor *sc = f.hk->scores (f.head, g, f.params, NULL, &one, &f.batch);
  ck_assert_int_eq (psm_tensor_cols (sc), V);
  for (int b = 0; b < B; b++) {
    double z = 0.0;
    for (int v = 0; v < V; v++)
      z += exp (sc->data[b * V + v]);
    ck_assert_msg (fabs (z - 1.0) < 1e-5, "row %d sums to %g", b, z);
  }
  psm_batch_clear (&half);
  psm_graph_free (g);
  teardown (&f);
}
END_TEST

/* p_vocab(y) of row r from the head's own parameters: softmax(h W_o + b_o) */
static double
p_vocab (Fix *f, int r)
{
  PsmParams *p = f->params;
  const float *w = psm_params_data (p) + psm_params_offset (p, psm_params_find (p, "head.w_o"));
  const float *bo = psm_params_data (p) + psm_params_offset (p, psm_params_find (p, "head.b_o"));
  const float *h = f->state + (size_t) r * H;
  double z[V], mx = -INFINITY, sum = 0.0;
  for (int v = 0; v < V; v++) {
    z[v] = bo[v];
    for (int i = 0; i < H; i++)
      z[v] += h[i] * w[i * V + v];
    mx = MAX (mx, z[v]);
  }
  for (int v = 0; v < V; v++)
    sum += exp (z[v] - mx);
  return exp (z[f->batch.tgt[r]] - mx) / sum;
}

/* The default loss adds §2.6's pointer loss: the mixture's p(y) = g p_v(y)
 * + A (A the attention on the target's positions), so A = p(y) - g p_v(y)
 * and the pointer loss of the row is -log(g + A). */
START_TEST (test_pointer_loss)
{
  Fix f, off;
  setup (&f, "plugin = \"pointer_sentinel\"; window = 3;");
  setup (&off, "plugin = \"pointer_sentinel\"; window = 3; pointer_loss = false;");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  int s3[3] = { T, B, H }, ps[3] = { P, B, H };
  PsmDecOut out = { .Ty = T, .B = B, .state = psm_tensor_wrap (g, f.state, NULL, 3, s3), .P = P,
                    .past = psm_tensor_wrap (g, f.past, NULL, 3, ps), .past_ids = f.past_ids };
  float lp[T * B], gt[T * B];
  f.hk->token_logp (f.head, g, f.params, NULL, &out, &f.batch, lp, gt);
  double nll = 0.0, ptr = 0.0, w = 0.0, gsum = 0.0;
  for (int r = 0; r < T * B; r++)
    if (f.batch.tgt_mask[r] != 0.0f) {
      double a = exp (lp[r]) - gt[r] * p_vocab (&f, r);
      ck_assert_msg (a > -1e-6, "row %d: negative attention %g", r, a);
      nll -= lp[r];
      ptr -= log (gt[r] + MAX (a, 0.0));
      gsum += a;
      w += 1.0;
    }
  ck_assert_msg (gsum > 0.1, "the fixture's targets should be in their windows (attention %g)", gsum);
  float on_loss = f.hk->loss (f.head, g, f.params, NULL, &out, &f.batch)->data[0];
  float off_loss = off.hk->loss (off.head, g, off.params, NULL, &out, &off.batch)->data[0];
  ck_assert_msg (fabs (off_loss - nll / w) < 1e-5, "no pointer loss: %g vs %g", off_loss, nll / w);
  ck_assert_msg (fabs (on_loss - (nll + ptr) / w) < 1e-5, "with it: %g vs %g + %g", on_loss, nll / w, ptr / w);
  ck_assert (ptr / w > 1e-3);
  psm_graph_free (g);
  teardown (&f);
  teardown (&off);
}
END_TEST

START_TEST (test_refuses_non_streams)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_sentinel");
  const PsmHeadClass *hk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"pointer_sentinel\";", "model.head", d->params, &errs);
  PsmParams *p = psm_params_new ();
  PsmTaskInfo plain = info;
  plain.streams = FALSE;
  PsmBuildCtx ctx = { sizeof ctx, p, "head.", &plain, H, H, H, H, 0, FALSE, 0 };
  GError *e = NULL;
  ck_assert (!hk->create (sec, &ctx, &e));
  ck_assert_msg (strstr (e->message, "model.head.window") && strstr (e->message, "task lm"), "%s", e->message);
  g_clear_error (&e);
  /* tied, with an embedding of the wrong width */
  PsmTaskInfo si = info;
  int es[2] = { V, H + 1 };
  ctx.task = &si;
  ctx.emb_param = psm_params_add (p, "embedding.src", 2, es, PSM_INIT_UNIFORM, 0.1f);
  sec = psm_test_section ("plugin = \"pointer_sentinel\"; tie_embedding = true;", "model.head", d->params, &errs);
  ck_assert (!hk->create (sec, &ctx, &e));
  ck_assert_msg (strstr (e->message, "tie_embedding") && strstr (e->message, "[5, 4]"), "%s", e->message);
  g_clear_error (&e);
  psm_params_free (p);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("head-pointer_sentinel");
  TCase *tc = tcase_create ("pointer_sentinel");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_gradients);
  tcase_add_test (tc, test_gradients_no_pointer_loss);
  tcase_add_test (tc, test_pointer_loss);
  tcase_add_test (tc, test_gradients_tied);
  tcase_add_test (tc, test_boundary);
  tcase_add_test (tc, test_refuses_non_streams);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
