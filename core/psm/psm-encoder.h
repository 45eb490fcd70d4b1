/* psm-encoder.h — encoder plugins: embedded source -> annotations + summary. */
#ifndef PSM_ENCODER_H
#define PSM_ENCODER_H
#include "psm-ops.h"
#include "psm-component.h"
#include "psm-plugin.h"
G_BEGIN_DECLS

typedef struct {
  int T, B;
  PsmTensor *annotations;   /* [T, B, H] (time-major) */
  PsmTensor *summary;       /* [B, Hs] */
  const float *mask;        /* [T, B], 1 real token; never NULL */
  const int32_t *src;       /* [T, B] source ids, for heads that need them */
  /* ABI 1.2: what the decoder's prepare() computed once per article (e.g.
   * W_h h_i of additive attention), time-major [T, B, A] like the
   * annotations so the core can expand it to beams; NULL without. */
  PsmTensor *memo;
  /* ABI 1.5, stream tasks with an encoder that has carry_dim: the state the
   * previous segment ended in [B, K] (zeros where the stream starts), to
   * start from; the encoder sets carry_out [B, K] to the state this segment
   * ends in (the core keeps a copy, without gradient, for the next one). */
  const float *carry_in;
  PsmTensor *carry_out;
  /* ABI 1.7, stream tasks: carry_out is the state after the first carry_at
   * positions (PsmBatch.advance; 0 < carry_at < T when segments overlap),
   * or, with 0, after all T. An encoder that has carry_dim must honour it:
   * the core refuses overlapping segments with one built for ABI < 1.7. */
  int carry_at;
  /* ABI 1.8: the sentence of each source token [T, B] (PsmBatch.src_seg;
   * all 0 for a single sentence). */
  const int32_t *seg;
  /* ABI 1.8, optional, set by the encoder: a weight per source token and
   * unit [T, B, D] (D may be 1) for inspection, e.g. the read-again
   * importance weights alpha_i (Zeng et al. §3.1); the decoder's JSON
   * output lists its mean over D per token. NULL: none. */
  PsmTensor *importance;
  /* ABI 1.16, set by the core: whether anything will read importance (the
   * decoder's JSON output). An encoder whose importance serves inspection
   * only may skip it when FALSE; encoders built for older ABIs cannot see
   * this and compute it as before. */
  gboolean want_importance;
} PsmEncoding;

typedef struct {
  guint32 size;             /* sizeof (PsmEncoderClass) */
  /* Declares parameters; returns the instance or NULL with error set. */
  void *(*create) (const PsmSection *cfg, const PsmBuildCtx *ctx, GError **error);
  void (*destroy) (void *self);
  int (*output_dim) (void *self);    /* H of annotations */
  int (*summary_dim) (void *self);   /* Hs of summary */
  /* emb [T, B, E]; mask [T, B]. Fills out->annotations and out->summary. */
  void (*encode) (void *self, PsmGraph *g, PsmParams *p, PsmTensor *emb,
                  const float *mask, PsmEncoding *out);
  /* ABI 1.5, optional: K, the size of the state carried from one segment of
   * a stream to the next (0 or NULL: none). */
  int (*carry_dim) (void *self);
} PsmEncoderClass;

G_END_DECLS
#endif
