/* psm-request.c — the body of psm-run serve's POST /summarize, checked:
 * a JSON object {"text": string, "beam": int, "min_len": int, "max_len":
 * int}, text required and not blank, no other field, integers in range.
 * Apart from the server so that fuzz/psm-fuzz.c can drive it. */
#include "config.h"
#include <string.h>
#include <json-glib/json-glib.h>
#include "psm-tools.h"

#define BLANKS " \t\r\n"

/* Past the closing quote of the string that opens at c; NULL if it does
 * not close before end, or (*bad set) at an escape JSON does not have: a
 * backslash takes one of "\\/bfnrt, or u and four hex digits. (json-glib
 * 1.6 reads "\u0" followed by a quote as an escape and goes on inside the
 * string, so a scanner lenient there ended the string where json-glib did
 * not; found by the view_record fuzzer.) \u0000 counts as bad too: the
 * text after it would be lost silently (issue 58). */
static const char *
string_end (const char *c, const char *end, gboolean *bad)
{
  for (c++; c < end && *c; c++) {
    if (*c == '"')
      return c + 1;
    if (*c != '\\')
      continue;
    if (++c == end || !*c)
      return NULL;
    if (*c == 'u') {
      const char *u = c + 1;
      for (int i = 0; i < 4; i++)
        if (++c == end || !g_ascii_isxdigit (*c)) {
          *bad = c < end && *c;
          return NULL;
        }
      if (strncmp (u, "0000", 4) == 0) {   /* NUL: json-glib's C strings would end there, dropping the rest */
        *bad = TRUE;
        return NULL;
      }
    } else if (!strchr ("\"\\/bfnrt", *c)) {
      *bad = TRUE;
      return NULL;
    }
  }
  return NULL;
}

/* Past the first value of text; NULL where it does not end, with *bad set
 * at a bad escape and *deep when it nests more than max_depth arrays and
 * objects (0: no bound). */
static const char *
first_value_end (const char *text, gsize len, int max_depth, gboolean *bad, gboolean *deep)
{
  const char *c = text, *end = text + len;
  *bad = *deep = FALSE;
  while (c < end && *c && strchr (BLANKS, *c))
    c++;
  if (c == end || !*c)
    return NULL;
  if (*c == '"')
    return string_end (c, end, bad);
  if (*c == '{' || *c == '[') {
    int depth = 0;
    while (c < end && *c) {
      if (*c == '"') {
        if (!(c = string_end (c, end, bad)))
          return NULL;
        continue;
      }
      if (*c == '{' || *c == '[') {
        if (++depth > max_depth && max_depth > 0) {
          *deep = TRUE;
          return NULL;
        }
      } else if ((*c == '}' || *c == ']') && --depth == 0)
        return c + 1;
      c++;
    }
    return NULL;
  }
  while (c < end && *c && !strchr (BLANKS "{}[]\",:", *c))
    c++;
  return c;
}

const char *
psm_json_first_value_end (const char *text, gsize len)
{
  gboolean bad, deep;
  return first_value_end (text, len, 0, &bad, &deep);
}

PsmJsonShape
psm_json_shape (const char *text, gsize len, int max_depth)
{
  gboolean bad, deep;
  const char *c = first_value_end (text, len, max_depth, &bad, &deep), *end = text + len;
  if (deep)
    return PSM_JSON_TOO_DEEP;
  if (bad)
    return PSM_JSON_BAD_ESCAPE;
  while (c && c < end && *c && strchr (BLANKS, *c))
    c++;
  return !c || c == end || !*c ? PSM_JSON_ONE_VALUE : PSM_JSON_TRAILING_TEXT;
}

const char *
psm_json_shape_message (PsmJsonShape shape)
{
  switch (shape) {
  case PSM_JSON_TRAILING_TEXT:
    return "text follows its first value";
  case PSM_JSON_TOO_DEEP:
    return "arrays and objects nested deeper than this reader takes";
  case PSM_JSON_BAD_ESCAPE:
    return "a string escape JSON does not have (a backslash takes one of \"\\/bfnrt, or u and four hex digits), "
           "or \\u0000 (a NUL character, which psm's strings cannot hold)";
  default:
    return "one JSON value";
  }
}

/* An integer member within [lo, hi], or the default; FALSE with a message. */
static gboolean
int_member (JsonObject *o, const char *name, int lo, int hi, int *v, char **why)
{
  if (!json_object_has_member (o, name))
    return TRUE;
  JsonNode *n = json_object_get_member (o, name);
  if (!JSON_NODE_HOLDS_VALUE (n) || json_node_get_value_type (n) != G_TYPE_INT64) {
    *why = g_strdup_printf ("\"%s\" must be an integer", name);
    return FALSE;
  }
  gint64 x = json_node_get_int (n);
  if (x < lo || x > hi) {
    *why = g_strdup_printf ("\"%s\" = %" G_GINT64_FORMAT " is outside [%d, %d]", name, x, lo, hi);
    return FALSE;
  }
  *v = (int) x;
  return TRUE;
}

gboolean
psm_serve_parse_request (const char *body, gsize len, const PsmDecodeSettings *defaults, int max_beam, int max_len,
                         char **text, PsmDecodeSettings *ds, char **why)
{
  JsonParser *p = json_parser_new ();
  GError *e = NULL;
  *why = NULL;
  *text = NULL;
  *ds = *defaults;
  JsonNode *root = NULL;
  PsmJsonShape shape = psm_json_shape (body, len, PSM_REQUEST_MAX_DEPTH);
  if (shape != PSM_JSON_ONE_VALUE) {
    *why = g_strdup_printf ("the body must be one JSON object: {\"text\": \"...\"}; %s", psm_json_shape_message (shape));
  } else if (!json_parser_load_from_data (p, body, (gssize) len, &e)) {
    *why = g_strdup_printf ("the body is not JSON: %s", e->message);
    g_error_free (e);
  } else if (!(root = json_parser_get_root (p)) || !JSON_NODE_HOLDS_OBJECT (root)) {
    *why = g_strdup ("the body must be a JSON object: {\"text\": \"...\"}");
  } else {
    JsonObject *o = json_node_get_object (root);
    JsonNode *t = json_object_get_member (o, "text");
    GList *members = json_object_get_members (o);
    for (GList *m = members; m && !*why; m = m->next)
      if (strcmp (m->data, "text") && strcmp (m->data, "beam") && strcmp (m->data, "min_len") &&
          strcmp (m->data, "max_len"))
        *why = g_strdup_printf ("unknown field \"%s\" (known: text, beam, min_len, max_len)", (char *) m->data);
    g_list_free (members);
    if (*why) {
      /* said */
    } else if (!t || !JSON_NODE_HOLDS_VALUE (t) || json_node_get_value_type (t) != G_TYPE_STRING) {
      *why = g_strdup ("\"text\" (a string) is required");
    } else if (int_member (o, "beam", 1, max_beam, &ds->beam, why) &&
               int_member (o, "min_len", 0, max_len, &ds->min_len, why) &&
               int_member (o, "max_len", 1, max_len, &ds->max_len, why)) {
      char *s = g_strdup (json_node_get_string (t));
      for (char *c = s; *c; c++)   /* one article a line, as --input reads them */
        if (*c == '\n' || *c == '\r' || *c == '\t')
          *c = ' ';
      if (!*g_strstrip (s)) {
        *why = g_strdup ("\"text\" is empty");
        g_free (s);
      } else if (ds->min_len > ds->max_len) {
        *why = g_strdup_printf ("min_len %d is above max_len %d", ds->min_len, ds->max_len);
        g_free (s);
      } else {
        *text = s;
      }
    }
  }
  g_object_unref (p);
  return *text != NULL;
}
