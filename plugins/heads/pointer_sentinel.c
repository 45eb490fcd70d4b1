/* pointer_sentinel — the pointer sentinel mixture of Merity et al. 2016
 * (§2.2-2.6) over a stream's last L positions:
 *   p_vocab = softmax(h_t W_o + b_o)               (the RNN's softmax)
 *   q = tanh(h_t W + b)                            (eq. 3: the query)
 *   z_i = q . h_i, i over the window of the last L positions (this one
 *         included), reaching back across segment boundaries through the
 *         states the core keeps (PsmHeadClass.history: L - 1 of them)
 *   a = softmax([z; q . s]), s the learned sentinel;  g = a[L + 1]
 *   p(y) = g p_vocab(y) + sum_{i : w_i = y} a_i      (eq. 4 and 5)
 * Loss (§2.6): -log p(y) plus, unless pointer_loss = false, the pointer
 * loss -log(g + sum_{i : w_i = y} a_i), which supervises the attention
 * directly (the mass the pointer gives the target or hands to the
 * sentinel). Both are computed for the target alone: one picked
 * log-softmax of the vocabulary and the L + 1 window scores a row, never
 * the mixed distribution; the pointer loss is the mixture's op with
 * p_vocab(y) taken as 1. Both are means over target tokens, so the
 * training loss printed is their sum (perplexities come from -log p(y)
 * alone). With side-by-side segments the window's oldest states come from
 * earlier segments without gradient (truncated backpropagation through
 * time); with the task's stride = 1 and bptt = L (the paper's k1 = 1,
 * k2 = L) the one scored position's window lies within its segment, and
 * only that row's vocabulary is computed. The word at position i is the
 * input word w_i whose reading produced h_i. */
#include <math.h>
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int H, V, L;
  gboolean tied, pointer_loss;
  int w_o, b_o, w_q, b_q, s;
} Sentinel;

static const PsmParamSpec params[] = {
  { "window", PSM_PARAM_INT, "100", 1, 10000, "positions L the pointer reaches back (this one included)", NULL },
  { "tie_embedding", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "softmax weights = the token embedding table (transposed)",
    NULL },
  { "pointer_loss", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "add the pointer loss -log(g + sum of the target's attention) of §2.6 (false: the mixture's NLL only)", NULL },
  PSM_PARAM_END
};

static void *
ps_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  if (!ctx->task->streams || ctx->context_dim > 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: the pointer sentinel reads a window of a stream's own past outputs: it needs a language-model "
                 "task over streams (task lm) and no decoder", psm_section_where (cfg, "window"));
    return NULL;
  }
  Sentinel *s = g_new0 (Sentinel, 1);
  s->H = ctx->state_dim;
  s->V = ctx->task->tgt_vocab;
  s->L = (int) psm_section_int (cfg, "window");
  s->tied = psm_section_bool (cfg, "tie_embedding");
  s->pointer_loss = psm_section_bool (cfg, "pointer_loss");
  if (s->tied) {
    int nd, es[PSM_MAX_DIMS];
    psm_params_shape (ctx->params, ctx->emb_param, &nd, es);
    if (es[1] != s->H || es[0] != s->V) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: the embedding table is [%d, %d] but the softmax needs [%d, %d] (set model.embedding.dim to "
                   "the encoder's output size %d)", psm_section_where (cfg, "tie_embedding"), es[0], es[1], s->V, s->H,
                   s->H);
      g_free (s);
      return NULL;
    }
    s->w_o = ctx->emb_param;
  } else {
    s->w_o = psm_build_matrix (ctx, "w_o", s->H, s->V, PSM_INIT_XAVIER, 0);
  }
  s->b_o = psm_build_vector (ctx, "b_o", s->V, PSM_INIT_ZEROS, 0);
  s->w_q = psm_build_matrix (ctx, "w_q", s->H, s->H, PSM_INIT_XAVIER, 0);
  s->b_q = psm_build_vector (ctx, "b_q", s->H, PSM_INIT_ZEROS, 0);
  s->s = psm_build_vector (ctx, "sentinel", s->H, PSM_INIT_UNIFORM, 0.05f);
  return s;
}

static void ps_destroy (void *self) { g_free (self); }
static int ps_history (void *self) { return ((Sentinel *) self)->L - 1; }

static PsmTensor *
vocab_logits (Sentinel *s, PsmGraph *g, PsmParams *p, PsmTensor *h)
{
  if (s->tied)
    return psm_add (g, psm_matmul (g, h, psm_param (g, p, s->w_o), FALSE, TRUE), psm_param (g, p, s->b_o));
  return psm_linear (g, h, psm_param (g, p, s->w_o), psm_param (g, p, s->b_o));
}

/* The window scores [T B, L + 1] and the target's log p_vocab [T B, 1]. */
static void
parts (Sentinel *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const PsmBatch *batch, PsmTensor **z,
       PsmTensor **lgen, const int32_t **wid)
{
  PsmTensor *h = out->state;
  int T = h->shape[0], B = h->shape[1];
  /* the vocabulary's log-probability on the scored rows only: with
   * task.stride < bptt (k1 < k2) most of a segment is context, not target */
  const int32_t *rows, *tgt = batch->tgt;
  int n = psm_nonzero_rows (g, batch->tgt_mask, T * B, &rows);
  PsmTensor *hv = h;
  if (rows) {
    hv = psm_gather_rows (g, h, rows, n);
    tgt = psm_gather_elems (g, tgt, sizeof *tgt, rows, n);
  }
  *lgen = s->tied ? psm_pick_log_softmax (g, vocab_logits (s, g, p, hv), tgt)
                  : psm_linear_pick_log_softmax (g, hv, psm_param (g, p, s->w_o), psm_param (g, p, s->b_o), tgt);
  if (rows)
    *lgen = psm_scatter_rows (g, *lgen, rows, T * B);
  PsmTensor *q = psm_tanh (g, psm_linear (g, h, psm_param (g, p, s->w_q), psm_param (g, p, s->b_q)));
  *wid = psm_window_ids (g, T, B, s->L, batch->src, batch->src_mask, out->past_ids, out->P);
  *z = psm_window_scores (g, q, h, out->past, psm_param (g, p, s->s), *wid, s->L);
}

static PsmTensor *
ps_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
         const PsmBatch *batch)
{
  PsmTensor *z, *lgen;
  const int32_t *wid;
  Sentinel *s = self;
  parts (s, g, p, out, batch, &z, &lgen, &wid);
  PsmTensor *nll = psm_sentinel_nll (g, z, lgen, wid, batch->tgt, batch->tgt_mask);
  if (!s->pointer_loss)
    return nll;
  /* -log(g + sum_{i in I(y, x)} a_i): the same mixture with p_vocab(y) = 1 */
  PsmTensor *zero = psm_tensor_zeros (g, lgen->ndim, lgen->shape, FALSE);
  return psm_add (g, nll, psm_sentinel_nll (g, z, zero, wid, batch->tgt, batch->tgt_mask));
}

/* Softmax of z [L + 1] (with -inf) into a; returns the gate a[L]. */
static double
attend (const float *z, int L, double *a)
{
  double mx = z[L], sum = 0.0;
  for (int j = 0; j < L; j++)
    mx = MAX (mx, z[j]);
  for (int j = 0; j <= L; j++)
    sum += a[j] = isinf (z[j]) ? 0.0 : exp (z[j] - mx);
  for (int j = 0; j <= L; j++)
    a[j] /= sum;
  return a[L];
}

static void
ps_token_logp (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
               const PsmBatch *batch, float *logp, float *gate)
{
  Sentinel *s = self;
  PsmTensor *z, *lgen;
  const int32_t *wid;
  parts (s, g, p, out, batch, &z, &lgen, &wid);
  double *a = g_new (double, s->L + 1);
  for (int r = 0; r < out->Ty * out->B; r++) {
    if (batch->tgt_mask[r] == 0.0f)
      continue;
    double gt = attend (z->data + (size_t) r * (s->L + 1), s->L, a), m = gt * exp (lgen->data[r]);
    for (int j = 0; j < s->L; j++)
      if (wid[(size_t) r * s->L + j] == batch->tgt[r])
        m += a[j];
    logp[r] = (float) log (MAX (m, 1e-30));
    if (gate)
      gate[r] = (float) gt;
  }
  g_free (a);
}

static int ps_space (void *self, const PsmBatch *batch) { return ((Sentinel *) self)->V; }

/* The mixed distribution over the vocabulary at the first position of a
 * one-step output (window words mixed in, at most L of them). */
static PsmTensor *
ps_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
           const PsmBatch *batch)
{
  Sentinel *s = self;
  int B = out->B, V = s->V, L = s->L;
  PsmTensor *h = psm_tensor_step (g, out->state, 0);
  int s3[3] = { 1, B, s->H };
  PsmTensor *h3 = psm_tensor_reshape (g, h, 3, s3);
  PsmTensor *pv = psm_softmax (g, vocab_logits (s, g, p, h));
  PsmTensor *q = psm_tanh (g, psm_linear (g, h3, psm_param (g, p, s->w_q), psm_param (g, p, s->b_q)));
  const int32_t *wid = psm_window_ids (g, 1, B, L, batch->src, batch->src_mask, out->past_ids, out->P);
  PsmTensor *z = psm_window_scores (g, q, h3, out->past, psm_param (g, p, s->s), wid, L);
  int shape[2] = { B, V };
  PsmTensor *y = psm_tensor_new (g, 2, shape, FALSE);
  double *a = g_new (double, L + 1);
  for (int b = 0; b < B; b++) {
    double gt = attend (z->data + (size_t) b * (L + 1), L, a);
    float *row = y->data + (size_t) b * V;
    for (int v = 0; v < V; v++)
      row[v] = (float) (gt * pv->data[(size_t) b * V + v]);
    for (int j = 0; j < L; j++) {
      int32_t w = wid[(size_t) b * L + j];
      if (w >= 0 && w < V)
        row[w] += (float) a[j];
    }
    for (int v = 0; v < V; v++)
      row[v] = logf (MAX (row[v], 1e-30f));
  }
  g_free (a);
  return y;
}

static int32_t ps_slot_token (void *self, const PsmBatch *batch, int b, int slot) { return slot; }

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = ps_create,
  .destroy = ps_destroy,
  .loss = ps_loss,
  .space_size = ps_space,
  .scores = ps_scores,
  .slot_token = ps_slot_token,
  .history = ps_history,
  .token_logp = ps_token_logp,
};

PSM_PLUGIN (PSM_KIND_HEAD, "pointer_sentinel",
            "pointer sentinel mixture over a stream's last L words (Merity et al. 2016)", params, NULL, &klass)
