/* psm-tensor.h — float32 tensors, the per-step arena and the autodiff graph.
 *
 * Layout rules used everywhere in psm:
 *  - row-major, contiguous; a tensor of rank r is [d0, ..., d(r-1)];
 *  - sequences are time-major [T, B, H], so one time step is a contiguous,
 *    batch-major [B, H] view that costs nothing to take;
 *  - per-hypothesis state is batch-major [B, K], so reordering beams is a
 *    row gather.
 * Ownership: every tensor made through a PsmGraph lives in the graph's arena
 * and dies at the next psm_graph_reset(); never free one.
 */
#ifndef PSM_TENSOR_H
#define PSM_TENSOR_H

#include <glib.h>
#include <stddef.h>
#include <stdint.h>
#include "psm-rng.h"

G_BEGIN_DECLS

#define PSM_MAX_DIMS 4

typedef struct PsmTensor PsmTensor;
typedef struct PsmGraph PsmGraph;
typedef struct PsmArena PsmArena;

struct PsmTensor {
  float *data;
  float *grad;       /* same shape as data; NULL when no gradient flows here */
  int ndim;
  int shape[PSM_MAX_DIMS];
  size_t n;          /* number of elements */
};

/* Arena: bump allocation, 64-byte aligned; reset frees everything at once.
 * After the first steps it settles on one block, so a training step does no
 * malloc. */
PsmArena *psm_arena_new (size_t initial_bytes);
void *psm_arena_alloc (PsmArena *arena, size_t bytes);   /* uninitialised */
void *psm_arena_alloc0 (PsmArena *arena, size_t bytes);  /* zeroed */
void psm_arena_reset (PsmArena *arena);
size_t psm_arena_used (const PsmArena *arena);
void psm_arena_free (PsmArena *arena);

/* Graph = arena + tape. With gradients enabled, every op records a node and
 * every tensor that depends on a parameter gets a zeroed gradient buffer. */
PsmGraph *psm_graph_new (void);
void psm_graph_free (PsmGraph *g);
void psm_graph_reset (PsmGraph *g);
void psm_graph_set_grad (PsmGraph *g, gboolean enabled);
gboolean psm_graph_grad_enabled (const PsmGraph *g);
/* ABI 1.6: the random stream of a training step (the core sets it around
 * the loss of a training batch and clears it for evaluation). Regularisers
 * that are random in training and deterministic otherwise (dropout,
 * zoneout) draw from it when it is set. */
void psm_graph_set_rng (PsmGraph *g, PsmRng *rng);
PsmRng *psm_graph_rng (PsmGraph *g);
PsmArena *psm_graph_arena (PsmGraph *g);
size_t psm_graph_n_nodes (const PsmGraph *g);

/* New tensor in the graph's arena (data uninitialised, or zeroed for _zeros).
 * requires_grad is ignored when the graph has gradients disabled. */
PsmTensor *psm_tensor_new (PsmGraph *g, int ndim, const int *shape, gboolean requires_grad);
PsmTensor *psm_tensor_zeros (PsmGraph *g, int ndim, const int *shape, gboolean requires_grad);
PsmTensor *psm_tensor_2d (PsmGraph *g, int d0, int d1, gboolean requires_grad);
/* Wrap caller-owned memory (not copied; grad may be NULL). */
PsmTensor *psm_tensor_wrap (PsmGraph *g, float *data, float *grad, int ndim, const int *shape);
/* Contiguous view of base: elements [offset, offset + prod(shape)); shares
 * data and grad, so gradients written through the view reach base. */
PsmTensor *psm_tensor_view (PsmGraph *g, PsmTensor *base, size_t offset, int ndim, const int *shape);
/* View of row block t of a [T, ...] tensor: shape [d1, ...]. */
PsmTensor *psm_tensor_step (PsmGraph *g, PsmTensor *seq, int t);
/* Same data, new shape with the same element count. */
PsmTensor *psm_tensor_reshape (PsmGraph *g, PsmTensor *x, int ndim, const int *shape);
int psm_tensor_rows (const PsmTensor *t);   /* n / last dim */
int psm_tensor_cols (const PsmTensor *t);   /* last dim */

/* Memory. psm_memory_limit: the bytes this process may use — physical
 * memory, or less under `ulimit -v`, or $PSM_MEMORY_LIMIT ("16G", "512M")
 * when set; 0 if unknown. Sizes that come from a pipeline are checked
 * against it before anything is allocated. An allocation the core cannot
 * recover from (an arena block in the middle of a step) calls the handler
 * set here, which must not return (psm-run's prints a message and exits with
 * status 1); without one, psm aborts. */
guint64 psm_memory_limit (void);
typedef void (*PsmOomHandler) (size_t bytes, const char *what);
void psm_set_oom_handler (PsmOomHandler handler);
G_NORETURN void psm_out_of_memory (size_t bytes, const char *what);

/* Reverse pass from a scalar: d loss = 1, then every node in reverse order. */
void psm_backward (PsmGraph *g, PsmTensor *loss);

G_END_DECLS
#endif
