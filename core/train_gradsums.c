/* core/train_gradsums.c - the gradients' non-finite check (and clip
 * norm) taken where backward makes them.  GRAD_CLIP's first pass is the
 * f32 sum of squares of each 1024-element block of the flat gradient; run
 * before the optimizer it re-reads every gradient from the last-level
 * cache (the MLP benchmark's 535,818: 65 us of a 2.77 ms one-thread
 * step).  Here each range of blocks is summed (KILN_OP_GRAD_SUMSQ, ABI
 * 2.32) right after the backward of the layer that completes it, while
 * its gradients are still in the core's cache, and GRAD_CLIP adds the
 * sums it is given: the same norm, finite flag, skip and clip, bit for
 * bit (tests/check_device_optim: test_grad_sumsq_*; tests/grad_sums.sh).
 *
 * Only where the gradients are final when their layer's backward ends:
 * one process (no DDP allreduce, ZeRO-1 or pipeline after it), no
 * accumulation (the later micro-steps add to them), no loss scaling
 * (UNSCALE divides by the scale first), no gradient hook at the step
 * (kiln_set_grad_hook may change them), no other backward hook.  Every
 * other run, or a device that refuses the ops, keeps the one GRAD_CLIP
 * pass.  See train.h. */
#include "train.h"

#include <limits.h> /* INT_MAX */
#include <stdlib.h> /* calloc, free */

enum { SUMS_BLK = 1024 }; /* kiln/ops.h: GRAD_SUMSQ's blocks */

/* One range of blocks [k0, k1) completed by layer `layer`'s backward. */
struct grad_sums_range {
	int layer;
	int64_t k0, k1;
	void *plan; /* KILN_OP_GRAD_SUMSQ over it */
};

/* The model's backward hook: after layer i's backward, the sums of the
 * blocks it completes.  Counted, so the step uses them only when every
 * range was summed in this step's backward. */
static kiln_status sums_hook(void *user, int layer, void *stream)
{
	struct trainer *t = user;
	const float *g = t->m->grads_d;
	for (int r = 0; r < t->n_sums; r++) {
		const struct grad_sums_range *s = &t->sums[r];
		if (s->layer != layer)
			continue;
		struct kiln_op_args a = { .in = { g }, .out = { t->sums_d } };
		trainer_label(t, t->m->layers[layer].name, KILN_PHASE_BACKWARD);
		kiln_status st = kiln_device_run(t->dev, s->plan, &a, stream);
		trainer_label(t, NULL, 0);
		if (st)
			return kiln_error_wrap(st, "the gradients' block sums after layer '%s'",
					       t->m->layers[layer].name);
		t->sums_run++;
	}
	return KILN_OK;
}

/* ready[k] = the layer whose backward completes block k of nb: the lowest
 * grad_layer of the trainable tensors in it (backward runs the layers in
 * descending order, as the DDP buckets' ready_layer, core/dist.c); a
 * block of padding alone takes its neighbour's (nothing writes it). */
static void sums_ready(const struct kiln_model *m, int64_t nb, int *ready)
{
	for (int64_t k = 0; k < nb; k++)
		ready[k] = INT_MAX;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (!p->trainable || p->buffer || p->numel <= 0 || p->off >= m->n_trainable)
			continue;
		const int64_t lo = (int64_t)p->off / SUMS_BLK;
		const int64_t hi = ((int64_t)p->off + p->numel - 1) / SUMS_BLK;
		for (int64_t k = lo; k <= hi && k < nb; k++)
			if (p->grad_layer < ready[k])
				ready[k] = p->grad_layer;
	}
	for (int64_t k = 1; k < nb; k++)
		if (ready[k] == INT_MAX)
			ready[k] = ready[k - 1];
	for (int64_t k = nb - 1; k > 0; k--)
		if (ready[k - 1] == INT_MAX)
			ready[k - 1] = ready[k];
}

/* The ranges of equal ready layers, each with its GRAD_SUMSQ plan. */
static kiln_status sums_ranges(struct trainer *t, int64_t n, int64_t nb, const int *ready)
{
	int count = 0;
	for (int64_t k = 0; k < nb; k++)
		count += k == 0 || ready[k] != ready[k - 1];
	if (!(t->sums = calloc((size_t)count, sizeof *t->sums)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int64_t k = 0; k < nb; k++) {
		if (k && ready[k] == ready[k - 1]) {
			t->sums[t->n_sums - 1].k1 = k + 1;
			continue;
		}
		t->sums[t->n_sums++] = (struct grad_sums_range){ ready[k], k, k + 1, NULL };
	}
	for (int r = 0; r < t->n_sums; r++) {
		struct kiln_op op;
		kiln_op_grad_sumsq(&op, n, t->sums[r].k0, t->sums[r].k1);
		kiln_status st = kiln_device_prepare(t->dev, &op, &t->sums[r].plan, NULL);
		if (st)
			return st;
	}
	return KILN_OK;
}

/* GRAD_CLIP as t->clip, over the trainables, taking the block sums */
static kiln_status sums_clip(struct trainer *t, int64_t n, int64_t nb)
{
	struct kiln_op op;
	kiln_op_grad_clip(&op, n);
	op.n_in = 2;
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, &nb);
	op.f[0] = t->tc.clip_norm;
	op.f[1] = t->tc.clip_value;
	return kiln_device_prepare(t->dev, &op, &t->clip_sums, NULL);
}

void trainer_sums_free(struct trainer *t)
{
	for (int r = 0; r < t->n_sums; r++)
		kiln_device_plan_free(t->dev, t->sums[r].plan);
	free(t->sums);
	t->sums = NULL;
	t->n_sums = 0;
	kiln_device_plan_free(t->dev, t->clip_sums);
	t->clip_sums = NULL;
	kiln_device_free(t->dev, t->sums_d);
	t->sums_d = NULL;
	if (t->m && t->m->bwd_hook == sums_hook) {
		t->m->bwd_hook = NULL;
		t->m->bwd_user = NULL;
	}
}

const char *kiln_grad_sums_why_not(const struct kiln_model *m, int shared, int pipe, int64_t acc)
{
	return shared || pipe ? "the gradients are averaged or cut after the backward"
	       : acc > 1      ? "[train] accumulate > 1"
	       : m->scaler_d  ? "loss scaling (the gradients are unscaled first)"
	       : m->bwd_hook  ? "another backward hook"
	       : trainer_grad_fn ? "a gradient hook is installed (kiln_set_grad_hook)"
	       : !kiln_device_has_op(m->dev, KILN_OP_GRAD_SUMSQ) ? "the device has no GRAD_SUMSQ"
							  : NULL;
}

kiln_status trainer_sums_open(struct trainer *t)
{
	struct kiln_model *m = t->m;
	const int64_t n = (int64_t)m->n_trainable, nb = (n + SUMS_BLK - 1) / SUMS_BLK;
	if (!t->clip || !nb)
		return KILN_OK;
	const char *why = kiln_grad_sums_why_not(m, t->dist != NULL, t->pipe != NULL, t->acc);
	if (why) {
		kiln_log(KILN_LOG_DEBUG, "train", "the gradients' check is one pass before the optimizer: %s", why);
		return KILN_OK;
	}
	int *ready = malloc(sizeof *ready * (size_t)nb);
	if (!ready)
		return kiln_error(KILN_ENOMEM, "out of memory");
	sums_ready(m, nb, ready);
	kiln_status st = sums_ranges(t, n, nb, ready);
	free(ready);
	if (!st)
		st = sums_clip(t, n, nb);
	/* a device that refuses either op (an outside 2.32 device without
	 * has_op may answer KILN_EINVAL or KILN_EINTERNAL, not KILN_ENOTSUP)
	 * keeps the one pass; out of memory stops the run, as elsewhere */
	if (st && st != KILN_ENOMEM) {
		kiln_log(KILN_LOG_DEBUG, "train", "the gradients' check is one pass before the optimizer: %s",
			 kiln_last_error());
		kiln_clear_error();
		trainer_sums_free(t);
		return KILN_OK;
	}
	if (st || (st = kiln_device_alloc_named(t->dev, (size_t)nb * sizeof(float), (void **)&t->sums_d,
						"the gradients' block sums (their non-finite check)"))) {
		trainer_sums_free(t);
		return st;
	}
	m->bwd_hook = sums_hook;
	m->bwd_user = t;
	kiln_log(KILN_LOG_DEBUG, "train", "the gradients' check: %d range(s) of %lld blocks summed in the backward",
		 t->n_sums, (long long)nb);
	return KILN_OK;
}

int trainer_sums_taken(struct trainer *t)
{
	const int taken = t->clip_sums && t->n_sums && t->sums_run == t->n_sums &&
			  t->m->bwd_hook == sums_hook && !trainer_grad_fn;
	t->sums_run = 0;
	return taken;
}
