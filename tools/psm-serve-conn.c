/* psm-serve-conn.c — psm-run serve's connections: its own listening
 * socket and accept loop in front of libsoup, so that a hostile client
 * cannot stop the server (issue 58).
 *
 * libsoup 3.2's own listener has a backlog of 10 and, after accept() fails
 * once for want of file descriptors, never accepts again; it has no header
 * or idle timeout and no connection cap. Here:
 *   - the listening socket has a backlog of PSM_SERVE_BACKLOG;
 *   - at most max_conns connections are open (and never more than the
 *     process's descriptor limit leaves room for); one more is answered
 *     503 and closed;
 *   - a spare descriptor is held, so that when accept() fails with EMFILE
 *     the pending connection can still be accepted and closed (otherwise
 *     it stays in the queue and the socket stays readable forever);
 *   - a connection that has not delivered a whole request within
 *     header_timeout seconds of being accepted is closed; one whose
 *     request is being decoded is exempt, and is watched instead for its
 *     client hanging up (the job's gone flag is then set); once answered
 *     it has header_timeout seconds again to take the answer;
 *   - drops are logged on stderr (unless quiet; refusals at the cap once
 *     a hundred, so that a flood does not flood the log) and counted.
 * Each accepted connection is handed to libsoup (soup_server_accept_
 * iostream); with no libsoup listener it answers one request a connection
 * and closes it. Before libsoup reads a request's body, early_checks
 * refuses a foreign Host (bound to loopback), another media type and a body
 * over max_body, by taking the connection from libsoup, answering and
 * closing it. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <libsoup/soup.h>
#include "psm-tools.h"
#include "psm-serve-conn.h"

#define PSM_SERVE_BACKLOG 1024
#define SWEEP_MS 200          /* how often timeouts and hang-ups are checked */
#define SPARE_FDS 64          /* descriptors kept free for the model, logs, ... */

typedef struct {
  GSocket *sock;
  GSocketConnection *conn;
  GSocketAddress *remote;     /* handed to libsoup: a message names its connection by it */
  gint64 deadline;            /* µs; the request must be in by then */
  gint *gone;                 /* set while its request is queued or decoding */
} Conn;

struct PsmServeConns {
  SoupServer *server;
  GSocket *listen;
  GSource *accept_src;
  guint sweep_id;
  GHashTable *conns;          /* remote GSocketAddress * -> Conn * (libsoup keeps no GSocket of an
                                 iostream it is given, but returns this address object) */
  int max_conns;
  gint64 header_timeout;      /* µs */
  int spare_fd;               /* /dev/null, closed to accept one when out of descriptors */
  gboolean quiet;
  gboolean loopback;          /* bound to a loopback address: the Host header is checked */
  gsize max_body;
  long refused, timed_out, fd_drops;
};

static void
conn_free (gpointer data)
{
  Conn *c = data;
  g_object_unref (c->conn);
  g_clear_object (&c->remote);
  g_free (c);
}

/* Best effort: a short answer to a connection psm does not hand to
 * libsoup, then the socket is closed. */
static void
answer_and_close (GSocket *s, guint status, const char *reason, const char *msg)
{
  char *body = psm_json_error (msg);
  char *r = g_strdup_printf ("HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                             "Retry-After: 1\r\nConnection: close\r\n\r\n%s", status, reason, strlen (body), body);
  g_socket_set_blocking (s, FALSE);
  g_socket_send (s, r, strlen (r), NULL, NULL);
  g_socket_shutdown (s, FALSE, TRUE, NULL);
  g_socket_close (s, NULL);
  g_free (r);
  g_free (body);
}

static void
note (PsmServeConns *c, const char *fmt, ...) G_GNUC_PRINTF (2, 3);
static void
note (PsmServeConns *c, const char *fmt, ...)
{
  if (c->quiet)
    return;
  va_list ap;
  va_start (ap, fmt);
  char *m = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  fprintf (stderr, "psm-run serve: %s\n", m);
  g_free (m);
}

static gboolean
closed (const Conn *cn)
{
  return g_socket_is_closed (cn->sock) || g_io_stream_is_closed (G_IO_STREAM (cn->conn));
}

/* Forgets the connections that are closed. */
static void
prune (PsmServeConns *c)
{
  GHashTableIter it;
  gpointer k, v;
  g_hash_table_iter_init (&it, c->conns);
  while (g_hash_table_iter_next (&it, &k, &v))
    if (closed (v))
      g_hash_table_iter_remove (&it);
}

static gboolean
on_accept (GSocket *ls, GIOCondition cond, gpointer data)
{
  PsmServeConns *c = data;
  for (int k = 0; k < 64; k++) {   /* a burst at a time, then back to the loop */
    GError *e = NULL;
    GSocket *s = g_socket_accept (ls, NULL, &e);
    if (!s) {
      gboolean out_of_fds = g_error_matches (e, G_IO_ERROR, G_IO_ERROR_TOO_MANY_OPEN_FILES);
      g_error_free (e);
      if (out_of_fds && c->spare_fd >= 0) {   /* free one, take the pending connection, drop it */
        close (c->spare_fd);
        GSocket *x = g_socket_accept (ls, NULL, NULL);
        if (x) {
          answer_and_close (x, 503, "Service Unavailable", "out of file descriptors; retry later");
          g_object_unref (x);
        }
        c->spare_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
        c->fd_drops++;
        note (c, "out of file descriptors: dropped a connection (%ld so far; %u open)", c->fd_drops,
              g_hash_table_size (c->conns));
        continue;
      }
      break;   /* would block, or an error to retry at the next wake-up */
    }
    if ((int) g_hash_table_size (c->conns) >= c->max_conns)
      prune (c);   /* connections libsoup closed since the last sweep do not count */
    if ((int) g_hash_table_size (c->conns) >= c->max_conns) {
      answer_and_close (s, 503, "Service Unavailable", "too many connections; retry later");
      g_object_unref (s);
      if (c->refused++ % 100 == 0)
        note (c, "%d connections open: refused one with 503 (%ld so far; --max-connections)", c->max_conns,
              c->refused);
      continue;
    }
    Conn *cn = g_new0 (Conn, 1);
    cn->sock = s;
    cn->conn = g_socket_connection_factory_create_connection (s);
    cn->deadline = g_get_monotonic_time () + c->header_timeout;
    g_object_unref (s);   /* the connection holds it */
    GSocketAddress *local = g_socket_get_local_address (cn->sock, NULL);
    cn->remote = g_socket_get_remote_address (cn->sock, NULL);
    if (!local || !cn->remote) {   /* the client is gone already */
      g_clear_object (&local);
      conn_free (cn);
      continue;
    }
    g_hash_table_insert (c->conns, cn->remote, cn);
    soup_server_accept_iostream (c->server, G_IO_STREAM (cn->conn), local, cn->remote, NULL);
    g_clear_object (&local);
  }
  return G_SOURCE_CONTINUE;
}

/* Whether the client of a connection whose request is in hand has hung up:
 * the socket reads end-of-file or an error. (Bytes waiting are not a
 * hang-up: they stay for libsoup.) */
static gboolean
hung_up (GSocket *s)
{
  GIOCondition got = g_socket_condition_check (s, G_IO_IN | G_IO_HUP | G_IO_ERR);
  if (got & (G_IO_HUP | G_IO_ERR))
    return TRUE;
  if (!(got & G_IO_IN))
    return FALSE;
  char b;
  ssize_t n = recv (g_socket_get_fd (s), &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static gboolean
sweep (gpointer data)
{
  PsmServeConns *c = data;
  gint64 now = g_get_monotonic_time ();
  GHashTableIter it;
  gpointer k, v;
  g_hash_table_iter_init (&it, c->conns);
  while (g_hash_table_iter_next (&it, &k, &v)) {
    Conn *cn = v;
    if (closed (cn)) {
      g_hash_table_iter_remove (&it);
    } else if (cn->gone) {
      if (!g_atomic_int_get (cn->gone) && hung_up (cn->sock))
        g_atomic_int_set (cn->gone, 1);
    } else if (now > cn->deadline) {
      c->timed_out++;
      note (c, "closed a connection that sent no whole request in %.0f s (%ld so far; --header-timeout)",
            c->header_timeout * 1e-6, c->timed_out);
      g_socket_shutdown (cn->sock, TRUE, TRUE, NULL);   /* libsoup sees the end and lets it go */
      cn->deadline = G_MAXINT64;
    }
  }
  return G_SOURCE_CONTINUE;
}

/* A refusal made before libsoup reads the body: the connection is taken
 * from libsoup, answered and closed, so that nothing more is read. */
static void
refuse_now (PsmServeConns *s, SoupServerMessage *msg, guint status, const char *fmt, ...) G_GNUC_PRINTF (4, 5);
static void
refuse_now (PsmServeConns *s, SoupServerMessage *msg, guint status, const char *fmt, ...)
{
  va_list ap;
  va_start (ap, fmt);
  char *m = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  char *body = psm_json_error (m);
  if (!s->quiet)
    fprintf (stderr, "psm-run serve: %s %s %u: %s\n", soup_server_message_get_method (msg),
             g_uri_get_path (soup_server_message_get_uri (msg)), status, m);
  GIOStream *st = soup_server_message_steal_connection (msg);
  if (st) {
    char *head = g_strdup_printf ("HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                                  "Connection: close\r\n\r\n", status, soup_status_get_phrase (status), strlen (body));
    GOutputStream *out = g_io_stream_get_output_stream (st);
    if (g_output_stream_write_all (out, head, strlen (head), NULL, NULL, NULL))
      g_output_stream_write_all (out, body, strlen (body), NULL, NULL, NULL);
    g_io_stream_close (st, NULL, NULL);   /* what the client still sends is not read */
    g_object_unref (st);
    g_free (head);
  }
  g_free (body);
  g_free (m);
}

/* A streamed body past --max-body: refused as soon as it passes. */
static void
on_chunk (SoupServerMessage *msg, GBytes *chunk, gpointer data)
{
  PsmServeConns *s = data;
  SoupMessageBody *body = soup_server_message_get_request_body (msg);
  if ((gsize) body->length > s->max_body)
    refuse_now (s, msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE, "the body passed %zu bytes, the most accepted",
                s->max_body);
}

/* Bound to loopback, a request must name a loopback host: a web page whose
 * name an attacker points at 127.0.0.1 (DNS rebinding) sends its own. */
static gboolean
host_ok (const char *host)
{
  if (!host)
    return TRUE;   /* HTTP/1.0 without Host: not a browser */
  char *h = g_ascii_strdown (host, -1);
  char *colon = h[0] == '[' ? strstr (h, "]:") : strrchr (h, ':');
  if (colon)
    colon[h[0] == '[' ? 1 : 0] = '\0';   /* the port goes */
  gboolean ok = strcmp (h, "localhost") == 0 || strcmp (h, "[::1]") == 0 || g_str_has_prefix (h, "127.");
  if (g_str_has_prefix (h, "127."))
    ok = g_hostname_is_ip_address (h);
  g_free (h);
  return ok;
}

/* Every request, once its headers are in: the Host check, the media type
 * and the body's size (from Content-Length, and chunk by chunk). Its
 * refusals never reach the handlers. */
static void
early_checks (SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query, gpointer data)
{
  PsmServeConns *s = data;
  SoupMessageHeaders *h = soup_server_message_get_request_headers (msg);
  if (s->loopback && !host_ok (soup_message_headers_get_one (h, "Host"))) {
    refuse_now (s, msg, SOUP_STATUS_FORBIDDEN, "Host %s is not this machine's loopback name (127.0.0.1, localhost "
                "or [::1]); serve --host ADDRESS for other names", soup_message_headers_get_one (h, "Host"));
    return;
  }
  if (strcmp (soup_server_message_get_method (msg), SOUP_METHOD_POST) != 0)
    return;
  const char *type = soup_message_headers_get_content_type (h, NULL);
  if (strcmp (path, "/summarize") == 0 && (!type || g_ascii_strcasecmp (type, "application/json") != 0)) {
    refuse_now (s, msg, SOUP_STATUS_UNSUPPORTED_MEDIA_TYPE, "POST /summarize takes Content-Type: application/json, "
                "not %s", type ? type : "none");
    return;
  }
  goffset n = soup_message_headers_get_content_length (h);
  if (soup_message_headers_get_encoding (h) == SOUP_ENCODING_CONTENT_LENGTH && n > (goffset) s->max_body) {
    refuse_now (s, msg, SOUP_STATUS_REQUEST_ENTITY_TOO_LARGE, "the body is %ld bytes; at most %zu are accepted",
                (long) n, s->max_body);
    return;
  }
  g_signal_connect (msg, "got-chunk", G_CALLBACK (on_chunk), s);
}

/* The most connections the descriptor limit leaves room for. */
static int
fd_room (void)
{
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return G_MAXINT;
  return (int) MAX ((long) rl.rlim_cur - SPARE_FDS, 1);
}

PsmServeConns *
psm_serve_conns_new (SoupServer *server, GSocketAddress *addr, int max_conns, int header_timeout_s, gsize max_body,
                     gboolean quiet, GError **error)
{
  GSocket *ls = g_socket_new (g_socket_address_get_family (addr), G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP,
                              error);
  if (!ls)
    return NULL;
  g_socket_set_blocking (ls, FALSE);
  g_socket_set_listen_backlog (ls, PSM_SERVE_BACKLOG);
  if (!g_socket_bind (ls, addr, TRUE, error) || !g_socket_listen (ls, error)) {
    g_object_unref (ls);
    return NULL;
  }
  PsmServeConns *c = g_new0 (PsmServeConns, 1);
  c->server = server;
  c->listen = ls;
  c->conns = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL, conn_free);
  c->max_conns = MIN (max_conns, fd_room ());
  if (c->max_conns < max_conns && !quiet)
    fprintf (stderr, "psm-run serve: at most %d connections (the descriptor limit, ulimit -n, leaves room for no "
             "more)\n", c->max_conns);
  c->header_timeout = (gint64) header_timeout_s * G_USEC_PER_SEC;
  c->spare_fd = open ("/dev/null", O_RDONLY | O_CLOEXEC);
  c->quiet = quiet;
  c->max_body = max_body;
  c->loopback = G_IS_INET_SOCKET_ADDRESS (addr) &&
                g_inet_address_get_is_loopback (g_inet_socket_address_get_address (G_INET_SOCKET_ADDRESS (addr)));
  soup_server_add_early_handler (server, "/summarize", early_checks, c, NULL);   /* (one per handler's path) */
  soup_server_add_early_handler (server, NULL, early_checks, c, NULL);
  c->accept_src = g_socket_create_source (ls, G_IO_IN, NULL);
  g_source_set_callback (c->accept_src, (GSourceFunc) (void (*) (void)) on_accept, c, NULL);
  g_source_attach (c->accept_src, NULL);
  c->sweep_id = g_timeout_add (SWEEP_MS, sweep, c);
  return c;
}

char *
psm_serve_conns_uri (PsmServeConns *c)
{
  GInetSocketAddress *a = G_INET_SOCKET_ADDRESS (g_socket_get_local_address (c->listen, NULL));
  if (!a)
    return g_strdup ("?");
  char *host = g_inet_address_to_string (g_inet_socket_address_get_address (a));
  gboolean v6 = g_inet_address_get_family (g_inet_socket_address_get_address (a)) == G_SOCKET_FAMILY_IPV6;
  char *uri = g_strdup_printf ("http://%s%s%s:%u/", v6 ? "[" : "", host, v6 ? "]" : "",
                               g_inet_socket_address_get_port (a));
  g_free (host);
  g_object_unref (a);
  return uri;
}

void
psm_serve_conns_watch (PsmServeConns *c, SoupServerMessage *msg, gint *gone)
{
  Conn *cn = g_hash_table_lookup (c->conns, soup_server_message_get_remote_address (msg));
  if (cn)
    cn->gone = gone;
}

void
psm_serve_conns_unwatch (PsmServeConns *c, SoupServerMessage *msg)
{
  Conn *cn = g_hash_table_lookup (c->conns, soup_server_message_get_remote_address (msg));
  if (cn) {
    cn->gone = NULL;
    cn->deadline = g_get_monotonic_time () + c->header_timeout;   /* as long again to take the answer */
  }
}

void
psm_serve_conns_stats (const PsmServeConns *c, int *open, long *refused, long *timed_out, long *fd_drops)
{
  *open = (int) g_hash_table_size (c->conns);
  *refused = c->refused;
  *timed_out = c->timed_out;
  *fd_drops = c->fd_drops;
}

void
psm_serve_conns_free (PsmServeConns *c)
{
  if (!c)
    return;
  g_source_destroy (c->accept_src);
  g_source_unref (c->accept_src);
  g_source_remove (c->sweep_id);
  g_hash_table_destroy (c->conns);
  g_socket_close (c->listen, NULL);
  g_object_unref (c->listen);
  if (c->spare_fd >= 0)
    close (c->spare_fd);
  g_free (c);
}
