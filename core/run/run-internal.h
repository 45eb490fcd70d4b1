/* run-internal.h — the run layer (core/run/): what sessions and the
 * training loop share, and what the training loop (psm-train.c) and the
 * trainer's state and recovery (psm-train-state.c) share. */
#ifndef PSM_RUN_INTERNAL_H
#define PSM_RUN_INTERNAL_H
#include "model/model-internal.h"

/* psm-session.c, shared with the training loop (psm-train.c) */
gboolean psm_run_optim_config (const PsmSection *s, PsmOptConfig *c);
gboolean psm_run_write_failed (GError **error, const char *path);
gboolean psm_run_log_append (FILE *log, const char *path, const char *record, GError **error);
gboolean psm_run_json_eval (FILE *log, const char *path, long step, const char *split, double t,
                            const PsmEvalResult *r, GError **error);
void psm_run_print_eval (const char *what, long step, const PsmEvalResult *r, gboolean best);

/* State buffers of an optimiser kind: sgd 0, adagrad 1, adam/adadelta 2
 * (psm-optim.c; the checkpoint reader checks against it). */
int psm_optim_kind_slots (PsmOptKind kind);
/* The update of parameters [lo, hi) alone, with their gradient g (g[0]
 * is parameter lo's) times scale; g is left as it is (psm-optim.c). */
void psm_optim_step_part (PsmOptim *o, long step, float scale, size_t lo, size_t hi, const float *g);

typedef enum { NONFINITE_STOP, NONFINITE_SKIP, NONFINITE_ROLLBACK } NonfinitePolicy;

typedef struct {
  PsmModel *m;
  PsmPipeline *pl;
  PsmTrainOptions *opt;
  PsmParams *params;
  PsmOptim *optim;
  const char *dir;
  char *last, *best_path, *log_path, *cfg_path;
  FILE *log;
  PsmCheckpointMeta meta;
  gboolean have_best;
  gboolean rank0;          /* writes logs, checkpoints and outputs */
  int nranks;              /* MPI ranks sharing every batch */
  double t_reduce;         /* seconds in the gradient allreduce */
  PsmDistReduce *dist;     /* bucketed / sharded reduction (train.dist_*), or NULL */
  /* settings */
  long steps, eval_every, log_every, valid_n, patience, ckpt_every;
  int B;
  double clip, plateau;
  NonfinitePolicy on_nonfinite;
  long nonfinite_max;
  double rollback_factor;
  gboolean dist_shard, dist_overlap;
  double dist_bucket_mb;
  long nonfinite_seen;     /* skips and rollbacks in this process */
  /* the log window */
  double win_loss, win_tokens, win_tgt, t_win, t_live;
  double tgt_total;        /* target tokens trained on in this process's run */
  long win_n, start_step;
  GTimer *timer;
} Trainer;

/* psm-train-state.c */
G_GNUC_INTERNAL char *kept_msg (const Trainer *t);
G_GNUC_INTERNAL gboolean log_record (Trainer *t, const char *rec, GError **error);
G_GNUC_INTERNAL gboolean save_last (Trainer *t, GError **error);
G_GNUC_INTERNAL gboolean on_nonfinite (Trainer *t, long step, const char *what, double v, long *next, GError **error);
G_GNUC_INTERNAL gboolean trainer_settings (Trainer *t);
G_GNUC_INTERNAL gboolean trainer_open (Trainer *t, GError **error);

#endif
