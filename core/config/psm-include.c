/* psm-include.c — a pipeline's @include directives, expanded by psm.
 *
 * psm-pipeline(5) says an @include path is relative to the file that
 * includes it. libconfig 1.5 resolves every @include, nested ones too,
 * against one include folder, so a pipeline in a subfolder that includes a
 * block which includes another (../blocks/a.cfg -> b.cfg) read the wrong
 * file (issue 58). psm therefore expands the directives itself, with
 * libconfig's syntax (a line of blanks, @include, blanks and a quoted
 * path), into one text that libconfig reads from memory, and keeps for
 * every line of that text the file and line it came from, so that every
 * message still names FILE:LINE (psm_setting_where, the parse errors). */
#include "config.h"
#include <string.h>
#include "config/config-internal.h"

#define MAX_INCLUDE_DEPTH 10   /* as libconfig's own */

typedef struct {
  int file;   /* index into files */
  int line;
} LineAt;

struct PsmLineMap {
  GPtrArray *files;   /* char * */
  GArray *at;         /* LineAt of the expanded text's line k + 1 */
};

/* The quoted path of an @include line, or NULL. */
static char *
include_path (const char *line)
{
  const char *p = line + strspn (line, " \t");
  if (!g_str_has_prefix (p, "@include"))
    return NULL;
  p += 8;
  size_t b = strspn (p, " \t");
  if (b == 0 || p[b] != '"')
    return NULL;
  p += b + 1;
  const char *q = strchr (p, '"');
  return q ? g_strndup (p, q - p) : NULL;
}

static gboolean
expand (PsmLineMap *m, const char *path, const char *from, int from_line, int depth, GString *out, GError **error)
{
  if (depth > MAX_INCLUDE_DEPTH) {   /* (a file that includes itself ends here too) */
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s:%d: @include nested more than %d deep",
                 from, from_line, MAX_INCLUDE_DEPTH);
    return FALSE;
  }
  char *text = NULL;
  GError *e = NULL;
  if (!g_file_get_contents (path, &text, NULL, &e)) {
    if (from)
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s:%d: parse error: cannot read @include "
                   "file %s: %s", from, from_line, path, e->message);
    else
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s: cannot read pipeline: %s", path, e->message);
    g_error_free (e);
    return FALSE;
  }
  g_ptr_array_add (m->files, g_strdup (path));
  int fi = (int) m->files->len - 1;
  char *dir = g_path_get_dirname (path);
  gboolean ok = TRUE;
  char **lines = g_strsplit (text, "\n", -1);
  for (int i = 0; ok && lines[i]; i++) {
    if (!lines[i + 1] && !*lines[i])
      break;   /* after the last newline */
    char *inc = include_path (lines[i]);
    if (inc) {
      char *full = g_path_is_absolute (inc) ? g_strdup (inc) : g_build_filename (dir, inc, NULL);
      ok = expand (m, full, path, i + 1, depth + 1, out, error);
      g_free (full);
      g_free (inc);
      continue;
    }
    g_string_append (out, lines[i]);
    g_string_append_c (out, '\n');
    LineAt a = { fi, i + 1 };
    g_array_append_val (m->at, a);
  }
  g_strfreev (lines);
  g_free (dir);
  g_free (text);
  return ok;
}

char *
psm_config_expand (const char *file, PsmLineMap **map, GError **error)
{
  PsmLineMap *m = g_new0 (PsmLineMap, 1);
  m->files = g_ptr_array_new_with_free_func (g_free);
  m->at = g_array_new (FALSE, FALSE, sizeof (LineAt));
  GString *out = g_string_new (NULL);
  if (!expand (m, file, NULL, 0, 0, out, error)) {
    psm_line_map_free (m);
    g_string_free (out, TRUE);
    *map = NULL;
    return NULL;
  }
  *map = m;
  return g_string_free (out, FALSE);
}

gboolean
psm_line_map_where (const PsmLineMap *m, int line, const char **file, int *at)
{
  if (!m || line < 1 || (guint) line > m->at->len)
    return FALSE;
  LineAt a = g_array_index (m->at, LineAt, line - 1);
  *file = m->files->pdata[a.file];
  *at = a.line;
  return TRUE;
}

void
psm_line_map_free (PsmLineMap *m)
{
  if (!m)
    return;
  g_ptr_array_unref (m->files);
  g_array_unref (m->at);
  g_free (m);
}
