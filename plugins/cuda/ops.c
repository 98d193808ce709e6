/* plugins/cuda/ops.c - prepare for kiln's own kernels (kernels.cu): check
 * the shapes and dtypes once, fix the sizes in the plan, pick the
 * launcher.  The checks are the CPU device's (plugins/cpu/ops.c, optim.c),
 * so both devices accept and refuse the same ops with the same status.
 *
 * Implemented: the op set of a multilayer perceptron's training and
 * evaluation step (GEMM is gemm.c) plus the trainer's own ops: BIAS_ADD,
 * BIAS_GRAD, RELU, RELU_BWD, SOFTMAX_XENT (all three losses), SGD, ADAMW,
 * FILL, REDUCE_SUM, SCALE, ADD, MUL, COUNTER_ADD, LR_SCHEDULE,
 * NORMALIZE_U8, CAST, GRAD_CLIP, and dynamic loss scaling (UNSCALE,
 * SCALER_UPDATE, SOFTMAX_XENT's loss-scale input in2).  Every other op
 * (convolution, batch norm, pooling, the general activations, dropout,
 * concat/split, reorder, LAMB) is KILN_ENOTSUP naming the op, which the
 * core reports before training.
 */
#include "cuda.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The stored innermost extent: channels for a 4-d NHWC activation. */
static int64_t cuda_inner(const struct kiln_tensor_desc *d)
{
	if (d->ndim <= 0)
		return 1;
	if (d->ndim == 4 && d->layout == KILN_NHWC)
		return d->dims[1];
	return d->dims[d->ndim - 1];
}

static int cuda_all_f32(const struct kiln_op *op)
{
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].dtype != KILN_F32)
			return 0;
	for (int i = 0; i < op->n_out; i++)
		if (op->out[i].dtype != KILN_F32)
			return 0;
	return 1;
}

/* bf16 from f32, round to nearest even (NaN kept quiet): FILL's pattern */
static uint16_t host_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* FILL: the value as the dtype's bit pattern (sz[0]) and width (sz[1]) */
static kiln_status fill_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const double v = op->f[0];
	uint64_t bits = 0;
	int width;
	switch (op->out[0].dtype) {
	case KILN_F32: {
		const float f = (float)v;
		uint32_t u;
		memcpy(&u, &f, 4);
		bits = u, width = 4;
		break;
	}
	case KILN_I32: bits = (uint32_t)(int32_t)v, width = 4; break;
	case KILN_I64: bits = (uint64_t)(int64_t)v, width = 8; break;
	case KILN_U8: bits = (uint8_t)v, width = 1; break;
	case KILN_I8: bits = (uint8_t)(int8_t)v, width = 1; break;
	case KILN_BF16: bits = host_bf16((float)v), width = 2; break;
	case KILN_F16: {
		_Float16 h = (_Float16)v;
		uint16_t u;
		memcpy(&u, &h, 2);
		bits = u, width = 2;
		break;
	}
	default: return cuda_bad(c, op, KILN_ENOTSUP, "unknown dtype");
	}
	p->sz[0] = (int64_t)bits;
	p->sz[1] = width;
	p->n = cuda_numel(&op->out[0]);
	return KILN_OK;
}

/* SGD and AdamW: the CPU device's checks (plugins/cpu/optim.c). */
static kiln_status optim_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int sgd = op->type == KILN_OP_SGD;
	const int in_min = sgd ? 2 : 3;
	const int out_n = sgd ? (op->f[0] == 0.0 && op->n_out == 1 ? 1 : 2) : 3;
	const int n_in = op->n_in - ((op->flags & KILN_OPF_GATED) != 0);
	char why[200];
	p->launch = sgd ? cuda_launch_sgd : cuda_launch_adamw;
	if ((op->flags & KILN_OPF_GATED) &&
	    (op->in[op->n_in - 1].dtype != KILN_F32 || cuda_numel(&op->in[op->n_in - 1]) != 1))
		return cuda_bad(c, op, KILN_EINVAL, "the gate (last input, KILN_OPF_GATED) must be f32[1]");
	if ((n_in != in_min && n_in != in_min + 1) || op->n_out != out_n) {
		snprintf(why, sizeof why, "takes %d or %d inputs (the last: the weight-decay multiplier) and %d outputs, got %d and %d",
			 in_min, in_min + 1, out_n, n_in, op->n_out);
		return cuda_bad(c, op, KILN_EINVAL, why);
	}
	p->n_in = op->n_in;
	p->n_out = out_n;
	p->n = op->i[0];
	for (int i = 0; i < n_in; i++) {
		const int want = i == 2 && !sgd ? KILN_I64 : KILN_F32;
		if (op->in[i].dtype != want) {
			snprintf(why, sizeof why, "input %d must be %s", i, want == KILN_I64 ? "i64" : "f32");
			return cuda_bad(c, op, KILN_ENOTSUP, why);
		}
	}
	for (int i = 0; i < out_n; i++)
		if (op->out[i].dtype != KILN_F32)
			return cuda_bad(c, op, KILN_ENOTSUP, "outputs must be f32");
	int ok = p->n > 0 && cuda_numel(&op->in[0]) == p->n && cuda_numel(&op->in[1]) == 1;
	for (int i = 0; i < out_n; i++)
		ok = ok && cuda_numel(&op->out[i]) == p->n;
	if (!sgd)
		ok = ok && cuda_numel(&op->in[2]) == 1;
	if (n_in == in_min + 1)
		ok = ok && cuda_numel(&op->in[in_min]) == p->n;
	if (!ok) {
		snprintf(why, sizeof why,
			 "n = i[0] = %lld must be the size of grads, params, state and multiplier; lr%s [1]",
			 (long long)op->i[0], sgd ? "" : " and step");
		return cuda_bad(c, op, KILN_EINVAL, why);
	}
	if (!sgd && (!(op->f[0] >= 0 && op->f[0] < 1) || !(op->f[1] >= 0 && op->f[1] < 1) ||
		     !(op->f[2] >= 0) || !isfinite(op->f[3])))
		return cuda_bad(c, op, KILN_EINVAL, "wants 0 <= beta1, beta2 < 1, eps >= 0, finite weight decay");
	return KILN_OK;
}

kiln_status cuda_ops_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	int need_in, need_out;
	char why[160];

	switch (op->type) {
	case KILN_OP_BIAS_ADD: need_in = 1; need_out = 1; p->launch = cuda_launch_bias_add; break;
	case KILN_OP_BIAS_GRAD: need_in = 1; need_out = 1; p->launch = cuda_launch_bias_grad; break;
	case KILN_OP_RELU: need_in = 1; need_out = 1; p->launch = cuda_launch_relu; break;
	case KILN_OP_RELU_BWD: need_in = 2; need_out = 1; p->launch = cuda_launch_relu_bwd; break;
	case KILN_OP_SOFTMAX_XENT:
		need_in = op->n_in == 3 ? 3 : 2; /* in2: the loss scale (optional) */
		need_out = 2;
		p->launch = cuda_launch_softmax_xent;
		break;
	case KILN_OP_GRAD_CLIP: need_in = 1; need_out = 2; p->launch = cuda_launch_grad_clip; break;
	case KILN_OP_UNSCALE: need_in = 2; need_out = 2; p->launch = cuda_launch_grad_clip; break;
	case KILN_OP_SCALER_UPDATE: need_in = 1; need_out = 1; p->launch = cuda_launch_scaler_update; break;
	case KILN_OP_SGD:
	case KILN_OP_ADAMW: return optim_prepare(c, p);
	case KILN_OP_FILL: need_in = 0; need_out = 1; p->launch = cuda_launch_fill; break;
	case KILN_OP_COUNTER_ADD: /* in0: the gate, when gated */
		need_in = (op->flags & KILN_OPF_GATED) != 0;
		need_out = 1;
		p->launch = cuda_launch_counter_add;
		break;
	case KILN_OP_LR_SCHEDULE: need_in = 1; need_out = 1; p->launch = cuda_launch_lr_schedule; break;
	case KILN_OP_REDUCE_SUM: need_in = 1; need_out = 1; p->launch = cuda_launch_reduce_sum; break;
	case KILN_OP_SCALE: need_in = 1; need_out = 1; p->launch = cuda_launch_scale; break;
	case KILN_OP_ADD: need_in = 2; need_out = 1; p->launch = cuda_launch_add; break;
	case KILN_OP_MUL: need_in = 2; need_out = 1; p->launch = cuda_launch_mul; break;
	case KILN_OP_NORMALIZE_U8: need_in = 1; need_out = 1; p->launch = cuda_launch_normalize_u8; break;
	case KILN_OP_CAST: need_in = 1; need_out = 1; p->launch = cuda_launch_cast; break;
	default:
		if (op->type > 0 && op->type < KILN_OP_TYPE_COUNT)
			return c->host->error(KILN_ENOTSUP,
					      "cuda: %s is not implemented by the CUDA device yet (use device = cpu for this model)",
					      cuda_op_name(op->type));
		return c->host->error(KILN_ENOTSUP, "cuda: unknown op type %d", op->type);
	}
	if (op->n_in != need_in || op->n_out != need_out) {
		snprintf(why, sizeof why, "takes %d inputs and %d outputs, got %d and %d", need_in,
			 need_out, op->n_in, op->n_out);
		return cuda_bad(c, op, KILN_EINVAL, why);
	}
	p->n_in = need_in;
	p->n_out = need_out;

	if (op->type == KILN_OP_LR_SCHEDULE) {
		if (op->in[0].dtype != KILN_I64 || cuda_numel(&op->in[0]) != 1 ||
		    op->out[0].dtype != KILN_F32 || cuda_numel(&op->out[0]) != 1)
			return cuda_bad(c, op, KILN_EINVAL, "wants an i64[1] step and an f32[1] lr");
		if (op->i[0] < KILN_SCHED_CONSTANT || op->i[0] > KILN_SCHED_ONECYCLE)
			return cuda_bad(c, op, KILN_ENOTSUP, "unknown schedule");
		if ((op->i[0] == KILN_SCHED_STEP && op->i[3] < 1) ||
		    (op->i[0] == KILN_SCHED_MULTISTEP && (op->i[3] < 0 || op->i[3] > 12)) ||
		    (op->i[0] == KILN_SCHED_ONECYCLE &&
		     (!(op->f[2] > 0) || !(op->f[3] > 0) || !(op->f[4] > 0 && op->f[4] < 1))))
			return cuda_bad(c, op, KILN_EINVAL, "bad schedule parameters (step_size >= 1; at most 12 milestones; onecycle div factors > 0 and 0 < pct_start < 1)");
		return KILN_OK;
	}
	if (op->type == KILN_OP_COUNTER_ADD) {
		if (op->out[0].dtype != KILN_I64 || cuda_numel(&op->out[0]) != 1)
			return cuda_bad(c, op, KILN_EINVAL, "wants an i64[1] counter");
		if (need_in && (op->in[0].dtype != KILN_F32 || cuda_numel(&op->in[0]) != 1))
			return cuda_bad(c, op, KILN_EINVAL, "the gate (in0, KILN_OPF_GATED) must be f32[1]");
		return KILN_OK;
	}
	if (op->type == KILN_OP_FILL)
		return fill_prepare(c, p);
	if (op->type == KILN_OP_SOFTMAX_XENT) {
		if (op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32 ||
		    op->out[1].dtype != KILN_F32 || op->in[1].dtype != KILN_I32)
			return cuda_bad(c, op, KILN_ENOTSUP,
					"needs f32 logits, i32 labels, f32 gradient and f32 metrics");
		if (op->n_in == 3 && (op->in[2].dtype != KILN_F32 || cuda_numel(&op->in[2]) != 1))
			return cuda_bad(c, op, KILN_EINVAL, "the loss scale in2 must be f32[1]");
		p->cols = cuda_inner(&op->in[0]);
		p->rows = p->cols > 0 ? cuda_numel(&op->in[0]) / p->cols : 0;
		if (p->cols <= 0 || op->in[0].ndim != 2 || cuda_numel(&op->in[1]) != p->rows ||
		    cuda_numel(&op->out[0]) != p->rows * p->cols || cuda_numel(&op->out[1]) < 2)
			return cuda_bad(c, op, KILN_EINVAL,
					"wants logits [N,C], labels [N], dlogits [N,C], metrics [2]");
		if (p->cols > INT32_MAX - 1)
			return cuda_bad(c, op, KILN_ENOTSUP, "more than 2^31 - 2 classes");
		if (op->i[0] < 0 || op->i[0] > p->rows) {
			snprintf(why, sizeof why, "valid rows i[0] = %lld outside [0, %lld]",
				 (long long)op->i[0], (long long)p->rows);
			return cuda_bad(c, op, KILN_EINVAL, why);
		}
		if (op->i[1] < KILN_LOSS_XENT || op->i[1] > KILN_LOSS_BCE)
			return cuda_bad(c, op, KILN_ENOTSUP, "unknown loss i[1]");
		if (!(op->f[1] >= 0 && op->f[1] <= 1))
			return cuda_bad(c, op, KILN_EINVAL, "label smoothing f[1] outside [0, 1]");
		p->sz[0] = cuda_numel(&op->out[1]); /* 3: also count top-5 */
		p->sz[3] = CUDA_RED_BLOCKS * 4 * sizeof(double); /* block partials (struct xent_part) */
		return KILN_OK;
	}
	if (op->type == KILN_OP_CAST) {
		p->n = cuda_numel(&op->out[0]);
		const int di = op->in[0].dtype, dout = op->out[0].dtype;
		if (!((di == KILN_F32 && dout == KILN_BF16) || (di == KILN_BF16 && dout == KILN_F32)) ||
		    cuda_numel(&op->in[0]) != p->n)
			return cuda_bad(c, op, KILN_EINVAL, "casts f32 to bf16 or bf16 to f32, same element count");
		return KILN_OK;
	}
	if (op->type == KILN_OP_NORMALIZE_U8) {
		p->n = cuda_numel(&op->out[0]);
		if (op->in[0].dtype != KILN_U8 || op->out[0].dtype != KILN_F32 ||
		    op->in[0].ndim != 4 || cuda_numel(&op->in[0]) != p->n ||
		    op->in[0].layout != op->out[0].layout)
			return cuda_bad(c, op, KILN_EINVAL, "wants u8 [N, C, H, W] in and f32 of the same shape and layout out");
		p->sz[0] = op->in[0].dims[1];
		p->sz[1] = op->in[0].dims[2] * op->in[0].dims[3];
		if (p->sz[0] < 1 || p->sz[0] > 3)
			return cuda_bad(c, op, KILN_ENOTSUP, "1 to 3 channels");
		if (p->sz[1] < 1)
			return cuda_bad(c, op, KILN_EINVAL, "empty image");
		for (int k = 0; k < p->sz[0]; k++)
			if (!(op->f[3 + k] > 0) || !isfinite(op->f[k]))
				return cuda_bad(c, op, KILN_EINVAL, "std must be > 0 and mean finite");
		/* the same table, computed the same way, as the CPU device */
		for (int k = 0; k < p->sz[0]; k++)
			for (int u = 0; u < 256; u++)
				p->lut[k][u] = (float)((u / 255.0 - op->f[k]) / op->f[3 + k]);
		return KILN_OK;
	}
	if (!cuda_all_f32(op))
		return cuda_bad(c, op, KILN_ENOTSUP, "only f32 tensors are supported");

	switch (op->type) {
	case KILN_OP_BIAS_ADD:
	case KILN_OP_BIAS_GRAD: {
		/* bias is in0 for ADD, out0 for GRAD; the matrix the other */
		const struct kiln_tensor_desc *b = op->type == KILN_OP_BIAS_ADD ? &op->in[0] : &op->out[0];
		const struct kiln_tensor_desc *x = op->type == KILN_OP_BIAS_ADD ? &op->out[0] : &op->in[0];
		p->cols = cuda_numel(b);
		p->rows = p->cols > 0 ? cuda_numel(x) / p->cols : 0;
		if (p->cols <= 0 || cuda_inner(x) != p->cols || p->rows * p->cols != cuda_numel(x))
			return cuda_bad(c, op, KILN_EINVAL, "bias [N] does not match the last dimension of [R,N]");
		return KILN_OK;
	}
	case KILN_OP_RELU:
	case KILN_OP_SCALE:
	case KILN_OP_REDUCE_SUM:
		p->n = cuda_numel(&op->in[0]);
		if (op->type == KILN_OP_REDUCE_SUM ? cuda_numel(&op->out[0]) != 1
						   : cuda_numel(&op->out[0]) != p->n)
			return cuda_bad(c, op, KILN_EINVAL,
					op->type == KILN_OP_REDUCE_SUM ? "output must have one element"
								       : "input and output sizes differ");
		if (op->type == KILN_OP_REDUCE_SUM)
			p->sz[3] = CUDA_RED_BLOCKS * sizeof(double);
		return KILN_OK;
	case KILN_OP_RELU_BWD:
	case KILN_OP_ADD:
	case KILN_OP_MUL:
		p->n = cuda_numel(&op->out[0]);
		if (cuda_numel(&op->in[0]) != p->n || cuda_numel(&op->in[1]) != p->n)
			return cuda_bad(c, op, KILN_EINVAL, "input and output sizes differ");
		return KILN_OK;
	case KILN_OP_GRAD_CLIP:
	case KILN_OP_UNSCALE:
		p->n = op->i[0];
		if (p->n <= 0 || cuda_numel(&op->in[0]) != p->n || cuda_numel(&op->out[0]) != p->n ||
		    cuda_numel(&op->out[1]) != 4 || !(op->f[0] >= 0) || !(op->f[1] >= 0))
			return cuda_bad(c, op, KILN_EINVAL, "wants grads [n = i[0]] in and out, state [4], f[0], f[1] >= 0");
		if (op->type == KILN_OP_UNSCALE && cuda_numel(&op->in[1]) != 4)
			return cuda_bad(c, op, KILN_EINVAL, "wants the scaler state f32[4] as in1");
		/* block partials, then the scale and the rewrite flag */
		p->sz[3] = CUDA_RED_BLOCKS * sizeof(double) + 2 * sizeof(float);
		return KILN_OK;
	case KILN_OP_SCALER_UPDATE:
		if (cuda_numel(&op->in[0]) != 4 || cuda_numel(&op->out[0]) != 4)
			return cuda_bad(c, op, KILN_EINVAL, "wants the gate state f32[4] in, the scaler state f32[4] out");
		if (op->i[0] < 1 || op->i[1] < 1 || !(op->f[0] >= 1) || !(op->f[1] > 0 && op->f[1] <= 1) ||
		    !(op->f[2] >= 0) || !(op->f[3] >= 0))
			return cuda_bad(c, op, KILN_EINVAL, "growth interval i[0] and hysteresis i[1] >= 1, growth f[0] >= 1, 0 < backoff f[1] <= 1, min f[2] and max f[3] scale >= 0");
		return KILN_OK;
	}
	return c->host->error(KILN_EINTERNAL, "cuda: op %d fell through prepare", op->type);
}
