/* label_smoothing — an example third-party head: the softmax output layer
 * trained with label smoothing (Szegedy et al. 2016, §7). The model is
 * p(y | u) = softmax(u W + b) over the target vocabulary, u the decoder
 * state (with its context [s_t; h*_t] when the decoder has one) or the
 * encoder summary; the training target is the one-hot target mixed with the
 * uniform distribution, so the loss of one target word y is
 *     (1 - eps) (-log p(y)) + eps (1/V) sum_v (-log p(v)),
 * averaged over the real (unpadded) target words. Decoding scores are
 * log p. Built from the ops of psm-ops.h: no backward pass to write. */
#include <psm/psm.h>

typedef struct {
  int in, V;
  gboolean with_context;
  double eps;
  int w, b;   /* parameter ids */
} Smooth;

static const PsmParamSpec params[] = {
  { "epsilon", PSM_PARAM_FLOAT, "0.1", 0.0, 1.0, "weight of the uniform distribution in the target", NULL },
  PSM_PARAM_END
};

static void *
ls_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  Smooth *s = g_new0 (Smooth, 1);
  s->with_context = ctx->context_dim > 0;
  s->in = ctx->state_dim + (s->with_context ? ctx->context_dim : 0);
  s->V = ctx->task->tgt_vocab;
  s->eps = psm_section_float (cfg, "epsilon");
  s->w = psm_build_matrix (ctx, "w", s->in, s->V, PSM_INIT_XAVIER, 0);
  s->b = psm_build_vector (ctx, "b", s->V, PSM_INIT_ZEROS, 0);
  return s;
}

static void ls_destroy (void *self) { g_free (self); }

/* log p [rows, V] for the states (and contexts) of out's steps */
static PsmTensor *
log_probs (Smooth *s, PsmGraph *g, PsmParams *p, PsmTensor *state, PsmTensor *context)
{
  PsmTensor *u = s->with_context ? psm_concat (g, state, context) : state;
  return psm_log_softmax (g, psm_linear (g, u, psm_param (g, p, s->w), psm_param (g, p, s->b)));
}

static PsmTensor *
ls_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
         const PsmBatch *batch)
{
  Smooth *s = self;
  int rows = out->Ty * out->B;
  /* all Ty steps in one GEMM: rows of [Ty, B, V] follow tgt's [Ty, B] */
  PsmTensor *lp = log_probs (s, g, p, out->state, out->context);
  PsmTensor *nll = psm_nll (g, lp, batch->tgt, batch->tgt_mask);
  /* the uniform part: -(1 / (W V)) sum_r w_r sum_v log p[r, v], W = sum_r w_r */
  int shape[1] = { rows };
  PsmTensor *w = psm_tensor_new (g, 1, shape, FALSE);
  double W = 0.0;
  for (int r = 0; r < rows; r++) {
    w->data[r] = batch->tgt_mask[r];
    W += batch->tgt_mask[r];
  }
  if (W <= 0.0)   /* all padding: no loss, and no 0/0 */
    return psm_scale (g, nll, 0.0f);
  PsmTensor *uniform = psm_scale (g, psm_sum (g, psm_mul_rows (g, lp, w)), (float) (-1.0 / (W * s->V)));
  return psm_add (g, psm_scale (g, nll, (float) (1.0 - s->eps)), psm_scale (g, uniform, (float) s->eps));
}

static int ls_space (void *self, const PsmBatch *batch) { return ((Smooth *) self)->V; }

static PsmTensor *
ls_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
           const PsmBatch *batch)
{
  Smooth *s = self;
  return log_probs (s, g, p, psm_tensor_step (g, out->state, 0),
                    s->with_context ? psm_tensor_step (g, out->context, 0) : NULL);
}

/* the output space is the vocabulary itself: slot v is word v */
static int32_t ls_slot_token (void *self, const PsmBatch *batch, int b, int slot) { return slot; }

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = ls_create,
  .destroy = ls_destroy,
  .loss = ls_loss,
  .space_size = ls_space,
  .scores = ls_scores,
  .slot_token = ls_slot_token,
};

PSM_PLUGIN (PSM_KIND_HEAD, "label_smoothing", "softmax over the vocabulary trained with label smoothing "
            "(Szegedy et al. 2016; example third-party plugin)", params, NULL, &klass)
