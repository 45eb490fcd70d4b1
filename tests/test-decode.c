/* test-decode.c — the core's decoder loops. Beam search against an
 * exhaustive search: the scorer is a toy model whose log-scores are a hash
 * of the article and the whole history; the test rebuilds each row's
 * history from the parents the search hands it, so a wrong reordering
 * changes the scores and fails the test. And the teacher-forced loop inside
 * the four papers' seq2seq models (encoder, attention decoder, head, as
 * psm-run trains them): every parameter's gradient bit for bit the same
 * with and without the attention's batch-major copies, and a
 * finite-difference check of it through what the core adds around the
 * plugins (the values' deferred gradient, the copies, the head's input
 * hook in teacher forcing). */
#include "config.h"
#include <math.h>
#include <string.h>
#include "psm-test.h"
#include "run/run-internal.h"

#define S 4          /* slot 0 ends, slot 1 is the unknown word */
#define MAXL 4
#define MAXN 1024

typedef struct {
  int K;
  int32_t hist[MAXN][MAXL], len[MAXN];
  int32_t nh[MAXN][MAXL], nlen[MAXN];
  float scores[(MAXN + 1) * S];
  gboolean was[MAXN];   /* the rows scored at the last step */
  int calls;
  long asked;           /* rows asked for, all steps */
} Toy;

static void
toy_logp (int article, const int32_t *h, int len, float *out)
{
  guint32 x = 2166136261u ^ (guint32) (article * 7919);
  for (int i = 0; i < len; i++)
    x = (x ^ (guint32) (h[i] + 1)) * 16777619u;
  double z = 0;
  for (int s = 0; s < S; s++) {
    guint32 y = (x ^ (guint32) (s * 2654435761u)) * 2246822519u;
    y ^= y >> 13;
    out[s] = (float) ((y % 10007) / 10007.0 * 4.0 - 2.0);
    z += exp (out[s]);
  }
  for (int s = 0; s < S; s++)
    out[s] -= (float) log (z);
}

/* The rows the search asks for at a step, checked against what it must
 * ask: one row an article at the first step, every row of the articles
 * still searching after (those that have a live row); a parent is a row
 * asked for at the step before. Marks them in want[] (by the search's
 * rows) and returns how many. */
static int
want_rows (int n, int K, const int32_t *parents, const int *act, int n_act, int per, const gboolean *was,
           gboolean *want)
{
  ck_assert_int_eq (per, parents ? K : 1);
  memset (want, 0, n * sizeof (gboolean));
  for (int i = 0; i < n_act; i++) {
    ck_assert (act[i] >= 0 && act[i] * K < n && (i == 0 || act[i] > act[i - 1]));
    for (int k = 0; k < per; k++) {
      int r = act[i] * K + k;
      want[r] = TRUE;
      ck_assert_msg (!parents || was[parents[r]], "row %d continues row %d, not scored at the step before", r,
                     parents ? parents[r] : -1);
    }
  }
  return n_act * per;
}

/* Where the toy scorers put article b's rows: after a row of poison (a
 * score of 10, far above any real one, as in every row left over), the
 * articles asked for in reverse order, so a search that read row r at
 * r * S reads the poison or another article's scores. scores holds n + 1
 * rows of Sn. */
static void
toy_layout (int n, const int *act, int n_act, int per, int *base, float *scores, int Sn)
{
  for (size_t i = 0; i < (size_t) (n + 1) * Sn; i++)
    scores[i] = 10.0f;
  for (int i = 0; i < n_act; i++)
    base[act[i]] = 1 + (n_act - 1 - i) * per;
}

static const float *
toy_step (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act, int n_act, int per,
          int *base, int *S_out, GError **error)
{
  Toy *t = ud;
  gboolean want[MAXN];
  t->asked += want_rows (n, t->K, parents, act, n_act, per, t->was, want);
  for (int r = 0; r < n; r++) {
    if (!want[r])
      continue;
    int p = parents ? parents[r] : r;
    t->nlen[r] = parents ? t->len[p] : 0;
    memcpy (t->nh[r], t->hist[p], sizeof t->hist[p]);
    if (parents && tokens[r] >= 0 && t->nlen[r] < MAXL)
      t->nh[r][t->nlen[r]++] = tokens[r];
  }
  memcpy (t->hist, t->nh, sizeof t->hist);
  memcpy (t->len, t->nlen, sizeof t->len);
  memcpy (t->was, want, sizeof want);
  toy_layout (n, act, n_act, per, base, t->scores, S);
  for (int r = 0; r < n; r++)
    if (want[r])
      toy_logp (r / t->K, t->hist[r], t->len[r], t->scores + (base[r / t->K] + r % t->K) * S);
  *S_out = S;
  t->calls++;
  return t->scores;
}

/* Exhaustive: every sequence the rules allow, scored as the beam ranks. */
static void
exhaustive (const PsmBeamConfig *c, int article, int32_t *h, int len, double logp, double *best, int32_t *best_h,
            int *best_len)
{
  float lp[S];
  toy_logp (article, h, len, lp);
  for (int s = 0; s < S; s++) {
    double v = logp + lp[s];
    if (s == c->eos) {
      if (len + 1 < c->min_len)
        continue;
      double sc = v / (c->length_penalty > 0 ? pow (len + 1, c->length_penalty) : 1.0);
      if (sc > *best) {
        *best = sc;
        memcpy (best_h, h, len * sizeof (int32_t));
        *best_len = len;
      }
      continue;
    }
    if (c->no_unk && s == c->unk)
      continue;
    h[len] = s;
    int ng = c->block_ngram;
    gboolean rep = FALSE;
    for (int i = 0; ng > 0 && i + ng <= len; i++)
      rep = rep || memcmp (h + i, h + len + 1 - ng, ng * sizeof (int32_t)) == 0;
    if (rep)
      continue;
    if (len + 1 == c->max_len) {
      double sc = v / (c->length_penalty > 0 ? pow (len + 1, c->length_penalty) : 1.0);
      if (sc > *best) {
        *best = sc;
        memcpy (best_h, h, (len + 1) * sizeof (int32_t));
        *best_len = len + 1;
      }
    } else {
      exhaustive (c, article, h, len + 1, v, best, best_h, best_len);
    }
  }
}

START_TEST (test_beam_exhaustive)
{
  const PsmBeamConfig cfgs[] = {
    { 128, 0, MAXL, 0, 0.0, 0, 1, FALSE },
    { 128, 0, MAXL, 0, 1.0, 0, 1, FALSE },
    { 128, 3, MAXL, 2, 1.0, 0, 1, TRUE },
    { 128, 2, 3, 1, 0.5, 0, 1, FALSE },
  };
  for (guint ci = 0; ci < G_N_ELEMENTS (cfgs); ci++) {
    const PsmBeamConfig *c = &cfgs[ci];
    int B = 3;
    Toy *t = g_new0 (Toy, 1);
    t->K = c->beam;
    ck_assert (B * c->beam <= MAXN);
    PsmBeamFns f = { toy_step, NULL, t };
    PsmHyp out[3] = { { 0 } };
    ck_assert (psm_beam_search (c, B, &f, out, NULL));
    for (int b = 0; b < B; b++) {
      int32_t h[MAXL], bh[MAXL];
      double best = -INFINITY;
      int blen = -1;
      exhaustive (c, b, h, 0, 0.0, &best, bh, &blen);
      ck_assert_msg (fabs (best - out[b].score) < 1e-6, "config %u article %d: beam %g, exhaustive %g", ci, b,
                     out[b].score, best);
      ck_assert_int_eq (out[b].len, blen);
      for (int i = 0; i < blen; i++)
        ck_assert_int_eq (out[b].slots[i], bh[i]);
      psm_hyp_clear (&out[b]);
    }
    g_free (t);
  }
}
END_TEST

/* Beam 1 is greedy: the best slot at every step. The scorer is asked for
 * an article's row only while it is searching: as many rows in all as the
 * articles' steps. */
START_TEST (test_greedy)
{
  PsmBeamConfig c = { 1, 0, MAXL, 0, 0.0, 0, -1, FALSE };
  int B = 5;
  long steps = 0;
  for (int b = 0; b < B; b++) {
    int32_t h[MAXL];
    int len = 0;
    double lp = 0;
    for (;;) {
      float s[S];
      toy_logp (b, h, len, s);
      int best = 0;
      for (int k = 1; k < S; k++)
        if (s[k] > s[best])
          best = k;
      lp += s[best];
      if (best == 0)
        break;
      h[len++] = best;
      if (len == MAXL)
        break;
    }
    steps += MIN (len + 1, MAXL);
    Toy *t = g_new0 (Toy, 1);
    t->K = 1;
    PsmBeamFns f = { toy_step, NULL, t };
    PsmHyp out[5] = { { 0 } };
    ck_assert (psm_beam_search (&c, B, &f, out, NULL));
    ck_assert_int_eq (out[b].len, len);
    ck_assert (fabs (out[b].logp - lp) < 1e-6);
    for (int i = 0; i < len; i++)
      ck_assert_int_eq (out[b].slots[i], h[i]);
    for (int i = 0; i < B; i++)
      psm_hyp_clear (&out[i]);
    g_free (t);
  }
  Toy *t = g_new0 (Toy, 1);
  t->K = 1;
  PsmBeamFns f = { toy_step, NULL, t };
  PsmHyp out[5] = { { 0 } };
  ck_assert (psm_beam_search (&c, B, &f, out, NULL));
  ck_assert_int_eq (t->asked, steps);
  ck_assert_int_lt (steps, (long) t->calls * B);   /* some article finished before another */
  for (int i = 0; i < B; i++)
    psm_hyp_clear (&out[i]);
  g_free (t);
}
END_TEST

/* The scorer's error stops the search and reaches the caller. */
/* The floor that skips most of a row changes nothing: a scorer over 3,000
 * slots whose scores are multiples of 1/8 (exact ties between the double sums,
 * right at the list's last entry), with NaN, +inf and -inf among them;
 * every rule on; the search with and without the floor must agree bit for
 * bit, in every step's beams (a hash of what the scorer is handed) and in
 * the results. */
#define WS 3000
#define WL 6

typedef struct {
  int K;
  int32_t hist[64][WL], len[64], nh[64][WL], nlen[64];
  float scores[65 * WS];
  gboolean was[64];
  guint64 trace;   /* every step's parents and tokens, hashed */
} Wide;

static const float *
wide_step (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act, int n_act, int per,
           int *base, int *S_out, GError **error)
{
  Wide *t = ud;
  gboolean want[64];
  ck_assert (n <= 64);
  want_rows (n, t->K, parents, act, n_act, per, t->was, want);
  for (int r = 0; r < n; r++) {
    if (!want[r])
      continue;
    int p = parents ? parents[r] : r;
    t->trace = (t->trace ^ (guint64) (p * 131071 + (tokens[r] + 1))) * 1099511628211ull;
    t->nlen[r] = parents ? t->len[p] : 0;
    memcpy (t->nh[r], t->hist[p], sizeof t->hist[p]);
    if (parents && tokens[r] >= 0 && t->nlen[r] < WL)
      t->nh[r][t->nlen[r]++] = tokens[r];
  }
  memcpy (t->hist, t->nh, sizeof t->hist);
  memcpy (t->len, t->nlen, sizeof t->len);
  memcpy (t->was, want, sizeof want);
  toy_layout (n, act, n_act, per, base, t->scores, WS);
  for (int r = 0; r < n; r++) {
    if (!want[r])
      continue;
    float *row = t->scores + (size_t) (base[r / t->K] + r % t->K) * WS;
    guint32 x = 2166136261u ^ (guint32) (r / t->K * 7919);
    for (int i = 0; i < t->len[r]; i++)
      x = (x ^ (guint32) (t->hist[r][i] + 1)) * 16777619u;
    for (int s = 0; s < WS; s++) {
      guint32 y = (x ^ (guint32) (s * 2654435761u)) * 2246822519u;
      y ^= y >> 13;
      float v = -(float) (y % 4096) / 8.0f;
      if (y % 1009 == 0)
        v = NAN;
      else if (y % 1013 == 0)
        v = -INFINITY;
      else if (y % 2027 == 0)
        v = INFINITY;
      row[s] = v;
    }
  }
  *S_out = WS;
  return t->scores;
}

/* The floor itself: no float x at or below it (the floats next to the
 * difference last - logp, of any size, zero and float-tiny ones among
 * them) has logp + x > last in double. */
START_TEST (test_score_floor)
{
  PsmRng rng;
  psm_rng_seed (&rng, 11);
  int checked = 0;
  for (int i = 0; i < 50000; i++) {
    double logp = -ldexp (psm_rng_uniform (&rng), (int) (psm_rng_u32 (&rng) % 40) - 20);
    double d;
    switch (i % 4) {
    case 0: d = 0.0; break;
    case 1: d = ldexp (psm_rng_uniform (&rng) - 0.5, -130); break;   /* below float's normal range */
    default: d = ldexp (psm_rng_uniform (&rng) - 0.5, (int) (psm_rng_u32 (&rng) % 60) - 30); break;
    }
    double last = logp + d;
    float bar = psm_beam_score_floor (last, logp);
    ck_assert (isfinite (bar));
    float x = (float) (last - logp);
    for (int j = 0; j < 4; j++)
      x = nextafterf (x, INFINITY);
    for (int j = 0; j < 9; j++, x = nextafterf (x, -INFINITY))
      if (x <= bar) {
        ck_assert_msg (!(logp + (double) x > last), "logp %a last %a: x %a <= floor %a but the sum beats last", logp,
                       last, (double) x, (double) bar);
        checked++;
      }
  }
  ck_assert_int_gt (checked, 50000);
  ck_assert (psm_beam_score_floor (-INFINITY, -1.0) == -INFINITY);
  ck_assert (psm_beam_score_floor (1.0, -INFINITY) == -INFINITY);
  ck_assert (psm_beam_score_floor (NAN, 0.0) == -INFINITY);
}
END_TEST

START_TEST (test_beam_floor)
{
  const PsmBeamConfig cfgs[] = {
    { 5, 0, WL, 0, 1.0, 0, 1, FALSE },
    { 5, 3, WL, 2, 0.0, 0, 1, TRUE },
    { 8, 2, WL, 1, 0.5, 0, 1, TRUE },
  };
  for (guint ci = 0; ci < G_N_ELEMENTS (cfgs); ci++) {
    PsmHyp out[2][4] = { { { 0 } } };
    guint64 trace[2];
    for (int on = 0; on < 2; on++) {
      Wide *t = g_new0 (Wide, 1);
      t->K = cfgs[ci].beam;
      PsmBeamFns f = { wide_step, NULL, t };
      psm_paths.beam_floor = on;
      gboolean ok = psm_beam_search (&cfgs[ci], 4, &f, out[on], NULL);
      psm_paths.beam_floor = TRUE;
      ck_assert (ok);
      trace[on] = t->trace;
      g_free (t);
    }
    ck_assert_msg (trace[0] == trace[1], "config %u: the beams differ with the floor", ci);
    for (int b = 0; b < 4; b++) {
      const PsmHyp *x = &out[0][b], *y = &out[1][b];
      ck_assert_msg (x->len == y->len && memcmp (&x->logp, &y->logp, sizeof x->logp) == 0
                     && memcmp (x->slots, y->slots, x->len * sizeof (int32_t)) == 0
                     && memcmp (x->rows, y->rows, x->len * sizeof (int32_t)) == 0,
                     "config %u article %d: with the floor len %d logp %a, without len %d logp %a", ci, b, y->len,
                     y->logp, x->len, x->logp);
      ck_assert (x->len > 0);
      psm_hyp_clear (&out[0][b]);
      psm_hyp_clear (&out[1][b]);
    }
  }
}
END_TEST

static const float *
fail_step (void *ud, int n, const int32_t *parents, const int32_t *tokens, const int *act, int n_act, int per,
           int *base, int *S_out, GError **error)
{
  g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_FAILED, "scorer failed");
  return NULL;
}

START_TEST (test_step_error)
{
  PsmBeamConfig c = { 4, 0, MAXL, 0, 1.0, 0, -1, FALSE };
  PsmBeamFns f = { fail_step, NULL, NULL };
  PsmHyp out[2] = { { 0 } };
  GError *e = NULL;
  ck_assert (!psm_beam_search (&c, 2, &f, out, &e));
  ck_assert_str_eq (e->message, "scorer failed");
  g_error_free (e);
}
END_TEST

/* ---- the teacher-forced loop inside a model ---- */

typedef struct {
  PsmModel *m;
  gboolean copies;
} ModelFix;

static PsmTensor *
f_model (PsmGraph *g, void *ud)
{
  ModelFix *f = ud;
  psm_graph_set_batch_major (g, f->copies);
  return psm_model_loss (f->m, g, psm_model_batch (f->m));
}

/* every parameter's gradient, one backward pass */
static float *
model_grads (ModelFix *f, float *loss)
{
  PsmParams *p = psm_model_params (f->m);
  memset (psm_params_grad (p), 0, psm_params_size (p) * sizeof (float));
  PsmGraph *g = psm_graph_new ();
  PsmTensor *l = f_model (g, f);
  *loss = l->data[0];
  psm_backward (g, l);
  psm_graph_free (g);
  return g_memdup2 (psm_params_grad (p), psm_params_size (p) * sizeof (float));
}

START_TEST (test_model_gradients)
{
  psm_test_plugin_env ();
  /* three articles of different lengths (padding), an OOV to copy */
  char *jl = psm_test_write_file ("tiny.jsonl",
    "{\"id\": \"a\", \"article\": \"the cat sat on the mat . the dog ran .\", \"highlights\": \"cat sat on mat\"}\n"
    "{\"id\": \"b\", \"article\": \"a dog ran to the zorblat .\", \"highlights\": \"dog ran\\nto the zorblat\"}\n"
    "{\"id\": \"c\", \"article\": \"the mat was red and the cat was not . it sat .\", \"highlights\": \"the cat sat\"}\n");
  static const char *models[] = {
    /* See et al.: bi-LSTM, LSTM decoder with coverage, pointer-generator */
    "encoder = { plugin = \"bilstm\"; hidden = 3; };\n"
    "  decoder = { plugin = \"lstm_attn\"; hidden = 3; coverage = true; };\n"
    "  head = { plugin = \"pointer_generator\"; cov_loss_wt = 1.0; };",
    /* Bahdanau: bi-GRU, GRU decoder attending from s_(t-1), softmax behind
     * the maxout deep output f_o(s_t, y_(t-1), c_t) */
    "encoder = { plugin = \"bigru\"; hidden = 3; };\n"
    "  decoder = { plugin = \"gru_attn\"; hidden = 3; };\n"
    "  head = { plugin = \"softmax\"; hidden = 3; activation = \"maxout\"; prev_word = true; };",
    /* Zeng et al.: read-again LSTM, LSTM decoder attending from h_(t-1), copy head with its input hook */
    "encoder = { plugin = \"readagain_lstm\"; hidden = 3; };\n"
    "  decoder = { plugin = \"lstm_attn\"; hidden = 3; attend = \"previous\"; init = \"bridge\"; };\n"
    "  head = { plugin = \"copy\"; };",
    /* Gulcehre et al.: bi-GRU, GRU decoder, pointer softmax (its shortlist
     * behind the maxout deep output, its switch of relu units) */
    "encoder = { plugin = \"bigru\"; hidden = 3; };\n"
    "  decoder = { plugin = \"gru_attn\"; hidden = 3; };\n"
    "  head = { plugin = \"pointer_softmax\"; };",
  };
  for (guint k = 0; k < G_N_ELEMENTS (models); k++) {
    char *cfg = g_strdup_printf ("task = { plugin = \"cnndm\"; train = \"%s\"; valid = \"%s\"; vocab = 12; };\n"
                                 "model = { embedding = { dim = 3; };\n  %s };\n"
                                 "train = { batch = 3; seed = 5; };\nrun = { dir = \"%s/run%u\"; };\n",
                                 jl, jl, models[k], psm_test_dir (), k);
    char *path = psm_test_write_file ("model.cfg", cfg);
    GError *e = NULL;
    PsmPipeline *pl = psm_pipeline_load (path, NULL, &e);
    ck_assert_msg (pl, "%s", e ? e->message : "");
    ModelFix f = { psm_model_new (pl, FALSE, &e), TRUE };
    ck_assert_msg (f.m, "%s", e ? e->message : "");
    PsmRng rng;
    psm_rng_seed (&rng, 7);
    ck_assert_msg (psm_model_train_batch (f.m, 3, &rng, &e), "%s", e ? e->message : "");
    ck_assert_int_gt (psm_model_batch (f.m)->T, 8);
    /* weights of U(-0.6, 0.6), for gradients well above float rounding */
    PsmParams *p = psm_model_params (f.m);
    size_t np = psm_params_size (p);
    psm_test_fill (psm_params_data (p), np, 0.6f, &rng);
    /* decoder steps on the rows still decoding (PSM_DECODER_LIVE_ROWS; the
     * batch's rows then in order of target length) against every step on
     * all rows in the task's order: the same loss and gradients but for
     * the order of sums */
    float l[2], *gr[2];
    for (int all = 1; all >= 0; all--) {
      psm_model_set_all_rows (f.m, all);
      gr[all] = model_grads (&f, &l[all]);
    }
    const PsmBatch *b = psm_model_batch (f.m);
    int len[3] = { 0, 0, 0 };
    for (int t = 0; t < b->Ty; t++)
      for (int j = 0; j < 3; j++)
        if (PSM_AT (b->tgt_mask, b, t, j) != 0.0f)
          len[j] = t + 1;
    ck_assert_msg (len[0] >= len[1] && len[1] >= len[2] && len[2] < len[0], "target lengths %d %d %d", len[0],
                   len[1], len[2]);
    ck_assert_msg (fabsf (l[0] - l[1]) <= 1e-6f * fabsf (l[1]), "model %u: loss %.9g on the live rows, %.9g on all",
                   k, l[0], l[1]);
    for (size_t i = 0; i < np; i++)
      ck_assert_msg (fabsf (gr[0][i] - gr[1][i]) <= 1e-5f * (1.0f + fabsf (gr[1][i])),
                     "model %u: gradient %zu: %.9g on the live rows, %.9g on all", k, i, gr[0][i], gr[1][i]);
    g_free (gr[0]);
    g_free (gr[1]);
    /* the attention's batch-major copies change no bit of any gradient */
    for (int on = 0; on < 2; on++) {
      f.copies = on;
      gr[on] = model_grads (&f, &l[on]);
    }
    ck_assert (l[0] == l[1] && isfinite (l[0]));
    for (size_t i = 0; i < np; i++)
      ck_assert_msg (gr[0][i] == gr[1][i], "model %u: gradient %zu: %.9g without the copies, %.9g with", k, i,
                     gr[0][i], gr[1][i]);
    g_free (gr[0]);
    g_free (gr[1]);
    /* finite differences, entry by entry (psm_test_gradcheck_directional) */
    char *what = g_strdup_printf ("model %u", k);
    psm_test_gradcheck_directional (FALSE);
    /* maxout and relu units have kinks, which a step of 1e-2 can cross
     * (the one-sided slopes then disagree); 1e-3 seldom does */
    psm_test_gradcheck_params (what, f_model, &f, p, k == 1 || k == 3 ? 1e-3f : 1e-2f, 2e-3, 2e-2, 60);
    psm_test_gradcheck_directional (TRUE);
    g_free (what);
    psm_model_free (f.m);
    psm_pipeline_free (pl);
    g_free (path);
    g_free (cfg);
  }
  g_free (jl);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("decode");
  TCase *tc = tcase_create ("beam");
  tcase_add_test (tc, test_beam_exhaustive);
  tcase_add_test (tc, test_greedy);
  tcase_add_test (tc, test_beam_floor);
  tcase_add_test (tc, test_score_floor);
  tcase_add_test (tc, test_step_error);
  suite_add_tcase (s, tc);
  TCase *tm = tcase_create ("model");
  tcase_add_test (tm, test_model_gradients);
  tcase_set_timeout (tm, 120);
  suite_add_tcase (s, tm);
  return psm_test_run (s);
}
