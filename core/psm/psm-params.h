/* psm-params.h — all trainable parameters in one buffer, their gradients
 * and optimiser state in buffers of the same size at the same offsets.
 * Components register parameters by name while the model is built; the
 * buffers exist after psm_params_finalize(). */
#ifndef PSM_PARAMS_H
#define PSM_PARAMS_H
#include "psm-tensor.h"
#include "psm-rng.h"
G_BEGIN_DECLS

typedef struct PsmParams PsmParams;

typedef enum {
  PSM_INIT_ZEROS,
  PSM_INIT_CONST,      /* every entry = scale */
  PSM_INIT_UNIFORM,    /* U(-scale, scale) */
  PSM_INIT_NORMAL,     /* N(0, scale^2) */
  PSM_INIT_XAVIER,     /* U(-a, a), a = sqrt(6 / (fan_in + fan_out)), 2-D */
  PSM_INIT_ORTHOGONAL  /* each [H, H] block of a [H, kH] matrix orthogonal */
} PsmInit;

PsmParams *psm_params_new (void);
void psm_params_free (PsmParams *p);
/* Returns the parameter's id; names must be unique ("encoder.w_x"). */
int psm_params_add (PsmParams *p, const char *name, int ndim, const int *shape, PsmInit init, float scale);
/* Before finalize: every weight (a matrix, or a vector the plugin draws at
 * random) U(-range, range), every bias (a vector that starts at zero)
 * bias; vectors with a set constant keep it. Zeng et al.'s initialisation. */
void psm_params_init_uniform (PsmParams *p, float range, float bias);
/* Allocates the buffers and initialises every parameter from rng. Refuses
 * (PSM_CONFIG_ERROR) a model whose parameters, gradients and two optimiser
 * slots exceed psm_memory_limit(), or whose buffers cannot be allocated. */
gboolean psm_params_finalize (PsmParams *p, PsmRng *rng, GError **error);
/* A tensor over parameter id's data (and gradient, when g has gradients on). */
PsmTensor *psm_param (PsmGraph *g, PsmParams *p, int id);

int psm_params_count (const PsmParams *p);
size_t psm_params_size (const PsmParams *p);           /* total floats */
const char *psm_params_name (const PsmParams *p, int id);
int psm_params_find (const PsmParams *p, const char *name);   /* -1 if absent */
void psm_params_shape (const PsmParams *p, int id, int *ndim, int *shape);
size_t psm_params_offset (const PsmParams *p, int id);
size_t psm_params_numel (const PsmParams *p, int id);   /* its element count (ABI 1.9) */
float *psm_params_data (PsmParams *p);
float *psm_params_grad (PsmParams *p);
void psm_params_zero_grad (PsmParams *p);
/* Scales gradients so their global L2 norm is at most max_norm (if > 0);
 * returns the norm before clipping. */
double psm_params_clip (PsmParams *p, double max_norm);
/* ABI 1.15: the gradients' global L2 norm (psm_params_clip's return value,
 * nothing scaled), and the factor that clipping to max_norm applies for it
 * (1 when max_norm <= 0 or the norm is within it): for psm_optim_step_zero. */
double psm_params_grad_norm (PsmParams *p);
float psm_clip_scale (double norm, double max_norm);

/* --- optimisers (core/run/psm-optim.c) --- */
typedef enum { PSM_OPT_SGD, PSM_OPT_ADAM, PSM_OPT_ADAGRAD, PSM_OPT_ADADELTA } PsmOptKind;

typedef struct {
  PsmOptKind kind;
  double lr;
  double beta1, beta2, eps;    /* adam */
  double init_accum;           /* adagrad: initial accumulator value */
  double rho;                  /* adadelta decay; its eps is eps */
  /* sgd schedule (Zeng et al.): after halve_start steps, halve lr every
   * halve_every steps (0 = never). */
  long halve_start, halve_every;
} PsmOptConfig;

typedef struct PsmOptim PsmOptim;
PsmOptim *psm_optim_new (const PsmOptConfig *cfg, PsmParams *p);
void psm_optim_free (PsmOptim *o);
/* One update from the current gradients; step counts from 0. */
void psm_optim_step (PsmOptim *o, long step);
/* ABI 1.15: the same update from the gradients times scale, which it sets
 * to zero as it goes: psm_params_clip, psm_optim_step and
 * psm_params_zero_grad in one pass over the buffers, the same results to
 * the bit (scale = psm_clip_scale (psm_params_grad_norm (p), max_norm)). */
void psm_optim_step_zero (PsmOptim *o, long step, float scale);
double psm_optim_lr (const PsmOptim *o, long step);
/* ABI 1.6: a factor on every learning rate (the plateau schedule's
 * halvings, train.optimizer.plateau_factor); starts at 1. */
void psm_optim_set_lr_scale (PsmOptim *o, double scale);
const char *psm_optim_name (const PsmOptim *o);
const PsmOptConfig *psm_optim_config (const PsmOptim *o);
/* Name of an optimiser kind ("sgd", ...); NULL if out of range. */
const char *psm_optim_kind_name (PsmOptKind kind);
/* State buffers (for checkpoints): n_state slots of psm_params_size floats. */
int psm_optim_n_state (const PsmOptim *o);
float *psm_optim_state (PsmOptim *o, int slot);

G_END_DECLS
#endif
