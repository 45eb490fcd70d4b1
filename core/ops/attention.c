/* attention.c — context vector from attention weights (the fused additive
 * attention: additive.c), dot-product scores, the deferred values
 * gradient and the batch-major copies the attention reads.
 *   ctx[b] = sum_t a[b, t] v[t, b]          (a [B, T], v [T, B, H])
 *   da[b, t] += dctx[b] . v[t, b]           dv[t, b] += a[b, t] dctx[b] */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/ops-internal.h"

PsmTensor *
psm_attend (PsmGraph *g, PsmTensor *a, PsmTensor *v)
{
  g_return_val_if_fail (v->ndim == 3, NULL);
  int T = v->shape[0], B = v->shape[1], H = v->shape[2];
  g_return_val_if_fail (psm_tensor_rows (a) == B && psm_tensor_cols (a) == T, NULL);
  PsmTensor *in[2] = { a, v };
  int shape[2] = { B, H };
  PsmTensor *y = psm_op_out (g, 2, shape, 2, in);
  memset (y->data, 0, y->n * sizeof (float));
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      float w = a->data[(size_t) b * T + t];
      if (w == 0.0f)
        continue;
      const float *vr = v->data + ((size_t) t * B + b) * H;
      float *yr = y->data + (size_t) b * H;
      for (int j = 0; j < H; j++)
        yr[j] += w * vr[j];
    }
  psm_graph_record (g, PSM_OP_ATTEND, y, 2, in);
  return y;
}

void
psm_attend_backward (PsmNode *n)
{
  PsmTensor *a = n->in[0], *v = n->in[1], *y = n->out;
  int T = v->shape[0], B = v->shape[1], H = v->shape[2];
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      const float *vr = v->data + ((size_t) t * B + b) * H, *dy = y->grad + (size_t) b * H;
      if (a->grad) {
        double s = 0.0;
        for (int j = 0; j < H; j++)
          s += (double) dy[j] * vr[j];
        a->grad[(size_t) b * T + t] += (float) s;
      }
      if (v->grad) {
        float w = a->data[(size_t) b * T + t];
        float *dv = v->grad + ((size_t) t * B + b) * H;
        for (int j = 0; j < H; j++)
          dv[j] += w * dy[j];
      }
    }
}


/* The deferred values gradient (ops-internal.h): a node recorded right after
 * the values were made, so its backward runs after every attention over
 * them has noted its (a, dctx). Per example b, with S_b noted steps that
 * had row b (a step over R rows has rows 0 .. R - 1):
 * dH[:, b, :] += A_b^T C_b, A_b [S_b, T] the attention rows, C_b [S_b, H]
 * the context gradients (gathered contiguous first). */
void
psm_defer_values_grad (PsmGraph *g, PsmTensor *values)
{
  g_return_if_fail (values && values->ndim == 3);
  if (!values->grad || psm_graph_deferred_values (g, values->grad))
    return;
  PsmDeferredValues *d = psm_graph_add_deferred_values (g, values->grad);
  d->T = values->shape[0];
  d->B = values->shape[1];
  d->H = values->shape[2];
  PsmTensor *in[1] = { values };
  PsmTensor *alias = psm_tensor_view (g, values, 0, 3, values->shape);
  PsmNode *nd = psm_graph_record (g, PSM_OP_DEFER_VALUES, alias, 1, in);
  if (nd)
    nd->saved = d;
}

void
psm_defer_values_backward (PsmNode *nd)
{
  PsmDeferredValues *d = nd->saved;
  int S = (int) d->steps->len / 2, T = d->T, B = d->B, H = d->H;
  PsmTensor *values = nd->in[0];
  if (S == 0 || !values->grad)
    return;
  const float **p = (const float **) (void *) d->steps->data;
  const int *rows = (const int *) (void *) d->rows->data;
  float *At = psm_xmalloc ((size_t) S * T * sizeof (float), "attention gradients");
  float *C = psm_xmalloc ((size_t) S * H * sizeof (float), "attention gradients");
  for (int b = 0; b < B; b++) {
    int k = 0;
    for (int s = 0; s < S; s++) {
      if (b >= rows[s])
        continue;
      memcpy (At + (size_t) k * T, p[2 * s] + (size_t) b * T, T * sizeof (float));
      memcpy (C + (size_t) k * H, p[2 * s + 1] + (size_t) b * H, H * sizeof (float));
      k++;
    }
    if (k)
      psm_gemm (TRUE, FALSE, T, H, k, 1.0f, At, T, C, H, 1.0f, values->grad + (size_t) b * H, B * H);
  }
  free (At);
  free (C);
  g_array_set_size (d->steps, 0);
  g_array_set_size (d->rows, 0);
}

/* Batch-major copies (ops-internal.h): the node that makes x's [B, T, C]
 * copy, and whose backward adds the attention ops' gradient of the copy
 * into x's. A no-op outside a training graph (nothing would read the copy
 * back), for a tensor already copied, and with psm_graph_set_batch_major
 * (g, FALSE). */
void
psm_attention_batch_major (PsmGraph *g, PsmTensor *x)
{
  g_return_if_fail (x && x->ndim == 3);
  int T = x->shape[0], B = x->shape[1], C = x->shape[2];
  if (!x->grad || !psm_graph_grad_enabled (g) || !psm_graph_batch_major_on (g) ||
      psm_graph_batch_major (g, x->data, T, B, C))
    return;
  float *bm = psm_graph_alloc (g, (size_t) T * B * C * sizeof (float));
  uint16_t *bm16 = psm_graph_bf16_train (g) ? psm_graph_alloc (g, (size_t) T * B * C * sizeof (uint16_t)) : NULL;
#pragma omp parallel for if (B > 1 && (long) T * B * C >= 32768) schedule (static)
  for (int b = 0; b < B; b++)
    for (int i = 0; i < T; i++) {
      const float *src = x->data + ((size_t) i * B + b) * C;
      memcpy (bm + ((size_t) b * T + i) * C, src, C * sizeof (float));
      if (bm16)
        psm_bf16_round_bits (C, src, bm16 + ((size_t) b * T + i) * C);
    }
  /* recorded after the copy, so that a profile counts the copy as this op's */
  PsmTensor *in[1] = { x };
  PsmNode *nd = psm_graph_record (g, PSM_OP_BATCH_MAJOR, psm_tensor_view (g, x, 0, 3, x->shape), 1, in);
  if (!nd)
    return;
  PsmBatchMajor *e = psm_graph_add_batch_major (g, x->data);
  e->xgrad = x->grad;
  e->T = T;
  e->B = B;
  e->C = C;
  e->bm = bm;
  e->bm16 = bm16;
  nd->saved = e;
}

void
psm_batch_major_backward (PsmNode *nd)
{
  const PsmBatchMajor *e = nd->saved;
  PsmTensor *x = nd->in[0];
  if (!e->grad || !x->grad)
    return;   /* no op over the copy had a gradient to give */
  int T = e->T, B = e->B, C = e->C;
#pragma omp parallel for if ((long) T * B * C >= 32768) schedule (static)
  for (int i = 0; i < T; i++)
    for (int b = 0; b < B; b++) {
      float *restrict dx = x->grad + ((size_t) i * B + b) * C;
      const float *restrict d = e->grad + ((size_t) b * T + i) * C;
#pragma omp simd
      for (int j = 0; j < C; j++)
        dx[j] += d[j];
    }
}

/* ---- dot-product scores against the annotations (ABI 1.8) ----
 *   y[r, i] = q[r] . keys[i, r % Bi]        (keys [T, Bi, H], q [R, H])
 *   dq[r] += sum_i dy[r, i] keys[i, b]    dkeys[i, b] += sum_(r % Bi = b) dy[r, i] q[r] */
PsmTensor *
psm_dot_scores (PsmGraph *g, PsmTensor *keys, PsmTensor *q)
{
  g_return_val_if_fail (keys->ndim == 3 && psm_tensor_cols (q) == keys->shape[2], NULL);
  int T = keys->shape[0], Bi = keys->shape[1], H = keys->shape[2], R = psm_tensor_rows (q);
  g_return_val_if_fail (R % Bi == 0, NULL);
  PsmTensor *in[2] = { keys, q };
  int shape[2] = { R, T };
  PsmTensor *y = psm_op_out (g, 2, shape, 2, in);
  /* Over beams without gradients (R = Bi rows, G to an article): the G rows
   * of article b read its keys from the compact [T, Bi / G, H] copy, one
   * key for all G while it is in cache (as attn_forward_grouped). Each
   * score is the same dot product either way. */
  int G = 0;
  const float *Kc = y->grad || R != Bi ? NULL : psm_graph_repeat_of (g, keys->data, &G);
  if (Kc && G > 1 && Bi % G == 0) {
    int nB = Bi / G;
#pragma omp parallel for if (nB > 1 && PSM_ATTN_PAR (R, T, H)) schedule (static)
    for (int art = 0; art < nB; art++)
      for (int i = 0; i < T; i++) {
        const float *k = Kc + ((size_t) i * nB + art) * H;
        for (int r = art * G; r < (art + 1) * G; r++)
          y->data[(size_t) r * T + i] = psm_dotf (q->data + (size_t) r * H, k, H);
      }
  } else {
#pragma omp parallel for if (PSM_ATTN_PAR (R, T, H)) schedule (static)
    for (int r = 0; r < R; r++)
      for (int i = 0; i < T; i++)
        y->data[(size_t) r * T + i] =
          psm_dotf (q->data + (size_t) r * H, keys->data + ((size_t) i * Bi + r % Bi) * H, H);
  }
  psm_graph_record (g, PSM_OP_DOT_SCORES, y, 2, in);
  return y;
}

void
psm_dot_scores_backward (PsmNode *n)
{
  PsmTensor *keys = n->in[0], *q = n->in[1], *y = n->out;
  int T = keys->shape[0], Bi = keys->shape[1], H = keys->shape[2], R = psm_tensor_rows (q);
  for (int r = 0; r < R; r++) {
    const float *qr = q->data + (size_t) r * H;
    for (int i = 0; i < T; i++) {
      float d = y->grad[(size_t) r * T + i];
      if (d == 0.0f)
        continue;
      size_t kb = ((size_t) i * Bi + r % Bi) * H;
      if (q->grad) {
        float *dq = q->grad + (size_t) r * H;
        const float *k = keys->data + kb;
        for (int j = 0; j < H; j++)
          dq[j] += d * k[j];
      }
      if (keys->grad) {
        float *dk = keys->grad + kb;
        for (int j = 0; j < H; j++)
          dk[j] += d * qr[j];
      }
    }
  }
}
