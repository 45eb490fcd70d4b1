/* psm-vocab.h — word vocabularies for task plugins (ABI 1.7): ids in order
 * of addition, training counts, the "most frequent first" construction
 * every task uses, and the run folder's vocab.txt ("word<TAB>count" a
 * line) written and read back with errors naming file and line. */
#ifndef PSM_VOCAB_H
#define PSM_VOCAB_H
#include <glib.h>
#include <stdint.h>
G_BEGIN_DECLS

typedef struct PsmVocab PsmVocab;

PsmVocab *psm_vocab_new (void);
void psm_vocab_free (PsmVocab *v);
int psm_vocab_size (const PsmVocab *v);
/* The id of w, added with count 0 if it is new. */
int32_t psm_vocab_add (PsmVocab *v, const char *w);
/* The id of w, or -1. */
int32_t psm_vocab_id (const PsmVocab *v, const char *w);
/* The word of id, NULL outside [0, size). */
const char *psm_vocab_word (const PsmVocab *v, int32_t id);
gint64 psm_vocab_count (const PsmVocab *v, int32_t id);
/* Forgets the words of id n and up (ABI 1.18): a task that adds the words
 * of a raw text to its table for one batch (whose out-of-vocabulary words
 * the batch keeps as strings) takes them out again, so that a server's
 * memory does not grow with every new word a client sends. */
void psm_vocab_truncate (PsmVocab *v, int n);
/* The longest word a task reads from raw text, in bytes; a longer one is
 * read as the unknown word (ABI 1.18). Training data keep theirs. */
#define PSM_MAX_WORD_BYTES 256

/* Word counts over a corpus. */
typedef struct PsmWordCounts PsmWordCounts;
PsmWordCounts *psm_word_counts_new (void);
void psm_word_counts_free (PsmWordCounts *c);
void psm_word_counts_add (PsmWordCounts *c, const char *w, gint64 n);
/* The count of w (0 if never added), and the number of distinct words. */
gint64 psm_word_counts_get (const PsmWordCounts *c, const char *w);
int psm_word_counts_size (const PsmWordCounts *c);

/* Adds the counted words v does not hold yet, most frequent first (ties in
 * byte order of the word), with their counts, until v holds max words
 * (max <= 0: all of them). Returns how many were added. */
int psm_vocab_add_by_count (PsmVocab *v, const PsmWordCounts *c, int max);

/* Writes words [0, n) of v (n < 0: all) to path, "word<TAB>count" a line. */
gboolean psm_vocab_save (const PsmVocab *v, int n, const char *path, GError **error);
/* Adds the words of a file psm_vocab_save wrote to v (a line may also be a
 * bare word, count 0). Refused, naming path and line: a line with a space,
 * an empty word before the tab, a word already in v or twice in the file,
 * and a file that does not start with the words of `first` (NULL-ended,
 * may be NULL) in that order. On error v is left as it was. */
gboolean psm_vocab_load (PsmVocab *v, const char *path, const char *const *first, GError **error);

G_END_DECLS
#endif
