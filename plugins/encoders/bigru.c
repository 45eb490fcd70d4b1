/* bigru — one bidirectional GRU layer (Bahdanau et al. 2015, §3.2 and
 * appendix A.2.1; the encoder of Gulcehre et al. 2016 §4).
 *   [xf | xb]_t = x_t W_x + b_x     (both directions, all steps: one GEMM)
 *   h→_t = GRU(xf_t, h→_(t-1))   t = 1..T   (whole-sequence op)
 *   h←_t = GRU(xb_t, h←_(t+1))   t = T..1   (the same op in reverse)
 * Padding carries the state: the forward pass ends on each example's last
 * real token, the backward one starts there from zeros. Annotations
 * h_i = [h→_i; h←_i] ([T, B, 2H]); the summary is h←_1 ([B, H]), from which
 * a Bahdanau decoder (gru_attn) computes its initial state
 * s_0 = tanh(W_s h←_1). */
#include <psm/psm.h>

typedef struct {
  int E, H;
  int w_x, b_x, w_f, b_f, w_b, b_b;
} BiGru;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H per direction", NULL },
  PSM_PARAM_END
};

static void *
bg_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  BiGru *s = g_new0 (BiGru, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  int H = s->H;
  s->w_x = psm_build_matrix (ctx, "w_x", s->E, 6 * H, PSM_INIT_XAVIER, 0);
  s->b_x = psm_build_vector (ctx, "b_x", 6 * H, PSM_INIT_ZEROS, 0);
  s->w_f = psm_build_matrix (ctx, "w_fwd", H, 3 * H, PSM_INIT_ORTHOGONAL, 0);
  s->b_f = psm_build_vector (ctx, "b_fwd", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_b = psm_build_matrix (ctx, "w_bwd", H, 3 * H, PSM_INIT_ORTHOGONAL, 0);
  s->b_b = psm_build_vector (ctx, "b_bwd", 3 * H, PSM_INIT_ZEROS, 0);
  return s;
}

static void bg_destroy (void *self) { g_free (self); }
static int bg_out_dim (void *self) { return 2 * ((BiGru *) self)->H; }
static int bg_summary_dim (void *self) { return ((BiGru *) self)->H; }

static void
bg_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  BiGru *s = self;
  int B = emb->shape[1], H = s->H;
  PsmTensor *xp = psm_linear (g, emb, psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  int sh[2] = { B, H };
  /* both directions on their columns of the one projection (ABI 1.13) */
  PsmTensor *hf = psm_gru_seq_cols (g, xp, 0, psm_tensor_zeros (g, 2, sh, FALSE), psm_param (g, p, s->w_f),
                                    psm_param (g, p, s->b_f), mask, FALSE);
  PsmTensor *hb = psm_gru_seq_cols (g, xp, 3 * H, psm_tensor_zeros (g, 2, sh, FALSE), psm_param (g, p, s->w_b),
                                    psm_param (g, p, s->b_b), mask, TRUE);
  out->annotations = psm_concat (g, hf, hb);
  out->summary = psm_tensor_step (g, hb, 0);
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = bg_create,
  .destroy = bg_destroy,
  .output_dim = bg_out_dim,
  .summary_dim = bg_summary_dim,
  .encode = bg_encode,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "bigru",
            "bidirectional GRU (Bahdanau et al.): annotations [h→; h←], summary h←_1", params, NULL, &klass)
