/* core/dist_pipe_mem.c - [dist] pipeline = P: a rank holds its stage's
 * parameters and gradients alone (docs/pipeline.md, "Stages on ranks",
 * "Parameters and gradients per stage").
 *
 * The flat buffers keep the whole model's offsets: every plan, bucket and
 * optimizer view addresses a stage's tensors by them.  A rank allocates
 * only its stage's slice [lo, hi) and points m->params_d and m->grads_d
 * lo floats before it (the stage's own layers, the only ones it runs,
 * read and write inside the slice; nothing below lo or from hi on is
 * touched while training).  The gradients are cut when the pipe opens,
 * before anything writes them: [P norm slots | hi - lo floats], the slots
 * holding the other stages' gradient norms for the clip and non-finite
 * check (kiln_dist_pipe_norms).  The parameters are cut after the
 * start-up broadcast or the resume (kiln_dist_pipe_shard), which work on
 * the whole model.  kiln_dist_pipe_gather makes them whole again for a
 * checkpoint, an evaluation and the end of training, in a buffer that
 * kiln_dist_pipe_release frees.  Which combinations keep which buffer
 * whole: grads_why, params_why.
 *
 * Where neither needs the whole model, nothing whole is made at start-up
 * either (kiln_dist_pipe_hold): the model is created bare, and the rank
 * allocates and draws its stage's slice alone (the draws are keyed by the
 * tensors, so the bytes are one process's), its optimizer state comes
 * zeroed per stage (kiln_dist_pipe_shard), and the cuts above find the
 * buffers already cut.  A resume or [model] init_from still start whole
 * (rank 0 reads the whole checkpoint, a file's loader writes whole). */
#include "dist_impl.h"
#include "pipeline.h"

/* Why this rank keeps the whole gradient buffer (NULL: it can cut it). */
static const char *grads_why(const struct kiln_dist *d, const struct kiln_model *m)
{
	if (!d->pipe_P || !m->n_trainable)
		return "";
	if (m->optim_info.shard == KILN_OPTIM_SHARD_NONE)
		return "the optimizer reads whole tensors through the whole model's offsets";
	if (m->scaler_d)
		return "loss scaling: the unscale op runs over the whole buffer";
	return NULL;
}

/* ... and the whole parameters, where the gradients are cut. */
static const char *params_why(const struct kiln_model *m)
{
	if (m->params_c || m->cdtype != KILN_F32)
		return "low-precision compute: the compute copy is cast from the whole buffer";
	if (m->n_elems != m->n_trainable)
		return "frozen parameters, laid out after every stage's trainable ones";
	for (int i = 0; i < m->n_layers; i++)
		if (m->layers[i].tie >= 0 && kiln_pipe_stage(m, i) != kiln_pipe_stage(m, m->layers[i].tie))
			return "a weight tied across stages (its user's rank receives it at the owner's offset)";
	return NULL;
}

static size_t slice_n(const struct kiln_dist *d)
{
	const int s = d->pipe_stage;
	return d->pipe_hi[s] > d->pipe_lo[s] ? d->pipe_hi[s] - d->pipe_lo[s] : 0;
}

/* n floats at p set to 0 on the compute stream, waited for. */
static kiln_status zero_floats(struct kiln_device *dev, float *p, size_t n, void *compute)
{
	struct kiln_op op;
	void *fill = NULL;
	int64_t ne = (int64_t)n;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &ne);
	kiln_status st = kiln_device_prepare(dev, &op, &fill, NULL);
	if (st)
		return st;
	struct kiln_op_args a = { .out = { p } };
	st = kiln_device_run(dev, fill, &a, compute);
	kiln_status st2 = kiln_device_stream_sync(dev, compute);
	kiln_device_plan_free(dev, fill);
	return st ? st : st2;
}

/* The stage's gradients: [P slots | n] in the stage group's shared memory
 * (share: D > 1 and the communicator has it) or the device's. */
static kiln_status alloc_grads(struct kiln_dist *d, struct kiln_model *m, int share,
			       size_t floats, float **out, int *foreign)
{
	void *mem = NULL;
	kiln_status st = KILN_ENOTSUP;
	*foreign = 0;
	if (share && d->ops->version >= 3 && d->ops->alloc_shared) {
		st = d->ops->alloc_shared(d->gctx ? d->gctx : d->ctx, floats * sizeof(float), &mem);
		if (st && st != KILN_ENOTSUP)
			return st;
		if (st)
			kiln_log(KILN_LOG_INFO, "dist", "the stage's gradients in device memory, allreduced through the communicator's own buffers (%s)",
				 kiln_last_error());
	}
	if (!st) {
		memset(mem, 0, floats * sizeof(float));
		*foreign = 1;
		*out = mem;
		kiln_log(KILN_LOG_INFO, "dist", "the stage's gradients (%.3g MiB) in memory every rank's %s reaches: bucket allreduces copy nothing",
			 (double)(floats * sizeof(float)) / 1048576.0, d->plugin->name);
		return KILN_OK;
	}
	if ((st = kiln_device_alloc(m->dev, floats * sizeof(float), &mem)))
		return kiln_model_alloc_failed(m, st, "gradients for this pipeline stage alone",
					       floats * sizeof(float), floats);
	*out = mem;
	return KILN_OK;
}

kiln_status kiln_dist_pipe_zero(struct kiln_dist *d, float *p, size_t n, void *compute)
{
	return n ? zero_floats(d->dev, p, n, compute) : KILN_OK;
}

/* Stage s's slice [*lo, *hi) of the trainables (its layers' tensors are
 * laid out in layer order: contiguous), as kiln_pipe_open finds it;
 * *lo = *hi = n_trainable for a stage without any. */
static void stage_slice(const struct kiln_model *m, int s, size_t *lo, size_t *hi)
{
	*lo = m->n_trainable, *hi = 0;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *q = &m->params[i];
		if (!q->trainable || kiln_pipe_param_stage(m, q) != s)
			continue;
		const size_t end = q->off + kiln_align_up((size_t)q->numel * 4) / 4;
		if (q->off < *lo)
			*lo = q->off;
		if (end > *hi)
			*hi = end;
	}
	if (*hi < *lo)
		*hi = *lo;
}

/* Why this rank's start-up makes the whole model (NULL: the stage's
 * slice alone will do). */
static const char *hold_why(struct kiln_dist *d, struct kiln_model *m)
{
	const char *why;
	kiln_status st;
	if ((st = kiln_pipe_read_stages(m)))
		return "the stages are read again, and checked, when the pipeline opens";
	if (m->n_stages != d->pipe_P)
		return "the model's stages are not [dist] pipeline's (an error when the pipeline opens)";
	if (d->zero)
		return "ZeRO-1 makes its shards of the optimizer state (or reads them, resuming, through the whole gradients) before the cut";
	if ((why = grads_why(d, m)) || (why = params_why(m)))
		return *why ? why : "nothing to train";
	return NULL;
}

kiln_status kiln_dist_pipe_hold(struct kiln_dist *d, struct kiln_model *m, int share,
				void *compute)
{
	const char *why = d && d->pipe_P ? hold_why(d, m) : "";
	kiln_status st;
	if (why) {
		if (*why)
			kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): the model is created and initialised whole at start-up: %s",
				 d->env.rank, d->pipe_stage, why);
		return kiln_model_alloc_whole(m);
	}
	const int P = d->pipe_P;
	size_t lo, hi;
	stage_slice(m, d->pipe_stage, &lo, &hi);
	const size_t n = hi - lo;
	float *g = NULL, *p = NULL;
	int foreign = 0;
	if ((st = alloc_grads(d, m, share, (size_t)P + n, &g, &foreign)))
		return st;
	if (!foreign && (st = zero_floats(m->dev, g, (size_t)P + n, compute))) {
		kiln_device_free(m->dev, g);
		return st;
	}
	if ((st = kiln_device_alloc(d->dev, (n ? n : 1) * sizeof(float), (void **)&p))) {
		if (!foreign)
			kiln_device_free(m->dev, g);
		return kiln_model_alloc_failed(m, st, "parameters for this pipeline stage alone",
					       (n ? n : 1) * sizeof(float), n);
	}
	d->m = m;
	d->pipe_gbuf = g;
	d->pipe_pbuf = p;
	d->pipe_cut = 1;
	m->grads_d = g + P - lo; /* (offsets in [lo, hi) only) */
	m->params_d = p - lo;
	m->grads_foreign = foreign;
	m->held = 1;
	m->held_lo = lo;
	m->held_hi = hi;
	m->bare = 0;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): holds the stage's parameters and gradients alone: %zu + %zu floats, %zu bytes allocated (the whole model's: %zu + %zu floats), from start-up on: created and initialised as the stage's alone, its optimizer state the stage's",
		 d->env.rank, d->pipe_stage, n, n + (size_t)P, (n + n + (size_t)P) * sizeof(float),
		 m->n_elems, m->n_elems);
	return KILN_OK;
}

kiln_status kiln_dist_pipe_cut_grads(struct kiln_dist *d, struct kiln_model *m, int share,
				     void *compute)
{
	const char *why = d ? grads_why(d, m) : "";
	kiln_status st;
	if (d)
		d->m = m;
	if (m->held) { /* (cut since start-up: kiln_dist_pipe_hold) */
		const int s = d->pipe_stage;
		if (d->pipe_lo[s] != m->held_lo || slice_n(d) != m->held_hi - m->held_lo)
			return kiln_error(KILN_EINTERNAL, "rank %d (pipeline stage %d): the stage's slice [%zu, %zu) is not the one held since start-up [%zu, %zu)",
					  d->env.rank, s, d->pipe_lo[s], d->pipe_hi[s], m->held_lo,
					  m->held_hi);
		return KILN_OK;
	}
	if (why) {
		if (*why)
			kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): the whole model's parameters and gradients stay allocated here: %s",
				 d->env.rank, d->pipe_stage, why);
		/* (the gradients' shared memory, as without a pipeline) */
		return share ? kiln_dist_share_grads(d, m) : KILN_OK;
	}
	const int P = d->pipe_P;
	const size_t n = slice_n(d), lo = d->pipe_lo[d->pipe_stage];
	float *g = NULL;
	int foreign = 0;
	/* (ZeRO-1 reduce-scatters from device memory: no shared gradients) */
	if ((st = alloc_grads(d, m, share && !d->zero, (size_t)P + n, &g, &foreign)))
		return st;
	if (!foreign && (st = zero_floats(m->dev, g, (size_t)P + n, compute))) {
		kiln_device_free(m->dev, g);
		return st;
	}
	if (!m->grads_foreign)
		kiln_device_free(m->dev, m->grads_d);
	d->pipe_gbuf = g;
	m->grads_d = g + P - lo; /* (offsets in [lo, hi) only) */
	m->grads_foreign = foreign;
	d->pipe_cut = 1;
	return KILN_OK;
}

/* *out: `floats` new floats, n of them from src copied in at `at` on the
 * compute stream (freed again on failure); `what` the model's buffer they
 * are, for the message where they cannot be allocated. */
static kiln_status alloc_copy(struct kiln_dist *d, size_t floats, size_t at, const float *src,
			      size_t n, void *compute, const char *what, float **out)
{
	float *p = NULL;
	kiln_status st = kiln_device_alloc(d->dev, (floats ? floats : 1) * sizeof(float), (void **)&p);
	if (st)
		return kiln_model_alloc_failed(d->m, st, what, (floats ? floats : 1) * sizeof(float),
					       floats);
	if (n && (st = kiln_device_copy_async(d->dev, p + at, src, n * sizeof(float), KILN_COPY_D2D,
					      compute))) {
		kiln_device_free(d->dev, p);
		return st;
	}
	*out = p;
	return KILN_OK;
}

kiln_status kiln_dist_pipe_cut_params(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	const size_t n = slice_n(d), lo = d->pipe_lo[d->pipe_stage];
	const size_t held = (n + (n + (size_t)d->pipe_P)) * sizeof(float);
	float *p = NULL;
	kiln_status st;
	const char *why = params_why(m);
	if (!d->pipe_cut || d->pipe_pbuf)
		return KILN_OK;
	if (why) {
		kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): holds the stage's gradients alone: %zu floats, %zu bytes allocated (the whole model's: %zu floats); the whole parameters stay allocated here: %s",
			 d->env.rank, d->pipe_stage, n + (size_t)d->pipe_P,
			 (n + (size_t)d->pipe_P) * sizeof(float), m->n_elems, why);
		return KILN_OK;
	}
	if ((st = alloc_copy(d, n, 0, m->params_d + lo, n, compute,
			     "parameters for this pipeline stage alone", &p)))
		return st;
	if ((st = kiln_device_stream_sync(d->dev, compute))) {
		kiln_device_free(d->dev, p);
		return st;
	}
	kiln_device_free(d->dev, m->params_d);
	d->pipe_pbuf = p;
	m->params_d = p - lo;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): holds the stage's parameters and gradients alone: %zu + %zu floats, %zu bytes allocated (the whole model's: %zu + %zu floats)",
		 d->env.rank, d->pipe_stage, n, n + (size_t)d->pipe_P, held, m->n_elems, m->n_elems);
	return KILN_OK;
}

kiln_status kiln_dist_pipe_whole(struct kiln_dist *d, void *compute)
{
	const size_t n = slice_n(d), lo = d->pipe_lo[d->pipe_stage];
	kiln_status st;
	if (!d->pipe_pbuf || d->pipe_pwhole)
		return KILN_OK;
	/* the other stages' parameters are overwritten by the gather */
	if ((st = alloc_copy(d, d->m->n_elems, lo, d->pipe_pbuf, n, compute,
			     "whole parameters gathered from the pipeline's stages", &d->pipe_pwhole)))
		return st;
	d->m->params_d = d->pipe_pwhole;
	return KILN_OK;
}

kiln_status kiln_dist_pipe_whole_agreed(struct kiln_dist *d, kiln_status st, void *compute)
{
	double none = 0;
	if (!st)
		st = kiln_dist_ckpt_fault_at(d, "whole", "the whole parameter buffer of the gather");
	return kiln_dist_sum_agreed(d, st, &none, 0, "gathering the stages' parameters", compute);
}

/* Stage s's parameters and layer buffers from world rank s (its rank in
 * pipe 0) to rank 0's whole buffers, point-to-point; nothing on the other
 * ranks. */
static kiln_status slice_to_rank0(struct kiln_dist *d, int s, void *compute)
{
	struct kiln_model *m = d->m;
	const int r = d->env.rank;
	const size_t lo = d->pipe_lo[s], n = d->pipe_hi[s] > lo ? d->pipe_hi[s] - lo : 0;
	kiln_status st = KILN_OK;
	if (r && r != s)
		return KILN_OK;
	if (n)
		st = r ? d->ops->send(d->ctx, m->params_d + lo, n * 4, KILN_U8, 0, compute, NULL)
		       : d->ops->recv(d->ctx, m->params_d + lo, n * 4, KILN_U8, s, compute, NULL);
	for (int i = 0; !st && i < m->n_params; i++) {
		const struct model_param *q = &m->params[i];
		float *b = m->buffers_d + q->off;
		const size_t bytes = (size_t)q->numel * 4;
		if (!q->buffer || kiln_pipe_param_stage(m, q) != s)
			continue;
		st = r ? d->ops->send(d->ctx, b, bytes, KILN_U8, 0, compute, NULL)
		       : d->ops->recv(d->ctx, b, bytes, KILN_U8, s, compute, NULL);
	}
	return st ? kiln_error_wrap(st, "gathering stage %d's parameters on rank 0", s) : st;
}

kiln_status kiln_dist_pipe_gather_to0(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	/* (point-to-point on the compute stream after the comm stream's; the
	 * slice's copy too, as kiln_dist_pipe_gather's) */
	if (d->comm_stream && ((st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)) ||
			       (st = kiln_device_stream_wait(d->dev, compute, d->ready))))
		return st;
	/* (rank 0: a whole buffer, its own stage's slice copied in; agreed
	 * on before the sends, which otherwise waited for rank 0's receives
	 * after its allocation failed; session 43) */
	if ((st = kiln_dist_pipe_whole_agreed(d, d->env.rank ? KILN_OK : kiln_dist_pipe_whole(d, compute),
					      compute)))
		return st;
	for (int s = 1; s < d->pipe_P; s++)
		if ((st = slice_to_rank0(d, s, compute)))
			return kiln_dist_explain(d, st);
	if ((st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	kiln_model_weights_written(d->m);
	return KILN_OK;
}

kiln_status kiln_dist_pipe_release(struct kiln_dist *d, void *compute)
{
	if (!d || !d->pipe_pwhole)
		return KILN_OK;
	/* what read the whole buffer (a checkpoint's copy, an evaluation) is
	 * done with it once the stream is */
	kiln_status st = kiln_device_stream_sync(d->dev, compute);
	if (st)
		return st;
	d->m->params_d = d->pipe_pbuf - d->pipe_lo[d->pipe_stage];
	kiln_device_free(d->dev, d->pipe_pwhole);
	d->pipe_pwhole = NULL;
	return KILN_OK;
}

int kiln_dist_pipe_held(const struct kiln_dist *d, size_t *lo, size_t *hi)
{
	if (!d || !d->pipe_cut || d->pipe_pwhole)
		return 0;
	*lo = d->pipe_lo[d->pipe_stage];
	*hi = d->pipe_hi[d->pipe_stage];
	return 1;
}

int kiln_dist_pipe_grad_span(const struct kiln_dist *d, float **g, size_t *n)
{
	if (!d || !d->pipe_cut)
		return 0;
	*g = d->pipe_gbuf;
	*n = (size_t)d->pipe_P + slice_n(d);
	return 1;
}

void kiln_dist_pipe_mem_free(struct kiln_dist *d)
{
	struct kiln_model *m = d->m;
	if (!d->pipe_cut)
		return;
	/* the model frees what its pointers address: give it the buffers */
	if (m && d->pipe_pwhole) {
		kiln_device_free(d->dev, d->pipe_pbuf);
		m->params_d = d->pipe_pwhole;
	} else if (m && d->pipe_pbuf) {
		m->params_d = d->pipe_pbuf;
	}
	if (m) {
		m->grads_d = d->pipe_gbuf;
		m->held = 0;
	}
	d->pipe_pbuf = d->pipe_pwhole = d->pipe_gbuf = NULL;
	d->pipe_cut = 0;
}
