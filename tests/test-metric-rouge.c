/* test-metric-rouge.c — ROUGE against values worked out by hand, the stems
 * of ROUGE-1.5.5's Porter stemmer and its WordNet exception lookup (bench/rouge-vs-official.sh compares
 * whole corpora with the Perl script itself). */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

static const PsmMetricClass *mk;
static const PsmPluginDesc *desc;

static void *
make (const char *settings)
{
  if (!desc) {
    desc = psm_test_plugin (PSM_KIND_METRIC, "rouge");
    mk = desc->klass;
  }
  char *text = g_strdup_printf ("plugin = \"rouge\"; %s", settings);
  char *errs = NULL;
  const PsmSection *s = psm_test_section (text, "m", desc->params, &errs);
  ck_assert_msg (s, "%s", errs);
  GError *e = NULL;
  void *m = mk->create (s, &e);
  ck_assert_msg (m, "%s", e ? e->message : "");
  g_free (text);
  return m;
}

static double
value (void *m, const char *name)
{
  PsmMetricReport r;
  mk->report (m, &r);
  for (int i = 0; i < r.n; i++)
    if (strcmp (r.names[i], name) == 0)
      return r.values[i];
  ck_abort_msg ("no value %s", name);
  return NAN;
}

#define NEAR(a, b) ck_assert_msg (fabs ((a) - (b)) < 1e-9, "%s = %.6f, expected %.6f", #a, (a), (double) (b))

START_TEST (test_hand_worked)
{
  /* Lin (2004) §3.2's union LCS example: the reference sentence aa bb cc dd
   * ee against two summary sentences; LCS with the first is aa bb, with the
   * second aa cc ee: the union aa bb cc ee gives 4 hits. The summary has 10
   * tokens ("." is not a token). ROUGE-1: hits aa bb cc ee = 4 of 5 / of 10.
   * ROUGE-2: of aa-bb bb-cc cc-dd dd-ee only aa-bb, 1 of 4 / of 9. */
  void *m = make ("average = \"mean\";");
  ck_assert_int_eq (mk->higher_is_better, TRUE);
  mk->add_text (m, "aa bb ff gg hh . aa cc hh ii ee .", "aa bb cc dd ee", NULL);
  NEAR (value (m, "rougeL_r"), 80.0);
  NEAR (value (m, "rougeL_p"), 40.0);
  NEAR (value (m, "rougeL_f"), 53.333);   /* .8 .4 / (.5 .8 + .5 .4), to 5 places */
  NEAR (value (m, "rouge1_r"), 80.0);
  NEAR (value (m, "rouge1_p"), 40.0);
  NEAR (value (m, "rouge2_r"), 25.0);
  NEAR (value (m, "rouge2_p"), 11.111);
  NEAR (value (m, "rouge2_f"), 15.385);   /* .25 .11111 / (.5 .11111 + .5 .25) */
  /* Without the sentence split the summary is one sentence: its LCS with the
   * reference is aa bb cc ee as well here, but aa cc ee dd order shows the
   * difference: one sentence "ee dd" against "dd ee" gives an LCS of 1. */
  mk->reset (m);
  mk->add_text (m, "ee . dd .", "dd ee", NULL);
  NEAR (value (m, "rougeL_r"), 100.0);    /* union of "ee" and "dd" */
  mk->destroy (m);
  m = make ("average = \"mean\"; sentence_end = \"\";");
  mk->add_text (m, "ee . dd .", "dd ee", NULL);
  NEAR (value (m, "rougeL_r"), 50.0);
  /* clipping: a repeated summary word counts once per reference occurrence */
  mk->reset (m);
  mk->add_text (m, "the the the", "the cat", NULL);
  NEAR (value (m, "rouge1_r"), 50.0);
  NEAR (value (m, "rouge1_p"), 33.333);
  NEAR (value (m, "rougeL_r"), 50.0);
  /* the mean over summaries: (100 + 0) / 2; an empty summary scores 0 */
  mk->reset (m);
  mk->add_text (m, "dog", "dog", NULL);
  mk->add_text (m, "", "dog", NULL);
  NEAR (value (m, "rouge1_f"), 50.0);
  NEAR (value (m, "rougeL_f"), 50.0);
  mk->destroy (m);
}
END_TEST

START_TEST (test_tokens)
{
  /* lower-cased; "-" splits and is dropped; bytes outside [a-z0-9] are spaces */
  void *m = make ("average = \"mean\"; stem = false;");
  mk->add_text (m, "Well-Known U.S. caf\xc3\xa9 <unk>", "well known u s caf unk", NULL);
  NEAR (value (m, "rouge1_r"), 100.0);
  NEAR (value (m, "rouge1_p"), 100.0);
  mk->destroy (m);
}
END_TEST

START_TEST (test_stemmer)
{
  /* Stems of ROUGE-1.5.5's stemmer (run on these words): a summary word
   * matches its stem as reference (the stem stems to itself). */
  static const char *const pairs[][2] = {
    { "caresses", "caress" }, { "ponies", "poni" }, { "cats", "cat" }, { "plastered", "plaster" },
    { "motoring", "motor" }, { "conflated", "conflat" }, { "troubled", "troubl" }, { "sized", "size" },
    { "hopping", "hop" }, { "falling", "fall" }, { "filing", "file" }, { "happy", "happi" },
    { "relational", "relat" }, { "conditional", "condit" }, { "rational", "ration" }, { "valenci", "valenc" },
    { "digitizer", "digit" }, { "generalization", "gener" }, { "replacement", "replac" },
    { "adjustment", "adjust" }, { "dependent", "depend" }, { "adoption", "adopt" }, { "yelling", "yell" },
    { "yearly", "yearli" }, { "hopeful", "hope" }, { "goodness", "good" }, { "electrical", "electr" },
    { "formalize", "formal" }, { "sensitivity", "sensit" }, { "argument", "argum" }, { "communism", "commun" },
    { "controll", "control" }, { "settlement", "settlem" },
  };
  void *on = make ("average = \"mean\";"), *off = make ("average = \"mean\"; stem = false;");
  for (guint i = 0; i < G_N_ELEMENTS (pairs); i++) {
    mk->reset (on);
    mk->reset (off);
    mk->add_text (on, pairs[i][0], pairs[i][1], NULL);
    mk->add_text (off, pairs[i][0], pairs[i][1], NULL);
    ck_assert_msg (value (on, "rouge1_r") == 100.0, "%s should stem to %s", pairs[i][0], pairs[i][1]);
    ck_assert (value (off, "rouge1_r") == 0.0);
  }
  /* words of 3 letters or fewer are left alone: "ties" -> "ti", "tie" stays */
  mk->reset (on);
  mk->add_text (on, "ties", "tie", NULL);
  ck_assert (value (on, "rouge1_r") == 0.0);
  mk->destroy (on);
  mk->destroy (off);
}
END_TEST

START_TEST (test_exceptions)
{
  /* ROUGE-1.5.5's MorphStem: a token longer than 3 found in WordNet 2.0's
   * exception lists becomes its base form, which is not stemmed further; the
   * others are Porter-stemmed. Each row: summary word, reference word, and
   * whether they match with the lists (they never match without them). */
  static const struct { const char *sum, *ref; gboolean hit; } rows[] = {
    { "went", "go", TRUE },            /* verb.exc */
    { "children", "child", TRUE },     /* noun.exc; "child" stems to itself */
    { "geese", "goose", FALSE },       /* goose, unstemmed, against "goos" */
    { "geese", "geese", TRUE },
    { "mice", "mice", TRUE },
    { "best", "well", TRUE },          /* adv.exc is read after adj.exc ... */
    { "best", "good", FALSE },         /* ... so not adj.exc's "good" */
    { "better", "well", TRUE },
    { "abaci", "abacus", FALSE },      /* 5 letters: looked up; "abacus" -> "abacu" */
    { "zoa", "zoon", FALSE },          /* 3 letters: never looked up */
    { "worse", "bad", TRUE },          /* adj.exc; "bad" is too short to stem */
  };
  void *on = make ("average = \"mean\";"), *off = make ("average = \"mean\"; exceptions = false;");
  for (guint i = 0; i < G_N_ELEMENTS (rows); i++) {
    mk->reset (on);
    mk->reset (off);
    mk->add_text (on, rows[i].sum, rows[i].ref, NULL);
    mk->add_text (off, rows[i].sum, rows[i].ref, NULL);
    ck_assert_msg (value (on, "rouge1_r") == (rows[i].hit ? 100.0 : 0.0), "%s / %s: %s expected", rows[i].sum,
                   rows[i].ref, rows[i].hit ? "a match" : "no match");
    ck_assert_msg (value (off, "rouge1_r") == (strcmp (rows[i].sum, rows[i].ref) ? 0.0 : 100.0), "%s / %s",
                   rows[i].sum, rows[i].ref);
  }
  mk->destroy (on);
  mk->destroy (off);
}
END_TEST

START_TEST (test_limits)
{
  /* -l 3 counts raw words, "." included: the summary is cut to "aa bb .",
   * tokens aa bb; the reference to aa bb cc: R 2/3, P 2/2 */
  void *m = make ("average = \"mean\"; limit_words = 3;");
  mk->add_text (m, "aa bb . cc dd", "aa bb cc dd", NULL);
  NEAR (value (m, "rouge1_p"), 100.0);
  NEAR (value (m, "rouge1_r"), 66.667);
  mk->destroy (m);
  /* -b 6. N-grams (readText) read the reference "aa bb" (5 bytes) then " " and
   * the first byte of "cc dd": aa bb c; the summary "aa bb cc dd" cut to 6
   * bytes: aa bb. ROUGE-L (readText_LCS, which never adds up the bytes it
   * took) keeps every sentence shorter than 6 bytes whole: the reference is
   * aa bb / cc dd, 4 tokens, of which the union LCS hits aa bb. */
  m = make ("average = \"mean\"; limit_bytes = 6;");
  mk->add_text (m, "aa bb cc dd", "aa bb\ncc dd", NULL);
  NEAR (value (m, "rouge1_r"), 66.667);
  NEAR (value (m, "rouge1_p"), 100.0);
  NEAR (value (m, "rougeL_r"), 50.0);
  NEAR (value (m, "rougeL_p"), 100.0);
  mk->destroy (m);
  /* both limits at once is a configuration error */
  mk->destroy (make (""));   /* loads the plugin */
  char *errs = NULL;
  const PsmSection *s = psm_test_section ("limit_words = 3; limit_bytes = 5;", "m", desc->params, &errs);
  GError *e = NULL;
  ck_assert (mk->create (s, &e) == NULL);
  ck_assert_msg (strstr (e->message, "not both"), "%s", e->message);
  g_error_free (e);
}
END_TEST

START_TEST (test_bootstrap)
{
  /* One summary: every resample is it. Several: the bootstrap average is
   * deterministic and within a point of the mean here. */
  void *b = make (""), *m = make ("average = \"mean\";");
  const char *h[] = { "aa bb cc", "aa", "dd ee", "aa bb", "cc" }, *r[] = { "aa bb", "aa bb", "dd", "bb aa", "aa" };
  for (int i = 0; i < 5; i++) {
    mk->add_text (b, h[i], r[i], NULL);
    mk->add_text (m, h[i], r[i], NULL);
  }
  double vb = value (b, "rouge1_r"), vm = value (m, "rouge1_r");
  NEAR (vm, 100.0 * (1 + 0.5 + 1 + 1 + 0) / 5);
  ck_assert (vb != vm && fabs (vb - vm) < 10.0);
  NEAR (value (b, "rouge1_r"), vb);
  mk->destroy (b);
  mk->destroy (m);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("metric-rouge");
  TCase *tc = tcase_create ("rouge");
  tcase_add_test (tc, test_hand_worked);
  tcase_add_test (tc, test_tokens);
  tcase_add_test (tc, test_stemmer);
  tcase_add_test (tc, test_exceptions);
  tcase_add_test (tc, test_limits);
  tcase_add_test (tc, test_bootstrap);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
