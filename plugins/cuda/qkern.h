/* plugins/cuda/qkern.h - the pure pieces of the INT8 ops' kernels
 * (int8_kernels.cu, qops.c): the geometry with its padding, the
 * quantization of one weight and one input, the im2col element and the
 * epilogue element.  Compiled by nvcc into the kernels, by gcc into the
 * plugin's host code, and by gcc into tests/check_cuda_host.c, which runs
 * these very functions on the host against the CPU device's QCONV and
 * QLINEAR, so the maps and roundings are checked without a GPU (as kern.h's
 * are).  Nothing here touches device memory or needs CUDA's headers.
 *
 * Rounding: the contract's (kiln/ops.h, KILN_OP_QCONV) and the CPU
 * device's: round half to even (rintf in the default rounding mode, on the
 * host and on the GPU), IEEE single products, quotients and sums.  On the
 * GPU the products and sums are __fmul_rn / __fadd_rn so that nvcc does
 * not contract them into an FMA, which the CPU's epilogue does not do.
 *
 * u8 inputs [0, 255] do not fit cuBLASLt's s8 operands: they are stored
 * as xq - 128, and the epilogue adds back 128 * sum_k wq[o,k] (exact in
 * int32 for fewer than 133,000 weights per output channel, which qops.c
 * checks).
 */
#ifndef KILN_CUDA_QKERN_H
#define KILN_CUDA_QKERN_H

#include <kiln/plugin.h> /* struct kiln_op, KILN_OP_QCONV, KILN_OPF_ACT */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define QKERN_HD static __host__ __device__ __forceinline__
#else
#define QKERN_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define QKERN_MUL(a, b) __fmul_rn((a), (b))
#define QKERN_ADD(a, b) __fadd_rn((a), (b))
#define QKERN_DIV(a, b) __fdiv_rn((a), (b))
#else
#define QKERN_MUL(a, b) ((float)(a) * (float)(b))
#define QKERN_ADD(a, b) ((float)(a) + (float)(b))
#define QKERN_DIV(a, b) ((float)(a) / (float)(b))
#endif

/* The geometry of one QCONV (QLINEAR: n = M, c = K, h = w = oh = ow = kh =
 * kw = 1, nhwc, one group). */
struct cuda_qgeom {
	int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
	int nhwc, u8, relu;
	/* padded for cuBLASLt's int8 kernels (zeros past the real sizes): a
	 * row's bytes in xq and wq (>= c/groups*kh*kw, a multiple of 16), a
	 * group's output channels in wq and acc (>= o/groups, of 4), a
	 * group's rows in xq and acc (>= n*oh*ow, of 4) */
	int64_t kp, ogp, rowsp;
	float sx; /* the input's scale, (float)f[0] */
	float r;  /* its inverse, (float)(1 / f[0]) */
};

QKERN_HD int64_t qkern_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* The op's geometry (kiln/ops.h: CONV's i[0..6]; QLINEAR's i[2..4]). */
static inline void qkern_geom(const struct kiln_op *op, struct cuda_qgeom *g)
{
	memset(g, 0, sizeof *g);
	if (op->type == KILN_OP_QCONV) {
		const int64_t *x = op->in[0].dims, *w = op->in[1].dims, *y = op->out[0].dims;
		g->n = x[0], g->c = x[1], g->h = x[2], g->w = x[3];
		g->o = w[0], g->kh = w[2], g->kw = w[3];
		g->oh = y[2], g->ow = y[3];
		g->sh = op->i[0], g->sw = op->i[1], g->ph = op->i[2], g->pw = op->i[3];
		g->dh = op->i[4], g->dw = op->i[5], g->groups = op->i[6] > 0 ? op->i[6] : 1;
		g->nhwc = op->in[0].layout == KILN_NHWC;
	} else {
		g->n = op->i[2], g->o = op->i[3], g->c = op->i[4];
		g->h = g->w = g->oh = g->ow = g->kh = g->kw = 1;
		g->sh = g->sw = g->dh = g->dw = g->groups = 1;
		g->nhwc = 1; /* y[m, n]: the channel innermost */
	}
	g->u8 = op->i[8] != 0;
	g->relu = (op->flags & KILN_OPF_ACT) != 0;
	g->kp = qkern_round_up(g->c / g->groups * g->kh * g->kw, 16);
	g->ogp = qkern_round_up(g->o / g->groups, 4);
	g->rowsp = qkern_round_up(g->n * g->oh * g->ow, 4);
	g->sx = (float)op->f[0];
	g->r = (float)(1.0 / op->f[0]);
}

/* A filter's scale from its max |w|: amax / 63, 1 for an all-zero filter. */
QKERN_HD float qkern_wscale(float amax) { return amax > 0.0f ? QKERN_DIV(amax, 63.0f) : 1.0f; }

/* One weight: round_half_even(w / sw) in [-63, 63]. */
QKERN_HD int qkern_wq(float w, float sw)
{
	return (int)fmaxf(-63.0f, fminf(63.0f, rintf(QKERN_DIV(w, sw))));
}

/* wq's row of output channel o: its group's block of ogp rows. */
QKERN_HD int64_t qkern_wrow(const struct cuda_qgeom *g, int64_t o)
{
	const int64_t og = g->o / g->groups;
	return (o / og) * g->ogp + o % og;
}

/* One input quantized: sat(round_half_even(x * r)), u8 shifted by -128. */
QKERN_HD int8_t qkern_act(float x, float r, int u8)
{
	float v = QKERN_MUL(x, r);
	v = u8 ? fminf(fmaxf(v, 0.0f), 255.0f) : fminf(fmaxf(v, -128.0f), 127.0f);
	const int q = (int)rintf(v);
	return (int8_t)(u8 ? q - 128 : q);
}

/* Element e of xq [groups][rowsp][kp]: row r = (n, p, q) the output pixel,
 * k = (c, i, j) within the group's filter.  Outside the image the input is
 * 0 (quantized: 0, or -128 shifted); past the filter (k >= per) 0, which
 * meets wq's zeros; past the rows 0, rows the epilogue never reads. */
QKERN_HD int8_t qkern_im2col(const float *x, const struct cuda_qgeom *g, int64_t e)
{
	const int64_t cg = g->c / g->groups, per = cg * g->kh * g->kw, rows = g->n * g->oh * g->ow;
	const int64_t k = e % g->kp, row = (e / g->kp) % g->rowsp, grp = e / (g->kp * g->rowsp);
	if (k >= per || row >= rows)
		return 0;
	const int64_t c = grp * cg + k / (g->kh * g->kw), i = (k / g->kw) % g->kh, j = k % g->kw;
	const int64_t q = row % g->ow, p = (row / g->ow) % g->oh, n = row / (g->ow * g->oh);
	const int64_t ih = p * g->sh - g->ph + i * g->dh, iw = q * g->sw - g->pw + j * g->dw;
	if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w)
		return g->u8 ? (int8_t)-128 : (int8_t)0;
	const int64_t at = g->nhwc ? ((n * g->h + ih) * g->w + iw) * g->c + c
				   : ((n * g->c + c) * g->h + ih) * g->w + iw;
	return qkern_act(x[at], g->r, g->u8);
}

/* Element e of y [n,o,p,q] in x's layout: act(acc * sc[o] + b[o]), acc of
 * channel o in group grp = o / (o/groups) at [grp][row][o % (o/groups)],
 * rowsp rows of ogp int32 per group, plus 128 * wsum[o] for a u8 input. */
QKERN_HD float qkern_out(const int32_t *acc, const float *sc, const int32_t *wsum, const float *b,
			 const struct cuda_qgeom *g, int64_t e)
{
	const int64_t og = g->o / g->groups;
	int64_t o, row;
	if (g->nhwc) {
		o = e % g->o;
		row = e / g->o;
	} else {
		const int64_t hw = g->oh * g->ow, n = e / (g->o * hw);
		o = (e / hw) % g->o;
		row = n * hw + e % hw;
	}
	int32_t a = acc[((o / og) * g->rowsp + row) * g->ogp + o % og];
	if (g->u8)
		a += 128 * wsum[o];
	const float v = QKERN_ADD(QKERN_MUL((float)a, sc[o]), b ? b[o] : 0.0f);
	return g->relu && v < 0.0f ? 0.0f : v;
}

#endif /* KILN_CUDA_QKERN_H */
