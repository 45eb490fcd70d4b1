/* bench-gru — one GRU training step in psm: input projection (one GEMM over
 * all steps), fused GRU over T steps, loss = sum(h * R), backward, SGD
 * update. Same computation as bench/gru_torch.py. Prints ms per step.
 * usage: bench-gru B H [T] [seconds] */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <psm/psm.h>

int
main (int argc, char **argv)
{
  if (argc < 3) {
    fprintf (stderr, "usage: bench-gru B H [T] [seconds]\n");
    return 2;
  }
  int B = atoi (argv[1]), H = atoi (argv[2]), T = argc > 3 ? atoi (argv[3]) : 35, E = H;
  double min_time = argc > 4 ? atof (argv[4]) : 3.0;
  PsmParams *p = psm_params_new ();
  int w_x = psm_params_add (p, "w_x", 2, (int[]) { E, 3 * H }, PSM_INIT_XAVIER, 0);
  int b_x = psm_params_add (p, "b_x", 1, (int[]) { 3 * H }, PSM_INIT_ZEROS, 0);
  int w_h = psm_params_add (p, "w_h", 2, (int[]) { H, 3 * H }, PSM_INIT_ORTHOGONAL, 0);
  int b_h = psm_params_add (p, "b_h", 1, (int[]) { 3 * H }, PSM_INIT_ZEROS, 0);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  if (!psm_params_finalize (p, &rng, NULL))
    return 1;
  PsmOptConfig oc = { .kind = PSM_OPT_SGD, .lr = 1e-4 };
  PsmOptim *o = psm_optim_new (&oc, p);
  float *x = malloc (sizeof (float) * T * B * E), *r = malloc (sizeof (float) * T * B * H);
  for (long i = 0; i < (long) T * B * E; i++)
    x[i] = (float) psm_rng_normal (&rng);
  for (long i = 0; i < (long) T * B * H; i++)
    r[i] = (float) psm_rng_normal (&rng);
  PsmGraph *g = psm_graph_new ();
  int sx[3] = { T, B, E }, sh[3] = { T, B, H }, s0[2] = { B, H };
  long steps = 0;
  double t0 = 0, t = 0;
  for (long warm = 0;; steps++) {
    if (warm == 0 && steps == 3) {   /* 3 warm-up steps, then time */
      warm = 1;
      steps = 0;
      t0 = g_get_monotonic_time () / 1e6;
    }
    psm_graph_reset (g);
    PsmTensor *xt = psm_tensor_wrap (g, x, NULL, 3, sx);
    PsmTensor *xp = psm_linear (g, xt, psm_param (g, p, w_x), psm_param (g, p, b_x));
    PsmTensor *hs = psm_gru_seq (g, xp, psm_tensor_zeros (g, 2, s0, FALSE), psm_param (g, p, w_h),
                                 psm_param (g, p, b_h), NULL);
    PsmTensor *loss = psm_sum (g, psm_mul (g, hs, psm_tensor_wrap (g, r, NULL, 3, sh)));
    psm_backward (g, loss);
    psm_optim_step_zero (o, steps, 1.0f);
    if (warm && (t = g_get_monotonic_time () / 1e6 - t0) >= min_time) {
      steps++;
      break;
    }
  }
  printf ("psm B=%d H=%d T=%d: %.3f ms/step (%ld steps)\n", B, H, T, 1e3 * t / steps, steps);
  psm_graph_free (g);
  psm_optim_free (o);
  psm_params_free (p);
  free (x);
  free (r);
  return 0;
}
