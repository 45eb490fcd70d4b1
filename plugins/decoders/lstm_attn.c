/* lstm_attn — See et al. 2017's decoder cell (§2, §2.3; their code for what
 * the paper leaves open). Carry [B, 2H + C (+ T)] = [h; c; h*_(t-1) (; c_t)].
 *   x_t = [y_(t-1) embedded; h*_(t-1)] W_in + b_in         (the cell's input)
 *   (h_t, c_t) = LSTM(x_t W_x + b_x, h_(t-1), c_(t-1))     (fused cell)
 *   e_i = v . tanh(W_h h_i + W_s [h_t; c_t] + w_c c_i + b_attn)   (eq. 1, 11)
 *   a = masked softmax(e), h*_t = sum_i a_i h_i                   (eq. 2, 3)
 *   coverage c_(t+1) = c_t + a_t, c_0 = 0                          (eq. 10)
 * W_h h_i is computed once per article (prepare). The head sees s_t = h_t,
 * h*_t as context, x_t as the step's input, a_t and c_t (the coverage before
 * this step, for the coverage loss). The initial (h, c) is the encoder's
 * summary [h0; c0], h*_0 = 0. w_c exists with coverage off (and stays 0):
 * a checkpoint trained without coverage continues with it (See §5: the
 * coverage phase starts from the converged model).
 *
 * attend = previous is Zeng et al. 2016's decoder (§3.2, eq. 12-14): the
 * attention reads the previous state and its context is the cell's input,
 * Bahdanau-style (gru_attn with an LSTM cell). Carry [B, 2H (+ T)]:
 *   e_i = v . tanh(W_h h_i + W_s h_(t-1) + w_c c_i + b_attn)   (eq. 14)
 *   c_t = sum_i a_i h_i                                         (eq. 13)
 *   (h_t, c_t) = LSTM([y_(t-1) embedded; c_t] W_x + b_x, h_(t-1), c_(t-1))   (eq. 12)
 * and the head sees s_t = h_t, c_t as context, y_(t-1) as the input.
 * init = bridge starts from h_0 = tanh(summary W_0 + b_0), c_0 = 0, for an
 * encoder whose summary is not [h0; c0] (the read-again encoders give
 * their last state); init = summary takes (h0, c0) from it (See). */
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int E, H, C, A;
  gboolean coverage, previous, bridge;
  int w_in, b_in, w_x, b_x, w_h, w_enc, w_dec, b_attn, v, w_c, w_0, b_0;
} LstmAttn;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "0", 0, 16384, "hidden units H (0 = half the encoder summary)", NULL },
  { "attn_dim", PSM_PARAM_INT, "0", 0, 16384, "attention size (0 = the annotation size, as See's code)", NULL },
  { "coverage", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "coverage vector as an attention input (See §2.3)", NULL },
  { "attend", PSM_PARAM_CHOICE, "current", PSM_NO_RANGE,
    "attention from the new state after the cell (See) or from the previous one, its context the cell's input "
    "(Zeng et al. eq. 12-14)", "current|previous" },
  { "init", PSM_PARAM_CHOICE, "summary", PSM_NO_RANGE,
    "initial state: the encoder summary as [h0; c0] (See), or bridge: h0 = tanh(W summary + b), c0 = 0",
    "summary|bridge" },
  PSM_PARAM_END
};

static void *
la_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  int H = (int) psm_section_int (cfg, "hidden");
  gboolean bridge = strcmp (psm_section_string (cfg, "init"), "bridge") == 0;
  if (!H)
    H = bridge ? ctx->summary_dim : ctx->summary_dim / 2;
  if (ctx->enc_dim <= 0 || (!bridge && ctx->summary_dim != 2 * H)) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: the decoder's initial (h, c) is the encoder summary, which has %d values, so hidden must be "
                 "%d (the encoder gives annotations of %d), or init = \"bridge\"", psm_section_where (cfg, "hidden"),
                 ctx->summary_dim,
                 ctx->summary_dim / 2, ctx->enc_dim);
    return NULL;
  }
  LstmAttn *s = g_new0 (LstmAttn, 1);
  s->E = ctx->emb_dim;
  s->H = H;
  s->C = ctx->enc_dim;
  s->A = (int) psm_section_int (cfg, "attn_dim");
  if (!s->A)
    s->A = s->C;
  s->coverage = psm_section_bool (cfg, "coverage");
  s->previous = strcmp (psm_section_string (cfg, "attend"), "previous") == 0;
  s->bridge = bridge;
  if (bridge) {
    s->w_0 = psm_build_matrix (ctx, "w_init", ctx->summary_dim, H, PSM_INIT_XAVIER, 0);
    s->b_0 = psm_build_vector (ctx, "b_init", H, PSM_INIT_ZEROS, 0);
  }
  if (s->previous) {
    /* the cell reads [y; c_t]; the query is h_(t-1) */
    s->w_x = psm_build_matrix (ctx, "w_x", s->E + s->C, 4 * H, PSM_INIT_XAVIER, 0);
    s->b_x = psm_build_vector (ctx, "b_x", 4 * H, PSM_INIT_ZEROS, 0);
    s->w_h = psm_build_matrix (ctx, "w_h", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
    s->w_enc = psm_build_matrix (ctx, "w_enc", s->C, s->A, PSM_INIT_XAVIER, 0);
    s->w_dec = psm_build_matrix (ctx, "w_dec", H, s->A, PSM_INIT_XAVIER, 0);
    s->b_attn = psm_build_vector (ctx, "b_attn", s->A, PSM_INIT_ZEROS, 0);
    s->v = psm_build_vector (ctx, "v", s->A, PSM_INIT_UNIFORM, 0.1f);
    s->w_c = psm_build_vector (ctx, "w_c", s->A, PSM_INIT_ZEROS, 0);
    return s;
  }
  s->w_in = psm_build_matrix (ctx, "w_in", s->E + s->C, s->E, PSM_INIT_XAVIER, 0);
  s->b_in = psm_build_vector (ctx, "b_in", s->E, PSM_INIT_ZEROS, 0);
  s->w_x = psm_build_matrix (ctx, "w_x", s->E, 4 * H, PSM_INIT_XAVIER, 0);
  s->b_x = psm_build_vector (ctx, "b_x", 4 * H, PSM_INIT_ZEROS, 0);
  s->w_h = psm_build_matrix (ctx, "w_h", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
  s->w_enc = psm_build_matrix (ctx, "w_enc", s->C, s->A, PSM_INIT_XAVIER, 0);
  s->w_dec = psm_build_matrix (ctx, "w_dec", 2 * H, s->A, PSM_INIT_XAVIER, 0);
  s->b_attn = psm_build_vector (ctx, "b_attn", s->A, PSM_INIT_ZEROS, 0);
  s->v = psm_build_vector (ctx, "v", s->A, PSM_INIT_UNIFORM, 0.1f);
  s->w_c = psm_build_vector (ctx, "w_c", s->A, PSM_INIT_ZEROS, 0);
  return s;
}

static void la_destroy (void *self) { g_free (self); }
static int la_state_dim (void *self) { return ((LstmAttn *) self)->H; }
static int la_context_dim (void *self) { return ((LstmAttn *) self)->C; }
static gboolean la_has_attention (void *self) { return TRUE; }

static PsmTensor *
la_prepare (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc)
{
  LstmAttn *s = self;
  return psm_linear (g, enc->annotations, psm_param (g, p, s->w_enc), NULL);
}

static PsmTensor *
la_init (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc)
{
  LstmAttn *s = self;
  PsmTensor *hc = enc->summary;
  if (s->bridge) {
    int zs[2] = { enc->B, s->H };
    hc = psm_concat (g, psm_tanh (g, psm_linear (g, enc->summary, psm_param (g, p, s->w_0), psm_param (g, p, s->b_0))),
                     psm_tensor_zeros (g, 2, zs, FALSE));
  }
  int sh[2] = { enc->B, (s->previous ? 0 : s->C) + (s->coverage ? enc->T : 0) };
  return sh[1] ? psm_concat (g, hc, psm_tensor_zeros (g, 2, sh, FALSE)) : hc;
}

/* attend = previous (Zeng et al. eq. 12-14); carry [h; c (; coverage)] */
static void
step_previous (LstmAttn *s, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, PsmTensor *carry, PsmTensor *in,
               PsmDecStep *out)
{
  int H = s->H;
  PsmTensor *h = psm_slice (g, carry, 0, H), *c = psm_slice (g, carry, H, H);
  PsmTensor *cov = s->coverage ? psm_slice (g, carry, 2 * H, enc->T) : NULL;
  PsmTensor *query = psm_linear (g, h, psm_param (g, p, s->w_dec), psm_param (g, p, s->b_attn));
  PsmTensor *a, *ctx;
  psm_additive_attention (g, enc->memo, query, psm_param (g, p, s->v), cov ? psm_param (g, p, s->w_c) : NULL, cov,
                          enc->annotations, enc->mask, &a, &ctx);
  PsmTensor *xp = psm_linear (g, psm_concat (g, in, ctx), psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  PsmTensor *hc = psm_lstm_cell (g, xp, h, c, psm_param (g, p, s->w_h), NULL);
  PsmTensor *h1 = psm_tensor_step (g, hc, 0), *c1 = psm_tensor_step (g, hc, 1);
  PsmTensor *next = psm_concat (g, h1, c1);
  out->carry = cov ? psm_concat (g, next, psm_add (g, cov, a)) : next;
  out->state = h1;
  out->context = ctx;
  out->attn = a;
  out->coverage = cov;
  out->input = in;
}

static void
la_step (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, PsmTensor *carry, PsmTensor *in,
         PsmDecStep *out)
{
  LstmAttn *s = self;
  if (s->previous) {
    step_previous (s, g, p, enc, carry, in, out);
    return;
  }
  int H = s->H, C = s->C;
  PsmTensor *h = psm_slice (g, carry, 0, H), *c = psm_slice (g, carry, H, H);
  PsmTensor *prev = psm_slice (g, carry, 2 * H, C);
  PsmTensor *cov = s->coverage ? psm_slice (g, carry, 2 * H + C, enc->T) : NULL;
  PsmTensor *x = psm_linear (g, psm_concat (g, in, prev), psm_param (g, p, s->w_in), psm_param (g, p, s->b_in));
  PsmTensor *xp = psm_linear (g, x, psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  PsmTensor *hc = psm_lstm_cell (g, xp, h, c, psm_param (g, p, s->w_h), NULL);
  PsmTensor *h1 = psm_tensor_step (g, hc, 0), *c1 = psm_tensor_step (g, hc, 1);
  PsmTensor *hc1 = psm_concat (g, h1, c1);   /* [h; c]: the query's input and the carry's start */
  PsmTensor *query = psm_linear (g, hc1, psm_param (g, p, s->w_dec), psm_param (g, p, s->b_attn));
  PsmTensor *a, *ctx;
  psm_additive_attention (g, enc->memo, query, psm_param (g, p, s->v), cov ? psm_param (g, p, s->w_c) : NULL, cov,
                          enc->annotations, enc->mask, &a, &ctx);
  PsmTensor *next = psm_concat (g, hc1, ctx);
  if (cov)
    next = psm_concat (g, next, psm_add (g, cov, a));
  out->carry = next;
  out->state = h1;
  out->context = ctx;
  out->attn = a;
  out->coverage = cov;
  out->input = x;
}

static const PsmDecoderClass klass = {
  .size = sizeof (PsmDecoderClass),
  .create = la_create,
  .destroy = la_destroy,
  .state_dim = la_state_dim,
  .context_dim = la_context_dim,
  .has_attention = la_has_attention,
  .init = la_init,
  .step = la_step,
  .prepare = la_prepare,
  .flags = PSM_DECODER_LIVE_ROWS,
};

PSM_PLUGIN (PSM_KIND_DECODER, "lstm_attn",
            "LSTM cell with additive attention and optional coverage (See et al. 2017)", params, NULL, &klass)
