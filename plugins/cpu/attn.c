/* plugins/cpu/attn.c - fused scaled-dot-product attention, KILN_OP_ATTENTION
 * and KILN_OP_ATTENTION_BWD (the contract, with PyTorch's equivalent, is in
 * kiln/ops.h), and its decoding step with a key/value cache,
 * KILN_OP_ATTENTION_DECODE (one query row per (batch, head), plain loops).
 *
 * Parallel over the B*H (batch, head) pairs with OpenMP; each pair is done
 * by one thread from start to end, so the result does not depend on the
 * thread count.  A pair is walked in blocks of ATTN_BQ query rows: the
 * block's scores S [m, n] = scale * Q_blk K^T are one oneDNN sgemm
 * (dnnl_sgemm, row-major, reading q, k and v in place through the leading
 * dimension 3C: no copy of the heads), the softmax is a vectorised row loop,
 * and y_blk = P V is a second sgemm.  Causal: a block of rows [r0, r0+m)
 * sees keys [0, r0+m) only, so n = r0 + m and the upper-right part of the
 * [T, T] matrix is never computed (about half of it for long T).  At most
 * one [ATTN_BQ, T] block (forward) or two (backward: P and dP) exist per
 * thread, in the workspace prepare asks for.
 *
 * Backward, flash-attention style: P is recomputed from the saved
 * logsumexp, P = exp(S - lse); with Di = rowsum(dy * y),
 *   dV += P'^T dy,  dP = dy V^T,  dS = P * (dP*M - Di),
 *   dQ = scale * dS K,  dK += scale * dS^T Q      (P' = P*M, M the mask)
 * dK and dV of a pair collect over the row blocks (sgemm with beta = 1 into
 * dqkv, which was zeroed first unless the op accumulates).
 *
 * Dropout on the probabilities is KILN_OP_DROPOUT's mask (philox.h) of the
 * logical index ((b*H + h)*T + i)*T + j, drawn again in the backward.
 *
 * bf16/f16 tensors run this f32 kernel between conversions (lowp.c).
 */
#include "cpu.h"
#include "vexp.h"
#include "dnn.h"    /* cpu_dnnl_str */
#include "philox.h" /* CPU_DROP_SCALE, cpu_drop_init: the dropout mask */

#include <math.h>
#include <oneapi/dnnl/dnnl.h> /* dnnl_sgemm */
#include <omp.h>
#include <string.h>

/* Query rows per block: the sgemms stay large enough to run near peak,
 * and causal blocks skip most of the masked triangle. */
#define ATTN_BQ 32

/* The sizes of one op, fixed at prepare (cpu_plan.sz). */
struct attn_dims {
	int64_t B, T, C, H, D;
	int causal;
	float scale;
	double p; /* dropout probability */
};

static struct attn_dims attn_dims(const struct cpu_plan *p)
{
	return (struct attn_dims){ .B = p->sz[0], .T = p->sz[1], .C = p->sz[2], .H = p->sz[3],
				   .D = p->sz[2] / p->sz[3], .causal = (int)p->op.i[1],
				   .scale = (float)p->op.f[0], .p = p->op.f[1] };
}

/* Floats of one thread's workspace: P and dP blocks [ATTN_BQ, T]. */
static int64_t attn_thread_floats(int64_t T)
{
	return 2 * ATTN_BQ * T;
}

/* ---- row loops ---------------------------------------------------------- */

/* e^x of x <= 0: scores minus their row's maximum or logsumexp (a rounding
 * may leave x a little above 0) */
#define attn_exp cpu_exp

/* s[0..n): the scaled scores of one query row, of which [0, valid) are
 * seen.  Overwrites them with the softmax (0 past valid) and returns the
 * row's logsumexp. */
CPU_CLONES static float softmax_row(float *restrict s, int64_t valid, int64_t n)
{
	float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
	for (int64_t j = 0; j < valid; j++)
		mx = s[j] > mx ? s[j] : mx;
#pragma omp simd reduction(+ : sum)
	for (int64_t j = 0; j < valid; j++) {
		const float e = attn_exp(s[j] - mx);
		s[j] = e;
		sum += e;
	}
	const float inv = 1.0f / sum;
#pragma omp simd
	for (int64_t j = 0; j < valid; j++)
		s[j] *= inv;
	for (int64_t j = valid; j < n; j++)
		s[j] = 0.0f;
	return mx + logf(sum);
}

/* s[0..valid) *= the dropout scale of logical elements e0 + j. */
CPU_CLONES static void drop_row(float *restrict s, int64_t valid, uint64_t e0,
				const struct drop *d)
{
	const struct drop dd = *d;
#pragma omp simd
	for (int64_t j = 0; j < valid; j++) {
		float k;
		CPU_DROP_SCALE(k, e0 + (uint64_t)j, dd);
		s[j] *= k;
	}
}

/* The backward of one row: s holds the scaled scores, dp = dy V^T.  Turns
 * s into P' = exp(s - lse) * M and dp into dS = P * (dp*M - di); zeros
 * past valid.  d NULL: no dropout (M = 1). */
CPU_CLONES static void bwd_row(float *restrict s, float *restrict dp, int64_t valid, int64_t n,
			       float lse, float di, uint64_t e0, const struct drop *d)
{
	if (d) {
		const struct drop dd = *d;
#pragma omp simd
		for (int64_t j = 0; j < valid; j++) {
			float k;
			CPU_DROP_SCALE(k, e0 + (uint64_t)j, dd);
			const float pj = attn_exp(s[j] - lse);
			dp[j] = pj * (dp[j] * k - di);
			s[j] = pj * k;
		}
	} else {
#pragma omp simd
		for (int64_t j = 0; j < valid; j++) {
			const float pj = attn_exp(s[j] - lse);
			dp[j] = pj * (dp[j] - di);
			s[j] = pj;
		}
	}
	for (int64_t j = valid; j < n; j++)
		s[j] = dp[j] = 0.0f;
}

/* sum of a[0..n) * b[0..n) */
CPU_CLONES static float dot_row(const float *restrict a, const float *restrict b, int64_t n)
{
	float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
	for (int64_t j = 0; j < n; j++)
		acc += a[j] * b[j];
	return acc;
}

/* ---- one (batch, head) pair -------------------------------------------- */

/* Where pair (b, h) lives: q, k, v (row stride 3C) and its slice of a
 * [B,T,C] tensor (row stride C). */
struct attn_head {
	int64_t q, tok; /* offsets: q in qkv, the head in y / dy */
	uint64_t e0;    /* logical index of its P[0][0] in [B,H,T,T] */
	int64_t lse;    /* offset of its rows in lse [B,H,T] */
};

static struct attn_head attn_head(const struct attn_dims *g, int64_t b, int64_t h)
{
	return (struct attn_head){ .q = b * g->T * 3 * g->C + h * g->D,
				   .tok = b * g->T * g->C + h * g->D,
				   .e0 = (uint64_t)((b * g->H + h) * g->T) * (uint64_t)g->T,
				   .lse = (b * g->H + h) * g->T };
}

/* Row block [r0, r0 + m): how many keys it spans (n) and row i sees. */
static int64_t attn_keys(const struct attn_dims *g, int64_t r0, int64_t m)
{
	return g->causal ? r0 + m : g->T;
}

static int64_t attn_valid(const struct attn_dims *g, int64_t row)
{
	return g->causal ? row + 1 : g->T;
}

/* Forward of one pair.  S: the thread's [ATTN_BQ, T] block. */
static dnnl_status_t attn_fwd_head(const struct attn_dims *g, const float *qkv, float *y,
				   float *lse, float *S, int64_t b, int64_t h, const struct drop *d)
{
	const struct attn_head at = attn_head(g, b, h);
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C;
	const float *q = qkv + at.q, *k = q + C, *v = q + 2 * C;
	dnnl_status_t s = dnnl_success;
	for (int64_t r0 = 0; r0 < T && s == dnnl_success; r0 += ATTN_BQ) {
		const int64_t m = T - r0 < ATTN_BQ ? T - r0 : ATTN_BQ, n = attn_keys(g, r0, m);
		/* S [m, n] = scale * q_blk [m, D] k^T [D, n] */
		s = dnnl_sgemm('N', 'T', m, n, D, g->scale, q + r0 * ld, ld, k, ld, 0.0f, S, n);
		for (int64_t i = 0; i < m && s == dnnl_success; i++) {
			const int64_t row = r0 + i, valid = attn_valid(g, row);
			lse[at.lse + row] = softmax_row(S + i * n, valid, n);
			if (d)
				drop_row(S + i * n, valid, at.e0 + (uint64_t)(row * T), d);
		}
		/* y_blk [m, D] = P' [m, n] v [n, D] */
		if (s == dnnl_success)
			s = dnnl_sgemm('N', 'N', m, D, n, 1.0f, S, n, v, ld, 0.0f, y + at.tok + r0 * C, C);
	}
	return s;
}

/* Backward of one pair.  S, dP: the thread's two [ATTN_BQ, T] blocks. */
static dnnl_status_t attn_bwd_head(const struct attn_dims *g, const float *dy, const float *qkv,
				   const float *y, const float *lse, float *dqkv, float *S,
				   float *dP, int64_t b, int64_t h, const struct drop *d, int acc)
{
	const struct attn_head at = attn_head(g, b, h);
	const int64_t T = g->T, C = g->C, D = g->D, ld = 3 * C;
	const float *q = qkv + at.q, *k = q + C, *v = q + 2 * C;
	float *dq = dqkv + at.q, *dk = dq + C, *dv = dq + 2 * C;
	dnnl_status_t s = dnnl_success;
	if (!acc) /* dK and dV collect over the blocks: start from zero */
		for (int64_t t = 0; t < T; t++) {
			memset(dk + t * ld, 0, sizeof(float) * (size_t)D);
			memset(dv + t * ld, 0, sizeof(float) * (size_t)D);
		}
	for (int64_t r0 = 0; r0 < T && s == dnnl_success; r0 += ATTN_BQ) {
		const int64_t m = T - r0 < ATTN_BQ ? T - r0 : ATTN_BQ, n = attn_keys(g, r0, m);
		const float *dyb = dy + at.tok + r0 * C, *yb = y + at.tok + r0 * C;
		/* S [m, n] = scale * q_blk k^T;  dP [m, n] = dy_blk v^T */
		s = dnnl_sgemm('N', 'T', m, n, D, g->scale, q + r0 * ld, ld, k, ld, 0.0f, S, n);
		if (s == dnnl_success)
			s = dnnl_sgemm('N', 'T', m, n, D, 1.0f, dyb, C, v, ld, 0.0f, dP, n);
		if (s != dnnl_success)
			break;
		for (int64_t i = 0; i < m; i++) {
			const int64_t row = r0 + i;
			const float di = dot_row(dyb + i * C, yb + i * C, D);
			bwd_row(S + i * n, dP + i * n, attn_valid(g, row), n, lse[at.lse + row], di,
				at.e0 + (uint64_t)(row * T), d);
		}
		/* dV [n, D] += P'^T dy_blk;  dQ_blk = scale * dS K;
		 * dK [n, D] += scale * dS^T q_blk */
		s = dnnl_sgemm('T', 'N', n, D, m, 1.0f, S, n, dyb, C, 1.0f, dv, ld);
		if (s == dnnl_success)
			s = dnnl_sgemm('N', 'N', m, D, n, g->scale, dP, n, k, ld, acc ? 1.0f : 0.0f,
				       dq + r0 * ld, ld);
		if (s == dnnl_success)
			s = dnnl_sgemm('T', 'N', n, D, m, g->scale, dP, n, q + r0 * ld, ld, 1.0f, dk, ld);
	}
	return s;
}

/* ---- kernels ------------------------------------------------------------ */

/* The threads for `pairs` heads: at most the workspace's slots and the
 * team now (threads.c).  Each head's sgemm runs on one thread, inside the
 * region or, for a team of one, with the count set to 1: its sums never
 * depend on the team. */
static int attn_team(int64_t pairs, int64_t slots)
{
	int64_t nt = pairs < slots ? pairs : slots;
	if (nt > omp_get_max_threads())
		nt = omp_get_max_threads();
	if (nt <= 1)
		omp_set_num_threads(1);
	return nt < 1 ? 1 : (int)nt;
}

/* One run, forward or backward: every (b, h) pair once, dynamically
 * spread over at most sz[4] threads (the workspace has a slot per thread). */
static kiln_status cpu_attention(const struct cpu_plan *p, const struct kiln_op_args *a,
				 struct cpu_err *e)
{
	const struct attn_dims g = attn_dims(p);
	const int bwd = p->op.type == KILN_OP_ATTENTION_BWD;
	const int acc = bwd && (p->op.flags & KILN_OPF_ACCUMULATE);
	const int64_t pairs = g.B * g.H, per = attn_thread_floats(g.T);
	const int nt = attn_team(pairs, p->sz[4]);
	struct drop dd;
	const struct drop *d = NULL;
	if (g.p > 0.0) {
		dd = cpu_drop_init((uint64_t)p->op.i[2], p->op.i[3],
				   *(const int64_t *)a->in[p->op.n_in - 1], g.p);
		d = &dd;
	}
	dnnl_status_t bad = dnnl_success;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
	for (int64_t bh = 0; bh < pairs; bh++) {
		float *S = (float *)a->workspace + per * cpu_thread_num();
		const int64_t b = bh / g.H, h = bh % g.H;
		dnnl_status_t s =
			bwd ? attn_bwd_head(&g, a->in[0], a->in[1], a->in[2], a->in[3], a->out[0], S,
					    S + per / 2, b, h, d, acc)
			    : attn_fwd_head(&g, a->in[0], a->out[0], a->out[1], S, b, h, d);
		if (s != dnnl_success) {
#pragma omp atomic write
			bad = s;
		}
	}
	if (bad != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s B=%lld T=%lld C=%lld H=%lld: %s:%d: dnnl_sgemm: %s",
				cpu_op_name(p->op.type), (long long)g.B, (long long)g.T,
				(long long)g.C, (long long)g.H, __FILE__, __LINE__,
				cpu_dnnl_str(bad));
	return KILN_OK;
}

/* ---- decoding with a key/value cache (ATTENTION_DECODE) ----------------- */

/* One (b, h) pair of a decoding step at position t: store k and v in the
 * caches' row t, then y = softmax(scale * q K[0..t]^T) V[0..t].  s: the
 * thread's Tmax floats. */
static void attn_decode_head(const struct attn_dims *g, int64_t Tmax, const float *qkv,
			     float *y, float *kc, float *vc, float *s, int64_t b, int64_t h,
			     int64_t t)
{
	const int64_t C = g->C, D = g->D;
	const float *q = qkv + b * 3 * C + h * D;
	float *K = kc + (b * g->H + h) * Tmax * D, *V = vc + (b * g->H + h) * Tmax * D;
	float *yh = y + b * C + h * D;
	memcpy(K + t * D, q + C, sizeof(float) * (size_t)D);
	memcpy(V + t * D, q + 2 * C, sizeof(float) * (size_t)D);
	for (int64_t j = 0; j <= t; j++)
		s[j] = g->scale * dot_row(q, K + j * D, D);
	softmax_row(s, t + 1, t + 1);
	for (int64_t d = 0; d < D; d++)
		yh[d] = 0.0f;
	for (int64_t j = 0; j <= t; j++) {
		const float pj = s[j];
		const float *vj = V + j * D;
#pragma omp simd
		for (int64_t d = 0; d < D; d++)
			yh[d] += pj * vj[d];
	}
}

static kiln_status cpu_attention_decode(const struct cpu_plan *p, const struct kiln_op_args *a,
					struct cpu_err *e)
{
	const struct attn_dims g = attn_dims(p);
	const int64_t Tmax = p->sz[5], t = *(const int32_t *)a->in[1], pairs = g.B * g.H;
	if (t < 0 || t >= Tmax)
		return cpu_fail(e, KILN_EDATA, "cpu: ATTENTION_DECODE: position %lld outside the cache's [0, %lld)",
				(long long)t, (long long)Tmax);
	const int nt = attn_team(pairs, p->sz[4]);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
	for (int64_t bh = 0; bh < pairs; bh++)
		attn_decode_head(&g, Tmax, a->in[0], a->out[0], a->out[1], a->out[2],
				 (float *)a->workspace + Tmax * cpu_thread_num(), bh / g.H, bh % g.H, t);
	return KILN_OK;
}

kiln_status cpu_attn_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	for (int k = 0; k < op->n_in + op->n_out; k++) {
		const struct kiln_tensor_desc *t = k < op->n_in ? &op->in[k] : &op->out[k - op->n_in];
		if (t->dtype != KILN_F32 && !(t->dtype == KILN_I64 && k == op->n_in - 1) &&
		    !(t->dtype == KILN_I32 && op->type == KILN_OP_ATTENTION_DECODE && k == 1))
			return cpu_bad(c, op, KILN_ENOTSUP, "only f32 tensors (and the i64 step, or i32 position)");
	}
	const struct kiln_tensor_desc *qkv = &op->in[op->type == KILN_OP_ATTENTION_BWD ? 1 : 0];
	p->sz[0] = qkv->dims[0];
	p->sz[1] = qkv->dims[1];
	p->sz[2] = qkv->dims[2] / 3;
	p->sz[3] = op->i[0];
	p->sz[4] = c->threads; /* workspace slots */
	p->n = cpu_numel(qkv);
	p->workspace = sizeof(float) * (size_t)(attn_thread_floats(p->sz[1]) * p->sz[4]);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->kernel = cpu_attention;
	if (op->type == KILN_OP_ATTENTION_DECODE) { /* a row of Tmax scores per thread */
		p->sz[5] = op->out[1].dims[2];
		p->workspace = sizeof(float) * (size_t)(p->sz[5] * p->sz[4]);
		p->kernel = cpu_attention_decode;
	}
	return KILN_OK;
}
