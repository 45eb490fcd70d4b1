/* test-encoder-bigru.c — bidirectional GRU encoder: gradient check of
 * every parameter and the embedded input; with padding, the forward
 * direction carries its last real state and the backward one starts at the
 * last real token from zeros; the summary is h←_1. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 3, E = 5, H = 3 };

typedef struct {
  const PsmEncoderClass *ek;
  void *enc;
  PsmParams *params;
  float emb[T * B * E], gemb[T * B * E];
  float mask[T * B];
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, 10, 10, T, 1, -1, -1, 0 };

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  int s[3] = { T, B, E };
  PsmEncoding out;
  memset (&out, 0, sizeof out);
  f->ek->encode (f->enc, g, f->params, psm_tensor_wrap (g, f->emb, f->gemb, 3, s), f->mask, &out);
  return psm_add (g, psm_test_project (g, out.annotations), psm_scale (g, psm_test_project (g, out.summary), 2.0f));
}

static void
setup (Fix *f)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_ENCODER, "bigru");
  f->ek = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"bigru\"; hidden = 3;", "model.encoder", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "encoder.", &info, E, 0, 0, 0, 0, FALSE };
  f->enc = f->ek->create (sec, &ctx, NULL);
  ck_assert (f->enc && f->ek->output_dim (f->enc) == 2 * H && f->ek->summary_dim (f->enc) == H);
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.6f, &rng);
  psm_test_fill (f->emb, T * B * E, 1.0f, &rng);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      f->mask[t * B + b] = (b == 1 && t >= 2) || (b == 2 && t >= 1) ? 0.0f : 1.0f;
}

START_TEST (test_bigru_gradients)
{
  Fix f;
  setup (&f);
  psm_test_gradcheck ("bigru params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("bigru input", f_loss, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2, 400);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

START_TEST (test_bigru_padding)
{
  Fix f;
  setup (&f);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  int s[3] = { T, B, E };
  PsmEncoding out;
  memset (&out, 0, sizeof out);
  f.ek->encode (f.enc, g, f.params, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, &out);
  const float *a = out.annotations->data;
  /* backward half is zero on padding (it has not started yet) */
  for (int j = 0; j < H; j++) {
    ck_assert (a[(3 * B + 1) * 2 * H + H + j] == 0.0f && a[(2 * B + 1) * 2 * H + H + j] == 0.0f);
    ck_assert (a[(1 * B + 2) * 2 * H + H + j] == 0.0f);
    ck_assert (a[(1 * B + 1) * 2 * H + H + j] != 0.0f);
    /* forward half carries the last real state over padding */
    ck_assert (a[(3 * B + 1) * 2 * H + j] == a[(1 * B + 1) * 2 * H + j]);
  }
  /* example 1 alone (its 2 real tokens, no padding) encodes the same */
  float emb1[2 * E], m1[2] = { 1, 1 };
  for (int t = 0; t < 2; t++)
    memcpy (emb1 + t * E, f.emb + (t * B + 1) * E, E * sizeof (float));
  int s1[3] = { 2, 1, E };
  PsmEncoding o1;
  memset (&o1, 0, sizeof o1);
  f.ek->encode (f.enc, g, f.params, psm_tensor_wrap (g, emb1, NULL, 3, s1), m1, &o1);
  for (int j = 0; j < 2 * H; j++)
    for (int t = 0; t < 2; t++)
      ck_assert (fabsf (o1.annotations->data[t * 2 * H + j] - a[(t * B + 1) * 2 * H + j]) < 1e-6f);
  /* the summary is the backward state at the first token */
  for (int j = 0; j < H; j++) {
    ck_assert (fabsf (o1.summary->data[j] - out.summary->data[1 * H + j]) < 1e-6f);
    ck_assert (out.summary->data[1 * H + j] == a[(0 * B + 1) * 2 * H + H + j]);
  }
  psm_graph_free (g);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("encoder-bigru");
  TCase *tc = tcase_create ("bigru");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_bigru_gradients);
  tcase_add_test (tc, test_bigru_padding);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
