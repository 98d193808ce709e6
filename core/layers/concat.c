/* core/layers/concat.c - concatenate inputs along the channels (dimension
 * 1): [N, C0, ...] + [N, C1, ...] -> [N, C0 + C1, ...], or with `dim = -1`
 * along the last dimension ([B, T, H0] + [B, T, H1]: a bidirectional
 * recurrent layer's two directions). */
#include "util.h"

struct concat {
	struct layer_plans plans;
	void *fwd;
	void *split[1 << KILN_OP_MAX_OUT]; /* one per write/add pattern of the inputs */
	size_t off[KILN_OP_MAX_OUT];       /* scratch for gradients nobody needs */
	int64_t dim;                       /* the `dim` key: 1 or -1 (last) */
	int d;                             /* the dimension concatenated */
};

static const struct kiln_key concat_keys[] = {
	{ "dim", KILN_KEY_INT, "1", -1, 1, NULL,
	  "Dimension to concatenate along: 1 (channels) or -1 (the last: [B, T, H] sequences)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status concat_configure(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_config *cfg, const char *sec)
{
	struct concat *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->dim = 1;
	kiln_status st = h->config_get_int(cfg, sec, "dim", &s->dim);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if (s->dim != 1 && s->dim != -1)
		return h->error(KILN_ECONFIG, "%s: [%s] dim must be 1 or -1",
				h->config_where(cfg, sec, "dim"), sec);
	return KILN_OK;
}

static kiln_status concat_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct concat *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	const int d = s->dim < 0 ? l->in[0].ndim - 1 : 1;
	s->d = d;
	if (l->n_in > KILN_OP_MAX_OUT)
		return h->error(KILN_ECONFIG, "layer '%s' (concat): at most %d inputs", l->name,
				KILN_OP_MAX_OUT);
	l->out = l->in[0];
	for (int k = 1; k < l->n_in; k++) {
		const struct kiln_tensor_desc *b = &l->in[k];
		int same = b->ndim == l->out.ndim && b->layout == l->out.layout &&
			   b->dims[0] == l->out.dims[0];
		for (int e = 1; e < b->ndim; e++)
			same = same && (e == d || b->dims[e] == l->out.dims[e]);
		if (!same || b->ndim < 2)
			return h->error(KILN_ECONFIG, "layer '%s' (concat): input %d differs from input 0 in a dimension other than %s",
					l->name, k, s->dim < 0 ? "the last" : "channels");
		l->out.dims[d] += b->dims[d];
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
	op.i[0] = s->d;
	if ((st = prep(h, l, dev, &op, &s->fwd, ws)))
		return st;
	/* dy -> dx_k, each written or added into: prepare every pattern of
	 * the accumulate bits (at most 16), since nothing is prepared in the
	 * step */
	op_init(&op, KILN_OP_SPLIT, 1, l->n_in);
	op.in[0] = l->out;
	for (int k = 0; k < l->n_in; k++)
		op.out[k] = l->in[k];
	op.i[0] = s->d;
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

LAYER(concat, "concat", "concatenate inputs along the channels (`inputs = a, b`)", concat_keys,
      2, KILN_LAYER_MAX_INPUTS, concat_configure, concat_infer, concat_plan, concat_forward, concat_backward,
      layer_destroy);
