/* kernels-internal.h — the dense kernels (core/kernels/): psm_gemm over
 * BLAS, the packed few-row GEMMs, bfloat16 packing and products, the
 * vector helpers. They take pointers and sizes and know nothing of the
 * graph. */
#ifndef PSM_KERNELS_INTERNAL_H
#define PSM_KERNELS_INTERNAL_H
#include "base/base-internal.h"

/* GEMM wrapper: C[M,N] = alpha op(A) op(B) + beta C, row-major. */
void psm_gemm (gboolean ta, gboolean tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* out[C] += sum over the R rows of x[R, C] (bias gradients). */
void psm_colsum_add (int R, int C, const float *x, float *out);

static inline float psm_sigmoidf (float x) { return 1.0f / (1.0f + expf (-x)); }

/* a . b, vectorised (the ops' dot product over a row). */
static inline float
psm_dotf (const float *a, const float *b, int n)
{
  float s = 0.0f;
#pragma omp simd reduction (+:s)
  for (int j = 0; j < n; j++)
    s += a[j] * b[j];
  return s;
}

/* Few-row GEMM against a matrix packed once (packgemm.c).
 * psm_pack packs columns [0, n) of op(B) (K x n, op = transpose when tb; to
 * start at column c, pass B + c, or B + c * ldb when tb) into
 * psm_packed_floats (K, n) floats; psm_packed_gemm then sets
 * C[M, 0..n) = A[M, K] op(B) and writes zeros up to the next multiple of
 * PSM_PACK_NR columns, so ldc must leave room for them. Panel p of a packing
 * starts at float p * K * PSM_PACK_NR, so threads can pack panels apart. */
#if defined (PSM_FORCE_VL)
/* a width other than the target's registers' (e.g. -DPSM_FORCE_VL=16 on an
 * AVX2 machine): the layouts and loops of an AVX-512 build, in vectors GCC
 * splits, so that its tests can run on a CPU without AVX-512 */
#define PSM_PACK_VL PSM_FORCE_VL
#elif defined (__AVX512F__)
#define PSM_PACK_VL 16   /* floats per vector register */
#elif defined (__AVX__)
#define PSM_PACK_VL 8
#else
#define PSM_PACK_VL 4
#endif
#define PSM_PACK_NR (2 * PSM_PACK_VL)
/* Whether it beats BLAS: where the build targets vector FMA (e.g.
 * -march=native on a current x86-64); a baseline build keeps BLAS, whose
 * kernels are chosen at run time. */
#if defined (__AVX512F__) || (defined (__AVX2__) && defined (__FMA__))
#define PSM_PACK_FAST 1
#else
#define PSM_PACK_FAST 0
#endif
/* The wide kernel (packgemm.c): with AVX-512 registers, 6 rows against two
 * panels at a time, for products of PSM_PACK_WIDE_ROWS rows or more (a
 * thread's 16 rows of the LM's recurrence, against a 6.8 MB packing, ran
 * 5-10 % slower on it than on the 8-row kernel, 60 rows 5-7 % faster:
 * bench-packed 650 2600); and then also the decoding graphs' products of
 * more than PSM_PACKED_MAX_ROWS rows take the packed path
 * (the weight plan, tape-internal.h). psm_packed_gemm_rows has its own rule: rows read
 * by index from PSM_PACK_WIDE_ROWS, rows read in place at any count
 * (dropout_linear's backward blocks of 12; packgemm.c says why). */
#if PSM_PACK_VL == 16 && PSM_PACK_FAST
#define PSM_PACK_WIDE 1
#else
#define PSM_PACK_WIDE 0
#endif
#define PSM_PACK_WIDE_ROWS 48

/* Panels holding n columns; n padded to them is psm_pack_panels (n) * PSM_PACK_NR. */
static inline int psm_pack_panels (int n) { return (n + PSM_PACK_NR - 1) / PSM_PACK_NR; }
size_t psm_packed_floats (int K, int n);
/* Packings of more bytes than this are streamed from beyond L2, and the
 * kernel prefetches the next panel as it goes (packgemm.c says why). */
#define PSM_PACK_PREFETCH_BYTES ((size_t) 1 << 20)
void psm_pack (int K, int n, const float *B, int ldb, gboolean tb, float *out);
void psm_packed_gemm (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc);
/* The same storing exactly columns [0, n) of C: A op(B) + bias (bias NULL:
 * none), or C += A op(B) with acc. */
void psm_packed_gemm_store (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc,
                            const float *bias, gboolean acc);
/* The general form, on one thread: row i < M of C is cr[i] and of A ar[i]
 * (K floats); the k-th float of a row of A meets row kidx[k] of the
 * packing (NULL: row k), so a product can skip the rows that only meet
 * zeros. Panels [p0, p1) of columns, panel p at Bp + (p - p0) pstride;
 * stores columns [p PSM_PACK_NR, min (n, (p + 1) PSM_PACK_NR)) of each
 * row of C: A op(B) + bias (bias [n] or NULL), or C += A op(B) with acc. */
void psm_packed_gemm_rows (int M, int K, int n, int p0, int p1, const float *const *ar, const int32_t *kidx,
                           const float *Bp, size_t pstride, float *const *cr, const float *bias, gboolean acc);
/* Whole-sequence recurrences on packed weights (gru.c, lstm.c): the threads
 * to use for B independent rows, the rows [*b0, *b1) of thread id, and
 * op(W) (K x n) packed into wp by the threads of the enclosing region (with
 * a barrier). */
int psm_pack_threads (int B);
void psm_pack_row_split (int B, int nth, int id, int *b0, int *b1);
void psm_pack_shared (int K, int n, const float *w, int ldw, gboolean tb, float *wp);
/* The rows of [b0, b1) real at step t of mask [T, B] (NULL: all), of x
 * [., B, n], gathered into xc: how many, and where to read them. */
int psm_pack_real_rows (const float *mask, int t, int B, int b0, int b1, const float *x, int n, float *xc,
                        const float **from);
/* And back for a sum: row r of C [., ldc] added to the r-th real row of
 * [b0, b1) at step t of dst [., B, n]. */
void psm_pack_real_rows_add (const float *mask, int t, int B, int b0, int b1, const float *C, int ldc, int n,
                             float *dst);
/* A cell's recurrent GEMMs backward on its real rows: dh += dG W^T (wpt:
 * W^T packed, or NULL), dw += h^T dG; dG [B, N], W [H, N]. */
void psm_cell_recurrent_backward (int B, int H, int N, const float *mask, const float *dG, const float *h,
                                  const float *w, const float *wpt, float *dh, float *dw);

/* bf16.c: x rounded to bfloat16 (to nearest, ties to even); whether
 * the AMX tiles are there and granted (not with PSM_NO_AMX=1); the bytes
 * of W (K x n) packed by psm_bf16_pack (AMX tile pairs, or else psm's
 * single-precision panels of the rounded W); and C[M, N] = bf16 (A) W + bias
 * (bias NULL: none), or C += bf16 (A) W with acc (no bias then), on that
 * packing, summed in single precision. Inside a parallel region it runs on
 * the calling thread alone (a recurrence's rows apart over the threads). */
float psm_bf16_round (float x);
void psm_bf16_round_bits (size_t n, const float *x, uint16_t *out);   /* the bits of n of them */
gboolean psm_amx_usable (void);
size_t psm_bf16_packed_bytes (int K, int n);
void psm_bf16_pack (int K, int n, const float *w, void *out);
void psm_gemm_bf16 (int M, int N, int K, const float *A, int lda, const void *wp, const float *bias, gboolean acc,
                    float *C, int ldc);
/* The same packing of op(W) (K x n: W[k][c] at w[k ldw + c], or w[c ldw +
 * k] with tb); and C[M, N] (+ with acc)= op(A) op(B), both rounded to
 * bfloat16 (op(A) M x K: A[i][k] at A[i lda + k], or A[k lda + i] with ta),
 * B packed for the call: train.precision's backward products (dW = x^T dy
 * among them). */
void psm_bf16_pack_op (int K, int n, const float *w, int ldw, gboolean tb, void *out);
void psm_gemm_bf16_op (gboolean ta, gboolean tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       gboolean acc, float *C, int ldc);
/* The backward of y = x W + b (x [R, K], W [K, N]) in bfloat16: dx += dy
 * W^T on W^T packed (wtp: psm_bf16_pack_op of W^T), dW += x^T dy and db
 * += the column sums of dy (single precision), dy read once for all three
 * on AMX (dx, dw or db NULL: not that one). */
void psm_linear_bf16_grads (int R, int K, int N, const float *x, const float *dy, const void *wtp, float *dx, float *dw,
                            float *db);
/* The same with dy the gradient of the scores z [R, N] under log softmax
 * picks (psm_linear_pick_log_softmax): dy[i] = d_i (e_{t_i} - exp (z_i -
 * lse_i)), zero where t_i < 0; on AMX made as it is rounded, never stored. */
void psm_linear_bf16_pick_grads (int R, int K, int N, const float *x, const float *z, const float *lse, const int32_t *t,
                                 const float *d, const void *wtp, float *dx, float *dw, float *db);
/* A recurrence's step split by W's columns over a team (lstm.c, AMX
 * only): the bytes of A [M, K] rounded into tiles; its rows [i0, i1)
 * rounded by the calling thread (i0 a multiple of 16); C = A W for the
 * calling thread's part of W's column panels (part of parts). */
size_t psm_bf16_tiles_bytes (int M, int K);
void psm_bf16_tiles_rows (int M, int K, const float *A, int lda, void *tiles, int i0, int i1);
void psm_gemm_bf16_tiles (int M, int N, int K, const void *tiles, const void *wp, float *C, int ldc, int part, int parts);

/* C[M, N] = A[M, K] op(W) + bias (bias NULL: none), or C += A op(W) with
 * acc; op(W) packed by psm_graph_packed; the column panels split over the
 * threads, each storing straight into C. */
void psm_gemm_packed (int M, int N, int K, const float *A, int lda, const float *wp, const float *bias, gboolean acc,
                      float *C, int ldc);
/* The rows up to which a GEMM uses packed weights when it can (in a graph
 * without gradients, where the wide kernel is built, any number:
 * the weight plan of tape-internal.h). */
#define PSM_PACKED_MAX_ROWS 64
/* The switches that choose between paths giving the same results (to
 * rounding), in one place: each on by default where its path is the
 * faster, and turned both ways by the tests to compare the paths and to
 * check each one's gradient in any build. Set before the graph that uses
 * them is built (bf16_amx: before packing).
 *   bf16_amx        AMX tiles for bfloat16 products where granted (bf16.c)
 *   defer_weights   a decoder's per-step weight gradients summed once
 *                   after all the steps (ops: notes.c, matmul.c, lstm.c)
 *   dropout_linear  x W skipping a locked dropout's zeros (linear-dropout.c;
 *                   default PSM_PACK_FAST: a baseline build keeps BLAS)
 *   gru_packed      psm_gru_seq on packed weights, else one psm_gemm a step
 *                   (gru.c; default PSM_PACK_FAST)
 *   lstm_cols       psm_lstm_seq with few rows a thread splits each step's
 *                   product by W's columns, not by rows (lstm-seq.c)
 *   beam_floor      the beam search skips scores below a float floor
 *   beam_skip_rows  the beam search asks only for the rows still live
 *                   (model/psm-decode.c) */
typedef struct {
  gboolean bf16_amx, defer_weights, dropout_linear, gru_packed, lstm_cols, beam_floor, beam_skip_rows;
} PsmPaths;
extern PsmPaths psm_paths;
#endif
