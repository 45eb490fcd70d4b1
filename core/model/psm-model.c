/* psm-model.c — assembles task, embedding, encoder, (decoder,) head and
 * metrics from a validated pipeline; the decoding settings. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

PsmGraph *psm_model_graph (PsmModel *m) { return m->g; }
PsmBatch *psm_model_batch (PsmModel *m) { return &m->batch; }
PsmPipeline *psm_model_pipeline (PsmModel *m) { return m->pl; }
PsmParams *psm_model_params (PsmModel *m) { return m->params; }
gboolean psm_model_has_decoder (PsmModel *m) { return m->dk != NULL; }
gboolean psm_model_streams (PsmModel *m) { return m->streams; }

double
psm_model_take_share (PsmModel *m, int rank, int n)
{
  return m->streams ? psm_batch_take_streams (&m->batch, rank, n) : psm_batch_take_share (&m->batch, rank, n);
}

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

/* The task: created, its sizes read and checked. */
static gboolean
model_task (PsmModel *m, gboolean check, guint64 seed, GError **error)
{
  PsmPipeline *pl = m->pl;
  GError *e = NULL;
  const PsmPlugin *tp = psm_pipeline_plugin (pl, "task");
  m->tk = tp->desc->klass;
  PsmTaskCtx tctx = { sizeof tctx, seed, check, check ? NULL : psm_pipeline_run_dir (pl),
                      !check && psm_pipeline_eval_only (pl), !check && psm_pipeline_text_only (pl) };
  m->task = m->tk->create (psm_pipeline_section (pl, "task"), &tctx, &e);
  if (!m->task) {
    fail_create (error, e, "task", tp);
    return FALSE;
  }
  memset (&m->info, 0, sizeof m->info);
  m->info.size = sizeof m->info;
  m->tk->info (m->task, &m->info);
  m->task_name = tp->desc->name;
  if (!psm_task_info_validate (&m->info, m->task_name, error))
    return FALSE;
  m->streams = m->info.streams;
  return TRUE;
}

/* The decode section's settings for a model with a decoder. */
static gboolean
model_beam (PsmModel *m, gboolean check, GError **error)
{
  const PsmSection *ds = psm_pipeline_section (m->pl, "decode");
  m->beam.beam = (int) psm_section_int (ds, "beam");
  m->beam.min_len = (int) psm_section_int (ds, "min_len");
  m->beam.max_len = (int) psm_section_int (ds, "max_len");
  m->beam.block_ngram = (int) psm_section_int (ds, "block_ngram");
  m->beam.length_penalty = psm_section_float (ds, "length_penalty");
  m->beam.no_unk = psm_section_bool (ds, "no_unk");
  m->beam.unk = m->info.unk_id;
  m->attn_top = (int) psm_section_int (ds, "attn_top");
  m->sort_decode = psm_section_bool (ds, "sort");
  if (m->beam.min_len > m->beam.max_len) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s: %d is above decode.max_len (%d)",
                 psm_section_where (ds, "min_len"), m->beam.min_len, m->beam.max_len);
    return FALSE;
  }
  if (check) {
    /* --check decodes to test the wiring, not to summarise: short outputs */
    m->beam.max_len = MIN (m->beam.max_len, 12);
    m->beam.min_len = MIN (m->beam.min_len, 4);
  }
  return TRUE;
}

/* The embedding tables (the target's, or the source's tied), and with a
 * decoder its words and decoding settings checked; *E the dimension. */
static gboolean
model_embeddings (PsmModel *m, gboolean decoder, gboolean check, int *E, GError **error)
{
  PsmPipeline *pl = m->pl;
  const PsmSection *emb = psm_pipeline_section (pl, "model.embedding");
  *E = (int) psm_section_int (emb, "dim");
  float escale = (float) psm_section_float (emb, "init_scale");
  int eshape[2] = { m->info.src_vocab, *E };
  m->emb_id = psm_params_add (m->params, "embedding.src", 2, eshape, PSM_INIT_UNIFORM, escale);
  m->tgt_emb_id = m->emb_id;
  if (!decoder)
    return TRUE;
  if (m->info.bos_id < 0 || m->info.eos_id < 0) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: model.decoder: task '%s' has no begin/end-of-sequence words, so it cannot drive a decoder",
                 psm_pipeline_file (pl), m->task_name);
    return FALSE;
  }
  if (psm_section_bool (emb, "tie")) {
    if (m->info.src_vocab != m->info.tgt_vocab) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: tie: source (%d words) and target (%d words) vocabularies differ, so their embeddings "
                   "cannot be one table", psm_section_where (emb, "tie"), m->info.src_vocab, m->info.tgt_vocab);
      return FALSE;
    }
  } else {
    int tshape[2] = { m->info.tgt_vocab, *E };
    m->tgt_emb_id = psm_params_add (m->params, "embedding.tgt", 2, tshape, PSM_INIT_UNIFORM, escale);
  }
  return model_beam (m, check, error);
}

/* The encoder, the decoder (dp, or NULL) and the head, in that order (the
 * order of their parameters), each told the sizes of the one before. */
static gboolean
model_components (PsmModel *m, const PsmPlugin *ep, const PsmPlugin *dp, PsmBuildCtx *ctx, GError **error)
{
  PsmPipeline *pl = m->pl;
  GError *e = NULL;
  m->ek = ep->desc->klass;
  m->enc_plugin = ep;
  m->enc = m->ek->create (psm_pipeline_section (pl, "model.encoder"), ctx, &e);
  if (!m->enc) {
    fail_create (error, e, "model.encoder", ep);
    return FALSE;
  }
  ctx->enc_dim = m->ek->output_dim (m->enc);
  ctx->summary_dim = m->ek->summary_dim (m->enc);
  ctx->state_dim = m->streams ? ctx->enc_dim : ctx->summary_dim;
  int (*carry_dim) (void *) = PSM_CLASS_HOOK (m->ek, carry_dim);
  m->carry_k = m->streams && carry_dim ? carry_dim (m->enc) : 0;
  if (dp) {
    ctx->prefix = "decoder.";
    m->dk = dp->desc->klass;
    m->dec = m->dk->create (psm_pipeline_section (pl, "model.decoder"), ctx, &e);
    if (!m->dec) {
      fail_create (error, e, "model.decoder", dp);
      return FALSE;
    }
    ctx->state_dim = m->dk->state_dim (m->dec);
    ctx->context_dim = m->dk->context_dim (m->dec);
    ctx->has_attention = m->dk->has_attention (m->dec);
  }
  ctx->prefix = "head.";
  const PsmPlugin *hp = psm_pipeline_plugin (pl, "model.head");
  m->hk = hp->desc->klass;
  m->head_name = hp->desc->name;
  m->head = m->hk->create (psm_pipeline_section (pl, "model.head"), ctx, &e);
  if (!m->head) {
    fail_create (error, e, "model.head", hp);
    return FALSE;
  }
  int (*history) (void *) = PSM_CLASS_HOOK (m->hk, history);
  m->hist_p = m->streams && history ? MAX (history (m->head), 0) : 0;
  m->hist_h = ctx->enc_dim;
  if (dp) {
    /* the end token as a slot of the head's output space */
    m->beam.eos = m->info.eos_id < m->info.tgt_vocab ? m->info.eos_id : -1;
    if (m->beam.eos < 0) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: task '%s': the end-of-sequence word %d is outside the shortlist of %d words",
                   psm_pipeline_file (pl), m->task_name, m->info.eos_id, m->info.tgt_vocab);
      return FALSE;
    }
  }
  return TRUE;
}

static gboolean
model_metrics (PsmModel *m, GError **error)
{
  GError *e = NULL;
  for (int i = 0; i < psm_pipeline_n_metrics (m->pl); i++) {
    const PsmSection *ms;
    const PsmPlugin *mp = psm_pipeline_metric (m->pl, i, &ms);
    m->mk[i] = mp->desc->klass;
    m->metric_name[i] = mp->desc->name;
    m->metric[i] = m->mk[i]->create (ms, &e);
    if (!m->metric[i]) {
      fail_create (error, e, "metrics", mp);
      return FALSE;
    }
    m->n_metrics = i + 1;
  }
  return TRUE;
}

PsmModel *
psm_model_new (PsmPipeline *pl, gboolean check, GError **error)
{
  PsmModel *m = g_new0 (PsmModel, 1);
  m->pl = pl;
  m->params = psm_params_new ();
  m->g = psm_graph_new ();
  m->gs = psm_graph_new ();
  psm_graph_set_grad (m->gs, FALSE);
  psm_graph_keep_packed (m->gs, TRUE);   /* across the steps of one decoding; cleared when one starts */
  const char *prec = psm_section_string (psm_pipeline_section (pl, "decode"), "precision");
  psm_graph_set_bf16 (m->gs, prec && !strcmp (prec, "bf16"));
  /* train.precision: the training graph's products with gradients (an
   * evaluation on it has none, and stays single precision) */
  const PsmSection *train = psm_pipeline_section (pl, "train");
  const char *tprec = psm_section_string (train, "precision");
  psm_graph_set_bf16_train (m->g, tprec && !strcmp (tprec, "bf16"));
  psm_batch_init (&m->batch);
  guint64 seed = (guint64) psm_section_int (train, "seed");
  m->eval_batch = (int) psm_section_int (psm_pipeline_section (pl, "eval"), "batch");
  if (!model_task (m, check, seed, error))
    goto fail;
  const PsmPlugin *ep = psm_pipeline_plugin (pl, "model.encoder");
  const PsmPlugin *dp = psm_pipeline_plugin (pl, "model.decoder");
  if (!ep) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: model.encoder: missing section (every pipeline needs an encoder)", psm_pipeline_file (pl));
    goto fail;
  }
  if (dp && m->streams) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: model.decoder: task '%s' is a language model over streams of text: its encoder predicts "
                 "every next word, with no decoder (remove the model.decoder section)", psm_pipeline_file (pl),
                 m->task_name);
    goto fail;
  }
  int E = 0;
  if (!model_embeddings (m, dp != NULL, check, &E, error))
    goto fail;
  PsmBuildCtx ctx = { sizeof ctx, m->params, "encoder.", &m->info, E, 0, 0, 0, 0, FALSE, m->emb_id };
  if (!model_components (m, ep, dp, &ctx, error) || !model_metrics (m, error)
      || !check_step_memory (m, E, ctx.enc_dim, error))
    goto fail;
  double init_uniform = psm_section_float (train, "init_uniform");
  if (init_uniform > 0)
    psm_params_init_uniform (m->params, (float) init_uniform, (float) psm_section_float (train, "init_bias"));
  PsmRng rng;
  psm_rng_seed (&rng, seed);
  if (!psm_params_finalize_deferred (m->params, &rng, error))
    goto fail;
  return m;
fail:
  psm_model_free (m);
  return NULL;
}

void
psm_model_free (PsmModel *m)
{
  if (m) {
    g_free (m->carry[0]);
    g_free (m->carry[1]);
    for (int i = 0; i < 2; i++) {
      g_free (m->hist[i]);
      g_free (m->hist_ids[i]);
    }
  }
  if (!m)
    return;
  for (int i = 0; i < m->n_metrics; i++)
    m->mk[i]->destroy (m->metric[i]);
  if (m->head)
    m->hk->destroy (m->head);
  if (m->dec)
    m->dk->destroy (m->dec);
  if (m->enc)
    m->ek->destroy (m->enc);
  if (m->task)
    m->tk->destroy (m->task);
  psm_params_free (m->params);
  psm_graph_free (m->g);
  psm_graph_free (m->gs);
  psm_batch_clear (&m->batch);
  g_free (m);
}

gboolean
psm_model_save_task (PsmModel *m, const char *dir, GError **error)
{
  gboolean (*save) (void *, const char *, GError **) = PSM_CLASS_HOOK (m->tk, save);
  return !save || save (m->task, dir, error);
}

void
psm_model_get_decode (PsmModel *m, PsmDecodeSettings *s)
{
  *s = (PsmDecodeSettings) { m->beam.beam, m->beam.min_len, m->beam.max_len };
}

gboolean
psm_model_set_decode (PsmModel *m, const PsmDecodeSettings *s, GError **error)
{
  const char *bad = s->beam < 1 || s->beam > 256 ? "beam: expected 1 to 256"
                    : s->min_len < 0 || s->min_len > 4096 ? "min_len: expected 0 to 4096"
                    : s->max_len < 1 || s->max_len > 4096 ? "max_len: expected 1 to 4096"
                    : s->min_len > s->max_len ? "min_len: above max_len" : NULL;
  if (bad) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID, "%s (beam %d, min_len %d, max_len %d)", bad,
                 s->beam, s->min_len, s->max_len);
    return FALSE;
  }
  m->beam.beam = s->beam;
  m->beam.min_len = s->min_len;
  m->beam.max_len = s->max_len;
  return TRUE;
}

/* Around an evaluation on graph g: the weights do not change from batch to
 * batch, so the packed copies of them that g makes (psm_graph_packed)
 * serve every batch instead of being packed again after each reset; they
 * are stale at the start (the weights may have changed since g packed
 * them) and again at the end (training goes on). */
