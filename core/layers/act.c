/* core/layers/act.c - elementwise activations, any shape: y = act(x).
 * The backward reads both x and y (the device picks what its derivative
 * needs: y for sigmoid and tanh, x for the others). */
#include "act.h"

struct act {
	int kind;
	double alpha;
	void *fwd, *bwd[2];
};

kiln_status act_configure(const struct kiln_host *h, struct kiln_layer *l,
			  const struct kiln_config *cfg, const char *sec, int kind)
{
	struct act *s = calloc(1, sizeof *s);
	if (!s)
		return h->error(KILN_ENOMEM, "out of memory");
	l->priv = s;
	s->kind = kind;
	s->alpha = 0.01;
	if (kind == KILN_ACT_LEAKY_RELU)
		h->config_get_float(cfg, sec, "negative_slope", &s->alpha);
	return KILN_OK;
}

kiln_status act_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	(void)h;
	l->out = l->in[0];
	l->needs_input = 1;
	l->needs_output = 1;
	return KILN_OK;
}

kiln_status act_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
		     size_t *ws)
{
	struct act *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_ACT, 1, 1);
	op.in[0] = op.out[0] = l->out;
	op.i[0] = s->kind;
	op.f[0] = s->alpha;
	if ((st = prep(h, dev, &op, &s->fwd, ws)))
		return st;
	op_init(&op, KILN_OP_ACT_BWD, 3, 1);
	op.in[0] = op.in[1] = op.in[2] = op.out[0] = l->out;
	op.i[0] = s->kind;
	op.f[0] = s->alpha;
	return prep_pair(h, dev, &op, s->bwd, ws);
}

kiln_status act_forward(const struct kiln_host *h, struct kiln_layer *l,
			const struct kiln_layer_run *r)
{
	struct act *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->fwd, &a, r->stream);
}

kiln_status act_backward(const struct kiln_host *h, struct kiln_layer *l,
			 const struct kiln_layer_run *r)
{
	struct act *s = l->priv;
	if (!r->dx[0])
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->y }, .out = { r->dx[0] } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->bwd[r->dx_accum[0] ? 1 : 0], &a, r->stream);
}

void act_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev)
{
	struct act *s = l->priv;
	if (s && dev) {
		h->device_plan_free(dev, s->fwd);
		h->device_plan_free(dev, s->bwd[0]);
		h->device_plan_free(dev, s->bwd[1]);
	}
	free(s);
	l->priv = NULL;
}
