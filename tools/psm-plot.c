/* psm-plot.c — psm-run plot: learning curves of one or several runs from
 * their log.jsonl, drawn as one plain SVG file (no library: the figure is
 * lines, ticks and text, and SVG opens in every browser and converts with
 * rsvg-convert or inkscape where a PNG is needed). Panel one: training
 * loss (solid) and validation loss (dashed) against updates; then one
 * panel per validation metric (ROUGE, perplexity, error rate, ...), up to
 * eight. One colour per run. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <json-glib/json-glib.h>
#include "psm-tools.h"

typedef struct {
  char *name;             /* "loss (train)", "rouge1_f", ... */
  GArray *x, *y;          /* double */
  gboolean dashed;
} Series;

typedef struct {
  char *label;            /* the run folder */
  GPtrArray *series;      /* Series* */
  GArray *restarts;       /* double: updates where a process took over (a second phase, --resume) */
  char *test;             /* the last test record's first metrics, or NULL */
} Run;

static Series *
series_get (Run *r, const char *name, gboolean dashed)
{
  for (guint i = 0; i < r->series->len; i++) {
    Series *s = g_ptr_array_index (r->series, i);
    if (strcmp (s->name, name) == 0)
      return s;
  }
  Series *s = g_new0 (Series, 1);
  s->name = g_strdup (name);
  s->x = g_array_new (FALSE, FALSE, sizeof (double));
  s->y = g_array_new (FALSE, FALSE, sizeof (double));
  s->dashed = dashed;
  g_ptr_array_add (r->series, s);
  return s;
}

static void
series_free (gpointer p)
{
  Series *s = p;
  g_free (s->name);
  g_array_unref (s->x);
  g_array_unref (s->y);
  g_free (s);
}

static void
add_point (Run *r, const char *name, gboolean dashed, double x, double y)
{
  if (!isfinite (y))
    return;
  Series *s = series_get (r, name, dashed);
  g_array_append_val (s->x, x);
  g_array_append_val (s->y, y);
}

/* Whether a member is there and a number; a number member or def. */
static gboolean
is_number (JsonNode *v)
{
  return v && JSON_NODE_HOLDS_VALUE (v) &&
         (json_node_get_value_type (v) == G_TYPE_DOUBLE || json_node_get_value_type (v) == G_TYPE_INT64);
}

static double
member_number (JsonObject *o, const char *name, double def)
{
  JsonNode *v = json_object_get_member (o, name);
  return is_number (v) ? json_node_get_double (v) : def;
}

/* Reads RUN/log.jsonl: train and valid records (events and test records
 * are skipped). */
static gboolean
read_run (const char *dir, Run *r, GError **error)
{
  char *path = g_str_has_suffix (dir, ".jsonl") ? g_strdup (dir) : g_build_filename (dir, "log.jsonl", NULL);
  char *text = NULL;
  if (!g_file_get_contents (path, &text, NULL, error)) {
    g_free (path);
    return FALSE;
  }
  r->label = g_strdup (dir);
  r->series = g_ptr_array_new_with_free_func (series_free);
  r->restarts = g_array_new (FALSE, FALSE, sizeof (double));
  double last_time = -1.0, last_step = 0.0;
  JsonParser *p = json_parser_new ();
  char **lines = g_strsplit (text, "\n", -1);
  gboolean ok = TRUE;
  for (int i = 0; ok && lines[i]; i++) {
    if (!*g_strstrip (lines[i]))
      continue;
    GError *e = NULL;
    PsmJsonShape shape = psm_json_shape (lines[i], strlen (lines[i]), PSM_JSON_MAX_DEPTH);
    const char *not_one = shape != PSM_JSON_ONE_VALUE ? psm_json_shape_message (shape) : NULL;
    if (not_one || !json_parser_load_from_data (p, lines[i], -1, &e) ||
        !JSON_NODE_HOLDS_OBJECT (json_parser_get_root (p))) {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s:%d: not a JSON object%s%s", path, i + 1,
                   not_one || e ? ": " : "", not_one ? not_one : e ? e->message : "");
      g_clear_error (&e);
      ok = FALSE;
      break;
    }
    JsonObject *o = json_node_get_object (json_parser_get_root (p));
    if (!json_object_has_member (o, "step") || !json_object_has_member (o, "split"))
      continue;   /* an event (non-finite loss, ...) */
    JsonNode *sp = json_object_get_member (o, "split");
    if (!is_number (json_object_get_member (o, "step")) || !JSON_NODE_HOLDS_VALUE (sp) ||
        json_node_get_value_type (sp) != G_TYPE_STRING) {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                   "%s:%d: not a record of psm's log: \"step\" must be a number and \"split\" a string", path, i + 1);
      ok = FALSE;
      break;
    }
    double step = json_object_get_double_member (o, "step");
    const char *split = json_node_get_string (sp);
    gboolean train = strcmp (split, "train") == 0;
    if (strcmp (split, "test") == 0) {
      /* its first three metrics go into the legend */
      GString *t = g_string_new (NULL);
      GList *members = json_object_get_members (o);
      int k = 0;
      for (GList *m = members; m && k < 3; m = m->next) {
        JsonNode *v = json_object_get_member (o, m->data);
        if (strcmp (m->data, "step") && strcmp (m->data, "time") && strcmp (m->data, "loss") &&
            strcmp (m->data, "examples") && is_number (v))
          g_string_append_printf (t, "%s%s %.4g", k++ ? ", " : "", (char *) m->data, json_node_get_double (v));
      }
      g_list_free (members);
      g_free (r->test);
      r->test = k ? g_strdup_printf ("test at update %g (%g examples): %s", step,
                                     member_number (o, "examples", 0.0), t->str) : NULL;
      g_string_free (t, TRUE);
      continue;
    }
    if (!train && strcmp (split, "valid") != 0)
      continue;
    if (train && is_number (json_object_get_member (o, "time"))) {
      /* the clock restarts with each process: a second phase or a resume */
      double tm = json_object_get_double_member (o, "time");
      if (tm < last_time)   /* it went on from the old process's last checkpoint, at or after its last record */
        g_array_append_val (r->restarts, last_step);
      last_time = tm;
      last_step = step;
    }
    if (is_number (json_object_get_member (o, "loss")))
      add_point (r, train ? "loss (train)" : "loss (valid)", !train, step, json_object_get_double_member (o, "loss"));
    if (train)
      continue;
    GList *members = json_object_get_members (o);
    for (GList *m = members; m; m = m->next) {
      const char *k = m->data;
      JsonNode *v = json_object_get_member (o, k);
      if (strcmp (k, "step") == 0 || strcmp (k, "split") == 0 || strcmp (k, "time") == 0 ||
          strcmp (k, "loss") == 0 || strcmp (k, "examples") == 0 || !is_number (v))
        continue;
      add_point (r, k, FALSE, step, json_node_get_double (v));
    }
    g_list_free (members);
  }
  g_strfreev (lines);
  g_object_unref (p);
  g_free (text);
  if (ok && r->series->len == 0) {
    g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s: no training or validation records", path);
    ok = FALSE;
  }
  g_free (path);
  return ok;
}

/* A step of 1, 2 or 5 times a power of ten giving about n ticks. */
static double
nice_step (double range, int n)
{
  double raw = range / n, p = pow (10.0, floor (log10 (raw)));
  double f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static const char *const colours[] = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
                                       "#17becf" };

static void
xml_text (GString *s, const char *t)
{
  for (; *t; t++)
    switch (*t) {
    case '<': g_string_append (s, "&lt;"); break;
    case '>': g_string_append (s, "&gt;"); break;
    case '&': g_string_append (s, "&amp;"); break;
    case '"': g_string_append (s, "&quot;"); break;
    default: g_string_append_c (s, *t);
    }
}

/* One panel at (x0, y0), w by h: the series of every run whose name
 * starts with prefix (the loss panel: "loss (") or equals it. */
static void
panel (GString *svg, Run *runs, int n_runs, const char *title, const char *prefix, gboolean exact, double x0,
       double y0, double w, double h)
{
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int r = 0; r < n_runs; r++)
    for (guint i = 0; i < runs[r].series->len; i++) {
      Series *s = g_ptr_array_index (runs[r].series, i);
      if (exact ? strcmp (s->name, prefix) != 0 : !g_str_has_prefix (s->name, prefix))
        continue;
      for (guint k = 0; k < s->x->len; k++) {
        xmin = MIN (xmin, g_array_index (s->x, double, k));
        xmax = MAX (xmax, g_array_index (s->x, double, k));
        ymin = MIN (ymin, g_array_index (s->y, double, k));
        ymax = MAX (ymax, g_array_index (s->y, double, k));
      }
    }
  if (!isfinite (xmin))
    return;
  if (xmax <= xmin)
    xmax = xmin + 1;
  if (ymax <= ymin) {
    ymax += fabs (ymax) * 0.05 + 1e-3;
    ymin -= fabs (ymin) * 0.05 + 1e-3;
  }
  double pad = (ymax - ymin) * 0.05;
  ymin -= pad;
  ymax += pad;
  const double L = 58, R = 26, T = 26, B = 34;   /* margins */
  double pw = w - L - R, ph = h - T - B;
#define PX(x) (x0 + L + ((x) - xmin) / (xmax - xmin) * pw)
#define PY(y) (y0 + T + ph - ((y) - ymin) / (ymax - ymin) * ph)
  g_string_append_printf (svg, "<g class=\"panel\"><text x=\"%.1f\" y=\"%.1f\" class=\"title\">", x0 + L, y0 + 16);
  xml_text (svg, title);
  g_string_append (svg, "</text>\n");
  g_string_append_printf (svg, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", x0 + L,
                          y0 + T, pw, ph);
  double ys = nice_step (ymax - ymin, 5), xs = nice_step (xmax - xmin, 6);
  for (double y = ceil (ymin / ys) * ys; y <= ymax + 1e-9 * ys; y += ys)
    g_string_append_printf (svg, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                            "<text x=\"%.1f\" y=\"%.1f\" class=\"ytick\">%g</text>\n",
                            x0 + L, x0 + L + pw, PY (y), PY (y), x0 + L - 4, PY (y) + 4, fabs (y) < ys * 1e-6 ? 0.0 : y);
  for (double x = ceil (xmin / xs) * xs; x <= xmax + 1e-9 * xs; x += xs)
    g_string_append_printf (svg, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
                            "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">%g</text>\n",
                            PX (x), PX (x), y0 + T, y0 + T + ph, PX (x), y0 + T + ph + 14, x);
  g_string_append_printf (svg, "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">updates</text>\n", x0 + L + pw / 2,
                          y0 + h - 4);
  for (int r = 0; r < n_runs; r++)
    for (guint k = 0; k < runs[r].restarts->len; k++) {
      double x = g_array_index (runs[r].restarts, double, k);
      g_string_append_printf (svg, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"restart\" "
                              "stroke=\"%s\"><title>a new process from here: a second phase or --resume</title></line>\n",
                              PX (x), PX (x), y0 + T, y0 + T + ph, colours[r % G_N_ELEMENTS (colours)]);
    }
  for (int r = 0; r < n_runs; r++)
    for (guint i = 0; i < runs[r].series->len; i++) {
      Series *s = g_ptr_array_index (runs[r].series, i);
      if (exact ? strcmp (s->name, prefix) != 0 : !g_str_has_prefix (s->name, prefix))
        continue;
      g_string_append_printf (svg, "<polyline class=\"curve\" stroke=\"%s\"%s data-run=\"%d\" data-series=\"",
                              colours[r % G_N_ELEMENTS (colours)], s->dashed ? " stroke-dasharray=\"6 3\"" : "", r);
      xml_text (svg, s->name);
      g_string_append (svg, "\" points=\"");
      for (guint k = 0; k < s->x->len; k++)
        g_string_append_printf (svg, "%s%.1f,%.1f", k ? " " : "", PX (g_array_index (s->x, double, k)),
                                PY (g_array_index (s->y, double, k)));
      g_string_append (svg, "\"/>\n");
      if (s->x->len == 1)   /* one point: a dot */
        g_string_append_printf (svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                                PX (g_array_index (s->x, double, 0)), PY (g_array_index (s->y, double, 0)),
                                colours[r % G_N_ELEMENTS (colours)]);
    }
  g_string_append (svg, "</g>\n");
#undef PX
#undef PY
}

static gchar *opt_output;
static GOptionEntry plot_entries[] = {
  { "output", 'o', 0, G_OPTION_ARG_FILENAME, &opt_output,
    "The SVG file to write (default: RUN/curves.svg for one run, curves.svg for several)", "FILE.svg" },
  { NULL }
};

int
psm_plot_main (int argc, char **argv)
{
  GError *e = NULL;
  if (!psm_tool_options ("plot", "RUN_DIR [RUN_DIR...] — learning curves as SVG",
    "Reads each run's log.jsonl and draws training loss (solid) and validation loss (dashed), then one\n"
    "panel per validation metric, one colour per run, into one SVG file.\n", plot_entries, &argc, &argv))
    return 2;
  if (argc < 2) {
    fprintf (stderr, "psm-run plot: expected one run folder or more (try psm-run plot --help)\n");
    return 2;
  }
  int n_runs = argc - 1, rc = 0;
  Run *runs = g_new0 (Run, n_runs);
  for (int i = 0; i < n_runs && rc == 0; i++)
    if (!read_run (argv[i + 1], &runs[i], &e)) {
      fprintf (stderr, "psm-run plot: %s\n", e->message);
      g_clear_error (&e);
      rc = 1;
    }
  if (rc == 0) {
    /* the metrics, in order of first appearance */
    GPtrArray *metrics = g_ptr_array_new ();
    for (int r = 0; r < n_runs; r++)
      for (guint i = 0; i < runs[r].series->len; i++) {
        Series *s = g_ptr_array_index (runs[r].series, i);
        gboolean seen = g_str_has_prefix (s->name, "loss (");
        for (guint k = 0; !seen && k < metrics->len; k++)
          seen = strcmp (g_ptr_array_index (metrics, k), s->name) == 0;
        if (!seen && metrics->len < 8)
          g_ptr_array_add (metrics, s->name);
      }
    const double W = 460, H = 300;
    int panels = 1 + (int) metrics->len, cols = panels == 1 ? 1 : 2, rows = (panels + cols - 1) / cols;
    double legend = 22.0 * n_runs + 40;
    GString *svg = g_string_new (NULL);
    g_string_append_printf (svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
                            MAX (W * cols, 820), H * rows + legend, MAX (W * cols, 820), H * rows + legend);
    g_string_append (svg, "<style>.frame{fill:none;stroke:#999}.grid{stroke:#eee}.ytick{text-anchor:end;fill:#444}"
                          ".xtick{text-anchor:middle;fill:#444}.title{font-weight:bold;fill:#222}"
                          ".curve{fill:none;stroke-width:1.6}.restart{stroke-dasharray:2 3;opacity:.6}</style>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n");
    panel (svg, runs, n_runs, "loss (train solid, validation dashed)", "loss (", FALSE, 0, 0, W, H);
    for (guint k = 0; k < metrics->len; k++) {
      int p = (int) k + 1;
      char *title = g_strdup_printf ("%s (validation)", (char *) g_ptr_array_index (metrics, k));
      panel (svg, runs, n_runs, title, g_ptr_array_index (metrics, k), TRUE, W * (p % cols), H * (p / cols), W, H);
      g_free (title);
    }
    for (int r = 0; r < n_runs; r++) {
      double y = H * rows + 18 + 22.0 * r;
      g_string_append_printf (svg, "<line x1=\"20\" x2=\"50\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>"
                              "<text x=\"58\" y=\"%.1f\" class=\"legend\">", y, y, colours[r % G_N_ELEMENTS (colours)],
                              y + 4);
      xml_text (svg, runs[r].label);
      if (runs[r].test) {
        g_string_append (svg, " — ");
        xml_text (svg, runs[r].test);
      }
      g_string_append (svg, "</text>\n");
    }
    g_string_append_printf (svg, "<text x=\"20\" y=\"%.1f\" fill=\"#555\">dotted vertical lines: a new process "
                            "took over (a second phase, whose loss may add a term, or --resume)</text>\n",
                            H * rows + 18 + 22.0 * n_runs);
    g_string_append (svg, "</svg>\n");
    char *out = opt_output ? g_strdup (opt_output)
                : n_runs == 1 && g_file_test (argv[1], G_FILE_TEST_IS_DIR) ? g_build_filename (argv[1], "curves.svg", NULL)
                : g_strdup ("curves.svg");
    if (!g_file_set_contents (out, svg->str, (gssize) svg->len, &e)) {
      fprintf (stderr, "psm-run plot: %s\n", e->message);
      g_clear_error (&e);
      rc = 1;
    } else {
      printf ("%s: %d run%s, loss and %u metric%s\n", out, n_runs, n_runs == 1 ? "" : "s", metrics->len,
              metrics->len == 1 ? "" : "s");
    }
    g_free (out);
    g_string_free (svg, TRUE);
    g_ptr_array_unref (metrics);
  }
  for (int i = 0; i < n_runs; i++) {
    g_free (runs[i].label);
    if (runs[i].series)
      g_ptr_array_unref (runs[i].series);
    if (runs[i].restarts)
      g_array_unref (runs[i].restarts);
    g_free (runs[i].test);
  }
  g_free (runs);
  return rc;
}
