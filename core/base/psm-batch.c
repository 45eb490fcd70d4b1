/* psm-batch.c — batch buffers, grown on demand and reused. */
#include "config.h"
#include <string.h>
#include <stdlib.h>
#include "base/base-internal.h"

void
psm_batch_init (PsmBatch *b)
{
  memset (b, 0, sizeof *b);
  b->size = sizeof *b;
}

/* Whether the buffers hold B examples of T source and Ty target steps. */
static gboolean
fits (const PsmBatch *b, int B, int T, int Ty)
{
  return B <= b->cap_B && (size_t) T * B <= (size_t) b->cap_T * b->cap_B &&
         (size_t) Ty * B <= (size_t) b->cap_Ty * b->cap_B;
}

void
psm_batch_reserve (PsmBatch *b, int B, int T, int Ty)
{
  g_return_if_fail (B >= 0 && T >= 0 && Ty >= 0);
  if (!fits (b, B, T, Ty)) {
    int cB = MAX (B, b->cap_B), cT = MAX (T, b->cap_T), cTy = MAX (Ty, b->cap_Ty);
    size_t ns = (size_t) cB * cT, nt = (size_t) cB * cTy;
#define GROW(field, n)                                                         \
    do {                                                                       \
      void *p_ = g_try_realloc (b->field, MAX ((n) * sizeof *b->field, 1));    \
      if (!p_)                                                                 \
        psm_out_of_memory ((n) * sizeof *b->field, "a batch");                 \
      b->field = p_;                                                           \
    } while (0)
    GROW (src, ns);
    GROW (src_ext, ns);
    GROW (src_mask, ns);
    GROW (src_seg, ns);
    GROW (dec_in, nt);
    GROW (tgt, nt);
    GROW (tgt_ext, nt);
    GROW (tgt_mask, nt);
    GROW (tgt_switch, nt);
    GROW (tgt_loc, nt);
    GROW (example_id, (size_t) cB);
    GROW (keep, (size_t) cB);
#undef GROW
    b->cap_B = cB;
    b->cap_T = cT;
    b->cap_Ty = cTy;
  }
  b->B = B;
  b->T = T;
  b->Ty = Ty;
  size_t ns = (size_t) B * T, nt = (size_t) B * Ty;
  memset (b->src, 0, ns * sizeof *b->src);
  memset (b->src_ext, 0, ns * sizeof *b->src_ext);
  memset (b->src_mask, 0, ns * sizeof *b->src_mask);
  memset (b->src_seg, 0, ns * sizeof *b->src_seg);
  memset (b->dec_in, 0, nt * sizeof *b->dec_in);
  memset (b->tgt, 0, nt * sizeof *b->tgt);
  memset (b->tgt_ext, 0, nt * sizeof *b->tgt_ext);
  memset (b->tgt_mask, 0, nt * sizeof *b->tgt_mask);
  memset (b->tgt_switch, 0, nt * sizeof *b->tgt_switch);
  for (size_t i = 0; i < nt; i++)
    b->tgt_loc[i] = -1;
  for (int i = 0; i < B; i++)
    b->example_id[i] = -1;
  memset (b->keep, 0, (size_t) B * sizeof *b->keep);
  b->advance = 0;
  b->n_cand = 0;
  if (b->oov_words)
    g_ptr_array_set_size (b->oov_words, 0);
  if (b->oov_index)
    g_hash_table_remove_all (b->oov_index);
  b->ext_base = 0;
}

/* Every per-row array of a batch, with its number of steps: X (field,
 * steps) for each ([T, B], [Ty, B] and [B] arrays). The functions that move
 * rows (keep_rows, sort_by_target) go through this one list. */
#define PSM_BATCH_ROW_FIELDS(X, b)                                             \
  X (src, (b)->T) X (src_ext, (b)->T) X (src_mask, (b)->T) X (src_seg, (b)->T) \
  X (dec_in, (b)->Ty) X (tgt, (b)->Ty) X (tgt_ext, (b)->Ty)                    \
  X (tgt_mask, (b)->Ty) X (tgt_switch, (b)->Ty) X (tgt_loc, (b)->Ty)           \
  X (example_id, 1) X (keep, 1)

void
psm_batch_keep_rows (PsmBatch *b, int lo, int n)
{
  g_return_if_fail (lo >= 0 && n >= 1 && lo + n <= b->B);
  int B = b->B;
  /* in place, step by step: row t's new start t n + j is never past its
   * old one t B + lo + j */
#define KEEP(field, steps)                                                     \
  for (int t = 0; t < (steps); t++)                                            \
    memmove (b->field + (size_t) t * n, b->field + (size_t) t * B + lo, (size_t) n * sizeof *b->field);
  PSM_BATCH_ROW_FIELDS (KEEP, b)
#undef KEEP
  b->B = n;
}

gboolean
psm_batch_sort_by_target (PsmBatch *b)
{
  int B = b->B;
  int *len = g_new (int, B), *order = g_new (int, B);
  for (int j = 0; j < B; j++) {
    len[j] = 0;
    for (int t = 0; t < b->Ty; t++)
      if (PSM_AT (b->tgt_mask, b, t, j) != 0.0f)
        len[j] = t + 1;
  }
  /* stable insertion sort, longest first (B is a minibatch's size) */
  gboolean moved = FALSE;
  for (int j = 0; j < B; j++) {
    int k = j;
    for (; k > 0 && len[order[k - 1]] < len[j]; k--)
      order[k] = order[k - 1];
    order[k] = j;
    moved |= k != j;
  }
  if (moved) {
    void *tmp = g_malloc ((size_t) B * 4);
#define PERMUTE(field, steps)                                                   \
    G_STATIC_ASSERT (sizeof *b->field == 4);                                   \
    for (int t = 0; t < (steps); t++) {                                        \
      __typeof__ (b->field) row = b->field + (size_t) t * B, to = tmp;         \
      for (int j = 0; j < B; j++)                                              \
        to[j] = row[order[j]];                                                 \
      memcpy (row, tmp, (size_t) B * 4);                                       \
    }
    PSM_BATCH_ROW_FIELDS (PERMUTE, b)
#undef PERMUTE
    g_free (tmp);
  }
  g_free (len);
  g_free (order);
  return moved;
}

void
psm_batch_share (const PsmBatch *b, int rank, int n, int *lo, int *hi)
{
  /* A row's cost: its real source tokens plus 4 times its real target
   * tokens (a target step runs the decoder cell, attention over the
   * source and the output layer over the vocabulary; a source token only
   * the encoder). On the CNN/DM small pipeline with 2 ranks, rank 0 waited
   * for the other at the allreduce 10 % of a step with the weight 1, 2.5-4 %
   * with 4 or 8 (bench/mpi.sh, BENCHMARKS.md f). */
  double total = 0.0, *cum = g_new (double, b->B + 1);
  cum[0] = 0.0;
  for (int j = 0; j < b->B; j++) {
    double c = 0.0;
    for (int t = 0; t < b->T; t++)
      c += PSM_AT (b->src_mask, b, t, j);
    for (int t = 0; t < b->Ty; t++)
      c += 4.0 * PSM_AT (b->tgt_mask, b, t, j);
    cum[j + 1] = cum[j] + c;
  }
  total = cum[b->B];
  /* boundary k: the first row where the cost so far reaches k / n of the
   * total, at least one row per rank */
  int start = 0, end = 0;
  for (int k = 1; k <= rank + 1; k++) {
    start = end;
    if (k == n) {
      end = b->B;
      break;
    }
    int i = start + 1;
    while (i < b->B - (n - k) && cum[i] < total * k / n)
      i++;
    end = i;
  }
  g_free (cum);
  *lo = start;
  *hi = end;
}

/* Keeps rows [lo, hi); their part of the batch's real target words. */
static double
keep_part (PsmBatch *b, int lo, int hi)
{
  double all = 0.0, mine = 0.0;
  for (int t = 0; t < b->Ty; t++)
    for (int j = 0; j < b->B; j++) {
      float w = PSM_AT (b->tgt_mask, b, t, j);
      all += w;
      mine += j >= lo && j < hi ? w : 0.0f;
    }
  psm_batch_keep_rows (b, lo, hi - lo);
  return all > 0 ? mine / all : 0.0;
}

double
psm_batch_take_share (PsmBatch *b, int rank, int n)
{
  int lo, hi;
  psm_batch_share (b, rank, n, &lo, &hi);
  double part = keep_part (b, lo, hi);
  psm_batch_trim (b);   /* the share's own longest row */
  return part;
}

void
psm_batch_share_streams (int B, int rank, int n, int *lo, int *hi)
{
  *lo = (int) ((gint64) B * rank / n);
  *hi = (int) ((gint64) B * (rank + 1) / n);
}

double
psm_batch_take_streams (PsmBatch *b, int rank, int n)
{
  int lo, hi;
  psm_batch_share_streams (b->B, rank, n, &lo, &hi);
  return keep_part (b, lo, hi);
}

/* The steps of a [steps, B] mask up to its last one any row uses (at
 * least 1). */
static int
used_steps (const float *mask, int steps, int B)
{
  for (; steps > 1; steps--)
    for (int j = 0; j < B; j++)
      if (mask[(size_t) (steps - 1) * B + j] != 0.0f)
        return steps;
  return steps;
}

void
psm_batch_trim (PsmBatch *b)
{
  b->T = used_steps (b->src_mask, b->T, b->B);
  b->Ty = used_steps (b->tgt_mask, b->Ty, b->B);
}

void
psm_batch_clear (PsmBatch *b)
{
  g_free (b->src);
  g_free (b->src_ext);
  g_free (b->src_mask);
  g_free (b->src_seg);
  g_free (b->dec_in);
  g_free (b->tgt);
  g_free (b->tgt_ext);
  g_free (b->tgt_mask);
  g_free (b->tgt_switch);
  g_free (b->tgt_loc);
  g_free (b->example_id);
  g_free (b->keep);
  g_free (b->cand);
  if (b->oov_words)
    g_ptr_array_unref (b->oov_words);
  if (b->oov_index)
    g_hash_table_destroy (b->oov_index);
  psm_batch_init (b);
}

int32_t
psm_batch_oov_id (PsmBatch *b, const char *word)
{
  if (!b->oov_index)
    b->oov_index = g_hash_table_new (g_str_hash, g_str_equal);
  gpointer v = g_hash_table_lookup (b->oov_index, word);
  if (v)
    return b->ext_base + GPOINTER_TO_INT (v) - 1;
  if (!b->oov_words)
    b->oov_words = g_ptr_array_new_with_free_func (g_free);
  char *w = g_strdup (word);
  g_ptr_array_add (b->oov_words, w);
  g_hash_table_insert (b->oov_index, w, GINT_TO_POINTER ((int) b->oov_words->len));
  return b->ext_base + (int32_t) b->oov_words->len - 1;
}

int
psm_batch_cand_index (const PsmBatch *b, int32_t id)
{
  if (b->n_cand <= 0)
    return id;
  int lo = 0, hi = b->n_cand - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (b->cand[mid] == id)
      return mid;
    if (b->cand[mid] < id)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

const char *
psm_batch_oov_word (const PsmBatch *b, int32_t id)
{
  if (!b->oov_words || id < b->ext_base || id - b->ext_base >= (int) b->oov_words->len)
    return NULL;
  return b->oov_words->pdata[id - b->ext_base];
}

void
psm_batch_set_candidates (PsmBatch *b, const int32_t *ids, int n)
{
  if (n > b->cap_cand) {
    b->cand = g_renew (int32_t, b->cand, n);
    b->cap_cand = n;
  }
  memcpy (b->cand, ids, (size_t) n * sizeof *ids);
  b->n_cand = n;
}

/* ---- what the core accepts from a task (core-private) ---- */

#define BAD(...)                                                               \
  do {                                                                         \
    char *what_ = g_strdup_printf (__VA_ARGS__);                               \
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,                   \
                 "task plugin '%s' returned a bad batch: %s", task, what_);   \
    g_free (what_);                                                            \
    return FALSE;                                                              \
  } while (0)

gboolean
psm_task_info_validate (const PsmTaskInfo *i, const char *task, GError **error)
{
  const char *why = i->src_vocab < 1 ? "src_vocab < 1"
                  : i->tgt_vocab < 1 ? "tgt_vocab < 1"
                  : i->ext_base < MAX (i->src_vocab, i->tgt_vocab) ? "ext_base below the vocabularies"
                  : i->max_src_len < 0 ? "max_src_len < 0"
                  : i->max_tgt_len < 1 ? "max_tgt_len < 1"
                  : i->bos_id < -1 || i->bos_id >= i->ext_base ? "bos_id outside the vocabulary"
                  : i->eos_id < -1 || i->eos_id >= i->ext_base ? "eos_id outside the vocabulary"
                  : i->unk_id < -1 || i->unk_id >= i->ext_base ? "unk_id outside the vocabulary"
                                                               : NULL;
  if (why)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "task plugin '%s' describes itself wrongly: %s "
                 "(src_vocab %d, tgt_vocab %d, ext_base %d, max_src_len %d, max_tgt_len %d)", task, why,
                 i->src_vocab, i->tgt_vocab, i->ext_base, i->max_src_len, i->max_tgt_len);
  return why == NULL;
}

static int
cmp_i32 (const void *a, const void *b)
{
  int32_t x = *(const int32_t *) a, y = *(const int32_t *) b;
  return x < y ? -1 : x > y;
}

static gboolean
is_01 (float v)
{
  return v == 0.0f || v == 1.0f;
}

gboolean
psm_batch_validate (const PsmBatch *b, const PsmTaskInfo *info, int max_B, const char *task, GError **error)
{
  if (b->B < 1 || b->B > max_B)
    BAD ("%d examples (asked for at most %d)", b->B, max_B);
  if (b->T < 0 || b->T > info->max_src_len)
    BAD ("source length %d (the task declared max_src_len %d)", b->T, info->max_src_len);
  if (b->Ty < 1 || b->Ty > info->max_tgt_len)
    BAD ("target length %d (the task declared max_tgt_len %d)", b->Ty, info->max_tgt_len);
  if (!fits (b, b->B, b->T, b->Ty))
    BAD ("B = %d, T = %d, Ty = %d exceed the buffers reserved (psm_batch_reserve)", b->B, b->T, b->Ty);
  int n_oov = b->oov_words ? (int) b->oov_words->len : 0;
  if (b->ext_base != 0 && b->ext_base != info->ext_base)
    BAD ("ext_base %d, the task declared %d", b->ext_base, info->ext_base);
  long ext_end = (long) info->ext_base + n_oov;
  for (int t = 0; t < b->T; t++)
    for (int i = 0; i < b->B; i++) {
      size_t k = (size_t) t * b->B + i;
      if (!is_01 (b->src_mask[k]))
        BAD ("src_mask[step %d, example %d] = %g (expected 0 or 1)", t, i, b->src_mask[k]);
      if (b->src[k] < 0 || b->src[k] >= info->src_vocab)
        BAD ("src[step %d, example %d] = %d is outside the source vocabulary [0, %d)", t, i, b->src[k],
             info->src_vocab);
      if (b->src_ext[k] < 0 || b->src_ext[k] >= ext_end)
        BAD ("src_ext[step %d, example %d] = %d is outside the extended vocabulary [0, %ld)", t, i,
             b->src_ext[k], ext_end);
      if (b->src_seg[k] < 0 || b->src_seg[k] >= PSM_MAX_SENTENCES ||
          (t > 0 && b->src_mask[k] != 0.0f && b->src_seg[k] < b->src_seg[k - b->B]))
        BAD ("src_seg[step %d, example %d] = %d: sentence numbers run from 0 to %d and never decrease", t, i,
             b->src_seg[k], PSM_MAX_SENTENCES - 1);
    }
  if (b->n_cand < 0 || b->n_cand > info->tgt_vocab)
    BAD ("n_cand %d outside [0, tgt_vocab %d]", b->n_cand, info->tgt_vocab);
  for (int j = 0; j < b->n_cand; j++)
    if (b->cand[j] < 0 || b->cand[j] >= info->tgt_vocab || (j && b->cand[j] <= b->cand[j - 1]))
      BAD ("cand[%d] = %d: the candidates must be ascending shortlist ids in [0, %d)", j, b->cand[j],
           info->tgt_vocab);
  for (int t = 0; t < b->Ty; t++)
    for (int i = 0; i < b->B; i++) {
      size_t k = (size_t) t * b->B + i;
      if (!is_01 (b->tgt_mask[k]))
        BAD ("tgt_mask[step %d, example %d] = %g (expected 0 or 1)", t, i, b->tgt_mask[k]);
      if (b->tgt_mask[k] == 0.0f)
        continue;
      if (b->tgt[k] < 0 || b->tgt[k] >= info->tgt_vocab)
        BAD ("tgt[step %d, example %d] = %d is outside the target shortlist [0, %d)", t, i, b->tgt[k],
             info->tgt_vocab);
      if (b->n_cand && !bsearch (&b->tgt[k], b->cand, (size_t) b->n_cand, sizeof (int32_t), cmp_i32))
        BAD ("tgt[step %d, example %d] = %d is not among the batch's %d candidates", t, i, b->tgt[k], b->n_cand);
      if (b->tgt_ext[k] < 0 || b->tgt_ext[k] >= ext_end)
        BAD ("tgt_ext[step %d, example %d] = %d is outside the extended vocabulary [0, %ld)", t, i,
             b->tgt_ext[k], ext_end);
      if (b->dec_in[k] < 0 || b->dec_in[k] >= ext_end)
        BAD ("dec_in[step %d, example %d] = %d is outside the extended vocabulary [0, %ld)", t, i,
             b->dec_in[k], ext_end);
      if (!is_01 (b->tgt_switch[k]))
        BAD ("tgt_switch[step %d, example %d] = %g (expected 0 or 1)", t, i, b->tgt_switch[k]);
      int loc = b->tgt_loc[k];
      if ((loc < -1 && loc != PSM_LOC_ARGMAX) || loc >= b->T)
        BAD ("tgt_loc[step %d, example %d] = %d is outside the source [0, %d)", t, i, loc, b->T);
      if (loc >= 0 && b->src_mask[(size_t) loc * b->B + i] == 0.0f)
        BAD ("tgt_loc[step %d, example %d] = %d points at padding", t, i, loc);
    }
  if (info->size >= G_STRUCT_OFFSET (PsmTaskInfo, streams) + sizeof (gboolean) && info->streams) {
    if (b->Ty != b->T)
      BAD ("a stream segment of %d source and %d target steps (expected one target a position)", b->T, b->Ty);
    for (int i = 0; i < b->B; i++)
      if (!is_01 (b->keep[i]))
        BAD ("keep[example %d] = %g (expected 0 or 1)", i, b->keep[i]);
    if (b->advance < 0 || b->advance > b->T)
      BAD ("advance %d outside [0, T = %d]", b->advance, b->T);
  } else if (b->advance != 0) {
    BAD ("advance %d in a task that is not over streams", b->advance);
  }
  return TRUE;
}
