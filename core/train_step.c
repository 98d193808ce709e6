/* core/train_step.c - trainer_step: one optimizer step (its micro-steps'
 * batches loaded, forward, backward, accumulation, then the optimizer),
 * issued op by op or replayed as a captured graph.  See train.h. */
#include "train.h"
#include <stdio.h> /* snprintf */

/* transform_on = device: out f32 [rows, C, H, W] = (x u8 / 255 - mean) / std */
/* The plan for `rows`, prepared at setup (prep) or looked up (the step). */
kiln_status trainer_norm_plan(struct trainer *t, struct train_set *d, int64_t rows, int prep,
			      int *kout)
{
	kiln_status st;
	int k = 0;
	while (k < NORM_PLANS && t->norm_plan[k] && (t->norm_rows[k] != rows || t->norm_of[k] != d))
		k++;
	if (k == NORM_PLANS || (!prep && !t->norm_plan[k]))
		return kiln_error(KILN_EINTERNAL, "normalize: no plan for %lld rows", (long long)rows);
	if (!t->norm_plan[k]) {
		struct kiln_op op;
		int64_t dims[4] = { rows, d->ds.sample.dims[0], d->ds.sample.dims[1],
				    d->ds.sample.dims[2] };
		memset(&op, 0, sizeof op);
		/* bf16 samples are widened; u8 ones normalised */
		op.type = d->ds.sample.dtype == KILN_BF16 ? KILN_OP_CAST : KILN_OP_NORMALIZE_U8;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], d->ds.sample.dtype, 4, dims);
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 4, dims);
		op.in[0].layout = op.out[0].layout = KILN_NCHW;
		for (int c = 0; c < 3; c++) {
			op.f[c] = d->ds.xf.mean[c];
			op.f[3 + c] = d->ds.xf.std[c];
		}
		if ((st = kiln_device_prepare(t->dev, &op, &t->norm_plan[k], NULL)))
			return st;
		t->norm_rows[k] = rows;
		t->norm_of[k] = d;
	}
	*kout = k;
	return KILN_OK;
}

static kiln_status normalize_on_device(struct trainer *t, struct train_set *d, const void *x,
				       int64_t rows)
{
	int k;
	kiln_status st = trainer_norm_plan(t, d, rows, 0, &k);
	if (st)
		return st;
	struct kiln_op_args a = { .in = { x }, .out = { t->x_norm } };
	trainer_label(t, "input", KILN_PHASE_DATA);
	st = kiln_device_run(t->dev, t->norm_plan[k], &a, t->compute);
	trainer_label(t, NULL, 0);
	return st;
}

/* The batch's rows on the host: the loader workers' (assembled already, in
 * the same order), or read on this thread into staging slot s. */
static kiln_status host_batch(struct trainer *t, struct train_set *d, const int64_t *idx,
			      int64_t rows, int s, const char **xh, const int32_t **yh, int *ls)
{
	kiln_status st;
	if (d->loader) {
		int64_t got;
		const void *x;
		double w0 = t->prof ? kiln_loader_wait_s(d->loader) : 0;
		if ((st = kiln_loader_next(d->loader, &x, yh, &got, ls)))
			return st;
		if (t->prof) {
			/* the loader's own measure of the wait, ending now */
			int64_t t1 = kiln_now_ns();
			int64_t w = (int64_t)((kiln_loader_wait_s(d->loader) - w0) * 1e9);
			kiln_profile_span(t->prof, "data wait", "loader", KILN_PHASE_DATA,
					  KILN_PROF_TRACK_WAIT, t1 - w, t1);
		}
		if (got != rows)
			return kiln_error(KILN_EINTERNAL, "loader: batch of %lld rows, expected %lld",
					  (long long)got, (long long)rows);
		*xh = x;
		return KILN_OK;
	}
	/* x_host[s] is free once its copy is done, or once the step that read
	 * it in place is */
	if (t->slot_used[s] &&
	    (st = kiln_device_staging_wait(t->dev, t->slot_in_place[s] ? t->compute_done[s]
									: t->copy_done[s])))
		return st;
	int64_t t0 = kiln_now_ns();
	if ((st = kiln_dataset_read_rows(&d->ds, t->epoch, idx, rows, t->x_host[s], t->y_host[s],
					 &t->scratch)))
		return st;
	int64_t t1 = kiln_now_ns();
	if (d == &t->train) /* the train line's data_wait */
		t->read_s += 1e-9 * (double)(t1 - t0);
	if (t->prof)
		kiln_profile_span(t->prof, "data read", "inline", KILN_PHASE_DATA,
				  KILN_PROF_TRACK_WAIT, t0, t1);
	*xh = t->x_host[s];
	*yh = t->y_host[s];
	return KILN_OK;
}

/* Whether the compute stream reads the batch's x where the host
 * assembled it (the loader's slot or x_host) instead of a copy in device
 * memory: on a device whose memory is the host's (the CPU), for
 * evaluation, and for training once its steps are known to be issued op
 * by op (a captured step replays fixed addresses: x_dev), without a
 * pipeline (its stages read x on streams of their own) or resident = 1
 * (which keeps the first batch). */
static int read_in_place(const struct trainer *t, const struct train_set *d)
{
	if (!(kiln_device_traits(t->dev)->caps & KILN_DEVICE_HOST_MEMORY))
		return 0;
	return d != &t->train || (t->graph_mode == -1 && !t->pipe && !t->data.resident);
}

/* Assemble rows idx[0..rows) into staging slot s and enqueue their copy;
 * the compute stream then waits for it.  Rows past `rows` up to `pad` are
 * not touched (a remainder plan has exactly `rows` rows).  Read in place
 * (read_in_place), x is not copied: the labels' copy alone is enqueued,
 * and the loader's slot is released after the ops of its step, at the
 * next load (before the loader is asked for the next batch, so a ring of
 * one slot cannot wait on itself). */
kiln_status trainer_load_batch(struct trainer *t, struct train_set *d, const int64_t *idx,
			       int64_t rows, int *slot_out, void **x_out)
{
	int s = (int)(t->step_counter++ % SLOTS), ls = -1;
	kiln_status st;
	const char *xh = NULL;
	const int32_t *yh = NULL;
	const int in_place = read_in_place(t, d);
	trainer_phase(t, KILN_PHASE_DATA, 1);
	if (d->held) { /* the slot the last step read in place */
		const int held = d->held - 1;
		d->held = 0;
		if ((st = kiln_loader_release(d->loader, held, t->compute)))
			return st;
	}
	/* (a rank's error names it: each reads its own share; of all the
	 * ranks, t->world being the data-parallel ones under [dist] pipeline) */
	if ((st = host_batch(t, d, idx, rows, s, &xh, &yh, &ls)))
		return t->dist ? kiln_error_wrap(st, "rank %d of %d", t->rank, kiln_dist_world(t->dist))
			       : st;
	/* the device slot is free once the step that last read it is done */
	if (t->slot_used[s] && (st = kiln_device_stream_wait(t->dev, t->copy, t->compute_done[s])))
		return st;
	trainer_label(t, "input", KILN_PHASE_DATA);
	st = in_place ? KILN_OK
		      : kiln_device_copy_async(t->dev, t->x_dev[s], xh,
					       (size_t)rows * t->sample_bytes, KILN_COPY_H2D, t->copy);
	if (!st)
		st = kiln_device_copy_async(t->dev, t->y_dev[s], yh, (size_t)rows * t->label_bytes,
					    KILN_COPY_H2D, t->copy);
	trainer_label(t, NULL, 0);
	if (st ||
	    (st = kiln_device_event_record(t->dev, t->copy_done[s], t->copy)) ||
	    (st = kiln_device_stream_wait(t->dev, t->compute, t->copy_done[s])))
		return st;
	if (ls >= 0 && in_place)
		d->held = ls + 1;
	else if (ls >= 0 && (st = kiln_loader_release(d->loader, ls, t->copy)))
		return st;
	t->slot_used[s] = 1;
	t->slot_in_place[s] = in_place;
	*slot_out = s;
	void *x = in_place ? (void *)xh : t->x_dev[s];
	*x_out = x;
	if (kiln_dataset_widened(&d->ds)) {
		if ((st = normalize_on_device(t, d, x, rows)))
			return st;
		*x_out = t->x_norm;
	}
	trainer_phase(t, KILN_PHASE_DATA, 0);
	return KILN_OK;
}

/* ---- one training step ---------------------------------------------------
 * micro_ops: micro-step j of acc: forward, backward (buckets start during
 * it), accumulation and the step counter, on the compute stream.
 * optim_ops: the optimizer step after the last micro-step: the gradients'
 * allreduce, clip or unscale, the schedule, the fused optimizer, the loss
 * scale.  Both read every per-step value (lr, step counts, loss scale,
 * RNG counter) from device memory, so a captured graph of them replays
 * correct steps; what they do on the host (the dist engine's bucket
 * flags, phases and labels) leaves no state a replay would need. */

static kiln_status micro_ops(struct trainer *t, void *xd, void *yd, int64_t j)
{
	struct kiln_plan *p = t->ptrain;
	const int64_t acc = t->acc;
	kiln_status st;
	/* the first micro-step writes the gradients, the others add into
	 * them in the layers' ops, or where a layer cannot (no grads_more
	 * then) write beside them and add */
	t->m->grad_out_d = j ? t->grads_more : NULL;
	t->m->grad_accum = j && !t->grads_more;
	t->sums_run = 0; /* (the gradients' block sums this backward takes) */
	trainer_phase(t, KILN_PHASE_FORWARD, 1);
	/* the step's loss seed, scale / acc, from the scale the last
	 * optimizer step (or a resume) left: each micro-step's gradients
	 * are their share of the mean (plan_train, train_model.c) */
	st = j ? KILN_OK : kiln_model_seed_update(t->m, t->seed_d, t->seed_op, t->compute);
	if (!st)
		st = kiln_plan_forward(p, xd, yd, t->metrics_dev, t->compute);
	trainer_phase(t, KILN_PHASE_FORWARD, 0);
	if (st)
		return st;
	trainer_phase(t, KILN_PHASE_BACKWARD, 1);
	/* buckets start during the backward that makes them final: the
	 * last micro-step's, when the layers' ops add into the gradients
	 * (the sum is the mean already: the seed), not when a second
	 * buffer's add still follows it (PyTorch's no_sync() for the others) */
	kiln_dist_overlap_next(t->dist, j == acc - 1 && !t->grads_more);
	st = kiln_plan_backward(p, xd, yd, t->metrics_dev, t->compute);
	t->m->grad_accum = 0;
	trainer_label(t, "accumulate", KILN_PHASE_BACKWARD);
	if (!st && j && t->grads_more) {
		struct kiln_op_args a = { .in = { t->m->grads_d, t->grads_more },
					  .out = { t->m->grads_d } };
		st = kiln_device_run(t->dev, t->grads_add, &a, t->compute);
	}
	trainer_label(t, NULL, 0);
	trainer_phase(t, KILN_PHASE_BACKWARD, 0);
	/* the micro-step count (batchnorm's), and dropout's counter: the
	 * next micro-step's rows of the global batch, or the next step */
	trainer_label(t, "step counter", KILN_PHASE_OPTIMIZER);
	if (!st)
		st = kiln_model_count_advance(t->m, t->compute);
	if (!st)
		st = kiln_model_drop_advance(t->m, j, t->compute);
	trainer_label(t, NULL, 0);
	return st;
}

static kiln_status optim_ops(struct trainer *t)
{
	kiln_status st = KILN_OK;
	t->m->grad_out_d = NULL;
	trainer_phase(t, KILN_PHASE_OPTIMIZER, 1);
	if (t->dist) {
		/* the optimizer waits for every bucket's average */
		trainer_label(t, "allreduce", KILN_PHASE_OPTIMIZER);
		st = kiln_dist_finish_grads(t->dist, t->compute);
		trainer_label(t, NULL, 0);
	}
	if (!st && trainer_grad_fn)
		st = trainer_grad_fn(trainer_grad_user, t->dev, t->compute, t->m->grads_d,
				     t->m->n_trainable, t->step + 1);
	if (!st && t->clip) { /* GRAD_CLIP, or UNSCALE reading the loss scale */
		float *g = t->m->grads_d;
		size_t gn;
		kiln_dist_pipe_grad_span(t->dist, &g, &gn); /* (a stage's alone) */
		struct kiln_op_args a = { .in = { g, t->m->scaler_d }, .out = { g, t->clip_d } };
		/* the block sums the backward took (core/train_gradsums.c) */
		const int sums = trainer_sums_taken(t);
		if (sums)
			a.in[1] = t->sums_d;
		if (sums && !t->sums_said) /* (once: tests/grad_sums.sh) */
			kiln_log(KILN_LOG_DEBUG, "train", "non-finite check from per-layer sums (step %lld)",
				 (long long)t->step + 1);
		t->sums_said |= sums;
		trainer_label(t, "clip", KILN_PHASE_OPTIMIZER);
		/* stages on ranks: the norm and the skip are the pipe's */
		st = kiln_dist_pipe_norms(t->dist, t->compute);
		if (!st)
			st = kiln_device_run(t->dev, sums ? t->clip_sums : t->clip, &a, t->compute);
		if (!st)
			st = kiln_dist_pipe_norms_done(t->dist, t->compute);
		trainer_label(t, NULL, 0);
	}
	if (!st) {
		/* this step's lr from the device's optimizer-step counter
		 * (plateau: its warm-up factor, times the plateau's rate) */
		struct kiln_op_args a = { .in = { t->m->opt_step_d },
					  .out = { t->plateau_mul ? t->plateau_d + 1 : t->lr_dev } };
		trainer_label(t, "schedule", KILN_PHASE_OPTIMIZER);
		st = kiln_device_run(t->dev, t->sched, &a, t->compute);
		if (!st && t->plateau_mul)
			st = trainer_plateau_run(t);
	}
	trainer_label(t, "optimizer", KILN_PHASE_OPTIMIZER);
	if (!st && kiln_dist_zero(t->dist)) /* this rank's shard, then allgather */
		st = kiln_dist_zero_step(t->dist, t->lr_dev, t->compute);
	else if (!st && kiln_dist_pipe_owns(t->dist)) /* this rank's stage */
		st = kiln_dist_pipe_step(t->dist, t->lr_dev, t->compute);
	else if (!st) /* advances the optimizer-step counter too */
		st = kiln_model_optim_step(t->m, t->lr_dev, t->compute);
	trainer_label(t, "loss scale", KILN_PHASE_OPTIMIZER);
	if (!st) /* dynamic loss scaling: grow or back off, on the device */
		st = kiln_model_precision_update(t->m, t->clip_d, t->compute);
	trainer_label(t, NULL, 0);
	trainer_phase(t, KILN_PHASE_OPTIMIZER, 0);
	return st;
}

/* Captured steps, decided at the first step after the warm-up: the
 * device captures (capture_begin does not answer KILN_ENOTSUP) and the
 * step can be captured whole.  *begun = 1 when a capture is under way. */
static kiln_status graph_decide(struct trainer *t, int *begun)
{
	const char *why = t->acc > 1 ? "[train] accumulate > 1 (each micro-batch is loaded between the micro-steps)"
			  : trainer_grad_fn ? "a gradient hook is installed (kiln_set_grad_hook)"
					    : NULL;
	void *g;
	*begun = 0;
	t->graph_mode = -1;
	/* ZeRO-1: the previous step's parameter allgathers were enqueued
	 * outside the capture, which cannot wait for them */
	kiln_status st = kiln_dist_zero_settle(t->dist, t->compute);
	/* (ENOTSUP also while profiling: the profiler times every op) */
	if (!st)
		st = kiln_device_capture_begin(t->dev, t->compute);
	if (st == KILN_ENOTSUP) {
		kiln_log(KILN_LOG_DEBUG, "train", "steps are issued one by one: %s", kiln_last_error());
		return KILN_OK;
	}
	if (st)
		return st;
	if (why) {
		if ((st = kiln_device_capture_end(t->dev, t->compute, &g)))
			return st;
		kiln_device_graph_free(t->dev, g);
		/* a warning only for a capture asked for (CUDA's is on by default) */
		char sec[64];
		snprintf(sec, sizeof sec, "plugin.%s", kiln_device_name(t->dev));
		const int asked = strcmp(kiln_config_where(t->cfg, sec, "graph"), "default") != 0;
		kiln_log(asked ? KILN_LOG_WARN : KILN_LOG_INFO, "train", "the %s device captures steps ([plugin.%s] graph), but this run issues them one by one: %s",
			 kiln_device_name(t->dev), kiln_device_name(t->dev), why);
		return KILN_OK;
	}
	t->graph_mode = 1;
	*begun = 1;
	return KILN_OK;
}

/* One whole step (acc = 1) as a replay of the graph of input slot s,
 * captured first if there is none yet (the capture runs nothing: the
 * launch after it runs the step). */
static kiln_status graph_step(struct trainer *t, void *xd, int s, int begun)
{
	kiln_status st;
	if (!t->graph[s]) {
		if (!begun && ((st = kiln_dist_zero_settle(t->dist, t->compute)) ||
			       (st = kiln_device_capture_begin(t->dev, t->compute))))
			return st;
		st = micro_ops(t, xd, t->y_dev[s], 0);
		if (!st)
			st = optim_ops(t);
		/* ZeRO-1: the comm stream's parameter allgathers rejoin the
		 * captured stream (a capture cannot end with them pending, nor
		 * can the next one wait for them): replayed steps do not
		 * overlap them with the next forward */
		if (!st)
			st = kiln_dist_zero_settle(t->dist, t->compute);
		void *g;
		kiln_status st2 = kiln_device_capture_end(t->dev, t->compute, &g);
		if (st || st2) {
			kiln_device_graph_free(t->dev, g);
			return kiln_error_wrap(st ? st : st2, "capturing the training step");
		}
		t->graph[s] = g;
		kiln_log(KILN_LOG_INFO, "train", "step %lld captured (input slot %d); the steps replay it",
			 (long long)t->step + 1, s);
	}
	return kiln_device_graph_launch(t->dev, t->graph[s], t->compute);
}

/* Micro-step j of the step: its batch (resident = 1: the first one, kept),
 * then its ops, issued or replayed. */
static kiln_status micro_step(struct trainer *t, int64_t j)
{
	const int64_t B = t->B;
	int s = t->res_slot;
	void *xd = t->res_x;
	kiln_status st;
	t->epoch = t->ep;
	if (!t->res_x &&
	    (st = trainer_load_batch(t, &t->train, t->order + ((t->k - t->k0) * t->acc + j) * B, B,
				     &s, &xd)))
		return st;
	if (t->data.resident && !t->res_x) {
		t->res_slot = s;
		t->res_x = xd;
	}
	/* after the warm-up step, a whole step may be captured once and
	 * replayed (graph_decide); the batch's copy and wait stay outside */
	int begun = 0;
	if (!t->graph_mode && t->step > t->step0 && (st = graph_decide(t, &begun)))
		return st;
	if (t->pipe) {
		trainer_phase(t, KILN_PHASE_FORWARD, 1);
		st = kiln_pipe_step(t->pipe, xd, t->y_dev[s], t->label_bytes, t->metrics_dev);
		trainer_phase(t, KILN_PHASE_FORWARD, 0);
	} else if (t->graph_mode == 1) {
		st = graph_step(t, xd, s, begun);
		t->res->steps_replayed++;
	} else {
		st = micro_ops(t, xd, t->y_dev[s], j);
	}
	if (st || (st = kiln_device_event_record(t->dev, t->compute_done[s], t->compute)))
		return st;
	t->since += B;
	return KILN_OK;
}

kiln_status trainer_step(struct trainer *t)
{
	kiln_status st;
	if (t->prof)
		kiln_profile_step(t->prof, 1);
	/* the metric sums' counts exact: read before they pass 2^24 samples,
	 * kept aside for the next log point as an evaluation's are */
	if ((st = trainer_metrics_room(t, t->acc * t->B, &t->carry_loss, &t->carry_correct)))
		return st;
	for (int64_t j = 0; j < t->acc; j++)
		if ((st = micro_step(t, j)))
			return st;
	if (t->graph_mode != 1 && (st = optim_ops(t)))
		return st;
	t->step++;
	if (t->step == t->step0 + 1 && !t->have_prev)
		trainer_counters_mark(t); /* steady state starts after the first step */
	return KILN_OK;
}
