/* plugins/cuda/ops.c - prepare for kiln's own kernels (kernels.cu): fix
 * the sizes in the plan and pick the launcher.  The core has checked the
 * op's counts, shapes and parameters (core/opcheck.c) before prepare, so
 * both devices refuse a malformed op with the same status and message;
 * here only what this device cannot run is refused (KILN_ENOTSUP).
 *
 * Implemented: the op set of a multilayer perceptron's training and
 * evaluation step (GEMM is gemm.c) plus the trainer's own ops: BIAS_ADD,
 * BIAS_GRAD, RELU, RELU_BWD, SOFTMAX_XENT (all three losses), SGD, ADAMW,
 * LAMB, FILL, REDUCE_SUM, SCALE, ADD, MUL, COUNTER_ADD, LR_SCHEDULE,
 * NORMALIZE_U8, CAST, GRAD_CLIP, dynamic loss scaling (UNSCALE,
 * SCALER_UPDATE, SOFTMAX_XENT's loss-scale input in2), the activations
 * ACT/ACT_BWD, DROPOUT/DROPOUT_BWD, CONCAT/SPLIT, REORDER, the
 * transformer ops EMBEDDING/EMBEDDING_BWD and LAYERNORM/LAYERNORM_BWD, and
 * the fused attention (sdpa.c: cuDNN's, or attn.cu's f32 kernels).  Their
 * activations may be f32, bf16 or f16 (f32 arithmetic, one rounding:
 * kernels.cu's ld/st).  Convolution, batch norm and pooling go to
 * cudnn.c, QCONV and QLINEAR to qops.c, RNN and RNN_BWD to rnn.c.  The
 * device table's has_op (cuda_has_op below) lists them all;
 * the core reports any other op before training.
 */
#include "kern.h" /* kern_cat_geom, kern_reorder_geom, kern_lamb_workspace */
#include "cuda.h"
#include "../common/norm_lut.h" /* common_norm_lut: the CPU's table */

#ifndef KILN_HAVE_CUDNN
#define KILN_HAVE_CUDNN 0 /* configure found no cuDNN: no convolutions */
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Every tensor of the op f32, bf16 or f16: what kernels.cu's ld/st take. */
static int cuda_all_float(const struct kiln_op *op)
{
	for (int i = 0; i < op->n_in; i++)
		if (!kern_float_dtype(op->in[i].dtype))
			return 0;
	for (int i = 0; i < op->n_out; i++)
		if (!kern_float_dtype(op->out[i].dtype))
			return 0;
	return 1;
}

/* A column sum over p->rows rows of p->cols (kernels.cu's col_sums:
 * BIAS_GRAD, LAYERNORM_BWD's dgamma and dbeta): its row slices in sz[1],
 * their double partials (two a column and slice) the plan's scratch */
static void col_sums_plan(struct cuda_plan *p)
{
	p->sz[1] = cuda_chan_slices(p->rows, p->cols, 1);
	p->sz[3] = p->sz[1] * p->cols * 2 * (int64_t)sizeof(double);
}

static int64_t cuda_esize(int dtype)
{
	static const int64_t s[KILN_DTYPE_COUNT] = { 4, 2, 2, 1, 1, 4, 8 };
	return dtype >= 0 && dtype < KILN_DTYPE_COUNT ? s[dtype] : 0;
}

/* ACT, ACT_BWD, DROPOUT(_BWD), CONCAT, SPLIT, REORDER: sizes and launcher.
 * Only the arity is checked here (an op the kernels would read past), and
 * what the kernels cannot do. */
static kiln_status newop_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	switch (op->type) {
	case KILN_OP_ACT:
	case KILN_OP_ACT_BWD: {
		const int bwd = op->type == KILN_OP_ACT_BWD;
		if (!cuda_all_float(op))
			return cuda_bad(c, op, KILN_ENOTSUP, "f32, bf16 or f16 tensors only");
		p->n = common_numel(&op->out[0]);
		p->launch = bwd ? cuda_launch_act_bwd : cuda_launch_act;
		return KILN_OK;
	}
	case KILN_OP_DROPOUT:
	case KILN_OP_DROPOUT_BWD: {
		if (!kern_float_dtype(op->in[0].dtype) || !kern_float_dtype(op->out[0].dtype))
			return cuda_bad(c, op, KILN_ENOTSUP, "f32, bf16 or f16 data");
		const struct kiln_tensor_desc *y = &op->out[0];
		p->n = common_numel(y);
		/* elements per sample row: the global index, kern_drop_global */
		p->sz[2] = y->dims[0] > 0 ? p->n / y->dims[0] : 1;
		if (y->ndim == 4 && y->layout == KILN_NHWC) {
			/* drawn by logical index: kern_nhwc_logical */
			p->sz[0] = y->dims[1];
			p->sz[1] = y->dims[2] * y->dims[3];
		}
		p->launch = cuda_launch_dropout;
		return KILN_OK;
	}
	case KILN_OP_CONCAT:
	case KILN_OP_SPLIT: {
		const int split = op->type == KILN_OP_SPLIT;
		const struct kiln_tensor_desc *whole = split ? &op->in[0] : &op->out[0];
		struct kern_cat g;
		if (kern_cat_geom(op, &g))
			return c->host->error(KILN_EINTERNAL, "cuda: %s: dimension i[0] out of range",
					      cuda_op_name(op->type));
		/* the element size in cols: sz[3] is the plan's scratch bytes
		 * (cuda.c allocates that much at prepare) */
		p->cols = cuda_esize(whole->dtype);
		if (!p->cols || (split && op->i[1] && !kern_float_dtype(whole->dtype)))
			return cuda_bad(c, op, KILN_ENOTSUP, "unknown dtype, or accumulating into a non-float one");
		p->launch = cuda_launch_concat_split;
		return KILN_OK;
	}
	case KILN_OP_REORDER: {
		const int same = op->in[0].dtype == op->out[0].dtype;
		const int acc = (op->flags & KILN_OPF_ACCUMULATE) != 0;
		if ((!same || acc) &&
		    (!kern_float_dtype(op->in[0].dtype) || !kern_float_dtype(op->out[0].dtype)))
			return cuda_bad(c, op, KILN_ENOTSUP, "converts and accumulates float dtypes only");
		p->cols = cuda_esize(op->in[0].dtype); /* element size (sz[3]: scratch) */
		if (!p->cols)
			return cuda_bad(c, op, KILN_ENOTSUP, "unknown dtype");
		p->n = common_numel(&op->in[0]);
		kern_reorder_geom(&op->in[0], &op->out[0], &p->sz[0], &p->sz[1], &p->sz[2]);
		if (p->sz[2] == 0)
			p->sz[1] = 0; /* empty images: nothing to transpose */
		p->launch = cuda_launch_reorder;
		return KILN_OK;
	}
	}
	return c->host->error(KILN_EINTERNAL, "cuda: op %d is not a layout or activation op", op->type);
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
	case KILN_BF16: bits = kern_bf16_round((float)v), width = 2; break;
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
	p->n = common_numel(&op->out[0]);
	return KILN_OK;
}

/* SGD, AdamW and LAMB: the CPU device's checks (plugins/cpu/optim.c).
 * An optional last output in bf16/f16 is the compute copy (sz[2] = 1,
 * sz[1] its dtype). */
static kiln_status optim_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int sgd = op->type == KILN_OP_SGD, lamb = op->type == KILN_OP_LAMB;
	const int copy = op->n_out > 1 && (op->out[op->n_out - 1].dtype == KILN_BF16 ||
					   op->out[op->n_out - 1].dtype == KILN_F16);
	p->sz[1] = copy ? op->out[op->n_out - 1].dtype : 0;
	p->sz[2] = copy;
	p->launch = sgd ? cuda_launch_sgd : lamb ? cuda_launch_lamb : cuda_launch_adamw;
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->n = op->i[0];
	if (lamb) {
		/* workspace: the piece sums and per-tensor steps (kern.h);
		 * scratch: the go flag of k_lamb_check */
		const int64_t T = common_numel(&op->in[3]) - 1;
		if (kern_lamb_chunks(p->n) > INT32_MAX)
			return cuda_bad(c, op, KILN_ENOTSUP, "more than 2^31 chunks of parameters");
		p->sz[0] = T;
		p->workspace = kern_lamb_workspace(p->n, T);
		p->sz[3] = sizeof(int);
	}
	return KILN_OK;
}

/* ATTENTION, ATTENTION_BWD on kiln's kernels (attn.cu), where cuDNN's
 * fused attention does not take the op (sdpa.c decides): f32, bf16 or
 * f16 activations (f32 arithmetic, one rounding); a [T]
 * row of scores (two in the backward) in shared memory, so T <= 4096; one
 * block row per (batch, head), at most 65535 of them.  The backward's
 * workspace: the rows' dy.y, f32 [B, H, T]. */
kiln_status cuda_attn_kiln_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_ATTENTION_BWD;
	/* qkv, y, dy, dqkv of one float dtype (the core's check), lse f32 */
	const struct kiln_tensor_desc *qkv = &op->in[bwd ? 1 : 0];
	if (!kern_float_dtype(qkv->dtype) || (bwd ? op->in[3] : op->out[1]).dtype != KILN_F32)
		return cuda_bad(c, op, KILN_ENOTSUP, "f32, bf16 or f16 activations and an f32 lse");
	p->rows = qkv->dims[0] * op->i[0]; /* B*H */
	p->cols = qkv->dims[1];             /* T */
	p->sz[0] = qkv->dims[2] / 3;        /* C */
	p->sz[1] = op->i[0];                /* H (sz[3] stays 0: no plan scratch) */
	if (p->cols > 4096 || p->rows > 65535)
		return cuda_bad(c, op, KILN_ENOTSUP, "T > 4096 or B*heads > 65535");
	p->n = common_numel(qkv);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->workspace = bwd ? sizeof(float) * (size_t)(p->rows * p->cols) : 0;
	p->launch = bwd ? cuda_launch_attention_bwd : cuda_launch_attention;
	return KILN_OK;
}

/* Which prepare takes each op type: one table serves the device table's
 * has_op and the dispatch below.  LAUNCH ops get kiln's launcher from
 * launchers[]; F_NONE = not implemented.  Sized by its rows and tied to
 * the op count: an op appended to kiln/ops.h without a row here does not
 * compile (F_NONE is a row: the device then says it lacks the op). */
enum { F_NONE, F_LAUNCH, F_GEMM, F_OPTIM, F_NEWOP, F_DNN, F_CONV, F_ATTN, F_QUANT, F_RNN };

static const uint8_t family[] = {
	[KILN_OP_GEMM] = F_GEMM,
	[KILN_OP_BIAS_ADD] = F_LAUNCH, [KILN_OP_BIAS_GRAD] = F_LAUNCH,
	[KILN_OP_RELU] = F_LAUNCH, [KILN_OP_RELU_BWD] = F_LAUNCH,
	[KILN_OP_SOFTMAX_XENT] = F_LAUNCH, [KILN_OP_GRAD_CLIP] = F_LAUNCH,
	[KILN_OP_UNSCALE] = F_LAUNCH, [KILN_OP_SCALER_UPDATE] = F_LAUNCH,
	[KILN_OP_FILL] = F_LAUNCH, [KILN_OP_COUNTER_ADD] = F_LAUNCH,
	[KILN_OP_LR_SCHEDULE] = F_LAUNCH, [KILN_OP_REDUCE_SUM] = F_LAUNCH,
	[KILN_OP_SCALE] = F_LAUNCH, [KILN_OP_ADD] = F_LAUNCH, [KILN_OP_MUL] = F_LAUNCH,
	[KILN_OP_NORMALIZE_U8] = F_LAUNCH, [KILN_OP_CAST] = F_LAUNCH,
	[KILN_OP_SGD] = F_OPTIM, [KILN_OP_ADAMW] = F_OPTIM, [KILN_OP_LAMB] = F_OPTIM,
	[KILN_OP_ACT] = F_NEWOP, [KILN_OP_ACT_BWD] = F_NEWOP, [KILN_OP_DROPOUT] = F_NEWOP,
	[KILN_OP_DROPOUT_BWD] = F_NEWOP, [KILN_OP_CONCAT] = F_NEWOP, [KILN_OP_SPLIT] = F_NEWOP,
	[KILN_OP_REORDER] = F_NEWOP,
	[KILN_OP_BN_TRAIN] = F_DNN, [KILN_OP_BN_INFER] = F_DNN, [KILN_OP_BN_BWD] = F_DNN,
	[KILN_OP_BN_STATS] = F_DNN, [KILN_OP_BN_APPLY] = F_DNN, [KILN_OP_BN_BWD_REDUCE] = F_DNN,
	[KILN_OP_BN_BWD_APPLY] = F_DNN, [KILN_OP_POOL] = F_DNN, [KILN_OP_POOL_BWD] = F_DNN,
	[KILN_OP_CONV] = F_CONV, [KILN_OP_CONV_BWD_DATA] = F_CONV,
	[KILN_OP_CONV_BWD_WEIGHTS] = F_CONV,
	[KILN_OP_EMBEDDING] = F_LAUNCH, [KILN_OP_EMBEDDING_BWD] = F_LAUNCH,
	[KILN_OP_LAYERNORM] = F_LAUNCH, [KILN_OP_LAYERNORM_BWD] = F_LAUNCH,
	/* fused attention: cuDNN's fused scaled-dot-product attention (graph
	 * API, bf16/f16) with kiln's own f32 kernels (attn.cu) behind it: sdpa.c */
	[KILN_OP_ATTENTION] = F_ATTN, [KILN_OP_ATTENTION_BWD] = F_ATTN,
	/* decoding with a key/value cache (generation): the CPU's alone so far */
	[KILN_OP_ATTENTION_DECODE] = F_NONE, [KILN_OP_ATTENTION_DECODE_RUN] = F_NONE,
	/* cuDNN's RNN API (rnn.c; docs/rnn.md) */
	[KILN_OP_RNN] = F_RNN, [KILN_OP_RNN_BWD] = F_RNN,
	/* INT8 inference (ABI 2.6): int8 im2col + cuBLASLt (qops.c) */
	[KILN_OP_QCONV] = F_QUANT, [KILN_OP_QLINEAR] = F_QUANT,
	/* the gradients' block sums where backward makes them (ABI 2.32):
	 * the CPU's alone so far (GRAD_CLIP makes its own pass here) */
	[KILN_OP_GRAD_SUMSQ] = F_NONE,
};
_Static_assert(sizeof family / sizeof family[0] == KILN_OP_TYPE_COUNT,
	       "every op of kiln/ops.h needs a row in family[] (F_NONE: not implemented)");

static const cuda_launch_fn launchers[KILN_OP_TYPE_COUNT] = {
	[KILN_OP_BIAS_ADD] = cuda_launch_bias_add, [KILN_OP_BIAS_GRAD] = cuda_launch_bias_grad,
	[KILN_OP_RELU] = cuda_launch_relu, [KILN_OP_RELU_BWD] = cuda_launch_relu_bwd,
	[KILN_OP_SOFTMAX_XENT] = cuda_launch_softmax_xent,
	[KILN_OP_GRAD_CLIP] = cuda_launch_grad_clip, [KILN_OP_UNSCALE] = cuda_launch_grad_clip,
	[KILN_OP_SCALER_UPDATE] = cuda_launch_scaler_update, [KILN_OP_FILL] = cuda_launch_fill,
	[KILN_OP_COUNTER_ADD] = cuda_launch_counter_add,
	[KILN_OP_LR_SCHEDULE] = cuda_launch_lr_schedule,
	[KILN_OP_REDUCE_SUM] = cuda_launch_reduce_sum, [KILN_OP_SCALE] = cuda_launch_scale,
	[KILN_OP_ADD] = cuda_launch_add, [KILN_OP_MUL] = cuda_launch_mul,
	[KILN_OP_NORMALIZE_U8] = cuda_launch_normalize_u8, [KILN_OP_CAST] = cuda_launch_cast,
	[KILN_OP_EMBEDDING] = cuda_launch_embedding, [KILN_OP_EMBEDDING_BWD] = cuda_launch_embedding,
	[KILN_OP_LAYERNORM] = cuda_launch_layernorm, [KILN_OP_LAYERNORM_BWD] = cuda_launch_layernorm,
};

/* The op types this device implements (the device table's has_op). */
int cuda_has_op(int type)
{
	if (type <= 0 || type >= KILN_OP_TYPE_COUNT)
		return 0;
	return family[type] == F_CONV || family[type] == F_RNN ? KILN_HAVE_CUDNN
								: family[type] != F_NONE;
}

kiln_status cuda_ops_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;

	/* RELU_BWD's bias gradient (ABI 2.9) is not here: the layer runs BIAS_GRAD */
	if (op->type == KILN_OP_RELU_BWD && op->n_out != 1)
		return c->host->error(KILN_ENOTSUP, "cuda: RELU_BWD: no bias gradient in its pass");
	/* ADD's u8 output (chained INT8 on the CPU) is not here either */
	if (op->type == KILN_OP_ADD && op->out[0].dtype == KILN_U8)
		return c->host->error(KILN_ENOTSUP, "cuda: ADD: no u8 output (INT8 layers exchange f32 here)");
	switch (op->type > 0 && op->type < KILN_OP_TYPE_COUNT ? family[op->type] : F_NONE) {
	case F_LAUNCH: p->launch = launchers[op->type]; break;
	case F_OPTIM: return optim_prepare(c, p);
	case F_NEWOP: return newop_prepare(c, p);
	case F_ATTN: return cuda_sdpa_prepare(c, p); /* sdpa.c */
	case F_DNN:
	case F_CONV: return cuda_dnn_prepare(c, p); /* cudnn.c */
	case F_QUANT: return cuda_q_prepare(c, p);  /* qops.c */
#if KILN_HAVE_CUDNN
	case F_RNN: return cuda_rnn_prepare(c, p);  /* rnn.c */
#endif
	default: /* GEMM is gemm.c's; has_op said no to the rest */
		return c->host->error(KILN_EINTERNAL, "cuda: %s has no prepare here",
				      cuda_op_name(op->type));
	}
	COMMON_PLAN_SIZES(p, op);

	switch (op->type) {
	case KILN_OP_LR_SCHEDULE:
	case KILN_OP_COUNTER_ADD:
	case KILN_OP_CAST:
		return KILN_OK;
	case KILN_OP_FILL:
		return fill_prepare(c, p);
	case KILN_OP_EMBEDDING:
	case KILN_OP_EMBEDDING_BWD: {
		/* ids [N], table [V, C] (f32 for the gradient: the core's check) */
		const struct kiln_tensor_desc *t = op->type == KILN_OP_EMBEDDING ? &op->in[1] : &op->out[0];
		p->rows = common_numel(&op->in[0]);
		p->cols = t->dims[1];
		p->sz[0] = t->dims[0];
		return KILN_OK;
	}
	case KILN_OP_LAYERNORM:
	case KILN_OP_LAYERNORM_BWD: {
		const struct kiln_tensor_desc *x = &op->in[0];
		p->cols = x->dims[x->ndim - 1];
		p->rows = common_numel(x) / p->cols;
		p->sz[0] = op->type == KILN_OP_LAYERNORM ? op->n_in > 1 : op->n_in > 3; /* affine */
		if (op->type == KILN_OP_LAYERNORM_BWD && op->n_out >= 3)
			col_sums_plan(p); /* dgamma, dbeta */
		return KILN_OK;
	}
	case KILN_OP_SOFTMAX_XENT:
		if (p->cols > INT32_MAX - 1)
			return cuda_bad(c, op, KILN_ENOTSUP, "more than 2^31 - 2 classes");
		p->sz[0] = common_numel(&op->out[1]); /* 3: also count top-5; 4: the rows */
		/* block partials (struct xent_part), then ignore_index's row count */
		p->sz[3] = CUDA_XENT_BLOCKS * 4 * sizeof(double) + sizeof(double);
		return KILN_OK;
	case KILN_OP_NORMALIZE_U8:
		p->sz[0] = op->in[0].dims[1];
		p->sz[1] = op->in[0].dims[2] * op->in[0].dims[3];
		if (p->sz[1] < 1)
			return cuda_bad(c, op, KILN_ENOTSUP, "an empty image");
		/* the same table, computed the same way, as the CPU device */
		for (int k = 0; k < p->sz[0]; k++)
			common_norm_lut(p->lut[k], (float)op->f[k], (float)op->f[3 + k]);
		return KILN_OK;
	}
	/* f32, bf16 or f16 tensors (f32 arithmetic, one rounding: kernels.cu);
	 * the scaler's and the clipping's state stay f32 */
	if (!cuda_all_float(op))
		return cuda_bad(c, op, KILN_ENOTSUP, "f32, bf16 or f16 tensors only");
	if (op->type == KILN_OP_GRAD_CLIP && op->n_in > 1)
		return cuda_bad(c, op, KILN_ENOTSUP, "no block sums given (GRAD_SUMSQ): one pass over the gradients");
	if ((op->type == KILN_OP_GRAD_CLIP || op->type == KILN_OP_UNSCALE) &&
	    (op->out[1].dtype != KILN_F32 || (op->type == KILN_OP_UNSCALE && op->in[1].dtype != KILN_F32)))
		return cuda_bad(c, op, KILN_ENOTSUP, "the gate and scaler states are f32");
	if (op->type == KILN_OP_SCALER_UPDATE &&
	    (op->in[0].dtype != KILN_F32 || op->out[0].dtype != KILN_F32))
		return cuda_bad(c, op, KILN_ENOTSUP, "the gate and scaler states are f32");

	/* the reductions' block partials (REDUCE_SUM), then the clipping's
	 * scale and rewrite flag (GRAD_CLIP, UNSCALE) */
	if (op->type == KILN_OP_REDUCE_SUM)
		p->sz[3] = CUDA_RED_BLOCKS * sizeof(double);
	/* ... the column sums' (BIAS_GRAD) */
	if (op->type == KILN_OP_BIAS_GRAD)
		col_sums_plan(p);
	if (op->type == KILN_OP_GRAD_CLIP || op->type == KILN_OP_UNSCALE)
		p->sz[3] = CUDA_RED_BLOCKS * sizeof(double) + 2 * sizeof(float);
	return KILN_OK;
}
