/* plugins/cpu/convthin.c - kiln's own direct convolution for layers with
 * few input channels (convthin.h says when and why): which ops it takes,
 * the plan's geometry and workspace, the drivers that split the work over
 * the team, and prepare; the kernels are convthin_f32.c's and
 * convthin_bf16.c's (convthin_impl.h).
 *
 * Both ops read a sample's input planes through a padded copy, C planes
 * of HP = H + 2 ph rows of WP floats (the padding zeros, bf16 widened
 * exactly), so every tap (c, ky, kx) of 16 output columns x0 .. x0 + 15
 * of output row oy is one unaligned load at row oy + ky, column x0 + kx
 * of plane c.  A row of OW outputs is nxv = ceil(OW / 16) vectors, the
 * last masked.
 *
 * Forward: for each (sample, output row, column vector), 16 output
 * channels at a time in 16 registers, each tap one load and 16 FMAs with
 * the taps' weights broadcast from a copy laid out tap by tap (wt[ob][tap]
 * [16], zero past O); then + bias (the accumulators start at it), the
 * fused ReLU (max(0, v): a NaN kept, as fftconv.c), and the row stored
 * (bf16: rounded once, v16.h).  Work: rows of all samples split evenly
 * over the team, each a sample's padded planes rebuilt when its range
 * moves to the next sample.
 *
 * Weight gradient: dw[o][c][ky][kx] = sum over n, oy, ox of dy[n][o][oy]
 * [ox] x[n][c][oy + ky - ph][ox + kx - pw].  For one channel o and one
 * input channel c, the KH x KW <= 25 taps' sums are 16-lane accumulators
 * in registers (lane l takes the columns x0 + l), each (oy, column vector)
 * one load of dy and per tap one load and one FMA; db[o] (the bias
 * gradient) is one more accumulator.  The accumulators live in the
 * thread's slot between samples (A[o][tap][16]); at the end each is added
 * across its lanes (_mm512_reduce_add_ps) and written to dw (or added to
 * it: KILN_OPF_ACCUMULATE).  Output channels are split over the team,
 * every channel's sums in one order (samples, rows, column vectors, then
 * lanes), so the bytes do not depend on the team.  A row's last vector
 * adds its output columns alone (masked FMAs; in bf16, x loaded masked), so
 * the lanes past OW add nothing (an inf in x beyond them would otherwise
 * make 0 x inf a NaN).
 *
 * The padding is zeros that the taps multiply, as the FFT's: an inf weight
 * or dy meeting it gives NaN where oneDNN, which skips padded taps, stays
 * finite.
 */
#include "convthin_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cpu_convthin_ok(const struct kiln_op *op)
{
	const char *env = getenv("KILN_CPU_CONVTHIN");
	if (!CPU_HAVE_V16 || !cpu_v16_ok() || (env && !strcmp(env, "0")))
		return 0;
	const int t = op->type;
	if (t != KILN_OP_CONV && t != KILN_OP_CONV_BWD_WEIGHTS)
		return 0;
	if (op->flags & (KILN_OPF_KEEP | KILN_OPF_RESIDUAL))
		return 0;
	if ((op->flags & KILN_OPF_ACT) && (t != KILN_OP_CONV || op->i[KILN_OPI_ACT] != KILN_ACT_RELU))
		return 0;
	if ((op->flags & KILN_OPF_ACCUMULATE) && t != KILN_OP_CONV_BWD_WEIGHTS)
		return 0;
	if (op->i[0] != 1 || op->i[1] != 1 || op->i[4] != 1 || op->i[5] != 1 || op->i[6] > 1 ||
	    op->i[2] < 0 || op->i[3] < 0)
		return 0;
	if (t == KILN_OP_CONV ? (op->n_in != 2 && op->n_in != 3) || op->n_out != 1
			      : op->n_in != 2 || (op->n_out != 1 && op->n_out != 2))
		return 0;
	const struct kiln_tensor_desc *x = &op->in[0];
	const struct kiln_tensor_desc *w = t == KILN_OP_CONV ? &op->in[1] : &op->out[0];
	const struct kiln_tensor_desc *y = t == KILN_OP_CONV ? &op->out[0] : &op->in[1];
	if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || cpu_nhwc(x) != cpu_nhwc(y))
		return 0;
	/* NHWC: f32, one input channel (its planes are NCHW's bytes), as the
	 * first layer of an NHWC model or of an NCHW one's mixed stem
	 * (core/graph_infer.c) */
	if (cpu_nhwc(y) && (x->dims[1] != 1 || x->dtype != KILN_F32))
		return 0;
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t O = w->dims[0], KH = w->dims[2], KW = w->dims[3];
	if (N < 1 || C < 1 || C > CT_MAX_C || w->dims[1] != C || y->dims[0] != N || y->dims[1] != O ||
	    KH < 1 || KW < 1 || KH > CT_MAX_K || KW > CT_MAX_K || O < 1)
		return 0;
	if (t == KILN_OP_CONV_BWD_WEIGHTS && KH * KW > CT_WG_TAPS)
		return 0;
	const int64_t OH = H + 2 * op->i[2] - KH + 1, OW = W + 2 * op->i[3] - KW + 1;
	if (OH < 1 || OW < 1 || OH != y->dims[2] || OW != y->dims[3] || OW + 16 + KW > CT_MAX_WP)
		return 0;
	/* dtypes: all f32, or bf16 activations (and w) with an f32 or bf16
	 * bias and f32 dw, db */
	const int bf16 = x->dtype == KILN_BF16;
	if ((!bf16 && x->dtype != KILN_F32) || y->dtype != x->dtype)
		return 0;
	if (t == KILN_OP_CONV) {
		if (w->dtype != x->dtype)
			return 0;
		if (op->n_in == 3 && (op->in[2].dtype != KILN_F32 && (!bf16 || op->in[2].dtype != KILN_BF16)))
			return 0;
	} else {
		for (int k = 0; k < op->n_out; k++)
			if (op->out[k].dtype != KILN_F32)
				return 0;
	}
	return 1;
}

int cpu_convthin_bare_ok(const struct kiln_op *op)
{
	const struct kiln_op bare = cpu_op_unkept(op);
	return cpu_convthin_ok(&bare);
}

/* 1 when bf16 op runs by AVX512_BF16's dot products (this CPU has them
 * and KILN_CPU_CONVTHIN is not "f32", the tests' hook), else in f32
 * arithmetic on its widened tensors (the f32 op's bytes, rounded). */
static int ct_nat(const struct kiln_op *op)
{
	const char *env = getenv("KILN_CPU_CONVTHIN");
#if CPU_HAVE_V16
	return op->in[0].dtype == KILN_BF16 && __builtin_cpu_supports("avx512bf16") &&
	       !(env && !strcmp(env, "f32"));
#else
	(void)op, (void)env;
	return 0;
#endif
}

static size_t ct_up(size_t floats) { return (floats + 15) & ~(size_t)15; }

static void ct_geom(const struct cpu_plan *p, struct ct_geom *g)
{
	g->N = p->sz[0], g->C = p->sz[1], g->H = p->sz[2], g->W = p->sz[3];
	g->O = p->sz[4], g->KH = p->sz[5], g->KW = p->sz[6];
	g->slots = (int)(p->sz[7] & 0xffff); /* (sz[7]: slots | nat << 16 | nhwc << 17) */
	g->nat = (int)(p->sz[7] >> 16) & 1;
	g->nhwc = (int)(p->sz[7] >> 17) & 1;
	g->ph = p->rows, g->pw = p->cols;
	g->OH = g->H + 2 * g->ph - g->KH + 1, g->OW = g->W + 2 * g->pw - g->KW + 1;
	g->nxv = (g->OW + 15) / 16;
	g->nx32 = (g->OW + 31) / 32;
	g->HP = g->H + 2 * g->ph;
	g->WP = (int64_t)ct_up((size_t)(g->nxv * 16 + g->KW - 1));
	g->WPB = (int64_t)((g->nx32 * 32 + g->KW + 31) & ~(int64_t)31);
	g->T = g->C * g->KH * g->KW;
	g->nob = (g->O + CT_OB - 1) / CT_OB;
	g->nov = (g->O + 15) / 16;
	g->OP = g->nov * 16;
	g->NP = (g->KH + 1) / 2;
	/* the forward's weights: [ob][tap][CT_OB] (NCHW), [tap][OP] (NHWC)
	 * or the native pairs (fewer); its bias */
	const size_t wt_len = (size_t)(g->nob * CT_OB > g->OP ? g->nob * CT_OB : g->OP);
	g->wt_at = 0;
	g->b_at = ct_up((size_t)g->T * wt_len);
	g->slot_at = g->b_at + ct_up(wt_len);
	/* within a slot: the padded planes (f32; native forward: Q and S,
	 * dwords; native weight gradient: bf16), then the accumulators */
	size_t planes = (size_t)(g->C * g->HP * g->WP);
	if (g->nat)
		planes = p->op.type == KILN_OP_CONV ? 2 * planes : (size_t)(g->C * g->HP * g->WPB) / 2;
	g->acc_at = ct_up(planes);
	g->slot_len = g->acc_at;
	if (p->op.type == KILN_OP_CONV_BWD_WEIGHTS)
		g->slot_len += ct_up((size_t)(g->O * (g->T + 1) * 16));
}

/* The workspace's floats, 64-byte aligned. */
static float *ct_ws(const struct kiln_op_args *a)
{
	return (float *)(((uintptr_t)a->workspace + CT_ALIGN - 1) & ~(uintptr_t)(CT_ALIGN - 1));
}

/* The threads that take a share: the team, at most the slots. */
static int ct_share(const struct ct_geom *g, int64_t *t)
{
	const int64_t T = cpu_num_threads() < g->slots ? cpu_num_threads() : g->slots;
	*t = cpu_thread_num();
	return (int)T;
}

/* The native forward's weight pairs ([ob][c][p][kx][CT_OB] dwords, 0 past
 * O), into wq. */
static void ct_fwd_pairs(const struct ct_geom *g, const uint16_t *w, uint32_t *wq)
{
	memset(wq, 0, (size_t)(g->nob * g->C * g->NP * g->KW * CT_OB) * sizeof *wq);
	for (int64_t o = 0; o < g->O; o++)
		for (int64_t c = 0; c < g->C; c++)
			for (int64_t q = 0; q < g->NP; q++)
				for (int64_t kx = 0; kx < g->KW; kx++) {
					const uint16_t *wc = w + ((o * g->C + c) * g->KH + 2 * q) * g->KW + kx;
					const uint32_t lo = wc[0], hi = 2 * q + 1 < g->KH ? wc[g->KW] : 0;
					wq[((((o / CT_OB) * g->C + c) * g->NP + q) * g->KW + kx) * CT_OB + o % CT_OB] =
						lo | hi << 16;
				}
}

/* The forward's weights: tap by tap, CT_OB channels a block (NCHW) or all
 * channels a tap (NHWC), 0 past O, widened; the dot products' pairs
 * instead (g->nat: ct_fwd_pairs); and its bias (0 without one), widened. */
static void ct_fwd_weights(const struct ct_geom *g, const struct cpu_plan *p, const struct kiln_op_args *a,
			   float *wt, float *b)
{
	memset(b, 0, (size_t)(g->nob * CT_OB > g->OP ? g->nob * CT_OB : g->OP) * sizeof *b);
	if (p->op.n_in == 3)
		for (int64_t o = 0; o < g->O; o++)
			b[o] = p->op.in[2].dtype == KILN_BF16 ? half_bf16_f32(((const uint16_t *)a->in[2])[o])
							       : ((const float *)a->in[2])[o];
	if (g->nat) {
		ct_fwd_pairs(g, a->in[1], (uint32_t *)wt);
		return;
	}
	const int wbf = p->op.in[1].dtype == KILN_BF16;
	memset(wt, 0, (size_t)(g->nhwc ? g->T * g->OP : g->nob * g->T * CT_OB) * sizeof *wt);
	for (int64_t o = 0; o < g->O; o++)
		for (int64_t k = 0; k < g->T; k++) {
			const int64_t at = o * g->T + k;
			wt[g->nhwc ? k * g->OP + o : ((o / CT_OB) * g->T + k) * CT_OB + o % CT_OB] =
				wbf ? half_bf16_f32(((const uint16_t *)a->in[1])[at]) : ((const float *)a->in[1])[at];
		}
}


#if CPU_HAVE_V16
/* ct_wgrad of NHWC tensors (one input channel): vectors of 16 output
 * channels split over the team, each one thread's sums in one order */
static void ct_wgrad_nhwc(const struct cpu_plan *p, const struct kiln_op_args *a, const struct ct_geom *gp,
			  float *ws)
{
	const struct ct_geom g = *gp;
	const int acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	float *dw = a->out[0], *db = p->op.n_out == 2 ? a->out[1] : NULL;
	const ct_wgh_fn fn = ct_wgh_fns[g.KW];
	const size_t line = (size_t)(g.T + 1) * 16;
#pragma omp parallel if (g.N * g.O * g.OH * g.OW * g.T >= CPU_PAR_MIN)
	{
		int64_t t;
		const int T = ct_share(&g, &t);
		const int64_t v0 = g.nov * t / T, v1 = g.nov * (t + 1) / T;
		if (t < T && v1 > v0) {
			float *pl = ws + g.slot_at + (size_t)t * g.slot_len, *A = pl + g.acc_at;
			memset(A + v0 * line, 0, (size_t)(v1 - v0) * line * sizeof *A);
			for (int64_t n = 0; n < g.N; n++) {
				ct_plane(&g, a->in[0], 0, n, pl);
				for (int64_t v = v0; v < v1; v++)
					fn(&g, pl, a->in[1], n, v, A + v * line);
			}
			for (int64_t v = v0; v < v1; v++)
				ct_wg_nhwc_out(&g, A + v * line, v, dw, db, acc);
		}
	}
}
#endif

static kiln_status ct_forward(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
	(void)e;
#if CPU_HAVE_V16
	struct ct_geom g;
	ct_geom(p, &g);
	float *ws = ct_ws(a), *wt = ws + g.wt_at, *b = ws + g.b_at;
	ct_fwd_weights(&g, p, a, wt, b);
	const int bf16 = p->op.in[0].dtype == KILN_BF16, relu = (p->op.flags & KILN_OPF_ACT) != 0;
	const int64_t rows = g.N * g.OH, plane = g.C * g.HP * g.WP;
#pragma omp parallel if (rows * g.nxv * g.nob * g.T * CT_OB >= CPU_PAR_MIN)
	{
		int64_t t;
		const int T = ct_share(&g, &t);
		if (t < T) {
			/* a sample's planes: f32, or the dot products' Q and S */
			float *pl = ws + g.slot_at + (size_t)t * g.slot_len;
			uint32_t *Q = (uint32_t *)pl, *S = Q + plane;
			int64_t cur = -1;
			const int64_t r1 = rows * (t + 1) / T;
			for (int64_t r = rows * t / T; r < r1;) {
				const int64_t n = r / g.OH, oy = r % g.OH;
				/* up to CT_FR rows (NCHW), within the sample and the share */
				int64_t nr = g.OH - oy < CT_FR ? g.OH - oy : CT_FR;
				nr = g.nhwc ? 1 : r1 - r < nr ? r1 - r : nr;
				if (n != cur && g.nat)
					ct_pairs(&g, a->in[0], n, Q, S);
				else if (n != cur)
					ct_plane(&g, a->in[0], bf16, n, pl);
				cur = n;
				if (g.nat)
					ct_fwd_nat_rows(&g, Q, S, (const uint32_t *)wt, b, relu, a->out[0], n, oy, (int)nr);
				else if (g.nhwc)
					ct_fwd_nhwc_row(&g, pl, wt, b, relu, a->out[0], n, oy);
				else
					ct_fwd_rows(&g, pl, wt, b, relu, a->out[0], bf16, n, oy, (int)nr);
				r += nr;
			}
		}
	}
#else
	(void)p, (void)a;
#endif
	return KILN_OK;
}

static kiln_status ct_wgrad(const struct cpu_plan *p, const struct kiln_op_args *a, struct cpu_err *e)
{
	(void)e;
#if CPU_HAVE_V16
	struct ct_geom g;
	ct_geom(p, &g);
	float *ws = ct_ws(a);
	if (g.nhwc) {
		ct_wgrad_nhwc(p, a, &g, ws);
		return KILN_OK;
	}
	/* NCHW: output channels split over the team; a sample's planes
	 * (f32, or bf16 for the dot products: g.nat) built once a thread */
	const int bf16 = p->op.in[0].dtype == KILN_BF16, acc = (p->op.flags & KILN_OPF_ACCUMULATE) != 0;
	float *dw = a->out[0], *db = p->op.n_out == 2 ? a->out[1] : NULL;
	const ct_wg_fn fn = ct_wg_fns[g.KW];
	const ct_wgn_fn fnn = ct_wgn_fns[g.KW];
	const size_t es = bf16 ? 2 : 4, plane = (size_t)(g.OH * g.OW) * es;
	const size_t line = (size_t)(g.T + 1) * 16;
	const int64_t cstep = g.nat ? g.HP * g.WPB / 2 : g.HP * g.WP; /* a channel's plane, floats */
#pragma omp parallel if (g.N * g.O * g.OH * g.nxv * g.T * 16 >= CPU_PAR_MIN)
	{
		int64_t t;
		const int T = ct_share(&g, &t);
		const int64_t o0 = g.O * t / T, o1 = g.O * (t + 1) / T;
		if (t < T && o1 > o0) {
			float *pl = ws + g.slot_at + (size_t)t * g.slot_len, *A = pl + g.acc_at;
			memset(A + o0 * line, 0, (size_t)(o1 - o0) * line * sizeof *A);
			for (int64_t n = 0; n < g.N; n++) {
				if (g.nat)
					ct_plane_bf(&g, a->in[0], n, (uint16_t *)pl);
				else
					ct_plane(&g, a->in[0], bf16, n, pl);
				for (int64_t o = o0; o < o1; o++) {
					const char *dyp = (const char *)a->in[1] + (size_t)(n * g.O + o) * plane;
					for (int64_t c = 0; c < g.C; c++) {
						float *Ac = A + o * line + c * g.KH * g.KW * 16;
						if (g.nat)
							fnn(&g, (const uint16_t *)(pl + c * cstep), (const uint16_t *)dyp,
							    Ac, c == 0);
						else
							fn(&g, pl + c * cstep, dyp, bf16, Ac, c == 0);
					}
				}
			}
			for (int64_t o = o0; o < o1; o++)
				ct_wg_out(&g, A + o * line, o, dw, db, acc);
		}
	}
#else
	(void)p, (void)a;
#endif
	return KILN_OK;
}

kiln_status cpu_convthin_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (!cpu_convthin_ok(op))
		return cpu_bad(c, op, KILN_ENOTSUP,
			       "kiln's direct convolution for few input channels (convthin.c): NCHW, "
			       "1-4 input channels, stride 1, AVX-512");
	const int fwd = op->type == KILN_OP_CONV;
	const struct kiln_tensor_desc *x = &op->in[0], *w = fwd ? &op->in[1] : &op->out[0];
	p->sz[0] = x->dims[0], p->sz[1] = x->dims[1], p->sz[2] = x->dims[2], p->sz[3] = x->dims[3];
	p->sz[4] = w->dims[0], p->sz[5] = w->dims[2], p->sz[6] = w->dims[3];
	p->sz[7] = (c->threads > 0 ? c->threads : 1) | (int64_t)ct_nat(op) << 16 |
		   (int64_t)cpu_nhwc(&op->in[0]) << 17;
	p->rows = op->i[2], p->cols = op->i[3];
	struct ct_geom g;
	ct_geom(p, &g);
	p->n = cpu_numel(&op->out[0]);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = fwd ? ct_forward : ct_wgrad;
	p->workspace = (g.slot_at + (size_t)g.slots * g.slot_len) * sizeof(float) + CT_ALIGN;
	c->host->log(KILN_LOG_DEBUG, "cpu",
		     "%s x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] pad %lldx%lld %s: "
		     "kiln's direct kernel for few input channels (convthin.c)%s, workspace %zu bytes",
		     cpu_op_name(op->type), (long long)g.N, (long long)g.C, (long long)g.H, (long long)g.W,
		     (long long)g.O, (long long)g.C, (long long)g.KH, (long long)g.KW, (long long)g.ph,
		     (long long)g.pw, g.nhwc ? "NHWC" : "NCHW",
		     x->dtype != KILN_BF16 ? "" : g.nat ? ", bf16 by AVX512_BF16's dot products"
							: ", bf16 in f32 arithmetic",
		     p->workspace);
	return KILN_OK;
}
