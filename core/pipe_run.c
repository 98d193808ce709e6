/* core/pipe_run.c - the pipeline executor: a step's micro-batches run
 * through the stages in the schedule's order, each micro-batch in flight
 * with its own plan (activation arena), every crossing tensor moved by
 * the stage transport, each stage's gradients accumulated over the
 * micro-batches in its own slice of the flat buffer.  See pipeline.h and
 * docs/pipeline.md. */
#include "pipeline.h"
#include "profile.h"

/* ---- the local transport: one process, a copy stream, events --------- */

/* A message's slot is fixed by its tag (micro-batch, tensor, direction),
 * with events of its own: an event recorded again on another stream while
 * an earlier record is pending could complete the wrong wait, and a tag
 * recurs only a step later, after the stages have joined. */
struct local_msg {
	const void *buf;
	size_t bytes;
	void *sent, *copied;
	int used;
};

struct local_tr {
	struct kiln_device *dev;   /* the copy stream's (stage 0's) */
	struct kiln_device **sdev; /* each stage's, NULL: all dev */
	void *copy;          /* the copy stream (NULL: on the receiver's) */
	int n, n_xfer;       /* slots: micro-batches x tensors x 2 */
	struct local_msg *msg;
};

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

/* ---- the pipeline ------------------------------------------------------ */

struct kiln_pipe {
	struct kiln_model *m;
	struct kiln_device *dev;
	void *stream;                /* the trainer's compute stream */
	/* each stage's stream (concurrent where the device runs streams
	 * concurrently: CPU async = 1, CUDA); the step starts after `start`
	 * on the compute stream and the compute stream waits for each
	 * stage's `done`; fdone/bdone[k * P + s]: stage s's forward/backward
	 * of plan k done, which the next stage's pass waits for */
	void *sst[KILN_PIPE_MAX_STAGES], *done[KILN_PIPE_MAX_STAGES], *start;
	void **fdone, **bdone;
	int P, M, K, kind, ticks;
	int early;                   /* [pipeline] early_forwards (1f1b) */
	int A, a;                    /* [train] accumulate: steps per optimizer step, this one's */
	int64_t mb;                  /* micro-batch rows */
	struct kiln_plan **plan;     /* K: one per activation set alive */
	int64_t *steps_d;            /* K dropout counters (kiln/ops.h DROPOUT's
				      * { step, row0, rstride }), 8 i64 apart */
	int64_t *rows_d;             /* A * M: micro-batch j of accumulation
				      * step a's row0, at a * M + j */
	int *slot;                   /* M: the micro-batch's plan */
	char *busy;                  /* K */
	struct kiln_pipe_action *act;
	int lo[KILN_PIPE_MAX_STAGES], hi[KILN_PIPE_MAX_STAGES]; /* layers */
	size_t glo[KILN_PIPE_MAX_STAGES], ghi[KILN_PIPE_MAX_STAGES]; /* trainable slice */
	void *gadd[KILN_PIPE_MAX_STAGES], *gmean[KILN_PIPE_MAX_STAGES];
	float *grads_more;           /* micro-batches 1.. write here, where a layer
				      * cannot add in its ops (NULL: they add) */
	float **tie;                 /* K: each plan's gradients of tied weights' other users */
	void **xadd;                 /* per crossing tensor: the gradient return's add */
	/* stages on ranks, per crossing tensor that is the data (a stage
	 * whose output is its input, or a view of it: a flatten): the
	 * micro-batch's slice copied here on the stage's stream before it is
	 * sent, since the batch's buffer alternates between steps and the
	 * transport may read the source it was given after the training
	 * thread has enqueued the next step's (pipe_rank.c's send_try reads
	 * its slot's buffer when it runs); made before the first step
	 * (data_buffers), NULL: none */
	void **xdata;
	int n_xdata;
	struct kiln_stage_transport tr;
	struct local_tr local;
	/* stages on ranks (pipe_rank.c): this rank's stage, -1 for all */
	int mine;
	struct kiln_pipe_rank *rk;
	/* kiln_pipe_grads_by_hook: the last micro-batch's backward of this
	 * rank's stage runs with m->grad_final set, and gmean[mine] is gone */
	int hook_final;
	struct kiln_pipe_timing *timing; /* the measured bubble, NULL: none */
	int cur;                     /* the action being issued */
	float *seed_d;               /* the loss layers' seed scale (seed_mean),
				      * NULL: the stages scale to the mean */
	int pair;                    /* [pipeline] sendrecv, resolved */
	int zero_copy;               /* [pipeline] zero_copy on a device of host
				      * memory: 1 in one process (share_local),
				      * 2 with stages on ranks (pipe_window.c) */
	unsigned char *shared;       /* which crossing tensors the ranks share,
				      * 2 a tensor (kiln_pipe_window_open) */
	int pair_auto;               /* sendrecv = auto: kiln_pipe_use_ranks
				      * resolves it (kiln_pipe_pair_auto) */
	/* a transport with sendrecv: this rank's last send, held until its
	 * stage's next hand-off (a recv from the same stage pairs with it)
	 * or its next work (xsend, xrecv, xflush) */
	struct {
		int on, from, to;
		uint64_t tag;
		const void *buf;
		size_t bytes;
		void *stream;
	} held;
};

/* Stage s's device: its own ([run] devices) or the model's. */
static struct kiln_device *sdev(const struct kiln_pipe *pp, int s)
{
	return pp->m->stage_dev ? pp->m->stage_dev[s] : pp->dev;
}

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
 * laid out in layer order, so a stage's are contiguous). */
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
		int s = kiln_pipe_stage(m, q->layer);
		size_t end = q->off + kiln_align_up((size_t)q->numel * 4) / 4;
		if (q->off < pp->glo[s])
			pp->glo[s] = q->off;
		if (end > pp->ghi[s])
			pp->ghi[s] = end;
	}
}

/* The scale to the mean over each stage's slice; where a layer cannot
 * add its parameter gradients in its own ops (kiln_model_grad_accum_ok),
 * the second gradient buffer (its padding zeroed once) and the adds from
 * it; the adds of the gradient returns. */
static kiln_status prepare_grads(struct kiln_pipe *pp)
{
	kiln_status st;
	const struct kiln_plan *p0 = pp->plan[0];
	const int beside = !kiln_model_grad_accum_ok(pp->m);
	for (int s = 0; s < pp->P && pp->M * pp->A > 1; s++) {
		int64_t n = pp->ghi[s] > pp->glo[s] ? (int64_t)(pp->ghi[s] - pp->glo[s]) : 0;
		if (!n)
			continue;
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SCALE;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
		op.out[0] = op.in[0];
		op.f[0] = 1.0 / ((double)pp->M * (double)pp->A);
		if ((beside && (st = kiln_device_prepare_add(sdev(pp, s), n, &pp->gadd[s]))) ||
		    (st = kiln_device_prepare(sdev(pp, s), &op, &pp->gmean[s], NULL)))
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
 * gradient seed: device f32[1] 1 / (M x accumulate), which the plans made
 * now multiply their loss gradient by (m->seed_d, graph.h), so that every
 * gradient a stage computes, and returns, is already the mean's share and
 * no stage scales its slice after its last backward (a pass at the
 * drain, on stage 0 inside the pipeline's span).  Not with a loss scaler,
 * whose scale the loss layers multiply by instead: the stages then scale
 * their slices (gmean, prepare_grads). */
static kiln_status seed_mean(struct kiln_pipe *pp)
{
	kiln_status st;
	if (pp->M * pp->A == 1 || pp->m->scaler_d)
		return KILN_OK;
	const float mean = (float)(1.0 / ((double)pp->M * (double)pp->A));
	if ((st = kiln_device_alloc(pp->dev, 64, (void **)&pp->seed_d)) ||
	    (st = kiln_device_copy_async(pp->dev, pp->seed_d, &mean, sizeof mean, KILN_COPY_H2D,
					 pp->stream)))
		return st;
	return kiln_device_stream_sync(pp->dev, pp->stream);
}

/* The scale to the mean that seed_mean makes needless: gone. */
static void drop_mean(struct kiln_pipe *pp, int s)
{
	if (pp->gmean[s])
		kiln_device_plan_free(sdev(pp, s), pp->gmean[s]);
	pp->gmean[s] = NULL;
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
	pp->plan = calloc((size_t)pp->K, sizeof *pp->plan);
	pp->busy = calloc((size_t)pp->K, 1);
	if (!pp->plan || !pp->busy)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_device_alloc(pp->dev, (size_t)pp->K * 64, (void **)&pp->steps_d)))
		return st;
	pp->m->plan_staged = 1;
	pp->m->seed_d = pp->seed_d;
	for (int k = 0; k < pp->K && !st; k++) {
		st = kiln_model_plan(pp->m, pp->mb, 1, &pp->plan[k]);
		if (!st)
			pp->plan[k]->step_d = pp->steps_d + 8 * k;
	}
	pp->m->seed_d = NULL;
	pp->m->plan_staged = 0;
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
	kiln_status st = kiln_device_alloc(pp->dev, (size_t)n * sizeof(int64_t), (void **)&pp->rows_d);
	if (st || (st = kiln_device_host_alloc(pp->dev, bytes, (void **)&host)))
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
	kiln_status st;
	*out = NULL;
	if (((st = kiln_config_get_int(cfg, "pipeline", "micro_batches", &M)) && st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_int(cfg, "pipeline", "early_forwards", &early)) &&
	     st != KILN_ENOTFOUND) ||
	    (!pair_auto && (st = kiln_config_get_bool(cfg, "pipeline", "sendrecv", &pair)) &&
	     st != KILN_ENOTFOUND) ||
	    ((st = kiln_config_get_bool(cfg, "pipeline", "zero_copy", &zero_copy)) &&
	     st != KILN_ENOTFOUND))
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
	for (int s = 0; pp->seed_d && s < pp->P; s++)
		drop_mean(pp, s);
	kiln_log(KILN_LOG_INFO, "pipeline", "%d stages, %d micro-batches of %lld, schedule %s%s: %d activation sets (%.3f MiB), %d crossing tensors, bubble %.3f in theory",
		 pp->P, pp->M, (long long)pp->mb, pp->kind == KILN_PIPE_GPIPE ? "gpipe" : "1f1b",
		 pp->early ? " with early forwards" : "", pp->K,
		 (double)kiln_pipe_arena_bytes(pp) / 1048576.0, pp->plan[0]->n_xfer,
		 kiln_pipe_bubble(pp->P, pp->M, pp->ticks));
	*out = pp;
	return KILN_OK;
}

static uint64_t tag_of(int mb, int e, int back)
{
	return (uint64_t)mb << 32 | (uint64_t)e << 1 | (uint64_t)back;
}

/* ---- the hand-offs, paired where the transport can ----------------------
 * A stage's send is held (not yet enqueued) until its next hand-off or
 * work: a recv from the stage it sends to goes with it as one sendrecv
 * (1f1b's steady state on ranks: the activation to stage s + 1, then the
 * gradient from it; on stage s + 1 the gradient back, then the next
 * activation); anything else sends it first.  The order of each stage's
 * messages to each other stage is unchanged.  (A micro-batch's entry,
 * enter: a copy of its step counter into a free plan, may go between:
 * it touches nothing the send reads, and is no pass.) */

/* The held send, if any, enqueued alone: before the stage's work. */
static kiln_status xflush(struct kiln_pipe *pp)
{
	if (!pp->held.on)
		return KILN_OK;
	pp->held.on = 0;
	return pp->tr.ops->send(pp->tr.ctx, pp->held.from, pp->held.to, pp->held.tag, pp->held.buf,
				pp->held.bytes, pp->held.stream);
}

static kiln_status xsend(struct kiln_pipe *pp, int from, int to, uint64_t tag, const void *buf,
			 size_t bytes, void *stream)
{
	kiln_status st = xflush(pp);
	if (st || !pp->tr.ops->sendrecv || !pp->pair)
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
	    pp->held.stream == stream) {
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
static int tie_user(const struct kiln_pipe *pp, int n, int *su, int *so)
{
	const struct kiln_model *m = pp->m;
	for (int i = 0; pp->tie && i < m->n_layers; i++) {
		const struct model_layer *L = &m->layers[i];
		if (L->tie_grad < 0)
			continue;
		*su = kiln_pipe_stage(m, i);
		*so = kiln_pipe_stage(m, m->params[L->pidx[L->tie_slot]].layer);
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
	for (int t = 0, i; pp->mine >= 0 && (i = tie_user(pp, t, &su, &so)) >= 0; t++) {
		const struct model_param *q = tied_param(pp, i);
		struct kiln_model *m = pp->m;
		float *w = m->params_d + q->off;
		const size_t bytes = (size_t)q->numel * sizeof(float);
		/* (ZeRO-1: after the parameters' allgathers, as a forward reads them) */
		if (pp->mine == so && m->fwd_hook &&
		    (st = m->fwd_hook(m->fwd_user, m->n_layers, pp->sst[so])))
			return st;
		if (pp->mine == so &&
		    (st = pp->tr.ops->send(pp->tr.ctx, so, su, tag_of(0, n_xfer + t, 0), w, bytes,
					   pp->sst[so])))
			return st;
		if (pp->mine == su &&
		    (st = pp->tr.ops->recv(pp->tr.ctx, so, su, tag_of(0, n_xfer + t, 0), w, bytes,
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
	for (int t = 0; tie_user(pp, t, &su, &so) >= 0; t++)
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
	for (int t = 0, i; pp->mine >= 0 && (i = tie_user(pp, t, &su, &so)) >= 0; t++) {
		float *g = pp->tie[pp->slot[j]] + pp->m->layers[i].tie_grad;
		const size_t bytes = (size_t)tied_param(pp, i)->numel * sizeof(float);
		if (after && s == su &&
		    (st = xsend(pp, su, so, tag_of(j, n_xfer + t, 1), g, bytes, pp->sst[su])))
			return st;
		if (!after && s == so &&
		    (st = xrecv(pp, su, so, tag_of(j, n_xfer + t, 1), g, bytes, pp->sst[so])))
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
		    (st = xrecv(pp, xf->from, s, tag_of(j, e, 0), kiln_plan_store_ptr(p, xf->recv, x),
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
		if (xf->from == s && (st = xsend(pp, s, xf->to, tag_of(j, e, 0), src, xf->bytes, ss)))
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
			if ((st = xrecv(pp, to, s, tag_of(j, e, 1), dst, xf->bytes, pp->sst[s])))
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
 * beside them and add into the stage's slice; the last scales it to the
 * mean: stage 0 in the pass, a later stage once its inputs' gradients are
 * sent, unless the loss layers' seed holds the mean, seed_mean), then its
 * inputs' gradients sent back. */
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
	st = kiln_plan_backward_range(p, pp->lo[s], pp->hi[s], x, y, metrics, ss);
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
	/* the step's mean over the slice: on stage 0 in its last pass; on a
	 * later stage after the pass's hand-off, so that the stage before it
	 * runs its last backward meanwhile (outside the pass's stamps) */
	const int mean = j == pp->M - 1 && pp->a == pp->A - 1 && pp->gmean[s] != NULL;
	struct kiln_op_args ga = { .in = { g }, .out = { g } };
	if (mean && !s && (st = kiln_device_run(sdev(pp, s), pp->gmean[s], &ga, ss)))
		return st;
	if ((st = kiln_pipe_timing_mark(pp->timing, sdev(pp, s), ss, pp->cur, 1)) ||
	    (st = kiln_device_event_record(sdev(pp, s), pp->bdone[k * pp->P + s], ss)))
		return st;
	for (int e = 0; e < p->n_xfer; e++) {
		const struct plan_xfer *xf = &p->xfer[e];
		if (xf->to == s && xf->grecv >= 0 &&
		    (st = xsend(pp, s, xf->from, tag_of(j, e, 1), kiln_plan_store_ptr(p, xf->grecv, x),
				xf->bytes, ss)))
			return st;
	}
	if (mean && s && ((st = xflush(pp)) || (st = kiln_device_run(sdev(pp, s), pp->gmean[s], &ga, ss))))
		return st;
	return tie_grads(pp, s, j, 1);
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
	kiln_status st = kiln_device_copy_async(sdev(pp, s0), ctr, pp->m->drop_d, sizeof(int64_t),
						KILN_COPY_D2D, ss);
	if (!st)
		st = kiln_device_copy_async(sdev(pp, s0), ctr + 1, pp->rows_d + pp->a * pp->M + j,
					    sizeof(int64_t), KILN_COPY_D2D, ss);
	if (!st)
		st = kiln_model_count_advance(pp->m, ss);
	if (!st && j == pp->M - 1 && pp->a == pp->A - 1)
		st = kiln_model_drop_step(pp->m, ss);
	return st;
}

kiln_status kiln_pipe_step(struct kiln_pipe *pp, const void *x, const void *y, size_t label_bytes,
			   void *metrics)
{
	const size_t xrow = kiln_tensor_bytes(&pp->m->sample);
	kiln_status st;
	/* the stages start after the batch's copy and the last optimizer step */
	if ((st = kiln_device_event_record(pp->dev, pp->start, pp->stream)))
		return st;
	for (int s = 0; s < pp->P; s++)
		if ((st = kiln_device_stream_wait(sdev(pp, s), pp->sst[s], pp->start)))
			return st;
	pp->held.on = 0; /* (a step that failed may have left one) */
	if ((st = tie_weights(pp)) || (st = refresh_copy(pp)))
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
				pp->busy[pp->slot[j]] = 0;
			continue;
		}
		const char *xj = (const char *)x + (size_t)j * (size_t)pp->mb * xrow;
		const char *yj = (const char *)y + (size_t)j * (size_t)pp->mb * label_bytes;
		st = a->kind == KILN_PIPE_FWD ? stage_forward(pp, p, a->stage, j, xj, yj, metrics)
					      : stage_backward(pp, p, a->stage, j, xj, yj, metrics);
		if (st)
			return st;
		if (a->kind == KILN_PIPE_BWD && a->stage == 0)
			pp->busy[pp->slot[j]] = 0;
	}
	/* the optimizer (and the metrics' read-back) after every stage */
	if ((st = xflush(pp)))
		return st;
	for (int s = 0; s < pp->P; s++)
		if ((pp->mine < 0 || s == pp->mine) &&
		    ((st = kiln_device_event_record(sdev(pp, s), pp->done[s], pp->sst[s])) ||
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
	while (tie_user(pp, n_tie, &su, &so) >= 0)
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
	return KILN_OK;
}

int kiln_pipe_hookable(const struct kiln_pipe *pp, double *mean)
{
	*mean = pp->seed_d ? 1.0 : 1.0 / ((double)pp->M * (double)pp->A);
	return pp->mine >= 0 && !pp->gadd[pp->mine];
}

void kiln_pipe_grads_by_hook(struct kiln_pipe *pp)
{
	drop_mean(pp, pp->mine);
	pp->hook_final = 1;
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

void kiln_pipe_free(struct kiln_pipe *pp)
{
	if (!pp)
		return;
	for (int s = 0; s < pp->P; s++) {
		if (pp->gadd[s])
			kiln_device_plan_free(sdev(pp, s), pp->gadd[s]);
		if (pp->gmean[s])
			kiln_device_plan_free(sdev(pp, s), pp->gmean[s]);
	}
	for (int e = 0; pp->xadd && pp->plan && pp->plan[0] && e < pp->plan[0]->n_xfer; e++)
		if (pp->xadd[e])
			kiln_device_plan_free(sdev(pp, pp->plan[0]->xfer[e].from), pp->xadd[e]);
	kiln_pipe_rank_free(pp->rk);
	free(pp->shared);
	kiln_device_free(pp->dev, pp->seed_d);
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
