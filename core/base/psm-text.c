/* psm-text.c — reading the texts of sequence-to-sequence tasks: pairs of
 * texts from jsonl or from two line-aligned files, and a PTB-like tokeniser
 * for raw input (psm-task.h, ABI 1.7). cnndm and headline read with them. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base-internal.h"

/* ---- a JSON object of string fields (other values are skipped) ---- */

static const char *
skip_ws (const char *p)
{
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
    p++;
  return p;
}

static void
put_utf8 (GString *s, guint32 c)
{
  char buf[8];
  int n = g_unichar_to_utf8 (c, buf);
  g_string_append_len (s, buf, n);
}

/* Parses a JSON string at p (at the opening quote) into out; returns the
 * position after it or NULL. */
static const char *
json_string (const char *p, GString *out)
{
  if (*p++ != '"')
    return NULL;
  g_string_truncate (out, 0);
  for (;;) {
    unsigned char c = (unsigned char) *p++;
    if (c == '"')
      return p;
    if (c == 0 || c < 0x20)
      return NULL;
    if (c != '\\') {
      g_string_append_c (out, (char) c);
      continue;
    }
    c = (unsigned char) *p++;
    switch (c) {
    case '"': case '\\': case '/': g_string_append_c (out, (char) c); break;
    case 'b': g_string_append_c (out, '\b'); break;
    case 'f': g_string_append_c (out, '\f'); break;
    case 'n': g_string_append_c (out, '\n'); break;
    case 'r': g_string_append_c (out, '\r'); break;
    case 't': g_string_append_c (out, '\t'); break;
    case 'u': {
      guint32 u = 0;
      for (int i = 0; i < 4; i++) {
        int d = g_ascii_xdigit_value (*p++);
        if (d < 0)
          return NULL;
        u = u * 16 + (guint32) d;
      }
      if (u >= 0xD800 && u < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
        guint32 lo = 0;
        for (int i = 0; i < 4; i++) {
          int d = g_ascii_xdigit_value (p[2 + i]);
          if (d < 0)
            return NULL;
          lo = lo * 16 + (guint32) d;
        }
        if (lo >= 0xDC00 && lo < 0xE000) {
          u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        }
      }
      put_utf8 (out, u);
      break;
    }
    default:
      return NULL;
    }
  }
}

/* Skips any JSON value (strings, numbers, literals, nested containers);
 * NULL where it is not one, with *deep set where arrays and objects nest
 * more than JSON_MAX_DEPTH levels (the recursion's bound: a line of
 * 200,000 '[' had overflowed the stack, issue 58). */
#define JSON_MAX_DEPTH 64
static const char *
json_skip (const char *p, GString *tmp, int depth, gboolean *deep)
{
  p = skip_ws (p);
  if (*p == '"')
    return json_string (p, tmp);
  if (*p == '{' || *p == '[') {
    if (depth >= JSON_MAX_DEPTH) {
      *deep = TRUE;
      return NULL;
    }
    char open = *p, close = open == '{' ? '}' : ']';
    p = skip_ws (p + 1);
    if (*p == close)
      return p + 1;
    for (;;) {
      if (open == '{') {
        p = json_string (skip_ws (p), tmp);
        if (!p || *(p = skip_ws (p)) != ':')
          return NULL;
        p++;
      }
      p = json_skip (p, tmp, depth + 1, deep);
      if (!p)
        return NULL;
      p = skip_ws (p);
      if (*p == close)
        return p + 1;
      if (*p++ != ',')
        return NULL;
    }
  }
  const char *s = p;
  while (*p && strchr ("+-0123456789.eEtruefalsn", *p))
    p++;
  return p > s ? p : NULL;
}

gboolean
psm_json_string_fields (const char *line, const char *const *keys, GString **values, guint *found, GString *why)
{
  GString *key = g_string_new (NULL), *tmp = g_string_new (NULL);
  gboolean ok = FALSE, deep = FALSE;
  const char *p = skip_ws (line);
  *found = 0;
  g_string_assign (why, "invalid JSON");
  if (*p++ != '{')
    goto out;
  p = skip_ws (p);
  if (*p == '}') {
    p++;
  } else {
    for (;;) {
      p = json_string (skip_ws (p), key);
      if (!p || *(p = skip_ws (p)) != ':')
        goto out;
      p = skip_ws (p + 1);
      int k = -1;
      for (int i = 0; keys[i] && i < 32; i++)
        if (strcmp (key->str, keys[i]) == 0)
          k = i;
      if (k >= 0 && *p == '"') {
        p = json_string (p, values[k]);
        *found |= 1u << k;
      } else {
        p = json_skip (p, tmp, 1, &deep);
        if (p && k >= 0) {
          g_string_printf (why, "\"%s\" is not a string", keys[k]);
          goto out;
        }
      }
      if (!p)
        goto out;
      p = skip_ws (p);
      if (*p == '}') {
        p++;
        break;
      }
      if (*p++ != ',')
        goto out;
    }
  }
  if (*skip_ws (p) != '\0')
    goto out;
  g_string_truncate (why, 0);
  ok = TRUE;
out:
  if (deep)
    g_string_assign (why, "invalid JSON: arrays and objects nested more than " G_STRINGIFY (JSON_MAX_DEPTH)
                          " levels deep");
  g_string_free (key, TRUE);
  g_string_free (tmp, TRUE);
  return ok;
}

/* Fills article / summary (the string fields keys[0] and keys[1]) from one
 * jsonl line; why names the defect (held in why_buf). */
static gboolean
parse_record (const char *line, const char *const *keys, GString *article, GString *summary, GString *why_buf,
              const char **why)
{
  const char *two[3] = { keys[0], keys[1], NULL };
  GString *values[2] = { article, summary };
  guint found;
  *why = NULL;
  if (!psm_json_string_fields (line, two, values, &found, why_buf))
    *why = why_buf->str;
  else if (found != 3) {
    g_string_printf (why_buf, "no \"%s\"", !(found & 1) ? keys[0] : keys[1]);
    *why = why_buf->str;
  }
  return *why == NULL;
}

static gboolean
blank (const char *s)
{
  for (; *s; s++)
    if (!g_ascii_isspace (*s))
      return FALSE;
  return TRUE;
}

/* ---- reading a split into pairs of texts ---- */

/* A UTF-8 byte-order mark at the start of a file's first line (some
 * editors and exporters write one) is not part of its first record. */
static void
skip_bom (char *line)
{
  if ((unsigned char) line[0] == 0xef && (unsigned char) line[1] == 0xbb && (unsigned char) line[2] == 0xbf)
    memmove (line, line + 3, strlen (line + 3) + 1);
}

static FILE *
open_split (const char *path, GError **error)
{
  FILE *f = fopen (path, "r");
  if (!f)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot read: %s", path, g_strerror (errno));
  return f;
}

gboolean
psm_read_text_pairs (const char *path, const char *path2, const char *const keys[2], long max, gboolean quiet,
                     const char *who, GPtrArray **first, GPtrArray **second, GError **error)
{
  GPtrArray *fa = *first = g_ptr_array_new_with_free_func (g_free);
  GPtrArray *fb = *second = g_ptr_array_new_with_free_func (g_free);
  FILE *f = open_split (path, error), *ft = NULL;
  if (f && path2 && !(ft = open_split (path2, error))) {
    fclose (f);
    f = NULL;
  }
  if (!f)
    return FALSE;
  GString *a = g_string_new (NULL), *s = g_string_new (NULL), *bad_lines = g_string_new (NULL);
  GString *why_buf = g_string_new (NULL);
  char *line = NULL, *tline = NULL, *first_why = NULL;
  size_t cap = 0, tcap = 0;
  long lineno = 0, n_bad = 0;
  gboolean ok = TRUE;
  while (max <= 0 || (long) fa->len < max) {
    ssize_t len = getline (&line, &cap, f);
    if (len < 0)
      break;
    lineno++;
    const char *why = NULL;
    if (lineno == 1)
      skip_bom (line);
    if (path2) {
      if (getline (&tline, &tcap, ft) < 0) {
        g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: has fewer lines than %s (%ld)", path2, path,
                     lineno);
        ok = FALSE;
        break;
      }
      if (lineno == 1)
        skip_bom (tline);
      g_string_assign (a, line);
      g_string_assign (s, tline);
    } else if (blank (line)) {
      continue;
    } else {
      parse_record (line, keys, a, s, why_buf, &why);
    }
    if (!why && (blank (a->str) || blank (s->str))) {
      gboolean in_a = blank (a->str);
      if (path2)
        g_string_printf (why_buf, "an empty line in %s", in_a ? path : path2);
      else
        g_string_printf (why_buf, "empty \"%s\"", in_a ? keys[0] : keys[1]);
      why = why_buf->str;
    }
    if (why) {
      if (n_bad < 5)
        g_string_append_printf (bad_lines, "%s%ld", n_bad ? ", " : "", lineno);
      if (!first_why)
        first_why = g_strdup (why);
      n_bad++;
      continue;
    }
    g_strchomp (a->str);
    g_strchomp (s->str);
    g_ptr_array_add (fa, g_strdup (a->str));
    g_ptr_array_add (fb, g_strdup (s->str));
  }
  if (ok && path2 && (max <= 0 || (long) fa->len < max) && getline (&tline, &tcap, ft) >= 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: has more lines than %s (%ld)", path2, path,
                 lineno);
    ok = FALSE;
  }
  if (ok && ferror (f)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: read error: %s", path, g_strerror (errno));
    ok = FALSE;
  }
  if (ok && n_bad && !quiet)
    psm_out (PSM_OUT_NOTE, "%s: %s: skipped %ld bad record%s (line%s %s%s; first: %s)\n", who, path, n_bad,
             n_bad > 1 ? "s" : "", n_bad > 1 ? "s" : "", bad_lines->str, n_bad > 5 ? ", ..." : "", first_why);
  if (ok && fa->len == 0) {
    char *what = n_bad ? g_strdup_printf ("%ld bad record%s, line%s %s%s; first: %s", n_bad, n_bad > 1 ? "s" : "",
                                          n_bad > 1 ? "s" : "", bad_lines->str, n_bad > 5 ? ", ..." : "", first_why)
                       : g_strdup ("the file is empty");
    if (path2)
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "%s: no valid pair (%s); expected non-empty lines, line-aligned with %s", path, what, path2);
    else
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "%s: no valid record (%s); expected one JSON object a line with string fields \"%s\" and \"%s\"",
                   path, what, keys[0], keys[1]);
    g_free (what);
    ok = FALSE;
  }
  free (line);
  free (tline);
  fclose (f);
  if (ft)
    fclose (ft);
  g_free (first_why);
  g_string_free (a, TRUE);
  g_string_free (s, TRUE);
  g_string_free (bad_lines, TRUE);
  g_string_free (why_buf, TRUE);
  return ok;
}

/* ---- raw text: lower-case, PTB-like tokens ---- */

char *
psm_tokenize_ptb (const char *text)
{
  GString *out = g_string_new (NULL);
  /* invalid UTF-8 made valid (U+FFFD) first: strdown steps by lead bytes,
   * and one just before the end would step past it */
  char *valid = g_utf8_validate (text, -1, NULL) ? NULL : g_utf8_make_valid (text, -1);
  char *low = g_utf8_strdown (valid ? valid : text, -1);
  g_free (valid);
  GString *w = g_string_new (NULL);
  g_string_truncate (out, 0);
#define EMIT(str)                                                              \
  do {                                                                         \
    if (out->len)                                                              \
      g_string_append_c (out, ' ');                                            \
    g_string_append (out, str);                                                \
  } while (0)
  gboolean open_quote = TRUE;
  for (const char *p = low;; p++) {
    char c = *p;
    gboolean word_char = c && !g_ascii_isspace (c) && !strchr (",.!?;:\"()[]{}", c);
    /* a '.' inside a number or an abbreviation stays in the word */
    if (c == '.' && w->len && g_ascii_isalnum (p[1]))
      word_char = TRUE;
    if (c == ',' && w->len && g_ascii_isdigit (w->str[w->len - 1]) && g_ascii_isdigit (p[1]))
      word_char = TRUE;
    if (word_char) {
      g_string_append_c (w, c);
      continue;
    }
    if (w->len) {
      /* split clitics: n't, 's, 're, 've, 'll, 'd, 'm */
      static const char *const clitics[] = { "n't", "'s", "'re", "'ve", "'ll", "'d", "'m", NULL };
      for (int i = 0; clitics[i]; i++) {
        size_t cl = strlen (clitics[i]);
        if (w->len > cl && strcmp (w->str + w->len - cl, clitics[i]) == 0) {
          char *stem = g_strndup (w->str, w->len - cl);
          EMIT (stem);
          g_free (stem);
          g_string_assign (w, clitics[i]);
          break;
        }
      }
      EMIT (w->str);
      g_string_truncate (w, 0);
    }
    if (!c)
      break;
    if (c == '"') {
      EMIT (open_quote ? "``" : "''");
      open_quote = !open_quote;
    } else if (!g_ascii_isspace (c)) {
      char one[2] = { c, 0 };
      EMIT (one);
    }
  }
#undef EMIT
  g_string_free (w, TRUE);
  g_free (low);
  return g_string_free (out, FALSE);
}
