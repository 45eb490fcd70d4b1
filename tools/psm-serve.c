/* psm-serve.c — psm-run serve: a trained summariser over HTTP (libsoup 3).
 *
 *   GET  /            the viewer page with a text box (tools/view.html)
 *   POST /summarize   {"text": "...", "beam": 4, "min_len": 35, "max_len": 100}
 *                     -> the decoded record of psm-run --json (tokens, p_gen,
 *                     copied, attention, coverage, source) plus "summary"
 *                     and "seconds"
 *   GET  /health      {"status": "ok", "checkpoint": ..., "queued": N}
 *
 * The run is loaded once. The main loop only parses and answers; one
 * worker thread owns the model and decodes: it takes the oldest request
 * and every other queued one with the same beam and lengths (up to the
 * pipeline's eval.batch articles) as one batch, so concurrent clients
 * share the work (it waits --batch-wait ms for the batch to fill); the
 * rest wait in the queue (bounded: 503 beyond --queue). Malformed or
 * oversized requests get 4xx with a message. It listens on 127.0.0.1
 * unless --host says otherwise. Its limits against hostile clients (body,
 * nesting, connections, timeouts, words; doc/reliability.md, "psm-run
 * serve's limits"): connections are accepted by psm-serve-conn.c. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <glib-unix.h>
#include <libsoup/soup.h>
#include "psm/psm-pipeline.h"
#include "psm-tools.h"
#include "psm-serve-conn.h"

#define MAX_BEAM 64
#define MAX_LEN 400

typedef struct {
  SoupServerMessage *msg;
  char *text;
  PsmDecodeSettings ds;
  gint64 t0;
  gint gone;               /* the client hung up (set by psm-serve-conn.c's sweep) */
  /* the answer, filled by the worker */
  guint status;
  char *body;
} Job;

typedef struct {
  SoupServer *server;
  PsmModel *model;
  PsmPipeline *pipeline;
  char *page;
  char *checkpoint;
  long step;
  PsmDecodeSettings defaults;
  int batch;                 /* most articles decoded together */
  gint64 batch_wait;         /* µs the worker waits for a batch to fill */
  GAsyncQueue *queue;        /* Job*, or the stop marker */
  volatile gint queued;      /* accepted, not yet answered */
  int max_queue;
  gsize max_body;
  gboolean quiet;
  GMainLoop *loop;
  PsmServeConns *conns;
  long served, dropped;
} Server;

static Job stop_marker;

static void
respond (SoupServerMessage *msg, guint status, const char *json)
{
  soup_server_message_set_status (msg, status, NULL);
  soup_server_message_set_response (msg, "application/json", SOUP_MEMORY_COPY, json, strlen (json));
}

/* The same, the message taking json (g_free'd by libsoup: no copy). */
static void
respond_take (SoupServerMessage *msg, guint status, char *json)
{
  soup_server_message_set_status (msg, status, NULL);
  soup_server_message_set_response (msg, "application/json", SOUP_MEMORY_TAKE, json, strlen (json));
}

static void
respond_error (SoupServerMessage *msg, guint status, const char *fmt, ...) G_GNUC_PRINTF (3, 4);
static void
respond_error (SoupServerMessage *msg, guint status, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *m = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  respond_take (msg, status, psm_json_error (m));
  g_free (m);
}

static void
job_free (Job *j)
{
  g_object_unref (j->msg);
  g_free (j->text);
  g_free (j->body);
  g_free (j);
}

/* Main thread: the worker's answer goes out. */
static gboolean
job_done (gpointer data)
{
  Job *j = data;
  Server *s = g_object_get_data (G_OBJECT (j->msg), "psm-server");
  psm_serve_conns_unwatch (s->conns, j->msg);
  g_atomic_int_add (&s->queued, -1);
  if (!j->body) {   /* dropped: its client hung up */
    s->dropped++;
    if (!s->quiet)
      fprintf (stderr, "psm-run serve: POST /summarize dropped after %.3f s: the client hung up (%ld so far)\n",
               (g_get_monotonic_time () - j->t0) * 1e-6, s->dropped);
    soup_server_message_set_status (j->msg, SOUP_STATUS_REQUEST_TIMEOUT, NULL);
  } else {
    respond_take (j->msg, j->status, j->body);
    j->body = NULL;
    s->served++;
    if (!s->quiet)
      fprintf (stderr, "psm-run serve: POST /summarize %u in %.3f s (%d queued)\n", j->status,
               (g_get_monotonic_time () - j->t0) * 1e-6, g_atomic_int_get (&s->queued));
  }
  soup_server_message_unpause (j->msg);
  job_free (j);
  return G_SOURCE_REMOVE;
}

typedef struct {
  Job **jobs;
  int n;
} Batch;

/* Whether every client of a batch has hung up (the decoding then stops). */
static gboolean
batch_gone (void *data)
{
  const Batch *b = data;
  for (int i = 0; i < b->n; i++)
    if (!g_atomic_int_get (&b->jobs[i]->gone))
      return FALSE;
  return TRUE;
}

/* The start of line i of text (n lines, each ending in '\n'), its length in
 * *len; NULL past the last. */
static const char *
nth_line (const char *text, size_t size, int i, size_t *len)
{
  const char *p = text, *end = text + size;
  for (; i > 0 && p < end; i--) {
    const char *nl = memchr (p, '\n', (size_t) (end - p));
    p = nl ? nl + 1 : end;
  }
  if (p >= end)
    return NULL;
  const char *nl = memchr (p, '\n', (size_t) (end - p));
  *len = (size_t) ((nl ? nl : end) - p);
  return p;
}

/* Worker: decodes jobs[0..n) (same settings) as one batch. Each answer is
 * made once, from the decoding's buffers, and handed to libsoup as it is
 * (one copy of a reply, not three). */
static void
decode_jobs (Server *s, Job **jobs, int n)
{
  GError *e = NULL;
  const char **texts = g_new (const char *, n);
  for (int i = 0; i < n; i++)
    texts[i] = jobs[i]->text;
  /* the records and the summaries (one line each per text) */
  char *buf = NULL, *sbuf = NULL;
  size_t len = 0, slen = 0;
  FILE *json = open_memstream (&buf, &len), *sums = open_memstream (&sbuf, &slen);
  gboolean ok = json && sums;
  if (!ok)
    g_set_error (&e, G_IO_ERROR, g_io_error_from_errno (errno), "cannot buffer the output: %s", g_strerror (errno));
  ok = ok && psm_model_set_decode (s->model, &jobs[0]->ds, &e);
  Batch batch = { jobs, n };
  PsmEvalOptions eo = { 0, TRUE, sums, NULL, json, FALSE, batch_gone, &batch };
  gint64 t0 = g_get_monotonic_time ();
  ok = ok && psm_model_decode_texts (s->model, texts, n, &eo, &e);
  double seconds = (g_get_monotonic_time () - t0) * 1e-6;
  if (json)
    fclose (json);
  if (sums)
    fclose (sums);
  gboolean cancelled = !ok && g_error_matches (e, PSM_RUN_ERROR, PSM_RUN_ERROR_CANCELLED);
  for (int i = 0; i < n; i++) {
    Job *j = jobs[i];
    size_t rl = 0, sl = 0;
    const char *rec = ok ? nth_line (buf, len, i, &rl) : NULL, *sum = ok ? nth_line (sbuf, slen, i, &sl) : NULL;
    const char *close = NULL;   /* the record's closing brace */
    for (const char *c = rec ? rec + rl : NULL; c && c > rec && !close; c--)
      if (c[-1] == '}')
        close = c - 1;
    if (cancelled) {
      j->body = NULL;   /* its client is gone: job_done drops it */
    } else if (!ok || !close || !sum) {
      j->status = SOUP_STATUS_INTERNAL_SERVER_ERROR;
      j->body = psm_json_error (ok ? "decoding gave fewer records than texts" : e->message);
    } else {
      /* the record, with the summary text and the batch's time added */
      char *summary = g_strndup (sum, sl);
      GString *out = g_string_sized_new ((size_t) (close - rec) + sl + 160);
      g_string_append_len (out, rec, close - rec);
      g_string_append (out, ", \"summary\": ");
      psm_json_string (out, summary);
      g_string_append_printf (out, ", \"seconds\": %.4f, \"batch\": %d, \"beam\": %d, \"min_len\": %d, "
                              "\"max_len\": %d}\n", seconds, n, j->ds.beam, j->ds.min_len, j->ds.max_len);
      g_free (summary);
      j->status = SOUP_STATUS_OK;
      j->body = g_string_free (out, FALSE);
    }
    g_idle_add (job_done, j);
  }
  free (buf);
  free (sbuf);
  g_free (texts);
  g_clear_error (&e);
}

static gboolean
same_settings (const Job *a, const Job *b)
{
  return a->ds.beam == b->ds.beam && a->ds.min_len == b->ds.min_len && a->ds.max_len == b->ds.max_len;
}

static gpointer
worker (gpointer data)
{
  Server *s = data;
  Job **batch = g_new (Job *, s->batch);
  GQueue later = G_QUEUE_INIT;   /* popped, other settings: first next time */
  for (;;) {
    Job *first = g_queue_pop_head (&later);
    if (!first)
      first = g_async_queue_pop (s->queue);
    if (first == &stop_marker)
      break;
    int n = 0;
    batch[n++] = first;
    /* the queued jobs with the same settings join the batch */
    for (GList *l = later.head; l && n < s->batch;) {
      GList *next = l->next;
      if (same_settings (first, l->data)) {
        batch[n++] = l->data;
        g_queue_delete_link (&later, l);
      }
      l = next;
    }
    gboolean stop = FALSE;
    gint64 deadline = g_get_monotonic_time () + s->batch_wait;
    while (n < s->batch) {
      /* what is queued now, then what arrives within --batch-wait */
      gint64 left = deadline - g_get_monotonic_time ();
      Job *j = left > 0 ? g_async_queue_timeout_pop (s->queue, (guint64) left) : g_async_queue_try_pop (s->queue);
      if (!j)
        break;
      if (j == &stop_marker) {
        stop = TRUE;
        break;
      }
      if (same_settings (first, j))
        batch[n++] = j;
      else
        g_queue_push_tail (&later, j);
    }
    /* requests whose clients have hung up while queued are dropped */
    int kept = 0;
    for (int i = 0; i < n; i++)
      if (g_atomic_int_get (&batch[i]->gone))
        g_idle_add (job_done, batch[i]);   /* no body: dropped */
      else
        batch[kept++] = batch[i];
    if (kept)
      decode_jobs (s, batch, kept);
    if (stop)
      g_queue_push_tail (&later, &stop_marker);
  }
  /* stopping: whatever is left is answered 503 */
  Job *j;
  while ((j = g_queue_pop_head (&later)) || (j = g_async_queue_try_pop (s->queue)))
    if (j != &stop_marker) {
      j->status = SOUP_STATUS_SERVICE_UNAVAILABLE;
      j->body = psm_json_error ("the server is stopping");
      g_idle_add (job_done, j);
    }
  g_free (batch);
  return NULL;
}

/* The request body as a job, or NULL with why. */
static Job *
parse_request (Server *s, const char *body, gsize len, char **why)
{
  PsmDecodeSettings ds;
  char *text = NULL;
  if (!psm_serve_parse_request (body, len, &s->defaults, MAX_BEAM, MAX_LEN, &text, &ds, why))
    return NULL;
  Job *j = g_new0 (Job, 1);
  j->text = text;
  j->ds = ds;
  return j;
}

static void
handle_summarize (SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query, gpointer data)
{
  Server *s = data;
  if (strcmp (soup_server_message_get_method (msg), SOUP_METHOD_POST) != 0) {
    soup_message_headers_replace (soup_server_message_get_response_headers (msg), "Allow", "POST");
    respond_error (msg, SOUP_STATUS_METHOD_NOT_ALLOWED, "POST a JSON object {\"text\": \"...\"} to /summarize");
    return;
  }
  SoupMessageBody *body = soup_server_message_get_request_body (msg);
  if ((gsize) body->length > s->max_body) {
    respond_error (msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE, "the body is %ld bytes; at most %zu are accepted",
                   (long) body->length, s->max_body);
    return;
  }
  char *why = NULL;
  Job *j = parse_request (s, body->data ? body->data : "", (gsize) body->length, &why);
  if (!j) {
    respond_error (msg, SOUP_STATUS_BAD_REQUEST, "%s", why);
    if (!s->quiet)
      fprintf (stderr, "psm-run serve: POST /summarize 400: %s\n", why);
    g_free (why);
    return;
  }
  if (g_atomic_int_get (&s->queued) >= s->max_queue) {
    soup_message_headers_replace (soup_server_message_get_response_headers (msg), "Retry-After", "1");
    respond_error (msg, SOUP_STATUS_SERVICE_UNAVAILABLE, "busy: %d requests are queued; retry later", s->max_queue);
    g_free (j->text);
    g_free (j);
    return;
  }
  j->msg = g_object_ref (msg);
  j->t0 = g_get_monotonic_time ();
  g_object_set_data (G_OBJECT (msg), "psm-server", s);
  g_atomic_int_inc (&s->queued);
  soup_server_message_pause (msg);
  psm_serve_conns_watch (s->conns, msg, &j->gone);   /* its client hanging up sets gone */
  g_async_queue_push (s->queue, j);
}

static void
handle_other (SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query, gpointer data)
{
  Server *s = data;
  const char *method = soup_server_message_get_method (msg);
  gboolean get = strcmp (method, SOUP_METHOD_GET) == 0 || strcmp (method, SOUP_METHOD_HEAD) == 0;
  if (strcmp (path, "/") == 0 || strcmp (path, "/index.html") == 0) {
    if (!get) {
      respond_error (msg, SOUP_STATUS_METHOD_NOT_ALLOWED, "GET the page; POST texts to /summarize");
      return;
    }
    soup_server_message_set_status (msg, SOUP_STATUS_OK, NULL);
    soup_server_message_set_response (msg, "text/html; charset=utf-8", SOUP_MEMORY_STATIC, s->page, strlen (s->page));
  } else if (strcmp (path, "/health") == 0 && get) {
    GString *h = g_string_new ("{\"status\": \"ok\", \"checkpoint\": ");
    char *base = g_path_get_basename (s->checkpoint);   /* not the folders of the machine */
    psm_json_string (h, base);
    g_free (base);
    int open;
    long refused, timed_out, fd_drops;
    psm_serve_conns_stats (s->conns, &open, &refused, &timed_out, &fd_drops);
    g_string_append_printf (h, ", \"step\": %ld, \"queued\": %d, \"served\": %ld, \"dropped_hung_up\": %ld, "
                            "\"connections\": %d, \"refused_connections\": %ld, \"timed_out\": %ld, "
                            "\"fd_drops\": %ld}\n", s->step, g_atomic_int_get (&s->queued), s->served, s->dropped,
                            open, refused, timed_out, fd_drops);
    respond (msg, SOUP_STATUS_OK, h->str);
    g_string_free (h, TRUE);
  } else {
    respond_error (msg, SOUP_STATUS_NOT_FOUND, "no such page: %s (GET /, POST /summarize, GET /health)", path);
  }
}

static gboolean
on_signal (gpointer data)
{
  Server *s = data;
  fprintf (stderr, "psm-run serve: stopping\n");
  g_main_loop_quit (s->loop);
  return G_SOURCE_CONTINUE;   /* removed by psm_serve_main */
}

static gint opt_port = 8080, opt_queue = 64, opt_max_body = 1 << 20, opt_batch_wait = 2, opt_max_conns = 256,
            opt_header_timeout = 10;
static gchar *opt_host;
static gboolean opt_quiet;
static gchar **opt_set;
static GOptionEntry serve_entries[] = {
  { "port", 'p', 0, G_OPTION_ARG_INT, &opt_port, "TCP port (default 8080; 0: any free port, printed)", "P" },
  { "host", 0, 0, G_OPTION_ARG_STRING, &opt_host,
    "Address to listen on (default 127.0.0.1, this machine only; 0.0.0.0: every interface)", "ADDRESS" },
  { "queue", 0, 0, G_OPTION_ARG_INT, &opt_queue, "Requests that may wait; more get 503 (default 64)", "N" },
  { "max-body", 0, 0, G_OPTION_ARG_INT, &opt_max_body, "Largest request body in bytes; larger get 413 (default 1 MiB)",
    "BYTES" },
  { "max-connections", 0, 0, G_OPTION_ARG_INT, &opt_max_conns,
    "Connections open at once; more get 503 and are closed (default 256; never more than ulimit -n leaves room for)",
    "N" },
  { "header-timeout", 0, 0, G_OPTION_ARG_INT, &opt_header_timeout,
    "Seconds a connection has to send its whole request; then it is closed (default 10)", "S" },
  { "batch-wait", 0, 0, G_OPTION_ARG_INT, &opt_batch_wait,
    "Milliseconds the decoder waits for more requests to batch with the first (default 2)", "MS" },
  { "set", 's', 0, G_OPTION_ARG_STRING_ARRAY, &opt_set, "Override a setting of the run's pipeline (repeatable)",
    "KEY.PATH=VALUE" },
  { "quiet", 'q', 0, G_OPTION_ARG_NONE, &opt_quiet, "Do not log requests", NULL },
  { NULL }
};

/* The run: RUN_DIR (its pipeline.cfg, run.dir pointed at it) or a pipeline. */
static gboolean
load_run (Server *s, const char *what, GError **error)
{
  GPtrArray *sets = g_ptr_array_new_with_free_func (g_free);
  char *cfg;
  if (g_file_test (what, G_FILE_TEST_IS_DIR)) {
    cfg = g_build_filename (what, "pipeline.cfg", NULL);
    GString *d = g_string_new ("run.dir=");
    psm_json_string (d, what);
    g_ptr_array_add (sets, g_string_free (d, FALSE));
  } else {
    cfg = g_strdup (what);
  }
  for (gchar **o = opt_set; o && *o; o++)
    g_ptr_array_add (sets, g_strdup (*o));
  g_ptr_array_add (sets, NULL);
  PsmPipeline *pl = psm_pipeline_load (cfg, (const char *const *) sets->pdata, error);
  g_ptr_array_unref (sets);
  g_free (cfg);
  if (!pl)
    return FALSE;
  psm_pipeline_set_text_only (pl, TRUE);   /* raw text only: no split is read */
  if (!psm_run_select_phase (&pl, error)) {   /* before the model: built once */
    psm_pipeline_free (pl);
    return FALSE;
  }
  PsmModel *m = psm_model_new (pl, FALSE, error);
  if (m && !psm_model_has_decoder (m)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE, "%s: serve needs a pipeline with a decoder (a summariser)",
                 what);
    psm_model_free (m);
    m = NULL;
  }
  if (!m || !(s->checkpoint = psm_run_load_best (m, &s->step, error))) {
    if (m)
      psm_model_free (m);
    psm_pipeline_free (pl);
    return FALSE;
  }
  s->model = m;
  s->pipeline = pl;
  psm_model_get_decode (m, &s->defaults);
  s->defaults.beam = MIN (s->defaults.beam, MAX_BEAM);
  s->defaults.max_len = MIN (s->defaults.max_len, MAX_LEN);
  s->defaults.min_len = MIN (s->defaults.min_len, s->defaults.max_len);
  s->batch = (int) MAX (1, psm_section_int (psm_pipeline_section (pl, "eval"), "batch"));
  return TRUE;
}

int
psm_serve_main (int argc, char **argv)
{
  GError *e = NULL;
  if (!psm_tool_options ("serve", "RUN_DIR|PIPELINE.cfg — serve a trained summariser over HTTP",
    "GET / the page with a text box; POST /summarize {\"text\", \"beam\", \"min_len\", \"max_len\"} -> the summary\n"
    "with per-token copy and attention data; GET /health. Listens on 127.0.0.1 unless --host says otherwise.\n"
    "Stop it with Ctrl-C (SIGINT) or SIGTERM.\n", serve_entries, &argc, &argv))
    return 2;
  if (argc != 2 || opt_port < 0 || opt_port > 65535 || opt_queue < 1 || opt_max_body < 64 || opt_max_conns < 1 ||
      opt_header_timeout < 1) {
    fprintf (stderr, "psm-run serve: %s (try psm-run serve --help)\n",
             argc != 2 ? "expected one run folder or pipeline file"
             : opt_port < 0 || opt_port > 65535 ? "--port: expected 0 to 65535"
             : opt_queue < 1 ? "--queue: expected 1 or more"
             : opt_max_body < 64 ? "--max-body: expected 64 bytes or more"
             : opt_max_conns < 1 ? "--max-connections: expected 1 or more" : "--header-timeout: expected 1 s or more");
    return 2;
  }
  Server s = { 0 };
  s.max_queue = opt_queue;
  s.max_body = (gsize) opt_max_body;
  s.quiet = opt_quiet;
  s.batch_wait = 1000 * (gint64) MAX (opt_batch_wait, 0);
  if (!load_run (&s, argv[1], &e)) {
    gboolean usage = e->domain == PSM_CONFIG_ERROR || e->domain == PSM_PLUGIN_ERROR ||
                     (e->domain == PSM_RUN_ERROR && e->code == PSM_RUN_ERROR_USAGE);
    fprintf (stderr, "psm-run serve: %s\n", e->message);
    g_error_free (e);
    return usage ? 2 : 1;
  }
  GString *data = g_string_new ("{\"mode\": \"serve\", \"title\": ");
  char *run_name = g_path_get_basename (argv[1]);
  char *title = g_strdup_printf ("psm serve — %s", run_name);
  g_free (run_name);
  psm_json_string (data, title);
  g_free (title);
  g_string_append (data, ", \"summary\": ");
  char *ck_name = g_path_get_basename (s.checkpoint);   /* the page shows no folders of this machine */
  char *summary = g_strdup_printf ("checkpoint %s (update %ld)", ck_name, s.step);
  g_free (ck_name);
  psm_json_string (data, summary);
  g_free (summary);
  g_string_append_printf (data, ", \"defaults\": {\"beam\": %d, \"min_len\": %d, \"max_len\": %d}, \"examples\": []}",
                          s.defaults.beam, s.defaults.min_len, s.defaults.max_len);
  s.page = psm_view_page (data->str, &e);
  g_string_free (data, TRUE);
  int rc = 0;
  s.server = soup_server_new ("server-header", "psm-run-serve ", NULL);
  soup_server_add_handler (s.server, "/summarize", handle_summarize, &s, NULL);
  soup_server_add_handler (s.server, NULL, handle_other, &s, NULL);
  const char *host = opt_host ? opt_host : "127.0.0.1";
  GSocketAddress *addr = g_inet_socket_address_new_from_string (host, (guint) opt_port);
  if (!s.page) {
    fprintf (stderr, "psm-run serve: %s\n", e->message);
    rc = 1;
  } else if (!addr) {
    fprintf (stderr, "psm-run serve: --host %s: not an IP address (e.g. 127.0.0.1, ::1, 0.0.0.0)\n", host);
    rc = 2;
  } else if (!(s.conns = psm_serve_conns_new (s.server, addr, opt_max_conns, opt_header_timeout, s.max_body, opt_quiet,
                                               &e))) {
    fprintf (stderr, "psm-run serve: cannot listen on %s port %d: %s\n", host, opt_port, e->message);
    rc = 1;
  }
  g_clear_error (&e);
  if (rc == 0) {
    char *uri = psm_serve_conns_uri (s.conns);
    printf ("psm-run serve: %s (checkpoint %s, update %ld); POST %ssummarize; Ctrl-C stops\n", uri, s.checkpoint,
            s.step, uri);
    fflush (stdout);
    g_free (uri);
    s.queue = g_async_queue_new ();
    s.loop = g_main_loop_new (NULL, FALSE);
    GThread *w = g_thread_new ("psm-serve-worker", worker, &s);
    guint sig_int = g_unix_signal_add (SIGINT, on_signal, &s), sig_term = g_unix_signal_add (SIGTERM, on_signal, &s);
    g_main_loop_run (s.loop);
    g_source_remove (sig_int);
    g_source_remove (sig_term);
    g_async_queue_push (s.queue, &stop_marker);
    g_thread_join (w);
    /* answer what the worker finished or refused */
    while (g_main_context_iteration (NULL, FALSE))
      ;
    psm_serve_conns_free (s.conns);
    soup_server_disconnect (s.server);
    g_main_loop_unref (s.loop);
    g_async_queue_unref (s.queue);
    fprintf (stderr, "psm-run serve: served %ld request%s\n", s.served, s.served == 1 ? "" : "s");
  }
  if (addr)
    g_object_unref (addr);
  g_object_unref (s.server);
  g_free (s.page);
  g_free (s.checkpoint);
  psm_model_free (s.model);
  psm_pipeline_free (s.pipeline);
  return rc;
}
