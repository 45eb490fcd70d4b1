/* lstm.c — fused LSTM cell.
 * Forward, with G = xp + h W (xp = x W_x + b precomputed), gates [i f g o]:
 *   i = s(G_i)  f = s(G_f)  g = tanh(G_g)  o = s(G_o)
 *   c' = f c + i g          h' = o tanh(c')
 * Backward, given dh', dc':
 *   dc~ = dc' + dh' o (1 - tanh^2 c')
 *   dG_i = dc~ g i (1 - i)  dG_f = dc~ c f (1 - f)
 *   dG_g = dc~ i (1 - g^2)  dG_o = dh' tanh(c') o (1 - o)
 *   dc += dc~ f   dxp += dG   dh += dG W^T   dW += h^T dG
 * Output is [2, B, H] (h' then c'). Saved: i, f, g, o, tanh c' ([B, 5H]).
 * Rows with mask 0 carry (h, c) unchanged. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "psm-private.h"
#include "fastmath.h"

PsmTensor *
psm_lstm_cell (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *c, PsmTensor *w, const float *mask)
{
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  g_return_val_if_fail (psm_tensor_rows (xp) == B && psm_tensor_cols (xp) == 4 * H, NULL);
  g_return_val_if_fail (c->n == h->n && w->n == (size_t) H * 4 * H, NULL);
  PsmTensor *in[4] = { xp, h, c, w };
  int shape[3] = { 2, B, H };
  PsmTensor *out = psm_op_out (g, 3, shape, 4, in);
  float *G = psm_graph_alloc (g, (size_t) B * 4 * H * sizeof (float));
  float *sv = psm_graph_alloc (g, (size_t) B * 5 * H * sizeof (float));
  memcpy (G, xp->data, (size_t) B * 4 * H * sizeof (float));
  psm_gemm (FALSE, FALSE, B, 4 * H, H, 1.0f, h->data, H, w->data, 4 * H, 1.0f, G, 4 * H);
  float *ho = out->data, *co = out->data + (size_t) B * H;
  for (int b = 0; b < B; b++) {
    const float *gr = G + (size_t) b * 4 * H, *cp = c->data + (size_t) b * H;
    float *s = sv + (size_t) b * 5 * H;
    if (mask && mask[b] == 0.0f) {
      memcpy (ho + (size_t) b * H, h->data + (size_t) b * H, H * sizeof (float));
      memcpy (co + (size_t) b * H, cp, H * sizeof (float));
      continue;
    }
    /* s = [i f g o tanh c']: gates first, in two vector loops */
#pragma omp simd
    for (int j = 0; j < 2 * H; j++)
      s[j] = psm_fast_sigmoidf (gr[j]);
#pragma omp simd
    for (int j = 0; j < H; j++) {
      s[2 * H + j] = psm_fast_tanhf (gr[2 * H + j]);
      s[3 * H + j] = psm_fast_sigmoidf (gr[3 * H + j]);
    }
#pragma omp simd
    for (int j = 0; j < H; j++) {
      float cn = s[H + j] * cp[j] + s[j] * s[2 * H + j], tc = psm_fast_tanhf (cn);
      co[(size_t) b * H + j] = cn;
      ho[(size_t) b * H + j] = s[3 * H + j] * tc;
      s[4 * H + j] = tc;
    }
  }
  PsmNode *n = psm_graph_record (g, PSM_OP_LSTM_CELL, out, 4, in);
  if (n) {
    n->saved = sv;
    n->aux[0] = psm_graph_dup (g, mask, B * sizeof (float));
  }
  return out;
}

void
psm_lstm_cell_backward (PsmNode *n)
{
  PsmTensor *xp = n->in[0], *h = n->in[1], *c = n->in[2], *w = n->in[3], *out = n->out;
  const float *mask = n->aux[0], *sv = n->saved;
  int B = psm_tensor_rows (h), H = psm_tensor_cols (h);
  const float *dho = out->grad, *dco = out->grad + (size_t) B * H;
  float *dG = psm_xmalloc0 ((size_t) B * 4 * H * sizeof (float), "LSTM gradients");
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
      float i_ = s[j], f = s[H + j], gg = s[2 * H + j], o = s[3 * H + j], tc = s[4 * H + j];
      float dct = dc[j] + dh[j] * o * (1.0f - tc * tc);
      gr[j] = dct * gg * i_ * (1.0f - i_);
      gr[H + j] = dct * cp[j] * f * (1.0f - f);
      gr[2 * H + j] = dct * i_ * (1.0f - gg * gg);
      gr[3 * H + j] = dh[j] * tc * o * (1.0f - o);
      if (c->grad)
        c->grad[(size_t) b * H + j] += dct * f;
    }
  }
  if (xp->grad)
    for (size_t i = 0; i < (size_t) B * 4 * H; i++)
      xp->grad[i] += dG[i];
  if (h->grad)
    psm_gemm (FALSE, TRUE, B, H, 4 * H, 1.0f, dG, 4 * H, w->data, 4 * H, 1.0f, h->grad, H);
  if (w->grad)
    psm_gemm (TRUE, FALSE, H, 4 * H, B, 1.0f, h->data, H, dG, 4 * H, 1.0f, w->grad, 4 * H);
  free (dG);
}
