/* core/layers/linear.c - fully connected layer, y = x W^T + b.
 *
 * x: [B, K] (a 4-d [B, C, H, W] input is read as [B, K], K = C*H*W),
 * W: [out, K] (PyTorch's nn.Linear layout, so weights move between the two
 * unchanged), b: [out], y: [B, out].  Any other input of 3 or more dims
 * (tokens [B, T, K]) is transformed over its last dimension, as nn.Linear
 * does: rows = B*T, y [B, T, out].  A channels-last 4-d input is read
 * in PyTorch's C, H, W order: it is reordered into the workspace first, so
 * both layouts give the same numbers.
 *
 * Low-precision compute (kiln_layer.compute_dtype bf16 or f16) on an f32
 * input (an embedding's rows, a layer norm of the residual stream: autocast
 * keeps those f32): x is converted into the workspace (KILN_OP_CAST, again
 * in the backward for dW) and the products run in the compute dtype, as
 * torch.autocast's linear does: y in the compute dtype, dx f32 (the GEMM
 * writes f32 from compute-dtype operands, without the rounding autocast's
 * cast adds to dx).
 */
#include "util.h"

struct linear {
	struct layer_plans plans;
	int64_t out;
	int bias;
	int64_t B, K;     /* rows of K features (B*T for tokens) */
	void *fwd;        /* y = x W^T (+ b), or act(that) with a fused activation */
	void *act;        /* the fused activation when the device ran it apart */
	void *mask;       /* the fused ReLU's backward, before the others */
	void *mask_db;    /* ... summing db in the same pass (NULL: db runs apart) */
	size_t front;     /* its bytes at the front of the workspace */
	void *dx[2];      /* dx = dy W, [0] write, [1] accumulate */
	void *dw[2];      /* dW = dy^T x, [0] write, [1] accumulate (dw_accum) */
	void *db[2];      /* db = sum_rows dy, the same */
	int reorder;      /* channels-last input: x is read through a copy */
	void *to_nchw, *from_nchw[2];
	size_t x_bytes;
	int cast;         /* f32 x, low-precision compute: x converted for the GEMMs */
	void *to_c;       /* KILN_OP_CAST of x's rows into the compute dtype */
	size_t xc_off;    /* where that copy starts in the workspace */
	size_t ws_off;    /* the buffers before the ops' own workspace: x in
			   * C, H, W order, dx where the plan has one, x in
			   * the compute dtype */
	double int8_scale, int8_out_scale; /* [layer.X] int8_scale: > 0 runs the INT8 op */
	int int8_unsigned;
};

static const struct kiln_key linear_keys[] = {
	{ "out", KILN_KEY_INT, NULL, 1, 1e9, NULL,
	  "Output features (required). Inputs: [B, K] gives [B, out]; [B, C, H, W] is flattened per sample (K = C*H*W, in C, H, W order) to [B, out]; [B, T, K] (3-d, or 5-d and more) is transformed over its last dimension to [B, T, out], as nn.Linear does." },
	{ "bias", KILN_KEY_BOOL, "1", 0, 0, NULL, "Learn an additive bias." },
	LAYER_INT8_KEYS,
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status linear_configure(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_config *cfg, const char *section)
{
	struct linear *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	if (h->config_get_int(cfg, section, "out", &s->out))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'out' (number of output features)",
				h->config_where(cfg, section, NULL), section);
	s->bias = 1;
	h->config_get_bool(cfg, section, "bias", &s->bias);
	h->config_get_float(cfg, section, "int8_scale", &s->int8_scale);
	h->config_get_bool(cfg, section, "int8_unsigned", &s->int8_unsigned);
	h->config_get_float(cfg, section, "int8_out_scale", &s->int8_out_scale);
	return KILN_OK;
}

static kiln_status linear_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct linear *s = l->priv;
	s->reorder = is_nhwc(&l->in[0]) && l->in[0].dims[1] > 1 &&
		     l->in[0].dims[2] * l->in[0].dims[3] > 1;
	s->x_bytes = ALIGN64(kiln_tensor_bytes(&l->in[0]));
	const struct kiln_tensor_desc *x = &l->in[0];
	s->cast = x->dtype == KILN_F32 && !(s->int8_scale > 0) &&
		  (l->compute_dtype == KILN_BF16 || l->compute_dtype == KILN_F16);
	if (x->ndim == 3 || x->ndim > 4) { /* over the last dimension */
		s->K = x->dims[x->ndim - 1];
		s->B = kiln_tensor_numel(x) / s->K;
		l->out = *x;
		l->out.dims[x->ndim - 1] = s->out;
		l->out.layout = KILN_ROW;
	} else {
		s->B = x->dims[0];
		s->K = per_sample(x);
		f32_desc(&l->out, s->B, s->out, 0);
	}
	l->n_params = s->bias ? 2 : 1;
	l->params[0] = (struct kiln_param_spec){ "weight", { 0 }, KILN_INIT_KAIMING_UNIFORM, s->K, 0 };
	f32_desc(&l->params[0].desc, s->out, s->K, 0);
	if (s->bias) {
		l->params[1] = (struct kiln_param_spec){ "bias", { 0 }, KILN_INIT_BIAS_UNIFORM, s->K, 0 };
		f32_desc(&l->params[1].desc, s->out, 0, 0);
	}
	l->needs_input = 1;
	take_act(l, 1); /* any activation: the GEMM's epilogue */
	l->needs_output = l->act_fused; /* the fused ReLU's mask */
	kiln_status st = int8_out_dtype(h, l, s->int8_scale, s->int8_out_scale, &l->out.dtype);
	if (s->cast) /* the products' dtype: the compute dtype */
		l->out.dtype = l->compute_dtype;
	return st;
}

/* out[M,N] = op(a) . op(b), op transposing a when ta and b when tb (a is
 * [M,K] or [K,M], b [K,N] or [N,K]); the operands in dtype dt, out in
 * out_dt. */
static void gemm_op(struct kiln_op *op, int n_in, int ta, int tb, int64_t M, int64_t N, int64_t K,
		    int dt, int out_dt)
{
	op_init(op, KILN_OP_GEMM, n_in, 1);
	f32_desc(&op->in[0], ta ? K : M, ta ? M : K, 0);
	f32_desc(&op->in[1], tb ? N : K, tb ? K : N, 0);
	f32_desc(&op->out[0], M, N, 0);
	op->in[0].dtype = op->in[1].dtype = dt;
	op->out[0].dtype = out_dt;
	op->i[0] = ta, op->i[1] = tb, op->i[2] = M, op->i[3] = N, op->i[4] = K, op->f[0] = 1.0;
}

static kiln_status linear_plan(const struct kiln_host *h, struct kiln_layer *l,
			       struct kiln_device *dev, size_t *ws)
{
	struct linear *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	int64_t B = s->B, K = s->K, N = s->out;
	/* the products' operands: the activations' dtype, or the compute
	 * dtype x is converted to; dx has x's dtype */
	const int dt = s->cast ? l->compute_dtype : l->in[0].dtype, dxt = l->in[0].dtype;

	/* y[B,N] = x[B,K] . W[N,K]^T (+ b[N]); the bias stays f32 */
	gemm_op(&op, s->bias ? 3 : 2, 0, 1, B, N, K, dt, dt);
	f32_desc(&op.in[2], N, 0, 0);
	if (s->int8_scale > 0 && kiln_layer_training(l)) /* (before out_dir is touched) */
		return h->error(KILN_ECONFIG, "layer '%s': int8_scale is for evaluation only", l->name);
	if (s->int8_scale > 0) { /* the same operands, quantized by the op; evaluation only */
		quantized(&op, KILN_OP_QLINEAR, s->int8_scale, s->int8_unsigned, s->int8_out_scale);
		if (l->frozen) /* an inference plan: the device keeps its INT8 weights (ABI 2.15) */
			op.flags |= KILN_OPF_FROZEN;
		if ((st = int8_out_planned(h, l, s->int8_out_scale)) ||
		    (st = prep_act(h, l, dev, &op, &s->fwd, &s->act, ws)) ||
		    (s->reorder && (st = prep_nchw_reorders(h, l, dev, &l->in[0], &s->to_nchw,
							    NULL, ws))))
			return st;
		s->ws_off = s->reorder ? s->x_bytes : 0;
		*ws += s->ws_off;
		return KILN_OK;
	}
	/* an evaluation plan (kiln_layer_training 0) prepares the forward
	 * alone: no ReLU mask, no gradients, no dx buffer */
	const int train = kiln_layer_training(l);
	/* an inference plan's f32 weights stay: the device may keep them in
	 * its kernel's layout (KILN_OPF_FROZEN on a GEMM, session 46) */
	if (l->frozen && dt == KILN_F32 && !s->cast)
		op.flags |= KILN_OPF_FROZEN;
	if ((st = prep_act(h, l, dev, &op, &s->fwd, &s->act, ws)) ||
	    (train && (st = prep_act_bwd_db(h, l, dev, &l->out, l->trainable && s->bias ? N : 0,
					    &s->mask, &s->mask_db, &s->front, ws))))
		return st;
	/* dx[B,K] (+)= dy[B,N] . W[N,K], unless no backward asks for it (the
	 * first layer's input: kiln_layer_dx_unused) */
	const int dx = train && !(kiln_layer_dx_unused(l) & 1);
	gemm_op(&op, 2, 0, 0, B, K, N, dt, dxt);
	if (dx && (st = prep_pair(h, l, dev, &op, s->dx, ws)))
		return st;
	if (s->reorder && (st = prep_nchw_reorders(h, l, dev, &l->in[0], &s->to_nchw,
						   dx ? s->from_nchw : NULL, ws)))
		return st;
	s->xc_off = s->reorder ? (dx ? 2 : 1) * s->x_bytes : 0;
	s->ws_off = s->xc_off;
	if (s->cast) { /* x [B*K] f32 -> the compute dtype, after the reorder */
		const int64_t n = B * K;
		op_init(&op, KILN_OP_CAST, 1, 1);
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
		kiln_tensor_desc_init(&op.out[0], dt, 1, &n);
		if ((st = prep(h, l, dev, &op, &s->to_c, ws)))
			return st;
		s->ws_off += ALIGN64(kiln_tensor_bytes(&op.out[0]));
	}
	if (!train) {
		*ws += s->ws_off;
		return KILN_OK;
	}
	if (l->trainable) {
		/* dW[N,K] = dy[B,N]^T . x[B,K], f32 from compute-dtype operands */
		gemm_op(&op, 2, 1, 0, N, K, B, dt, KILN_F32);
		if ((st = prep_pair(h, l, dev, &op, s->dw, ws)))
			return st;
	}
	if (l->trainable && s->bias) {
		/* db[N] = sum over rows of dy[B,N]; with the ReLU pass's fold
		 * (mask_db) still for the micro-steps that add (dw_accum) */
		op_init(&op, KILN_OP_BIAS_GRAD, 1, 1);
		f32_desc(&op.in[0], B, N, 0);
		op.in[0].dtype = dt;
		f32_desc(&op.out[0], N, 0, 0);
		if ((st = prep_pair(h, l, dev, &op, s->db, ws)))
			return st;
	}
	/* workspace: [masked dy (fused ReLU) | x in C,H,W order | dx in C,H,W
	 * order | the ops' own]; the first part only in the backward */
	*ws += s->ws_off + s->front;
	return KILN_OK;
}

/* The ops' own workspace follows the reorder buffers. */
static void ops_ws(struct kiln_op_args *a, const struct linear *s, const struct kiln_layer_run *r)
{
	const size_t off = s->ws_off;
	a->workspace = (char *)r->workspace + off;
	a->workspace_bytes = r->workspace_bytes - off;
}

/* x as [B, K] rows in C, H, W order in the products' dtype: the input
 * itself, or its reordered copy at the start of the workspace, or its
 * conversion to the compute dtype (s->cast) at xc_off. */
static kiln_status input_rows(const struct kiln_host *h, struct kiln_layer *l,
			      const struct kiln_layer_run *r, const void **x)
{
	struct linear *s = l->priv;
	kiln_status st;
	*x = r->x[0];
	if (s->reorder) {
		struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->workspace } };
		ops_ws(&a, s, r);
		*x = r->workspace;
		if ((st = h->device_run(r->dev, s->to_nchw, &a, r->stream)))
			return st;
	}
	if (!s->cast)
		return KILN_OK;
	void *xc = (char *)r->workspace + s->xc_off;
	struct kiln_op_args a = { .in = { *x }, .out = { xc } };
	ops_ws(&a, s, r);
	*x = xc;
	return h->device_run(r->dev, s->to_c, &a, r->stream);
}

static kiln_status linear_forward(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_layer_run *r)
{
	struct linear *s = l->priv;
	const void *x;
	kiln_status st;
	struct kiln_op_args a;
	if (r->training && s->int8_scale > 0)
		return h->error(KILN_ECONFIG, "layer '%s': int8_scale is for evaluation only", l->name);
	if ((st = input_rows(h, l, r, &x)))
		return st;
	a = (struct kiln_op_args){ .in = { x, w_compute(r, 0), s->bias ? r->w[1] : NULL },
				   .out = { r->y } };
	ops_ws(&a, s, r);
	return run_then_act(h, r, s->fwd, s->act, &a);
}

static kiln_status linear_backward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r0)
{
	struct linear *s = l->priv;
	struct kiln_op_args a;
	struct kiln_layer_run rr;
	const struct kiln_layer_run *r = &rr;
	if (s->int8_scale > 0) /* no backward was prepared */
		return h->error(KILN_ECONFIG, "layer '%s': int8_scale is for evaluation only", l->name);
	/* with the weights' gradients, the ReLU's pass sums db where it can;
	 * it writes db, so not on a micro-step that adds (dw_accum) */
	const int db_folded = s->mask_db && r0->dw[0] && s->bias && !r0->dw_accum;
	kiln_status st = db_folded ? run_act_bwd_db(h, r0, s->mask_db, s->front, r0->dw[1], &rr)
				   : run_act_bwd(h, r0, s->mask, s->front, &rr);
	const void *x;
	if (st)
		return st;
	if (r->dw[0]) {
		if ((st = input_rows(h, l, r, &x)))
			return st;
		/* dW is written on the first micro-step (beta = 0): no memset;
		 * the later ones add (beta = 1) */
		const int acc = r->dw_accum != 0;
		a = (struct kiln_op_args){ .in = { r->dy, x }, .out = { r->dw[0] } };
		ops_ws(&a, s, r);
		if ((st = h->device_run(r->dev, s->dw[acc], &a, r->stream)))
			return st;
		if (s->bias && !db_folded) {
			a = (struct kiln_op_args){ .in = { r->dy }, .out = { r->dw[1] } };
			ops_ws(&a, s, r);
			if ((st = h->device_run(r->dev, s->db[acc], &a, r->stream)))
				return st;
		}
	}
	if (r->dx[0] && !s->dx[0])
		return h->error(KILN_EINTERNAL, "layer '%s': a data gradient asked of a plan without one",
				l->name);
	if (r->dx[0]) {
		/* channels-last: dx in C, H, W order into the workspace, then
		 * reordered (written or added) into the input's layout */
		void *dxr = s->reorder ? (char *)r->workspace + s->x_bytes : r->dx[0];
		int acc = r->dx_accum[0] && !s->reorder;
		a = (struct kiln_op_args){ .in = { r->dy, w_compute(r, 0) }, .out = { dxr } };
		ops_ws(&a, s, r);
		if ((st = h->device_run(r->dev, s->dx[acc], &a, r->stream)))
			return st;
		if (s->reorder) {
			a = (struct kiln_op_args){ .in = { dxr }, .out = { r->dx[0] } };
			ops_ws(&a, s, r);
			return h->device_run(r->dev, s->from_nchw[r->dx_accum[0] ? 1 : 0], &a, r->stream);
		}
	}
	return KILN_OK;
}

LAYER(linear, "linear", "fully connected: y = x W^T + b (nn.Linear; over the last dimension of [B, T, K])",
      linear_keys, 1, 1, linear_configure,
      linear_infer, linear_plan, linear_forward, linear_backward, layer_destroy);
