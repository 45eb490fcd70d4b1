/* lstm-row.h — one LSTM row's forward from its pre-activations and one
 * unit's gate gradients, shared by the cell (lstm.c) and the sequence ops
 * (lstm-seq.c), so that both compute with the same arithmetic (lstm.c has
 * the equations). */
#ifndef PSM_LSTM_ROW_H
#define PSM_LSTM_ROW_H
#include "kernels/fastmath.h"

/* Gates and new state of one row from its pre-activations G [4H]. */
static inline void
lstm_row_forward (int H, const float *G, const float *cp, float *s, float *ho, float *co)
{
#pragma omp simd
  for (int j = 0; j < 2 * H; j++)
    s[j] = psm_fast_sigmoidf (G[j]);
#pragma omp simd
  for (int j = 0; j < H; j++) {
    s[2 * H + j] = psm_fast_tanhf (G[2 * H + j]);
    s[3 * H + j] = psm_fast_sigmoidf (G[3 * H + j]);
  }
#pragma omp simd
  for (int j = 0; j < H; j++) {
    float cn = s[H + j] * cp[j] + s[j] * s[2 * H + j], tc = psm_fast_tanhf (cn);
    co[j] = cn;
    ho[j] = s[3 * H + j] * tc;
    s[4 * H + j] = tc;
  }
}

/* The same without keeping the gates (no backward will read them): one
 * loop of the same arithmetic, the same h' and c'. */
static inline __attribute__ ((always_inline)) void
lstm_row_forward_nosave (int H, const float *restrict gr, const float *restrict cp, float *restrict ho,
                         float *restrict co)
{
#pragma omp simd
  for (int j = 0; j < H; j++) {
    float i = psm_fast_sigmoidf (gr[j]), f = psm_fast_sigmoidf (gr[H + j]);
    float gg = psm_fast_tanhf (gr[2 * H + j]), o = psm_fast_sigmoidf (gr[3 * H + j]);
    float cn = f * cp[j] + i * gg;
    co[j] = cn;
    ho[j] = o * psm_fast_tanhf (cn);
  }
}

/* One unit's backward (lstm.c has the equations): the gradient reaching
 * c_t, dc_t = dc + dho o (1 - tanh^2 c_t), from the gradient dc of c_t
 * from later and dho of h_t; and from it the four gates' gradients into
 * gr [4H] (s: the row's saved gates and tanh c_t, cp: c_{t-1}). */
static inline __attribute__ ((always_inline)) float
lstm_row_dct (int H, int j, const float *s, float dc, float dho)
{
  float o = s[3 * H + j], tc = s[4 * H + j];
  return dc + dho * o * (1.0f - tc * tc);
}

static inline __attribute__ ((always_inline)) void
lstm_row_gate_grads (int H, int j, const float *s, const float *cp, float dct, float dho, float *gr)
{
  float i_ = s[j], f = s[H + j], gg = s[2 * H + j], o = s[3 * H + j], tc = s[4 * H + j];
  gr[j] = dct * gg * i_ * (1.0f - i_);
  gr[H + j] = dct * cp[j] * f * (1.0f - f);
  gr[2 * H + j] = dct * i_ * (1.0f - gg * gg);
  gr[3 * H + j] = dho * tc * o * (1.0f - o);
}

#endif
