/* plugins/cpu/pool.c - KILN_OP_POOL and POOL_BWD through oneDNN pooling.
 *
 *   POOL:     y[N,C,OH,OW] = pool(x[N,C,H,W]);  aux = oneDNN's workspace
 *   POOL_BWD: dx[N,C,H,W] from dy[N,C,OH,OW] (and aux for max)
 *   x and y of one layout, or (ABI 2.17, f32 max 2x2/2 only) x NHWC, y NCHW
 *
 *   OH = (H + 2*pad_h - KH) / stride_h + 1  (floor, PyTorch's ceil_mode=False)
 *
 * Semantics are PyTorch's: max ignores padding (pads with -inf); average
 * divides by KH*KW when counting padding (count_include_pad; with floor
 * output sizes a window never leaves the padded input, so that is PyTorch's
 * divisor too), else by the number of window elements inside the input.
 *
 * Max pooling's backward needs to know where each maximum was: oneDNN keeps
 * that in its workspace, which is the op's aux (aux_bytes = its size).  A
 * max POOL prepared with one output (n_out = 1: no aux) runs as inference
 * and has aux_bytes 0; with n_out = 2 it runs as training.  Average pooling
 * has no aux: aux_bytes 0 and out1 / in1 are not read (may be NULL).  u8
 * max pooling (inference) runs oneDNN's int8 pooling kernel.  The
 * backward recreates the training forward descriptor as its hint, so its
 * workspace layout is the forward plan's.
 */
#include "dnn.h"
#include "v16.h" /* CPU_V16, cpu_v16_ok, cpu_v16_bf16_ld */

#include <omp.h> /* omp_get_thread_num */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h> /* getenv */
#include <string.h>

/* ---- 2x2 stride-2 max pooling of plain f32, NCHW or NHWC ----------------
 * oneDNN 2.6 pools plain NCHW with a scalar kernel (simple_nchw): on the
 * AVX2 EPYC of docs/PERFORMANCE.md ("Layout, fusion and the defaults,
 * measured") 3x its NHWC time, the largest cost of an NCHW CNN step after
 * the convolutions; its NHWC kernel (jit:avx2) zero-fills dx and scatters
 * through a 4-byte-per-output workspace.  This one case (the CNNs' pooling)
 * is two input rows in, one out, vectorised along W (NCHW) or along C
 * (NHWC).  aux (training): one byte per output, the window position 0..3
 * (row-major) of the maximum, the first in scan order, a NaN winning
 * (PyTorch's rule; oneDNN's too).  A row is one (plane, output row): a plane
 * is one (n, c) of NCHW or one n of NHWC.  sz[0] planes, sz[1..4] H, W, OH,
 * OW, sz[5] C of a pixel (1 for NCHW). */

/* the maximum m of the window whose four values are at x0[o], x0[o + s],
 * x1[o], x1[o + s], and its position k */
#define MAX2_WINDOW(x0, x1, o, s, m, k)                                       \
	float m = x0[o];                                                      \
	int k = 0;                                                            \
	{                                                                     \
		const float v1 = x0[(o) + (s)], v2 = x1[o], v3 = x1[(o) + (s)];   \
		int t = v1 > m || v1 != v1;                                   \
		m = t ? v1 : m, k = t ? 1 : k;                                \
		t = v2 > m || v2 != v2;                                       \
		m = t ? v2 : m, k = t ? 2 : k;                                \
		t = v3 > m || v3 != v3;                                       \
		m = t ? v3 : m, k = t ? 3 : k;                                \
	}

/* ---- NCHW rows in explicit vectors --------------------------------------
 * In NCHW a row holds OW outputs (14 and 7 in the Fashion-MNIST CNN): fewer
 * than a vector of AVX-512, so `omp simd` left the C == 1 loops scalar, and
 * the compares of MAX2_WINDOW became branches that random data mispredicts
 * (docs/PERFORMANCE.md, "Issue 22, session 8": 5x the NHWC time).  These
 * run a row in vectors of L = 8 or 4 windows: the even and odd columns of
 * 2L input floats are split by a shuffle, the rule of MAX2_WINDOW is applied
 * lane-wise with bit selects, and a row's last vector starts at OW - L,
 * overlapping the one before it (the same values are written twice), so a
 * row never reads or writes outside its own columns.  The three compares
 * are unrolled: as a loop (GCC 12) v[] went through the stack, and pool2's
 * NCHW forward took 1.14-1.2x the time (docs/PERFORMANCE.md, "Session 19:
 * the NHWC CNN's CPU kernels"). */
#define MAX2_VEC_TYPES(L)                                                     \
	typedef float max2_f##L __attribute__((vector_size(4 * L), aligned(4))); \
	typedef int32_t max2_i##L __attribute__((vector_size(4 * L)));        \
	typedef uint8_t max2_b##L __attribute__((vector_size(L), aligned(1)));
MAX2_VEC_TYPES(8)
MAX2_VEC_TYPES(4)
#undef MAX2_VEC_TYPES

/* The aux position of a window the folded ReLU cuts (no gradient), and
 * lane-wise: k where pos (m > 0) is set, else MAX2_CUT */
#define MAX2_CUT 4
#define MAX2_CUT_IF(k, pos) (((k) & (pos)) | (MAX2_CUT & ~(pos)))

/* lane-wise t ? a : b of float vectors a, b and a mask t of 0 / -1 lanes */
#define MAX2_SEL(VF, VI, t, a, b) ((VF)(((VI)(a) & (t)) | ((VI)(b) & ~(t))))

/* one NCHW output row of OW >= L windows: y, w (aux, or NULL) from input rows
 * r0, r1; EVEN / ODD: the shuffle masks picking columns 2j and 2j + 1 of
 * two vectors, LO / HI: those interleaving the first and the last halves of
 * two vectors (the backward's) */
#define MAX2_ROW_VEC(L, EVEN, ODD, LO, HI)                                              \
	CPU_CLONES static void max2_row##L(float *restrict y, uint8_t *restrict w,    \
					   const float *restrict r0,                    \
					   const float *restrict r1, int64_t OW, int relu) \
	{                                                                           \
		const max2_i##L even = EVEN, odd = ODD;                             \
		const max2_f##L fzero = { 0 };                                      \
		for (int64_t j0 = 0; j0 < OW; j0 += L) {                            \
			const int64_t j = j0 + L > OW ? OW - L : j0;                \
			const max2_f##L a0 = *(const max2_f##L *)(r0 + 2 * j);      \
			const max2_f##L a1 = *(const max2_f##L *)(r0 + 2 * j + L);  \
			const max2_f##L b0 = *(const max2_f##L *)(r1 + 2 * j);      \
			const max2_f##L b1 = *(const max2_f##L *)(r1 + 2 * j + L);  \
			const max2_f##L v[3] = { __builtin_shuffle(a0, a1, odd),    \
						 __builtin_shuffle(b0, b1, even),   \
						 __builtin_shuffle(b0, b1, odd) };  \
			max2_f##L m = __builtin_shuffle(a0, a1, even);              \
			max2_i##L k = { 0 };                                        \
			_Pragma("GCC unroll 3") for (int q = 0; q < 3; q++) {       \
				const max2_i##L t = (v[q] > m) | (v[q] != v[q]);    \
				m = MAX2_SEL(max2_f##L, max2_i##L, t, v[q], m);     \
				k = (t & (q + 1)) | (k & ~t);                       \
			}                                                           \
			*(max2_f##L *)(y + j) = m;                                  \
			if (w) {                                                    \
				if (relu) /* not > 0 (NaN too): MAX2_CUT */         \
					k = MAX2_CUT_IF(k, m > fzero);              \
				const max2_b##L kb = __builtin_convertvector(k, max2_b##L); \
				memcpy(w + j, &kb, L);                              \
			}                                                           \
		}                                                                   \
	}                                                                           \
                                                                                    \
	/* the backward of one NCHW row: dy's OW windows to rows d0, d1, by aux w */ \
	CPU_CLONES static void max2_bwd_row##L(float *restrict d0, float *restrict d1, \
					       const float *restrict dy,                \
					       const uint8_t *restrict w, int64_t OW)   \
	{                                                                           \
		const max2_i##L lo = LO, hi = HI;                                   \
		const max2_f##L zero = { 0 };                                       \
		for (int64_t j0 = 0; j0 < OW; j0 += L) {                            \
			const int64_t j = j0 + L > OW ? OW - L : j0;                \
			const max2_f##L g = *(const max2_f##L *)(dy + j);           \
			max2_b##L kb;                                               \
			memcpy(&kb, w + j, L);                                      \
			const max2_i##L k = __builtin_convertvector(kb, max2_i##L); \
			max2_f##L e[4];                                             \
			for (int q = 0; q < 4; q++)                                 \
				e[q] = MAX2_SEL(max2_f##L, max2_i##L, k == q, g, zero); \
			*(max2_f##L *)(d0 + 2 * j) = __builtin_shuffle(e[0], e[1], lo);     \
			*(max2_f##L *)(d0 + 2 * j + L) = __builtin_shuffle(e[0], e[1], hi); \
			*(max2_f##L *)(d1 + 2 * j) = __builtin_shuffle(e[2], e[3], lo);     \
			*(max2_f##L *)(d1 + 2 * j + L) = __builtin_shuffle(e[2], e[3], hi); \
		}                                                                   \
	}
MAX2_ROW_VEC(8, ((max2_i8){ 0, 2, 4, 6, 8, 10, 12, 14 }), ((max2_i8){ 1, 3, 5, 7, 9, 11, 13, 15 }),
	     ((max2_i8){ 0, 8, 1, 9, 2, 10, 3, 11 }), ((max2_i8){ 4, 12, 5, 13, 6, 14, 7, 15 }))
MAX2_ROW_VEC(4, ((max2_i4){ 0, 2, 4, 6 }), ((max2_i4){ 1, 3, 5, 7 }), ((max2_i4){ 0, 4, 1, 5 }),
	     ((max2_i4){ 2, 6, 3, 7 }))
#undef MAX2_ROW_VEC

/* The backward of one NHWC row of OW windows of C channels, C a multiple of
 * 8, in vectors of 8 channels: the plain stores of MAX2_SCATTER's selects
 * (`omp simd` compiled them to masked stores, vmaskmovps, which AMD's Zen
 * cores run slowly: this row took 4.5x its forward, docs/PERFORMANCE.md,
 * "Issue 22, session 8"). */
CPU_CLONES static void max2_bwd_nhwc8(float *restrict d0, float *restrict d1, const float *restrict dy,
				      const uint8_t *restrict w, int64_t OW, int64_t C)
{
	const max2_f8 zero = { 0 };
	for (int64_t j = 0; j < OW; j++)
		for (int64_t c = 0; c < C; c += 8) {
			const int64_t o = j * C + c, x = 2 * j * C + c;
			const max2_f8 g = *(const max2_f8 *)(dy + o);
			max2_b8 kb;
			memcpy(&kb, w + o, 8);
			const max2_i8 k = __builtin_convertvector(kb, max2_i8);
			*(max2_f8 *)(d0 + x) = MAX2_SEL(max2_f8, max2_i8, k == 0, g, zero);
			*(max2_f8 *)(d0 + x + C) = MAX2_SEL(max2_f8, max2_i8, k == 1, g, zero);
			*(max2_f8 *)(d1 + x) = MAX2_SEL(max2_f8, max2_i8, k == 2, g, zero);
			*(max2_f8 *)(d1 + x + C) = MAX2_SEL(max2_f8, max2_i8, k == 3, g, zero);
		}
}

/* one output row of OW windows of C channels from input rows r0, r1 */
CPU_CLONES static void max2_row(float *restrict y, uint8_t *restrict w, const float *restrict r0,
				const float *restrict r1, int64_t OW, int64_t C, int relu)
{
	if (C == 1 && w) {
#pragma omp simd
		for (int64_t j = 0; j < OW; j++) {
			MAX2_WINDOW(r0, r1, 2 * j, 1, m, k)
			y[j] = m, w[j] = (uint8_t)(relu && !(m > 0.0f) ? MAX2_CUT : k);
		}
	} else if (C == 1) {
#pragma omp simd
		for (int64_t j = 0; j < OW; j++) {
			MAX2_WINDOW(r0, r1, 2 * j, 1, m, k)
			(void)k;
			y[j] = m;
		}
	} else {
		for (int64_t j = 0; j < OW; j++) {
			const float *x0 = r0 + 2 * j * C, *x1 = r1 + 2 * j * C;
			float *yj = y + j * C;
			if (w) {
				uint8_t *wj = w + j * C;
#pragma omp simd
				for (int64_t c = 0; c < C; c++) {
					MAX2_WINDOW(x0, x1, c, C, m, k)
					yj[c] = m, wj[c] = (uint8_t)(relu && !(m > 0.0f) ? MAX2_CUT : k);
				}
			} else {
#pragma omp simd
				for (int64_t c = 0; c < C; c++) {
					MAX2_WINDOW(x0, x1, c, C, m, k)
					(void)k;
					yj[c] = m;
				}
			}
		}
	}
}
#undef MAX2_WINDOW

/* the gradient g to the window position k of four: x0[o], x0[o + s], x1[o],
 * x1[o + s]; zeros to the other three */
#define MAX2_SCATTER(d0, d1, o, s, g, k)                                      \
	d0[o] = k == 0 ? g : 0.0f, d0[(o) + (s)] = k == 1 ? g : 0.0f;         \
	d1[o] = k == 2 ? g : 0.0f, d1[(o) + (s)] = k == 3 ? g : 0.0f

CPU_CLONES static void max2_bwd_row(float *restrict d0, float *restrict d1, const float *restrict dy,
				    const uint8_t *restrict w, int64_t OW, int64_t C)
{
	if (C == 1) {
#pragma omp simd
		for (int64_t j = 0; j < OW; j++) {
			MAX2_SCATTER(d0, d1, 2 * j, 1, dy[j], w[j]);
		}
		return;
	}
	for (int64_t j = 0; j < OW; j++) {
		float *x0 = d0 + 2 * j * C, *x1 = d1 + 2 * j * C;
		const float *g = dy + j * C;
		const uint8_t *wj = w + j * C;
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			MAX2_SCATTER(x0, x1, c, C, g[c], wj[c]);
		}
	}
}
#undef MAX2_SCATTER

/* ---- NCHW rows of at most 16 windows in one AVX-512 vector -------------
 * The CNN's poolings have rows of 14 and 7 windows: the L = 8 / 4 kernels
 * above take two overlapping vectors a row, and bf16 went through f32
 * scratch rows (max2_run_bf16: 9.8% of the bf16 CNN's CPU samples, session
 * 23, against ~4% for the f32 poolings of the f32 CNN).  Here a row's 2 OW
 * <= 32 inputs are two masked loads (bf16: 16-bit loads widened in
 * registers, exact), split into even and odd columns by two permutes, the
 * rule of MAX2_WINDOW applied with mask compares (a NaN wins; the first
 * maximum in scan order), and the outputs stored masked (bf16: the top 16
 * bits, exact: the maximum is one of the inputs).  The backward selects dy
 * into the window's aux position and interleaves the columns back.  The
 * same values and aux bytes as the kernels above (tests/check_device_lowp,
 * check_device_pool).  AVX-512F with BW and VL (the 8- and 16-bit masked
 * loads); max2_fast16 says whether this CPU has them. */
#if CPU_HAVE_V16
#define MAX2_V16 CPU_V16

static int max2_fast16(int64_t C, int64_t OW)
{
	return C == 1 && OW >= 1 && OW <= 16 && cpu_v16_ok();
}

/* n <= 16 elements from p, as floats (bf16: widened) */
MAX2_V16 static inline __m512 max2_ld16(const void *p, int bf16, int64_t n)
{
	const __mmask16 m = (__mmask16)((1u << n) - 1);
	return bf16 ? cpu_v16_bf16_ld(p, m) : _mm512_maskz_loadu_ps(m, p);
}

/* n <= 16 floats of v to p (bf16: the top halves, exact for widened bf16) */
MAX2_V16 static inline void max2_st16(void *p, int bf16, int64_t n, __m512 v)
{
	const __mmask16 m = (__mmask16)((1u << n) - 1);
	if (!bf16)
		_mm512_mask_storeu_ps(p, m, v);
	else
		_mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

/* the 2 n <= 32 inputs of row r (element size es) as two vectors */
MAX2_V16 static inline void max2_ld32(const char *r, int bf16, int64_t n, __m512 *lo, __m512 *hi)
{
	const int64_t es = bf16 ? 2 : 4;
	*lo = max2_ld16(r, bf16, 2 * n < 16 ? 2 * n : 16);
	*hi = 2 * n > 16 ? max2_ld16(r + 16 * es, bf16, 2 * n - 16) : _mm512_setzero_ps();
}

/* MAX2_WINDOW's rule lane-wise on a window's four values m (the first,
 * replaced by the maximum) and v[0..2]: the maximum's position 0..3 */
MAX2_V16 static inline __m512i max2_pick16(__m512 *m, const __m512 v[3])
{
	__m512i k = _mm512_setzero_si512();
#pragma GCC unroll 3
	for (int q = 0; q < 3; q++) {
		const __mmask16 t = _mm512_cmp_ps_mask(v[q], *m, _CMP_GT_OQ) |
				    _mm512_cmp_ps_mask(v[q], v[q], _CMP_UNORD_Q);
		*m = _mm512_mask_mov_ps(*m, t, v[q]);
		k = _mm512_mask_mov_epi32(k, t, _mm512_set1_epi32(q + 1));
	}
	return k;
}

/* one output row of OW <= 16 windows from input rows r0, r1 (fp32 or bf16) */
MAX2_V16 static void max2_row16(void *y, uint8_t *w, const void *r0, const void *r1, int64_t OW,
				int relu, int bf16)
{
	const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
	const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
	__m512 a0, a1, b0, b1;
	max2_ld32(r0, bf16, OW, &a0, &a1);
	max2_ld32(r1, bf16, OW, &b0, &b1);
	__m512 m = _mm512_permutex2var_ps(a0, even, a1);
	const __m512 v[3] = { _mm512_permutex2var_ps(a0, odd, a1), _mm512_permutex2var_ps(b0, even, b1),
			      _mm512_permutex2var_ps(b0, odd, b1) };
	__m512i k = max2_pick16(&m, v);
	max2_st16(y, bf16, OW, m);
	if (w) {
		if (relu) /* not > 0 (NaN too): MAX2_CUT */
			k = _mm512_mask_mov_epi32(_mm512_set1_epi32(MAX2_CUT),
						  _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ), k);
		_mm_mask_storeu_epi8(w, (__mmask16)((1u << OW) - 1), _mm512_cvtepi32_epi8(k));
	}
}

/* the backward of one row: dy's OW <= 16 windows to input rows d0, d1 (their
 * first 2 OW elements), by aux w */
MAX2_V16 static void max2_bwd_row16(void *d0, void *d1, const void *dy, const uint8_t *w, int64_t OW,
				    int bf16)
{
	const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
	const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
	const __m512 g = max2_ld16(dy, bf16, OW), zero = _mm512_setzero_ps();
	const __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << OW) - 1), w));
	__m512 e[4];
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++)
		e[q] = _mm512_mask_mov_ps(zero, _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(q)), g);
	const int64_t es = bf16 ? 2 : 4, n0 = 2 * OW < 16 ? 2 * OW : 16, n1 = 2 * OW - n0;
	max2_st16(d0, bf16, n0, _mm512_permutex2var_ps(e[0], lo, e[1]));
	max2_st16(d1, bf16, n0, _mm512_permutex2var_ps(e[2], lo, e[3]));
	if (n1 > 0) {
		max2_st16((char *)d0 + 16 * es, bf16, n1, _mm512_permutex2var_ps(e[0], hi, e[1]));
		max2_st16((char *)d1 + 16 * es, bf16, n1, _mm512_permutex2var_ps(e[2], hi, e[3]));
	}
}

/* ---- bf16 NCHW planes of whole windows: a window's two columns a lane ---
 * Where the windows tile the plane (H = 2 OH, W = 2 OW: the CNN's poolings)
 * the planes' rows follow each other without a gap, so output row r of the
 * whole tensor reads input rows 2r and 2r + 1, and each window's two
 * columns of a row are one 32-bit word of two bf16 (an even element of the
 * tensor and the next; the masked moves need no alignment): shifted left
 * by 16 the word is the first column widened to f32 (exact), masked to its
 * top half the second.  A vector of 16 such words is R = 16 / OW output
 * rows (pool2's 7 windows: 2 rows, 14 lanes; pool1's 14: 1 row), each row's
 * words loaded into its lanes by a masked load, no permutes and no f32
 * scratch; the backward puts dy's bits into the half of the word its
 * window's aux names and stores the words back by the same masks.  The
 * rule, the aux bytes and the bits are max2_row16's (a NaN wins, the first
 * maximum in scan order, -0 and +0 as f32 compares them): only the lanes
 * moved (tests/check_device_lowp: lp_pool_train; tests/check_device_conv:
 * test_pool_relu_fold).  Session 50: pool1 and pool2 of the bf16 CNN took
 * a row of max2_row16 (bf16: four widening loads, six permutes) a call. */
static int max2_pairs_ok(int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW)
{
	return C == 1 && OW >= 1 && OW <= 16 && H == 2 * OH && W == 2 * OW && cpu_v16_ok();
}

/* the lanes of row q of a vector of rows of OW windows */
static inline __mmask16 max2_row_lanes(int64_t q, int64_t OW)
{
	return (__mmask16)(((1u << OW) - 1) << (q * OW));
}

/* n <= 16 / OW output rows from the 2 n input rows at x (as words of two
 * bf16): y (n OW bf16) and w (their aux, or NULL) */
MAX2_V16 static void max2_fwd_pairs(uint16_t *y, uint8_t *w, const uint32_t *x, int64_t OW, int64_t n,
				    int relu)
{
	__m512i t = _mm512_setzero_si512(), b = t;
	for (int64_t q = 0; q < n; q++) {
		const __mmask16 l = max2_row_lanes(q, OW);
		t = _mm512_mask_loadu_epi32(t, l, x + q * OW);
		b = _mm512_mask_loadu_epi32(b, l, x + q * OW + OW);
	}
	const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
	__m512 m = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
	const __m512 v[3] = { _mm512_castsi512_ps(_mm512_and_si512(t, top)),
			      _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)),
			      _mm512_castsi512_ps(_mm512_and_si512(b, top)) };
	__m512i k = max2_pick16(&m, v);
	const __mmask16 all = (__mmask16)((1u << (n * OW)) - 1);
	_mm256_mask_storeu_epi16(y, all, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m), 16)));
	if (w) {
		if (relu) /* not > 0 (NaN too): MAX2_CUT */
			k = _mm512_mask_mov_epi32(_mm512_set1_epi32(MAX2_CUT),
						  _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ), k);
		_mm_mask_storeu_epi8(w, all, _mm512_cvtepi32_epi8(k));
	}
}

/* the backward of max2_fwd_pairs: the 2 n input rows at dx (as words) from
 * n OW values of dy and their aux w */
MAX2_V16 static void max2_bwd_pairs(uint32_t *dx, const uint16_t *dy, const uint8_t *w, int64_t OW,
				    int64_t n)
{
	const __mmask16 all = (__mmask16)((1u << (n * OW)) - 1);
	const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(all, dy));
	const __m512i hi = _mm512_slli_epi32(lo, 16);
	const __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(all, w));
	/* k0..k3: the lanes whose maximum is the window's element 0..3 */
	const __mmask16 k0 = _mm512_cmpeq_epi32_mask(k, _mm512_setzero_si512()),
			k1 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(1)),
			k2 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2)),
			k3 = _mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(3));
	const __m512i t = _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(k0, lo), k1, hi);
	const __m512i b = _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(k2, lo), k3, hi);
	for (int64_t q = 0; q < n; q++) {
		const __mmask16 l = max2_row_lanes(q, OW);
		_mm512_mask_storeu_epi32(dx + q * OW, l, t);
		_mm512_mask_storeu_epi32(dx + q * OW + OW, l, b);
	}
}
#else
static int max2_pairs_ok(int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW)
{
	(void)C, (void)H, (void)W, (void)OH, (void)OW;
	return 0;
}
static void max2_fwd_pairs(uint16_t *y, uint8_t *w, const uint32_t *x, int64_t OW, int64_t n, int relu)
{
	(void)y, (void)w, (void)x, (void)OW, (void)n, (void)relu;
}
static void max2_bwd_pairs(uint32_t *dx, const uint16_t *dy, const uint8_t *w, int64_t OW, int64_t n)
{
	(void)dx, (void)dy, (void)w, (void)OW, (void)n;
}
static int max2_fast16(int64_t C, int64_t OW) { (void)C, (void)OW; return 0; }
static void max2_row16(void *y, uint8_t *w, const void *r0, const void *r1, int64_t OW, int relu, int bf16)
{
	(void)y, (void)w, (void)r0, (void)r1, (void)OW, (void)relu, (void)bf16;
}
static void max2_bwd_row16(void *d0, void *d1, const void *dy, const uint8_t *w, int64_t OW, int bf16)
{
	(void)d0, (void)d1, (void)dy, (void)w, (void)OW, (void)bf16;
}
#endif

/* Ask for the two input rows of output row r (of OH a plane) ahead of
 * their use.  The forward streams its input once (the CNN's first pooling
 * reads 100 MB at batch 1,000).  On the AVX-512 EPYC, with that input in
 * DRAM, the hardware prefetchers alone kept a core at 11-13 GB/s; asking
 * for the next row's rows one row ahead made it 35-45 GB/s, the pooling
 * 3-4x faster (a copy of the loop; in the CNN's plan it gained where
 * conv1's output had left the caches: docs/PERFORMANCE.md, issue 23,
 * session 10). */
static void max2_prefetch(const float *x, int64_t r, int64_t H, int64_t W, int64_t OH)
{
	const float *row = x + (r / OH) * H * W + 2 * (r % OH) * W;
	for (int64_t q = 0; q < 2 * W; q += 16) { /* a 64-byte line: 16 floats */
		__builtin_prefetch(row + q, 0, 3);
		/* GCC 12 at -O2 deletes the loop of prefetches without this */
		__asm__ volatile("" ::: "memory");
	}
}

/* one output row y (aux w or NULL) from input rows x0, x1: the vector
 * kernel that fits.  relu (KILN_OPF_ACT, kiln/ops.h: the ReLU before the
 * pooling, its backward folded in): a window whose maximum is not > 0
 * gets aux position MAX2_CUT, which no backward kernel matches, so it
 * passes no gradient: POOL_BWD then computes pool_bwd(dy * (y > 0)), the
 * zeros and the copies of the separate mask's pass bit for bit. */
static void max2_fwd_rows(float *y, uint8_t *w, const float *x0, const float *x1, int64_t OW, int64_t C,
			  int relu)
{
	if (max2_fast16(C, OW))
		max2_row16(y, w, x0, x1, OW, relu, 0);
	else if (C == 1 && OW >= 8)
		max2_row8(y, w, x0, x1, OW, relu);
	else if (C == 1 && OW >= 4)
		max2_row4(y, w, x0, x1, OW, relu);
	else
		max2_row(y, w, x0, x1, OW, C, relu);
}

/* input rows d0, d1 (their 2 * OW * C windowed values) from the output
 * row's gradient dy and aux w */
static void max2_bwd_rows(float *d0, float *d1, const float *dy, const uint8_t *w, int64_t OW, int64_t C)
{
	if (max2_fast16(C, OW))
		max2_bwd_row16(d0, d1, dy, w, OW, 0);
	else if (C == 1 && OW >= 8)
		max2_bwd_row8(d0, d1, dy, w, OW);
	else if (C == 1 && OW >= 4)
		max2_bwd_row4(d0, d1, dy, w, OW);
	else if (C % 8 == 0)
		max2_bwd_nhwc8(d0, d1, dy, w, OW, C);
	else
		max2_bwd_row(d0, d1, dy, w, OW, C);
}

/* The backward's zeros for what no window of output row i reads: in the
 * plane's dx (H rows of W floats), the columns from `used` on of input rows
 * 2i and 2i + 1, and after the last output row (i == OH - 1) the input rows
 * from 2 * OH on. */
static void max2_bwd_edges(float *plane, int64_t i, int64_t H, int64_t W, int64_t OH, int64_t used)
{
	float *dx = plane + 2 * i * W;
	for (int64_t q = used; q < W; q++) /* the columns no window reads */
		dx[q] = dx[W + q] = 0.0f;
	if (i == OH - 1) /* the rows no window reads */
		for (int64_t q = 2 * OH * W; q < H * W; q++)
			plane[q] = 0.0f;
}

static kiln_status max2_run(const struct cpu_plan *p, const struct kiln_op_args *a,
			    struct cpu_err *e)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD, relu = !!(p->op.flags & KILN_OPF_ACT);
	const int64_t P = p->sz[0], H = p->sz[1], OH = p->sz[3], OW = p->sz[4], C = p->sz[5];
	const int64_t W = p->sz[2] * C; /* floats of an input row */
	(void)e;
#pragma omp parallel for if (P * H * W >= CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < P * OH; r++) {
		const int64_t pl = r / OH, i = r % OH;
		const int64_t xo = pl * H * W + 2 * i * W, yo = r * OW * C;
		if (!bwd) {
			const float *x = (const float *)a->in[0] + xo;
			float *y = (float *)a->out[0] + yo;
			if (r + 1 < P * OH)
				max2_prefetch((const float *)a->in[0], r + 1, H, W, OH);
			uint8_t *w = p->aux ? (uint8_t *)a->out[1] + yo : NULL;
			max2_fwd_rows(y, w, x, x + W, OW, C, relu);
			continue;
		}
		float *dx = (float *)a->out[0] + xo;
		const float *dy = (const float *)a->in[0] + yo;
		const uint8_t *w = (const uint8_t *)a->in[1] + yo;
		max2_bwd_rows(dx, dx + W, dy, w, OW, C);
		max2_bwd_edges((float *)a->out[0] + pl * H * W, i, H, W, OH, 2 * OW * C);
	}
	return KILN_OK;
}

/* ---- NHWC in, NCHW out (ABI 2.17; issue 22, session 17) -----------------
 * A one-channel conv's output in NHWC, pooled into an NCHW model: a row is
 * one (n, output row) of NHWC as in max2_run.  The aux is NHWC's: the
 * values, the aux and dx are those of the NHWC pooling, y those of it
 * transposed.
 *
 * 8 <= C <= 64 and OW >= 8 (the CNN's pool1: 32 channels, OW 14): tiles
 * of 8 output columns x C channels in registers and a small array, no
 * scratch pass (session 17, "the mixed-layout pooling's kernels").  The
 * forward takes the tile's windows column by column as vectors of 8
 * channels (MAX2_WINDOW's rule lane-wise, as max2_row8: the input read in
 * order), stores their aux bytes as the NHWC row kernels do, then
 * transposes each 8 x 8 block of maxima (MAX2_T8) and stores 8 floats into
 * each of 8 planes; the backward reads 8 planes' 8 dy values a block,
 * transposes them into vectors of 8 channels and writes dx column by column
 * (in order) by the aux as max2_bwd_nhwc8.  A row's last column tile starts
 * at OW - 8 and its last channel block at C - 8, overlapping the one before
 * (the same values written twice), so C need not be a multiple of 8.  (The
 * blocks taken channel group by channel group, reading and writing the
 * rows 32 bytes of every 128, were 0-25% slower in the harness.)
 *
 * Other shapes: the NHWC row kernels into a thread's scratch row of OW * C
 * floats, then stored as C rows of OW floats in y's planes (the backward
 * gathers dy's C rows into the scratch row first).  sz[6] threads, sz[7] =
 * 1 (max2_prepare); the workspace holds sz[6] scratch rows (none when the
 * tiles take the shape: max2_mixed_tiles). */

/* transpose the 8 x 8 floats of v[0..7] in place: v[i][j] <- v[j][i]
 * (interleaves of pairs, of quads, of halves: AVX2's unpck, shuf, perm2f128) */
#define MAX2_T8(v)                                                                             \
	do {                                                                                   \
		const max2_i8 i1l = { 0, 8, 1, 9, 4, 12, 5, 13 }, i1h = { 2, 10, 3, 11, 6, 14, 7, 15 }; \
		const max2_i8 i2l = { 0, 1, 8, 9, 4, 5, 12, 13 }, i2h = { 2, 3, 10, 11, 6, 7, 14, 15 }; \
		const max2_i8 i4l = { 0, 1, 2, 3, 8, 9, 10, 11 }, i4h = { 4, 5, 6, 7, 12, 13, 14, 15 }; \
		max2_f8 a_[8], b_[8];                                                          \
		_Pragma("GCC unroll 8") for (int q_ = 0; q_ < 8; q_ += 2) {                                            \
			a_[q_] = __builtin_shuffle(v[q_], v[q_ + 1], i1l);                     \
			a_[q_ + 1] = __builtin_shuffle(v[q_], v[q_ + 1], i1h);                 \
		}                                                                              \
		_Pragma("GCC unroll 8") for (int q_ = 0; q_ < 8; q_ += 4) {                                            \
			b_[q_] = __builtin_shuffle(a_[q_], a_[q_ + 2], i2l);                   \
			b_[q_ + 1] = __builtin_shuffle(a_[q_], a_[q_ + 2], i2h);               \
			b_[q_ + 2] = __builtin_shuffle(a_[q_ + 1], a_[q_ + 3], i2l);           \
			b_[q_ + 3] = __builtin_shuffle(a_[q_ + 1], a_[q_ + 3], i2h);           \
		}                                                                              \
		_Pragma("GCC unroll 8") for (int q_ = 0; q_ < 4; q_++) {                                               \
			v[q_] = __builtin_shuffle(b_[q_], b_[q_ + 4], i4l);                    \
			v[q_ + 4] = __builtin_shuffle(b_[q_], b_[q_ + 4], i4h);                \
		}                                                                              \
	} while (0)

/* The aux bytes of 8 lanes: __builtin_convertvector between 8 bytes and
 * 8 ints became 8 extracts (inserts), shifts and ors at -O2 (GCC 12);
 * byte shuffles are vpshufb (and a vpermq, vpalignr, vinserti128) in the
 * AVX2 clone.  The values are 0..MAX2_CUT: a byte of each int is all.
 * MAX2_B8_PUT stores k's 8 low bytes at p, MAX2_B8_GET makes k of p's. */
typedef uint8_t max2_b32 __attribute__((vector_size(32)));
typedef uint8_t max2_b16 __attribute__((vector_size(16)));
typedef uint64_t max2_u2 __attribute__((vector_size(16)));
typedef int32_t max2_i4v __attribute__((vector_size(16)));
#define MAX2_B8_PUT(p, k)                                                                      \
	do {                                                                                   \
		const max2_b32 m_ = { 0, 4, 8, 12, 16, 20, 24, 28 };                           \
		const max2_b32 r_ = __builtin_shuffle((max2_b32)(k), m_);                       \
		memcpy(p, &r_, 8);                                                             \
	} while (0)
#define MAX2_B8_GET(k, p)                                                                      \
	do {                                                                                   \
		const max2_b16 z_ = { 0 };                                                     \
		const max2_b16 l_ = { 0, 16, 16, 16, 1, 16, 16, 16, 2, 16, 16, 16, 3, 16, 16, 16 }; \
		const max2_b16 h_ = { 4, 16, 16, 16, 5, 16, 16, 16, 6, 16, 16, 16, 7, 16, 16, 16 }; \
		uint64_t u_;                                                                   \
		memcpy(&u_, p, 8);                                                             \
		const max2_b16 v_ = (max2_b16)(max2_u2){ u_, 0 };                              \
		const max2_i4v lo_ = (max2_i4v)__builtin_shuffle(v_, z_, l_);                  \
		const max2_i4v hi_ = (max2_i4v)__builtin_shuffle(v_, z_, h_);                  \
		memcpy(&k, &lo_, 16);                                                          \
		memcpy((char *)&k + 16, &hi_, 16);                                             \
	} while (0)

/* the tiles take 8 <= C <= 8 * MAX2_TILE_G channels and OW >= 8 windows a
 * row (a tile's maxima of all channel groups are kept: a 2 KiB array) */
#define MAX2_TILE_G 8
static int max2_mixed_tiles(int64_t OW, int64_t C)
{
	return C >= 8 && C <= 8 * MAX2_TILE_G && OW >= 8;
}

/* one output row: y (its row of each of C planes of `plane` floats) and w
 * (NHWC aux, or NULL) from NHWC input rows r0, r1 */
CPU_CLONES static void max2_row_mixed8(float *restrict y, uint8_t *restrict w, const float *restrict r0,
				       const float *restrict r1, int64_t OW, int64_t C, int64_t plane, int relu)
{
	const max2_f8 fzero = { 0 };
	const int64_t G = (C + 7) / 8;
	for (int64_t j0 = 0; j0 < OW; j0 += 8) {
		const int64_t j = j0 + 8 > OW ? OW - 8 : j0;
		max2_f8 m[MAX2_TILE_G][8];
		for (int q = 0; q < 8; q++)
			for (int64_t g = 0; g < G; g++) {
				const int64_t c = 8 * g + 8 > C ? C - 8 : 8 * g;
				const int64_t o = 2 * (j + q) * C + c;
				const max2_f8 v[3] = { *(const max2_f8 *)(r0 + o + C), *(const max2_f8 *)(r1 + o),
						       *(const max2_f8 *)(r1 + o + C) };
				max2_f8 mq = *(const max2_f8 *)(r0 + o);
				max2_i8 k = { 0 };
				_Pragma("GCC unroll 3") for (int s = 0; s < 3; s++) {
					const max2_i8 t = (v[s] > mq) | (v[s] != v[s]);
					mq = MAX2_SEL(max2_f8, max2_i8, t, v[s], mq);
					k = (t & (s + 1)) | (k & ~t);
				}
				if (w) {
					if (relu) /* not > 0 (NaN too): MAX2_CUT */
						k = MAX2_CUT_IF(k, mq > fzero);
					MAX2_B8_PUT(w + (j + q) * C + c, k);
				}
				m[g][q] = mq;
			}
		for (int64_t g = 0; g < G; g++) {
			const int64_t c = 8 * g + 8 > C ? C - 8 : 8 * g;
			MAX2_T8(m[g]);
			_Pragma("GCC unroll 8") for (int q = 0; q < 8; q++)
				*(max2_f8 *)(y + (c + q) * plane + j) = m[g][q];
		}
	}
}

/* the backward of one row: NHWC input rows d0, d1 from dy's row of each of
 * C planes and the NHWC aux w */
CPU_CLONES static void max2_bwd_mixed8(float *restrict d0, float *restrict d1, const float *restrict dy,
				       const uint8_t *restrict w, int64_t OW, int64_t C, int64_t plane)
{
	const max2_f8 zero = { 0 };
	const int64_t G = (C + 7) / 8;
	for (int64_t j0 = 0; j0 < OW; j0 += 8) {
		const int64_t j = j0 + 8 > OW ? OW - 8 : j0;
		max2_f8 gt[MAX2_TILE_G][8];
		for (int64_t g = 0; g < G; g++) {
			const int64_t c = 8 * g + 8 > C ? C - 8 : 8 * g;
			_Pragma("GCC unroll 8") for (int q = 0; q < 8; q++)
				gt[g][q] = *(const max2_f8 *)(dy + (c + q) * plane + j);
			MAX2_T8(gt[g]);
		}
		for (int q = 0; q < 8; q++)
			for (int64_t g = 0; g < G; g++) {
				const int64_t c = 8 * g + 8 > C ? C - 8 : 8 * g;
				const int64_t o = (j + q) * C + c, x = 2 * (j + q) * C + c;
				max2_i8 k;
				MAX2_B8_GET(k, w + o);
				*(max2_f8 *)(d0 + x) = MAX2_SEL(max2_f8, max2_i8, k == 0, gt[g][q], zero);
				*(max2_f8 *)(d0 + x + C) = MAX2_SEL(max2_f8, max2_i8, k == 1, gt[g][q], zero);
				*(max2_f8 *)(d1 + x) = MAX2_SEL(max2_f8, max2_i8, k == 2, gt[g][q], zero);
				*(max2_f8 *)(d1 + x + C) = MAX2_SEL(max2_f8, max2_i8, k == 3, gt[g][q], zero);
			}
	}
}
#undef MAX2_T8
#undef MAX2_TILE_G
#undef MAX2_B8_PUT
#undef MAX2_B8_GET
#undef MAX2_SEL

CPU_CLONES static void max2_to_planes(float *restrict y, const float *restrict t, int64_t OW, int64_t C,
				      int64_t plane)
{
	for (int64_t c = 0; c < C; c++)
		for (int64_t j = 0; j < OW; j++)
			y[c * plane + j] = t[j * C + c];
}

/* dy's row of each plane read 8 floats a load (a loop of single floats took
 * 1.4-1.7x the time in a harness of the CNN's pool1, 1,792 rows of 14 x 32:
 * 0.70-0.77 against 0.42-0.53 ms) */
CPU_CLONES static void max2_from_planes(float *restrict t, const float *restrict dy, int64_t OW, int64_t C,
					int64_t plane)
{
	for (int64_t c = 0; c < C; c++) {
		const float *s = dy + c * plane;
		float *d = t + c;
		int64_t j = 0;
		for (; j + 8 <= OW; j += 8) {
			max2_f8 v;
			memcpy(&v, s + j, sizeof v);
			for (int q = 0; q < 8; q++)
				d[(j + q) * C] = v[q];
		}
		for (; j < OW; j++)
			d[j * C] = s[j];
	}
}

/* Ask for dy's lines of output row r: its C rows of OW floats in the
 * NCHW planes (of `plane` floats, OH rows a plane), ahead of their use.
 * Each plane's row is a short piece of its own (56 bytes in the CNN's
 * pool1), 32 of them a row, which the hardware prefetchers did not follow:
 * asking for them two rows ahead took the tile backward from 2.3-2.6 to
 * 1.8-1.9 ms in a harness of pool1 (batch 128, its tensors out of the
 * caches; session 17).  The same for the forward's stores into y gained
 * nothing there and is not done. */
static void max2_prefetch_planes(const float *dy, int64_t r, int64_t C, int64_t OH, int64_t OW, int64_t plane)
{
	const float *row = dy + (r / OH) * C * plane + (r % OH) * OW;
	for (int64_t c = 0; c < C; c++) {
		__builtin_prefetch(row + c * plane, 0, 3);
		__builtin_prefetch(row + c * plane + OW - 1, 0, 3);
		__asm__ volatile("" ::: "memory"); /* as max2_prefetch's */
	}
}

static kiln_status max2_run_mixed(const struct cpu_plan *p, const struct kiln_op_args *a,
				  struct cpu_err *e)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD, relu = !!(p->op.flags & KILN_OPF_ACT);
	const int64_t P = p->sz[0], H = p->sz[1], OH = p->sz[3], OW = p->sz[4], C = p->sz[5];
	const int64_t W = p->sz[2] * C, Y = OW * C, plane = OH * OW;
	const int tiles = max2_mixed_tiles(OW, C);
	int nt = omp_get_max_threads();
	nt = nt < (int)p->sz[6] ? nt : (int)p->sz[6];
	(void)e;
#pragma omp parallel num_threads(cpu_team_whole(nt)) if (P * H * W >= CPU_PAR_MIN)
	{
		/* rows [r0, r1) on members [0, nt), the others idle (cpu_team_whole) */
		const int me = omp_get_thread_num();
		const int T = omp_get_num_threads() < nt ? omp_get_num_threads() : nt;
		const int64_t r0 = me < T ? P * OH * me / T : 0, r1 = me < T ? P * OH * (me + 1) / T : 0;
		float *t = tiles || me >= T ? NULL : (float *)a->workspace + me * Y;
		for (int64_t r = r0; r < r1; r++) {
			const int64_t pl = r / OH, i = r % OH;
			const int64_t xo = pl * H * W + 2 * i * W, wo = r * Y, yo = pl * C * plane + i * OW;
			if (!bwd) {
				const float *x = (const float *)a->in[0] + xo;
				float *y = (float *)a->out[0] + yo;
				if (r + 1 < P * OH)
					max2_prefetch((const float *)a->in[0], r + 1, H, W, OH);
				uint8_t *w = p->aux ? (uint8_t *)a->out[1] + wo : NULL;
				if (tiles) {
					max2_row_mixed8(y, w, x, x + W, OW, C, plane, relu);
				} else {
					max2_fwd_rows(t, w, x, x + W, OW, C, relu);
					max2_to_planes(y, t, OW, C, plane);
				}
				continue;
			}
			float *dx = (float *)a->out[0] + xo;
			const float *dy = (const float *)a->in[0] + yo;
			const uint8_t *w = (const uint8_t *)a->in[1] + wo;
			if (r + 2 < P * OH)
				max2_prefetch_planes((const float *)a->in[0], r + 2, C, OH, OW, plane);
			if (tiles) {
				max2_bwd_mixed8(dx, dx + W, dy, w, OW, C, plane);
			} else {
				max2_from_planes(t, dy, OW, C, plane);
				max2_bwd_rows(dx, dx + W, t, w, OW, C);
			}
			max2_bwd_edges((float *)a->out[0] + pl * H * W, i, H, W, OH, 2 * OW * C);
		}
	}
	return KILN_OK;
}

/* ---- bf16 through the f32 rows (issue 22, session 12) -------------------
 * oneDNN 2.6's bf16 pooling (the bf16 CNN's) ran as its own bf16 kernels
 * with a 4-byte-per-output workspace.  A bf16 row widens exactly to f32 (a
 * shift), the max of bf16 values is one of them, and the backward copies a
 * gradient or writes zero: so widening the two input rows into a thread's
 * scratch, running the f32 row kernels above and narrowing the result (the
 * top 16 bits: exact) gives the bits of oneDNN's bf16 kernel, same aux
 * as the f32 case, with one difference: a NaN wins its window as in the
 * f32 kernels and PyTorch, where oneDNN 2.6's bf16 kernel let it lose.
 * NCHW only (max2_fits).  A thread takes sz[7] output rows of one plane at a
 * time (about 16 KiB of input rows: a row at a time paid a call per 7
 * windows on the CNN's second pooling, 3x oneDNN's time); the workspace
 * holds sz[6] threads' 2 * sz[7] input and sz[7] output rows of floats.
 * The widening and narrowing are clones (CPU_CLONES) of their own: inlined
 * into the parallel region they were built for the plugin's baseline ISA,
 * 4 floats a step (session 14: 2.9% of the bf16 CNN run's CPU samples). */
CPU_CLONES static void max2_widen(float *restrict y, const uint16_t *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		const uint32_t u = (uint32_t)x[i] << 16;
		memcpy(&y[i], &u, sizeof u);
	}
}

/* exact for values that came from bf16 (a NaN keeps its payload) */
CPU_CLONES static void max2_narrow(uint16_t *restrict y, const float *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &x[i], sizeof u);
		y[i] = (uint16_t)(u >> 16);
	}
}

/* bf16 NCHW rows of at most 16 windows straight from and to bf16 (the
 * kernels of max2_row16), a row at a time as max2_run */
static kiln_status max2_run_bf16_16(const struct cpu_plan *p, const struct kiln_op_args *a)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD, relu = !!(p->op.flags & KILN_OPF_ACT);
	const int64_t P = p->sz[0], H = p->sz[1], W = p->sz[2], OH = p->sz[3], OW = p->sz[4];
#pragma omp parallel for if (P * H * W >= CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < P * OH; r++) {
		const int64_t pl = r / OH, i = r % OH;
		const int64_t xo = pl * H * W + 2 * i * W, yo = r * OW;
		if (!bwd) {
			const uint16_t *x = (const uint16_t *)a->in[0] + xo;
			uint8_t *w = p->aux ? (uint8_t *)a->out[1] + yo : NULL;
			max2_row16((uint16_t *)a->out[0] + yo, w, x, x + W, OW, relu, 1);
			continue;
		}
		uint16_t *plane = (uint16_t *)a->out[0] + pl * H * W, *dx = plane + 2 * i * W;
		max2_bwd_row16(dx, dx + W, (const uint16_t *)a->in[0] + yo,
			       (const uint8_t *)a->in[1] + yo, OW, 1);
		for (int64_t q = 2 * OW; q < W; q++) /* the columns no window reads */
			dx[q] = dx[W + q] = 0;
		if (i == OH - 1) /* the rows no window reads */
			memset(plane + 2 * OH * W, 0, (size_t)((H - 2 * OH) * W) * 2);
	}
	return KILN_OK;
}

/* bf16 NCHW planes the windows tile, R = 16 / OW output rows a vector
 * (max2_fwd_pairs), the groups of R rows of the whole tensor split over the
 * team */
static kiln_status max2_run_bf16_pairs(const struct cpu_plan *p, const struct kiln_op_args *a,
				       struct cpu_err *e)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD, relu = !!(p->op.flags & KILN_OPF_ACT);
	const int64_t rows = p->sz[0] * p->sz[3], OW = p->sz[4], R = 16 / OW, ng = (rows + R - 1) / R;
	(void)e;
#pragma omp parallel for if (rows * 4 * OW >= CPU_PAR_MIN) schedule(static)
	for (int64_t g = 0; g < ng; g++) {
		const int64_t r = g * R, n = rows - r < R ? rows - r : R;
		if (!bwd)
			max2_fwd_pairs((uint16_t *)a->out[0] + r * OW,
				       p->aux ? (uint8_t *)a->out[1] + r * OW : NULL,
				       (const uint32_t *)a->in[0] + r * 2 * OW, OW, n, relu);
		else
			max2_bwd_pairs((uint32_t *)a->out[0] + r * 2 * OW, (const uint16_t *)a->in[0] + r * OW,
				       (const uint8_t *)a->in[1] + r * OW, OW, n);
	}
	return KILN_OK;
}

static kiln_status max2_run_bf16(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	if (max2_fast16(p->sz[5], p->sz[4]))
		return max2_run_bf16_16(p, a);
	const int bwd = p->op.type == KILN_OP_POOL_BWD, relu = !!(p->op.flags & KILN_OPF_ACT);
	const int64_t P = p->sz[0], H = p->sz[1], OH = p->sz[3], OW = p->sz[4], C = p->sz[5];
	const int64_t W = p->sz[2] * C, R = p->sz[7], nb = (OH + R - 1) / R;
	const int64_t Y = OW * C; /* values of an output row */
	int nt = omp_get_max_threads();
	nt = nt < (int)p->sz[6] ? nt : (int)p->sz[6];
	(void)e;
#pragma omp parallel num_threads(cpu_team_whole(nt)) if (P * H * W >= CPU_PAR_MIN)
	{
		/* blocks [b0, b1) on members [0, nt), the others idle (cpu_team_whole) */
		const int me = omp_get_thread_num();
		const int T = omp_get_num_threads() < nt ? omp_get_num_threads() : nt;
		const int64_t b0 = me < T ? P * nb * me / T : 0, b1 = me < T ? P * nb * (me + 1) / T : 0;
		float *xr = me < T ? (float *)a->workspace + me * R * (2 * W + Y) : NULL;
		float *yr = xr ? xr + 2 * R * W : NULL;
		for (int64_t blk = b0; blk < b1; blk++) {
			const int64_t pl = blk / nb, i0 = blk % nb * R, n = OH - i0 < R ? OH - i0 : R;
			const int64_t xo = pl * H * W + 2 * i0 * W, yo = (pl * OH + i0) * Y;
			if (!bwd) {
				max2_widen(xr, (const uint16_t *)a->in[0] + xo, 2 * n * W);
				for (int64_t i = 0; i < n; i++) {
					uint8_t *w = p->aux ? (uint8_t *)a->out[1] + yo + i * Y : NULL;
					max2_fwd_rows(yr + i * Y, w, xr + 2 * i * W, xr + (2 * i + 1) * W, OW, C,
						      relu);
				}
				max2_narrow((uint16_t *)a->out[0] + yo, yr, n * Y);
				continue;
			}
			uint16_t *dx = (uint16_t *)a->out[0];
			max2_widen(yr, (const uint16_t *)a->in[0] + yo, n * Y);
			for (int64_t i = 0; i < n; i++) {
				float *d0 = xr + 2 * i * W, *d1 = d0 + W;
				max2_bwd_rows(d0, d1, yr + i * Y, (const uint8_t *)a->in[1] + yo + i * Y, OW, C);
				for (int64_t q = 2 * OW * C; q < W; q++) /* the columns no window reads */
					d0[q] = d1[q] = 0.0f;
			}
			max2_narrow(dx + xo, xr, 2 * n * W);
			if (i0 + n == OH) /* the rows no window reads */
				memset(dx + pl * H * W + 2 * OH * W, 0, (size_t)((H - 2 * OH) * W) * 2);
		}
	}
	return KILN_OK;
}

/* The case max2_run serves: max, 2x2, stride 2, no padding, plain f32
 * (bf16 in NCHW: max2_run_bf16; in NHWC oneDNN's bf16 kernel stays, as it
 * took 0.4-0.7x the CPU time of widening and narrowing rows there for the
 * backward, docs/PERFORMANCE.md, "Session 12"). */
static int max2_fits(const struct kiln_op *op, const struct kiln_tensor_desc *x)
{
	if ((op->flags & KILN_OPF_ACT) && (op->type != KILN_OP_POOL || op->n_out != 2 ||
					   op->i[KILN_OPI_ACT] != KILN_ACT_RELU))
		return 0;
	return op->i[0] == KILN_POOL_MAX && op->i[1] == 2 && op->i[2] == 2 && op->i[3] == 2 &&
	       op->i[4] == 2 && !op->i[5] && !op->i[6] && (x->dtype == KILN_F32 || (x->dtype == KILN_BF16 && !cpu_nhwc(x))) &&
	       !(op->flags & KILN_OPF_ACCUMULATE);
}

static kiln_status max2_prepare(struct cpu_ctx *c, struct cpu_plan *p, const struct kiln_tensor_desc *x,
				const struct kiln_tensor_desc *y)
{
	const int bwd = p->op.type == KILN_OP_POOL_BWD, nhwc = cpu_nhwc(x);
	p->sz[0] = nhwc ? x->dims[0] : x->dims[0] * x->dims[1];
	p->sz[1] = x->dims[2], p->sz[2] = x->dims[3];
	p->sz[3] = y->dims[2], p->sz[4] = y->dims[3];
	p->sz[5] = nhwc ? x->dims[1] : 1;
	p->aux = bwd || p->op.n_out == 2 ? (size_t)(p->sz[0] * p->sz[3] * p->sz[4] * p->sz[5]) : 0;
	p->workspace = 0;
	p->kernel = max2_run;
	const int mixed = nhwc && !cpu_nhwc(y); /* NHWC -> NCHW, f32 (ABI 2.17) */
	if (mixed) { /* a scratch output row for each thread, unless the tiles fit */
		p->sz[6] = c->threads > 0 ? c->threads : 1;
		p->sz[7] = 1;
		if (!max2_mixed_tiles(p->sz[4], p->sz[5]))
			p->workspace = (size_t)(p->sz[6] * p->sz[4] * p->sz[5]) * sizeof(float);
		p->kernel = max2_run_mixed;
	}
	if (x->dtype == KILN_BF16) { /* each thread's f32 rows */
		const int64_t W = p->sz[2] * p->sz[5], R = 2048 / W; /* about 16 KiB of rows */
		p->sz[6] = c->threads > 0 ? c->threads : 1;
		p->sz[7] = R < 1 ? 1 : R > p->sz[3] ? p->sz[3] : R;
		p->workspace = (size_t)(p->sz[6] * p->sz[7] * (2 * W + p->sz[4] * p->sz[5])) * sizeof(float);
		p->kernel = max2_run_bf16;
		/* KILN_CPU_POOL_ROWS set keeps the row kernels (the A/B hook) */
		if (max2_pairs_ok(p->sz[5], p->sz[1], p->sz[2], p->sz[3], p->sz[4]) && !getenv("KILN_CPU_POOL_ROWS")) {
			p->workspace = 0;
			p->kernel = max2_run_bf16_pairs;
		}
	}
	p->n_in = bwd ? 2 : 1;
	p->n_out = !bwd && p->aux ? 2 : 1;
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s max 2x2/2 %s x [%lld,%lld,%lld,%lld] %s: kiln's %s, aux %zu bytes%s",
		     cpu_op_name(p->op.type), x->dtype == KILN_BF16 ? "bf16" : "f32", (long long)x->dims[0],
		     (long long)x->dims[1], (long long)x->dims[2], (long long)x->dims[3],
		     mixed ? "NHWC, y NCHW" : nhwc ? "NHWC" : "NCHW",
		     p->kernel == max2_run_bf16_pairs ? "kernel (a window's two columns a lane)" : "kernel", p->aux,
		     (p->op.flags & KILN_OPF_ACT) ? ", the ReLU's mask in it" : "");
	return KILN_OK;
}

kiln_status cpu_pool_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_POOL_BWD;
	kiln_status st = KILN_OK;
	char geom[200];
	geom[0] = 0;

	/* x: forward input (dx for the backward); y: forward output (dy). */
	const struct kiln_tensor_desc *x = bwd ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *y = bwd ? &op->in[0] : &op->out[0];
	/* f32, or bf16 (oneDNN's bf16 pooling: averages summed in f32), or
	 * u8 max pooling in inference (ABI 2.8, a chained INT8 model's) */
	const int u8 = x->dtype == KILN_U8 && !bwd && op->n_out == 1 && op->i[0] == KILN_POOL_MAX;
	if ((x->dtype != KILN_F32 && x->dtype != KILN_BF16 && !u8) || y->dtype != x->dtype)
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 or bf16 activations (u8: max in inference), one dtype");
	const dnnl_data_type_t dt = u8 ? dnnl_u8 : x->dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32;
	const int nhwc = cpu_nhwc(x), kind = (int)op->i[0];
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t KH = op->i[1], KW = op->i[2], sh = op->i[3], sw = op->i[4];
	const int64_t ph = op->i[5], pw = op->i[6];
	snprintf(geom, sizeof geom,
		 "%s x [%lld,%lld,%lld,%lld] kernel %lldx%lld stride %lldx%lld pad %lldx%lld %s",
		 kind == KILN_POOL_MAX ? "max" : op->i[7] ? "avg (count pad)" : "avg",
		 (long long)N, (long long)C, (long long)H, (long long)W, (long long)KH,
		 (long long)KW, (long long)sh, (long long)sw, (long long)ph, (long long)pw,
		 nhwc ? "NHWC" : "NCHW");
	const int64_t OH = y->dims[2], OW = y->dims[3];
	if (max2_fits(op, x))
		return max2_prepare(c, p, x, y);
	if (nhwc != cpu_nhwc(y)) /* ABI 2.17: kiln's kernel only */
		return cpu_bad(c, op, KILN_ENOTSUP,
			       "x NHWC and y NCHW: max 2x2/2 without padding, f32 only");
	if (op->flags & KILN_OPF_ACT)
		return cpu_bad(c, op, KILN_ENOTSUP,
			       "a ReLU folded into the pooling (KILN_OPF_ACT): max 2x2/2 without padding, f32 or NCHW bf16 only");
	const int max = kind == KILN_POOL_MAX;
	const int training = max && (bwd || op->n_out == 2);
	if ((st = cpu_dnn_new(c, p)))
		return st;
	struct cpu_dnn *d = p->dnn;

	dnnl_memory_desc_t x_md, y_md;
	dnnl_primitive_desc_t fwd = NULL, pd = NULL;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_pooling_desc_t desc;
	const dnnl_alg_kind_t alg = max       ? dnnl_pooling_max
				    : op->i[7] ? dnnl_pooling_avg_include_padding
					       : dnnl_pooling_avg_exclude_padding;
	const dnnl_dims_t strides = { sh, sw }, kernel = { KH, KW }, pad = { ph, pw };
	{
		dnnl_dims_t xd = { N, C, H, W }, yd = { N, C, OH, OW };
		const dnnl_format_tag_t tag = nhwc ? dnnl_nhwc : dnnl_nchw;
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&x_md, 4, xd, dt, tag));
		CPU_DNN_TRY(dnnl_memory_desc_init_by_tag(&y_md, 4, yd, dt, tag));
	}
	CPU_DNN_TRY(dnnl_primitive_attr_create(&attr));
	CPU_DNN_TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
	CPU_DNN_TRY(dnnl_pooling_forward_desc_init(
		&desc, training || bwd ? dnnl_forward_training : dnnl_forward_inference, alg, &x_md,
		&y_md, strides, kernel, pad, pad));
	CPU_DNN_TRY(dnnl_primitive_desc_create(&fwd, &desc, attr, c->engine, NULL));
	const dnnl_memory_desc_t *ws_md =
		training ? dnnl_primitive_desc_query_md(fwd, dnnl_query_workspace_md, 0) : NULL;
	p->aux = ws_md ? dnnl_memory_desc_get_size(ws_md) : 0;
	if (bwd) {
		CPU_DNN_TRY(dnnl_pooling_backward_desc_init(&desc, alg, &x_md, &y_md, strides, kernel,
							    pad, pad));
		CPU_DNN_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, fwd));
	} else {
		pd = fwd;
		fwd = NULL;
	}
	p->workspace = cpu_dnn_scratch(pd);

	int arg[CPU_DNN_ARGS], mem[CPU_DNN_ARGS], n = 0, m;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &x_md, bwd ? CPU_BIND_OUT : CPU_BIND_IN, 0, 0, &m));
	arg[n] = bwd ? DNNL_ARG_DIFF_SRC : DNNL_ARG_SRC, mem[n++] = m;
	CPU_DNN_TRY(cpu_dnn_mem(c, d, &y_md, bwd ? CPU_BIND_IN : CPU_BIND_OUT, 0, 0, &m));
	arg[n] = bwd ? DNNL_ARG_DIFF_DST : DNNL_ARG_DST, mem[n++] = m;
	if (p->aux) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, ws_md, bwd ? CPU_BIND_IN : CPU_BIND_OUT, 1, 0, &m));
		arg[n] = DNNL_ARG_WORKSPACE, mem[n++] = m;
	}
	if (p->workspace) {
		CPU_DNN_TRY(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
					CPU_BIND_WS, 0, 0, &m));
		arg[n] = DNNL_ARG_SCRATCHPAD, mem[n++] = m;
	}
	CPU_DNN_TRY(cpu_dnn_step(d, pd, n, arg, mem));
	/* Arguments run() requires: aux only when there is one. */
	p->n_in = bwd && p->aux ? 2 : 1;
	p->n_out = !bwd && p->aux ? 2 : 1;
	p->kernel = cpu_dnn_run;
	c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s: %s, aux %zu bytes, workspace %zu bytes",
		     cpu_op_name(op->type), geom, cpu_dnn_impl(pd), p->aux, p->workspace);
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_desc_destroy(fwd);
	dnnl_primitive_attr_destroy(attr);
	return st;
}
