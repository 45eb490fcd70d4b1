/* accuracy.c — percentage of exactly right sequences */
#include <psm/psm.h>

typedef struct { long right, total; } Acc;

static void *create (const PsmSection *cfg, GError **error) { return g_new0 (Acc, 1); }
static void destroy (void *self) { g_free (self); }
static void reset (void *self) { Acc *a = self; a->right = a->total = 0; }

static void
add (void *self, const PsmSeq *hyp, const PsmSeq *ref)
{
  Acc *a = self;
  gboolean same = hyp->len == ref->len;
  for (int i = 0; same && i < hyp->len; i++)
    same = hyp->ids[i] == ref->ids[i];
  a->right += same;
  a->total++;
}

static void
report (void *self, PsmMetricReport *out)
{
  Acc *a = self;
  out->n = 1;
  out->names[0] = "accuracy";
  out->values[0] = a->total ? 100.0 * a->right / a->total : 0.0;
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass), .create = create, .destroy = destroy, .reset = reset,
  .add = add, .report = report, .higher_is_better = TRUE
};

PSM_PLUGIN (PSM_KIND_METRIC, "accuracy", "percentage of exactly right outputs", NULL, NULL, &klass)
