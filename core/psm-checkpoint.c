/* psm-checkpoint.c — atomic, checksummed checkpoints (layout in the header). */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "psm-private.h"

#define MAGIC "PSMCKPT1"
#define DIGEST_LEN 32

typedef struct {
  FILE *f;
  GChecksum *sum;
  gboolean ok;
} Writer;

static void
put (Writer *w, const void *data, size_t n)
{
  if (!w->ok || n == 0)
    return;
  if (fwrite (data, 1, n, w->f) != n)
    w->ok = FALSE;
  /* g_checksum_update takes gssize; feed large buffers in pieces. */
  const guchar *p = data;
  while (n) {
    size_t k = MIN (n, (size_t) 1 << 30);
    g_checksum_update (w->sum, p, k);
    p += k;
    n -= k;
  }
}

static void put_u32 (Writer *w, guint32 v) { put (w, &v, 4); }
static void put_u64 (Writer *w, guint64 v) { put (w, &v, 8); }

gboolean
psm_checkpoint_save (const char *path, PsmParams *p, PsmOptim *optim,
                     const PsmCheckpointMeta *meta, GError **error)
{
  char *tmp = g_strdup_printf ("%s.tmp.%d", path, (int) getpid ());
  Writer w = { fopen (tmp, "wb"), g_checksum_new (G_CHECKSUM_SHA256), TRUE };
  if (!w.f) {
    g_set_error (error, G_FILE_ERROR, g_file_error_from_errno (errno),
                 "%s: cannot write checkpoint: %s", tmp, g_strerror (errno));
    g_checksum_free (w.sum);
    g_free (tmp);
    return FALSE;
  }
  size_t total = psm_params_size (p);
  int n_state = optim ? psm_optim_n_state (optim) : 0;
  const char *opt_name = optim ? psm_optim_name (optim) : "";
  put (&w, MAGIC, 8);
  put_u32 (&w, PSM_CHECKPOINT_VERSION);
  put_u64 (&w, (guint64) meta->step);
  put (&w, meta->rng.s, sizeof meta->rng.s);
  put (&w, &meta->best_metric, sizeof (double));
  put_u32 (&w, (guint32) strlen (opt_name));
  put (&w, opt_name, strlen (opt_name));
  put_u32 (&w, (guint32) n_state);
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
  guint8 digest[DIGEST_LEN];
  gsize dlen = DIGEST_LEN;
  g_checksum_get_digest (w.sum, digest, &dlen);
  if (w.ok && fwrite (digest, 1, DIGEST_LEN, w.f) != DIGEST_LEN)
    w.ok = FALSE;
  if (w.ok && (fflush (w.f) != 0 || fsync (fileno (w.f)) != 0))
    w.ok = FALSE;
  int saved_errno = errno;
  if (fclose (w.f) != 0)
    w.ok = FALSE;
  g_checksum_free (w.sum);
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

gboolean
psm_checkpoint_load (const char *path, PsmParams *p, PsmOptim *optim,
                     PsmCheckpointMeta *meta, GError **error)
{
  gchar *buf = NULL;
  gsize len = 0;
  gboolean ok = FALSE;
  char *opt_name = NULL;
  if (!g_file_get_contents (path, &buf, &len, error))
    return FALSE;
  if (len < 8 + DIGEST_LEN || memcmp (buf, MAGIC, 8) != 0)
    CORRUPT ("%s: not a psm checkpoint (bad magic)", path);
  guint8 digest[DIGEST_LEN];
  gsize dlen = DIGEST_LEN;
  GChecksum *sum = g_checksum_new (G_CHECKSUM_SHA256);
  g_checksum_update (sum, (const guchar *) buf, len - DIGEST_LEN);
  g_checksum_get_digest (sum, digest, &dlen);
  g_checksum_free (sum);
  Reader r = { (const guint8 *) buf + 8, (const guint8 *) buf + len - DIGEST_LEN, TRUE };
  guint32 version = get_u32 (&r);
  if (version != PSM_CHECKPOINT_VERSION)
    CORRUPT ("%s: checkpoint format version %u, this psm reads version %d", path, version,
             PSM_CHECKPOINT_VERSION);
  if (memcmp (digest, buf + len - DIGEST_LEN, DIGEST_LEN) != 0)
    CORRUPT ("%s: checksum mismatch: the checkpoint is corrupt or truncated", path);
  PsmCheckpointMeta m = { 0 };
  m.step = (long) get_u64 (&r);
  const void *rs = take (&r, sizeof m.rng.s);
  if (rs)
    memcpy (m.rng.s, rs, sizeof m.rng.s);
  const void *bm = take (&r, sizeof (double));
  if (bm)
    memcpy (&m.best_metric, bm, sizeof (double));
  guint32 nl = get_u32 (&r);
  const char *on = take (&r, nl);
  opt_name = on ? g_strndup (on, nl) : g_strdup ("");
  guint32 n_state = get_u32 (&r);
  guint64 total = get_u64 (&r);
  guint32 count = get_u32 (&r);
  if (!r.ok)
    CORRUPT ("%s: truncated header", path);
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
  const void *data = take (&r, total * sizeof (float));
  if (!data)
    CORRUPT ("%s: truncated parameter data", path);
  if (optim && n_state && (strcmp (opt_name, psm_optim_name (optim)) != 0 ||
                           (int) n_state != psm_optim_n_state (optim)))
    CORRUPT ("%s: checkpoint was trained with optimiser '%s', the pipeline asks for '%s'", path,
             opt_name, psm_optim_name (optim));
  const void *st[2] = { NULL, NULL };
  for (guint32 s = 0; s < n_state; s++) {
    const void *sp = take (&r, total * sizeof (float));
    if (s < 2)
      st[s] = sp;
  }
  if (!r.ok || r.p != r.end)
    CORRUPT ("%s: truncated or oversized optimiser state", path);
  /* Everything verified: only now touch the model. */
  memcpy (psm_params_data (p), data, total * sizeof (float));
  if (optim && n_state)
    for (guint32 s = 0; s < n_state && s < 2; s++)
      memcpy (psm_optim_state (optim, (int) s), st[s], total * sizeof (float));
  if (meta)
    *meta = m;
  ok = TRUE;
out:
  g_free (opt_name);
  g_free (buf);
  return ok;
}
