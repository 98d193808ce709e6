/* core/trainer.c - the training loop behind `kiln train`.
 *
 * One step (DESIGN.md section 4):
 *   host:    assemble batch into staging slot s (waits only for slot s's
 *            previous copy to finish: backpressure, never for compute)
 *   copy:    waits compute_done[s] -> copy x, y into device slot s -> copy_done[s]
 *   compute: waits copy_done[s] -> forward -> backward -> fused optimizer -> compute_done[s]
 * Metrics (loss sum, correct count) accumulate on the device and are read
 * back every log_every steps and at epoch ends: the only host syncs.
 * With [run] profile = 1 the steps are bracketed for core/profile.c, which
 * then times (and serialises) every op of a step; see profile.h.
 *
 * Checkpoints (core/checkpoint.h) are written after a step: every
 * checkpoint_every steps, after the run's last step, and when a stop was
 * requested (kiln_train_request_stop, from SIGTERM/SIGUSR1).  Each records
 * the epoch and the global sample offset into the epoch's order, so a
 * resumed run redraws the epoch's permutation from (seed, epoch), takes
 * its share from that offset and continues bit-for-bit.
 */
#include "graph.h"
#include "checkpoint.h"
#include "data.h"
#include "loader.h"
#include "profile.h"
#include "dist.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static kiln_phase_fn phase_fn;
static void *phase_user;

/* Set from signal handlers: a lock-free atomic is async-signal-safe. */
static atomic_int stop_flag;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "kiln_train_request_stop needs a lock-free int");

void kiln_train_request_stop(void)
{
	atomic_store(&stop_flag, 1);
}

static kiln_grad_hook_fn grad_fn;
static void *grad_user;

void kiln_set_grad_hook(kiln_grad_hook_fn fn, void *user)
{
	grad_fn = fn;
	grad_user = user;
}

void kiln_set_phase_hook(kiln_phase_fn fn, void *user)
{
	phase_fn = fn;
	phase_user = user;
}

#define SLOTS 2

struct data {
	struct kiln_dataset ds;
	int64_t len;               /* after [data] limit */
	struct kiln_loader *loader; /* worker threads, or NULL: read inline */
	struct kiln_tensor_desc input; /* one sample as the model takes it */
};

/* transform_on = device: u8 batches normalised by a device op, one plan
 * per row count */
#define NORM_PLANS 6

struct trainer {
	const struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *compute, *copy;
	void *copy_done[SLOTS], *compute_done[SLOTS];
	int slot_used[SLOTS];
	void *x_host[SLOTS], *y_host[SLOTS];
	void *x_dev[SLOTS], *y_dev[SLOTS];
	size_t x_bytes, sample_bytes;
	float *lr_dev, *metrics_dev, *metrics_host;
	void *fill_metrics, *sched;
	int64_t step_counter;      /* slot rotation */
	int64_t *eval_order;       /* 0, 1, 2, ... for the evaluation loader */
	FILE *jsonl;
	struct kiln_data_scratch scratch; /* reads on this thread (workers = 0) */
	int64_t epoch;             /* of the batches being read */
	void *x_norm;              /* transform_on = device: f32 input */
	float *grads_more;         /* accumulate > 1: micro-steps 2.. write here */
	void *grads_add;           /* grads_d += grads_more */
	void *grads_mean;          /* grads_d *= 1 / accumulate */
	void *clip;                /* KILN_OP_GRAD_CLIP, or NULL */
	float *clip_d;             /* its state f32[4]: norm, finite, skipped, clipped */
	float *clip_host;
	float *scaler_host;        /* the loss scaler's state, read at log points */
	size_t norm_bytes;
	int64_t norm_rows[NORM_PLANS];
	const struct data *norm_of[NORM_PLANS]; /* each data set has its mean/std */
	void *norm_plan[NORM_PLANS];
	struct kiln_profile *prof;  /* [run] profile = 1, else NULL */
	/* checkpoints */
	char ckdir[4200];          /* [run] out_dir/checkpoints, "" without out_dir */
	char *config_text;         /* resolved config, stored in each checkpoint */
	char *versions;
	int64_t keep_last;
	struct kiln_ckpt_trainer pos; /* where the run stands (trainer section) */
	/* keep_best: the K best evaluations' checkpoints in ckdir/best */
	int64_t keep_best;
	int best_on_loss;
	int n_best;
	struct best { double v; int64_t step; char path[4200]; } *best;
	/* data-parallel training (core/dist.c): NULL for one process */
	struct kiln_dist *dist;
	int rank, world;
	int dist_stop;             /* every rank agreed to stop */
	/* [dist] timing: the sums at the previous log point */
	double comm_exposed0, comm_total0;
	int64_t comm_steps0;
	/* captured steps (device ops version 3): 0 undecided (before the
	 * first step after the warm-up), 1 captured, -1 issued every step;
	 * one graph per input slot (its x and y buffers are fixed) */
	int graph_mode;
	void *graph[SLOTS];
};

static void phase(const struct trainer *t, int ph, int begin)
{
	if (phase_fn)
		phase_fn(phase_user, ph, begin);
	if (t->prof)
		kiln_profile_phase(t->prof, ph, begin);
}

/* Profiling: what the device ops that follow belong to (NULL: nothing). */
static void label(const struct trainer *t, const char *name, int pass)
{
	if (t->prof)
		kiln_profile_label(name, pass);
}

static kiln_status open_data(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *section, const char *split, int train, struct data *d)
{
	kiln_status st = kiln_dataset_open(cfg, reg, section, split, train, &d->ds);
	if (st)
		return st;
	d->len = d->ds.len;
	d->input = d->ds.sample;
	d->input.dtype = KILN_F32; /* u8 samples are normalised on the device */
	return KILN_OK;
}

static void close_data(struct data *d)
{
	kiln_loader_close(d->loader);
	d->loader = NULL;
	kiln_dataset_close(&d->ds);
}

/* transform_on = device: out f32 [rows, C, H, W] = (x u8 / 255 - mean) / std */
/* The plan for `rows`, prepared at setup (prep) or looked up (the step). */
static kiln_status norm_plan(struct trainer *t, struct data *d, int64_t rows, int prep, int *kout)
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

static kiln_status normalize_on_device(struct trainer *t, struct data *d, const void *x,
				       int64_t rows)
{
	int k;
	kiln_status st = norm_plan(t, d, rows, 0, &k);
	if (st)
		return st;
	struct kiln_op_args a = { .in = { x }, .out = { t->x_norm } };
	label(t, "input", KILN_PHASE_DATA);
	st = kiln_device_run(t->dev, t->norm_plan[k], &a, t->compute);
	label(t, NULL, 0);
	return st;
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

/* The learning-rate schedule: a device op computing the step's lr from the
 * model's step counter, so no per-step scalar crosses from the host. */
static kiln_status prep_schedule(struct trainer *t, const struct kiln_config *cfg, double lr,
				 int64_t total, int64_t max_steps)
{
	static const char *const kinds[] = { "constant", "cosine", "step", "multistep", "onecycle" };
	struct kiln_op op;
	int64_t one = 1, warmup = 0, step_size = 1000;
	double lr_min = 0, gamma = 0.1, pct = 0.3, div = 25, fdiv = 1e4;
	const char *kind = kiln_config_get(cfg, "train", "schedule");
	kiln_config_get_int(cfg, "train", "warmup", &warmup);
	kiln_config_get_float(cfg, "train", "lr_min", &lr_min);
	kiln_config_get_int(cfg, "train", "step_size", &step_size);
	kiln_config_get_float(cfg, "train", "gamma", &gamma);
	kiln_config_get_float(cfg, "train", "pct_start", &pct);
	kiln_config_get_float(cfg, "train", "div_factor", &div);
	kiln_config_get_float(cfg, "train", "final_div_factor", &fdiv);
	if (max_steps > 0 && max_steps < total)
		total = max_steps;
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
	op.i[2] = warmup;
	op.i[3] = step_size;
	op.f[0] = lr;
	op.f[1] = lr_min;
	op.f[2] = gamma;
	op.f[3] = fdiv;
	op.f[4] = pct;
	if (op.i[0] == KILN_SCHED_ONECYCLE)
		op.f[2] = div;
	if (op.i[0] == KILN_SCHED_MULTISTEP) {
		/* milestones: ascending step counts after the warmup */
		const char *v = kiln_config_get(cfg, "train", "milestones");
		int64_t prev = -1;
		op.i[3] = 0;
		while (v && *v) {
			char *end;
			while (*v == ' ' || *v == ',')
				v++;
			if (!*v)
				break;
			long long m = strtoll(v, &end, 10);
			if (end == v || m <= prev || op.i[3] == 12)
				return kiln_error(KILN_ECONFIG, "%s: [train] milestones: up to 12 ascending step counts, e.g. `3000, 6000`",
						  kiln_config_where(cfg, "train", "milestones"));
			op.i[4 + op.i[3]++] = prev = m;
			v = end;
		}
	}
	kiln_log(KILN_LOG_DEBUG, "train", "schedule %s over %lld steps, warmup %lld",
		 kind ? kind : "constant", (long long)total, (long long)warmup);
	return kiln_device_prepare(t->dev, &op, &t->sched, NULL);
}

/* With accumulation: the second gradient buffer, the add that folds it
 * in and the scale to the mean. */
static kiln_status prep_accumulate(struct trainer *t, int64_t acc, int64_t B)
{
	struct kiln_op op;
	kiln_status st;
	if (acc > 1 && t->m->n_trainable) {
		int64_t n = (int64_t)t->m->n_trainable;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ADD;
		op.n_in = 2;
		op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
		op.in[1] = op.out[0] = op.in[0];
		if ((st = kiln_device_alloc(t->dev, t->m->n_elems * sizeof(float),
					    (void **)&t->grads_more)) ||
		    (st = kiln_device_prepare(t->dev, &op, &t->grads_add, NULL)))
			return st;
		/* each micro-step's loss is a mean over its batch: the sum of
		 * N of them over N is the mean over the N batches */
		op.type = KILN_OP_SCALE;
		op.n_in = 1;
		op.f[0] = 1.0 / (double)acc;
		if ((st = kiln_device_prepare(t->dev, &op, &t->grads_mean, NULL)))
			return st;
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
		kiln_log(KILN_LOG_INFO, "train", "accumulate = %lld: one optimizer step per %lld micro-batches (global batch %lld)",
			 (long long)acc, (long long)acc, (long long)(acc * B));
	}
	return KILN_OK;
}

/* Clipping and the non-finite check ([train] clip_norm, clip_value,
 * skip_nonfinite): one op over the gradients before each optimizer step,
 * whose finite flag the optimizer reads.  Before optim_prepare. */
static kiln_status prep_clip(struct trainer *t, const struct kiln_config *cfg)
{
	double norm = 0, value = 0;
	int skip = 1;
	kiln_status st;
	kiln_config_get_float(cfg, "train", "clip_norm", &norm);
	kiln_config_get_float(cfg, "train", "clip_value", &value);
	kiln_config_get_bool(cfg, "train", "skip_nonfinite", &skip);
	if (t->m->scaler_d && !skip)
		return kiln_error(KILN_ECONFIG, "%s: [train] skip_nonfinite = 0 with loss scaling ([run] precision = %s): a step whose scaled gradients overflow must be skipped",
				  kiln_config_where(cfg, "train", "skip_nonfinite"),
				  kiln_config_get(cfg, "run", "precision"));
	if ((!skip && norm <= 0 && value <= 0) || !t->m->n_trainable)
		return KILN_OK;
	struct kiln_op op;
	int64_t n = (int64_t)t->m->n_trainable, four = 4;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GRAD_CLIP;
	op.n_in = 1;
	op.n_out = 2;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &n);
	op.out[0] = op.in[0];
	kiln_tensor_desc_init(&op.out[1], KILN_F32, 1, &four);
	op.i[0] = n;
	op.f[0] = norm;
	op.f[1] = value;
	/* with loss scaling the unscale op takes the clip's place: the same
	 * state and flag, the gradients divided by the device scale first */
	if (t->m->scaler_d)
		st = kiln_model_precision_prepare(t->m, norm, value, &t->clip);
	else
		st = kiln_device_prepare(t->dev, &op, &t->clip, NULL);
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
static double scaled_lr(const struct kiln_config *cfg, double lr, int64_t global)
{
	const char *how = kiln_config_get(cfg, "train", "lr_scale");
	int64_t base = 256;
	kiln_config_get_int(cfg, "train", "base_batch", &base);
	if (!how || !strcmp(how, "none"))
		return lr;
	double r = (double)global / (double)base, s = !strcmp(how, "sqrt") ? sqrt(r) : r;
	kiln_log(KILN_LOG_INFO, "train", "lr_scale = %s: lr %g x %s(%lld / %lld) = %g", how, lr,
		 !strcmp(how, "sqrt") ? "sqrt" : "", (long long)global, (long long)base, lr * s);
	return lr * s;
}

/* Assemble rows idx[0..rows) into staging slot s and enqueue their copy;
 * the compute stream then waits for it.  Rows past `rows` up to `pad` are
 * not touched (a remainder plan has exactly `rows` rows). */
static kiln_status load_batch(struct trainer *t, struct data *d, const int64_t *idx, int64_t rows,
			      int *slot_out, void **x_out)
{
	int s = (int)(t->step_counter++ % SLOTS), ls = -1;
	kiln_status st;
	const char *xh;
	const int32_t *yh;
	phase(t, KILN_PHASE_DATA, 1);
	if (d->loader) {
		/* the workers assembled it already (in the same order) */
		int64_t got;
		const void *x;
		double w0 = t->prof ? kiln_loader_wait_s(d->loader) : 0;
		if ((st = kiln_loader_next(d->loader, &x, &yh, &got, &ls)))
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
		xh = x;
	} else {
		if (t->slot_used[s] && (st = kiln_device_staging_wait(t->dev, t->copy_done[s])))
			return st;
		int64_t t0 = t->prof ? kiln_now_ns() : 0;
		if ((st = kiln_dataset_read_rows(&d->ds, t->epoch, idx, rows, t->x_host[s],
						 t->y_host[s], &t->scratch)))
			return st;
		if (t->prof)
			kiln_profile_span(t->prof, "data read", "inline", KILN_PHASE_DATA,
					  KILN_PROF_TRACK_WAIT, t0, kiln_now_ns());
		xh = t->x_host[s];
		yh = t->y_host[s];
	}
	/* the device slot is free once the step that last read it is done */
	if (t->slot_used[s] && (st = kiln_device_stream_wait(t->dev, t->copy, t->compute_done[s])))
		return st;
	label(t, "input", KILN_PHASE_DATA);
	st = kiln_device_copy_async(t->dev, t->x_dev[s], xh, (size_t)rows * t->sample_bytes,
				    KILN_COPY_H2D, t->copy);
	if (!st)
		st = kiln_device_copy_async(t->dev, t->y_dev[s], yh, (size_t)rows * 4, KILN_COPY_H2D,
					    t->copy);
	label(t, NULL, 0);
	if (st ||
	    (st = kiln_device_event_record(t->dev, t->copy_done[s], t->copy)) ||
	    (st = kiln_device_stream_wait(t->dev, t->compute, t->copy_done[s])))
		return st;
	if (ls >= 0 && (st = kiln_loader_release(d->loader, ls, t->copy)))
		return st;
	t->slot_used[s] = 1;
	*slot_out = s;
	*x_out = t->x_dev[s];
	if (d->ds.sample.dtype != KILN_F32) {
		if ((st = normalize_on_device(t, d, t->x_dev[s], rows)))
			return st;
		*x_out = t->x_norm;
	}
	phase(t, KILN_PHASE_DATA, 0);
	return KILN_OK;
}

/* Copy the metric sums back (the host sync of a log point) and reset. */
static kiln_status read_metrics(struct trainer *t, double *loss_sum, double *correct,
				double *correct5)
{
	kiln_status st;
	struct kiln_op_args a = { .out = { t->metrics_dev } };
	label(t, "metrics", KILN_PROF_LOG);
	st = kiln_device_copy_async(t->dev, t->metrics_host, t->metrics_dev, 3 * sizeof(float),
				    KILN_COPY_D2H, t->compute);
	if (!st && t->clip)
		st = kiln_device_copy_async(t->dev, t->clip_host, t->clip_d, 4 * sizeof(float),
					    KILN_COPY_D2H, t->compute);
	if (!st && t->scaler_host)
		st = kiln_device_copy_async(t->dev, t->scaler_host, t->m->scaler_d,
					    4 * sizeof(float), KILN_COPY_D2H, t->compute);
	if (!st)
		st = kiln_device_run(t->dev, t->fill_metrics, &a, t->compute);
	label(t, NULL, 0);
	if (st || (st = kiln_device_stream_sync(t->dev, t->compute)))
		return st;
	*loss_sum = t->metrics_host[0];
	*correct = t->metrics_host[1];
	if (correct5)
		*correct5 = t->metrics_host[2];
	return KILN_OK;
}

static kiln_status evaluate(struct trainer *t, struct data *d, struct kiln_plan *full,
			    struct kiln_plan *rem, int64_t eb, double *loss, double *acc, double *acc5)
{
	kiln_status st;
	int64_t *idx = malloc(sizeof(int64_t) * (size_t)eb);
	double ls, c;
	if (!idx)
		return kiln_error(KILN_ENOMEM, "out of memory");
	phase(t, KILN_PHASE_EVAL, 1);
	/* the metrics may hold a partial training interval: flush it */
	if ((st = read_metrics(t, &ls, &c, NULL)))
		goto out;
	t->epoch = 0; /* evaluation has no random transforms */
	if (d->loader && (st = kiln_loader_start(d->loader, 0, t->eval_order, d->len, eb, 1)))
		goto out;
	for (int64_t off = 0; off < d->len; off += eb) {
		int64_t rows = d->len - off < eb ? d->len - off : eb;
		int s;
		void *xd;
		for (int64_t i = 0; i < rows; i++)
			idx[i] = off + i;
		if ((st = load_batch(t, d, idx, rows, &s, &xd)))
			goto out;
		struct kiln_plan *p = rows == eb ? full : rem;
		if ((st = kiln_plan_forward(p, xd, t->y_dev[s], t->metrics_dev, t->compute)) ||
		    (st = kiln_device_event_record(t->dev, t->compute_done[s], t->compute)))
			goto out;
	}
	double c5 = 0;
	if ((st = read_metrics(t, &ls, &c, &c5)))
		goto out;
	*loss = ls / (double)d->len;
	*acc = c / (double)d->len;
	*acc5 = c5 / (double)d->len;
out:
	phase(t, KILN_PHASE_EVAL, 0);
	free(idx);
	return st;
}

static void counters_add(struct kiln_device_counters *acc, const struct kiln_device_counters *a,
			 const struct kiln_device_counters *b)
{
	acc->host_syncs += b->host_syncs - a->host_syncs;
	acc->d2h_copies += b->d2h_copies - a->d2h_copies;
	acc->allocs += b->allocs - a->allocs;
	acc->runs += b->runs - a->runs;
	acc->staging_waits += b->staging_waits - a->staging_waits;
	acc->replays += b->replays - a->replays;
}

static int mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof buf, "%s", path);
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			if (mkdir(buf, 0777) && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return mkdir(buf, 0777) && errno != EEXIST ? -1 : 0;
}

static void jsonl(struct trainer *t, json_t *obj)
{
	if (t->jsonl && obj) {
		json_dumpf(obj, t->jsonl, JSON_COMPACT | JSON_REAL_PRECISION(7));
		fputc('\n', t->jsonl);
		fflush(t->jsonl);
	}
	json_decref(obj);
}

/* Early stopping ([train] early_stop_patience, early_stop_metric,
 * early_stop_min_delta) over the evaluations. */
struct stopper {
	int64_t patience, bad;
	int on_loss;
	double delta, best;
	int have;
};

/* After an evaluation: 1 when the run should stop. */
static int stopper_update(struct stopper *sp, double loss, double acc)
{
	if (!sp->patience)
		return 0;
	double v = sp->on_loss ? -loss : acc;
	if (!sp->have || v > sp->best + sp->delta) {
		sp->best = v;
		sp->have = 1;
		sp->bad = 0;
		return 0;
	}
	return ++sp->bad >= sp->patience;
}

/* Free everything kiln_train or kiln_evaluate set up (any part may be
 * missing), draining the streams first. */
static void release(struct trainer *t, struct data *train, struct data *test,
		    struct kiln_plan *ptrain, struct kiln_plan *peval, struct kiln_plan *prem)
{
	if (t->dev) {
		/* drain before freeing anything the streams may still use */
		if (t->compute)
			kiln_device_stream_sync(t->dev, t->compute);
		if (t->copy)
			kiln_device_stream_sync(t->dev, t->copy);
		/* graphs before the plans, buffers and streams they use */
		for (int s = 0; s < SLOTS; s++) {
			kiln_device_graph_free(t->dev, t->graph[s]);
			t->graph[s] = NULL;
		}
		/* workers use the device's staging memory: stop them first */
		kiln_loader_close(train->loader);
		kiln_loader_close(test->loader);
		train->loader = test->loader = NULL;
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
		kiln_device_host_free(t->dev, t->scaler_host);
		for (int k = 0; k < NORM_PLANS; k++)
			kiln_device_plan_free(t->dev, t->norm_plan[k]);
		kiln_dist_close(t->dist);
		t->dist = NULL;
	}
	kiln_plan_free(ptrain);
	kiln_plan_free(peval);
	kiln_plan_free(prem);
	kiln_model_free(t->m);
	if (t->dev) {
		kiln_device_stream_destroy(t->dev, t->compute);
		kiln_device_stream_destroy(t->dev, t->copy);
	}
	kiln_device_close(t->dev);
	kiln_profile_free(t->prof);
	t->prof = NULL;
	close_data(train);
	close_data(test);
	if (t->jsonl)
		fclose(t->jsonl);
	free(t->eval_order);
	kiln_data_scratch_free(&t->scratch);
	free(t->config_text);
	free(t->versions);
	free(t->best);
}

/* Write a checkpoint of the state after the step that ended t->pos (a host
 * sync point), then delete all but the keep_last newest. */
static kiln_status checkpoint(struct trainer *t, char *path, size_t n)
{
	kiln_status st;
	struct kiln_ckpt_meta meta = { t->config_text, t->versions, t->pos };
	/* ZeRO-1: every rank sends its shard of the optimizer state */
	if ((st = kiln_dist_zero_gather(t->dist, t->compute)))
		return st;
	if (t->rank) { /* rank 0 writes for all: the state is the same on every rank */
		kiln_dist_zero_release(t->dist);
		return KILN_OK;
	}
	if (mkdirs(t->ckdir))
		return kiln_error(KILN_EIO, "%s: cannot create: %s", t->ckdir, strerror(errno));
	st = kiln_ckpt_save(t->ckdir, &meta, t->m, t->compute, path, n);
	kiln_dist_zero_release(t->dist);
	if (st)
		return st;
	kiln_log(KILN_LOG_INFO, "train", "checkpoint %s (epoch %lld, step %lld)", path,
		 (long long)t->pos.epoch + 1, (long long)t->pos.step);
	kiln_ckpt_prune(t->ckdir, t->keep_last);
	jsonl(t, json_pack("{s:s, s:I, s:s}", "event", "checkpoint", "step", (json_int_t)t->pos.step,
			   "path", path));
	return KILN_OK;
}

static kiln_status keep_best_save(struct trainer *t, double loss, double acc);

/* keep_best: after an evaluation, checkpoint the state if it is among the
 * K best by best_metric so far (ckdir/best/ckpt-<step>.kiln), deleting the
 * one it displaces.  Ties keep the earlier. */
static kiln_status keep_best(struct trainer *t, double loss, double acc)
{
	kiln_status st;
	if (!t->keep_best || !*t->ckdir)
		return KILN_OK;
	/* ZeRO-1: every rank sends its shard of the optimizer state, whatever
	 * rank 0 decides (the ranks evaluate alike) */
	if ((st = kiln_dist_zero_gather(t->dist, t->compute)))
		return st;
	st = t->rank ? KILN_OK : keep_best_save(t, loss, acc);
	kiln_dist_zero_release(t->dist);
	return st;
}

static kiln_status keep_best_save(struct trainer *t, double loss, double acc)
{
	double v = t->best_on_loss ? -loss : acc;
	int worst = -1;
	if (t->n_best == t->keep_best) {
		worst = 0;
		for (int i = 1; i < t->n_best; i++)
			if (t->best[i].v < t->best[worst].v ||
			    (t->best[i].v == t->best[worst].v && t->best[i].step > t->best[worst].step))
				worst = i;
		if (!(v > t->best[worst].v))
			return KILN_OK;
	}
	char dir[4300], path[4200];
	snprintf(dir, sizeof dir, "%s/best", t->ckdir);
	if (mkdirs(dir))
		return kiln_error(KILN_EIO, "%s: cannot create: %s", dir, strerror(errno));
	struct kiln_ckpt_meta meta = { t->config_text, t->versions, t->pos };
	kiln_status st = kiln_ckpt_save(dir, &meta, t->m, t->compute, path, sizeof path);
	if (st)
		return st;
	struct best *b = &t->best[worst >= 0 ? worst : t->n_best++];
	if (worst >= 0 && strcmp(b->path, path))
		unlink(b->path);
	b->v = v;
	b->step = t->pos.step;
	snprintf(b->path, sizeof b->path, "%s", path);
	kiln_log(KILN_LOG_INFO, "train", "best %s %.4f at step %lld: %s",
		 t->best_on_loss ? "loss" : "accuracy", t->best_on_loss ? -v : v,
		 (long long)t->pos.step, path);
	jsonl(t, json_pack("{s:s, s:I, s:f, s:s}", "event", "best", "step",
			   (json_int_t)t->pos.step, t->best_on_loss ? "loss" : "acc",
			   t->best_on_loss ? -v : v, "path", path));
	return KILN_OK;
}

/* [train] resume: restore the newest usable checkpoint of ckdir into t->m
 * and t->pos.  *found = 0 when there is none (a fresh start). */
/* What rank 0 tells the other ranks about resuming: they never open the
 * checkpoint (their out_dir need not be shared); the training state
 * itself follows in kiln_dist_broadcast_state. */
struct resume_msg {
	int32_t status;  /* rank 0's kiln_status */
	int32_t found;
	struct kiln_ckpt_trainer tr;
	char error[1024]; /* rank 0's message when status != 0 */
	char path[1024];
};

static kiln_status resume_read(struct trainer *t, int64_t samples, int64_t B, int64_t acc,
			       int *found);

static kiln_status resume(struct trainer *t, int64_t samples, int64_t B, int64_t acc, int *found)
{
	struct resume_msg *msg;
	kiln_status st;
	*found = 0;
	if (t->world == 1)
		return resume_read(t, samples, B, acc, found);
	if (!(msg = calloc(1, sizeof *msg)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (!t->rank) {
		msg->status = resume_read(t, samples, B, acc, found);
		msg->found = *found;
		msg->tr = t->pos;
		if (msg->status)
			snprintf(msg->error, sizeof msg->error, "%s", kiln_last_error());
		snprintf(msg->path, sizeof msg->path, "%.1000s", t->ckdir);
	}
	if ((st = kiln_dist_broadcast_host(t->dist, msg, sizeof *msg, t->compute))) {
		free(msg);
		return kiln_error_wrap(st, "rank %d of %d: receiving rank 0's resume", t->rank,
				       t->world);
	}
	st = msg->status;
	if (st) {
		/* every rank has the message before rank 0 fails: its exit must
		 * not cut a peer's receive short (kiln launch then stops the
		 * others), so each rank can still name rank 0's error */
		double one = 1;
		(void)kiln_dist_sum_host(t->dist, &one, 1, t->compute);
	}
	if (t->rank && st)
		st = kiln_error(st, "rank %d of %d: rank 0 could not resume: %s", t->rank, t->world,
				msg->error);
	else if (!t->rank && st)
		kiln_error(st, "%s", msg->error); /* rank 0's own message, kept */
	else if (t->rank && msg->found) {
		t->pos = msg->tr;
		*found = 1;
		kiln_log(KILN_LOG_INFO, "train", "rank %d: resuming from rank 0's checkpoint in %s (broadcast): epoch %lld, step %lld, sample %lld of the epoch",
			 t->rank, msg->path, (long long)msg->tr.epoch + 1, (long long)msg->tr.step,
			 (long long)msg->tr.offset);
	}
	free(msg);
	return st;
}

/* Rank 0 (or the only process): find, verify and load the newest
 * checkpoint of t->ckdir. */
static kiln_status resume_read(struct trainer *t, int64_t samples, int64_t B, int64_t acc,
			       int *found)
{
	struct kiln_ckpt *ck = NULL;
	struct kiln_ckpt_trainer tr;
	char *saved = NULL;
	kiln_status st = kiln_ckpt_newest(t->ckdir, &ck);
	*found = 0;
	if (st)
		return st;
	if (!ck) {
		kiln_log(KILN_LOG_INFO, "train", "resume: no checkpoint in %s; starting from the beginning",
			 t->ckdir);
		return KILN_OK;
	}
	const char *path = kiln_ckpt_path(ck);
	if ((st = kiln_ckpt_read_text(ck, "config", &saved)) ||
	    (st = kiln_ckpt_config_check(path, saved, t->config_text, 0)) ||
	    (st = kiln_ckpt_trainer_get(ck, &tr)))
		goto out;
	if (tr.samples != samples) {
		st = kiln_error(KILN_EDATA, "cannot resume from %s: it was taken with %lld training samples per epoch, [data] now has %lld (the data set changed)",
				path, (long long)tr.samples, (long long)samples);
		goto out;
	}
	/* the offset is global (any world size), in whole steps of this run:
	 * batch x accumulate x world samples each */
	int64_t G = B * acc * t->world;
	if (tr.offset % G || tr.offset > samples / G * G) {
		st = kiln_error(KILN_EDATA, "cannot resume from %s: it stopped at sample %lld of an epoch with batch %lld and %lld rank(s), which this run (batch %lld x accumulate %lld x %d rank(s) = %lld samples a step) cannot continue: keep the global batch a divisor of the offset",
				path, (long long)tr.offset, (long long)tr.batch, (long long)tr.world,
				(long long)B, (long long)acc, t->world, (long long)G);
		goto out;
	}
	if (tr.world != t->world)
		kiln_log(KILN_LOG_INFO, "train", "resume: the checkpoint was written by %lld rank(s), this run has %d; the data continue at global sample %lld",
			 (long long)tr.world, t->world, (long long)tr.offset);
	if (tr.batch * tr.world != B * t->world)
		kiln_log(KILN_LOG_WARN, "train", "resume: the global batch changes from %lld (%lld x %lld ranks) to %lld (%lld x %d): the run will not continue as it would have",
			 (long long)(tr.batch * tr.world), (long long)tr.batch, (long long)tr.world,
			 (long long)(B * t->world), (long long)B, t->world);
	if ((st = kiln_ckpt_load_model(ck, t->m, t->compute, KILN_CKPT_LOAD_ALL)))
		goto out;
	t->pos = tr;
	*found = 1;
	kiln_log(KILN_LOG_INFO, "train", "resuming from %s: epoch %lld, step %lld, sample %lld of the epoch",
		 path, (long long)tr.epoch + 1, (long long)tr.step, (long long)tr.offset);
out:
	free(saved);
	kiln_ckpt_close(ck);
	return st;
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

static kiln_status micro_ops(struct trainer *t, struct kiln_plan *p, void *xd, void *yd, int64_t j,
			     int64_t acc)
{
	kiln_status st;
	/* the first micro-step writes the gradients, the others write beside
	 * them and add */
	t->m->grad_out_d = j ? t->grads_more : NULL;
	phase(t, KILN_PHASE_FORWARD, 1);
	st = kiln_plan_forward(p, xd, yd, t->metrics_dev, t->compute);
	phase(t, KILN_PHASE_FORWARD, 0);
	if (st)
		return st;
	phase(t, KILN_PHASE_BACKWARD, 1);
	/* buckets start during the backward that makes them final */
	kiln_dist_overlap_next(t->dist, acc == 1);
	st = kiln_plan_backward(p, xd, yd, t->metrics_dev, t->compute);
	label(t, "accumulate", KILN_PHASE_BACKWARD);
	if (!st && j) {
		struct kiln_op_args a = { .in = { t->m->grads_d, t->grads_more },
					  .out = { t->m->grads_d } };
		st = kiln_device_run(t->dev, t->grads_add, &a, t->compute);
	}
	if (!st && j && j == acc - 1) {
		struct kiln_op_args a = { .in = { t->m->grads_d }, .out = { t->m->grads_d } };
		st = kiln_device_run(t->dev, t->grads_mean, &a, t->compute);
	}
	label(t, NULL, 0);
	phase(t, KILN_PHASE_BACKWARD, 0);
	/* the dropout counter counts micro-steps */
	label(t, "step counter", KILN_PHASE_OPTIMIZER);
	if (!st)
		st = kiln_model_step_advance(t->m, t->compute);
	label(t, NULL, 0);
	return st;
}

static kiln_status optim_ops(struct trainer *t, int64_t step)
{
	kiln_status st = KILN_OK;
	t->m->grad_out_d = NULL;
	phase(t, KILN_PHASE_OPTIMIZER, 1);
	if (t->dist) {
		/* the optimizer waits for every bucket's average */
		label(t, "allreduce", KILN_PHASE_OPTIMIZER);
		st = kiln_dist_finish_grads(t->dist, t->compute);
		label(t, NULL, 0);
	}
	if (!st && grad_fn)
		st = grad_fn(grad_user, t->dev, t->compute, t->m->grads_d, t->m->n_trainable, step + 1);
	if (!st && t->clip) { /* GRAD_CLIP, or UNSCALE reading the loss scale */
		struct kiln_op_args a = { .in = { t->m->grads_d, t->m->scaler_d },
					  .out = { t->m->grads_d, t->clip_d } };
		label(t, "clip", KILN_PHASE_OPTIMIZER);
		st = kiln_device_run(t->dev, t->clip, &a, t->compute);
		label(t, NULL, 0);
	}
	if (!st) {
		/* this step's lr from the device's optimizer-step counter */
		struct kiln_op_args a = { .in = { t->m->opt_step_d }, .out = { t->lr_dev } };
		label(t, "schedule", KILN_PHASE_OPTIMIZER);
		st = kiln_device_run(t->dev, t->sched, &a, t->compute);
	}
	label(t, "optimizer", KILN_PHASE_OPTIMIZER);
	if (!st && kiln_dist_zero(t->dist)) /* this rank's shard, then allgather */
		st = kiln_dist_zero_step(t->dist, t->lr_dev, t->compute);
	else if (!st) /* advances the optimizer-step counter too */
		st = kiln_model_optim_step(t->m, t->lr_dev, t->compute);
	label(t, "loss scale", KILN_PHASE_OPTIMIZER);
	if (!st) /* dynamic loss scaling: grow or back off, on the device */
		st = kiln_model_precision_update(t->m, t->clip_d, t->compute);
	label(t, NULL, 0);
	phase(t, KILN_PHASE_OPTIMIZER, 0);
	return st;
}

/* Captured steps, decided at the first step after the warm-up: the
 * device captures (capture_begin does not answer KILN_ENOTSUP) and the
 * step can be captured whole.  *begun = 1 when a capture is under way. */
static kiln_status graph_decide(struct trainer *t, int64_t acc, int *begun)
{
	const char *why = acc > 1 ? "[train] accumulate > 1 (each micro-batch is loaded between the micro-steps)"
			  : grad_fn ? "a gradient hook is installed (kiln_set_grad_hook)"
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
		kiln_log(KILN_LOG_WARN, "train", "the %s device captures steps ([plugin.%s] graph), but this run issues them one by one: %s",
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
static kiln_status graph_step(struct trainer *t, struct kiln_plan *p, void *xd, int s, int64_t step,
			      int begun)
{
	kiln_status st;
	if (!t->graph[s]) {
		if (!begun && ((st = kiln_dist_zero_settle(t->dist, t->compute)) ||
			       (st = kiln_device_capture_begin(t->dev, t->compute))))
			return st;
		st = micro_ops(t, p, xd, t->y_dev[s], 0, 1);
		if (!st)
			st = optim_ops(t, step);
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
			 (long long)step + 1, s);
	}
	return kiln_device_graph_launch(t->dev, t->graph[s], t->compute);
}

kiln_status kiln_train(const struct kiln_config *cfg, const struct kiln_registry *reg,
		       kiln_progress_fn progress, void *user, struct kiln_train_result *res)
{
	struct stopper stopper = { 0 };
	int64_t eval_every = 0;
	int stop_early = 0;
	struct trainer T = { .cfg = cfg };
	struct trainer *t = &T;
	struct data train = { 0 }, test = { 0 };
	struct kiln_plan *ptrain = NULL, *peval = NULL, *prem = NULL;
	struct data val = { 0 };     /* [data.val], when the config has one */
	struct kiln_plan *pvrem = NULL;
	int have_val = 0;
	int64_t *perm = NULL, *order = NULL;
	kiln_status st;
	int64_t seed = 0, epochs = 10, B = 128, EB = 0, log_every = 100, max_steps = 0, acc = 1;
	int64_t ckpt_every = 0;
	double lr = 0.01;
	int do_eval = 1, shuffle = 1, resident = 0, do_resume = 0, resumed = 0;
	const char *devname = kiln_config_get(cfg, "run", "device");
	const char *out_dir = kiln_config_get(cfg, "run", "out_dir");
	double t_start = kiln_now_s();

	memset(res, 0, sizeof *res);
	res->test_loss = res->test_acc = -1;
	res->loss_scale = 1;
	res->val_loss = res->val_acc = -1;
	kiln_config_get_int(cfg, "run", "seed", &seed);
	kiln_config_get_int(cfg, "train", "epochs", &epochs);
	kiln_config_get_int(cfg, "train", "eval_batch", &EB);
	kiln_config_get_int(cfg, "train", "log_every", &log_every);
	kiln_config_get_int(cfg, "train", "max_steps", &max_steps);
	kiln_config_get_int(cfg, "train", "accumulate", &acc);
	kiln_config_get_int(cfg, "train", "eval_every", &eval_every);
	kiln_config_get_int(cfg, "train", "early_stop_patience", &stopper.patience);
	kiln_config_get_float(cfg, "train", "early_stop_min_delta", &stopper.delta);
	{
		const char *m = kiln_config_get(cfg, "train", "early_stop_metric");
		stopper.on_loss = m && !strcmp(m, "loss");
	}
	kiln_config_get_float(cfg, "train", "lr", &lr);
	kiln_config_get_bool(cfg, "train", "eval", &do_eval);
	kiln_config_get_bool(cfg, "data", "shuffle", &shuffle);
	kiln_config_get_bool(cfg, "data", "resident", &resident);
	kiln_config_get_int(cfg, "train", "checkpoint_every", &ckpt_every);
	t->keep_last = 3;
	kiln_config_get_int(cfg, "train", "keep_last", &t->keep_last);
	kiln_config_get_bool(cfg, "train", "resume", &do_resume);
	res->resumed_step = -1;
	if ((st = kiln_train_batch(cfg, &B)))
		goto out;
	if (!EB)
		EB = B;
	if (out_dir && *out_dir) {
		snprintf(t->ckdir, sizeof t->ckdir, "%s/checkpoints", out_dir);
	} else if (ckpt_every || do_resume) {
		const char *key = ckpt_every ? "checkpoint_every" : "resume";
		st = kiln_error(KILN_ECONFIG, "%s: [train] %s needs [run] out_dir (checkpoints go to out_dir/checkpoints)",
				kiln_config_where(cfg, "train", key), key);
		goto out;
	}

	{
		int det = 0;
		int64_t threads = 0;
		kiln_config_get_bool(cfg, "run", "deterministic", &det);
		kiln_config_get_int(cfg, "run", "threads", &threads);
		if (det && !threads) {
			st = kiln_error(KILN_ECONFIG, "%s: [run] deterministic = 1 needs a fixed [run] threads (0 = all cores makes the result depend on the machine)",
					kiln_config_where(cfg, "run", "deterministic"));
			goto out;
		}
	}
	{
		/* one GPU per rank: the device ordinal is the local rank (the
		 * CPU device takes any; the environment is read again, and
		 * checked, when joining) */
		struct kiln_dist_env env;
		int ordinal = !kiln_dist_env_read(&env) ? env.local_rank : 0;
		if ((st = kiln_profile_open(cfg, &t->prof)))
			goto out;
		if ((st = kiln_device_open(reg, cfg, devname, ordinal, &t->dev))) {
			if (ordinal)
				st = kiln_error_wrap(st, "rank %d (local rank %d): opening %s device %d",
						     env.rank, env.local_rank, devname, ordinal);
			goto out;
		}
	}
	/* before any prepare, so that every plan's op type is known */
	kiln_device_set_profile(t->dev, t->prof);
	{
		/* what the device computes with (the CPU: oneDNN's ISA) */
		const char *(*describe)(void) =
			(const char *(*)(void))kiln_device_proc(t->dev, KILN_PROC_DESCRIBE);
		if (describe)
			kiln_log(KILN_LOG_INFO, "train", "device %s: %s", devname ? devname : "cpu",
				 describe());
	}
	/* join the data-parallel group, if this is one */
	if ((st = kiln_dist_open(cfg, reg, t->dev, &t->dist)))
		goto out;
	t->rank = kiln_dist_rank(t->dist);
	t->world = kiln_dist_world(t->dist);
	if ((st = open_data(cfg, reg, "data", "train", 1, &train)))
		goto out;
	if (do_eval && (st = open_data(cfg, reg, "data.eval", "test", 0, &test)))
		goto out;
	for (int i = 0; do_eval && kiln_config_section(cfg, i); i++)
		have_val |= !strcmp(kiln_config_section(cfg, i), "data.val");
	if (have_val && (st = open_data(cfg, reg, "data.val", "val", 0, &val)))
		goto out;
	if (have_val && memcmp(&val.ds.sample, &train.ds.sample, sizeof train.ds.sample)) {
		st = kiln_error(KILN_EDATA, "[data.val] samples differ in shape from [data]'s: give both the same `size` (and `channels`)");
		goto out;
	}
	if (do_eval && memcmp(&test.ds.sample, &train.ds.sample, sizeof train.ds.sample)) {
		char a[128], b[128];
		kiln_tensor_desc_str(&train.ds.sample, a, sizeof a);
		kiln_tensor_desc_str(&test.ds.sample, b, sizeof b);
		st = kiln_error(KILN_EDATA, "[data.eval] samples are %s but [data]'s are %s: give both the same `size` (and `channels`)",
				b, a);
		goto out;
	}
	if (train.len < B) {
		st = kiln_error(KILN_ECONFIG, "%s: [train] batch = %lld is larger than the %lld training samples",
				kiln_config_where(cfg, "train", "batch"), (long long)B,
				(long long)train.len);
		goto out;
	}
	size_t rss0;
	kiln_rss(&rss0, NULL, 1);
	if ((st = kiln_model_create(cfg, reg, t->dev, &train.input, &t->m)) ||
	    (st = kiln_dist_share_grads(t->dist, t->m)))
		goto out;
	if ((st = kiln_device_stream_create(t->dev, &t->compute)) ||
	    (st = kiln_device_stream_create(t->dev, &t->copy)))
		goto out;
	if (t->prof) {
		kiln_profile_stream_name(t->prof, t->compute, "compute stream");
		kiln_profile_stream_name(t->prof, t->copy, "copy stream");
		kiln_log(KILN_LOG_INFO, "profile",
			 "profiling: every device op of a step is synchronised and timed (the device runs serialised)");
	}
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_event_create(t->dev, &t->copy_done[s])) ||
		    (st = kiln_device_event_create(t->dev, &t->compute_done[s])))
			goto out;
	if ((st = kiln_model_precision_open(t->m, reg, t->compute)) ||
	    (t->m->scaler_d &&
	     (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->scaler_host))) ||
	    (st = kiln_model_init_params(t->m, (uint64_t)seed, t->compute)) ||
	    (st = kiln_model_init_from(t->m, t->compute)) ||
	    (st = prep_clip(t, cfg)) ||
	    (st = kiln_model_optim_prepare(t->m, t->compute)))
		goto out;
	if (kiln_dist_sync_bn(t->dist) && t->world > 1) {
		/* [dist] sync_bn: batchnorm layers take the global batch's statistics */
		t->m->group = t->dist;
		t->m->group_ranks = t->world;
		kiln_log(KILN_LOG_INFO, "dist", "sync_bn: batch statistics over the %d ranks' batches",
			 t->world);
	}
	if ((st = kiln_model_plan(t->m, B, 1, &ptrain)))
		goto out;
	if (do_eval) {
		if (EB > test.len)
			EB = test.len;
		if ((st = kiln_model_plan(t->m, EB, 0, &peval)))
			goto out;
		if (test.len % EB && (st = kiln_model_plan(t->m, test.len % EB, 0, &prem)))
			goto out;
		if (have_val && val.len % EB && (st = kiln_model_plan(t->m, val.len % EB, 0, &pvrem)))
			goto out;
	}
	{
		/* every label must have a logit */
		const struct kiln_tensor_desc *lg = &ptrain->nodes[t->m->loss_layer].l.in[0];
		if (lg->dims[1] < train.ds.classes) {
			st = kiln_error(KILN_ECONFIG, "%s: the model has %lld outputs but the data has %lld classes: set out = %lld on the last layer",
					kiln_config_where(cfg, t->m->layers[t->m->loss_layer].section, "type"),
					(long long)lg->dims[1], (long long)train.ds.classes,
					(long long)train.ds.classes);
			goto out;
		}
	}
	kiln_log(KILN_LOG_INFO, "core",
		 "model: %d parameters tensors, %zu floats; activation arena %.2f MiB (%.2f MiB without lifetime packing)",
		 kiln_model_param_count(t->m), kiln_model_param_elems(t->m),
		 (double)kiln_plan_arena_bytes(ptrain) / 1048576.0,
		 (double)kiln_plan_naive_bytes(ptrain) / 1048576.0);

	/* staging ring and device slots, sized for the larger batch */
	int64_t rows = do_eval && EB > B ? EB : B;
	t->sample_bytes = train.ds.sample_bytes;
	t->x_bytes = (size_t)rows * t->sample_bytes;
	if (train.ds.sample.dtype != KILN_F32) {
		t->norm_bytes = (size_t)rows * kiln_tensor_bytes(&train.input);
		if ((st = kiln_device_alloc(t->dev, t->norm_bytes, &t->x_norm)))
			goto out;
		kiln_log(KILN_LOG_INFO, "data", "%zu-byte %s samples copied, %s on the device",
			 t->sample_bytes, kiln_dtype_name(train.ds.sample.dtype),
			 train.ds.sample.dtype == KILN_U8 ? "normalised" : "widened to f32");
		/* every batch size the run will see, prepared now: nothing is
		 * prepared inside a step */
		struct data *const sets[] = { &train, &test, &test, &val, &val };
		const int64_t sizes[] = { B, do_eval ? EB : 0, do_eval ? test.len % EB : 0,
					  have_val ? EB : 0, have_val ? val.len % EB : 0 };
		for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
			int k;
			if (sizes[i] > 0 && (st = norm_plan(t, sets[i], sizes[i], 1, &k)))
				goto out;
		}
	}
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_host_alloc(t->dev, t->x_bytes, &t->x_host[s])) ||
		    (st = kiln_device_host_alloc(t->dev, (size_t)rows * 4, &t->y_host[s])) ||
		    (st = kiln_device_alloc(t->dev, t->x_bytes, &t->x_dev[s])) ||
		    (st = kiln_device_alloc(t->dev, (size_t)rows * 4, &t->y_dev[s])))
			goto out;
	if ((st = kiln_device_alloc(t->dev, 64, (void **)&t->lr_dev)) ||
	    (st = kiln_device_alloc(t->dev, 64, (void **)&t->metrics_dev)) ||
	    (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->metrics_host)) ||
	    (st = prep_fill(t->dev, 3, 0.0, &t->fill_metrics)) ||
	    (st = prep_schedule(t, cfg, scaled_lr(cfg, lr, B * acc * t->world),
				epochs * (train.len / (B * acc * t->world)), max_steps)))
		goto out;
	if ((st = prep_accumulate(t, acc, B)))
		goto out;
	{
		struct kiln_op_args a = { .out = { t->metrics_dev } };
		if ((st = kiln_device_run(t->dev, t->fill_metrics, &a, t->compute)))
			goto out;
	}
	t->pos = (struct kiln_ckpt_trainer){ 0, 0, 0, seed, t->world, B, train.len };
	kiln_config_get_int(cfg, "train", "keep_best", &t->keep_best);
	{
		const char *bm = kiln_config_get(cfg, "train", "best_metric");
		t->best_on_loss = bm && !strcmp(bm, "loss");
	}
	if (t->keep_best && !(t->best = calloc((size_t)t->keep_best, sizeof *t->best))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	if (*t->ckdir) {
		if (!(t->config_text = kiln_ckpt_config_text(cfg, reg))) {
			st = KILN_EIO;
			goto out;
		}
		if (!(t->versions = kiln_ckpt_versions(reg, t->dev))) {
			st = kiln_error(KILN_ENOMEM, "out of memory");
			goto out;
		}
		if (do_resume && (st = resume(t, train.len, B, acc, &resumed)))
			goto out;
		if (resumed)
			res->resumed_step = t->pos.step;
		t->pos.world = t->world;
		t->pos.batch = B;
	}
	/* every rank starts from rank 0's state (its init, or the checkpoint
	 * all ranks read), and its gradients are averaged in buckets */
	if (t->dist && ((st = kiln_dist_attach(t->dist, t->m, t->compute)) ||
			(st = kiln_dist_broadcast_state(t->dist, t->compute)) ||
			(st = kiln_dist_zero_init(t->dist, t->compute, t->clip != NULL))))
		goto out;
	if (out_dir && *out_dir && !t->rank) {
		char path[4200];
		if (mkdirs(out_dir)) {
			st = kiln_error(KILN_EIO, "[run] out_dir '%s': cannot create: %s", out_dir,
					strerror(errno));
			goto out;
		}
		/* the resolved config (every key, defaults filled in) beside the
		 * metrics: what this run was */
		snprintf(path, sizeof path, "%s/config.ini", out_dir);
		FILE *cf = fopen(path, "w");
		if (!cf || kiln_config_write(cfg, (struct kiln_registry *)reg, cf) || fclose(cf)) {
			st = kiln_error(KILN_EIO, "%s: cannot write the resolved config", path);
			goto out;
		}
		snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
		/* a resumed run continues the file */
		if (!(t->jsonl = fopen(path, resumed ? "a" : "w"))) {
			st = kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
			goto out;
		}
		if (resumed)
			jsonl(t, json_pack("{s:s, s:I, s:I, s:I}", "event", "resume", "epoch",
					   (json_int_t)t->pos.epoch + 1, "step", (json_int_t)t->pos.step,
					   "offset", (json_int_t)t->pos.offset));
	}

	{
		/* worker threads: [data] workers (0 = read on this thread) */
		int workers = 1;
		int64_t prefetch = 2;
		if ((st = kiln_data_workers(cfg, &workers)))
			goto out;
		kiln_config_get_int(cfg, "data", "prefetch", &prefetch);
		if (workers < 0 && (st = kiln_loader_probe(t->dev, &train.ds, B, (int)prefetch, t->copy, &workers)))
			goto out;
		if (resident) {
			kiln_log(KILN_LOG_INFO, "data", "resident = 1: one batch is loaded once; every step trains on it (benchmark mode)");
			workers = 0;
		}
		if (workers > 0) {
			if ((st = kiln_loader_open(t->dev, &train.ds, B, workers, (int)prefetch,
						   &train.loader)))
				goto out;
			if (do_eval && (st = kiln_loader_open(t->dev, &test.ds, EB, workers,
							       (int)prefetch, &test.loader)))
				goto out;
			if (have_val && (st = kiln_loader_open(t->dev, &val.ds, EB, workers,
							       (int)prefetch, &val.loader)))
				goto out;
			int64_t n_order = have_val && val.len > test.len ? val.len : test.len;
			if (do_eval && !(t->eval_order = malloc(sizeof(int64_t) * (size_t)n_order))) {
				st = kiln_error(KILN_ENOMEM, "out of memory");
				goto out;
			}
			for (int64_t i = 0; do_eval && i < n_order; i++)
				t->eval_order[i] = i;
			kiln_log(KILN_LOG_INFO, "data", "%d loader worker(s), %lld batch(es) ahead",
				 workers, (long long)prefetch);
		}
	}
	perm = malloc(sizeof(int64_t) * (size_t)train.len);
	order = malloc(sizeof(int64_t) * (size_t)train.len);
	if (!perm || !order) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	/* an optimizer step takes `acc` micro-batches of B (drop_last) */
	const int64_t G = B * acc * t->world; /* samples an optimizer step takes, all ranks */
	int64_t steps_per_epoch = train.len / G;
	if (steps_per_epoch < 1) {
		st = kiln_error(KILN_ECONFIG, "[train] batch %lld x accumulate %lld x %d rank(s) needs more than the %lld training samples",
				(long long)B, (long long)acc, t->world, (long long)train.len);
		goto out;
	}
	/* the evaluations during training: [data.val] when there is one, else
	 * [data.eval] */
	struct data *ev = have_val ? &val : &test;
	struct kiln_plan *ev_rem = have_val ? pvrem : prem;
	double *ev_loss = have_val ? &res->val_loss : &res->test_loss;
	double *ev_acc = have_val ? &res->val_acc : &res->test_acc;
	double *ev_acc5 = have_val ? &res->val_acc5 : &res->test_acc5;
	int64_t *ev_samples = have_val ? &res->val_samples : &res->test_samples;
	const char *ev_name = have_val ? "val" : "test";
	/* where the run starts: 0, or the checkpoint's epoch, step and offset
	 * (offset = steps_per_epoch * acc * B: only the epoch's evaluation is left) */
	const int64_t ep0 = t->pos.epoch, off0 = t->pos.offset, step0 = t->pos.step;
	int64_t step = step0, interval_start = step0;
	int stopping = 0;
	int res_slot = 0;
	void *res_x = NULL; /* resident = 1: the one batch's device input */
	double timed_s = 0;
	int64_t timed_samples = 0;
	struct kiln_device_counters c_prev, c_now;
	int have_prev = 0;
	for (int64_t ep = ep0; ep < epochs && !stop_early &&
			       (!max_steps || step < max_steps || (ep == ep0 && off0 > 0));
	     ep++) {
		double ep_t0 = kiln_now_s(), since_loss = 0, since_correct = 0, ep_loss = 0, ep_correct = 0;
		int64_t since = 0, ep_samples = 0;
		if (shuffle)
			kiln_rng_permutation((uint64_t)seed, (uint64_t)ep, perm, train.len);
		else
			for (int64_t i = 0; i < train.len; i++)
				perm[i] = i;
		/* a resumed epoch continues at global sample offset off0 */
		int64_t start = ep == ep0 ? off0 : 0, k0 = start / G;
		/* the loader's epoch: the steps this epoch will take */
		int64_t ep_steps = steps_per_epoch - k0;
		if (max_steps && max_steps - step < ep_steps)
			ep_steps = max_steps - step > 0 ? max_steps - step : 0;
		/* this rank's share of the epoch's order from `start` (one rank
		 * until the distributed issue): interleaved, equal length,
		 * drop_last */
		kiln_shard(perm, train.len, start, t->rank, t->world, 1, order);
		res_x = NULL; /* resident: evaluation reused the slots; load anew */
		t->epoch = ep;
		if (train.loader &&
		    (st = kiln_loader_start(train.loader, ep, order, ep_steps * acc * B, B, 0)))
			goto out;
		for (int64_t k = k0; k < steps_per_epoch && (!max_steps || step < max_steps); k++) {
			if (t->prof)
				kiln_profile_step(t->prof, 1);
			for (int64_t j = 0; j < acc; j++) {
				int s = res_slot;
				void *xd = res_x;
				t->epoch = ep;
				if (!res_x &&
				    (st = load_batch(t, &train, order + ((k - k0) * acc + j) * B, B, &s, &xd)))
					goto out;
				if (resident && !res_x) {
					res_slot = s;
					res_x = xd;
				}
				/* after the warm-up step, a whole step may be
				 * captured once and replayed (graph_decide);
				 * the batch's copy and wait stay outside */
				int begun = 0;
				if (!t->graph_mode && step > step0 && (st = graph_decide(t, acc, &begun)))
					goto out;
				if (t->graph_mode == 1) {
					st = graph_step(t, ptrain, xd, s, step, begun);
					res->steps_replayed++;
				} else {
					st = micro_ops(t, ptrain, xd, t->y_dev[s], j, acc);
				}
				if (st ||
				    (st = kiln_device_event_record(t->dev, t->compute_done[s], t->compute)))
					goto out;
				since += B;
			}
			if (t->graph_mode != 1 && (st = optim_ops(t, step)))
				goto out;
			step++;
			if (step == step0 + 1 && !have_prev) {
				/* steady state starts after the first step */
				kiln_device_counters_get(t->dev, &c_prev);
				have_prev = 1;
			}
			int last = k + 1 == steps_per_epoch || (max_steps && step == max_steps);
			if (step % log_every == 0 || last) {
				double ls, c;
				kiln_device_counters_get(t->dev, &c_now);
				if (have_prev)
					counters_add(&res->steady, &c_prev, &c_now);
				if (t->prof)
					kiln_profile_phase(t->prof, KILN_PROF_LOG, 1);
				st = read_metrics(t, &ls, &c, NULL);
				if (!st && t->dist) {
					/* the log shows every rank's samples; a stop
					 * requested on any rank stops all of them
					 * after this same step */
					double v[3] = { ls, c, atomic_exchange(&stop_flag, 0) };
					st = kiln_dist_sum_host(t->dist, v, 3, t->compute);
					ls = v[0] / t->world;
					c = v[1] / t->world;
					t->dist_stop |= v[2] > 0;
				}
				if (t->prof)
					kiln_profile_phase(t->prof, KILN_PROF_LOG, 0);
				if (st)
					goto out;
				kiln_device_counters_get(t->dev, &c_prev);
				have_prev = 1;
				int64_t skipped = t->clip ? (int64_t)t->clip_host[2] : 0;
				int64_t new_skips = skipped - res->steps_skipped;
				res->steps_skipped = skipped;
				res->steps_clipped = t->clip ? (int64_t)t->clip_host[3] : 0;
				if (t->scaler_host) {
					res->loss_scale = t->scaler_host[0];
					res->overflows = (int64_t)t->scaler_host[3];
				}
				if (!isfinite(ls) && (!t->m->step_ok_d || new_skips >= step - interval_start)) {
					st = kiln_error(KILN_EDATA, "loss is %g at step %lld (epoch %lld): training diverged%s; lower [train] lr",
							ls, (long long)step, (long long)ep + 1,
							t->m->step_ok_d ? " (every step of the interval had non-finite gradients and was skipped)" : "");
					goto out;
				}
				if (new_skips)
					kiln_log(KILN_LOG_WARN, "train", "step %lld: %lld step(s) of the last %lld skipped: non-finite gradients (parameters untouched)%s",
						 (long long)step, (long long)new_skips,
						 (long long)(step - interval_start),
						 isfinite(ls) ? "" : "; this interval's mean loss is not finite");
				interval_start = step;
				since_loss += ls, since_correct += c;
				ep_loss += ls, ep_correct += c, ep_samples += since;
				char msg[200];
				snprintf(msg, sizeof msg, "loss %.4f acc %.4f", ls / (double)since,
					 c / (double)since);
				if (progress)
					progress(user, (int)ep + 1, k + 1, steps_per_epoch, msg);
				jsonl(t, json_pack("{s:s, s:I, s:I, s:f, s:f, s:I, s:f}", "event", "train",
						   "epoch", (json_int_t)ep + 1, "step", (json_int_t)step,
						   "loss", ls / (double)since, "acc", c / (double)since,
						   "skipped", (json_int_t)res->steps_skipped,
						   "loss_scale", res->loss_scale));
				since = 0, since_loss = since_correct = 0;
				if (t->dist) { /* [dist] timing: this interval's overlap */
					double ex, cm;
					int64_t ns;
					kiln_dist_timing(t->dist, &ex, &cm, &ns);
					if (ns > t->comm_steps0) {
						double per = 1e3 / (double)(ns - t->comm_steps0);
						jsonl(t, json_pack("{s:s, s:I, s:I, s:f, s:f}", "event", "comm",
								   "step", (json_int_t)step, "steps",
								   (json_int_t)(ns - t->comm_steps0),
								   "exposed_ms", (ex - t->comm_exposed0) * per,
								   "allreduce_ms", (cm - t->comm_total0) * per));
						t->comm_exposed0 = ex, t->comm_total0 = cm, t->comm_steps0 = ns;
					}
				}
			} else if (progress) {
				progress(user, (int)ep + 1, k + 1, steps_per_epoch, NULL);
			}
			if (t->prof)
				kiln_profile_step(t->prof, 0);
			if (do_eval && eval_every && step % eval_every == 0) {
				if ((st = evaluate(t, ev, peval, ev_rem, EB, ev_loss, ev_acc, ev_acc5)))
					goto out;
				*ev_samples = ev->len;
				kiln_device_counters_get(t->dev, &c_prev);
				kiln_log(KILN_LOG_INFO, "train", "step %lld: %s loss %.4f acc %.4f top-5 %.4f",
					 (long long)step, ev_name, *ev_loss, *ev_acc, *ev_acc5);
				jsonl(t, json_pack("{s:s, s:s, s:I, s:I, s:f, s:f, s:f, s:I}", "event", "eval",
						   "set", ev_name, "epoch", (json_int_t)ep + 1, "step",
						   (json_int_t)step, "loss", *ev_loss, "acc", *ev_acc, "acc5",
						   *ev_acc5, "samples", (json_int_t)ev->len));
				t->pos.epoch = ep;
				t->pos.step = step;
				t->pos.offset = (k + 1) * G;
				if ((st = keep_best(t, *ev_loss, *ev_acc)))
					goto out;
				if ((stop_early = stopper_update(&stopper, *ev_loss, *ev_acc)))
					break;
			}
			/* a checkpoint after this step: every checkpoint_every steps,
			 * after the run's last one, and when a stop was requested */
			int final = (max_steps && step == max_steps) ||
				    (ep + 1 == epochs && k + 1 == steps_per_epoch);
			/* ranks agree on a stop at log points (each reads its
			 * own signal at a different moment) */
			stopping = t->dist ? t->dist_stop : atomic_exchange(&stop_flag, 0);
			if (stopping || (ckpt_every && (step % ckpt_every == 0 || final))) {
				t->pos.epoch = ep;
				t->pos.step = step;
				t->pos.offset = (k + 1) * G;
				/* a host sync point like a log point: not steady state */
				kiln_device_counters_get(t->dev, &c_now);
				if (have_prev)
					counters_add(&res->steady, &c_prev, &c_now);
				if (!*t->ckdir)
					kiln_log(KILN_LOG_WARN, "train", "stop requested: [run] out_dir is empty, so no checkpoint is written");
				else if ((st = checkpoint(t, res->checkpoint, sizeof res->checkpoint)))
					goto out;
				kiln_device_counters_get(t->dev, &c_prev);
				have_prev = 1;
			}
			if (stopping)
				break;
		}
		if (stopping) {
			kiln_log(KILN_LOG_INFO, "train", "stopped on request after step %lld", (long long)step);
			break;
		}
		double ep_s = kiln_now_s() - ep_t0;
		/* epoch 1 includes warm-up: once a second epoch has run, time
		 * from epoch 2 on */
		if (ep == 1)
			timed_s = 0, timed_samples = 0;
		timed_s += ep_s;
		timed_samples += ep_samples;
		res->epochs = (int)ep + 1;
		res->train_loss = ep_samples ? ep_loss / (double)ep_samples : 0;
		res->train_acc = ep_samples ? ep_correct / (double)ep_samples : 0;
		char msg[300];
		int n = snprintf(msg, sizeof msg, "epoch %lld/%lld: train loss %.4f acc %.4f (%.1f s, %.0f samples/s)",
				 (long long)ep + 1, (long long)epochs, res->train_loss, res->train_acc, ep_s,
				 (double)ep_samples / ep_s);
		/* per epoch; or, with eval_every, after the run's last step when that
		 * was not an evaluation point (an early stop evaluated already) */
		int last_step = ep + 1 == epochs || (max_steps && step >= max_steps);
		if (do_eval && !stop_early && (!eval_every || (last_step && step % eval_every))) {
			double ev_t0 = kiln_now_s();
			if ((st = evaluate(t, ev, peval, ev_rem, EB, ev_loss, ev_acc, ev_acc5)))
				goto out;
			res->eval_samples_per_s = (double)ev->len / (kiln_now_s() - ev_t0);
			/* evaluation syncs are log points too */
			kiln_device_counters_get(t->dev, &c_prev);
			*ev_samples = ev->len;
			snprintf(msg + n, sizeof msg - (size_t)n, ", %s loss %.4f acc %.4f top-5 %.4f",
				 ev_name, *ev_loss, *ev_acc, *ev_acc5);
			if (!eval_every) {
				jsonl(t, json_pack("{s:s, s:s, s:I, s:I, s:f, s:f, s:f, s:I}", "event", "eval",
						   "set", ev_name, "epoch", (json_int_t)ep + 1, "step",
						   (json_int_t)step, "loss", *ev_loss, "acc", *ev_acc, "acc5",
						   *ev_acc5, "samples", (json_int_t)ev->len));
				t->pos.epoch = ep;
				t->pos.step = step;
				t->pos.offset = steps_per_epoch * G;
				if ((st = keep_best(t, *ev_loss, *ev_acc)))
					goto out;
				stop_early = stopper_update(&stopper, *ev_loss, *ev_acc);
			}
		}
		if (progress)
			progress(user, (int)ep + 1, -1, steps_per_epoch, msg);
		else
			kiln_log(KILN_LOG_INFO, "train", "%s", msg);
		if (stop_early) {
			kiln_log(KILN_LOG_INFO, "train", "early stop at step %lld: test %s did not improve by more than %g in %lld evaluations (best %.4f)",
				 (long long)step, stopper.on_loss ? "loss" : "accuracy", stopper.delta,
				 (long long)stopper.patience, stopper.on_loss ? -stopper.best : stopper.best);
			res->early_stopped = 1;
			break;
		}
	}
	if (have_val && !stopping) {
		/* the test set, once, with the final weights */
		if ((st = evaluate(t, &test, peval, prem, EB, &res->test_loss, &res->test_acc,
				   &res->test_acc5)))
			goto out;
		res->test_samples = test.len;
		kiln_log(KILN_LOG_INFO, "train", "final test loss %.4f acc %.4f top-5 %.4f",
			 res->test_loss, res->test_acc, res->test_acc5);
		jsonl(t, json_pack("{s:s, s:s, s:I, s:f, s:f, s:f, s:I}", "event", "eval", "set",
				   "test", "step", (json_int_t)step, "loss", res->test_loss, "acc",
				   res->test_acc, "acc5", res->test_acc5, "samples",
				   (json_int_t)test.len));
	}
	kiln_device_mem(t->dev, NULL, &res->device_peak_bytes);
	size_t hwm;
	kiln_rss(NULL, &hwm, 0);
	res->rss_growth_bytes = hwm > rss0 ? hwm - rss0 : 0;
	res->steps = step;
	for (int s = 0; s < SLOTS; s++)
		res->graphs_captured += t->graph[s] != NULL;
	res->stopped = stopping;
	res->data_skipped = atomic_load(&train.ds.skipped) + atomic_load(&test.ds.skipped) +
			    (have_val ? atomic_load(&val.ds.skipped) : 0);
	res->data_wait_s = kiln_loader_wait_s(train.loader);
	if (res->data_skipped)
		kiln_log(KILN_LOG_WARN, "data", "%lld bad sample(s) skipped and replaced (on_error = skip)",
			 (long long)res->data_skipped);
	res->train_samples_per_s = timed_s > 0 ? (double)timed_samples / timed_s : 0;
	if (t->prof && (st = kiln_profile_report(t->prof, out_dir)))
		goto out;
	res->wall_s = kiln_now_s() - t_start;
	if (t->dist) {
		double ex, cm;
		int64_t ns;
		kiln_dist_timing(t->dist, &ex, &cm, &ns);
		if (ns)
			kiln_log(KILN_LOG_INFO, "dist", "rank %d: over %lld steps, exposed communication %.3f ms/step, allreduce %.3f ms/step on the comm stream (%.1f%% exposed)",
				 t->rank, (long long)ns, ex / (double)ns * 1e3, cm / (double)ns * 1e3,
				 cm > 0 ? 100 * ex / cm : 0.0);
	}
	if (stopping)
		jsonl(t, json_pack("{s:s, s:I, s:s}", "event", "stopped", "step", (json_int_t)step,
				   "checkpoint", res->checkpoint));
	else
		jsonl(t, json_pack("{s:s, s:i, s:I, s:f, s:f, s:f, s:f, s:f}", "event", "final",
				   "epochs", res->epochs, "steps", (json_int_t)res->steps, "train_loss",
				   res->train_loss, "test_loss", res->test_loss, "test_acc",
				   res->test_acc, "train_samples_per_s", res->train_samples_per_s,
				   "wall_s", res->wall_s));
	/* the final parameters whole (ZeRO-1) */
	st = kiln_dist_zero_settle(t->dist, t->compute);
	if (!st)
		st = kiln_device_stream_sync(t->dev, t->compute);
	/* no rank leaves the group while a peer is still in a collective */
	if (!st)
		st = kiln_dist_finish(t->dist);
out:
	st = kiln_dist_explain(t->dist, st);
	/* draining and freeing may report the same failure again in other
	 * words (a stream's sticky error): the message that counts is this */
	char *keep = st ? kiln_strdup(kiln_last_error()) : NULL;
	if (t->dev) {
		if (t->compute)
			kiln_device_stream_sync(t->dev, t->compute);
		if (t->copy)
			kiln_device_stream_sync(t->dev, t->copy);
	}
	kiln_loader_close(val.loader); /* uses the device's staging memory */
	val.loader = NULL;
	kiln_plan_free(pvrem);
	release(t, &train, &test, ptrain, peval, prem);
	close_data(&val);
	free(perm);
	free(order);
	if (keep)
		kiln_error(st, "%s", keep);
	free(keep);
	return st;
}

/* `kiln eval --checkpoint`: the weights of a checkpoint (params and
 * buffers) evaluated on [data.eval], with the trainer's pipeline (loader
 * workers, remainder plan, device normalisation). */
kiln_status kiln_evaluate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, struct kiln_train_result *res)
{
	struct trainer T = { .cfg = cfg };
	struct trainer *t = &T;
	struct data train = { 0 }, test = { 0 };
	struct kiln_plan *peval = NULL, *prem = NULL;
	struct kiln_ckpt *ck = NULL;
	char *saved = NULL, *current = NULL;
	int64_t B = 128, EB = 0, prefetch = 2;
	int workers = 1;
	double t0;
	kiln_status st;

	memset(res, 0, sizeof *res);
	res->test_loss = res->test_acc = -1;
	res->resumed_step = -1;
	kiln_config_get_int(cfg, "train", "eval_batch", &EB);
	kiln_config_get_int(cfg, "data.eval", "prefetch", &prefetch);
	if (!EB && (st = kiln_train_batch(cfg, &B)))
		goto out;
	if (!EB)
		EB = B;
	/* the checkpoint first: verifying it is cheap, and it must hold the
	 * model this config describes */
	if (checkpoint) {
		st = kiln_ckpt_open(checkpoint, &ck);
	} else {
		/* the newest usable one of the run */
		const char *out_dir = kiln_config_get(cfg, "run", "out_dir");
		if (!out_dir || !*out_dir) {
			st = kiln_error(KILN_EUSAGE, "no checkpoint given and [run] out_dir is empty");
			goto out;
		}
		snprintf(t->ckdir, sizeof t->ckdir, "%s/checkpoints", out_dir);
		if (!(st = kiln_ckpt_newest(t->ckdir, &ck)) && !ck)
			st = kiln_error(KILN_ENOTFOUND, "%s: no checkpoint", t->ckdir);
	}
	if (st || (st = kiln_ckpt_read_text(ck, "config", &saved)))
		goto out;
	checkpoint = kiln_ckpt_path(ck);
	if (!(current = kiln_ckpt_config_text(cfg, reg))) {
		st = KILN_EIO;
		goto out;
	}
	if ((st = kiln_ckpt_config_check(checkpoint, saved, current, 1)))
		goto out;
	if ((st = kiln_device_open(reg, cfg, kiln_config_get(cfg, "run", "device"), 0, &t->dev)) ||
	    (st = open_data(cfg, reg, "data.eval", "test", 0, &test)) ||
	    (st = kiln_model_create(cfg, reg, t->dev, &test.input, &t->m)) ||
	    (st = kiln_device_stream_create(t->dev, &t->compute)) ||
	    (st = kiln_device_stream_create(t->dev, &t->copy)))
		goto out;
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_event_create(t->dev, &t->copy_done[s])) ||
		    (st = kiln_device_event_create(t->dev, &t->compute_done[s])))
			goto out;
	if (EB > test.len)
		EB = test.len;
	if ((st = kiln_model_init_params(t->m, 0, t->compute)) ||
	    (st = kiln_model_plan(t->m, EB, 0, &peval)) ||
	    (test.len % EB && (st = kiln_model_plan(t->m, test.len % EB, 0, &prem))))
		goto out;
	{
		const struct kiln_tensor_desc *lg = &peval->nodes[t->m->loss_layer].l.in[0];
		if (lg->dims[1] < test.ds.classes) {
			st = kiln_error(KILN_ECONFIG, "the model has %lld outputs but [data.eval] has %lld classes",
					(long long)lg->dims[1], (long long)test.ds.classes);
			goto out;
		}
	}
	t->sample_bytes = test.ds.sample_bytes;
	t->x_bytes = (size_t)EB * t->sample_bytes;
	if (test.ds.sample.dtype != KILN_F32) {
		int k;
		t->norm_bytes = (size_t)EB * kiln_tensor_bytes(&test.input);
		if ((st = kiln_device_alloc(t->dev, t->norm_bytes, &t->x_norm)) ||
		    (st = norm_plan(t, &test, EB, 1, &k)) ||
		    (test.len % EB && (st = norm_plan(t, &test, test.len % EB, 1, &k))))
			goto out;
	}
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_host_alloc(t->dev, t->x_bytes, &t->x_host[s])) ||
		    (st = kiln_device_host_alloc(t->dev, (size_t)EB * 4, &t->y_host[s])) ||
		    (st = kiln_device_alloc(t->dev, t->x_bytes, &t->x_dev[s])) ||
		    (st = kiln_device_alloc(t->dev, (size_t)EB * 4, &t->y_dev[s])))
			goto out;
	if ((st = kiln_device_alloc(t->dev, 64, (void **)&t->metrics_dev)) ||
	    (st = kiln_device_host_alloc(t->dev, 64, (void **)&t->metrics_host)) ||
	    (st = prep_fill(t->dev, 2, 0.0, &t->fill_metrics)))
		goto out;
	{
		struct kiln_op_args a = { .out = { t->metrics_dev } };
		if ((st = kiln_device_run(t->dev, t->fill_metrics, &a, t->compute)))
			goto out;
	}
	if ((st = kiln_data_workers(cfg, &workers)))
		goto out;
	if (workers < 0 && (st = kiln_loader_probe(t->dev, &test.ds, EB, (int)prefetch, t->copy,
						   &workers)))
		goto out;
	if (workers > 0) {
		if ((st = kiln_loader_open(t->dev, &test.ds, EB, workers, (int)prefetch, &test.loader)))
			goto out;
		if (!(t->eval_order = malloc(sizeof(int64_t) * (size_t)test.len))) {
			st = kiln_error(KILN_ENOMEM, "out of memory");
			goto out;
		}
		for (int64_t i = 0; i < test.len; i++)
			t->eval_order[i] = i;
	}
	if ((st = kiln_ckpt_load_model(ck, t->m, t->compute, KILN_CKPT_LOAD_WEIGHTS)))
		goto out;
	kiln_log(KILN_LOG_INFO, "eval", "%s: the weights of step %lld", checkpoint,
		 (long long)kiln_ckpt_step(ck));
	t0 = kiln_now_s();
	if ((st = evaluate(t, &test, peval, prem, EB, &res->test_loss, &res->test_acc,
			   &res->test_acc5)))
		goto out;
	res->wall_s = kiln_now_s() - t0;
	res->eval_samples_per_s = (double)test.len / res->wall_s;
	res->test_samples = test.len;
	res->steps = kiln_ckpt_step(ck);
	res->data_skipped = atomic_load(&test.ds.skipped);
	snprintf(res->checkpoint, sizeof res->checkpoint, "%s", checkpoint);
	st = kiln_device_stream_sync(t->dev, t->compute);
out:
	release(t, &train, &test, NULL, peval, prem);
	kiln_ckpt_close(ck);
	free(saved);
	free(current);
	return st;
}
