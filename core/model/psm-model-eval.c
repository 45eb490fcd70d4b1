/* psm-model-eval.c — evaluation and decoding of a split or of raw texts, for
 * the three model shapes (sequence to sequence, one step, streams). */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

static gboolean
eval_sequences (PsmModel *m, PsmSplit split, const PsmBatch *b, const PsmEvalOptions *opt, gboolean metrics,
                Reorder *r, const int *row_ex, double *gate_sum, long *gate_n, double *phases, GError **error)
{
  gboolean want_text = opt && (opt->ref || opt->json);
  for (int i = 0; metrics && i < m->n_metrics; i++)
    want_text = want_text || PSM_CLASS_HOOK (m->mk[i], add_text) != NULL;
  void (*example_text) (void *, PsmSplit, int, const char **, const char **) = PSM_CLASS_HOOK (m->tk, example_text);
  GString *hyp_text = g_string_new (NULL), *ref_text = g_string_new (NULL), *src_text = g_string_new (NULL);
  Dec d = { 0 };
  d.opt = opt;
  d.record = (opt && opt->json) || PSM_CLASS_HOOK (m->hk, gate) != NULL;
  d.gate = g_array_new (FALSE, FALSE, sizeof (float));
  d.top = g_array_new (FALSE, FALSE, sizeof (int32_t));
  d.attn = opt && opt->json ? g_array_new (FALSE, FALSE, sizeof (float)) : NULL;
  PsmHyp *hyps = g_new0 (PsmHyp, b->B);
  m->want_importance = opt && opt->json;   /* json_record reads it */
  gboolean ok = decode_batch (m, b, &d, hyps, error);
  m->want_importance = FALSE;
  if (phases) {
    phases[0] += 1e-6 * d.t_enc;
    phases[1] += 1e-6 * d.t_dec;
    phases[2] += 1e-6 * d.t_head;
    phases[3] += 1e-6 * (d.t_all - d.t_enc - d.t_dec - d.t_head);
  }
  GPtrArray *hw = g_ptr_array_new (), *rw = g_ptr_array_new ();
  GArray *hid = g_array_new (FALSE, FALSE, sizeof (int32_t)), *rid = g_array_new (FALSE, FALSE, sizeof (int32_t));
  GString *line = g_string_new (NULL);
  for (int bi = 0; ok && bi < b->B; bi++) {
    PsmHyp *h = &hyps[bi];
    g_ptr_array_set_size (hw, 0);
    g_ptr_array_set_size (rw, 0);
    g_array_set_size (hid, 0);
    g_array_set_size (rid, 0);
    for (int i = 0; i < h->len; i++) {
      int32_t w = m->hk->slot_token (m->head, &d.bx, h->rows[i], h->slots[i]);
      g_array_append_val (hid, w);
      g_ptr_array_add (hw, (gpointer) m->tk->token_text (m->task, b, bi, w));
    }
    for (int t = 0; b->tgt_ext && t < b->Ty; t++) {
      int32_t w = PSM_AT (b->tgt_ext, b, t, bi);
      if (PSM_AT (b->tgt_mask, b, t, bi) == 0.0f || w == m->info.eos_id)
        continue;
      g_array_append_val (rid, w);
      g_ptr_array_add (rw, (gpointer) m->tk->token_text (m->task, b, bi, w));
    }
    PsmSeq hs = { h->len, (const int32_t *) hid->data, (const char *const *) hw->pdata };
    PsmSeq rs = { (int) rid->len, (const int32_t *) rid->data, (const char *const *) rw->pdata };
    const char *src = NULL, *ref = NULL;
    gboolean task_src = FALSE, task_ref = FALSE;
    if (want_text) {
      /* Whole texts from the task where it keeps them; else the batch's
       * (cut) tokens. */
      int ex = b->example_id ? b->example_id[bi] : -1;
      if (example_text && ex >= 0)
        example_text (m->task, split, ex, &src, &ref);
      task_src = src != NULL;
      task_ref = ref != NULL;
      join_words (hyp_text, (const char *const *) hw->pdata, (int) hw->len);
      if (!ref)
        ref = join_words (ref_text, (const char *const *) rw->pdata, (int) rw->len);
      if (!src) {
        g_string_truncate (src_text, 0);
        for (int t = 0; t < b->T; t++)
          if (PSM_AT (b->src_mask, b, t, bi) != 0.0f)
            g_string_append_printf (src_text, "%s%s", src_text->len ? " " : "",
                                    m->tk->token_text (m->task, b, bi, PSM_AT (b->src_ext, b, t, bi)));
        src = src_text->str;
      }
    }
    int oex = row_ex ? row_ex[bi] : bi;
    if (metrics && r)
      keep_scores (r, oex, &hs, &rs, want_text ? hyp_text->str : NULL, task_ref ? NULL : ref, task_src ? NULL : src);
    else if (metrics)
      add_metrics (m, &hs, &rs, want_text ? hyp_text->str : NULL, ref, src);
    int steps = d.n ? (int) (d.gate->len / d.n) : 0;
    for (int i = 0; i < h->len && i < steps; i++) {
      float v = g_array_index (d.gate, float, (size_t) i * d.n + h->rows[i]);
      if (isfinite (v)) {
        *gate_sum += v;
        (*gate_n)++;
      }
    }
    if (opt && opt->out) {
      g_string_truncate (line, 0);
      for (int i = 0; i < h->len; i++)
        g_string_append_printf (line, "%s%s", i ? " " : "", (const char *) hw->pdata[i]);
      emit_line (r, OUT_HYP, oex, opt->out, line);
    }
    if (opt && opt->ref) {
      /* one reference a line, its sentences separated by " <q> " */
      g_string_truncate (line, 0);
      for (const char *c = ref; *c; c++)
        if (*c == '\n')
          g_string_append (line, " <q> ");
        else
          g_string_append_c (line, *c);
      emit_line (r, OUT_REF, oex, opt->ref, line);
    }
    if (opt && opt->json) {
      json_record (m, b, bi, h, &d, (const char *const *) hw->pdata, ref, line);
      emit_line (r, OUT_JSON, oex, opt->json, line);
    }
  }
  for (int i = 0; i < b->B; i++)
    psm_hyp_clear (&hyps[i]);
  g_free (hyps);
  g_free (d.carry);
  g_free (d.built);
  g_array_unref (d.gate);
  g_array_unref (d.top);
  if (d.attn)
    g_array_unref (d.attn);
  g_ptr_array_unref (hw);
  g_ptr_array_unref (rw);
  g_array_unref (hid);
  g_array_unref (rid);
  g_string_free (line, TRUE);
  g_string_free (hyp_text, TRUE);
  g_string_free (ref_text, TRUE);
  g_string_free (src_text, TRUE);
  return ok;
}

static void
eval_packed (PsmGraph *g, gboolean start)
{
  psm_graph_stale_packed (g);
  psm_graph_keep_packed (g, start);
}

gboolean
psm_model_decode_texts (PsmModel *m, const char *const *texts, int n, const PsmEvalOptions *opt, GError **error)
{
  gboolean (*text_batch) (void *, const char *const *, int, PsmBatch *, GError **) =
    PSM_CLASS_HOOK (m->tk, text_batch);
  if (!m->dk || !text_batch) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "--input: %s", !m->dk ? "only pipelines with a decoder decode raw text"
                                       : "the task plugin cannot read raw text (it has no text_batch)");
    return FALSE;
  }
  psm_graph_set_grad (m->g, FALSE);
  psm_graph_clear_packed (m->gs);   /* the weights may have changed since the last decoding */
  eval_packed (m->g, TRUE);
  int EB = MAX (1, m->eval_batch / MAX (m->beam.beam, 1));
  double gate_sum = 0.0;
  long gate_n = 0;
  gboolean ok = TRUE;
  GTimer *timer = g_timer_new ();
  for (int start = 0; start < n && ok; start += EB) {
    int B = MIN (EB, n - start);
    ok = text_batch (m->task, texts + start, B, &m->batch, error) &&
         psm_batch_validate (&m->batch, &m->info, B, m->task_name, error);   /* as every batch of a task */
    if (ok && m->batch.example_id)
      for (int i = 0; i < m->batch.B; i++)
        m->batch.example_id[i] = start + i;   /* the line, for --json */
    if (ok) {
      psm_graph_reset (m->g);
      ok = eval_sequences (m, PSM_SPLIT_TEST, &m->batch, opt, FALSE, NULL, NULL, &gate_sum, &gate_n, NULL, error);
    }
    if (ok && opt->progress)
      psm_out (PSM_OUT_PROGRESS, "decoded %d/%d  %.2f articles/s", start + B, n,
               (start + B) / MAX (g_timer_elapsed (timer, NULL), 1e-9));
  }
  if (opt->progress)
    psm_out (PSM_OUT_PROGRESS_END, "%s", "");
  g_timer_destroy (timer);
  eval_packed (m->g, FALSE);
  return ok;
}

/* Stream tasks: per-word records. Row b of every evaluation batch reads
 * the b-th contiguous run of the split, so the records are collected per
 * (row, position in its run) and written in the split's order at the end:
 * "index <TAB> word <TAB> log p <TAB> gate" (the gate "-" where the head
 * has none). */
typedef struct {
  int row;
  long k;
  const char *word;
  float logp, gate;
} StreamRec;

static int
stream_rec_cmp (const void *a, const void *b)
{
  const StreamRec *x = a, *y = b;
  return x->row != y->row ? (x->row < y->row ? -1 : 1) : (x->k < y->k ? -1 : x->k > y->k);
}

static gboolean
stream_records (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc, const PsmDecOut *out,
                GArray *recs, long *row_k, GError **error)
{
  void (*token_logp) (void *, PsmGraph *, PsmParams *, const PsmEncoding *, const PsmDecOut *, const PsmBatch *,
                      float *, float *) = PSM_CLASS_HOOK (m->hk, token_logp);
  if (!token_logp) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "head '%s' gives no per-token log-probabilities (PsmHeadClass.token_logp): no per-token records "
                 "for a language model with it", psm_pipeline_plugin (m->pl, "model.head")->desc->name);
    return FALSE;
  }
  size_t R = (size_t) b->Ty * b->B;
  float *lp = g_new (float, R), *gt = g_new (float, R);
  for (size_t r = 0; r < R; r++)
    lp[r] = gt[r] = NAN;
  token_logp (m->head, g, m->params, enc, out, b, lp, gt);
  for (int bi = 0; bi < b->B; bi++)
    for (int t = 0; t < b->Ty; t++) {
      size_t r = (size_t) t * b->B + bi;
      if (b->tgt_mask[r] == 0.0f)
        continue;
      StreamRec rec = { bi, row_k[bi]++, m->tk->token_text (m->task, b, bi, b->tgt[r]), lp[r], gt[r] };
      g_array_append_val (recs, rec);
    }
  g_free (lp);
  g_free (gt);
  return TRUE;
}

static void
stream_records_write (GArray *recs, FILE *f, double *gate_sum, long *gate_n)
{
  qsort (recs->data, recs->len, sizeof (StreamRec), stream_rec_cmp);
  for (guint i = 0; i < recs->len; i++) {
    const StreamRec *r = &g_array_index (recs, StreamRec, i);
    if (isnan (r->gate)) {
      fprintf (f, "%u\t%s\t%.6f\t-\n", i, r->word, r->logp);
    } else {
      fprintf (f, "%u\t%s\t%.6f\t%.6f\n", i, r->word, r->logp, r->gate);
      *gate_sum += r->gate;
      (*gate_n)++;
    }
  }
}

/* One-step outputs (no decoder): the best slot against the first target. */
static void
eval_one_step (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc, const PsmDecOut *out, FILE *fout)
{
  PsmTensor *sc = m->hk->scores (m->head, g, m->params, enc, out, b);
  int S = psm_tensor_cols (sc);
  for (int bi = 0; bi < b->B; bi++) {
    const float *row = sc->data + (size_t) bi * S;
    int best = 0;
    for (int s = 1; s < S; s++)
      if (row[s] > row[best])
        best = s;
    int32_t hyp = m->hk->slot_token (m->head, b, bi, best);
    int32_t ref = PSM_AT (b->tgt_ext, b, 0, bi);
    const char *hw = m->tk->token_text (m->task, b, bi, hyp);
    const char *rw = m->tk->token_text (m->task, b, bi, ref);
    PsmSeq hs = { 1, &hyp, &hw }, rs = { 1, &ref, &rw };
    for (int i = 0; i < m->n_metrics; i++)
      if (m->mk[i]->add)
        m->mk[i]->add (m->metric[i], &hs, &rs);
    if (fout)
      fprintf (fout, "%s\t%s\n", hw, rw);
  }
}

/* Examples [0, n) of a split by source length, the split's order among
 * equals; NULL where the task gives a negative length (keep its order). */
typedef struct {
  int len, i;
} LenIdx;

static int
len_idx_cmp (const void *a, const void *b)
{
  const LenIdx *x = a, *y = b;
  return x->len != y->len ? (x->len > y->len) - (x->len < y->len) : (x->i > y->i) - (x->i < y->i);
}

static int *
length_order (PsmModel *m, PsmSplit split, int n, int (*src_len) (void *, PsmSplit, int))
{
  LenIdx *li = g_new (LenIdx, n);
  for (int i = 0; i < n; i++) {
    li[i] = (LenIdx) { src_len (m->task, split, i), i };
    if (li[i].len < 0) {
      g_free (li);
      return NULL;
    }
  }
  qsort (li, n, sizeof *li, len_idx_cmp);
  int *order = g_new (int, n);
  for (int i = 0; i < n; i++)
    order[i] = li[i].i;
  g_free (li);
  return order;
}

/* The end of an evaluation: the loss and example count summed over the
 * ranks when they split it (split 1: by batches, 2: by streams), the loss
 * per target word, and the metrics' reports, the first the primary value
 * (else the loss). */
static gboolean
eval_report (PsmModel *m, gboolean score, double loss_sum, double weight, int split, PsmEvalResult *res,
             GError **error)
{
  gboolean split_ranks = split == 1;
  if (split) {
    double sums[3] = { loss_sum, weight, split_ranks ? (double) res->n_examples : 0.0 };
    psm_dist_sum_double (sums, 3);
    loss_sum = sums[0];
    weight = sums[1];
    if (split_ranks)
      res->n_examples = (long) sums[2];
  }
  res->loss = weight > 0 ? loss_sum / weight : 0.0;
  for (int i = 0; score && i < m->n_metrics; i++) {
    if (m->mk[i]->add_loss)
      m->mk[i]->add_loss (m->metric[i], loss_sum, (long) weight);
    PsmMetricReport *r = &res->metrics[i];
    memset (r, 0, sizeof *r);
    m->mk[i]->report (m->metric[i], r);
    res->metric_names[i] = m->metric_name[i];
    gboolean named = r->n >= 0 && r->n <= PSM_METRIC_MAX_VALUES;
    for (int k = 0; named && k < r->n; k++)
      named = r->names[k] != NULL;
    if (!named) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "metric plugin '%s' reported %d values%s (a report holds 0 to %d named values)",
                   m->metric_name[i], r->n, r->n >= 0 && r->n <= PSM_METRIC_MAX_VALUES ? " with a NULL name" : "",
                   PSM_METRIC_MAX_VALUES);
      return FALSE;
    }
  }
  res->n_metrics = score ? m->n_metrics : 0;
  if (res->n_metrics && res->metrics[0].n) {
    res->primary = res->metrics[0].values[0];
    res->higher_is_better = m->mk[0]->higher_is_better;
  } else {
    res->primary = res->loss;
    res->higher_is_better = FALSE;
  }
  return TRUE;
}

gboolean
psm_model_evaluate (PsmModel *m, PsmSplit split, const PsmEvalOptions *opt, PsmEvalResult *res, GError **error)
{
  memset (res, 0, sizeof *res);
  long n = m->tk->n_examples (m->task, split);
  if (opt && opt->max_examples > 0 && opt->max_examples < n)
    n = opt->max_examples;
  gboolean score = !m->dk || !opt || opt->decode;
  for (int i = 0; i < m->n_metrics; i++)
    m->mk[i]->reset (m->metric[i]);
  PsmGraph *g = m->g;
  psm_graph_set_grad (g, FALSE);
  psm_graph_set_rng (g, NULL);
  psm_graph_clear_packed (m->gs);   /* the weights may have changed since the last decoding */
  eval_packed (g, TRUE);
  double loss_sum = 0.0, weight = 0.0, gate_sum = 0.0, pad_all = 0.0, pad_real = 0.0;
  long gate_n = 0;
  gboolean ok = TRUE;
  GTimer *timer = g_timer_new ();
  int EB = m->dk && score ? MAX (1, m->eval_batch / MAX (m->beam.beam, 1)) : m->eval_batch;
  /* stream tasks: segment after segment of EB streams, the state carried,
   * until the task has no more (T == 0) or n target words are scored */
  m->carry_mode = 1;
  GArray *recs = m->streams && opt && opt->out ? g_array_new (FALSE, FALSE, sizeof (StreamRec)) : NULL;
  long *row_k = recs ? g_new0 (long, EB) : NULL;
  /* over MPI ranks, a loss-only evaluation (validation of a sequence model)
   * is split batch by batch and summed; a language model's, stream by
   * stream (each rank carries the state of its rows of every segment) */
  int nr = psm_dist_size (), rank = psm_dist_rank ();
  gboolean split_ranks = nr > 1 && m->dk && !score && !m->streams;
  gboolean split_streams = nr > 1 && m->streams && !recs && EB >= nr;
  /* decoding: the articles in order of source length where the task can
   * say it (decode.sort), so that a batch pads little; outputs in the
   * split's order all the same */
  gboolean (*batch_of) (void *, PsmSplit, const int *, int, PsmBatch *, GError **) =
    PSM_CLASS_HOOK (m->tk, eval_batch_of);
  int (*src_len) (void *, PsmSplit, int) = PSM_CLASS_HOOK (m->tk, source_length);
  int *order = NULL;
  Reorder *reorder = NULL;
  if (m->dk && score && !m->streams && m->sort_decode && batch_of && src_len && n > EB) {
    order = length_order (m, split, (int) n, src_len);
    if (order && !(reorder = reorder_new (n, opt && (opt->out || opt->ref || opt->json), error)))
      ok = FALSE;
  }
  for (long start = 0; ok && (m->streams ? res->n_examples < n : start < n); start += m->streams ? 1 : EB) {
    if (split_ranks && (start / EB) % nr != rank)
      continue;
    int B = m->streams ? EB : (int) MIN ((long) EB, n - start);
    if (order ? !batch_of (m->task, split, order + start, B, &m->batch, error)
              : !psm_task_eval_batch (m->tk, m->task, split, (int) start, B, &m->batch, error)) {
      ok = FALSE;
      break;
    }
    if (m->streams && m->batch.T == 0)
      break;
    if (!psm_batch_validate (&m->batch, &m->info, B, m->task_name, error)) {
      ok = FALSE;
      break;
    }
    double w_all = 0.0;   /* the whole segment's target words, the same on every rank */
    for (int i = 0; m->streams && i < m->batch.B * m->batch.Ty; i++)
      w_all += m->batch.tgt_mask[i];
    if (split_streams)
      psm_batch_take_streams (&m->batch, rank, nr);
    const PsmBatch *b = &m->batch;
    psm_graph_reset (g);
    PsmEncoding enc;
    PsmDecOut out;
    PsmTensor *loss = forward_loss (m, g, b, &enc, &out);
    double w = 0.0;
    for (int i = 0; i < b->B * b->Ty; i++)
      w += b->tgt_mask[i];
    loss_sum += loss->data[0] * w;
    weight += w;
    if (m->streams) {
      if (recs && !stream_records (m, g, b, &enc, &out, recs, row_k, error)) {
        ok = FALSE;
        break;
      }
      if (m->hist_p)
        history_push (m, b, &enc);
      res->n_examples += (long) w_all;   /* target words */
      continue;
    }
    if (!m->dk) {
      eval_one_step (m, g, b, &enc, &out, opt ? opt->out : NULL);
    } else if (score) {
      pad_all += (double) b->T * b->B;
      for (int i = 0; i < b->T * b->B; i++)
        pad_real += b->src_mask[i] != 0.0f;
      psm_graph_reset (g);
      ok = eval_sequences (m, split, b, opt, TRUE, reorder, order ? order + start : NULL, &gate_sum, &gate_n,
                           res->decode_phases, error);
      if (ok && opt && opt->progress) {
        double t = g_timer_elapsed (timer, NULL);
        psm_out (PSM_OUT_PROGRESS, "decoded %ld/%ld  %.2f articles/s", start + B, n, (start + B) / MAX (t, 1e-9));
      }
    }
    res->n_examples += b->B;
  }
  if (m->dk && score && opt && opt->progress)
    psm_out (PSM_OUT_PROGRESS_END, "%s", "");
  m->carry_mode = 0;
  if (reorder && ok) {
    reorder_score (m, split, reorder);
    ok = reorder_write (reorder, opt, error);
  }
  reorder_free (reorder);
  g_free (order);
  if (recs) {
    if (ok)
      stream_records_write (recs, opt->out, &gate_sum, &gate_n);
    g_array_free (recs, TRUE);
    g_free (row_k);
  }
  res->decode_seconds = g_timer_elapsed (timer, NULL);
  res->decode_padding = pad_all > 0 ? 1.0 - pad_real / pad_all : 0.0;
  g_timer_destroy (timer);
  psm_graph_reset (g);
  psm_graph_reset (m->gs);
  psm_graph_set_grad (g, TRUE);
  eval_packed (g, FALSE);
  res->mean_gate = gate_n ? gate_sum / gate_n : NAN;
  return ok && eval_report (m, score, loss_sum, weight, split_ranks ? 1 : split_streams ? 2 : 0, res, error);
}
