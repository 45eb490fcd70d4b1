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
 * The same of a locked dropout's output is linear-dropout.c's; log softmax
 * (x W + b) picked at the targets, linear-pick.c's. */
#include "config.h"
#include <cblas.h>
#include <omp.h>
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

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
  /* its own product: decode.precision bf16 or one sgemm */
  PsmWeightPlan p = psm_weight_plan (g, w, K, N, nu, y->grad != NULL, PSM_PLAN_NO_PACKED);
  psm_weight_gemm (g, &p, nu, xu, K, NULL, b != NULL, u, N);
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
 * single precision, on AMX tiles where the CPU has them (kernels/bf16.c). A
 * locked dropout's zeros are products like any other here: on AMX the
 * dense product costs less than the kept units' gathers and packings. */
static void
linear_bf16 (PsmGraph *g, PsmWeightPlan *p, PsmTensor *x, PsmTensor *w, PsmTensor *b, PsmTensor *y,
             PsmDeferredWeight *dw)
{
  psm_weight_gemm (g, p, psm_tensor_rows (x), x->data, p->K, b ? b->data : NULL, FALSE, y->data, p->n);
  PsmTensor *in[3] = { x, w, b };
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR_BF16, y, 3, in);
  if (nd) {
    LinearSaved *sv = psm_graph_alloc (g, sizeof *sv);
    sv->wtp = x->grad ? psm_weight_transposed (g, p) : NULL;
    sv->dw = dw;
    nd->saved = sv;
  }
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


/* The deferred weight gradient's node (ops-internal.h): the noted rows of x
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
  const int32_t *ids;
  PsmTensor *table = R > PSM_PACKED_MAX_ROWS ? psm_graph_lookup_of (g, x->data, R, &ids) : NULL;
  if (table && psm_tensor_cols (table) == K && embedding_linear (g, x, table, ids, w, b, y))
    return y;
  /* the product's path (tape-internal.h; W packed for it now), and a
   * decoder step's W gradient deferred (ops-internal.h), its node
   * recorded before this product's */
  PsmWeightPlan p = psm_weight_plan (g, w, K, N, R, x->grad || w->grad, PSM_PLAN_BF16_TRAIN | PSM_PLAN_DEFER);
  PsmDeferredWeight *dw = p.defer ? psm_graph_deferred_weight (g, w, p.path == PSM_WEIGHT_BF16_TRAIN) : NULL;
  if (p.path == PSM_WEIGHT_BF16_TRAIN) {
    linear_bf16 (g, &p, x, w, b, y, dw);
    return y;
  }
  size_t period;
  const float *dm = R > PSM_PACKED_MAX_ROWS ? psm_graph_dropout_of (g, x->data, x->n, &period) : NULL;
  if (dm && psm_dropout_linear_forward (g, x, dm, period, w, b, y))
    return y;
  psm_weight_gemm (g, &p, R, x->data, K, b ? b->data : NULL, FALSE, y->data, N);
  PsmNode *nd = psm_graph_record (g, PSM_OP_LINEAR, y, 3, in);
  gboolean packed_t = p.path == PSM_WEIGHT_PACKED && x->grad;
  if (nd && (packed_t || dw)) {
    LinearSaved *sv = psm_graph_alloc (g, sizeof *sv);
    /* dx = dy W^T on W^T packed (valid until the reset) */
    sv->wtp = packed_t ? psm_weight_transposed (g, &p) : NULL;
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
