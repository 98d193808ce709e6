/* core/rng.c - counter-based randomness (Philox4x32-10 from Random123).
 *
 * Every draw is a pure function of (seed, stream, a, b): stream says what
 * the draw is for (init, shuffle, ...), a and b are its coordinates (the
 * parameter index and element, the epoch and position).  Nothing depends on
 * threads, ranks, workers or call order, so any decomposition of the work
 * gives the same numbers (DESIGN.md "Randomness").
 */
#include "internal.h"

#include <Random123/philox.h>

/* Four 32-bit random words for counter (a, b) of `stream` under `seed`. */
static philox4x32_ctr_t draw(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b)
{
	philox4x32_ctr_t c = { { (uint32_t)a, (uint32_t)(a >> 32), b, stream } };
	philox4x32_key_t k = { { (uint32_t)seed, (uint32_t)(seed >> 32) } };
	return philox4x32(c, k);
}

uint32_t kiln_rng_u32(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b)
{
	return draw(seed, stream, a, b).v[0];
}

/* Uniform in [0, 1) with 24 bits, exactly representable in f32. */
float kiln_rng_uniform(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b)
{
	return (float)(kiln_rng_u32(seed, stream, a, b) >> 8) * (1.0f / 16777216.0f);
}

/* The four words of counter (a, b) as uniforms in [0, 1) with 24 bits:
 * u[0] equals kiln_rng_uniform(seed, stream, a, b), u[1..3] are the
 * counter's other words, so one counter serves a draw that needs several
 * numbers (a RandomResizedCrop try: scale, ratio, top, left). */
void kiln_rng_uniform4(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b, float u[4])
{
	philox4x32_ctr_t r = draw(seed, stream, a, b);
	for (int i = 0; i < 4; i++)
		u[i] = (float)(r.v[i] >> 8) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n) without modulo bias (Lemire's method, with
 * rejection draws taken from further counters). */
uint64_t kiln_rng_below(uint64_t seed, uint32_t stream, uint64_t a, uint64_t n)
{
	if (n <= 1)
		return 0;
	for (uint32_t retry = 0;; retry++) {
		philox4x32_ctr_t r = draw(seed, stream, a, retry);
		uint64_t x = ((uint64_t)r.v[0] << 32 | r.v[1]);
		/* 64x64 -> 128 multiply: high word is the candidate */
		unsigned __int128 m = (unsigned __int128)x * n;
		uint64_t lo = (uint64_t)m;
		if (lo >= (uint64_t)(-n) % n)
			return (uint64_t)(m >> 64);
	}
}

/* perm[0..n) = a permutation of 0..n-1 that depends only on (seed, epoch):
 * Fisher-Yates where swap i draws from counter (epoch, i). */
void kiln_rng_permutation(uint64_t seed, uint64_t epoch, int64_t *perm, int64_t n)
{
	for (int64_t i = 0; i < n; i++)
		perm[i] = i;
	for (int64_t i = n - 1; i > 0; i--) {
		uint64_t j = kiln_rng_below(seed, KILN_RNG_SHUFFLE, epoch << 40 | (uint64_t)i,
					    (uint64_t)i + 1);
		int64_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
}
