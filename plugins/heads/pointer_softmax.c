/* pointer_softmax — Gulcehre et al. 2016, eq. 4-10.
 *
 * Two softmaxes and a switch, all conditioned on the step state c (for the
 * rarest-word task, the encoder summary):
 *   shortlist  u_w = tanh(c W_w + b_w),     w_t = softmax(u_w U_w + b_U)
 *   location   location = "summary" (§5.1: l_t conditioned on c only):
 *                u_l = tanh(c W_l + b_l),  l_t = softmax_j((u_l U_l + b_L)_j)
 *              over the positions j < T (the task's max_src_len outputs);
 *              location = "pointer" (a pointer network over annotations h_j):
 *                e_j = v^T tanh(h_j W_k + c W_q + b_q),  l_t = softmax_j(e_j),
 *                latent u_l = sum_j l_tj h_j (the pointed annotation)
 *   switch     x = v_d^T relu([u_w; u_l] W_d + b_d) + b_v,  d_t = s(k x)
 *              (MLP on the latent representations of w_t and l_t, inverse
 *              temperature k, paper: 2; b_v starts at switch_bias, paper: -1)
 * Training observes the switch z_t (1 = shortlist, 0 = point):
 *   -log p(y_t, z_t) = -log d_t - log w_t[y_t]            if z_t = 1
 *                      -log(1 - d_t) - log l_t[loc_t]     if z_t = 0
 * averaged over target steps. Decoding scores the concatenation
 * [log d_t + log w_t ; log(1 - d_t) + log l_t] and takes the best slot:
 * a shortlist word, or the word at a source position.
 *
 * On an attention decoder (seq2seq, Gulcehre et al. §3-4, §5.2-5.3) every
 * target step t reads the decoder's state s_t, context c_t and input
 * embedding y_(t-1), x_t = [s_t; c_t; y_(t-1)]:
 *   shortlist  u_w = f_o(s_t, y_(t-1), c_t),  w_t = softmax(u_w U_w + b_U):
 *              eq. 3's deep output layer (Pascanu et al. 2013), one layer
 *              of maxout units over x_t, u_w = maxout_2(x_t W_w + b_w)
 *              (two pieces a unit, as Bahdanau et al.'s RNNsearch, whose
 *              decoder §3 describes); activation = tanh and prev_word =
 *              false give u_w = tanh([s_t; c_t] W_w + b_w). It is the
 *              `softmax` head with the same hidden, activation and
 *              prev_word: "the same as the typical softmax output layer",
 *              so the two differ only by the location softmax and the
 *              switch
 *   location   l_t = the decoder's attention a_t over the source positions
 *              (§4: the location softmax is the attention mechanism)
 *   switch     x = v_d^T relu(x_t W_d + b_d) + b_v,  d_t = s(k x)
 * with the same loss (every step's shortlist projection as one GEMM, and
 * only the targets' probabilities gathered) and decoding. There a batch
 * with candidates (PsmBatch.cand: the large-vocabulary trick, §5.2)
 * restricts the shortlist softmax to them, with only their columns of U_w
 * computed, and the shortlist part of the output space is the candidates.
 *
 * switch = noisy_tanh is §5.3's switch: a two-layer MLP of noisy tanh units
 * (psm_noisy_tanh: Gulcehre et al.'s NAN with a learned p per unit, p
 * starting at 1; alpha 1.15, c 0.5 as their code) with a residual
 * connection from the lower layer to the upper:
 *   h1 = nt(x W_1 + b_1),  h2 = nt(h1 W_2 + b_2) + h1,  x' = v^T h2 + b_v
 * noisy while training, its expectation otherwise. */
#include <math.h>
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int Hs, Ha, V, hidden, attn, sw, maxT;
  gboolean seq2seq;              /* location = the decoder's attention */
  gboolean maxout, prev_word;    /* seq2seq: the deep output f_o (eq. 3) */
  gboolean summary;              /* location from c alone (§5.1) */
  float k;
  int w_w, b_w, u_w, b_U;        /* shortlist */
  int w_k, w_q, b_q, v_a;        /* location: pointer network */
  int w_l, b_l, u_l, b_L;        /* location: from the summary */
  int w_d, b_d, v_d, b_v;        /* switch */
  gboolean noisy;                /* switch = noisy_tanh */
  int p_d, w_2, b_2, p_2;        /* its learned p and upper layer */
} PointerSoftmax;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "256", 1, 16384, "shortlist latent layer u_w (units; maxout: 2 pieces each)", NULL },
  { "activation", PSM_PARAM_CHOICE, "maxout", PSM_NO_RANGE,
    "with an attention decoder: the deep output layer's units, maxout (eq. 3, as RNNsearch) or tanh; without "
    "one u_w is tanh", "maxout|tanh" },
  { "prev_word", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "with an attention decoder: the deep output reads y_(t-1) too, f_o(s_t, y_(t-1), c_t) (eq. 3)", NULL },
  { "location", PSM_PARAM_CHOICE, "pointer", PSM_NO_RANGE,
    "without a decoder: pointer network over annotations, or from the summary c only (§5.1); with an attention "
    "decoder the location softmax is its attention", "pointer|summary" },
  { "attn_dim", PSM_PARAM_INT, "256", 1, 16384, "location latent layer (pointer scores or u_l)", NULL },
  { "switch_hidden", PSM_PARAM_INT, "128", 1, 16384, "switch MLP hidden layer", NULL },
  { "temperature", PSM_PARAM_FLOAT, "2", 0.01, 100, "inverse temperature k of d = s(k x) (paper: 2)", NULL },
  { "switch_bias", PSM_PARAM_FLOAT, "-1", -100, 100, "initial bias of the switch output (paper: -1)", NULL },
  { "switch", PSM_PARAM_CHOICE, "relu", PSM_NO_RANGE,
    "switch MLP: relu (one layer), or noisy_tanh (two noisy-tanh layers with a residual connection, §5.3)",
    "relu|noisy_tanh" },
  PSM_PARAM_END
};

/* The switch MLP on an input of n: a relu layer (or two noisy tanh ones),
 * then the logit whose bias starts at switch_bias. */
static void
build_switch (PointerSoftmax *s, const PsmBuildCtx *ctx, const PsmSection *cfg, int n)
{
  s->w_d = psm_build_matrix (ctx, "switch.w", n, s->sw, PSM_INIT_XAVIER, 0);
  s->b_d = psm_build_vector (ctx, "switch.b", s->sw, PSM_INIT_ZEROS, 0);
  s->noisy = strcmp (psm_section_string (cfg, "switch"), "noisy_tanh") == 0;
  if (s->noisy) {
    s->p_d = psm_build_vector (ctx, "switch.p", s->sw, PSM_INIT_CONST, 1.0f);
    s->w_2 = psm_build_matrix (ctx, "switch.w2", s->sw, s->sw, PSM_INIT_XAVIER, 0);
    s->b_2 = psm_build_vector (ctx, "switch.b2", s->sw, PSM_INIT_ZEROS, 0);
    s->p_2 = psm_build_vector (ctx, "switch.p2", s->sw, PSM_INIT_CONST, 1.0f);
  }
  s->v_d = psm_build_matrix (ctx, "switch.out_w", s->sw, 1, PSM_INIT_XAVIER, 0);
  s->b_v = psm_build_vector (ctx, "switch.out_b", 1, PSM_INIT_CONST, (float) psm_section_float (cfg, "switch_bias"));
}

static void *
ps_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  if (ctx->has_attention && ctx->context_dim <= 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: the decoder has attention but no context vector c_t, which the pointer softmax reads",
                 psm_section_path (cfg));
    return NULL;
  }
  PointerSoftmax *s = g_new0 (PointerSoftmax, 1);
  s->seq2seq = ctx->has_attention;
  s->Hs = ctx->state_dim;
  s->Ha = ctx->enc_dim;
  s->V = ctx->task->tgt_vocab;
  s->hidden = (int) psm_section_int (cfg, "hidden");
  s->sw = (int) psm_section_int (cfg, "switch_hidden");
  s->k = (float) psm_section_float (cfg, "temperature");
  /* the shortlist reads c, or [s_t; c_t (; y_(t-1))] on an attention decoder */
  s->maxout = s->seq2seq && strcmp (psm_section_string (cfg, "activation"), "maxout") == 0;
  s->prev_word = s->seq2seq && psm_section_bool (cfg, "prev_word");
  int in_w = s->seq2seq ? ctx->state_dim + ctx->context_dim + (s->prev_word ? ctx->emb_dim : 0) : s->Hs;
  int pieces = s->hidden * (s->maxout ? 2 : 1);   /* the layer's outputs before pooling */
  s->w_w = psm_build_matrix (ctx, "shortlist.w", in_w, pieces, PSM_INIT_XAVIER, 0);
  s->b_w = psm_build_vector (ctx, "shortlist.b", pieces, PSM_INIT_ZEROS, 0);
  s->u_w = psm_build_matrix (ctx, "shortlist.out_w", s->hidden, s->V, PSM_INIT_XAVIER, 0);
  s->b_U = psm_build_vector (ctx, "shortlist.out_b", s->V, PSM_INIT_ZEROS, 0);
  if (s->seq2seq) {
    /* the location softmax is the decoder's attention; the switch reads
     * [s_t; c_t; y_(t-1)] */
    build_switch (s, ctx, cfg, ctx->state_dim + ctx->context_dim + ctx->emb_dim);
    return s;
  }
  s->attn = (int) psm_section_int (cfg, "attn_dim");
  s->summary = strcmp (psm_section_string (cfg, "location"), "summary") == 0;
  s->maxT = ctx->task->max_src_len;
  if (s->summary) {
    s->w_l = psm_build_matrix (ctx, "location.w", s->Hs, s->attn, PSM_INIT_XAVIER, 0);
    s->b_l = psm_build_vector (ctx, "location.b", s->attn, PSM_INIT_ZEROS, 0);
    s->u_l = psm_build_matrix (ctx, "location.out_w", s->attn, s->maxT, PSM_INIT_XAVIER, 0);
    s->b_L = psm_build_vector (ctx, "location.out_b", s->maxT, PSM_INIT_ZEROS, 0);
  } else {
    s->w_k = psm_build_matrix (ctx, "location.w_key", s->Ha, s->attn, PSM_INIT_XAVIER, 0);
    s->w_q = psm_build_matrix (ctx, "location.w_query", s->Hs, s->attn, PSM_INIT_XAVIER, 0);
    s->b_q = psm_build_vector (ctx, "location.b", s->attn, PSM_INIT_ZEROS, 0);
    s->v_a = psm_build_matrix (ctx, "location.v", s->attn, 1, PSM_INIT_XAVIER, 0);
  }
  build_switch (s, ctx, cfg, s->hidden + (s->summary ? s->attn : s->Ha));
  return s;
}

static void ps_destroy (void *self) { g_free (self); }

#define NOISY_ALPHA 1.15f
#define NOISY_C 0.5f

/* The switch logit k x' [R, 1] from its input rows x [R, n]. */
static PsmTensor *
switch_logit (PointerSoftmax *s, PsmGraph *g, PsmParams *p, PsmTensor *x)
{
  PsmTensor *h = psm_linear (g, x, psm_param (g, p, s->w_d), psm_param (g, p, s->b_d));
  if (s->noisy) {
    h = psm_noisy_tanh (g, h, psm_param (g, p, s->p_d), NOISY_ALPHA, NOISY_C);
    PsmTensor *h2 = psm_linear (g, h, psm_param (g, p, s->w_2), psm_param (g, p, s->b_2));
    h = psm_add (g, psm_noisy_tanh (g, h2, psm_param (g, p, s->p_2), NOISY_ALPHA, NOISY_C), h);
  } else {
    h = psm_relu (g, h);
  }
  return psm_scale (g, psm_linear (g, h, psm_param (g, p, s->v_d), psm_param (g, p, s->b_v)), s->k);
}

typedef struct {
  PsmTensor *logits;   /* seq2seq: [B, V] before the log-softmax */
  PsmTensor *logp_w;   /* [B, V] */
  PsmTensor *logp_l;   /* [B, T] */
  PsmTensor *kx;       /* [B, 1] switch logit k x */
} Step;

/* Source mask [T, B] -> [B, T] for the location softmax. */
static float *
mask_bt (PsmGraph *g, const PsmEncoding *enc)
{
  float *m = psm_arena_alloc (psm_graph_arena (g), (size_t) enc->T * enc->B * sizeof (float));
  for (int t = 0; t < enc->T; t++)
    for (int b = 0; b < enc->B; b++)
      m[(size_t) b * enc->T + t] = enc->mask[(size_t) t * enc->B + b];
  return m;
}

static void
forward_step (PointerSoftmax *s, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
              PsmTensor *keys, const float *mbt, PsmTensor *c, Step *out)
{
  int T = enc->T, B = enc->B;
  /* shortlist */
  PsmTensor *uw = psm_tanh (g, psm_linear (g, c, psm_param (g, p, s->w_w), psm_param (g, p, s->b_w)));
  out->logp_w = psm_log_softmax (g, psm_linear (g, uw, psm_param (g, p, s->u_w), psm_param (g, p, s->b_U)));
  PsmTensor *scbt, *ul;
  if (s->summary) {
    /* location from c alone: scores for the first T of maxT positions */
    g_return_if_fail (T <= s->maxT);   /* the task promised max_src_len */
    ul = psm_tanh (g, psm_linear (g, c, psm_param (g, p, s->w_l), psm_param (g, p, s->b_l)));
    scbt = psm_linear (g, ul, psm_param (g, p, s->u_l), psm_param (g, p, s->b_L));
    if (T < s->maxT)
      scbt = psm_slice (g, scbt, 0, T);
    out->logp_l = psm_masked_log_softmax (g, scbt, mbt);
  } else {
    /* pointer network over the annotations */
    PsmTensor *q = psm_linear (g, c, psm_param (g, p, s->w_q), psm_param (g, p, s->b_q));
    PsmTensor *e = psm_tanh (g, psm_add (g, keys, q));                        /* [T, B, A] */
    PsmTensor *sc = psm_matmul (g, e, psm_param (g, p, s->v_a), FALSE, FALSE); /* [T, B, 1] */
    int tb[2] = { T, B };
    scbt = psm_transpose01 (g, psm_tensor_reshape (g, sc, 2, tb));           /* [B, T] */
    out->logp_l = psm_masked_log_softmax (g, scbt, mbt);
    PsmTensor *l = psm_masked_softmax (g, scbt, mbt);
    ul = psm_attend (g, l, enc->annotations);                                 /* [B, Ha] */
  }
  out->kx = switch_logit (s, g, p, psm_concat (g, uw, ul));
  (void) B;
}

/* seq2seq, every step as a row: the shortlist logits [Ty B, V] (V: the
 * batch's candidates, if it has) from f_o, or [nr, V] of the nr rows
 * at rows[] (rows NULL: all), and the switch logit k x [Ty B, 1] from
 * x_t = [s_t; c_t; y_(t-1)]. */
static void
s2s_parts (PointerSoftmax *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const PsmBatch *batch,
           const int32_t *rows, int nr, PsmTensor **logits, PsmTensor **kx)
{
  PsmTensor *sc = psm_concat (g, out->state, out->context), *scx = psm_concat (g, sc, out->input);
  int n = out->Ty * out->B, shape[2] = { n, psm_tensor_cols (scx) }, sc_shape[2] = { n, psm_tensor_cols (sc) };
  PsmTensor *x = psm_tensor_reshape (g, scx, 2, shape);
  PsmTensor *u = s->prev_word ? x : psm_tensor_reshape (g, sc, 2, sc_shape);
  if (rows)
    u = psm_gather_rows (g, u, rows, nr);
  PsmTensor *uw = psm_linear (g, u, psm_param (g, p, s->w_w), psm_param (g, p, s->b_w));
  uw = s->maxout ? psm_maxout (g, uw, 2) : psm_tanh (g, uw);
  PsmTensor *w = psm_param (g, p, s->u_w), *b = psm_param (g, p, s->b_U);
  if (batch->n_cand > 0) {
    w = psm_gather_cols (g, w, batch->cand, batch->n_cand);
    b = psm_gather_cols (g, b, batch->cand, batch->n_cand);
  }
  *logits = psm_linear (g, uw, w, b);
  *kx = switch_logit (s, g, p, x);
}

/* The attention [Ty, B, T] as rows [Ty B, T]. */
static PsmTensor *
attn_rows (PsmGraph *g, const PsmDecOut *out)
{
  int shape[2] = { out->Ty * out->B, psm_tensor_cols (out->attn) };
  return psm_tensor_reshape (g, out->attn, 2, shape);
}

/* -(1/W) sum_r m_r [log p(z_r) + z_r log w_r[y_r] + (1 - z_r) log a_r[loc_r]]
 * over all steps at once: each op averages over its own weights, rescaled
 * to the mean over W = sum m. */
static PsmTensor *
s2s_loss (PointerSoftmax *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const PsmBatch *batch)
{
  int n = out->Ty * out->B;
  float *ws = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (float));
  float *wl = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (float));
  int32_t *zero = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (int32_t));
  int32_t *tgt = batch->tgt;   /* as indices of the candidates, if the batch has them */
  if (batch->n_cand > 0) {
    tgt = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (int32_t));
    for (int r = 0; r < n; r++)
      tgt[r] = batch->tgt_mask[r] != 0.0f ? psm_batch_cand_index (batch, batch->tgt[r]) : 0;
  }
  /* the location targets: PSM_LOC_ARGMAX is the attention's own argmax
   * over the real positions (§5.3's last rule; no gradient through it) */
  int32_t *loc = psm_arena_alloc (psm_graph_arena (g), (size_t) n * sizeof (int32_t));
  int T = psm_tensor_cols (out->attn);
  double W = 0.0, Ws = 0.0, Wl = 0.0;
  for (int r = 0; r < n; r++) {
    float m = batch->tgt_mask[r], z = batch->tgt_switch[r];
    loc[r] = batch->tgt_loc[r];
    if (loc[r] == PSM_LOC_ARGMAX) {
      const float *a = out->attn->data + (size_t) r * T;
      int best = -1, b = r % out->B;
      for (int j = 0; j < T; j++)
        if (batch->src_mask[(size_t) j * out->B + b] != 0.0f && (best < 0 || a[j] > a[best]))
          best = j;
      loc[r] = best;
    }
    ws[r] = m * z;
    wl[r] = loc[r] >= 0 ? m * (1.0f - z) : 0.0f;
    zero[r] = 0;
    W += m;
    Ws += ws[r];
    Wl += wl[r];
  }
  int one = 1;
  if (W == 0.0)
    return psm_tensor_zeros (g, 1, &one, FALSE);
  /* the shortlist logits on the rows that score a shortlist word only (not
   * on padding, nor on the rows the pointer scores) */
  const int32_t *rows;
  int nr = psm_nonzero_rows (g, ws, n, &rows);
  if (rows) {
    tgt = psm_gather_elems (g, tgt, sizeof *tgt, rows, nr);
    ws = psm_gather_elems (g, ws, sizeof *ws, rows, nr);
  }
  PsmTensor *logits, *kx;
  s2s_parts (s, g, p, out, batch, rows, nr, &logits, &kx);
  PsmTensor *loss = psm_bce_logits (g, kx, batch->tgt_switch, batch->tgt_mask);
  if (Ws > 0)
    loss = psm_add (g, loss, psm_scale (g, psm_cross_entropy (g, logits, tgt, ws), (float) (Ws / W)));
  if (Wl > 0) {
    int col[2] = { n, 1 };
    PsmTensor *la = psm_log (g, psm_tensor_reshape (g, psm_pick (g, attn_rows (g, out), loc), 2, col));
    loss = psm_add (g, loss, psm_scale (g, psm_nll (g, la, zero, wl), (float) (Wl / W)));
  }
  return loss;
}

static PsmTensor *
ps_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
         const PsmBatch *batch)
{
  PointerSoftmax *s = self;
  if (s->seq2seq)
    return s2s_loss (s, g, p, out, batch);
  int B = out->B;
  PsmTensor *keys = s->summary ? NULL : psm_matmul (g, enc->annotations, psm_param (g, p, s->w_k), FALSE, FALSE);
  float *mbt = mask_bt (g, enc);
  double W = 0.0;
  for (int i = 0; i < out->Ty * B; i++)
    W += batch->tgt_mask[i];
  PsmTensor *total = NULL;
  float *ws = g_newa (float, B), *wl = g_newa (float, B);
  for (int t = 0; t < out->Ty; t++) {
    Step st;
    forward_step (s, g, p, enc, keys, mbt, psm_tensor_step (g, out->state, t), &st);
    const float *m = batch->tgt_mask + (size_t) t * B, *z = batch->tgt_switch + (size_t) t * B;
    double Wm = 0.0, Ws = 0.0, Wl = 0.0;
    for (int b = 0; b < B; b++) {
      ws[b] = m[b] * z[b];
      wl[b] = m[b] * (1.0f - z[b]);
      Wm += m[b];
      Ws += ws[b];
      Wl += wl[b];
    }
    if (Wm == 0.0)
      continue;
    /* Each op averages over its own weight; rescale to a mean over all W. */
    PsmTensor *lt = psm_scale (g, psm_bce_logits (g, st.kx, z, m), (float) (Wm / W));
    if (Ws > 0)
      lt = psm_add (g, lt, psm_scale (g, psm_nll (g, st.logp_w, batch->tgt + (size_t) t * B, ws), (float) (Ws / W)));
    if (Wl > 0)
      lt = psm_add (g, lt, psm_scale (g, psm_nll (g, st.logp_l, batch->tgt_loc + (size_t) t * B, wl), (float) (Wl / W)));
    total = total ? psm_add (g, total, lt) : lt;
  }
  if (!total) {
    int one = 1;
    total = psm_tensor_zeros (g, 1, &one, FALSE);
  }
  return total;
}

/* The shortlist part of the output space: the batch's candidates on an
 * attention decoder, else the shortlist. */
static int
vocab_part (const PointerSoftmax *s, const PsmBatch *batch)
{
  return s->seq2seq ? PSM_BATCH_VOCAB (batch, s->V) : s->V;
}

static int
ps_space (void *self, const PsmBatch *batch)
{
  return vocab_part (self, batch) + batch->T;
}

static inline double
softplus (double x)
{
  return x > 0 ? x + log1p (exp (-x)) : log1p (exp (x));
}

/* One decoding step (out->Ty == 1): the switch logit, and with logp the
 * shortlist and location log-probabilities (on an attention decoder the
 * attention is the location softmax). */
static void
one_step (PointerSoftmax *s, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
          const PsmBatch *batch, gboolean logp, Step *st)
{
  if (s->seq2seq) {
    s2s_parts (s, g, p, out, batch, NULL, 0, &st->logits, &st->kx);
    if (logp) {
      st->logp_w = psm_log_softmax (g, st->logits);
      st->logp_l = psm_log (g, attn_rows (g, out));
    }
  } else {
    PsmTensor *keys = s->summary ? NULL : psm_matmul (g, enc->annotations, psm_param (g, p, s->w_k), FALSE, FALSE);
    forward_step (s, g, p, enc, keys, mask_bt (g, enc), psm_tensor_step (g, out->state, 0), st);
  }
}

static PsmTensor *
ps_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
           const PsmBatch *batch)
{
  PointerSoftmax *s = self;
  int B = out->B, T = enc->T, V = vocab_part (s, batch), S = V + T;
  Step st;
  one_step (s, g, p, enc, out, batch, TRUE, &st);
  int shape[2] = { B, S };
  PsmTensor *sc = psm_tensor_new (g, 2, shape, FALSE);
  for (int b = 0; b < B; b++) {
    double kx = st.kx->data[b];
    float log_d = (float) -softplus (-kx), log_1md = (float) -softplus (kx);
    float *row = sc->data + (size_t) b * S;
    for (int v = 0; v < V; v++)
      row[v] = log_d + st.logp_w->data[(size_t) b * V + v];
    for (int j = 0; j < T; j++)   /* padding is never pointed at */
      row[V + j] = enc->mask[(size_t) j * B + b] != 0.0f ? log_1md + st.logp_l->data[(size_t) b * T + j] : -INFINITY;
  }
  return sc;
}

static int32_t
ps_slot_token (void *self, const PsmBatch *batch, int b, int slot)
{
  PointerSoftmax *s = self;
  int V = vocab_part (s, batch);
  if (slot < V)
    return batch->n_cand > 0 && s->seq2seq ? batch->cand[slot] : slot;
  return PSM_AT (batch->src_ext, batch, slot - V, b);
}

/* The probability d_t of the shortlist at one step (decoding output). */
static PsmTensor *
ps_gate (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  Step st;
  one_step (self, g, p, enc, out, b, FALSE, &st);
  return psm_sigmoid (g, st.kx);
}

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = ps_create,
  .destroy = ps_destroy,
  .loss = ps_loss,
  .space_size = ps_space,
  .scores = ps_scores,
  .slot_token = ps_slot_token,
  .gate = ps_gate,
};

PSM_PLUGIN (PSM_KIND_HEAD, "pointer_softmax",
            "Gulcehre et al. 2016: shortlist softmax + location softmax + observed switch d = s(k x)",
            params, NULL, &klass)
