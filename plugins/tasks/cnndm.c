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

#define N_SPECIAL 4
enum { PAD, UNK, BOS, EOS };
static const char *const special[N_SPECIAL + 1] = { "<pad>", "<unk>", "<s>", "</s>", NULL };

typedef struct {
  GPtrArray *article, *summary;   /* char * */
} Texts;

typedef struct {
  int V, max_src, max_tgt;
  PsmVocab *words;              /* global ids; [0, V) is the vocabulary (with
                                   train counts), then every other word seen */
  PsmExamples *split[3];        /* (valid and test with their whole texts, for the metrics) */
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

/* Adds text's first max words to the word table and to the open example
 * of x (source or target side); raw (a client's text): a word longer than
 * PSM_MAX_WORD_BYTES is <unk>. Returns how many. */
static int
add_tokens (Cnndm *t, PsmExamples *x, const char *text, int max, gboolean target, gboolean raw)
{
  char **tok = g_strsplit_set (text, " \t\n\r", -1);
  int n = 0;
  for (char **w = tok; *w && n < max; w++)
    if (**w) {
      int32_t id = raw && strlen (*w) > PSM_MAX_WORD_BYTES ? UNK : psm_vocab_add (t->words, *w);
      if (target)
        psm_examples_add_target (x, id, 1.0f, -1);
      else
        psm_examples_add_source (x, id, id, 0);
      n++;
    }
  g_strfreev (tok);
  return n;
}

/* The store of a split; with_text: the whole texts kept (for the metrics). */
static PsmExamples *
fill_split (Cnndm *t, const Texts *x, gboolean with_text)
{
  PsmExamples *s = psm_examples_new (PSM_EXAMPLES_SHARED_TABLE);
  for (guint i = 0; i < x->article->len; i++) {
    psm_examples_begin (s, with_text ? x->article->pdata[i] : NULL, with_text ? x->summary->pdata[i] : NULL);
    add_tokens (t, s, x->article->pdata[i], t->max_src, FALSE, FALSE);
    add_tokens (t, s, x->summary->pdata[i], t->max_tgt, TRUE, FALSE);
  }
  return s;
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
  for (int k = 0; k < 3; k++) {
    /* eval_only: no training examples; text_only: no split read */
    if (ok && x[k].article && !(k == 0 && eval_only))
      t->split[k] = fill_split (t, &x[k], k > 0);
    texts_free (&x[k]);
  }
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
    psm_examples_free (t->split[k]);
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

/* A batch of store x's examples idx[0..B) (idx NULL: its first B). */
static gboolean
fill (const Cnndm *t, const PsmExamples *x, const int *idx, int B, PsmBatch *out, GError **error)
{
  const PsmExampleWords w = { t->words, t->words, t->V, t->V, t->V, UNK, BOS, EOS };
  return psm_examples_fill (x, &w, idx, B, out, "cnndm", error);
}

static gboolean
cn_eval_batch_of (void *self, PsmSplit split, const int *idx, int B, PsmBatch *out, GError **error)
{
  Cnndm *t = self;
  return fill (t, t->split[split], idx, B, out, error);
}

static int
cn_n_examples (void *self, PsmSplit split)
{
  return psm_examples_n (((Cnndm *) self)->split[split]);
}

static int
cn_source_length (void *self, PsmSplit split, int i)
{
  return psm_examples_source_length (((Cnndm *) self)->split[split], i);
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
  PsmExamples *x = psm_examples_new (PSM_EXAMPLES_SHARED_TABLE);
  for (int i = 0; i < n; i++) {
    psm_examples_begin (x, NULL, NULL);
    char *tok = psm_tokenize_ptb (texts[i]);
    if (add_tokens (t, x, tok, t->max_src, FALSE, TRUE) == 0)
      psm_examples_add_source (x, UNK, UNK, 0);   /* an empty line decodes from a single <unk> */
    g_free (tok);
  }
  gboolean ok = fill (t, x, NULL, n, out, error);   /* the batch keeps its out-of-vocabulary words as strings */
  psm_vocab_truncate (t->words, known);
  psm_examples_free (x);
  return ok;
}

/* The whole article and reference of a validation or test example (the
 * highlights one sentence a line, as in the jsonl). */
static void
cn_example_text (void *self, PsmSplit split, int i, const char **source, const char **reference)
{
  const PsmExamples *x = ((Cnndm *) self)->split[split];
  *source = x ? psm_examples_source_text (x, i) : NULL;
  *reference = x ? psm_examples_reference_text (x, i) : NULL;
}

static const PsmTaskClass klass = {
  .size = sizeof (PsmTaskClass),
  .create = cn_create,
  .destroy = cn_destroy,
  .info = cn_info,
  .n_examples = cn_n_examples,
  .token_text = cn_token_text,
  .save = cn_save,
  .text_batch = cn_text_batch,
  .example_text = cn_example_text,
  .source_length = cn_source_length,
  .eval_batch_of = cn_eval_batch_of,
};

PSM_PLUGIN (PSM_KIND_TASK, "cnndm",
            "CNN/DailyMail summarisation (jsonl or .source/.target): See et al.'s vocabulary, truncation and "
            "per-article OOV ids", params, NULL, &klass)
