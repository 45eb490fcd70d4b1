/* bleu — corpus BLEU-4 (Papineni et al. 2002) as Moses' multi-bleu.perl
 * computes it on tokenised text:
 *
 * Tokens: the hypothesis and each reference split on runs of white space
 *   (Perl's split ' '), as they are; with `lowercase` (the script's -lc)
 *   ASCII letters are lower-cased first (Perl's lc on byte strings).
 * References: the reference text's lines are alternative references of the
 *   one hypothesis (psm-run score: further reference files, or --sep);
 *   blank lines are dropped unless every line is blank (one empty
 *   reference, as the script sees an empty line of its reference file).
 * Per sentence, for n = 1..4: each hypothesis n-gram counts as correct up
 *   to the largest number of times one reference holds it (clipped
 *   counts); totals are the hypothesis n-grams. The reference length is
 *   that of the reference closest in length to the hypothesis, the shorter
 *   one on a tie.
 * Corpus: p_n = correct_n / total_n summed over sentences (0 when total_n
 *   is 0); BP = exp(1 - r / c) when the hypothesis length c is below the
 *   reference length r, else 1; BLEU = BP exp(sum_n log p_n / 4), which is
 *   0 as soon as one p_n is 0 (the script's log of 0 is -9999999999). No
 *   smoothing. A corpus with no reference words scores 0 (the script
 *   prints zeros), and so does an empty hypothesis corpus (where the script
 *   divides by zero).
 * Reported in percent as the script prints them: BLEU, p1..p4; then BP,
 *   ratio = c / r, hyp_len = c and ref_len = r. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>

#define MAX_N 4

static const PsmParamSpec params[] = {
  { "lowercase", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "lower-case ASCII letters first (multi-bleu.perl -lc)",
    NULL },
  PSM_PARAM_END
};

typedef struct {
  gboolean lowercase;
  gint64 correct[MAX_N], total[MAX_N], hyp_len, ref_len;
} Bleu;

static void *
bleu_create (const PsmSection *cfg, GError **error)
{
  Bleu *b = g_new0 (Bleu, 1);
  b->lowercase = psm_section_bool (cfg, "lowercase");
  return b;
}

static void bleu_destroy (void *self) { g_free (self); }

static void
bleu_reset (void *self)
{
  Bleu *b = self;
  gboolean lc = b->lowercase;
  memset (b, 0, sizeof *b);
  b->lowercase = lc;
}

/* The white-space separated tokens of text (NULL-ended; free with
 * g_strfreev), *n their number. */
static char **
tokens (const Bleu *b, const char *text, int *n)
{
  char *t = b->lowercase ? g_ascii_strdown (text, -1) : g_strdup (text);
  char **all = g_strsplit_set (t, " \t\n\r\f\v", -1);
  g_free (t);
  int k = 0;
  for (char **p = all; *p; p++) {
    if (**p)
      all[k++] = *p;
    else
      g_free (*p);
  }
  all[k] = NULL;
  *n = k;
  return all;
}

/* n-gram -> count for n = 1..MAX_N, keys "n w1 w2 ..." as the script's. */
static GHashTable *
ngrams (char **w, int len)
{
  GHashTable *h = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  GString *g = g_string_new (NULL);
  for (int n = 1; n <= MAX_N; n++)
    for (int i = 0; i + n <= len; i++) {
      g_string_printf (g, "%d", n);
      for (int j = 0; j < n; j++)
        g_string_append_printf (g, " %s", w[i + j]);
      gpointer old = g_hash_table_lookup (h, g->str);
      if (old)
        g_hash_table_insert (h, g_strdup (g->str), GSIZE_TO_POINTER (GPOINTER_TO_SIZE (old) + 1));
      else
        g_hash_table_insert (h, g_strdup (g->str), GSIZE_TO_POINTER (1));
    }
  g_string_free (g, TRUE);
  return h;
}

static void
bleu_add_text (void *self, const char *hyp, const char *ref, const char *src)
{
  Bleu *b = self;
  int hl;
  char **hw = tokens (b, hyp ? hyp : "", &hl);
  GHashTable *ht = ngrams (hw, hl);
  /* the most of each n-gram any one reference holds; the closest length */
  GHashTable *best = g_hash_table_new (g_str_hash, g_str_equal);
  GPtrArray *tables = g_ptr_array_new_with_free_func ((GDestroyNotify) g_hash_table_unref);
  /* the reference's non-blank lines, or one empty reference */
  char **lines = g_strsplit (ref ? ref : "", "\n", -1);
  GPtrArray *refs = g_ptr_array_new ();
  for (char **l = lines; *l; l++)
    if ((*l)[strspn (*l, " \t\r\f\v")])
      g_ptr_array_add (refs, *l);
  if (refs->len == 0)
    g_ptr_array_add (refs, "");
  int closest_diff = 9999, closest_len = 9999;
  for (guint i = 0; i < refs->len; i++) {
    int rl;
    char **rw = tokens (b, refs->pdata[i], &rl);
    int diff = abs (hl - rl);
    if (diff < closest_diff) {
      closest_diff = diff;
      closest_len = rl;
    } else if (diff == closest_diff && rl < closest_len) {
      closest_len = rl;
    }
    GHashTable *rt = ngrams (rw, rl);
    g_ptr_array_add (tables, rt);
    GHashTableIter it;
    gpointer k, v;
    g_hash_table_iter_init (&it, rt);
    while (g_hash_table_iter_next (&it, &k, &v))
      if (GPOINTER_TO_SIZE (g_hash_table_lookup (best, k)) < GPOINTER_TO_SIZE (v))
        g_hash_table_insert (best, k, v);
    g_strfreev (rw);
  }
  g_ptr_array_unref (refs);
  b->hyp_len += hl;
  b->ref_len += closest_len;
  GHashTableIter it;
  gpointer k, v;
  g_hash_table_iter_init (&it, ht);
  while (g_hash_table_iter_next (&it, &k, &v)) {
    int n = ((const char *) k)[0] - '0';
    gsize t = GPOINTER_TO_SIZE (v), r = GPOINTER_TO_SIZE (g_hash_table_lookup (best, k));
    b->total[n - 1] += (gint64) t;
    b->correct[n - 1] += (gint64) MIN (t, r);
  }
  g_hash_table_destroy (best);
  g_ptr_array_unref (tables);
  g_hash_table_destroy (ht);
  g_strfreev (lines);
  g_strfreev (hw);
}

static void
bleu_report (void *self, PsmMetricReport *out)
{
  static const char *const names[] = { "BLEU", "p1", "p2", "p3", "p4", "BP", "ratio", "hyp_len", "ref_len" };
  Bleu *b = self;
  double p[MAX_N], logsum = 0.0, bp = 1.0, score = 0.0;
  gboolean zero = FALSE;
  for (int n = 0; n < MAX_N; n++) {
    p[n] = b->total[n] ? (double) b->correct[n] / (double) b->total[n] : 0.0;
    zero = zero || p[n] == 0.0;
    logsum += p[n] > 0.0 ? log (p[n]) : 0.0;
  }
  if (b->ref_len > 0 && b->hyp_len > 0) {
    if (b->hyp_len < b->ref_len)
      bp = exp (1.0 - (double) b->ref_len / (double) b->hyp_len);
    score = zero ? 0.0 : bp * exp (logsum / MAX_N);
  } else {
    bp = b->ref_len > 0 ? 0.0 : bp;
  }
  double v[] = { 100.0 * score, 100.0 * p[0], 100.0 * p[1], 100.0 * p[2], 100.0 * p[3], bp,
                 b->ref_len ? (double) b->hyp_len / (double) b->ref_len : 0.0, (double) b->hyp_len,
                 (double) b->ref_len };
  out->n = (int) G_N_ELEMENTS (names);
  for (int i = 0; i < out->n; i++) {
    out->names[i] = names[i];
    out->values[i] = v[i];
  }
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = bleu_create,
  .destroy = bleu_destroy,
  .reset = bleu_reset,
  .report = bleu_report,
  .higher_is_better = TRUE,
  .add_text = bleu_add_text,
  .multi_reference = TRUE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "bleu",
            "corpus BLEU-4 of tokenised text as Moses' multi-bleu.perl (clipped counts, closest reference length, "
            "several references as the reference's lines)", params, NULL, &klass)
