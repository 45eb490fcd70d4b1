/* window.c — the pointer sentinel's ops (Merity et al. 2016, §2.2-2.6).
 *
 * window_scores: for row r = (t, b) of the queries q [T, B, H],
 *   z[r, j] = q[r] . h(t - L + 1 + j, b),  j < L;   z[r, L] = q[r] . s
 * h(p, b) = cur[p, b] (p >= 0) or past[P + p, b] (p < 0, no gradient).
 * Backward: dq[r] += sum_j dz[r, j] h_j + dz[r, L] s; dh_j += dz[r, j] q[r];
 * ds += sum_r dz[r, L] q[r]. The streams b split over the threads, so each
 * thread writes the rows of cur it owns; ds is summed per thread.
 *
 * sentinel_nll: a = softmax(z[r]), g = a[L], c_j = [wid[r, j] == y_r]
 * (j < L), c_L = exp(lgen_r), p_r = sum_j a_j c_j; loss -(1/W) sum_r w_r
 * log p_r. Backward: dz[r, j] = k (a_j - a_j c_j / p_r), dlgen_r = -k g
 * c_L / p_r, k = dloss w_r / W. Nothing is kept: the backward pass
 * recomputes a from z (L + 1 values a row). */
#include "config.h"
#include <math.h>
#include <string.h>
#include <omp.h>
#include "ops/ops-internal.h"

#define SENTINEL_FLOOR 1e-30

/* The state at window slot j of row (t, b), or NULL when it has none. */
static inline const float *
slot_state (const float *cur, const float *past, int P, int B, int H, int t, int b, int L, int j)
{
  int p = t - L + 1 + j;
  if (p >= 0)
    return cur + ((size_t) p * B + b) * H;
  return P + p >= 0 && past ? past + ((size_t) (P + p) * B + b) * H : NULL;
}

int32_t *
psm_window_ids (PsmGraph *g, int T, int B, int L, const int32_t *cur_ids, const float *cur_mask,
                const int32_t *past_ids, int P)
{
  int32_t *wid = psm_graph_alloc (g, (size_t) T * B * L * sizeof (int32_t));
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      for (int j = 0; j < L; j++) {
        int p = t - L + 1 + j;
        int32_t id = -1;
        if (p >= 0)
          id = !cur_mask || cur_mask[(size_t) p * B + b] != 0.0f ? cur_ids[(size_t) p * B + b] : -1;
        else if (P + p >= 0 && past_ids)
          id = past_ids[(size_t) (P + p) * B + b];
        wid[((size_t) t * B + b) * L + j] = id;
      }
  return wid;
}

PsmTensor *
psm_window_scores (PsmGraph *g, PsmTensor *q, PsmTensor *cur, PsmTensor *past, PsmTensor *s, const int32_t *wid,
                   int L)
{
  g_return_val_if_fail (q && cur && s && wid && L > 0 && q->ndim == 3 && cur->ndim == 3, NULL);
  int T = q->shape[0], B = q->shape[1], H = q->shape[2];
  g_return_val_if_fail (cur->shape[0] == T && cur->shape[1] == B && cur->shape[2] == H && s->n == (size_t) H, NULL);
  int P = past ? past->shape[0] : 0;
  g_return_val_if_fail (!past || (past->ndim == 3 && past->shape[1] == B && past->shape[2] == H), NULL);
  PsmTensor *in[3] = { q, cur, s };
  int shape[2] = { T * B, L + 1 };
  PsmTensor *out = psm_op_out (g, 2, shape, 3, in);
  const float *pd = past ? past->data : NULL;
#pragma omp parallel for schedule(static) if ((size_t) T * B * L * H > 100000)
  for (int r = 0; r < T * B; r++) {
    int t = r / B, b = r % B;
    const float *qr = q->data + (size_t) r * H;
    float *o = out->data + (size_t) r * (L + 1);
    for (int j = 0; j < L; j++) {
      const float *h = wid[(size_t) r * L + j] >= 0 ? slot_state (cur->data, pd, P, B, H, t, b, L, j) : NULL;
      o[j] = h ? psm_dotf (qr, h, H) : -INFINITY;
    }
    o[L] = psm_dotf (qr, s->data, H);
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_WINDOW_SCORES, out, 3, in);
  if (n) {
    n->aux[0] = psm_graph_dup (g, wid, (size_t) T * B * L * sizeof (int32_t));
    n->aux[1] = past ? psm_graph_dup (g, pd, past->n * sizeof (float)) : NULL;
    n->iarg[0] = L;
    n->iarg[1] = P;
  }
  return out;
}

void
psm_window_scores_backward (PsmNode *n)
{
  PsmTensor *q = n->in[0], *cur = n->in[1], *s = n->in[2], *out = n->out;
  const int32_t *wid = n->aux[0];
  const float *pd = n->aux[1];
  int L = n->iarg[0], P = n->iarg[1];
  int T = q->shape[0], B = q->shape[1], H = q->shape[2];
  int nt = (size_t) T * B * L * H > 100000 ? omp_get_max_threads () : 1;
  float *ds = s->grad ? psm_xmalloc0 ((size_t) nt * H * sizeof (float), "window gradients") : NULL;
#pragma omp parallel num_threads (nt)
  {
    int me = omp_get_thread_num (), k = omp_get_num_threads ();
    float *dsm = ds ? ds + (size_t) me * H : NULL;
    for (int b = me; b < B; b += k)
      for (int t = 0; t < T; t++) {
        size_t r = (size_t) t * B + b;
        const float *dz = out->grad + r * (L + 1), *qr = q->data + r * H;
        float *dq = q->grad ? q->grad + r * H : NULL;
        for (int j = 0; j < L; j++) {
          float d = dz[j];
          if (d == 0.0f || wid[r * L + j] < 0)
            continue;
          const float *h = slot_state (cur->data, pd, P, B, H, t, b, L, j);
          if (!h)
            continue;
          if (dq) {
#pragma omp simd
            for (int i = 0; i < H; i++)
              dq[i] += d * h[i];
          }
          int p = t - L + 1 + j;
          if (p >= 0 && cur->grad) {
            float *dh = cur->grad + ((size_t) p * B + b) * H;
#pragma omp simd
            for (int i = 0; i < H; i++)
              dh[i] += d * qr[i];
          }
        }
        float d = dz[L];
        if (dq) {
#pragma omp simd
          for (int i = 0; i < H; i++)
            dq[i] += d * s->data[i];
        }
        if (dsm) {
#pragma omp simd
          for (int i = 0; i < H; i++)
            dsm[i] += d * qr[i];
        }
      }
  }
  if (ds) {
    for (int m = 0; m < nt; m++)
      for (int i = 0; i < H; i++)
        s->grad[i] += ds[(size_t) m * H + i];
    free (ds);
  }
}

/* Softmax of one row of L + 1 scores into a; returns p = sum_j a_j c_j. */
static double
mix_row (const float *z, int L, const int32_t *wid, int32_t y, double ev, double *a)
{
  double mx = z[L];
  for (int j = 0; j < L; j++)
    if (z[j] > mx)
      mx = z[j];
  double sum = 0.0;
  for (int j = 0; j <= L; j++) {
    a[j] = isinf (z[j]) ? 0.0 : exp ((double) z[j] - mx);
    sum += a[j];
  }
  double p = 0.0;
  for (int j = 0; j <= L; j++) {
    a[j] /= sum;
    if (j < L && wid[j] == y)
      p += a[j];
  }
  return p + a[L] * ev;
}

static double
weight_sum (int R, const float *w, const int32_t *y)
{
  double W = 0.0;
  for (int r = 0; r < R; r++)
    if (y[r] >= 0)
      W += w ? w[r] : 1.0;
  return W;
}

PsmTensor *
psm_sentinel_nll (PsmGraph *g, PsmTensor *z, PsmTensor *lgen, const int32_t *wid, const int32_t *y, const float *w)
{
  g_return_val_if_fail (z && lgen && wid && y && z->ndim == 2, NULL);
  int R = psm_tensor_rows (z), L = psm_tensor_cols (z) - 1;
  g_return_val_if_fail (L > 0 && lgen->n == (size_t) R, NULL);
  PsmTensor *in[2] = { z, lgen };
  int one[1] = { 1 };
  PsmTensor *out = psm_op_out (g, 1, one, 2, in);
  double W = weight_sum (R, w, y), s = 0.0;
  double *a = g_new (double, L + 1);
  for (int r = 0; r < R; r++) {
    double wr = w ? w[r] : 1.0;
    if (y[r] < 0 || wr == 0.0)
      continue;
    double p = mix_row (z->data + (size_t) r * (L + 1), L, wid + (size_t) r * L, y[r], exp ((double) lgen->data[r]), a);
    s -= wr * log (MAX (p, SENTINEL_FLOOR));
  }
  g_free (a);
  out->data[0] = W > 0 ? (float) (s / W) : 0.0f;
  PsmNode *n = psm_graph_record (g, PSM_OP_SENTINEL_NLL, out, 2, in);
  if (n) {
    n->aux[0] = psm_graph_dup (g, wid, (size_t) R * L * sizeof (int32_t));
    int32_t *yw = psm_graph_alloc (g, (size_t) R * (sizeof (int32_t) + sizeof (float)));
    memcpy (yw, y, R * sizeof (int32_t));
    float *ww = (float *) (yw + R);
    for (int r = 0; r < R; r++)
      ww[r] = w ? w[r] : 1.0f;
    n->aux[1] = yw;
  }
  return out;
}

void
psm_sentinel_nll_backward (PsmNode *n)
{
  PsmTensor *z = n->in[0], *lgen = n->in[1];
  const int32_t *wid = n->aux[0], *y = n->aux[1];
  int R = psm_tensor_rows (z), L = psm_tensor_cols (z) - 1;
  const float *w = (const float *) (y + R);
  double W = weight_sum (R, w, y);
  if (W <= 0)
    return;
  double *a = g_new (double, L + 1);
  for (int r = 0; r < R; r++) {
    if (y[r] < 0 || w[r] == 0.0f)
      continue;
    const int32_t *wr = wid + (size_t) r * L;
    double ev = exp ((double) lgen->data[r]);
    double p = MAX (mix_row (z->data + (size_t) r * (L + 1), L, wr, y[r], ev, a), SENTINEL_FLOOR);
    double k = (double) n->out->grad[0] * w[r] / W;
    if (z->grad) {
      float *dz = z->grad + (size_t) r * (L + 1);
      for (int j = 0; j <= L; j++) {
        double c = j < L ? (wr[j] == y[r] ? 1.0 : 0.0) : ev;
        dz[j] += (float) (k * (a[j] - a[j] * c / p));
      }
    }
    if (lgen->grad)
      lgen->grad[r] += (float) (-k * a[L] * ev / p);
  }
  g_free (a);
}
