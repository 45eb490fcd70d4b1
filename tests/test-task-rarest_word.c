/* test-task-rarest_word.c — targets follow the rarest-word rule, pointer
 * targets and switch as in §5.1, rare words read as <unk> (unk_words),
 * fixed evaluation sets, the geometric unigram distribution, bad config. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

static void *
make (const char *text, guint64 seed, gboolean check, const PsmTaskClass **tk)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "rarest_word");
  *tk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (text, "task", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  PsmTaskCtx ctx = { sizeof ctx, seed, check };
  GError *e = NULL;
  void *t = (*tk)->create (sec, &ctx, &e);
  ck_assert_msg (t, "%s", e ? e->message : "");
  return t;
}

START_TEST (test_targets)
{
  const PsmTaskClass *tk;
  void *t = make ("plugin = \"rarest_word\";", 1, FALSE, &tk);
  PsmTaskInfo info = { .size = sizeof info };
  tk->info (t, &info);
  ck_assert_int_eq (info.src_vocab, 601);
  ck_assert_int_eq (info.tgt_vocab, 541);   /* <unk> + 540 shortlist words */
  ck_assert_int_eq (info.max_src_len, 7);
  PsmBatch b;
  psm_batch_init (&b);
  PsmRng rng;
  psm_rng_seed (&rng, 9);
  int n_point = 0;
  for (int rep = 0; rep < 20; rep++) {
    ck_assert (tk->train_batch (t, 250, &rng, &b, NULL));
    ck_assert_int_eq (b.T, 7);
    ck_assert_int_eq (b.Ty, 1);
    for (int i = 0; i < b.B; i++) {
      int best = 0;
      for (int j = 0; j < 7; j++) {
        ck_assert (b.src_mask[j * b.B + i] == 1.0f);
        if (b.src[j * b.B + i] > b.src[best * b.B + i])
          best = j;
      }
      int word = b.src[best * b.B + i];
      ck_assert_int_eq (b.tgt_ext[i], word);
      if (word - 1 >= 540) {   /* one of the rarest 60 */
        n_point++;
        ck_assert (b.tgt_switch[i] == 0.0f);
        ck_assert_int_eq (b.tgt_loc[i], best);
        ck_assert_int_eq (b.tgt[i], 0);
      } else {
        ck_assert (b.tgt_switch[i] == 1.0f);
        ck_assert_int_eq (b.tgt_loc[i], -1);
        ck_assert_int_eq (b.tgt[i], word);
      }
    }
  }
  /* with p = 0.002 about a third of the targets are pointer words */
  ck_assert_msg (n_point > 1400 && n_point < 1900, "%d pointer targets of 5000", n_point);
  psm_batch_clear (&b);
  tk->destroy (t);
}
END_TEST

/* unk_words: the encoder's ids of the rarest words are <unk>; the extended
 * ids (what a pointer copies) and every target are those without it. */
START_TEST (test_unk_words)
{
  const PsmTaskClass *tk;
  void *plain = make ("test_size = 300;", 1, FALSE, &tk);
  void *unk = make ("test_size = 300; unk_words = 60;", 1, FALSE, &tk);
  PsmBatch a, u;
  psm_batch_init (&a);
  psm_batch_init (&u);
  ck_assert (tk->eval_batch (plain, PSM_SPLIT_TEST, 0, 300, &a, NULL));
  ck_assert (tk->eval_batch (unk, PSM_SPLIT_TEST, 0, 300, &u, NULL));
  int n_unk = 0;
  for (int i = 0; i < 7 * 300; i++) {
    int word = a.src[i];
    ck_assert_int_eq (u.src_ext[i], word);
    ck_assert_int_eq (u.src[i], word - 1 >= 540 ? 0 : word);
    n_unk += u.src[i] == 0;
  }
  ck_assert_msg (n_unk > 50, "%d <unk> inputs", n_unk);
  for (int b = 0; b < 300; b++) {
    ck_assert_int_eq (u.tgt[b], a.tgt[b]);
    ck_assert_int_eq (u.tgt_ext[b], a.tgt_ext[b]);
    ck_assert_int_eq (u.tgt_loc[b], a.tgt_loc[b]);
    ck_assert (u.tgt_switch[b] == a.tgt_switch[b]);
  }
  psm_batch_clear (&a);
  psm_batch_clear (&u);
  tk->destroy (plain);
  tk->destroy (unk);
}
END_TEST

START_TEST (test_fixed_eval_sets)
{
  const PsmTaskClass *tk;
  void *a = make ("valid_size = 50; test_size = 70;", 1, FALSE, &tk);
  void *c = make ("valid_size = 50; test_size = 70;", 99, FALSE, &tk);   /* another train seed */
  ck_assert_int_eq (tk->n_examples (a, PSM_SPLIT_VALID), 50);
  ck_assert_int_eq (tk->n_examples (a, PSM_SPLIT_TEST), 70);
  PsmBatch x, y;
  psm_batch_init (&x);
  psm_batch_init (&y);
  ck_assert (tk->eval_batch (a, PSM_SPLIT_TEST, 60, 32, &x, NULL));
  ck_assert_int_eq (x.B, 10);   /* cut at the end of the split */
  ck_assert (tk->eval_batch (c, PSM_SPLIT_TEST, 60, 32, &y, NULL));
  ck_assert (memcmp (x.src, y.src, 7 * 10 * sizeof (int32_t)) == 0);
  ck_assert (tk->eval_batch (a, PSM_SPLIT_VALID, 0, 10, &y, NULL));
  ck_assert (memcmp (x.src, y.src, 7 * 10 * sizeof (int32_t)) != 0);   /* valid != test */
  ck_assert_int_eq (x.example_id[3], 63);
  void *small = make ("", 1, TRUE, &tk);   /* --check keeps splits tiny */
  ck_assert_int_eq (tk->n_examples (small, PSM_SPLIT_TEST), 64);
  ck_assert_str_eq (tk->token_text (a, &x, 0, 0), "<unk>");
  ck_assert_str_eq (tk->token_text (a, &x, 0, 600), "w599");
  psm_batch_clear (&x);
  psm_batch_clear (&y);
  tk->destroy (a);
  tk->destroy (c);
  tk->destroy (small);
}
END_TEST

START_TEST (test_geometric)
{
  const PsmTaskClass *tk;
  void *t = make ("vocab = 50; length = 10; geometric_p = 0.1; pointer_words = 5;", 1, FALSE, &tk);
  PsmBatch b;
  psm_batch_init (&b);
  PsmRng rng;
  psm_rng_seed (&rng, 4);
  long count[51] = { 0 }, n = 0;
  for (int rep = 0; rep < 40; rep++) {
    tk->train_batch (t, 500, &rng, &b, NULL);
    for (int i = 0; i < b.B * b.T; i++, n++)
      count[b.src[i]]++;
  }
  /* P(w_k) = 0.1 * 0.9^k / (1 - 0.9^50) */
  double z = 1 - pow (0.9, 50);
  for (int k = 0; k < 5; k++) {
    double want = 0.1 * pow (0.9, k) / z, got = (double) count[k + 1] / n;
    ck_assert_msg (fabs (got - want) < 0.1 * want, "P(w%d) = %g, expected %g", k, got, want);
  }
  psm_batch_clear (&b);
  tk->destroy (t);
}
END_TEST

START_TEST (test_bad_config)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_TASK, "rarest_word");
  char *errs = NULL;
  ck_assert (!psm_test_section ("vocab = 1;\n  geometric_p = 1.5;", "task", d->params, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:2: task.vocab: value 1 out of range (expected [2, 1000000])"), "%s", errs);
  ck_assert_msg (strstr (errs, "inline.cfg:3: task.geometric_p: value 1.5 out of range"), "%s", errs);
  g_free (errs);
  const PsmSection *sec = psm_test_section ("vocab = 10;\n  pointer_words = 10;", "task", d->params, &errs);
  PsmTaskCtx ctx = { sizeof ctx, 1, FALSE };
  GError *e = NULL;
  ck_assert (((const PsmTaskClass *) d->klass)->create (sec, &ctx, &e) == NULL);
  ck_assert_str_eq (e->message, "inline.cfg:3: task.pointer_words: must be below task.vocab (10)");
  g_clear_error (&e);
  sec = psm_test_section ("vocab = 10; pointer_words = 2;\n  unk_words = 12;", "task", d->params, &errs);
  ck_assert (((const PsmTaskClass *) d->klass)->create (sec, &ctx, &e) == NULL);
  ck_assert_str_eq (e->message, "inline.cfg:3: task.unk_words: must be below task.vocab (10)");
  g_error_free (e);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("task-rarest_word");
  TCase *tc = tcase_create ("rarest_word");
  tcase_add_test (tc, test_targets);
  tcase_add_test (tc, test_unk_words);
  tcase_add_test (tc, test_fixed_eval_sets);
  tcase_add_test (tc, test_geometric);
  tcase_add_test (tc, test_bad_config);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
