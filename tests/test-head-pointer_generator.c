/* test-head-pointer_generator.c — See et al.'s head: gradient check of the
 * loss (with the coverage term) in every parameter and input; the training
 * loss (gathered) equals -log of the decoding distribution (scattered) at
 * the targets — a vocabulary word, a source OOV, an OOV absent from the
 * article (scored as <unk>) — and that distribution sums to 1 over the
 * extended vocabulary; an empty article and zero probabilities stay finite. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 2, TY = 3, S = 3, C = 4, E = 2, V = 6 };
#define UNK 1
#define EOS 3

static PsmTaskInfo info = { sizeof (PsmTaskInfo), V, V, V, T, TY, 2, EOS, UNK };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  PsmBatch batch;
  float st[TY * B * S], gst[TY * B * S];
  float cx[TY * B * C], gcx[TY * B * C];
  float at[TY * B * T], gat[TY * B * T];
  float cv[TY * B * T], gcv[TY * B * T];
  float in[TY * B * E], gin[TY * B * E];
} Fix;

static PsmDecOut
dec_out (Fix *f, PsmGraph *g, int t0, int n)
{
  int s1[3] = { n, B, S }, s2[3] = { n, B, C }, s3[3] = { n, B, T }, s4[3] = { n, B, E };
  PsmDecOut o = { n, B, NULL, NULL, NULL, NULL, NULL };
  o.state = psm_tensor_wrap (g, f->st + t0 * B * S, f->gst + t0 * B * S, 3, s1);
  o.context = psm_tensor_wrap (g, f->cx + t0 * B * C, f->gcx + t0 * B * C, 3, s2);
  o.attn = psm_tensor_wrap (g, f->at + t0 * B * T, f->gat + t0 * B * T, 3, s3);
  o.coverage = psm_tensor_wrap (g, f->cv + t0 * B * T, f->gcv + t0 * B * T, 3, s3);
  o.input = psm_tensor_wrap (g, f->in + t0 * B * E, f->gin + t0 * B * E, 3, s4);
  return o;
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmDecOut o = dec_out (f, g, 0, TY);
  PsmEncoding enc = { T, B, NULL, NULL, f->batch.src_mask, f->batch.src, NULL };
  return f->hk->loss (f->head, g, f->params, &enc, &o, &f->batch);
}

static void
setup (Fix *f, const char *cfg)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_generator");
  f->hk = d->klass;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "model.head", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "head.", &info, E, C, 2 * S, S, C, TRUE };
  GError *e = NULL;
  f->head = f->hk->create (sec, &ctx, &e);
  ck_assert_msg (f->head, "%s", e ? e->message : "");
  PsmRng rng;
  psm_rng_seed (&rng, 21);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.8f, &rng);
  psm_test_fill (f->st, sizeof f->st / 4, 1.0f, &rng);
  psm_test_fill (f->cx, sizeof f->cx / 4, 1.0f, &rng);
  psm_test_fill (f->in, sizeof f->in / 4, 1.0f, &rng);
  psm_test_fill (f->cv, sizeof f->cv / 4, 1.0f, &rng);
  for (size_t i = 0; i < sizeof f->cv / 4; i++)
    f->cv[i] = fabsf (f->cv[i]);
  /* source: example 0 = [4, 6(oov "zed"), 5, 7(oov "yak")], example 1 = [5] then padding */
  PsmBatch *b = &f->batch;
  psm_batch_init (b);
  psm_batch_reserve (b, B, T, TY);
  b->ext_base = V;
  b->oov_words = g_ptr_array_new_with_free_func (g_free);
  g_ptr_array_add (b->oov_words, g_strdup ("zed"));
  g_ptr_array_add (b->oov_words, g_strdup ("yak"));
  g_ptr_array_add (b->oov_words, g_strdup ("gnu"));   /* only in a target */
  const int32_t ext0[T] = { 4, 6, 5, 7 };
  for (int i = 0; i < T; i++) {
    PSM_AT (b->src_ext, b, i, 0) = ext0[i];
    PSM_AT (b->src, b, i, 0) = ext0[i] < V ? ext0[i] : UNK;
    PSM_AT (b->src_mask, b, i, 0) = 1;
  }
  PSM_AT (b->src_ext, b, 0, 1) = PSM_AT (b->src, b, 0, 1) = 5;
  PSM_AT (b->src_mask, b, 0, 1) = 1;
  /* targets: ex 0 = zed (source OOV), 4, gnu (absent OOV -> unk);
   *          ex 1 = zed (OOV of the batch, not of this article), eos, padding */
  const int32_t tg[TY][B] = { { 6, 6 }, { 4, EOS }, { 8, 0 } };
  for (int t = 0; t < TY; t++)
    for (int ex = 0; ex < B; ex++) {
      PSM_AT (b->tgt_ext, b, t, ex) = tg[t][ex];
      PSM_AT (b->tgt, b, t, ex) = tg[t][ex] < V ? tg[t][ex] : UNK;
      PSM_AT (b->tgt_mask, b, t, ex) = !(t == 2 && ex == 1);
    }
  /* attention: distributions over the real positions */
  for (int t = 0; t < TY; t++)
    for (int ex = 0; ex < B; ex++) {
      float *a = f->at + (t * B + ex) * T;
      double z = 0;
      for (int i = 0; i < T; i++) {
        a[i] = PSM_AT (b->src_mask, b, i, ex) > 0 ? 0.2f + (float) psm_rng_uniform (&rng) : 0.0f;
        z += a[i];
      }
      for (int i = 0; i < T; i++)
        a[i] = (float) (a[i] / z);
    }
}

static void
teardown (Fix *f)
{
  f->hk->destroy (f->head);
  psm_params_free (f->params);
  psm_batch_clear (&f->batch);
}

START_TEST (test_gradients)
{
  Fix f;
  setup (&f, "plugin = \"pointer_generator\"; cov_loss_wt = 0.5;");
  psm_test_gradcheck ("pointer_generator params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("pointer_generator state", f_loss, &f, f.st, f.gst, sizeof f.st / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("pointer_generator context", f_loss, &f, f.cx, f.gcx, sizeof f.cx / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("pointer_generator input", f_loss, &f, f.in, f.gin, sizeof f.in / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("pointer_generator attention", f_loss, &f, f.at, f.gat, sizeof f.at / 4, 1e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("pointer_generator coverage", f_loss, &f, f.cv, f.gcv, sizeof f.cv / 4, 1e-3f, 2e-3, 2e-2, 100);
  teardown (&f);
}
END_TEST

START_TEST (test_loss_matches_scores)
{
  Fix f;
  setup (&f, "plugin = \"pointer_generator\";");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding enc = { T, B, NULL, NULL, f.batch.src_mask, f.batch.src, NULL };
  float loss = f_loss (g, &f)->data[0];
  ck_assert_int_eq (f.hk->space_size (f.head, &f.batch), V + 3);
  double want = 0, W = 0;
  for (int t = 0; t < TY; t++) {
    PsmDecOut o = dec_out (&f, g, t, 1);
    PsmTensor *sc = f.hk->scores (f.head, g, f.params, &enc, &o, &f.batch);
    ck_assert_int_eq (psm_tensor_cols (sc), V + 3);
    for (int e = 0; e < B; e++) {
      double z = 0;
      for (int s = 0; s < V + 3; s++) {
        ck_assert (isfinite (sc->data[e * (V + 3) + s]));
        z += exp (sc->data[e * (V + 3) + s]);
      }
      ck_assert_msg (fabs (z - 1) < 1e-5, "step %d example %d sums to %g", t, e, z);
      if (!PSM_AT (f.batch.tgt_mask, &f.batch, t, e))
        continue;
      int32_t w = PSM_AT (f.batch.tgt_ext, &f.batch, t, e);
      gboolean in_src = FALSE;
      for (int i = 0; i < T; i++)
        in_src = in_src || (PSM_AT (f.batch.src_ext, &f.batch, i, e) == w && PSM_AT (f.batch.src_mask, &f.batch, i, e));
      int32_t slot = w < V || in_src ? w : UNK;
      want -= sc->data[e * (V + 3) + slot];
      W += 1;
    }
  }
  ck_assert_msg (fabs (want / W - loss) < 1e-5, "loss %g, -log P from scores %g", loss, want / W);
  for (int s = 0; s < V + 3; s++)
    ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, 0, s), s);
  psm_graph_free (g);
  teardown (&f);
}
END_TEST

START_TEST (test_needs_attention)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "pointer_generator");
  const PsmSection *sec = psm_test_section ("plugin = \"pointer_generator\";", "model.head", d->params, NULL);
  PsmParams *p = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, p, "head.", &info, E, C, 2 * S, S, 0, FALSE };
  GError *e = NULL;
  ck_assert (((const PsmHeadClass *) d->klass)->create (sec, &ctx, &e) == NULL);
  ck_assert_msg (strstr (e->message, "decoder cell with attention"), "%s", e->message);
  g_error_free (e);
  psm_params_free (p);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("head-pointer_generator");
  TCase *tc = tcase_create ("pointer_generator");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_gradients);
  tcase_add_test (tc, test_loss_matches_scores);
  tcase_add_test (tc, test_needs_attention);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
