/* notes.c — what one op leaves on a graph for others, each table in a slot
 * of the graph (psm_graph_slot) keyed by the data of the tensor it is
 * about, emptied at every reset unless said otherwise:
 *   lookups    psm_embedding's rows are table[ids]: psm_linear projects
 *              each distinct id once (embedding_linear, matmul.c);
 *   dropouts   psm_locked_dropout's output is its input times a mask
 *              repeated every period floats: psm_linear skips the dropped
 *              units (dropout_linear, linear-dropout.c);
 *   repeats    decoding: a beam's repeated annotations came from a compact
 *              tensor, which the attention reads once for all the beams
 *              of an article (kept across resets; the core clears them);
 *   deferred values, deferred weights, batch-major copies: the attention's
 *              and the decoder products' gradients summed once after all
 *              the steps (attention.c, matmul.c; ops-internal.h says how).
 * The tables grow as a step needs them: no note is dropped for lack of
 * room. */
#include "config.h"
#include <string.h>
#include "ops/ops-internal.h"

/* ---- lookups and dropouts ---- */

typedef struct {
  const float *rows;
  PsmTensor *table;
  const int32_t *ids;
  int n;
} Lookup;

typedef struct {
  const float *rows, *mask;
  size_t n, period;
} Dropout;

typedef struct {
  GArray *lookups;     /* Lookup */
  GArray *dropouts;    /* Dropout */
} Notes;

static void
notes_reset (PsmGraph *g, void *st)
{
  (void) g;
  Notes *nt = st;
  if (nt->lookups)
    g_array_set_size (nt->lookups, 0);
  if (nt->dropouts)
    g_array_set_size (nt->dropouts, 0);
}

static void
notes_free (void *st)
{
  Notes *nt = st;
  if (nt->lookups)
    g_array_unref (nt->lookups);
  if (nt->dropouts)
    g_array_unref (nt->dropouts);
}

static const PsmGraphSlotClass notes_slot = { sizeof (Notes), notes_reset, notes_free };

void
psm_graph_note_lookup (PsmGraph *g, const float *rows, PsmTensor *table, const int32_t *ids, int n)
{
  Notes *nt = psm_graph_slot (g, &notes_slot);
  if (!nt->lookups)
    nt->lookups = g_array_new (FALSE, FALSE, sizeof (Lookup));
  Lookup l = { rows, table, ids, n };
  g_array_append_val (nt->lookups, l);
}

PsmTensor *
psm_graph_lookup_of (PsmGraph *g, const float *rows, int n, const int32_t **ids)
{
  Notes *nt = psm_graph_slot_get (g, &notes_slot);
  for (guint i = 0; nt && nt->lookups && i < nt->lookups->len; i++) {
    const Lookup *l = &g_array_index (nt->lookups, Lookup, i);
    if (l->rows == rows && l->n == n) {
      *ids = l->ids;
      return l->table;
    }
  }
  return NULL;
}

void
psm_graph_note_dropout (PsmGraph *g, const float *rows, size_t n, const float *mask, size_t period)
{
  Notes *nt = psm_graph_slot (g, &notes_slot);
  if (!nt->dropouts)
    nt->dropouts = g_array_new (FALSE, FALSE, sizeof (Dropout));
  Dropout d = { rows, mask, n, period };
  g_array_append_val (nt->dropouts, d);
}

const float *
psm_graph_dropout_of (PsmGraph *g, const float *rows, size_t n, size_t *period)
{
  Notes *nt = psm_graph_slot_get (g, &notes_slot);
  for (guint i = 0; nt && nt->dropouts && i < nt->dropouts->len; i++) {
    const Dropout *d = &g_array_index (nt->dropouts, Dropout, i);
    if (d->rows == rows && d->n == n) {
      *period = d->period;
      return d->mask;
    }
  }
  return NULL;
}

/* ---- beam repeats (kept across resets) ---- */

typedef struct {
  const float *repeated, *compact;
  int group;
} Repeat;

typedef struct {
  GArray *reps;        /* Repeat */
} Repeats;

static void
repeats_free (void *st)
{
  Repeats *r = st;
  if (r->reps)
    g_array_unref (r->reps);
}

static const PsmGraphSlotClass repeats_slot = { sizeof (Repeats), NULL, repeats_free };

void
psm_graph_add_repeat (PsmGraph *g, const float *repeated, const float *compact, int group)
{
  if (!repeated || !compact)
    return;   /* not noted: the op reads the repeated copy */
  Repeats *r = psm_graph_slot (g, &repeats_slot);
  if (!r->reps)
    r->reps = g_array_new (FALSE, FALSE, sizeof (Repeat));
  Repeat e = { repeated, compact, group };
  g_array_append_val (r->reps, e);
}

const float *
psm_graph_repeat_of (PsmGraph *g, const float *repeated, int *group)
{
  Repeats *r = psm_graph_slot_get (g, &repeats_slot);
  for (guint i = 0; r && r->reps && i < r->reps->len; i++) {
    const Repeat *e = &g_array_index (r->reps, Repeat, i);
    if (e->repeated == repeated) {
      *group = e->group;
      return e->compact;
    }
  }
  return NULL;
}

void
psm_graph_clear_repeats (PsmGraph *g)
{
  Repeats *r = psm_graph_slot_get (g, &repeats_slot);
  if (r && r->reps)
    g_array_set_size (r->reps, 0);
}

/* ---- deferred gradients and batch-major copies ---- */

typedef struct {
  GPtrArray *values;    /* PsmDeferredValues * */
  GPtrArray *weights;   /* PsmDeferredWeight * */
  GPtrArray *bmajor;    /* PsmBatchMajor * (in the arena) */
  gboolean no_bmajor;   /* psm_graph_set_batch_major (g, FALSE); kept across resets */
} Deferred;

static void
deferred_reset (PsmGraph *g, void *st)
{
  (void) g;
  Deferred *d = st;
  if (d->values)
    g_ptr_array_set_size (d->values, 0);
  if (d->weights)
    g_ptr_array_set_size (d->weights, 0);
  if (d->bmajor)
    g_ptr_array_set_size (d->bmajor, 0);
}

static void
deferred_free (void *st)
{
  Deferred *d = st;
  if (d->values)
    g_ptr_array_unref (d->values);
  if (d->weights)
    g_ptr_array_unref (d->weights);
  if (d->bmajor)
    g_ptr_array_unref (d->bmajor);
}

static const PsmGraphSlotClass deferred_slot = { sizeof (Deferred), deferred_reset, deferred_free };

static void
values_free (gpointer p)
{
  PsmDeferredValues *d = p;
  g_array_unref (d->steps);
  g_array_unref (d->rows);
  g_free (d);
}

PsmDeferredValues *
psm_graph_deferred_values (PsmGraph *g, const float *grad)
{
  Deferred *df = psm_graph_slot_get (g, &deferred_slot);
  for (guint i = 0; df && df->values && grad && i < df->values->len; i++) {
    PsmDeferredValues *d = g_ptr_array_index (df->values, i);
    if (d->grad == grad)
      return d;
  }
  return NULL;
}

PsmDeferredValues *
psm_graph_add_deferred_values (PsmGraph *g, const float *grad)
{
  Deferred *df = psm_graph_slot (g, &deferred_slot);
  if (!df->values)
    df->values = g_ptr_array_new_with_free_func (values_free);
  PsmDeferredValues *d = g_new0 (PsmDeferredValues, 1);
  d->grad = grad;
  d->steps = g_array_new (FALSE, FALSE, sizeof (const float *));
  d->rows = g_array_new (FALSE, FALSE, sizeof (int));
  g_ptr_array_add (df->values, d);
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
  if (!w->grad || !psm_graph_grad_enabled (g) || !psm_paths.defer_weights || w->ndim != 2)
    return NULL;
  Deferred *df = psm_graph_slot (g, &deferred_slot);
  for (guint i = 0; df->weights && i < df->weights->len; i++) {
    PsmDeferredWeight *d = g_ptr_array_index (df->weights, i);
    if (d->grad == w->grad && d->bf16 == bf16)
      return d;
  }
  /* the node first, so that its backward runs after every product's */
  PsmTensor *in[1] = { w };
  PsmNode *nd = psm_graph_record (g, PSM_OP_DEFER_WEIGHT, psm_tensor_view (g, w, 0, w->ndim, w->shape), 1, in);
  if (!nd)
    return NULL;
  if (!df->weights)
    df->weights = g_ptr_array_new_with_free_func (dweight_free);
  PsmDeferredWeight *d = g_new0 (PsmDeferredWeight, 1);
  d->grad = w->grad;
  d->bf16 = bf16;
  d->K = w->shape[0];
  d->N = w->shape[1];
  d->rows = g_array_new (FALSE, FALSE, sizeof (PsmDeferredRows));
  g_ptr_array_add (df->weights, d);
  nd->saved = d;
  return d;
}

PsmBatchMajor *
psm_graph_batch_major (PsmGraph *g, const float *data, int T, int B, int C)
{
  Deferred *df = psm_graph_slot_get (g, &deferred_slot);
  for (guint i = 0; df && df->bmajor && data && i < df->bmajor->len; i++) {
    PsmBatchMajor *e = g_ptr_array_index (df->bmajor, i);
    if (e->data == data)
      return e->T == T && e->B == B && e->C == C ? e : NULL;
  }
  return NULL;
}

PsmBatchMajor *
psm_graph_add_batch_major (PsmGraph *g, const float *data)
{
  Deferred *df = psm_graph_slot (g, &deferred_slot);
  if (!df->bmajor)
    df->bmajor = g_ptr_array_new ();
  PsmBatchMajor *e = psm_arena_alloc0 (psm_graph_arena (g), sizeof *e);
  e->data = data;
  g_ptr_array_add (df->bmajor, e);
  return e;
}

void
psm_graph_set_batch_major (PsmGraph *g, gboolean on)
{
  ((Deferred *) psm_graph_slot (g, &deferred_slot))->no_bmajor = !on;
}

gboolean
psm_graph_batch_major_on (const PsmGraph *g)
{
  const Deferred *df = psm_graph_slot_get (g, &deferred_slot);
  return !df || !df->no_bmajor;
}

float *
psm_batch_major_grad (PsmGraph *g, PsmBatchMajor *e)
{
  if (!e->grad)
    e->grad = psm_arena_alloc0 (psm_graph_arena (g), (size_t) e->T * e->B * e->C * sizeof (float));
  return e->grad;
}
