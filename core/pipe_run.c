/* core/pipe_run.c - the pipeline executor: a step's micro-batches run
 * through the stages in the schedule's order, each micro-batch in flight
 * with its own plan (activation arena), every crossing tensor moved by
 * the stage transport, each stage's gradients accumulated over the
 * micro-batches in its own slice of the flat buffer.  See pipeline.h and
 * docs/pipeline.md. */
#include "pipe_impl.h"
#include "profile.h"

/* ---- the hand-offs, paired where the transport can ----------------------
 * A stage's send is held (not yet enqueued) until its next hand-off or
 * work: a recv from the stage it sends to goes with it as one sendrecv
 * (1f1b's steady state on ranks: the activation to stage s + 1, then the
 * gradient from it; on stage s + 1 the gradient back, then the next
 * activation) where the plan of the step's pairs has it (kiln_pipe_pairs_plan,
 * core/pipe_pairs.c: no pair that could deadlock the step); anything else
 * sends it first.  The order of each stage's messages to each other stage
 * is unchanged.  (A micro-batch's entry, enter: a copy of its step counter
 * into a free plan, may go between: it touches nothing the send reads,
 * and is no pass.) */

static int pair_slot(const struct kiln_pipe *pp, uint64_t tag)
{
	return kiln_pipe_tag_slot(tag, pp->n_pair_msgs, pp->n_pair_slots);
}

/* The held send, if any, enqueued alone: before the stage's work. */
static kiln_status xflush(struct kiln_pipe *pp)
{
	if (!pp->held.on)
		return KILN_OK;
	pp->held.on = 0;
	/* (a send the plan pairs, sent alone: the executor and the plan's
	 * walk of its hand-offs parted, and the peer may wait in its half
	 * of a pair for a recv posted after it; said, not hung) */
	if (pp->pair_with && pp->pair_with[pair_slot(pp, pp->held.tag)])
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d: message %llx to stage %d, which the pairing plan pairs with a recv, sent alone",
				  pp->held.from, (unsigned long long)pp->held.tag, pp->held.to);
	return pp->tr.ops->send(pp->tr.ctx, pp->held.from, pp->held.to, pp->held.tag, pp->held.buf,
				pp->held.bytes, pp->held.stream);
}

static kiln_status xsend(struct kiln_pipe *pp, int from, int to, uint64_t tag, const void *buf,
			 size_t bytes, void *stream)
{
	kiln_status st = xflush(pp);
	if (st || !pp->pair_with)
		return st ? st : pp->tr.ops->send(pp->tr.ctx, from, to, tag, buf, bytes, stream);
	pp->held.on = 1;
	pp->held.from = from, pp->held.to = to, pp->held.tag = tag;
	pp->held.buf = buf, pp->held.bytes = bytes, pp->held.stream = stream;
	return KILN_OK;
}

static kiln_status xrecv(struct kiln_pipe *pp, int from, int to, uint64_t tag, void *buf,
			 size_t bytes, void *stream)
{
	if (pp->held.on && pp->held.to == from && pp->held.from == to &&
	    pp->held.stream == stream &&
	    pp->pair_with[pair_slot(pp, pp->held.tag)] == 1 + pair_slot(pp, tag)) {
		pp->held.on = 0;
		return pp->tr.ops->sendrecv(pp->tr.ctx, to, from, pp->held.tag, pp->held.buf,
					    pp->held.bytes, tag, buf, bytes, stream);
	}
	kiln_status st = xflush(pp);
	return st ? st : pp->tr.ops->recv(pp->tr.ctx, from, to, tag, buf, bytes, stream);
}

/* ---- tied weights across ranks ------------------------------------------
 * A weight tied across stages (GPT's lm_head reading the token embedding)
 * is its owner's (the first user's stage).  In one process the later
 * stage reads it in place and writes its gradient into the micro-batch's
 * tie buffer, which the owner adds.  With stages on ranks each rank has
 * its own copy: the owner sends the current tensor to the user's rank at
 * each step's start, and the user returns its gradient for each
 * micro-batch after its backward, into the owner's tie buffer, before the
 * owner's backward of that micro-batch adds it as in one process.  Their
 * messages are crossing tensors n_xfer.. of the rank transport. */

/* The n-th (from 0) tied user on another stage than its tensor's owner:
 * its layer, or -1 past the last; *su, *so its stage and the owner's. */
int pipe_tie_user(const struct kiln_pipe *pp, int n, int *su, int *so)
{
	const struct kiln_model *m = pp->m;
	for (int i = 0; pp->tie && i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i];
		if (L->tie_grad < 0)
			continue;
		*su = kiln_pipe_stage(m, i);
		*so = kiln_pipe_param_stage(m, &m->params[L->pidx[L->tie_slot]]);
		if (*su != *so && n-- == 0)
			return i;
	}
	return -1;
}

static const struct model_param *tied_param(const struct kiln_pipe *pp, int i)
{
	const struct model_layer *L = &pp->m->layers[i];
	return &pp->m->params[L->pidx[L->tie_slot]];
}

/* At a step's start on this rank: the tied tensors, from owner to user. */
static kiln_status tie_weights(struct kiln_pipe *pp)
{
	const int n_xfer = pp->plan[0]->n_xfer;
	kiln_status st;
	int su, so;
	for (int t = 0, i; pp->mine >= 0 && (i = pipe_tie_user(pp, t, &su, &so)) >= 0; t++) {
		const struct model_param *q = tied_param(pp, i);
		struct kiln_model *m = pp->m;
		float *w = m->params_d + q->off;
		const size_t bytes = (size_t)q->numel * sizeof(float);
		/* (ZeRO-1: after the parameters' allgathers, as a forward reads them) */
		if (pp->mine == so && m->fwd_hook &&
		    (st = m->fwd_hook(m->fwd_user, m->n_layers, pp->sst[so])))
			return st;
		if (pp->mine == so &&
		    (st = pp->tr.ops->send(pp->tr.ctx, so, su, pipe_tag(0, n_xfer + t, 0), w, bytes,
					   pp->sst[so])))
			return st;
		if (pp->mine == su &&
		    (st = pp->tr.ops->recv(pp->tr.ctx, so, su, pipe_tag(0, n_xfer + t, 0), w, bytes,
					   pp->sst[su])))
			return st;
	}
	return KILN_OK;
}

/* A later stage's rank, with low-precision compute: its compute copy of
 * the parameters refreshed before its first forward where stale (stage 0
 * does it in its forward, kiln_plan_forward_range), and each step where
 * a tied weight was just received into the f32 parameters. */
static kiln_status refresh_copy(struct kiln_pipe *pp)
{
	int su, so;
	if (pp->mine <= 0 || !pp->m->params_c)
		return KILN_OK;
	for (int t = 0; pipe_tie_user(pp, t, &su, &so) >= 0; t++)
		if (su == pp->mine)
			kiln_model_weights_written(pp->m);
	return kiln_model_params_sync(pp->m, pp->sst[pp->mine]);
}

/* Stage s's part in micro-batch j's tied gradients: the user sends its
 * gradient after its backward (after = 1), the owner receives it before
 * its own (after = 0). */
static kiln_status tie_grads(struct kiln_pipe *pp, int s, int j, int after)
{
	const int n_xfer = pp->plan[0]->n_xfer;
	kiln_status st;
	int su, so;
	for (int t = 0, i; pp->mine >= 0 && (i = pipe_tie_user(pp, t, &su, &so)) >= 0; t++) {
		float *g = pp->tie[pp->slot[j]] + pp->m->layers[i].tie_grad;
		const size_t bytes = (size_t)tied_param(pp, i)->numel * sizeof(float);
		if (after && s == su &&
		    (st = xsend(pp, su, so, pipe_tag(j, n_xfer + t, 1), g, bytes, pp->sst[su])))
			return st;
		if (!after && s == so &&
		    (st = xrecv(pp, su, so, pipe_tag(j, n_xfer + t, 1), g, bytes, pp->sst[so])))
			return st;
	}
	return KILN_OK;
}

/* Forward of stage s for micro-batch j on plan p: receive what it reads
 * from earlier stages, run its layers, send what later stages read. */
/* Stages on ranks: crossing tensor e, which is the data (its source the
 * batch's buffer, which alternates between steps), copied on stage s's
 * stream into its buffer of its own (pp->xdata[e], kiln_pipe_use_ranks),
 * *src pointed there: what the transport sends from whenever it runs
 * (tests/pipeline_dist.sh, a stage 0 of a flatten alone). */
static kiln_status data_stable(struct kiln_pipe *pp, int e, const void **src, size_t bytes, int s)
{
	kiln_status st = kiln_device_copy_async(sdev(pp, s), pp->xdata[e], *src, bytes,
						KILN_COPY_D2D, pp->sst[s]);
	*src = pp->xdata[e];
	return st;
}

static kiln_status stage_forward(struct kiln_pipe *pp, struct kiln_plan *p, int s, int j,
				 const void *x, const void *y, void *metrics)
{
	void *ss = pp->sst[s];
	const int k = pp->slot[j];
	kiln_status st;
	if (s && pp->mine < 0 &&
	    (st = kiln_device_stream_wait(sdev(pp, s), ss, pp->fdone[k * pp->P + s - 1])))
		return st;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *xf = &p->xfer[e];
		if (xf->to == s &&
		    (st = xrecv(pp, xf->from, s, pipe_tag(j, e, 0), kiln_plan_store_ptr(p, xf->recv, x),
				xf->bytes, ss)))
			return st;
	}
	if ((st = xflush(pp)) ||
	    (st = kiln_pipe_timing_mark(pp->timing, sdev(pp, s), ss, pp->cur, 0)))
		return st;
	if ((st = kiln_plan_forward_range(p, pp->lo[s], pp->hi[s], x, y, metrics, ss)))
		return kiln_error_wrap(st, "pipeline stage %d, micro-batch %d", s, j);
	if ((st = kiln_pipe_timing_mark(pp->timing, sdev(pp, s), ss, pp->cur, 1)) ||
	    (st = kiln_device_event_record(sdev(pp, s), pp->fdone[k * pp->P + s], ss)))
		return st;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *xf = &p->xfer[e];
		const void *src = kiln_plan_store_ptr(p, xf->src, x);
		if (xf->from == s && xf->src < 0 && pp->xdata && (st = data_stable(pp, e, &src, xf->bytes, s)))
			return st;
		if (xf->from == s && (st = xsend(pp, s, xf->to, pipe_tag(j, e, 0), src, xf->bytes, ss)))
			return st;
	}
	return KILN_OK;
}

/* The gradients of stage s's outputs read on later stages, returned:
 * the latest stage's first (it writes), the others added. */
static kiln_status receive_grads(struct kiln_pipe *pp, struct kiln_plan *p, int s, int j,
				 const void *x)
{
	kiln_status st;
	for (int to = pp->P - 1; to > s; to--)
		for (int e = 0; e < p->n_xfer; e++) {
			const struct plan_xfer *xf = &p->xfer[e];
			if (xf->from != s || xf->to != to || xf->grecv < 0)
				continue;
			void *g = kiln_plan_store_ptr(p, xf->gsrc, x);
			void *dst = xf->gadd ? kiln_plan_store_ptr(p, xf->gtmp, x) : g;
			if ((st = xrecv(pp, to, s, pipe_tag(j, e, 1), dst, xf->bytes, pp->sst[s])))
				return st;
			if (xf->gadd) {
				struct kiln_op_args a = { .in = { g, dst }, .out = { g } };
				if ((st = kiln_device_run(sdev(pp, s), pp->xadd[e], &a, pp->sst[s])))
					return st;
			}
		}
	return KILN_OK;
}

/* Backward of stage s for micro-batch j: the returned gradients, its
 * layers' backwards (micro-batch 0 writes the parameter gradients, the
 * others add into them in the layers' ops, or where a layer cannot, write
 * beside them and add into the stage's slice; the loss layers' seed
 * holds the mean, seed_mean), then its inputs' gradients sent back. */
static kiln_status stage_backward(struct kiln_pipe *pp, struct kiln_plan *p, int s, int j,
				  const void *x, const void *y, void *metrics)
{
	struct kiln_model *m = pp->m;
	void *ss = pp->sst[s];
	const int k = pp->slot[j];
	kiln_status st;
	if (s < pp->P - 1 && pp->mine < 0 &&
	    (st = kiln_device_stream_wait(sdev(pp, s), ss, pp->bdone[k * pp->P + s + 1])))
		return st;
	if ((st = receive_grads(pp, p, s, j, x)) || (st = tie_grads(pp, s, j, 0)) ||
	    (st = xflush(pp)) || (st = kiln_pipe_timing_mark(pp->timing, sdev(pp, s), ss, pp->cur, 0)))
		return st;
	float *tie = m->tie_grads_d;
	/* the optimizer step's first micro-batch writes, the others add */
	const int first = !pp->a && !j;
	m->grad_out_d = first ? NULL : pp->grads_more;
	m->grad_accum = !first && !pp->grads_more;
	if (pp->tie)
		m->tie_grads_d = pp->tie[k];
	m->grad_final = pp->hook_final && j == pp->M - 1 && pp->a == pp->A - 1;
	st = kiln_pipe_wgrad_backward(pp, p, s, j, x, y, metrics);
	m->grad_final = 0;
	m->grad_out_d = NULL;
	m->grad_accum = 0;
	m->tie_grads_d = tie;
	if (st)
		return kiln_error_wrap(st, "pipeline stage %d, micro-batch %d", s, j);
	float *g = m->grads_d + pp->glo[s];
	if (!first && pp->gadd[s]) {
		struct kiln_op_args a = { .in = { g, pp->grads_more + pp->glo[s] }, .out = { g } };
		if ((st = kiln_device_run(sdev(pp, s), pp->gadd[s], &a, ss)))
			return st;
	}
	if ((st = kiln_pipe_timing_mark(pp->timing, sdev(pp, s), ss, pp->cur, 1)) ||
	    (st = kiln_device_event_record(sdev(pp, s), pp->bdone[k * pp->P + s], ss)))
		return st;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *xf = &p->xfer[e];
		if (xf->to == s && xf->grecv >= 0 &&
		    (st = xsend(pp, s, xf->from, pipe_tag(j, e, 1), kiln_plan_store_ptr(p, xf->grecv, x),
				xf->bytes, ss)))
			return st;
	}
	if ((st = tie_grads(pp, s, j, 1)))
		return st;
	return kiln_pipe_wgrad_after(pp, s, j);
}

/* Micro-batch j enters the pipeline: a free plan, and its dropout counter:
 * the model's step (the optimizer step's, advanced after the step's last
 * micro-batch enters) and the micro-batch's rows of the global batch, so
 * that its samples draw the masks they draw in one batch; the model's
 * micro-step count (batchnorm's) advances. */
static kiln_status enter(struct kiln_pipe *pp, int j)
{
	int k = 0;
	while (k < pp->K && pp->busy[k])
		k++;
	if (k == pp->K)
		return kiln_error(KILN_EINTERNAL, "pipeline: no free activation set for micro-batch %d", j);
	pp->busy[k] = 1;
	pp->slot[j] = k;
	const int s0 = pp->mine < 0 ? 0 : pp->mine;
	void *ss = pp->sst[s0];
	int64_t *ctr = pp->plan[k]->step_d;
	/* (the profile's "step counter" row, as the trainer's micro-step
	 * counter: before session 40 "(unlabelled) counter_add" and "copy") */
	kiln_profile_label("step counter", KILN_PHASE_FORWARD);
	kiln_status st = kiln_device_copy_async(sdev(pp, s0), ctr, pp->m->drop_d, sizeof(int64_t),
						KILN_COPY_D2D, ss);
	if (!st)
		st = kiln_device_copy_async(sdev(pp, s0), ctr + 1, pp->rows_d + pp->a * pp->M + j,
					    sizeof(int64_t), KILN_COPY_D2D, ss);
	if (!st)
		st = kiln_model_count_advance(pp->m, ss);
	if (!st && j == pp->M - 1 && pp->a == pp->A - 1)
		st = kiln_model_drop_step(pp->m, ss);
	kiln_profile_label(NULL, 0);
	return st;
}

/* After stage 0's backward of micro-batch j: the activation set of the
 * micro-batch done with it free for the next to enter.  Where the
 * deferred weight gradients read the plans' own buffers (wkeep), that is
 * micro-batch j - (P - 1): every stage s has waited for its deferred pass
 * by its backward of j - (P - 1) + P - 1 - s (kiln_pipe_wgrad_after),
 * which stage 0's backward of j follows on stage 0's stream (each
 * stage's backward of j waits for the next one's). */
static void release(struct kiln_pipe *pp, int j)
{
	const int done = pp->wkeep ? j - (pp->P - 1) : j;
	if (done >= 0)
		pp->busy[pp->slot[done]] = 0;
}

kiln_status kiln_pipe_step(struct kiln_pipe *pp, const void *x, const void *y, size_t label_bytes,
			   void *metrics)
{
	const size_t xrow = kiln_tensor_bytes(&pp->m->sample);
	kiln_status st;
	/* the stages start after the batch's copy and the last optimizer step,
	 * and the step's first after the loss seed from the scale that step
	 * (or a resume) left (seed_mean) */
	if ((!pp->a && (st = kiln_model_seed_update(pp->m, pp->seed_d, pp->seed_op, pp->stream))) ||
	    (st = kiln_device_event_record(pp->dev, pp->start, pp->stream)))
		return st;
	for (int s = 0; s < pp->P; s++)
		if ((st = kiln_device_stream_wait(sdev(pp, s), pp->sst[s], pp->start)))
			return st;
	pp->held.on = 0; /* (a step that failed may have left one) */
	if ((st = tie_weights(pp)) || (st = refresh_copy(pp)) || (st = kiln_pipe_wgrad_step(pp)))
		return st;
	for (int i = 0; i < 2 * pp->P * pp->M; i++) {
		const struct kiln_pipe_action *a = &pp->act[i];
		const int j = a->mb;
		pp->cur = i;
		if (a->kind == KILN_PIPE_FWD && a->stage == 0 && (st = enter(pp, j)))
			return st;
		struct kiln_plan *p = pp->plan[pp->slot[j]];
		if (pp->mine >= 0 && a->stage != pp->mine) {
			/* another rank's: only the activation sets' bookkeeping */
			if (a->kind == KILN_PIPE_BWD && a->stage == 0)
				release(pp, j);
			continue;
		}
		const char *xj = (const char *)x + (size_t)j * (size_t)pp->mb * xrow;
		const char *yj = (const char *)y + (size_t)j * (size_t)pp->mb * label_bytes;
		st = a->kind == KILN_PIPE_FWD ? stage_forward(pp, p, a->stage, j, xj, yj, metrics)
					      : stage_backward(pp, p, a->stage, j, xj, yj, metrics);
		if (st)
			return st;
		if (a->kind == KILN_PIPE_BWD && a->stage == 0)
			release(pp, j);
	}
	if (pp->wkeep) /* (the step's end waits for every deferred pass) */
		memset(pp->busy, 0, (size_t)pp->K);
	/* the optimizer (and the metrics' read-back) after every stage */
	if ((st = xflush(pp)))
		return st;
	for (int s = 0; s < pp->P; s++)
		if ((pp->mine < 0 || s == pp->mine) &&
		    ((st = kiln_pipe_wgrad_drain(pp, s)) ||
		     (st = kiln_device_event_record(sdev(pp, s), pp->done[s], pp->sst[s])) ||
		     (st = kiln_device_stream_wait(pp->dev, pp->stream, pp->done[s]))))
			return st;
	pp->a = (pp->a + 1) % pp->A;
	if ((st = kiln_pipe_timing_step(pp->timing, pp->dev, pp->stream)))
		return st;
	return pp->rk ? kiln_pipe_rank_flush(pp->rk, pp->stream) : KILN_OK;
}

kiln_status kiln_pipe_sync_stages(struct kiln_pipe *pp)
{
	kiln_status st = KILN_OK;
	for (int s = 0; s < pp->P && !st; s++)
		if (pp->mine < 0 || s == pp->mine)
			st = kiln_device_stream_sync(sdev(pp, s), pp->sst[s]);
	return st;
}

void kiln_pipe_drain(struct kiln_pipe *pp)
{
	if (!pp)
		return;
	for (int s = 0; s < pp->P; s++)
		if ((pp->mine < 0 || s == pp->mine) && pp->sst[s])
			(void)kiln_device_stream_sync(sdev(pp, s), pp->sst[s]);
	/* the local transport's copy stream (a device other than the CPU's):
	 * a queued hand-off copies between two stages' buffers */
	if (pp->local.copy)
		(void)kiln_device_stream_sync(sdev(pp, 0), pp->local.copy);
	kiln_pipe_rank_drain(pp->rk);
}

/* Stages on ranks: every rank's kept passes to stage 0's rank, which
 * replays the whole pipe from them (kiln_pipe_timing_report_passes) */
static kiln_status report_rank_passes(struct kiln_pipe *pp)
{
	const int n = kiln_pipe_timing_passes_n(pp->timing);
	double *mine = malloc((size_t)n * sizeof *mine);
	double *all = malloc((size_t)pp->P * (size_t)n * sizeof *all);
	kiln_status st = mine && all ? KILN_OK : kiln_error(KILN_ENOMEM, "out of memory");
	if (!st) {
		kiln_pipe_timing_passes(pp->timing, mine);
		st = kiln_pipe_rank_gather(pp->rk, pp->P, pp->mine, mine, n, all);
	}
	if (!st)
		kiln_pipe_timing_report_passes(pp->timing, all);
	free(mine);
	free(all);
	return st;
}

kiln_status kiln_pipe_report(struct kiln_pipe *pp)
{
	double bubble, mine[3], all[3 * KILN_PIPE_MAX_STAGES];
	kiln_status st = pp->timing ? kiln_device_stream_sync(pp->dev, pp->stream) : KILN_OK;
	if (st || (st = kiln_pipe_timing_report(pp->timing, &bubble)) || !pp->timing || !pp->rk)
		return st;
	/* stages on ranks: the pipe's bubble at stage 0's rank, from every
	 * stage's busy time and span */
	kiln_pipe_timing_mine(pp->timing, mine);
	if ((st = kiln_pipe_rank_gather(pp->rk, pp->P, pp->mine, mine, 3, all)))
		return st;
	kiln_pipe_timing_report_pipe(pp->timing, all);
	return report_rank_passes(pp);
}

kiln_status kiln_pipe_explain(struct kiln_pipe *pp, kiln_status st)
{
	return pp && pp->rk ? kiln_pipe_rank_explain(pp->rk, st) : st;
}

kiln_status kiln_pipe_eval_recv(struct kiln_pipe *pp, int from, int e, long long batch, void *buf,
				size_t bytes, void *stream)
{
	if (pp && e >= pp->plan[0]->n_xfer)
		return kiln_error(KILN_EINTERNAL, "pipeline: evaluating: receiving batch %lld, crossing tensor %d from stage %d: training has %d crossing tensors",
				  batch, e, from, pp->plan[0]->n_xfer);
	return kiln_pipe_rank_eval_recv(pp ? pp->rk : NULL, from, e, batch, buf, bytes, stream);
}

kiln_status kiln_pipe_eval_send(struct kiln_pipe *pp, int to, int e, long long batch,
				const void *buf, size_t bytes, void *stream)
{
	if (pp && e >= pp->plan[0]->n_xfer)
		return kiln_error(KILN_EINTERNAL, "pipeline: evaluating: sending batch %lld, crossing tensor %d to stage %d: training has %d crossing tensors",
				  batch, e, to, pp->plan[0]->n_xfer);
	return kiln_pipe_rank_eval_send(pp ? pp->rk : NULL, to, e, batch, buf, bytes, stream);
}

kiln_status kiln_pipe_eval_check(const struct kiln_pipe *pp, const struct kiln_plan *p)
{
	if (!pp || !p || !p->staged)
		return kiln_error(KILN_EINTERNAL, "pipeline: an evaluation's plan checked without a pipeline or not staged");
	if (p->n_xfer > pp->plan[0]->n_xfer)
		return kiln_error(KILN_EINTERNAL, "pipeline: the evaluation's plan (batch %lld) has %d crossing tensors, training's %d: its receives past training's would have no slot to be marked in (kiln_pipe_explain)",
				  (long long)p->batch, p->n_xfer, pp->plan[0]->n_xfer);
	return KILN_OK;
}

int kiln_pipe_mine(const struct kiln_pipe *pp, size_t *lo, size_t *hi)
{
	if (pp->mine >= 0)
		kiln_pipe_stage_slice(pp, pp->mine, lo, hi);
	else
		*lo = 0, *hi = pp->m->n_trainable;
	return pp->mine;
}

void kiln_pipe_stage_slice(const struct kiln_pipe *pp, int s, size_t *lo, size_t *hi)
{
	*lo = pp->glo[s];
	*hi = pp->ghi[s] > pp->glo[s] ? pp->ghi[s] : pp->glo[s];
}

struct kiln_plan *kiln_pipe_plan0(const struct kiln_pipe *pp) { return pp->plan[0]; }
int kiln_pipe_stages(const struct kiln_pipe *pp) { return pp->P; }
int kiln_pipe_micro_batches(const struct kiln_pipe *pp) { return pp->M; }

size_t kiln_pipe_arena_bytes(const struct kiln_pipe *pp)
{
	size_t t = 0;
	for (int k = 0; k < pp->K; k++)
		t += pp->plan[k] ? pp->plan[k]->arena_bytes : 0;
	return t;
}

