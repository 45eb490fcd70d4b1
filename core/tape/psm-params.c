/* psm-params.c — one buffer for all parameters; gradients at the same offsets. */
#include "config.h"
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include <stdint.h>
#include "tape/tape-internal.h"

/* More floats than any machine holds: a saturated (overflowed) count. */
#define PARAMS_MAX ((size_t) 1 << 50)

typedef struct {
  char *name;
  int ndim;
  int shape[PSM_MAX_DIMS];
  size_t n, offset;
  PsmInit init;
  float scale;
} ParamInfo;

struct PsmParams {
  GArray *info;      /* ParamInfo */
  GHashTable *by_name;
  size_t total;
  float *data, *grad;
  void *grad_mem;    /* grad's allocation (grad aligned within it) */
  gboolean final;
  /* psm_params_finalize_deferred: data is drawn from rng when first read,
   * unless psm_params_set_data fills it first */
  gboolean pending;
  PsmRng rng;
};

PsmParams *
psm_params_new (void)
{
  PsmParams *p = g_new0 (PsmParams, 1);
  p->info = g_array_new (FALSE, TRUE, sizeof (ParamInfo));
  p->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  return p;
}

void
psm_params_free (PsmParams *p)
{
  if (!p)
    return;
  for (guint i = 0; i < p->info->len; i++)
    g_free (g_array_index (p->info, ParamInfo, i).name);
  g_array_free (p->info, TRUE);
  g_hash_table_destroy (p->by_name);
  free (p->data);
  free (p->grad_mem);
  g_free (p);
}

int
psm_params_add (PsmParams *p, const char *name, int ndim, const int *shape, PsmInit init, float scale)
{
  g_return_val_if_fail (!p->final, -1);
  g_return_val_if_fail (!g_hash_table_contains (p->by_name, name), -1);
  g_return_val_if_fail (ndim >= 1 && ndim <= PSM_MAX_DIMS, -1);
  ParamInfo pi = { 0 };
  pi.name = g_strdup (name);
  pi.ndim = ndim;
  pi.n = 1;
  for (int i = 0; i < ndim; i++) {
    pi.shape[i] = shape[i];
    /* sizes come from pipelines: saturate, and let finalize refuse them */
    if (shape[i] < 0 || __builtin_mul_overflow (pi.n, (size_t) shape[i], &pi.n) || pi.n > PARAMS_MAX)
      pi.n = PARAMS_MAX;
  }
  /* Keep every parameter 64-byte aligned (16 floats). */
  pi.offset = p->total;
  p->total = MIN (p->total + ((pi.n + 15) & ~(size_t) 15), PARAMS_MAX);
  pi.init = init;
  pi.scale = scale;
  g_array_append_val (p->info, pi);
  int id = (int) p->info->len - 1;
  g_hash_table_insert (p->by_name, g_array_index (p->info, ParamInfo, id).name, GINT_TO_POINTER (id + 1));
  return id;
}

/* Orthogonal [H, H] block by Gram-Schmidt on Gaussian columns. */
static void
orthogonal_block (float *w, int rows, int cols, int ld, int col0, PsmRng *rng)
{
  int n = MIN (rows, cols);
  double *q = g_new (double, (size_t) rows * n);
  for (int j = 0; j < n; j++) {
    double *v = q + (size_t) j * rows;
    for (int i = 0; i < rows; i++)
      v[i] = psm_rng_normal (rng);
    for (int k = 0; k < j; k++) {
      double *u = q + (size_t) k * rows, d = 0;
      for (int i = 0; i < rows; i++)
        d += u[i] * v[i];
      for (int i = 0; i < rows; i++)
        v[i] -= d * u[i];
    }
    double nrm = 0;
    for (int i = 0; i < rows; i++)
      nrm += v[i] * v[i];
    nrm = sqrt (nrm) + 1e-12;
    for (int i = 0; i < rows; i++)
      v[i] /= nrm;
  }
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++)
      w[(size_t) i * ld + col0 + j] = j < n ? (float) q[(size_t) j * rows + i] : 0.0f;
  g_free (q);
}

static double
gib (double bytes)
{
  return bytes / (1024.0 * 1024 * 1024);
}

void
psm_params_init_uniform (PsmParams *p, float range, float bias)
{
  g_return_if_fail (!p->final);
  for (guint k = 0; k < p->info->len; k++) {
    ParamInfo *pi = &g_array_index (p->info, ParamInfo, k);
    if (pi->ndim == 1 && pi->init == PSM_INIT_ZEROS) {
      pi->init = PSM_INIT_CONST;
      pi->scale = bias;
    } else if (pi->init != PSM_INIT_CONST && pi->init != PSM_INIT_ZEROS) {
      pi->init = PSM_INIT_UNIFORM;
      pi->scale = range;
    }
  }
}

/* Every parameter drawn as its init says, in order, from rng. */
static void
init_values (PsmParams *p, PsmRng *rng)
{
  memset (p->data, 0, MAX (p->total, 16) * sizeof (float));
  for (guint k = 0; k < p->info->len; k++) {
    ParamInfo *pi = &g_array_index (p->info, ParamInfo, k);
    float *w = p->data + pi->offset;
    size_t rows = pi->ndim >= 2 ? pi->n / pi->shape[pi->ndim - 1] : 1;
    int cols = pi->shape[pi->ndim - 1];
    switch (pi->init) {
    case PSM_INIT_ZEROS:
      break;
    case PSM_INIT_CONST:
      for (size_t i = 0; i < pi->n; i++)
        w[i] = pi->scale;
      break;
    case PSM_INIT_UNIFORM:
      for (size_t i = 0; i < pi->n; i++)
        w[i] = (float) ((2.0 * psm_rng_uniform (rng) - 1.0) * pi->scale);
      break;
    case PSM_INIT_NORMAL:
      for (size_t i = 0; i < pi->n; i++)
        w[i] = (float) (psm_rng_normal (rng) * pi->scale);
      break;
    case PSM_INIT_XAVIER: {
      double a = sqrt (6.0 / ((double) rows + cols));
      for (size_t i = 0; i < pi->n; i++)
        w[i] = (float) ((2.0 * psm_rng_uniform (rng) - 1.0) * a);
      break;
    }
    case PSM_INIT_ORTHOGONAL:
      for (int c0 = 0; c0 < cols; c0 += (int) rows)
        orthogonal_block (w, (int) rows, MIN ((int) rows, cols - c0), cols, c0, rng);
      break;
    }
  }
}

/* The values drawn if they are still to be (once, whichever thread asks). */
static inline void
ensure_values (PsmParams *p)
{
  static GMutex lock;
  if (G_UNLIKELY (g_atomic_int_get (&p->pending))) {
    g_mutex_lock (&lock);
    if (p->pending) {
      init_values (p, &p->rng);
      g_atomic_int_set (&p->pending, FALSE);
    }
    g_mutex_unlock (&lock);
  }
}

/* The buffers (parameters uninitialised, gradients zero), or FALSE and
 * error. */
static gboolean
allocate (PsmParams *p, GError **error)
{
  g_return_val_if_fail (!p->final, FALSE);
  /* Parameters, gradients and up to two optimiser slots of the same size. */
  size_t bytes = MAX (p->total, 16) * sizeof (float);
  guint64 limit = psm_memory_limit ();
  if (p->total >= PARAMS_MAX || (limit && 4.0 * bytes > (double) limit)) {
    guint big = 0;
    for (guint k = 1; k < p->info->len; k++)
      if (g_array_index (p->info, ParamInfo, k).n > g_array_index (p->info, ParamInfo, big).n)
        big = k;
    const ParamInfo *b = p->info->len ? &g_array_index (p->info, ParamInfo, big) : NULL;
    GString *shape = g_string_new (NULL);
    for (int i = 0; b && i < b->ndim; i++)
      g_string_append_printf (shape, "%s%d", i ? " x " : "", b->shape[i]);
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "the model is too big for this machine: %.4g parameters need %.1f GiB with their gradients "
                 "and optimiser state, and this process may use %.1f GiB (largest: %s, %s); make the "
                 "model's sizes smaller", (double) p->total, gib (4.0 * bytes), gib ((double) limit),
                 b ? b->name : "-", shape->str);
    g_string_free (shape, TRUE);
    return FALSE;
  }
  /* The gradients from calloc: a large block comes as untouched zero pages
   * from the kernel, so a run that never trains (eval, decode) does not
   * hold them in memory. */
  p->grad_mem = calloc (bytes + 64, 1);
  p->grad = p->grad_mem ? (float *) (((uintptr_t) p->grad_mem + 63) & ~(uintptr_t) 63) : NULL;
  if (!p->grad || posix_memalign ((void **) &p->data, 64, bytes)) {
    free (p->grad_mem);
    p->data = p->grad = p->grad_mem = NULL;
    g_set_error (error, PSM_CONFIG_ERROR, PSM_CONFIG_ERROR_INVALID,
                 "out of memory allocating %.4g parameters (%.1f GiB); make the model's sizes smaller",
                 (double) p->total, gib (2.0 * bytes));
    return FALSE;
  }
  p->final = TRUE;
  return TRUE;
}

gboolean
psm_params_finalize (PsmParams *p, PsmRng *rng, GError **error)
{
  if (!allocate (p, error))
    return FALSE;
  init_values (p, rng);
  return TRUE;
}

gboolean
psm_params_finalize_deferred (PsmParams *p, const PsmRng *rng, GError **error)
{
  if (!allocate (p, error))
    return FALSE;
  p->rng = *rng;
  p->pending = TRUE;
  return TRUE;
}

void
psm_params_set_data (PsmParams *p, const float *src)
{
  g_return_if_fail (p->final);
  memcpy (p->data, src, p->total * sizeof (float));
  g_atomic_int_set (&p->pending, FALSE);
}

gboolean psm_params_deferred (const PsmParams *p) { return p->pending; }

PsmTensor *
psm_param (PsmGraph *g, PsmParams *p, int id)
{
  g_return_val_if_fail (p->final && id >= 0 && id < (int) p->info->len, NULL);
  ParamInfo *pi = &g_array_index (p->info, ParamInfo, id);
  ensure_values (p);
  psm_graph_const_range (g, p->data, p->total);   /* for packed weights (tape-internal.h) */
  return psm_tensor_wrap (g, p->data + pi->offset, p->grad + pi->offset, pi->ndim, pi->shape);
}

int psm_params_count (const PsmParams *p) { return (int) p->info->len; }
size_t psm_params_size (const PsmParams *p) { return p->total; }
float *
psm_params_data (PsmParams *p)
{
  ensure_values (p);   /* (pending only after finalize) */
  return p->data;
}

float *psm_params_grad (PsmParams *p) { return p->grad; }

const char *
psm_params_name (const PsmParams *p, int id)
{
  return g_array_index (p->info, ParamInfo, id).name;
}

int
psm_params_find (const PsmParams *p, const char *name)
{
  return GPOINTER_TO_INT (g_hash_table_lookup (p->by_name, name)) - 1;
}

void
psm_params_shape (const PsmParams *p, int id, int *ndim, int *shape)
{
  const ParamInfo *pi = &g_array_index (p->info, ParamInfo, id);
  *ndim = pi->ndim;
  memcpy (shape, pi->shape, sizeof pi->shape);
}

size_t
psm_params_offset (const PsmParams *p, int id)
{
  return g_array_index (p->info, ParamInfo, id).offset;
}

size_t
psm_params_numel (const PsmParams *p, int id)
{
  return g_array_index (p->info, ParamInfo, id).n;
}

/* The gradient buffer in fixed chunks: the threads share the chunks out,
 * and a chunk's sum, then the sum over chunks in order, does not depend on
 * how (the norm is the same for any thread count). One thread summed and
 * scaled 10 M gradients in ~10 ms of See's 21 ms optimiser step. */
#define GRAD_CHUNK 16384
#define GRAD_PAR(n) ((n) >= 4 * GRAD_CHUNK)

void
psm_params_zero_grad (PsmParams *p)
{
  size_t n = p->total, nc = (n + GRAD_CHUNK - 1) / GRAD_CHUNK;
#pragma omp parallel for if (GRAD_PAR (n)) schedule (static)
  for (size_t c = 0; c < nc; c++) {
    size_t lo = c * GRAD_CHUNK;
    memset (p->grad + lo, 0, MIN (GRAD_CHUNK, n - lo) * sizeof (float));
  }
}

double
psm_params_clip (PsmParams *p, double max_norm)
{
  double norm = psm_params_grad_norm (p);
  float k = psm_clip_scale (norm, max_norm);
  if (k != 1.0f) {
    size_t n = p->total;
    float *gw = p->grad;
#pragma omp parallel for simd if (GRAD_PAR (n)) schedule (static)
    for (size_t i = 0; i < n; i++)
      gw[i] *= k;
  }
  return norm;
}

float
psm_clip_scale (double norm, double max_norm)
{
  return max_norm > 0 && norm > max_norm ? (float) (max_norm / norm) : 1.0f;
}

double
psm_sumsq (const float *g, size_t n)
{
  size_t nc = (n + GRAD_CHUNK - 1) / GRAD_CHUNK;
  double *part = psm_xmalloc (MAX (nc, 1) * sizeof (double), "the gradient norm");
#pragma omp parallel for if (GRAD_PAR (n)) schedule (static)
  for (size_t c = 0; c < nc; c++) {
    size_t lo = c * GRAD_CHUNK, hi = MIN (n, lo + GRAD_CHUNK);
    double s = 0.0;
#pragma omp simd reduction (+:s)
    for (size_t i = lo; i < hi; i++)
      s += (double) g[i] * g[i];
    part[c] = s;
  }
  double s = 0.0;
  for (size_t c = 0; c < nc; c++)
    s += part[c];
  free (part);
  return s;
}

double
psm_params_grad_norm (PsmParams *p)
{
  return sqrt (psm_sumsq (p->grad, p->total));
}

int
psm_build_matrix (const PsmBuildCtx *ctx, const char *name, int rows, int cols, PsmInit init, float scale)
{
  char *full = g_strconcat (ctx->prefix, name, NULL);
  int shape[2] = { rows, cols };
  int id = psm_params_add (ctx->params, full, 2, shape, init, scale);
  g_free (full);
  return id;
}

int
psm_build_vector (const PsmBuildCtx *ctx, const char *name, int n, PsmInit init, float scale)
{
  char *full = g_strconcat (ctx->prefix, name, NULL);
  int id = psm_params_add (ctx->params, full, 1, &n, init, scale);
  g_free (full);
  return id;
}
