/* psm-checkpoint.h — versioned, checksummed checkpoints written atomically
 * (temporary file, fsync, rename): a crash never leaves a torn file.
 * Layout: header (magic "PSMCKPT1", format version, step, RNG state,
 * optimiser kind and slot count), manifest (name, shape of each parameter),
 * parameters, optimiser state, then a SHA-256 of everything before it. */
#ifndef PSM_CHECKPOINT_H
#define PSM_CHECKPOINT_H
#include "psm-params.h"
G_BEGIN_DECLS

#define PSM_CHECKPOINT_VERSION 1

typedef struct {
  long step;
  PsmRng rng;
  double best_metric;     /* best validation score so far (for --resume) */
} PsmCheckpointMeta;

/* optim may be NULL (parameters only). */
gboolean psm_checkpoint_save (const char *path, PsmParams *p, PsmOptim *optim,
                              const PsmCheckpointMeta *meta, GError **error);
/* Verifies magic, version, checksum and that the manifest matches p exactly
 * (names and shapes); on any failure p and optim are left untouched. */
gboolean psm_checkpoint_load (const char *path, PsmParams *p, PsmOptim *optim,
                              PsmCheckpointMeta *meta, GError **error);

G_END_DECLS
#endif
