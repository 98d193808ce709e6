/* core/layers/dropout.c - inverted dropout: in training keep each element
 * with probability 1 - p and scale it by 1/(1 - p); identity in evaluation.
 *
 * The mask is a counter-based draw of (seed, layer, micro-step, element)
 * (DESIGN.md "Randomness"): the same for any thread count, recomputed in
 * backward instead of stored, and never repeated across micro-steps since
 * the step is the device counter the trainer advances after each one.
 */
#include "util.h"

struct dropout {
	double p;
	void *fwd, *bwd[2], *copy;
};

static const struct kiln_key dropout_keys[] = {
	{ "p", KILN_KEY_FLOAT, "0.5", 0, 0.999, NULL, "Probability of zeroing an element." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status dropout_configure(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_config *cfg, const char *sec)
{
	struct dropout *s = calloc(1, sizeof *s);
	if (!s)
		return h->error(KILN_ENOMEM, "out of memory");
	l->priv = s;
	s->p = 0.5;
	h->config_get_float(cfg, sec, "p", &s->p);
	return KILN_OK;
}

static kiln_status dropout_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	(void)h;
	l->out = l->in[0];
	return KILN_OK;
}

static kiln_status dropout_plan(const struct kiln_host *h, struct kiln_layer *l,
				struct kiln_device *dev, size_t *ws)
{
	struct dropout *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	int64_t one = 1;
	struct kiln_tensor_desc step;
	kiln_tensor_desc_init(&step, KILN_I64, 1, &one);
	op_init(&op, KILN_OP_DROPOUT, 2, 1);
	op.in[0] = op.out[0] = l->out;
	op.in[1] = step;
	op.i[0] = (int64_t)l->seed, op.i[1] = l->index, op.f[0] = s->p;
	if ((st = prep(h, dev, &op, &s->fwd, ws)))
		return st;
	op.type = KILN_OP_DROPOUT_BWD;
	if ((st = prep_pair(h, dev, &op, s->bwd, ws)))
		return st;
	/* evaluation: y = x */
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.in[0] = op.out[0] = l->out;
	op.f[0] = 1.0;
	return prep(h, dev, &op, &s->copy, ws);
}

static kiln_status dropout_forward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	struct dropout *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->step }, .out = { r->y } };
	args_ws(&a, r);
	return h->device_run(r->dev, r->training ? s->fwd : s->copy, &a, r->stream);
}

static kiln_status dropout_backward(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_layer_run *r)
{
	struct dropout *s = l->priv;
	if (!r->dx[0])
		return KILN_OK;
	struct kiln_op_args a = { .in = { r->dy, r->step }, .out = { r->dx[0] } };
	args_ws(&a, r);
	return h->device_run(r->dev, s->bwd[r->dx_accum[0] ? 1 : 0], &a, r->stream);
}

static void dropout_destroy(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev)
{
	struct dropout *s = l->priv;
	if (s && dev) {
		h->device_plan_free(dev, s->fwd);
		h->device_plan_free(dev, s->bwd[0]);
		h->device_plan_free(dev, s->bwd[1]);
		h->device_plan_free(dev, s->copy);
	}
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops dropout_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = dropout_configure,
	.infer = dropout_infer,
	.plan = dropout_plan,
	.forward = dropout_forward,
	.backward = dropout_backward,
	.destroy = dropout_destroy,
};

LAYER_DESCRIPTOR(kiln_layer_dropout, "dropout",
		 "inverted dropout with a counter-based mask (identity in evaluation)", dropout_ops,
		 dropout_keys);
