/* bench-common.h — what bench-see and bench-lm both measure besides the
 * model: the process's peak RSS, this machine's sgemm peak, and the rows of
 * an encoder's input projection. */
#ifndef PSM_BENCH_COMMON_H
#define PSM_BENCH_COMMON_H

#include <cblas.h>
#include <glib.h>
#include <stdlib.h>
#include <sys/resource.h>
#include "run/run-internal.h"

static inline double
peak_rss_mb (void)
{
  struct rusage ru;
  getrusage (RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

/* This machine's sgemm peak as the issues measure it: 2048^3 on the threads
 * psm uses; the best of three windows of about a second each, so that a
 * moment when the host is busy does not lower the reference (one window
 * read 105 GFLOP/s where the others of that hour read 160-170). */
static inline double
sgemm_peak (void)
{
  const int n = 2048;
  float *a = malloc (sizeof (float) * n * n), *b = malloc (sizeof (float) * n * n), *c = malloc (sizeof (float) * n * n);
  for (long i = 0; i < (long) n * n; i++)
    a[i] = b[i] = (float) (i % 7) / 7.0f;
  cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  double best = 0.0;
  for (int w = 0; w < 3; w++) {
    gint64 t0 = g_get_monotonic_time ();
    int it = 0;
    do {
      cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
      it++;
    } while (g_get_monotonic_time () - t0 < 1000000);
    double gf = 2.0 * n * n * n * it / (1e-6 * (double) (g_get_monotonic_time () - t0)) / 1e9;
    best = gf > best ? gf : best;
  }
  free (a);
  free (b);
  free (c);
  return best;
}

/* The rows psm_linear projects for an encoder's input of the R source ids
 * ids (psm-ops.h): the distinct ids when PSM_PROJECT_DISTINCT says so, as
 * core/ops/matmul.c's embedding_linear decides, else all R. */
static inline int
projected_rows (const int32_t *ids, int R, int V)
{
  int u = 0;
  guint8 *seen = g_new0 (guint8, V);
  for (int i = 0; i < R; i++)
    if (!seen[ids[i]]) {
      seen[ids[i]] = 1;
      u++;
    }
  g_free (seen);
  return PSM_PROJECT_DISTINCT (u, R) ? u : R;
}

#endif
