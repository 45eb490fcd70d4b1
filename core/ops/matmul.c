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
 *   db += sum_k dU[k],  dE[u_k] += (dU W^T)[k]. */
#include "config.h"
#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <string.h>
#include "psm-private.h"

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

/* Whether y = x W with this x and W takes the packed path: few rows, a
 * parameter as W, and a build with the packed kernel. */
static gboolean
use_packed (PsmGraph *g, int rows, const PsmTensor *w)
{
  return PSM_PACK_FAST && rows <= PSM_PACKED_MAX_ROWS && psm_graph_is_const (g, w->data);
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
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 3, in);
  gboolean packed = use_packed (g, R, w);
  const int32_t *ids;
  PsmTensor *table = R > PSM_PACKED_MAX_ROWS ? psm_graph_lookup_of (g, x->data, R, &ids) : NULL;
  if (table && psm_tensor_cols (table) == K && embedding_linear (g, x, table, ids, w, b, y))
    return y;
  if (packed) {   /* the bias added as each block is stored */
    psm_gemm_packed (R, N, K, x->data, K, psm_graph_packed (g, w->data, K, N, FALSE), b ? b->data : NULL, FALSE,
                     y->data, N);
  } else {
    if (b) {
#pragma omp parallel for if ((long) R * N >= 65536) schedule (static)
      for (int r = 0; r < R; r++)
        memcpy (y->data + (size_t) r * N, b->data, N * sizeof (float));
    }
    psm_gemm (FALSE, FALSE, R, N, K, 1.0f, x->data, K, w->data, N, b ? 1.0f : 0.0f, y->data, N);
  }
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR, y, 3, in);
  if (nd && packed && x->grad)   /* dx = dy W^T on W^T packed (valid until the reset) */
    nd->saved = (void *) psm_graph_packed (g, w->data, N, K, TRUE);
  return y;
}

void
psm_linear_backward (PsmNode *n)
{
  PsmTensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out;
  int R = psm_tensor_rows (x), K = psm_tensor_cols (x), N = w->shape[1];
  if (x->grad && n->saved)
    psm_gemm_packed (R, K, N, y->grad, N, n->saved, NULL, TRUE, x->grad, K);
  else if (x->grad)
    psm_gemm (FALSE, TRUE, R, K, N, 1.0f, y->grad, N, w->data, N, 1.0f, x->grad, K);
  if (w->grad)
    psm_gemm (TRUE, FALSE, K, N, R, 1.0f, x->data, K, y->grad, N, 1.0f, w->grad, N);
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
