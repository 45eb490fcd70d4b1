/* gemm.c — the dense products every op builds on: psm_gemm (C = alpha
 * op(A) op(B) + beta C through cblas_sgemm, few-row products split by
 * columns over the threads), psm_gemm_packed (C = A op(W) + bias on a
 * packing of W, its column panels over the threads) and psm_colsum_add
 * (the column sums of a bias gradient). No knowledge of the graph. */
#include "config.h"
#include <cblas.h>
#include <omp.h>
#include <string.h>
#include "kernels/kernels-internal.h"

PsmPaths psm_paths = {
  .bf16_amx = TRUE,
  .defer_weights = TRUE,
  .dropout_linear = PSM_PACK_FAST,
  .gru_packed = PSM_PACK_FAST,
  .lstm_cols = TRUE,
  .beam_floor = TRUE,
  .beam_skip_rows = TRUE,
};

void
psm_gemm (gboolean ta, gboolean tb, int M, int N, int K, float alpha,
          const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
  if (M == 0 || N == 0)
    return;
  /* OpenBLAS's OpenMP build hangs when its team is smaller than the thread
   * count it asks for (its level-3 workers wait on each other), which
   * OMP_THREAD_LIMIT below OMP_NUM_THREADS causes: never ask for more. */
  if (omp_get_max_threads () > omp_get_thread_limit ())
    omp_set_num_threads (omp_get_thread_limit ());
  if (K == 0) {
    if (beta == 0.0f)
      for (int i = 0; i < M; i++)
        memset (C + (size_t) i * ldc, 0, N * sizeof (float));
    return;
  }
  /* Few rows (the per-step GEMMs of a recurrence at small batch): split the
   * columns over our threads, each calling single-threaded sgemm (OpenBLAS
   * runs single-threaded inside a parallel region). Measured faster than
   * OpenBLAS's own split here: GRU step B = 32, H = 256, 13.1 -> 12.1 ms
   * (BENCHMARKS.md). Column blocks start on 16-float boundaries; they are
   * cut by the team we got, which OMP_THREAD_LIMIT or a nested region can
   * make smaller than the one asked for. */
  int nt = omp_get_max_threads ();
  if (M <= 64 && N >= 64 * nt && nt > 1 && !omp_in_parallel ()) {
#pragma omp parallel num_threads (nt)
    {
      int t = omp_get_thread_num (), team = omp_get_num_threads ();
      int n0 = (int) ((long) N * t / team) & ~15;
      int n1 = t == team - 1 ? N : (int) ((long) N * (t + 1) / team) & ~15;
      const float *Bt = tb ? B + (size_t) n0 * ldb : B + n0;
      cblas_sgemm (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                   M, n1 - n0, K, alpha, A, lda, Bt, ldb, beta, C + n0, ldc);
    }
    return;
  }
  cblas_sgemm (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
               M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void
psm_gemm_packed (int M, int N, int K, const float *A, int lda, const float *wp, const float *bias, gboolean acc,
                 float *C, int ldc)
{
  int panels = psm_pack_panels (N);
  int nt = omp_in_parallel () ? 1 : MAX (1, MIN (omp_get_max_threads (), panels / 4));
#pragma omp parallel num_threads (nt)
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    int c0 = p0 * PSM_PACK_NR, c1 = MIN (N, p1 * PSM_PACK_NR);
    if (c1 > c0)
      psm_packed_gemm_store (M, K, c1 - c0, A, lda, wp + (size_t) p0 * K * PSM_PACK_NR, C + c0, ldc,
                             bias ? bias + c0 : NULL, acc);
  }
}

void
psm_colsum_add (int R, int C, const float *restrict x, float *restrict out)
{
  /* Column blocks over the threads when there is enough work; each thread
   * adds its rows in order, so the result does not depend on the split. */
#pragma omp parallel for if ((long) R * C >= 65536) schedule (static)
  for (int j0 = 0; j0 < C; j0 += 256) {
    int j1 = MIN (C, j0 + 256);
    for (int r = 0; r < R; r++) {
      const float *xr = x + (size_t) r * C;
#pragma omp simd
      for (int j = j0; j < j1; j++)
        out[j] += xr[j];
    }
  }
}
