/* test-encoder-readagain_lstm.c — the read-again LSTM (Zeng et al.
 * §3.1.2, §3.1.3): gradient check of every parameter and the embedded
 * input for one sentence with padding (the fused sequence path) and two
 * sentences (options 1 and 2: the per-step path with restarts); padding
 * does not change an example's encoding or its input-gate importance,
 * which lies in (0, 1) and exists only outside training, when the core
 * asks for it (PsmEncoding.want_importance). */
#define RA_PLUGIN "readagain_lstm"
#define RA_IMPORTANCE_IS_GATE 1
#include "readagain-fixture.h"

int
main (void)
{
  Suite *s = suite_create ("encoder-readagain_lstm");
  TCase *tc = tcase_create ("readagain_lstm");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_gradients);
  tcase_add_test (tc, test_padding);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
