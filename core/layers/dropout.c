/* core/layers/dropout.c - inverted dropout: in training keep each element
 * with probability 1 - p and scale it by 1/(1 - p); identity in evaluation.
 *
 * The mask is a counter-based draw of (seed, layer, optimizer step, the
 * element's index in the step's global batch) (DESIGN.md "Randomness"):
 * the same for any thread count, rank count, [train] accumulate or
 * [pipeline] micro_batches, recomputed in backward instead of stored, and
 * never repeated across steps.  r->step is the trainer's device counter
 * { step, row0, rstride } (kiln/ops.h KILN_OP_DROPOUT).
 */
#include "util.h"

struct dropout {
	struct layer_plans plans;
	double p;
	void *fwd, *bwd[2], *copy;
};

static const struct kiln_key dropout_keys[] = {
	{ "p", KILN_KEY_FLOAT, "0.5", 0, 0.999, NULL, "Probability of zeroing an element." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status dropout_configure(const struct kiln_host *h, struct kiln_layer *l,
				     const struct kiln_config *cfg, const char *sec)
{
	struct dropout *s = layer_alloc(h, l, sizeof *s);
	if (!s)
		return KILN_ENOMEM;
	s->p = 0.5;
	h->config_get_float(cfg, sec, "p", &s->p);
	return KILN_OK;
}

static kiln_status dropout_infer(const struct kiln_host *h, struct kiln_layer *l)
{
	(void)h;
	l->out = l->in[0];
	return KILN_OK;
}

static kiln_status dropout_plan(const struct kiln_host *h, struct kiln_layer *l,
				struct kiln_device *dev, size_t *ws)
{
	struct dropout *s = l->priv;
	struct kiln_op op;
	kiln_status st;
	int64_t ctr = KILN_DROP_CTR; /* { step, row0, rstride }: r->step */
	struct kiln_tensor_desc step;
	kiln_tensor_desc_init(&step, KILN_I64, 1, &ctr);
	op_init(&op, KILN_OP_DROPOUT, 2, 1);
	op.in[0] = op.out[0] = l->out;
	op.in[1] = step;
	op.i[0] = (int64_t)l->seed, op.i[1] = l->index, op.f[0] = s->p;
	if (kiln_layer_training(l)) { /* the masks, forward and backward */
		if ((st = prep(h, l, dev, &op, &s->fwd, ws)))
			return st;
		op.type = KILN_OP_DROPOUT_BWD;
		return prep_pair(h, l, dev, &op, s->bwd, ws);
	}
	/* evaluation: y = x */
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.in[0] = op.out[0] = l->out;
	op.f[0] = 1.0;
	return prep(h, l, dev, &op, &s->copy, ws);
}

static kiln_status dropout_forward(const struct kiln_host *h, struct kiln_layer *l,
				   const struct kiln_layer_run *r)
{
	struct dropout *s = l->priv;
	struct kiln_op_args a = { .in = { r->x[0], r->step }, .out = { r->y } };
	return run_op(h, r, r->training ? s->fwd : s->copy, &a);
}

static kiln_status dropout_backward(const struct kiln_host *h, struct kiln_layer *l,
				    const struct kiln_layer_run *r)
{
	struct dropout *s = l->priv;
	struct kiln_op_args a = { .in = { r->dy, r->step } };
	return run_dx(h, r, s->bwd, 0, &a);
}

LAYER(dropout, "dropout", "inverted dropout with a counter-based mask (identity in evaluation)",
      dropout_keys, 1, 1, dropout_configure, dropout_infer, dropout_plan, dropout_forward,
      dropout_backward, layer_destroy);
