/* gru.c — fused GRU cell and whole-sequence GRU (cuDNN/PyTorch form).
 * Forward, with xp = x W_x + b_x precomputed for all steps and G = h W + b_h:
 *   r = s(xp_r + G_r)      z = s(xp_z + G_z)      n = tanh(xp_n + r * G_n)
 *   h' = (1 - z) * n + z * h
 * Backward, given dh':
 *   dn = dh' (1 - z)            dz = dh' (h - n)
 *   da_n = dn (1 - n^2)         da_z = dz z (1 - z)
 *   da_r = da_n G_n r (1 - r)
 *   dxp = [da_r, da_z, da_n]    dG = [da_r, da_z, da_n * r]
 *   dh += dh' z + dG W^T        dW += h^T dG        db_h += sum_rows dG
 * Saved per step: r, z, n, G_n ([B, 4H]). Rows with mask 0 carry h' = h. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-private.h"
#include "fastmath.h"

/* Rows per OpenMP chunk: the gate loops run in parallel only when a step is
 * big enough to pay for the fork (B H >= 16384). */
#define GRU_PAR(B, H) ((long) (B) * (H) >= 16384)

/* Forward of one step for all rows; writes h' and the saved gates. */
static void
gru_step_forward (int B, int H, const float *xp, const float *h, const float *w,
                  const float *bh, const float *mask, float *G, float *hout, float *sv)
{
  for (int b = 0; b < B; b++)
    memcpy (G + (size_t) b * 3 * H, bh, 3 * H * sizeof (float));
  psm_gemm (FALSE, FALSE, B, 3 * H, H, 1.0f, h, H, w, 3 * H, 1.0f, G, 3 * H);
#pragma omp parallel for if (GRU_PAR (B, H)) schedule (static)
  for (int b = 0; b < B; b++) {
    const float *x = xp + (size_t) b * 3 * H, *gr = G + (size_t) b * 3 * H, *hp = h + (size_t) b * H;
    float *s = sv + (size_t) b * 4 * H, *ho = hout + (size_t) b * H;
    if (mask && mask[b] == 0.0f) {
      memcpy (ho, hp, H * sizeof (float));
      memset (s, 0, 4 * H * sizeof (float));
      continue;
    }
    /* s = [r z n G_n]: r and z are contiguous, one vector loop for both */
#pragma omp simd
    for (int j = 0; j < 2 * H; j++)
      s[j] = psm_fast_sigmoidf (x[j] + gr[j]);
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float gn = gr[2 * H + j];
      float n = psm_fast_tanhf (x[2 * H + j] + s[j] * gn);
      float z = s[H + j];
      ho[j] = (1.0f - z) * n + z * hp[j];
      s[2 * H + j] = n;
      s[3 * H + j] = gn;
    }
  }
}

/* Backward of one step's elementwise part: from dh' fills dG [B,3H], adds to
 * dxp (may be NULL) and the direct path into dh (may be NULL). */
static void
gru_step_backward (int B, int H, const float *dho, const float *h, const float *sv,
                   const float *mask, float *dG, float *dxp, float *dh)
{
#pragma omp parallel for if (GRU_PAR (B, H)) schedule (static)
  for (int b = 0; b < B; b++) {
    const float *d = dho + (size_t) b * H, *hp = h + (size_t) b * H, *s = sv + (size_t) b * 4 * H;
    float *g = dG + (size_t) b * 3 * H;
    float *dhb = dh ? dh + (size_t) b * H : NULL;
    if (mask && mask[b] == 0.0f) {
      memset (g, 0, 3 * H * sizeof (float));
      if (dhb)
        for (int j = 0; j < H; j++)
          dhb[j] += d[j];
      continue;
    }
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float r = s[j], z = s[H + j], n = s[2 * H + j], gn = s[3 * H + j];
      float dn = d[j] * (1.0f - z);
      float dz = d[j] * (hp[j] - n);
      float dan = dn * (1.0f - n * n);
      g[j] = dan * gn * r * (1.0f - r);
      g[H + j] = dz * z * (1.0f - z);
      g[2 * H + j] = dan * r;
    }
    if (dxp) {
      float *dx = dxp + (size_t) b * 3 * H;
#pragma omp simd
      for (int j = 0; j < 2 * H; j++)
        dx[j] += g[j];
#pragma omp simd
      for (int j = 0; j < H; j++) {   /* da_n again: cheaper than a buffer */
        float z = s[H + j], n = s[2 * H + j];
        dx[2 * H + j] += d[j] * (1.0f - z) * (1.0f - n * n);
      }
    }
    if (dhb)
#pragma omp simd
      for (int j = 0; j < H; j++)
        dhb[j] += d[j] * s[H + j];
  }
}

static void
colsum_add (int R, int C, const float *x, float *out)
{
  for (int r = 0; r < R; r++)
    for (int j = 0; j < C; j++)
      out[j] += x[(size_t) r * C + j];
}

PsmTensor *
psm_gru_cell (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *w, PsmTensor *bh, const float *mask)
{
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  g_return_val_if_fail (psm_tensor_rows (xp) == B && psm_tensor_cols (xp) == 3 * H, NULL);
  g_return_val_if_fail (w->n == (size_t) H * 3 * H && bh->n == (size_t) 3 * H, NULL);
  PsmTensor *in[4] = { xp, h, w, bh };
  int shape[2] = { B, H };
  PsmTensor *out = psm_op_out (g, 2, shape, 4, in);
  float *G = psm_graph_alloc (g, (size_t) B * 3 * H * sizeof (float));
  float *sv = psm_graph_alloc (g, (size_t) B * 4 * H * sizeof (float));
  gru_step_forward (B, H, xp->data, h->data, w->data, bh->data, mask, G, out->data, sv);
  PsmNode *n = psm_graph_record (g, PSM_OP_GRU_CELL, out, 4, in);
  if (n) {
    n->saved = sv;
    n->aux[0] = psm_graph_dup (g, mask, B * sizeof (float));
  }
  return out;
}

void
psm_gru_cell_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h = n->in[1], *w = n->in[2], *bh = n->in[3], *out = n->out;
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  float *dG = g_malloc ((size_t) B * 3 * H * sizeof (float));
  gru_step_backward (B, H, out->grad, h->data, n->saved, n->aux[0], dG,
                     xp->grad, h->grad);
  if (h->grad)
    psm_gemm (FALSE, TRUE, B, H, 3 * H, 1.0f, dG, 3 * H, w->data, 3 * H, 1.0f, h->grad, H);
  if (w->grad)
    psm_gemm (TRUE, FALSE, H, 3 * H, B, 1.0f, h->data, H, dG, 3 * H, 1.0f, w->grad, 3 * H);
  if (bh->grad)
    colsum_add (B, 3 * H, dG, bh->grad);
  g_free (dG);
}

typedef struct {
  float *sv;     /* [T, B, 4H] */
  float *mask;   /* [T, B] or NULL */
} GruSeqSaved;

PsmTensor *
psm_gru_seq (PsmGraph *g, PsmTensor *xp, PsmTensor *h0, PsmTensor *w, PsmTensor *bh, const float *mask)
{
  g_return_val_if_fail (xp->ndim == 3, NULL);
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0);
  g_return_val_if_fail (xp->shape[2] == 3 * H && psm_tensor_rows (h0) == B, NULL);
  PsmTensor *in[4] = { xp, h0, w, bh };
  int shape[3] = { T, B, H };
  PsmTensor *out = psm_op_out (g, 3, shape, 4, in);
  float *G = psm_graph_alloc (g, (size_t) B * 3 * H * sizeof (float));
  float *sv = psm_graph_alloc (g, (size_t) T * B * 4 * H * sizeof (float));
  for (int t = 0; t < T; t++) {
    const float *hp = t ? out->data + (size_t) (t - 1) * B * H : h0->data;
    gru_step_forward (B, H, xp->data + (size_t) t * B * 3 * H, hp, w->data, bh->data,
                      mask ? mask + (size_t) t * B : NULL, G,
                      out->data + (size_t) t * B * H, sv + (size_t) t * B * 4 * H);
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_GRU_SEQ, out, 4, in);
  if (n) {
    GruSeqSaved *s = psm_graph_alloc (g, sizeof *s);
    s->sv = sv;
    s->mask = psm_graph_dup (g, mask, (size_t) T * B * sizeof (float));
    n->saved = s;
  }
  return out;
}

void
psm_gru_seq_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h0 = n->in[1], *w = n->in[2], *bh = n->in[3], *out = n->out;
  GruSeqSaved *s = n->saved;
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0);
  size_t BH = (size_t) B * H;
  float *dG = g_malloc ((size_t) T * B * 3 * H * sizeof (float));
  float *carry = g_malloc0 (BH * sizeof (float));   /* dL/dh_{t} from step t+1 */
  float *dh = g_malloc (BH * sizeof (float));
  for (int t = T - 1; t >= 0; t--) {
    const float *hp = t ? out->data + (size_t) (t - 1) * BH : h0->data;
    for (size_t i = 0; i < BH; i++)
      dh[i] = out->grad[(size_t) t * BH + i] + carry[i];
    float *dGt = dG + (size_t) t * B * 3 * H;
    memset (carry, 0, BH * sizeof (float));
    gru_step_backward (B, H, dh, hp, s->sv + (size_t) t * B * 4 * H,
                       s->mask ? s->mask + (size_t) t * B : NULL, dGt,
                       xp->grad ? xp->grad + (size_t) t * B * 3 * H : NULL, carry);
    psm_gemm (FALSE, TRUE, B, H, 3 * H, 1.0f, dGt, 3 * H, w->data, 3 * H, 1.0f, carry, H);
  }
  if (h0->grad)
    for (size_t i = 0; i < BH; i++)
      h0->grad[i] += carry[i];
  if (w->grad) {
    /* dW = sum_t h_{t-1}^T dG_t as one GEMM over all T*B rows. */
    float *hprev = g_malloc ((size_t) T * BH * sizeof (float));
    memcpy (hprev, h0->data, BH * sizeof (float));
    if (T > 1)
      memcpy (hprev + BH, out->data, (size_t) (T - 1) * BH * sizeof (float));
    psm_gemm (TRUE, FALSE, H, 3 * H, T * B, 1.0f, hprev, H, dG, 3 * H, 1.0f, w->grad, 3 * H);
    g_free (hprev);
  }
  if (bh->grad)
    colsum_add (T * B, 3 * H, dG, bh->grad);
  g_free (dG);
  g_free (carry);
  g_free (dh);
}
