/* bench-packed — the packed few-row GEMM of the recurrences alone
 * (psm_packed_gemm, core/ops/packgemm.c) on one thread: C[M, N] = A[M, K]
 * times a [K, N] matrix packed once, for M = 1..16 and 32 rows (a thread's
 * share of a batch) and 60 (the beam search's 6 sentences of 10 hypotheses
 * against a thread's half of an output layer: 1024 7504). Prints microseconds a call and GFLOP/s. Defaults are
 * the LSTM encoder's h W of See et al.'s model (K 256, N 1024); K 1024,
 * N 256 is its backward dG W^T.
 * usage: bench-packed [K [N [seconds per M]]] */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <psm/psm.h>
#include "psm-private.h"

int
main (int argc, char **argv)
{
  int K = argc > 1 ? atoi (argv[1]) : 256, N = argc > 2 ? atoi (argv[2]) : 1024;
  double secs = argc > 3 ? atof (argv[3]) : 0.3;
  if (K < 1 || N < 1 || secs <= 0) {
    fprintf (stderr, "usage: bench-packed [K [N [seconds per M]]]\n");
    return 2;
  }
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
