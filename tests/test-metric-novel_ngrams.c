/* test-metric-novel_ngrams.c — novel n-gram and sentence rates by hand. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

START_TEST (test_novel)
{
  const PsmMetricClass *mk = psm_test_plugin (PSM_KIND_METRIC, "novel_ngrams")->klass;
  void *m = mk->create (NULL, NULL);
  /* article "the cat sat on the mat ." ; summary "the cat sat . the dog sat ."
   * unigrams 8, novel: dog = 1; bigrams 7 (the-cat cat-sat sat-. .-the
   * the-dog dog-sat sat-.), novel all but the-cat cat-sat = 5; sentences
   * "the cat sat ." (novel: the article has "sat on") and "the dog sat .":
   * both novel. Reference "the mat ." : copied whole, no novel n-gram. */
  mk->add_text (m, "the cat sat . the dog sat .", "the mat .", "the cat sat on the mat .");
  ck_assert (fabs (psm_test_metric_value (mk, m, "novel1") - 100.0 * 1 / 8) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "novel2") - 100.0 * 5 / 7) < 1e-9);
  ck_assert (fabs (psm_test_metric_value (mk, m, "novel_sent") - 100.0) < 1e-9);
  ck_assert (psm_test_metric_value (mk, m, "ref_novel1") == 0.0 &&
             psm_test_metric_value (mk, m, "ref_novel_sent") == 0.0);
  /* "the cat sat" as a sentence of its own line is copied whole */
  mk->reset (m);
  mk->add_text (m, "the cat sat\nthe dog", "", "the cat sat on the mat .");
  ck_assert (fabs (psm_test_metric_value (mk, m, "novel_sent") - 50.0) < 1e-9);
  /* no article: every n-gram is novel; nothing at all: 0, no NaN */
  mk->reset (m);
  mk->add_text (m, "a b", NULL, NULL);
  ck_assert (psm_test_metric_value (mk, m, "novel1") == 100.0 && psm_test_metric_value (mk, m, "ref_novel1") == 0.0);
  mk->destroy (m);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("metric-novel_ngrams");
  TCase *tc = tcase_create ("novel_ngrams");
  tcase_add_test (tc, test_novel);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
