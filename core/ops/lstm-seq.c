/* lstm-seq.c — fused LSTM recurrences over whole sequences: psm_lstm_seq,
 * psm_lstm_seq_cols and psm_lstm_seq_zoneout (the cell's equations and
 * the one-step op: lstm.c). */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "ops/ops-internal.h"
#include "lstm-row.h"

/* ---- Whole sequences (psm_lstm_seq): the recurrence of psm_gru_seq's
 * design. The weights are packed once per sequence (W for h W, W^T for
 * dG W^T; a parameter's in the graph's cache (its weight plan), so
 * that an evaluation or a decoding packs them once for all its batches)
 * and each thread runs the whole recurrence for its own block of
 * rows; rows are independent sequences, so nothing is shared after the
 * packing and every element is computed the same way whatever the split.
 * Output [T + 1, B, H]: h at every position (in time order whichever the
 * direction), then the final c. Saved: the gates [T, B, 5H] and c at every
 * position [T, B, H]. Without vector FMA in the build the per-step GEMMs go
 * to psm_gemm instead (as psm_paths.gru_packed says for the GRU). */

typedef struct {
  float *sv;     /* [T, B, 5H] */
  float *cs;     /* [T, B, H] */
  float *mask;   /* [T, B] or NULL */
  gboolean reverse;
  const float *zh, *zc;   /* zoneout weights [T, B, H] or NULL */
  const float *wpt;       /* W^T packed in the graph's cache, or NULL */
  const void *wbt;        /* train.precision bf16: W^T packed for psm_gemm_bf16, or NULL */
} LstmSeqSaved;

/* Row b of step t (cs slot ct; hp, cp the previous state [B, H]) from its
 * h W in gr (xp added here), or carried unchanged when gr is NULL (a
 * masked row). */
static inline void
seq_row_forward (int B, int H, int t, int ct, int b, const float *hp, const float *cp, float *gr,
                 const float *xp, int ldx, float *hs, float *cs, float *sv, gboolean keep, const float *zh,
                 const float *zc)
{
  size_t row = (size_t) t * B + b;
  float *ho = hs + row * H, *co = cs + ((size_t) ct * B + b) * H, *s = keep ? sv + row * 5 * H : NULL;
  if (!gr) {
    memcpy (ho, hp + (size_t) b * H, H * sizeof (float));
    memcpy (co, cp + (size_t) b * H, H * sizeof (float));
    if (keep)
      memset (s, 0, 5 * H * sizeof (float));
    return;
  }
  const float *x = xp + row * ldx;
#pragma omp simd
  for (int j = 0; j < 4 * H; j++)
    gr[j] += x[j];
  if (keep)
    lstm_row_forward (H, gr, cp + (size_t) b * H, s, ho, co);
  else
    lstm_row_forward_nosave (H, gr, cp + (size_t) b * H, ho, co);
  if (zh) {   /* zoneout: d of the units keep their previous value */
    const float *dh = zh + row * H, *dc = zc + row * H, *hpr = hp + (size_t) b * H, *cpr = cp + (size_t) b * H;
#pragma omp simd
    for (int j = 0; j < H; j++) {
      ho[j] = dh[j] * hpr[j] + (1.0f - dh[j]) * ho[j];
      co[j] = dc[j] * cpr[j] + (1.0f - dc[j]) * co[j];
    }
  }
}

/* Rows [b0, b1) over the whole sequence. G: scratch [b1 - b0, ldg]; hc
 * scratch [b1 - b0, H]. wp: packed W, or NULL for one psm_gemm per step.
 * keep: cs and sv hold every step [T, B, .] for the backward pass;
 * otherwise (no gradient) cs holds two steps [2, B, H], alternating, and
 * no gate is kept (sv NULL). */
static void
lstm_seq_forward_rows (int T, int B, int H, int b0, int b1, gboolean rev, const float *xp, const float *h0,
                       const float *c0, const float *w, const float *wp, const void *wb, const float *mask, float *hs,
                       float *cs, float *sv, float *G, int ldg, float *hc, gboolean keep, int ldx, const float *zh,
                       const float *zc)
{
  for (int k = 0; k < T && b1 > b0; k++) {
    int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
    int ct = keep ? t : k & 1, ctp = keep ? tp : (k - 1) & 1;   /* cs slot of this and the previous step */
    const float *hp = k ? hs + (size_t) tp * B * H : h0, *cp = k ? cs + (size_t) ctp * B * H : c0, *hin;
    int n = psm_pack_real_rows (mask, t, B, b0, b1, hp, H, hc, &hin);   /* G's row r: the r-th real row */
    if (n && wb)   /* this thread's rows alone */
      psm_gemm_bf16 (n, 4 * H, H, hin, H, wb, NULL, FALSE, G, ldg);
    else if (n && wp)
      psm_packed_gemm (n, H, 4 * H, hin, H, wp, G, ldg);
    else if (n)
      psm_gemm (FALSE, FALSE, n, 4 * H, H, 1.0f, hin, H, w, 4 * H, 0.0f, G, ldg);
    for (int b = b0, r = 0; b < b1; b++) {
      gboolean real = !mask || mask[(size_t) t * B + b] != 0.0f;
      seq_row_forward (B, H, t, ct, b, hp, cp, real ? G + (size_t) r++ * ldg : NULL, xp, ldx, hs, cs, sv, keep, zh, zc);
    }
  }
}

/* Row b of step t backward: dh of the row gets its output's gradient,
 * then dG's row (0 for a masked row, whose gradients pass through), dc
 * and dh carried to the previous step, dxp's row added to. */
static inline void
seq_row_backward (int B, int H, int t, int b, const float *dhs, const float *cprev, const float *sv,
                  const float *mask, float *dGt, float *dxp, int ldx, float *carry_h, float *carry_c, const float *zh,
                  const float *zc)
{
  size_t row = (size_t) t * B + b;
  float *dh = carry_h + (size_t) b * H, *dc = carry_c + (size_t) b * H, *gr = dGt + (size_t) b * 4 * H;
  const float *dout = dhs + row * H;
#pragma omp simd
  for (int j = 0; j < H; j++)
    dh[j] += dout[j];
  if (mask && mask[row] == 0.0f) {   /* (h, c) carried: the gradients pass through */
    memset (gr, 0, 4 * H * sizeof (float));
    return;
  }
  const float *s = sv + row * 5 * H, *cp = cprev + (size_t) b * H;
  if (zh) {
    /* zoneout: h = d_h h_prev + (1 - d_h) h~, c likewise; the kept
     * part of the gradient goes straight to the previous state */
    const float *zhr = zh + row * H, *zcr = zc + row * H;
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float dhn = (1.0f - zhr[j]) * dh[j];
      float dct = lstm_row_dct (H, j, s, (1.0f - zcr[j]) * dc[j], dhn);
      lstm_row_gate_grads (H, j, s, cp, dct, dhn, gr);
      dc[j] = dct * s[H + j] + zcr[j] * dc[j];
      dh[j] = zhr[j] * dh[j];
    }
  } else {
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float dct = lstm_row_dct (H, j, s, dc[j], dh[j]);
      lstm_row_gate_grads (H, j, s, cp, dct, dh[j], gr);
      dc[j] = dct * s[H + j];
      dh[j] = 0.0f;
    }
  }
  if (dxp) {
    float *dx = dxp + row * ldx;
#pragma omp simd
    for (int j = 0; j < 4 * H; j++)
      dx[j] += gr[j];
  }
}

/* Backward over rows [b0, b1): fills dG [T, B, 4H], adds to dxp (may be
 * NULL); carry_h / carry_c hold dL/dh, dL/dc of the state after the last
 * step on entry (zeros, and the final c's gradient) and of (h0, c0) on
 * exit. C: scratch [b1 - b0, ldc]; dGc scratch [b1 - b0, 4H]; wpt: packed
 * W^T or NULL. */
static void
lstm_seq_backward_rows (int T, int B, int H, int b0, int b1, gboolean rev, const float *dhs, const float *hs,
                        const float *c0, const float *cs, const float *sv, const float *mask, const float *w,
                        const float *wpt, const void *wbt, float *dG, float *dxp, int ldx, float *carry_h, float *carry_c, float *C,
                        int ldc, float *dGc, const float *zh, const float *zc)
{
  for (int k = T - 1; k >= 0 && b1 > b0; k--) {
    int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
    const float *cprev = k ? cs + (size_t) tp * B * H : c0;
    float *dGt = dG + (size_t) t * B * 4 * H;
    for (int b = b0; b < b1; b++)
      seq_row_backward (B, H, t, b, dhs, cprev, sv, mask, dGt, dxp, ldx, carry_h, carry_c, zh, zc);
    /* dh_prev += dG W^T for the rows that were not carried (carried rows
     * have dG = 0: they are left out) */
    const float *din;
    int n = psm_pack_real_rows (mask, t, B, b0, b1, dGt, 4 * H, dGc, &din);   /* C's row r: the r-th real row */
    if (n && wbt)   /* this thread's rows alone */
      psm_gemm_bf16 (n, H, 4 * H, din, 4 * H, wbt, NULL, FALSE, C, ldc);
    else if (n && wpt)
      psm_packed_gemm (n, 4 * H, H, din, 4 * H, wpt, C, ldc);
    else if (n)
      psm_gemm (FALSE, TRUE, n, H, 4 * H, 1.0f, din, 4 * H, w, 4 * H, 0.0f, C, ldc);
    psm_pack_real_rows_add (mask, t, B, b0, b1, C, ldc, H, carry_h);
  }
}

/* The column-split backwards' dh_prev rows [r0, r1) of step t (C [B, ldc],
 * dG W^T for every row) added to their carries; a carried row's dG was 0. */
static inline void
carry_add (int B, int H, int t, int r0, int r1, const float *mask, const float *C, int ldc, float *carry_h)
{
  for (int b = r0; b < r1; b++) {
    if (mask && mask[(size_t) t * B + b] == 0.0f)
      continue;
    float *d = carry_h + (size_t) b * H;
    const float *c = C + (size_t) b * ldc;
#pragma omp simd
    for (int j = 0; j < H; j++)
      d[j] += c[j];
  }
}

/* train.precision bf16 on AMX: the step's product split by W's column
 * panels over the threads instead of by rows (each thread then reads its
 * part of W every step, 1.7 MB of the 2 x 650 LM's 3.4, and runs all the
 * rows through four tiles of sums instead of half of them through two),
 * the rows' elementwise work in blocks of 16 rows; h (dG backward)
 * rounded once a step into shared tiles by the rows' threads. Two
 * barriers a step. The same products and sums as the rows' path. */
static void
lstm_seq_forward_cols (int T, int B, int H, gboolean rev, const float *xp, int ldx, const float *h0, const float *c0,
                       const void *wb, const float *mask, float *hs, float *cs, float *sv, const float *zh,
                       const float *zc)
{
  int nb = (B + 15) / 16;
  float *G = psm_xaligned ((size_t) B * 4 * H * sizeof (float), "LSTM scratch");
  void *at = psm_xaligned (psm_bf16_tiles_bytes (B, H), "LSTM scratch");
#pragma omp parallel
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int r0 = MIN (B, nb * id / team * 16), r1 = MIN (B, nb * (id + 1) / team * 16);
    psm_bf16_tiles_rows (B, H, h0, H, at, r0, r1);
    for (int k = 0; k < T; k++) {
      int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
      const float *hp = k ? hs + (size_t) tp * B * H : h0, *cp = k ? cs + (size_t) tp * B * H : c0;
#pragma omp barrier
      psm_gemm_bf16_tiles (B, 4 * H, H, at, wb, G, 4 * H, id, team);
#pragma omp barrier
      for (int b = r0; b < r1; b++) {
        gboolean real = !mask || mask[(size_t) t * B + b] != 0.0f;
        seq_row_forward (B, H, t, t, b, hp, cp, real ? G + (size_t) b * 4 * H : NULL, xp, ldx, hs, cs, sv, TRUE, zh,
                         zc);
      }
      psm_bf16_tiles_rows (B, H, hs + (size_t) t * B * H, H, at, r0, r1);
    }
  }
  free (at);
  free (G);
}

static void
lstm_seq_backward_cols (int T, int B, int H, gboolean rev, const float *dhs, const float *c0, const float *cs,
                        const float *sv, const float *mask, const void *wbt, float *dG, float *dxp, int ldx,
                        float *carry_h, float *carry_c, const float *zh, const float *zc)
{
  int nb = (B + 15) / 16;
  float *C = psm_xaligned ((size_t) B * H * sizeof (float), "LSTM scratch");
  void *gt = psm_xaligned (psm_bf16_tiles_bytes (B, 4 * H), "LSTM scratch");
#pragma omp parallel
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int r0 = MIN (B, nb * id / team * 16), r1 = MIN (B, nb * (id + 1) / team * 16);
    for (int k = T - 1; k >= 0; k--) {
      int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
      const float *cprev = k ? cs + (size_t) tp * B * H : c0;
      float *dGt = dG + (size_t) t * B * 4 * H;
      for (int b = r0; b < r1; b++)
        seq_row_backward (B, H, t, b, dhs, cprev, sv, mask, dGt, dxp, ldx, carry_h, carry_c, zh, zc);
      psm_bf16_tiles_rows (B, 4 * H, dGt, 4 * H, gt, r0, r1);
#pragma omp barrier
      psm_gemm_bf16_tiles (B, H, 4 * H, gt, wbt, C, H, id, team);   /* dh_prev = dG W^T */
#pragma omp barrier
      carry_add (B, H, t, r0, r1, mask, C, H, carry_h);
    }
  }
  free (gt);
  free (C);
}

/* Few rows a thread (psm_paths.lstm_cols, lstm_cols_team below): the step's
 * single-precision product split by W's column panels over the threads,
 * as the bf16 path above, instead of by rows. Split by rows, each thread
 * reads all of W every step for its one or two rows (1 MB for 256 units:
 * two threads of a 2-row batch ran the encoder no faster than one); split
 * by columns, each reads its part of W for all the rows. The rows'
 * elementwise work stays split by rows. Two barriers a step; every
 * element of G the same chain of multiply-adds as on the rows' path
 * (masked rows' G computed and dropped). own: W packed here by the team
 * (from w), else wp is the graph's packing. */
static void
lstm_seq_forward_cols32 (int T, int B, int H, gboolean rev, const float *xp, int ldx, const float *h0,
                         const float *c0, const float *w, float *own, const float *wp, const float *mask, float *hs,
                         float *cs, float *sv, gboolean keep, const float *zh, const float *zc)
{
  int panels = psm_pack_panels (4 * H), ldg = panels * PSM_PACK_NR;
  float *G = psm_xaligned ((size_t) B * ldg * sizeof (float), "LSTM scratch");
#pragma omp parallel
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    int j0 = p0 * PSM_PACK_NR, j1 = MIN (4 * H, p1 * PSM_PACK_NR);
    int r0 = B * id / team, r1 = B * (id + 1) / team;
    if (own)
      psm_pack_shared (H, 4 * H, w, 4 * H, FALSE, own);
    for (int k = 0; k < T; k++) {
      int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
      int ct = keep ? t : k & 1, ctp = keep ? tp : (k - 1) & 1;
      const float *hp = k ? hs + (size_t) tp * B * H : h0, *cp = k ? cs + (size_t) ctp * B * H : c0;
      if (j1 > j0)
        psm_packed_gemm_store (B, H, j1 - j0, hp, H, wp + (size_t) p0 * H * PSM_PACK_NR, G + j0, ldg, NULL, FALSE);
#pragma omp barrier
      for (int b = r0; b < r1; b++) {
        gboolean real = !mask || mask[(size_t) t * B + b] != 0.0f;
        seq_row_forward (B, H, t, ct, b, hp, cp, real ? G + (size_t) b * ldg : NULL, xp, ldx, hs, cs, sv, keep, zh,
                         zc);
      }
#pragma omp barrier
    }
  }
  free (G);
}

/* Its backward: each thread's rows to dG, then dh_prev = dG W^T by W^T's
 * column panels (all the rows; a masked row's dG is 0 and its sum is not
 * added), added to the rows' carries by their threads. own: W^T packed
 * here by the team, else wpt. */
static void
lstm_seq_backward_cols32 (int T, int B, int H, gboolean rev, const float *dhs, const float *c0, const float *cs,
                          const float *sv, const float *mask, const float *w, float *own, const float *wpt, float *dG,
                          float *dxp, int ldx, float *carry_h, float *carry_c, const float *zh, const float *zc)
{
  int panels = psm_pack_panels (H), ldc = panels * PSM_PACK_NR;
  float *C = psm_xaligned ((size_t) B * ldc * sizeof (float), "LSTM scratch");
#pragma omp parallel
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    int j0 = p0 * PSM_PACK_NR, j1 = MIN (H, p1 * PSM_PACK_NR);
    int r0 = B * id / team, r1 = B * (id + 1) / team;
    if (own)
      psm_pack_shared (4 * H, H, w, 4 * H, TRUE, own);   /* op(W) = W^T [4H, H] */
    for (int k = T - 1; k >= 0; k--) {
      int t = rev ? T - 1 - k : k, tp = rev ? t + 1 : t - 1;
      const float *cprev = k ? cs + (size_t) tp * B * H : c0;
      float *dGt = dG + (size_t) t * B * 4 * H;
      for (int b = r0; b < r1; b++)
        seq_row_backward (B, H, t, b, dhs, cprev, sv, mask, dGt, dxp, ldx, carry_h, carry_c, zh, zc);
#pragma omp barrier
      if (j1 > j0)
        psm_packed_gemm_store (B, 4 * H, j1 - j0, dGt, 4 * H, wpt + (size_t) p0 * 4 * H * PSM_PACK_NR, C + j0, ldc,
                               NULL, FALSE);
#pragma omp barrier
      carry_add (B, H, t, r0, r1, mask, C, ldc, carry_h);
    }
  }
  free (C);
}

/* Whether a sequence of B rows splits its steps' products by W's columns
 * (lstm_seq_forward_cols32) rather than by rows: on more than one thread
 * with fewer than 4 rows a thread. See's encoder (256 units) on two
 * threads, bench-see train, three paired rounds (BENCHMARKS.md j): at 1
 * row the op took 17.4-17.9 ms a step by columns against 20.4-23.1 by
 * rows, at 2 rows 20.4-20.7 against 23.4-24.3, at 4 rows 32.3-34.9
 * against 34.4-37.1; at 8 rows (one round) 45.7 against 44.9. */
static gboolean
lstm_cols_team (int B)
{
  if (!PSM_PACK_FAST || !psm_paths.lstm_cols || omp_in_parallel ())
    return FALSE;
  int nth = omp_get_max_threads ();
  return nth > 1 && B < 4 * nth;
}

PsmTensor *
psm_lstm_seq (PsmGraph *g, PsmTensor *xp, PsmTensor *h0, PsmTensor *c0, PsmTensor *w, const float *mask,
              gboolean reverse)
{
  return psm_lstm_seq_cols (g, xp, 0, h0, c0, w, mask, reverse);
}

PsmTensor *
psm_lstm_seq_cols (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *c0, PsmTensor *w,
                   const float *mask, gboolean reverse)
{
  return psm_lstm_seq_zoneout (g, xp, col0, h0, c0, w, mask, reverse, NULL, NULL);
}

PsmTensor *
psm_lstm_seq_zoneout (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *c0, PsmTensor *w,
                      const float *mask, gboolean reverse, const float *zh, const float *zc)
{
  g_return_val_if_fail ((zh == NULL) == (zc == NULL), NULL);
  g_return_val_if_fail (xp && xp->ndim == 3 && h0 && c0 && w, NULL);
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0), ldx = xp->shape[2];
  g_return_val_if_fail (T > 0 && col0 >= 0 && col0 + 4 * H <= ldx && psm_tensor_rows (h0) == B, NULL);
  g_return_val_if_fail (c0->n == h0->n && w->n == (size_t) H * 4 * H, NULL);
  PsmTensor *in[4] = { xp, h0, c0, w };
  int shape[3] = { T + 1, B, H };
  PsmTensor *out = psm_op_out (g, 3, shape, 4, in);
  size_t BH = (size_t) B * H;
  /* without a gradient nothing is kept for a backward pass: the cell
   * states of two steps, and no gate values */
  gboolean keep = out->grad != NULL;
  float *sv = keep ? psm_graph_alloc (g, (size_t) T * B * 5 * H * sizeof (float)) : NULL;
  float *cs = psm_graph_alloc (g, (size_t) (keep ? T : 2) * BH * sizeof (float));
  int ldg = PSM_PACK_FAST ? psm_pack_panels (4 * H) * PSM_PACK_NR : 4 * H;
  /* h W's path (tape-internal.h): decode.precision bf16 (no gradient) and
   * train.precision bf16 (with one) on bfloat16 operands (psm_gemm_bf16)
   * in every build; else a parameter's packed copy, the graph's (kept over
   * a decoding's batches); another W is packed here */
  PsmWeightPlan p = psm_weight_plan (g, w, H, 4 * H, B, keep, PSM_PLAN_BF16_TRAIN | PSM_PLAN_ANY_ROWS);
  const void *wb = p.path == PSM_WEIGHT_BF16 || p.path == PSM_WEIGHT_BF16_TRAIN ? psm_weight_operand (g, &p) : NULL;
  if (wb && keep && psm_amx_usable () && !omp_in_parallel ()) {
    lstm_seq_forward_cols (T, B, H, reverse, xp->data + col0, ldx, h0->data, c0->data, wb, mask, out->data, cs, sv, zh,
                           zc);
  } else if (PSM_PACK_FAST) {
    const float *wc = p.path == PSM_WEIGHT_PACKED ? psm_weight_operand (g, &p) : NULL;
    float *own = p.path == PSM_WEIGHT_BLAS ? psm_xaligned (psm_packed_floats (H, 4 * H) * sizeof (float),
                                                           "packed LSTM weights")
                                           : NULL;
    const float *wp = wc ? wc : own;
    if (!wb && lstm_cols_team (B))
      lstm_seq_forward_cols32 (T, B, H, reverse, xp->data + col0, ldx, h0->data, c0->data, w->data, own, wp, mask,
                               out->data, cs, sv, keep, zh, zc);
    else
#pragma omp parallel num_threads (psm_pack_threads (B))
    {
      int b0, b1;
      psm_pack_row_split (B, omp_get_num_threads (), omp_get_thread_num (), &b0, &b1);
      float *G = psm_xaligned ((size_t) MAX (b1 - b0, 1) * ldg * sizeof (float), "LSTM scratch");
      float *hc = mask ? psm_xmalloc ((size_t) MAX (b1 - b0, 1) * H * sizeof (float), "LSTM scratch") : NULL;
      if (own)
        psm_pack_shared (H, 4 * H, w->data, 4 * H, FALSE, own);
      lstm_seq_forward_rows (T, B, H, b0, b1, reverse, xp->data + col0, h0->data, c0->data, w->data, wp, wb, mask,
                             out->data, cs, sv, G, ldg, hc, keep, ldx, zh, zc);
      free (hc);
      free (G);
    }
    free (own);
  } else {
    float *G = psm_xmalloc ((size_t) B * ldg * sizeof (float), "LSTM scratch");
    float *hc = mask ? psm_xmalloc ((size_t) B * H * sizeof (float), "LSTM scratch") : NULL;
    lstm_seq_forward_rows (T, B, H, 0, B, reverse, xp->data + col0, h0->data, c0->data, w->data, NULL, wb, mask,
                           out->data, cs, sv, G, ldg, hc, keep, ldx, zh, zc);
    free (hc);
    free (G);
  }
  int last = keep ? (reverse ? 0 : T - 1) : (T - 1) & 1;   /* the cs slot of the last step */
  memcpy (out->data + (size_t) T * BH, cs + (size_t) last * BH, BH * sizeof (float));
  PsmNode *n = psm_graph_record (g, PSM_OP_LSTM_SEQ, out, 4, in);
  if (n) {
    LstmSeqSaved *s = psm_graph_alloc (g, sizeof *s);
    s->sv = sv;
    s->cs = cs;
    s->mask = psm_graph_dup (g, mask, (size_t) T * B * sizeof (float));
    s->reverse = reverse;
    s->zh = zh;   /* the caller keeps them until the backward pass */
    s->zc = zc;
    /* for dh = dG W^T */
    const void *wt = psm_weight_transposed (g, &p);
    s->wbt = p.path == PSM_WEIGHT_BF16_TRAIN ? wt : NULL;
    s->wpt = p.path == PSM_WEIGHT_PACKED ? wt : NULL;
    n->saved = s;
    n->iarg[0] = col0;
  }
  return out;
}

void
psm_lstm_seq_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h0 = n->in[1], *c0 = n->in[2], *w = n->in[3], *out = n->out;
  const LstmSeqSaved *s = n->saved;
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h0), ldx = xp->shape[2], col0 = n->iarg[0];
  float *dxp = xp->grad ? xp->grad + col0 : NULL;
  gboolean rev = s->reverse;
  size_t BH = (size_t) B * H;
  float *dG = psm_xmalloc ((size_t) T * B * 4 * H * sizeof (float), "LSTM gradients");
  float *carry_h = psm_xmalloc0 (BH * sizeof (float), "LSTM gradients");
  float *carry_c = psm_xmalloc (BH * sizeof (float), "LSTM gradients");
  memcpy (carry_c, out->grad + (size_t) T * BH, BH * sizeof (float));
  int ldc = PSM_PACK_FAST ? psm_pack_panels (H) * PSM_PACK_NR : H;
  if (s->wbt && psm_amx_usable () && !omp_in_parallel ()) {
    lstm_seq_backward_cols (T, B, H, rev, out->grad, c0->data, s->cs, s->sv, s->mask, s->wbt, dG, dxp, ldx, carry_h,
                            carry_c, s->zh, s->zc);
  } else if (PSM_PACK_FAST) {
    float *own = s->wpt || s->wbt ? NULL : psm_xaligned (psm_packed_floats (4 * H, H) * sizeof (float), "packed LSTM weights");
    const float *wpt = s->wpt ? s->wpt : own;
    if (!s->wbt && lstm_cols_team (B))
      lstm_seq_backward_cols32 (T, B, H, rev, out->grad, c0->data, s->cs, s->sv, s->mask, w->data, own, wpt, dG, dxp,
                                ldx, carry_h, carry_c, s->zh, s->zc);
    else
#pragma omp parallel num_threads (psm_pack_threads (B))
    {
      int b0, b1;
      psm_pack_row_split (B, omp_get_num_threads (), omp_get_thread_num (), &b0, &b1);
      float *C = psm_xaligned ((size_t) MAX (b1 - b0, 1) * ldc * sizeof (float), "LSTM scratch");
      float *dGc = s->mask ? psm_xmalloc ((size_t) MAX (b1 - b0, 1) * 4 * H * sizeof (float), "LSTM scratch") : NULL;
      if (own)
        psm_pack_shared (4 * H, H, w->data, 4 * H, TRUE, own);   /* op(W) = W^T [4H, H] */
      lstm_seq_backward_rows (T, B, H, b0, b1, rev, out->grad, out->data, c0->data, s->cs, s->sv, s->mask,
                              w->data, wpt, s->wbt, dG, dxp, ldx, carry_h, carry_c, C, ldc, dGc, s->zh, s->zc);
      free (dGc);
      free (C);
    }
    free (own);
  } else {
    float *C = psm_xmalloc ((size_t) B * ldc * sizeof (float), "LSTM scratch");
    float *dGc = s->mask ? psm_xmalloc ((size_t) B * 4 * H * sizeof (float), "LSTM scratch") : NULL;
    lstm_seq_backward_rows (T, B, H, 0, B, rev, out->grad, out->data, c0->data, s->cs, s->sv, s->mask, w->data,
                            NULL, s->wbt, dG, dxp, ldx, carry_h, carry_c, C, ldc, dGc, s->zh, s->zc);
    free (dGc);
    free (C);
  }
  if (h0->grad)
    for (size_t i = 0; i < BH; i++)
      h0->grad[i] += carry_h[i];
  if (c0->grad)
    for (size_t i = 0; i < BH; i++)
      c0->grad[i] += carry_c[i];
  if (w->grad) {
    /* dW = sum over steps of h_prev^T dG: h0 against the first step's dG,
     * the other steps as one GEMM (h_prev of position t is h of t - 1, or
     * of t + 1 in reverse) */
    int first = rev ? T - 1 : 0;
    const float *hprev = out->data + (rev ? BH : 0), *dgo = dG + (rev ? 0 : (size_t) B * 4 * H);
    if (s->wbt) {   /* train.precision bf16: as one product from h0 on */
      if (rev) {
        psm_gemm_bf16_op (TRUE, FALSE, H, 4 * H, B, h0->data, H, dG + (size_t) first * B * 4 * H, 4 * H, TRUE,
                          w->grad, 4 * H);
        if (T > 1)
          psm_gemm_bf16_op (TRUE, FALSE, H, 4 * H, (T - 1) * B, hprev, H, dgo, 4 * H, TRUE, w->grad, 4 * H);
      } else {   /* h0 then h of 0..T-2: rows contiguous once h0 is put before them */
        float *hp = psm_xmalloc ((size_t) T * BH * sizeof (float), "LSTM gradients");
        memcpy (hp, h0->data, BH * sizeof (float));
        memcpy (hp + BH, out->data, (size_t) (T - 1) * BH * sizeof (float));
        psm_gemm_bf16_op (TRUE, FALSE, H, 4 * H, T * B, hp, H, dG, 4 * H, TRUE, w->grad, 4 * H);
        free (hp);
      }
    } else {
      psm_gemm (TRUE, FALSE, H, 4 * H, B, 1.0f, h0->data, H, dG + (size_t) first * B * 4 * H, 4 * H, 1.0f, w->grad,
                4 * H);
      if (T > 1)
        psm_gemm (TRUE, FALSE, H, 4 * H, (T - 1) * B, 1.0f, hprev, H, dgo, 4 * H, 1.0f, w->grad, 4 * H);
    }
  }
  free (dG);
  free (carry_h);
  free (carry_c);
}
