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

#define PSM_METRIC_MAX_VALUES 16   /* 8 before ABI 1.2 */
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
  /* ABI 1.2, optional; called instead of add when set. Text metrics (ROUGE,
   * n-gram statistics) of one example: hyp is the output's words separated
   * by spaces; ref the reference's, its sentences separated by '\n'; src
   * the source's (or NULL). Texts come whole: a reference or an article is
   * not cut at the task's max_tgt / max_src when the task can say so (its
   * example_text hook). */
  void (*add_text) (void *self, const char *hyp, const char *ref, const char *src);
  /* ABI 1.7: add_text's reference lines are alternative references of the
   * hypothesis (BLEU), not sentences of one reference; psm-run score then
   * takes several reference files. */
  gboolean multi_reference;
} PsmMetricClass;

G_END_DECLS
#endif
