/* core/layers/attention.c - fused multi-head scaled-dot-product attention,
 * no parameters: qkv [B, T, 3C] -> y [B, T, C].
 *
 * The input is q, k and v side by side along the last dimension (GPT-2's
 * c_attn output; head h of q at columns [h*D, (h+1)*D), D = C/heads), so
 * an INI composes linear(3C) -> attention -> linear(C) as llm.c does.  One
 * device op each way (KILN_OP_ATTENTION, _BWD in kiln/ops.h): scores scaled
 * by 1/sqrt(D) (or `scale`), the causal mask, softmax, dropout on the
 * probabilities in training (the dropout layer's counter-based mask, drawn
 * from (seed, layer, optimizer step, the element's index in the step's
 * global batch)), the weighted sum of v.  The
 * forward keeps the logsumexp of every softmax row, f32 [B, heads, T], for
 * the backward, which recomputes the probabilities from it.
 */
#include "util.h"

#include <math.h>

struct attention {
	struct layer_plans plans;
	int64_t heads;
	int causal;
	double dropout, scale; /* scale 0: 1/sqrt(D) */
	struct kiln_tensor_desc lse;
	size_t lse_bytes;
	void *train, *eval, *bwd[2];
	void *decode;          /* decode plans: ATTENTION_DECODE */
	struct kiln_tensor_desc cache; /* its key (and value) cache, f32 [B,H,Tmax,D] */
};

static const struct kiln_key attention_keys[] = {
	{ "heads", KILN_KEY_INT, NULL, 1, 1e6, NULL,
	  "Number of heads (required); the input's last dimension must be 3 * C with C a "
	  "multiple of it." },
	{ "causal", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Mask the future: position i attends to positions j <= i only." },
	{ "dropout", KILN_KEY_FLOAT, "0", 0, 0.999, NULL,
	  "Dropout probability on the attention probabilities in training (the dropout "
	  "layer's counter-based mask)." },
	{ "scale", KILN_KEY_FLOAT, NULL, 0, 1e6, NULL,
	  "Factor of the scores q.k, above 0; unset: 1/sqrt(C/heads)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status attention_configure(const struct kiln_host *h, struct kiln_layer *l,
				       const struct kiln_config *cfg, const char *sec)
{
	struct attention *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	if (h->config_get_int(cfg, sec, "heads", &s->heads))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'heads' (number of attention heads)",
				h->config_where(cfg, sec, NULL), sec);
	s->causal = 1;
	h->config_get_bool(cfg, sec, "causal", &s->causal);
	h->config_get_float(cfg, sec, "dropout", &s->dropout);
	h->config_get_float(cfg, sec, "scale", &s->scale);
	if (h->config_get(cfg, sec, "scale") && !(s->scale > 0))
		return h->error(KILN_ECONFIG, "%s: [%s] scale = %g: must be > 0",
				h->config_where(cfg, sec, "scale"), sec, s->scale);
	return KILN_OK;
}

static kiln_status attention_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct attention *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	if (x->ndim != 3)
		return h->error(KILN_ECONFIG, "layer '%s' (attention) needs [B, T, 3C] input, got %d dims",
				l->name, x->ndim);
	if (x->dims[2] % (3 * s->heads))
		return h->error(KILN_ECONFIG,
				"layer '%s' (attention): the input's last dimension %lld is not divisible by 3 * heads = %lld (q, k, v of C = heads * head size each)",
				l->name, (long long)x->dims[2], (long long)(3 * s->heads));
	const int64_t B = x->dims[0], T = x->dims[1], C = x->dims[2] / 3;
	if (l->decode_len && !s->causal)
		return h->error(KILN_ECONFIG, "layer '%s' (attention): causal = 0 sees later tokens: it cannot be decoded token by token",
				l->name);
	int64_t cd[4] = { B, s->heads, l->decode_len, C / s->heads };
	kiln_tensor_desc_init(&s->cache, KILN_F32, 4, cd);
	f32_desc(&l->out, B, T, C);
	l->out.dtype = x->dtype; /* the compute dtype */
	f32_desc(&s->lse, B, s->heads, T);
	s->lse_bytes = kiln_tensor_bytes(&s->lse);
	if (s->scale == 0)
		s->scale = 1.0 / sqrt((double)(C / s->heads));
	l->needs_input = 1;
	l->needs_output = 1;
	return KILN_OK;
}

/* ATTENTION (or _BWD) of this layer with dropout p (0: no step input). */
static void attention_op(const struct kiln_layer *l, const struct attention *s, int bwd, double p,
			 struct kiln_op *op)
{
	struct kiln_tensor_desc step;
	int64_t ctr = KILN_DROP_CTR; /* { step, row0, rstride }: r->step */
	kiln_tensor_desc_init(&step, KILN_I64, 1, &ctr);
	const int drop = p > 0;
	if (bwd) {
		op_init(op, KILN_OP_ATTENTION_BWD, 4 + drop, 1);
		op->in[0] = op->in[2] = l->out, op->in[1] = l->in[0], op->in[3] = s->lse;
		op->out[0] = l->in[0];
	} else {
		op_init(op, KILN_OP_ATTENTION, 1 + drop, 2);
		op->in[0] = l->in[0];
		op->out[0] = l->out, op->out[1] = s->lse;
	}
	if (drop)
		op->in[op->n_in - 1] = step;
	op->i[0] = s->heads, op->i[1] = s->causal;
	op->i[2] = (int64_t)l->seed, op->i[3] = l->index;
	op->f[0] = s->scale, op->f[1] = p;
}

static kiln_status attention_plan(const struct kiln_host *h, struct kiln_layer *l,
				  struct kiln_device *dev, size_t *ws)
{
	struct attention *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	size_t w = 0;
	if (l->decode_len) { /* T tokens per row (1 a step: ATTENTION_DECODE; a
			      * prompt's prefill more: ATTENTION_DECODE_RUN,
			      * ABI 2.31), the caches kept as saved memory */
		op_init(&op, l->in[0].dims[1] > 1 ? KILN_OP_ATTENTION_DECODE_RUN : KILN_OP_ATTENTION_DECODE,
			2, 3);
		op.in[0] = l->in[0];
		kiln_tensor_desc_init(&op.in[1], KILN_I32, 1, (int64_t[]){ 1 });
		op.out[0] = l->out;
		op.out[1] = op.out[2] = s->cache;
		op.i[0] = s->heads;
		op.f[0] = s->scale;
		l->saved_bytes = 2 * ALIGN64(kiln_tensor_bytes(&s->cache));
		/* the key cache, then the value cache, each [B, H, Tmax, D]:
		 * a row's keys (values) in one run of bytes, H runs of Tmax
		 * positions of D floats (ABI 2.26: the positions of a prompt
		 * fed once are copied to the rows) */
		l->decode_caches = 2;
		l->decode_row_bytes = kiln_tensor_bytes(&s->cache) / (size_t)s->cache.dims[0];
		l->decode_pos_bytes = sizeof(float) * (size_t)s->cache.dims[3];
		l->decode_runs = 1; /* a run's positions rewrite their cache rows */
		return prep(h, l, dev, &op, &s->decode, ws);
	}
	/* an evaluation plan runs the eval form alone (attention_forward) */
	const int train = kiln_layer_training(l);
	attention_op(l, s, 0, s->dropout, &op);
	if (train && (st = prep(h, l, dev, &op, &s->train, &w)))
		return st;
	attention_op(l, s, 0, 0.0, &op);
	if ((st = prep(h, l, dev, &op, &s->eval, &w)))
		return st;
	attention_op(l, s, 1, s->dropout, &op);
	if (train && (st = prep_pair(h, l, dev, &op, s->bwd, &w)))
		return st;
	l->saved_bytes = train ? s->lse_bytes : 0;
	/* evaluation writes the logsumexp it does not keep to the workspace */
	*ws = ALIGN64(s->lse_bytes) + w;
	return KILN_OK;
}

static kiln_status attention_forward(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_layer_run *r)
{
	struct attention *s = l->priv;
	const size_t off = ALIGN64(s->lse_bytes);
	struct kiln_op_args a = { .in = { r->x[0], r->step }, .out = { r->y, r->saved } };
	if (s->decode) {
		char *k = r->saved;
		a = (struct kiln_op_args){ .in = { r->x[0], r->pos },
					   .out = { r->y, k, k + ALIGN64(kiln_tensor_bytes(&s->cache)) } };
		return run_op(h, r, s->decode, &a);
	}
	if (r->training)
		return run_op(h, r, s->train, &a);
	a = (struct kiln_op_args){ .in = { r->x[0] },
				   .out = { r->y, r->workspace },
				   .workspace = (char *)r->workspace + off,
				   .workspace_bytes = r->workspace_bytes - off };
	return h->device_run(r->dev, s->eval, &a, r->stream);
}

static kiln_status attention_backward(const struct kiln_host *h, struct kiln_layer *l,
				      const struct kiln_layer_run *r)
{
	struct attention *s = l->priv;
	struct kiln_op_args a = { .in = { r->dy, r->x[0], r->y, r->saved, r->step } };
	return run_dx(h, r, s->bwd, 0, &a);
}

LAYER(attention, "attention",
      "fused multi-head scaled-dot-product attention: qkv [B, T, 3C] -> [B, T, C] (causal by default)",
      attention_keys, 1, 1, attention_configure, attention_infer, attention_plan,
      attention_forward, attention_backward, layer_destroy);
