/* loss.c — sum, mean and the losses. With W = sum_i w_i over counted rows:
 *   sum:   y = sum_i x_i;                dx_i += dy
 *   mean:  y = (1/n) sum_i x_i;          dx_i += dy / n
 *   nll:   y = -(1/W) sum_i w_i logp[i, t_i];     dlogp[i, t_i] += -dy w_i / W
 *   cross_entropy (fused log-softmax + nll, p = softmax(x_i)):
 *          y = -(1/W) sum_i w_i log p[i, t_i];    dx_i += dy (w_i / W)(p_i - e_{t_i})
 *   bce_logits: l_i = softplus(x_i) - z_i x_i  (= -log s(x) if z = 1,
 *          -log(1 - s(x)) if z = 0);  y = (1/W) sum_i w_i l_i;
 *          dx_i += dy (w_i / W)(s(x_i) - z_i) */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

static PsmTensor *
scalar_out (PsmGraph *g, PsmTensor *x)
{
  int one = 1;
  PsmTensor *in[1] = { x };
  return psm_op_out (g, 1, &one, 1, in);
}

PsmTensor *
psm_sum (PsmGraph *g, PsmTensor *x)
{
  PsmTensor *y = scalar_out (g, x);
  double s = 0.0;
  for (size_t i = 0; i < x->n; i++)
    s += x->data[i];
  y->data[0] = (float) s;
  PsmTensor *in[1] = { x };
  psm_graph_record (g, PSM_OP_SUM, y, 1, in);
  return y;
}

void
psm_sum_backward (PsmNode *n)
{
  float d = n->out->grad[0];
  for (size_t i = 0; i < n->in[0]->n; i++)
    n->in[0]->grad[i] += d;
}

PsmTensor *
psm_mean (PsmGraph *g, PsmTensor *x)
{
  PsmTensor *y = scalar_out (g, x);
  double s = 0.0;
  for (size_t i = 0; i < x->n; i++)
    s += x->data[i];
  y->data[0] = x->n ? (float) (s / x->n) : 0.0f;
  PsmTensor *in[1] = { x };
  psm_graph_record (g, PSM_OP_MEAN, y, 1, in);
  return y;
}

void
psm_mean_backward (PsmNode *n)
{
  float d = n->out->grad[0] / (float) MAX (n->in[0]->n, 1);
  for (size_t i = 0; i < n->in[0]->n; i++)
    n->in[0]->grad[i] += d;
}

static double
total_weight (int R, const int32_t *t, const float *w)
{
  double W = 0.0;
  for (int i = 0; i < R; i++)
    if (!t || t[i] >= 0)
      W += w ? w[i] : 1.0f;
  return W;
}

static void
save_targets (PsmGraph *g, PsmNode *n, int R, const int32_t *t, const float *w)
{
  if (!n)
    return;
  n->aux[0] = psm_graph_dup (g, t, R * sizeof (int32_t));
  n->aux[1] = psm_graph_dup (g, w, R * sizeof (float));
}

PsmTensor *
psm_nll (PsmGraph *g, PsmTensor *logp, const int32_t *t, const float *w)
{
  int R = psm_tensor_rows (logp), C = psm_tensor_cols (logp);
  PsmTensor *y = scalar_out (g, logp);
  double W = total_weight (R, t, w), s = 0.0;
  for (int i = 0; i < R; i++)
    if (t[i] >= 0) {
      g_return_val_if_fail (t[i] < C, NULL);
      s -= (w ? w[i] : 1.0f) * (double) logp->data[(size_t) i * C + t[i]];
    }
  y->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmTensor *in[1] = { logp };
  PsmNode *n = psm_graph_record (g, PSM_OP_NLL, y, 1, in);
  save_targets (g, n, R, t, w);
  return y;
}

void
psm_nll_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0];
  const int32_t *t = n->aux[0];
  const float *w = n->aux[1];
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  double W = total_weight (R, t, w);
  if (W <= 0)
    return;
  float d = n->out->grad[0] / (float) W;
  for (int i = 0; i < R; i++)
    if (t[i] >= 0)
      x->grad[(size_t) i * C + t[i]] -= d * (w ? w[i] : 1.0f);
}

PsmTensor *
psm_cross_entropy (PsmGraph *g, PsmTensor *x, const int32_t *t, const float *w)
{
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  PsmTensor *y = scalar_out (g, x);
  gboolean keep = y->grad != NULL;
  float *p = keep ? psm_graph_alloc (g, x->n * sizeof (float)) : NULL;
  double W = total_weight (R, t, w), s = 0.0;
  for (int i = 0; i < R; i++)
    g_return_val_if_fail (t[i] < C, NULL);
  /* rows in parallel, vectorised exp; the per-row terms are summed in row
   * order afterwards, so the loss does not depend on the thread count */
  double *term = psm_graph_alloc (g, (size_t) MAX (R, 1) * sizeof (double));
#pragma omp parallel for if (R > 1 && (long) R * C >= 65536) schedule (static)
  for (int i = 0; i < R; i++) {
    const float *xr = x->data + (size_t) i * C;
    term[i] = 0.0;
    if (t[i] < 0 && !keep)
      continue;
    float m = xr[0];
#pragma omp simd reduction (max:m)
    for (int j = 1; j < C; j++)
      m = MAX (m, xr[j]);
    float z = 0.0f;
    if (keep) {
      float *pr = p + (size_t) i * C;
#pragma omp simd reduction (+:z)
      for (int j = 0; j < C; j++) {
        pr[j] = psm_fast_expf (xr[j] - m);
        z += pr[j];
      }
      float inv = 1.0f / z;
#pragma omp simd
      for (int j = 0; j < C; j++)
        pr[j] *= inv;
    } else {
#pragma omp simd reduction (+:z)
      for (int j = 0; j < C; j++)
        z += psm_fast_expf (xr[j] - m);
    }
    if (t[i] >= 0)
      term[i] = -(w ? w[i] : 1.0f) * ((double) xr[t[i]] - m - log ((double) z));
  }
  for (int i = 0; i < R; i++)
    s += term[i];
  y->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmTensor *in[1] = { x };
  PsmNode *n = psm_graph_record (g, PSM_OP_CROSS_ENTROPY, y, 1, in);
  if (n) {
    save_targets (g, n, R, t, w);
    n->saved = p;
  }
  return y;
}

void
psm_cross_entropy_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0];
  const int32_t *t = n->aux[0];
  const float *w = n->aux[1];
  const float *p = n->saved;
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  double W = total_weight (R, t, w);
  if (W <= 0)
    return;
  float d = n->out->grad[0] / (float) W;
#pragma omp parallel for if (R > 1 && (long) R * C >= 65536) schedule (static)
  for (int i = 0; i < R; i++) {
    if (t[i] < 0)
      continue;
    float k = d * (w ? w[i] : 1.0f);
    float *dx = x->grad + (size_t) i * C;
    const float *pr = p + (size_t) i * C;
#pragma omp simd
    for (int j = 0; j < C; j++)
      dx[j] += k * pr[j];
    dx[t[i]] -= k;
  }
}

static inline double
softplus (double x)
{
  return x > 0 ? x + log1p (exp (-x)) : log1p (exp (x));
}

PsmTensor *
psm_bce_logits (PsmGraph *g, PsmTensor *x, const float *z, const float *w)
{
  int R = (int) x->n;
  PsmTensor *y = scalar_out (g, x);
  double W = total_weight (R, NULL, w), s = 0.0;
  for (int i = 0; i < R; i++)
    s += (w ? w[i] : 1.0f) * (softplus (x->data[i]) - z[i] * (double) x->data[i]);
  y->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmTensor *in[1] = { x };
  PsmNode *n = psm_graph_record (g, PSM_OP_BCE_LOGITS, y, 1, in);
  if (n) {
    n->aux[0] = psm_graph_dup (g, z, R * sizeof (float));
    n->aux[1] = psm_graph_dup (g, w, R * sizeof (float));
  }
  return y;
}

void
psm_bce_logits_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0];
  const float *z = n->aux[0], *w = n->aux[1];
  int R = (int) x->n;
  double W = total_weight (R, NULL, w);
  if (W <= 0)
    return;
  float d = n->out->grad[0] / (float) W;
  for (int i = 0; i < R; i++)
    x->grad[i] += d * (w ? w[i] : 1.0f) * (psm_sigmoidf (x->data[i]) - z[i]);
}
