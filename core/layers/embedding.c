/* core/layers/embedding.c - token embedding (nn.Embedding): y = weight[idx].
 *
 * x: token ids i32 [B, T] (or [B]); weight [V, C], initialised N(0, 0.02^2)
 * as GPT-2 does; y: [B, T, C] (or [B, C]) f32 whatever the compute dtype,
 * as under torch.autocast (the rows start the residual stream, which stays
 * f32; a linear layer converts what it reads: docs/precision.md).  The input is integer: the
 * backward gives only dweight (KILN_OP_EMBEDDING_BWD, a deterministic
 * scatter-add).  An id outside [0, V) fails the step with KILN_EDATA naming
 * its position (the device never reads past the table).
 */
#include "util.h"

struct embedding {
	struct layer_plans plans;
	int64_t V, C, N; /* vocabulary, channels, ids per batch */
	void *fwd, *bwd[2]; /* bwd[1] adds into dweight (dw_accum) */
};

static const struct kiln_key embedding_keys[] = {
	{ "vocab", KILN_KEY_INT, NULL, 1, 2147483647.0, NULL,
	  "Vocabulary size V: ids are in [0, V) (required)." },
	{ "dim", KILN_KEY_INT, NULL, 1, 1e9, NULL, "Embedding width C (required)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status embedding_configure(const struct kiln_host *h, struct kiln_layer *l,
				       const struct kiln_config *cfg, const char *section)
{
	struct embedding *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	if (h->config_get_int(cfg, section, "vocab", &s->V) ||
	    h->config_get_int(cfg, section, "dim", &s->C))
		return h->error(KILN_ECONFIG, "%s: [%s] needs 'vocab' and 'dim'",
				h->config_where(cfg, section, NULL), section);
	return KILN_OK;
}

static kiln_status embedding_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	struct embedding *s = l->priv;
	const struct kiln_tensor_desc *x = &l->in[0];
	if (x->dtype != KILN_I32 || (x->ndim != 1 && x->ndim != 2)) {
		char d[96];
		return h->error(KILN_ECONFIG, "layer '%s' (embedding) needs token ids i32 [batch, tokens] or [batch], got %s",
				l->name, kiln_tensor_desc_str(x, d, sizeof d));
	}
	s->N = kiln_tensor_numel(x);
	if (x->ndim == 2)
		f32_desc(&l->out, x->dims[0], x->dims[1], s->C);
	else
		f32_desc(&l->out, x->dims[0], s->C, 0);
	l->n_params = 1;
	l->params[0] = (struct kiln_param_spec){ "weight", { 0 }, KILN_INIT_NORMAL, 0, 0 };
	f32_desc(&l->params[0].desc, s->V, s->C, 0);
	l->needs_input = 1;
	return KILN_OK;
}

static kiln_status embedding_plan(const struct kiln_host *h, struct kiln_layer *l,
				  struct kiln_device *dev, size_t *ws)
{
	struct embedding *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	op_init(&op, KILN_OP_EMBEDDING, 2, 1);
	op.in[0] = l->in[0];
	f32_desc(&op.in[1], s->V, s->C, 0);
	op.out[0] = l->out;
	if ((st = prep(h, l, dev, &op, &s->fwd, ws)) || !l->trainable || !kiln_layer_training(l))
		return st;
	op_init(&op, KILN_OP_EMBEDDING_BWD, 2, 1);
	op.in[0] = l->in[0];
	op.in[1] = l->out;
	f32_desc(&op.out[0], s->V, s->C, 0);
	return prep_pair(h, l, dev, &op, s->bwd, ws);
}

static kiln_status embedding_forward(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_layer_run *r)
{
	struct embedding *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->w[0] }, .out = { r->y } };
	return run_op(h, r, s->fwd, &a);
}

static kiln_status embedding_backward(const struct kiln_host *h, struct kiln_layer *l,
				      const struct kiln_layer_run *r)
{
	struct embedding *s = l->priv;
	if (!r->dw[0])
		return KILN_OK; /* frozen; integer ids have no gradient */
	struct kiln_op_args a = { .in = { r->x[0], r->dy }, .out = { r->dw[0] } };
	return run_op(h, r, s->bwd[r->dw_accum ? 1 : 0], &a);
}

LAYER(embedding, "embedding", "token embedding: y = weight[ids] (nn.Embedding); weight initialised N(0, 0.02^2), GPT-2's, not nn.Embedding's N(0, 1) (`init_from` loads any other)", embedding_keys,
      1, 1, embedding_configure, embedding_infer, embedding_plan, embedding_forward,
      embedding_backward, layer_destroy);
