/* plugins/cpu/layernorm.c - layer normalisation over the last dimension
 * (KILN_OP_LAYERNORM, LAYERNORM_BWD) as C loops with nn.LayerNorm's exact
 * semantics (oneDNN's layer_normalization would need its own memory
 * descriptors and a separate statistics layout for what is two passes over
 * a row; these loops are shorter and vectorise).
 *
 * Per row of C values x:
 *   mean = sum(x)/C,  var = sum((x - mean)^2)/C    (biased; two passes, in double)
 *   rstd = 1/sqrt(var + eps),  xh = (x - mean)*rstd,  y = xh*gamma + beta
 * Backward, with g = dy*gamma:
 *   dx = rstd * (g - sum(g)/C - xh * sum(g*xh)/C)
 *   dgamma = sum over rows of dy*xh,  dbeta = sum over rows of dy
 * Rows are independent (one parallel loop); the parameter gradients are
 * summed per fixed range of rows (CPU_CHUNKS of them, partials in the
 * workspace) and the ranges added in order, so the result never depends on
 * the thread count.
 */
#include "cpu.h"

#include <math.h>
#include <string.h>

/* sz[] of a layernorm plan */
enum { LN_AFFINE, LN_NCH /* row chunks of the parameter gradients */ };

/* One row forward: y, and saved[0..1] = mean, rstd. */
CPU_CLONES static void ln_row(float *restrict y, float *restrict saved, const float *restrict x,
			      const float *gamma, const float *beta, int64_t C, float eps)
{
	double s = 0, q = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t c = 0; c < C; c++)
		s += x[c];
	const double mean = s / (double)C;
#pragma omp simd reduction(+ : q)
	for (int64_t c = 0; c < C; c++) {
		const double d = (double)x[c] - mean;
		q += d * d;
	}
	const float m = (float)mean, r = (float)(1.0 / sqrt(q / (double)C + eps));
	saved[0] = m, saved[1] = r;
	if (gamma) {
#pragma omp simd
		for (int64_t c = 0; c < C; c++)
			y[c] = (x[c] - m) * r * gamma[c] + beta[c];
	} else {
#pragma omp simd
		for (int64_t c = 0; c < C; c++)
			y[c] = (x[c] - m) * r;
	}
}

static kiln_status cpu_layernorm(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	const float *x = a->in[0];
	const float *gamma = p->sz[LN_AFFINE] ? a->in[1] : NULL;
	const float *beta = p->sz[LN_AFFINE] ? a->in[2] : NULL;
	float *y = a->out[0], *saved = a->out[1];
	const int64_t R = p->rows, C = p->cols;
	const float eps = (float)p->op.f[0];
	(void)e;
#pragma omp parallel for if (R * C >= CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < R; r++)
		ln_row(y + r * C, saved + 2 * r, x + r * C, gamma, beta, C, eps);
	return KILN_OK;
}

/* One row backward: dx (=|+=), and dg, db (when non-NULL) += dy*xh, dy. */
CPU_CLONES static void ln_row_bwd(float *restrict dx, float *restrict dg, float *restrict db,
				  const float *restrict x, const float *restrict dy,
				  const float *saved, const float *gamma, int64_t C, int acc)
{
	const float m = saved[0], r = saved[1];
	float s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
	for (int64_t c = 0; c < C; c++) {
		const float xh = (x[c] - m) * r, g = gamma ? dy[c] * gamma[c] : dy[c];
		s1 += g;
		s2 += g * xh;
	}
	const float k1 = s1 / (float)C, k2 = s2 / (float)C;
	if (acc) {
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			const float xh = (x[c] - m) * r, g = gamma ? dy[c] * gamma[c] : dy[c];
			dx[c] += r * (g - k1 - xh * k2);
		}
	} else {
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			const float xh = (x[c] - m) * r, g = gamma ? dy[c] * gamma[c] : dy[c];
			dx[c] = r * (g - k1 - xh * k2);
		}
	}
	if (dg) {
#pragma omp simd
		for (int64_t c = 0; c < C; c++) {
			dg[c] += dy[c] * ((x[c] - m) * r);
			db[c] += dy[c];
		}
	}
}

/* out (=|+=) the sum of the chunks' partials, chunk by chunk in order. */
CPU_CLONES static void ln_sum_parts(float *restrict out, const float *restrict part,
				    int64_t nch, int64_t stride, int64_t C, int acc)
{
	for (int64_t c = 0; c < C; c++) {
		float s = acc ? out[c] : 0.0f;
		for (int64_t k = 0; k < nch; k++)
			s += part[k * stride + c];
		out[c] = s;
	}
}

static kiln_status cpu_layernorm_bwd(const struct cpu_plan *p, const struct kiln_op_args *a,
				     struct cpu_err *e)
{
	const float *x = a->in[0], *dy = a->in[1], *saved = a->in[2];
	const float *gamma = p->op.n_in > 3 ? a->in[3] : NULL;
	float *dx = a->out[0];
	const int params = p->op.n_out > 1;
	const int64_t R = p->rows, C = p->cols, nch = p->sz[LN_NCH];
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	float *part = a->workspace; /* nch x [dgamma C | dbeta C] */
	(void)e;
#pragma omp parallel for if (R * C >= CPU_PAR_MIN) schedule(static)
	for (int64_t k = 0; k < nch; k++) {
		float *dg = params ? part + k * 2 * C : NULL, *db = dg ? dg + C : NULL;
		if (dg)
			memset(dg, 0, (size_t)(2 * C) * sizeof *dg);
		for (int64_t r = R * k / nch; r < R * (k + 1) / nch; r++)
			ln_row_bwd(dx + r * C, dg, db, x + r * C, dy + r * C, saved + 2 * r, gamma,
				   C, acc);
	}
	if (params) {
		const int pacc = p->op.i[0] == 1;
		ln_sum_parts(a->out[1], part, nch, 2 * C, C, pacc);
		ln_sum_parts(a->out[2], part + C, nch, 2 * C, C, pacc);
	}
	return KILN_OK;
}

kiln_status cpu_layernorm_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_LAYERNORM_BWD;
	if (!cpu_all_f32(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");
	const struct kiln_tensor_desc *x = &op->in[0];
	p->cols = x->dims[x->ndim - 1];
	p->rows = cpu_numel(x) / p->cols;
	p->n = cpu_numel(x);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->sz[LN_AFFINE] = bwd ? op->n_in > 3 : op->n_in > 1;
	p->sz[LN_NCH] = p->rows < CPU_CHUNKS ? p->rows : CPU_CHUNKS;
	if (bwd && op->n_out > 1)
		p->workspace = (size_t)(p->sz[LN_NCH] * 2 * p->cols) * sizeof(float);
	p->kernel = bwd ? cpu_layernorm_bwd : cpu_layernorm;
	return KILN_OK;
}
