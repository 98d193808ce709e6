/* examples/plugins/lion.c - an optimizer plugin written out of tree: Lion
 * (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as
 * lucidrains/lion-pytorch steps it, with decoupled weight decay.  Per
 * element, with the momentum m (one state slot, zero at first):
 *
 *   p = p * (1 - lr*wd)                    decoupled weight decay
 *   c = beta1*m + (1 - beta1)*g            the interpolation
 *   p = p - lr * sign(c)                   the update: every element moves by lr
 *   m = beta2*m + (1 - beta2)*g            the momentum
 *
 * Composed from the device's generic ops, so it runs on any device:
 * SCALE, RELU_BWD (sign(c) = (c > 0) - (-c > 0), exact), FILL, CAST, and
 * KILN_OP_SGD with momentum 0 as the gated "p = p - lr*wd*d*p - lr*x" (the
 * one op that reads the device lr, the no_decay multiplier d and the
 * finite-flag gate, so a skipped step changes nothing).
 *
 * Build against an installed kiln:
 *   cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags kiln) \
 *      -o kiln-lion.so lion.c
 * then point [run] plugin_path (or $KILN_PLUGIN_PATH) at its directory and
 * write `optimizer = lion` in [train].  docs/plugins.md walks through this
 * file.
 */
#include <kiln/plugin.h>
#include <stdlib.h>
#include <string.h>

/* Its hyper-parameters: [train] keys while lion is the optimizer (the
 * defaults of lion-pytorch; weight_decay and no_decay are kiln's own). */
static const struct kiln_key lion_keys[] = {
	{ "beta1", KILN_KEY_FLOAT, "0.9", 0, 1, NULL,
	  "lion: weight of the momentum in the update's sign, c = beta1*m + (1-beta1)*g." },
	{ "beta2", KILN_KEY_FLOAT, "0.99", 0, 1, NULL,
	  "lion: decay of the momentum, m = beta2*m + (1-beta2)*g." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

struct lion {
	const struct kiln_host *h;
	double beta1, beta2, wd;
};

/* One step's prepared ops over n elements; the workspace holds c, t and
 * ones (n floats each, 64-byte aligned) and the scalar beta2 - 1. */
struct lion_plan {
	void *ones, *scal, *c_g, *c_m, *t_neg, *c_pos, *t_pos, *c_sign, *upd, *mom, *cast;
	size_t stride; /* bytes of one n-float piece of the workspace */
};

static kiln_status lion_get(const struct kiln_host *h, const struct kiln_config *cfg,
			    const char *key, double *v)
{
	kiln_status st = h->config_get_float(cfg, "train", key, v);
	return st == KILN_ENOTFOUND ? KILN_OK : st; /* keep the default below */
}

static kiln_status lion_open(const struct kiln_host *h, const struct kiln_config *cfg,
			     struct kiln_optim_info *info, void **ctx)
{
	struct lion *o = calloc(1, sizeof *o);
	kiln_status st;
	if (!o)
		return h->error(KILN_ENOMEM, "lion: out of memory");
	o->h = h;
	o->beta1 = 0.9, o->beta2 = 0.99; /* only without a registry: the keys' defaults */
	if ((st = lion_get(h, cfg, "beta1", &o->beta1)) ||
	    (st = lion_get(h, cfg, "beta2", &o->beta2)) ||
	    (st = lion_get(h, cfg, "weight_decay", &o->wd))) {
		free(o);
		return st;
	}
	info->state_slots = 1;
	info->slot_names[0] = "optim.exp_avg"; /* lion-pytorch's name */
	info->needs_step = 0;
	info->needs_offsets = 0;
	info->shard = KILN_OPTIM_SHARD_SLICE; /* element-wise: ZeRO-1 shards it */
	info->decay_modes = 0;                /* always decoupled */
	*ctx = o;
	return KILN_OK;
}

static void lion_close(void *ctx) { free(ctx); }

/* An op of `type` over f32[n] tensors: n_in inputs, one output. */
static void vec_op(struct kiln_op *op, int type, int n_in, int64_t n)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	op->n_in = n_in;
	op->n_out = 1;
	for (int i = 0; i < n_in; i++)
		op->in[i].dtype = KILN_F32, op->in[i].ndim = 1, op->in[i].dims[0] = n;
	op->out[0] = op->in[0];
	op->out[0].dtype = KILN_F32, op->out[0].ndim = 1, op->out[0].dims[0] = n;
}

/* KILN_OP_SGD with momentum 0: out0 = out0 - lr*wd*[d]*out0 - lr*in0,
 * gated like the built-ins when the step is. */
static void axpy_op(struct kiln_op *op, int64_t n, double wd, int decay_mult, int gated)
{
	vec_op(op, KILN_OP_SGD, 2, n);
	op->in[1].dims[0] = 1;
	op->i[0] = n;
	op->f[2] = wd;
	if (decay_mult)
		op->in[op->n_in++] = op->out[0];
	if (gated) {
		op->flags = KILN_OPF_GATED;
		op->in[op->n_in] = op->in[1];
		op->n_in++;
	}
}

static kiln_status prep(struct lion *o, struct kiln_device *dev, struct kiln_op *op, void **plan)
{
	return o->h->device_prepare(dev, op, plan, NULL);
}

/* Prepare every op of a step into p (lion_plan frees p on failure). */
static kiln_status plan_ops(struct lion *o, struct kiln_device *dev,
			    const struct kiln_optim_shape *s, struct lion_plan *p)
{
	struct kiln_op op;
	const int64_t n = s->n;
	kiln_status st;
	vec_op(&op, KILN_OP_FILL, 0, n);
	op.f[0] = 1.0;
	if ((st = prep(o, dev, &op, &p->ones)))
		return st;
	vec_op(&op, KILN_OP_FILL, 0, 1);
	op.f[0] = o->beta2 - 1.0;
	if ((st = prep(o, dev, &op, &p->scal)))
		return st;
	/* c = (1 - beta1)*g, then c += beta1*m */
	vec_op(&op, KILN_OP_SCALE, 1, n);
	op.f[0] = 1.0 - o->beta1;
	if ((st = prep(o, dev, &op, &p->c_g)))
		return st;
	op.f[0] = o->beta1;
	op.flags = KILN_OPF_ACCUMULATE;
	if ((st = prep(o, dev, &op, &p->c_m)))
		return st;
	/* t = -c; c = (c > 0); t = (t > 0); c += -1*t: c = sign(c) */
	vec_op(&op, KILN_OP_SCALE, 1, n);
	op.f[0] = -1.0;
	if ((st = prep(o, dev, &op, &p->t_neg)))
		return st;
	op.flags = KILN_OPF_ACCUMULATE;
	if ((st = prep(o, dev, &op, &p->c_sign)))
		return st;
	vec_op(&op, KILN_OP_RELU_BWD, 2, n);
	if ((st = prep(o, dev, &op, &p->c_pos)) || (st = prep(o, dev, &op, &p->t_pos)))
		return st;
	/* p = p - lr*wd*d*p - lr*sign(c) */
	axpy_op(&op, n, o->wd, s->decay_mult, s->gated);
	if ((st = prep(o, dev, &op, &p->upd)))
		return st;
	/* m = m - (beta2 - 1)*(-1)*m - (beta2 - 1)*g = beta2*m + (1 - beta2)*g */
	axpy_op(&op, n, -1.0, 0, s->gated);
	if ((st = prep(o, dev, &op, &p->mom)))
		return st;
	/* low-precision compute: the compute copy of the new parameters */
	if (s->copy_dtype) {
		vec_op(&op, KILN_OP_CAST, 1, n);
		op.out[0].dtype = s->copy_dtype;
		if ((st = prep(o, dev, &op, &p->cast)))
			return st;
	}
	return KILN_OK;
}

static void lion_plan_free(void *ctx, struct kiln_device *dev, void *plan);

static kiln_status lion_plan(void *ctx, struct kiln_device *dev, const struct kiln_optim_shape *s,
			     void **out, size_t *workspace)
{
	struct lion *o = ctx;
	struct lion_plan *p = calloc(1, sizeof *p);
	kiln_status st;
	if (!p)
		return o->h->error(KILN_ENOMEM, "lion: out of memory");
	p->stride = ((size_t)s->n * sizeof(float) + 63) & ~(size_t)63;
	if ((st = plan_ops(o, dev, s, p))) {
		lion_plan_free(o, dev, p);
		return st;
	}
	*out = p;
	*workspace = 3 * p->stride + 64;
	return KILN_OK;
}

static kiln_status run(struct lion *o, struct kiln_device *dev, void *plan, void *stream,
		       const void *in0, const void *in1, const void *in2, const void *in3, void *out)
{
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = in0, a.in[1] = in1, a.in[2] = in2, a.in[3] = in3;
	a.out[0] = out;
	return o->h->device_run(dev, plan, &a, stream);
}

static kiln_status lion_step(void *ctx, struct kiln_device *dev, void *plan,
			     const struct kiln_optim_args *a, void *stream)
{
	struct lion *o = ctx;
	struct lion_plan *p = plan;
	float *c = a->workspace;
	float *t = (float *)((char *)a->workspace + p->stride);
	float *ones = (float *)((char *)a->workspace + 2 * p->stride);
	float *scal = (float *)((char *)a->workspace + 3 * p->stride);
	/* the gated ops' inputs: [d,] [gate] after x and lr */
	const void *upd2 = a->decay_mult ? (const void *)a->decay_mult : (const void *)a->gate;
	const void *upd3 = a->decay_mult ? (const void *)a->gate : NULL;
	kiln_status st;
	if ((st = run(o, dev, p->ones, stream, NULL, NULL, NULL, NULL, ones)) ||
	    (st = run(o, dev, p->scal, stream, NULL, NULL, NULL, NULL, scal)) ||
	    (st = run(o, dev, p->c_g, stream, a->grads, NULL, NULL, NULL, c)) ||
	    (st = run(o, dev, p->c_m, stream, a->state[0], NULL, NULL, NULL, c)) ||
	    (st = run(o, dev, p->t_neg, stream, c, NULL, NULL, NULL, t)) ||
	    (st = run(o, dev, p->c_pos, stream, c, ones, NULL, NULL, c)) ||
	    (st = run(o, dev, p->t_pos, stream, t, ones, NULL, NULL, t)) ||
	    (st = run(o, dev, p->c_sign, stream, t, NULL, NULL, NULL, c)) ||
	    (st = run(o, dev, p->upd, stream, c, a->lr, upd2, upd3, a->params)) ||
	    (st = run(o, dev, p->mom, stream, a->grads, scal, a->gate, NULL, a->state[0])))
		return st;
	if (p->cast)
		return run(o, dev, p->cast, stream, a->params, NULL, NULL, NULL, a->copy);
	return KILN_OK;
}

static void lion_plan_free(void *ctx, struct kiln_device *dev, void *plan)
{
	struct lion *o = ctx;
	struct lion_plan *p = plan;
	void *all[] = { p->ones, p->scal, p->c_g, p->c_m, p->t_neg, p->c_pos, p->t_pos,
			p->c_sign, p->upd, p->mom, p->cast };
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		if (all[i])
			o->h->device_plan_free(dev, all[i]);
	free(p);
}

static const struct kiln_optim_ops lion_ops = {
	.version = KILN_OPTIM_OPS_VERSION,
	.open = lion_open,
	.close = lion_close,
	.plan = lion_plan,
	.step = lion_step,
	.plan_free = lion_plan_free,
};

static const struct kiln_plugin lion = {
	.abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR,
	.kind = KILN_PLUGIN_OPTIM,
	.name = "lion",
	.summary = "Lion (Chen et al. 2023): p -= lr * sign(beta1*m + (1-beta1)*g), decoupled weight decay",
	.ops = &lion_ops,
	.keys = lion_keys,
	.probe = NULL,
};

static const struct kiln_plugin *const plugins[] = { &lion, NULL };

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	(void)host;
	return plugins;
}
