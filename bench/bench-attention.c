/* bench-attention — the fused additive attention alone (psm_additive_attention
 * with coverage, as in See et al.'s decoder): 100 decoder steps over the same
 * keys and values, each its forward, then its backward into the keys'
 * gradient, which the steps share as in training. Prints the mean forward
 * and backward time a step; the threads are OMP_NUM_THREADS.
 * usage: bench-attention [T [A [B]]]   (defaults 400 512 16; values of A) */
#include "config.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <psm/psm.h>

static float *
uniform (PsmRng *rng, size_t n, float scale, float shift)
{
  float *x = malloc (n * sizeof (float));
  for (size_t i = 0; i < n; i++)
    x[i] = scale * ((float) psm_rng_uniform (rng) - 0.5f) + shift;
  return x;
}

int
main (int argc, char **argv)
{
  int T = argc > 1 ? atoi (argv[1]) : 400, A = argc > 2 ? atoi (argv[2]) : 512, B = argc > 3 ? atoi (argv[3]) : 16;
  int H = A, steps = 100;
  if (T < 1 || A < 1 || B < 1) {
    fprintf (stderr, "usage: bench-attention [T [A [B]]]\n");
    return 2;
  }
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  size_t nk = (size_t) T * B * A, nh = (size_t) T * B * H;
  float *K = uniform (&rng, nk, 2, 0), *dK = calloc (nk, sizeof (float)), *V = uniform (&rng, nh, 2, 0);
  float *v = uniform (&rng, A, 0.2f, 0), *dv = calloc (A, sizeof (float));
  float *wc = uniform (&rng, A, 0.5f, 0), *dwc = calloc (A, sizeof (float));
  double tf = 0, tb = 0;
  for (int s = 0; s < steps; s++) {
    float *q = uniform (&rng, (size_t) B * A, 2, 0), *dq = calloc ((size_t) B * A, sizeof (float));
    float *cov = uniform (&rng, (size_t) B * T, 1, 0.5f), *dcov = calloc ((size_t) B * T, sizeof (float));
    PsmGraph *g = psm_graph_new ();
    double t0 = omp_get_wtime ();
    PsmTensor *a, *ctx;
    psm_additive_attention (g, psm_tensor_wrap (g, K, dK, 3, (int[]) { T, B, A }),
                            psm_tensor_wrap (g, q, dq, 2, (int[]) { B, A }), psm_tensor_wrap (g, v, dv, 1, (int[]) { A }),
                            psm_tensor_wrap (g, wc, dwc, 1, (int[]) { A }),
                            psm_tensor_wrap (g, cov, dcov, 2, (int[]) { B, T }),
                            psm_tensor_wrap (g, V, NULL, 3, (int[]) { T, B, H }), NULL, &a, &ctx);
    double t1 = omp_get_wtime ();
    PsmTensor *l = psm_sum (g, ctx);
    double t2 = omp_get_wtime ();
    psm_backward (g, l);
    double t3 = omp_get_wtime ();
    tf += t1 - t0;
    tb += t3 - t2;
    psm_graph_free (g);
    free (q);
    free (dq);
    free (cov);
    free (dcov);
  }
  printf ("attention B=%d T=%d A=%d, %d threads: forward %.3f ms, backward %.3f ms a step (%.3f / %.3f ns an "
          "element a thread)\n", B, T, A, omp_get_max_threads (), 1e3 * tf / steps, 1e3 * tb / steps,
          1e9 * tf / steps / nk * omp_get_max_threads (), 1e9 * tb / steps / nk * omp_get_max_threads ());
  free (K);
  free (dK);
  free (V);
  free (v);
  free (dv);
  free (wc);
  free (dwc);
  return 0;
}
