/* psm-graph.c — arena, tensors and the reverse-mode tape. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <omp.h>
#include "psm-private.h"

/* ---------- arena ---------- */

typedef struct Block {
  struct Block *next;
  size_t size, used;
  char *mem;
} Block;

struct PsmArena {
  Block *head;     /* current block first */
  size_t total;    /* sum of block sizes */
};

static Block *
block_new (size_t size)
{
  Block *b = g_new0 (Block, 1);
  b->size = size;
  b->mem = psm_xaligned (size, "a block of a step's tensors");
  return b;
}

PsmArena *
psm_arena_new (size_t initial_bytes)
{
  PsmArena *a = g_new0 (PsmArena, 1);
  a->head = block_new (MAX (initial_bytes, 1 << 16));
  a->total = a->head->size;
  return a;
}

void *
psm_arena_alloc (PsmArena *a, size_t bytes)
{
  bytes = (bytes + 63) & ~(size_t) 63;
  if (a->head->used + bytes > a->head->size) {
    Block *b = block_new (MAX (bytes, a->head->size * 2));
    b->next = a->head;
    a->head = b;
    a->total += b->size;
  }
  void *p = a->head->mem + a->head->used;
  a->head->used += bytes;
  return p;
}

/* Zeroed: a large block (a step's gradient buffers of several MB: the
 * encoder's input projection, the annotations, the batch-major copies) by
 * both threads, in 1 MB pieces. */
void *
psm_arena_alloc0 (PsmArena *a, size_t bytes)
{
  char *p = psm_arena_alloc (a, bytes);
  if (bytes >= ((size_t) 4 << 20) && !omp_in_parallel ()) {
    size_t piece = (size_t) 1 << 20, n = (bytes + piece - 1) / piece;
#pragma omp parallel for schedule (static)
    for (size_t i = 0; i < n; i++)
      memset (p + i * piece, 0, MIN (piece, bytes - i * piece));
  } else {
    memset (p, 0, bytes);
  }
  return p;
}

size_t
psm_arena_used (const PsmArena *a)
{
  size_t u = 0;
  for (Block *b = a->head; b; b = b->next)
    u += b->used;
  return u;
}

void
psm_arena_reset (PsmArena *a)
{
  if (a->head->next) {
    /* Several blocks: replace them by one that holds everything, so the
     * next step of the same size needs no allocation. */
    size_t total = a->total;
    for (Block *b = a->head; b;) {
      Block *n = b->next;
      free (b->mem);
      g_free (b);
      b = n;
    }
    a->head = block_new (total);
    a->total = total;
  }
  a->head->used = 0;
}

void
psm_arena_free (PsmArena *a)
{
  if (!a)
    return;
  for (Block *b = a->head; b;) {
    Block *n = b->next;
    free (b->mem);
    g_free (b);
    b = n;
  }
  g_free (a);
}

/* ---------- graph ---------- */

struct PsmGraph {
  PsmArena *arena;
  PsmNode **nodes;
  size_t n_nodes, cap_nodes;
  gboolean grad;
  PsmProfile *prof;
  GPtrArray *deferred;   /* PsmDeferredValues *, until the next reset */
  GPtrArray *dweights;   /* PsmDeferredWeight *, until the next reset */
  GPtrArray *bmajor;     /* PsmBatchMajor * (in the arena), until the next reset */
  gboolean no_bmajor;    /* psm_graph_set_batch_major (g, FALSE) */
  const float *const_lo[4];   /* parameter blocks: [lo, hi) */
  const float *const_hi[4];
  int n_const;
  GArray *packed;        /* Packed */
  gboolean keep_packed;
  gboolean bf16;         /* psm_graph_set_bf16 */
  gboolean bf16_train;   /* psm_graph_set_bf16_train */
  const float *rep[4], *rep_compact[4];   /* beam repeats (psm_graph_add_repeat) */
  int rep_group[4], n_rep;
  PsmPhase phase;
  gint64 mark;           /* µs: the last op or phase mark, when profiling */
  PsmRng *rng;           /* training: the stream dropout draws from; NULL otherwise */
  /* the last embedding lookups (psm_graph_note_lookup), until the next reset */
  const float *lk_rows[4];
  PsmTensor *lk_table[4];
  const int32_t *lk_ids[4];
  int lk_n[4], n_lk;
  /* the last locked dropouts (psm_graph_note_dropout), until the next reset */
  const float *dr_rows[4], *dr_mask[4];
  size_t dr_n[4], dr_period[4];
  int n_dr;
};

const char *const psm_phase_names[PSM_PHASE_COUNT] = { "other", "encoder", "decoder", "head" };

void
psm_graph_set_profile (PsmGraph *g, PsmProfile *prof)
{
  g->prof = prof;
  g->mark = g_get_monotonic_time ();
}

PsmProfile *
psm_graph_profile (PsmGraph *g)
{
  return g->prof;
}

void
psm_graph_phase (PsmGraph *g, PsmPhase phase)
{
  g->phase = phase;
  if (g->prof)
    g->mark = g_get_monotonic_time ();
}

static int
cmp_desc (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;
  return (x < y) - (x > y);
}

void
psm_profile_print (const PsmProfile *p, FILE *out)
{
  double n = MAX (p->steps, 1), total = p->optim;
  for (int ph = 0; ph < PSM_PHASE_COUNT; ph++)
    for (int op = 0; op < PSM_OP_COUNT; op++)
      total += p->fwd[ph][op] + p->bwd[ph][op];
  fprintf (out, "profile over %ld steps: %.1f ms a step (forward + backward + optimiser)\n", p->steps,
           1e3 * total / n);
  fprintf (out, "  %-9s %-20s %10s %10s %7s\n", "phase", "op", "fwd ms", "bwd ms", "share");
  for (int ph = 0; ph < PSM_PHASE_COUNT; ph++) {
    double f = 0, b = 0;
    double row[PSM_OP_COUNT][2];
    int k = 0;
    for (int op = 0; op < PSM_OP_COUNT; op++) {
      f += p->fwd[ph][op];
      b += p->bwd[ph][op];
      if (p->fwd[ph][op] + p->bwd[ph][op] > 0) {
        row[k][0] = p->fwd[ph][op] + p->bwd[ph][op];
        row[k][1] = op;
        k++;
      }
    }
    if (f + b <= 0)
      continue;
    fprintf (out, "  %-9s %-20s %10.1f %10.1f %6.1f%%\n", psm_phase_names[ph], "(all)", 1e3 * f / n, 1e3 * b / n,
             100 * (f + b) / total);
    qsort (row, k, sizeof row[0], cmp_desc);
    for (int i = 0; i < k; i++) {
      int op = (int) row[i][1];
      if (row[i][0] < 0.005 * total)
        break;
      fprintf (out, "  %-9s %-20s %10.1f %10.1f %6.1f%%\n", "", psm_op_table[op].name, 1e3 * p->fwd[ph][op] / n,
               1e3 * p->bwd[ph][op] / n, 100 * row[i][0] / total);
    }
  }
  fprintf (out, "  %-9s %-20s %10s %10.1f %6.1f%%\n", "optimiser", "(clip, update)", "", 1e3 * p->optim / n,
           100 * p->optim / total);
}

PsmGraph *
psm_graph_new (void)
{
  PsmGraph *g = g_new0 (PsmGraph, 1);
  g->arena = psm_arena_new (1 << 20);
  g->grad = TRUE;
  return g;
}

void
psm_graph_free (PsmGraph *g)
{
  if (!g)
    return;
  psm_arena_free (g->arena);
  g_free (g->nodes);
  if (g->deferred)
    g_ptr_array_unref (g->deferred);
  if (g->dweights)
    g_ptr_array_unref (g->dweights);
  if (g->bmajor)
    g_ptr_array_unref (g->bmajor);
  psm_graph_clear_packed (g);
  if (g->packed)
    g_array_unref (g->packed);
  g_free (g);
}

typedef struct {
  const float *w;
  int K, n;
  gboolean tb, valid, bf16;   /* bf16: psm_bf16_pack's form */
  void *data;
} Packed;

void
psm_graph_reset (PsmGraph *g)
{
  psm_arena_reset (g->arena);
  g->n_nodes = 0;
  g->n_lk = 0;
  g->n_dr = 0;
  psm_graph_phase (g, PSM_PHASE_OTHER);
  if (g->deferred)
    g_ptr_array_set_size (g->deferred, 0);
  if (g->dweights)
    g_ptr_array_set_size (g->dweights, 0);
  if (g->bmajor)
    g_ptr_array_set_size (g->bmajor, 0);
  /* stale until asked for again, when they are packed anew into the same
   * memory (a fresh buffer a step cost page faults: a tenth of the PTB
   * model's softmax layer, BENCHMARKS.md d) */
  if (!g->keep_packed)
    psm_graph_stale_packed (g);
}

void
psm_graph_stale_packed (PsmGraph *g)
{
  for (guint i = 0; g->packed && i < g->packed->len; i++)
    g_array_index (g->packed, Packed, i).valid = FALSE;
}

void
psm_graph_const_range (PsmGraph *g, const float *data, size_t n)
{
  for (int i = 0; i < g->n_const; i++)
    if (g->const_lo[i] == data)
      return;
  if (g->n_const == G_N_ELEMENTS (g->const_lo))
    return;   /* more parameter blocks than tracked: they just stay unpacked */
  g->const_lo[g->n_const] = data;
  g->const_hi[g->n_const++] = data + n;
}

gboolean
psm_graph_is_const (PsmGraph *g, const float *data)
{
  for (int i = 0; i < g->n_const; i++)
    if (data >= g->const_lo[i] && data < g->const_hi[i])
      return TRUE;
  return FALSE;
}

/* The entry of g's packings for op(W) in the given form, made if new
 * (*fresh: it must be packed). */
static Packed *
packed_entry (PsmGraph *g, const float *w, int K, int n, gboolean tb, gboolean bf16, gboolean *fresh)
{
  if (!g->packed)
    g->packed = g_array_new (FALSE, FALSE, sizeof (Packed));
  Packed *pk = NULL;
  for (guint i = 0; i < g->packed->len && !pk; i++) {
    Packed *e = &g_array_index (g->packed, Packed, i);
    if (e->w == w && e->K == K && e->n == n && e->tb == tb && e->bf16 == bf16)
      pk = e;
  }
  *fresh = !pk || !pk->valid;
  if (!pk) {
    size_t bytes = bf16 ? psm_bf16_packed_bytes (K, n) : psm_packed_floats (K, n) * sizeof (float);
    Packed e = { w, K, n, tb, FALSE, bf16, psm_xaligned (bytes, "packed weights") };
    g_array_append_val (g->packed, e);
    pk = &g_array_index (g->packed, Packed, g->packed->len - 1);
  }
  pk->valid = TRUE;
  return pk;
}

const float *
psm_graph_packed (PsmGraph *g, const float *w, int K, int n, gboolean tb)
{
  gboolean fresh;
  Packed *pk = packed_entry (g, w, K, n, tb, FALSE, &fresh);
  /* large ones over the threads, panels apart */
  float *out = pk->data;
  if (fresh) {
#pragma omp parallel if ((long) K * n >= (1L << 20) && !omp_in_parallel ())
    psm_pack_shared (K, n, w, tb ? K : n, tb, out);
  }
  return out;
}

const void *
psm_graph_bf16_weight (PsmGraph *g, const float *w, int K, int n, gboolean grad)
{
  if (!g->bf16 || grad || !psm_graph_is_const (g, w))
    return NULL;
  gboolean fresh;
  Packed *pk = packed_entry (g, w, K, n, FALSE, TRUE, &fresh);
  if (fresh)
    psm_bf16_pack (K, n, w, pk->data);
  return pk->data;
}

const void *
psm_graph_bf16_train_weight (PsmGraph *g, const float *w, int K, int n, gboolean tb)
{
  if (!g->bf16_train || !psm_graph_is_const (g, w))
    return NULL;
  gboolean fresh;
  Packed *pk = packed_entry (g, w, K, n, tb, TRUE, &fresh);
  if (fresh)
    psm_bf16_pack_op (K, n, w, tb ? K : n, tb, pk->data);
  return pk->data;
}

void
psm_graph_set_bf16_train (PsmGraph *g, gboolean on)
{
  g->bf16_train = on;
}

gboolean
psm_graph_bf16_train (const PsmGraph *g)
{
  return g->bf16_train;
}

void
psm_graph_set_bf16 (PsmGraph *g, gboolean on)
{
  g->bf16 = on;
}

gboolean
psm_graph_bf16 (const PsmGraph *g)
{
  return g->bf16;
}

const float *
psm_graph_packed_param (PsmGraph *g, const PsmTensor *w, int K, int n, gboolean tb)
{
  return PSM_PACK_FAST && psm_graph_is_const (g, w->data) ? psm_graph_packed (g, w->data, K, n, tb) : NULL;
}

void
psm_graph_clear_packed (PsmGraph *g)
{
  for (guint i = 0; g->packed && i < g->packed->len; i++)
    free (g_array_index (g->packed, Packed, i).data);
  if (g->packed)
    g_array_set_size (g->packed, 0);
}

void
psm_graph_keep_packed (PsmGraph *g, gboolean keep)
{
  g->keep_packed = keep;
}

void
psm_graph_add_repeat (PsmGraph *g, const float *repeated, const float *compact, int group)
{
  if (g->n_rep == G_N_ELEMENTS (g->rep) || !repeated || !compact)
    return;   /* not noted: the op reads the repeated copy */
  g->rep[g->n_rep] = repeated;
  g->rep_compact[g->n_rep] = compact;
  g->rep_group[g->n_rep++] = group;
}

const float *
psm_graph_repeat_of (PsmGraph *g, const float *repeated, int *group)
{
  for (int i = 0; i < g->n_rep; i++)
    if (g->rep[i] == repeated) {
      *group = g->rep_group[i];
      return g->rep_compact[i];
    }
  return NULL;
}

void
psm_graph_clear_repeats (PsmGraph *g)
{
  g->n_rep = 0;
}

void
psm_graph_note_lookup (PsmGraph *g, const float *rows, PsmTensor *table, const int32_t *ids, int n)
{
  int i = g->n_lk++ % (int) G_N_ELEMENTS (g->lk_rows);   /* the oldest goes */
  g->lk_rows[i] = rows;
  g->lk_table[i] = table;
  g->lk_ids[i] = ids;
  g->lk_n[i] = n;
}

PsmTensor *
psm_graph_lookup_of (PsmGraph *g, const float *rows, int n, const int32_t **ids)
{
  for (int i = 0; i < MIN (g->n_lk, (int) G_N_ELEMENTS (g->lk_rows)); i++)
    if (g->lk_rows[i] == rows && g->lk_n[i] == n) {
      *ids = g->lk_ids[i];
      return g->lk_table[i];
    }
  return NULL;
}

void
psm_graph_note_dropout (PsmGraph *g, const float *rows, size_t n, const float *mask, size_t period)
{
  int i = g->n_dr++ % (int) G_N_ELEMENTS (g->dr_rows);   /* the oldest goes */
  g->dr_rows[i] = rows;
  g->dr_n[i] = n;
  g->dr_mask[i] = mask;
  g->dr_period[i] = period;
}

const float *
psm_graph_dropout_of (PsmGraph *g, const float *rows, size_t n, size_t *period)
{
  for (int i = 0; i < MIN (g->n_dr, (int) G_N_ELEMENTS (g->dr_rows)); i++)
    if (g->dr_rows[i] == rows && g->dr_n[i] == n) {
      *period = g->dr_period[i];
      return g->dr_mask[i];
    }
  return NULL;
}

static void
deferred_free (gpointer p)
{
  PsmDeferredValues *d = p;
  g_array_unref (d->steps);
  g_array_unref (d->rows);
  g_free (d);
}

PsmDeferredValues *
psm_graph_deferred_values (PsmGraph *g, const float *grad)
{
  for (guint i = 0; g->deferred && grad && i < g->deferred->len; i++) {
    PsmDeferredValues *d = g_ptr_array_index (g->deferred, i);
    if (d->grad == grad)
      return d;
  }
  return NULL;
}

PsmDeferredValues *
psm_graph_add_deferred_values (PsmGraph *g, const float *grad)
{
  if (!g->deferred)
    g->deferred = g_ptr_array_new_with_free_func (deferred_free);
  PsmDeferredValues *d = g_new0 (PsmDeferredValues, 1);
  d->grad = grad;
  d->steps = g_array_new (FALSE, FALSE, sizeof (const float *));
  d->rows = g_array_new (FALSE, FALSE, sizeof (int));
  g_ptr_array_add (g->deferred, d);
  return d;
}

static void
dweight_free (gpointer p)
{
  PsmDeferredWeight *d = p;
  g_array_unref (d->rows);
  g_free (d);
}

PsmDeferredWeight *
psm_graph_deferred_weight (PsmGraph *g, PsmTensor *w, gboolean bf16)
{
  if (!w->grad || !g->grad || !psm_defer_weights || w->ndim != 2)
    return NULL;
  for (guint i = 0; g->dweights && i < g->dweights->len; i++) {
    PsmDeferredWeight *d = g_ptr_array_index (g->dweights, i);
    if (d->grad == w->grad && d->bf16 == bf16)
      return d;
  }
  /* the node first, so that its backward runs after every product's */
  PsmTensor *in[1] = { w };
  PsmNode *nd = psm_graph_record (g, PSM_OP_DEFER_WEIGHT, psm_tensor_view (g, w, 0, w->ndim, w->shape), 1, in);
  if (!nd)
    return NULL;
  if (!g->dweights)
    g->dweights = g_ptr_array_new_with_free_func (dweight_free);
  PsmDeferredWeight *d = g_new0 (PsmDeferredWeight, 1);
  d->grad = w->grad;
  d->bf16 = bf16;
  d->K = w->shape[0];
  d->N = w->shape[1];
  d->rows = g_array_new (FALSE, FALSE, sizeof (PsmDeferredRows));
  g_ptr_array_add (g->dweights, d);
  nd->saved = d;
  return d;
}

PsmBatchMajor *
psm_graph_batch_major (PsmGraph *g, const float *data, int T, int B, int C)
{
  for (guint i = 0; g->bmajor && data && i < g->bmajor->len; i++) {
    PsmBatchMajor *e = g_ptr_array_index (g->bmajor, i);
    if (e->data == data)
      return e->T == T && e->B == B && e->C == C ? e : NULL;
  }
  return NULL;
}

PsmBatchMajor *
psm_graph_add_batch_major (PsmGraph *g, const float *data)
{
  if (!g->bmajor)
    g->bmajor = g_ptr_array_new ();
  PsmBatchMajor *e = psm_arena_alloc0 (g->arena, sizeof *e);
  e->data = data;
  g_ptr_array_add (g->bmajor, e);
  return e;
}

void psm_graph_set_batch_major (PsmGraph *g, gboolean on) { g->no_bmajor = !on; }
gboolean psm_graph_batch_major_on (const PsmGraph *g) { return !g->no_bmajor; }

float *
psm_batch_major_grad (PsmGraph *g, PsmBatchMajor *e)
{
  if (!e->grad)
    e->grad = psm_arena_alloc0 (g->arena, (size_t) e->T * e->B * e->C * sizeof (float));
  return e->grad;
}

void psm_graph_set_grad (PsmGraph *g, gboolean enabled) { g->grad = enabled; }
void psm_graph_set_rng (PsmGraph *g, PsmRng *rng) { g->rng = rng; }
PsmRng *psm_graph_rng (PsmGraph *g) { return g->rng; }
gboolean psm_graph_grad_enabled (const PsmGraph *g) { return g->grad; }
PsmArena *psm_graph_arena (PsmGraph *g) { return g->arena; }
size_t psm_graph_n_nodes (const PsmGraph *g) { return g->n_nodes; }
void *psm_graph_alloc (PsmGraph *g, size_t bytes) { return psm_arena_alloc (g->arena, bytes); }

void *
psm_graph_dup (PsmGraph *g, const void *src, size_t bytes)
{
  if (!src)
    return NULL;
  void *p = psm_arena_alloc (g->arena, bytes);
  memcpy (p, src, bytes);
  return p;
}

/* Elements of a shape; FALSE when a dimension is negative or the count (in
 * bytes of floats) overflows size_t. */
static gboolean
shape_n (int ndim, const int *shape, size_t *n)
{
  size_t k = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || __builtin_mul_overflow (k, (size_t) shape[i], &k))
      return FALSE;
  }
  if (k > SIZE_MAX / sizeof (float) / 2)
    return FALSE;
  *n = k;
  return TRUE;
}

static PsmTensor *
tensor_header (PsmGraph *g, int ndim, const int *shape)
{
  size_t n = 0;
  if (ndim < 0 || ndim > PSM_MAX_DIMS) {
    g_critical ("psm: tensor of rank %d (psm tensors have rank 0 to %d)", ndim, PSM_MAX_DIMS);
    return NULL;
  }
  if (!shape_n (ndim, shape, &n)) {
    GString *s = g_string_new (NULL);
    for (int i = 0; i < ndim; i++)
      g_string_append_printf (s, "%s%d", i ? ", " : "", shape[i]);
    g_critical ("psm: invalid tensor shape [%s] (negative dimension or too many elements)", s->str);
    g_string_free (s, TRUE);
    return NULL;
  }
  PsmTensor *t = psm_arena_alloc (g->arena, sizeof *t);
  memset (t, 0, sizeof *t);
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    t->shape[i] = shape[i];
  t->n = n;
  return t;
}

PsmTensor *
psm_tensor_new (PsmGraph *g, int ndim, const int *shape, gboolean requires_grad)
{
  PsmTensor *t = tensor_header (g, ndim, shape);
  if (!t)
    return NULL;
  t->data = psm_arena_alloc (g->arena, MAX (t->n, 1) * sizeof (float));
  if (requires_grad && g->grad)
    t->grad = psm_arena_alloc0 (g->arena, MAX (t->n, 1) * sizeof (float));
  return t;
}

PsmTensor *
psm_tensor_zeros (PsmGraph *g, int ndim, const int *shape, gboolean requires_grad)
{
  PsmTensor *t = psm_tensor_new (g, ndim, shape, requires_grad);
  if (t)
    memset (t->data, 0, t->n * sizeof (float));
  return t;
}

PsmTensor *
psm_tensor_2d (PsmGraph *g, int d0, int d1, gboolean requires_grad)
{
  int s[2] = { d0, d1 };
  return psm_tensor_new (g, 2, s, requires_grad);
}

PsmTensor *
psm_tensor_wrap (PsmGraph *g, float *data, float *grad, int ndim, const int *shape)
{
  PsmTensor *t = tensor_header (g, ndim, shape);
  if (!t)
    return NULL;
  t->data = data;
  t->grad = g->grad ? grad : NULL;
  return t;
}

PsmTensor *
psm_tensor_view (PsmGraph *g, PsmTensor *base, size_t offset, int ndim, const int *shape)
{
  g_return_val_if_fail (base != NULL, NULL);
  PsmTensor *t = tensor_header (g, ndim, shape);
  if (!t)
    return NULL;
  if (offset > base->n || t->n > base->n - offset) {
    g_critical ("psm: view of elements [%zu, %zu + %zu) of a tensor of %zu elements", offset, offset,
                t->n, base->n);
    return NULL;
  }
  t->data = base->data + offset;
  t->grad = base->grad ? base->grad + offset : NULL;
  return t;
}

PsmTensor *
psm_tensor_step (PsmGraph *g, PsmTensor *seq, int t)
{
  g_return_val_if_fail (seq->ndim >= 2 && t >= 0 && t < seq->shape[0], NULL);
  size_t stride = seq->n / seq->shape[0];
  return psm_tensor_view (g, seq, (size_t) t * stride, seq->ndim - 1, seq->shape + 1);
}

PsmTensor *
psm_tensor_reshape (PsmGraph *g, PsmTensor *x, int ndim, const int *shape)
{
  size_t n = 0;
  if (!shape_n (ndim, shape, &n) || n != x->n) {
    g_critical ("psm: cannot reshape a tensor of %zu elements to a shape of %s", x->n,
                n ? "another size" : "invalid dimensions");
    return NULL;
  }
  return psm_tensor_view (g, x, 0, ndim, shape);
}

int
psm_tensor_cols (const PsmTensor *t)
{
  return t->ndim ? t->shape[t->ndim - 1] : 1;
}

int
psm_tensor_rows (const PsmTensor *t)
{
  int c = psm_tensor_cols (t);
  return c ? (int) (t->n / c) : 0;
}

gboolean
psm_needs_grad (PsmGraph *g, int n_in, PsmTensor *const *in)
{
  if (!g->grad)
    return FALSE;
  for (int i = 0; i < n_in; i++)
    if (in[i] && in[i]->grad)
      return TRUE;
  return FALSE;
}

PsmTensor *
psm_op_out (PsmGraph *g, int ndim, const int *shape, int n_in, PsmTensor *const *in)
{
  return psm_tensor_new (g, ndim, shape, psm_needs_grad (g, n_in, in));
}

PsmNode *
psm_graph_record (PsmGraph *g, PsmOpKind op, PsmTensor *out, int n_in, PsmTensor *const *in)
{
  if (g->prof) {
    gint64 now = g_get_monotonic_time ();
    g->prof->fwd[g->phase][op] += 1e-6 * (double) (now - g->mark);
    g->mark = now;
  }
  if (!out->grad)
    return NULL;
  if (g->n_nodes == g->cap_nodes) {
    g->cap_nodes = MAX (256, g->cap_nodes * 2);
    g->nodes = g_renew (PsmNode *, g->nodes, g->cap_nodes);
  }
  PsmNode *nd = psm_arena_alloc0 (g->arena, sizeof *nd);
  nd->op = op;
  nd->phase = g->phase;
  nd->out = out;
  for (int i = 0; i < n_in && i < PSM_NODE_MAX_IN; i++)
    nd->in[i] = in[i];
  g->nodes[g->n_nodes++] = nd;
  return nd;
}

/* Mutation testing of the gradient checks (tests/mutation.sh): with
 * PSM_MUTATE_BACKWARD=NAME in the environment, the backward of op NAME
 * adds 1 + PSM_MUTATE_SCALE (default 0.01) times what it should to its
 * inputs' gradients: a 1 % error the checks must catch. Unset, one
 * comparison per node. */
int
psm_mutant_op (void)
{
  static int op = -2;
  if (G_UNLIKELY (op == -2)) {
    const char *name = g_getenv ("PSM_MUTATE_BACKWARD");
    op = -1;
    for (int k = 0; name && k < PSM_OP_COUNT; k++)
      if (strcmp (psm_op_table[k].name, name) == 0)
        op = k;
  }
  return op;
}

static void
mutated_backward (PsmNode *nd)
{
  static gboolean marked;
  const char *mark = g_getenv ("PSM_MUTATE_MARK");   /* a file: "the mutant ran" */
  if (mark && !marked) {
    FILE *f = fopen (mark, "a");
    if (f) {
      fputs ("ran\n", f);
      fclose (f);
    }
    marked = TRUE;
  }
  const char *sc = g_getenv ("PSM_MUTATE_SCALE");
  float extra = sc ? (float) g_ascii_strtod (sc, NULL) : 0.01f;
  float *before[PSM_NODE_MAX_IN] = { NULL };
  for (int k = 0; k < PSM_NODE_MAX_IN; k++) {
    PsmTensor *t = nd->in[k];
    gboolean seen = FALSE;
    for (int j = 0; j < k; j++)
      seen |= nd->in[j] && t && nd->in[j]->grad == t->grad;
    if (t && t->grad && !seen)
      before[k] = g_memdup2 (t->grad, t->n * sizeof (float));
  }
  psm_op_table[nd->op].backward (nd);
  for (int k = 0; k < PSM_NODE_MAX_IN; k++) {
    if (!before[k])
      continue;
    float *gr = nd->in[k]->grad;
    for (size_t i = 0; i < nd->in[k]->n; i++)
      gr[i] += extra * (gr[i] - before[k][i]);
    g_free (before[k]);
  }
}

void
psm_backward (PsmGraph *g, PsmTensor *loss)
{
  g_return_if_fail (loss && loss->n == 1);
  if (!loss->grad)
    return;
  loss->grad[0] += 1.0f;
  if (g->prof) {
    gint64 t = g_get_monotonic_time ();
    for (size_t i = g->n_nodes; i-- > 0;) {
      PsmNode *nd = g->nodes[i];
      psm_op_table[nd->op].backward (nd);
      gint64 now = g_get_monotonic_time ();
      g->prof->bwd[nd->phase][nd->op] += 1e-6 * (double) (now - t);
      t = now;
    }
    g->prof->steps++;
    return;
  }
  int mutant = psm_mutant_op ();
  for (size_t i = g->n_nodes; i-- > 0;) {
    PsmNode *nd = g->nodes[i];
    if (G_UNLIKELY ((int) nd->op == mutant))
      mutated_backward (nd);
    else
      psm_op_table[nd->op].backward (nd);
  }
}
