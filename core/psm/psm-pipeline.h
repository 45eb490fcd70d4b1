/* psm-pipeline.h — pipeline files, model assembly, training and evaluation.
 * Used by psm-run; a program embedding psm can drive runs the same way. */
#ifndef PSM_PIPELINE_H
#define PSM_PIPELINE_H
#include "psm.h"
#include "psm-error.h"
G_BEGIN_DECLS

typedef struct PsmPipeline PsmPipeline;

/* Parses FILE, applies the --set assignments (NULL-terminated, may be NULL),
 * resolves every plugin and validates every section against its table.
 * Errors are PSM_CONFIG_ERROR (all problems, one per line) or
 * PSM_PLUGIN_ERROR; both are usage/config errors (exit 2). */
PsmPipeline *psm_pipeline_load (const char *file, const char *const *sets, GError **error);
void psm_pipeline_free (PsmPipeline *pl);
const char *psm_pipeline_file (const PsmPipeline *pl);
/* A second training phase (continue.steps > 0; e.g. See et al.'s coverage
 * phase): psm_pipeline_continued loads the same file with the same --set
 * assignments, then continue.set, train.steps raised by continue.steps and
 * the same run folder. NULL without error when pl has none (and for the
 * second phase itself). */
gboolean psm_pipeline_has_continue (const PsmPipeline *pl);
PsmPipeline *psm_pipeline_continued (const PsmPipeline *pl, GError **error);
/* Notes about the pipeline as read (i-th, or NULL past the end): settings
 * dropped because --set swapped a plugin that does not declare them. */
const char *psm_pipeline_note (const PsmPipeline *pl, guint i);
/* A core or plugin section by path: "task", "model.embedding",
 * "model.encoder", "model.decoder", "model.head", "train",
 * "train.optimizer", "eval", "decode", "run". NULL if the pipeline has no
 * such component (no decoder). Owned by pl. */
const PsmSection *psm_pipeline_section (const PsmPipeline *pl, const char *path);
const PsmPlugin *psm_pipeline_plugin (const PsmPipeline *pl, const char *path);
int psm_pipeline_n_metrics (const PsmPipeline *pl);
const PsmPlugin *psm_pipeline_metric (const PsmPipeline *pl, int i, const PsmSection **section);
/* The run folder (run.dir, default runs/<pipeline name>). */
const char *psm_pipeline_run_dir (const PsmPipeline *pl);
/* Models built from pl only evaluate or decode (psm-run --mode eval and
 * decode): the task is told it may leave the training split unread
 * (PsmTaskCtx.eval_only). Carried into the second phase. Default FALSE. */
void psm_pipeline_set_eval_only (PsmPipeline *pl, gboolean eval_only);
gboolean psm_pipeline_eval_only (const PsmPipeline *pl);
/* Models built from pl only decode raw text (psm-run --mode decode --input,
 * psm-run serve): the task is told it may leave every split unread
 * (PsmTaskCtx.text_only). Implies eval_only. Carried into the second phase.
 * Default FALSE. */
void psm_pipeline_set_text_only (PsmPipeline *pl, gboolean text_only);
gboolean psm_pipeline_text_only (const PsmPipeline *pl);
/* Writes the pipeline with overrides applied. */
gboolean psm_pipeline_write (const PsmPipeline *pl, const char *path, GError **error);

/* Core sections and their tables, for --list and the man page. */
typedef struct {
  const char *path;
  const char *doc;
  const PsmParamSpec *spec;
} PsmCoreSection;
const PsmCoreSection *psm_core_sections (void);   /* ends with path == NULL */

/* ---- model ---- */
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

/* ---- runs ---- */
typedef struct {
  gboolean resume;
  gboolean quiet;
  int progress;            /* 1: live line (terminal), 0: log lines */
  gboolean profile;        /* time every op by phase; print the table at the end */
  long stop_after;         /* write last.ckpt and stop after this many updates (0: never) */
  /* set by psm_train: why it stopped before train.steps (0: it did not;
   * SIGINT or SIGTERM; -1: stop_after), and the updates it made */
  int stopped;
  long trained;
} PsmTrainOptions;

/* ---- data parallelism over MPI (core/psm-dist.c) ---- */
/* Joins the MPI job when the process was started by mpirun (or another
 * launcher that says so in the environment); otherwise one rank of one.
 * Without MPI support, refuses a start as one of several ranks. */
gboolean psm_dist_init (int *argc, char ***argv, GError **error);
int psm_dist_rank (void);
int psm_dist_size (void);
void psm_dist_finalize (void);
/* Ends every rank of the job with code (one rank's error must not leave
 * the others waiting in a collective); returns only on one rank. */
void psm_dist_abort (int code);

/* ABI 1.20: what the library reports while it runs goes to one function,
 * which the program sets (psm-run prints results to standard output and
 * the rest to standard error); the library itself prints nothing. Kinds: a
 * result or a step of the run (a line, with its newline); a note or
 * warning; a live progress line, which the next one replaces; the end of
 * the live line. Until psm_set_output is called (or after a call with NULL)
 * results and progress go nowhere and notes to standard error. */
typedef enum { PSM_OUT_RESULT, PSM_OUT_NOTE, PSM_OUT_PROGRESS, PSM_OUT_PROGRESS_END } PsmOutKind;
typedef void (*PsmOutFn) (PsmOutKind kind, const char *text, void *user_data);
void psm_set_output (PsmOutFn fn, void *user_data);


/* Trains as train.* says, validating every train.eval_every steps and keeping
 * DIR/best.ckpt; DIR/last.ckpt holds the latest state (for --resume): at
 * step 0, at each validation, every train.checkpoint_every updates, and
 * when SIGINT/SIGTERM or opt->stop_after stops the run (opt->stopped says
 * which). A non-finite loss or gradient stops, skips the update or rolls
 * back to last.ckpt as train.on_nonfinite says. With opt->resume it
 * continues last.ckpt bit for bit, after removing what a killed process
 * left in DIR (temporary files, log records past the checkpoint). */
gboolean psm_train (PsmModel *m, PsmTrainOptions *opt, GError **error);
/* Loads DIR/best.ckpt (else last.ckpt) and evaluates split; prints metrics. */
/* write_decodes: DIR/decode.SPLIT.txt (and, with a decoder, the references
 * in DIR/reference.SPLIT.txt and, with json, DIR/decode.SPLIT.jsonl). */
gboolean psm_run_eval (PsmModel *m, PsmSplit split, gboolean write_decodes, gboolean json, GError **error);
/* Loads the best checkpoint and decodes raw texts, one article a line of
 * input ("-": standard input), to standard output: one summary a line, or
 * with json one JSON record a line (tokens, p_gen, top attention). */
gboolean psm_run_decode_input (PsmModel *m, const char *input, gboolean json, GError **error);
/* Loads the run folder's best checkpoint (else its last) into m: its path
 * (g_free it), and the update it was written at in *step (may be NULL). */
char *psm_run_load_best (PsmModel *m, long *step, GError **error);
/* psm-run --check: build, a few steps on tiny data, decode, checkpoint
 * round-trip. Prints one line per stage. */
gboolean psm_run_check (PsmModel *m, GError **error);

/* The same for a pipeline with a second phase (continue.*): *pl and *m
 * become the second phase's. psm_train_phases trains phase one, keeps its
 * last state as DIR/phase1.ckpt (its best as DIR/phase1.best.ckpt), then
 * continues from it; with opt->resume it picks up in whichever phase the
 * run folder stopped. psm_run_select_phase switches to the second phase
 * when the run folder has reached it (for eval and decode), before the
 * model is built, so that it is built once, for the right phase.
 * psm_run_check_phases checks both phases. */
gboolean psm_train_phases (PsmPipeline **pl, PsmModel **m, PsmTrainOptions *opt, GError **error);
gboolean psm_run_select_phase (PsmPipeline **pl, GError **error);
gboolean psm_run_check_phases (PsmPipeline **pl, PsmModel **m, GError **error);

/* psm-run score: the text metrics named (NULL-terminated) over line-aligned
 * files — summaries, references (refs, NULL-terminated: one file, or
 * several of alternative references for metrics that take them,
 * PsmMetricClass.multi_reference) and optionally sources ("-": standard
 * input), one example a line, sentences separated by the token sep (NULL:
 * none) — printing one line of scores per metric. sets: "METRIC.key=value"
 * settings of the metrics. */
gboolean psm_score_files (const char *const *metrics, const char *const *sets, const char *hyp,
                          const char *const *refs, const char *src, const char *sep, GError **error);

G_END_DECLS
#endif
