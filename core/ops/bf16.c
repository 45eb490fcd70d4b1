/* bf16.c — decoding's linear products in bfloat16 (decode.precision).
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
 * kernel: the same products, summed in another order, and no faster. Only
 * the decoding graph uses this (psm_graph_set_bf16), never training: a
 * gradient through rounded weights would be another model.
 *
 * AMX layout of a packed W (K x n): panels of 32 columns, each Kb = ceil
 * (K / 32) blocks of 32 k, each block two tiles of 16 columns; a tile's row
 * r holds, for each of its 16 columns c, W[32 kb + 2 r][c] and W[32 kb + 2
 * r + 1][c] side by side (the pairs TDPBF16PS multiplies with a row's
 * pairs of x). K and n are zero-padded to whole tiles. */
#include "config.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "psm-private.h"

#if defined (__x86_64__) && defined (__GNUC__) && (__GNUC__ >= 11 || defined (__clang__))
#define PSM_AMX_CODE 1
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
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
   * so that a loop over it is vectorised (bf16_rows). */
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1)) >> 16, q = (u >> 16) | 0x40;
  return (uint16_t) ((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* x's rows rounded to bfloat16 into a [Mp, Kp] (zero-padded), in vectors,
 * the rows over the threads when there are many. */
static void
bf16_rows (int M, int K, const float *A, int lda, uint16_t *a, int Kp, int Mp)
{
#pragma omp parallel for if ((long) M * K >= (1L << 16) && !omp_in_parallel ()) schedule (static)
  for (int i = 0; i < Mp; i++) {
    uint16_t *o = a + (size_t) i * Kp;
    if (i >= M) {
      memset (o, 0, (size_t) Kp * sizeof (uint16_t));
      continue;
    }
    const float *x = A + (size_t) i * lda;
#pragma omp simd
    for (int k = 0; k < K; k++)
      o[k] = bf16_bits (x[k]);
    for (int k = K; k < Kp; k++)
      o[k] = 0;
  }
}

float
psm_bf16_round (float f)
{
  uint32_t u = (uint32_t) bf16_bits (f) << 16;
  float r;
  memcpy (&r, &u, sizeof r);
  return r;
}

static gboolean amx_ok;
gboolean psm_bf16_amx = TRUE;

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
  return amx_ok && psm_bf16_amx;
}

size_t
psm_bf16_packed_bytes (int K, int n)
{
  if (psm_amx_usable ())
    return (size_t) ((n + PN - 1) / PN) * ((K + TK - 1) / TK) * 2 * TILE * sizeof (uint16_t);
  return psm_packed_floats (K, n) * sizeof (float);
}

void
psm_bf16_pack (int K, int n, const float *w, void *out)
{
  if (!psm_amx_usable ()) {   /* psm's single-precision panels of the rounded W */
    float *o = out;
    psm_pack (K, n, w, n, FALSE, o);
    size_t m = psm_packed_floats (K, n);
#pragma omp parallel for if (m >= (1u << 20) && !omp_in_parallel ()) schedule (static)
    for (size_t i = 0; i < m; i++)
      o[i] = psm_bf16_round (o[i]);
    return;
  }
  int Kb = (K + TK - 1) / TK, panels = (n + PN - 1) / PN;
  uint16_t *o = out;
#pragma omp parallel for if ((long) K * n >= (1L << 20) && !omp_in_parallel ()) schedule (static)
  for (int p = 0; p < panels; p++)
    for (int kb = 0; kb < Kb; kb++)
      for (int h = 0; h < 2; h++) {
        uint16_t *t = o + (((size_t) p * Kb + kb) * 2 + h) * TILE;
        for (int r = 0; r < TK / 2; r++)
          for (int c = 0; c < TN; c++) {
            int col = p * PN + h * TN + c;
            for (int j = 0; j < 2; j++) {
              int k = kb * TK + 2 * r + j;
              t[r * 2 * TN + 2 * c + j] = k < K && col < n ? bf16_bits (w[(size_t) k * n + col]) : 0;
            }
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

__attribute__ ((target ("amx-tile,amx-bf16"))) static void
amx_gemm (int M, int N, int K, const float *A, int lda, const uint16_t *wp, const float *bias, gboolean acc, float *C,
          int ldc)
{
  int Kb = (K + TK - 1) / TK, Kp = Kb * TK, Mp = (M + 15) / 16 * 16, panels = (N + PN - 1) / PN;
  uint16_t *a = psm_xaligned ((size_t) Mp * Kp * sizeof (uint16_t), "bf16 rows");
  bf16_rows (M, K, A, lda, a, Kp, Mp);
  /* the threads as psm_gemm_packed has them: 4 panels each at least */
  int nt = omp_in_parallel () ? 1 : MAX (1, MIN (omp_get_max_threads (), panels / 4));
#pragma omp parallel num_threads (nt)
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    TileCfg cfg;
    memset (&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
      cfg.colsb[t] = 64;
      cfg.rows[t] = 16;
    }
    _tile_loadconfig (&cfg);
    float cs[32 * PN] __attribute__ ((aligned (64)));
    for (int p = p0; p < p1; p++) {
      const uint16_t *bp = wp + (size_t) p * Kb * 2 * TILE;
      int c0 = p * PN, nc = MIN (PN, N - c0);
      for (int mb = 0; mb < Mp; mb += 32) {
        gboolean two = mb + 16 < Mp;
        const uint16_t *a0 = a + (size_t) mb * Kp, *a1 = a0 + (size_t) 16 * Kp;
        _tile_zero (0);
        _tile_zero (1);
        _tile_zero (2);
        _tile_zero (3);
        for (int kb = 0; kb < Kb; kb++) {
          _tile_loadd (6, bp + (size_t) kb * 2 * TILE, 64);
          _tile_loadd (7, bp + (size_t) kb * 2 * TILE + TILE, 64);
          _tile_loadd (4, a0 + kb * TK, Kp * sizeof (uint16_t));
          _tile_dpbf16ps (0, 4, 6);
          _tile_dpbf16ps (1, 4, 7);
          if (two) {
            _tile_loadd (5, a1 + kb * TK, Kp * sizeof (uint16_t));
            _tile_dpbf16ps (2, 5, 6);
            _tile_dpbf16ps (3, 5, 7);
          }
        }
        _tile_stored (0, cs, PN * sizeof (float));
        _tile_stored (1, cs + TN, PN * sizeof (float));
        _tile_stored (2, cs + 16 * PN, PN * sizeof (float));
        _tile_stored (3, cs + 16 * PN + TN, PN * sizeof (float));
        for (int i = mb; i < MIN (M, mb + 32); i++) {
          const float *s = cs + (size_t) (i - mb) * PN;
          float *d = C + (size_t) i * ldc + c0;
          if (acc)
            for (int j = 0; j < nc; j++)
              d[j] += s[j];
          else
            for (int j = 0; j < nc; j++)
              d[j] = bias ? s[j] + bias[c0 + j] : s[j];
        }
      }
    }
    _tile_release ();
  }
  free (a);
}
#endif

void
psm_gemm_bf16 (int M, int N, int K, const float *A, int lda, const void *wp, const float *bias, gboolean acc, float *C,
               int ldc)
{
  g_return_if_fail (!bias || !acc);   /* as psm_gemm_packed: one or the other */
  if (M <= 0 || N <= 0)
    return;
#ifdef PSM_AMX_CODE
  if (psm_amx_usable ()) {
    amx_gemm (M, N, K, A, lda, wp, bias, acc, C, ldc);
    return;
  }
#endif
  float *ar = psm_xmalloc ((size_t) M * MAX (K, 1) * sizeof (float), "bf16 rows");
  for (int i = 0; i < M; i++)
    for (int k = 0; k < K; k++)
      ar[(size_t) i * K + k] = psm_bf16_round (A[(size_t) i * lda + k]);
  psm_gemm_packed (M, N, K, ar, K, wp, bias, acc, C, ldc);
  free (ar);
}
