/* packgemm.c — C = A op(B) for few rows against a B packed once.
 *
 * A recurrence multiplies the same weight matrix by a small batch at every
 * step. BLAS re-packs that matrix on each call; here it is packed once per
 * sequence into panels of PSM_PACK_NR columns (the panel's K rows
 * contiguous, the last panel zero-padded), and a register-blocked kernel
 * streams each panel against MR rows of A at a time (8 x 32 floats with
 * AVX-512, 6 x 16 with AVX, 6 x 8 otherwise; with AVX-512, pairs of whole
 * panels against 6 rows: kernel_rows_wide), written with GCC vector
 * extensions of the target's register width. Each element of C is one dot
 * product in k order, so the result does not depend on how the rows or
 * panels are shared out. Used by gru.c (psm_paths.gru_packed); checked against
 * a plain loop in tests/test-ops.c. One thread on this project's machine
 * (BENCHMARKS.md): 32 x 384 x 256 in 29 us with AVX-512 (-march=native),
 * 60 us with -mavx2 -mfma, 158 us for baseline x86-64 (hence not used
 * there). */
#include "config.h"
#include <string.h>
#include <stdlib.h>
#include <omp.h>
#include "kernels/kernels-internal.h"

typedef float vf __attribute__ ((vector_size (PSM_PACK_VL * 4), aligned (4)));

/* Rows per block: 2 MR accumulators, two B vectors and a broadcast must fit
 * in the register file (32 zmm with AVX-512, 16 registers otherwise). */
#if PSM_PACK_VL == 16
#define MR 8
#else
#define MR 6
#endif

size_t
psm_packed_floats (int K, int n)
{
  return (size_t) psm_pack_panels (n) * K * PSM_PACK_NR;
}

void
psm_pack (int K, int n, const float *B, int ldb, gboolean tb, float *out)
{
  int panels = psm_pack_panels (n);
  for (int p = 0; p < panels; p++) {
    float *dst = out + (size_t) p * K * PSM_PACK_NR;
    int c0 = p * PSM_PACK_NR, nc = MIN (PSM_PACK_NR, n - c0);
    /* k outermost: the panel is written in order */
    for (int k = 0; k < K; k++, dst += PSM_PACK_NR) {
      if (tb)            /* op(B)[k][c] = B[c][k] */
        for (int c = 0; c < nc; c++)
          dst[c] = B[(size_t) (c0 + c) * ldb + k];
      else
        memcpy (dst, B + (size_t) k * ldb + c0, nc * sizeof (float));
      for (int c = nc; c < PSM_PACK_NR; c++)
        dst[c] = 0.0f;
    }
  }
}

/* How a kernel stores its block: nc (<= PSM_PACK_NR) columns of it; added
 * to what C holds (acc), or to the bias, or alone. The dot product is
 * complete before either is added, so C + A B and A B + b round as the
 * separate passes they replace did. */
typedef struct {
  int nc;
  const float *bias;
  gboolean acc;
} Store;

/* c + x b, one rounding: a multiply-add written as the intrinsic wherever
 * the target has FMA, so that every kernel and every instantiation of one
 * rounds the same way. Left to itself GCC decides per loop whether to
 * contract the expression: not at -O1, and with -mtune=znver3 (so
 * -march=native on Zen 3) it keeps some chains of accumulations as a
 * multiply and an add, which is how the partial-panel kernel came to
 * round differently from the full one there (issue 57); with AVX-512 its
 * own contraction also left four register moves an iteration in the wide
 * kernel. A PSM_FORCE_VL width the target's registers do not have goes in
 * 4-float pieces. Without FMA there is nothing to contract: the
 * expression. */
#if defined (__FMA__) || defined (__AVX512F__)
#include <immintrin.h>
static inline __attribute__ ((always_inline)) vf
pack_fma (float x, vf b, vf c)
{
#if PSM_PACK_VL == 16 && defined (__AVX512F__)
  return (vf) _mm512_fmadd_ps (_mm512_set1_ps (x), (__m512) b, (__m512) c);
#elif PSM_PACK_VL == 8 && defined (__FMA__)
  return (vf) _mm256_fmadd_ps (_mm256_set1_ps (x), (__m256) b, (__m256) c);
#else
  vf r;
  for (int l = 0; l < PSM_PACK_VL; l += 4) {
    __m128 bl, cl, rl;
    memcpy (&bl, (const float *) &b + l, sizeof bl);
    memcpy (&cl, (const float *) &c + l, sizeof cl);
    rl = _mm_fmadd_ps (_mm_set1_ps (x), bl, cl);
    memcpy ((float *) &r + l, &rl, sizeof rl);
  }
  return r;
#endif
}
#define PACK_FMA(x, b, c) pack_fma ((x), (b), (c))
#else
#define PACK_FMA(x, b, c) ((c) + (x) * (b))
#endif

/* mr (<= MR) rows of A against one panel (two vectors wide; with half,
 * its first vector only, for st->nc <= PSM_PACK_VL); stores mr x st->nc
 * of C. Row i of A is ar[i] (its K floats in k order) and of
 * C cr[i]; the panel's row for k is kidx[k] (NULL: k), so a product can
 * skip rows of B that only meet zeros (psm_packed_gemm_rows). A
 * compile-time mr keeps the accumulators in registers. */
static inline __attribute__ ((always_inline)) void
kernel_rows (const int mr, const gboolean half, int K, const float *const *ar, const int32_t *kidx, const float *Bp,
             float *const *cr, const Store *st, const float *pf)
{
  vf c0[MR], c1[MR];
  const float *a[MR];
#pragma GCC unroll 8
  for (int i = 0; i < mr; i++) {
    c0[i] = c1[i] = (vf) { 0 };
    a[i] = ar[i];
  }
  for (int k = 0; k < K; k++) {
    const float *bk = Bp + (size_t) (kidx ? kidx[k] : k) * PSM_PACK_NR;
    vf b0 = *(const vf *) bk;
    vf b1 = half ? b0 : *(const vf *) (bk + PSM_PACK_VL);
    /* in registers: left to itself GCC gives the 4-row block (AVX2) FMAs
     * with B as a memory operand, 2 vector loads per FMA, and it ran a
     * third slower than the 5-row block ("v": x86's vector registers;
     * not with PSM_FORCE_VL, whose vectors may not fit one) */
#if (defined (__x86_64__) || defined (__i386__)) && !defined (PSM_FORCE_VL)
    __asm__ ("" : "+v" (b0), "+v" (b1));
#endif
    if (pf)   /* the next panel's row k, on its way while this one is used */
      for (int j = 0; j < PSM_PACK_NR; j += 16)
        __builtin_prefetch (pf + (size_t) k * PSM_PACK_NR + j, 0, 2);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      float x = a[i][k];
      c0[i] = PACK_FMA (x, b0, c0[i]);
      if (!half)
        c1[i] = PACK_FMA (x, b1, c1[i]);
    }
  }
  if (st->nc == PSM_PACK_NR && !half) {
    vf add0 = { 0 }, add1 = { 0 };
    if (st->bias) {
      add0 = *(const vf *) st->bias;
      add1 = *(const vf *) (st->bias + PSM_PACK_VL);
    }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++) {
      vf *d0 = (vf *) cr[i], *d1 = (vf *) (cr[i] + PSM_PACK_VL);
      if (st->acc) {
        *d0 += c0[i];
        *d1 += c1[i];
      } else if (st->bias) {
        *d0 = c0[i] + add0;
        *d1 = c1[i] + add1;
      } else {
        *d0 = c0[i];
        *d1 = c1[i];
      }
    }
    return;
  }
  for (int i = 0; i < mr; i++) {   /* the last, partial panel */
    float row[PSM_PACK_NR], *d = cr[i];
    memcpy (row, &c0[i], sizeof c0[i]);
    if (!half)
      memcpy (row + PSM_PACK_VL, &c1[i], sizeof c1[i]);
    for (int j = 0; j < st->nc; j++)
      d[j] = st->acc ? d[j] + row[j] : st->bias ? row[j] + st->bias[j] : row[j];
  }
}

/* A block of r rows, r known at run time: the kernel compiled for it, on
 * the panel's first vector alone when the block stores no more columns
 * than one holds (a last, partial panel: half the work; the LM's dx
 * products over T = 100 steps, 4 panels of 32, ran 5 % faster). */
static inline __attribute__ ((always_inline)) void
kernel_block (int r, int K, const float *const *ar, const int32_t *kidx, const float *Bp, float *const *cr,
              const Store *st, const float *pf)
{
  gboolean half = st->nc <= PSM_PACK_VL;
  switch (r) {
#define BLOCK(rows) \
  case rows: \
    if (half) \
      kernel_rows (rows, TRUE, K, ar, kidx, Bp, cr, st, pf); \
    else \
      kernel_rows (rows, FALSE, K, ar, kidx, Bp, cr, st, pf); \
    break;
    BLOCK (1) BLOCK (2) BLOCK (3) BLOCK (4) BLOCK (5) BLOCK (6)
#if MR == 8
    BLOCK (7) BLOCK (8)
#endif
#undef BLOCK
  default:
    g_assert_not_reached ();
  }
}

#if PSM_PACK_WIDE
/* The wide kernel: mr (<= MRW) rows against two whole panels side by side
 * (64 columns, four vectors a row). 6 x 4 accumulators, the four B vectors
 * and a broadcast take 29 of AVX-512's 32 registers; against 8 x 2 it loads
 * 10 values for 24 multiply-adds instead of 10 for 16. psm_gemm_packed
 * against psm_linear's BLAS path, 640 rows on two threads of an Intel
 * AVX-512 host (bench-packed K N 1 640, BENCHMARKS.md e): 0.99-1.05 times
 * on the 15k decoder's output layer (K 1,024, N 15,000), where the 8-row
 * kernel had been 5-10 % behind OpenBLAS, and 1.07-1.17 times on the
 * decoder steps' 512 x 2,048 and 1,024 x 512. Each element of C is still one multiply-add chain in
 * k order: the same bits as kernel_rows. pf: the next pair's first panel
 * (its second follows it; a prefetch past the packing's end never
 * faults), prefetched as in kernel_rows. */
#define MRW 6
static inline __attribute__ ((always_inline)) void
kernel_rows_wide (const int mr, int K, const float *const *ar, const float *B0, const float *B1, float *const *cr,
                  const Store *st, const float *pf)
{
  vf c[MRW][4];
  const float *a[MRW];
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++) {
    c[i][0] = c[i][1] = c[i][2] = c[i][3] = (vf) { 0 };
    a[i] = ar[i];
  }
  /* two copies of the loop, with and without the prefetches: a test in it
   * cost GCC four register moves an iteration */
#define WIDE_LOOP(prefetch) \
  for (int k = 0; k < K; k++) { \
    const float *b0k = B0 + (size_t) k * PSM_PACK_NR, *b1k = B1 + (size_t) k * PSM_PACK_NR; \
    vf b0 = *(const vf *) b0k, b1 = *(const vf *) (b0k + PSM_PACK_VL); \
    vf b2 = *(const vf *) b1k, b3 = *(const vf *) (b1k + PSM_PACK_VL); \
    if (prefetch) { \
      __builtin_prefetch (pf + (size_t) k * PSM_PACK_NR, 0, 2); \
      __builtin_prefetch (pf + (size_t) k * PSM_PACK_NR + 16, 0, 2); \
      __builtin_prefetch (pf + (size_t) (K + k) * PSM_PACK_NR, 0, 2); \
      __builtin_prefetch (pf + (size_t) (K + k) * PSM_PACK_NR + 16, 0, 2); \
    } \
    _Pragma ("GCC unroll 6") \
    for (int i = 0; i < mr; i++) { \
      float x = a[i][k]; \
      c[i][0] = PACK_FMA (x, b0, c[i][0]); \
      c[i][1] = PACK_FMA (x, b1, c[i][1]); \
      c[i][2] = PACK_FMA (x, b2, c[i][2]); \
      c[i][3] = PACK_FMA (x, b3, c[i][3]); \
    } \
  }
  if (pf)
    WIDE_LOOP (1)
  else
    WIDE_LOOP (0)
#undef WIDE_LOOP
#pragma GCC unroll 6
  for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
      vf *d = (vf *) (cr[i] + v * PSM_PACK_VL);
      if (st->acc)
        *d += c[i][v];
      else if (st->bias)
        *d = c[i][v] + *(const vf *) (st->bias + v * PSM_PACK_VL);
      else
        *d = c[i][v];
    }
}

/* the full block as a function of its own: inlined into the switch below,
 * GCC's register allocation moved four accumulators an iteration */
static __attribute__ ((noinline)) void
kernel_wide6 (int K, const float *const *ar, const float *B0, const float *B1, float *const *cr, const Store *st,
              const float *pf)
{
  kernel_rows_wide (MRW, K, ar, B0, B1, cr, st, pf);
}

static inline __attribute__ ((always_inline)) void
kernel_block_wide (int r, int K, const float *const *ar, const float *B0, const float *B1, float *const *cr,
                   const Store *st, const float *pf)
{
  switch (r) {
#define BLOCK(rows) \
  case rows: \
    kernel_rows_wide (rows, K, ar, B0, B1, cr, st, pf); \
    break;
    BLOCK (1) BLOCK (2) BLOCK (3) BLOCK (4) BLOCK (5)
#undef BLOCK
  case MRW:
    kernel_wide6 (K, ar, B0, B1, cr, st, pf);
    break;
  default:
    g_assert_not_reached ();
  }
}
#endif

/* Rows in the next block of a product of M rows with i done: MR, but no
 * last block of fewer than 4 after one: its 2 mr chains of FMAs could not
 * cover the FMA latency, so e.g. 8 rows run as 4 + 4, not 6 + 2 (AVX2: 15 %
 * faster). */
static inline int
block_rows (int M, int i)
{
  int left = M - i;
  return left <= MR ? left : left - MR < 4 ? (left + 1) / 2 : MR;
}

#if PSM_PACK_WIDE
/* The same for the wide kernel's blocks of MRW: no last block of fewer
 * than 3 after one. */
static inline int
block_rows_wide (int M, int i)
{
  int left = M - i;
  return left <= MRW ? left : left - MRW < 3 ? (left + 1) / 2 : MRW;
}
#endif

/* M rows of A against the panels holding columns [0, n), stored as st says
 * (st->nc is set per panel). A packing larger than PSM_PACK_PREFETCH_BYTES
 * is streamed from beyond L2 at every product, so a panel's first block of
 * rows prefetches the next panel into L2 as it goes (one panel ahead: the
 * hardware prefetchers start on each panel only when it is read). Below it
 * the prefetches only cost issue slots (0-5 % slower on the 1 MB packings
 * of See's recurrences); above it, 60 rows against a 1,024 x 7,504 packing
 * ran 11-22 % faster and 15k-word beam search 10-13 % (BENCHMARKS.md e, an
 * Intel AVX-512 host). */
static void
packed_gemm (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc, Store st, gboolean pad)
{
  int panels = psm_pack_panels (n);
  const float *bias = st.bias;
  gboolean pf = psm_packed_floats (K, n) * sizeof (float) > PSM_PACK_PREFETCH_BYTES;
  for (int p = 0; p < panels; p++) {
    const float *bp = Bp + (size_t) p * K * PSM_PACK_NR;
    float *cp = C + p * PSM_PACK_NR;
#if PSM_PACK_WIDE
    if (p + 1 < panels && (pad || (p + 2) * PSM_PACK_NR <= n) && M >= PSM_PACK_WIDE_ROWS) {   /* two whole panels */
      st.nc = 2 * PSM_PACK_NR;
      st.bias = bias ? bias + p * PSM_PACK_NR : NULL;
      const float *next = pf && p + 2 < panels ? bp + (size_t) 2 * K * PSM_PACK_NR : NULL;
      for (int i = 0; i < M;) {
        int r = block_rows_wide (M, i);
        const float *a[MRW];
        float *c[MRW];
        for (int j = 0; j < r; j++) {
          a[j] = A + (size_t) (i + j) * lda;
          c[j] = cp + (size_t) (i + j) * ldc;
        }
        kernel_block_wide (r, K, a, bp, bp + (size_t) K * PSM_PACK_NR, c, &st, i == 0 ? next : NULL);
        i += r;
      }
      p++;
      continue;
    }
#endif
    st.nc = pad ? PSM_PACK_NR : MIN (PSM_PACK_NR, n - p * PSM_PACK_NR);
    st.bias = bias ? bias + p * PSM_PACK_NR : NULL;
    for (int i = 0; i < M;) {
      int r = block_rows (M, i);
      const float *a[MR];
      float *c[MR];
      for (int j = 0; j < r; j++) {
        a[j] = A + (size_t) (i + j) * lda;
        c[j] = cp + (size_t) (i + j) * ldc;
      }
      kernel_block (r, K, a, NULL, bp, c, &st, pf && i == 0 && p + 1 < panels ? bp + (size_t) K * PSM_PACK_NR : NULL);
      i += r;
    }
  }
}

void
psm_packed_gemm (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc)
{
  packed_gemm (M, K, n, A, lda, Bp, C, ldc, (Store) { PSM_PACK_NR, NULL, FALSE }, TRUE);
}

void
psm_packed_gemm_store (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc,
                       const float *bias, gboolean acc)
{
  packed_gemm (M, K, n, A, lda, Bp, C, ldc, (Store) { PSM_PACK_NR, bias, acc }, FALSE);
}

/* A panel's rows kidx[0..K) copied together into dst (K x PSM_PACK_NR),
 * the same rows of the panel at next (NULL: none) prefetched meanwhile. */
static void
copy_panel_rows (int K, const int32_t *kidx, const float *src, const float *next, float *dst)
{
  for (int k = 0; k < K; k++) {
    size_t kr = (size_t) kidx[k] * PSM_PACK_NR;
    if (next)
      for (int j = 0; j < PSM_PACK_NR; j += 16)
        __builtin_prefetch (next + kr + j);
    *(vf *) (dst + (size_t) k * PSM_PACK_NR) = *(const vf *) (src + kr);
    *(vf *) (dst + (size_t) k * PSM_PACK_NR + PSM_PACK_VL) = *(const vf *) (src + kr + PSM_PACK_VL);
  }
}

void
psm_packed_gemm_rows (int M, int K, int n, int p0, int p1, const float *const *ar, const int32_t *kidx,
                      const float *Bp, size_t pstride, float *const *cr, const float *bias, gboolean acc)
{
  /* Rows read by index: a panel's rows are first copied together (the
   * blocks then run the plain kernel on K contiguous rows, in L1: read in
   * place, the rows between them came in too and a block of 6 ran about a
   * fifth slower), the next panel's prefetched meanwhile. With AVX-512,
   * two whole panels at a time on the wide kernel, as packed_gemm does (the
   * same bits: one chain of multiply-adds in k order an element either
   * way): rows read in place (dropout_linear's backward, blocks of 12) at
   * any count, rows by index from PSM_PACK_WIDE_ROWS. The LM's softmax
   * layer on the kept half of its units (32 classes of 100 rows, K 650, N
   * 10,000; a throwaway harness, 2 threads): its forward 98.7 -> 88-91
   * ms; ptb_lstm's update 811 -> 771 ms, medians of five alternating
   * rounds (BENCHMARKS.md d). */
  float *rows = kidx && M > MR ? psm_xaligned (MAX ((size_t) K, 1) * 2 * PSM_PACK_NR * sizeof (float), "packed rows")
                               : NULL;
  for (int p = p0; p < p1; p++) {
    const float *bp = Bp + (size_t) (p - p0) * pstride;
    const int32_t *kx = kidx;
#if PSM_PACK_WIDE
    if ((rows ? M >= PSM_PACK_WIDE_ROWS : !kidx) && p + 1 < p1 && (p + 2) * PSM_PACK_NR <= n) {
      /* the next pair's panels prefetched while copying this pair's rows
       * (a prefetch past the packing's end does not fault) */
      const float *b0 = bp, *b1 = bp + pstride;
      if (rows) {
        const float *next = p + 2 < p1 ? bp + 2 * pstride : NULL;
        float *r1 = rows + (size_t) K * PSM_PACK_NR;
        copy_panel_rows (K, kidx, bp, next, rows);
        copy_panel_rows (K, kidx, bp + pstride, next ? next + pstride : NULL, r1);
        b0 = rows;
        b1 = r1;
      }
      Store st = { 2 * PSM_PACK_NR, bias ? bias + p * PSM_PACK_NR : NULL, acc };
      for (int i = 0; i < M;) {
        int r = block_rows_wide (M, i);
        float *c[MRW];
        for (int j = 0; j < r; j++)
          c[j] = cr[i + j] + p * PSM_PACK_NR;
        kernel_block_wide (r, K, ar + i, b0, b1, c, &st, NULL);
        i += r;
      }
      p++;
      continue;
    }
#endif
    if (rows) {
      copy_panel_rows (K, kidx, bp, p + 1 < p1 ? bp + pstride : NULL, rows);
      bp = rows;
      kx = NULL;
    }
    Store st = { MIN (PSM_PACK_NR, n - p * PSM_PACK_NR), bias ? bias + p * PSM_PACK_NR : NULL, acc };
    for (int i = 0; i < M;) {
      int r = block_rows (M, i);
      float *c[MR];
      for (int j = 0; j < r; j++)
        c[j] = cr[i + j] + p * PSM_PACK_NR;
      kernel_block (r, K, ar + i, kx, bp, c, &st, NULL);
      i += r;
    }
  }
  free (rows);
}

/* ---- helpers of the whole-sequence recurrences (gru.c, lstm.c) ---- */

int
psm_pack_threads (int B)
{
  return omp_in_parallel () ? 1 : MIN (omp_get_max_threads (), B);
}

/* Rows [*b0, *b1) of thread id: blocks of 8 rows where there are enough. */
void
psm_pack_row_split (int B, int nth, int id, int *b0, int *b1)
{
  int align = B >= 8 * nth ? 8 : 1;
  *b0 = id ? (int) ((long) B * id / nth) / align * align : 0;
  *b1 = id == nth - 1 ? B : (int) ((long) B * (id + 1) / nth) / align * align;
}

/* The rows of [b0, b1) with mask 1 at step t of x [., B, n] gathered into
 * xc [., n] (the GEMMs of a step run on the real rows only: a padded row
 * carries its state). Returns how many, and where to read them: x's own
 * rows when all are real (or mask is NULL), else xc. */
int
psm_pack_real_rows (const float *mask, int t, int B, int b0, int b1, const float *x, int n, float *xc,
                    const float **from)
{
  *from = x + (size_t) b0 * n;
  if (!mask)
    return b1 - b0;
  int r = 0;
  for (int b = b0; b < b1; b++)
    if (mask[(size_t) t * B + b] != 0.0f)
      r++;
  if (r == b1 - b0)
    return r;
  r = 0;
  for (int b = b0; b < b1; b++)
    if (mask[(size_t) t * B + b] != 0.0f)
      memcpy (xc + (size_t) r++ * n, x + (size_t) b * n, n * sizeof (float));
  *from = xc;
  return r;
}

/* The reverse for a sum: row r of C (row stride ldc) added to the r-th
 * real row of [b0, b1) at step t of dst [., B, n]. */
void
psm_pack_real_rows_add (const float *mask, int t, int B, int b0, int b1, const float *C, int ldc, int n,
                        float *dst)
{
  for (int b = b0, r = 0; b < b1; b++) {
    if (mask && mask[(size_t) t * B + b] == 0.0f)
      continue;
    float *d = dst + (size_t) b * n;
    const float *c = C + (size_t) r++ * ldc;
#pragma omp simd
    for (int j = 0; j < n; j++)
      d[j] += c[j];
  }
}

/* The recurrent GEMMs of a cell's backward pass (gru.c, lstm.c) on the
 * rows real under mask [B] (NULL: all; a padded row's dG is 0): dh += dG
 * W^T (on W^T packed when wpt is given) and dw += h^T dG, for dG [B, N]
 * and W [H, N]; dh and dw may be NULL. */
void
psm_cell_recurrent_backward (int B, int H, int N, const float *mask, const float *dG, const float *h,
                             const float *w, const float *wpt, float *dh, float *dw)
{
  float *dGc = mask ? psm_xmalloc ((size_t) B * N * sizeof (float), "cell gradients") : NULL;
  float *hc = mask ? psm_xmalloc ((size_t) B * H * sizeof (float), "cell gradients") : NULL;
  const float *din, *hin;
  int R = psm_pack_real_rows (mask, 0, B, 0, B, dG, N, dGc, &din);
  /* dh through a compact C when rows were left out */
  float *C = dh && R < B ? psm_xmalloc0 ((size_t) MAX (R, 1) * H * sizeof (float), "cell gradients") : NULL;
  float *d = C ? C : dh;
  if (dh && R && wpt)
    psm_gemm_packed (R, H, N, din, N, wpt, NULL, TRUE, d, H);
  else if (dh && R)
    psm_gemm (FALSE, TRUE, R, H, N, 1.0f, din, N, w, N, 1.0f, d, H);
  if (C)
    psm_pack_real_rows_add (mask, 0, B, 0, B, C, H, H, dh);
  psm_pack_real_rows (mask, 0, B, 0, B, h, H, hc, &hin);
  if (dw && R)
    psm_gemm (TRUE, FALSE, H, N, R, 1.0f, hin, H, din, N, 1.0f, dw, N);
  free (C);
  free (hc);
  free (dGc);
}

/* Packs op(W) (K x n) into wp with the threads of the enclosing region. */
void
psm_pack_shared (int K, int n, const float *w, int ldw, gboolean tb, float *wp)
{
  int nth = omp_get_num_threads (), id = omp_get_thread_num ();
  int panels = psm_pack_panels (n);
  int p0 = panels * id / nth, p1 = panels * (id + 1) / nth;
  int c0 = p0 * PSM_PACK_NR, c1 = MIN (n, p1 * PSM_PACK_NR);
  if (c1 > c0)
    psm_pack (K, c1 - c0, tb ? w + (size_t) c0 * ldw : w + c0, ldw, tb,
              wp + (size_t) p0 * K * PSM_PACK_NR);
#pragma omp barrier
}
