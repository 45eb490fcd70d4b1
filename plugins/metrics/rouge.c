/* rouge — ROUGE-1, ROUGE-2 and summary-level ROUGE-L (Lin 2004) as the
 * official ROUGE-1.5.5 script computes them with `-n 2 -a -m` (and -l N or
 * -b N for the length limits), one reference per summary:
 *
 * Texts: each sentence is lower-cased (ASCII), "-" set apart, every byte
 *   outside [A-Za-z0-9-] made a space; tokens are the space-separated words
 *   that start with [a-z0-9] (a lone "-" is dropped). With stemming, tokens
 *   longer than 3 characters become what the script's MorphStem makes of
 *   them (rouge-stem.c): the base form from WordNet 2.0's exception lists
 *   when the token is in them (went -> go, children -> child), else the
 *   script's Porter stemmer. exceptions = false reproduces the script run
 *   with an empty exception database (what pyrouge's set-up instructions
 *   build), which reads about 0.3 ROUGE-1 lower on CNN/DailyMail.
 * ROUGE-N: recall = clipped n-gram hits / reference n-grams, precision =
 *   hits / summary n-grams, over the sentences joined.
 * ROUGE-L: for each reference sentence, the union of its positions on the
 *   longest common subsequence with each summary sentence (the script's
 *   back-trace: diagonal on a match, else up when not shorter), each hit
 *   counted only while both texts have that unigram left; recall = hits /
 *   reference tokens, precision = hits / summary tokens.
 * Per summary, R and P are rounded to 5 decimals and F = P R / ((1 - a) P +
 *   a R) (a = 0.5: F1). The report, in percent, is what the script prints
 *   (average = bootstrap): the mean of its 1,000 bootstrap resamples of the
 *   summaries — resample s drawn with Perl's drand48 seeded by s, over the
 *   summaries in the order of their evaluation IDs sorted as strings, the
 *   IDs being 1..N as pyrouge numbers them — or the plain mean over
 *   summaries (average = mean), which the bootstrap estimates to within a
 *   few hundredths of a point on hundreds of summaries.
 * Limits (the script's -l / -b): the first N words, or bytes, of the text,
 *   counted over the raw sentences; with bytes, ROUGE-L keeps every sentence
 *   shorter than the limit whole (the script's readText_LCS never adds up
 *   the bytes it took), reproduced here so that scores agree.
 * Sentences: the reference's are its lines; the summary's are its lines, and
 *   a sentence also ends after each `sentence_end` token (See et al.'s
 *   scoring splits decoded summaries after every "."). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>
#include "rouge-stem.h"

static const PsmParamSpec params[] = {
  { "stem", PSM_PARAM_BOOL, "true", PSM_NO_RANGE, "stem tokens longer than 3 (ROUGE-1.5.5 -m)", NULL },
  { "exceptions", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "with stem: WordNet 2.0 exception lookup before the Porter stemmer, as ROUGE-1.5.5 (false: empty database)",
    NULL },
  { "limit_words", PSM_PARAM_INT, "0", 0, 1000000, "score only the first N words (-l N; 0 = whole texts)", NULL },
  { "limit_bytes", PSM_PARAM_INT, "0", 0, 100000000, "score only the first N bytes (-b N, DUC: 75; 0 = whole)",
    NULL },
  { "average", PSM_PARAM_CHOICE, "bootstrap", PSM_NO_RANGE,
    "bootstrap: ROUGE-1.5.5's printed average (mean of 1000 resamples); mean: the exact mean", "bootstrap|mean" },
  { "sentence_end", PSM_PARAM_STRING, ".", PSM_NO_RANGE,
    "summary token that ends a sentence, for ROUGE-L (\"\": lines only)", NULL },
  PSM_PARAM_END
};

enum { R1, R2, RL, N_SCORES };

typedef struct {
  int limit_words, limit_bytes;
  char *sentence_end;
  RougeStemmer *stemmer;     /* NULL: no stemming */
  gboolean bootstrap;
  GArray *scores;            /* per summary: [N_SCORES][R, P, F] doubles */
} Rouge;

/* ---- texts ---- */

/* Fields of s split on white space as Perl's split(/\s+/) counts them: a
 * leading empty field, none at the end. */
static int
perl_fields (const char *s, const char ***starts)
{
  GPtrArray *f = g_ptr_array_new ();
  const char *p = s;
  if (g_ascii_isspace (*p))
    g_ptr_array_add (f, (gpointer) p);   /* the empty first field */
  while (*p) {
    while (*p && g_ascii_isspace (*p))
      p++;
    if (*p)
      g_ptr_array_add (f, (gpointer) p);
    while (*p && !g_ascii_isspace (*p))
      p++;
  }
  int n = (int) f->len;
  *starts = (const char **) g_ptr_array_free (f, FALSE);
  return n;
}

/* The first `words` fields of s (Perl's join(" ", @tokens[0..words-1])). */
static char *
first_fields (const char *s, int words)
{
  const char **st;
  int n = perl_fields (s, &st);
  GString *out = g_string_new (NULL);
  for (int i = 0; i < words; i++) {
    if (i)
      g_string_append_c (out, ' ');
    if (i < n) {
      const char *e = st[i];
      while (*e && !g_ascii_isspace (*e))
        e++;
      g_string_append_len (out, st[i], e - st[i]);
    }
  }
  g_free (st);
  return g_string_free (out, FALSE);
}

/* The sentences the script reads: lower-cased, non-empty lines, cut by the
 * limits. lcs: readText_LCS's sentences (kept apart; its byte limit), else
 * readText's (joined into one). */
static GPtrArray *
read_sentences (const Rouge *r, char *const *lines, gboolean lcs)
{
  GPtrArray *in = g_ptr_array_new (), *out = g_ptr_array_new_with_free_func (g_free);
  for (char *const *l = lines; *l; l++)
    if (**l)
      g_ptr_array_add (in, *l);
  if (!r->limit_words && !r->limit_bytes) {
    for (guint i = 0; i < in->len; i++)
      g_ptr_array_add (out, g_ascii_strdown (in->pdata[i], -1));
  } else if (r->limit_words) {
    int used = 0;
    for (guint i = 0; i < in->len; i++) {
      const char **st;
      int n = perl_fields (in->pdata[i], &st);
      g_free (st);
      if (used + n < r->limit_words) {
        g_ptr_array_add (out, g_ascii_strdown (in->pdata[i], -1));
        used += n;
      } else {
        char *cut = first_fields (in->pdata[i], r->limit_words - used);
        g_ptr_array_add (out, g_ascii_strdown (cut, -1));
        g_free (cut);
        break;
      }
    }
  } else {
    size_t used = 0;
    for (guint i = 0; i < in->len; i++) {
      size_t n = strlen (in->pdata[i]);
      if (used + n < (size_t) r->limit_bytes) {
        g_ptr_array_add (out, g_ascii_strdown (in->pdata[i], -1));
        if (!lcs)
          used += n;
      } else {
        char *cut = g_ascii_strdown (in->pdata[i], (gssize) (r->limit_bytes - used));
        g_ptr_array_add (out, cut);
        break;
      }
    }
  }
  g_ptr_array_unref (in);
  return out;
}

/* Tokens of one text (the script's clean-up, filter and stemmer). */
static void
tokenize (const Rouge *r, const char *text, GPtrArray *tokens)
{
  GString *clean = g_string_new (NULL), *w = g_string_new (NULL);
  for (const char *p = text; *p; p++) {
    char c = *p;
    if (c == '-')
      g_string_append (clean, " - ");
    else if (g_ascii_isalnum (c))
      g_string_append_c (clean, c);
    else
      g_string_append_c (clean, ' ');
  }
  char **parts = g_strsplit_set (clean->str, " ", -1);
  for (char **t = parts; *t; t++) {
    if (!**t || !(g_ascii_islower (**t) || g_ascii_isdigit (**t)))
      continue;
    g_string_assign (w, *t);
    if (r->stemmer && w->len > 3)
      rouge_stem (r->stemmer, w);
    g_ptr_array_add (tokens, g_strdup (w->str));
  }
  g_strfreev (parts);
  g_string_free (clean, TRUE);
  g_string_free (w, TRUE);
}

/* n-gram counts of tokens; returns the number of n-grams. */
static long
ngrams (GPtrArray *tok, int n, GHashTable *counts)
{
  long c = 0;
  GString *g = g_string_new (NULL);
  for (int i = 0; i + n <= (int) tok->len; i++) {
    g_string_assign (g, tok->pdata[i]);
    for (int j = 1; j < n; j++) {
      g_string_append_c (g, ' ');
      g_string_append (g, tok->pdata[i + j]);
    }
    gpointer v = g_hash_table_lookup (counts, g->str);
    g_hash_table_replace (counts, g_strdup (g->str), GINT_TO_POINTER (GPOINTER_TO_INT (v) + 1));
    c++;
  }
  g_string_free (g, TRUE);
  return c;
}

static long
hits (GHashTable *model, GHashTable *peer)
{
  long h = 0;
  GHashTableIter it;
  gpointer k, v;
  g_hash_table_iter_init (&it, model);
  while (g_hash_table_iter_next (&it, &k, &v)) {
    int p = GPOINTER_TO_INT (g_hash_table_lookup (peer, k));
    h += MIN (p, GPOINTER_TO_INT (v));
  }
  return h;
}

static GHashTable *
new_counts (void)
{
  return g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
}

/* Marks the model positions of the script's LCS back-trace of m against p. */
static void
lcs_mark (GPtrArray *m, GPtrArray *p, gboolean *hit)
{
  int M = (int) m->len, N = (int) p->len;
  if (M == 0 || N == 0)
    return;
  int *c = g_new0 (int, (size_t) (M + 1) * (N + 1));
  char *b = g_new0 (char, (size_t) (M + 1) * (N + 1));
#define AT(a, i, j) a[(size_t) (i) * (N + 1) + (j)]
  for (int i = 1; i <= M; i++)
    for (int j = 1; j <= N; j++) {
      if (strcmp (m->pdata[i - 1], p->pdata[j - 1]) == 0) {
        AT (c, i, j) = AT (c, i - 1, j - 1) + 1;
        AT (b, i, j) = 'd';
      } else if (AT (c, i - 1, j) >= AT (c, i, j - 1)) {
        AT (c, i, j) = AT (c, i - 1, j);
        AT (b, i, j) = 'u';
      } else {
        AT (c, i, j) = AT (c, i, j - 1);
        AT (b, i, j) = 'l';
      }
    }
  for (int i = M, j = N; i > 0 && j > 0;) {
    char d = AT (b, i, j);
    if (d == 'd') {
      i--;
      j--;
      hit[i] = TRUE;
    } else if (d == 'u') {
      i--;
    } else {
      j--;
    }
  }
#undef AT
  g_free (c);
  g_free (b);
}

static double
round5 (double x)
{
  char buf[32];
  g_snprintf (buf, sizeof buf, "%7.5f", x);
  return g_ascii_strtod (buf, NULL);
}

static void
add_score (Rouge *r, int which, long hit, long model_n, long peer_n)
{
  double R = round5 (model_n ? (double) hit / model_n : 0.0);
  double P = round5 (peer_n ? (double) hit / peer_n : 0.0);
  double F = 0.5 * P + 0.5 * R > 0 ? round5 (P * R / (0.5 * P + 0.5 * R)) : 0.0;
  double *d = &g_array_index (r->scores, double, r->scores->len - N_SCORES * 3) + which * 3;
  d[0] = R;
  d[1] = P;
  d[2] = F;
}

/* Sentences of a summary: its lines, split after each sentence_end token. */
static char **
summary_lines (const Rouge *r, const char *hyp)
{
  GPtrArray *out = g_ptr_array_new ();
  char **lines = g_strsplit (hyp, "\n", -1);
  for (char **l = lines; *l; l++) {
    if (!*r->sentence_end) {
      g_ptr_array_add (out, g_strdup (*l));
      continue;
    }
    char **tok = g_strsplit_set (*l, " \t\r", -1);
    GString *s = g_string_new (NULL);
    for (char **t = tok; *t; t++) {
      if (!**t)
        continue;
      g_string_append_printf (s, "%s%s", s->len ? " " : "", *t);
      if (strcmp (*t, r->sentence_end) == 0) {
        g_ptr_array_add (out, g_string_free (s, FALSE));
        s = g_string_new (NULL);
      }
    }
    if (s->len)
      g_ptr_array_add (out, g_string_free (s, FALSE));
    else
      g_string_free (s, TRUE);
    g_strfreev (tok);
  }
  g_strfreev (lines);
  g_ptr_array_add (out, NULL);
  return (char **) g_ptr_array_free (out, FALSE);
}

static void
rouge_add_text (void *self, const char *hyp, const char *ref, const char *src)
{
  Rouge *r = self;
  char **peer_lines = summary_lines (r, hyp);
  char **model_lines = g_strsplit (ref ? ref : "", "\n", -1);
  GPtrArray *tp = g_ptr_array_new_with_free_func (g_free), *tm = g_ptr_array_new_with_free_func (g_free);
  g_array_set_size (r->scores, r->scores->len + N_SCORES * 3);
  /* ROUGE-1 and -2 on the joined sentences */
  GPtrArray *sp = read_sentences (r, peer_lines, FALSE), *sm = read_sentences (r, model_lines, FALSE);
  g_ptr_array_add (sp, NULL);
  g_ptr_array_add (sm, NULL);
  char *jp = g_strjoinv (" ", (char **) sp->pdata), *jm = g_strjoinv (" ", (char **) sm->pdata);
  tokenize (r, jp, tp);
  tokenize (r, jm, tm);
  GHashTable *peer1 = new_counts (), *model1 = new_counts ();
  for (int n = 1; n <= 2; n++) {
    GHashTable *pc = new_counts (), *mc = new_counts ();
    long np = ngrams (tp, n, pc), nm = ngrams (tm, n, mc);
    add_score (r, n == 1 ? R1 : R2, hits (mc, pc), nm, np);
    if (n == 1) {
      g_hash_table_unref (peer1);
      g_hash_table_unref (model1);
      peer1 = g_hash_table_ref (pc);
      model1 = g_hash_table_ref (mc);
    }
    g_hash_table_unref (pc);
    g_hash_table_unref (mc);
  }
  /* ROUGE-L: sentences apart */
  GPtrArray *lp = read_sentences (r, peer_lines, TRUE), *lm = read_sentences (r, model_lines, TRUE);
  GPtrArray *ps = g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref);
  for (guint i = 0; i < lp->len; i++) {
    GPtrArray *t = g_ptr_array_new_with_free_func (g_free);
    tokenize (r, lp->pdata[i], t);
    g_ptr_array_add (ps, t);
  }
  long hit = 0, base = 0;
  for (guint i = 0; i < lm->len; i++) {
    GPtrArray *ms = g_ptr_array_new_with_free_func (g_free);
    tokenize (r, lm->pdata[i], ms);
    base += ms->len;
    gboolean *mask = g_new0 (gboolean, ms->len + 1);
    for (guint j = 0; j < ps->len; j++)
      lcs_mark (ms, ps->pdata[j], mask);
    for (guint k = 0; k < ms->len; k++) {
      if (!mask[k])
        continue;
      const char *w = ms->pdata[k];
      int cm = GPOINTER_TO_INT (g_hash_table_lookup (model1, w)), cp = GPOINTER_TO_INT (g_hash_table_lookup (peer1, w));
      if (cm > 0 && cp > 0) {
        hit++;
        g_hash_table_replace (model1, g_strdup (w), GINT_TO_POINTER (cm - 1));
        g_hash_table_replace (peer1, g_strdup (w), GINT_TO_POINTER (cp - 1));
      }
    }
    g_free (mask);
    g_ptr_array_unref (ms);
  }
  add_score (r, RL, hit, base, (long) tp->len);

  g_ptr_array_unref (ps);
  g_ptr_array_unref (lp);
  g_ptr_array_unref (lm);
  g_hash_table_unref (peer1);
  g_hash_table_unref (model1);
  g_free (jp);
  g_free (jm);
  g_ptr_array_unref (sp);
  g_ptr_array_unref (sm);
  g_ptr_array_unref (tp);
  g_ptr_array_unref (tm);
  g_strfreev (peer_lines);
  g_strfreev (model_lines);
}

static void
rouge_reset (void *self)
{
  Rouge *r = self;
  g_array_set_size (r->scores, 0);
}

static int
by_key (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

static int
by_double (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return x < y ? -1 : x > y;
}

/* Perl's drand48 (its own since 5.20): x' = a x + c mod 2^48, seeded by
 * srand(s) as (s << 16) + 0x330E. */
static double
perl_drand48 (guint64 *x)
{
  *x = (*x * G_GUINT64_CONSTANT (0x5DEECE66D) + 0xB) & G_GUINT64_CONSTANT (0xFFFFFFFFFFFF);
  return ldexp ((double) *x, -48);
}

/* The averages of the k = N_SCORES * 3 per-summary values, as the script
 * prints them (bootstrap) or exact (mean). */
static void
averages (const Rouge *r, double *avg)
{
  const int k = N_SCORES * 3;
  long n = (long) r->scores->len / k;
  const double *sc = (const double *) r->scores->data;
  memset (avg, 0, k * sizeof (double));
  if (n == 0)
    return;
  if (!r->bootstrap) {
    for (long i = 0; i < n; i++)
      for (int j = 0; j < k; j++)
        avg[j] += sc[i * k + j];
    for (int j = 0; j < k; j++)
      avg[j] = round5 (avg[j] / (double) n);
    return;
  }
  /* the script's instances: IDs "1.1" .. "N.1" in string order */
  char **keys = g_new (char *, n);
  for (long i = 0; i < n; i++)
    keys[i] = g_strdup_printf ("%ld.1", i + 1);
  qsort (keys, n, sizeof *keys, by_key);
  long *order = g_new (long, n);
  for (long i = 0; i < n; i++)
    order[i] = g_ascii_strtoll (keys[i], NULL, 10) - 1;
  const int R = 1000;
  double *means = g_new0 (double, (size_t) R * k);
  for (int s = 0; s < R; s++) {
    guint64 x = ((guint64) s << 16) + 0x330E;
    double *m = means + (size_t) s * k;
    for (long i = 0; i < n; i++) {
      long pick = order[(long) (perl_drand48 (&x) * (double) n)];
      for (int j = 0; j < k; j++)
        m[j] += sc[pick * k + j];
    }
    for (int j = 0; j < k; j++)
      m[j] /= (double) n;
  }
  double *col = g_new (double, R);
  for (int j = 0; j < k; j++) {
    for (int s = 0; s < R; s++)
      col[s] = means[(size_t) s * k + j];
    qsort (col, R, sizeof *col, by_double);
    double t = 0.0;
    for (int s = 0; s < R; s++)
      t += col[s];
    avg[j] = round5 (t / R);
  }
  g_free (col);
  g_free (means);
  g_free (order);
  for (long i = 0; i < n; i++)
    g_free (keys[i]);
  g_free (keys);
}

static void
rouge_report (void *self, PsmMetricReport *out)
{
  static const char *const names[N_SCORES][3] = {
    { "rouge1_r", "rouge1_p", "rouge1_f" }, { "rouge2_r", "rouge2_p", "rouge2_f" },
    { "rougeL_r", "rougeL_p", "rougeL_f" } };
  Rouge *r = self;
  double avg[N_SCORES * 3];
  averages (r, avg);
  /* F1 of 1, 2 and L first (values[0], the primary, is ROUGE-1 F1), then R and P */
  int k = 0;
  for (int s = 0; s < N_SCORES; s++) {
    out->names[k] = names[s][2];
    out->values[k++] = 100.0 * avg[s * 3 + 2];
  }
  for (int s = 0; s < N_SCORES; s++)
    for (int m = 0; m < 2; m++) {
      out->names[k] = names[s][m];
      out->values[k++] = 100.0 * avg[s * 3 + m];
    }
  out->n = k;
}

static void rouge_destroy (void *self);

static void *
rouge_create (const PsmSection *cfg, GError **error)
{
  Rouge *r = g_new0 (Rouge, 1);
  r->limit_words = cfg ? (int) psm_section_int (cfg, "limit_words") : 0;
  r->limit_bytes = cfg ? (int) psm_section_int (cfg, "limit_bytes") : 0;
  r->sentence_end = g_strdup (cfg ? psm_section_string (cfg, "sentence_end") : ".");
  r->bootstrap = cfg ? strcmp (psm_section_string (cfg, "average"), "bootstrap") == 0 : TRUE;
  r->scores = g_array_new (FALSE, FALSE, sizeof (double));
  gboolean stem = cfg ? psm_section_bool (cfg, "stem") : TRUE;
  if (stem && !(r->stemmer = rouge_stemmer_new (cfg ? psm_section_bool (cfg, "exceptions") : TRUE, error))) {
    rouge_destroy (r);
    return NULL;
  }
  if (r->limit_words && r->limit_bytes) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: set limit_words or limit_bytes, not both (as ROUGE-1.5.5's -l and -b)",
                 psm_section_where (cfg, "limit_bytes"));
    rouge_destroy (r);
    return NULL;
  }
  return r;
}

static void
rouge_destroy (void *self)
{
  Rouge *r = self;
  rouge_stemmer_free (r->stemmer);
  g_array_unref (r->scores);
  g_free (r->sentence_end);
  g_free (r);
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = rouge_create,
  .destroy = rouge_destroy,
  .reset = rouge_reset,
  .report = rouge_report,
  .higher_is_better = TRUE,
  .add_text = rouge_add_text,
  .multi_reference = FALSE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "rouge",
            "ROUGE-1/2/L recall, precision, F1 as ROUGE-1.5.5 -n 2 -a -m (summary-level LCS union, WordNet + Porter)",
            params, NULL, &klass)
