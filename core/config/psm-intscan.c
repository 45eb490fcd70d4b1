/* psm-intscan.c — finds integer literals that libconfig 1.5 would wrap.
 *
 * libconfig 1.5 (Debian 12's) converts an integer literal without the L
 * suffix to a 32-bit int by truncation: `steps = 4294968296;` reads as 1000
 * and nothing says so. Its API keeps no literal text, so psm scans the
 * pipeline's text, its @include files already expanded in it
 * (psm-include.c), with a small lexer of libconfig's grammar — comments,
 * strings, names, numbers, brackets — and reports every plain integer
 * outside [-2^31, 2^31) with its file, line (through the expansion's line
 * map) and key path. A literal with the L suffix is 64-bit and
 * range-checked as usual. */
#include "config.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "config/config-internal.h"

#define MAX_DEPTH 64

typedef struct {
  const char *file;
  const PsmLineMap *lines;
  const char *p;
  int line;
  char *frame[MAX_DEPTH];   /* path components of the enclosing groups/lists */
  int index[MAX_DEPTH];     /* element counter of a list frame, -1 for groups */
  int depth;
  char *pending;            /* name of the setting whose value comes next */
} Lexer;

static char *
path_of (Lexer *lx)
{
  GString *s = g_string_new (NULL);
  for (int i = 0; i < lx->depth; i++) {
    if (lx->frame[i] && *lx->frame[i])
      g_string_append_printf (s, "%s%s", s->len ? "." : "", lx->frame[i]);
    if (lx->index[i] >= 0)
      g_string_append_printf (s, "%s[%d]", s->len ? "." : "", lx->index[i]);
  }
  if (lx->pending)
    g_string_append_printf (s, "%s%s", s->len ? "." : "", lx->pending);
  return g_string_free (s, FALSE);
}

static void
skip_space_and_comments (Lexer *lx)
{
  for (;;) {
    char c = *lx->p;
    if (c == '\n') {
      lx->line++;
      lx->p++;
    } else if (g_ascii_isspace (c)) {
      lx->p++;
    } else if (c == '#' || (c == '/' && lx->p[1] == '/')) {
      while (*lx->p && *lx->p != '\n')
        lx->p++;
    } else if (c == '/' && lx->p[1] == '*') {
      lx->p += 2;
      while (*lx->p && !(lx->p[0] == '*' && lx->p[1] == '/')) {
        if (*lx->p == '\n')
          lx->line++;
        lx->p++;
      }
      if (*lx->p)
        lx->p += 2;
    } else {
      return;
    }
  }
}

/* Skips a string literal (the opening quote at lx->p); returns its text. */
static char *
take_string (Lexer *lx)
{
  GString *s = g_string_new (NULL);
  lx->p++;
  while (*lx->p && *lx->p != '"') {
    if (*lx->p == '\\' && lx->p[1]) {
      lx->p++;
      g_string_append_c (s, *lx->p == 'n' ? '\n' : *lx->p == 't' ? '\t' : *lx->p);
    } else {
      if (*lx->p == '\n')
        lx->line++;
      g_string_append_c (s, *lx->p);
    }
    lx->p++;
  }
  if (*lx->p)
    lx->p++;
  return g_string_free (s, FALSE);
}

/* A number at lx->p: reports a plain integer that does not fit 32 bits. */
static void
take_number (Lexer *lx, GPtrArray *errors)
{
  const char *start = lx->p;
  const char *q = lx->p;
  if (*q == '+' || *q == '-')
    q++;
  gboolean hex = q[0] == '0' && (q[1] == 'x' || q[1] == 'X');
  if (hex) {
    q += 2;
    while (g_ascii_isxdigit (*q))
      q++;
  } else {
    while (g_ascii_isdigit (*q))
      q++;
    if (*q == '.' || *q == 'e' || *q == 'E') {   /* a float: not our business */
      q++;
      while (g_ascii_isalnum (*q) || *q == '.' || *q == '+' || *q == '-')
        q++;
      lx->p = q;
      return;
    }
  }
  gboolean wide = *q == 'L';
  lx->p = wide ? q + 1 : q;
  if (wide)
    return;
  char *text = g_strndup (start, q - start);
  gboolean fits;
  if (hex) {
    const char *digits = text + (text[0] == '-' || text[0] == '+' ? 3 : 2);
    errno = 0;
    guint64 v = g_ascii_strtoull (digits, NULL, 16);
    fits = errno == 0 && v <= G_MAXINT32;
  } else {
    errno = 0;
    gint64 v = g_ascii_strtoll (text, NULL, 10);
    fits = errno == 0 && v >= G_MININT32 && v <= G_MAXINT32;
  }
  if (!fits) {
    char *path = path_of (lx);
    const char *file = lx->file;
    int line = lx->line;
    psm_line_map_where (lx->lines, line, &file, &line);
    g_ptr_array_add (errors, g_strdup_printf (
        "%s:%d: %s: integer %s does not fit in 32 bits, and libconfig would silently wrap it "
        "(write %sL for a 64-bit integer)", file, line, *path ? path : "(top level)", text, text));
    g_free (path);
  }
  g_free (text);
}

static void
push (Lexer *lx, int list)
{
  if (lx->depth < MAX_DEPTH) {
    lx->frame[lx->depth] = lx->pending;
    lx->index[lx->depth] = list ? 0 : -1;
    lx->depth++;
  } else {
    g_free (lx->pending);
  }
  lx->pending = NULL;
}

static void
pop (Lexer *lx)
{
  g_clear_pointer (&lx->pending, g_free);
  if (lx->depth > 0) {
    lx->depth--;
    g_free (lx->frame[lx->depth]);
  }
}

void
psm_config_scan_integers (const char *file, const char *text, const PsmLineMap *lines, GPtrArray *errors)
{
  Lexer lx = { .file = file, .lines = lines, .p = text, .line = 1 };
  for (;;) {
    skip_space_and_comments (&lx);
    char c = *lx.p;
    if (!c)
      break;
    if (c == '"') {
      g_free (take_string (&lx));
    } else if (g_ascii_isalpha (c) || c == '*') {
      const char *s = lx.p;
      while (g_ascii_isalnum (*lx.p) || *lx.p == '_' || *lx.p == '-' || *lx.p == '*')
        lx.p++;
      char *name = g_strndup (s, lx.p - s);
      skip_space_and_comments (&lx);
      if (*lx.p == '=' || *lx.p == ':') {
        g_free (lx.pending);
        lx.pending = name;
        lx.p++;
      } else {
        g_free (name);   /* true, false */
      }
    } else if (g_ascii_isdigit (c) || ((c == '-' || c == '+') && g_ascii_isdigit (lx.p[1]))) {
      take_number (&lx, errors);
    } else if (c == '{' || c == '(' || c == '[') {
      /* a list element's group gets no name of its own */
      if (!lx.pending && lx.depth > 0 && lx.index[lx.depth - 1] >= 0)
        lx.pending = g_strdup ("");
      push (&lx, c != '{');
      lx.p++;
    } else if (c == '}' || c == ')' || c == ']') {
      pop (&lx);
      lx.p++;
    } else if (c == ',' && lx.depth > 0 && lx.index[lx.depth - 1] >= 0) {
      lx.index[lx.depth - 1]++;
      lx.p++;
    } else {
      if (c == ';')
        g_clear_pointer (&lx.pending, g_free);
      lx.p++;
    }
  }
  while (lx.depth > 0)
    pop (&lx);
  g_free (lx.pending);
}
