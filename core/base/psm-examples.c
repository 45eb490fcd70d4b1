/* psm-examples.c — the examples store of the sequence-to-sequence tasks and
 * their batches (psm-examples.h). Tokens are kept in flat arrays with one
 * offset an example a side: int32 ids, and only what a task gives beyond
 * them (target-table ids for PSM_EXAMPLES_MAPPED; sentence numbers from
 * the first non-zero one on; switch and pointer position from the first
 * pointed target on), so a token of a summarisation corpus costs 4 bytes
 * as the ids alone would. */
#include <string.h>
#include "base/base-internal.h"
#include "psm/psm-examples.h"
#include "psm/psm-task.h"

struct PsmExamples {
  PsmExamplesSourceExt ext;
  GArray *src_off, *tgt_off;    /* int32 [n]: where example i starts; the last ends at the side's length */
  GArray *src, *tgt;            /* int32 global ids */
  GArray *src_tid;              /* int32 target-table ids (MAPPED only) */
  GArray *seg;                  /* guint8 sentence numbers; NULL while all are 0 */
  GArray *gen;                  /* float, per target token; NULL while all are 1 */
  GArray *loc;                  /* int32, per target token; NULL while all are -1 */
  GPtrArray *src_text, *ref_text;
  int n;
};

PsmExamples *
psm_examples_new (PsmExamplesSourceExt ext)
{
  PsmExamples *x = g_new0 (PsmExamples, 1);
  x->ext = ext;
  x->src_off = g_array_new (FALSE, FALSE, sizeof (int32_t));
  x->tgt_off = g_array_new (FALSE, FALSE, sizeof (int32_t));
  x->src = g_array_new (FALSE, FALSE, sizeof (int32_t));
  x->tgt = g_array_new (FALSE, FALSE, sizeof (int32_t));
  x->src_tid = ext == PSM_EXAMPLES_MAPPED ? g_array_new (FALSE, FALSE, sizeof (int32_t)) : NULL;
  x->src_text = g_ptr_array_new_with_free_func (g_free);
  x->ref_text = g_ptr_array_new_with_free_func (g_free);
  int32_t zero = 0;
  g_array_append_val (x->src_off, zero);
  g_array_append_val (x->tgt_off, zero);
  return x;
}

void
psm_examples_free (PsmExamples *x)
{
  if (!x)
    return;
  GArray *a[] = { x->src_off, x->tgt_off, x->src, x->tgt, x->src_tid, x->seg, x->gen, x->loc };
  for (guint i = 0; i < G_N_ELEMENTS (a); i++)
    if (a[i])
      g_array_unref (a[i]);
  g_ptr_array_unref (x->src_text);
  g_ptr_array_unref (x->ref_text);
  g_free (x);
}

#define OFF(a, i) (((const int32_t *) (a)->data)[i])

int
psm_examples_begin (PsmExamples *x, const char *source_text, const char *reference_text)
{
  if (x->n > 0) {   /* close the previous example */
    int32_t s = (int32_t) x->src->len, t = (int32_t) x->tgt->len;
    g_array_append_val (x->src_off, s);
    g_array_append_val (x->tgt_off, t);
  }
  g_ptr_array_add (x->src_text, g_strdup (source_text));
  g_ptr_array_add (x->ref_text, g_strdup (reference_text));
  return x->n++;
}

void
psm_examples_add_source (PsmExamples *x, int32_t id, int32_t tgt_id, int seg)
{
  g_return_if_fail (x->n > 0);
  g_array_append_val (x->src, id);
  if (x->src_tid)
    g_array_append_val (x->src_tid, tgt_id);
  if (seg != 0 && !x->seg) {   /* the first sentence past the first: keep them from here on */
    x->seg = g_array_sized_new (FALSE, TRUE, sizeof (guint8), x->src->len);
    g_array_set_size (x->seg, x->src->len - 1);
  }
  if (x->seg) {
    guint8 s = (guint8) CLAMP (seg, 0, PSM_MAX_SENTENCES - 1);
    g_array_append_val (x->seg, s);
  }
}

void
psm_examples_add_target (PsmExamples *x, int32_t id, float gen, int32_t loc)
{
  g_return_if_fail (x->n > 0);
  g_array_append_val (x->tgt, id);
  if ((gen != 1.0f || loc != -1) && !x->gen) {   /* the first pointed target: keep them from here on */
    x->gen = g_array_sized_new (FALSE, FALSE, sizeof (float), x->tgt->len);
    x->loc = g_array_sized_new (FALSE, FALSE, sizeof (int32_t), x->tgt->len);
    float one = 1.0f;
    int32_t none = -1;
    for (guint i = 0; i + 1 < x->tgt->len; i++) {
      g_array_append_val (x->gen, one);
      g_array_append_val (x->loc, none);
    }
  }
  if (x->gen) {
    g_array_append_val (x->gen, gen);
    g_array_append_val (x->loc, loc);
  }
}

int
psm_examples_n (const PsmExamples *x)
{
  return x ? x->n : 0;
}

/* Where example i's source (target) starts and ends. */
static void
span (const PsmExamples *x, int i, gboolean target, int *start, int *end)
{
  const GArray *off = target ? x->tgt_off : x->src_off;
  *start = OFF (off, i);
  *end = i + 1 < x->n ? OFF (off, i + 1) : (int) (target ? x->tgt->len : x->src->len);
}

int
psm_examples_source_length (const PsmExamples *x, int i)
{
  if (!x || i < 0 || i >= x->n)
    return 0;
  int s, e;
  span (x, i, FALSE, &s, &e);
  return e - s;
}

const char *
psm_examples_source_text (const PsmExamples *x, int i)
{
  return x && i >= 0 && i < x->n ? x->src_text->pdata[i] : NULL;
}

const char *
psm_examples_reference_text (const PsmExamples *x, int i)
{
  return x && i >= 0 && i < x->n ? x->ref_text->pdata[i] : NULL;
}

/* The extended id of source token j (global id g). */
static int32_t
source_ext (const PsmExamples *x, const PsmExampleWords *w, PsmBatch *b, size_t j, int32_t g)
{
  int32_t tid = x->ext == PSM_EXAMPLES_SHARED_TABLE ? g
              : x->ext == PSM_EXAMPLES_MAPPED ? ((const int32_t *) x->src_tid->data)[j] : -1;
  if (tid >= 0 && tid < w->tgt_vocab)
    return tid;
  return psm_batch_oov_id (b, psm_vocab_word (w->src_words, g));
}

gboolean
psm_examples_fill (const PsmExamples *x, const PsmExampleWords *w, const int *idx, int B, PsmBatch *b,
                   const char *who, GError **error)
{
  int T = 1, Ty = 1, n = psm_examples_n (x);
  for (int i = 0; i < B; i++) {
    int e = idx ? idx[i] : i;
    if (e < 0 || e >= n) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: example %d of a split of %d asked for", who, e,
                   n);
      return FALSE;
    }
    T = MAX (T, psm_examples_source_length (x, e));
    int s, end;
    span (x, e, TRUE, &s, &end);
    Ty = MAX (Ty, end - s + 1);
  }
  psm_batch_reserve (b, B, T, Ty);
  b->ext_base = w->ext_base;
  if (!x)   /* no store: no examples, and B is 0 */
    return TRUE;
  const int32_t *src = (const int32_t *) x->src->data, *tgt = (const int32_t *) x->tgt->data;
  const int32_t *loc = x->loc ? (const int32_t *) x->loc->data : NULL;
  const float *gen = x->gen ? (const float *) x->gen->data : NULL;
  const guint8 *seg = x->seg ? (const guint8 *) x->seg->data : NULL;
  for (int i = 0; i < B; i++) {
    int e = idx ? idx[i] : i, s0, s1, t0, t1;
    span (x, e, FALSE, &s0, &s1);
    span (x, e, TRUE, &t0, &t1);
    b->example_id[i] = e;
    for (int k = 0; k < s1 - s0; k++) {
      int32_t g = src[s0 + k];
      PSM_AT (b->src, b, k, i) = g < w->src_vocab ? g : w->unk;
      PSM_AT (b->src_ext, b, k, i) = source_ext (x, w, b, (size_t) (s0 + k), g);
      PSM_AT (b->src_mask, b, k, i) = 1.0f;
      if (seg)
        PSM_AT (b->src_seg, b, k, i) = seg[s0 + k];
    }
    int nt = t1 - t0;
    for (int k = 0; k <= nt; k++) {
      int32_t g = k < nt ? tgt[t0 + k] : w->eos;
      PSM_AT (b->dec_in, b, k, i) = k == 0 ? w->bos : PSM_AT (b->tgt, b, k - 1, i);
      PSM_AT (b->tgt, b, k, i) = g < w->tgt_vocab ? g : w->unk;
      PSM_AT (b->tgt_ext, b, k, i) = g < w->tgt_vocab ? g : psm_batch_oov_id (b, psm_vocab_word (w->tgt_words, g));
      PSM_AT (b->tgt_mask, b, k, i) = 1.0f;
      PSM_AT (b->tgt_switch, b, k, i) = k < nt && gen ? gen[t0 + k] : 1.0f;
      PSM_AT (b->tgt_loc, b, k, i) = k < nt && loc ? loc[t0 + k] : -1;
    }
  }
  return TRUE;
}

/* ---- the batches a task leaves to the core (psm-task.h) ---- */

gboolean
psm_task_train_batch (const PsmTaskClass *k, void *task, int B, PsmRng *rng, PsmBatch *out, GError **error)
{
  if (k->train_batch)
    return k->train_batch (task, B, rng, out, error);
  int n = k->n_examples (task, PSM_SPLIT_TRAIN);
  if (n < 1) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the task holds no training examples (an evaluation-only run, or an empty training split)");
    return FALSE;
  }
  int *idx = g_new (int, MAX (B, 1));
  for (int i = 0; i < B; i++)
    idx[i] = (int) psm_rng_below (rng, (guint32) n);
  gboolean ok = PSM_CLASS_HOOK (k, eval_batch_of) (task, PSM_SPLIT_TRAIN, idx, B, out, error);
  g_free (idx);
  return ok;
}

gboolean
psm_task_eval_batch (const PsmTaskClass *k, void *task, PsmSplit split, int start, int B, PsmBatch *out,
                     GError **error)
{
  if (k->eval_batch)
    return k->eval_batch (task, split, start, B, out, error);
  B = MAX (0, MIN (B, k->n_examples (task, split) - start));
  int *idx = g_new (int, MAX (B, 1));
  for (int i = 0; i < B; i++)
    idx[i] = start + i;
  gboolean ok = PSM_CLASS_HOOK (k, eval_batch_of) (task, split, idx, B, out, error);
  g_free (idx);
  return ok;
}
