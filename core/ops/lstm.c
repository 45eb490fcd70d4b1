/* lstm.c — fused LSTM cell.
 * Forward, with G = xp + h W (xp = x W_x + b precomputed), gates [i f g o]:
 *   i = s(G_i)  f = s(G_f)  g = tanh(G_g)  o = s(G_o)
 *   c' = f c + i g          h' = o tanh(c')
 * Backward, given dh', dc':
 *   dc~ = dc' + dh' o (1 - tanh^2 c')
 *   dG_i = dc~ g i (1 - i)  dG_f = dc~ c f (1 - f)
 *   dG_g = dc~ i (1 - g^2)  dG_o = dh' tanh(c') o (1 - o)
 *   dc += dc~ f   dxp += dG   dh += dG W^T   dW += h^T dG
 * Output is [2, B, H] (h' then c'). Saved, when a gradient will be taken:
 * i, f, g, o, tanh c' ([B, 5H]).
 * Rows with mask 0 carry (h, c) unchanged. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "ops/ops-internal.h"
#include "lstm-row.h"

/* psm_lstm_cell's node: the gates and tanh c' [B, 5H]; with W's gradient
 * deferred (ops-internal.h: a parameter W, no mask) the deferral and dG [B,
 * 4H], which the backward makes in the graph's arena so that it outlives
 * the node's backward */
typedef struct {
  float *sv;
  PsmDeferredWeight *dw;
  float *dG;
} LstmCellSaved;

PsmTensor *
psm_lstm_cell (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *c, PsmTensor *w, const float *mask)
{
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  g_return_val_if_fail (psm_tensor_rows (xp) == B && psm_tensor_cols (xp) == 4 * H, NULL);
  g_return_val_if_fail (c->n == h->n && w->n == (size_t) H * 4 * H, NULL);
  /* h W's path (tape-internal.h); a decoder step's W gradient summed over
   * the steps at the end (before this node is recorded, so that its node's
   * backward runs after) */
  PsmTensor *in[4] = { xp, h, c, w };
  PsmWeightPlan p = psm_weight_plan (g, w, H, 4 * H, B, psm_needs_grad (g, 4, in), mask ? 0 : PSM_PLAN_DEFER);
  PsmDeferredWeight *dw = p.defer ? psm_graph_deferred_weight (g, w, FALSE) : NULL;
  int shape[3] = { 2, B, H };
  PsmTensor *out = psm_op_out (g, 3, shape, 4, in);
  /* the gates and tanh c' for the backward; without one (decoding) none */
  float *sv = out->grad ? psm_graph_alloc (g, (size_t) B * 5 * H * sizeof (float)) : NULL;
  /* without a backward or a mask (decoding), on the kernels whose dot
   * product is complete before C is added to it: G = h W, xp added row by
   * row below (the same sum xp + h W, without copying xp to G first; not
   * on BLAS, whose blocks over k each add to C), and G from the graph's
   * arena (a fresh 5 MB a step had been page faults) */
  gboolean fold = !sv && !mask && p.path != PSM_WEIGHT_BLAS;
  float *G = fold ? psm_graph_alloc (g, (size_t) MAX (B, 1) * 4 * H * sizeof (float))
                  : psm_xmalloc ((size_t) MAX (B, 1) * 4 * H * sizeof (float), "LSTM scratch");
  float *hc = mask ? psm_xmalloc ((size_t) B * H * sizeof (float), "LSTM scratch") : NULL;
  /* G's row r: the r-th real row (mask NULL: all), xp + h W */
  const float *xin, *hin;
  int R = psm_pack_real_rows (mask, 0, B, 0, B, xp->data, 4 * H, G, &xin);
  if (xin != G && !fold)
    memcpy (G, xin, (size_t) R * 4 * H * sizeof (float));
  psm_pack_real_rows (mask, 0, B, 0, B, h->data, H, hc, &hin);
  if (R)
    psm_weight_gemm (g, &p, R, hin, H, NULL, !fold, G, 4 * H);
  free (hc);
  /* G's row of example b: the real rows before b */
  int *grow = mask ? psm_xmalloc ((size_t) MAX (B, 1) * sizeof (int), "LSTM scratch") : NULL;
  if (mask) {
    for (int b = 0, r = 0; b < B; b++)
      grow[b] = mask[b] != 0.0f ? r++ : -1;
  }
  float *ho = out->data, *co = out->data + (size_t) B * H;
#pragma omp parallel for if ((long) B * H >= 32768) schedule (static)
  for (int b = 0; b < B; b++) {
    const float *cp = c->data + (size_t) b * H;
    if (mask && grow[b] < 0) {
      memcpy (ho + (size_t) b * H, h->data + (size_t) b * H, H * sizeof (float));
      memcpy (co + (size_t) b * H, cp, H * sizeof (float));
      continue;
    }
    float *gr = G + (size_t) (mask ? grow[b] : b) * 4 * H;
    if (fold) {
      const float *x = xp->data + (size_t) b * 4 * H;
#pragma omp simd
      for (int j = 0; j < 4 * H; j++)
        gr[j] += x[j];
    }
    if (sv)
      lstm_row_forward (H, gr, cp, sv + (size_t) b * 5 * H, ho + (size_t) b * H, co + (size_t) b * H);
    else
      lstm_row_forward_nosave (H, gr, cp, ho + (size_t) b * H, co + (size_t) b * H);
  }
  free (grow);
  if (!fold)
    free (G);
  PsmNode *n = psm_graph_record (g, PSM_OP_LSTM_CELL, out, 4, in);
  if (n) {
    LstmCellSaved *s = psm_graph_alloc (g, sizeof *s);
    s->sv = sv;
    s->dw = dw;
    s->dG = dw ? psm_graph_alloc (g, (size_t) MAX (B, 1) * 4 * H * sizeof (float)) : NULL;
    n->saved = s;
    n->aux[0] = psm_graph_dup (g, mask, B * sizeof (float));
    if (p.path == PSM_WEIGHT_PACKED && h->grad)   /* dh = dG W^T on W^T packed */
      n->aux[1] = psm_weight_transposed (g, &p);
  }
  return out;
}

void
psm_lstm_cell_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h = n->in[1], *c = n->in[2], *w = n->in[3], *out = n->out;
  const LstmCellSaved *ls = n->saved;
  const float *mask = n->aux[0], *sv = ls->sv;
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  const float *dho = out->grad, *dco = out->grad + (size_t) B * H;
  /* every row of dG written below when there is no mask (the deferred case) */
  float *dG = ls->dG ? ls->dG : psm_xmalloc0 ((size_t) B * 4 * H * sizeof (float), "LSTM gradients");
  for (int b = 0; b < B; b++) {
    const float *dh = dho + (size_t) b * H, *dc = dco + (size_t) b * H;
    if (mask && mask[b] == 0.0f) {
      for (int j = 0; j < H; j++) {
        if (h->grad)
          h->grad[(size_t) b * H + j] += dh[j];
        if (c->grad)
          c->grad[(size_t) b * H + j] += dc[j];
      }
      continue;
    }
    const float *s = sv + (size_t) b * 5 * H, *cp = c->data + (size_t) b * H;
    float *gr = dG + (size_t) b * 4 * H;
    for (int j = 0; j < H; j++) {
      float dct = lstm_row_dct (H, j, s, dc[j], dh[j]);
      lstm_row_gate_grads (H, j, s, cp, dct, dh[j], gr);
      if (c->grad)
        c->grad[(size_t) b * H + j] += dct * s[H + j];
    }
  }
  if (xp->grad)
    for (size_t i = 0; i < (size_t) B * 4 * H; i++)
      xp->grad[i] += dG[i];
  psm_cell_recurrent_backward (B, H, 4 * H, mask, dG, h->data, w->data, n->aux[1], h->grad, ls->dw ? NULL : w->grad);
  if (ls->dw && w->grad) {
    PsmDeferredRows r = { h->data, dG, B };
    g_array_append_val (ls->dw->rows, r);
  }
  if (!ls->dG)
    free (dG);
}
