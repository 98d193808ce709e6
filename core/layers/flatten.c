/* core/layers/flatten.c - [B, d1, d2, ...] -> [B, d1*d2*...] in PyTorch's
 * (C, H, W) order.  Usually a view: the planner gives the output the
 * input's bytes, so it costs nothing.  A channels-last input with several
 * channels and pixels is reordered to C, H, W order instead, so a model
 * gives the same numbers in both layouts. */
#include "util.h"

struct flatten {
	int reorder;
	void *fwd, *bwd[2];
};

static int needs_reorder(const struct kiln_tensor_desc *x)
{
	return is_nhwc(x) && x->dims[1] > 1 && x->dims[2] * x->dims[3] > 1;
}

static kiln_status flatten_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct flatten *s = l->priv;
	if (!s && !(s = l->priv = calloc(1, sizeof *s)))
		return h->error(KILN_ENOMEM, "out of memory");
	f32_desc(&l->out, l->in[0].dims[0], per_sample(&l->in[0]), 0);
	l->out.dtype = l->in[0].dtype;
	s->reorder = needs_reorder(&l->in[0]);
	l->is_view = !s->reorder;
	return KILN_OK;
}

static kiln_status flatten_plan(const struct kiln_host *h, struct kiln_layer *l,
				struct kiln_device *dev, size_t *ws)
{
	struct flatten *s = l->priv;
	if (!s->reorder)
		return KILN_OK;
	return prep_nchw_reorders(h, dev, &l->in[0], &s->fwd, s->bwd, ws);
}

static kiln_status flatten_forward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	struct flatten *s = l->priv;
	if (!s->reorder)
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->fwd, &a, r->stream);
}

static kiln_status flatten_backward(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_layer_run *r)
{
	struct flatten *s = l->priv;
	if (!s->reorder || !r->dx[0])
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->dy }, .out = { r->dx[0] } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->bwd[r->dx_accum[0] ? 1 : 0], &a, r->stream);
}

static void flatten_destroy(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev)
{
	struct flatten *s = l->priv;
	if (s && dev) {
		h->device_plan_free(dev, s->fwd);
		h->device_plan_free(dev, s->bwd[0]);
		h->device_plan_free(dev, s->bwd[1]);
	}
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops flatten_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = NULL,
	.infer = flatten_infer,
	.plan = flatten_plan,
	.forward = flatten_forward,
	.backward = flatten_backward,
	.destroy = flatten_destroy,
};

LAYER_DESCRIPTOR(kiln_layer_flatten, "flatten",
		 "reshape [B, ...] to [B, features] in C, H, W order (no copy unless channels-last)",
		 flatten_ops, NULL);
