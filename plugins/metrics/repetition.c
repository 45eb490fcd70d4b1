/* repetition — how much a summary repeats itself (See et al. 2017, Fig. 4):
 * for n = 1..4, the percentage of a summary's n-grams that already occurred
 * earlier in the same summary, summed over all summaries (duplicates over
 * n-grams), for the outputs (dupN) and, beside them, for the references
 * (ref_dupN). Tokens are the space-separated words as they are (the
 * reference's sentence breaks count as spaces); no stemming. */
#include <string.h>
#include <psm/psm.h>

#define MAX_N 4

typedef struct {
  long dup[2][MAX_N], total[2][MAX_N];   /* [output / reference][n - 1] */
} Repetition;

static void *rep_create (const PsmSection *cfg, GError **error) { return g_new0 (Repetition, 1); }
static void rep_destroy (void *self) { g_free (self); }

static void
rep_reset (void *self)
{
  memset (self, 0, sizeof (Repetition));
}

static void
count (Repetition *r, int which, const char *text)
{
  char **tok = g_strsplit_set (text ? text : "", " \t\r\n", -1);
  GPtrArray *w = g_ptr_array_new ();
  for (char **t = tok; *t; t++)
    if (**t)
      g_ptr_array_add (w, *t);
  GString *g = g_string_new (NULL);
  for (int n = 1; n <= MAX_N; n++) {
    GHashTable *seen = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
    for (int i = 0; i + n <= (int) w->len; i++) {
      g_string_truncate (g, 0);
      for (int j = 0; j < n; j++)
        g_string_append_printf (g, "%s%s", j ? " " : "", (const char *) w->pdata[i + j]);
      if (g_hash_table_contains (seen, g->str))
        r->dup[which][n - 1]++;
      else
        g_hash_table_add (seen, g_strdup (g->str));
      r->total[which][n - 1]++;
    }
    g_hash_table_destroy (seen);
  }
  g_string_free (g, TRUE);
  g_ptr_array_unref (w);
  g_strfreev (tok);
}

static void
rep_add_text (void *self, const char *hyp, const char *ref, const char *src)
{
  count (self, 0, hyp);
  count (self, 1, ref);
}

static void
rep_report (void *self, PsmMetricReport *out)
{
  static const char *const names[2][MAX_N] = { { "dup1", "dup2", "dup3", "dup4" },
                                                { "ref_dup1", "ref_dup2", "ref_dup3", "ref_dup4" } };
  Repetition *r = self;
  out->n = 0;
  for (int k = 0; k < 2; k++)
    for (int n = 0; n < MAX_N; n++) {
      out->names[out->n] = names[k][n];
      out->values[out->n++] = r->total[k][n] ? 100.0 * (double) r->dup[k][n] / (double) r->total[k][n] : 0.0;
    }
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = rep_create,
  .destroy = rep_destroy,
  .reset = rep_reset,
  .report = rep_report,
  .higher_is_better = FALSE,
  .add_text = rep_add_text,
  .multi_reference = FALSE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "repetition",
            "percentage of duplicate 1- to 4-grams within each summary, outputs and references (See et al. Fig. 4)",
            NULL, NULL, &klass)
