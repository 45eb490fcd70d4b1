/* novel_ngrams — how abstractive summaries are (See et al. 2017, Fig. 6):
 * for n = 1..4, the percentage of a summary's n-grams that do not occur in
 * its article, summed over all summaries (novel over n-grams); and the
 * percentage of its sentences that are not copied whole, i.e. whose words
 * do not occur as one contiguous run of the article. For the outputs (novelN,
 * novel_sent) and the references (ref_novelN, ref_novel_sent). Tokens are the
 * space-separated words; the article is the task's whole text (not cut at
 * max_src) where the task keeps it. A summary sentence ends at a line break
 * or after a `sentence_end` token. */
#include <string.h>
#include <psm/psm.h>

#define MAX_N 4

static const PsmParamSpec params[] = {
  { "sentence_end", PSM_PARAM_STRING, ".", PSM_NO_RANGE, "token that ends a summary sentence (\"\": lines only)",
    NULL },
  PSM_PARAM_END
};

typedef struct {
  char *sentence_end;
  long novel[2][MAX_N + 1], total[2][MAX_N + 1];   /* [output / reference][n - 1; MAX_N: sentences] */
} Novel;

static void *
nov_create (const PsmSection *cfg, GError **error)
{
  Novel *v = g_new0 (Novel, 1);
  v->sentence_end = g_strdup (cfg ? psm_section_string (cfg, "sentence_end") : ".");
  return v;
}

static void
nov_destroy (void *self)
{
  Novel *v = self;
  g_free (v->sentence_end);
  g_free (v);
}

static void
nov_reset (void *self)
{
  Novel *v = self;
  memset (v->novel, 0, sizeof v->novel);
  memset (v->total, 0, sizeof v->total);
}

/* words of text; sent_end[i]: a sentence ends after word i */
static GPtrArray *
words (const char *text, const char *end_tok, GArray *sent_end, char ***store)
{
  GPtrArray *w = g_ptr_array_new ();
  *store = g_strsplit (text ? text : "", "\n", -1);
  for (char **line = *store; *line; line++) {
    char **tok = g_strsplit_set (*line, " \t\r", -1);
    guint before = w->len;
    for (char **t = tok; *t; t++)
      if (**t) {
        g_ptr_array_add (w, g_strdup (*t));
        gboolean e = *end_tok && strcmp (*t, end_tok) == 0;
        if (sent_end)
          g_array_append_val (sent_end, e);
      }
    if (sent_end && w->len > before)
      g_array_index (sent_end, gboolean, w->len - 1) = TRUE;
    g_strfreev (tok);
  }
  g_ptr_array_set_free_func (w, g_free);
  return w;
}

static char *
gram (GPtrArray *w, int i, int n)
{
  GString *g = g_string_new (NULL);
  for (int j = 0; j < n; j++)
    g_string_append_printf (g, "%s%s", j ? " " : "", (const char *) w->pdata[i + j]);
  return g_string_free (g, FALSE);
}

/* Whether w[i, i + n) occurs contiguously in a. */
static gboolean
occurs (GPtrArray *a, GPtrArray *w, int i, int n)
{
  for (int s = 0; s + n <= (int) a->len; s++) {
    int k = 0;
    while (k < n && strcmp (a->pdata[s + k], w->pdata[i + k]) == 0)
      k++;
    if (k == n)
      return TRUE;
  }
  return FALSE;
}

static void
count (Novel *v, int which, const char *text, GPtrArray *art, GHashTable *const *art_grams)
{
  char **store;
  GArray *ends = g_array_new (FALSE, FALSE, sizeof (gboolean));
  GPtrArray *w = words (text, v->sentence_end, ends, &store);
  for (int n = 1; n <= MAX_N; n++)
    for (int i = 0; i + n <= (int) w->len; i++) {
      char *g = gram (w, i, n);
      v->novel[which][n - 1] += !g_hash_table_contains (art_grams[n - 1], g);
      v->total[which][n - 1]++;
      g_free (g);
    }
  for (int i = 0, start = 0; i < (int) w->len; i++)
    if (g_array_index (ends, gboolean, i)) {
      v->novel[which][MAX_N] += !occurs (art, w, start, i + 1 - start);
      v->total[which][MAX_N]++;
      start = i + 1;
    }
  g_ptr_array_unref (w);
  g_array_unref (ends);
  g_strfreev (store);
}

static void
nov_add_text (void *self, const char *hyp, const char *ref, const char *src)
{
  Novel *v = self;
  char **store;
  GPtrArray *art = words (src, "", NULL, &store);
  GHashTable *grams[MAX_N];
  for (int n = 1; n <= MAX_N; n++) {
    grams[n - 1] = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
    for (int i = 0; i + n <= (int) art->len; i++)
      g_hash_table_add (grams[n - 1], gram (art, i, n));
  }
  count (v, 0, hyp, art, grams);
  count (v, 1, ref, art, grams);
  for (int n = 0; n < MAX_N; n++)
    g_hash_table_destroy (grams[n]);
  g_ptr_array_unref (art);
  g_strfreev (store);
}

static void
nov_report (void *self, PsmMetricReport *out)
{
  static const char *const names[2][MAX_N + 1] = {
    { "novel1", "novel2", "novel3", "novel4", "novel_sent" },
    { "ref_novel1", "ref_novel2", "ref_novel3", "ref_novel4", "ref_novel_sent" } };
  Novel *v = self;
  out->n = 0;
  for (int k = 0; k < 2; k++)
    for (int n = 0; n <= MAX_N; n++) {
      out->names[out->n] = names[k][n];
      out->values[out->n++] = v->total[k][n] ? 100.0 * (double) v->novel[k][n] / (double) v->total[k][n] : 0.0;
    }
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = nov_create,
  .destroy = nov_destroy,
  .reset = nov_reset,
  .report = nov_report,
  .higher_is_better = TRUE,
  .add_text = nov_add_text,
  .multi_reference = FALSE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "novel_ngrams",
            "percentage of summary 1- to 4-grams and sentences not found in the article, outputs and references "
            "(See et al. Fig. 6)",
            params, NULL, &klass)
