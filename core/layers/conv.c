/* core/layers/conv.c - 2-d convolution (PyTorch's nn.Conv2d).
 *
 * x: [N, C, H, W] in the model's layout, w: [O, C/g, KH, KW] (OIHW, as
 * PyTorch stores it), b: [O], y: [N, O, OH, OW] in x's layout (NHWC from
 * an NCHW x of one channel where the core asks it: kiln_layer_out_layout), with
 * OH = (H + 2*pad - dil*(KH-1) - 1) / stride + 1 (floor).
 *
 * A second input r (`inputs = x, r`; evaluation only) is a residual
 * added before the fused activation: y = act(conv(x) + b + r), a ResNet
 * block's conv, add and ReLU in one op (KILN_OPF_RESIDUAL, kiln/ops.h),
 * or the CONV, an ADD and the ACT where the device has not got it.  The
 * inference passes write it (core/infer_passes.c, "residual").
 */
#include "util.h"

struct conv {
	struct layer_plans plans;
	int64_t out, k[2], stride[2], pad[2], dil[2], groups;
	int bias;
	struct kiln_tensor_desc x, y, w;
	void *fwd, *bwd_data, *acc;
	/* the weight (and bias) gradient: [0] written, [1] added into
	 * (dw_accum; ABI 2.9), or NULL where the device cannot add: then
	 * written into scratch and added by acc_w, acc_b */
	void *bwd_w[2], *acc_w, *acc_b;
	void *act, *mask; /* a fused activation run apart; the fused ReLU's backward */
	/* kept copies (KILN_OPF_KEEP, a training plan's, f32 and bf16): fwd
	 * and bwd_w write them, bwd_w and bwd_data (data_kept) read them.  An
	 * evaluation plan prepares the plain forward alone (conv_plan). */
	size_t kept_x, kept_dy; /* their bytes (0: none) */
	/* s->bwd_w has the kept dy's output: its buffer is passed (the device's
	 * run wants every output set) even where the device keeps nothing there
	 * (kept_dy 0: dy already in its kernel's layout, e.g. one output
	 * channel or a 1x1 output, whose NCHW and NHWC are the same bytes) */
	int dy_out;
	int data_kept;
	size_t dx_bytes, dw_bytes, front;
	double int8_scale, int8_out_scale; /* [layer.X] int8_scale: > 0 runs the INT8 op */
	int int8_unsigned;
	int res;     /* a residual input (in[1]): evaluation only */
	void *radd;  /* its ADD where the device took no KILN_OPF_RESIDUAL */
};

static const struct kiln_key conv_keys[] = {
	{ "out", KILN_KEY_INT, NULL, 1, 1e9, NULL, "Output channels (required)." },
	{ "kernel", KILN_KEY_INTS, NULL, 1, 1e6, NULL, "Kernel size: `3` or `3,5` (height, width) (required)." },
	{ "stride", KILN_KEY_INTS, "1", 1, 1e6, NULL, "Stride: `N` or `H,W`." },
	{ "padding", KILN_KEY_INTS, "0", 0, 1e6, NULL, "Zero padding on both sides: `N` or `H,W`." },
	{ "dilation", KILN_KEY_INTS, "1", 1, 1e6, NULL, "Dilation (PyTorch's: 1 = none): `N` or `H,W`." },
	{ "groups", KILN_KEY_INT, "1", 1, 1e6, NULL, "Groups: input and output channels must divide by it." },
	{ "bias", KILN_KEY_BOOL, NULL, 0, 0, NULL,
	  "Learn a bias. Unset: yes, except for a convolution whose only consumer is a batchnorm, which would cancel it (logged)." },
	LAYER_INT8_KEYS,
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status conv_configure(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_config *cfg, const char *sec)
{
	struct conv *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	if (h->config_get_int(cfg, sec, "out", &s->out))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'out' (output channels)",
				h->config_where(cfg, sec, NULL), sec);
	if (!h->config_get(cfg, sec, "kernel"))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'kernel' (e.g. kernel = 3)",
				h->config_where(cfg, sec, NULL), sec);
	kiln_status st;
	if ((st = get_pair(h, cfg, sec, "kernel", 1, s->k)) ||
	    (st = get_pair(h, cfg, sec, "stride", 1, s->stride)) ||
	    (st = get_pair(h, cfg, sec, "padding", 0, s->pad)) ||
	    (st = get_pair(h, cfg, sec, "dilation", 1, s->dil)))
		return st;
	s->groups = 1;
	h->config_get_int(cfg, sec, "groups", &s->groups);
	/* also when the config was validated without a registry */
	if (s->k[0] < 1 || s->k[1] < 1 || s->stride[0] < 1 || s->stride[1] < 1 || s->dil[0] < 1 ||
	    s->dil[1] < 1 || s->pad[0] < 0 || s->pad[1] < 0 || s->groups < 1)
		return h->error(KILN_ECONFIG, "%s: [%s]: kernel, stride, dilation and groups must be >= 1, padding >= 0",
				h->config_where(cfg, sec, NULL), sec);
	s->bias = !l->before_norm; /* the rule for an unset key */
	h->config_get_bool(cfg, sec, "bias", &s->bias);
	h->config_get_float(cfg, sec, "int8_scale", &s->int8_scale);
	h->config_get_bool(cfg, sec, "int8_unsigned", &s->int8_unsigned);
	h->config_get_float(cfg, sec, "int8_out_scale", &s->int8_out_scale);
	return KILN_OK;
}

static kiln_status conv_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct conv *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	if (x->ndim != 4)
		return h->error(KILN_ECONFIG, "layer '%s' (conv) needs a 4-d input [N, C, H, W], got %d dims",
				l->name, x->ndim);
	int64_t C = x->dims[1], g = s->groups, oh[2];
	if (C % g || s->out % g)
		return h->error(KILN_ECONFIG, "layer '%s' (conv): groups = %lld must divide the %lld input and %lld output channels",
				l->name, (long long)g, (long long)C, (long long)s->out);
	for (int d = 0; d < 2; d++) {
		int64_t span = s->dil[d] * (s->k[d] - 1) + 1;
		oh[d] = (x->dims[2 + d] + 2 * s->pad[d] - span) / s->stride[d] + 1;
		if (x->dims[2 + d] + 2 * s->pad[d] < span || oh[d] < 1)
			return h->error(KILN_ECONFIG, "layer '%s' (conv): kernel %lldx%lld (dilation %lld) does not fit the %lldx%lld input with padding %lld",
					l->name, (long long)s->k[0], (long long)s->k[1], (long long)s->dil[d],
					(long long)x->dims[2], (long long)x->dims[3], (long long)s->pad[d]);
	}
	s->x = *x;
	/* y NHWC in an NCHW model (kiln_layer_out_layout): x of one channel
	 * is NHWC's bytes, so the op is a plain NHWC convolution */
	if (kiln_layer_out_layout(l) == KILN_NHWC && x->layout == KILN_NCHW && C == 1 &&
	    l->n_in == 1 && !(s->int8_scale > 0))
		s->x.layout = KILN_NHWC;
	act4(&s->y, x->dims[0], s->out, oh[0], oh[1], s->x.layout);
	s->y.dtype = x->dtype; /* the compute dtype */
	l->out = s->y;
	int64_t wd[4] = { s->out, C / g, s->k[0], s->k[1] };
	kiln_tensor_desc_init(&s->w, KILN_F32, 4, wd);
	int64_t fan_in;
	if (__builtin_mul_overflow(C / g, s->k[0] * s->k[1], &fan_in))
		return h->error(KILN_ECONFIG, "layer '%s' (conv): a weight of %lld x %lld x %lld x %lld overflows",
				l->name, (long long)s->out, (long long)(C / g), (long long)s->k[0],
				(long long)s->k[1]);
	l->n_params = s->bias ? 2 : 1;
	l->params[0] = (struct kiln_param_spec){ "weight", s->w, KILN_INIT_KAIMING_UNIFORM, fan_in, 0 };
	if (s->bias) {
		l->params[1] = (struct kiln_param_spec){ "bias", { 0 }, KILN_INIT_BIAS_UNIFORM, fan_in, 0 };
		f32_desc(&l->params[1].desc, s->out, 0, 0);
	}
	l->needs_input = 1;
	if ((s->res = l->n_in == 2)) {
		const struct kiln_tensor_desc *r = &l->in[1];
		if (r->ndim != 4 || r->dtype != s->y.dtype || r->layout != s->y.layout ||
		    memcmp(r->dims, s->y.dims, sizeof r->dims[0] * 4) || s->int8_scale > 0) {
			char dr[96], dy[96];
			return h->error(KILN_ECONFIG, "layer '%s' (conv): the residual input must be f32 like the output %s (and no int8_scale), got %s",
					l->name, kiln_tensor_desc_str(&s->y, dy, sizeof dy),
					kiln_tensor_desc_str(r, dr, sizeof dr));
		}
	}
	take_act(l, 1); /* any activation: the convolution's epilogue */
	l->needs_output = l->act_fused; /* the fused ReLU's mask */
	kiln_status st = int8_out_dtype(h, l, s->int8_scale, s->int8_out_scale, &s->y.dtype);
	l->out = s->y;
	return st;
}

static void geometry(struct kiln_op *op, const struct conv *s)
{
	op->i[0] = s->stride[0], op->i[1] = s->stride[1];
	op->i[2] = s->pad[0], op->i[3] = s->pad[1];
	op->i[4] = s->dil[0], op->i[5] = s->dil[1];
	op->i[6] = s->groups;
}

/* The weight gradient's ops (bias too) from *op (its operands and flags):
 * written, and added into where the device can (KILN_OPF_ACCUMULATE on
 * CONV_BWD_WEIGHTS, ABI 2.9); else written into scratch (dw_bytes of the
 * workspace) and added.  KILN_ENOTSUP when the written form is refused. */
static kiln_status plan_bwd_w(const struct kiln_host *h, struct kiln_layer *l,
			      struct kiln_device *dev, const struct kiln_op *op, size_t *w)
{
	struct conv *s = l->priv;
	struct kiln_op k = *op;
	kiln_status st;
	if ((st = prep(h, l, dev, &k, &s->bwd_w[0], w)))
		return st;
	k.flags |= KILN_OPF_ACCUMULATE;
	if ((st = prep(h, l, dev, &k, &s->bwd_w[1], w)) != KILN_ENOTSUP)
		return st;
	s->bwd_w[1] = NULL;
	s->dw_bytes = ALIGN64(kiln_tensor_bytes(&s->w)) + (s->bias ? kiln_tensor_bytes(&op->out[1]) : 0);
	if ((st = prep_acc(h, l, dev, &s->w, &s->acc_w)) ||
	    (s->bias && (st = prep_acc(h, l, dev, &op->out[1], &s->acc_b))))
		return st;
	return KILN_OK;
}

/* a u8[n] kept copy, n >= 1 (KILN_OPF_KEEP) */
static struct kiln_tensor_desc kept_desc(size_t n)
{
	struct kiln_tensor_desc d;
	int64_t dims[1] = { n ? (int64_t)n : 1 };
	kiln_tensor_desc_init(&d, KILN_U8, 1, dims);
	return d;
}

/* The forward and weight gradient with kept copies (f32 or bf16 training, a device
 * that has them; a training plan's): *op is the CONV; s->fwd keeps x for
 * s->bwd_w (which keeps dy for the data gradient).  The evaluation's
 * CONV is the evaluation plan's (conv_plan), not prepared here: a plan
 * that never runs it need not size the workspace for it.  Leaves s->fwd
 * NULL when the device keeps nothing (the caller then prepares as
 * without). */
static kiln_status plan_kept(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, struct kiln_op *op, size_t *w)
{
	struct conv *s = l->priv;
	struct kiln_op k = *op;
	const size_t w0 = *w;
	k.flags = (k.flags & ~KILN_OPF_FROZEN) | KILN_OPF_KEEP;
	k.out[k.n_out++] = kept_desc(0);
	kiln_status st = prep_act(h, l, dev, &k, &s->fwd, &s->act, w);
	if (st == KILN_ENOTSUP || (!st && !(s->kept_x = h->device_aux_bytes(dev, s->fwd)))) {
		s->fwd = s->act = NULL; /* freed with the layer's plans */
		return KILN_OK;
	}
	if (st)
		return st;
	struct kiln_tensor_desc b;
	f32_desc(&b, s->out, 0, 0);
	op_init(&k, KILN_OP_CONV_BWD_WEIGHTS, 3, s->bias ? 3 : 2);
	k.flags = KILN_OPF_KEEP;
	k.in[0] = s->x, k.in[1] = s->y, k.in[2] = kept_desc(s->kept_x);
	k.out[0] = s->w, k.out[1] = b, k.out[k.n_out - 1] = kept_desc(0);
	geometry(&k, s);
	if ((st = plan_bwd_w(h, l, dev, &k, w)) == KILN_ENOTSUP) {
		/* the weight gradient reads x as it is (a kept x in a layout
		 * other than its kernel's, plugins/cpu/conv.c): the forward is
		 * prepared again without keeping it, which would write an unread
		 * copy every step (the plans are freed with the layer's) */
		s->bwd_w[0] = s->fwd = s->act = NULL;
		s->kept_x = 0;
		*w = w0;
		h->log(KILN_LOG_DEBUG, "conv", "layer '%s': the weight gradient reads x as it is (its kept copy refused): the forward keeps none",
		       l->name);
		return KILN_OK;
	}
	s->kept_dy = st ? 0 : h->device_aux_bytes(dev, s->bwd_w[0]);
	s->dy_out = !st;
	return st;
}

/* The workspace slot of the weight gradient's kept dy: kept_dy bytes, at
 * least one where the op has the output (dy_out), none without. */
static size_t kept_dy_slot(const struct conv *s)
{
	return s->dy_out ? ALIGN64(s->kept_dy ? s->kept_dy : 1) : 0;
}

/* The residual's forward (evaluation only), *op the plain CONV: one op
 * with the residual and the fused activation in its epilogue, or where the
 * device refuses that (KILN_ENOTSUP) the CONV, then the ADD of r into y and
 * the activation in place. */
static kiln_status plan_residual(const struct kiln_host *h, struct kiln_layer *l,
				 struct kiln_device *dev, struct kiln_op *op, size_t *ws)
{
	struct conv *s = l->priv;
	struct kiln_op k = *op;
	size_t w = 0;
	k.in[k.n_in++] = s->y;
	k.flags = KILN_OPF_RESIDUAL | (op->flags & KILN_OPF_FROZEN);
	if (l->act_fused) {
		k.flags |= KILN_OPF_ACT;
		k.i[KILN_OPI_ACT] = l->fuse_act - 1;
	}
	kiln_status st = prep(h, l, dev, &k, &s->fwd, &w);
	if (st == KILN_ENOTSUP) {
		struct kiln_op a;
		op_init(&a, KILN_OP_ADD, 2, 1);
		a.in[0] = a.in[1] = a.out[0] = s->y;
		if (!(st = prep(h, l, dev, op, &s->fwd, &w)) && !(st = prep(h, l, dev, &a, &s->radd, &w)) &&
		    l->act_fused) {
			op_init(&a, KILN_OP_ACT, 1, 1);
			a.in[0] = a.out[0] = s->y;
			a.i[0] = l->fuse_act - 1;
			st = prep(h, l, dev, &a, &s->act, &w);
		}
	}
	*ws = w;
	return st;
}

/* The data gradient (not when no backward asks for it: the first layer's
 * input, kiln_layer_dx_unused).  dx is always written; where x has a
 * second consumer (kiln_layer_dx_shared) this backward's share may be
 * added from scratch (oneDNN's backward-data cannot accumulate): the
 * scratch and the ADD are prepared only then.  With kept copies it reads the weight gradient's kept dy
 * (s->data_kept), else, or where the device refuses that, dy as it is:
 * one of the two prepared, so the workspace is sized for the one run. */
static kiln_status plan_bwd_data(const struct kiln_host *h, struct kiln_layer *l,
				 struct kiln_device *dev, struct kiln_tensor_desc wc, size_t *ws)
{
	struct conv *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = *ws;
	op_init(&op, KILN_OP_CONV_BWD_DATA, 2, 1);
	op.in[0] = s->y, op.in[1] = wc, op.out[0] = s->x;
	geometry(&op, s);
	if (s->kept_dy) {
		struct kiln_op k = op;
		k.flags = KILN_OPF_KEEP;
		k.n_in = 3, k.in[2] = kept_desc(s->kept_dy);
		st = prep(h, l, dev, &k, &s->bwd_data, &w);
		if (st == KILN_ENOTSUP) /* refused (a bf16 one whose kernel dtype is not the
					 * weight gradient's): dy read as it is */
			s->bwd_data = NULL, st = KILN_OK;
		if (st)
			return st;
		s->data_kept = s->bwd_data != NULL;
	}
	const int shared = kiln_layer_dx_shared(l) & 1;
	if ((!s->bwd_data && (st = prep(h, l, dev, &op, &s->bwd_data, &w))) ||
	    (shared && (st = prep_acc(h, l, dev, &s->x, &s->acc))))
		return st;
	s->dx_bytes = shared ? kiln_tensor_bytes(&s->x) : 0;
	*ws = w;
	return KILN_OK;
}

static kiln_status conv_plan(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, size_t *ws)
{
	struct conv *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	struct kiln_tensor_desc b;
	f32_desc(&b, s->out, 0, 0);

	/* weights in the compute dtype; bias, weight and bias gradients f32 */
	const struct kiln_tensor_desc wc = with_dtype(s->w, s->x.dtype);
	op_init(&op, KILN_OP_CONV, s->bias ? 3 : 2, 1);
	op.in[0] = s->x, op.in[1] = wc, op.in[2] = b, op.out[0] = s->y;
	geometry(&op, s);
	if (l->frozen) /* an inference plan: the weights stay (ABI 2.15); on
			* QCONV too, the device keeps its INT8 weights */
		op.flags |= KILN_OPF_FROZEN;
	/* refused in a training plan, which the run makes before it touches
	 * out_dir (the forward refused them after --overwrite had deleted the
	 * earlier run, session 34) */
	if ((s->res || s->int8_scale > 0) && kiln_layer_training(l))
		return h->error(KILN_ECONFIG, "layer '%s': %s is for evaluation only", l->name,
				s->res ? "a residual input" : "int8_scale");
	if (s->res) /* evaluation only: no backward */
		return plan_residual(h, l, dev, &op, ws);
	if (s->int8_scale > 0) { /* the same operands, quantized by the op; evaluation only */
		quantized(&op, KILN_OP_QCONV, s->int8_scale, s->int8_unsigned, s->int8_out_scale);
		if ((st = int8_out_planned(h, l, s->int8_out_scale)))
			return st;
		st = prep_act(h, l, dev, &op, &s->fwd, &s->act, &w);
		*ws = w;
		return st;
	}
	if (!kiln_layer_training(l)) { /* an evaluation plan: the forward alone,
					* nothing kept, no backward */
		st = prep_act(h, l, dev, &op, &s->fwd, &s->act, &w);
		*ws = w;
		return st;
	}
	if (l->trainable && (s->x.dtype == KILN_F32 || s->x.dtype == KILN_BF16) &&
	    (st = plan_kept(h, l, dev, &op, &w)))
		return st;
	if (!s->fwd && (st = prep_act(h, l, dev, &op, &s->fwd, &s->act, &w)))
		return st;
	/* the fused ReLU's mask, unless the maxpool after it applies it
	 * (kiln_layer_relu_fold; s->mask then NULL) */
	if (kiln_layer_relu_fold(l) != 1 && (st = prep_act_bwd(h, l, dev, &s->y, &s->mask, &s->front, &w)))
		return st;
	l->saved_bytes = s->kept_x;
	if (!(kiln_layer_dx_unused(l) & 1) && (st = plan_bwd_data(h, l, dev, wc, &w)))
		return st;
	if (l->trainable && !s->bwd_w[0]) {
		op_init(&op, KILN_OP_CONV_BWD_WEIGHTS, 2, s->bias ? 2 : 1);
		op.in[0] = s->x, op.in[1] = s->y, op.out[0] = s->w, op.out[1] = b;
		geometry(&op, s);
		if ((st = plan_bwd_w(h, l, dev, &op, &w)))
			return st;
	}
	/* [masked dy (fused ReLU; backward) | dx scratch, or dw and db
	 * scratch | kept dy | the ops' own] */
	*ws = s->front + ALIGN64(s->dx_bytes > s->dw_bytes ? s->dx_bytes : s->dw_bytes) +
	      kept_dy_slot(s) + w;
	return KILN_OK;
}

/* The weight (and bias) gradient, written or added (dw_accum); with kept
 * copies it reads the forward's x (r->saved) and writes dy's blocked copy
 * to kept_dy.  The ops' own workspace starts at own. */
static kiln_status conv_bwd_w(const struct kiln_host *h, const struct conv *s,
			      const struct kiln_layer_run *r, void *kept_dy, size_t own)
{
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->saved },
				  .out = { r->dw[0], s->bias ? r->dw[1] : NULL } };
	a.out[s->bias ? 2 : 1] = kept_dy;
	a.workspace = (char *)r->workspace + own;
	a.workspace_bytes = r->workspace_bytes - own;
	const int beside = r->dw_accum && !s->bwd_w[1];
	if (!beside)
		return h->device_run(r->dev, s->bwd_w[r->dw_accum ? 1 : 0], &a, r->stream);
	char *scr = r->workspace;
	a.out[0] = scr;
	a.out[1] = s->bias ? scr + ALIGN64(kiln_tensor_bytes(&s->w)) : NULL;
	kiln_status st = h->device_run(r->dev, s->bwd_w[0], &a, r->stream);
	for (int k = 0; k < (s->bias ? 2 : 1) && !st; k++) {
		struct kiln_op_args b = { .in = { a.out[k] }, .out = { r->dw[k] } };
		st = h->device_run(r->dev, k ? s->acc_b : s->acc_w, &b, r->stream);
	}
	return st;
}

static kiln_status conv_forward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct conv *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], w_compute(r, 0), s->bias ? r->w[1] : NULL },
				  .out = { r->y } };
	if (r->training && s->int8_scale > 0)
		return h->error(KILN_ECONFIG, "layer '%s': int8_scale is for evaluation only", l->name);
	if (r->training && s->res)
		return h->error(KILN_ECONFIG, "layer '%s': a residual input is for evaluation only", l->name);
	a.workspace = r->workspace;
	a.workspace_bytes = r->workspace_bytes;
	if (s->res && !s->radd) /* the residual in the op's epilogue: last input */
		a.in[s->bias ? 3 : 2] = r->x[1];
	if (s->radd) { /* y = conv(x), y += r, then the activation */
		kiln_status st = h->device_run(r->dev, s->fwd, &a, r->stream);
		struct kiln_op_args b = { .in = { r->y, r->x[1] }, .out = { r->y },
					  .workspace = a.workspace, .workspace_bytes = a.workspace_bytes };
		if (!st)
			st = h->device_run(r->dev, s->radd, &b, r->stream);
		b = (struct kiln_op_args){ .in = { r->y }, .out = { r->y }, .workspace = a.workspace,
					   .workspace_bytes = a.workspace_bytes };
		return st || !s->act ? st : h->device_run(r->dev, s->act, &b, r->stream);
	}
	a.out[1] = r->saved; /* the kept x, with kept copies */
	return run_then_act(h, r, s->fwd, s->act, &a);
}

static kiln_status conv_backward(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_layer_run *r0)
{
	struct conv *s = l->priv;
	struct kiln_layer_run rr;
	const struct kiln_layer_run *r = &rr;
	if (s->int8_scale > 0 || s->res) /* no backward was prepared */
		return h->error(KILN_ECONFIG, "layer '%s': %s is for evaluation only", l->name,
				s->res ? "a residual input" : "int8_scale");
	kiln_status st = run_act_bwd(h, r0, s->mask, s->front, &rr);
	if (st)
		return st;
	/* rr's workspace: [dx scratch, or dw and db scratch | kept dy | the
	 * ops' own] */
	const size_t kept_off = ALIGN64(s->dx_bytes > s->dw_bytes ? s->dx_bytes : s->dw_bytes);
	const size_t own = kept_off + kept_dy_slot(s);
	void *kept_dy = s->dy_out ? (char *)r->workspace + kept_off : NULL;
	/* written on the first micro-step (no zeroing pass), then added */
	if (r->dw[0] && (st = conv_bwd_w(h, s, r, kept_dy, own)))
		return st;
	if (r->dx[0] && !s->bwd_data)
		return h->error(KILN_EINTERNAL, "layer '%s': a data gradient asked of a plan without one",
				l->name);
	if (r->dx[0]) {
		/* the kept dy is the weight gradient's, run just before: a
		 * trainable conv's weight always has a gradient (core/tie.c
		 * kiln_model_grad_dst) */
		if (s->data_kept && !r->dw[0])
			return h->error(KILN_EINTERNAL, "layer '%s': a data gradient reading the kept dy without the weight gradient that keeps it",
					l->name);
		struct kiln_op_args a = { .in = { r->dy, w_compute(r, 0), kept_dy } };
		return run_maybe_acc(h, r, s->bwd_data, &a, r->dx[0], r->dx_accum[0], s->acc, own);
	}
	return KILN_OK;
}

LAYER(conv, "conv", "2-d convolution (PyTorch nn.Conv2d; weights OIHW)", conv_keys, 1, 2,
      conv_configure, conv_infer, conv_plan, conv_forward, conv_backward, layer_destroy);
