/* core/layers/flatten.c - [B, d1, d2, ...] -> [B, d1*d2*...] in PyTorch's
 * (C, H, W) order.  Usually a view: the planner gives the output the
 * input's bytes, so it costs nothing.  A channels-last input with several
 * channels and pixels is reordered to C, H, W order instead, so a model
 * gives the same numbers in both layouts. */
#include "util.h"

struct flatten {
	struct layer_plans plans;
	int reorder;
	void *fwd, *bwd[2];
};

static int needs_reorder(const struct kiln_tensor_desc *x)
{
	return is_nhwc(x) && x->dims[1] > 1 && x->dims[2] * x->dims[3] > 1;
}

static kiln_status flatten_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct flatten *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
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
	/* a chained INT8 model's u8: evaluation only, no backward */
	return prep_nchw_reorders(h, l, dev, &l->in[0], &s->fwd,
				  l->in[0].dtype == KILN_U8 ? NULL : s->bwd, ws);
}

static kiln_status flatten_forward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	struct flatten *s = l->priv;
	if (!s->reorder)
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	return run_op(h, r, s->fwd, &a);
}

static kiln_status flatten_backward(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_layer_run *r)
{
	struct flatten *s = l->priv;
	if (!s->reorder)
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->dy } };
	return run_dx(h, r, s->bwd, 0, &a);
}

LAYER(flatten, "flatten",
      "reshape [B, ...] to [B, features] in C, H, W order (no copy unless channels-last)", NULL, 1,
      1, NULL, flatten_infer, flatten_plan, flatten_forward, flatten_backward, layer_destroy);
