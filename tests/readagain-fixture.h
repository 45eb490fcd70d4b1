/* readagain-fixture.h — what the tests of the two read-again encoders
 * share (test-encoder-readagain_gru.c, test-encoder-readagain_lstm.c):
 * a batch of three examples (one and two sentences, padding), the gradient
 * check of every parameter and the embedded input in the configurations
 * both encoders have, and padding invariance. Define RA_PLUGIN (the
 * plugin's name as a string) before including it. */
#ifndef PSM_READAGAIN_FIXTURE_H
#define PSM_READAGAIN_FIXTURE_H
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 5, B = 3, E = 4, H = 3 };

typedef struct {
  const PsmEncoderClass *ek;
  void *enc;
  PsmParams *params;
  float emb[T * B * E], gemb[T * B * E];
  float mask[T * B];
  int32_t seg[T * B];
  gboolean two;
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, 10, 10, T, 1, -1, -1, 0 };

/* PsmEncoding.want_importance as the core sets it: TRUE when decoding
 * writes JSON */
static gboolean want_importance = TRUE;

static void
encode (Fix *f, PsmGraph *g, PsmTensor *emb, const float *mask, const int32_t *seg, PsmEncoding *out)
{
  memset (out, 0, sizeof *out);
  out->want_importance = want_importance;
  out->T = emb->shape[0];
  out->B = emb->shape[1];
  out->mask = mask;
  out->seg = seg;
  f->ek->encode (f->enc, g, f->params, emb, mask, out);
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  int s[3] = { T, B, E };
  PsmEncoding out;
  encode (f, g, psm_tensor_wrap (g, f->emb, f->gemb, 3, s), f->mask, f->two ? f->seg : NULL, &out);
  return psm_add (g, psm_test_project (g, out.annotations), psm_scale (g, psm_test_project (g, out.summary), 2.0f));
}

/* example 0: 5 tokens, 1: 3 then padding, 2: 2 then padding; with two
 * sentences, example 0 is 2 + 3 tokens and example 1 is 1 + 2. */
static void
setup (Fix *f, const char *cfg, gboolean two)
{
  memset (f, 0, sizeof *f);
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_ENCODER, RA_PLUGIN);
  f->ek = d->klass;
  f->two = two;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "model.encoder", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "encoder.", &info, E, 0, 0, 0, 0, FALSE };
  f->enc = f->ek->create (sec, &ctx, NULL);
  ck_assert (f->enc && f->ek->output_dim (f->enc) == H && f->ek->summary_dim (f->enc) == H);
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.6f, &rng);
  psm_test_fill (f->emb, T * B * E, 1.0f, &rng);
  int len[B] = { 5, 3, 2 }, cut[B] = { 2, 1, 9 };
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++) {
      f->mask[t * B + b] = t < len[b];
      f->seg[t * B + b] = t < len[b] && t >= cut[b];
    }
}

static void
teardown (Fix *f)
{
  f->ek->destroy (f->enc);
  psm_params_free (f->params);
}

static void
gradients (const char *cfg, gboolean two)
{
  Fix f;
  setup (&f, cfg, two);
  psm_test_gradcheck_params (cfg, f_loss, &f, f.params, 5e-3f, 2e-3, 2e-2, 200);
  psm_test_gradcheck (cfg, f_loss, &f, f.emb, f.gemb, T * B * E, 5e-3f, 2e-3, 2e-2, 400);
  teardown (&f);
}

START_TEST (test_gradients)
{
  gradients ("plugin = \"" RA_PLUGIN "\"; hidden = 3;", FALSE);
  gradients ("plugin = \"" RA_PLUGIN "\"; hidden = 3; sentences = 2;", TRUE);
  gradients ("plugin = \"" RA_PLUGIN "\"; hidden = 3; sentences = 2; combine = \"global\";", TRUE);
#ifdef RA_EXTRA_GRADIENTS
  RA_EXTRA_GRADIENTS;
#endif
}
END_TEST

/* example 1 alone, without padding, encodes as it does in the batch */
START_TEST (test_padding)
{
  for (int two = 0; two < 2; two++) {
    Fix f;
    setup (&f, two ? "plugin = \"" RA_PLUGIN "\"; hidden = 3; sentences = 2; combine = \"global\";"
                   : "plugin = \"" RA_PLUGIN "\"; hidden = 3;", two);
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    int s[3] = { T, B, E }, s1[3] = { 3, 1, E };
    PsmEncoding out, o1;
    encode (&f, g, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, two ? f.seg : NULL, &out);
    float emb1[3 * E], m1[3] = { 1, 1, 1 };
    int32_t seg1[3] = { 0, 1, 1 };
    for (int t = 0; t < 3; t++)
      memcpy (emb1 + t * E, f.emb + (t * B + 1) * E, E * sizeof (float));
    encode (&f, g, psm_tensor_wrap (g, emb1, NULL, 3, s1), m1, two ? seg1 : NULL, &o1);
    for (int t = 0; t < 3; t++)
      for (int j = 0; j < H; j++) {
        ck_assert (fabsf (o1.annotations->data[t * H + j] - out.annotations->data[(t * B + 1) * H + j]) < 1e-6f);
        ck_assert (fabsf (o1.importance->data[t * H + j] - out.importance->data[(t * B + 1) * H + j]) < 1e-6f);
      }
    for (int j = 0; j < H; j++)
      ck_assert (fabsf (o1.summary->data[j] - out.summary->data[1 * H + j]) < 1e-6f);
    ck_assert (out.importance->ndim == 3 && out.importance->shape[2] == H);
#ifdef RA_IMPORTANCE_IS_GATE
    for (int i = 0; i < T * B * H; i++)
      ck_assert (out.importance->data[i] > 0.0f && out.importance->data[i] < 1.0f);
    /* inspection only: not computed when nothing will read it, and the
     * encoding the same without it */
    PsmEncoding o0;
    want_importance = FALSE;
    encode (&f, g, psm_tensor_wrap (g, f.emb, NULL, 3, s), f.mask, two ? f.seg : NULL, &o0);
    want_importance = TRUE;
    ck_assert (o0.importance == NULL);
    ck_assert (!memcmp (o0.annotations->data, out.annotations->data, out.annotations->n * sizeof (float)));
#endif
    psm_graph_free (g);
    teardown (&f);
  }
}
END_TEST

#endif
