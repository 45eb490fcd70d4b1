/* bf16-grads.c — the linear backward in bfloat16 (train.precision bf16):
 * dx += dy W^T and dW += x^T dy on dy, x and W rounded, the sums in
 * single precision, db the column sums of dy; on AMX tiles where the CPU
 * has them (dy rounded into tiles once for both products), else through
 * psm_gemm_bf16 on psm's packed kernel. dy is given, or made from the
 * scores of a log softmax pick as it is rounded (psm_linear_bf16_pick_grads:
 * never stored whole). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels/bf16-amx.h"
#include "kernels/fastmath.h"

#ifdef PSM_AMX_CODE
/* dy as W's packing for x^T dy (K = its R rows, n = N) from its rounded
 * tiles (psm_bf16_tiles_op, Nb tiles of 32 columns a block of 16 rows, the
 * blocks to a whole number of pairs of them): a W tile's row r is rows 2r
 * and 2r + 1 of one tile of dy, 16 of its columns, interleaved. */
/* one pair of tiles u (the loop below; a function of its own with the
 * target's instructions: clang's outlined OpenMP body does not inherit the
 * enclosing function's target, and refused the vectors there) */
AMX_TARGET static void
amx_pair_from_tiles (const uint16_t *dyt, int Rb2, int Nb, uint16_t *o, long u)
{
  int p = (int) (u / Rb2), kb = (int) (u % Rb2);
  for (int h = 0; h < 2; h++) {
    uint16_t *t = o + ((size_t) u * 2 + h) * TILE;
    for (int r = 0; r < TK / 2; r++) {
      int row = 2 * r;   /* of the 32 rows kb covers: tile 2 kb + row / 16 */
      const uint16_t *s = dyt + ((size_t) (2 * kb + row / 16) * Nb + p) * TILE + (row % 16) * TK + h * TN;
      __m512i v = _mm512_inserti64x4 (_mm512_castsi256_si512 (_mm256_loadu_si256 ((const __m256i *) s)),
                                      _mm256_loadu_si256 ((const __m256i *) (s + TK)), 1);
      _mm512_storeu_si512 (t + r * 2 * TN, interleave_rows (v));
    }
  }
}

static void
amx_pairs_from_tiles (const uint16_t *dyt, int Rb2, int Nb, uint16_t *o)
{
#pragma omp parallel for if ((long) Rb2 * Nb >= 64 && !omp_in_parallel ()) schedule (static)
  for (long u = 0; u < (long) Nb * Rb2; u++)
    amx_pair_from_tiles (dyt, Rb2, Nb, o, u);
}
#endif

/* The gradient of the scores under log softmax picks (psm_linear_pick_
 * log_softmax): row i of dy is d_i (e_{t_i} - softmax (z_i)), softmax (z_i)
 * = exp (z_i - lse_i); zeros where t_i < 0 or d_i = 0. */
typedef struct {
  const float *lse;
  const int32_t *t;
  const float *d;
} PickDy;

/* dy[i, k0 .. k0 + nk) from the scores z (pk) into v */
static inline void
pick_dy_block (const PickDy *pk, const float *z, int i, int k0, int nk, float *restrict v)
{
  float d = pk->t[i] >= 0 ? pk->d[i] : 0.0f, l = pk->lse[i];
  if (d == 0.0f) {
    memset (v, 0, (size_t) nk * sizeof (float));
    return;
  }
  float nd = -d;
#pragma omp simd
  for (int kk = 0; kk < nk; kk++)
    v[kk] = nd * psm_fast_expf (z[k0 + kk] - l);
  if (pk->t[i] >= k0 && pk->t[i] < k0 + nk)
    v[pk->t[i] - k0] += d;
}

#ifdef PSM_AMX_CODE
/* dy [R, N] rounded into its tiles (as psm_bf16_tiles_op, Mp rows) and, when
 * db is not NULL, its column sums added to db, in one pass: the threads
 * take bands of whole tiles of columns, each its band's rows in order
 * (the sums the same whatever the split). With pk, dy is made from the
 * scores z = dy's argument as it goes (pick_dy_block) and never stored. */
static void
dy_tiles_colsum (int R, int N, const float *dy, const PickDy *pk, uint16_t *dyt, int Nb, int Mp, float *db)
{
#pragma omp parallel if ((long) R * N >= (1L << 16) && !omp_in_parallel ())
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int nb0 = Nb * id / team, nb1 = Nb * (id + 1) / team;
    int c0 = nb0 * TK, c1 = MIN (N, nb1 * TK);
    float *acc = db && c1 > c0 ? g_new0 (float, c1 - c0) : NULL;
    float *band = pk && c1 > c0 ? psm_xaligned ((size_t) (c1 - c0) * sizeof (float), "bf16 rows") : NULL;
    for (int i = 0; i < Mp; i++) {
      if (band && i < R)   /* the row's dy over the band, made at once */
        pick_dy_block (pk, dy + (size_t) i * N, i, c0, c1 - c0, band);
      for (int nb = nb0; nb < nb1; nb++) {
        uint16_t *o = dyt + ((size_t) (i / 16) * Nb + nb) * TILE + (i % 16) * TK;
        int k0 = nb * TK, nk = i < R ? MIN (TK, N - k0) : 0;
        const float *x = band ? band + (k0 - c0) : dy + (size_t) i * N + k0;
        if (nk == TK) {
#pragma omp simd
          for (int kk = 0; kk < TK; kk++)
            o[kk] = bf16_bits (x[kk]);
          if (acc) {
            float *a = acc + (k0 - c0);
#pragma omp simd
            for (int kk = 0; kk < TK; kk++)
              a[kk] += x[kk];
          }
        } else {
          for (int kk = 0; kk < TK; kk++)
            o[kk] = kk < nk ? bf16_bits (x[kk]) : 0;
          for (int kk = 0; acc && kk < nk; kk++)
            acc[k0 - c0 + kk] += x[kk];
        }
      }
    }
    for (int j = c0; acc && j < c1; j++)
      db[j] += acc[j - c0];
    g_free (acc);
    free (band);
  }
}
#endif

/* psm_linear_bf16_grads, dy given (pk NULL) or made from the scores dy
 * points at (pk) */
static void
linear_bf16_grads (int R, int K, int N, const float *x, const float *dy, const PickDy *pk, const void *wtp,
                   float *dx, float *dw, float *db)
{
  if (R <= 0 || K <= 0 || N <= 0)
    return;
#ifdef PSM_AMX_CODE
  if (psm_amx_usable () && (dx || dw)) {
    int Nb = (N + TK - 1) / TK, Rb2 = (R + TK - 1) / TK;   /* dy's tiles: 2 Rb2 blocks of 16 rows */
    uint16_t *dyt = psm_bf16_scratch_get (&psm_bf16_scratch_rows, (size_t) 2 * Rb2 * Nb * TILE * sizeof (uint16_t), "bf16 rows");
    dy_tiles_colsum (R, N, dy, pk, dyt, Nb, 2 * Rb2 * 16, db);
    if (dx)   /* dx += dy W^T */
      psm_amx_run (R, K, Nb * TK, dyt, wtp, NULL, TRUE, dx, K);
    if (dw) {   /* dW += x^T dy */
      int Kp = (K + 15) / 16 * 16;
      uint16_t *dyp = psm_bf16_scratch_get (&psm_bf16_scratch_pack, (size_t) Nb * Rb2 * 2 * TILE * sizeof (uint16_t), "bf16 packing");
      uint16_t *xt = psm_bf16_scratch_get (&psm_bf16_scratch_x, (size_t) Kp * Rb2 * TK * sizeof (uint16_t), "bf16 rows");
      amx_pairs_from_tiles (dyt, Rb2, Nb, dyp);
      psm_bf16_tiles_op (TRUE, K, R, x, K, xt, Rb2, Kp);
      psm_amx_run (K, N, Rb2 * TK, xt, dyp, NULL, TRUE, dw, N);
      psm_bf16_scratch_put (&psm_bf16_scratch_pack, dyp);
      psm_bf16_scratch_put (&psm_bf16_scratch_x, xt);
    }
    psm_bf16_scratch_put (&psm_bf16_scratch_rows, dyt);
    return;
  }
#endif
  float *made = NULL;
  if (pk) {   /* the packed kernel's path reads dy whole */
    made = psm_xmalloc ((size_t) R * N * sizeof (float), "bf16 rows");
#pragma omp parallel for if ((long) R * N >= (1L << 16)) schedule (static)
    for (int i = 0; i < R; i++)
      pick_dy_block (pk, dy + (size_t) i * N, i, 0, N, made + (size_t) i * N);
    dy = made;
  }
  if (dx)
    psm_gemm_bf16 (R, K, N, dy, N, wtp, NULL, TRUE, dx, K);
  if (dw)
    psm_gemm_bf16_op (TRUE, FALSE, K, N, R, x, K, dy, N, TRUE, dw, N);
  if (db)
    psm_colsum_add (R, N, dy, db);
  free (made);
}

void
psm_linear_bf16_grads (int R, int K, int N, const float *x, const float *dy, const void *wtp, float *dx, float *dw,
                       float *db)
{
  linear_bf16_grads (R, K, N, x, dy, NULL, wtp, dx, dw, db);
}

void
psm_linear_bf16_pick_grads (int R, int K, int N, const float *x, const float *z, const float *lse, const int32_t *t,
                            const float *d, const void *wtp, float *dx, float *dw, float *db)
{
  PickDy pk = { lse, t, d };
  linear_bf16_grads (R, K, N, x, z, &pk, wtp, dx, dw, db);
}

