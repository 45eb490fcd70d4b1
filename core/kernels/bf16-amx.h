/* bf16-amx.h — what core/kernels/bf16.c (packing, products) and
 * bf16-grads.c (the linear backward) share: the AMX tile geometry, the
 * rounding, the calling thread's scratch, the rounded tiles of op(A) and
 * the AMX product on them. Private to those two files. */
#ifndef PSM_BF16_AMX_H
#define PSM_BF16_AMX_H
#include <stdint.h>
#include <string.h>
#include "kernels/kernels-internal.h"

#if defined (__x86_64__) && defined (__GNUC__) && (__GNUC__ >= 11 || defined (__clang__))
#define PSM_AMX_CODE 1
#include <immintrin.h>
#define AMX_TARGET __attribute__ ((target ("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#endif

#define TK 32     /* k a tile (16 pairs) */
#define TN 16     /* columns a tile of W */
#define PN 32     /* columns a panel: two tiles */
#define TILE 512  /* bf16 values a tile (1 KB) */

static inline uint16_t
bf16_bits (float f)
{
  uint32_t u;
  memcpy (&u, &f, sizeof u);
  /* NaN stays a (quiet) NaN; else to nearest, ties to even. Branch-free,
   * so that a loop over it is vectorised (psm_bf16_tiles_op). */
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) >> 16, q = (u >> 16) | 0x40;
  return (uint16_t) ((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

#ifdef PSM_AMX_CODE
/* The tiles' pair layout in vectors (the CPUs with AMX all have
 * AVX512-BF16, whose conversion rounds to nearest even as bf16_bits does;
 * it flushes subnormals to zero, as TDPBF16PS treats them anyway). v: 16
 * bfloat16 of one row then 16 of the next; returned as their 16 pairs,
 * the first row's value first. */
AMX_TARGET static inline __m512i
interleave_rows (__m512i v)
{
  const __m512i ix = _mm512_set_epi16 (31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                       20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16 (ix, v);
}
#endif

/* Scratch for the rounded rows and a call's packing: a calling thread's
 * own, grown as needed and kept, when it is not inside a parallel region
 * (train.precision's products of 3,200 x 10,000 would otherwise map and
 * fault in 64 MB twice an update); else malloc'd for the call
 * (psm_bf16_scratch_put frees that one). */
typedef struct {
  void *p;
  size_t cap;
} PsmBf16Scratch;
G_GNUC_INTERNAL extern __thread PsmBf16Scratch psm_bf16_scratch_rows, psm_bf16_scratch_pack, psm_bf16_scratch_x;
G_GNUC_INTERNAL void *psm_bf16_scratch_get (PsmBf16Scratch *s, size_t bytes, const char *what);
G_GNUC_INTERNAL void psm_bf16_scratch_put (PsmBf16Scratch *s, void *p);

/* op(A) [M, K] rounded into tiles of 16 rows x 32 k (Kb of them a row
 * block, Mp rows, zero-padded): AMX's left operand. */
G_GNUC_INTERNAL void psm_bf16_tiles_op (gboolean ta, int M, int K, const float *A, int lda, uint16_t *a, int Kb, int Mp);
#ifdef PSM_AMX_CODE
/* C[M, N] = a W + bias, or C += a W (acc), on the AMX tiles: a from
 * psm_bf16_tiles_op (Kp = 32 Kb), W packed (psm_bf16_pack_op). */
G_GNUC_INTERNAL void psm_amx_run (int M, int N, int Kp, const uint16_t *a, const uint16_t *wp, const float *bias,
                                  gboolean acc, float *C, int ldc);
#endif
#endif
