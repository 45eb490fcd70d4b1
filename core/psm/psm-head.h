/* psm-head.h — head plugins: decoder outputs -> training loss, and log-scores
 * over the head's output space for decoding.
 *
 * Output space = the shortlist [0, tgt_vocab) followed by the head's extra
 * slots (source positions for pointer softmax and copy, per-batch OOV ids for
 * the pointer-generator, window positions for the sentinel). slot_token maps
 * a slot back to a word id in the task's extended space. */
#ifndef PSM_HEAD_H
#define PSM_HEAD_H
#include "psm-decoder.h"
#include "psm-batch.h"
G_BEGIN_DECLS

/* Decoder outputs of Ty steps stacked time-major, so a head can project all
 * steps with one GEMM. Any field but state may be NULL. With no decoder,
 * Ty = 1 and state is the encoder summary. */
typedef struct {
  int Ty, B;
  PsmTensor *state;      /* [Ty, B, Hs] */
  PsmTensor *context;    /* [Ty, B, C] */
  PsmTensor *attn;       /* [Ty, B, T] */
  PsmTensor *coverage;   /* [Ty, B, T] */
  PsmTensor *input;      /* [Ty, B, E] */
  /* ABI 1.6, stream tasks whose head has a history (PsmHeadClass.history):
   * the last P annotations of the earlier segments of each stream [P, B, H]
   * (a copy, no gradient) and their words [P, B] (-1 where the stream has
   * none: before its start, or after a reset). Position P - 1 is the one
   * just before this segment's first. */
  int P;
  PsmTensor *past;
  const int32_t *past_ids;
} PsmDecOut;

typedef struct {
  guint32 size;
  void *(*create) (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error);
  void (*destroy) (void *self);
  /* Mean loss per real target step (scalar tensor); reads any targets of
   * the batch it needs (tgt, tgt_ext, tgt_switch, tgt_loc, tgt_mask). */
  PsmTensor *(*loss) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
                      const PsmDecOut *out, const PsmBatch *batch);
  /* Size of the output space for this batch. */
  int (*space_size) (void *self, const PsmBatch *batch);
  /* Log-scores [B, space_size] for one step (out->Ty == 1). */
  PsmTensor *(*scores) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
                        const PsmDecOut *out, const PsmBatch *batch);
  /* Word id (extended space) that slot of example b stands for. */
  int32_t (*slot_token) (void *self, const PsmBatch *batch, int b, int slot);
  /* Never called (superseded by input_embed, ABI 1.8: a hook in terms of
   * output slots cannot serve teacher-forced training, whose inputs are
   * words). Leave it NULL. */
  PsmTensor *(*input_embedding) (void *self, PsmGraph *g, PsmParams *p,
                                 const PsmEncoding *enc, const PsmBatch *batch,
                                 const int32_t *rows, const int32_t *slots, int n);
  /* ABI 1.2, optional: [B, 1] probability of generating from the shortlist
   * at one step (out->Ty == 1): See's p_gen, Gulcehre's switch. For the
   * decoder's JSON output and the mean p_gen of evaluations. */
  PsmTensor *(*gate) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
                      const PsmDecOut *out, const PsmBatch *batch);
  /* ABI 1.6, optional, stream tasks: how many earlier positions of each
   * stream the head reads (the pointer sentinel: L - 1); the core keeps
   * them from segment to segment and hands them over in PsmDecOut.past. */
  int (*history) (void *self);
  /* ABI 1.6, optional, stream tasks: per target position r of the batch
   * ([Ty, B] order), logp[r] = log p(tgt[r]) and, where the head has a
   * gate, gate[r] = its probability of the vocabulary softmax (NAN
   * without); for per-token evaluation records (psm-run --mode eval
   * --out). Rows with tgt_mask 0 are left as they are. */
  void (*token_logp) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc, const PsmDecOut *out,
                      const PsmBatch *batch, float *logp, float *gate);
  /* ABI 1.8, optional (Zeng et al. eq. 15): the decoder's input embeddings
   * [n, E] for the previous output words[i] (extended ids; the begin word
   * at the first step) of example rows[i] of enc and batch, given x [n, E]:
   * their rows of the target embedding table (unk for a word outside the
   * shortlist). Return x, or a tensor with rows of it replaced (e.g. a
   * copied word's embedding derived from its source annotation). The core
   * calls it in teacher-forced training (all Ty B inputs at once, words =
   * the previous targets' tgt_ext) and at every decoding step (one row a
   * hypothesis, words = what each one emitted), so the decoder cell never
   * knows which head it feeds. */
  PsmTensor *(*input_embed) (void *self, PsmGraph *g, PsmParams *p, const PsmEncoding *enc,
                             const PsmBatch *batch, const int32_t *words, const int32_t *rows, int n,
                             PsmTensor *x);
} PsmHeadClass;

G_END_DECLS
#endif
