/* psm-model-stream.c — the language models' stream state (the encoder's carry
 * and the head's history between segments) saved, restored and merged. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

/* Stream state layout (native endianness, as the checkpoint): "PSMS", u32
 * 1, i64 cursor (-1: the task has none), i32 rows, i32 carry_k, f32 carry
 * [rows, carry_k], i32 hist_p, i32 hist_h, f32 history [hist_p, rows,
 * hist_h], i32 words [hist_p, rows]; rows = 0 before any training step. */
GBytes *
psm_model_stream_state (PsmModel *m)
{
  if (!m->streams)
    return NULL;
  gint64 (*cursor) (void *) = PSM_CLASS_HOOK (m->tk, train_cursor);
  gint64 cur = cursor ? cursor (m->task) : -1;
  gint32 rows = m->carry_k ? m->carry_rows[0] : m->hist_rows[0], k = m->carry_k, P = m->hist_p, H = m->hist_h;
  if (m->carry_k && m->hist_p && m->hist_rows[0] != rows)
    rows = 0;   /* not yet a training segment with both */
  guint32 version = 1;
  GByteArray *a = g_byte_array_new ();
  g_byte_array_append (a, (const guint8 *) "PSMS", 4);
  g_byte_array_append (a, (const guint8 *) &version, 4);
  g_byte_array_append (a, (const guint8 *) &cur, 8);
  g_byte_array_append (a, (const guint8 *) &rows, 4);
  g_byte_array_append (a, (const guint8 *) &k, 4);
  if (rows && k)
    g_byte_array_append (a, (const guint8 *) m->carry[0], (guint) ((size_t) rows * k * sizeof (float)));
  g_byte_array_append (a, (const guint8 *) &P, 4);
  g_byte_array_append (a, (const guint8 *) &H, 4);
  if (rows && P) {
    g_byte_array_append (a, (const guint8 *) m->hist[0], (guint) ((size_t) P * rows * H * sizeof (float)));
    g_byte_array_append (a, (const guint8 *) m->hist_ids[0], (guint) ((size_t) P * rows * sizeof (int32_t)));
  }
  return g_byte_array_free_to_bytes (a);
}

/* A stream state read back: pointers into its bytes. */
typedef struct {
  gint64 cur;
  gint32 rows, k, P, H;
  const float *carry, *hist;
  const int32_t *ids;
} StreamState;

/* Checks a stream state against this model (not yet against a batch
 * size). */
static gboolean
stream_state_parse (PsmModel *m, GBytes *state, StreamState *st, GError **error)
{
  gsize len = 0;
  const guint8 *p = g_bytes_get_data (state, &len);   /* NULL when empty */
  static const guint8 none[1];
  if (!p)
    p = none;
  const guint8 *end = p + len;
#define NEED(n) ((size_t) (end - p) >= (size_t) (n))
#define BAD_STATE(...)                                                                 \
  do {                                                                                 \
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, __VA_ARGS__);             \
    return FALSE;                                                                      \
  } while (0)
  guint32 version;
  if (!NEED (24) || memcmp (p, "PSMS", 4) != 0)
    BAD_STATE ("the checkpoint's training-stream state is malformed");
  memcpy (&version, p + 4, 4);
  memcpy (&st->cur, p + 8, 8);
  memcpy (&st->rows, p + 16, 4);
  memcpy (&st->k, p + 20, 4);
  p += 24;
  if (version != 1)
    BAD_STATE ("the checkpoint's training-stream state has version %u, this psm reads 1", version);
  if (st->rows < 0)
    BAD_STATE ("the checkpoint's training-stream state is malformed");
  if (st->k != m->carry_k)
    BAD_STATE ("the checkpoint carries %d floats of encoder state a stream, this model %d", st->k, m->carry_k);
  st->carry = (const float *) p;
  size_t nc = st->rows && st->k ? (size_t) st->rows * st->k : 0;
  if (!NEED (nc * sizeof (float) + 8))
    BAD_STATE ("the checkpoint's training-stream state is truncated");
  p += nc * sizeof (float);
  memcpy (&st->P, p, 4);
  memcpy (&st->H, p + 4, 4);
  p += 8;
  if (st->P != m->hist_p || (st->P && st->H != m->hist_h))
    BAD_STATE ("the checkpoint keeps a history of %d positions of %d floats, this model's head %d of %d", st->P,
               st->H, m->hist_p, m->hist_h);
  size_t nh = st->rows && st->P ? (size_t) st->P * st->rows : 0;
  st->hist = (const float *) p;
  st->ids = (const int32_t *) (p + nh * st->H * sizeof (float));
  if ((size_t) (end - p) != nh * st->H * sizeof (float) + nh * sizeof (int32_t))
    BAD_STATE ("the checkpoint's training-stream state is truncated or oversized");
#undef NEED
#undef BAD_STATE
  return TRUE;
}

gboolean
psm_model_restore_stream_state (PsmModel *m, GBytes *state, int B, GError **error)
{
  return psm_model_restore_stream_rows (m, state, B, 0, B, error);
}

gboolean
psm_model_restore_stream_rows (PsmModel *m, GBytes *state, int B, int lo, int n, GError **error)
{
  if (!m->streams) {
    if (state) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "the checkpoint holds the state of training streams, but task '%s' has none", m->task_name);
      return FALSE;
    }
    return TRUE;
  }
  if (!state) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint holds no state of the training streams (written by a psm before checkpoint "
                 "version 4?): resuming would restart task '%s' from its first segment", m->task_name);
    return FALSE;
  }
  g_return_val_if_fail (lo >= 0 && n > 0 && lo + n <= B, FALSE);
  StreamState st;
  if (!stream_state_parse (m, state, &st, error))
    return FALSE;
  if (st.rows != 0 && st.rows != B) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint's training streams are %d (train.batch then), the pipeline asks for %d: resume "
                 "with the same train.batch", st.rows, B);
    return FALSE;
  }
  gboolean (*seek) (void *, int, gint64, GError **) = PSM_CLASS_HOOK (m->tk, train_seek);
  if (st.cur >= 0 && !seek) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "the checkpoint records where task '%s' stood in its training data, but this build of it cannot "
                 "seek there (PsmTaskClass.train_seek)", m->task_name);
    return FALSE;
  }
  if (st.cur >= 0 && !seek (m->task, B, st.cur, error))
    return FALSE;
  /* everything checked: set this process's rows (as its first segment would) */
  int k = st.k, P = st.P, H = st.H;
  if (st.rows && k) {
    g_free (m->carry[0]);
    m->carry[0] = g_memdup2 (st.carry + (size_t) lo * k, (size_t) n * k * sizeof (float));
    m->carry_rows[0] = n;
  }
  if (st.rows && P) {
    g_free (m->hist[0]);
    g_free (m->hist_ids[0]);
    m->hist[0] = g_new (float, (size_t) P * n * H);
    m->hist_ids[0] = g_new (int32_t, (size_t) P * n);
    for (int q = 0; q < P; q++) {
      memcpy (m->hist[0] + (size_t) q * n * H, st.hist + ((size_t) q * B + lo) * H, (size_t) n * H * sizeof (float));
      memcpy (m->hist_ids[0] + (size_t) q * n, st.ids + (size_t) q * B + lo, (size_t) n * sizeof (int32_t));
    }
    m->hist_rows[0] = n;
  }
  return TRUE;
}

GBytes *
psm_model_stream_state_merge (PsmModel *m, GPtrArray *parts, GError **error)
{
  int np = (int) parts->len, rows = 0;
  StreamState *st = g_new (StreamState, np);
  for (int r = 0; r < np; r++) {
    if (!stream_state_parse (m, g_ptr_array_index (parts, r), &st[r], error)) {
      g_prefix_error (error, "MPI rank %d: ", r);
      g_free (st);
      return NULL;
    }
    rows += st[r].rows;
    if (st[r].cur != st[0].cur || (st[r].rows == 0) != (st[0].rows == 0)) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "the MPI ranks' training streams disagree (rank %d: cursor %" G_GINT64_FORMAT ", %d rows; rank 0: "
                   "cursor %" G_GINT64_FORMAT ", %d rows)", r, st[r].cur, st[r].rows, st[0].cur, st[0].rows);
      g_free (st);
      return NULL;
    }
  }
  gint32 k = st[0].k, P = st[0].P, H = st[0].H;
  guint32 version = 1;
  GByteArray *a = g_byte_array_new ();
  g_byte_array_append (a, (const guint8 *) "PSMS", 4);
  g_byte_array_append (a, (const guint8 *) &version, 4);
  g_byte_array_append (a, (const guint8 *) &st[0].cur, 8);
  g_byte_array_append (a, (const guint8 *) &rows, 4);
  g_byte_array_append (a, (const guint8 *) &k, 4);
  for (int r = 0; rows && k && r < np; r++)   /* [rows, k]: the ranks' rows one after another */
    g_byte_array_append (a, (const guint8 *) st[r].carry, (guint) ((size_t) st[r].rows * k * sizeof (float)));
  g_byte_array_append (a, (const guint8 *) &P, 4);
  g_byte_array_append (a, (const guint8 *) &H, 4);
  if (rows && P) {   /* [P, rows, H] and [P, rows]: position by position */
    for (int q = 0; q < P; q++)
      for (int r = 0; r < np; r++)
        g_byte_array_append (a, (const guint8 *) (st[r].hist + (size_t) q * st[r].rows * H),
                             (guint) ((size_t) st[r].rows * H * sizeof (float)));
    for (int q = 0; q < P; q++)
      for (int r = 0; r < np; r++)
        g_byte_array_append (a, (const guint8 *) (st[r].ids + (size_t) q * st[r].rows),
                             (guint) ((size_t) st[r].rows * sizeof (int32_t)));
  }
  g_free (st);
  return g_byte_array_free_to_bytes (a);
}
