/* gather.c — embedding lookup, row gather, per-row pick, concat, slice,
 * transpose of the two leading dims.
 *   embedding:   y[i] = W[id_i];          dW[id_i] += dy[i]   (scatter-add)
 *   gather_rows: y[i] = x[r_i];           dx[r_i] += dy[i]
 *   scatter_rows: y[r_i] = x[i], else 0;  dx[i] += dy[r_i]
 *   gather_cols: y[.., j] = x[.., c_j];   dx[.., c_j] += dy[.., j]
 *   pick:        y[i] = x[i, k_i];        dx[i, k_i] += dy[i]
 *   concat:      y = [a | b];             da += dy[:, :Ca], db += dy[:, Ca:]
 *   concat_steps: y = [a; b] (leading dim); da += dy[:Ta], db += dy[Ta:]
 *   slice:       y = x[:, s:s+L];         dx[:, s:s+L] += dy
 *   transpose01: y[j, i] = x[i, j];       dx[i, j] += dy[j, i] */
#include "config.h"
#include <math.h>
#include <string.h>
#include "ops/ops-internal.h"

/* Copies of rows over the threads from 64k floats (256 KB) on: a decoding
 * step's carry, concatenations and slices are 1-4 MB at 640 hypotheses
 * (the 2k read-again decoder, bf16, eval.batch 640: 0.0040-0.0041 ->
 * 0.0037-0.0038 s a sentence with these and the core's carry copy). */
#define COPY_PAR(R, C) ((long) (R) * (C) >= 65536 && (R) > 1)

PsmTensor *
psm_embedding (PsmGraph *g, PsmTensor *table, const int32_t *ids, int n)
{
  int V = table->shape[0], E = psm_tensor_cols (table);
  PsmTensor *in[1] = { table };
  int shape[2] = { n, E };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  for (int i = 0; i < n; i++)
    g_return_val_if_fail (ids[i] >= 0 && ids[i] < V, NULL);
#pragma omp parallel for if (COPY_PAR (n, E)) schedule (static)
  for (int i = 0; i < n; i++)
    memcpy (y->data + (size_t) i * E, table->data + (size_t) ids[i] * E, E * sizeof (float));
  PsmNode *nd = psm_graph_record (g, PSM_OP_EMBEDDING, y, 1, in);
  const int32_t *kept = psm_graph_dup (g, ids, n * sizeof (int32_t));
  if (nd)
    nd->aux[0] = kept;
  psm_graph_note_lookup (g, y->data, table, kept, n);   /* for psm_linear of y */
  return y;
}

void
psm_embedding_backward (PsmNode *nd)
{
  const int32_t *ids = nd->aux[0];
  PsmTensor *w = nd->in[0], *y = nd->out;
  int n = y->shape[0], E = y->shape[1];
  for (int i = 0; i < n; i++) {
    float *dw = w->grad + (size_t) ids[i] * E;
    const float *dy = y->grad + (size_t) i * E;
    for (int j = 0; j < E; j++)
      dw[j] += dy[j];
  }
}

PsmTensor *
psm_gather_rows (PsmGraph *g, PsmTensor *x, const int32_t *rows, int n)
{
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  PsmTensor *in[1] = { x };
  int shape[2] = { n, C };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  for (int i = 0; i < n; i++)
    g_return_val_if_fail (rows[i] >= 0 && rows[i] < R, NULL);
#pragma omp parallel for if (COPY_PAR (n, C)) schedule (static)
  for (int i = 0; i < n; i++)
    memcpy (y->data + (size_t) i * C, x->data + (size_t) rows[i] * C, C * sizeof (float));
  PsmNode *nd = psm_graph_record (g, PSM_OP_GATHER_ROWS, y, 1, in);
  if (nd)
    nd->aux[0] = psm_graph_dup (g, rows, n * sizeof (int32_t));
  return y;
}

void
psm_gather_rows_backward (PsmNode *nd)
{
  const int32_t *rows = nd->aux[0];
  int n = nd->out->shape[0], C = nd->out->shape[1];
  for (int i = 0; i < n; i++) {
    float *dx = nd->in[0]->grad + (size_t) rows[i] * C;
    const float *dy = nd->out->grad + (size_t) i * C;
    for (int j = 0; j < C; j++)
      dx[j] += dy[j];
  }
}

int
psm_nonzero_rows (PsmGraph *g, const float *w, int R, const int32_t **rows)
{
  *rows = NULL;
  int n = 0;
  for (int r = 0; w && r < R; r++)
    n += w[r] != 0.0f;
  if (!w || n == R || n == 0)
    return R;
  int32_t *idx = psm_graph_alloc (g, (size_t) n * sizeof (int32_t));
  for (int r = 0, i = 0; r < R; r++)
    if (w[r] != 0.0f)
      idx[i++] = r;
  *rows = idx;
  return n;
}

void *
psm_gather_elems (PsmGraph *g, const void *src, size_t elem, const int32_t *rows, int n)
{
  char *out = psm_graph_alloc (g, MAX (n, 1) * elem);
  for (int i = 0; i < n; i++)
    memcpy (out + i * elem, (const char *) src + (size_t) rows[i] * elem, elem);
  return out;
}

PsmTensor *
psm_scatter_rows (PsmGraph *g, PsmTensor *x, const int32_t *rows, int R)
{
  int n = psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int i = 0; i < n; i++)
    g_return_val_if_fail (rows[i] >= 0 && rows[i] < R && (i == 0 || rows[i] > rows[i - 1]), NULL);
  PsmTensor *in[1] = { x };
  int shape[2] = { R, C };
  PsmTensor *y = psm_op_out (g, 2, shape, 1, in);
  memset (y->data, 0, y->n * sizeof (float));
  for (int i = 0; i < n; i++)
    memcpy (y->data + (size_t) rows[i] * C, x->data + (size_t) i * C, C * sizeof (float));
  PsmNode *nd = psm_graph_record (g, PSM_OP_SCATTER_ROWS, y, 1, in);
  if (nd)
    nd->aux[0] = psm_graph_dup (g, rows, n * sizeof (int32_t));
  return y;
}

void
psm_scatter_rows_backward (PsmNode *nd)
{
  const int32_t *rows = nd->aux[0];
  PsmTensor *x = nd->in[0];
  int n = psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int i = 0; i < n; i++) {
    float *dx = x->grad + (size_t) i * C;
    const float *dy = nd->out->grad + (size_t) rows[i] * C;
    for (int j = 0; j < C; j++)
      dx[j] += dy[j];
  }
}

PsmTensor *
psm_gather_cols (PsmGraph *g, PsmTensor *x, const int32_t *cols, int n)
{
  g_return_val_if_fail (x && x->ndim >= 1 && n >= 1, NULL);
  int R = x->ndim == 1 ? 1 : psm_tensor_rows (x), C = psm_tensor_cols (x);
  for (int j = 0; j < n; j++)
    g_return_val_if_fail (cols[j] >= 0 && cols[j] < C, NULL);
  PsmTensor *in[1] = { x };
  int shape[PSM_MAX_DIMS];
  memcpy (shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = n;
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 1, in);
  for (int r = 0; r < R; r++) {
    const float *xr = x->data + (size_t) r * C;
    float *yr = y->data + (size_t) r * n;
    for (int j = 0; j < n; j++)
      yr[j] = xr[cols[j]];
  }
  PsmNode *nd = psm_graph_record (g, PSM_OP_GATHER_COLS, y, 1, in);
  if (nd)
    nd->aux[0] = psm_graph_dup (g, cols, n * sizeof (int32_t));
  return y;
}

void
psm_gather_cols_backward (PsmNode *nd)
{
  const int32_t *cols = nd->aux[0];
  PsmTensor *x = nd->in[0];
  int n = psm_tensor_cols (nd->out), C = psm_tensor_cols (x), R = x->ndim == 1 ? 1 : psm_tensor_rows (x);
  if (!x->grad)
    return;
  for (int r = 0; r < R; r++) {
    float *dx = x->grad + (size_t) r * C;
    const float *dy = nd->out->grad + (size_t) r * n;
    for (int j = 0; j < n; j++)
      dx[cols[j]] += dy[j];
  }
}

PsmTensor *
psm_pick (PsmGraph *g, PsmTensor *x, const int32_t *idx)
{
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  PsmTensor *in[1] = { x };
  int shape[1] = { R };
  PsmTensor *y = psm_op_out (g, 1, shape, 1, in);
  for (int i = 0; i < R; i++) {
    g_return_val_if_fail (idx[i] < C, NULL);
    y->data[i] = idx[i] >= 0 ? x->data[(size_t) i * C + idx[i]] : 0.0f;
  }
  PsmNode *nd = psm_graph_record (g, PSM_OP_PICK, y, 1, in);
  if (nd)
    nd->aux[0] = psm_graph_dup (g, idx, R * sizeof (int32_t));
  return y;
}

void
psm_pick_backward (PsmNode *nd)
{
  const int32_t *idx = nd->aux[0];
  int R = nd->out->shape[0], C = psm_tensor_cols (nd->in[0]);
  for (int i = 0; i < R; i++)
    if (idx[i] >= 0)
      nd->in[0]->grad[(size_t) i * C + idx[i]] += nd->out->grad[i];
}

PsmTensor *
psm_concat (PsmGraph *g, PsmTensor *a, PsmTensor *b)
{
  g_return_val_if_fail (a->ndim >= 1 && b->ndim >= 1, NULL);   /* concat along the last dim */
  int R = psm_tensor_rows (a), Ca = psm_tensor_cols (a), Cb = psm_tensor_cols (b);
  g_return_val_if_fail (psm_tensor_rows (b) == R, NULL);
  PsmTensor *in[2] = { a, b };
  int shape[PSM_MAX_DIMS];
  memcpy (shape, a->shape, sizeof shape);
  shape[a->ndim - 1] = Ca + Cb;
  PsmTensor *y = psm_op_out (g, a->ndim, shape, 2, in);
#pragma omp parallel for if (COPY_PAR (R, Ca + Cb)) schedule (static)
  for (int r = 0; r < R; r++) {
    memcpy (y->data + (size_t) r * (Ca + Cb), a->data + (size_t) r * Ca, Ca * sizeof (float));
    memcpy (y->data + (size_t) r * (Ca + Cb) + Ca, b->data + (size_t) r * Cb, Cb * sizeof (float));
  }
  psm_graph_record (g, PSM_OP_CONCAT, y, 2, in);
  return y;
}

void
psm_concat_backward (PsmNode *nd)
{
  PsmTensor *a = nd->in[0], *b = nd->in[1];
  int R = psm_tensor_rows (a), Ca = psm_tensor_cols (a), Cb = psm_tensor_cols (b);
  for (int r = 0; r < R; r++) {
    const float *dy = nd->out->grad + (size_t) r * (Ca + Cb);
    if (a->grad)
      for (int j = 0; j < Ca; j++)
        a->grad[(size_t) r * Ca + j] += dy[j];
    if (b->grad)
      for (int j = 0; j < Cb; j++)
        b->grad[(size_t) r * Cb + j] += dy[Ca + j];
  }
}

PsmTensor *
psm_concat_steps (PsmGraph *g, PsmTensor *a, PsmTensor *b)
{
  g_return_val_if_fail (a && b && a->ndim >= 1 && a->ndim == b->ndim, NULL);
  for (int d = 1; d < a->ndim; d++)
    g_return_val_if_fail (a->shape[d] == b->shape[d], NULL);
  PsmTensor *in[2] = { a, b };
  int shape[PSM_MAX_DIMS];
  memcpy (shape, a->shape, sizeof shape);
  shape[0] = a->shape[0] + b->shape[0];
  PsmTensor *y = psm_op_out (g, a->ndim, shape, 2, in);
  memcpy (y->data, a->data, a->n * sizeof (float));
  memcpy (y->data + a->n, b->data, b->n * sizeof (float));
  psm_graph_record (g, PSM_OP_CONCAT_STEPS, y, 2, in);
  return y;
}

void
psm_concat_steps_backward (PsmNode *nd)
{
  PsmTensor *a = nd->in[0], *b = nd->in[1];
  const float *dy = nd->out->grad;
  if (a->grad)
    for (size_t i = 0; i < a->n; i++)
      a->grad[i] += dy[i];
  if (b->grad)
    for (size_t i = 0; i < b->n; i++)
      b->grad[i] += dy[a->n + i];
}

PsmTensor *
psm_slice (PsmGraph *g, PsmTensor *x, int start, int len)
{
  g_return_val_if_fail (x->ndim >= 1, NULL);   /* slices the last dim */
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  g_return_val_if_fail (start >= 0 && len >= 0 && len <= C - start, NULL);
  PsmTensor *in[1] = { x };
  int shape[PSM_MAX_DIMS];
  memcpy (shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = len;
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 1, in);
#pragma omp parallel for if (COPY_PAR (R, len)) schedule (static)
  for (int r = 0; r < R; r++)
    memcpy (y->data + (size_t) r * len, x->data + (size_t) r * C + start, len * sizeof (float));
  PsmNode *nd = psm_graph_record (g, PSM_OP_SLICE, y, 1, in);
  if (nd)
    nd->iarg[0] = start;
  return y;
}

void
psm_slice_backward (PsmNode *nd)
{
  PsmTensor *x = nd->in[0];
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x), len = psm_tensor_cols (nd->out);
  int start = nd->iarg[0];
  for (int r = 0; r < R; r++)
    for (int j = 0; j < len; j++)
      x->grad[(size_t) r * C + start + j] += nd->out->grad[(size_t) r * len + j];
}

PsmTensor *
psm_transpose01 (PsmGraph *g, PsmTensor *x)
{
  g_return_val_if_fail (x->ndim == 2 || x->ndim == 3, NULL);
  int D0 = x->shape[0], D1 = x->shape[1], C = x->ndim == 3 ? x->shape[2] : 1;
  PsmTensor *in[1] = { x };
  int shape[3] = { D1, D0, C };
  PsmTensor *y = psm_op_out (g, x->ndim, shape, 1, in);
  for (int i = 0; i < D0; i++)
    for (int j = 0; j < D1; j++)
      memcpy (y->data + ((size_t) j * D0 + i) * C, x->data + ((size_t) i * D1 + j) * C, C * sizeof (float));
  psm_graph_record (g, PSM_OP_TRANSPOSE01, y, 1, in);
  return y;
}

void
psm_transpose01_backward (PsmNode *nd)
{
  PsmTensor *x = nd->in[0];
  int D0 = x->shape[0], D1 = x->shape[1], C = x->ndim == 3 ? x->shape[2] : 1;
  for (int i = 0; i < D0; i++)
    for (int j = 0; j < D1; j++) {
      float *dx = x->grad + ((size_t) i * D1 + j) * C;
      const float *dy = nd->out->grad + ((size_t) j * D0 + i) * C;
      for (int k = 0; k < C; k++)
        dx[k] += dy[k];
    }
}
