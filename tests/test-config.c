/* test-config.c — pipeline files: every kind of error is reported as
 * FILE:LINE: key.path: what is wrong (expected), all at once; --set. */
#include "config.h"
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include "psm/psm-pipeline.h"

static const char *good =
  "task = { plugin = \"rarest_word\"; length = 5; valid_size = 10; test_size = 10; };\n"   /* 1 */
  "model = {\n"                                                                          /* 2 */
  "  embedding = { dim = 8; };\n"                                                        /* 3 */
  "  encoder = { plugin = \"gru\"; hidden = 8; };\n"                                     /* 4 */
  "  head = { plugin = \"pointer_softmax\"; hidden = 8; };\n"                            /* 5 */
  "};\n"                                                                                 /* 6 */
  "train = { batch = 4; steps = 2; optimizer = { name = \"adam\"; lr = 0.01; }; };\n"   /* 7 */
  "metrics = ( \"error_rate\" );\n";                                                     /* 8 */

/* (in psm_test_dir (), which psm_test_run removes: each test runs in a
 * child of its own, which left a folder of its own in /tmp every run) */
static char *
write_cfg (const char *text)
{
  static int k;
  char *name = g_strdup_printf ("p%d.cfg", k++);
  char *path = psm_test_write_file (name, text);
  g_free (name);
  return path;
}

static char *
replace (const char *text, const char *from, const char *to)
{
  const char *at = strstr (text, from);
  ck_assert_msg (at, "fixture text lacks %s", from);
  return g_strdup_printf ("%.*s%s%s", (int) (at - text), text, to, at + strlen (from));
}

/* Loads text; expects failure whose message contains every needle (with
 * "@" replaced by the file name). */
static void
expect (const char *text, const char *const *sets, const char *const *needles)
{
  psm_test_plugin_env ();
  char *path = write_cfg (text);
  GError *e = NULL;
  PsmPipeline *pl = psm_pipeline_load (path, sets, &e);
  ck_assert_msg (pl == NULL, "pipeline was accepted:\n%s", text);
  ck_assert (e->domain == PSM_CONFIG_ERROR || e->domain == PSM_PLUGIN_ERROR);
  for (const char *const *n = needles; *n; n++) {
    char *want = strchr (*n, '@') ? replace (*n, "@", path) : g_strdup (*n);
    ck_assert_msg (strstr (e->message, want), "expected \"%s\" in:\n%s", want, e->message);
    g_free (want);
  }
  g_error_free (e);
  g_free (path);
}

START_TEST (test_good_and_set)
{
  psm_test_plugin_env ();
  char *path = write_cfg (good);
  GError *e = NULL;
  PsmPipeline *pl = psm_pipeline_load (path, NULL, &e);
  ck_assert_msg (pl, "%s", e ? e->message : "");
  ck_assert_str_eq (psm_pipeline_plugin (pl, "model.head")->desc->name, "pointer_softmax");
  ck_assert_int_eq (psm_section_int (psm_pipeline_section (pl, "task"), "length"), 5);
  ck_assert_int_eq (psm_section_int (psm_pipeline_section (pl, "task"), "vocab"), 600);  /* default */
  ck_assert (psm_pipeline_plugin (pl, "model.decoder") == NULL);
  psm_pipeline_free (pl);
  /* --set swaps the head, changes a number, adds a key, sets a float from an int */
  const char *sets[] = { "model.head.plugin=softmax", "task.length=9", "train.clip_norm=5",
                         "run.dir=\"/tmp/x y\"", NULL };
  pl = psm_pipeline_load (path, sets, &e);
  ck_assert_msg (pl, "%s", e ? e->message : "");
  ck_assert_str_eq (psm_pipeline_plugin (pl, "model.head")->desc->name, "softmax");
  ck_assert_int_eq (psm_section_int (psm_pipeline_section (pl, "task"), "length"), 9);
  ck_assert (psm_section_float (psm_pipeline_section (pl, "train"), "clip_norm") == 5.0);
  ck_assert_str_eq (psm_pipeline_run_dir (pl), "/tmp/x y");
  /* the model builds and the run folder defaults to runs/<name> otherwise */
  PsmModel *m = psm_model_new (pl, TRUE, &e);
  ck_assert_msg (m, "%s", e ? e->message : "");
  psm_model_free (m);
  psm_pipeline_free (pl);
  g_free (path);
}
END_TEST

START_TEST (test_parse_error)
{
  const char *n[] = { "@:2: parse error: syntax error", NULL };
  expect ("task = { plugin = \"rarest_word\"; };\nmodel = { head = { plugin = ; }; };\n", NULL, n);
  GError *e = NULL;
  ck_assert (psm_pipeline_load ("/nonexistent/x.cfg", NULL, &e) == NULL);
  ck_assert_str_eq (e->message, "/nonexistent/x.cfg: cannot read pipeline: no such file");
  g_error_free (e);
}
END_TEST

START_TEST (test_all_errors_at_once)
{
  char *t1 = replace (good, "length = 5;", "lenght = 5; vocab = \"six\";");
  char *t2 = replace (t1, "hidden = 8; };\n  head", "hidden = 0; };\n  head");
  char *t3 = replace (t2, "name = \"adam\";", "name = \"rmsprop\";");
  char *t4 = replace (t3, "metrics = ( \"error_rate\" );", "metrics = ( \"error_rate\", \"bleu9\" );\nextra = 1;");
  const char *n[] = {
    "@:1: task.lenght: unknown key (known keys: vocab, length,",
    "@:1: task.vocab: wrong type (expected an integer)",
    "@:4: model.encoder.hidden: value 0 out of range (expected [1, 16384])",
    "@:7: train.optimizer.name: unknown value \"rmsprop\" (expected one of sgd|adam|adagrad|adadelta)",
    "@:8: metrics.[1]: no metric plugin named 'bleu9'",
    "@:9: extra: unknown key",
    NULL };
  expect (t4, NULL, n);
  g_free (t1);
  g_free (t2);
  g_free (t3);
  g_free (t4);
}
END_TEST

START_TEST (test_missing_and_unknown_plugins)
{
  char *t1 = replace (good, "  head = { plugin = \"pointer_softmax\"; hidden = 8; };\n", "");
  const char *n1[] = { "model.head: missing section (expected model.head = { plugin = \"...\"; ... })", NULL };
  expect (t1, NULL, n1);
  char *t2 = replace (good, "plugin = \"gru\";", "plugin = \"lstm9\";");
  const char *n2[] = { "@:4: model.encoder.plugin: no encoder plugin named 'lstm9'", NULL };
  expect (t2, NULL, n2);
  char *t3 = replace (good, "plugin = \"gru\"; ", "");
  const char *n3[] = { "@:4: model.encoder.plugin: missing required key", NULL };
  expect (t3, NULL, n3);
  g_free (t1);
  g_free (t2);
  g_free (t3);
}
END_TEST

START_TEST (test_set_errors)
{
  const char *s1[] = { "task.length=0", NULL };
  const char *n1[] = { "--set task.length: value 0 out of range (expected [1, 10000])", NULL };
  expect (good, s1, n1);
  const char *s2[] = { "model.head.plugin=nosuch", NULL };
  const char *n2[] = { "--set model.head.plugin: no head plugin named 'nosuch'", NULL };
  expect (good, s2, n2);
  const char *s3[] = { "task.lenght=3", NULL };
  const char *n3[] = { "--set task.lenght: unknown key", NULL };
  expect (good, s3, n3);
  const char *s4[] = { "noequals", NULL };
  const char *n4[] = { "--set noequals: expected key.path=value", NULL };
  expect (good, s4, n4);
  const char *s5[] = { "task.length.x=3", NULL };
  const char *n5[] = { "--set task.length.x: \"length\" is not a group", NULL };
  expect (good, s5, n5);
  /* libconfig reads ':' and '/' in a name as a path: "metrics:x" found the
   * list metrics (found by the pipeline fuzzer; it crashed) */
  const char *s6[] = { "metrics: ( \"x\" )ta=i", NULL };
  const char *n6[] = { "--set metrics: ( \"x\" )ta: malformed key \"metrics: ( \"x\" )ta\" (expected a letter, then "
                       "letters, digits, '_' or '-')", NULL };
  expect (good, s6, n6);
  const char *s7[] = { "task.len/gth=3", NULL };
  const char *n7[] = { "--set task.len/gth: malformed key \"len/gth\"", NULL };
  expect (good, s7, n7);
}
END_TEST

START_TEST (test_missing_file)
{
  static const PsmParamSpec spec[] = {
    { "train", PSM_PARAM_FILE, "", PSM_NO_RANGE, "training data", NULL },
    { "size", PSM_PARAM_INT, NULL, 1, 10, "required size", NULL },
    PSM_PARAM_END
  };
  char *errs = NULL;
  ck_assert (!psm_test_section ("train = \"/nonexistent/train.jsonl\";", "task", spec, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:2: task.train: file \"/nonexistent/train.jsonl\" does not exist"), "%s", errs);
  ck_assert_msg (strstr (errs, "task.size: missing required key (int: required size)"), "%s", errs);
  g_free (errs);
}
END_TEST

START_TEST (test_semantic_error_names_line)
{
  psm_test_plugin_env ();
  char *t = replace (good, "length = 5;", "length = 5;\n  pointer_words = 700;");
  char *path = write_cfg (t);
  GError *e = NULL;
  PsmPipeline *pl = psm_pipeline_load (path, NULL, &e);
  ck_assert_msg (pl, "%s", e ? e->message : "");
  ck_assert (psm_model_new (pl, TRUE, &e) == NULL);
  char *want = g_strdup_printf ("%s:2: task.pointer_words: must be below task.vocab (600)", path);
  ck_assert_msg (strstr (e->message, want), "%s", e->message);
  g_free (want);
  g_error_free (e);
  psm_pipeline_free (pl);
  g_free (path);
  g_free (t);
}
END_TEST

/* libconfig 1.5 reads integer literals as 32 bits and wraps them silently
 * (4294968296 -> 1000): psm scans the file and refuses them by line. */
START_TEST (test_wrapped_integers)
{
  char *t1 = replace (good, "steps = 2;", "steps = 4294968296;");
  const char *n1[] = { "@:7: train.steps: integer 4294968296 does not fit in 32 bits", "4294968296L", NULL };
  expect (t1, NULL, n1);
  /* every one at once: groups, a negative, hex, a list element */
  char *t2 = replace (good, "batch = 4;", "batch = 4294967312; seed = -2147483649; log_every = 0x100000000;");
  char *t3 = replace (t2, "metrics = ( \"error_rate\" );", "extra = ( 1, 99999999999 );");
  const char *n3[] = { "@:7: train.batch: integer 4294967312", "@:7: train.seed: integer -2147483649",
                       "@:7: train.log_every: integer 0x100000000", "@:8: extra.[1]: integer 99999999999", NULL };
  expect (t3, NULL, n3);
  /* comments and strings are not scanned; the L suffix is 64-bit and range-checked */
  char *t4 = replace (good, "steps = 2;", "steps = 4294968296L; # 99999999999\n /* 88888888888 */ ");
  const char *n4[] = { "@:7: train.steps: value 4.29497e+09 out of range", NULL };
  expect (t4, NULL, n4);
  /* in an @include'd file, with that file's name and line */
  char *inc = write_cfg ("\n\ntrain = { batch = 4; steps = 4294968296; };\n");
  char *incl = g_strdup_printf ("@include \"%s\"\n", strrchr (inc, '/') + 1);
  char *t5 = replace (good, "train = { batch = 4; steps = 2; optimizer = { name = \"adam\"; lr = 0.01; }; };\n", incl);
  char *n5a = g_strdup_printf ("%s:3: train.steps: integer 4294968296 does not fit", inc);
  const char *n5[] = { n5a, NULL };
  expect (t5, NULL, n5);
  /* in range: still accepted */
  char *t6 = replace (good, "steps = 2;", "steps = 2147483647; seed = -5;");
  char *path = write_cfg (t6);
  GError *e = NULL;
  PsmPipeline *pl = psm_pipeline_load (path, NULL, &e);
  ck_assert (pl == NULL && strstr (e->message, "train.steps: value 2.14748e+09 out of range") &&
             strstr (e->message, "train.seed: value -5 out of range") && !strstr (e->message, "32 bits"));
  g_error_free (e);
  g_free (path);
  g_free (t6);
  g_free (n5a);
  g_free (t5);
  g_free (incl);
  g_free (inc);
  g_free (t4);
  g_free (t3);
  g_free (t2);
  g_free (t1);
}
END_TEST

START_TEST (test_directory_as_pipeline)
{
  GError *e = NULL;
  ck_assert (psm_pipeline_load (PSM_TEST_SRCDIR "/pipelines", NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "/pipelines: cannot read pipeline: is a directory, not a pipeline file"), "%s", e->message);
  g_clear_error (&e);
  ck_assert (psm_pipeline_load ("/nonexistent.cfg", NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "/nonexistent.cfg: cannot read pipeline: no such file"), "%s", e->message);
  g_clear_error (&e);
}
END_TEST

/* The public section-from-text reader that third-party plugin tests use. */
START_TEST (test_section_from_text)
{
  static const PsmParamSpec spec[] = {
    { "hidden", PSM_PARAM_INT, "8", 1, 100, "units", NULL },
    { "mode", PSM_PARAM_CHOICE, "a", PSM_NO_RANGE, "variant", "a|b" },
    PSM_PARAM_END
  };
  GError *e = NULL;
  PsmSection *s = psm_section_from_text ("plugin = \"x\";\nhidden = 12;", "t.cfg", "model.head", spec, &e);
  ck_assert_msg (s, "%s", e ? e->message : "");
  ck_assert_int_eq (psm_section_int (s, "hidden"), 12);
  ck_assert_str_eq (psm_section_string (s, "mode"), "a");
  ck_assert_str_eq (psm_section_where (s, "hidden"), "t.cfg:2: model.head.hidden");
  psm_section_destroy (s);
  ck_assert (!psm_section_from_text ("hidden = 12;\nmode = \"c\";", "t.cfg", "model.head", spec, &e));
  ck_assert_msg (strstr (e->message, "t.cfg:2: model.head.mode") != NULL, "%s", e->message);
  g_clear_error (&e);
  ck_assert (!psm_section_from_text ("hidden = 12;\nsize 3", "t.cfg", "model.head", spec, &e));
  ck_assert_msg (g_str_has_prefix (e->message, "t.cfg:"), "%s", e->message);
  g_clear_error (&e);
  psm_section_destroy (NULL);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("config");
  TCase *tc = tcase_create ("pipeline");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_good_and_set);
  tcase_add_test (tc, test_wrapped_integers);
  tcase_add_test (tc, test_directory_as_pipeline);
  tcase_add_test (tc, test_parse_error);
  tcase_add_test (tc, test_all_errors_at_once);
  tcase_add_test (tc, test_missing_and_unknown_plugins);
  tcase_add_test (tc, test_set_errors);
  tcase_add_test (tc, test_missing_file);
  tcase_add_test (tc, test_semantic_error_names_line);
  tcase_add_test (tc, test_section_from_text);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
