/* headline — headline generation for the pointer softmax (Gulcehre et al.
 * 2016, §5.2): an article's first sentence to its title, with pointer
 * targets for the words the vocabulary trims (UNK-pointers) or for
 * anonymised named entities (entity-pointers).
 *
 * Files: a split is an article file whose name holds "article" with its
 * line-aligned title file named the same with "title" in its place (Rush
 * et al.'s train.article.txt / train.title.txt, the gigaword-sample), or a
 * .jsonl file of CNN/DailyMail records ({"article", "highlights"}) read as
 * the first sentence of the article (up to and including its first . ! or
 * ?; the first `sentences` of them) to the first highlight. Every source
 * token carries its sentence number (PsmBatch.src_seg: the . ! or ? tokens
 * before it, at most sentences - 1) for the read-again encoders (Zeng et
 * al. §3.1.3). Text is tokenised already and split on white space. With style = gigaword every split is brought to the form of Rush
 * et al.'s Gigaword: digits as #, brackets as -lrb- -rrb- -lsb- -rsb- -lcb-
 * -rcb-, and a title's final "." dropped (the Gigaword data is in that
 * form already, so it is left as it is).
 *
 * Vocabularies (§5.2): a word seen fewer than min_count times in the
 * training sources (targets) is <unk> on the source (target) side; at most
 * src_vocab (tgt_vocab) words, the most frequent, 4 special ones included.
 * Saved in the run folder as src_vocab.txt and tgt_vocab.txt and read back
 * from there.
 *
 * pointers = unk: each target word outside the target vocabulary points at
 * the first source position holding the same word before the source was
 * unk-ed (even where that source word is itself <unk>); a word found
 * nowhere in the source is generated as <unk>. pointers = entity: the
 * tokens are word|TAG (TAG O, or no |TAG, for a word outside any entity);
 * per document, source then title, left to right, each entity word becomes
 * @entity<k>, k counting from 1 by first appearance and shared by every
 * repetition of the word (token level, so a multi-word entity can match in
 * part); a title placeholder that the source holds points at its first
 * position. pointers = none: no pointer targets (the plain NMT model). The
 * pointers per 100 examples of every split are printed at creation (the
 * paper: 2.7 train, 9.1 valid for UNK-pointers on Gigaword).
 *
 * Extended ids: a source word in the target vocabulary has its target id,
 * any other word a per-batch id (ext_base + i), so a pointed word reaches
 * the output as itself. lvt > 0 is the large-vocabulary trick (Jean et
 * al. 2015): every batch restricts the head's softmax to the special
 * words, the batch's source words in the target vocabulary (in training
 * its target words too) and the most frequent target words, lvt
 * candidates in all. Evaluation and decoding use the same candidates
 * without the reference's words (a title word outside them is <unk> for
 * the validation NLL); a model trained on candidates puts mass on the
 * words they rarely hold when scored over the whole vocabulary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>
#include "headline-text.h"

#define N_SPECIAL 4
enum { PAD, UNK, BOS, EOS };
static const char *const special[N_SPECIAL + 1] = { "<pad>", "<unk>", "<s>", "</s>", NULL };
enum { P_UNK, P_ENTITY, P_NONE };

typedef struct {
  PsmExamples *x;               /* global ids of the source / target tables, each source word's target-table id,
                                   pointer targets; the texts as the model sees them, before <unk> */
  long pointers;
} Split;

typedef struct {
  int Vs, Vt, max_src, max_tgt, min_count, lvt, mode, sentences;
  gboolean gigaword;
  PsmVocab *sv, *tv;            /* [0, Vs) / [0, Vt): the vocabularies, then every other word */
  Split split[3];
  guint8 *mark;                 /* [Vt] lvt scratch */
  int32_t *cand;
} Headline;

static const PsmParamSpec params[] = {
  { "train", PSM_PARAM_STRING, "../shared/data/cnndm/train.jsonl", PSM_NO_RANGE,
    "training split: an article file (titles beside it, \"article\" -> \"title\") or CNN/DM .jsonl (lead)", NULL },
  { "valid", PSM_PARAM_STRING, "../shared/data/cnndm/valid.jsonl", PSM_NO_RANGE, "validation split", NULL },
  { "test", PSM_PARAM_STRING, "../shared/data/gigaword-sample/sample.article.txt", PSM_NO_RANGE, "test split",
    NULL },
  { "style", PSM_PARAM_CHOICE, "gigaword", PSM_NO_RANGE,
    "gigaword: digits as #, brackets as -lrb- ..., no final . in titles (Rush et al.'s form); none: as read",
    "gigaword|none" },
  { "pointers", PSM_PARAM_CHOICE, "unk", PSM_NO_RANGE,
    "pointer targets: unk (UNK-pointers), entity (word|TAG input anonymised), none", "unk|entity|none" },
  { "min_count", PSM_PARAM_INT, "5", 1, 1000000, "words seen fewer times in training (per side) are <unk> (paper: 5)",
    NULL },
  { "src_vocab", PSM_PARAM_INT, "125000", 5, 10000000, "most source words kept, 4 special included (paper: 125k)",
    NULL },
  { "tgt_vocab", PSM_PARAM_INT, "75000", 5, 10000000, "most target words kept, 4 special included (paper: 75k)",
    NULL },
  { "lvt", PSM_PARAM_INT, "0", 0, 10000000,
    "large-vocabulary trick: training softmax over this many candidates (paper: 2000; 0: off)", NULL },
  { "max_src", PSM_PARAM_INT, "100", 1, 100000, "source tokens kept", NULL },
  { "max_tgt", PSM_PARAM_INT, "30", 1, 100000, "title tokens kept before </s>", NULL },
  { "max_train", PSM_PARAM_INT, "0", 0, 2000000000, "use the first N training pairs (0 = all)", NULL },
  { "sentences", PSM_PARAM_INT, "1", 1, PSM_MAX_SENTENCES,
    "article sentences a CNN/DM source holds (Zeng et al. §3.1.3); each source token gets its sentence number", NULL },
  PSM_PARAM_END
};

/* ---- reading ---- */

typedef struct {
  GPtrArray *src, *tgt;   /* GPtrArray of token strings, a pair each */
} Pairs;

static void
pairs_free (Pairs *p)
{
  if (p->src)
    g_ptr_array_unref (p->src);
  if (p->tgt)
    g_ptr_array_unref (p->tgt);
}

/* The title file of an article file: the last "article" of its name as
 * "title"; NULL if the name has none. */
static char *
title_path (const char *path)
{
  const char *base = strrchr (path, '/');
  base = base ? base + 1 : path;
  const char *hit = NULL;
  for (const char *p = strstr (base, "article"); p; p = strstr (p + 1, "article"))
    hit = p;
  if (!hit)
    return NULL;
  return g_strdup_printf ("%.*stitle%s", (int) (hit - path), path, hit + strlen ("article"));
}

static gboolean
read_pairs (Headline *t, const char *path, long max, Pairs *out, GError **error)
{
  static const char *const keys[2] = { "article", "highlights" };
  gboolean jsonl = g_str_has_suffix (path, ".jsonl");
  char *tpath = jsonl ? NULL : title_path (path);
  if (!jsonl && !tpath) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "%s: cannot tell where its titles are: a headline split is a .jsonl file of CNN/DailyMail records, "
                 "or an article file whose name holds \"article\", its titles in the file named with \"title\" "
                 "instead", path);
    return FALSE;
  }
  GPtrArray *a = NULL, *b = NULL;
  gboolean ok = psm_read_text_pairs (path, tpath, keys, max, FALSE, "headline", &a, &b, error);
  out->src = g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref);
  out->tgt = g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref);
  for (guint i = 0; ok && i < a->len; i++) {
    char *src = jsonl ? headline_lead (a->pdata[i], t->sentences) : g_strdup (a->pdata[i]);
    char *nl = jsonl ? strchr (b->pdata[i], '\n') : NULL;
    char *tgt = nl ? g_strndup (b->pdata[i], nl - (char *) b->pdata[i]) : g_strdup (b->pdata[i]);
    GPtrArray *ws = headline_tokens (src, t->gigaword, t->mode == P_ENTITY, FALSE),
              *wt = headline_tokens (tgt, t->gigaword, t->mode == P_ENTITY, TRUE);
    if (t->mode == P_ENTITY)
      headline_anonymise (ws, wt);
    g_ptr_array_add (out->src, ws);
    g_ptr_array_add (out->tgt, wt);
    g_free (src);
    g_free (tgt);
  }
  if (a)
    g_ptr_array_unref (a);
  if (b)
    g_ptr_array_unref (b);
  g_free (tpath);
  return ok;
}

/* ---- vocabularies and pointer targets ---- */

/* The words of one side, most frequent first: those seen min_count times
 * or more, at most V with the special ones; returns how many. */
static int
build_vocab (PsmVocab *v, GPtrArray *sents, int V, int min_count)
{
  PsmWordCounts *c = psm_word_counts_new ();
  for (guint i = 0; i < sents->len; i++) {
    GPtrArray *w = sents->pdata[i];
    for (guint j = 0; j < w->len; j++)
      psm_word_counts_add (c, w->pdata[j], 1);
  }
  for (int i = 0; i < N_SPECIAL; i++)
    psm_vocab_add (v, special[i]);
  psm_vocab_add_by_count (v, c, 0);   /* every word, by count: [0, n) the vocabulary */
  psm_word_counts_free (c);
  int n = N_SPECIAL;
  while (n < psm_vocab_size (v) && n < V && psm_vocab_count (v, n) >= min_count)
    n++;
  return n;
}

static gboolean
load_vocab (PsmVocab *v, const char *dir, const char *name, int cap, const char *key, int *V, GError **error)
{
  char *path = g_build_filename (dir, name, NULL);
  gboolean ok = psm_vocab_load (v, path, special, error);
  *V = psm_vocab_size (v);
  if (ok && *V > cap) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "%s: holds %d words, more than task.%s %d (the run was made with other settings)", path, *V, key,
                 cap);
    ok = FALSE;
  }
  g_free (path);
  return ok;
}

static void
fill_split (Headline *t, Split *s, Pairs *p)
{
  s->x = psm_examples_new (PSM_EXAMPLES_MAPPED);
  for (guint e = 0; e < p->src->len; e++) {
    GPtrArray *ws = p->src->pdata[e], *wt = p->tgt->pdata[e];
    char *st = headline_join (ws), *tt = headline_join (wt);
    psm_examples_begin (s->x, st, tt);
    g_free (st);
    g_free (tt);
    int ns = MIN ((int) ws->len, t->max_src), nt = MIN ((int) wt->len, t->max_tgt);
    for (int i = 0, seg = 0; i < ns; i++) {
      /* the sentence: the . ! or ? tokens before this one */
      psm_examples_add_source (s->x, psm_vocab_add (t->sv, ws->pdata[i]), psm_vocab_id (t->tv, ws->pdata[i]),
                               MIN (seg, t->sentences - 1));
      seg += headline_ends_sentence (ws->pdata[i]);
    }
    for (int i = 0; i < nt; i++) {
      const char *y = wt->pdata[i];
      int32_t id = psm_vocab_add (t->tv, y), loc = -1;
      gboolean want = t->mode == P_UNK ? id >= t->Vt : t->mode == P_ENTITY && g_str_has_prefix (y, "@entity");
      for (int j = 0; want && j < ns && loc < 0; j++)
        if (strcmp (ws->pdata[j], y) == 0)
          loc = j;
      s->pointers += loc >= 0;
      psm_examples_add_target (s->x, id, loc >= 0 ? 0.0f : 1.0f, loc);
    }
  }
}

static void hl_destroy (void *self);

static double
pointer_rate (const Split *s)
{
  return 100.0 * s->pointers / MAX (psm_examples_n (s->x), 1);
}

static void *
hl_create (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error)
{
  Headline *t = g_new0 (Headline, 1);
  t->max_src = (int) psm_section_int (cfg, "max_src");
  t->max_tgt = (int) psm_section_int (cfg, "max_tgt");
  t->min_count = (int) psm_section_int (cfg, "min_count");
  t->lvt = (int) psm_section_int (cfg, "lvt");
  t->sentences = (int) psm_section_int (cfg, "sentences");
  t->gigaword = strcmp (psm_section_string (cfg, "style"), "gigaword") == 0;
  const char *mode = psm_section_string (cfg, "pointers");
  t->mode = strcmp (mode, "unk") == 0 ? P_UNK : strcmp (mode, "entity") == 0 ? P_ENTITY : P_NONE;
  int Vs = (int) psm_section_int (cfg, "src_vocab"), Vt = (int) psm_section_int (cfg, "tgt_vocab");
  long max_train = (long) psm_section_int (cfg, "max_train");
  if (ctx->check) {
    t->max_src = MIN (t->max_src, 32);
    t->max_tgt = MIN (t->max_tgt, 12);
    max_train = max_train ? MIN (max_train, 64) : 64;
  }
  t->sv = psm_vocab_new ();
  t->tv = psm_vocab_new ();
  const char *names[3] = { "train", "valid", "test" };
  Pairs p[3] = { { 0 } };
  gboolean ok = TRUE;
  /* evaluating or decoding a trained run: its vocabularies are in the run
   * folder and the training split is not read at all; decoding raw text
   * reads no split */
  gboolean eval_only = PSM_STRUCT_FIELD (ctx, eval_only, FALSE);
  gboolean text_only = PSM_STRUCT_FIELD (ctx, text_only, FALSE);
  char *saved_path = ctx->run_dir ? g_build_filename (ctx->run_dir, "tgt_vocab.txt", NULL) : NULL;
  gboolean saved = saved_path && g_file_test (saved_path, G_FILE_TEST_EXISTS);
  if (eval_only && saved_path && !saved)
    fprintf (stderr, "headline: note: %s is missing: the vocabularies are built again from %s, which must be the "
             "data the run was trained on\n", saved_path, psm_section_string (cfg, "train"));
  g_free (saved_path);
  int first = eval_only && saved ? 1 : 0, end = text_only && saved ? 0 : 3;
  for (int k = first; k < end && ok; k++) {
    ok = read_pairs (t, psm_section_string (cfg, names[k]), k == 0 ? max_train : ctx->check ? 8 : 0, &p[k], error);
    if (!ok && error && *error)
      g_prefix_error (error, "task.%s: ", names[k]);
  }
  if (ok && saved) {
    ok = load_vocab (t->sv, ctx->run_dir, "src_vocab.txt", Vs, "src_vocab", &t->Vs, error) &&
         load_vocab (t->tv, ctx->run_dir, "tgt_vocab.txt", Vt, "tgt_vocab", &t->Vt, error);
  } else if (ok) {
    t->Vs = build_vocab (t->sv, p[0].src, Vs, t->min_count);
    t->Vt = build_vocab (t->tv, p[0].tgt, Vt, t->min_count);
    if (t->Vt <= N_SPECIAL) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: no title word of the training split is seen %d times or more", psm_section_where (cfg,
                   "min_count"), t->min_count);
      ok = FALSE;
    }
  }
  if (ok && ctx->check && t->lvt > 0)
    t->lvt = MIN (t->lvt, MAX (t->Vt / 2, N_SPECIAL + 1));   /* tiny vocabularies: still exercise it */
  for (int k = 0; k < 3 && ok; k++)
    if (p[k].src)   /* (eval_only: no training examples; text_only: none at all) */
      fill_split (t, &t->split[k], &p[k]);
  for (int k = 0; k < 3; k++)
    pairs_free (&p[k]);
  if (ok && text_only && saved) {
    fprintf (stderr, "headline: vocabularies %d source, %d target words (from %s)\n", t->Vs, t->Vt, ctx->run_dir);
  } else if (ok) {
    fprintf (stderr, "headline: vocabularies %d source, %d target words (seen >= %d times); %s-pointers per 100 "
             "examples: train %.1f, valid %.1f, test %.1f\n", t->Vs, t->Vt, t->min_count, mode,
             pointer_rate (&t->split[0]), pointer_rate (&t->split[1]), pointer_rate (&t->split[2]));
  }
  if (ok) {
    t->mark = g_new0 (guint8, t->Vt);
    t->cand = g_new (int32_t, t->Vt);
  }
  if (!ok) {
    hl_destroy (t);
    return NULL;
  }
  return t;
}

static void
hl_destroy (void *self)
{
  Headline *t = self;
  for (int k = 0; k < 3; k++)
    psm_examples_free (t->split[k].x);
  psm_vocab_free (t->sv);
  psm_vocab_free (t->tv);
  g_free (t->mark);
  g_free (t->cand);
  g_free (t);
}

static void
hl_info (void *self, PsmTaskInfo *info)
{
  Headline *t = self;
  info->src_vocab = t->Vs;
  info->tgt_vocab = t->Vt;
  info->ext_base = MAX (t->Vs, t->Vt);
  info->max_src_len = t->max_src;
  info->max_tgt_len = t->max_tgt + 1;
  info->bos_id = BOS;
  info->eos_id = EOS;
  info->unk_id = UNK;
}

/* The large-vocabulary candidates of a batch: special words, the batch's
 * source words in the target vocabulary, in training its target words too,
 * then the most frequent (lowest ids) up to lvt. Outside training a target
 * word that is not a candidate is <unk> for the head (its tgt_ext stays
 * the word): the candidates must not depend on the reference. */
static void
candidates (Headline *t, PsmBatch *b, gboolean train)
{
  if (t->lvt <= 0 || t->lvt >= t->Vt)
    return;
  int n = 0;
  memset (t->mark, 0, (size_t) t->Vt);
  for (int i = 0; i < N_SPECIAL; i++)
    t->mark[i] = 1;
  for (size_t k = 0; k < (size_t) b->T * b->B; k++)
    if (b->src_mask[k] != 0.0f && b->src_ext[k] < t->Vt)
      t->mark[b->src_ext[k]] = 1;
  for (size_t k = 0; train && k < (size_t) b->Ty * b->B; k++)
    if (b->tgt_mask[k] != 0.0f)
      t->mark[b->tgt[k]] = 1;
  for (int v = 0; v < t->Vt; v++)
    n += t->mark[v];
  for (int v = N_SPECIAL; v < t->Vt && n < t->lvt; v++)
    if (!t->mark[v]) {
      t->mark[v] = 1;
      n++;
    }
  for (size_t k = 0; !train && k < (size_t) b->Ty * b->B; k++)
    if (b->tgt_mask[k] != 0.0f && !t->mark[b->tgt[k]])
      b->tgt[k] = UNK;
  n = 0;
  for (int v = 0; v < t->Vt; v++)
    if (t->mark[v])
      t->cand[n++] = v;
  psm_batch_set_candidates (b, t->cand, n);
}

/* Training batches come through here too (psm_task_train_batch), with
 * the candidates of training. */
/* A batch of store x's examples idx[0..B) (idx NULL: its first B), with
 * its candidates (train: those of training). */
static gboolean
fill (Headline *t, const PsmExamples *x, const int *idx, int B, gboolean train, PsmBatch *out, GError **error)
{
  const PsmExampleWords w = { t->sv, t->tv, t->Vs, t->Vt, MAX (t->Vs, t->Vt), UNK, BOS, EOS };
  if (!psm_examples_fill (x, &w, idx, B, out, "headline", error))
    return FALSE;
  candidates (t, out, train);
  return TRUE;
}

static gboolean
hl_eval_batch_of (void *self, PsmSplit split, const int *idx, int B, PsmBatch *out, GError **error)
{
  Headline *t = self;
  return fill (t, t->split[split].x, idx, B, split == PSM_SPLIT_TRAIN, out, error);
}

static int hl_n_examples (void *self, PsmSplit split) { return psm_examples_n (((Headline *) self)->split[split].x); }

/* -1 with lvt: a batch's candidates are its examples' words, so decoding
 * keeps the split's batches (the core's decode.sort). */
static int
hl_source_length (void *self, PsmSplit split, int i)
{
  Headline *t = self;
  if (t->lvt > 0 && t->lvt < t->Vt)
    return -1;
  return psm_examples_source_length (t->split[split].x, i);
}

static const char *
hl_token_text (void *self, const PsmBatch *b, int ex, int32_t id)
{
  Headline *t = self;
  if (id >= 0 && id < t->Vt)
    return psm_vocab_word (t->tv, id);
  const char *w = psm_batch_oov_word (b, id);
  return w ? w : special[UNK];
}

static gboolean
hl_save (void *self, const char *dir, GError **error)
{
  Headline *t = self;
  char *sp = g_build_filename (dir, "src_vocab.txt", NULL), *tp = g_build_filename (dir, "tgt_vocab.txt", NULL);
  gboolean ok = psm_vocab_save (t->sv, t->Vs, sp, error) && psm_vocab_save (t->tv, t->Vt, tp, error);
  g_free (sp);
  g_free (tp);
  return ok;
}

/* Raw text to decode: PTB-like tokens, lower-cased, then styled as the
 * training data (entity tags are not looked for). */
static gboolean
hl_text_batch (void *self, const char *const *texts, int n, PsmBatch *out, GError **error)
{
  Headline *t = self;
  int known_s = psm_vocab_size (t->sv), known_t = psm_vocab_size (t->tv);   /* the text's new words: out below */
  Pairs p = { g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref),
              g_ptr_array_new_with_free_func ((GDestroyNotify) g_ptr_array_unref) };
  int mode = t->mode;
  t->mode = P_NONE;
  for (int i = 0; i < n; i++) {
    char *tok = psm_tokenize_ptb (texts[i]);
    GPtrArray *ws = headline_tokens (tok, t->gigaword, FALSE, FALSE);
    for (guint k = 0; k < ws->len; k++)
      if (strlen (ws->pdata[k]) > PSM_MAX_WORD_BYTES) {
        g_free (ws->pdata[k]);
        ws->pdata[k] = g_strdup (special[UNK]);
      }
    if (ws->len == 0)
      g_ptr_array_add (ws, g_strdup (special[UNK]));   /* an empty line decodes from one <unk> */
    g_ptr_array_add (p.src, ws);
    g_ptr_array_add (p.tgt, g_ptr_array_new_with_free_func (g_free));
    g_free (tok);
  }
  Split s = { 0 };
  fill_split (t, &s, &p);
  t->mode = mode;
  gboolean ok = fill (t, s.x, NULL, n, FALSE, out, error);
  psm_vocab_truncate (t->sv, known_s);   /* the batch keeps its out-of-vocabulary words as strings */
  psm_vocab_truncate (t->tv, known_t);
  psm_examples_free (s.x);
  pairs_free (&p);
  return ok;
}

static void
hl_example_text (void *self, PsmSplit split, int i, const char **source, const char **reference)
{
  const PsmExamples *x = ((Headline *) self)->split[split].x;
  *source = psm_examples_source_text (x, i);
  *reference = psm_examples_reference_text (x, i);
}

static const PsmTaskClass klass = {
  .size = sizeof (PsmTaskClass),
  .create = hl_create,
  .destroy = hl_destroy,
  .info = hl_info,
  .n_examples = hl_n_examples,
  .token_text = hl_token_text,
  .save = hl_save,
  .text_batch = hl_text_batch,
  .example_text = hl_example_text,
  .source_length = hl_source_length,
  .eval_batch_of = hl_eval_batch_of,
};

PSM_PLUGIN (PSM_KIND_TASK, "headline",
            "headline generation (Gulcehre et al. §5.2): article/title files or CNN/DM leads, UNK- or "
            "entity-pointers, the large-vocabulary trick", params, NULL, &klass)
