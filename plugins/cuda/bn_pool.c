/* plugins/cuda/bn_pool.c - prepare of the CUDA device's batch norm
 * (BN_TRAIN .. BN_BWD_APPLY) and pooling (POOL, POOL_BWD) plans, which run
 * kiln's own kernels (dnn_kernels.cu; dnn.h gives the plan sizes).
 * cudnn.c's cuda_dnn_prepare routes those ops here.
 */
#include "cuda.h"
#include "dnn.h"

#include <string.h> /* memcmp */

int cuda_chan_slices(int64_t M, int64_t C, int rows)
{
	if (!rows) { /* bn_part: a block a (channel, slice) */
		const int64_t k = M / 4096;
		return k < 1 ? 1 : k > 64 ? 64 : (int)k;
	}
	/* bn_part_rows: a block a (32-channel tile, slice); about 1024 blocks
	 * (8 of 256 threads on each of an H200's 132 SMs), slices of at least
	 * 64 rows, at most 1024 slices (the finishing warps sum them) */
	const int64_t tiles = (C + 31) / 32;
	int64_t k = (1024 + tiles - 1) / tiles;
	if (k > M / 64)
		k = M / 64;
	return k < 1 ? 1 : k > 1024 ? 1024 : (int)k;
}

/* 1 when argument k (in0.. then out0..) of a BN op is x, y, dy or dx (the
 * kernels read and write it as x's dtype); the others are per-channel f32 */
static int bn_like_x(int type, int n_in, int k)
{
	const int bwd = type == KILN_OP_BN_BWD || type == KILN_OP_BN_BWD_REDUCE ||
			type == KILN_OP_BN_BWD_APPLY;
	if (k < n_in)
		return k == 0 || (k == 1 && bwd); /* x; dy */
	/* out0: y or dx, except BN_STATS' statistics and BN_BWD_REDUCE's dgamma */
	return k == n_in && type != KILN_OP_BN_STATS && type != KILN_OP_BN_BWD_REDUCE;
}

kiln_status cuda_bn_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const struct kiln_tensor_desc *x = &op->in[0];
	/* x and the tensors shaped like it (y, dy, dx) share x's dtype, f32,
	 * bf16 or f16; the per-channel ones are f32 */
	const int dt = x->dtype;
	int ok = dt == KILN_F32 || dt == KILN_BF16 || dt == KILN_F16;
	for (int k = 0; k < op->n_in + op->n_out && ok; k++) {
		const struct kiln_tensor_desc *t = k < op->n_in ? &op->in[k] : &op->out[k - op->n_in];
		ok = t->dtype == (bn_like_x(op->type, op->n_in, k) ? dt : KILN_F32);
	}
	if (!ok)
		return cuda_bad(c, op, KILN_ENOTSUP, "x, y, dy and dx in one of f32, bf16, f16; the per-channel tensors f32");
	if (x->ndim != 2 && x->ndim != 4)
		return cuda_bad(c, op, KILN_EINVAL, "wants x [N,C,H,W] or [N,C]");
	p->rows = x->dims[0];
	p->cols = x->dims[1];
	p->n = x->ndim == 4 ? x->dims[2] * x->dims[3] : 1;
	p->sz[0] = x->ndim == 2 || x->layout == KILN_NHWC;
	p->sz[1] = cuda_chan_slices(p->rows * p->n, p->cols, (int)p->sz[0]);
	p->sz[2] = 0;
	p->workspace = cuda_bn_workspace(p->cols, (int)p->sz[1]);
	p->n_in = op->n_in;
	p->n_out = op->n_out;
	p->launch = cuda_launch_bn;
	return KILN_OK;
}

kiln_status cuda_pool_prepare(struct cuda_ctx *c, struct cuda_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int bwd = op->type == KILN_OP_POOL_BWD;
	const struct kiln_tensor_desc *x = bwd ? &op->out[0] : &op->in[0];
	const struct kiln_tensor_desc *y = bwd ? &op->in[0] : &op->out[0];
	if ((x->dtype != KILN_F32 && x->dtype != KILN_BF16 && x->dtype != KILN_F16) ||
	    y->dtype != x->dtype)
		return cuda_bad(c, op, KILN_ENOTSUP, "f32, bf16 or f16 activations, one dtype");
	if (x->ndim != 4 || y->ndim != 4)
		return cuda_bad(c, op, KILN_EINVAL, "wants 4-d activations");
	if ((x->layout == KILN_NHWC) != (y->layout == KILN_NHWC)) /* ABI 2.17's NHWC -> NCHW */
		return cuda_bad(c, op, KILN_ENOTSUP, "x and y of different layouts: not on this device");
	if (op->flags & KILN_OPF_ACT) /* the folded ReLU (ABI 2.16) needs an aux: this device keeps none */
		return cuda_bad(c, op, KILN_ENOTSUP, "a ReLU folded into the pooling: not on this device");
	if (bwd && op->i[0] == KILN_POOL_MAX && (op->n_in < 3 || op->in[2].dtype != x->dtype))
		return cuda_bad(c, op, KILN_ENOTSUP,
				"max pooling's backward reads the forward input x (in2): this device keeps no aux");
	if (bwd && op->i[0] == KILN_POOL_MAX &&
	    (op->in[2].ndim != 4 || (op->in[2].layout == KILN_NHWC) != (x->layout == KILN_NHWC) ||
	     memcmp(op->in[2].dims, x->dims, 4 * sizeof x->dims[0])))
		return cuda_bad(c, op, KILN_EINVAL,
				"max pooling's backward wants in2 (the forward input x) of dx's shape and layout");
	/* max pooling keeps no aux (aux_bytes 0): out1 / in1 are not read; its
	 * backward finds the windows' maxima into the workspace first */
	if (bwd && op->i[0] == KILN_POOL_MAX)
		p->workspace = sizeof(int32_t) * (size_t)(y->dims[0] * y->dims[1] * y->dims[2] * y->dims[3]);
	p->n_in = 1;
	p->n_out = 1;
	p->launch = cuda_launch_pool;
	return KILN_OK;
}
