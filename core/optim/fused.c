/* core/optim/fused.c - a built-in optimizer's step: one fused device op
 * over the flat buffers (plugin.h states each op's formula), every
 * per-step scalar (lr, the step count, the gate) read from device memory.
 *
 * The op's inputs, in order: grads [n], lr f32[1], the step count i64[1]
 * (needs_step), the tensor offsets i64[T+1] (needs_offsets), the weight-
 * decay multiplier [n] (decay_mult), the gate f32[1] (gated, with
 * KILN_OPF_GATED); its outputs: params [n], the state slots [n] each, the
 * compute copy [n] (copy_dtype).  Where the slots leave no room for the
 * copy (ADAMW with amsgrad: params and three slots fill KILN_OP_MAX_OUT),
 * a CAST of the params after the op writes it: the same rounding, one more
 * pass over the parameters. */
#include "optim.h"
#include "../../plugins/common/c_locale.h" /* common_strtod */

#include <stdlib.h>

struct fused_optim *fused_optim_new(const struct kiln_host *h, int type)
{
	struct fused_optim *f = calloc(1, sizeof *f);
	if (!f) {
		h->error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	f->h = h;
	f->op.type = type;
	return f;
}

static const struct kiln_key *key_row(const struct kiln_key *keys, const char *key)
{
	for (; keys && keys->name; keys++)
		if (!strcmp(keys->name, key))
			return keys;
	return NULL;
}

/* A [train] key as a float (f) or a bool (b), with its row's default in
 * keys when the config leaves it unset. */
static kiln_status optim_get(const struct kiln_host *h, const struct kiln_config *cfg,
			     const struct kiln_key *keys, const char *key, double *f, int *b)
{
	kiln_status st = f ? h->config_get_float(cfg, "train", key, f)
			   : h->config_get_bool(cfg, "train", key, b);
	const struct kiln_key *k = key_row(keys, key);
	if (st != KILN_ENOTFOUND || !k || !k->def)
		return st;
	if (f)
		*f = common_strtod(k->def, NULL);
	else
		*b = atoi(k->def);
	return KILN_OK;
}

kiln_status optim_get_float(const struct kiln_host *h, const struct kiln_config *cfg,
			    const struct kiln_key *keys, const char *key, double *v)
{
	return optim_get(h, cfg, keys, key, v, NULL);
}

kiln_status optim_get_bool(const struct kiln_host *h, const struct kiln_config *cfg,
			   const struct kiln_key *keys, const char *key, int *v)
{
	return optim_get(h, cfg, keys, key, NULL, v);
}

/* A plan: the fused op's, and the CAST's that writes the compute copy
 * when the op's outputs have no room for it (else NULL). */
struct fused_plan {
	void *op, *cast;
};

/* Whether the op writes the compute copy itself: one output after the
 * params and the state slots. */
static int copy_in_op(const struct fused_optim *f)
{
	return 2 + f->info.state_slots <= KILN_OP_MAX_OUT;
}

/* The CAST of n f32 params into the compute copy of dtype cdt. */
static kiln_status cast_plan(const struct fused_optim *f, struct kiln_device *dev, int64_t n,
			     int cdt, void **plan)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CAST;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.out[0], cdt, 1, &n);
	return f->h->device_prepare(dev, &op, plan, NULL);
}

static kiln_status fused_op_plan(const struct fused_optim *f, struct kiln_device *dev,
				 const struct kiln_optim_shape *s, void **plan, size_t *workspace)
{
	struct kiln_op op = f->op;
	int64_t n = s->n, one = 1, t1 = s->n_tensors + 1;
	op.i[0] = n;
	kiln_tensor_desc_init(&op.in[op.n_in++], KILN_F32, 1, &n);
	kiln_tensor_desc_init(&op.in[op.n_in++], KILN_F32, 1, &one);
	if (f->info.needs_step)
		kiln_tensor_desc_init(&op.in[op.n_in++], KILN_I64, 1, &one);
	if (f->info.needs_offsets)
		kiln_tensor_desc_init(&op.in[op.n_in++], KILN_I64, 1, &t1);
	if (s->decay_mult)
		kiln_tensor_desc_init(&op.in[op.n_in++], KILN_F32, 1, &n);
	if (s->gated) {
		op.flags |= KILN_OPF_GATED;
		kiln_tensor_desc_init(&op.in[op.n_in++], KILN_F32, 1, &one);
	}
	for (op.n_out = 0; op.n_out < 1 + f->info.state_slots; op.n_out++)
		op.out[op.n_out] = op.in[0];
	if (s->copy_dtype && copy_in_op(f))
		kiln_tensor_desc_init(&op.out[op.n_out++], s->copy_dtype, 1, &n);
	return f->h->device_prepare(dev, &op, plan, workspace);
}

kiln_status fused_optim_plan(void *ctx, struct kiln_device *dev, const struct kiln_optim_shape *s,
			     void **plan, size_t *workspace)
{
	const struct fused_optim *f = ctx;
	struct fused_plan *p = calloc(1, sizeof *p);
	if (!p)
		return f->h->error(KILN_ENOMEM, "out of memory");
	kiln_status st = fused_op_plan(f, dev, s, &p->op, workspace);
	if (!st && s->copy_dtype && !copy_in_op(f))
		st = cast_plan(f, dev, s->n, s->copy_dtype, &p->cast);
	if (st) {
		fused_optim_plan_free(ctx, dev, p);
		return st;
	}
	*plan = p;
	return KILN_OK;
}

kiln_status fused_optim_step(void *ctx, struct kiln_device *dev, void *plan,
			     const struct kiln_optim_args *a, void *stream)
{
	const struct fused_optim *f = ctx;
	const struct fused_plan *p = plan;
	struct kiln_op_args o;
	int k = 0;
	memset(&o, 0, sizeof o);
	o.in[k++] = a->grads;
	o.in[k++] = a->lr;
	if (f->info.needs_step)
		o.in[k++] = a->step;
	if (f->info.needs_offsets)
		o.in[k++] = a->offsets;
	if (a->decay_mult)
		o.in[k++] = a->decay_mult;
	if (a->gate)
		o.in[k++] = a->gate;
	o.out[0] = a->params;
	for (k = 0; k < f->info.state_slots; k++)
		o.out[1 + k] = a->state[k];
	if (a->copy && copy_in_op(f))
		o.out[1 + k] = a->copy;
	o.workspace = a->workspace;
	o.workspace_bytes = a->workspace_bytes;
	kiln_status st = f->h->device_run(dev, p->op, &o, stream);
	if (st || !p->cast || !a->copy)
		return st;
	/* (a skipped step left the params as they were: the copy is cast
	 * again, the same bytes) */
	struct kiln_op_args c = { .in = { a->params }, .out = { a->copy } };
	return f->h->device_run(dev, p->cast, &c, stream);
}

void fused_optim_plan_free(void *ctx, struct kiln_device *dev, void *plan)
{
	const struct fused_optim *f = ctx;
	struct fused_plan *p = plan;
	if (!p)
		return;
	f->h->device_plan_free(dev, p->op);
	f->h->device_plan_free(dev, p->cast);
	free(p);
}

void fused_optim_close(void *ctx) { free(ctx); }
