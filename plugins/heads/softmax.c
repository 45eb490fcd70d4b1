/* softmax — the plain output layer: p(y | s) = softmax(u W + b) over the
 * shortlist, with u = s, or u = f(s W_u + b_u) with `hidden` > 0 (f =
 * maxout of 2 pieces a unit: the deep output f_o(s_t, y_(t-1), c_t) of
 * Bahdanau et al. / Gulcehre et al. eq. 3, with prev_word; f = tanh: the
 * same with tanh units; f = linear: See et al.'s baseline, P_vocab =
 * softmax(V'(V [s_t; h*_t] + b) + b'), eq. 4). With a decoder that has a
 * context h*_t, s is [s_t; h*_t], and with prev_word [s_t; h*_t; y_(t-1)]
 * (y_(t-1) the decoder's input embedding). Loss:
 * mean cross-entropy of the shortlist target (unk where the word is
 * outside), scored on the real target rows only (not on padding). With
 * tie_embedding the output weights are the token embedding table, W = E^T
 * (Press & Wolf 2017; Inan et al. 2017): u must have the embedding's width
 * and the table the shortlist's rows. A batch with
 * candidates (PsmBatch.cand, the large-vocabulary trick of Jean et al.
 * 2015) restricts the softmax to them: only their rows of the output
 * weights are used, and the output space is the candidate list. */
#include <psm/psm.h>
#include <string.h>

typedef struct {
  int H, V, hidden;
  gboolean linear, maxout, with_context, prev_word, tied;
  int w_u, b_u, w_o, b_o;
} Softmax;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "0", 0, 16384, "layer before the softmax (0 = none)", NULL },
  { "activation", PSM_PARAM_CHOICE, "tanh", PSM_NO_RANGE,
    "of that layer (maxout, 2 pieces a unit: Gulcehre et al.'s eq. 3; linear: See et al.'s eq. 4)",
    "tanh|maxout|linear" },
  { "prev_word", PSM_PARAM_BOOL, "false", PSM_NO_RANGE,
    "with an attention decoder and hidden: that layer reads y_(t-1) too, f_o(s_t, y_(t-1), c_t) (eq. 3)", NULL },
  { "tie_embedding", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "output weights = the token embedding table (transposed)",
    NULL },
  PSM_PARAM_END
};

static void *
sm_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  Softmax *s = g_new0 (Softmax, 1);
  s->with_context = ctx->context_dim > 0;
  s->H = ctx->state_dim + (s->with_context ? ctx->context_dim : 0);
  s->linear = strcmp (psm_section_string (cfg, "activation"), "linear") == 0;
  s->maxout = strcmp (psm_section_string (cfg, "activation"), "maxout") == 0;
  s->V = ctx->task->tgt_vocab;
  s->hidden = (int) psm_section_int (cfg, "hidden");
  s->prev_word = psm_section_bool (cfg, "prev_word");
  if (s->prev_word && (!s->with_context || !s->hidden)) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: the previous word is read by the deep output layer of an attention decoder: it needs a decoder "
                 "with a context vector and hidden > 0", psm_section_where (cfg, "prev_word"));
    g_free (s);
    return NULL;
  }
  if (s->maxout && !s->hidden) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: maxout is the activation of the layer before the softmax: set hidden > 0",
                 psm_section_where (cfg, "activation"));
    g_free (s);
    return NULL;
  }
  if (s->prev_word)
    s->H += ctx->emb_dim;
  int in = s->H, pieces = s->hidden * (s->maxout ? 2 : 1);   /* the layer's outputs before pooling */
  if (s->hidden) {
    s->w_u = psm_build_matrix (ctx, "w_u", s->H, pieces, PSM_INIT_XAVIER, 0);
    s->b_u = psm_build_vector (ctx, "b_u", pieces, PSM_INIT_ZEROS, 0);
    in = s->hidden;
  }
  s->tied = psm_section_bool (cfg, "tie_embedding");
  if (s->tied) {
    int nd, es[PSM_MAX_DIMS];
    psm_params_shape (ctx->params, ctx->emb_param, &nd, es);
    if (es[1] != in || es[0] != s->V) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: the embedding table is [%d, %d] but the output layer needs [%d, %d] (set model.embedding.dim "
                   "to %d, or the head's hidden to %d, and use one vocabulary)",
                   psm_section_where (cfg, "tie_embedding"), es[0], es[1], s->V, in, in, es[1]);
      g_free (s);
      return NULL;
    }
    s->w_o = ctx->emb_param;
  } else {
    s->w_o = psm_build_matrix (ctx, "w_o", in, s->V, PSM_INIT_XAVIER, 0);
  }
  s->b_o = psm_build_vector (ctx, "b_o", s->V, PSM_INIT_ZEROS, 0);
  return s;
}

static void sm_destroy (void *self) { g_free (self); }

/* The input of the output layer for the rows of [state; context (; input)]
 * (or of state), or of its n rows at rows[] (rows NULL: all). */
static PsmTensor *
pre_logits (Softmax *s, PsmGraph *g, PsmParams *p, PsmTensor *state, PsmTensor *context, PsmTensor *input,
            const int32_t *rows, int n)
{
  PsmTensor *u = s->with_context ? psm_concat (g, state, context) : state;
  if (s->prev_word)
    u = psm_concat (g, u, input);
  if (rows)
    u = psm_gather_rows (g, u, rows, n);
  if (s->hidden) {
    u = psm_linear (g, u, psm_param (g, p, s->w_u), psm_param (g, p, s->b_u));
    if (s->maxout)
      u = psm_maxout (g, u, 2);
    else if (!s->linear)
      u = psm_tanh (g, u);
  }
  return u;
}

/* The scores of those rows. */
static PsmTensor *
logits (Softmax *s, PsmGraph *g, PsmParams *p, PsmTensor *state, PsmTensor *context, PsmTensor *input,
        const int32_t *rows, int n, const PsmBatch *batch)
{
  PsmTensor *u = pre_logits (s, g, p, state, context, input, rows, n);
  PsmTensor *w = psm_param (g, p, s->w_o), *b = psm_param (g, p, s->b_o);
  if (batch->n_cand > 0) {
    w = s->tied ? psm_gather_rows (g, w, batch->cand, batch->n_cand) : psm_gather_cols (g, w, batch->cand, batch->n_cand);
    b = psm_gather_cols (g, b, batch->cand, batch->n_cand);
  }
  if (s->tied)
    return psm_add (g, psm_matmul (g, u, w, FALSE, TRUE), b);
  return psm_linear (g, u, w, b);
}

/* The targets as indices of the batch's softmax (the candidates'). */
static const int32_t *
targets (PsmGraph *g, const PsmBatch *batch, int n)
{
  if (batch->n_cand <= 0)
    return batch->tgt;
  int32_t *t = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (int32_t));
  for (int r = 0; r < n; r++)
    t[r] = batch->tgt_mask[r] != 0.0f ? psm_batch_cand_index (batch, batch->tgt[r]) : 0;
  return t;
}

static PsmTensor *
sm_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
         const PsmBatch *batch)
{
  /* All Ty steps in one GEMM: rows of [Ty, B, V] follow tgt's [Ty, B];
   * only the real target rows when some are padding (weight 0). */
  int R = out->Ty * out->B;
  const int32_t *rows, *t = targets (g, batch, R);
  const float *w = batch->tgt_mask;
  int n = psm_nonzero_rows (g, w, R, &rows);
  if (rows) {
    t = psm_gather_elems (g, t, sizeof *t, rows, n);
    w = psm_gather_elems (g, w, sizeof *w, rows, n);
  }
  Softmax *s = self;
  if (s->tied || batch->n_cand > 0)
    return psm_cross_entropy (g, logits (s, g, p, out->state, out->context, out->input, rows, n, batch), t, w);
  /* -(1/W) sum_r w_r log p(t_r), the output layer and the pick one op */
  PsmTensor *lp = psm_linear_pick_log_softmax (g, pre_logits (s, g, p, out->state, out->context, out->input, rows, n),
                                               psm_param (g, p, s->w_o), psm_param (g, p, s->b_o), t);
  int32_t *col0 = psm_arena_alloc (psm_graph_arena (g), (size_t) MAX (n, 1) * sizeof (int32_t));
  for (int r = 0; r < n; r++)
    col0[r] = t[r] >= 0 ? 0 : -1;   /* a row without a target counts nowhere, as in psm_cross_entropy */
  return psm_nll (g, lp, col0, w);
}

static int sm_space (void *self, const PsmBatch *batch) { return PSM_BATCH_VOCAB (batch, ((Softmax *) self)->V); }

static PsmTensor *
sm_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
           const PsmBatch *batch)
{
  Softmax *s = self;
  PsmTensor *l = logits (s, g, p, psm_tensor_step (g, out->state, 0),
                         s->with_context ? psm_tensor_step (g, out->context, 0) : NULL,
                         s->prev_word ? psm_tensor_step (g, out->input, 0) : NULL, NULL, 0, batch);
  return psm_log_softmax (g, l);
}

static int32_t
sm_slot_token (void *self, const PsmBatch *batch, int b, int slot)
{
  return batch->n_cand > 0 ? batch->cand[slot] : slot;
}

static void
sm_token_logp (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
               const PsmBatch *batch, float *logp, float *gate)
{
  int R = out->Ty * out->B;
  const int32_t *rows, *t = targets (g, batch, R);
  int n = psm_nonzero_rows (g, batch->tgt_mask, R, &rows);
  if (rows)   /* the real rows only */
    t = psm_gather_elems (g, t, sizeof *t, rows, n);
  PsmTensor *lp = psm_pick_log_softmax (g, logits (self, g, p, out->state, out->context, out->input, rows, n, batch), t);
  for (int i = 0; i < n; i++) {
    int r = rows ? rows[i] : i;
    if (batch->tgt_mask[r] != 0.0f)
      logp[r] = lp->data[i];
  }
}

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = sm_create,
  .destroy = sm_destroy,
  .loss = sm_loss,
  .space_size = sm_space,
  .scores = sm_scores,
  .slot_token = sm_slot_token,
  .token_logp = sm_token_logp,
};

PSM_PLUGIN (PSM_KIND_HEAD, "softmax", "softmax over the shortlist vocabulary (the baseline)", params, NULL, &klass)
