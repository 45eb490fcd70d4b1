/* psm-graph.c — tensors, the reverse-mode tape, profiling, and the slots
 * where op families keep their state on a graph (the arena: psm-arena.c;
 * a graph's weights: psm-weights.c). */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <omp.h>
#include "tape/tape-internal.h"

/* ---------- graph ---------- */

/* An op family's state on this graph (psm_graph_slot). */
typedef struct {
  const PsmGraphSlotClass *k;
  void *state;
} Slot;

struct PsmGraph {
  PsmArena *arena;
  PsmNode **nodes;
  size_t n_nodes, cap_nodes;
  gboolean grad;
  PsmProfile *prof;
  PsmPhase phase;
  gint64 mark;           /* µs: the last op or phase mark, when profiling */
  PsmRng *rng;           /* training: the stream dropout draws from; NULL otherwise */
  Slot slots[PSM_GRAPH_MAX_SLOTS];
  int n_slots;
  PsmGradWatch watch;    /* psm_graph_watch_grads; watch.bucket 0: off */
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
  for (int i = 0; i < g->n_slots; i++) {
    if (g->slots[i].k->free)
      g->slots[i].k->free (g->slots[i].state);
    g_free (g->slots[i].state);
  }
  psm_arena_free (g->arena);
  g_free (g->nodes);
  g_free (g);
}

void
psm_graph_reset (PsmGraph *g)
{
  psm_arena_reset (g->arena);
  g->n_nodes = 0;
  psm_graph_phase (g, PSM_PHASE_OTHER);
  for (int i = 0; i < g->n_slots; i++)
    if (g->slots[i].k->reset)
      g->slots[i].k->reset (g, g->slots[i].state);
}

void *
psm_graph_slot_get (const PsmGraph *g, const PsmGraphSlotClass *k)
{
  for (int i = 0; i < g->n_slots; i++)
    if (g->slots[i].k == k)
      return g->slots[i].state;
  return NULL;
}

void *
psm_graph_slot (PsmGraph *g, const PsmGraphSlotClass *k)
{
  void *st = psm_graph_slot_get (g, k);
  if (st)
    return st;
  if (g->n_slots == PSM_GRAPH_MAX_SLOTS)
    g_error ("psm: more than %d kinds of graph slot (PSM_GRAPH_MAX_SLOTS)", PSM_GRAPH_MAX_SLOTS);
  st = g_malloc0 (k->size);
  g->slots[g->n_slots++] = (Slot) { k, st };
  return st;
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
psm_graph_watch_grads (PsmGraph *g, const PsmGradWatch *w)
{
  g->watch = w && w->n && w->bucket ? *w : (PsmGradWatch) { 0 };
}

/* For each bucket of the watched buffer, the first node (in recording
 * order) with an input whose gradient lies in it: once that node's
 * backward has run, nothing more is added to the bucket. n_nodes for a
 * bucket no node touches. */
static size_t *
watch_first (PsmGraph *g, size_t nb)
{
  const PsmGradWatch *w = &g->watch;
  size_t *first = g_new (size_t, nb);
  for (size_t b = 0; b < nb; b++)
    first[b] = g->n_nodes;
  for (size_t i = g->n_nodes; i-- > 0;)
    for (int k = 0; k < PSM_NODE_MAX_IN; k++) {
      const PsmTensor *t = g->nodes[i]->in[k];
      if (!t || !t->grad || t->grad < w->base || t->grad >= w->base + w->n)
        continue;
      size_t lo = (size_t) (t->grad - w->base), hi = MIN (w->n, lo + t->n);
      for (size_t b = lo / w->bucket; b * w->bucket < hi; b++)
        first[b] = i;
    }
  return first;
}

/* Hands the watcher the buckets complete once node i's backward has run
 * (i = n_nodes: before the first), from the last bucket down to *next:
 * in one fixed order on every process, whatever each one's graph. */
static void
watch_ready (PsmGraph *g, const size_t *first, size_t i, size_t *next)
{
  const PsmGradWatch *w = &g->watch;
  while (*next > 0 && first[*next - 1] >= i) {
    size_t b = --*next;
    w->ready (b * w->bucket, MIN (w->n, (b + 1) * w->bucket), w->user);
  }
  if (*next > 0 && w->poll)
    w->poll (w->user);
}

void
psm_backward (PsmGraph *g, PsmTensor *loss)
{
  g_return_if_fail (loss && loss->n == 1);
  if (!loss->grad)
    return;
  loss->grad[0] += 1.0f;
  size_t nb = g->watch.bucket ? (g->watch.n + g->watch.bucket - 1) / g->watch.bucket : 0, next = nb;
  size_t *first = nb ? watch_first (g, nb) : NULL;
  if (first)
    watch_ready (g, first, g->n_nodes, &next);
  /* the mutation tests' 1 % error: not while profiling (a profiled
   * backward is the reference some tests compare the other paths with) */
  int mutant = g->prof ? -1 : psm_mutant_op ();
  gint64 t = g->prof ? g_get_monotonic_time () : 0;
  for (size_t i = g->n_nodes; i-- > 0;) {
    PsmNode *nd = g->nodes[i];
    if (G_UNLIKELY ((int) nd->op == mutant))
      mutated_backward (nd);
    else
      psm_op_table[nd->op].backward (nd);
    if (g->prof) {
      gint64 now = g_get_monotonic_time ();
      g->prof->bwd[nd->phase][nd->op] += 1e-6 * (double) (now - t);
      t = now;
    }
    if (first)
      watch_ready (g, first, i, &next);
  }
  if (g->prof)
    g->prof->steps++;
  g_free (first);
}
