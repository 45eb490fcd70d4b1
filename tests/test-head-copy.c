/* test-head-copy.c — Zeng et al.'s copy head (§3.2): gradient check of the
 * loss in every parameter, the decoder state and context and the
 * annotations; the training loss (mixture of gathers) equals -log of the
 * decoding distribution at the targets — a word copied from two positions,
 * a word both in the vocabulary and twice in the source, an OOV absent from the
 * article (scored as <unk>) — and that distribution sums to 1 with every
 * word on one slot; the generate probability (gate); the input embedding
 * of eq. 15 (copied OOVs from their first position, anything else the
 * table's row) with its gradient; an empty article stays finite. Then in a
 * whole model (headline task, read-again encoder, lstm_attn decoder): the
 * hook is used in teacher-forced training (the loss moves with W_c only
 * where a copied OOV is a previous target) and in beam search (the scores
 * of hypotheses that emitted a copied OOV move with W_c; with copy_input
 * off nothing does). */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "psm-test.h"
#include <psm/psm-pipeline.h>
#include "run/run-internal.h"

enum { T = 4, B = 2, TY = 3, S = 3, C = 4, E = 2, V = 6 };
#define UNK 1
#define BOS 2
#define EOS 3

static PsmTaskInfo info = { sizeof (PsmTaskInfo), V, V, V, T, TY, BOS, EOS, UNK };

typedef struct {
  const PsmHeadClass *hk;
  void *head;
  PsmParams *params;
  PsmBatch batch;
  float st[TY * B * S], gst[TY * B * S];
  float cx[TY * B * C], gcx[TY * B * C];
  float ann[T * B * C], gann[T * B * C];
  float x[4 * E], gx[4 * E];
} Fix;

static PsmDecOut
dec_out (Fix *f, PsmGraph *g, int t0, int n)
{
  int s1[3] = { n, B, S }, s2[3] = { n, B, C };
  PsmDecOut o = { n, B, NULL, NULL, NULL, NULL, NULL };
  o.state = psm_tensor_wrap (g, f->st + t0 * B * S, f->gst + t0 * B * S, 3, s1);
  o.context = psm_tensor_wrap (g, f->cx + t0 * B * C, f->gcx + t0 * B * C, 3, s2);
  return o;
}

static PsmEncoding
encoding (Fix *f, PsmGraph *g)
{
  int sa[3] = { T, B, C };
  PsmEncoding enc;
  memset (&enc, 0, sizeof enc);
  enc.T = T;
  enc.B = B;
  enc.mask = f->batch.src_mask;
  enc.src = f->batch.src;
  enc.annotations = psm_tensor_wrap (g, f->ann, f->gann, 3, sa);
  return enc;
}

static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmDecOut o = dec_out (f, g, 0, TY);
  PsmEncoding enc = encoding (f, g);
  return f->hk->loss (f->head, g, f->params, &enc, &o, &f->batch);
}

/* rows 0..3 of the hook: BOS, zed of example 0, zed of example 1 (not in
 * its source), gnu (in no source) */
static const int32_t hook_words[4] = { BOS, 6, 6, 8 }, hook_rows[4] = { 0, 0, 1, 0 };

static PsmTensor *
f_hook (PsmGraph *g, void *ud)
{
  Fix *f = ud;
  PsmEncoding enc = encoding (f, g);
  int sx[2] = { 4, E };
  PsmTensor *x = psm_tensor_wrap (g, f->x, f->gx, 2, sx);
  return psm_test_project (g, f->hk->input_embed (f->head, g, f->params, &enc, &f->batch, hook_words, hook_rows, 4, x));
}

static void
setup (Fix *f, const char *cfg)
{
  memset (f, 0, sizeof *f);
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "copy");
  f->hk = d->klass;
  ck_assert (f->hk->input_embed);
  char *errs = NULL;
  const PsmSection *sec = psm_test_section (cfg, "model.head", d->params, &errs);
  ck_assert_msg (sec, "%s", errs);
  f->params = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, f->params, "head.", &info, E, C, S, S, C, TRUE };
  GError *e = NULL;
  f->head = f->hk->create (sec, &ctx, &e);
  ck_assert_msg (f->head, "%s", e ? e->message : "");
  PsmRng rng;
  psm_rng_seed (&rng, 23);
  ck_assert (psm_params_finalize (f->params, &rng, NULL));
  psm_test_fill (psm_params_data (f->params), psm_params_size (f->params), 0.8f, &rng);
  psm_test_fill (f->st, sizeof f->st / 4, 1.0f, &rng);
  psm_test_fill (f->cx, sizeof f->cx / 4, 1.0f, &rng);
  psm_test_fill (f->ann, sizeof f->ann / 4, 1.0f, &rng);
  psm_test_fill (f->x, sizeof f->x / 4, 1.0f, &rng);
  /* source: example 0 = [4, 6 (oov "zed"), 4, 6 (zed again)], example 1 = [5] then padding */
  PsmBatch *b = &f->batch;
  psm_batch_init (b);
  psm_batch_reserve (b, B, T, TY);
  b->ext_base = V;
  b->oov_words = g_ptr_array_new_with_free_func (g_free);
  g_ptr_array_add (b->oov_words, g_strdup ("zed"));
  g_ptr_array_add (b->oov_words, g_strdup ("yak"));
  g_ptr_array_add (b->oov_words, g_strdup ("gnu"));   /* only in a target */
  const int32_t ext0[T] = { 4, 6, 4, 6 };
  for (int i = 0; i < T; i++) {
    PSM_AT (b->src_ext, b, i, 0) = ext0[i];
    PSM_AT (b->src, b, i, 0) = ext0[i] < V ? ext0[i] : UNK;
    PSM_AT (b->src_mask, b, i, 0) = 1;
  }
  PSM_AT (b->src_ext, b, 0, 1) = PSM_AT (b->src, b, 0, 1) = 5;
  PSM_AT (b->src_mask, b, 0, 1) = 1;
  /* targets: ex 0 = zed (copy only, two positions), 4 (vocabulary and source), gnu (absent: unk);
   *          ex 1 = zed (not in its article: unk), eos, padding */
  const int32_t tg[TY][B] = { { 6, 6 }, { 4, EOS }, { 8, 0 } };
  for (int t = 0; t < TY; t++)
    for (int ex = 0; ex < B; ex++) {
      PSM_AT (b->tgt_ext, b, t, ex) = tg[t][ex];
      PSM_AT (b->tgt, b, t, ex) = tg[t][ex] < V ? tg[t][ex] : UNK;
      PSM_AT (b->tgt_mask, b, t, ex) = !(t == 2 && ex == 1);
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
  setup (&f, "plugin = \"copy\"; hidden = 3;");
  psm_test_gradcheck ("copy params", f_loss, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("copy state", f_loss, &f, f.st, f.gst, sizeof f.st / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("copy context", f_loss, &f, f.cx, f.gcx, sizeof f.cx / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("copy annotations", f_loss, &f, f.ann, f.gann, sizeof f.ann / 4, 5e-3f, 2e-3, 2e-2, 100);
  /* through the input-embedding hook */
  psm_test_gradcheck ("copy hook params", f_hook, &f, psm_params_data (f.params), psm_params_grad (f.params),
                      psm_params_size (f.params), 5e-3f, 2e-3, 2e-2, 500);
  psm_test_gradcheck ("copy hook annotations", f_hook, &f, f.ann, f.gann, sizeof f.ann / 4, 5e-3f, 2e-3, 2e-2, 100);
  psm_test_gradcheck ("copy hook table rows", f_hook, &f, f.x, f.gx, sizeof f.x / 4, 5e-3f, 2e-3, 2e-2, 100);
  teardown (&f);
}
END_TEST

START_TEST (test_loss_matches_scores)
{
  Fix f;
  setup (&f, "plugin = \"copy\";");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding enc = encoding (&f, g);
  float loss = f_loss (g, &f)->data[0];
  int NS = V + T;
  ck_assert_int_eq (f.hk->space_size (f.head, &f.batch), NS);
  double want = 0, W = 0;
  for (int t = 0; t < TY; t++) {
    PsmDecOut o = dec_out (&f, g, t, 1);
    PsmTensor *gate0 = f.hk->gate (f.head, g, f.params, &enc, &o, &f.batch);   /* before scores: computed */
    PsmTensor *sc = f.hk->scores (f.head, g, f.params, &enc, &o, &f.batch);
    PsmTensor *gate1 = f.hk->gate (f.head, g, f.params, &enc, &o, &f.batch);   /* after: the same */
    ck_assert_int_eq (psm_tensor_cols (sc), NS);
    for (int e = 0; e < B; e++) {
      double z = 0;
      for (int s = 0; s < NS; s++)
        z += exp (sc->data[e * NS + s]);
      ck_assert_msg (fabs (z - 1) < 1e-5, "step %d example %d sums to %g", t, e, z);
      ck_assert (fabsf (gate0->data[e] - gate1->data[e]) < 1e-5f && gate0->data[e] > 0 && gate0->data[e] < 1);
      if (e == 0) {   /* word 4 at position 0 and zed's second position are on other slots */
        ck_assert (isinf (sc->data[V + 0]) && isinf (sc->data[V + 3]));
        ck_assert (isfinite (sc->data[V + 1]) && isinf (sc->data[V + 2]));   /* 4 again */
      }
      if (!PSM_AT (f.batch.tgt_mask, &f.batch, t, e))
        continue;
      int32_t w = PSM_AT (f.batch.tgt_ext, &f.batch, t, e);
      int slot = w < V ? w : (e == 0 && w == 6) ? V + 1 : UNK;
      want -= sc->data[e * NS + slot];
      W += 1;
    }
  }
  ck_assert_msg (fabs (want / W - loss) < 1e-5, "loss %g, -log P from scores %g", loss, want / W);
  for (int s = 0; s < V; s++)
    ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, 0, s), s);
  ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, 0, V + 1), 6);
  ck_assert_int_eq (f.hk->slot_token (f.head, &f.batch, 1, V + 0), 5);
  /* an empty article: only generating, still finite */
  PSM_AT (f.batch.src_mask, &f.batch, 0, 1) = 0;
  ck_assert (isfinite (f_loss (g, &f)->data[0]));
  PsmDecOut o = dec_out (&f, g, 0, 1);
  PsmTensor *sc = f.hk->scores (f.head, g, f.params, &enc, &o, &f.batch);
  double z = 0;
  for (int s = 0; s < NS; s++)
    z += exp (sc->data[NS + s]);
  ck_assert (fabs (z - 1) < 1e-5 && isinf (sc->data[NS + V]));
  psm_graph_free (g);
  teardown (&f);
}
END_TEST

START_TEST (test_input_embed)
{
  Fix f;
  setup (&f, "plugin = \"copy\";");
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmEncoding enc = encoding (&f, g);
  int sx[2] = { 4, E };
  PsmTensor *x = psm_tensor_wrap (g, f.x, NULL, 2, sx);
  PsmTensor *y = f.hk->input_embed (f.head, g, f.params, &enc, &f.batch, hook_words, hook_rows, 4, x);
  const float *w = psm_params_data (f.params) + psm_params_offset (f.params, psm_params_find (f.params, "head.input.w"));
  const float *bc = psm_params_data (f.params) + psm_params_offset (f.params, psm_params_find (f.params, "head.input.b"));
  for (int j = 0; j < E; j++) {
    double a = bc[j];
    for (int k = 0; k < C; k++)   /* zed's first position in example 0: 1 */
      a += f.ann[(1 * B + 0) * C + k] * w[k * E + j];
    ck_assert_msg (fabs (y->data[1 * E + j] - tanh (a)) < 1e-5, "eq. 15 unit %d", j);
    ck_assert (y->data[0 * E + j] == f.x[0 * E + j] && y->data[2 * E + j] == f.x[2 * E + j] &&
               y->data[3 * E + j] == f.x[3 * E + j]);
  }
  psm_graph_free (g);
  teardown (&f);
  setup (&f, "plugin = \"copy\"; copy_input = false;");
  g = psm_graph_new ();
  enc = encoding (&f, g);
  x = psm_tensor_wrap (g, f.x, NULL, 2, sx);
  ck_assert (f.hk->input_embed (f.head, g, f.params, &enc, &f.batch, hook_words, hook_rows, 4, x) == x);
  psm_graph_free (g);
  teardown (&f);
}
END_TEST

START_TEST (test_needs_attention)
{
  const PsmPluginDesc *d = psm_test_plugin (PSM_KIND_HEAD, "copy");
  const PsmSection *sec = psm_test_section ("plugin = \"copy\";", "model.head", d->params, NULL);
  PsmParams *p = psm_params_new ();
  PsmBuildCtx ctx = { sizeof ctx, p, "head.", &info, E, C, S, S, 0, FALSE };
  GError *e = NULL;
  ck_assert (((const PsmHeadClass *) d->klass)->create (sec, &ctx, &e) == NULL);
  ck_assert_msg (strstr (e->message, "decoder cell with attention"), "%s", e->message);
  g_error_free (e);
  psm_params_free (p);
}
END_TEST

/* ---- the hook inside a model ---- */

/* Titles copy words seen once (outside the 5-word target vocabulary):
 * "zork" as the first title word, so it is the second step's input. */
static PsmModel *
make_model (const char *head_extra, PsmPipeline **pl)
{
  char *art = psm_test_write_file ("train.article.txt", "zork ate the fish .\nthe cat ate zork .\nblip saw the cat .\n"
                                                 "the fish saw blip .\n");
  g_free (psm_test_write_file ("train.title.txt", "zork ate fish\ncat ate zork\nblip saw cat\nfish saw blip\n"));
  char *cfg = g_strdup_printf (
    "task = { plugin = \"headline\"; train = \"%s\"; valid = \"%s\"; test = \"%s\"; style = \"none\"; "
    "pointers = \"none\"; min_count = 1; tgt_vocab = 9; };\n"
    "model = { embedding = { dim = 4; }; encoder = { plugin = \"readagain_gru\"; hidden = 4; };\n"
    "  decoder = { plugin = \"lstm_attn\"; hidden = 4; attend = \"previous\"; init = \"bridge\"; };\n"
    "  head = { plugin = \"copy\"; %s }; };\n"
    "train = { batch = 4; steps = 1; };\ndecode = { beam = 3; min_len = 3; max_len = 3; };\nrun = { dir = \"%s/run\"; };\n",
    art, art, art, head_extra, psm_test_dir ());
  char *path = psm_test_write_file ("model.cfg", cfg);
  GError *e = NULL;
  *pl = psm_pipeline_load (path, NULL, &e);
  ck_assert_msg (*pl, "%s", e ? e->message : "");
  PsmModel *m = psm_model_new (*pl, FALSE, &e);
  ck_assert_msg (m, "%s", e ? e->message : "");
  g_free (cfg);
  g_free (path);
  g_free (art);
  return m;
}

static float *
param (PsmModel *m, const char *name)
{
  PsmParams *p = psm_model_params (m);
  int id = psm_params_find (p, name);
  ck_assert_msg (id >= 0, "%s", name);
  return psm_params_data (p) + psm_params_offset (p, id);
}

static double
model_loss (PsmModel *m)
{
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  double v = psm_model_loss (m, g, psm_model_batch (m))->data[0];
  psm_graph_free (g);
  return v;
}

/* Decodes text with the JSON output; returns the hypothesis score and its tokens. */
static double
decode_one (PsmModel *m, const char *text, char *tokens, size_t n)
{
  char *buf = NULL;
  size_t len = 0;
  FILE *js = open_memstream (&buf, &len);
  PsmEvalOptions opt = { 0 };
  opt.json = js;
  GError *e = NULL;
  const char *texts[1] = { text };
  ck_assert_msg (psm_model_decode_texts (m, texts, 1, &opt, &e), "%s", e ? e->message : "");
  fclose (js);
  const char *sc = strstr (buf, "\"score\": "), *tk = strstr (buf, "\"tokens\": [");
  ck_assert_msg (sc && tk, "%s", buf);
  double v = g_ascii_strtod (sc + 9, NULL);
  const char *end = strchr (tk, ']');
  g_strlcpy (tokens, tk + 11, MIN (n, (size_t) (end - tk - 10)));
  free (buf);
  return v;
}

START_TEST (test_hook_in_model)
{
  for (int on = 1; on >= 0; on--) {
    PsmPipeline *pl;
    PsmModel *m = make_model (on ? "" : "copy_input = false;", &pl);
    /* training: the batch of all four pairs; two titles start with a copied OOV */
    PsmRng rng;
    psm_rng_seed (&rng, 3);
    GError *e = NULL;
    ck_assert_msg (psm_model_train_batch (m, 4, &rng, &e), "%s", e ? e->message : "");
    float *wc = param (m, "head.input.b");
    double l0 = model_loss (m);
    wc[0] += 0.5f;
    double l1 = model_loss (m);
    ck_assert_msg (on ? fabs (l1 - l0) > 1e-6 : l1 == l0, "copy_input %d: loss %g -> %g", on, l0, l1);
    /* beam search: copying made likely (large copy scores), so hypotheses emit "zork" then read it back */
    float *wk = param (m, "head.copy.w");
    for (int i = 0; i < 4 * 4; i++)
      wk[i] *= 40.0f;
    char t0[256], t1[256];
    double s0 = decode_one (m, "zork zork zork", t0, sizeof t0);
    ck_assert_msg (strstr (t0, "zork"), "%s", t0);
    wc[1] -= 1.5f;
    double s1 = decode_one (m, "zork zork zork", t1, sizeof t1);
    ck_assert_msg (on ? s1 != s0 : s1 == s0, "copy_input %d: beam score %g -> %g (%s / %s)", on, s0, s1, t0, t1);
    psm_model_free (m);
    psm_pipeline_free (pl);
  }
}
END_TEST

/* Decoding computes only the hypotheses it extends (one an article at the
 * first step, then the beams of the articles still searching, their rows
 * moved together as articles stop): the same outputs, bit for bit, as
 * computing every row at every step, over a batch of articles that stop
 * at different steps, with the copy head reading each article's compact
 * annotations and feeding copied words back. */
START_TEST (test_rows_skipped)
{
  PsmPipeline *pl;
  PsmModel *m = make_model ("", &pl);
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  GError *e = NULL;
  ck_assert_msg (psm_model_train_batch (m, 4, &rng, &e), "%s", e ? e->message : "");
  float *wk = param (m, "head.copy.w");
  for (int i = 0; i < 4 * 4; i++)
    wk[i] *= 8.0f;
  PsmDecodeSettings ds = { 3, 1, 9 };
  ck_assert (psm_model_set_decode (m, &ds, NULL));
  const char *texts[] = { "zork ate the fish .", "the cat", "blip saw the cat . the fish saw blip", "fish",
                          "the the the cat ate", "zork zork blip", "cat saw fish . zork ate", "blip" };
  int n = G_N_ELEMENTS (texts);
  char *out[2];
  long rows[2];
  for (int skip = 0; skip < 2; skip++) {
    size_t len = 0;
    FILE *js = open_memstream (&out[skip], &len);
    PsmEvalOptions opt = { 0 };
    opt.json = js;
    psm_paths.beam_skip_rows = skip;
    long r0 = psm_beam_rows;
    gboolean ok = psm_model_decode_texts (m, texts, n, &opt, &e);
    rows[skip] = psm_beam_rows - r0;
    psm_paths.beam_skip_rows = TRUE;
    ck_assert_msg (ok, "%s", e ? e->message : "");
    fclose (js);
  }
  ck_assert_str_eq (out[1], out[0]);
  /* lengths 1..9: some articles stopped before others (the first step alone saves n (beam - 1) rows) */
  ck_assert_msg (rows[0] - rows[1] > n * 2, "rows scored: %ld of every row, %ld skipping", rows[0], rows[1]);
  int lens[10] = { 0 }, distinct = 0;
  for (const char *p = out[1]; (p = strstr (p, "\"tokens\": [")); p++) {
    int k = *(p + 11) == ']' ? 0 : 1;
    for (const char *q = p + 11; *q != ']'; q++)
      k += *q == ',';
    distinct += k <= 9 && !lens[k]++;
  }
  ck_assert_msg (distinct >= 2, "all outputs of one length: %s", out[1]);
  free (out[0]);
  free (out[1]);
  psm_model_free (m);
  psm_pipeline_free (pl);
}
END_TEST

int
main (void)
{
  psm_test_plugin_env ();
  Suite *s = suite_create ("head-copy");
  TCase *tc = tcase_create ("copy");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_gradients);
  tcase_add_test (tc, test_loss_matches_scores);
  tcase_add_test (tc, test_input_embed);
  tcase_add_test (tc, test_needs_attention);
  tcase_add_test (tc, test_hook_in_model);
  tcase_add_test (tc, test_rows_skipped);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
