/* elementwise.c — add (with tiling), mul, scale, sigmoid, tanh, relu, maxout.
 *   add:     y = a + b[i mod |b|];  da += dy,  db[j] += sum_{i mod |b| = j} dy[i]
 *   mul:     y = a * b;             da += dy * b,  db += dy * a
 *   scale:   y = k a;               da += k dy
 *   sigmoid: y = 1 / (1 + e^-x);    dx += dy y (1 - y)   (fastmath.h)
 *   tanh:    y = tanh x;            dx += dy (1 - y^2)
 *   relu:    y = max(x, 0);         dx += dy [y > 0]
 *   maxout:  y[r, j] = max_{i < k} x[r, j k + i]  (Goodfellow et al. 2013:
 *            each output pools k consecutive columns); dx += dy at the
 *            first column that attains the max */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

PsmTensor *
psm_add (PsmGraph *g, PsmTensor *a, PsmTensor *b)
{
  g_return_val_if_fail (b->n > 0 && a->n % b->n == 0, NULL);
  PsmTensor *in[2] = { a, b };
  PsmTensor *y = psm_op_out (g, a->ndim, a->shape, 2, in);
  size_t nb = b->n;
  for (size_t i = 0; i < a->n; i += nb)
    for (size_t j = 0; j < nb; j++)
      y->data[i + j] = a->data[i + j] + b->data[j];
  psm_graph_record (g, PSM_OP_ADD, y, 2, in);
  return y;
}

void
psm_add_backward (PsmNode *n)
{
  PsmTensor *a = n->in[0], *b = n->in[1], *y = n->out;
  if (a->grad)
    for (size_t i = 0; i < a->n; i++)
      a->grad[i] += y->grad[i];
  if (b->grad)
    psm_colsum_add ((int) (a->n / b->n), (int) b->n, y->grad, b->grad);
}

PsmTensor *
psm_mul (PsmGraph *g, PsmTensor *a, PsmTensor *b)
{
  g_return_val_if_fail (a->n == b->n, NULL);
  PsmTensor *in[2] = { a, b };
  PsmTensor *y = psm_op_out (g, a->ndim, a->shape, 2, in);
  for (size_t i = 0; i < a->n; i++)
    y->data[i] = a->data[i] * b->data[i];
  psm_graph_record (g, PSM_OP_MUL, y, 2, in);
  return y;
}

void
psm_mul_backward (PsmNode *n)
{
  PsmTensor *a = n->in[0], *b = n->in[1], *y = n->out;
  if (a->grad)
    for (size_t i = 0; i < a->n; i++)
      a->grad[i] += y->grad[i] * b->data[i];
  if (b->grad)
    for (size_t i = 0; i < a->n; i++)
      b->grad[i] += y->grad[i] * a->data[i];
}

PsmTensor *
psm_scale (PsmGraph *g, PsmTensor *a, float k)
{
  PsmTensor *in[1] = { a };
  PsmTensor *y = psm_op_out (g, a->ndim, a->shape, 1, in);
  for (size_t i = 0; i < a->n; i++)
    y->data[i] = k * a->data[i];
  PsmNode *n = psm_graph_record (g, PSM_OP_SCALE, y, 1, in);
  if (n)
    n->farg[0] = k;
  return y;
}

void
psm_scale_backward (PsmNode *n)
{
  float k = n->farg[0];
  for (size_t i = 0; i < n->out->n; i++)
    n->in[0]->grad[i] += k * n->out->grad[i];
}

#define UNARY(fname, OP, expr)                                                 \
  PsmTensor *psm_##fname (PsmGraph *g, PsmTensor *x)                           \
  {                                                                            \
    PsmTensor *in[1] = { x };                                                  \
    PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 1, in);                   \
    _Pragma ("omp simd")                                                       \
    for (size_t i = 0; i < x->n; i++) {                                        \
      float v = x->data[i];                                                    \
      y->data[i] = (expr);                                                     \
    }                                                                          \
    psm_graph_record (g, OP, y, 1, in);                                        \
    return y;                                                                  \
  }

UNARY (sigmoid, PSM_OP_SIGMOID, psm_fast_sigmoidf (v))
UNARY (tanh, PSM_OP_TANH, psm_fast_tanhf (v))
UNARY (relu, PSM_OP_RELU, v > 0.0f ? v : 0.0f)

void
psm_sigmoid_backward (PsmNode *n)
{
  const float *y = n->out->data, *dy = n->out->grad;
  float *dx = n->in[0]->grad;
  for (size_t i = 0; i < n->out->n; i++)
    dx[i] += dy[i] * y[i] * (1.0f - y[i]);
}

void
psm_tanh_backward (PsmNode *n)
{
  const float *y = n->out->data, *dy = n->out->grad;
  float *dx = n->in[0]->grad;
  for (size_t i = 0; i < n->out->n; i++)
    dx[i] += dy[i] * (1.0f - y[i] * y[i]);
}

void
psm_relu_backward (PsmNode *n)
{
  const float *y = n->out->data, *dy = n->out->grad;
  float *dx = n->in[0]->grad;
  for (size_t i = 0; i < n->out->n; i++)
    if (y[i] > 0.0f)
      dx[i] += dy[i];
}

/* The column of row x[0..k) that holds its max (the first, on ties). */
static inline int
argmax_k (const float *x, int k)
{
  int best = 0;
  for (int i = 1; i < k; i++)
    if (x[i] > x[best])
      best = i;
  return best;
}

PsmTensor *
psm_maxout (PsmGraph *g, PsmTensor *x, int k)
{
  int cols = psm_tensor_cols (x);
  g_return_val_if_fail (k >= 1 && cols % k == 0, NULL);
  int shape[PSM_MAX_DIMS];
  memcpy (shape, x->shape, sizeof (int) * x->ndim);
  shape[x->ndim - 1] = cols / k;
  PsmTensor *in[1] = { x };
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 1, in);
  for (size_t o = 0; o < y->n; o++) {
    const float *xs = x->data + o * k;
    y->data[o] = xs[argmax_k (xs, k)];
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_MAXOUT, y, 1, in);
  if (n)
    n->iarg[0] = k;
  return y;
}

void
psm_maxout_backward (PsmNode *n)
{
  int k = n->iarg[0];
  const float *x = n->in[0]->data, *dy = n->out->grad;
  float *dx = n->in[0]->grad;
  for (size_t o = 0; o < n->out->n; o++)
    dx[o * k + argmax_k (x + o * k, k)] += dy[o];
}
