/* pointer_generator — See et al. 2017, §2.2 and §2.3.
 *   P_vocab = softmax(V'(V [s_t; h*_t] + b) + b')                  (eq. 4)
 *   p_gen = s(w_h* . h*_t + w_s . s_t + w_x . x_t + b_ptr)          (eq. 8)
 *   P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: w_i = w} a_i      (eq. 9)
 * over the extended vocabulary: the shortlist, then the batch's source words
 * outside it (slot = extended id). A target outside the shortlist that the
 * article does not contain is the unknown word, as in See's code.
 * loss_t = -log P(w*_t) + lambda sum_i min(a_i, c_i)              (eq. 13)
 * averaged over real target steps. Training never builds P over the
 * extended vocabulary: it gathers the target's log P_vocab
 * (pick_log_softmax, computed on the real target rows only) and its copy
 * mass (gather_mass); decoding scatters the attention onto it (scatter_add). */
#include <psm/psm.h>
#include <string.h>

typedef struct {
  int S, C, E, V, hidden, unk;
  double cov_wt;
  int w_v, b_v, w_o, b_o, w_ptr, b_ptr;
} PtrGen;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "0", 0, 16384, "size of V [s; h*] + b (0 = the decoder state size, as See)", NULL },
  { "cov_loss_wt", PSM_PARAM_FLOAT, "0", 0, 100, "lambda of the coverage loss (See: 1 in the coverage phase)", NULL },
  PSM_PARAM_END
};

static void *
pg_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  if (!ctx->has_attention || ctx->context_dim <= 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: pointer_generator copies with the decoder's attention: use a decoder cell with attention "
                 "(e.g. lstm_attn)", psm_section_path (cfg));
    return NULL;
  }
  if (ctx->task->unk_id < 0 || ctx->task->unk_id >= ctx->task->tgt_vocab) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: pointer_generator needs a task with an unknown word in its shortlist", psm_section_path (cfg));
    return NULL;
  }
  PtrGen *s = g_new0 (PtrGen, 1);
  s->S = ctx->state_dim;
  s->C = ctx->context_dim;
  s->E = ctx->emb_dim;
  s->V = ctx->task->tgt_vocab;
  s->unk = ctx->task->unk_id;
  s->hidden = (int) psm_section_int (cfg, "hidden");
  if (!s->hidden)
    s->hidden = s->S;
  s->cov_wt = psm_section_float (cfg, "cov_loss_wt");
  s->w_v = psm_build_matrix (ctx, "w_v", s->S + s->C, s->hidden, PSM_INIT_XAVIER, 0);
  s->b_v = psm_build_vector (ctx, "b_v", s->hidden, PSM_INIT_ZEROS, 0);
  s->w_o = psm_build_matrix (ctx, "w_o", s->hidden, s->V, PSM_INIT_XAVIER, 0);
  s->b_o = psm_build_vector (ctx, "b_o", s->V, PSM_INIT_ZEROS, 0);
  s->w_ptr = psm_build_matrix (ctx, "w_ptr", s->C + s->S + s->E, 1, PSM_INIT_XAVIER, 0);
  s->b_ptr = psm_build_vector (ctx, "b_ptr", 1, PSM_INIT_ZEROS, 0);
  return s;
}

static void pg_destroy (void *self) { g_free (self); }

/* V[s_t; h*_t] + b of the rows of [s_t; h*_t], or of its n rows at rows[]
 * (rows NULL: all): the input of the vocabulary scores V' u + b' */
static PsmTensor *
pre_logits (PtrGen *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const int32_t *rows, int n)
{
  PsmTensor *x = psm_concat (g, out->state, out->context);
  if (rows)
    x = psm_gather_rows (g, x, rows, n);
  return psm_linear (g, x, psm_param (g, p, s->w_v), psm_param (g, p, s->b_v));
}

/* The vocabulary scores [R, V] */
static PsmTensor *
logits (PtrGen *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const int32_t *rows, int n)
{
  return psm_linear (g, pre_logits (s, g, p, out, rows, n), psm_param (g, p, s->w_o), psm_param (g, p, s->b_o));
}

/* z of p_gen = s(z) */
static PsmTensor *
gate_logit (PtrGen *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out)
{
  PsmTensor *f = psm_concat (g, psm_concat (g, out->context, out->state), out->input);
  return psm_linear (g, f, psm_param (g, p, s->w_ptr), psm_param (g, p, s->b_ptr));
}

static PsmTensor *
pg_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  PtrGen *s = self;
  int R = b->Ty * b->B;
  int32_t *tv = psm_arena_alloc (psm_graph_arena (g), 2 * R * sizeof (int32_t)), *tc = tv + R;
  for (int r = 0; r < R; r++) {
    int32_t w = b->tgt_ext[r], ex = r % b->B;
    gboolean in_src = FALSE;
    for (int i = 0; i < b->T && !in_src && w >= s->V; i++)
      in_src = PSM_AT (b->src_ext, b, i, ex) == w && PSM_AT (b->src_mask, b, i, ex) > 0;
    if (w < s->V) {
      tv[r] = tc[r] = w;
    } else if (in_src) {
      tv[r] = -1;      /* only copying can produce it */
      tc[r] = w;
    } else {
      tv[r] = tc[r] = s->unk;
    }
  }
  /* P_vocab on the real target rows only (padding has weight 0 below) */
  const int32_t *rows;
  int n = psm_nonzero_rows (g, b->tgt_mask, R, &rows);
  const int32_t *tr = rows ? psm_gather_elems (g, tv, sizeof *tv, rows, n) : tv;
  PsmTensor *lv = psm_linear_pick_log_softmax (g, pre_logits (s, g, p, out, rows, n), psm_param (g, p, s->w_o),
                                               psm_param (g, p, s->b_o), tr);
  if (rows)
    lv = psm_scatter_rows (g, lv, rows, R);
  PsmTensor *mass = psm_gather_mass (g, out->attn, b->src_ext, b->B, tc);
  PsmTensor *loss = psm_mixture_nll (g, gate_logit (s, g, p, out), lv, mass, b->tgt_mask);
  if (s->cov_wt > 0 && out->coverage)
    loss = psm_add (g, loss, psm_scale (g, psm_coverage_loss (g, out->attn, out->coverage, b->tgt_mask), (float) s->cov_wt));
  return loss;
}

static int
pg_space (void *self, const PsmBatch *b)
{
  return b->ext_base + (b->oov_words ? (int) b->oov_words->len : 0);
}

static PsmTensor *
pg_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  PtrGen *s = self;
  PsmTensor *pv = psm_softmax (g, logits (s, g, p, out, NULL, 0));
  PsmTensor *pg = psm_sigmoid (g, gate_logit (s, g, p, out));
  PsmTensor *a = psm_tensor_step (g, out->attn, 0);
  PsmTensor *mix = psm_scatter_add (g, psm_mul_rows (g, pv, pg), psm_mul_rows (g, a, psm_affine (g, pg, -1.0f, 1.0f)),
                                    b->src_ext, b->B, pg_space (self, b));
  return psm_log (g, mix);
}

static int32_t pg_slot_token (void *self, const PsmBatch *b, int ex, int slot) { return slot; }

static PsmTensor *
pg_gate (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  return psm_sigmoid (g, gate_logit (self, g, p, out));
}

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = pg_create,
  .destroy = pg_destroy,
  .loss = pg_loss,
  .space_size = pg_space,
  .scores = pg_scores,
  .slot_token = pg_slot_token,
  .gate = pg_gate,
};

PSM_PLUGIN (PSM_KIND_HEAD, "pointer_generator",
            "See et al.'s pointer-generator: p_gen mixes the vocabulary softmax with copying by attention, "
            "optional coverage loss", params, NULL, &klass)
