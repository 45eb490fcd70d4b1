/* psm-model-forward.c — one forward pass for training and evaluation: encoding,
 * the head's history, teacher-forced decoding, the training loss. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

/* Embeds the source and runs the encoder (and the decoder's prepare). */
void
encode (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc)
{
  PsmTensor *table = psm_param (g, m->params, m->emb_id);
  PsmTensor *x = psm_embedding (g, table, b->src, b->T * b->B);
  int shape[3] = { b->T, b->B, psm_tensor_cols (table) };
  x = psm_tensor_reshape (g, x, 3, shape);
  memset (enc, 0, sizeof *enc);
  enc->want_importance = m->want_importance;
  enc->T = b->T;
  enc->B = b->B;
  enc->mask = b->src_mask;
  enc->src = b->src;
  enc->seg = b->src_seg;
  enc->carry_at = b->advance > 0 && b->advance < b->T ? b->advance : 0;
  float *carry = NULL;
  if (m->streams && m->carry_k) {
    /* the state of the previous segment, zero where a stream starts */
    int mode = m->carry_mode;
    if (m->carry_rows[mode] != b->B) {
      g_free (m->carry[mode]);
      m->carry[mode] = g_new0 (float, (size_t) b->B * m->carry_k);
      m->carry_rows[mode] = b->B;
    }
    carry = m->carry[mode];
    for (int i = 0; i < b->B; i++)
      if (b->keep[i] == 0.0f)
        memset (carry + (size_t) i * m->carry_k, 0, m->carry_k * sizeof (float));
    /* a copy the graph owns: the buffer gets this segment's end state
     * below, and the backward pass still reads the start state */
    enc->carry_in = psm_graph_dup (g, carry, (size_t) b->B * m->carry_k * sizeof (float));
  }
  m->ek->encode (m->enc, g, m->params, x, b->src_mask, enc);
  if (carry && enc->carry_out) {
    g_return_if_fail (enc->carry_out->n == (size_t) b->B * m->carry_k);
    memcpy (carry, enc->carry_out->data, enc->carry_out->n * sizeof (float));
  }
  /* a decoder's training graph: every step's attention reads the annotations */
  gboolean attn_training = m->dk && enc->annotations && enc->annotations->grad && enc->annotations->ndim == 3;
  if (attn_training)
    psm_defer_values_grad (g, enc->annotations);   /* one GEMM per example instead of a pass per step */
  PsmTensor *(*prepare) (void *, PsmGraph *, PsmParams *, const PsmEncoding *) = m->dk ? PSM_CLASS_HOOK (m->dk, prepare) : NULL;
  if (prepare)
    enc->memo = prepare (m->dec, g, m->params, enc);
  if (attn_training) {   /* batch-major copies (ops-internal.h) */
    psm_attention_batch_major (g, enc->annotations);
    if (enc->memo && enc->memo->ndim == 3)
      psm_attention_batch_major (g, enc->memo);
  }
}

/* The history of the current mode for B streams: allocated (empty) when
 * B changes, emptied for the streams that start again. */
static void
history_prepare (PsmModel *m, const PsmBatch *b)
{
  int mode = m->carry_mode, P = m->hist_p, H = m->hist_h;
  if (m->hist_rows[mode] != b->B) {
    g_free (m->hist[mode]);
    g_free (m->hist_ids[mode]);
    m->hist[mode] = g_new0 (float, (size_t) P * b->B * H);
    m->hist_ids[mode] = g_new (int32_t, (size_t) P * b->B);
    for (size_t i = 0; i < (size_t) P * b->B; i++)
      m->hist_ids[mode][i] = -1;
    m->hist_rows[mode] = b->B;
  }
  for (int i = 0; i < b->B; i++)
    if (b->keep[i] == 0.0f)
      for (int p = 0; p < P; p++)
        m->hist_ids[mode][(size_t) p * b->B + i] = -1;
}

/* After a segment: the history becomes the last hist_p positions of
 * (history, this segment); padded positions have no word. */
void
history_push (PsmModel *m, const PsmBatch *b, const PsmEncoding *enc)
{
  /* overlapping segments: the next one starts after the first `advance` */
  int mode = m->carry_mode, P = m->hist_p, H = m->hist_h, B = b->B;
  int T = b->advance > 0 && b->advance < b->T ? b->advance : b->T;
  float *hs = m->hist[mode];
  int32_t *ids = m->hist_ids[mode];
  size_t row = (size_t) B * H;
  int shift = MIN (T, P);
  if (P > T) {
    memmove (hs, hs + (size_t) T * row, (size_t) (P - T) * row * sizeof (float));
    memmove (ids, ids + (size_t) T * B, (size_t) (P - T) * B * sizeof (int32_t));
  }
  for (int k = 0; k < shift; k++) {
    int t = T - shift + k, p = P - shift + k;
    memcpy (hs + (size_t) p * row, enc->annotations->data + (size_t) t * row, row * sizeof (float));
    for (int i = 0; i < B; i++)
      ids[(size_t) p * B + i] = b->src_mask[(size_t) t * B + i] != 0.0f ? b->src[(size_t) t * B + i] : -1;
  }
}

/* No decoder: the head sees one step whose state is the summary; or, for
 * stream tasks, every position, whose states are the annotations (and the
 * history the head asked for). */
static void
summary_step (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc, PsmDecOut *out)
{
  memset (out, 0, sizeof *out);
  out->B = enc->B;
  if (m->streams) {
    out->Ty = enc->T;
    out->state = enc->annotations;
    if (m->hist_p) {
      /* copies the graph owns: the buffers get this segment's end below,
       * and the backward pass still reads the window */
      history_prepare (m, b);
      int mode = m->carry_mode, shape[3] = { m->hist_p, b->B, m->hist_h };
      size_t n = (size_t) m->hist_p * b->B;
      out->P = m->hist_p;
      out->past = psm_tensor_wrap (g, psm_graph_dup (g, m->hist[mode], n * m->hist_h * sizeof (float)), NULL, 3,
                                   shape);
      out->past_ids = psm_graph_dup (g, m->hist_ids[mode], n * sizeof (int32_t));
    }
    return;
  }
  out->Ty = 1;
  int s3[3] = { 1, enc->B, psm_tensor_cols (enc->summary) };
  out->state = psm_tensor_reshape (g, enc->summary, 3, s3);
}

/* Copies step t's output x [R, C] into rows 0 .. R - 1 of step t of the
 * stack *seq [Ty, B, C], made at the first step; rows R .. B - 1 of the
 * step (past their targets' end, PSM_DECODER_LIVE_ROWS) are zeros. */
static void
stack_step (PsmGraph *g, PsmTensor **seq, int Ty, int B, int t, PsmTensor *x)
{
  if (!x)
    return;
  int R = psm_tensor_rows (x), C = psm_tensor_cols (x);
  g_return_if_fail (R <= B);
  if (!*seq) {
    int shape[3] = { Ty, B, C };
    *seq = psm_tensor_new (g, 3, shape, x->grad != NULL);
  }
  if (R == B) {
    psm_set_step (g, *seq, t, x);
    return;
  }
  size_t at = (size_t) t * B * C;
  memset ((*seq)->data + at + (size_t) R * C, 0, (size_t) (B - R) * C * sizeof (float));
  int shape[3] = { 1, R, C };
  psm_set_step (g, psm_tensor_view (g, *seq, at, 3, shape), 0, x);
}

/* The first R rows of a batch-major x [B, C] (a view: no copy, its
 * gradient x's). */
static PsmTensor *
first_rows (PsmGraph *g, PsmTensor *x, int R)
{
  if (psm_tensor_rows (x) == R)
    return x;
  int shape[2] = { R, psm_tensor_cols (x) };
  return psm_tensor_view (g, x, 0, 2, shape);
}

/* Whether teacher-forced steps run on the rows still decoding: a decoder
 * with PSM_DECODER_LIVE_ROWS, unless psm_model_set_all_rows. */
static gboolean
steps_on_live_rows (PsmModel *m)
{
  return m->dk && !m->all_rows && (PSM_STRUCT_FIELD (m->dk, flags, 0u) & PSM_DECODER_LIVE_ROWS);
}

/* live[t]: 1 + the last row with a real target at step t or later (at
 * least 1): with the rows in order of target length (psm_batch_sort_by_
 * target) exactly the rows still decoding at t. NULL when every step runs
 * on all rows (a decoder without PSM_DECODER_LIVE_ROWS, or no step with
 * fewer). */
static int *
live_rows (PsmModel *m, PsmGraph *g, const PsmBatch *b)
{
  if (!steps_on_live_rows (m))
    return NULL;
  int *live = psm_graph_alloc (g, (size_t) b->Ty * sizeof (int)), R = 1;
  gboolean fewer = FALSE;
  for (int t = b->Ty - 1; t >= 0; t--) {
    for (int j = b->B - 1; j >= R; j--)
      if (PSM_AT (b->tgt_mask, b, t, j) != 0.0f) {
        R = j + 1;
        break;
      }
    live[t] = R;
    fewer |= R < b->B;
  }
  return fewer ? live : NULL;
}

/* Teacher forcing: the decoder over the Ty steps of b, inputs b->dec_in
 * (through the head's input_embed, if it has one: the previous targets'
 * tgt_ext); step outputs stacked time-major for the head. */
static void
decode_forced (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc, PsmDecOut *out)
{
  PsmTensor *table = psm_param (g, m->params, m->tgt_emb_id);
  int E = psm_tensor_cols (table), n = b->Ty * b->B;
  PsmTensor *x = psm_embedding (g, table, b->dec_in, n);
  InputEmbedFn input_embed = PSM_CLASS_HOOK (m->hk, input_embed);
  if (input_embed) {
    int32_t *words = psm_graph_alloc (g, 2 * (size_t) n * sizeof (int32_t)), *rows = words + n;
    for (int r = 0; r < n; r++) {
      rows[r] = r % b->B;
      words[r] = r < b->B || b->tgt_mask[r - b->B] == 0.0f ? b->dec_in[r] : b->tgt_ext[r - b->B];
    }
    x = input_embed (m->head, g, m->params, enc, b, words, rows, n, x);
  }
  int shape[3] = { b->Ty, b->B, E };
  x = psm_tensor_reshape (g, x, 3, shape);
  memset (out, 0, sizeof *out);
  out->Ty = b->Ty;
  out->B = b->B;
  PsmTensor *carry = m->dk->init (m->dec, g, m->params, enc);
  const int *live = live_rows (m, g, b);
  for (int t = 0; t < b->Ty; t++) {
    PsmDecStep st = { 0 };
    int R = live ? live[t] : b->B;   /* rows 0 .. R - 1 still decode */
    m->dk->step (m->dec, g, m->params, enc, first_rows (g, carry, R), first_rows (g, psm_tensor_step (g, x, t), R),
                 &st);
    stack_step (g, &out->state, b->Ty, b->B, t, st.state);
    stack_step (g, &out->context, b->Ty, b->B, t, st.context);
    stack_step (g, &out->attn, b->Ty, b->B, t, st.attn);
    stack_step (g, &out->coverage, b->Ty, b->B, t, st.coverage);
    stack_step (g, &out->input, b->Ty, b->B, t, st.input);
    carry = st.carry;
  }
}

void
psm_model_set_all_rows (PsmModel *m, gboolean all)
{
  m->all_rows = all;
}

void
psm_model_check_mode (PsmModel *m)
{
  m->check_mode = TRUE;
  m->train_rng = NULL;
}

gboolean
psm_model_train_batch (PsmModel *m, int B, PsmRng *rng, GError **error)
{
  m->train_rng = NULL;
  if (!psm_task_train_batch (m->tk, m->task, B, rng, &m->batch, error) ||
      !psm_batch_validate (&m->batch, &m->info, B, m->task_name, error))
    return FALSE;
  /* Dropout and zoneout draw from a stream of their own, seeded once a
   * batch from the batch stream and the MPI rank. Over MPI every rank must
   * keep drawing the same global batches, and a rank's share of the rows
   * (its shape) would move a shared stream by its own amount; each rank's
   * rows get masks of their own. */
  if (!m->check_mode) {
    guint64 seed = (guint64) psm_rng_u32 (rng) << 32 | psm_rng_u32 (rng);
    psm_rng_seed (&m->drop_rng, seed ^ (0x9e3779b97f4a7c15ull * (guint64) psm_dist_rank ()));
    m->train_rng = &m->drop_rng;
  }
  const PsmBatch *b = &m->batch;
  if (m->carry_k && b->advance > 0 && b->advance < b->T && m->enc_plugin->desc->abi_minor < 7) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "task '%s' gives overlapping segments (advance %d of %d positions) but encoder plugin '%s' (%s) "
                 "was built for ABI %u.%u and cannot carry its state from inside a segment (PsmEncoding.carry_at, "
                 "ABI 1.7): rebuild it, or train with segments side by side",
                 m->task_name, b->advance, b->T, m->enc_plugin->desc->name, m->enc_plugin->path,
                 m->enc_plugin->desc->abi_major, m->enc_plugin->desc->abi_minor);
    return FALSE;
  }
  return TRUE;
}

/* The one forward pass of every model shape, for training (psm_model_loss)
 * and evaluation (psm_model_evaluate) alike: the encoder, then the
 * decoder's teacher-forced steps or the one step on the summary, then the
 * head's loss; each phase marked for the profile. */
PsmTensor *
forward_loss (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc, PsmDecOut *out)
{
  psm_graph_phase (g, PSM_PHASE_ENCODER);
  encode (m, g, b, enc);
  psm_graph_phase (g, PSM_PHASE_DECODER);
  if (m->dk)
    decode_forced (m, g, b, enc, out);
  else
    summary_step (m, g, b, enc, out);
  psm_graph_phase (g, PSM_PHASE_HEAD);
  return m->hk->loss (m->head, g, m->params, enc, out, b);
}

PsmTensor *
psm_model_loss (PsmModel *m, PsmGraph *g, const PsmBatch *b)
{
  PsmEncoding enc;
  PsmDecOut out;
  psm_graph_phase (g, PSM_PHASE_ENCODER);
  m->carry_mode = 0;
  if (m->check_mode)
    for (int i = 0; m->streams && i < b->B; i++)
      b->keep[i] = 0.0f;
  /* A training batch's row order means nothing: rows longest target first,
   * so that the decoder's steps run on the rows still decoding alone
   * (PSM_DECODER_LIVE_ROWS). After an MPI share is taken: each rank orders
   * its own rows. */
  if (b == &m->batch && !m->streams && steps_on_live_rows (m))
    psm_batch_sort_by_target (&m->batch);
  psm_graph_set_rng (g, m->train_rng);   /* dropout and zoneout draw from it */
  PsmTensor *loss = forward_loss (m, g, b, &enc, &out);
  psm_graph_set_rng (g, NULL);
  if (m->hist_p)
    history_push (m, b, &enc);
  psm_graph_phase (g, PSM_PHASE_OTHER);
  return loss;
}
