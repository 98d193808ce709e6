/* core/layers/act.c - elementwise activations, any shape: y = act(x).
 * The backward reads both x and y (the device picks what its derivative
 * needs: y for sigmoid and tanh, x for the others). */
#include "act.h"

struct act {
	struct layer_plans plans;
	int kind;
	double alpha;
	void *fwd, *bwd[2];
};

kiln_status act_configure(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_config *cfg, const char *sec, int kind)
{
	struct act *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->kind = kind;
	s->alpha = 0.01;
	if (kind == KILN_ACT_LEAKY_RELU)
		h->config_get_float(cfg, sec, "negative_slope", &s->alpha);
	const char *approx = kind == KILN_ACT_GELU ? h->config_get(cfg, sec, "approximate") : NULL;
	if (approx && !strcmp(approx, "tanh"))
		s->kind = KILN_ACT_GELU_TANH;
	else if (approx && strcmp(approx, "none"))
		return h->error(KILN_ECONFIG, "%s: [%s] approximate = %s: expected none or tanh",
				h->config_where(cfg, sec, "approximate"), sec, approx);
	return KILN_OK;
}

kiln_status act_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	(void)h;
	l->out = l->in[0];
	/* fused into the layer before ([run] fuse): a view, nothing to run */
	l->is_view = l->act_fused;
	l->needs_input = l->needs_output = !l->is_view;
	return KILN_OK;
}

kiln_status act_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
		     size_t *ws)
{
	struct act *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	if (l->is_view)
		return KILN_OK;
	op_init(&op, KILN_OP_ACT, 1, 1);
	op.in[0] = op.out[0] = l->out;
	op.i[0] = s->kind;
	op.f[0] = s->alpha;
	if ((st = prep(h, l, dev, &op, &s->fwd, ws)) || !kiln_layer_training(l))
		return st; /* an evaluation plan: the forward alone */
	op_init(&op, KILN_OP_ACT_BWD, 3, 1);
	op.in[0] = op.in[1] = op.in[2] = op.out[0] = l->out;
	op.i[0] = s->kind;
	op.f[0] = s->alpha;
	return prep_pair(h, l, dev, &op, s->bwd, ws);
}

kiln_status act_forward(const struct kiln_host *h, struct kiln_layer *l,
			const struct kiln_layer_run *r)
{
	struct act *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	return l->is_view ? KILN_OK : run_op(h, r, s->fwd, &a);
}

kiln_status act_backward(const struct kiln_host *h, struct kiln_layer *l,
			 const struct kiln_layer_run *r)
{
	struct act *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->y } };
	return l->is_view ? KILN_OK : run_dx(h, r, s->bwd, 0, &a);
}
