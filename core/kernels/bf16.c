/* bf16.c — linear products in bfloat16 (decode.precision and
 * train.precision).
 *
 * y = x W + b with x and W rounded to bfloat16 (round to nearest even) and
 * the products summed in single precision. Where the CPU has AMX (Intel
 * Sapphire Rapids and later: AMX-TILE and AMX-BF16, and the kernel grants
 * the tile data), W is packed once per decoding into the tiles' pair layout
 * and each product is a run of TDPBF16PS on 16 x 32 tiles of x against
 * 32 x 16 of W: about sixteen times the multiply-adds a cycle of AVX-512's
 * FMAs (3,800 against 242 GFLOP/s on a core of an Intel host, BENCHMARKS.md
 * e; AVX512-BF16's VDPBF16PS ran at half the FMAs' rate there). Elsewhere
 * the same rounded operands go through psm's packed single-precision
 * kernel: the same products, summed in another order, and no faster. The
 * decoding graph uses this when decode.precision is bf16
 * (psm_graph_set_bf16). Training uses it only when told
 * (train.precision bf16, psm_graph_set_bf16_train: mixed precision, the
 * backward's dy W^T and x^T dy rounded too, the weights and gradients
 * kept in single precision): a gradient through rounded operands trains a
 * slightly different model (RESULTS.md, "Mixed-precision training").
 *
 * AMX layout of a packed W (K x n): panels of 32 columns, each Kb = ceil
 * (K / 32) blocks of 32 k, each block two tiles of 16 columns; a tile's row
 * r holds, for each of its 16 columns c, W[32 kb + 2 r][c] and W[32 kb + 2
 * r + 1][c] side by side (the pairs TDPBF16PS multiplies with a row's
 * pairs of x). K and n are zero-padded to whole tiles. */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "kernels/bf16-amx.h"
#ifdef PSM_AMX_CODE
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

float
psm_bf16_round (float f)
{
  uint32_t u = (uint32_t) bf16_bits (f) << 16;
  float r;
  memcpy (&r, &u, sizeof r);
  return r;
}

void
psm_bf16_round_bits (size_t n, const float *x, uint16_t *out)
{
#pragma omp simd
  for (size_t i = 0; i < n; i++)
    out[i] = bf16_bits (x[i]);
}

static gboolean amx_ok;

static gpointer
amx_probe (gpointer unused)
{
  (void) unused;
#ifdef PSM_AMX_CODE
  const char *off = g_getenv ("PSM_NO_AMX");
  if (off && *off && strcmp (off, "0"))
    return NULL;
  unsigned a, b, c, d;
  if (!__get_cpuid_count (7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
    return NULL;   /* AMX-BF16 (bit 22), AMX-TILE (bit 24) */
  /* Linux hands out the 8 KB of tile state only on request
   * (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), for the whole process */
  if (syscall (SYS_arch_prctl, 0x1023, 18) != 0)
    return NULL;
  amx_ok = TRUE;
#endif
  return NULL;
}

gboolean
psm_amx_usable (void)
{
  static GOnce once = G_ONCE_INIT;
  g_once (&once, amx_probe, NULL);
  return amx_ok && psm_paths.bf16_amx;
}

size_t
psm_bf16_packed_bytes (int K, int n)
{
  if (psm_amx_usable ())
    return (size_t) ((n + PN - 1) / PN) * ((K + TK - 1) / TK) * 2 * TILE * sizeof (uint16_t);
  return psm_packed_floats (K, n) * sizeof (float);
}

#ifdef PSM_AMX_CODE
/* 16 floats of r0 and of r1 rounded and paired */
AMX_TARGET static inline __m512i
round_pairs (const float *r0, const float *r1)
{
  return interleave_rows ((__m512i) _mm512_cvtne2ps_pbh (_mm512_loadu_ps (r1), _mm512_loadu_ps (r0)));
}

/* t's 16 rows of 64 bytes: the 16 x 16 32-bit values (pairs) of pr
 * transposed, by gathers */
AMX_TARGET static inline void
transpose_pairs (const uint32_t *pr, uint16_t *t)
{
  const __m512i col = _mm512_mullo_epi32 (_mm512_set_epi32 (15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32 (16));
  for (int r = 0; r < 16; r++)
    _mm512_storeu_si512 (t + r * 2 * TN, _mm512_i32gather_epi32 (_mm512_add_epi32 (col, _mm512_set1_epi32 (r)), pr, 4));
}

/* One tile of op(W) (k from k0, columns from col0): row r, column c holds
 * op(W)[k0 + 2 r + j][col0 + c] at 2 c + j. Whole tiles in vectors, the
 * edges value by value. */
AMX_TARGET static void
amx_pack_tile (int K, int n, const float *w, int ldw, gboolean tb, int k0, int col0, uint16_t *t)
{
  if (k0 + TK <= K && col0 + TN <= n) {
    if (!tb) {   /* two rows of W, 16 columns each, interleaved */
      for (int r = 0; r < TK / 2; r++) {
        const float *r0 = w + (size_t) (k0 + 2 * r) * ldw + col0;
        _mm512_storeu_si512 (t + r * 2 * TN, round_pairs (r0, r0 + ldw));
      }
    } else {   /* W^T: a column of op(W) is a row of W, its pairs adjacent;
                * 16 rows' pairs, then transposed as 32-bit values */
      uint32_t pr[TN * TK / 2] __attribute__ ((aligned (64)));
      for (int c = 0; c < TN; c++) {
        const float *src = w + (size_t) (col0 + c) * ldw + k0;
        _mm512_store_si512 (pr + c * TK / 2,
                            (__m512i) _mm512_cvtne2ps_pbh (_mm512_loadu_ps (src + 16), _mm512_loadu_ps (src)));
      }
      transpose_pairs (pr, t);
    }
    return;
  }
  for (int r = 0; r < TK / 2; r++)
    for (int c = 0; c < TN; c++)
      for (int j = 0; j < 2; j++) {
        int k = k0 + 2 * r + j, col = col0 + c;
        float v = k < K && col < n ? (tb ? w[(size_t) col * ldw + k] : w[(size_t) k * ldw + col]) : 0.0f;
        t[r * 2 * TN + 2 * c + j] = k < K && col < n ? bf16_bits (v) : 0;
      }
}

static void
amx_pack (int K, int n, const float *w, int ldw, gboolean tb, uint16_t *o)
{
  int Kb = (K + TK - 1) / TK, panels = (n + PN - 1) / PN;
#pragma omp parallel for if ((long) K * n >= (1L << 18) && !omp_in_parallel ()) schedule (static)
  for (long u = 0; u < (long) panels * Kb; u++) {
    int p = (int) (u / Kb), kb = (int) (u % Kb);
    for (int h = 0; h < 2; h++)
      amx_pack_tile (K, n, w, ldw, tb, kb * TK, p * PN + h * TN, o + ((size_t) u * 2 + h) * TILE);
  }
}
#endif

void
psm_bf16_pack_op (int K, int n, const float *w, int ldw, gboolean tb, void *out)
{
  if (!psm_amx_usable ()) {   /* psm's single-precision panels of the rounded op(W) */
    float *o = out;
    psm_pack (K, n, w, ldw, tb, o);
    size_t m = psm_packed_floats (K, n);
#pragma omp parallel for if (m >= (1u << 20) && !omp_in_parallel ()) schedule (static)
    for (size_t i = 0; i < m; i++)
      o[i] = psm_bf16_round (o[i]);
    return;
  }
#ifdef PSM_AMX_CODE
  amx_pack (K, n, w, ldw, tb, out);
#endif
}

void
psm_bf16_pack (int K, int n, const float *w, void *out)
{
  psm_bf16_pack_op (K, n, w, n, FALSE, out);
}

/* op(A) (M x K: A[i][k], or A[k][i] with ta) rounded to bfloat16 in the
 * tiles' own order: [Mp / 16][Kb] tiles of 16 rows x 32 k, each a
 * contiguous kilobyte (rows of a long k a page or more apart had put the
 * 16 lines of a tile in a few sets of L1), zero-padded. Only where the
 * AMX tiles are (psm_amx_usable): a whole tile of A^T goes through
 * AVX512-BF16 (amx_tile_t). */
#ifdef PSM_AMX_CODE
/* t = the tile of A^T at rows i0 (16 columns of A) and k0 (32 rows of A):
 * rows 2j and 2j + 1 of A rounded and interleaved (the pairs of k of
 * each column as 32-bit values), then those transposed by gathers. */
AMX_TARGET static void
amx_tile_t (const float *A, int lda, int k0, int i0, uint16_t *t)
{
  uint32_t pr[TN * TK / 2] __attribute__ ((aligned (64)));
  for (int j = 0; j < TK / 2; j++) {
    const float *r0 = A + (size_t) (k0 + 2 * j) * lda + i0;
    _mm512_store_si512 (pr + j * TN, round_pairs (r0, r0 + lda));
  }
  transpose_pairs (pr, t);
}
#endif

void
psm_bf16_tiles_op (gboolean ta, int M, int K, const float *A, int lda, uint16_t *a, int Kb, int Mp)
{
#pragma omp parallel for if ((long) M * K >= (1L << 16) && !omp_in_parallel ()) schedule (static)
  for (int i0 = 0; i0 < Mp; i0 += 16) {
    int ni = MAX (0, MIN (16, M - i0));
    for (int kb = 0; kb < Kb; kb++) {
      uint16_t *t = a + ((size_t) (i0 / 16) * Kb + kb) * TILE;
      int k0 = kb * TK, nk = MIN (TK, K - k0);
#ifdef PSM_AMX_CODE
      if (ta && ni == 16 && nk == TK) {
        amx_tile_t (A, lda, k0, i0, t);
        continue;
      }
#endif
      if (ta) {
        for (int kk = 0; kk < nk; kk++) {
          const float *x = A + (size_t) (k0 + kk) * lda + i0;
          for (int ii = 0; ii < ni; ii++)
            t[ii * TK + kk] = bf16_bits (x[ii]);
        }
        for (int ii = 0; ii < ni; ii++)
          for (int kk = nk; kk < TK; kk++)
            t[ii * TK + kk] = 0;
      } else {
        for (int ii = 0; ii < ni; ii++) {
          const float *x = A + (size_t) (i0 + ii) * lda + k0;
          uint16_t *o = t + ii * TK;
          if (nk == TK) {
#pragma omp simd
            for (int kk = 0; kk < TK; kk++)
              o[kk] = bf16_bits (x[kk]);
          } else {
            for (int kk = 0; kk < TK; kk++)
              o[kk] = kk < nk ? bf16_bits (x[kk]) : 0;
          }
        }
      }
      if (ni < 16)
        memset (t + ni * TK, 0, (size_t) (16 - ni) * TK * sizeof (uint16_t));
    }
  }
}

#ifdef PSM_AMX_CODE
/* palette 1; tiles 0-3 the sums (16 x 16 floats), 4-5 x (16 rows x 32
 * bf16), 6-7 W (16 pairs x 16 columns): all 16 rows of 64 bytes */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__ ((packed)) TileCfg;

/* C[M, N] = a W + bias, or C += a W (acc), a the rounded op(A) in tiles
 * (psm_bf16_tiles_op, Kp = 32 Kb) and W packed. Blocks of 32 rows x 32
 * columns: four tiles of sums, and for each 32 k two tiles of a and two of
 * W. The column panels split over the threads; within a thread's, the
 * rows in groups whose tiles stay in L2 (about 1 MB) while its panels go
 * by. A block inside C starts from C itself (acc) or from the bias and is
 * stored straight into C; one at an edge goes through a buffer. (Sums
 * over k in chunks, C stored and reloaded between them, ran slower: 1,000
 * against 1,500 GFLOP/s on two cores of the Intel host of BENCHMARKS.md.) */
AMX_TARGET static void
amx_panels (int M, int N, int Kp, const uint16_t *a, const uint16_t *wp, const float *bias, gboolean acc, float *C,
            int ldc, int p0, int p1)
{
  int Kb = Kp / TK, Mp = (M + 15) / 16 * 16;
  int group = MAX (32, (1024 * 1024 / (Kp * (int) sizeof (uint16_t))) / 32 * 32);
  {
    TileCfg cfg;
    memset (&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig (&cfg);
    float cs[32 * PN] __attribute__ ((aligned (64)));
    float bb[16 * PN] __attribute__ ((aligned (64)));
    const size_t lc = (size_t) ldc * sizeof (float), la = TK * sizeof (uint16_t), le = PN * sizeof (float);
    for (int m0 = 0; m0 < Mp; m0 += group) {
      for (int p = p0; p < p1; p++) {
        const uint16_t *bp = wp + (size_t) p * Kb * 2 * TILE;
        int c0 = p * PN, nc = MIN (PN, N - c0);
        if (bias)
          for (int r = 0; r < 16; r++)
            for (int j = 0; j < PN; j++)
              bb[r * PN + j] = j < nc ? bias[c0 + j] : 0.0f;
        for (int mb = m0; mb < MIN (Mp, m0 + group); mb += 32) {
          gboolean two = mb + 16 < Mp;
          gboolean direct = nc == PN && mb + (two ? 32 : 16) <= M;
          const uint16_t *a0 = a + (size_t) (mb / 16) * Kb * TILE, *a1 = a0 + (size_t) Kb * TILE;
          float *d0 = C + (size_t) mb * ldc + c0, *d1 = d0 + (size_t) 16 * ldc;
          if (direct && acc) {
            _tile_loadd (0, d0, lc);
            _tile_loadd (1, d0 + TN, lc);
            if (two) {
              _tile_loadd (2, d1, lc);
              _tile_loadd (3, d1 + TN, lc);
            }
          } else if (bias) {
            _tile_loadd (0, bb, le);
            _tile_loadd (1, bb + TN, le);
            _tile_loadd (2, bb, le);
            _tile_loadd (3, bb + TN, le);
          } else {
            _tile_zero (0);
            _tile_zero (1);
            _tile_zero (2);
            _tile_zero (3);
          }
          for (int kb = 0; kb < Kb; kb++) {
            _tile_loadd (6, bp + (size_t) kb * 2 * TILE, 64);
            _tile_loadd (7, bp + (size_t) kb * 2 * TILE + TILE, 64);
            _tile_loadd (4, a0 + (size_t) kb * TILE, la);
            _tile_dpbf16ps (0, 4, 6);
            _tile_dpbf16ps (1, 4, 7);
            if (two) {
              _tile_loadd (5, a1 + (size_t) kb * TILE, la);
              _tile_dpbf16ps (2, 5, 6);
              _tile_dpbf16ps (3, 5, 7);
            }
          }
          if (direct) {
            _tile_stored (0, d0, lc);
            _tile_stored (1, d0 + TN, lc);
            if (two) {
              _tile_stored (2, d1, lc);
              _tile_stored (3, d1 + TN, lc);
            }
            continue;
          }
          _tile_stored (0, cs, le);
          _tile_stored (1, cs + TN, le);
          _tile_stored (2, cs + 16 * PN, le);
          _tile_stored (3, cs + 16 * PN + TN, le);
          for (int i = mb; i < MIN (M, mb + 32); i++) {
            const float *s = cs + (size_t) (i - mb) * PN;
            float *d = C + (size_t) i * ldc + c0;
            if (acc)
              for (int j = 0; j < nc; j++)
                d[j] += s[j];
            else
              memcpy (d, s, (size_t) nc * sizeof (float));
          }
        }
      }
    }
    _tile_release ();
  }
}

/* The column panels over the threads as psm_gemm_packed has them: 4 each
 * at least; inside a parallel region all on the calling thread. */
void
psm_amx_run (int M, int N, int Kp, const uint16_t *a, const uint16_t *wp, const float *bias, gboolean acc, float *C,
             int ldc)
{
  int panels = (N + PN - 1) / PN;
  int nt = omp_in_parallel () ? 1 : MAX (1, MIN (omp_get_max_threads (), panels / 4));
#pragma omp parallel num_threads (nt)
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    amx_panels (M, N, Kp, a, wp, bias, acc, C, ldc, panels * id / team, panels * (id + 1) / team);
  }
}
#endif

/* the calling thread's scratch (bf16-amx.h) */
__thread PsmBf16Scratch psm_bf16_scratch_rows, psm_bf16_scratch_pack, psm_bf16_scratch_x;

void *
psm_bf16_scratch_get (PsmBf16Scratch *s, size_t bytes, const char *what)
{
  if (omp_in_parallel ())
    return psm_xaligned (bytes, what);
  if (s->cap < bytes) {
    free (s->p);
    s->p = psm_xaligned (bytes, what);
    s->cap = bytes;
  }
  return s->p;
}

void
psm_bf16_scratch_put (PsmBf16Scratch *s, void *p)
{
  if (p != s->p)
    free (p);
}

/* C (+)= op(A) W on rounded rows of op(A) and W packed (AMX, else psm's
 * packed kernel on A rounded). */
static void
gemm_bf16_rows (gboolean ta, int M, int N, int K, const float *A, int lda, const void *wp, const float *bias,
                gboolean acc, float *C, int ldc)
{
#ifdef PSM_AMX_CODE
  if (psm_amx_usable ()) {
    int Kp = (K + TK - 1) / TK * TK, Mp = (M + 15) / 16 * 16;
    uint16_t *a = psm_bf16_scratch_get (&psm_bf16_scratch_rows, (size_t) Mp * Kp * sizeof (uint16_t), "bf16 rows");
    psm_bf16_tiles_op (ta, M, K, A, lda, a, Kp / TK, Mp);
    psm_amx_run (M, N, Kp, a, wp, bias, acc, C, ldc);
    psm_bf16_scratch_put (&psm_bf16_scratch_rows, a);
    return;
  }
#endif
  float *ar = psm_xmalloc ((size_t) M * MAX (K, 1) * sizeof (float), "bf16 rows");
  for (int i = 0; i < M; i++)
    for (int k = 0; k < K; k++)
      ar[(size_t) i * K + k] = psm_bf16_round (ta ? A[(size_t) k * lda + i] : A[(size_t) i * lda + k]);
  psm_gemm_packed (M, N, K, ar, K, wp, bias, acc, C, ldc);
  free (ar);
}

void
psm_gemm_bf16 (int M, int N, int K, const float *A, int lda, const void *wp, const float *bias, gboolean acc, float *C,
               int ldc)
{
  g_return_if_fail (!bias || !acc);   /* as psm_gemm_packed: one or the other */
  if (M <= 0 || N <= 0)
    return;
  if (K <= 0) {
    for (int i = 0; i < M && !acc; i++)
      for (int j = 0; j < N; j++)
        C[(size_t) i * ldc + j] = bias ? bias[j] : 0.0f;
    return;
  }
  gemm_bf16_rows (FALSE, M, N, K, A, lda, wp, bias, acc, C, ldc);
}

void
psm_gemm_bf16_op (gboolean ta, gboolean tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                  gboolean acc, float *C, int ldc)
{
  if (M <= 0 || N <= 0)
    return;
  if (K <= 0) {
    for (int i = 0; i < M && !acc; i++)
      memset (C + (size_t) i * ldc, 0, (size_t) N * sizeof (float));
    return;
  }
  void *bp = psm_bf16_scratch_get (&psm_bf16_scratch_pack, psm_bf16_packed_bytes (K, N), "bf16 packing");
  psm_bf16_pack_op (K, N, B, ldb, tb, bp);
  gemm_bf16_rows (ta, M, N, K, A, lda, bp, NULL, acc, C, ldc);
  psm_bf16_scratch_put (&psm_bf16_scratch_pack, bp);
}

/* A recurrence's product split by columns (lstm.c): op(A) = A [M, K]
 * rounded once a step into shared tiles, rows [i0, i1) by each thread
 * (i0 a multiple of 16; the rows past M of the last block zero), then
 * C = A W for the calling thread's share of W's column panels (part of
 * parts). AMX only (psm_amx_usable). */
size_t
psm_bf16_tiles_bytes (int M, int K)
{
  return (size_t) (M + 15) / 16 * 16 * ((K + TK - 1) / TK * TK) * sizeof (uint16_t);
}

void
psm_bf16_tiles_rows (int M, int K, const float *A, int lda, void *tiles, int i0, int i1)
{
  int Kb = (K + TK - 1) / TK, end = i1 >= M ? (M + 15) / 16 * 16 : i1;
  if (i1 <= i0 || end <= i0)
    return;
  g_return_if_fail (i0 % 16 == 0 && end % 16 == 0);
  psm_bf16_tiles_op (FALSE, MAX (0, MIN (M, i1) - i0), K, A + (size_t) i0 * lda, lda,
                 (uint16_t *) tiles + (size_t) (i0 / 16) * Kb * TILE, Kb, end - i0);
}

void
psm_gemm_bf16_tiles (int M, int N, int K, const void *tiles, const void *wp, float *C, int ldc, int part, int parts)
{
#ifdef PSM_AMX_CODE
  int panels = (N + PN - 1) / PN;
  if (M > 0 && N > 0 && K > 0)
    amx_panels (M, N, (K + TK - 1) / TK * TK, tiles, wp, NULL, FALSE, C, ldc, panels * part / parts,
                panels * (part + 1) / parts);
#else
  g_return_if_reached ();
#endif
}
