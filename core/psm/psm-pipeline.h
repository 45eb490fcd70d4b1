/* psm-pipeline.h — pipeline files: reading, --set, the plugins they name and
 * the validated sections. It also includes the rest of the API a program
 * that drives runs uses, one header a concern (ABI 1.20): psm-model.h (a
 * model built from a pipeline), psm-run.h (training, evaluation, decoding
 * in a run folder), psm-dist.h (MPI), psm-out.h (the library's reports),
 * psm-score.h (psm-run score). Used by psm-run; a program embedding psm can
 * drive runs the same way. */
#ifndef PSM_PIPELINE_H
#define PSM_PIPELINE_H
#include "psm.h"
#include "psm-error.h"
G_BEGIN_DECLS

typedef struct PsmPipeline PsmPipeline;

/* Parses FILE, applies the --set assignments (NULL-terminated, may be NULL),
 * resolves every plugin and validates every section against its table.
 * Errors are PSM_CONFIG_ERROR (all problems, one per line) or
 * PSM_PLUGIN_ERROR; both are usage/config errors (exit 2). */
PsmPipeline *psm_pipeline_load (const char *file, const char *const *sets, GError **error);
void psm_pipeline_free (PsmPipeline *pl);
const char *psm_pipeline_file (const PsmPipeline *pl);
/* A second training phase (continue.steps > 0; e.g. See et al.'s coverage
 * phase): psm_pipeline_continued loads the same file with the same --set
 * assignments, then continue.set, train.steps raised by continue.steps and
 * the same run folder. NULL without error when pl has none (and for the
 * second phase itself). */
gboolean psm_pipeline_has_continue (const PsmPipeline *pl);
PsmPipeline *psm_pipeline_continued (const PsmPipeline *pl, GError **error);
/* Notes about the pipeline as read (i-th, or NULL past the end): settings
 * dropped because --set swapped a plugin that does not declare them. */
const char *psm_pipeline_note (const PsmPipeline *pl, guint i);
/* A core or plugin section by path: "task", "model.embedding",
 * "model.encoder", "model.decoder", "model.head", "train",
 * "train.optimizer", "eval", "decode", "run". NULL if the pipeline has no
 * such component (no decoder). Owned by pl. */
const PsmSection *psm_pipeline_section (const PsmPipeline *pl, const char *path);
const PsmPlugin *psm_pipeline_plugin (const PsmPipeline *pl, const char *path);
int psm_pipeline_n_metrics (const PsmPipeline *pl);
const PsmPlugin *psm_pipeline_metric (const PsmPipeline *pl, int i, const PsmSection **section);
/* The run folder (run.dir, default runs/<pipeline name>). */
const char *psm_pipeline_run_dir (const PsmPipeline *pl);
/* Models built from pl only evaluate or decode (psm-run --mode eval and
 * decode): the task is told it may leave the training split unread
 * (PsmTaskCtx.eval_only). Carried into the second phase. Default FALSE. */
void psm_pipeline_set_eval_only (PsmPipeline *pl, gboolean eval_only);
gboolean psm_pipeline_eval_only (const PsmPipeline *pl);
/* Models built from pl only decode raw text (psm-run --mode decode --input,
 * psm-run serve): the task is told it may leave every split unread
 * (PsmTaskCtx.text_only). Implies eval_only. Carried into the second phase.
 * Default FALSE. */
void psm_pipeline_set_text_only (PsmPipeline *pl, gboolean text_only);
gboolean psm_pipeline_text_only (const PsmPipeline *pl);
/* Writes the pipeline with overrides applied. */
gboolean psm_pipeline_write (const PsmPipeline *pl, const char *path, GError **error);

/* Core sections and their tables, for --list and the man page. */
typedef struct {
  const char *path;
  const char *doc;
  const PsmParamSpec *spec;
} PsmCoreSection;
const PsmCoreSection *psm_core_sections (void);   /* ends with path == NULL */

G_END_DECLS
#include "psm-model.h"
#include "psm-run.h"
#include "psm-dist.h"
#include "psm-out.h"
#include "psm-score.h"
#endif
