/* test-metric-bleu.c — corpus BLEU-4 worked out by hand: clipped counts,
 * several references and the closest (on a tie the shorter) reference
 * length, the brevity penalty, a zero precision, lower-casing, and empty
 * input without a division by zero. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

#define NEAR(a, b) ck_assert_msg (fabs ((a) - (b)) < 1e-9, "%s = %.12g, expected %.12g", #a, (double) (a), (double) (b))

static void *
make (const PsmMetricClass **mk, const char *cfg)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_METRIC, "bleu");
  *mk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "bleu", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  void *m = (*mk)->create (sec, NULL);
  ck_assert (m);
  return m;
}

START_TEST (test_bleu_corpus)
{
  const PsmMetricClass *mk;
  void *m = make (&mk, "");
  ck_assert (mk->higher_is_better);
  /* "the cat sat on the mat" / "the cat is on the mat": unigrams 5 of 6
   * (the x2, cat, on, mat), bigrams 3 of 5 (the cat, on the, the mat),
   * trigrams 1 of 4 (on the mat), 4-grams 0 of 3: BLEU 0 */
  mk->add_text (m, "the cat sat on the mat", "the cat is on the mat", NULL);
  NEAR (psm_test_metric_value (mk, m, "p1"), 100.0 * 5 / 6);
  NEAR (psm_test_metric_value (mk, m, "p2"), 100.0 * 3 / 5);
  NEAR (psm_test_metric_value (mk, m, "p3"), 100.0 * 1 / 4);
  NEAR (psm_test_metric_value (mk, m, "p4"), 0.0);
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 0.0);
  /* + "a b c d e" against two references, "a b c d f g h" (7) and
   * "a b c d" (4): the closest length is 4; every n-gram of a b c d counts:
   * 4 of 5, 3 of 4, 2 of 3, 1 of 2. Corpus: 9/11, 6/9, 3/7, 1/5; c = 11
   * words, r = 6 + 4 = 10, so no brevity penalty */
  mk->add_text (m, "a b c d e", "a b c d f g h\na b c d", NULL);
  NEAR (psm_test_metric_value (mk, m, "p1"), 100.0 * 9 / 11);
  NEAR (psm_test_metric_value (mk, m, "p4"), 100.0 * 1 / 5);
  NEAR (psm_test_metric_value (mk, m, "hyp_len"), 11);
  NEAR (psm_test_metric_value (mk, m, "ref_len"), 10);
  NEAR (psm_test_metric_value (mk, m, "BP"), 1.0);
  NEAR (psm_test_metric_value (mk, m, "ratio"), 1.1);
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 100.0 * pow (9.0 / 11 * 6.0 / 9 * 3.0 / 7 * 1.0 / 5, 0.25));
  /* reset, then the brevity penalty: "a b c d" against "a b c d e f", all
   * precisions 1, c = 4 < r = 6: BP = exp(1 - 6/4) */
  mk->reset (m);
  mk->add_text (m, "a b c d", "a b c d e f", NULL);
  NEAR (psm_test_metric_value (mk, m, "BP"), exp (-0.5));
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 100.0 * exp (-0.5));
  mk->destroy (m);
}
END_TEST

START_TEST (test_bleu_details)
{
  const PsmMetricClass *mk;
  void *m = make (&mk, "");
  /* clipping: "the" 4 times against a reference that has it once */
  mk->add_text (m, "the the the the", "the cat", NULL);
  NEAR (psm_test_metric_value (mk, m, "p1"), 25.0);
  NEAR (psm_test_metric_value (mk, m, "p2"), 0.0);
  /* equally close references of 4 and 6 words for 5: the shorter counts;
   * blank reference lines are not references; extra white space splits
   * like Perl's split ' ' */
  mk->reset (m);
  mk->add_text (m, "  a\tb c  d e ", "w x y z\n\nu v w x y z\n", NULL);
  NEAR (psm_test_metric_value (mk, m, "hyp_len"), 5);
  NEAR (psm_test_metric_value (mk, m, "ref_len"), 4);
  /* case: only with lowercase */
  mk->reset (m);
  mk->add_text (m, "The Cat", "the cat", NULL);
  NEAR (psm_test_metric_value (mk, m, "p1"), 0.0);
  mk->destroy (m);
  m = make (&mk, "lowercase = true;");
  mk->add_text (m, "The Cat", "the CAT", NULL);
  NEAR (psm_test_metric_value (mk, m, "p1"), 100.0);
  NEAR (psm_test_metric_value (mk, m, "p2"), 100.0);
  /* empty input: zeros, no division by zero; an empty reference is one
   * reference of length 0 */
  mk->reset (m);
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 0.0);
  mk->add_text (m, "", "a b", NULL);
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 0.0);
  NEAR (psm_test_metric_value (mk, m, "BP"), 0.0);
  mk->reset (m);
  mk->add_text (m, "a b", "", NULL);
  NEAR (psm_test_metric_value (mk, m, "ref_len"), 0);
  NEAR (psm_test_metric_value (mk, m, "BLEU"), 0.0);
  NEAR (psm_test_metric_value (mk, m, "ratio"), 0.0);
  mk->destroy (m);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("metric-bleu");
  TCase *tc = tcase_create ("bleu");
  tcase_add_test (tc, test_bleu_corpus);
  tcase_add_test (tc, test_bleu_details);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
