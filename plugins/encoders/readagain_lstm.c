/* readagain_lstm — Zeng et al. 2016's LSTM read-again encoder (§3.1.2, and
 * §3.1.3 for several sentences; the shared parts in readagain.h).
 *   first read   h¹_i = LSTM1(x_i, h¹_(i-1))                  (eq. 7)
 *   second read  h²_i = LSTM2([x_i; h¹_i; g_i], h²_(i-1))     (eq. 8, 9, 11)
 * g_i is the global vector of token i's sentence(s) (h¹_n for one sentence;
 * readagain.h), so every gate of the second read sees the whole sentence.
 * Annotations are the second read's states, the summary its last state h²
 * (padding carries it). Outside training, when the core asks for it (the
 * decoder's JSON output), the encoding's importance is the second read's
 * input-gate activity s(i_i) [T, B, H] (the LSTM's counterpart of the GRU
 * version's alpha). Input projections of all steps
 * are one GEMM per read; a single sentence runs both reads as the fused
 * sequence op, several sentences a fused cell per step. */
#include <string.h>
#include "readagain.h"

typedef struct {
  int E, H;
  float dropout;
  RaSentences rs;
  int w_x1, b_x1, w_h1, w_x2, b_x2, w_h2;
} RaLstm;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "hidden units H of both reads (paper: 512)", NULL },
  RA_SENTENCE_PARAMS,
  PSM_PARAM_END
};

static void *
rl_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  RaLstm *s = g_new0 (RaLstm, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  s->dropout = (float) psm_section_float (cfg, "dropout");
  int H = s->H;
  ra_sentences_build (&s->rs, cfg, ctx, H);
  s->w_x1 = psm_build_matrix (ctx, "read1.w_x", s->E, 4 * H, PSM_INIT_XAVIER, 0);
  s->b_x1 = psm_build_vector (ctx, "read1.b_x", 4 * H, PSM_INIT_ZEROS, 0);
  s->w_h1 = psm_build_matrix (ctx, "read1.w_h", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
  s->w_x2 = psm_build_matrix (ctx, "read2.w_x", s->E + H + ra_global_dim (&s->rs), 4 * H, PSM_INIT_XAVIER, 0);
  s->b_x2 = psm_build_vector (ctx, "read2.b_x", 4 * H, PSM_INIT_ZEROS, 0);
  s->w_h2 = psm_build_matrix (ctx, "read2.w_h", H, 4 * H, PSM_INIT_ORTHOGONAL, 0);
  return s;
}

static void rl_destroy (void *self) { g_free (self); }
static int rl_dim (void *self) { return ((RaLstm *) self)->H; }

/* One read over the gate pre-activations xp [T, B, 4H] from zeros,
 * restarting where keep says: the states h [T, B, H]. */
static PsmTensor *
lstm_read (PsmGraph *g, PsmTensor *xp, PsmTensor *w, const float *mask, const float *keep, int H)
{
  int T = xp->shape[0], B = xp->shape[1], sh[2] = { B, H }, seq[3] = { T, B, H };
  if (!keep) {
    PsmTensor *hs = psm_lstm_seq (g, xp, psm_tensor_zeros (g, 2, sh, FALSE), psm_tensor_zeros (g, 2, sh, FALSE), w,
                                  mask, FALSE);
    return psm_tensor_view (g, hs, 0, 3, seq);
  }
  PsmTensor *out = psm_tensor_new (g, 3, seq, psm_graph_grad_enabled (g));
  PsmTensor *h = psm_tensor_zeros (g, 2, sh, FALSE), *c = h;
  for (int t = 0; t < T; t++) {
    PsmTensor *hc = psm_lstm_cell (g, psm_tensor_step (g, xp, t), ra_restart (g, h, keep, t, B),
                                   ra_restart (g, c, keep, t, B), w, mask + (size_t) t * B);
    h = psm_tensor_step (g, hc, 0);
    c = psm_tensor_step (g, hc, 1);
    psm_set_step (g, out, t, h);
  }
  return out;
}

/* s(i_i) of the second read, from xp2 and the states h2 (inspection only). */
static PsmTensor *
input_gate (PsmGraph *g, PsmTensor *xp2, PsmTensor *h2, PsmTensor *w, const PsmEncoding *enc, const float *keep, int H)
{
  int T = enc->T, B = enc->B, zs[3] = { 1, B, H }, seq[3] = { T, B, H };
  PsmTensor *hz = psm_concat_steps (g, psm_tensor_zeros (g, 3, zs, FALSE), h2);   /* step t + 1: h2 at t */
  int32_t *rows = psm_arena_alloc (psm_graph_arena (g), (size_t) T * B * sizeof (int32_t));
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      rows[(size_t) t * B + b] = t == 0 || (keep && keep[(size_t) t * B + b] == 0.0f) ? b : t * B + b;
  PsmTensor *prev = psm_tensor_reshape (g, psm_gather_rows (g, hz, rows, T * B), 3, seq);
  PsmTensor *pre = psm_add (g, psm_slice (g, xp2, 0, H), psm_linear (g, prev, psm_slice (g, w, 0, H), NULL));
  return psm_sigmoid (g, pre);
}

static void
rl_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  RaLstm *s = self;
  int T = emb->shape[0], H = s->H;
  PsmTensor *x = psm_locked_dropout (g, emb, s->dropout);
  const float *keep = ra_restarts (g, out);
  PsmTensor *xp1 = psm_linear (g, x, psm_param (g, p, s->w_x1), psm_param (g, p, s->b_x1));
  PsmTensor *h1 = lstm_read (g, xp1, psm_param (g, p, s->w_h1), mask, keep, H);
  PsmTensor *in = psm_concat (g, psm_concat (g, x, h1), ra_global_inputs (&s->rs, g, p, out, h1));
  PsmTensor *xp2 = psm_linear (g, in, psm_param (g, p, s->w_x2), psm_param (g, p, s->b_x2));
  PsmTensor *w2 = psm_param (g, p, s->w_h2);
  PsmTensor *h2 = lstm_read (g, xp2, w2, mask, keep, H);
  out->annotations = psm_locked_dropout (g, h2, s->dropout);
  out->summary = psm_tensor_step (g, h2, T - 1);
  if (!psm_graph_grad_enabled (g) && out->want_importance)
    out->importance = input_gate (g, xp2, h2, w2, out, keep, H);
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = rl_create,
  .destroy = rl_destroy,
  .output_dim = rl_dim,
  .summary_dim = rl_dim,
  .encode = rl_encode,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "readagain_lstm",
            "read-again LSTM (Zeng et al. 2016): the second read conditioned on the first read's sentence vector",
            params, NULL, &klass)
