/* test-decoder-gru_attn.c — Bahdanau et al.'s decoder cell: gradient check of
 * every parameter and of the encoding (annotations, summary) and step
 * inputs over three steps, with and without coverage; attention sums to 1
 * over real positions and is 0 on padding; coverage is the sum of the
 * earlier steps' attention; the carry's layout; steps on fewer rows
 * (PSM_DECODER_LIVE_ROWS); bad sizes. */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"

enum { T = 4, B = 3, E = 3, C = 4, H = 2, S = 3, STEPS = 3 };

typedef struct {
  const PsmDecoderClass *dk;
  void *dec;
  PsmParams *params;
  float ann[T * B * C], gann[T * B * C];
  float sum[B * S], gsum[B * S];
  float in[STEPS * B * E], gin[STEPS * B * E];
  float mask[T * B];
  const int *rows;   /* NULL, or each step's rows (PSM_DECODER_LIVE_ROWS) */
} Fix;

static PsmTaskInfo info = { sizeof (PsmTaskInfo), 10, 10, 10, T, STEPS, 1, 2, 0 };

/* Runs STEPS steps (on f->rows); fills outs (if non-NULL); returns a scalar of them all. */
static PsmTensor *
run (Fix *f, PsmGraph *g, PsmDecStep *outs, PsmTensor **carry0)
{
  int sa[3] = { T, B, C }, ss[2] = { B, S }, si[3] = { STEPS, B, E };
  PsmEncoding enc;
  memset (&enc, 0, sizeof enc);
  enc.T = T;
  enc.B = B;
  enc.annotations = psm_tensor_wrap (g, f->ann, f->gann, 3, sa);
  enc.summary = psm_tensor_wrap (g, f->sum, f->gsum, 2, ss);
  enc.mask = f->mask;
  enc.memo = f->dk->prepare (f->dec, g, f->params, &enc);
  PsmTensor *x = psm_tensor_wrap (g, f->in, f->gin, 3, si);
  PsmTensor *carry = f->dk->init (f->dec, g, f->params, &enc);
  if (carry0)
    *carry0 = carry;
  PsmTensor *loss = NULL;
  for (int t = 0; t < STEPS; t++) {
    PsmDecStep st = { 0 };
    int R = f->rows ? f->rows[t] : B;   /* the first R rows, as the core's training loop gives them */
    f->dk->step (f->dec, g, f->params, &enc, psm_test_first_rows (g, carry, R),
                 psm_test_first_rows (g, psm_tensor_step (g, x, t), R), &st);
    PsmTensor *l = psm_add (g, psm_test_project (g, st.state), psm_test_project (g, st.context));
    l = psm_add (g, l, psm_test_project (g, st.attn));
    l = psm_add (g, l, psm_test_project (g, st.input));
    loss = loss ? psm_add (g, loss, l) : l;
    if (outs)
      outs[t] = st;
    carry = st.carry;
  }
  return loss;
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  return run (ud, g, NULL, NULL);
}

/* run () on rows (PsmTestDecRun) */
static PsmTensor *
run_rows (void *ud, PsmGraph *g, PsmDecStep *outs, const int *rows)
{
  Fix *f = ud;
  f->rows = rows;
  PsmTensor *l = run (f, g, outs, NULL);
  f->rows = NULL;
  return l;
}

/* PSM_DECODER_LIVE_ROWS: steps on the first 3, then 2, then 1 rows (rows
 * past their targets' end left out, as the core's training loop does). */
static const int live[STEPS] = { 3, 2, 1 };

static void
setup (Fix *f, gboolean coverage)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_DECODER, "gru_attn");
  f->dk = d->klass;
  f->rows = NULL;
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (coverage ? "plugin = \"gru_attn\"; hidden = 2; attn_dim = 3; coverage = true;"
                                                     : "plugin = \"gru_attn\"; hidden = 2; attn_dim = 3;",
                                            "model.decoder", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "decoder.", &info, E, C, S, 0, 0, FALSE };
  GError *e = NULL;
  f->dec = f->dk->create (sec, &ctx, &e);
  ck_assert_msg (f->dec, "%s", e ? e->message : "");
  ck_assert_int_eq (f->dk->state_dim (f->dec), H);
  ck_assert_int_eq (f->dk->context_dim (f->dec), C);
  PsmRng rng;
  psm_rng_seed (&rng, 11 + coverage);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.7f, &rng);
  psm_test_fill (f->ann, T * B * C, 1.0f, &rng);
  psm_test_fill (f->sum, B * S, 1.0f, &rng);
  psm_test_fill (f->in, STEPS * B * E, 1.0f, &rng);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      f->mask[t * B + b] = (b == 1 && t >= 2) || b == 2 ? 0.0f : 1.0f;   /* example 2: empty article */
}

START_TEST (test_gru_attn)
{
  for (int cov = 0; cov < 2; cov++) {
    Fix f;
    setup (&f, cov);
    const char *what = cov ? "gru_attn (coverage)" : "gru_attn";
    for (int on = 0; on < 2; on++) {   /* every step on all rows, then on 3, 2, 1 rows */
      f.rows = on ? live : NULL;
      const char *rw = on ? " on 3, 2, 1 rows" : "";
      char *w1 = g_strdup_printf ("%s%s params", what, rw), *w2 = g_strdup_printf ("%s%s annotations", what, rw);
      char *w3 = g_strdup_printf ("%s%s summary", what, rw), *w4 = g_strdup_printf ("%s%s inputs", what, rw);
      psm_test_gradcheck (w1, f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                          psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 600);
      psm_test_gradcheck (w2, f_loss, &f, f.ann, f.gann, T * B * C, 5e-3f, 2e-3, 2e-2, 200);
      psm_test_gradcheck (w3, f_loss, &f, f.sum, f.gsum, B * S, 5e-3f, 2e-3, 2e-2, 200);
      psm_test_gradcheck (w4, f_loss, &f, f.in, f.gin, STEPS * B * E, 5e-3f, 2e-3, 2e-2, 200);
      g_free (w1);
      g_free (w2);
      g_free (w3);
      g_free (w4);
    }
    f.rows = NULL;
    psm_test_decoder_rows (what, f.dk, run_rows, &f, STEPS, live);

    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    PsmDecStep st[STEPS];
    PsmTensor *carry0;
    run (&f, g, st, &carry0);
    ck_assert_int_eq (psm_tensor_cols (carry0), H + (cov ? T : 0));
    for (int j = 0; j < H; j++)   /* s0 = tanh(summary W + b): inside (-1, 1), not all 0 */
      ck_assert (fabsf (carry0->data[j]) < 1.0f);
    for (int t = 0; t < STEPS; t++) {
      ck_assert (cov ? st[t].coverage != NULL : st[t].coverage == NULL);
      for (int b = 0; b < B; b++) {
        double s = 0;
        for (int i = 0; i < T; i++) {
          float a = st[t].attn->data[b * T + i];
          ck_assert (f.mask[i * B + b] > 0 || a == 0.0f);
          s += a;
          if (cov) {
            double want = 0;
            for (int u = 0; u < t; u++)
              want += st[u].attn->data[b * T + i];
            ck_assert (fabs (st[t].coverage->data[b * T + i] - want) < 1e-6);
          }
        }
        ck_assert (b == 2 ? s == 0.0 : fabs (s - 1.0) < 1e-5);
        for (int j = 0; j < C; j++)
          ck_assert (isfinite (st[t].context->data[b * C + j]) && (b != 2 || st[t].context->data[b * C + j] == 0.0f));
      }
    }
    psm_graph_free (g);
    f.dk->destroy (f.dec);
    psm_params_free (f.params);
  }
}
END_TEST

START_TEST (test_bad_sizes)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_DECODER, "gru_attn");
  char *errs = NULL;
  const PsmSection *sec = psm_test_section ("plugin = \"gru_attn\";", "model.decoder", d->params, &errs);
  ck_assert (sec);
  PsmParams *p = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, p, "decoder.", &info, E, 0, S, 0, 0, FALSE };   /* no annotations */
  GError *e = NULL;
  ck_assert (((const PsmDecoderClass *) d->klass)->create (sec, &ctx, &e) == NULL);
  ck_assert_msg (strstr (e->message, "model.decoder: gru_attn needs an encoder with annotations"), "%s", e->message);
  g_error_free (e);
  psm_params_free (p);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("decoder-gru_attn");
  TCase *tc = tcase_create ("gru_attn");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_gru_attn);
  tcase_add_test (tc, test_bad_sizes);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
