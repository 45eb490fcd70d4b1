/* psm-model.c — assembles task, embedding, encoder, (decoder,) head and
 * metrics from a validated pipeline; computes losses and evaluates splits. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
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
  const PsmDecoderClass *dk;   /* NULL: no decoder (one step, the summary) */
  void *dec;
  const PsmHeadClass *hk;
  void *head;
  int n_metrics;
  const PsmMetricClass *mk[MAX_METRICS];
  void *metric[MAX_METRICS];
  const char *metric_name[MAX_METRICS];
  PsmParams *params;
  int emb_id;
  int tgt_emb_id;              /* decoder inputs (== emb_id when tied) */
  PsmBeamConfig beam;
  int attn_top;
  gboolean sort_decode;        /* decode.sort */
  PsmGraph *g;
  PsmGraph *gs;                /* decoding: one step at a time */
  PsmBatch batch;
  int eval_batch;
  /* stream tasks: the encoder state carried between segments, one buffer
   * for training and one for evaluation ([carry_rows[i], carry_k]) */
  gboolean streams;
  int carry_k;
  float *carry[2];
  int carry_rows[2];
  int carry_mode;               /* 0 training, 1 evaluation */
  /* stream tasks whose head reads earlier positions (PsmHeadClass.history):
   * the last hist_p annotations [hist_p, B, H] and words [hist_p, B] of
   * every stream, per mode as the carry */
  int hist_p, hist_h;
  float *hist[2];
  int32_t *hist_ids[2];
  int hist_rows[2];
  PsmRng *train_rng;            /* dropout's stream for this batch (&drop_rng), or NULL */
  PsmRng drop_rng;
  const PsmPlugin *enc_plugin;  /* its ABI minor: does it know carry_at? */
  const char *head_name;        /* the head plugin's name (JSON output) */
  gboolean check_mode;          /* psm_model_check_mode */
  gboolean all_rows;            /* psm_model_set_all_rows */
  gboolean want_importance;     /* the next encodings' PsmEncoding.want_importance (JSON output) */
};

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
  const char *tprec = psm_section_string (psm_pipeline_section (pl, "train"), "precision");
  psm_graph_set_bf16_train (m->g, tprec && !strcmp (tprec, "bf16"));
  psm_batch_init (&m->batch);
  GError *e = NULL;
  const PsmSection *train = psm_pipeline_section (pl, "train");
  guint64 seed = (guint64) psm_section_int (train, "seed");
  m->eval_batch = (int) psm_section_int (psm_pipeline_section (pl, "eval"), "batch");

  const PsmPlugin *tp = psm_pipeline_plugin (pl, "task");
  m->tk = tp->desc->klass;
  PsmTaskCtx tctx = { sizeof tctx, seed, check, check ? NULL : psm_pipeline_run_dir (pl),
                      !check && psm_pipeline_eval_only (pl), !check && psm_pipeline_text_only (pl) };
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
  m->streams = m->info.streams;

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
  const PsmSection *emb = psm_pipeline_section (pl, "model.embedding");
  int E = (int) psm_section_int (emb, "dim");
  float escale = (float) psm_section_float (emb, "init_scale");
  int eshape[2] = { m->info.src_vocab, E };
  m->emb_id = psm_params_add (m->params, "embedding.src", 2, eshape, PSM_INIT_UNIFORM, escale);
  m->tgt_emb_id = m->emb_id;
  if (dp) {
    if (m->info.bos_id < 0 || m->info.eos_id < 0) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: model.decoder: task '%s' has no begin/end-of-sequence words, so it cannot drive a decoder",
                   psm_pipeline_file (pl), m->task_name);
      goto fail;
    }
    if (psm_section_bool (emb, "tie")) {
      if (m->info.src_vocab != m->info.tgt_vocab) {
        g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                     "%s: tie: source (%d words) and target (%d words) vocabularies differ, so their embeddings "
                     "cannot be one table", psm_section_where (emb, "tie"), m->info.src_vocab, m->info.tgt_vocab);
        goto fail;
      }
    } else {
      int tshape[2] = { m->info.tgt_vocab, E };
      m->tgt_emb_id = psm_params_add (m->params, "embedding.tgt", 2, tshape, PSM_INIT_UNIFORM, escale);
    }
    const PsmSection *ds = psm_pipeline_section (pl, "decode");
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
      goto fail;
    }
    if (check) {
      /* --check decodes to test the wiring, not to summarise: short outputs */
      m->beam.max_len = MIN (m->beam.max_len, 12);
      m->beam.min_len = MIN (m->beam.min_len, 4);
    }
  }
  PsmBuildCtx ctx = { sizeof ctx, m->params, "encoder.", &m->info, E, 0, 0, 0, 0, FALSE, m->emb_id };
  m->ek = ep->desc->klass;
  m->enc_plugin = ep;
  m->enc = m->ek->create (psm_pipeline_section (pl, "model.encoder"), &ctx, &e);
  if (!m->enc) {
    fail_create (error, e, "model.encoder", ep);
    goto fail;
  }
  ctx.enc_dim = m->ek->output_dim (m->enc);
  ctx.summary_dim = m->ek->summary_dim (m->enc);
  ctx.state_dim = m->streams ? ctx.enc_dim : ctx.summary_dim;
  int (*carry_dim) (void *) = PSM_CLASS_HOOK (m->ek, carry_dim);
  m->carry_k = m->streams && carry_dim ? carry_dim (m->enc) : 0;
  if (dp) {
    ctx.prefix = "decoder.";
    m->dk = dp->desc->klass;
    m->dec = m->dk->create (psm_pipeline_section (pl, "model.decoder"), &ctx, &e);
    if (!m->dec) {
      fail_create (error, e, "model.decoder", dp);
      goto fail;
    }
    ctx.state_dim = m->dk->state_dim (m->dec);
    ctx.context_dim = m->dk->context_dim (m->dec);
    ctx.has_attention = m->dk->has_attention (m->dec);
  }
  ctx.prefix = "head.";
  const PsmPlugin *hp = psm_pipeline_plugin (pl, "model.head");
  m->hk = hp->desc->klass;
  m->head_name = hp->desc->name;
  m->head = m->hk->create (psm_pipeline_section (pl, "model.head"), &ctx, &e);
  if (!m->head) {
    fail_create (error, e, "model.head", hp);
    goto fail;
  }
  int (*history) (void *) = PSM_CLASS_HOOK (m->hk, history);
  m->hist_p = m->streams && history ? MAX (history (m->head), 0) : 0;
  m->hist_h = ctx.enc_dim;
  if (dp) {
    /* the end token as a slot of the head's output space */
    m->beam.eos = m->info.eos_id < m->info.tgt_vocab ? m->info.eos_id : -1;
    if (m->beam.eos < 0) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: task '%s': the end-of-sequence word %d is outside the shortlist of %d words",
                   psm_pipeline_file (pl), m->task_name, m->info.eos_id, m->info.tgt_vocab);
      goto fail;
    }
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

/* Stream state layout (native endianness, as the checkpoint): "PSMS", u32
 * 1, i64 cursor (-1: the task has none), i32 rows, i32 carry_k, f32 carry
 * [rows, carry_k], i32 hist_p, i32 hist_h, f32 history [hist_p, rows,
 * hist_h], i32 words [hist_p, rows]; rows = 0 before any training step. */
GBytes *
psm_model_stream_state (PsmModel *m)
{
  if (!m->streams)
    return NULL;
  gint64 (*cursor) (void *) = PSM_CLASS_HOOK (m->tk, train_cursor);
  gint64 cur = cursor ? cursor (m->task) : -1;
  gint32 rows = m->carry_k ? m->carry_rows[0] : m->hist_rows[0], k = m->carry_k, P = m->hist_p, H = m->hist_h;
  if (m->carry_k && m->hist_p && m->hist_rows[0] != rows)
    rows = 0;   /* not yet a training segment with both */
  guint32 version = 1;
  GByteArray *a = g_byte_array_new ();
  g_byte_array_append (a, (const guint8 *) "PSMS", 4);
  g_byte_array_append (a, (const guint8 *) &version, 4);
  g_byte_array_append (a, (const guint8 *) &cur, 8);
  g_byte_array_append (a, (const guint8 *) &rows, 4);
  g_byte_array_append (a, (const guint8 *) &k, 4);
  if (rows && k)
    g_byte_array_append (a, (const guint8 *) m->carry[0], (guint) ((size_t) rows * k * sizeof (float)));
  g_byte_array_append (a, (const guint8 *) &P, 4);
  g_byte_array_append (a, (const guint8 *) &H, 4);
  if (rows && P) {
    g_byte_array_append (a, (const guint8 *) m->hist[0], (guint) ((size_t) P * rows * H * sizeof (float)));
    g_byte_array_append (a, (const guint8 *) m->hist_ids[0], (guint) ((size_t) P * rows * sizeof (int32_t)));
  }
  return g_byte_array_free_to_bytes (a);
}

/* A stream state read back: pointers into its bytes. */
typedef struct {
  gint64 cur;
  gint32 rows, k, P, H;
  const float *carry, *hist;
  const int32_t *ids;
} StreamState;

/* Checks a stream state against this model (not yet against a batch
 * size). */
static gboolean
stream_state_parse (PsmModel *m, GBytes *state, StreamState *st, GError **error)
{
  gsize len = 0;
  const guint8 *p = g_bytes_get_data (state, &len);   /* NULL when empty */
  static const guint8 none[1];
  if (!p)
    p = none;
  const guint8 *end = p + len;
#define NEED(n) ((size_t) (end - p) >= (size_t) (n))
#define BAD_STATE(...)                                                                 \
  do {                                                                                 \
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, __VA_ARGS__);             \
    return FALSE;                                                                      \
  } while (0)
  guint32 version;
  if (!NEED (24) || memcmp (p, "PSMS", 4) != 0)
    BAD_STATE ("the checkpoint's training-stream state is malformed");
  memcpy (&version, p + 4, 4);
  memcpy (&st->cur, p + 8, 8);
  memcpy (&st->rows, p + 16, 4);
  memcpy (&st->k, p + 20, 4);
  p += 24;
  if (version != 1)
    BAD_STATE ("the checkpoint's training-stream state has version %u, this psm reads 1", version);
  if (st->rows < 0)
    BAD_STATE ("the checkpoint's training-stream state is malformed");
  if (st->k != m->carry_k)
    BAD_STATE ("the checkpoint carries %d floats of encoder state a stream, this model %d", st->k, m->carry_k);
  st->carry = (const float *) p;
  size_t nc = st->rows && st->k ? (size_t) st->rows * st->k : 0;
  if (!NEED (nc * sizeof (float) + 8))
    BAD_STATE ("the checkpoint's training-stream state is truncated");
  p += nc * sizeof (float);
  memcpy (&st->P, p, 4);
  memcpy (&st->H, p + 4, 4);
  p += 8;
  if (st->P != m->hist_p || (st->P && st->H != m->hist_h))
    BAD_STATE ("the checkpoint keeps a history of %d positions of %d floats, this model's head %d of %d", st->P,
               st->H, m->hist_p, m->hist_h);
  size_t nh = st->rows && st->P ? (size_t) st->P * st->rows : 0;
  st->hist = (const float *) p;
  st->ids = (const int32_t *) (p + nh * st->H * sizeof (float));
  if ((size_t) (end - p) != nh * st->H * sizeof (float) + nh * sizeof (int32_t))
    BAD_STATE ("the checkpoint's training-stream state is truncated or oversized");
#undef NEED
#undef BAD_STATE
  return TRUE;
}

gboolean
psm_model_restore_stream_state (PsmModel *m, GBytes *state, int B, GError **error)
{
  return psm_model_restore_stream_rows (m, state, B, 0, B, error);
}

gboolean
psm_model_restore_stream_rows (PsmModel *m, GBytes *state, int B, int lo, int n, GError **error)
{
  if (!m->streams) {
    if (state) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "the checkpoint holds the state of training streams, but task '%s' has none", m->task_name);
      return FALSE;
    }
    return TRUE;
  }
  if (!state) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint holds no state of the training streams (written by a psm before checkpoint "
                 "version 4?): resuming would restart task '%s' from its first segment", m->task_name);
    return FALSE;
  }
  g_return_val_if_fail (lo >= 0 && n > 0 && lo + n <= B, FALSE);
  StreamState st;
  if (!stream_state_parse (m, state, &st, error))
    return FALSE;
  if (st.rows != 0 && st.rows != B) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint's training streams are %d (train.batch then), the pipeline asks for %d: resume "
                 "with the same train.batch", st.rows, B);
    return FALSE;
  }
  gboolean (*seek) (void *, int, gint64, GError **) = PSM_CLASS_HOOK (m->tk, train_seek);
  if (st.cur >= 0 && !seek) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint records where task '%s' stood in its training data, but this build of it cannot "
                 "seek there (PsmTaskClass.train_seek)", m->task_name);
    return FALSE;
  }
  if (st.cur >= 0 && !seek (m->task, B, st.cur, error))
    return FALSE;
  /* everything checked: set this process's rows (as its first segment would) */
  int k = st.k, P = st.P, H = st.H;
  if (st.rows && k) {
    g_free (m->carry[0]);
    m->carry[0] = g_memdup2 (st.carry + (size_t) lo * k, (size_t) n * k * sizeof (float));
    m->carry_rows[0] = n;
  }
  if (st.rows && P) {
    g_free (m->hist[0]);
    g_free (m->hist_ids[0]);
    m->hist[0] = g_new (float, (size_t) P * n * H);
    m->hist_ids[0] = g_new (int32_t, (size_t) P * n);
    for (int q = 0; q < P; q++) {
      memcpy (m->hist[0] + (size_t) q * n * H, st.hist + ((size_t) q * B + lo) * H, (size_t) n * H * sizeof (float));
      memcpy (m->hist_ids[0] + (size_t) q * n, st.ids + (size_t) q * B + lo, (size_t) n * sizeof (int32_t));
    }
    m->hist_rows[0] = n;
  }
  return TRUE;
}

GBytes *
psm_model_stream_state_merge (PsmModel *m, GPtrArray *parts, GError **error)
{
  int np = (int) parts->len, rows = 0;
  StreamState *st = g_new (StreamState, np);
  for (int r = 0; r < np; r++) {
    if (!stream_state_parse (m, g_ptr_array_index (parts, r), &st[r], error)) {
      g_prefix_error (error, "MPI rank %d: ", r);
      g_free (st);
      return NULL;
    }
    rows += st[r].rows;
    if (st[r].cur != st[0].cur || (st[r].rows == 0) != (st[0].rows == 0)) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "the MPI ranks' training streams disagree (rank %d: cursor %" G_GINT64_FORMAT ", %d rows; rank 0: "
                   "cursor %" G_GINT64_FORMAT ", %d rows)", r, st[r].cur, st[r].rows, st[0].cur, st[0].rows);
      g_free (st);
      return NULL;
    }
  }
  gint32 k = st[0].k, P = st[0].P, H = st[0].H;
  guint32 version = 1;
  GByteArray *a = g_byte_array_new ();
  g_byte_array_append (a, (const guint8 *) "PSMS", 4);
  g_byte_array_append (a, (const guint8 *) &version, 4);
  g_byte_array_append (a, (const guint8 *) &st[0].cur, 8);
  g_byte_array_append (a, (const guint8 *) &rows, 4);
  g_byte_array_append (a, (const guint8 *) &k, 4);
  for (int r = 0; rows && k && r < np; r++)   /* [rows, k]: the ranks' rows one after another */
    g_byte_array_append (a, (const guint8 *) st[r].carry, (guint) ((size_t) st[r].rows * k * sizeof (float)));
  g_byte_array_append (a, (const guint8 *) &P, 4);
  g_byte_array_append (a, (const guint8 *) &H, 4);
  if (rows && P) {   /* [P, rows, H] and [P, rows]: position by position */
    for (int q = 0; q < P; q++)
      for (int r = 0; r < np; r++)
        g_byte_array_append (a, (const guint8 *) (st[r].hist + (size_t) q * st[r].rows * H),
                             (guint) ((size_t) st[r].rows * H * sizeof (float)));
    for (int q = 0; q < P; q++)
      for (int r = 0; r < np; r++)
        g_byte_array_append (a, (const guint8 *) (st[r].ids + (size_t) q * st[r].rows),
                             (guint) ((size_t) st[r].rows * sizeof (int32_t)));
  }
  g_free (st);
  return g_byte_array_free_to_bytes (a);
}

gboolean
psm_model_save_task (PsmModel *m, const char *dir, GError **error)
{
  gboolean (*save) (void *, const char *, GError **) = PSM_CLASS_HOOK (m->tk, save);
  return !save || save (m->task, dir, error);
}

/* Embeds the source and runs the encoder (and the decoder's prepare). */
static void
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
  if (attn_training) {   /* batch-major copies (psm-private.h) */
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
static void
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

typedef PsmTensor *(*InputEmbedFn) (void *, PsmGraph *, PsmParams *, const PsmEncoding *, const PsmBatch *,
                                    const int32_t *, const int32_t *, int, PsmTensor *);

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
  encode (m, g, b, &enc);
  psm_graph_phase (g, PSM_PHASE_DECODER);
  if (m->dk)
    decode_forced (m, g, b, &enc, &out);
  else
    summary_step (m, g, b, &enc, &out);
  psm_graph_phase (g, PSM_PHASE_HEAD);
  PsmTensor *loss = m->hk->loss (m->head, g, m->params, &enc, &out, b);
  psm_graph_set_rng (g, NULL);
  if (m->hist_p)
    history_push (m, b, &enc);
  psm_graph_phase (g, PSM_PHASE_OTHER);
  return loss;
}

/* ---- decoding ---- */

/* One decoding: the beam search's scorer (dec_step) and what a step records
 * for the JSON output (p_gen and the top attention positions of every row).
 * The scorer computes only the rows the search asks for: at the first step
 * one row an article, then the beams of the articles still searching. Rows
 * are numbered as the search numbers them (article b's rows [b K,
 * (b + 1) K), n = B K); the rows computed at a step ("built": per rows of
 * each article in built[0..n_built)) have the source side laid out for
 * them (build_rows). */
typedef struct {
  PsmModel *m;
  const PsmBatch *orig;
  PsmEncoding enc;          /* the encoder's output, one row an article */
  PsmBatch bx;              /* the source side for all n rows (slot_token) */
  PsmEncoding ex;           /* the source side for the built rows */
  PsmBatch bb;              /* (both in the graph of the encoding) */
  PsmTensor *c_memo, *c_ann;   /* their compact copies (one row an article), or NULL */
  int *built, n_built, per;
  float *carry;             /* [n, carry_k] between steps, by the search's rows */
  int carry_k, n, K;
  gboolean record;
  GArray *gate;             /* float [steps * n] */
  GArray *top;              /* int32 [steps * n * attn_top] positions */
  GArray *attn;             /* float [steps * n * T] attention (JSON output), or NULL */
  gint64 t_enc, t_dec, t_head, t_all;   /* µs: encoder, decoder steps, head, all */
  const PsmEvalOptions *opt;   /* its cancelled hook, asked at every step */
} Dec;

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
static gboolean
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

static void
json_string (GString *s, const char *w)
{
  g_string_append_c (s, '"');
  for (const char *c = w; *c; c++) {
    if (*c == '"' || *c == '\\')
      g_string_append_printf (s, "\\%c", *c);
    else if (*c == '\n')
      g_string_append (s, "\\n");
    else if ((unsigned char) *c < 0x20)
      g_string_append_printf (s, "\\u%04x", *c);
    else
      g_string_append_c (s, *c);
  }
  g_string_append_c (s, '"');
}

/* Sequence outputs of one batch: decode, score, write. */
/* words joined by spaces into s (returned) */
static const char *
join_words (GString *s, const char *const *w, int n)
{
  g_string_truncate (s, 0);
  for (int i = 0; i < n; i++)
    g_string_append_printf (s, "%s%s", i ? " " : "", w[i]);
  return s->str;
}

/* A float list: %.4g, null where not finite */
static void
json_floats (GString *s, const float *v, int n, int stride)
{
  g_string_append_c (s, '[');
  for (int i = 0; i < n; i++) {
    float x = v[(size_t) i * stride];
    g_string_append (s, i ? ", " : "");
    if (isfinite (x))
      g_string_append_printf (s, "%.4g", x);
    else
      g_string_append (s, "null");
  }
  g_string_append_c (s, ']');
}

/* One example's decoding as a JSON line (--json; read by psm-run view):
 * the output tokens, whether each was copied (a slot past the head's
 * vocabulary: a source position or an article's own OOV word), the head's
 * gate per token (p_gen, the pointer softmax's shortlist probability, the
 * copy head's generation probability), the top attention positions and
 * every attention weight >= 0.005 as [position, weight] pairs, the source
 * tokens (the model's view: truncated, ids mapped back to words), the
 * coverage (attention summed over the output), the encoder's per-token
 * importance where it has one, and the reference. */
static void
json_record (PsmModel *m, const PsmBatch *b, int bi, const PsmHyp *h, const Dec *d, const char *const *words,
             const char *ref, GString *line)
{
  int steps = d->n ? (int) (d->gate->len / d->n) : 0, T = b->T, vocab = PSM_BATCH_VOCAB (&d->bx, m->info.tgt_vocab);
  int *src_pos = g_new (int, T + 1);   /* batch position -> index among the real source tokens */
  int n_src = 0;
  for (int t = 0; t < T; t++)
    src_pos[t] = PSM_AT (b->src_mask, b, t, bi) != 0.0f ? n_src++ : -1;
  g_string_truncate (line, 0);
  g_string_append_printf (line, "{\"example\": %d, \"head\": ", b->example_id ? b->example_id[bi] : bi);
  json_string (line, m->head_name);
  g_string_append_printf (line, ", \"score\": %.6g, \"tokens\": [", h->score);
  for (int i = 0; i < h->len; i++) {
    g_string_append (line, i ? ", " : "");
    json_string (line, words[i]);
  }
  g_string_append (line, "], \"copied\": [");
  for (int i = 0; i < h->len; i++)
    g_string_append (line, h->slots[i] >= vocab ? (i ? ", true" : "true") : (i ? ", false" : "false"));
  g_string_append (line, "], \"p_gen\": ");
  float *gate = g_new (float, h->len + 1);
  for (int i = 0; i < h->len; i++)
    gate[i] = i < steps ? g_array_index (d->gate, float, (size_t) i * d->n + h->rows[i]) : NAN;
  json_floats (line, gate, h->len, 1);
  g_free (gate);
  g_string_append (line, ", \"attention\": [");
  for (int i = 0; i < h->len && m->attn_top > 0; i++) {
    g_string_append (line, i ? ", [" : "[");
    const int32_t *tp = (const int32_t *) d->top->data + ((size_t) i * d->n + h->rows[i]) * m->attn_top;
    for (int j = 0; j < m->attn_top && tp[j] >= 0; j++)
      g_string_append_printf (line, j ? ", %d" : "%d", src_pos[tp[j]] >= 0 ? src_pos[tp[j]] : tp[j]);
    g_string_append_c (line, ']');
  }
  g_string_append (line, "]");
  float *cov = g_new0 (float, n_src + 1);
  if (d->attn && d->attn->len >= (size_t) steps * d->n * T) {
    g_string_append (line, ", \"attention_weights\": [");
    for (int i = 0; i < h->len && i < steps; i++) {
      const float *a = (const float *) d->attn->data + ((size_t) i * d->n + h->rows[i]) * T;
      g_string_append (line, i ? ", [" : "[");
      for (int t = 0, k = 0; t < T; t++) {
        if (src_pos[t] < 0)
          continue;
        cov[src_pos[t]] += a[t];
        if (a[t] >= 0.005f)
          g_string_append_printf (line, "%s[%d, %.3g]", k++ ? ", " : "", src_pos[t], a[t]);
      }
      g_string_append_c (line, ']');
    }
    g_string_append (line, "], \"coverage\": ");
    json_floats (line, cov, n_src, 1);
  }
  g_free (cov);
  g_string_append (line, ", \"source\": [");
  for (int t = 0, k = 0; t < T; t++)
    if (src_pos[t] >= 0) {
      g_string_append (line, k++ ? ", " : "");
      json_string (line, m->tk->token_text (m->task, b, bi, PSM_AT (b->src_ext, b, t, bi)));
    }
  g_string_append (line, "]");
  PsmTensor *imp = d->enc.importance;
  if (imp && imp->ndim == 3 && imp->shape[0] == b->T && imp->shape[1] == b->B) {
    /* the encoder's per-token weights, each the mean over its units */
    int D = imp->shape[2];
    g_string_append (line, ", \"importance\": [");
    for (int t = 0, k = 0; t < b->T; t++)
      if (src_pos[t] >= 0) {
        const float *v = imp->data + ((size_t) t * b->B + bi) * D;
        double sum = 0.0;
        for (int j = 0; j < D; j++)
          sum += v[j];
        g_string_append_printf (line, "%s%.4g", k++ ? ", " : "", sum / D);
      }
    g_string_append (line, "]");
  }
  if (ref) {
    g_string_append (line, ", \"reference\": ");
    json_string (line, ref);
  }
  g_string_append (line, "}");
  g_free (src_pos);
}

/* One decoded example's inputs to the metrics, kept to be scored in the
 * split's order (ROUGE's bootstrap numbers the summaries in it): copies of
 * what the batch owns; a text the task's example_text gives is NULL here
 * and asked for again. */
typedef struct {
  gboolean set;
  int hn, rn;
  int32_t *hid, *rid;
  char **hw, **rw;
  char *hyp, *ref, *src;
} ScoreRec;

/* Decoding in order of source length (decode.sort): each output line goes
 * to a scratch file as it comes, and each example's metric inputs to a
 * ScoreRec; the metrics get them and the lines are copied out in the
 * split's order at the end. Without it, lines go straight to their file.
 * Output k is 0 the hypotheses, 1 the references, 2 the JSON records. */
typedef struct {
  FILE *tmp;                /* NULL: no output files */
  gint64 *off;              /* [n, 3]: where example e's line k starts; -1: none */
  int *len;
  ScoreRec *score;          /* [n] */
  long n;
} Reorder;

static const int OUT_HYP = 0, OUT_REF = 1, OUT_JSON = 2;

static void
emit_line (Reorder *r, int k, int ex, FILE *f, const GString *line)
{
  if (!r) {
    fprintf (f, "%s\n", line->str);
    return;
  }
  r->off[(size_t) ex * 3 + k] = ftello (r->tmp);
  r->len[(size_t) ex * 3 + k] = (int) line->len;
  fwrite (line->str, 1, line->len, r->tmp);
}

static char **
strv_of (const PsmSeq *q)
{
  char **v = g_new (char *, q->len + 1);
  for (int i = 0; i < q->len; i++)
    v[i] = g_strdup (q->words[i]);
  v[q->len] = NULL;
  return v;
}

static void
keep_scores (Reorder *r, int ex, const PsmSeq *hs, const PsmSeq *rs, const char *hyp, const char *ref,
             const char *src)
{
  ScoreRec *c = &r->score[ex];
  c->set = TRUE;
  c->hn = hs->len;
  c->rn = rs->len;
  c->hid = g_memdup2 (hs->ids, (gsize) hs->len * sizeof (int32_t));
  c->rid = g_memdup2 (rs->ids, (gsize) rs->len * sizeof (int32_t));
  c->hw = strv_of (hs);
  c->rw = strv_of (rs);
  c->hyp = g_strdup (hyp);
  c->ref = g_strdup (ref);
  c->src = g_strdup (src);
}

static void
add_metrics (PsmModel *m, const PsmSeq *hs, const PsmSeq *rs, const char *hyp, const char *ref, const char *src)
{
  for (int i = 0; i < m->n_metrics; i++) {
    void (*add_text) (void *, const char *, const char *, const char *) = PSM_CLASS_HOOK (m->mk[i], add_text);
    if (add_text)
      add_text (m->metric[i], hyp, ref, src);
    else if (m->mk[i]->add)
      m->mk[i]->add (m->metric[i], hs, rs);
  }
}

/* The kept examples to the metrics, in the split's order. */
static void
reorder_score (PsmModel *m, PsmSplit split, Reorder *r)
{
  void (*example_text) (void *, PsmSplit, int, const char **, const char **) = PSM_CLASS_HOOK (m->tk, example_text);
  for (long e = 0; e < r->n; e++) {
    ScoreRec *c = &r->score[e];
    if (!c->set)
      continue;
    const char *src = c->src, *ref = c->ref, *tsrc = NULL, *tref = NULL;
    if (c->hyp && (!src || !ref) && example_text)
      example_text (m->task, split, (int) e, &tsrc, &tref);
    PsmSeq hs = { c->hn, c->hid, (const char *const *) c->hw }, rs = { c->rn, c->rid, (const char *const *) c->rw };
    add_metrics (m, &hs, &rs, c->hyp, ref ? ref : tref, src ? src : tsrc);
  }
}

/* The scratch file: in TMPDIR, unlinked at once. */
static Reorder *
reorder_new (long n, gboolean files, GError **error)
{
  FILE *tmp = NULL;
  if (files) {
    char *path = NULL;
    GError *e = NULL;
    int fd = g_file_open_tmp ("psm-decode-XXXXXX", &path, &e);
    if (fd >= 0) {
      g_unlink (path);
      tmp = fdopen (fd, "w+b");
      if (!tmp)
        g_set_error (&e, G_FILE_ERROR, g_file_error_from_errno (errno), "%s", g_strerror (errno));
    }
    g_free (path);
    if (!tmp) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "decoding in length order: cannot create a scratch file (%s); decode.sort = false decodes in the "
                   "split's order without one", e->message);
      g_error_free (e);
      if (fd >= 0)
        close (fd);
      return NULL;
    }
  }
  Reorder *r = g_new0 (Reorder, 1);
  r->tmp = tmp;
  r->n = n;
  r->off = g_new (gint64, (size_t) n * 3);
  r->len = g_new0 (int, (size_t) n * 3);
  r->score = g_new0 (ScoreRec, n);
  for (size_t i = 0; i < (size_t) n * 3; i++)
    r->off[i] = -1;
  return r;
}

/* The lines of each output in the split's order. */
static gboolean
reorder_write (Reorder *r, const PsmEvalOptions *opt, GError **error)
{
  if (!r->tmp)
    return TRUE;
  FILE *outs[3] = { opt->out, opt->ref, opt->json };
  GString *buf = g_string_new (NULL);
  gboolean ok = fflush (r->tmp) == 0;
  for (int k = 0; ok && k < 3; k++)
    for (long e = 0; ok && outs[k] && e < r->n; e++) {
      gint64 off = r->off[(size_t) e * 3 + k];
      if (off < 0)
        continue;
      g_string_set_size (buf, (gsize) r->len[(size_t) e * 3 + k]);
      ok = fseeko (r->tmp, off, SEEK_SET) == 0 && fread (buf->str, 1, buf->len, r->tmp) == buf->len;
      if (ok) {
        fwrite (buf->str, 1, buf->len, outs[k]);
        fputc ('\n', outs[k]);
      }
    }
  if (!ok)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "decoding in length order: cannot read back its scratch "
                 "file (%s)", ferror (r->tmp) ? g_strerror (errno) : "short read");
  g_string_free (buf, TRUE);
  return ok;
}

static void
reorder_free (Reorder *r)
{
  if (!r)
    return;
  if (r->tmp)
    fclose (r->tmp);
  for (long e = 0; e < r->n; e++) {
    ScoreRec *c = &r->score[e];
    g_free (c->hid);
    g_free (c->rid);
    g_strfreev (c->hw);
    g_strfreev (c->rw);
    g_free (c->hyp);
    g_free (c->ref);
    g_free (c->src);
  }
  g_free (r->score);
  g_free (r->off);
  g_free (r->len);
  g_free (r);
}

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
      fprintf (stderr, "\rdecoded %d/%d  %.2f articles/s   ", start + B, n,
               (start + B) / MAX (g_timer_elapsed (timer, NULL), 1e-9));
  }
  if (opt->progress)
    fprintf (stderr, "\n");
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
    encode (m, g, b, &enc);
    if (m->dk)
      decode_forced (m, g, b, &enc, &out);
    else
      summary_step (m, g, b, &enc, &out);
    PsmTensor *loss = m->hk->loss (m->head, g, m->params, &enc, &out, b);
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
        fprintf (stderr, "\rdecoded %ld/%ld  %.2f articles/s   ", start + B, n, (start + B) / MAX (t, 1e-9));
      }
    }
    res->n_examples += b->B;
  }
  if (m->dk && score && opt && opt->progress)
    fprintf (stderr, "\n");
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
  if (!ok)
    return FALSE;
  if (split_ranks || split_streams) {
    double sums[3] = { loss_sum, weight, split_ranks ? (double) res->n_examples : 0.0 };
    psm_dist_sum_double (sums, 3);
    loss_sum = sums[0];
    weight = sums[1];
    if (split_ranks)
      res->n_examples = (long) sums[2];
  }
  res->loss = weight > 0 ? loss_sum / weight : 0.0;
  res->mean_gate = gate_n ? gate_sum / gate_n : NAN;
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
