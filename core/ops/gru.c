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
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

/* The gate loops of one step run in parallel only when the step is big
 * enough to pay for the fork (B H >= 16384). */
#define GRU_PAR(B, H) ((long) (B) * (H) >= 16384)

/* Elementwise forward of one row. x: the row's input projection [3H]; G:
 * its recurrent pre-activations without bias [3H]; b: the recurrent bias;
 * s: the saved row [4H] (r, z, n, G_n). */
static inline void
gru_row_forward (int H, const float *x, const float *G, const float *b, const float *hp,
                 float *s, float *ho)
{
#pragma omp simd
  for (int j = 0; j < H; j++) {
    float r = psm_fast_sigmoidf (x[j] + G[j] + b[j]);
    float z = psm_fast_sigmoidf (x[H + j] + G[H + j] + b[H + j]);
    float gn = G[2 * H + j] + b[2 * H + j];
    float n = psm_fast_tanhf (x[2 * H + j] + r * gn);
    ho[j] = (1.0f - z) * n + z * hp[j];
    s[j] = r;
    s[H + j] = z;
    s[2 * H + j] = n;
    s[3 * H + j] = gn;
  }
}

/* A padded row (mask 0) carries the state and saves zeros. */
static inline void
gru_row_carry (int H, const float *hp, float *s, float *ho)
{
  memcpy (ho, hp, H * sizeof (float));
  memset (s, 0, 4 * H * sizeof (float));
}

/* Elementwise backward of one row, from d = dL/dh': writes the row's dG
 * [3H], adds to dx (may be NULL) and the direct path d z into dh (may be
 * NULL). A padded row passes d through. */
static inline void
gru_row_backward (int H, gboolean masked, const float *d, const float *hp, const float *s,
                  float *g, float *dx, float *dh)
{
  if (masked) {
    memset (g, 0, 3 * H * sizeof (float));
    if (dh)
      for (int j = 0; j < H; j++)
        dh[j] += d[j];
    return;
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
  if (dx)
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float z = s[H + j], n = s[2 * H + j];
      dx[j] += g[j];
      dx[H + j] += g[H + j];
      dx[2 * H + j] += d[j] * (1.0f - z) * (1.0f - n * n);   /* da_n again */
    }
  if (dh)
#pragma omp simd
    for (int j = 0; j < H; j++)
      dh[j] += d[j] * s[H + j];
}

/* Forward of one step for all rows, on the real rows only (mask [B] may be
 * NULL), h W on the plan's path; writes h' and the saved gates. G:
 * scratch [B, 3H]; hc: scratch [B, H] when there is a mask. */
static void
gru_step_forward (PsmGraph *g, int B, int H, const float *xp, const float *h, PsmWeightPlan *p, const float *bh,
                  const float *mask, float *G, float *hc, float *hout, float *sv)
{
  const float *hin;
  int R = psm_pack_real_rows (mask, 0, B, 0, B, h, H, hc, &hin);   /* G's row r: the r-th real row */
  if (R)
    psm_weight_gemm (g, p, R, hin, H, NULL, FALSE, G, 3 * H);
  int *ix = psm_xmalloc ((size_t) MAX (B, 1) * sizeof (int), "GRU scratch");
  for (int b = 0, r = 0; b < B; b++)
    ix[b] = mask && mask[b] == 0.0f ? -1 : r++;
#pragma omp parallel for if (GRU_PAR (B, H)) schedule (static)
  for (int b = 0; b < B; b++) {
    const float *hp = h + (size_t) b * H;
    float *s = sv + (size_t) b * 4 * H, *ho = hout + (size_t) b * H;
    if (ix[b] < 0)
      gru_row_carry (H, hp, s, ho);
    else
      gru_row_forward (H, xp + (size_t) b * 3 * H, G + (size_t) ix[b] * 3 * H, bh, hp, s, ho);
  }
  free (ix);
}

/* Backward of one step's elementwise part for all rows: from dh' fills dG
 * [B, 3H], adds to dxp (may be NULL) and the direct path into dh (may be
 * NULL). */
static void
gru_step_backward (int B, int H, const float *dho, const float *h, const float *sv,
                   const float *mask, float *dG, float *dxp, float *dh)
{
#pragma omp parallel for if (GRU_PAR (B, H)) schedule (static)
  for (int b = 0; b < B; b++)
    gru_row_backward (H, mask && mask[b] == 0.0f, dho + (size_t) b * H, h + (size_t) b * H,
                      sv + (size_t) b * 4 * H, dG + (size_t) b * 3 * H,
                      dxp ? dxp + (size_t) b * 3 * H : NULL, dh ? dh + (size_t) b * H : NULL);
}

/* ---- Whole sequences: weights packed once, rows split over the threads.
 * The rows of a batch are independent sequences, so each thread runs the
 * whole recurrence (forward, then backward) for its own block of rows: no
 * barrier and no data shared between threads after the weight matrix is
 * packed (W for h W, W^T for dG W^T; the threads pack its panels apart).
 * Each element is computed the same way whatever the split. A step's GEMM
 * runs on the rows real at that step only (psm_pack_real_rows, as
 * psm_lstm_seq): a padded row carries its state and has no gradient to
 * pass through W. Measured against one psm_gemm per step (bench-gru, 2
 * threads, BENCHMARKS.md): B = 32, H = 256 about 12 -> 8 ms per training
 * step; B = 128, H = 256 37.6 -> 31.6 ms; B = 250, H = 1000 1003 -> 963 ms.
 * Without vector FMA in the build (or with psm_paths.gru_packed unset) the
 * per-step GEMMs go to psm_gemm, on the same rows. */

typedef struct {
  float *sv;     /* [T, B, 4H] */
  float *mask;   /* [T, B] or NULL */
  gboolean reverse;
  const float *wpt;   /* W^T packed in the graph's cache, or NULL */
} GruSeqSaved;

/* Rows [b0, b1) over the whole sequence, forward in time or in reverse.
 * xp: the step's columns at row stride ldx. wp: packed W, or NULL for
 * psm_gemm. G: scratch [b1 - b0, ldg]; hc: scratch [b1 - b0, H]. keep: sv
 * holds every step [T, B, 4H]; otherwise one row [4H]. */
static void
gru_seq_forward_rows (int T, int B, int H, int b0, int b1, gboolean rev, const float *xp, int ldx, const float *h0,
                      const float *w, const float *wp, const void *wb, const float *bh, const float *mask, float *out,
                      float *sv, gboolean keep, float *G, int ldg, float *hc)
{
  for (int k = 0; k < T && b1 > b0; k++) {
    int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
    const float *hp = k ? out + (size_t) tp * B * H : h0, *hin;
    int n = psm_pack_real_rows (mask, t, B, b0, b1, hp, H, hc, &hin);   /* G's row r: the r-th real row */
    if (n && wb)   /* decode.precision bf16: this thread's rows alone */
      psm_gemm_bf16 (n, 3 * H, H, hin, H, wb, NULL, FALSE, G, ldg);
    else if (n && wp)
      psm_packed_gemm (n, H, 3 * H, hin, H, wp, G, ldg);
    else if (n)
      psm_gemm (FALSE, FALSE, n, 3 * H, H, 1.0f, hin, H, w, 3 * H, 0.0f, G, ldg);
    for (int b = b0, r = 0; b < b1; b++) {
      size_t row = (size_t) t * B + b;
      float *s = keep ? sv + row * 4 * H : sv, *ho = out + row * H;
      if (mask && mask[row] == 0.0f) {
        gru_row_carry (H, hp + (size_t) b * H, s, ho);
        continue;
      }
      gru_row_forward (H, xp + row * ldx, G + (size_t) r++ * ldg, bh, hp + (size_t) b * H, s, ho);
    }
  }
}

/* Backward over rows [b0, b1): fills dG [T, B, 3H], adds to dxp (may be
 * NULL; row stride ldx) and leaves dL/dh0 in carry [B, H], which comes
 * zeroed. wpt: packed W^T or NULL. C: scratch [b1 - b0, ldc]; dGc: scratch
 * [b1 - b0, 3H]; d: scratch [H]. */
static void
gru_seq_backward_rows (int T, int B, int H, int b0, int b1, gboolean rev, const float *dout, const float *out,
                       const float *h0, const float *w, const float *wpt, const float *sv, const float *mask,
                       float *dG, float *dxp, int ldx, float *carry, float *C, int ldc, float *dGc, float *d)
{
  for (int k = T - 1; k >= 0 && b1 > b0; k--) {
    int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
    const float *hp = k ? out + (size_t) tp * B * H : h0, *din;
    float *dGt = dG + (size_t) t * B * 3 * H;
    for (int b = b0; b < b1; b++) {
      size_t row = (size_t) t * B + b;
      float *cr = carry + (size_t) b * H;
#pragma omp simd
      for (int j = 0; j < H; j++)
        d[j] = dout[row * H + j] + cr[j];
      memset (cr, 0, H * sizeof (float));
      gru_row_backward (H, mask && mask[row] == 0.0f, d, hp + (size_t) b * H, sv + row * 4 * H,
                        dGt + (size_t) b * 3 * H, dxp ? dxp + row * ldx : NULL, cr);
    }
    /* dh_prev += dG W^T for the real rows (a padded row's dG is 0) */
    int n = psm_pack_real_rows (mask, t, B, b0, b1, dGt, 3 * H, dGc, &din);   /* C's row r: the r-th real row */
    if (n && wpt)
      psm_packed_gemm (n, 3 * H, H, din, 3 * H, wpt, C, ldc);
    else if (n)
      psm_gemm (FALSE, TRUE, n, H, 3 * H, 1.0f, din, 3 * H, w, 3 * H, 0.0f, C, ldc);
    psm_pack_real_rows_add (mask, t, B, b0, b1, C, ldc, H, carry);
  }
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
  float *G = psm_xmalloc ((size_t) B * 3 * H * sizeof (float), "GRU scratch");
  float *hc = mask ? psm_xmalloc ((size_t) B * H * sizeof (float), "GRU scratch") : NULL;
  float *sv = psm_graph_alloc (g, (size_t) B * 4 * H * sizeof (float));
  /* h W's path (tape-internal.h; as psm_lstm_cell's): a parameter's W
   * packed once a graph, shared by the steps of a sequence or a decoding */
  PsmWeightPlan p = psm_weight_plan (g, w, H, 3 * H, B, out->grad != NULL, 0);
  gru_step_forward (g, B, H, xp->data, h->data, &p, bh->data, mask, G, hc, out->data, sv);
  free (hc);
  free (G);
  PsmNode *n = psm_graph_record (g, PSM_OP_GRU_CELL, out, 4, in);
  if (n) {
    n->saved = sv;
    n->aux[0] = psm_graph_dup (g, mask, B * sizeof (float));
    if (p.path == PSM_WEIGHT_PACKED && h->grad)   /* dh = dG W^T on W^T packed */
      n->aux[1] = psm_weight_transposed (g, &p);
  }
  return out;
}

void
psm_gru_cell_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h = n->in[1], *w = n->in[2], *bh = n->in[3], *out = n->out;
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  const float *mask = n->aux[0];
  float *dG = psm_xmalloc ((size_t) B * 3 * H * sizeof (float), "GRU gradients");
  gru_step_backward (B, H, out->grad, h->data, n->saved, mask, dG, xp->grad, h->grad);
  psm_cell_recurrent_backward (B, H, 3 * H, mask, dG, h->data, w->data, n->aux[1], h->grad, w->grad);
  if (bh->grad)
    psm_colsum_add (B, 3 * H, dG, bh->grad);
  free (dG);
}

PsmTensor *
psm_gru_seq (PsmGraph *g, PsmTensor *xp, PsmTensor *h0, PsmTensor *w, PsmTensor *bh, const float *mask)
{
  return psm_gru_seq_cols (g, xp, 0, h0, w, bh, mask, FALSE);
}

PsmTensor *
psm_gru_seq_cols (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *w, PsmTensor *bh,
                  const float *mask, gboolean reverse)
{
  g_return_val_if_fail (xp && xp->ndim == 3 && h0 && w && bh, NULL);
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0), ldx = xp->shape[2];
  g_return_val_if_fail (T > 0 && col0 >= 0 && col0 + 3 * H <= ldx && psm_tensor_rows (h0) == B, NULL);
  g_return_val_if_fail (w->n == (size_t) H * 3 * H && bh->n == (size_t) 3 * H, NULL);
  PsmTensor *in[4] = { xp, h0, w, bh };
  int shape[3] = { T, B, H };
  PsmTensor *out = psm_op_out (g, 3, shape, 4, in);
  /* without a gradient the gates are not kept: one row of them a thread */
  gboolean keep = out->grad != NULL;
  float *sv = keep ? psm_graph_alloc (g, (size_t) T * B * 4 * H * sizeof (float)) : NULL;
  const float *x = xp->data + col0;
  /* h W's path (tape-internal.h): decode.precision bf16 in every build; a
   * parameter's packed copy is the graph's (as psm_lstm_seq's), in any
   * build where psm_paths.gru_packed asks; a W that is none packed here */
  PsmWeightPlan p = psm_weight_plan (g, w, H, 3 * H, B, keep,
                                     psm_paths.gru_packed ? PSM_PLAN_PACKED : PSM_PLAN_NO_PACKED);
  const void *wb = p.path == PSM_WEIGHT_BF16 ? psm_weight_operand (g, &p) : NULL;
  if (psm_paths.gru_packed) {
    int ldg = psm_pack_panels (3 * H) * PSM_PACK_NR;
    const float *wc = p.path == PSM_WEIGHT_PACKED ? psm_weight_operand (g, &p) : NULL;
    float *own = p.path == PSM_WEIGHT_BLAS ? psm_xaligned (psm_packed_floats (H, 3 * H) * sizeof (float),
                                                           "packed GRU weights")
                                           : NULL;
    const float *wp = wc ? wc : own;
#pragma omp parallel num_threads (psm_pack_threads (B))
    {
      int b0, b1;
      psm_pack_row_split (B, omp_get_num_threads (), omp_get_thread_num (), &b0, &b1);
      float *G = psm_xaligned ((size_t) MAX (b1 - b0, 1) * ldg * sizeof (float), "GRU scratch");
      float *hc = mask ? psm_xmalloc ((size_t) MAX (b1 - b0, 1) * H * sizeof (float), "GRU scratch") : NULL;
      float *row_sv = keep ? NULL : psm_xmalloc (4 * H * sizeof (float), "GRU scratch");
      if (own)
        psm_pack_shared (H, 3 * H, w->data, 3 * H, FALSE, own);
      gru_seq_forward_rows (T, B, H, b0, b1, reverse, x, ldx, h0->data, w->data, wp, wb, bh->data, mask, out->data,
                            keep ? sv : row_sv, keep, G, ldg, hc);
      free (row_sv);
      free (hc);
      free (G);
    }
    free (own);
  } else {
    float *G = psm_xmalloc ((size_t) B * 3 * H * sizeof (float), "GRU scratch");
    float *hc = mask ? psm_xmalloc ((size_t) B * H * sizeof (float), "GRU scratch") : NULL;
    float *row_sv = keep ? NULL : psm_xmalloc (4 * H * sizeof (float), "GRU scratch");
    gru_seq_forward_rows (T, B, H, 0, B, reverse, x, ldx, h0->data, w->data, NULL, wb, bh->data, mask, out->data,
                          keep ? sv : row_sv, keep, G, 3 * H, hc);
    free (row_sv);
    free (hc);
    free (G);
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_GRU_SEQ, out, 4, in);
  if (n) {
    GruSeqSaved *s = psm_graph_alloc (g, sizeof *s);
    s->sv = sv;
    s->mask = psm_graph_dup (g, mask, (size_t) T * B * sizeof (float));
    s->reverse = reverse;
    s->wpt = p.path == PSM_WEIGHT_PACKED ? psm_weight_transposed (g, &p) : NULL;   /* for dh = dG W^T */
    n->saved = s;
    n->iarg[0] = col0;
  }
  return out;
}

void
psm_gru_seq_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h0 = n->in[1], *w = n->in[2], *bh = n->in[3], *out = n->out;
  GruSeqSaved *s = n->saved;
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0), ldx = xp->shape[2], col0 = n->iarg[0];
  gboolean rev = s->reverse;
  float *dxp = xp->grad ? xp->grad + col0 : NULL;
  size_t BH = (size_t) B * H;
  float *dG = psm_xmalloc ((size_t) T * B * 3 * H * sizeof (float), "GRU gradients");
  float *carry = psm_xmalloc0 (BH * sizeof (float), "GRU gradients");   /* dL/dh of the next step's input */
  if (psm_paths.gru_packed) {
    int ldc = psm_pack_panels (H) * PSM_PACK_NR;
    float *own = s->wpt ? NULL : psm_xaligned (psm_packed_floats (3 * H, H) * sizeof (float), "packed GRU weights");
    const float *wpt = s->wpt ? s->wpt : own;
#pragma omp parallel num_threads (psm_pack_threads (B))
    {
      int b0, b1;
      psm_pack_row_split (B, omp_get_num_threads (), omp_get_thread_num (), &b0, &b1);
      float *C = psm_xaligned ((size_t) MAX (b1 - b0, 1) * ldc * sizeof (float), "GRU scratch");
      float *dGc = s->mask ? psm_xmalloc ((size_t) MAX (b1 - b0, 1) * 3 * H * sizeof (float), "GRU scratch") : NULL;
      float *d = psm_xmalloc ((size_t) H * sizeof (float), "GRU scratch");
      if (own)
        psm_pack_shared (3 * H, H, w->data, 3 * H, TRUE, own);   /* op(W) = W^T [3H, H] */
      gru_seq_backward_rows (T, B, H, b0, b1, rev, out->grad, out->data, h0->data, w->data, wpt, s->sv, s->mask, dG,
                             dxp, ldx, carry, C, ldc, dGc, d);
      free (d);
      free (dGc);
      free (C);
    }
    free (own);
  } else {
    float *C = psm_xmalloc (BH * sizeof (float), "GRU scratch");
    float *dGc = s->mask ? psm_xmalloc ((size_t) B * 3 * H * sizeof (float), "GRU scratch") : NULL;
    float *d = psm_xmalloc ((size_t) H * sizeof (float), "GRU scratch");
    gru_seq_backward_rows (T, B, H, 0, B, rev, out->grad, out->data, h0->data, w->data, NULL, s->sv, s->mask, dG,
                           dxp, ldx, carry, C, H, dGc, d);
    free (d);
    free (dGc);
    free (C);
  }
  if (h0->grad)
    for (size_t i = 0; i < BH; i++)
      h0->grad[i] += carry[i];
  if (w->grad) {
    /* dW = sum over steps of h_prev^T dG: h0 against the first step's dG,
     * the other steps as one GEMM (h_prev of position t is h of t - 1, or
     * of t + 1 in reverse) */
    int first = rev ? T - 1 : 0;
    psm_gemm (TRUE, FALSE, H, 3 * H, B, 1.0f, h0->data, H, dG + (size_t) first * B * 3 * H, 3 * H, 1.0f, w->grad,
              3 * H);
    if (T > 1)
      psm_gemm (TRUE, FALSE, H, 3 * H, (T - 1) * B, 1.0f, out->data + (rev ? BH : 0), H,
                dG + (rev ? 0 : (size_t) B * 3 * H), 3 * H, 1.0f, w->grad, 3 * H);
  }
  if (bh->grad)
    psm_colsum_add (T * B, 3 * H, dG, bh->grad);
  free (dG);
  free (carry);
}
