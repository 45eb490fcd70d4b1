/* test-encoder-readagain_gru.c — the read-again GRU (Zeng et al. §3.1.1,
 * §3.1.3): gradient check of every parameter and the embedded input for
 * one sentence with padding, two sentences (options 1 and 2) and scalar
 * tanh weights; padding does not change an example's encoding; with alpha
 * at 0 the second read never moves from zero, with alpha at 1 it is a
 * plain GRU that restarts at the second sentence (its states there equal
 * those of that sentence read alone). */
#define RA_PLUGIN "readagain_gru"
#define RA_EXTRA_GRADIENTS gradients ("plugin = \"readagain_gru\"; hidden = 3; alpha = \"scalar\"; alpha_act = \"tanh\";", TRUE)
#include "readagain-fixture.h"

/* alpha saturated through its bias: 0 keeps the second read at zero; 1
 * makes it a GRU that restarts at each sentence */
START_TEST (test_alpha_limits)
{
  Fix f;
  setup (&f, "plugin = \"readagain_gru\"; hidden = 3; sentences = 2;", TRUE);
  int id = psm_params_find (f.params, "encoder.alpha.b");
  ck_assert (id >= 0);
  float *ab = psm_params_data (f.params) + psm_params_offset (f.params, id);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  int s[3] = { T, B, E };
  PsmEncoding out;
  for (int j = 0; j < H; j++)
    ab[j] = -60.0f;
  encode (&f, g, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, f.seg, &out);
  for (int i = 0; i < T * B * H; i++)
    ck_assert (fabsf (out.annotations->data[i]) < 1e-6f);
  for (int j = 0; j < H; j++)
    ab[j] = 60.0f;
  encode (&f, g, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, f.seg, &out);
  /* example 0's second sentence (tokens 2..4) read alone */
  float emb1[3 * E], m1[3] = { 1, 1, 1 };
  for (int t = 0; t < 3; t++)
    memcpy (emb1 + t * E, f.emb + ((t + 2) * B + 0) * E, E * sizeof (float));
  int s1[3] = { 3, 1, E };
  PsmEncoding o1;
  encode (&f, g, psm_tensor_wrap (g, emb1, NULL, 3, s1), m1, NULL, &o1);
  for (int t = 0; t < 3; t++)
    for (int j = 0; j < H; j++)
      ck_assert_msg (fabsf (o1.annotations->data[t * H + j] - out.annotations->data[((t + 2) * B) * H + j]) < 1e-5f,
                     "restart at the second sentence, token %d unit %d", t + 2, j);
  psm_graph_free (g);
  teardown (&f);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("encoder-readagain_gru");
  TCase *tc = tcase_create ("readagain_gru");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_gradients);
  tcase_add_test (tc, test_padding);
  tcase_add_test (tc, test_alpha_limits);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
