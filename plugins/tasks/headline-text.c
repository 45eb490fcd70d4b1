/* headline-text — the headline task's text: Rush et al.'s Gigaword form
 * of tokens, entity anonymisation, a text's lead sentences
 * (headline-text.h). */
#include <string.h>
#include <psm/psm.h>
#include "headline-text.h"

/* Rush et al.'s form of one token, appended to s. */
static void
gigaword_token (GString *s, const char *w)
{
  static const char *const br[][2] = { { "(", "-lrb-" }, { ")", "-rrb-" }, { "[", "-lsb-" },
                                       { "]", "-rsb-" }, { "{", "-lcb-" }, { "}", "-rcb-" } };
  for (guint i = 0; i < G_N_ELEMENTS (br); i++)
    if (strcmp (w, br[i][0]) == 0) {
      g_string_append (s, br[i][1]);
      return;
    }
  for (const char *p = w; *p; p++)
    g_string_append_c (s, g_ascii_isdigit (*p) ? '#' : *p);
}

GPtrArray *
headline_tokens (const char *text, gboolean gigaword, gboolean entity, gboolean title)
{
  char **tok = g_strsplit_set (text, " \t\r\n\f\v", -1);
  GPtrArray *w = g_ptr_array_new_with_free_func (g_free);
  GString *s = g_string_new (NULL);
  for (char **p = tok; *p; p++) {
    if (!**p)
      continue;
    if (!gigaword) {
      g_ptr_array_add (w, g_strdup (*p));
      continue;
    }
    g_string_truncate (s, 0);
    char *bar = entity ? strrchr (*p, '|') : NULL;
    if (bar && bar != *p) {   /* style the word, keep the tag */
      *bar = '\0';
      gigaword_token (s, *p);
      g_string_append_c (s, '|');
      g_string_append (s, bar + 1);
    } else {
      gigaword_token (s, *p);
    }
    g_ptr_array_add (w, g_strdup (s->str));
  }
  if (title && gigaword && w->len > 1 && strcmp (w->pdata[w->len - 1], ".") == 0)
    g_ptr_array_set_size (w, w->len - 1);
  g_string_free (s, TRUE);
  g_strfreev (tok);
  return w;
}

void
headline_anonymise (GPtrArray *src, GPtrArray *tgt)
{
  GHashTable *ids = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  GPtrArray *side[2] = { src, tgt };
  for (int k = 0; k < 2; k++)
    for (guint i = 0; i < side[k]->len; i++) {
      char *tok = side[k]->pdata[i], *bar = strrchr (tok, '|');
      if (!bar || bar == tok)
        continue;
      *bar = '\0';
      const char *tag = bar + 1;
      if (!*tag || strcmp (tag, "O") == 0)
        continue;   /* the word alone */
      gpointer v = g_hash_table_lookup (ids, tok);
      int id = v ? GPOINTER_TO_INT (v) : (int) g_hash_table_size (ids) + 1;
      if (!v)
        g_hash_table_insert (ids, g_strdup (tok), GINT_TO_POINTER (id));
      side[k]->pdata[i] = g_strdup_printf ("@entity%d", id);
      g_free (tok);
    }
  g_hash_table_destroy (ids);
}

char *
headline_join (GPtrArray *w)
{
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < w->len; i++)
    g_string_append_printf (s, "%s%s", i ? " " : "", (char *) w->pdata[i]);
  return g_string_free (s, FALSE);
}

gboolean
headline_ends_sentence (const char *w)
{
  return strcmp (w, ".") == 0 || strcmp (w, "!") == 0 || strcmp (w, "?") == 0;
}

char *
headline_lead (const char *text, int n)
{
  char **tok = g_strsplit_set (text, " \t\r\n", -1);
  GString *s = g_string_new (NULL);
  for (char **p = tok; *p; p++) {
    if (!**p)
      continue;
    g_string_append_printf (s, "%s%s", s->len ? " " : "", *p);
    if (headline_ends_sentence (*p) && --n == 0)
      break;
  }
  g_strfreev (tok);
  return g_string_free (s, FALSE);
}
