/* plugins/cpu/v16.h - what the CPU plugin's own AVX-512 kernels share: 16
 * f32 lanes, bf16 loaded widened and stored rounded, and whether this CPU
 * runs them.
 *
 * The kernels kiln writes itself where no library serves (fft16.c's
 * blocks in fftconv_planes.c, pool.c's NCHW rows, convthin.c) compute in
 * f32 and read and write bf16 tensors directly: a bf16 element widens to
 * f32 exactly (its 16 bits on top), and a result is rounded once to
 * nearest even, as plugins/common/half.h's half_f32_bf16 (a NaN quieted,
 * its sign and the top of its payload kept), so a bf16 op gives the bytes
 * of the f32 op on the widened tensors, rounded.  The 16-bit masked moves
 * need AVX-512BW and VL beside F: CPU_V16 compiles a function for them,
 * cpu_v16_ok says whether this CPU has them.  Everything here is inline;
 * each file including it keeps its own answer of cpu_v16_ok.
 */
#ifndef KILN_CPU_V16_H
#define KILN_CPU_V16_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_HAVE_V16 1
#include <immintrin.h>

#define CPU_V16 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 1 when this CPU has AVX-512F, BW and VL (asked once: a kernel asks for
 * every row) */
static inline int cpu_v16_ok(void)
{
	static int ok = -1; /* every thread computes the same value */
	int v = __atomic_load_n(&ok, __ATOMIC_RELAXED);
	if (v < 0) {
		v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		    __builtin_cpu_supports("avx512vl");
		__atomic_store_n(&ok, v, __ATOMIC_RELAXED);
	}
	return v;
}

/* the bf16 at x of lanes m widened (exact), the other lanes 0 */
CPU_V16 static inline __m512 cpu_v16_bf16_ld(const void *x, __mmask16 m)
{
	const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
	return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}

/* v rounded to bf16 (nearest even; a NaN quieted, its sign and payload's
 * top kept: half_f32_bf16) to y, lanes m */
CPU_V16 static inline void cpu_v16_bf16_st(void *y, __mmask16 m, __m512 v)
{
	const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
	const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
					   _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
	__m512i h = _mm512_srli_epi32(r, 16);
	h = _mm512_mask_mov_epi32(h, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
				  _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
	/* (narrowed in a register, then a masked 16-bit store; vpmovdw's
	 * masked memory form measured no different, beside the machine's own
	 * swings: session 23) */
	_mm256_mask_storeu_epi16(y, m, _mm512_cvtepi32_epi16(h));
}

#else
#define CPU_HAVE_V16 0
static inline int cpu_v16_ok(void) { return 0; }
#endif

#endif
