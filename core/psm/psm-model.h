/* psm-model.h — a model assembled from a pipeline: its loss, its
 * evaluation and decoding of a split or of raw texts, the beam search's
 * settings (part of psm-pipeline.h's API, ABI 1.20) */
#ifndef PSM_MODEL_H
#define PSM_MODEL_H
#include "psm.h"
G_BEGIN_DECLS

typedef struct PsmPipeline PsmPipeline;

typedef struct PsmModel PsmModel;

/* Builds task, components and parameters (initialised from train.seed).
 * check: the task keeps every split tiny (psm-run --check). */
PsmModel *psm_model_new (PsmPipeline *pl, gboolean check, GError **error);
void psm_model_free (PsmModel *m);
PsmParams *psm_model_params (PsmModel *m);
void *psm_model_task (PsmModel *m, const PsmTaskClass **klass);
/* Mean training loss of a batch on g (records the tape when g has grads). */
PsmTensor *psm_model_loss (PsmModel *m, PsmGraph *g, const PsmBatch *batch);

typedef struct {
  double loss;             /* mean per target step */
  long n_examples;
  PsmMetricReport metrics[8];
  const char *metric_names[8];
  int n_metrics;
  double primary;          /* first value of the first metric, else loss */
  gboolean higher_is_better;
  double mean_gate;        /* mean p_gen of the decoded tokens (NaN: none) */
  double decode_seconds;   /* wall time of the evaluation */
  /* decoding alone (seconds): the encoder (with the beams' copies), the
   * decoder steps (incl. the input embeddings), the head's scores, and
   * the beam search's own work */
  double decode_phases[4];
  /* decoding: the share of the batches' source positions that are padding
   * (decode.sort makes it small) */
  double decode_padding;
} PsmEvalResult;

typedef struct {
  long max_examples;       /* <= 0: the whole split */
  /* Pipelines with a decoder: decode (decode.* settings) and feed the
   * metrics; FALSE: the loss only, which is then the primary value.
   * Without a decoder the one-step prediction is always scored. */
  gboolean decode;
  FILE *out;               /* hypotheses: "hypothesis<TAB>reference" lines
                              without a decoder, one decoded text a line with */
  FILE *ref;               /* decoder pipelines: the references, one a line */
  FILE *json;              /* decoder pipelines: one JSON line per output
                              (tokens, p_gen, top attention positions) */
  gboolean progress;       /* articles/s on stderr while decoding */
  /* Decoding: asked before every step of the beam search; TRUE stops the
   * decoding with G_IO_ERROR_CANCELLED (psm-run serve: every client of
   * the batch has hung up). NULL: never. */
  gboolean (*cancelled) (void *data);
  void *cancel_data;
} PsmEvalOptions;

/* Evaluates a split as opt says (NULL: everything scored, nothing written). */
gboolean psm_model_evaluate (PsmModel *m, PsmSplit split, const PsmEvalOptions *opt,
                             PsmEvalResult *res, GError **error);
/* Decodes n raw source texts (the task's text_batch prepares them as its
 * training data), writing summaries to opt->out and per-token records to
 * opt->json (either may be NULL). */
gboolean psm_model_decode_texts (PsmModel *m, const char *const *texts, int n, const PsmEvalOptions *opt,
                                 GError **error);
/* Whether the pipeline has a decoder cell (sequence outputs). */
gboolean psm_model_has_decoder (PsmModel *m);
/* The beam search's settings (decode.beam, min_len, max_len), which a
 * caller may change between decodings (psm-run serve: per request). Set
 * checks them as the pipeline reader does (beam 1..256, lengths 0..4096 and
 * 1..4096, min_len <= max_len); an error names the setting. */
typedef struct {
  int beam, min_len, max_len;
} PsmDecodeSettings;
void psm_model_get_decode (PsmModel *m, PsmDecodeSettings *s);
gboolean psm_model_set_decode (PsmModel *m, const PsmDecodeSettings *s, GError **error);

G_END_DECLS
#endif
