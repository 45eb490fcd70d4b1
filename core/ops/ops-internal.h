/* ops-internal.h — what the op files (core/ops/) share: their backward
 * functions (op-table.c's rows), the notes one op leaves on a graph
 * for another (notes.c) and psm_linear's parts that its files share. */
#ifndef PSM_OPS_INTERNAL_H
#define PSM_OPS_INTERNAL_H
#include "tape/tape-internal.h"

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

/* Deferred weight gradients (matmul.c, lstm.c; the table in notes.c). A decoder's product x W
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

/* The attention ops (additive.c, attention.c) split their rows over threads
 * when there are two or more and rows x positions x features reach this
 * much work (a team forked for one row of See's 400 positions only waited:
 * 0.096 -> 0.127 ms a step's forward on 2 threads, bench-attention 400 256 1 2). */
#define PSM_ATTN_PAR(R, T, C) ((R) > 1 && (long) (R) * (T) * (C) >= 32768)

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
 * once (the embedding_linear path of psm_linear, matmul.c). The output of an op is
 * never written in place, so the note holds until the next reset. */
/* Whether a lookup of R rows holding u distinct ids is projected that way:
 * more rows than a packed GEMM takes, a quarter or more repeating an id
 * (below that the copies cost more than the rows saved). */
#define PSM_PROJECT_DISTINCT(u, R) ((R) > PSM_PACKED_MAX_ROWS && (long) (u) * 4 <= (long) (R) * 3)
void psm_graph_note_lookup (PsmGraph *g, const float *rows, PsmTensor *table, const int32_t *ids, int n);
PsmTensor *psm_graph_lookup_of (PsmGraph *g, const float *rows, int n, const int32_t **ids);
/* Locked dropouts likewise: psm_locked_dropout notes that its output (n
 * floats at rows) is its input times mask [period], repeated every period
 * floats; psm_linear, given it as x, skips the dropped units in its
 * products (linear-dropout.c) when psm_paths.dropout_linear is set.
 * Kept until the next reset. */
void psm_graph_note_dropout (PsmGraph *g, const float *rows, size_t n, const float *mask, size_t period);
const float *psm_graph_dropout_of (PsmGraph *g, const float *rows, size_t n, size_t *period);
/* The GEMM FLOPs those products left out (forward and backward), added up
 * for bench-lm's count of the FLOPs executed. */
extern double psm_dropout_flops_skipped;

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

/* psm_linear's locked-dropout path (linear-dropout.c: FALSE when x is
 * not one). */
gboolean psm_dropout_linear_forward (PsmGraph *g, PsmTensor *x, const float *m, size_t period, PsmTensor *w,
                                     PsmTensor *b, PsmTensor *y);
#endif
