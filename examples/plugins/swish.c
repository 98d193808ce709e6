/* examples/plugins/swish.c - a layer plugin written out of tree: the swish
 * activation y = x * sigmoid(x) (also called SiLU), composed from the
 * device's generic ops, so it runs on any device.
 *
 * Build against an installed kiln:
 *   cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags kiln) \
 *      -o kiln-swish.so swish.c
 * then point [run] plugin_path (or $KILN_PLUGIN_PATH) at its directory and
 * write `type = swish` in a [layer.NAME] section.  docs/plugins.md walks
 * through this file.
 */
#include <kiln/plugin.h>
#include <stdlib.h>
#include <string.h>

/* Per-plan state: the prepared ops.  Shapes: every tensor is the layer's
 * input shape, n elements. */
struct swish {
	void *sigmoid;  /* s = sigmoid(x)            (ACT) */
	void *mul;      /* y = x * s                 (MUL) */
	void *mul_ws;   /* t = y * s                 (MUL) */
	void *add;      /* u = s + y                 (ADD) */
	void *sub;      /* u -= t   (u = 1 * -t + u) (SCALE, accumulate) */
	void *grad[2];  /* dx (=|+=) dy * u          (MUL) */
	size_t bytes;   /* of one tensor */
};

static void desc_op(struct kiln_op *op, int type, int n_in, const struct kiln_tensor_desc *d)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	op->n_in = n_in;
	op->n_out = 1;
	for (int i = 0; i < n_in; i++)
		op->in[i] = *d;
	op->out[0] = *d;
}

static kiln_status swish_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	if (!l->priv && !(l->priv = calloc(1, sizeof(struct swish))))
		return h->error(KILN_ENOMEM, "swish: out of memory");
	l->out = l->in[0];
	l->needs_input = 1;  /* backward recomputes sigmoid(x) */
	l->needs_output = 1; /* and reads y */
	return KILN_OK;
}

static kiln_status swish_plan(const struct kiln_host *h, struct kiln_layer *l,
			      struct kiln_device *dev, size_t *ws)
{
	struct swish *s = l->priv;
	const struct kiln_tensor_desc *d = &l->out;
	struct kiln_op op;
	kiln_status st;
	size_t n = 1;
	for (int i = 0; i < d->ndim; i++)
		n *= (size_t)d->dims[i];
	s->bytes = (n * sizeof(float) + 63) & ~(size_t)63;

	desc_op(&op, KILN_OP_ACT, 1, d);
	op.i[0] = KILN_ACT_SIGMOID;
	if ((st = h->device_prepare(dev, &op, &s->sigmoid, NULL)))
		return st;
	desc_op(&op, KILN_OP_MUL, 2, d);
	if ((st = h->device_prepare(dev, &op, &s->mul, NULL)) ||
	    (st = h->device_prepare(dev, &op, &s->mul_ws, NULL)))
		return st;
	desc_op(&op, KILN_OP_ADD, 2, d);
	if ((st = h->device_prepare(dev, &op, &s->add, NULL)))
		return st;
	desc_op(&op, KILN_OP_SCALE, 1, d);
	op.flags = KILN_OPF_ACCUMULATE;
	op.f[0] = -1.0;
	if ((st = h->device_prepare(dev, &op, &s->sub, NULL)))
		return st;
	for (int acc = 0; acc < 2; acc++) {
		desc_op(&op, KILN_OP_MUL, 2, d);
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		if ((st = h->device_prepare(dev, &op, &s->grad[acc], NULL)))
			return st;
	}
	*ws = 3 * s->bytes; /* s, t, u */
	return KILN_OK;
}

static kiln_status run(const struct kiln_host *h, const struct kiln_layer_run *r, void *plan,
		       const void *a, const void *b, void *out)
{
	struct kiln_op_args args = { .in = { a, b }, .out = { out } };
	return h->device_run(r->dev, plan, &args, r->stream);
}

static kiln_status swish_forward(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_layer_run *r)
{
	struct swish *s = l->priv;
	float *sig = r->workspace;
	kiln_status st = run(h, r, s->sigmoid, r->x[0], NULL, sig);
	return st ? st : run(h, r, s->mul, r->x[0], sig, r->y);
}

/* dy/dx = s + x s (1 - s) = s + y - y s, with s = sigmoid(x), y = x s */
static kiln_status swish_backward(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_layer_run *r)
{
	struct swish *s = l->priv;
	char *w = r->workspace;
	float *sig = (float *)w, *t = (float *)(w + s->bytes), *u = (float *)(w + 2 * s->bytes);
	kiln_status st;
	if (!r->dx[0])
		return KILN_OK;
	if ((st = run(h, r, s->sigmoid, r->x[0], NULL, sig)) ||
	    (st = run(h, r, s->mul_ws, r->y, sig, t)) ||
	    (st = run(h, r, s->add, sig, r->y, u)) ||
	    (st = run(h, r, s->sub, t, NULL, u)))
		return st;
	return run(h, r, s->grad[r->dx_accum[0] ? 1 : 0], r->dy, u, r->dx[0]);
}

static void swish_destroy(const struct kiln_host *h, struct kiln_layer *l,
			  struct kiln_device *dev)
{
	struct swish *s = l->priv;
	if (s && dev) {
		void *plans[] = { s->sigmoid, s->mul, s->mul_ws, s->add, s->sub, s->grad[0], s->grad[1] };
		for (size_t i = 0; i < sizeof plans / sizeof *plans; i++)
			h->device_plan_free(dev, plans[i]);
	}
	free(s);
	l->priv = NULL;
}

static const struct kiln_layer_ops swish_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = NULL,
	.infer = swish_infer,
	.plan = swish_plan,
	.forward = swish_forward,
	.backward = swish_backward,
	.destroy = swish_destroy,
};

static const struct kiln_plugin swish_plugin = {
	.abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR,
	.kind = KILN_PLUGIN_LAYER,
	.name = "swish",
	.summary = "swish / SiLU activation y = x * sigmoid(x) (example out-of-tree plugin)",
	.ops = &swish_ops,
	.keys = NULL,
	.probe = NULL,
};

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	static const struct kiln_plugin *const list[] = { &swish_plugin, NULL };
	(void)host;
	return list;
}
