/* test-task-cnndm.c — the CNN/DailyMail task: JSON records (escapes, bad
 * records skipped and counted, a file with none valid refused), the
 * vocabulary (specials first, by count, saved and read back), truncation,
 * batches (OOV ids per batch, targets shifted, </s>), .source/.target, raw
 * text tokenisation, the length hooks of decoding by source length. */
#include "config.h"
#include <math.h>
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include <psm/psm-pipeline.h>


static const char *train_jsonl =
  "{\"id\": \"a\", \"article\": \"the cat sat on the mat . the cat ran .\", \"highlights\": \"cat sat .\\ncat ran .\"}\n"
  "{\"id\": \"b\", \"article\": \"the dog saw the cat .\", \"highlights\": \"dog saw cat .\"}\n"
  "not json at all\n"
  "{\"id\": \"c\", \"article\": \"\", \"highlights\": \"empty article .\"}\n"
  "{\"id\": \"d\", \"highlights\": \"no article .\"}\n"
  "{\"id\": \"e\", \"article\": 5, \"highlights\": \"number .\"}\n"
  "\n"
  "{\"id\": \"f\", \"article\": \"caf\\u00e9 \\\"quoted\\\" zebra the\", \"highlights\": \"zebra caf\\u00e9 .\", \"extra\": [1, {\"x\": null}]}\n";

enum { TRAIN_MODE, EVAL_ONLY, TEXT_ONLY };

static void *
make_task_mode (const PsmTaskClass **k, const char *cfg, const char *run_dir, int mode, GError **e)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "cnndm");
  *k = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "task", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  PsmTaskCtx ctx = { sizeof ctx, 1, FALSE, run_dir, mode != TRAIN_MODE, mode == TEXT_ONLY };
  return (*k)->create (sec, &ctx, e);
}

static void *
make_task (const PsmTaskClass **k, const char *cfg, const char *run_dir, GError **e)
{
  return make_task_mode (k, cfg, run_dir, TRAIN_MODE, e);
}

START_TEST (test_records_and_vocab)
{
  char *tr = psm_test_write_file ("train.jsonl", train_jsonl);
  char *cfg = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 12; max_src = 6; max_tgt = 3;",
                               tr, tr);
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, cfg, NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 3);   /* a, b, f */
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TEST), 3);    /* test = valid */
  psm_test_task_batch_of (k, t, PSM_SPLIT_TEST);               /* lengths 6, 5, 4 */
  ck_assert_int_eq (((int (*) (void *, PsmSplit, int)) PSM_CLASS_HOOK (k, source_length)) (t, PSM_SPLIT_TEST, 2), 4);
  PsmTaskInfo info;
  memset (&info, 0, sizeof info);
  info.size = sizeof info;
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 12);
  ck_assert_int_eq (info.max_tgt_len, 4);
  ck_assert (info.bos_id == 2 && info.eos_id == 3 && info.unk_id == 1);
  /* specials, then by count, ties by the word */
  PsmBatch b;
  psm_batch_init (&b);
  ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_TRAIN, 0, 3, &b, NULL));
  ck_assert_str_eq (k->token_text (t, &b, 0, 0), "<pad>");
  ck_assert_str_eq (k->token_text (t, &b, 0, 3), "</s>");
  ck_assert_str_eq (k->token_text (t, &b, 0, 4), ".");     /* 7 times */
  ck_assert_str_eq (k->token_text (t, &b, 0, 5), "cat");   /* 6, before "the" (6) */
  ck_assert_str_eq (k->token_text (t, &b, 0, 6), "the");
  ck_assert_int_eq (b.B, 3);
  ck_assert_int_eq (b.T, 6);    /* article a cut to 6 tokens */
  ck_assert_int_eq (b.Ty, 4);   /* 3 summary tokens + </s> */
  /* example 0's target "cat sat . </s>" (cut after 3), decoder input "<s> cat sat ." */
  const char *want[4] = { "cat", "sat", ".", "</s>" };
  for (int s = 0; s < 4; s++) {
    ck_assert_str_eq (k->token_text (t, &b, 0, PSM_AT (b.tgt_ext, &b, s, 0)), want[s]);
    ck_assert (PSM_AT (b.tgt_mask, &b, s, 0) == 1.0f);
    ck_assert_int_eq (PSM_AT (b.dec_in, &b, s, 0), s == 0 ? 2 : PSM_AT (b.tgt, &b, s - 1, 0));
  }
  /* example 2 (record f): the JSON escapes decoded; OOVs get extended ids */
  const char *src2[5] = { "café", "\"quoted\"", "zebra", "the", NULL };
  for (int s = 0; s < 4; s++) {
    int32_t x = PSM_AT (b.src_ext, &b, s, 2);
    ck_assert_str_eq (k->token_text (t, &b, 2, x), src2[s]);
    ck_assert (x < 12 ? PSM_AT (b.src, &b, s, 2) == x : PSM_AT (b.src, &b, s, 2) == 1);
    ck_assert (PSM_AT (b.src_mask, &b, s, 2) == 1.0f);
  }
  ck_assert (PSM_AT (b.src_mask, &b, 4, 2) == 0.0f);
  /* the same OOV word has the same extended id in source and target */
  int32_t zebra = PSM_AT (b.tgt_ext, &b, 0, 2);
  ck_assert_str_eq (k->token_text (t, &b, 2, zebra), "zebra");
  if (zebra >= 12) {
    ck_assert_int_eq (PSM_AT (b.tgt, &b, 0, 2), 1);
    ck_assert_int_eq (PSM_AT (b.src_ext, &b, 2, 2), zebra);
  }
  /* save, then a task in that run folder reads the vocabulary back */
  ck_assert (k->save (t, psm_test_dir (), NULL));
  char *vocab = NULL;
  char *vocab_path = g_build_filename (psm_test_dir (), "vocab.txt", NULL);
  ck_assert (g_file_get_contents (vocab_path, &vocab, NULL, NULL));
  ck_assert_msg (g_str_has_prefix (vocab, "<pad>\t0\n<unk>\t0\n<s>\t0\n</s>\t0\n.\t7\ncat\t6\nthe\t6\n"), "%s", vocab);
  g_free (vocab);
  void *t2 = make_task (&k, cfg, psm_test_dir (), NULL);
  PsmBatch b2;
  psm_batch_init (&b2);
  ck_assert (psm_task_eval_batch (k, t2, PSM_SPLIT_TRAIN, 0, 3, &b2, NULL));
  ck_assert (memcmp (b.src_ext, b2.src_ext, sizeof (int32_t) * b.T * b.B) == 0);
  /* eval-only in the run folder: the training split is not read (here it
   * has no valid record), the vocabulary and the test examples are the same */
  char *bad = psm_test_write_file ("none.jsonl", "not json\n");
  char *cfg_e = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 12; "
                                 "max_src = 6; max_tgt = 3;", bad, tr);
  void *t3 = make_task_mode (&k, cfg_e, psm_test_dir (), EVAL_ONLY, &e);
  ck_assert_msg (t3, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t3, PSM_SPLIT_TRAIN), 0);
  ck_assert_int_eq (k->n_examples (t3, PSM_SPLIT_TEST), 3);
  ck_assert (psm_task_eval_batch (k, t3, PSM_SPLIT_TEST, 0, 3, &b2, NULL));
  ck_assert (memcmp (b.src_ext, b2.src_ext, sizeof (int32_t) * b.T * b.B) == 0);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (!psm_task_train_batch (k, t3, 2, &rng, &b2, &e));
  ck_assert_msg (strstr (e->message, "no training examples"), "%s", e->message);
  g_clear_error (&e);
  k->destroy (t3);
  /* without it training would need the file: the error names it */
  ck_assert (make_task (&k, cfg_e, psm_test_dir (), &e) == NULL);
  ck_assert_msg (strstr (e->message, "none.jsonl"), "%s", e->message);
  g_clear_error (&e);
  g_free (cfg_e);
  /* text-only in the run folder: no split is read (none has a valid record
   * here, and eval-only needs the validation one); raw text reads the same */
  char *cfg_t = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 12; "
                                 "max_src = 6; max_tgt = 3;", bad, bad);
  ck_assert (make_task_mode (&k, cfg_t, psm_test_dir (), EVAL_ONLY, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.valid: ") && strstr (e->message, "none.jsonl"), "%s", e->message);
  g_clear_error (&e);
  void *t5 = make_task_mode (&k, cfg_t, psm_test_dir (), TEXT_ONLY, &e);
  ck_assert_msg (t5, "%s", e ? e->message : "");
  for (int sp = PSM_SPLIT_TRAIN; sp <= PSM_SPLIT_TEST; sp++)
    ck_assert_int_eq (k->n_examples (t5, (PsmSplit) sp), 0);
  const char *raw[2] = { "The cat sat on a zebra .", "the dog ." };
  PsmBatch b3;
  psm_batch_init (&b3);
  ck_assert (k->text_batch (t, raw, 2, &b2, NULL));
  ck_assert (k->text_batch (t5, raw, 2, &b3, NULL));
  ck_assert_int_eq (b2.T, b3.T);
  ck_assert (memcmp (b2.src_ext, b3.src_ext, sizeof (int32_t) * b2.T * b2.B) == 0);
  ck_assert_str_eq (k->token_text (t5, &b3, 0, PSM_AT (b3.src_ext, &b3, 5, 0)), "zebra");
  psm_batch_clear (&b3);
  k->destroy (t5);
  /* with no saved vocabulary it must still read the training split */
  ck_assert (make_task_mode (&k, cfg_t, NULL, TEXT_ONLY, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.train: ") && strstr (e->message, "none.jsonl"), "%s", e->message);
  g_clear_error (&e);
  g_free (cfg_t);
  g_free (bad);
  /* eval-only without a saved vocabulary builds it from the training split */
  void *t4 = make_task_mode (&k, cfg, NULL, EVAL_ONLY, &e);
  ck_assert_msg (t4, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t4, PSM_SPLIT_TRAIN), 0);
  ck_assert (psm_task_eval_batch (k, t4, PSM_SPLIT_TEST, 0, 3, &b2, NULL));
  ck_assert (memcmp (b.src_ext, b2.src_ext, sizeof (int32_t) * b.T * b.B) == 0);
  k->destroy (t4);
  /* a run folder whose vocabulary has another size is refused */
  char *cfg2 = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 10;", tr, tr);
  ck_assert (make_task (&k, cfg2, psm_test_dir (), &e) == NULL);
  ck_assert_msg (strstr (e->message, "vocab.txt: holds 12 words, but task.vocab is 10"), "%s", e->message);
  g_clear_error (&e);
  g_unlink (vocab_path);
  g_free (vocab_path);
  /* more words asked than the data has */
  char *cfg3 = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 1000;", tr, tr);
  ck_assert (make_task (&k, cfg3, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.vocab: 1000, but the training split has only"), "%s", e->message);
  g_clear_error (&e);
  /* raw text, tokenised like the data */
  const char *texts[2] = { "Obama's dog doesn't bark (loudly), \"he\" said.", "" };
  ck_assert (k->text_batch (t, texts, 2, &b2, NULL));
  GString *s = g_string_new (NULL);
  for (int i = 0; i < b2.T && PSM_AT (b2.src_mask, &b2, i, 0) > 0; i++)
    g_string_append_printf (s, "%s%s", i ? " " : "", k->token_text (t, &b2, 0, PSM_AT (b2.src_ext, &b2, i, 0)));
  ck_assert_str_eq (s->str, "obama 's dog does n't bark");   /* cut at max_src = 6 */
  ck_assert (PSM_AT (b2.src_mask, &b2, 0, 1) == 1.0f && PSM_AT (b2.src, &b2, 0, 1) == 1);
  /* invalid UTF-8 (a character cut short at the end) is read as U+FFFD */
  const char *cut[1] = { "Dog \xf0" };
  ck_assert (k->text_batch (t, cut, 1, &b2, NULL));
  ck_assert_int_eq (b2.T, 2);
  ck_assert_str_eq (k->token_text (t, &b2, 0, PSM_AT (b2.src_ext, &b2, 1, 0)), "\xef\xbf\xbd");
  g_string_free (s, TRUE);
  psm_batch_clear (&b);
  psm_batch_clear (&b2);
  k->destroy (t);
  k->destroy (t2);
  g_free (cfg);
  g_free (cfg2);
  g_free (cfg3);
  g_free (tr);
}
END_TEST

START_TEST (test_bad_files)
{
  char *bad = psm_test_write_file ("bad.jsonl", "{\"article\": \"x\"}\n[1, 2]\n{\"article\": \"\", \"highlights\": \"y\"}\n");
  char *tr = psm_test_write_file ("ok.jsonl", train_jsonl);
  char *cfg = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 8;", tr, bad);
  const PsmTaskClass *k;
  GError *e = NULL;
  ck_assert (make_task (&k, cfg, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.valid: ") && strstr (e->message, "bad.jsonl: no valid record (3 bad records, "
                                                                 "lines 1, 2, 3; first: no \"highlights\")"),
                 "%s", e->message);
  g_clear_error (&e);
  /* .source/.target: line-aligned; a short .target is an error */
  g_free (psm_test_write_file ("x.source", "a b c\nd e f\n"));
  g_free (psm_test_write_file ("x.target", "a b\n"));
  char *src = g_build_filename (psm_test_dir (), "x.source", NULL);
  char *cfg2 = g_strdup_printf ("plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 8;", tr, src);
  ck_assert (make_task (&k, cfg2, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "x.target: has fewer lines than"), "%s", e->message);
  g_clear_error (&e);
  g_free (psm_test_write_file ("x.target", "a b\nd d\n"));
  void *t = make_task (&k, cfg2, NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_VALID), 2);
  k->destroy (t);
  g_free (cfg);
  g_free (cfg2);
  g_free (src);
  g_free (tr);
  g_free (bad);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  Suite *s = suite_create ("task-cnndm");
  TCase *tc = tcase_create ("cnndm");
  tcase_add_test (tc, test_records_and_vocab);
  tcase_add_test (tc, test_bad_files);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
