/* psm-optim.c — flat-loop optimisers over the one parameter buffer.
 *   sgd:      w -= lr_t g;  lr_t = lr / 2^k, k = number of halvings so far
 *   adam:     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *             w -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt v + eps)
 *   adagrad:  a += g^2 (a starts at init_accum);  w -= lr g / (sqrt a + eps)
 *   adadelta: a = rho a + (1-rho) g^2;  d = sqrt(u + eps)/sqrt(a + eps) g;
 *             u = rho u + (1-rho) d^2;  w -= lr d */
#include "config.h"
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "run/run-internal.h"

struct PsmOptim {
  PsmOptConfig cfg;
  PsmParams *p;
  int n_state;
  float *state[2];
  double lr_scale;
};

static const char *const opt_names[] = { "sgd", "adam", "adagrad", "adadelta" };

PsmOptim *
psm_optim_new (const PsmOptConfig *cfg, PsmParams *p)
{
  PsmOptim *o = g_new0 (PsmOptim, 1);
  o->cfg = *cfg;
  o->p = p;
  o->lr_scale = 1.0;
  o->n_state = psm_optim_kind_slots (cfg->kind);
  size_t n = psm_params_size (p);
  for (int s = 0; s < o->n_state; s++)
    o->state[s] = psm_xmalloc0 (MAX (n, 1) * sizeof (float), "optimiser state");
  if (cfg->kind == PSM_OPT_ADAGRAD)
    for (size_t i = 0; i < n; i++)
      o->state[0][i] = (float) cfg->init_accum;
  return o;
}

void
psm_optim_free (PsmOptim *o)
{
  if (!o)
    return;
  for (int s = 0; s < o->n_state; s++)
    free (o->state[s]);
  g_free (o);
}

const char *psm_optim_name (const PsmOptim *o) { return opt_names[o->cfg.kind]; }
const PsmOptConfig *psm_optim_config (const PsmOptim *o) { return &o->cfg; }

int
psm_optim_kind_slots (PsmOptKind kind)
{
  return kind == PSM_OPT_SGD ? 0 : kind == PSM_OPT_ADAGRAD ? 1 : 2;
}

const char *
psm_optim_kind_name (PsmOptKind kind)
{
  return (int) kind >= 0 && kind < G_N_ELEMENTS (opt_names) ? opt_names[kind] : NULL;
}
int psm_optim_n_state (const PsmOptim *o) { return o->n_state; }
float *psm_optim_state (PsmOptim *o, int slot) { return slot < o->n_state ? o->state[slot] : NULL; }

void psm_optim_set_lr_scale (PsmOptim *o, double scale) { o->lr_scale = scale; }

double
psm_optim_lr (const PsmOptim *o, long step)
{
  const PsmOptConfig *c = &o->cfg;
  if (c->kind == PSM_OPT_SGD && c->halve_every > 0 && step >= c->halve_start)
    return o->lr_scale * c->lr * pow (0.5, (double) ((step - c->halve_start) / c->halve_every + 1));
  return o->lr_scale * c->lr;
}

/* SGD's and Adagrad's update of a parameter whose gradient is +0 changes
 * nothing (w - lr 0 = w, acc + 0 0 = acc, to the bit), so blocks of
 * OPT_BLOCK whose gradient is all +0 (the rows of an embedding no word of
 * the batch used: about nine tenths of See et al.'s 20,000 x 128) are
 * skipped after one read of their gradient, which is already zero. Adam
 * and Adadelta decay their state at every step and are not. */
#define OPT_BLOCK 64
static inline gboolean
zero_block (const float *g, size_t n)
{
  typedef uint32_t bits __attribute__ ((may_alias));
  const bits *u = (const bits *) (const void *) g;
  uint32_t any = 0;
#pragma omp simd reduction (|:any)
  for (size_t i = 0; i < n; i++)
    any |= u[i];
  return any == 0;
}

/* The update of the parameters [lo, lo + n) with their gradient g (g[0]
 * is parameter lo's) times scale (clipping's factor; 1: as it is), and,
 * with zero, g set to 0 in the same pass (one pass over the buffers
 * instead of three; the same results to the bit: g scale is the value the
 * clip's own pass stored). Elementwise: a part updated alone (an MPI
 * rank's shard) gets the values the whole update gives it. */
static inline __attribute__ ((always_inline)) void
update (PsmOptim *o, long step, float scale, const gboolean zero, size_t lo, size_t n, float *g)
{
  const PsmOptConfig *c = &o->cfg;
  float *w = psm_params_data (o->p) + lo;
  float lr = (float) psm_optim_lr (o, step);
  /* Each update is elementwise: the threads share the buffer out, and the
   * result does not depend on how. */
#define G(i) (g[i] * scale)
#define Z(i) do { if (zero) g[i] = 0.0f; } while (0)
#define PAR _Pragma ("omp parallel for simd if (n >= 32768) schedule (static)")
  switch (c->kind) {
  case PSM_OPT_SGD:
#pragma omp parallel for if (n >= 32768) schedule (static)
    for (size_t b0 = 0; b0 < n; b0 += OPT_BLOCK) {
      size_t b1 = MIN (n, b0 + OPT_BLOCK);
      if (zero_block (g + b0, b1 - b0))
        continue;
#pragma omp simd
      for (size_t i = b0; i < b1; i++) {
        w[i] -= lr * G (i);
        Z (i);
      }
    }
    break;
  case PSM_OPT_ADAM: {
    float b1 = (float) c->beta1, b2 = (float) c->beta2, eps = (float) c->eps;
    double t = (double) step + 1;
    float a = (float) (psm_optim_lr (o, step) * sqrt (1.0 - pow (c->beta2, t)) / (1.0 - pow (c->beta1, t)));
    float *m = o->state[0] + lo, *v = o->state[1] + lo;
    PAR
    for (size_t i = 0; i < n; i++) {
      float gi = G (i);
      m[i] = b1 * m[i] + (1.0f - b1) * gi;
      v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
      w[i] -= a * m[i] / (sqrtf (v[i]) + eps);
      Z (i);
    }
    break;
  }
  case PSM_OPT_ADAGRAD: {
    float *acc = o->state[0] + lo, eps = (float) c->eps;
#pragma omp parallel for if (n >= 32768) schedule (static)
    for (size_t b0 = 0; b0 < n; b0 += OPT_BLOCK) {
      size_t b1 = MIN (n, b0 + OPT_BLOCK);
      if (zero_block (g + b0, b1 - b0))
        continue;
#pragma omp simd
      for (size_t i = b0; i < b1; i++) {
        float gi = G (i);
        acc[i] += gi * gi;
        w[i] -= lr * gi / (sqrtf (acc[i]) + eps);
        Z (i);
      }
    }
    break;
  }
  case PSM_OPT_ADADELTA: {
    float rho = (float) c->rho, eps = (float) c->eps;
    float *acc = o->state[0] + lo, *upd = o->state[1] + lo;
    PAR
    for (size_t i = 0; i < n; i++) {
      float gi = G (i);
      acc[i] = rho * acc[i] + (1.0f - rho) * gi * gi;
      float d = sqrtf (upd[i] + eps) / sqrtf (acc[i] + eps) * gi;
      upd[i] = rho * upd[i] + (1.0f - rho) * d * d;
      w[i] -= lr * d;
      Z (i);
    }
    break;
  }
  }
#undef PAR
#undef G
#undef Z
}

void
psm_optim_step (PsmOptim *o, long step)
{
  update (o, step, 1.0f, FALSE, 0, psm_params_size (o->p), psm_params_grad (o->p));
}

void
psm_optim_step_zero (PsmOptim *o, long step, float scale)
{
  update (o, step, scale, TRUE, 0, psm_params_size (o->p), psm_params_grad (o->p));
}

void
psm_optim_step_part (PsmOptim *o, long step, float scale, size_t lo, size_t hi, const float *g)
{
  g_return_if_fail (lo <= hi && hi <= psm_params_size (o->p));
  update (o, step, scale, FALSE, lo, hi - lo, (float *) g);
}
