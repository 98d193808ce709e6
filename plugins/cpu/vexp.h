/* plugins/cpu/vexp.h - e^x in plain arithmetic, so that `omp simd` loops
 * vectorise it (libm's expf stays a scalar call without -ffast-math): the
 * attention's softmax and the tanh GELU use it.
 */
#ifndef KILN_CPU_VEXP_H
#define KILN_CPU_VEXP_H

#include <stdint.h>

/* e^x for x <= 88 (the caller clamps larger x): Cephes' expf (x = n ln2 + r,
 * |r| <= ln2/2, a degree-6 polynomial for e^r: relative error about 1e-7).
 * n is read from the bits of x*log2(e) + 1.5*2^23, which rounds it to an
 * integer only while |n| < 2^22, so x is first raised to at least
 * CPU_EXP_MIN (a select that keeps NaN: NaN in, NaN out); where 2^n would
 * be subnormal (x below about -87.3) the result is 0.  (Before session 30
 * there was no floor: e^x for x in about (-1.7e7, -8.7e6) came out as
 * large garbage and for x <= -1e30 or -inf as NaN, which the tanh GELU at
 * |x| in the hundreds and a softmax over scores 1e7 apart met.) */
#define CPU_EXP_MIN -104.0f /* below ln(2^-150): e^x is 0 in f32 */
static inline float cpu_exp(float x)
{
	x = x < CPU_EXP_MIN ? CPU_EXP_MIN : x;
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
