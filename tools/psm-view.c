/* psm-view.c — psm-run view: one self-contained HTML page of decoded
 * examples from the per-token JSON lines that decoding writes
 * (psm-run --mode decode --json: DIR/decode.SPLIT.jsonl). The page
 * (tools/view.html, compiled in as a GResource) shows the source with the
 * attention of the output word under the pointer, the gate per output word
 * (p_gen, the pointer softmax's shortlist probability, the copy head's
 * generation probability), copied words, coverage, read-again importance,
 * the reference and the example's ROUGE. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include "psm/psm-pipeline.h"
#include "psm/psm-plugin.h"
#include "psm/psm-metric.h"
#include "psm-resources.h"
#include "psm-tools.h"

void
psm_json_string (GString *out, const char *s)
{
  g_string_append_c (out, '"');
  for (const unsigned char *c = (const unsigned char *) s; *c; c++) {
    switch (*c) {
    case '"': g_string_append (out, "\\\""); break;
    case '\\': g_string_append (out, "\\\\"); break;
    case '\n': g_string_append (out, "\\n"); break;
    case '\r': g_string_append (out, "\\r"); break;
    case '\t': g_string_append (out, "\\t"); break;
    default:
      if (*c < 0x20)
        g_string_append_printf (out, "\\u%04x", *c);
      else
        g_string_append_c (out, (char) *c);
    }
  }
  g_string_append_c (out, '"');
}

char *
psm_json_error (const char *message)
{
  GString *s = g_string_new ("{\"error\": ");
  psm_json_string (s, message);
  g_string_append (s, "}\n");
  return g_string_free (s, FALSE);
}

gboolean
psm_tool_options (const char *name, const char *params, const char *description, GOptionEntry *entries, int *argc,
                  char ***argv)
{
  GError *e = NULL;
  GOptionContext *ctx = g_option_context_new (params);
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_set_description (ctx, description);
  gboolean parsed = g_option_context_parse (ctx, argc, argv, &e);
  g_option_context_free (ctx);
  if (!parsed) {
    fprintf (stderr, "psm-run %s: %s (try psm-run %s --help)\n", name, e->message, name);
    g_error_free (e);
  }
  return parsed;
}

char *
psm_view_page (const char *data_json, GError **error)
{
  GBytes *b = g_resources_lookup_data ("/org/psm/view.html", G_RESOURCE_LOOKUP_FLAGS_NONE, error);
  if (!b)
    return NULL;
  gsize len;
  const char *tpl = g_bytes_get_data (b, &len);
  const char *mark = g_strstr_len (tpl, (gssize) len, "/*PSM_DATA*/");
  g_assert (mark != NULL);   /* the page is compiled in: its marker is there */
  GString *page = g_string_sized_new (len + strlen (data_json) + 64);
  g_string_append_len (page, tpl, mark - tpl);
  /* '<' only occurs inside JSON strings, where \u003c means the same; so
   * no "</script>" or "<!--" in the data can end the script element */
  for (const char *c = data_json; *c; c++)
    if (*c == '<')
      g_string_append (page, "\\u003c");
    else
      g_string_append_c (page, *c);
  const char *rest = mark + strlen ("/*PSM_DATA*/");
  g_string_append_len (page, rest, (gssize) (len - (rest - tpl)));
  g_bytes_unref (b);
  return g_string_free (page, FALSE);
}

struct PsmRougeScorer {
  const PsmMetricClass *mk;
  void *metric;
  PsmSection *sec;
};

PsmRougeScorer *
psm_rouge_scorer_new (void)
{
  GError *e = NULL;
  const PsmPlugin *pl = psm_plugin_find (PSM_KIND_METRIC, "rouge", &e);
  PsmSection *sec = pl ? psm_section_from_text ("average = \"mean\";", "psm-run view", "metrics.rouge",
                                                pl->desc->params, &e) : NULL;
  const PsmMetricClass *mk = pl ? pl->desc->klass : NULL;
  void *metric = sec ? mk->create (sec, &e) : NULL;
  if (!metric || !PSM_CLASS_HOOK (mk, add_text)) {
    fprintf (stderr, "psm-run: warning: no per-example ROUGE: %s\n", e ? e->message : "the rouge plugin takes no text");
    g_clear_error (&e);
    psm_section_destroy (sec);
    return NULL;
  }
  PsmRougeScorer *r = g_new0 (PsmRougeScorer, 1);
  *r = (PsmRougeScorer) { mk, metric, sec };
  return r;
}

void
psm_rouge_scorer_free (PsmRougeScorer *r)
{
  if (!r)
    return;
  r->mk->destroy (r->metric);
  psm_section_destroy (r->sec);
  g_free (r);
}

gboolean
psm_rouge_scorer_score (PsmRougeScorer *r, const char *hyp, const char *ref, const char *src, double f[3])
{
  r->mk->reset (r->metric);
  r->mk->add_text (r->metric, hyp, ref, src);
  PsmMetricReport rep = { 0 };
  r->mk->report (r->metric, &rep);
  static const char *const names[3] = { "rouge1_f", "rouge2_f", "rougeL_f" };
  int found = 0;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < rep.n; i++)
      if (strcmp (rep.names[i], names[k]) == 0) {
        f[k] = rep.values[i];
        found++;
      }
  return found == 3;
}

/* Whether member name of o is an array of n elements of the given type
 * (n < 0: any length); absent is fine unless required. */
static const char *
check_array (JsonObject *o, const char *name, int n, GType type, gboolean required)
{
  static char why[160];
  if (!json_object_has_member (o, name)) {
    if (!required)
      return NULL;
    g_snprintf (why, sizeof why, "no \"%s\"", name);
    return why;
  }
  JsonNode *node = json_object_get_member (o, name);
  if (!JSON_NODE_HOLDS_ARRAY (node)) {
    g_snprintf (why, sizeof why, "\"%s\" is not a list", name);
    return why;
  }
  JsonArray *a = json_node_get_array (node);
  if (n >= 0 && (int) json_array_get_length (a) != n) {
    g_snprintf (why, sizeof why, "\"%s\" has %u entries, expected %d", name, json_array_get_length (a), n);
    return why;
  }
  for (guint i = 0; i < json_array_get_length (a); i++) {
    JsonNode *el = json_array_get_element (a, i);
    gboolean good = type == G_TYPE_STRING ? JSON_NODE_HOLDS_VALUE (el) && json_node_get_value_type (el) == G_TYPE_STRING
                    : type == G_TYPE_DOUBLE ? JSON_NODE_HOLDS_NULL (el) || (JSON_NODE_HOLDS_VALUE (el) &&
                                              (json_node_get_value_type (el) == G_TYPE_DOUBLE ||
                                               json_node_get_value_type (el) == G_TYPE_INT64))
                    : type == G_TYPE_BOOLEAN ? JSON_NODE_HOLDS_VALUE (el) && json_node_get_value_type (el) == G_TYPE_BOOLEAN
                    : JSON_NODE_HOLDS_ARRAY (el);
    if (!good) {
      g_snprintf (why, sizeof why, "\"%s\"[%u] is not a %s", name, i,
                  type == G_TYPE_STRING ? "string" : type == G_TYPE_DOUBLE ? "number" :
                  type == G_TYPE_BOOLEAN ? "boolean" : "list");
      return why;
    }
  }
  return NULL;
}

static JsonObject *
parse_record (JsonParser *p, const char *line, char **why)
{
  GError *e = NULL;
  /* (json-glib would take "{...}{}" for its first value and lose the second) */
  if (line[strspn (line, " \t\r\n")] != '{') {
    *why = g_strdup ("not a JSON object");
    return NULL;
  }
  PsmJsonShape shape = psm_json_shape (line, strlen (line), PSM_JSON_MAX_DEPTH);
  if (shape != PSM_JSON_ONE_VALUE) {
    *why = g_strdup (shape == PSM_JSON_TRAILING_TEXT ? "text after the record's closing brace"
                                                     : psm_json_shape_message (shape));
    return NULL;
  }
  if (!json_parser_load_from_data (p, line, -1, &e)) {
    *why = g_strdup_printf ("not JSON: %s", e->message);
    g_error_free (e);
    return NULL;
  }
  if (!psm_json_first_value_end (line, strlen (line))) {   /* json-glib took what does not close as JSON */
    *why = g_strdup ("not JSON: the record does not close");
    return NULL;
  }
  JsonObject *o = json_node_get_object (json_parser_get_root (p));   /* (an object: it starts with '{') */
  const char *bad = check_array (o, "tokens", -1, G_TYPE_STRING, TRUE);
  bad = bad ? bad : check_array (o, "source", -1, G_TYPE_STRING, TRUE);
  int nt = bad ? 0 : (int) json_array_get_length (json_object_get_array_member (o, "tokens"));
  int ns = bad ? 0 : (int) json_array_get_length (json_object_get_array_member (o, "source"));
  bad = bad ? bad : check_array (o, "p_gen", nt, G_TYPE_DOUBLE, FALSE);
  bad = bad ? bad : check_array (o, "copied", nt, G_TYPE_BOOLEAN, FALSE);
  bad = bad ? bad : check_array (o, "attention_weights", -1, G_TYPE_NONE, FALSE);
  bad = bad ? bad : check_array (o, "attention", -1, G_TYPE_NONE, FALSE);
  bad = bad ? bad : check_array (o, "coverage", ns, G_TYPE_DOUBLE, FALSE);
  bad = bad ? bad : check_array (o, "importance", ns, G_TYPE_DOUBLE, FALSE);
  if (!bad && json_object_has_member (o, "attention_weights")) {
    /* [[position, weight], ...] per token, positions inside the source */
    JsonArray *aw = json_object_get_array_member (o, "attention_weights");
    if ((int) json_array_get_length (aw) > nt)
      bad = "\"attention_weights\" has more lists than there are tokens";
    for (guint i = 0; !bad && i < json_array_get_length (aw); i++) {
      JsonArray *pairs = json_array_get_array_element (aw, i);
      for (guint j = 0; !bad && j < json_array_get_length (pairs); j++) {
        JsonNode *pw = json_array_get_element (pairs, j);
        JsonArray *a = JSON_NODE_HOLDS_ARRAY (pw) ? json_node_get_array (pw) : NULL;
        if (!a || json_array_get_length (a) != 2 || json_node_get_value_type (json_array_get_element (a, 0)) != G_TYPE_INT64 ||
            json_array_get_int_element (a, 0) < 0 || json_array_get_int_element (a, 0) >= ns)
          bad = "\"attention_weights\" holds something other than [source position, weight] pairs";
      }
    }
  }
  if (!bad && json_object_has_member (o, "reference")) {
    JsonNode *r = json_object_get_member (o, "reference");
    if (!JSON_NODE_HOLDS_VALUE (r) || json_node_get_value_type (r) != G_TYPE_STRING)
      bad = "\"reference\" is not a string";
  }
  if (bad) {
    *why = g_strdup (bad);
    return NULL;
  }
  return o;
}

static char *
join_strings (JsonArray *a, const char *sep)
{
  GString *s = g_string_new (NULL);
  for (guint i = 0; i < json_array_get_length (a); i++)
    g_string_append_printf (s, "%s%s", i ? sep : "", json_array_get_string_element (a, i));
  return g_string_free (s, FALSE);
}

char *
psm_view_record (const char *line, PsmRougeScorer *r, double sum[3], int *n, char **why)
{
  JsonParser *p = json_parser_new ();
  JsonObject *o = parse_record (p, line, why);
  if (!o) {
    g_object_unref (p);
    return NULL;
  }
  char *out = NULL;
  const char *end = psm_json_first_value_end (line, strlen (line)) - 1;   /* its closing brace */
  if (r && json_object_has_member (o, "reference")) {
    char *hyp = join_strings (json_object_get_array_member (o, "tokens"), " ");
    char *src = join_strings (json_object_get_array_member (o, "source"), " ");
    double f[3];
    if (psm_rouge_scorer_score (r, hyp, json_object_get_string_member (o, "reference"), src, f)) {
      out = g_strdup_printf ("%.*s, \"rouge\": {\"rouge1_f\": %.4g, \"rouge2_f\": %.4g, \"rougeL_f\": %.4g}}",
                             (int) (end - line), line, f[0], f[1], f[2]);
      for (int k = 0; k < 3; k++)
        sum[k] += f[k];
      (*n)++;
    }
    g_free (hyp);
    g_free (src);
  }
  g_object_unref (p);
  return out ? out : g_strdup (line);
}

/* A language model's per-word records (psm-run --mode decode of an lm
 * pipeline: "index TAB word TAB log p TAB gate" a line, the gate "-" for a
 * head without one) as pages of 100 words each: tokens, logp, p_gen (the
 * pointer sentinel's gate g, the vocabulary softmax's share) and the
 * page's perplexity. FALSE with why at the first malformed line. */
static gboolean
lm_records (char *text, const char *file, int max_pages, GString *ex, int *n_pages, double *nll, long *words,
            char **why)
{
  enum { PAGE = 100 };
  GString *tok = g_string_new (NULL), *lp = g_string_new (NULL), *gate = g_string_new (NULL);
  int in_page = 0, lineno = 0, first = -1;
  double page_nll = 0.0;
  gboolean ok = TRUE;
  char *line = text, *next;
  for (; line && *line && ok; line = next) {
    lineno++;
    next = strchr (line, '\n');
    if (next)
      *next++ = '\0';
    if (!*line)
      continue;
    char **f = g_strsplit (line, "\t", -1);
    char *end1 = NULL, *end2 = NULL, *end3 = NULL;
    long idx = g_strv_length (f) == 4 ? strtol (f[0], &end1, 10) : -1;
    double logp = idx >= 0 ? g_ascii_strtod (f[2], &end2) : 0.0;
    double g = idx >= 0 && strcmp (f[3], "-") ? g_ascii_strtod (f[3], &end3) : NAN;
    if (idx < 0 || *end1 || !end2 || *end2 || (end3 && *end3) || logp > 0.0) {
      *why = g_strdup_printf ("%s:%d: expected \"index TAB word TAB log p TAB gate\" (a language model's "
                              "psm-run --mode decode output)", file, lineno);
      ok = FALSE;
    } else if (max_pages == 0 || *n_pages < max_pages) {
      if (in_page == 0)
        first = (int) idx;
      g_string_append (tok, in_page ? ", " : "");
      psm_json_string (tok, f[1]);
      g_string_append_printf (lp, "%s%.4f", in_page ? ", " : "", logp);
      if (isfinite (g))
        g_string_append_printf (gate, "%s%.4f", in_page ? ", " : "", g);
      else
        g_string_append_printf (gate, "%snull", in_page ? ", " : "");
      page_nll -= logp;
      *nll -= logp;
      (*words)++;
      if (++in_page == PAGE || !next || !*next) {
        g_string_append_printf (ex, "%s{\"example\": %d, \"head\": \"lm\", \"lm\": true, \"perplexity\": %.4g, "
                                "\"tokens\": [%s], \"logp\": [%s], \"p_gen\": [%s]}", (*n_pages)++ ? ",\n" : "", first,
                                exp (page_nll / in_page), tok->str, lp->str, gate->str);
        g_string_truncate (tok, 0);
        g_string_truncate (lp, 0);
        g_string_truncate (gate, 0);
        in_page = 0;
        page_nll = 0.0;
      }
    }
    g_strfreev (f);
  }
  g_string_free (tok, TRUE);
  g_string_free (lp, TRUE);
  g_string_free (gate, TRUE);
  return ok;
}

/* Whether the first line of a file reads "index TAB word TAB log p TAB gate". */
static gboolean
is_lm_output (const char *path)
{
  FILE *f = fopen (path, "r");
  char buf[4096];
  gboolean yes = f && fgets (buf, sizeof buf, f) && g_ascii_isdigit (buf[0]) && strchr (buf, '\t');
  if (yes) {
    char **fl = g_strsplit (g_strchomp (buf), "\t", -1);
    yes = g_strv_length (fl) == 4;
    g_strfreev (fl);
  }
  if (f)
    fclose (f);
  return yes;
}

static gchar *opt_output;
static gint opt_examples = 100;
static gchar *opt_split;
static GOptionEntry view_entries[] = {
  { "output", 'o', 0, G_OPTION_ARG_FILENAME, &opt_output,
    "The page to write (default: DIR/view.SPLIT.html, or FILE.html beside FILE.jsonl)", "PAGE.html" },
  { "examples", 'n', 0, G_OPTION_ARG_INT, &opt_examples, "The first N examples (default 100; 0: all)", "N" },
  { "split", 0, 0, G_OPTION_ARG_STRING, &opt_split, "With a run folder: decode.SPLIT.jsonl (default test)", "SPLIT" },
  { NULL }
};

int
psm_view_main (int argc, char **argv)
{
  GError *e = NULL;
  if (!psm_tool_options ("view", "RUN_DIR|DECODE.jsonl — an HTML page of decoded examples",
    "Reads the per-token JSON lines of psm-run --mode decode --json (RUN_DIR/decode.SPLIT.jsonl; a language\n"
    "model's run: decode.SPLIT.txt) and writes one self-contained page: the source with the attention of the\n"
    "output word under the pointer, the gate and copies per output word, coverage, read-again weights, the\n"
    "reference and per-example ROUGE.\n", view_entries, &argc, &argv))
    return 2;
  if (argc != 2 || opt_examples < 0) {
    fprintf (stderr, "psm-run view: expected one run folder or .jsonl file%s (try psm-run view --help)\n",
             opt_examples < 0 ? " and --examples 0 or more" : "");
    return 2;
  }
  const char *split = opt_split ? opt_split : "test";
  if (strcmp (split, "test") && strcmp (split, "valid")) {
    fprintf (stderr, "psm-run view: --split %s: expected valid or test\n", split);
    return 2;
  }
  char *in, *out;
  if (g_file_test (argv[1], G_FILE_TEST_IS_DIR)) {
    char *name = g_strdup_printf ("decode.%s.jsonl", split), *page = g_strdup_printf ("view.%s.html", split);
    in = g_build_filename (argv[1], name, NULL);
    char *txt = g_strdup_printf ("%.*s.txt", (int) strlen (in) - 6, in);
    if (!g_file_test (in, G_FILE_TEST_EXISTS) && g_file_test (txt, G_FILE_TEST_EXISTS) && is_lm_output (txt)) {
      g_free (in);   /* a language model's run: its per-word records */
      in = g_strdup (txt);
    }
    g_free (txt);
    out = opt_output ? g_strdup (opt_output) : g_build_filename (argv[1], page, NULL);
    g_free (name);
    g_free (page);
  } else {
    in = g_strdup (argv[1]);
    out = opt_output ? g_strdup (opt_output)
                     : g_strdup_printf ("%.*s.html", (int) (strlen (in) - (g_str_has_suffix (in, ".jsonl") ? 6 :
                                                                            g_str_has_suffix (in, ".txt") ? 4 : 0)), in);
  }
  char *text = NULL;
  int rc = 0;
  if (!g_file_get_contents (in, &text, NULL, &e)) {
    fprintf (stderr, "psm-run view: %s%s\n", e->message,
             g_file_test (argv[1], G_FILE_TEST_IS_DIR) ? " (decode with --json first: psm-run PIPELINE.cfg --mode "
                                                          "decode --json)" : "");
    g_error_free (e);
    g_free (in);
    g_free (out);
    return 1;
  }
  gboolean lm = is_lm_output (in);
  PsmRougeScorer *rouge = lm ? NULL : psm_rouge_scorer_new ();
  GString *ex = g_string_new (NULL);
  double sum[3] = { 0, 0, 0 }, nll = 0.0;
  long words = 0;
  int n = 0, n_rouge = 0, lineno = 0;
  char *line = text, *next;
  if (lm) {
    char *why = NULL;
    if (!lm_records (text, in, opt_examples, ex, &n, &nll, &words, &why)) {
      fprintf (stderr, "psm-run view: %s\n", why);
      g_free (why);
      rc = 1;
    }
    line = NULL;
  }
  for (; line && *line && (opt_examples == 0 || n < opt_examples); line = next) {
    lineno++;
    next = strchr (line, '\n');
    if (next)
      *next++ = '\0';
    if (!*g_strstrip (line))
      continue;
    char *why = NULL, *rec = psm_view_record (line, rouge, sum, &n_rouge, &why);
    if (!rec) {
      fprintf (stderr, "psm-run view: %s:%d: %s (a line of psm-run --mode decode --json output was expected)\n", in,
               lineno, why);
      g_free (why);
      rc = 1;
      break;
    }
    g_string_append (ex, n++ ? ",\n" : "");
    g_string_append (ex, rec);
    g_free (rec);
  }
  if (rc == 0 && n == 0) {
    fprintf (stderr, "psm-run view: %s: no decoded examples\n", in);
    rc = 1;
  }
  if (rc == 0) {
    GString *data = g_string_new ("{\"mode\": \"file\", \"title\": ");
    char *title = g_strdup_printf ("psm view — %s", in);
    psm_json_string (data, title);
    g_free (title);
    char *summary = lm ? g_strdup_printf ("%ld words in %d pages of 100 · perplexity %.2f", words, n, exp (nll / MAX (words, 1)))
                    : n_rouge ? g_strdup_printf ("%d example%s · mean ROUGE-1/2/L F1 %.2f / %.2f / %.2f", n,
                                               n == 1 ? "" : "s", sum[0] / n_rouge, sum[1] / n_rouge, sum[2] / n_rouge)
                            : g_strdup_printf ("%d example%s", n, n == 1 ? "" : "s");
    g_string_append (data, ", \"summary\": ");
    psm_json_string (data, summary);
    g_string_append_printf (data, ", \"examples\": [\n%s\n]}", ex->str);
    char *page = psm_view_page (data->str, &e);
    /* g_file_set_contents: a temporary file renamed over the page, so a
     * failed write leaves no half page */
    if (!page || !g_file_set_contents (out, page, -1, &e)) {
      fprintf (stderr, "psm-run view: %s\n", e->message);
      g_clear_error (&e);
      rc = 1;
    } else {
      printf ("%s: %s\n", out, summary);
    }
    g_free (page);
    g_free (summary);
    g_string_free (data, TRUE);
  }
  g_string_free (ex, TRUE);
  psm_rouge_scorer_free (rouge);
  g_free (text);
  g_free (in);
  g_free (out);
  return rc;
}
