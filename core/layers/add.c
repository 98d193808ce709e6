/* core/layers/add.c - elementwise sum of its inputs (residual
 * connections): y = x0 + x1 + ...; every input gets dy as its gradient. */
#include "util.h"

struct add {
	void *first, *more, *grad[2];
};

static kiln_status add_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!l->priv && !(l->priv = calloc(1, sizeof(struct add))))
		return h->error(KILN_ENOMEM, "out of memory");
	for (int k = 1; k < l->n_in; k++) {
		const struct kiln_tensor_desc *a = &l->in[0], *b = &l->in[k];
		if (a->ndim != b->ndim || memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->ndim) ||
		    a->layout != b->layout) {
			char da[96], db[96];
			return h->error(KILN_ECONFIG, "layer '%s' (add): inputs differ in shape: %s vs %s",
					l->name, kiln_tensor_desc_str(a, da, sizeof da),
					kiln_tensor_desc_str(b, db, sizeof db));
		}
	}
	l->out = l->in[0];
	/* y may take the memory of x0 or x1 (the backward reads neither):
	 * ADD is elementwise, and a third input is added after both */
	l->inplace_ok = 3;
	return KILN_OK;
}

static kiln_status add_plan(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev, size_t *ws)
{
	struct add *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_ADD, 2, 1);
	op.in[0] = op.in[1] = op.out[0] = l->out;
	if ((st = prep(h, dev, &op, &s->first, ws)))
		return st;
	/* y += x_k for a third input and on: y = 1 * x_k + y */
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.flags = KILN_OPF_ACCUMULATE;
	op.in[0] = op.out[0] = l->out;
	op.f[0] = 1.0;
	if ((st = prep(h, dev, &op, &s->more, ws)))
		return st;
	/* dx_k (=|+=) dy */
	return prep_pair(h, dev, &op, s->grad, ws);
}

static kiln_status add_forward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct add *s = l->priv;
	kiln_status st;
	struct kiln_op_args a = { .in = { r->x[0], r->x[1] }, .out = { r->y } };
	args_ws(&a, r);
	if ((st = h->device_run(r->dev, s->first, &a, r->stream)))
		return st;
	for (int k = 2; k < l->n_in; k++) {
		a = (struct kiln_op_args){ .in = { r->x[k] }, .out = { r->y } };
		args_ws(&a, r);
		if ((st = h->device_run(r->dev, s->more, &a, r->stream)))
			return st;
	}
	return KILN_OK;
}

static kiln_status add_backward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct add *s = l->priv;
	kiln_status st;
	for (int k = 0; k < l->n_in; k++) {
		if (!r->dx[k])
			continue;
		struct kiln_op_args a = { .in = { r->dy }, .out = { r->dx[k] } };
		args_ws(&a, r);
		if ((st = h->device_run(r->dev, s->grad[r->dx_accum[k] ? 1 : 0], &a, r->stream)))
			return st;
	}
	return KILN_OK;
}

static void add_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev)
{
	struct add *s = l->priv;
	if (s && dev) {
		h->device_plan_free(dev, s->first);
		h->device_plan_free(dev, s->more);
		h->device_plan_free(dev, s->grad[0]);
		h->device_plan_free(dev, s->grad[1]);
	}
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops add_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 2,
	.max_inputs = KILN_LAYER_MAX_INPUTS,
	.configure = NULL,
	.infer = add_infer,
	.plan = add_plan,
	.forward = add_forward,
	.backward = add_backward,
	.destroy = add_destroy,
};

LAYER_DESCRIPTOR(kiln_layer_add, "add", "elementwise sum of its inputs (`inputs = a, b`): residual connections",
		 add_ops, NULL);
