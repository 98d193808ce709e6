/* core/layers/add.c - elementwise sum of its inputs (residual
 * connections): y = x0 + x1 + ...; every input gets dy as its gradient. */
#include "util.h"

struct add {
	struct layer_plans plans;
	void *first, *more, *grad[2];
};

static kiln_status add_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!layer_alloc(h, l, sizeof(struct add)))
		return KILN_ENOMEM;
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
	/* every dx_k is dy: the planner may share its storage */
	l->dx_is_dy = (1 << l->n_in) - 1;
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
	if ((st = prep(h, l, dev, &op, &s->first, ws)))
		return st;
	/* y += x_k for a third input and on: y = 1 * x_k + y */
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.flags = KILN_OPF_ACCUMULATE;
	op.in[0] = op.out[0] = l->out;
	op.f[0] = 1.0;
	if ((st = prep(h, l, dev, &op, &s->more, ws)))
		return st;
	/* dx_k (=|+=) dy */
	return prep_pair(h, l, dev, &op, s->grad, ws);
}

static kiln_status add_forward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct add *s = l->priv;
	kiln_status st;
	struct kiln_op_args a = { .in = { r->x[0], r->x[1] }, .out = { r->y } };
	if ((st = run_op(h, r, s->first, &a)))
		return st;
	for (int k = 2; k < l->n_in; k++) {
		a = (struct kiln_op_args){ .in = { r->x[k] }, .out = { r->y } };
		if ((st = run_op(h, r, s->more, &a)))
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
		struct kiln_op_args a = { .in = { r->dy } };
		if (dx_shares_dy(r, k))
			continue;
		if ((st = run_dx(h, r, s->grad, k, &a)))
			return st;
	}
	return KILN_OK;
}

LAYER(add, "add", "elementwise sum of its inputs (`inputs = a, b`): residual connections", NULL,
      2, KILN_LAYER_MAX_INPUTS, NULL, add_infer, add_plan, add_forward, add_backward,
      layer_destroy);
