/* test-metric-error_rate.c — hand-computed error rates. */
#include "config.h"
#include <math.h>
#include "psm-test.h"

START_TEST (test_error_rate)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_METRIC, "error_rate");
  const PsmMetricClass *mk = d->klass;
  ck_assert (!mk->higher_is_better);
  void *m = mk->create (NULL, NULL);
  int32_t a[] = { 1, 2, 3 }, b[] = { 1, 5, 3, 4 }, c[] = { 7 };
  PsmSeq h1 = { 3, a, NULL }, r1 = { 4, b, NULL };   /* 1 substitution + 1 missing of 4 */
  PsmSeq h2 = { 1, c, NULL }, r2 = { 1, c, NULL };   /* right */
  PsmSeq h3 = { 1, a, NULL }, r3 = { 1, c, NULL };   /* wrong */
  mk->add (m, &h1, &r1);
  mk->add (m, &h2, &r2);
  mk->add (m, &h3, &r3);
  PsmMetricReport rep;
  mk->report (m, &rep);
  ck_assert_int_eq (rep.n, 1);
  ck_assert_str_eq (rep.names[0], "error_rate");
  ck_assert (fabs (rep.values[0] - 100.0 * 3 / 6) < 1e-9);
  mk->reset (m);
  mk->add (m, &h2, &r2);
  mk->report (m, &rep);
  ck_assert (rep.values[0] == 0.0);
  mk->destroy (m);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("metric-error_rate");
  TCase *tc = tcase_create ("error_rate");
  tcase_add_test (tc, test_error_rate);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
