/* core/rng.c - counter-based randomness (Philox4x32-10 from Random123).
 *
 * Every draw is a pure function of (seed, stream, a, b): stream says what
 * the draw is for (init, shuffle, ...), a and b are its coordinates (the
 * parameter index and element, the epoch and position).  Nothing depends on
 * threads, ranks, workers or call order, so any decomposition of the work
 * gives the same numbers (DESIGN.md "Randomness").
 */
#include "internal.h"

#include <stdlib.h> /* malloc: kiln_rng_permutation_tail's table */

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

/* The slot of position pos in a table of cap (a power of two) [pos, value]
 * pairs, pos -1 marking a free one: where pos is, or the free slot it
 * would take (linear probing; the table is at most half full). */
static int64_t *tail_slot(int64_t (*tab)[2], size_t cap, int64_t pos)
{
	size_t h = (size_t)(((uint64_t)pos * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
	while (tab[h][0] != -1 && tab[h][0] != pos)
		h = (h + 1) & (cap - 1);
	return tab[h];
}

/* out[t] = perm[n - 1 - t] for t < k, perm kiln_rng_permutation's: its
 * first k swaps, which fix those entries for good, with the entries they
 * displaced in a table (position -> value; an absent position holds its
 * own index), so O(k) time and memory instead of O(n): the workers = auto
 * probe's few batches of a set of 10^8 samples took seconds and 800 MB
 * for the whole permutation.  -1 when the table cannot be allocated. */
int kiln_rng_permutation_tail(uint64_t seed, uint64_t epoch, int64_t n, int64_t k, int64_t *out)
{
	if (k > n)
		k = n;
	/* none (a k or n below 0 too: 2 * (size_t)k, huge, doubled cap
	 * until it wrapped to 0, forever) */
	if (k <= 0)
		return 0;
	size_t cap = 16;
	while (cap < 2 * (size_t)k)
		cap <<= 1;
	int64_t(*tab)[2] = malloc(cap * sizeof *tab);
	if (!tab)
		return -1;
	for (size_t h = 0; h < cap; h++)
		tab[h][0] = -1;
	for (int64_t t = 0; t < k; t++) {
		const int64_t i = n - 1 - t;
		const int64_t j = (int64_t)kiln_rng_below(seed, KILN_RNG_SHUFFLE,
							  epoch << 40 | (uint64_t)i, (uint64_t)i + 1);
		const int64_t *si = tail_slot(tab, cap, i);
		const int64_t vi = si[0] == i ? si[1] : i;
		int64_t *sj = tail_slot(tab, cap, j);
		out[t] = sj[0] == j ? sj[1] : j; /* perm[i] after the swap */
		sj[0] = j, sj[1] = vi;           /* perm[j]: i's entry (i is not read again) */
	}
	free(tab);
	return 0;
}

/* kiln_rng_uniform_run: out[k] = kiln_rng_uniform(seed, stream, a, b0 + k)
 * for k in [0, n), bit for bit, LANES counters at once (with AVX-512: in
 * one register; the initial weights are millions of draws that differ only
 * in b; with AVX2, in two).  Philox4x32-10 as Random123
 * computes it: 10 rounds, the key bumped before each round after the
 * first; only the first output word is used. */
enum { LANES = 16 };
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* One block of LANES uniforms: counters (c0, c1, b0 + i, c3), key
 * (key0, key1); portable C, AVX-512 or AVX2 where the CPU has it (chosen
 * at run time). */
#define UNIFORM_BLOCK_ARGS                                                                   \
	(uint32_t c0, uint32_t c1, uint32_t b0, uint32_t c3, uint32_t key0, uint32_t key1,    \
	 float *restrict out)
static void uniform_block UNIFORM_BLOCK_ARGS
{
	uint32_t x0[LANES], x1[LANES], x2[LANES], x3[LANES];
	for (int i = 0; i < LANES; i++) {
		x0[i] = c0;
		x1[i] = c1;
		x2[i] = b0 + (uint32_t)i;
		x3[i] = c3;
	}
	uint32_t k0 = key0, k1 = key1;
	for (int r = 0; r < 10; r++) {
		if (r) {
			k0 += PHILOX_W0;
			k1 += PHILOX_W1;
		}
		for (int i = 0; i < LANES; i++) {
			uint64_t p0 = (uint64_t)PHILOX_M0 * x0[i];
			uint64_t p1 = (uint64_t)PHILOX_M1 * x2[i];
			uint32_t n0 = (uint32_t)(p1 >> 32) ^ x1[i] ^ k0;
			uint32_t n2 = (uint32_t)(p0 >> 32) ^ x3[i] ^ k1;
			x1[i] = (uint32_t)p1;
			x3[i] = (uint32_t)p0;
			x0[i] = n0;
			x2[i] = n2;
		}
	}
	for (int i = 0; i < LANES; i++)
		out[i] = (float)(x0[i] >> 8) * (1.0f / 16777216.0f);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RNG_AVX512 __attribute__((target("avx512f")))

/* hi and lo words of the 16 products m * x (32 x 32 -> 64 bits): the even
 * lanes' products from one vpmuludq, the odd lanes' from another */
RNG_AVX512 static inline void mulhilo16(__m512i x, __m512i m, __m512i *hi, __m512i *lo)
{
	__m512i even = _mm512_mul_epu32(x, m);
	__m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
	*lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
	*hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

RNG_AVX512 static void uniform_block_avx512 UNIFORM_BLOCK_ARGS
{
	__m512i x0 = _mm512_set1_epi32((int)c0), x1 = _mm512_set1_epi32((int)c1);
	__m512i x2 = _mm512_add_epi32(_mm512_set1_epi32((int)b0),
				      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
							14, 15));
	__m512i x3 = _mm512_set1_epi32((int)c3);
	const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
	uint32_t k0 = key0, k1 = key1;
	for (int r = 0; r < 10; r++) {
		if (r) {
			k0 += PHILOX_W0;
			k1 += PHILOX_W1;
		}
		__m512i hi0, lo0, hi1, lo1;
		mulhilo16(x0, m0, &hi0, &lo0);
		mulhilo16(x2, m1, &hi1, &lo1);
		x0 = _mm512_xor_si512(_mm512_xor_si512(hi1, x1), _mm512_set1_epi32((int)k0));
		x2 = _mm512_xor_si512(_mm512_xor_si512(hi0, x3), _mm512_set1_epi32((int)k1));
		x1 = lo1;
		x3 = lo0;
	}
	__m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x0, 8)),
				 _mm512_set1_ps(1.0f / 16777216.0f));
	_mm512_storeu_ps(out, u);
}

#define RNG_AVX2 __attribute__((target("avx2")))

/* mulhilo16's halves in AVX2: 8 lanes a register */
RNG_AVX2 static inline void mulhilo8(__m256i x, __m256i m, __m256i *hi, __m256i *lo)
{
	__m256i even = _mm256_mul_epu32(x, m);
	__m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
	*lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
	*hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* The block in two registers of 8 lanes (AVX2 CPUs: the portable code's
 * 64-bit products are not vectorized at -O2) */
RNG_AVX2 static void uniform_block_avx2 UNIFORM_BLOCK_ARGS
{
	const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
	const __m256i c1v = _mm256_set1_epi32((int)c1), c3v = _mm256_set1_epi32((int)c3);
	__m256i x0[2], x1[2], x2[2], x3[2];
	for (int h = 0; h < 2; h++) {
		x0[h] = _mm256_set1_epi32((int)c0);
		x1[h] = c1v;
		x2[h] = _mm256_add_epi32(_mm256_set1_epi32((int)(b0 + 8u * (uint32_t)h)),
					 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
		x3[h] = c3v;
	}
	uint32_t k0 = key0, k1 = key1;
	for (int r = 0; r < 10; r++) {
		if (r) {
			k0 += PHILOX_W0;
			k1 += PHILOX_W1;
		}
		const __m256i k0v = _mm256_set1_epi32((int)k0), k1v = _mm256_set1_epi32((int)k1);
		for (int h = 0; h < 2; h++) {
			__m256i hi0, lo0, hi1, lo1;
			mulhilo8(x0[h], m0, &hi0, &lo0);
			mulhilo8(x2[h], m1, &hi1, &lo1);
			x0[h] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[h]), k0v);
			x2[h] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[h]), k1v);
			x1[h] = lo1;
			x3[h] = lo0;
		}
	}
	for (int h = 0; h < 2; h++)
		_mm256_storeu_ps(out + 8 * h,
				 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x0[h], 8)),
					       _mm256_set1_ps(1.0f / 16777216.0f)));
}
#endif

void kiln_rng_uniform_run_isa(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b0,
			      int64_t n, float *out, int vector)
{
	void (*block) UNIFORM_BLOCK_ARGS = uniform_block;
#if defined(__x86_64__) && defined(__GNUC__)
	if (vector == 1 && __builtin_cpu_supports("avx512f"))
		block = uniform_block_avx512;
	else if (vector && __builtin_cpu_supports("avx2"))
		block = uniform_block_avx2;
#endif
	int64_t k = 0;
	for (; k + LANES <= n; k += LANES)
		block((uint32_t)a, (uint32_t)(a >> 32), b0 + (uint32_t)k, stream, (uint32_t)seed,
		      (uint32_t)(seed >> 32), out + k);
	for (; k < n; k++)
		out[k] = kiln_rng_uniform(seed, stream, a, b0 + (uint32_t)k);
}

void kiln_rng_uniform_run(uint64_t seed, uint32_t stream, uint64_t a, uint32_t b0, int64_t n,
			  float *out)
{
	kiln_rng_uniform_run_isa(seed, stream, a, b0, n, out, 1);
}
