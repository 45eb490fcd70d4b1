/* perplexity — exp of the mean negative log-likelihood per target word, the
 * language-modelling measure (Merity et al. 2016, Tables 2 and 3):
 *   ppl = exp (sum_t -log p(w_t) / N)
 * over every target word of the evaluated split (the core hands the summed
 * loss and the word count, add_loss). Also reports the mean NLL in nats. */
#include <math.h>
#include <psm/psm.h>

typedef struct {
  double nll;
  long n;
} Perplexity;

static void *px_create (const PsmSection *cfg, GError **error) { return g_new0 (Perplexity, 1); }
static void px_destroy (void *self) { g_free (self); }

static void
px_reset (void *self)
{
  Perplexity *p = self;
  p->nll = 0.0;
  p->n = 0;
}

static void
px_add_loss (void *self, double nll_sum, long n_tokens)
{
  Perplexity *p = self;
  p->nll += nll_sum;
  p->n += n_tokens;
}

static void
px_report (void *self, PsmMetricReport *out)
{
  Perplexity *p = self;
  double mean = p->n ? p->nll / (double) p->n : NAN;
  out->n = 2;
  out->names[0] = "perplexity";
  out->values[0] = exp (mean);
  out->names[1] = "nll";
  out->values[1] = mean;
}

static const PsmMetricClass klass = {
  .size = sizeof (PsmMetricClass),
  .create = px_create,
  .destroy = px_destroy,
  .reset = px_reset,
  .add_loss = px_add_loss,
  .report = px_report,
  .higher_is_better = FALSE,
  .multi_reference = FALSE,
};

PSM_PLUGIN (PSM_KIND_METRIC, "perplexity", "exp of the mean negative log-likelihood per target word", NULL, NULL,
            &klass)
