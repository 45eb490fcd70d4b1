/* psm-rng.h — seeded random numbers (xoshiro128**-style state, 4 x u32),
 * saved in checkpoints so a resumed run continues the same stream. */
#ifndef PSM_RNG_H
#define PSM_RNG_H
#include <glib.h>
#include <stdint.h>
G_BEGIN_DECLS

typedef struct { uint32_t s[4]; } PsmRng;

void psm_rng_seed (PsmRng *rng, uint64_t seed);
uint32_t psm_rng_u32 (PsmRng *rng);
double psm_rng_uniform (PsmRng *rng);          /* [0, 1) */
double psm_rng_normal (PsmRng *rng);           /* N(0, 1) */
uint32_t psm_rng_below (PsmRng *rng, uint32_t n);   /* [0, n) */

G_END_DECLS
#endif
