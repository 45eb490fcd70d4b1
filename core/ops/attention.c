/* attention.c — context vector from attention weights.
 *   ctx[b] = sum_t a[b, t] v[t, b]          (a [B, T], v [T, B, H])
 *   da[b, t] += dctx[b] . v[t, b]           dv[t, b] += a[b, t] dctx[b] */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-private.h"

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
