/* bilstm — one bidirectional LSTM layer (See et al. 2017, §2).
 *   [xf | xb]_t = x_t W_x + b_x     (both directions, all steps: one GEMM)
 *   (h→_t, c→_t) = LSTM(xf_t, h→_(t-1), c→_(t-1))   t = 1..T
 *   (h←_t, c←_t) = LSTM(xb_t, h←_(t+1), c←_(t+1))   t = T..1
 * with psm_lstm_seq_cols (core/ops/lstm-seq.c), each direction reading its half
 * of the one projection in place; padding carries the state, so the
 * forward pass ends on each example's last real token and the backward one
 * starts from zeros at it. Annotations h_i = [h→_i; h←_i] ([T, B, 2H]).
 * The final states are reduced to the decoder's initial state as in See's
 * code: h0 = relu([h→_T; h←_1] W_rh + b_rh), c0 = relu([c→_T; c←_1] W_rc + b_rc);
 * the summary is [h0; c0] ([B, 2H]). */
#include <psm/psm.h>

typedef struct {
  int E, H;
  int w_x, b_x, w_f, w_b, w_rh, b_rh, w_rc, b_rc;
} BiLstm;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H per direction", NULL },
  PSM_PARAM_END
};

static void *
bl_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  BiLstm *s = g_new0 (BiLstm, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  int H = s->H;
  s->w_x = psm_build_matrix (ctx, "w_x", s->E, 8 * H, PSM_INIT_XAVIER, 0);
  s->b_x = psm_build_vector (ctx, "b_x", 8 * H, PSM_INIT_ZEROS, 0);
  s->w_f = psm_build_matrix (ctx, "w_fwd", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
  s->w_b = psm_build_matrix (ctx, "w_bwd", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
  s->w_rh = psm_build_matrix (ctx, "w_reduce_h", 2 * H, H, PSM_INIT_XAVIER, 0);
  s->b_rh = psm_build_vector (ctx, "b_reduce_h", H, PSM_INIT_ZEROS, 0);
  s->w_rc = psm_build_matrix (ctx, "w_reduce_c", 2 * H, H, PSM_INIT_XAVIER, 0);
  s->b_rc = psm_build_vector (ctx, "b_reduce_c", H, PSM_INIT_ZEROS, 0);
  return s;
}

static void bl_destroy (void *self) { g_free (self); }
static int bl_out_dim (void *self) { return 2 * ((BiLstm *) self)->H; }
static int bl_summary_dim (void *self) { return 2 * ((BiLstm *) self)->H; }

/* One direction over columns [col0, col0 + 4H) of xp [T, B, 8H] from zeros:
 * psm_lstm_seq_cols's [T + 1, B, H] (h at every position, then the final c). */
static PsmTensor *
run (PsmGraph *g, PsmTensor *xp, int col0, int H, PsmTensor *w, const float *mask, gboolean reverse)
{
  int sh[2] = { xp->shape[1], H };
  return psm_lstm_seq_cols (g, xp, col0, psm_tensor_zeros (g, 2, sh, FALSE), psm_tensor_zeros (g, 2, sh, FALSE), w,
                            mask, reverse);
}

static void
bl_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  BiLstm *s = self;
  int T = emb->shape[0], B = emb->shape[1], H = s->H;
  PsmTensor *xp = psm_linear (g, emb, psm_param (g, p, s->w_x), psm_param (g, p, s->b_x));
  int shape[3] = { T, B, H };
  PsmTensor *lf = run (g, xp, 0, H, psm_param (g, p, s->w_f), mask, FALSE);
  PsmTensor *lb = run (g, xp, 4 * H, H, psm_param (g, p, s->w_b), mask, TRUE);
  out->annotations = psm_concat (g, psm_tensor_view (g, lf, 0, 3, shape), psm_tensor_view (g, lb, 0, 3, shape));
  PsmTensor *h = psm_concat (g, psm_tensor_step (g, lf, T - 1), psm_tensor_step (g, lb, 0));
  PsmTensor *c = psm_concat (g, psm_tensor_step (g, lf, T), psm_tensor_step (g, lb, T));
  h = psm_relu (g, psm_linear (g, h, psm_param (g, p, s->w_rh), psm_param (g, p, s->b_rh)));
  c = psm_relu (g, psm_linear (g, c, psm_param (g, p, s->w_rc), psm_param (g, p, s->b_rc)));
  out->summary = psm_concat (g, h, c);
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = bl_create,
  .destroy = bl_destroy,
  .output_dim = bl_out_dim,
  .summary_dim = bl_summary_dim,
  .encode = bl_encode,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "bilstm",
            "bidirectional LSTM (See et al.): annotations [h→; h←], summary relu-reduced [h0; c0]", params, NULL,
            &klass)
