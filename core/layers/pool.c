/* core/layers/pool.c - 2-d max and average pooling (PyTorch's MaxPool2d,
 * AvgPool2d, AdaptiveAvgPool2d(1)).
 *
 * x: [N, C, H, W]; y: [N, C, OH, OW], OH = (H + 2*pad - k) / stride + 1
 * (floor), in x's layout, or NCHW from an NHWC x where the core asks it
 * (kiln_layer_out_layout, max pooling of f32: ABI 2.17).  Max pooling keeps the device's aux state (argmax positions)
 * from forward to backward.
 */
#include "pool.h"

kiln_status pool_configure(const struct kiln_host *h, struct kiln_layer *l,
			   const struct kiln_config *cfg, const char *sec, int kind, int global)
{
	struct pool *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->kind = kind;
	s->global = global;
	s->include_pad = 1;
	if (global)
		return KILN_OK;
	if (!h->config_get(cfg, sec, "kernel"))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'kernel' (e.g. kernel = 2)",
				h->config_where(cfg, sec, NULL), sec);
	kiln_status st;
	if ((st = get_pair(h, cfg, sec, "kernel", 1, s->k)) ||
	    (st = get_pair(h, cfg, sec, "padding", 0, s->pad)))
		return st;
	s->stride[0] = s->k[0], s->stride[1] = s->k[1]; /* PyTorch: stride = kernel */
	if (h->config_get(cfg, sec, "stride") && (st = get_pair(h, cfg, sec, "stride", 1, s->stride)))
		return st;
	if (kind == KILN_POOL_AVG)
		h->config_get_bool(cfg, sec, "count_include_pad", &s->include_pad);
	if (s->k[0] < 1 || s->k[1] < 1 || s->stride[0] < 1 || s->stride[1] < 1 || s->pad[0] < 0 ||
	    s->pad[1] < 0)
		return h->error(KILN_ECONFIG, "%s: [%s]: kernel and stride must be >= 1, padding >= 0",
				h->config_where(cfg, sec, NULL), sec);
	return KILN_OK;
}

kiln_status pool_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct pool *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	int64_t o[2];
	if (x->ndim != 4)
		return h->error(KILN_ECONFIG, "layer '%s' (%s) needs a 4-d input [N, C, H, W], got %d dims",
				l->name, l->type, x->ndim);
	if (s->global) {
		s->k[0] = s->stride[0] = x->dims[2];
		s->k[1] = s->stride[1] = x->dims[3];
	}
	for (int d = 0; d < 2; d++) {
		if (2 * s->pad[d] > s->k[d])
			return h->error(KILN_ECONFIG, "layer '%s' (%s): padding %lld is more than half the kernel %lld",
					l->name, l->type, (long long)s->pad[d], (long long)s->k[d]);
		o[d] = (x->dims[2 + d] + 2 * s->pad[d] - s->k[d]) / s->stride[d] + 1;
		if (x->dims[2 + d] + 2 * s->pad[d] < s->k[d])
			return h->error(KILN_ECONFIG, "layer '%s' (%s): kernel %lld does not fit the input (%lld with padding %lld)",
					l->name, l->type, (long long)s->k[d], (long long)x->dims[2 + d],
					(long long)s->pad[d]);
	}
	s->x = *x;
	/* NHWC in, NCHW out (kiln_layer_out_layout: the NHWC conv before it in
	 * an NCHW model; POOL of mixed layouts, ABI 2.17): max pooling only */
	const int lay = kiln_layer_out_layout(l);
	act4(&s->y, x->dims[0], x->dims[1], o[0], o[1],
	     lay == KILN_NCHW && s->kind == KILN_POOL_MAX && x->dtype == KILN_F32 ? lay : x->layout);
	s->y.dtype = x->dtype; /* the compute dtype */
	l->out = s->y;
	l->needs_input = 1; /* devices without aux recompute from x */
	return KILN_OK;
}

static void pool_op(struct kiln_op *op, const struct pool *s)
{
	op->i[0] = s->kind;
	op->i[1] = s->k[0], op->i[2] = s->k[1];
	op->i[3] = s->stride[0], op->i[4] = s->stride[1];
	op->i[5] = s->pad[0], op->i[6] = s->pad[1];
	op->i[7] = s->include_pad;
}

/* The producer's fused ReLU, folded in (core/plan.c relu_fold): its
 * backward's mask, y > 0, taken on this max pooling's output y before the
 * pooling's backward (every input element the backward reaches holds its
 * window's maximum, y); the conv before then masks nothing.  The mask
 * reads y, so the output is kept for the backward.  Only where the device
 * cannot keep the mask in the forward's aux itself (s->folded: POOL with
 * KILN_OPF_ACT, ABI 2.16), which needs no pass and no kept y. */
static kiln_status plan_fold(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, size_t *w)
{
	struct pool *s = l->priv;
	struct kiln_op op;
	op_init(&op, KILN_OP_RELU_BWD, 2, 1);
	op.in[0] = op.in[1] = op.out[0] = s->y;
	s->front = ALIGN64(kiln_tensor_bytes(&s->y));
	l->needs_output = 1;
	return prep(h, l, dev, &op, &s->mask, w);
}

kiln_status pool_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
		      size_t *ws)
{
	struct pool *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	s->folded = 0;
	/* training keeps the aux state for the backward; inference does not */
	op_init(&op, KILN_OP_POOL, 1, 2);
	op.in[0] = s->x, op.out[0] = s->y;
	pool_op(&op, s);
	if (s->x.dtype == KILN_U8) { /* a chained INT8 model's: inference only */
		op.n_out = 1;
		st = prep(h, l, dev, &op, &s->infer, &w);
		*ws = w;
		return st;
	}
	/* an evaluation plan, or a training one whose backward gets no dx
	 * (the first layer's input): the forward alone, nothing kept; one
	 * plan serves training's forward too (the same op) */
	if (!kiln_layer_training(l) || (kiln_layer_dx_unused(l) & 1)) {
		op.n_out = 1;
		if ((st = prep(h, l, dev, &op, &s->infer, &w)))
			return st;
		s->fwd = kiln_layer_training(l) ? s->infer : NULL;
		*ws = w;
		return KILN_OK;
	}
	const int fold = kiln_layer_relu_fold(l) == 2;
	if (fold) { /* the ReLU's backward in the aux (ABI 2.16), where the device has it */
		op.flags |= KILN_OPF_ACT;
		op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		st = prep(h, l, dev, &op, &s->fwd, &w);
		op.flags &= ~KILN_OPF_ACT;
		op.i[KILN_OPI_ACT] = 0;
		if (st != KILN_ENOTSUP && st)
			return st;
		s->folded = !st;
	}
	if (!s->folded && (st = prep(h, l, dev, &op, &s->fwd, &w)))
		return st;
	op.n_out = 1;
	if ((st = prep(h, l, dev, &op, &s->infer, &w)))
		return st;
	op_init(&op, KILN_OP_POOL_BWD, 3, 1);
	op.in[0] = s->y, op.in[2] = s->x, op.out[0] = s->x;
	pool_op(&op, s);
	/* dx added from scratch only where x has another consumer
	 * (kiln_layer_dx_shared) */
	const int shared = kiln_layer_dx_shared(l) & 1;
	if ((st = prep(h, l, dev, &op, &s->bwd, &w)) ||
	    (shared && (st = prep_acc(h, l, dev, &s->x, &s->acc))))
		return st;
	s->dx_bytes = shared ? kiln_tensor_bytes(&s->x) : 0;
	l->saved_bytes = h->device_aux_bytes(dev, s->fwd);
	if (fold && !s->folded && (st = plan_fold(h, l, dev, &w)))
		return st;
	/* [masked dy (the fold) | dx scratch | the ops' own] */
	*ws = s->front + ALIGN64(s->dx_bytes) + w;
	return KILN_OK;
}

kiln_status pool_forward(const struct kiln_host *h, struct kiln_layer *l,
			 const struct kiln_layer_run *r)
{
	struct pool *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y, r->saved } };
	if (r->training && !s->fwd)
		return h->error(KILN_ECONFIG, "layer '%s': u8 activations (INT8) are for evaluation only",
				l->name);
	return run_op(h, r, r->training ? s->fwd : s->infer, &a);
}

kiln_status pool_backward(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_layer_run *r)
{
	struct pool *s = l->priv;
	if (!r->dx[0])
		return KILN_OK;
	struct kiln_layer_run rr; /* with the fold: dy masked, the workspace after it */
	kiln_status st = run_act_bwd(h, r, s->mask, s->front, &rr);
	if (st)
		return st;
	struct kiln_op_args a = { .in = { rr.dy, rr.saved, rr.x[0] } };
	return run_maybe_acc(h, &rr, s->bwd, &a, rr.dx[0], rr.dx_accum[0], s->acc, s->dx_bytes);
}
