/* core/layers/add.c - elementwise sum of its inputs (residual
 * connections): y = x0 + x1 + ...; every input gets dy as its gradient.
 * Inputs of two dtypes (the f32 residual stream and a bf16/f16 branch
 * under low-precision compute) sum into f32, as PyTorch's type promotion
 * does under autocast; each such input's gradient is dy rounded to its
 * dtype.
 * Chained INT8 (evaluation): with int8_out_scale, the sum of two f32
 * inputs and the ReLU that alone reads it are written as u8 for the INT8
 * layers after it (KILN_OP_ADD's u8 output, kiln/ops.h). */
#include "util.h"

struct add {
	struct layer_plans plans;
	/* more, grad: [0] for the inputs of y's dtype, [1] for the others
	 * (the low-precision branch of an f32 sum); grad[.][1] adds */
	void *first, *more[2], *grad[2][2];
	double int8_out_scale; /* > 0: y is u8 in this scale, the ReLU fused */
};

static const struct kiln_key add_keys[] = {
	{ "int8_out_scale", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,
	  "Evaluation only: > 0 writes the sum of the two f32 inputs, after the ReLU that alone reads it (fused: `[run] fuse = 1`), as u8 in this scale for the INT8 layers after it (set by `kiln eval --quantized` on the CPU: docs/inference.md, INT8; a training run refuses it); 0: f32." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status add_configure(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *sec)
{
	struct add *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	h->config_get_float(cfg, sec, "int8_out_scale", &s->int8_out_scale);
	return KILN_OK;
}

/* The u8 output (int8_out_scale): two f32 inputs, the ReLU fused. */
static kiln_status add_infer_u8(const struct kiln_host *h, struct kiln_layer *l)
{
	if (l->n_in != 2 || l->in[0].dtype != KILN_F32 || l->in[1].dtype != KILN_F32)
		return h->error(KILN_ECONFIG, "layer '%s' (add): int8_out_scale wants two f32 inputs",
				l->name);
	take_act(l, l->fuse_act == 1 + KILN_ACT_RELU);
	l->out.dtype = KILN_U8;
	l->inplace_ok = 0;
	return KILN_OK;
}

static kiln_status add_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct add *s = layer_alloc(h, l, sizeof(struct add));
	if (!s)
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
	for (int k = 1; k < l->n_in; k++)
		if (l->in[k].dtype != l->out.dtype)
			l->out.dtype = KILN_F32; /* the wider of the two */
	/* y may take the memory of x0 or x1 (the backward reads neither):
	 * ADD is elementwise, and a third input is added after both; every
	 * dx_k is dy: the planner may share its storage.  Both for the
	 * inputs of y's dtype. */
	l->inplace_ok = 0;
	l->dx_is_dy = 0;
	for (int k = 0; k < l->n_in; k++) {
		const int dt = l->in[k].dtype;
		if (dt != l->out.dtype && dt != KILN_BF16 && dt != KILN_F16) {
			char d[96];
			return h->error(KILN_ECONFIG, "layer '%s' (add): input %d is %s, which does not add to %s",
					l->name, k, kiln_tensor_desc_str(&l->in[k], d, sizeof d),
					kiln_dtype_name(l->out.dtype));
		}
		if (dt == l->out.dtype) {
			l->inplace_ok |= k < 2 ? 1 << k : 0;
			l->dx_is_dy |= 1 << k;
		}
	}
	return s->int8_out_scale > 0 ? add_infer_u8(h, l) : KILN_OK;
}

static kiln_status add_plan(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev, size_t *ws)
{
	struct add *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_ADD, 2, 1);
	op.out[0] = l->out;
	op.in[0] = with_dtype(l->out, l->in[0].dtype);
	op.in[1] = with_dtype(l->out, l->in[1].dtype);
	if (s->int8_out_scale > 0 && kiln_layer_training(l)) /* (before out_dir is touched) */
		return h->error(KILN_ECONFIG, "layer '%s': int8_out_scale is for evaluation only", l->name);
	if (s->int8_out_scale > 0) { /* evaluation only: no backward */
		if ((st = int8_out_planned(h, l, s->int8_out_scale)))
			return st;
		op.in[0].dtype = op.in[1].dtype = KILN_F32;
		op.f[0] = s->int8_out_scale;
		return prep(h, l, dev, &op, &s->first, ws);
	}
	if ((st = prep(h, l, dev, &op, &s->first, ws)))
		return st;
	/* the plans for the inputs of y's dtype ([0]) and, where there are
	 * any, for those of the other ([1]) */
	int other = 0; /* the other dtype, 0: none */
	for (int k = 0; k < l->n_in; k++)
		if (l->in[k].dtype != l->out.dtype)
			other = l->in[k].dtype;
	const int train = kiln_layer_training(l);
	for (int j = 0; j < (other ? 2 : 1); j++) {
		const int dt = j ? other : l->out.dtype;
		/* y += x_k for a third input and on: y = 1 * x_k + y */
		op_init(&op, KILN_OP_SCALE, 1, 1);
		op.flags = KILN_OPF_ACCUMULATE;
		op.in[0] = with_dtype(l->out, dt);
		op.out[0] = l->out;
		op.f[0] = 1.0;
		if (l->n_in > 2 && (st = prep(h, l, dev, &op, &s->more[j], ws)))
			return st;
		/* dx_k (=|+=) dy (in dx_k's dtype); not in an evaluation plan */
		op.in[0] = l->out;
		op.out[0] = with_dtype(l->out, dt);
		if (train && (st = prep_pair(h, l, dev, &op, s->grad[j], ws)))
			return st;
	}
	return KILN_OK;
}

static kiln_status add_forward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct add *s = l->priv;
	kiln_status st;
	struct kiln_op_args a = { .in = { r->x[0], r->x[1] }, .out = { r->y } };
	if (r->training && s->int8_out_scale > 0)
		return h->error(KILN_ECONFIG, "layer '%s': int8_out_scale is for evaluation only", l->name);
	if ((st = run_op(h, r, s->first, &a)))
		return st;
	for (int k = 2; k < l->n_in; k++) {
		a = (struct kiln_op_args){ .in = { r->x[k] }, .out = { r->y } };
		if ((st = run_op(h, r, s->more[l->in[k].dtype != l->out.dtype], &a)))
			return st;
	}
	return KILN_OK;
}

static kiln_status add_backward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct add *s = l->priv;
	kiln_status st;
	if (s->int8_out_scale > 0) /* no backward was prepared */
		return h->error(KILN_ECONFIG, "layer '%s': int8_out_scale is for evaluation only", l->name);
	for (int k = 0; k < l->n_in; k++) {
		struct kiln_op_args a = { .in = { r->dy } };
		if (dx_shares_dy(r, k))
			continue;
		if ((st = run_dx(h, r, s->grad[l->in[k].dtype != l->out.dtype], k, &a)))
			return st;
	}
	return KILN_OK;
}

LAYER(add, "add", "elementwise sum of its inputs (`inputs = a, b`): residual connections", add_keys,
      2, KILN_LAYER_MAX_INPUTS, add_configure, add_infer, add_plan, add_forward, add_backward,
      layer_destroy);
