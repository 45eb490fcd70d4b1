/* gru — unidirectional GRU encoder.
 *   xp_t = x_t W_x + b_x (all steps in one GEMM)
 *   h_t = GRU(xp_t, h_(t-1))  (fused cell, see core/ops/gru.c), h_0 = 0
 * Annotations are all h_t [T, B, H]; the summary c is the last state h_T
 * (padding carries the state, so it is each example's last real state). */
#include <psm/psm.h>

typedef struct {
  int E, H;
  int w_x, b_x, w_h, b_h;
} Gru;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H", NULL },
  PSM_PARAM_END
};

static void *
gru_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  Gru *g = g_new0 (Gru, 1);
  g->E = ctx->emb_dim;
  g->H = (int) psm_section_int (cfg, "hidden");
  g->w_x = psm_build_matrix (ctx, "w_x", g->E, 3 * g->H, PSM_INIT_XAVIER, 0);
  g->b_x = psm_build_vector (ctx, "b_x", 3 * g->H, PSM_INIT_ZEROS, 0);
  g->w_h = psm_build_matrix (ctx, "w_h", g->H, 3 * g->H, PSM_INIT_ORTHOGONAL, 0);
  g->b_h = psm_build_vector (ctx, "b_h", 3 * g->H, PSM_INIT_ZEROS, 0);
  return g;
}

static void gru_destroy (void *self) { g_free (self); }
static int gru_dim (void *self) { return ((Gru *) self)->H; }

static void
gru_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  Gru *s = self;
  int T = emb->shape[0], B = emb->shape[1];
  PsmTensor *xp = psm_linear (g, emb, psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  int hs[2] = { B, s->H };
  PsmTensor *h0 = psm_tensor_zeros (g, 2, hs, FALSE);
  out->annotations = psm_gru_seq (g, xp, h0, psm_param (g, p, s->w_h), psm_param (g, p, s->b_h), mask);
  out->summary = psm_tensor_step (g, out->annotations, T - 1);
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = gru_create,
  .destroy = gru_destroy,
  .output_dim = gru_dim,
  .summary_dim = gru_dim,
  .encode = gru_encode,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "gru", "GRU over the source; all states and the last state as summary",
            params, NULL, &klass)
