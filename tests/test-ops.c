/* test-ops.c — every op: forward against a plain reference, and a
 * finite-difference gradient check of every input.
 * Bound: |analytic - numeric| <= 2e-3 + 2e-2 max(|analytic|, |numeric|),
 * central differences with eps = 1e-2 (5e-3 for the recurrent cells) in float32. */
#include "config.h"
#include <math.h>
#include <string.h>
#include <omp.h>
#include <stdio.h>
#include "psm-test.h"
#include "ops/ops-internal.h"
#include "kernels/fastmath.h"

#define ATOL 2e-3
#define RTOL 2e-2

typedef struct {
  float *x[6], *gx[6];
  int shape[6][3], nd[6];
  int which;
  int32_t ids[128];
  float mask[256], z[64], w[64];
  int iarg[2];
} Case;

static PsmTensor *
in (PsmGraph *g, Case *c, int k)
{
  return psm_tensor_wrap (g, c->x[k], c->gx[k], c->nd[k], c->shape[k]);
}

static void
alloc_in (Case *c, int k, int nd, int d0, int d1, int d2, PsmRng *rng, float a)
{
  c->nd[k] = nd;
  c->shape[k][0] = d0;
  c->shape[k][1] = d1;
  c->shape[k][2] = d2;
  size_t n = (size_t) d0 * (nd > 1 ? d1 : 1) * (nd > 2 ? d2 : 1);
  c->x[k] = g_new (float, n);
  c->gx[k] = g_new0 (float, n);
  psm_test_fill (c->x[k], n, a, rng);
}

/* An LSTM sequence's inputs: x's gate inputs [T, B, 4H], h0 and c0 [B, H],
 * W [H, 4H] uniform in +-wa (the others in +-1), drawn in that order. */
static void
alloc_lstm_seq (Case *c, int T, int B, int H, float wa, PsmRng *rng)
{
  alloc_in (c, 0, 3, T, B, 4 * H, rng, 1.0f);
  alloc_in (c, 1, 2, B, H, 0, rng, 1.0f);
  alloc_in (c, 2, 2, B, H, 0, rng, 1.0f);
  alloc_in (c, 3, 2, H, 4 * H, 0, rng, wa);
}

static size_t
n_of (Case *c, int k)
{
  return (size_t) c->shape[k][0] * (c->nd[k] > 1 ? c->shape[k][1] : 1) * (c->nd[k] > 2 ? c->shape[k][2] : 1);
}

static void
free_case (Case *c)
{
  for (int k = 0; k < 6; k++) {
    g_free (c->x[k]);
    g_free (c->gx[k]);
  }
}

static void
check_all (const char *name, PsmLossFn f, Case *c, int n_in, float eps)
{
  for (int k = 0; k < n_in; k++) {
    char *what = g_strdup_printf ("%s input %d", name, k);
    psm_test_gradcheck (what, f, c, c->x[k], c->gx[k], n_of (c, k), eps, ATOL, RTOL, 300);
    g_free (what);
  }
}

/* ---- matmul with every transpose combination ---- */
static PsmTensor *
f_matmul (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_matmul (g, in (g, c, 0), in (g, c, 1), c->iarg[0], c->iarg[1]));
}

START_TEST (test_matmul)
{
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  /* N = 300: few rows and many columns take psm_gemm's column-split path */
  for (int wide = 0; wide < 2; wide++)
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      Case c = { 0 };
      int M = 5, K = 7, N = wide ? 300 : 4;
      alloc_in (&c, 0, 2, ta ? K : M, ta ? M : K, 0, &rng, 1.0f);
      alloc_in (&c, 1, 2, tb ? N : K, tb ? K : N, 0, &rng, 1.0f);
      c.iarg[0] = ta;
      c.iarg[1] = tb;
      /* reference forward */
      PsmGraph *g = psm_graph_new ();
      PsmTensor *y = psm_matmul (g, in (g, &c, 0), in (g, &c, 1), ta, tb);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double) c.x[0][ta ? k * M + i : i * K + k] * c.x[1][tb ? j * K + k : k * N + j];
          ck_assert_msg (fabs (s - y->data[i * N + j]) < 1e-4, "matmul ta=%d tb=%d N=%d forward", ta, tb, N);
        }
      psm_graph_free (g);
      check_all ("matmul", f_matmul, &c, 2, 1e-2f);
      free_case (&c);
    }
}
END_TEST

static PsmTensor *
f_linear (PsmGraph *g, void *ud)
{
  Case *c = ud;
  if (c->which)   /* W as a parameter: the packed-weights path for few rows */
    psm_graph_const_range (g, c->x[1], n_of (c, 1));
  return psm_test_project (g, psm_linear (g, in (g, c, 0), in (g, c, 1), in (g, c, 2)));
}

/* psm_linear and psm_lstm_cell with the weight marked as a parameter take
 * the packed path (in a build with the packed kernel): the same values as
 * the BLAS path, and a correct gradient; N = 70 is no multiple of the
 * panel width. */
static PsmTensor *
f_lstm_packed (PsmGraph *g, void *ud)
{
  Case *c = ud;
  psm_graph_const_range (g, c->x[3], n_of (c, 3));
  PsmTensor *hc = psm_lstm_cell (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask);
  return psm_test_project (g, hc);
}

static PsmTensor *
f_gru_packed (PsmGraph *g, void *ud)
{
  Case *c = ud;
  psm_graph_const_range (g, c->x[2], n_of (c, 2));
  return psm_test_project (g, psm_gru_cell (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask));
}

/* psm_linear of case c on g (W packed: a parameter of g's) and on g2 (W
 * not), element by element. */
static void
check_packed_linear (PsmGraph *g, PsmGraph *g2, Case *c, const char *what)
{
  PsmTensor *y = psm_linear (g, in (g, c, 0), in (g, c, 1), in (g, c, 2));
  PsmTensor *y2 = psm_linear (g2, in (g2, c, 0), in (g2, c, 1), in (g2, c, 2));
  for (size_t i = 0; i < y2->n; i++)
    ck_assert_msg (fabsf (y->data[i] - y2->data[i]) <= 1e-4f * (1 + fabsf (y2->data[i])), "%s [%zu]: %g vs %g", what,
                   i, y->data[i], y2->data[i]);
}

START_TEST (test_packed_weights)
{
  PsmRng rng;
  psm_rng_seed (&rng, 21);
  Case c = { 0 };
  c.which = 1;
  alloc_in (&c, 0, 2, 5, 37, 0, &rng, 1.0f);
  alloc_in (&c, 1, 2, 37, 70, 0, &rng, 1.0f);
  alloc_in (&c, 2, 1, 70, 0, 0, &rng, 1.0f);
  for (int round = 0; round < 2; round++) {   /* the second finds W packed already */
    PsmGraph *g = psm_graph_new (), *g2 = psm_graph_new ();
    psm_graph_const_range (g, c.x[1], n_of (&c, 1));
    for (int k = 0; k <= round; k++)
      check_packed_linear (g, g2, &c, "packed linear");
    psm_graph_free (g);
    psm_graph_free (g2);
  }
  /* a reset keeps the packed copy's memory but not its values: W changed
   * after the reset (an update) is packed again */
  {
    PsmGraph *g = psm_graph_new (), *g2 = psm_graph_new ();
    psm_graph_const_range (g, c.x[1], n_of (&c, 1));
    psm_linear (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2));
    psm_graph_reset (g);
    psm_graph_const_range (g, c.x[1], n_of (&c, 1));
    for (size_t i = 0; i < n_of (&c, 1); i++)
      c.x[1][i] = -0.5f * c.x[1][i] + 0.25f;
    check_packed_linear (g, g2, &c, "packed linear after a reset and an update");
    psm_graph_free (g);
    psm_graph_free (g2);
  }
  check_all ("linear (packed W)", f_linear, &c, 3, 1e-2f);
  free_case (&c);

  /* more rows than PSM_PACKED_MAX_ROWS: in a graph without gradients
   * (decoding) psm_linear and psm_lstm_cell take the packed path where the
   * wide kernel is built, and give the BLAS path's values */
  {
    Case d = { 0 };
    int R = PSM_PACKED_MAX_ROWS + 37, Hd = 40;   /* 4H = 160: two pairs of panels at AVX-512's 32 columns */
    alloc_in (&d, 0, 2, R, 4 * Hd, 0, &rng, 1.0f);
    alloc_in (&d, 1, 2, R, Hd, 0, &rng, 1.0f);
    alloc_in (&d, 2, 2, R, Hd, 0, &rng, 1.0f);
    alloc_in (&d, 3, 2, Hd, 4 * Hd, 0, &rng, 0.5f);
    alloc_in (&d, 4, 1, 4 * Hd, 0, 0, &rng, 0.5f);
    PsmGraph *gd = psm_graph_new (), *gb = psm_graph_new ();
    psm_graph_set_grad (gd, FALSE);
    psm_graph_const_range (gd, d.x[3], n_of (&d, 3));
    PsmTensor *y = psm_linear (gd, in (gd, &d, 1), in (gd, &d, 3), in (gd, &d, 4));
    PsmTensor *y2 = psm_linear (gb, in (gb, &d, 1), in (gb, &d, 3), in (gb, &d, 4));
    for (size_t i = 0; i < y2->n; i++)
      ck_assert_msg (fabsf (y->data[i] - y2->data[i]) <= 1e-4f * (1 + fabsf (y2->data[i])),
                     "linear of %d rows without gradients [%zu]: %g vs %g", R, i, y->data[i], y2->data[i]);
    for (int r = 0; r < R; r++)
      d.mask[r] = r % 5 ? 1.0f : 0.0f;
    PsmTensor *h = psm_lstm_cell (gd, in (gd, &d, 0), in (gd, &d, 1), in (gd, &d, 2), in (gd, &d, 3), d.mask);
    PsmTensor *h2 = psm_lstm_cell (gb, in (gb, &d, 0), in (gb, &d, 1), in (gb, &d, 2), in (gb, &d, 3), d.mask);
    for (size_t i = 0; i < h2->n; i++)
      ck_assert_msg (fabsf (h->data[i] - h2->data[i]) <= 1e-4f * (1 + fabsf (h2->data[i])),
                     "lstm_cell of %d rows without gradients [%zu]: %g vs %g", R, i, h->data[i], h2->data[i]);
    psm_graph_free (gd);
    psm_graph_free (gb);
    free_case (&d);
  }

  int B = 3, H = 18;   /* 4H = 72 */
  Case l = { 0 };
  alloc_in (&l, 0, 2, B, 4 * H, 0, &rng, 1.0f);
  alloc_in (&l, 1, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&l, 2, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&l, 3, 2, H, 4 * H, 0, &rng, 0.5f);
  l.mask[0] = l.mask[2] = 1.0f;
  PsmGraph *g = psm_graph_new (), *g2 = psm_graph_new ();
  PsmTensor *a = f_lstm_packed (g, &l);
  PsmTensor *b = psm_test_project (g2, psm_lstm_cell (g2, in (g2, &l, 0), in (g2, &l, 1), in (g2, &l, 2),
                                                      in (g2, &l, 3), l.mask));
  ck_assert_msg (fabsf (a->data[0] - b->data[0]) <= 1e-4f * (1 + fabsf (b->data[0])), "packed lstm_cell");
  psm_graph_free (g);
  psm_graph_free (g2);
  check_all ("lstm_cell (packed W)", f_lstm_packed, &l, 4, 5e-3f);
  free_case (&l);

  /* psm_gru_cell likewise (3H = 54), a padded row among B = 4, against the
   * BLAS path element by element */
  B = 4;
  Case u = { 0 };
  alloc_in (&u, 0, 2, B, 3 * H, 0, &rng, 1.0f);
  alloc_in (&u, 1, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&u, 2, 2, H, 3 * H, 0, &rng, 0.5f);
  alloc_in (&u, 3, 1, 3 * H, 0, 0, &rng, 0.5f);
  u.mask[0] = u.mask[1] = u.mask[3] = 1.0f;
  g = psm_graph_new ();
  g2 = psm_graph_new ();
  psm_graph_const_range (g, u.x[2], n_of (&u, 2));
  a = psm_gru_cell (g, in (g, &u, 0), in (g, &u, 1), in (g, &u, 2), in (g, &u, 3), u.mask);
  b = psm_gru_cell (g2, in (g2, &u, 0), in (g2, &u, 1), in (g2, &u, 2), in (g2, &u, 3), u.mask);
  for (int i = 0; i < B * H; i++)
    ck_assert_msg (fabsf (a->data[i] - b->data[i]) <= 1e-5f, "packed gru_cell [%d]: %g vs %g", i, a->data[i],
                   b->data[i]);
  psm_graph_free (g);
  psm_graph_free (g2);
  check_all ("gru_cell (packed W)", f_gru_packed, &u, 4, 5e-3f);
  free_case (&u);
}
END_TEST

/* Deferred weight gradients (ops-internal.h): a decoder-like recurrence of
 * three steps, x_t = h_(t-1) (x_0 given), xp = x_t W_x + b, (h, c) =
 * lstm_cell (xp, h, c, W_h), on few rows with W_x and W_h parameters of the
 * graph, so both ops note their rows and the two defer_weight nodes add
 * dW over the steps at the end: finite differences for every input, and
 * the gradients against the same graph with nothing deferred (each step
 * adding its own x^T dy), in single precision and with train.precision
 * bf16 (whose products on x_t W_x are bfloat16, deferred or not). */
static PsmTensor *
f_deferred (PsmGraph *g, void *ud)
{
  Case *c = ud;
  int B = c->shape[0][0], H = c->shape[0][1];
  psm_graph_set_bf16_train (g, c->iarg[0]);
  psm_graph_const_range (g, c->x[1], n_of (c, 1));
  psm_graph_const_range (g, c->x[3], n_of (c, 3));
  PsmTensor *x = in (g, c, 0), *h = in (g, c, 4), *cs = in (g, c, 5), *hc = NULL;
  int sh[2] = { B, H };
  for (int t = 0; t < 3; t++) {
    PsmTensor *xp = psm_linear (g, x, in (g, c, 1), in (g, c, 2));
    hc = psm_lstm_cell (g, xp, h, cs, in (g, c, 3), NULL);
    h = psm_tensor_view (g, hc, 0, 2, sh);
    cs = psm_tensor_view (g, hc, (size_t) B * H, 2, sh);
    x = h;
  }
  return psm_test_project (g, hc);
}

START_TEST (test_deferred_weight)
{
  PsmRng rng;
  psm_rng_seed (&rng, 77);
  int B = 4, H = 10;
  Case c = { 0 };
  alloc_in (&c, 0, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 1, 2, H, 4 * H, 0, &rng, 0.5f);
  alloc_in (&c, 2, 1, 4 * H, 0, 0, &rng, 0.5f);
  alloc_in (&c, 3, 2, H, 4 * H, 0, &rng, 0.5f);
  alloc_in (&c, 4, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 5, 2, B, H, 0, &rng, 1.0f);
  for (int prec = 0; prec < 2; prec++) {
    c.iarg[0] = prec;
    float *gr[2][6];
    for (int v = 0; v < 2; v++) {   /* 0: nothing deferred, 1: W_x and W_h deferred */
      psm_paths.defer_weights = v == 1;
      for (int k = 0; k < 6; k++)
        memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
      PsmGraph *g = psm_graph_new ();
      psm_backward (g, f_deferred (g, &c));
      psm_graph_free (g);
      for (int k = 0; k < 6; k++)
        gr[v][k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
    }
    psm_paths.defer_weights = TRUE;
    for (int k = 0; k < 6; k++) {
      for (size_t i = 0; i < n_of (&c, k); i++)
        ck_assert_msg (fabsf (gr[1][k][i] - gr[0][k][i]) <= 1e-5f * (1 + fabsf (gr[0][k][i])),
                       "deferred weight gradients (%s): d%d[%zu] = %g, %g without deferral", prec ? "bf16" : "fp32", k,
                       i, gr[1][k][i], gr[0][k][i]);
      g_free (gr[0][k]);
      g_free (gr[1][k]);
    }
  }
  c.iarg[0] = 0;
  check_all ("linear + lstm_cell, weights deferred", f_deferred, &c, 6, 5e-3f);
  free_case (&c);
}
END_TEST

START_TEST (test_linear)
{
  PsmRng rng;
  psm_rng_seed (&rng, 2);
  Case c = { 0 };
  alloc_in (&c, 0, 3, 3, 2, 5, &rng, 1.0f);   /* [T, B, K]: leading dims flatten */
  alloc_in (&c, 1, 2, 5, 6, 0, &rng, 1.0f);
  alloc_in (&c, 2, 1, 6, 0, 0, &rng, 1.0f);
  PsmGraph *g = psm_graph_new ();
  PsmTensor *y = psm_linear (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2));
  ck_assert_int_eq (y->ndim, 3);
  ck_assert_int_eq (y->shape[2], 6);
  for (int r = 0; r < 6; r++)
    for (int j = 0; j < 6; j++) {
      double s = c.x[2][j];
      for (int k = 0; k < 5; k++)
        s += (double) c.x[0][r * 5 + k] * c.x[1][k * 6 + j];
      ck_assert (fabs (s - y->data[r * 6 + j]) < 1e-4);
    }
  psm_graph_free (g);
  check_all ("linear", f_linear, &c, 3, 1e-2f);
  free_case (&c);
}
END_TEST

/* ---- linear of an embedding lookup: each distinct id projected once ---- */
static PsmTensor *
f_embedding_linear (PsmGraph *g, void *ud)
{
  Case *c = ud;
  int R = c->iarg[0];
  PsmTensor *x = psm_embedding (g, in (g, c, 0), c->ids, R);
  PsmTensor *y = psm_test_project (g, psm_linear (g, x, in (g, c, 1), c->which ? NULL : in (g, c, 2)));
  /* which 2: the lookup read by another op too; its gradient adds to the table's */
  return c->which == 2 ? psm_add (g, y, psm_test_project (g, psm_tanh (g, x))) : y;
}

START_TEST (test_embedding_linear)
{
  PsmRng rng;
  psm_rng_seed (&rng, 8);
  /* 100 rows (above PSM_PACKED_MAX_ROWS) over 7 ids: the projection runs on
   * the 7 distinct rows; then 100 rows over 100 distinct ids: the plain GEMM */
  for (int distinct = 0; distinct < 2; distinct++) {
    Case c = { 0 };
    int V = distinct ? 100 : 9, R = 100, K = 5, N = 6;
    alloc_in (&c, 0, 2, V, K, 0, &rng, 1.0f);
    alloc_in (&c, 1, 2, K, N, 0, &rng, 1.0f);
    alloc_in (&c, 2, 1, N, 0, 0, &rng, 1.0f);
    c.iarg[0] = R;
    for (int r = 0; r < R; r++)
      c.ids[r] = distinct ? (r * 37) % V : 1 + (r * r + 3 * r) % 7;
    PsmGraph *g = psm_graph_new ();
    PsmTensor *x = psm_embedding (g, in (g, &c, 0), c.ids, R);
    PsmTensor *y = psm_linear (g, x, in (g, &c, 1), in (g, &c, 2));
    ck_assert_int_eq (y->shape[0], R);
    ck_assert_int_eq (y->shape[1], N);
    for (int r = 0; r < R; r++)
      for (int j = 0; j < N; j++) {
        double s = c.x[2][j];
        for (int k = 0; k < K; k++)
          s += (double) c.x[0][c.ids[r] * K + k] * c.x[1][k * N + j];
        ck_assert_msg (fabs (s - y->data[r * N + j]) < 1e-5, "row %d col %d: %g, expected %g", r, j,
                       y->data[r * N + j], s);
      }
    psm_graph_free (g);
    for (c.which = 0; c.which < 3; c.which++) {
      char *what = g_strdup_printf ("embedding_linear (%s ids, %s)", distinct ? "distinct" : "repeated",
                                    c.which == 0 ? "with bias" : c.which == 1 ? "no bias" : "lookup read twice");
      check_all (what, f_embedding_linear, &c, c.which == 1 ? 2 : 3, 1e-2f);
      g_free (what);
    }
    free_case (&c);
  }
}
END_TEST

/* The vectorised exp, tanh and log of core/kernels/fastmath.h against libm over
 * their working ranges (log down to FLT_MIN, where psm_log's floor keeps it). */
START_TEST (test_fastmath)
{
  double worst_exp = 0, worst_log = 0, worst_tanh = 0, worst_tanh_rel = 0;
  for (int i = 0; i <= 200000; i++) {
    float x = -87.0f + 175.0f * (float) i / 200000.0f;
    double e = exp ((double) x), fe = psm_fast_expf (x);
    worst_exp = MAX (worst_exp, fabs (fe - e) / e);
    float t = -12.0f + 24.0f * (float) i / 200000.0f;
    worst_tanh = MAX (worst_tanh, fabs (psm_fast_tanhf (t) - tanh ((double) t)));
    float ts = t * 1e-4f;   /* near 0 tanh(x) ~ x: relative error */
    if (ts != 0.0f)
      worst_tanh_rel = MAX (worst_tanh_rel, fabs (psm_fast_tanhf (ts) - tanh ((double) ts)) / fabs (tanh ((double) ts)));
    float l = (float) pow (10.0, -37.9 + 75.8 * (double) i / 200000.0);
    double ll = log ((double) l);
    worst_log = MAX (worst_log, fabs (psm_fast_logf (l) - ll) / MAX (fabs (ll), 1.0));
  }
  for (float l = 0.5f; l < 2.0f; l += 1e-5f) {   /* around 1, where log is near 0: absolute error */
    worst_log = MAX (worst_log, fabs (psm_fast_logf (l) - log ((double) l)));
  }
  ck_assert_msg (worst_exp < 1e-6, "fast exp: relative error %g", worst_exp);
  ck_assert_msg (worst_tanh < 1e-6, "fast tanh: absolute error %g", worst_tanh);
  ck_assert_msg (worst_tanh_rel < 1e-6, "fast tanh near 0: relative error %g", worst_tanh_rel);
  for (float t = 0.0f; t < 100.0f; t += 1e-3f)
    ck_assert (psm_fast_tanhf (t) <= 1.0f + 2e-7f && psm_fast_tanhf (-t) >= -1.0f - 2e-7f);
  ck_assert (psm_fast_tanhf (100.0f) > 1.0f - 2e-7f && psm_fast_tanhf (-100.0f) < -1.0f + 2e-7f);
  ck_assert (psm_fast_tanhf (0.0f) == 0.0f);
  ck_assert_msg (worst_log < 1e-6, "fast log: error %g", worst_log);
  ck_assert (psm_fast_logf (1.0f) == 0.0f);
}
END_TEST

/* ---- elementwise ---- */
static PsmTensor *
f_unary (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmTensor *x = in (g, c, 0), *y = NULL;
  switch (c->which) {
  case 0: y = psm_sigmoid (g, x); break;
  case 1: y = psm_tanh (g, x); break;
  case 2: y = psm_relu (g, x); break;
  case 3: y = psm_scale (g, x, -1.7f); break;
  case 4: y = psm_softmax (g, x); break;
  case 5: y = psm_log_softmax (g, x); break;
  case 6: y = psm_masked_softmax (g, x, c->mask); break;
  case 7: y = psm_masked_log_softmax (g, x, c->mask); break;
  case 8: y = psm_transpose01 (g, x); break;
  case 9: y = psm_slice (g, x, 1, 3); break;
  case 10: return psm_sum (g, psm_mul (g, x, x));
  case 11: return psm_mean (g, psm_mul (g, x, x));
  case 12: y = psm_pick (g, x, c->ids); break;
  case 13: y = psm_gather_rows (g, x, c->ids, 5); break;
  case 14: y = psm_scatter_rows (g, x, c->ids, 7); break;
  }
  if (c->which == 7) {
    /* -inf entries are masked: project only the kept ones */
    PsmTensor *r = psm_tensor_new (g, y->ndim, y->shape, FALSE);
    for (size_t i = 0; i < y->n; i++)
      r->data[i] = c->mask[i] != 0.0f ? (float) ((i * 37 % 11) - 5) / 5.0f : 0.0f;
    PsmTensor *safe = psm_pick (g, y, c->ids);   /* a kept entry per row */
    (void) r;
    return psm_sum (g, psm_mul (g, safe, safe));
  }
  return psm_test_project (g, y);
}

static double
ref_unary (int which, double v)
{
  switch (which) {
  case 0: return 1.0 / (1.0 + exp (-v));
  case 1: return tanh (v);
  case 2: return v > 0 ? v : 0;
  case 3: return -1.7 * v;
  }
  return 0;
}

START_TEST (test_unary)
{
  const char *names[] = { "sigmoid", "tanh", "relu", "scale", "softmax", "log_softmax",
                          "masked_softmax", "masked_log_softmax", "transpose01", "slice",
                          "mul/sum", "mul/mean", "pick", "gather_rows", "scatter_rows" };
  PsmRng rng;
  psm_rng_seed (&rng, 3);
  for (int w = 0; w < 15; w++) {
    Case c = { 0 };
    c.which = w;
    alloc_in (&c, 0, w == 8 ? 3 : 2, 4, 6, 3, &rng, 2.0f);
    if (w == 2)   /* keep away from the kink at 0 */
      for (size_t i = 0; i < n_of (&c, 0); i++)
        if (fabsf (c.x[0][i]) < 0.05f)
          c.x[0][i] = 0.3f;
    for (int i = 0; i < 24; i++)
      c.mask[i] = (i % 6 == 2 || i % 5 == 4) ? 0.0f : 1.0f;
    for (int i = 0; i < 8; i++)
      c.ids[i] = (i * 5 + 1) % 4;
    if (w == 12 || w == 7)
      for (int i = 0; i < 4; i++)
        c.ids[i] = (i == 2) ? -1 : 0;   /* every row keeps column 0; -1 skips */
    if (w == 14)   /* x's 4 rows to rows 0, 2, 3, 6 of 7 */
      for (int i = 0; i < 4; i++)
        c.ids[i] = (int32_t[]) { 0, 2, 3, 6 }[i];
    if (w < 4) {
      PsmGraph *g = psm_graph_new ();
      PsmTensor *y = w == 0 ? psm_sigmoid (g, in (g, &c, 0)) : w == 1 ? psm_tanh (g, in (g, &c, 0))
                   : w == 2 ? psm_relu (g, in (g, &c, 0)) : psm_scale (g, in (g, &c, 0), -1.7f);
      for (size_t i = 0; i < y->n; i++)
        ck_assert_msg (fabs (y->data[i] - ref_unary (w, c.x[0][i])) < 1e-5, "%s forward", names[w]);
      psm_graph_free (g);
    }
    if (w == 4 || w == 6) {
      PsmGraph *g = psm_graph_new ();
      PsmTensor *y = w == 4 ? psm_softmax (g, in (g, &c, 0)) : psm_masked_softmax (g, in (g, &c, 0), c.mask);
      for (int r = 0; r < 4; r++) {
        double z = 0;
        for (int j = 0; j < 6; j++)
          if (w == 4 || c.mask[r * 6 + j] != 0.0f)
            z += exp (c.x[0][r * 6 + j]);
        for (int j = 0; j < 6; j++) {
          double ref = (w == 4 || c.mask[r * 6 + j] != 0.0f) ? exp (c.x[0][r * 6 + j]) / z : 0.0;
          ck_assert_msg (fabs (ref - y->data[r * 6 + j]) < 1e-6, "%s forward", names[w]);
        }
      }
      psm_graph_free (g);
    }
    check_all (names[w], f_unary, &c, 1, 1e-2f);
    free_case (&c);
  }
}
END_TEST

static PsmTensor *
f_binary (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmTensor *a = in (g, c, 0), *b = in (g, c, 1);
  switch (c->which) {
  case 0: return psm_test_project (g, psm_add (g, a, b));
  case 1: return psm_test_project (g, psm_mul (g, a, b));
  case 2: return psm_test_project (g, psm_concat (g, a, b));
  case 3: return psm_test_project (g, psm_attend (g, psm_softmax (g, a), b));
  case 4: return psm_test_project (g, psm_concat_steps (g, a, b));
  }
  return NULL;
}

START_TEST (test_binary)
{
  PsmRng rng;
  psm_rng_seed (&rng, 4);
  /* add: same shape, bias [C] tiled over rows, [B, H] tiled over T */
  int bshapes[3][3] = { { 3, 2, 4 }, { 4, 0, 0 }, { 2, 4, 0 } };
  int bnd[3] = { 3, 1, 2 };
  for (int v = 0; v < 3; v++) {
    Case c = { 0 };
    c.which = 0;
    alloc_in (&c, 0, 3, 3, 2, 4, &rng, 1.0f);
    alloc_in (&c, 1, bnd[v], bshapes[v][0], bshapes[v][1], bshapes[v][2], &rng, 1.0f);
    check_all ("add", f_binary, &c, 2, 1e-2f);
    free_case (&c);
  }
  Case m = { 0 };
  m.which = 1;
  alloc_in (&m, 0, 2, 3, 4, 0, &rng, 1.0f);
  alloc_in (&m, 1, 2, 3, 4, 0, &rng, 1.0f);
  check_all ("mul", f_binary, &m, 2, 1e-2f);
  free_case (&m);
  Case cc = { 0 };
  cc.which = 2;
  alloc_in (&cc, 0, 2, 3, 4, 0, &rng, 1.0f);
  alloc_in (&cc, 1, 2, 3, 2, 0, &rng, 1.0f);
  check_all ("concat", f_binary, &cc, 2, 1e-2f);
  free_case (&cc);
  /* concat_steps: [2, 3, 4] then [1, 3, 4]; forward is the two in order */
  Case cs = { 0 };
  cs.which = 4;
  alloc_in (&cs, 0, 3, 2, 3, 4, &rng, 1.0f);
  alloc_in (&cs, 1, 3, 1, 3, 4, &rng, 1.0f);
  {
    PsmGraph *g = psm_graph_new ();
    PsmTensor *y = psm_concat_steps (g, in (g, &cs, 0), in (g, &cs, 1));
    ck_assert (y->ndim == 3 && y->shape[0] == 3 && y->shape[1] == 3 && y->shape[2] == 4);
    for (int i = 0; i < 36; i++)
      ck_assert (y->data[i] == (i < 24 ? cs.x[0][i] : cs.x[1][i - 24]));
    psm_graph_free (g);
  }
  check_all ("concat_steps", f_binary, &cs, 2, 1e-2f);
  free_case (&cs);
  Case at = { 0 };
  at.which = 3;
  alloc_in (&at, 0, 2, 2, 5, 0, &rng, 1.0f);      /* a [B=2, T=5] */
  alloc_in (&at, 1, 3, 5, 2, 3, &rng, 1.0f);      /* v [T=5, B=2, H=3] */
  check_all ("attend", f_binary, &at, 2, 1e-2f);
  free_case (&at);
}
END_TEST

/* ---- embedding, losses ---- */
static PsmTensor *
f_loss (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmTensor *x = in (g, c, 0);
  switch (c->which) {
  case 0: return psm_test_project (g, psm_embedding (g, x, c->ids, 6));
  case 1: return psm_nll (g, psm_log_softmax (g, x), c->ids, c->w);
  case 2: return psm_cross_entropy (g, x, c->ids, c->w);
  case 3: return psm_bce_logits (g, x, c->z, c->w);
  case 4: return psm_cross_entropy (g, x, c->ids, NULL);
  }
  return NULL;
}

START_TEST (test_losses)
{
  PsmRng rng;
  psm_rng_seed (&rng, 5);
  const char *names[] = { "embedding", "nll", "cross_entropy", "bce_logits", "cross_entropy (no weights)" };
  for (int w = 0; w < 5; w++) {
    Case c = { 0 };
    c.which = w;
    alloc_in (&c, 0, 2, 6, 5, 0, &rng, 2.0f);
    for (int i = 0; i < 6; i++) {
      c.ids[i] = (i * 3 + 1) % 5;
      c.w[i] = (float) (i % 3) * 0.5f;
      c.z[i] = (float) (i % 2);
    }
    c.ids[4] = -1;   /* skipped row */
    if (w == 0)
      c.ids[4] = 2;  /* repeated id: scatter-add must accumulate */
    check_all (names[w], f_loss, &c, 1, 1e-2f);
    /* forward against the definition */
    PsmGraph *g = psm_graph_new ();
    if (w == 1 || w == 2 || w == 4) {
      PsmTensor *y = f_loss (g, &c);
      double s = 0, W = 0;
      for (int i = 0; i < 6; i++) {
        if (c.ids[i] < 0)
          continue;
        double z = 0, wi = w == 4 ? 1.0 : c.w[i];
        for (int j = 0; j < 5; j++)
          z += exp (c.x[0][i * 5 + j]);
        s -= wi * (c.x[0][i * 5 + c.ids[i]] - log (z));
        W += wi;
      }
      ck_assert_msg (fabs (y->data[0] - s / W) < 1e-5, "%s forward %g vs %g", names[w], y->data[0], s / W);
    }
    if (w == 3) {
      PsmTensor *y = f_loss (g, &c);
      double s = 0, W = 0;
      for (int i = 0; i < 6; i++) {
        double x = c.x[0][i], p = 1.0 / (1.0 + exp (-x));
        s -= c.w[i] * (c.z[i] ? log (p) : log (1 - p));
        W += c.w[i];
      }
      ck_assert (fabs (y->data[0] - s / W) < 1e-5);
    }
    psm_graph_free (g);
    free_case (&c);
  }
}
END_TEST

/* ---- recurrent cells: against a composition of checked primitive ops ---- */
static PsmTensor *
gru_ref (PsmGraph *g, PsmTensor *xp, PsmTensor *h, PsmTensor *w, PsmTensor *bh)
{
  int H = psm_tensor_cols (h);
  PsmTensor *G = psm_linear (g, h, w, bh);
  PsmTensor *r = psm_sigmoid (g, psm_add (g, psm_slice (g, xp, 0, H), psm_slice (g, G, 0, H)));
  PsmTensor *z = psm_sigmoid (g, psm_add (g, psm_slice (g, xp, H, H), psm_slice (g, G, H, H)));
  PsmTensor *n = psm_tanh (g, psm_add (g, psm_slice (g, xp, 2 * H, H), psm_mul (g, r, psm_slice (g, G, 2 * H, H))));
  /* h' = n + z (h - n) */
  PsmTensor *hmn = psm_add (g, h, psm_scale (g, n, -1.0f));
  return psm_add (g, n, psm_mul (g, z, hmn));
}

static PsmTensor *
f_gru (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmTensor *xp = in (g, c, 0), *h = in (g, c, 1), *w = in (g, c, 2), *b = in (g, c, 3);
  if (c->which == 0)
    return psm_test_project (g, psm_gru_cell (g, xp, h, w, b, c->mask));
  /* gru_seq over T = 3 steps; xp is [3, B, 3H] */
  return psm_test_project (g, psm_gru_seq (g, xp, h, w, b, c->mask));
}

START_TEST (test_gru)
{
  PsmRng rng;
  psm_rng_seed (&rng, 6);
  int B = 3, H = 4, T = 3;
  for (int which = 0; which < 2; which++) {
    Case c = { 0 };
    c.which = which;
    if (which == 0)
      alloc_in (&c, 0, 2, B, 3 * H, 0, &rng, 1.0f);
    else
      alloc_in (&c, 0, 3, T, B, 3 * H, &rng, 1.0f);
    alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
    alloc_in (&c, 2, 2, H, 3 * H, 0, &rng, 0.8f);
    alloc_in (&c, 3, 1, 3 * H, 0, 0, &rng, 0.5f);
    for (int i = 0; i < T * B; i++)
      c.mask[i] = (i == 1 || i == 8) ? 0.0f : 1.0f;   /* padding carries the state */
    /* forward against the composition, step by step */
    PsmGraph *g = psm_graph_new ();
    PsmTensor *xp = in (g, &c, 0), *h = in (g, &c, 1), *w = in (g, &c, 2), *b = in (g, &c, 3);
    PsmTensor *fused = which == 0 ? psm_gru_cell (g, xp, h, w, b, c.mask) : psm_gru_seq (g, xp, h, w, b, c.mask);
    PsmTensor *hp = h;
    for (int t = 0; t < (which ? T : 1); t++) {
      PsmTensor *xt = which ? psm_tensor_step (g, xp, t) : xp;
      PsmTensor *ref = gru_ref (g, xt, hp, w, b);
      PsmTensor *ft = which ? psm_tensor_step (g, fused, t) : fused;
      for (int bi = 0; bi < B; bi++)
        for (int j = 0; j < H; j++) {
          float want = c.mask[t * B + bi] != 0.0f ? ref->data[bi * H + j] : hp->data[bi * H + j];
          ck_assert_msg (fabsf (want - ft->data[bi * H + j]) < 1e-5, "gru forward t=%d b=%d", t, bi);
        }
      hp = ft;
    }
    psm_graph_free (g);
    check_all (which ? "gru_seq" : "gru_cell", f_gru, &c, 4, 5e-3f);
    free_case (&c);
  }
}
END_TEST

/* gru_seq on both of its paths, packed weights with the rows split over
 * the threads (B = 13 gives blocks of 6 and 7 rows on 2 threads; 3H = 210
 * is no multiple of the panel width) and one psm_gemm per step, at two
 * sizes: outputs and the gradients of all four inputs against the unrolled
 * composition of checked primitive ops (gru_ref), through the tape on both
 * sides; the packed path gives the same bits on 1 and 3 threads; then
 * finite differences with padding rows on each path. */
static float
seq_loss (PsmGraph *g, float **x, float **gx, int T, int B, int H, const float *R, gboolean fused)
{
  int sx[3] = { T, B, 3 * H }, s0[2] = { B, H }, sw[2] = { H, 3 * H }, sb[1] = { 3 * H };
  int sr[2] = { B, H };
  PsmTensor *xp = psm_tensor_wrap (g, x[0], gx[0], 3, sx), *h = psm_tensor_wrap (g, x[1], gx[1], 2, s0);
  PsmTensor *w = psm_tensor_wrap (g, x[2], gx[2], 2, sw), *b = psm_tensor_wrap (g, x[3], gx[3], 1, sb);
  PsmTensor *seq = fused ? psm_gru_seq (g, xp, h, w, b, NULL) : NULL, *loss = NULL;
  for (int t = 0; t < T; t++) {
    h = fused ? psm_tensor_step (g, seq, t) : gru_ref (g, psm_tensor_step (g, xp, t), h, w, b);
    PsmTensor *rt = psm_tensor_wrap (g, (float *) R + (size_t) t * B * H, NULL, 2, sr);
    PsmTensor *l = psm_sum (g, psm_mul (g, h, rt));
    loss = loss ? psm_add (g, loss, l) : l;
  }
  psm_backward (g, loss);
  return loss->data[0];
}

START_TEST (test_gru_seq_paths)
{
  PsmRng rng;
  psm_rng_seed (&rng, 8);
  gboolean saved = psm_paths.gru_packed;
  for (int packed = 0; packed < 2; packed++)
    for (int big = 0; big < 2; big++) {
      psm_paths.gru_packed = packed;
      int T = 4, B = big ? 70 : 13, H = big ? 20 : 70;
      size_t n[4] = { (size_t) T * B * 3 * H, (size_t) B * H, (size_t) H * 3 * H, 3 * (size_t) H };
      float a[4] = { 1.0f, 1.0f, 0.3f, 0.5f };
      float *x[4], *g1[4], *g2[4], *R = g_new (float, (size_t) T * B * H);
      for (int k = 0; k < 4; k++) {
        x[k] = g_new (float, n[k]);
        g1[k] = g_new0 (float, n[k]);
        g2[k] = g_new0 (float, n[k]);
        psm_test_fill (x[k], n[k], a[k], &rng);
      }
      psm_test_fill (R, (size_t) T * B * H, 1.0f, &rng);
      PsmGraph *g = psm_graph_new ();
      if (packed) {
        /* the rows split differently over 1 and 3 threads, same bits (not
         * checked: dW, one BLAS GEMM, whose bits may depend on the threads) */
        int nt = omp_get_max_threads ();
        omp_set_num_threads (1);
        seq_loss (g, x, g1, T, B, H, R, TRUE);
        omp_set_num_threads (3);
        psm_graph_reset (g);
        seq_loss (g, x, g2, T, B, H, R, TRUE);
        omp_set_num_threads (nt);
        for (int k = 0; k < 4; k++) {
          ck_assert_msg (k == 2 || memcmp (g1[k], g2[k], n[k] * sizeof (float)) == 0,
                         "gru_seq packed B=%d: input %d gradient depends on the threads", B, k);
          memset (g1[k], 0, n[k] * sizeof (float));
          memset (g2[k], 0, n[k] * sizeof (float));
        }
        psm_graph_reset (g);
      }
      float l1 = seq_loss (g, x, g1, T, B, H, R, TRUE);
      psm_graph_reset (g);
      float l2 = seq_loss (g, x, g2, T, B, H, R, FALSE);
      psm_graph_free (g);
      ck_assert_msg (fabsf (l1 - l2) <= 1e-4f * fabsf (l2) + 1e-3f, "packed=%d B=%d loss %g vs %g",
                     packed, B, l1, l2);
      for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++)
          ck_assert_msg (fabsf (g1[k][i] - g2[k][i]) <= 1e-4f + 1e-3f * fabsf (g2[k][i]),
                         "gru_seq packed=%d B=%d H=%d input %d grad[%zu]: %g vs %g",
                         packed, B, H, k, i, g1[k][i], g2[k][i]);
      for (int k = 0; k < 4; k++) {
        g_free (x[k]);
        g_free (g1[k]);
        g_free (g2[k]);
      }
      g_free (R);
    }
  /* finite differences, padding rows included */
  for (int packed = 0; packed < 2; packed++) {
    psm_paths.gru_packed = packed;
    Case c = { 0 };
    int T = 3, B = 13, H = 70;
    c.which = 1;
    alloc_in (&c, 0, 3, T, B, 3 * H, &rng, 1.0f);
    alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
    alloc_in (&c, 2, 2, H, 3 * H, 0, &rng, 0.3f);
    alloc_in (&c, 3, 1, 3 * H, 0, 0, &rng, 0.5f);
    for (int i = 0; i < T * B; i++)
      c.mask[i] = i % 5 == 2 ? 0.0f : 1.0f;
    check_all (packed ? "gru_seq packed" : "gru_seq per-step gemm", f_gru, &c, 4, 5e-3f);
    free_case (&c);
  }
  psm_paths.gru_packed = saved;
}
END_TEST

/* Bias gradients: column sums, big enough to be shared over the threads,
 * added to what is there, against a plain loop. */
START_TEST (test_colsum)
{
  PsmRng rng;
  psm_rng_seed (&rng, 10);
  int R = 300, C = 600;
  float *x = g_new (float, (size_t) R * C), *out = g_new (float, C);
  psm_test_fill (x, (size_t) R * C, 1.0f, &rng);
  psm_test_fill (out, C, 1.0f, &rng);
  float *before = g_memdup2 (out, C * sizeof (float));
  psm_colsum_add (R, C, x, out);
  for (int j = 0; j < C; j++) {
    double want = before[j];
    for (int r = 0; r < R; r++)
      want += x[(size_t) r * C + j];
    ck_assert_msg (fabs (out[j] - want) < 1e-3, "column %d: %g vs %g", j, out[j], want);
  }
  g_free (x);
  g_free (out);
  g_free (before);
}
END_TEST

/* The recurrences' packed small-row GEMM against a plain loop: row counts
 * around the blocks of rows (6 or 8, and the balanced last two blocks of
 * 7-10 rows), column counts that fill or pad panels, starting at a column
 * other than 0, both orientations of B; the padding columns of C must be
 * written as zeros and nothing beyond them, and every row must be bit for
 * bit what it is when computed alone (the result does not depend on how
 * rows are blocked or shared out between threads). Packings above 1 MB
 * take the path that prefetches the next panel (packgemm.c). */
static void
check_packed_gemm (PsmRng *rng, int tb, int M, int K, int n)
{
  int Nb = MAX (80, n + 10);
  int ldb = tb ? K + 1 : Nb + 3, lda = K + 2, npad = psm_pack_panels (n) * PSM_PACK_NR;
  int ldc = npad + 5;
  float *A = g_new (float, (size_t) M * lda), *B = g_new (float, (size_t) (tb ? Nb : K) * ldb);
  float *C = g_new (float, (size_t) M * ldc), *bp = g_new (float, psm_packed_floats (K, n));
  int c0 = 3;   /* first packed column of op(B) */
  psm_test_fill (A, (size_t) M * lda, 1.0f, rng);
  psm_test_fill (B, (size_t) (tb ? Nb : K) * ldb, 1.0f, rng);
  for (size_t i = 0; i < (size_t) M * ldc; i++)
    C[i] = 1e30f;
  psm_pack (K, n, tb ? B + (size_t) c0 * ldb : B + c0, ldb, tb, bp);
  psm_packed_gemm (M, K, n, A, lda, bp, C, ldc);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < n; j++) {
      double want = 0;
      for (int k = 0; k < K; k++)
        want += (double) A[(size_t) i * lda + k] * (tb ? B[(size_t) (c0 + j) * ldb + k] : B[(size_t) k * ldb + c0 + j]);
      ck_assert_msg (fabs (C[(size_t) i * ldc + j] - want) <= 1e-5 * (1 + K), "packed gemm tb=%d M=%d K=%d n=%d C[%d][%d]",
                     tb, M, K, n, i, j);
    }
    for (int j = n; j < npad; j++)
      ck_assert_msg (C[(size_t) i * ldc + j] == 0.0f, "padding column %d written", j);
    for (int j = npad; j < ldc; j++)
      ck_assert_msg (C[(size_t) i * ldc + j] == 1e30f, "column %d beyond the panels written", j);
    float *alone = g_new (float, npad);
    psm_packed_gemm (1, K, n, A + (size_t) i * lda, lda, bp, alone, npad);
    ck_assert_msg (memcmp (alone, C + (size_t) i * ldc, n * sizeof (float)) == 0,
                   "packed gemm tb=%d M=%d K=%d n=%d: row %d differs when computed alone", tb, M, K, n, i);
    g_free (alone);
  }
  /* where two whole panels go through the wide kernel (AVX-512 builds,
   * PSM_PACK_WIDE_ROWS rows or more), the first panel's columns are the
   * bits the one-panel kernel gives */
  if (n >= 2 * PSM_PACK_NR) {
    float *bp1 = g_new (float, psm_packed_floats (K, PSM_PACK_NR)), *C1 = g_new (float, (size_t) M * PSM_PACK_NR);
    psm_pack (K, PSM_PACK_NR, tb ? B + (size_t) c0 * ldb : B + c0, ldb, tb, bp1);
    psm_packed_gemm (M, K, PSM_PACK_NR, A, lda, bp1, C1, PSM_PACK_NR);
    for (int i = 0; i < M; i++)
      ck_assert_msg (memcmp (C1 + (size_t) i * PSM_PACK_NR, C + (size_t) i * ldc, PSM_PACK_NR * sizeof (float)) == 0,
                     "packed gemm tb=%d M=%d K=%d n=%d: row %d differs from the one-panel kernel's", tb, M, K, n, i);
    g_free (bp1);
    g_free (C1);
  }
  g_free (A);
  g_free (B);
  g_free (C);
  g_free (bp);
}

START_TEST (test_packed_gemm)
{
  PsmRng rng;
  psm_rng_seed (&rng, 9);
  int Ms[] = { 1, 7, 8, 9, 10, 13, 16, 50, 53, 64 }, Ks[] = { 1, 40 }, ns[] = { 5, 32, 70, 130 };
  for (int tb = 0; tb < 2; tb++)
    for (int mi = 0; mi < (int) G_N_ELEMENTS (Ms); mi++)
      for (int ki = 0; ki < 2; ki++)
        for (int ni = 0; ni < (int) G_N_ELEMENTS (ns); ni++)
          check_packed_gemm (&rng, tb, Ms[mi], Ks[ki], ns[ni]);
  /* 520 x 600: 1.26 MB packed at any vector width, a partial last panel */
  ck_assert (psm_packed_floats (520, 600) * sizeof (float) > PSM_PACK_PREFETCH_BYTES);
  for (int tb = 0; tb < 2; tb++) {
    check_packed_gemm (&rng, tb, 9, 520, 600);
    check_packed_gemm (&rng, tb, 64, 520, 600);
  }
}
END_TEST

/* decode.precision bf16 (kernels/bf16.c). The rounding: to nearest, ties to
 * even, NaN and infinities kept, the largest floats to infinity. The
 * product against a double-precision sum of the rounded operands, on the
 * AMX tiles where the CPU has them and on psm's packed kernel (both here
 * when it has), shapes with partial tiles of rows, k and columns; and
 * through psm_linear: a graph set to bf16 without gradients takes it, the
 * same graph with gradients and one not set keep single precision. */
static void
check_gemm_bf16 (PsmRng *rng, int M, int K, int N, gboolean bias, gboolean acc)
{
  float *A = g_new (float, (size_t) M * (K + 3)), *W = g_new (float, (size_t) K * N), *b = g_new (float, N);
  float *C = g_new (float, (size_t) M * (N + 5));
  psm_test_fill (A, (size_t) M * (K + 3), 1.0f, rng);
  psm_test_fill (W, (size_t) K * N, 1.0f, rng);
  psm_test_fill (b, N, 1.0f, rng);
  for (size_t i = 0; i < (size_t) M * (N + 5); i++)
    C[i] = 7.0f;
  void *wp = psm_xaligned (psm_bf16_packed_bytes (K, N), "test");
  psm_bf16_pack (K, N, W, wp);
  psm_gemm_bf16 (M, N, K, A, K + 3, wp, bias ? b : NULL, acc, C, N + 5);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = (bias ? b[j] : 0.0) + (acc ? 7.0 : 0.0), mag = fabs (s);
      for (int k = 0; k < K; k++) {
        double p = (double) psm_bf16_round (A[(size_t) i * (K + 3) + k]) * psm_bf16_round (W[(size_t) k * N + j]);
        s += p;
        mag += fabs (p);
      }
      float c = C[(size_t) i * (N + 5) + j];
      ck_assert_msg (fabs (c - s) <= 1e-6 * (K + 1) * mag + 1e-30, "bf16 amx %d M=%d K=%d N=%d C[%d][%d] = %g, want %g",
                     psm_amx_usable (), M, K, N, i, j, c, s);
    }
    for (int j = N; j < N + 5; j++)
      ck_assert_msg (C[(size_t) i * (N + 5) + j] == 7.0f, "bf16 M=%d N=%d: column %d past N written", M, N, j);
  }
  free (wp);
  g_free (A);
  g_free (W);
  g_free (b);
  g_free (C);
}

/* psm_gemm_bf16_op: op(A) op(B) on operands rounded, each transposed or
 * not, into C with a row stride, set or added to, against double sums. */
static void
check_gemm_bf16_op (PsmRng *rng, gboolean ta, gboolean tb, int M, int K, int N, gboolean acc)
{
  int lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 3, ldc = N + 5;
  float *A = g_new (float, (size_t) (ta ? K : M) * lda), *B = g_new (float, (size_t) (tb ? N : K) * ldb);
  float *C = g_new (float, (size_t) M * ldc);
  psm_test_fill (A, (size_t) (ta ? K : M) * lda, 1.0f, rng);
  psm_test_fill (B, (size_t) (tb ? N : K) * ldb, 1.0f, rng);
  for (size_t i = 0; i < (size_t) M * ldc; i++)
    C[i] = 7.0f;
  psm_gemm_bf16_op (ta, tb, M, N, K, A, lda, B, ldb, acc, C, ldc);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double s = acc ? 7.0 : 0.0, mag = fabs (s);
      for (int k = 0; k < K; k++) {
        double p = (double) psm_bf16_round (ta ? A[(size_t) k * lda + i] : A[(size_t) i * lda + k]) *
                   psm_bf16_round (tb ? B[(size_t) j * ldb + k] : B[(size_t) k * ldb + j]);
        s += p;
        mag += fabs (p);
      }
      float c = C[(size_t) i * ldc + j];
      ck_assert_msg (fabs (c - s) <= 1e-6 * (K + 1) * mag + 1e-30,
                     "bf16 op amx %d ta %d tb %d M=%d K=%d N=%d acc %d: C[%d][%d] = %g, want %g", psm_amx_usable (),
                     ta, tb, M, K, N, acc, i, j, c, s);
    }
    for (int j = N; j < ldc; j++)
      ck_assert_msg (C[(size_t) i * ldc + j] == 7.0f, "bf16 op M=%d N=%d: column %d past N written", M, N, j);
  }
  g_free (A);
  g_free (B);
  g_free (C);
}

START_TEST (test_gemm_bf16)
{
  float one = 1.0f, half = 1.0f + 0x1p-8f, three = 1.0f + 0x3p-8f, big = 3.4e38f;
  ck_assert (psm_bf16_round (one) == 1.0f && psm_bf16_round (-2.5f) == -2.5f);
  ck_assert (psm_bf16_round (half) == 1.0f);              /* a tie: the even neighbour, 1 */
  ck_assert (psm_bf16_round (three) == 1.0f + 0x1p-6f);   /* a tie: the even neighbour, up */
  ck_assert (psm_bf16_round (1.0f + 0x1.8p-8f) == 1.0f + 0x1p-7f);   /* above the tie: up */
  ck_assert (isinf (psm_bf16_round (big)) && isinf (psm_bf16_round (-INFINITY)));
  ck_assert (isnan (psm_bf16_round (NAN)) && psm_bf16_round (0x1p-130f) == 0x1p-130f);
  ck_assert (psm_bf16_round (0x1p-140f) == 0.0f);   /* below bfloat16's smallest subnormal, 2^-133 */
  gboolean amx = psm_amx_usable ();
  if (!amx)
    fprintf (stderr, "test_gemm_bf16: no AMX here; only the packed kernel's path is checked\n");
  PsmRng rng;
  psm_rng_seed (&rng, 21);
  int Ms[] = { 1, 10, 16, 17, 33, 60, 64, 100 }, Ks[] = { 1, 37, 64, 520 }, Ns[] = { 5, 70, 600 };
  for (int path = 0; path < 1 + amx; path++) {
    psm_paths.bf16_amx = path == 0;   /* AMX first when there is one, then the kernel */
    for (int mi = 0; mi < (int) G_N_ELEMENTS (Ms); mi++)
      for (int ki = 0; ki < (int) G_N_ELEMENTS (Ks); ki++)
        for (int ni = 0; ni < (int) G_N_ELEMENTS (Ns); ni++)
          check_gemm_bf16 (&rng, Ms[mi], Ks[ki], Ns[ni], (mi + ni) % 2, (mi + ni) % 2 == 0 && (mi + ki) % 2);
    /* train.precision's products: every transposition, K past one L2
     * group of rows and past a whole number of tiles, C set and added to */
    int Mo[] = { 1, 16, 33, 64, 650 }, Ko[] = { 0, 32, 45, 300 }, No[] = { 3, 64, 97 };
    for (int mi = 0; mi < (int) G_N_ELEMENTS (Mo); mi++)
      for (int ki = 0; ki < (int) G_N_ELEMENTS (Ko); ki++)
        for (int ni = 0; ni < (int) G_N_ELEMENTS (No); ni++)
          for (int t = 0; t < 4; t++)
            check_gemm_bf16_op (&rng, t & 1, t >> 1, Mo[mi], Ko[ki], No[ni], (mi + ki + ni + t) % 2);
  }
  psm_paths.bf16_amx = TRUE;

  /* through psm_linear: x [12, 40] W [40, 90] */
  enum { R = 12, K = 40, N = 90 };
  float *x = g_new (float, R * K), *w = g_new (float, K * N), *b = g_new (float, N), *gx = g_new0 (float, R * K);
  psm_test_fill (x, R * K, 1.0f, &rng);
  psm_test_fill (w, K * N, 1.0f, &rng);
  psm_test_fill (b, N, 1.0f, &rng);
  int sx[2] = { R, K }, sw[2] = { K, N }, sb[1] = { N };
  float *y[4];
  for (int v = 0; v < 4; v++) {   /* 0 fp32, 1 bf16, 2 bf16 set with gradients, 3 bf16 again */
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, v == 2);
    psm_graph_set_bf16 (g, v >= 1);
    psm_graph_const_range (g, w, K * N);
    PsmTensor *yt = psm_linear (g, psm_tensor_wrap (g, x, v == 2 ? gx : NULL, 2, sx), psm_tensor_wrap (g, w, NULL, 2, sw),
                                psm_tensor_wrap (g, b, NULL, 1, sb));
    y[v] = g_memdup2 (yt->data, R * N * sizeof (float));
    psm_graph_free (g);
  }
  double maxd = 0;
  for (int i = 0; i < R * N; i++) {
    int r = i / N, j = i % N;
    double s = b[j], mag = fabs (s);
    for (int k = 0; k < K; k++) {
      s += (double) psm_bf16_round (x[r * K + k]) * psm_bf16_round (w[k * N + j]);
      mag += fabs ((double) x[r * K + k] * w[k * N + j]);
    }
    ck_assert_msg (fabs (y[1][i] - s) <= 1e-6 * K * mag, "linear bf16 y[%d] = %g, want %g", i, y[1][i], s);
    ck_assert (y[2][i] == y[0][i] && y[3][i] == y[1][i]);
    maxd = MAX (maxd, fabs (y[1][i] - y[0][i]));
  }
  ck_assert_msg (maxd > 0, "the bf16 graph gave the single-precision products");
  for (int v = 0; v < 4; v++)
    g_free (y[v]);
  g_free (x);
  g_free (w);
  g_free (b);
  g_free (gx);
}
END_TEST

/* x [R, K], W [K, N] and b [N] of a linear product, uniform in (-1, 1) */
static void
linear_case (Case *c, int R, int K, int N, uint64_t seed, PsmRng *rng)
{
  psm_rng_seed (rng, seed);
  alloc_in (c, 0, 2, R, K, 0, rng, 1.0f);
  alloc_in (c, 1, 2, K, N, 0, rng, 1.0f);
  alloc_in (c, 2, 1, N, 0, 0, rng, 1.0f);
}

/* train.precision bf16 (psm_graph_set_bf16_train). psm_linear with
 * gradients: y = x W + b, dx = dy W^T and dW = x^T dy against double sums
 * of the rounded operands (db the single-precision column sums), on AMX
 * and on the packed kernel, shapes with partial tiles of rows, k and
 * columns; the same graph without gradients (an evaluation) in single
 * precision, to the bit. */
static void
check_linear_bf16_train (int R, int K, int N)
{
  PsmRng rng;
  Case c = { 0 };
  linear_case (&c, R, K, N, 31 + R, &rng);
  float *y[2];
  for (int v = 0; v < 2; v++) {   /* 0 fp32, 1 bf16 */
    for (int k = 0; k < 3; k++)
      memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_bf16_train (g, v == 1);
    psm_graph_const_range (g, c.x[1], n_of (&c, 1));
    PsmTensor *yt = psm_linear (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2));
    y[v] = g_memdup2 (yt->data, (size_t) R * N * sizeof (float));
    psm_backward (g, psm_test_project (g, yt));
    psm_graph_free (g);
  }
  float *r = g_new (float, (size_t) R * N);   /* dy: psm_test_project's weights */
  psm_rng_seed (&rng, 4242);
  psm_test_fill (r, (size_t) R * N, 1.0f, &rng);
  const float *x = c.x[0], *w = c.x[1], *b = c.x[2];
#define BF(v) ((double) psm_bf16_round (v))
  double maxd = 0;
  for (int i = 0; i < R; i++)
    for (int j = 0; j < N; j++) {
      double s = b[j], mag = fabs (s);
      for (int k = 0; k < K; k++) {
        s += BF (x[i * K + k]) * BF (w[k * N + j]);
        mag += fabs (BF (x[i * K + k]) * BF (w[k * N + j]));
      }
      ck_assert_msg (fabs (y[1][i * N + j] - s) <= 1e-6 * (K + 1) * mag, "linear bf16 train R=%d y[%d][%d] = %g, want %g",
                     R, i, j, y[1][i * N + j], s);
      maxd = MAX (maxd, fabs (y[1][i * N + j] - y[0][i * N + j]));
    }
  ck_assert_msg (maxd > 0, "train.precision bf16 gave the single-precision products");
  for (int i = 0; i < R; i++)
    for (int k = 0; k < K; k++) {
      double s = 0, mag = 0;
      for (int j = 0; j < N; j++) {
        s += BF (r[i * N + j]) * BF (w[k * N + j]);
        mag += fabs (BF (r[i * N + j]) * BF (w[k * N + j]));
      }
      ck_assert_msg (fabs (c.gx[0][i * K + k] - s) <= 1e-6 * N * mag + 1e-30, "linear bf16 train R=%d: gradient mismatch, dx[%d][%d] = %g, want %g",
                     R, i, k, c.gx[0][i * K + k], s);
    }
  for (int k = 0; k < K; k++)
    for (int j = 0; j < N; j++) {
      double s = 0, mag = 0;
      for (int i = 0; i < R; i++) {
        s += BF (x[i * K + k]) * BF (r[i * N + j]);
        mag += fabs (BF (x[i * K + k]) * BF (r[i * N + j]));
      }
      ck_assert_msg (fabs (c.gx[1][k * N + j] - s) <= 1e-6 * R * mag + 1e-30, "linear bf16 train R=%d: gradient mismatch, dW[%d][%d] = %g, want %g",
                     R, k, j, c.gx[1][k * N + j], s);
    }
  for (int j = 0; j < N; j++) {
    double s = 0, mag = 0;
    for (int i = 0; i < R; i++) {
      s += r[i * N + j];
      mag += fabs (r[i * N + j]);
    }
    ck_assert_msg (fabs (c.gx[2][j] - s) <= 1e-6 * mag, "linear bf16 train: gradient mismatch, db[%d] = %g, want %g", j, c.gx[2][j], s);
  }
#undef BF
  /* without gradients the flag changes nothing */
  float *ye[2];
  for (int v = 0; v < 2; v++) {
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    psm_graph_set_bf16_train (g, v == 1);
    psm_graph_const_range (g, c.x[1], n_of (&c, 1));
    PsmTensor *yt = psm_linear (g, psm_tensor_wrap (g, c.x[0], NULL, 2, c.shape[0]),
                                psm_tensor_wrap (g, c.x[1], NULL, 2, c.shape[1]),
                                psm_tensor_wrap (g, c.x[2], NULL, 1, c.shape[2]));
    ye[v] = g_memdup2 (yt->data, (size_t) R * N * sizeof (float));
    psm_graph_free (g);
  }
  ck_assert_msg (memcmp (ye[0], ye[1], (size_t) R * N * sizeof (float)) == 0,
                 "train.precision bf16 changed a product without gradients");
  g_free (ye[0]);
  g_free (ye[1]);
  g_free (r);
  g_free (y[0]);
  g_free (y[1]);
  free_case (&c);
}

/* psm_linear_pick_log_softmax on a bf16 training graph, where it is one
 * op whose backward makes the scores' gradient as it rounds it: y and the
 * gradients of x, W and b the same, to the bit, as psm_linear followed by
 * psm_pick_log_softmax on the same graph (both checked above and in
 * test_pointer_ops), with targets < 0 and rows of zero gradient; y against
 * double sums of the rounded operands. On a single-precision graph it is
 * that pair. */
static void
check_linear_pick_bf16_train (int R, int K, int N)
{
  PsmRng rng;
  Case c = { 0 };
  linear_case (&c, R, K, N, 57 + R, &rng);
  int32_t *t = g_new (int32_t, R);
  for (int r = 0; r < R; r++)
    t[r] = r % 7 == 5 ? -1 : (int32_t) ((r * 7919u + 13) % (unsigned) N);
  float *y[2][2], *grad[2][2][3];
  for (int prec = 0; prec < 2; prec++)   /* 0 fp32, 1 bf16 */
    for (int v = 0; v < 2; v++) {   /* 0 the pair of ops, 1 the one */
      for (int k = 0; k < 3; k++)
        memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
      PsmGraph *g = psm_graph_new ();
      psm_graph_set_bf16_train (g, prec == 1);
      psm_graph_const_range (g, c.x[1], n_of (&c, 1));
      PsmTensor *yt = v ? psm_linear_pick_log_softmax (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2), t)
                        : psm_pick_log_softmax (g, psm_linear (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2)), t);
      ck_assert (yt->n == (size_t) R);
      y[prec][v] = g_memdup2 (yt->data, (size_t) R * sizeof (float));
      /* psm_test_project's weights, a few rows' set to zero */
      PsmTensor *m = psm_tensor_new (g, 2, (int[]) { R, 1 }, FALSE);
      for (int r = 0; r < R; r++)
        m->data[r] = r % 5 == 2 ? 0.0f : 1.0f;
      psm_backward (g, psm_test_project (g, psm_mul (g, yt, m)));
      for (int k = 0; k < 3; k++)
        grad[prec][v][k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
      psm_graph_free (g);
    }
  const char *names[3] = { "x", "W", "b" };
  for (int prec = 0; prec < 2; prec++) {
    for (int r = 0; r < R; r++)
      ck_assert_msg (memcmp (&y[prec][0][r], &y[prec][1][r], sizeof (float)) == 0,
                     "linear_pick_log_softmax %s R=%d: y[%d] = %g, the pair's %g", prec ? "bf16" : "fp32", R, r,
                     y[prec][1][r], y[prec][0][r]);
    for (int k = 0; k < 3; k++)
      for (size_t i = 0; i < n_of (&c, k); i++)
        ck_assert_msg (grad[prec][0][k][i] == grad[prec][1][k][i],
                       "linear_pick_log_softmax %s R=%d: gradient mismatch, d%s[%zu] = %g, the pair's %g",
                       prec ? "bf16" : "fp32", R, names[k], i, grad[prec][1][k][i], grad[prec][0][k][i]);
  }
  /* the bf16 forward against double sums of the rounded operands */
  const float *x = c.x[0], *w = c.x[1], *b = c.x[2];
  double *z = g_new (double, N);
  gboolean differs = FALSE;
  for (int r = 0; r < R; r++) {
    double m = -INFINITY, s = 0, mag = 0;
    for (int j = 0; j < N; j++) {
      z[j] = b[j];
      for (int k = 0; k < K; k++) {
        z[j] += (double) psm_bf16_round (x[r * K + k]) * psm_bf16_round (w[k * N + j]);
        mag += fabs ((double) x[r * K + k] * w[k * N + j]);
      }
      m = MAX (m, z[j]);
    }
    for (int j = 0; j < N; j++)
      s += exp (z[j] - m);
    if (t[r] < 0) {
      ck_assert (isinf (y[1][1][r]) && y[1][1][r] < 0);
      continue;
    }
    double want = z[t[r]] - m - log (s);
    ck_assert_msg (fabs (y[1][1][r] - want) <= 1e-6 * (K + 1) * mag / N + 1e-5,
                   "linear_pick_log_softmax bf16 R=%d: y[%d] = %g, want %g", R, r, y[1][1][r], want);
    differs |= y[1][1][r] != y[0][1][r];
  }
  ck_assert_msg (differs, "linear_pick_log_softmax: train.precision bf16 gave the single-precision products");
  g_free (z);
  for (int prec = 0; prec < 2; prec++)
    for (int v = 0; v < 2; v++) {
      g_free (y[prec][v]);
      for (int k = 0; k < 3; k++)
        g_free (grad[prec][v][k]);
    }
  g_free (t);
  free_case (&c);
}

/* psm_lstm_seq with gradients on a bf16 training graph: the forward the
 * decoding's bf16 sequence's (h W on the same rounded operands; the gates
 * kept or not, the same arithmetic); the gradients of every input within
 * a few percent of the single-precision op's (the products dh W^T and
 * h^T dG rounded: a transposition or a step out of place would be off by
 * far more) and not equal to them; with masked rows, in both directions. */
static double
rel_diff (const float *a, const float *b, size_t n)
{
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double) a[i] - b[i]) * ((double) a[i] - b[i]);
    s += (double) b[i] * b[i];
  }
  return sqrt (d / MAX (s, 1e-300));
}

static void
check_lstm_seq_bf16_train (gboolean rev)
{
  PsmRng rng;
  psm_rng_seed (&rng, 41 + rev);
  enum { T = 7, B = 21, H = 40 };
  Case c = { 0 };
  alloc_lstm_seq (&c, T, B, H, 0.5f, &rng);
  for (int i = 0; i < T * B; i++)
    c.mask[i] = (i % 11 == 3) ? 0.0f : 1.0f;
  float *out[3], *grad[2][4];
  for (int v = 0; v < 3; v++) {   /* 0 fp32, 1 train.precision bf16, 2 decode.precision bf16 */
    for (int k = 0; k < 4; k++)
      memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, v < 2);
    psm_graph_set_bf16_train (g, v == 1);
    psm_graph_set_bf16 (g, v == 2);
    psm_graph_const_range (g, c.x[3], n_of (&c, 3));
    PsmTensor *xs[4];
    for (int k = 0; k < 4; k++)
      xs[k] = v < 2 ? in (g, &c, k) : psm_tensor_wrap (g, c.x[k], NULL, c.nd[k], c.shape[k]);
    PsmTensor *seq = psm_lstm_seq (g, xs[0], xs[1], xs[2], xs[3], c.mask, rev);
    out[v] = g_memdup2 (seq->data, seq->n * sizeof (float));
    if (v < 2) {
      psm_backward (g, psm_test_project (g, seq));
      for (int k = 0; k < 4; k++)
        grad[v][k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
    }
    psm_graph_free (g);
  }
  size_t n = (size_t) (T + 1) * B * H;
  for (size_t i = 0; i < n; i++)
    ck_assert_msg (fabsf (out[1][i] - out[2][i]) <= 1e-6f * (1.0f + fabsf (out[2][i])),
                   "lstm_seq bf16 train rev %d: out[%zu] = %g, decode's bf16 %g", rev, i, out[1][i], out[2][i]);
  ck_assert_msg (rel_diff (out[1], out[0], n) > 0, "lstm_seq bf16 train: the single-precision forward");
  const char *names[4] = { "xp", "h0", "c0", "W" };
  for (int k = 0; k < 4; k++) {
    double d = rel_diff (grad[1][k], grad[0][k], n_of (&c, k));
    ck_assert_msg (d < 0.03 && d > 0, "lstm_seq bf16 train rev %d: gradient mismatch, d%s %.4g from the single-precision gradient", rev,
                   names[k], d);
    g_free (grad[0][k]);
    g_free (grad[1][k]);
  }
  for (int v = 0; v < 3; v++)
    g_free (out[v]);
  free_case (&c);
}

/* psm_linear_pick_log_softmax on a single-precision training graph, one op
 * since it writes the scores' gradient over the scores: finite differences
 * for x, W and b (targets < 0 included: their rows give nothing), and a
 * second backward over the same graph, which must make the scores again
 * (the first wrote their gradient over them): there the loss's gradient is
 * 2 and y's accumulates to 3 times the first's, so x, W and b get 3 times
 * their first gradients more. Its results against the pair's, to the bit:
 * check_linear_pick_bf16_train. */
static PsmTensor *
f_linear_pick (PsmGraph *g, void *ud)
{
  Case *c = ud;
  static int32_t col0[128];
  static float wt[128];
  int R = c->shape[0][0];
  g_assert (R <= 128);
  for (int r = 0; r < R; r++) {
    c->ids[r] = r % 4 == 3 ? -1 : (r * 37 + 5) % c->shape[1][1];
    col0[r] = c->ids[r] < 0 ? -1 : 0;   /* a row without a target counts nowhere (the softmax head's way) */
    wt[r] = 0.5f + 0.25f * (r % 3);
  }
  PsmTensor *y = psm_linear_pick_log_softmax (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), c->ids);
  return psm_nll (g, y, col0, wt);
}

START_TEST (test_linear_pick_log_softmax)
{
  PsmRng rng;
  int R = 70, K = 9, N = 23;   /* more rows than the packed path takes */
  Case c = { 0 };
  linear_case (&c, R, K, N, 91, &rng);
  check_all ("linear_pick_log_softmax", f_linear_pick, &c, 3, 1e-2f);
  float *once[3];
  for (int k = 0; k < 3; k++)
    memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
  PsmGraph *g = psm_graph_new ();
  PsmTensor *loss = f_linear_pick (g, &c);
  psm_backward (g, loss);
  for (int k = 0; k < 3; k++)
    once[k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
  psm_backward (g, loss);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < n_of (&c, k); i++)
      ck_assert_msg (fabsf (c.gx[k][i] - 4.0f * once[k][i]) <= 1e-5f * fabsf (once[k][i]) + 1e-7f,
                     "linear_pick_log_softmax: a second backward gave d%d[%zu] = %g, want %g", k, i, c.gx[k][i],
                     4.0f * once[k][i]);
    g_free (once[k]);
  }
  psm_graph_free (g);
  free_case (&c);
}
END_TEST

START_TEST (test_train_bf16)
{
  gboolean amx = psm_amx_usable ();
  if (!amx)
    fprintf (stderr, "test_train_bf16: no AMX here; only the packed kernel's path is checked\n");
  for (int path = 0; path < 1 + amx; path++) {
    psm_paths.bf16_amx = path == 0;
    check_linear_bf16_train (70, 45, 97);
    check_linear_bf16_train (64, 96, 64);
    check_linear_bf16_train (1, 33, 20);
    check_linear_pick_bf16_train (70, 45, 97);
    check_linear_pick_bf16_train (64, 96, 64);
    check_linear_pick_bf16_train (3, 33, 20);
    check_lstm_seq_bf16_train (FALSE);
    check_lstm_seq_bf16_train (TRUE);
  }
  psm_paths.bf16_amx = TRUE;
}
END_TEST

/* decode.precision bf16 in the recurrences: the LSTM and GRU cells' h W
 * on a bfloat16 graph against the single-precision cell on h and W rounded
 * beforehand (the same products, summed in another order), with and
 * without a mask; the whole-sequence ops against those cells step by step
 * (h rounded again at every step either way); and not the single-precision
 * result, so that the bf16 path did run. On AMX where the CPU has it,
 * and on the packed kernel (psm_paths.bf16_amx unset). */
static float *
rec_bf16_round (const float *x, size_t n)
{
  float *r = g_new (float, n);
  for (size_t i = 0; i < n; i++)
    r[i] = psm_bf16_round (x[i]);
  return r;
}

static PsmTensor *
rec_wrap (PsmGraph *g, float *x, int d0, int d1, int d2)
{
  int sh[3] = { d0, d1, d2 };
  return psm_tensor_wrap (g, x, NULL, d2 ? 3 : 2, sh);
}

static void
check_rec_bf16 (gboolean gru, gboolean masked)
{
  enum { T = 4, B = 70, H = 24 };
  int G = gru ? 3 : 4;
  PsmRng rng;
  psm_rng_seed (&rng, gru * 2 + masked + 61);
  float *xp = g_new (float, (size_t) T * B * G * H), *h = g_new (float, B * H), *c = g_new (float, B * H);
  float *w = g_new (float, (size_t) H * G * H), *bh = g_new (float, G * H), *mask = g_new (float, T * B);
  psm_test_fill (xp, (size_t) T * B * G * H, 1.0f, &rng);
  psm_test_fill (h, B * H, 1.0f, &rng);
  psm_test_fill (c, B * H, 1.0f, &rng);
  psm_test_fill (w, (size_t) H * G * H, 0.5f, &rng);
  psm_test_fill (bh, G * H, 0.5f, &rng);
  for (int i = 0; i < T * B; i++)
    mask[i] = masked && (i * 7) % 5 == 0 ? 0.0f : 1.0f;
  const float *m0 = masked ? mask : NULL;
  float *hr = rec_bf16_round (h, B * H), *wr = rec_bf16_round (w, (size_t) H * G * H);
  /* one cell: bf16, then single precision on rounded and unrounded h, W */
  float *out[3];
  size_t n1 = (size_t) (gru ? 1 : 2) * B * H;
  for (int v = 0; v < 3; v++) {
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    psm_graph_set_bf16 (g, v == 0);
    /* the GRU reads h outside the product too (h' = (1 - z) n + z h): h
     * already in bfloat16 there, W rounded by the graph */
    float *hv = v == 1 || gru ? hr : h, *wv = v == 1 ? wr : w;
    psm_graph_const_range (g, wv, (size_t) H * G * H);
    PsmTensor *x0 = rec_wrap (g, xp, B, G * H, 0);
    PsmTensor *y = gru ? psm_gru_cell (g, x0, rec_wrap (g, hv, B, H, 0), rec_wrap (g, wv, H, G * H, 0),
                                       rec_wrap (g, bh, G * H, 1, 0), m0)
                       : psm_lstm_cell (g, x0, rec_wrap (g, hv, B, H, 0), rec_wrap (g, c, B, H, 0),
                                        rec_wrap (g, wv, H, G * H, 0), m0);
    out[v] = g_memdup2 (y->data, n1 * sizeof (float));
    psm_graph_free (g);
  }
  double maxd = 0;
  for (size_t i = 0; i < n1; i++) {
    if (masked && mask[i / H % B] == 0.0f) {   /* the state carried as it was */
      ck_assert (out[0][i] == out[2][i]);
      continue;
    }
    ck_assert_msg (fabsf (out[0][i] - out[1][i]) <= 2e-6f, "%s cell bf16 (mask %d, amx %d) [%zu] = %g, want %g",
                   gru ? "GRU" : "LSTM", masked, psm_paths.bf16_amx, i, out[0][i], out[1][i]);
    maxd = MAX (maxd, fabsf (out[0][i] - out[2][i]));
  }
  ck_assert_msg (maxd > 1e-4, "%s cell: the bf16 graph gave the single-precision result", gru ? "GRU" : "LSTM");
  /* the sequence against the cell step by step, both on bf16 graphs */
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  psm_graph_set_bf16 (g, TRUE);
  psm_graph_const_range (g, w, (size_t) H * G * H);
  PsmTensor *wt = rec_wrap (g, w, H, G * H, 0), *bt = rec_wrap (g, bh, G * H, 1, 0);
  PsmTensor *xs = rec_wrap (g, xp, T, B, G * H), *h0 = rec_wrap (g, h, B, H, 0), *c0 = rec_wrap (g, c, B, H, 0);
  PsmTensor *seq = gru ? psm_gru_seq (g, xs, h0, wt, bt, m0) : psm_lstm_seq (g, xs, h0, c0, wt, m0, FALSE);
  PsmTensor *hs = h0, *cs = c0;
  for (int t = 0; t < T; t++) {
    PsmTensor *xt = psm_tensor_step (g, xs, t);
    const float *mt = masked ? mask + (size_t) t * B : NULL;
    if (gru)
      hs = psm_gru_cell (g, xt, hs, wt, bt, mt);
    else {
      PsmTensor *hc = psm_lstm_cell (g, xt, hs, cs, wt, mt);
      hs = psm_tensor_step (g, hc, 0);
      cs = psm_tensor_step (g, hc, 1);
    }
    for (int i = 0; i < B * H; i++)
      ck_assert_msg (fabsf (seq->data[(size_t) t * B * H + i] - hs->data[i]) <= 1e-5f,
                     "%s sequence bf16 (mask %d, amx %d): step %d [%d] = %g, cell %g", gru ? "GRU" : "LSTM", masked,
                     psm_paths.bf16_amx, t, i, seq->data[(size_t) t * B * H + i], hs->data[i]);
  }
  psm_graph_free (g);
  for (int v = 0; v < 3; v++)
    g_free (out[v]);
  g_free (hr);
  g_free (wr);
  g_free (xp);
  g_free (h);
  g_free (c);
  g_free (w);
  g_free (bh);
  g_free (mask);
}

START_TEST (test_recurrence_bf16)
{
  gboolean amx = psm_amx_usable ();
  for (int path = 0; path < 1 + amx; path++) {
    psm_paths.bf16_amx = path == 0;
    for (int k = 0; k < 4; k++)
      check_rec_bf16 (k / 2, k % 2);
  }
  psm_paths.bf16_amx = TRUE;
}
END_TEST

/* The storing variant (psm_linear's packed path, the LSTM cell's h W):
 * A op(B) + bias and C += A op(B) bit for bit as the two passes they
 * replace (the padded product, then the bias or C added), exactly n
 * columns written, a partial last panel included. */
START_TEST (test_packed_gemm_store)
{
  PsmRng rng;
  psm_rng_seed (&rng, 10);
  int Ms[] = { 1, 7, 8, 13, 60 }, ns[] = { 5, 32, 70, 96 };
  int K = 37;
  for (int mode = 0; mode < 3; mode++)   /* 0: alone, 1: + bias, 2: accumulate */
    for (int mi = 0; mi < 5; mi++)
      for (int ni = 0; ni < 4; ni++) {
        int M = Ms[mi], n = ns[ni], npad = psm_pack_panels (n) * PSM_PACK_NR, ldc = n + 7;
        float *A = g_new (float, (size_t) M * K), *B = g_new (float, (size_t) K * n), *bias = g_new (float, n);
        float *C = g_new (float, (size_t) M * ldc), *before = g_new (float, (size_t) M * ldc);
        float *P = g_new (float, (size_t) M * npad), *bp = g_new (float, psm_packed_floats (K, n));
        psm_test_fill (A, (size_t) M * K, 1.0f, &rng);
        psm_test_fill (B, (size_t) K * n, 1.0f, &rng);
        psm_test_fill (bias, n, 1.0f, &rng);
        psm_test_fill (before, (size_t) M * ldc, 1.0f, &rng);
        memcpy (C, before, (size_t) M * ldc * sizeof (float));
        psm_pack (K, n, B, n, FALSE, bp);
        psm_packed_gemm (M, K, n, A, K, bp, P, npad);
        psm_packed_gemm_store (M, K, n, A, K, bp, C, ldc, mode == 1 ? bias : NULL, mode == 2);
        for (int i = 0; i < M; i++) {
          for (int j = 0; j < n; j++) {
            float p = P[(size_t) i * npad + j];
            float want = mode == 0 ? p : mode == 1 ? bias[j] + p : before[(size_t) i * ldc + j] + p;
            ck_assert_msg (memcmp (&C[(size_t) i * ldc + j], &want, sizeof want) == 0,
                           "mode %d M=%d n=%d C[%d][%d] = %a, want %a", mode, M, n, i, j, C[(size_t) i * ldc + j], want);
          }
          for (int j = n; j < ldc; j++)
            ck_assert_msg (C[(size_t) i * ldc + j] == before[(size_t) i * ldc + j], "column %d past n written", j);
        }
        g_free (A);
        g_free (B);
        g_free (bias);
        g_free (C);
        g_free (before);
        g_free (P);
        g_free (bp);
      }
}
END_TEST

/* psm_gemm's column split for few rows must cover every column with the
 * team the runtime gave, not the one asked for. libgomp reads
 * OMP_THREAD_LIMIT at start-up, so the check runs in a child process started
 * with OMP_THREAD_LIMIT=2 (see main), which asks for 4 threads. */
static int
gemm_thread_limit_child (void)
{
  if (omp_get_thread_limit () > 2)
    return 3;
  omp_set_num_threads (4);
  PsmRng rng;
  psm_rng_seed (&rng, 12);
  int M = 16, N = 640, K = 24, bad = 0;
  float *A = g_new (float, M * K), *B = g_new (float, K * N), *C = g_new (float, M * N);
  psm_test_fill (A, M * K, 1.0f, &rng);
  psm_test_fill (B, K * N, 1.0f, &rng);
  for (int i = 0; i < M * N; i++)
    C[i] = NAN;
  psm_gemm (FALSE, FALSE, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double want = 0;
      for (int k = 0; k < K; k++)
        want += (double) A[i * K + k] * B[k * N + j];
      if (!(fabs (C[i * N + j] - want) <= 1e-4) && bad++ == 0)
        printf ("C[%d][%d] = %g, want %g\n", i, j, C[i * N + j], want);
    }
  g_free (A);
  g_free (B);
  g_free (C);
  return bad ? 1 : 0;
}

START_TEST (test_gemm_thread_limit)
{
  /* this program's path, not "/proc/self/exe" itself: under valgrind
   * exec'ing that runs valgrind's launcher, while readlink says the test */
  char *self = g_file_read_link ("/proc/self/exe", NULL);
  char *argv[] = { self ? self : (char *) "/proc/self/exe", (char *) "gemm-thread-limit", NULL };
  char **env = g_environ_setenv (g_get_environ (), "OMP_THREAD_LIMIT", "2", TRUE);
  char *out = NULL;
  int status = -1;
  GError *e = NULL;
  ck_assert_msg (g_spawn_sync (NULL, argv, env, G_SPAWN_DEFAULT, NULL, NULL, &out, NULL, &status, &e),
                 "%s", e ? e->message : "");
  ck_assert_msg (g_spawn_check_wait_status (status, NULL), "psm_gemm under OMP_THREAD_LIMIT=2 with 4 threads asked: %s", out);
  g_free (out);
  g_strfreev (env);
  g_free (self);
}
END_TEST

static PsmTensor *
f_lstm (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmTensor *hc = psm_lstm_cell (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask);
  return psm_test_project (g, hc);
}

START_TEST (test_lstm)
{
  PsmRng rng;
  psm_rng_seed (&rng, 7);
  int B = 3, H = 4;
  Case c = { 0 };
  alloc_in (&c, 0, 2, B, 4 * H, 0, &rng, 1.0f);
  alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 2, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 3, 2, H, 4 * H, 0, &rng, 0.8f);
  c.mask[0] = 1;
  c.mask[1] = 0;
  c.mask[2] = 1;
  PsmGraph *g = psm_graph_new ();
  PsmTensor *xp = in (g, &c, 0), *h = in (g, &c, 1), *cc = in (g, &c, 2), *w = in (g, &c, 3);
  PsmTensor *hc = psm_lstm_cell (g, xp, h, cc, w, c.mask);
  PsmTensor *G = psm_add (g, xp, psm_matmul (g, h, w, FALSE, FALSE));
  PsmTensor *i_ = psm_sigmoid (g, psm_slice (g, G, 0, H)), *f = psm_sigmoid (g, psm_slice (g, G, H, H));
  PsmTensor *gg = psm_tanh (g, psm_slice (g, G, 2 * H, H)), *o = psm_sigmoid (g, psm_slice (g, G, 3 * H, H));
  PsmTensor *cn = psm_add (g, psm_mul (g, f, cc), psm_mul (g, i_, gg));
  PsmTensor *hn = psm_mul (g, o, psm_tanh (g, cn));
  for (int b = 0; b < B; b++)
    for (int j = 0; j < H; j++) {
      gboolean keep = c.mask[b] != 0.0f;
      ck_assert (fabsf ((keep ? hn : h)->data[b * H + j] - hc->data[b * H + j]) < 1e-5);
      ck_assert (fabsf ((keep ? cn : cc)->data[b * H + j] - hc->data[B * H + b * H + j]) < 1e-5);
    }
  psm_graph_free (g);
  check_all ("lstm_cell", f_lstm, &c, 4, 5e-3f);
  free_case (&c);
}
END_TEST

/* Without a gradient (decoding) the cell and the sequence keep no gates
 * and run one fused loop per row, the cell's rows over the threads: the
 * same h' and c' to the bit as with one, masked rows included. */
static PsmTensor *
cell_op (PsmGraph *g, Case *c, int masked)
{
  return psm_lstm_cell (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), masked ? c->mask : NULL);
}

static PsmTensor *
seq_op (PsmGraph *g, Case *c, int rev)
{
  return psm_lstm_seq (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask, rev);
}

static void
same_without_grad (const char *what, PsmTensor *(*op) (PsmGraph *, Case *, int), Case *c, int arg)
{
  PsmGraph *gg = psm_graph_new (), *gn = psm_graph_new ();
  psm_graph_set_grad (gn, FALSE);
  PsmTensor *a = op (gg, c, arg), *b = op (gn, c, arg);
  ck_assert (a->grad && !b->grad);
  ck_assert_msg (!memcmp (a->data, b->data, a->n * sizeof (float)), "%s without a gradient differs (%d)", what, arg);
  psm_graph_free (gg);
  psm_graph_free (gn);
}

START_TEST (test_lstm_no_grad)
{
  PsmRng rng;
  psm_rng_seed (&rng, 8);
  int B = 72, H = 512;   /* B H >= 32768: the cell's threaded loop */
  Case c = { 0 };
  alloc_in (&c, 0, 2, B, 4 * H, 0, &rng, 2.0f);
  alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 2, 2, B, H, 0, &rng, 1.0f);
  alloc_in (&c, 3, 2, H, 4 * H, 0, &rng, 0.1f);
  for (int b = 0; b < B; b++)
    c.mask[b] = b % 5 == 3 ? 0.0f : 1.0f;
  for (int masked = 0; masked < 2; masked++)
    same_without_grad ("lstm_cell (masked?)", cell_op, &c, masked);
  free_case (&c);
  /* the sequence's rows over the threads, both directions */
  int T = 3, Bs = 20;
  Case q = { 0 };
  alloc_in (&q, 0, 3, T, Bs, 4 * H, &rng, 2.0f);
  alloc_in (&q, 1, 2, Bs, H, 0, &rng, 1.0f);
  alloc_in (&q, 2, 2, Bs, H, 0, &rng, 1.0f);
  alloc_in (&q, 3, 2, H, 4 * H, 0, &rng, 0.1f);
  for (int i = 0; i < T * Bs; i++)
    q.mask[i] = i % 7 == 2 ? 0.0f : 1.0f;
  for (int rev = 0; rev < 2; rev++)
    same_without_grad ("lstm_seq (reverse?)", seq_op, &q, rev);
  free_case (&q);
}
END_TEST

static PsmTensor *
f_lstm_seq (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_lstm_seq (g, in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask,
                                            c->which));
}

/* psm_lstm_seq in both directions against psm_lstm_cell step by step, with
 * padding inside and at the ends of rows; B = 13, H = 20 also splits the
 * rows unevenly over the threads and pads the packed panels. Then the
 * finite-difference check of every input on the small case. */
START_TEST (test_lstm_seq)
{
  PsmRng rng;
  psm_rng_seed (&rng, 17);
  int sizes[2][2] = { { 3, 4 }, { 13, 20 } }, T = 4;
  for (int si = 0; si < 2; si++)
    for (int rev = 0; rev < 2; rev++) {
      int B = sizes[si][0], H = sizes[si][1];
      Case c = { 0 };
      c.which = rev;
      alloc_lstm_seq (&c, T, B, H, 0.8f, &rng);
      for (int i = 0; i < T * B; i++)
        c.mask[i] = (i == 1 || i == B + 2 || i == T * B - 1 || i == 2 * B) ? 0.0f : 1.0f;
      PsmGraph *g = psm_graph_new ();
      PsmTensor *xp = in (g, &c, 0), *h = in (g, &c, 1), *cc = in (g, &c, 2), *w = in (g, &c, 3);
      PsmTensor *seq = psm_lstm_seq (g, xp, h, cc, w, c.mask, rev);
      ck_assert_int_eq (seq->shape[0], T + 1);
      for (int k = 0; k < T; k++) {
        int t = rev ? T - 1 - k : k;
        PsmTensor *hc = psm_lstm_cell (g, psm_tensor_step (g, xp, t), h, cc, w, c.mask + t * B);
        h = psm_tensor_step (g, hc, 0);
        cc = psm_tensor_step (g, hc, 1);
        for (int i = 0; i < B * H; i++)
          ck_assert_msg (fabsf (seq->data[(size_t) t * B * H + i] - h->data[i]) < 1e-5,
                         "lstm_seq B=%d rev=%d h[t=%d][%d]: %g vs %g", B, rev, t, i, seq->data[(size_t) t * B * H + i],
                         h->data[i]);
      }
      for (int i = 0; i < B * H; i++)
        ck_assert_msg (fabsf (seq->data[(size_t) T * B * H + i] - cc->data[i]) < 1e-5, "lstm_seq final c[%d]", i);
      psm_graph_free (g);
      if (si == 0)
        check_all (rev ? "lstm_seq reverse" : "lstm_seq", f_lstm_seq, &c, 4, 5e-3f);
      free_case (&c);
    }
}
END_TEST

#define COLS_X0 3      /* psm_lstm_seq_cols: the gates start at column 3 of 4H + 5 */

static PsmTensor *
f_lstm_seq_cols (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_lstm_seq_cols (g, in (g, c, 0), COLS_X0, in (g, c, 1), in (g, c, 2), in (g, c, 3),
                                                 c->mask, c->which));
}

/* psm_lstm_seq_cols on a wider projection against psm_lstm_seq on the copy
 * of its columns, bit for bit, with and without gradients (without, the op
 * keeps two steps of cell state instead of all); the finite-difference
 * check of every input, the columns it does not read included. */
START_TEST (test_lstm_seq_cols)
{
  PsmRng rng;
  psm_rng_seed (&rng, 23);
  enum { T = 5, B = 3, H = 4, K = 4 * H + 5 };
  for (int rev = 0; rev < 2; rev++) {
    Case c = { 0 };
    c.which = rev;
    alloc_in (&c, 0, 3, T, B, K, &rng, 1.0f);
    alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
    alloc_in (&c, 2, 2, B, H, 0, &rng, 1.0f);
    alloc_in (&c, 3, 2, H, 4 * H, 0, &rng, 0.8f);
    for (int i = 0; i < T * B; i++)
      c.mask[i] = (i == 1 || i == B + 2 || i == T * B - 1) ? 0.0f : 1.0f;
    for (int grad = 0; grad < 2; grad++) {
      PsmGraph *g = psm_graph_new ();
      psm_graph_set_grad (g, grad);
      PsmTensor *xp = in (g, &c, 0), *h = in (g, &c, 1), *cc = in (g, &c, 2), *w = in (g, &c, 3);
      PsmTensor *a = psm_lstm_seq_cols (g, xp, COLS_X0, h, cc, w, c.mask, rev);
      PsmTensor *b = psm_lstm_seq (g, psm_slice (g, xp, COLS_X0, 4 * H), h, cc, w, c.mask, rev);
      ck_assert_int_eq (a->n, b->n);
      for (size_t i = 0; i < a->n; i++)
        ck_assert_msg (a->data[i] == b->data[i], "lstm_seq_cols rev=%d grad=%d [%zu]: %g vs %g", rev, grad, i,
                       a->data[i], b->data[i]);
      psm_graph_free (g);
    }
    check_all (rev ? "lstm_seq_cols reverse" : "lstm_seq_cols", f_lstm_seq_cols, &c, 4, 5e-3f);
    free_case (&c);
  }
}
END_TEST

#define GRU_X0 3       /* psm_gru_seq_cols: the gates start at column 3 of 3H + 5 */

static PsmTensor *
f_gru_seq_cols (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_gru_seq_cols (g, in (g, c, 0), GRU_X0, in (g, c, 1), in (g, c, 2), in (g, c, 3),
                                                c->mask, c->which));
}

/* Sum over t of <h_t, R_t>, h from psm_gru_seq_cols (seq) or psm_gru_cell
 * step by step on the copied columns, in the op's direction; backward. */
static float
gru_cols_loss (PsmGraph *g, Case *c, const float *R, gboolean rev, gboolean seq)
{
  PsmTensor *xp = in (g, c, 0), *h = in (g, c, 1), *w = in (g, c, 2), *b = in (g, c, 3), *loss = NULL;
  int T = xp->shape[0], B = xp->shape[1], H = psm_tensor_cols (h), sr[2] = { B, H };
  PsmTensor *hs = seq ? psm_gru_seq_cols (g, xp, GRU_X0, h, w, b, c->mask, rev) : NULL;
  for (int k = 0; k < T; k++) {
    int t = rev ? T - 1 - k : k;
    h = seq ? psm_tensor_step (g, hs, t)
            : psm_gru_cell (g, psm_slice (g, psm_tensor_step (g, xp, t), GRU_X0, 3 * H), h, w, b, c->mask + t * B);
    PsmTensor *l = psm_sum (g, psm_mul (g, h, psm_tensor_wrap (g, (float *) R + (size_t) t * B * H, NULL, 2, sr)));
    loss = loss ? psm_add (g, loss, l) : l;
  }
  psm_backward (g, loss);
  return loss->data[0];
}

/* psm_gru_seq_cols in both directions, on packed weights and through
 * psm_gemm, against psm_gru_cell step by step: loss and the gradients of all
 * inputs (the columns it does not read get none). B = 13, H = 20 splits the
 * rows unevenly over the threads and pads the packed panels; padding inside
 * rows and at their ends (the steps' GEMMs leave those rows out). With
 * col0 = 0 and K = 3H forward it is psm_gru_seq, bit for bit. Then the
 * finite-difference check of every input, both directions. */
START_TEST (test_gru_seq_cols)
{
  PsmRng rng;
  psm_rng_seed (&rng, 29);
  gboolean saved = psm_paths.gru_packed;
  enum { T = 5, B = 13, H = 20, K = 3 * H + 5 };
  for (int packed = 0; packed < 2; packed++)
    for (int rev = 0; rev < 2; rev++) {
      psm_paths.gru_packed = packed;
      Case c = { 0 };
      alloc_in (&c, 0, 3, T, B, K, &rng, 1.0f);
      alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
      alloc_in (&c, 2, 2, H, 3 * H, 0, &rng, 0.3f);
      alloc_in (&c, 3, 1, 3 * H, 0, 0, &rng, 0.5f);
      for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
          c.mask[t * B + b] = (b % 4 == 1 && t >= T - 2) || t * B + b == B + 2 || t * B + b == 2 * B ? 0.0f : 1.0f;
      float *R = g_new (float, (size_t) T * B * H), *want[4];
      psm_test_fill (R, (size_t) T * B * H, 1.0f, &rng);
      PsmGraph *g = psm_graph_new ();
      float l_cell = gru_cols_loss (g, &c, R, rev, FALSE);
      for (int k = 0; k < 4; k++) {
        want[k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
        memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
      }
      psm_graph_reset (g);
      float l_seq = gru_cols_loss (g, &c, R, rev, TRUE);
      ck_assert_msg (fabsf (l_seq - l_cell) <= 1e-5f * fabsf (l_cell) + 1e-4f, "gru_seq_cols packed=%d rev=%d: %g vs %g",
                     packed, rev, l_seq, l_cell);
      for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n_of (&c, k); i++) {
          ck_assert_msg (fabsf (c.gx[k][i] - want[k][i]) <= 1e-4f + 1e-4f * fabsf (want[k][i]),
                         "gru_seq_cols packed=%d rev=%d input %d grad[%zu]: %g vs %g", packed, rev, k, i,
                         c.gx[k][i], want[k][i]);
          if (k == 0 && ((int) (i % K) < GRU_X0 || (int) (i % K) >= GRU_X0 + 3 * H))
            ck_assert (c.gx[k][i] == 0.0f);
        }
      for (int k = 0; k < 4; k++)
        g_free (want[k]);
      psm_graph_reset (g);
      if (!rev) {   /* col0 = 0 on a [T, B, 3H] input is psm_gru_seq */
        int sx[3] = { T, B, 3 * H };
        PsmTensor *x3 = psm_tensor_new (g, 3, sx, FALSE);
        for (int i = 0; i < T * B; i++)
          memcpy (x3->data + (size_t) i * 3 * H, c.x[0] + (size_t) i * K + GRU_X0, 3 * H * sizeof (float));
        PsmTensor *a = psm_gru_seq (g, x3, in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), c.mask);
        PsmTensor *b = psm_gru_seq_cols (g, x3, 0, in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), c.mask, FALSE);
        ck_assert (memcmp (a->data, b->data, a->n * sizeof (float)) == 0);
      }
      psm_graph_free (g);
      g_free (R);
      free_case (&c);
    }
  psm_paths.gru_packed = saved;
  for (int rev = 0; rev < 2; rev++) {
    Case c = { 0 };
    c.which = rev;
    alloc_in (&c, 0, 3, 4, 3, 3 * 4 + 5, &rng, 1.0f);
    alloc_in (&c, 1, 2, 3, 4, 0, &rng, 1.0f);
    alloc_in (&c, 2, 2, 4, 3 * 4, 0, &rng, 0.8f);
    alloc_in (&c, 3, 1, 3 * 4, 0, 0, &rng, 0.5f);
    for (int i = 0; i < 4 * 3; i++)
      c.mask[i] = (i == 1 || i == 5 || i == 11) ? 0.0f : 1.0f;
    check_all (rev ? "gru_seq_cols reverse" : "gru_seq_cols", f_gru_seq_cols, &c, 4, 5e-3f);
    free_case (&c);
  }
}
END_TEST

/* psm_lstm_seq and psm_gru_seq with W a parameter of the graph: W and W^T
 * packed in the graph's cache (the weight plan's PACKED path) instead of a copy
 * of the op's own. Output and the gradients of every input, bit for bit
 * against W outside the cache; after a reset and a change of W (an update)
 * W is packed again; with keep set (an evaluation) the copy serves after
 * the reset until psm_graph_stale_packed; finite differences through the
 * cache. */
static PsmTensor *
seq_cached_op (PsmGraph *g, Case *c, gboolean cached)
{
  int kw = c->iarg[0] ? 3 : 2;   /* iarg[0]: LSTM */
  if (cached)
    psm_graph_const_range (g, c->x[kw], n_of (c, kw));
  PsmTensor *x[4] = { in (g, c, 0), in (g, c, 1), in (g, c, 2), in (g, c, 3) };
  return c->iarg[0] ? psm_lstm_seq (g, x[0], x[1], x[2], x[3], c->mask, c->which)
                    : psm_gru_seq_cols (g, x[0], 0, x[1], x[2], x[3], c->mask, c->which);
}

static PsmTensor *
f_seq_cached (PsmGraph *g, void *ud)
{
  return psm_test_project (g, seq_cached_op (g, ud, TRUE));
}

/* seq_collect: out gets y's data and, on a graph with gradients, after the
 * backward through psm_test_project, the gradients of the 4 inputs one
 * after the other; seq_cached_run runs the op on g (W cached when cached)
 * into it. */
static void
seq_collect (PsmGraph *g, Case *c, PsmTensor *y, float *out)
{
  memcpy (out, y->data, y->n * sizeof (float));
  out += y->n;
  if (psm_graph_grad_enabled (g)) {
    psm_backward (g, psm_test_project (g, y));
    for (int k = 0; k < 4; k++) {
      memcpy (out, c->gx[k], n_of (c, k) * sizeof (float));
      out += n_of (c, k);
    }
  }
}

static void
seq_cached_run (PsmGraph *g, Case *c, gboolean cached, float *out)
{
  for (int k = 0; k < 4; k++)
    memset (c->gx[k], 0, n_of (c, k) * sizeof (float));
  seq_collect (g, c, seq_cached_op (g, c, cached), out);
}

START_TEST (test_seq_packed_cache)
{
  PsmRng rng;
  psm_rng_seed (&rng, 29);
  for (int lstm = 0; lstm < 2; lstm++)
    for (int rev = 0; rev < 2; rev++) {
      int T = 4, B = 5, H = 18, G = lstm ? 4 : 3;
      Case c = { 0 };
      c.iarg[0] = lstm;
      c.which = rev;
      alloc_in (&c, 0, 3, T, B, G * H, &rng, 1.0f);
      alloc_in (&c, 1, 2, B, H, 0, &rng, 1.0f);
      if (lstm) {
        alloc_in (&c, 2, 2, B, H, 0, &rng, 1.0f);
        alloc_in (&c, 3, 2, H, 4 * H, 0, &rng, 0.5f);
      } else {
        alloc_in (&c, 2, 2, H, 3 * H, 0, &rng, 0.5f);
        alloc_in (&c, 3, 1, 3 * H, 0, 0, &rng, 0.5f);
      }
      int kw = lstm ? 3 : 2;
      for (int i = 0; i < T * B; i++)
        c.mask[i] = i % 7 == 3 ? 0.0f : 1.0f;
      size_t n = (size_t) (T + lstm) * B * H;
      for (int k = 0; k < 4; k++)
        n += n_of (&c, k);
      float *a = g_new (float, n), *b = g_new (float, n);
      const char *name = lstm ? "lstm_seq" : "gru_seq";
      for (int round = 0; round < 3; round++) {
        PsmGraph *g = psm_graph_new (), *g2 = psm_graph_new ();
        if (round == 2)
          psm_graph_keep_packed (g, TRUE);
        seq_cached_run (g, &c, TRUE, a);
        if (round == 1) {   /* a reset, then an update: packed again */
          psm_graph_reset (g);
          for (size_t i = 0; i < n_of (&c, kw); i++)
            c.x[kw][i] = -0.5f * c.x[kw][i] + 0.25f;
          seq_cached_run (g, &c, TRUE, a);
        } else if (round == 2) {   /* kept over a reset (no gradient, as an evaluation), then stale */
          psm_graph_set_grad (g, FALSE);
          psm_graph_reset (g);
          seq_cached_run (g, &c, TRUE, a);
          seq_cached_run (g2, &c, FALSE, b);
          ck_assert_msg (memcmp (a, b, (size_t) (T + lstm) * B * H * sizeof (float)) == 0,
                         "%s rev=%d: the kept packed W", name, rev);
          for (size_t i = 0; i < n_of (&c, kw); i++)
            c.x[kw][i] = 0.8f * c.x[kw][i] - 0.1f;
          psm_graph_stale_packed (g);
          psm_graph_reset (g);
          psm_graph_set_grad (g, TRUE);
          psm_graph_keep_packed (g, FALSE);
          seq_cached_run (g, &c, TRUE, a);
          psm_graph_reset (g2);
        }
        seq_cached_run (g2, &c, FALSE, b);
        for (size_t i = 0; i < n; i++)
          ck_assert_msg (a[i] == b[i], "%s rev=%d round %d: [%zu] %g with W in the graph's cache, %g without", name,
                         rev, round, i, a[i], b[i]);
        psm_graph_free (g);
        psm_graph_free (g2);
      }
      g_free (a);
      g_free (b);
      check_all (lstm ? "lstm_seq (W in the graph's cache)" : "gru_seq (W in the graph's cache)", f_seq_cached,
                 &c, 4, 5e-3f);
      free_case (&c);
    }
}
END_TEST

/* Zoneout weights as training draws them: 0 or 1 each, h's and c's in turn. */
static void
zoneout_draws (PsmRng *rng, float *zh, float *zc, int n)
{
  for (int i = 0; i < n; i++) {
    zh[i] = psm_rng_u32 (rng) & 1 ? 1.0f : 0.0f;
    zc[i] = psm_rng_u32 (rng) & 1 ? 1.0f : 0.0f;
  }
}

/* psm_lstm_seq on two threads with each step's product split by W's
 * columns (psm_paths.lstm_cols: fewer than 4 rows a thread) against the
 * rows' split: the output and every input's gradient bit for bit, in both
 * directions, with padded rows, with zoneout, W packed by the op and in
 * the graph's cache, and without a gradient (the two-step cell ring);
 * then the finite-difference check on the columns' path (a smaller
 * case). H = 40: 4H = 160 columns split unevenly, H's panels too on the
 * narrow builds. */
static const float *split_zh, *split_zc;

static PsmTensor *
split_op (PsmGraph *g, Case *c, gboolean cached)
{
  if (cached)
    psm_graph_const_range (g, c->x[3], n_of (c, 3));
  return psm_lstm_seq_zoneout (g, in (g, c, 0), 0, in (g, c, 1), in (g, c, 2), in (g, c, 3), c->mask, c->which,
                               c->iarg[1] ? split_zh : NULL, c->iarg[1] ? split_zc : NULL);
}

static PsmTensor *
f_lstm_split (PsmGraph *g, void *ud)
{
  return psm_test_project (g, split_op (g, ud, FALSE));
}

START_TEST (test_lstm_seq_col_split)
{
  PsmRng rng;
  psm_rng_seed (&rng, 41);
  enum { T = 5, B = 3, H = 40 };
  int threads = omp_get_max_threads ();
  gboolean saved = psm_paths.lstm_cols;
  omp_set_num_threads (2);
  static float zh[T * B * H], zc[T * B * H];
  zoneout_draws (&rng, zh, zc, T * B * H);
  split_zh = zh;
  split_zc = zc;
  for (int rev = 0; rev < 2; rev++)
    for (int zone = 0; zone < 2; zone++) {
      Case c = { 0 };
      c.which = rev;
      c.iarg[1] = zone;
      alloc_lstm_seq (&c, T, B, H, 0.3f, &rng);
      for (int i = 0; i < T * B; i++)
        c.mask[i] = i % 4 == 2 ? 0.0f : 1.0f;
      size_t n = (size_t) (T + 1) * B * H;
      for (int k = 0; k < 4; k++)
        n += n_of (&c, k);
      float *r[2] = { g_new (float, n), g_new (float, n) };
      for (int cached = 0; cached < 2; cached++)
        for (int grad = 0; grad < 2; grad++) {
          for (int cols = 0; cols < 2; cols++) {
            psm_paths.lstm_cols = cols;
            for (int k = 0; k < 4; k++)
              memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
            PsmGraph *g = psm_graph_new ();
            psm_graph_set_grad (g, grad);
            seq_collect (g, &c, split_op (g, &c, cached), r[cols]);
            psm_graph_free (g);
          }
          size_t m = grad ? n : (size_t) (T + 1) * B * H;
          for (size_t i = 0; i < m; i++)
            ck_assert_msg (r[0][i] == r[1][i], "lstm_seq rev=%d zoneout=%d cached=%d grad=%d: [%zu] %g by rows, %g by "
                           "columns", rev, zone, cached, grad, i, r[0][i], r[1][i]);
        }
      g_free (r[0]);
      g_free (r[1]);
      free_case (&c);
      /* finite differences on the columns' path, on a smaller case (H = 12:
       * 48 gate columns, two panels on the narrow builds) */
      Case d = { 0 };
      d.which = rev;
      d.iarg[1] = zone;
      alloc_lstm_seq (&d, T, B, 12, 0.5f, &rng);
      for (int i = 0; i < T * B; i++)
        d.mask[i] = i % 4 == 2 ? 0.0f : 1.0f;
      psm_paths.lstm_cols = TRUE;
      check_all (zone ? "lstm_seq split by columns, zoneout" : "lstm_seq split by columns", f_lstm_split, &d, 4,
                 5e-3f);
      free_case (&d);
    }
  psm_paths.lstm_cols = saved;
  omp_set_num_threads (threads);
}
END_TEST

/* Zoneout: fixed 0/1 weights (as training draws them) and the constant
 * expectation (evaluation), finite-difference checked; weights of 0 give
 * the plain LSTM bit for bit, weights of 1 keep the start state. */
static const float *zone_h, *zone_c;

static PsmTensor *
f_lstm_zoneout (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_lstm_seq_zoneout (g, in (g, c, 0), 0, in (g, c, 1), in (g, c, 2), in (g, c, 3),
                                                    c->mask, FALSE, zone_h, zone_c));
}

START_TEST (test_lstm_zoneout)
{
  PsmRng rng;
  psm_rng_seed (&rng, 29);
  enum { T = 5, B = 3, H = 4 };
  Case c = { 0 };
  alloc_lstm_seq (&c, T, B, H, 0.8f, &rng);
  for (int i = 0; i < T * B; i++)
    c.mask[i] = i == B + 1 ? 0.0f : 1.0f;
  static float zh[T * B * H], zc[T * B * H];
  zoneout_draws (&rng, zh, zc, T * B * H);
  zone_h = zh;
  zone_c = zc;
  check_all ("lstm_seq_zoneout draws", f_lstm_zoneout, &c, 4, 5e-3f);
  for (int i = 0; i < T * B * H; i++)
    zh[i] = zc[i] = 0.3f;
  check_all ("lstm_seq_zoneout expectation", f_lstm_zoneout, &c, 4, 5e-3f);
  /* zero weights: the plain op; ones: the start state throughout; the
   * same with and without gradients (two-step cell-state ring) */
  for (int grad = 0; grad < 2; grad++) {
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, grad);
    for (int i = 0; i < T * B * H; i++)
      zh[i] = zc[i] = 0.0f;
    PsmTensor *a = psm_lstm_seq_zoneout (g, in (g, &c, 0), 0, in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), c.mask,
                                         FALSE, zh, zc);
    PsmTensor *b = psm_lstm_seq (g, in (g, &c, 0), in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), c.mask, FALSE);
    for (size_t i = 0; i < a->n; i++)
      ck_assert (a->data[i] == b->data[i]);
    static float one[T * B * H];
    for (int i = 0; i < T * B * H; i++)
      one[i] = 1.0f;
    PsmTensor *k = psm_lstm_seq_zoneout (g, in (g, &c, 0), 0, in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), NULL,
                                         FALSE, one, one);
    for (int t = 0; t < T; t++)
      for (int i = 0; i < B * H; i++)
        ck_assert (k->data[t * B * H + i] == c.x[1][i]);
    for (int i = 0; i < B * H; i++)
      ck_assert (k->data[T * B * H + i] == c.x[2][i]);
    psm_graph_free (g);
  }
  free_case (&c);
}
END_TEST

/* psm_zoneout_weights and psm_locked_dropout: deterministic without the
 * training rng; with it, draws at the right rate, one dropout mask for all
 * steps, the kept units scaled by 1 / (1 - p); the gradient checked. */
static PsmRng drop_rng;

static PsmTensor *
f_dropout (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmRng r = drop_rng;   /* the same mask for every evaluation */
  psm_graph_set_rng (g, &r);
  PsmTensor *y = psm_locked_dropout (g, in (g, c, 0), 0.4f);
  psm_graph_set_rng (g, NULL);
  return psm_test_project (g, y);
}

START_TEST (test_dropout)
{
  enum { T = 4, B = 50, C = 40 };
  PsmGraph *g = psm_graph_new ();
  Case c = { 0 };
  PsmRng rng;
  psm_rng_seed (&rng, 31);
  alloc_in (&c, 0, 3, T, B, C, &rng, 1.0f);
  PsmTensor *x = in (g, &c, 0);
  ck_assert (psm_locked_dropout (g, x, 0.5f) == x);   /* not training */
  float *w = psm_zoneout_weights (g, 0.25f, 100);
  for (int i = 0; i < 100; i++)
    ck_assert (w[i] == 0.25f);
  psm_rng_seed (&drop_rng, 7);
  PsmRng r = drop_rng;
  psm_graph_set_rng (g, &r);
  PsmTensor *y = psm_locked_dropout (g, x, 0.4f);
  int zeros = 0;
  for (int i = 0; i < B * C; i++) {
    float m = y->data[i] / x->data[i];
    ck_assert (y->data[i] == 0.0f || fabsf (m - 1.0f / 0.6f) < 1e-5f);
    zeros += y->data[i] == 0.0f;
    for (int t = 1; t < T; t++)   /* locked across time */
      ck_assert ((y->data[t * B * C + i] == 0.0f) == (y->data[i] == 0.0f));
  }
  ck_assert_msg (zeros > 0.35 * B * C && zeros < 0.45 * B * C, "%d of %d dropped", zeros, B * C);
  float *d = psm_zoneout_weights (g, 0.25f, 4000);
  int kept = 0;
  for (int i = 0; i < 4000; i++) {
    ck_assert (d[i] == 0.0f || d[i] == 1.0f);
    kept += d[i] == 1.0f;
  }
  ck_assert_msg (kept > 900 && kept < 1100, "%d of 4000 kept", kept);
  psm_graph_free (g);
  check_all ("locked_dropout", f_dropout, &c, 1, 1e-2f);
  free_case (&c);
}
END_TEST

/* psm_linear of a locked dropout's output (dropout_linear, matmul.c): the
 * products skip the dropped units of each class of rows. Against the dense
 * product (psm_paths.dropout_linear unset): the output, and the gradients of the
 * dropout's input, W and b after the dropout's own backward; finite
 * differences on the skipping path. Case 0 is psm_locked_dropout itself
 * (p 0.5); case 1 a mask made here (x times it, noted as a dropout) with a
 * class that drops every unit and one that drops one. T 66 x B 3 = 198 rows
 * (above PSM_PACKED_MAX_ROWS), K 37 and N 140 no multiples of a panel.
 * Where the packed kernel has a wide form (AVX-512), 66 rows a class and
 * N's 5 panels of 32 (W's panels split over two threads: 2 + 3) take it,
 * two whole panels at a time, and the last panel alone, in the forward
 * and in dW; dx (T 66: 3 panels) the same. */
enum { DL_T = 66, DL_B = 3, DL_K = 37, DL_N = 140 };
static float dl_mask[DL_B * DL_K], dl_full[DL_T * DL_B * DL_K];
static PsmTensor *dl_y;   /* the linear's output */

static PsmTensor *
f_droplin (PsmGraph *g, void *ud)
{
  Case *c = ud;
  psm_graph_const_range (g, c->x[1], n_of (c, 1));
  PsmTensor *x = in (g, c, 0), *xd;
  if (c->which == 0) {
    PsmRng r = drop_rng;
    psm_graph_set_rng (g, &r);
    xd = psm_locked_dropout (g, x, 0.5f);
    psm_graph_set_rng (g, NULL);
  } else {
    int sh[3] = { DL_T, DL_B, DL_K };
    xd = psm_mul (g, x, psm_tensor_wrap (g, dl_full, NULL, 3, sh));
    psm_graph_note_dropout (g, xd->data, xd->n, dl_mask, DL_B * DL_K);
  }
  dl_y = psm_linear (g, xd, in (g, c, 1), in (g, c, 2));
  return psm_test_project (g, dl_y);
}

START_TEST (test_dropout_linear)
{
  /* set either way here: a build without the fast packed kernel
   * (PSM_PACK_FAST 0) keeps the dense product unless told, and this checks
   * the skipping path's gradient there too */
  gboolean saved = psm_paths.dropout_linear;
  PsmRng rng;
  psm_rng_seed (&rng, 61);
  psm_rng_seed (&drop_rng, 62);
  for (int j = 0; j < DL_B * DL_K; j++)
    dl_mask[j] = j < DL_K ? 0.0f : j < 2 * DL_K ? (j % 3 ? 2.0f : 0.0f) : (j == 2 * DL_K + 5 ? 0.0f : 2.0f);
  for (int i = 0; i < DL_T * DL_B * DL_K; i++)
    dl_full[i] = dl_mask[i % (DL_B * DL_K)];
  for (int which = 0; which < 2; which++) {
    Case c = { 0 };
    c.which = which;
    alloc_in (&c, 0, 3, DL_T, DL_B, DL_K, &rng, 1.0f);
    alloc_in (&c, 1, 2, DL_K, DL_N, 0, &rng, 1.0f);
    alloc_in (&c, 2, 1, DL_N, 0, 0, &rng, 1.0f);
    float *y[2], *gr[2][3];
    for (int dense = 0; dense < 2; dense++) {
      psm_paths.dropout_linear = !dense;
      PsmProfile prof = { 0 };
      PsmGraph *g = psm_graph_new ();
      psm_graph_set_profile (g, &prof);
      for (int k = 0; k < 3; k++)
        memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
      PsmTensor *loss = f_droplin (g, &c);
      y[dense] = g_memdup2 (dl_y->data, dl_y->n * sizeof (float));
      psm_backward (g, loss);
      /* which path ran */
      ck_assert_msg ((prof.bwd[PSM_PHASE_OTHER][PSM_OP_DROPOUT_LINEAR] > 0) == !dense,
                     "dropout_linear case %d dense %d: path", which, dense);
      for (int k = 0; k < 3; k++)
        gr[dense][k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
      psm_graph_free (g);
    }
    psm_paths.dropout_linear = TRUE;   /* the finite differences below: the skipping path */
    for (int i = 0; i < DL_T * DL_B * DL_N; i++)
      ck_assert_msg (fabsf (y[0][i] - y[1][i]) <= 1e-5f * (1 + fabsf (y[1][i])),
                     "dropout_linear case %d y[%d]: %g vs %g", which, i, y[0][i], y[1][i]);
    for (int k = 0; k < 3; k++)
      for (size_t i = 0; i < n_of (&c, k); i++)
        ck_assert_msg (fabsf (gr[0][k][i] - gr[1][k][i]) <= 1e-4f * (1 + fabsf (gr[1][k][i])),
                       "dropout_linear case %d input %d [%zu]: %g vs %g", which, k, i, gr[0][k][i], gr[1][k][i]);
    for (int dense = 0; dense < 2; dense++) {
      g_free (y[dense]);
      for (int k = 0; k < 3; k++)
        g_free (gr[dense][k]);
    }
    check_all (which ? "dropout_linear (mask made here)" : "dropout_linear", f_droplin, &c, 3, 1e-2f);
    free_case (&c);
  }
  psm_paths.dropout_linear = saved;
}
END_TEST

/* psm_logsumexp, masked and not: the value against a direct sum, a row with
 * nothing kept, and the gradient (ABI 1.8). */
static float lse_mask[3 * 5];

static PsmTensor *
f_lse (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_logsumexp (g, in (g, c, 0), c->which ? lse_mask : NULL));
}

START_TEST (test_logsumexp)
{
  enum { R = 3, C = 5 };
  Case c = { 0 };
  PsmRng rng;
  psm_rng_seed (&rng, 43);
  alloc_in (&c, 0, 2, R, C, 0, &rng, 3.0f);
  for (int i = 0; i < R * C; i++)
    lse_mask[i] = i % C != 1 && i / C != 2;   /* row 2: nothing kept */
  PsmGraph *g = psm_graph_new ();
  PsmTensor *y = psm_logsumexp (g, in (g, &c, 0), NULL), *ym = psm_logsumexp (g, in (g, &c, 0), lse_mask);
  for (int r = 0; r < R; r++) {
    double s = 0.0, sm = 0.0;
    for (int j = 0; j < C; j++) {
      s += exp (c.x[0][r * C + j]);
      sm += lse_mask[r * C + j] * exp (c.x[0][r * C + j]);
    }
    ck_assert_msg (fabs (y->data[r] - log (s)) < 1e-5, "logsumexp row %d", r);
    if (r < 2)
      ck_assert_msg (fabs (ym->data[r] - log (sm)) < 1e-5, "masked logsumexp row %d", r);
    else
      ck_assert (ym->data[r] == -1e30f);
  }
  psm_graph_free (g);
  check_all ("logsumexp", f_lse, &c, 1, 1e-3f);
  lse_mask[2 * C + 3] = 1.0f;   /* -1e30 would swamp the finite differences */
  c.which = 1;
  check_all ("logsumexp (masked)", f_lse, &c, 1, 1e-3f);
  free_case (&c);
}
END_TEST

/* psm_dot_scores: rows of two steps over Bi examples against a direct dot
 * product, and the gradient in keys and queries (ABI 1.8). */
static PsmTensor *
f_dot_scores (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_dot_scores (g, in (g, c, 0), in (g, c, 1)));
}

START_TEST (test_dot_scores)
{
  enum { T = 4, Bi = 3, H = 5, R = 6 };
  Case c = { 0 };
  PsmRng rng;
  psm_rng_seed (&rng, 47);
  alloc_in (&c, 0, 3, T, Bi, H, &rng, 1.0f);
  alloc_in (&c, 1, 2, R, H, 0, &rng, 1.0f);
  PsmGraph *g = psm_graph_new ();
  PsmTensor *y = psm_dot_scores (g, in (g, &c, 0), in (g, &c, 1));
  ck_assert (psm_tensor_rows (y) == R && psm_tensor_cols (y) == T);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < T; i++) {
      double s = 0.0;
      for (int j = 0; j < H; j++)
        s += (double) c.x[1][r * H + j] * c.x[0][(i * Bi + r % Bi) * H + j];
      ck_assert_msg (fabs (y->data[r * T + i] - s) < 1e-5, "dot_scores [%d, %d]", r, i);
    }
  psm_graph_free (g);
  check_all ("dot_scores", f_dot_scores, &c, 2, 1e-3f);
  free_case (&c);
}
END_TEST

/* psm_noisy_tanh: without the training rng alpha h + (1 - alpha) x; with it
 * the formula of Gulcehre et al. 2016 for the drawn xi; the gradient in x
 * and p checked with the same noise at every evaluation (inputs kept away
 * from the kinks of hardtanh at +-1). */
static PsmTensor *
f_noisy (PsmGraph *g, void *ud)
{
  Case *c = ud;
  PsmRng r = drop_rng;
  psm_graph_set_rng (g, c->which ? &r : NULL);
  PsmTensor *y = psm_noisy_tanh (g, in (g, c, 0), in (g, c, 1), 1.15f, 0.5f);
  psm_graph_set_rng (g, NULL);
  return psm_test_project (g, y);
}

START_TEST (test_noisy_tanh)
{
  enum { T = 3, B = 4, C = 5 };
  Case c = { 0 };
  PsmRng rng;
  psm_rng_seed (&rng, 41);
  alloc_in (&c, 0, 3, T, B, C, &rng, 2.5f);
  alloc_in (&c, 1, 1, C, 0, 0, &rng, 1.0f);
  for (int i = 0; i < T * B * C; i++)
    if (fabsf (fabsf (c.x[0][i]) - 1.0f) < 0.1f)
      c.x[0][i] *= 1.3f;
  for (int i = 0; i < C; i++)
    c.x[1][i] = 1.0f + 2.0f * fabsf (c.x[1][i]);
  psm_rng_seed (&drop_rng, 9);
  PsmGraph *g = psm_graph_new ();
  PsmTensor *y = psm_noisy_tanh (g, in (g, &c, 0), in (g, &c, 1), 1.15f, 0.5f);
  PsmRng r = drop_rng, r2 = drop_rng;
  psm_graph_set_rng (g, &r);
  PsmTensor *yn = psm_noisy_tanh (g, in (g, &c, 0), in (g, &c, 1), 1.15f, 0.5f);
  int differ = 0;
  for (int i = 0; i < T * B * C; i++) {
    double x = c.x[0][i], h = x > 1 ? 1 : x < -1 ? -1 : x, xi = psm_rng_normal (&r2);
    double q = 1.0 / (1.0 + exp (-c.x[1][i % C] * (h - x)));
    double ref = 1.15 * h - 0.15 * x;
    ck_assert_msg (fabs (y->data[i] - ref) < 1e-6, "noisy_tanh without noise at %d", i);
    ref -= (x > 0 ? 1 : -1) * 0.5 * (q - 0.5) * (q - 0.5) * xi;
    ck_assert_msg (fabs (yn->data[i] - ref) < 1e-5, "noisy_tanh with noise at %d: %g vs %g", i, yn->data[i], ref);
    differ += fabs (x) > 1 && yn->data[i] != y->data[i];
  }
  ck_assert (differ > 0);   /* noise where it saturates */
  psm_graph_free (g);
  c.which = 1;
  check_all ("noisy_tanh (training)", f_noisy, &c, 2, 1e-3f);
  c.which = 0;
  check_all ("noisy_tanh (eval)", f_noisy, &c, 1, 1e-3f);
  free_case (&c);
}
END_TEST

/* psm_maxout: each output is the largest of k consecutive inputs, the
 * gradient reaching that input only; 2-D and 3-D, k = 2 and 3. Inputs kept
 * apart (no near-ties) so that the finite differences see no kink. */
static PsmTensor *
f_maxout (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_maxout (g, in (g, c, 0), c->which));
}

START_TEST (test_maxout)
{
  PsmRng rng;
  psm_rng_seed (&rng, 43);
  for (int k = 2; k <= 3; k++) {
    Case c = { 0 };
    c.which = k;
    if (k == 2)
      alloc_in (&c, 0, 2, 5, 8, 0, &rng, 1.0f);
    else
      alloc_in (&c, 0, 3, 2, 3, 6, &rng, 1.0f);
    size_t n = n_of (&c, 0);
    for (size_t i = 0; i < n; i++)   /* distinct values 0.05 apart at least */
      c.x[0][i] = 0.05f * (float) ((i * 7919) % n) - 0.4f + 0.01f * c.x[0][i];
    PsmGraph *g = psm_graph_new ();
    PsmTensor *y = psm_maxout (g, in (g, &c, 0), k);
    ck_assert_int_eq (y->n * k, n);
    ck_assert_int_eq (y->shape[y->ndim - 1] * k, k == 2 ? 8 : 6);
    for (size_t o = 0; o < y->n; o++) {
      float m = c.x[0][o * k];
      for (int i = 1; i < k; i++)
        m = MAX (m, c.x[0][o * k + i]);
      ck_assert_msg (y->data[o] == m, "maxout %d forward at %zu", k, o);
    }
    psm_graph_free (g);
    check_all (k == 2 ? "maxout 2" : "maxout 3", f_maxout, &c, 1, 1e-3f);
    free_case (&c);
  }
}
END_TEST

/* psm_gather_cols: the chosen columns of every row, a repeated column's
 * gradient summed; 1-D (a bias) and 3-D inputs. */
static PsmTensor *
f_gather_cols (PsmGraph *g, void *ud)
{
  Case *c = ud;
  return psm_test_project (g, psm_gather_cols (g, in (g, c, 0), c->ids, 4));
}

START_TEST (test_gather_cols)
{
  PsmRng rng;
  psm_rng_seed (&rng, 43);
  for (int v = 0; v < 2; v++) {
    Case c = { 0 };
    if (v == 0)
      alloc_in (&c, 0, 3, 2, 3, 7, &rng, 1.0f);
    else
      alloc_in (&c, 0, 1, 7, 0, 0, &rng, 1.0f);
    int32_t cols[4] = { 5, 0, 5, 3 };
    memcpy (c.ids, cols, sizeof cols);
    PsmGraph *g = psm_graph_new ();
    PsmTensor *y = psm_gather_cols (g, in (g, &c, 0), cols, 4);
    int R = v == 0 ? 6 : 1;
    ck_assert (y->ndim == (v == 0 ? 3 : 1) && psm_tensor_cols (y) == 4);
    for (int r = 0; r < R; r++)
      for (int j = 0; j < 4; j++)
        ck_assert (y->data[r * 4 + j] == c.x[0][r * 7 + cols[j]]);
    psm_graph_free (g);
    check_all ("gather_cols", f_gather_cols, &c, 1, 1e-2f);
    free_case (&c);
  }
}
END_TEST

/* Forward of the layout ops and reductions against plain loops. */
START_TEST (test_layout_forward)
{
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  float a[2 * 3 * 4];
  for (int i = 0; i < 24; i++)
    a[i] = (float) i;
  PsmTensor *x = psm_tensor_wrap (g, a, NULL, 3, (int[]) { 2, 3, 4 });   /* [D0, D1, C] */
  int32_t ids[3] = { 5, 0, 5 };
  PsmTensor *e = psm_embedding (g, psm_tensor_wrap (g, a, NULL, 2, (int[]) { 6, 4 }), ids, 3);
  PsmTensor *gr = psm_gather_rows (g, x, ids, 3);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++) {
      ck_assert (e->data[i * 4 + j] == a[ids[i] * 4 + j]);
      ck_assert (gr->data[i * 4 + j] == a[ids[i] * 4 + j]);
    }
  /* scatter_rows: x's 6 rows to rows 1, 2, 4, 5, 7, 8 of 9, the others 0;
   * nonzero_rows gives those rows of a weight vector, NULL for all or none */
  float wt[9] = { 0, 1, 0.5f, 0, 2, 1, 0, 1, 1 }, ones[3] = { 1, 1, 1 }, zeros3[3] = { 0 };
  const int32_t *rows;
  ck_assert_int_eq (psm_nonzero_rows (g, wt, 9, &rows), 6);
  PsmTensor *sc = psm_scatter_rows (g, x, rows, 9);
  ck_assert_int_eq (sc->shape[0], 9);
  for (int r = 0, i = 0; r < 9; r++) {
    if (wt[r] != 0.0f)
      ck_assert_int_eq (rows[i], r);
    for (int j = 0; j < 4; j++)
      ck_assert (sc->data[r * 4 + j] == (wt[r] != 0.0f ? a[i * 4 + j] : 0.0f));
    i += wt[r] != 0.0f;
  }
  ck_assert_int_eq (psm_nonzero_rows (g, ones, 3, &rows), 3);
  ck_assert (rows == NULL);
  ck_assert_int_eq (psm_nonzero_rows (g, zeros3, 3, &rows), 3);
  ck_assert (rows == NULL);
  ck_assert_int_eq (psm_nonzero_rows (g, NULL, 3, &rows), 3);
  ck_assert (rows == NULL);
  int32_t k[6] = { 3, -1, 0, 2, 1, 1 };
  PsmTensor *pk = psm_pick (g, x, k);
  for (int r = 0; r < 6; r++)
    ck_assert (pk->data[r] == (k[r] < 0 ? 0.0f : a[r * 4 + k[r]]));
  PsmTensor *sl = psm_slice (g, x, 1, 2), *cc = psm_concat (g, x, sl), *tr = psm_transpose01 (g, x);
  ck_assert_int_eq (cc->shape[2], 6);
  ck_assert_int_eq (tr->shape[0], 3);
  for (int d0 = 0; d0 < 2; d0++)
    for (int d1 = 0; d1 < 3; d1++)
      for (int c = 0; c < 6; c++) {
        float v = a[(d0 * 3 + d1) * 4 + (c < 4 ? c : c - 4 + 1)];
        ck_assert (cc->data[(d0 * 3 + d1) * 6 + c] == v);
        if (c < 2)
          ck_assert (sl->data[(d0 * 3 + d1) * 2 + c] == a[(d0 * 3 + d1) * 4 + 1 + c]);
        if (c < 4)
          ck_assert (tr->data[(d1 * 2 + d0) * 4 + c] == a[(d0 * 3 + d1) * 4 + c]);
      }
  /* attend: ctx[b] = sum_t w[b, t] v[t, b] with v = x as [T=2, B=3, H=4] */
  float w[3 * 2] = { 0.25f, 0.75f, 1.0f, 0.0f, 0.5f, 0.5f };
  PsmTensor *ctx = psm_attend (g, psm_tensor_wrap (g, w, NULL, 2, (int[]) { 3, 2 }), x);
  for (int b = 0; b < 3; b++)
    for (int j = 0; j < 4; j++)
      ck_assert (fabsf (ctx->data[b * 4 + j] - (w[b * 2] * a[(0 * 3 + b) * 4 + j] + w[b * 2 + 1] * a[(1 * 3 + b) * 4 + j])) < 1e-6);
  ck_assert (psm_sum (g, x)->data[0] == 276.0f);
  ck_assert (psm_mean (g, x)->data[0] == 11.5f);
  /* add tiles b over a: bias [C] and [D1, C] over D0 */
  PsmTensor *ad = psm_add (g, x, psm_tensor_wrap (g, a, NULL, 2, (int[]) { 3, 4 }));
  for (int i = 0; i < 24; i++)
    ck_assert (ad->data[i] == a[i] + a[i % 12]);
  psm_graph_free (g);
}
END_TEST

/* ---- fused additive attention: inputs keys [T,B,A], query [B,A], v [A],
 * w_c [A], coverage [B,T], values [T,B,H]; c->which = 1 uses coverage ---- */
#define AT 6
#define AB 4
/* AA = 59 features: with vectors of 8 (AVX2) 3 passes of 16, one of 8 and 3
 * scalar; of 16 (AVX-512) one of 32, one of 16 and 11 scalar: every loop
 * of the op's feature sums runs (attention.c, aa_energy). AH = 75 values:
 * the context and dc . h loops past one vector too. */
#define AA 59
#define AH 75

/* which & 8: step s attends from the first AB - 1 - s rows (3, then 2,
 * then 1: a step on the rows whose targets have not ended,
 * PSM_DECODER_LIVE_ROWS) */
#define AA_ROWS(c, s) ((c)->which & 8 ? AB - 1 - (s) : AB)

static PsmTensor *
f_addattn (PsmGraph *g, void *ud)
{
  Case *c = ud;
  int cov = c->which & 1, steps = c->which & 2 ? 3 : 1;
  PsmTensor *values = in (g, c, 5), *sum = NULL;
  if (c->which & 2)   /* the values' gradient deferred to one GEMM, over three steps */
    psm_defer_values_grad (g, values);
  if (c->which & 4) {   /* the ops read batch-major copies, as in the core's training graphs */
    psm_attention_batch_major (g, values);
    psm_attention_batch_major (g, in (g, c, 0));
  }
  for (int s = 0; s < steps; s++) {
    int R = AA_ROWS (c, s);
    PsmTensor *a, *ctx, *q = psm_test_first_rows (g, in (g, c, 1), R);
    if (s)
      q = psm_scale (g, q, s == 1 ? -0.5f : 1.5f);
    psm_additive_attention (g, in (g, c, 0), q, in (g, c, 2), cov ? in (g, c, 3) : NULL,
                            cov ? psm_test_first_rows (g, in (g, c, 4), R) : NULL, values, c->mask, &a, &ctx);
    PsmTensor *l = psm_add (g, psm_test_project (g, a), psm_test_project (g, ctx));
    sum = sum ? psm_add (g, sum, l) : l;
  }
  return sum;
}

/* The same from unfused ops, the forward's oracle. */
static void
addattn_reference (PsmGraph *g, Case *c, PsmTensor **a, PsmTensor **ctx)
{
  PsmTensor *pre = psm_add (g, in (g, c, 0), in (g, c, 1));        /* query tiled over T */
  if (c->which & 1) {
    int tb1[3] = { AT, AB, 1 }, one_a[2] = { 1, AA };
    PsmTensor *cov_tb = psm_transpose01 (g, in (g, c, 4));   /* [B, T] -> [T, B] */
    PsmTensor *outer = psm_matmul (g, psm_tensor_reshape (g, cov_tb, 3, tb1),
                                   psm_tensor_reshape (g, in (g, c, 3), 2, one_a), FALSE, FALSE);
    pre = psm_add (g, pre, outer);
  }
  int a1[2] = { AA, 1 }, tb[2] = { AT, AB };
  PsmTensor *e = psm_matmul (g, psm_tanh (g, pre), psm_tensor_reshape (g, in (g, c, 2), 2, a1), FALSE, FALSE);
  PsmTensor *ebt = psm_transpose01 (g, psm_tensor_reshape (g, e, 2, tb));
  float mbt[AB * AT];
  for (int t = 0; t < AT; t++)
    for (int b = 0; b < AB; b++)
      mbt[b * AT + t] = c->mask[t * AB + b];
  *a = psm_masked_softmax (g, ebt, mbt);
  *ctx = psm_attend (g, *a, in (g, c, 5));
}

/* The inputs, random; example 1 is shorter, example 3 is all padding. */
static void
addattn_case (Case *c, PsmRng *rng)
{
  alloc_in (c, 0, 3, AT, AB, AA, rng, 1.0f);
  alloc_in (c, 1, 2, AB, AA, 0, rng, 1.0f);
  alloc_in (c, 2, 1, AA, 0, 0, rng, 1.0f);
  alloc_in (c, 3, 1, AA, 0, 0, rng, 1.0f);
  alloc_in (c, 4, 2, AB, AT, 0, rng, 1.0f);
  alloc_in (c, 5, 3, AT, AB, AH, rng, 1.0f);
  for (int t = 0; t < AT; t++)
    for (int b = 0; b < AB; b++)
      c->mask[t * AB + b] = (b == 1 && t >= 3) || b == 3 ? 0.0f : 1.0f;
}

START_TEST (test_additive_attention)
{
  PsmRng rng;
  psm_rng_seed (&rng, 13);
  for (int which = 0; which < 16; which++) {
    int cov = which & 1, R = AA_ROWS (&(Case) { .which = which }, 0);
    Case c = { 0 };
    c.which = which;
    addattn_case (&c, &rng);
    PsmGraph *g = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    PsmTensor *a, *ctx, *ra, *rctx;
    /* which & 8: the first 3 rows of 4, the keys, values and mask of all 4 */
    psm_additive_attention (g, in (g, &c, 0), psm_test_first_rows (g, in (g, &c, 1), R), in (g, &c, 2),
                            cov ? in (g, &c, 3) : NULL, cov ? psm_test_first_rows (g, in (g, &c, 4), R) : NULL, in (g, &c, 5),
                            c.mask, &a, &ctx);
    ck_assert (psm_tensor_rows (a) == R && psm_tensor_rows (ctx) == R);
    addattn_reference (g, &c, &ra, &rctx);
    for (int i = 0; i < R * AT; i++)
      ck_assert_msg (fabsf (a->data[i] - ra->data[i]) <= 1e-5f, "attention %d: %g vs %g", i, a->data[i], ra->data[i]);
    for (int i = 0; i < R * AH; i++)
      ck_assert_msg (fabsf (ctx->data[i] - rctx->data[i]) <= 1e-5f, "context %d: %g vs %g", i, ctx->data[i], rctx->data[i]);
    for (int t = 0; t < AT; t++)
      ck_assert ((R < 4 || a->data[3 * AT + t] == 0.0f) && (t < 3 || a->data[1 * AT + t] == 0.0f));
    for (int j = 0; j < AH; j++)
      ck_assert ((R < 4 || ctx->data[3 * AH + j] == 0.0f) && isfinite (ctx->data[j]));
    psm_graph_free (g);
    for (int k = 0; k < 6; k++) {
      if (!cov && (k == 3 || k == 4))
        continue;   /* no coverage: w_c and coverage are not inputs */
      char *what = g_strdup_printf ("additive_attention%s%s%s%s input %d", cov ? " (coverage)" : "",
                                    which & 2 ? " (3 steps, values' gradient deferred)" : "",
                                    which & 4 ? " (batch-major copies)" : "",
                                    which & 8 ? " (the first 3, 2, 1 rows of 4)" : "", k);
      psm_test_gradcheck (what, f_addattn, &c, c.x[k], c.gx[k], n_of (&c, k), 1e-2f, ATOL, RTOL, 300);
      g_free (what);
    }
    free_case (&c);
  }
}
END_TEST


/* The batch-major copies (psm_attention_batch_major) change no result: the
 * outputs and every input's gradient bit for bit those of the op over the
 * time-major tensors, over three steps with coverage, with and without the
 * values' gradient deferred; and the copies are read (a copy changed behind
 * the op's back changes the output). */
#define BF16_ATTN_TOL 2e-6f
START_TEST (test_additive_attention_batch_major)
{
  PsmRng rng;
  psm_rng_seed (&rng, 29);
  static const int whiches[] = { 1, 3, 11 };   /* 11: steps on 3, 2 and 1 of the 4 rows */
  for (guint w = 0; w < G_N_ELEMENTS (whiches); w++) {
    int which = whiches[w];
    Case c = { 0 };
    addattn_case (&c, &rng);
    float loss[2], *grads[2][6];
    for (int bm = 0; bm < 2; bm++) {
      c.which = which | (bm ? 4 : 0);
      for (int k = 0; k < 6; k++)
        memset (c.gx[k], 0, n_of (&c, k) * sizeof (float));
      PsmGraph *g = psm_graph_new ();
      PsmTensor *l = f_addattn (g, &c);
      loss[bm] = l->data[0];
      psm_backward (g, l);
      psm_graph_free (g);
      for (int k = 0; k < 6; k++)
        grads[bm][k] = g_memdup2 (c.gx[k], n_of (&c, k) * sizeof (float));
    }
    ck_assert_msg (loss[0] == loss[1], "loss %.9g vs %.9g with the copies", loss[0], loss[1]);
    for (int k = 0; k < 6; k++) {
      ck_assert_msg (memcmp (grads[0][k], grads[1][k], n_of (&c, k) * sizeof (float)) == 0,
                     "which %d: input %d's gradient differs with the copies", which, k);
      g_free (grads[0][k]);
      g_free (grads[1][k]);
    }
    /* the op reads the copy: change it after the copy is made */
    PsmGraph *g = psm_graph_new ();
    PsmTensor *keys = in (g, &c, 0), *a[2], *ctx;
    for (int bm = 0; bm < 2; bm++) {
      if (bm) {
        psm_attention_batch_major (g, keys);
        PsmBatchMajor *e = psm_graph_batch_major (g, keys->data, AT, AB, AA);
        ck_assert (e != NULL);
        e->bm[0] += 1.0f;   /* example 0, position 0, feature 0 */
      }
      psm_additive_attention (g, keys, in (g, &c, 1), in (g, &c, 2), in (g, &c, 3), in (g, &c, 4), in (g, &c, 5),
                              c.mask, &a[bm], &ctx);
    }
    ck_assert (a[0]->data[0] != a[1]->data[0] && a[0]->data[AT] == a[1]->data[AT]);
    psm_graph_free (g);
    free_case (&c);
  }
  /* train.precision bf16: the op reads the copies rounded to bfloat16, so
   * on a bf16 training graph the loss and every gradient are those of a
   * single-precision graph whose keys and values were rounded beforehand
   * (the gradients reach the unrounded tensors unchanged), and not those of
   * the unrounded ones. Not to the bit: the two element types go through
   * loops GCC compiles apart, and whether it contracts a multiply and an add
   * into one FMA is its choice per loop (-mtune=znver3 keeps some apart;
   * issue 57). What the code guarantees is the same operations on the same
   * values, so the two agree to a few roundings (BF16_ATTN_TOL of the
   * largest magnitude), while the unrounded inputs move the loss by more
   * than ten times that. */
  for (guint w = 0; w < G_N_ELEMENTS (whiches); w++) {
    Case c[2];
    memset (c, 0, sizeof c);
    for (int v = 0; v < 2; v++) {
      PsmRng r2;
      psm_rng_seed (&r2, 77 + w);
      addattn_case (&c[v], &r2);
      c[v].which = whiches[w] | 4;
    }
    for (int k = 0; k < 2; k++) {   /* c[0]: keys and values rounded */
      float *x = c[0].x[k ? 5 : 0];
      for (size_t i = 0; i < n_of (&c[0], k ? 5 : 0); i++)
        x[i] = psm_bf16_round (x[i]);
    }
    float loss[3], *grads[2][6];
    for (int v = 0; v < 3; v++) {   /* 0 rounded, fp32; 1 bf16 training; 2 unrounded, fp32 */
      Case *cv = &c[v > 0];
      for (int k = 0; k < 6; k++)
        memset (cv->gx[k], 0, n_of (cv, k) * sizeof (float));
      PsmGraph *g = psm_graph_new ();
      psm_graph_set_bf16_train (g, v == 1);
      PsmTensor *l = f_addattn (g, cv);
      loss[v] = l->data[0];
      psm_backward (g, l);
      psm_graph_free (g);
      for (int k = 0; k < 6 && v < 2; k++)
        grads[v][k] = g_memdup2 (cv->gx[k], n_of (cv, k) * sizeof (float));
    }
    float ltol = BF16_ATTN_TOL * fabsf (loss[0]);
    ck_assert_msg (fabsf (loss[0] - loss[1]) <= ltol && fabsf (loss[2] - loss[1]) > 10.0f * ltol,
                   "which %d: bf16 loss %.9g, rounded inputs' %.9g, fp32 %.9g", whiches[w], loss[1], loss[0], loss[2]);
    for (int k = 0; k < 6; k++) {
      float big = 0.0f;
      for (size_t i = 0; i < n_of (&c[0], k); i++)
        big = MAX (big, fabsf (grads[0][k][i]));
      for (size_t i = 0; i < n_of (&c[0], k); i++)
        ck_assert_msg (fabsf (grads[0][k][i] - grads[1][k][i]) <= BF16_ATTN_TOL * big,
                       "which %d: bf16 attention gradient mismatch, input %d [%zu]: %.9g, want %.9g (largest %g)",
                       whiches[w], k, i, grads[1][k][i], grads[0][k][i], big);
      g_free (grads[0][k]);
      g_free (grads[1][k]);
    }
    free_case (&c[0]);
    free_case (&c[1]);
  }
}
END_TEST

/* Beams (decoding, no gradients): with the repeated keys and values noted as
 * repeats of compact ones (psm_graph_add_repeat), the op reads the compact
 * copies; the result must be bit for bit the one over the repeated
 * tensors. 4 articles x 3 beams, coverage on, articles 1 and 2 shorter. */
START_TEST (test_additive_attention_beams)
{
  PsmRng rng;
  psm_rng_seed (&rng, 19);
  enum { T = 7, NB = 4, G = 3, A = 20, H = 9, B = NB * G };
  float *kc = g_new (float, T * NB * A), *hc = g_new (float, T * NB * H);
  float *kr = g_new (float, T * B * A), *hr = g_new (float, T * B * H);
  float q[B * A], v[A], wc[A], cov[B * T], mask[T * B];
  psm_test_fill (kc, T * NB * A, 1.0f, &rng);
  psm_test_fill (hc, T * NB * H, 1.0f, &rng);
  psm_test_fill (q, B * A, 1.0f, &rng);
  psm_test_fill (v, A, 1.0f, &rng);
  psm_test_fill (wc, A, 1.0f, &rng);
  psm_test_fill (cov, B * T, 1.0f, &rng);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < B; r++) {
      memcpy (kr + ((size_t) t * B + r) * A, kc + ((size_t) t * NB + r / G) * A, A * sizeof (float));
      memcpy (hr + ((size_t) t * B + r) * H, hc + ((size_t) t * NB + r / G) * H, H * sizeof (float));
      mask[t * B + r] = (r / G == 1 && t >= 5) || (r / G == 2 && t >= 2) ? 0.0f : 1.0f;
    }
  PsmTensor *a[2], *ctx[2];
  PsmGraph *gs[2];
  for (int k = 0; k < 2; k++) {
    PsmGraph *g = gs[k] = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    if (k)
      {
        psm_graph_add_repeat (g, kr, kc, G);
        psm_graph_add_repeat (g, hr, hc, G);
      }
    psm_additive_attention (g, psm_tensor_wrap (g, kr, NULL, 3, (int[]) { T, B, A }),
                            psm_tensor_wrap (g, q, NULL, 2, (int[]) { B, A }), psm_tensor_wrap (g, v, NULL, 1, (int[]) { A }),
                            psm_tensor_wrap (g, wc, NULL, 1, (int[]) { A }), psm_tensor_wrap (g, cov, NULL, 2, (int[]) { B, T }),
                            psm_tensor_wrap (g, hr, NULL, 3, (int[]) { T, B, H }), mask, &a[k], &ctx[k]);
  }
  ck_assert (memcmp (a[0]->data, a[1]->data, B * T * sizeof (float)) == 0);
  ck_assert (memcmp (ctx[0]->data, ctx[1]->data, B * H * sizeof (float)) == 0);
  ck_assert (a[1]->data[1 * G * T + 6] == 0.0f && a[1]->data[0 * G * T + 6] != 0.0f);
  psm_graph_free (gs[0]);
  psm_graph_free (gs[1]);
  g_free (kc);
  g_free (hc);
  g_free (kr);
  g_free (hr);
}
END_TEST

/* psm_dot_scores over beams: with the repeated keys noted as a repeat of
 * compact ones, the op reads the compact ones (the repeated copy is emptied
 * before the second call) and the scores are bit for bit those over the
 * repeated keys (enough work for the threads: 4 articles x 5 beams, T 40,
 * H 128). */
START_TEST (test_dot_scores_beams)
{
  PsmRng rng;
  psm_rng_seed (&rng, 23);
  enum { T = 40, NB = 4, G = 5, H = 128, B = NB * G };
  float *kc = g_new (float, T * NB * H), *kr = g_new (float, T * B * H), *q = g_new (float, B * H);
  psm_test_fill (kc, T * NB * H, 1.0f, &rng);
  psm_test_fill (q, B * H, 1.0f, &rng);
  for (int t = 0; t < T; t++)
    for (int r = 0; r < B; r++)
      memcpy (kr + ((size_t) t * B + r) * H, kc + ((size_t) t * NB + r / G) * H, H * sizeof (float));
  PsmTensor *y[2];
  PsmGraph *gs[2];
  for (int k = 0; k < 2; k++) {
    PsmGraph *g = gs[k] = psm_graph_new ();
    psm_graph_set_grad (g, FALSE);
    if (k) {   /* the repeated copy emptied: only the compact one gives y[0] */
      psm_graph_add_repeat (g, kr, kc, G);
      memset (kr, 0, (size_t) T * B * H * sizeof (float));
    }
    y[k] = psm_dot_scores (g, psm_tensor_wrap (g, kr, NULL, 3, (int[]) { T, B, H }),
                           psm_tensor_wrap (g, q, NULL, 2, (int[]) { B, H }));
  }
  ck_assert (memcmp (y[0]->data, y[1]->data, B * T * sizeof (float)) == 0);
  double s = 0.0;   /* row 7 (article 1), position 3, directly */
  for (int j = 0; j < H; j++)
    s += (double) q[7 * H + j] * kc[(3 * NB + 1) * H + j];
  ck_assert (fabs (y[1]->data[7 * T + 3] - s) < 1e-4);
  psm_graph_free (gs[0]);
  psm_graph_free (gs[1]);
  g_free (kc);
  g_free (kr);
  g_free (q);
}
END_TEST

/* ---- pointer ops: R = 6 rows (3 steps of Bi = 2 examples), T = 4 source
 * positions, vocabulary S0 = 5 extended to S = 8 ---- */
#define PR 6
#define PB 2
#define PT 4
#define PS0 5
#define PS 8
static const int32_t p_ids[PT * PB] = { 1, 6, 5, 6, 1, 2, 7, -1 };   /* [T, Bi] */
static const int32_t p_tgt[PR] = { 1, 6, 4, 2, -1, 7 };

static PsmTensor *
f_pointer (PsmGraph *g, void *ud)
{
  Case *c = ud;
  switch (c->which) {
  case 0:
    return psm_test_project (g, psm_scatter_add (g, in (g, c, 1), in (g, c, 0), p_ids, PB, PS));
  case 1:
    return psm_test_project (g, psm_gather_mass (g, in (g, c, 0), p_ids, PB, p_tgt));
  case 2: {
    int32_t t[PR] = { 1, 0, 4, 2, -1, 3 };
    PsmTensor *y = psm_pick_log_softmax (g, in (g, c, 1), t);
    /* skip the -inf row: scale it away through a masked copy */
    PsmTensor *m = psm_tensor_zeros (g, 2, (int[]) { PR, 1 }, FALSE);
    for (int r = 0; r < PR; r++)
      m->data[r] = t[r] >= 0;
    for (int r = 0; r < PR; r++)
      if (t[r] < 0)
        y->data[r] = 0.0f;
    return psm_test_project (g, psm_mul_rows (g, y, m));
  }
  case 3: {
    int32_t t[PR] = { 1, -1, 4, 2, 0, 3 };   /* row 1: target outside the vocabulary */
    PsmTensor *lg = psm_pick_log_softmax (g, in (g, c, 1), t);
    PsmTensor *mass = psm_gather_mass (g, in (g, c, 3), p_ids, PB, p_tgt);
    return psm_mixture_nll (g, in (g, c, 2), lg, mass, c->w);
  }
  case 4:
    return psm_coverage_loss (g, in (g, c, 0), in (g, c, 3), c->w);
  case 5:
    return psm_test_project (g, psm_log (g, psm_affine (g, psm_mul_rows (g, in (g, c, 3), in (g, c, 4)), 0.5f, 2.0f)));
  default: {
    int sh[3] = { 3, PB, PT };
    PsmTensor *seq = psm_tensor_new (g, 3, sh, TRUE);
    PsmTensor *x = in (g, c, 0);
    for (int t = 0; t < 3; t++)
      psm_set_step (g, seq, t, psm_tensor_view (g, x, (size_t) t * PB * PT, 2, (int[]) { PB, PT }));
    return psm_test_project (g, psm_tanh (g, seq));
  }
  }
}

START_TEST (test_pointer_ops)
{
  PsmRng rng;
  psm_rng_seed (&rng, 17);
  Case c = { 0 };
  alloc_in (&c, 0, 2, PR, PT, 0, &rng, 1.0f);    /* w / attention */
  alloc_in (&c, 1, 2, PR, PS0, 0, &rng, 1.0f);   /* base / logits */
  alloc_in (&c, 2, 2, PR, 1, 0, &rng, 2.0f);     /* z */
  alloc_in (&c, 3, 2, PR, PT, 0, &rng, 0.5f);    /* positive: copy weights, coverage */
  alloc_in (&c, 4, 2, PR, 1, 0, &rng, 1.0f);
  for (size_t i = 0; i < n_of (&c, 3); i++)
    c.x[3][i] = 0.05f + fabsf (c.x[3][i]);
  for (int r = 0; r < PR; r++)
    c.w[r] = r == 4 ? 0.0f : 1.0f + 0.25f * r;

  /* forward against plain loops */
  PsmGraph *g = psm_graph_new ();
  psm_graph_set_grad (g, FALSE);
  PsmTensor *y = psm_scatter_add (g, in (g, &c, 1), in (g, &c, 0), p_ids, PB, PS);
  PsmTensor *mass = psm_gather_mass (g, in (g, &c, 0), p_ids, PB, p_tgt);
  for (int r = 0; r < PR; r++) {
    double want[PS] = { 0 }, m = 0.0;
    for (int j = 0; j < PS0; j++)
      want[j] = c.x[1][r * PS0 + j];
    for (int i = 0; i < PT; i++) {
      int32_t id = p_ids[i * PB + r % PB];
      if (id >= 0)
        want[id] += c.x[0][r * PT + i];
      if (id == p_tgt[r] && p_tgt[r] >= 0)
        m += c.x[0][r * PT + i];
    }
    for (int j = 0; j < PS; j++)
      ck_assert_msg (fabs (want[j] - y->data[r * PS + j]) < 1e-5, "scatter_add [%d, %d]", r, j);
    ck_assert_msg (fabs (m - mass->data[r]) < 1e-5, "gather_mass [%d]", r);
    ck_assert (p_tgt[r] < 0 || fabs (want[p_tgt[r]] - (p_tgt[r] < PS0 ? c.x[1][r * PS0 + p_tgt[r]] : 0.0f) - m) < 1e-5);
  }
  int32_t t[PR] = { 1, -1, 4, 2, 0, 3 };
  PsmTensor *lp = psm_pick_log_softmax (g, in (g, &c, 1), t);
  PsmTensor *ref = psm_log_softmax (g, in (g, &c, 1));
  for (int r = 0; r < PR; r++)
    ck_assert (t[r] < 0 ? isinf (lp->data[r]) && lp->data[r] < 0
                        : fabsf (lp->data[r] - ref->data[r * PS0 + t[r]]) < 1e-5f);
  /* mixture NLL by hand, including the out-of-vocabulary row and a zero weight */
  PsmTensor *nll = psm_mixture_nll (g, in (g, &c, 2), lp, mass, c.w);
  double s = 0, W = 0;
  for (int r = 0; r < PR; r++) {
    double p = 1.0 / (1.0 + exp (-c.x[2][r]));
    double pv = t[r] < 0 ? 0.0 : exp (ref->data[r * PS0 + t[r]]);
    s -= c.w[r] * log (p * pv + (1 - p) * mass->data[r] + (c.w[r] == 0 ? 1.0 : 0.0));
    W += c.w[r];
  }
  ck_assert_msg (fabs (s / W - nll->data[0]) < 1e-5, "mixture_nll %g vs %g", nll->data[0], s / W);
  /* a target with zero probability either way stays finite */
  float zero_mass[PR] = { 0 };
  int one[2] = { PR, 1 };
  PsmTensor *zm = psm_tensor_wrap (g, zero_mass, NULL, 2, one);
  int32_t none[PR] = { -1, -1, -1, -1, -1, -1 };
  ck_assert (isfinite (psm_mixture_nll (g, in (g, &c, 2), psm_pick_log_softmax (g, in (g, &c, 1), none), zm, NULL)->data[0]));
  PsmTensor *cl = psm_coverage_loss (g, in (g, &c, 0), in (g, &c, 3), c.w);
  s = 0;
  for (int r = 0; r < PR; r++)
    for (int i = 0; i < PT; i++)
      s += c.w[r] * MIN (c.x[0][r * PT + i], c.x[3][r * PT + i]);
  ck_assert (fabs (s / W - cl->data[0]) < 1e-5);
  psm_graph_free (g);

  const char *names[] = { "scatter_add", "gather_mass", "pick_log_softmax", "mixture_nll", "coverage_loss",
                          "mul_rows+affine+log", "set_step" };
  const int inputs[][3] = { { 0, 1, -1 }, { 0, -1 }, { 1, -1 }, { 1, 2, 3 }, { 0, 3, -1 }, { 3, 4, -1 }, { 0, -1 } };
  for (int op = 0; op < 7; op++) {
    c.which = op;
    for (int k = 0; k < 3 && inputs[op][k] >= 0; k++) {
      int x = inputs[op][k];
      char *what = g_strdup_printf ("%s input %d", names[op], x);
      psm_test_gradcheck (what, f_pointer, &c, c.x[x], c.gx[x], n_of (&c, x), 1e-3f, ATOL, RTOL, 300);
      g_free (what);
    }
  }
  free_case (&c);
}
END_TEST

START_TEST (test_op_table)
{
  for (int i = 0; i < PSM_OP_COUNT; i++) {
    ck_assert_msg (psm_op_table[i].name != NULL, "op %d has no row in psm_op_table", i);
    ck_assert_msg (psm_op_table[i].backward != NULL, "op %s has no backward", psm_op_table[i].name);
  }
}
END_TEST

int
main (int argc, char **argv)
{
  if (argc > 1 && strcmp (argv[1], "gemm-thread-limit") == 0)
    return gemm_thread_limit_child ();
  Suite *s = suite_create ("ops");
  TCase *tc = tcase_create ("ops");
  tcase_set_timeout (tc, 120);
  tcase_add_test (tc, test_op_table);
  tcase_add_test (tc, test_layout_forward);
  tcase_add_test (tc, test_matmul);
  tcase_add_test (tc, test_fastmath);
  tcase_add_test (tc, test_linear);
  tcase_add_test (tc, test_embedding_linear);
  tcase_add_test (tc, test_packed_weights);
  tcase_add_test (tc, test_dropout_linear);
  tcase_add_test (tc, test_unary);
  tcase_add_test (tc, test_binary);
  tcase_add_test (tc, test_losses);
  tcase_add_test (tc, test_gru);
  tcase_add_test (tc, test_gru_seq_paths);
  tcase_add_test (tc, test_packed_gemm);
  tcase_add_test (tc, test_gemm_bf16);
  tcase_add_test (tc, test_recurrence_bf16);
  tcase_add_test (tc, test_train_bf16);
  tcase_add_test (tc, test_linear_pick_log_softmax);
  tcase_add_test (tc, test_deferred_weight);
  tcase_add_test (tc, test_packed_gemm_store);
  tcase_add_test (tc, test_gemm_thread_limit);
  tcase_add_test (tc, test_colsum);
  tcase_add_test (tc, test_lstm);
  tcase_add_test (tc, test_lstm_no_grad);
  tcase_add_test (tc, test_lstm_seq);
  tcase_add_test (tc, test_lstm_seq_cols);
  tcase_add_test (tc, test_gru_seq_cols);
  tcase_add_test (tc, test_seq_packed_cache);
  tcase_add_test (tc, test_lstm_seq_col_split);
  tcase_add_test (tc, test_lstm_zoneout);
  tcase_add_test (tc, test_dropout);
  tcase_add_test (tc, test_noisy_tanh);
  tcase_add_test (tc, test_maxout);
  tcase_add_test (tc, test_logsumexp);
  tcase_add_test (tc, test_dot_scores);
  tcase_add_test (tc, test_gather_cols);
  tcase_add_test (tc, test_additive_attention);
  tcase_add_test (tc, test_additive_attention_beams);
  tcase_add_test (tc, test_additive_attention_batch_major);
  tcase_add_test (tc, test_dot_scores_beams);
  tcase_add_test (tc, test_pointer_ops);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
