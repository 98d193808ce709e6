/* plugins/cpu/vexp.h - e^x in plain arithmetic, so that `omp simd` loops
 * vectorise it (libm's expf stays a scalar call without -ffast-math): the
 * attention's softmax and the tanh GELU use it.
 */
#ifndef KILN_CPU_VEXP_H
#define KILN_CPU_VEXP_H

#include <stdint.h>

/* e^x for x <= 88 (the caller clamps larger x): Cephes' expf (x = n ln2 + r,
 * |r| <= ln2/2, a degree-6 polynomial for e^r: relative error about 1e-7),
 * with no float compare.  n is read from the bits of x*log2(e) + 1.5*2^23,
 * which rounds it to an integer; where 2^n would be subnormal (x below about
 * -87.3) the result is 0. */
static inline float cpu_exp(float x)
{
	const union { float f; int32_t i; } m = { x * 1.44269504089f + 12582912.0f };
	const float n = m.f - 12582912.0f;
	const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	const int32_t e = m.i - 0x4B400000 + 127; /* the biased exponent of 2^n */
	const union { int32_t i; float f; } two_n = { (e & ~(e >> 31)) << 23 }; /* 0 where e <= 0 */
	return p * two_n.f;
}

#endif /* KILN_CPU_VEXP_H */
