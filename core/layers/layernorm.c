/* core/layers/layernorm.c - layer normalisation over the last dimension
 * (nn.LayerNorm(C, eps, elementwise_affine)).
 *
 * x, y: any shape whose last dimension is C ([B, T, C] for tokens); weight
 * [C] (ones) and bias [C] (zeros) when affine.  The forward leaves each
 * row's mean and 1/std (f32 [R, 2]) for the backward (KILN_OP_LAYERNORM,
 * LAYERNORM_BWD).
 */
#include "util.h"

struct layernorm {
	struct layer_plans plans;
	double eps;
	int affine;
	int64_t R, C;
	size_t saved_bytes, x_bytes;
	size_t ws_off; /* the scratch before the ops' own workspace (ln_plan) */
	void *fwd;
	void *bwd[2][2]; /* with parameter gradients: [dx accumulate][dw accumulate] */
	void *bwd_x[2];  /* dx only (no affine, or frozen): [dx accumulate] */
};

static const struct kiln_key layernorm_keys[] = {
	{ "eps", KILN_KEY_FLOAT, "1e-5", 0, 1, NULL, "Added to the variance before the square root." },
	{ "affine", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Learn a per-channel scale `weight` (ones) and shift `bias` (zeros): elementwise_affine." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status ln_configure(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_config *cfg, const char *sec)
{
	struct layernorm *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->eps = 1e-5;
	s->affine = 1;
	kiln_status st = h->config_get_float(cfg, sec, "eps", &s->eps);
	if (st && st != KILN_ENOTFOUND)
		return st;
	st = h->config_get_bool(cfg, sec, "affine", &s->affine);
	return st && st != KILN_ENOTFOUND ? st : KILN_OK;
}

static kiln_status ln_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct layernorm *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	char d[96];
	if (x->ndim < 2)
		return h->error(KILN_ECONFIG, "layer '%s' (layernorm) needs [batch, ..., channels], got %s",
				l->name, kiln_tensor_desc_str(x, d, sizeof d));
	/* nn.LayerNorm(W) of an NCHW tensor normalises the width; the
	 * channels-last tensor's last dimension is C, another normalisation */
	if (is_nhwc(x))
		return h->error(KILN_ECONFIG, "layer '%s' (layernorm) normalises the last dimension, the width of an nchw tensor, but got %s: channels-last ([model] layout = nhwc, which `auto` is on the CPU), whose last dimension is the channels; set [model] layout = nchw",
				l->name, kiln_tensor_desc_str(x, d, sizeof d));
	l->out = *x;
	s->C = x->dims[x->ndim - 1];
	s->R = kiln_tensor_numel(x) / s->C;
	s->saved_bytes = ALIGN64((size_t)s->R * 2 * sizeof(float));
	s->x_bytes = ALIGN64(kiln_tensor_bytes(x));
	l->n_params = s->affine ? 2 : 0;
	static const char *const names[] = { "weight", "bias" };
	for (int k = 0; k < l->n_params; k++) {
		l->params[k] = (struct kiln_param_spec){ names[k], { 0 },
							 k ? KILN_INIT_ZERO : KILN_INIT_ONE, 0, 0 };
		f32_desc(&l->params[k].desc, s->C, 0, 0);
	}
	l->needs_input = 1;
	return KILN_OK;
}

static kiln_status ln_plan(const struct kiln_host *h, struct kiln_layer *l,
			   struct kiln_device *dev, size_t *ws)
{
	struct layernorm *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	struct kiln_tensor_desc c, saved;
	f32_desc(&c, s->C, 0, 0);
	f32_desc(&saved, s->R, 2, 0);
	op_init(&op, KILN_OP_LAYERNORM, s->affine ? 3 : 1, 2);
	op.in[0] = op.out[0] = l->out;
	op.in[1] = op.in[2] = c;
	op.out[1] = saved;
	op.f[0] = s->eps;
	if ((st = prep(h, l, dev, &op, &s->fwd, &w)))
		return st;
	if (!kiln_layer_training(l)) { /* an evaluation plan: the forward, its
					* statistics in scratch */
		s->ws_off = s->saved_bytes;
		*ws = s->ws_off + w;
		return KILN_OK;
	}
	op_init(&op, KILN_OP_LAYERNORM_BWD, s->affine ? 4 : 3, 1);
	op.in[0] = op.in[1] = op.out[0] = l->out;
	op.in[2] = saved;
	op.in[3] = c;
	if ((st = prep_pair(h, l, dev, &op, s->bwd_x, &w)))
		return st;
	for (int dw = 0; s->affine && l->trainable && dw < 2; dw++) {
		op.n_out = 3;
		op.out[1] = op.out[2] = c;
		op.i[0] = dw;
		if ((st = prep_pair(h, l, dev, &op, s->bwd[dw], &w)))
			return st;
	}
	l->saved_bytes = s->saved_bytes;
	/* scratch: the statistics in evaluation, or dx nobody wants */
	s->ws_off = s->saved_bytes > s->x_bytes ? s->saved_bytes : s->x_bytes;
	*ws = s->ws_off + w;
	return KILN_OK;
}

/* The ops' own workspace follows the scratch. */
static void ops_ws(struct kiln_op_args *a, const struct layernorm *s,
		   const struct kiln_layer_run *r)
{
	const size_t off = s->ws_off;
	a->workspace = (char *)r->workspace + off;
	a->workspace_bytes = r->workspace_bytes - off;
}

static kiln_status ln_forward(const struct kiln_host *h, struct kiln_layer *l,
			      const struct kiln_layer_run *r)
{
	struct layernorm *s = l->priv;
	void *saved = r->saved ? r->saved : r->workspace;
	struct kiln_op_args a = { .in = { r->x[0], r->w[0], r->w[1] }, .out = { r->y, saved } };
	ops_ws(&a, s, r);
	return h->device_run(r->dev, s->fwd, &a, r->stream);
}

static kiln_status ln_backward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct layernorm *s = l->priv;
	const int params = s->affine && r->dw[0];
	if (!r->dx[0] && !params)
		return KILN_OK;
	const int acc = r->dx[0] && r->dx_accum[0];
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->saved, r->w[0] },
				  .out = { r->dx[0] ? r->dx[0] : r->workspace } };
	if (params) {
		a.out[1] = r->dw[0], a.out[2] = r->dw[1];
	}
	ops_ws(&a, s, r);
	void *plan = params ? s->bwd[r->dw_accum ? 1 : 0][acc] : s->bwd_x[acc];
	return h->device_run(r->dev, plan, &a, r->stream);
}

LAYER(layernorm, "layernorm",
      "layer normalisation over the last dimension (nn.LayerNorm: eps, elementwise_affine)",
      layernorm_keys, 1, 1, ln_configure, ln_infer, ln_plan, ln_forward, ln_backward,
      layer_destroy);
