/* psm-train.c — the training loop: updates, validation, checkpoints, and
 * what never loses work: a checkpoint at the start and every
 * train.checkpoint_every updates, SIGINT/SIGTERM and --stop-after write one
 * and stop, non-finite losses follow train.on_nonfinite, and --resume tidies
 * what a killed process left (temporary files, log records past the
 * checkpoint) and continues bit for bit. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "psm-private.h"
#include "psm/psm-pipeline.h"

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

static gboolean
better (const PsmEvalResult *r, double best, gboolean have_best)
{
  if (!have_best)
    return TRUE;
  return r->higher_is_better ? r->primary > best : r->primary < best;
}

/* --- stop requests (SIGINT, SIGTERM) --- */

static volatile sig_atomic_t stop_signal;

static void
on_stop_signal (int sig)
{
  stop_signal = sig;
}

/* Catches SIGINT, SIGTERM and SIGUSR1 for the loop (once: a second one
 * acts as usual, SA_RESETHAND); old receives the previous actions. SIGUSR1
 * is the one mpirun forwards to every rank (it kills the ranks on SIGTERM),
 * and batch schedulers send before a job's time runs out. */
static void
catch_stop_signals (struct sigaction old[3])
{
  struct sigaction sa;
  memset (&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset (&sa.sa_mask);
  stop_signal = 0;
  sigaction (SIGINT, &sa, &old[0]);
  sigaction (SIGTERM, &sa, &old[1]);
  sigaction (SIGUSR1, &sa, &old[2]);
}

static void
restore_stop_signals (const struct sigaction old[3])
{
  sigaction (SIGINT, &old[0], NULL);
  sigaction (SIGTERM, &old[1], NULL);
  sigaction (SIGUSR1, &old[2], NULL);
}

/* --- the trainer --- */

typedef enum { NONFINITE_STOP, NONFINITE_SKIP, NONFINITE_ROLLBACK } NonfinitePolicy;

typedef struct {
  PsmModel *m;
  PsmPipeline *pl;
  PsmTrainOptions *opt;
  PsmParams *params;
  PsmOptim *optim;
  const char *dir;
  char *last, *best_path, *log_path, *cfg_path;
  FILE *log;
  PsmCheckpointMeta meta;
  gboolean have_best;
  gboolean rank0;          /* writes logs, checkpoints and outputs */
  int nranks;              /* MPI ranks sharing every batch */
  double t_reduce;         /* seconds in the gradient allreduce */
  /* settings */
  long steps, eval_every, log_every, valid_n, patience, ckpt_every;
  int B;
  double clip, plateau;
  NonfinitePolicy on_nonfinite;
  long nonfinite_max;
  double rollback_factor;
  long nonfinite_seen;     /* skips and rollbacks in this process */
  /* the log window */
  double win_loss, win_tokens, t_win, t_live;
  long win_n, start_step;
  GTimer *timer;
} Trainer;

/* What a stopped run leaves behind, for its error message. */
static char *
kept_msg (const Trainer *t)
{
  if (g_file_test (t->last, G_FILE_TEST_EXISTS))
    return g_strdup_printf ("The last good checkpoint (%s) is intact.", t->last);
  return g_strdup ("No checkpoint had been written yet.");
}

static gboolean
log_record (Trainer *t, const char *rec, GError **error)
{
  return !t->rank0 || psm_run_log_append (t->log, t->log_path, rec, error);
}

/* last.ckpt at t->meta.step, with the optimiser's and the streams' state.
 * Every rank calls it: over MPI each rank holds the state of its own
 * streams, gathered into one state of all of them for rank 0 to write. */
static gboolean
save_last (Trainer *t, GError **error)
{
  GBytes *stream = psm_model_stream_state (t->m);   /* where the streams stand (LMs) */
  if (stream && t->nranks > 1) {
    GPtrArray *parts = psm_dist_gather_bytes (stream);
    g_bytes_unref (stream);
    stream = parts ? psm_model_stream_state_merge (t->m, parts, error) : NULL;
    gboolean failed = parts && !stream;
    g_clear_pointer (&parts, g_ptr_array_unref);
    if (failed)
      return FALSE;
  }
  if (!t->rank0) {
    g_clear_pointer (&stream, g_bytes_unref);
    return TRUE;
  }
  t->meta.stream = stream;
  gboolean saved = psm_checkpoint_save (t->last, t->params, t->optim, TRUE, &t->meta, error);
  g_clear_pointer (&t->meta.stream, g_bytes_unref);
  return saved;
}

/* The name of the first parameter (in the order they were registered)
 * whose gradient holds a NaN or an infinity, and how many do; NULL if
 * none. */
static const char *
first_nonfinite_grad (PsmParams *p, int *count)
{
  const float *g = psm_params_grad (p);
  const char *first = NULL;
  *count = 0;
  for (int id = 0; id < psm_params_count (p); id++) {
    size_t n = psm_params_numel (p, id), off = psm_params_offset (p, id);
    for (size_t i = 0; i < n; i++)
      if (!isfinite (g[off + i])) {
        if (!first)
          first = psm_params_name (p, id);
        (*count)++;
        break;
      }
  }
  return first;
}

/* Over MPI: every rank takes rank 0's parameters, optimiser state and
 * schedule (rank 0 alone reads checkpoints: the run folder need not be
 * shared). */
static void
sync_from_rank0 (Trainer *t)
{
  if (t->nranks < 2)
    return;
  size_t P = psm_params_size (t->params);
  psm_dist_bcast (psm_params_data (t->params), P * sizeof (float));
  for (int k = 0; k < psm_optim_n_state (t->optim); k++)
    psm_dist_bcast (psm_optim_state (t->optim, k), P * sizeof (float));
  struct {
    long step, bad_evals;
    PsmRng rng;
    double best_metric, lr_scale, last_metric;
    int have_best;
  } st = { t->meta.step, t->meta.bad_evals, t->meta.rng, t->meta.best_metric, t->meta.lr_scale,
           t->meta.last_metric, t->have_best };
  psm_dist_bcast (&st, sizeof st);
  t->meta.step = st.step;
  t->meta.bad_evals = st.bad_evals;
  t->meta.rng = st.rng;
  t->meta.best_metric = st.best_metric;
  t->meta.lr_scale = st.lr_scale;
  t->meta.last_metric = st.last_metric;
  t->have_best = st.have_best;
  psm_optim_set_lr_scale (t->optim, t->meta.lr_scale);
}

/* This rank's streams from a state of all of them (rank 0's checkpoint);
 * over MPI every rank calls it after sync_from_rank0, and rank 0's state
 * (or NULL) reaches the others first. */
static gboolean
restore_streams (Trainer *t, GBytes *state, GError **error)
{
  if (!psm_model_streams (t->m))
    return TRUE;
  GBytes *all = psm_dist_bcast_bytes (state);
  int lo, hi;
  psm_batch_share_streams (t->B, psm_dist_rank (), t->nranks, &lo, &hi);
  gboolean ok = !all || psm_model_restore_stream_rows (t->m, all, t->B, lo, hi - lo, error);
  g_clear_pointer (&all, g_bytes_unref);
  if (!ok)
    g_prefix_error (error, "%s: ", t->last);
  return ok;
}

/* Loads last.ckpt back (parameters, optimiser, RNG, streams, schedule)
 * with the learning rate scaled by train.rollback_lr_factor. */
static gboolean
roll_back (Trainer *t, GError **error)
{
  if (!t->rank0) {   /* rank 0 reads it */
    sync_from_rank0 (t);
    return restore_streams (t, NULL, error);
  }
  PsmCheckpointMeta back = { 0 };
  if (!psm_checkpoint_load (t->last, t->params, t->optim, &back, error))
    return FALSE;
  if (psm_model_streams (t->m) && !back.stream) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: holds no state of the training streams", t->last);
    return FALSE;
  }
  GBytes *stream = g_steal_pointer (&back.stream);
  back.lr_scale *= t->rollback_factor;
  t->meta = back;
  psm_optim_set_lr_scale (t->optim, t->meta.lr_scale);
  sync_from_rank0 (t);
  gboolean ok = restore_streams (t, stream, error);
  g_clear_pointer (&stream, g_bytes_unref);
  return ok;
}

/* A non-finite training loss (what "loss") or gradient norm at update step
 * (counted from 0): stops, skips or rolls back as train.on_nonfinite says.
 * Returns FALSE with error set to stop; else *next is the next update's
 * index. */
static gboolean
on_nonfinite (Trainer *t, long step, const char *what, double v, long *next, GError **error)
{
  int n_bad = 0;
  const char *first = first_nonfinite_grad (t->params, &n_bad);
  char *where = first ? g_strdup_printf ("first non-finite gradient: %s (%d of %d parameters)", first, n_bad,
                                         psm_params_count (t->params))
                      : g_strdup ("every gradient finite");
  const char *kind = isnan (v) ? "NaN" : "infinite";
  psm_params_zero_grad (t->params);
  if (t->opt->progress && !t->opt->quiet)
    psm_out (PSM_OUT_PROGRESS_END, "%s", "");
  if (t->on_nonfinite == NONFINITE_STOP || t->nonfinite_seen >= t->nonfinite_max) {
    char *kept = kept_msg (t);
    if (t->on_nonfinite == NONFINITE_STOP)
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "step %ld: training %s is %s (%s); training stopped. %s",
                   step + 1, what, kind, where, kept);
    else
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "step %ld: training %s is %s (%s): %ld non-finite steps, more than train.nonfinite_max = %ld "
                   "allows; training stopped. %s", step + 1, what, kind, where, t->nonfinite_seen + 1,
                   t->nonfinite_max, kept);
    g_free (kept);
    g_free (where);
    return FALSE;
  }
  t->nonfinite_seen++;
  gboolean ok = TRUE;
  const char *action = "skip";
  if (t->on_nonfinite == NONFINITE_SKIP) {
    *next = step + 1;
  } else {
    action = "rollback";
    ok = roll_back (t, error);
    *next = t->meta.step;
  }
  if (ok) {
    char *rec = g_strdup_printf ("{\"step\": %ld, \"event\": \"nonfinite\", \"what\": \"%s\", \"value\": \"%s\", "
                                 "\"first_param\": \"%s\", \"params\": %d, \"action\": \"%s\", \"lr\": %.6g, "
                                 "\"count\": %ld}\n", step + 1, what, kind, first ? first : "", n_bad, action,
                                 psm_optim_lr (t->optim, *next), t->nonfinite_seen);
    ok = log_record (t, rec, error);
    g_free (rec);
  }
  if (ok && t->rank0)
    psm_out (PSM_OUT_NOTE, "psm-run: step %ld: training %s is %s (%s); %s (%ld of at most %ld)\n", step + 1, what, kind,
             where,
             t->on_nonfinite == NONFINITE_SKIP ? "update skipped" : "rolled back",
             t->nonfinite_seen, t->nonfinite_max);
  if (ok && t->rank0 && t->on_nonfinite == NONFINITE_ROLLBACK)
    psm_out (PSM_OUT_NOTE, "psm-run: back at step %ld from %s, learning rate now %g\n", t->meta.step, t->last,
             psm_optim_lr (t->optim, *next));
  g_free (where);
  t->win_loss = t->win_tokens = 0.0;
  t->win_n = 0;
  return ok;
}

/* --resume: removes the temporary files a killed process left in the run
 * folder, and the log records past the checkpoint's step (the resumed run
 * writes them again) and any torn last line. */
static gboolean
tidy_run_folder (Trainer *t, GError **error)
{
  GDir *d = g_dir_open (t->dir, 0, NULL);
  const char *name;
  while (d && (name = g_dir_read_name (d)))
    if (strstr (name, ".ckpt.tmp.") || strstr (name, ".cfg.tmp.") || g_str_has_suffix (name, ".jsonl.tmp")) {
      char *p = g_build_filename (t->dir, name, NULL);
      g_unlink (p);
      g_free (p);
    }
  if (d)
    g_dir_close (d);

  char *text = NULL;
  gsize n = 0;
  if (!g_file_test (t->log_path, G_FILE_TEST_IS_REGULAR))   /* none, or not a file to rewrite */
    return TRUE;
  if (!g_file_get_contents (t->log_path, &text, &n, error))
    return FALSE;
  GString *kept = g_string_sized_new (n);
  long dropped = 0;
  const char *p = text, *end = text + n;
  while (p < end) {
    const char *nl = memchr (p, '\n', (size_t) (end - p));
    if (!nl) {   /* torn by a kill */
      dropped++;
      break;
    }
    const char *s = g_strstr_len (p, nl - p, "\"step\": ");
    long step = s ? strtol (s + 8, NULL, 10) : 0;
    if (step <= t->meta.step)
      g_string_append_len (kept, p, nl - p + 1);
    else
      dropped++;
    p = nl + 1;
  }
  gboolean ok = TRUE;
  if (dropped) {
    char *tmp = g_strdup_printf ("%s.tmp", t->log_path);
    ok = g_file_set_contents (tmp, kept->str, (gssize) kept->len, error);
    if (ok && g_rename (tmp, t->log_path) != 0) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot replace: %s", t->log_path,
                   g_strerror (errno));
      ok = FALSE;
    }
    if (!ok)
      g_unlink (tmp);
    g_free (tmp);
    if (ok && !t->opt->quiet)
      psm_out (PSM_OUT_RESULT, "%s: dropped %ld record%s past step %ld (the checkpoint's)\n", t->log_path, dropped,
              dropped == 1 ? "" : "s", t->meta.step);
  }
  g_string_free (kept, TRUE);
  g_free (text);
  return ok;
}

static gboolean
trainer_settings (Trainer *t)
{
  const PsmSection *train = psm_pipeline_section (t->pl, "train");
  t->steps = (long) psm_section_int (train, "steps");
  t->B = (int) psm_section_int (train, "batch");
  t->eval_every = (long) psm_section_int (train, "eval_every");
  t->log_every = (long) psm_section_int (train, "log_every");
  t->valid_n = (long) psm_section_int (train, "valid_examples");
  t->clip = psm_section_float (train, "clip_norm");
  t->ckpt_every = (long) psm_section_int (train, "checkpoint_every");
  /* the plateau schedule (Merity et al. §5.2): lr times plateau_factor
   * when a validation is worse than the one before; stop after patience
   * validations without a new best */
  t->plateau = psm_section_float (psm_pipeline_section (t->pl, "train.optimizer"), "plateau_factor");
  t->patience = (long) psm_section_int (train, "patience");
  const char *pol = psm_section_string (train, "on_nonfinite");
  t->on_nonfinite = strcmp (pol, "skip") == 0 ? NONFINITE_SKIP
                  : strcmp (pol, "rollback") == 0 ? NONFINITE_ROLLBACK : NONFINITE_STOP;
  t->nonfinite_max = (long) psm_section_int (train, "nonfinite_max");
  t->rollback_factor = psm_section_float (train, "rollback_lr_factor");
  return TRUE;
}

/* Opens the run: a fresh run folder (pipeline, task files, the step-0
 * checkpoint) or the checkpoint to resume. */
static gboolean
trainer_open (Trainer *t, GError **error)
{
  if (t->nranks > t->B) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "train.batch %d is smaller than the %d MPI ranks that share it", t->B, t->nranks);
    return FALSE;
  }
  if (!t->rank0) {   /* rank 0 checks the run folder and reads the checkpoint */
    PsmOptConfig oc;
    psm_run_optim_config (psm_pipeline_section (t->pl, "train.optimizer"), &oc);
    t->optim = psm_optim_new (&oc, t->params);
    sync_from_rank0 (t);
    if (!restore_streams (t, NULL, error))
      return FALSE;
    return t->opt->resume || save_last (t, error);
  }
  if (!t->opt->resume && g_file_test (t->last, G_FILE_TEST_EXISTS)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE,
                 "%s: run folder already holds a run; continue it with --resume, or choose another with --set run.dir=...",
                 t->dir);
    return FALSE;
  }
  if (t->opt->resume && !g_file_test (t->last, G_FILE_TEST_EXISTS)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_USAGE, "%s: nothing to resume (no checkpoint)", t->last);
    return FALSE;
  }
  if (t->rank0 && g_mkdir_with_parents (t->dir, 0755) != 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot create run folder: %s", t->dir,
                 g_strerror (errno));
    return FALSE;
  }
  PsmOptConfig oc;
  psm_run_optim_config (psm_pipeline_section (t->pl, "train.optimizer"), &oc);
  t->optim = psm_optim_new (&oc, t->params);
  const PsmSection *train = psm_pipeline_section (t->pl, "train");
  psm_rng_seed (&t->meta.rng, (guint64) psm_section_int (train, "seed") * 7919 + 17);
  t->meta.best_metric = NAN;
  t->meta.last_metric = NAN;
  t->meta.lr_scale = 1.0;
  if (t->opt->resume) {
    if (!psm_checkpoint_load (t->last, t->params, t->optim, &t->meta, error))
      return FALSE;
    t->have_best = g_file_test (t->best_path, G_FILE_TEST_EXISTS) && !isnan (t->meta.best_metric);
    psm_optim_set_lr_scale (t->optim, t->meta.lr_scale);
    if (!t->opt->quiet)
      psm_out (PSM_OUT_RESULT, "resumed %s at step %ld\n", t->last, t->meta.step);
    if (t->rank0 && !tidy_run_folder (t, error))
      return FALSE;
    if (psm_model_streams (t->m) && !t->meta.stream)
      psm_out (PSM_OUT_NOTE, "psm-run: note: %s holds no state of the training streams (written before checkpoint "
               "version 4): the streams start again from the first segment, so the resumed run differs from an "
               "uninterrupted one\n", t->last);
  } else if (t->rank0) {
    if (!psm_pipeline_write (t->pl, t->cfg_path, error) || !psm_model_save_task (t->m, t->dir, error))
      return FALSE;
  }
  if (t->rank0) {
    t->log = psm_fopen_nofollow (t->log_path, t->opt->resume ? "a" : "w");
    if (!t->log) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot open log: %s", t->log_path,
                   psm_file_error (errno));
      return FALSE;
    }
  }
  sync_from_rank0 (t);
  GBytes *stream = g_steal_pointer (&t->meta.stream);
  gboolean ok = restore_streams (t, stream, error);
  g_clear_pointer (&stream, g_bytes_unref);
  if (!ok)
    return FALSE;
  /* a run killed before its first validation still resumes, and a
   * rollback always has somewhere to go */
  return t->opt->resume || save_last (t, error);
}

/* Validation at update done: the log, the plateau schedule, best.ckpt and
 * last.ckpt. *stop: train.patience says stop. */
static gboolean
validate (Trainer *t, long done, PsmProfile *prof, gboolean *stop, gboolean *nonfinite, GError **error)
{
  PsmEvalResult r;
  PsmEvalOptions vo = { t->valid_n, FALSE, NULL, NULL, NULL, FALSE, NULL, NULL };
  PsmGraph *g = psm_model_graph (t->m);
  psm_graph_set_profile (g, NULL);   /* training steps only */
  gboolean evaluated = psm_model_evaluate (t->m, PSM_SPLIT_VALID, &vo, &r, error);
  psm_graph_set_profile (g, prof);
  *stop = *nonfinite = FALSE;
  if (!evaluated)
    return FALSE;
  if (!isfinite (r.loss)) {
    *nonfinite = TRUE;
    return TRUE;
  }
  gboolean is_best = better (&r, t->meta.best_metric, t->have_best);
  gboolean worse = !isnan (t->meta.last_metric) &&
                   (r.higher_is_better ? r.primary < t->meta.last_metric : r.primary > t->meta.last_metric);
  if (t->plateau < 1.0 && worse) {
    t->meta.lr_scale *= t->plateau;
    psm_optim_set_lr_scale (t->optim, t->meta.lr_scale);
  }
  t->meta.last_metric = r.primary;
  t->meta.bad_evals = is_best ? 0 : t->meta.bad_evals + 1;
  *stop = t->patience > 0 && t->meta.bad_evals >= t->patience && done < t->steps;
  t->meta.step = done;
  /* the log first: a kill before the checkpoint leaves a record that
   * --resume drops (it is past the checkpoint) */
  if (t->rank0 && !psm_run_json_eval (t->log, t->log_path, done, "valid", g_timer_elapsed (t->timer, NULL), &r,
                                      error))
    return FALSE;
  if (is_best) {
    t->meta.best_metric = r.primary;
    t->have_best = TRUE;
    if (t->rank0 && !psm_checkpoint_save (t->best_path, t->params, t->optim, FALSE, &t->meta, error))
      return FALSE;
  }
  if (!save_last (t, error))
    return FALSE;
  if (t->opt->progress && !t->opt->quiet)
    psm_out (PSM_OUT_PROGRESS_END, "%s", "");
  if (!t->opt->quiet)
    psm_run_print_eval ("valid", done, &r, is_best);
  if (!t->opt->quiet && t->plateau < 1.0 && worse)
    psm_out (PSM_OUT_RESULT, "validation worse than the one before: learning rate now %g\n", psm_optim_lr (t->optim, done));
  return TRUE;
}

/* The log window after update done (0-based step): the live line and the
 * train record every log_every updates. */
static gboolean
log_progress (Trainer *t, long done, double lv, double tok, double gnorm, GError **error)
{
  char line[160];
  t->win_loss += lv;
  t->win_tokens += tok;
  t->win_n++;
  double now = g_timer_elapsed (t->timer, NULL);
  if (t->opt->progress && !t->opt->quiet && now - t->t_live >= 0.5 && done % t->log_every != 0) {
    progress_text (line, sizeof line, done, t->steps, t->start_step, now, t->win_loss / t->win_n,
                   now > t->t_win ? t->win_tokens / (now - t->t_win) : 0.0);
    psm_out (PSM_OUT_PROGRESS, "%s", line);
    t->t_live = now;
  }
  if (done % t->log_every == 0 || done == t->steps) {
    double dt = now - t->t_win, rate = dt > 0 ? t->win_tokens / dt : 0.0;
    progress_text (line, sizeof line, done, t->steps, t->start_step, now, t->win_loss / t->win_n, rate);
    /* %.9g: a float loss (log_every 1) reads back bit for bit */
    char *rec = g_strdup_printf ("{\"step\": %ld, \"split\": \"train\", \"time\": %.3f, \"loss\": %.9g, "
                                 "\"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f}\n",
                                 done, now, t->win_loss / t->win_n, psm_optim_lr (t->optim, done - 1), gnorm, rate);
    gboolean logged = log_record (t, rec, error);
    g_free (rec);
    if (!logged)
      return FALSE;
    if (!t->opt->quiet) {
      if (t->opt->progress)
        psm_out (PSM_OUT_PROGRESS, "%s", line);
      else
        psm_out (PSM_OUT_RESULT, "%s\n", line);
      fflush (stdout);
    }
    t->win_loss = t->win_tokens = 0.0;
    t->win_n = 0;
    t->t_win = now;
  }
  return TRUE;
}

static double
batch_tokens (const PsmBatch *b)
{
  double tok = 0.0;
  for (int i = 0; i < b->T * b->B; i++)
    tok += b->src_mask[i];
  for (int i = 0; i < b->Ty * b->B; i++)
    tok += b->tgt_mask[i];
  return tok;
}

/* The loop from t->meta.step to t->steps. */
static gboolean
trainer_loop (Trainer *t, PsmProfile *prof, GError **error)
{
  PsmGraph *g = psm_model_graph (t->m);
  PsmBatch *batch = psm_model_batch (t->m);
  long stop_at = t->opt->stop_after > 0 ? t->meta.step + t->opt->stop_after : -1;
  long step = t->meta.step;
  while (step < t->steps) {
    if (!psm_model_train_batch (t->m, t->B, &t->meta.rng, error))
      return FALSE;
    double tokens = batch_tokens (batch);
    double share = 1.0;   /* this rank's part of the batch's target words */
    if (t->nranks > 1) {
      /* every rank drew the same global batch; each trains a contiguous
       * share of its rows with about as many real tokens as the others
       * (the ranks wait for the slowest at the allreduce). A head's loss
       * is the mean over its rows' target words: weighting by the share
       * of them makes the summed gradient the global batch's. */
      share = psm_model_take_share (t->m, psm_dist_rank (), t->nranks);
    }
    psm_graph_reset (g);
    PsmTensor *loss = psm_model_loss (t->m, g, batch);
    psm_backward (g, loss);
    double lv = loss->data[0];
    gboolean stop_req = stop_signal != 0;
    if (t->nranks > 1) {
      double t0 = psm_dist_time ();
      /* the global gradient and loss, and whether any rank was asked to
       * stop (all stop at the same update) */
      double stop = stop_signal ? 1.0 : 0.0;
      psm_dist_reduce_update (t->params, share, &lv, &stop, 1);
      stop_req = stop > 0;
      t->t_reduce += psm_dist_time () - t0;
    }
    if (!isfinite (lv)) {
      if (!on_nonfinite (t, step, "loss", lv, &step, error))
        return FALSE;
      continue;
    }
    gint64 t_opt = prof ? g_get_monotonic_time () : 0;
    double gnorm = psm_params_grad_norm (t->params);
    if (!isfinite (gnorm)) {
      if (!on_nonfinite (t, step, "gradient norm", gnorm, &step, error))
        return FALSE;
      continue;
    }
    /* clipped, applied and zeroed in one pass over the buffers */
    psm_optim_step_zero (t->optim, step, psm_clip_scale (gnorm, t->clip));
    if (prof)
      prof->optim += 1e-6 * (double) (g_get_monotonic_time () - t_opt);

    long done = ++step;
    if (!log_progress (t, done, lv, tokens, gnorm, error))
      return FALSE;
    gboolean saved = FALSE;
    if (done % t->eval_every == 0 || done == t->steps) {
      /* Sequence models validate on the loss (decoding every validation
       * would cost more than the training between them). */
      gboolean stop, nonfinite;
      if (!validate (t, done, prof, &stop, &nonfinite, error))
        return FALSE;
      if (nonfinite) {
        if (t->on_nonfinite != NONFINITE_ROLLBACK) {
          char *kept = kept_msg (t);
          g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                       "step %ld: validation loss is not finite; training stopped. %s", done, kept);
          g_free (kept);
          return FALSE;
        }
        if (!on_nonfinite (t, done - 1, "validation loss", NAN, &step, error))
          return FALSE;
        continue;
      }
      saved = TRUE;
      if (stop) {
        if (!t->opt->quiet)
          psm_out (PSM_OUT_RESULT, "stopping at step %ld: %ld validations without improving on the best (train.patience)\n", done,
                  t->meta.bad_evals);
        t->steps = done;
        break;
      }
    }
    gboolean stop_now = stop_req || done == stop_at;
    if (!saved && (stop_now || (t->ckpt_every > 0 && done % t->ckpt_every == 0))) {
      t->meta.step = done;
      if (!save_last (t, error))
        return FALSE;
    }
    if (stop_now && done < t->steps) {
      if (t->opt->progress && !t->opt->quiet)
        psm_out (PSM_OUT_PROGRESS_END, "%s", "");
      int sig = stop_signal ? (int) stop_signal : stop_req ? SIGTERM : 0;   /* another rank's */
      t->opt->stopped = sig ? sig : -1;
      if (t->rank0 && (!t->opt->quiet || sig))
        psm_out (PSM_OUT_RESULT, "stopped at step %ld (%s): %s written; continue with --resume\n", done,
                sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "--stop-after",
                t->last);
      t->steps = done;
      break;
    }
  }
  return TRUE;
}

gboolean
psm_train (PsmModel *m, PsmTrainOptions *opt, GError **error)
{
  Trainer tr = { 0 }, *t = &tr;
  t->m = m;
  t->pl = psm_model_pipeline (m);
  t->opt = opt;
  t->params = psm_model_params (m);
  t->dir = psm_pipeline_run_dir (t->pl);
  t->last = g_build_filename (t->dir, "last.ckpt", NULL);
  t->best_path = g_build_filename (t->dir, "best.ckpt", NULL);
  t->log_path = g_build_filename (t->dir, "log.jsonl", NULL);
  t->cfg_path = g_build_filename (t->dir, "pipeline.cfg", NULL);
  t->rank0 = psm_dist_rank () == 0;
  t->nranks = psm_dist_size ();
  opt->stopped = 0;
  trainer_settings (t);
  struct sigaction old[3];
  catch_stop_signals (old);
  gboolean ok = trainer_open (t, error);
  if (!ok)
    goto out;
  t->start_step = t->meta.step;
  if (t->meta.step >= t->steps) {
    if (!opt->quiet)
      psm_out (PSM_OUT_RESULT, "nothing to train: %s is at step %ld and train.steps is %ld (raise train.steps to go on)\n",
              t->last, t->meta.step, t->steps);
    goto out;
  }
  if (t->patience > 0 && t->meta.bad_evals >= t->patience) {
    if (!opt->quiet)
      psm_out (PSM_OUT_RESULT, "nothing to train: %s stopped at step %ld after %ld validations without a new best (raise "
              "train.patience to go on)\n", t->last, t->meta.step, t->meta.bad_evals);
    goto out;
  }
  if (!opt->quiet)
    psm_out (PSM_OUT_RESULT, "training %s: %ld steps of %d examples, %zu parameters, run folder %s%s\n",
            psm_pipeline_file (t->pl), t->steps, t->B, psm_params_size (t->params), t->dir,
            !psm_graph_bf16_train (psm_model_graph (m)) ? ""
            : psm_amx_usable () ? " (train.precision bf16: products on AMX tiles)"
                                : " (train.precision bf16: no AMX here, rounded operands on the single-precision "
                                  "kernel, slower than fp32)");
  char *hosts = psm_dist_hosts ();   /* collective: every rank */
  if (hosts && !opt->quiet)
    psm_out (PSM_OUT_RESULT, "%s\n", hosts);
  g_free (hosts);
  PsmGraph *g = psm_model_graph (m);
  PsmProfile *prof = opt->profile ? g_new0 (PsmProfile, 1) : NULL;
  psm_graph_set_profile (g, prof);
  t->timer = g_timer_new ();
  ok = trainer_loop (t, prof, error);
  opt->trained = t->steps - t->start_step;
  if (ok && !opt->quiet) {
    double secs = g_timer_elapsed (t->timer, NULL);
    psm_out (PSM_OUT_RESULT, "trained %ld steps in %.1f s\n", t->steps - t->start_step, secs);
    if (t->nranks > 1)
      psm_out (PSM_OUT_RESULT, "%d MPI ranks: %.3f s a step in the gradient allreduce (%zu floats), %.1f %% of the training time\n",
              t->nranks, t->t_reduce / MAX (t->steps - t->start_step, 1), psm_params_size (t->params),
              100.0 * t->t_reduce / MAX (secs, 1e-9));
  }
  if (ok && prof && prof->steps)
    psm_profile_print (prof, stdout);
  g_timer_destroy (t->timer);
  psm_graph_set_profile (g, NULL);
  g_free (prof);
out:
  restore_stop_signals (old);
  g_clear_pointer (&t->meta.stream, g_bytes_unref);
  if (t->log && fclose (t->log) != 0 && ok)
    ok = psm_run_write_failed (error, t->log_path);
  psm_optim_free (t->optim);
  g_free (t->last);
  g_free (t->best_path);
  g_free (t->log_path);
  g_free (t->cfg_path);
  return ok;
}
