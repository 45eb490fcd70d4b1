/* model-internal.h — the model layer (core/model/): what the run layer
 * calls beyond the public API, the beam search, and what the files of the
 * model share (its struct, the decoding scorer's state, the reordered
 * outputs, the functions one file defines and another calls). */
#ifndef PSM_MODEL_INTERNAL_H
#define PSM_MODEL_INTERNAL_H
#include "ops/ops-internal.h"
#include "config/config-internal.h"

/* The beam search (psm-decode.c): psm_beam_rows counts the rows asked of
 * the scorer; x <= psm_beam_score_floor (last, logp) implies logp + x <=
 * last (the floor of psm_paths.beam_floor). */
extern long psm_beam_rows;
float psm_beam_score_floor (double last, double logp);

/* What the run layer calls beyond the public API. */
PsmGraph *psm_model_graph (PsmModel *m);
PsmBatch *psm_model_batch (PsmModel *m);
PsmPipeline *psm_model_pipeline (PsmModel *m);
/* The task's next training batch of B into psm_model_batch (m), validated. */
gboolean psm_model_train_batch (PsmModel *m, int B, PsmRng *rng, GError **error);
/* --check: every loss of the batch starts from the same state (no carried
 * state or history) and draws no dropout, so its steps' losses compare. */
void psm_model_check_mode (PsmModel *m);
/* TRUE: every teacher-forced decoder step runs on all of the batch's rows,
 * in the task's order (the tests' reference for PSM_DECODER_LIVE_ROWS). */
void psm_model_set_all_rows (PsmModel *m, gboolean all);
gboolean psm_model_streams (PsmModel *m);   /* a language model over streams */
/* Keeps rank's share of the model's batch: psm_batch_take_streams for a
 * language model over streams, else psm_batch_take_share; returns it. */
double psm_model_take_share (PsmModel *m, int rank, int n);
/* The task's save() into a new run folder (no-op without the hook). */
gboolean psm_model_save_task (PsmModel *m, const char *dir, GError **error);
/* Stream tasks: what --resume needs beyond parameters and optimiser (the
 * task's cursor, the carried encoder state, the head's history; NULL for
 * other tasks). Restoring checks it against this model and batches of B,
 * then seeks the task; on error nothing is changed. */
GBytes *psm_model_stream_state (PsmModel *m);
gboolean psm_model_restore_stream_state (PsmModel *m, GBytes *state, int B, GError **error);
/* Over MPI ranks, each holding streams [lo, lo + n) of B: restoring takes
 * those rows of a whole state; merging puts the ranks' states (in rank
 * order, as psm_dist_gather_bytes gives them) back into one of all B. */
gboolean psm_model_restore_stream_rows (PsmModel *m, GBytes *state, int B, int lo, int n, GError **error);
GBytes *psm_model_stream_state_merge (PsmModel *m, GPtrArray *parts, GError **error);

/* Beam search over any scorer (psm-decode.c; greedy is beam 1). */
typedef struct {
  int beam;               /* hypotheses kept per article */
  int min_len, max_len;   /* tokens, the end token counted */
  int block_ngram;        /* never repeat an n-gram of words (0 = off) */
  double length_penalty;  /* rank by logp / len^alpha (1: mean, 0: sum) */
  int32_t eos;            /* slot that ends a hypothesis */
  int32_t unk;            /* word id of the unknown word, or -1 */
  gboolean no_unk;        /* never emit it */
} PsmBeamConfig;

typedef struct {
  /* n = B * beam rows, article b owning rows [b beam, (b + 1) beam); row r
   * continues row parents[r] of the previous step (NULL at the first)
   * after emitting slot tokens[r] (-1: nothing yet, or a dead row). The
   * rows wanted are [b beam, b beam + per) of the articles act[0..n_act)
   * (ascending) that are still searching: per is 1 at the first step,
   * where only row b beam is live, and beam after. Returns log-scores of
   * *S columns whose row base[b] + k is row b beam + k, for the rows
   * wanted (base[0..B) is the scorer's to set; it may score more rows than
   * asked), valid until the next call; NULL with error set stops the
   * search. A parent is always a row wanted at the previous step. */
  const float *(*step) (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act,
                        int n_act, int per, int *base, int *S, GError **error);
  /* The word a slot of row stands for (n-gram blocking, no_unk); NULL: the slot. */
  int32_t (*word) (void *ud, int row, int32_t slot);
  void *ud;
} PsmBeamFns;

/* A result: the emitted slots (without the end token) and, for each, the
 * row of the step that scored it. */
typedef struct {
  int len;
  int32_t *slots, *rows;
  double logp, score;
} PsmHyp;

/* Fills out[0..B) (psm_hyp_clear each after use; zero them before). */
gboolean psm_beam_search (const PsmBeamConfig *cfg, int B, const PsmBeamFns *f, PsmHyp *out, GError **error);
void psm_hyp_clear (PsmHyp *h);
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

typedef PsmTensor *(*InputEmbedFn) (void *, PsmGraph *, PsmParams *, const PsmEncoding *, const PsmBatch *,
                                    const int32_t *, const int32_t *, int, PsmTensor *);

/* One decoding: the beam search's scorer (dec_step) and what a step records
 * for the JSON output (p_gen, the top attention positions of every row).
 * The scorer computes only the rows the search asks for (one an article at
 * the first step, then the beams of the articles still searching), numbered
 * as the search numbers them (article b's rows [b K, (b + 1) K), n = B K);
 * the built rows have the source side laid out for them (build_rows). */
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

/* Outputs in the split's order when decoding runs in another
 * (psm-model-output.c). */
typedef struct Reorder Reorder;

enum { OUT_HYP = 0, OUT_REF = 1, OUT_JSON = 2 };

/* psm-model-forward.c: the encoder; the one forward pass to the loss */
G_GNUC_INTERNAL void encode (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc);
G_GNUC_INTERNAL PsmTensor *forward_loss (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc,
                                         PsmDecOut *out);
G_GNUC_INTERNAL void history_push (PsmModel *m, const PsmBatch *b, const PsmEncoding *enc);

/* psm-model-decode.c */
G_GNUC_INTERNAL gboolean decode_batch (PsmModel *m, const PsmBatch *b, Dec *d, PsmHyp *hyps, GError **error);

/* psm-model-output.c */
G_GNUC_INTERNAL void add_metrics (PsmModel *m, const PsmSeq *hs, const PsmSeq *rs, const char *hyp, const char *ref,
                                  const char *src);
G_GNUC_INTERNAL void emit_line (Reorder *r, int k, int ex, FILE *f, const GString *line);
G_GNUC_INTERNAL const char *join_words (GString *s, const char *const *w, int n);
G_GNUC_INTERNAL void json_record (PsmModel *m, const PsmBatch *b, int bi, const PsmHyp *h, const Dec *d,
                                  const char *const *words, const char *ref, GString *line);
G_GNUC_INTERNAL void keep_scores (Reorder *r, int ex, const PsmSeq *hs, const PsmSeq *rs, const char *hyp,
                                  const char *ref, const char *src);
G_GNUC_INTERNAL void reorder_free (Reorder *r);
G_GNUC_INTERNAL Reorder *reorder_new (long n, gboolean files, GError **error);
G_GNUC_INTERNAL void reorder_score (PsmModel *m, PsmSplit split, Reorder *r);
G_GNUC_INTERNAL gboolean reorder_write (Reorder *r, const PsmEvalOptions *opt, GError **error);

#endif
