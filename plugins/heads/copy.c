/* copy — Zeng et al. 2016's decoder output with copy mechanism (§3.2).
 *
 * At step t the decoder's state s_t (and context c_t) give one distribution
 * over generating a word of the decoder vocabulary Y and copying the word
 * x_i at any source position i:
 *   generate  g_t(w) = (f([s_t; c_t] W_u + b_u) or [s_t; c_t]) W_o + b_o   w in Y
 *   copy      k_t(i) = s_t W_k . h²_i                                      i real
 *   p(y_t = w) = [sum_(v in Y, v = w) e^(g_t(v)) + sum_(i: x_i = w) e^(k_t(i))] / Z_t
 * with Z_t summing every generate and copy term. The text of the paper
 * available to us (../shared/seeds/002) lost eq. 16-17, which define these
 * scores; it describes one distribution "over generating words from Y, as
 * well as over copying a specific word x_i" and likens it to Gu et al.'s
 * (CopyNet) single softmax, which is what this head is. Its generate part
 * is the `softmax` head's (hidden, activation), so the two differ only by
 * copying; the copy score is bilinear in s_t and the annotation h²_i.
 *
 * Since p(y_t) = s(Zg - Zc) P_gen(y_t) + (1 - s(Zg - Zc)) P_copy(y_t), with
 * Zg, Zc the log-sums of the generate and copy terms, training never builds
 * the joint distribution: it gathers the target's log P_gen
 * (pick_log_softmax), its copy mass (gather_mass) and mixes them
 * (mixture_nll), all Ty steps at once; the generate scores are computed on
 * the real target rows only (not on padding). A word outside Y that the
 * source holds is produced only by copying; a word in neither is <unk>.
 *
 * The decoder's next input (eq. 15): a word in Y uses its embedding; a word
 * outside Y that the source holds uses p_i = tanh(h²_i W_c + b_c) of its
 * first position i (copy_input; the same rule in training, where the input
 * is the previous target, and in beam search, per hypothesis); any other
 * word the <unk> embedding.
 *
 * Output space for decoding: the vocabulary Y (the batch's candidates, if
 * any), then the source positions. A source word in Y is scored at its
 * vocabulary slot (generate and copy mass summed), any other word at its
 * first position (all its positions summed); the other positions are -inf,
 * so each word is one slot holding its whole probability. */
#include <math.h>
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int S, C, E, Ha, V, hidden, unk;
  gboolean linear, copy_input;
  int w_u, b_u, w_o, b_o, w_k, w_c, b_c;
  /* the generate probability of the last scores() call, for gate() at the
   * same step (decoding asks for both; the logits are computed once) */
  const float *last_state;
  PsmTensor *last_gate;
} Copy;

static const PsmParamSpec params[] = {
  { "hidden", PSM_PARAM_INT, "0", 0, 16384, "layer before the generate scores (0 = none), as the softmax head's",
    NULL },
  { "activation", PSM_PARAM_CHOICE, "tanh", PSM_NO_RANGE, "of that layer", "tanh|linear" },
  { "copy_input", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "a copied word outside Y enters the decoder as tanh(W_c h_i + b_c) (eq. 15); false: as <unk>", NULL },
  PSM_PARAM_END
};

static void *
cp_create (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error)
{
  if (!ctx->has_attention || ctx->enc_dim <= 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: copy reads the encoder's annotations from a decoder step: use a decoder cell with attention "
                 "(lstm_attn or gru_attn)", psm_section_path (cfg));
    return NULL;
  }
  if (ctx->task->unk_id < 0 || ctx->task->unk_id >= ctx->task->tgt_vocab) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: copy needs a task with an unknown word in its shortlist", psm_section_path (cfg));
    return NULL;
  }
  Copy *s = g_new0 (Copy, 1);
  s->S = ctx->state_dim;
  s->C = ctx->context_dim;
  s->E = ctx->emb_dim;
  s->Ha = ctx->enc_dim;
  s->V = ctx->task->tgt_vocab;
  s->unk = ctx->task->unk_id;
  s->hidden = (int) psm_section_int (cfg, "hidden");
  s->linear = strcmp (psm_section_string (cfg, "activation"), "linear") == 0;
  s->copy_input = psm_section_bool (cfg, "copy_input");
  int in = s->S + s->C;
  if (s->hidden) {
    s->w_u = psm_build_matrix (ctx, "w_u", in, s->hidden, PSM_INIT_XAVIER, 0);
    s->b_u = psm_build_vector (ctx, "b_u", s->hidden, PSM_INIT_ZEROS, 0);
    in = s->hidden;
  }
  s->w_o = psm_build_matrix (ctx, "w_o", in, s->V, PSM_INIT_XAVIER, 0);
  s->b_o = psm_build_vector (ctx, "b_o", s->V, PSM_INIT_ZEROS, 0);
  s->w_k = psm_build_matrix (ctx, "copy.w", s->S, s->Ha, PSM_INIT_XAVIER, 0);
  s->w_c = psm_build_matrix (ctx, "input.w", s->Ha, s->E, PSM_INIT_XAVIER, 0);
  s->b_c = psm_build_vector (ctx, "input.b", s->E, PSM_INIT_ZEROS, 0);
  return s;
}

static void cp_destroy (void *self) { g_free (self); }

/* Rows [R, C] of a time-major [Ty, B, C]. */
static PsmTensor *
rows_of (PsmGraph *g, PsmTensor *x, int R)
{
  int shape[2] = { R, psm_tensor_cols (x) };
  return psm_tensor_reshape (g, x, 2, shape);
}

/* The generate scores [R, V'] (V' = the batch's candidates, if it has), or
 * [n, V'] of the n rows at rows[] (rows NULL: all). */
static PsmTensor *
gen_logits (Copy *s, PsmGraph *g, PsmParams *p, const PsmDecOut *out, const PsmBatch *batch, const int32_t *rows,
            int n)
{
  int R = out->Ty * out->B;
  PsmTensor *u = rows_of (g, out->context ? psm_concat (g, out->state, out->context) : out->state, R);
  if (rows)
    u = psm_gather_rows (g, u, rows, n);
  if (s->hidden) {
    u = psm_linear (g, u, psm_param (g, p, s->w_u), psm_param (g, p, s->b_u));
    if (!s->linear)
      u = psm_tanh (g, u);
  }
  PsmTensor *w = psm_param (g, p, s->w_o), *b = psm_param (g, p, s->b_o);
  if (batch->n_cand > 0) {
    w = psm_gather_cols (g, w, batch->cand, batch->n_cand);
    b = psm_gather_cols (g, b, batch->cand, batch->n_cand);
  }
  return psm_linear (g, u, w, b);
}

/* The copy scores [R, T] and their mask (real positions of row r's example). */
static PsmTensor *
copy_logits (Copy *s, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, float **mask)
{
  int R = out->Ty * out->B, T = enc->T, B = enc->B;
  PsmTensor *q = psm_linear (g, rows_of (g, out->state, R), psm_param (g, p, s->w_k), NULL);
  float *m = psm_arena_alloc (psm_graph_arena (g), (size_t) R * T * sizeof (float));
  for (int r = 0; r < R; r++)
    for (int i = 0; i < T; i++)
      m[(size_t) r * T + i] = enc->mask[(size_t) i * B + r % B];
  *mask = m;
  return psm_dot_scores (g, enc->annotations, q);
}

/* The slot of word w (extended id) in the generate part, or -1. */
static int
vocab_slot (const Copy *s, const PsmBatch *batch, int32_t w)
{
  if (w < 0 || w >= s->V)
    return -1;
  return batch->n_cand > 0 ? psm_batch_cand_index (batch, w) : w;
}

/* Whether example b's source holds word w (extended id) at a real position:
 * the first such position, or -1. */
static int
first_position (const PsmBatch *batch, int b, int32_t w)
{
  for (int i = 0; i < batch->T; i++)
    if (PSM_AT (batch->src_ext, batch, i, b) == w && PSM_AT (batch->src_mask, batch, i, b) != 0.0f)
      return i;
  return -1;
}

static PsmTensor *
cp_loss (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  Copy *s = self;
  int R = out->Ty * out->B;
  int32_t *tv = psm_arena_alloc (psm_graph_arena (g), (size_t) R * sizeof (int32_t));
  for (int r = 0; r < R; r++) {
    int32_t w = b->tgt_ext[r];
    int v = vocab_slot (s, b, w);
    tv[r] = v >= 0 ? v : first_position (b, r % b->B, w) >= 0 ? -1 : vocab_slot (s, b, s->unk);
  }
  /* the generate scores on the real target rows only (padding has weight 0
   * in mixture_nll) */
  const int32_t *rows;
  int n = psm_nonzero_rows (g, b->tgt_mask, R, &rows);
  const int32_t *tr = rows ? psm_gather_elems (g, tv, sizeof *tv, rows, n) : tv;
  float *mask;
  PsmTensor *gl = gen_logits (s, g, p, out, b, rows, n), *cl = copy_logits (s, g, p, enc, out, &mask);
  PsmTensor *zg = psm_logsumexp (g, gl, NULL), *lv = psm_pick_log_softmax (g, gl, tr);
  if (rows) {
    zg = psm_scatter_rows (g, zg, rows, R);
    lv = psm_scatter_rows (g, lv, rows, R);
  }
  PsmTensor *z = psm_add (g, zg, psm_scale (g, psm_logsumexp (g, cl, mask), -1.0f));
  PsmTensor *mass = psm_gather_mass (g, psm_masked_softmax (g, cl, mask), b->src_ext, b->B, b->tgt_ext);
  return psm_mixture_nll (g, z, lv, mass, b->tgt_mask);
}

static int
vocab_part (const Copy *s, const PsmBatch *batch)
{
  return PSM_BATCH_VOCAB (batch, s->V);
}

static int
cp_space (void *self, const PsmBatch *batch)
{
  return vocab_part (self, batch) + batch->T;
}

/* log(e^a + e^b), -inf-safe */
static inline double
logaddexp (double a, double b)
{
  if (a == -INFINITY)
    return b;
  if (b == -INFINITY)
    return a;
  return a > b ? a + log1p (exp (b - a)) : b + log1p (exp (a - b));
}

static PsmTensor *
cp_scores (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  Copy *s = self;
  int n = out->B, T = enc->T, V = vocab_part (s, b), S = V + T;
  float *mask;
  PsmTensor *gl = gen_logits (s, g, p, out, b, NULL, 0), *cl = copy_logits (s, g, p, enc, out, &mask);
  int shape[2] = { n, S }, gs[2] = { n, 1 };
  PsmTensor *sc = psm_tensor_new (g, 2, shape, FALSE);
  s->last_gate = psm_tensor_new (g, 2, gs, FALSE);
  s->last_state = out->state->data;
  /* the generate part normalised alone, then every entry shifted by
   * log P(generate) = -log(1 + e^(lc)), lc the copy terms' log-sum relative
   * to the generate part's: each row's log-sum from the core's vectorised
   * pass, and the scores written once, from the logits (no [n, V] log-
   * softmax in between: at 15,000 words and 640 hypotheses a step it was
   * 38 MB written and read again) */
  PsmTensor *lz = psm_logsumexp (g, gl, NULL);
  double *mall = psm_arena_alloc (psm_graph_arena (g), (size_t) n * MAX (T, 1) * sizeof (double));
  /* rows apart over the threads (each row's arithmetic as alone) */
#pragma omp parallel for if ((long) n * (V + 8 * T) >= 65536) schedule (static)
  for (int r = 0; r < n; r++) {
    double *ma = mall + (size_t) r * T;
    const float *gr = gl->data + (size_t) r * V;
    const float *cr = cl->data + (size_t) r * T, *mr = mask + (size_t) r * T;
    float *row = sc->data + (size_t) r * S, ls = lz->data[r];
    double lse_g = ls, lc = -INFINITY;
    for (int i = 0; i < T; i++) {
      ma[i] = mr[i] != 0.0f ? cr[i] - lse_g : -INFINITY;
      lc = logaddexp (lc, ma[i]);
    }
    double shift = -logaddexp (0.0, lc);
    s->last_gate->data[r] = (float) exp (shift);
    float sh = (float) shift;
#pragma omp simd
    for (int v = 0; v < V; v++)
      row[v] = (gr[v] - ls) + sh;
    /* each copied word onto one slot: all its positions' mass gathered on
     * its first, then that goes to its vocabulary slot (with the generate
     * term) or stays on the first position */
    for (int i = 0; i < T; i++) {
      row[V + i] = -INFINITY;
      if (mr[i] == 0.0f)
        continue;
      int f = first_position (b, r, PSM_AT (b->src_ext, b, i, r));
      if (f < i) {
        ma[f] = logaddexp (ma[f], ma[i]);
        ma[i] = -INFINITY;
      }
    }
    for (int i = 0; i < T; i++) {
      if (mr[i] == 0.0f || ma[i] == -INFINITY)
        continue;
      int v = vocab_slot (s, b, PSM_AT (b->src_ext, b, i, r));
      if (v >= 0)
        row[v] = (float) (logaddexp (gr[v] - ls, ma[i]) + shift);
      else
        row[V + i] = (float) (ma[i] + shift);
    }
  }
  return sc;
}

static int32_t
cp_slot_token (void *self, const PsmBatch *batch, int b, int slot)
{
  int V = vocab_part (self, batch);
  if (slot < V)
    return batch->n_cand > 0 ? batch->cand[slot] : slot;
  return PSM_AT (batch->src_ext, batch, slot - V, b);
}

/* The probability of generating (rather than copying) at one step. */
static PsmTensor *
cp_gate (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out, const PsmBatch *b)
{
  Copy *s = self;
  if (s->last_state == out->state->data && s->last_gate && psm_tensor_rows (s->last_gate) == out->B)
    return s->last_gate;
  float *mask;
  PsmTensor *gl = gen_logits (s, g, p, out, b, NULL, 0), *cl = copy_logits (s, g, p, enc, out, &mask);
  return psm_sigmoid (g, psm_add (g, psm_logsumexp (g, gl, NULL), psm_scale (g, psm_logsumexp (g, cl, mask), -1.0f)));
}

/* eq. 15: inputs that are words outside Y found in the source become
 * tanh(h_i W_c + b_c) of their first position i. */
static PsmTensor *
cp_input_embed (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmBatch *batch,
                const int32_t *words, const int32_t *rows, int n, PsmTensor *x)
{
  Copy *s = self;
  if (!s->copy_input)
    return x;
  int32_t *sel = psm_arena_alloc (psm_graph_arena (g), 2 * (size_t) n * sizeof (int32_t)), *hrows = sel + n;
  int k = 0;
  for (int r = 0; r < n; r++) {
    int i = words[r] >= s->V ? first_position (batch, rows[r], words[r]) : -1;
    sel[r] = i >= 0 ? n + k : r;
    if (i >= 0)
      hrows[k++] = i * enc->B + rows[r];
  }
  if (!k)
    return x;
  PsmTensor *h = psm_gather_rows (g, enc->annotations, hrows, k);
  PsmTensor *pc = psm_tanh (g, psm_linear (g, h, psm_param (g, p, s->w_c), psm_param (g, p, s->b_c)));
  return psm_gather_rows (g, psm_concat_steps (g, x, pc), sel, n);
}

static const PsmHeadClass klass = {
  .size = sizeof (PsmHeadClass),
  .create = cp_create,
  .destroy = cp_destroy,
  .loss = cp_loss,
  .space_size = cp_space,
  .scores = cp_scores,
  .slot_token = cp_slot_token,
  .gate = cp_gate,
  .input_embed = cp_input_embed,
};

PSM_PLUGIN (PSM_KIND_HEAD, "copy",
            "Zeng et al. 2016: one softmax over generating from a small vocabulary and copying source positions; "
            "copied words outside it enter the decoder as their source annotation",
            params, NULL, &klass)
