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

void
psm_dist_reduce_update (float *grad, size_t P, double share, double *loss, double *extra, int n)
{
  if (dist_size < 2)
    return;
  float k = (float) share;
#pragma omp parallel for simd if (P >= 32768) schedule (static)
  for (size_t i = 0; i < P; i++)
    grad[i] *= k;
  psm_dist_sum_float (grad, P);
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
