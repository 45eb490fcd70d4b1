/* psm-metric.h — metric plugins: accumulate (hypothesis, reference) pairs or
 * token losses, report named scores. */
#ifndef PSM_METRIC_H
#define PSM_METRIC_H
#include "psm-plugin.h"
#include <stdint.h>
G_BEGIN_DECLS

typedef struct {
  int len;
  const int32_t *ids;          /* word ids (extended space) */
  const char *const *words;    /* their text, or NULL */
} PsmSeq;

#define PSM_METRIC_MAX_VALUES 8
typedef struct {
  int n;
  const char *names[PSM_METRIC_MAX_VALUES];
  double values[PSM_METRIC_MAX_VALUES];
} PsmMetricReport;

typedef struct {
  guint32 size;
  void *(*create) (const PsmSection *cfg, GError **error);
  void (*destroy) (void *self);
  void (*reset) (void *self);
  void (*add) (void *self, const PsmSeq *hyp, const PsmSeq *ref);   /* may be NULL */
  void (*add_loss) (void *self, double nll_sum, long n_tokens);     /* may be NULL */
  void (*report) (void *self, PsmMetricReport *out);  /* values[0] is primary */
  gboolean higher_is_better;   /* of the primary value */
} PsmMetricClass;

G_END_DECLS
#endif
