/* test-task-headline.c — the headline task on hand-made data: the
 * vocabularies by count, the UNK-pointers of §5.2 (first source position,
 * also when that source word is <unk>; a word absent from the source stays
 * <unk>) with their count, entity anonymisation and entity-pointers, the
 * large-vocabulary candidates, the CNN/DailyMail lead and the Gigaword
 * style, raw text, vocabulary save and reload, bad input, and the length
 * hooks of decoding in order of source length. */
#include "config.h"
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include <psm/psm-pipeline.h>


/* source counts (min_count 2): . 4, police 3, arrest in man paris city 2
 * -> 4 special + 7 words; title counts: police 3, arrest 2, man 2 -> 7 */
static const char *art_txt = "police arrest zorglub in paris .\npolice arrest man in paris .\n"
                             "police find blorg near city .\nman sees city .\n";
static const char *tit_txt = "police arrest zorglub\npolice arrest man\npolice find blorg\nman sees qux\n";

enum { TRAIN_MODE, EVAL_ONLY, TEXT_ONLY };

static void *
make_task_mode (const PsmTaskClass **k, const char *files, const char *extra, const char *run_dir, int mode, GError **e)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "headline");
  *k = d->klass;
  char *cfg = g_strdup_printf ("plugin = \"headline\"; %s %s", files, extra);
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "task", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  g_free (cfg);
  PsmTaskCtx ctx = { sizeof ctx, 1, FALSE, run_dir, mode != TRAIN_MODE, mode == TEXT_ONLY };
  return (*k)->create (sec, &ctx, e);
}

static void *
make_task (const PsmTaskClass **k, const char *files, const char *extra, const char *run_dir, GError **e)
{
  return make_task_mode (k, files, extra, run_dir, TRAIN_MODE, e);
}

static char *
split_files (const char *name)
{
  return g_strdup_printf ("train = \"%s/%s\"; valid = \"%s/%s\"; test = \"%s/%s\";", psm_test_dir (), name, psm_test_dir (), name, psm_test_dir (), name);
}

static const char *
text (const PsmTaskClass *k, void *t, PsmBatch *b, int ex, int32_t id)
{
  return k->token_text (t, b, ex, id);
}

START_TEST (test_unk_pointers)
{
  g_free (psm_test_write_file ("tr.article.txt", art_txt));
  g_free (psm_test_write_file ("tr.title.txt", tit_txt));
  char *files = split_files ("tr.article.txt");
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, files, "min_count = 2; style = \"none\";", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  PsmTaskInfo info = { sizeof info };
  k->info (t, &info);
  ck_assert_int_eq (info.src_vocab, 11);
  ck_assert_int_eq (info.tgt_vocab, 7);
  ck_assert_int_eq (info.ext_base, 11);
  PsmBatch b;
  psm_batch_init (&b);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 0, 4, &b, NULL));
  ck_assert_int_eq (b.T, 6);
  ck_assert_int_eq (b.Ty, 4);
  static const int loc[4][4] = { { -1, -1, 2, -1 }, { -1, -1, -1, -1 }, { -1, 1, 2, -1 }, { -1, 1, -1, -1 } };
  static const char *const words[4][4] = { { "police", "arrest", "zorglub", "</s>" }, { "police", "arrest", "man", "</s>" },
                                           { "police", "find", "blorg", "</s>" }, { "man", "sees", "qux", "</s>" } };
  int pointers = 0;
  for (int i = 0; i < 4; i++)
    for (int s = 0; s < 4; s++) {
      float sw = PSM_AT (b.tgt_switch, &b, s, i);
      ck_assert_msg (PSM_AT (b.tgt_loc, &b, s, i) == loc[i][s], "example %d step %d: loc %d, expected %d", i, s,
                     PSM_AT (b.tgt_loc, &b, s, i), loc[i][s]);
      ck_assert (sw == (loc[i][s] >= 0 ? 0.0f : 1.0f));
      pointers += sw == 0.0f;
      ck_assert_str_eq (text (k, t, &b, i, PSM_AT (b.tgt_ext, &b, s, i)), words[i][s]);
      int32_t tg = PSM_AT (b.tgt, &b, s, i);
      ck_assert (strcmp (words[i][s], "police") && strcmp (words[i][s], "arrest") && strcmp (words[i][s], "man") &&
                 strcmp (words[i][s], "</s>") ? tg == 1 : tg > 1);
      /* a pointed word is the source word at its position */
      if (loc[i][s] >= 0)
        ck_assert_int_eq (PSM_AT (b.src_ext, &b, loc[i][s], i), PSM_AT (b.tgt_ext, &b, s, i));
    }
  ck_assert_int_eq (pointers, 4);   /* 100 per 100 examples; qux, absent from its source, stays <unk> */
  /* zorglub: <unk> for the encoder, itself in the extended space */
  ck_assert_int_eq (PSM_AT (b.src, &b, 2, 0), 1);
  ck_assert (PSM_AT (b.src_ext, &b, 2, 0) >= 11);
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 2, 0)), "zorglub");
  /* police: the same id in the source's extended ids as in the titles */
  ck_assert_int_eq (PSM_AT (b.src_ext, &b, 0, 0), PSM_AT (b.tgt, &b, 0, 0));
  /* save and reload the vocabularies */
  ck_assert (k->save (t, psm_test_dir (), &e));
  k->destroy (t);
  t = make_task (&k, files, "min_count = 2; style = \"none\";", psm_test_dir (), &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 7);
  /* raw text, PTB-tokenised and lower-cased */
  const char *raw[1] = { "Police arrest Zorglub in Paris." };
  ck_assert (k->text_batch (t, raw, 1, &b, &e));
  ck_assert_int_eq (b.T, 6);
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 2, 0)), "zorglub");
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 5, 0)), ".");
  k->destroy (t);
  /* evaluating or decoding a trained run: the training split is not read
   * (this one would fail: its titles are a line short) */
  g_free (psm_test_write_file ("bad.article.txt", art_txt));
  g_free (psm_test_write_file ("bad.title.txt", "police arrest zorglub\n"));
  char *files_e = g_strdup_printf ("train = \"%s/bad.article.txt\"; valid = \"%s/tr.article.txt\"; "
                                   "test = \"%s/tr.article.txt\";", psm_test_dir (), psm_test_dir (), psm_test_dir ());
  t = make_task_mode (&k, files_e, "min_count = 2; style = \"none\";", psm_test_dir (), EVAL_ONLY, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 7);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 0);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TEST), 4);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (!psm_task_train_batch (k, t, 2, &rng, &b, &e));
  ck_assert_msg (strstr (e->message, "no training examples"), "%s", e->message);
  g_clear_error (&e);
  k->destroy (t);
  /* training reads it, and the error names it */
  ck_assert (!make_task (&k, files_e, "min_count = 2; style = \"none\";", psm_test_dir (), &e));
  ck_assert_msg (strstr (e->message, "task.train: "), "%s", e->message);
  g_clear_error (&e);
  g_free (files_e);
  /* decoding raw text: no split is read (all three are bad here); the
   * vocabularies and the raw text's ids are those of the full task */
  char *files_t = g_strdup_printf ("train = \"%s/bad.article.txt\"; valid = \"%s/bad.article.txt\"; "
                                   "test = \"%s/bad.article.txt\";", psm_test_dir (), psm_test_dir (), psm_test_dir ());
  ck_assert (!make_task_mode (&k, files_t, "min_count = 2; style = \"none\";", psm_test_dir (), EVAL_ONLY, &e));
  ck_assert_msg (strstr (e->message, "task.valid: "), "%s", e->message);
  g_clear_error (&e);
  t = make_task_mode (&k, files_t, "min_count = 2; style = \"none\";", psm_test_dir (), TEXT_ONLY, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  k->info (t, &info);
  ck_assert_int_eq (info.src_vocab, 11);
  ck_assert_int_eq (info.tgt_vocab, 7);
  for (int sp = PSM_SPLIT_TRAIN; sp <= PSM_SPLIT_TEST; sp++)
    ck_assert_int_eq (k->n_examples (t, (PsmSplit) sp), 0);
  ck_assert (k->text_batch (t, raw, 1, &b, &e));
  ck_assert_int_eq (b.T, 6);
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 0, 0)), "police");
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.src_ext, &b, 2, 0)), "zorglub");
  k->destroy (t);
  /* without the saved vocabularies the training split is still needed */
  ck_assert (!make_task_mode (&k, files_t, "min_count = 2; style = \"none\";", NULL, TEXT_ONLY, &e));
  ck_assert_msg (strstr (e->message, "task.train: "), "%s", e->message);
  g_clear_error (&e);
  g_free (files_t);
  void *bad = make_task (&k, files, "min_count = 2; style = \"none\"; tgt_vocab = 6;", psm_test_dir (), &e);
  ck_assert (!bad);
  ck_assert_msg (strstr (e->message, "tgt_vocab.txt: holds 7 words, more than task.tgt_vocab 6"), "%s", e->message);
  g_clear_error (&e);
  char *v1 = g_build_filename (psm_test_dir (), "src_vocab.txt", NULL), *v2 = g_build_filename (psm_test_dir (), "tgt_vocab.txt", NULL);
  g_unlink (v1);
  g_unlink (v2);
  g_free (v1);
  g_free (v2);
  /* a cap below the count rule: the most frequent only */
  t = make_task (&k, files, "min_count = 2; style = \"none\"; tgt_vocab = 5;", NULL, &e);
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 5);   /* police */
  k->destroy (t);
  /* pointers = none: no pointer targets */
  t = make_task (&k, files, "min_count = 2; style = \"none\"; pointers = \"none\";", NULL, &e);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 0, 4, &b, NULL));
  for (int r = 0; r < b.Ty * b.B; r++)
    ck_assert (b.tgt_switch[r] == 1.0f && b.tgt_loc[r] == -1);
  k->destroy (t);
  psm_batch_clear (&b);
  g_free (files);
}
END_TEST

/* The length-order hooks (ABI 1.10): source lengths 6 6 6 4. */
START_TEST (test_batch_of)
{
  g_free (psm_test_write_file ("tr.article.txt", art_txt));
  g_free (psm_test_write_file ("tr.title.txt", tit_txt));
  char *files = split_files ("tr.article.txt");
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, files, "min_count = 2; style = \"none\";", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  psm_test_task_batch_of (k, t, PSM_SPLIT_VALID);
  ck_assert_int_eq (k->source_length (t, PSM_SPLIT_VALID, 3), 4);
  ck_assert_int_eq (k->source_length (t, PSM_SPLIT_VALID, 0), 6);
  k->destroy (t);
  g_free (files);
}
END_TEST

/* Batches under lvt: ascending candidates holding the special words,
 * every source word of the title vocabulary and in training every target,
 * filled up with the most frequent words to lvt. */
START_TEST (test_lvt)
{
  g_free (psm_test_write_file ("tr.article.txt", art_txt));
  g_free (psm_test_write_file ("tr.title.txt", tit_txt));
  char *files = split_files ("tr.article.txt");
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, files, "min_count = 1; style = \"none\"; lvt = 8;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  PsmTaskInfo info = { sizeof info };
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 12);   /* every title word */
  /* a batch's candidates depend on its company: decoding keeps the order */
  ck_assert_int_eq (k->source_length (t, PSM_SPLIT_VALID, 0), -1);
  PsmBatch b;
  psm_batch_init (&b);
  PsmRng rng;
  psm_rng_seed (&rng, 3);
  for (int rep = 0; rep < 8; rep++) {
    ck_assert (psm_task_train_batch (k, t, 1, &rng, &b, &e));
    ck_assert (b.n_cand >= 8 && b.n_cand < 12);
    for (int j = 0; j < b.n_cand; j++)
      ck_assert (j == 0 || b.cand[j] > b.cand[j - 1]);
    for (int s = 0; s < 4; s++)
      ck_assert (b.cand[0] == 0 && psm_batch_cand_index (&b, 3) == 3 &&
                 psm_batch_cand_index (&b, PSM_AT (b.tgt, &b, s, 0)) >= 0);
    for (int s = 0; s < b.T; s++)
      if (PSM_AT (b.src_ext, &b, s, 0) < 12)
        ck_assert (psm_batch_cand_index (&b, PSM_AT (b.src_ext, &b, s, 0)) >= 0);
    ck_assert (psm_batch_cand_index (&b, 4) >= 0);   /* the most frequent title word */
  }
  /* evaluation batches: candidates without the reference's words, a title
   * word outside them <unk> for the head (man sees city . -> man sees qux:
   * <pad> <unk> <s> </s> police arrest man sees) */
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_VALID, 3, 1, &b, NULL));
  static const int32_t want[8] = { 0, 1, 2, 3, 4, 5, 6, 10 };
  ck_assert_int_eq (b.n_cand, 8);
  for (int j = 0; j < 8; j++)
    ck_assert_int_eq (b.cand[j], want[j]);
  ck_assert_int_eq (PSM_AT (b.tgt, &b, 2, 0), 1);
  ck_assert_str_eq (text (k, t, &b, 0, PSM_AT (b.tgt_ext, &b, 2, 0)), "qux");
  ck_assert_int_eq (PSM_AT (b.tgt, &b, 1, 0), 10);   /* sees: in the source */
  k->destroy (t);
  psm_batch_clear (&b);
  g_free (files);
}
END_TEST

/* word|TAG input: per document, @entity<k> by first appearance over source
 * then title, token level, shared by repetitions; a title placeholder the
 * source holds points at it. */
START_TEST (test_entities)
{
  g_free (psm_test_write_file ("ne.article.txt", "barack|PERSON obama|PERSON met|O putin|PERSON in moscow|LOCATION .\n"
                                        "putin|PERSON visits paris|LOCATION .|O\n"));
  g_free (psm_test_write_file ("ne.title.txt", "obama|PERSON meets putin|PERSON\nputin|PERSON and obama|PERSON in paris|LOCATION\n"));
  char *files = split_files ("ne.article.txt");
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, files, "min_count = 1; pointers = \"entity\";", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  const char *s, *r;
  k->example_text (t, PSM_SPLIT_TEST, 0, &s, &r);
  ck_assert_str_eq (s, "@entity1 @entity2 met @entity3 in @entity4 .");
  ck_assert_str_eq (r, "@entity2 meets @entity3");
  k->example_text (t, PSM_SPLIT_TEST, 1, &s, &r);
  ck_assert_str_eq (s, "@entity1 visits @entity2 .");
  ck_assert_str_eq (r, "@entity1 and @entity3 in @entity2");
  PsmBatch b;
  psm_batch_init (&b);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TEST, 0, 2, &b, NULL));
  static const int loc[2][6] = { { 1, -1, 3, -1, -1, -1 }, { 0, -1, -1, -1, 2, -1 } };
  for (int i = 0; i < 2; i++)
    for (int st = 0; st < (i ? 6 : 4); st++) {
      ck_assert_msg (PSM_AT (b.tgt_loc, &b, st, i) == loc[i][st], "example %d step %d: loc %d", i, st,
                     PSM_AT (b.tgt_loc, &b, st, i));
      ck_assert (PSM_AT (b.tgt_switch, &b, st, i) == (loc[i][st] >= 0 ? 0.0f : 1.0f));
    }
  k->destroy (t);
  psm_batch_clear (&b);
  g_free (files);
}
END_TEST

/* CNN/DailyMail records as leads (first sentence -> first highlight) in the
 * Gigaword style; the title file beside an article file; bad input. */
START_TEST (test_input)
{
  g_free (psm_test_write_file ("cn.jsonl",
                      "{\"id\": \"a\", \"article\": \"( cnn ) the 2 men met in 1999 ! then more .\", "
                      "\"highlights\": \"two men met [ at last ] .\\nsecond line .\"}\n"
                      "{\"id\": \"b\", \"article\": \"no full stop here\", \"highlights\": \"a title\"}\n"
                      "{\"id\": \"c\", \"highlights\": \"no article\"}\n"));
  char *files = split_files ("cn.jsonl");
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, files, "min_count = 1;", NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_VALID), 2);   /* the record without an article skipped */
  const char *s, *r;
  k->example_text (t, PSM_SPLIT_VALID, 0, &s, &r);
  ck_assert_str_eq (s, "-lrb- cnn -rrb- the # men met in #### !");
  ck_assert_str_eq (r, "two men met -lsb- at last -rsb-");
  k->example_text (t, PSM_SPLIT_VALID, 1, &s, &r);
  ck_assert_str_eq (s, "no full stop here");
  ck_assert_str_eq (r, "a title");
  k->destroy (t);
  g_free (files);
  /* style none leaves the text as it is */
  files = split_files ("cn.jsonl");
  t = make_task (&k, files, "min_count = 1; style = \"none\";", NULL, &e);
  k->example_text (t, PSM_SPLIT_VALID, 0, &s, &r);
  ck_assert_str_eq (s, "( cnn ) the 2 men met in 1999 !");
  ck_assert_str_eq (r, "two men met [ at last ] .");
  k->destroy (t);
  g_free (files);
  /* a split file whose titles cannot be found */
  g_free (psm_test_write_file ("plain.txt", "a b c\n"));
  files = split_files ("plain.txt");
  ck_assert (!make_task (&k, files, "", NULL, &e));
  ck_assert_msg (strstr (e->message, "task.train: ") && strstr (e->message, "plain.txt: cannot tell where its titles are"),
                 "%s", e->message);
  g_clear_error (&e);
  g_free (files);
  /* a title file shorter than its article file */
  g_free (psm_test_write_file ("sh.article.txt", "a b\nc d\n"));
  g_free (psm_test_write_file ("sh.title.txt", "a\n"));
  files = split_files ("sh.article.txt");
  ck_assert (!make_task (&k, files, "", NULL, &e));
  ck_assert_msg (strstr (e->message, "sh.title.txt: has fewer lines than "), "%s", e->message);
  g_clear_error (&e);
  g_free (files);
  /* a title file longer than its article file */
  g_free (psm_test_write_file ("sh.title.txt", "a\nb\nc\n"));
  files = split_files ("sh.article.txt");
  ck_assert (!make_task (&k, files, "", NULL, &e));
  ck_assert_msg (strstr (e->message, "sh.title.txt: has more lines than "), "%s", e->message);
  g_clear_error (&e);
  g_free (files);
  /* no title word common enough */
  g_free (psm_test_write_file ("sh.title.txt", "a\nb\n"));
  files = split_files ("sh.article.txt");
  ck_assert (!make_task (&k, files, "", NULL, &e));
  ck_assert_msg (strstr (e->message, "no title word of the training split is seen 5 times or more"), "%s", e->message);
  g_clear_error (&e);
  g_free (files);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  Suite *s = suite_create ("task-headline");
  TCase *tc = tcase_create ("headline");
  tcase_add_test (tc, test_unk_pointers);
  tcase_add_test (tc, test_batch_of);
  tcase_add_test (tc, test_lvt);
  tcase_add_test (tc, test_entities);
  tcase_add_test (tc, test_input);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
