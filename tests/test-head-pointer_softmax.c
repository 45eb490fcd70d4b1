/* test-head-pointer_softmax.c — the pointer softmax head: loss against
 * eq. 6-7 computed by hand, gradient check of every parameter and input,
 * decoding scores, and bad configs; the same on an attention decoder
 * (seq2seq: x_t = [s_t; c_t; y_(t-1)], the attention as the location
 * softmax) over several target steps, one of them masked. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { B = 4, T = 5, HS = 6, HA = 3, V = 7 };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  float state[B * HS], gstate[B * HS];
  float ann[T * B * HA], gann[T * B * HA];
  float mask[T * B];
  int32_t src[T * B];
  PsmBatch batch;
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, V, 10, T, 1, -1, -1, 0 };

static void
setup (Fix *f, const char *location)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_softmax");
  f->hk = d->klass;
  char *text = g_strdup_printf ("plugin = \"pointer_softmax\"; hidden = 5; attn_dim = 4; switch_hidden = 3; "
                                "location = \"%s\"; temperature = 2.0;", location);
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (text, "model.head", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  g_free (text);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "head.", &info, 8, HA, HS, HS, 0, FALSE };
  GError *e = NULL;
  f->head = f->hk->create (sec, &ctx, &e);
  ck_assert_msg (f->head, "create: %s", e ? e->message : "?");
  PsmRng rng;
  psm_rng_seed (&rng, 11);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  /* move every parameter off its init so no gradient is trivially zero */
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.5f, &rng);
  psm_test_fill (f->state, B * HS, 1.0f, &rng);
  psm_test_fill (f->ann, T * B * HA, 1.0f, &rng);
  psm_batch_init (&f->batch);
  psm_batch_reserve (&f->batch, B, T, 1);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      /* example 3 has only 3 real positions */
      f->mask[t * B + b] = (b == 3 && t >= 3) ? 0.0f : 1.0f;
      f->src[t * B + b] = 1 + (t * 3 + b) % 9;
      f->batch.src[t * B + b] = f->batch.src_ext[t * B + b] = f->src[t * B + b];
      f->batch.src_mask[t * B + b] = f->mask[t * B + b];
    }
  /* b0, b2: shortlist targets; b1, b3: pointer targets */
  int32_t tgt[B] = { 3, 0, 6, 0 }, loc[B] = { -1, 4, -1, 2 };
  float sw[B] = { 1, 0, 1, 0 };
  for (int b = 0; b < B; b++) {
    f->batch.tgt[b] = tgt[b];
    f->batch.tgt_loc[b] = loc[b];
    f->batch.tgt_switch[b] = sw[b];
    f->batch.tgt_mask[b] = 1.0f;
    f->batch.tgt_ext[b] = sw[b] ? tgt[b] : f->src[loc[b] * B + b];
  }
}

static void
teardown (Fix *f)
{
  f->hk->destroy (f->head);
  psm_params_free (f->params);
  psm_batch_clear (&f->batch);
}

static void
make_inputs (Fix *f, PsmGraph *g, PsmEncoding *enc, PsmDecOut *out)
{
  int as[3] = { T, B, HA }, ss[3] = { 1, B, HS };
  memset (enc, 0, sizeof *enc);
  enc->T = T;
  enc->B = B;
  enc->mask = f->mask;
  enc->src = f->src;
  enc->annotations = psm_tensor_wrap (g, f->ann, f->gann, 3, as);
  memset (out, 0, sizeof *out);
  out->Ty = 1;
  out->B = B;
  out->state = psm_tensor_wrap (g, f->state, f->gstate, 3, ss);
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmEncoding enc;
  PsmDecOut out;
  make_inputs (f, g, &enc, &out);
  return f->hk->loss (f->head, g, f->params, &enc, &out, &f->batch);
}

static void
check_head (const char *location)
{
  Fix f;
  setup (&f, location);
  psm_test_gradcheck ("pointer_softmax params", f_loss, &f, psm_params_data (f.params),
                      psm_params_grad (f.params), psm_params_size (f.params), 1e-2f, 2e-3, 2e-2, 400);
  psm_test_gradcheck ("pointer_softmax state", f_loss, &f, f.state, f.gstate, B * HS, 1e-2f, 2e-3, 2e-2, 400);
  if (strcmp (location, "pointer") == 0)
    psm_test_gradcheck ("pointer_softmax annotations", f_loss, &f, f.ann, f.gann, T * B * HA, 1e-2f,
                        2e-3, 2e-2, 400);

  /* The loss is eq. 6-7 averaged: recompute it from the decoding scores,
   * which hold log d + log w and log(1 - d) + log l. */
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding enc;
  PsmDecOut out;
  make_inputs (&f, g, &enc, &out);
  float loss = f.hk->loss (f.head, g, f.params, &enc, &out, &f.batch)->data[0];
  PsmTensor *sc = f.hk->scores (f.head, g, f.params, &enc, &out, &f.batch);
  int S = f.hk->space_size (f.head, &f.batch);
  ck_assert_int_eq (S, V + T);
  ck_assert_int_eq (psm_tensor_cols (sc), S);
  double want = 0.0;
  for (int b = 0; b < B; b++) {
    const float *row = sc->data + b * S;
    double total = 0.0;
    for (int s = 0; s < S; s++)
      if (isfinite (row[s]))
        total += exp (row[s]);
    ck_assert_msg (fabs (total - 1.0) < 1e-4, "scores of row %d sum to %g, not 1", b, total);
    if (b == 3)
      for (int j = 3; j < T; j++)
        ck_assert_msg (isinf (row[V + j]) && row[V + j] < 0, "padding position %d must score -inf", j);
    int slot = f.batch.tgt_switch[b] ? f.batch.tgt[b] : V + f.batch.tgt_loc[b];
    want -= row[slot];
    ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, b, slot), f.batch.tgt_ext[b]);
  }
  want /= B;
  ck_assert_msg (fabs (want - loss) < 1e-4, "loss %g, eq. 6-7 give %g", loss, want);
  psm_graph_free (g);
  teardown (&f);
}

START_TEST (test_summary_location) { check_head ("summary"); }
END_TEST

START_TEST (test_pointer_location) { check_head ("pointer"); }
END_TEST

START_TEST (test_bad_config)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_softmax");
  char *errs = NULL;
  ck_assert (!psm_test_section ("plugin = \"pointer_softmax\";\n  temperature = 0.0;", "model.head", d->params, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:3: model.head.temperature: value 0 out of range (expected [0.01, 100])"), "%s", errs);
  g_free (errs);
  ck_assert (!psm_test_section ("location = \"nowhere\";\n  tempreature = 2.0;", "model.head", d->params, &errs));
  ck_assert_msg (strstr (errs, "inline.cfg:2: model.head.location: unknown value \"nowhere\" (expected one of pointer|summary)"), "%s", errs);
  ck_assert_msg (strstr (errs, "inline.cfg:3: model.head.tempreature: unknown key"), "%s", errs);
  g_free (errs);
}
END_TEST

/* ---- on an attention decoder ---- */

enum { TY = 3, SB = 2, ST = 4, SS = 4, SC = 3, SE = 2, SV = 6 };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  float state[TY * SB * SS], gstate[TY * SB * SS];
  float ctx[TY * SB * SC], gctx[TY * SB * SC];
  float in[TY * SB * SE], gin[TY * SB * SE];
  float e[TY * SB * ST], ge[TY * SB * ST];     /* attention logits */
  float mask[ST * SB], amask[TY * SB * ST];
  PsmBatch batch;
  gboolean noise;      /* the training rng, the same draws every evaluation */
  PsmRng rng0;
} S2s;

static PsmTaskInfo s2s_info = { sizeof (PsmTaskInfo), 10, SV, 10, ST, TY, -1, -1, 0 };

static void
s2s_setup (S2s *f, const char *extra)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_softmax");
  memset (f, 0, sizeof *f);
  f->hk = d->klass;
  char *errs = NULL;
  char *text = g_strdup_printf ("plugin = \"pointer_softmax\"; hidden = 5; switch_hidden = 3; %s", extra);
  const PsmSection *sec = psm_test_section (text, "model.head", d->params, &errs);
  g_free (text);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "head.", &s2s_info, SE, 6, 6, SS, SC, TRUE };
  GError *e = NULL;
  f->head = f->hk->create (sec, &ctx, &e);
  ck_assert_msg (f->head, "create: %s", e ? e->message : "?");
  PsmRng rng;
  psm_rng_seed (&rng, 13);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.5f, &rng);
  psm_test_fill (f->state, TY * SB * SS, 1.0f, &rng);
  psm_test_fill (f->ctx, TY * SB * SC, 1.0f, &rng);
  psm_test_fill (f->in, TY * SB * SE, 1.0f, &rng);
  psm_test_fill (f->e, TY * SB * ST, 1.0f, &rng);
  psm_batch_init (&f->batch);
  psm_batch_reserve (&f->batch, SB, ST, TY);
  for (int t = 0; t < ST; t++)
    for (int b = 0; b < SB; b++) {
      f->mask[t * SB + b] = (b == 1 && t == 3) ? 0.0f : 1.0f;   /* example 1: 3 positions */
      f->batch.src[t * SB + b] = f->batch.src_ext[t * SB + b] = 1 + t + 2 * b;
      f->batch.src_mask[t * SB + b] = f->mask[t * SB + b];
    }
  for (int r = 0; r < TY * SB; r++)
    for (int j = 0; j < ST; j++)
      f->amask[r * ST + j] = f->mask[j * SB + r % SB];
  /* [t, b]: shortlist, point, point / shortlist, point, masked */
  int32_t tgt[TY * SB] = { 3, 2, 0, 0, 1, 0 }, loc[TY * SB] = { -1, -1, 2, 1, 0, -1 };
  float sw[TY * SB] = { 1, 1, 0, 0, 0, 1 }, m[TY * SB] = { 1, 1, 1, 1, 1, 0 };
  for (int r = 0; r < TY * SB; r++) {
    f->batch.tgt[r] = tgt[r];
    f->batch.tgt_loc[r] = loc[r];
    f->batch.tgt_switch[r] = sw[r];
    f->batch.tgt_mask[r] = m[r];
    f->batch.tgt_ext[r] = sw[r] ? tgt[r] : f->batch.src_ext[loc[r] * SB + r % SB];
  }
}

/* The decoder outputs of steps [t0, t0 + n) (gradients only for the whole). */
static void
s2s_inputs (S2s *f, PsmGraph *g, int t0, int n, PsmEncoding *enc, PsmDecOut *out)
{
  gboolean all = t0 == 0 && n == TY;
  int ss[3] = { n, SB, SS }, cs[3] = { n, SB, SC }, is[3] = { n, SB, SE }, es[2] = { n * SB, ST },
      as[3] = { n, SB, ST };
  memset (enc, 0, sizeof *enc);
  enc->T = ST;
  enc->B = SB;
  enc->mask = f->mask;
  enc->src = f->batch.src;
  memset (out, 0, sizeof *out);
  out->Ty = n;
  out->B = SB;
  out->state = psm_tensor_wrap (g, f->state + t0 * SB * SS, all ? f->gstate : NULL, 3, ss);
  out->context = psm_tensor_wrap (g, f->ctx + t0 * SB * SC, all ? f->gctx : NULL, 3, cs);
  out->input = psm_tensor_wrap (g, f->in + t0 * SB * SE, all ? f->gin : NULL, 3, is);
  PsmTensor *a = psm_masked_softmax (g, psm_tensor_wrap (g, f->e + t0 * SB * ST, all ? f->ge : NULL, 2, es),
                                     f->amask + t0 * SB * ST);
  out->attn = psm_tensor_reshape (g, a, 3, as);
}

static PsmTensor *
s2s_loss (PsmGraph *g, void *ud)
{
  S2s *f = ud;
  PsmEncoding enc;
  PsmDecOut out;
  s2s_inputs (f, g, 0, TY, &enc, &out);
  PsmRng r = f->rng0;
  if (f->noise)
    psm_graph_set_rng (g, &r);
  PsmTensor *loss = f->hk->loss (f->head, g, f->params, &enc, &out, &f->batch);
  psm_graph_set_rng (g, NULL);
  return loss;
}

/* The seq2seq head with extra settings (and the batch's candidates, n of
 * them, if n > 0): gradients, and the loss against the decoding scores. */
static void
check_seq2seq (const char *extra, const int32_t *cand, int n_cand, gboolean noise)
{
  S2s f;
  s2s_setup (&f, extra);
  if (n_cand)
    psm_batch_set_candidates (&f.batch, cand, n_cand);
  int nv = n_cand ? n_cand : SV;
  f.noise = noise;
  psm_rng_seed (&f.rng0, 77);
  if (noise) {   /* larger weights: switch units saturate, where the noise acts */
    float *w = psm_params_data (f.params);
    for (size_t i = 0; i < psm_params_size (f.params); i++)
      w[i] *= 3.0f;
  }
  /* the maxout units of the deep output and the relu units of the switch
   * have kinks: a step of 1e-2 can carry a unit across one (its one-sided
   * slopes then disagree), 1e-3 seldom does */
  float eps = 1e-3f;
  psm_test_gradcheck ("pointer_softmax seq2seq params", s2s_loss, &f, psm_params_data (f.params),
                      psm_params_grad (f.params), psm_params_size (f.params), eps, 2e-3, 2e-2, 400);
  psm_test_gradcheck ("pointer_softmax seq2seq state", s2s_loss, &f, f.state, f.gstate, TY * SB * SS, eps, 2e-3,
                      2e-2, 400);
  psm_test_gradcheck ("pointer_softmax seq2seq context", s2s_loss, &f, f.ctx, f.gctx, TY * SB * SC, eps, 2e-3,
                      2e-2, 400);
  psm_test_gradcheck ("pointer_softmax seq2seq input", s2s_loss, &f, f.in, f.gin, TY * SB * SE, eps, 2e-3, 2e-2,
                      400);
  psm_test_gradcheck ("pointer_softmax seq2seq attention", s2s_loss, &f, f.e, f.ge, TY * SB * ST, eps, 2e-3,
                      2e-2, 400);
  if (noise) {   /* the noise reaches the loss */
    PsmGraph *g = psm_graph_new ();
    float a = s2s_loss (g, &f)->data[0];
    f.noise = FALSE;
    float b = s2s_loss (g, &f)->data[0];
    ck_assert_msg (a != b, "noisy switch: the same loss with and without noise");
    psm_graph_free (g);
    f.hk->destroy (f.head);
    psm_params_free (f.params);
    psm_batch_clear (&f.batch);
    return;
  }
  /* the loss over all steps is the mean over real target steps of
   * -log p(y, z) read off each step's decoding scores */
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding enc;
  PsmDecOut out;
  s2s_inputs (&f, g, 0, TY, &enc, &out);
  float loss = f.hk->loss (f.head, g, f.params, &enc, &out, &f.batch)->data[0];
  double want = 0.0, W = 0.0;
  for (int t = 0; t < TY; t++) {
    s2s_inputs (&f, g, t, 1, &enc, &out);
    PsmTensor *sc = f.hk->scores (f.head, g, f.params, &enc, &out, &f.batch);
    PsmTensor *d = f.hk->gate (f.head, g, f.params, &enc, &out, &f.batch);
    int S = f.hk->space_size (f.head, &f.batch);
    ck_assert_int_eq (S, nv + ST);
    PsmTensor *full = NULL;   /* with candidates: the scores over the whole shortlist */
    if (n_cand) {
      f.batch.n_cand = 0;
      full = f.hk->scores (f.head, g, f.params, &enc, &out, &f.batch);
      f.batch.n_cand = n_cand;
    }
    for (int b = 0; b < SB; b++) {
      const float *row = sc->data + b * S;
      double total = 0.0, shortlist = 0.0;
      for (int k = 0; k < S; k++)
        if (isfinite (row[k])) {
          total += exp (row[k]);
          shortlist += k < nv ? exp (row[k]) : 0.0;
        }
      ck_assert_msg (fabs (total - 1.0) < 1e-4, "step %d row %d: scores sum to %g", t, b, total);
      ck_assert_msg (fabs (shortlist - d->data[b]) < 1e-4, "the gate is the shortlist's mass");
      if (b == 1)
        ck_assert (isinf (row[nv + 3]) && row[nv + 3] < 0);   /* padding */
      if (full) {
        /* the candidates' softmax is the whole one renormalised over them */
        const float *fr = full->data + b * (SV + ST);
        double z = 0.0;
        for (int k = 0; k < n_cand; k++)
          z += exp (fr[cand[k]]);
        for (int k = 0; k < n_cand; k++) {
          double want_k = fr[cand[k]] - log (z) + log (d->data[b]);
          ck_assert_msg (fabs (row[k] - want_k) < 1e-4, "candidate %d: %g, the renormalised softmax %g", k, row[k],
                         want_k);
          ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, b, k), cand[k]);
        }
        for (int j = 0; j < ST; j++)
          ck_assert (fabs (row[nv + j] - fr[SV + j]) < 1e-5 || (isinf (row[nv + j]) && isinf (fr[SV + j])));
      }
      int r = t * SB + b;
      if (f.batch.tgt_mask[r] == 0.0f)
        continue;
      int slot = f.batch.tgt_switch[r] ? psm_batch_cand_index (&f.batch, f.batch.tgt[r]) : nv + f.batch.tgt_loc[r];
      want -= row[slot];
      W += 1.0;
      ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, b, slot), f.batch.tgt_ext[r]);
    }
  }
  ck_assert_msg (fabs (want / W - loss) < 1e-4, "loss %g, eq. 6-7 give %g", loss, want / W);
  psm_graph_free (g);
  f.hk->destroy (f.head);
  psm_params_free (f.params);
  psm_batch_clear (&f.batch);
}

/* The default shortlist is eq. 3's deep output, maxout units over
 * [s_t; c_t; y_(t-1)]; then tanh units over [s_t; c_t], and each change
 * alone. */
START_TEST (test_seq2seq)
{
  check_seq2seq ("", NULL, 0, FALSE);
  check_seq2seq ("activation = \"tanh\"; prev_word = false;", NULL, 0, FALSE);
  check_seq2seq ("activation = \"tanh\";", NULL, 0, FALSE);
  check_seq2seq ("prev_word = false;", NULL, 0, FALSE);
}
END_TEST

/* §5.3's switch: two noisy tanh layers with a residual connection, checked
 * without noise (evaluation) and with it (training: the same draws at
 * every evaluation of the loss). */
START_TEST (test_seq2seq_noisy_switch)
{
  check_seq2seq ("switch = \"noisy_tanh\";", NULL, 0, FALSE);
  check_seq2seq ("switch = \"noisy_tanh\";", NULL, 0, TRUE);
}
END_TEST

/* The large-vocabulary trick: the shortlist softmax over 5 of the 6 words
 * (every target among them). */
START_TEST (test_seq2seq_candidates)
{
  static const int32_t cand[5] = { 0, 1, 2, 3, 5 };
  check_seq2seq ("", cand, 5, FALSE);
  check_seq2seq ("switch = \"noisy_tanh\";", cand, 5, FALSE);
}
END_TEST

START_TEST (test_seq2seq_no_context)
{
  S2s f;
  s2s_setup (&f, "");
  f.hk->destroy (f.head);
  psm_params_free (f.params);
  psm_batch_clear (&f.batch);
  /* an attention decoder without a context vector */
  const PsmPluginDesc *dsc = psm_test_plugin (PSM_KIND_HEAD, "pointer_softmax");
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"pointer_softmax\";", "model.head", dsc->params, &errs);
  PsmParams *p = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, p, "head.", &s2s_info, SE, 6, 6, SS, 0, TRUE };
  GError *e = NULL;
  ck_assert (!f.hk->create (sec, &ctx, &e));
  ck_assert_msg (strstr (e->message, "no context vector"), "%s", e->message);
  g_error_free (e);
  psm_params_free (p);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("head-pointer_softmax");
  TCase *tc = tcase_create ("head");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_summary_location);
  tcase_add_test (tc, test_pointer_location);
  tcase_add_test (tc, test_bad_config);
  tcase_add_test (tc, test_seq2seq);
  tcase_add_test (tc, test_seq2seq_noisy_switch);
  tcase_add_test (tc, test_seq2seq_candidates);
  tcase_add_test (tc, test_seq2seq_no_context);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
