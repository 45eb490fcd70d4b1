/* dropout.c — regularisers that are random in training and deterministic
 * otherwise (the graph's rng says which, psm_graph_set_rng).
 *
 * Locked (variational) dropout, Gal & Ghahramani 2016: one Bernoulli mask
 * per (example, unit), the same at every time step of x [T, B, C] (for a
 * 2-D x it is plain dropout):
 *   y[t, b, c] = x[t, b, c] m[b, c],  m = [u >= p] / (1 - p),  u ~ U[0, 1)
 * and y = x when not training (inverted dropout: the expectation matches).
 * Backward: dx += dy m.
 *
 * Noisy tanh with a learned p (Gulcehre, Moczulski, Denil & Bengio 2016,
 * "Noisy Activation Functions", their NAN unit with learned p and normal
 * noise), per unit c of x [..., C]:
 *   h = hardtanh(x), D = h - x, q = sigmoid(p_c D), s = k (q - 1/2)^2
 *   y = alpha h + (1 - alpha) x - sgn(x) s xi,   xi ~ N(0, 1)
 * and xi = 0, its expectation, when not training. With h' = [|x| < 1]:
 *   dy/dx = alpha h' + 1 - alpha - sgn(x) xi 2 k (q - 1/2) q (1 - q) p_c (h' - 1)
 *   dy/dp_c = -sgn(x) xi 2 k (q - 1/2) q (1 - q) D */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"

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
  /* elementwise: the threads share the periods out, the same products */
  size_t np = x->n / period;
#pragma omp parallel for if (x->n >= 65536) schedule (static)
  for (size_t o = 0; o < np; o++) {
    const float *xs = x->data + o * period;
    float *ys = y->data + o * period;
#pragma omp simd
    for (size_t i = 0; i < period; i++)
      ys[i] = xs[i] * m[i];
  }
  psm_graph_note_dropout (g, y->data, y->n, m, period);   /* for psm_linear of y */
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
  size_t np = x->n / period;
  if (x->grad) {
#pragma omp parallel for if (x->n >= 65536) schedule (static)
    for (size_t o = 0; o < np; o++) {
      float *dx = x->grad + o * period;
      const float *dy = y->grad + o * period;
#pragma omp simd
      for (size_t i = 0; i < period; i++)
        dx[i] += dy[i] * m[i];
    }
  }
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

static inline float
sgnf (float x)
{
  return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
}

PsmTensor *
psm_noisy_tanh (PsmGraph *g, PsmTensor *x, PsmTensor *p, float alpha, float c)
{
  g_return_val_if_fail (x && p && x->ndim >= 1 && p->n == (size_t) psm_tensor_cols (x), NULL);
  PsmRng *rng = psm_graph_rng (g);
  int C = psm_tensor_cols (x);
  float *xi = NULL;
  if (rng) {
    xi = psm_graph_alloc (g, x->n * sizeof (float));
    for (size_t i = 0; i < x->n; i++)
      xi[i] = (float) psm_rng_normal (rng);
  }
  PsmTensor *in[2] = { x, p };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 2, in);
  for (size_t i = 0; i < x->n; i++) {
    float v = x->data[i], h = v > 1.0f ? 1.0f : v < -1.0f ? -1.0f : v;
    float out = alpha * h + (1.0f - alpha) * v;
    if (xi) {
      float q = 1.0f / (1.0f + expf (-p->data[i % C] * (h - v)));
      out -= sgnf (v) * c * (q - 0.5f) * (q - 0.5f) * xi[i];
    }
    y->data[i] = out;
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_NOISY_TANH, y, 2, in);
  if (n) {
    n->aux[0] = xi;
    n->farg[0] = alpha;
    n->farg[1] = c;
  }
  return y;
}

void
psm_noisy_tanh_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *p = n->in[1], *y = n->out;
  const float *xi = n->aux[0];
  float alpha = n->farg[0], c = n->farg[1];
  int C = psm_tensor_cols (x);
  for (size_t i = 0; i < x->n; i++) {
    float v = x->data[i], dy = y->grad[i];
    float hp = fabsf (v) < 1.0f ? 1.0f : 0.0f;
    float dx = alpha * hp + 1.0f - alpha;
    if (xi && xi[i] != 0.0f) {
      float h = v > 1.0f ? 1.0f : v < -1.0f ? -1.0f : v, pc = p->data[i % C];
      float q = 1.0f / (1.0f + expf (-pc * (h - v)));
      float ds = -sgnf (v) * xi[i] * 2.0f * c * (q - 0.5f) * q * (1.0f - q);   /* d y / d (p D) */
      dx += ds * pc * (hp - 1.0f);
      if (p->grad)
        p->grad[i % C] += dy * ds * (h - v);
    }
    if (x->grad)
      x->grad[i] += dy * dx;
  }
}
