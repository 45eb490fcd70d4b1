/* psm-component.h — what a model component is told when it is built. */
#ifndef PSM_COMPONENT_H
#define PSM_COMPONENT_H
#include "psm-params.h"
#include "psm-config.h"
G_BEGIN_DECLS

/* Sizes fixed by the task (PsmTaskClass.info). */
typedef struct {
  guint32 size;
  int src_vocab;      /* source embedding rows */
  int tgt_vocab;      /* the head's shortlist size (includes unk if any) */
  int ext_base;       /* first extended (per-batch OOV) id; == full vocab size */
  int max_src_len;    /* longest source the task produces */
  int max_tgt_len;
  int bos_id, eos_id, unk_id;   /* -1 when the task has none */
  /* ABI 1.5: the examples are B contiguous streams cut into segments
   * (language modelling). Target t of a segment is the word after source
   * position t (Ty == T, no decoder); the encoder's state (carry_dim) goes
   * on from one segment to the next where PsmBatch.keep says so; the
   * evaluation asks eval_batch (split, k, B, ...) for segments k = 0, 1, ...
   * of B streams until one comes back with T == 0; n_examples counts the
   * split's target words. */
  gboolean streams;
} PsmTaskInfo;

/* Handed to create(); register parameters with psm_params_add using
 * `prefix` (e.g. "encoder.") in front of every name. */
typedef struct {
  guint32 size;
  PsmParams *params;
  const char *prefix;
  const PsmTaskInfo *task;
  int emb_dim;        /* token embedding size */
  int enc_dim;        /* encoder annotation size (0: no encoder) */
  int summary_dim;    /* encoder summary size */
  int state_dim;      /* decoder state s_t size the head sees */
  int context_dim;    /* decoder context c_t size (0: none) */
  gboolean has_attention;   /* decoder provides attention over the source */
  /* ABI 1.6: the parameter id of the token embedding table [V, emb_dim]
   * (a head may tie its output weights to it, Press & Wolf 2017) */
  int emb_param;
} PsmBuildCtx;

/* Registers ctx->prefix + name; returns the parameter id. */
int psm_build_matrix (const PsmBuildCtx *ctx, const char *name, int rows, int cols, PsmInit init, float scale);
int psm_build_vector (const PsmBuildCtx *ctx, const char *name, int n, PsmInit init, float scale);

G_END_DECLS
#endif
