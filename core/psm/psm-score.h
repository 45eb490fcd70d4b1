/* psm-score.h — text metrics over line-aligned files, without a model
 * (psm-run score; part of psm-pipeline.h's API, ABI 1.20) */
#ifndef PSM_SCORE_H
#define PSM_SCORE_H
#include <glib.h>
G_BEGIN_DECLS

/* psm-run score: the text metrics named (NULL-terminated) over line-aligned
 * files — summaries, references (refs, NULL-terminated: one file, or
 * several of alternative references for metrics that take them,
 * PsmMetricClass.multi_reference) and optionally sources ("-": standard
 * input), one example a line, sentences separated by the token sep (NULL:
 * none) — printing one line of scores per metric. sets: "METRIC.key=value"
 * settings of the metrics. */
gboolean psm_score_files (const char *const *metrics, const char *const *sets, const char *hyp,
                          const char *const *refs, const char *src, const char *sep, GError **error);

G_END_DECLS
#endif
