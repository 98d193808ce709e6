/* core/dist_pipe.c - [dist] pipeline = P: a pipeline's stages on ranks
 * combined with data parallelism (docs/pipeline.md, "Stages on ranks").
 * The world of P x D ranks is split (comm ops version 5) into D pipes of
 * P ranks, which move the crossing tensors (core/pipe_rank.c), and P
 * data-parallel groups of D ranks, one per stage, over which DDP's
 * buckets (core/dist.c) average that stage's gradients.  A rank keeps
 * only its stage's state current: its optimizer steps its stage's slice
 * alone, with the state of that slice alone (kiln_dist_pipe_shard);
 * kiln_dist_pipe_gather brings every stage's to every rank before
 * anything is written or evaluated. */
#include "dist_impl.h"
#include "pipeline.h"

/* The measure of this stage's gradient norm: GRAD_CLIP over its slice,
 * clipping nothing; and the device buffer of the norms. */
static kiln_status prepare_norms(struct kiln_dist *d)
{
	const int s = d->pipe_stage;
	const int64_t n = (int64_t)(d->pipe_hi[s] - d->pipe_lo[s]);
	kiln_status st;
	if ((st = kiln_device_alloc_named(d->dev, (2 * KILN_PIPE_MAX_STAGES + 4) * sizeof(float),
					  (void **)&d->pipe_norms,
					  "the pipeline's gradient norms (one a stage)")))
		return st;
	d->pipe_norms_new = 1;
	if (n <= 0)
		return KILN_OK;
	struct kiln_op op;
	kiln_op_grad_clip(&op, n);
	return kiln_device_prepare(d->dev, &op, &d->pipe_measure, NULL);
}

kiln_status kiln_dist_pipe_split(struct kiln_dist *d, const struct kiln_config *cfg, int P)
{
	const int r = d->env.rank, W = d->env.world;
	int pr = 0, pw = 0, gr = 0, gw = 0;
	kiln_status st;
	const char *tl = kiln_config_get(cfg, "plugin.mpi", "thread_level");
	if (d->pipe_P)
		return KILN_OK;
	if (W % P)
		return kiln_error(KILN_ECONFIG, "%s: [dist] pipeline = %d does not divide the world of %d ranks (world = pipeline x data-parallel ranks)",
				  kiln_config_where(cfg, "dist", "pipeline"), P, W);
	if (!strcmp(d->plugin->name, "mpi") && (!tl || strcmp(tl, "multiple")))
		return kiln_error(KILN_ECONFIG, "%s: [dist] pipeline on kiln-mpi needs [plugin.mpi] thread_level = multiple (a stage's receives and the transport's sends run on two threads)",
				  kiln_config_where(cfg, "dist", "pipeline"));
	if (d->ops->version < 5 || !d->ops->split)
		return kiln_error(KILN_ENOTSUP, "[dist] pipeline: comm plugin '%s' cannot make sub-communicators (split, comm ops version 5)",
				  d->plugin->name);
	if ((st = d->ops->split(d->ctx, r / P, r % P, &d->pctx, &pr, &pw)) ||
	    (st = d->ops->split(d->ctx, r % P, r / P, &d->gctx, &gr, &gw)))
		return kiln_error_wrap(st, "rank %d of %d: [dist] pipeline = %d: splitting the communicator",
				       r, W, P);
	if (pr != r % P || pw != P || gr != r / P || gw != W / P)
		return kiln_error(KILN_EINTERNAL, "rank %d of %d: the split gave pipe rank %d of %d and group rank %d of %d",
				  r, W, pr, pw, gr, gw);
	d->pipe_P = P;
	d->pipe_D = W / P;
	d->pipe_stage = r % P;
	{
		const char *desc = d->ops->describe ? d->ops->describe(d->gctx) : NULL;
		kiln_log(KILN_LOG_INFO, "dist", "rank %d of %d: pipeline stage %d of %d in pipe %d of %d; the stage's gradients averaged over its %d ranks%s%s",
			 r, W, r % P, P, r / P, W / P, W / P, desc ? ": " : "", desc ? desc : "");
	}
	return KILN_OK;
}

kiln_status kiln_dist_pipe_open(struct kiln_dist *d, const struct kiln_config *cfg, int P,
				const size_t *lo, const size_t *hi, const struct kiln_comm_ops **ops,
				void **pcomm, int *stage, int *pipe, int *D)
{
	kiln_status st;
	if ((st = kiln_dist_pipe_split(d, cfg, P)))
		return st;
	if (!(d->pipe_lo = calloc((size_t)P, sizeof(size_t))) ||
	    !(d->pipe_hi = calloc((size_t)P, sizeof(size_t))))
		return kiln_error(KILN_ENOMEM, "out of memory");
	memcpy(d->pipe_lo, lo, (size_t)P * sizeof(size_t));
	memcpy(d->pipe_hi, hi, (size_t)P * sizeof(size_t));
	if ((st = prepare_norms(d)))
		return st;
	*ops = d->ops;
	*pcomm = d->pctx;
	*stage = d->pipe_stage;
	*pipe = d->env.rank / P;
	*D = d->pipe_D;
	return KILN_OK;
}

/* Broadcast n bytes at p from world rank `root` (compute stream). */
static kiln_status from_rank(struct kiln_dist *d, void *p, size_t n, int root, void *compute,
			     const char *what, int s)
{
	if (!n)
		return KILN_OK;
	kiln_status st = d->ops->broadcast(d->ctx, p, n, KILN_U8, root, compute, NULL);
	return st ? kiln_error_wrap(st, "gathering stage %d's %s from rank %d", s, what, root) : st;
}

kiln_status kiln_dist_pipe_shard(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	if (!d || !d->pipe_P || !d->m->n_trainable)
		return KILN_OK;
	/* (ZeRO-1 shards the stage's slice over its group: kiln_dist_zero_init;
	 * the parameters are cut all the same) */
	if (d->zero)
		return kiln_dist_pipe_cut_params(d, compute);
	struct kiln_model *m = d->m;
	const int me = d->pipe_stage, slots = m->state_slots;
	const size_t N = m->n_trainable, lo = d->pipe_lo[me];
	const size_t n = d->pipe_hi[me] > lo ? d->pipe_hi[me] - lo : 0;
	if (m->optim_info.shard == KILN_OPTIM_SHARD_NONE) {
		kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): [train] optimizer = %s reads whole tensors through offsets of the whole model: it steps every stage's parameters here, with the whole model's state",
			 d->env.rank, me, m->optim_name);
		return KILN_OK;
	}
	if ((n && (st = kiln_model_optim_plan(m, n, &d->pipe_plan))) ||
	    (n && slots &&
	     (st = kiln_device_alloc(d->dev, (size_t)slots * n * sizeof(float),
				     (void **)&d->pipe_state))))
		return st;
	/* this stage's slice of the (broadcast or resumed) state, the rest
	 * freed; or zeros (held since start-up: there is none) */
	if (d->pipe_state && !m->state_d &&
	    (st = kiln_dist_pipe_zero(d, d->pipe_state, (size_t)slots * n, compute)))
		return st;
	for (int k = 0; d->pipe_state && m->state_d && k < slots; k++)
		if ((st = kiln_device_copy_async(d->dev, d->pipe_state + (size_t)k * n,
						 m->state_d + (size_t)k * N + lo, n * sizeof(float),
						 KILN_COPY_D2D, compute)))
			return st;
	if ((st = dist_drop_whole_state(d, compute)))
		return st;
	d->pipe_own = 1;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): the optimizer steps the stage's %zu of %zu floats; optimizer state %.3g MiB instead of %.3g MiB",
		 d->env.rank, me, n, N, (double)((size_t)slots * n * sizeof(float)) / 1048576.0,
		 (double)((size_t)slots * N * sizeof(float)) / 1048576.0);
	/* the parameters too, where the gradients were cut (dist_pipe_mem.c) */
	return kiln_dist_pipe_cut_params(d, compute);
}

int kiln_dist_pipe_owns(const struct kiln_dist *d)
{
	return d && d->pipe_own;
}

kiln_status kiln_dist_pipe_step(struct kiln_dist *d, const float *lr, void *compute)
{
	struct kiln_model *m = d->m;
	const size_t lo = d->pipe_lo[d->pipe_stage], hi = d->pipe_hi[d->pipe_stage];
	/* advance first (gated like kiln_model_optim_step's) */
	kiln_status st = kiln_model_opt_step_advance(m, compute);
	if (st || !d->pipe_plan)
		return st;
	return kiln_model_optim_run(m, d->pipe_plan, m->grads_d + lo, lo, d->pipe_state, hi - lo,
				    lr, compute);
}

/* Slot k of stage s's optimizer state from world rank s (its rank in
 * pipe 0) to rank 0's whole buffer d->zfull (rank 0's own: a copy); the
 * stage's rank sends its slice held per stage, or under ZeRO-1 the
 * slot's slice gathered into z (the whole model's layout). */
static kiln_status state_to_rank0(struct kiln_dist *d, int s, int k, const float *z,
				  void *compute)
{
	struct kiln_model *m = d->m;
	const int r = d->env.rank;
	const size_t N = m->n_trainable, lo = d->pipe_lo[s];
	const size_t n = d->pipe_hi[s] > lo ? d->pipe_hi[s] - lo : 0;
	float *whole = r ? NULL : d->zfull + (size_t)k * N + lo;
	const float *mine = r != s ? NULL : d->zero ? z + lo : d->pipe_state + (size_t)k * n;
	kiln_status st = KILN_OK;
	if (!n || (whole && whole == mine))
		return KILN_OK;
	if (whole && mine)
		st = kiln_device_copy_async(d->dev, whole, mine, n * sizeof(float), KILN_COPY_D2D,
					    compute);
	else if (whole)
		st = d->ops->recv(d->ctx, whole, n * sizeof(float), KILN_U8, s, compute, NULL);
	else if (mine)
		st = d->ops->send(d->ctx, mine, n * sizeof(float), KILN_U8, 0, compute, NULL);
	return st ? kiln_error_wrap(st, "gathering stage %d's optimizer state on rank 0", s) : st;
}

kiln_status kiln_dist_pipe_gather_state(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	const size_t N = m->n_trainable;
	const int r = d->env.rank;
	kiln_status st;
	/* only rank 0 writes the checkpoint: it alone holds the whole state,
	 * each stage's slice sent by that stage's rank in pipe 0; under
	 * ZeRO-1 every rank first allgathers the slot's pieces within its
	 * stage's group, rank 0 into its whole buffer, the others into their
	 * gradients (dead between steps, zeroed again after; before session
	 * 30 every rank gathered the whole state into a buffer of its own) */
	if ((d->pipe_own || d->zero) && m->state_slots && N && (d->zero || r < d->pipe_P)) {
		if (!r && !d->zfull &&
		    (st = kiln_device_alloc(d->dev, (size_t)m->state_slots * N * sizeof(float),
					    (void **)&d->zfull)))
			return st;
		for (int k = 0; k < m->state_slots; k++) {
			float *z = !d->zero ? NULL : r ? m->grads_d : d->zfull + (size_t)k * N;
			if (z && (st = dist_zero_gather_slot(d, k, z, compute)))
				return kiln_dist_explain(d, kiln_error_wrap(st, "ZeRO-1: allgathering the optimizer state's '%s' for a checkpoint",
									    m->optim_info.slot_names[k]));
			for (int s = 0; s < d->pipe_P && r < d->pipe_P; s++)
				if ((st = state_to_rank0(d, s, k, z, compute)))
					return kiln_dist_explain(d, st);
			/* (the next slot's allgather writes over what was sent) */
			if (z == m->grads_d && (st = kiln_device_stream_sync(d->dev, compute)))
				return kiln_dist_explain(d, st);
		}
		const int me = d->pipe_stage;
		if (d->zero && r &&
		    (st = kiln_dist_pipe_zero(d, m->grads_d + d->pipe_lo[me],
					      d->pipe_hi[me] > d->pipe_lo[me] ? d->pipe_hi[me] - d->pipe_lo[me] : 0,
					      compute)))
			return st;
		if (!r)
			m->state_d = d->zfull;
	}
	/* (held since start-up: the parameters at rank 0 alone, dist_pipe_mem.c) */
	return m->held ? kiln_dist_pipe_gather_to0(d, compute) : kiln_dist_pipe_gather(d, compute);
}

kiln_status kiln_dist_pipe_gather(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	if (!d || !d->pipe_P)
		return KILN_OK;
	struct kiln_model *m = d->m;
	const size_t *lo = d->pipe_lo, *hi = d->pipe_hi;
	/* The compute stream after the comm stream's work, first: the
	 * collectives below wait for its collectives, and the copy of this
	 * rank's slice into the whole buffer (kiln_dist_pipe_whole) reads
	 * parameters that ZeRO-1's allgathers (dist.overlap: on the comm
	 * stream) are still writing.  Before session 35 the copy came first:
	 * an evaluation between log points (which settle them) read a mix of
	 * this step's parameters and the last one's, a varying test loss
	 * (tests/pipeline_dist.sh section 10). */
	if (d->comm_stream && ((st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)) ||
			       (st = kiln_device_stream_wait(d->dev, compute, d->ready))))
		return st;
	/* (a rank holding its stage's parameters alone: a whole buffer,
	 * agreed on before the collectives: a rank whose allocation failed
	 * fails every rank, where before it returned and left its peers in
	 * their receives of its stage; session 43) */
	if ((st = kiln_dist_pipe_whole_agreed(d, kiln_dist_pipe_whole(d, compute), compute)))
		return st;
	for (int s = 0; s < d->pipe_P; s++) {
		const size_t n = hi[s] - lo[s];
		if ((st = from_rank(d, m->params_d + lo[s], n * 4, s, compute, "parameters", s)))
			return st;
		/* (the state held per stage went to rank 0 alone: above) */
		for (int k = 0; !d->pipe_own && !d->zero && m->state_d && k < m->state_slots; k++)
			if ((st = from_rank(d, m->state_d + (size_t)k * m->n_trainable + lo[s], n * 4, s,
					    compute, m->optim_info.slot_names[k], s)))
				return st;
	}
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *q = &m->params[i];
		const int s = kiln_pipe_param_stage(m, q);
		if (q->buffer && (st = from_rank(d, m->buffers_d + q->off, (size_t)q->numel * 4, s,
						 compute, q->name, s)))
			return st;
	}
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	kiln_model_weights_written(m);
	return KILN_OK;
}

/* Where stage s's norm goes on this rank: the first element of its slice
 * (zero here), or its slot before the stage's gradients when they are
 * held alone (dist_pipe_mem.c). */
static float *norm_slot(struct kiln_dist *d, int s)
{
	return d->pipe_cut ? d->pipe_gbuf + s : d->m->grads_d + d->pipe_lo[s];
}

/* A copy of 4 bytes on the compute stream. */
static kiln_status copy1(struct kiln_dist *d, float *dst, const float *src, void *compute)
{
	return kiln_device_copy_async(d->dev, dst, src, sizeof(float), KILN_COPY_D2D, compute);
}

/* The pipe's sum of the stages' norms (norms[s] stage s's, zero
 * elsewhere, P floats) on every rank, in place.  A communicator that
 * sends now (comm ops version 6: kiln-gloo) sleeps in its point-to-point
 * waits but spins in its collectives, and the last stage's rank reaches
 * this a backward pass ahead of stage 0's: there stage 0's rank gathers
 * the norms and sends them back (the same sums: each adds zeros), so the
 * early ranks wait asleep instead of holding a CPU that stage 0 may need
 * (docs/PERFORMANCE.md, issue 21, session 10). */
static kiln_status pipe_sum(struct kiln_dist *d, float *norms, void *compute)
{
	const int P = d->pipe_P, me = d->pipe_stage;
	kiln_status st = KILN_OK;
	if (d->ops->version < 6 || !d->ops->send_now)
		return d->ops->allreduce(d->pctx, norms, (size_t)P, KILN_F32, KILN_REDUCE_SUM,
					 compute, NULL);
	if (me) {
		if (!(st = d->ops->send(d->pctx, norms + me, 1, KILN_F32, 0, compute, NULL)))
			st = d->ops->recv(d->pctx, norms, (size_t)P, KILN_F32, 0, compute, NULL);
		return st;
	}
	for (int s = 1; s < P && !st; s++)
		st = d->ops->recv(d->pctx, norms + s, 1, KILN_F32, s, compute, NULL);
	for (int s = 1; s < P && !st; s++)
		st = d->ops->send(d->pctx, norms, (size_t)P, KILN_F32, s, compute, NULL);
	return st;
}

kiln_status kiln_dist_pipe_norms(struct kiln_dist *d, void *compute)
{
	if (!d || !d->pipe_P)
		return KILN_OK;
	struct kiln_model *m = d->m;
	const int P = d->pipe_P, me = d->pipe_stage;
	float *norms = d->pipe_norms, *state = norms + P, *zeros = state + 4;
	float *g = m->grads_d + d->pipe_lo[me];
	static const float none[2 * KILN_PIPE_MAX_STAGES + 4];
	kiln_status st = KILN_OK;
	if (d->pipe_norms_new && !(st = kiln_device_copy_async(d->dev, norms, none, sizeof none,
							       KILN_COPY_H2D, compute)))
		d->pipe_norms_new = 0;
	if (!st)
		st = kiln_device_copy_async(d->dev, norms, zeros, (size_t)P * sizeof(float),
						KILN_COPY_D2D, compute);
	if (!st && d->pipe_measure) {
		struct kiln_op_args a = { .in = { g }, .out = { g, state } };
		if (!(st = kiln_device_run(d->dev, d->pipe_measure, &a, compute)))
			st = copy1(d, norms + me, state, compute);
	}
	if (!st && (st = pipe_sum(d, norms, compute)))
		return kiln_dist_explain(d, kiln_error_wrap(st, "rank %d of %d (pipeline stage %d): the pipe's gradient norms",
							     d->env.rank, d->env.world, me));
	for (int s = 0; !st && s < P; s++)
		if (s != me && d->pipe_hi[s] > d->pipe_lo[s])
			st = copy1(d, norm_slot(d, s), norms + s, compute);
	return st;
}

kiln_status kiln_dist_pipe_norms_done(struct kiln_dist *d, void *compute)
{
	kiln_status st = KILN_OK;
	for (int s = 0; d && !st && s < d->pipe_P; s++)
		if (s != d->pipe_stage && d->pipe_hi[s] > d->pipe_lo[s])
			st = copy1(d, norm_slot(d, s), d->pipe_norms + d->pipe_P + 4, compute);
	return st;
}

kiln_status kiln_dist_pipe_overlap(struct kiln_dist *d, int *on)
{
	*on = 0;
	if (!d || !d->pipe_P || !d->overlap || !d->n_b)
		return KILN_OK;
	d->pipe_overlap = *on = 1;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): %d bucket(s) start during the stage's last micro-batch's backward (the loss seed holds the mean)",
		 d->env.rank, d->pipe_stage, d->n_b);
	return KILN_OK;
}
