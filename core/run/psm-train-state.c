/* psm-train-state.c — the trainer's state and what keeps work safe: opening
 * a run (settings, the run folder tidied after a killed process, resuming
 * from last.ckpt), the run log, last.ckpt written, MPI ranks kept in step,
 * and the train.on_nonfinite policies (stop, skip, roll back). */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "run/run-internal.h"

/* What a stopped run leaves behind, for its error message. */
char *
kept_msg (const Trainer *t)
{
  if (g_file_test (t->last, G_FILE_TEST_EXISTS))
    return g_strdup_printf ("The last good checkpoint (%s) is intact.", t->last);
  return g_strdup ("No checkpoint had been written yet.");
}

gboolean
log_record (Trainer *t, const char *rec, GError **error)
{
  return !t->rank0 || psm_run_log_append (t->log, t->log_path, rec, error);
}

/* last.ckpt at t->meta.step, with the optimiser's and the streams' state.
 * Every rank calls it: over MPI each rank holds the state of its own
 * streams (and, sharded, of its own shard of the optimiser's), gathered
 * into one state of all of them for rank 0 to write. */
gboolean
save_last (Trainer *t, GError **error)
{
  /* sharded: each rank holds the optimiser's state of its own shard */
  for (int k = 0; t->dist && k < psm_optim_n_state (t->optim); k++)
    psm_dist_reduce_gather (t->dist, psm_optim_state (t->optim, k));
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
 * none. Over MPI ranks (every rank calls it), on any rank's gradient: a
 * rank's own buffer holds its share's, or its shard's, not the sum. */
static const char *
first_nonfinite_grad (PsmParams *p, int nranks, int *count)
{
  const float *g = psm_params_grad (p);
  int np = psm_params_count (p);
  double *bad = g_new0 (double, MAX (np, 1));
  for (int id = 0; id < np; id++) {
    size_t n = psm_params_numel (p, id), off = psm_params_offset (p, id);
    for (size_t i = 0; i < n; i++)
      if (!isfinite (g[off + i])) {
        bad[id] = 1.0;
        break;
      }
  }
  if (nranks > 1)
    psm_dist_sum_double (bad, (size_t) np);
  const char *first = NULL;
  *count = 0;
  for (int id = 0; id < np; id++)
    if (bad[id] > 0) {
      if (!first)
        first = psm_params_name (p, id);
      (*count)++;
    }
  g_free (bad);
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
gboolean
on_nonfinite (Trainer *t, long step, const char *what, double v, long *next, GError **error)
{
  int n_bad = 0;
  const char *first = first_nonfinite_grad (t->params, t->nranks, &n_bad);
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

gboolean
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
  t->dist_shard = psm_section_bool (train, "dist_shard");
  t->dist_overlap = psm_section_bool (train, "dist_overlap");
  t->dist_bucket_mb = psm_section_float (train, "dist_bucket_mb");
  return TRUE;
}

/* Opens the run: a fresh run folder (pipeline, task files, the step-0
 * checkpoint) or the checkpoint to resume. */
gboolean
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
