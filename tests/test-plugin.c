/* test-plugin.c — every loader failure is a clear error naming the file;
 * a good plugin loads once and is found by kind and name. */
#include "config.h"
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"

static char *
fixture (const char *base)
{
  return g_build_filename (PSM_TEST_FIXTURE_DIR, base, NULL);
}

static void
expect_error (const char *base, int code, const char *needle)
{
  char *path = fixture (base);
  GError *e = NULL;
  ck_assert_msg (psm_plugin_load_file (path, &e) == NULL, "%s loaded", base);
  ck_assert_msg (e && e->domain == PSM_PLUGIN_ERROR && e->code == code, "%s: wrong error code %d",
                 base, e ? e->code : -1);
  ck_assert_msg (strstr (e->message, path), "message does not name the file: %s", e->message);
  ck_assert_msg (strstr (e->message, needle), "message lacks \"%s\": %s", needle, e->message);
  g_error_free (e);
  g_free (path);
}

START_TEST (test_not_a_plugin)
{
  expect_error ("psm-metric-noentry.so", PSM_PLUGIN_ERROR_NO_ENTRY, "not a psm plugin (no symbol psm_plugin_entry)");
}
END_TEST

START_TEST (test_not_a_shared_object)
{
  char *dir = g_dir_make_tmp ("psm-test-XXXXXX", NULL);
  char *path = g_build_filename (dir, "psm-head-garbage.so", NULL);
  ck_assert (g_file_set_contents (path, "this is text, not ELF\n", -1, NULL));
  GError *e = NULL;
  ck_assert (psm_plugin_load_file (path, &e) == NULL);
  ck_assert_int_eq (e->code, PSM_PLUGIN_ERROR_OPEN);
  ck_assert_msg (strstr (e->message, path) && strstr (e->message, "cannot load plugin"), "%s", e->message);
  g_error_free (e);
  g_unlink (path);
  g_rmdir (dir);
  g_free (path);
  g_free (dir);
}
END_TEST

START_TEST (test_wrong_abi)
{
  char *want = g_strdup_printf ("plugin ABI 99.0 is incompatible with this psm's ABI %d.%d", PSM_ABI_MAJOR, PSM_ABI_MINOR);
  expect_error ("psm-metric-badabi.so", PSM_PLUGIN_ERROR_ABI, want);
  g_free (want);
}
END_TEST

START_TEST (test_wrong_kind)
{
  expect_error ("psm-metric-badkind.so", PSM_PLUGIN_ERROR_KIND, "invalid descriptor (kind 42");
}
END_TEST

START_TEST (test_init_failure)
{
  expect_error ("psm-metric-initfail.so", PSM_PLUGIN_ERROR_INIT, "plugin init failed: fixture resource missing");
}
END_TEST

START_TEST (test_duplicate)
{
  psm_test_plugin (PSM_KIND_METRIC, "error_rate");   /* the real one first */
  expect_error ("psm-metric-dup.so", PSM_PLUGIN_ERROR_DUPLICATE, "metric plugin 'error_rate' is already loaded from");
}
END_TEST

/* The loader checks the hooks the core calls and the parameter table, so a
 * careless plugin is a load error naming the field, not a crash later. */
START_TEST (test_null_hook)
{
  expect_error ("psm-head-nullhook.so", PSM_PLUGIN_ERROR_CLASS, "head plugin 'nullhook': required class field 'scores' is NULL");
  expect_error ("psm-task-nobatch.so", PSM_PLUGIN_ERROR_CLASS,
                "task plugin 'nobatch': class fields 'train_batch' and 'eval_batch_of' are both NULL (one is required)");
}
END_TEST

START_TEST (test_bad_param_table)
{
  expect_error ("psm-metric-badparam.so", PSM_PLUGIN_ERROR_CLASS, "metric plugin 'badparam': parameter 'mode' is a choice with no choices");
}
END_TEST

START_TEST (test_find_and_kind_mismatch)
{
  g_setenv ("PSM_PLUGIN_PATH", PSM_TEST_FIXTURE_DIR ":" PSM_TEST_PLUGIN_DIR, TRUE);
  GError *e = NULL;
  /* psm-metric-dup.so is named for 'dup' but declares 'error_rate' */
  ck_assert (psm_plugin_find (PSM_KIND_METRIC, "dup", &e) == NULL);
  ck_assert_msg (e && strstr (e->message, "psm-metric-dup.so"), "%s", e ? e->message : "");
  g_clear_error (&e);
  ck_assert (psm_plugin_find (PSM_KIND_HEAD, "no_such_head", &e) == NULL);
  ck_assert_int_eq (e->code, PSM_PLUGIN_ERROR_NOT_FOUND);
  ck_assert_msg (strstr (e->message, "no head plugin named 'no_such_head' (looked for psm-head-no_such_head.so in"), "%s", e->message);
  g_clear_error (&e);
  const PsmPlugin *a = psm_plugin_find (PSM_KIND_HEAD, "softmax", &e);
  const PsmPlugin *b = psm_plugin_find (PSM_KIND_HEAD, "softmax", &e);
  ck_assert (a && a == b);   /* loaded once */
  ck_assert_str_eq (a->desc->name, "softmax");
  ck_assert_int_eq (a->desc->kind, PSM_KIND_HEAD);
  /* load_all reports the broken fixtures and returns the good plugins */
  GPtrArray *errs = g_ptr_array_new_with_free_func (g_free);
  GPtrArray *all = psm_plugin_load_all (errs);
  ck_assert_uint_ge (all->len, 5);
  ck_assert_uint_ge (errs->len, 4);
  g_ptr_array_unref (all);
  g_ptr_array_unref (errs);
}
END_TEST

/* --describe's hook list: required hooks first, optional ones as set. */
static const PsmHookInfo *
hook (const PsmHookInfo *h, int n, const char *name)
{
  for (int i = 0; i < n; i++)
    if (strcmp (h[i].name, name) == 0)
      return &h[i];
  ck_abort_msg ("no hook %s", name);
  return NULL;
}

START_TEST (test_hooks)
{
  g_setenv ("PSM_PLUGIN_PATH", PSM_TEST_FIXTURE_DIR ":" PSM_TEST_PLUGIN_DIR, TRUE);
  GError *e = NULL;
  PsmHookInfo h[32];
  const PsmPlugin *sm = psm_plugin_find (PSM_KIND_HEAD, "softmax", &e);
  const PsmPlugin *pg = psm_plugin_find (PSM_KIND_HEAD, "pointer_generator", &e);
  ck_assert_msg (sm && pg, "%s", e ? e->message : "");
  int n = psm_plugin_hooks (sm, h, 32);
  ck_assert_int_eq (n, 10);
  ck_assert_str_eq (h[0].name, "create");
  ck_assert (h[0].required && h[0].set);
  ck_assert (!hook (h, n, "gate")->required && !hook (h, n, "gate")->set);
  ck_assert (hook (h, n, "slot_token")->required);
  n = psm_plugin_hooks (pg, h, 32);
  ck_assert (hook (h, n, "gate")->set && !hook (h, n, "input_embed")->set);
  ck_assert_int_eq (psm_plugin_hooks (pg, h, 2), 10);   /* fills 2, says how many */
  /* a class built for ABI 1.6 ends before carry_at's era but has carry_dim */
  const PsmPlugin *old = psm_plugin_find (PSM_KIND_ENCODER, "oldlm", &e);
  ck_assert_msg (old, "%s", e ? e->message : "");
  n = psm_plugin_hooks (old, h, 32);
  ck_assert (hook (h, n, "carry_dim")->set && hook (h, n, "encode")->set);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("plugin");
  TCase *tc = tcase_create ("loader");
  tcase_add_test (tc, test_not_a_plugin);
  tcase_add_test (tc, test_not_a_shared_object);
  tcase_add_test (tc, test_wrong_abi);
  tcase_add_test (tc, test_wrong_kind);
  tcase_add_test (tc, test_init_failure);
  tcase_add_test (tc, test_duplicate);
  tcase_add_test (tc, test_null_hook);
  tcase_add_test (tc, test_bad_param_table);
  tcase_add_test (tc, test_find_and_kind_mismatch);
  tcase_add_test (tc, test_hooks);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
