/* cnndm — abstractive summarisation data in the form of See et al. 2017.
 *
 * Reads a split from jsonl ({"id", "article", "highlights"} a line, the
 * highlights one sentence a line, joined by "\n") or, for a path ending in
 * ".source", from it and the line-aligned ".target" beside it. Texts are
 * already tokenised and lower-cased (as See's data is): tokens are split on
 * white space. The summary is the highlight sentences concatenated.
 *
 * Vocabulary: the `vocab` - 4 most frequent words of the training split
 * (ties broken by the word) after <pad> <unk> <s> </s>; written to the run
 * folder as vocab.txt and read back from it by eval, decode and resume.
 * Articles are cut to max_src tokens, summaries to max_tgt (then </s>).
 * Words outside the vocabulary get per-batch extended ids (ext_base + i), in
 * the source (src_ext) and the target (tgt_ext, the true word for the
 * references); the shortlist target (tgt) is <unk> for them.
 *
 * Bad records — invalid JSON, a missing or non-string field, an empty
 * article or summary — are skipped and counted on stderr with the first line
 * numbers; a split with no valid record is an error naming the file. Raw text
 * for decoding (text_batch) is lower-cased and tokenised like the PTB
 * tokeniser See's data went through (an approximation: punctuation split
 * off, n't and 's split, quotes as `` and ''). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>
#include <psm/psm-pipeline.h>

#define N_SPECIAL 4
enum { PAD, UNK, BOS, EOS };
static const char *const special[N_SPECIAL + 1] = { "<pad>", "<unk>", "<s>", "</s>", NULL };

typedef struct {
  int n;
  int32_t *src_off, *tgt_off;   /* [n + 1] offsets into ids */
  GArray *ids;                  /* int32 global word ids */
} Split;

typedef struct {
  GPtrArray *article, *summary;   /* char * */
} Texts;

typedef struct {
  int V, max_src, max_tgt;
  PsmVocab *words;              /* global ids; [0, V) is the vocabulary (with
                                   train counts), then every other word seen */
  Split split[3];
  Texts text[3];                /* whole texts of valid and test (metrics) */
  gboolean check;
} Cnndm;

static const PsmParamSpec params[] = {
  { "train", PSM_PARAM_FILE, "../shared/data/cnndm/train.jsonl", PSM_NO_RANGE,
    "training split (.jsonl, or .source beside a .target)", NULL },
  { "valid", PSM_PARAM_FILE, "../shared/data/cnndm/valid.jsonl", PSM_NO_RANGE, "validation split", NULL },
  { "test", PSM_PARAM_STRING, "", PSM_NO_RANGE, "test split (empty: the validation split)", NULL },
  { "vocab", PSM_PARAM_INT, "50000", 8, 10000000, "vocabulary size, 4 special words included", NULL },
  { "max_src", PSM_PARAM_INT, "400", 1, 100000, "article tokens kept (See: 400)", NULL },
  { "max_tgt", PSM_PARAM_INT, "100", 1, 100000, "summary tokens kept before </s> (See: 100)", NULL },
  { "max_train", PSM_PARAM_INT, "0", 0, 1000000000, "use the first N training records (0 = all)", NULL },
  PSM_PARAM_END
};

/* ---- reading a split into texts ---- */


static void
texts_free (Texts *t)
{
  if (t->article)
    g_ptr_array_unref (t->article);
  if (t->summary)
    g_ptr_array_unref (t->summary);
}

static gboolean
read_split (const char *path, long max, gboolean quiet, Texts *out, GError **error)
{
  static const char *const keys[2] = { "article", "highlights" };
  char *tpath = g_str_has_suffix (path, ".source") ? g_strdup_printf ("%.*s.target", (int) strlen (path) - 7, path)
                                                   : NULL;
  gboolean ok = psm_read_text_pairs (path, tpath, keys, max, quiet, "cnndm", &out->article, &out->summary, error);
  g_free (tpath);
  return ok;
}

/* ---- vocabulary ---- */

static void
build_vocab (Cnndm *t, const Texts *tr)
{
  PsmWordCounts *count = psm_word_counts_new ();
  for (int k = 0; k < 2; k++) {
    GPtrArray *texts = k ? tr->summary : tr->article;
    for (guint i = 0; i < texts->len; i++) {
      char **tok = g_strsplit_set (texts->pdata[i], " \t\n\r", -1);
      for (char **w = tok; *w; w++)
        if (**w)
          psm_word_counts_add (count, *w, 1);
      g_strfreev (tok);
    }
  }
  /* the special words first (count 0, even where the text has them) */
  for (int i = 0; i < N_SPECIAL; i++)
    psm_vocab_add (t->words, special[i]);
  psm_vocab_add_by_count (t->words, count, t->V);
  psm_word_counts_free (count);
}

static gboolean
load_vocab (Cnndm *t, const char *path, GError **error)
{
  if (!psm_vocab_load (t->words, path, special, error))
    return FALSE;
  if (psm_vocab_size (t->words) != t->V) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "%s: holds %d words, but task.vocab is %d (the run was made with another vocabulary size)", path,
                 psm_vocab_size (t->words), t->V);
    return FALSE;
  }
  return TRUE;
}

/* The ids of text's first max words, added to the word table; raw (a
 * client's text): a word longer than PSM_MAX_WORD_BYTES is <unk>. */
static void
tokens_to_ids (Cnndm *t, const char *text, int max, gboolean raw, GArray *ids)
{
  char **tok = g_strsplit_set (text, " \t\n\r", -1);
  int n = 0;
  for (char **w = tok; *w && n < max; w++)
    if (**w) {
      int32_t id = raw && strlen (*w) > PSM_MAX_WORD_BYTES ? UNK : psm_vocab_add (t->words, *w);
      g_array_append_val (ids, id);
      n++;
    }
  g_strfreev (tok);
}

static void
fill_split (Cnndm *t, Split *s, const Texts *x)
{
  s->n = (int) x->article->len;
  s->src_off = g_new (int32_t, s->n + 1);
  s->tgt_off = g_new (int32_t, s->n + 1);
  s->ids = g_array_new (FALSE, FALSE, sizeof (int32_t));
  for (int i = 0; i < s->n; i++) {
    s->src_off[i] = (int32_t) s->ids->len;
    tokens_to_ids (t, x->article->pdata[i], t->max_src, FALSE, s->ids);
    s->tgt_off[i] = (int32_t) s->ids->len;
    tokens_to_ids (t, x->summary->pdata[i], t->max_tgt, FALSE, s->ids);
  }
  s->src_off[s->n] = s->tgt_off[s->n] = (int32_t) s->ids->len;
}

static void cn_destroy (void *self);

static void *
cn_create (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error)
{
  Cnndm *t = g_new0 (Cnndm, 1);
  t->V = (int) psm_section_int (cfg, "vocab");
  t->max_src = (int) psm_section_int (cfg, "max_src");
  t->max_tgt = (int) psm_section_int (cfg, "max_tgt");
  if (ctx->check) {
    /* psm-run --check: a few short examples exercise every path */
    t->max_src = MIN (t->max_src, 48);
    t->max_tgt = MIN (t->max_tgt, 16);
  }
  t->check = ctx->check;
  t->words = psm_vocab_new ();
  long max_train = (long) psm_section_int (cfg, "max_train");
  if (ctx->check)
    max_train = max_train ? MIN (max_train, 64) : 64;
  const char *test = psm_section_string (cfg, "test");
  const char *paths[3] = { psm_section_string (cfg, "train"), psm_section_string (cfg, "valid"),
                           *test ? test : psm_section_string (cfg, "valid") };
  long max[3] = { max_train, ctx->check ? 8 : 0, ctx->check ? 8 : 0 };
  Texts x[3] = { { 0 } };
  gboolean ok = TRUE;
  /* evaluating or decoding a trained run: its vocabulary is in the run
   * folder and the training split is not read at all; decoding raw text
   * reads no split */
  gboolean eval_only = PSM_STRUCT_FIELD (ctx, eval_only, FALSE);
  gboolean text_only = PSM_STRUCT_FIELD (ctx, text_only, FALSE);
  char *vpath = ctx->run_dir ? g_build_filename (ctx->run_dir, "vocab.txt", NULL) : NULL;
  gboolean saved_vocab = vpath && g_file_test (vpath, G_FILE_TEST_EXISTS);
  if (eval_only && vpath && !saved_vocab)
    fprintf (stderr, "cnndm: note: %s is missing: the vocabulary is built again from %s, which must be the data "
             "the run was trained on\n", vpath, paths[0]);
  for (int k = 0; k < 3 && ok; k++) {
    if (saved_vocab && (text_only || (k == 0 && eval_only)))
      continue;
    ok = read_split (paths[k], max[k], k == 2 && !*test, &x[k], error);
    if (!ok && error && *error)
      g_prefix_error (error, "task.%s: ", k == 0 ? "train" : k == 1 ? "valid" : "test");
  }
  if (ok && saved_vocab) {
    ok = load_vocab (t, vpath, error);
  } else if (ok) {
    build_vocab (t, &x[0]);
    if (!ctx->check && psm_vocab_size (t->words) < t->V) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: %d, but the training split has only %d distinct words (with the 4 special ones)",
                   psm_section_where (cfg, "vocab"), t->V, psm_vocab_size (t->words));
      ok = FALSE;
    }
    /* --check on a few records: the vocabulary is what they hold */
    t->V = MIN (t->V, psm_vocab_size (t->words));
  }
  g_free (vpath);
  for (int k = eval_only ? 1 : 0; k < 3 && ok; k++)   /* eval_only: no training examples */
    if (x[k].article)   /* (text_only: no split read) */
      fill_split (t, &t->split[k], &x[k]);
  texts_free (&x[0]);
  for (int k = 1; k < 3; k++)
    t->text[k] = x[k];   /* kept whole for the text metrics */
  if (!ok) {
    cn_destroy (t);
    return NULL;
  }
  return t;
}

static void
cn_destroy (void *self)
{
  Cnndm *t = self;
  for (int k = 0; k < 3; k++)
    texts_free (&t->text[k]);
  for (int k = 0; k < 3; k++) {
    g_free (t->split[k].src_off);
    g_free (t->split[k].tgt_off);
    if (t->split[k].ids)
      g_array_unref (t->split[k].ids);
  }
  psm_vocab_free (t->words);
  g_free (t);
}

static void
cn_info (void *self, PsmTaskInfo *info)
{
  Cnndm *t = self;
  info->src_vocab = t->V;
  info->tgt_vocab = t->V;
  info->ext_base = t->V;
  info->max_src_len = t->max_src;
  info->max_tgt_len = t->max_tgt + 1;
  info->bos_id = BOS;
  info->eos_id = EOS;
  info->unk_id = UNK;
}

/* Extended id of a global word id for this batch. */
static int32_t
ext_id (Cnndm *t, PsmBatch *b, int32_t gid)
{
  return gid < t->V ? gid : psm_batch_oov_id (b, psm_vocab_word (t->words, gid));
}

/* Fills b from examples idx[0..B) of split s (sources only when no_target). */
static void
fill_batch (Cnndm *t, const Split *s, const int *idx, int B, PsmBatch *b)
{
  int T = 1, Ty = 1;
  for (int i = 0; i < B; i++) {
    int e = idx[i];
    T = MAX (T, s->tgt_off[e] - s->src_off[e]);
    Ty = MAX (Ty, s->src_off[e + 1] - s->tgt_off[e] + 1);
  }
  psm_batch_reserve (b, B, T, Ty);
  b->ext_base = t->V;
  const int32_t *ids = (const int32_t *) s->ids->data;
  for (int i = 0; i < B; i++) {
    int e = idx[i];
    b->example_id[i] = e;
    int ns = s->tgt_off[e] - s->src_off[e], nt = s->src_off[e + 1] - s->tgt_off[e];
    for (int k = 0; k < ns; k++) {
      int32_t g = ids[s->src_off[e] + k];
      PSM_AT (b->src, b, k, i) = g < t->V ? g : UNK;
      PSM_AT (b->src_ext, b, k, i) = ext_id (t, b, g);
      PSM_AT (b->src_mask, b, k, i) = 1.0f;
    }
    for (int k = 0; k <= nt; k++) {
      int32_t g = k < nt ? ids[s->tgt_off[e] + k] : EOS;
      PSM_AT (b->dec_in, b, k, i) = k == 0 ? BOS : PSM_AT (b->tgt, b, k - 1, i);
      PSM_AT (b->tgt, b, k, i) = g < t->V ? g : UNK;
      PSM_AT (b->tgt_ext, b, k, i) = ext_id (t, b, g);
      PSM_AT (b->tgt_mask, b, k, i) = 1.0f;
      PSM_AT (b->tgt_switch, b, k, i) = 1.0f;
    }
  }
}

static gboolean
cn_train_batch (void *self, int B, PsmRng *rng, PsmBatch *out, GError **error)
{
  Cnndm *t = self;
  if (t->split[0].n == 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "cnndm: no training examples loaded (an eval-only run)");
    return FALSE;
  }
  int *idx = g_new (int, B);
  for (int i = 0; i < B; i++)
    idx[i] = (int) psm_rng_below (rng, (guint32) t->split[0].n);
  fill_batch (t, &t->split[0], idx, B, out);
  g_free (idx);
  return TRUE;
}

static int
cn_n_examples (void *self, PsmSplit split)
{
  return ((Cnndm *) self)->split[split].n;
}

static gboolean
cn_eval_batch_of (void *self, PsmSplit split, const int *idx, int B, PsmBatch *out, GError **error)
{
  Cnndm *t = self;
  const Split *s = &t->split[split];
  for (int i = 0; i < B; i++)
    if (idx[i] < 0 || idx[i] >= s->n) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "cnndm: example %d of a split of %d asked for",
                   idx[i], s->n);
      return FALSE;
    }
  fill_batch (t, s, idx, B, out);
  return TRUE;
}

static gboolean
cn_eval_batch (void *self, PsmSplit split, int start, int B, PsmBatch *out, GError **error)
{
  Cnndm *t = self;
  const Split *s = &t->split[split];
  B = MIN (B, s->n - start);
  int *idx = g_new (int, MAX (B, 1));
  for (int i = 0; i < B; i++)
    idx[i] = start + i;
  fill_batch (t, s, idx, B, out);
  g_free (idx);
  return TRUE;
}

static int
cn_source_length (void *self, PsmSplit split, int i)
{
  const Split *s = &((Cnndm *) self)->split[split];
  return s->tgt_off[i] - s->src_off[i];
}

static const char *
cn_token_text (void *self, const PsmBatch *b, int ex, int32_t id)
{
  Cnndm *t = self;
  if (id >= 0 && id < t->V)
    return psm_vocab_word (t->words, id);
  const char *w = psm_batch_oov_word (b, id);
  return w ? w : special[UNK];
}

static gboolean
cn_save (void *self, const char *dir, GError **error)
{
  Cnndm *t = self;
  char *path = g_build_filename (dir, "vocab.txt", NULL);
  gboolean ok = psm_vocab_save (t->words, t->V, path, error);
  g_free (path);
  return ok;
}

static gboolean
cn_text_batch (void *self, const char *const *texts, int n, PsmBatch *out, GError **error)
{
  Cnndm *t = self;
  int known = psm_vocab_size (t->words);   /* the words the text adds are taken out below */
  Split s = { 0 };
  s.n = n;
  s.src_off = g_new (int32_t, n + 1);
  s.tgt_off = g_new (int32_t, n + 1);
  s.ids = g_array_new (FALSE, FALSE, sizeof (int32_t));
  int *idx = g_new (int, MAX (n, 1));
  for (int i = 0; i < n; i++) {
    idx[i] = i;
    char *tok = psm_tokenize_ptb (texts[i]);
    s.src_off[i] = (int32_t) s.ids->len;
    tokens_to_ids (t, tok, t->max_src, TRUE, s.ids);
    g_free (tok);
    if ((int32_t) s.ids->len == s.src_off[i]) {
      int32_t pad = UNK;   /* an empty line decodes from a single <unk> */
      g_array_append_val (s.ids, pad);
    }
    s.tgt_off[i] = (int32_t) s.ids->len;
  }
  s.src_off[n] = s.tgt_off[n] = (int32_t) s.ids->len;
  fill_batch (t, &s, idx, n, out);   /* the batch keeps its out-of-vocabulary words as strings */
  psm_vocab_truncate (t->words, known);
  g_free (idx);
  g_free (s.src_off);
  g_free (s.tgt_off);
  g_array_unref (s.ids);
  return TRUE;
}

/* The whole article and reference of a validation or test example (the
 * highlights one sentence a line, as in the jsonl). */
static void
cn_example_text (void *self, PsmSplit split, int i, const char **source, const char **reference)
{
  Cnndm *t = self;
  const Texts *x = &t->text[split];
  gboolean have = split != PSM_SPLIT_TRAIN && x->article && i >= 0 && i < (int) x->article->len;
  *source = have ? x->article->pdata[i] : NULL;
  *reference = have ? x->summary->pdata[i] : NULL;
}

static const PsmTaskClass klass = {
  sizeof (PsmTaskClass), cn_create, cn_destroy, cn_info, cn_train_batch, cn_n_examples, cn_eval_batch,
  cn_token_text, cn_save, cn_text_batch, cn_example_text, NULL, NULL, cn_source_length, cn_eval_batch_of
};

PSM_PLUGIN (PSM_KIND_TASK, "cnndm",
            "CNN/DailyMail summarisation (jsonl or .source/.target): See et al.'s vocabulary, truncation and "
            "per-article OOV ids", params, NULL, &klass)
