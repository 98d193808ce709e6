/* core/train_log.c - what the trainer reports: the metric sums read back
 * at a log point, the progress callback, the log, the train line each
 * logger gets (metrics.jsonl, [log]'s; core/logger.h), the histograms,
 * the device counters of the steady state, and the run's result at the
 * end.  See train.h. */
#include "train.h"
#include "../plugins/common/scalar_ops.h" /* common_scaler_backoff: the devices' rule */
#include "../plugins/common/c_locale.h" /* common_snprintf_c, common_nan_plain */
#include "../plugins/common/utf8.h" /* common_utf8_len */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

/* Copy the metric sums back (the host sync of a log point) and reset;
 * the last step's lr and the clip's and loss scaler's state come along.
 * The sums come back per sample: the loss layer counts a sample with
 * several targets (a token window's T) as the mean over its counted
 * targets (ignore_index left out), so the loss and accuracy reported are
 * per token. */
kiln_status trainer_read_metrics(struct trainer *t, double *loss_sum, double *correct,
				 double *correct5)
{
	kiln_status st;
	struct kiln_op_args a = { .out = { t->metrics_dev } };
	trainer_label(t, "metrics", KILN_PROF_LOG);
	st = kiln_device_copy_async(t->dev, t->metrics_host, t->metrics_dev, 3 * sizeof(float),
				    KILN_COPY_D2H, t->compute);
	if (!st && t->clip)
		st = kiln_device_copy_async(t->dev, t->clip_host, t->clip_d, 4 * sizeof(float),
					    KILN_COPY_D2H, t->compute);
	if (!st && t->clip) { /* its counts, copied, restart from 0 (clip_total) */
		struct kiln_op_args z = { .out = { t->clip_d + 2 } };
		st = kiln_device_run(t->dev, t->fill_counts, &z, t->compute);
	}
	if (!st && t->scaler_host)
		st = kiln_device_copy_async(t->dev, t->scaler_host, t->m->scaler_d,
					    4 * sizeof(float), KILN_COPY_D2H, t->compute);
	if (!st && t->lr_dev)
		st = kiln_device_copy_async(t->dev, t->metrics_host + 3, t->lr_dev, sizeof(float),
					    KILN_COPY_D2H, t->compute);
	if (!st)
		st = kiln_device_run(t->dev, t->fill_metrics, &a, t->compute);
	trainer_label(t, NULL, 0);
	if (st || (st = kiln_device_stream_sync(t->dev, t->compute)))
		return st;
	/* the streams the compute stream waits for, done with it: their sync
	 * restarts the count of tasks enqueued since, by which the CPU device
	 * sizes a stream's queue (plugins/cpu/stream.c, cpu_push); never
	 * synced, the copy stream's (4 tasks a step) and a pipeline stage's
	 * grew to the most, 4096 tasks of 168 bytes, over the first thousand
	 * steps or so, the process's memory 0.7 KB a step (session 30) */
	if ((st = kiln_device_stream_sync(t->dev, t->copy)) ||
	    (t->pipe && (st = kiln_pipe_sync_stages(t->pipe))))
		return st;
	*loss_sum = t->metrics_host[0];
	*correct = t->metrics_host[1];
	if (correct5)
		*correct5 = t->metrics_host[2];
	t->metric_rows = 0;
	if (t->clip) {
		/* a read covers at most TRAINER_METRIC_ROWS samples, so at
		 * most that many steps (trainer_metrics_room): exact in f32 */
		t->clip_total[0] += (int64_t)t->clip_host[2];
		t->clip_total[1] += (int64_t)t->clip_host[3];
		t->clip_host[2] = t->clip_host[3] = 0;
	}
	return KILN_OK;
}

kiln_status trainer_metrics_peek(struct trainer *t)
{
	kiln_status st = kiln_dist_ckpt_fault_at(t->dist, "sums", "reading the device's metric sums");
	if (st)
		return st;
	st = kiln_device_copy_async(t->dev, t->metrics_host, t->metrics_dev, 3 * sizeof(float),
				    KILN_COPY_D2H, t->compute);
	return st ? st : kiln_device_stream_sync(t->dev, t->compute);
}

kiln_status trainer_metrics_room(struct trainer *t, int64_t rows, double *ls, double *c)
{
	double l1 = 0, c1 = 0;
	kiln_status st;
	if (t->metric_rows > 0 && t->metric_rows + rows > TRAINER_METRIC_ROWS) {
		if ((st = trainer_read_metrics(t, &l1, &c1, NULL)))
			return st;
		*ls += l1, *c += c1;
	}
	t->metric_rows += rows;
	return KILN_OK;
}

void trainer_jsonl(struct trainer *t, const char *fmt, ...)
{
	json_error_t e;
	va_list ap;
	va_start(ap, fmt);
	json_t *obj = json_vpack_ex(&e, 0, fmt, ap);
	va_end(ap);
	/* jansson's reason: out of memory, or a NULL value of a trainer_json_*
	 * (before session 39 also a NaN or infinite real, which json_real
	 * refuses: a diverged run's "final" line was left out and this said
	 * "out of memory") */
	if (!obj)
		kiln_log(KILN_LOG_WARN, "log", "a metrics.jsonl record at step %lld could not be made (%s): left out",
			 (long long)t->step, e.text);
	kiln_loggers_event(t->log, obj);
}

json_t *trainer_json_real(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

json_t *trainer_json_text(const char *s)
{
	json_t *j = json_string(s);
	if (j || !s)
		return j;
	const size_t n = strlen(s);
	char *u = malloc(3 * n + 1), *o = u;
	if (!u)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		const int k = common_utf8_len(p);
		if (k) {
			memcpy(o, p, (size_t)k);
			o += k, p += k;
		} else {
			memcpy(o, "\xef\xbf\xbd", 3); /* U+FFFD */
			o += 3, p++;
		}
	}
	*o = 0;
	j = json_string(u);
	free(u);
	return j;
}

/* The device counters of the steady state (res->steady) count the steps
 * between host sync points: mark where an interval starts, take it (add
 * it) where it ends. */
void trainer_counters_mark(struct trainer *t)
{
	kiln_device_counters_get(t->dev, &t->c_prev);
	t->have_prev = 1;
}

void trainer_counters_take(struct trainer *t)
{
	struct kiln_device_counters *acc = &t->res->steady, *a = &t->c_prev, *b = &t->c_now;
	kiln_device_counters_get(t->dev, b);
	if (!t->have_prev)
		return;
	acc->host_syncs += b->host_syncs - a->host_syncs;
	acc->d2h_copies += b->d2h_copies - a->d2h_copies;
	acc->allocs += b->allocs - a->allocs;
	acc->runs += b->runs - a->runs;
	acc->staging_waits += b->staging_waits - a->staging_waits;
	acc->replays += b->replays - a->replays;
}

/* ---- the parameters' non-finite check ------------------------------------
 * A NaN weight need not make the loss NaN: a fused linear + ReLU (oneDNN's
 * eltwise_relu post-op) computes max(NaN, 0) = 0.  So at each log point
 * and before each checkpoint the parameters themselves are checked:
 * GRAD_CLIP clipping nothing (f[0] = f[1] = 0) over them in place writes
 * nothing while they are finite, and its state's flag [1] says whether
 * their norm is. */

/* The batchnorm running statistics: a NaN there (a forward of a batch
 * that overflowed, whose step skip_nonfinite or the loss scaler then
 * skipped) spoils every evaluation after it while the parameters stay
 * finite.  Checked like them, into the state at finite_d + 4.  A pipeline
 * stage's rank holds every buffer but updates its stage's alone (the
 * others keep their initial or loaded values, or what rank 0 received of
 * them for a checkpoint), so the whole region is checked there too
 * (before session 32 such ranks were not: a 2-stage run on ranks whose
 * statistics went NaN rotated its good checkpoints out and exited 0). */
static int buffers_checked(const struct trainer *t)
{
	return t->m->n_buf_elems > 0;
}

static kiln_status buffers_check_enqueue(struct trainer *t)
{
	const struct kiln_model *m = t->m;
	kiln_status st;
	if (!buffers_checked(t))
		return KILN_OK;
	if (!t->finite_buf) {
		struct kiln_op op;
		kiln_op_grad_clip(&op, (int64_t)m->n_buf_elems);
		if ((st = kiln_device_prepare(t->dev, &op, &t->finite_buf, NULL)))
			return st;
	}
	struct kiln_op_args a = { .in = { m->buffers_d }, .out = { m->buffers_d, t->finite_d + 4 } };
	return kiln_device_run(t->dev, t->finite_buf, &a, t->compute);
}

/* GRAD_CLIP clipping nothing over parameters [lo, hi) (ZeRO-1's
 * allgathers settled first): their norm's flag into finite_d[1]. */
static kiln_status params_clip_enqueue(struct trainer *t, size_t lo, size_t hi)
{
	const struct kiln_model *m = t->m;
	kiln_status st;
	if (!t->finite || t->finite_n != hi - lo) {
		struct kiln_op op;
		void *plan = NULL;
		kiln_op_grad_clip(&op, (int64_t)(hi - lo));
		if ((st = kiln_device_prepare(t->dev, &op, &plan, NULL)))
			return st;
		kiln_device_plan_free(t->dev, t->finite);
		t->finite = plan, t->finite_n = hi - lo;
	}
	struct kiln_op_args a = { .in = { m->params_d + lo },
				  .out = { m->params_d + lo, t->finite_d } };
	if ((st = kiln_dist_zero_settle(t->dist, t->compute)))
		return st;
	return kiln_device_run(t->dev, t->finite, &a, t->compute);
}

/* Enqueue the check of this rank's parameters (a stage's rank holding its
 * slice alone: that slice; ZeRO-1's allgathers settled first) on
 * t->compute: the flag reaches t->finite_host[1] at the stream's next
 * sync. */
static kiln_status params_check_issue(struct trainer *t)
{
	const struct kiln_model *m = t->m;
	size_t lo = 0, hi = m->n_elems;
	kiln_status st = kiln_dist_ckpt_fault_at(t->dist, "params", "the parameters' check");
	if (st)
		return st;
	kiln_dist_pipe_held(t->dist, &lo, &hi);
	if (hi <= lo && !buffers_checked(t))
		return KILN_OK;
	if (!t->finite_d) { /* the state zeroed once (its counters are not read) */
		if ((st = kiln_device_alloc_named(t->dev, 64, (void **)&t->finite_d,
						  "the parameters' non-finite check's state")) ||
		    (st = kiln_device_host_alloc_named(t->dev, 64, (void **)&t->finite_host,
						       "the parameters' non-finite check's state, its host copy")))
			return st;
		memset(t->finite_host, 0, 8 * sizeof(float));
		if ((st = kiln_device_copy_async(t->dev, t->finite_d, t->finite_host,
						 8 * sizeof(float), KILN_COPY_H2D, t->compute)))
			return st;
	}
	/* (a stage without parameters: its statistics alone) */
	if ((hi > lo && (st = params_clip_enqueue(t, lo, hi))) || (st = buffers_check_enqueue(t)))
		return st;
	return kiln_device_copy_async(t->dev, t->finite_host, t->finite_d, 8 * sizeof(float),
				      KILN_COPY_D2H, t->compute);
}

/* ... its ops labelled for the profiler (before session 33 an
 * "(unlabelled) grad_clip log" row) */
static kiln_status params_check_enqueue(struct trainer *t)
{
	trainer_label(t, "param check", KILN_PROF_LOG);
	kiln_status st = params_check_issue(t);
	trainer_label(t, NULL, 0);
	return st;
}

/* The first tensor of `region` (0 parameters [lo, hi), 1 the buffers)
 * holding a NaN or inf, from a host copy (the failure path alone): *bad
 * its index into m->params (-1: none; before session 39 the op's flag
 * was 0 for finite parameters whose squares overflowed f32, and this
 * copy found nothing), *count its non-finite values. */
static kiln_status nonfinite_find(struct trainer *t, int region, size_t lo, size_t hi, int *bad,
				  int64_t *count)
{
	const struct kiln_model *m = t->m;
	const float *src = (region ? m->buffers_d : m->params_d) + lo;
	int64_t at;
	float *h = malloc(sizeof(float) * (hi - lo + 1));
	if (!h)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_status st = kiln_device_copy_async(t->dev, h, src, (hi - lo) * sizeof(float),
						KILN_COPY_D2H, t->compute);
	if (!st)
		st = kiln_device_stream_sync(t->dev, t->compute);
	if (!st && (*bad = kiln_model_nonfinite(m, region, lo, h, hi - lo, &at)) >= 0) {
		const struct model_param *p = &m->params[*bad];
		for (int64_t e = at; e < p->numel; e++)
			*count += !isfinite(h[p->off - lo + (size_t)e]);
	}
	free(h);
	return st;
}

/* After that sync: when a flag says a norm is not finite, the first
 * tensor holding a NaN or inf, parameters before running statistics:
 * *bad its index into m->params, *count its non-finite values; *bad = -1
 * when there is none. */
static kiln_status params_check_take(struct trainer *t, int *bad, int64_t *count)
{
	size_t lo = 0, hi = t->m->n_elems;
	kiln_status st = KILN_OK;
	*bad = -1, *count = 0;
	if (!t->finite_host)
		return KILN_OK;
	kiln_dist_pipe_held(t->dist, &lo, &hi);
	if (hi > lo && t->finite_host[1] == 0.0f)
		st = nonfinite_find(t, 0, lo, hi, bad, count);
	if (!st && *bad < 0 && buffers_checked(t) && t->finite_host[5] == 0.0f)
		st = nonfinite_find(t, 1, 0, t->m->n_buf_elems, bad, count);
	return st;
}

/* Whether no optimizer step has changed the parameters by step `step`
 * (its forward and backward ran on the initial weights): every step so
 * far skipped (a gate: skip_nonfinite, loss scaling; the skips counted
 * since step 0, across resumes), or, when `first` (a loss: the forward
 * of step 1 precedes its update), step 1 itself.  The counts are those of
 * the last read of the metrics: an older one can only say no. */
static int params_initial(const struct trainer *t, int64_t step, int first)
{
	const int64_t skipped = t->clip && t->m->step_ok_d ? t->clip_total[0] : 0;
	return step > 0 && (skipped >= step || (first && step == 1));
}

/* The run's optimizer reads [train] eps (a row of its keys: adamw, lamb,
 * an optim plugin's) and it is 0. */
static int eps_zero(const struct trainer *t)
{
	const struct kiln_plugin *p;
	double eps;
	if (kiln_optim_find(t->cfg, t->reg, &p))
		return 0;
	for (const struct kiln_key *k = p->keys; k && k->name; k++)
		if (!strcmp(k->name, "eps"))
			return !kiln_config_get_float(t->cfg, "train", "eps", &eps) && eps == 0;
	return 0;
}

/* What to change after a divergence (`initial`: params_initial's): the
 * learning rate, unless it is 0 or no step has changed the parameters
 * (before session 36 "lower [train] lr" was said to a run of lr = 0,
 * before session 39 to a run whose first fp16 forward overflowed: in
 * neither did a step size cause it), or eps = 0 where the optimizer
 * divides by its running squares' root plus eps: 0/0 = NaN (PyTorch's
 * too) where a gradient and its running square are 0, whatever the lr
 * (before session 40 "lower [train] lr"). */
static const char *diverged_hint(const struct trainer *t, int initial)
{
	if (initial && t->m->cdtype == KILN_F16)
		return "[train] lr is not the cause: f16 holds values up to 65504 ([run] precision = fp16): use bf16 or fp32, or look at the data, its normalisation ([data] mean, std) and the initial weights";
	if (!initial && eps_zero(t))
		return "[train] eps = 0: the update divides 0 by 0 where a gradient and its running square are 0 (a unit that never fires, an input that is always 0), which is NaN, as in PyTorch: set eps > 0 (PyTorch's default is 1e-8)";
	if (t->tc.lr == 0)
		return "[train] lr is 0, so the step size is not the cause: look at the data, its normalisation ([data] mean, std) and the initial weights";
	return initial ? "[train] lr is not the cause: look at the data, its normalisation ([data] mean, std) and the initial weights"
		       : "lower [train] lr";
}

/* Parameters holding non-finite values after step `step` of epoch `ep`
 * (0-based) on `ranks` rank(s): this rank's tensor `bad` (-1: another
 * rank's) ends the run as diverged. */
static kiln_status params_diverged(const struct trainer *t, int64_t step, int64_t ep, int bad,
				   int64_t count, double ranks)
{
	const int initial = params_initial(t, step, 0);
	const char *hint = diverged_hint(t, initial);
	if (bad >= 0 && t->m->params[bad].buffer)
		return kiln_error(KILN_EDATA, "step %lld (epoch %lld): running statistic '%s' holds %lld non-finite value(s) (NaN or inf): a forward pass overflowed (%s, the statistics were updated); %s%s",
				  (long long)step, (long long)ep + 1, t->m->params[bad].name,
				  (long long)count,
				  initial ? "no optimizer step has changed the parameters since step 0"
					  : "its step may have been skipped",
				  hint, initial ? "" : ", or use bf16 rather than fp16");
	if (bad >= 0)
		return kiln_error(KILN_EDATA, "step %lld (epoch %lld): parameter '%s' holds %lld non-finite value(s) (NaN or inf): training diverged; %s",
				  (long long)step, (long long)ep + 1, t->m->params[bad].name,
				  (long long)count, hint);
	if (ranks > 0)
		return kiln_error(KILN_EDATA, "step %lld (epoch %lld): the parameters or batchnorm running statistics of %g other rank(s) hold non-finite values (NaN or inf; that rank's error names the tensor): training diverged, or a forward pass overflowed; %s",
				  (long long)step, (long long)ep + 1, ranks, hint);
	return KILN_OK;
}

kiln_status trainer_params_finite(struct trainer *t)
{
	int bad = -1;
	int64_t count = 0;
	double ranks;
	char what[64];
	kiln_status st;
	if (t->finite_step == t->pos.step)
		return KILN_OK;
	if (!(st = params_check_enqueue(t)) && !(st = kiln_device_stream_sync(t->dev, t->compute)))
		st = params_check_take(t, &bad, &count);
	/* a failure here still takes part in the ranks' sum */
	ranks = bad >= 0;
	snprintf(what, sizeof what, "step %lld's checkpoint", (long long)t->pos.step);
	if ((st = kiln_dist_sum_agreed(t->dist, st, &ranks, 1, what, t->compute)))
		return st;
	if ((st = params_diverged(t, t->pos.step, t->pos.epoch, bad, count, ranks)))
		return st;
	t->finite_step = t->pos.step;
	return KILN_OK;
}

/* The metric sums of the interval since the last log point, every rank's
 * (a stop requested on any rank stops all of them after this same step),
 * and the parameters' check read back by the same sync: *bad the first
 * tensor holding non-finite values (-1: none) and *count its non-finite
 * values, *ranks the ranks whose parameters hold any. */
static kiln_status interval_sums(struct trainer *t, double *ls, double *c, int *bad,
				 int64_t *count, double *ranks)
{
	kiln_status st;
	*ls = *c = *ranks = 0, *bad = -1, *count = 0;
	trainer_counters_take(t);
	trainer_phase(t, KILN_PROF_LOG, 1);
	/* rank 0: the run directory still this run's (a stop requested when
	 * not, before the ranks agree on stops below) */
	st = trainer_out_dir_watch(t);
	if (!st)
		st = params_check_enqueue(t);
	if (!st)
		st = trainer_read_metrics(t, ls, c, NULL);
	if (!st && !(st = params_check_take(t, bad, count))) {
		/* what an evaluation read since the last log point */
		*ls += t->carry_loss, *c += t->carry_correct;
		t->carry_loss = t->carry_correct = 0;
		*ranks = *bad >= 0;
	}
	/* (a failure here still takes part in the ranks' sums) */
	if (t->dist)
		st = trainer_dist_sums(t, st, ls, c, ranks);
	trainer_phase(t, KILN_PROF_LOG, 0);
	if (st)
		return st;
	trainer_counters_mark(t);
	return KILN_OK;
}

/* The clip op's counts so far (those added up at the reads of the
 * metrics and its state's skipped and clipped since, read from the
 * device: a checkpoint is a host sync point), for the checkpoint's
 * "clip_counts" section; 0 without the op. */
kiln_status trainer_clip_counts(struct trainer *t, int64_t out[2])
{
	out[0] = out[1] = 0;
	if (!t->clip)
		return KILN_OK;
	kiln_status st = kiln_dist_ckpt_fault_at(t->dist, "clip", "reading the clip op's counts");
	if (st)
		return st;
	st = kiln_device_copy_async(t->dev, t->clip_host, t->clip_d, 4 * sizeof(float),
				    KILN_COPY_D2H, t->compute);
	if (!st)
		st = kiln_device_stream_sync(t->dev, t->compute);
	if (st)
		return st;
	out[0] = t->clip_total[0] + (int64_t)t->clip_host[2];
	out[1] = t->clip_total[1] + (int64_t)t->clip_host[3];
	return KILN_OK;
}

/* Every rank, after a resume, before the first step: the clip op's counts
 * (steps skipped, steps clipped: metrics.jsonl's "skipped" and "clipped",
 * the result's steps_skipped and steps_clipped) continue from the
 * checkpoint's (t->counts0; before session 33 they restarted from 0 after
 * a resume, though the state resumed bit-exactly). */
kiln_status trainer_clip_counts_seed(struct trainer *t)
{
	kiln_status st;
	if (!t->resumed || !t->clip)
		return KILN_OK;
	/* on the host, exact (before session 37 written into the device's
	 * f32 counts, which stop at 2^24: a resumed run at 2^24 clipped
	 * steps counted no more) */
	t->clip_total[0] = t->counts0[0];
	t->clip_total[1] = t->counts0[1];
	t->clip_host[2] = t->clip_host[3] = 0;
	if ((st = kiln_device_copy_async(t->dev, t->clip_d, t->clip_host, 4 * sizeof(float),
					 KILN_COPY_H2D, t->compute)) ||
	    (st = kiln_device_stream_sync(t->dev, t->compute)))
		return st;
	/* (the next log point counts the steps skipped since, and a resume
	 * with no step left reports these) */
	t->nonfinite_seen = t->counts0[0];
	t->res->steps_skipped = t->m->step_ok_d ? t->counts0[0] : 0;
	t->res->steps_clipped = t->counts0[1];
	return KILN_OK;
}

/* Whether a dynamic loss scale (fp16) can still back off: then an
 * interval of skipped steps is its search for a scale that fits (a large
 * init_scale halving), not a divergence.  It cannot where a backoff would
 * not lower it (the device's rule: at [plugin.amp] min_scale, at the
 * floor FLT_MIN, backoff_factor = 1), nor with a constant scale
 * (fp16_static; scaler_host NULL for fp32 and bf16).  Before session 32
 * any scale above min_scale = 0 counted, and a scale backed off to 0
 * skipped every later step of a run that exited 0. */
static int scale_backing_off(const struct trainer *t)
{
	const struct kiln_scaler_config *sc = &t->m->scaler;
	if (!t->scaler_host || !sc->dynamic)
		return 0;
	const float s = t->scaler_host[0];
	return common_scaler_backoff(s, sc->backoff_factor, sc->min_scale) < s;
}

/* Skipped and clipped steps, the loss scale; a diverged run fails. */
static kiln_status check_interval(struct trainer *t, double ls)
{
	struct kiln_train_result *res = t->res;
	int64_t skipped = t->clip ? t->clip_total[0] : 0;
	int64_t new_skips = skipped - t->nonfinite_seen;
	t->nonfinite_seen = skipped;
	/* with skip_nonfinite = 0 (no gate) those steps were taken: not
	 * skipped (before session 32 counted as skipped all the same) */
	res->steps_skipped = t->m->step_ok_d ? skipped : 0;
	res->steps_clipped = t->clip ? t->clip_total[1] : 0;
	if (t->scaler_host) {
		res->loss_scale = t->scaler_host[0];
		/* a dynamic scale's overflows are its skipped steps (the
		 * unscale op's non-finite count and the update's overflow
		 * count move at the same steps, both from the finite flag):
		 * counted exactly, where the scaler state's own count, f32,
		 * stops at 2^24 (docs/precision.md) */
		res->overflows = t->m->scaler.dynamic ? skipped : (int64_t)t->scaler_host[3];
	}
	const int64_t steps = t->step - t->interval_start;
	/* every forward so far on the initial weights: it overflowed there */
	const int first = params_initial(t, t->step, 1);
	/* a loss that is not finite passes only where the gate skipped some
	 * of the interval's steps for it (their losses are in the sum) and
	 * took others: with none skipped, its gradients were finite and every
	 * step was taken on a loss sum past f32 (per-sample losses above
	 * 1e37: before session 41 such a run exited 0 with "loss inf" at
	 * every log point, where skip_nonfinite = 0 failed it) */
	if (!isfinite(ls) && (!t->m->step_ok_d || new_skips < 1 || new_skips >= steps))
		return kiln_error(KILN_EDATA, "loss is %g at step %lld (epoch %lld): %s%s; %s",
				  common_nan_plain(ls), (long long)t->step, (long long)t->ep + 1,
				  first ? "the forward pass overflowed on the initial weights, which no optimizer step has changed" : "training diverged",
				  !t->m->step_ok_d ? ""
				  : new_skips < 1 ? " (no step of the interval was skipped: its gradients were finite, the loss sum past f32's range)"
						  : " (every step of the interval had non-finite gradients and was skipped)",
				  diverged_hint(t, first));
	const int initial = params_initial(t, t->step, 0) && !t->scaler_host;
	char hint[400];
	snprintf(hint, sizeof hint, "; %s", diverged_hint(t, initial));
	if (t->m->step_ok_d && steps > 0 && new_skips >= steps && !scale_backing_off(t))
		return kiln_error(KILN_EDATA, "steps %lld..%lld (epoch %lld): every step had non-finite gradients and was skipped, the loss finite (%g): the parameters have not changed since step %lld: %s%s",
				  (long long)t->interval_start + 1, (long long)t->step, (long long)t->ep + 1,
				  ls / (double)(t->since ? t->since : 1), (long long)t->interval_start,
				  initial ? "the backward pass overflowed on the initial weights" : "training diverged",
				  !t->scaler_host ? hint
				  : t->m->scaler.dynamic ? " (the gradients overflow at every step and the loss scale can back off no further: lower [plugin.amp] min_scale, or [train] lr)"
				  : " (the loss scale overflows the gradients at every step and cannot back off: lower [plugin.amp] loss_scale)");
	/* (with skip_nonfinite = 0 the clip op still counts a non-finite
	 * norm, but nothing gates the step: it was taken) */
	if (new_skips)
		kiln_log(KILN_LOG_WARN, "train", "step %lld: %lld step(s) of the last %lld %s%s",
			 (long long)t->step, (long long)new_skips,
			 (long long)(t->step - t->interval_start),
			 t->m->step_ok_d ? "skipped: non-finite gradients (parameters untouched)"
					 : "had non-finite gradients, taken unclipped (skip_nonfinite = 0)",
			 isfinite(ls) ? "" : "; this interval's mean loss is not finite");
	return KILN_OK;
}

double trainer_set_aside(struct trainer *t, double t0)
{
	const double s = kiln_now_s() - t0;
	t->iv_aside_s += s;
	t->ep_aside_s += s;
	return s;
}

/* The interval's wall time (evaluations, histograms and checkpoint writes
 * left out: trainer_set_aside) and the
 * share of it the training thread waited for data (the loader's wait, or
 * its own reads with workers = 0); the clock restarts. */
static void interval_clock(struct trainer *t, double *wall, double *wait)
{
	const double now = kiln_now_s(), w = kiln_loader_wait_s(t->train.loader) + t->read_s;
	*wall = now - t->iv_t0 - t->iv_aside_s;
	*wait = *wall > 0 ? (w - t->iv_wait0) / *wall : 0;
	*wait = *wait < 0 ? 0 : *wait > 1 ? 1 : *wait;
	t->iv_t0 = now, t->iv_aside_s = 0, t->iv_wait0 = w;
}

/* A data-parallel rank's samples/s as the run's: times the data-parallel
 * ranks (t->world, [dist] pipeline's stages left out: a sample passes
 * every stage), each of which trains as many samples in the same steps. */
static double all_ranks(const struct trainer *t, double rank_rate)
{
	return rank_rate * t->world;
}

/* The train line of a log point (metrics.jsonl's "train" event; the
 * loggers' train record): the interval's mean loss and accuracy over n
 * samples per rank, the steps skipped and clipped so far, the last step's
 * lr, gradient norm (when the clip op computes it: clipping,
 * skip_nonfinite, loss scaling) and loss scale. */
static void train_record(struct trainer *t, double ls, double c, double n)
{
	struct kiln_log_record r = { .event = "train", .step = t->step };
	double wall, wait;
	interval_clock(t, &wall, &wait);
	kiln_log_add(&r, "epoch", (double)t->ep + 1, KILN_LOG_INT);
	kiln_log_add(&r, "step", (double)t->step, KILN_LOG_INT);
	kiln_log_add(&r, "loss", ls / n, KILN_LOG_F64);
	kiln_log_add(&r, "acc", c / n, KILN_LOG_F64);
	kiln_log_add(&r, "skipped", (double)t->res->steps_skipped, KILN_LOG_INT);
	/* (the steps clip_norm scaled so far, as the result's steps_clipped:
	 * before session 34 only the result had them) */
	kiln_log_add(&r, "clipped", (double)t->res->steps_clipped, KILN_LOG_INT);
	kiln_log_add(&r, "loss_scale", t->res->loss_scale, KILN_LOG_F32); /* scaler_host[0] */
	kiln_log_add(&r, "time", kiln_now_s() - t->t_start, KILN_LOG_F64);
	if (t->lr_dev)
		kiln_log_add(&r, "lr", t->metrics_host[3], KILN_LOG_F32);
	/* (this process's samples over its time: not those a resume seeded) */
	const double trained = n - (double)t->since_seeded;
	kiln_log_add(&r, "samples_per_s", wall > 0 ? all_ranks(t, trained / wall) : 0, KILN_LOG_F64);
	kiln_log_add(&r, "data_wait", wait, KILN_LOG_F64);
	if (t->clip)
		kiln_log_add(&r, "grad_norm", t->clip_host[0], KILN_LOG_F32);
	kiln_loggers_record(t->log, &r);
}

/* An evaluation's line (metrics.jsonl's "eval" event; the loggers' eval
 * record): e's results after step t->step; epoch 0: none (the final
 * test). */
void trainer_eval_record(struct trainer *t, const struct eval_target *e, int64_t epoch)
{
	struct kiln_log_record r = { .event = "eval", .set = e->name, .step = t->step };
	if (epoch)
		kiln_log_add(&r, "epoch", (double)epoch, KILN_LOG_INT);
	kiln_log_add(&r, "step", (double)t->step, KILN_LOG_INT);
	kiln_log_add(&r, "loss", *e->loss, KILN_LOG_F64);
	kiln_log_add(&r, "acc", *e->acc, KILN_LOG_F64);
	kiln_log_add(&r, "acc5", *e->acc5, KILN_LOG_F64);
	kiln_log_add(&r, "samples", (double)e->set->len, KILN_LOG_INT);
	kiln_loggers_record(t->log, &r);
}

/* [log] histograms: every parameter tensor and every trainable one's
 * gradient (not under ZeRO-1: a rank holds only its shard's average),
 * from a host copy of the flat buffers taken at this step. */
static kiln_status histograms(struct trainer *t)
{
	const struct kiln_model *m = t->m;
	const size_t np = m->n_elems, ng = kiln_dist_zero(t->dist) ? 0 : m->n_trainable;
	/* a rank holding its stage's alone: that stage's tensors (from lo) */
	size_t lo = 0, hi = np;
	const int held = kiln_dist_pipe_held(t->dist, &lo, &hi);
	float *h = malloc(sizeof(float) * (np + ng + 1));
	const double t0 = kiln_now_s();
	kiln_status st;
	char tag[200];
	if (!h)
		return kiln_error(KILN_ENOMEM, "out of memory");
	trainer_counters_take(t); /* a sync of its own: not the steady state's */
	trainer_phase(t, KILN_PROF_LOG, 1);
	st = kiln_dist_zero_settle(t->dist, t->compute);
	if (!st)
		st = kiln_device_copy_async(t->dev, h + lo, m->params_d + lo,
					    (hi - lo) * sizeof(float), KILN_COPY_D2H, t->compute);
	if (!st && ng)
		st = kiln_device_copy_async(t->dev, h + np + lo, m->grads_d + lo,
					    ((held ? hi : ng) - lo) * sizeof(float), KILN_COPY_D2H,
					    t->compute);
	if (!st)
		st = kiln_device_stream_sync(t->dev, t->compute);
	trainer_phase(t, KILN_PROF_LOG, 0);
	for (int i = 0; !st && i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (p->buffer || (held && (p->off < lo || p->off >= hi)))
			continue;
		snprintf(tag, sizeof tag, "weights/%s", p->name);
		kiln_loggers_histogram(t->log, t->step, tag, h + p->off, (size_t)p->numel);
		if (!p->trainable || p->off >= ng)
			continue;
		snprintf(tag, sizeof tag, "grads/%s", p->name);
		kiln_loggers_histogram(t->log, t->step, tag, h + np + p->off, (size_t)p->numel);
	}
	free(h);
	trainer_counters_mark(t);
	trainer_set_aside(t, t0);
	return st;
}

/* The run whose progress callback is running on this thread, for
 * kiln_train_progress_steps (NULL outside one): the callback's arguments
 * count the epoch's steps alone, and a resume that changed the global
 * batch changed the steps per epoch, so a caller cannot work out the
 * run's position from them (`kiln train`'s bar showed 200/500 for a run
 * that ended at 200; session 38). */
static _Thread_local const struct trainer *progress_run;

void trainer_progress(struct trainer *t, int64_t step, const char *status)
{
	if (!t->progress)
		return;
	const struct trainer *outer = progress_run; /* (a run inside a callback) */
	progress_run = t;
	t->progress(t->user, (int)t->ep + 1, step, t->steps_per_epoch, status);
	progress_run = outer;
}

kiln_status kiln_train_progress_steps(int64_t *step, int64_t *last_step)
{
	const struct trainer *t = progress_run;
	if (!t)
		return kiln_error(KILN_EINVAL, "kiln_train_progress_steps: called outside a progress callback");
	if (step)
		*step = t->step;
	if (last_step)
		*last_step = t->last_step;
	return KILN_OK;
}

/* After a step: at a log point (every log_every steps and at the end of
 * an epoch or the run) the interval's metrics are read back, checked,
 * shown and recorded; between them the progress callback only counts.
 * Histograms, when [log] asks for this step's. */
kiln_status trainer_log_point(struct trainer *t)
{
	const int64_t k = t->k, spe = t->steps_per_epoch, max_steps = t->tc.max_steps;
	int last = k + 1 == spe || (max_steps && t->step == max_steps);
	double ls, c, ranks;
	int bad;
	int64_t count;
	kiln_status st;
	if (kiln_loggers_hist_due(t->log, t->step) && (st = histograms(t)))
		return st;
	if (t->step % t->tc.log_every && !last) {
		trainer_progress(t, k + 1, NULL);
		return KILN_OK;
	}
	/* (a log point of the run's last step that log_every and the epoch's
	 * end do not put there: what it closes is kept for its checkpoint,
	 * so that a resume that trains on reopens it) */
	const int early = t->step % t->tc.log_every && k + 1 != spe;
	trainer_interval_closing(t, early);
	if ((st = interval_sums(t, &ls, &c, &bad, &count, &ranks)) ||
	    (st = params_diverged(t, t->step, t->ep, bad, count, ranks)) ||
	    (st = check_interval(t, ls)))
		return st;
	trainer_interval_closed(t, early);
	t->finite_step = t->step;
	t->interval_start = t->step;
	t->ep_loss += ls, t->ep_correct += c, t->ep_samples += t->since;
	const double n = (double)t->since;
	char msg[200];
	common_snprintf_c(msg, sizeof msg, "loss %.4f acc %.4f", common_nan_plain(ls / n),
			  common_nan_plain(c / n));
	trainer_progress(t, k + 1, msg);
	train_record(t, ls, c, n);
	t->since = t->since_seeded = 0;
	if (t->dist) /* [dist] timing: this interval's overlap */
		trainer_dist_comm_event(t);
	return kiln_loggers_status(t->log); /* a lost line ends the run */
}

kiln_status trainer_epoch_summary(struct trainer *t, char *msg, size_t n)
{
	struct kiln_train_result *res = t->res;
	const int64_t ep = t->ep;
	/* the epoch's wall time, and of it the steps' (its evaluations and
	 * checkpoint writes set aside), the rate's */
	const double ep_s = kiln_now_s() - t->ep_t0, steps_s = ep_s - t->ep_aside_s;
	struct kiln_ckpt_epoch sums = { t->ep_loss, t->ep_correct, t->ep_samples };
	/* (the same on every rank: an early stop off the log points leaves an
	 * interval open, whose sums are on the device) */
	if (t->since > 0) {
		char what[48];
		snprintf(what, sizeof what, "epoch %lld's end", (long long)ep + 1);
		kiln_status st = trainer_epoch_sums(t, KILN_OK, what, &sums);
		if (st)
			return st;
	}
	/* a resumed epoch's sums hold the samples before the checkpoint too
	 * (the loss averages the whole epoch); its time only this run's */
	int64_t ran = sums.samples - (ep == t->ep0 && t->off0 > 0 ? t->ep0_sums.samples : 0);
	/* epoch 1 includes warm-up: once a second epoch has run, time from
	 * epoch 2 on */
	if (ep == 1)
		t->timed_s = 0, t->timed_samples = 0;
	t->timed_s += steps_s;
	t->timed_samples += ran;
	res->epochs = (int)ep + 1;
	res->train_loss = sums.samples ? sums.loss / (double)sums.samples : 0;
	res->train_acc = sums.samples ? sums.correct / (double)sums.samples : 0;
	/* the rate of every data-parallel rank, as the train lines' (before
	 * session 39 this rank's: half theirs on 2 ranks) */
	common_snprintf_c(msg, n, "epoch %lld/%lld: train loss %.4f acc %.4f (%.1f s, %.0f samples/s)",
			  (long long)ep + 1, (long long)t->tc.epochs, common_nan_plain(res->train_loss),
			  common_nan_plain(res->train_acc), ep_s,
			  all_ranks(t, steps_s > 0 ? (double)ran / steps_s : 0));
	return KILN_OK;
}

/* The epoch's line (to the progress callback, else the log; msg NULL:
 * none), and an early stop's. */
void trainer_epoch_report(struct trainer *t, const char *msg)
{
	if (msg && t->progress)
		trainer_progress(t, -1, msg);
	else if (msg)
		kiln_log(KILN_LOG_INFO, "train", "%s", msg);
	if (t->stop_early) {
		const struct kiln_train_cfg *tc = &t->tc;
		const double best = tc->early_stop_on_loss ? -t->stopper.best : t->stopper.best;
		char was[64] = "none finite"; /* (every evaluation diverged) */
		if (t->stopper.have)
			common_snprintf_c(was, sizeof was, "%.4f", best);
		/* (the evaluation early stopping watches: [data.val]'s when
		 * there is one, else [data.eval]'s, the "test" of the logs) */
		kiln_log(KILN_LOG_INFO, "train", "early stop at step %lld: %s %s did not improve by more than %g in %lld evaluations (best %s)",
			 (long long)t->step, t->have_val ? "val" : "test",
			 tc->early_stop_on_loss ? "loss" : "accuracy",
			 tc->early_stop_min_delta, (long long)tc->early_stop_patience, was);
		t->res->early_stopped = 1;
	}
}

/* A metric, or null when it was not measured (< 0: no evaluation) or is
 * not finite (trainer_json_real). */
static json_t *metric_or_null(double v)
{
	return v < 0 ? json_null() : trainer_json_real(v);
}

/* Stages on ranks: this rank's device peak over the whole run (the end of
 * training included) and its host high-water mark, the figures
 * bench/pipe_ckpt_mem.sh reads. */
static void memory_line(struct trainer *t)
{
	size_t live = 0, peak = 0, hwm = 0;
	kiln_device_mem(t->dev, &live, &peak);
	kiln_rss(NULL, &hwm, 0);
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): memory at the end of training: device peak %zu bytes over the run (live %zu), host RSS high-water mark %zu bytes",
		 t->rank, t->rank % t->pipe_P, peak, live, hwm);
}

/* The bad samples the run's sets replaced (on_error = skip), from its
 * start (t->skipped0: the resumed checkpoint's count), summed over the
 * data-parallel ranks: the training set's (each rank reads its own
 * share) and the evaluations' (each rank evaluates its share of the set,
 * since session 43: before, this rank's count alone left out the other
 * shares' skips, and the count depended on the ranks), so that the count
 * is a 1-process run's.  The training set's in the batches the loader
 * handed out, not the ones its workers read ahead: a checkpoint's count
 * is what a run resumed from it reaches again, and the run's count at a
 * stop does not depend on how far the workers got.  Every rank's call (a
 * collective), a plain sum: at a checkpoint nothing between the ranks'
 * first sum and it fails on one rank alone (the interval's allgather is
 * a collective), and at the run's end a rank that failed before (its
 * final test) never reaches it, so an agreement here could not hold it
 * (session 41). */
kiln_status trainer_data_skipped(struct trainer *t, int64_t *out)
{
	int64_t n[2] = {
		t->train.loader ? kiln_loader_skipped(t->train.loader)
				: atomic_load(&t->train.ds.skipped),
		atomic_load(&t->test.ds.skipped) + (t->have_val ? atomic_load(&t->val.ds.skipped) : 0),
	};
	kiln_status st = kiln_dist_sum_counts(t->dist, n, 2, t->compute); /* exact */
	/* [dist] pipeline = P: a pipe's P ranks read the same samples
	 * (one data-parallel rank, drank; an evaluation's share per stage
	 * is read by every stage), so each skip was counted P times; an
	 * evaluation on the gathered model is sharded over every rank
	 * (core/train_eval.c, eval_share: each sample read once) */
	if (t->pipe_P > 1)
		n[0] /= t->pipe_P, n[1] /= t->eval_staged ? t->pipe_P : 1;
	*out = t->skipped0 + n[0] + n[1];
	return st;
}

/* The run's result, its last metrics.jsonl line, and the ranks' goodbye. */
kiln_status trainer_finish(struct trainer *t)
{
	struct kiln_train_result *res = t->res;
	kiln_status st;
	size_t live = 0, hwm, lo, hi;
	kiln_device_mem(t->dev, &live, &res->device_peak_bytes);
	/* (stages on ranks: what a stage's rank holds while it trains) */
	if (t->pipe_P > 1)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): device memory live after the last step %zu bytes (peak %zu)",
			 t->rank, t->rank % t->pipe_P, live, res->device_peak_bytes);
	kiln_rss(NULL, &hwm, 0);
	res->rss_growth_bytes = hwm > t->rss0 ? hwm - t->rss0 : 0;
	res->steps = t->step;
	/* the result names the run's final weights or nothing: a checkpoint
	 * of an earlier step (the one a resume started from, with
	 * checkpoint_last = 0; checkpoint_every's before an early stop) is
	 * not them (before session 32 `kiln train` printed it as its
	 * "trained weights") */
	if (t->named_step != t->step)
		res->checkpoint[0] = 0;
	for (int s = 0; s < SLOTS; s++)
		res->graphs_captured += t->graph[s] != NULL;
	res->stopped = t->stopping;
	/* one process: its own request's cause.  Under [dist] only the cause
	 * the ranks agreed on (trainer_dist_stop_cause_read): a rank whose
	 * SIGHUP came after the agreement stops as its peers do, with their
	 * cause or none (review, session 30: it exited 1 where they exited 0) */
	if (t->stopping && !t->dist && !res->stop_cause[0] && trainer_stop_cause())
		snprintf(res->stop_cause, sizeof res->stop_cause, "%s", trainer_stop_cause());
	if ((st = trainer_data_skipped(t, &res->data_skipped)))
		return st;
	res->data_wait_s = kiln_loader_wait_s(t->train.loader);
	if (res->data_skipped && !t->rank)
		kiln_log(KILN_LOG_WARN, "data", "%lld bad sample(s) skipped and replaced%s (on_error = skip)",
			 (long long)res->data_skipped, t->dist ? " over every rank" : "");
	/* (one data-parallel rank's, as bench/ has always read it; the run's
	 * beside it: the train lines' samples_per_s count every rank's) */
	res->train_samples_per_s = t->timed_s > 0 ? (double)t->timed_samples / t->timed_s : 0;
	res->samples_per_s = all_ranks(t, res->train_samples_per_s);
	/* the pipeline's measured busy times and bubble, logged and noted in
	 * the profile (the streams are drained by now) */
	if (t->pipe && (st = kiln_pipe_report(t->pipe)))
		return st;
	if (t->prof && (st = kiln_profile_report(t->prof, t->run.out_dir)))
		return st;
	res->wall_s = kiln_now_s() - t->t_start;
	if (t->dist)
		trainer_dist_summary(t);
	if (t->stopping && res->stop_cause[0])
		trainer_jsonl(t, "{s:s, s:I, s:o, s:o}", "event", "stopped", "step",
			      (json_int_t)t->step, "checkpoint", trainer_json_text(res->checkpoint),
			      "cause", trainer_json_text(res->stop_cause));
	else if (t->stopping)
		trainer_jsonl(t, "{s:s, s:I, s:o}", "event", "stopped", "step", (json_int_t)t->step,
			      "checkpoint", trainer_json_text(res->checkpoint));
	else
		trainer_jsonl(t, "{s:s, s:i, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "event",
			      "final", "epochs", res->epochs, "steps", (json_int_t)res->steps,
			      "train_loss", trainer_json_real(res->train_loss), "test_loss",
			      metric_or_null(res->test_loss), "test_acc", metric_or_null(res->test_acc),
			      "train_samples_per_s", trainer_json_real(res->train_samples_per_s),
			      "samples_per_s", trainer_json_real(res->samples_per_s),
			      "wall_s", trainer_json_real(res->wall_s), "setup_s",
			      trainer_json_real(t->t_fit0 - t->t_start), "fit_s",
			      trainer_json_real(res->wall_s - (t->t_fit0 - t->t_start)));
	/* the final parameters whole (ZeRO-1, [dist] pipeline), except on a
	 * rank holding its stage's alone: nothing reads the whole model after
	 * this (the last checkpoint and the final test are behind; the model
	 * is freed next), so it is not gathered (session 12) */
	st = kiln_dist_zero_settle(t->dist, t->compute);
	if (!st && !kiln_dist_pipe_held(t->dist, &lo, &hi))
		st = kiln_dist_pipe_gather(t->dist, t->compute);
	if (!st)
		st = kiln_device_stream_sync(t->dev, t->compute);
	if (!st && t->pipe_P > 1)
		memory_line(t);
	/* no rank leaves the group while a peer is still in a collective */
	if (!st)
		st = kiln_dist_finish(t->dist);
	if (!st)
		st = kiln_loggers_status(t->log); /* after the ranks' goodbye */
	return st;
}
