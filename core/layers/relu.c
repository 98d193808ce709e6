/* core/layers/relu.c - y = max(x, 0), any shape.  Backward reads y (not x),
 * so the layer could run in place. */
#include "util.h"

struct relu {
	void *fwd, *bwd[2];
};

static kiln_status relu_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!l->priv && !(l->priv = calloc(1, sizeof(struct relu))))
		return h->error(KILN_ENOMEM, "out of memory");
	l->out = l->in[0];
	l->needs_output = 1;
	l->inplace_ok = 1;
	return KILN_OK;
}

static kiln_status relu_plan(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, size_t *ws)
{
	struct relu *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_RELU, 1, 1);
	op.in[0] = op.out[0] = l->out;
	if ((st = prep(h, dev, &op, &s->fwd, ws)))
		return st;
	/* dx (+)= dy * (y > 0) */
	op_init(&op, KILN_OP_RELU_BWD, 2, 1);
	op.in[0] = op.in[1] = op.out[0] = l->out;
	return prep_pair(h, dev, &op, s->bwd, ws);
}

static kiln_status relu_forward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct relu *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->fwd, &a, r->stream);
}

static kiln_status relu_backward(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_layer_run *r)
{
	struct relu *s = l->priv;
	if (!r->dx[0])
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->y, r->dy }, .out = { r->dx[0] } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->bwd[r->dx_accum[0] ? 1 : 0], &a, r->stream);
}

static void relu_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev)
{
	struct relu *s = l->priv;
	if (s && dev) {
		h->device_plan_free(dev, s->fwd);
		h->device_plan_free(dev, s->bwd[0]);
		h->device_plan_free(dev, s->bwd[1]);
	}
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops relu_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = NULL,
	.infer = relu_infer,
	.plan = relu_plan,
	.forward = relu_forward,
	.backward = relu_backward,
	.destroy = relu_destroy,
};

LAYER_DESCRIPTOR(kiln_layer_relu, "relu", "rectified linear unit: y = max(x, 0)", relu_ops, NULL);
