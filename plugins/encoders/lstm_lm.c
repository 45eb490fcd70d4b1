/* lstm_lm — the L-layer LSTM of a word-level language model (Zaremba et
 * al. 2014's medium model, the RNN of Merity et al. 2016, §5.1):
 *   x^0_t = the embedding of word t
 *   (h^l_t, c^l_t) = LSTM_l(x^(l-1)_t W^l_x + b^l, h^l_(t-1), c^l_(t-1))
 *   l = 1..L, x^l_t = h^l_t; the annotations are h^L_t [T, B, H]
 * Each layer's input projection for all steps is one GEMM and its
 * recurrence one psm_lstm_seq over the segment. The state (h^l, c^l of every
 * layer) is carried from one segment of a stream to the next: it starts from
 * PsmEncoding.carry_in and ends in carry_out [B, 2 L H] (h of layer 1..L,
 * then c of layer 1..L); no gradient crosses the segment boundary
 * (truncated backpropagation through time). When segments overlap
 * (PsmEncoding.carry_at = k, Merity et al.'s k1 < k2) the state carried is
 * the one after position k - 1: each layer's recurrence then runs as two
 * psm_lstm_seq, positions [0, k) and [k, T), the second starting from the
 * first's end state. Parameters uniform in
 * [-init_scale, init_scale], as Zaremba et al.
 * Regularisation (Merity et al. §5.2, both 0.5 in the paper): locked
 * (variational) dropout — one mask per stream and unit for the whole
 * segment — on every layer's input and on the last layer's output
 * (`dropout`), and zoneout on the recurrent state h and c of every layer
 * (`zoneout`: a unit keeps its previous value with that probability in
 * training; in evaluation it takes the expectation, z h_prev + (1 - z) h~). */
#include <string.h>
#include <psm/psm.h>

#define MAX_LAYERS 8

typedef struct {
  int E, H, L;
  float dropout, zoneout;
  int w_x[MAX_LAYERS], b_x[MAX_LAYERS], w_h[MAX_LAYERS];
} LstmLm;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "650", 1, 16384, "hidden units H of every layer", NULL },
  { "layers", PSM_PARAM_INT, "2", 1, MAX_LAYERS, "stacked LSTM layers L", NULL },
  { "init_scale", PSM_PARAM_FLOAT, "0.05", 0.0, 10.0, "parameters uniform in [-s, s] (Zaremba et al.: 0.05)",
    NULL },
  { "dropout", PSM_PARAM_FLOAT, "0", 0.0, 0.95, "locked dropout on each layer's input and the output (paper: 0.5)",
    NULL },
  { "zoneout", PSM_PARAM_FLOAT, "0", 0.0, 0.95, "zoneout probability of the recurrent h and c (paper: 0.5)", NULL },
  PSM_PARAM_END
};

static void *
ll_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  LstmLm *s = g_new0 (LstmLm, 1);
  s->E = ctx->emb_dim;
  s->H = (int) psm_section_int (cfg, "hidden");
  s->L = (int) psm_section_int (cfg, "layers");
  float sc = (float) psm_section_float (cfg, "init_scale");
  s->dropout = (float) psm_section_float (cfg, "dropout");
  s->zoneout = (float) psm_section_float (cfg, "zoneout");
  for (int l = 0; l < s->L; l++) {
    char name[32];
    g_snprintf (name, sizeof name, "w_x%d", l + 1);
    s->w_x[l] = psm_build_matrix (ctx, name, l ? s->H : s->E, 4 * s->H, PSM_INIT_UNIFORM, sc);
    g_snprintf (name, sizeof name, "b_x%d", l + 1);
    s->b_x[l] = psm_build_vector (ctx, name, 4 * s->H, PSM_INIT_UNIFORM, sc);
    g_snprintf (name, sizeof name, "w_h%d", l + 1);
    s->w_h[l] = psm_build_matrix (ctx, name, s->H, 4 * s->H, PSM_INIT_UNIFORM, sc);
  }
  return s;
}

static void ll_destroy (void *self) { g_free (self); }
static int ll_dim (void *self) { return ((LstmLm *) self)->H; }
static int ll_carry_dim (void *self) { return 2 * ((LstmLm *) self)->L * ((LstmLm *) self)->H; }

static void
ll_encode (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb, const float *mask, PsmEncoding *out)
{
  LstmLm *s = self;
  int T = emb->shape[0], B = emb->shape[1], H = s->H, L = s->L;
  int sh[2] = { B, H }, seq_shape[3] = { T, B, H };
  /* the start state: layer l's h and c, columns [l H, (l + 1) H) and
   * [(L + l) H, ...) of carry_in (zeros without one) */
  PsmTensor *carry = NULL;
  if (out->carry_in) {
    int cs[2] = { B, 2 * L * H };
    carry = psm_tensor_wrap (g, (float *) out->carry_in, NULL, 2, cs);
  }
  PsmTensor *x = emb, *ends_h[MAX_LAYERS] = { NULL }, *ends_c[MAX_LAYERS] = { NULL };
  PsmTensor *mid_h[MAX_LAYERS] = { NULL }, *mid_c[MAX_LAYERS] = { NULL };
  int k = out->carry_at > 0 && out->carry_at < T ? out->carry_at : 0;
  for (int l = 0; l < L; l++) {
    PsmTensor *h0 = carry ? psm_slice (g, carry, l * H, H) : psm_tensor_zeros (g, 2, sh, FALSE);
    PsmTensor *c0 = carry ? psm_slice (g, carry, (L + l) * H, H) : psm_tensor_zeros (g, 2, sh, FALSE);
    x = psm_locked_dropout (g, x, s->dropout);
    PsmTensor *xp = psm_linear (g, x, psm_param (g, p, s->w_x[l]), psm_param (g, p, s->b_x[l]));
    const float *zh = NULL, *zc = NULL;
    if (s->zoneout > 0.0f) {
      zh = psm_zoneout_weights (g, s->zoneout, (size_t) T * B * H);
      zc = psm_zoneout_weights (g, s->zoneout, (size_t) T * B * H);
    }
    PsmTensor *wh = psm_param (g, p, s->w_h[l]);
    if (k > 0) {
      /* positions [0, k), whose end state is carried, then [k, T) */
      size_t at = (size_t) k * B * H;
      int s1[3] = { k, B, 4 * H }, s2[3] = { T - k, B, 4 * H }, o1[3] = { k, B, H }, o2[3] = { T - k, B, H };
      PsmTensor *a = psm_lstm_seq_zoneout (g, psm_tensor_view (g, xp, 0, 3, s1), 0, h0, c0, wh, mask, FALSE, zh, zc);
      mid_h[l] = psm_tensor_step (g, a, k - 1);
      mid_c[l] = psm_tensor_step (g, a, k);
      PsmTensor *b = psm_lstm_seq_zoneout (g, psm_tensor_view (g, xp, 4 * at, 3, s2), 0, mid_h[l], mid_c[l], wh,
                                           mask ? mask + (size_t) k * B : NULL, FALSE, zh ? zh + at : NULL, zc ? zc + at : NULL);
      ends_h[l] = psm_tensor_step (g, b, T - k - 1);
      ends_c[l] = psm_tensor_step (g, b, T - k);
      x = psm_concat_steps (g, psm_tensor_view (g, a, 0, 3, o1), psm_tensor_view (g, b, 0, 3, o2));
    } else {
      PsmTensor *seq = psm_lstm_seq_zoneout (g, xp, 0, h0, c0, wh, mask, FALSE, zh, zc);
      x = psm_tensor_view (g, seq, 0, 3, seq_shape);
      ends_h[l] = psm_tensor_step (g, seq, T - 1);   /* padding carries the state to the end */
      ends_c[l] = psm_tensor_step (g, seq, T);
    }
  }
  out->annotations = psm_locked_dropout (g, x, s->dropout);
  out->summary = ends_h[L - 1];
  /* the state carried, as carry_in is laid out */
  PsmTensor **ch = k > 0 ? mid_h : ends_h, **cc = k > 0 ? mid_c : ends_c;
  PsmTensor *carry_out = ch[0];
  for (int l = 1; l < L; l++)
    carry_out = psm_concat (g, carry_out, ch[l]);
  for (int l = 0; l < L; l++)
    carry_out = psm_concat (g, carry_out, cc[l]);
  out->carry_out = carry_out;
}

static const PsmEncoderClass klass = {
  .size = sizeof (PsmEncoderClass),
  .create = ll_create,
  .destroy = ll_destroy,
  .output_dim = ll_dim,
  .summary_dim = ll_dim,
  .encode = ll_encode,
  .carry_dim = ll_carry_dim,
};

PSM_PLUGIN (PSM_KIND_ENCODER, "lstm_lm",
            "L-layer LSTM language model over stream segments, its state carried between segments (Zaremba et "
            "al.; Merity et al. §5.1)", params, NULL, &klass)
