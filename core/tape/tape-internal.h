/* tape-internal.h — the tape (core/tape/): the closed set of ops and the
 * nodes recorded for them, the arena, profiling, slots where the ops keep
 * their state on a graph, a graph's weights (parameter memory, packings,
 * precision flags) and the parameters' internals. */
#ifndef PSM_TAPE_INTERNAL_H
#define PSM_TAPE_INTERNAL_H
#include "kernels/kernels-internal.h"

/* The closed set of ops. Adding an op: one file in core/ops/ (forward and
 * backward) plus one row here and one in ops/op-table.c. */
typedef enum {
  PSM_OP_MATMUL,
  PSM_OP_LINEAR,
  PSM_OP_ADD,
  PSM_OP_MUL,
  PSM_OP_SCALE,
  PSM_OP_SIGMOID,
  PSM_OP_TANH,
  PSM_OP_RELU,
  PSM_OP_SOFTMAX,
  PSM_OP_LOG_SOFTMAX,
  PSM_OP_EMBEDDING,
  PSM_OP_GATHER_ROWS,
  PSM_OP_PICK,
  PSM_OP_CONCAT,
  PSM_OP_SLICE,
  PSM_OP_TRANSPOSE01,
  PSM_OP_SUM,
  PSM_OP_MEAN,
  PSM_OP_NLL,
  PSM_OP_CROSS_ENTROPY,
  PSM_OP_BCE_LOGITS,
  PSM_OP_GRU_CELL,
  PSM_OP_GRU_SEQ,
  PSM_OP_LSTM_CELL,
  PSM_OP_LSTM_SEQ,
  PSM_OP_DEFER_VALUES,
  PSM_OP_ATTEND,
  PSM_OP_ADDITIVE_ATTENTION,
  PSM_OP_SET_STEP,
  PSM_OP_SCATTER_ADD,
  PSM_OP_GATHER_MASS,
  PSM_OP_PICK_LOG_SOFTMAX,
  PSM_OP_MIXTURE_NLL,
  PSM_OP_COVERAGE_LOSS,
  PSM_OP_MUL_ROWS,
  PSM_OP_AFFINE,
  PSM_OP_LOG,
  PSM_OP_LOCKED_DROPOUT,
  PSM_OP_WINDOW_SCORES,
  PSM_OP_SENTINEL_NLL,
  PSM_OP_CONCAT_STEPS,
  PSM_OP_GATHER_COLS,
  PSM_OP_NOISY_TANH,
  PSM_OP_LOGSUMEXP,
  PSM_OP_DOT_SCORES,
  PSM_OP_BATCH_MAJOR,
  PSM_OP_EMBEDDING_LINEAR,
  PSM_OP_DROPOUT_LINEAR,
  PSM_OP_SCATTER_ROWS,
  PSM_OP_LINEAR_BF16,
  PSM_OP_LINEAR_PICK_LOG_SOFTMAX,
  PSM_OP_DEFER_WEIGHT,
  PSM_OP_MAXOUT,
  PSM_OP_COUNT
} PsmOpKind;

#define PSM_NODE_MAX_IN 6

typedef struct PsmNode PsmNode;
struct PsmNode {
  PsmOpKind op;
  int phase;             /* PsmPhase when recorded (profiling) */
  PsmTensor *out;
  PsmTensor *in[PSM_NODE_MAX_IN];
  void *saved;           /* op-specific, in the arena */
  const void *aux[2];    /* caller arrays (ids, masks), copied to the arena */
  int iarg[4];
  float farg[2];
};

typedef void (*PsmBackwardFn) (PsmNode *node);

typedef struct {
  const char *name;
  PsmBackwardFn backward;
} PsmOpInfo;

extern const PsmOpInfo psm_op_table[PSM_OP_COUNT];
/* The op whose backward PSM_MUTATE_BACKWARD names (-1: none); psm-graph.c. */
int psm_mutant_op (void);

/* Profiling (psm-run --profile, bench/bench-see): the model marks the phase
 * of a step it is in; a graph with a profile attached adds the wall time
 * of every op to its (phase, op) cell, forward (the time since the previous
 * op or phase mark, ops running eagerly) and backward. */
typedef enum {
  PSM_PHASE_OTHER, PSM_PHASE_ENCODER, PSM_PHASE_DECODER, PSM_PHASE_HEAD, PSM_PHASE_COUNT
} PsmPhase;
typedef struct {
  double fwd[PSM_PHASE_COUNT][PSM_OP_COUNT];
  double bwd[PSM_PHASE_COUNT][PSM_OP_COUNT];
  double optim;          /* clipping, update, zeroing: psm_train adds it */
  long steps;
} PsmProfile;
extern const char *const psm_phase_names[PSM_PHASE_COUNT];
void psm_graph_set_profile (PsmGraph *g, PsmProfile *prof);   /* NULL: off */
PsmProfile *psm_graph_profile (PsmGraph *g);
void psm_graph_phase (PsmGraph *g, PsmPhase phase);
/* Prints the profile as a table: per phase, its ops by time. */
void psm_profile_print (const PsmProfile *prof, FILE *out);

/* Packed weights for GEMMs of few rows (psm-weights.c). OpenBLAS packs
 * its B operand on every call, which for the 16-row GEMMs of a decoder step
 * costs more than the product. A graph knows which memory holds parameters
 * (psm_param registers the block) and keeps op(W) packed (psm_pack layout)
 * per weight until the next reset: the parameters do not change between a
 * reset and the end of the backward pass. With keep set (the decoding
 * graph) the packed copies outlive resets until psm_graph_clear_packed,
 * which decoding calls when it starts. Without keep a reset marks them
 * stale (as psm_graph_stale_packed does): the next request for the same
 * op(W) packs it again into the same memory (its pages already mapped)
 * over the threads. An evaluation sets keep on the training graph for its
 * batches, stale at its start and at its end. */
void psm_graph_const_range (PsmGraph *g, const float *data, size_t n);
gboolean psm_graph_is_const (PsmGraph *g, const float *data);
const float *psm_graph_packed (PsmGraph *g, const float *w, int K, int n, gboolean tb);
/* The same for a sequence op's W (K x n, contiguous) when it is a
 * parameter, else NULL: the op packs a copy of its own. */
const float *psm_graph_packed_param (PsmGraph *g, const PsmTensor *w, int K, int n, gboolean tb);
void psm_graph_keep_packed (PsmGraph *g, gboolean keep);
/* decode.precision bf16 (kernels/bf16.c): set on the decoding graph, the
 * products of a parameter W without a gradient (psm_linear,
 * embedding_linear, the LSTM and GRU cells and sequences) run in bfloat16
 * (psm_gemm_bf16). psm_graph_bf16_weight is the one test of that for all
 * of them: W (K x n) packed for psm_gemm_bf16 once a graph and kept as the
 * other packings, when the graph is bf16, the product has no gradient
 * (grad FALSE) and W is constant on the graph; else NULL (fp32). */
void psm_graph_set_bf16 (PsmGraph *g, gboolean on);
gboolean psm_graph_bf16 (const PsmGraph *g);
const void *psm_graph_bf16_weight (PsmGraph *g, const float *w, int K, int n, gboolean grad);
/* train.precision bf16: set by the model on its training graph (an
 * evaluation on it has no gradients and is untouched), the products with
 * gradients of a parameter W in psm_linear and in psm_lstm_seq's
 * recurrence run in bfloat16 both ways (x W, dy W^T and x^T dy, all summed
 * in single precision; the gradients land in the fp32 weights' buffers).
 * psm_graph_bf16_train_weight gives op(W) (K x n) packed for psm_gemm_bf16
 * once a graph when the flag is set and W is constant on the graph, else
 * NULL. */
void psm_graph_set_bf16_train (PsmGraph *g, gboolean on);
gboolean psm_graph_bf16_train (const PsmGraph *g);
const void *psm_graph_bf16_train_weight (PsmGraph *g, const float *w, int K, int n, gboolean tb);

void psm_graph_stale_packed (PsmGraph *g);
void psm_graph_clear_packed (PsmGraph *g);

/* Record a node when gradients flow to any input; returns NULL otherwise. */
PsmNode *psm_graph_record (PsmGraph *g, PsmOpKind op, PsmTensor *out, int n_in, PsmTensor *const *in);
/* Output tensor for an op over inputs: requires grad if any input does. */
PsmTensor *psm_op_out (PsmGraph *g, int ndim, const int *shape, int n_in, PsmTensor *const *in);
gboolean psm_needs_grad (PsmGraph *g, int n_in, PsmTensor *const *in);
/* Copy caller data into the arena (for masks/ids saved by a node). */
void *psm_graph_dup (PsmGraph *g, const void *src, size_t bytes);
void *psm_graph_alloc (PsmGraph *g, size_t bytes);

/* Whether a product of that many rows against a constant W takes the
 * packed path: few rows in any graph; any number in a graph without
 * gradients (decoding, validation) where the wide kernel is built. */
static inline gboolean
psm_packed_rows_ok (const PsmGraph *g, int rows)
{
  return PSM_PACK_FAST && (rows <= PSM_PACKED_MAX_ROWS || (PSM_PACK_WIDE && !psm_graph_grad_enabled (g)));
}

/* psm_params_finalize, but the values are drawn (from a copy of rng, as
 * finalize would draw them) only when psm_param or psm_params_data first
 * reads them: a model whose parameters come from a checkpoint
 * (psm_params_set_data) never draws them (psm_model_new; 0.6 s of a
 * 44 M-parameter decoder's start). */
gboolean psm_params_finalize_deferred (PsmParams *p, const PsmRng *rng, GError **error);
/* Every parameter's value from src (psm_params_size floats). */
void psm_params_set_data (PsmParams *p, const float *src);
/* TRUE while the values are still to be drawn (for the tests). */
gboolean psm_params_deferred (const PsmParams *p);
/* Slots: an op family's state on a graph (its side tables), made zeroed
 * by psm_graph_slot on first use, passed to reset at every psm_graph_reset
 * (NULL: kept across resets) and to free with the graph. The class's
 * address is the key; psm_graph_slot_get gives NULL while none is made. */
typedef struct {
  size_t size;
  void (*reset) (PsmGraph *g, void *state);
  void (*free) (void *state);   /* what the state owns; NULL: nothing */
} PsmGraphSlotClass;
#define PSM_GRAPH_MAX_SLOTS 8
void *psm_graph_slot (PsmGraph *g, const PsmGraphSlotClass *k);
void *psm_graph_slot_get (const PsmGraph *g, const PsmGraphSlotClass *k);
#endif
