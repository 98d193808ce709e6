/* core/layers/bn_sync.c - synchronised batch normalisation (PyTorch's
 * SyncBatchNorm), the training path of batchnorm.c when [dist] sync_bn
 * makes kiln_layer.sync_ranks > 1.
 *
 * Forward: BN_STATS gives this rank's per-channel (mean, biased var);
 * host->group_allgather collects every rank's into [G,2,C]; BN_APPLY
 * merges them (equal counts per rank) into the statistics of the global
 * batch, normalises and updates the running statistics from them, so
 * every rank's running statistics stay identical.  Backward:
 * BN_BWD_REDUCE gives this rank's (sum dy*xhat, sum dy), which are also
 * its dgamma and dbeta (averaged across ranks with the other gradients,
 * as in DDP); host->group_allreduce sums the two over the ranks and
 * BN_BWD_APPLY computes dx from the global sums.  The collectives run on
 * the core's comm stream, ordered after and before the compute stream's
 * work; nothing synchronises the host.
 *
 * Workspace, from byte `off`: [this rank's 2C floats | G*2C floats],
 * 64-aligned, then the ops' own workspace.  In backward the first 2C
 * floats hold the sums being allreduced.
 */
#include "bn_sync.h"

struct bn_sync {
	int64_t C, G;
	size_t off, bytes; /* the sync buffers: workspace [off, off + bytes) */
	void *stats, *apply, *replay, *reduce, *bwd;
};

kiln_status bn_sync_plan(const struct kiln_host *h, struct kiln_layer *l, struct kiln_device *dev,
			 const struct kiln_tensor_desc *x, double eps, double momentum, size_t off,
			 struct bn_sync **out, size_t *ws)
{
	struct bn_sync *s = calloc(1, sizeof *s);
	struct kiln_op op;
	struct kiln_tensor_desc c, st, all;
	kiln_status e;
	size_t w = 0;
	if (!s)
		return h->error(KILN_ENOMEM, "out of memory");
	*out = s;
	if (h->version < 5 || !h->group_allreduce || !h->group_allgather)
		return h->error(KILN_EPLUGIN, "layer '%s': sync_bn needs host table version 5",
				l->name);
	s->C = x->dims[1];
	s->G = l->sync_ranks;
	s->off = off;
	s->bytes = ALIGN64((size_t)(s->G + 1) * 2 * (size_t)s->C * sizeof(float));
	f32_desc(&c, s->C, 0, 0);
	f32_desc(&st, 2, s->C, 0);
	f32_desc(&all, 2 * s->G, s->C, 0);

	op_init(&op, KILN_OP_BN_STATS, 1, 1);
	op.in[0] = *x, op.out[0] = st;
	if ((e = prep(h, l, dev, &op, &s->stats, &w)))
		return e;
	op_init(&op, KILN_OP_BN_APPLY, 4, 4);
	op.in[0] = op.out[0] = *x;
	op.in[1] = op.in[2] = op.out[2] = op.out[3] = c;
	op.in[3] = all, op.out[1] = st;
	op.i[0] = s->G, op.f[0] = eps, op.f[1] = momentum;
	if ((e = prep(h, l, dev, &op, &s->apply, &w)))
		return e;
	op.f[1] = 0; /* a recomputed forward leaves the running statistics */
	if ((e = prep(h, l, dev, &op, &s->replay, &w)))
		return e;
	op_init(&op, KILN_OP_BN_BWD_REDUCE, 3, 3);
	op.in[0] = op.in[1] = *x, op.in[2] = st;
	op.out[0] = op.out[1] = c, op.out[2] = st;
	if ((e = prep(h, l, dev, &op, &s->reduce, &w)))
		return e;
	op_init(&op, KILN_OP_BN_BWD_APPLY, 5, 1);
	op.in[0] = op.in[1] = op.out[0] = *x;
	op.in[2] = c, op.in[3] = op.in[4] = st;
	op.i[0] = s->G;
	if ((e = prep(h, l, dev, &op, &s->bwd, &w)))
		return e;
	if (off + s->bytes + w > *ws)
		*ws = off + s->bytes + w;
	return KILN_OK;
}

static void ops_ws(struct kiln_op_args *a, const struct bn_sync *s, const struct kiln_layer_run *r)
{
	size_t o = s->off + s->bytes;
	a->workspace = (char *)r->workspace + o;
	a->workspace_bytes = r->workspace_bytes > o ? r->workspace_bytes - o : 0;
}

kiln_status bn_sync_forward(const struct kiln_host *h, struct bn_sync *s,
			    const struct kiln_layer_run *r)
{
	float *mine = (float *)((char *)r->workspace + s->off), *all = mine + 2 * s->C;
	struct kiln_op_args a = { .in = { r->x[0] }, .out = { mine } };
	kiln_status st;
	ops_ws(&a, s, r);
	if ((st = h->device_run(r->dev, s->stats, &a, r->stream)) ||
	    (st = h->group_allgather(r->group, mine, all, (size_t)(2 * s->C), KILN_F32, r->stream)))
		return st;
	a = (struct kiln_op_args){ .in = { r->x[0], r->w[0], r->w[1], all },
				   .out = { r->y, r->saved, r->w[2], r->w[3] } };
	ops_ws(&a, s, r);
	return h->device_run(r->dev, r->recompute ? s->replay : s->apply, &a, r->stream);
}

kiln_status bn_sync_backward(const struct kiln_host *h, struct bn_sync *s,
			     const struct kiln_layer_run *r, void *dg, void *db, void *dx,
			     int accum, void *acc)
{
	float *sums = (float *)((char *)r->workspace + s->off);
	struct kiln_op_args a = { .in = { r->x[0], r->dy, r->saved }, .out = { dg, db, sums } };
	kiln_status st;
	ops_ws(&a, s, r);
	if ((st = h->device_run(r->dev, s->reduce, &a, r->stream)))
		return st;
	if (!r->dx[0])
		return KILN_OK;
	if ((st = h->group_allreduce(r->group, sums, (size_t)(2 * s->C), KILN_F32, KILN_REDUCE_SUM,
				     r->stream)))
		return st;
	a = (struct kiln_op_args){ .in = { r->x[0], r->dy, r->w[0], r->saved, sums } };
	/* run_maybe_acc puts the op's workspace after its scratch: all of ours */
	return run_maybe_acc(h, r, s->bwd, &a, dx, accum, acc, s->off + s->bytes);
}

void bn_sync_free(struct bn_sync *s)
{
	free(s); /* its plans are in the layer's list (util.h) */
}
