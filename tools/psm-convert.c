/* psm-convert.c — psm-run convert: the CNN/DailyMail data people have, in
 * the two forms it is shared in, as the jsonl the cnndm task reads.
 *
 * - See et al.'s finished_files/ *.bin (train.bin or chunked/train_000.bin):
 *   records of an 8-byte little-endian length and a serialised
 *   tf.Example with the bytes features "article" (tokenised, lower-cased)
 *   and "abstract" (the same, each sentence between <s> and </s>). No CRC
 *   (these are not TFRecord files).
 * - The Hugging Face cnn_dailymail dataset exported as JSON lines or CSV
 *   (Dataset.to_json / to_csv): fields "article", "highlights" (sentences
 *   joined by a newline) and "id", the text raw (cased, untokenised).
 *
 * Out: one {"id", "article", "highlights"} object a line, the highlights
 * one sentence a line, the texts tokenised and lower-cased with the PTB-like
 * tokeniser psm uses for raw text (psm_tokenize_ptb) unless the input is
 * tokenised already. Records are streamed: memory is bounded by the largest
 * record (MAX_RECORD). A record without an article or a summary is skipped
 * and counted; a file that is not of its format is an error naming the
 * file and the record's line or byte offset. The output file is written
 * beside its name and linked into place at the end: an existing file is
 * never overwritten, and a failed run leaves none. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "psm-tools.h"
#include "psm/psm-task.h"

#define MAX_RECORD 67108864   /* bytes of one record, line or CSV row (64 MiB) */

typedef enum { FMT_AUTO, FMT_SEE_BIN, FMT_JSONL, FMT_CSV } Format;

typedef struct {
  FILE *out;
  int tokenize;   /* 1 yes, 0 no, -1 auto (by format) */
  long max, n_out;
  /* per input */
  const char *path;
  long n_bad;
  char *first_bad;
  GString *rec, *line;
} Conv;

static gboolean
fail (GError **error, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

static gboolean
fail (GError **error, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *msg = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  g_set_error_literal (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, msg);
  g_free (msg);
  return FALSE;
}

static void
count_bad (Conv *c, const char *where, const char *why)
{
  if (!c->first_bad)
    c->first_bad = g_strdup_printf ("%s: %s", where, why);
  c->n_bad++;
}

/* text tokenised (or only trimmed) as c says for this format */
static char *
clean (const Conv *c, gboolean raw, const char *text)
{
  if (c->tokenize == 1 || (c->tokenize == -1 && raw))
    return psm_tokenize_ptb (text);
  char *t = g_strdup (text);
  return g_strstrip (t);
}

/* Writes one record; summary: its sentences, one a line. */
static gboolean
emit (Conv *c, gboolean raw, const char *id, const char *article, const char *summary, const char *where,
      GError **error)
{
  char *a = clean (c, raw, article);
  GString *h = g_string_new (NULL);
  char **sents = g_strsplit (summary, "\n", -1);
  for (int i = 0; sents[i]; i++) {
    char *s = clean (c, raw, sents[i]);
    if (*s)
      g_string_append_printf (h, "%s%s", h->len ? "\n" : "", s);
    g_free (s);
  }
  g_strfreev (sents);
  if (!*a || !h->len) {
    count_bad (c, where, *a ? "no summary" : "no article");
  } else {
    g_string_truncate (c->rec, 0);
    g_string_append (c->rec, "{\"id\": ");
    psm_json_string (c->rec, id);
    g_string_append (c->rec, ", \"article\": ");
    psm_json_string (c->rec, a);
    g_string_append (c->rec, ", \"highlights\": ");
    psm_json_string (c->rec, h->str);
    g_string_append (c->rec, "}\n");
    c->n_out++;
  }
  g_free (a);
  g_string_free (h, TRUE);
  if (c->rec->len && fwrite (c->rec->str, 1, c->rec->len, c->out) != c->rec->len)
    return fail (error, "cannot write the output: %s", g_strerror (errno));
  g_string_truncate (c->rec, 0);
  return TRUE;
}

/* ---- See et al.'s .bin: length-prefixed tf.Example records ---- */

static gboolean
pb_varint (const guint8 **p, const guint8 *end, guint64 *v)
{
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    guint8 b = *(*p)++;
    *v |= (guint64) (b & 0x7f) << shift;
    if (!(b & 0x80))
      return TRUE;
  }
  return FALSE;
}

/* The next field of a message in [*p, end): its number, and for a
 * length-delimited field its bytes (val, len; others are skipped, val
 * NULL). FALSE at a malformed field. */
static gboolean
pb_next (const guint8 **p, const guint8 *end, guint64 *field, const guint8 **val, gsize *len)
{
  guint64 tag, n;
  *val = NULL;
  *len = 0;
  if (!pb_varint (p, end, &tag))
    return FALSE;
  *field = tag >> 3;
  switch (tag & 7) {
  case 0:
    return pb_varint (p, end, &n);
  case 1:
  case 5: {
    gsize w = (tag & 7) == 1 ? 8 : 4;
    if ((gsize) (end - *p) < w)
      return FALSE;
    *p += w;
    return TRUE;
  }
  case 2:
    if (!pb_varint (p, end, &n) || n > (guint64) (end - *p))
      return FALSE;
    *val = *p;
    *len = (gsize) n;
    *p += n;
    return TRUE;
  default:
    return FALSE;
  }
}

/* The first bytes value of feature name in a serialised tf.Example
 * (Example.features = 1; Features.feature = 1, map entries of key = 1 and
 * value = 2; Feature.bytes_list = 1; BytesList.value = 1): a copy, "" if
 * the feature has no value, NULL if absent; *bad for a malformed message. */
static char *
example_bytes (const guint8 *p, const guint8 *end, const char *name, gboolean *bad)
{
  guint64 f;
  const guint8 *v;
  gsize n;
  size_t name_len = strlen (name);
  *bad = TRUE;
  while (p < end) {
    if (!pb_next (&p, end, &f, &v, &n))
      return NULL;
    if (f != 1 || !v)
      continue;
    for (const guint8 *q = v, *qe = v + n; q < qe;) {   /* Features */
      const guint8 *e;
      gsize en;
      if (!pb_next (&q, qe, &f, &e, &en))
        return NULL;
      if (f != 1 || !e)
        continue;
      const guint8 *key = NULL, *feat = NULL;
      gsize key_len = 0, feat_len = 0;
      for (const guint8 *r = e; r < e + en;) {   /* a map entry */
        const guint8 *x;
        gsize xn;
        if (!pb_next (&r, e + en, &f, &x, &xn))
          return NULL;
        if (f == 1 && x)
          key = x, key_len = xn;
        else if (f == 2 && x)
          feat = x, feat_len = xn;
      }
      if (!key || key_len != name_len || memcmp (key, name, name_len) != 0)
        continue;
      for (const guint8 *r = feat; feat && r < feat + feat_len;) {   /* Feature */
        const guint8 *bl;
        gsize bln;
        if (!pb_next (&r, feat + feat_len, &f, &bl, &bln))
          return NULL;
        for (const guint8 *s = bl; f == 1 && bl && s < bl + bln;) {   /* BytesList */
          const guint8 *b;
          gsize bn;
          if (!pb_next (&s, bl + bln, &f, &b, &bn))
            return NULL;
          if (f == 1 && b) {
            *bad = FALSE;
            return g_strndup ((const char *) b, bn);
          }
        }
      }
      *bad = FALSE;
      return g_strdup ("");
    }
  }
  *bad = FALSE;
  return NULL;
}

/* See's abstract "<s> one . </s> <s> two . </s>" as "one .\ntwo ." */
static char *
see_sentences (const char *abstract)
{
  GString *out = g_string_new (NULL);
  char **parts = g_strsplit (abstract, "</s>", -1);
  for (int i = 0; parts[i]; i++) {
    char *s = strstr (parts[i], "<s>");
    s = g_strstrip (s ? s + 3 : parts[i]);
    if (*s)
      g_string_append_printf (out, "%s%s", out->len ? "\n" : "", s);
  }
  g_strfreev (parts);
  return g_string_free (out, FALSE);
}

static gboolean
read_see_bin (Conv *c, FILE *f, GError **error)
{
  char *base = g_path_get_basename (c->path);
  guint8 *buf = NULL;
  gboolean ok = TRUE;
  long off = 0;
  for (long k = 0; ok && (c->max <= 0 || c->n_out < c->max); k++) {
    guint8 head[8];
    size_t got = fread (head, 1, 8, f);
    if (got == 0 && feof (f))
      break;
    guint64 len = 0;
    for (int i = 7; i >= 0; i--)
      len = len << 8 | head[i];
    if (got < 8) {
      ok = fail (error, "%s: record %ld at byte %ld: the file ends inside the 8-byte length", c->path, k + 1, off);
    } else if (len > MAX_RECORD) {
      ok = fail (error, "%s: record %ld at byte %ld: length %" G_GUINT64_FORMAT " is over %d bytes "
                 "(not one of See et al.'s .bin files, or corrupt)", c->path, k + 1, off, len, MAX_RECORD);
    } else {
      buf = g_realloc (buf, MAX (len, 1));
      if (fread (buf, 1, len, f) != len) {
        ok = fail (error, "%s: record %ld at byte %ld: the file ends inside the record (%" G_GUINT64_FORMAT
                   " bytes)", c->path, k + 1, off, len);
        break;
      }
      gboolean bad_a, bad_s;
      char *art = example_bytes (buf, buf + len, "article", &bad_a);
      char *abs = example_bytes (buf, buf + len, "abstract", &bad_s);
      if (bad_a || bad_s) {
        ok = fail (error, "%s: record %ld at byte %ld: not a tf.Example", c->path, k + 1, off);
      } else {
        char *where = g_strdup_printf ("record %ld", k + 1);
        char *id = g_strdup_printf ("%s:%ld", base, k + 1);
        char *summary = abs ? see_sentences (abs) : g_strdup ("");
        ok = emit (c, FALSE, id, art ? art : "", summary, where, error);
        g_free (summary);
        g_free (id);
        g_free (where);
      }
      g_free (art);
      g_free (abs);
      off += 8 + (long) len;
    }
  }
  g_free (buf);
  g_free (base);
  return ok;
}

/* ---- JSON lines ---- */

/* One line of f into c->line (its end removed); FALSE at the end of the
 * file; *over: longer than MAX_RECORD (the rest of it is skipped). */
static gboolean
read_line (Conv *c, FILE *f, gboolean *over)
{
  char chunk[65536];
  g_string_truncate (c->line, 0);
  *over = FALSE;
  gboolean any = FALSE;
  while (fgets (chunk, sizeof chunk, f)) {
    any = TRUE;
    size_t n = strlen (chunk);
    if (!*over && c->line->len + n > MAX_RECORD) {
      *over = TRUE;
      g_string_truncate (c->line, 0);
    }
    if (!*over)
      g_string_append_len (c->line, chunk, (gssize) n);
    if (n && chunk[n - 1] == '\n')
      break;
  }
  return any;
}

static gboolean
read_jsonl (Conv *c, FILE *f, GError **error)
{
  static const char *const keys[] = { "article", "highlights", "id", NULL };
  GString *v[3] = { g_string_new (NULL), g_string_new (NULL), g_string_new (NULL) };
  GString *why = g_string_new (NULL);
  gboolean ok = TRUE, over;
  for (long lineno = 1; ok && (c->max <= 0 || c->n_out < c->max) && read_line (c, f, &over); lineno++) {
    char *where = g_strdup_printf ("line %ld", lineno);
    guint found;
    for (int i = 0; i < 3; i++)
      g_string_truncate (v[i], 0);
    if (over)
      count_bad (c, where, "longer than " G_STRINGIFY (MAX_RECORD) " bytes");
    else if (!*g_strstrip (c->line->str))
      ;   /* a blank line */
    else if (!psm_json_string_fields (c->line->str, keys, v, &found, why))
      count_bad (c, where, why->str);
    else {
      char *id = found & 4 ? g_strdup (v[2]->str) : g_strdup_printf ("%s:%ld", c->path, lineno);
      ok = emit (c, TRUE, id, v[0]->str, v[1]->str, where, error);
      g_free (id);
    }
    g_free (where);
  }
  for (int i = 0; i < 3; i++)
    g_string_free (v[i], TRUE);
  g_string_free (why, TRUE);
  return ok;
}

/* ---- CSV (RFC 4180: quoted fields may hold commas, "" and newlines) ---- */

/* The next row's fields; FALSE at the end of the file. why: a defect that
 * ends the file's reading (an unterminated quote), or one that spoils
 * only this row (a field over MAX_RECORD, text after a closing quote). */
static gboolean
csv_row (FILE *f, GPtrArray *fields, long *lineno, const char **fatal, const char **bad)
{
  GString *fld = g_string_new (NULL);
  g_ptr_array_set_size (fields, 0);
  *fatal = *bad = NULL;
  int ch = getc (f);
  if (ch == EOF) {
    g_string_free (fld, TRUE);
    return FALSE;
  }
  gboolean quoted = FALSE, was_quoted = FALSE;
  size_t total = 0;
  for (;; ch = getc (f)) {
    if (quoted) {
      if (ch == EOF) {
        *fatal = "a quoted field is not closed before the end of the file";
        break;
      }
      if (ch == '"') {
        int next = getc (f);
        if (next != '"') {
          quoted = FALSE;
          ungetc (next, f);
          continue;
        }
      }
      if (ch == '\n')
        (*lineno)++;
    } else if (ch == ',' || ch == '\n' || ch == EOF) {
      g_ptr_array_add (fields, g_strdup (fld->str));
      g_string_truncate (fld, 0);
      was_quoted = FALSE;
      if (ch != ',') {
        (*lineno)++;
        break;
      }
      continue;
    } else if (ch == '"' && fld->len == 0 && !was_quoted) {
      quoted = was_quoted = TRUE;
      continue;
    } else if (ch == '\r') {
      continue;
    } else if (was_quoted && !*bad) {
      *bad = "text after a closing quote";
    }
    if (++total > MAX_RECORD) {
      if (!*bad)
        *bad = "a row longer than " G_STRINGIFY (MAX_RECORD) " bytes";
      continue;
    }
    g_string_append_c (fld, (char) ch);
  }
  g_string_free (fld, TRUE);
  return TRUE;
}

static gboolean
read_csv (Conv *c, FILE *f, GError **error)
{
  GPtrArray *row = g_ptr_array_new_with_free_func (g_free);
  const char *fatal, *bad;
  long lineno = 1, start;
  int col[3] = { -1, -1, -1 };   /* article, highlights, id */
  gboolean ok = csv_row (f, row, &lineno, &fatal, &bad) && !fatal;
  for (guint i = 0; ok && i < row->len; i++) {
    const char *name = g_ptr_array_index (row, i);
    name += g_str_has_prefix (name, "\xef\xbb\xbf") ? 3 : 0;   /* a byte-order mark */
    for (int k = 0; k < 3; k++)
      if (strcmp (name, (const char *[]) { "article", "highlights", "id" }[k]) == 0)
        col[k] = (int) i;
  }
  if (!ok || col[0] < 0 || col[1] < 0) {
    g_ptr_array_unref (row);
    return fail (error, "%s: line 1: expected a header row naming the columns article and highlights (and id)",
                 c->path);
  }
  for (start = lineno; ok && (c->max <= 0 || c->n_out < c->max) && csv_row (f, row, &lineno, &fatal, &bad);
       start = lineno) {
    char *where = g_strdup_printf ("line %ld", start);
    guint need = (guint) MAX (col[0], MAX (col[1], col[2])) + 1;
    if (fatal)
      ok = fail (error, "%s: %s: %s", c->path, where, fatal);
    else if (bad)
      count_bad (c, where, bad);
    else if (row->len == 1 && !*(char *) g_ptr_array_index (row, 0))
      ;   /* a blank line */
    else if (row->len < need)
      count_bad (c, where, "fewer fields than the header");
    else {
      char *id = col[2] >= 0 ? g_strdup (g_ptr_array_index (row, col[2])) : g_strdup_printf ("%s:%ld", c->path, start);
      ok = emit (c, TRUE, id, g_ptr_array_index (row, col[0]), g_ptr_array_index (row, col[1]), where, error);
      g_free (id);
    }
    g_free (where);
  }
  g_ptr_array_unref (row);
  return ok;
}

/* ---- the command ---- */

static Format
format_of (const char *path, const char *opt)
{
  const char *name = opt ? opt : path;
  if (opt ? strcmp (name, "see-bin") == 0 : g_str_has_suffix (name, ".bin"))
    return FMT_SEE_BIN;
  if (opt ? strcmp (name, "jsonl") == 0 : g_str_has_suffix (name, ".jsonl") || g_str_has_suffix (name, ".json"))
    return FMT_JSONL;
  if (opt ? strcmp (name, "csv") == 0 : g_str_has_suffix (name, ".csv"))
    return FMT_CSV;
  return FMT_AUTO;
}

/* One input read through c: its records written, its skips counted. */
static gboolean
convert_stream (Conv *c, FILE *f, const char *path, Format fmt, GError **error)
{
  c->path = path;
  c->n_bad = 0;
  g_clear_pointer (&c->first_bad, g_free);
  gboolean ok = fmt == FMT_SEE_BIN ? read_see_bin (c, f, error)
              : fmt == FMT_JSONL   ? read_jsonl (c, f, error)
                                   : read_csv (c, f, error);
  if (ok && ferror (f))
    ok = fail (error, "%s: read error: %s", path, g_strerror (errno));
  return ok;
}

gboolean
psm_convert_stream (FILE *in, const char *name, const char *format, FILE *out, long *records, GError **error)
{
  Conv c = { out, -1, 0, 0, NULL, 0, NULL, g_string_new (NULL), g_string_new (NULL) };
  Format fmt = format_of (NULL, format);
  gboolean ok = fmt != FMT_AUTO ? convert_stream (&c, in, name, fmt, error) : fail (error, "%s: no such format", format);
  *records = c.n_out;
  g_free (c.first_bad);
  g_string_free (c.rec, TRUE);
  g_string_free (c.line, TRUE);
  return ok;
}

static gboolean
convert_file (Conv *c, const char *path, Format fmt, GError **error)
{
  FILE *f = fopen (path, "rb");
  if (!f)
    return fail (error, "%s: cannot read: %s", path, g_strerror (errno));
  long before = c->n_out;
  gboolean ok = convert_stream (c, f, path, fmt, error);
  fclose (f);
  if (ok && c->n_bad)
    fprintf (stderr, "psm-run convert: %s: %ld records, skipped %ld (first: %s)\n", path, c->n_out - before,
             c->n_bad, c->first_bad);
  else if (ok)
    fprintf (stderr, "psm-run convert: %s: %ld records\n", path, c->n_out - before);
  return ok;
}

static char *opt_output, *opt_format, *opt_tokenize;
static gint64 opt_max;
static GOptionEntry convert_entries[] = {
  { "output", 'o', 0, G_OPTION_ARG_FILENAME, &opt_output, "write to FILE (default: standard output); never "
    "overwrites one", "FILE" },
  { "format", 'f', 0, G_OPTION_ARG_STRING, &opt_format, "see-bin, jsonl or csv (default: by extension: .bin; "
    ".jsonl or .json; .csv)", "FORMAT" },
  { "tokenize", 't', 0, G_OPTION_ARG_STRING, &opt_tokenize, "yes, no or auto (default: jsonl and csv yes, "
    "See's .bin no: it is tokenised)", "WHEN" },
  { "max", 'n', 0, G_OPTION_ARG_INT64, &opt_max, "stop after N records (default 0: all)", "N" },
  { NULL }
};

/* The output: standard output, or a temporary file beside FILE. */
static FILE *
open_output (char **tmp, GError **error)
{
  *tmp = NULL;
  if (!opt_output || strcmp (opt_output, "-") == 0)
    return stdout;
  if (g_file_test (opt_output, G_FILE_TEST_EXISTS)) {
    fail (error, "%s: exists; psm-run convert never overwrites a file", opt_output);
    return NULL;
  }
  *tmp = g_strdup_printf ("%s.tmp.XXXXXX", opt_output);
  int fd = g_mkstemp (*tmp);
  FILE *f = fd >= 0 ? fdopen (fd, "w") : NULL;
  if (!f) {
    fail (error, "%s: cannot write: %s", opt_output, g_strerror (errno));
    if (fd >= 0)
      close (fd);
    g_clear_pointer (tmp, g_free);
  }
  return f;
}

/* Links the finished temporary file in as FILE (link: an existing FILE,
 * made meanwhile, is kept) or removes it. */
static gboolean
close_output (FILE *out, char *tmp, gboolean ok, GError **error)
{
  if (!tmp)
    return fflush (out) == 0 ? ok : ok && fail (error, "cannot write the output: %s", g_strerror (errno));
  if (ok && (fflush (out) != 0 || fsync (fileno (out)) != 0))
    ok = fail (error, "%s: cannot write: %s", opt_output, g_strerror (errno));
  fclose (out);
  if (ok && link (tmp, opt_output) != 0)
    ok = fail (error, "%s: cannot create: %s", opt_output, g_strerror (errno));
  unlink (tmp);
  g_free (tmp);
  return ok;
}

int
psm_convert_main (int argc, char **argv)
{
  if (!psm_tool_options ("convert", "INPUT... — CNN/DailyMail data as the cnndm task's jsonl",
    "Converts See et al.'s finished_files/*.bin (length-prefixed tf.Example records) and the Hugging Face\n"
    "cnn_dailymail dataset exported as JSON lines or CSV (article, highlights, id) into one\n"
    "{\"id\", \"article\", \"highlights\"} object a line, the texts tokenised and lower-cased as psm's\n"
    "cnndm pipelines expect, the highlights one sentence a line. Inputs are read in the order given.\n"
    "Then: psm-run PIPELINE --set task.train=train.jsonl --set task.valid=valid.jsonl\n",
    convert_entries, &argc, &argv))
    return 2;
  Conv c = { NULL, -1, opt_max, 0, NULL, 0, NULL, g_string_new (NULL), g_string_new (NULL) };
  int rc = 2;
  if (argc < 2 || opt_max < 0)
    fprintf (stderr, "psm-run convert: expected one input file or more%s (try psm-run convert --help)\n",
             opt_max < 0 ? " and --max 0 or more" : "");
  else if (opt_tokenize && strcmp (opt_tokenize, "yes") && strcmp (opt_tokenize, "no") && strcmp (opt_tokenize, "auto"))
    fprintf (stderr, "psm-run convert: --tokenize %s: expected yes, no or auto\n", opt_tokenize);
  else if (opt_format && format_of (NULL, opt_format) == FMT_AUTO)
    fprintf (stderr, "psm-run convert: --format %s: expected see-bin, jsonl or csv\n", opt_format);
  else
    rc = 0;
  for (int i = 1; rc == 0 && i < argc; i++)
    if (format_of (argv[i], opt_format) == FMT_AUTO) {
      fprintf (stderr, "psm-run convert: %s: say its format with --format (its name ends in none of .bin, .jsonl, "
               ".json, .csv)\n", argv[i]);
      rc = 2;
    }
  if (rc == 0) {
    GError *e = NULL;
    char *tmp;
    c.tokenize = !opt_tokenize || strcmp (opt_tokenize, "auto") == 0 ? -1 : strcmp (opt_tokenize, "yes") == 0;
    c.out = open_output (&tmp, &e);
    gboolean ok = c.out != NULL;
    for (int i = 1; ok && i < argc && (c.max <= 0 || c.n_out < c.max); i++)
      ok = convert_file (&c, argv[i], format_of (argv[i], opt_format), &e);
    if (c.out)
      ok = close_output (c.out, tmp, ok, &e);
    if (ok && c.n_out == 0)
      ok = fail (&e, "no record converted%s", opt_output ? " (no output file written)" : "");
    if (!ok) {
      fprintf (stderr, "psm-run convert: %s\n", e->message);
      g_error_free (e);
      rc = 1;
    } else {
      fprintf (stderr, "psm-run convert: %ld records written to %s\n", c.n_out, opt_output ? opt_output : "standard output");
    }
  }
  g_free (c.first_bad);
  g_string_free (c.rec, TRUE);
  g_string_free (c.line, TRUE);
  return rc;
}
