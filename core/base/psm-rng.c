/* psm-rng.c — xoshiro128** seeded by splitmix64. */
#include "config.h"
#include <math.h>
#include "psm/psm-rng.h"

static uint64_t
splitmix64 (uint64_t *x)
{
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void
psm_rng_seed (PsmRng *rng, uint64_t seed)
{
  uint64_t x = seed;
  for (int i = 0; i < 4; i += 2) {
    uint64_t v = splitmix64 (&x);
    rng->s[i] = (uint32_t) v;
    rng->s[i + 1] = (uint32_t) (v >> 32);
  }
  if (!(rng->s[0] | rng->s[1] | rng->s[2] | rng->s[3]))
    rng->s[0] = 1;
}

static inline uint32_t
rotl (uint32_t x, int k)
{
  return (x << k) | (x >> (32 - k));
}

uint32_t
psm_rng_u32 (PsmRng *r)
{
  uint32_t *s = r->s;
  uint32_t result = rotl (s[1] * 5, 7) * 9;
  uint32_t t = s[1] << 9;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl (s[3], 11);
  return result;
}

double
psm_rng_uniform (PsmRng *r)
{
  uint64_t hi = psm_rng_u32 (r) >> 5, lo = psm_rng_u32 (r) >> 6;   /* 53 bits */
  return (double) ((hi << 26) | lo) * (1.0 / 9007199254740992.0);
}

double
psm_rng_normal (PsmRng *r)
{
  double u1 = psm_rng_uniform (r), u2 = psm_rng_uniform (r);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt (-2.0 * log (u1)) * cos (2.0 * G_PI * u2);
}

uint32_t
psm_rng_below (PsmRng *r, uint32_t n)
{
  /* Lemire's multiply-shift with rejection: unbiased. */
  uint64_t m = (uint64_t) psm_rng_u32 (r) * n;
  uint32_t l = (uint32_t) m;
  if (l < n) {
    uint32_t t = -n % n;
    while (l < t) {
      m = (uint64_t) psm_rng_u32 (r) * n;
      l = (uint32_t) m;
    }
  }
  return (uint32_t) (m >> 32);
}
