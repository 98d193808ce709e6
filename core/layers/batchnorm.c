/* core/layers/batchnorm.c - batch normalisation (PyTorch's BatchNorm1d/2d).
 *
 * x, y: [N, C] or [N, C, H, W]; weight (gamma) [C], bias (beta) [C];
 * buffers running_mean [C], running_var [C] (unbiased), updated in training
 * as running = (1 - momentum) * running + momentum * batch statistic.
 * Training normalises with the batch statistics, evaluation with the
 * running ones.  The forward keeps (mean, 1/std) per channel for backward.
 */
#include "bn_sync.h"

struct bn {
	struct layer_plans plans;
	double eps, momentum;
	int64_t C;
	struct kiln_tensor_desc x, c;
	void *train, *replay, *infer, *bwd, *acc;
	void *acc_c; /* a [C] gradient added into its parameter's (dw_accum) */
	/* a fused ReLU: the forwards' ACTs where the device ran it apart; its
	 * backward before bwd where bwd does not fold it (front bytes) */
	void *act[3], *mask;
	int fold;         /* bwd takes y and folds the ReLU's backward */
	size_t dx_bytes, stat_bytes, front;
	struct bn_sync *sync; /* [dist] sync_bn (bn_sync.c), NULL otherwise */
};

static const struct kiln_key bn_keys[] = {
	{ "eps", KILN_KEY_FLOAT, "1e-5", 0, 1, NULL, "Added to the variance before the square root." },
	{ "momentum", KILN_KEY_FLOAT, "0.1", 0, 1, NULL,
	  "Weight of the batch statistics in the running averages (PyTorch's convention)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status bn_configure(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_config *cfg, const char *sec)
{
	struct bn *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->eps = 1e-5;
	s->momentum = 0.1;
	h->config_get_float(cfg, sec, "eps", &s->eps);
	h->config_get_float(cfg, sec, "momentum", &s->momentum);
	return KILN_OK;
}

static kiln_status bn_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct bn *s = l->priv;
	if (l->in[0].ndim != 2 && l->in[0].ndim != 4)
		return h->error(KILN_ECONFIG, "layer '%s' (batchnorm) needs [N, C] or [N, C, H, W], got %d dims",
				l->name, l->in[0].ndim);
	s->x = l->out = l->in[0];
	s->C = l->in[0].dims[1];
	f32_desc(&s->c, s->C, 0, 0);
	static const char *const names[] = { "weight", "bias", "running_mean", "running_var" };
	static const int init[] = { KILN_INIT_ONE, KILN_INIT_ZERO, KILN_INIT_ZERO, KILN_INIT_ONE };
	l->n_params = 4;
	for (int k = 0; k < 4; k++)
		l->params[k] = (struct kiln_param_spec){ names[k], s->c, init[k], 0,
							 k == 3 ? 1 | KILN_PARAM_NONNEG : k >= 2 };
	l->needs_input = 1;
	s->stat_bytes = 2 * (size_t)s->C * sizeof(float);
	/* ReLU in the normalisation's pass; not across ranks (bn_sync.c) */
	take_act(l, l->fuse_act == 1 + KILN_ACT_RELU && l->sync_ranks <= 1);
	l->needs_output = l->act_fused; /* the ReLU's mask */
	return KILN_OK;
}

/* BN_BWD, folding the fused ReLU's backward (in4 = y) where the device
 * can, else after a RELU_BWD of its own (prep_act_bwd). */
static kiln_status bn_plan_bwd(const struct kiln_host *h, struct kiln_layer *l,
			       struct kiln_device *dev, struct kiln_op *op, size_t *w)
{
	struct bn *s = l->priv;
	kiln_status st;
	if (l->act_fused) {
		op->flags = KILN_OPF_ACT;
		op->n_in = 5;
		op->in[4] = s->x;
		if ((st = prep(h, l, dev, op, &s->bwd, w)) != KILN_ENOTSUP) {
			s->fold = !st;
			return st;
		}
		op->flags = 0;
		op->n_in = 4;
		if ((st = prep_act_bwd(h, l, dev, &s->x, &s->mask, &s->front, w)))
			return st;
	}
	return prep(h, l, dev, op, &s->bwd, w);
}

static kiln_status bn_plan(const struct kiln_host *h, struct kiln_layer *l,
			   struct kiln_device *dev, size_t *ws)
{
	struct bn *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	struct kiln_tensor_desc saved;
	f32_desc(&saved, 2, s->C, 0);

	if (!kiln_layer_training(l)) { /* an evaluation plan: the forward with
					* the running statistics alone */
		op_init(&op, KILN_OP_BN_INFER, 5, 1);
		op.in[0] = s->x, op.in[1] = op.in[2] = op.in[3] = op.in[4] = s->c;
		op.out[0] = s->x;
		op.f[0] = s->eps, op.f[1] = s->momentum;
		st = prep_act(h, l, dev, &op, &s->infer, &s->act[2], &w);
		*ws = w;
		return st;
	}
	op_init(&op, KILN_OP_BN_TRAIN, 3, 4);
	op.in[0] = s->x, op.in[1] = op.in[2] = s->c;
	op.out[0] = s->x, op.out[1] = saved, op.out[2] = op.out[3] = s->c;
	op.f[0] = s->eps, op.f[1] = s->momentum;
	if ((st = prep_act(h, l, dev, &op, &s->train, &s->act[0], &w)))
		return st;
	/* the replay of a recomputed forward: the same op with momentum 0,
	 * which leaves the running statistics exactly as they are */
	op.f[1] = 0;
	if ((st = prep_act(h, l, dev, &op, &s->replay, &s->act[1], &w)))
		return st;
	op_init(&op, KILN_OP_BN_BWD, 4, 3);
	op.in[0] = op.in[1] = s->x, op.in[2] = s->c, op.in[3] = saved;
	op.out[0] = s->x, op.out[1] = op.out[2] = s->c;
	op.f[0] = s->eps;
	/* dx into scratch where no backward asks for it, or to be added
	 * where x has another consumer (kiln_layer_dx_shared) */
	const int shared = kiln_layer_dx_shared(l) & 1;
	if ((st = bn_plan_bwd(h, l, dev, &op, &w)) ||
	    (shared && (st = prep_acc(h, l, dev, &s->x, &s->acc))) ||
	    (l->trainable && (st = prep_acc(h, l, dev, &s->c, &s->acc_c))))
		return st;
	s->dx_bytes = shared || (kiln_layer_dx_unused(l) & 1) ? kiln_tensor_bytes(&s->x) : 0;
	l->saved_bytes = s->stat_bytes;
	/* scratch: [masked dy (a fused ReLU not folded) | a dx unused or to
	 * add into another consumer's, and the gamma/beta gradients of a
	 * frozen layer, which the op writes anyway | the ops' own] */
	*ws = s->front + ALIGN64(s->dx_bytes + 2 * s->stat_bytes) + w;
	if (l->sync_ranks > 1)
		return bn_sync_plan(h, l, dev, &s->x, s->eps, s->momentum, *ws - w, &s->sync, ws);
	return KILN_OK;
}

static kiln_status bn_forward(const struct kiln_host *h, struct kiln_layer *l,
			      const struct kiln_layer_run *r)
{
	struct bn *s = l->priv;
	struct kiln_op_args a;
	if (r->training && s->sync)
		return bn_sync_forward(h, s->sync, r);
	if (r->training) {
		/* updates the running statistics (w[2], w[3]) in place */
		a = (struct kiln_op_args){ .in = { r->x[0], r->w[0], r->w[1] },
					   .out = { r->y, r->saved, r->w[2], r->w[3] },
					   .workspace = r->workspace, .workspace_bytes = r->workspace_bytes };
		return r->recompute ? run_then_act(h, r, s->replay, s->act[1], &a)
				    : run_then_act(h, r, s->train, s->act[0], &a);
	}
	a = (struct kiln_op_args){ .in = { r->x[0], r->w[0], r->w[1], r->w[2], r->w[3] },
				   .out = { r->y }, .workspace = r->workspace,
				   .workspace_bytes = r->workspace_bytes };
	return run_then_act(h, r, s->infer, s->act[2], &a);
}

static kiln_status bn_backward(const struct kiln_host *h, struct kiln_layer *l,
			       const struct kiln_layer_run *r0)
{
	struct bn *s = l->priv;
	struct kiln_layer_run rr;
	const struct kiln_layer_run *r = &rr;
	if (!r0->dx[0] && !r0->dw[0])
		return KILN_OK;
	kiln_status st = run_act_bwd(h, r0, s->mask, s->front, &rr);
	if (st)
		return st;
	/* scratch layout: [dx (when accumulating) | dgamma dbeta (when frozen,
	 * or added into the parameters' gradients: the op overwrites)] */
	char *scr = r->workspace;
	const int dw_add = r->dw[0] && r->dw_accum;
	void *dg = r->dw[0] && !dw_add ? r->dw[0] : scr + s->dx_bytes;
	void *db = r->dw[1] && !dw_add ? r->dw[1] : scr + s->dx_bytes + s->stat_bytes;
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->w[0], r->saved, s->fold ? r->y : NULL },
				  .out = { NULL, dg, db } };
	int accum = r->dx[0] && r->dx_accum[0];
	void *dx = r->dx[0] ? r->dx[0] : scr; /* dx unused: write it to scratch */
	if (s->sync)
		st = bn_sync_backward(h, s->sync, r, dg, db, dx, accum, s->acc);
	else
		st = run_maybe_acc(h, r, s->bwd, &a, dx, accum, s->acc,
				   s->dx_bytes + 2 * s->stat_bytes);
	for (int k = 0; k < 2 && !st && dw_add; k++) {
		struct kiln_op_args b = { .in = { k ? db : dg }, .out = { r->dw[k] } };
		st = h->device_run(r->dev, s->acc_c, &b, r->stream);
	}
	return st;
}

static void bn_destroy(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev)
{
	struct bn *s = l->priv;
	if (s)
		bn_sync_free(s->sync);
	layer_destroy(h, l, dev); /* the sync plans are in the layer's list too */
}

LAYER(batchnorm, "batchnorm",
      "batch normalisation over N, H, W per channel (PyTorch BatchNorm1d/2d)", bn_keys, 1, 1,
      bn_configure, bn_infer, bn_plan, bn_forward, bn_backward, bn_destroy);
