/* psm-checkpoint.c — atomic, checksummed checkpoints (layout in the header). */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include <nettle/sha2.h>
#include "run/run-internal.h"

#define MAGIC "PSMCKPT1"
#define DIGEST_LEN 32

typedef struct {
  FILE *f;
  struct sha256_ctx sum;
  gboolean ok;
} Writer;

static void
put (Writer *w, const void *data, size_t n)
{
  if (!w->ok || n == 0)
    return;
  if (fwrite (data, 1, n, w->f) != n)
    w->ok = FALSE;
  sha256_update (&w->sum, n, data);
}

static void put_u32 (Writer *w, guint32 v) { put (w, &v, 4); }
static void put_u64 (Writer *w, guint64 v) { put (w, &v, 8); }

#define N_SETTINGS 8
#define FLAG_STATE 1u
/* Fixed part of the header (version 2), without the optimiser's name and
 * settings; version 3 adds the plateau state (8 + 8 + 8) after the best
 * metric. */
#define HEADER_FIXED (8 + 4 + 4 + 8 + 16 + 8 + 4 + 4 + 4 + 8 + 4)
#define PLATEAU_LEN 24
static const char *const setting_names[N_SETTINGS] = {
  "lr", "beta1", "beta2", "eps", "init_accum", "rho", "halve_start", "halve_every"
};

static void
settings_of (const PsmOptConfig *c, double *v)
{
  double s[N_SETTINGS] = { c->lr, c->beta1, c->beta2, c->eps, c->init_accum, c->rho,
                           (double) c->halve_start, (double) c->halve_every };
  memcpy (v, s, sizeof s);
}

/* The settings an update rule reads (indices into setting_names), -1 ended. */
static const int *
settings_used (PsmOptKind kind)
{
  static const int sgd[] = { 0, 6, 7, -1 }, adam[] = { 0, 1, 2, 3, -1 }, adagrad[] = { 0, 3, 4, -1 },
                   adadelta[] = { 0, 3, 5, -1 };
  return kind == PSM_OPT_SGD ? sgd : kind == PSM_OPT_ADAM ? adam : kind == PSM_OPT_ADAGRAD ? adagrad : adadelta;
}

gboolean
psm_checkpoint_save (const char *path, PsmParams *p, PsmOptim *optim, gboolean with_state,
                     const PsmCheckpointMeta *meta, GError **error)
{
  char *tmp;
  Writer w = { .f = psm_fopen_temp (path, &tmp), .ok = TRUE };
  sha256_init (&w.sum);
  if (!w.f) {
    g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (errno),
                 "%s: cannot write checkpoint: %s", tmp, g_strerror (errno));
    g_free (tmp);
    return FALSE;
  }
  size_t total = psm_params_size (p);
  with_state = with_state && optim;
  int n_state = with_state ? psm_optim_n_state (optim) : 0;
  const char *opt_name = optim ? psm_optim_name (optim) : "";
  double settings[N_SETTINGS] = { 0 };
  if (optim)
    settings_of (psm_optim_config (optim), settings);
  put (&w, MAGIC, 8);
  put_u32 (&w, PSM_CHECKPOINT_VERSION);
  put_u32 (&w, with_state ? FLAG_STATE : 0);
  put_u64 (&w, (guint64) meta->step);
  put (&w, meta->rng.s, sizeof meta->rng.s);
  put (&w, &meta->best_metric, sizeof (double));
  put (&w, &meta->lr_scale, sizeof (double));
  put (&w, &meta->last_metric, sizeof (double));
  put_u64 (&w, (guint64) meta->bad_evals);
  put_u32 (&w, (guint32) strlen (opt_name));
  put (&w, opt_name, strlen (opt_name));
  put_u32 (&w, (guint32) (optim ? psm_optim_n_state (optim) : 0));
  put_u32 (&w, N_SETTINGS);
  put (&w, settings, sizeof settings);
  put_u64 (&w, total);
  put_u32 (&w, (guint32) psm_params_count (p));
  for (int i = 0; i < psm_params_count (p); i++) {
    const char *name = psm_params_name (p, i);
    int nd, shape[PSM_MAX_DIMS];
    psm_params_shape (p, i, &nd, shape);
    put_u32 (&w, (guint32) strlen (name));
    put (&w, name, strlen (name));
    put_u32 (&w, (guint32) nd);
    for (int k = 0; k < nd; k++)
      put_u32 (&w, (guint32) shape[k]);
    put_u64 (&w, psm_params_offset (p, i));
  }
  put (&w, psm_params_data (p), total * sizeof (float));
  for (int s = 0; s < n_state; s++)
    put (&w, psm_optim_state (optim, s), total * sizeof (float));
  gsize stream_len = 0;
  const void *stream = with_state && meta->stream ? g_bytes_get_data (meta->stream, &stream_len) : NULL;
  g_return_val_if_fail (stream_len <= PSM_CHECKPOINT_MAX_STREAM, FALSE);
  put_u64 (&w, stream_len);
  put (&w, stream, stream_len);
  guint8 digest[DIGEST_LEN];
  sha256_digest (&w.sum, DIGEST_LEN, digest);
  if (w.ok && fwrite (digest, 1, DIGEST_LEN, w.f) != DIGEST_LEN)
    w.ok = FALSE;
  if (w.ok && (fflush (w.f) != 0 || fsync (fileno (w.f)) != 0))
    w.ok = FALSE;
  int saved_errno = errno;
  if (fclose (w.f) != 0) {
    if (w.ok)
      saved_errno = errno;
    w.ok = FALSE;
  }
  if (!w.ok || g_rename (tmp, path) != 0) {
    if (w.ok)
      saved_errno = errno;
    g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (saved_errno),
                 "%s: cannot write checkpoint: %s (the previous file, if any, is untouched)",
                 path, g_strerror (saved_errno));
    g_unlink (tmp);
    g_free (tmp);
    return FALSE;
  }
  g_free (tmp);
  return TRUE;
}

/* The largest file a checkpoint of p can be. */
static guint64
max_size (PsmParams *p)
{
  guint64 n = HEADER_FIXED + PLATEAU_LEN + 64 + 8 * N_SETTINGS + DIGEST_LEN;
  for (int i = 0; i < psm_params_count (p); i++)
    n += 4 + strlen (psm_params_name (p, i)) + 4 + 4 * PSM_MAX_DIMS + 8;
  return n + (1 + 2) * (guint64) psm_params_size (p) * sizeof (float) + 8 + PSM_CHECKPOINT_MAX_STREAM;
}

/* Reads a regular file of at most limit bytes into *buf. */
static gboolean
read_checkpoint_file (const char *path, guint64 limit, guint8 **buf, gsize *len, GError **error)
{
  int fd = g_open (path, O_RDONLY | O_CLOEXEC, 0);
  struct stat st;
  if (fd < 0 || fstat (fd, &st) != 0) {
    int e = errno;
    g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (e), "%s: cannot read checkpoint: %s", path,
                 g_strerror (e));
    if (fd >= 0)
      close (fd);
    return FALSE;
  }
  if (!S_ISREG (st.st_mode)) {
    g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                 "%s: not a regular file (a checkpoint is one; is it a link to a device?)", path);
    close (fd);
    return FALSE;
  }
  if ((guint64) st.st_size > limit) {
    g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                 "%s: file is %" G_GUINT64_FORMAT " bytes, more than a checkpoint of this model can be (%"
                 G_GUINT64_FORMAT " bytes): not this model's checkpoint, or corrupt", path,
                 (guint64) st.st_size, limit);
    close (fd);
    return FALSE;
  }
  *len = (gsize) st.st_size;
  *buf = g_try_malloc (MAX (*len, 1));
  gsize got = 0;
  while (*buf && got < *len) {
    ssize_t k = read (fd, *buf + got, *len - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    got += (gsize) k;
  }
  int e = errno;
  close (fd);
  if (!*buf || got != *len) {
    g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_IO, "%s: cannot read checkpoint: %s", path,
                 !*buf ? "out of memory" : got < *len ? "file shrank while reading" : g_strerror (e));
    g_free (*buf);
    *buf = NULL;
    return FALSE;
  }
  return TRUE;
}

typedef struct {
  const guint8 *p, *end;
  gboolean ok;
} Reader;

static const void *
take (Reader *r, size_t n)
{
  if (!r->ok || (size_t) (r->end - r->p) < n) {
    r->ok = FALSE;
    return NULL;
  }
  const void *v = r->p;
  r->p += n;
  return v;
}

static guint32
get_u32 (Reader *r)
{
  guint32 v = 0;
  const void *s = take (r, 4);
  if (s)
    memcpy (&v, s, 4);
  return v;
}

static guint64
get_u64 (Reader *r)
{
  guint64 v = 0;
  const void *s = take (r, 8);
  if (s)
    memcpy (&v, s, 8);
  return v;
}

#define CORRUPT(...)                                                           \
  do {                                                                         \
    g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_INVAL, __VA_ARGS__);        \
    goto out;                                                                  \
  } while (0)

#define PSM_CHECKPOINT_MAX_WEIGHT 1e18

/* The manifest against the model's parameters (names, shapes, offsets),
 * then the parameters' data: where it starts, or NULL with error. */
static const void *
check_params (Reader *rp, PsmParams *p, const char *path, guint32 count, guint64 total, GError **error)
{
  Reader r = *rp;
  const void *data = NULL;
  if (count != (guint32) psm_params_count (p) || total != psm_params_size (p))
    CORRUPT ("%s: checkpoint holds %u parameters (%" G_GUINT64_FORMAT " floats), the model has %d (%zu floats)",
             path, count, total, psm_params_count (p), psm_params_size (p));
  for (guint32 i = 0; i < count; i++) {
    guint32 l = get_u32 (&r);
    const char *name = take (&r, l);
    guint32 nd = get_u32 (&r);
    if (!r.ok || nd > PSM_MAX_DIMS)
      CORRUPT ("%s: corrupt manifest entry %u", path, i);
    int pnd, shape[PSM_MAX_DIMS];
    psm_params_shape (p, (int) i, &pnd, shape);
    const char *want = psm_params_name (p, (int) i);
    if (l != strlen (want) || memcmp (name, want, l) != 0)
      CORRUPT ("%s: parameter %u is '%.*s' in the checkpoint but '%s' in the model", path, i,
               (int) l, name, want);
    gboolean same = (int) nd == pnd;
    for (guint32 k = 0; k < nd; k++)
      same = (int) get_u32 (&r) == shape[k] && same;
    if (!same)
      CORRUPT ("%s: parameter '%s' has another shape in the checkpoint than in the model", path, want);
    if (get_u64 (&r) != psm_params_offset (p, (int) i))
      CORRUPT ("%s: parameter '%s' has another offset in the checkpoint", path, want);
  }
  data = take (&r, total * sizeof (float));
  if (!data)
    CORRUPT ("%s: truncated parameter data", path);
  /* a weight that is not finite, or too large for any product of two to
   * be (a model of such weights decoded empty summaries; issue 58) */
  for (int i = 0; i < psm_params_count (p); i++) {
    const float *w = (const float *) data + psm_params_offset (p, i);
    size_t n = psm_params_numel (p, i);
    for (size_t j = 0; j < n; j++) {
      float x;
      memcpy (&x, w + j, sizeof x);   /* the buffer is not aligned for floats */
      if (!(fabsf (x) <= PSM_CHECKPOINT_MAX_WEIGHT))
        CORRUPT ("%s: parameter '%s' [%zu] is %g: a checkpoint's weights must be finite and at most %g in "
                 "magnitude", path, psm_params_name (p, i), j, (double) x, PSM_CHECKPOINT_MAX_WEIGHT);
    }
  }
  *rp = r;
  return data;
out:
  return NULL;
}

/* Resuming: the same update rule with the same settings, and its state. */
static gboolean
check_resume (PsmOptim *optim, const char *path, int kind, guint32 flags, const char *opt_name,
              const double *settings, GError **error)
{
  const PsmOptConfig *oc = psm_optim_config (optim);
  if (kind < 0 || !(flags & FLAG_STATE))
    CORRUPT ("%s: checkpoint holds parameters only (no optimiser state): it can be evaluated, not "
             "resumed", path);
  if (kind != (int) oc->kind)
    CORRUPT ("%s: checkpoint was trained with optimiser '%s', the pipeline asks for '%s' "
             "(train.optimizer must match to resume)", path, opt_name, psm_optim_name (optim));
  double now[N_SETTINGS];
  settings_of (oc, now);
  for (const int *i = settings_used (oc->kind); *i >= 0; i++)
    if (now[*i] != settings[*i])
      CORRUPT ("%s: checkpoint was trained with %s %s = %.10g, the pipeline asks for %.10g "
               "(train.optimizer must match to resume)", path, opt_name, setting_names[*i],
               settings[*i], now[*i]);
  return TRUE;
out:
  return FALSE;
}

gboolean
psm_checkpoint_load (const char *path, PsmParams *p, PsmOptim *optim,
                     PsmCheckpointMeta *meta, GError **error)
{
  guint8 *buf = NULL;
  gsize len = 0;
  gboolean ok = FALSE;
  char *opt_name = NULL;
  if (!read_checkpoint_file (path, max_size (p), &buf, &len, error))
    return FALSE;
  if (len < 8 || memcmp (buf, MAGIC, 8) != 0)
    CORRUPT ("%s: not a psm checkpoint (bad magic)", path);
  if (len < HEADER_FIXED + DIGEST_LEN)
    CORRUPT ("%s: truncated: %" G_GSIZE_FORMAT " bytes, a checkpoint has at least %d", path, len,
             HEADER_FIXED + DIGEST_LEN);
  guint32 version;
  memcpy (&version, buf + 8, 4);
  if (version > PSM_CHECKPOINT_VERSION || version < 2)
    CORRUPT ("%s: checkpoint format version %u, this psm reads versions 2 to %d%s", path, version,
             PSM_CHECKPOINT_VERSION, version == 1 ? " (version 1, from psm 0.1.0, did not record the "
                                                    "optimiser's settings)" : "");
  guint8 digest[DIGEST_LEN];
  struct sha256_ctx sum;
  sha256_init (&sum);
  sha256_update (&sum, len - DIGEST_LEN, buf);
  sha256_digest (&sum, DIGEST_LEN, digest);
  if (memcmp (digest, buf + len - DIGEST_LEN, DIGEST_LEN) != 0)
    CORRUPT ("%s: checksum mismatch: the checkpoint is corrupt or truncated", path);

  /* The checksum only proves the file is as written: check its values too. */
  Reader r = { buf + 12, buf + len - DIGEST_LEN, TRUE };
  guint32 flags = get_u32 (&r);
  PsmCheckpointMeta m = { 0 };
  guint64 step = get_u64 (&r);
  const void *rs = take (&r, sizeof m.rng.s);
  if (rs)
    memcpy (m.rng.s, rs, sizeof m.rng.s);
  const void *bm = take (&r, sizeof (double));
  if (bm)
    memcpy (&m.best_metric, bm, sizeof (double));
  m.lr_scale = 1.0;
  m.last_metric = NAN;
  guint64 bad = 0;
  if (version >= 3) {
    const void *ls = take (&r, sizeof (double)), *lm = take (&r, sizeof (double));
    if (ls)
      memcpy (&m.lr_scale, ls, sizeof (double));
    if (lm)
      memcpy (&m.last_metric, lm, sizeof (double));
    bad = get_u64 (&r);
  }
  guint32 nl = get_u32 (&r);
  const char *on = nl <= 64 ? take (&r, nl) : NULL;
  opt_name = on ? g_strndup (on, nl) : g_strdup ("");
  guint32 n_state = get_u32 (&r);
  guint32 n_set = get_u32 (&r);
  double settings[N_SETTINGS] = { 0 };
  const void *sv = n_set == N_SETTINGS ? take (&r, sizeof settings) : NULL;
  if (sv)
    memcpy (settings, sv, sizeof settings);
  guint64 total = get_u64 (&r);
  guint32 count = get_u32 (&r);
  if (!r.ok || nl > 64 || n_set != N_SETTINGS)
    CORRUPT ("%s: corrupt header", path);
  if (flags & ~FLAG_STATE)
    CORRUPT ("%s: corrupt header: unknown flags 0x%x", path, flags);
  if (step > (guint64) PSM_MAX_STEPS)
    CORRUPT ("%s: corrupt header: step %" G_GINT64_FORMAT " is outside [0, %ld]", path, (gint64) step,
             PSM_MAX_STEPS);
  m.step = (long) step;
  if (!(m.rng.s[0] | m.rng.s[1] | m.rng.s[2] | m.rng.s[3]))
    CORRUPT ("%s: corrupt header: the RNG state is all zero (a state xoshiro never leaves)", path);
  if (isinf (m.best_metric))
    CORRUPT ("%s: corrupt header: best validation metric is infinite", path);
  if (!(m.lr_scale > 0.0 && m.lr_scale <= 1.0) || isinf (m.last_metric) || bad > (guint64) PSM_MAX_STEPS)
    CORRUPT ("%s: corrupt header: learning-rate schedule state (scale %g, last %g, %" G_GUINT64_FORMAT
             " evaluations without a best) is out of range", path, m.lr_scale, m.last_metric, bad);
  m.bad_evals = (long) bad;
  int kind = -1;
  for (int k = PSM_OPT_SGD; k <= PSM_OPT_ADADELTA; k++)
    if (strcmp (opt_name, psm_optim_kind_name ((PsmOptKind) k)) == 0)
      kind = k;
  if (*opt_name && kind < 0)
    CORRUPT ("%s: corrupt header: unknown optimiser '%s'", path, opt_name);
  int want_state = kind < 0 ? 0 : psm_optim_kind_slots ((PsmOptKind) kind);
  if ((int) n_state != want_state || ((flags & FLAG_STATE) && kind < 0))
    CORRUPT ("%s: corrupt header: %u optimiser state slots for '%s'", path, n_state, opt_name);
  for (int i = 0; i < N_SETTINGS; i++)
    if (!isfinite (settings[i]))
      CORRUPT ("%s: corrupt header: optimiser setting %s is not finite", path, setting_names[i]);
  const void *data = check_params (&r, p, path, count, total, error);
  if (!data)
    goto out;
  const void *st[2] = { NULL, NULL };
  guint32 slots = flags & FLAG_STATE ? n_state : 0;
  for (guint32 s = 0; s < slots; s++)
    st[s] = take (&r, total * sizeof (float));
  if (!r.ok)
    CORRUPT ("%s: truncated optimiser state", path);
  guint64 stream_len = 0;
  const void *stream = NULL;
  if (version >= 4) {
    stream_len = get_u64 (&r);
    if (!r.ok || stream_len > PSM_CHECKPOINT_MAX_STREAM || (stream_len && !(flags & FLAG_STATE)))
      CORRUPT ("%s: corrupt training-stream state (%" G_GUINT64_FORMAT " bytes)", path, stream_len);
    stream = take (&r, stream_len);
  }
  if (!r.ok || r.p != r.end)
    CORRUPT ("%s: truncated or oversized %s", path, version >= 4 ? "training-stream state" : "optimiser state");

  if (optim && !check_resume (optim, path, kind, flags, opt_name, settings, error))
    goto out;
  /* Everything verified: only now touch the model. */
  psm_params_set_data (p, data);
  if (optim)
    for (guint32 s = 0; s < slots; s++)
      memcpy (psm_optim_state (optim, (int) s), st[s], total * sizeof (float));
  if (meta) {
    m.stream = stream_len ? g_bytes_new (stream, stream_len) : NULL;
    *meta = m;
  }
  ok = TRUE;
out:
  g_free (opt_name);
  g_free (buf);
  return ok;
}
