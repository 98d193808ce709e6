/* plugins/cuda/sdpa.c - ATTENTION and ATTENTION_BWD (kiln/ops.h) through
 * cuDNN's fused scaled-dot-product attention in the graph (backend) API,
 * with kiln's own kernel (attn.cu) where cuDNN does not take an op.
 *
 * The decision (attn_map.c: cuda_sdpa_supported): cuDNN takes bf16 / f16
 * attention without dropout or accumulation, head dim a multiple of 8 up
 * to 128, on compute capability 8.0+ with cuDNN 9 (not 9.10.0/9.10.1);
 * f32 is kiln's kernel's.  Then cuDNN's heuristics decide: a graph no
 * engine builds a plan for goes to kiln's kernel, logged once per shape
 * with the reason.  KILN_CUDA_ATTN = kiln | cudnn | auto forces a path
 * (cudnn: an op cuDNN refuses is refused, KILN_ENOTSUP, so a test knows
 * which path ran).
 *
 * The graphs are cuDNN's documented SDPA pattern (the cudnn-frontend's
 * composite SDPA nodes, written out in backend descriptors), on the
 * [B,H,T,D] views of attn_map.h (q, k, v straight in kiln's [B,T,3C] qkv:
 * no copies), f32 intermediates, one unique id per tensor:
 *   forward   S = Q K^T; S *= scale; causal: S = (row >= col) ? S : -inf
 *             (GEN_INDEX rows / cols, CMP_GE, BINARY_SELECT); softmax
 *             decomposed: m = max_j S, E = exp(S - m), z = sum_j E,
 *             stats = m + log z (kiln's lse), P = E / z (qkv's dtype);
 *             O = P V
 *   backward  sum = rowsum(dO * O) (kiln's Di; f32 in the workspace);
 *             P = exp(mask(scale Q K^T) - stats); dV = P^T dO;
 *             dP = dO V^T; dS = P (dP - sum) scale; dK = dS^T Q;
 *             dq_acc = dS K (f32, workspace, zeroed first); dQ = dq_acc
 * The scalars (scale, -inf, 1) are by-value tensors whose variant-pack
 * pointers are host floats kept in the plan.
 *
 * Plans are cached per shape (cuda_sdpa_key) in the context, so the layers
 * of a model share one; a refusal is cached too.  The workspace: cuDNN's,
 * then (backward) the row sums and dq_acc (cuda_sdpa_workspace).
 *
 * None of this has run on a GPU yet (docs/plugins.md, "CUDA device"):
 * the descriptors up to the operations are finalized by cuDNN on the host
 * (tests/check_cuda_sdpa), the rest waits for tests/gpu/run.sh.
 */
#include "cuda.h"
#include "dnn_be.h"
#include "attn_map.h"

#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if KILN_HAVE_CUDNN
/* the handle attributes are deprecated in cuDNN 9 but still how a graph
 * gets its handle (cudnn.c says the same) */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* unique ids of the tensors with memory (or a by-value scalar) */
enum {
	U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_DO, U_DQ, U_DK, U_DV, U_SUM,
	U_DQACC, U_ONE,
	U_VIRT = 100 /* the virtual ones count up from here */
};

struct cuda_sdpa {
	struct cuda_dnn d;          /* descriptors, plan, variant packs */
	struct cuda_sdpa *next;
	char key[160];
	struct cuda_sdpa_geom g;
	float scale, neg_inf, one;  /* the by-value scalars' host memory */
	size_t ws, off_sum, off_dq; /* the workspace (cuda_sdpa_workspace) */
	int64_t engine;
	int rpr;                    /* 1: the engine reduces in reduced precision */
	int ok;                     /* 0: cuDNN refused the shape (why) */
	int logged;
	char why[600];
};

/* ---- the graph builder ---------------------------------------------------
 * Each helper does nothing once a call has failed; the first failure is
 * kept (status, what was being built, the call, the line) for the
 * message. */

#define SDPA_MAX_OPS 40

struct gb {
	struct cuda_dnn *d;
	cudnnBackendDescriptor_t ops[SDPA_MAX_OPS];
	int n_ops;
	int64_t next_uid;
	cudnnStatus_t st;
	const char *what, *call;
	int line;
	char trace[512];            /* the operations' names, in order (cuda_sdpa_trace) */
};

#define GB(b, call_)                                                  \
	do {                                                          \
		if (!(b)->st) {                                       \
			cudnnStatus_t s_ = (call_);                   \
			if (s_ != CUDNN_STATUS_SUCCESS)               \
				(b)->st = s_, (b)->call = #call_, (b)->line = __LINE__; \
		}                                                     \
	} while (0)

#define SET(b, desc, attr, type, n, val) GB(b, cudnnBackendSetAttribute(desc, attr, type, n, val))

static cudnnDataType_t sdpa_dt(int dt)
{
	return dt == KILN_BF16 ? CUDNN_DATA_BFLOAT16 : dt == KILN_F16 ? CUDNN_DATA_HALF
								   : CUDNN_DATA_FLOAT;
}

/* A tensor: uid 0 = the next virtual id. */
static cudnnBackendDescriptor_t gb_tensor(struct gb *b, int64_t uid, cudnnDataType_t dt,
					  const int64_t dims[4], const int64_t str[4],
					  int64_t align, bool virt, bool byval)
{
	cudnnBackendDescriptor_t t = NULL;
	if (!uid)
		uid = b->next_uid++;
	b->what = "tensor";
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t));
	SET(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
	SET(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
	SET(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
	SET(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
	SET(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
	SET(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
	if (byval)
		SET(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval);
	GB(b, cudnnBackendFinalize(t));
	return t;
}

/* a tensor with memory: a view of attn_map.h */
static cudnnBackendDescriptor_t gb_view(struct gb *b, int64_t uid, cudnnDataType_t dt,
					const struct cuda_sdpa_view *v)
{
	return gb_tensor(b, uid, dt, v->dims, v->strides, v->align, false, false);
}

/* a virtual tensor of v's shape */
static cudnnBackendDescriptor_t gb_virt(struct gb *b, cudnnDataType_t dt,
					const struct cuda_sdpa_view *v)
{
	return gb_tensor(b, 0, dt, v->dims, v->strides, 16, true, false);
}

/* a by-value f32 scalar */
static cudnnBackendDescriptor_t gb_scalar(struct gb *b, int64_t uid)
{
	static const int64_t one[4] = { 1, 1, 1, 1 };
	return gb_tensor(b, uid, CUDNN_DATA_FLOAT, one, one, 16, false, true);
}

static void gb_op(struct gb *b, cudnnBackendDescriptor_t op, const char *name)
{
	GB(b, cudnnBackendFinalize(op));
	if (b->st)
		return;
	if (b->n_ops == SDPA_MAX_OPS) {
		b->st = CUDNN_STATUS_INTERNAL_ERROR, b->call = "more than SDPA_MAX_OPS operations";
		return;
	}
	b->ops[b->n_ops++] = op;
	const size_t l = strlen(b->trace);
	snprintf(b->trace + l, sizeof b->trace - l, "%s%s", l ? " " : "", name);
}

/* a pointwise mode's name in the trace */
static const char *pw_name(cudnnPointwiseMode_t mode)
{
	switch (mode) {
	case CUDNN_POINTWISE_MUL: return "mul";
	case CUDNN_POINTWISE_SUB: return "sub";
	case CUDNN_POINTWISE_ADD: return "add";
	case CUDNN_POINTWISE_DIV: return "div";
	case CUDNN_POINTWISE_EXP: return "exp";
	case CUDNN_POINTWISE_LOG: return "log";
	case CUDNN_POINTWISE_GEN_INDEX: return "index";
	case CUDNN_POINTWISE_CMP_GE: return "ge";
	case CUDNN_POINTWISE_BINARY_SELECT: return "select";
	case CUDNN_POINTWISE_IDENTITY: return "identity";
	default: return "pointwise";
	}
}

/* y = mode(x[, b2][, t]) in f32 (prec), GEN_INDEX along axis (>= 0) */
static void gb_pw(struct gb *b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
		  cudnnBackendDescriptor_t b2, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
		  cudnnDataType_t prec, int64_t axis)
{
	const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
	cudnnBackendDescriptor_t pw = NULL, op = NULL;
	b->what = "pointwise";
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
	SET(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
	SET(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
	if (axis >= 0)
		SET(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
	GB(b, cudnnBackendFinalize(pw));
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op));
	SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, 1, &pw);
	SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, 1, &x);
	if (b2)
		SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, 1, &b2);
	if (t)
		SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, D, 1, &t);
	SET(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, 1, &y);
	gb_op(b, op, pw_name(mode));
}

#define PW(b, mode, x, b2, y) gb_pw(b, mode, x, b2, NULL, y, CUDNN_DATA_FLOAT, -1)

/* c = a b (batched over the first two dims), f32 compute */
static void gb_mm(struct gb *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb,
		  cudnnBackendDescriptor_t c)
{
	const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
	const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t mm = NULL, op = NULL;
	b->what = "matmul";
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm));
	SET(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
	GB(b, cudnnBackendFinalize(mm));
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op));
	SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, D, 1, &a);
	SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, D, 1, &bb);
	SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, D, 1, &c);
	SET(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, D, 1, &mm);
	gb_op(b, op, "matmul");
}

/* y = the max / sum of x over the dims where y is 1, f32 */
static void gb_red(struct gb *b, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
		   cudnnBackendDescriptor_t y)
{
	const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
	const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t r = NULL, op = NULL;
	b->what = "reduction";
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &r));
	SET(b, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
	SET(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
	GB(b, cudnnBackendFinalize(r));
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op));
	SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, D, 1, &x);
	SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, D, 1, &y);
	SET(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, D, 1, &r);
	gb_op(b, op, how == CUDNN_REDUCE_TENSOR_MAX ? "max" : "sum");
}

/* y = x seen with other dims / strides (a transpose) */
static void gb_reshape(struct gb *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
	const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
	cudnnBackendDescriptor_t op = NULL;
	b->what = "reshape";
	GB(b, cuda_dnn_mk(b->d, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op));
	SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, D, 1, &x);
	SET(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, D, 1, &y);
	gb_op(b, op, "reshape");
}

/* The scaled (and causally masked) scores of q and kt: S = scale Q K^T,
 * then -inf where col > row when causal.  Returns the last tensor. */
static cudnnBackendDescriptor_t gb_scores(struct gb *b, const struct cuda_sdpa_geom *g,
					  cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t s = gb_virt(b, F, &g->s), s2 = gb_virt(b, F, &g->s);
	gb_mm(b, q, kt, s);
	PW(b, CUDNN_POINTWISE_MUL, s, gb_scalar(b, U_SCALE), s2);
	return s2;
}

/* x masked causally: (row >= col) ? x : -inf */
static cudnnBackendDescriptor_t gb_causal(struct gb *b, const struct cuda_sdpa_geom *g,
					  cudnnBackendDescriptor_t x)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT, I = CUDNN_DATA_INT32, B = CUDNN_DATA_BOOLEAN;
	cudnnBackendDescriptor_t row = gb_virt(b, I, &g->s), col = gb_virt(b, I, &g->s);
	cudnnBackendDescriptor_t keep = gb_virt(b, B, &g->s), y = gb_virt(b, F, &g->s);
	/* int32 indices computed in the graph's f32, as the frontend's mask */
	gb_pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, F, 2);
	gb_pw(b, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, F, 3);
	gb_pw(b, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, B, -1);
	gb_pw(b, CUDNN_POINTWISE_BINARY_SELECT, x, gb_scalar(b, U_NEGINF), keep, y, F, -1);
	return y;
}

/* The forward's operations into b. */
static void gb_forward(struct gb *b, const struct cuda_sdpa_geom *g)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT, X = sdpa_dt(g->dtype);
	cudnnBackendDescriptor_t q = gb_view(b, U_Q, X, &g->q), kt = gb_view(b, U_K, X, &g->kt);
	cudnnBackendDescriptor_t v = gb_view(b, U_V, X, &g->v), o = gb_view(b, U_O, X, &g->o);
	cudnnBackendDescriptor_t stats = gb_view(b, U_STATS, F, &g->stats);
	cudnnBackendDescriptor_t s = gb_scores(b, g, q, kt);
	if (g->causal)
		s = gb_causal(b, g, s);
	/* softmax with its stats (kiln's lse) */
	cudnnBackendDescriptor_t m = gb_virt(b, F, &g->stats), z = gb_virt(b, F, &g->stats);
	cudnnBackendDescriptor_t lz = gb_virt(b, F, &g->stats);
	cudnnBackendDescriptor_t sub = gb_virt(b, F, &g->s), e = gb_virt(b, F, &g->s);
	cudnnBackendDescriptor_t p = gb_virt(b, X, &g->s); /* bmm2 takes qkv's dtype */
	gb_red(b, CUDNN_REDUCE_TENSOR_MAX, s, m);
	PW(b, CUDNN_POINTWISE_SUB, s, m, sub);
	PW(b, CUDNN_POINTWISE_EXP, sub, NULL, e);
	gb_red(b, CUDNN_REDUCE_TENSOR_ADD, e, z);
	PW(b, CUDNN_POINTWISE_LOG, z, NULL, lz);
	PW(b, CUDNN_POINTWISE_ADD, m, lz, stats);
	PW(b, CUDNN_POINTWISE_DIV, e, z, p);
	gb_mm(b, p, v, o);
}

/* The backward's operations into b. */
static void gb_backward(struct gb *b, const struct cuda_sdpa_geom *g)
{
	const cudnnDataType_t F = CUDNN_DATA_FLOAT, X = sdpa_dt(g->dtype);
	cudnnBackendDescriptor_t q = gb_view(b, U_Q, X, &g->q), kt = gb_view(b, U_K, X, &g->kt);
	cudnnBackendDescriptor_t vt = gb_view(b, U_V, X, &g->vt), o = gb_view(b, U_O, X, &g->o);
	cudnnBackendDescriptor_t dO = gb_view(b, U_DO, X, &g->o);
	cudnnBackendDescriptor_t stats = gb_view(b, U_STATS, F, &g->stats);
	cudnnBackendDescriptor_t dq = gb_view(b, U_DQ, X, &g->q), dk = gb_view(b, U_DK, X, &g->k);
	cudnnBackendDescriptor_t dv = gb_view(b, U_DV, X, &g->v);
	/* sum = rowsum(dO * O), kept in the workspace */
	cudnnBackendDescriptor_t doo = gb_virt(b, F, &g->o), rs = gb_virt(b, F, &g->stats);
	cudnnBackendDescriptor_t sum = gb_view(b, U_SUM, F, &g->stats);
	PW(b, CUDNN_POINTWISE_MUL, dO, o, doo);
	gb_red(b, CUDNN_REDUCE_TENSOR_ADD, doo, rs);
	PW(b, CUDNN_POINTWISE_MUL, rs, gb_scalar(b, U_ONE), sum);
	/* P = exp(S - stats), S scaled and masked as the forward's: the mask
	 * before the subtraction, in the order of cuDNN's documented pattern
	 * (the frontend's SDPA backward: scale, mask, sub stats, exp); a
	 * graph in another order matches no fused engine */
	cudnnBackendDescriptor_t s = gb_scores(b, g, q, kt), sm = gb_virt(b, F, &g->s);
	if (g->causal)
		s = gb_causal(b, g, s);
	PW(b, CUDNN_POINTWISE_SUB, s, stats, sm);
	cudnnBackendDescriptor_t p = gb_virt(b, F, &g->s), pt = gb_virt(b, X, &g->st);
	PW(b, CUDNN_POINTWISE_EXP, sm, NULL, p);
	/* dV = P^T dO */
	gb_reshape(b, p, pt);
	gb_mm(b, pt, dO, dv);
	/* dS = P (dO V^T - sum) scale */
	cudnnBackendDescriptor_t dp = gb_virt(b, F, &g->s), d1 = gb_virt(b, F, &g->s);
	cudnnBackendDescriptor_t d2 = gb_virt(b, F, &g->s), ds = gb_virt(b, F, &g->s);
	gb_mm(b, dO, vt, dp);
	PW(b, CUDNN_POINTWISE_SUB, dp, sum, d1);
	PW(b, CUDNN_POINTWISE_MUL, d1, p, d2);
	PW(b, CUDNN_POINTWISE_MUL, d2, gb_scalar(b, U_SCALE), ds);
	/* dK = dS^T Q */
	cudnnBackendDescriptor_t dst = gb_virt(b, X, &g->st);
	gb_reshape(b, ds, dst);
	gb_mm(b, dst, q, dk);
	/* dQ = dS K, accumulated in f32 (workspace), then written */
	cudnnBackendDescriptor_t k = gb_virt(b, X, &g->k);
	cudnnBackendDescriptor_t acc = gb_view(b, U_DQACC, F, &g->dq_acc);
	gb_reshape(b, kt, k);
	gb_mm(b, ds, k, acc);
	PW(b, CUDNN_POINTWISE_IDENTITY, acc, NULL, dq);
}

/* The operations of g into d (and, with graph, the operation graph on
 * the context's handle).  0, or the status with why. */
static cudnnStatus_t sdpa_graph(struct cuda_dnn *d, const struct cuda_sdpa_geom *g,
				dnn_handle_t h, cudnnBackendDescriptor_t *graph, char *why,
				size_t n, char *trace, size_t tn)
{
	struct gb b;
	memset(&b, 0, sizeof b);
	b.d = d;
	b.next_uid = U_VIRT;
	if (g->bwd)
		gb_backward(&b, g);
	else
		gb_forward(&b, g);
	if (!b.st && graph) {
		b.what = "operation graph";
		GB(&b, cuda_dnn_mk(d, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
		SET(&b, *graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
		SET(&b, *graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b.n_ops,
		    b.ops);
		GB(&b, cudnnBackendFinalize(*graph));
	}
	if (trace)
		snprintf(trace, tn, "%s", b.trace);
	if (b.st) {
		char detail[400];
		detail[0] = 0;
		cudnnGetLastErrorString(detail, sizeof detail);
		snprintf(why, n, "%s:%d: %s (%s, operation %d): %s%s%s", __FILE__, b.line, b.call,
			 b.what, b.n_ops + 1, cudnnGetErrorString(b.st), detail[0] ? ": " : "", detail);
	}
	return b.st;
}

/* ---- plans: build, cache, free ------------------------------------------ */

static void sdpa_free(struct cuda_sdpa *s)
{
	struct cuda_dnn *d = &s->d;
	for (int i = 0; i < DNN_VP; i++)
		if (d->vp[i].vp)
			cudnnBackendDestroyDescriptor(d->vp[i].vp);
	if (d->plan)
		cudnnBackendDestroyDescriptor(d->plan);
	for (int i = 0; i < d->n_keep; i++)
		if (d->keep[i])
			cudnnBackendDestroyDescriptor(d->keep[i]);
	free(d->keep);
	free(s);
}

/* The first engine of the heuristics that builds a plan of graph within
 * the workspace limit (and deterministic when [run] deterministic = 1):
 * 1 with s->d.plan, or 0 with why (what was skipped for what).  Engines
 * whose notes say reduced-precision reduction are tried second, in the
 * heuristics' order, when none without that note builds a plan: P is
 * rounded to qkv's dtype before P V in every fused attention engine, the
 * op's tolerance is the low-precision one, and refusing them all would
 * leave every shape to kiln's slower kernel. */
static int sdpa_choose(struct cuda_dnn_ctx *x, struct cuda_sdpa *s, cudnnBackendDescriptor_t graph)
{
	cudnnBackendDescriptor_t cfg[64];
	int verdict[64];
	int64_t idx[64];
	const size_t limit = (size_t)x->ws_mb << 20;
	const int n = cuda_dnn_graph_cfgs(&s->d, graph, cfg);
	int notes = 0, rpr = 0, failed = 0, big = 0;
	for (int i = 0; i < n; i++) {
		idx[i] = -1;
		if (cuda_dnn_engine_ok(&s->d, cfg[i], 0, x->deterministic, &idx[i], &verdict[i]))
			verdict[i] = DNN_NOTES_NO;
		notes += verdict[i] == DNN_NOTES_NO;
		rpr += verdict[i] == DNN_NOTES_RPR;
	}
	for (int pass = 0; pass < 2; pass++) {
		const int want = pass ? DNN_NOTES_RPR : DNN_NOTES_OK;
		for (int i = 0; i < n; i++) {
			size_t ws = 0;
			if (verdict[i] != want)
				continue;
			cudnnBackendDescriptor_t p = cuda_dnn_build_plan(x, cfg[i], &ws);
			if (!p) {
				failed++;
				continue;
			}
			if (ws > limit) {
				cudnnBackendDestroyDescriptor(p);
				big++;
				continue;
			}
			s->d.plan = p, s->d.ws = ws, s->engine = idx[i], s->rpr = pass;
			return 1;
		}
	}
	snprintf(s->why, sizeof s->why,
		 "no cuDNN engine runs the graph: %d configurations from the heuristics, %d skipped for their numerical notes%s, %d failed to build a plan, %d over workspace_mb = %lld (%d reduce in reduced precision: tried last)",
		 n, notes, x->deterministic ? " (deterministic = 1)" : "", failed, big,
		 (long long)x->ws_mb, rpr);
	return 0;
}

/* A new plan of g for key: s->ok says whether cuDNN took it (why when
 * not).  NULL: out of memory. */
static struct cuda_sdpa *sdpa_build(struct cuda_ctx *c, const struct cuda_sdpa_geom *g,
				    const char *key)
{
	struct cuda_dnn_ctx *x = c->dnn;
	struct cuda_sdpa *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->d.host = c->host;
	s->d.x = x;
	s->g = *g;
	snprintf(s->key, sizeof s->key, "%s", key);
	snprintf(s->d.what, sizeof s->d.what, "%s", g->bwd ? "ATTENTION_BWD (cuDNN)" : "ATTENTION (cuDNN)");
	/* the mask's value: -inf, or the lowest float before cuDNN 9.10 (the
	 * frontend's get_negative_inf_value: older softmax engines want it) */
	s->scale = (float)g->scale, s->one = 1.0f;
	s->neg_inf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY;
	cudnnBackendDescriptor_t graph = NULL;
	if (sdpa_graph(&s->d, g, x->h, &graph, s->why, sizeof s->why, NULL, 0) ||
	    !sdpa_choose(x, s, graph))
		return s; /* s->ok = 0, s->why says why */
	s->ws = cuda_sdpa_workspace(g, s->d.ws, &s->off_sum, &s->off_dq);
	/* the variant pack's order (sdpa_launch fills the pointers alike) */
	static const int64_t fwd[] = { U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF };
	static const int64_t bwd[] = { U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF,
				       U_DO, U_DQ, U_DK, U_DV, U_SUM, U_DQACC, U_ONE };
	const int64_t *u = g->bwd ? bwd : fwd;
	s->d.n_ptr = 0;
	for (int i = 0; i < (g->bwd ? 14 : 7); i++)
		if (u[i] != U_NEGINF || g->causal)
			s->d.uid[s->d.n_ptr++] = u[i];
	s->ok = 1;
	snprintf(s->d.what, sizeof s->d.what, "%s (cuDNN engine %lld%s)",
		 g->bwd ? "ATTENTION_BWD" : "ATTENTION", (long long)s->engine,
		 s->rpr ? ", reduced-precision reduction" : "");
	return s;
}

/* The cached plan of g, built on first use.  NULL: out of memory. */
static struct cuda_sdpa *sdpa_get(struct cuda_ctx *c, const struct cuda_sdpa_geom *g)
{
	struct cuda_dnn_ctx *x = c->dnn;
	char key[160];
	cuda_sdpa_key(g, key, sizeof key);
	pthread_mutex_lock(&x->sdpa_lock);
	struct cuda_sdpa *s = x->sdpa;
	while (s && strcmp(s->key, key))
		s = s->next;
	if (!s && (s = sdpa_build(c, g, key))) {
		s->next = x->sdpa;
		x->sdpa = s;
		c->host->log(KILN_LOG_DEBUG, "cuda", "%s: %s", key,
			     s->ok ? s->d.what : "refused by cuDNN");
	}
	pthread_mutex_unlock(&x->sdpa_lock);
	return s;
}

void cuda_sdpa_close(struct cuda_dnn_ctx *x)
{
	while (x->sdpa) {
		struct cuda_sdpa *s = x->sdpa;
		x->sdpa = s->next;
		sdpa_free(s);
	}
}

/* ---- run ------------------------------------------------------------- */

static cudaError_t sdpa_launch(const struct cuda_plan *p, const struct kiln_op_args *a,
			       cudaStream_t st)
{
	struct cuda_sdpa *s = p->sdpa;
	const struct cuda_sdpa_geom *g = &s->g;
	const int64_t es = g->esize;
	const char *qkv = a->in[g->bwd ? 1 : 0];
	void *ptr[DNN_MAX_PTR];
	int n = 0;
	ptr[n++] = (void *)(qkv + g->q.off * es);
	ptr[n++] = (void *)(qkv + g->k.off * es);
	ptr[n++] = (void *)(qkv + g->v.off * es);
	ptr[n++] = g->bwd ? (void *)a->in[2] : a->out[0];  /* o: y */
	ptr[n++] = g->bwd ? (void *)a->in[3] : a->out[1];  /* stats: lse */
	ptr[n++] = &s->scale;
	if (g->causal)
		ptr[n++] = &s->neg_inf;
	if (g->bwd) {
		char *dqkv = a->out[0], *ws = a->workspace;
		ptr[n++] = (void *)a->in[0];                  /* dO: dy */
		ptr[n++] = dqkv + g->q.off * es;
		ptr[n++] = dqkv + g->k.off * es;
		ptr[n++] = dqkv + g->v.off * es;
		ptr[n++] = ws + s->off_sum;
		ptr[n++] = ws + s->off_dq;
		ptr[n++] = &s->one;
		/* dq_acc is accumulated into: zeroed first */
		cudaError_t e = cudaMemsetAsync(ws + s->off_dq, 0, s->ws - s->off_dq, st);
		if (e != cudaSuccess)
			return e;
	}
	if (n != s->d.n_ptr) { /* sdpa_build's order and this one disagree: a kiln bug */
		s->d.host->log(KILN_LOG_ERROR, "cuda", "%s: %d pointers for %d unique ids",
			       s->d.what, n, s->d.n_ptr);
		return cudaErrorInvalidValue;
	}
	/* the plan is shared by every op of its shape: one run at a time
	 * builds or picks its variant pack */
	pthread_mutex_lock(&s->d.x->sdpa_lock);
	const cudaError_t e = cuda_dnn_execute(&s->d, ptr, a->workspace, st);
	pthread_mutex_unlock(&s->d.x->sdpa_lock);
	return e;
}

/* ---- prepare ------------------------------------------------------------ */

/* cuDNN's plan of p's op when cuDNN takes it: KILN_OK with p->sdpa set,
 * KILN_ENOTSUP with why when it does not (the caller decides between
 * kiln's kernel and the error), another status on a hard failure. */
static kiln_status sdpa_try(struct cuda_ctx *c, struct cuda_plan *p,
			    const struct cuda_sdpa_geom *g, char *why, size_t n)
{
	int major = 0, minor = 0;
	if (!cuda_sdpa_supported(g, -1, 0, why, n)) /* kiln's side, before asking the GPU */
		return KILN_ENOTSUP;
	cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->ordinal);
	if (e == cudaSuccess)
		e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->ordinal);
	if (e != cudaSuccess)
		return cuda_fail(c, KILN_EDEVICE, e, "cudaDeviceGetAttribute (compute capability)",
				 __FILE__, __LINE__);
	if (!cuda_sdpa_supported(g, major * 10 + minor, cudnnGetVersion(), why, n))
		return KILN_ENOTSUP;
	void *h;
	pthread_mutex_t *lock;
	kiln_status st = cuda_dnn_handle(c, &h, &lock);
	if (st)
		return st;
	struct cuda_sdpa *s = sdpa_get(c, g);
	if (!s)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory for an attention plan");
	if (!s->ok) {
		snprintf(why, n, "%s", s->why);
		if (c->dnn->attn_mode == CUDA_ATTN_AUTO && !s->logged) {
			s->logged = 1; /* once per shape: the layers share it */
			c->host->log(KILN_LOG_WARN, "cuda",
				     "%s: cuDNN's fused attention refused it (%s); kiln's kernel (attn.cu) runs it",
				     s->key, s->why);
		}
		return KILN_ENOTSUP;
	}
	p->sdpa = s;
	p->launch = sdpa_launch;
	p->workspace = s->ws;
	p->n_in = p->op.n_in;
	p->n_out = p->op.n_out;
	return KILN_OK;
}

kiln_status cuda_sdpa_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	struct cuda_sdpa_geom g;
	char why[700];
	if (cuda_sdpa_geom(&p->op, &g, why, sizeof why))
		return cuda_bad(c, &p->op, KILN_EINVAL, why);
	const int mode = c->dnn->attn_mode;
	if (mode == CUDA_ATTN_KILN)
		return cuda_attn_kiln_prepare(c, p);
	const kiln_status st = sdpa_try(c, p, &g, why, sizeof why);
	if (st != KILN_ENOTSUP)
		return st;
	if (mode == CUDA_ATTN_CUDNN) {
		char m[800];
		snprintf(m, sizeof m, "KILN_CUDA_ATTN = cudnn, and cuDNN does not take it: %s", why);
		return cuda_bad(c, &p->op, KILN_ENOTSUP, m);
	}
	c->host->log(KILN_LOG_DEBUG, "cuda", "%s: kiln's kernel (cuDNN not used: %s)",
		     cuda_op_name(p->op.type), why);
	return cuda_attn_kiln_prepare(c, p);
}

kiln_status cuda_sdpa_check(struct cuda_ctx *c, const struct kiln_op *op, char *trace, size_t n)
{
	struct cuda_sdpa_geom g;
	char why[700];
	if (trace && n)
		trace[0] = 0;
	if (cuda_sdpa_geom(op, &g, why, sizeof why))
		return cuda_bad(c, op, KILN_EINVAL, why);
	struct cuda_sdpa *s = calloc(1, sizeof *s);
	if (!s)
		return c->host->error(KILN_ENOMEM, "cuda: out of memory");
	s->d.host = c->host;
	const cudnnStatus_t cs = sdpa_graph(&s->d, &g, NULL, NULL, why, sizeof why, trace, n);
	sdpa_free(s);
	if (cs)
		return cuda_bad(c, op, CUDNN_STATUS_CATEGORY(cs) == CUDNN_STATUS_BAD_PARAM ? KILN_EINVAL : KILN_ENOTSUP, why);
	return KILN_OK;
}

#else /* !KILN_HAVE_CUDNN */

kiln_status cuda_sdpa_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	if (c->dnn->attn_mode == CUDA_ATTN_CUDNN)
		return cuda_bad(c, &p->op, KILN_ENOTSUP,
				"KILN_CUDA_ATTN = cudnn, and kiln-cuda.so was built without cuDNN");
	return cuda_attn_kiln_prepare(c, p);
}

void cuda_sdpa_close(struct cuda_dnn_ctx *x)
{
	(void)x; /* no cuDNN plan was made */
}

kiln_status cuda_sdpa_check(struct cuda_ctx *c, const struct kiln_op *op, char *trace, size_t n)
{
	if (trace && n)
		trace[0] = 0;
	return cuda_bad(c, op, KILN_ENOTSUP, "built without cuDNN");
}
#endif
