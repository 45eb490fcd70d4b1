/* softmax.c — softmax and log-softmax over the last dim, optionally masked.
 *   y_i = e^{x_i - m} / sum_j e^{x_j - m}   (m = max over kept entries)
 *   softmax backward:      dx_i += y_i (dy_i - sum_j dy_j y_j)
 *   log-softmax:           y_i = x_i - m - log sum_j e^{x_j - m}
 *   log-softmax backward:  dx_i += dy_i - e^{y_i} sum_j dy_j
 * Masked entries (mask 0) get probability 0 (log: -inf) and no gradient. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

static void
softmax_row (const float *x, const float *mask, float *y, int C, gboolean logspace)
{
  float m = -INFINITY;
  if (!mask) {
#pragma omp simd reduction (max:m)
    for (int j = 0; j < C; j++)
      m = MAX (m, x[j]);
  } else
    for (int j = 0; j < C; j++)
      if (mask[j] != 0.0f && x[j] > m)
        m = x[j];
  if (m == -INFINITY) {          /* nothing kept */
    for (int j = 0; j < C; j++)
      y[j] = logspace ? -INFINITY : 0.0f;
    return;
  }
  double s = 0.0;
  if (!mask && logspace) {   /* decoding's scores, vectorised: y = x - m - log s */
    float sf = 0.0f;
#pragma omp simd reduction (+:sf)
    for (int j = 0; j < C; j++)
      sf += psm_fast_expf (x[j] - m);
    float ls = m + logf (sf);
#pragma omp simd
    for (int j = 0; j < C; j++)
      y[j] = x[j] - ls;
    return;
  }
  if (!mask && !logspace) {   /* the common case, vectorised: y = e^(x - m) / s */
    float sf = 0.0f;
#pragma omp simd reduction (+:sf)
    for (int j = 0; j < C; j++) {
      y[j] = psm_fast_expf (x[j] - m);
      sf += y[j];
    }
    float inv = 1.0f / sf;
#pragma omp simd
    for (int j = 0; j < C; j++)
      y[j] *= inv;
    return;
  }
  for (int j = 0; j < C; j++)
    if (!mask || mask[j] != 0.0f)
      s += expf (x[j] - m);
  if (logspace) {
    float ls = (float) log (s);
    for (int j = 0; j < C; j++)
      y[j] = (!mask || mask[j] != 0.0f) ? x[j] - m - ls : -INFINITY;
  } else {
    float inv = (float) (1.0 / s);
    for (int j = 0; j < C; j++)
      y[j] = (!mask || mask[j] != 0.0f) ? expf (x[j] - m) * inv : 0.0f;
  }
}

static PsmTensor *
softmax_op (PsmGraph *g, PsmTensor *x, const float *mask, gboolean logspace)
{
  PsmTensor *in[1] = { x };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 1, in);
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
#pragma omp parallel for if (R > 1 && (long) R * C >= 65536) schedule (static)
  for (int r = 0; r < R; r++)
    softmax_row (x->data + (size_t) r * C, mask ? mask + (size_t) r * C : NULL,
                 y->data + (size_t) r * C, C, logspace);
  PsmNode *n = psm_graph_record (g, logspace ? PSM_OP_LOG_SOFTMAX : PSM_OP_SOFTMAX, y, 1, in);
  if (n && mask)
    n->aux[0] = psm_graph_dup (g, mask, x->n * sizeof (float));
  return y;
}

PsmTensor *psm_softmax (PsmGraph *g, PsmTensor *x) { return softmax_op (g, x, NULL, FALSE); }
PsmTensor *psm_log_softmax (PsmGraph *g, PsmTensor *x) { return softmax_op (g, x, NULL, TRUE); }
PsmTensor *psm_masked_softmax (PsmGraph *g, PsmTensor *x, const float *mask) { return softmax_op (g, x, mask, FALSE); }
PsmTensor *psm_masked_log_softmax (PsmGraph *g, PsmTensor *x, const float *mask) { return softmax_op (g, x, mask, TRUE); }

void
psm_softmax_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *y = n->out;
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int r = 0; r < R; r++) {
    const float *yr = y->data + (size_t) r * C, *dy = y->grad + (size_t) r * C;
    float *dx = x->grad + (size_t) r * C;
    double dot = 0.0;
    for (int j = 0; j < C; j++)
      dot += (double) dy[j] * yr[j];
    for (int j = 0; j < C; j++)
      dx[j] += yr[j] * (dy[j] - (float) dot);
  }
}

void
psm_log_softmax_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *y = n->out;
  const float *mask = n->aux[0];
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int r = 0; r < R; r++) {
    const float *yr = y->data + (size_t) r * C, *dy = y->grad + (size_t) r * C;
    const float *mr = mask ? mask + (size_t) r * C : NULL;
    float *dx = x->grad + (size_t) r * C;
    double s = 0.0;
    for (int j = 0; j < C; j++)
      if (!mr || mr[j] != 0.0f)
        s += dy[j];
    for (int j = 0; j < C; j++)
      if (!mr || mr[j] != 0.0f)
        dx[j] += dy[j] - expf (yr[j]) * (float) s;
  }
}

/* ---- logsumexp over the last dim (ABI 1.8) ----
 *   y[r] = log sum_{j kept} e^{x[r, j]}      (-1e30 when nothing is kept)
 *   dx[r, j] += dy[r] e^{x[r, j] - y[r]}     (kept j) */
PsmTensor *
psm_logsumexp (PsmGraph *g, PsmTensor *x, const float *mask)
{
  PsmTensor *in[1] = { x };
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x), shape[2] = { R, 1 };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  /* rows in parallel, each in vectors (psm_fast_expf, float sums), as
   * psm_pick_log_softmax: the copy head's 5,000-word rows had taken a
   * fifth of its training step in double-precision exp one at a time */
#pragma omp parallel for if (R > 1 && R * (size_t) C > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    const float *xr = x->data + (size_t) r * C, *mr = mask ? mask + (size_t) r * C : NULL;
    if (!mr) {
      float l = C > 0 ? psm_fast_logsumexpf (xr, C) : -INFINITY;
      y->data[r] = l == -INFINITY ? -1e30f : l;
      continue;
    }
    float m = -INFINITY;
#pragma omp simd reduction (max:m)
    for (int j = 0; j < C; j++)
      m = MAX (m, mr[j] != 0.0f ? xr[j] : -INFINITY);
    if (m == -INFINITY) {
      y->data[r] = -1e30f;
      continue;
    }
    float z = 0.0f;
#pragma omp simd reduction (+:z)
    for (int j = 0; j < C; j++)
      z += mr[j] != 0.0f ? psm_fast_expf (xr[j] - m) : 0.0f;
    y->data[r] = m + logf (z);
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_LOGSUMEXP, y, 1, in);
  if (n && mask)
    n->aux[0] = psm_graph_dup (g, mask, x->n * sizeof (float));
  return y;
}

void
psm_logsumexp_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *y = n->out;
  const float *mask = n->aux[0];
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
#pragma omp parallel for if (R > 1 && R * (size_t) C > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    float dy = y->grad[r], l = y->data[r];
    if (l <= -1e30f || dy == 0.0f)
      continue;
    const float *restrict xr = x->data + (size_t) r * C, *mr = mask ? mask + (size_t) r * C : NULL;
    float *restrict dx = x->grad + (size_t) r * C;
    if (mr) {
#pragma omp simd
      for (int j = 0; j < C; j++)
        dx[j] += mr[j] != 0.0f ? dy * psm_fast_expf (xr[j] - l) : 0.0f;
    } else {
#pragma omp simd
      for (int j = 0; j < C; j++)
        dx[j] += dy * psm_fast_expf (xr[j] - l);
    }
  }
}
