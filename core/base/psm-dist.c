/* psm-dist.c — data-parallel training over MPI (configure --with-mpi).
 * One process per rank, each holding the whole model: every rank draws the
 * same global batch from the same RNG and trains on its share of the rows;
 * the gradients are summed with one MPI_Allreduce over the single gradient
 * buffer. Without MPI (or outside mpirun) everything here is a one-rank
 * no-op. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base-internal.h"
#ifdef HAVE_MPI
#include <mpi.h>
#endif

static int dist_rank, dist_size = 1;
static gboolean dist_on;

/* The world size a launcher announces in the environment (Open MPI, PMIx,
 * MPICH/Slurm PMI), 0 if none. */
static int
launcher_size (void)
{
  const char *vars[] = { "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", NULL };
  for (int i = 0; vars[i]; i++) {
    const char *v = g_getenv (vars[i]);
    if (v && atoi (v) > 0)
      return atoi (v);
  }
  return 0;
}

gboolean
psm_dist_init (int *argc, char ***argv, GError **error)
{
  int n = launcher_size ();
#ifdef HAVE_MPI
  if (n == 0)
    return TRUE;   /* not under mpirun: one process, MPI untouched */
  int provided;
  if (MPI_Init_thread (argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "MPI_Init failed");
    return FALSE;
  }
  dist_on = TRUE;
  MPI_Comm_rank (MPI_COMM_WORLD, &dist_rank);
  MPI_Comm_size (MPI_COMM_WORLD, &dist_size);
  return TRUE;
#else
  if (n > 1) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "started as one of %d MPI ranks, but this psm-run was built without MPI: every rank would train "
                 "alone into the same run folder. Install libopenmpi-dev and rebuild (configure --with-mpi)", n);
    return FALSE;
  }
  return TRUE;
#endif
}

int psm_dist_rank (void) { return dist_rank; }
int psm_dist_size (void) { return dist_size; }

void
psm_dist_finalize (void)
{
#ifdef HAVE_MPI
  if (dist_on)
    MPI_Finalize ();
#endif
  dist_on = FALSE;
}

void
psm_dist_abort (int code)
{
#ifdef HAVE_MPI
  if (dist_on && dist_size > 1) {
    fflush (stdout);
    fflush (stderr);
    MPI_Abort (MPI_COMM_WORLD, code);
  }
#endif
}

void
psm_dist_sum_float (float *buf, size_t n)
{
#ifdef HAVE_MPI
  /* MPI counts are int: large buffers in pieces */
  while (dist_size > 1 && n) {
    int k = (int) MIN (n, (size_t) 1 << 30);
    MPI_Allreduce (MPI_IN_PLACE, buf, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    buf += k;
    n -= (size_t) k;
  }
#endif
}

void
psm_dist_sum_double (double *buf, size_t n)
{
#ifdef HAVE_MPI
  if (dist_size > 1)
    MPI_Allreduce (MPI_IN_PLACE, buf, (int) n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
}

void
psm_dist_bcast (void *buf, size_t bytes)
{
#ifdef HAVE_MPI
  char *p = buf;
  while (dist_size > 1 && bytes) {
    int k = (int) MIN (bytes, (size_t) 1 << 30);
    MPI_Bcast (p, k, MPI_BYTE, 0, MPI_COMM_WORLD);
    p += k;
    bytes -= (size_t) k;
  }
#endif
}

GPtrArray *
psm_dist_gather_bytes (GBytes *mine)
{
  GPtrArray *all = NULL;
#ifdef HAVE_MPI
  if (dist_size > 1) {
    gsize n = 0;
    const void *p = g_bytes_get_data (mine, &n);
    int len = (int) n;   /* a rank's stream state: far below 2 GB */
    int *lens = dist_rank == 0 ? g_new (int, dist_size) : NULL, *offs = NULL;
    MPI_Gather (&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char *buf = NULL;
    if (dist_rank == 0) {
      offs = g_new (int, dist_size);
      size_t total = 0;
      for (int r = 0; r < dist_size; r++) {
        offs[r] = (int) total;
        total += (size_t) lens[r];
      }
      buf = g_malloc (MAX (total, 1));
    }
    MPI_Gatherv (p, len, MPI_BYTE, buf, lens, offs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (dist_rank == 0) {
      all = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
      for (int r = 0; r < dist_size; r++)
        g_ptr_array_add (all, g_bytes_new (buf + offs[r], (gsize) lens[r]));
    }
    g_free (buf);
    g_free (lens);
    g_free (offs);
    return all;
  }
#endif
  all = g_ptr_array_new_with_free_func ((GDestroyNotify) g_bytes_unref);
  g_ptr_array_add (all, g_bytes_ref (mine));
  return all;
}

GBytes *
psm_dist_bcast_bytes (GBytes *b)
{
  if (dist_size < 2)
    return b ? g_bytes_ref (b) : NULL;
  gint64 len = dist_rank == 0 && b ? (gint64) g_bytes_get_size (b) : -1;
  psm_dist_bcast (&len, sizeof len);
  if (len < 0)
    return NULL;
  char *buf = g_malloc (MAX (len, 1));
  if (dist_rank == 0)
    memcpy (buf, g_bytes_get_data (b, NULL), (size_t) len);
  psm_dist_bcast (buf, (size_t) len);
  return g_bytes_new_take (buf, (gsize) len);
}

/* g[0 .. n) times this rank's share of the batch */
static void
scale_by_share (float *g, size_t n, double share)
{
  float k = (float) share;
#pragma omp parallel for simd if (n >= 32768) schedule (static)
  for (size_t i = 0; i < n; i++)
    g[i] *= k;
}

/* The update's loss (weighted by this rank's share) and the n extra values
 * summed over the ranks, in place. */
static void
sum_loss (double share, double *loss, double *extra, int n)
{
  double red[1 + 8];
  g_return_if_fail (n >= 0 && n <= 8);
  red[0] = *loss * share;
  for (int i = 0; i < n; i++)
    red[1 + i] = extra[i];
  psm_dist_sum_double (red, 1 + n);
  *loss = red[0];
  for (int i = 0; i < n; i++)
    extra[i] = red[1 + i];
}

void
psm_dist_reduce_update (float *grad, size_t P, double share, double *loss, double *extra, int n)
{
  if (dist_size < 2)
    return;
  scale_by_share (grad, P, share);
  psm_dist_sum_float (grad, P);
  sum_loss (share, loss, extra, n);
}

/* ---- The gradient reduction of an update in buckets, optionally sharded
 * (train.dist_overlap, train.dist_shard). Buckets go to MPI from the last
 * to the first, on every rank in that order: as the backward completes
 * them (psm_graph_watch_grads) or all at psm_dist_reduce_end. Sharded, a
 * bucket is reduce-scattered: each rank receives the sum of the part of it
 * that lies in its own shard (the shards cut the buffer in nranks
 * contiguous pieces, 16-float aligned) into a buffer of its own; the
 * ranks update their shards and all-gather the parameters. Otherwise each
 * bucket is all-reduced in place. */
struct PsmDistReduce {
  float *grad;
  size_t n, bucket, nb;
  gboolean shard;
  double share;
  size_t next;    /* buckets [next, nb) are with MPI this update */
  size_t done;    /* and [done, nb) known complete */
  size_t *bound;  /* [nranks + 1]: the shards */
  size_t polled;  /* buckets with MPI at the last poll (nodes still to run) */
  double early, updates;   /* their sum over the updates, and the updates */
  float *part;    /* sharded: this rank's summed gradient */
#ifdef HAVE_MPI
  MPI_Request *req;   /* [nb] */
  int *counts;        /* sharded: [nb][nranks], each bucket's split */
  int *displ;         /* and where each rank's part starts in the bucket */
#endif
};

PsmDistReduce *
psm_dist_reduce_new (float *grad, size_t n, gboolean shard, size_t bucket)
{
  if (dist_size < 2 || n == 0)
    return NULL;
  PsmDistReduce *r = g_new0 (PsmDistReduce, 1);
  r->grad = grad;
  r->n = n;
  r->bucket = MAX (16, (MIN (bucket, (size_t) 1 << 30) + 15) / 16 * 16);   /* MPI counts are int */
  r->nb = (n + r->bucket - 1) / r->bucket;
  r->shard = shard && n < (size_t) G_MAXINT;   /* displacements are int too */
  r->next = r->done = r->nb;
  r->bound = g_new (size_t, dist_size + 1);
  for (int k = 0; k <= dist_size; k++)
    r->bound[k] = MIN (n, (n * (size_t) k / (size_t) dist_size + 15) / 16 * 16);
  r->bound[dist_size] = n;
#ifdef HAVE_MPI
  r->req = g_new (MPI_Request, r->nb);
  for (size_t b = 0; b < r->nb; b++)
    r->req[b] = MPI_REQUEST_NULL;
  if (r->shard) {
    r->part = psm_xmalloc0 (MAX (r->bound[dist_rank + 1] - r->bound[dist_rank], 1) * sizeof (float),
                            "the sharded gradient");
    r->counts = g_new (int, r->nb * (size_t) dist_size);
    r->displ = g_new (int, r->nb * (size_t) dist_size);
    for (size_t b = 0; b < r->nb; b++) {
      size_t lo = b * r->bucket, hi = MIN (n, lo + r->bucket);
      for (int k = 0; k < dist_size; k++) {
        size_t a = MAX (lo, r->bound[k]), z = MIN (hi, r->bound[k + 1]);
        r->counts[b * (size_t) dist_size + (size_t) k] = z > a ? (int) (z - a) : 0;
        r->displ[b * (size_t) dist_size + (size_t) k] = z > a ? (int) (a - lo) : 0;
      }
    }
  }
#endif
  return r;
}

void
psm_dist_reduce_free (PsmDistReduce *r)
{
  if (!r)
    return;
#ifdef HAVE_MPI
  g_free (r->req);
  g_free (r->counts);
  g_free (r->displ);
#endif
  free (r->part);
  g_free (r->bound);
  g_free (r);
}

void
psm_dist_reduce_begin (PsmDistReduce *r, double share)
{
  r->share = share;
  r->next = r->done = r->nb;
  r->polled = 0;
}

void
psm_dist_reduce_bucket (size_t lo, size_t hi, void *user)
{
  PsmDistReduce *r = user;
  g_return_if_fail (r->next > 0 && lo == (r->next - 1) * r->bucket);
  size_t b = --r->next;
  float *g = r->grad + lo;
  scale_by_share (g, hi - lo, r->share);
#ifdef HAVE_MPI
  if (!r->shard) {
    MPI_Iallreduce (MPI_IN_PLACE, g, (int) (hi - lo), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r->req[b]);
    return;
  }
  size_t mine = r->bound[dist_rank], at = MAX (lo, mine);
  float *recv = r->part + (at < r->bound[dist_rank + 1] ? at - mine : 0);
  MPI_Ireduce_scatter (g, recv, r->counts + b * (size_t) dist_size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r->req[b]);
#else
  (void) b;
#endif
}

void
psm_dist_reduce_poll (void *user)
{
  PsmDistReduce *r = user;
  r->polled = r->nb - r->next;
#ifdef HAVE_MPI
  /* one test a call: enough for MPI to move every pending bucket on */
  int flag = 0;
  if (r->done > r->next && MPI_Test (&r->req[r->done - 1], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag)
    r->done--;
#else
  (void) r;
#endif
}

void
psm_dist_reduce_end (PsmDistReduce *r, double *loss, double *extra, int n)
{
  r->early += (double) r->polled;
  r->updates++;
  while (r->next > 0) {
    size_t b = r->next - 1;
    psm_dist_reduce_bucket (b * r->bucket, MIN (r->n, (b + 1) * r->bucket), r);
  }
#ifdef HAVE_MPI
  MPI_Waitall ((int) r->nb, r->req, MPI_STATUSES_IGNORE);
#endif
  r->done = 0;
  sum_loss (r->share, loss, extra, n);
}

float *
psm_dist_reduce_part (PsmDistReduce *r, size_t *lo, size_t *hi)
{
  *lo = r->shard ? r->bound[dist_rank] : 0;
  *hi = r->shard ? r->bound[dist_rank + 1] : r->n;
  return r->shard ? r->part : r->grad;
}

gboolean psm_dist_reduce_sharded (const PsmDistReduce *r) { return r->shard; }
size_t psm_dist_reduce_bucket_floats (const PsmDistReduce *r) { return r->bucket; }

double
psm_dist_reduce_early (const PsmDistReduce *r)
{
  return r->updates > 0 ? r->early / (r->updates * (double) r->nb) : 0.0;
}

void
psm_dist_reduce_gather (PsmDistReduce *r, float *buf)
{
#ifdef HAVE_MPI
  /* in the reduction's buckets, all under way at once: one collective
   * over the whole buffer ran several times slower (BENCHMARKS.md j) */
  if (!r->shard)
    return;
  for (size_t b = 0; b < r->nb; b++)
    MPI_Iallgatherv (MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf + b * r->bucket, r->counts + b * (size_t) dist_size,
                     r->displ + b * (size_t) dist_size, MPI_FLOAT, MPI_COMM_WORLD, &r->req[b]);
  MPI_Waitall ((int) r->nb, r->req, MPI_STATUSES_IGNORE);
#else
  (void) r;
  (void) buf;
#endif
}

/* Where the ranks run, on rank 0 (NULL elsewhere and on one rank): "2 MPI
 * ranks on 2 hosts: hostA (rank 0), hostB (rank 1)", ranks grouped by host
 * as MPI_Get_processor_name names it. Collective: every rank calls it. */
char *
psm_dist_hosts (void)
{
  if (dist_size < 2)
    return NULL;
  char name[256] = "";
#ifdef HAVE_MPI
  int len = 0;
  char buf[MPI_MAX_PROCESSOR_NAME];
  if (MPI_Get_processor_name (buf, &len) == MPI_SUCCESS)
    g_strlcpy (name, buf, sizeof name);
#endif
  GBytes *mine = g_bytes_new (name, strlen (name));
  GPtrArray *all = psm_dist_gather_bytes (mine);
  g_bytes_unref (mine);
  if (!all)
    return NULL;
  /* hosts in order of their first rank, each with its ranks */
  GPtrArray *hosts = g_ptr_array_new_with_free_func (g_free);
  GPtrArray *ranks = g_ptr_array_new_with_free_func ((GDestroyNotify) g_array_unref);
  for (guint r = 0; r < all->len; r++) {
    gsize n;
    const char *p = g_bytes_get_data (all->pdata[r], &n);
    char *h = n ? g_strndup (p, n) : g_strdup ("?");
    guint k = 0;
    while (k < hosts->len && strcmp (hosts->pdata[k], h) != 0)
      k++;
    if (k == hosts->len) {
      g_ptr_array_add (hosts, h);
      g_ptr_array_add (ranks, g_array_new (FALSE, FALSE, sizeof (int)));
    } else {
      g_free (h);
    }
    int ri = (int) r;
    g_array_append_val (ranks->pdata[k], ri);
  }
  GString *s = g_string_new (NULL);
  g_string_printf (s, "%d MPI ranks on %u host%s:", dist_size, hosts->len, hosts->len == 1 ? "" : "s");
  for (guint k = 0; k < hosts->len; k++) {
    GArray *rk = ranks->pdata[k];
    int first = g_array_index (rk, int, 0), last = g_array_index (rk, int, rk->len - 1);
    g_string_append_printf (s, "%s %s (rank%s %d", k ? "," : "", (char *) hosts->pdata[k], rk->len > 1 ? "s" : "",
                            first);
    if (rk->len > 1 && last - first + 1 == (int) rk->len)
      g_string_append_printf (s, "-%d", last);
    else
      for (guint i = 1; i < rk->len; i++)
        g_string_append_printf (s, " %d", g_array_index (rk, int, i));
    g_string_append_c (s, ')');
  }
  g_ptr_array_unref (hosts);
  g_ptr_array_unref (ranks);
  g_ptr_array_unref (all);
  return g_string_free (s, FALSE);
}

double
psm_dist_time (void)
{
#ifdef HAVE_MPI
  if (dist_on)
    return MPI_Wtime ();
#endif
  return 1e-6 * (double) g_get_monotonic_time ();
}
