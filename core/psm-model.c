/* psm-model.c — assembles task, embedding, encoder, (decoder,) head and
 * metrics from a validated pipeline; computes losses and evaluates splits. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-private.h"
#include "psm/psm-pipeline.h"

#define MAX_METRICS 8

struct PsmModel {
  PsmPipeline *pl;
  const PsmTaskClass *tk;
  void *task;
  const char *task_name;
  PsmTaskInfo info;
  const PsmEncoderClass *ek;
  void *enc;
  const PsmHeadClass *hk;
  void *head;
  int n_metrics;
  const PsmMetricClass *mk[MAX_METRICS];
  void *metric[MAX_METRICS];
  const char *metric_name[MAX_METRICS];
  PsmParams *params;
  int emb_id;
  PsmGraph *g;
  PsmBatch batch;
  int eval_batch;
};

PsmGraph *psm_model_graph (PsmModel *m) { return m->g; }
PsmBatch *psm_model_batch (PsmModel *m) { return &m->batch; }
PsmPipeline *psm_model_pipeline (PsmModel *m) { return m->pl; }
PsmParams *psm_model_params (PsmModel *m) { return m->params; }

void *
psm_model_task (PsmModel *m, const PsmTaskClass **klass)
{
  if (klass)
    *klass = m->tk;
  return m->task;
}

static gboolean
fail_create (GError **error, GError *e, const char *path, const PsmPlugin *pl)
{
  if (e)
    g_propagate_error (error, e);
  else
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: plugin %s failed to build (%s)",
                 path, pl->desc->name, pl->path);
  return FALSE;
}

/* A lower bound of one step's memory, checked before anything runs: the
 * embedded source and the annotations over B x T tokens, and the head's
 * scores over the shortlist for B x Ty targets, with their gradients in
 * training. Whatever the plugins add comes on top, so a pipeline refused
 * here could never have run. */
static gboolean
check_step_memory (PsmModel *m, int E, int H, GError **error)
{
  guint64 limit = psm_memory_limit ();
  if (!limit)
    return TRUE;
  const PsmSection *train = psm_pipeline_section (m->pl, "train");
  double Bt = (double) psm_section_int (train, "batch"), Be = m->eval_batch;
  double T = m->info.max_src_len, Ty = m->info.max_tgt_len, V = m->info.tgt_vocab;
  double per_ex = T * (E + H) + Ty * V;
  double need = 4.0 * MAX (2.0 * Bt * per_ex, Be * per_ex);
  if (need <= (double) limit)
    return TRUE;
  g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
               "%s: one %s step needs at least %.1f GiB (train.batch %.0f, eval.batch %.0f; the task's "
               "sources up to %.0f tokens, targets up to %.0f over %.0f words; embedding %d, encoder %d), and "
               "this process may use %.1f GiB: lower train.batch or eval.batch, or the lengths",
               psm_pipeline_file (m->pl), 2.0 * Bt >= Be ? "training" : "evaluation",
               need / (1024.0 * 1024 * 1024), Bt, Be, T, Ty, V, E, H, limit / (1024.0 * 1024 * 1024));
  return FALSE;
}

PsmModel *
psm_model_new (PsmPipeline *pl, gboolean check, GError **error)
{
  PsmModel *m = g_new0 (PsmModel, 1);
  m->pl = pl;
  m->params = psm_params_new ();
  m->g = psm_graph_new ();
  psm_batch_init (&m->batch);
  GError *e = NULL;
  const PsmSection *train = psm_pipeline_section (pl, "train");
  guint64 seed = (guint64) psm_section_int (train, "seed");
  m->eval_batch = (int) psm_section_int (psm_pipeline_section (pl, "eval"), "batch");

  const PsmPlugin *tp = psm_pipeline_plugin (pl, "task");
  m->tk = tp->desc->klass;
  PsmTaskCtx tctx = { sizeof tctx, seed, check };
  m->task = m->tk->create (psm_pipeline_section (pl, "task"), &tctx, &e);
  if (!m->task) {
    fail_create (error, e, "task", tp);
    goto fail;
  }
  memset (&m->info, 0, sizeof m->info);
  m->info.size = sizeof m->info;
  m->tk->info (m->task, &m->info);
  m->task_name = tp->desc->name;
  if (!psm_task_info_validate (&m->info, m->task_name, error))
    goto fail;

  if (psm_pipeline_plugin (pl, "model.decoder")) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: model.decoder: pipelines with a decoder cell are not supported by this psm release "
                 "(the step loop and beam search arrive with the first decoder plugin)",
                 psm_pipeline_file (pl));
    goto fail;
  }
  const PsmPlugin *ep = psm_pipeline_plugin (pl, "model.encoder");
  if (!ep) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: model.encoder: missing section (a pipeline without a decoder needs an encoder)",
                 psm_pipeline_file (pl));
    goto fail;
  }
  const PsmSection *emb = psm_pipeline_section (pl, "model.embedding");
  int E = (int) psm_section_int (emb, "dim");
  int eshape[2] = { m->info.src_vocab, E };
  m->emb_id = psm_params_add (m->params, "embedding.src", 2, eshape, PSM_INIT_UNIFORM,
                              (float) psm_section_float (emb, "init_scale"));
  PsmBuildCtx ctx = { sizeof ctx, m->params, "encoder.", &m->info, E, 0, 0, 0, 0, FALSE };
  m->ek = ep->desc->klass;
  m->enc = m->ek->create (psm_pipeline_section (pl, "model.encoder"), &ctx, &e);
  if (!m->enc) {
    fail_create (error, e, "model.encoder", ep);
    goto fail;
  }
  ctx.prefix = "head.";
  ctx.enc_dim = m->ek->output_dim (m->enc);
  ctx.summary_dim = m->ek->summary_dim (m->enc);
  ctx.state_dim = ctx.summary_dim;
  const PsmPlugin *hp = psm_pipeline_plugin (pl, "model.head");
  m->hk = hp->desc->klass;
  m->head = m->hk->create (psm_pipeline_section (pl, "model.head"), &ctx, &e);
  if (!m->head) {
    fail_create (error, e, "model.head", hp);
    goto fail;
  }
  for (int i = 0; i < psm_pipeline_n_metrics (pl); i++) {
    const PsmSection *ms;
    const PsmPlugin *mp = psm_pipeline_metric (pl, i, &ms);
    m->mk[i] = mp->desc->klass;
    m->metric_name[i] = mp->desc->name;
    m->metric[i] = m->mk[i]->create (ms, &e);
    if (!m->metric[i]) {
      fail_create (error, e, "metrics", mp);
      goto fail;
    }
    m->n_metrics = i + 1;
  }
  if (!check_step_memory (m, E, ctx.enc_dim, error))
    goto fail;
  PsmRng rng;
  psm_rng_seed (&rng, seed);
  if (!psm_params_finalize (m->params, &rng, error))
    goto fail;
  return m;
fail:
  psm_model_free (m);
  return NULL;
}

void
psm_model_free (PsmModel *m)
{
  if (!m)
    return;
  for (int i = 0; i < m->n_metrics; i++)
    m->mk[i]->destroy (m->metric[i]);
  if (m->head)
    m->hk->destroy (m->head);
  if (m->enc)
    m->ek->destroy (m->enc);
  if (m->task)
    m->tk->destroy (m->task);
  psm_params_free (m->params);
  psm_graph_free (m->g);
  psm_batch_clear (&m->batch);
  g_free (m);
}

static void
encode (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc, PsmDecOut *out)
{
  PsmTensor *table = psm_param (g, m->params, m->emb_id);
  PsmTensor *x = psm_embedding (g, table, b->src, b->T * b->B);
  int shape[3] = { b->T, b->B, psm_tensor_cols (table) };
  x = psm_tensor_reshape (g, x, 3, shape);
  memset (enc, 0, sizeof *enc);
  enc->T = b->T;
  enc->B = b->B;
  enc->mask = b->src_mask;
  enc->src = b->src;
  m->ek->encode (m->enc, g, m->params, x, b->src_mask, enc);
  /* No decoder: the head sees one step whose state is the summary. */
  memset (out, 0, sizeof *out);
  out->Ty = 1;
  out->B = b->B;
  int s3[3] = { 1, b->B, psm_tensor_cols (enc->summary) };
  out->state = psm_tensor_reshape (g, enc->summary, 3, s3);
}

gboolean
psm_model_train_batch (PsmModel *m, int B, PsmRng *rng, GError **error)
{
  return m->tk->train_batch (m->task, B, rng, &m->batch, error) &&
         psm_batch_validate (&m->batch, &m->info, B, m->task_name, error);
}

PsmTensor *
psm_model_loss (PsmModel *m, PsmGraph *g, const PsmBatch *b)
{
  PsmEncoding enc;
  PsmDecOut out;
  encode (m, g, b, &enc, &out);
  return m->hk->loss (m->head, g, m->params, &enc, &out, b);
}

gboolean
psm_model_evaluate (PsmModel *m, PsmSplit split, long max_examples, FILE *fout,
                    PsmEvalResult *res, GError **error)
{
  memset (res, 0, sizeof *res);
  long n = m->tk->n_examples (m->task, split);
  if (max_examples > 0 && max_examples < n)
    n = max_examples;
  for (int i = 0; i < m->n_metrics; i++)
    m->mk[i]->reset (m->metric[i]);
  PsmGraph *g = m->g;
  psm_graph_set_grad (g, FALSE);
  double loss_sum = 0.0, weight = 0.0;
  gboolean ok = TRUE;
  for (long start = 0; start < n && ok; start += m->eval_batch) {
    int B = (int) MIN ((long) m->eval_batch, n - start);
    if (!m->tk->eval_batch (m->task, split, (int) start, B, &m->batch, error) ||
        !psm_batch_validate (&m->batch, &m->info, B, m->task_name, error)) {
      ok = FALSE;
      break;
    }
    const PsmBatch *b = &m->batch;
    psm_graph_reset (g);
    PsmEncoding enc;
    PsmDecOut out;
    encode (m, g, b, &enc, &out);
    PsmTensor *loss = m->hk->loss (m->head, g, m->params, &enc, &out, b);
    double w = 0.0;
    for (int i = 0; i < b->B * b->Ty; i++)
      w += b->tgt_mask[i];
    loss_sum += loss->data[0] * w;
    weight += w;
    PsmTensor *sc = m->hk->scores (m->head, g, m->params, &enc, &out, b);
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
    res->n_examples += b->B;
  }
  psm_graph_reset (g);
  psm_graph_set_grad (g, TRUE);
  if (!ok)
    return FALSE;
  res->loss = weight > 0 ? loss_sum / weight : 0.0;
  for (int i = 0; i < m->n_metrics; i++) {
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
  res->n_metrics = m->n_metrics;
  if (m->n_metrics && res->metrics[0].n) {
    res->primary = res->metrics[0].values[0];
    res->higher_is_better = m->mk[0]->higher_is_better;
  } else {
    res->primary = res->loss;
    res->higher_is_better = FALSE;
  }
  return TRUE;
}
