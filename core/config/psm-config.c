/* psm-config.c — strict validation of pipeline sections against declared
 * parameter tables, accessors with defaults, and --set overrides. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "config/config-internal.h"

const char *
psm_param_type_name (PsmParamType t)
{
  switch (t) {
  case PSM_PARAM_INT: return "int";
  case PSM_PARAM_FLOAT: return "float";
  case PSM_PARAM_BOOL: return "bool";
  case PSM_PARAM_STRING: return "string";
  case PSM_PARAM_CHOICE: return "choice";
  case PSM_PARAM_FILE: return "file";
  }
  return "?";
}

PsmSection *
psm_section_new (const PsmParamSpec *spec, config_setting_t *setting, const char *path, const char *file)
{
  PsmSection *s = g_new0 (PsmSection, 1);
  s->spec = spec;
  s->setting = setting;
  s->path = g_strdup (path);
  s->file = g_strdup (file);
  return s;
}

void
psm_section_free (PsmSection *s)
{
  if (!s)
    return;
  g_free (s->path);
  g_free (s->file);
  g_free (s->where);
  g_free (s);
}

PsmSection *
psm_section_from_text (const char *text, const char *file, const char *path, const PsmParamSpec *spec,
                       GError **error)
{
  config_t *cfg = g_new0 (config_t, 1);
  config_init (cfg);
  /* "s = {" on the text's first line: its line N is the parse's line N */
  char *full = g_strdup_printf ("s = {%s\n};\n", text);
  gboolean parsed = config_read_string (cfg, full) == CONFIG_TRUE;
  g_free (full);
  if (!parsed) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s:%d: %s: %s", file,
                 config_error_line (cfg), path, config_error_text (cfg));
    config_destroy (cfg);
    g_free (cfg);
    return NULL;
  }
  config_setting_t *grp = config_lookup (cfg, "s");
  GPtrArray *errs = g_ptr_array_new_with_free_func (g_free);
  const char *extra[] = { "plugin", NULL };
  psm_validate_group (file, grp, path, spec, extra, errs);
  if (errs->len) {
    g_ptr_array_add (errs, NULL);
    char *msg = g_strjoinv ("\n", (char **) errs->pdata);
    g_set_error_literal (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, msg);
    g_free (msg);
    g_ptr_array_unref (errs);
    config_destroy (cfg);
    g_free (cfg);
    return NULL;
  }
  g_ptr_array_unref (errs);
  PsmSection *sec = psm_section_new (spec, grp, path, file);
  sec->owned = cfg;
  return sec;
}

void
psm_section_destroy (PsmSection *s)
{
  if (!s)
    return;
  config_t *cfg = s->owned;
  psm_section_free (s);
  if (cfg) {
    config_destroy (cfg);
    g_free (cfg);
  }
}

static const PsmParamSpec *
find_spec (const PsmParamSpec *spec, const char *name)
{
  for (const PsmParamSpec *p = spec; p && p->name; p++)
    if (strcmp (p->name, name) == 0)
      return p;
  return NULL;
}

char *
psm_setting_where (const char *file, config_setting_t *s, const char *path)
{
  int line = s ? (int) config_setting_source_line (s) : 0;
  const char *f = s ? config_setting_source_file (s) : NULL;
  if (line <= 0)
    return g_strdup_printf (s ? "--set %s" : "%s: %s", s ? path : file, path);
  config_setting_t *root = s;
  while (config_setting_parent (root))
    root = config_setting_parent (root);
  if (!f)   /* read from psm's expanded text: the line's own file and line */
    psm_line_map_where (config_setting_get_hook (root), line, &f, &line);
  return g_strdup_printf ("%s:%d: %s", f ? f : file, line, path);
}

static config_setting_t *
member (const PsmSection *s, const char *name)
{
  return s->setting ? config_setting_get_member (s->setting, name) : NULL;
}

static const PsmParamSpec *
spec_or_die (const PsmSection *s, const char *name)
{
  const PsmParamSpec *p = find_spec (s->spec, name);
  if (!p)
    g_error ("psm: component of '%s' reads undeclared parameter '%s'", s->path, name);
  return p;
}

gint64
psm_section_int (const PsmSection *s, const char *name)
{
  const PsmParamSpec *p = spec_or_die (s, name);
  config_setting_t *m = member (s, name);
  if (m)
    return config_setting_type (m) == CONFIG_TYPE_INT64 ? config_setting_get_int64 (m)
                                                        : config_setting_get_int (m);
  return p->def ? g_ascii_strtoll (p->def, NULL, 10) : 0;
}

double
psm_section_float (const PsmSection *s, const char *name)
{
  const PsmParamSpec *p = spec_or_die (s, name);
  config_setting_t *m = member (s, name);
  if (m) {
    switch (config_setting_type (m)) {
    case CONFIG_TYPE_INT: return config_setting_get_int (m);
    case CONFIG_TYPE_INT64: return (double) config_setting_get_int64 (m);
    default: return config_setting_get_float (m);
    }
  }
  return p->def ? g_ascii_strtod (p->def, NULL) : 0.0;
}

gboolean
psm_section_bool (const PsmSection *s, const char *name)
{
  const PsmParamSpec *p = spec_or_die (s, name);
  config_setting_t *m = member (s, name);
  if (m)
    return config_setting_get_bool (m);
  return p->def && strcmp (p->def, "true") == 0;
}

const char *
psm_section_string (const PsmSection *s, const char *name)
{
  const PsmParamSpec *p = spec_or_die (s, name);
  config_setting_t *m = member (s, name);
  if (m)
    return config_setting_get_string (m);
  return p->def;
}

const char *
psm_section_where (const PsmSection *s, const char *name)
{
  PsmSection *ms = (PsmSection *) s;
  g_free (ms->where);
  char *path = g_strdup_printf ("%s.%s", s->path, name);
  config_setting_t *m = member (s, name);
  ms->where = m ? psm_setting_where (s->file, m, path)
                : psm_setting_where (s->file, s->setting, path);
  g_free (path);
  return ms->where;
}

const char *psm_section_path (const PsmSection *s) { return s->path; }
const PsmParamSpec *psm_section_spec (const PsmSection *s) { return s->spec; }

static gboolean
in_list (const char *const *list, const char *name)
{
  for (; list && *list; list++)
    if (strcmp (*list, name) == 0)
      return TRUE;
  return FALSE;
}

static gboolean
choice_ok (const char *choices, const char *v)
{
  char **c = g_strsplit (choices, "|", -1);
  gboolean ok = g_strv_contains ((const char *const *) c, v);
  g_strfreev (c);
  return ok;
}

char *
psm_param_range (const PsmParamSpec *p)
{
  if ((p->type == PSM_PARAM_INT || p->type == PSM_PARAM_FLOAT) && p->min <= p->max)
    return g_strdup_printf ("[%.10g, %.10g]", p->min, p->max);
  if (p->type == PSM_PARAM_CHOICE && p->choices)
    return g_strdup (p->choices);
  return g_strdup ("");
}

static void
add_error (GPtrArray *errors, const char *file, config_setting_t *s, const char *path,
           const char *fmt, ...) G_GNUC_PRINTF (5, 6);

static void
add_error (GPtrArray *errors, const char *file, config_setting_t *s, const char *path,
           const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  char *where = psm_setting_where (file, s, path);
  g_ptr_array_add (errors, g_strdup_printf ("%s: %s", where, msg));
  g_free (where);
  g_free (msg);
}

static void
check_value (const char *file, config_setting_t *m, const char *path, const PsmParamSpec *p,
             GPtrArray *errors)
{
  int t = config_setting_type (m);
  gboolean is_int = t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64;
  switch (p->type) {
  case PSM_PARAM_INT:
  case PSM_PARAM_FLOAT: {
    if (!(is_int || (p->type == PSM_PARAM_FLOAT && t == CONFIG_TYPE_FLOAT))) {
      add_error (errors, file, m, path, "wrong type (expected %s)",
                 p->type == PSM_PARAM_INT ? "an integer" : "a number");
      return;
    }
    double v = t == CONFIG_TYPE_INT ? config_setting_get_int (m)
             : t == CONFIG_TYPE_INT64 ? (double) config_setting_get_int64 (m)
                                      : config_setting_get_float (m);
    if (!isfinite (v)) {
      add_error (errors, file, m, path, "value is not finite");
    } else if (p->min <= p->max && (v < p->min || v > p->max)) {
      char *r = psm_param_range (p);
      add_error (errors, file, m, path, "value %g out of range (expected %s)", v, r);
      g_free (r);
    }
    return;
  }
  case PSM_PARAM_BOOL:
    if (t != CONFIG_TYPE_BOOL)
      add_error (errors, file, m, path, "wrong type (expected true or false)");
    return;
  case PSM_PARAM_STRING:
  case PSM_PARAM_CHOICE:
  case PSM_PARAM_FILE: {
    if (t != CONFIG_TYPE_STRING) {
      add_error (errors, file, m, path, "wrong type (expected a string%s%s)",
                 p->type == PSM_PARAM_CHOICE ? ": one of " : "",
                 p->type == PSM_PARAM_CHOICE ? p->choices : "");
      return;
    }
    const char *v = config_setting_get_string (m);
    if (p->type == PSM_PARAM_CHOICE && !choice_ok (p->choices, v))
      add_error (errors, file, m, path, "unknown value \"%s\" (expected one of %s)", v, p->choices);
    if (p->type == PSM_PARAM_FILE && !g_file_test (v, G_FILE_TEST_IS_REGULAR))
      add_error (errors, file, m, path, "file \"%s\" does not exist or is not a regular file", v);
    return;
  }
  }
}

void
psm_validate_group (const char *file, config_setting_t *group, const char *path,
                    const PsmParamSpec *spec, const char *const *extra, GPtrArray *errors)
{
  if (group && config_setting_type (group) != CONFIG_TYPE_GROUP) {
    add_error (errors, file, group, path, "wrong type (expected a group { ... })");
    return;
  }
  if (group) {
    int n = config_setting_length (group);
    for (int i = 0; i < n; i++) {
      config_setting_t *m = config_setting_get_elem (group, i);
      const char *name = config_setting_name (m);
      char *kp = *path ? g_strdup_printf ("%s.%s", path, name) : g_strdup (name);
      const PsmParamSpec *p = find_spec (spec, name);
      if (p) {
        check_value (file, m, kp, p, errors);
      } else if (!in_list (extra, name)) {
        GString *known = g_string_new (NULL);
        for (const PsmParamSpec *q = spec; q && q->name; q++)
          g_string_append_printf (known, "%s%s", known->len ? ", " : "", q->name);
        for (const char *const *e = extra; e && *e; e++)
          g_string_append_printf (known, "%s%s", known->len ? ", " : "", *e);
        add_error (errors, file, m, kp, "unknown key (known keys: %s)",
                   known->len ? known->str : "none");
        g_string_free (known, TRUE);
      }
      g_free (kp);
    }
  }
  for (const PsmParamSpec *p = spec; p && p->name; p++)
    if (!p->def && !(group && config_setting_get_member (group, p->name))) {
      char *kp = g_strdup_printf ("%s.%s", path, p->name);
      add_error (errors, file, group, kp, "missing required key (%s: %s)",
                 psm_param_type_name (p->type), p->doc);
      g_free (kp);
    }
}

/* --- --set key.path=value --- */

static config_setting_t *
add_literal (config_setting_t *parent, const char *name, const char *v)
{
  config_setting_t *s;
  char *end = NULL;
  size_t len = strlen (v);
  if (strcmp (v, "true") == 0 || strcmp (v, "false") == 0) {
    s = config_setting_add (parent, name, CONFIG_TYPE_BOOL);
    if (s)
      config_setting_set_bool (s, v[0] == 't');
    return s;
  }
  errno = 0;
  gint64 iv = g_ascii_strtoll (v, &end, 10);
  if (len && *end == '\0' && errno == 0) {
    gboolean big = iv > G_MAXINT32 || iv < G_MININT32;
    s = config_setting_add (parent, name, big ? CONFIG_TYPE_INT64 : CONFIG_TYPE_INT);
    if (s && big)
      config_setting_set_int64 (s, iv);
    else if (s)
      config_setting_set_int (s, (int) iv);
    return s;
  }
  /* Only plain decimal numbers are floats ("nan", "inf" stay strings). */
  gboolean numeric = len > 0 && strspn (v, "0123456789+-.eE") == len && strpbrk (v, "0123456789");
  double dv = numeric ? g_ascii_strtod (v, &end) : 0.0;
  if (numeric && *end == '\0') {
    s = config_setting_add (parent, name, CONFIG_TYPE_FLOAT);
    if (s)
      config_setting_set_float (s, dv);
    return s;
  }
  char *str = (len >= 2 && v[0] == '"' && v[len - 1] == '"') ? g_strndup (v + 1, len - 2) : g_strdup (v);
  s = config_setting_add (parent, name, CONFIG_TYPE_STRING);
  if (s)
    config_setting_set_string (s, str);
  g_free (str);
  return s;
}

gboolean
psm_config_apply_set (config_t *cfg, const char *assignment, GError **error)
{
  const char *eq = strchr (assignment, '=');
  if (!eq || eq == assignment) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "--set %s: expected key.path=value", assignment);
    return FALSE;
  }
  char *key = g_strndup (assignment, eq - assignment);
  const char *value = eq + 1;
  char **parts = g_strsplit (key, ".", -1);
  gboolean ok = FALSE;
  config_setting_t *cur = config_root_setting (cfg);
  int n = (int) g_strv_length (parts);
  for (int i = 0; i < n; i++) {
    const char *name = parts[i];
    /* a libconfig name: a letter, then letters, digits, '_' and '-'.
     * Anything else must not reach libconfig, whose lookups read ':' and
     * '/' as path separators ("metrics:x" found the list metrics, which was
     * then replaced by a setting libconfig refused to make: a crash found
     * by the pipeline fuzzer). */
    if (!*name || !g_ascii_isalpha (name[0]) || strspn (name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                            "0123456789_-") != strlen (name)) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "--set %s: malformed key \"%s\" (expected a letter, then letters, digits, '_' or '-')", key,
                   name);
      goto out;
    }
    config_setting_t *m = config_setting_get_member (cur, name);
    if (i < n - 1) {
      if (!m)
        m = config_setting_add (cur, name, CONFIG_TYPE_GROUP);
      if (!m || config_setting_type (m) != CONFIG_TYPE_GROUP) {
        g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                     "--set %s: \"%s\" is not a group", key, name);
        goto out;
      }
      cur = m;
      continue;
    }
    if (m && (config_setting_type (m) == CONFIG_TYPE_LIST || config_setting_type (m) == CONFIG_TYPE_ARRAY)) {
      /* A list of names: value is comma-separated. */
      int type = config_setting_type (m);
      config_setting_remove (cur, name);
      config_setting_t *l = config_setting_add (cur, name, type);
      char **items = g_strsplit (value, ",", -1);
      ok = l != NULL;
      for (char **it = items; ok && *it; it++)
        if (**it) {
          config_setting_t *e = config_setting_add (l, NULL, CONFIG_TYPE_STRING);
          ok = e && config_setting_set_string (e, *it);
        }
      g_strfreev (items);
      if (!ok)
        g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "--set %s: cannot set this list", key);
      goto out;
    }
    if (m && config_setting_type (m) == CONFIG_TYPE_GROUP) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "--set %s: \"%s\" is a group; set one of its keys", key, name);
      goto out;
    }
    if (m)
      config_setting_remove (cur, name);
    if (!add_literal (cur, name, value)) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "--set %s: cannot set this key", key);
      goto out;
    }
    ok = TRUE;
  }
out:
  g_strfreev (parts);
  g_free (key);
  return ok;
}
