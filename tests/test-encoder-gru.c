/* test-encoder-gru.c — GRU encoder: gradient check of every parameter and
 * the embedded input; padding carries the state into the summary; bad config. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 3, E = 5, H = 4 };

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

START_TEST (test_gru_encoder)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_ENCODER, "gru");
  Fix f;
  f.ek = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"gru\"; hidden = 4;", "model.encoder", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f.params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f.params, "encoder.", &info, E, 0, 0, 0, 0, FALSE };
  GError *e = NULL;
  f.enc = f.ek->create (sec, &ctx, &e);
  ck_assert (f.enc && f.ek->output_dim (f.enc) == H && f.ek->summary_dim (f.enc) == H);
  ck_assert_int_eq (psm_params_count (f.params), 4);
  PsmRng rng;
  psm_rng_seed (&rng, 3);
  ck_assert (psm_params_finalize (f.params, &rng, NULL));
  psm_test_fill (psm_params_data (f.params), psm_params_size (f.params), 0.6f, &rng);
  psm_test_fill (f.emb, T * B * E, 1.0f, &rng);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      f.mask[t * B + b] = (b == 1 && t >= 2) ? 0.0f : 1.0f;   /* example 1 has 2 tokens */
  psm_test_gradcheck ("gru params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 400);
  psm_test_gradcheck ("gru input", f_loss, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2, 400);
  /* summary = last real state */
  PsmGraph *g = psm_graph_new ();
  int s[3] = { T, B, E };
  PsmEncoding out;
  f.ek->encode (f.enc, g, f.params, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, &out);
  for (int j = 0; j < H; j++) {
    ck_assert (out.summary->data[1 * H + j] == out.annotations->data[(1 * B + 1) * H + j]);
    ck_assert (out.summary->data[0 * H + j] == out.annotations->data[(3 * B + 0) * H + j]);
  }
  psm_graph_free (g);
  f.ek->destroy (f.enc);
  psm_params_free (f.params);
}
END_TEST

START_TEST (test_bad_config)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_ENCODER, "gru");
  char *errs = NULL;
  ck_assert (!psm_test_section ("plugin = \"gru\";\n  hidden = 2.5;", "model.encoder", d->params, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:3: model.encoder.hidden: wrong type (expected an integer)"), "%s", errs);
  g_free (errs);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("encoder-gru");
  TCase *tc = tcase_create ("gru");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_gru_encoder);
  tcase_add_test (tc, test_bad_config);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
