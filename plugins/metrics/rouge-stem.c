/* rouge-stem — ROUGE-1.5.5's MorphStem for the rouge metric: the token, in
 * lower case, is first looked up in WordNet 2.0's exception table (went ->
 * go, mice -> mouse, children -> child) and its base form returned as it is;
 * any other token goes through the script's Porter stemmer.  The caller
 * applies this to tokens longer than 3 characters only, as the script does. */
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>
#include "rouge-stem.h"

/* The script's five patterns, by the names it gives them: a stem with
 * measure > 0, measure = 1, measure > 1, one holding a vowel, and one
 * ending consonant-vowel-consonant (the last not w, x or y). */
enum { MGR0, MEQ1, MGR1, VOWEL, CVC, N_PATTERNS };

struct RougeStemmer {
  gboolean exceptions;
  regex_t re[N_PATTERNS];
};

#define RC "[^aeiou][^aeiouy]*"   /* consonant sequence ($C) */
#define RV "[aeiouy][aeiou]*"     /* vowel sequence ($V) */

static gboolean
matches (const regex_t *re, const char *s)
{
  return regexec (re, s, 0, NULL, 0) == 0;
}

static gboolean
ends_with (const char *w, size_t n, const char *suf)
{
  size_t k = strlen (suf);
  return n >= k && memcmp (w + n - k, suf, k) == 0;
}

/* The longest of the suffixes (NULL-terminated) that w ends with: what the
 * script's leftmost match of an alternation anchored at the end finds. */
static int
longest_suffix (const char *w, size_t n, const char *const *suf)
{
  int best = -1;
  for (int i = 0; suf[i]; i++)
    if (ends_with (w, n, suf[i]) && (best < 0 || strlen (suf[i]) > strlen (suf[best])))
      best = i;
  return best;
}

/* Whether the stem w[0..n) matches re (copied to hold a terminator). */
static gboolean
stem_matches (const regex_t *re, GString *tmp, const char *w, size_t n)
{
  g_string_truncate (tmp, 0);
  g_string_append_len (tmp, w, (gssize) n);
  return matches (re, tmp->str);
}

/* The script's Porter stemmer (its step 4 modified so that -ement words do
 * not also try -ment and -ent). */
static void
porter (const RougeStemmer *r, GString *w)
{
  static const char *const step2[] = { "ational", "tional", "enci", "anci", "izer", "bli", "alli", "entli", "eli",
                                       "ousli", "ization", "ation", "ator", "alism", "iveness", "fulness",
                                       "ousness", "aliti", "iviti", "biliti", "logi", NULL };
  static const char *const step2to[] = { "ate", "tion", "ence", "ance", "ize", "ble", "al", "ent", "e",
                                         "ous", "ize", "ate", "ate", "al", "ive", "ful",
                                         "ous", "al", "ive", "ble", "log" };
  static const char *const step3[] = { "icate", "ative", "alize", "iciti", "ical", "ful", "ness", NULL };
  static const char *const step3to[] = { "ic", "", "al", "ic", "ic", "", "" };
  static const char *const step4[] = { "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement",
                                       "ou", "ism", "ate", "iti", "ous", "ive", "ize", NULL };
  if (w->len < 3)
    return;
  gboolean y = w->str[0] == 'y';
  if (y)
    w->str[0] = 'Y';   /* an initial y is never a vowel */
  GString *tmp = g_string_new (NULL);
  size_t n = w->len;
  /* step 1a */
  if (ends_with (w->str, n, "sses") || ends_with (w->str, n, "ies"))
    g_string_truncate (w, n - 2);
  else if (n >= 2 && w->str[n - 1] == 's' && w->str[n - 2] != 's')
    g_string_truncate (w, n - 1);
  /* step 1b */
  n = w->len;
  if (ends_with (w->str, n, "eed")) {
    if (stem_matches (&r->re[MGR0], tmp, w->str, n - 3))
      g_string_truncate (w, n - 1);
  } else if (ends_with (w->str, n, "ed") || ends_with (w->str, n, "ing")) {
    size_t k = n - (ends_with (w->str, n, "ed") ? 2 : 3);
    if (stem_matches (&r->re[VOWEL], tmp, w->str, k)) {
      g_string_truncate (w, k);
      if (ends_with (w->str, k, "at") || ends_with (w->str, k, "bl") || ends_with (w->str, k, "iz"))
        g_string_append_c (w, 'e');
      else if (k >= 2 && w->str[k - 1] == w->str[k - 2] && !strchr ("aeiouylsz", w->str[k - 1]))
        g_string_truncate (w, k - 1);
      else if (matches (&r->re[CVC], w->str))
        g_string_append_c (w, 'e');
    }
  }
  /* step 1c */
  n = w->len;
  if (n >= 1 && w->str[n - 1] == 'y' && stem_matches (&r->re[VOWEL], tmp, w->str, n - 1))
    w->str[n - 1] = 'i';
  /* steps 2 and 3 */
  for (int step = 2; step <= 3; step++) {
    const char *const *suf = step == 2 ? step2 : step3;
    const char *const *to = step == 2 ? step2to : step3to;
    n = w->len;
    int i = longest_suffix (w->str, n, suf);
    if (i >= 0) {
      size_t k = n - strlen (suf[i]);
      if (stem_matches (&r->re[MGR0], tmp, w->str, k)) {
        g_string_truncate (w, k);
        g_string_append (w, to[i]);
      }
    }
  }
  /* step 4, as modified in ROUGE-1.5.5 */
  n = w->len;
  int i = longest_suffix (w->str, n, step4);
  if (i >= 0) {
    size_t k = n - strlen (step4[i]);
    if (stem_matches (&r->re[MGR1], tmp, w->str, k))
      g_string_truncate (w, k);
  }
  n = w->len;
  if (ends_with (w->str, n, "ment") && stem_matches (&r->re[MGR1], tmp, w->str, n - 4))
    g_string_truncate (w, n - 4);
  n = w->len;
  if (ends_with (w->str, n, "ent")) {
    if (stem_matches (&r->re[MGR1], tmp, w->str, n - 3))
      g_string_truncate (w, n - 3);
  } else if (ends_with (w->str, n, "sion") || ends_with (w->str, n, "tion")) {
    if (stem_matches (&r->re[MGR1], tmp, w->str, n - 3))
      g_string_truncate (w, n - 3);
  }
  /* step 5 */
  n = w->len;
  if (n >= 1 && w->str[n - 1] == 'e') {
    g_string_truncate (tmp, 0);
    g_string_append_len (tmp, w->str, (gssize) n - 1);
    if (matches (&r->re[MGR1], tmp->str) || (matches (&r->re[MEQ1], tmp->str) && !matches (&r->re[CVC], tmp->str)))
      g_string_truncate (w, n - 1);
  }
  n = w->len;
  if (ends_with (w->str, n, "ll") && matches (&r->re[MGR1], w->str))
    g_string_truncate (w, n - 1);
  if (y)
    w->str[0] = 'y';
  g_string_free (tmp, TRUE);
}

static int
cmp_word (const void *key, const void *e)
{
  return strcmp (key, ((const RougeException *) e)->word);
}

const char *
rouge_exception (const char *w)
{
  const RougeException *e = bsearch (w, rouge_exceptions, rouge_n_exceptions, sizeof *e, cmp_word);
  return e ? e->base : NULL;
}

void
rouge_stem (const RougeStemmer *s, GString *w)
{
  const char *base = s->exceptions ? rouge_exception (w->str) : NULL;
  if (base)
    g_string_assign (w, base);
  else
    porter (s, w);
}

RougeStemmer *
rouge_stemmer_new (gboolean exceptions, GError **error)
{
  RougeStemmer *r = g_new0 (RougeStemmer, 1);
  r->exceptions = exceptions;
  static const char *const pattern[N_PATTERNS] = { "^(" RC ")?" RV RC, "^(" RC ")?" RV RC "(" RV ")?$", "^(" RC ")?" RV RC RV RC,
                                                    "^(" RC ")?[aeiouy]", "^" RC "[aeiouy][^aeiouwxy]$" };
  for (unsigned i = 0; i < N_PATTERNS; i++)
    if (regcomp (&r->re[i], pattern[i], REG_EXTENDED | REG_NOSUB)) {
      while (i--)
        regfree (&r->re[i]);
      g_free (r);
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "rouge: cannot compile the stemmer's patterns");
      return NULL;
    }
  return r;
}

void
rouge_stemmer_free (RougeStemmer *r)
{
  if (!r)
    return;
  for (unsigned i = 0; i < N_PATTERNS; i++)
    regfree (&r->re[i]);
  g_free (r);
}
