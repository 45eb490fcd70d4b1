/* test-task-nmt.c — the translation task on hand-made sentence pairs: the
 * shortlists, every rule of the dictionary-pointer heuristic (copy, shared
 * words up to case and diacritics, lexicon, argmax, and <unk> without the
 * argmax rule), the batch a pair becomes, translation of pointed words,
 * the simple tokeniser, raw input to translate, vocabulary save and reload,
 * bad input, and the length hooks of decoding by source length. */
#include "config.h"
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include "run/run-internal.h"
#include <psm/psm-pipeline.h>


/* target words: le 3, chat 2, est 2, ici 2 -> shortlist <pad> <unk> <s>
 * </s> le chat est (ties in byte order) */
static const char *src_txt = "the cat is here\nthe cat is here\nthe dog sees Paris\nthe bird eats zorglub\n";
static const char *tgt_txt = "le chat est ici\nle chat est ici\nle chien voit paris\nl' oiseau mange zorglub\n";
static const char *lex_txt = "ici\there\nchien\thound\nchien\tdog\noiseau\tbird\nvoir\tsee\nil y a\tago\n";
static const char *dec_txt = "dog\tchien\ndog\tcabot\nbird\toiseau\n";

static void *
make_task (const PsmTaskClass **k, const char *extra, const char *run_dir, GError **e)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "nmt");
  *k = d->klass;
  /* shortlists of 8 and 7 words unless extra sets them */
  char *cfg = g_strdup_printf ("plugin = \"nmt\"; train = \"%s/tr\"; valid = \"%s/tr\"; test = \"%s/tr\"; "
                               "lexicon = \"%s/lex.tsv\"; decode_lexicon = \"%s/dec.tsv\"; %s %s", psm_test_dir (), psm_test_dir (), psm_test_dir (), psm_test_dir (),
                               psm_test_dir (), strstr (extra, "_vocab") ? "" : "src_vocab = 8; tgt_vocab = 7;", extra);
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "task", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  g_free (cfg);
  PsmTaskCtx ctx = { sizeof ctx, 1, FALSE, run_dir, FALSE };
  return (*k)->create (sec, &ctx, e);
}

static void
write_data (void)
{
  g_free (psm_test_write_file ("tr.en", src_txt));
  g_free (psm_test_write_file ("tr.fr", tgt_txt));
  g_free (psm_test_write_file ("lex.tsv", lex_txt));
  g_free (psm_test_write_file ("dec.tsv", dec_txt));
}

/* The text of word id of example b. */
static const char *
text (const PsmTaskClass *k, void *t, PsmBatch *b, int ex, int32_t id)
{
  return k->token_text (t, b, ex, id);
}

START_TEST (test_rules)
{
  write_data ();
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, "", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  PsmTaskInfo info = { sizeof info };
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 7);
  ck_assert_int_eq (info.ext_base, 8);   /* above the source's 8 words too */
  ck_assert_int_eq (info.unk_id, 1);
  ck_assert_msg (psm_task_info_validate (&info, "nmt", &e), "%s", e ? e->message : "");   /* as psm-run checks it */
  PsmBatch b;
  psm_batch_init (&b);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 4);
  psm_test_task_batch_of (k, t, PSM_SPLIT_TRAIN);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 0, 4, &b, NULL));
  ck_assert_msg (psm_batch_validate (&b, &info, 4, "nmt", &e), "%s", e ? e->message : "");
  ck_assert_int_eq (b.T, 4);
  ck_assert_int_eq (b.Ty, 5);   /* 4 words and </s> */
  /* per example and target position: switch and location expected */
  static const float sw[4][5] = { { 1, 1, 1, 0, 1 }, { 1, 1, 1, 0, 1 }, { 1, 0, 0, 0, 1 }, { 0, 0, 0, 0, 1 } };
  static const int loc[4][5] = {
    { -1, -1, -1, 3, -1 },                 /* ici: lexicon (here) */
    { -1, -1, -1, 3, -1 },
    { -1, 1, PSM_LOC_ARGMAX, 3, -1 },      /* chien: lexicon (dog, not hound); voit: argmax; paris: shared */
    { PSM_LOC_ARGMAX, 1, PSM_LOC_ARGMAX, 3, -1 },   /* l': argmax; oiseau: lexicon; mange: argmax; zorglub: copy */
  };
  static const char *const tgt_words[4][5] = { { "le", "chat", "est", "ici", "</s>" }, { "le", "chat", "est", "ici", "</s>" },
                                               { "le", "chien", "voit", "paris", "</s>" },
                                               { "l'", "oiseau", "mange", "zorglub", "</s>" } };
  for (int i = 0; i < 4; i++)
    for (int s = 0; s < 5; s++) {
      ck_assert_msg (PSM_AT (b.tgt_switch, &b, s, i) == sw[i][s], "example %d step %d: switch", i, s);
      ck_assert_msg (PSM_AT (b.tgt_loc, &b, s, i) == loc[i][s], "example %d step %d: loc %d, expected %d", i, s,
                     PSM_AT (b.tgt_loc, &b, s, i), loc[i][s]);
      ck_assert_str_eq (text (k, t, &b, i, PSM_AT (b.tgt_ext, &b, s, i)), tgt_words[i][s]);
      int32_t tg = PSM_AT (b.tgt, &b, s, i);
      ck_assert (sw[i][s] ? (tg < 7) : tg == 1);   /* pointed words are <unk> in the shortlist */
      ck_assert (PSM_AT (b.dec_in, &b, s, i) == (s == 0 ? 2 : PSM_AT (b.tgt, &b, s - 1, i)));
      ck_assert (PSM_AT (b.tgt_mask, &b, s, i) == 1.0f);
    }
  /* source words reach the output as themselves (per-batch ids) */
  ck_assert_str_eq (text (k, t, &b, 2, PSM_AT (b.src_ext, &b, 3, 2)), "Paris");
  ck_assert_str_eq (text (k, t, &b, 3, PSM_AT (b.src_ext, &b, 3, 3)), "zorglub");
  ck_assert (PSM_AT (b.src_ext, &b, 0, 0) >= 8);
  /* the source shortlist (8: 4 special + the, cat, is, here by count) */
  ck_assert_int_eq (PSM_AT (b.src, &b, 0, 0), 4);
  ck_assert_int_eq (PSM_AT (b.src, &b, 1, 2), 1);   /* dog: <unk> for the encoder */
  const char *sref, *tref;
  k->example_text (t, PSM_SPLIT_TEST, 2, &sref, &tref);
  ck_assert_str_eq (sref, "the dog sees Paris");
  ck_assert_str_eq (tref, "le chien voit paris");
  /* save and reload the shortlists */
  ck_assert (k->save (t, psm_test_dir (), &e));
  k->destroy (t);
  t = make_task (&k, "", psm_test_dir (), &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->destroy (t);
  void *bad = make_task (&k, "src_vocab = 8; tgt_vocab = 9;", psm_test_dir (), &e);
  ck_assert (!bad);
  ck_assert_msg (strstr (e->message, "tgt_vocab.txt: holds 7 words, but task.tgt_vocab is 9"), "%s", e->message);
  g_clear_error (&e);
  char *v1 = g_build_filename (psm_test_dir (), "src_vocab.txt", NULL), *v2 = g_build_filename (psm_test_dir (), "tgt_vocab.txt", NULL);
  g_unlink (v1);
  g_unlink (v2);
  g_free (v1);
  g_free (v2);
  /* without the argmax rule those words are <unk> in the shortlist */
  t = make_task (&k, "argmax_rule = false;", NULL, &e);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 2, 2, &b, NULL));
  ck_assert (PSM_AT (b.tgt_switch, &b, 2, 0) == 1.0f && PSM_AT (b.tgt_loc, &b, 2, 0) == -1);
  ck_assert (PSM_AT (b.tgt, &b, 2, 0) == 1);
  ck_assert (PSM_AT (b.tgt_switch, &b, 3, 0) == 0.0f && PSM_AT (b.tgt_loc, &b, 3, 0) == 3);   /* paris still shared */
  k->destroy (t);
  /* translate: a pointed source word comes out as its first translation */
  t = make_task (&k, "translate = true;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 2, 2, &b, NULL));
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 1, 0)), "chien");
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 3, 0)), "Paris");   /* not in the lexicon */
  k->destroy (t);
  /* raw input to translate: lower-cased, punctuation apart; an empty line
   * becomes one <unk> */
  t = make_task (&k, "", NULL, &e);
  const char *raw[2] = { "The Cat, here.", "  " };
  ck_assert (k->text_batch (t, raw, 2, &b, &e));
  ck_assert_int_eq (b.B, 2);
  ck_assert_int_eq (b.T, 5);
  static const char *const words[5] = { "the", "cat", ",", "here", "." };
  for (int s = 0; s < 5; s++)
    ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, s, 0)), words[s]);
  ck_assert_int_eq (PSM_AT (b.src, &b, 1, 0), 5);   /* cat: in the source shortlist */
  ck_assert (PSM_AT (b.src_mask, &b, 0, 1) == 1.0f && PSM_AT (b.src_mask, &b, 1, 1) == 0.0f);
  ck_assert_int_eq (PSM_AT (b.src, &b, 0, 1), 1);
  k->destroy (t);
  psm_batch_clear (&b);
}
END_TEST

START_TEST (test_input)
{
  write_data ();
  const PsmTaskClass *k;
  GError *e = NULL;
  /* not line-aligned */
  g_free (psm_test_write_file ("tr.fr", "le chat\n"));
  ck_assert (!make_task (&k, "", NULL, &e));
  ck_assert_msg (strstr (e->message, "task.train: nmt: ") && strstr (e->message, "tr.en has 4 lines but ") &&
                 strstr (e->message, "tr.fr has 1: not line-aligned"), "%s", e->message);
  g_clear_error (&e);
  /* a missing file */
  g_free (psm_test_write_file ("tr.fr", tgt_txt));
  ck_assert (!make_task (&k, "target_lang = \"de\";", NULL, &e));
  ck_assert_msg (strstr (e->message, "tr.de (target sentences)"), "%s", e->message);
  g_clear_error (&e);
  /* an empty side is skipped; a long pair dropped from training only */
  g_free (psm_test_write_file ("tr.en", "the cat is here\n\nthe cat is here now and then\nthe cat\n"));
  g_free (psm_test_write_file ("tr.fr", "le chat est ici\nle chat\nle chat est ici\nle chat\n"));
  void *t = make_task (&k, "max_len = 4; src_vocab = 6; tgt_vocab = 6;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 2);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_VALID), 3);   /* kept, cut at max_len for the model */
  PsmBatch b;
  psm_batch_init (&b);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_VALID, 1, 1, &b, NULL));
  ck_assert_int_eq (b.T, 4);
  const char *s, *r;
  k->example_text (t, PSM_SPLIT_VALID, 1, &s, &r);
  ck_assert_str_eq (s, "the cat is here now and then");   /* whole for the metrics */
  k->destroy (t);
  /* a malformed lexicon line */
  g_free (psm_test_write_file ("lex.tsv", "ici\there\nnotab\n"));
  ck_assert (!make_task (&k, "src_vocab = 6; tgt_vocab = 6;", NULL, &e));
  ck_assert_msg (strstr (e->message, "lex.tsv:2: not a lexicon line"), "%s", e->message);
  g_clear_error (&e);
  /* the simple tokeniser on raw text */
  g_free (psm_test_write_file ("lex.tsv", lex_txt));
  g_free (psm_test_write_file ("tr.en", "The Bird, eats.\n"));
  g_free (psm_test_write_file ("tr.fr", "L'Oiseau mange (du pain).\n"));
  t = make_task (&k, "tokenize = \"simple\"; src_vocab = 5; tgt_vocab = 5;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->example_text (t, PSM_SPLIT_VALID, 0, &s, &r);
  ck_assert_str_eq (s, "the bird , eats .");
  ck_assert_str_eq (r, "l' oiseau mange ( du pain ) .");
  k->destroy (t);
  /* invalid UTF-8 in the data (a character cut short at a line's end) is
   * read as U+FFFD */
  g_free (psm_test_write_file ("tr.en", "The Bird\xf0\n"));
  t = make_task (&k, "tokenize = \"simple\"; src_vocab = 5; tgt_vocab = 5;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->example_text (t, PSM_SPLIT_VALID, 0, &s, &r);
  ck_assert_str_eq (s, "the bird \xef\xbf\xbd");
  k->destroy (t);
  psm_batch_clear (&b);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  Suite *s = suite_create ("task-nmt");
  TCase *tc = tcase_create ("nmt");
  tcase_add_test (tc, test_rules);
  tcase_add_test (tc, test_input);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
