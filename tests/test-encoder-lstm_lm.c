/* test-encoder-lstm_lm — the L-layer LSTM language model encoder:
 * finite-difference check of every parameter and the embedded input, from a
 * carried non-zero start state; two segments run one after the other, the state
 * carried through carry_in/carry_out, give the annotations of the whole
 * sequence run at once; padding at a stream's end keeps its end state; with
 * dropout and zoneout, the same check with fixed draws, and training draws
 * differ while evaluation is deterministic; a segment whose carry is taken
 * from inside it (carry_at, overlapping segments) gives the same
 * annotations, carries the state after carry_at positions, and is
 * gradient-checked through both halves. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 3, E = 5, H = 3, L = 2, K = 2 * L * H };

typedef struct {
  const PsmEncoderClass *ek;
  void *enc;
  PsmParams *params;
  float emb[2 * T * B * E], gemb[2 * T * B * E];
  float carry[B * K];
  float mask[2 * T * B];
  int carry_at;
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, 10, 10, T, T, -1, -1, 0, TRUE };

static void
encode (Fix *f, PsmGraph *g, float *emb, float *gemb, int Tn, const float *mask, const float *carry,
        PsmEncoding *out)
{
  int s[3] = { Tn, B, E };
  memset (out, 0, sizeof *out);
  out->T = Tn;
  out->B = B;
  out->carry_in = carry;
  out->carry_at = f->carry_at;
  f->ek->encode (f->enc, g, f->params, psm_tensor_wrap (g, emb, gemb, 3, s), mask, out);
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmEncoding out;
  /* from a non-zero start state (no gradient flows into it: truncated
   * backpropagation through time) */
  encode (f, g, f->emb, f->gemb, T, f->mask, f->carry, &out);
  return psm_add (g, psm_test_project (g, out.annotations), psm_scale (g, psm_test_project (g, out.carry_out), 0.5f));
}

static void
setup_with (Fix *f, const char *text)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_ENCODER, "lstm_lm");
  f->ek = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (text, "model.encoder", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "encoder.", &info, E, 0, 0, 0, 0, FALSE };
  f->enc = f->ek->create (sec, &ctx, NULL);
  ck_assert (f->enc && f->ek->output_dim (f->enc) == H);
  ck_assert (f->ek->carry_dim && f->ek->carry_dim (f->enc) == K);
  PsmRng rng;
  psm_rng_seed (&rng, 7);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.6f, &rng);
  psm_test_fill (f->emb, 2 * T * B * E, 1.0f, &rng);
  psm_test_fill (f->carry, B * K, 0.8f, &rng);
  for (int i = 0; i < 2 * T * B; i++)
    f->mask[i] = 1.0f;
  f->carry_at = 0;
}

static void setup (Fix *f) { setup_with (f, "plugin = \"lstm_lm\"; hidden = 3; layers = 2;"); }

/* With dropout and zoneout: every loss of the check draws the same masks
 * (the training rng restarted from one state), so the finite differences
 * see one function. */
static PsmRng reg_rng;

static PsmTensor *
f_loss_reg (PsmGraph *g, void *ud)
{
  PsmRng r = reg_rng;
  psm_graph_set_rng (g, &r);
  PsmTensor *l = f_loss (g, ud);
  psm_graph_set_rng (g, NULL);
  return l;
}

START_TEST (test_lstm_lm_regularised)
{
  Fix f;
  setup_with (&f, "plugin = \"lstm_lm\"; hidden = 3; layers = 2; dropout = 0.4; zoneout = 0.3;");
  psm_rng_seed (&reg_rng, 3);
  psm_test_gradcheck ("lstm_lm dropout+zoneout params", f_loss_reg, &f, psm_params_data (f.params),
                      psm_params_grad (f.params), psm_params_size (f.params), 1e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("lstm_lm dropout+zoneout input", f_loss_reg, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2,
                      400);
  /* training draws differ from one rng state to the next; without the rng
   * (evaluation) the output is deterministic and differs from a draw */
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding a, b, c, d;
  encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &a);
  encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &b);
  PsmRng r1 = reg_rng, r2;
  psm_rng_seed (&r2, 4);
  psm_graph_set_rng (g, &r1);
  encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &c);
  psm_graph_set_rng (g, &r2);
  encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &d);
  psm_graph_set_rng (g, NULL);
  size_t n = a.annotations->n;
  ck_assert (memcmp (a.annotations->data, b.annotations->data, n * sizeof (float)) == 0);
  ck_assert (memcmp (a.annotations->data, c.annotations->data, n * sizeof (float)) != 0);
  ck_assert (memcmp (c.annotations->data, d.annotations->data, n * sizeof (float)) != 0);
  psm_graph_free (g);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

START_TEST (test_lstm_lm_gradients)
{
  Fix f;
  setup (&f);
  psm_test_gradcheck ("lstm_lm params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 1e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("lstm_lm input", f_loss, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2, 400);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

START_TEST (test_lstm_lm_segments)
{
  Fix f;
  setup (&f);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  float zero[B * K] = { 0 };
  PsmEncoding whole, one, two;
  encode (&f, g, f.emb, NULL, 2 * T, f.mask, zero, &whole);
  encode (&f, g, f.emb, NULL, T, f.mask, zero, &one);
  float mid[B * K];
  memcpy (mid, one.carry_out->data, sizeof mid);
  encode (&f, g, f.emb + T * B * E, NULL, T, f.mask, mid, &two);
  for (int i = 0; i < T * B * H; i++) {
    ck_assert_msg (fabsf (whole.annotations->data[i] - one.annotations->data[i]) < 1e-6, "segment 1 [%d]", i);
    ck_assert_msg (fabsf (whole.annotations->data[T * B * H + i] - two.annotations->data[i]) < 1e-6,
                   "segment 2 [%d]: %g vs %g", i, whole.annotations->data[T * B * H + i], two.annotations->data[i]);
  }
  for (int i = 0; i < B * K; i++)
    ck_assert (fabsf (whole.carry_out->data[i] - two.carry_out->data[i]) < 1e-6);
  /* row 1 ends after 2 positions of the second segment: its end state is
   * the state there */
  float mask2[T * B];
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      mask2[t * B + b] = b == 1 && t >= 2 ? 0.0f : 1.0f;
  PsmEncoding cut, cut_short;
  encode (&f, g, f.emb + T * B * E, NULL, T, mask2, mid, &cut);
  encode (&f, g, f.emb + T * B * E, NULL, 2, f.mask, mid, &cut_short);
  for (int k = 0; k < K; k++)
    ck_assert (fabsf (cut.carry_out->data[1 * K + k] - cut_short.carry_out->data[1 * K + k]) < 1e-6);
  psm_graph_free (g);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

START_TEST (test_lstm_lm_carry_at)
{
  static const char *cfgs[2] = { "plugin = \"lstm_lm\"; hidden = 3; layers = 2;",
                                 "plugin = \"lstm_lm\"; hidden = 3; layers = 2; dropout = 0.4; zoneout = 0.3;" };
  for (int c = 0; c < 2; c++) {
    Fix f;
    setup_with (&f, cfgs[c]);
    psm_rng_seed (&reg_rng, 5);
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    for (int k = 1; k < T; k++) {
      /* the same draws for the three runs: training rng restarted */
      PsmEncoding whole, split, head;
      PsmRng r = reg_rng;
      psm_graph_set_rng (g, c ? &r : NULL);
      f.carry_at = 0;
      encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &whole);
      r = reg_rng;
      f.carry_at = k;
      encode (&f, g, f.emb, NULL, T, f.mask, f.carry, &split);
      psm_graph_set_rng (g, NULL);
      for (size_t i = 0; i < whole.annotations->n; i++)
        ck_assert_msg (fabsf (whole.annotations->data[i] - split.annotations->data[i]) < 1e-6,
                       "config %d carry_at %d annotation %zu: %g vs %g", c, k, i, whole.annotations->data[i],
                       split.annotations->data[i]);
      ck_assert (fabsf (whole.summary->data[0] - split.summary->data[0]) < 1e-6);
      if (c == 0) {
        /* the carry is the state after k positions: a run of k positions */
        f.carry_at = 0;
        encode (&f, g, f.emb, NULL, k, f.mask, f.carry, &head);
        for (int i = 0; i < B * K; i++)
          ck_assert_msg (fabsf (head.carry_out->data[i] - split.carry_out->data[i]) < 1e-6,
                         "carry_at %d carry[%d]: %g vs %g", k, i, head.carry_out->data[i], split.carry_out->data[i]);
      }
    }
    psm_graph_free (g);
    /* gradients through both halves (the carry's own gradient included) */
    f.carry_at = 2;
    psm_test_gradcheck (c ? "lstm_lm carry_at=2 dropout+zoneout params" : "lstm_lm carry_at=2 params", f_loss_reg, &f,
                        psm_params_data (f.params), psm_params_grad (f.params), psm_params_size (f.params), 1e-3f,
                        2e-3, 2e-2, 500);
    psm_test_gradcheck ("lstm_lm carry_at=2 input", f_loss_reg, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2, 400);
    f.ek->destroy (f.enc);
    psm_params_free (f.params);
  }
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("encoder-lstm_lm");
  TCase *tc = tcase_create ("core");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_lstm_lm_gradients);
  tcase_add_test (tc, test_lstm_lm_regularised);
  tcase_add_test (tc, test_lstm_lm_segments);
  tcase_add_test (tc, test_lstm_lm_carry_at);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
