/* psm-model-output.c — decoded outputs: the JSON records, and outputs and metric
 * inputs kept in the split's order when decoding in order of length. */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "model/model-internal.h"

/* One decoded example's inputs to the metrics, kept to be scored in the
 * split's order (ROUGE's bootstrap numbers the summaries in it): copies of
 * what the batch owns; a text the task's example_text gives is NULL here
 * and asked for again. */
typedef struct {
  gboolean set;
  int hn, rn;
  int32_t *hid, *rid;
  char **hw, **rw;
  char *hyp, *ref, *src;
} ScoreRec;

/* Decoding in order of source length (decode.sort): each output line goes
 * to a scratch file as it comes, and each example's metric inputs to a
 * ScoreRec; the metrics get them and the lines are copied out in the
 * split's order at the end. Without it, lines go straight to their file.
 * Output k is 0 the hypotheses, 1 the references, 2 the JSON records. */
struct Reorder {
  FILE *tmp;                /* NULL: no output files */
  gint64 *off;              /* [n, 3]: where example e's line k starts; -1: none */
  int *len;
  ScoreRec *score;          /* [n] */
  long n;
};

static void
json_string (GString *s, const char *w)
{
  g_string_append_c (s, '"');
  for (const char *c = w; *c; c++) {
    if (*c == '"' || *c == '\\')
      g_string_append_printf (s, "\\%c", *c);
    else if (*c == '\n')
      g_string_append (s, "\\n");
    else if ((unsigned char) *c < 0x20)
      g_string_append_printf (s, "\\u%04x", *c);
    else
      g_string_append_c (s, *c);
  }
  g_string_append_c (s, '"');
}

/* Sequence outputs of one batch: decode, score, write. */
/* words joined by spaces into s (returned) */
const char *
join_words (GString *s, const char *const *w, int n)
{
  g_string_truncate (s, 0);
  for (int i = 0; i < n; i++)
    g_string_append_printf (s, "%s%s", i ? " " : "", w[i]);
  return s->str;
}

/* A float list: %.4g, null where not finite */
static void
json_floats (GString *s, const float *v, int n, int stride)
{
  g_string_append_c (s, '[');
  for (int i = 0; i < n; i++) {
    float x = v[(size_t) i * stride];
    g_string_append (s, i ? ", " : "");
    if (isfinite (x))
      g_string_append_printf (s, "%.4g", x);
    else
      g_string_append (s, "null");
  }
  g_string_append_c (s, ']');
}

/* One example's decoding as a JSON line (--json; read by psm-run view):
 * the output tokens, whether each was copied (a slot past the head's
 * vocabulary: a source position or an article's own OOV word), the head's
 * gate per token (p_gen, the pointer softmax's shortlist probability, the
 * copy head's generation probability), the top attention positions and
 * every attention weight >= 0.005 as [position, weight] pairs, the source
 * tokens (the model's view: truncated, ids mapped back to words), the
 * coverage (attention summed over the output), the encoder's per-token
 * importance where it has one, and the reference. */
void
json_record (PsmModel *m, const PsmBatch *b, int bi, const PsmHyp *h, const Dec *d, const char *const *words,
             const char *ref, GString *line)
{
  int steps = d->n ? (int) (d->gate->len / d->n) : 0, T = b->T, vocab = PSM_BATCH_VOCAB (&d->bx, m->info.tgt_vocab);
  int *src_pos = g_new (int, T + 1);   /* batch position -> index among the real source tokens */
  int n_src = 0;
  for (int t = 0; t < T; t++)
    src_pos[t] = PSM_AT (b->src_mask, b, t, bi) != 0.0f ? n_src++ : -1;
  g_string_truncate (line, 0);
  g_string_append_printf (line, "{\"example\": %d, \"head\": ", b->example_id ? b->example_id[bi] : bi);
  json_string (line, m->head_name);
  g_string_append_printf (line, ", \"score\": %.6g, \"tokens\": [", h->score);
  for (int i = 0; i < h->len; i++) {
    g_string_append (line, i ? ", " : "");
    json_string (line, words[i]);
  }
  g_string_append (line, "], \"copied\": [");
  for (int i = 0; i < h->len; i++)
    g_string_append (line, h->slots[i] >= vocab ? (i ? ", true" : "true") : (i ? ", false" : "false"));
  g_string_append (line, "], \"p_gen\": ");
  float *gate = g_new (float, h->len + 1);
  for (int i = 0; i < h->len; i++)
    gate[i] = i < steps ? g_array_index (d->gate, float, (size_t) i * d->n + h->rows[i]) : NAN;
  json_floats (line, gate, h->len, 1);
  g_free (gate);
  g_string_append (line, ", \"attention\": [");
  for (int i = 0; i < h->len && m->attn_top > 0; i++) {
    g_string_append (line, i ? ", [" : "[");
    const int32_t *tp = (const int32_t *) d->top->data + ((size_t) i * d->n + h->rows[i]) * m->attn_top;
    for (int j = 0; j < m->attn_top && tp[j] >= 0; j++)
      g_string_append_printf (line, j ? ", %d" : "%d", src_pos[tp[j]] >= 0 ? src_pos[tp[j]] : tp[j]);
    g_string_append_c (line, ']');
  }
  g_string_append (line, "]");
  float *cov = g_new0 (float, n_src + 1);
  if (d->attn && d->attn->len >= (size_t) steps * d->n * T) {
    g_string_append (line, ", \"attention_weights\": [");
    for (int i = 0; i < h->len && i < steps; i++) {
      const float *a = (const float *) d->attn->data + ((size_t) i * d->n + h->rows[i]) * T;
      g_string_append (line, i ? ", [" : "[");
      for (int t = 0, k = 0; t < T; t++) {
        if (src_pos[t] < 0)
          continue;
        cov[src_pos[t]] += a[t];
        if (a[t] >= 0.005f)
          g_string_append_printf (line, "%s[%d, %.3g]", k++ ? ", " : "", src_pos[t], a[t]);
      }
      g_string_append_c (line, ']');
    }
    g_string_append (line, "], \"coverage\": ");
    json_floats (line, cov, n_src, 1);
  }
  g_free (cov);
  g_string_append (line, ", \"source\": [");
  for (int t = 0, k = 0; t < T; t++)
    if (src_pos[t] >= 0) {
      g_string_append (line, k++ ? ", " : "");
      json_string (line, m->tk->token_text (m->task, b, bi, PSM_AT (b->src_ext, b, t, bi)));
    }
  g_string_append (line, "]");
  PsmTensor *imp = d->enc.importance;
  if (imp && imp->ndim == 3 && imp->shape[0] == b->T && imp->shape[1] == b->B) {
    /* the encoder's per-token weights, each the mean over its units */
    int D = imp->shape[2];
    g_string_append (line, ", \"importance\": [");
    for (int t = 0, k = 0; t < b->T; t++)
      if (src_pos[t] >= 0) {
        const float *v = imp->data + ((size_t) t * b->B + bi) * D;
        double sum = 0.0;
        for (int j = 0; j < D; j++)
          sum += v[j];
        g_string_append_printf (line, "%s%.4g", k++ ? ", " : "", sum / D);
      }
    g_string_append (line, "]");
  }
  if (ref) {
    g_string_append (line, ", \"reference\": ");
    json_string (line, ref);
  }
  g_string_append (line, "}");
  g_free (src_pos);
}

void
emit_line (Reorder *r, int k, int ex, FILE *f, const GString *line)
{
  if (!r) {
    fprintf (f, "%s\n", line->str);
    return;
  }
  r->off[(size_t) ex * 3 + k] = ftello (r->tmp);
  r->len[(size_t) ex * 3 + k] = (int) line->len;
  fwrite (line->str, 1, line->len, r->tmp);
}

static char **
strv_of (const PsmSeq *q)
{
  char **v = g_new (char *, q->len + 1);
  for (int i = 0; i < q->len; i++)
    v[i] = g_strdup (q->words[i]);
  v[q->len] = NULL;
  return v;
}

void
keep_scores (Reorder *r, int ex, const PsmSeq *hs, const PsmSeq *rs, const char *hyp, const char *ref,
             const char *src)
{
  ScoreRec *c = &r->score[ex];
  c->set = TRUE;
  c->hn = hs->len;
  c->rn = rs->len;
  c->hid = g_memdup2 (hs->ids, (gsize) hs->len * sizeof (int32_t));
  c->rid = g_memdup2 (rs->ids, (gsize) rs->len * sizeof (int32_t));
  c->hw = strv_of (hs);
  c->rw = strv_of (rs);
  c->hyp = g_strdup (hyp);
  c->ref = g_strdup (ref);
  c->src = g_strdup (src);
}

void
add_metrics (PsmModel *m, const PsmSeq *hs, const PsmSeq *rs, const char *hyp, const char *ref, const char *src)
{
  for (int i = 0; i < m->n_metrics; i++) {
    void (*add_text) (void *, const char *, const char *, const char *) = PSM_CLASS_HOOK (m->mk[i], add_text);
    if (add_text)
      add_text (m->metric[i], hyp, ref, src);
    else if (m->mk[i]->add)
      m->mk[i]->add (m->metric[i], hs, rs);
  }
}

/* The kept examples to the metrics, in the split's order. */
void
reorder_score (PsmModel *m, PsmSplit split, Reorder *r)
{
  void (*example_text) (void *, PsmSplit, int, const char **, const char **) = PSM_CLASS_HOOK (m->tk, example_text);
  for (long e = 0; e < r->n; e++) {
    ScoreRec *c = &r->score[e];
    if (!c->set)
      continue;
    const char *src = c->src, *ref = c->ref, *tsrc = NULL, *tref = NULL;
    if (c->hyp && (!src || !ref) && example_text)
      example_text (m->task, split, (int) e, &tsrc, &tref);
    PsmSeq hs = { c->hn, c->hid, (const char *const *) c->hw }, rs = { c->rn, c->rid, (const char *const *) c->rw };
    add_metrics (m, &hs, &rs, c->hyp, ref ? ref : tref, src ? src : tsrc);
  }
}

/* The scratch file: in TMPDIR, unlinked at once. */
Reorder *
reorder_new (long n, gboolean files, GError **error)
{
  FILE *tmp = NULL;
  if (files) {
    char *path = NULL;
    GError *e = NULL;
    int fd = g_file_open_tmp ("psm-decode-XXXXXX", &path, &e);
    if (fd >= 0) {
      g_unlink (path);
      tmp = fdopen (fd, "w+b");
      if (!tmp)
        g_set_error (&e, G_FILE_ERROR, g_file_error_from_errno (errno), "%s", g_strerror (errno));
    }
    g_free (path);
    if (!tmp) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "decoding in length order: cannot create a scratch file (%s); decode.sort = false decodes in the "
                   "split's order without one", e->message);
      g_error_free (e);
      if (fd >= 0)
        close (fd);
      return NULL;
    }
  }
  Reorder *r = g_new0 (Reorder, 1);
  r->tmp = tmp;
  r->n = n;
  r->off = g_new (gint64, (size_t) n * 3);
  r->len = g_new0 (int, (size_t) n * 3);
  r->score = g_new0 (ScoreRec, n);
  for (size_t i = 0; i < (size_t) n * 3; i++)
    r->off[i] = -1;
  return r;
}

/* The lines of each output in the split's order. */
gboolean
reorder_write (Reorder *r, const PsmEvalOptions *opt, GError **error)
{
  if (!r->tmp)
    return TRUE;
  FILE *outs[3] = { opt->out, opt->ref, opt->json };
  GString *buf = g_string_new (NULL);
  gboolean ok = fflush (r->tmp) == 0;
  for (int k = 0; ok && k < 3; k++)
    for (long e = 0; ok && outs[k] && e < r->n; e++) {
      gint64 off = r->off[(size_t) e * 3 + k];
      if (off < 0)
        continue;
      g_string_set_size (buf, (gsize) r->len[(size_t) e * 3 + k]);
      ok = fseeko (r->tmp, off, SEEK_SET) == 0 && fread (buf->str, 1, buf->len, r->tmp) == buf->len;
      if (ok) {
        fwrite (buf->str, 1, buf->len, outs[k]);
        fputc ('\n', outs[k]);
      }
    }
  if (!ok)
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "decoding in length order: cannot read back its scratch "
                 "file (%s)", ferror (r->tmp) ? g_strerror (errno) : "short read");
  g_string_free (buf, TRUE);
  return ok;
}

void
reorder_free (Reorder *r)
{
  if (!r)
    return;
  if (r->tmp)
    fclose (r->tmp);
  for (long e = 0; e < r->n; e++) {
    ScoreRec *c = &r->score[e];
    g_free (c->hid);
    g_free (c->rid);
    g_strfreev (c->hw);
    g_strfreev (c->rw);
    g_free (c->hyp);
    g_free (c->ref);
    g_free (c->src);
  }
  g_free (r->score);
  g_free (r->off);
  g_free (r->len);
  g_free (r);
}
