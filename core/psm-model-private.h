/* psm-model-private.h — what the files of core/psm-model*.c share: the
 * model's struct, the decoding scorer's state, the reordered outputs and
 * the functions one file defines and another calls. Nothing outside
 * core/psm-model*.c includes it. */
#ifndef PSM_MODEL_PRIVATE_H
#define PSM_MODEL_PRIVATE_H
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


typedef PsmTensor *(*InputEmbedFn) (void *, PsmGraph *, PsmParams *, const PsmEncoding *, const PsmBatch *,
                                    const int32_t *, const int32_t *, int, PsmTensor *);

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

enum { OUT_HYP = 0, OUT_REF = 1, OUT_JSON = 2 };

/* psm-model-forward.c */
G_GNUC_INTERNAL void decode_forced (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc,
                                    PsmDecOut *out);
G_GNUC_INTERNAL void encode (PsmModel *m, PsmGraph *g, const PsmBatch *b, PsmEncoding *enc);
G_GNUC_INTERNAL void history_push (PsmModel *m, const PsmBatch *b, const PsmEncoding *enc);
G_GNUC_INTERNAL void summary_step (PsmModel *m, PsmGraph *g, const PsmBatch *b, const PsmEncoding *enc,
                                   PsmDecOut *out);

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
