/* plugins/cpu/bn.c - batch normalisation (KILN_OP_BN_TRAIN, BN_INFER,
 * BN_BWD, and SyncBatchNorm's BN_STATS, BN_APPLY, BN_BWD_REDUCE,
 * BN_BWD_APPLY) as C loops with PyTorch's exact semantics.
 *
 * Per channel c over the M = N*H*W elements x_i of that channel:
 *   mean = sum(x)/M,  var = sum((x - mean)^2)/M          (biased, normalises)
 *   invstd = 1/sqrt(var + eps)
 *   y = x*a + b,  a = gamma*invstd,  b = beta - mean*a
 *   running_mean = (1-m)*running_mean + m*mean
 *   running_var  = (1-m)*running_var  + m*var*M/(M-1)    (unbiased)
 * Backward, with mean and invstd from saved = [mean[C], invstd[C]]:
 *   dbeta = sum(dy),  dgamma = sum(dy*(x - mean))*invstd
 *   dx = (dy - dbeta/M - (x - mean)*k) * gamma*invstd,  k = sum(dy*(x-mean))*invstd^2/M
 *
 * Two shapes of data: "planes" (NCHW: channel c of sample n is one
 * contiguous plane of H*W) and "rows" (NHWC, and 2-d [N, C]: R = N*H*W rows
 * of C contiguous channels).  Sums are in double and partial sums are taken
 * over a fixed split (one per plane; CPU_CHUNKS row ranges) that is then
 * added in order, so results never depend on the thread count.  The sums
 * are shifted by the channel's first element (sum of x - K) so a large mean
 * does not cancel the variance.  The partial sums and per-channel
 * coefficients live in the workspace.
 *
 * A fused ReLU (KILN_OPF_ACT) clamps y in the affine pass; BN_BWD with it
 * takes dy * (y > 0), y = in4, written into dx first and read from there.
 */
#include "cpu.h"
#include "../common/scalar_ops.h" /* common_bn_commit: dnn_kernels.cu's code */

#include <math.h>
#include <stdio.h>
#include <string.h>

/* sz[] of a BN plan */
enum { BN_N, BN_C, BN_HW, BN_ROWS /* 1: rows, 0: planes */, BN_NCH /* row chunks */ };

/* ---- sums -------------------------------------------------------------- */

/* s[0] += sum(a - k), s[1] += sum((a - k)^2) over a plane of n. */
CPU_CLONES static void plane_stats(double *s, const float *a, int64_t n, float k)
{
	double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
	for (int64_t i = 0; i < n; i++) {
		const double d = (double)a[i] - k;
		s1 += d;
		s2 += d * d;
	}
	s[0] = s1, s[1] = s2;
}

/* s[0] = sum(dy), s[1] = sum(dy*(x - mean)) over a plane of n. */
CPU_CLONES static void plane_dstats(double *s, const float *x, const float *dy, int64_t n,
				    float mean)
{
	double s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
	for (int64_t i = 0; i < n; i++) {
		s1 += dy[i];
		s2 += (double)dy[i] * ((double)x[i] - mean);
	}
	s[0] = s1, s[1] = s2;
}

/* Rows r0..r1 of C channels: s1[c] = sum(x - k[c]), s2[c] = sum((x-k[c])^2). */
CPU_CLONES static void rows_stats(double *restrict s1, double *restrict s2, const float *x,
				  const float *k, int64_t r0, int64_t r1, int64_t C)
{
	for (int64_t c = 0; c < C; c++)
		s1[c] = s2[c] = 0;
	for (int64_t r = r0; r < r1; r++) {
		const float *xr = x + r * C;
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			const double d = (double)xr[c] - k[c];
			s1[c] += d;
			s2[c] += d * d;
		}
	}
}

/* Rows r0..r1: s1[c] = sum(dy), s2[c] = sum(dy*(x - mean[c])). */
CPU_CLONES static void rows_dstats(double *restrict s1, double *restrict s2, const float *x,
				   const float *dy, const float *mean, int64_t r0, int64_t r1,
				   int64_t C)
{
	for (int64_t c = 0; c < C; c++)
		s1[c] = s2[c] = 0;
	for (int64_t r = r0; r < r1; r++) {
		const float *xr = x + r * C, *dr = dy + r * C;
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			s1[c] += dr[c];
			s2[c] += (double)dr[c] * ((double)xr[c] - mean[c]);
		}
	}
}

/* Per-channel sums S1[c], S2[c] (in ws, doubles [2][C] after the partials)
 * of either the forward statistics (dy NULL: shifted by k) or the backward
 * ones (shifted by mean = k).  ws layout: partials, then S1, S2. */
static void bn_sums(const struct cpu_plan *p, double *ws, const float *x, const float *dy,
		    const float *k, double *S1, double *S2)
{
	const int64_t N = p->sz[BN_N], C = p->sz[BN_C], HW = p->sz[BN_HW];
	const int64_t tot = N * C * HW;
	if (!p->sz[BN_ROWS]) {
		/* one partial pair per plane (n, c): ws[(n*C + c)*2 + {0,1}] */
#pragma omp parallel for if (tot >= CPU_PAR_MIN) schedule(static)
		for (int64_t pl = 0; pl < N * C; pl++) {
			const int64_t c = pl % C;
			if (dy)
				plane_dstats(ws + 2 * pl, x + pl * HW, dy + pl * HW, HW, k[c]);
			else
				plane_stats(ws + 2 * pl, x + pl * HW, HW, k[c]);
		}
		for (int64_t c = 0; c < C; c++) {
			double a = 0, b = 0;
			for (int64_t n = 0; n < N; n++)
				a += ws[2 * (n * C + c)], b += ws[2 * (n * C + c) + 1];
			S1[c] = a, S2[c] = b;
		}
	} else {
		/* partials per row chunk: ws[ch*2C + c] and ws[ch*2C + C + c] */
		const int64_t R = N * HW, nch = p->sz[BN_NCH];
#pragma omp parallel for if (tot >= CPU_PAR_MIN) schedule(static)
		for (int64_t ch = 0; ch < nch; ch++) {
			double *s = ws + ch * 2 * C;
			if (dy)
				rows_dstats(s, s + C, x, dy, k, R * ch / nch, R * (ch + 1) / nch, C);
			else
				rows_stats(s, s + C, x, k, R * ch / nch, R * (ch + 1) / nch, C);
		}
		for (int64_t c = 0; c < C; c++)
			S1[c] = S2[c] = 0;
		for (int64_t ch = 0; ch < nch; ch++)
			for (int64_t c = 0; c < C; c++)
				S1[c] += ws[ch * 2 * C + c], S2[c] += ws[ch * 2 * C + C + c];
	}
}

/* ---- elementwise passes ------------------------------------------------ */

/* lo = 0: the fused ReLU (KILN_OPF_ACT), else -INFINITY (none) */
CPU_CLONES static void plane_affine(float *y, const float *x, int64_t n, float a, float b,
				    float lo)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++) {
		const float v = x[i] * a + b;
		y[i] = v < lo ? lo : v; /* NaN stays */
	}
}

CPU_CLONES static void rows_affine(float *y, const float *x, const float *a, const float *b,
				   int64_t r0, int64_t r1, int64_t C, float lo)
{
	for (int64_t r = r0; r < r1; r++) {
		const float *xr = x + r * C;
		float *yr = y + r * C;
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			const float v = xr[c] * a[c] + b[c];
			yr[c] = v < lo ? lo : v;
		}
	}
}

/* y = x*a[c] + b[c], then max(y, 0) with the fused ReLU (KILN_OPF_ACT) */
static void bn_affine(const struct cpu_plan *p, float *y, const float *x, const float *a,
		      const float *b)
{
	const int64_t N = p->sz[BN_N], C = p->sz[BN_C], HW = p->sz[BN_HW];
	const float lo = p->op.flags & KILN_OPF_ACT ? 0.0f : -INFINITY;
	if (!p->sz[BN_ROWS]) {
#pragma omp parallel for if (N * C * HW >= CPU_PAR_MIN) schedule(static)
		for (int64_t pl = 0; pl < N * C; pl++)
			plane_affine(y + pl * HW, x + pl * HW, HW, a[pl % C], b[pl % C], lo);
	} else {
		const int64_t R = N * HW;
#pragma omp parallel if (R * C >= CPU_PAR_MIN)
		{
			const int64_t t = cpu_thread_num(), T = cpu_num_threads();
			rows_affine(y, x, a, b, R * t / T, R * (t + 1) / T, C, lo);
		}
	}
}

/* The fused ReLU's backward (BN_BWD with KILN_OPF_ACT): g = dy * (y > 0),
 * n elements; g may be the buffer dx is written to later. */
static void bn_relu_mask(const struct cpu_plan *p, float *g, const float *dy, const float *y)
{
	const int64_t n = p->n;
#pragma omp parallel for simd if (n >= CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		g[i] = y[i] > 0 ? dy[i] : 0.0f;
}

/* dx = (dy - g - (x - mean)*k) * s  with per-channel g, k, s, mean */
CPU_CLONES static void plane_dx(float *dx, const float *x, const float *dy, int64_t n, float g,
				float k, float s, float mean)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		dx[i] = (dy[i] - g - (x[i] - mean) * k) * s;
}

CPU_CLONES static void rows_dx(float *dx, const float *x, const float *dy, const float *g,
			       const float *k, const float *s, const float *mean, int64_t r0,
			       int64_t r1, int64_t C)
{
	for (int64_t r = r0; r < r1; r++) {
		const float *xr = x + r * C, *dr = dy + r * C;
		float *o = dx + r * C;
#pragma omp simd
		for (int64_t c = 0; c < C; c++)
			o[c] = (dr[c] - g[c] - (xr[c] - mean[c]) * k[c]) * s[c];
	}
}

/* dx (x's shape) from x, dy and the per-channel g, k, s, mean (C each):
 * bn_bwd's and bn_bwd_apply's last step, over planes or rows. */
static void bn_dx(const struct cpu_plan *p, float *dx, const float *x, const float *dy,
		  const float *g, const float *k, const float *s, const float *mean)
{
	const int64_t N = p->sz[BN_N], C = p->sz[BN_C], HW = p->sz[BN_HW], M = N * HW;
	if (!p->sz[BN_ROWS]) {
#pragma omp parallel for if (M * C >= CPU_PAR_MIN) schedule(static)
		for (int64_t pl = 0; pl < N * C; pl++) {
			const int64_t c = pl % C;
			plane_dx(dx + pl * HW, x + pl * HW, dy + pl * HW, HW, g[c], k[c], s[c], mean[c]);
		}
	} else {
#pragma omp parallel if (M * C >= CPU_PAR_MIN)
		{
			const int64_t t = cpu_thread_num(), T = cpu_num_threads();
			rows_dx(dx, x, dy, g, k, s, mean, M * t / T, M * (t + 1) / T, C);
		}
	}
}

/* ---- kernels ----------------------------------------------------------- */

/* Workspace: doubles [partials | S1[C] | S2[C]], then floats [4][C]. */
static size_t bn_partials(const struct cpu_plan *p)
{
	return (size_t)(p->sz[BN_ROWS] ? p->sz[BN_NCH] * 2 * p->sz[BN_C]
				       : p->sz[BN_N] * p->sz[BN_C] * 2);
}

/* Per-channel mean (into S1) and biased variance, at least 0 (into S2), in
 * double, of x over its N*HW positions: bn_sums of x shifted by each
 * channel's first element (sample 0, position 0; k gets the C shifts), so
 * that a large mean does not cancel the variance away. */
static void bn_moments(const struct cpu_plan *p, double *ws, const float *x, float *k,
		       double *S1, double *S2)
{
	const int64_t C = p->sz[BN_C], M = p->sz[BN_N] * p->sz[BN_HW];
	for (int64_t c = 0; c < C; c++)
		k[c] = p->sz[BN_ROWS] ? x[c] : x[c * p->sz[BN_HW]];
	bn_sums(p, ws, x, NULL, k, S1, S2);
	for (int64_t c = 0; c < C; c++) {
		const double d = S1[c] / M;
		const double var = S2[c] / M - d * d;
		S1[c] = k[c] + d;
		S2[c] = var < 0 ? 0 : var;
	}
}

static kiln_status cpu_bn_train(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const float *x = a->in[0], *gamma = a->in[1], *beta = a->in[2];
	float *y = a->out[0], *saved = a->out[1], *rm = a->out[2], *rv = a->out[3];
	const int64_t C = p->sz[BN_C], M = p->sz[BN_N] * p->sz[BN_HW];
	const double eps = p->op.f[0], mom = p->op.f[1];
	double *ws = a->workspace, *S1 = ws + bn_partials(p), *S2 = S1 + C;
	float *k = (float *)(S2 + C), *ca = k + C, *cb = ca + C;
	(void)e;
	bn_moments(p, ws, x, k, S1, S2);
	for (int64_t c = 0; c < C; c++)
		common_bn_commit(c, C, S1[c], S2[c], (double)M, eps, mom, gamma, beta, saved, rm, rv,
				 ca, cb);
	bn_affine(p, y, x, ca, cb);
	return KILN_OK;
}

static kiln_status cpu_bn_infer(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const float *x = a->in[0], *gamma = a->in[1], *beta = a->in[2];
	const float *rm = a->in[3], *rv = a->in[4];
	const int64_t C = p->sz[BN_C];
	float *ca = a->workspace, *cb = ca + C;
	(void)e;
	for (int64_t c = 0; c < C; c++) {
		const double sc = gamma[c] / sqrt((double)rv[c] + p->op.f[0]);
		ca[c] = (float)sc;
		cb[c] = (float)(beta[c] - rm[c] * sc);
	}
	bn_affine(p, a->out[0], x, ca, cb);
	return KILN_OK;
}

static kiln_status cpu_bn_bwd(const struct cpu_plan *p, const struct kiln_op_args *a,
			      struct cpu_err *e)
{
	const float *x = a->in[0], *dy = a->in[1], *gamma = a->in[2], *saved = a->in[3];
	float *dx = a->out[0], *dgamma = a->out[1], *dbeta = a->out[2];
	const int64_t N = p->sz[BN_N], C = p->sz[BN_C], HW = p->sz[BN_HW], M = N * HW;
	const float *mean = saved, *invstd = saved + C;
	double *ws = a->workspace, *S1 = ws + bn_partials(p), *S2 = S1 + C;
	float *g = (float *)(S2 + C), *k = g + C, *s = k + C;
	(void)e;
	if (p->op.flags & KILN_OPF_ACT) { /* the ReLU's backward, into dx first */
		bn_relu_mask(p, dx, dy, a->in[4]);
		dy = dx;
	}
	bn_sums(p, ws, x, dy, mean, S1, S2);
	for (int64_t c = 0; c < C; c++) {
		const double inv = invstd[c];
		dbeta[c] = (float)S1[c];
		dgamma[c] = (float)(S2[c] * inv);
		g[c] = (float)(S1[c] / M);
		k[c] = (float)(S2[c] * inv * inv / M);
		s[c] = (float)(gamma[c] * inv);
	}
	bn_dx(p, dx, x, dy, g, k, s, mean);
	return KILN_OK;
}

/* ---- synchronised batch normalisation (BN_STATS, BN_APPLY,
 * BN_BWD_REDUCE, BN_BWD_APPLY): the same sums, split around the ranks'
 * collectives ---------------------------------------------------------- */

static kiln_status cpu_bn_stats(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const float *x = a->in[0];
	float *st = a->out[0];
	const int64_t C = p->sz[BN_C];
	double *ws = a->workspace, *S1 = ws + bn_partials(p), *S2 = S1 + C;
	float *k = (float *)(S2 + C);
	(void)e;
	bn_moments(p, ws, x, k, S1, S2);
	for (int64_t c = 0; c < C; c++) {
		st[c] = (float)S1[c];
		st[C + c] = (float)S2[c];
	}
	return KILN_OK;
}

static kiln_status cpu_bn_apply(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	const float *x = a->in[0], *gamma = a->in[1], *beta = a->in[2], *st = a->in[3];
	float *y = a->out[0], *saved = a->out[1], *rm = a->out[2], *rv = a->out[3];
	const int64_t C = p->sz[BN_C], G = p->op.i[0];
	const double M = (double)G * (double)(p->sz[BN_N] * p->sz[BN_HW]);
	const double eps = p->op.f[0], mom = p->op.f[1];
	float *ca = a->workspace, *cb = ca + C;
	(void)e;
	for (int64_t c = 0; c < C; c++) {
		double mean = 0, var = 0;
		for (int64_t g = 0; g < G; g++)
			mean += st[g * 2 * C + c];
		mean /= (double)G;
		for (int64_t g = 0; g < G; g++) {
			const double d = st[g * 2 * C + c] - mean;
			var += st[g * 2 * C + C + c] + d * d;
		}
		var /= (double)G;
		common_bn_commit(c, C, mean, var, (double)M, eps, mom, gamma, beta, saved, rm, rv, ca,
				 cb);
	}
	bn_affine(p, y, x, ca, cb);
	return KILN_OK;
}

static kiln_status cpu_bn_bwd_reduce(const struct cpu_plan *p, const struct kiln_op_args *a,
				     struct cpu_err *e)
{
	const float *x = a->in[0], *dy = a->in[1], *saved = a->in[2];
	float *dgamma = a->out[0], *dbeta = a->out[1], *sums = a->out[2];
	const int64_t C = p->sz[BN_C];
	double *ws = a->workspace, *S1 = ws + bn_partials(p), *S2 = S1 + C;
	(void)e;
	bn_sums(p, ws, x, dy, saved, S1, S2);
	for (int64_t c = 0; c < C; c++) {
		const float dg = (float)(S2[c] * saved[C + c]), db = (float)S1[c];
		dgamma[c] = sums[c] = dg;
		dbeta[c] = sums[C + c] = db;
	}
	return KILN_OK;
}

static kiln_status cpu_bn_bwd_apply(const struct cpu_plan *p, const struct kiln_op_args *a,
				    struct cpu_err *e)
{
	const float *x = a->in[0], *dy = a->in[1], *gamma = a->in[2], *saved = a->in[3];
	const float *sums = a->in[4];
	float *dx = a->out[0];
	const int64_t N = p->sz[BN_N], C = p->sz[BN_C], HW = p->sz[BN_HW], M = N * HW;
	const double Mt = (double)p->op.i[0] * (double)M;
	const float *mean = saved, *invstd = saved + C;
	float *g = a->workspace, *k = g + C, *s = k + C;
	(void)e;
	for (int64_t c = 0; c < C; c++) {
		const double inv = invstd[c];
		g[c] = (float)(sums[C + c] / Mt);
		k[c] = (float)(sums[c] * inv / Mt);
		s[c] = (float)(gamma[c] * inv);
	}
	bn_dx(p, dx, x, dy, g, k, s, mean);
	return KILN_OK;
}

/* The workspace and kernel of the four ops above (cpu_bn_prepare has
 * checked the dtypes and set the sizes). */
static void cpu_bn_sync_prepare(struct cpu_plan *p)
{
	const int type = p->op.type;
	const int64_t C = p->sz[BN_C];
	switch (type) {
	case KILN_OP_BN_STATS:
		p->workspace = (bn_partials(p) + 2 * (size_t)C) * sizeof(double) + (size_t)C * 4;
		p->kernel = cpu_bn_stats;
		break;
	case KILN_OP_BN_APPLY:
		p->workspace = 2 * (size_t)C * sizeof(float);
		p->kernel = cpu_bn_apply;
		break;
	case KILN_OP_BN_BWD_REDUCE:
		p->workspace = (bn_partials(p) + 2 * (size_t)C) * sizeof(double);
		p->kernel = cpu_bn_bwd_reduce;
		break;
	default:
		p->workspace = 3 * (size_t)C * sizeof(float);
		p->kernel = cpu_bn_bwd_apply;
		break;
	}
}

/* ---- prepare ----------------------------------------------------------- */

kiln_status cpu_bn_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int type = op->type;
	if (!cpu_all_f32(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	if ((op->flags & KILN_OPF_ACT) && op->i[KILN_OPI_ACT] != KILN_ACT_RELU)
		return cpu_bad(c, op, KILN_ENOTSUP, "fuses ReLU only");
	const struct kiln_tensor_desc *x = &op->in[0];
	const int64_t N = x->dims[0], C = x->dims[1];
	const int64_t HW = x->ndim == 4 ? x->dims[2] * x->dims[3] : 1;
	const int64_t n = N * C * HW;
	p->sz[BN_N] = N;
	p->sz[BN_C] = C;
	p->sz[BN_HW] = HW;
	p->sz[BN_ROWS] = x->ndim == 2 || cpu_nhwc(x);
	p->sz[BN_NCH] = N * HW < CPU_CHUNKS ? N * HW : CPU_CHUNKS;
	p->n = n;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	if (type >= KILN_OP_BN_STATS && type <= KILN_OP_BN_BWD_APPLY) {
		cpu_bn_sync_prepare(p);
		return KILN_OK;
	}
	if (type == KILN_OP_BN_INFER) {
		p->workspace = (size_t)(2 * C) * sizeof(float);
		p->kernel = cpu_bn_infer;
	} else {
		p->workspace = (bn_partials(p) + 2 * (size_t)C) * sizeof(double) +
			       4 * (size_t)C * sizeof(float);
		p->kernel = type == KILN_OP_BN_TRAIN ? cpu_bn_train : cpu_bn_bwd;
	}
	return KILN_OK;
}
