/* psm-run.c — training loop, evaluation runs and the --check smoke run. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "psm-private.h"
#include "psm/psm-pipeline.h"

G_DEFINE_QUARK (psm-run-error-quark, psm_run_error)

static gboolean
optim_config (const PsmSection *s, PsmOptConfig *c)
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

static void
fmt_duration (char *buf, size_t n, double s)
{
  if (!isfinite (s) || s < 0)
    g_snprintf (buf, n, "?");
  else if (s < 60)
    g_snprintf (buf, n, "%.0fs", s);
  else if (s < 3600)
    g_snprintf (buf, n, "%dm%02ds", (int) s / 60, (int) s % 60);
  else
    g_snprintf (buf, n, "%dh%02dm", (int) s / 3600, ((int) s % 3600) / 60);
}

/* "step N/M  loss L  R tok/s  ETA T": the progress line and log line. */
static void
progress_text (char *buf, size_t n, long done, long steps, long start_step, double elapsed,
               double loss, double rate)
{
  char eta[32];
  fmt_duration (eta, sizeof eta, (double) (steps - done) * (elapsed / (double) (done - start_step)));
  g_snprintf (buf, n, "step %ld/%ld  loss %.4f  %.0f tok/s  ETA %s", done, steps, loss, rate, eta);
}

/* A file of the run folder could not be written (errno says why). */
static gboolean
write_failed (GError **error, const char *path)
{
  g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write: %s", path, g_strerror (errno));
  return FALSE;
}

/* Appends one JSON record to the run's log and flushes it; a failed write
 * (full disk, quota) is an error, not a log that silently stays empty. */
static gboolean
log_append (FILE *log, const char *path, const char *record, GError **error)
{
  if (fputs (record, log) < 0 || fflush (log) != 0 || ferror (log))
    return write_failed (error, path);
  return TRUE;
}

static gboolean
json_eval (FILE *log, const char *path, long step, const char *split, double t, const PsmEvalResult *r,
           GError **error)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "{\"step\": %ld, \"split\": \"%s\", \"time\": %.3f, \"loss\": %.6g, \"examples\": %ld",
                          step, split, t, r->loss, r->n_examples);
  for (int i = 0; i < r->n_metrics; i++)
    for (int k = 0; k < r->metrics[i].n; k++)
      g_string_append_printf (s, ", \"%s\": %.6g", r->metrics[i].names[k], r->metrics[i].values[k]);
  g_string_append (s, "}\n");
  gboolean ok = log_append (log, path, s->str, error);
  g_string_free (s, TRUE);
  return ok;
}

static void
print_eval (const char *what, long step, const PsmEvalResult *r, gboolean best)
{
  GString *s = g_string_new (NULL);
  g_string_append_printf (s, "%s step %ld: loss %.4f", what, step, r->loss);
  for (int i = 0; i < r->n_metrics; i++)
    for (int k = 0; k < r->metrics[i].n; k++)
      g_string_append_printf (s, "  %s %.4f", r->metrics[i].names[k], r->metrics[i].values[k]);
  g_string_append_printf (s, "  (%ld examples)%s", r->n_examples, best ? "  * best" : "");
  printf ("%s\n", s->str);
  fflush (stdout);
  g_string_free (s, TRUE);
}

static gboolean
better (const PsmEvalResult *r, double best, gboolean have_best)
{
  if (!have_best)
    return TRUE;
  return r->higher_is_better ? r->primary > best : r->primary < best;
}

/* What a stopped run leaves behind, for its error message. */
static char *
kept_msg (const char *last)
{
  if (g_file_test (last, G_FILE_TEST_EXISTS))
    return g_strdup_printf ("The last good checkpoint (%s) is intact.", last);
  return g_strdup ("No checkpoint had been written yet (the first is written at the first validation).");
}

gboolean
psm_train (PsmModel *m, const PsmTrainOptions *opt, GError **error)
{
  PsmPipeline *pl = psm_model_pipeline (m);
  const PsmSection *train = psm_pipeline_section (pl, "train");
  const char *dir = psm_pipeline_run_dir (pl);
  char *last = g_build_filename (dir, "last.ckpt", NULL);
  char *best_path = g_build_filename (dir, "best.ckpt", NULL);
  char *log_path = g_build_filename (dir, "log.jsonl", NULL);
  char *cfg_path = g_build_filename (dir, "pipeline.cfg", NULL);
  PsmOptim *optim = NULL;
  FILE *log = NULL;
  char *kept = NULL;
  gboolean ok = FALSE;
  PsmCheckpointMeta meta = { 0, { { 0 } }, NAN, 1.0, NAN, 0, NULL };

  if (!opt->resume && g_file_test (last, G_FILE_TEST_EXISTS)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "%s: run folder already holds a run; continue it with --resume, or choose another with --set run.dir=...",
                 dir);
    goto out;
  }
  if (opt->resume && !g_file_test (last, G_FILE_TEST_EXISTS)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE, "%s: nothing to resume (no checkpoint)", last);
    goto out;
  }
  if (g_mkdir_with_parents (dir, 0755) != 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot create run folder: %s", dir,
                 g_strerror (errno));
    goto out;
  }

  PsmOptConfig oc;
  optim_config (psm_pipeline_section (pl, "train.optimizer"), &oc);
  PsmParams *params = psm_model_params (m);
  optim = psm_optim_new (&oc, params);
  psm_rng_seed (&meta.rng, (guint64) psm_section_int (train, "seed") * 7919 + 17);
  gboolean have_best = FALSE;
  if (opt->resume) {
    if (!psm_checkpoint_load (last, params, optim, &meta, error))
      goto out;
    have_best = g_file_test (best_path, G_FILE_TEST_EXISTS) && !isnan (meta.best_metric);
    psm_optim_set_lr_scale (optim, meta.lr_scale);
    printf ("resumed %s at step %ld\n", last, meta.step);
  } else {
    meta.best_metric = NAN;
    if (!psm_pipeline_write (pl, cfg_path, error) || !psm_model_save_task (m, dir, error))
      goto out;
  }
  log = fopen (log_path, opt->resume ? "a" : "w");
  if (!log) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot open log: %s", log_path,
                 g_strerror (errno));
    goto out;
  }

  long steps = (long) psm_section_int (train, "steps");
  int B = (int) psm_section_int (train, "batch");
  long eval_every = (long) psm_section_int (train, "eval_every");
  long log_every = (long) psm_section_int (train, "log_every");
  long valid_n = (long) psm_section_int (train, "valid_examples");
  double clip = psm_section_float (train, "clip_norm");
  /* the plateau schedule (Merity et al. §5.2): lr times plateau_factor
   * when a validation is worse than the one before; stop after patience
   * validations without a new best */
  double plateau = psm_section_float (psm_pipeline_section (pl, "train.optimizer"), "plateau_factor");
  long patience = (long) psm_section_int (train, "patience");
  if (opt->resume && psm_model_streams (m) && !meta.stream) {
    fprintf (stderr, "psm-run: note: %s holds no state of the training streams (written before checkpoint "
             "version 4): the streams start again from the first segment, so the resumed run differs from an "
             "uninterrupted one\n", last);
  } else if (opt->resume && !psm_model_restore_stream_state (m, meta.stream, B, error)) {
    g_prefix_error (error, "%s: ", last);
    goto out;
  }
  g_clear_pointer (&meta.stream, g_bytes_unref);
  PsmGraph *g = psm_model_graph (m);
  PsmBatch *batch = psm_model_batch (m);
  PsmProfile *prof = opt->profile ? g_new0 (PsmProfile, 1) : NULL;
  psm_graph_set_profile (g, prof);
  GTimer *timer = g_timer_new ();
  double win_loss = 0.0, win_tokens = 0.0, t_win = 0.0, t_live = 0.0;
  char line[160];
  long win_n = 0, start_step = meta.step;
  if (meta.step >= steps) {
    if (!opt->quiet)
      printf ("nothing to train: %s is at step %ld and train.steps is %ld (raise train.steps to go on)\n",
              last, meta.step, steps);
    ok = TRUE;
    goto out_timer;
  }
  if (patience > 0 && meta.bad_evals >= patience) {
    if (!opt->quiet)
      printf ("nothing to train: %s stopped at step %ld after %ld validations without a new best (raise "
              "train.patience to go on)\n", last, meta.step, meta.bad_evals);
    ok = TRUE;
    goto out_timer;
  }
  if (!opt->quiet)
    printf ("training %s: %ld steps of %d examples, %zu parameters, run folder %s\n",
            psm_pipeline_file (pl), steps, B, psm_params_size (params), dir);

  for (long step = meta.step; step < steps; step++) {
    if (!psm_model_train_batch (m, B, &meta.rng, error))
      goto out_timer;
    psm_graph_reset (g);
    PsmTensor *loss = psm_model_loss (m, g, batch);
    float lv = loss->data[0];
    if (!isfinite (lv)) {
      if (opt->progress && !opt->quiet)
        fprintf (stderr, "\n");
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "step %ld: training loss is %s; training stopped. %s",
                   step, isnan (lv) ? "NaN" : "infinite", kept = kept_msg (last));
      goto out_timer;
    }
    psm_backward (g, loss);
    gint64 t_opt = prof ? g_get_monotonic_time () : 0;
    double gnorm = psm_params_clip (params, clip);
    if (!isfinite (gnorm)) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "step %ld: gradient norm is %s; training stopped. %s",
                   step, isnan (gnorm) ? "NaN" : "infinite", kept = kept_msg (last));
      goto out_timer;
    }
    psm_optim_step (optim, step);
    psm_params_zero_grad (params);
    if (prof) {
      gint64 now = g_get_monotonic_time ();
      prof->optim += 1e-6 * (double) (now - t_opt);
    }

    double tok = 0.0;
    for (int i = 0; i < batch->T * batch->B; i++)
      tok += batch->src_mask[i];
    for (int i = 0; i < batch->Ty * batch->B; i++)
      tok += batch->tgt_mask[i];
    win_loss += lv;
    win_tokens += tok;
    win_n++;
    long done = step + 1;
    double now = g_timer_elapsed (timer, NULL);
    if (opt->progress && !opt->quiet && now - t_live >= 0.5 && done % log_every != 0) {
      progress_text (line, sizeof line, done, steps, start_step, now, win_loss / win_n,
                     now > t_win ? win_tokens / (now - t_win) : 0.0);
      fprintf (stderr, "\r%s   ", line);
      t_live = now;
    }
    if (done % log_every == 0 || done == steps) {
      double dt = now - t_win, rate = dt > 0 ? win_tokens / dt : 0.0;
      progress_text (line, sizeof line, done, steps, start_step, now, win_loss / win_n, rate);
      char *rec = g_strdup_printf ("{\"step\": %ld, \"split\": \"train\", \"time\": %.3f, \"loss\": %.6g, "
                                   "\"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f}\n",
                                   done, now, win_loss / win_n, psm_optim_lr (optim, step), gnorm, rate);
      gboolean logged = log_append (log, log_path, rec, error);
      g_free (rec);
      if (!logged)
        goto out_timer;
      if (!opt->quiet) {
        if (opt->progress)
          fprintf (stderr, "\r%s   ", line);
        else
          printf ("%s\n", line);
        fflush (stdout);
      }
      win_loss = win_tokens = 0.0;
      win_n = 0;
      t_win = now;
    }
    if (done % eval_every == 0 || done == steps) {
      /* Sequence models validate on the loss (decoding every validation
       * would cost more than the training between them). */
      PsmEvalResult r;
      PsmEvalOptions vo = { valid_n, FALSE, NULL, NULL, NULL, FALSE };
      psm_graph_set_profile (g, NULL);   /* training steps only */
      gboolean evaluated = psm_model_evaluate (m, PSM_SPLIT_VALID, &vo, &r, error);
      psm_graph_set_profile (g, prof);
      if (!evaluated)
        goto out_timer;
      if (!isfinite (r.loss)) {
        g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                     "step %ld: validation loss is not finite; training stopped. %s", done, kept = kept_msg (last));
        goto out_timer;
      }
      gboolean is_best = better (&r, meta.best_metric, have_best);
      gboolean worse = !isnan (meta.last_metric) &&
                       (r.higher_is_better ? r.primary < meta.last_metric : r.primary > meta.last_metric);
      if (plateau < 1.0 && worse) {
        meta.lr_scale *= plateau;
        psm_optim_set_lr_scale (optim, meta.lr_scale);
      }
      meta.last_metric = r.primary;
      meta.bad_evals = is_best ? 0 : meta.bad_evals + 1;
      gboolean stop = patience > 0 && meta.bad_evals >= patience && done < steps;
      meta.step = done;
      if (is_best) {
        meta.best_metric = r.primary;
        have_best = TRUE;
        if (!psm_checkpoint_save (best_path, params, optim, FALSE, &meta, error))
          goto out_timer;
      }
      meta.stream = psm_model_stream_state (m);   /* where the streams stand (LMs) */
      gboolean saved = psm_checkpoint_save (last, params, optim, TRUE, &meta, error);
      g_clear_pointer (&meta.stream, g_bytes_unref);
      if (!saved)
        goto out_timer;
      if (opt->progress && !opt->quiet)
        fprintf (stderr, "\n");
      if (!opt->quiet)
        print_eval ("valid", done, &r, is_best);
      if (!json_eval (log, log_path, done, "valid", g_timer_elapsed (timer, NULL), &r, error))
        goto out_timer;
      if (!opt->quiet && plateau < 1.0 && worse)
        printf ("validation worse than the one before: learning rate now %g\n", psm_optim_lr (optim, done));
      if (stop) {
        if (!opt->quiet)
          printf ("stopping at step %ld: %ld validations without improving on the best (train.patience)\n", done,
                  meta.bad_evals);
        steps = done;
        break;
      }
    }
  }
  if (!opt->quiet)
    printf ("trained %ld steps in %.1f s\n", steps - start_step, g_timer_elapsed (timer, NULL));
  ok = TRUE;
  if (prof && prof->steps)
    psm_profile_print (prof, stdout);
out_timer:
  g_timer_destroy (timer);
  psm_graph_set_profile (g, NULL);
  g_free (prof);
out:
  g_clear_pointer (&meta.stream, g_bytes_unref);
  if (log && fclose (log) != 0 && ok)
    ok = write_failed (error, log_path);
  psm_optim_free (optim);
  g_free (kept);
  g_free (last);
  g_free (best_path);
  g_free (log_path);
  g_free (cfg_path);
  return ok;
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
psm_train_phases (PsmPipeline **pl, PsmModel **m, const PsmTrainOptions *opt, GError **error)
{
  if (!psm_pipeline_has_continue (*pl))
    return psm_train (*m, opt, error);
  char *one = phase_one_path (*pl);
  gboolean in_two = opt->resume && g_file_test (one, G_FILE_TEST_EXISTS);
  g_free (one);
  if (!in_two && !psm_train (*m, opt, error))
    return FALSE;
  if (!in_two && !close_phase_one (*pl, error))
    return FALSE;
  if (!enter_phase_two (pl, m, FALSE, error))
    return FALSE;
  if (!opt->quiet)
    printf ("second phase (continue.set): %" G_GINT64_FORMAT " more steps from %s/phase1.ckpt\n",
            psm_section_int (psm_pipeline_section (*pl, "continue"), "steps"), psm_pipeline_run_dir (*pl));
  PsmTrainOptions o2 = *opt;
  o2.resume = TRUE;
  return psm_train (*m, &o2, error);
}

gboolean
psm_run_select_phase (PsmPipeline **pl, PsmModel **m, GError **error)
{
  if (!psm_pipeline_has_continue (*pl))
    return TRUE;
  char *one = phase_one_path (*pl);
  gboolean two = g_file_test (one, G_FILE_TEST_EXISTS);
  g_free (one);
  return !two || enter_phase_two (pl, m, FALSE, error);
}

gboolean
psm_run_check_phases (PsmPipeline **pl, PsmModel **m, GError **error)
{
  if (!psm_run_check (*m, error))
    return FALSE;
  if (!psm_pipeline_has_continue (*pl))
    return TRUE;
  printf ("check: the second phase (continue.set)\n");
  return enter_phase_two (pl, m, TRUE, error) && psm_run_check (*m, error);
}

static const char *
split_name (PsmSplit s)
{
  return s == PSM_SPLIT_TRAIN ? "train" : s == PSM_SPLIT_VALID ? "valid" : "test";
}

static FILE *
open_output (const char *dir, const char *name, const char *split, const char *ext, char **path, GError **error)
{
  *path = g_strdup_printf ("%s/%s.%s.%s", dir, name, split, ext);
  FILE *f = fopen (*path, "w");
  if (!f)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot write: %s", *path, g_strerror (errno));
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
    return write_failed (error, path);
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
  PsmEvalOptions eo = { 0, TRUE, json ? NULL : stdout, NULL, json ? stdout : NULL, isatty (2) };
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
    fprintf (stderr, "psm-run: decoded %d text%s with %s (step %ld)\n", n, n == 1 ? "" : "s", path, meta.step);
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
    printf ("example %d\n  summary:   %s\n  reference: %s\n", i + 1, h[i], r[i]);
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
                        isatty (2) };
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
  if (ok) {
    char *what = g_strdup_printf ("%s (%s)", sn, path);
    print_eval (what, meta.step, &r, FALSE);
    g_free (what);
    if (seq)
      printf ("%ld articles in %.1f s (%.2f articles/s, beam %d)%s", r.n_examples, r.decode_seconds,
              r.n_examples / MAX (r.decode_seconds, 1e-9),
              (int) psm_section_int (psm_pipeline_section (pl, "decode"), "beam"), isnan (r.mean_gate) ? "\n" : "");
    if (seq && !isnan (r.mean_gate))
      printf (", mean p_gen %.3f\n", r.mean_gate);
    double dec = r.decode_phases[0] + r.decode_phases[1] + r.decode_phases[2] + r.decode_phases[3];
    if (seq && dec > 0 && r.n_examples > 0)
      printf ("decoding %.4f s an article: encoder %.1f%%, decoder steps %.1f%%, output layer %.1f%%, beam search "
              "%.1f%%\n", dec / r.n_examples, 100 * r.decode_phases[0] / dec, 100 * r.decode_phases[1] / dec,
              100 * r.decode_phases[2] / dec, 100 * r.decode_phases[3] / dec);
    if (!seq && !isnan (r.mean_gate))
      printf ("mean gate (probability of the vocabulary softmax) %.4f over %ld words\n", r.mean_gate, r.n_examples);
    char *log_path = g_build_filename (dir, "log.jsonl", NULL);
    FILE *log = fopen (log_path, "a");
    if (!log) {
      ok = write_failed (error, log_path);
    } else {
      ok = json_eval (log, log_path, meta.step, sn, r.decode_seconds, &r, error);
      if (fclose (log) != 0 && ok)
        ok = write_failed (error, log_path);
    }
    g_free (log_path);
    if (ok && out_path && seq) {
      print_examples (out_path, ref_path, 2);
      printf ("summaries written to %s (references: %s%s%s)\n", out_path, ref_path, json_path ? "; per token: " : "",
              json_path ? json_path : "");
    }
    else if (ok && out_path && psm_model_streams (m))
      printf ("per-word records written to %s (index<TAB>word<TAB>log p<TAB>gate)\n", out_path);
    else if (ok && out_path)
      printf ("decodes written to %s (hypothesis<TAB>reference)\n", out_path);
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
  printf ("check %s: pipeline valid, model built (%zu parameters)\n", psm_pipeline_file (pl),
          psm_params_size (params));

  /* A few steps on one small batch: the loss must stay finite and fall. */
  PsmOptConfig oc;
  optim_config (psm_pipeline_section (pl, "train.optimizer"), &oc);
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
  for (int s = 0; s < steps; s++) {
    psm_graph_reset (g);
    PsmTensor *loss = psm_model_loss (m, g, batch);
    lastv = loss->data[0];
    if (s == 0)
      first = best = lastv;
    best = MIN (best, lastv);
    if (!isfinite (lastv)) {
      psm_optim_free (optim);
      return check_fail (error, "training loss is not finite");
    }
    psm_backward (g, loss);
    psm_params_clip (params, clip);
    psm_optim_step (optim, s);
    psm_params_zero_grad (params);
  }
  /* the lowest loss, not the last: plain SGD at a language model's usual
   * rate can overshoot on a single small batch after it has fallen */
  printf ("check: %d steps on one batch of %d: loss %.4f -> %.4f (lowest; last %.4f)\n", steps, B, first, best,
          lastv);
  if (!(best < first)) {
    psm_optim_free (optim);
    return check_fail (error, "the loss did not fall on a batch it trains on");
  }

  /* Decode/evaluate the (tiny) validation split. */
  PsmEvalResult r;
  PsmEvalOptions eo = { psm_model_has_decoder (m) ? 4 : 64, TRUE, NULL, NULL, NULL, FALSE };
  if (!psm_model_evaluate (m, PSM_SPLIT_VALID, &eo, &r, error)) {
    psm_optim_free (optim);
    return FALSE;
  }
  if (r.n_examples == 0 || !isfinite (r.loss)) {
    psm_optim_free (optim);
    return check_fail (error, "evaluation produced no finite result");
  }
  print_eval ("check: valid", steps, &r, FALSE);

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
      printf ("check: checkpoint round-trip exact (%zu floats)\n", n);
  }
  g_unlink (path);
  g_rmdir (tmpdir);
  g_free (path);
  g_free (tmpdir);
  g_free (saved);
  psm_optim_free (optim);
  if (ok)
    printf ("check: OK\n");
  return ok;
}
