/* plugins/cpu/layout.c - data movement: KILN_OP_CONCAT, SPLIT and REORDER.
 *
 * CONCAT / SPLIT along logical dimension d = i[0].  In storage order the
 * tensor is [outer, extent_d * inner] where outer is the product of the
 * stored dimensions before d and inner of those after it; for a 4-d NHWC
 * activation the stored order is N, H, W, C, so channels (d = 1) are the
 * innermost dimension and every (n, h, w) row interleaves the inputs.
 * Each input k then owns a contiguous chunk of every outer row.  Any dtype
 * copies; SPLIT's accumulate (bit k of i[1] adds into out k) is f32 only.
 *
 * REORDER copies in0 into out0 with out0's layout: per sample, NCHW [C, HW]
 * and NHWC [HW, C] are transposes of each other (blocked 32 x 32 so both
 * sides stream through cache; 4-byte elements in 8 x 8 AVX2 tiles where
 * the CPU has AVX2).  ROW and NCHW are the same storage.
 */
#include "cpu.h"

#include <stdio.h>
#include <string.h>

/* sz[] of a CONCAT/SPLIT plan: sz[0] outer rows, sz[1 + k] chunk bytes of
 * part k; p->cols = bytes of one full outer row. */

/* Logical dimension d of desc -> its position in storage order. */
static int stored_axis(const struct kiln_tensor_desc *t, int d)
{
	static const int nhwc[4] = { 0, 3, 1, 2 };
	return cpu_nhwc(t) ? nhwc[d] : d;
}

/* Stored dims of desc. */
static void stored_dims(const struct kiln_tensor_desc *t, int64_t *out)
{
	for (int i = 0; i < t->ndim; i++)
		out[i] = t->dims[i];
	if (cpu_nhwc(t)) {
		out[1] = t->dims[2], out[2] = t->dims[3], out[3] = t->dims[1];
	}
}

CPU_CLONES static void add_f32(float *restrict y, const float *restrict x, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] += x[i];
}

/* dst (=|+=) src, `bytes` long (add: f32) */
static void move(void *dst, const void *src, int64_t bytes, int add)
{
	if (add)
		add_f32(dst, src, bytes / 4);
	else
		memcpy(dst, src, (size_t)bytes);
}

static kiln_status cpu_concat_split(const struct cpu_plan *p, const struct kiln_op_args *a,
				    struct cpu_err *e)
{
	const int split = p->op.type == KILN_OP_SPLIT;
	const int parts = split ? p->op.n_out : p->op.n_in;
	const int64_t outer = p->sz[0], row = p->cols;
	int64_t off[KILN_OP_MAX_IN + 1];
	(void)e;
	off[0] = 0;
	for (int k = 0; k < parts; k++)
		off[k + 1] = off[k] + p->sz[1 + k];
	char *whole = split ? (char *)a->in[0] : (char *)a->out[0];
	const int64_t total = outer * row;
	if (outer >= 64 || total < CPU_PAR_MIN * 4) {
#pragma omp parallel for if (total >= CPU_PAR_MIN * 4) schedule(static)
		for (int64_t o = 0; o < outer; o++)
			for (int k = 0; k < parts; k++) {
				const int64_t ch = p->sz[1 + k];
				char *w = whole + o * row + off[k];
				if (split)
					move((char *)a->out[k] + o * ch, w, ch,
					     (int)(p->op.i[1] >> k) & 1);
				else
					memcpy(w, (const char *)a->in[k] + o * ch, (size_t)ch);
			}
		return KILN_OK;
	}
	/* Few long rows: every thread takes a slice of each chunk. */
#pragma omp parallel
	{
		const int64_t t = cpu_thread_num(), T = cpu_num_threads();
		for (int64_t o = 0; o < outer; o++)
			for (int k = 0; k < parts; k++) {
				const int64_t ch = p->sz[1 + k];
				const int64_t b = (ch / 64 * t / T) * 64;
				const int64_t en = t + 1 == T ? ch : (ch / 64 * (t + 1) / T) * 64;
				char *w = whole + o * row + off[k] + b;
				if (en <= b)
					continue;
				if (split)
					move((char *)a->out[k] + o * ch + b, w, en - b,
					     (int)(p->op.i[1] >> k) & 1);
				else
					memcpy(w, (const char *)a->in[k] + o * ch + b, (size_t)(en - b));
			}
	}
	return KILN_OK;
}

/* dst[s][r] (=|+=) src[r][s] for one [R, S] matrix, in 32 x 32 blocks. */
#define CPU_TRANSPOSE(name, T)                                                            \
	static void name(T *restrict dst, const T *restrict src, int64_t R, int64_t S,    \
			 int64_t rb, int add)                                             \
	{                                                                                 \
		const int64_t r1 = rb + 32 < R ? rb + 32 : R;                            \
		for (int64_t sb = 0; sb < S; sb += 32) {                                  \
			const int64_t s1 = sb + 32 < S ? sb + 32 : S;                    \
			for (int64_t s = sb; s < s1; s++)                                 \
				for (int64_t r = rb; r < r1; r++) {                       \
					if (add)                                          \
						dst[s * R + r] += src[r * S + s];         \
					else                                              \
						dst[s * R + r] = src[r * S + s];          \
				}                                                         \
		}                                                                         \
	}
CPU_TRANSPOSE(tr_f32, float)
CPU_TRANSPOSE(tr_u8, uint8_t)
CPU_TRANSPOSE(tr_u16, uint16_t)
CPU_TRANSPOSE(tr_u32, uint32_t)
CPU_TRANSPOSE(tr_u64, uint64_t)
#undef CPU_TRANSPOSE

/* ---- 4-byte transposes in 8 x 8 AVX2 tiles -------------------------------
 * The loops above are scalar in the baseline x86-64 build, and their
 * strided reads ran an NHWC CNN's flatten (128 x [49, 64] f32, forward and
 * backward) at 3-7x the time of this version (docs/PERFORMANCE.md,
 * "Session 15: the CNN's reorders").  Eight rows of eight are loaded,
 * transposed in registers (unpack, shuffle, permute) and stored as eight
 * columns; the edges of a block that are not whole tiles go through the
 * scalar loops.  Pure data movement (add: one f32 add an element, as the
 * loop's), so the bytes are the loop's. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TR8 1
#define TR8_AVX2 __attribute__((target("avx2")))

/* d (=|+=) v, 8 lanes */
TR8_AVX2 static inline void tr8_put(float *d, __m256 v, int add)
{
	_mm256_storeu_ps(d, add ? _mm256_add_ps(_mm256_loadu_ps(d), v) : v);
}

/* d[j * ld + i] (=|+=) s[i * ls + j], i, j < 8, 4-byte elements; spelt
 * out, as arrays of vectors in loops stay in memory at -O2 */
TR8_AVX2 static void tr8_tile(float *d, int64_t ld, const float *s, int64_t ls, int add)
{
	const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ls);
	const __m256 r2 = _mm256_loadu_ps(s + 2 * ls), r3 = _mm256_loadu_ps(s + 3 * ls);
	const __m256 r4 = _mm256_loadu_ps(s + 4 * ls), r5 = _mm256_loadu_ps(s + 5 * ls);
	const __m256 r6 = _mm256_loadu_ps(s + 6 * ls), r7 = _mm256_loadu_ps(s + 7 * ls);
	const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
	const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
	const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
	const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
	const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
	const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
	const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
	const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
	tr8_put(d, _mm256_permute2f128_ps(u0, u4, 0x20), add);
	tr8_put(d + ld, _mm256_permute2f128_ps(u1, u5, 0x20), add);
	tr8_put(d + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20), add);
	tr8_put(d + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20), add);
	tr8_put(d + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31), add);
	tr8_put(d + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31), add);
	tr8_put(d + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31), add);
	tr8_put(d + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31), add);
}

/* tr_f32 / tr_u32 of the rows [rb, rb + 32) in whole 8 x 8 tiles, the rest
 * by the loops; add only for f32 (the u32 copy moves the same bits). */
TR8_AVX2 static void tr8_block(float *dst, const float *src, int64_t R, int64_t S, int64_t rb,
			       int add)
{
	const int64_t r1 = rb + 32 < R ? rb + 32 : R;
	const int64_t r8 = rb + ((r1 - rb) & ~(int64_t)7), s8 = S & ~(int64_t)7;
	for (int64_t r = rb; r < r8; r += 8)
		for (int64_t s = 0; s < s8; s += 8)
			tr8_tile(dst + s * R + r, R, src + r * S + s, S, add);
	for (int64_t s = s8; s < S; s++) /* the columns past the tiles */
		for (int64_t r = rb; r < r8; r++) {
			if (add)
				dst[s * R + r] += src[r * S + s];
			else
				dst[s * R + r] = src[r * S + s];
		}
	for (int64_t r = r8; r < r1; r++) /* the rows past the tiles */
		for (int64_t s = 0; s < S; s++) {
			if (add)
				dst[s * R + r] += src[r * S + s];
			else
				dst[s * R + r] = src[r * S + s];
		}
}
#endif

/* dst[c * ld + r] = src[r * ls + c], r < R, c < S (f32): in 8 x 8 AVX2
 * tiles where the CPU has them, the edges (and other CPUs) by a loop. */
void cpu_transpose_f32(float *dst, int64_t ld, const float *src, int64_t ls, int64_t R, int64_t S)
{
	int64_t r8 = 0, s8 = 0;
#ifdef TR8
	if (__builtin_cpu_supports("avx2")) {
		r8 = R & ~(int64_t)7, s8 = S & ~(int64_t)7;
		for (int64_t r = 0; r < r8; r += 8)
			for (int64_t c = 0; c < s8; c += 8)
				tr8_tile(dst + c * ld + r, ld, src + r * ls + c, ls, 0);
	}
#endif
	for (int64_t r = 0; r < R; r++)
		for (int64_t c = r < r8 ? s8 : 0; c < S; c++)
			dst[c * ld + r] = src[r * ls + c];
}

/* sz[] of a REORDER plan: sz[0] N, sz[1] rows R and sz[2] columns S of each
 * sample's source matrix (0: same layout, a flat copy of p->n elements),
 * sz[3] element size. */
static kiln_status cpu_reorder(const struct cpu_plan *p, const struct kiln_op_args *a,
			       struct cpu_err *e)
{
	const int add = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const int64_t N = p->sz[0], R = p->sz[1], S = p->sz[2], es = p->sz[3];
	(void)e;
	if (!R) {
		if (a->in[0] == a->out[0] && !add)
			return KILN_OK;
		if (add) {
			const float *x = a->in[0];
			float *y = a->out[0];
			CPU_SPANS(p->n, b, en, add_f32(y + b, x + b, en - b));
		} else {
			memcpy(a->out[0], a->in[0], (size_t)(p->n * es));
		}
		return KILN_OK;
	}
	const int64_t nb = (R + 31) / 32;
#ifdef TR8
	const int avx2 = __builtin_cpu_supports("avx2");
#endif
#pragma omp parallel for if (p->n >= CPU_PAR_MIN) schedule(static)
	for (int64_t j = 0; j < N * nb; j++) {
		const int64_t n = j / nb, rb = (j % nb) * 32;
		const char *src = (const char *)a->in[0] + n * R * S * es;
		char *dst = (char *)a->out[0] + n * R * S * es;
		switch (es) {
		case 4:
#ifdef TR8
			if (avx2) {
				tr8_block((float *)dst, (const float *)src, R, S, rb, add);
				break;
			}
#endif
			if (add)
				tr_f32((float *)dst, (const float *)src, R, S, rb, 1);
			else
				tr_u32((uint32_t *)dst, (const uint32_t *)src, R, S, rb, 0);
			break;
		case 1: tr_u8((uint8_t *)dst, (const uint8_t *)src, R, S, rb, 0); break;
		case 2: tr_u16((uint16_t *)dst, (const uint16_t *)src, R, S, rb, 0); break;
		case 8: tr_u64((uint64_t *)dst, (const uint64_t *)src, R, S, rb, 0); break;
		}
	}
	return KILN_OK;
}

/* ---- prepare ----------------------------------------------------------- */

static int64_t esize(int dtype)
{
	static const int64_t s[KILN_DTYPE_COUNT] = { 4, 2, 2, 1, 1, 4, 8 };
	return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? s[dtype] : 0;
}

static kiln_status prepare_reorder(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const struct kiln_tensor_desc *x = &op->in[0], *y = &op->out[0];
	/* a conversion as well (f32 to bf16/f16): lowp.c */
	if (x->dtype != y->dtype)
		return cpu_bad(c, op, KILN_ENOTSUP, "input and output differ in dtype");
	if ((op->flags & KILN_OPF_ACCUMULATE) && x->dtype != KILN_F32)
		return cpu_bad(c, op, KILN_ENOTSUP, "accumulate is f32 only");
	p->n = cpu_numel(x);
	p->sz[3] = esize(x->dtype);
	if (x->ndim == 4 && cpu_nhwc(x) != cpu_nhwc(y)) {
		const int64_t C = x->dims[1], HW = x->dims[2] * x->dims[3];
		p->sz[0] = x->dims[0];
		p->sz[1] = cpu_nhwc(x) ? HW : C; /* source matrix [R, S] */
		p->sz[2] = cpu_nhwc(x) ? C : HW;
		if (!p->sz[1] || !p->sz[2])
			p->sz[1] = 0; /* empty: nothing to move */
	}
	p->n_in = p->n_out = 1;
	p->kernel = cpu_reorder;
	return KILN_OK;
}

kiln_status cpu_layout_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (op->type == KILN_OP_REORDER)
		return prepare_reorder(c, p);
	const int split = op->type == KILN_OP_SPLIT;
	const int parts = split ? op->n_out : op->n_in;
	const struct kiln_tensor_desc *whole = split ? &op->in[0] : &op->out[0];
	const struct kiln_tensor_desc *part = split ? op->out : op->in;
	const int d = (int)op->i[0];
	const int64_t es = esize(whole->dtype);
	if (split && op->i[1] && whole->dtype != KILN_F32)
		return cpu_bad(c, op, KILN_ENOTSUP, "accumulate is f32 only");
	int64_t sd[KILN_MAX_DIMS];
	stored_dims(whole, sd);
	const int ax = stored_axis(whole, d);
	int64_t outer = 1, inner = es;
	for (int i = 0; i < ax; i++)
		outer *= sd[i];
	for (int i = ax + 1; i < whole->ndim; i++)
		inner *= sd[i];
	p->sz[0] = outer;
	for (int k = 0; k < parts; k++)
		p->sz[1 + k] = part[k].dims[d] * inner;
	p->cols = whole->dims[d] * inner;
	p->n = cpu_numel(whole);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = cpu_concat_split;
	return KILN_OK;
}
