/* psm-train.c — the training loop: updates, validation, progress, and
 * what never loses work: a checkpoint at the start and every
 * train.checkpoint_every updates, SIGINT/SIGTERM and --stop-after write one
 * and stop, non-finite losses follow train.on_nonfinite, and --resume
 * continues bit for bit (opening a run, tidying what a killed process
 * left, the log, last.ckpt and the non-finite policies: psm-train-state.c). */
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

/* "[phase P/2  ]step N/M  loss L  U upd/s  R src+tgt tok/s  ETA T": the
 * progress line and log line. loss: the mean over the updates since the
 * last line; U, R: updates and tokens (source and target, padding left
 * out) a second over that window. */
static void
progress_text (char *buf, size_t n, const Trainer *t, long done, double elapsed, double loss, double upd_rate,
               double tok_rate)
{
  char eta[32], phase[24] = "";
  fmt_duration (eta, sizeof eta, (double) (t->steps - done) * (elapsed / (double) (done - t->start_step)));
  if (t->opt->phase > 0)
    g_snprintf (phase, sizeof phase, "phase %d/2  ", t->opt->phase);
  g_snprintf (buf, n, "%sstep %ld/%ld  loss %.4f  %.2f upd/s  %.0f src+tgt tok/s  ETA %s", phase, done, t->steps, loss,
              upd_rate, tok_rate, eta);
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
log_progress (Trainer *t, long done, double lv, double tok, double tgt, double gnorm, GError **error)
{
  char line[160];
  t->win_loss += lv;
  t->win_tokens += tok;
  t->win_tgt += tgt;
  t->tgt_total += tgt;
  t->win_n++;
  double now = g_timer_elapsed (t->timer, NULL);
  if (t->opt->progress && !t->opt->quiet && now - t->t_live >= 0.5 && done % t->log_every != 0) {
    double dt = now - t->t_win;
    progress_text (line, sizeof line, t, done, now, t->win_loss / t->win_n, dt > 0 ? t->win_n / dt : 0.0,
                   dt > 0 ? t->win_tokens / dt : 0.0);
    psm_out (PSM_OUT_PROGRESS, "%s", line);
    t->t_live = now;
  }
  if (done % t->log_every == 0 || done == t->steps) {
    double dt = now - t->t_win, rate = dt > 0 ? t->win_tokens / dt : 0.0, upd = dt > 0 ? t->win_n / dt : 0.0;
    progress_text (line, sizeof line, t, done, now, t->win_loss / t->win_n, upd, rate);
    /* %.9g: a float loss (log_every 1) reads back bit for bit */
    char *rec = g_strdup_printf ("{\"step\": %ld, \"split\": \"train\", \"time\": %.3f, \"loss\": %.9g, "
                                 "\"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f, "
                                 "\"tgt_tokens_per_s\": %.1f, \"updates_per_s\": %.3f}\n",
                                 done, now, t->win_loss / t->win_n, psm_optim_lr (t->optim, done - 1), gnorm, rate,
                                 dt > 0 ? t->win_tgt / dt : 0.0, upd);
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
    t->win_loss = t->win_tokens = t->win_tgt = 0.0;
    t->win_n = 0;
    t->t_win = now;
  }
  return TRUE;
}

/* The batch's real tokens, source and target, and (*tgt) target alone. */
static double
batch_tokens (const PsmBatch *b, double *tgt)
{
  double src = 0.0;
  for (int i = 0; i < b->T * b->B; i++)
    src += b->src_mask[i];
  *tgt = 0.0;
  for (int i = 0; i < b->Ty * b->B; i++)
    *tgt += b->tgt_mask[i];
  return src + *tgt;
}

/* The global gradient's norm: over the whole buffer, or (train.dist_shard)
 * over each rank's summed shard, the squares summed over the ranks. */
static double
grad_norm (Trainer *t)
{
  if (!t->dist || !psm_dist_reduce_sharded (t->dist))
    return psm_params_grad_norm (t->params);
  size_t lo, hi;
  const float *part = psm_dist_reduce_part (t->dist, &lo, &hi);
  double ss = psm_sumsq (part, hi - lo);
  psm_dist_sum_double (&ss, 1);
  return sqrt (ss);
}

/* The update with the clip's factor scale. One process (or every rank
 * alike): clipped, applied and zeroed in one pass over the buffers.
 * Sharded: each rank updates its own shard from its summed part, its
 * gradient buffer is zeroed, and the shards are gathered (the time counts
 * as the reduction's). */
static void
apply_update (Trainer *t, long step, float scale)
{
  if (!t->dist || !psm_dist_reduce_sharded (t->dist)) {
    psm_optim_step_zero (t->optim, step, scale);
    return;
  }
  size_t lo, hi;
  const float *part = psm_dist_reduce_part (t->dist, &lo, &hi);
  psm_optim_step_part (t->optim, step, scale, lo, hi, part);
  psm_params_zero_grad (t->params);
  double t0 = psm_dist_time ();
  psm_dist_reduce_gather (t->dist, psm_params_data (t->params));
  t->t_reduce += psm_dist_time () - t0;
}

/* The loop from t->meta.step to t->steps. */
static gboolean
trainer_loop (Trainer *t, PsmProfile *prof, GError **error)
{
  PsmGraph *g = psm_model_graph (t->m);
  PsmBatch *batch = psm_model_batch (t->m);
  long stop_at = t->opt->stop_after > 0 ? t->meta.step + t->opt->stop_after : -1;
  long step = t->meta.step, first = step;
  while (step < t->steps) {
    /* the first update's warm-up (the arena's growth, packings, first
     * touches of the optimiser state) is left out of the profile */
    PsmProfile *on = step > first ? prof : NULL;
    psm_graph_set_profile (g, on);
    if (!psm_model_train_batch (t->m, t->B, &t->meta.rng, error))
      return FALSE;
    double tgt;
    double tokens = batch_tokens (batch, &tgt);
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
    if (t->dist)
      psm_dist_reduce_begin (t->dist, share);
    PsmTensor *loss = psm_model_loss (t->m, g, batch);
    psm_backward (g, loss);   /* with train.dist_overlap, reducing as it goes */
    double lv = loss->data[0];
    gboolean stop_req = stop_signal != 0;
    if (t->nranks > 1) {
      double t0 = psm_dist_time ();
      /* the global gradient and loss, and whether any rank was asked to
       * stop (all stop at the same update) */
      double stop = stop_signal ? 1.0 : 0.0;
      if (t->dist)
        psm_dist_reduce_end (t->dist, &lv, &stop, 1);
      else
        psm_dist_reduce_update (psm_params_grad (t->params), psm_params_size (t->params), share, &lv, &stop, 1);
      stop_req = stop > 0;
      t->t_reduce += psm_dist_time () - t0;
    }
    if (!isfinite (lv)) {
      if (!on_nonfinite (t, step, "loss", lv, &step, error))
        return FALSE;
      continue;
    }
    gint64 t_opt = on ? g_get_monotonic_time () : 0;
    double gnorm = grad_norm (t);
    if (!isfinite (gnorm)) {
      if (!on_nonfinite (t, step, "gradient norm", gnorm, &step, error))
        return FALSE;
      continue;
    }
    apply_update (t, step, psm_clip_scale (gnorm, t->clip));
    if (on)
      on->optim += 1e-6 * (double) (g_get_monotonic_time () - t_opt);

    long done = ++step;
    if (!log_progress (t, done, lv, tokens, tgt, gnorm, error))
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

/* Over MPI ranks: the bucketed (and sharded) reduction, and the graph
 * watched so that its buckets go as the backward completes them
 * (train.dist_shard, dist_overlap, dist_bucket_mb). With neither, one
 * allreduce of the whole gradient after the backward. */
static void
dist_start (Trainer *t, PsmGraph *g)
{
  if (t->nranks < 2 || (!t->dist_shard && !t->dist_overlap))
    return;
  float *grad = psm_params_grad (t->params);
  size_t n = psm_params_size (t->params), bucket = (size_t) (t->dist_bucket_mb * (1 << 20) / sizeof (float));
  t->dist = psm_dist_reduce_new (grad, n, t->dist_shard, bucket);
  if (t->dist && t->dist_overlap) {
    PsmGradWatch w = { grad, n, psm_dist_reduce_bucket_floats (t->dist), psm_dist_reduce_bucket, psm_dist_reduce_poll,
                       t->dist };
    psm_graph_watch_grads (g, &w);
  }
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
  dist_start (t, g);
  t->timer = g_timer_new ();
  ok = trainer_loop (t, prof, error);
  psm_graph_watch_grads (g, NULL);
  opt->trained = t->steps - t->start_step;
  if (ok && !opt->quiet) {
    double secs = g_timer_elapsed (t->timer, NULL);
    psm_out (PSM_OUT_RESULT, "trained %ld steps in %.1f s (%.0f target tokens/s)\n", t->steps - t->start_step, secs,
             t->tgt_total / MAX (secs, 1e-9));
    if (t->nranks > 1) {
      char early[96] = "";
      if (t->dist && t->dist_overlap)
        g_snprintf (early, sizeof early, ", overlapped with the backward: %.0f %% of the buckets before its end",
                    100.0 * psm_dist_reduce_early (t->dist));
      psm_out (PSM_OUT_RESULT, "%d MPI ranks: %.3f s a step in the gradient allreduce (%zu floats%s%s), %.1f %% of "
               "the training time\n", t->nranks, t->t_reduce / MAX (t->steps - t->start_step, 1),
               psm_params_size (t->params), t->dist && psm_dist_reduce_sharded (t->dist) ? ", sharded update" : "",
               early, 100.0 * t->t_reduce / MAX (secs, 1e-9));
    }
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
  psm_dist_reduce_free (t->dist);
  g_free (t->last);
  g_free (t->best_path);
  g_free (t->log_path);
  g_free (t->cfg_path);
  return ok;
}
