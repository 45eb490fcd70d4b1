/* psm-vocab.c — word vocabularies (psm-vocab.h). */
#include "config.h"
#include <string.h>
#include "base/base-internal.h"
#include "psm/psm-vocab.h"

struct PsmVocab {
  GPtrArray *words;     /* id -> word (owned) */
  GHashTable *index;    /* word -> id + 1 */
  GArray *counts;       /* gint64 */
};

struct PsmWordCounts {
  GHashTable *n;        /* word (in chunk) -> gint64 * (in chunk) */
  GStringChunk *chunk;
};

PsmVocab *
psm_vocab_new (void)
{
  PsmVocab *v = g_new0 (PsmVocab, 1);
  v->words = g_ptr_array_new_with_free_func (g_free);
  v->index = g_hash_table_new (g_str_hash, g_str_equal);
  v->counts = g_array_new (FALSE, FALSE, sizeof (gint64));
  return v;
}

void
psm_vocab_free (PsmVocab *v)
{
  if (!v)
    return;
  g_hash_table_destroy (v->index);
  g_ptr_array_unref (v->words);
  g_array_unref (v->counts);
  g_free (v);
}

int psm_vocab_size (const PsmVocab *v) { return (int) v->words->len; }

static int32_t
add_counted (PsmVocab *v, const char *w, gint64 n)
{
  char *own = g_strdup (w);
  g_ptr_array_add (v->words, own);
  g_array_append_val (v->counts, n);
  int32_t id = (int32_t) v->words->len - 1;
  g_hash_table_insert (v->index, own, GINT_TO_POINTER (id + 1));
  return id;
}

int32_t
psm_vocab_id (const PsmVocab *v, const char *w)
{
  return GPOINTER_TO_INT (g_hash_table_lookup (v->index, w)) - 1;
}

int32_t
psm_vocab_add (PsmVocab *v, const char *w)
{
  int32_t id = psm_vocab_id (v, w);
  return id >= 0 ? id : add_counted (v, w, 0);
}

void
psm_vocab_truncate (PsmVocab *v, int n)
{
  for (int id = (int) v->words->len - 1; id >= MAX (n, 0); id--)
    g_hash_table_remove (v->index, v->words->pdata[id]);
  if ((guint) MAX (n, 0) < v->words->len) {
    g_ptr_array_set_size (v->words, MAX (n, 0));
    g_array_set_size (v->counts, MAX (n, 0));
  }
}

const char *
psm_vocab_word (const PsmVocab *v, int32_t id)
{
  return id >= 0 && (guint) id < v->words->len ? v->words->pdata[id] : NULL;
}

gint64
psm_vocab_count (const PsmVocab *v, int32_t id)
{
  return id >= 0 && (guint) id < v->counts->len ? g_array_index (v->counts, gint64, id) : 0;
}

PsmWordCounts *
psm_word_counts_new (void)
{
  PsmWordCounts *c = g_new0 (PsmWordCounts, 1);
  c->n = g_hash_table_new (g_str_hash, g_str_equal);
  c->chunk = g_string_chunk_new (1 << 16);
  return c;
}

void
psm_word_counts_free (PsmWordCounts *c)
{
  if (!c)
    return;
  g_hash_table_destroy (c->n);
  g_string_chunk_free (c->chunk);
  g_free (c);
}

void
psm_word_counts_add (PsmWordCounts *c, const char *w, gint64 n)
{
  gint64 *p = g_hash_table_lookup (c->n, w);
  if (!p) {
    gint64 zero = 0;
    p = (gint64 *) (void *) g_string_chunk_insert_len (c->chunk, (const char *) &zero, sizeof zero);
    g_hash_table_insert (c->n, g_string_chunk_insert (c->chunk, w), p);
  }
  gint64 now;
  memcpy (&now, p, sizeof now);   /* the chunk does not align it */
  now += n;
  memcpy (p, &now, sizeof now);
}

gint64
psm_word_counts_get (const PsmWordCounts *c, const char *w)
{
  const gint64 *p = g_hash_table_lookup (c->n, w);
  gint64 n = 0;
  if (p)
    memcpy (&n, p, sizeof n);
  return n;
}

int psm_word_counts_size (const PsmWordCounts *c) { return (int) g_hash_table_size (c->n); }

typedef struct {
  const char *w;
  gint64 n;
} WordCount;

static int
by_count (const void *a, const void *b)
{
  const WordCount *x = a, *y = b;
  return x->n != y->n ? (x->n > y->n ? -1 : 1) : strcmp (x->w, y->w);
}

int
psm_vocab_add_by_count (PsmVocab *v, const PsmWordCounts *c, int max)
{
  guint n = g_hash_table_size (c->n), k = 0;
  WordCount *wc = g_new (WordCount, MAX (n, 1));
  GHashTableIter it;
  gpointer key, val;
  g_hash_table_iter_init (&it, c->n);
  while (g_hash_table_iter_next (&it, &key, &val))
    if (psm_vocab_id (v, key) < 0) {
      wc[k].w = key;
      memcpy (&wc[k].n, val, sizeof (gint64));
      k++;
    }
  qsort (wc, k, sizeof *wc, by_count);
  int added = 0;
  for (guint i = 0; i < k && (max <= 0 || psm_vocab_size (v) < max); i++, added++)
    add_counted (v, wc[i].w, wc[i].n);
  g_free (wc);
  return added;
}

gboolean
psm_vocab_save (const PsmVocab *v, int n, const char *path, GError **error)
{
  n = n < 0 ? psm_vocab_size (v) : MIN (n, psm_vocab_size (v));
  GString *s = g_string_new (NULL);
  for (int i = 0; i < n; i++)
    g_string_append_printf (s, "%s\t%" G_GINT64_FORMAT "\n", (const char *) v->words->pdata[i],
                            g_array_index (v->counts, gint64, i));
  gboolean ok = g_file_set_contents (path, s->str, (gssize) s->len, error);
  g_string_free (s, TRUE);
  return ok;
}

gboolean
psm_vocab_load (PsmVocab *v, const char *path, const char *const *first, GError **error)
{
  char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, error))
    return FALSE;
  char **lines = g_strsplit (text, "\n", -1);
  g_free (text);
  guint before = v->words->len;
  int n_first = 0;
  while (first && first[n_first])
    n_first++;
  gboolean ok = TRUE;
  int line = 0, n = 0;
  for (char **l = lines; *l && ok; l++) {
    line++;
    if (!**l)
      continue;   /* blank lines (the final newline's) */
    char *tab = strchr (*l, '\t'), *end = NULL;
    if (tab)
      *tab = '\0';
    gint64 count = tab ? g_ascii_strtoll (tab + 1, &end, 10) : 0;
    const char *why = NULL;
    if (!**l)
      why = "an empty word";   /* a line starting with a tab */
    else if (strpbrk (*l, " \r"))
      why = "a space in the word";
    else if (tab && (end == tab + 1 || *end || count < 0))
      why = "the count after the tab is not a number >= 0";
    else if (psm_vocab_id (v, *l) >= 0)
      why = (guint) psm_vocab_id (v, *l) >= before ? "a word listed twice" : "a word the vocabulary already holds";
    else if (n < n_first && strcmp (*l, first[n]) != 0)
      why = "not the special word expected there";
    if (why) {
      GString *want = g_string_new (NULL);
      for (int i = 0; i < n_first; i++)
        g_string_append_printf (want, "%s%s", i ? " " : "", first[i]);
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "%s:%d: bad vocabulary entry '%s': %s (expected one word a line, each once, optionally a tab "
                   "and its count%s%s)", path, line, *l, why, n_first ? ", starting with " : "", want->str);
      g_string_free (want, TRUE);
      ok = FALSE;
      break;
    }
    add_counted (v, *l, count);
    n++;
  }
  g_strfreev (lines);
  if (ok && n < MAX (n_first, 1)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: %s", path,
                 n ? "shorter than its special words" : "an empty vocabulary");
    ok = FALSE;
  }
  if (!ok) {
    /* leave v as it was */
    for (guint i = before; i < v->words->len; i++)
      g_hash_table_remove (v->index, v->words->pdata[i]);
    g_ptr_array_set_size (v->words, before);
    g_array_set_size (v->counts, before);
  }
  return ok;
}
