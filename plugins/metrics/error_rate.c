/* error_rate — percentage of target tokens predicted wrongly:
 *   100 * sum_pairs (mismatched positions + |len_h - len_r|) / sum_pairs max(len_h, len_r)
 * For one-token targets (rarest word) this is the paper's error rate. */
#include <psm/psm.h>

typedef struct {
  long errors, total;
} ErrorRate;

static void *er_create (const PsmSection *cfg, GError **error) { return g_new0 (ErrorRate, 1); }
static void er_destroy (void *self) { g_free (self); }

static void
er_reset (void *self)
{
  ErrorRate *e = self;
  e->errors = e->total = 0;
}

static void
er_add (void *self, const PsmSeq *hyp, const PsmSeq *ref)
{
  ErrorRate *e = self;
  int n = MIN (hyp->len, ref->len), m = MAX (hyp->len, ref->len);
  for (int i = 0; i < n; i++)
    e->errors += hyp->ids[i] != ref->ids[i];
  e->errors += m - n;
  e->total += m;
}

static void
er_report (void *self, PsmMetricReport *out)
{
  ErrorRate *e = self;
  out->n = 1;
  out->names[0] = "error_rate";
  out->values[0] = e->total ? 100.0 * (double) e->errors / (double) e->total : 0.0;
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = er_create,
  .destroy = er_destroy,
  .reset = er_reset,
  .add = er_add,
  .report = er_report,
  .higher_is_better = FALSE,
  .multi_reference = FALSE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "error_rate", "percentage of wrongly predicted target tokens", NULL, NULL, &klass)
