/* matmul.c — C = op(A) op(B) and y = x W + b, each one cblas_sgemm call.
 *
 * Backward of C = A B (row-major):  dA += dC B^T,  dB += A^T dC.
 * With transposes the same identities give, for C = A^T B:  dA += B dC^T,
 * dB += A dC;  C = A B^T:  dA += dC B,  dB += dC^T A;  C = A^T B^T:
 * dA += B^T dC^T,  dB += dC^T A^T.
 * Linear: y = x W + b;  dx += dy W^T,  dW += x^T dy,  db += sum_rows dy.
 * Linear of an embedding lookup, x = E[ids] (embedding_linear below): each
 * distinct id's row is projected once, U = E[u] W + b, and y[r] = U[k(r)];
 *   dU[k] = sum of dy[r] over the rows r of id u_k,  dW += E[u]^T dU,
 *   db += sum_k dU[k],  dE[u_k] += (dU W^T)[k].
 * Linear of a locked dropout's output (dropout_linear below): x's rows
 * r = t Bm + b share the mask of class b (b < Bm), so with S_b the units
 * class b keeps, y[r] = x[r, S_b] W[S_b, :] + b;
 *   dW[S_b, :] += x[rows of b, S_b]^T dy[rows of b],
 *   dx[rows of b, S_b] += dy[rows of b] W[S_b, :]^T
 * (dx at a dropped unit is left alone: the dropout multiplies it by 0). */
#include "config.h"
#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <string.h>
#include "psm-private.h"
#include "fastmath.h"

void
psm_gemm (gboolean ta, gboolean tb, int M, int N, int K, float alpha,
          const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
  if (M == 0 || N == 0)
    return;
  /* OpenBLAS's OpenMP build hangs when its team is smaller than the thread
   * count it asks for (its level-3 workers wait on each other), which
   * OMP_THREAD_LIMIT below OMP_NUM_THREADS causes: never ask for more. */
  if (omp_get_max_threads () > omp_get_thread_limit ())
    omp_set_num_threads (omp_get_thread_limit ());
  if (K == 0) {
    if (beta == 0.0f)
      for (int i = 0; i < M; i++)
        memset (C + (size_t) i * ldc, 0, N * sizeof (float));
    return;
  }
  /* Few rows (the per-step GEMMs of a recurrence at small batch): split the
   * columns over our threads, each calling single-threaded sgemm (OpenBLAS
   * runs single-threaded inside a parallel region). Measured faster than
   * OpenBLAS's own split here: GRU step B = 32, H = 256, 13.1 -> 12.1 ms
   * (BENCHMARKS.md). Column blocks start on 16-float boundaries; they are
   * cut by the team we got, which OMP_THREAD_LIMIT or a nested region can
   * make smaller than the one asked for. */
  int nt = omp_get_max_threads ();
  if (M <= 64 && N >= 64 * nt && nt > 1 && !omp_in_parallel ()) {
#pragma omp parallel num_threads (nt)
    {
      int t = omp_get_thread_num (), team = omp_get_num_threads ();
      int n0 = (int) ((long) N * t / team) & ~15;
      int n1 = t == team - 1 ? N : (int) ((long) N * (t + 1) / team) & ~15;
      const float *Bt = tb ? B + (size_t) n0 * ldb : B + n0;
      cblas_sgemm (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                   M, n1 - n0, K, alpha, A, lda, Bt, ldb, beta, C + n0, ldc);
    }
    return;
  }
  cblas_sgemm (CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
               M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

PsmTensor *
psm_matmul (PsmGraph *g, PsmTensor *a, PsmTensor *b, gboolean ta, gboolean tb)
{
  int ra = psm_tensor_rows (a), ca = psm_tensor_cols (a);
  int rb = psm_tensor_rows (b), cb = psm_tensor_cols (b);
  int M = ta ? ca : ra, K = ta ? ra : ca;
  int Kb = tb ? cb : rb, N = tb ? rb : cb;
  g_return_val_if_fail (K == Kb, NULL);
  PsmTensor *in[2] = { a, b };
  int shape[PSM_MAX_DIMS], nd = 2;
  if (!ta && a->ndim > 2) {
    nd = a->ndim;
    memcpy (shape, a->shape, sizeof shape);
    shape[nd - 1] = N;
  } else {
    shape[0] = M;
    shape[1] = N;
  }
  PsmTensor *c = psm_op_out (g, nd, shape, 2, in);
  psm_gemm (ta, tb, M, N, K, 1.0f, a->data, ca, b->data, cb, 0.0f, c->data, N);
  PsmNode *n = psm_graph_record (g, PSM_OP_MATMUL, c, 2, in);
  if (n) {
    n->iarg[0] = ta;
    n->iarg[1] = tb;
  }
  return c;
}

void
psm_matmul_backward (PsmNode *n)
{
  PsmTensor *a = n->in[0], *b = n->in[1], *c = n->out;
  gboolean ta = n->iarg[0], tb = n->iarg[1];
  int ca = psm_tensor_cols (a), cb = psm_tensor_cols (b);
  int M = psm_tensor_rows (c), N = psm_tensor_cols (c);
  int K = ta ? psm_tensor_rows (a) : ca;
  if (a->grad) {
    if (!ta)       /* dA[M,K] += dC[M,N] op(B)^T */
      psm_gemm (FALSE, !tb, M, K, N, 1.0f, c->grad, N, b->data, cb, 1.0f, a->grad, ca);
    else           /* dA[K,M] += op(B)[K,N] dC^T */
      psm_gemm (tb, TRUE, K, M, N, 1.0f, b->data, cb, c->grad, N, 1.0f, a->grad, ca);
  }
  if (b->grad) {
    if (!tb)       /* dB[K,N] += op(A)^T dC */
      psm_gemm (!ta, FALSE, K, N, M, 1.0f, a->data, ca, c->grad, N, 1.0f, b->grad, cb);
    else           /* dB[N,K] += dC^T op(A) */
      psm_gemm (TRUE, ta, N, K, M, 1.0f, c->grad, N, a->data, ca, 1.0f, b->grad, cb);
  }
}

void
psm_gemm_packed (int M, int N, int K, const float *A, int lda, const float *wp, const float *bias, gboolean acc,
                 float *C, int ldc)
{
  int panels = psm_pack_panels (N);
  int nt = omp_in_parallel () ? 1 : MAX (1, MIN (omp_get_max_threads (), panels / 4));
#pragma omp parallel num_threads (nt)
  {
    int id = omp_get_thread_num (), team = omp_get_num_threads ();
    int p0 = panels * id / team, p1 = panels * (id + 1) / team;
    int c0 = p0 * PSM_PACK_NR, c1 = MIN (N, p1 * PSM_PACK_NR);
    if (c1 > c0)
      psm_packed_gemm_store (M, K, c1 - c0, A, lda, wp + (size_t) p0 * K * PSM_PACK_NR, C + c0, ldc,
                             bias ? bias + c0 : NULL, acc);
  }
}

/* Whether y = x W with this x and W takes the packed path: few rows (or
 * any number without gradients, psm_packed_rows_ok), a parameter as W, and
 * a build with the packed kernel. */
static gboolean
use_packed (PsmGraph *g, int rows, const PsmTensor *w)
{
  return psm_packed_rows_ok (g, rows) && psm_graph_is_const (g, w->data);
}

/* The distinct ids of an embedding_linear node and the rows they had. */
typedef struct {
  int nu;
  const int32_t *uniq;   /* [nu]: the distinct ids in order of first use */
  const int32_t *which;  /* [R]: row r is uniq[which[r]] */
  const float *xu;       /* [nu, K]: their embeddings, E[uniq] */
} EmbLin;

/* y = x W + b for x = table[ids] (R rows, noted by psm_embedding): the
 * distinct ids' rows go through the GEMM once and y's rows are copied from
 * them. Returns FALSE, having done nothing, when fewer than a quarter of the
 * rows repeat an id (the copies would cost more than the GEMM saves). A
 * batch of 16 CNN/DailyMail articles (6,400 source tokens) has about 1,650
 * distinct ids: See's encoder projection 6,400 x 128 x 2,048 becomes 1,650
 * rows (BENCHMARKS.md c). */
static gboolean
embedding_linear (PsmGraph *g, PsmTensor *x, PsmTensor *table, const int32_t *ids, PsmTensor *w, PsmTensor *b,
                  PsmTensor *y)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1], V = table->shape[0];
  int32_t *slot = psm_graph_alloc (g, (size_t) V * sizeof (int32_t));
  int32_t *uniq = psm_graph_alloc (g, (size_t) R * sizeof (int32_t));
  int32_t *which = psm_graph_alloc (g, (size_t) R * sizeof (int32_t));
  memset (slot, 0xff, (size_t) V * sizeof (int32_t));   /* -1: not seen */
  int nu = 0;
  for (int r = 0; r < R; r++) {
    int32_t id = ids[r];
    if (slot[id] < 0) {
      slot[id] = nu;
      uniq[nu++] = id;
    }
    which[r] = slot[id];
  }
  if (!PSM_PROJECT_DISTINCT (nu, R))
    return FALSE;
  float *xu = psm_graph_alloc (g, (size_t) nu * K * sizeof (float));
  float *u = psm_graph_alloc (g, (size_t) nu * N * sizeof (float));
  for (int k = 0; k < nu; k++) {
    memcpy (xu + (size_t) k * K, table->data + (size_t) uniq[k] * K, K * sizeof (float));
    if (b)
      memcpy (u + (size_t) k * N, b->data, N * sizeof (float));
  }
  const void *wb = psm_graph_bf16_weight (g, w->data, K, N, y->grad != NULL);   /* decode.precision bf16 */
  if (wb)
    psm_gemm_bf16 (nu, N, K, xu, K, wb, NULL, b != NULL, u, N);
  else
    psm_gemm (FALSE, FALSE, nu, N, K, 1.0f, xu, K, w->data, N, b ? 1.0f : 0.0f, u, N);
#pragma omp parallel for if ((long) R * N >= 65536) schedule (static)
  for (int r = 0; r < R; r++)
    memcpy (y->data + (size_t) r * N, u + (size_t) which[r] * N, N * sizeof (float));
  PsmTensor *in[3] = { table, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_EMBEDDING_LINEAR, y, 3, in);
  if (nd) {
    EmbLin *el = psm_graph_alloc (g, sizeof *el);
    *el = (EmbLin) { nu, uniq, which, xu };
    nd->saved = el;
  }
  return TRUE;
}

void
psm_embedding_linear_backward (PsmNode *n)
{
  PsmTensor *table = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out;
  const EmbLin *el = n->saved;
  int R = psm_tensor_rows (y), K = w->shape[0], N = w->shape[1], nu = el->nu;
  float *du = psm_xmalloc0 ((size_t) nu * N * sizeof (float), "embedding projection gradient");
  /* column blocks over the threads; each adds its rows in order, so the
   * sums do not depend on the split */
#pragma omp parallel for if ((long) R * N >= 65536) schedule (static)
  for (int j0 = 0; j0 < N; j0 += 256) {
    int j1 = MIN (N, j0 + 256);
    for (int r = 0; r < R; r++) {
      const float *dy = y->grad + (size_t) r * N;
      float *d = du + (size_t) el->which[r] * N;
#pragma omp simd
      for (int j = j0; j < j1; j++)
        d[j] += dy[j];
    }
  }
  if (w->grad)
    psm_gemm (TRUE, FALSE, K, N, nu, 1.0f, el->xu, K, du, N, 1.0f, w->grad, N);
  if (b && b->grad)
    psm_colsum_add (nu, N, du, b->grad);
  if (table->grad) {
    float *dxu = psm_xmalloc ((size_t) nu * K * sizeof (float), "embedding projection gradient");
    psm_gemm (FALSE, TRUE, nu, K, N, 1.0f, du, N, w->data, N, 0.0f, dxu, K);
#pragma omp parallel for if ((long) nu * K >= 65536) schedule (static)
    for (int k = 0; k < nu; k++) {   /* distinct rows of the table */
      float *dt = table->grad + (size_t) el->uniq[k] * K;
      const float *s = dxu + (size_t) k * K;
#pragma omp simd
      for (int j = 0; j < K; j++)
        dt[j] += s[j];
    }
    free (dxu);
  }
  free (du);
}

/* ---- y = x W + b for x the output of a locked dropout ----
 * Each class of rows (one stream or example, every Bm-th row) has its
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
gboolean psm_dropout_linear = PSM_PACK_FAST;
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

static gboolean
dropout_linear (PsmGraph *g, PsmTensor *x, const float *m, size_t period, PsmTensor *w, PsmTensor *b, PsmTensor *y)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  if (!psm_dropout_linear || period % K || !psm_graph_is_const (g, w->data) || omp_in_parallel ())
    return FALSE;
  int Bm = (int) (period / K);
  if (R % Bm || R / Bm < DL_MIN_ROWS)
    return FALSE;
  int T = R / Bm;
  DropLin *d = droplin_new (g, m, Bm, K, T);
  if (d->total * 4 > (size_t) Bm * K * 3)
    return FALSE;   /* under a quarter dropped: the dense product (BENCHMARKS.md d) */
  double skip = 2.0 * T * ((double) Bm * K - (double) d->total) * N;   /* per product */
  psm_dropout_flops_skipped += skip * (y->grad ? 1 + !!w->grad + !!x->grad : 1);
  const float *wp = psm_graph_packed (g, w->data, K, N, FALSE);
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

/* psm_linear's and linear_bf16's node: W^T packed for dx (or NULL), W's deferred gradient
 * (or NULL) */
typedef struct {
  const float *wtp;
  PsmDeferredWeight *dw;
} LinearSaved;

/* ---- y = x W + b in bfloat16 (train.precision bf16) ----
 * x W on x rounded and W packed rounded once an update; the backward's dx
 * = dy W^T on W^T packed the same way (in the forward, while W is known
 * constant) and dW += x^T dy on both rounded for the call; every sum in
 * single precision, on AMX tiles where the CPU has them (ops/bf16.c). A
 * locked dropout's zeros are products like any other here: on AMX the
 * dense product costs less than the kept units' gathers and packings. */
static gboolean
linear_bf16 (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, PsmTensor *y, PsmDeferredWeight *dw)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const void *wp = psm_graph_bf16_train_weight (g, w->data, K, N, FALSE);
  if (!wp)
    return FALSE;
  psm_gemm_bf16 (R, N, K, x->data, K, wp, b ? b->data : NULL, FALSE, y->data, N);
  PsmTensor *in[3] = { x, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR_BF16, y, 3, in);
  if (nd) {
    LinearSaved *sv = psm_graph_alloc (g, sizeof *sv);
    sv->wtp = x->grad ? psm_graph_bf16_train_weight (g, w->data, N, K, TRUE) : NULL;
    sv->dw = dw;
    nd->saved = sv;
  }
  return TRUE;
}

void
psm_linear_bf16_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const LinearSaved *sv = n->saved;
  psm_linear_bf16_grads (R, K, N, x->data, y->grad, sv->wtp, sv->wtp ? x->grad : NULL, sv->dw ? NULL : w->grad,
                         b ? b->grad : NULL);
  if (sv->dw && w->grad) {
    PsmDeferredRows r = { x->data, y->grad, R };
    g_array_append_val (sv->dw->rows, r);
  }
}

/* ---- log softmax (x W + b) picked at the targets, bf16 training ----
 * The forward stores the scores z = x W + b (products as linear_bf16's)
 * and each row's log-sum-exp, and returns z[r, t_r] - lse_r. The scores
 * have no gradient tensor: the backward makes dz = d_r (e_{t_r} -
 * exp (z_r - lse_r)) as it rounds dz for dz W^T and x^T dz (on AMX a
 * row's band of columns at a time, never stored whole), where
 * the two ops would zero dz, add pick_log_softmax's gradient into it and
 * read it back to round it: at the 2 x 650 LM's 3,200 x 10,000 scores,
 * three passes over 128 MB an update fewer (BENCHMARKS.md d). */
typedef struct {
  float *z, *lse;
  int32_t *t;
  const void *wtp;   /* W^T packed for dx (NULL without x's gradient) */
  gboolean fp32;     /* linear_pick_fp32's: z single precision, W in w */
  const float *wp;   /* fp32: W packed, when z was made on the packed path */
  gboolean dz;       /* fp32: z holds its gradient now (the backward ran) */
} PickSaved;

/* The fused op's output y [R, 1], and (pick_finish) the rest of its
 * forward once the scores z [R, N] are made: each row's log-sum-exp and
 * pick, the node and what its backward reads (wtp: W^T packed for dx, or
 * NULL; fp32 and wp as PickSaved's). */
static PsmTensor *
pick_out (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b)
{
  PsmTensor *in[3] = { x, w, b };
  int shape[2] = { psm_tensor_rows (x), 1 };
  return psm_op_out (g, 2, shape, 3, in);
}

static PsmTensor *
pick_finish (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, PsmTensor *y, float *z, const int32_t *t,
             const void *wtp, gboolean fp32, const float *wp)
{
  int R = psm_tensor_rows (x), N = w->shape[1];
  float *lse = psm_graph_alloc (g, (size_t) MAX (R, 1) * sizeof (float));
#pragma omp parallel for if ((size_t) R * N > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    const float *zr = z + (size_t) r * N;
    lse[r] = psm_fast_logsumexpf (zr, N);
    y->data[r] = t[r] >= 0 ? zr[t[r]] - lse[r] : -INFINITY;
  }
  PsmTensor *in[3] = { x, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR_PICK_LOG_SOFTMAX, y, 3, in);
  if (nd) {
    PickSaved *sv = psm_graph_alloc (g, sizeof *sv);
    sv->z = z;
    sv->lse = lse;
    sv->t = psm_graph_dup (g, t, (size_t) R * sizeof (int32_t));
    sv->wtp = wtp;
    sv->fp32 = fp32;
    sv->wp = wp;
    sv->dz = FALSE;
    nd->saved = sv;
  }
  return y;
}

static PsmTensor *
linear_pick_bf16 (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *t)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const int32_t *ids;
  if (R > PSM_PACKED_MAX_ROWS && psm_graph_lookup_of (g, x->data, R, &ids))
    return NULL;   /* embedding_linear's case: psm_linear's own */
  const void *wp = psm_graph_bf16_train_weight (g, w->data, K, N, FALSE);
  if (!wp)
    return NULL;
  for (int r = 0; r < R; r++)
    g_return_val_if_fail (t[r] < N, NULL);
  PsmTensor *y = pick_out (g, x, w, b);
  float *z = psm_graph_alloc (g, (size_t) MAX (R, 1) * N * sizeof (float));
  psm_gemm_bf16 (R, N, K, x->data, K, wp, b ? b->data : NULL, FALSE, z, N);
  return pick_finish (g, x, w, b, y, z, t, x->grad ? psm_graph_bf16_train_weight (g, w->data, N, K, TRUE) : NULL,
                      FALSE, NULL);
}

static void linear_store (int R, int K, int N, const float *x, const PsmTensor *w, const float *wp,
                          const PsmTensor *b, float *y);

/* ---- the same in single precision ----
 * z = x W + b as psm_linear makes it (the packed path or one sgemm), kept
 * without a gradient tensor; the backward writes dz = d_r (e_{t_r} -
 * exp (z_r - lse_r)) over z itself, in the pass that reads it, and runs
 * psm_linear's two products on it. The pair would zero a gradient as large
 * as z in the forward and add into it in the backward: at See et al.'s
 * 1,600 x 20,000 scores a step, 128 MB set to zero, read and written once
 * more (BENCHMARKS.md c). The same sums in the same order as the pair, so
 * the same results to the bit. Not for an embedding lookup's or a locked
 * dropout's x, whose psm_linear paths differ (NULL: the caller uses the
 * pair). */
static PsmTensor *
linear_pick_fp32 (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *t)
{
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const int32_t *ids;
  size_t period;
  if (R > PSM_PACKED_MAX_ROWS &&
      (psm_graph_lookup_of (g, x->data, R, &ids) || psm_graph_dropout_of (g, x->data, x->n, &period)))
    return NULL;
  for (int r = 0; r < R; r++)
    g_return_val_if_fail (t[r] < N, NULL);
  PsmTensor *y = pick_out (g, x, w, b);
  gboolean packed = use_packed (g, R, w);
  float *z = psm_graph_alloc (g, (size_t) MAX (R, 1) * N * sizeof (float));
  const float *wp = packed ? psm_graph_packed (g, w->data, K, N, FALSE) : NULL;
  linear_store (R, K, N, x->data, w, wp, b, z);
  return pick_finish (g, x, w, b, y, z, t, packed && x->grad ? psm_graph_packed (g, w->data, N, K, TRUE) : NULL, TRUE,
                      wp);
}

static void
linear_pick_fp32_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  PickSaved *sv = n->saved;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  float *z = sv->z;
  const float *d = n->out->grad;
  if (sv->dz)   /* a second backward over the graph: the scores again */
    linear_store (R, K, N, x->data, w, sv->wp, b, z);
  sv->dz = TRUE;
#pragma omp parallel for if ((size_t) R * N > 100000) schedule (static)
  for (int r = 0; r < R; r++) {
    float *restrict zr = z + (size_t) r * N;
    int tr = sv->t[r];
    if (tr < 0 || d[r] == 0.0f) {
      memset (zr, 0, N * sizeof (float));
      continue;
    }
    float dr = d[r], l = sv->lse[r];
#pragma omp simd
    for (int j = 0; j < N; j++)
      zr[j] = 0.0f - dr * psm_fast_expf (zr[j] - l);
    zr[tr] += dr;
  }
  if (x->grad && sv->wtp)
    psm_gemm_packed (R, K, N, z, N, sv->wtp, NULL, TRUE, x->grad, K);
  else if (x->grad)
    psm_gemm (FALSE, TRUE, R, K, N, 1.0f, z, N, w->data, N, 1.0f, x->grad, K);
  if (w->grad)
    psm_gemm (TRUE, FALSE, K, N, R, 1.0f, x->data, K, z, N, 1.0f, w->grad, N);
  if (b && b->grad)
    psm_colsum_add (R, N, z, b->grad);
}

void
psm_linear_pick_log_softmax_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
  const PickSaved *sv = n->saved;
  if (sv->fp32) {
    linear_pick_fp32_backward (n);
    return;
  }
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  psm_linear_bf16_pick_grads (R, K, N, x->data, sv->z, sv->lse, sv->t, n->out->grad, sv->wtp,
                              sv->wtp ? x->grad : NULL, w->grad, b ? b->grad : NULL);
}

PsmTensor *
psm_linear_pick_log_softmax (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b, const int32_t *targets)
{
  g_return_val_if_fail (x && x->ndim >= 1 && w && w->ndim == 2 && targets, NULL);
  g_return_val_if_fail (w->shape[0] == psm_tensor_cols (x) && (!b || (int) b->n == w->shape[1]), NULL);
  if ((x->grad || w->grad) && psm_graph_grad_enabled (g)) {
    PsmTensor *y = psm_graph_bf16_train (g) ? linear_pick_bf16 (g, x, w, b, targets)
                                            : linear_pick_fp32 (g, x, w, b, targets);
    if (y)
      return y;
  }
  return psm_pick_log_softmax (g, psm_linear (g, x, w, b), targets);
}

gboolean psm_defer_weights = TRUE;

/* The deferred weight gradient's node (psm-private.h): the noted rows of x
 * and dy stacked, in the order of the steps' backward, and dW += X^T DY. */
void
psm_defer_weight_backward (PsmNode *nd)
{
  PsmDeferredWeight *d = nd->saved;
  int S = (int) d->rows->len, K = d->K, N = d->N;
  if (S == 0)
    return;
  const PsmDeferredRows *r = (const PsmDeferredRows *) (void *) d->rows->data;
  size_t *at = g_new (size_t, S + 1);
  at[0] = 0;
  for (int s = 0; s < S; s++)
    at[s + 1] = at[s] + r[s].R;
  size_t M = at[S];
  float *X = psm_xmalloc (MAX (M, 1) * K * sizeof (float), "deferred weight gradients");
  float *DY = psm_xmalloc (MAX (M, 1) * N * sizeof (float), "deferred weight gradients");
#pragma omp parallel for if (M * (size_t) (K + N) >= 262144) schedule (static)
  for (int s = 0; s < S; s++) {
    memcpy (X + at[s] * K, r[s].x, (size_t) r[s].R * K * sizeof (float));
    memcpy (DY + at[s] * N, r[s].dy, (size_t) r[s].R * N * sizeof (float));
  }
  if (d->bf16)
    psm_gemm_bf16_op (TRUE, FALSE, K, N, (int) M, X, K, DY, N, TRUE, d->grad, N);
  else
    psm_gemm (TRUE, FALSE, K, N, (int) M, 1.0f, X, K, DY, N, 1.0f, d->grad, N);
  free (X);
  free (DY);
  g_free (at);
  g_array_set_size (d->rows, 0);
}

/* y = x W + b in single precision: on the packed path (wp: W packed, or
 * NULL) with the bias added as each block is stored, or one sgemm over rows
 * holding the bias */
static void
linear_store (int R, int K, int N, const float *x, const PsmTensor *w, const float *wp, const PsmTensor *b, float *y)
{
  if (wp) {
    psm_gemm_packed (R, N, K, x, K, wp, b ? b->data : NULL, FALSE, y, N);
    return;
  }
  if (b) {
#pragma omp parallel for if ((long) R * N >= 65536) schedule (static)
    for (int r = 0; r < R; r++)
      memcpy (y + (size_t) r * N, b->data, N * sizeof (float));
  }
  psm_gemm (FALSE, FALSE, R, N, K, 1.0f, x, K, w->data, N, b ? 1.0f : 0.0f, y, N);
}

PsmTensor *
psm_linear (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b)
{
  g_return_val_if_fail (x->ndim >= 1, NULL);   /* y keeps x's leading dims */
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x);
  g_return_val_if_fail (w->ndim == 2 && w->shape[0] == K, NULL);
  int N = w->shape[1];
  g_return_val_if_fail (!b || (int) b->n == N, NULL);
  PsmTensor *in[3] = { x, w, b };
  int shape[PSM_MAX_DIMS];
  memcpy (shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = N;
  /* a decoder step's product: W's gradient deferred (psm-private.h); first,
   * so that the node it records comes before this product's */
  gboolean bf = (x->grad || w->grad) && psm_graph_bf16_train (g);
  PsmDeferredWeight *dw = R <= PSM_PACKED_MAX_ROWS && w->grad && psm_graph_is_const (g, w->data)
                          ? psm_graph_deferred_weight (g, w, bf) : NULL;
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 3, in);
  gboolean packed = use_packed (g, R, w);
  const int32_t *ids;
  PsmTensor *table = R > PSM_PACKED_MAX_ROWS ? psm_graph_lookup_of (g, x->data, R, &ids) : NULL;
  if (table && psm_tensor_cols (table) == K && embedding_linear (g, x, table, ids, w, b, y))
    return y;
  if (bf && linear_bf16 (g, x, w, b, y, dw))
    return y;
  if (bf)
    dw = NULL;   /* the fp32 product after all: its own dW (dw stays empty) */
  size_t period;
  const float *dm = R > PSM_PACKED_MAX_ROWS ? psm_graph_dropout_of (g, x->data, x->n, &period) : NULL;
  if (dm && dropout_linear (g, x, dm, period, w, b, y))
    return y;
  const void *wb = psm_graph_bf16_weight (g, w->data, K, N, x->grad || w->grad);
  if (wb)
    psm_gemm_bf16 (R, N, K, x->data, K, wb, b ? b->data : NULL, FALSE, y->data, N);
  else
    linear_store (R, K, N, x->data, w, packed ? psm_graph_packed (g, w->data, K, N, FALSE) : NULL, b, y->data);
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR, y, 3, in);
  if (nd && ((packed && x->grad) || dw)) {
    LinearSaved *sv = psm_graph_alloc (g, sizeof *sv);
    /* dx = dy W^T on W^T packed (valid until the reset) */
    sv->wtp = packed && x->grad ? psm_graph_packed (g, w->data, N, K, TRUE) : NULL;
    sv->dw = dw;
    nd->saved = sv;
  }
  return y;
}

void
psm_linear_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  const LinearSaved *sv = n->saved;
  if (x->grad && sv && sv->wtp)
    psm_gemm_packed (R, K, N, y->grad, N, sv->wtp, NULL, TRUE, x->grad, K);
  else if (x->grad)
    psm_gemm (FALSE, TRUE, R, K, N, 1.0f, y->grad, N, w->data, N, 1.0f, x->grad, K);
  if (w->grad && sv && sv->dw) {
    PsmDeferredRows r = { x->data, y->grad, R };
    g_array_append_val (sv->dw->rows, r);
  } else if (w->grad) {
    psm_gemm (TRUE, FALSE, K, N, R, 1.0f, x->data, K, y->grad, N, 1.0f, w->grad, N);
  }
  if (b && b->grad)
    psm_colsum_add (R, N, y->grad, b->grad);
}

void
psm_colsum_add (int R, int C, const float *restrict x, float *restrict out)
{
  /* Column blocks over the threads when there is enough work; each thread
   * adds its rows in order, so the result does not depend on the split. */
#pragma omp parallel for if ((long) R * C >= 65536) schedule (static)
  for (int j0 = 0; j0 < C; j0 += 256) {
    int j1 = MIN (C, j0 + 256);
    for (int r = 0; r < R; r++) {
      const float *xr = x + (size_t) r * C;
#pragma omp simd
      for (int j = j0; j < j1; j++)
        out[j] += xr[j];
    }
  }
}
