/* pointer.c — the ops of pointing models and of the decoder loop.
 * ids are source word ids [T, Bi], time-major like every sequence; row r of a
 * [R, ...] input belongs to example r % Bi (rows of a [Ty, B, ...] stack, or
 * of one step's [B, ...]).
 *   set_step:     seq[t] = x  (copy into a step of a preallocated sequence);
 *                 dx += dseq[t]
 *   scatter_add:  y[r, :S0] = base[r], 0 beyond; y[r, ids[i, r]] += w[r, i]
 *                 (attention mass summed per source word, onto the extended
 *                 vocabulary of size S); dbase = dy[:, :S0],
 *                 dw[r, i] += dy[r, ids[i, r]]
 *   gather_mass:  y[r] = sum_i w[r, i] [ids[i, r] = t_r]  (the scatter_add
 *                 entry of the target only; 0 when t_r < 0);
 *                 dw[r, i] += dy[r] [ids[i, r] = t_r]
 *   pick_log_softmax: y[r] = x[r, t_r] - log sum_j exp x[r, j]  (-inf when
 *                 t_r < 0); dx[r, j] += dy[r] (e_{t_r} - softmax(x_r))_j
 *   mixture_nll:  m_r = s(z_r) exp(l_r) + (1 - s(z_r)) c_r  (pointer-generator
 *                 probability of the target: generate with p_gen = s(z), or
 *                 copy with attention mass c);
 *                 y = -(1/W) sum_r w_r log max(m_r, MIX_FLOOR);
 *                 with k_r = -dy w_r / (W m_r):
 *                 dz += k s(1-s)(e^l - c), dl += k s e^l, dc += k (1-s)
 *   coverage_loss: y = (1/W) sum_r w_r sum_i min(a[r, i], c[r, i])
 *                 (See et al. eq. 12); the gradient goes to the smaller one
 *                 (to c on ties)
 *   mul_rows:     y[r, j] = x[r, j] s[r];  dx += dy s, ds[r] += sum_j dy x
 *   affine:       y = a x + b;  dx += a dy
 *   log:          y = log max(x, LOG_FLOOR);  dx += dy / max(x, LOG_FLOOR) */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

#define MIX_FLOOR 1e-12
#define LOG_FLOOR 1e-30f

static inline int32_t
id_at (const int32_t *ids, int Bi, int i, int r)
{
  return ids[(size_t) i * Bi + r % Bi];
}

static PsmTensor *
scalar_out (PsmGraph *g, int n_in, PsmTensor *const *in)
{
  int one = 1;
  return psm_op_out (g, 1, &one, n_in, in);
}

static double
total_weight (int R, const float *w)
{
  double W = 0.0;
  for (int r = 0; r < R; r++)
    W += w ? w[r] : 1.0f;
  return W;
}

/* ---- set_step ---- */
PsmTensor *
psm_set_step (PsmGraph *g, PsmTensor *seq, int t, PsmTensor *x)
{
  PsmTensor *view = psm_tensor_step (g, seq, t);
  g_return_val_if_fail (view->n == x->n, NULL);
  memcpy (view->data, x->data, x->n * sizeof (float));
  if (x->grad && view->grad) {
    PsmTensor *in[1] = { x };
    psm_graph_record (g, PSM_OP_SET_STEP, view, 1, in);
  }
  return view;
}

void
psm_set_step_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0];
  for (size_t i = 0; i < x->n; i++)
    x->grad[i] += n->out->grad[i];
}

/* ---- scatter_add ---- */
PsmTensor *
psm_scatter_add (PsmGraph *g, PsmTensor *base, PsmTensor *w, const int32_t *ids, int Bi, int S)
{
  int R = psm_tensor_rows (w), T = psm_tensor_cols (w);
  int S0 = base ? psm_tensor_cols (base) : 0;
  g_return_val_if_fail (!base || (psm_tensor_rows (base) == R && S0 <= S), NULL);
  PsmTensor *in[2] = { w, base };
  int shape[2] = { R, S };
  PsmTensor *y = psm_op_out (g, 2, shape, base ? 2 : 1, in);
  for (int r = 0; r < R; r++) {
    float *yr = y->data + (size_t) r * S;
    if (S0)
      memcpy (yr, base->data + (size_t) r * S0, S0 * sizeof (float));
    memset (yr + S0, 0, (size_t) (S - S0) * sizeof (float));
    const float *wr = w->data + (size_t) r * T;
    for (int i = 0; i < T; i++) {
      int32_t id = id_at (ids, Bi, i, r);
      if (id >= 0) {
        g_return_val_if_fail (id < S, NULL);
        yr[id] += wr[i];
      }
    }
  }
  PsmTensor *rec[2] = { w, base };
  PsmNode *n = psm_graph_record (g, PSM_OP_SCATTER_ADD, y, base ? 2 : 1, rec);
  if (n) {
    n->aux[0] = psm_graph_dup (g, ids, (size_t) T * Bi * sizeof (int32_t));
    n->iarg[0] = Bi;
  }
  return y;
}

void
psm_scatter_add_backward (PsmNode *n)
{
  PsmTensor *w = n->in[0], *base = n->in[1], *y = n->out;
  const int32_t *ids = n->aux[0];
  int Bi = n->iarg[0], R = psm_tensor_rows (w), T = psm_tensor_cols (w), S = psm_tensor_cols (y);
  for (int r = 0; r < R; r++) {
    const float *dy = y->grad + (size_t) r * S;
    if (base && base->grad) {
      int S0 = psm_tensor_cols (base);
      float *db = base->grad + (size_t) r * S0;
      for (int j = 0; j < S0; j++)
        db[j] += dy[j];
    }
    if (w->grad) {
      float *dw = w->grad + (size_t) r * T;
      for (int i = 0; i < T; i++) {
        int32_t id = id_at (ids, Bi, i, r);
        if (id >= 0)
          dw[i] += dy[id];
      }
    }
  }
}

/* ---- gather_mass ---- */
PsmTensor *
psm_gather_mass (PsmGraph *g, PsmTensor *w, const int32_t *ids, int Bi, const int32_t *targets)
{
  int R = psm_tensor_rows (w), T = psm_tensor_cols (w);
  PsmTensor *in[1] = { w };
  int shape[2] = { R, 1 };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  for (int r = 0; r < R; r++) {
    double s = 0.0;
    if (targets[r] >= 0)
      for (int i = 0; i < T; i++)
        if (id_at (ids, Bi, i, r) == targets[r])
          s += w->data[(size_t) r * T + i];
    y->data[r] = (float) s;
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_GATHER_MASS, y, 1, in);
  if (n) {
    n->aux[0] = psm_graph_dup (g, ids, (size_t) T * Bi * sizeof (int32_t));
    n->aux[1] = psm_graph_dup (g, targets, R * sizeof (int32_t));
    n->iarg[0] = Bi;
  }
  return y;
}

void
psm_gather_mass_backward (PsmNode *n)
{
  PsmTensor *w = n->in[0];
  const int32_t *ids = n->aux[0], *t = n->aux[1];
  int Bi = n->iarg[0], R = psm_tensor_rows (w), T = psm_tensor_cols (w);
  for (int r = 0; r < R; r++)
    if (t[r] >= 0)
      for (int i = 0; i < T; i++)
        if (id_at (ids, Bi, i, r) == t[r])
          w->grad[(size_t) r * T + i] += n->out->grad[r];
}

/* ---- pick_log_softmax ---- */
PsmTensor *
psm_pick_log_softmax (PsmGraph *g, PsmTensor *x, const int32_t *targets)
{
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  PsmTensor *in[1] = { x };
  int shape[2] = { R, 1 };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  float *lse = y->grad ? psm_graph_alloc (g, R * sizeof (float)) : NULL;
#pragma omp parallel for if (R > 1 && R * (size_t) C > 100000) schedule(static)
  for (int r = 0; r < R; r++) {
    const float *xr = x->data + (size_t) r * C;
    float l = psm_fast_logsumexpf (xr, C);
    if (lse)
      lse[r] = l;
    y->data[r] = targets[r] >= 0 ? xr[targets[r]] - l : -INFINITY;
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_PICK_LOG_SOFTMAX, y, 1, in);
  if (n) {
    n->aux[0] = psm_graph_dup (g, targets, R * sizeof (int32_t));
    n->saved = lse;
  }
  return y;
}

void
psm_pick_log_softmax_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0];
  const int32_t *t = n->aux[0];
  const float *lse = n->saved;
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
#pragma omp parallel for if (R > 1 && R * (size_t) C > 100000) schedule(static)
  for (int r = 0; r < R; r++) {
    float d = n->out->grad[r];
    if (t[r] < 0 || d == 0.0f)
      continue;
    const float *restrict xr = x->data + (size_t) r * C;
    float *restrict dx = x->grad + (size_t) r * C;
    float l = lse[r];
#pragma omp simd
    for (int j = 0; j < C; j++)
      dx[j] -= d * psm_fast_expf (xr[j] - l);
    dx[t[r]] += d;
  }
}

/* ---- mixture_nll ---- */
PsmTensor *
psm_mixture_nll (PsmGraph *g, PsmTensor *z, PsmTensor *lgen, PsmTensor *copy, const float *w)
{
  int R = (int) z->n;
  g_return_val_if_fail (lgen->n == z->n && copy->n == z->n, NULL);
  PsmTensor *in[3] = { z, lgen, copy };
  PsmTensor *y = scalar_out (g, 3, in);
  double W = total_weight (R, w), s = 0.0;
  for (int r = 0; r < R; r++) {
    double wr = w ? w[r] : 1.0f;
    if (wr == 0.0)
      continue;
    double p = psm_sigmoidf (z->data[r]);
    double m = p * exp ((double) lgen->data[r]) + (1.0 - p) * copy->data[r];
    s -= wr * log (MAX (m, MIX_FLOOR));
  }
  y->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmNode *n = psm_graph_record (g, PSM_OP_MIXTURE_NLL, y, 3, in);
  if (n && w)
    n->aux[0] = psm_graph_dup (g, w, R * sizeof (float));
  return y;
}

void
psm_mixture_nll_backward (PsmNode *n)
{
  PsmTensor *z = n->in[0], *lg = n->in[1], *c = n->in[2];
  const float *w = n->aux[0];
  int R = (int) z->n;
  double W = total_weight (R, w);
  if (W <= 0)
    return;
  for (int r = 0; r < R; r++) {
    double wr = w ? w[r] : 1.0f;
    if (wr == 0.0)
      continue;
    double p = psm_sigmoidf (z->data[r]), e = exp ((double) lg->data[r]);
    double m = MAX (p * e + (1.0 - p) * c->data[r], MIX_FLOOR);
    double k = -(double) n->out->grad[0] * wr / (W * m);
    if (z->grad)
      z->grad[r] += (float) (k * p * (1.0 - p) * (e - c->data[r]));
    if (lg->grad && e > 0.0)
      lg->grad[r] += (float) (k * p * e);
    if (c->grad)
      c->grad[r] += (float) (k * (1.0 - p));
  }
}

/* ---- coverage_loss ---- */
PsmTensor *
psm_coverage_loss (PsmGraph *g, PsmTensor *a, PsmTensor *c, const float *w)
{
  int R = psm_tensor_rows (a), T = psm_tensor_cols (a);
  g_return_val_if_fail (a->n == c->n, NULL);
  PsmTensor *in[2] = { a, c };
  PsmTensor *y = scalar_out (g, 2, in);
  double W = total_weight (R, w), s = 0.0;
  for (int r = 0; r < R; r++) {
    double wr = w ? w[r] : 1.0f;
    if (wr == 0.0)
      continue;
    const float *ar = a->data + (size_t) r * T, *cr = c->data + (size_t) r * T;
    double sr = 0.0;
    for (int i = 0; i < T; i++)
      sr += MIN (ar[i], cr[i]);
    s += wr * sr;
  }
  y->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmNode *n = psm_graph_record (g, PSM_OP_COVERAGE_LOSS, y, 2, in);
  if (n && w)
    n->aux[0] = psm_graph_dup (g, w, R * sizeof (float));
  return y;
}

void
psm_coverage_loss_backward (PsmNode *n)
{
  PsmTensor *a = n->in[0], *c = n->in[1];
  const float *w = n->aux[0];
  int R = psm_tensor_rows (a), T = psm_tensor_cols (a);
  double W = total_weight (R, w);
  if (W <= 0)
    return;
  for (int r = 0; r < R; r++) {
    float k = (float) (n->out->grad[0] * (w ? w[r] : 1.0f) / W);
    if (k == 0.0f)
      continue;
    for (size_t i = (size_t) r * T; i < (size_t) (r + 1) * T; i++) {
      if (a->data[i] < c->data[i]) {
        if (a->grad)
          a->grad[i] += k;
      } else if (c->grad) {
        c->grad[i] += k;
      }
    }
  }
}

/* ---- mul_rows ---- */
PsmTensor *
psm_mul_rows (PsmGraph *g, PsmTensor *x, PsmTensor *s)
{
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  g_return_val_if_fail ((int) s->n == R, NULL);
  PsmTensor *in[2] = { x, s };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 2, in);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < C; j++)
      y->data[(size_t) r * C + j] = x->data[(size_t) r * C + j] * s->data[r];
  psm_graph_record (g, PSM_OP_MUL_ROWS, y, 2, in);
  return y;
}

void
psm_mul_rows_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *s = n->in[1], *y = n->out;
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int r = 0; r < R; r++) {
    const float *dy = y->grad + (size_t) r * C;
    if (x->grad)
      for (int j = 0; j < C; j++)
        x->grad[(size_t) r * C + j] += dy[j] * s->data[r];
    if (s->grad) {
      double acc = 0.0;
      for (int j = 0; j < C; j++)
        acc += dy[j] * x->data[(size_t) r * C + j];
      s->grad[r] += (float) acc;
    }
  }
}

/* ---- affine ---- */
PsmTensor *
psm_affine (PsmGraph *g, PsmTensor *x, float a, float b)
{
  PsmTensor *in[1] = { x };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 1, in);
  for (size_t i = 0; i < x->n; i++)
    y->data[i] = a * x->data[i] + b;
  PsmNode *n = psm_graph_record (g, PSM_OP_AFFINE, y, 1, in);
  if (n)
    n->farg[0] = a;
  return y;
}

void
psm_affine_backward (PsmNode *n)
{
  for (size_t i = 0; i < n->out->n; i++)
    n->in[0]->grad[i] += n->farg[0] * n->out->grad[i];
}

/* ---- log ---- */
PsmTensor *
psm_log (PsmGraph *g, PsmTensor *x)
{
  PsmTensor *in[1] = { x };
  PsmTensor *y = psm_op_out (g, x->ndim, x->shape, 1, in);
  const float *xd = x->data;
  float *yd = y->data;
  long n = (long) x->n;
#pragma omp parallel for simd if (n >= 65536) schedule (static)
  for (long i = 0; i < n; i++)
    yd[i] = psm_fast_logf (MAX (xd[i], LOG_FLOOR));
  psm_graph_record (g, PSM_OP_LOG, y, 1, in);
  return y;
}

void
psm_log_backward (PsmNode *n)
{
  for (size_t i = 0; i < n->out->n; i++)
    n->in[0]->grad[i] += n->out->grad[i] / MAX (n->in[0]->data[i], LOG_FLOOR);
}
