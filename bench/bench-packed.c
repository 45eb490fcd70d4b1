/* bench-packed — the packed few-row GEMM of the recurrences alone
 * (psm_packed_gemm, core/kernels/packgemm.c) on one thread: C[M, N] = A[M, K]
 * times a [K, N] matrix packed once, for M = 1..16 and 32 rows (a thread's
 * share of a batch) and 60 (the beam search's 6 sentences of 10 hypotheses
 * against a thread's half of an output layer: 1024 7504). Prints microseconds a call and GFLOP/s. Defaults are
 * the LSTM encoder's h W of See et al.'s model (K 256, N 1024); K 1024,
 * N 256 is its backward dG W^T.
 * With ROWS (e.g. 1024 15000 2 640: the 15k decoder's output layer at
 * 64 sentences of 10 hypotheses), instead: psm_gemm_packed on all the
 * threads (OMP_NUM_THREADS), C = A W + b for ROWS rows, against what
 * psm_linear's BLAS path does (the bias copied into C, then cblas_sgemm
 * with beta 1), three rounds alternating, GFLOP/s of each.
 * usage: bench-packed [K [N [seconds per M [ROWS]]]] */
#include "config.h"
#include <cblas.h>
#include <string.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <psm/psm.h>
#include "run/run-internal.h"

char *openblas_get_corename (void);   /* OpenBLAS extension, in its cblas.h */

/* "family F model M" of this CPU, from /proc/cpuinfo ("" elsewhere) */
static void
print_cpu (void)
{
  char *info = NULL, fam[16] = "", mod[16] = "";
  if (g_file_get_contents ("/proc/cpuinfo", &info, NULL, NULL)) {
    const char *f = strstr (info, "cpu family"), *m = strstr (info, "\nmodel\t");
    if (f && (f = strchr (f, ':')))
      sscanf (f + 1, "%15s", fam);
    if (m && (m = strchr (m, ':')))
      sscanf (m + 1, "%15s", mod);
  }
  printf ("# CPU family %s model %s\n", fam, mod);
  g_free (info);
}

static double
now (void)
{
  return g_get_monotonic_time () / 1e6;
}

/* ROWS x K x N with a bias: the packed product on every thread against
 * psm_linear's BLAS path, alternating. */
static int
threaded (int M, int K, int N, double secs)
{
  PsmRng rng;
  psm_rng_seed (&rng, 2);
  float *A = g_new (float, (size_t) M * K), *W = g_new (float, (size_t) K * N), *b = g_new (float, N);
  float *C = g_new (float, (size_t) M * N);
  float *wp = psm_xaligned (psm_packed_floats (K, N) * sizeof (float), "bench");
  for (size_t i = 0; i < (size_t) M * K; i++)
    A[i] = (float) psm_rng_uniform (&rng) - 0.5f;
  for (size_t i = 0; i < (size_t) K * N; i++)
    W[i] = (float) psm_rng_uniform (&rng) - 0.5f;
  for (int j = 0; j < N; j++)
    b[j] = (float) psm_rng_uniform (&rng) - 0.5f;
  psm_pack (K, N, W, N, FALSE, wp);   /* once, as a decoding keeps it */
  double flop = 2.0 * M * K * N;
  print_cpu ();
  printf ("C = A W + b, M=%d K=%d N=%d, %d threads, %s, %s\n", M, K, N, omp_get_max_threads (),
          PSM_PACK_WIDE ? "wide kernel from 48 rows" : "8-row kernel", openblas_get_corename ());
  for (int round = 0; round < 3; round++) {
    long calls = 0;
    double t0 = now (), t;
    do {
      psm_gemm_packed (M, N, K, A, K, wp, b, FALSE, C, N);
      calls++;
    } while ((t = now () - t0) < secs);
    double gp = flop * calls / t * 1e-9;
    calls = 0;
    t0 = now ();
    do {
#pragma omp parallel for schedule (static)
      for (int r = 0; r < M; r++)
        memcpy (C + (size_t) r * N, b, N * sizeof (float));
      cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, W, N, 1.0f, C, N);
      calls++;
    } while ((t = now () - t0) < secs);
    double gb = flop * calls / t * 1e-9;
    printf ("  round %d: psm_gemm_packed %6.1f GFLOP/s, cblas_sgemm %6.1f GFLOP/s, ratio %.3f\n", round + 1, gp, gb,
            gp / gb);
  }
  free (wp);
  g_free (A);
  g_free (W);
  g_free (b);
  g_free (C);
  return 0;
}

int
main (int argc, char **argv)
{
  int K = argc > 1 ? atoi (argv[1]) : 256, N = argc > 2 ? atoi (argv[2]) : 1024;
  double secs = argc > 3 ? atof (argv[3]) : 0.3;
  int rows = argc > 4 ? atoi (argv[4]) : 0;
  if (K < 1 || N < 1 || secs <= 0 || (argc > 4 && rows < 1)) {
    fprintf (stderr, "usage: bench-packed [K [N [seconds per M [ROWS]]]]\n");
    return 2;
  }
  if (rows)
    return threaded (rows, K, N, secs);
  int Ms[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 32, 60 }, ldc = psm_pack_panels (N) * PSM_PACK_NR;
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  float *A = g_new (float, (size_t) 64 * K), *B = g_new (float, (size_t) K * N);
  float *C = psm_xaligned ((size_t) 64 * ldc * sizeof (float), "bench");
  float *bp = psm_xaligned (psm_packed_floats (K, N) * sizeof (float), "bench");
  for (size_t i = 0; i < (size_t) 64 * K; i++)
    A[i] = (float) psm_rng_uniform (&rng) - 0.5f;
  for (size_t i = 0; i < (size_t) K * N; i++)
    B[i] = (float) psm_rng_uniform (&rng) - 0.5f;
  psm_pack (K, N, B, N, FALSE, bp);
  printf ("packed GEMM, one thread, K=%d N=%d (%d floats a vector, %d-column panels)\n", K, N, PSM_PACK_VL,
          PSM_PACK_NR);
  for (size_t mi = 0; mi < G_N_ELEMENTS (Ms); mi++) {
    int M = Ms[mi];
    long calls = 0;
    double t0 = g_get_monotonic_time () / 1e6, t;
    do {
      for (int r = 0; r < 100; r++, calls++)
        psm_packed_gemm (M, K, N, A, K, bp, C, ldc);
      t = g_get_monotonic_time () / 1e6 - t0;
    } while (t < secs);
    double per = t / calls;
    printf ("  M=%2d: %8.1f us a call, %6.1f GFLOP/s\n", M, per * 1e6, 2.0 * M * K * N / per * 1e-9);
  }
  free (C);
  free (bp);
  g_free (A);
  g_free (B);
  return 0;
}
