/* psm-examples.h — the examples of a sequence-to-sequence split as a task
 * holds them (ABI 1.20): per example the source's word ids (with, where
 * the task has them, each source word's id in the target table and its
 * sentence number), the target's word ids with their pointer targets
 * (switch and source position), and optionally the whole texts for the
 * text metrics; and the one function that turns a list of examples into a
 * PsmBatch. cnndm, headline and nmt fill one store a split and keep only
 * what is theirs (reading their format, their vocabularies, computing
 * their pointer targets).
 *
 * Ids are "global": a word's id in the task's PsmVocab, which holds the
 * model's vocabulary in [0, V) and then every other word seen. A batch
 * gives the model ids below V as they are and <unk> for the rest; in the
 * extended space (src_ext, tgt_ext) a word outside the target vocabulary
 * gets a per-batch id (psm_batch_oov_id), so a copied word reaches the
 * output as itself. */
#ifndef PSM_EXAMPLES_H
#define PSM_EXAMPLES_H
#include <glib.h>
#include <stdint.h>
#include "psm-batch.h"
#include "psm-vocab.h"
G_BEGIN_DECLS

/* How a source word's extended id is found. */
typedef enum {
  /* One table for both sides (cnndm): a source id below tgt_vocab is the
   * target id. */
  PSM_EXAMPLES_SHARED_TABLE,
  /* Two tables; psm_examples_add_source gives each source word's id in the
   * target table (-1: none), used where it is below tgt_vocab (headline). */
  PSM_EXAMPLES_MAPPED,
  /* Two tables; every source word gets a per-batch id (nmt). */
  PSM_EXAMPLES_OWN_IDS
} PsmExamplesSourceExt;

typedef struct PsmExamples PsmExamples;

/* How a store's ids become a batch: the tables (for the per-batch words'
 * spelling), the model's vocabulary sizes, the special ids; ext_base is
 * where per-batch ids start (at least src_vocab and tgt_vocab). */
typedef struct {
  const PsmVocab *src_words, *tgt_words;
  int src_vocab, tgt_vocab, ext_base;
  int32_t unk, bos, eos;
} PsmExampleWords;

PsmExamples *psm_examples_new (PsmExamplesSourceExt ext);
void psm_examples_free (PsmExamples *x);
/* Starts example n (psm_examples_n before the call): its whole source and
 * reference texts (copied; either may be NULL), then its source and target
 * tokens in order. */
int psm_examples_begin (PsmExamples *x, const char *source_text, const char *reference_text);
/* A source token: its id, its id in the target table (read only by
 * PSM_EXAMPLES_MAPPED; -1 for none), its sentence number (0 for a task
 * without sentences). */
void psm_examples_add_source (PsmExamples *x, int32_t id, int32_t tgt_id, int seg);
/* A target token: its id, gen (1 the word is generated, 0 pointed at) and
 * loc (the source position it points at, -1, or PSM_LOC_ARGMAX). */
void psm_examples_add_target (PsmExamples *x, int32_t id, float gen, int32_t loc);

/* A NULL store reads as empty (a split the task did not read). */
int psm_examples_n (const PsmExamples *x);
int psm_examples_source_length (const PsmExamples *x, int i);
/* The texts given to psm_examples_begin (NULL: none given, or i outside). */
const char *psm_examples_source_text (const PsmExamples *x, int i);
const char *psm_examples_reference_text (const PsmExamples *x, int i);

/* Fills b with examples idx[0..B) in that order (example_id set to them;
 * idx NULL, since ABI 1.21: examples 0 to B - 1, a whole small store):
 * sources with masks, segments and extended ids; dec_in, tgt, tgt_ext,
 * switch and loc over each target and a final eos. FALSE with error set
 * (naming `who`) if an index is outside the store. */
gboolean psm_examples_fill (const PsmExamples *x, const PsmExampleWords *w, const int *idx, int B, PsmBatch *b,
                            const char *who, GError **error);

G_END_DECLS
#endif
