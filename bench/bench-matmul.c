/* bench-matmul — psm's matmul op (forward + backward through the tape)
 * against three bare cblas_sgemm calls doing the same work:
 *   C = A W,  dA = dC W^T,  dW = A^T dC
 * on the GEMM shapes of one GRU step ([B,H] x [H,3H]) and LSTM step
 * ([B,H] x [H,4H]). Prints GFLOP/s of both and their ratio. */
#include "config.h"
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>

static double
now (void)
{
  return g_get_monotonic_time () / 1e6;
}

static void
fill (float *x, size_t n)
{
  for (size_t i = 0; i < n; i++)
    x[i] = (float) ((rand () % 2001) - 1000) / 1000.0f;
}

int
main (int argc, char **argv)
{
  double min_time = argc > 1 ? atof (argv[1]) : 1.0;
  int Bs[] = { 16, 64, 250 }, Hs[] = { 256, 1000 }, gates[] = { 3, 4 };
  printf ("%-5s %-5s %-5s %12s %12s %8s\n", "cell", "B", "H", "sgemm GF/s", "psm GF/s", "psm/sgemm");
  for (int gi = 0; gi < 2; gi++)
    for (int hi = 0; hi < 2; hi++)
      for (int bi = 0; bi < 3; bi++) {
        int B = Bs[bi], H = Hs[hi], N = gates[gi] * H;
        float *A = malloc (sizeof (float) * B * H), *W = malloc (sizeof (float) * H * N);
        float *C = malloc (sizeof (float) * B * N), *dC = malloc (sizeof (float) * B * N);
        float *dA = malloc (sizeof (float) * B * H), *dW = malloc (sizeof (float) * H * N);
        fill (A, (size_t) B * H);
        fill (W, (size_t) H * N);
        fill (dC, (size_t) B * N);
        double flops = 3.0 * 2.0 * B * H * N;
        /* bare sgemm */
        long it = 0;
        double t0 = now (), t;
        do {
          cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasNoTrans, B, N, H, 1, A, H, W, N, 0, C, N);
          cblas_sgemm (CblasRowMajor, CblasNoTrans, CblasTrans, B, H, N, 1, dC, N, W, N, 1, dA, H);
          cblas_sgemm (CblasRowMajor, CblasTrans, CblasNoTrans, H, N, B, 1, A, H, dC, N, 1, dW, N);
          it++;
        } while ((t = now () - t0) < min_time);
        double gf_blas = flops * it / t / 1e9;
        /* psm: forward op, backward pass with dC as the seed */
        PsmGraph *g = psm_graph_new ();
        int sa[2] = { B, H }, sw[2] = { H, N };
        it = 0;
        t0 = now ();
        do {
          psm_graph_reset (g);
          PsmTensor *a = psm_tensor_wrap (g, A, dA, 2, sa), *w = psm_tensor_wrap (g, W, dW, 2, sw);
          PsmTensor *c = psm_matmul (g, a, w, FALSE, FALSE);
          /* seed dC directly (a sum would add an O(BN) pass both sides lack) */
          memcpy (c->grad, dC, sizeof (float) * B * N);
          PsmTensor *one = psm_tensor_zeros (g, 1, (int[]) { 1 }, TRUE);
          one->grad[0] = 0.0f;
          /* run the tape: only the matmul node is recorded */
          psm_backward (g, one);
          it++;
        } while ((t = now () - t0) < min_time);
        double gf_psm = flops * it / t / 1e9;
        printf ("%-5s %-5d %-5d %12.1f %12.1f %8.3f\n", gi ? "lstm" : "gru", B, H, gf_blas, gf_psm, gf_psm / gf_blas);
        fflush (stdout);
        psm_graph_free (g);
        free (A); free (W); free (C); free (dC); free (dA); free (dW);
      }
  return 0;
}
