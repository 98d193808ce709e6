/* core/train_setup.c - trainer_open and trainer_close: what a run sets up
 * before its first step (the device, the data sets, the model and its
 * plans, the staging and device buffers, the schedule and clip ops, the
 * resume, out_dir's files, the loaders) and frees after its last.  The
 * same setup serves kiln_evaluate (training = 0: the [data.eval] set
 * alone).  See train.h. */
#include "train.h"
#include "weights.h" /* kiln_llmc_is_model */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static kiln_status open_set(struct trainer *t, const char *section, const char *split, int train,
			    struct train_set *d)
{
	kiln_status st = kiln_dataset_open(t->cfg, t->reg, section, split, train, &d->ds);
	if (st)
		return st;
	d->len = d->ds.len;
	d->ds.rank = t->dist ? t->rank : -1; /* (the skip warnings name it) */
	kiln_dataset_input_desc(&d->ds, &d->input);
	return KILN_OK;
}

static void close_set(struct train_set *d)
{
	kiln_loader_close(d->loader);
	d->loader = NULL;
	kiln_dataset_close(&d->ds);
}

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
 * count is known only now (epochs x batches, max_steps), so the config
 * check cannot see it; the expression is the device's (scalar_ops.h). */
static kiln_status check_onecycle(const struct trainer *t, int64_t total)
{
	const double pct = t->tc.pct_start;
	const int64_t U = total - t->tc.warmup > 1 ? total - t->tc.warmup : 1;
	if (pct * (double)U - 1 != 0)
		return KILN_OK;
	/* (any other pct_start works; 1.5 / U rises over one step) */
	return kiln_error(KILN_ECONFIG, "%s: [train] pct_start = %g with schedule = onecycle over %lld step(s)%s: pct_start x steps = 1 leaves the rise to lr no step (OneCycleLR divides by zero there): use another pct_start, e.g. %g, or another number of steps",
			  kiln_config_where(t->cfg, "train", "pct_start"), pct, (long long)U,
			  t->tc.warmup > 0 ? " after the warmup" : "", 1.5 / (double)U);
}

/* The learning-rate schedule: a device op computing the step's lr from the
 * model's step counter, so no per-step scalar crosses from the host. */
static kiln_status prep_schedule(struct trainer *t, double lr, int64_t total)
{
	static const char *const kinds[] = { "constant", "cosine", "step", "multistep", "onecycle" };
	const struct kiln_train_cfg *tc = &t->tc;
	const char *kind = tc->schedule;
	struct kiln_op op;
	int64_t one = 1;
	kiln_status st;
	if (tc->max_steps > 0 && tc->max_steps < total)
		total = tc->max_steps;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_LR_SCHEDULE;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_I64, 1, &one);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
	op.i[0] = KILN_SCHED_CONSTANT;
	for (int k = 0; kind && k < 5; k++)
		if (!strcmp(kind, kinds[k]))
			op.i[0] = k;
	op.i[1] = total;
	op.i[2] = tc->warmup;
	op.i[3] = tc->step_size;
	op.f[0] = lr;
	op.f[1] = tc->lr_min;
	op.f[2] = tc->gamma;
	op.f[3] = tc->final_div_factor;
	op.f[4] = tc->pct_start;
	if (op.i[0] == KILN_SCHED_ONECYCLE)
		op.f[2] = tc->div_factor;
	if (op.i[0] == KILN_SCHED_MULTISTEP && (st = parse_milestones(t, &op)))
		return st;
	if (op.i[0] == KILN_SCHED_ONECYCLE && (st = check_onecycle(t, total)))
		return st;
	kiln_log(KILN_LOG_DEBUG, "train", "schedule %s over %lld steps, warmup %lld",
		 kind ? kind : "constant", (long long)total, (long long)tc->warmup);
	return kiln_device_prepare(t->dev, &op, &t->sched, NULL);
}

/* With accumulation: the scale to the mean and, where a layer cannot
 * add its parameter gradients in its own ops (kiln_model_grad_accum_ok),
 * the second gradient buffer and the add that folds it in. */
static kiln_status prep_accumulate(struct trainer *t)
{
	struct kiln_op op;
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
		/* each micro-step's loss is a mean over its batch: the sum of
		 * N of them over N is the mean over the N batches */
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SCALE;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
		op.out[0] = op.in[0];
		op.f[0] = 1.0 / (double)acc;
		if ((st = kiln_device_prepare(t->dev, &op, &t->grads_mean, NULL)))
			return st;
		kiln_log(KILN_LOG_INFO, "train", "accumulate = %lld: one optimizer step per %lld micro-batches (global batch %lld); gradients added %s",
			 (long long)acc, (long long)acc, (long long)(acc * t->B * (t->world > 0 ? t->world : 1)),
			 in_ops ? "by the layers' ops" : "from a second buffer");
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
static kiln_status prep_clip(struct trainer *t)
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
	if (st || (st = kiln_device_alloc(t->dev, 64, (void **)&t->clip_d)) ||
	    (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->clip_host)))
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

/* [train] lr scaled by the global batch (lr_scale, base_batch); logged. */
static double scaled_lr(const struct trainer *t, int64_t global)
{
	const char *how = t->tc.lr_scale;
	const double lr = t->tc.lr;
	const int64_t base = t->tc.base_batch;
	if (!how || !strcmp(how, "none"))
		return lr;
	double r = (double)global / (double)base, s = !strcmp(how, "sqrt") ? sqrt(r) : r;
	kiln_log(KILN_LOG_INFO, "train", "lr_scale = %s: lr %g x %s(%lld / %lld) = %g", how, lr,
		 !strcmp(how, "sqrt") ? "sqrt" : "", (long long)global, (long long)base, lr * s);
	return lr * s;
}

/* The config read once, the result's starting values and the checkpoint
 * directory. */
/* An empty [run] out_dir with a key that writes into it: refused (before
 * session 34 keep_best, [log] tensorboard and csv wrote nothing, silently). */
static kiln_status out_dir_needed(const struct kiln_config *cfg, const struct kiln_train_cfg *tc)
{
	int tb = 0, csv = 0;
	kiln_config_get_bool(cfg, "log", "tensorboard", &tb);
	kiln_config_get_bool(cfg, "log", "csv", &csv);
	const struct {
		int on;
		const char *section, *key, *what;
	} keys[] = {
		{ tc->checkpoint_every != 0, "train", "checkpoint_every", "checkpoints go to out_dir/checkpoints" },
		{ tc->resume, "train", "resume", "checkpoints go to out_dir/checkpoints" },
		{ tc->keep_best != 0, "train", "keep_best", "the best checkpoints go to out_dir/checkpoints/best" },
		{ tb, "log", "tensorboard", "its event files go to out_dir" },
		{ csv, "log", "csv", "train.csv and eval.csv go to out_dir" },
	};
	for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
		if (keys[i].on)
			return kiln_error(KILN_ECONFIG, "%s: [%s] %s needs [run] out_dir (%s)",
					  kiln_config_where(cfg, keys[i].section, keys[i].key),
					  keys[i].section, keys[i].key, keys[i].what);
	return KILN_OK;
}

static kiln_status read_config(struct trainer *t, const struct kiln_train_cfg *tc)
{
	struct kiln_train_result *res = t->res;
	kiln_status st;
	trainer_result_none(res);
	t->tc = *tc;
	if ((st = kiln_run_cfg_read(t->cfg, &t->run)) || (st = kiln_data_cfg_read(t->cfg, &t->data)))
		return st;
	t->acc = tc->accumulate;
	t->EB = tc->eval_batch;
	if (t->EB && !t->training)
		t->B = t->EB; /* evaluation alone needs no training batch */
	else if ((st = kiln_train_cfg_batch(t->cfg, tc, t->training ? "the run starts" : "evaluating",
					    &t->B)))
		return st;
	if (!t->EB)
		t->EB = t->B;
	if (!t->training)
		return KILN_OK;
	/* (an INT8 layer refused now, not at the first forward: after
	 * open_out_dir had deleted the earlier run, session 34) */
	if ((st = kiln_config_check_training(t->cfg)))
		return st;
	if (tc->resume && tc->overwrite)
		return kiln_error(KILN_ECONFIG, "%s: [train] resume and overwrite are both set (--resume continues the run in out_dir, --overwrite deletes it): choose one",
				  kiln_config_where(t->cfg, "train", "overwrite"));
	if (*t->run.out_dir)
		snprintf(t->ckdir, sizeof t->ckdir, "%s/checkpoints", t->run.out_dir);
	else if ((st = out_dir_needed(t->cfg, tc)))
		return st;
	if (t->run.deterministic && !t->run.threads)
		return kiln_error(KILN_ECONFIG, "%s: [run] deterministic = 1 needs a fixed [run] threads (0 = all cores makes the result depend on the machine)",
				  kiln_config_where(t->cfg, "run", "deterministic"));
	return KILN_OK;
}

/* The device (and, training, the profiler and the data-parallel group). */
static kiln_status open_device(struct trainer *t)
{
	const char *devname = t->run.device;
	kiln_status st;
	if (!t->training)
		return kiln_device_open(t->reg, t->cfg, devname, 0, &t->dev);
	/* one GPU per rank: the device ordinal is the local rank (the CPU
	 * device takes any; the environment is read again, and checked, when
	 * joining) */
	struct kiln_dist_env env;
	int ordinal = !kiln_dist_env_read(&env) ? env.local_rank : 0;
	if ((st = kiln_profile_open(t->cfg, &t->prof)))
		return st;
	/* [run] devices: the pipeline's stages run beside this one's streams
	 * (core/pipe_devices.c), which then wait for theirs */
	int peers = 0;
	if ((st = kiln_pipe_devices_count(t->cfg, &peers)))
		return st;
	if ((st = kiln_device_open_peer(t->reg, t->cfg, devname, ordinal, -1, peers > 1 ? peers : 1,
					&t->dev)))
		return ordinal ? kiln_error_wrap(st, "rank %d (local rank %d): opening %s device %d",
						 env.rank, env.local_rank, devname, ordinal)
			       : st;
	/* before any prepare, so that every plan's op type is known */
	kiln_device_set_profile(t->dev, t->prof);
	/* what the device computes with (the CPU: oneDNN's ISA) */
	const char *(*describe)(void) =
		(const char *(*)(void))kiln_device_proc(t->dev, KILN_PROC_DESCRIBE);
	if (describe)
		kiln_log(KILN_LOG_INFO, "train", "device %s: %s", kiln_device_name(t->dev), describe());
	/* join the data-parallel group, if this is one */
	if ((st = kiln_dist_open(t->cfg, t->reg, t->dev, &t->dist)))
		return st;
	t->rank = kiln_dist_rank(t->dist);
	t->world = kiln_dist_world(t->dist);
	kiln_profile_set_rank(t->prof, t->rank);
	return trainer_pipe_layout(t);
}

/* [data], [data.eval] and [data.val] (training), or [data.eval] alone. */
static kiln_status open_sets(struct trainer *t)
{
	const int do_eval = t->tc.eval;
	kiln_status st;
	if (!t->training)
		return open_set(t, "data.eval", "test", 0, &t->test);
	if ((st = open_set(t, "data", "train", 1, &t->train)))
		return st;
	if (do_eval && (st = open_set(t, "data.eval", "test", 0, &t->test)))
		return st;
	for (int i = 0; do_eval && kiln_config_section(t->cfg, i); i++)
		t->have_val |= !strcmp(kiln_config_section(t->cfg, i), "data.val");
	if (t->have_val && (st = open_set(t, "data.val", "val", 0, &t->val)))
		return st;
	/* (a config error at the set's `size`, where one is set: the sets
	 * are read, each is whole; before session 34 exit 3, no file:line) */
	if (t->have_val && memcmp(&t->val.ds.sample, &t->train.ds.sample, sizeof t->train.ds.sample))
		return kiln_error(KILN_ECONFIG, "%s: [data.val] samples differ in shape from [data]'s: give both the same `size` (and `channels`)",
				  kiln_config_where(t->cfg, "data.val", "size"));
	if (do_eval && memcmp(&t->test.ds.sample, &t->train.ds.sample, sizeof t->train.ds.sample)) {
		char a[128], b[128];
		kiln_tensor_desc_str(&t->train.ds.sample, a, sizeof a);
		kiln_tensor_desc_str(&t->test.ds.sample, b, sizeof b);
		return kiln_error(KILN_ECONFIG, "%s: [data.eval] samples are %s but [data]'s are %s: give both the same `size` (and `channels`)",
				  kiln_config_where(t->cfg, "data.eval", "size"), b, a);
	}
	if (t->train.len < t->B)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch = %lld is larger than the %lld training samples",
				  kiln_config_where(t->cfg, "train", "batch"), (long long)t->B,
				  (long long)t->train.len);
	return KILN_OK;
}

/* The streams and the slots' events. */
static kiln_status open_streams(struct trainer *t)
{
	kiln_status st;
	if ((st = kiln_device_stream_create(t->dev, &t->compute)) ||
	    (st = kiln_device_stream_create(t->dev, &t->copy)))
		return st;
	if (t->prof) {
		kiln_profile_stream_name(t->prof, t->compute, "compute stream");
		kiln_profile_stream_name(t->prof, t->copy, "copy stream");
		kiln_log(KILN_LOG_INFO, "profile",
			 "profiling: every device op of a step is synchronised and timed (the device runs serialised)");
	}
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_event_create(t->dev, &t->copy_done[s])) ||
		    (st = kiln_device_event_create(t->dev, &t->compute_done[s])))
			return st;
	return KILN_OK;
}

/* Why a stage's rank ([dist] pipeline) starts with the whole model here,
 * whatever its stage (NULL: its stage's alone may do). */
static const char *whole_at_start(const struct trainer *t)
{
	const char *init = kiln_config_get(t->cfg, "model", "init_from");
	/* ([train] resume: each rank reads its stage, kiln_dist_pipe_resume;
	 * before session 12 rank 0 read the checkpoint whole) */
	/* ([model] init_from of a checkpoint or safetensors: each rank loads
	 * its stage's tensors, session 12) */
	if (init && *init && kiln_llmc_is_model(init))
		return "[model] init_from of an llm.c file: its loader writes the whole model";
	return NULL;
}

/* Training: precision, the parameters' buffers (a stage's rank: its
 * stage's alone where it can, kiln_dist_pipe_hold), initial parameters,
 * clip, optimizer, sync_bn. */
static kiln_status prepare_training(struct trainer *t)
{
	kiln_status st;
	if ((st = kiln_model_precision_open(t->m, t->reg, t->compute)) ||
	    (t->m->bare && (st = kiln_dist_pipe_hold(t->dist, t->m, whole_at_start(t),
						     t->world > 1, t->compute))) ||
	    (t->m->scaler_d &&
	     (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->scaler_host))) ||
	    /* init_from first: kiln_model_init_params draws only what it lacks */
	    (st = kiln_model_init_from(t->m, t->compute)) ||
	    (st = kiln_model_init_params(t->m, (uint64_t)t->run.seed, t->compute)) ||
	    (st = prep_clip(t)) ||
	    (st = kiln_model_optim_prepare(t->m, t->compute)))
		return st;
	if (kiln_dist_sync_bn(t->dist) && t->world > 1) {
		/* [dist] sync_bn: batchnorm layers take the global batch's statistics */
		t->m->group = t->dist;
		t->m->group_ranks = t->world;
		kiln_log(KILN_LOG_INFO, "dist", "sync_bn: batch statistics over the %d %s batches",
			 t->world, t->pipe_P > 1 ? "data-parallel ranks' (the stage's)" : "ranks'");
	}
	return KILN_OK;
}

/* The training plan's summary (rank 0 logs it) and what it says one step
 * holds, told to the device (KILN_PROC_WORKLOAD: the CPU's async = auto
 * follows it; not for a pipeline, whose stages keep their own streams). */
static kiln_status tell_workload(struct trainer *t)
{
	struct kiln_summary s;
	const int tell = !t->pipe && t->pipe_P <= 1;
	if (!tell && t->rank) {
		kiln_device_flops_count(t->dev, NULL); /* forget the notes */
		return KILN_OK;
	}
	if (kiln_plan_summary(t->ptrain, &s)) {
		if (t->rank == 0)
			kiln_log(KILN_LOG_WARN, "core", "no model summary: %s", kiln_last_error());
		return KILN_OK;
	}
	kiln_status st = KILN_OK;
	if (t->rank == 0 && kiln_summary_log(&s))
		kiln_log(KILN_LOG_WARN, "core", "no model summary: %s", kiln_last_error());
	if (tell) {
		const struct kiln_workload w = {
			.version = KILN_WORKLOAD_VERSION,
			.ranks = t->world,
			.batch = t->B,
			.grad_elems = s.trainable,
			.grad_bytes = s.trainable * (int64_t)sizeof(float), /* f32 gradients */
			.fwd_flops = s.no_flops ? 0.0 : s.flops,
		};
		st = kiln_device_workload(t->dev, &w);
	}
	kiln_summary_free(&s);
	return st;
}

/* The model and its plans: training's (batch B) and the evaluation's
 * (EB, at most the data, and the last partial batch's). */
/* Every label of set (each set the run reads: training's, [data.eval]'s,
 * [data.val]'s) must have a logit row, and every row a label; every label
 * a logit (and a class the loss counts). */
/* Where the logits' width is set: the `out` of the layer the loss reads
 * (a linear's, a conv's), else the loss layer's type line (before session
 * 34 always the latter, though the mistake was an `out`). */
static const char *logits_where(const struct trainer *t)
{
	const struct model_layer *loss = &t->m->layers[t->m->loss_layer];
	const int src = loss->n_in > 0 ? loss->in[0] : -1;
	if (src >= 0 && kiln_config_get(t->cfg, t->m->layers[src].section, "out"))
		return kiln_config_where(t->cfg, t->m->layers[src].section, "out");
	return kiln_config_where(t->cfg, loss->section, "type");
}

static kiln_status check_labels(struct trainer *t, const struct train_set *set)
{
	struct kiln_plan *p = t->training ? t->ptrain : t->peval;
	const struct kiln_tensor_desc *lg = &p->nodes[t->m->loss_layer].l.in[0];
	const int64_t outs = lg->dims[lg->ndim - 1]; /* [B, C] or [B, T, V] */
	int64_t rows = 1; /* a sample's rows of logits: 1, or T */
	for (int k = 1; k + 1 < lg->ndim; k++)
		rows *= lg->dims[k];
	if (rows != set->ds.label_elems) {
		char shape[96];
		int n = snprintf(shape, sizeof shape, "[batch");
		for (int k = 1; k < lg->ndim && n < (int)sizeof shape - 24; k++)
			n += snprintf(shape + n, sizeof shape - (size_t)n, ", %lld", (long long)lg->dims[k]);
		snprintf(shape + n, sizeof shape - (size_t)n, "]");
		return kiln_error(KILN_ECONFIG, "%s: the loss layer '%s' reads logits %s, %lld row(s) of classes a sample, but the data [%s] has %lld label(s) a sample%s: the logits need one row per label ([batch, classes] for a class label, [batch, tokens, vocab] for token labels)",
				  kiln_config_where(t->cfg, t->m->layers[t->m->loss_layer].section, "type"),
				  t->m->layers[t->m->loss_layer].name, shape, (long long)rows,
				  set->ds.section, (long long)set->ds.label_elems,
				  set->ds.label_elems > 1 ? " (tokens)" : "");
	}
	/* the loss layer's own `classes` (a padded vocabulary: fewer than
	 * the logits) is what a label must be below */
	const char *lsec = t->m->layers[t->m->loss_layer].section;
	int64_t lc = 0, ign = -1;
	if (kiln_config_get(t->cfg, lsec, "classes"))
		kiln_config_get_int(t->cfg, lsec, "classes", &lc);
	if (kiln_config_get(t->cfg, lsec, "ignore_index"))
		kiln_config_get_int(t->cfg, lsec, "ignore_index", &ign);
	/* the largest label is the ignore_index (a padding class past the
	 * real ones): what the others reach is not known here; the loss op
	 * names any outside [0, classes) */
	if (ign >= 0 && ign == set->ds.classes - 1)
		return KILN_OK;
	if (lc > 0 && lc < outs && lc < set->ds.classes)
		return kiln_error(KILN_ECONFIG, "%s: the loss layer '%s' counts %lld classes but the data [%s] has %lld: set classes = %lld (or 0: every logit a class)",
				  kiln_config_where(t->cfg, lsec, "classes"),
				  t->m->layers[t->m->loss_layer].name, (long long)lc, set->ds.section,
				  (long long)set->ds.classes, (long long)set->ds.classes);
	if (outs < set->ds.classes) {
		/* the labels' file where the source has one (idx): a corrupt
		 * one is as likely as a wrong `out`.  The set's own only: an
		 * evaluation set without `labels` reads its own files, never
		 * [data]'s training labels, which it would name wrongly */
		const char *sec = set->ds.section, *lab = kiln_config_get(t->cfg, sec, "labels");
		char from[4400] = "";
		if (lab && *lab)
			snprintf(from, sizeof from, " (labels = %s, %s: its largest label is %lld)", lab,
				 kiln_config_where(t->cfg, sec, "labels"),
				 (long long)set->ds.classes - 1);
		else if (set->ds.info.classes_from)
			snprintf(from, sizeof from, " (the largest label, %lld, is at %s)",
				 (long long)set->ds.classes - 1, set->ds.info.classes_from);
		return kiln_error(KILN_ECONFIG, "%s: the model has %lld outputs but the data [%s] has %lld classes%s: set out = %lld on the last layer, or check the labels",
				  logits_where(t),
				  (long long)outs, set->ds.section, (long long)set->ds.classes, from,
				  (long long)set->ds.classes);
	}
	return KILN_OK;
}

/* Token ids (i32 samples) of set must be rows of every embedding that
 * reads them: an id past an embedding's vocab fails in its forward, naming a
 * position in the batch, where the data's vocabulary says so now. */
static kiln_status check_token_vocab(struct trainer *t, const struct train_set *set)
{
	/* (token windows: their labels are the next tokens, so the labels'
	 * classes are the ids' vocabulary; class labels of i32 samples say
	 * nothing of the ids) */
	if (set->ds.sample.dtype != KILN_I32 || set->ds.classes <= 0 ||
	    set->ds.label_elems <= 1)
		return KILN_OK;
	for (int i = 0; i < t->m->n_layers; i++) {
		const struct model_layer *L = &t->m->layers[i];
		int64_t v = 0;
		if (strcmp(L->type->name, "embedding") || L->n_in < 1 || L->in[0] >= 0 ||
		    kiln_config_get_int(t->cfg, L->section, "vocab", &v) || v >= set->ds.classes)
			continue;
		/* the shard and place of the largest id, where the source knows
		 * it (ABI 2.21): one corrupt shard is as likely as a wrong vocab */
		char at[4400] = "";
		if (set->ds.info.classes_from)
			snprintf(at, sizeof at, ", the largest at %s", set->ds.info.classes_from);
		return kiln_error(KILN_ECONFIG, "%s: layer '%s' (embedding) has vocab = %lld but the data [%s] has token ids up to %lld (a vocabulary of %lld%s): set vocab = %lld",
				  kiln_config_where(t->cfg, L->section, "vocab"), L->name, (long long)v,
				  set->ds.section, (long long)set->ds.classes - 1,
				  (long long)set->ds.classes, at, (long long)set->ds.classes);
	}
	return KILN_OK;
}

static kiln_status build_model(struct trainer *t)
{
	const int do_eval = !t->training || t->tc.eval;
	struct train_set *first = t->training ? &t->train : &t->test;
	kiln_status st;
	if (t->training)
		kiln_rss(&t->rss0, NULL, 1);
	/* (t->world: the data-parallel world; [dist] pipeline equal to the
	 * world averages nothing, so its gradients need no shared memory) */
	/* (stages on ranks: the buffers of the parameters come in
	 * prepare_training, the stage's alone where they can) */
	/* (ZeRO-1 without stages: no whole optimizer state, each rank makes
	 * its shard, kiln_dist_zero_init) */
	if ((st = (!t->training		   ? kiln_model_create
		   : t->pipe_P > 1	   ? kiln_model_create_bare
		   : kiln_dist_zero(t->dist) ? kiln_model_create_sharded
					     : kiln_model_create)(t->cfg, t->reg, t->dev,
								  &first->input, &t->m)))
		return st;
	/* (and with stages: each rank makes its shard of its stage's state,
	 * kiln_dist_zero_init; before session 30 the whole model's state was
	 * made at start-up, the shard cut from it) */
	if (t->training && t->pipe_P > 1 && kiln_dist_zero(t->dist))
		t->m->state_sharded = 1;
	/* ([dist] pipeline: the stage's, kiln_dist_pipe_cut_grads) */
	if ((t->world > 1 && t->pipe_P <= 1 && (st = kiln_dist_share_grads(t->dist, t->m))) ||
	    (st = open_streams(t)))
		return st;
	if (t->training) {
		/* dropout draws by the global batch's rows: this rank's are
		 * drank, drank + world, ... (kiln_shard's interleaving), the
		 * micro-steps' B * world rows apart (core/trainer.c) */
		if ((st = kiln_model_drop_layout(t->m, t->drank, t->world, t->B * t->world, t->acc)) ||
		    (st = prepare_training(t)))
			return st;
		int pipe = 0;
		if ((st = kiln_pipe_wanted(t->cfg, t->m, &pipe)))
			return st;
		kiln_device_flops_record(t->dev, 1); /* the ops' FLOPs, for the summary */
		if ((st = kiln_pipe_devices_open(t->reg, t->m)))
			return st;
		if (pipe && !(st = kiln_pipe_open(t->m, t->B, t->acc, t->world, t->compute, &t->pipe))) {
			t->ptrain = kiln_pipe_plan0(t->pipe);
			t->graph_mode = -1; /* issued op by op */
			st = trainer_pipe_ranks(t);
		} else if (!pipe && t->pipe_P > 1) {
			st = kiln_error(KILN_ECONFIG, "%s: [dist] pipeline = %d, but the model has one stage: place layers with [layer.X] stage or [model] stages",
					kiln_config_where(t->cfg, "dist", "pipeline"), t->pipe_P);
		} else if (!pipe) {
			st = kiln_model_plan(t->m, t->B, 1, &t->ptrain);
		}
		kiln_device_flops_record(t->dev, 0);
		if (st)
			return st;
	}
	/* evaluation alone: [run] precision's compute dtype, as training's
	 * evaluation has it (the weights, loaded later, are cast then); the
	 * caller (eval_open) loads every weight after trainer_open: none is
	 * drawn */
	if (!t->training && ((st = kiln_model_precision_open(t->m, t->reg, t->compute)) ||
			     (st = kiln_model_init_loaded(t->m, t->compute))))
		return st;
	if (do_eval) {
		if (t->EB > t->test.len)
			t->EB = t->test.len;
		/* (a stage's rank holding its stage's alone evaluates per stage:
		 * core/dist_pipe_eval.c) */
		t->m->plan_staged = t->eval_staged = t->training && kiln_dist_pipe_eval_staged(t->dist);
		if ((st = kiln_model_plan(t->m, t->EB, 0, &t->peval)) ||
		    (t->test.len % t->EB &&
		     (st = kiln_model_plan(t->m, t->test.len % t->EB, 0, &t->prem))) ||
		    (t->have_val && t->val.len % t->EB &&
		     (st = kiln_model_plan(t->m, t->val.len % t->EB, 0, &t->pvrem))))
			return st;
		t->m->plan_staged = 0;
		/* (their receives marked in training's slots: never past them) */
		if (t->eval_staged &&
		    ((st = kiln_pipe_eval_check(t->pipe, t->peval)) ||
		     (t->prem && (st = kiln_pipe_eval_check(t->pipe, t->prem))) ||
		     (t->pvrem && (st = kiln_pipe_eval_check(t->pipe, t->pvrem)))))
			return st;
	}
	/* every set the run reads, the evaluation's too: an eval label past
	 * the outputs trained a whole epoch, then failed in the loss op's
	 * forward naming no file (session 33) */
	const struct train_set *const sets[] = { first, t->training && do_eval ? &t->test : NULL,
						 t->have_val ? &t->val : NULL };
	for (size_t i = 0; i < KILN_ARRAY_LEN(sets); i++)
		if (sets[i] && ((st = check_labels(t, sets[i])) || (st = check_token_vocab(t, sets[i]))))
			return st;
	if (t->training)
		kiln_log(KILN_LOG_INFO, "core",
			 "model: %d parameters tensors, %zu floats; activation arena %.2f MiB (%.2f MiB without lifetime packing)",
			 kiln_model_param_count(t->m), kiln_model_param_elems(t->m),
			 (double)kiln_plan_arena_bytes(t->ptrain) / 1048576.0,
			 (double)kiln_plan_naive_bytes(t->ptrain) / 1048576.0);
	return t->training ? tell_workload(t) : KILN_OK;
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
 * metric sums; training: the schedule and the accumulation buffers. */
static kiln_status alloc_buffers(struct trainer *t)
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
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_host_alloc(t->dev, t->x_bytes, &t->x_host[s])) ||
		    (st = kiln_device_host_alloc(t->dev, y_bytes, &t->y_host[s])) ||
		    (st = kiln_device_alloc(t->dev, t->x_bytes, &t->x_dev[s])) ||
		    (st = kiln_device_alloc(t->dev, y_bytes, &t->y_dev[s])))
			return st;
	const int64_t G = t->B * t->acc * t->world;
	if ((t->training && (st = kiln_device_alloc(t->dev, 64, (void **)&t->lr_dev))) ||
	    (st = kiln_device_alloc(t->dev, 64, (void **)&t->metrics_dev)) ||
	    (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->metrics_host)) ||
	    (st = prep_fill(t->dev, 3, 0.0, &t->fill_metrics)) ||
	    (t->training && (st = prep_schedule(t, scaled_lr(t, G),
						t->tc.epochs * (t->train.len / G)))) ||
	    (t->training && (st = prep_accumulate(t))))
		return st;
	struct kiln_op_args a = { .out = { t->metrics_dev } };
	return kiln_device_run(t->dev, t->fill_metrics, &a, t->compute);
}

/* out_dir (rank 0, created and locked by open_run), once every check
 * that can refuse the run has passed: a fresh run's --overwrite deletes
 * the earlier run's files, its checkpoint directory is tried (a run that
 * will write checkpoints), the resolved config goes beside the metrics,
 * and the loggers open: metrics.jsonl (continued by a resumed run) and
 * [log]'s. */
static kiln_status open_out_dir(struct trainer *t)
{
	const char *out_dir = t->run.out_dir;
	char path[4200];
	kiln_status st;
	if (!*out_dir || t->rank)
		return KILN_OK;
	if (!t->tc.resume && (st = trainer_out_dir_clear(out_dir, t->ckdir, t->tc.overwrite)))
		return st;
	if ((t->tc.checkpoint_every || t->tc.checkpoint_last || t->tc.keep_best) &&
	    (st = trainer_ckdir_check(t->ckdir)))
		return st;
	/* the resolved config (every key, defaults filled in) beside the
	 * metrics: what this run was */
	snprintf(path, sizeof path, "%s/config.ini", out_dir);
	st = trainer_write_file(path, t->config_text, strlen(t->config_text));
	if (st)
		return st;
	st = kiln_loggers_open(t->cfg, out_dir, t->resumed, t->pos.step, &t->log);
	if (st)
		return st;
	/* the run before logged the step's checkpoint event (or was killed
	 * between the file's rename and the event: then this run logs it) */
	if (t->resumed && trainer_checkpoint_logged(out_dir, t->pos.step))
		t->logged_step = t->pos.step;
	if (t->resumed)
		trainer_jsonl(t, json_pack("{s:s, s:I, s:I, s:I}", "event", "resume", "epoch",
					   (json_int_t)t->pos.epoch + 1, "step",
					   (json_int_t)t->pos.step, "offset", (json_int_t)t->pos.offset));
	return KILN_OK;
}

/* Where the run starts: the beginning, or the newest checkpoint (every
 * rank from rank 0's state); out_dir checked (open_out_dir writes it). */
static kiln_status open_run(struct trainer *t)
{
	kiln_status st;
	t->pos = (struct kiln_ckpt_trainer){ 0, 0, 0, t->run.seed, t->world, t->B, t->train.len };
	t->ckpt_step = -1;
	t->named_step = -1;
	t->logged_step = -1;
	if (t->training && !t->tc.eval && (t->tc.keep_best || t->tc.early_stop_patience))
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] eval = 0 runs no evaluation, which %s%s%s need%s: ignored",
			 kiln_config_where(t->cfg, "train", "eval"),
			 t->tc.keep_best ? "keep_best" : "",
			 t->tc.keep_best && t->tc.early_stop_patience ? " and " : "",
			 t->tc.early_stop_patience ? "early_stop_patience" : "",
			 t->tc.keep_best && t->tc.early_stop_patience ? "" : "s");
	if (t->tc.keep_best && !(t->best = calloc((size_t)t->tc.keep_best, sizeof *t->best)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (*t->ckdir) {
		/* one run at a time in out_dir (rank 0 alone writes into it) */
		if (!t->rank && (st = trainer_out_dir_lock(t->run.out_dir, &t->out_lock)))
			return st;
		if (!t->rank && t->training)
			trainer_out_dir_note(t);
		/* (every rank: each writes its own profile) */
		if (t->training && (st = trainer_out_paths_check(t->ckdir, !t->rank && t->tc.keep_best &&
								 t->tc.eval, t->prof, t->run.out_dir)))
			return st;
		if (!(t->config_text = kiln_run_config_text(t->cfg, t->reg, &t->tc)))
			return KILN_EIO;
		if (!(t->versions = kiln_ckpt_versions(t->reg, t->dev)))
			return kiln_error(KILN_ENOMEM, "out of memory");
		if (t->tc.resume && (st = trainer_resume(t, &t->resumed)))
			return st;
		if (t->resumed) {
			t->res->resumed_step = t->pos.step;
			trainer_resume_finished(t);
		} else if (t->training && !t->tc.resume &&
			 (st = trainer_out_dir_check(t->run.out_dir, t->ckdir, t->tc.overwrite)))
			return st;
		t->pos.world = t->world;
		t->pos.batch = t->B;
	}
	/* every rank starts from rank 0's state (its init, or the checkpoint
	 * all ranks read), and its gradients are averaged in buckets */
	if (t->dist && ((st = kiln_dist_attach(t->dist, t->m, t->compute)) ||
			(st = kiln_dist_broadcast_state(t->dist, t->compute)) ||
			(st = kiln_dist_zero_init(t->dist, t->compute, t->clip != NULL,
						  t->resume_file, t->resume_ck)) ||
			(st = kiln_dist_pipe_shard(t->dist, t->compute)) ||
			(*t->resume_file && kiln_dist_pipe_resumes(t->dist) &&
			 (st = kiln_dist_pipe_resume(t->dist, t->resume_file, t->resume_ck,
						     t->compute))) ||
			(st = trainer_pipe_overlap(t))))
		return st;
	kiln_ckpt_close(t->resume_ck);
	t->resume_ck = NULL;
	return trainer_clip_counts_seed(t);
}

/* Loader worker threads: [data] workers (0 = read on this thread). */
static kiln_status open_loaders(struct trainer *t)
{
	const int do_eval = !t->training || t->tc.eval;
	struct train_set *first = t->training ? &t->train : &t->test;
	int workers = t->data.workers, prefetch = (int)t->data.prefetch;
	kiln_status st;
	if (workers < 0 &&
	    (st = kiln_loader_probe(t->dev, &first->ds, t->training ? t->B : t->EB, prefetch,
				    t->copy, &workers)))
		return st;
	if (t->training && t->data.resident) {
		kiln_log(KILN_LOG_INFO, "data", "resident = 1: one batch is loaded once; every step trains on it (benchmark mode)");
		workers = 0;
	}
	if (workers <= 0)
		return KILN_OK;
	if ((t->training &&
	     (st = kiln_loader_open(t->dev, &t->train.ds, t->B, workers, prefetch, &t->train.loader))) ||
	    (do_eval &&
	     (st = kiln_loader_open(t->dev, &t->test.ds, t->EB, workers, prefetch, &t->test.loader))) ||
	    (t->have_val &&
	     (st = kiln_loader_open(t->dev, &t->val.ds, t->EB, workers, prefetch, &t->val.loader))))
		return st;
	int64_t n_order = t->have_val && t->val.len > t->test.len ? t->val.len : t->test.len;
	if (do_eval && !(t->eval_order = malloc(sizeof(int64_t) * (size_t)n_order)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int64_t i = 0; do_eval && i < n_order; i++)
		t->eval_order[i] = i;
	if (t->training)
		kiln_log(KILN_LOG_INFO, "data", "%d loader worker(s), %lld batch(es) ahead", workers,
			 (long long)prefetch);
	return KILN_OK;
}

/* The loop's state: the epoch order buffers, the step size, where it
 * starts, what the evaluations during training evaluate. */
static kiln_status open_loop(struct trainer *t)
{
	struct kiln_train_result *res = t->res;
	t->perm = malloc(sizeof(int64_t) * (size_t)t->train.len);
	t->order = malloc(sizeof(int64_t) * (size_t)t->train.len);
	if (!t->perm || !t->order)
		return kiln_error(KILN_ENOMEM, "out of memory");
	/* an optimizer step takes `acc` micro-batches of B (drop_last) */
	t->G = t->B * t->acc * t->world;
	t->steps_per_epoch = t->train.len / t->G;
	if (t->steps_per_epoch < 1)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch %lld x accumulate %lld x %d rank(s) needs %lld training samples a step, more than the %lld there are",
				  kiln_config_where(t->cfg, "train", t->acc > 1 ? "accumulate" : "batch"),
				  (long long)t->B, (long long)t->acc, t->world, (long long)t->G,
				  (long long)t->train.len);
	const int64_t left_out = t->train.len - t->steps_per_epoch * t->G;
	if (left_out && !t->rank)
		kiln_log(KILN_LOG_INFO, "train", "an epoch is %lld step(s) of %lld samples (batch %lld x accumulate %lld x %d rank(s)): %lld of the %lld training samples are left out of each epoch (drop_last)",
			 (long long)t->steps_per_epoch, (long long)t->G, (long long)t->B,
			 (long long)t->acc, t->world, (long long)left_out, (long long)t->train.len);
	/* the evaluations during training: [data.val] when there is one,
	 * else [data.eval] */
	if (t->have_val)
		t->ev = (struct eval_target){ &t->val, t->pvrem, &res->val_loss, &res->val_acc,
					      &res->val_acc5, &res->val_samples, "val" };
	else
		t->ev = (struct eval_target){ &t->test, t->prem, &res->test_loss, &res->test_acc,
					      &res->test_acc5, &res->test_samples, "test" };
	/* where the run starts: 0, or the checkpoint's epoch, step and offset
	 * (offset = steps_per_epoch * G: only the epoch's evaluation is left) */
	t->ep0 = t->pos.epoch;
	t->off0 = t->pos.offset;
	t->step = t->step0 = t->interval_start = t->pos.step;
	t->finite_step = -1;
	/* dropout's step is the optimizer step's (a resumed run's: the
	 * checkpoint's, so its masks are the uninterrupted run's) */
	kiln_status st = kiln_model_drop_set(t->m, t->step, t->compute);
	if (st)
		return st;
	t->iv_t0 = kiln_now_s(); /* the first log interval starts */
	return KILN_OK;
}

/* Now, into *at; 0 (so that it chains in trainer_open's ||). */
static int stamp(double *at)
{
	*at = kiln_now_s();
	return 0;
}

/* The set-up's phases (at[i]: when phase i ended), logged at debug level:
 * what the whole run pays before its first step. */
static void log_setup_times(double t0, const double at[8])
{
	kiln_log(KILN_LOG_DEBUG, "train",
		 "set-up %.3f s: config %.3f, device %.3f, data %.3f, model %.3f, buffers %.3f, run directory %.3f, loaders %.3f, loop %.3f",
		 at[7] - t0, at[0] - t0, at[1] - at[0], at[2] - at[1], at[3] - at[2], at[4] - at[3],
		 at[5] - at[4], at[6] - at[5], at[7] - at[6]);
}

/* Every rank's data sets of the same sizes (kiln_dist_agree_sizes): the
 * same config may read another node's other copy at the same path. */
static kiln_status agree_sizes(struct trainer *t)
{
	static const char *const names[] = { "[data]", "[data.eval]", "[data.val]" };
	const int64_t n[] = { t->training ? t->train.len : 0, t->test.len,
			      t->have_val ? t->val.len : 0 };
	return kiln_dist_agree_sizes(t->dist, names, n, 3);
}

kiln_status trainer_open(struct trainer *t, const struct kiln_config *cfg,
			 const struct kiln_registry *reg, const struct kiln_train_cfg *tc,
			 int training, struct kiln_train_result *res)
{
	kiln_status st;
	t->cfg = cfg;
	t->reg = reg;
	t->training = training;
	t->res = res;
	t->world = 1;
	t->out_lock = -1;
	t->t_start = kiln_now_s();
	double at[8] = { 0 };
	if ((st = read_config(t, tc)) || stamp(&at[0]) || (st = open_device(t)) || stamp(&at[1]) ||
	    (st = open_sets(t)) || (st = agree_sizes(t)) || stamp(&at[2]) || (st = build_model(t)) || stamp(&at[3]) ||
	    (st = alloc_buffers(t)) || stamp(&at[4]) || (training && (st = open_run(t))) ||
	    stamp(&at[5]) || (st = open_loaders(t)) || stamp(&at[6]) ||
	    (training && ((st = open_loop(t)) || (st = open_out_dir(t)))) || stamp(&at[7]))
		return st;
	t->t_fit0 = at[7];
	log_setup_times(t->t_start, at);
	return KILN_OK;
}

/* Device resources, in the order they may be freed: the streams drained,
 * the graphs before the plans, buffers and streams they use, the loaders'
 * workers (they use the device's staging memory) before that memory. */
static void free_device(struct trainer *t)
{
	if (t->compute)
		kiln_device_stream_sync(t->dev, t->compute);
	if (t->copy)
		kiln_device_stream_sync(t->dev, t->copy);
	for (int s = 0; s < SLOTS; s++) {
		kiln_device_graph_free(t->dev, t->graph[s]);
		t->graph[s] = NULL;
	}
	kiln_loader_close(t->train.loader);
	kiln_loader_close(t->test.loader);
	kiln_loader_close(t->val.loader);
	t->train.loader = t->test.loader = t->val.loader = NULL;
	for (int s = 0; s < SLOTS; s++) {
		kiln_device_host_free(t->dev, t->x_host[s]);
		kiln_device_host_free(t->dev, t->y_host[s]);
		kiln_device_free(t->dev, t->x_dev[s]);
		kiln_device_free(t->dev, t->y_dev[s]);
		kiln_device_event_destroy(t->dev, t->copy_done[s]);
		kiln_device_event_destroy(t->dev, t->compute_done[s]);
	}
	kiln_device_free(t->dev, t->lr_dev);
	kiln_device_free(t->dev, t->metrics_dev);
	kiln_device_host_free(t->dev, t->metrics_host);
	kiln_device_plan_free(t->dev, t->fill_metrics);
	kiln_device_plan_free(t->dev, t->sched);
	kiln_device_free(t->dev, t->x_norm);
	kiln_device_free(t->dev, t->grads_more);
	kiln_device_plan_free(t->dev, t->grads_add);
	kiln_device_plan_free(t->dev, t->grads_mean);
	kiln_device_plan_free(t->dev, t->clip);
	kiln_device_free(t->dev, t->clip_d);
	kiln_device_host_free(t->dev, t->clip_host);
	kiln_device_plan_free(t->dev, t->finite);
	kiln_device_plan_free(t->dev, t->finite_buf);
	kiln_device_free(t->dev, t->finite_d);
	kiln_device_host_free(t->dev, t->finite_host);
	kiln_device_host_free(t->dev, t->scaler_host);
	for (int k = 0; k < NORM_PLANS; k++)
		kiln_device_plan_free(t->dev, t->norm_plan[k]);
}

kiln_status trainer_close(struct trainer *t, kiln_status st)
{
	st = kiln_dist_explain(t->dist, st);
	/* the final line lost (a full disk) fails a run that succeeded */
	kiln_status lst = kiln_loggers_close(t->log);
	t->log = NULL;
	if (!st)
		st = lst;
	/* draining and freeing may report the same failure again in other
	 * words (a stream's sticky error): the message that counts is this */
	char *keep = st ? kiln_strdup(kiln_last_error()) : NULL;
	kiln_ckpt_close(t->resume_ck);
	t->resume_ck = NULL;
	if (t->dev)
		free_device(t);
	kiln_plan_free(t->pvrem);
	if (t->pipe)
		kiln_pipe_free(t->pipe);
	else
		kiln_plan_free(t->ptrain);
	/* the communicator once the pipeline's streams have drained (their
	 * destruction waits for them, and for the rank transport's sends),
	 * since their sends and receives run on it and their passes on the
	 * stage's buffers it may own (before session 30 it closed first) */
	kiln_dist_close(t->dist);
	t->dist = NULL;
	/* the evaluation plans before the stages' devices: a layer's plans
	 * may have been prepared on a stage's device, whose close frees what
	 * is left on it (the seq2seq split on ranks freed its embedding's
	 * plans twice: "double free", exit 134 after a finished run) */
	kiln_plan_free(t->peval);
	kiln_plan_free(t->prem);
	t->peval = t->prem = NULL;
	if (t->m)
		kiln_pipe_devices_close(t->m);
	kiln_model_free(t->m);
	if (t->dev) {
		kiln_device_stream_destroy(t->dev, t->compute);
		kiln_device_stream_destroy(t->dev, t->copy);
	}
	kiln_device_close(t->dev);
	kiln_profile_free(t->prof);
	t->prof = NULL;
	close_set(&t->train);
	close_set(&t->test);
	close_set(&t->val);
	free(t->eval_order);
	kiln_data_scratch_free(&t->scratch);
	free(t->config_text);
	free(t->versions);
	free(t->best);
	free(t->perm);
	free(t->order);
	/* out_dir free for the next run (evaluation's trainer, zeroed, may
	 * never have reached trainer_open: it holds no lock) */
	if (t->training && t->out_lock >= 0)
		close(t->out_lock);
	t->out_lock = -1;
	if (keep)
		kiln_error(st, "%s", keep);
	free(keep);
	return st;
}
