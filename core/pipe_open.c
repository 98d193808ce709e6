/* core/pipe_open.c - opening the pipeline executor (core/pipe_run.c runs
 * it): the stages' layer ranges and gradient slices, their streams and
 * plans, the local transport of one process, the stages on ranks; and
 * freeing it.  See pipeline.h and docs/pipeline.md. */
#include "pipe_impl.h"
#include "profile.h"

/* ---- the local transport: one process, a copy stream, events --------- */

static struct local_msg *local_slot(struct local_tr *L, uint64_t tag)
{
	const int i = kiln_pipe_tag_slot(tag, L->n_xfer, L->n);
	return i < 0 ? NULL : &L->msg[i];
}

static kiln_status local_send(void *ctx, int from, int to, uint64_t tag, const void *buf,
			      size_t bytes, void *stream)
{
	struct local_tr *L = ctx;
	struct local_msg *g = local_slot(L, tag);
	if (!g || g->used)
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d sends message %llx to stage %d twice or out of range",
				  from, (unsigned long long)tag, to);
	g->buf = buf;
	g->bytes = bytes;
	g->used = 1;
	/* the copy starts once the sender's pass is done */
	return kiln_device_event_record(L->sdev ? L->sdev[from] : L->dev, g->sent, stream);
}

static kiln_status local_recv(void *ctx, int from, int to, uint64_t tag, void *buf, size_t bytes,
			      void *stream)
{
	struct local_tr *L = ctx;
	struct local_msg *g = local_slot(L, tag);
	kiln_status st;
	if (!g || !g->used)
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d receives message %llx that stage %d never sent",
				  to, (unsigned long long)tag, from);
	if (g->bytes != bytes)
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d sent %zu bytes, stage %d expects %zu",
				  from, g->bytes, to, bytes);
	g->used = 0;
	struct kiln_device *rd = L->sdev ? L->sdev[to] : L->dev;
	/* the sender wrote it here (share_local): the order alone */
	if (buf == g->buf)
		return kiln_device_stream_wait(rd, stream, g->sent);
	/* host memory (the CPU's): the receiver waits for the send and copies
	 * itself, one hand-off rather than two through a copy stream's thread */
	if (!L->copy) {
		if ((st = kiln_device_stream_wait(rd, stream, g->sent)))
			return st;
		return kiln_device_copy_async(rd, buf, g->buf, bytes, KILN_COPY_D2D, stream);
	}
	/* copy stream: after the send, copy, then the receiver waits */
	if ((st = kiln_device_stream_wait(L->dev, L->copy, g->sent)) ||
	    (st = kiln_device_copy_async(L->dev, buf, g->buf, bytes, KILN_COPY_D2D, L->copy)) ||
	    (st = kiln_device_event_record(L->dev, g->copied, L->copy)))
		return st;
	return kiln_device_stream_wait(rd, stream, g->copied);
}

static const struct kiln_stage_transport_ops local_ops = { local_send, local_recv, NULL };

/* ---- opening the pipeline ---------------------------------------------- */

kiln_status kiln_pipe_wanted(const struct kiln_config *cfg, const struct kiln_model *m, int *yes)
{
	int64_t M = 1;
	kiln_status st = kiln_config_get_int(cfg, "pipeline", "micro_batches", &M);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if ((st = kiln_pipe_read_stages((struct kiln_model *)m)))
		return st;
	*yes = m->n_stages > 1 || M > 1;
	return KILN_OK;
}

/* What a pipeline cannot do yet, named by its key. */
static kiln_status pipe_supported(const struct kiln_model *m, int world)
{
	const struct kiln_config *cfg = m->cfg;
	int64_t on_ranks = 1;
	kiln_config_get_int(cfg, "dist", "pipeline", &on_ranks);
	if (world > 1 && on_ranks <= 1) {
		const int cut = m->n_stages > 1;
		/* where the cut comes from: [model] stages, else the first
		 * layer's stage key */
		const char *ms = kiln_config_get(cfg, "model", "stages");
		const char *where = ms && *ms ? NULL : "";
		for (int i = 0; where && !*where && i < m->n_layers; i++)
			if (kiln_config_get(cfg, m->layers[i].section, "stage"))
				where = kiln_config_where(cfg, m->layers[i].section, "stage");
		if (!where || !*where)
			where = kiln_config_where(cfg, "model", "stages");
		return kiln_error(KILN_ECONFIG, "%s: %s, and %d ranks with [dist] pipeline = %lld: set [dist] pipeline = %d to run the stages on ranks (P x D = %d ranks: %s; docs/pipeline.md), or run one process; every stage on each data-parallel rank is not supported",
				  cut ? where : kiln_config_where(cfg, "pipeline", "micro_batches"),
				  cut ? "the model is cut into stages" : "[pipeline] micro_batches > 1",
				  world, (long long)on_ranks, cut ? m->n_stages : 2, world,
				  cut ? "P the stages" : "P >= 2 stages");
	}
	return KILN_OK;
}

/* Each stage's layers and its slice of the trainable parameters (they are
 * laid out in layer order, a tied tensor at its first user's place, so a
 * stage's are contiguous: kiln_model_tie_owner). */
static void stage_ranges(struct kiln_pipe *pp)
{
	const struct kiln_model *m = pp->m;
	for (int s = 0; s < pp->P; s++) {
		pp->lo[s] = m->n_layers, pp->hi[s] = 0;
		pp->glo[s] = m->n_trainable, pp->ghi[s] = 0;
	}
	for (int i = 0; i < m->n_layers; i++) {
		int s = kiln_pipe_stage(m, i);
		if (i < pp->lo[s])
			pp->lo[s] = i;
		pp->hi[s] = i + 1;
	}
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *q = &m->params[i];
		if (!q->trainable)
			continue;
		int s = kiln_pipe_param_stage(m, q);
		size_t end = q->off + kiln_align_up((size_t)q->numel * 4) / 4;
		if (q->off < pp->glo[s])
			pp->glo[s] = q->off;
		if (end > pp->ghi[s])
			pp->ghi[s] = end;
	}
}

/* Where a layer cannot add its parameter gradients in its own ops
 * (kiln_model_grad_accum_ok), the second gradient buffer (its padding
 * zeroed once) and the adds from it; the adds of the gradient returns.
 * (The mean over the micro-batches is the loss seed's: seed_mean.) */
static kiln_status prepare_grads(struct kiln_pipe *pp)
{
	kiln_status st;
	const struct kiln_plan *p0 = pp->plan[0];
	const int beside = !kiln_model_grad_accum_ok(pp->m);
	for (int s = 0; beside && s < pp->P && pp->M * pp->A > 1; s++) {
		int64_t n = pp->ghi[s] > pp->glo[s] ? (int64_t)(pp->ghi[s] - pp->glo[s]) : 0;
		if (n && (st = kiln_device_prepare_add(sdev(pp, s), n, &pp->gadd[s])))
			return st;
	}
	if (beside && pp->M * pp->A > 1 && pp->m->n_elems) {
		if ((st = kiln_device_alloc(pp->dev, pp->m->n_elems * sizeof(float),
					    (void **)&pp->grads_more)))
			return st;
		float *z = calloc(pp->m->n_elems, sizeof(float));
		if (!z)
			return kiln_error(KILN_ENOMEM, "out of memory");
		st = kiln_device_copy_async(pp->dev, pp->grads_more, z, pp->m->n_elems * sizeof(float),
					    KILN_COPY_H2D, pp->stream);
		if (!st)
			st = kiln_device_stream_sync(pp->dev, pp->stream);
		free(z);
		if (st)
			return st;
	}
	if (p0->n_xfer && !(pp->xadd = calloc((size_t)p0->n_xfer, sizeof(void *))))
		return kiln_error(KILN_ENOMEM, "out of memory");
	/* a returned gradient adds in its tensor's dtype (bf16/f16 compute) */
	for (int e = 0; e < p0->n_xfer; e++) {
		const struct plan_xfer *xf = &p0->xfer[e];
		if (!xf->gadd)
			continue;
		int64_t n = (int64_t)(xf->bytes / kiln_dtype_size(xf->dtype));
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ADD;
		op.n_in = 2;
		op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], xf->dtype, 1, &n);
		op.in[1] = op.out[0] = op.in[0];
		if ((st = kiln_device_prepare(sdev(pp, xf->from), &op, &pp->xadd[e], NULL)))
			return st;
	}
	return KILN_OK;
}

/* Each stage's stream and the events that order the stages. */
static kiln_status open_streams(struct kiln_pipe *pp)
{
	kiln_status st;
	const int n = pp->K * pp->P;
	if (!(pp->fdone = calloc((size_t)n, sizeof(void *))) ||
	    !(pp->bdone = calloc((size_t)n, sizeof(void *))))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < n; i++)
		if ((st = kiln_device_event_create(sdev(pp, i % pp->P), &pp->fdone[i])) ||
		    (st = kiln_device_event_create(sdev(pp, i % pp->P), &pp->bdone[i])))
			return st;
	for (int s = 0; s < pp->P; s++)
		if ((st = kiln_device_stream_create(sdev(pp, s), &pp->sst[s])) ||
		    (st = kiln_device_event_create(sdev(pp, s), &pp->done[s])))
			return st;
	return kiln_device_event_create(pp->dev, &pp->start);
}

/* The step's mean over its micro-batches folded into the loss layers'
 * gradient seed: device f32[1], the loss scale (1 without scaling) /
 * (M x accumulate) (kiln_model_seed_open), which the plans made now
 * multiply their loss gradient by (m->seed_d, graph.h), so that every
 * gradient a stage computes, and returns, is already the mean's share and
 * no stage scales its slice after its last backward (a pass at the
 * drain, on stage 0 inside the pipeline's span).  With a loss scaler too
 * (before session 37 the stages then scaled their slices, gmean, and
 * every fp16 gradient was M x accumulate times PyTorch's): seed_op sets
 * the seed from the scale at each optimizer step's start (kiln_pipe_step). */
static kiln_status seed_mean(struct kiln_pipe *pp)
{
	return kiln_model_seed_open(pp->m, (int64_t)pp->M * pp->A, pp->stream, &pp->seed_d,
				    &pp->seed_op);
}

/* [pipeline] zero_copy in one process on host memory: each shareable
 * crossing tensor's producer writes its output straight into the receive
 * buffer, and the later stage its gradient straight into the producer's
 * gradient storage (storage.ext: the receive buffers are the plan's own,
 * alive for the whole schedule), so local_recv, finding the two pointers
 * equal, copies nothing; its events order the stages as they ordered the
 * copies (pipe_window.c's argument, with the stages' fdone / bdone waits
 * for the messages). */
static void share_local(struct kiln_pipe *pp)
{
	int n_fwd = 0, n_bwd = 0;
	if (pp->zero_copy != 1 || pp->local.copy)
		return;
	for (int k = 0; k < pp->K; k++) {
		struct kiln_plan *p = pp->plan[k];
		for (int e = 0; e < p->n_xfer; e++) {
			const struct plan_xfer *x = &p->xfer[e];
			int fwd, bwd;
			kiln_pipe_xfer_shared(p, e, &fwd, &bwd);
			/* (into a receive buffer as large: the producer's storage
			 * may hold more than the crossing tensor) */
			if (fwd && p->store[x->src].bytes <= p->store[x->recv].bytes) {
				p->store[x->src].ext = kiln_plan_store_ptr(p, x->recv, NULL);
				n_fwd += !k;
			}
			if (bwd && p->store[x->gsrc].bytes <= p->store[x->grecv].bytes) {
				p->store[x->gsrc].ext = kiln_plan_store_ptr(p, x->grecv, NULL);
				n_bwd += !k;
			}
		}
	}
	if (n_fwd + n_bwd)
		kiln_log(KILN_LOG_INFO, "pipeline", "%d of %d crossing tensors' activations and %d gradients written where the next stage reads them: their hand-offs copy nothing",
			 n_fwd, pp->plan[0]->n_xfer, n_bwd);
}

/* The schedule, its plans (one per activation set alive at once), their
 * dropout counters and the transport's messages. */
static kiln_status open_plans(struct kiln_pipe *pp)
{
	kiln_status st;
	const int n_act = 2 * pp->P * pp->M;
	pp->act = calloc((size_t)n_act, sizeof *pp->act);
	pp->slot = calloc((size_t)pp->M, sizeof(int));
	if (!pp->act || !pp->slot)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_pipe_schedule(pp->kind, pp->P, pp->M, pp->early, pp->act, &pp->ticks,
				      &pp->K)))
		return st;
	if ((pp->wkeep = kiln_pipe_wgrad_keep(pp)))
		pp->K = kiln_pipe_sets_lagged(pp->act, pp->P, pp->M, pp->P - 1, pp->K);
	pp->plan = calloc((size_t)pp->K, sizeof *pp->plan);
	pp->busy = calloc((size_t)pp->K, 1);
	if (!pp->plan || !pp->busy)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_device_alloc_named(pp->dev, (size_t)pp->K * 64, (void **)&pp->steps_d,
					  "the pipeline's step counters")))
		return st;
	pp->m->plan_staged = 1;
	pp->m->plan_wkeep = pp->wkeep;
	pp->m->seed_d = pp->seed_d;
	pp->m->seed_n = (int64_t)pp->M * pp->A;
	for (int k = 0; k < pp->K && !st; k++) {
		st = kiln_model_plan(pp->m, pp->mb, 1, &pp->plan[k]);
		if (!st)
			pp->plan[k]->step_d = pp->steps_d + 8 * k;
	}
	pp->m->seed_d = NULL;
	pp->m->plan_staged = 0;
	pp->m->plan_wkeep = 0;
	if (st)
		return st;
	/* a tied weight's other users (GPT's lm_head, on the last stage)
	 * write their gradient beside it, added after its owner's backward
	 * (the embedding, stage 0): one buffer per micro-batch in flight, so
	 * that a later stage's next backward does not overwrite what the
	 * first stage has not added yet */
	if (pp->m->n_tie_elems && !(pp->tie = calloc((size_t)pp->K, sizeof *pp->tie)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int k = 0; pp->tie && k < pp->K; k++)
		if ((st = kiln_device_alloc(pp->dev, pp->m->n_tie_elems * sizeof(float),
					    (void **)&pp->tie[k])))
			return st;
	/* every crossing tensor of every plan in flight, both ways */
	pp->local.dev = sdev(pp, 0);
	pp->local.sdev = pp->m->stage_dev;
	if (kiln_device_traits(pp->dev)->type != KILN_DEVICE_CPU &&
	    (st = kiln_device_stream_create(sdev(pp, 0), &pp->local.copy)))
		return st;
	pp->local.n_xfer = pp->plan[0]->n_xfer;
	pp->local.n = 2 * pp->M * pp->local.n_xfer;
	if (pp->local.n && !(pp->local.msg = calloc((size_t)pp->local.n, sizeof *pp->local.msg)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < pp->local.n; i++)
		if ((st = kiln_device_event_create(sdev(pp, 0), &pp->local.msg[i].sent)) ||
		    (st = kiln_device_event_create(sdev(pp, 0), &pp->local.msg[i].copied)))
			return st;
	pp->tr = (struct kiln_stage_transport){ &local_ops, &pp->local };
	share_local(pp);
	return open_streams(pp);
}

/* The dropout counters' constant parts, through the host: each plan's
 * rstride (the model's: the data-parallel world) and the table of each
 * micro-batch's row0.  Micro-batch j of accumulation step a holds rows
 * [a * B + j * mb, + mb) of this rank's batches, whose global rows are
 * row0 + n * rstride with the model's layout (kiln_model_drop_layout). */
static kiln_status drop_rows(struct kiln_pipe *pp)
{
	const struct kiln_model *m = pp->m;
	const int64_t n = (int64_t)pp->A * pp->M, B = pp->mb * pp->M;
	const size_t bytes = (size_t)(8 * pp->K > n ? 8 * pp->K : n) * sizeof(int64_t);
	int64_t *host;
	kiln_status st = kiln_device_alloc_named(pp->dev, (size_t)n * sizeof(int64_t), (void **)&pp->rows_d,
					      "the pipeline's dropout rows (one a micro-batch)");
	if (st || (st = kiln_device_host_alloc_named(pp->dev, bytes, (void **)&host,
						     "the pipeline's dropout rows, their host staging")))
		return st;
	memset(host, 0, bytes);
	for (int k = 0; k < pp->K; k++)
		host[8 * k + 1] = m->drop_row0, host[8 * k + 2] = m->drop_rstride;
	st = kiln_device_copy_async(pp->dev, pp->steps_d, host, (size_t)pp->K * 64, KILN_COPY_H2D,
				    pp->stream);
	if (!st)
		st = kiln_device_stream_sync(pp->dev, pp->stream);
	for (int64_t i = 0; !st && i < n; i++)
		host[i] = m->drop_row0 + ((i / pp->M) * B + (i % pp->M) * pp->mb) * m->drop_rstride;
	if (!st)
		st = kiln_device_copy_async(pp->dev, pp->rows_d, host, (size_t)n * sizeof(int64_t),
					    KILN_COPY_H2D, pp->stream);
	if (!st)
		st = kiln_device_stream_sync(pp->dev, pp->stream);
	kiln_device_host_free(pp->dev, host);
	return st;
}

kiln_status kiln_pipe_open(struct kiln_model *m, int64_t batch, int64_t accumulate, int world,
			   void *stream, struct kiln_pipe **out)
{
	const struct kiln_config *cfg = m->cfg;
	int64_t M = 1, early = 0;
	int pair = 0, zero_copy = 0;
	const char *sched = kiln_config_get(cfg, "pipeline", "schedule");
	const char *pv = kiln_config_get(cfg, "pipeline", "sendrecv");
	const int pair_auto = !pv || !strcmp(pv, "auto");
	const char *dv = kiln_config_get(cfg, "pipeline", "defer_wgrad");
	int defer = 0;
	kiln_status st;
	*out = NULL;
	if (((st = kiln_config_get_int(cfg, "pipeline", "micro_batches", &M)) && st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_int(cfg, "pipeline", "early_forwards", &early)) &&
	     st != KILN_ENOTFOUND) ||
	    (!pair_auto && (st = kiln_config_get_bool(cfg, "pipeline", "sendrecv", &pair)) &&
	     st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_bool(cfg, "pipeline", "zero_copy", &zero_copy)) &&
	     st != KILN_ENOTFOUND) ||
	    (dv && strcmp(dv, "auto") &&
	     (st = kiln_config_get_bool(cfg, "pipeline", "defer_wgrad", &defer))))
		return st;
	if (accumulate < 1 || accumulate > INT32_MAX / M)
		return kiln_error(KILN_ECONFIG, "%s: [train] accumulate = %lld with %lld micro-batches",
				  kiln_config_where(cfg, "train", "accumulate"), (long long)accumulate,
				  (long long)M);
	if ((st = pipe_supported(m, world)))
		return st;
	if (batch % M)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch = %lld is not a multiple of [pipeline] micro_batches = %lld",
				  kiln_config_where(cfg, "pipeline", "micro_batches"), (long long)batch,
				  (long long)M);
	struct kiln_pipe *pp = calloc(1, sizeof *pp);
	if (!pp)
		return kiln_error(KILN_ENOMEM, "out of memory");
	pp->m = m;
	pp->dev = m->dev;
	pp->stream = stream;
	pp->P = m->n_stages;
	pp->mine = -1;
	pp->M = (int)M;
	pp->A = (int)accumulate;
	pp->mb = batch / M;
	pp->kind = sched && !strcmp(sched, "gpipe") ? KILN_PIPE_GPIPE : KILN_PIPE_1F1B;
	pp->early = pp->kind == KILN_PIPE_1F1B ? (int)early : 0;
	pp->pair = pair != 0; /* auto: 0 in one process (no sendrecv there) */
	pp->pair_auto = pair_auto;
	/* (auto: on while the CPUs are contended, core/pipe_wgrad.c) */
	pp->defer_set = dv && strcmp(dv, "auto") && defer;
	pp->defer = dv && strcmp(dv, "auto") && !defer ? -1 : 0;
	pp->wauto.want = !dv || !strcmp(dv, "auto");
	/* (where ranks may share them: stages on ranks, [dist] pipeline, on a
	 * device of host memory) */
	int64_t on_ranks = 1;
	kiln_config_get_int(cfg, "dist", "pipeline", &on_ranks);
	pp->zero_copy = !zero_copy || !(kiln_device_traits(m->dev)->caps & KILN_DEVICE_HOST_MEMORY)
				? 0
				: on_ranks > 1 ? 2 : 1;
	stage_ranges(pp);
	struct kiln_device *devs[KILN_PIPE_MAX_STAGES];
	for (int s = 0; s < pp->P; s++)
		devs[s] = sdev(pp, s);
	if ((st = seed_mean(pp)) || (st = open_plans(pp)) || (st = drop_rows(pp)) ||
	    (st = prepare_grads(pp)) ||
	    (st = kiln_pipe_timing_open(devs, pp->P, pp->act, 2 * pp->P * pp->M,
					kiln_pipe_bubble(pp->P, pp->M, pp->ticks),
					kiln_device_profile(m->dev), &pp->timing))) {
		kiln_pipe_free(pp);
		return st;
	}
	kiln_log(KILN_LOG_INFO, "pipeline", "%d stages, %d micro-batches of %lld, schedule %s%s: %d activation sets (%.3f MiB), %d crossing tensors, bubble %.3f in theory",
		 pp->P, pp->M, (long long)pp->mb, pp->kind == KILN_PIPE_GPIPE ? "gpipe" : "1f1b",
		 pp->early ? " with early forwards" : "", pp->K,
		 (double)kiln_pipe_arena_bytes(pp) / 1048576.0, pp->plan[0]->n_xfer,
		 kiln_pipe_bubble(pp->P, pp->M, pp->ticks));
	*out = pp;
	return KILN_OK;
}

/* The buffers this rank's stage sends the data from where the data
 * itself crosses (data_stable), made before the first step. */
static kiln_status data_buffers(struct kiln_pipe *pp, int mine)
{
	const struct kiln_plan *p = pp->plan[0];
	kiln_status st;
	for (int e = 0; e < p->n_xfer; e++) {
		if (p->xfer[e].from != mine || p->xfer[e].src >= 0)
			continue;
		if (!pp->xdata) {
			if (!(pp->xdata = calloc((size_t)p->n_xfer, sizeof *pp->xdata)))
				return kiln_error(KILN_ENOMEM, "out of memory");
			pp->n_xdata = p->n_xfer;
		}
		const size_t bytes = p->xfer[e].bytes;
		if ((st = kiln_device_alloc(sdev(pp, mine), bytes ? bytes : 1, &pp->xdata[e])))
			return kiln_error_wrap(st, "pipeline: stage %d: the buffer its data is sent from",
					       mine);
	}
	return KILN_OK;
}

kiln_status kiln_pipe_use_ranks(struct kiln_pipe *pp, const struct kiln_comm_ops *ops, void *comm,
				const char *name, int mine, const int *rank_of, const int *world_of)
{
	int n_tie = 0, su, so;
	while (pipe_tie_user(pp, n_tie, &su, &so) >= 0)
		n_tie++;
	kiln_status st = kiln_pipe_rank_open(ops, comm, pp->dev, pp->P, mine, rank_of, world_of,
					     pp->M, pp->plan[0]->n_xfer + n_tie, &pp->rk, &pp->tr);
	if (st)
		return st;
	pp->mine = mine;
	kiln_pipe_timing_only(pp->timing, mine);
	/* the crossing tensors in shared memory where the ranks can map it */
	const int n_xfer = pp->plan[0]->n_xfer;
	if ((st = data_buffers(pp, mine)))
		return st;
	if (pp->zero_copy == 2 && n_xfer && kiln_device_proc(pp->dev, KILN_PROC_HOST_FN)) {
		if (!(pp->shared = calloc((size_t)(2 * n_xfer), 1)))
			return kiln_error(KILN_ENOMEM, "out of memory");
		if ((st = kiln_pipe_window_open(pp->plan, pp->K, ops, comm, pp->P, mine, rank_of,
						world_of, pp->shared)))
			return st;
		kiln_pipe_rank_share(pp->rk, pp->shared, n_xfer,
				     kiln_pipe_window_direct(pp->plan[0], mine, pp->shared));
	}
	if (pp->pair_auto) {
		pp->pair = kiln_pipe_pair_auto(name);
		kiln_log(KILN_LOG_INFO, "pipeline", "stage %d: sendrecv = auto: hand-offs %s on %s",
			 mine, pp->pair ? "paired" : "not paired", name ? name : "this communicator");
	}
	return kiln_pipe_pairs_plan(pp, n_tie);
}

int kiln_pipe_hookable(const struct kiln_pipe *pp)
{
	return pp->mine >= 0 && !pp->gadd[pp->mine];
}

void kiln_pipe_grads_by_hook(struct kiln_pipe *pp)
{
	pp->hook_final = 1;
}

void kiln_pipe_free(struct kiln_pipe *pp)
{
	if (!pp)
		return;
	/* nothing freed while a stage's stream may still use it (a step that
	 * failed half enqueued: kiln_pipe_drain); before session 48 the plan
	 * frees' waits drained them on the CPU only by chance, and the rank
	 * transport's receive marks after a stage's last plan ran on freed
	 * messages */
	kiln_pipe_drain(pp);
	for (int s = 0; s < pp->P; s++) {
		if (pp->gadd[s])
			kiln_device_plan_free(sdev(pp, s), pp->gadd[s]);
	}
	for (int e = 0; pp->xadd && pp->plan && pp->plan[0] && e < pp->plan[0]->n_xfer; e++)
		if (pp->xadd[e])
			kiln_device_plan_free(sdev(pp, pp->plan[0]->xfer[e].from), pp->xadd[e]);
	kiln_pipe_wgrad_free(pp);
	kiln_pipe_rank_free(pp->rk);
	free(pp->shared);
	free(pp->pair_with);
	kiln_device_free(pp->dev, pp->seed_d);
	kiln_device_plan_free(pp->dev, pp->seed_op);
	for (int k = 0; pp->plan && k < pp->K; k++)
		kiln_plan_free(pp->plan[k]);
	for (int i = 0; pp->fdone && i < pp->K * pp->P; i++)
		kiln_device_event_destroy(sdev(pp, i % pp->P), pp->fdone[i]);
	for (int i = 0; pp->bdone && i < pp->K * pp->P; i++)
		kiln_device_event_destroy(sdev(pp, i % pp->P), pp->bdone[i]);
	for (int s = 0; s < pp->P; s++) {
		kiln_device_event_destroy(sdev(pp, s), pp->done[s]);
		kiln_device_stream_destroy(sdev(pp, s), pp->sst[s]);
	}
	kiln_device_event_destroy(pp->dev, pp->start);
	if (pp->local.copy)
		kiln_device_stream_destroy(sdev(pp, 0), pp->local.copy);
	free(pp->fdone);
	free(pp->bdone);
	for (int i = 0; pp->local.msg && i < pp->local.n; i++) {
		kiln_device_event_destroy(sdev(pp, 0), pp->local.msg[i].sent);
		kiln_device_event_destroy(sdev(pp, 0), pp->local.msg[i].copied);
	}
	kiln_pipe_timing_free(pp->timing);
	kiln_device_free(pp->dev, pp->grads_more);
	for (int k = 0; pp->tie && k < pp->K; k++)
		kiln_device_free(pp->dev, pp->tie[k]);
	free(pp->tie);
	kiln_device_free(pp->dev, pp->steps_d);
	kiln_device_free(pp->dev, pp->rows_d);
	free(pp->local.msg);
	free(pp->xadd);
	for (int e = 0; e < pp->n_xdata; e++)
		kiln_device_free(sdev(pp, pp->mine < 0 ? 0 : pp->mine), pp->xdata[e]);
	free(pp->xdata);
	free(pp->plan);
	free(pp->busy);
	free(pp->slot);
	free(pp->act);
	free(pp);
}
