/* psm-test.h — helpers shared by psm's Check tests. */
#ifndef PSM_TEST_H
#define PSM_TEST_H
#include <check.h>
#include <psm/psm.h>

/* Builds a scalar loss on g from the inputs the test closes over. */
typedef PsmTensor *(*PsmLossFn) (PsmGraph *g, void *ud);

/* Finite-difference gradient check of x[0..n) (analytic gradient read from
 * gx after one backward pass; gx must be the buffer the loss's tensors use).
 * Central differences with step eps, evaluated in float32 and accumulated in
 * double. Checks at most max_checks evenly spread indices. An entry passes when
 * |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|).
 * Then along two directions over all n entries (fourth-order differences,
 * steps 5e-3, 2e-3 or 8e-4: the best), the directional derivative must agree with the analytic one
 * to PSM_GRADCHECK_DTOL of sum |an_i v_i|: what catches a backward 1 % off.
 * Returns the largest violation ratio (<= 1 means pass) and fails the test
 * with the index and both values otherwise. */
#define PSM_GRADCHECK_DTOL 2e-3
double psm_test_gradcheck (const char *what, PsmLossFn f, void *ud, float *x, float *gx, size_t n,
                           float eps, double atol, double rtol, int max_checks);

/* Off: psm_test_gradcheck checks entry by entry only. For whole models:
 * their loss, a mean of -log p over all target words, carries float
 * rounding of about 1e-7, which a fourth-order difference turns into about
 * 3e-5 of directional derivative, more than PSM_GRADCHECK_DTOL of a small
 * parameter's (the ops and plugins, checked on losses made for it, keep the
 * directional check). On by default. */
void psm_test_gradcheck_directional (gboolean on);

/* psm_test_gradcheck on each parameter of p in turn (its own gradient:
 * a 1 % error in the part of the graph only one parameter reaches is not
 * diluted by the others). */
double psm_test_gradcheck_params (const char *what, PsmLossFn f, void *ud, PsmParams *p, float eps, double atol,
                                  double rtol, int max_checks);
/* Fills x with U(-a, a). */
void psm_test_fill (float *x, size_t n, float a, PsmRng *rng);
/* L = sum_i r_i y_i with fixed pseudo-random r: a generic scalar of y. */
PsmTensor *psm_test_project (PsmGraph *g, PsmTensor *y);
/* The first R rows of a batch-major [B, C] tensor, a view (as the core
 * hands a PSM_DECODER_LIVE_ROWS decoder the rows still decoding). */
PsmTensor *psm_test_first_rows (PsmGraph *g, PsmTensor *x, int R);
/* A decoder's PSM_DECODER_LIVE_ROWS contract: run (ud, g, outs, rows) runs
 * `steps` steps of it, step t on the first rows[t] rows (all with rows
 * NULL), filling outs; the flag must be set, and each step's outputs on
 * rows[t] rows must equal the first rows[t] rows of the step's outputs on
 * all rows, to 1e-6. */
typedef PsmTensor *(*PsmTestDecRun) (void *ud, PsmGraph *g, PsmDecStep *outs, const int *rows);
void psm_test_decoder_rows (const char *what, const PsmDecoderClass *dk, PsmTestDecRun run, void *ud, int steps,
                            const int *rows);
/* Sets PSM_PLUGIN_PATH to the build tree's plugins (if unset). */
void psm_test_plugin_env (void);
/* The value called name in metric m's report (fails the test without one). */
double psm_test_metric_value (const PsmMetricClass *mk, void *m, const char *name);
/* A section parsed from inline libconfig text `text` (the section's body)
 * and validated against spec; on validation errors returns NULL and sets
 * *errors to the joined messages (g_free). The file name in messages is
 * "inline.cfg". Sections stay valid until the process exits. */
const PsmSection *psm_test_section (const char *text, const char *path, const PsmParamSpec *spec,
                                    char **errors);
/* Loads psm-<kind>-<name>.so from the build tree; fails the test otherwise. */
const PsmPluginDesc *psm_test_plugin (PsmKind kind, const char *name);
/* A temporary folder for the test's files, made by psm_test_run and
 * removed (with its contents) when the suite has run. */
const char *psm_test_dir (void);
/* Writes text to name in psm_test_dir (); returns the path (g_free). */
char *psm_test_write_file (const char *name, const char *text);
/* The ABI 1.10 length-order hooks of task t on split (which must have at
 * least two examples): both set; each example's source_length is the T of
 * a batch of it alone; a batch of examples in reverse order holds them in
 * that order (example_id) and each row as the example's own batch has it;
 * an example outside the split is an error. */
void psm_test_task_batch_of (const PsmTaskClass *k, void *t, PsmSplit split);
/* Runs the suite; exit status for automake. */
int psm_test_run (Suite *s);
#endif
