/* gru_attn — Bahdanau et al. 2015's decoder (appendix A.2.2), the decoder of
 * Gulcehre et al. 2016 §4. Carry [B, H (+ T)] = [s (; c_t)].
 *   s_0 = tanh(h←_1 W_init + b_init)                 (the encoder summary)
 *   e_i = v . tanh(W_h h_i + W_s s_(t-1) + w_c c_i + b_attn)   (attention
 *   a = masked softmax(e), c_t = sum_i a_i h_i                  from s_(t-1))
 *   s_t = GRU([y_(t-1) embedded; c_t] W_x + b_x, s_(t-1))      (fused cell)
 * W_h h_i is computed once per article (prepare). With coverage on, the
 * coverage vector (the sum of earlier attention, See et al. eq. 10) is an
 * attention input; w_c exists either way (and stays 0 with it off). The
 * head sees s_t, c_t as context, the embedded y_(t-1) as the step's input,
 * a_t and the coverage before this step. */
#include <psm/psm.h>

typedef struct {
  int E, H, C, S, A;
  gboolean coverage;
  int w_init, b_init, w_x, b_x, w_h, b_h, w_enc, w_dec, b_attn, v, w_c;
} GruAttn;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H of the decoder state", NULL },
  { "attn_dim", PSM_PARAM_INT, "0", 0, 16384, "attention size (0 = the annotation size)", NULL },
  { "coverage", PSM_PARAM_BOOL, "false", PSM_NO_RANGE, "coverage vector as an attention input (See §2.3)", NULL },
  PSM_PARAM_END
};

static void *
ga_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  if (ctx->enc_dim <= 0 || ctx->summary_dim <= 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: gru_attn needs an encoder with annotations and a summary", psm_section_path (cfg));
    return NULL;
  }
  GruAttn *s = g_new0 (GruAttn, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  s->C = ctx->enc_dim;
  s->S = ctx->summary_dim;
  s->A = (int) psm_section_int (cfg, "attn_dim");
  if (!s->A)
    s->A = s->C;
  s->coverage = psm_section_bool (cfg, "coverage");
  int H = s->H;
  s->w_init = psm_build_matrix (ctx, "w_init", s->S, H, PSM_INIT_XAVIER, 0);
  s->b_init = psm_build_vector (ctx, "b_init", H, PSM_INIT_ZEROS, 0);
  s->w_x = psm_build_matrix (ctx, "w_x", s->E + s->C, 3 * H, PSM_INIT_XAVIER, 0);
  s->b_x = psm_build_vector (ctx, "b_x", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_h = psm_build_matrix (ctx, "w_h", H, 3 * H, PSM_INIT_ORTHOGONAL, 0);
  s->b_h = psm_build_vector (ctx, "b_h", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_enc = psm_build_matrix (ctx, "w_enc", s->C, s->A, PSM_INIT_XAVIER, 0);
  s->w_dec = psm_build_matrix (ctx, "w_dec", H, s->A, PSM_INIT_XAVIER, 0);
  s->b_attn = psm_build_vector (ctx, "b_attn", s->A, PSM_INIT_ZEROS, 0);
  s->v = psm_build_vector (ctx, "v", s->A, PSM_INIT_UNIFORM, 0.1f);
  s->w_c = psm_build_vector (ctx, "w_c", s->A, PSM_INIT_ZEROS, 0);
  return s;
}

static void ga_destroy (void *self) { g_free (self); }
static int ga_state_dim (void *self) { return ((GruAttn *) self)->H; }
static int ga_context_dim (void *self) { return ((GruAttn *) self)->C; }
static gboolean ga_has_attention (void *self) { return TRUE; }

static PsmTensor *
ga_prepare (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc)
{
  GruAttn *s = self;
  return psm_linear (g, enc->annotations, psm_param (g, p, s->w_enc), NULL);
}

static PsmTensor *
ga_init (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc)
{
  GruAttn *s = self;
  PsmTensor *s0 = psm_tanh (g, psm_linear (g, enc->summary, psm_param (g, p, s->w_init), psm_param (g, p, s->b_init)));
  if (!s->coverage)
    return s0;
  int sh[2] = { enc->B, enc->T };
  return psm_concat (g, s0, psm_tensor_zeros (g, 2, sh, FALSE));
}

static void
ga_step (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, PsmTensor *carry, PsmTensor *in,
         PsmDecStep *out)
{
  GruAttn *s = self;
  int H = s->H;
  PsmTensor *prev = s->coverage ? psm_slice (g, carry, 0, H) : carry;
  PsmTensor *cov = s->coverage ? psm_slice (g, carry, H, enc->T) : NULL;
  PsmTensor *query = psm_linear (g, prev, psm_param (g, p, s->w_dec), psm_param (g, p, s->b_attn));
  PsmTensor *a, *ctx;
  psm_additive_attention (g, enc->memo, query, psm_param (g, p, s->v), cov ? psm_param (g, p, s->w_c) : NULL, cov,
                          enc->annotations, enc->mask, &a, &ctx);
  PsmTensor *xp = psm_linear (g, psm_concat (g, in, ctx), psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  PsmTensor *st = psm_gru_cell (g, xp, prev, psm_param (g, p, s->w_h), psm_param (g, p, s->b_h), NULL);
  out->carry = cov ? psm_concat (g, st, psm_add (g, cov, a)) : st;
  out->state = st;
  out->context = ctx;
  out->attn = a;
  out->coverage = cov;
  out->input = in;
}

static const PsmDecoderClass klass = {
  .size = sizeof (PsmDecoderClass),
  .create = ga_create,
  .destroy = ga_destroy,
  .state_dim = ga_state_dim,
  .context_dim = ga_context_dim,
  .has_attention = ga_has_attention,
  .init = ga_init,
  .step = ga_step,
  .prepare = ga_prepare,
  .flags = PSM_DECODER_LIVE_ROWS,
};

PSM_PLUGIN (PSM_KIND_DECODER, "gru_attn",
            "GRU decoder with additive attention from the previous state (Bahdanau et al. 2015), optional coverage",
            params, NULL, &klass)
