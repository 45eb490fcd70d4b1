/* test-task-lm.c — the language-modelling task: <eos> after every line
 * (blank lines too), the vocabulary by count from the training split, saved
 * and read back; training streams and segments with the state kept between
 * them and dropped at a new epoch; evaluation scores every target exactly
 * once whatever the number of streams; overlapping training segments
 * (stride < bptt) score every target once an epoch and advance by the
 * stride; the training cursor and a seek back to it (--resume) give the
 * same next batch; through a model (pointer sentinel) each scored position
 * gets the loss it gets with one-word segments side by side: the state and
 * the window's history are carried from inside the overlapping segment;
 * unknown words mapped to <unk>, or
 * an error naming file and line without one; the real PTB's published
 * counts when ../shared/data is there. */
#include "config.h"
#include <math.h>
#include <string.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include <psm/psm-pipeline.h>


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
  char *tr = psm_test_write_file ("train.txt", train_txt);
  char *va = psm_test_write_file ("valid.txt", "a b zebra\nc\n");
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
    ck_assert (psm_task_train_batch (k, t, 2, &rng, &b, NULL));
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
      ck_assert (psm_task_eval_batch (k, t, PSM_SPLIT_VALID, seg, B, &b, NULL));
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
  ck_assert (k->save (t, psm_test_dir (), NULL));
  void *t2 = make_task (&k, cfg, psm_test_dir (), &e);
  ck_assert_msg (t2, "%s", e ? e->message : "");
  for (int i = 0; i < 5; i++)
    ck_assert_str_eq (k->token_text (t2, &b, 0, i), order[i]);
  k->destroy (t2);
  char *vp = g_build_filename (psm_test_dir (), "vocab.txt", NULL);
  g_unlink (vp);
  g_free (vp);
  psm_batch_clear (&b);
  k->destroy (t);
  g_free (cfg);
  g_free (tr);
  g_free (va);
}
END_TEST

START_TEST (test_stride)
{
  char *tr = psm_test_write_file ("train.txt", train_txt);
  const PsmTaskClass *k;
  GError *e = NULL;
  for (int stride = 1; stride <= 3; stride++) {
    char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3; "
                                 "stride = %d;", tr, tr, tr, stride);
    void *t = make_task (&k, cfg, NULL, &e);
    ck_assert_msg (t, "%s", e ? e->message : "");
    PsmBatch b;
    psm_batch_init (&b);
    PsmRng rng;
    psm_rng_seed (&rng, 1);
    /* 2 streams of 6 words, 5 targets each: segment j covers [j stride,
     * j stride + 3), scoring all of segment 0 and then the last `stride`
     * positions, until every target is scored once */
    int per_epoch = stride == 1 ? 3 : 2;
    for (int epoch = 0; epoch < 2; epoch++) {
      int scored[2][5] = { { 0 } };
      for (int j = 0; j < per_epoch; j++) {
        ck_assert (psm_task_train_batch (k, t, 2, &rng, &b, NULL));
        int off = j * stride, T = MIN (3, 5 - off);
        ck_assert_int_eq (b.T, T);
        ck_assert_int_eq (b.advance, stride < T ? stride : 0);
        for (int r = 0; r < 2; r++) {
          ck_assert (b.keep[r] == (j ? 1.0f : 0.0f));
          for (int i = 0; i < T; i++) {
            ck_assert (PSM_AT (b.src_mask, &b, i, r) == 1.0f);
            if (i > 0)   /* one stream: each position's input is the previous target */
              ck_assert_int_eq (PSM_AT (b.src, &b, i, r), PSM_AT (b.tgt, &b, i - 1, r));
            float want = j == 0 || i >= 3 - stride ? 1.0f : 0.0f;
            ck_assert_msg (PSM_AT (b.tgt_mask, &b, i, r) == want, "stride %d segment %d position %d", stride, j, i);
            if (want > 0)
              scored[r][off + i]++;
          }
        }
      }
      for (int r = 0; r < 2; r++)
        for (int p = 0; p < 5; p++)
          ck_assert_msg (scored[r][p] == 1, "stride %d stream %d target %d scored %d times", stride, r, p,
                         scored[r][p]);
    }
    psm_batch_clear (&b);
    k->destroy (t);
    g_free (cfg);
  }
  /* the training cursor: a new task seeking to it gives the batch the
   * first would have given next; a cursor beyond the data is refused */
  char *c2 = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3; "
                              "stride = 2;", tr, tr, tr);
  void *t1 = make_task (&k, c2, NULL, &e), *t2 = make_task (&k, c2, NULL, &e);
  ck_assert (t1 && t2 && k->train_cursor && k->train_seek);
  PsmBatch b1, b2;
  psm_batch_init (&b1);
  psm_batch_init (&b2);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  for (int j = 0; j < 3; j++) {
    /* t1 walks on; t2 seeks to where t1 stands; both give the same batch */
    ck_assert (k->train_seek (t2, 2, k->train_cursor (t1), &e));
    ck_assert (psm_task_train_batch (k, t1, 2, &rng, &b1, NULL) && psm_task_train_batch (k, t2, 2, &rng, &b2, NULL));
    ck_assert_int_eq (k->train_cursor (t1), j == 2 ? 1 : j + 1);   /* 2 segments an epoch, then again */
    ck_assert (b1.T == b2.T && b1.advance == b2.advance && b1.keep[0] == b2.keep[0]);
    ck_assert (memcmp (b1.src, b2.src, (size_t) b1.T * 2 * sizeof (int32_t)) == 0);
    ck_assert (memcmp (b1.tgt_mask, b2.tgt_mask, (size_t) b1.T * 2 * sizeof (float)) == 0);
  }
  ck_assert (!k->train_seek (t2, 2, 3, &e));
  ck_assert_msg (strstr (e->message, "segment 3) is outside this training data's 2 segments of 2 streams"), "%s",
                 e->message);
  g_clear_error (&e);
  ck_assert (!k->train_seek (t2, 2, -1, &e));
  g_clear_error (&e);
  psm_batch_clear (&b1);
  psm_batch_clear (&b2);
  k->destroy (t1);
  k->destroy (t2);
  g_free (c2);
  /* a stride beyond bptt would skip words */
  char *bad = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = 3; "
                               "stride = 4;", tr, tr, tr);
  ck_assert (!make_task (&k, bad, NULL, &e));
  ck_assert_msg (e && strstr (e->message, "stride 4 is longer than bptt 3"), "%s", e ? e->message : "");
  g_clear_error (&e);
  g_free (bad);
  g_free (tr);
}
END_TEST

/* A model of pipeline text cfg (plugin path set) with a no-grad graph. */
static PsmModel *
make_model (const char *cfg, PsmPipeline **pl)
{
  char *path = psm_test_write_file ("model.cfg", cfg);
  GError *e = NULL;
  *pl = psm_pipeline_load (path, NULL, &e);
  ck_assert_msg (*pl, "%s", e ? e->message : "");
  PsmModel *m = psm_model_new (*pl, FALSE, &e);
  ck_assert_msg (m, "%s", e ? e->message : "");
  g_free (path);
  return m;
}

/* The mean loss of the model's next training batch of B streams. */
static double
next_loss (PsmModel *m, int B, PsmBatch *b)
{
  const PsmTaskClass *k;
  void *task = psm_model_task (m, &k);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (psm_task_train_batch (k, task, B, &rng, b, NULL));
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  double v = psm_model_loss (m, g, b)->data[0];
  psm_graph_free (g);
  return v;
}

START_TEST (test_stride_model)
{
  /* 2 streams of 60 words from 7 */
  GString *text = g_string_new (NULL);
  for (int i = 0; i < 119; i++)
    g_string_append_printf (text, "w%d%s", (i * 5 + i / 7) % 7, i % 9 == 8 ? "\n" : " ");
  g_string_append (text, "\n");
  char *tr = psm_test_write_file ("train.txt", text->str);
  g_string_free (text, TRUE);
  const char *fmt = "task = { plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; bptt = %d; stride = %d; };\n"
                    "model = { embedding = { dim = 6; init_scale = 0.5; };\n"
                    "  encoder = { plugin = \"lstm_lm\"; hidden = 5; layers = 2; init_scale = 0.5; };\n"
                    "  head = { plugin = \"pointer_sentinel\"; window = 6; }; };\n"
                    "train = { batch = 2; seed = 3; };\nrun = { dir = \"%s/run\"; };\n";
  char *ca = g_strdup_printf (fmt, tr, tr, tr, 4, 1, psm_test_dir ()), *cb = g_strdup_printf (fmt, tr, tr, tr, 1, 0, psm_test_dir ());
  PsmPipeline *pa, *pb;
  PsmModel *ma = make_model (ca, &pa), *mb = make_model (cb, &pb);
  PsmParams *qa = psm_model_params (ma), *qb = psm_model_params (mb);
  ck_assert_int_eq (psm_params_size (qa), psm_params_size (qb));
  ck_assert (memcmp (psm_params_data (qa), psm_params_data (qb), psm_params_size (qa) * sizeof (float)) == 0);
  /* one-word segments: the loss at every position of the two streams */
  PsmBatch b;
  psm_batch_init (&b);
  double ref[40];
  for (int p = 0; p < 40; p++)
    ref[p] = next_loss (mb, 2, &b);
  /* k1 = 1, k2 = 4: segment 0 scores positions 0..3, segment j position j + 3 */
  double first = next_loss (ma, 2, &b);
  ck_assert_int_eq (b.advance, 1);
  ck_assert_msg (fabs (first - (ref[0] + ref[1] + ref[2] + ref[3]) / 4) < 1e-5, "segment 0: %g", first);
  for (int j = 1; j + 3 < 40; j++) {
    double l = next_loss (ma, 2, &b);
    ck_assert_msg (fabs (l - ref[j + 3]) < 1e-5, "segment %d: %g, one-word segments %g", j, l, ref[j + 3]);
  }
  psm_batch_clear (&b);
  psm_model_free (ma);
  psm_model_free (mb);
  psm_pipeline_free (pa);
  psm_pipeline_free (pb);
  g_free (ca);
  g_free (cb);
  g_free (tr);
}
END_TEST

START_TEST (test_bad_input)
{
  const PsmTaskClass *k;
  GError *e = NULL;
  /* no <unk> in the training words: an unknown word is an error at its line */
  char *tr = psm_test_write_file ("nounk.txt", "a b\nb a\n");
  char *va = psm_test_write_file ("v2.txt", "a\nb zebra a\n");
  char *cfg = g_strdup_printf ("plugin = \"lm\"; train = \"%s\"; valid = \"%s\"; test = \"%s\";", tr, va, tr);
  ck_assert (make_task (&k, cfg, NULL, &e) == NULL);
  ck_assert_msg (strstr (e->message, "task.valid: ") && strstr (e->message, "v2.txt:2: the word 'zebra'"), "%s",
                 e->message);
  g_clear_error (&e);
  g_free (cfg);
  /* an empty training file */
  char *empty = psm_test_write_file ("empty.txt", "");
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
  Suite *s = suite_create ("task-lm");
  TCase *tc = tcase_create ("lm");
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_vocab_and_streams);
  tcase_add_test (tc, test_stride);
  tcase_add_test (tc, test_stride_model);
  tcase_add_test (tc, test_bad_input);
  tcase_add_test (tc, test_ptb_counts);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
