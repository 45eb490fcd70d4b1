/* psm-weights.c — a graph's weights: which memory holds parameters (the
 * blocks psm_param registers, constant between a reset and the end of the
 * backward pass) and the packings of op(W) made from them, for the packed
 * single-precision kernel (psm_pack) and for bfloat16 (psm_bf16_pack and
 * psm_bf16_pack_op), each made once and kept until the next reset, or past
 * resets with keep (the decoding graph). Kept in a slot of the graph; the
 * graph itself knows nothing of packing. */
#include "config.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "tape/tape-internal.h"

typedef struct {
  const float *w;
  int K, n;
  gboolean tb, valid, bf16;   /* bf16: psm_bf16_pack's form */
  void *data;
} Packed;

typedef struct {
  const float *const_lo[4];   /* parameter blocks: [lo, hi) */
  const float *const_hi[4];
  int n_const;
  GArray *packed;             /* Packed */
  gboolean keep_packed;
  gboolean bf16;              /* psm_graph_set_bf16 */
  gboolean bf16_train;        /* psm_graph_set_bf16_train */
} Weights;

static void
weights_reset (PsmGraph *g, void *st)
{
  Weights *w = st;
  /* stale until asked for again, when they are packed anew into the same
   * memory (a fresh buffer a step cost page faults: a tenth of the PTB
   * model's softmax layer, BENCHMARKS.md d) */
  if (!w->keep_packed)
    psm_graph_stale_packed (g);
}

static void
weights_free (void *st)
{
  Weights *w = st;
  for (guint i = 0; w->packed && i < w->packed->len; i++)
    free (g_array_index (w->packed, Packed, i).data);
  if (w->packed)
    g_array_unref (w->packed);
}

static const PsmGraphSlotClass weights_slot = { sizeof (Weights), weights_reset, weights_free };

static Weights *
weights (PsmGraph *g)
{
  return psm_graph_slot (g, &weights_slot);
}

/* Read-only: NULL while nothing was set (every flag off, no parameters). */
static const Weights *
weights_get (const PsmGraph *g)
{
  return psm_graph_slot_get (g, &weights_slot);
}

void
psm_graph_stale_packed (PsmGraph *g)
{
  Weights *w = psm_graph_slot_get (g, &weights_slot);
  for (guint i = 0; w && w->packed && i < w->packed->len; i++)
    g_array_index (w->packed, Packed, i).valid = FALSE;
}

void
psm_graph_const_range (PsmGraph *g, const float *data, size_t n)
{
  Weights *w = weights (g);
  for (int i = 0; i < w->n_const; i++)
    if (w->const_lo[i] == data)
      return;
  if (w->n_const == G_N_ELEMENTS (w->const_lo))
    return;   /* more parameter blocks than tracked: they just stay unpacked */
  w->const_lo[w->n_const] = data;
  w->const_hi[w->n_const++] = data + n;
}

gboolean
psm_graph_is_const (PsmGraph *g, const float *data)
{
  const Weights *w = weights_get (g);
  for (int i = 0; w && i < w->n_const; i++)
    if (data >= w->const_lo[i] && data < w->const_hi[i])
      return TRUE;
  return FALSE;
}

/* The entry of g's packings for op(W) in the given form, made if new
 * (*fresh: it must be packed). */
static Packed *
packed_entry (PsmGraph *g, const float *w, int K, int n, gboolean tb, gboolean bf16, gboolean *fresh)
{
  Weights *ws = weights (g);
  if (!ws->packed)
    ws->packed = g_array_new (FALSE, FALSE, sizeof (Packed));
  Packed *pk = NULL;
  for (guint i = 0; i < ws->packed->len && !pk; i++) {
    Packed *e = &g_array_index (ws->packed, Packed, i);
    if (e->w == w && e->K == K && e->n == n && e->tb == tb && e->bf16 == bf16)
      pk = e;
  }
  *fresh = !pk || !pk->valid;
  if (!pk) {
    size_t bytes = bf16 ? psm_bf16_packed_bytes (K, n) : psm_packed_floats (K, n) * sizeof (float);
    Packed e = { w, K, n, tb, FALSE, bf16, psm_xaligned (bytes, "packed weights") };
    g_array_append_val (ws->packed, e);
    pk = &g_array_index (ws->packed, Packed, ws->packed->len - 1);
  }
  pk->valid = TRUE;
  return pk;
}

const float *
psm_graph_packed (PsmGraph *g, const float *w, int K, int n, gboolean tb)
{
  gboolean fresh;
  Packed *pk = packed_entry (g, w, K, n, tb, FALSE, &fresh);
  /* large ones over the threads, panels apart */
  float *out = pk->data;
  if (fresh) {
#pragma omp parallel if ((long) K * n >= (1L << 20) && !omp_in_parallel ())
    psm_pack_shared (K, n, w, tb ? K : n, tb, out);
  }
  return out;
}

/* op(W) (K x n) packed for psm_gemm_bf16 once a graph: psm_bf16_pack's
 * form for decode.precision's forward, psm_bf16_pack_op's for
 * train.precision's products both ways */
static const void *
bf16_packed (PsmGraph *g, const float *w, int K, int n, gboolean tb, gboolean train)
{
  gboolean fresh;
  Packed *pk = packed_entry (g, w, K, n, tb, TRUE, &fresh);
  if (fresh && train)
    psm_bf16_pack_op (K, n, w, tb ? K : n, tb, pk->data);
  else if (fresh)
    psm_bf16_pack (K, n, w, pk->data);
  return pk->data;
}

PsmWeightPlan
psm_weight_plan (PsmGraph *g, const PsmTensor *w, int K, int n, int rows, gboolean grad, unsigned how)
{
  PsmWeightPlan p = { PSM_WEIGHT_BLAS, FALSE, w->data, K, n, w->data };
  if (!psm_graph_is_const (g, w->data))
    return p;
  p.defer = (how & PSM_PLAN_DEFER) && grad && w->grad && rows <= PSM_PACKED_MAX_ROWS && w->ndim == 2 &&
            w->shape[0] == K;
  const Weights *ws = weights_get (g);
  if (grad && (how & PSM_PLAN_BF16_TRAIN) && ws->bf16_train)
    p.path = PSM_WEIGHT_BF16_TRAIN;
  else if (!grad && ws->bf16)
    p.path = PSM_WEIGHT_BF16;
  else if ((how & PSM_PLAN_PACKED) ||
           (PSM_PACK_FAST && !(how & PSM_PLAN_NO_PACKED) &&
            ((how & PSM_PLAN_ANY_ROWS) || rows <= PSM_PACKED_MAX_ROWS || (PSM_PACK_WIDE && !psm_graph_grad_enabled (g)))))
    p.path = PSM_WEIGHT_PACKED;
  if (p.path != PSM_WEIGHT_BLAS)
    p.op = NULL;   /* packed when first asked for */
  return p;
}

const void *
psm_weight_operand (PsmGraph *g, PsmWeightPlan *p)
{
  if (!p->op) {
    g_return_val_if_fail (g != NULL, NULL);
    p->op = p->path == PSM_WEIGHT_PACKED ? (const void *) psm_graph_packed (g, p->w, p->K, p->n, FALSE)
                                         : bf16_packed (g, p->w, p->K, p->n, FALSE, p->path == PSM_WEIGHT_BF16_TRAIN);
  }
  return p->op;
}

const void *
psm_weight_transposed (PsmGraph *g, const PsmWeightPlan *p)
{
  if (p->path == PSM_WEIGHT_PACKED)
    return psm_graph_packed (g, p->w, p->n, p->K, TRUE);
  if (p->path == PSM_WEIGHT_BF16_TRAIN)
    return bf16_packed (g, p->w, p->n, p->K, TRUE, TRUE);
  return NULL;
}

void
psm_weight_gemm (PsmGraph *g, PsmWeightPlan *p, int R, const float *x, int ldx, const float *bias, gboolean acc,
                 float *y, int ldy)
{
  int K = p->K, N = p->n;
  if (p->path == PSM_WEIGHT_PACKED) {
    psm_gemm_packed (R, N, K, x, ldx, psm_weight_operand (g, p), bias, acc, y, ldy);
    return;
  }
  if (p->path != PSM_WEIGHT_BLAS) {
    psm_gemm_bf16 (R, N, K, x, ldx, psm_weight_operand (g, p), bias, acc, y, ldy);
    return;
  }
  g_return_if_fail (!(bias && acc));
  if (bias) {
#pragma omp parallel for if ((long) R * N >= 65536) schedule (static)
    for (int r = 0; r < R; r++)
      memcpy (y + (size_t) r * ldy, bias, N * sizeof (float));
  }
  psm_gemm (FALSE, FALSE, R, N, K, 1.0f, x, ldx, p->w, N, bias || acc ? 1.0f : 0.0f, y, ldy);
}

void psm_graph_set_bf16 (PsmGraph *g, gboolean on) { weights (g)->bf16 = on; }
void psm_graph_set_bf16_train (PsmGraph *g, gboolean on) { weights (g)->bf16_train = on; }
void psm_graph_keep_packed (PsmGraph *g, gboolean keep) { weights (g)->keep_packed = keep; }

gboolean
psm_graph_bf16 (const PsmGraph *g)
{
  const Weights *ws = weights_get (g);
  return ws && ws->bf16;
}

gboolean
psm_graph_bf16_train (const PsmGraph *g)
{
  const Weights *ws = weights_get (g);
  return ws && ws->bf16_train;
}

void
psm_graph_clear_packed (PsmGraph *g)
{
  Weights *ws = psm_graph_slot_get (g, &weights_slot);
  if (!ws || !ws->packed)
    return;
  for (guint i = 0; i < ws->packed->len; i++)
    free (g_array_index (ws->packed, Packed, i).data);
  g_array_set_size (ws->packed, 0);
}
