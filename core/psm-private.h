/* psm-private.h — internals shared by core files (not installed). */
#ifndef PSM_PRIVATE_H
#define PSM_PRIVATE_H
#include <math.h>
#include "psm/psm.h"
#include "psm/psm-pipeline.h"

/* The closed set of ops. Adding an op: one file in core/ops/ (forward and
 * backward) plus one row here and one in psm-op-table.c. */
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

/* core/psm-dist.c: sums and broadcasts over the MPI ranks (no-ops on one) */
void psm_dist_sum_float (float *buf, size_t n);
void psm_dist_sum_double (double *buf, size_t n);
void psm_dist_bcast (void *buf, size_t bytes);   /* from rank 0 */
double psm_dist_time (void);
/* Every rank's bytes on rank 0, in rank order (an array of GBytes); NULL
 * on the other ranks. One rank: an array of its own. */
GPtrArray *psm_dist_gather_bytes (GBytes *mine);
/* Rank 0: where the ranks run ("N MPI ranks on H hosts: name (ranks
 * a-b), ..."), g_free; NULL on other ranks and on one. Collective. */
char *psm_dist_hosts (void);
/* Rank 0's bytes (or NULL) on every rank: a new reference. */
GBytes *psm_dist_bcast_bytes (GBytes *b);
/* One update's reduction over the ranks: the gradient and *loss weighted
 * by this rank's share of the batch's target words and summed (one
 * MPI_Allreduce over the gradient buffer), the n values of extra summed as
 * they are. */
void psm_dist_reduce_update (PsmParams *p, double share, double *loss, double *extra, int n);
/* core/psm-batch.c: keeps rows lo .. lo + n - 1 of every [T, B] and [B]
 * array (B becomes n; T, Ty, the OOV words and candidates stay). */
void psm_batch_keep_rows (PsmBatch *b, int lo, int n);
/* Rank rank's rows [*lo, *hi) of n ranks: contiguous, at least one each,
 * with about equal real tokens (the cost of a row). */
void psm_batch_share (const PsmBatch *b, int rank, int n, int *lo, int *hi);
/* Orders the rows by target length (the last step with a real target),
 * longest first, ties in their order; every [T, B], [Ty, B] and [B] array
 * moves with its row. The rows with a target at step t or later are then
 * rows 0 .. R_t - 1 (PSM_DECODER_LIVE_ROWS). FALSE: already in that order. */
gboolean psm_batch_sort_by_target (PsmBatch *b);
/* Lowers T and Ty to the last step any row uses (after keep_rows). */
void psm_batch_trim (PsmBatch *b);
/* Keeps rank's share of the rows (psm_batch_share, keep_rows, trim); its
 * part of the batch's real target words, the weight of its gradient. */
double psm_batch_take_share (PsmBatch *b, int rank, int n);
/* Stream tasks: rank's rows of B by count alone, [B rank / n, B (rank+1) / n)
 * — the same rows at every segment, whatever their tokens, since each rank
 * carries its streams' state — and psm_batch_take_streams keeps them (no
 * trim: a segment's positions stay where the carried state expects them). */
void psm_batch_share_streams (int B, int rank, int n, int *lo, int *hi);
double psm_batch_take_streams (PsmBatch *b, int rank, int n);

/* core/psm-session.c, shared with the training loop (core/psm-train.c) */
gboolean psm_run_optim_config (const PsmSection *s, PsmOptConfig *c);
gboolean psm_run_write_failed (GError **error, const char *path);
gboolean psm_run_log_append (FILE *log, const char *path, const char *record, GError **error);
gboolean psm_run_json_eval (FILE *log, const char *path, long step, const char *split, double t,
                            const PsmEvalResult *r, GError **error);
void psm_run_print_eval (const char *what, long step, const PsmEvalResult *r, gboolean best);

/* Deferred gradient of attention values (core/ops/attention.c). Every
 * decoding step's attention adds a[b, i] dctx[b] to the gradient of the
 * annotations [T, B, H], a read-modify-write of all of them per step. Once
 * the core has called psm_defer_values_grad on the annotations, the
 * attention ops over them only note their (a, dctx) and the op's own node,
 * which runs after all of theirs in the backward pass, adds the whole sum
 * as one GEMM per example: dH[:, b] += A_b^T dC_b. */
typedef struct {
  const float *grad;     /* the values' gradient buffer: the key */
  int T, B, H;
  GArray *steps;         /* const float * pairs: a [R, T], dctx [R, H] */
  GArray *rows;          /* int: each step's R (its rows are 0 .. R - 1) */
} PsmDeferredValues;
void psm_defer_values_grad (PsmGraph *g, PsmTensor *values);
PsmDeferredValues *psm_graph_deferred_values (PsmGraph *g, const float *grad);
PsmDeferredValues *psm_graph_add_deferred_values (PsmGraph *g, const float *grad);

/* Deferred weight gradients (core/ops/matmul.c). A decoder's product x W
 * on its B rows of one step adds x^T dy to W's gradient in the backward: a
 * product of B terms (16 for See et al.'s model) that reads and writes all
 * of dW every step (and a decoder cell's h W_h likewise). For a parameter
 * W (psm_graph_is_const) used so on a training graph, psm_linear and
 * psm_lstm_cell (no mask) note each step's (x, dy) instead, and the
 * node psm_graph_deferred_weight records before W's first such product,
 * whose backward runs after all of theirs, adds the sum over the steps as
 * one product: dW += X^T DY, X and DY the noted rows stacked (with
 * train.precision bf16, psm_linear's bfloat16 product on them). */
typedef struct {
  const float *x, *dy;
  int R;
} PsmDeferredRows;
typedef struct {
  float *grad;           /* W's gradient [K, N]: the key, with bf16 */
  gboolean bf16;         /* train.precision bf16's products (linear_bf16):
                            the sum on rounded operands, psm_gemm_bf16_op */
  int K, N;
  GArray *rows;          /* PsmDeferredRows */
} PsmDeferredWeight;
PsmDeferredWeight *psm_graph_deferred_weight (PsmGraph *g, PsmTensor *w, gboolean bf16);
/* FALSE: nothing deferred (tests compare both ways; default TRUE) */
extern gboolean psm_defer_weights;

/* Batch-major copies for the attention (core/ops/attention.c). Every decoder
 * step's attention reads each example's keys and annotations at all T
 * positions; time-major [T, B, C] puts consecutive positions of an example
 * B C floats apart (32 KB at B 16, C 512), a stride the hardware prefetchers
 * do not follow across pages. psm_attention_batch_major, called by the core
 * on the annotations and the attention memo of a training graph, records a
 * node that copies x into [B, T, C] once; the attention ops over x then read
 * the copy, add their gradient into a [B, T, C] buffer of the entry, and the
 * node's backward, which runs after all of theirs, adds that buffer into
 * x's gradient. Cleared at every reset. */
typedef struct {
  const float *data;     /* x's data: the key */
  const float *xgrad;    /* x's gradient, which the node's backward adds to */
  float *bm;             /* [B, T, C] */
  const uint16_t *bm16;  /* train.precision bf16: bm rounded to bfloat16, which the attention reads; else NULL */
  float *grad;           /* [B, T, C], zeroed when an op first needs it (psm_batch_major_grad); NULL before */
  int T, B, C;
} PsmBatchMajor;
void psm_attention_batch_major (PsmGraph *g, PsmTensor *x);
PsmBatchMajor *psm_graph_batch_major (PsmGraph *g, const float *data, int T, int B, int C);
PsmBatchMajor *psm_graph_add_batch_major (PsmGraph *g, const float *data);
float *psm_batch_major_grad (PsmGraph *g, PsmBatchMajor *e);
/* On by default; off (for tests: the copies must change no result),
 * psm_attention_batch_major makes none. */
void psm_graph_set_batch_major (PsmGraph *g, gboolean on);
gboolean psm_graph_batch_major_on (const PsmGraph *g);

/* Packed weights for GEMMs of few rows (core/ops/matmul.c). OpenBLAS packs
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
/* decode.precision bf16 (ops/bf16.c): set on the decoding graph, the
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
/* ops/bf16.c: x rounded to bfloat16 (to nearest, ties to even); whether
 * the AMX tiles are there and granted (not with PSM_NO_AMX=1); the bytes
 * of W (K x n) packed by psm_bf16_pack (AMX tile pairs, or else psm's
 * single-precision panels of the rounded W); and C[M, N] = bf16 (A) W + bias
 * (bias NULL: none), or C += bf16 (A) W with acc (no bias then), on that
 * packing, summed in single precision. Inside a parallel region it runs on
 * the calling thread alone (a recurrence's rows apart over the threads). */
float psm_bf16_round (float x);
void psm_bf16_round_bits (size_t n, const float *x, uint16_t *out);   /* the bits of n of them */
gboolean psm_amx_usable (void);
extern gboolean psm_bf16_amx;   /* unset: AMX not used (tests run both paths; set it before packing) */
size_t psm_bf16_packed_bytes (int K, int n);
void psm_bf16_pack (int K, int n, const float *w, void *out);
void psm_gemm_bf16 (int M, int N, int K, const float *A, int lda, const void *wp, const float *bias, gboolean acc,
                    float *C, int ldc);
/* The same packing of op(W) (K x n: W[k][c] at w[k ldw + c], or w[c ldw +
 * k] with tb); and C[M, N] (+ with acc)= op(A) op(B), both rounded to
 * bfloat16 (op(A) M x K: A[i][k] at A[i lda + k], or A[k lda + i] with ta),
 * B packed for the call: train.precision's backward products (dW = x^T dy
 * among them). */
void psm_bf16_pack_op (int K, int n, const float *w, int ldw, gboolean tb, void *out);
void psm_gemm_bf16_op (gboolean ta, gboolean tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       gboolean acc, float *C, int ldc);
/* The backward of y = x W + b (x [R, K], W [K, N]) in bfloat16: dx += dy
 * W^T on W^T packed (wtp: psm_bf16_pack_op of W^T), dW += x^T dy and db
 * += the column sums of dy (single precision), dy read once for all three
 * on AMX (dx, dw or db NULL: not that one). */
void psm_linear_bf16_grads (int R, int K, int N, const float *x, const float *dy, const void *wtp, float *dx, float *dw,
                            float *db);
/* The same with dy the gradient of the scores z [R, N] under log softmax
 * picks (psm_linear_pick_log_softmax): dy[i] = d_i (e_{t_i} - exp (z_i -
 * lse_i)), zero where t_i < 0; on AMX made as it is rounded, never stored. */
void psm_linear_bf16_pick_grads (int R, int K, int N, const float *x, const float *z, const float *lse, const int32_t *t,
                                 const float *d, const void *wtp, float *dx, float *dw, float *db);
/* A recurrence's step split by W's columns over a team (lstm.c, AMX
 * only): the bytes of A [M, K] rounded into tiles; its rows [i0, i1)
 * rounded by the calling thread (i0 a multiple of 16); C = A W for the
 * calling thread's part of W's column panels (part of parts). */
size_t psm_bf16_tiles_bytes (int M, int K);
void psm_bf16_tiles_rows (int M, int K, const float *A, int lda, void *tiles, int i0, int i1);
void psm_gemm_bf16_tiles (int M, int N, int K, const void *tiles, const void *wp, float *C, int ldc, int part, int parts);
void psm_graph_stale_packed (PsmGraph *g);
void psm_graph_clear_packed (PsmGraph *g);
/* C[M, N] = A[M, K] op(W) + bias (bias NULL: none), or C += A op(W) with
 * acc; op(W) packed by psm_graph_packed; the column panels split over the
 * threads, each storing straight into C. */
void psm_gemm_packed (int M, int N, int K, const float *A, int lda, const float *wp, const float *bias, gboolean acc,
                      float *C, int ldc);
/* The rows up to which a GEMM uses packed weights when it can (in a graph
 * without gradients, where the wide kernel is built, any number:
 * psm_packed_rows_ok). */
#define PSM_PACKED_MAX_ROWS 64
/* The attention ops (additive.c, attention.c) split their rows over threads
 * when rows x positions x features reach this much work. */
#define PSM_ATTN_PAR(R, T, C) ((long) (R) * (T) * (C) >= 32768)

/* Beam expansion (decoding): the core repeats each article's annotations
 * and attention memo once per beam ([T, B K, C] from [T, B, C]) for the
 * decoder plugins, and notes here which compact tensor each repeat came
 * from; the attention op, without gradients, then reads the compact one
 * once for all the beams of an article. Kept across resets, cleared by the
 * core for every new batch. */
void psm_graph_add_repeat (PsmGraph *g, const float *repeated, const float *compact, int group);
const float *psm_graph_repeat_of (PsmGraph *g, const float *repeated, int *group);
void psm_graph_clear_repeats (PsmGraph *g);

/* Embedding lookups: psm_embedding notes that its n rows (at rows) are
 * table[ids], and psm_linear, given them as x, projects each distinct id
 * once (the embedding_linear path of psm_linear, core/ops/matmul.c). The output of an op is
 * never written in place, so the note holds until the next reset (the
 * last four lookups are kept). */
/* Whether a lookup of R rows holding u distinct ids is projected that way:
 * more rows than a packed GEMM takes, a quarter or more repeating an id
 * (below that the copies cost more than the rows saved). */
#define PSM_PROJECT_DISTINCT(u, R) ((R) > PSM_PACKED_MAX_ROWS && (long) (u) * 4 <= (long) (R) * 3)
void psm_graph_note_lookup (PsmGraph *g, const float *rows, PsmTensor *table, const int32_t *ids, int n);
PsmTensor *psm_graph_lookup_of (PsmGraph *g, const float *rows, int n, const int32_t **ids);
/* Locked dropouts likewise: psm_locked_dropout notes that its output (n
 * floats at rows) is its input times mask [period], repeated every period
 * floats; psm_linear, given it as x, skips the dropped units in its
 * products (dropout_linear, core/ops/matmul.c) when psm_dropout_linear
 * is set: by default where the packed kernel is fast (PSM_PACK_FAST; a
 * baseline build keeps BLAS's dense product), and by tests either way, to
 * compare the paths and to check the skipping one's gradient in any build.
 * The last four are kept until the next reset. */
void psm_graph_note_dropout (PsmGraph *g, const float *rows, size_t n, const float *mask, size_t period);
const float *psm_graph_dropout_of (PsmGraph *g, const float *rows, size_t n, size_t *period);
extern gboolean psm_dropout_linear;
/* The GEMM FLOPs those products left out (forward and backward), added up
 * for bench-lm's count of the FLOPs executed. */
extern double psm_dropout_flops_skipped;

/* Record a node when gradients flow to any input; returns NULL otherwise. */
PsmNode *psm_graph_record (PsmGraph *g, PsmOpKind op, PsmTensor *out, int n_in, PsmTensor *const *in);
/* Output tensor for an op over inputs: requires grad if any input does. */
PsmTensor *psm_op_out (PsmGraph *g, int ndim, const int *shape, int n_in, PsmTensor *const *in);
gboolean psm_needs_grad (PsmGraph *g, int n_in, PsmTensor *const *in);
/* Copy caller data into the arena (for masks/ids saved by a node). */
void *psm_graph_dup (PsmGraph *g, const void *src, size_t bytes);
void *psm_graph_alloc (PsmGraph *g, size_t bytes);

/* Per-op backward functions, defined in core/ops/. */
#define PSM_DECLARE_BACKWARD(name) void psm_##name##_backward (PsmNode *node)
PSM_DECLARE_BACKWARD (matmul);
PSM_DECLARE_BACKWARD (locked_dropout);
PSM_DECLARE_BACKWARD (window_scores);
PSM_DECLARE_BACKWARD (sentinel_nll);
PSM_DECLARE_BACKWARD (linear);
PSM_DECLARE_BACKWARD (embedding_linear);
PSM_DECLARE_BACKWARD (dropout_linear);
PSM_DECLARE_BACKWARD (linear_bf16);
PSM_DECLARE_BACKWARD (linear_pick_log_softmax);
PSM_DECLARE_BACKWARD (add);
PSM_DECLARE_BACKWARD (mul);
PSM_DECLARE_BACKWARD (scale);
PSM_DECLARE_BACKWARD (sigmoid);
PSM_DECLARE_BACKWARD (tanh);
PSM_DECLARE_BACKWARD (relu);
PSM_DECLARE_BACKWARD (maxout);
PSM_DECLARE_BACKWARD (softmax);
PSM_DECLARE_BACKWARD (log_softmax);
PSM_DECLARE_BACKWARD (embedding);
PSM_DECLARE_BACKWARD (gather_rows);
PSM_DECLARE_BACKWARD (scatter_rows);
PSM_DECLARE_BACKWARD (pick);
PSM_DECLARE_BACKWARD (concat);
PSM_DECLARE_BACKWARD (concat_steps);
PSM_DECLARE_BACKWARD (gather_cols);
PSM_DECLARE_BACKWARD (noisy_tanh);
PSM_DECLARE_BACKWARD (logsumexp);
PSM_DECLARE_BACKWARD (dot_scores);
PSM_DECLARE_BACKWARD (slice);
PSM_DECLARE_BACKWARD (transpose01);
PSM_DECLARE_BACKWARD (sum);
PSM_DECLARE_BACKWARD (mean);
PSM_DECLARE_BACKWARD (nll);
PSM_DECLARE_BACKWARD (cross_entropy);
PSM_DECLARE_BACKWARD (bce_logits);
PSM_DECLARE_BACKWARD (gru_cell);
PSM_DECLARE_BACKWARD (gru_seq);
PSM_DECLARE_BACKWARD (lstm_cell);
PSM_DECLARE_BACKWARD (lstm_seq);
PSM_DECLARE_BACKWARD (defer_values);
PSM_DECLARE_BACKWARD (defer_weight);
PSM_DECLARE_BACKWARD (batch_major);
PSM_DECLARE_BACKWARD (attend);
PSM_DECLARE_BACKWARD (additive_attention);
PSM_DECLARE_BACKWARD (set_step);
PSM_DECLARE_BACKWARD (scatter_add);
PSM_DECLARE_BACKWARD (gather_mass);
PSM_DECLARE_BACKWARD (pick_log_softmax);
PSM_DECLARE_BACKWARD (mixture_nll);
PSM_DECLARE_BACKWARD (coverage_loss);
PSM_DECLARE_BACKWARD (mul_rows);
PSM_DECLARE_BACKWARD (affine);
PSM_DECLARE_BACKWARD (log);

/* GEMM wrapper: C[M,N] = alpha op(A) op(B) + beta C, row-major. */
void psm_gemm (gboolean ta, gboolean tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* out[C] += sum over the R rows of x[R, C] (bias gradients). */
void psm_colsum_add (int R, int C, const float *x, float *out);

static inline float psm_sigmoidf (float x) { return 1.0f / (1.0f + expf (-x)); }

/* a . b, vectorised (the ops' dot product over a row). */
static inline float
psm_dotf (const float *a, const float *b, int n)
{
  float s = 0.0f;
#pragma omp simd reduction (+:s)
  for (int j = 0; j < n; j++)
    s += a[j] * b[j];
  return s;
}

/* Few-row GEMM against a matrix packed once (core/ops/packgemm.c).
 * psm_pack packs columns [0, n) of op(B) (K x n, op = transpose when tb; to
 * start at column c, pass B + c, or B + c * ldb when tb) into
 * psm_packed_floats (K, n) floats; psm_packed_gemm then sets
 * C[M, 0..n) = A[M, K] op(B) and writes zeros up to the next multiple of
 * PSM_PACK_NR columns, so ldc must leave room for them. Panel p of a packing
 * starts at float p * K * PSM_PACK_NR, so threads can pack panels apart. */
#if defined (PSM_FORCE_VL)
/* a width other than the target's registers' (e.g. -DPSM_FORCE_VL=16 on an
 * AVX2 machine): the layouts and loops of an AVX-512 build, in vectors GCC
 * splits, so that its tests can run on a CPU without AVX-512 */
#define PSM_PACK_VL PSM_FORCE_VL
#elif defined (__AVX512F__)
#define PSM_PACK_VL 16   /* floats per vector register */
#elif defined (__AVX__)
#define PSM_PACK_VL 8
#else
#define PSM_PACK_VL 4
#endif
#define PSM_PACK_NR (2 * PSM_PACK_VL)
/* Whether it beats BLAS: where the build targets vector FMA (e.g.
 * -march=native on a current x86-64); a baseline build keeps BLAS, whose
 * kernels are chosen at run time. */
#if defined (__AVX512F__) || (defined (__AVX2__) && defined (__FMA__))
#define PSM_PACK_FAST 1
#else
#define PSM_PACK_FAST 0
#endif
/* The wide kernel (packgemm.c): with AVX-512 registers, 6 rows against two
 * panels at a time, for products of PSM_PACK_WIDE_ROWS rows or more (a
 * thread's 16 rows of the LM's recurrence, against a 6.8 MB packing, ran
 * 5-10 % slower on it than on the 8-row kernel, 60 rows 5-7 % faster:
 * bench-packed 650 2600); and then also the decoding graphs' products of
 * more than PSM_PACKED_MAX_ROWS rows take the packed path
 * (psm_packed_rows_ok). psm_packed_gemm_rows has its own rule: rows read
 * by index from PSM_PACK_WIDE_ROWS, rows read in place at any count
 * (dropout_linear's backward blocks of 12; packgemm.c says why). */
#if PSM_PACK_VL == 16 && PSM_PACK_FAST
#define PSM_PACK_WIDE 1
#else
#define PSM_PACK_WIDE 0
#endif
#define PSM_PACK_WIDE_ROWS 48
/* Whether a product of that many rows against a constant W takes the
 * packed path: few rows in any graph; any number in a graph without
 * gradients (decoding, validation) where the wide kernel is built. */
static inline gboolean
psm_packed_rows_ok (const PsmGraph *g, int rows)
{
  return PSM_PACK_FAST && (rows <= PSM_PACKED_MAX_ROWS || (PSM_PACK_WIDE && !psm_graph_grad_enabled (g)));
}
/* psm_gru_seq runs on packed weights when set (default PSM_PACK_FAST),
 * else on one psm_gemm per step; tests set it both ways. */
extern gboolean psm_gru_packed;
/* Beam search skips a row's scores that cannot enter the list (all but a
 * few once it is full) by one vector compare against a float floor; tests
 * turn it off to compare (core/psm-decode.c). */
extern gboolean psm_beam_floor;
/* Tests: FALSE asks the scorer for every row at every step (as psm did
 * before it skipped the first step's repeated beams and the rows of
 * finished articles); psm_beam_rows counts the rows asked for. */
extern gboolean psm_beam_skip_rows;
extern long psm_beam_rows;
/* That floor: x <= psm_beam_score_floor (last, logp) implies logp + x <= last. */
float psm_beam_score_floor (double last, double logp);
/* Panels holding n columns; n padded to them is psm_pack_panels (n) * PSM_PACK_NR. */
static inline int psm_pack_panels (int n) { return (n + PSM_PACK_NR - 1) / PSM_PACK_NR; }
size_t psm_packed_floats (int K, int n);
/* Packings of more bytes than this are streamed from beyond L2, and the
 * kernel prefetches the next panel as it goes (packgemm.c says why). */
#define PSM_PACK_PREFETCH_BYTES ((size_t) 1 << 20)
void psm_pack (int K, int n, const float *B, int ldb, gboolean tb, float *out);
void psm_packed_gemm (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc);
/* The same storing exactly columns [0, n) of C: A op(B) + bias (bias NULL:
 * none), or C += A op(B) with acc. */
void psm_packed_gemm_store (int M, int K, int n, const float *A, int lda, const float *Bp, float *C, int ldc,
                            const float *bias, gboolean acc);
/* The general form, on one thread: row i < M of C is cr[i] and of A ar[i]
 * (K floats); the k-th float of a row of A meets row kidx[k] of the
 * packing (NULL: row k), so a product can skip the rows that only meet
 * zeros. Panels [p0, p1) of columns, panel p at Bp + (p - p0) pstride;
 * stores columns [p PSM_PACK_NR, min (n, (p + 1) PSM_PACK_NR)) of each
 * row of C: A op(B) + bias (bias [n] or NULL), or C += A op(B) with acc. */
void psm_packed_gemm_rows (int M, int K, int n, int p0, int p1, const float *const *ar, const int32_t *kidx,
                           const float *Bp, size_t pstride, float *const *cr, const float *bias, gboolean acc);
/* Whole-sequence recurrences on packed weights (gru.c, lstm.c): the threads
 * to use for B independent rows, the rows [*b0, *b1) of thread id, and
 * op(W) (K x n) packed into wp by the threads of the enclosing region (with
 * a barrier). */
int psm_pack_threads (int B);
void psm_pack_row_split (int B, int nth, int id, int *b0, int *b1);
void psm_pack_shared (int K, int n, const float *w, int ldw, gboolean tb, float *wp);
/* The rows of [b0, b1) real at step t of mask [T, B] (NULL: all), of x
 * [., B, n], gathered into xc: how many, and where to read them. */
int psm_pack_real_rows (const float *mask, int t, int B, int b0, int b1, const float *x, int n, float *xc,
                        const float **from);
/* And back for a sum: row r of C [., ldc] added to the r-th real row of
 * [b0, b1) at step t of dst [., B, n]. */
void psm_pack_real_rows_add (const float *mask, int t, int B, int b0, int b1, const float *C, int ldc, int n,
                             float *dst);
/* A cell's recurrent GEMMs backward on its real rows: dh += dG W^T (wpt:
 * W^T packed, or NULL), dw += h^T dG; dG [B, N], W [H, N]. */
void psm_cell_recurrent_backward (int B, int H, int N, const float *mask, const float *dG, const float *h,
                                  const float *w, const float *wpt, float *dh, float *dw);

/* malloc / calloc / 64-byte aligned (free with free()) that call
 * psm_out_of_memory instead of returning NULL (core/psm-mem.c). */
void *psm_xmalloc (size_t bytes, const char *what);

/* Run-folder files (core/psm-file.c). psm_fopen_nofollow: fopen's modes
 * "r", "w", "a" (with "b" or "+"), refusing a symbolic link (errno ELOOP).
 * psm_fopen_temp: a new file PATH.tmp.XXXXXX of an unpredictable name for
 * writing ("wb"), its name in *tmp (g_free; set even on failure), to be
 * renamed over path when complete. NULL with errno on failure. */
FILE *psm_fopen_nofollow (const char *path, const char *mode);
FILE *psm_fopen_temp (const char *path, char **tmp);
/* g_strerror (e), with ELOOP said as what it means here (a link). */
const char *psm_file_error (int e);
void *psm_xmalloc0 (size_t bytes, const char *what);
void *psm_xaligned (size_t bytes, const char *what);


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

/* State buffers of an optimiser kind: sgd 0, adagrad 1, adam/adadelta 2
 * (core/psm-optim.c; the checkpoint reader checks against it). */
int psm_optim_kind_slots (PsmOptKind kind);

/* Model internals used by the training loop (core/psm-model*.c). */
PsmGraph *psm_model_graph (PsmModel *m);
PsmBatch *psm_model_batch (PsmModel *m);
PsmPipeline *psm_model_pipeline (PsmModel *m);
/* The task's next training batch of B into psm_model_batch (m), validated. */
gboolean psm_model_train_batch (PsmModel *m, int B, PsmRng *rng, GError **error);
/* --check: every loss of the current batch starts from the same state
 * (stream tasks: no carried state or history) and draws no dropout, so
 * the losses of its steps compare. */
void psm_model_check_mode (PsmModel *m);
/* TRUE: every teacher-forced decoder step runs on all of the batch's rows,
 * in the task's order (the tests' reference for PSM_DECODER_LIVE_ROWS). */
void psm_model_set_all_rows (PsmModel *m, gboolean all);
gboolean psm_model_streams (PsmModel *m);   /* a language model over streams */
/* Keeps rank's share of the model's batch: psm_batch_take_streams for a
 * language model over streams, else psm_batch_take_share; returns it. */
double psm_model_take_share (PsmModel *m, int rank, int n);
/* The task's save() into a new run folder (no-op without the hook). */
gboolean psm_model_save_task (PsmModel *m, const char *dir, GError **error);
/* Stream tasks: what --resume needs beyond parameters and optimiser — the
 * task's training cursor (PsmTaskClass.train_cursor), the encoder state
 * carried into the next training segment and the head's history; NULL for
 * other tasks. Restoring checks it against this model and training batches
 * of B, then seeks the task; on error nothing is changed. */
GBytes *psm_model_stream_state (PsmModel *m);
gboolean psm_model_restore_stream_state (PsmModel *m, GBytes *state, int B, GError **error);
/* Over MPI ranks, each holding streams [lo, lo + n) of B: restoring takes
 * those rows of a whole state; merging puts the ranks' states (in rank
 * order, as psm_dist_gather_bytes gives them) back into one of all B. */
gboolean psm_model_restore_stream_rows (PsmModel *m, GBytes *state, int B, int lo, int n, GError **error);
GBytes *psm_model_stream_state_merge (PsmModel *m, GPtrArray *parts, GError **error);

/* What the core accepts from a task plugin (core/psm-batch.c): the sizes it
 * declares, and every batch it returns (ids inside the vocabularies, lengths
 * within its maxima, masks 0/1, pointer locations on real tokens). Errors
 * name the task plugin (PSM_RUN_ERROR_FAILED). */
gboolean psm_task_info_validate (const PsmTaskInfo *info, const char *task, GError **error);
gboolean psm_batch_validate (const PsmBatch *b, const PsmTaskInfo *info, int max_B, const char *task,
                             GError **error);

/* Beam search over any scorer (core/psm-decode.c; greedy is beam 1). */
typedef struct {
  int beam;               /* hypotheses kept per article */
  int min_len, max_len;   /* tokens, the end token counted */
  int block_ngram;        /* never repeat an n-gram of words (0 = off) */
  double length_penalty;  /* rank by logp / len^alpha (1: mean, 0: sum) */
  int32_t eos;            /* slot that ends a hypothesis */
  int32_t unk;            /* word id of the unknown word, or -1 */
  gboolean no_unk;        /* never emit it */
} PsmBeamConfig;

typedef struct {
  /* n = B * beam rows, article b owning rows [b beam, (b + 1) beam); row r
   * continues row parents[r] of the previous step (NULL at the first)
   * after emitting slot tokens[r] (-1: nothing yet, or a dead row). The
   * rows wanted are [b beam, b beam + per) of the articles act[0..n_act)
   * (ascending) that are still searching: per is 1 at the first step,
   * where only row b beam is live, and beam after. Returns log-scores of
   * *S columns whose row base[b] + k is row b beam + k, for the rows
   * wanted (base[0..B) is the scorer's to set; it may score more rows than
   * asked), valid until the next call; NULL with error set stops the
   * search. A parent is always a row wanted at the previous step. */
  const float *(*step) (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act,
                        int n_act, int per, int *base, int *S, GError **error);
  /* The word a slot of row stands for (n-gram blocking, no_unk); NULL: the slot. */
  int32_t (*word) (void *ud, int row, int32_t slot);
  void *ud;
} PsmBeamFns;

/* A result: the emitted slots (without the end token) and, for each, the
 * row of the step that scored it. */
typedef struct {
  int len;
  int32_t *slots, *rows;
  double logp, score;
} PsmHyp;

/* Fills out[0..B) (psm_hyp_clear each after use; zero them before). */
gboolean psm_beam_search (const PsmBeamConfig *cfg, int B, const PsmBeamFns *f, PsmHyp *out, GError **error);
void psm_hyp_clear (PsmHyp *h);

/* What the library reports (psm-out.c): to the program's psm_set_output
 * function, formatted as printf would; never printed by the library. */
void psm_out (PsmOutKind kind, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

#endif
