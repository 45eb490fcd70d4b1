/* linear-dropout.c — y = x W + b for x the output of a locked dropout
 * (psm_linear takes this path when psm_locked_dropout noted x, notes.c).
 * x's rows r = t Bm + b share the mask of class b (b < Bm), so with S_b
 * the units class b keeps, y[r] = x[r, S_b] W[S_b, :] + b;
 *   dW[S_b, :] += x[rows of b, S_b]^T dy[rows of b],
 *   dx[rows of b, S_b] += dy[rows of b] W[S_b, :]^T
 * (dx at a dropped unit is left alone: the dropout multiplies it by 0). */
#include "config.h"
#include <omp.h>
#include <string.h>
#include "ops/ops-internal.h"

/* Each class of rows (one stream or example, every Bm-th row) has its
 * dropped units at exact zeros; its products run on the kept units only:
 * with dropout p, about a fraction p of each of the three products' FLOPs
 * goes (the PTB model's softmax layer and input projections, p 0.5:
 * BENCHMARKS.md d). All three run on psm's packed kernel
 * (psm_packed_gemm_rows), which reads a row of the packed W by index:
 *   forward: per class, its rows' kept units gathered [T, S_b] against the
 *     rows S_b of W packed once; the column panels split over the threads;
 *   dW: per class, its kept units' columns [S_b, T] against dy's rows of
 *     the class packed [T, panel], added into the rows S_b of dW; the
 *     panels split over the threads, in groups that stay in cache;
 *   dx: per class (the classes split over the threads), W's rows S_b
 *     against dy's rows of the class packed transposed [N, T], over N in
 *     chunks that stay in cache, into a [S_b, T] block added to dx.
 * A product of a kept unit is the same product; a dropped unit's term was
 * 0 x w = 0, so the forward's sums are the dense kernel's to the bit, and
 * the backward's to rounding (an input that is inf or NaN at a dropped
 * unit would have made NaNs that this leaves out). */
double psm_dropout_flops_skipped;

#define DL_MIN_ROWS 16     /* rows a class at least (the kernel's blocks want a few) */
#define DL_PANELS 32       /* panels of dy a group in dW (32 x T x 64 bytes: L2) */
#define DL_KCHUNK 512      /* N per chunk in dx (ceil (T / 16) panels x 512 x 64 bytes) */

typedef struct {
  int Bm, T;
  int32_t *kept;   /* [Bm, K]: class b's kept units, nk[b] of them */
  int *nk;
  size_t *off;     /* [Bm]: T * (kept units of the classes before b) */
  size_t total;    /* kept units over the classes */
} DropLin;

/* The units each class keeps (kept, nk) and where its gathered rows go (off). */
static DropLin *
droplin_new (PsmGraph *g, const float *m, int Bm, int K, int T)
{
  DropLin *d = psm_graph_alloc (g, sizeof *d);
  d->Bm = Bm;
  d->T = T;
  d->kept = psm_graph_alloc (g, (size_t) Bm * K * sizeof (int32_t));
  d->nk = psm_graph_alloc (g, (size_t) Bm * sizeof (int));
  d->off = psm_graph_alloc (g, (size_t) Bm * sizeof (size_t));
  d->total = 0;
  for (int b = 0; b < Bm; b++) {
    int n = 0;
    for (int k = 0; k < K; k++)
      if (m[(size_t) b * K + k] != 0.0f)
        d->kept[(size_t) b * K + n++] = k;
    d->nk[b] = n;
    d->off[b] = (size_t) T * d->total;
    d->total += n;
  }
  return d;
}

/* The kept units of class b's rows of x [R, K]: rows t (t_major) or units
 * j (else) contiguous, at xa + d->off[b]. */
static void
droplin_gather (const DropLin *d, const float *x, int K, gboolean t_major, float *xa)
{
  int Bm = d->Bm, T = d->T;
#pragma omp parallel for if ((long) T * d->total >= 65536) schedule (static)
  for (int b = 0; b < Bm; b++) {
    const int32_t *kp = d->kept + (size_t) b * K;
    int nk = d->nk[b];
    float *o = xa + d->off[b];
    for (int t = 0; t < T; t++) {
      const float *xr = x + ((size_t) t * Bm + b) * K;
      for (int j = 0; j < nk; j++)
        o[t_major ? (size_t) t * nk + j : (size_t) j * T + t] = xr[kp[j]];
    }
  }
}

gboolean
psm_dropout_linear_forward (PsmGraph *g, PsmTensor *x, const float *m, size_t period, PsmTensor *w, PsmTensor *b, PsmTensor *y)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  if (!psm_paths.dropout_linear || period % K || omp_in_parallel ())
    return FALSE;
  int Bm = (int) (period / K);
  if (R % Bm || R / Bm < DL_MIN_ROWS)
    return FALSE;
  /* the weight plan's rule for a product by W (tape-internal.h), as
   * psm_linear's: this kernel reads W's single-precision packing, so it
   * runs only where the plan packs W (not on bfloat16 operands, not on a
   * W that is not a parameter); psm_paths.dropout_linear asked for it, so
   * in any build (a baseline one's default leaves the switch off) */
  PsmWeightPlan p = psm_weight_plan (g, w, K, N, R, y->grad != NULL, PSM_PLAN_BF16_TRAIN | PSM_PLAN_PACKED);
  if (p.path != PSM_WEIGHT_PACKED)
    return FALSE;
  int T = R / Bm;
  DropLin *d = droplin_new (g, m, Bm, K, T);
  if (d->total * 4 > (size_t) Bm * K * 3)
    return FALSE;   /* under a quarter dropped: the dense product (BENCHMARKS.md d) */
  double skip = 2.0 * T * ((double) Bm * K - (double) d->total) * N;   /* per product */
  psm_dropout_flops_skipped += skip * (y->grad ? 1 + !!w->grad + !!x->grad : 1);
  const float *wp = psm_weight_operand (g, &p);
  float *xa = psm_xmalloc (MAX (T * d->total, 1) * sizeof (float), "dropout projection");
  droplin_gather (d, x->data, K, TRUE, xa);
  int panels = psm_pack_panels (N);
#pragma omp parallel
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    const float **ar = g_new (const float *, T);
    float **cr = g_new (float *, T);
    for (int c = 0; c < Bm && p1 > p0; c++) {
      for (int t = 0; t < T; t++) {
        ar[t] = xa + d->off[c] + (size_t) t * d->nk[c];
        cr[t] = y->data + ((size_t) t * Bm + c) * N;
      }
      psm_packed_gemm_rows (T, d->nk[c], N, p0, p1, ar, d->kept + (size_t) c * K,
                            wp + (size_t) p0 * K * PSM_PACK_NR, (size_t) K * PSM_PACK_NR, cr, b ? b->data : NULL,
                            FALSE);
    }
    g_free (ar);
    g_free (cr);
  }
  free (xa);
  PsmTensor *in[3] = { x, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_DROPOUT_LINEAR, y, 3, in);
  if (nd)
    nd->saved = d;
  return TRUE;
}

void
psm_dropout_linear_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out;
  const DropLin *d = n->saved;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1], Bm = d->Bm, T = d->T;
  int tp = psm_pack_panels (T), panels = psm_pack_panels (N);
  if (b && b->grad)
    psm_colsum_add (R, N, y->grad, b->grad);
  if (w->grad && d->total) {   /* dW[S_b, :] += x[rows of b, S_b]^T dy[rows of b] */
    float *xt = psm_xmalloc (T * d->total * sizeof (float), "dropout projection gradient");
    droplin_gather (d, x->data, K, FALSE, xt);
#pragma omp parallel
    {
      int id = omp_get_thread_num (), team = omp_get_num_threads ();
      int p0 = panels * id / team, p1 = panels * (id + 1) / team;
      int c0 = p0 * PSM_PACK_NR, c1 = MIN (N, p1 * PSM_PACK_NR);
      float *q = psm_xaligned (MAX ((size_t) (p1 - p0) * T * PSM_PACK_NR, 1) * sizeof (float),
                               "dropout projection gradient");
      const float **ar = g_new (const float *, K);
      float **cr = g_new (float *, K);
      for (int c = 0; c < Bm && p1 > p0; c++) {
        int nk = d->nk[c];
        psm_pack (T, c1 - c0, y->grad + (size_t) c * N + c0, Bm * N, FALSE, q);   /* class c's rows of dy */
        for (int j = 0; j < nk; j++) {
          ar[j] = xt + d->off[c] + (size_t) j * T;
          cr[j] = w->grad + (size_t) d->kept[(size_t) c * K + j] * N;
        }
        for (int g0 = p0; g0 < p1; g0 += DL_PANELS) {
          int g1 = MIN (p1, g0 + DL_PANELS);
          for (int i = 0; i < nk; i += 12)
            psm_packed_gemm_rows (MIN (12, nk - i), T, N, g0, g1, ar + i, NULL,
                                  q + (size_t) (g0 - p0) * T * PSM_PACK_NR, (size_t) T * PSM_PACK_NR, cr + i, NULL,
                                  TRUE);
        }
      }
      g_free (ar);
      g_free (cr);
      free (q);
    }
    free (xt);
  }
  if (x->grad && d->total) {   /* dx[rows of b, S_b] += dy[rows of b] W[S_b, :]^T */
    int lds = tp * PSM_PACK_NR;
#pragma omp parallel
    {
      float *p = psm_xaligned ((size_t) tp * N * PSM_PACK_NR * sizeof (float), "dropout projection gradient");
      float *s = psm_xmalloc ((size_t) K * lds * sizeof (float), "dropout projection gradient");
      const float **ar = g_new (const float *, K);
      float **cr = g_new (float *, K);
#pragma omp for schedule (static)
      for (int c = 0; c < Bm; c++) {
        int nk = d->nk[c];
        const int32_t *kp = d->kept + (size_t) c * K;
        if (!nk)
          continue;
        psm_pack (N, T, y->grad + (size_t) c * N, Bm * N, TRUE, p);   /* [N, T] */
        for (int j = 0; j < nk; j++)
          cr[j] = s + (size_t) j * lds;
        for (int k0 = 0; k0 < N; k0 += DL_KCHUNK) {
          for (int j = 0; j < nk; j++)
            ar[j] = w->data + (size_t) kp[j] * N + k0;
          for (int i = 0; i < nk; i += 12)
            psm_packed_gemm_rows (MIN (12, nk - i), MIN (DL_KCHUNK, N - k0), T, 0, tp, ar + i, NULL,
                                  p + (size_t) k0 * PSM_PACK_NR, (size_t) N * PSM_PACK_NR, cr + i, NULL, k0 > 0);
        }
        for (int t = 0; t < T; t++) {
          float *dx = x->grad + ((size_t) t * Bm + c) * K;
          for (int j = 0; j < nk; j++)
            dx[kp[j]] += s[(size_t) j * lds + t];
        }
      }
      g_free (ar);
      g_free (cr);
      free (p);
      free (s);
    }
  }
}
