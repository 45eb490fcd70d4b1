/* bench-attention — the fused additive attention alone (psm_additive_attention
 * with coverage, as in See et al.'s decoder): 100 decoder steps over the same
 * keys and values, each its forward, then its backward into the keys'
 * gradient, which the steps share as in training. Prints the mean forward
 * and backward time a step; the threads are OMP_NUM_THREADS.
 * usage: bench-attention [T [A [B [MODE]]]]   (defaults 400 512 16 0; values
 * of A features; MODE 0 a graph a step, 1 and 2 one graph for all the steps
 * without and with the batch-major copies, below, 3 as 2 on a graph with
 * train.precision bf16, whose copies are rounded to bfloat16) */
#include "config.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <psm/psm.h>
#include "run/run-internal.h"

static float *
uniform (PsmRng *rng, size_t n, float scale, float shift)
{
  float *x = malloc (n * sizeof (float));
  for (size_t i = 0; i < n; i++)
    x[i] = scale * ((float) psm_rng_uniform (rng) - 0.5f) + shift;
  return x;
}

/* A decoder step's own inputs: its query [B, A] and coverage [B, T], drawn
 * in that order, with zeroed gradients. */
typedef struct {
  float *q, *dq, *cov, *dcov;
} StepIn;

static void
step_in_draw (StepIn *in, PsmRng *rng, int T, int A, int B)
{
  in->q = uniform (rng, (size_t) B * A, 2, 0);
  in->dq = calloc ((size_t) B * A, sizeof (float));
  in->cov = uniform (rng, (size_t) B * T, 1, 0.5f);
  in->dcov = calloc ((size_t) B * T, sizeof (float));
}

static void
step_in_free (StepIn *in)
{
  free (in->q);
  free (in->dq);
  free (in->cov);
  free (in->dcov);
}

/* The op for one step over keys [T, B, A] and values [T, B, A], v and w_c
 * [A] with their gradients: returns the context [B, A]. */
static PsmTensor *
attention_step (PsmGraph *g, PsmTensor *keys, PsmTensor *values, const StepIn *in, float *v, float *dv, float *wc,
                float *dwc, int T, int A, int B)
{
  PsmTensor *a, *ctx;
  psm_additive_attention (g, keys, psm_tensor_wrap (g, in->q, in->dq, 2, (int[]) { B, A }),
                          psm_tensor_wrap (g, v, dv, 1, (int[]) { A }), psm_tensor_wrap (g, wc, dwc, 1, (int[]) { A }),
                          psm_tensor_wrap (g, in->cov, in->dcov, 2, (int[]) { B, T }), values, NULL, &a, &ctx);
  return ctx;
}

/* Mode 0: a graph a step, the values without gradient; the forward time is
 * the op's, the backward time the pass through it. */
static void
graph_a_step (int steps, int T, int A, int B, float *K, float *dK, float *V, float *v, float *dv, float *wc,
              float *dwc, PsmRng *rng, double *tf, double *tb)
{
  for (int s = 0; s < steps; s++) {
    StepIn in;
    step_in_draw (&in, rng, T, A, B);
    PsmGraph *g = psm_graph_new ();
    double t0 = omp_get_wtime ();
    PsmTensor *ctx = attention_step (g, psm_tensor_wrap (g, K, dK, 3, (int[]) { T, B, A }),
                                     psm_tensor_wrap (g, V, NULL, 3, (int[]) { T, B, A }), &in, v, dv, wc, dwc, T, A,
                                     B);
    double t1 = omp_get_wtime ();
    PsmTensor *l = psm_sum (g, ctx);
    double t2 = omp_get_wtime ();
    psm_backward (g, l);
    double t3 = omp_get_wtime ();
    *tf += t1 - t0;
    *tb += t3 - t2;
    psm_graph_free (g);
    step_in_free (&in);
  }
}

/* Modes 1 and 2: one graph for all the steps, as a training step has it:
 * the values' gradient deferred (psm_defer_values_grad), with (2) or
 * without (1) the batch-major copies of the keys and values, whose making
 * is counted in the forward time and whose gradient's return in the
 * backward time; then one backward pass through all the steps. Run twice,
 * the second timed: a training step reuses the arena the first grew. */
static void
one_graph (int mode, int steps, int T, int A, int B, float *K, float *dK, float *V, float *dV, float *v, float *dv,
           float *wc, float *dwc, PsmRng *rng, double *tf, double *tb)
{
  StepIn *in = malloc (steps * sizeof *in);
  for (int s = 0; s < steps; s++)
    step_in_draw (&in[s], rng, T, A, B);
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_batch_major (g, mode >= 2);
  psm_graph_set_bf16_train (g, mode == 3);
  for (int round = 0; round < 2; round++) {   /* timed: the second, on the arena the first has grown */
    psm_graph_reset (g);
    double t0 = omp_get_wtime ();
    PsmTensor *keys = psm_tensor_wrap (g, K, dK, 3, (int[]) { T, B, A });
    PsmTensor *values = psm_tensor_wrap (g, V, dV, 3, (int[]) { T, B, A });
    psm_defer_values_grad (g, values);
    psm_attention_batch_major (g, values);
    psm_attention_batch_major (g, keys);
    PsmTensor *l = NULL;
    for (int s = 0; s < steps; s++) {
      PsmTensor *ls = psm_sum (g, attention_step (g, keys, values, &in[s], v, dv, wc, dwc, T, A, B));
      l = l ? psm_add (g, l, ls) : ls;
    }
    double t1 = omp_get_wtime ();
    psm_backward (g, l);
    double t2 = omp_get_wtime ();
    *tf = t1 - t0;
    *tb = t2 - t1;
  }
  psm_graph_free (g);
  for (int s = 0; s < steps; s++)
    step_in_free (&in[s]);
  free (in);
}

int
main (int argc, char **argv)
{
  int T = argc > 1 ? atoi (argv[1]) : 400, A = argc > 2 ? atoi (argv[2]) : 512, B = argc > 3 ? atoi (argv[3]) : 16;
  int mode = argc > 4 ? atoi (argv[4]) : 0;
  int H = A, steps = 100;
  if (T < 1 || A < 1 || B < 1 || mode < 0 || mode > 3) {
    fprintf (stderr, "usage: bench-attention [T [A [B [MODE]]]]   (MODE 0: a graph a step; 1: one graph, "
             "time-major; 2: one graph, batch-major copies; 3: those in bfloat16)\n");
    return 2;
  }
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  size_t nk = (size_t) T * B * A, nh = (size_t) T * B * H;
  float *K = uniform (&rng, nk, 2, 0), *dK = calloc (nk, sizeof (float)), *V = uniform (&rng, nh, 2, 0);
  float *v = uniform (&rng, A, 0.2f, 0), *dv = calloc (A, sizeof (float));
  float *wc = uniform (&rng, A, 0.5f, 0), *dwc = calloc (A, sizeof (float));
  double tf = 0, tb = 0;
  if (mode) {
    float *dV = calloc (nh, sizeof (float));
    one_graph (mode, steps, T, A, B, K, dK, V, dV, v, dv, wc, dwc, &rng, &tf, &tb);
    free (dV);
  }
  else
    graph_a_step (steps, T, A, B, K, dK, V, v, dv, wc, dwc, &rng, &tf, &tb);
  printf ("attention B=%d T=%d A=%d, %s, %d threads: forward %.3f ms, backward %.3f ms a step (%.3f / %.3f ns an "
          "element a thread)\n", B, T, A,
          mode == 0 ? "a graph a step" : mode == 1 ? "one graph" : mode == 2 ? "one graph, batch-major copies"
          : "one graph, batch-major copies in bfloat16", omp_get_max_threads (), 1e3 * tf / steps, 1e3 * tb / steps,
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
