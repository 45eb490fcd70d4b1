/* psm-ops.h — differentiable ops. Each records itself on the graph's tape
 * when gradients are enabled; its backward accumulates (+=) into input grads.
 * Equations are stated in core/ops/<family>.c. Shapes:
 *   "rows" of a tensor = all leading dims flattened, "cols" = last dim. */
#ifndef PSM_OPS_H
#define PSM_OPS_H

#include "psm-tensor.h"

G_BEGIN_DECLS

/* --- linear algebra (core/ops/matmul.c, linear-*.c) --- */
/* C = op(A) op(B); A is viewed as [rows, cols]; with trans_a its transpose. */
PsmTensor *psm_matmul (PsmGraph *g, PsmTensor *a, PsmTensor *b, gboolean trans_a, gboolean trans_b);
/* y = x W + b (b may be NULL): one sgemm, bias fused. x [.., K], W [K, N].
 * When x is the whole of a psm_embedding output (an encoder's input, as the
 * core hands it over) of more than 64 rows, and at least a quarter of them
 * repeat an id, each distinct id's row is projected once and copied to the
 * rows that have it (the profile names the op "embedding_linear"); the
 * gradient then goes to the table and W directly, and x's own gradient gets
 * nothing from this op. */
PsmTensor *psm_linear (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b);
/* ABI 1.17: psm_pick_log_softmax (g, psm_linear (g, x, w, b), targets) —
 * y [R, 1], y[r] = log softmax (x W + b)[r, targets[r]] (-inf where
 * targets[r] < 0) — as one op where that saves work. On a training graph
 * the scores are never a tensor with a gradient of their own: in single
 * precision the backward writes their gradient over them and runs the two
 * products on it (the same results as the pair, to the bit); with
 * train.precision bf16 it makes that gradient as it rounds it for the
 * products (ops/matmul.c). Without gradients, and for x an embedding
 * lookup's or a locked dropout's output, the two ops as written above. A
 * head's vocabulary loss should call this rather than the pair. */
PsmTensor *psm_linear_pick_log_softmax (PsmGraph *g, PsmTensor *x, PsmTensor *w, PsmTensor *b,
                                        const int32_t *targets);

/* --- elementwise (core/ops/elementwise.c) --- */
/* a + b; b has the shape of a, or b->n divides a->n and b is tiled
 * (a bias [N] over rows, a [B,H] over the T of a [T,B,H]). */
PsmTensor *psm_add (PsmGraph *g, PsmTensor *a, PsmTensor *b);
PsmTensor *psm_mul (PsmGraph *g, PsmTensor *a, PsmTensor *b);   /* same shape */
PsmTensor *psm_scale (PsmGraph *g, PsmTensor *a, float k);       /* k a */
PsmTensor *psm_sigmoid (PsmGraph *g, PsmTensor *x);
PsmTensor *psm_tanh (PsmGraph *g, PsmTensor *x);
PsmTensor *psm_relu (PsmGraph *g, PsmTensor *x);
/* ABI 1.19: maxout over the last dimension, y[.., j] = max_{i < k} x[.., j k + i]
 * (its size a multiple of k); the deep output layer of Gulcehre et al. eq. 3. */
PsmTensor *psm_maxout (PsmGraph *g, PsmTensor *x, int k);

/* --- softmax family (core/ops/softmax.c), over the last dim --- */
PsmTensor *psm_softmax (PsmGraph *g, PsmTensor *x);
PsmTensor *psm_log_softmax (PsmGraph *g, PsmTensor *x);
/* mask has x's shape (1 keep, 0 drop); dropped entries get probability 0.
 * A row with nothing kept yields all zeros. */
PsmTensor *psm_masked_softmax (PsmGraph *g, PsmTensor *x, const float *mask);
PsmTensor *psm_masked_log_softmax (PsmGraph *g, PsmTensor *x, const float *mask);
/* ABI 1.8: y [R, 1] = log sum_j e^(x[r, j]) over the kept entries (mask
 * as above, or NULL); -1e30 for a row with nothing kept. */
PsmTensor *psm_logsumexp (PsmGraph *g, PsmTensor *x, const float *mask);

/* --- gather / layout (core/ops/gather.c) --- */
/* out[i] = table[ids[i]], out [n, E]; backward scatter-adds into table. */
PsmTensor *psm_embedding (PsmGraph *g, PsmTensor *table, const int32_t *ids, int n);
/* Row gather: out[i] = x[rows[i]] (x viewed as [R, C]); beam reordering. */
PsmTensor *psm_gather_rows (PsmGraph *g, PsmTensor *x, const int32_t *rows, int n);
/* ABI 1.11: the rows that count, for computing only those. The rows r < R
 * with w[r] != 0, in order, into *rows (g's arena), and their count; when
 * all count or none does, *rows = NULL and R is returned (keep every row).
 * The inverse of gathering them: psm_scatter_rows puts x's n rows back at
 * rows[0..n) of y [R, C] (rows increasing), every other row 0; backward
 * dx[i] += dy[rows[i]]. A head scores its vocabulary on the real target
 * rows only (padding is two fifths of a CNN/DailyMail batch's):
 *   x = psm_gather_rows (g, x, rows, n); ... lp = psm_scatter_rows (g, lp, rows, R) */
int psm_nonzero_rows (PsmGraph *g, const float *w, int R, const int32_t **rows);
/* out[i] = src[rows[i]] for i < n, elements of elem bytes, in g's arena:
 * the targets and weights of those rows. */
void *psm_gather_elems (PsmGraph *g, const void *src, size_t elem, const int32_t *rows, int n);
PsmTensor *psm_scatter_rows (PsmGraph *g, PsmTensor *x, const int32_t *rows, int R);
/* out[i] = x[i, idx[i]] for x [R, C]; idx < 0 gives 0 and no gradient. */
PsmTensor *psm_pick (PsmGraph *g, PsmTensor *x, const int32_t *idx);
PsmTensor *psm_concat (PsmGraph *g, PsmTensor *a, PsmTensor *b);   /* last dim */
PsmTensor *psm_slice (PsmGraph *g, PsmTensor *x, int start, int len); /* last dim */
/* ABI 1.7: columns cols[0..n) of x [..., C] as [..., n] (a weight matrix
 * [K, V] restricted to a candidate list: Jean et al.'s large-vocabulary
 * trick); backward adds dy into those columns (a repeated column sums). */
PsmTensor *psm_gather_cols (PsmGraph *g, PsmTensor *x, const int32_t *cols, int n);
/* ABI 1.7: a [Ta, ...] then b [Tb, ...] (same trailing dims) as one
 * [Ta + Tb, ...]: the two halves of a sequence run as two ops. */
PsmTensor *psm_concat_steps (PsmGraph *g, PsmTensor *a, PsmTensor *b);
/* [D0, D1, C] -> [D1, D0, C]: time-major <-> batch-major. */
PsmTensor *psm_transpose01 (PsmGraph *g, PsmTensor *x);

/* --- reductions and losses (core/ops/loss.c) --- */
PsmTensor *psm_sum (PsmGraph *g, PsmTensor *x);    /* scalar */
PsmTensor *psm_mean (PsmGraph *g, PsmTensor *x);   /* scalar */
/* -(1/W) sum_i w_i logp[i, t_i], W = sum_i w_i (weights may be NULL = 1;
 * t_i < 0 skipped). logp [R, C]; scalar out. */
PsmTensor *psm_nll (PsmGraph *g, PsmTensor *logp, const int32_t *targets, const float *weights);
/* Fused log-softmax + NLL over logits [R, C]; same reduction as psm_nll. */
PsmTensor *psm_cross_entropy (PsmGraph *g, PsmTensor *logits, const int32_t *targets, const float *weights);
/* Elementwise -log sigma(x) if z = 1, -log(1 - sigma(x)) if z = 0, times w,
 * averaged as psm_nll (binary cross-entropy on logits, stable). */
PsmTensor *psm_bce_logits (PsmGraph *g, PsmTensor *x, const float *z, const float *weights);

/* --- recurrent cells (core/ops/gru.c, core/ops/lstm.c, core/ops/lstm-seq.c) --- */
/* Fused GRU cell (the cuDNN/PyTorch form):
 *   [xr xz xn] = xp (input projection incl. its bias, [B, 3H])
 *   [hr hz hn] = h W + bh     (W [H, 3H], bh [3H])
 *   r = s(xr + hr), z = s(xz + hz), n = tanh(xn + r * hn)
 *   h' = (1 - z) n + z h
 * mask [B] (may be NULL): where 0, h' = h (padding carries the state). */
PsmTensor *psm_gru_cell (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *w, PsmTensor *bh, const float *mask);
/* Whole-sequence GRU: xp [T, B, 3H] -> hs [T, B, H] from h0 [B, H]; the same
 * cell, with the recurrent weight gradient done as one GEMM over all steps.
 * mask [T, B] may be NULL. */
PsmTensor *psm_gru_seq (PsmGraph *g, PsmTensor *xp, PsmTensor *h0, PsmTensor *w, PsmTensor *bh, const float *mask);
/* ABI 1.13: the same reading the pre-activations from columns [col0,
 * col0 + 3H) of xp [T, B, K] (the gradient goes to those columns), forward
 * in time or, with reverse, from position T - 1 down to 0; the output is in
 * time order either way, and the final h is position T - 1's (0's in
 * reverse). Both directions of a bidirectional layer read one projection of
 * all steps. psm_gru_seq is col0 = 0, K = 3H, forward. */
PsmTensor *psm_gru_seq_cols (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *w, PsmTensor *bh,
                             const float *mask, gboolean reverse);
/* Fused LSTM cell: [i f g o] = xp + h W (xp [B, 4H] incl. bias, W [H, 4H]),
 *   c' = s(f) c + s(i) tanh(g), h' = s(o) tanh(c').
 * Returns hc [2, B, H]: row block 0 is h', 1 is c' (take them with
 * psm_tensor_step). mask [B] may be NULL: where 0, (h', c') = (h, c). */
PsmTensor *psm_lstm_cell (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *c, PsmTensor *w, const float *mask);
/* Whole-sequence LSTM (ABI 1.3): the same cell over xp [T, B, 4H] from
 * (h0, c0) [B, H], forward in time or, with reverse, from position T - 1 down
 * to 0; mask [T, B] may be NULL (padding carries the state). Returns
 * [T + 1, B, H]: h at every position in time order, then the final c (the
 * final h is position T - 1's, or 0's in reverse). The recurrent weights are
 * packed once and the rows split over the threads, as psm_gru_seq. */
PsmTensor *psm_lstm_seq (PsmGraph *g, PsmTensor *xp, PsmTensor *h0, PsmTensor *c0, PsmTensor *w,
                         const float *mask, gboolean reverse);
/* ABI 1.4: the same, reading the gate pre-activations from columns
 * [col0, col0 + 4H) of xp [T, B, K] (the gradient goes to those columns):
 * both directions of a bidirectional layer read one projection of all
 * steps without copying their halves out. psm_lstm_seq is col0 = 0, K = 4H. */
PsmTensor *psm_lstm_seq_cols (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *c0, PsmTensor *w,
                              const float *mask, gboolean reverse);

/* ABI 1.6, zoneout (Krueger et al. 2016) on the recurrent state: with
 * weights zh, zc [T, B, H] (NULL: none), the state after position t is
 *   h = zh h_prev + (1 - zh) h~,  c = zc c_prev + (1 - zc) c~
 * where (h~, c~) is the cell's output (h~ from c~, as Krueger et al.'s eq.).
 * Training passes 0/1 draws, evaluation the expectation z
 * (psm_zoneout_weights); the arrays must live until the backward pass (the
 * graph's arena does). */
PsmTensor *psm_lstm_seq_zoneout (PsmGraph *g, PsmTensor *xp, int col0, PsmTensor *h0, PsmTensor *c0, PsmTensor *w,
                                 const float *mask, gboolean reverse, const float *zh, const float *zc);

/* --- regularisers (core/ops/dropout.c), ABI 1.6 --- */
/* Locked (variational) dropout: x [T, B, C] times one mask [B, C] of
 * [u >= p] / (1 - p), the same at every step (2-D x: plain dropout); x
 * itself when the graph has no training rng or p = 0. */
PsmTensor *psm_locked_dropout (PsmGraph *g, PsmTensor *x, float p);
/* n zoneout weights in the graph's arena: Bernoulli(z) draws (1 = keep the
 * previous value) from the training rng, or z everywhere without one. */
float *psm_zoneout_weights (PsmGraph *g, float z, size_t n);
/* ABI 1.7: noisy tanh with a learned p (Gulcehre et al. 2016, "Noisy
 * Activation Functions", NAN with learned p): for x [..., C] and p [C],
 *   h = hardtanh(x), D = h - x, s = c (sigmoid(p D) - 1/2)^2,
 *   y = alpha h + (1 - alpha) x - sgn(x) s xi,  xi ~ N(0, 1)
 * with the graph's training rng; without one, xi = 0 (its expectation).
 * The paper's alpha 1.15, c 0.5. */
PsmTensor *psm_noisy_tanh (PsmGraph *g, PsmTensor *x, PsmTensor *p, float alpha, float c);

/* --- the pointer sentinel (core/ops/window.c), ABI 1.6 --- */
/* Scores over a sliding window of the last L positions of a stream, and a
 * sentinel (Merity et al. eq. 1 and §2.4): for row r = (t, b) of q [T, B, H]
 *   out[r, j] = q[t, b] . h(t - L + 1 + j, b)   j = 0 .. L - 1
 *   out[r, L] = q[t, b] . s                      (s [H], the sentinel)
 * where h(p, b) is cur[p, b] for p >= 0 (this segment, [T, B, H]) and
 * past[P + p, b] for p < 0 (the last P positions of earlier segments,
 * [P, B, H], no gradient; may be NULL with P = 0). wid [T B, L]: the word at
 * each window slot, < 0 where there is none (before the stream's start,
 * padding): those scores are -inf. */
PsmTensor *psm_window_scores (PsmGraph *g, PsmTensor *q, PsmTensor *cur, PsmTensor *past, PsmTensor *s,
                              const int32_t *wid, int L);
/* The window's word ids for psm_window_scores: wid[(t, b), j] is the word at
 * position t - L + 1 + j of stream b (cur_ids [T, B] with cur_mask [T, B],
 * past_ids [P, B]; -1 where none). Returned in the graph's arena. */
int32_t *psm_window_ids (PsmGraph *g, int T, int B, int L, const int32_t *cur_ids, const float *cur_mask,
                         const int32_t *past_ids, int P);
/* Pointer-sentinel NLL (§2.6): a = softmax(scores[r]) over L + 1, g = a[L],
 *   p_r = g exp(lgen_r) + sum_{j < L, wid[r, j] == y_r} a[r, j]
 * the scalar -(1/W) sum_r w_r log max(p_r, 1e-30) (y_r < 0 skipped).
 * lgen [R] or [R, 1]: log p_vocab(y_r) (psm_pick_log_softmax). */
PsmTensor *psm_sentinel_nll (PsmGraph *g, PsmTensor *scores, PsmTensor *lgen, const int32_t *wid,
                             const int32_t *targets, const float *weights);

/* --- attention (core/ops/attention.c) --- */
/* ctx[b] = sum_t a[b, t] v[t, b, :]; a [B, T], v [T, B, H] -> [B, H]. */
PsmTensor *psm_attend (PsmGraph *g, PsmTensor *a, PsmTensor *v);
/* ABI 1.8: y [R, T], y[r, i] = q[r] . keys[i, r % Bi]; keys [T, Bi, H]
 * (time-major annotations), q [R, H] (rows of several steps, R a multiple
 * of Bi): bilinear scores of every source position, e.g. a copy head's. */
PsmTensor *psm_dot_scores (PsmGraph *g, PsmTensor *keys, PsmTensor *q);
/* Fused additive attention with optional coverage, one pass over the
 * annotations forward and one backward (equations in core/ops/attention.c):
 *   e[b, i] = v . tanh(keys[i, b] + query[b] + w_c cov[b, i]),
 *   attn = masked softmax_i e,  context[b] = sum_i attn[b, i] values[i, b].
 * keys [T, B, A] (W_h h_i, computed once per article), query [B, A]
 * (W_s s_t + b_attn), v [A], w_c [A] and coverage [B, T] (both NULL without
 * coverage), values [T, B, H], mask [T, B] (may be NULL). Sets *attn [B, T]
 * and *context [B, H] (views of the returned tensor; either pointer may be
 * NULL). A row with no real position gets attn = 0 and context = 0.
 * ABI 1.12: query (and coverage) may have R < B rows, the first R rows of
 * keys, values and mask; attn and context then have R rows. */
PsmTensor *psm_additive_attention (PsmGraph *g, PsmTensor *keys, PsmTensor *query, PsmTensor *v,
                                   PsmTensor *w_c, PsmTensor *coverage, PsmTensor *values,
                                   const float *mask, PsmTensor **attn, PsmTensor **context);

/* --- pointing and the decoder loop (core/ops/pointer.c) ---
 * ids: source word ids [T, Bi] (time-major); row r of a [R, ...] input
 * belongs to example r % Bi. */
/* Copies x into step t of seq (a [T, ...] tensor made with
 * psm_tensor_new): how step outputs are stacked time-major. Returns the view. */
PsmTensor *psm_set_step (PsmGraph *g, PsmTensor *seq, int t, PsmTensor *x);
/* Scatter-add onto an extended vocabulary of S words: y [R, S] starts as
 * base [R, S0] (S0 <= S; NULL = zeros) padded with zeros, then
 * y[r, ids[i, r]] += w[r, i] (ids < 0 skipped). The pointer-generator's
 * final distribution: base = p_gen P_vocab, w = (1 - p_gen) attention. */
PsmTensor *psm_scatter_add (PsmGraph *g, PsmTensor *base, PsmTensor *w, const int32_t *ids, int Bi, int S);
/* The one entry of that scatter a loss needs: y [R, 1],
 * y[r] = sum_i w[r, i] [ids[i, r] == targets[r]] (0 when targets[r] < 0). */
PsmTensor *psm_gather_mass (PsmGraph *g, PsmTensor *w, const int32_t *ids, int Bi, const int32_t *targets);
/* log softmax(x[r])[targets[r]] for x [R, C] -> [R, 1], without keeping the
 * softmax (backward recomputes it from the logits); -inf when targets[r] < 0. */
PsmTensor *psm_pick_log_softmax (PsmGraph *g, PsmTensor *x, const int32_t *targets);
/* Pointer-generator NLL (See et al. eq. 9 and 6): with p = sigma(z),
 * m_r = p_r exp(lgen_r) + (1 - p_r) copy_r, the scalar
 * -(1/W) sum_r w_r log max(m_r, 1e-12). z, lgen, copy [R] or [R, 1];
 * lgen = -inf (a target outside the vocabulary) contributes 0. */
PsmTensor *psm_mixture_nll (PsmGraph *g, PsmTensor *z, PsmTensor *lgen, PsmTensor *copy, const float *weights);
/* Coverage loss (See et al. eq. 12): (1/W) sum_r w_r sum_i min(a[r, i], c[r, i]). */
PsmTensor *psm_coverage_loss (PsmGraph *g, PsmTensor *a, PsmTensor *c, const float *weights);
/* y[r, :] = x[r, :] s[r]; x [R, C], s [R] or [R, 1]. */
PsmTensor *psm_mul_rows (PsmGraph *g, PsmTensor *x, PsmTensor *s);
/* y = a x + b, elementwise. */
PsmTensor *psm_affine (PsmGraph *g, PsmTensor *x, float a, float b);
/* y = log max(x, 1e-30), elementwise. */
PsmTensor *psm_log (PsmGraph *g, PsmTensor *x);

G_END_DECLS
#endif
