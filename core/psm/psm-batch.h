/* psm-batch.h — what a task hands the model: one minibatch, time-major.
 * The core owns the buffers (psm_batch_reserve); a task fills them. */
#ifndef PSM_BATCH_H
#define PSM_BATCH_H
#include <glib.h>
#include <stdint.h>
G_BEGIN_DECLS

typedef struct {
  guint32 size;          /* sizeof (PsmBatch) */
  int B;                 /* examples */
  int T;                 /* source length (max over the batch) */
  int Ty;                /* target length (max over the batch) */
  int cap_B, cap_T, cap_Ty;

  /* source side, [T, B] */
  int32_t *src;          /* ids in the source vocabulary (OOV -> unk) */
  int32_t *src_ext;      /* ids in the extended space (per-batch OOVs get
                            ids >= ext_base), for pointer-generator/copy */
  float *src_mask;       /* 1 real token, 0 padding */

  /* target side, [Ty, B] */
  int32_t *dec_in;       /* decoder input at each step (BOS, y1, ...) */
  int32_t *tgt;          /* target in the head's shortlist (unk if outside) */
  int32_t *tgt_ext;      /* the true target word (extended space) */
  float *tgt_mask;       /* 1 real step, 0 padding */
  float *tgt_switch;     /* Gulcehre's observed z_t: 1 shortlist, 0 point */
  int32_t *tgt_loc;      /* source position to point at, -1, or
                            PSM_LOC_ARGMAX (ABI 1.7) */

  /* per-batch OOV words (extended ids ext_base + i) */
  int ext_base;
  GPtrArray *oov_words;  /* char *, owned by the batch */
  int32_t *example_id;   /* [B] index of each example in its split, or -1 */
  /* ABI 1.5, stream tasks (PsmTaskInfo.streams): [B] 1 where the segment
   * continues the stream of the previous batch's row, 0 where the stream
   * starts afresh (zero state); psm_batch_reserve sets 0. */
  float *keep;
  /* ABI 1.7, stream tasks: the streams move on by this many leading
   * positions, the next segment of each row starting after them (0: all T,
   * segments side by side). Overlapping segments (advance < T) are the
   * paper's k1 < k2 truncated BPTT (Merity et al. §5.1): the core carries
   * the state and the history from position advance - 1, not T - 1.
   * psm_batch_reserve sets 0. */
  int advance;
  /* ABI 1.7, optional: the large-vocabulary trick (Jean et al. 2015): the
   * shortlist ids, ascending, that the head's vocabulary softmax is
   * restricted to for this batch (n_cand of them; 0: the whole shortlist).
   * Every real target's tgt must be among them. Owned by the batch
   * (psm_batch_set_candidates); psm_batch_reserve sets n_cand 0. */
  int n_cand;
  int32_t *cand;
  int cap_cand;
  /* core-private: word -> index in oov_words (psm_batch_oov_id) */
  GHashTable *oov_index;
  /* ABI 1.8, [T, B]: the sentence of each source token, counted from 0 and
   * never decreasing along an example's tokens (Zeng et al. §3.1.3: the
   * read-again encoders read each sentence from a fresh state);
   * psm_batch_reserve sets 0 (one sentence). At most PSM_MAX_SENTENCES. */
  int32_t *src_seg;
} PsmBatch;

#define PSM_MAX_SENTENCES 16

void psm_batch_init (PsmBatch *b);
void psm_batch_reserve (PsmBatch *b, int B, int T, int Ty);  /* sets B, T, Ty; zeroes */
void psm_batch_clear (PsmBatch *b);   /* frees buffers */
/* ABI 1.7: the extended id (ext_base + i) of a word outside the
 * vocabulary in this batch: its index in oov_words, added there the first
 * time the batch sees it. Set ext_base first. */
int32_t psm_batch_oov_id (PsmBatch *b, const char *word);
/* ABI 1.7: the word of extended id id (ext_base + i) in this batch, or
 * NULL if id is not one of its per-batch ids. */
const char *psm_batch_oov_word (const PsmBatch *b, int32_t id);
/* ABI 1.7: copy n ascending shortlist ids into cand (n_cand = n). */
void psm_batch_set_candidates (PsmBatch *b, const int32_t *ids, int n);
/* ABI 1.7: the index of shortlist id among the batch's candidates, -1 if it
 * is not one; with no candidates (n_cand 0), id itself. */
int psm_batch_cand_index (const PsmBatch *b, int32_t id);
/* ABI 1.7: the size of the head's vocabulary softmax for this batch:
 * n_cand, or V (the shortlist) without candidates. */
#define PSM_BATCH_VOCAB(b, V) ((b)->n_cand > 0 ? (b)->n_cand : (V))

/* ABI 1.7, tgt_loc: point at the argmax of the head's own location softmax
 * at that step (Gulcehre et al. §5.3's last rule, when no other finds the
 * word in the source); a head without a location softmax skips it. */
#define PSM_LOC_ARGMAX (-2)

#define PSM_AT(arr, batch, t, b) ((arr)[(size_t) (t) * (batch)->B + (b)])

G_END_DECLS
#endif
