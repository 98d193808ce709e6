/* core/layers/flatten.c - [B, d1, d2, ...] -> [B, d1*d2*...].  A view: the
 * planner gives the output the input's bytes, so it costs nothing. */
#include "util.h"

static kiln_status flatten_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	(void)h;
	f32_desc(&l->out, l->in[0].dims[0], per_sample(&l->in[0]), 0);
	l->out.dtype = l->in[0].dtype;
	l->is_view = 1;
	return KILN_OK;
}

static kiln_status flatten_nothing(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	(void)h, (void)l, (void)r;
	return KILN_OK;
}

static const struct kiln_layer_ops flatten_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = NULL,
	.infer = flatten_infer,
	.plan = NULL,
	.forward = flatten_nothing,
	.backward = flatten_nothing,
	.destroy = NULL,
};

LAYER_DESCRIPTOR(kiln_layer_flatten, "flatten", "reshape [B, ...] to [B, features] (no copy)",
		 flatten_ops, NULL);
