/* nmt — machine translation data for the pointer softmax (Gulcehre et al.
 * 2016, §5.3): line-aligned source and target files, a shortlist per
 * language, and pointer targets by the dictionary-pointer heuristic.
 *
 * Files: a split is a prefix P, read from P.<source_lang> and
 * P.<target_lang> (Multi30k's train.lc.norm.tok.en/.fr, Europarl's
 * europarl-v7.fr-en.en/.fr). With tokenize = none the lines are tokenised
 * already and split on white space; with simple they are lower-cased and
 * every punctuation character is set apart, an apostrophe staying on the
 * word it ends (French l' and d'). A pair with an empty side is skipped and
 * counted; training pairs with a side longer than max_len are dropped and
 * counted; evaluation sources and targets are cut at max_len for the model,
 * while the metrics (bleu) read the whole lines.
 *
 * Shortlists: the src_vocab (tgt_vocab) - 4 most frequent words of the
 * training side, after <pad> <unk> <s> </s>; saved in the run folder as
 * src_vocab.txt and tgt_vocab.txt and read back from there. Source words
 * outside the source shortlist are <unk> for the encoder.
 *
 * Pointer targets (tgt_switch, tgt_loc) for a target word outside the
 * target shortlist, in the paper's order:
 *   copy     the word itself in the source: its first position;
 *   shared   else the shared-words lookup: a source word spelled the same up
 *            to case and diacritics (our reading of the paper's "shared
 *            words lookup table for the source and the target language");
 *   lexicon  else one of its translations in the bilingual lexicon (a TSV of
 *            target word <TAB> source word, several lines a headword; only
 *            one-word translations can match): the earliest in the source;
 *   argmax   else the argmax of the location softmax at that step
 *            (tgt_loc = PSM_LOC_ARGMAX, resolved by the head while training);
 *            with argmax_rule = false such a word is the shortlist's <unk>.
 * Words in the shortlist are generated (switch 1). The counts of each rule
 * over the training targets are printed when the task is created.
 *
 * Extended ids: every source token has a per-batch id (ext_base + i), so a
 * pointed source word reaches the output as itself or, with translate =
 * true, as its first translation in the decoding lexicon (source word <TAB>
 * target word). Target words outside the shortlist get per-batch ids too
 * (tgt_ext, the true word). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <psm/psm.h>

#define N_SPECIAL 4
enum { PAD, UNK, BOS, EOS };
static const char *const special[N_SPECIAL + 1] = { "<pad>", "<unk>", "<s>", "</s>", NULL };
enum { R_SHORTLIST, R_COPY, R_SHARED, R_LEXICON, R_ARGMAX, R_UNK, N_RULES };
static const char *const rule_name[N_RULES] = { "shortlist", "copy", "shared", "lexicon", "argmax", "unk" };


typedef struct {
  int Vs, Vt, max_len;
  gboolean simple, argmax_rule, translate;
  PsmVocab *sv, *tv;            /* [0, Vs) / [0, Vt): the shortlists, then every other word */
  GHashTable *lex;              /* target word -> GPtrArray of source words */
  GHashTable *dec_lex;          /* source word -> its first target translation */
  GHashTable *shared;           /* normalised spelling -> source word */
  long rules[N_RULES];
  PsmExamples *split[3];        /* global ids of the source / target tables, pointer targets; whole lines as
                                   tokenised */
} Nmt;

static const PsmParamSpec params[] = {
  { "train", PSM_PARAM_STRING, "../shared/data/multi30k-en-fr/train.lc.norm.tok", PSM_NO_RANGE,
    "training split: files PREFIX.<source_lang> and PREFIX.<target_lang>", NULL },
  { "valid", PSM_PARAM_STRING, "../shared/data/multi30k-en-fr/val.lc.norm.tok", PSM_NO_RANGE,
    "validation split prefix", NULL },
  { "test", PSM_PARAM_STRING, "../shared/data/multi30k-en-fr/test_2016_flickr.lc.norm.tok", PSM_NO_RANGE,
    "test split prefix", NULL },
  { "source_lang", PSM_PARAM_STRING, "en", PSM_NO_RANGE, "file suffix of the source side", NULL },
  { "target_lang", PSM_PARAM_STRING, "fr", PSM_NO_RANGE, "file suffix of the target side", NULL },
  { "tokenize", PSM_PARAM_CHOICE, "none", PSM_NO_RANGE,
    "none: tokenised text, split on white space; simple: lower-case and set punctuation apart", "none|simple" },
  { "src_vocab", PSM_PARAM_INT, "30000", 5, 10000000, "source shortlist, 4 special words included", NULL },
  { "tgt_vocab", PSM_PARAM_INT, "30000", 5, 10000000, "target shortlist, 4 special words included", NULL },
  { "max_len", PSM_PARAM_INT, "50", 1, 100000, "longest sentence in words (longer training pairs dropped)",
    NULL },
  { "lexicon", PSM_PARAM_FILE, "../shared/data/lexicon-en-fr/freedict-fra-eng.tsv", PSM_NO_RANGE,
    "target word <TAB> source word lines, for the pointer heuristic", NULL },
  { "argmax_rule", PSM_PARAM_BOOL, "true", PSM_NO_RANGE,
    "point at the location softmax's argmax when no rule finds the word (else it is <unk>)", NULL },
  { "translate", PSM_PARAM_BOOL, "false", PSM_NO_RANGE,
    "output a pointed source word as its translation in decode_lexicon when it has one", NULL },
  { "decode_lexicon", PSM_PARAM_FILE, "../shared/data/lexicon-en-fr/freedict-eng-fra.tsv", PSM_NO_RANGE,
    "source word <TAB> target word lines, for translate", NULL },
  { "max_train", PSM_PARAM_INT, "0", 0, 2000000000, "use the first N training pairs (0 = all)", NULL },
  PSM_PARAM_END
};

/* ---- text ---- */

/* The tokens of a line: white-space split, or the simple tokeniser. */
static char **
tokenize (const Nmt *t, const char *line)
{
  if (!t->simple)
    return g_strsplit_set (line, " \t\r\n\f\v", -1);
  /* Invalid UTF-8 (a truncated character, a byte file) is made valid first
   * (U+FFFD): strdown and the loop below step by lead bytes, and a lead
   * byte before the end would step past it. */
  char *valid = g_utf8_validate (line, -1, NULL) ? NULL : g_utf8_make_valid (line, -1);
  char *low = g_utf8_strdown (valid ? valid : line, -1);
  g_free (valid);
  GString *s = g_string_new (NULL);
  for (const char *p = low; *p; p = g_utf8_next_char (p)) {
    gunichar c = g_utf8_get_char (p);
    if (c == '\'' || c == 0x2019) {
      g_string_append (s, "' ");   /* l'homme -> l' homme */
    } else if (g_unichar_ispunct (c) && c != '-') {
      g_string_append_c (s, ' ');
      g_string_append_unichar (s, c);
      g_string_append_c (s, ' ');
    } else {
      g_string_append_unichar (s, g_unichar_isspace (c) ? ' ' : c);
    }
  }
  g_free (low);
  char **tok = g_strsplit (s->str, " ", -1);
  g_string_free (s, TRUE);
  return tok;
}

/* Case and diacritics removed: the key of the shared-words lookup. */
static char *
shared_key (const char *w)
{
  char *nfd = g_utf8_normalize (w, -1, G_NORMALIZE_NFD);
  if (!nfd)
    return g_strdup (w);
  GString *s = g_string_new (NULL);
  for (const char *p = nfd; *p; p = g_utf8_next_char (p)) {
    gunichar c = g_utf8_get_char (p);
    if (g_unichar_type (c) != G_UNICODE_NON_SPACING_MARK)
      g_string_append_unichar (s, g_unichar_tolower (c));
  }
  g_free (nfd);
  return g_string_free (s, FALSE);
}

/* The non-empty tokens as a GPtrArray of their strings (owned by tok). */
static GPtrArray *
words_of (char **tok)
{
  GPtrArray *w = g_ptr_array_new ();
  for (char **p = tok; *p; p++)
    if (**p)
      g_ptr_array_add (w, *p);
  return w;
}

/* ---- reading ---- */

typedef struct {
  GPtrArray *src, *tgt;   /* char ** token vectors */
} Pairs;

static void
pairs_free (Pairs *p)
{
  if (p->src)
    g_ptr_array_unref (p->src);
  if (p->tgt)
    g_ptr_array_unref (p->tgt);
}

/* The pairs of prefix P (train: long pairs dropped); counts on stderr. */
static gboolean
read_pairs (Nmt *t, const char *prefix, const char *sl, const char *tl, gboolean train, long max, Pairs *out,
            GError **error)
{
  char *sp = g_strdup_printf ("%s.%s", prefix, sl), *tp = g_strdup_printf ("%s.%s", prefix, tl);
  char **sx = psm_read_lines (sp, "source sentences", error), **tx = NULL;
  gboolean ok = sx && (tx = psm_read_lines (tp, "target sentences", error));
  guint ns = ok ? g_strv_length (sx) : 0, nt = ok ? g_strv_length (tx) : 0;
  if (ok && ns != nt) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "nmt: %s has %u lines but %s has %u: not line-aligned",
                 sp, ns, tp, nt);
    ok = FALSE;
  }
  out->src = g_ptr_array_new_with_free_func ((GDestroyNotify) g_strfreev);
  out->tgt = g_ptr_array_new_with_free_func ((GDestroyNotify) g_strfreev);
  long empty = 0, longer = 0, first_empty = 0;
  for (guint i = 0; ok && i < ns && (max == 0 || (long) out->src->len < max); i++) {
    char **a = tokenize (t, sx[i]), **b = tokenize (t, tx[i]);
    GPtrArray *wa = words_of (a), *wb = words_of (b);
    gboolean bad = wa->len == 0 || wb->len == 0, lng = train && ((int) wa->len > t->max_len || (int) wb->len > t->max_len);
    if (bad && !empty++)
      first_empty = (long) i + 1;
    longer += !bad && lng;
    if (bad || lng) {
      g_strfreev (a);
      g_strfreev (b);
    } else {
      g_ptr_array_add (out->src, a);
      g_ptr_array_add (out->tgt, b);
    }
    g_ptr_array_unref (wa);
    g_ptr_array_unref (wb);
  }
  if (ok && empty)
    fprintf (stderr, "nmt: %s: skipped %ld pair%s with an empty side (first: line %ld)\n", prefix, empty,
             empty == 1 ? "" : "s", first_empty);
  if (ok && longer)
    fprintf (stderr, "nmt: %s: dropped %ld training pair%s longer than max_len %d\n", prefix, longer,
             longer == 1 ? "" : "s", t->max_len);
  if (ok && out->src->len == 0) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED, "nmt: %s: no usable sentence pair", prefix);
    ok = FALSE;
  }
  g_strfreev (sx);
  g_strfreev (tx);
  g_free (sp);
  g_free (tp);
  return ok;
}

/* A TSV lexicon, headword -> GPtrArray of one-word translations (first:
 * keep only the first). Errors name file and line. */
static GHashTable *
read_lexicon (const char *path, gboolean first_only, GError **error)
{
  char **lines = psm_read_lines (path, "lexicon", error);
  if (!lines)
    return NULL;
  GHashTable *h = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, (GDestroyNotify) g_ptr_array_unref);
  for (int i = 0; lines[i]; i++) {
    if (!*lines[i])
      continue;
    char *tab = strchr (lines[i], '\t');
    if (!tab || tab == lines[i] || !tab[1]) {
      g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                   "%s:%d: not a lexicon line (expected word <TAB> translation)", path, i + 1);
      g_hash_table_destroy (h);
      g_strfreev (lines);
      return NULL;
    }
    *tab = '\0';
    const char *tr = tab + 1;
    if (strpbrk (tr, " \t") || strpbrk (lines[i], " "))
      continue;   /* several words: never one source token */
    GPtrArray *senses = g_hash_table_lookup (h, lines[i]);
    if (!senses) {
      senses = g_ptr_array_new_with_free_func (g_free);
      g_hash_table_insert (h, g_strdup (lines[i]), senses);
    }
    if (!first_only || senses->len == 0)
      g_ptr_array_add (senses, g_strdup (tr));
  }
  g_strfreev (lines);
  return h;
}

/* ---- vocabularies and pointer targets ---- */

static void
build_vocab (PsmVocab *v, GPtrArray *sents, int V)
{
  PsmWordCounts *c = psm_word_counts_new ();
  for (guint i = 0; i < sents->len; i++)
    for (char **w = sents->pdata[i]; *w; w++)
      if (**w)
        psm_word_counts_add (c, *w, 1);
  for (int i = 0; i < N_SPECIAL; i++)
    psm_vocab_add (v, special[i]);
  psm_vocab_add_by_count (v, c, V);
  psm_word_counts_free (c);
}

static gboolean
load_vocab (PsmVocab *v, const char *dir, const char *name, int V, const char *key, GError **error)
{
  char *path = g_build_filename (dir, name, NULL);
  gboolean ok = psm_vocab_load (v, path, special, error);
  if (ok && psm_vocab_size (v) != V) {
    g_set_error (error, PSM_RUN_ERROR, PSM_RUN_ERROR_FAILED,
                 "%s: holds %d words, but task.%s is %d (the run was made with another size)", path,
                 psm_vocab_size (v), key, V);
    ok = FALSE;
  }
  g_free (path);
  return ok;
}

/* The pointer target of target word y against source words src[0..n):
 * the rule that resolved it and the position (or -1). */
static int
point (const Nmt *t, const char *y, char *const *src, int n, int32_t *loc)
{
  *loc = -1;
  int32_t id = psm_vocab_id (t->tv, y);
  if (id >= 0 && id < t->Vt)
    return R_SHORTLIST;
  for (int i = 0; i < n; i++)
    if (strcmp (src[i], y) == 0) {
      *loc = i;
      return R_COPY;
    }
  char *k = shared_key (y);
  const char *s = g_hash_table_lookup (t->shared, k);
  g_free (k);
  for (int i = 0; s && i < n; i++)
    if (strcmp (src[i], s) == 0) {
      *loc = i;
      return R_SHARED;
    }
  GPtrArray *senses = t->lex ? g_hash_table_lookup (t->lex, y) : NULL;
  for (int i = 0; senses && i < n; i++)
    for (guint j = 0; j < senses->len; j++)
      if (strcmp (src[i], senses->pdata[j]) == 0) {
        *loc = i;
        return R_LEXICON;
      }
  if (t->argmax_rule) {
    *loc = PSM_LOC_ARGMAX;
    return R_ARGMAX;
  }
  return R_UNK;
}

/* The store of pairs (cut at max_len): ids and pointer targets, their
 * lines kept whole for the metrics; train: the pointer rules counted. */
static PsmExamples *
fill_split (Nmt *t, Pairs *p, gboolean train)
{
  PsmExamples *x = psm_examples_new (PSM_EXAMPLES_OWN_IDS);
  for (guint e = 0; e < p->src->len; e++) {
    GPtrArray *ws = words_of (p->src->pdata[e]), *wt = words_of (p->tgt->pdata[e]);
    g_ptr_array_add (ws, NULL);
    g_ptr_array_add (wt, NULL);
    char *st = g_strjoinv (" ", (char **) ws->pdata), *tt = g_strjoinv (" ", (char **) wt->pdata);
    psm_examples_begin (x, st, tt);
    g_free (st);
    g_free (tt);
    int ns = MIN ((int) ws->len - 1, t->max_len), nt = MIN ((int) wt->len - 1, t->max_len);
    for (int i = 0; i < ns; i++)
      psm_examples_add_source (x, psm_vocab_add (t->sv, ws->pdata[i]), -1, 0);
    for (int i = 0; i < nt; i++) {
      int32_t id = psm_vocab_add (t->tv, wt->pdata[i]), loc;
      int r = point (t, wt->pdata[i], (char *const *) ws->pdata, ns, &loc);
      psm_examples_add_target (x, id, r == R_SHORTLIST || r == R_UNK ? 1.0f : 0.0f, loc);
      if (train)
        t->rules[r]++;
    }
    g_ptr_array_unref (ws);
    g_ptr_array_unref (wt);
  }
  return x;
}

static void nmt_destroy (void *self);

static void *
nmt_create (const PsmSection *cfg, const PsmTaskCtx *ctx, GError **error)
{
  Nmt *t = g_new0 (Nmt, 1);
  t->Vs = (int) psm_section_int (cfg, "src_vocab");
  t->Vt = (int) psm_section_int (cfg, "tgt_vocab");
  t->max_len = (int) psm_section_int (cfg, "max_len");
  t->simple = strcmp (psm_section_string (cfg, "tokenize"), "simple") == 0;
  t->argmax_rule = psm_section_bool (cfg, "argmax_rule");
  t->translate = psm_section_bool (cfg, "translate");
  t->sv = psm_vocab_new ();
  t->tv = psm_vocab_new ();
  t->shared = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  long max_train = (long) psm_section_int (cfg, "max_train");
  if (ctx->check) {
    /* short shortlists, so that the pointer rules are exercised too */
    t->max_len = MIN (t->max_len, 24);
    t->Vs = MIN (t->Vs, 150);
    t->Vt = MIN (t->Vt, 150);
    max_train = max_train ? MIN (max_train, 200) : 200;
  }
  const char *sl = psm_section_string (cfg, "source_lang"), *tl = psm_section_string (cfg, "target_lang");
  const char *names[3] = { "train", "valid", "test" };
  Pairs p[3] = { { 0 } };
  gboolean ok = TRUE;
  for (int k = 0; k < 3 && ok; k++) {
    ok = read_pairs (t, psm_section_string (cfg, names[k]), sl, tl, k == 0, k == 0 ? max_train : ctx->check ? 16 : 0,
                     &p[k], error);
    if (!ok && error && *error)
      g_prefix_error (error, "task.%s: ", names[k]);
  }
  char *saved_path = ctx->run_dir ? g_build_filename (ctx->run_dir, "tgt_vocab.txt", NULL) : NULL;
  gboolean saved = ok && saved_path && g_file_test (saved_path, G_FILE_TEST_EXISTS);
  g_free (saved_path);
  if (ok && saved) {
    ok = load_vocab (t->sv, ctx->run_dir, "src_vocab.txt", t->Vs, "src_vocab", error) &&
         load_vocab (t->tv, ctx->run_dir, "tgt_vocab.txt", t->Vt, "tgt_vocab", error);
  } else if (ok) {
    build_vocab (t->sv, p[0].src, t->Vs);
    build_vocab (t->tv, p[0].tgt, t->Vt);
    if (!ctx->check && (psm_vocab_size (t->sv) < t->Vs || psm_vocab_size (t->tv) < t->Vt)) {
      g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                   "%s: the training data has %d source and %d target words (with the 4 special ones), fewer than "
                   "src_vocab %d or tgt_vocab %d", psm_section_where (cfg, "tgt_vocab"), psm_vocab_size (t->sv),
                   psm_vocab_size (t->tv), t->Vs, t->Vt);
      ok = FALSE;
    }
    t->Vs = MIN (t->Vs, psm_vocab_size (t->sv));
    t->Vt = MIN (t->Vt, psm_vocab_size (t->tv));
  }
  if (ok) {
    /* the shared-words lookup: every training source word by its key, the
     * most frequent first */
    for (guint i = 0; i < p[0].src->len; i++)
      for (char **w = p[0].src->pdata[i]; *w; w++)
        if (**w) {
          char *k = shared_key (*w);
          if (!g_hash_table_contains (t->shared, k))
            g_hash_table_insert (t->shared, k, g_strdup (*w));
          else
            g_free (k);
        }
    t->lex = read_lexicon (psm_section_string (cfg, "lexicon"), FALSE, error);
    ok = t->lex != NULL;
  }
  if (ok && t->translate) {
    t->dec_lex = read_lexicon (psm_section_string (cfg, "decode_lexicon"), TRUE, error);
    ok = t->dec_lex != NULL;
  }
  for (int k = 0; k < 3 && ok; k++)
    t->split[k] = fill_split (t, &p[k], k == 0);
  for (int k = 0; k < 3; k++)
    pairs_free (&p[k]);
  if (ok) {
    long n = 0;
    for (int r = 0; r < N_RULES; r++)
      n += t->rules[r];
    GString *s = g_string_new (NULL);
    for (int r = 0; r < N_RULES; r++)
      g_string_append_printf (s, "%s%s %ld (%.2f %%)", r ? ", " : "", rule_name[r], t->rules[r],
                              n ? 100.0 * t->rules[r] / n : 0.0);
    fprintf (stderr, "nmt: %d training pairs, %ld target words: %s\n", psm_examples_n (t->split[0]), n, s->str);
    g_string_free (s, TRUE);
  }
  if (!ok) {
    nmt_destroy (t);
    return NULL;
  }
  return t;
}

static void
nmt_destroy (void *self)
{
  Nmt *t = self;
  for (int k = 0; k < 3; k++)
    psm_examples_free (t->split[k]);
  psm_vocab_free (t->sv);
  psm_vocab_free (t->tv);
  if (t->lex)
    g_hash_table_destroy (t->lex);
  if (t->dec_lex)
    g_hash_table_destroy (t->dec_lex);
  g_hash_table_destroy (t->shared);
  g_free (t);
}

static void
nmt_info (void *self, PsmTaskInfo *info)
{
  Nmt *t = self;
  info->src_vocab = t->Vs;
  info->tgt_vocab = t->Vt;
  info->ext_base = MAX (t->Vs, t->Vt);   /* above both vocabularies, as the core requires */
  info->max_src_len = t->max_len;
  info->max_tgt_len = t->max_len + 1;
  info->bos_id = BOS;
  info->eos_id = EOS;
  info->unk_id = UNK;
}

/* A batch of store x's examples idx[0..B) (idx NULL: its first B). */
static gboolean
fill (const Nmt *t, const PsmExamples *x, const int *idx, int B, PsmBatch *out, GError **error)
{
  const PsmExampleWords w = { t->sv, t->tv, t->Vs, t->Vt, MAX (t->Vs, t->Vt), UNK, BOS, EOS };
  return psm_examples_fill (x, &w, idx, B, out, "nmt", error);
}

static gboolean
nmt_eval_batch_of (void *self, PsmSplit split, const int *idx, int B, PsmBatch *out, GError **error)
{
  Nmt *t = self;
  return fill (t, t->split[split], idx, B, out, error);
}

static int nmt_n_examples (void *self, PsmSplit split) { return psm_examples_n (((Nmt *) self)->split[split]); }

static int
nmt_source_length (void *self, PsmSplit split, int i)
{
  return psm_examples_source_length (((Nmt *) self)->split[split], i);
}

static const char *
nmt_token_text (void *self, const PsmBatch *b, int ex, int32_t id)
{
  Nmt *t = self;
  if (id >= 0 && id < t->Vt)
    return psm_vocab_word (t->tv, id);
  const char *w = psm_batch_oov_word (b, id);
  GPtrArray *tr = w && t->translate ? g_hash_table_lookup (t->dec_lex, w) : NULL;
  return tr && tr->len ? tr->pdata[0] : w ? w : special[UNK];
}

static gboolean
nmt_save (void *self, const char *dir, GError **error)
{
  Nmt *t = self;
  char *sp = g_build_filename (dir, "src_vocab.txt", NULL), *tp = g_build_filename (dir, "tgt_vocab.txt", NULL);
  gboolean ok = psm_vocab_save (t->sv, t->Vs, sp, error) && psm_vocab_save (t->tv, t->Vt, tp, error);
  g_free (sp);
  g_free (tp);
  return ok;
}

static void
nmt_example_text (void *self, PsmSplit split, int i, const char **source, const char **reference)
{
  const PsmExamples *x = ((Nmt *) self)->split[split];
  *source = psm_examples_source_text (x, i);
  *reference = psm_examples_reference_text (x, i);
}

/* Raw source sentences to translate (psm-run --input): the simple
 * tokeniser (lower-case, punctuation apart) whatever tokenize says, as
 * user input is raw text; cut at max_len. */
static gboolean
nmt_text_batch (void *self, const char *const *texts, int n, PsmBatch *out, GError **error)
{
  Nmt *t = self;
  int known_s = psm_vocab_size (t->sv), known_t = psm_vocab_size (t->tv);   /* the text's new words: out below */
  Pairs p = { g_ptr_array_new_with_free_func ((GDestroyNotify) g_strfreev),
              g_ptr_array_new_with_free_func ((GDestroyNotify) g_strfreev) };
  gboolean simple = t->simple;
  t->simple = TRUE;
  for (int i = 0; i < n; i++) {
    char **tok = tokenize (t, texts[i]), **w = tok;
    for (char **x = tok; *x; x++)
      if (strlen (*x) > PSM_MAX_WORD_BYTES) {   /* a client's overlong word reads as <unk> */
        g_free (*x);
        *x = g_strdup (special[UNK]);
      }
    while (*w && !**w)
      w++;
    if (!*w) {   /* an empty line translates from one <unk> */
      g_strfreev (tok);
      tok = g_strsplit (special[UNK], " ", -1);
    }
    g_ptr_array_add (p.src, tok);
    g_ptr_array_add (p.tgt, g_new0 (char *, 1));
  }
  t->simple = simple;
  PsmExamples *x = fill_split (t, &p, FALSE);
  gboolean ok = fill (t, x, NULL, n, out, error);
  psm_vocab_truncate (t->sv, known_s);   /* the batch keeps its out-of-vocabulary words as strings */
  psm_vocab_truncate (t->tv, known_t);
  psm_examples_free (x);
  pairs_free (&p);
  return ok;
}

static const PsmTaskClass klass = {
  .size = sizeof (PsmTaskClass),
  .create = nmt_create,
  .destroy = nmt_destroy,
  .info = nmt_info,
  .n_examples = nmt_n_examples,
  .token_text = nmt_token_text,
  .save = nmt_save,
  .text_batch = nmt_text_batch,
  .example_text = nmt_example_text,
  .source_length = nmt_source_length,
  .eval_batch_of = nmt_eval_batch_of,
};

PSM_PLUGIN (PSM_KIND_TASK, "nmt",
            "machine translation (line-aligned files): shortlists and Gulcehre et al.'s dictionary-pointer "
            "targets (copy, shared words, lexicon, argmax)", params, NULL, &klass)
