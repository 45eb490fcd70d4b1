/* test-task-lm.c — the language-modelling task: <eos> after every line
 * (blank lines too), the vocabulary by count from the training split, saved
 * and read back; training streams and segments with the state kept between
 * them and dropped at a new epoch; evaluation scores every target exactly
 * once whatever the number of streams; unknown words mapped to <unk>, or
 * an error naming file and line without one; the real PTB's published
 * counts when ../shared/data is there. */
#include "config.h"
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include <psm/psm-pipeline.h>

static char *dir;

static char *
write_file (const char *name, const char *text)
{
  char *p = g_build_filename (dir, name, NULL);
  ck_assert (g_file_set_contents (p, text, -1, NULL));
  return p;
}

static void *
make_task (const PsmTaskClass **k, const char *cfg, const char *run_dir, GError **e)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "lm");
  *k = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "task", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  PsmTaskCtx ctx = { sizeof ctx, 1, FALSE, run_dir, FALSE };
  return (*k)->create (sec, &ctx, e);
}

/* 10 words + 3 <eos> = 13; "b" 4 times, "a" 3, <eos> 3, "c" 2, "<unk>" 1 */
static const char *train_txt = "a b c b <unk>\n\nb a c b a\n";

START_TEST (test_vocab_and_streams)
{
  char *tr = write_file ("train.txt", train_txt);
  char *va = write_file ("valid.txt", "a b zebra\nc\n");
  char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3;", tr, va,
                               va);
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, cfg, NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  PsmTaskInfo info;
  memset (&info, 0, sizeof info);
  info.size = sizeof info;
  k->info (t, &info);
  ck_assert (info.streams);
  ck_assert_int_eq (info.tgt_vocab, 5);
  ck_assert_int_eq (info.max_src_len, 3);
  PsmBatch b;
  psm_batch_init (&b);
  const char *order[5] = { "b", "<eos>", "a", "c", "<unk>" };   /* by count, ties by the word */
  for (int i = 0; i < 5; i++)
    ck_assert_str_eq (k->token_text (t, &b, 0, i), order[i]);
  ck_assert_int_eq (info.unk_id, 4);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 12);
  /* training: 2 streams of 6 words (5 targets each; the 13th word dropped),
   * segments of 3 and 2 */
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  const char *words[13] = { "a", "b", "c", "b", "<unk>", "<eos>", "<eos>", "b", "a", "c", "b", "a", "<eos>" };
  for (int seg = 0; seg < 5; seg++) {
    ck_assert (k->train_batch (t, 2, &rng, &b, NULL));
    int s = seg % 2, T = s ? 2 : 3;   /* two segments an epoch, then again from the start */
    ck_assert_int_eq (b.B, 2);
    ck_assert_int_eq (b.T, T);
    ck_assert_int_eq (b.Ty, T);
    for (int r = 0; r < 2; r++) {
      ck_assert (b.keep[r] == (s ? 1.0f : 0.0f));
      for (int i = 0; i < T; i++) {
        int at = r * 6 + s * 3 + i;
        ck_assert_str_eq (k->token_text (t, &b, r, PSM_AT (b.src, &b, i, r)), words[at]);
        ck_assert_str_eq (k->token_text (t, &b, r, PSM_AT (b.tgt, &b, i, r)), words[at + 1]);
        ck_assert (PSM_AT (b.src_mask, &b, i, r) == 1.0f && PSM_AT (b.tgt_mask, &b, i, r) == 1.0f);
      }
    }
  }
  /* evaluation: "a b zebra <eos> c <eos>", zebra -> <unk>; 5 targets, each
   * once, for any number of streams */
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_VALID), 5);
  for (int B = 1; B <= 6; B++) {
    int seen[6] = { 0 }, n = 0;
    for (int seg = 0;; seg++) {
      ck_assert (k->eval_batch (t, PSM_SPLIT_VALID, seg, B, &b, NULL));
      if (b.T == 0)
        break;
      for (int r = 0; r < B; r++) {
        ck_assert (b.keep[r] == (seg ? 1.0f : 0.0f));
        for (int i = 0; i < b.T; i++)
          if (PSM_AT (b.tgt_mask, &b, i, r) > 0) {
            n++;
            seen[PSM_AT (b.tgt, &b, i, r)]++;
          }
      }
      ck_assert (seg < 10);
    }
    ck_assert_int_eq (n, 5);
    ck_assert_int_eq (seen[1], 2);   /* <eos> twice */
    ck_assert_int_eq (seen[4], 1);   /* zebra as <unk> */
  }
  /* save and read back the vocabulary */
  ck_assert (k->save (t, dir, NULL));
  void *t2 = make_task (&k, cfg, dir, &e);
  ck_assert_msg (t2, "%s", e ? e->message : "");
  for (int i = 0; i < 5; i++)
    ck_assert_str_eq (k->token_text (t2, &b, 0, i), order[i]);
  k->destroy (t2);
  char *vp = g_build_filename (dir, "vocab.txt", NULL);
  g_unlink (vp);
  g_free (vp);
  psm_batch_clear (&b);
  k->destroy (t);
  g_free (cfg);
  g_free (tr);
  g_free (va);
}
END_TEST

START_TEST (test_bad_input)
{
  const PsmTaskClass *k;
  GError *e = NULL;
  /* no <unk> in the training words: an unknown word is an error at its line */
  char *tr = write_file ("nounk.txt", "a b\nb a\n");
  char *va = write_file ("v2.txt", "a\nb zebra a\n");
  char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\";", tr, va, tr);
  ck_assert (make_task (&k, cfg, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.valid: ") && strstr (e->message, "v2.txt:2: the word 'zebra'"), "%s",
                 e->message);
  g_clear_error (&e);
  g_free (cfg);
  /* an empty training file */
  char *empty = write_file ("empty.txt", "");
  cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\";", empty, tr, tr);
  ck_assert (make_task (&k, cfg, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "empty.txt: no words"), "%s", e->message);
  g_clear_error (&e);
  g_free (cfg);
  g_free (tr);
  g_free (va);
  g_free (empty);
}
END_TEST

START_TEST (test_ptb_counts)
{
  char *data = g_getenv ("PSM_DATA") ? g_strdup (g_getenv ("PSM_DATA"))
                                     : g_build_filename (PSM_TEST_SRCDIR, "..", "shared", "data", NULL);
  char *tr = g_build_filename (data, "ptb", "ptb.train.txt", NULL);
  if (!g_file_test (tr, G_FILE_TEST_EXISTS)) {
    fprintf (stderr, "test_ptb_counts: %s absent, skipped\n", tr);
    g_free (tr);
    g_free (data);
    return;
  }
  char *va = g_build_filename (data, "ptb", "ptb.valid.txt", NULL);
  char *te = g_build_filename (data, "ptb", "ptb.test.txt", NULL);
  char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\";", tr, va, te);
  const PsmTaskClass *k;
  GError *e = NULL;
  void *t = make_task (&k, cfg, NULL, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  PsmTaskInfo info;
  memset (&info, 0, sizeof info);
  info.size = sizeof info;
  k->info (t, &info);
  ck_assert_int_eq (info.tgt_vocab, 10000);   /* exactly PTB's words */
  /* MANIFEST.md: 929,589 / 73,760 / 82,430 words with <eos>; one fewer target */
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TRAIN), 929589 - 1);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_VALID), 73760 - 1);
  ck_assert_int_eq (k->n_examples (t, PSM_SPLIT_TEST), 82430 - 1);
  k->destroy (t);
  g_free (cfg);
  g_free (tr);
  g_free (va);
  g_free (te);
  g_free (data);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  dir = g_dir_make_tmp ("psm-lm-XXXXXX", NULL);
  Suite *s = suite_create ("task-lm");
  TCase *tc = tcase_create ("lm");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_vocab_and_streams);
  tcase_add_test (tc, test_bad_input);
  tcase_add_test (tc, test_ptb_counts);
  suite_add_tcase (s, tc);
  int rc = psm_test_run (s);
  char *cmd = g_strdup_printf ("rm -rf '%s'", dir);
  if (system (cmd) != 0)
    rc = 1;
  g_free (cmd);
  return rc;
}
