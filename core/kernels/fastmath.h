/* fastmath.h — activations over contiguous arrays, written so the compiler
 * vectorises them (#pragma omp simd; no libm calls in the loop).
 * exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then the
 * degree-6 minimax polynomial of Cephes' expf (relative error ~2e-7 on the
 * reduced range), times 2^n built in the exponent bits. Inputs are clamped
 * to [-87, 88], where the float result is finite and normal.
 *   sigmoid(x) = 1 / (1 + exp(-x))
 * tanh, log: below. */
#ifndef PSM_FASTMATH_H
#define PSM_FASTMATH_H
#include <math.h>
#include <stdint.h>

static inline float
psm_fast_expf (float x)
{
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  /* round x log2(e) to nearest: adding 1.5 * 2^23 leaves the integer in
   * the low mantissa bits (valid for |t| < 2^22) */
  float fn = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  int32_t n = (int32_t) fn;
  float r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { uint32_t i; float f; } u;
  u.i = (uint32_t) (n + 127) << 23;
  return p * u.f;
}

/* log sum_j e^{x[j]} over n >= 1 floats, in vectors: the max, then the
 * float sum of psm_fast_expf (x[j] - max); -INFINITY when every x[j] is
 * (psm_pick_log_softmax, psm_logsumexp). */
static inline float
psm_fast_logsumexpf (const float *x, int n)
{
  float m = x[0];
#pragma omp simd reduction (max:m)
  for (int j = 1; j < n; j++)
    m = m > x[j] ? m : x[j];
  if (m == -INFINITY)
    return -INFINITY;
  float z = 0.0f;
#pragma omp simd reduction (+:z)
  for (int j = 0; j < n; j++)
    z += psm_fast_expf (x[j] - m);
  return m + logf (z);
}

static inline float
psm_fast_sigmoidf (float x)
{
  return 1.0f / (1.0f + psm_fast_expf (-x));
}

/* tanh(x) = x P(x^2) / Q(x^2) for |x| <= 9 (beyond, tanh is 1 to float
 * precision), P and Q of degree 4: a minimax fit of our own in absolute
 * error (tools/fit-tanh.py refits it; 1.9e-8 in exact arithmetic, ~3e-7
 * in float). Nine multiply-adds and one division, without the exponential's
 * range reduction: the additive attention's 33 M tanh a decoder step cost
 * 35 % less than with 2 sigmoid(2x) - 1 (BENCHMARKS.md c). All coefficients
 * are positive, so Q >= 1 and nothing cancels. Float rounding takes |tanh|
 * to 1 + 1.2e-7 at most (clamping the result made GCC divide twice).
 * PSM_TANH_RATIONAL (T, x) is x P(x^2) / Q(x^2) for x already in [-9, 9],
 * of type T: float here, a vector of floats in attention.c (the same
 * arithmetic lane by lane). */
#define PSM_TANH_RATIONAL(T, x)                                                \
  ({                                                                           \
    T x_ = (x), u_ = x_ * x_;                                                  \
    T p_ = u_ * 1.3183782460e-08f + 2.0471521956e-05f;                         \
    p_ = p_ * u_ + 3.4865638677e-03f;                                          \
    p_ = p_ * u_ + 1.3373182843e-01f;                                          \
    p_ = p_ * u_ + 9.9999990642e-01f;                                          \
    T q_ = u_ * 7.7024852712e-07f + 3.2713553403e-04f;                         \
    q_ = q_ * u_ + 2.5841911581e-02f;                                          \
    q_ = q_ * u_ + 4.6706479724e-01f;                                          \
    q_ = q_ * u_ + 1.0f;                                                       \
    x_ * p_ / q_;                                                              \
  })

static inline float
psm_fast_tanhf (float x)
{
  x = x < -9.0f ? -9.0f : x;
  x = x > 9.0f ? 9.0f : x;
  return PSM_TANH_RATIONAL (float, x);
}

/* log of a positive normal float: x = 2^e m with m in [sqrt(1/2), sqrt(2)),
 * then Cephes' logf polynomial in f = m - 1 (relative error ~1e-7), and
 * e ln 2 added in two parts. Callers keep x >= FLT_MIN. */
static inline float
psm_fast_logf (float x)
{
  union { float f; uint32_t i; } u = { x };
  float e = (float) ((int32_t) ((u.i >> 23) & 0xff) - 127);
  u.i = (u.i & 0x007fffffu) | 0x3f800000u;
  float m = u.f;
  int big = m > 1.41421356f;
  m = big ? 0.5f * m : m;
  e = big ? e + 1.0f : e;
  float f = m - 1.0f, z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  return f + y + 0.693359375f * e;
}

#endif
