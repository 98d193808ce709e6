/* core/pipe_timing.c - the measured bubble of a pipeline: each stage's
 * stream stamps the clock when it starts and ends each of its forwards and
 * backwards (a host function in stream order: no host sync, no
 * serialisation), and the step's stamps are folded after every stage has
 * joined the compute stream.  A stage's busy time is the sum of its
 * passes; the bubble is the idle share of the stages' time over the
 * step's pipeline span, 1 - sum(busy) / (P * span), the quantity the
 * schedule's (P-1)/(M+P-1) predicts.  docs/pipeline.md. */
#include "dist.h" /* kiln_device_host_fn */
#include "pipeline.h"
#include "profile.h"

#include <stdio.h>

struct kiln_pipe_timing {
	int P, n_act;
	const struct kiln_pipe_action *act;
	double theory;
	int64_t *t;              /* 2 per action: start, end (ns) */
	int64_t steps, counted;  /* folded, and counted (after the first) */
	double busy_ns[KILN_PIPE_MAX_STAGES], span_ns;
	struct kiln_profile *prof;
};

kiln_status kiln_pipe_timing_open(struct kiln_device *const *devs, int P,
				  const struct kiln_pipe_action *act, int n_act, double theory,
				  struct kiln_profile *prof, struct kiln_pipe_timing **out)
{
	*out = NULL;
	/* a device without host functions would sync the host at each stamp */
	for (int s = 0; s < P; s++)
		if (!kiln_device_proc(devs[s], KILN_PROC_HOST_FN))
			return KILN_OK;
	struct kiln_pipe_timing *t = calloc(1, sizeof *t);
	if (!t || !(t->t = calloc((size_t)n_act * 2, sizeof *t->t))) {
		free(t);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	t->P = P;
	t->n_act = n_act;
	t->act = act;
	t->theory = theory;
	t->prof = prof;
	*out = t;
	return KILN_OK;
}

static kiln_status stamp_now(void *arg)
{
	*(int64_t *)arg = kiln_now_ns();
	return KILN_OK;
}

kiln_status kiln_pipe_timing_mark(struct kiln_pipe_timing *t, struct kiln_device *dev,
				  void *stream, int action, int end)
{
	if (!t)
		return KILN_OK;
	return kiln_device_host_fn(dev, stream, stamp_now, &t->t[2 * action + end]);
}

/* After every stage's last pass of a step: its busy times and span added
 * (the first step, which prepares kernels, is left out), and its passes
 * given to the profiler's trace. */
static kiln_status fold(void *arg)
{
	struct kiln_pipe_timing *t = arg;
	int64_t lo = INT64_MAX, hi = INT64_MIN;
	const int count = t->steps++ > 0;
	for (int i = 0; i < t->n_act; i++) {
		const int64_t a = t->t[2 * i], b = t->t[2 * i + 1];
		const struct kiln_pipe_action *x = &t->act[i];
		if (count)
			t->busy_ns[x->stage] += (double)(b - a);
		lo = a < lo ? a : lo;
		hi = b > hi ? b : hi;
		if (t->prof) {
			char what[48];
			snprintf(what, sizeof what, "%s mb %d", x->kind == KILN_PIPE_FWD ? "F" : "B", x->mb);
			kiln_profile_stage(t->prof, x->stage, what,
					   x->kind == KILN_PIPE_FWD ? KILN_PHASE_FORWARD : KILN_PHASE_BACKWARD,
					   a, b);
		}
	}
	if (count) {
		t->span_ns += (double)(hi - lo);
		t->counted++;
	}
	return KILN_OK;
}

kiln_status kiln_pipe_timing_step(struct kiln_pipe_timing *t, struct kiln_device *dev, void *stream)
{
	return t ? kiln_device_host_fn(dev, stream, fold, t) : KILN_OK;
}

kiln_status kiln_pipe_timing_report(struct kiln_pipe_timing *t, double *bubble)
{
	char line[256];
	int k = 0;
	*bubble = -1;
	if (!t || !t->counted)
		return KILN_OK;
	double sum = 0;
	for (int s = 0; s < t->P; s++)
		sum += t->busy_ns[s];
	*bubble = t->span_ns > 0 ? 1.0 - sum / ((double)t->P * t->span_ns) : 0;
	k = snprintf(line, sizeof line, "pipeline busy ms/step:");
	for (int s = 0; s < t->P && k < (int)sizeof line; s++)
		k += snprintf(line + k, sizeof line - (size_t)k, " stage %d %.3f,", s,
			      t->busy_ns[s] / 1e6 / (double)t->counted);
	if (k < (int)sizeof line)
		snprintf(line + k, sizeof line - (size_t)k, " span %.3f; bubble %.3f (schedule %.3f) over %lld steps",
			 t->span_ns / 1e6 / (double)t->counted, *bubble, t->theory,
			 (long long)t->counted);
	kiln_log(KILN_LOG_INFO, "pipeline", "%s", line);
	if (t->prof)
		kiln_profile_note(t->prof, line);
	return KILN_OK;
}

void kiln_pipe_timing_free(struct kiln_pipe_timing *t)
{
	if (!t)
		return;
	free(t->t);
	free(t);
}
