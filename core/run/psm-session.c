/* psm-session.c — a run folder's sessions: evaluation runs, two-phase pipelines and the --check smoke run (the training loop: psm-train.c). */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "run/run-internal.h"
#include "psm/psm-pipeline.h"

gboolean
psm_run_optim_config (const PsmSection *s, PsmOptConfig *c)
{
  const char *name = psm_section_string (s, "name");
  memset (c, 0, sizeof *c);
  c->kind = strcmp (name, "sgd") == 0 ? PSM_OPT_SGD
          : strcmp (name, "adagrad") == 0 ? PSM_OPT_ADAGRAD
          : strcmp (name, "adadelta") == 0 ? PSM_OPT_ADADELTA
                                            : PSM_OPT_ADAM;
  c->lr = psm_section_float (s, "lr");
  c->beta1 = psm_section_float (s, "beta1");
  c->beta2 = psm_section_float (s, "beta2");
  c->eps = psm_section_float (s, "eps");
  c->init_accum = psm_section_float (s, "init_accum");
  c->rho = psm_section_float (s, "rho");
  c->halve_start = (long) psm_section_int (s, "halve_start");
  c->halve_every = (long) psm_section_int (s, "halve_every");
  return TRUE;
}

/* A file of the run folder could not be written (errno says why). */
gboolean
psm_run_write_failed (GError **error, const char *path)
{
  g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write: %s", path, psm_file_error (errno));
  return FALSE;
}

/* Appends one JSON record to the run's log and flushes it; a failed write
 * (full disk, quota) is an error, not a log that silently stays empty. */
gboolean
psm_run_log_append (FILE *log, const char *path, const char *record, GError **error)
{
  if (fputs (record, log) < 0 || fflush (log) != 0 || ferror (log))
    return psm_run_write_failed (error, path);
  return TRUE;
}

gboolean
psm_run_json_eval (FILE *log, const char *path, long step, const char *split, double t, const PsmEvalResult *r,
           GError **error)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "{\"step\": %ld, \"split\": \"%s\", \"time\": %.3f, \"loss\": %.6g, \"examples\": %ld",
                          step, split, t, r->loss, r->n_examples);
  for (int i = 0; i < r->n_metrics; i++)
    for (int k = 0; k < r->metrics[i].n; k++)
      g_string_append_printf (s, ", \"%s\": %.6g", r->metrics[i].names[k], r->metrics[i].values[k]);
  g_string_append (s, "}\n");
  gboolean ok = psm_run_log_append (log, path, s->str, error);
  g_string_free (s, TRUE);
  return ok;
}

void
psm_run_print_eval (const char *what, long step, const PsmEvalResult *r, gboolean best)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "%s step %ld: loss %.4f", what, step, r->loss);
  for (int i = 0; i < r->n_metrics; i++)
    for (int k = 0; k < r->metrics[i].n; k++)
      g_string_append_printf (s, "  %s %.4f", r->metrics[i].names[k], r->metrics[i].values[k]);
  g_string_append_printf (s, "  (%ld examples)%s", r->n_examples, best ? "  * best" : "");
  psm_out (PSM_OUT_RESULT, "%s\n", s->str);
  fflush (stdout);
  g_string_free (s, TRUE);
}

/* --- two-phase pipelines (continue.*) --- */

/* Replaces *pl and *m by the second phase's pipeline and model. */
static gboolean
enter_phase_two (PsmPipeline **pl, PsmModel **m, gboolean check, GError **error)
{
  PsmPipeline *two = psm_pipeline_continued (*pl, error);
  if (!two)
    return FALSE;
  PsmModel *m2 = psm_model_new (two, check, error);
  if (!m2) {
    psm_pipeline_free (two);
    return FALSE;
  }
  psm_model_free (*m);
  psm_pipeline_free (*pl);
  *pl = two;
  *m = m2;
  return TRUE;
}

static char *
phase_one_path (const PsmPipeline *pl)
{
  return g_build_filename (psm_pipeline_run_dir (pl), "phase1.ckpt", NULL);
}

/* Ends phase one in the run folder: its last state stays as phase1.ckpt,
 * its best as phase1.best.ckpt (phase two keeps a best of its own: its
 * validation loss has another term). Safe to repeat after a crash. */
static gboolean
close_phase_one (const PsmPipeline *pl, GError **error)
{
  const char *dir = psm_pipeline_run_dir (pl);
  char *best = g_build_filename (dir, "best.ckpt", NULL);
  char *best1 = g_build_filename (dir, "phase1.best.ckpt", NULL);
  char *last = g_build_filename (dir, "last.ckpt", NULL);
  char *one = phase_one_path (pl);
  char *tmp = g_strdup_printf ("%s.tmp.%d", one, (int) getpid ());
  gboolean ok = TRUE;
  if (g_file_test (best, G_FILE_TEST_EXISTS) && g_rename (best, best1) != 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot rename to %s: %s", best, best1,
                 g_strerror (errno));
    ok = FALSE;
  }
  /* Checkpoints are replaced by rename, never rewritten in place: a hard
   * link keeps phase one's state without copying it. */
  if (ok && link (last, tmp) != 0) {
    char *data = NULL;
    gsize n = 0;
    ok = g_file_get_contents (last, &data, &n, error) && g_file_set_contents (tmp, data, (gssize) n, error);
    g_free (data);
  }
  if (ok && g_rename (tmp, one) != 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write: %s", one, g_strerror (errno));
    ok = FALSE;
  }
  if (!ok)
    g_unlink (tmp);
  g_free (tmp);
  g_free (one);
  g_free (last);
  g_free (best1);
  g_free (best);
  return ok;
}

gboolean
psm_train_phases (PsmPipeline **pl, PsmModel **m, PsmTrainOptions *opt, GError **error)
{
  if (!psm_pipeline_has_continue (*pl))
    return psm_train (*m, opt, error);
  char *one = phase_one_path (*pl);
  gboolean in_two = opt->resume && g_file_test (one, G_FILE_TEST_EXISTS);
  g_free (one);
  opt->phase = 1;
  if (!in_two && !psm_train (*m, opt, error))
    return FALSE;
  if (opt->stopped)   /* a signal or --stop-after in phase one: it goes on at --resume */
    return TRUE;
  if (!in_two && !close_phase_one (*pl, error))
    return FALSE;
  long left = opt->stop_after > 0 ? opt->stop_after - (in_two ? 0 : opt->trained) : 0;
  if (opt->stop_after > 0 && left <= 0) {
    opt->stopped = -1;
    if (!opt->quiet)
      psm_out (PSM_OUT_RESULT, "stopped at the end of phase one (--stop-after): continue with --resume\n");
    return TRUE;
  }
  if (!enter_phase_two (pl, m, FALSE, error))
    return FALSE;
  if (!opt->quiet)
    psm_out (PSM_OUT_RESULT, "second phase (continue.set): %" G_GINT64_FORMAT " more steps from %s/phase1.ckpt\n",
            psm_section_int (psm_pipeline_section (*pl, "continue"), "steps"), psm_pipeline_run_dir (*pl));
  PsmTrainOptions o2 = *opt;
  o2.resume = TRUE;
  o2.stop_after = left;
  o2.phase = 2;
  gboolean ok = psm_train (*m, &o2, error);
  opt->stopped = o2.stopped;
  opt->trained += o2.trained;
  return ok;
}

gboolean
psm_run_select_phase (PsmPipeline **pl, GError **error)
{
  if (!psm_pipeline_has_continue (*pl))
    return TRUE;
  char *one = phase_one_path (*pl);
  gboolean two = g_file_test (one, G_FILE_TEST_EXISTS);
  g_free (one);
  if (!two)
    return TRUE;
  PsmPipeline *p2 = psm_pipeline_continued (*pl, error);
  if (!p2)
    return FALSE;
  psm_pipeline_free (*pl);
  *pl = p2;
  return TRUE;
}

gboolean
psm_run_check_phases (PsmPipeline **pl, PsmModel **m, GError **error)
{
  if (!psm_run_check (*m, error))
    return FALSE;
  if (!psm_pipeline_has_continue (*pl))
    return TRUE;
  psm_out (PSM_OUT_RESULT, "check: the second phase (continue.set)\n");
  return enter_phase_two (pl, m, TRUE, error) && psm_run_check (*m, error);
}

static const char *
split_name (PsmSplit s)
{
  return s == PSM_SPLIT_TRAIN ? "train" : s == PSM_SPLIT_VALID ? "valid" : "test";
}

/* Decoding's outputs are written to PATH.part and renamed over PATH only
 * when the whole decoding has succeeded (finish_output): a decoding that
 * fails leaves the earlier files as they were. */
static FILE *
open_output (const char *dir, const char *name, const char *split, const char *ext, char **path, GError **error)
{
  *path = g_strdup_printf ("%s/%s.%s.%s", dir, name, split, ext);
  char *part = g_strconcat (*path, ".part", NULL);
  FILE *f = psm_fopen_nofollow (part, "w");
  if (!f)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write: %s", part, psm_file_error (errno));
  g_free (part);
  return f;
}

static gboolean
close_output (FILE *f, const char *path, gboolean ok, GError **error)
{
  if (!f)
    return ok;
  gboolean written = !ferror (f) && fflush (f) == 0;
  written = fclose (f) == 0 && written;
  if (!written && ok)
    return psm_run_write_failed (error, path);
  return ok;
}

static gboolean
finish_output (const char *path, gboolean ok, GError **error)
{
  if (!path)
    return ok;
  char *part = g_strconcat (path, ".part", NULL);
  if (ok && g_rename (part, path) != 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot rename it to %s: %s", part, path,
                 g_strerror (errno));
    ok = FALSE;
  }
  if (!ok)
    g_unlink (part);
  g_free (part);
  return ok;
}

/* Loads the run folder's best checkpoint (else its last); its path. */
static char *
load_best (PsmModel *m, PsmCheckpointMeta *meta, GError **error)
{
  const char *dir = psm_pipeline_run_dir (psm_model_pipeline (m));
  char *path = g_build_filename (dir, "best.ckpt", NULL);
  if (!g_file_test (path, G_FILE_TEST_EXISTS)) {
    g_free (path);
    path = g_build_filename (dir, "last.ckpt", NULL);
  }
  if (!g_file_test (path, G_FILE_TEST_EXISTS)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "%s: no checkpoint to evaluate (train first, or point --set run.dir at a run)", dir);
    g_free (path);
    return NULL;
  }
  if (!psm_checkpoint_load (path, psm_model_params (m), NULL, meta, error)) {
    g_free (path);
    return NULL;
  }
  g_clear_pointer (&meta->stream, g_bytes_unref);   /* evaluation starts its own streams */
  return path;
}

char *
psm_run_load_best (PsmModel *m, long *step, GError **error)
{
  PsmCheckpointMeta meta;
  char *path = load_best (m, &meta, error);
  if (path && step)
    *step = meta.step;
  return path;
}

gboolean
psm_run_decode_input (PsmModel *m, const char *input, gboolean json, GError **error)
{
  PsmCheckpointMeta meta;
  char *path = load_best (m, &meta, error);
  if (!path)
    return FALSE;
  char **lines = psm_read_lines (input, "--input", error);
  if (!lines) {
    g_free (path);
    return FALSE;
  }
  int n = (int) g_strv_length (lines);
  PsmEvalOptions eo = { 0, TRUE, json ? NULL : stdout, NULL, json ? stdout : NULL, isatty (2), NULL, NULL };
  gboolean ok = n > 0;
  if (!ok)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "--input %s: no text to decode (one article a line)",
                 input);
  if (ok)
    ok = psm_model_decode_texts (m, (const char *const *) lines, n, &eo, error);
  if (ok && (fflush (stdout) != 0 || ferror (stdout))) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "standard output: cannot write: %s", g_strerror (errno));
    ok = FALSE;
  }
  if (ok)
    psm_out (PSM_OUT_NOTE, "psm-run: decoded %d text%s with %s (step %ld)\n", n, n == 1 ? "" : "s", path, meta.step);
  g_strfreev (lines);
  g_free (path);
  return ok;
}

/* The first n summaries beside their references. */
static void
print_examples (const char *out_path, const char *ref_path, int n)
{
  char *a = NULL, *b = NULL;
  if (!g_file_get_contents (out_path, &a, NULL, NULL) || !g_file_get_contents (ref_path, &b, NULL, NULL)) {
    g_free (a);
    return;
  }
  char **h = g_strsplit (a, "\n", n + 1), **r = g_strsplit (b, "\n", n + 1);
  for (int i = 0; i < n && h[i] && r[i] && (*h[i] || *r[i]); i++)
    psm_out (PSM_OUT_RESULT, "example %d\n  summary:   %s\n  reference: %s\n", i + 1, h[i], r[i]);
  g_strfreev (h);
  g_strfreev (r);
  g_free (a);
  g_free (b);
}

gboolean
psm_run_eval (PsmModel *m, PsmSplit split, gboolean write_decodes, gboolean json, GError **error)
{
  PsmPipeline *pl = psm_model_pipeline (m);
  const char *dir = psm_pipeline_run_dir (pl);
  PsmCheckpointMeta meta;
  char *path = load_best (m, &meta, error);
  if (!path)
    return FALSE;
  gboolean seq = psm_model_has_decoder (m);
  const char *sn = split_name (split);
  PsmEvalOptions eo = { psm_section_int (psm_pipeline_section (pl, "eval"), "examples"), TRUE, NULL, NULL, NULL,
                        isatty (2), NULL, NULL };
  char *out_path = NULL, *ref_path = NULL, *json_path = NULL;
  gboolean ok = TRUE;
  if (write_decodes) {
    eo.out = open_output (dir, "decode", sn, "txt", &out_path, error);
    ok = eo.out != NULL;
    if (ok && seq) {
      eo.ref = open_output (dir, "reference", sn, "txt", &ref_path, error);
      ok = eo.ref != NULL;
    }
    if (ok && seq && json) {
      eo.json = open_output (dir, "decode", sn, "jsonl", &json_path, error);
      ok = eo.json != NULL;
    }
  }
  PsmEvalResult r;
  if (ok)
    ok = psm_model_evaluate (m, split, &eo, &r, error);
  ok = close_output (eo.out, out_path, ok, error);
  ok = close_output (eo.ref, ref_path, ok, error);
  ok = close_output (eo.json, json_path, ok, error);
  ok = finish_output (out_path, ok, error);
  ok = finish_output (ref_path, ok, error);
  ok = finish_output (json_path, ok, error);
  if (ok) {
    char *what = g_strdup_printf ("%s (%s)", sn, path);
    psm_run_print_eval (what, meta.step, &r, FALSE);
    g_free (what);
    if (seq)
      psm_out (PSM_OUT_RESULT, "%ld articles in %.1f s (%.2f articles/s, beam %d%s)%s", r.n_examples, r.decode_seconds,
              r.n_examples / MAX (r.decode_seconds, 1e-9),
              (int) psm_section_int (psm_pipeline_section (pl, "decode"), "beam"),
              strcmp (psm_section_string (psm_pipeline_section (pl, "decode"), "precision"), "bf16") ? ""
              : psm_amx_usable () ? ", bf16 products on AMX tiles"
                                  : ", bf16 operands on the single-precision kernel (no AMX here)",
              isnan (r.mean_gate) ? "\n" : "");
    if (seq && !isnan (r.mean_gate))
      psm_out (PSM_OUT_RESULT, ", mean p_gen %.3f\n", r.mean_gate);
    double dec = r.decode_phases[0] + r.decode_phases[1] + r.decode_phases[2] + r.decode_phases[3];
    if (seq && dec > 0 && r.n_examples > 0)
      psm_out (PSM_OUT_RESULT, "decoding %.4f s an article: encoder %.1f%%, decoder steps %.1f%%, output layer %.1f%%, beam search "
              "%.1f%%; source padding %.1f%%\n", dec / r.n_examples, 100 * r.decode_phases[0] / dec,
              100 * r.decode_phases[1] / dec, 100 * r.decode_phases[2] / dec, 100 * r.decode_phases[3] / dec,
              100 * r.decode_padding);
    if (!seq && !isnan (r.mean_gate))
      psm_out (PSM_OUT_RESULT, "mean gate (probability of the vocabulary softmax) %.4f over %ld words\n", r.mean_gate, r.n_examples);
    char *log_path = g_build_filename (dir, "log.jsonl", NULL);
    FILE *log = psm_fopen_nofollow (log_path, "a");
    if (!log) {
      ok = psm_run_write_failed (error, log_path);
    } else {
      ok = psm_run_json_eval (log, log_path, meta.step, sn, r.decode_seconds, &r, error);
      if (fclose (log) != 0 && ok)
        ok = psm_run_write_failed (error, log_path);
    }
    g_free (log_path);
    if (ok && out_path && seq) {
      print_examples (out_path, ref_path, 2);
      psm_out (PSM_OUT_RESULT, "summaries written to %s (references: %s%s%s)\n", out_path, ref_path, json_path ? "; per token: " : "",
              json_path ? json_path : "");
    }
    else if (ok && out_path && psm_model_streams (m))
      psm_out (PSM_OUT_RESULT, "per-word records written to %s (index<TAB>word<TAB>log p<TAB>gate)\n", out_path);
    else if (ok && out_path)
      psm_out (PSM_OUT_RESULT, "decodes written to %s (hypothesis<TAB>reference)\n", out_path);
  }
  g_free (ref_path);
  g_free (json_path);
  g_free (out_path);
  g_free (path);
  return ok;
}

static gboolean
check_fail (GError **error, const char *what)
{
  g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "check failed: %s", what);
  return FALSE;
}

gboolean
psm_run_check (PsmModel *m, GError **error)
{
  PsmPipeline *pl = psm_model_pipeline (m);
  const PsmSection *train = psm_pipeline_section (pl, "train");
  PsmParams *params = psm_model_params (m);
  PsmGraph *g = psm_model_graph (m);
  PsmBatch *batch = psm_model_batch (m);
  psm_out (PSM_OUT_RESULT, "check %s: pipeline valid, model built (%zu parameters)\n", psm_pipeline_file (pl),
          psm_params_size (params));

  /* A few steps on one small batch: the loss must stay finite and fall. */
  PsmOptConfig oc;
  psm_run_optim_config (psm_pipeline_section (pl, "train.optimizer"), &oc);
  PsmOptim *optim = psm_optim_new (&oc, params);
  PsmRng rng;
  psm_rng_seed (&rng, (guint64) psm_section_int (train, "seed"));
  int B = (int) MIN (psm_section_int (train, "batch"), 16);
  psm_model_check_mode (m);
  if (!psm_model_train_batch (m, B, &rng, error)) {
    psm_optim_free (optim);
    return FALSE;
  }
  double clip = psm_section_float (train, "clip_norm");
  float first = 0.0f, lastv = 0.0f, best = 0.0f;
  const int steps = 12;
  /* over MPI, as training does: each rank its share of the batch's rows,
   * the gradients weighted by it and summed */
  int nr = psm_dist_size (), rank = psm_dist_rank ();
  double share = 1.0;
  size_t P = psm_params_size (params);
  if (nr > 1) {
    if (B < nr) {
      psm_optim_free (optim);
      return check_fail (error, "the check batch has fewer examples than there are MPI ranks");
    }
    share = psm_model_take_share (m, rank, nr);
  }
  for (int s = 0; s < steps; s++) {
    psm_graph_reset (g);
    PsmTensor *loss = psm_model_loss (m, g, batch);
    psm_backward (g, loss);
    double lv = loss->data[0];
    psm_dist_reduce_update (psm_params_grad (params), psm_params_size (params), share, &lv, NULL, 0);
    lastv = (float) lv;
    if (s == 0)
      first = best = lastv;
    best = MIN (best, lastv);
    if (!isfinite (lastv)) {
      psm_optim_free (optim);
      return check_fail (error, "training loss is not finite");
    }
    psm_optim_step_zero (optim, s, psm_clip_scale (psm_params_grad_norm (params), clip));
  }
  /* the lowest loss, not the last: plain SGD at a language model's usual
   * rate can overshoot on a single small batch after it has fallen */
  psm_out (PSM_OUT_RESULT, "check: %d steps on one batch of %d: loss %.4f -> %.4f (lowest; last %.4f)\n", steps, B, first, best,
          lastv);
  if (!(best < first)) {
    psm_optim_free (optim);
    return check_fail (error, "the loss did not fall on a batch it trains on");
  }
  if (nr > 1) {   /* every rank must hold rank 0's parameters, bit for bit */
    float *mine = psm_params_data (params), *zero = g_memdup2 (mine, P * sizeof (float));
    psm_dist_bcast (zero, P * sizeof (float));
    double differ = memcmp (zero, mine, P * sizeof (float)) != 0;
    g_free (zero);
    psm_dist_sum_double (&differ, 1);
    if (differ > 0) {
      psm_optim_free (optim);
      return check_fail (error, "the MPI ranks' parameters differ after the same updates");
    }
    psm_out (PSM_OUT_RESULT, "check: %d MPI ranks, each on its share of the batch: parameters identical on every rank\n", nr);
  }

  /* Decode/evaluate the (tiny) validation split. */
  PsmEvalResult r;
  PsmEvalOptions eo = { psm_model_has_decoder (m) ? 4 : 64, TRUE, NULL, NULL, NULL, FALSE, NULL, NULL };
  if (!psm_model_evaluate (m, PSM_SPLIT_VALID, &eo, &r, error)) {
    psm_optim_free (optim);
    return FALSE;
  }
  if (r.n_examples == 0 || !isfinite (r.loss)) {
    psm_optim_free (optim);
    return check_fail (error, "evaluation produced no finite result");
  }
  psm_run_print_eval ("check: valid", steps, &r, FALSE);

  /* Checkpoint round-trip through a temporary folder. */
  char *tmpdir = g_dir_make_tmp ("psm-check-XXXXXX", error);
  if (!tmpdir) {
    psm_optim_free (optim);
    return FALSE;
  }
  char *path = g_build_filename (tmpdir, "check.ckpt", NULL);
  size_t n = psm_params_size (params);
  float *saved = g_memdup2 (psm_params_data (params), n * sizeof (float));
  PsmCheckpointMeta meta = { steps, rng, r.primary, 1.0, NAN, 0, NULL };
  gboolean ok = psm_checkpoint_save (path, params, optim, TRUE, &meta, error);
  if (ok) {
    for (size_t i = 0; i < n; i++)
      psm_params_data (params)[i] = 0.0f;
    PsmCheckpointMeta back;
    ok = psm_checkpoint_load (path, params, optim, &back, error);
    if (ok && (memcmp (saved, psm_params_data (params), n * sizeof (float)) != 0 ||
               back.step != steps || memcmp (&back.rng, &rng, sizeof rng) != 0))
      ok = check_fail (error, "checkpoint round-trip changed the parameters or the run state");
    PsmEvalResult r2;
    if (ok && !psm_model_evaluate (m, PSM_SPLIT_VALID, &eo, &r2, error))
      ok = FALSE;
    if (ok && r2.loss != r.loss)
      ok = check_fail (error, "validation loss differs after the checkpoint round-trip");
    if (ok)
      psm_out (PSM_OUT_RESULT, "check: checkpoint round-trip exact (%zu floats)\n", n);
  }
  g_unlink (path);
  g_rmdir (tmpdir);
  g_free (path);
  g_free (tmpdir);
  g_free (saved);
  psm_optim_free (optim);
  if (ok)
    psm_out (PSM_OUT_RESULT, "check: OK\n");
  return ok;
}
