/* psm-model-decode.c — the beam search's scorer: the decoder and head a step
 * at a time over the rows the search asks for. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

static int32_t
dec_word (void *ud, int row, int32_t slot)
{
  Dec *d = ud;
  return d->m->hk->slot_token (d->m->head, &d->bx, row, slot);
}

/* Rows per rows of each article act[0..na) of x, time-major [T, B, C] (T =
 * 1 for batch-major [B, C]): row (t, j) is row (t, act[j / per]); act NULL:
 * every article in order. */
static PsmTensor *
rows_for (PsmGraph *g, PsmTensor *x, int T, int B, const int *act, int na, int per)
{
  if (!x)
    return NULL;
  int R = na * per;
  int32_t *rows = psm_graph_alloc (g, (size_t) T * R * sizeof (int32_t));
  for (int t = 0; t < T; t++)
    for (int j = 0; j < R; j++)
      rows[(size_t) t * R + j] = t * B + (act ? act[j / per] : j / per);
  PsmTensor *y = psm_gather_rows (g, x, rows, T * R);
  int shape[3] = { T, R, psm_tensor_cols (x) };
  return x->ndim == 3 ? psm_tensor_reshape (g, y, 3, shape) : y;
}

static void *
array_for (PsmGraph *g, const void *src, size_t elem, int T, int B, const int *act, int na, int per)
{
  if (!src)
    return NULL;
  int R = na * per;
  char *dst = psm_graph_alloc (g, (size_t) T * R * elem);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < R; j++)
      memcpy (dst + ((size_t) t * R + j) * elem,
              (const char *) src + ((size_t) t * B + (act ? act[j / per] : j / per)) * elem, elem);
  return dst;
}

/* The source side (encoding and batch fields) of per rows of each article
 * act[0..na) (NULL: all) of batch b encoded as enc, in graph g; without
 * tensors, ex keeps enc's (the arrays alone). */
static void
source_rows (PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc, const int *act, int na, int per,
             gboolean tensors, PsmEncoding *ex, PsmBatch *bx)
{
  int T = b->T, B = b->B;
  *ex = *enc;
  ex->B = na * per;
  if (tensors) {
    ex->annotations = rows_for (g, enc->annotations, T, B, act, na, per);
    ex->summary = rows_for (g, enc->summary, 1, B, act, na, per);
    ex->memo = rows_for (g, enc->memo, T, B, act, na, per);
  }
  ex->mask = array_for (g, b->src_mask, sizeof (float), T, B, act, na, per);
  ex->src = array_for (g, b->src, sizeof (int32_t), T, B, act, na, per);
  ex->seg = array_for (g, b->src_seg, sizeof (int32_t), T, B, act, na, per);
  memset (bx, 0, sizeof *bx);
  bx->size = sizeof *bx;
  bx->B = bx->cap_B = na * per;
  bx->T = bx->cap_T = T;
  bx->Ty = bx->cap_Ty = 1;
  bx->src = (int32_t *) ex->src;
  bx->src_ext = array_for (g, b->src_ext, sizeof (int32_t), T, B, act, na, per);
  bx->src_mask = (float *) ex->mask;
  bx->src_seg = (int32_t *) ex->seg;
  bx->ext_base = b->ext_base;
  bx->oov_words = b->oov_words;
  bx->n_cand = b->n_cand;   /* the candidates are the batch's, not per row */
  bx->cand = b->cand;
  bx->example_id = array_for (g, b->example_id, sizeof (int32_t), 1, B, act, na, per);
}

/* Keeps, in place, per rows of each of the articles at positions
 * from[0..na) (ascending) of T blocks of n_old articles' rows of elem
 * bytes each: block t becomes rows [t R, (t + 1) R), R = na per, its row j
 * the old (t, from[j / per] per + j % per). (A row never moves up, and
 * moves before any row below it is overwritten.) */
static void
keep_rows (void *data, size_t elem, int T, int n_old, const int32_t *from, int na, int per)
{
  char *p = data;
  int R = na * per, Rold = n_old * per;
  for (int t = 0; t < T && p; t++)
    for (int j = 0; j < R; j++)
      memmove (p + ((size_t) t * R + j) * elem, p + ((size_t) t * Rold + from[j / per] * per + j % per) * elem,
               elem);
}

/* The same for a tensor of T blocks: [T, R, C], or [R, C]. */
static void
keep_tensor_rows (PsmTensor *x, int T, int n_old, const int32_t *from, int na, int per)
{
  if (!x)
    return;
  int C = psm_tensor_cols (x);
  keep_rows (x->data, C * sizeof (float), T, n_old, from, na, per);
  x->shape[x->ndim == 3 ? 1 : 0] = na * per;
  x->n = (size_t) T * na * per * C;
}

/* Makes the built rows per rows of each article act[0..na). At the first
 * step (one row an article, every article; all steps of greedy decoding)
 * the encoding's own tensors serve; at the second the beams' rows are
 * gathered into the encoding's graph (as much memory as the rows of all
 * beams take, once a batch), the steps' attention reading each article's
 * keys and annotations once for its rows (the compact copies:
 * psm_graph_add_repeat). When articles finish (act only ever loses
 * articles), the rows of the others are moved together in place, compact
 * copies too: no memory is taken for it. */
static void
build_rows (Dec *d, const int *act, int na, int per)
{
  PsmModel *m = d->m;
  const PsmBatch *b = d->orig;
  int T = b->T;
  if (per == d->per && na < d->n_built) {
    int nb = d->n_built;
    int32_t *from = g_new (int32_t, na);   /* the articles' positions among those built */
    for (int i = 0, o = 0; i < na; i++) {
      while (o < nb && d->built[o] != act[i])
        o++;
      g_assert (o < nb);   /* the search's articles only ever finish */
      from[i] = o;
    }
    keep_tensor_rows (d->ex.annotations, T, nb, from, na, per);
    keep_tensor_rows (d->ex.summary, 1, nb, from, na, per);
    keep_tensor_rows (d->ex.memo, T, nb, from, na, per);
    keep_rows ((void *) d->ex.mask, sizeof (float), T, nb, from, na, per);
    keep_rows ((void *) d->ex.src, sizeof (int32_t), T, nb, from, na, per);
    keep_rows ((void *) d->ex.seg, sizeof (int32_t), T, nb, from, na, per);
    keep_rows (d->bb.src_ext, sizeof (int32_t), T, nb, from, na, per);
    keep_rows (d->bb.example_id, sizeof (int32_t), 1, nb, from, na, per);
    keep_tensor_rows (d->c_memo, T, nb, from, na, 1);
    keep_tensor_rows (d->c_ann, T, nb, from, na, 1);
    d->ex.B = d->bb.B = d->bb.cap_B = na * per;
    g_free (from);
  } else {
    gboolean all = na == b->B;
    psm_graph_clear_repeats (m->gs);
    source_rows (m->g, b, &d->enc, all ? NULL : act, na, per, !all || per > 1, &d->ex, &d->bb);
    d->c_memo = d->c_ann = NULL;
    if (per > 1 && d->enc.memo && d->ex.memo) {
      /* the encoder's tensors themselves, or the articles' own rows */
      d->c_memo = all ? d->enc.memo : rows_for (m->g, d->enc.memo, T, b->B, act, na, 1);
      d->c_ann = all ? d->enc.annotations : rows_for (m->g, d->enc.annotations, T, b->B, act, na, 1);
      psm_graph_add_repeat (m->gs, d->ex.memo->data, d->c_memo->data, per);
      psm_graph_add_repeat (m->gs, d->ex.annotations->data, d->c_ann->data, per);
    }
  }
  memcpy (d->built, act, na * sizeof (int));
  d->n_built = na;
  d->per = per;
}

static const float *
dec_step (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act, int n_act, int per,
          int *base, int *S, GError **error)
{
  Dec *d = ud;
  PsmModel *m = d->m;
  PsmGraph *g = m->gs;
  if (d->opt && d->opt->cancelled && d->opt->cancelled (d->opt->cancel_data)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_CANCELLED, "decoding cancelled");
    return NULL;
  }
  gint64 t0 = g_get_monotonic_time ();
  if (n_act != d->n_built || per != d->per || memcmp (act, d->built, n_act * sizeof (int)) != 0)
    build_rows (d, act, n_act, per);
  psm_graph_reset (g);
  int R = n_act * per, K = d->K;
  int32_t *row_of = psm_graph_alloc (g, MAX (R, 1) * sizeof (int32_t));   /* built row -> the search's row */
  for (int j = 0; j < R; j++)
    row_of[j] = act[j / per] * K + j % per;
  for (int i = 0; i < n_act; i++)
    base[act[i]] = i * per;
  PsmTensor *carry;
  if (!parents) {
    carry = m->dk->init (m->dec, g, m->params, &d->ex);
    d->carry_k = psm_tensor_cols (carry);
    g_free (d->carry);
    d->carry = g_new0 (float, (size_t) n * d->carry_k);
  } else {
    int shape[2] = { n, d->carry_k };
    int32_t *from = psm_graph_alloc (g, R * sizeof (int32_t));
    for (int j = 0; j < R; j++)
      from[j] = parents[row_of[j]];
    carry = psm_gather_rows (g, psm_tensor_wrap (g, d->carry, NULL, 2, shape), from, R);
  }
  int32_t *ids = psm_graph_alloc (g, R * sizeof (int32_t)), *words = psm_graph_alloc (g, 2 * (size_t) R * sizeof (int32_t));
  int32_t *rows = words + R;
  for (int j = 0; j < R; j++) {
    int r = row_of[j];
    int32_t w = tokens[r] < 0 ? m->info.bos_id : dec_word (d, r, tokens[r]);
    words[j] = w;
    rows[j] = j;
    ids[j] = w >= 0 && w < m->info.tgt_vocab ? w : m->info.unk_id >= 0 ? m->info.unk_id : m->info.bos_id;
  }
  PsmTensor *x = psm_embedding (g, psm_param (g, m->params, m->tgt_emb_id), ids, R);
  InputEmbedFn input_embed = PSM_CLASS_HOOK (m->hk, input_embed);
  if (input_embed)
    x = input_embed (m->head, g, m->params, &d->ex, &d->bb, words, rows, R, x);
  PsmDecStep st = { 0 };
  m->dk->step (m->dec, g, m->params, &d->ex, carry, x, &st);
  if (psm_tensor_cols (st.carry) != d->carry_k || psm_tensor_rows (st.carry) != R) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "decoder plugin returned a carry of [%d, %d], expected [%d, %d]",
                 psm_tensor_rows (st.carry), psm_tensor_cols (st.carry), R, d->carry_k);
    return NULL;
  }
#pragma omp parallel for if ((long) R * d->carry_k >= 65536) schedule (static)   /* as gather.c's copies */
  for (int j = 0; j < R; j++)
    memcpy (d->carry + (size_t) row_of[j] * d->carry_k, st.carry->data + (size_t) j * d->carry_k,
            d->carry_k * sizeof (float));
  gint64 t1 = g_get_monotonic_time ();
  d->t_dec += t1 - t0;
  PsmDecOut o = { 1, R, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL };
#define ONE_STEP(f)                                                               \
  if (st.f) {                                                                     \
    int sh[3] = { 1, R, psm_tensor_cols (st.f) };                                 \
    o.f = psm_tensor_reshape (g, st.f, 3, sh);                                    \
  }
  ONE_STEP (state) ONE_STEP (context) ONE_STEP (attn) ONE_STEP (coverage) ONE_STEP (input)
#undef ONE_STEP
  PsmTensor *sc = m->hk->scores (m->head, g, m->params, &d->ex, &o, &d->bb);
  if (d->record) {
    /* by the search's rows, all n of them: NaN, -1 and 0 where not computed */
    PsmTensor *(*gate) (void *, PsmGraph *, PsmParams *, const PsmEncoding *, const PsmDecOut *, const PsmBatch *) =
      PSM_CLASS_HOOK (m->hk, gate);
    PsmTensor *gt = gate ? gate (m->head, g, m->params, &d->ex, &o, &d->bb) : NULL;
    size_t at = d->gate->len;
    g_array_set_size (d->gate, at + n);
    float *gv = (float *) d->gate->data + at;
    for (int r = 0; r < n; r++)
      gv[r] = NAN;
    for (int j = 0; j < R && gt; j++)
      gv[row_of[j]] = gt->data[j];
    int A = m->attn_top, T = d->ex.T;
    if (A > 0) {
      at = d->top->len;
      g_array_set_size (d->top, at + (size_t) n * A);
      int32_t *tv = (int32_t *) d->top->data + at;
      for (size_t i = 0; i < (size_t) n * A; i++)
        tv[i] = -1;
      for (int j = 0; j < R && st.attn; j++) {
        int32_t *best = tv + (size_t) row_of[j] * A;
        const float *a = st.attn->data + (size_t) j * T;
        int k = 0;
        for (int i = 0; i < T; i++) {
          if (k == A && a[i] <= a[best[A - 1]])
            continue;
          int q = k < A ? k++ : A - 1;
          while (q > 0 && a[best[q - 1]] < a[i]) {
            best[q] = best[q - 1];
            q--;
          }
          best[q] = i;
        }
      }
    }
    if (d->attn) {
      /* every step's full attention, zeros where the decoder has none */
      at = d->attn->len;
      g_array_set_size (d->attn, at + (size_t) n * T);
      float *dst = (float *) d->attn->data + at;
      memset (dst, 0, (size_t) n * T * sizeof (float));
      if (st.attn && psm_tensor_cols (st.attn) == T)
        for (int j = 0; j < R; j++)
          memcpy (dst + (size_t) row_of[j] * T, st.attn->data + (size_t) j * T, T * sizeof (float));
    }
  }
  *S = psm_tensor_cols (sc);
  d->t_head += g_get_monotonic_time () - t1;
  return sc->data;
}

/* Decodes batch b into hyps[0..B) (beam search as decode.* says). */
gboolean
decode_batch (PsmModel *m, const PsmBatch *b, Dec *d, PsmHyp *hyps, GError **error)
{
  PsmGraph *g = m->g;
  int K = m->beam.beam, B = b->B;
  gint64 t0 = g_get_monotonic_time ();
  /* decode.precision covers the encoder too (its graph is the test loss's
   * otherwise, which stays single precision) */
  psm_graph_set_bf16 (g, psm_graph_bf16 (m->gs));
  encode (m, g, b, &d->enc);
  psm_graph_set_bf16 (g, FALSE);
  d->m = m;
  d->orig = b;
  d->K = K;
  d->n = B * K;
  /* the source side of all the search's rows, for slot_token */
  PsmEncoding ex_all;
  source_rows (g, b, &d->enc, NULL, B, K, FALSE, &ex_all, &d->bx);
  d->built = g_renew (int, d->built, MAX (B, 1));
  d->n_built = -1;   /* nothing built for this batch */
  d->per = 0;
  PsmBeamFns f = { dec_step, dec_word, d };
  d->t_enc += g_get_monotonic_time () - t0;
  gboolean ok = psm_beam_search (&m->beam, B, &f, hyps, error);
  d->t_all += g_get_monotonic_time () - t0;
  return ok;
}
