/* core/opcheck.c - the device-independent checks of an op.
 *
 * kiln_device_prepare runs kiln_op_check before it calls the device's
 * prepare, so every device refuses a malformed op (wrong operand counts,
 * shapes that do not fit together, out-of-range parameters, the wrong
 * dtype where the op's contract in include/kiln/ops.h fixes one) with
 * the same status and the same message, written once here.  A device then
 * checks only what it can run: a dtype combination or a size it has no
 * kernel for is KILN_ENOTSUP from the device.
 *
 * Statuses: KILN_EINVAL for an op that breaks its contract, KILN_ENOTSUP
 * for a parameter naming something kiln does not know (an unknown loss,
 * schedule, activation) or a shape no device runs (batched GEMM).  The
 * message names the device, the op and every tensor:
 *   "cpu: CONV: bad geometry: ... (in0 f32[2, 4, 7, 7], ...)".
 * Floating tensors are not restricted to a dtype here (f32, bf16 and f16 are
 * the devices' business); only tensors whose dtype the contract fixes (i32
 * labels, i64 steps and counters, f32 scalars, u8 images) are checked.
 *
 * The op table at the end names every op and picks its check.
 *
 * Thread: any; the checks only read `op`.
 */
#include "internal.h"
#include "../plugins/common/describe.h" /* common_op_tensors */
#include "../plugins/common/c_locale.h" /* common_vsnprintf_c */

#include <limits.h> /* UINT_MAX */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int64_t numel(const struct kiln_tensor_desc *d)
{
	return kiln_tensor_numel(d);
}

static int nhwc(const struct kiln_tensor_desc *d)
{
	return d->ndim == 4 && d->layout == KILN_NHWC;
}

/* The stored innermost extent: channels for a 4-d NHWC tensor. */
static int64_t inner(const struct kiln_tensor_desc *d)
{
	if (d->ndim <= 0)
		return 1;
	if (nhwc(d))
		return d->dims[1];
	return d->dims[d->ndim - 1];
}

static int is_float(int dtype)
{
	return dtype == KILN_F32 || dtype == KILN_BF16 || dtype == KILN_F16;
}

/* A 4-d activation in a layout convolution and pooling know. */
static int is_act(const struct kiln_tensor_desc *d)
{
	return d->ndim == 4 && (d->layout == KILN_ROW || d->layout == KILN_NCHW ||
				d->layout == KILN_NHWC);
}

static kiln_status bad(const char *who, const struct kiln_op *op, kiln_status st,
		       const char *fmt, ...) KILN_PRINTF(4, 5);

static kiln_status bad(const char *who, const struct kiln_op *op, kiln_status st,
		       const char *fmt, ...)
{
	char why[320], list[640];
	va_list ap;
	va_start(ap, fmt);
	common_vsnprintf_c(why, sizeof why, fmt, ap); /* "got 0.5" (kiln_error's rule) */
	va_end(ap);
	return kiln_error(st, "%s: %s: %s (%s)", who, kiln_op_name(op->type), why,
			  common_op_tensors(op, list, sizeof list));
}

#define BAD(st, ...) return bad(who, op, (st), __VA_ARGS__)

static kiln_status counts(const char *who, const struct kiln_op *op, int n_in, int n_out)
{
	if (op->n_in != n_in || op->n_out != n_out)
		BAD(KILN_EINVAL, "takes %d inputs and %d outputs, got %d and %d", n_in, n_out,
		    op->n_in, op->n_out);
	return KILN_OK;
}

static kiln_status check_gemm(const char *who, const struct kiln_op *op)
{
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	if (op->n_in < 2 || op->n_in > 3 || op->n_out != 1)
		BAD(KILN_EINVAL, "takes 2 or 3 inputs (the third: bias) and 1 output, got %d and %d",
		    op->n_in, op->n_out);
	if (op->i[5] > 1)
		BAD(KILN_ENOTSUP, "batched GEMM (batch i[5] = %lld) is not supported yet",
		    (long long)op->i[5]);
	if (M <= 0 || N <= 0 || K <= 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1))
		BAD(KILN_EINVAL, "bad parameters M=%lld N=%lld K=%lld transA=%lld transB=%lld",
		    (long long)M, (long long)N, (long long)K, (long long)ta, (long long)tb);
	if (numel(&op->in[0]) != M * K || numel(&op->in[1]) != K * N ||
	    numel(&op->out[0]) != M * N || (op->n_in == 3 && numel(&op->in[2]) != N))
		BAD(KILN_EINVAL, "M=%lld N=%lld K=%lld transA=%lld transB=%lld does not match the tensors (in0 M*K, in1 K*N, out M*N, bias N)",
		    (long long)M, (long long)N, (long long)K, (long long)ta, (long long)tb);
	return KILN_OK;
}

static kiln_status check_conv(const char *who, const struct kiln_op *op)
{
	const int type = op->type;
	const struct kiln_tensor_desc *x, *w, *y, *b = NULL;
	/* KILN_OPF_KEEP (ABI 2.9): a kept copy in and/or out, u8 */
	const int keep = type != KILN_OP_QCONV && (op->flags & KILN_OPF_KEEP) != 0;
	const struct kiln_tensor_desc *kin = NULL, *kout = NULL;
	/* KILN_OPF_RESIDUAL (ABI 2.11): CONV's last input r, y's descriptor */
	const int res = (op->flags & KILN_OPF_RESIDUAL) != 0;
	if (res && (type != KILN_OP_CONV || keep || (op->flags & KILN_OPF_ACCUMULATE)))
		BAD(KILN_EINVAL, "KILN_OPF_RESIDUAL is for CONV, without KILN_OPF_KEEP or KILN_OPF_ACCUMULATE");
	if (type == KILN_OP_CONV || type == KILN_OP_QCONV) {
		if (op->n_in < 2 + res || op->n_in > 3 + res || op->n_out != 1 + keep)
			BAD(KILN_EINVAL, "takes x, w (, b) (, residual) and gives y (, kept x)");
		x = &op->in[0], w = &op->in[1], y = &op->out[0];
		b = op->n_in - res == 3 ? &op->in[2] : NULL;
		kout = keep ? &op->out[1] : NULL;
		const struct kiln_tensor_desc *r = res ? &op->in[op->n_in - 1] : NULL;
		if (r && (r->ndim != y->ndim || r->dtype != y->dtype || r->layout != y->layout ||
			  memcmp(r->dims, y->dims, sizeof(int64_t) * (size_t)y->ndim)))
			BAD(KILN_EINVAL, "the residual (KILN_OPF_RESIDUAL, last input) must have y's shape, layout and dtype");
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		if (op->n_in != 2 + keep || op->n_out != 1)
			BAD(KILN_EINVAL, "takes dy, w (, kept dy) and gives dx");
		x = &op->out[0], w = &op->in[1], y = &op->in[0];
		kin = keep ? &op->in[2] : NULL;
	} else {
		if (op->n_in != 2 + keep || op->n_out < 1 + keep || op->n_out > 2 + keep)
			BAD(KILN_EINVAL, "takes x, dy (, kept x) and gives dw (, db) (, kept dy)");
		x = &op->in[0], w = &op->out[0], y = &op->in[1];
		b = op->n_out - keep == 2 ? &op->out[1] : NULL;
		kin = keep ? &op->in[2] : NULL;
		kout = keep ? &op->out[op->n_out - 1] : NULL;
	}
	if ((kin && (kin->dtype != KILN_U8 || numel(kin) <= 0)) ||
	    (kout && (kout->dtype != KILN_U8 || numel(kout) <= 0)))
		BAD(KILN_EINVAL, "a kept copy (KILN_OPF_KEEP) is a u8 tensor");
	if (!is_float(x->dtype) || !is_float(y->dtype) || !is_float(w->dtype) ||
	    (b && !is_float(b->dtype)))
		BAD(KILN_EINVAL, "wants floating-point tensors");
	if (!is_act(x) || !is_act(y) || nhwc(x) != nhwc(y) || w->ndim != 4)
		BAD(KILN_EINVAL, "wants 4-d activations of one layout and 4-d weights [O,C/g,KH,KW]");
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t O = w->dims[0], Cg = w->dims[1], KH = w->dims[2], KW = w->dims[3];
	const int64_t sh = op->i[0], sw = op->i[1], ph = op->i[2], pw = op->i[3];
	const int64_t dh = op->i[4], dw = op->i[5], g = op->i[6] ? op->i[6] : 1;
	char geom[200];
	snprintf(geom, sizeof geom,
		 "x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] stride %lldx%lld pad %lldx%lld dilation %lldx%lld groups %lld %s",
		 (long long)N, (long long)C, (long long)H, (long long)W, (long long)O, (long long)Cg,
		 (long long)KH, (long long)KW, (long long)sh, (long long)sw, (long long)ph,
		 (long long)pw, (long long)dh, (long long)dw, (long long)g, nhwc(x) ? "NHWC" : "NCHW");
	if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || O <= 0 || KH <= 0 || KW <= 0 || sh <= 0 ||
	    sw <= 0 || ph < 0 || pw < 0 || dh <= 0 || dw <= 0 || g <= 0 || C % g || O % g ||
	    Cg != C / g)
		BAD(KILN_EINVAL, "bad geometry: %s", geom);
	const int64_t OH = (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1;
	const int64_t OW = (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1;
	if (H + 2 * ph < dh * (KH - 1) + 1 || W + 2 * pw < dw * (KW - 1) + 1 || y->dims[0] != N ||
	    y->dims[1] != O || y->dims[2] != OH || y->dims[3] != OW || (b && numel(b) != O))
		BAD(KILN_EINVAL, "%s gives [%lld,%lld,%lld,%lld] outputs (and bias [%lld])", geom,
		    (long long)N, (long long)O, (long long)OH, (long long)OW, (long long)O);
	return KILN_OK;
}

/* x [N,C,H,W] or [N,C]: its per-channel extent and values per channel. */
static int bn_x(const struct kiln_tensor_desc *x, int64_t *N, int64_t *C, int64_t *HW)
{
	if (x->ndim != 2 && x->ndim != 4)
		return 0;
	*N = x->dims[0], *C = x->dims[1];
	*HW = x->ndim == 4 ? x->dims[2] * x->dims[3] : 1;
	return *N > 0 && *C > 0 && *HW > 0;
}

/* y, dy, dx of batch norm: x's shape, layout and dtype (the compute dtype) */
static int like_x(const struct kiln_tensor_desc *d, const struct kiln_tensor_desc *x)
{
	return d->ndim == x->ndim && numel(d) == numel(x) && d->dims[1] == x->dims[1] &&
	       nhwc(d) == nhwc(x) && d->dtype == x->dtype;
}

static kiln_status check_bn(const char *who, const struct kiln_op *op)
{
	const int type = op->type;
	const int fold = type == KILN_OP_BN_BWD && (op->flags & KILN_OPF_ACT); /* in4 = y */
	const int need_in = type == KILN_OP_BN_TRAIN ? 3 : type == KILN_OP_BN_INFER ? 5 : 4 + fold;
	const int need_out = type == KILN_OP_BN_TRAIN ? 4 : type == KILN_OP_BN_INFER ? 1 : 3;
	kiln_status st = counts(who, op, need_in, need_out);
	if (st)
		return st;
	const struct kiln_tensor_desc *x = &op->in[0];
	int64_t N, C, HW;
	int ok = bn_x(x, &N, &C, &HW) && is_float(x->dtype) && like_x(&op->out[0], x);
	if (type == KILN_OP_BN_BWD)
		ok = ok && like_x(&op->in[1], x) && (!fold || like_x(&op->in[4], x));
	for (int i = 1; i < op->n_in - fold && ok; i++)
		if (!(type == KILN_OP_BN_BWD && i == 1))
			ok = numel(&op->in[i]) == (type == KILN_OP_BN_BWD && i == 3 ? 2 * C : C) &&
			     op->in[i].dtype == KILN_F32;
	for (int i = 1; i < op->n_out && ok; i++)
		ok = numel(&op->out[i]) == (type == KILN_OP_BN_TRAIN && i == 1 ? 2 * C : C) &&
		     op->out[i].dtype == KILN_F32;
	if (!ok)
		BAD(KILN_EINVAL, "wants x [N,C,H,W] or [N,C], y and dy of its shape and dtype, f32 per-channel tensors [C], f32 saved [2,C]");
	if (type == KILN_OP_BN_TRAIN && N * HW < 2)
		/* PyTorch refuses too: the unbiased variance divides by M - 1. */
		BAD(KILN_EINVAL, "training needs more than one value per channel");
	if (!(op->f[0] >= 0))
		BAD(KILN_EINVAL, "eps f[0] must be >= 0");
	return KILN_OK;
}

/* SyncBN's pieces (bn_sync.c): per input/output 0 = like x, k > 0 = k*C
 * elements, -1 = G*2*C (G = i[0], the gathered ranks). */
static kiln_status check_bn_sync(const char *who, const struct kiln_op *op)
{
	static const int8_t ins[4][5] = { { 0 }, { 0, 1, 1, -1 }, { 0, 0, 2 }, { 0, 0, 1, 2, 2 } };
	static const int8_t outs[4][4] = { { 2 }, { 0, 2, 1, 1 }, { 1, 1, 2 }, { 0 } };
	static const int n_ins[4] = { 1, 4, 3, 5 }, n_outs[4] = { 1, 4, 3, 1 };
	const int t = op->type - KILN_OP_BN_STATS;
	kiln_status st = counts(who, op, n_ins[t], n_outs[t]);
	if (st)
		return st;
	const struct kiln_tensor_desc *x = &op->in[0];
	int64_t N, C, HW;
	const int64_t G = op->i[0];
	const int grouped = op->type == KILN_OP_BN_APPLY || op->type == KILN_OP_BN_BWD_APPLY;
	if (grouped && G < 1)
		BAD(KILN_EINVAL, "i[0], the number of groups, must be >= 1");
	int ok = bn_x(x, &N, &C, &HW) && is_float(x->dtype);
	for (int k = 0; k < n_ins[t] + n_outs[t] && ok; k++) {
		const struct kiln_tensor_desc *d = k < n_ins[t] ? &op->in[k] : &op->out[k - n_ins[t]];
		const int want = k < n_ins[t] ? ins[t][k] : outs[t][k - n_ins[t]];
		ok = !want ? like_x(d, x)
			   : numel(d) == (want < 0 ? G * 2 * C : want * C) && d->dtype == KILN_F32;
	}
	if (!ok)
		BAD(KILN_EINVAL, "wants x, y, dy, dx of one shape and dtype, f32 per-channel tensors [C], statistics and sums [2,C], gathered statistics [i[0],2,C]");
	if (op->type == KILN_OP_BN_APPLY && G * N * HW < 2)
		BAD(KILN_EINVAL, "training needs more than one value per channel");
	if (op->type == KILN_OP_BN_APPLY && !(op->f[0] >= 0))
		BAD(KILN_EINVAL, "eps f[0] must be >= 0");
	return KILN_OK;
}

static kiln_status check_pool(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_POOL_BWD;
	if (bwd ? op->n_in < 1 || op->n_in > 3 || op->n_out != 1
		: op->n_in != 1 || op->n_out < 1 || op->n_out > 2)
		BAD(KILN_EINVAL, bwd ? "takes dy (, aux, x) and gives dx" : "takes x and gives y (, aux)");
	/* x: the forward input (dx for the backward); y: its output (dy) */
	const struct kiln_tensor_desc *x = bwd ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *y = bwd ? &op->in[0] : &op->out[0];
	const int kind = (int)op->i[0];
	/* ABI 2.8: u8 max pooling in inference (a chained INT8 model's) */
	const int u8 = x->dtype == KILN_U8 && y->dtype == KILN_U8;
	if (u8 && (bwd || op->n_out != 1 || kind != KILN_POOL_MAX))
		BAD(KILN_EINVAL, "pools u8 only for max pooling in inference (one output)");
	/* ABI 2.17: f32 max pooling NHWC -> NCHW */
	const int mixed = nhwc(x) && !nhwc(y) && kind == KILN_POOL_MAX && x->dtype == KILN_F32 &&
			  y->dtype == KILN_F32;
	if (!is_act(x) || !is_act(y) || (nhwc(x) != nhwc(y) && !mixed) ||
	    (!u8 && (!is_float(x->dtype) || !is_float(y->dtype))))
		BAD(KILN_EINVAL, "wants 4-d floating-point (or, max in inference, u8) activations of one layout (or f32 max NHWC -> NCHW)");
	const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
	const int64_t KH = op->i[1], KW = op->i[2], sh = op->i[3], sw = op->i[4];
	const int64_t ph = op->i[5], pw = op->i[6];
	char geom[200];
	snprintf(geom, sizeof geom,
		 "%s x [%lld,%lld,%lld,%lld] kernel %lldx%lld stride %lldx%lld pad %lldx%lld %s",
		 kind == KILN_POOL_MAX ? "max" : op->i[7] ? "avg (count pad)" : "avg",
		 (long long)N, (long long)C, (long long)H, (long long)W, (long long)KH,
		 (long long)KW, (long long)sh, (long long)sw, (long long)ph, (long long)pw,
		 nhwc(x) ? "NHWC" : "NCHW");
	/* PyTorch's rule pad <= kernel/2 keeps every window on real input, so
	 * a max is never -inf and an average divisor never 0. */
	if ((kind != KILN_POOL_MAX && kind != KILN_POOL_AVG) || N <= 0 || C <= 0 || H <= 0 ||
	    W <= 0 || KH <= 0 || KW <= 0 || sh <= 0 || sw <= 0 || ph < 0 || pw < 0 ||
	    2 * ph > KH || 2 * pw > KW || H + 2 * ph < KH || W + 2 * pw < KW)
		BAD(KILN_EINVAL, "bad geometry (pad must be <= kernel/2): %s", geom);
	const int64_t OH = (H + 2 * ph - KH) / sh + 1, OW = (W + 2 * pw - KW) / sw + 1;
	if (y->dims[0] != N || y->dims[1] != C || y->dims[2] != OH || y->dims[3] != OW)
		BAD(KILN_EINVAL, "%s gives [%lld,%lld,%lld,%lld]", geom, (long long)N, (long long)C,
		    (long long)OH, (long long)OW);
	if (bwd && kind == KILN_POOL_MAX && op->n_in < 2)
		BAD(KILN_EINVAL, "max pooling's backward needs aux (in1)");
	if (bwd && op->n_in == 3) { /* in2: the forward input, dx's twin */
		const struct kiln_tensor_desc *fx = &op->in[2];
		int same = fx->ndim == 4 && fx->dtype == x->dtype && nhwc(fx) == nhwc(x);
		for (int i = 0; same && i < 4; i++)
			same = fx->dims[i] == x->dims[i];
		if (!same)
			BAD(KILN_EINVAL, "in2, the forward input, must have dx's shape, layout and dtype");
	}
	return KILN_OK;
}

/* Every tensor of `op` has n elements, and 4-d ones the layout of out0. */
static int same_size(const struct kiln_op *op, int64_t n)
{
	const struct kiln_tensor_desc *ref = &op->out[0];
	for (int k = 0; k < op->n_in + op->n_out; k++) {
		const struct kiln_tensor_desc *d = k < op->n_in ? &op->in[k] : &op->out[k - op->n_in];
		if (numel(d) != n || (d->ndim == 4 && ref->ndim == 4 && nhwc(d) != nhwc(ref)))
			return 0;
	}
	return 1;
}

static kiln_status check_act(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_ACT_BWD;
	const int kind = (int)op->i[0];
	if (kind < KILN_ACT_RELU || kind > KILN_ACT_GELU_TANH)
		BAD(KILN_EINVAL, "unknown activation i[0] = %lld", (long long)op->i[0]);
	const int from_y = kind == KILN_ACT_SIGMOID || kind == KILN_ACT_TANH;
	if (bwd ? op->n_in < (from_y ? 3 : 2) || op->n_in > 3 || op->n_out != 1
		: op->n_in != 1 || op->n_out != 1)
		BAD(KILN_EINVAL, bwd ? "takes x, dy, y (y may be left out for relu, leaky_relu, gelu) and gives dx"
				     : "takes x and gives y");
	if (!same_size(op, numel(&op->out[0])))
		BAD(KILN_EINVAL, "tensors differ in size or layout");
	return KILN_OK;
}

static kiln_status check_dropout(const char *who, const struct kiln_op *op)
{
	if (op->n_in != 2 || op->n_out != 1)
		BAD(KILN_EINVAL, op->type == KILN_OP_DROPOUT ? "takes x, step and gives y"
							     : "takes dy, step and gives dx");
	if (op->in[1].dtype != KILN_I64)
		BAD(KILN_EINVAL, "the step (in1) must be i64");
	if (!(op->f[0] >= 0.0 && op->f[0] <= 1.0))
		BAD(KILN_EINVAL, "probability f[0] outside [0, 1]");
	const struct kiln_tensor_desc *x = &op->in[0], *y = &op->out[0];
	if (numel(&op->in[1]) != KILN_DROP_CTR)
		BAD(KILN_EINVAL, "the step (in1) must be i64[%d] { step, row0, rstride } (ABI 2.20)",
		    KILN_DROP_CTR);
	if (numel(x) != numel(y) || (x->ndim == 4 && y->ndim == 4 && nhwc(x) != nhwc(y)))
		BAD(KILN_EINVAL, "x and y differ in size or layout");
	return KILN_OK;
}

/* ATTENTION, ATTENTION_BWD (kiln/ops.h): qkv [B,T,3C], y/dy [B,T,C] of
 * qkv's dtype, lse f32[B,H,T], and the i64[KILN_DROP_CTR] step when
 * dropout is on. */
static kiln_status check_attention(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_ATTENTION_BWD;
	const int drop = op->f[1] != 0.0;
	kiln_status st = counts(who, op, (bwd ? 4 : 1) + drop, bwd ? 1 : 2);
	if (st)
		return st;
	const struct kiln_tensor_desc *qkv = bwd ? &op->in[1] : &op->in[0];
	const struct kiln_tensor_desc *y = bwd ? &op->in[2] : &op->out[0];
	const struct kiln_tensor_desc *lse = bwd ? &op->in[3] : &op->out[1];
	const int64_t H = op->i[0];
	if (qkv->ndim != 3 || qkv->dims[0] <= 0 || qkv->dims[1] <= 0 || H <= 0 ||
	    qkv->dims[2] <= 0 || qkv->dims[2] % (3 * H))
		BAD(KILN_EINVAL, "wants qkv [B,T,3C] with C a multiple of the heads i[0] = %lld",
		    (long long)H);
	const int64_t B = qkv->dims[0], T = qkv->dims[1], C = qkv->dims[2] / 3;
	const struct kiln_tensor_desc *like_y[2] = { y, bwd ? &op->in[0] : y };
	for (int k = 0; k < 2; k++)
		if (like_y[k]->ndim != 3 || like_y[k]->dims[0] != B || like_y[k]->dims[1] != T ||
		    like_y[k]->dims[2] != C || like_y[k]->dtype != qkv->dtype || !is_float(qkv->dtype))
			BAD(KILN_EINVAL, "wants y and dy [B,T,C] = [%lld,%lld,%lld] of qkv's floating dtype",
			    (long long)B, (long long)T, (long long)C);
	if (bwd && (op->out[0].ndim != 3 || numel(&op->out[0]) != numel(qkv) ||
		    op->out[0].dtype != qkv->dtype))
		BAD(KILN_EINVAL, "dqkv (out0) must be qkv's shape and dtype");
	if (lse->dtype != KILN_F32 || numel(lse) != B * H * T)
		BAD(KILN_EINVAL, "lse must be f32 [B,H,T] = %lld elements", (long long)(B * H * T));
	if (op->i[1] != 0 && op->i[1] != 1)
		BAD(KILN_EINVAL, "causal i[1] must be 0 or 1");
	if (!(op->f[0] > 0) || !isfinite(op->f[0]) || !(op->f[1] >= 0.0 && op->f[1] < 1.0))
		BAD(KILN_EINVAL, "wants scale f[0] > 0 and dropout 0 <= f[1] < 1");
	if (drop && (op->in[op->n_in - 1].dtype != KILN_I64 ||
		     numel(&op->in[op->n_in - 1]) != KILN_DROP_CTR))
		BAD(KILN_EINVAL, "the step (last input, with dropout) must be i64[%d] { step, row0, rstride } (ABI 2.20)",
		    KILN_DROP_CTR);
	return KILN_OK;
}

/* ATTENTION_DECODE: qkv [B,1,3C], pos i32[1], y [B,1,C] of qkv's dtype,
 * the caches f32 [B,H,Tmax,D]; ATTENTION_DECODE_RUN (ABI 2.31) the same
 * of T positions, qkv [B,T,3C] and y [B,T,C], T <= Tmax. */
static kiln_status check_attention_decode(const char *who, const struct kiln_op *op)
{
	kiln_status st = counts(who, op, 2, 3);
	if (st)
		return st;
	const struct kiln_tensor_desc *qkv = &op->in[0], *y = &op->out[0];
	const int64_t H = op->i[0];
	const int run = op->type == KILN_OP_ATTENTION_DECODE_RUN;
	if (qkv->ndim != 3 || qkv->dims[0] <= 0 || qkv->dims[1] <= 0 || (!run && qkv->dims[1] != 1) ||
	    H <= 0 || qkv->dims[2] <= 0 || qkv->dims[2] % (3 * H) || !is_float(qkv->dtype))
		BAD(KILN_EINVAL, "wants qkv [B,%s,3C] (floating) with C a multiple of the heads i[0] = %lld",
		    run ? "T" : "1", (long long)H);
	const int64_t B = qkv->dims[0], T = qkv->dims[1], C = qkv->dims[2] / 3;
	if (y->ndim != 3 || y->dims[0] != B || y->dims[1] != T || y->dims[2] != C ||
	    y->dtype != qkv->dtype)
		BAD(KILN_EINVAL, "wants y [B,T,C] = [%lld,%lld,%lld] of qkv's dtype", (long long)B,
		    (long long)T, (long long)C);
	if (op->in[1].dtype != KILN_I32 || numel(&op->in[1]) != 1)
		BAD(KILN_EINVAL, "the position (in1) must be i32[1]");
	for (int k = 1; k < 3; k++) {
		const struct kiln_tensor_desc *c = &op->out[k];
		if (c->ndim != 4 || c->dtype != KILN_F32 || c->dims[0] != B || c->dims[1] != H ||
		    c->dims[2] <= 0 || c->dims[3] != C / H || c->dims[2] != op->out[1].dims[2])
			BAD(KILN_EINVAL, "wants the caches (out1, out2) f32 [B,H,Tmax,D] = [%lld,%lld,Tmax,%lld]",
			    (long long)B, (long long)H, (long long)(C / H));
	}
	if (T > op->out[1].dims[2])
		BAD(KILN_EINVAL, "%lld positions (qkv's T), more than the caches' Tmax = %lld", (long long)T,
		    (long long)op->out[1].dims[2]);
	if (!(op->f[0] > 0) || !isfinite(op->f[0]))
		BAD(KILN_EINVAL, "wants scale f[0] > 0");
	return KILN_OK;
}

static kiln_status check_layout(const char *who, const struct kiln_op *op)
{
	if (op->type == KILN_OP_REORDER) {
		const struct kiln_tensor_desc *x = &op->in[0], *y = &op->out[0];
		kiln_status st = counts(who, op, 1, 1);
		if (st)
			return st;
		int same = x->ndim == y->ndim && kiln_dtype_size(x->dtype) && kiln_dtype_size(y->dtype);
		for (int i = 0; same && i < x->ndim; i++)
			same = x->dims[i] == y->dims[i];
		if (!same)
			BAD(KILN_EINVAL, "input and output differ in dims");
		return KILN_OK;
	}
	const int split = op->type == KILN_OP_SPLIT;
	const int parts = split ? op->n_out : op->n_in;
	const struct kiln_tensor_desc *whole = split ? &op->in[0] : &op->out[0];
	const struct kiln_tensor_desc *part = split ? op->out : op->in;
	const int d = (int)op->i[0];
	if ((split ? op->n_in != 1 : op->n_out != 1) || parts < 1)
		BAD(KILN_EINVAL, split ? "takes one input and gives 1..4 outputs"
				       : "takes 1..6 inputs and gives one output");
	if (d < 0 || d >= whole->ndim)
		BAD(KILN_EINVAL, "dimension i[0] = %lld outside [0, %d)", (long long)op->i[0],
		    whole->ndim);
	int64_t sum = 0;
	for (int k = 0; k < parts; k++) {
		const struct kiln_tensor_desc *t = &part[k];
		int ok = kiln_dtype_size(whole->dtype) && t->dtype == whole->dtype &&
			 t->ndim == whole->ndim && (t->ndim != 4 || nhwc(t) == nhwc(whole));
		for (int i = 0; ok && i < t->ndim; i++)
			ok = i == d || t->dims[i] == whole->dims[i];
		if (!ok)
			BAD(KILN_EINVAL, "parts must match the whole in dtype, layout and every other dimension");
		sum += t->dims[d];
	}
	if (sum != whole->dims[d])
		BAD(KILN_EINVAL, "the parts' extents do not add up to the whole's");
	return KILN_OK;
}

/* SGD, AdamW, LAMB (plugin.h): grads, params, lr, [step], [offsets],
 * [weight-decay multiplier], [gate]; outputs params, state..., [copy].
 * SGD reads the step (in2) with a dampening f[3] != 0; ADAMW with amsgrad
 * (i[1]) writes a fourth state output and no copy (ABI 2.29); LAMB has no
 * amsgrad, its i[1] is 0. */
static kiln_status check_optim(const char *who, const struct kiln_op *op)
{
	const int lamb = op->type == KILN_OP_LAMB, sgd = op->type == KILN_OP_SGD;
	const int amsgrad = op->type == KILN_OP_ADAMW && op->i[1] != 0;
	const int step = !sgd || op->f[3] != 0.0; /* in2 is the step count */
	const int gated = (op->flags & KILN_OPF_GATED) != 0;
	const int copy = op->n_out > 1 && (op->out[op->n_out - 1].dtype == KILN_BF16 ||
					   op->out[op->n_out - 1].dtype == KILN_F16);
	const int in_min = sgd ? 2 + step : lamb ? 4 : 3;
	/* plain SGD (momentum 0) keeps no momentum buffer */
	const int out_n = sgd ? (op->f[0] == 0.0 && op->n_out - copy == 1 ? 1 : 2) : 3 + amsgrad;
	const int n_in = op->n_in - gated;
	const int64_t n = op->i[0];
	if (op->type == KILN_OP_ADAMW && op->i[1] != 0 && op->i[1] != 1)
		BAD(KILN_EINVAL, "amsgrad i[1] = %lld is not 0 or 1", (long long)op->i[1]);
	if (lamb && op->i[1] != 0)
		BAD(KILN_EINVAL, "has no amsgrad: i[1] = %lld, must be 0", (long long)op->i[1]);
	if (sgd && !(op->f[3] >= 0 && op->f[3] <= 1))
		BAD(KILN_EINVAL, "wants a dampening f[3] in [0, 1], got %g", op->f[3]);
	if (gated && (op->n_in < 1 || op->in[op->n_in - 1].dtype != KILN_F32 ||
		      numel(&op->in[op->n_in - 1]) != 1))
		BAD(KILN_EINVAL, "the gate (last input, KILN_OPF_GATED) must be f32[1]");
	if (amsgrad && copy)
		BAD(KILN_EINVAL, "with amsgrad (i[1]) the outputs are params, m, v, vmax and no compute copy (KILN_OP_MAX_OUT): cast the params after the step");
	if ((n_in != in_min && n_in != in_min + 1) || op->n_out != out_n + copy)
		BAD(KILN_EINVAL, "takes %d or %d inputs (the last: the weight-decay multiplier) and %d outputs (and the bf16/f16 copy), got %d and %d",
		    in_min, in_min + 1, out_n, n_in, op->n_out);
	if (copy && numel(&op->out[op->n_out - 1]) != n)
		BAD(KILN_EINVAL, "the compute copy (last output) must have n = i[0] elements");
	for (int i = 0; i < n_in; i++) {
		const int want = (i == 2 && step) || (i == 3 && lamb) ? KILN_I64 : KILN_F32;
		if (op->in[i].dtype != want)
			BAD(KILN_EINVAL, "input %d must be %s", i, want == KILN_I64 ? "i64" : "f32");
	}
	for (int i = 0; i < out_n; i++)
		if (op->out[i].dtype != KILN_F32)
			BAD(KILN_EINVAL, "outputs must be f32 (the last may be the bf16/f16 compute copy)");
	int ok = n > 0 && numel(&op->in[0]) == n && numel(&op->in[1]) == 1;
	for (int i = 0; i < out_n; i++)
		ok = ok && numel(&op->out[i]) == n;
	if (step)
		ok = ok && numel(&op->in[2]) == 1;
	if (n_in == in_min + 1)
		ok = ok && numel(&op->in[in_min]) == n;
	if (!ok)
		BAD(KILN_EINVAL, "n = i[0] = %lld must be the size of grads, params, state and multiplier; lr%s [1]",
		    (long long)n, step ? " and step" : "");
	if (!sgd && (!(op->f[0] >= 0 && op->f[0] < 1) || !(op->f[1] >= 0 && op->f[1] < 1) ||
		     !(op->f[2] >= 0) || !isfinite(op->f[3])))
		BAD(KILN_EINVAL, "wants 0 <= beta1, beta2 < 1, eps >= 0, finite weight decay");
	if (lamb && numel(&op->in[3]) < 2)
		BAD(KILN_EINVAL, "wants tensor offsets i64[T+1], T >= 1");
	return KILN_OK;
}

static kiln_status check_xent(const char *who, const struct kiln_op *op)
{
	kiln_status st = counts(who, op, op->n_in == 3 ? 3 : 2, 2);
	if (st)
		return st;
	if (!is_float(op->in[0].dtype) || !is_float(op->out[0].dtype) ||
	    op->out[1].dtype != KILN_F32 || op->in[1].dtype != KILN_I32)
		BAD(KILN_EINVAL, "wants floating-point logits and gradient, i32 labels, f32 metrics");
	if (op->n_in == 3 && (op->in[2].dtype != KILN_F32 || numel(&op->in[2]) != 1))
		BAD(KILN_EINVAL, "the loss scale in2 must be f32[1]");
	const int64_t cols = inner(&op->in[0]);
	const int64_t rows = cols > 0 ? numel(&op->in[0]) / cols : 0;
	if (cols <= 0 || op->in[0].ndim != 2 || numel(&op->in[1]) != rows ||
	    numel(&op->out[0]) != rows * cols || numel(&op->out[1]) < 2 || numel(&op->out[1]) > 4)
		BAD(KILN_EINVAL, "wants logits [N,C], labels [N], dlogits [N,C], metrics [2..4]");
	if (op->i[2] != 0 && op->i[2] != 1)
		BAD(KILN_EINVAL, "ignore flag i[2] = %lld is not 0 or 1", (long long)op->i[2]);
	if (op->i[4] < 0)
		BAD(KILN_EINVAL, "metric rows i[4] = %lld is negative", (long long)op->i[4]);
	if (op->i[0] < 0 || op->i[0] > rows)
		BAD(KILN_EINVAL, "valid rows i[0] = %lld outside [0, %lld]", (long long)op->i[0],
		    (long long)rows);
	if (op->i[1] < KILN_LOSS_XENT || op->i[1] > KILN_LOSS_BCE)
		BAD(KILN_ENOTSUP, "unknown loss i[1] = %lld", (long long)op->i[1]);
	if (op->i[5] < 0 || op->i[5] > cols)
		BAD(KILN_EINVAL, "classes i[5] = %lld outside [0, %lld]", (long long)op->i[5],
		    (long long)cols);
	if (!(op->f[1] >= 0 && op->f[1] <= 1))
		BAD(KILN_EINVAL, "label smoothing f[1] outside [0, 1]");
	return KILN_OK;
}

/* EMBEDDING (idx, table -> y) and EMBEDDING_BWD (idx, dy -> dtable). */
static kiln_status check_embedding(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_EMBEDDING_BWD;
	kiln_status st = counts(who, op, 2, 1);
	if (st)
		return st;
	const struct kiln_tensor_desc *idx = &op->in[0];
	const struct kiln_tensor_desc *table = bwd ? &op->out[0] : &op->in[1];
	const struct kiln_tensor_desc *rows = bwd ? &op->in[1] : &op->out[0];
	if (idx->dtype != KILN_I32 || !is_float(table->dtype) || !is_float(rows->dtype) ||
	    (bwd && table->dtype != KILN_F32))
		BAD(KILN_EINVAL, "wants i32 indices, a floating-point table and rows (an f32 table gradient)");
	const int64_t C = table->ndim == 2 ? table->dims[1] : 0;
	if (C <= 0 || table->dims[0] <= 0 || numel(rows) != numel(idx) * C || inner(rows) != C)
		BAD(KILN_EINVAL, "wants a table [V,C] and rows [N,C] (or [B,T,C]) for N indices");
	return KILN_OK;
}

/* LAYERNORM (x, [gamma, beta] -> y, saved) and LAYERNORM_BWD (x, dy, saved,
 * [gamma] -> dx, [dgamma, dbeta]). */
static kiln_status check_layernorm(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_LAYERNORM_BWD;
	const int n_in = bwd ? 3 : 1, n_out = bwd ? 1 : 2;
	const int aff_in = bwd ? 1 : 2, aff_out = bwd ? 2 : 0;
	if ((op->n_in != n_in && op->n_in != n_in + aff_in) ||
	    (op->n_out != n_out && (!aff_out || op->n_out != n_out + aff_out)))
		BAD(KILN_EINVAL, bwd ? "takes x, dy, saved (, gamma) and gives dx (, dgamma, dbeta)"
				     : "takes x (, gamma, beta) and gives y, saved");
	const struct kiln_tensor_desc *x = &op->in[0];
	const int64_t C = inner(x), R = C > 0 ? numel(x) / C : 0;
	int ok = C > 0 && R > 0 && x->ndim >= 1 && !nhwc(x) && is_float(x->dtype) &&
		 like_x(&op->out[0], x) && (!bwd || like_x(&op->in[1], x));
	const struct kiln_tensor_desc *saved = bwd ? &op->in[2] : &op->out[1];
	ok = ok && saved->dtype == KILN_F32 && numel(saved) == 2 * R;
	for (int k = bwd ? 3 : 1; k < op->n_in && ok; k++)
		ok = op->in[k].dtype == KILN_F32 && numel(&op->in[k]) == C;
	for (int k = 1; bwd && k < op->n_out && ok; k++)
		ok = op->out[k].dtype == KILN_F32 && numel(&op->out[k]) == C;
	if (!ok)
		BAD(KILN_EINVAL, "wants x of R rows of C (not NHWC), y, dy, dx of its shape and dtype, f32 saved [R,2], f32 gamma, beta, dgamma, dbeta [C]");
	if (!bwd && !(op->f[0] >= 0))
		BAD(KILN_EINVAL, "eps f[0] must be >= 0");
	return KILN_OK;
}

/* RNN (x, w_ih, w_hh, b_ih, b_hh [, ids] -> y [, saved]) and RNN_BWD (x,
 * dy, w_ih, w_hh, saved -> dx, dw_ih, dw_hh, db[2, G*H]); y, dy [B,H]
 * with i[4] (last). */
static kiln_status check_rnn(const char *who, const struct kiln_op *op)
{
	const int bwd = op->type == KILN_OP_RNN_BWD;
	if (bwd ? op->n_in != 5 || op->n_out != 4
		: (op->n_in != 5 && op->n_in != 6) || (op->n_out != 1 && op->n_out != 2))
		BAD(KILN_EINVAL, bwd ? "takes x, dy, w_ih, w_hh, saved and gives dx, dw_ih, dw_hh, db"
				     : "takes x, w_ih, w_hh, b_ih, b_hh (, ids) and gives y (, saved)");
	if (op->i[0] != 0 && op->i[0] != 1)
		BAD(KILN_EINVAL, "cell i[0] must be 0 (LSTM) or 1 (GRU)");
	const int64_t G = op->i[0] ? 3 : 4;
	const struct kiln_tensor_desc *x = &op->in[0], *y = bwd ? &op->in[1] : &op->out[0];
	const struct kiln_tensor_desc *wi = &op->in[bwd ? 2 : 1], *wh = &op->in[bwd ? 3 : 2];
	/* i[4] (last): y and dy [B,H], the final hidden state */
	const int last = op->i[4] != 0, yn = last ? 2 : 3;
	if (op->i[4] != 0 && op->i[4] != 1)
		BAD(KILN_EINVAL, "last i[4] must be 0 or 1");
	const int64_t H = y->ndim == yn ? y->dims[yn - 1] : 0, I = x->ndim == 3 ? x->dims[2] : 0;
	int ok = x->dtype == KILN_F32 && y->dtype == KILN_F32 && x->ndim == 3 && y->ndim == yn &&
		 H > 0 && I > 0 && y->dims[0] == x->dims[0] && (last || y->dims[1] == x->dims[1]) &&
		 wi->dtype == KILN_F32 && numel(wi) == G * H * I && wh->dtype == KILN_F32 &&
		 numel(wh) == G * H * H;
	for (int k = 3; !bwd && k < 5 && ok; k++)
		ok = op->in[k].dtype == KILN_F32 && numel(&op->in[k]) == G * H;
	if (!bwd && op->n_in == 6)
		ok = ok && op->in[5].dtype == KILN_I32 && numel(&op->in[5]) == x->dims[0] * x->dims[1];
	if (bwd)
		ok = ok && like_x(&op->out[0], x) && numel(&op->out[1]) == numel(wi) &&
		     numel(&op->out[2]) == numel(wh) && op->out[3].dtype == KILN_F32 &&
		     numel(&op->out[3]) == 2 * G * H;
	if (!ok)
		BAD(KILN_EINVAL, "wants f32 x [B,T,I], y and dy [B,T,H] ([B,H] with i[4]), w_ih [G*H,I], w_hh [G*H,H], biases [G*H] (G = 4 LSTM, 3 GRU), i32 ids [B,T], db [2,G*H]");
	return KILN_OK;
}

/* onecycle's rise ends at pct_start x U - 1: at 0 its first rate is 0/0
 * (see KILN_OP_LR_SCHEDULE), unless the op is run only past it (i[4], the
 * first step it will be run at, after the warmup's i[2]) */
static int onecycle_rise_empty(const struct kiln_op *op)
{
	const int64_t U = op->i[1] - op->i[2] > 1 ? op->i[1] - op->i[2] : 1;
	return op->f[4] * (double)U - 1 == 0 && op->i[4] <= op->i[2];
}

/* The gradient passes' checks: GRAD_CLIP and UNSCALE (grads in and out,
 * the state [4]; GRAD_CLIP's in1 since ABI 2.32 the block sums GRAD_SUMSQ
 * wrote), and GRAD_SUMSQ (a range of blocks' sums of squares). */
static kiln_status check_grad_pass(const char *who, const struct kiln_op *op)
{
	kiln_status st;
	if (op->type == KILN_OP_GRAD_SUMSQ) {
		if ((st = counts(who, op, 1, 1)))
			return st;
		const int64_t n = op->i[0], nb = (n + 1023) / 1024;
		if (n <= 0 || numel(&op->in[0]) != n || numel(&op->out[0]) != nb ||
		    op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32 || op->i[1] < 0 || op->i[1] > op->i[2] || op->i[2] > nb)
			BAD(KILN_EINVAL, "wants f32 grads [n = i[0]], f32 sums [ceil(n / 1024)] and blocks 0 <= i[1] <= i[2] <= ceil(n / 1024) (got %lld, %lld)",
			    (long long)op->i[1], (long long)op->i[2]);
		return KILN_OK;
	}
	const int unscale = op->type == KILN_OP_UNSCALE;
	/* (GRAD_CLIP's in1, ABI 2.32: the block sums GRAD_SUMSQ wrote) */
	const int sums = !unscale && op->n_in == 2;
	if ((st = counts(who, op, unscale || sums ? 2 : 1, 2)))
		return st;
	const int64_t n = op->i[0];
	if (n <= 0 || numel(&op->in[0]) != n || numel(&op->out[0]) != n ||
	    numel(&op->out[1]) != 4 || !(op->f[0] >= 0) || !(op->f[1] >= 0))
		BAD(KILN_EINVAL, "wants grads [n = i[0]] in and out, state [4], f[0], f[1] >= 0");
	if (unscale && numel(&op->in[1]) != 4)
		BAD(KILN_EINVAL, "wants the scaler state f32[4] as in1");
	if (sums && (numel(&op->in[1]) != (n + 1023) / 1024 || op->in[1].dtype != KILN_F32))
		BAD(KILN_EINVAL, "wants the block sums f32[ceil(n / 1024)] as in1");
	return KILN_OK;
}

static kiln_status check_small(const char *who, const struct kiln_op *op)
{
	kiln_status st;
	switch (op->type) {
	case KILN_OP_LR_SCHEDULE:
		if ((st = counts(who, op, 1, 1)))
			return st;
		if (op->in[0].dtype != KILN_I64 || numel(&op->in[0]) != 1 ||
		    op->out[0].dtype != KILN_F32 || numel(&op->out[0]) != 1)
			BAD(KILN_EINVAL, "wants an i64[1] step and an f32[1] lr");
		if (op->i[0] < KILN_SCHED_CONSTANT || op->i[0] > KILN_SCHED_POLYNOMIAL)
			BAD(KILN_ENOTSUP, "unknown schedule i[0] = %lld", (long long)op->i[0]);
		if ((op->i[0] == KILN_SCHED_STEP && op->i[3] < 1) ||
		    (op->i[0] == KILN_SCHED_MULTISTEP && (op->i[3] < 0 || op->i[3] > 12)) ||
		    (op->i[0] == KILN_SCHED_ONECYCLE &&
		     (!(op->f[2] > 0) || !(op->f[3] > 0) || !(op->f[4] > 0 && op->f[4] < 1) ||
		      onecycle_rise_empty(op) || (op->i[5] & ~1) || (op->i[6] & ~1))))
			BAD(KILN_EINVAL, "bad schedule parameters (step_size >= 1; at most 12 milestones; onecycle div factors > 0, 0 < pct_start < 1 and pct_start x max(T - W, 1) != 1 unless the first step i[4] > W, three_phase i[5] and anneal_strategy i[6] 0 or 1)");
		/* (LinearLR and PolynomialLR divide by total_iters; LinearLR
		 * refuses factors outside these ranges, PolynomialLR's negative
		 * power would make its last rate 0^-p) */
		if ((op->i[0] == KILN_SCHED_EXPONENTIAL && !(op->f[2] >= 0 && isfinite(op->f[2]))) ||
		    (op->i[0] == KILN_SCHED_LINEAR &&
		     (op->i[3] < 1 || !(op->f[2] > 0 && op->f[2] <= 1) || !(op->f[3] >= 0 && op->f[3] <= 1))) ||
		    (op->i[0] == KILN_SCHED_POLYNOMIAL &&
		     (op->i[3] < 1 || !(op->f[2] >= 0 && isfinite(op->f[2])))))
			BAD(KILN_EINVAL, "bad schedule parameters (exponential: gamma f[2] >= 0; linear: total_iters i[3] >= 1, 0 < start_factor f[2] <= 1, 0 <= end_factor f[3] <= 1; polynomial: total_iters i[3] >= 1, power f[2] >= 0)");
		return KILN_OK;
	case KILN_OP_COUNTER_ADD: /* gated: in0 is the gate */
		if ((st = counts(who, op, (op->flags & KILN_OPF_GATED) != 0, 1)))
			return st;
		if (op->out[0].dtype != KILN_I64 || numel(&op->out[0]) != 1)
			BAD(KILN_EINVAL, "wants an i64[1] counter");
		if (op->n_in && (op->in[0].dtype != KILN_F32 || numel(&op->in[0]) != 1))
			BAD(KILN_EINVAL, "the gate (in0, KILN_OPF_GATED) must be f32[1]");
		return KILN_OK;
	case KILN_OP_FILL:
		if ((st = counts(who, op, 0, 1)))
			return st;
		if (!kiln_dtype_size(op->out[0].dtype))
			BAD(KILN_ENOTSUP, "unknown dtype");
		return KILN_OK;
	case KILN_OP_CAST: {
		if ((st = counts(who, op, 1, 1)))
			return st;
		const int di = op->in[0].dtype, dout = op->out[0].dtype;
		const int lo_i = di == KILN_BF16 || di == KILN_F16;
		const int lo_o = dout == KILN_BF16 || dout == KILN_F16;
		if (!((di == KILN_F32 && lo_o) || (lo_i && dout == KILN_F32)) ||
		    numel(&op->in[0]) != numel(&op->out[0]))
			BAD(KILN_EINVAL, "casts f32 to bf16 or f16, or back, same element count");
		return KILN_OK;
	}
	case KILN_OP_NORMALIZE_U8:
		if ((st = counts(who, op, 1, 1)))
			return st;
		if (op->in[0].dtype != KILN_U8 || !is_float(op->out[0].dtype) ||
		    op->in[0].ndim != 4 || numel(&op->in[0]) != numel(&op->out[0]) ||
		    op->in[0].layout != op->out[0].layout)
			BAD(KILN_EINVAL, "wants u8 [N, C, H, W] in and floating point of the same shape and layout out");
		if (op->in[0].dims[1] < 1 || op->in[0].dims[1] > 3)
			BAD(KILN_ENOTSUP, "1 to 3 channels");
		for (int k = 0; k < op->in[0].dims[1]; k++)
			if (!(op->f[3 + k] > 0) || !isfinite(op->f[k]))
				BAD(KILN_EINVAL, "std must be > 0 and mean finite");
		return KILN_OK;
	case KILN_OP_BIAS_ADD:
	case KILN_OP_BIAS_GRAD: {
		if ((st = counts(who, op, 1, 1)))
			return st;
		/* bias is in0 for ADD, out0 for GRAD; the matrix the other */
		const int add = op->type == KILN_OP_BIAS_ADD;
		const struct kiln_tensor_desc *b = add ? &op->in[0] : &op->out[0];
		const struct kiln_tensor_desc *x = add ? &op->out[0] : &op->in[0];
		const int64_t cols = numel(b);
		if (cols <= 0 || inner(x) != cols || numel(x) % cols)
			BAD(KILN_EINVAL, "bias [N] does not match the last dimension of [R,N]");
		return KILN_OK;
	}
	case KILN_OP_RELU:
	case KILN_OP_SCALE:
		if ((st = counts(who, op, 1, 1)))
			return st;
		if (numel(&op->out[0]) != numel(&op->in[0]))
			BAD(KILN_EINVAL, "input and output sizes differ");
		return KILN_OK;
	case KILN_OP_REDUCE_SUM:
		if ((st = counts(who, op, 1, 1)))
			return st;
		if (numel(&op->out[0]) != 1)
			BAD(KILN_EINVAL, "output must have one element");
		return KILN_OK;
	case KILN_OP_RELU_BWD:
	case KILN_OP_ADD:
	case KILN_OP_MUL:
		if (op->type == KILN_OP_RELU_BWD && op->n_out == 2) { /* + the bias gradient, 2.9 */
			const int64_t cols = numel(&op->out[1]);
			if (op->out[1].dtype != KILN_F32 || cols <= 0 || inner(&op->out[0]) != cols)
				BAD(KILN_EINVAL, "out1 (the bias gradient) must be f32 [N], N the innermost dimension of out0");
		} else if ((st = counts(who, op, 2, 1)))
			return st;
		if (op->n_in != 2)
			BAD(KILN_EINVAL, "takes 2 inputs, got %d", op->n_in);
		if (numel(&op->in[0]) != numel(&op->out[0]) || numel(&op->in[1]) != numel(&op->out[0]))
			BAD(KILN_EINVAL, "input and output sizes differ");
		/* ADD's u8 output (2.10): f32 inputs, its scale f[0] */
		if (op->out[0].dtype == KILN_U8 &&
		    (op->type != KILN_OP_ADD || op->in[0].dtype != KILN_F32 ||
		     op->in[1].dtype != KILN_F32 || (op->flags & KILN_OPF_ACCUMULATE) ||
		     !(op->f[0] > 0) || !isfinite(op->f[0])))
			BAD(KILN_EINVAL, "a u8 output is ADD's alone, with f32 inputs, no accumulate and its scale f[0] > 0 (got %g)",
			    op->f[0]);
		return KILN_OK;
	case KILN_OP_SCALER_UPDATE:
		if ((st = counts(who, op, 1, 1)))
			return st;
		if (numel(&op->in[0]) != 4 || numel(&op->out[0]) != 4)
			BAD(KILN_EINVAL, "wants the gate state f32[4] in, the scaler state f32[4] out");
		/* (the state's f32 counters count exactly up to 2^24) */
		if (op->i[0] < 1 || op->i[1] < 1 || op->i[0] > (1 << 24) ||
		    op->i[1] > (1 << 24) || !(op->f[0] >= 1) ||
		    !(op->f[1] > 0 && op->f[1] <= 1) || !(op->f[2] >= 0) || !(op->f[3] >= 0))
			BAD(KILN_EINVAL, "growth interval i[0] and hysteresis i[1] in [1, 2^24], growth f[0] >= 1, 0 < backoff f[1] <= 1, min f[2] and max f[3] scale >= 0");
		return KILN_OK;
	}
	return kiln_error(KILN_EINTERNAL, "%s: op %d has no check", who, op->type);
}

/* QCONV and QLINEAR (ABI 2.6): CONV's and GEMM's checks (QLINEAR: x
 * [M,K] times w [N,K] transposed), f32 weights and bias, and the input's
 * scale.  x and y f32, or (ABI 2.8, chained INT8) u8: a u8 x is already
 * quantized (i[8] = 1), a u8 y has its scale f[1] > 0.  The shapes are
 * checked on *f: op with its u8 operands described as f32. */
static kiln_status check_quant_common(const char *who, const struct kiln_op *op, struct kiln_op *f)
{
	const int xd = op->in[0].dtype, yd = op->out[0].dtype;
	for (int k = 1; k < op->n_in; k++)
		if (op->in[k].dtype != KILN_F32)
			BAD(KILN_EINVAL, "wants f32 weights and bias (the op quantizes them itself)");
	if ((xd != KILN_F32 && xd != KILN_U8) || (yd != KILN_F32 && yd != KILN_U8))
		BAD(KILN_EINVAL, "wants an f32 or u8 input and output, got %s and %s",
		    kiln_dtype_name(xd), kiln_dtype_name(yd));
	if (!(op->f[0] > 0) || !isfinite(op->f[0]) || (op->i[8] != 0 && op->i[8] != 1))
		BAD(KILN_EINVAL, "wants the input's scale f[0] > 0 (got %g) and i[8] = 0 (s8) or 1 (u8)",
		    op->f[0]);
	if (xd == KILN_U8 && op->i[8] != 1)
		BAD(KILN_EINVAL, "a u8 input (already quantized) wants i[8] = 1");
	if (yd == KILN_U8 && (!(op->f[1] > 0) || !isfinite(op->f[1])))
		BAD(KILN_EINVAL, "a u8 output wants its scale f[1] > 0 (got %g)", op->f[1]);
	*f = *op;
	f->in[0].dtype = f->out[0].dtype = KILN_F32;
	return KILN_OK;
}

static kiln_status check_qconv(const char *who, const struct kiln_op *op)
{
	struct kiln_op f;
	kiln_status st = check_quant_common(who, op, &f);
	return st ? st : check_conv(who, &f);
}

static kiln_status check_qlinear(const char *who, const struct kiln_op *op)
{
	struct kiln_op f;
	kiln_status st = check_quant_common(who, op, &f);
	if (st)
		return st;
	if (op->i[0] != 0 || op->i[1] != 1)
		BAD(KILN_EINVAL, "is x[M,K] w[N,K]^T: i[0] = 0, i[1] = 1");
	return check_gemm(who, &f);
}

/* ---- the op table ------------------------------------------------------
 * One row per op type of kiln/ops.h: its name (messages, the profiler's
 * table), its check and the ABI 2 minor that added it (0: 2.0's ops, all
 * of 1.x; docs/plugins.md's "ABI 2.N" entries): a device built before it
 * never knew the type, so the core neither asks its has_op about it nor
 * prepares it (kiln_device_has_op).  Sized by the rows and tied to the
 * enum below, so an op appended to kiln/ops.h without a row here does not
 * compile (a row missing in the middle is refused at run time as "has no
 * row").  ROW names all three, so a row without its minor does not compile
 * either (a row written as the ones before ABI 2.32's column would get
 * minor 0, and the core would ask an old device's has_op about a new op);
 * tests/check_device_gemm's op_abi_minors checks the minors' order. */

typedef kiln_status (*op_check_fn)(const char *who, const struct kiln_op *op);

#define ROW(op, check, minor) [KILN_OP_##op] = { #op, check, minor }

static const struct {
	const char *name;
	op_check_fn check;
	unsigned minor; /* KILN_ABI_MINOR of ABI 2 that added the op */
} op_rows[] = {
	ROW(GEMM, check_gemm, 0),
	ROW(BIAS_ADD, check_small, 0),
	ROW(BIAS_GRAD, check_small, 0),
	ROW(RELU, check_small, 0),
	ROW(RELU_BWD, check_small, 0),
	ROW(SOFTMAX_XENT, check_xent, 0),
	ROW(SGD, check_optim, 0),
	ROW(FILL, check_small, 0),
	ROW(REDUCE_SUM, check_small, 0),
	ROW(SCALE, check_small, 0),
	ROW(ADD, check_small, 0),
	ROW(NORMALIZE_U8, check_small, 0),
	ROW(CONV, check_conv, 0),
	ROW(CONV_BWD_DATA, check_conv, 0),
	ROW(CONV_BWD_WEIGHTS, check_conv, 0),
	ROW(BN_TRAIN, check_bn, 0),
	ROW(BN_INFER, check_bn, 0),
	ROW(BN_BWD, check_bn, 0),
	ROW(POOL, check_pool, 0),
	ROW(POOL_BWD, check_pool, 0),
	ROW(ACT, check_act, 0),
	ROW(ACT_BWD, check_act, 0),
	ROW(DROPOUT, check_dropout, 0),
	ROW(DROPOUT_BWD, check_dropout, 0),
	ROW(CONCAT, check_layout, 0),
	ROW(SPLIT, check_layout, 0),
	ROW(REORDER, check_layout, 0),
	ROW(COUNTER_ADD, check_small, 0),
	ROW(MUL, check_small, 0),
	ROW(LR_SCHEDULE, check_small, 0),
	ROW(ADAMW, check_optim, 0),
	ROW(LAMB, check_optim, 0),
	ROW(GRAD_CLIP, check_grad_pass, 0),
	ROW(CAST, check_small, 0),
	ROW(UNSCALE, check_grad_pass, 0),
	ROW(SCALER_UPDATE, check_small, 0),
	ROW(BN_STATS, check_bn_sync, 0),
	ROW(BN_APPLY, check_bn_sync, 0),
	ROW(BN_BWD_REDUCE, check_bn_sync, 0),
	ROW(BN_BWD_APPLY, check_bn_sync, 0),
	ROW(EMBEDDING, check_embedding, 1),
	ROW(EMBEDDING_BWD, check_embedding, 1),
	ROW(LAYERNORM, check_layernorm, 1),
	ROW(LAYERNORM_BWD, check_layernorm, 1),
	ROW(ATTENTION, check_attention, 1),
	ROW(ATTENTION_BWD, check_attention, 1),
	ROW(ATTENTION_DECODE, check_attention_decode, 2),
	ROW(RNN, check_rnn, 5),
	ROW(RNN_BWD, check_rnn, 5),
	ROW(QCONV, check_qconv, 6),
	ROW(QLINEAR, check_qlinear, 6),
	ROW(ATTENTION_DECODE_RUN, check_attention_decode, 31),
	ROW(GRAD_SUMSQ, check_grad_pass, 32),
};
#undef ROW
_Static_assert(KILN_ARRAY_LEN(op_rows) == KILN_OP_TYPE_COUNT,
	       "every op of kiln/ops.h needs a row in op_rows (name, check and minor)");

const char *kiln_op_name(int type)
{
	if (type > 0 && type < KILN_OP_TYPE_COUNT && op_rows[type].name)
		return op_rows[type].name;
	return "unknown op";
}

unsigned kiln_op_abi_minor(int type)
{
	return type > 0 && type < KILN_OP_TYPE_COUNT ? op_rows[type].minor : UINT_MAX;
}

/* KILN_OPF_ACT (kiln/ops.h): only on the ops that take an epilogue, a
 * known activation, never with accumulation; BN_BWD folds ReLU only, and
 * a training max POOL (ABI 2.16) the ReLU before it. */
static kiln_status check_act_flag(const char *who, const struct kiln_op *op)
{
	const int t = op->type;
	const int64_t kind = op->i[KILN_OPI_ACT];
	if (t == KILN_OP_POOL) {
		if (op->i[0] != KILN_POOL_MAX || op->n_out != 2 || kind != KILN_ACT_RELU)
			BAD(KILN_EINVAL, "KILN_OPF_ACT on POOL: a training max pooling (out1, the aux) folding a ReLU only");
		return KILN_OK;
	}
	if (t != KILN_OP_GEMM && t != KILN_OP_CONV && t != KILN_OP_BN_TRAIN && t != KILN_OP_BN_INFER &&
	    t != KILN_OP_BN_BWD && t != KILN_OP_QCONV && t != KILN_OP_QLINEAR)
		BAD(KILN_EINVAL, "KILN_OPF_ACT is for GEMM, CONV, QCONV, QLINEAR, the batchnorm ops and a training max POOL");
	if (kind < KILN_ACT_RELU || kind > KILN_ACT_GELU_TANH || (t == KILN_OP_BN_BWD && kind))
		BAD(KILN_EINVAL, "KILN_OPF_ACT: unknown activation i[15] (BN_BWD folds relu only)");
	if (op->flags & KILN_OPF_ACCUMULATE)
		BAD(KILN_EINVAL, "KILN_OPF_ACT cannot accumulate");
	return KILN_OK;
}

kiln_status kiln_op_check(const struct kiln_op *op, const char *who)
{
	kiln_status st;
	if (op->type <= 0 || op->type >= KILN_OP_TYPE_COUNT)
		return kiln_error(KILN_ENOTSUP, "%s: unknown op type %d", who, op->type);
	if (!op_rows[op->type].check)
		return kiln_error(KILN_EINTERNAL, "%s: op %d has no row in the core's op table", who,
				  op->type);
	if (op->n_in < 0 || op->n_in > KILN_OP_MAX_IN || op->n_out < 0 ||
	    op->n_out > KILN_OP_MAX_OUT)
		return kiln_error(KILN_EINVAL, "%s: %s: n_in %d / n_out %d out of range", who,
				  kiln_op_name(op->type), op->n_in, op->n_out);
	for (int k = 0; k < op->n_in + op->n_out; k++) {
		const struct kiln_tensor_desc *d = k < op->n_in ? &op->in[k] : &op->out[k - op->n_in];
		int ok = d->ndim >= 0 && d->ndim <= KILN_MAX_DIMS && d->dtype >= 0 &&
			 d->dtype < KILN_DTYPE_COUNT;
		for (int i = 0; ok && i < d->ndim; i++)
			ok = d->dims[i] >= 0;
		if (!ok)
			return kiln_error(KILN_EINVAL, "%s: %s: %s%d has a bad descriptor (dtype %d, %d dims)",
					  who, kiln_op_name(op->type), k < op->n_in ? "in" : "out",
					  k < op->n_in ? k : k - op->n_in, d->dtype, d->ndim);
	}
	if ((op->flags & KILN_OPF_ACT) && (st = check_act_flag(who, op)))
		return st;
	if ((op->flags & KILN_OPF_KEEP) && op->type != KILN_OP_CONV &&
	    op->type != KILN_OP_CONV_BWD_DATA && op->type != KILN_OP_CONV_BWD_WEIGHTS)
		return kiln_error(KILN_EINVAL, "%s: %s: KILN_OPF_KEEP is for the three convolution ops",
				  who, kiln_op_name(op->type));
	if ((op->flags & KILN_OPF_FROZEN) &&
	    ((op->type != KILN_OP_CONV && op->type != KILN_OP_QCONV && op->type != KILN_OP_QLINEAR &&
	      op->type != KILN_OP_GEMM) ||
	     (op->flags & KILN_OPF_KEEP) ||
	     (op->type == KILN_OP_GEMM &&
	      ((op->flags & KILN_OPF_ACCUMULATE) || op->in[0].dtype != KILN_F32 ||
	       op->in[1].dtype != KILN_F32 || op->out[0].dtype != KILN_F32))))
		return kiln_error(KILN_EINVAL, "%s: %s: KILN_OPF_FROZEN is for CONV (without KILN_OPF_KEEP), QCONV, QLINEAR and an f32 GEMM (without KILN_OPF_ACCUMULATE)",
				  who, kiln_op_name(op->type));
	return op_rows[op->type].check(who, op);
}
