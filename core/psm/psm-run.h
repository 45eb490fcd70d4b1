/* psm-run.h — runs in a run folder: training (one or two phases),
 * evaluation, decoding, the --check smoke run (part of psm-pipeline.h's
 * API, ABI 1.21) */
#ifndef PSM_RUN_H
#define PSM_RUN_H
#include "psm-model.h"
G_BEGIN_DECLS

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
  /* set by psm_train_phases for the progress line: which phase of a
   * two-phase pipeline this is (1 or 2; 0: a one-phase pipeline) */
  int phase;
} PsmTrainOptions;


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

G_END_DECLS
#endif
