/* core/layers/relu.c - y = max(x, 0), any shape.  Backward reads y (not x),
 * so the layer could run in place.  Fused into the layer before it ([run]
 * fuse, kiln_layer.act_fused) it is a view of that layer's output. */
#include "util.h"

struct relu {
	struct layer_plans plans;
	void *fwd, *bwd[2];
};

static kiln_status relu_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!layer_alloc(h, l, sizeof(struct relu)))
		return KILN_ENOMEM;
	l->out = l->in[0];
	/* fused into the layer before ([run] fuse): a view, nothing to run */
	l->is_view = l->act_fused;
	l->needs_output = !l->is_view;
	l->inplace_ok = !l->is_view;
	return KILN_OK;
}

static kiln_status relu_plan(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, size_t *ws)
{
	struct relu *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	if (l->is_view)
		return KILN_OK;
	op_init(&op, KILN_OP_RELU, 1, 1);
	op.in[0] = op.out[0] = l->out;
	if ((st = prep(h, l, dev, &op, &s->fwd, ws)) || !kiln_layer_training(l))
		return st; /* an evaluation plan: the forward alone */
	/* dx (+)= dy * (y > 0) */
	op_init(&op, KILN_OP_RELU_BWD, 2, 1);
	op.in[0] = op.in[1] = op.out[0] = l->out;
	return prep_pair(h, l, dev, &op, s->bwd, ws);
}

static kiln_status relu_forward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct relu *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	return l->is_view ? KILN_OK : run_op(h, r, s->fwd, &a);
}

static kiln_status relu_backward(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_layer_run *r)
{
	struct relu *s = l->priv;
	struct kiln_op_args a = { .in = { r->y, r->dy } };
	return l->is_view ? KILN_OK : run_dx(h, r, s->bwd, 0, &a);
}

LAYER(relu, "relu", "rectified linear unit: y = max(x, 0)", NULL, 1, 1, NULL, relu_infer, relu_plan,
      relu_forward, relu_backward, layer_destroy);
