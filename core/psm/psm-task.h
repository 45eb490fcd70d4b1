/* psm-task.h — task plugins: data, vocabularies, batches, pointer targets. */
#ifndef PSM_TASK_H
#define PSM_TASK_H
#include "psm-component.h"
#include "psm-batch.h"
#include "psm-rng.h"
#include "psm-plugin.h"
G_BEGIN_DECLS

typedef enum { PSM_SPLIT_TRAIN, PSM_SPLIT_VALID, PSM_SPLIT_TEST } PsmSplit;

typedef struct {
  guint32 size;
  guint64 seed;         /* train.seed; fixed eval sets derive from it or own seeds */
  gboolean check;       /* --check: keep every split tiny */
  /* ABI 1.2: the run folder, where save() wrote what must be reused (a
   * vocabulary built from the training data); read it from there when it
   * exists. NULL under --check. */
  const char *run_dir;
  /* ABI 1.4: the run only evaluates or decodes (psm-run --mode eval or
   * decode): the training split need not be held. A task may skip reading
   * it when run_dir has what save() wrote, and then answer n_examples
   * (PSM_SPLIT_TRAIN) with 0. Read it only if ctx->size covers it:
 * PSM_STRUCT_FIELD (ctx, eval_only, FALSE). */
  gboolean eval_only;
  /* ABI 1.14: the run decodes raw text alone (psm-run --mode decode
   * --input, psm-run serve): no split is used, only text_batch and
   * token_text. Set with eval_only. A task may then read none of its splits
   * when run_dir has what save() wrote, and answer n_examples with 0 for
   * every split. Read it as PSM_STRUCT_FIELD (ctx, text_only, FALSE). */
  gboolean text_only;
} PsmTaskCtx;

typedef struct {
  guint32 size;
  void *(*create) (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error);
  void (*destroy) (void *self);
  void (*info) (void *self, PsmTaskInfo *info);
  /* Next training batch of B examples (rng: the run's stream). Optional
   * since ABI 1.20 for a task with eval_batch_of: NULL draws B examples
   * with psm_rng_below (rng, n_examples (PSM_SPLIT_TRAIN)) and asks
   * eval_batch_of (PSM_SPLIT_TRAIN, ...) for them (psm_task_train_batch). */
  gboolean (*train_batch) (void *self, int B, PsmRng *rng, PsmBatch *out, GError **error);
  int (*n_examples) (void *self, PsmSplit split);
  /* Examples [start, start + B) of a fixed split (B may be cut at the end).
   * Optional since ABI 1.20 for a task with eval_batch_of, which NULL asks
   * for those examples (psm_task_eval_batch). */
  gboolean (*eval_batch) (void *self, PsmSplit split, int start, int B, PsmBatch *out, GError **error);
  /* Text of word id (extended space) for example b of batch; owned by the
   * task or the batch. */
  const char *(*token_text) (void *self, const PsmBatch *batch, int b, int32_t id);
  /* ABI 1.2, optional: write into the new run folder `dir` whatever eval,
   * decode and resume must reuse (create() reads it back from run_dir). */
  gboolean (*save) (void *self, const char *dir, GError **error);
  /* ABI 1.2, optional: a batch (source side only) from n raw source texts,
   * prepared as the training data was (tokenised, lower-cased); decoding
   * user input. */
  gboolean (*text_batch) (void *self, const char *const *texts, int n, PsmBatch *out, GError **error);
  /* ABI 1.2, optional: example i of a split as whole texts for the text
   * metrics (psm-metric.h add_text): *source the input, *reference the
   * reference with its sentences separated by '\n' (NULL: unknown); owned
   * by the task. */
  void (*example_text) (void *self, PsmSplit split, int i, const char **source, const char **reference);
  /* ABI 1.7, optional, tasks whose training batches are not drawn from the
   * run's RNG alone (stream tasks walk their data in order): where the
   * training walk stands, as a count the task understands, and a seek back
   * to it for training batches of B (FALSE with error set if the cursor
   * does not fit the data). The core keeps the cursor in last.ckpt, so
   * --resume continues the walk where it stopped. */
  gint64 (*train_cursor) (void *self);
  gboolean (*train_seek) (void *self, int B, gint64 cursor, GError **error);
  /* ABI 1.10, optional, both or neither: how many source positions example
   * i of a fixed split takes in a batch (the T it alone would need), and a
   * batch of the given examples of a split, in that order, with
   * PsmBatch.example_id set to them. With both, decoding takes a split's
   * articles in order of source length (decode.sort), so a batch pads
   * little, and writes its outputs and feeds the metrics in the split's
   * order. A negative length keeps the split's order: a task whose batches
   * depend on the company an example keeps (a shortlist per batch) says
   * so. */
  int (*source_length) (void *self, PsmSplit split, int i);
  gboolean (*eval_batch_of) (void *self, PsmSplit split, const int *examples, int B, PsmBatch *out,
                             GError **error);
} PsmTaskClass;

/* ABI 1.20: a training batch and a batch of a fixed split from the task's
 * own hook, or, where the task leaves it NULL, from eval_batch_of as the
 * class comments say; what the core and the task tests call. */
gboolean psm_task_train_batch (const PsmTaskClass *k, void *task, int B, PsmRng *rng, PsmBatch *out,
                               GError **error);
gboolean psm_task_eval_batch (const PsmTaskClass *k, void *task, PsmSplit split, int start, int B, PsmBatch *out,
                              GError **error);

/* ABI 1.7: the lines of a text file (NULL-ended; g_strfreev), or of
 * standard input for "-"; a final newline makes no extra line. Errors name
 * path and what it holds ("source sentences", ...). */
char **psm_read_lines (const char *path, const char *what, GError **error);

/* ABI 1.7: the pairs of texts of a split (*first and *second, new arrays of
 * strings, line ends removed; the caller unrefs them, also on failure):
 * with path2 NULL from a jsonl file, one JSON object a line with the string
 * fields keys[0] and keys[1] (blank lines skipped); else from the
 * line-aligned files path and path2. At most max pairs (0: all). A bad
 * record (invalid JSON, a field missing or not a string, an empty text) is
 * skipped and counted on stderr as "who: path: skipped N bad records
 * (lines ...; first: why)" unless quiet; no valid pair, an unreadable file
 * or files of different lengths is an error naming the file. */
gboolean psm_read_text_pairs (const char *path, const char *path2, const char *const keys[2], long max,
                              gboolean quiet, const char *who, GPtrArray **first, GPtrArray **second,
                              GError **error);
/* ABI 1.7: raw text lower-cased and tokenised like the Penn Treebank
 * tokeniser that CNN/DailyMail and Gigaword went through (an approximation:
 * punctuation split off, n't 's 're 've 'll 'd 'm split, double quotes as
 * `` and ''), tokens joined by single spaces (g_free). */
char *psm_tokenize_ptb (const char *text);
/* ABI 1.21: the string fields keys[i] (NULL-terminated, at most 32) of one
 * JSON object (one jsonl line): values[i] receives field keys[i], bit i of
 * *found says it was there; other fields are skipped. FALSE with why (a
 * phrase) for invalid JSON or a listed field that is not a string. */
gboolean psm_json_string_fields (const char *line, const char *const *keys, GString **values, guint *found,
                                 GString *why);

G_END_DECLS
#endif
