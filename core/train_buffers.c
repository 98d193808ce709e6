/* core/train_buffers.c - the buffers and ops a run's steps use besides
 * the model's plans (alloc_buffers): the staging ring and device slots,
 * the f32 input a device-side transform widens into, the metric sums,
 * and for training the learning-rate schedule op, the accumulation's
 * scale and second gradient buffer, and the clip and non-finite check
 * (prep_clip, from the model's preparation in core/train_model.c).  Part
 * of trainer_open (core/train_setup.c); see train_setup.h.
 */
#include "train_setup.h"

#include <math.h>
#include <string.h>


static kiln_status prep_fill(struct kiln_device *dev, int64_t n, double v, void **plan)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_FILL;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &n);
	op.f[0] = v;
	return kiln_device_prepare(dev, &op, plan, NULL);
}

/* [train] milestones into op.i[4..]: ascending step counts after the
 * warmup, their number in op.i[3]. */
static kiln_status parse_milestones(const struct trainer *t, struct kiln_op *op)
{
	int64_t m[KILN_MAX_MILESTONES];
	int n = kiln_parse_milestones(t->tc.milestones, m);
	if (n < 0)
		return kiln_error(KILN_ECONFIG, "%s: [train] milestones: up to 12 ascending step counts, e.g. `3000, 6000`",
				  kiln_config_where(t->cfg, "train", "milestones"));
	op->i[3] = n;
	for (int k = 0; k < n; k++)
		op->i[4 + k] = m[k];
	return KILN_OK;
}

/* onecycle's rise ends at step pct_start x U - 1 after the warmup (U of
 * them): at exactly 0 the rise is 0 steps long and its first rate 0/0
 * (NaN: PyTorch's OneCycleLR raises ZeroDivisionError there).  The step
 * count is known only now (the schedule's length: schedule_length), so
 * the config check cannot see it; the expression is the device's
 * (scalar_ops.h).  Only the optimizer step right after the warmup
 * computes that 0/0: a resumed run whose optimizer-step counter (`first`,
 * the op's first step: what it reads) is past it (a resume that changed
 * the global batch, so the length, after its rise) computes none and runs
 * (before session 40 it was refused).  The counter, not the trainer's
 * step: steps skipped for non-finite gradients (fp16's loss scale backing
 * off) advance the trainer's step alone, and a resume past the warmup by
 * trainer steps but not by optimizer steps still computes the 0/0 (before
 * session 41 it ran, its lr NaN). */
static kiln_status check_onecycle(const struct trainer *t, int64_t total, int64_t first)
{
	const double pct = t->tc.pct_start;
	const int64_t U = total - t->tc.warmup > 1 ? total - t->tc.warmup : 1;
	char skipped[200] = "";
	if (pct * (double)U - 1 != 0 || first > t->tc.warmup)
		return KILN_OK;
	if (t->step0 > first)
		snprintf(skipped, sizeof skipped, " (the resumed checkpoint's %lld step(s) took %lld optimizer step(s), the others skipped for non-finite gradients: the rise is still ahead)",
			 (long long)t->step0, (long long)first);
	/* (any other pct_start works; 1.5 / U rises over one step) */
	return kiln_error(KILN_ECONFIG, "%s: [train] pct_start = %g with schedule = onecycle over %lld step(s)%s: pct_start x steps = 1 leaves the rise to lr no step (OneCycleLR divides by zero there)%s: use another pct_start, e.g. %g, or another number of steps",
			  kiln_config_where(t->cfg, "train", "pct_start"), pct, (long long)U,
			  t->tc.warmup > 0 ? " after the warmup" : "", skipped, 1.5 / (double)U);
}

/* The optimizer steps taken so far, the device's counter (a resumed run's
 * from its checkpoint's "optim.step"; 0 at a fresh start): a sync, at
 * start-up only, read through t->metrics_host's bytes 32..39, which
 * nothing else uses (its floats [0..3] are the sums and the lr, [4] an
 * evaluation's rows counted): no
 * allocation of its own that one rank could fail alone. */
static kiln_status opt_steps_taken(const struct trainer *t, int64_t *out)
{
	int64_t *host = (int64_t *)(t->metrics_host + 8);
	kiln_status st;
	*out = 0;
	if (!t->resumed)
		return KILN_OK;
	if (!(st = kiln_device_copy_async(t->dev, host, t->m->opt_step_d, sizeof *host,
					  KILN_COPY_D2H, t->compute)) &&
	    !(st = kiln_device_stream_sync(t->dev, t->compute)))
		*out = *host;
	return st;
}

/* lr_scale's factor at a global batch: global / base_batch (linear), its
 * square root (sqrt), 1 (none). */
static double lr_scale_factor(const struct trainer *t, int64_t global)
{
	const char *how = t->tc.lr_scale;
	if (!how || !strcmp(how, "none"))
		return 1.0;
	const double r = (double)global / (double)t->tc.base_batch;
	return !strcmp(how, "sqrt") ? sqrt(r) : r;
}

/* [train] lr scaled by the global batch (lr_scale, base_batch); logged. */
static double scaled_lr(const struct trainer *t, int64_t global)
{
	const char *how = t->tc.lr_scale;
	const double lr = t->tc.lr;
	const int64_t base = t->tc.base_batch;
	if (!how || !strcmp(how, "none"))
		return lr;
	const double s = lr_scale_factor(t, global);
	kiln_log(KILN_LOG_INFO, "train", "lr_scale = %s: lr %g x %s(%lld / %lld) = %g", how, lr,
		 !strcmp(how, "sqrt") ? "sqrt" : "", (long long)global, (long long)base, lr * s);
	return lr * s;
}

/* The schedule's length T (cosine and onecycle read it; constant, step,
 * multistep, exponential, linear and polynomial do not): the step the run
 * ends at, t->last_step
 * (trainer_last_step: the checkpoint's step, the rest of its epoch and
 * the epochs left in this run's global batch G, or max_steps when that
 * comes first).  For a run whose G never changed that is epochs x steps
 * per epoch, or max_steps when less: T as before session 38.  Then T was
 * that product in the new G after a resume that changed G (batch,
 * ranks), though the steps done were taken in the old one: 8 steps at
 * G = 8 of 3 epochs of 64 samples, resumed at G = 16, ended at step 16
 * of a T of 12, its last 4 steps at lr_min (cosine) or past onecycle's
 * end, rising again.  Counted from the checkpoint's position, a second
 * resume in the same G continues the first's schedule.  A run that takes
 * no step (complete, or epochs or max_steps set below its step) keeps
 * the product: it computes no lr, and onecycle's check must not refuse
 * it over a length of 0. */
static int64_t schedule_length(const struct trainer *t)
{
	if (t->last_step > t->step0)
		return t->last_step;
	const int64_t spe = t->steps_per_epoch, epochs = t->tc.epochs;
	int64_t total = epochs > INT64_MAX / spe ? INT64_MAX : epochs * spe;
	if (t->tc.max_steps > 0 && t->tc.max_steps < total)
		total = t->tc.max_steps;
	return total;
}

/* What makes a schedule other than it reads, warned of once its length
 * and scaled rate are known: a warm-up as long as the run (the rate never
 * reaches lr, the schedule never starts) and a cosine whose scaled lr is
 * below lr_min (it anneals upward). */
static void schedule_warn(const struct trainer *t, double lr, int64_t total)
{
	const struct kiln_train_cfg *tc = &t->tc;
	if (tc->warmup > 0 && total > 0 && tc->warmup >= total)
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] warmup = %lld is at least the run's %lld step(s): the rate rises to lr x %lld / %lld = %g at the last step, never to lr = %g, and the schedule (%s) never starts",
			 kiln_config_where(t->cfg, "train", "warmup"), (long long)tc->warmup,
			 (long long)total, (long long)total, (long long)tc->warmup,
			 lr * (double)total / (double)tc->warmup, lr,
			 tc->schedule ? tc->schedule : "constant");
	/* gamma's default, 0.1, is StepLR's and MultiStepLR's; ExponentialLR
	 * has none, and x 0.1 a step leaves no rate to speak of within a few
	 * steps: a gamma left unset is likely one forgotten */
	if (tc->schedule && !strcmp(tc->schedule, "exponential") &&
	    !strcmp(kiln_config_where(t->cfg, "train", "gamma"), "default"))
		kiln_log(KILN_LOG_WARN, "train", "schedule = exponential with [train] gamma at its default %g: the rate x %g every step (lr %g after 10 steps); set gamma (0.95 to 0.9999 are usual)",
			 tc->gamma, tc->gamma, lr * pow(tc->gamma, 10));
	if (tc->schedule && !strcmp(tc->schedule, "cosine") && lr < tc->lr_min)
		kiln_log(KILN_LOG_WARN, "train", "%s: schedule = cosine anneals upward, from lr = %g to lr_min = %g (lr_min is the final rate%s): lower lr_min",
			 kiln_config_where(t->cfg, "train", "lr_min"), lr, tc->lr_min,
			 lr != tc->lr ? "; lr_scale scales lr, not lr_min" : "");
}

/* The schedule's own parameters into op's i[3..] and f[2..]
 * (KILN_OP_LR_SCHEDULE in kiln/ops.h says where each goes). */
static kiln_status schedule_params(struct trainer *t, int64_t total, struct kiln_op *op)
{
	const struct kiln_train_cfg *tc = &t->tc;
	kiln_status st;
	op->i[3] = tc->step_size;
	op->f[2] = tc->gamma;
	op->f[3] = tc->final_div_factor;
	op->f[4] = tc->pct_start;
	switch (op->i[0]) {
	case KILN_SCHED_ONECYCLE:
		op->f[2] = tc->div_factor;
		op->i[5] = tc->three_phase;
		op->i[6] = tc->anneal_linear;
		/* its first step: the optimizer-step counter it reads
		 * (check_onecycle) */
		if ((st = opt_steps_taken(t, &op->i[4])) || (st = check_onecycle(t, total, op->i[4])))
			return st;
		return KILN_OK;
	case KILN_SCHED_MULTISTEP:
		return parse_milestones(t, op);
	case KILN_SCHED_LINEAR:
		op->i[3] = tc->total_iters;
		op->f[2] = tc->start_factor;
		op->f[3] = tc->end_factor;
		return KILN_OK;
	case KILN_SCHED_POLYNOMIAL:
		op->i[3] = tc->total_iters;
		op->f[2] = tc->power;
		return KILN_OK;
	}
	return KILN_OK;
}

/* The learning-rate schedule: a device op computing the step's lr from the
 * model's step counter, so no per-step scalar crosses from the host.
 * Prepared once the run's position is known (open_loop): its length
 * depends on the checkpoint's position. */
kiln_status prep_schedule(struct trainer *t)
{
	/* [train] schedule's choices, in KILN_SCHED_* order */
	static const char *const kinds[] = { "constant", "cosine",      "step",   "multistep",
					     "onecycle", "exponential", "linear", "polynomial" };
	const struct kiln_train_cfg *tc = &t->tc;
	const char *kind = tc->schedule;
	const double lr = scaled_lr(t, t->G);
	const int64_t total = schedule_length(t);
	struct kiln_op op;
	int64_t one = 1;
	kiln_status st;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_LR_SCHEDULE;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_I64, 1, &one);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
	op.i[0] = KILN_SCHED_CONSTANT;
	for (int k = 0; kind && k < (int)KILN_ARRAY_LEN(kinds); k++)
		if (!strcmp(kind, kinds[k]))
			op.i[0] = k;
	op.i[1] = total;
	op.i[2] = tc->warmup;
	op.f[0] = lr;
	op.f[1] = tc->lr_min;
	if ((st = schedule_params(t, total, &op)))
		return st;
	/* plateau: the constant schedule of 1 gives the warm-up's factor,
	 * which a MUL takes times the plateau's rate (train_plateau.c) */
	if (kind && !strcmp(kind, "plateau")) {
		/* a resume in another global batch: the checkpoint's rate x
		 * lr_scale's factor's change, as the other schedules' base */
		const double rescale = t->G_ckpt > 0 ? lr_scale_factor(t, t->G) /
							       lr_scale_factor(t, t->G_ckpt)
						     : 1.0;
		op.f[0] = 1.0;
		if ((st = trainer_plateau_prepare(t, lr, rescale)))
			return st;
	}
	if (!t->rank)
		schedule_warn(t, lr, total);
	kiln_log(KILN_LOG_DEBUG, "train", "schedule %s over %lld steps, warmup %lld",
		 kind ? kind : "constant", (long long)total, (long long)tc->warmup);
	return kiln_device_prepare(t->dev, &op, &t->sched, NULL);
}

/* With accumulation, where a layer cannot add its parameter gradients
 * in its own ops (kiln_model_grad_accum_ok): the second gradient buffer
 * and the add that folds it in.  (The mean is the loss seed's:
 * plan_train, train_model.c.) */
static kiln_status prep_accumulate(struct trainer *t)
{
	kiln_status st;
	const int64_t acc = t->acc;
	if (acc > 1 && t->m->n_trainable) {
		int64_t n = (int64_t)t->m->n_trainable;
		/* (a pipeline accumulates in kiln_pipe_step: no second buffer here) */
		const int in_ops = kiln_model_grad_accum_ok(t->m);
		if (!in_ops && !t->pipe && ((st = kiln_device_alloc(t->dev, t->m->n_elems * sizeof(float),
							(void **)&t->grads_more)) ||
				(st = kiln_device_prepare_add(t->dev, n, &t->grads_add))))
			return st;
		/* on ranks (not a pipeline's: kiln_dist_pipe_overlap says its
		 * own) the buckets start in the last micro-step's backward
		 * when its ops make the sum (micro_ops) */
		const int ov = kiln_dist_overlap(t->dist);
		const char *when = t->world < 2 || t->pipe ? ""
				   : !ov   ? "; the buckets start after the last micro-batch's backward ([dist] overlap = 0)"
				   : in_ops ? "; the buckets start during the last micro-batch's backward"
					    : "; the buckets start after the last micro-batch's backward and add";
		/* a pipeline's M micro-batches of each of the acc batches
		 * share the mean: its seed is 1/(M x acc) (pipe_open.c
		 * seed_mean; before session 37 this said 1/acc there too) */
		const int64_t seed = t->pipe ? acc * kiln_pipe_micro_batches(t->pipe) : acc;
		char pm[96] = "";
		if (t->pipe)
			snprintf(pm, sizeof pm, ": %lld x %d pipeline micro-batches", (long long)acc,
				 kiln_pipe_micro_batches(t->pipe));
		kiln_log(KILN_LOG_INFO, "train", "accumulate = %lld: one optimizer step per %lld micro-batches (global batch %lld); gradients added %s, each %smicro-batch's loss gradient seeded with 1/%lld of %s (PyTorch's loss / %lld%s)%s",
			 (long long)acc, (long long)acc, (long long)(acc * t->B * (t->world > 0 ? t->world : 1)),
			 t->pipe ? "by the pipeline's stages" : in_ops ? "by the layers' ops" : "from a second buffer",
			 t->pipe ? "pipeline " : "", (long long)seed,
			 t->m->scaler_d ? "the loss scale" : "1", (long long)seed, pm, when);
		if (in_ops || t->pipe)
			return KILN_OK;
		/* backward never writes the alignment padding between tensors:
		 * zero it once, so the add folds zeros into it */
		void *fill;
		if ((st = prep_fill(t->dev, (int64_t)t->m->n_elems, 0.0, &fill)))
			return st;
		struct kiln_op_args a = { .out = { t->grads_more } };
		st = kiln_device_run(t->dev, fill, &a, t->compute);
		kiln_status st2 = kiln_device_stream_sync(t->dev, t->compute);
		kiln_device_plan_free(t->dev, fill);
		if (st || st2)
			return st ? st : st2;
	}
	return KILN_OK;
}

kiln_status trainer_clip_over(struct trainer *t, size_t n)
{
	struct kiln_op op;
	void *plan = NULL;
	kiln_op_grad_clip(&op, (int64_t)n);
	op.f[0] = t->tc.clip_norm;
	op.f[1] = t->tc.clip_value;
	kiln_status st = kiln_device_prepare(t->dev, &op, &plan, NULL);
	if (st)
		return st;
	kiln_device_plan_free(t->dev, t->clip);
	t->clip = plan;
	return KILN_OK;
}

/* Clipping and the non-finite check ([train] clip_norm, clip_value,
 * skip_nonfinite): one op over the gradients before each optimizer step,
 * whose finite flag the optimizer reads.  Before optim_prepare. */
kiln_status prep_clip(struct trainer *t)
{
	const double norm = t->tc.clip_norm, value = t->tc.clip_value;
	const int skip = t->tc.skip_nonfinite;
	kiln_status st;
	if (t->m->scaler_d && !skip)
		return kiln_error(KILN_ECONFIG, "%s: [train] skip_nonfinite = 0 with loss scaling ([run] precision = %s): a step whose scaled gradients overflow must be skipped",
				  kiln_config_where(t->cfg, "train", "skip_nonfinite"), t->run.precision);
	if ((!skip && norm <= 0 && value <= 0) || !t->m->n_trainable)
		return KILN_OK;
	/* with loss scaling the unscale op takes the clip's place: the same
	 * state and flag, the gradients divided by the device scale first */
	if (t->m->scaler_d)
		st = kiln_model_precision_prepare(t->m, norm, value, &t->clip);
	else
		st = trainer_clip_over(t, t->m->n_trainable);
	if (st ||
	    (st = kiln_device_alloc_named(t->dev, 64, (void **)&t->clip_d,
					  "the gradients' clipping state (norm, finite, skipped, clipped)")) ||
	    (st = kiln_device_host_alloc_named(t->dev, 64, (void **)&t->clip_host,
					       "the gradients' clipping state, its host copy")) ||
	    (st = prep_fill(t->dev, 2, 0.0, &t->fill_counts)))
		return st;
	memset(t->clip_host, 0, 4 * sizeof(float));
	t->clip_host[1] = 1.0f;
	if ((st = kiln_device_copy_async(t->dev, t->clip_d, t->clip_host, 4 * sizeof(float),
					 KILN_COPY_H2D, t->compute)) ||
	    (st = kiln_device_stream_sync(t->dev, t->compute)))
		return st;
	/* a skip needs the flag; clipping alone never skips */
	if (skip)
		t->m->step_ok_d = t->clip_d + 1;
	return KILN_OK;
}

/* transform_on = device (or bf16 samples): the f32 input the device
 * widens into, and every batch size the run will see prepared now:
 * nothing is prepared inside a step. */
static kiln_status alloc_norm(struct trainer *t, int64_t rows)
{
	const struct train_set *first = t->training ? &t->train : &t->test;
	const int do_eval = !t->training || t->tc.eval;
	kiln_status st;
	t->norm_bytes = (size_t)rows * kiln_tensor_bytes(&first->input);
	if ((st = kiln_device_alloc(t->dev, t->norm_bytes, &t->x_norm)))
		return st;
	if (t->training)
		kiln_log(KILN_LOG_INFO, "data", "%zu-byte %s samples copied, %s on the device",
			 t->sample_bytes, kiln_dtype_name(first->ds.sample.dtype),
			 first->ds.sample.dtype == KILN_U8 ? "normalised" : "widened to f32");
	struct train_set *const sets[] = { &t->train, &t->test, &t->test, &t->val, &t->val };
	const int64_t EB = t->EB;
	const int64_t sizes[] = { t->training ? t->B : 0, do_eval ? EB : 0,
				  do_eval ? t->test.len % EB : 0, t->have_val ? EB : 0,
				  t->have_val ? t->val.len % EB : 0 };
	for (size_t i = 0; i < KILN_ARRAY_LEN(sizes); i++) {
		int k;
		if (sizes[i] > 0 && (st = trainer_norm_plan(t, sets[i], sizes[i], 1, &k)))
			return st;
	}
	return KILN_OK;
}

/* The staging ring and device slots, sized for the larger batch; the
 * metric sums; training: the accumulation buffers (the schedule comes
 * later, prep_schedule: its length needs the checkpoint's position). */
kiln_status alloc_buffers(struct trainer *t)
{
	const struct train_set *first = t->training ? &t->train : &t->test;
	const int do_eval = !t->training || t->tc.eval;
	int64_t rows = !t->training || (do_eval && t->EB > t->B) ? t->EB : t->B;
	kiln_status st;
	t->sample_bytes = first->ds.sample_bytes;
	t->label_bytes = first->ds.label_bytes;
	t->x_bytes = (size_t)rows * t->sample_bytes;
	if (kiln_dataset_widened(&first->ds) && (st = alloc_norm(t, rows)))
		return st;
	const size_t y_bytes = (size_t)rows * t->label_bytes;
	for (int s = 0; s < SLOTS; s++) {
		int dev = 0; /* which failed: named (it was "cpu: alloc of 1568000 bytes failed") */
		if ((st = kiln_device_host_alloc(t->dev, t->x_bytes, &t->x_host[s])) ||
		    (st = kiln_device_host_alloc(t->dev, y_bytes, &t->y_host[s])) ||
		    (dev = 1, st = kiln_device_alloc(t->dev, t->x_bytes, &t->x_dev[s])) ||
		    (st = kiln_device_alloc(t->dev, y_bytes, &t->y_dev[s])))
			return kiln_error_wrap(st, "the trainer's %s input slot %d of %d (a batch of %lld samples and labels, %zu bytes; %s)",
					       dev ? "device" : "host", s + 1, SLOTS, (long long)rows,
					       t->x_bytes + y_bytes,
					       rows == t->B ? "[train] batch" : "[train] eval_batch");
	}
	if ((t->training && (st = kiln_device_alloc_named(t->dev, 64, (void **)&t->lr_dev,
							  "the trainer's learning rate"))) ||
	    (st = kiln_device_alloc_named(t->dev, 64, (void **)&t->metrics_dev,
					  "the trainer's metric sums")) ||
	    (st = kiln_device_host_alloc_named(t->dev, 64, (void **)&t->metrics_host,
					       "the trainer's metric sums, their host copy")) ||
	    /* the sums (loss, correct, top-5) and an evaluation's rows
	     * counted (core/train_eval.c) */
	    (st = prep_fill(t->dev, 4, 0.0, &t->fill_metrics)) ||
	    (t->training && (st = prep_accumulate(t))))
		return st;
	struct kiln_op_args a = { .out = { t->metrics_dev } };
	return kiln_device_run(t->dev, t->fill_metrics, &a, t->compute);
}
