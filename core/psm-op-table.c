/* psm-op-table.c — one row per op: name and backward. */
#include "config.h"
#include <math.h>
#include "psm-private.h"

const PsmOpInfo psm_op_table[PSM_OP_COUNT] = {
  [PSM_OP_MATMUL] = { "matmul", psm_matmul_backward },
  [PSM_OP_LINEAR] = { "linear", psm_linear_backward },
  [PSM_OP_ADD] = { "add", psm_add_backward },
  [PSM_OP_MUL] = { "mul", psm_mul_backward },
  [PSM_OP_SCALE] = { "scale", psm_scale_backward },
  [PSM_OP_SIGMOID] = { "sigmoid", psm_sigmoid_backward },
  [PSM_OP_TANH] = { "tanh", psm_tanh_backward },
  [PSM_OP_RELU] = { "relu", psm_relu_backward },
  [PSM_OP_SOFTMAX] = { "softmax", psm_softmax_backward },
  [PSM_OP_LOG_SOFTMAX] = { "log_softmax", psm_log_softmax_backward },
  [PSM_OP_EMBEDDING] = { "embedding", psm_embedding_backward },
  [PSM_OP_GATHER_ROWS] = { "gather_rows", psm_gather_rows_backward },
  [PSM_OP_PICK] = { "pick", psm_pick_backward },
  [PSM_OP_CONCAT] = { "concat", psm_concat_backward },
  [PSM_OP_SLICE] = { "slice", psm_slice_backward },
  [PSM_OP_TRANSPOSE01] = { "transpose01", psm_transpose01_backward },
  [PSM_OP_SUM] = { "sum", psm_sum_backward },
  [PSM_OP_MEAN] = { "mean", psm_mean_backward },
  [PSM_OP_NLL] = { "nll", psm_nll_backward },
  [PSM_OP_CROSS_ENTROPY] = { "cross_entropy", psm_cross_entropy_backward },
  [PSM_OP_BCE_LOGITS] = { "bce_logits", psm_bce_logits_backward },
  [PSM_OP_GRU_CELL] = { "gru_cell", psm_gru_cell_backward },
  [PSM_OP_GRU_SEQ] = { "gru_seq", psm_gru_seq_backward },
  [PSM_OP_LSTM_CELL] = { "lstm_cell", psm_lstm_cell_backward },
  [PSM_OP_LSTM_SEQ] = { "lstm_seq", psm_lstm_seq_backward },
  [PSM_OP_DEFER_VALUES] = { "defer_values", psm_defer_values_backward },
  [PSM_OP_ATTEND] = { "attend", psm_attend_backward },
  [PSM_OP_ADDITIVE_ATTENTION] = { "additive_attention", psm_additive_attention_backward },
  [PSM_OP_SET_STEP] = { "set_step", psm_set_step_backward },
  [PSM_OP_SCATTER_ADD] = { "scatter_add", psm_scatter_add_backward },
  [PSM_OP_GATHER_MASS] = { "gather_mass", psm_gather_mass_backward },
  [PSM_OP_PICK_LOG_SOFTMAX] = { "pick_log_softmax", psm_pick_log_softmax_backward },
  [PSM_OP_MIXTURE_NLL] = { "mixture_nll", psm_mixture_nll_backward },
  [PSM_OP_COVERAGE_LOSS] = { "coverage_loss", psm_coverage_loss_backward },
  [PSM_OP_MUL_ROWS] = { "mul_rows", psm_mul_rows_backward },
  [PSM_OP_AFFINE] = { "affine", psm_affine_backward },
  [PSM_OP_LOG] = { "log", psm_log_backward },
  [PSM_OP_LOCKED_DROPOUT] = { "locked_dropout", psm_locked_dropout_backward },
  [PSM_OP_WINDOW_SCORES] = { "window_scores", psm_window_scores_backward },
  [PSM_OP_SENTINEL_NLL] = { "sentinel_nll", psm_sentinel_nll_backward },
  [PSM_OP_CONCAT_STEPS] = { "concat_steps", psm_concat_steps_backward },
  [PSM_OP_GATHER_COLS] = { "gather_cols", psm_gather_cols_backward },
  [PSM_OP_NOISY_TANH] = { "noisy_tanh", psm_noisy_tanh_backward },
};

/* tests/test-graph.c checks that every row has a name and a backward, so an
 * enum value added without its row fails `make check`. */
