/* plugins/cpu/ops.c - the plain-C loop ops (with OpenMP); the fused
 * optimizers are in optim.c, a family of their own in cpu.c's dispatch.
 *
 * prepare checks the shapes once and stores the sizes in the plan; the
 * kernels then trust them.  Shapes in comments: (R, N) is R rows of N
 * contiguous f32.  Reductions split their range into a fixed number of
 * chunks independent of the thread count and add the chunk sums in order,
 * so results are bit-identical for any [run] threads (resumed runs must
 * reproduce).
 */
#include "cpu.h"
#include "v16.h"  /* cpu_v16_ok: NORMALIZE_U8's vector pass */
#include "vexp.h" /* cpu_exp: the softmax-xent's exps, vectorised */
#include "../common/norm_lut.h"   /* common_norm_lut, common_norm_avx512: the host transforms' */
#include "../common/scalar_ops.h" /* LR schedule, loss scaler, clip factor: kernels.cu's code */

#include <math.h>     /* expf, log */
#include <stdio.h>
#include <string.h>

/* ---- kernels ---------------------------------------------------------- */

/* Columns per block of a bias gradient: 32, so that the blocks of a narrow
 * dy (N = 128: a GPT's projections) still spread over the threads; a block
 * sums its columns row by row whatever its width, so the width never
 * changes a result. */
#define BIAS_COLS 32

/* Eight f32 lanes, loaded from any alignment: a full block's running sums
 * stay in registers (4 of them for BIAS_COLS) instead of a load, add and
 * store of s per row. */
typedef float cpu_f32x8 __attribute__((vector_size(32), aligned(4)));
typedef uint16_t cpu_u16x8 __attribute__((vector_size(16), aligned(2)));
typedef uint32_t cpu_u32x8 __attribute__((vector_size(32)));
_Static_assert(BIAS_COLS == 32, "col_sums' register path holds 4 x 8 columns");

/* eight bf16 to f32, exactly (the bits shifted up, as cpu_bf16_f32); a
 * macro, so no function passes a vector (gcc's -Wpsabi in the default clone) */
#define BF16X8_F32(h) ((cpu_f32x8)(__builtin_convertvector((h), cpu_u32x8) << 16))

/* The bias add, bias gradient and ReLU forward and backward, for f32 and
 * for bf16 activations (bf16 storage, f32 arithmetic, one rounding; the
 * bias and its gradient f32): one body in ops_rows.h. */
#define ROWS_T float
#define ROWS_FN(n) n##_f32
#define ROWS_LD(v) (v)
#define ROWS_ST(f) (f)
#define ROWS_LD8(p) (*(const cpu_f32x8 *)(p))
#define ROWS_PASS(y, g) ((y) > 0.0f ? (g) : 0.0f)
#include "ops_rows.h"

#define ROWS_T uint16_t
#define ROWS_FN(n) n##_bf16
#define ROWS_LD(v) cpu_bf16_f32(v)
#define ROWS_ST(f) cpu_bf16_round(f)
#define ROWS_LD8(p) BF16X8_F32(*(const cpu_u16x8 *)(p))
/* y > 0: sign clear, not zero, not NaN (0x7f80 is +inf); g masked */
#define ROWS_PASS(y, g) ((g) & (uint16_t) - (uint16_t)((int16_t)(y) > 0 && (y) <= 0x7f80))
#include "ops_rows.h"

/* Rows per tile of relu_bwd_rows_db: the tile's row spans stay in L1
 * while each block of BIAS_COLS columns' sums walks its rows in registers. */
#define RELU_DB_ROWS 16

/* Columns [j0, j1) of the ReLU's backward: dx (=|+=) m = y > 0 ? dy : 0
 * (a select, as relu_bwd_span_f32: an inf dy at y <= 0 gives 0) and db = the
 * sum over rows of m.  Tiles of RELU_DB_ROWS rows; within a tile each
 * block of 32 columns' sums (4 x 8 lanes, as col_sums_f32) is loaded from db,
 * takes the tile's rows in order and is stored back, so every column's
 * rows are added in order from 0, as col_sums_f32 adds them: db equals
 * BIAS_GRAD of the written m, bit for bit. */
CPU_CLONES static void relu_bwd_rows_db(float *restrict db, float *restrict dx,
					const float *restrict y, const float *restrict dy,
					int64_t R, int64_t N, int64_t j0, int64_t j1, int acc)
{
	const cpu_f32x8 zero = {0};
	for (int64_t j = j0; j < j1; j++)
		db[j] = 0.0f;
	for (int64_t r0 = 0; r0 < R; r0 += RELU_DB_ROWS) {
		const int64_t r1 = R - r0 < RELU_DB_ROWS ? R : r0 + RELU_DB_ROWS;
		int64_t j = j0;
		for (; j + BIAS_COLS <= j1; j += BIAS_COLS) {
			cpu_f32x8 s[4];
			memcpy(s, db + j, sizeof s);
			for (int64_t r = r0; r < r1; r++) {
				const size_t o = (size_t)(r * N + j);
				const cpu_f32x8 *yv = (const cpu_f32x8 *)(y + o);
				const cpu_f32x8 *gv = (const cpu_f32x8 *)(dy + o);
				cpu_f32x8 *xv = (cpu_f32x8 *)(dx + o);
				for (int k = 0; k < 4; k++) {
					const cpu_f32x8 m = (cpu_f32x8)((cpu_u32x8)gv[k] & (cpu_u32x8)(yv[k] > zero));
					xv[k] = acc ? xv[k] + m : m;
					s[k] += m;
				}
			}
			memcpy(db + j, s, sizeof s);
		}
		for (; j < j1; j++)
			for (int64_t r = r0; r < r1; r++) {
				const size_t o = (size_t)(r * N + j);
				const float m = y[o] > 0.0f ? dy[o] : 0.0f;
				dx[o] = acc ? dx[o] + m : m;
				db[j] += m;
			}
	}
}

/* RELU_BWD with out1 (ABI 2.9): dx (R, N) (=|+=) y > 0 ? dy : 0 and db (N)
 * = the sum over rows of that mask, in one pass: the bias gradient of the
 * layer before the ReLU.  Each thread takes a range of the
 * columns (in whole blocks of BIAS_COLS) over all rows, so the sums' order
 * never changes with the team. */
static kiln_status cpu_relu_bwd_db(const struct cpu_plan *p, const struct kiln_op_args *a,
				   struct cpu_err *e)
{
	const float *y = a->in[0], *dy = a->in[1];
	float *dx = a->out[0], *db = a->out[1];
	const int64_t R = p->rows, N = p->cols;
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	(void)e;
#pragma omp parallel if (R * N >= CPU_PAR_MIN)
	{
		const int64_t t = cpu_thread_num(), T = cpu_num_threads();
		const int64_t j0 = t ? (N * t / T) & ~(int64_t)(BIAS_COLS - 1) : 0;
		const int64_t j1 = t + 1 < T ? (N * (t + 1) / T) & ~(int64_t)(BIAS_COLS - 1) : N;
		relu_bwd_rows_db(db, dx, y, dy, R, N, j0, j1, acc);
	}
	return KILN_OK;
}


/* The fused loss: see KILN_OP_SOFTMAX_XENT in kiln/ops.h.  x (R, C) logits,
 * label (R) i32, dx (R, C) (may be x), m [2..4] metric sums.  Rows r < V =
 * i[0] are real; rows past V are padding: dx = 0, not counted.  With i[2] = 1 rows
 * labelled i[3] are ignored as padding is, and the gradient scale is
 * divided by the share of rows counted (xent_counted).  Softmax subtracts
 * the row max so exp never overflows; sums are in double. */
static int64_t xent_counted(const int32_t *label, int64_t V, int ignore, int32_t ignored)
{
	int64_t n = 0;
	for (int64_t r = 0; r < V; r++)
		n += !ignore || label[r] != ignored;
	return n;
}

/* The row loops of the cross-entropy, vectorised (`omp simd`, CPU_CLONES):
 * over the K classes of one row x of logits.  The row's largest logit: */
CPU_CLONES static float xent_max(const float *restrict x, int64_t K)
{
	float mx = x[0];
#pragma omp simd reduction(max : mx)
	for (int64_t j = 1; j < K; j++)
		mx = x[j] > mx ? x[j] : mx;
	return mx;
}

/* the first class whose logit is mx (the arg max; 0 if none, a NaN row) */
static int64_t xent_first(const float *x, int64_t K, float mx)
{
	for (int64_t j = 0; j < K; j++)
		if (x[j] == mx)
			return j;
	return 0;
}

/* the label l's rank: how many classes come before it (a larger logit, or
 * an equal one at a lower index); top-5 when below 5 */
CPU_CLONES static int64_t xent_rank(const float *restrict x, int64_t K, int64_t l)
{
	const float xl = x[l];
	int64_t above = 0;
#pragma omp simd reduction(+ : above)
	for (int64_t j = 0; j < K; j++)
		above += (x[j] > xl) | ((x[j] == xl) & (j < l));
	return above;
}

/* d[j] = e^(x[j] - mx) (vexp.h; below e^-88 it is 0); returns their sum and,
 * when xsum is not NULL, adds sum(x[j] - mx) to *xsum, both in double.  d
 * may be x: each element is read before it is written.  The exps are one
 * float loop, their sum a second over 8 double lanes (a float loop with
 * double sums stayed scalar). */
CPU_CLONES static double xent_exp(float *d, const float *x, int64_t K, float mx, double *xsum)
{
	typedef double f64x8 __attribute__((vector_size(64)));
	if (xsum) {
		double xs = 0;
		for (int64_t j = 0; j < K; j++)
			xs += (double)x[j] - mx;
		*xsum += xs;
	}
#pragma omp simd
	for (int64_t j = 0; j < K; j++) {
		const float v = x[j] - mx;
		const float e = cpu_exp(v > -88.0f ? v : -88.0f);
		/* a NaN logit stays NaN (the clamp would make it e^-88), so the
		 * loss and the gradients show it, as PyTorch's and the CUDA
		 * device's do */
		d[j] = v == v ? e : v;
	}
	f64x8 acc = { 0 };
	int64_t j = 0;
	for (; j + 8 <= K; j += 8) {
		cpu_f32x8 e;
		memcpy(&e, d + j, sizeof e);
		acc += __builtin_convertvector(e, f64x8);
	}
	double sum = 0;
	for (int l = 0; l < 8; l++)
		sum += acc[l];
	for (; j < K; j++)
		sum += d[j];
	return sum;
}

/* d[j] (the exps) = scale * (softmax - target), the target `on` at the
 * label and `off` elsewhere (label smoothing) */
CPU_CLONES static void xent_grad(float *restrict d, int64_t K, int64_t l, float scale, float inv,
				 float on, float off)
{
#pragma omp simd
	for (int64_t j = 0; j < K; j++)
		d[j] = scale * (d[j] * inv - (j == l ? on : off));
}

static kiln_status cpu_softmax_xent(const struct cpu_plan *p, const struct kiln_op_args *a,
				    struct cpu_err *e)
{
	const float *x = a->in[0];
	const int32_t *label = a->in[1];
	float *dx = a->out[0];
	float *m = a->out[1];
	const int64_t R = p->rows, C = p->cols, V = p->op.i[0];
	const int64_t K = p->op.i[5] > 0 ? p->op.i[5] : C; /* the classes; K..C-1 padding */
	const int kind = (int)p->op.i[1], top5 = p->sz[0] >= 3;
	/* with a loss scale (in2) the gradient is f[0] * s * (...): f[0] * s
	 * rounded once, so s = 1 changes nothing */
	const int ignore = p->op.i[2] == 1;
	const int32_t ignored = (int32_t)p->op.i[3];
	const int64_t counted = xent_counted(label, V, ignore, ignored);
	const double f0 = counted && counted != V ? p->op.f[0] * (double)V / (double)counted
						    : p->op.f[0];
	const float scale = p->op.n_in == 3 ? (float)(f0 * *(const float *)a->in[2]) : (float)f0;
	const float eps = (float)p->op.f[1];
	const int nch = V < CPU_CHUNKS ? (int)(V > 0 ? V : 1) : CPU_CHUNKS;
	double loss[CPU_CHUNKS] = { 0 }, ok[CPU_CHUNKS] = { 0 }, ok5[CPU_CHUNKS] = { 0 };
	int64_t bad[CPU_CHUNKS];

#pragma omp parallel for if (V * C >= CPU_PAR_MIN) schedule(static)
	for (int ch = 0; ch < nch; ch++) {
		const int64_t r0 = V * ch / nch, r1 = V * (ch + 1) / nch;
		bad[ch] = -1;
		for (int64_t r = r0; r < r1; r++) {
			const float *xr = x + r * C;
			float *dr = dx + r * C;
			const int32_t l = label[r];
			if (ignore && l == ignored) {
				memset(dr, 0, (size_t)C * sizeof *dr);
				continue;
			}
			if (l < 0 || l >= K) {
				if (bad[ch] < 0)
					bad[ch] = r;
				memset(dr, 0, (size_t)C * sizeof *dr);
				continue;
			}
			const float mx = xent_max(xr, K);
			const int64_t am = xent_first(xr, K, mx), above = xent_rank(xr, K, l);
			if (K < C) /* padded classes: no gradient */
				memset(dr + K, 0, (size_t)(C - K) * sizeof *dr);
			ok[ch] += am == l;
			ok5[ch] += above < 5;
			if (kind == KILN_LOSS_MSE) {
				double ls = 0;
				for (int64_t j = 0; j < K; j++) {
					const float d = xr[j] - (j == l ? 1.0f : 0.0f);
					ls += (double)d * d;
					dr[j] = scale * 2.0f * d / (float)K;
				}
				loss[ch] += ls / (double)K;
				continue;
			}
			if (kind == KILN_LOSS_BCE) {
				double ls = 0;
				for (int64_t j = 0; j < K; j++) {
					const float v = xr[j], t = j == l ? 1.0f : 0.0f;
					ls += (v > 0 ? v : 0) - v * t + log1p(exp(-fabs((double)v)));
					const float sg = v >= 0 ? 1.0f / (1.0f + expf(-v))
								: expf(v) / (1.0f + expf(v));
					dr[j] = scale * (sg - t) / (float)K;
				}
				loss[ch] += ls / (double)K;
				continue;
			}
			/* dr may be xr (ABI 2.4): each logit is read before
			 * its gradient is written, the label's first */
			const float xl = xr[l];
			double xsum = 0;
			const double sum = xent_exp(dr, xr, K, mx, eps > 0 ? &xsum : NULL);
			const float off = eps / (float)K, on = 1.0f - eps + off;
			xent_grad(dr, K, l, scale, (float)(1.0 / sum), on, off);
			const double lse = log(sum);
			loss[ch] += (1.0 - eps) * (lse - ((double)xl - mx)) +
				    (eps > 0 ? eps * (lse - xsum / (double)K) : 0.0);
		}
	}
	if (R > V && V >= 0)
		memset(dx + V * C, 0, (size_t)((R - V) * C) * sizeof *dx);
	for (int ch = 0; ch < nch; ch++)
		if (bad[ch] >= 0)
			return cpu_fail(e, KILN_EDATA,
					"cpu: SOFTMAX_XENT: label %d of row %lld is outside [0, %lld)",
					(int)label[bad[ch]], (long long)bad[ch], (long long)K);
	double ls = 0, os = 0, o5 = 0;
	for (int ch = 0; ch < nch; ch++) {
		ls += loss[ch];
		os += ok[ch];
		o5 += ok5[ch];
	}
	if (p->op.i[4] > 0) { /* M times the means over the rows counted */
		const double k = counted ? (double)p->op.i[4] / (double)counted : 0.0;
		ls *= k, os *= k, o5 *= k;
	}
	m[0] = (float)(m[0] + ls);
	m[1] = (float)(m[1] + os);
	if (top5)
		m[2] = (float)(m[2] + o5);
	if (p->sz[0] >= 4)
		m[3] = (float)(m[3] + (double)counted);
	return KILN_OK;
}

/* See KILN_OP_CAST in plugin.h: f32 to or from bf16 or f16. */
static kiln_status cpu_cast(const struct cpu_plan *p, const struct kiln_op_args *a,
			    struct cpu_err *e)
{
	(void)e;
	if (p->op.in[0].dtype != KILN_F32)
		cpu_cvt_to_f32(a->out[0], a->in[0], p->op.in[0].dtype, p->n);
	else
		cpu_cvt_from_f32(a->out[0], a->in[0], p->op.out[0].dtype, p->n);
	return KILN_OK;
}

/* See KILN_OP_GRAD_CLIP in plugin.h. */
CPU_CLONES static double sumsq_span(const float *g, int64_t n, float mul)
{
	/* f32 lanes over blocks of 1024 (vectorised), blocks summed in double:
	 * the order is fixed by n alone.  Each element is multiplied by `mul`
	 * (UNSCALE's 1/s) before squaring; GRAD_CLIP's mul = 1 skips the
	 * multiply (g * 1 is g exactly: the same sums bit for bit). */
	double acc = 0;
	for (int64_t b = 0; b < n; b += 1024) {
		const int64_t e = b + 1024 < n ? b + 1024 : n;
		float part = 0;
		if (mul == 1.0f) {
#pragma omp simd reduction(+ : part)
			for (int64_t i = b; i < e; i++)
				part += g[i] * g[i];
		} else {
#pragma omp simd reduction(+ : part)
			for (int64_t i = b; i < e; i++) {
				const float v = g[i] * mul;
				part += v * v;
			}
		}
		acc += part;
	}
	return acc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SUMSQ_X4 1
/* sumsq_span's avx2 and avx512f clones, bit for bit, four blocks at a
 * time.  A clone keeps one W-lane f32 sum per 1024-element block (W = 8
 * on AVX2, 16 on AVX-512; lane l takes the block's elements l, l + W,
 * ...; a short last block's len % W last elements, or all of a block
 * under W, go into lane 0 in order), each element squared rounded and
 * then added (vmulps, vaddps), adds the lanes 0..W-1 in f32 from 0 and
 * the blocks in double: one chain of vaddps (3 cycles on AVX2, 4 on
 * AVX-512) a block, so a core read the gradients at about half what the
 * cache gives (AVX-512: 16 bytes a cycle, GRAD_CLIP's pass at 36 GB/s
 * from the core's own cache, 44 us of the MLP's fc1 gradients).  Four
 * blocks' chains side by side are the same sums with four additions in
 * flight (tests/check_device_optim: test_grad_clip_order, 8 and 16
 * lanes).  x * 1.0f is x, so one loop serves GRAD_CLIP's mul = 1 and
 * UNSCALE's 1/s.  No FMA: the avx2 target has none, and avx512f's is
 * never used: -ffp-contract=off (configure.ac) fuses no multiply-add in
 * any clone or here.  AVX2 since session 20, AVX-512 since session 44;
 * one macro writes both since session 45 (the same code at B = 256, 512
 * bits: _mm256_* / _mm512_* and __m256 / __m512).
 *
 * SUMSQ_X4_ISA(B, isa) defines, for target `isa` with B-bit vectors:
 *   sumsq_lanes_<isa>(v): v's B / 32 lanes added 0.. in f32;
 *   sumsq_block4_<isa>(g, mul, out): out[j] = the f32 sum of the whole
 *     block at g + 1024 j, j = 0..3;
 *   sumsq_block1_<isa>(g, len, mul): the f32 sum of one block of len <=
 *     1024 (a short one's len % W last elements into lane 0);
 *   sumsq_parts_x4_<isa>(g, n, k0, k1, mul, bp): bp[k] = block k's f32
 *     sum, blocks [k0, k1) of g[0, n). */
#define SUMSQ_X4_ISA(B, isa)                                                                       \
	__attribute__((target(#isa))) static inline float sumsq_lanes_##isa(__m##B v)              \
	{                                                                                          \
		float l[B / 32], part = 0;                                                         \
		_mm##B##_storeu_ps(l, v);                                                          \
		for (int k = 0; k < B / 32; k++)                                                   \
			part += l[k];                                                              \
		return part;                                                                       \
	}                                                                                          \
                                                                                                   \
	__attribute__((target(#isa))) static inline void sumsq_block4_##isa(const float *g,        \
									   float mul, float out[4])  \
	{                                                                                          \
		const __m##B m = _mm##B##_set1_ps(mul);                                            \
		__m##B s0 = _mm##B##_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                      \
		for (int64_t i = 0; i < 1024; i += B / 32) {                                       \
			const __m##B v0 = _mm##B##_mul_ps(_mm##B##_loadu_ps(g + i), m);            \
			const __m##B v1 = _mm##B##_mul_ps(_mm##B##_loadu_ps(g + i + 1024), m);     \
			const __m##B v2 = _mm##B##_mul_ps(_mm##B##_loadu_ps(g + i + 2048), m);     \
			const __m##B v3 = _mm##B##_mul_ps(_mm##B##_loadu_ps(g + i + 3072), m);     \
			s0 = _mm##B##_add_ps(s0, _mm##B##_mul_ps(v0, v0));                         \
			s1 = _mm##B##_add_ps(s1, _mm##B##_mul_ps(v1, v1));                         \
			s2 = _mm##B##_add_ps(s2, _mm##B##_mul_ps(v2, v2));                         \
			s3 = _mm##B##_add_ps(s3, _mm##B##_mul_ps(v3, v3));                         \
		}                                                                                  \
		out[0] = sumsq_lanes_##isa(s0);                                                    \
		out[1] = sumsq_lanes_##isa(s1);                                                    \
		out[2] = sumsq_lanes_##isa(s2);                                                    \
		out[3] = sumsq_lanes_##isa(s3);                                                    \
	}                                                                                          \
                                                                                                   \
	__attribute__((target(#isa))) static inline float sumsq_block1_##isa(const float *g,       \
									    int64_t len, float mul) \
	{                                                                                          \
		const __m##B m = _mm##B##_set1_ps(mul);                                            \
		__m##B s = _mm##B##_setzero_ps();                                                  \
		int64_t i = 0;                                                                     \
		for (; i + B / 32 <= len; i += B / 32) {                                           \
			const __m##B v = _mm##B##_mul_ps(_mm##B##_loadu_ps(g + i), m);             \
			s = _mm##B##_add_ps(s, _mm##B##_mul_ps(v, v));                             \
		}                                                                                  \
		float l[B / 32], part = 0;                                                         \
		_mm##B##_storeu_ps(l, s);                                                          \
		for (; i < len; i++) {                                                             \
			const float v = g[i] * mul;                                                \
			l[0] += v * v;                                                             \
		}                                                                                  \
		for (int k = 0; k < B / 32; k++)                                                   \
			part += l[k];                                                              \
		return part;                                                                       \
	}                                                                                          \
                                                                                                   \
	__attribute__((target(#isa))) static void sumsq_parts_x4_##isa(                            \
		const float *g, int64_t n, int64_t k0, int64_t k1, float mul, float *bp)           \
	{                                                                                          \
		int64_t k = k0;                                                                    \
		for (; k + 4 <= k1 && (k + 4) * 1024 <= n; k += 4)                                 \
			sumsq_block4_##isa(g + k * 1024, mul, bp + k);                             \
		for (; k < k1; k++)                                                                \
			bp[k] = sumsq_block1_##isa(g + k * 1024,                                   \
						   (k + 1) * 1024 < n ? 1024 : n - k * 1024, mul); \
	}
SUMSQ_X4_ISA(256, avx2)
SUMSQ_X4_ISA(512, avx512f)
#endif

/* bp[k] = the f32 sum sumsq_span adds for block k (elements 1024 k to
 * 1024 k + 1023, or n), blocks [k0, k1): the same sums, block by block */
static void sumsq_parts(const float *g, int64_t n, int64_t k0, int64_t k1, float mul, float *bp)
{
#ifdef SUMSQ_X4
	if (__builtin_cpu_supports("avx512f")) {
		sumsq_parts_x4_avx512f(g, n, k0, k1, mul, bp);
		return;
	}
	if (__builtin_cpu_supports("avx2")) {
		sumsq_parts_x4_avx2(g, n, k0, k1, mul, bp);
		return;
	}
#endif
	for (int64_t k = k0; k < k1; k++) /* one block: its sum in double is the f32 one */
		bp[k] = (float)sumsq_span(g + k * 1024, (k + 1) * 1024 < n ? 1024 : n - k * 1024, mul);
}

/* The sum of squares of the n <= 1024 elements of one block of g * mul in
 * double, for a block whose f32 sum is not finite: NaN or inf where an
 * element is, finite where finite elements' squares overflowed f32 (|v|
 * above ~1.8e19): the non-finite verdict is the elements', as
 * GradScaler's found_inf (before session 39 such finite gradients skipped
 * the step as non-finite). */
static double sumsq_block_wide(const float *g, int64_t n, float mul)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++) {
		const float v = g[i] * mul;
		s += (double)v * v;
	}
	return s;
}

enum { SUMSQ_BLK = 1024, SUMSQ_CHB = 64 }; /* a block's elements; a chunk's blocks */

/* bp[k] for blocks [k0, k1) of g[0, n), split evenly over the team */
static void sumsq_parts_team(const float *g, int64_t n, int64_t k0, int64_t k1, float mul,
			     float *bp)
{
	const int64_t kn = k1 - k0;
	const int64_t hi = k1 * SUMSQ_BLK < n ? k1 * SUMSQ_BLK : n;
#pragma omp parallel if (hi - k0 * SUMSQ_BLK >= CPU_PAR_MIN)
	{
		const int64_t t = cpu_thread_num(), T = cpu_num_threads();
		sumsq_parts(g, n, k0 + kn * t / T, k0 + kn * (t + 1) / T, mul, bp);
	}
}

/* total += the chunks of blocks [0, kn) of g[0, len), bp[k] block k's f32
 * sum (kn a multiple of SUMSQ_CHB, or the last blocks) */
static void sumsq_chunks_add(const float *g, int64_t len, int64_t kn, const float *bp, float mul,
			     double *total)
{
	for (int64_t c = 0; c < kn; c += SUMSQ_CHB) {
		double acc = 0;
		for (int64_t k = c; k < kn && k < c + SUMSQ_CHB; k++)
			acc += isfinite(bp[k]) ? bp[k]
					       : sumsq_block_wide(g + k * SUMSQ_BLK,
								  len - k * SUMSQ_BLK < SUMSQ_BLK ? len - k * SUMSQ_BLK
												  : SUMSQ_BLK,
								  mul);
		*total += acc;
	}
}

/* The squared norm of g * mul over n elements, in the order the tests
 * spell out (check_device_optim: cpu_norm_order): blocks of 1024 summed in
 * f32 (sumsq_span's lanes), the blocks of each 65536-element chunk added
 * in double, then the chunks in order.  The order depends on n alone, not
 * on the thread count.  Rounds of RND blocks (8M elements): a round's
 * block sums split evenly over the team (9 chunks of the MLP's 535k
 * parameters gave one thread 5 when the team split chunks), then its
 * chunks are added in order on one thread.  Before session 21 a tensor
 * above 64M elements took chunks of n / 1024 + 1 elements, no multiple of
 * 1024: its blocks and chunks (and so its bits) left that order.  A
 * round's sums (32 KiB) go on the heap, once a call; up to 2M elements,
 * or without the memory, rounds of SMALL blocks take them on the stack
 * (8 KiB): the round size moves no bit (chunks never straddle a round),
 * and a large tensor keeps its few parallel regions (before session 36
 * the 32 KiB were on the stack, past configure.ac's KILN_FRAME_CFLAGS).
 * A block whose f32 sum is not finite is summed again in double
 * (sumsq_block_wide): the result is finite exactly when every element is. */
static double grad_sumsq(const float *g, int64_t n, float mul)
{
	/* RND and SMALL multiples of SUMSQ_CHB */
	enum { BLK = SUMSQ_BLK, RND = 8192, SMALL = 2048 };
	const int64_t nb = (n + BLK - 1) / BLK;
	float small[SMALL], *big = nb > SMALL ? malloc(RND * sizeof *big) : NULL;
	float *bp = big ? big : small;
	const int64_t rnd = big ? RND : SMALL;
	double total = 0;
	for (int64_t k0 = 0; k0 < nb; k0 += rnd) {
		const int64_t kn = nb - k0 < rnd ? nb - k0 : rnd;
		const int64_t len = n - k0 * BLK < kn * BLK ? n - k0 * BLK : kn * BLK;
		const float *gr = g + k0 * BLK;
		sumsq_parts_team(gr, len, 0, kn, mul, bp);
		sumsq_chunks_add(gr, len, kn, bp, mul, &total);
	}
	free(big);
	return total;
}

/* GRAD_SUMSQ (see kiln/ops.h): grad_sumsq's block sums over blocks
 * [i[1], i[2]), the same function on the same blocks (their sums depend on
 * the block alone), so GRAD_CLIP given them adds the same bits. */
static kiln_status cpu_grad_sumsq(const struct cpu_plan *p, const struct kiln_op_args *a,
				  struct cpu_err *e)
{
	(void)e;
	if (p->op.i[2] > p->op.i[1])
		sumsq_parts_team(a->in[0], p->op.i[0], p->op.i[1], p->op.i[2], 1.0f, a->out[0]);
	return KILN_OK;
}

CPU_CLONES static void clip_span(float *y, const float *g, int64_t n, float scale, float lim)
{
	for (int64_t i = 0; i < n; i++) {
		float v = g[i] * scale;
		if (lim > 0)
			v = v > lim ? lim : v < -lim ? -lim : v;
		y[i] = v;
	}
}

/* GRAD_CLIP, and UNSCALE (see plugin.h): the same pass over the gradients
 * multiplied by inv = 1/s, the loss scale read from in1[0] (1 for
 * GRAD_CLIP, so both give bit-identical results at s = 1). */
static kiln_status cpu_grad_clip(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	const float *g = a->in[0];
	float *y = a->out[0], *state = a->out[1];
	const int64_t n = p->n;
	const double max_norm = p->op.f[0], lim = p->op.f[1];
	const float inv = p->op.type == KILN_OP_UNSCALE ? 1.0f / *(const float *)a->in[1] : 1.0f;
	(void)e;
	float scale;
	double ss = 0;
	if (p->op.type == KILN_OP_GRAD_CLIP && p->op.n_in == 2) /* GRAD_SUMSQ's block sums */
		sumsq_chunks_add(g, n, (n + SUMSQ_BLK - 1) / SUMSQ_BLK, a->in[1], 1.0f, &ss);
	else
		ss = grad_sumsq(g, n, inv);
	if (!common_clip_factor(state, ss, max_norm, inv, &scale))
		return KILN_OK; /* not finite: the gradients stay as they are */
	if (scale != 1.0f || lim > 0 || y != g)
		CPU_SPANS(n, b, en, clip_span(y + b, g + b, en - b, scale, (float)lim));
	return KILN_OK;
}

/* The loss scale after a step: see KILN_OP_SCALER_UPDATE in plugin.h.
 * gate f32[4] (GRAD_CLIP's: [1] finite flag), st f32[4] (scale, growth
 * tracker, hysteresis left, overflows), one thread: four scalars. */
static kiln_status cpu_scaler_update(const struct cpu_plan *p, const struct kiln_op_args *a,
				     struct cpu_err *e)
{
	(void)e;
	common_scaler_update(a->out[0], a->in[0], p->op.f[0], p->op.f[1], p->op.f[2], p->op.f[3],
			     p->op.i[0], p->op.i[1]);
	return KILN_OK;
}

/* lr f32[1] = schedule(step i64[1]): see KILN_OP_LR_SCHEDULE in plugin.h */
static kiln_status cpu_lr_schedule(const struct cpu_plan *p, const struct kiln_op_args *a,
				   struct cpu_err *e)
{
	(void)e;
	const double lr = common_lr_schedule(*(const int64_t *)a->in[0], p->op.i, p->op.f);
	*(float *)a->out[0] = (float)lr;
	return KILN_OK;
}

/* counter (i64[1]) += i[0]: the trainer's micro-step count; gated, the
 * optimizer's step count (a skipped step is not counted) */
static kiln_status cpu_counter_add(const struct cpu_plan *p, const struct kiln_op_args *a,
				   struct cpu_err *e)
{
	(void)e;
	if (cpu_optim_gated_off(p, a))
		return KILN_OK;
	*(int64_t *)a->out[0] += p->op.i[0];
	return KILN_OK;
}

/* y (n, any dtype) = f[0], converted to the dtype (integers truncate). */
static kiln_status cpu_fill(const struct cpu_plan *p, const struct kiln_op_args *a,
			    struct cpu_err *e)
{
	const double v = p->op.f[0];
	const int64_t n = p->n;
	void *y = a->out[0];
	switch (p->op.out[0].dtype) {
	case KILN_F32: {
		float *t = y;
		const float x = (float)v;
#pragma omp parallel for if (n >= CPU_PAR_MIN) schedule(static)
		for (int64_t i = 0; i < n; i++)
			t[i] = x;
		break;
	}
	case KILN_I32: {
		int32_t *t = y;
		const int32_t x = (int32_t)v;
		for (int64_t i = 0; i < n; i++)
			t[i] = x;
		break;
	}
	case KILN_I64: {
		int64_t *t = y;
		const int64_t x = (int64_t)v;
		for (int64_t i = 0; i < n; i++)
			t[i] = x;
		break;
	}
	case KILN_U8:
		memset(y, (uint8_t)v, (size_t)n);
		break;
	case KILN_I8:
		memset(y, (uint8_t)(int8_t)v, (size_t)n);
		break;
	case KILN_BF16:
	case KILN_F16: {
		uint16_t *t = y, x = 0;
		if (p->op.out[0].dtype == KILN_BF16) {
			x = cpu_bf16_round((float)v);
		} else {
			_Float16 h = (_Float16)v;
			memcpy(&x, &h, sizeof x);
		}
		for (int64_t i = 0; i < n; i++)
			t[i] = x;
		break;
	}
	}
	return KILN_OK;
}

/* s [1] (=|+=) sum of x (n), in f64 over fixed chunks. */
static kiln_status cpu_reduce_sum(const struct cpu_plan *p, const struct kiln_op_args *a,
				  struct cpu_err *e)
{
	const float *x = a->in[0];
	float *s = a->out[0];
	const int64_t n = p->n;
	double part[CPU_CHUNKS] = { 0 };
#pragma omp parallel for if (n >= CPU_PAR_MIN) schedule(static)
	for (int ch = 0; ch < CPU_CHUNKS; ch++) {
		double t = 0;
		for (int64_t i = n * ch / CPU_CHUNKS; i < n * (ch + 1) / CPU_CHUNKS; i++)
			t += x[i];
		part[ch] = t;
	}
	double t = p->op.flags & KILN_OPF_ACCUMULATE ? s[0] : 0.0;
	for (int ch = 0; ch < CPU_CHUNKS; ch++)
		t += part[ch];
	s[0] = (float)t;
	return KILN_OK;
}

/* The three elementwise vector ops share one span kernel by kind. */
enum { VEC_SCALE, VEC_ADD, VEC_MUL };

CPU_CLONES static void vec_span(float *y, const float *x0, const float *x1, float s, int64_t n,
				int kind, int acc)
{
	switch (kind * 2 + acc) {
	case VEC_SCALE * 2:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = s * x0[i];
		break;
	case VEC_SCALE * 2 + 1:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] += s * x0[i];
		break;
	case VEC_ADD * 2:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = x0[i] + x1[i];
		break;
	case VEC_ADD * 2 + 1:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] += x0[i] + x1[i];
		break;
	case VEC_MUL * 2:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] = x0[i] * x1[i];
		break;
	default:
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			y[i] += x0[i] * x1[i];
		break;
	}
}

/* A low-precision operand of a vector op, widened block by block. */
static const float *vec_lp_in(float *buf, const void *x, int dtype, int64_t b, int64_t n)
{
	if (dtype == KILN_F32)
		return (const float *)x + b;
	const size_t es = 2;
	cpu_cvt_to_f32_span(buf, (const char *)x + (size_t)b * es, dtype, n);
	return buf;
}

/* bf16/f16 operands (any mix with f32): f32 arithmetic over blocks of 512
 * widened on the stack, the result rounded once.  y may alias an input:
 * a block is read whole before it is written. */
static void vec_lp_span(const struct cpu_plan *p, const struct kiln_op_args *a, int kind,
			int64_t b, int64_t e)
{
	enum { BLK = 512 };
	float bx0[BLK], bx1[BLK], by[BLK];
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	const int dy = p->op.out[0].dtype;
	const float s = (float)p->op.f[0];
	for (int64_t q = b; q < e; q += BLK) {
		const int64_t n = e - q < BLK ? e - q : BLK;
		const float *x0 = vec_lp_in(bx0, a->in[0], p->op.in[0].dtype, q, n);
		const float *x1 = kind == VEC_SCALE ? NULL
						    : vec_lp_in(bx1, a->in[1], p->op.in[1].dtype, q, n);
		float *y = by;
		if (dy == KILN_F32)
			y = (float *)a->out[0] + q;
		else if (acc)
			cpu_cvt_to_f32_span(by, (const uint16_t *)a->out[0] + q, dy, n);
		vec_span(y, x0, x1, s, n, kind, acc);
		if (dy != KILN_F32)
			cpu_cvt_span_from_f32((uint16_t *)a->out[0] + q, by, dy, n);
	}
}

/* ADD's u8 output (kiln/ops.h, ABI 2.10): the sum, its ReLU and the
 * quantization by r = 1 / so in one pass; the same f32 steps as ADD,
 * RELU and QCONV's quantizing reorder (x * r, round half to even,
 * saturated), so the same bytes. */
CPU_CLONES static void add_u8_span(uint8_t *restrict y, const float *restrict x0,
				   const float *restrict x1, float r, int64_t n)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		float v = (x0[i] + x1[i]) * r;
		v = v > 0.0f ? v : 0.0f; /* NaN: 0 */
		v = v < 255.0f ? v : 255.0f;
		y[i] = (uint8_t)nearbyintf(v);
	}
}

static kiln_status cpu_add_u8(const struct cpu_plan *p, const struct kiln_op_args *a,
			      struct cpu_err *e)
{
	(void)e;
	const float *x0 = a->in[0], *x1 = a->in[1];
	uint8_t *y = a->out[0];
	const float r = (float)(1.0 / p->op.f[0]);
	CPU_SPANS(p->n, b, en, add_u8_span(y + b, x0 + b, x1 + b, r, en - b));
	return KILN_OK;
}

static kiln_status cpu_vec(const struct cpu_plan *p, const struct kiln_op_args *a, int kind)
{
	const float *x0 = a->in[0], *x1 = a->in[1];
	float *y = a->out[0];
	const float s = (float)p->op.f[0];
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	if (cpu_op_lowp(&p->op)) {
		CPU_SPANS(p->n, b, en, vec_lp_span(p, a, kind, b, en));
		return KILN_OK;
	}
	CPU_SPANS(p->n, b, en,
		  vec_span(y + b, x0 + b, x1 ? x1 + b : NULL, s, en - b, kind, acc));
	return KILN_OK;
}

/* y (n) (=|+=) f[0] * x (n); y may alias x. */
static kiln_status cpu_scale(const struct cpu_plan *p, const struct kiln_op_args *a,
			     struct cpu_err *e)
{
	(void)e;
	return cpu_vec(p, a, VEC_SCALE);
}

/* y f32 [N, C, H, W] = (x u8 / 255 - mean[c]) / std[c], NCHW or NHWC;
 * rows = N * C planes of cols = H * W (NCHW), or N * H * W pixels of C. */
CPU_CLONES static void norm_u8_span(float *y, const uint8_t *x, int64_t n, const float *lut)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = lut[x[i]];
}

/* Elements [b, e) of NORMALIZE_U8 with C planes of hw (NCHW; C = 1 for a
 * one-channel NHWC): each plane's piece with its channel's table (and
 * mean, std for the vector pass). */
static void norm_u8_range(const struct cpu_plan *p, float *y, const uint8_t *x, int64_t b,
			  int64_t e, float (*lut)[256])
{
	const int64_t C = p->sz[0], hw = p->sz[1];
	for (int64_t i = b; i < e;) {
		const int64_t q = i / hw, end = (q + 1) * hw < e ? (q + 1) * hw : e;
		const int c = (int)(q % C);
#if CPU_HAVE_V16 && defined(COMMON_NORM_AVX512)
		if (cpu_v16_ok()) {
			/* 16 pixels a step, bit-equal to the table (norm_lut.h) */
			common_norm_avx512(y + i, x + i, end - i, (float)p->op.f[c],
					   (float)p->op.f[3 + c]);
			i = end;
			continue;
		}
#endif
		norm_u8_span(y + i, x + i, end - i, lut[c]);
		i = end;
	}
}

static kiln_status cpu_normalize_u8(const struct cpu_plan *p, const struct kiln_op_args *a,
				    struct cpu_err *e)
{
	(void)e;
	const uint8_t *x = a->in[0];
	float *y = a->out[0];
	const int64_t C = p->sz[0];
	const int nhwc = p->op.in[0].layout == KILN_NHWC;
	float lut[3][256];
	for (int c = 0; c < C; c++)
		common_norm_lut(lut[c], (float)p->op.f[c], (float)p->op.f[3 + c]);
	if (!nhwc || C == 1) {
		/* split by elements, not planes: a batch of 128 MNIST images
		 * (128 planes) was under CPU_PAR_MIN and ran on one thread */
		CPU_SPANS(p->n, b, en, norm_u8_range(p, y, x, b, en, lut));
	} else {
		CPU_SPANS(p->n / C, b, en, for (int64_t q = b; q < en; q++)
			  for (int64_t c = 0; c < C; c++)
				  y[q * C + c] = lut[c][x[q * C + c]]);
	}
	return KILN_OK;
}

/* y (n) (=|+=) x0 (n) + x1 (n); y may alias either input. */
static kiln_status cpu_add(const struct cpu_plan *p, const struct kiln_op_args *a,
			   struct cpu_err *e)
{
	(void)e;
	return cpu_vec(p, a, VEC_ADD);
}

/* y (n) (=|+=) x0 (n) * x1 (n); y may alias either input. */
static kiln_status cpu_mul(const struct cpu_plan *p, const struct kiln_op_args *a,
			   struct cpu_err *e)
{
	(void)e;
	return cpu_vec(p, a, VEC_MUL);
}

/* ---- prepare ---------------------------------------------------------- */

kiln_status cpu_bad(struct cpu_ctx *c, const struct kiln_op *op, kiln_status st,
			   const char *why)
{
	char list[640];
	return c->host->error(st, "cpu: %s: %s (%s)", cpu_op_name(op->type), why,
			      common_op_tensors(op, list, sizeof list));
}

int cpu_all_f32(const struct kiln_op *op)
{
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].dtype != KILN_F32)
			return 0;
	for (int i = 0; i < op->n_out; i++)
		if (op->out[i].dtype != KILN_F32)
			return 0;
	return 1;
}

kiln_status cpu_ops_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	/* The core checked the op's counts, shapes and parameters
	 * (core/opcheck.c): here the kernel, the sizes, and what this device
	 * cannot run (KILN_ENOTSUP). */
	const struct kiln_op *op = &p->op;

	switch (op->type) {
	case KILN_OP_BIAS_ADD: p->kernel = cpu_bias_add_f32; break;
	case KILN_OP_BIAS_GRAD: p->kernel = cpu_bias_grad_f32; break;
	case KILN_OP_RELU: p->kernel = cpu_relu_f32; break;
	case KILN_OP_RELU_BWD: p->kernel = cpu_relu_bwd_f32; break;
	case KILN_OP_SOFTMAX_XENT: p->kernel = cpu_softmax_xent; break;
	case KILN_OP_GRAD_CLIP:
	case KILN_OP_UNSCALE: p->kernel = cpu_grad_clip; break;
	case KILN_OP_GRAD_SUMSQ: p->kernel = cpu_grad_sumsq; break;
	case KILN_OP_SCALER_UPDATE: p->kernel = cpu_scaler_update; break;
	case KILN_OP_FILL: p->kernel = cpu_fill; break;
	case KILN_OP_COUNTER_ADD: p->kernel = cpu_counter_add; break;
	case KILN_OP_LR_SCHEDULE: p->kernel = cpu_lr_schedule; break;
	case KILN_OP_REDUCE_SUM: p->kernel = cpu_reduce_sum; break;
	case KILN_OP_SCALE: p->kernel = cpu_scale; break;
	case KILN_OP_ADD: p->kernel = cpu_add; break;
	case KILN_OP_MUL: p->kernel = cpu_mul; break;
	case KILN_OP_NORMALIZE_U8: p->kernel = cpu_normalize_u8; break;
	case KILN_OP_CAST: p->kernel = cpu_cast; break;
	default:
		return c->host->error(KILN_ENOTSUP, "cpu: unknown op type %d", op->type);
	}
	COMMON_PLAN_SIZES(p, op);
	if (op->type == KILN_OP_RELU_BWD && op->n_out == 2) { /* + the bias gradient */
		if (!cpu_all_f32(op))
			return cpu_bad(c, op, KILN_ENOTSUP, "the bias gradient in the ReLU's pass is f32 only");
		p->kernel = cpu_relu_bwd_db;
		p->cols = common_numel(&op->out[1]);
		p->rows = p->n / p->cols;
		return KILN_OK;
	}

	switch (op->type) {
	case KILN_OP_LR_SCHEDULE:
	case KILN_OP_COUNTER_ADD:
	case KILN_OP_FILL:
	case KILN_OP_CAST:
		return KILN_OK;
	case KILN_OP_SOFTMAX_XENT:
		if (op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32)
			return cpu_bad(c, op, KILN_ENOTSUP, "needs f32 logits and gradient");
		p->sz[0] = common_numel(&op->out[1]); /* 3: also count top-5; 4: rows */
		return KILN_OK;
	case KILN_OP_NORMALIZE_U8:
		if (op->out[0].dtype != KILN_F32)
			return cpu_bad(c, op, KILN_ENOTSUP, "writes f32");
		p->sz[0] = op->in[0].dims[1];
		p->sz[1] = op->in[0].dims[2] * op->in[0].dims[3];
		return KILN_OK;
	}
	if (op->type == KILN_OP_ADD && op->out[0].dtype == KILN_U8) { /* the core checked f32 in */
		p->kernel = cpu_add_u8;
		return KILN_OK;
	}
	/* bf16 loops of their own: ReLU forward and backward, the bias add
	 * (an f32 bias into bf16 rows), the bias gradient (bf16 rows summed
	 * into f32); every other bf16 op goes through
	 * lowp.c (ENOTSUP here sends it there) */
	if (!cpu_all_f32(op)) {
		const int bf = op->out[0].dtype == KILN_BF16;
		const int vec = op->type == KILN_OP_SCALE || op->type == KILN_OP_ADD ||
				op->type == KILN_OP_MUL;
		int ok = 0;
		if (op->type == KILN_OP_RELU)
			ok = bf && op->in[0].dtype == KILN_BF16, p->kernel = cpu_relu_bf16;
		else if (op->type == KILN_OP_RELU_BWD)
			ok = bf && op->in[0].dtype == KILN_BF16 && op->in[1].dtype == KILN_BF16,
			p->kernel = cpu_relu_bwd_bf16;
		else if (op->type == KILN_OP_BIAS_ADD)
			ok = bf && op->in[0].dtype == KILN_F32, p->kernel = cpu_bias_add_bf16;
		else if (op->type == KILN_OP_BIAS_GRAD)
			ok = op->in[0].dtype == KILN_BF16 && op->out[0].dtype == KILN_F32,
			p->kernel = cpu_bias_grad_bf16;
		else if (vec) /* any mix of f32, bf16 and f16: blocked in vec_lp_span */
			ok = 1;
		if (!ok)
			return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	}

	/* every op the table above knows has its extents set */
	return KILN_OK;
}
