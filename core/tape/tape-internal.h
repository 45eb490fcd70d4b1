/* tape-internal.h — the tape (core/tape/): the closed set of ops and the
 * nodes recorded for them, the arena, profiling, slots where the ops keep
 * their state on a graph, a graph's weights (parameter memory, packings,
 * precision flags) and the parameters' internals. */
#ifndef PSM_TAPE_INTERNAL_H
#define PSM_TAPE_INTERNAL_H
#include "kernels/kernels-internal.h"

/* The closed set of ops. Adding an op: one file in core/ops/ (forward and
 * backward) plus one name here (before PSM_OP_COUNT) and one row in
 * ops/op-table.c. */
typedef enum {
  PSM_OP_MATMUL, PSM_OP_LINEAR, PSM_OP_ADD, PSM_OP_MUL, PSM_OP_SCALE, PSM_OP_SIGMOID, PSM_OP_TANH, PSM_OP_RELU,
  PSM_OP_SOFTMAX, PSM_OP_LOG_SOFTMAX, PSM_OP_EMBEDDING, PSM_OP_GATHER_ROWS, PSM_OP_PICK, PSM_OP_CONCAT, PSM_OP_SLICE,
  PSM_OP_TRANSPOSE01, PSM_OP_SUM, PSM_OP_MEAN, PSM_OP_NLL, PSM_OP_CROSS_ENTROPY, PSM_OP_BCE_LOGITS, PSM_OP_GRU_CELL,
  PSM_OP_GRU_SEQ, PSM_OP_LSTM_CELL, PSM_OP_LSTM_SEQ, PSM_OP_DEFER_VALUES, PSM_OP_ATTEND, PSM_OP_ADDITIVE_ATTENTION,
  PSM_OP_SET_STEP, PSM_OP_SCATTER_ADD, PSM_OP_GATHER_MASS, PSM_OP_PICK_LOG_SOFTMAX, PSM_OP_MIXTURE_NLL,
  PSM_OP_COVERAGE_LOSS, PSM_OP_MUL_ROWS, PSM_OP_AFFINE, PSM_OP_LOG, PSM_OP_LOCKED_DROPOUT, PSM_OP_WINDOW_SCORES,
  PSM_OP_SENTINEL_NLL, PSM_OP_CONCAT_STEPS, PSM_OP_GATHER_COLS, PSM_OP_NOISY_TANH, PSM_OP_LOGSUMEXP,
  PSM_OP_DOT_SCORES, PSM_OP_BATCH_MAJOR, PSM_OP_EMBEDDING_LINEAR, PSM_OP_DROPOUT_LINEAR, PSM_OP_SCATTER_ROWS,
  PSM_OP_LINEAR_BF16, PSM_OP_LINEAR_PICK_LOG_SOFTMAX, PSM_OP_DEFER_WEIGHT, PSM_OP_MAXOUT, PSM_OP_COUNT
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

/* Packed weights (psm-weights.c): OpenBLAS packs its B operand on every
 * call, which for a decoder step's 16-row GEMMs costs more than the
 * product. A graph knows which memory holds parameters (psm_param
 * registers it; constant from a reset to the end of the backward) and
 * keeps op(W) packed per weight until the next reset, or with keep (the
 * decoding graph; an evaluation's batches) until psm_graph_clear_packed.
 * A reset without keep, or psm_graph_stale_packed, marks them stale: the
 * next request packs again into the same memory, over the threads. */
void psm_graph_const_range (PsmGraph *g, const float *data, size_t n);
gboolean psm_graph_is_const (PsmGraph *g, const float *data);
const float *psm_graph_packed (PsmGraph *g, const float *w, int K, int n, gboolean tb);
void psm_graph_keep_packed (PsmGraph *g, gboolean keep);
void psm_graph_stale_packed (PsmGraph *g);
void psm_graph_clear_packed (PsmGraph *g);
/* decode.precision bf16, set on the decoding graph, and train.precision
 * bf16, set by the model on its training graph (kernels/bf16.c). */
void psm_graph_set_bf16 (PsmGraph *g, gboolean on);
gboolean psm_graph_bf16 (const PsmGraph *g);
void psm_graph_set_bf16_train (PsmGraph *g, gboolean on);
gboolean psm_graph_bf16_train (const PsmGraph *g);

/* The weight plan: how one product x W of an op (R rows; W a K x n
 * tensor) runs, chosen once, by psm_weight_plan, for every op that
 * multiplies by a weight; the first that holds of:
 *   BF16_TRAIN  train.precision bf16, gradients, and an op with the
 *               bfloat16 backward (PSM_PLAN_BF16_TRAIN): x W, dy W^T and
 *               x^T dy on bfloat16 operands, single-precision sums;
 *   BF16        decode.precision bf16 and no gradients: x W so;
 *   PACKED      psm_gemm_packed on W packed (a build with the packed
 *               kernel; not with PSM_PLAN_NO_PACKED) for few rows, any
 *               number without gradients (the wide kernel), or a
 *               sequence's steps (PSM_PLAN_ANY_ROWS); in any build for
 *               an op whose own switch asked for its packed kernel
 *               (PSM_PLAN_PACKED: psm_paths.dropout_linear, gru_packed);
 *   BLAS        psm_gemm on W as it is.
 * All but BLAS need W to be a parameter (constant on the graph).
 * psm_weight_operand: W in the path's packing, made when first asked for
 * (then kept in op, and on the graph as above; g may be NULL once made),
 * W itself on BLAS. defer: W's gradient summed once after all the steps
 * (ops-internal.h), for a product with gradients of at most
 * PSM_PACKED_MAX_ROWS rows of an op that can (PSM_PLAN_DEFER).
 * psm_weight_transposed: W^T so packed for dx = dy W^T (PACKED and
 * BF16_TRAIN; else NULL). psm_weight_gemm: y = x W + bias (NULL: none),
 * or y += x W with acc (on BLAS not both). */
typedef enum { PSM_WEIGHT_BLAS, PSM_WEIGHT_PACKED, PSM_WEIGHT_BF16, PSM_WEIGHT_BF16_TRAIN } PsmWeightPath;
enum { PSM_PLAN_BF16_TRAIN = 1, PSM_PLAN_ANY_ROWS = 2, PSM_PLAN_NO_PACKED = 4, PSM_PLAN_DEFER = 8, PSM_PLAN_PACKED = 16 };
typedef struct {
  PsmWeightPath path;
  gboolean defer;
  const float *w;
  int K, n;
  const void *op;
} PsmWeightPlan;
PsmWeightPlan psm_weight_plan (PsmGraph *g, const PsmTensor *w, int K, int n, int rows, gboolean grad,
                               unsigned how);
const void *psm_weight_operand (PsmGraph *g, PsmWeightPlan *p);
const void *psm_weight_transposed (PsmGraph *g, const PsmWeightPlan *p);
void psm_weight_gemm (PsmGraph *g, PsmWeightPlan *p, int R, const float *x, int ldx, const float *bias, gboolean acc,
                      float *y, int ldy);

/* Watching gradients (MPI: a bucket reduced while the backward goes on):
 * the buffer [base, base + n) (the parameters' gradients) in buckets of
 * `bucket` floats. psm_backward calls ready (lo, hi, user) with each
 * bucket as soon as no node still to run adds to it, from the last bucket
 * to the first (the same order in every process: a bucket waits for those
 * above it), and poll (user) between nodes while some are still to come.
 * NULL (or bucket 0): off. */
typedef struct {
  float *base;
  size_t n, bucket;
  void (*ready) (size_t lo, size_t hi, void *user);
  void (*poll) (void *user);
  void *user;
} PsmGradWatch;
void psm_graph_watch_grads (PsmGraph *g, const PsmGradWatch *w);

/* Record a node when gradients flow to any input; returns NULL otherwise. */
PsmNode *psm_graph_record (PsmGraph *g, PsmOpKind op, PsmTensor *out, int n_in, PsmTensor *const *in);
/* Output tensor for an op over inputs: requires grad if any input does. */
PsmTensor *psm_op_out (PsmGraph *g, int ndim, const int *shape, int n_in, PsmTensor *const *in);
gboolean psm_needs_grad (PsmGraph *g, int n_in, PsmTensor *const *in);
/* Copy caller data into the arena (for masks/ids saved by a node). */
void *psm_graph_dup (PsmGraph *g, const void *src, size_t bytes);
void *psm_graph_alloc (PsmGraph *g, size_t bytes);

/* The sum of x_i^2 in double, over chunks as psm_params_grad_norm (its
 * square): the norm of a gradient held in parts (MPI shards). */
double psm_sumsq (const float *x, size_t n);
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
