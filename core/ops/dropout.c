/* dropout.c — regularisers that are random in training and deterministic
 * otherwise (the graph's rng says which, psm_graph_set_rng).
 *
 * Locked (variational) dropout, Gal & Ghahramani 2016: one Bernoulli mask
 * per (example, unit), the same at every time step of x [T, B, C] (for a
 * 2-D x it is plain dropout):
 *   y[t, b, c] = x[t, b, c] m[b, c],  m = [u >= p] / (1 - p),  u ~ U[0, 1)
 * and y = x when not training (inverted dropout: the expectation matches).
 * Backward: dx += dy m. */
#include "config.h"
#include <string.h>
#include "psm-private.h"

PsmTensor *
psm_locked_dropout (PsmGraph *g, PsmTensor *x, float p)
{
  g_return_val_if_fail (x && x->ndim >= 2 && p >= 0.0f && p < 1.0f, NULL);
  PsmRng *rng = psm_graph_rng (g);
  if (!rng || p == 0.0f)
    return x;
  size_t period = x->ndim == 2 ? x->n : x->n / (size_t) x->shape[0];
  float *m = psm_graph_alloc (g, period * sizeof (float));
  float keep = 1.0f / (1.0f - p);
  uint32_t below = (uint32_t) MIN ((double) p * 4294967296.0, 4294967295.0);   /* P(u32 < below) = p */
  for (size_t i = 0; i < period; i++)
    m[i] = psm_rng_u32 (rng) >= below ? keep : 0.0f;
  PsmTensor *in[1] = { x };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 1, in);
  for (size_t o = 0; o < x->n; o += period)
    for (size_t i = 0; i < period; i++)
      y->data[o + i] = x->data[o + i] * m[i];
  PsmNode *n = psm_graph_record (g, PSM_OP_LOCKED_DROPOUT, y, 1, in);
  if (n)
    n->aux[0] = m;
  return y;
}

void
psm_locked_dropout_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *y = n->out;
  const float *m = n->aux[0];
  size_t period = x->ndim == 2 ? x->n : x->n / (size_t) x->shape[0];
  if (x->grad)
    for (size_t o = 0; o < x->n; o += period)
      for (size_t i = 0; i < period; i++)
        x->grad[o + i] += y->grad[o + i] * m[i];
}

float *
psm_zoneout_weights (PsmGraph *g, float z, size_t n)
{
  g_return_val_if_fail (z >= 0.0f && z < 1.0f, NULL);
  float *d = psm_graph_alloc (g, n * sizeof (float));
  PsmRng *rng = psm_graph_rng (g);
  uint32_t below = (uint32_t) MIN ((double) z * 4294967296.0, 4294967295.0);   /* P(u32 < below) = z */
  for (size_t i = 0; i < n; i++)
    d[i] = rng ? (psm_rng_u32 (rng) < below ? 1.0f : 0.0f) : z;
  return d;
}
