/* test-metric-repetition.c — duplicate n-gram rates worked out by hand. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

START_TEST (test_repetition)
{
  const PsmMetricClass *mk = psm_test_plugin (PSM_KIND_METRIC, "repetition")->klass;
  void *m = mk->create (NULL, NULL);
  /* "a b c a b c a": unigrams 7, repeats a b c a = 4; bigrams 6 (ab bc ca ab
   * bc ca), repeats 3; trigrams 5 (abc bca cab abc bca), repeats 2; 4-grams
   * 4 (abca bcab cabc abca), repeats 1. Reference "x y\nx": 1 of 3 unigrams;
   * its line break is a space (the bigram "y x" exists). */
  mk->add_text (m, "a b c a b c a", "x y\nx", NULL);
  ck_assert (fabs (psm_test_metric_value (mk, m, "dup1") - 100.0 * 4 / 7) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "dup2") - 100.0 * 3 / 6) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "dup3") - 100.0 * 2 / 5) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "dup4") - 100.0 * 1 / 4) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "ref_dup1") - 100.0 / 3) < 1e-9);
  ck_assert (psm_test_metric_value (mk, m, "ref_dup2") == 0.0);
  /* pooled over summaries: + "d e" (2 unigrams, none repeated) -> 4 of 9 */
  mk->add_text (m, "d e", "", NULL);
  ck_assert (fabs (psm_test_metric_value (mk, m, "dup1") - 100.0 * 4 / 9) < 1e-9);
  ck_assert (!mk->higher_is_better);
  mk->reset (m);
  mk->add_text (m, "", NULL, NULL);   /* nothing: rates 0, no division by zero */
  ck_assert (psm_test_metric_value (mk, m, "dup1") == 0.0 && psm_test_metric_value (mk, m, "ref_dup4") == 0.0);
  mk->destroy (m);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("metric-repetition");
  TCase *tc = tcase_create ("repetition");
  tcase_add_test (tc, test_repetition);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
