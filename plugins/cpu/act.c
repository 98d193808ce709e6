/* plugins/cpu/act.c - elementwise activations (KILN_OP_ACT, ACT_BWD) and
 * counter-based dropout (KILN_OP_DROPOUT, DROPOUT_BWD), as vectorised C
 * loops (CPU_CLONES / CPU_SPANS, see cpu.h).
 *
 * Activations, with alpha = f[0]:
 *   relu        y = x > 0 ? x : 0 (NaN passes)   dy * (x > 0)
 *   leaky_relu  y = x > 0 ? x : alpha*x          dy * (x > 0 ? 1 : alpha)
 *   gelu        y = x/2 * (1 + erf(x/sqrt 2))    dy * (Phi(x) + x*phi(x))
 *   gelu_tanh   y = x/2 * (1 + tanh(u))          gelu_tanh_grad below
 *   sigmoid     y = 1/(1 + exp(-x))              dy * y*(1 - y)
 *   tanh        y = tanh(x)                      dy * (1 - y*y)
 * The backward reads x (in0) for relu, leaky_relu and both gelus and y (in2) for
 * sigmoid and tanh; only the one it reads must be given (in2 may be absent,
 * n_in = 2, for the first three).
 */
#include "cpu.h"
#include "vexp.h"

#include "philox.h" /* CPU_DROP_SCALE: the dropout mask, shared with attn.c */
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- activations ------------------------------------------------------- */

/* The tanh GELU through s = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3),
 * in arithmetic `omp simd` vectorises (tanhf is a scalar libm call, and a
 * float select stops gcc's if-conversion): 1 + tanh(u) = 2s, so y = x s,
 * and 1 - tanh(u)^2 = 4 s (1 - s).  With e = e^-2|u| (never overflows),
 * s = 1/(1+e) for u >= 0 and e/(1+e) below: no cancellation where tanh(u)
 * nears -1, so y keeps its relative precision for x far below 0. */
static inline float gelu_tanh_s(float x)
{
	const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
	const float e = cpu_exp(-2.0f * fabsf(u));
	const float neg = (float)(u < 0.0f);
	return (1.0f + neg * (e - 1.0f)) / (1.0f + e);
}

/* d/dx of x/2 (1 + tanh(u)) = (1 + t)/2 + x/2 (1 - t^2) u', t = tanh(u) */
static inline float gelu_tanh_grad(float x)
{
	const float s = gelu_tanh_s(x);
	const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
	return s + 2.0f * x * s * (1.0f - s) * du;
}

CPU_CLONES static void act_span(float *restrict y, const float *restrict x, int64_t n, int kind,
				float alpha)
{
	switch (kind) {
	case KILN_ACT_RELU:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = x[i] < 0.0f ? 0.0f : x[i];
		break;
	case KILN_ACT_LEAKY_RELU:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
		break;
	case KILN_ACT_GELU:
		for (int64_t i = 0; i < n; i++)
			y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
		break;
	case KILN_ACT_GELU_TANH:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = x[i] * gelu_tanh_s(x[i]);
		break;
	case KILN_ACT_SIGMOID:
		for (int64_t i = 0; i < n; i++)
			y[i] = 1.0f / (1.0f + expf(-x[i]));
		break;
	case KILN_ACT_TANH:
		for (int64_t i = 0; i < n; i++)
			y[i] = tanhf(x[i]);
		break;
	}
}

/* y (n) = x, or += x with acc. */
CPU_CLONES static void copy_span(float *restrict y, const float *restrict x, int64_t n, int acc)
{
	if (acc) {
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] += x[i];
	} else {
		memcpy(y, x, (size_t)n * sizeof *y);
	}
}

/* dy * act'(.) with x for relu/leaky/gelu, y for sigmoid/tanh; acc adds. */
CPU_CLONES static void act_bwd_span(float *dx, const float *x, const float *y,
				    const float *dy, int64_t n, int kind, float alpha, int acc)
{
	const float k = 0.3989422804014327f; /* 1/sqrt(2 pi) */
	for (int64_t i0 = 0; i0 < n; i0 += 256) {
		/* in blocks, so one loop computes and one adds */
		float g[256];
		const int64_t m = n - i0 < 256 ? n - i0 : 256;
		const float *xi = x ? x + i0 : NULL, *yi = y ? y + i0 : NULL, *di = dy + i0;
		switch (kind) {
		case KILN_ACT_RELU:
#pragma omp simd
			for (int64_t i = 0; i < m; i++)
				g[i] = xi[i] > 0.0f ? di[i] : 0.0f;
			break;
		case KILN_ACT_LEAKY_RELU:
#pragma omp simd
			for (int64_t i = 0; i < m; i++)
				g[i] = xi[i] > 0.0f ? di[i] : alpha * di[i];
			break;
		case KILN_ACT_GELU:
			for (int64_t i = 0; i < m; i++) {
				const float v = xi[i];
				const float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
				const float pdf = k * expf(-0.5f * v * v);
				g[i] = di[i] * (cdf + v * pdf);
			}
			break;
		case KILN_ACT_GELU_TANH:
#pragma omp simd
			for (int64_t i = 0; i < m; i++)
				g[i] = di[i] * gelu_tanh_grad(xi[i]);
			break;
		case KILN_ACT_SIGMOID:
#pragma omp simd
			for (int64_t i = 0; i < m; i++)
				g[i] = di[i] * yi[i] * (1.0f - yi[i]);
			break;
		case KILN_ACT_TANH:
#pragma omp simd
			for (int64_t i = 0; i < m; i++)
				g[i] = di[i] * (1.0f - yi[i] * yi[i]);
			break;
		}
		copy_span(dx + i0, g, m, acc);
	}
}

static kiln_status cpu_act(const struct cpu_plan *p, const struct kiln_op_args *a,
			   struct cpu_err *e)
{
	const float *x = a->in[0];
	float *y = a->out[0];
	const int kind = (int)p->op.i[0];
	const float alpha = (float)p->op.f[0];
	(void)e;
	CPU_SPANS(p->n, b, en, act_span(y + b, x + b, en - b, kind, alpha));
	return KILN_OK;
}

static kiln_status cpu_act_bwd(const struct cpu_plan *p, const struct kiln_op_args *a,
			       struct cpu_err *e)
{
	const float *x = a->in[0], *dy = a->in[1];
	const float *y = p->op.n_in > 2 ? a->in[2] : NULL;
	float *dx = a->out[0];
	const int kind = (int)p->op.i[0], acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const float alpha = (float)p->op.f[0];
	(void)e;
	CPU_SPANS(p->n, b, en,
		  act_bwd_span(dx + b, x ? x + b : NULL, y ? y + b : NULL, dy + b, en - b, kind,
			       alpha, acc));
	return KILN_OK;
}

kiln_status cpu_act_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_ACT_BWD;
	if (!cpu_all_f32(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	p->n = cpu_numel(&op->out[0]);
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = bwd ? cpu_act_bwd : cpu_act;
	return KILN_OK;
}

/* ---- dropout ----------------------------------------------------------- */

/* The mask is philox.h's (KILN_OP_DROPOUT in kiln/ops.h). */
/* v over [lo, hi): k = the scale of logical element `at` (an expression of
 * v), then the statement given last (which reads k). */
#define CPU_DROP_LOOP(v, lo, hi, at, dd, ...)                                             \
	do {                                                                              \
		_Pragma("omp simd")                                                       \
		for (int64_t v = (lo); v < (hi); v++) {                                   \
			float k;                                                          \
			CPU_DROP_SCALE(k, at, dd);                                        \
			__VA_ARGS__;                                                      \
		}                                                                         \
	} while (0)

/* The mask 16 elements at a time in AVX-512 registers (the flat layouts,
 * not accumulating): the same bits as CPU_DROP_SCALE's loop, which gcc
 * vectorises only 8 lanes wide with a 64-bit product per lane and per
 * round (about 3x slower: 290 us of the bf16 CNN's 20 ms step for each of
 * dropout and its backward, on 128 x 1024 elements).  The bytes are the
 * loop's, NaN and infinities included (tests/check_device_elementwise.c). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DROP_AVX512 __attribute__((target("avx512f,avx512bw")))
#define DROP16 1

/* hi and lo words of the 16 products m * x (32 x 32 -> 64 bits) */
DROP_AVX512 static inline void drop_mulhilo16(__m512i x, __m512i m, __m512i *hi, __m512i *lo)
{
	const __m512i even = _mm512_mul_epu32(x, m);
	const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
	*lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
	*hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* CPU_DROP_SCALE of the 16 elements e .. e + 15 (e + d->off's low word
 * + 15 must not wrap): Philox4x32-10's v[0] for 16 counters in one
 * register. */
DROP_AVX512 static inline __m512 drop_scale16(uint64_t e, const struct drop *d)
{
	e += d->off;
	const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u);
	const __m512i m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
	__m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)e),
				      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
							13, 14, 15));
	__m512i c1 = _mm512_set1_epi32((int)(uint32_t)(e >> 32));
	__m512i c2 = _mm512_set1_epi32((int)d->layer), c3 = _mm512_set1_epi32((int)d->step);
	uint32_t k0 = d->k0, k1 = d->k1;
	for (int r = 0; r < 10; r++) {
		__m512i hi0, lo0, hi1, lo1;
		drop_mulhilo16(c0, m0, &hi0, &lo0);
		drop_mulhilo16(c2, m1, &hi1, &lo1);
		c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
		c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
		c1 = lo1, c3 = lo0;
		k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
	}
	const __mmask16 keep = _mm512_cmpge_epu32_mask(_mm512_srli_epi32(c0, 8),
						       _mm512_set1_epi32((int)d->thr));
	return _mm512_maskz_mov_ps(keep, _mm512_set1_ps(d->s));
}

/* y = x * k over [b, b + 16 * nb) */
DROP_AVX512 static void drop16_f32(float *y, const float *x, int64_t b, int64_t nb, const struct drop *d)
{
	for (int64_t j = 0; j < nb; j++, b += 16)
		_mm512_storeu_ps(y + b, _mm512_mul_ps(_mm512_loadu_ps(x + b), drop_scale16((uint64_t)b, d)));
}

/* The same 8 elements at a time in AVX2 registers, for the CPUs without
 * AVX-512 BW (session 18: the AVX2 machines' CNN, whose dropout and its
 * backward took ~1% of the step each through the loop).  The keep compare
 * is signed: both sides are below 2^24 + 1. */
#define DROP_AVX2 __attribute__((target("avx2")))
DROP_AVX2 static inline void drop_mulhilo8(__m256i x, __m256i m, __m256i *hi, __m256i *lo)
{
	const __m256i even = _mm256_mul_epu32(x, m);
	const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
	*lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
	*hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* CPU_DROP_SCALE of the 8 elements whose indices' low words are c0's
 * lanes and whose high word is hi: drop_scale16's rounds, 8 lanes */
DROP_AVX2 static inline __m256 drop_philox8(__m256i c0, uint32_t hi, const struct drop *d)
{
	const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u);
	const __m256i m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
	__m256i c1 = _mm256_set1_epi32((int)hi);
	__m256i c2 = _mm256_set1_epi32((int)d->layer), c3 = _mm256_set1_epi32((int)d->step);
	uint32_t k0 = d->k0, k1 = d->k1;
	for (int r = 0; r < 10; r++) {
		__m256i hi0, lo0, hi1, lo1;
		drop_mulhilo8(c0, m0, &hi0, &lo0);
		drop_mulhilo8(c2, m1, &hi1, &lo1);
		c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
		c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
		c1 = lo1, c3 = lo0;
		k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
	}
	const __m256i drop = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)d->thr), _mm256_srli_epi32(c0, 8));
	return _mm256_andnot_ps(_mm256_castsi256_ps(drop), _mm256_set1_ps(d->s));
}

/* CPU_DROP_SCALE of the 8 elements e .. e + 7 (e + d->off's low word + 7
 * must not wrap) */
DROP_AVX2 static inline __m256 drop_scale8(uint64_t e, const struct drop *d)
{
	e += d->off;
	return drop_philox8(_mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)e),
					     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
			    (uint32_t)(e >> 32), d);
}

/* y = x * k over [b, b + 8 * nb) */
DROP_AVX2 static void drop8_f32(float *y, const float *x, int64_t b, int64_t nb, const struct drop *d)
{
	for (int64_t j = 0; j < nb; j++, b += 8)
		_mm256_storeu_ps(y + b, _mm256_mul_ps(_mm256_loadu_ps(x + b), drop_scale8((uint64_t)b, d)));
}

/* drop_nhwc's rows [r0, r1) (C >= 8 channels, not accumulating) 8
 * channels at a time: their logical indices are HW apart, the lanes of
 * one drop_philox8 unless a block's indices cross a multiple of 2^32
 * (its high words differ: CPU_DROP_SCALE's loop, as for the last C % 8
 * channels).  The same bits as drop_nhwc's loop. */
DROP_AVX2 static void drop8_nhwc(float *y, const float *x, int64_t r0, int64_t r1, int64_t C,
				 int64_t HW, const struct drop *d)
{
	const struct drop dd = *d;
	const __m256i lane = _mm256_mullo_epi32(_mm256_set1_epi32((int)(uint32_t)HW),
						_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	const int64_t C8 = C / 8 * 8;
	for (int64_t r = r0; r < r1; r++) {
		const int64_t base = (r / HW) * C * HW + r % HW;
		const float *xr = x + r * C;
		float *yr = y + r * C;
		int64_t c = 0;
		for (; c < C8; c += 8) {
			const uint64_t e = (uint64_t)(base + c * HW) + dd.off;
			if ((e >> 32) != ((e + 7 * (uint64_t)HW) >> 32))
				break;
			const __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)e), lane);
			_mm256_storeu_ps(yr + c, _mm256_mul_ps(_mm256_loadu_ps(xr + c),
							       drop_philox8(c0, (uint32_t)(e >> 32), &dd)));
		}
		for (; c < C; c++) {
			float k;
			CPU_DROP_SCALE(k, base + c * HW, dd);
			yr[c] = xr[c] * k;
		}
	}
}

/* drop16_bf16's arithmetic 8 lanes wide; the 8 results' low halves packed
 * (packus: every value is below 2^16) and gathered from the two 128-bit
 * lanes */
DROP_AVX2 static void drop8_bf16(uint16_t *y, const uint16_t *x, int64_t b, int64_t nb, const struct drop *d)
{
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
	for (int64_t j = 0; j < nb; j++, b += 8) {
		const __m256i xi = _mm256_slli_epi32(
			_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + b))), 16);
		const __m256i u = _mm256_castps_si256(
			_mm256_mul_ps(_mm256_castsi256_ps(xi), drop_scale8((uint64_t)b, d)));
		const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
		__m256i r = _mm256_add_epi32(
			u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
		r = _mm256_srli_epi32(r, 16);
		/* a NaN keeps its top half: the multiply made it quiet already
		 * (x86 returns a NaN operand quieted, and NaN * 0 is NaN) */
		r = _mm256_blendv_epi8(r, _mm256_srli_epi32(u, 16), nan);
		const __m256i pk = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
		_mm_storeu_si128((__m128i *)(y + b), _mm256_castsi256_si128(pk));
	}
}

/* the same over bf16 storage: widen, multiply, round to nearest even
 * (half_f32_bf16: a NaN keeps its sign and payload's top, quiet: the f32
 * multiply quiets a signalling NaN, so no bit needs setting here) */
DROP_AVX512 static void drop16_bf16(uint16_t *y, const uint16_t *x, int64_t b, int64_t nb,
				    const struct drop *d)
{
	const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
	const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
	for (int64_t j = 0; j < nb; j++, b += 16) {
		const __m512i xi = _mm512_slli_epi32(
			_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + b))), 16);
		const __m512i u = _mm512_castps_si512(
			_mm512_mul_ps(_mm512_castsi512_ps(xi), drop_scale16((uint64_t)b, d)));
		const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
		__m512i r = _mm512_add_epi32(
			u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
		r = _mm512_srli_epi32(r, 16);
		/* a NaN keeps its top half, quiet already (drop8_bf16) */
		r = _mm512_mask_srli_epi32(r, nan, u, 16);
		_mm256_storeu_si256((__m256i *)(y + b), _mm512_cvtepi32_epi16(r));
	}
}
#endif

/* Elements [b, e) of a flat tensor (logical = physical index).  x may be y. */
CPU_CLONES static void drop_flat(float *y, const float *x, int64_t b, int64_t e,
				 const struct drop *d, int acc)
{
	const struct drop dd = *d;
	if (acc)
		CPU_DROP_LOOP(i, b, e, i, dd, y[i] += x[i] * k);
	else
		CPU_DROP_LOOP(i, b, e, i, dd, y[i] = x[i] * k);
}

/* The same over bf16 storage: f32 arithmetic, one rounding. */
CPU_CLONES static void drop_flat_bf16(uint16_t *y, const uint16_t *x, int64_t b, int64_t e,
				      const struct drop *d, int acc)
{
	const struct drop dd = *d;
	if (acc)
		CPU_DROP_LOOP(i, b, e, i, dd,
			      y[i] = cpu_bf16_round(cpu_bf16_f32(y[i]) + cpu_bf16_f32(x[i]) * k));
	else
		CPU_DROP_LOOP(i, b, e, i, dd, y[i] = cpu_bf16_round(cpu_bf16_f32(x[i]) * k));
}

/* Rows [r0, r1) of an NHWC tensor: row r = n*HW + hw holds C channels whose
 * logical indices are n*C*HW + c*HW + hw. */
CPU_CLONES static void drop_nhwc(float *y, const float *x, int64_t r0, int64_t r1, int64_t C,
				 int64_t HW, const struct drop *d, int acc)
{
	const struct drop dd = *d;
	for (int64_t r = r0; r < r1; r++) {
		const int64_t base = (r / HW) * C * HW + r % HW;
		const float *xr = x + r * C;
		float *yr = y + r * C;
		if (acc)
			CPU_DROP_LOOP(c, 0, C, base + c * HW, dd, yr[c] += xr[c] * k);
		else
			CPU_DROP_LOOP(c, 0, C, base + c * HW, dd, yr[c] = xr[c] * k);
	}
}

/* drop_nhwc's rows [r0, r1), by drop8_nhwc where the CPU has AVX2 and
 * not AVX-512 BW (as drop_span's drop8_f32) and nothing accumulates */
static void drop_rows(float *y, const float *x, int64_t r0, int64_t r1, int64_t C, int64_t HW,
		      const struct drop *d, int acc)
{
#ifdef DROP16
	if (!acc && C >= 8 && !__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2")) {
		drop8_nhwc(y, x, r0, r1, C, HW, d);
		return;
	}
#endif
	drop_nhwc(y, x, r0, r1, C, HW, d, acc);
}

/* Elements [b, e), flat f32 or bf16: the 16-element blocks from the first
 * counter (b + d->off) that is a multiple of 16 on (a block's counters
 * then share their high word) by
 * drop16_*, where the CPU has AVX-512 BW and nothing accumulates
 * (without AVX-512 BW: 8-element blocks by drop8_* where it has AVX2);
 * the ends, and everything else, by the loops above. */
static void drop_span(float *y, const float *x, int64_t b, int64_t e, const struct drop *d, int acc)
{
#ifdef DROP16
	/* (blocks aligned on the counters, b + d->off) */
	const int64_t o = (int64_t)(d->off & 15);
	const int64_t a = ((b + o + 15) & ~(int64_t)15) - o, nb = e > a ? (e - a) / 16 : 0;
	const int64_t a8 = ((b + o + 7) & ~(int64_t)7) - o, nb8 = e > a8 ? (e - a8) / 8 : 0;
	if (!acc && nb && __builtin_cpu_supports("avx512bw")) {
		drop_flat(y, x, b, a, d, 0);
		drop16_f32(y, x, a, nb, d);
		b = a + 16 * nb;
	} else if (!acc && nb8 && !__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2")) {
		drop_flat(y, x, b, a8, d, 0);
		drop8_f32(y, x, a8, nb8, d);
		b = a8 + 8 * nb8;
	}
#endif
	drop_flat(y, x, b, e, d, acc);
}

static void drop_span_bf16(uint16_t *y, const uint16_t *x, int64_t b, int64_t e,
			   const struct drop *d, int acc)
{
#ifdef DROP16
	/* (blocks aligned on the counters, b + d->off) */
	const int64_t o = (int64_t)(d->off & 15);
	const int64_t a = ((b + o + 15) & ~(int64_t)15) - o, nb = e > a ? (e - a) / 16 : 0;
	const int64_t a8 = ((b + o + 7) & ~(int64_t)7) - o, nb8 = e > a8 ? (e - a8) / 8 : 0;
	if (!acc && nb && __builtin_cpu_supports("avx512bw")) {
		drop_flat_bf16(y, x, b, a, d, 0);
		drop16_bf16(y, x, a, nb, d);
		b = a + 16 * nb;
	} else if (!acc && nb8 && !__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2")) {
		drop_flat_bf16(y, x, b, a8, d, 0);
		drop8_bf16(y, x, a8, nb8, d);
		b = a8 + 8 * nb8;
	}
#endif
	drop_flat_bf16(y, x, b, e, d, acc);
}

/* The run from index b (of `unit` indices a sample, S elements a sample)
 * that one global offset serves: to e when the rows are consecutive in
 * the global batch (rstride 1), else to the sample's end; its offset
 * (cpu_drop_off) into dd->off.  Returns the run's end. */
static int64_t drop_run(const struct drop *d, int64_t b, int64_t e, int64_t unit, int64_t S,
			struct drop *dd)
{
	const int64_t n = b / unit;
	dd->off = cpu_drop_off(d, n, S);
	return d->rstride == 1 || (n + 1) * unit > e ? e : (n + 1) * unit;
}

/* Elements [b, e) of a flat tensor of S elements per sample row, each
 * row's run with its global offset (drop_run).  bf: bf16 storage. */
static void drop_samples(void *y, const void *x, int64_t b, int64_t e, int64_t S,
			 const struct drop *d, int acc, int bf)
{
	struct drop dd = *d;
	while (b < e) {
		const int64_t end = drop_run(d, b, e, S, S, &dd);
		if (bf)
			drop_span_bf16(y, x, b, end, &dd, acc);
		else
			drop_span(y, x, b, end, &dd, acc);
		b = end;
	}
}

/* NHWC pixel rows [r0, r1) (HW per sample), each sample's with its global
 * offset (drop_run) */
static void drop_pixels(float *y, const float *x, int64_t r0, int64_t r1, int64_t C, int64_t HW,
			const struct drop *d, int acc)
{
	struct drop dd = *d;
	while (r0 < r1) {
		const int64_t end = drop_run(d, r0, r1, HW, C * HW, &dd);
		drop_rows(y, x, r0, end, C, HW, &dd, acc);
		r0 = end;
	}
}

/* Forward (x -> y) and backward (dy -> dx) are the same masked scale. */
static kiln_status cpu_dropout(const struct cpu_plan *p, const struct kiln_op_args *a,
			       struct cpu_err *e)
{
	const float *x = a->in[0];
	float *y = a->out[0];
	const double pr = p->op.f[0];
	const int acc = p->op.type == KILN_OP_DROPOUT_BWD && (p->op.flags & KILN_OPF_ACCUMULATE);
	(void)e;
	if (pr == 0.0 && p->op.out[0].dtype == KILN_F32) {
		if (x != y || acc)
			CPU_SPANS(p->n, b, en, copy_span(y + b, x + b, en - b, acc));
		return KILN_OK;
	}
	const struct drop d = cpu_drop_init((uint64_t)p->op.i[0], p->op.i[1],
					    (const int64_t *)a->in[1], pr);
	const int64_t S = p->sz[1]; /* elements per sample row */
	if (p->op.out[0].dtype == KILN_BF16) {
		CPU_SPANS(p->n, b, en,
			  drop_samples(a->out[0], a->in[0], b, en, S, &d, acc, 1));
	} else if (!p->rows) {
		CPU_SPANS(p->n, b, en, drop_samples(y, x, b, en, S, &d, acc, 0));
	} else {
		const int64_t R = p->rows, C = p->cols, HW = p->sz[0];
#pragma omp parallel if (p->n >= CPU_PAR_MIN / 4)
		{
			const int64_t t = cpu_thread_num(), T = cpu_num_threads();
			drop_pixels(y, x, R * t / T, R * (t + 1) / T, C, HW, &d, acc);
		}
	}
	return KILN_OK;
}

kiln_status cpu_dropout_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	/* f32, or bf16 in a flat (non-NHWC) layout: its own loop; other
	 * low-precision cases go through lowp.c */
	const int bf = op->in[0].dtype == KILN_BF16 && op->out[0].dtype == KILN_BF16 &&
		       !cpu_nhwc(&op->out[0]);
	if ((op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32) && !bf)
		return cpu_bad(c, op, KILN_ENOTSUP, "wants f32 (or flat bf16) data");
	const struct kiln_tensor_desc *y = &op->out[0];
	p->n = cpu_numel(y);
	/* elements per sample row: the mask's global index (philox.h) */
	p->sz[1] = y->dims[0] > 0 ? p->n / y->dims[0] : 1;
	if (cpu_nhwc(y)) {
		/* walk rows (n, h, w) of C channels, see drop_nhwc */
		p->cols = y->dims[1];
		p->sz[0] = y->dims[2] * y->dims[3];
		p->rows = y->dims[0] * p->sz[0];
	}
	p->n_in = 2;
	p->n_out = 1;
	p->kernel = cpu_dropout;
	return KILN_OK;
}
