/* test-core.c — arena and graph, RNG, parameters, optimisers (against
 * hand-computed updates), gradient clipping, checkpoints (round trip,
 * corruption, mismatch, atomic replacement), vocabularies (psm-vocab.h),
 * a batch's rows put in order of target length. */
#include "config.h"
#include <math.h>
#include <string.h>
#include <unistd.h>
#include <glib/gstdio.h>
#include "psm-test.h"
#include "run/run-internal.h"

START_TEST (test_arena)
{
  PsmArena *a = psm_arena_new (1024);
  void *p1 = psm_arena_alloc (a, 100);
  ck_assert (((uintptr_t) p1 & 63) == 0);
  for (int i = 0; i < 100; i++)
    psm_arena_alloc (a, 4000);   /* spills into new blocks */
  size_t used = psm_arena_used (a);
  ck_assert_uint_ge (used, 400000);
  psm_arena_reset (a);
  ck_assert_uint_eq (psm_arena_used (a), 0);
  /* after reset one block holds a step of the same size: same first address */
  void *q1 = psm_arena_alloc (a, 100);
  for (int i = 0; i < 100; i++)
    psm_arena_alloc (a, 4000);
  psm_arena_reset (a);
  ck_assert_ptr_eq (psm_arena_alloc (a, 100), q1);
  psm_arena_free (a);
}
END_TEST

START_TEST (test_views_share_grad)
{
  PsmGraph *g = psm_graph_new ();
  int s[3] = { 3, 2, 4 };
  PsmTensor *x = psm_tensor_zeros (g, 3, s, TRUE);
  for (size_t i = 0; i < x->n; i++)
    x->data[i] = (float) i;
  PsmTensor *step = psm_tensor_step (g, x, 1);
  ck_assert_int_eq (step->ndim, 2);
  ck_assert (step->data[0] == 8.0f);
  PsmTensor *loss = psm_sum (g, psm_scale (g, step, 3.0f));
  psm_backward (g, loss);
  for (size_t i = 0; i < x->n; i++)
    ck_assert (x->grad[i] == ((i >= 8 && i < 16) ? 3.0f : 0.0f));
  /* no-grad mode records nothing and allocates no gradients */
  psm_graph_reset (g);
  psm_graph_set_grad (g, FALSE);
  PsmTensor *y = psm_tensor_zeros (g, 3, s, TRUE);
  ck_assert (y->grad == NULL);
  psm_sum (g, psm_tanh (g, y));
  ck_assert_uint_eq (psm_graph_n_nodes (g), 0);
  psm_graph_free (g);
}
END_TEST

static int n_criticals;

static void
count_criticals (const gchar *domain, GLogLevelFlags level, const gchar *msg, gpointer ud)
{
  if (level & G_LOG_LEVEL_CRITICAL)
    n_criticals++;
}

/* Misuse of the tensor API is refused with a message, never a wild write:
 * views past the end (offset + n wrapping), negative or overflowing shapes,
 * rank-0 tensors where an op works on the last dim. */
START_TEST (test_tensor_bounds)
{
  GLogFunc old = g_log_set_default_handler (count_criticals, NULL);
  PsmGraph *g = psm_graph_new ();
  int s2[2] = { 3, 4 };
  PsmTensor *x = psm_tensor_zeros (g, 2, s2, TRUE);
  int four = 4;
  n_criticals = 0;
  ck_assert (psm_tensor_view (g, x, SIZE_MAX - 2, 1, &four) == NULL);   /* offset + n wraps */
  ck_assert (psm_tensor_view (g, x, 9, 1, &four) == NULL);
  ck_assert (psm_tensor_view (g, x, 8, 1, &four) != NULL);              /* the last 4: fine */
  int neg[2] = { -1, 4 };
  ck_assert (psm_tensor_new (g, 2, neg, FALSE) == NULL);
  ck_assert (psm_tensor_zeros (g, 2, neg, FALSE) == NULL);
  int huge[4] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20 };
  ck_assert (psm_tensor_new (g, 4, huge, FALSE) == NULL);
  ck_assert (psm_tensor_reshape (g, x, 2, neg) == NULL);
  ck_assert (psm_tensor_new (g, 5, s2, FALSE) == NULL);
  PsmTensor *scalar = psm_tensor_zeros (g, 0, NULL, TRUE);
  ck_assert (scalar && scalar->n == 1);
  ck_assert (psm_concat (g, scalar, scalar) == NULL);
  ck_assert (psm_slice (g, scalar, 0, 1) == NULL);
  ck_assert (psm_slice (g, x, 2, 3) == NULL);
  ck_assert (psm_slice (g, x, 1, G_MAXINT) == NULL);
  int ws[2] = { 1, 1 };
  ck_assert (psm_linear (g, scalar, psm_tensor_zeros (g, 2, ws, FALSE), NULL) == NULL);
  ck_assert_int_eq (n_criticals, 12);
  psm_graph_free (g);
  g_log_set_default_handler (old, NULL);
}
END_TEST

START_TEST (test_rng)
{
  PsmRng a, b;
  psm_rng_seed (&a, 7);
  psm_rng_seed (&b, 7);
  for (int i = 0; i < 1000; i++)
    ck_assert_uint_eq (psm_rng_u32 (&a), psm_rng_u32 (&b));
  psm_rng_seed (&b, 8);
  ck_assert_uint_ne (psm_rng_u32 (&a), psm_rng_u32 (&b));
  /* below(n) is uniform enough: each of 10 bins within 10% of 1000 */
  int bins[10] = { 0 };
  double mean = 0, var = 0;
  for (int i = 0; i < 10000; i++) {
    bins[psm_rng_below (&a, 10)]++;
    double z = psm_rng_normal (&a);
    mean += z;
    var += z * z;
  }
  for (int i = 0; i < 10; i++)
    ck_assert_int_lt (abs (bins[i] - 1000), 100);
  ck_assert (fabs (mean / 10000) < 0.05 && fabs (var / 10000 - 1.0) < 0.05);
}
END_TEST

START_TEST (test_params)
{
  PsmParams *p = psm_params_new ();
  int s1[2] = { 4, 12 }, s2[1] = { 5 };
  int a = psm_params_add (p, "enc.w", 2, s1, PSM_INIT_ORTHOGONAL, 0);
  int b = psm_params_add (p, "enc.b", 1, s2, PSM_INIT_CONST, -1.0f);
  ck_assert_int_eq (psm_params_find (p, "enc.b"), b);
  ck_assert_int_eq (psm_params_find (p, "nope"), -1);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (psm_params_finalize (p, &rng, NULL));
  ck_assert_uint_eq (psm_params_offset (p, a) % 16, 0);
  ck_assert_uint_eq (psm_params_offset (p, b) % 16, 0);
  ck_assert_uint_eq (psm_params_numel (p, a), 48);
  ck_assert_uint_eq (psm_params_numel (p, b), 5);
  float *w = psm_params_data (p) + psm_params_offset (p, a);
  /* each [4, 4] block of the [4, 12] matrix is orthogonal: W^T W = I */
  for (int blk = 0; blk < 3; blk++)
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++) {
        double d = 0;
        for (int r = 0; r < 4; r++)
          d += (double) w[r * 12 + blk * 4 + i] * w[r * 12 + blk * 4 + j];
        ck_assert_msg (fabs (d - (i == j)) < 1e-5, "block %d (%d,%d) = %g", blk, i, j, d);
      }
  for (int i = 0; i < 5; i++)
    ck_assert (psm_params_data (p)[psm_params_offset (p, b) + i] == -1.0f);
  /* clipping to a global norm */
  float *gr = psm_params_grad (p);
  gr[0] = 3.0f;
  gr[psm_params_offset (p, b)] = 4.0f;
  ck_assert (fabs (psm_params_clip (p, 1.0) - 5.0) < 1e-6);
  ck_assert (fabsf (gr[0] - 0.6f) < 1e-6 && fabsf (gr[psm_params_offset (p, b)] - 0.8f) < 1e-6);
  ck_assert (fabs (psm_params_clip (p, 0.0) - 1.0) < 1e-6);   /* 0 = report only */
  psm_params_free (p);
}
END_TEST

/* A parameter of N elements, all w = 1 with gradients 0.5 then -0.25;
 * expected values computed by hand from each rule's definition. N is large
 * enough for the update to be shared out over the threads, and every
 * element must come out the same. */
#define OPT_N 40000

static double
all_same (PsmParams *p)
{
  const float *w = psm_params_data (p);
  for (int i = 1; i < OPT_N; i++)
    ck_assert_msg (w[i] == w[0], "element %d: %g, element 0: %g", i, w[i], w[0]);
  return w[0];
}

static void
two_steps (PsmOptConfig *c, double *w1, double *w2)
{
  PsmParams *p = psm_params_new ();
  int n = OPT_N;
  psm_params_add (p, "w", 1, &n, PSM_INIT_CONST, 1.0f);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (psm_params_finalize (p, &rng, NULL));
  PsmOptim *o = psm_optim_new (c, p);
  float *g = psm_params_grad (p);
  for (int i = 0; i < OPT_N; i++)
    g[i] = 0.5f;
  psm_optim_step (o, 0);
  *w1 = all_same (p);
  for (int i = 0; i < OPT_N; i++)
    g[i] = -0.25f;
  psm_optim_step (o, 1);
  *w2 = all_same (p);
  psm_optim_free (o);
  psm_params_free (p);
}

/* Zeng et al.'s initialisation: weights U(-r, r), zero-started vectors
 * (biases) at the bias value, constants kept. */
START_TEST (test_init_uniform)
{
  PsmParams *p = psm_params_new ();
  int s1[2] = { 8, 24 }, s2[1] = { 5 };
  int w = psm_params_add (p, "w", 2, s1, PSM_INIT_ORTHOGONAL, 0);
  int x = psm_params_add (p, "x", 2, s1, PSM_INIT_XAVIER, 0);
  int b = psm_params_add (p, "b", 1, s2, PSM_INIT_ZEROS, 0);
  int k = psm_params_add (p, "k", 1, s2, PSM_INIT_CONST, -1.0f);
  int v = psm_params_add (p, "v", 1, s2, PSM_INIT_UNIFORM, 0.5f);
  psm_params_init_uniform (p, 0.0765f, 0.1f);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (psm_params_finalize (p, &rng, NULL));
  const float *d = psm_params_data (p);
  float hi = 0.0f;
  for (int i = 0; i < 8 * 24; i++)
    for (int id = 0; id < 2; id++) {
      float e = d[psm_params_offset (p, id == 0 ? w : x) + i];
      ck_assert (fabsf (e) <= 0.0765f);
      hi = MAX (hi, fabsf (e));
    }
  ck_assert (hi > 0.06f);   /* spread over the range */
  for (int i = 0; i < 5; i++) {
    ck_assert (d[psm_params_offset (p, b) + i] == 0.1f);
    ck_assert (d[psm_params_offset (p, k) + i] == -1.0f);
    ck_assert (fabsf (d[psm_params_offset (p, v) + i]) <= 0.0765f);
  }
  psm_params_free (p);
}
END_TEST

/* psm_optim_step_zero (the clip's factor, the update and the zeroing in
 * one pass) against psm_params_clip, psm_optim_step and
 * psm_params_zero_grad, for each rule, three steps of varied gradients, with
 * the clip on (max norm 1, under the norm) and off (0, and 1e6): the weights
 * and the rules' state equal to the bit, the gradients left at 0. */
static void
fused_against_passes (const PsmOptConfig *c, double max_norm)
{
  PsmParams *p[2];
  PsmOptim *o[2];
  int n = OPT_N;
  for (int v = 0; v < 2; v++) {
    p[v] = psm_params_new ();
    psm_params_add (p[v], "w", 1, &n, PSM_INIT_UNIFORM, 0.5f);
    PsmRng rng;
    psm_rng_seed (&rng, 7);
    ck_assert (psm_params_finalize (p[v], &rng, NULL));
    o[v] = psm_optim_new (c, p[v]);
  }
  PsmRng gr;
  psm_rng_seed (&gr, 3);
  for (long step = 0; step < 3; step++) {
    float *g0 = psm_params_grad (p[0]), *g1 = psm_params_grad (p[1]);
    for (int i = 0; i < OPT_N; i++)
      g0[i] = g1[i] = (float) (psm_rng_uniform (&gr) - 0.5) * (i % 7 ? 0.01f : 3.0f);
    double n0 = psm_params_clip (p[0], max_norm);
    psm_optim_step (o[0], step);
    psm_params_zero_grad (p[0]);
    double n1 = psm_params_grad_norm (p[1]);
    ck_assert (n0 == n1);
    psm_optim_step_zero (o[1], step, psm_clip_scale (n1, max_norm));
    ck_assert (memcmp (psm_params_data (p[0]), psm_params_data (p[1]), OPT_N * sizeof (float)) == 0);
    for (int s = 0; s < psm_optim_n_state (o[0]); s++)
      ck_assert (memcmp (psm_optim_state (o[0], s), psm_optim_state (o[1], s), OPT_N * sizeof (float)) == 0);
    for (int i = 0; i < OPT_N; i++)
      ck_assert (g1[i] == 0.0f);
  }
  for (int v = 0; v < 2; v++) {
    psm_optim_free (o[v]);
    psm_params_free (p[v]);
  }
}

/* One setting of each update rule, for the optimiser tests below. */
static const PsmOptConfig optim_cases[4] = {
  { .kind = PSM_OPT_SGD, .lr = 0.5 },
  { .kind = PSM_OPT_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 },
  { .kind = PSM_OPT_ADAGRAD, .lr = 0.15, .init_accum = 0.1, .eps = 1e-10 },
  { .kind = PSM_OPT_ADADELTA, .lr = 1.0, .eps = 1e-6, .rho = 0.95 },
};

START_TEST (test_optim_fused)
{
  ck_assert (psm_clip_scale (5.0, 1.0) == 0.2f && psm_clip_scale (0.5, 1.0) == 1.0f);
  ck_assert (psm_clip_scale (5.0, 0.0) == 1.0f);
  for (int k = 0; k < 4; k++) {
    fused_against_passes (&optim_cases[k], 1.0);
    fused_against_passes (&optim_cases[k], 0.0);
    fused_against_passes (&optim_cases[k], 1e6);
  }
}
END_TEST

/* psm_optim_step_part (an MPI rank's shard, train.dist_shard): the
 * parameters updated in two parts, each from its own copy of the gradient
 * times the clip's scale, hold what one whole update gives them, and
 * their state too (every rule is elementwise; the cut at a multiple of 64
 * keeps each element on the same vector lane), and the parts' gradients
 * are left as they were. */
START_TEST (test_optim_part)
{
  for (int k = 0; k < 4; k++) {
    PsmParams *p[2];
    PsmOptim *o[2];
    for (int v = 0; v < 2; v++) {
      p[v] = psm_params_new ();
      int s1[2] = { 9, 37 }, s2[1] = { 50 };
      psm_params_add (p[v], "a", 2, s1, PSM_INIT_UNIFORM, 0.5f);
      psm_params_add (p[v], "b", 1, s2, PSM_INIT_UNIFORM, 0.5f);
      PsmRng rng;
      psm_rng_seed (&rng, 3);
      ck_assert (psm_params_finalize (p[v], &rng, NULL));
      o[v] = psm_optim_new (&optim_cases[k], p[v]);
    }
    size_t n = psm_params_size (p[0]), cut = 192;
    ck_assert (n > cut + 64);
    PsmRng rng;
    psm_rng_seed (&rng, 5);
    for (long step = 0; step < 3; step++) {
      float *g0 = psm_params_grad (p[0]), *g1 = psm_params_grad (p[1]);
      for (size_t i = 0; i < n; i++)
        g0[i] = g1[i] = (i % 97 == 0) ? 0.0f : (float) (psm_rng_uniform (&rng) - 0.5);
      float *part = g_memdup2 (g1, n * sizeof (float));
      psm_optim_step_zero (o[0], step, 0.75f);
      psm_optim_step_part (o[1], step, 0.75f, cut, n, part + cut);
      psm_optim_step_part (o[1], step, 0.75f, 0, cut, part);
      for (size_t i = 0; i < n; i++)
        ck_assert_msg (psm_params_data (p[0])[i] == psm_params_data (p[1])[i], "%s step %ld: parameter %zu differs",
                       psm_optim_name (o[0]), step, i);
      for (int sl = 0; sl < psm_optim_n_state (o[0]); sl++)
        ck_assert (memcmp (psm_optim_state (o[0], sl), psm_optim_state (o[1], sl), n * sizeof (float)) == 0);
      ck_assert (memcmp (part, g1, n * sizeof (float)) == 0);   /* the parts' gradients untouched */
      g_free (part);
      psm_params_zero_grad (p[1]);
    }
    for (int v = 0; v < 2; v++) {
      psm_optim_free (o[v]);
      psm_params_free (p[v]);
    }
  }
}
END_TEST

/* A PsmGradWatch's state in test_grad_watch: each bucket's gradient as it
 * was handed over, and when. */
typedef struct {
  const float *base;
  float *snap;
  size_t next_hi, calls, polls;
  size_t at[64];   /* polls before each call: fewer than all of them, the call came before the last node ran */
} WatchLog;

static void
watch_ready (size_t lo, size_t hi, void *user)
{
  WatchLog *w = user;
  ck_assert_msg (hi == w->next_hi, "bucket [%zu, %zu) out of order (expected one ending at %zu)", lo, hi, w->next_hi);
  w->next_hi = lo;
  memcpy (w->snap + lo, w->base + lo, (hi - lo) * sizeof (float));
  if (w->calls < G_N_ELEMENTS (w->at))
    w->at[w->calls] = w->polls;
  w->calls++;
}

static void
watch_poll (void *user)
{
  ((WatchLog *) user)->polls++;
}

/* psm_graph_watch_grads (MPI's bucketed reduction, train.dist_overlap):
 * over a three-layer network whose parameters are registered in the order
 * of use and in the reverse order, with buckets of 16, 40 and the whole
 * buffer, every bucket is handed over once, from the last to the first,
 * and holds its final gradient when it is (nothing adds to it later), the
 * buckets of the layers the backward finishes first before the backward
 * ends, and the gradients equal an unwatched backward's. */
START_TEST (test_grad_watch)
{
  for (int order = 0; order < 2; order++)
    for (int bi = 0; bi < 3; bi++) {
      PsmParams *p = psm_params_new ();
      int sw[3][2] = { { 6, 8 }, { 8, 8 }, { 8, 3 } }, id[3];
      for (int l = 0; l < 3; l++) {
        int k = order ? 2 - l : l;
        char name[8];
        g_snprintf (name, sizeof name, "w%d", k);
        id[k] = psm_params_add (p, name, 2, sw[k], PSM_INIT_UNIFORM, 0.5f);
      }
      PsmRng rng;
      psm_rng_seed (&rng, 7);
      ck_assert (psm_params_finalize (p, &rng, NULL));
      size_t n = psm_params_size (p), bucket = bi == 0 ? 16 : bi == 1 ? 40 : n;
      float *grad[2];
      WatchLog w = { psm_params_grad (p), g_new0 (float, n), n, 0, 0, { 0 } };
      for (int watched = 0; watched < 2; watched++) {
        PsmGraph *g = psm_graph_new ();
        PsmGradWatch gw = { psm_params_grad (p), n, bucket, watch_ready, watch_poll, &w };
        psm_graph_watch_grads (g, watched ? &gw : NULL);
        int sx[2] = { 5, 6 };
        PsmTensor *h = psm_tensor_new (g, 2, sx, FALSE);
        for (size_t i = 0; i < h->n; i++)
          h->data[i] = (float) ((int) (i % 7) - 3) * 0.25f;
        for (int l = 0; l < 3; l++) {
          h = psm_linear (g, h, psm_param (g, p, id[l]), NULL);
          if (l < 2)
            h = psm_tanh (g, h);
        }
        psm_backward (g, psm_sum (g, psm_mul (g, h, h)));
        grad[watched] = g_memdup2 (psm_params_grad (p), n * sizeof (float));
        psm_params_zero_grad (p);
        psm_graph_free (g);
      }
      size_t nb = (n + bucket - 1) / bucket;
      ck_assert_uint_eq (w.calls, nb);
      ck_assert_uint_eq (w.next_hi, 0);
      ck_assert (memcmp (grad[0], grad[1], n * sizeof (float)) == 0);
      ck_assert_msg (memcmp (w.snap, grad[1], n * sizeof (float)) == 0,
                     "a bucket was added to after it was handed over (order %d, bucket %zu)", order, bucket);
      size_t early = 0;   /* handed over while nodes were still to run */
      for (size_t c = 0; c < MIN (w.calls, G_N_ELEMENTS (w.at)); c++)
        early += w.at[c] < w.polls;
      if (order == 0 && nb > 1)   /* the last layer's buckets go before the backward ends */
        ck_assert_msg (early > 0 && early < nb, "%zu of %zu buckets handed over early", early, nb);
      else if (nb == 1 || order == 1)   /* the first bucket is the last layer's or holds everything: at the end */
        ck_assert_uint_eq (early, 0);
      g_free (grad[0]);
      g_free (grad[1]);
      g_free (w.snap);
      psm_params_free (p);
    }
}
END_TEST

/* SGD and Adagrad skip the blocks of parameters whose gradient is all +0
 * (psm-optim.c): over two steps with most gradients zero (whole blocks,
 * lone nonzero entries and -0 among zeros), the parameters and the
 * accumulators of zero-gradient entries stay as they were, to the bit, and
 * the others follow the rule (against double arithmetic). */
START_TEST (test_optim_zero_blocks)
{
  PsmOptConfig cs[2] = {
    { .kind = PSM_OPT_SGD, .lr = 0.5 },
    { .kind = PSM_OPT_ADAGRAD, .lr = 0.15, .init_accum = 0.1, .eps = 1e-10 },
  };
  for (int k = 0; k < 2; k++) {
    PsmParams *p = psm_params_new ();
    int n = OPT_N;
    psm_params_add (p, "w", 1, &n, PSM_INIT_UNIFORM, 0.5f);
    PsmRng rng;
    psm_rng_seed (&rng, 11);
    ck_assert (psm_params_finalize (p, &rng, NULL));
    PsmOptim *o = psm_optim_new (&cs[k], p);
    float *w = psm_params_data (p), *g = psm_params_grad (p);
    double *acc = g_new (double, OPT_N);
    for (int i = 0; i < OPT_N; i++)
      acc[i] = 0.1;
    for (long step = 0; step < 2; step++) {
      float *before = g_memdup2 (w, OPT_N * sizeof (float)), *gs = g_new (float, OPT_N);
      for (int i = 0; i < OPT_N; i++) {
        int blk = i / 64;
        g[i] = blk % 5 == 1 ? (float) (psm_rng_uniform (&rng) - 0.5)   /* a whole block */
             : blk % 5 == 3 && i % 64 == 17 + (int) step ? 0.75f       /* one entry of a block */
             : blk % 5 == 4 && i % 64 == 5 ? -0.0f : 0.0f;
        gs[i] = g[i];
      }
      psm_optim_step_zero (o, step, 1.0f);
      for (int i = 0; i < OPT_N; i++) {
        ck_assert (g[i] == 0.0f);
        double want = before[i];
        if (k == 0)
          want -= 0.5 * gs[i];
        else {
          acc[i] += (double) gs[i] * gs[i];
          want -= 0.15 * gs[i] / (sqrt (acc[i]) + 1e-10);
        }
        if (gs[i] == 0.0f)
          ck_assert_msg (w[i] == before[i], "%s step %ld: w[%d] moved from %g to %g on a zero gradient",
                         k ? "adagrad" : "sgd", step, i, before[i], w[i]);
        else
          ck_assert_msg (fabs (w[i] - want) <= 1e-6 * (1 + fabs (want)), "%s step %ld: w[%d] = %g, want %g",
                         k ? "adagrad" : "sgd", step, i, w[i], want);
      }
      if (k == 1)
        for (int i = 0; i < OPT_N; i++)
          ck_assert (fabs (psm_optim_state (o, 0)[i] - acc[i]) <= 1e-6 * acc[i]);
      g_free (before);
      g_free (gs);
    }
    g_free (acc);
    psm_optim_free (o);
    psm_params_free (p);
  }
}
END_TEST

START_TEST (test_optimisers)
{
  double w1, w2;
  PsmOptConfig sgd = { .kind = PSM_OPT_SGD, .lr = 0.1 };
  two_steps (&sgd, &w1, &w2);
  ck_assert (fabs (w1 - 0.95) < 1e-6 && fabs (w2 - 0.975) < 1e-6);

  PsmOptConfig adam = { .kind = PSM_OPT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 };
  two_steps (&adam, &w1, &w2);
  /* step 1: m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25 -> w -= 0.1 * 0.5 / 0.5 */
  ck_assert_msg (fabs (w1 - 0.9) < 1e-5, "adam w1 %g", w1);
  /* step 2: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225;
   * m^ = 0.02 / 0.19, v^ = 0.00031225 / 0.001999 */
  double mh = 0.02 / 0.19, vh = 0.00031225 / (1 - 0.999 * 0.999);
  ck_assert_msg (fabs (w2 - (0.9 - 0.1 * mh / (sqrt (vh) + 1e-8))) < 1e-5, "adam w2 %g", w2);

  PsmOptConfig ada = { .kind = PSM_OPT_ADAGRAD, .lr = 0.15, .init_accum = 0.1 };
  two_steps (&ada, &w1, &w2);
  /* a = 0.1 + 0.25 = 0.35; w = 1 - 0.15 * 0.5 / sqrt(0.35) */
  ck_assert (fabs (w1 - (1 - 0.15 * 0.5 / sqrt (0.35))) < 1e-6);
  ck_assert (fabs (w2 - (w1 + 0.15 * 0.25 / sqrt (0.4125))) < 1e-6);

  PsmOptConfig add = { .kind = PSM_OPT_ADADELTA, .lr = 1.0, .eps = 1e-6, .rho = 0.95 };
  two_steps (&add, &w1, &w2);
  double a1 = 0.05 * 0.25, d1 = sqrt (1e-6) / sqrt (a1 + 1e-6) * 0.5, u1 = 0.05 * d1 * d1;
  ck_assert (fabs (w1 - (1 - d1)) < 1e-6);
  double a2 = 0.95 * a1 + 0.05 * 0.0625, d2 = sqrt (u1 + 1e-6) / sqrt (a2 + 1e-6) * -0.25;
  ck_assert (fabs (w2 - (w1 - d2)) < 1e-6);

  /* Zeng et al.'s schedule: lr halves every 10 steps from step 50 */
  PsmOptConfig sch = { .kind = PSM_OPT_SGD, .lr = 2.0 };
  sch.halve_start = 50;
  sch.halve_every = 10;
  PsmParams *p = psm_params_new ();
  int one = 1;
  psm_params_add (p, "w", 1, &one, PSM_INIT_ZEROS, 0);
  PsmRng rng;
  psm_rng_seed (&rng, 1);
  ck_assert (psm_params_finalize (p, &rng, NULL));
  PsmOptim *o = psm_optim_new (&sch, p);
  ck_assert (psm_optim_lr (o, 49) == 2.0 && psm_optim_lr (o, 50) == 1.0);
  ck_assert (psm_optim_lr (o, 59) == 1.0 && psm_optim_lr (o, 60) == 0.5 && psm_optim_lr (o, 75) == 0.25);
  psm_optim_free (o);
  psm_params_free (p);
}
END_TEST

static PsmParams *
model (int rows, const char *name, guint64 seed)
{
  PsmParams *p = psm_params_new ();
  int s[2] = { rows, 7 };
  psm_params_add (p, name, 2, s, PSM_INIT_NORMAL, 1.0f);
  psm_params_add (p, "b", 1, &s[1], PSM_INIT_NORMAL, 1.0f);
  PsmRng rng;
  psm_rng_seed (&rng, seed);
  ck_assert (psm_params_finalize (p, &rng, NULL));
  return p;
}

START_TEST (test_checkpoint)
{
  char *dir = g_dir_make_tmp ("psm-test-ckpt-XXXXXX", NULL);
  char *path = g_build_filename (dir, "a.ckpt", NULL);
  PsmParams *p = model (5, "w", 1);
  PsmOptConfig oc = { .kind = PSM_OPT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 };
  PsmOptim *o = psm_optim_new (&oc, p);
  psm_params_grad (p)[3] = 1.0f;
  psm_optim_step (o, 0);
  PsmCheckpointMeta meta = { 123, { { 1, 2, 3, 4 } }, 17.5, 0.25, 18.5, 3, g_bytes_new ("stream state", 12) };
  GError *e = NULL;
  ck_assert_msg (psm_checkpoint_save (path, p, o, TRUE, &meta, &e), "%s", e ? e->message : "");
  char *tmp = g_strdup_printf ("%s.tmp.%d", path, (int) getpid ());
  ck_assert (!g_file_test (tmp, G_FILE_TEST_EXISTS));
  g_free (tmp);

  /* round trip into a differently initialised model */
  PsmParams *q = model (5, "w", 2);
  PsmOptim *oq = psm_optim_new (&oc, q);
  PsmCheckpointMeta back;
  ck_assert_msg (psm_checkpoint_load (path, q, oq, &back, &e), "%s", e ? e->message : "");
  ck_assert (memcmp (psm_params_data (p), psm_params_data (q), psm_params_size (p) * 4) == 0);
  ck_assert (memcmp (psm_optim_state (o, 1), psm_optim_state (oq, 1), psm_params_size (p) * 4) == 0);
  ck_assert_int_eq (back.step, 123);
  ck_assert_uint_eq (back.rng.s[3], 4);
  ck_assert (back.best_metric == 17.5);
  ck_assert (back.lr_scale == 0.25 && back.last_metric == 18.5 && back.bad_evals == 3);
  ck_assert (back.stream && g_bytes_equal (back.stream, meta.stream));
  g_bytes_unref (back.stream);
  /* without optimiser state (best.ckpt) no stream state is written */
  char *nost = g_build_filename (dir, "nostate.ckpt", NULL);
  ck_assert (psm_checkpoint_save (nost, p, o, FALSE, &meta, &e));
  ck_assert (psm_checkpoint_load (nost, q, NULL, &back, &e) && back.stream == NULL);
  g_unlink (nost);
  g_free (nost);
  g_bytes_unref (meta.stream);

  /* a flipped byte: checksum error, and the model is untouched */
  gchar *buf;
  gsize len;
  ck_assert (g_file_get_contents (path, &buf, &len, NULL));
  char *bad = g_build_filename (dir, "bad.ckpt", NULL);
  buf[len / 2] ^= 0x40;
  ck_assert (g_file_set_contents (bad, buf, len, NULL));
  PsmParams *r = model (5, "w", 3);
  float *before = g_memdup2 (psm_params_data (r), psm_params_size (r) * 4);
  ck_assert (!psm_checkpoint_load (bad, r, NULL, NULL, &e));
  ck_assert_msg (strstr (e->message, "checksum mismatch") && strstr (e->message, bad), "%s", e->message);
  g_clear_error (&e);
  ck_assert (memcmp (before, psm_params_data (r), psm_params_size (r) * 4) == 0);
  /* truncated */
  buf[len / 2] ^= 0x40;
  ck_assert (g_file_set_contents (bad, buf, len - 40, NULL));
  ck_assert (!psm_checkpoint_load (bad, r, NULL, NULL, &e));
  ck_assert_msg (strstr (e->message, "corrupt or truncated"), "%s", e->message);
  g_clear_error (&e);
  /* not a checkpoint */
  ck_assert (g_file_set_contents (bad, "hello world, this is not a checkpoint at all....", -1, NULL));
  ck_assert (!psm_checkpoint_load (bad, r, NULL, NULL, &e));
  ck_assert_msg (strstr (e->message, "not a psm checkpoint"), "%s", e->message);
  g_clear_error (&e);
  /* another model: names or shapes differ */
  PsmParams *s1 = model (6, "w", 1), *s2 = model (5, "v", 1);
  ck_assert (!psm_checkpoint_load (path, s1, NULL, NULL, &e));
  ck_assert_msg (strstr (e->message, "parameter 'w' has another shape in the checkpoint"), "%s", e->message);
  g_clear_error (&e);
  ck_assert (!psm_checkpoint_load (path, s2, NULL, NULL, &e));
  ck_assert_msg (strstr (e->message, "is 'w' in the checkpoint but 'v' in the model"), "%s", e->message);
  g_clear_error (&e);
  /* another optimiser */
  PsmOptConfig sgd2 = { .kind = PSM_OPT_ADAGRAD, .lr = 0.1, .init_accum = 0.1 };
  PsmOptim *og = psm_optim_new (&sgd2, r);
  ck_assert (!psm_checkpoint_load (path, r, og, NULL, &e));
  ck_assert_msg (strstr (e->message, "optimiser 'adam'"), "%s", e->message);
  g_clear_error (&e);

  /* a failed write leaves the old file intact */
  char *ro = g_build_filename (dir, "ro", NULL);
  g_mkdir (ro, 0555);
  char *target = g_build_filename (ro, "x.ckpt", NULL);
  if (access (ro, W_OK) != 0) {   /* (root can write anywhere; skip there) */
    ck_assert (!psm_checkpoint_save (target, p, o, TRUE, &meta, &e));
    ck_assert_msg (strstr (e->message, "cannot write checkpoint"), "%s", e->message);
    g_clear_error (&e);
  }
  g_free (buf);
  ck_assert (g_file_get_contents (path, &buf, &len, NULL));
  ck_assert (psm_checkpoint_load (path, q, NULL, NULL, &e));
  g_free (buf);

  psm_optim_free (o);
  psm_optim_free (oq);
  psm_optim_free (og);
  psm_params_free (p);
  psm_params_free (q);
  psm_params_free (r);
  psm_params_free (s1);
  psm_params_free (s2);
  g_free (before);
  g_unlink (bad);
  g_unlink (path);
  g_rmdir (ro);
  g_rmdir (dir);   /* the test's files gone: nothing left in /tmp */
  g_free (bad);
  g_free (ro);
  g_free (target);
  g_free (path);
  g_free (dir);
}
END_TEST

/* A model of every kind of initialisation. */
static PsmParams *
mixed_model (void)
{
  PsmParams *p = psm_params_new ();
  int s1[2] = { 6, 18 }, s2[1] = { 7 };
  psm_params_add (p, "o", 2, s1, PSM_INIT_ORTHOGONAL, 0);
  psm_params_add (p, "x", 2, s1, PSM_INIT_XAVIER, 0);
  psm_params_add (p, "n", 1, s2, PSM_INIT_NORMAL, 0.5f);
  psm_params_add (p, "u", 1, s2, PSM_INIT_UNIFORM, 0.3f);
  psm_params_add (p, "c", 1, s2, PSM_INIT_CONST, -2.0f);
  psm_params_add (p, "z", 1, s2, PSM_INIT_ZEROS, 0);
  return p;
}

/* psm_params_finalize_deferred (psm_model_new): the values finalize would
 * have drawn from the same rng, drawn when psm_params_data or psm_param
 * first reads them; values set first (a checkpoint's) are kept, and a
 * checkpoint that fails to load leaves them still to be drawn. */
START_TEST (test_params_deferred)
{
  PsmParams *now = mixed_model (), *later = mixed_model (), *read = mixed_model (), *set = mixed_model ();
  size_t n = 0;
  PsmRng rng;
  psm_rng_seed (&rng, 7);
  ck_assert (psm_params_finalize (now, &rng, NULL));
  n = psm_params_size (now);
  psm_rng_seed (&rng, 7);
  ck_assert (psm_params_finalize_deferred (later, &rng, NULL));
  ck_assert (psm_params_finalize_deferred (read, &rng, NULL));
  ck_assert (psm_params_finalize_deferred (set, &rng, NULL));
  psm_rng_seed (&rng, 99);   /* the caller's rng moves on: a copy was kept */
  ck_assert (psm_params_deferred (later) && psm_params_deferred (read) && psm_params_deferred (set));
  ck_assert (memcmp (psm_params_data (later), psm_params_data (now), n * 4) == 0);
  ck_assert (!psm_params_deferred (later));
  /* through psm_param, as a graph reads them */
  PsmGraph *g = psm_graph_new ();
  for (int id = 0; id < psm_params_count (now); id++) {
    PsmTensor *t = psm_param (g, read, id);
    ck_assert_msg (memcmp (t->data, psm_params_data (now) + psm_params_offset (now, id),
                           psm_params_numel (now, id) * 4) == 0, "parameter %d", id);
  }
  psm_graph_free (g);
  /* set before any read: kept, nothing drawn over them later */
  float *src = g_new (float, n);
  for (size_t i = 0; i < n; i++)
    src[i] = (float) i * 0.25f;
  psm_params_set_data (set, src);
  ck_assert (!psm_params_deferred (set));
  g = psm_graph_new ();
  ck_assert (psm_param (g, set, 1)->data == psm_params_data (set) + psm_params_offset (set, 1));
  psm_graph_free (g);
  ck_assert (memcmp (psm_params_data (set), src, n * 4) == 0);

  /* a checkpoint into a deferred model; a corrupt one leaves it deferred */
  char *dir = g_dir_make_tmp ("psm-test-deferred-XXXXXX", NULL);
  char *path = g_build_filename (dir, "a.ckpt", NULL), *bad = g_build_filename (dir, "bad.ckpt", NULL);
  PsmCheckpointMeta meta = { 5, { { 1, 2, 3, 4 } }, 1.0, 1.0, NAN, 0, NULL };
  GError *e = NULL;
  ck_assert_msg (psm_checkpoint_save (path, set, NULL, FALSE, &meta, &e), "%s", e ? e->message : "");
  gchar *buf;
  gsize len;
  ck_assert (g_file_get_contents (path, &buf, &len, NULL));
  buf[len / 2] ^= 0x01;
  ck_assert (g_file_set_contents (bad, buf, len, NULL));
  PsmParams *ck = mixed_model ();
  psm_rng_seed (&rng, 7);
  ck_assert (psm_params_finalize_deferred (ck, &rng, NULL));
  ck_assert (!psm_checkpoint_load (bad, ck, NULL, NULL, &e));
  g_clear_error (&e);
  ck_assert (psm_params_deferred (ck));
  ck_assert_msg (psm_checkpoint_load (path, ck, NULL, NULL, &e), "%s", e ? e->message : "");
  ck_assert (!psm_params_deferred (ck));
  ck_assert (memcmp (psm_params_data (ck), src, n * 4) == 0);
  g_unlink (path);
  g_unlink (bad);
  g_rmdir (dir);
  g_free (buf);
  g_free (path);
  g_free (bad);
  g_free (dir);
  g_free (src);
  psm_params_free (ck);
  psm_params_free (now);
  psm_params_free (later);
  psm_params_free (read);
  psm_params_free (set);
}
END_TEST

/* Writes buf with bytes [at, at + n) replaced and a fresh checksum: a file
 * that passes the SHA-256 but holds values psm never writes. */
static void
write_patched (const char *path, const char *buf, gsize len, gsize at, const void *bytes, gsize n)
{
  char *c = g_memdup2 (buf, len);
  memcpy (c + at, bytes, n);
  GChecksum *sum = g_checksum_new (G_CHECKSUM_SHA256);
  g_checksum_update (sum, (const guchar *) c, len - 32);
  gsize dl = 32;
  g_checksum_get_digest (sum, (guint8 *) c + len - 32, &dl);
  g_checksum_free (sum);
  ck_assert (g_file_set_contents (path, c, len, NULL));
  g_free (c);
}

static void
expect_refused (const char *path, PsmParams *p, PsmOptim *o, const char *needle)
{
  GError *e = NULL;
  float *before = g_memdup2 (psm_params_data (p), psm_params_size (p) * 4);
  ck_assert_msg (!psm_checkpoint_load (path, p, o, NULL, &e), "accepted (wanted: %s)", needle);
  ck_assert_msg (strstr (e->message, needle) && strstr (e->message, path), "wanted \"%s\" in: %s", needle,
                 e->message);
  ck_assert (memcmp (before, psm_params_data (p), psm_params_size (p) * 4) == 0);
  g_error_free (e);
  g_free (before);
}

/* What a checkpoint must prove before it is trusted: the optimiser and its
 * settings for a resume (an SGD checkpoint carries no state), header values
 * psm can have written, a regular file of plausible size. */
START_TEST (test_checkpoint_checks)
{
  char *dir = g_dir_make_tmp ("psm-test-ckpt-XXXXXX", NULL);
  char *sgd_path = g_build_filename (dir, "sgd.ckpt", NULL), *path = g_build_filename (dir, "x.ckpt", NULL);
  PsmParams *p = model (5, "w", 1);
  PsmOptConfig sgd = { .kind = PSM_OPT_SGD, .lr = 0.5 };
  PsmOptConfig adam = { .kind = PSM_OPT_ADAM, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 };
  PsmOptim *os = psm_optim_new (&sgd, p), *oa = psm_optim_new (&adam, p);
  PsmCheckpointMeta meta = { 2, { { 1, 2, 3, 4 } }, NAN, 1.0, NAN, 0 };
  GError *e = NULL;
  ck_assert (psm_checkpoint_save (sgd_path, p, os, TRUE, &meta, &e));
  /* SGD has no state buffers, yet Adam must not resume from it */
  expect_refused (sgd_path, p, oa, "trained with optimiser 'sgd', the pipeline asks for 'adam'");
  PsmCheckpointMeta back;
  ck_assert (psm_checkpoint_load (sgd_path, p, os, &back, &e) && back.step == 2 && isnan (back.best_metric));
  /* the same optimiser with another setting it reads */
  PsmOptConfig sgd2 = sgd;
  sgd2.lr = 0.25;
  PsmOptim *os2 = psm_optim_new (&sgd2, p);
  expect_refused (sgd_path, p, os2, "trained with sgd lr = 0.5, the pipeline asks for 0.25");
  PsmOptConfig sgd3 = sgd;
  sgd3.beta1 = 0.5;   /* not read by sgd: fine */
  PsmOptim *os3 = psm_optim_new (&sgd3, p);
  ck_assert (psm_checkpoint_load (sgd_path, p, os3, NULL, &e));
  /* parameters only (best.ckpt): evaluated, never resumed */
  ck_assert (psm_checkpoint_save (path, p, oa, FALSE, &meta, &e));
  expect_refused (path, p, oa, "holds parameters only (no optimiser state)");
  ck_assert (psm_checkpoint_load (path, p, NULL, NULL, &e));

  /* weights that are not finite, or too large for a product of two to be:
   * refused at load, naming the parameter (issue 58); the model keeps its own */
  float keep[5], bads[3] = { NAN, INFINITY, 3e38f };
  memcpy (keep, psm_params_data (p), sizeof keep);
  for (int i = 0; i < 3; i++) {
    psm_params_data (p)[3] = bads[i];
    ck_assert (psm_checkpoint_save (path, p, NULL, FALSE, &meta, &e));
    memcpy (psm_params_data (p), keep, sizeof keep);
    expect_refused (path, p, NULL, "parameter 'w' [3] is");
    ck_assert (memcmp (psm_params_data (p), keep, sizeof keep) == 0);
  }

  /* header values that pass the checksum but that psm never writes */
  ck_assert (psm_checkpoint_save (path, p, oa, TRUE, &meta, &e));
  gchar *buf;
  gsize len;
  ck_assert (g_file_get_contents (path, &buf, &len, NULL));
  char *bad = g_build_filename (dir, "bad.ckpt", NULL);
  gint64 steps[2] = { -5, 1000000000000 };
  for (int i = 0; i < 2; i++) {
    write_patched (bad, buf, len, 16, &steps[i], 8);
    expect_refused (bad, p, NULL, "corrupt header: step");
  }
  guint32 zero[4] = { 0 };
  write_patched (bad, buf, len, 24, zero, 16);
  expect_refused (bad, p, NULL, "the RNG state is all zero");
  double inf = INFINITY;
  write_patched (bad, buf, len, 40, &inf, 8);
  expect_refused (bad, p, NULL, "best validation metric is infinite");
  guint32 flags = 6;
  write_patched (bad, buf, len, 12, &flags, 4);
  expect_refused (bad, p, NULL, "unknown flags");
  /* the training-stream state's length (the u64 before the SHA-256) */
  guint64 slen[2] = { (guint64) 1 << 40, 5 };
  write_patched (bad, buf, len, len - 40, &slen[0], 8);
  expect_refused (bad, p, NULL, "corrupt training-stream state");
  write_patched (bad, buf, len, len - 40, &slen[1], 8);
  expect_refused (bad, p, NULL, "truncated or oversized training-stream state");
  /* truncated to 40 bytes: said so, not "format version 0" */
  ck_assert (g_file_set_contents (bad, buf, 40, NULL));
  expect_refused (bad, p, NULL, "truncated: 40 bytes");
  /* bigger than a checkpoint of this model can be (its training-stream
   * state at most PSM_CHECKPOINT_MAX_STREAM): refused before reading; a
   * sparse file */
  ck_assert (g_file_set_contents (bad, buf, len, NULL));
  ck_assert (truncate (bad, (off_t) (len + PSM_CHECKPOINT_MAX_STREAM + 4096)) == 0);
  expect_refused (bad, p, NULL, "more than a checkpoint of this model can be");
  /* a link to /dev/zero (read forever before): not a regular file */
  g_unlink (bad);
  ck_assert (symlink ("/dev/zero", bad) == 0);
  expect_refused (bad, p, NULL, "not a regular file");
  g_unlink (bad);
  g_unlink (path);
  g_unlink (sgd_path);
  g_rmdir (dir);
  psm_optim_free (os);
  psm_optim_free (os2);
  psm_optim_free (os3);
  psm_optim_free (oa);
  psm_params_free (p);
  g_free (buf);
  g_free (bad);
  g_free (path);
  g_free (sgd_path);
  g_free (dir);
}
END_TEST

/* Vocabularies: most frequent first (ties in byte order), words already
 * held skipped, a size limit; vocab.txt written and read back; a bad file
 * refused naming file and line, the vocabulary left as it was. */
/* The examples store: the three ways a source word gets its extended id,
 * sentence numbers kept from the first non-zero one, targets with a final
 * eos behind a bos, texts, and indices outside the store refused. */
START_TEST (test_examples)
{
  PsmVocab *sv = psm_vocab_new (), *tv = psm_vocab_new ();
  const char *sw[] = { "<pad>", "<unk>", "<s>", "</s>", "a", "b", "zz", NULL };   /* Vs = 6: zz outside */
  const char *tw[] = { "<pad>", "<unk>", "<s>", "</s>", "b", "q", NULL };         /* Vt = 5: q outside */
  for (const char **w = sw; *w; w++)
    psm_vocab_add (sv, *w);
  for (const char **w = tw; *w; w++)
    psm_vocab_add (tv, *w);
  const PsmExampleWords words = { sv, tv, 6, 5, 6, 1, 2, 3 };
  for (int mode = 0; mode < 3; mode++) {
    PsmExamplesSourceExt ext = mode == 0 ? PSM_EXAMPLES_SHARED_TABLE : mode == 1 ? PSM_EXAMPLES_MAPPED
                                                                                 : PSM_EXAMPLES_OWN_IDS;
    PsmExamples *x = psm_examples_new (ext);
    ck_assert_int_eq (psm_examples_n (x), 0);
    ck_assert_int_eq (psm_examples_begin (x, "a b zz", "b q"), 0);
    psm_examples_add_source (x, 4, -1, 0);   /* a: no target id */
    psm_examples_add_source (x, 5, 4, 0);    /* b: target id 4 */
    psm_examples_add_source (x, 6, -1, 1);   /* zz, second sentence */
    psm_examples_add_target (x, 4, 1.0f, -1);
    psm_examples_add_target (x, 5, 0.0f, 2);   /* q, pointed at position 2 */
    ck_assert_int_eq (psm_examples_begin (x, NULL, NULL), 1);
    psm_examples_add_source (x, 4, -1, 0);
    ck_assert_int_eq (psm_examples_n (x), 2);
    ck_assert_int_eq (psm_examples_source_length (x, 0), 3);
    ck_assert_int_eq (psm_examples_source_length (x, 1), 1);
    ck_assert_str_eq (psm_examples_reference_text (x, 0), "b q");
    ck_assert (psm_examples_source_text (x, 1) == NULL && psm_examples_source_text (x, 2) == NULL);
    PsmBatch b;
    psm_batch_init (&b);
    int idx[2] = { 1, 0 };
    ck_assert (psm_examples_fill (x, &words, idx, 2, &b, "t", NULL));
    ck_assert_int_eq (b.B, 2);
    ck_assert_int_eq (b.T, 3);
    ck_assert_int_eq (b.Ty, 3);
    ck_assert_int_eq (b.example_id[0], 1);
    ck_assert_int_eq (PSM_AT (b.src, &b, 2, 1), 1);   /* zz: <unk> for the model */
    ck_assert_int_eq (PSM_AT (b.src_seg, &b, 2, 1), 1);
    ck_assert_int_eq (PSM_AT (b.src_seg, &b, 1, 1), 0);
    ck_assert (PSM_AT (b.src_mask, &b, 1, 0) == 0.0f && PSM_AT (b.src_mask, &b, 0, 0) == 1.0f);
    int32_t b_ext = PSM_AT (b.src_ext, &b, 1, 1), a_ext = PSM_AT (b.src_ext, &b, 0, 1);
    /* b (source id 5): its given target id 4 only where mapped; 5 is not below Vt = 5, so
     * the shared table gives it a batch id, as the own-ids store does every word */
    if (ext == PSM_EXAMPLES_MAPPED)
      ck_assert_int_eq (b_ext, 4);
    else
      ck_assert_int_ge (b_ext, 6);
    ck_assert_int_eq (a_ext, ext == PSM_EXAMPLES_SHARED_TABLE ? 4 : PSM_AT (b.src_ext, &b, 0, 0));
    ck_assert_int_eq (PSM_AT (b.dec_in, &b, 0, 1), 2);
    ck_assert_int_eq (PSM_AT (b.dec_in, &b, 1, 1), 4);
    ck_assert_int_eq (PSM_AT (b.tgt, &b, 1, 1), 1);   /* q: <unk> for the model ... */
    ck_assert_str_eq (psm_batch_oov_word (&b, PSM_AT (b.tgt_ext, &b, 1, 1)), "q");   /* ... itself outside */
    ck_assert_int_eq (PSM_AT (b.tgt_loc, &b, 1, 1), 2);
    /* the first target, added before the store kept switches: generated, no position */
    ck_assert (PSM_AT (b.tgt_switch, &b, 0, 1) == 1.0f && PSM_AT (b.tgt_loc, &b, 0, 1) == -1);
    ck_assert (PSM_AT (b.tgt_switch, &b, 1, 1) == 0.0f && PSM_AT (b.tgt_switch, &b, 2, 1) == 1.0f);
    ck_assert_int_eq (PSM_AT (b.tgt, &b, 2, 1), 3);   /* eos */
    ck_assert_int_eq (PSM_AT (b.tgt, &b, 0, 0), 3);   /* the empty target: eos alone */
    ck_assert (PSM_AT (b.tgt_mask, &b, 1, 0) == 0.0f);
    GError *e = NULL;
    idx[1] = 2;
    ck_assert (!psm_examples_fill (x, &words, idx, 2, &b, "t", &e));
    ck_assert_str_eq (e->message, "t: example 2 of a split of 2 asked for");
    g_clear_error (&e);
    ck_assert (!psm_examples_fill (NULL, &words, idx, 1, &b, "t", &e));   /* no store: an empty split */
    g_clear_error (&e);
    ck_assert (psm_examples_fill (NULL, &words, idx, 0, &b, "t", NULL) && b.B == 0);
    /* idx NULL: the store's first B examples, in order */
    ck_assert (psm_examples_fill (x, &words, NULL, 2, &b, "t", NULL));
    ck_assert (b.B == 2 && b.T == 3 && b.example_id[0] == 0 && b.example_id[1] == 1);
    ck_assert_int_eq (PSM_AT (b.src, &b, 2, 0), 1);   /* example 0's zz, now in column 0 */
    ck_assert (!psm_examples_fill (x, &words, NULL, 3, &b, "t", &e));
    ck_assert_str_eq (e->message, "t: example 2 of a split of 2 asked for");
    g_clear_error (&e);
    psm_batch_clear (&b);
    psm_examples_free (x);
  }
  psm_vocab_free (sv);
  psm_vocab_free (tv);
}
END_TEST

START_TEST (test_vocab)
{
  PsmVocab *v = psm_vocab_new ();
  ck_assert_int_eq (psm_vocab_add (v, "<unk>"), 0);
  PsmWordCounts *c = psm_word_counts_new ();
  const char *text[] = { "b", "a", "c", "b", "<unk>", "a", "d", "b", "<unk>", "<unk>", "<unk>", NULL };
  for (const char **w = text; *w; w++)
    psm_word_counts_add (c, *w, 1);
  ck_assert_int_eq (psm_word_counts_size (c), 5);
  ck_assert_int_eq (psm_word_counts_get (c, "b"), 3);
  ck_assert_int_eq (psm_word_counts_get (c, "zzz"), 0);
  ck_assert_int_eq (psm_vocab_add_by_count (v, c, 4), 3);   /* <unk> is held: b, a, then c before d */
  const char *want[] = { "<unk>", "b", "a", "c" };
  gint64 counts[] = { 0, 3, 2, 1 };
  ck_assert_int_eq (psm_vocab_size (v), 4);
  for (int i = 0; i < 4; i++) {
    ck_assert_str_eq (psm_vocab_word (v, i), want[i]);
    ck_assert_int_eq (psm_vocab_id (v, want[i]), i);
    ck_assert_int_eq (psm_vocab_count (v, i), counts[i]);
  }
  ck_assert (psm_vocab_word (v, 4) == NULL && psm_vocab_word (v, -1) == NULL && psm_vocab_id (v, "d") == -1);
  ck_assert_int_eq (psm_vocab_add (v, "zebra"), 4);   /* an unseen word: count 0 */
  ck_assert_int_eq (psm_vocab_add (v, "zebra"), 4);
  /* a raw text's words taken out again (psm_vocab_truncate): forgotten by id and by word */
  ck_assert_int_eq (psm_vocab_add (v, "okapi"), 5);
  ck_assert_int_eq (psm_vocab_add (v, "quagga"), 6);
  psm_vocab_truncate (v, 5);
  ck_assert (psm_vocab_size (v) == 5 && psm_vocab_id (v, "okapi") == -1 && psm_vocab_id (v, "quagga") == -1 &&
             psm_vocab_word (v, 5) == NULL && psm_vocab_id (v, "zebra") == 4);
  ck_assert_int_eq (psm_vocab_add (v, "quagga"), 5);
  psm_vocab_truncate (v, 5);
  psm_vocab_truncate (v, 9);   /* past the end: nothing */
  ck_assert_int_eq (psm_vocab_size (v), 5);
  /* save the first 4, read back after the special word */
  char *dir = g_dir_make_tmp ("psm-test-vocab-XXXXXX", NULL), *path = g_build_filename (dir, "vocab.txt", NULL);
  GError *e = NULL;
  ck_assert (psm_vocab_save (v, 4, path, &e));
  gchar *saved;
  ck_assert (g_file_get_contents (path, &saved, NULL, NULL));
  ck_assert_str_eq (saved, "<unk>\t0\nb\t3\na\t2\nc\t1\n");
  g_free (saved);
  static const char *const first[] = { "<unk>", NULL };
  PsmVocab *w = psm_vocab_new ();
  ck_assert_msg (psm_vocab_load (w, path, first, &e), "%s", e ? e->message : "");
  ck_assert_int_eq (psm_vocab_size (w), 4);
  ck_assert (psm_vocab_id (w, "c") == 3 && psm_vocab_count (w, 1) == 3);
  /* bad files: file and line named, w unchanged */
  static const char *const bad[][2] = {
    { "<unk>\t0\nb\t3\nb\t1\n", ":3: bad vocabulary entry 'b': a word listed twice" },
    { "<unk>\t0\nb c\t3\n", ":2: bad vocabulary entry 'b c': a space in the word" },
    { "<unk>\t0\nb\tmany\n", ":2: bad vocabulary entry 'b': the count after the tab is not a number" },
    { "<pad>\t0\n", ":1: bad vocabulary entry '<pad>': not the special word expected there" },
    { "\t5\n", ":1: bad vocabulary entry '': an empty word" },
    { "\n\n", ": an empty vocabulary" },
  };
  PsmVocab *x = psm_vocab_new ();
  psm_vocab_add (x, "kept");
  for (guint i = 0; i < G_N_ELEMENTS (bad); i++) {
    ck_assert (g_file_set_contents (path, bad[i][0], -1, NULL));
    ck_assert (!psm_vocab_load (x, path, i == 3 ? first : NULL, &e));
    ck_assert_msg (strstr (e->message, path) && strstr (e->message, bad[i][1]), "case %u: %s", i, e->message);
    g_clear_error (&e);
    ck_assert (psm_vocab_size (x) == 1 && psm_vocab_id (x, "kept") == 0 && psm_vocab_id (x, "b") == -1);
  }
  /* a word the vocabulary already holds */
  ck_assert (g_file_set_contents (path, "kept\n", -1, NULL));
  ck_assert (!psm_vocab_load (x, path, NULL, &e));
  ck_assert_msg (strstr (e->message, "a word the vocabulary already holds"), "%s", e->message);
  g_clear_error (&e);
  g_unlink (path);
  g_rmdir (dir);
  g_free (path);
  g_free (dir);
  psm_vocab_free (x);
  psm_vocab_free (w);
  psm_vocab_free (v);
  psm_word_counts_free (c);
}
END_TEST

/* psm_batch_sort_by_target: rows longest target first, ties in their
 * order, every per-row array moved with its row (each entry below is
 * 100 row + step + a field's offset, so a row that moved alone shows). */
START_TEST (test_batch_sort)
{
  enum { B = 5, T = 2, TY = 4 };
  static const int len[B] = { 2, 4, 0, 4, 1 }, want[B] = { 1, 3, 0, 4, 2 };
  PsmBatch b;
  psm_batch_init (&b);
  psm_batch_reserve (&b, B, T, TY);
  for (int j = 0; j < B; j++) {
    for (int t = 0; t < T; t++) {
      PSM_AT (b.src, &b, t, j) = 100 * j + t;
      PSM_AT (b.src_ext, &b, t, j) = 100 * j + t + 10;
      PSM_AT (b.src_mask, &b, t, j) = 100 * j + t + 20;
      PSM_AT (b.src_seg, &b, t, j) = 100 * j + t + 30;
    }
    for (int t = 0; t < TY; t++) {
      PSM_AT (b.dec_in, &b, t, j) = 100 * j + t;
      PSM_AT (b.tgt, &b, t, j) = 100 * j + t + 10;
      PSM_AT (b.tgt_ext, &b, t, j) = 100 * j + t + 20;
      PSM_AT (b.tgt_mask, &b, t, j) = t < len[j] ? 1.0f : 0.0f;
      PSM_AT (b.tgt_switch, &b, t, j) = 100 * j + t + 40;
      PSM_AT (b.tgt_loc, &b, t, j) = 100 * j + t + 50;
    }
    b.example_id[j] = 100 * j;
    b.keep[j] = 100 * j + 1;
  }
  ck_assert (psm_batch_sort_by_target (&b));
  for (int j = 0; j < B; j++) {
    int o = want[j];
    for (int t = 0; t < T; t++) {
      ck_assert_int_eq (PSM_AT (b.src, &b, t, j), 100 * o + t);
      ck_assert_int_eq (PSM_AT (b.src_ext, &b, t, j), 100 * o + t + 10);
      ck_assert (PSM_AT (b.src_mask, &b, t, j) == 100 * o + t + 20);
      ck_assert_int_eq (PSM_AT (b.src_seg, &b, t, j), 100 * o + t + 30);
    }
    for (int t = 0; t < TY; t++) {
      ck_assert_int_eq (PSM_AT (b.dec_in, &b, t, j), 100 * o + t);
      ck_assert_int_eq (PSM_AT (b.tgt, &b, t, j), 100 * o + t + 10);
      ck_assert_int_eq (PSM_AT (b.tgt_ext, &b, t, j), 100 * o + t + 20);
      ck_assert (PSM_AT (b.tgt_mask, &b, t, j) == (t < len[o] ? 1.0f : 0.0f));
      ck_assert (PSM_AT (b.tgt_switch, &b, t, j) == 100 * o + t + 40);
      ck_assert_int_eq (PSM_AT (b.tgt_loc, &b, t, j), 100 * o + t + 50);
    }
    ck_assert_int_eq (b.example_id[j], 100 * o);
    ck_assert (b.keep[j] == 100 * o + 1);
  }
  ck_assert (!psm_batch_sort_by_target (&b));   /* in order already */
  ck_assert_int_eq (b.example_id[0], 100);
  psm_batch_clear (&b);
}
END_TEST

int
main (void)
{
  Suite *s = suite_create ("core");
  TCase *tc = tcase_create ("core");
  /* the optimisers' tests update 40,000 parameters some seventy times:
   * 3-4 s in the sanitizer build (-O1, ASan and UBSan) on 2 busy cores,
   * over check's default of 4 s */
  tcase_set_timeout (tc, 60);
  tcase_add_test (tc, test_arena);
  tcase_add_test (tc, test_views_share_grad);
  tcase_add_test (tc, test_tensor_bounds);
  tcase_add_test (tc, test_rng);
  tcase_add_test (tc, test_params);
  tcase_add_test (tc, test_init_uniform);
  tcase_add_test (tc, test_optimisers);
  tcase_add_test (tc, test_optim_fused);
  tcase_add_test (tc, test_optim_zero_blocks);
  tcase_add_test (tc, test_optim_part);
  tcase_add_test (tc, test_grad_watch);
  tcase_add_test (tc, test_checkpoint);
  tcase_add_test (tc, test_checkpoint_checks);
  tcase_add_test (tc, test_params_deferred);
  tcase_add_test (tc, test_vocab);
  tcase_add_test (tc, test_examples);
  tcase_add_test (tc, test_batch_sort);
  suite_add_tcase (s, tc);
  return psm_test_run (s);
}
