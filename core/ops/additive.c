/* additive.c — fused additive attention (Bahdanau et al.; See et al. with
 * coverage): energies, softmax and context in one op, its backward, and
 * the vector loops they run on. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"
#if defined (__SSE__)
#include <immintrin.h>
#endif

/* ---- Fused additive attention (Bahdanau et al.; See et al. with coverage).
 *
 * Forward, for each example b and source position i with mask[i, b] = 1:
 *   z[i, b] = tanh(K[i, b] + q[b] + w_c cov[b, i])         (K = W_h h_i once
 *   e[b, i] = v . z[i, b]                                    per article, q =
 *   a[b]    = softmax over the unmasked i of e[b]            W_s s_t + b_attn)
 *   c[b]    = sum_i a[b, i] h[i, b]
 * Masked positions get a = 0; a row with no real position gets a = 0, c = 0.
 * Backward, given da (the attention's own gradient) and dc:
 *   da'[b, i] = da[b, i] + dc[b] . h[i, b]
 *   de[b, i]  = a[b, i] (da'[b, i] - sum_j a[b, j] da'[b, j])
 *   dpre      = de[b, i] v (1 - z^2)        (z recomputed: nothing [T, B, A]
 *   dK[i, b] += dpre    dq[b] += dpre        is kept between the passes)
 *   dv += de z   dw_c += dpre cov[b, i]   dcov[b, i] += dpre . w_c
 *   dh[i, b] += a[b, i] dc[b]
 * Each pass reads the annotations once per step. Rows run in parallel; dv and
 * dw_c are summed per row and then over rows in order, so the result does not
 * depend on the thread count. Output: one flat tensor holding a [R, T] then
 * c [R, H]; psm_additive_attention hands back both as views. The query may
 * have R <= B rows (ABI 1.12): they are the keys' and values' first R rows
 * (a teacher-forced step on the rows whose targets have not ended). */

typedef struct {
  float *mask;   /* [T, B] copy, or NULL */
  PsmDeferredValues *defer;   /* the values' gradient is deferred (NULL: added here) */
  /* Where the keys and values are read and their gradients added: the
   * tensors themselves ([T, B, C]: position stride B C, row stride C) or
   * their batch-major copies (psm_attention_batch_major: [B, T, C],
   * position stride C, row stride T C). dK / dH NULL: no gradient. */
  const float *K, *H;
  float *dK, *dH;
  size_t kps, krs, hps, hrs;
  /* train.precision bf16: the batch-major copies rounded to bfloat16, read
   * instead of K and H (the same strides), or NULL */
  const uint16_t *K16, *H16;
} AddAttnSaved;

#define AA_BLOCK 4   /* source positions per pass of the backward (attn_backward_block) */

/* The loops over the A features in vectors of AV floats, written out: GCC
 * vectorised psm_fast_tanhf's clamp as compares and blends on the result
 * (six of the loop's 27 instructions, on the multiply-add pipes), where one
 * max and one min do. Lane by lane the arithmetic is psm_fast_tanhf's; the
 * features past the last whole vector take the scalar loop. */
#define AV PSM_PACK_VL
typedef float av __attribute__ ((vector_size (AV * 4), aligned (4)));

static inline av
av_load (const float *p)
{
  return *(const av *) p;
}

static inline void
av_store (float *p, av x)
{
  *(av *) p = x;
}

static inline av
av_clamp9 (av x)
{
#if AV == 16 && defined (__AVX512F__)
  return (av) _mm512_min_ps (_mm512_max_ps ((__m512) x, _mm512_set1_ps (-9.0f)), _mm512_set1_ps (9.0f));
#elif AV == 8 && defined (__AVX__)
  return (av) _mm256_min_ps (_mm256_max_ps ((__m256) x, _mm256_set1_ps (-9.0f)), _mm256_set1_ps (9.0f));
#elif AV == 4 && defined (__SSE__)
  return (av) _mm_min_ps (_mm_max_ps ((__m128) x, _mm_set1_ps (-9.0f)), _mm_set1_ps (9.0f));
#else
  for (int l = 0; l < AV; l++)
    x[l] = x[l] < -9.0f ? -9.0f : x[l] > 9.0f ? 9.0f : x[l];
  return x;
#endif
}

/* psm_fast_tanhf (fastmath.h) on AV lanes */
static inline av
av_tanh (av x)
{
  return PSM_TANH_RATIONAL (av, av_clamp9 (x));
}

/* a float from a bfloat16 value; AV floats from AV of them */
static inline float
bf16_float (uint16_t b)
{
  uint32_t u = (uint32_t) b << 16;
  float f;
  memcpy (&f, &u, sizeof f);
  return f;
}

static inline av
av_load16 (const uint16_t *p)
{
#if AV == 16 && defined (__AVX512F__)
  return (av) _mm512_castsi512_ps (_mm512_slli_epi32 (_mm512_cvtepu16_epi32 (_mm256_loadu_si256 ((const __m256i *) p)), 16));
#elif AV == 8 && defined (__AVX2__)
  return (av) _mm256_castsi256_ps (_mm256_slli_epi32 (_mm256_cvtepu16_epi32 (_mm_loadu_si128 ((const __m128i *) p)), 16));
#else
  av x = { 0 };
  for (int l = 0; l < AV; l++)
    x[l] = bf16_float (p[l]);
  return x;
#endif
}

/* element j of a row of keys or values, single precision or (b16) bfloat16 */
#define AA_LOAD(p, j, b16) ((b16) ? av_load16 ((const uint16_t *) (p) + (j)) : av_load ((const float *) (p) + (j)))
#define AA_ONE(p, j, b16) ((b16) ? bf16_float (((const uint16_t *) (p))[j]) : ((const float *) (p))[j])

static inline float
av_sum (av x)
{
  float s = 0.0f;
  for (int l = 0; l < AV; l++)
    s += x[l];
  return s;
}

/* a . h over n, h single precision or (b16) bfloat16: the same sums in the
 * same order either way (a vectoriser's reduction over 16-bit values may
 * pick other lanes) */
static inline __attribute__ ((always_inline)) float
aa_dot (int n, const float *restrict a, const void *restrict h, gboolean b16)
{
  av s0 = { 0 }, s1 = { 0 };
  int j = 0;
  for (; j + 2 * AV <= n; j += 2 * AV) {
    s0 += av_load (a + j) * AA_LOAD (h, j, b16);
    s1 += av_load (a + j + AV) * AA_LOAD (h, j + AV, b16);
  }
  for (; j + AV <= n; j += AV)
    s0 += av_load (a + j) * AA_LOAD (h, j, b16);
  float s = av_sum (s0 + s1);
  for (; j < n; j++)
    s += a[j] * AA_ONE (h, j, b16);
  return s;
}

/* e = v . tanh(k + q + w c), w NULL for no coverage term: two vectors of
 * features a pass, so two chains of sums are in flight. */
static inline __attribute__ ((always_inline)) float
aa_energy_any (int A, const void *restrict k, gboolean b16, const float *restrict q, const float *restrict v,
               const float *restrict w, float c)
{
  av e0 = { 0 }, e1 = { 0 };
  int j = 0;
  for (; j + 2 * AV <= A; j += 2 * AV) {
    av x0 = AA_LOAD (k, j, b16) + av_load (q + j), x1 = AA_LOAD (k, j + AV, b16) + av_load (q + j + AV);
    if (w) {
      x0 += av_load (w + j) * c;
      x1 += av_load (w + j + AV) * c;
    }
    e0 += av_load (v + j) * av_tanh (x0);
    e1 += av_load (v + j + AV) * av_tanh (x1);
  }
  for (; j + AV <= A; j += AV) {
    av x = AA_LOAD (k, j, b16) + av_load (q + j);
    if (w)
      x += av_load (w + j) * c;
    e0 += av_load (v + j) * av_tanh (x);
  }
  float e = av_sum (e0 + e1);
  for (; j < A; j++)
    e += v[j] * psm_fast_tanhf (AA_ONE (k, j, b16) + q[j] + (w ? w[j] * c : 0.0f));
  return e;
}

static inline __attribute__ ((always_inline)) float
aa_energy (int A, const float *restrict k, const float *restrict q, const float *restrict v,
           const float *restrict w, float c)
{
  return aa_energy_any (A, k, FALSE, q, v, w, c);
}

#define AA_AHEAD 2   /* positions prefetched ahead */

/* A row's keys or values at consecutive positions lie B rows apart (8 KB
 * to 32 KB), a stride the hardware prefetchers do not follow across pages:
 * the loops below ask for the row AA_AHEAD positions ahead. At B 16, T 400,
 * A 512 this cut a forward step from 1.7 to 1.15 ms with the keys out of
 * cache (and from 1.14 to 0.72 ms with them in it). */
static inline void
prefetch_row (const float *p, int n, gboolean write)
{
  for (int j = 0; j < n; j += 16) {
    if (write)
      __builtin_prefetch (p + j, 1);
    else
      __builtin_prefetch (p + j, 0);
  }
}

/* Forward without gradients over beams: rows r = b G + k (k < G) all attend
 * over article b's keys and values, read from the compact [T, B / G, .]
 * tensors once per position for the G rows (psm_graph_repeat_of). The
 * arithmetic of each row is the one of the general loop below. */
static void
attn_forward_grouped (int T, int B, int G, int A, int H, const float *Kc, const float *qd, const float *vd,
                      const float *wc, const float *cov, const float *hc, const float *mask, float *a, float *ctx)
{
  int nB = B / G;
#pragma omp parallel for if (nB > 1 && PSM_ATTN_PAR (B, T, A)) schedule (static)
  for (int art = 0; art < nB; art++) {
    int r0 = art * G;
    for (int i = 0; i < T; i++) {
      const float *k = Kc + ((size_t) i * nB + art) * A;
      if (i + AA_AHEAD < T)
        prefetch_row (k + (size_t) AA_AHEAD * nB * A, A, FALSE);
      for (int r = r0; r < r0 + G; r++) {
        if (mask && mask[(size_t) i * B + r] == 0.0f) {
          a[(size_t) r * T + i] = -INFINITY;
          continue;
        }
        const float *qb = qd + (size_t) r * A;
        a[(size_t) r * T + i] = wc ? aa_energy (A, k, qb, vd, wc, cov[(size_t) r * T + i])
                                   : aa_energy (A, k, qb, vd, NULL, 0.0f);
      }
    }
    for (int r = r0; r < r0 + G; r++) {
      float *ab = a + (size_t) r * T, m = -INFINITY;
      for (int i = 0; i < T; i++)
        m = MAX (m, ab[i]);
      if (m == -INFINITY) {
        memset (ab, 0, T * sizeof (float));
        continue;
      }
      double s = 0.0;
      for (int i = 0; i < T; i++)
        s += ab[i] == -INFINITY ? 0.0 : expf (ab[i] - m);
      float inv = (float) (1.0 / s);
      for (int i = 0; i < T; i++)
        ab[i] = ab[i] == -INFINITY ? 0.0f : expf (ab[i] - m) * inv;
    }
    for (int r = r0; r < r0 + G; r++)
      memset (ctx + (size_t) r * H, 0, H * sizeof (float));
    for (int i = 0; i < T; i++) {
      const float *h = hc + ((size_t) i * nB + art) * H;
      if (i + AA_AHEAD < T)
        prefetch_row (h + (size_t) AA_AHEAD * nB * H, H, FALSE);
      for (int r = r0; r < r0 + G; r++) {
        float w = a[(size_t) r * T + i];
        if (w == 0.0f)
          continue;
        float *cb = ctx + (size_t) r * H;
#pragma omp simd
        for (int j = 0; j < H; j++)
          cb[j] += w * h[j];
      }
    }
  }
}

PsmTensor *
psm_additive_attention (PsmGraph *g, PsmTensor *keys, PsmTensor *query, PsmTensor *v, PsmTensor *w_c,
                        PsmTensor *coverage, PsmTensor *values, const float *mask, PsmTensor **attn,
                        PsmTensor **context)
{
  g_return_val_if_fail (keys && keys->ndim == 3 && values && values->ndim == 3, NULL);
  int T = keys->shape[0], B = keys->shape[1], A = keys->shape[2], H = values->shape[2];
  g_return_val_if_fail (values->shape[0] == T && values->shape[1] == B, NULL);
  g_return_val_if_fail (query && psm_tensor_cols (query) == A, NULL);
  int R = psm_tensor_rows (query);   /* the first R rows of the keys and values */
  g_return_val_if_fail (R >= 1 && R <= B, NULL);
  g_return_val_if_fail (v && (int) v->n == A, NULL);
  g_return_val_if_fail ((w_c == NULL) == (coverage == NULL), NULL);
  g_return_val_if_fail (!w_c || ((int) w_c->n == A && psm_tensor_rows (coverage) == R &&
                                  psm_tensor_cols (coverage) == T), NULL);
  PsmTensor *in[6] = { keys, query, v, w_c, coverage, values };
  int n = R * T + R * H;
  PsmTensor *out = psm_op_out (g, 1, &n, 6, in);
  float *a = out->data, *ctx = out->data + (size_t) R * T;
  const float *Kd = keys->data, *qd = query->data, *vd = v->data, *hd = values->data;
  const float *wc = w_c ? w_c->data : NULL, *cov = coverage ? coverage->data : NULL;
  int gk = 0, gv = 0;
  const float *Kc = out->grad ? NULL : psm_graph_repeat_of (g, Kd, &gk);
  const float *Hc = out->grad ? NULL : psm_graph_repeat_of (g, hd, &gv);
  AddAttnSaved lay = { NULL, NULL, Kd, hd, keys->grad, values->grad, (size_t) B * A, A, (size_t) B * H, H, NULL, NULL };
  PsmBatchMajor *kbm = NULL, *hbm = NULL;
  if (Kc && Hc && gk == gv && gk > 1 && B % gk == 0 && R == B) {
    attn_forward_grouped (T, B, gk, A, H, Kc, qd, vd, wc, cov, Hc, mask, a, ctx);
    goto done;
  }
  /* the copies, unless the tensors at those addresses have gradients of their own */
  if ((kbm = psm_graph_batch_major (g, Kd, T, B, A)) && keys->grad && keys->grad != kbm->xgrad)
    kbm = NULL;
  if ((hbm = psm_graph_batch_major (g, hd, T, B, H)) && values->grad && values->grad != hbm->xgrad)
    hbm = NULL;
  if (kbm) {
    lay.K = kbm->bm;
    lay.K16 = kbm->bm16;
    lay.dK = NULL;   /* the copy's, below */
    lay.kps = A;
    lay.krs = (size_t) T * A;
  }
  if (hbm) {
    lay.H = hbm->bm;
    lay.H16 = hbm->bm16;
    lay.dH = NULL;
    lay.hps = H;
    lay.hrs = (size_t) T * H;
  }
#pragma omp parallel for if (PSM_ATTN_PAR (R, T, A)) schedule (static)
  for (int b = 0; b < R; b++) {
    float *ab = a + (size_t) b * T, *cb = ctx + (size_t) b * H;
    const float *qb = qd + (size_t) b * A, *Kr = lay.K + b * lay.krs, *Hr = lay.H + b * lay.hrs;
    const uint16_t *K16r = lay.K16 ? lay.K16 + b * lay.krs : NULL, *H16r = lay.H16 ? lay.H16 + b * lay.hrs : NULL;
    float m = -INFINITY;
    for (int i = 0; i < T; i++) {
      if (mask && mask[(size_t) i * B + b] == 0.0f) {
        ab[i] = -INFINITY;
        continue;
      }
      float e, c = wc ? cov[(size_t) b * T + i] : 0.0f;
      if (K16r) {
        const uint16_t *k = K16r + i * lay.kps;
        if (i + AA_AHEAD < T)
          prefetch_row ((const float *) (k + AA_AHEAD * lay.kps), A / 2, FALSE);
        e = wc ? aa_energy_any (A, k, TRUE, qb, vd, wc, c) : aa_energy_any (A, k, TRUE, qb, vd, NULL, 0.0f);
      } else {
        const float *k = Kr + i * lay.kps;
        if (i + AA_AHEAD < T)
          prefetch_row (k + AA_AHEAD * lay.kps, A, FALSE);
        e = wc ? aa_energy (A, k, qb, vd, wc, c) : aa_energy (A, k, qb, vd, NULL, 0.0f);
      }
      ab[i] = e;
      m = MAX (m, e);
    }
    memset (cb, 0, H * sizeof (float));
    if (m == -INFINITY) {            /* no real position: a = 0, c = 0 */
      memset (ab, 0, T * sizeof (float));
      continue;
    }
    double s = 0.0;
    for (int i = 0; i < T; i++)
      s += ab[i] == -INFINITY ? 0.0 : expf (ab[i] - m);
    float inv = (float) (1.0 / s);
    for (int i = 0; i < T; i++) {
      if (i + AA_AHEAD < T)
        prefetch_row (H16r ? (const float *) (H16r + (i + AA_AHEAD) * lay.hps) : Hr + (i + AA_AHEAD) * lay.hps,
                      H16r ? H / 2 : H, FALSE);
      ab[i] = ab[i] == -INFINITY ? 0.0f : expf (ab[i] - m) * inv;
      if (ab[i] == 0.0f)
        continue;
      float w = ab[i];
      if (H16r) {
        const uint16_t *h = H16r + i * lay.hps;
#pragma omp simd
        for (int j = 0; j < H; j++)
          cb[j] += w * bf16_float (h[j]);
      } else {
        const float *h = Hr + i * lay.hps;
#pragma omp simd
        for (int j = 0; j < H; j++)
          cb[j] += w * h[j];
      }
    }
  }
done:;
  PsmNode *nd = psm_graph_record (g, PSM_OP_ADDITIVE_ATTENTION, out, 6, in);
  if (nd) {
    AddAttnSaved *sv = psm_graph_alloc (g, sizeof *sv);
    *sv = lay;
    sv->mask = psm_graph_dup (g, mask, (size_t) T * B * sizeof (float));
    sv->defer = psm_graph_deferred_values (g, values->grad);
    if (sv->defer && (sv->defer->T != T || sv->defer->B != B || sv->defer->H != H))
      sv->defer = NULL;
    if (kbm && keys->grad)
      sv->dK = psm_batch_major_grad (g, kbm);
    if (hbm && values->grad && !sv->defer)
      sv->dH = psm_batch_major_grad (g, hbm);
    nd->saved = sv;
    nd->iarg[0] = T;
    nd->iarg[1] = B;
    nd->iarg[2] = R;
  }
  int sa[2] = { R, T }, sc[2] = { R, H };
  if (attn)
    *attn = psm_tensor_view (g, out, 0, 2, sa);
  if (context)
    *context = psm_tensor_view (g, out, (size_t) R * T, 2, sc);
  return out;
}

/* The backward's work over the A features of AA_BLOCK source positions of
 * one row at once: the row's accumulators dv, dq and dw_c are read and
 * written once per block instead of once per position (the loop was bound by
 * those loads and stores: 108 -> 70 ms for 100 decoder steps at B 16, T 400,
 * A 512). n < AA_BLOCK pads the block with positions of gradient 0 whose
 * keys are zeros and whose dK goes to scratch; each position's coverage
 * gradient is its own sum, so padding changes no result. */
static inline __attribute__ ((always_inline)) void
attn_backward_block_any (int n, const int *pos, const float *dei, int A, const void *Kr, gboolean b16, float *dKr,
                         size_t kps, float *dk_scratch, const float *zeros, const float *restrict qb,
                         const float *restrict vd, const float *restrict wc, const float *covb, int T,
                         float *restrict dv, float *restrict dq, float *restrict dwc, float *dcov)
{
  const size_t esz = b16 ? sizeof (uint16_t) : sizeof (float);   /* of a key */
  const char *k[AA_BLOCK];
  float *dk[AA_BLOCK], c[AA_BLOCK], e[AA_BLOCK];
  for (int r = 0; r < AA_BLOCK; r++) {
    gboolean real = r < n;
    size_t at = real ? pos[r] * kps : 0;
    k[r] = real ? (const char *) Kr + at * esz : (const char *) zeros;   /* zeros either way */
    dk[r] = real && dKr ? dKr + at : dk_scratch + (size_t) r * A;
    c[r] = real && covb ? covb[pos[r]] : 0.0f;
    e[r] = real ? dei[r] : 0.0f;
  }
  for (int i = pos[n - 1] + 1; i <= pos[n - 1] + AA_BLOCK && i < T; i++) {   /* the next block, likely */
    prefetch_row ((const float *) ((const char *) Kr + i * kps * esz), (int) (A * esz / sizeof (float)), FALSE);
    if (dKr)
      prefetch_row (dKr + i * kps, A, TRUE);
  }
  const void *restrict k0 = k[0], *restrict k1 = k[1], *restrict k2 = k[2], *restrict k3 = k[3];
  float *restrict d0 = dk[0], *restrict d1 = dk[1], *restrict d2 = dk[2], *restrict d3 = dk[3];
  float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], e0 = e[0], e1 = e[1], e2 = e[2], e3 = e[3];
  av vs0 = { 0 }, vs1 = { 0 }, vs2 = { 0 }, vs3 = { 0 };
  int j = 0;
  for (; j + AV <= A; j += AV) {
    av q = av_load (qb + j), w = av_load (wc + j), v = av_load (vd + j);
    av z0 = av_tanh (AA_LOAD (k0, j, b16) + q + w * c0), z1 = av_tanh (AA_LOAD (k1, j, b16) + q + w * c1);
    av z2 = av_tanh (AA_LOAD (k2, j, b16) + q + w * c2), z3 = av_tanh (AA_LOAD (k3, j, b16) + q + w * c3);
    av p0 = e0 * v * (1.0f - z0 * z0), p1 = e1 * v * (1.0f - z1 * z1);
    av p2 = e2 * v * (1.0f - z2 * z2), p3 = e3 * v * (1.0f - z3 * z3);
    av_store (d0 + j, av_load (d0 + j) + p0);
    av_store (d1 + j, av_load (d1 + j) + p1);
    av_store (d2 + j, av_load (d2 + j) + p2);
    av_store (d3 + j, av_load (d3 + j) + p3);
    av_store (dv + j, av_load (dv + j) + ((e0 * z0 + e1 * z1) + (e2 * z2 + e3 * z3)));
    av_store (dq + j, av_load (dq + j) + ((p0 + p1) + (p2 + p3)));
    av_store (dwc + j, av_load (dwc + j) + ((p0 * c0 + p1 * c1) + (p2 * c2 + p3 * c3)));
    vs0 += p0 * w;
    vs1 += p1 * w;
    vs2 += p2 * w;
    vs3 += p3 * w;
  }
  float s0 = av_sum (vs0), s1 = av_sum (vs1), s2 = av_sum (vs2), s3 = av_sum (vs3);
  for (; j < A; j++) {   /* the features past the last whole vector */
    float q = qb[j], w = wc[j], v = vd[j];
    float z0 = psm_fast_tanhf (AA_ONE (k0, j, b16) + q + w * c0), z1 = psm_fast_tanhf (AA_ONE (k1, j, b16) + q + w * c1);
    float z2 = psm_fast_tanhf (AA_ONE (k2, j, b16) + q + w * c2), z3 = psm_fast_tanhf (AA_ONE (k3, j, b16) + q + w * c3);
    float p0 = e0 * v * (1.0f - z0 * z0), p1 = e1 * v * (1.0f - z1 * z1);
    float p2 = e2 * v * (1.0f - z2 * z2), p3 = e3 * v * (1.0f - z3 * z3);
    d0[j] += p0;
    d1[j] += p1;
    d2[j] += p2;
    d3[j] += p3;
    dv[j] += (e0 * z0 + e1 * z1) + (e2 * z2 + e3 * z3);
    dq[j] += (p0 + p1) + (p2 + p3);
    dwc[j] += (p0 * c0 + p1 * c1) + (p2 * c2 + p3 * c3);
    s0 += p0 * w;
    s1 += p1 * w;
    s2 += p2 * w;
    s3 += p3 * w;
  }
  if (dcov) {
    float s[AA_BLOCK] = { s0, s1, s2, s3 };
    for (int r = 0; r < n; r++)
      dcov[pos[r]] += s[r];
  }
}

/* the block over keys in single precision, and over their bfloat16 copy */
static void
attn_backward_block (int n, const int *pos, const float *dei, int A, const float *Kr, float *dKr, size_t kps,
                     float *dk_scratch, const float *zeros, const float *restrict qb, const float *restrict vd,
                     const float *restrict wc, const float *covb, int T, float *restrict dv, float *restrict dq,
                     float *restrict dwc, float *dcov)
{
  attn_backward_block_any (n, pos, dei, A, Kr, FALSE, dKr, kps, dk_scratch, zeros, qb, vd, wc, covb, T, dv, dq, dwc,
                           dcov);
}

static void
attn_backward_block16 (int n, const int *pos, const float *dei, int A, const uint16_t *Kr, float *dKr, size_t kps,
                       float *dk_scratch, const float *zeros, const float *restrict qb, const float *restrict vd,
                       const float *restrict wc, const float *covb, int T, float *restrict dv, float *restrict dq,
                       float *restrict dwc, float *dcov)
{
  attn_backward_block_any (n, pos, dei, A, Kr, TRUE, dKr, kps, dk_scratch, zeros, qb, vd, wc, covb, T, dv, dq, dwc,
                           dcov);
}

void
psm_additive_attention_backward (PsmNode *nd)
{
  PsmTensor *keys = nd->in[0], *query = nd->in[1], *v = nd->in[2], *w_c = nd->in[3], *coverage = nd->in[4],
            *values = nd->in[5], *out = nd->out;
  const AddAttnSaved *sv = nd->saved;
  const float *mask = sv->mask;
  int T = nd->iarg[0], B = nd->iarg[1], R = nd->iarg[2], A = keys->shape[2], H = values->shape[2];
  const float *a = out->data, *da = out->grad, *dctx = out->grad + (size_t) R * T;
  const float *qd = query->data, *vd = v->data;
  const float *wc = w_c ? w_c->data : NULL, *cov = coverage ? coverage->data : NULL;
  /* per-row partial sums of dv and dw_c, added over rows in order below */
  float *part = psm_xmalloc0 ((size_t) R * 2 * A * sizeof (float), "attention gradients");
  float *de_all = psm_xmalloc ((size_t) R * T * sizeof (float), "attention gradients");
  float *scratch = psm_xmalloc0 ((size_t) R * A * sizeof (float), "attention gradients");
  float *dummy = psm_xmalloc ((size_t) R * AA_BLOCK * A * sizeof (float), "attention gradients");
  float *zeros = psm_xmalloc0 ((size_t) A * sizeof (float), "attention gradients");
  gboolean dh_here = sv->dH && !sv->defer;
  if (values->grad && sv->defer) {
    g_array_append_val (sv->defer->steps, a);
    g_array_append_val (sv->defer->steps, dctx);
    g_array_append_val (sv->defer->rows, R);
  }
#pragma omp parallel for if (PSM_ATTN_PAR (R, T, A)) schedule (static)
  for (int b = 0; b < R; b++) {
    const float *ab = a + (size_t) b * T, *dcb = dctx + (size_t) b * H, *qb = qd + (size_t) b * A;
    const float *Hr = sv->H + b * sv->hrs, *Kr = sv->K + b * sv->krs;
    const uint16_t *H16r = sv->H16 ? sv->H16 + b * sv->hrs : NULL, *K16r = sv->K16 ? sv->K16 + b * sv->krs : NULL;
    float *de = de_all + (size_t) b * T;
    double dot = 0.0;
    for (int i = 0; i < T; i++) {
      float d = da[(size_t) b * T + i];
      if (i + AA_AHEAD < T)
        prefetch_row (H16r ? (const float *) (H16r + (i + AA_AHEAD) * sv->hps) : Hr + (i + AA_AHEAD) * sv->hps,
                      H16r ? H / 2 : H, FALSE);
      if (ab[i] != 0.0f)
        d += H16r ? aa_dot (H, dcb, H16r + i * sv->hps, TRUE) : aa_dot (H, dcb, Hr + i * sv->hps, FALSE);
      de[i] = d;
      dot += (double) ab[i] * d;
    }
    float *restrict dv = part + (size_t) b * 2 * A, *restrict dwc = dv + A;
    /* dq of a row without a gradient goes to scratch: one loop shape, vectorised */
    float *restrict dq = query->grad ? query->grad + (size_t) b * A : scratch + (size_t) b * A;
    float *dk_scratch = dummy + (size_t) b * AA_BLOCK * A;
    const float *wcv = wc ? wc : zeros;
    int blk[AA_BLOCK], nb = 0;
    float dei_blk[AA_BLOCK];
    for (int i = 0; i <= T; i++) {
      if (i < T) {
        if (mask && mask[(size_t) i * B + b] == 0.0f)
          continue;   /* padding: no gradient anywhere */
        float dei = ab[i] * (de[i] - (float) dot);
        if (dh_here && ab[i] != 0.0f) {
          float *restrict dh = sv->dH + b * sv->hrs + i * sv->hps;
          float w = ab[i];
#pragma omp simd
          for (int j = 0; j < H; j++)
            dh[j] += w * dcb[j];
        }
        if (dei == 0.0f)
          continue;
        dei_blk[nb] = dei;
        blk[nb++] = i;
        if (nb < AA_BLOCK)
          continue;
      }
      if (nb == 0)
        break;
      float *dKr = sv->dK ? sv->dK + b * sv->krs : NULL, *dcov = coverage && coverage->grad ? coverage->grad + (size_t) b * T : NULL;
      const float *covb = cov ? cov + (size_t) b * T : NULL;
      if (K16r)
        attn_backward_block16 (nb, blk, dei_blk, A, K16r, dKr, sv->kps, dk_scratch, zeros, qb, vd, wcv, covb, T, dv, dq,
                               dwc, dcov);
      else
        attn_backward_block (nb, blk, dei_blk, A, Kr, dKr, sv->kps, dk_scratch, zeros, qb, vd, wcv, covb, T, dv, dq,
                             dwc, dcov);
      nb = 0;
    }
  }
  for (int b = 0; b < R; b++) {
    const float *dv = part + (size_t) b * 2 * A, *dwc = dv + A;
    for (int j = 0; j < A; j++) {
      if (v->grad)
        v->grad[j] += dv[j];
      if (w_c && w_c->grad)
        w_c->grad[j] += dwc[j];
    }
  }
  free (part);
  free (de_all);
  free (scratch);
  free (dummy);
  free (zeros);
}
