/* linear-pick.c — y_r = log softmax (x W + b)_r picked at the target t_r,
 * as one op (psm_linear_pick_log_softmax): the softmax layer of a language
 * model without its [R, N] scores' gradient tensor.
 *   z = x W + b,  lse_r = log sum_j exp z_rj,  y_r = z_{r,t_r} - lse_r;
 *   dz_r = dy_r (e_{t_r} - exp (z_r - lse_r)),  dx += dz W^T,
 *   dW += x^T dz,  db += sum_r dz_r.
 * In bfloat16 training the forward stores the scores z (products as
 * linear_bf16's) and each row's log-sum-exp; the scores have no gradient
 * tensor: the backward makes dz = d_r (e_{t_r} -
 * exp (z_r - lse_r)) as it rounds dz for dz W^T and x^T dz (on AMX a
 * row's band of columns at a time, never stored whole), where
 * the two ops would zero dz, add pick_log_softmax's gradient into it and
 * read it back to round it: at the 2 x 650 LM's 3,200 x 10,000 scores,
 * three passes over 128 MB an update fewer (BENCHMARKS.md d). */
#include "config.h"
#include <math.h>
#include <omp.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

typedef struct {
  float *z, *lse;
  int32_t *t;
  const void *wtp;   /* W^T packed for dx (NULL without x's gradient) */
  gboolean fp32;     /* linear_pick_fp32's: z single precision */
  PsmWeightPlan p;   /* fp32: how z was made (a second backward makes it again) */
  gboolean dz;       /* fp32: z holds its gradient now (the backward ran) */
} PickSaved;

/* The fused op's output y [R, 1], and (pick_finish) the rest of its
 * forward once the scores z [R, N] are made: each row's log-sum-exp and
 * pick, the node and what its backward reads (wtp: W^T packed for dx, or
 * NULL; fp32 and p as PickSaved's). */
static PsmTensor *
pick_out (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b)
{
  PsmTensor *in[3] = { x, w, b };
  int shape[2] = { psm_tensor_rows (x), 1 };
  return psm_op_out (g, 2, shape, 3, in);
}

static PsmTensor *
pick_finish (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, PsmTensor *y, float *z, const int32_t *t,
             const void *wtp, gboolean fp32, const PsmWeightPlan *p)
{
  int R = psm_tensor_rows (x), N = w->shape[1];
  float *lse = psm_graph_alloc (g, (size_t) MAX (R, 1) * sizeof (float));
#pragma omp parallel for if (R > 1 && (size_t) R * N > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    const float *zr = z + (size_t) r * N;
    lse[r] = psm_fast_logsumexpf (zr, N);
    y->data[r] = t[r] >= 0 ? zr[t[r]] - lse[r] : -INFINITY;
  }
  PsmTensor *in[3] = { x, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR_PICK_LOG_SOFTMAX, y, 3, in);
  if (nd) {
    PickSaved *sv = psm_graph_alloc (g, sizeof *sv);
    sv->z = z;
    sv->lse = lse;
    sv->t = psm_graph_dup (g, t, (size_t) R * sizeof (int32_t));
    sv->wtp = wtp;
    sv->fp32 = fp32;
    if (p)
      sv->p = *p;
    sv->dz = FALSE;
    nd->saved = sv;
  }
  return y;
}

static PsmTensor *
linear_pick_bf16 (PsmGraph *g, PsmWeightPlan *p, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *t)
{
  int R = psm_tensor_rows (x), N = w->shape[1];
  const int32_t *ids;
  if (R > PSM_PACKED_MAX_ROWS && psm_graph_lookup_of (g, x->data, R, &ids))
    return NULL;   /* embedding_linear's case: psm_linear's own */
  for (int r = 0; r < R; r++)
    g_return_val_if_fail (t[r] < N, NULL);
  PsmTensor *y = pick_out (g, x, w, b);
  float *z = psm_graph_alloc (g, (size_t) MAX (R, 1) * N * sizeof (float));
  psm_weight_gemm (g, p, R, x->data, p->K, b ? b->data : NULL, FALSE, z, N);
  return pick_finish (g, x, w, b, y, z, t, x->grad ? psm_weight_transposed (g, p) : NULL, FALSE, NULL);
}

/* ---- the same in single precision ----
 * z = x W + b as psm_linear makes it (the packed path or one sgemm), kept
 * without a gradient tensor; the backward writes dz = d_r (e_{t_r} -
 * exp (z_r - lse_r)) over z itself, in the pass that reads it, and runs
 * psm_linear's two products on it. The pair would zero a gradient as large
 * as z in the forward and add into it in the backward: at See et al.'s
 * 1,600 x 20,000 scores a step, 128 MB set to zero, read and written once
 * more (BENCHMARKS.md c). The same sums in the same order as the pair, so
 * the same results to the bit. Not for an embedding lookup's or a locked
 * dropout's x, whose psm_linear paths differ (NULL: the caller uses the
 * pair). */
static PsmTensor *
linear_pick_fp32 (PsmGraph *g, PsmWeightPlan *p, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *t)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const int32_t *ids;
  size_t period;
  if (R > PSM_PACKED_MAX_ROWS &&
      (psm_graph_lookup_of (g, x->data, R, &ids) || psm_graph_dropout_of (g, x->data, x->n, &period)))
    return NULL;
  for (int r = 0; r < R; r++)
    g_return_val_if_fail (t[r] < N, NULL);
  PsmTensor *y = pick_out (g, x, w, b);
  float *z = psm_graph_alloc (g, (size_t) MAX (R, 1) * N * sizeof (float));
  psm_weight_gemm (g, p, R, x->data, K, b ? b->data : NULL, FALSE, z, N);
  return pick_finish (g, x, w, b, y, z, t, x->grad ? psm_weight_transposed (g, p) : NULL, TRUE, p);
}

static void
linear_pick_fp32_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  PickSaved *sv = n->saved;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  float *z = sv->z;
  const float *d = n->out->grad;
  if (sv->dz)   /* a second backward over the graph: the scores again */
    psm_weight_gemm (NULL, &sv->p, R, x->data, K, b ? b->data : NULL, FALSE, z, N);   /* W packed already */
  sv->dz = TRUE;
#pragma omp parallel for if (R > 1 && (size_t) R * N > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    float *restrict zr = z + (size_t) r * N;
    int tr = sv->t[r];
    if (tr < 0 || d[r] == 0.0f) {
      memset (zr, 0, N * sizeof (float));
      continue;
    }
    float dr = d[r], l = sv->lse[r];
#pragma omp simd
    for (int j = 0; j < N; j++)
      zr[j] = 0.0f - dr * psm_fast_expf (zr[j] - l);
    zr[tr] += dr;
  }
  if (x->grad && sv->wtp)
    psm_gemm_packed (R, K, N, z, N, sv->wtp, NULL, TRUE, x->grad, K);
  else if (x->grad)
    psm_gemm (FALSE, TRUE, R, K, N, 1.0f, z, N, w->data, N, 1.0f, x->grad, K);
  if (w->grad)
    psm_gemm (TRUE, FALSE, K, N, R, 1.0f, x->data, K, z, N, 1.0f, w->grad, N);
  if (b && b->grad)
    psm_colsum_add (R, N, z, b->grad);
}

void
psm_linear_pick_log_softmax_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  const PickSaved *sv = n->saved;
  if (sv->fp32) {
    linear_pick_fp32_backward (n);
    return;
  }
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  psm_linear_bf16_pick_grads (R, K, N, x->data, sv->z, sv->lse, sv->t, n->out->grad, sv->wtp,
                              sv->wtp ? x->grad : NULL, w->grad, b ? b->grad : NULL);
}

PsmTensor *
psm_linear_pick_log_softmax (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *targets)
{
  g_return_val_if_fail (x && x->ndim >= 1 && w && w->ndim == 2 && targets, NULL);
  g_return_val_if_fail (w->shape[0] == psm_tensor_cols (x) && (!b || (int) b->n == w->shape[1]), NULL);
  if ((x->grad || w->grad) && psm_graph_grad_enabled (g)) {
    /* the product's path as psm_linear's (tape-internal.h) */
    PsmWeightPlan p = psm_weight_plan (g, w, w->shape[0], w->shape[1], psm_tensor_rows (x), TRUE, PSM_PLAN_BF16_TRAIN);
    PsmTensor *y = p.path == PSM_WEIGHT_BF16_TRAIN ? linear_pick_bf16 (g, &p, x, w, b, targets)
                                                   : linear_pick_fp32 (g, &p, x, w, b, targets);
    if (y)
      return y;
  }
  return psm_pick_log_softmax (g, psm_linear (g, x, w, b), targets);
}
