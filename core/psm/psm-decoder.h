/* psm-decoder.h — decoder-cell plugins: one target step at a time.
 * Attention and coverage live here. The recurrent state ("carry") is one
 * batch-major tensor [B, K] so the core can reorder beams with a row gather;
 * K may depend on the source length T (a coverage vector is part of it).
 * The core runs the loop: teacher-forced over the Ty target steps in
 * training (inputs batch->dec_in), and greedy or beam search in decoding,
 * where the rows of the encoding are those of the hypotheses the search
 * extends at that step: one an article at the first step, then one a beam
 * of each article still searching. The number of rows can change from one
 * step to the next, and a row's tensors can move between steps: keep
 * nothing from one step to the next but the carry. A step's outputs are
 * copied into the time-major PsmDecOut the head sees. A decoder that sets
 * PSM_DECODER_LIVE_ROWS (below) also gets fewer rows than the batch has in
 * training, once targets end.
 * Pipelines without a decoder (the rarest-word task) hand the head the
 * encoder summary as a single step. */
#ifndef PSM_DECODER_H
#define PSM_DECODER_H
#include "psm-encoder.h"
G_BEGIN_DECLS

/* One step's outputs; all batch-major. */
typedef struct {
  PsmTensor *carry;      /* [B, K] recurrent state (incl. coverage) */
  PsmTensor *state;      /* [B, Hs] s_t as the head sees it */
  PsmTensor *context;    /* [B, C] or NULL */
  PsmTensor *attn;       /* [B, T] attention over the source, or NULL */
  PsmTensor *coverage;   /* [B, T] coverage before this step, or NULL */
  PsmTensor *input;      /* [B, E] the step's input embedding, or NULL */
} PsmDecStep;

typedef struct {
  guint32 size;
  void *(*create) (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error);
  void (*destroy) (void *self);
  int (*state_dim) (void *self);
  int (*context_dim) (void *self);          /* 0: no context */
  gboolean (*has_attention) (void *self);
  /* Initial carry [B, K] from the encoding. */
  PsmTensor *(*init) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc);
  /* One step from carry with input embedding in [B, E]. */
  void (*step) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
                PsmTensor *carry, PsmTensor *in, PsmDecStep *out);
  /* ABI 1.2, optional: computed once per encoding, before init, and handed
   * to init and every step as enc->memo; must be time-major [T, B, A]. */
  PsmTensor *(*prepare) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc);
  /* ABI 1.12, optional: PSM_DECODER_* flags (0: none). */
  guint32 flags;
} PsmDecoderClass;

/* The decoder's step takes a carry and an input of R <= enc->B rows, which
 * are the encoding's first R rows (enc->B and the encoding's tensors stay
 * the whole batch's; psm_additive_attention takes a query of R rows). With
 * it, teacher-forced training orders a batch's rows by target length,
 * longest first, and runs step t on the rows whose target has a word at t
 * or later only: a row past its target's end has no loss left, and its
 * outputs (zeros in the stacks the head sees) have no gradient. Without
 * it, every step runs on all B rows. (ABI 1.12) */
#define PSM_DECODER_LIVE_ROWS (1u << 0)

G_END_DECLS
#endif
