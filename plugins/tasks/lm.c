/* lm — word-level language modelling on Penn Treebank and WikiText (Merity
 * et al. 2016, §5): the corpus as one stream of words, B contiguous streams
 * of it cut into segments of `bptt` words; the target of each position is
 * the next word.
 *
 * Files: every line is a sequence of space-separated words followed by
 * <eos> — PTB's one sentence a line (ptb.*.txt), and WikiText's paragraphs,
 * headings (" = Title = ") and blank lines (wiki.*.tokens) as the corpus has
 * them, a blank line giving a lone <eos>; that is the counting of the
 * published token totals (PTB 929,589 training words, WikiText-2
 * 2,088,628). The vocabulary is every word of the training split, most
 * frequent first (ties by the word): PTB's 10,000, WikiText-2's 33,278.
 * It is saved in the run folder and read back from there. A word of the
 * validation or test split outside it is mapped to <unk> when the
 * vocabulary has one, else it is an error naming file and line.
 *
 * Training: the training stream cut into B streams of floor(N / B) words
 * (the rest dropped, as is usual), walked segment after segment; at the end
 * of an epoch it starts again from the first segment with a fresh state
 * (PsmBatch.keep = 0). With `stride` k1 < bptt (Merity et al. §5.1: k1 = 1,
 * k2 = L), training segments of bptt words start k1 words apart and
 * overlap: segment j covers positions [j k1, j k1 + bptt) of every stream
 * and only its last k1 positions are scored (all of the first segment's),
 * so every target is trained on once, after backpropagation through up to
 * bptt - 1 earlier positions recomputed with the current parameters; the
 * state carried to the next segment is the one after its first k1
 * positions (PsmBatch.advance). An epoch is then about bptt / k1 times the
 * work. Evaluation: the N - 1 targets of a split are cut
 * into B contiguous runs (sizes differing by at most one), every target
 * scored exactly once whatever B is; only the state the streams start from
 * depends on B. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <psm/psm.h>

typedef struct {
  int32_t *ids;      /* the whole split as one stream */
  long n;
  /* streams of the last batching (B): stream i reads ids[start[i] ..
   * start[i] + len[i]] (len[i] targets) */
  int B;
  long *start, *len, max_len;
} Stream;

typedef struct {
  int bptt;
  int stride;                 /* training segments start this far apart */
  PsmVocab *vocab;            /* every training word, most frequent first */
  int unk, eos;               /* ids, or -1 */
  Stream split[3];
  long train_seg;             /* next training segment */
} Lm;

static const PsmParamSpec params[] = {
  { "train", PSM_PARAM_FILE, "../shared/data/ptb/ptb.train.txt", PSM_NO_RANGE, "training split", NULL },
  { "valid", PSM_PARAM_FILE, "../shared/data/ptb/ptb.valid.txt", PSM_NO_RANGE, "validation split", NULL },
  { "test", PSM_PARAM_FILE, "../shared/data/ptb/ptb.test.txt", PSM_NO_RANGE, "test split", NULL },
  { "bptt", PSM_PARAM_INT, "35", 1, 100000, "words a segment (truncated backpropagation through time)", NULL },
  { "stride", PSM_PARAM_INT, "0", 0, 100000,
    "training segments start this many words apart (k1 of Merity et al. 5.1; 0 = bptt, side by side); below bptt "
    "they overlap and only their last stride words are scored", NULL },
  { "max_train", PSM_PARAM_INT, "0", 0, 2000000000, "use the first N training words (0 = all)", NULL },
  PSM_PARAM_END
};

/* Calls fn (word, line, ud) for every word of the file, <eos> after each
 * line. */
static gboolean
each_word (const char *path, gboolean (*fn) (const char *, long, void *, GError **), void *ud, GError **error)
{
  FILE *f = fopen (path, "r");
  if (!f) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: cannot read: %s", path, g_strerror (errno));
    return FALSE;
  }
  char *line = NULL;
  size_t cap = 0;
  long lineno = 0;
  gboolean ok = TRUE;
  while (ok && getline (&line, &cap, f) >= 0) {
    lineno++;
    for (char *save = NULL, *w = strtok_r (line, " \t\r\n", &save); ok && w; w = strtok_r (NULL, " \t\r\n", &save))
      ok = fn (w, lineno, ud, error);
    if (ok)
      ok = fn ("<eos>", lineno, ud, error);
  }
  if (ok && ferror (f)) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: read error: %s", path, g_strerror (errno));
    ok = FALSE;
  }
  free (line);
  fclose (f);
  return ok;
}

typedef struct {
  Lm *t;
  GArray *ids;
  PsmWordCounts *count;   /* building the vocabulary */
  const char *path;
  long max;
  long n_words;
} Reader;

static gboolean
count_word (const char *w, long line, void *ud, GError **error)
{
  Reader *r = ud;
  psm_word_counts_add (r->count, w, 1);
  r->n_words++;
  return TRUE;
}

static gboolean
map_word (const char *w, long line, void *ud, GError **error)
{
  Reader *r = ud;
  if (r->max && (long) r->ids->len >= r->max)
    return TRUE;
  int32_t id = psm_vocab_id (r->t->vocab, w);
  id = id >= 0 ? id : r->t->unk;
  if (id < 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "%s:%ld: the word '%s' is not in the training vocabulary, which has no <unk> to map it to", r->path,
                 line, w);
    return FALSE;
  }
  g_array_append_val (r->ids, id);
  return TRUE;
}

static gboolean
build_vocab (Lm *t, const char *path, GError **error)
{
  Reader r = { t, NULL, psm_word_counts_new (), path, 0, 0 };
  gboolean ok = each_word (path, count_word, &r, error);
  if (ok && r.n_words == 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: no words", path);
    ok = FALSE;
  }
  if (ok)
    psm_vocab_add_by_count (t->vocab, r.count, 0);
  psm_word_counts_free (r.count);
  return ok;
}

static gboolean
read_split (Lm *t, const char *path, long max, Stream *s, GError **error)
{
  Reader r = { t, g_array_new (FALSE, FALSE, sizeof (int32_t)), NULL, path, max, 0 };
  gboolean ok = each_word (path, map_word, &r, error);
  if (ok && r.ids->len < 2) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "%s: fewer than 2 words, nothing to predict", path);
    ok = FALSE;
  }
  s->n = r.ids->len;
  s->ids = (int32_t *) (void *) g_array_free (r.ids, !ok);
  return ok;
}

static void lm_destroy (void *self);

static void *
lm_create (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error)
{
  Lm *t = g_new0 (Lm, 1);
  t->bptt = (int) psm_section_int (cfg, "bptt");
  t->stride = (int) psm_section_int (cfg, "stride");
  if (t->stride > t->bptt) {
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "%s: stride %d is longer than bptt %d: segments would skip words (use a stride of 1 to bptt, or 0 "
                 "for bptt)", psm_section_where (cfg, "stride"), t->stride, t->bptt);
    g_free (t);
    return NULL;
  }
  t->vocab = psm_vocab_new ();
  long max_train = (long) psm_section_int (cfg, "max_train");
  if (ctx->check) {
    /* psm-run --check: short streams exercise every path */
    int bptt = MIN (t->bptt, 12);
    t->stride = t->stride ? MAX (t->stride * bptt / t->bptt, 1) : 0;
    t->bptt = bptt;
    max_train = max_train ? MIN (max_train, 3000) : 3000;
  }
  gboolean eval_only = PSM_STRUCT_FIELD (ctx, eval_only, FALSE);
  const char *names[3] = { "train", "valid", "test" };
  char *vpath = ctx->run_dir ? g_build_filename (ctx->run_dir, "vocab.txt", NULL) : NULL;
  gboolean ok;
  if (vpath && g_file_test (vpath, G_FILE_TEST_EXISTS)) {
    ok = psm_vocab_load (t->vocab, vpath, NULL, error);
  } else {
    if (eval_only && vpath)
      fprintf (stderr, "lm: note: %s is missing: the vocabulary is built again from %s, which must be the data the "
               "run was trained on\n", vpath, psm_section_string (cfg, "train"));
    ok = build_vocab (t, psm_section_string (cfg, "train"), error);
  }
  g_free (vpath);
  if (ok) {
    t->unk = psm_vocab_id (t->vocab, "<unk>");
    t->eos = psm_vocab_id (t->vocab, "<eos>");
  }
  for (int k = eval_only ? 1 : 0; k < 3 && ok; k++) {
    ok = read_split (t, psm_section_string (cfg, names[k]), k == 0 ? max_train : ctx->check ? 600 : 0,
                     &t->split[k], error);
    if (!ok && error && *error)
      g_prefix_error (error, "task.%s: ", names[k]);
  }
  if (!ok) {
    lm_destroy (t);
    return NULL;
  }
  return t;
}

static void
lm_destroy (void *self)
{
  Lm *t = self;
  for (int k = 0; k < 3; k++) {
    g_free (t->split[k].ids);
    g_free (t->split[k].start);
    g_free (t->split[k].len);
  }
  psm_vocab_free (t->vocab);
  g_free (t);
}

static void
lm_info (void *self, PsmTaskInfo *info)
{
  Lm *t = self;
  int V = psm_vocab_size (t->vocab);
  info->src_vocab = info->tgt_vocab = info->ext_base = V;
  info->max_src_len = info->max_tgt_len = t->bptt;
  info->bos_id = info->eos_id = -1;   /* no decoder: nothing starts or ends a sequence */
  info->unk_id = t->unk;
  if (info->size >= G_STRUCT_OFFSET (PsmTaskInfo, streams) + sizeof (gboolean))
    info->streams = TRUE;
}

/* B streams over s: training, floor(n / B) words each (the targets are the
 * words after the first); evaluation, the n - 1 targets in B runs. */
static void
batchify (Stream *s, int B, gboolean train)
{
  if (s->B == B)
    return;
  s->B = B;
  s->start = g_renew (long, s->start, B);
  s->len = g_renew (long, s->len, B);
  long targets = s->n - 1, per = train ? s->n / B - 1 : targets / B, extra = train ? 0 : targets % B, pos = 0;
  s->max_len = 0;
  for (int i = 0; i < B; i++) {
    s->start[i] = train ? (long) i * (s->n / B) : pos;
    s->len[i] = MAX (per + (i < extra ? 1 : 0), 0);
    pos += s->len[i];
    s->max_len = MAX (s->max_len, s->len[i]);
  }
}

/* Segment k of the streams into out (T = 0 past the end): positions
 * [k stride, k stride + bptt), of which the first `skip` are context only
 * (no target scored). */
static void
fill_segment (Lm *t, const Stream *s, long k, int stride, int skip, PsmBatch *out)
{
  long off = k * stride;
  int T = (int) CLAMP (s->max_len - off, 0, t->bptt);
  psm_batch_reserve (out, s->B, T, T);
  if (stride < T)
    out->advance = stride;
  for (int b = 0; b < s->B; b++) {
    out->keep[b] = k > 0 ? 1.0f : 0.0f;
    out->example_id[b] = b;
    for (int i = 0; i < T; i++) {
      size_t at = (size_t) i * s->B + b;
      if (off + i >= s->len[b])
        continue;   /* this stream has ended: padding */
      const int32_t *p = s->ids + s->start[b] + off + i;
      out->src[at] = out->src_ext[at] = p[0];
      out->src_mask[at] = 1.0f;
      out->tgt[at] = out->tgt_ext[at] = out->dec_in[at] = p[1];
      out->tgt_mask[at] = i >= skip ? 1.0f : 0.0f;
      out->tgt_switch[at] = 1.0f;
    }
  }
}

static gboolean
lm_train_batch (void *self, int B, PsmRng *rng, PsmBatch *out, GError **error)
{
  Lm *t = self;
  Stream *s = &t->split[PSM_SPLIT_TRAIN];
  if (!s->ids) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "lm: no training words loaded (an eval-only run)");
    return FALSE;
  }
  if (s->n / B < 2) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "lm: %ld training words cannot make %d streams of two words or more", s->n, B);
    return FALSE;
  }
  if (s->B != B)
    t->train_seg = 0;
  batchify (s, B, TRUE);
  /* overlapping segments score the last `stride` positions; an epoch ends
   * when no position is left to score */
  int stride = t->stride ? t->stride : t->bptt, skip = t->train_seg > 0 ? t->bptt - stride : 0;
  if (t->train_seg > 0 && t->train_seg * stride + skip >= s->max_len)
    t->train_seg = 0;   /* a new epoch, from fresh states */
  skip = t->train_seg > 0 ? t->bptt - stride : 0;
  fill_segment (t, s, t->train_seg, stride, skip, out);
  t->train_seg++;
  return TRUE;
}

/* The next training segment, and a seek back to it (exact --resume). */
static gint64 lm_train_cursor (void *self) { return ((Lm *) self)->train_seg; }

static gboolean
lm_train_seek (void *self, int B, gint64 cursor, GError **error)
{
  Lm *t = self;
  Stream *s = &t->split[PSM_SPLIT_TRAIN];
  if (!s->ids || s->n / B < 2) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "lm: no training streams of %d to seek in", B);
    return FALSE;
  }
  batchify (s, B, TRUE);
  int stride = t->stride ? t->stride : t->bptt;
  /* past the last segment is allowed: the next batch starts a new epoch */
  long segments = 1 + (s->max_len > t->bptt ? (s->max_len - t->bptt + stride - 1) / stride : 0);
  if (cursor < 0 || cursor > segments) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "lm: the checkpoint's training position (segment %" G_GINT64_FORMAT ") is outside this training "
                 "data's %ld segments of %d streams (another train file, bptt or stride than the run's?)",
                 cursor, segments, B);
    return FALSE;
  }
  t->train_seg = cursor;
  return TRUE;
}

static int
lm_n_examples (void *self, PsmSplit split)
{
  const Stream *s = &((Lm *) self)->split[split];
  return s->ids ? (int) MIN (s->n - 1, G_MAXINT) : 0;
}

static gboolean
lm_eval_batch (void *self, PsmSplit split, int start, int B, PsmBatch *out, GError **error)
{
  Lm *t = self;
  Stream *s = &t->split[split];
  if (!s->ids) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "lm: the %s split is not loaded",
                 split == PSM_SPLIT_TRAIN ? "training" : "evaluation");
    return FALSE;
  }
  batchify (s, B, split == PSM_SPLIT_TRAIN);
  fill_segment (t, s, start, t->bptt, 0, out);
  return TRUE;
}

static const char *
lm_token_text (void *self, const PsmBatch *b, int ex, int32_t id)
{
  Lm *t = self;
  const char *w = psm_vocab_word (t->vocab, id);
  return w ? w : "<?>";
}

static gboolean
lm_save (void *self, const char *dir, GError **error)
{
  char *path = g_build_filename (dir, "vocab.txt", NULL);
  gboolean ok = psm_vocab_save (((Lm *) self)->vocab, -1, path, error);
  g_free (path);
  return ok;
}

static const PsmTaskClass klass = {
  .size = sizeof (PsmTaskClass),
  .create = lm_create,
  .destroy = lm_destroy,
  .info = lm_info,
  .train_batch = lm_train_batch,
  .n_examples = lm_n_examples,
  .eval_batch = lm_eval_batch,
  .token_text = lm_token_text,
  .save = lm_save,
  .train_cursor = lm_train_cursor,
  .train_seek = lm_train_seek,
};

PSM_PLUGIN (PSM_KIND_TASK, "lm",
            "word-level language modelling (PTB, WikiText): B streams cut into bptt-word segments, the state carried",
            params, NULL, &klass)
