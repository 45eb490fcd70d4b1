/* test-metric-perplexity.c — exp of the mean NLL per word, over several
 * add_loss calls, reset between evaluations; lower is better. */
#include "config.h"
#include <math.h>
#include "psm-test.h"

START_TEST (test_perplexity)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_METRIC, "perplexity");
  const PsmMetricClass *k = d->klass;
  void *m = k->create (NULL, NULL);
  ck_assert (m && !k->higher_is_better && k->add_loss);
  k->reset (m);
  k->add_loss (m, 10.0, 4);   /* mean 2.5 so far */
  k->add_loss (m, 2.0, 4);    /* 12 / 8 = 1.5 */
  PsmMetricReport r = { 0 };
  k->report (m, &r);
  ck_assert_int_eq (r.n, 2);
  ck_assert_str_eq (r.names[0], "perplexity");
  ck_assert (fabs (r.values[0] - exp (1.5)) < 1e-12);
  ck_assert (fabs (r.values[1] - 1.5) < 1e-12);
  k->reset (m);
  k->add_loss (m, log (100.0) * 3, 3);   /* uniform over 100 words: 100 */
  k->report (m, &r);
  ck_assert (fabs (r.values[0] - 100.0) < 1e-9);
  k->destroy (m);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  Suite *s = suite_create ("metric-perplexity");
  TCase *tc = tcase_create ("perplexity");
  tcase_add_test (tc, test_perplexity);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
