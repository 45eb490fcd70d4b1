/* psm-score.c — psm-run score: any text metric over two line-aligned files,
 * without a model or a pipeline. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "run/run-internal.h"
#include "psm/psm-metric.h"
#include "psm/psm-pipeline.h"

char **
psm_read_lines (const char *path, const char *what, GError **error)
{
  char *text = NULL;
  gsize n = 0;
  GError *e = NULL;
  if (strcmp (path, "-") == 0) {
    GString *s = g_string_new (NULL);
    char buf[65536];
    size_t k;
    while ((k = fread (buf, 1, sizeof buf, stdin)) > 0)
      g_string_append_len (s, buf, (gssize) k);
    n = s->len;
    text = g_string_free (s, FALSE);
  } else if (!g_file_get_contents (path, &text, &n, &e)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s (%s): %s", path, what, e->message);
    g_error_free (e);
    return NULL;
  }
  if (n && text[n - 1] == '\n')
    text[n - 1] = '\0';
  char **lines = n ? g_strsplit (text, "\n", -1) : g_new0 (char *, 1);
  g_free (text);
  return lines;
}

/* A line with its sentence separator tokens (sep) turned into line breaks. */
static char *
split_sentences (const char *line, const char *sep)
{
  if (!sep || !*sep)
    return g_strdup (line);
  char **tok = g_strsplit_set (line, " \t\r", -1);
  GString *s = g_string_new (NULL);
  gboolean fresh = TRUE;
  for (char **t = tok; *t; t++) {
    if (!**t)
      continue;
    if (strcmp (*t, sep) == 0) {
      if (!fresh)
        g_string_append_c (s, '\n');
      fresh = TRUE;
      continue;
    }
    g_string_append_printf (s, "%s%s", fresh ? "" : " ", *t);
    fresh = FALSE;
  }
  g_strfreev (tok);
  return g_string_free (s, FALSE);
}

gboolean
psm_score_files (const char *const *metrics, const char *const *sets, const char *hyp_path,
                 const char *const *ref_paths, const char *src_path, const char *sep, GError **error)
{
  int n_ref = ref_paths ? (int) g_strv_length ((char **) ref_paths) : 0;
  g_return_val_if_fail (n_ref >= 1, FALSE);
  int nm = metrics ? (int) g_strv_length ((char **) metrics) : 0;
  if (nm == 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE, "score: name a metric with --metric (e.g. rouge)");
    return FALSE;
  }
  /* Metric settings: --set NAME.key=value, validated like a pipeline's. */
  config_t cfg;
  config_init (&cfg);
  const PsmPlugin **plug = g_new0 (const PsmPlugin *, nm);
  PsmSection **sec = g_new0 (PsmSection *, nm);
  void **inst = g_new0 (void *, nm);
  char **hyp = NULL, **src = NULL;
  char ***ref = g_new0 (char **, n_ref);
  gboolean ok = TRUE;
  for (int i = 0; i < nm && ok; i++) {
    plug[i] = psm_plugin_find (PSM_KIND_METRIC, metrics[i], error);
    ok = plug[i] != NULL;
    if (ok && !PSM_CLASS_HOOK ((const PsmMetricClass *) plug[i]->desc->klass, add_text)) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                   "score: metric '%s' scores token ids, not texts (it has no add_text); text metrics: rouge, "
                   "bleu, repetition, novel_ngrams", metrics[i]);
      ok = FALSE;
    }
    const PsmMetricClass *mk = ok ? plug[i]->desc->klass : NULL;
    gboolean multi = ok && mk->size >= G_STRUCT_OFFSET (PsmMetricClass, multi_reference) + sizeof (gboolean) &&
                     mk->multi_reference;
    if (ok && n_ref > 1 && !multi) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                   "score: %d reference files, but metric '%s' takes one reference an example (several: bleu)",
                   n_ref, metrics[i]);
      ok = FALSE;
    }
    if (ok && !config_setting_get_member (config_root_setting (&cfg), metrics[i]))
      config_setting_add (config_root_setting (&cfg), metrics[i], CONFIG_TYPE_GROUP);
  }
  for (const char *const *s = sets; ok && s && *s; s++)
    ok = psm_config_apply_set (&cfg, *s, error);
  if (ok) {
    GPtrArray *errors = g_ptr_array_new_with_free_func (g_free);
    config_setting_t *root = config_root_setting (&cfg);
    for (int i = 0; i < config_setting_length (root); i++) {
      const char *name = config_setting_name (config_setting_get_elem (root, i));
      gboolean known = FALSE;
      for (int k = 0; k < nm; k++)
        known = known || strcmp (name, metrics[k]) == 0;
      if (!known)
        g_ptr_array_add (errors, g_strdup_printf ("--set %s: not one of the metrics given with --metric", name));
    }
    for (int i = 0; i < nm; i++) {
      config_setting_t *g = config_setting_get_member (root, metrics[i]);
      psm_validate_group ("(command line)", g, metrics[i], plug[i]->desc->params, NULL, errors);
      sec[i] = psm_section_new (plug[i]->desc->params, g, metrics[i], "(command line)");
    }
    if (errors->len) {
      g_ptr_array_add (errors, NULL);
      char *msg = g_strjoinv ("\n", (char **) errors->pdata);
      g_set_error_literal (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, msg);
      g_free (msg);
      ok = FALSE;
    }
    g_ptr_array_unref (errors);
  }
  for (int i = 0; i < nm && ok; i++) {
    const PsmMetricClass *k = plug[i]->desc->klass;
    inst[i] = k->create (sec[i], error);
    ok = inst[i] != NULL;
  }
  int n_stdin = strcmp (hyp_path, "-") == 0 && 1;
  for (int r = 0; r < n_ref; r++)
    n_stdin += strcmp (ref_paths[r], "-") == 0;
  n_stdin += src_path && strcmp (src_path, "-") == 0;
  if (ok && n_stdin > 1) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE, "score: only one of the files can be - (standard input)");
    ok = FALSE;
  }
  ok = ok && (hyp = psm_read_lines (hyp_path, "summaries", error));
  for (int r = 0; r < n_ref && ok; r++)
    ok = (ref[r] = psm_read_lines (ref_paths[r], "references", error)) != NULL;
  ok = ok && (!src_path || (src = psm_read_lines (src_path, "sources", error)));
  guint nh = ok ? g_strv_length (hyp) : 0;
  for (int r = 0; r < n_ref && ok; r++) {
    guint nr = g_strv_length (ref[r]);
    if (nr != nh) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "score: the files are not line-aligned: %s has %u lines, %s %u", hyp_path, nh, ref_paths[r], nr);
      ok = FALSE;
    }
  }
  if (ok && src && g_strv_length (src) != nh) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "score: the files are not line-aligned: %s has %u lines, %s %u", hyp_path, nh, src_path,
                 g_strv_length (src));
    ok = FALSE;
  }
  if (ok && nh == 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "score: %s is empty", hyp_path);
    ok = FALSE;
  }
  for (guint l = 0; ok && l < nh; l++) {
    /* several reference files: their lines, as lines of one reference */
    char *h = split_sentences (hyp[l], sep);
    GString *r = g_string_new (NULL);
    for (int k = 0; k < n_ref; k++) {
      char *one = split_sentences (ref[k][l], sep);
      g_string_append_printf (r, "%s%s", k ? "\n" : "", one);
      g_free (one);
    }
    for (int i = 0; i < nm; i++) {
      const PsmMetricClass *k = plug[i]->desc->klass;
      k->add_text (inst[i], h, r->str, src ? src[l] : NULL);
    }
    g_free (h);
    g_string_free (r, TRUE);
  }
  for (int i = 0; i < nm && ok; i++) {
    const PsmMetricClass *k = plug[i]->desc->klass;
    PsmMetricReport rep = { 0 };
    k->report (inst[i], &rep);
    psm_out (PSM_OUT_RESULT, "%s (%u summaries):", metrics[i], nh);
    for (int v = 0; v < rep.n; v++)
      psm_out (PSM_OUT_RESULT, "  %s %.2f", rep.names[v], rep.values[v]);
    psm_out (PSM_OUT_RESULT, "\n");
  }
  for (int i = 0; i < nm; i++) {
    if (inst[i])
      ((const PsmMetricClass *) plug[i]->desc->klass)->destroy (inst[i]);
    if (sec[i])
      psm_section_free (sec[i]);
  }
  g_free (inst);
  g_free (sec);
  g_free (plug);
  g_strfreev (hyp);
  for (int r = 0; r < n_ref; r++)
    g_strfreev (ref[r]);
  g_free (ref);
  g_strfreev (src);
  config_destroy (&cfg);
  return ok;
}
