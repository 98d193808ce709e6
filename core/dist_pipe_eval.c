/* core/dist_pipe_eval.c - [dist] pipeline = P: an evaluation run per stage
 * (docs/pipeline.md, "Parameters and gradients per stage").
 *
 * A rank holding its stage's parameters alone (kiln_dist_pipe_hold) does
 * not gather the whole model to evaluate it: each batch's forward runs as
 * training's does, stage by stage.  The evaluation plans are staged (the
 * tensors crossing a cut get a receive buffer on the reading stage);
 * stage s's rank receives them from the earlier stages' ranks, runs its
 * layers and sends what later stages read.  The hand-offs go through the
 * pipeline's rank transport (core/pipe_rank.c), named by the evaluation's
 * batch, on the compute stream: a forward alone is a chain from stage 0
 * to the last, so no send waits on a receive that waits on it (sends are
 * neither staged nor paired: kiln_pipe_rank_eval_send).  The evaluation
 * plans have training's crossing tensors (kiln_pipe_eval_check, at
 * set-up), so each receive has a slot of the transport to be marked in.
 * The loss layer, on the last stage, adds the batch's loss and correct
 * sums and the rows it counted to the metric sums (kiln_layer.eval_sums);
 * after the set they are summed over the pipe,
 * so every rank reads the last stage's (the others' are zero: each sum
 * equals one process's). */
#include "dist_impl.h"
#include "pipeline.h"

int kiln_dist_pipe_eval_staged(const struct kiln_dist *d)
{
	return d && d->pipe_P > 1 && d->m && d->m->held;
}

/* Layers [*lo, *hi) of stage s (layers are placed in file order). */
static void stage_layers(const struct kiln_model *m, int s, int *lo, int *hi)
{
	*lo = m->n_layers, *hi = 0;
	for (int i = 0; i < m->n_layers; i++)
		if (kiln_pipe_stage(m, i) == s) {
			if (i < *lo)
				*lo = i;
			*hi = i + 1;
		}
}

/* The compute stream after the comm stream's work (the last step's
 * buckets), as before any collective on it. */
static kiln_status after_comm(struct kiln_dist *d, void *compute)
{
	kiln_status st = KILN_OK;
	if (d->comm_stream && !(st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)))
		st = kiln_device_stream_wait(d->dev, compute, d->ready);
	return st;
}

/* The crossing tensors of p this rank's stage receives from earlier
 * stages into their receive buffers (out = 0) or sends to later stages
 * (1), on the compute stream, by pp's transport (kiln_pipe_eval_recv,
 * kiln_pipe_eval_send): receives marked, and both named by stage, rank,
 * the evaluation's batch `batch` and the tensor. */
static kiln_status hand_off(struct kiln_dist *d, struct kiln_pipe *pp, struct kiln_plan *p,
			    const void *x, long long batch, int out, void *compute)
{
	const int s = d->pipe_stage;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *xf = &p->xfer[e];
		kiln_status st;
		if ((out ? xf->from : xf->to) != s)
			continue;
		st = out ? kiln_pipe_eval_send(pp, xf->to, e, batch, kiln_plan_store_ptr(p, xf->src, x),
					       xf->bytes, compute)
			 : kiln_pipe_eval_recv(pp, xf->from, e, batch,
					       kiln_plan_store_ptr(p, xf->recv, x), xf->bytes, compute);
		if (st)
			return kiln_dist_explain(d, st);
	}
	return KILN_OK;
}

kiln_status kiln_dist_pipe_forward(struct kiln_dist *d, struct kiln_pipe *pp, struct kiln_plan *p,
				   long long batch, const void *x, const void *labels,
				   void *metrics, void *compute, kiln_status *own)
{
	const int s = d->pipe_stage;
	int lo, hi;
	kiln_status st;
	stage_layers(p->m, s, &lo, &hi);
	if ((st = after_comm(d, compute)) || (st = hand_off(d, pp, p, x, batch, 0, compute)))
		return st;
	/* (failed, now or before: the sends still go, of what the buffers
	 * hold, so that no later stage waits for them) */
	if (!*own && lo < hi && (*own = kiln_plan_forward_range(p, lo, hi, x, labels, metrics, compute)))
		*own = kiln_error_wrap(*own, "pipeline stage %d, evaluating batch %lld", s, batch);
	return hand_off(d, pp, p, x, batch, 1, compute);
}

kiln_status kiln_dist_pipe_eval_sums(struct kiln_dist *d, float *metrics, int n, void *compute)
{
	kiln_status st = after_comm(d, compute);
	if (!st)
		st = d->ops->allreduce(d->pctx, metrics, (size_t)n, KILN_F32, KILN_REDUCE_SUM, compute,
				       NULL);
	return st ? kiln_dist_explain(d, kiln_error_wrap(st, "rank %d (pipeline stage %d): the evaluation's sums over the pipe",
							  d->env.rank, d->pipe_stage))
		  : st;
}
