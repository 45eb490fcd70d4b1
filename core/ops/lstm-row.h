/* lstm-row.h — one LSTM row's forward from its pre-activations, shared by
 * the cell (lstm.c) and the sequence ops (lstm-seq.c), so that both compute
 * h' and c' with the same arithmetic (lstm.c has the equations). */
#ifndef PSM_LSTM_ROW_H
#define PSM_LSTM_ROW_H
#include "fastmath.h"

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

#endif
