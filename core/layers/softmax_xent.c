/* core/layers/softmax_xent.c - the loss layers over class labels, mean over
 * the batch: softmax_xent (nn.CrossEntropyLoss, with label smoothing),
 * mse and bce_logits (nn.MSELoss and nn.BCEWithLogitsLoss against the
 * label's one-hot).  A loss layer: the device op is
 * fused, computing loss sum, correct count and dlogits in one pass, so in
 * training it runs once, in backward; in evaluation it runs in forward and
 * its gradient goes to workspace.
 *
 * x: logits [B, C]; labels i32 [B]; metrics f32[3] += {loss sum, correct,
 * top-5 correct}.  Tokens: logits [B, T, V] and labels i32 [B, T] are B*T
 * rows of V classes; rows labelled ignore_index are left out (zero gradient,
 * not counted) and the gradient is the mean over the rows counted
 * (nn.CrossEntropyLoss(ignore_index)); in training the metrics add B times
 * the batch's token means, so the trainer's mean over samples is the mean
 * of the micro-batches' mean token loss (and token accuracy), as a PyTorch
 * loop logs.  In the trainer's evaluation plans (l->eval_sums, ABI 2.27)
 * they are plain sums over the rows counted and f32[4]'s [3] adds that
 * count: the evaluation is (sum of the token losses) / (tokens counted)
 * over the whole set, whatever eval_batch.  Over 2-d logits the same rule
 * (PyTorch's default ignore_index -100 applies there too); with no row
 * ignored the gradient and metrics are bit for bit what they were before.
 */
#include "util.h"

struct xent {
	struct layer_plans plans;
	int64_t B, C;
	int64_t samples;   /* the batch (rows = B = samples x tokens) */
	int tokens;        /* 3-d logits [B, T, V] */
	int ignore;        /* rows labelled ignore_index are left out (softmax_xent) */
	int64_t ignore_index;
	int64_t classes;   /* the first `classes` logits are classes; 0: all */
	int kind;          /* enum kiln_loss */
	double smoothing;  /* label_smoothing (cross-entropy) */
	void *op;
};

static const struct kiln_key xent_keys[] = {
	{ "label_smoothing", KILN_KEY_FLOAT, "0", 0, 1, NULL,
	  "Cross-entropy against (1 - e) one-hot + e / classes (nn.CrossEntropyLoss(label_smoothing = e))." },
	{ "ignore_index", KILN_KEY_INT, "-100", -1e9, 1e9, NULL,
	  "Rows whose label is this get no gradient and are not counted in the loss mean or the accuracy (nn.CrossEntropyLoss(ignore_index)), over [B, C] and token [B, T, V] logits; any other label outside [0, classes) is an error." },
	{ "classes", KILN_KEY_INT, "0", 0, 1e9, NULL,
	  "The first N logits of a row are the classes: the softmax, loss and accuracy are over them and the rest (a padded vocabulary's columns, e.g. GPT-2's 50257 of 50304) get no gradient, as llm.c and PyTorch on the real vocabulary; a label must be below N, and `kiln generate` draws only ids below N. 0: every logit is a class." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status loss_configure(const struct kiln_host *h, struct kiln_layer *l,
				  const struct kiln_config *cfg, const char *section, int kind)
{
	struct xent *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->kind = kind;
	if (kind == KILN_LOSS_XENT) {
		kiln_status st = h->config_get_float(cfg, section, "label_smoothing", &s->smoothing);
		if (st == KILN_ENOTFOUND)
			s->smoothing = 0;
		else if (st)
			return st;
		s->ignore = 1;
		s->ignore_index = -100;
		st = h->config_get_int(cfg, section, "ignore_index", &s->ignore_index);
		if (st && st != KILN_ENOTFOUND)
			return st;
		st = h->config_get_int(cfg, section, "classes", &s->classes);
		if (st && st != KILN_ENOTFOUND)
			return st;
	}
	l->is_loss = 1;
	return KILN_OK;
}

static kiln_status loss_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct xent *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	if (x->ndim != 2 && (x->ndim != 3 || s->kind != KILN_LOSS_XENT))
		return h->error(KILN_ECONFIG, "layer '%s' (%s) needs logits [batch, classes]%s, got %d dims",
				l->name, l->type, s->kind == KILN_LOSS_XENT ? " or [batch, tokens, vocab]" : "",
				x->ndim);
	s->tokens = x->ndim == 3;
	s->samples = x->dims[0];
	s->B = s->tokens ? x->dims[0] * x->dims[1] : x->dims[0];
	s->C = x->dims[x->ndim - 1];
	if (s->classes > s->C)
		return h->error(KILN_ECONFIG, "layer '%s' (%s): classes = %lld, but its logits have %lld columns",
				l->name, l->type, (long long)s->classes, (long long)s->C);
	f32_desc(&l->out, 2, 0, 0);
	l->needs_input = 1;
	l->dx_over_input = 1; /* the op reads a row's logits before its gradient */
	return KILN_OK;
}

static kiln_status loss_plan(const struct kiln_host *h, struct kiln_layer *l,
			     struct kiln_device *dev, size_t *ws)
{
	struct xent *s = l->priv;
	struct kiln_op op;
	op_init(&op, KILN_OP_SOFTMAX_XENT, l->loss_scaled ? 3 : 2, 2);
	f32_desc(&op.in[0], s->B, s->C, 0);
	kiln_tensor_desc_init(&op.in[1], KILN_I32, 1, &s->B);
	if (l->loss_scaled) /* fp16's loss scale and/or the step's mean share */
		f32_desc(&op.in[2], 1, 0, 0);
	f32_desc(&op.out[0], s->B, s->C, 0);
	/* loss, correct, top-5 (, rows counted: an evaluation's) */
	l->eval_counted = l->eval_sums; /* (the trainer reads it, ABI 2.27) */
	f32_desc(&op.out[1], l->eval_counted ? 4 : 3, 0, 0);
	/* logits and their gradient in the compute dtype; the loss in f32 */
	op.in[0].dtype = op.out[0].dtype = l->in[0].dtype;
	op.i[0] = s->B;
	op.i[1] = s->kind;
	op.f[0] = 1.0 / (double)s->B;
	op.f[1] = s->smoothing;
	op.i[2] = s->ignore;
	op.i[3] = s->ignore_index;
	/* training: B times the means over the rows counted; an evaluation:
	 * sums, divided by the set's count */
	op.i[4] = s->ignore && !l->eval_counted ? s->samples : 0;
	op.i[5] = s->classes;
	size_t w = 0;
	kiln_status st = prep(h, l, dev, &op, &s->op, &w);
	/* evaluation writes the unused gradient at the start of the
	 * workspace; the op's own workspace follows it */
	size_t g = ALIGN64((size_t)(s->B * s->C) * sizeof(float));
	if (*ws < g + w)
		*ws = g + w;
	return st;
}

static kiln_status loss_run(const struct kiln_host *h, struct kiln_layer *l,
			    const struct kiln_layer_run *r, void *grad)
{
	struct xent *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->labels, r->loss_scale },
				  .out = { grad, r->metrics } };
	if (grad != r->workspace)
		return run_op(h, r, s->op, &a);
	size_t g = ALIGN64((size_t)(s->B * s->C) * sizeof(float));
	a.workspace = (char *)r->workspace + g;
	a.workspace_bytes = r->workspace_bytes - g;
	return h->device_run(r->dev, s->op, &a, r->stream);
}

static kiln_status loss_forward(const struct kiln_host *h, struct kiln_layer *l,
				const struct kiln_layer_run *r)
{
	if (r->training)
		return KILN_OK; /* fused into backward */
	return loss_run(h, l, r, r->workspace);
}

static kiln_status loss_backward(const struct kiln_host *h, struct kiln_layer *l,
				 const struct kiln_layer_run *r)
{
	/* nothing upstream trainable: the gradient goes to workspace, the
	 * metrics still count (the planner rejects dx_accum) */
	return loss_run(h, l, r, r->dx[0] ? r->dx[0] : r->workspace);
}

FAMILY_LAYER(softmax_xent, "softmax_xent",
	     "loss: softmax + cross-entropy, mean over the batch (needs labels)", xent_keys, loss,
	     KILN_LOSS_XENT);

FAMILY_LAYER(mse, "mse",
	     "loss: mean squared error of the outputs against the label's one-hot (nn.MSELoss)",
	     NULL, loss, KILN_LOSS_MSE);

FAMILY_LAYER(bce_logits, "bce_logits",
	     "loss: binary cross-entropy with logits per class against the label's one-hot (nn.BCEWithLogitsLoss)",
	     NULL, loss, KILN_LOSS_BCE);
