/* norm_lut.h - the normalisation of a u8 pixel, one rule for every path.
 *
 * lut[u] = (u/255 - mean) / std for every byte value u, computed in f32
 * arithmetic as torchvision's ToTensor (x.float().div(255)) and Normalize
 * ((x - mean) / std on f32 tensors) compute it.  The host transforms
 * (core/transform.c), the IDX loader and the devices' NORMALIZE_U8 op
 * (transform_on = device) all build their tables here, so a sample is
 * bit-equal whichever side normalises it.  No state; any thread. */
#ifndef KILN_COMMON_NORM_LUT_H
#define KILN_COMMON_NORM_LUT_H

#include <math.h>   /* isfinite */
#include <stdint.h> /* uint8_t, int64_t */

static inline void common_norm_lut(float lut[256], float mean, float std)
{
	for (int u = 0; u < 256; u++)
		lut[u] = ((float)u / 255.0f - mean) / std;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define COMMON_NORM_AVX512 1
/* y[i] = lut[x[i]] for n pixels, 16 a step with AVX-512 (F, BW, VL: the
 * caller checks the CPU has them): the table's three f32 operations (a
 * division, a subtraction, a division: no product to contract), each
 * correctly rounded, so bit-equal to common_norm_lut's table.  The table
 * walk was ~1 cycle a pixel and AVX-512 gathers are slower still on
 * kiln's EPYC (docs/PERFORMANCE.md, session 9).  The host transform's gray
 * rows (core/transform.c) and the CPU device's NORMALIZE_U8 (session 49)
 * share it. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void
common_norm_avx512(float *y, const uint8_t *x, int64_t n, float mean, float std)
{
	const __m512 k = _mm512_set1_ps(255.0f), m = _mm512_set1_ps(mean), s = _mm512_set1_ps(std);
	for (int64_t i = 0; i < n; i += 16) {
		const __mmask16 live = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, x + i)));
		v = _mm512_div_ps(_mm512_sub_ps(_mm512_div_ps(v, k), m), s);
		_mm512_mask_storeu_ps(y + i, live, v);
	}
}
#endif

/* Do mean and std (as the config gives them, in double) normalise every
 * byte to a finite f32: mean and std finite in f32, std > 0 there, and
 * the table's ends finite?  (1e300 was inf in f32: every sample -inf or
 * NaN, and a std of 1e-50 was 0.)  The callers refuse the config when
 * not. */
static inline int common_norm_fits(double mean, double std)
{
	const float m = (float)mean, s = (float)std;
	if (!isfinite(mean) || !isfinite(std) || !isfinite(m) || !(s > 0) || !isfinite(s))
		return 0;
	const float lo = (0.0f - m) / s, hi = (1.0f - m) / s;
	return isfinite(lo) && isfinite(hi);
}

#endif
