/* psm-plugin.h — the plugin descriptor and loader.
 *
 * A plugin is one shared object exporting one symbol, psm_plugin_entry,
 * returning a PsmPluginDesc. End each plugin file with one PSM_PLUGIN line.
 * ABI rule (as GStreamer's): same major; plugin minor not newer than the
 * core's. Structs crossing the boundary start with their size and are only
 * ever appended to. */
#ifndef PSM_PLUGIN_H
#define PSM_PLUGIN_H
#include <glib.h>
#include "psm-error.h"
#include "psm-config.h"
G_BEGIN_DECLS

/* History. 1.0: first release. 1.1: psm_memory_limit(), psm_optim_config()
 * and PSM_PLUGIN_ERROR_CLASS added; the loader refuses classes with NULL
 * required hooks and malformed parameter tables (plugins built for 1.0 that
 * pass those checks still load). 1.2: the decoder loop — appended
 * PsmEncoding.memo and PsmDecoderClass.prepare (per-article tensors of the
 * decoder computed once, expanded to beams by the core), PsmTaskCtx.run_dir,
 * PsmTaskClass.save, .text_batch and .example_text, PsmMetricClass.add_text
 * (metrics on whole texts), PSM_METRIC_MAX_VALUES 16 (was 8), and the
 * pointer ops of psm-ops.h. 1.3: psm_lstm_seq (the whole-sequence LSTM
 * that bilstm uses; a plugin calling it needs a core that has it). 1.4:
 * PsmTaskCtx.eval_only (a task may leave its training split unread),
 * psm_lstm_seq_cols. 1.5: stream tasks (language modelling):
 * PsmTaskInfo.streams, PsmBatch.keep, PsmEncoderClass.carry_dim,
 * PsmEncoding.carry_in/carry_out. 1.6: the pointer sentinel LM —
 * PsmHeadClass.history and .token_logp, PsmDecOut.P/past/past_ids,
 * PsmBuildCtx.emb_param, psm_graph_set_rng/psm_graph_rng,
 * psm_locked_dropout, psm_zoneout_weights, psm_lstm_seq_zoneout,
 * psm_window_ids, psm_window_scores, psm_sentinel_nll. 1.7: overlapping
 * segments (Merity et al.'s k1 < k2 truncated BPTT) — PsmBatch.advance,
 * PsmEncoding.carry_at, psm_concat_steps; PsmTaskClass.train_cursor and
 * .train_seek (exact --resume of a stream task); psm-vocab.h (word
 * vocabularies for tasks); PsmMetricClass.multi_reference;
 * PSM_LOC_ARGMAX; psm_read_lines; PsmBatch.n_cand/cand (the
 * large-vocabulary trick), psm_batch_set_candidates, psm_batch_cand_index,
 * psm_batch_oov_id, psm_batch_oov_word, psm_gather_cols, psm_noisy_tanh;
 * psm_read_text_pairs and psm_tokenize_ptb (text pairs and raw text for
 * seq2seq tasks). 1.8: read-again and copy (Zeng et al.) —
 * PsmHeadClass.input_embed (the decoder's input embedding from the head,
 * in training and decoding; the 1.0 slot input_embedding, never called,
 * stays), PsmBatch.src_seg and PsmEncoding.seg (sentences of the source),
 * PsmEncoding.importance (per-token weights for the JSON output),
 * psm_logsumexp, psm_dot_scores. 1.9: psm_plugin_hooks and PsmHookInfo
 * (which class hooks a plugin sets, for psm-run --describe);
 * psm_section_from_text and psm_section_destroy (a plugin's own tests build
 * it from a config text, as the example project under doc/examples does);
 * psm_params_numel. 1.10: PsmTaskClass.source_length and .eval_batch_of
 * (decoding in batches of similar source length). 1.11: psm_nonzero_rows,
 * psm_gather_elems and psm_scatter_rows (heads score their vocabulary on the real target
 * rows only, not on padding). 1.12: PsmDecoderClass.flags and
 * PSM_DECODER_LIVE_ROWS (teacher-forced steps on the rows whose targets
 * have not ended), psm_additive_attention over a query of R <= B rows. 1.13:
 * psm_gru_seq_cols (a GRU sequence on columns of a wider projection, in
 * either direction: bigru's backward half as one op). 1.14:
 * PsmTaskCtx.text_only (decoding raw text: a task may read none of its
 * splits). 1.15: psm_params_grad_norm, psm_clip_scale and
 * psm_optim_step_zero (the clip, the update and the zeroing of the
 * gradients in one pass). 1.16: PsmEncoding.want_importance (an encoder
 * skips inspection-only importance weights nothing will read). 1.17:
 * psm_linear_pick_log_softmax (a head's vocabulary loss as one op, so that
 * bf16 training need not keep the scores' gradient). 1.18:
 * psm_vocab_truncate and PSM_MAX_WORD_BYTES (raw text decoded by serve or
 * --input leaves a task's word table as it was, and a word longer than the
 * bound reads as <unk>: issue 58). 1.19: psm_maxout (the maxout deep output
 * layer of Gulcehre et al. eq. 3 in the softmax and pointer_softmax heads).
 * 1.20: psm-examples.h (the examples store the sequence-to-sequence tasks
 * fill, and its batches); PsmTaskClass.train_batch and eval_batch optional
 * for a task with eval_batch_of, psm_task_train_batch and
 * psm_task_eval_batch (issue 60: the three tasks had one batch filler
 * copied three times). 1.21: psm_json_string_fields (one JSON object's
 * string fields, for psm-run convert's streaming read of exported
 * datasets: the reader the tasks use, not a second one). */
#define PSM_ABI_MAJOR 1
#define PSM_ABI_MINOR 21
#define PSM_PLUGIN_ENTRY_SYMBOL "psm_plugin_entry"

typedef enum {
  PSM_KIND_ENCODER = 1,
  PSM_KIND_DECODER,
  PSM_KIND_HEAD,
  PSM_KIND_TASK,
  PSM_KIND_METRIC,
  PSM_KIND_LAST = PSM_KIND_METRIC
} PsmKind;

typedef struct {
  guint32 struct_size;            /* sizeof (PsmPluginDesc) of the plugin */
  guint16 abi_major, abi_minor;
  PsmKind kind;
  const char *name;               /* file must be psm-<kind>-<name>.so */
  const char *description;        /* one line */
  const PsmParamSpec *params;     /* PSM_PARAM_END-terminated; may be NULL */
  gboolean (*init) (GError **error);  /* once, at load; may be NULL */
  const void *klass;              /* PsmEncoderClass, PsmHeadClass, ... */
} PsmPluginDesc;

typedef const PsmPluginDesc *(*PsmPluginEntry) (void);

/* A field appended to a struct that starts with its size, or missing if
 * the struct is older than the field (built for an older minor ABI). */
#define PSM_STRUCT_FIELD(s, field, missing) \
  ((s)->size >= G_STRUCT_OFFSET (__typeof__ (*(s)), field) + sizeof ((s)->field) ? (s)->field : (missing))
/* Whether a class struct (starting with its size) has an appended hook: a
 * plugin built for an older minor ABI does not, and the hook counts as NULL. */
#define PSM_CLASS_HOOK(klass, field) PSM_STRUCT_FIELD (klass, field, NULL)

#define PSM_PLUGIN(kind_, name_, desc_, params_, init_, klass_)                 \
  G_MODULE_EXPORT const PsmPluginDesc *psm_plugin_entry (void);                \
  G_MODULE_EXPORT const PsmPluginDesc *psm_plugin_entry (void)                 \
  {                                                                            \
    static const PsmPluginDesc d = { sizeof (PsmPluginDesc), PSM_ABI_MAJOR,    \
                                     PSM_ABI_MINOR, kind_, name_, desc_,       \
                                     params_, init_, klass_ };                 \
    return &d;                                                                 \
  }

#ifndef G_MODULE_EXPORT
#define G_MODULE_EXPORT __attribute__ ((visibility ("default")))
#endif

const char *psm_kind_name (PsmKind kind);   /* "encoder", ..., NULL if bad */
gboolean psm_kind_from_name (const char *name, PsmKind *kind);

/* A loaded plugin (never unloaded). */
typedef struct {
  const PsmPluginDesc *desc;
  char *path;
} PsmPlugin;


/* Search path: $PSM_PLUGIN_PATH (':'-separated), then the installed plugin
 * directory. Returned array owned by the loader. */
const char *const *psm_plugin_path (void);
/* Load one file (checks everything above). */
const PsmPlugin *psm_plugin_load_file (const char *path, GError **error);
/* Find psm-<kind>-<name>.so on the search path and load it. */
const PsmPlugin *psm_plugin_find (PsmKind kind, const char *name, GError **error);
/* Load every psm-*.so on the path (the first of a basename wins); errors of
 * single files are appended to `errors` (may be NULL). Returns a GPtrArray of
 * const PsmPlugin * sorted by kind then name; free with g_ptr_array_unref. */
GPtrArray *psm_plugin_load_all (GPtrArray *errors);

/* The hooks of a loaded plugin's class, in the order of its kind's class
 * struct, required ones first: name, whether the core requires it, whether
 * the plugin sets it. Fills at most max entries; returns how many there are. */
typedef struct {
  const char *name;
  gboolean required;
  gboolean set;
} PsmHookInfo;
int psm_plugin_hooks (const PsmPlugin *pl, PsmHookInfo *out, int max);

G_END_DECLS
#endif
