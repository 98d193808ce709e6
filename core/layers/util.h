/* core/layers/util.h - small helpers shared by the built-in layer files. */
#ifndef KILN_LAYERS_UTIL_H
#define KILN_LAYERS_UTIL_H

#include "../internal.h"

#include <errno.h>
#include <stdlib.h>

static inline void op_init(struct kiln_op *op, int type, int n_in, int n_out)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	op->n_in = n_in;
	op->n_out = n_out;
}

/* f32 row-major descriptor of up to 3 dims (0 ends the list). */
static inline void f32_desc(struct kiln_tensor_desc *d, int64_t a, int64_t b, int64_t c)
{
	int64_t dims[3] = { a, b, c };
	int n = a ? b ? c ? 3 : 2 : 1 : 0;
	kiln_tensor_desc_init(d, KILN_F32, n, dims);
}

/* Elements per sample: product of dims 1.. */
static inline int64_t per_sample(const struct kiln_tensor_desc *d)
{
	int64_t n = 1;
	for (int i = 1; i < d->ndim; i++)
		n *= d->dims[i];
	return n;
}

/* ---- a layer's state and the device plans it prepares ------------------- */

/* Every built-in layer's state (l->priv) starts with the list of the
 * device plans it prepared: the prep helpers below record each one, so
 * layer_destroy frees them all and no layer lists its plans twice. */
#define LAYER_MAX_PLANS 24
struct layer_plans {
	int n;
	void *all[LAYER_MAX_PLANS];
};

/* The layer's state l->priv: allocated zeroed, `size` bytes starting with
 * a struct layer_plans, unless it has one already (configure or infer,
 * whichever comes first); NULL, the error reported, when out of memory
 * (the caller returns KILN_ENOMEM). */
static inline void *layer_alloc(const struct kiln_host *h, struct kiln_layer *l, size_t size)
{
	if (!l->priv && !(l->priv = calloc(1, size)))
		h->error(KILN_ENOMEM, "out of memory");
	return l->priv;
}

/* Free the plans the layer prepared (when it was planned on dev) and its
 * state: the destroy of every layer that owns nothing else. */
static inline void layer_destroy(const struct kiln_host *h, struct kiln_layer *l,
				 struct kiln_device *dev)
{
	struct layer_plans *p = l->priv;
	for (int i = 0; p && dev && i < p->n; i++)
		h->device_plan_free(dev, p->all[i]);
	free(p);
	l->priv = NULL;
}

/* Prepare `op` into *plan (recorded in the layer's list), growing *ws to
 * the largest workspace seen (ws NULL: the op must need none). */
static inline kiln_status prep(const struct kiln_host *h, struct kiln_layer *l,
			       struct kiln_device *dev, const struct kiln_op *op, void **plan,
			       size_t *ws)
{
	struct layer_plans *p = l->priv;
	size_t w = 0;
	if (p->n == LAYER_MAX_PLANS)
		return h->error(KILN_EINTERNAL, "layer '%s': more than %d device plans", l->name,
				LAYER_MAX_PLANS);
	kiln_status st = h->device_prepare(dev, op, plan, ws ? &w : NULL);
	if (st)
		return st;
	p->all[p->n++] = *plan;
	if (ws && w > *ws)
		*ws = w;
	return KILN_OK;
}

/* Prepare `op` twice: plans[0] writes out0, plans[1] adds into it.  The
 * first consumer of a gradient in a step writes it, later ones add (the
 * planner's dx_accum picks the plan at run time). */
static inline kiln_status prep_pair(const struct kiln_host *h, struct kiln_layer *l,
				    struct kiln_device *dev, struct kiln_op *op, void *plans[2],
				    size_t *ws)
{
	kiln_status st;
	for (int acc = 0; acc < 2; acc++) {
		op->flags = acc ? KILN_OPF_ACCUMULATE : 0;
		if ((st = prep(h, l, dev, op, &plans[acc], ws)))
			return st;
	}
	return KILN_OK;
}

/* ---- a fused activation ([run] fuse, kiln_layer.fuse_act) ------------- */

/* The fused activation of a layer that takes it: a layer whose op can end
 * in kind (1 + enum kiln_act) sets act_fused when the core offers it. */
static inline void take_act(struct kiln_layer *l, int can)
{
	l->act_fused = l->fuse_act && can;
}

/* Prepare `op` into *plan with the layer's fused activation as its
 * epilogue (KILN_OPF_ACT) where the device has it; else (KILN_ENOTSUP)
 * the op alone and, into *act, an ACT op in place on its out0.  *act stays
 * NULL when the layer has no fused activation or the device fused it. */
static inline kiln_status prep_act(const struct kiln_host *h, struct kiln_layer *l,
				   struct kiln_device *dev, struct kiln_op *op, void **plan,
				   void **act, size_t *ws)
{
	kiln_status st;
	*act = NULL;
	if (!l->act_fused)
		return prep(h, l, dev, op, plan, ws);
	op->flags |= KILN_OPF_ACT;
	op->i[KILN_OPI_ACT] = l->fuse_act - 1;
	if ((st = prep(h, l, dev, op, plan, ws)) != KILN_ENOTSUP)
		return st;
	op->flags &= ~KILN_OPF_ACT;
	op->i[KILN_OPI_ACT] = 0;
	if ((st = prep(h, l, dev, op, plan, ws)))
		return st;
	struct kiln_op a;
	memset(&a, 0, sizeof a);
	a.type = KILN_OP_ACT;
	a.n_in = a.n_out = 1;
	a.in[0] = a.out[0] = op->out[0];
	a.i[0] = l->fuse_act - 1;
	return prep(h, l, dev, &a, act, ws);
}

/* The keys of the layers that run INT8 (conv, linear), read into their
 * int8_scale and int8_unsigned. */
#define LAYER_INT8_KEYS                                                                        \
	{ "int8_scale", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,                                     \
	  "INT8 inference (docs/inference.md, INT8): > 0 runs the layer as KILN_OP_QCONV / QLINEAR with this scale of its input (per-output-channel 7-bit weights, exact int32 sums). Set by `kiln eval --quantized` from `kiln quantize`'s file, evaluation only (a training run, and `kiln config`, refuse it before anything is opened); 0: f32." }, \
	{ "int8_unsigned", KILN_KEY_BOOL, "0", 0, 0, NULL,                                      \
	  "With int8_scale: the input is quantized to u8 (it was never negative in calibration), else to s8." }, \
	{ "int8_out_scale", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,                                 \
	  "With int8_scale: > 0 writes the output as u8 in this scale (after the ReLU, which must be fused: `[run] fuse = 1`), for INT8 layers that read it through max pools and flattens (set by `kiln eval --quantized` on the CPU: docs/inference.md, INT8); evaluation only (a training run refuses it); 0: f32." }

/* A CONV or GEMM op made its INT8 twin (QCONV, QLINEAR: kiln/ops.h):
 * the input's scale sx and u8 (unsigned) or s8 (a u8 input is read as
 * it is), f32 weights, and the output's scale so (> 0: y is u8). */
static inline void quantized(struct kiln_op *op, int type, double sx, int is_unsigned, double so)
{
	op->type = type;
	op->f[0] = sx;
	op->i[8] = is_unsigned;
	op->f[1] = so;
	op->in[1].dtype = KILN_F32;
	op->out[0].dtype = so > 0 ? KILN_U8 : KILN_F32;
}

/* The output dtype of an INT8 layer (int8_scale sx > 0, int8_out_scale
 * so): u8 when so > 0, else f32; x's (the compute dtype) otherwise.  A
 * u8 input only an INT8 layer reads. */
static inline kiln_status int8_out_dtype(const struct kiln_host *h, const struct kiln_layer *l,
					 double sx, double so, int32_t *dtype)
{
	const int u8_in = l->in[0].dtype == KILN_U8;
	if ((u8_in || so > 0) && !(sx > 0))
		return h->error(KILN_ECONFIG, "layer '%s': a u8 input or int8_out_scale needs int8_scale > 0 (an INT8 layer)",
				l->name);
	*dtype = so > 0 ? KILN_U8 : sx > 0 ? KILN_F32 : l->in[0].dtype;
	return KILN_OK;
}

/* A u8 output (int8_out_scale so > 0) is planned only with the ReLU that
 * alone reads the layer fused into it: the u8's saturation at 0 is that
 * ReLU.  (A graph inferred without fusion, as the ONNX export's, plans
 * nothing.) */
static inline kiln_status int8_out_planned(const struct kiln_host *h, const struct kiln_layer *l,
					   double so)
{
	if (so > 0 && !(l->act_fused && l->fuse_act == 1 + KILN_ACT_RELU))
		return h->error(KILN_ECONFIG, "layer '%s': int8_out_scale wants the ReLU that alone reads the layer fused into it ([run] fuse = 1)",
				l->name);
	return KILN_OK;
}

/* Run `plan` on a's buffers, then the activation prep_act fell back to (act
 * non-NULL) in place on out0. */
static inline kiln_status run_then_act(const struct kiln_host *h, const struct kiln_layer_run *r,
				       void *plan, void *act, struct kiln_op_args *a)
{
	kiln_status st = h->device_run(r->dev, plan, a, r->stream);
	if (st || !act)
		return st;
	struct kiln_op_args b = { .in = { a->out[0] }, .out = { a->out[0] },
				  .workspace = a->workspace, .workspace_bytes = a->workspace_bytes };
	return h->device_run(r->dev, act, &b, r->stream);
}

/* The fused ReLU's backward where the layer's own backward ops cannot
 * fold it: *plan (NULL without a fused ReLU) = dy * (y > 0) of y's shape,
 * into the front of the workspace, whose *front bytes it takes; its own
 * workspace (*ws grows to it, as in prep) follows them.  With cols > 0
 * (the layer's bias, [cols] over y's innermost dimension) also *db_plan:
 * the same pass summing the masked rows into the bias gradient (RELU_BWD's
 * out1, ABI 2.9), or NULL where the device has not got it (the layer then
 * runs BIAS_GRAD). */
static inline kiln_status prep_act_bwd_db(const struct kiln_host *h, struct kiln_layer *l,
					  struct kiln_device *dev, const struct kiln_tensor_desc *y,
					  int64_t cols, void **plan, void **db_plan, size_t *front,
					  size_t *ws)
{
	*plan = *db_plan = NULL;
	*front = 0;
	if (!l->act_fused || l->fuse_act != 1 + KILN_ACT_RELU)
		return KILN_OK;
	struct kiln_op op;
	kiln_status st;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_RELU_BWD;
	op.n_in = 2;
	op.n_out = 2;
	op.in[0] = op.in[1] = op.out[0] = *y;
	f32_desc(&op.out[1], cols, 0, 0);
	*front = (kiln_tensor_bytes(y) + 63) & ~(size_t)63; /* ALIGN64 */
	if (cols > 0 && (st = prep(h, l, dev, &op, db_plan, ws)) != KILN_ENOTSUP && st)
		return st;
	op.n_out = 1; /* for a step without the weights' gradients, or the device's fallback */
	return prep(h, l, dev, &op, plan, ws);
}

static inline kiln_status prep_act_bwd(const struct kiln_host *h, struct kiln_layer *l,
				       struct kiln_device *dev, const struct kiln_tensor_desc *y,
				       void **plan, size_t *front, size_t *ws)
{
	void *none;
	return prep_act_bwd_db(h, l, dev, y, 0, plan, &none, front, ws);
}

/* Before the layer's backward: r2 = r, or with the fused ReLU's backward
 * run (plan non-NULL), r2's dy the masked gradient at the front of the
 * workspace and its workspace the rest.  db non-NULL: plan is
 * prep_act_bwd_db's *db_plan and writes the bias gradient there too. */
static inline kiln_status run_act_bwd_db(const struct kiln_host *h, const struct kiln_layer_run *r,
					 void *plan, size_t front, void *db, struct kiln_layer_run *r2)
{
	*r2 = *r;
	/* no gradient reaches the layer (a frozen first layer: nothing wants
	 * its output's gradient): nothing to mask, and the layer's own
	 * backward finds no dw or dx to write */
	if (!plan || !r->dy)
		return KILN_OK;
	r2->dy = r->workspace;
	r2->workspace = (char *)r->workspace + front;
	r2->workspace_bytes = r->workspace_bytes - front;
	struct kiln_op_args a = { .in = { r->y, r->dy }, .out = { r->workspace, db },
				  .workspace = r2->workspace, .workspace_bytes = r2->workspace_bytes };
	return h->device_run(r->dev, plan, &a, r->stream);
}

static inline kiln_status run_act_bwd(const struct kiln_host *h, const struct kiln_layer_run *r,
				      void *plan, size_t front, struct kiln_layer_run *r2)
{
	return run_act_bwd_db(h, r, plan, front, NULL, r2);
}

/* Run `plan` on a's buffers with the layer's workspace. */
static inline kiln_status run_op(const struct kiln_host *h, const struct kiln_layer_run *r,
				 void *plan, struct kiln_op_args *a)
{
	a->workspace = r->workspace;
	a->workspace_bytes = r->workspace_bytes;
	return h->device_run(r->dev, plan, a, r->stream);
}

/* The backward into input k's gradient from a's inputs: pair[0] writes
 * dx[k], pair[1] adds into it (dx_accum); nothing when no gradient is
 * wanted. */
static inline kiln_status run_dx(const struct kiln_host *h, const struct kiln_layer_run *r,
				 void *const pair[2], int k, struct kiln_op_args *a)
{
	if (!r->dx[k])
		return KILN_OK;
	a->out[0] = r->dx[k];
	return run_op(h, r, pair[r->dx_accum[k] ? 1 : 0], a);
}

/* Input k's gradient is dy's storage (a layer with kiln_layer.dx_is_dy,
 * when the planner shares it): its copy of dy is already there. */
static inline int dx_shares_dy(const struct kiln_layer_run *r, int k)
{
	return r->dx[k] == r->dy && !r->dx_accum[k];
}

/* Parameter k as the matrix products read it: the compute-dtype copy with
 * low-precision compute, else the f32 parameter. */
static inline const void *w_compute(const struct kiln_layer_run *r, int k)
{
	return r->wc[k] ? r->wc[k] : r->w[k];
}

/* d with dtype dt (a weight's descriptor as the products read it). */
static inline struct kiln_tensor_desc with_dtype(struct kiln_tensor_desc d, int dt)
{
	d.dtype = dt;
	return d;
}


#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/* One integer of a pair: spaces, digits (a sign allowed), spaces; *end
 * past them.  -1 when no digits were read (an empty number, as in "1,")
 * or the number overflows. */
static inline int pair_number(const char *v, char **end, long long *out)
{
	while (*v == ' ' || *v == '\t')
		v++;
	const char *d = v + (*v == '-' || *v == '+');
	if (*d < '0' || *d > '9')
		return -1;
	errno = 0;
	*out = strtoll(v, end, 10);
	if (errno)
		return -1;
	while (**end == ' ' || **end == '\t')
		(*end)++;
	return 0;
}

/* A pair of integers from "3" or "3,5" (KILN_KEY_INTS); def when unset.
 * Each number must be there: "1," and ",1" are errors, not (1, 0) and
 * (0, 1) (strtoll reads nothing as 0). */
static inline kiln_status get_pair(const struct kiln_host *h, const struct kiln_config *cfg,
				   const char *sec, const char *key, int64_t def, int64_t out[2])
{
	const char *v = h->config_get(cfg, sec, key);
	out[0] = out[1] = def;
	if (!v)
		return KILN_OK;
	char *end;
	long long a, b;
	int bad = pair_number(v, &end, &a);
	b = a;
	if (!bad && *end == ',')
		bad = pair_number(end + 1, &end, &b);
	if (bad || *end)
		return h->error(KILN_ECONFIG, "%s: [%s] %s = '%s': expected N or N,M (integers)",
				h->config_where(cfg, sec, key), sec, key, v);
	out[0] = a;
	out[1] = b;
	return KILN_OK;
}

/* dst (n elements, desc d) += src: how a layer adds a result into a
 * gradient that another consumer already wrote, when the device op that
 * computes it cannot accumulate. */
static inline kiln_status prep_acc(const struct kiln_host *h, struct kiln_layer *l,
				   struct kiln_device *dev, const struct kiln_tensor_desc *d,
				   void **plan)
{
	struct kiln_op op;
	op_init(&op, KILN_OP_SCALE, 1, 1);
	op.flags = KILN_OPF_ACCUMULATE;
	op.in[0] = op.out[0] = *d;
	op.f[0] = 1.0;
	return prep(h, l, dev, &op, plan, NULL);
}

/* Run `plan` writing out0 = target, or, when `accum`, writing out0 to the
 * scratch at the start of the workspace and adding it into target; the
 * op's own workspace follows the scratch (scratch_bytes, 64-aligned).
 * A layer prepares the scratch and acc_plan only where its input has
 * another consumer (kiln_layer_dx_shared): an add asked of a plan
 * without them is the planner's error. */
static inline kiln_status run_maybe_acc(const struct kiln_host *h, const struct kiln_layer_run *r,
					void *plan, struct kiln_op_args *a, void *target, int accum,
					void *acc_plan, size_t scratch_bytes)
{
	if (accum && !acc_plan)
		return h->error(KILN_EINTERNAL, "a backward asked to add into an input's gradient its plan prepared no add for (kiln_layer_dx_shared)");
	size_t off = ALIGN64(scratch_bytes);
	a->workspace = (char *)r->workspace + off;
	a->workspace_bytes = r->workspace_bytes > off ? r->workspace_bytes - off : 0;
	a->out[0] = accum ? r->workspace : target;
	kiln_status st = h->device_run(r->dev, plan, a, r->stream);
	if (st || !accum)
		return st;
	struct kiln_op_args b = { .in = { r->workspace }, .out = { target } };
	return h->device_run(r->dev, acc_plan, &b, r->stream);
}

static inline int is_nhwc(const struct kiln_tensor_desc *d)
{
	return d->ndim == 4 && d->layout == KILN_NHWC;
}

/* Reading a channels-last input in PyTorch's C, H, W order (flatten, linear):
 * `to` copies x into NCHW; from[0..1] write or add an NCHW gradient back
 * into x's layout (from NULL: the forward only, for evaluation). */
static inline kiln_status prep_nchw_reorders(const struct kiln_host *h, struct kiln_layer *l,
					     struct kiln_device *dev,
					     const struct kiln_tensor_desc *x, void **to,
					     void *from[2], size_t *ws)
{
	struct kiln_op op;
	kiln_status st;
	struct kiln_tensor_desc nchw = *x;
	nchw.layout = KILN_NCHW;
	op_init(&op, KILN_OP_REORDER, 1, 1);
	op.in[0] = *x, op.out[0] = nchw;
	if ((st = prep(h, l, dev, &op, to, ws)) || !from)
		return st;
	op.in[0] = nchw, op.out[0] = *x;
	return prep_pair(h, l, dev, &op, from, ws);
}

/* 4-d activation descriptor N, C, H, W in `layout`. */
static inline void act4(struct kiln_tensor_desc *d, int64_t n, int64_t c, int64_t hh, int64_t w,
			int layout)
{
	int64_t dims[4] = { n, c, hh, w };
	kiln_tensor_desc_init(d, KILN_F32, 4, dims);
	d->layout = layout;
}

#define LAYER_DESCRIPTOR(var, nm, sum, opsv, keysv)                                       \
	const struct kiln_plugin var = {                                                  \
		.abi_major = KILN_ABI_MAJOR, .abi_minor = KILN_ABI_MINOR,                 \
		.kind = KILN_PLUGIN_LAYER, .name = nm, .summary = sum, .ops = &opsv,      \
		.keys = keysv, .probe = NULL,                                             \
	}

/* A built-in layer: its ops table (every member written, NULL where it has
 * none) and its descriptor kiln_layer_<var>, the row layers.c lists. */
#define LAYER(var, nm, sum, keysv, min_in, max_in, configure_fn, infer_fn, plan_fn, forward_fn, \
	      backward_fn, destroy_fn)                                                       \
	static const struct kiln_layer_ops var##_ops = {                                      \
		.version = KILN_LAYER_OPS_VERSION, .min_inputs = min_in,                     \
		.max_inputs = max_in, .configure = configure_fn, .infer = infer_fn,          \
		.plan = plan_fn, .forward = forward_fn, .backward = backward_fn,             \
		.destroy = destroy_fn,                                                       \
	};                                                                                    \
	LAYER_DESCRIPTOR(kiln_layer_##var, nm, sum, var##_ops, keysv)

/* The passes a family of layers shares (act.h, pool.h): family_infer,
 * _plan, _forward and _backward, as a layer's ops table wants them. */
#define FAMILY_PASSES(family)                                                              \
	kiln_status family##_infer(const struct kiln_host *h, struct kiln_layer *l);         \
	kiln_status family##_plan(const struct kiln_host *h, struct kiln_layer *l,           \
				  struct kiln_device *dev, size_t *ws);                       \
	kiln_status family##_forward(const struct kiln_host *h, struct kiln_layer *l,        \
				     const struct kiln_layer_run *r);                         \
	kiln_status family##_backward(const struct kiln_host *h, struct kiln_layer *l,       \
				      const struct kiln_layer_run *r)

/* A layer of a family that shares one implementation (act.c, pool.c,
 * softmax_xent.c): the family's passes (FAMILY_PASSES) and a configure
 * that calls family_configure(h, l, cfg, sec, ...) with the layer's own
 * arguments (its kind). */
#define FAMILY_LAYER(var, nm, summary, keys, family, ...)                                  \
	static kiln_status var##_configure(const struct kiln_host *h, struct kiln_layer *l, \
					   const struct kiln_config *cfg, const char *sec)  \
	{                                                                                 \
		return family##_configure(h, l, cfg, sec, __VA_ARGS__);                   \
	}                                                                                 \
	LAYER(var, nm, summary, keys, 1, 1, var##_configure, family##_infer, family##_plan,   \
	      family##_forward, family##_backward, layer_destroy)

#endif
