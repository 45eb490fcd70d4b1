/* readagain_gru — Zeng et al. 2016's GRU read-again encoder (§3.1.1, and
 * §3.1.3 for several sentences; the shared parts in readagain.h).
 *   first read   h¹_i = GRU1(x_i, h¹_(i-1))                      (eq. 2-3)
 *   importance   alpha_i = f(h¹_i W_e + g_i U_e + x_i V_e + b_e)  (eq. 5)
 *   second read  h²_i = (1 - alpha_i) h²_(i-1) + alpha_i GRU2(x_i, h²_(i-1))   (eq. 4, 6)
 * g_i is the global vector of token i's sentence(s) (h¹_n for one sentence;
 * readagain.h). alpha = vector gives one weight per hidden unit (the
 * paper's choice), scalar one per word. The paper prints f = tanh in eq. 5,
 * which lets a weight go negative (the skip of eq. 4 then extrapolates); f =
 * sigmoid (the default) keeps it in (0, 1), the interpolation eq. 4
 * describes. Annotations are the second read's states, the summary its
 * last state (padding carries it), and alpha is returned as the encoding's
 * importance [T, B, D]. Input projections of all steps are one GEMM per
 * read; a single sentence runs the first read as the fused sequence op. */
#include <string.h>
#include "readagain.h"

typedef struct {
  int E, H, D;
  gboolean tanh_alpha;
  float dropout;
  RaSentences rs;
  int w_x1, b_x1, w_h1, b_h1, w_a, b_a, w_x2, b_x2, w_h2, b_h2;
} RaGru;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H of both reads (paper: 512)", NULL },
  { "alpha", PSM_PARAM_CHOICE, "vector", PSM_NO_RANGE, "importance weight per hidden unit (vector, the paper's) or per word",
    "vector|scalar" },
  { "alpha_act", PSM_PARAM_CHOICE, "sigmoid", PSM_NO_RANGE, "f of eq. 5 (the paper prints tanh)", "sigmoid|tanh" },
  RA_SENTENCE_PARAMS,
  PSM_PARAM_END
};

static void *
rg_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  RaGru *s = g_new0 (RaGru, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  s->D = strcmp (psm_section_string (cfg, "alpha"), "vector") == 0 ? s->H : 1;
  s->tanh_alpha = strcmp (psm_section_string (cfg, "alpha_act"), "tanh") == 0;
  s->dropout = (float) psm_section_float (cfg, "dropout");
  int H = s->H;
  ra_sentences_build (&s->rs, cfg, ctx, H);
  s->w_x1 = psm_build_matrix (ctx, "read1.w_x", s->E, 3 * H, PSM_INIT_XAVIER, 0);
  s->b_x1 = psm_build_vector (ctx, "read1.b_x", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_h1 = psm_build_matrix (ctx, "read1.w_h", H, 3 * H, PSM_INIT_ORTHOGONAL, 0);
  s->b_h1 = psm_build_vector (ctx, "read1.b_h", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_a = psm_build_matrix (ctx, "alpha.w", H + ra_global_dim (&s->rs) + s->E, s->D, PSM_INIT_XAVIER, 0);
  s->b_a = psm_build_vector (ctx, "alpha.b", s->D, PSM_INIT_ZEROS, 0);
  s->w_x2 = psm_build_matrix (ctx, "read2.w_x", s->E, 3 * H, PSM_INIT_XAVIER, 0);
  s->b_x2 = psm_build_vector (ctx, "read2.b_x", 3 * H, PSM_INIT_ZEROS, 0);
  s->w_h2 = psm_build_matrix (ctx, "read2.w_h", H, 3 * H, PSM_INIT_ORTHOGONAL, 0);
  s->b_h2 = psm_build_vector (ctx, "read2.b_h", 3 * H, PSM_INIT_ZEROS, 0);
  return s;
}

static void rg_destroy (void *self) { g_free (self); }
static int rg_dim (void *self) { return ((RaGru *) self)->H; }

static void
rg_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  RaGru *s = self;
  int T = emb->shape[0], B = emb->shape[1], H = s->H;
  int sh[2] = { B, H }, seq[3] = { T, B, H };
  gboolean grad = psm_graph_grad_enabled (g);
  PsmTensor *x = psm_locked_dropout (g, emb, s->dropout);
  const float *keep = ra_restarts (g, out);
  /* first read */
  PsmTensor *xp1 = psm_linear (g, x, psm_param (g, p, s->w_x1), psm_param (g, p, s->b_x1));
  PsmTensor *w1 = psm_param (g, p, s->w_h1), *b1 = psm_param (g, p, s->b_h1), *h1;
  if (!keep) {
    h1 = psm_gru_seq (g, xp1, psm_tensor_zeros (g, 2, sh, FALSE), w1, b1, mask);
  } else {
    h1 = psm_tensor_new (g, 3, seq, grad);
    PsmTensor *h = psm_tensor_zeros (g, 2, sh, FALSE);
    for (int t = 0; t < T; t++) {
      h = psm_gru_cell (g, psm_tensor_step (g, xp1, t), ra_restart (g, h, keep, t, B), w1, b1, mask + (size_t) t * B);
      psm_set_step (g, h1, t, h);
    }
  }
  /* importance weights from [h¹_i; g_i; x_i] */
  PsmTensor *in = psm_concat (g, psm_concat (g, h1, ra_global_inputs (&s->rs, g, p, out, h1)), x);
  PsmTensor *alpha = psm_linear (g, in, psm_param (g, p, s->w_a), psm_param (g, p, s->b_a));
  alpha = s->tanh_alpha ? psm_tanh (g, alpha) : psm_sigmoid (g, alpha);
  /* second read, alpha on the skip connection */
  PsmTensor *xp2 = psm_linear (g, x, psm_param (g, p, s->w_x2), psm_param (g, p, s->b_x2));
  PsmTensor *w2 = psm_param (g, p, s->w_h2), *b2 = psm_param (g, p, s->b_h2);
  PsmTensor *h2 = psm_tensor_new (g, 3, seq, grad), *h = psm_tensor_zeros (g, 2, sh, FALSE);
  for (int t = 0; t < T; t++) {
    h = ra_restart (g, h, keep, t, B);
    PsmTensor *gh = psm_gru_cell (g, psm_tensor_step (g, xp2, t), h, w2, b2, mask + (size_t) t * B);
    PsmTensor *delta = psm_add (g, gh, psm_scale (g, h, -1.0f)), *a = psm_tensor_step (g, alpha, t);
    h = psm_add (g, h, s->D == H ? psm_mul (g, a, delta) : psm_mul_rows (g, delta, a));
    psm_set_step (g, h2, t, h);
  }
  out->annotations = psm_locked_dropout (g, h2, s->dropout);
  out->summary = h;
  out->importance = alpha;
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = rg_create,
  .destroy = rg_destroy,
  .output_dim = rg_dim,
  .summary_dim = rg_dim,
  .encode = rg_encode,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "readagain_gru",
            "read-again GRU (Zeng et al. 2016): a first read weighs each word for the second", params, NULL, &klass)
