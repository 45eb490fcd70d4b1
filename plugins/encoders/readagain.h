/* readagain.h — what the two read-again encoders (readagain_gru.c,
 * readagain_lstm.c; Zeng et al. 2016 §3.1) share: the sentences of the
 * source and the global vectors that bias the second read.
 *
 * The source is one or more sentences (PsmEncoding.seg, §3.1.3). The first
 * read restarts from a zero state at each sentence's first token; sentence
 * k's vector v_k is the first read's state at its last token (zeros for a
 * sentence the example does not have). Every token i of sentence k gets a
 * global input g_i for the second read (which restarts at each sentence too):
 *   one sentence (sentences = 1):   g_i = v_0                  (h¹_n)
 *   combine = concat (option 1):    g_i = [v_0; ...; v_(K-1)]  (eq. 9)
 *   combine = global (option 2):    g_i = [v_k; h_global],
 *                                   h_global = tanh([v_0; ...; v_(K-1)] W_r + v_r)   (eq. 10-11)
 * A sentence numbered K or beyond is read as part of sentence K - 1's
 * vector slot (it still restarts the reads). Included by exactly these two
 * plugins; everything is static. */
#ifndef PSM_READAGAIN_H
#define PSM_READAGAIN_H
#include <string.h>
#include <psm/psm.h>

typedef struct {
  int K;              /* sentences given a vector slot */
  gboolean global;    /* combine = global (option 2) */
  int H;              /* first-read state size */
  int w_r, b_r;       /* option 2's W_r (all U_r stacked) and v_r */
} RaSentences;

#define RA_SENTENCE_PARAMS                                                                                       \
  { "sentences", PSM_PARAM_INT, "1", 1, PSM_MAX_SENTENCES,                                                       \
    "sentences of the source with their own vector (Zeng et al. §3.1.3; the task splits them)", NULL },        \
  { "combine", PSM_PARAM_CHOICE, "concat", PSM_NO_RANGE,                                                         \
    "several sentences: concat (option 1, eq. 9) or global (option 2, eq. 10-11)", "concat|global" },          \
  { "dropout", PSM_PARAM_FLOAT, "0", 0.0, 0.95, "dropout on the embedded input and the annotations (paper: 0.2)", \
    NULL }

static void
ra_sentences_build (RaSentences *rs, const PsmSection *cfg, const PsmBuildCtx *ctx, int H)
{
  rs->K = (int) psm_section_int (cfg, "sentences");
  rs->global = strcmp (psm_section_string (cfg, "combine"), "global") == 0;
  rs->H = H;
  if (rs->global) {
    rs->w_r = psm_build_matrix (ctx, "w_global", rs->K * H, H, PSM_INIT_XAVIER, 0);
    rs->b_r = psm_build_vector (ctx, "b_global", H, PSM_INIT_ZEROS, 0);
  }
}

/* Size of g_i. */
static int
ra_global_dim (const RaSentences *rs)
{
  return rs->K == 1 ? rs->H : rs->global ? 2 * rs->H : rs->K * rs->H;
}

static int
ra_slot (const RaSentences *rs, const PsmEncoding *enc, int t, int b)
{
  int k = enc->seg ? enc->seg[(size_t) t * enc->B + b] : 0;
  return MIN (k, rs->K - 1);
}

/* keep[t][b] = 0 where token t of example b starts a sentence after the
 * first (the reads restart there), else 1; NULL if no token does. */
static float *
ra_restarts (PsmGraph *g, const PsmEncoding *enc)
{
  int T = enc->T, B = enc->B;
  float *keep = NULL;
  for (int t = 1; enc->seg && t < T; t++)
    for (int b = 0; b < B; b++) {
      size_t k = (size_t) t * B + b;
      if (enc->mask[k] != 0.0f && enc->seg[k] != enc->seg[k - B]) {
        if (!keep) {
          keep = psm_arena_alloc (psm_graph_arena (g), (size_t) T * B * sizeof (float));
          for (size_t i = 0; i < (size_t) T * B; i++)
            keep[i] = 1.0f;
        }
        keep[k] = 0.0f;
      }
    }
  return keep;
}

/* state * keep[t] where a sentence starts at t (state unchanged otherwise). */
static PsmTensor *
ra_restart (PsmGraph *g, PsmTensor *state, const float *keep, int t, int B)
{
  if (!keep)
    return state;
  const float *k = keep + (size_t) t * B;
  for (int b = 0; b < B; b++)
    if (k[b] == 0.0f) {
      int sh[1] = { B };
      return psm_mul_rows (g, state, psm_tensor_wrap (g, (float *) k, NULL, 1, sh));
    }
  return state;
}

/* The global input g_i of every token [T, B, ra_global_dim] from the first
 * read h1 [T, B, H]. */
static PsmTensor *
ra_global_inputs (const RaSentences *rs, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, PsmTensor *h1)
{
  int T = enc->T, B = enc->B, H = rs->H, K = rs->K;
  /* v_k of example b: row k B + b, from the last real token of sentence
   * slot k (row T B of [h1; zeros] where there is none) */
  int zs[3] = { 1, B, H };
  PsmTensor *hz = psm_concat_steps (g, h1, psm_tensor_zeros (g, 3, zs, FALSE));
  int32_t *last = psm_arena_alloc (psm_graph_arena (g), (size_t) K * B * sizeof (int32_t));
  for (int i = 0; i < K * B; i++)
    last[i] = T * B + i % B;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      if (enc->mask[(size_t) t * B + b] != 0.0f)
        last[ra_slot (rs, enc, t, b) * B + b] = t * B + b;
  PsmTensor *v = psm_gather_rows (g, hz, last, K * B);   /* [K B, H] */
  int32_t *rows = psm_arena_alloc (psm_graph_arena (g), (size_t) T * B * sizeof (int32_t));
  int shape[3] = { T, B, H };
  if (K == 1) {
    for (int t = 0; t < T; t++)
      for (int b = 0; b < B; b++)
        rows[(size_t) t * B + b] = b;
    return psm_tensor_reshape (g, psm_gather_rows (g, v, rows, T * B), 3, shape);
  }
  /* all sentence vectors side by side: [B, K H] */
  PsmTensor *all = NULL;
  for (int k = 0; k < K; k++) {
    int vs[2] = { B, H };
    PsmTensor *vk = psm_tensor_view (g, v, (size_t) k * B * H, 2, vs);
    all = all ? psm_concat (g, all, vk) : vk;
  }
  if (rs->global)
    all = psm_tanh (g, psm_linear (g, all, psm_param (g, p, rs->w_r), psm_param (g, p, rs->b_r)));
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      rows[(size_t) t * B + b] = b;
  PsmTensor *per = psm_gather_rows (g, all, rows, T * B);
  shape[2] = psm_tensor_cols (all);
  per = psm_tensor_reshape (g, per, 3, shape);
  if (!rs->global)
    return per;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      rows[(size_t) t * B + b] = ra_slot (rs, enc, t, b) * B + b;
  shape[2] = H;
  PsmTensor *own = psm_tensor_reshape (g, psm_gather_rows (g, v, rows, T * B), 3, shape);
  return psm_concat (g, own, per);
}

#endif
