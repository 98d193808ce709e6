/* core/layers/pos_embedding.c - learned positional embedding (GPT-2's wpe):
 * y[b, t, :] = x[b, t, :] + weight[t, :].
 *
 * x, y: [B, T, C]; weight [max_len, C], initialised N(0, 0.02^2).  The
 * first T rows of the weight are T*C contiguous values, so the add is
 * KILN_OP_BIAS_ADD of a [T*C] bias over B rows of [T*C], and its gradient
 * KILN_OP_BIAS_GRAD; rows T.. of the weight gradient are zeroed.  In a
 * decode plan (kiln_layer.decode_len > 0) the rows added are those of the
 * device positions kiln_layer_run.pos[0..T) (T = 1 a step, more a
 * prompt's prefill, ABI 2.31): KILN_OP_EMBEDDING of them into the
 * workspace, then the same BIAS_ADD.
 */
#include "util.h"

struct pos_embedding {
	struct layer_plans plans;
	int64_t max_len, B, T, C;
	void *copy, *add, *dx[2], *dw[2], *zero_tail; /* dw: [dw_accum] */
	void *row; /* decode plans: weight[pos[0..T)] (EMBEDDING of the positions) */
};

static const struct kiln_key pos_embedding_keys[] = {
	{ "max_len", KILN_KEY_INT, NULL, 1, 1e9, NULL,
	  "Positions the weight holds (GPT-2's n_positions; required): an input of more tokens is an error." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status pos_configure(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_config *cfg, const char *section)
{
	struct pos_embedding *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	if (h->config_get_int(cfg, section, "max_len", &s->max_len))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'max_len' (positions)",
				h->config_where(cfg, section, NULL), section);
	return KILN_OK;
}

static kiln_status pos_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct pos_embedding *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	if (x->ndim != 3) {
		char d[96];
		return h->error(KILN_ECONFIG, "layer '%s' (pos_embedding) needs [batch, tokens, channels], got %s",
				l->name, kiln_tensor_desc_str(x, d, sizeof d));
	}
	s->B = x->dims[0], s->T = x->dims[1], s->C = x->dims[2];
	if (s->T > s->max_len || l->decode_len > s->max_len)
		return h->error(KILN_ECONFIG, "layer '%s' (pos_embedding): %lld tokens, more than max_len = %lld",
				l->name, (long long)(l->decode_len ? l->decode_len : s->T),
				(long long)s->max_len);
	l->out = *x;
	l->n_params = 1;
	l->params[0] = (struct kiln_param_spec){ "weight", { 0 }, KILN_INIT_NORMAL, 0, 0 };
	f32_desc(&l->params[0].desc, s->max_len, s->C, 0);
	l->inplace_ok = 1;
	l->dx_is_dy = 1; /* dx = dy: the planner may share its storage */
	return KILN_OK;
}

static kiln_status pos_plan(const struct kiln_host *h, struct kiln_layer *l,
			    struct kiln_device *dev, size_t *ws)
{
	struct pos_embedding *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	struct kiln_tensor_desc rows; /* x as B rows of T*C, the compute dtype */
	f32_desc(&rows, s->B, s->T * s->C, 0);
	rows.dtype = l->out.dtype;
	/* y = x (when not in place), y += weight[0:T] */
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.in[0] = op.out[0] = rows;
	op.f[0] = 1.0;
	if ((st = prep(h, l, dev, &op, &s->copy, ws)) ||
	    (kiln_layer_training(l) && (st = prep_pair(h, l, dev, &op, s->dx, ws))))
		return st;
	op_init(&op, KILN_OP_BIAS_ADD, 1, 1);
	f32_desc(&op.in[0], s->T * s->C, 0, 0);
	op.out[0] = rows;
	if ((st = prep(h, l, dev, &op, &s->add, ws)))
		return st;
	if (l->decode_len) { /* the rows of positions pos[0..T), into the workspace's head */
		size_t w = 0;
		op_init(&op, KILN_OP_EMBEDDING, 2, 1);
		kiln_tensor_desc_init(&op.in[0], KILN_I32, 1, (int64_t[]){ s->T });
		f32_desc(&op.in[1], s->max_len, s->C, 0);
		f32_desc(&op.out[0], s->T, s->C, 0);
		st = prep(h, l, dev, &op, &s->row, &w);
		l->decode_runs = 1; /* a row a position, no state */
		*ws = (*ws > w ? *ws : w) + ALIGN64(sizeof(float) * (size_t)(s->T * s->C));
		return st;
	}
	if (!l->trainable || !kiln_layer_training(l))
		return KILN_OK;
	op_init(&op, KILN_OP_BIAS_GRAD, 1, 1);
	op.in[0] = rows;
	f32_desc(&op.out[0], s->T * s->C, 0, 0);
	if ((st = prep_pair(h, l, dev, &op, s->dw, ws)))
		return st;
	if (s->T == s->max_len)
		return KILN_OK;
	op_init(&op, KILN_OP_FILL, 0, 1);
	f32_desc(&op.out[0], (s->max_len - s->T) * s->C, 0, 0);
	return prep(h, l, dev, &op, &s->zero_tail, ws);
}

static kiln_status pos_forward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r)
{
	struct pos_embedding *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { r->y } };
	kiln_status st;
	if (r->y != r->x[0] && (st = run_op(h, r, s->copy, &a)))
		return st;
	if (s->row) { /* decoding: y[:, t] += weight[pos[t]] */
		const size_t off = ALIGN64(sizeof(float) * (size_t)(s->T * s->C));
		struct kiln_layer_run rr = *r;
		rr.workspace = (char *)r->workspace + off;
		rr.workspace_bytes = r->workspace_bytes - off;
		a = (struct kiln_op_args){ .in = { r->pos, r->w[0] }, .out = { r->workspace } };
		if ((st = run_op(h, &rr, s->row, &a)))
			return st;
		a = (struct kiln_op_args){ .in = { r->workspace }, .out = { r->y } };
		return run_op(h, &rr, s->add, &a);
	}
	a = (struct kiln_op_args){ .in = { r->w[0] }, .out = { r->y } };
	return run_op(h, r, s->add, &a);
}

static kiln_status pos_backward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	struct pos_embedding *s = l->priv;
	struct kiln_op_args a = { .in = { r->dy } };
	kiln_status st = KILN_OK;
	if ((!dx_shares_dy(r, 0) && (st = run_dx(h, r, s->dx, 0, &a))) || !r->dw[0])
		return st;
	/* the rows past T: zeroed when written, left (zero) when added into */
	a = (struct kiln_op_args){ .in = { r->dy }, .out = { r->dw[0] } };
	if ((st = run_op(h, r, s->dw[r->dw_accum ? 1 : 0], &a)) || !s->zero_tail || r->dw_accum)
		return st;
	a = (struct kiln_op_args){ .out = { (float *)r->dw[0] + s->T * s->C } };
	return run_op(h, r, s->zero_tail, &a);
}

LAYER(pos_embedding, "pos_embedding",
      "learned positional embedding: y[b, t] = x[b, t] + weight[t] (GPT-2's wpe); weight initialised N(0, 0.02^2)",
      pos_embedding_keys, 1, 1, pos_configure, pos_infer, pos_plan, pos_forward, pos_backward,
      layer_destroy);
