/* base-internal.h — the bottom layer's internals (core/base/): memory that
 * fails loudly, run-folder files, the MPI collectives, a batch's rows and
 * checks, and the library's one output function. Includes only public
 * headers; every layer above includes it through its own. */
#ifndef PSM_BASE_INTERNAL_H
#define PSM_BASE_INTERNAL_H
#include <math.h>
#include <stdio.h>
#include "psm/psm-pipeline.h"

/* malloc / calloc / 64-byte aligned (free with free()) that call
 * psm_out_of_memory instead of returning NULL (psm-mem.c). */
void *psm_xmalloc (size_t bytes, const char *what);

/* Run-folder files (psm-file.c). psm_fopen_nofollow: fopen's modes
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


/* psm-dist.c: sums and broadcasts over the MPI ranks (no-ops on one) */
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
/* One update's reduction over the ranks: the gradient grad [n_grad] and
 * *loss weighted by this rank's share of the batch's target words and
 * summed (one MPI_Allreduce over the gradient), the n values of extra
 * summed as they are. */
void psm_dist_reduce_update (float *grad, size_t n_grad, double share, double *loss, double *extra, int n);
/* An update's gradient reduction in buckets (psm-dist.c): NULL on one
 * rank. begin with this rank's share; bucket and poll are a
 * PsmGradWatch's ready and poll (psm_graph_watch_grads); end hands MPI
 * the buckets still kept, waits for all, and sums the loss as
 * psm_dist_reduce_update. part: this rank's [lo, hi) and its summed
 * gradient (sharded: its own buffer; else grad itself, [0, n)). gather:
 * each rank's shard of buf (n floats) to every rank (sharded only). */
typedef struct PsmDistReduce PsmDistReduce;
PsmDistReduce *psm_dist_reduce_new (float *grad, size_t n, gboolean shard, size_t bucket);
void psm_dist_reduce_free (PsmDistReduce *r);
void psm_dist_reduce_begin (PsmDistReduce *r, double share);
void psm_dist_reduce_bucket (size_t lo, size_t hi, void *r);
void psm_dist_reduce_poll (void *r);
void psm_dist_reduce_end (PsmDistReduce *r, double *loss, double *extra, int n);
float *psm_dist_reduce_part (PsmDistReduce *r, size_t *lo, size_t *hi);
gboolean psm_dist_reduce_sharded (const PsmDistReduce *r);
size_t psm_dist_reduce_bucket_floats (const PsmDistReduce *r);   /* the watch's bucket */
/* The share of the buckets handed to MPI before the end of the backward */
double psm_dist_reduce_early (const PsmDistReduce *r);
void psm_dist_reduce_gather (PsmDistReduce *r, float *buf);
/* psm-batch.c: keeps rows lo .. lo + n - 1 of every [T, B] and [B]
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

/* What the core accepts from a task plugin (psm-batch.c): the sizes it
 * declares, and every batch it returns (ids inside the vocabularies, lengths
 * within its maxima, masks 0/1, pointer locations on real tokens). Errors
 * name the task plugin (PSM_RUN_ERROR_FAILED). */
gboolean psm_task_info_validate (const PsmTaskInfo *info, const char *task, GError **error);
gboolean psm_batch_validate (const PsmBatch *b, const PsmTaskInfo *info, int max_B, const char *task,
                             GError **error);

/* What the library reports (psm-out.c): to the program's psm_set_output
 * function, formatted as printf would; never printed by the library. */
void psm_out (PsmOutKind kind, const char *fmt, ...) G_GNUC_PRINTF (2, 3);
#endif
