/* core/layers/concat.c - concatenate inputs along the channels (dimension
 * 1): [N, C0, ...] + [N, C1, ...] -> [N, C0 + C1, ...]. */
#include "util.h"

struct concat {
	struct layer_plans plans;
	void *fwd;
	void *split[1 << KILN_OP_MAX_OUT]; /* one per write/add pattern of the inputs */
	size_t off[KILN_OP_MAX_OUT];       /* scratch for gradients nobody needs */
};

static kiln_status concat_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!layer_alloc(h, l, sizeof(struct concat)))
		return KILN_ENOMEM;
	if (l->n_in > KILN_OP_MAX_OUT)
		return h->error(KILN_ECONFIG, "layer '%s' (concat): at most %d inputs", l->name,
				KILN_OP_MAX_OUT);
	l->out = l->in[0];
	for (int k = 1; k < l->n_in; k++) {
		const struct kiln_tensor_desc *b = &l->in[k];
		int same = b->ndim == l->out.ndim && b->layout == l->out.layout &&
			   b->dims[0] == l->out.dims[0];
		for (int d = 2; d < b->ndim; d++)
			same = same && b->dims[d] == l->out.dims[d];
		if (!same || b->ndim < 2)
			return h->error(KILN_ECONFIG, "layer '%s' (concat): input %d differs from input 0 in a dimension other than channels",
					l->name, k);
		l->out.dims[1] += b->dims[1];
	}
	return KILN_OK;
}

static kiln_status concat_plan(const struct kiln_host *h, struct kiln_layer *l,
			       struct kiln_device *dev, size_t *ws)
{
	struct concat *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_CONCAT, l->n_in, 1);
	for (int k = 0; k < l->n_in; k++)
		op.in[k] = l->in[k];
	op.out[0] = l->out;
	op.i[0] = 1;
	if ((st = prep(h, l, dev, &op, &s->fwd, ws)))
		return st;
	/* dy -> dx_k, each written or added into: prepare every pattern of
	 * the accumulate bits (at most 16), since nothing is prepared in the
	 * step */
	op_init(&op, KILN_OP_SPLIT, 1, l->n_in);
	op.in[0] = l->out;
	for (int k = 0; k < l->n_in; k++)
		op.out[k] = l->in[k];
	op.i[0] = 1;
	size_t w = 0, scratch = 0;
	for (int bits = 0; bits < 1 << l->n_in; bits++) {
		op.i[1] = bits;
		if ((st = prep(h, l, dev, &op, &s->split[bits], &w)))
			return st;
	}
	for (int k = 0; k < l->n_in; k++) {
		s->off[k] = scratch;
		scratch += ALIGN64(kiln_tensor_bytes(&l->in[k]));
	}
	if (scratch + w > *ws)
		*ws = scratch + w;
	return KILN_OK;
}

static kiln_status concat_forward(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_layer_run *r)
{
	struct concat *s = l->priv;
	struct kiln_op_args a = { .out = { r->y } };
	for (int k = 0; k < l->n_in; k++)
		a.in[k] = r->x[k];
	return run_op(h, r, s->fwd, &a);
}

static kiln_status concat_backward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	struct concat *s = l->priv;
	struct kiln_op_args a = { .in = { r->dy } };
	int bits = 0, any = 0;
	size_t scratch = 0;
	for (int k = 0; k < l->n_in; k++) {
		any |= r->dx[k] != NULL;
		a.out[k] = r->dx[k] ? r->dx[k] : (char *)r->workspace + s->off[k];
		if (r->dx[k] && r->dx_accum[k])
			bits |= 1 << k;
		scratch = s->off[k] + ALIGN64(kiln_tensor_bytes(&l->in[k]));
	}
	if (!any)
		return KILN_OK;
	a.workspace = (char *)r->workspace + scratch;
	a.workspace_bytes = r->workspace_bytes - scratch;
	return h->device_run(r->dev, s->split[bits], &a, r->stream);
}

LAYER(concat, "concat", "concatenate inputs along the channels (`inputs = a, b`)", NULL, 2,
      KILN_LAYER_MAX_INPUTS, NULL, concat_infer, concat_plan, concat_forward, concat_backward,
      layer_destroy);
