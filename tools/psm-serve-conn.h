/* psm-serve-conn.h — psm-run serve's connections (psm-serve-conn.c). */
#ifndef PSM_SERVE_CONN_H
#define PSM_SERVE_CONN_H
#include <libsoup/soup.h>

/* psm-run serve's connections (psm-serve-conn.c): a listening socket on
 * addr with its own accept loop handing connections to server, at most
 * max_conns open, each closed if its request is not in within
 * header_timeout_s, requests refused from their headers (a foreign Host
 * when addr is loopback, POST /summarize not application/json, a body over
 * max_body); watch: the request of msg is in hand, so the
 * connection is exempt from the timeout and *gone is set (atomically) if
 * its client hangs up; unwatch before *gone is freed. */
typedef struct PsmServeConns PsmServeConns;
PsmServeConns *psm_serve_conns_new (SoupServer *server, GSocketAddress *addr, int max_conns, int header_timeout_s,
                                    gsize max_body, gboolean quiet, GError **error);
char *psm_serve_conns_uri (PsmServeConns *c);
void psm_serve_conns_watch (PsmServeConns *c, SoupServerMessage *msg, gint *gone);
void psm_serve_conns_unwatch (PsmServeConns *c, SoupServerMessage *msg);
/* What has been dropped so far, for /health. */
void psm_serve_conns_stats (const PsmServeConns *c, int *open, long *refused, long *timed_out, long *fd_drops);
void psm_serve_conns_free (PsmServeConns *c);
#endif
