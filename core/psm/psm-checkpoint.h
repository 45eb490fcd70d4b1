/* psm-checkpoint.h — versioned, checksummed checkpoints written atomically
 * (temporary file, fsync, rename): a crash never leaves a torn file.
 * Layout (version 2, little-endian as written by this machine):
 *   "PSMCKPT1", u32 version, u32 flags (bit 0: optimiser state follows),
 *   u64 step, u32[4] RNG state, f64 best metric (NaN: none yet),
 *   optimiser: u32 name length, name, u32 state slots, u32 setting count,
 *     f64 settings (lr, beta1, beta2, eps, init_accum, rho, halve_start,
 *     halve_every),
 *   u64 parameter floats, u32 parameter count, manifest (u32 name length,
 *   name, u32 rank, u32 dims, u64 offset per parameter),
 *   parameters, optimiser state slots (if flagged), SHA-256 of all before.
 * Version 3 adds after the best metric f64 lr scale, f64 last metric, u64
 * evaluations without a best; version 4 adds before the SHA-256 u64 n and
 * n bytes of training-stream state (language models: where the task's walk
 * stands, the carried state and the head's history; 0 bytes for other
 * tasks and in files without optimiser state). */
#ifndef PSM_CHECKPOINT_H
#define PSM_CHECKPOINT_H
#include "psm-params.h"
G_BEGIN_DECLS

#define PSM_CHECKPOINT_VERSION 4
/* The largest training-stream state a checkpoint holds (bytes). */
#define PSM_CHECKPOINT_MAX_STREAM ((guint64) 256 << 20)
/* No run has more updates than this (train.steps' upper bound). */
#define PSM_MAX_STEPS 1000000000L

typedef struct {
  long step;
  PsmRng rng;
  double best_metric;     /* best validation score so far (for --resume) */
  /* version 3: the plateau schedule's state (version 2 files read as 1,
   * NAN, 0) */
  double lr_scale;        /* factor on the learning rate so far */
  double last_metric;     /* the previous validation score (NAN: none) */
  long bad_evals;         /* validations in a row without a new best */
  /* version 4: the training streams' state (psm_model_stream_state), NULL
   * for none. Saved with optimiser state only; a load sets a new reference
   * the caller unrefs (NULL for files of version 2 and 3). */
  GBytes *stream;
} PsmCheckpointMeta;

/* Records optim's name and settings (optim may be NULL: none recorded) and,
 * with with_state, its state buffers (what --resume needs). */
gboolean psm_checkpoint_save (const char *path, PsmParams *p, PsmOptim *optim, gboolean with_state,
                              const PsmCheckpointMeta *meta, GError **error);
/* Reads a regular file no larger than a checkpoint of p can be; verifies
 * magic, version, checksum, the header's values (step, RNG, metric) and that
 * the manifest matches p exactly (names and shapes). With optim, the
 * checkpoint must hold optimiser state of the same optimiser with the same
 * settings. On any failure p and optim are left untouched. */
gboolean psm_checkpoint_load (const char *path, PsmParams *p, PsmOptim *optim,
                              PsmCheckpointMeta *meta, GError **error);

G_END_DECLS
#endif
