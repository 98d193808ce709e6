/* core/pipe_timing.c - the measured bubble of a pipeline: each stage's
 * stream stamps the clock when it starts and ends each of its forwards and
 * backwards (a host function in stream order: no host sync, no
 * serialisation), and the step's stamps are folded after every stage has
 * joined the compute stream.  A stage's busy time is the sum of its
 * passes; the idle share of the stages' time over the step's pipeline
 * span is 1 - sum(busy) / (P * span), which splits into the busiest
 * stage's idle share 1 - max(busy) / span (its fill and drain and any
 * wait: the quantity the schedule's (P-1)/(M+P-1) predicts, which assumes
 * equal stages) and the imbalance (max(busy) - mean(busy)) / span (the
 * other stages waiting for the busiest).  The step replayed with smoothed
 * passes (each at its stage's mean for its kind) tells the stages'
 * imbalance from the end passes (the step's first forward, its last
 * backward) and the hand-offs.  docs/pipeline.md. */
#include "dist.h" /* kiln_device_host_fn */
#include "pipeline.h"
#include "profile.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c, common_c_numbers_begin */

#include <sched.h> /* sched_getcpu */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* Stages on ranks: the counted steps whose stamps a rank keeps for stage
 * 0's rank to replay the whole pipe (kiln_pipe_timing_passes), the last ones */
#define KEEP_STEPS 32

/* A stamp: the clock, and the CPU time of the thread that runs the
 * stage's stream (its kernels' with one thread per stage) */
struct stamp_arg {
	struct kiln_pipe_timing *t;
	int i;
};

struct kiln_pipe_timing {
	int P, n_act;
	const struct kiln_pipe_action *act;
	double theory;
	int64_t *t;              /* 2 per action: start, end (ns) */
	int64_t *c;              /* the same in the stamping thread's CPU time */
	int *cpu;                /* per action: the CPU its start stamp ran on
				  * (sched_getcpu; -1 unknown: stamps replayed
				  * from ranks) */
	struct stamp_arg *arg;   /* 2 per action: what the stamp writes */
	int *prev, *dep;         /* per action: the stage's previous action, and
				  * the other stage's it waits for (-1: none) */
	double *dur, *ideal;     /* per action: its duration, and its end with
				  * instant hand-offs */
	int mine;                /* stages on ranks: the one stamped here (-1: all) */
	int64_t steps, counted;  /* folded, and counted (after the first) */
	double busy_ns[KILN_PIPE_MAX_STAGES], span_ns, ideal_ns;
	double gap_ns[2];        /* kiln_pipe_gaps summed: hand-offs, own gaps */
	int64_t gap_n[2];
	int64_t *ho_hist;        /* the hand-offs' latencies (GAP_BINS, gap_bin) */
	double gap_cpu_ns;       /* the stage threads' CPU time between their passes */
	double cpu_ns[KILN_PIPE_MAX_STAGES], cpu_span_ns; /* in CPU time */
	/* the spans replayed with smoothed passes (smooth_span): all of them,
	 * all but the end passes, and all of them in CPU time */
	double smooth_ns, ends_ns, cpu_smooth_ns;
	/* the end passes (the step's first and last action) and their
	 * stage's other passes of their kind, on average */
	double first_ns, first_rest_ns, last_ns, last_rest_ns;
	/* each stage's mean forward (2 s) and backward (2 s + 1), wall and
	 * CPU, and the smooth replay reshaped (reshaped_span): the stages'
	 * common forward share, and their mean total (issue 21) */
	double pass_ns[2 * KILN_PIPE_MAX_STAGES], pass_cpu_ns[2 * KILN_PIPE_MAX_STAGES];
	double share_ns, total_ns;
	double spread, cpu_spread; /* per step: (max - min) / mean of the stages' busy */
	double *sm;              /* per action: a smoothed duration */
	double *act_cpu;         /* per action: its CPU ns summed over the counted
				  * steps (the debug line of the passes' means) */
	struct kiln_profile *prof;
	/* stages on ranks: the last KEEP_STEPS counted steps' stamps of this
	 * rank's stage, per step 4 per action (start, end, CPU start, CPU
	 * end: ns; 0 for another stage's), step `kept % KEEP_STEPS` next */
	double *keep;
	int64_t kept;
	const char *who;         /* the report's lines start with it */
};

/* Each action's predecessor on its stage and the other stage's action it
 * waits for: a forward the previous stage's forward of its micro-batch, a
 * backward the next stage's backward (act is in an order that respects
 * both, pipe_schedule.c). */
static void link_actions(const struct kiln_pipe_action *act, int n, int *prev, int *dep)
{
	int last[KILN_PIPE_MAX_STAGES];
	for (int s = 0; s < KILN_PIPE_MAX_STAGES; s++)
		last[s] = -1;
	for (int i = 0; i < n; i++) {
		const struct kiln_pipe_action *a = &act[i];
		const int want = a->kind == KILN_PIPE_FWD ? a->stage - 1 : a->stage + 1;
		prev[i] = last[a->stage];
		last[a->stage] = i;
		dep[i] = -1;
		for (int k = 0; k < i && dep[i] < 0; k++)
			if (act[k].kind == a->kind && act[k].mb == a->mb && act[k].stage == want)
				dep[i] = k;
	}
}

/* The schedule replayed with action i taking dur[i], each as soon as its
 * stage's previous action and, handoff later, the other stage's it waits
 * for have ended (end[i] its end): the span. */
static double replay(const int *prev, const int *dep, int n, const double *dur, double handoff,
		     double *end)
{
	double hi = 0;
	for (int i = 0; i < n; i++) {
		double start = prev[i] >= 0 ? end[prev[i]] : 0;
		if (dep[i] >= 0 && end[dep[i]] + handoff > start)
			start = end[dep[i]] + handoff;
		end[i] = start + dur[i];
		hi = end[i] > hi ? end[i] : hi;
	}
	return hi;
}

double kiln_pipe_replay(const struct kiln_pipe_action *act, int n, const double *dur,
			double handoff, int P, double *busy)
{
	int *prev = malloc((size_t)n * sizeof *prev), *dep = malloc((size_t)n * sizeof *dep);
	double *end = malloc((size_t)n * sizeof *end), span = -1;
	if (prev && dep && end) {
		link_actions(act, n, prev, dep);
		span = replay(prev, dep, n, dur, handoff, end);
		for (int s = 0; s < P; s++)
			busy[s] = 0;
		for (int i = 0; i < n; i++)
			busy[act[i].stage] += dur[i];
	}
	free(prev);
	free(dep);
	free(end);
	return span;
}

/* The mean duration of each stage's forwards (mean[2 s]) and backwards
 * (mean[2 s + 1]) among the n actions, the step's first and last (its end
 * passes) left out when `ends`. */
static void pass_means(const struct kiln_pipe_action *act, int n, const double *dur, int ends,
		       double *mean)
{
	double sum[2 * KILN_PIPE_MAX_STAGES] = { 0 };
	int cnt[2 * KILN_PIPE_MAX_STAGES] = { 0 };
	for (int i = 0; i < n; i++) {
		if (ends && (i == 0 || i == n - 1))
			continue;
		const int k = 2 * act[i].stage + (act[i].kind != KILN_PIPE_FWD);
		sum[k] += dur[i];
		cnt[k]++;
	}
	for (int k = 0; k < 2 * KILN_PIPE_MAX_STAGES; k++)
		mean[k] = cnt[k] ? sum[k] / cnt[k] : 0;
}

/* The schedule replayed with instant hand-offs and smoothed passes: each
 * at its stage's mean for its kind (pass_means), the end passes at their
 * own duration when `ends` (sm: n scratch, end: n); the span.  The
 * stages' busy times are dur's, so the bubble over it is the stages'
 * imbalance alone (ends = 0: the schedule's for equal stages) or that and
 * the end passes' excess (ends = 1). */
static double smooth_span(const struct kiln_pipe_action *act, const int *prev, const int *dep,
			  int n, const double *dur, int ends, double *sm, double *end)
{
	double mean[2 * KILN_PIPE_MAX_STAGES];
	pass_means(act, n, dur, ends, mean);
	for (int i = 0; i < n; i++)
		sm[i] = ends && (i == 0 || i == n - 1)
			? dur[i] : mean[2 * act[i].stage + (act[i].kind != KILN_PIPE_FWD)];
	return replay(prev, dep, n, sm, 0, end);
}

double kiln_pipe_smooth(const struct kiln_pipe_action *act, int n, const double *dur, int ends)
{
	int *prev = malloc((size_t)n * sizeof *prev), *dep = malloc((size_t)n * sizeof *dep);
	double *sm = malloc((size_t)n * sizeof *sm), *end = malloc((size_t)n * sizeof *end);
	double span = -1;
	if (prev && dep && sm && end) {
		link_actions(act, n, prev, dep);
		span = smooth_span(act, prev, dep, n, dur, ends, sm, end);
	}
	free(prev);
	free(dep);
	free(sm);
	free(end);
	return span;
}

void kiln_pipe_idle_split(const double *busy, int P, double span, double *bubble,
			  double *imbalance)
{
	double sum = 0, most = 0;
	for (int s = 0; s < P; s++) {
		sum += busy[s];
		most = busy[s] > most ? busy[s] : most;
	}
	*bubble = span > 0 ? 1.0 - most / span : 0;
	*imbalance = span > 0 ? (most - sum / P) / span : 0;
}

/* A hand-off's latency in the histogram (KILN_PIPE_GAP_BINS): bins of 1 us
 * to 1 ms, of 100 us to 100 ms, the last one everything beyond; gap_us the
 * bin's lower end. */
#define GAP_BINS KILN_PIPE_GAP_BINS
static int gap_bin(int64_t ns)
{
	const int64_t us = ns > 0 ? ns / 1000 : 0;
	return us < 1000 ? (int)us : us < 100900 ? 1000 + (int)((us - 1000) / 100) : GAP_BINS - 1;
}

static double gap_us(int b)
{
	return b < 1000 ? (double)b : 1000.0 + 100.0 * (double)(b - 1000);
}

/* kiln_pipe_gaps with the links made; hist (NULL: none) counts the
 * hand-offs' latencies by gap_bin. */
static void gaps(const int *prev, const int *dep, int n, const int64_t *st, double *gap,
		 int64_t *cnt, int64_t *hist)
{
	for (int i = 0; i < n; i++) {
		const int64_t p = prev[i] >= 0 ? st[2 * prev[i] + 1] : INT64_MIN;
		const int64_t d = dep[i] >= 0 ? st[2 * dep[i] + 1] : INT64_MIN;
		if (p == INT64_MIN && d == INT64_MIN)
			continue; /* the step's first pass */
		const int k = d > p ? 0 : 1;
		gap[k] += (double)(st[2 * i] - (k ? p : d));
		cnt[k]++;
		if (!k && hist)
			hist[gap_bin(st[2 * i] - d)]++;
	}
}

double kiln_pipe_gap_quantile(const int64_t *hist, int64_t n, double q)
{
	int64_t seen = 0;
	for (int b = 0; b < GAP_BINS; b++)
		if ((seen += hist[b]) > (int64_t)(q * (double)n))
			return gap_us(b);
	return 0;
}

void kiln_pipe_gaps(const struct kiln_pipe_action *act, int n, const int64_t *st, double *gap,
		    int64_t *cnt, int64_t *hist)
{
	int *prev = malloc((size_t)n * sizeof *prev), *dep = malloc((size_t)n * sizeof *dep);
	if (prev && dep) {
		link_actions(act, n, prev, dep);
		gaps(prev, dep, n, st, gap, cnt, hist);
	}
	free(prev);
	free(dep);
}

/* The step's span had every hand-off been instant: the schedule replayed
 * with each pass taking the time its stamps st (wall or CPU) give. */
static double ideal_span(struct kiln_pipe_timing *t, const int64_t *st)
{
	for (int i = 0; i < t->n_act; i++)
		t->dur[i] = (double)(st[2 * i + 1] - st[2 * i]);
	return replay(t->prev, t->dep, t->n_act, t->dur, 0, t->ideal);
}

/* A timing of n_act actions over P stages (act borrowed), nothing stamped */
static struct kiln_pipe_timing *timing_new(int P, const struct kiln_pipe_action *act, int n_act,
					   double theory)
{
	struct kiln_pipe_timing *t = calloc(1, sizeof *t);
	if (!t || !(t->t = calloc((size_t)n_act * 2, sizeof *t->t)) ||
	    !(t->c = calloc((size_t)n_act * 2, sizeof *t->c)) ||
	    !(t->cpu = malloc((size_t)n_act * sizeof *t->cpu)) ||
	    !(t->arg = calloc((size_t)n_act * 2, sizeof *t->arg)) ||
	    !(t->prev = malloc((size_t)n_act * sizeof *t->prev)) ||
	    !(t->dep = malloc((size_t)n_act * sizeof *t->dep)) ||
	    !(t->dur = malloc((size_t)n_act * sizeof *t->dur)) ||
	    !(t->ideal = malloc((size_t)n_act * sizeof *t->ideal)) ||
	    !(t->sm = malloc((size_t)n_act * sizeof *t->sm)) ||
	    !(t->act_cpu = calloc((size_t)n_act, sizeof *t->act_cpu)) ||
	    !(t->ho_hist = calloc(GAP_BINS, sizeof *t->ho_hist))) {
		kiln_pipe_timing_free(t);
		return NULL;
	}
	link_actions(act, n_act, t->prev, t->dep);
	for (int i = 0; i < n_act; i++)
		t->cpu[i] = -1;
	for (int i = 0; i < 2 * n_act; i++)
		t->arg[i] = (struct stamp_arg){ t, i };
	t->P = P;
	t->mine = -1;
	t->n_act = n_act;
	t->act = act;
	t->theory = theory;
	t->who = "";
	return t;
}

kiln_status kiln_pipe_timing_open(struct kiln_device *const *devs, int P,
				  const struct kiln_pipe_action *act, int n_act, double theory,
				  struct kiln_profile *prof, struct kiln_pipe_timing **out)
{
	*out = NULL;
	/* a device without host functions would sync the host at each stamp */
	for (int s = 0; s < P; s++)
		if (!kiln_device_proc(devs[s], KILN_PROC_HOST_FN))
			return KILN_OK;
	struct kiln_pipe_timing *t = timing_new(P, act, n_act, theory);
	if (!t)
		return kiln_error(KILN_ENOMEM, "out of memory");
	t->prof = prof;
	*out = t;
	return KILN_OK;
}

static kiln_status stamp_now(void *arg)
{
	const struct stamp_arg *a = arg;
	struct timespec ts;
	a->t->t[a->i] = kiln_now_ns();
	if (!(a->i & 1))
		a->t->cpu[a->i / 2] = sched_getcpu();
	a->t->c[a->i] = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) ? 0
			: (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	return KILN_OK;
}

kiln_status kiln_pipe_timing_mark(struct kiln_pipe_timing *t, struct kiln_device *dev,
				  void *stream, int action, int end)
{
	if (!t)
		return KILN_OK;
	return kiln_device_host_fn(dev, stream, stamp_now, &t->arg[2 * action + end]);
}

/* The smooth replay with each stage's mean forward and backward (mean,
 * pass_means, ends = 0) reshaped, the span: every stage's total kept and
 * split as the stages' forwards and backwards together are (equal_total
 * 0: what the stages' unequal totals cost), or every stage's split kept
 * and its total the stages' mean (1: what their unequal splits cost).
 * The stages' busy times are unchanged (each has M forwards and M
 * backwards). */
static double reshaped_span(struct kiln_pipe_timing *t, const double *mean, int equal_total)
{
	double fwd = 0, all = 0, m[2 * KILN_PIPE_MAX_STAGES];
	for (int s = 0; s < t->P; s++)
		fwd += mean[2 * s], all += mean[2 * s] + mean[2 * s + 1];
	for (int s = 0; s < t->P; s++) {
		const double tot = mean[2 * s] + mean[2 * s + 1];
		if (equal_total) {
			m[2 * s] = tot > 0 ? mean[2 * s] * all / t->P / tot : 0;
			m[2 * s + 1] = tot > 0 ? mean[2 * s + 1] * all / t->P / tot : 0;
		} else {
			m[2 * s] = all > 0 ? tot * fwd / all : 0;
			m[2 * s + 1] = tot - m[2 * s];
		}
	}
	for (int i = 0; i < t->n_act; i++)
		t->sm[i] = m[2 * t->act[i].stage + (t->act[i].kind != KILN_PIPE_FWD)];
	return replay(t->prev, t->dep, t->n_act, t->sm, 0, t->ideal);
}

/* The stages' totals (a mean forward and backward each, pass_means):
 * (max - min) / mean; 0 for none */
static double stage_spread(int P, const double *mean)
{
	double lo = 0, hi = 0, sum = 0;
	for (int s = 0; s < P; s++) {
		const double v = mean[2 * s] + mean[2 * s + 1];
		lo = s == 0 || v < lo ? v : lo;
		hi = s == 0 || v > hi ? v : hi;
		sum += v;
	}
	return sum > 0 ? (hi - lo) * P / sum : 0;
}

/* The CPUs stage s's passes of the step started on (t->cpu), written at
 * line + k: " C" when all on one, else " C xN, D xM" (the first three by
 * first use, then ", ..."); the new k. */
static int log_cpus(const struct kiln_pipe_timing *t, int s, char *line, size_t size, int k)
{
	int id[3], n[3], used = 0, more = 0;
	for (int i = 0; i < t->n_act; i++) {
		if (t->act[i].stage != s || t->cpu[i] < 0)
			continue;
		int j = 0;
		while (j < used && id[j] != t->cpu[i])
			j++;
		if (j < used)
			n[j]++;
		else if (used < 3)
			id[used] = t->cpu[i], n[used++] = 1;
		else
			more = 1;
	}
	for (int j = 0; j < used && k > 0 && (size_t)k < size; j++)
		k += used == 1 ? common_snprintf_c(line + k, size - (size_t)k, " %d", id[j])
			       : common_snprintf_c(line + k, size - (size_t)k, "%s %d x%d", j ? "," : "",
						   id[j], n[j]);
	if (more && k > 0 && (size_t)k < size)
		k += common_snprintf_c(line + k, size - (size_t)k, ", ...");
	return k;
}

/* At debug level, one step's: when it started (its first stamp, on
 * kiln_now_ns's monotonic clock, to set beside samples of the ranks'
 * threads or CPUs taken meanwhile) and each stage's mean forward plus
 * backward, wall[s] and in CPU time (cpu: pass_means'), what the totals'
 * spread (report_shape) averages over the steps (docs/PERFORMANCE.md,
 * session 19), and, from stamps taken in this process, the CPUs each
 * stage's passes started on (log_cpus: whether a stage's slow steps
 * follow a CPU; session 47) */
static void log_step(const struct kiln_pipe_timing *t, const double *wall, const double *cpu)
{
	char line[64 + 100 * KILN_PIPE_MAX_STAGES];
	int k = common_snprintf_c(line, sizeof line, "step at %.3f s: the stages' pass pairs, ms (CPU):",
			 1e-9 * (double)t->t[0]);
	for (int s = 0; s < t->P && k > 0 && (size_t)k < sizeof line; s++)
		k += common_snprintf_c(line + k, sizeof line - (size_t)k, " %.3f (%.3f)", 1e-6 * wall[s],
			      1e-6 * (cpu[2 * s] + cpu[2 * s + 1]));
	int known = 0;
	for (int i = 0; i < t->n_act; i++)
		known |= t->cpu[i] >= 0;
	if (known && k > 0 && (size_t)k < sizeof line)
		k += common_snprintf_c(line + k, sizeof line - (size_t)k, "; started on CPU:");
	for (int s = 0; known && s < t->P && k > 0 && (size_t)k < sizeof line; s++) {
		if (s)
			k += common_snprintf_c(line + k, sizeof line - (size_t)k, " |");
		k = log_cpus(t, s, line, sizeof line, k);
	}
	kiln_log(KILN_LOG_DEBUG, "pipeline", "%s%s", t->who, line);
}

/* One step's smoothed replays (smooth_span, reshaped_span), passes' means
 * and end passes added, from its wall and CPU stamps (all stages here). */
static void fold_smooth(struct kiln_pipe_timing *t)
{
	const int n = t->n_act;
	double mean[2 * KILN_PIPE_MAX_STAGES];
	for (int i = 0; i < n; i++)
		t->dur[i] = (double)(t->t[2 * i + 1] - t->t[2 * i]);
	t->smooth_ns += smooth_span(t->act, t->prev, t->dep, n, t->dur, 0, t->sm, t->ideal);
	pass_means(t->act, n, t->dur, 0, mean);
	for (int k = 0; k < 2 * t->P; k++)
		t->pass_ns[k] += mean[k];
	t->spread += stage_spread(t->P, mean);
	double wall[KILN_PIPE_MAX_STAGES];
	for (int s = 0; s < t->P; s++)
		wall[s] = mean[2 * s] + mean[2 * s + 1];
	t->share_ns += reshaped_span(t, mean, 0);
	t->total_ns += reshaped_span(t, mean, 1);
	t->ends_ns += smooth_span(t->act, t->prev, t->dep, n, t->dur, 1, t->sm, t->ideal);
	pass_means(t->act, n, t->dur, 1, mean);
	t->first_ns += t->dur[0];
	t->first_rest_ns += mean[2 * t->act[0].stage + (t->act[0].kind != KILN_PIPE_FWD)];
	t->last_ns += t->dur[n - 1];
	t->last_rest_ns += mean[2 * t->act[n - 1].stage + (t->act[n - 1].kind != KILN_PIPE_FWD)];
	for (int i = 0; i < n; i++)
		t->dur[i] = (double)(t->c[2 * i + 1] - t->c[2 * i]);
	t->cpu_smooth_ns += smooth_span(t->act, t->prev, t->dep, n, t->dur, 0, t->sm, t->ideal);
	pass_means(t->act, n, t->dur, 0, mean);
	for (int k = 0; k < 2 * t->P; k++)
		t->pass_cpu_ns[k] += mean[k];
	t->cpu_spread += stage_spread(t->P, mean);
	log_step(t, wall, mean);
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
		if (t->mine >= 0 && x->stage != t->mine)
			continue;
		if (count) {
			t->busy_ns[x->stage] += (double)(b - a);
			t->cpu_ns[x->stage] += (double)(t->c[2 * i + 1] - t->c[2 * i]);
			t->act_cpu[i] += (double)(t->c[2 * i + 1] - t->c[2 * i]);
		}
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
	if (count && t->mine >= 0 && t->keep) {
		double *k = t->keep + (size_t)(t->kept++ % KEEP_STEPS) * (size_t)t->n_act * 4;
		for (int i = 0; i < t->n_act; i++)
			if (t->act[i].stage == t->mine)
				for (int e = 0; e < 2; e++)
					k[4 * i + e] = (double)t->t[2 * i + e],
					k[4 * i + 2 + e] = (double)t->c[2 * i + e];
	}
	if (count) {
		t->span_ns += (double)(hi - lo);
		t->ideal_ns += t->mine < 0 ? ideal_span(t, t->t) : 0;
		t->cpu_span_ns += t->mine < 0 ? ideal_span(t, t->c) : 0;
		if (t->mine < 0)
			fold_smooth(t);
		if (t->mine < 0)
			gaps(t->prev, t->dep, t->n_act, t->t, t->gap_ns, t->gap_n, t->ho_hist);
		for (int i = 0; t->mine < 0 && i < t->n_act; i++)
			if (t->prev[i] >= 0)
				t->gap_cpu_ns += (double)(t->c[2 * i] - t->c[2 * t->prev[i] + 1]);
		t->counted++;
	}
	return KILN_OK;
}

void kiln_pipe_timing_only(struct kiln_pipe_timing *t, int stage)
{
	if (!t)
		return;
	t->mine = stage;
	/* without room to keep stamps the pipe is not replayed (the gather
	 * still sends this rank's share: no steps) */
	if (!t->keep)
		t->keep = calloc((size_t)KEEP_STEPS * (size_t)t->n_act * 4, sizeof *t->keep);
}

/* Stages on ranks: this rank's stage only (the others' clocks are not
 * here): its busy time, its span and its idle share of it. */
static void report_mine(const struct kiln_pipe_timing *t, FILE *m)
{
	const double busy = t->busy_ns[t->mine], span = t->span_ns;
	fprintf(m, "pipeline busy ms/step: stage %d (this rank) %.3f (CPU %.3f), its span %.3f; idle %.3f of its span (schedule's bubble %.3f) over %lld steps",
		t->mine, busy / 1e6 / (double)t->counted, t->cpu_ns[t->mine] / 1e6 / (double)t->counted,
		span / 1e6 / (double)t->counted,
		span > 0 ? 1.0 - busy / span : 0, t->theory, (long long)t->counted);
}

/* "pipeline WHAT ms/step:" and each stage's ns[s] a step: their sum. */
static double report_stages(const struct kiln_pipe_timing *t, FILE *m, const char *what, const double *ns)
{
	double sum = 0;
	fprintf(m, "pipeline %s ms/step:", what);
	for (int s = 0; s < t->P; s++) {
		sum += ns[s];
		fprintf(m, " stage %d %.3f,", s, ns[s] / 1e6 / (double)t->counted);
	}
	return sum;
}

/* All stages here: each one's busy ms per step, the span, the bubble over
 * it and the schedule's, and the bubble had every hand-off been instant. */
static void report_busy(const struct kiln_pipe_timing *t, FILE *m)
{
	const double sum = report_stages(t, m, "busy", t->busy_ns);
	fprintf(m, " span %.3f; bubble %.3f (schedule %.3f; %.3f with these passes and instant hand-offs) over %lld steps",
		t->span_ns / 1e6 / (double)t->counted,
		t->span_ns > 0 ? 1.0 - sum / ((double)t->P * t->span_ns) : 0, t->theory,
		t->ideal_ns > 0 ? 1.0 - sum / ((double)t->P * t->ideal_ns) : 0, (long long)t->counted);
}

/* The same in the stream threads' CPU time, which other processes'
 * load does not stretch: each stage's CPU ms per step and, had every
 * hand-off been instant and every stage had a core, the span and bubble. */
static void report_cpu(const struct kiln_pipe_timing *t, FILE *m)
{
	const double sum = report_stages(t, m, "CPU", t->cpu_ns);
	fprintf(m, " span %.3f and bubble %.3f with a core each and instant hand-offs",
		t->cpu_span_ns / 1e6 / (double)t->counted,
		t->cpu_span_ns > 0 ? 1.0 - sum / ((double)t->P * t->cpu_span_ns) : 0);
}

/* The bubble split into the busiest stage's idle share and the imbalance,
 * measured (wall) and replayed with the passes' CPU times. */
static void report_split(const struct kiln_pipe_timing *t, FILE *m)
{
	double b, i, cb, ci, sum = 0;
	int most = 0;
	for (int s = 0; s < t->P; s++) {
		sum += t->busy_ns[s];
		most = t->busy_ns[s] > t->busy_ns[most] ? s : most;
	}
	kiln_pipe_idle_split(t->busy_ns, t->P, t->span_ns, &b, &i);
	kiln_pipe_idle_split(t->cpu_ns, t->P, t->cpu_span_ns, &cb, &ci);
	fprintf(m, "pipeline bubble split: busiest stage %d idle %.3f (schedule %.3f, for equal stages) + imbalance %.3f = %.3f; with the passes' CPU times and instant hand-offs %.3f + %.3f",
		most, b, t->theory, i, t->span_ns > 0 ? 1.0 - sum / ((double)t->P * t->span_ns) : 0,
		cb, ci);
}

/* The end passes, the first forward of the fill and the last backward of
 * the drain (the step's first-touch and tail work), against their stage's
 * other passes of their kind: ms a step. */
static void report_ends(const struct kiln_pipe_timing *t, FILE *m)
{
	const double s = (double)t->counted;
	const struct kiln_pipe_action *a = &t->act[0], *z = &t->act[t->n_act - 1];
	fprintf(m, "pipeline end passes: the step's first forward (stage %d) %.3f ms against %.3f for its stage's others, its last backward (stage %d) %.3f ms against %.3f",
		a->stage, t->first_ns / 1e6 / s, t->first_rest_ns / 1e6 / s, z->stage,
		t->last_ns / 1e6 / s, t->last_rest_ns / 1e6 / s);
}

/* What is the schedule's bubble and what is not, each a bubble over the
 * step replayed with the passes' busy times: every pass smoothed to its
 * stage's mean for its kind (what remains above the schedule's is the
 * stages' imbalance), then with the end passes as measured, then every
 * pass as measured (instant hand-offs), then the measured bubble (the
 * hand-offs' latency too); the first in CPU time. */
static void report_smooth(const struct kiln_pipe_timing *t, FILE *m)
{
	const double P = (double)t->P;
	double sum = 0, csum = 0;
	for (int i = 0; i < t->P; i++)
		sum += t->busy_ns[i], csum += t->cpu_ns[i];
	fprintf(m, "pipeline smooth replay: bubble %.3f (schedule %.3f + the stages' imbalance), %.3f with the end passes as measured, %.3f with every pass as measured, %.3f measured; %.3f in CPU time",
		t->smooth_ns > 0 ? 1.0 - sum / (P * t->smooth_ns) : 0, t->theory,
		t->ends_ns > 0 ? 1.0 - sum / (P * t->ends_ns) : 0,
		t->ideal_ns > 0 ? 1.0 - sum / (P * t->ideal_ns) : 0,
		t->span_ns > 0 ? 1.0 - sum / (P * t->span_ns) : 0,
		t->cpu_smooth_ns > 0 ? 1.0 - csum / (P * t->cpu_smooth_ns) : 0);
}

/* Each stage's mean forward and backward, wall (CPU) ms, and the smooth
 * bubble replayed with the stages' passes reshaped (reshaped_span): split
 * alike with their own totals, and at their mean total with their own
 * splits; the schedule's for equal stages, so each one's excess over it
 * is what the stages' unequal totals, or splits, cost (issue 21).  And
 * the stages' totals' spread within a step, (max - min) / mean, on
 * average: a step's imbalance, which the means over steps can hide. */
static void report_shape(const struct kiln_pipe_timing *t, FILE *m)
{
	const double c = (double)t->counted, P = (double)t->P;
	double sum = 0;
	fputs("pipeline passes' means, ms (CPU):", m);
	for (int s = 0; s < t->P; s++) {
		sum += t->busy_ns[s];
		fprintf(m, " stage %d forward %.3f (%.3f) backward %.3f (%.3f),", s,
			t->pass_ns[2 * s] / 1e6 / c, t->pass_cpu_ns[2 * s] / 1e6 / c,
			t->pass_ns[2 * s + 1] / 1e6 / c, t->pass_cpu_ns[2 * s + 1] / 1e6 / c);
	}
	fprintf(m, " smooth bubble %.3f with the stages' forward share alike, %.3f with their totals alike; the totals' spread a step %.1f%% (CPU %.1f%%)",
		t->share_ns > 0 ? 1.0 - sum / (P * t->share_ns) : 0,
		t->total_ns > 0 ? 1.0 - sum / (P * t->total_ns) : 0,
		100 * t->spread / c, 100 * t->cpu_spread / c);
}

/* The wall time between passes (kiln_pipe_gaps), per pass: what a
 * hand-off costs a stage that waits for it, and what a stage does between
 * its own passes that no pass's stamps count; and the stage threads' CPU
 * time between their passes (the crossing tensors' copies, the waits'
 * spins, the event records), which other processes' load stretches less. */
static void report_gaps(const struct kiln_pipe_timing *t, FILE *m)
{
	const double s = (double)t->counted;
	fprintf(m, "pipeline gaps: a pass that waited for the other stage's started %.1f us after it ended (median %.0f, 90%% %.0f; %.1f a step), one after its own stage's previous %.1f us after it (%.1f a step); ms a step %.3f + %.3f; the stage threads' CPU between passes %.3f ms a step",
		t->gap_n[0] ? t->gap_ns[0] / 1e3 / (double)t->gap_n[0] : 0,
		kiln_pipe_gap_quantile(t->ho_hist, t->gap_n[0], 0.5), kiln_pipe_gap_quantile(t->ho_hist, t->gap_n[0], 0.9),
		(double)t->gap_n[0] / s,
		t->gap_n[1] ? t->gap_ns[1] / 1e3 / (double)t->gap_n[1] : 0, (double)t->gap_n[1] / s,
		t->gap_ns[0] / 1e6 / s, t->gap_ns[1] / 1e6 / s, t->gap_cpu_ns / 1e6 / s);
}

/* The last step's passes of stage s in the order they ran, each in the
 * CPU time of its stream's thread (ms): what makes the passes unequal,
 * which the schedule's bubble assumes they are not. */
static void report_passes(const struct kiln_pipe_timing *t, int s, FILE *m)
{
	fprintf(m, "last step's passes, stage %d, CPU ms:", s);
	for (int i = 0; i < t->n_act; i++)
		if (t->act[i].stage == s)
			fprintf(m, " %s%d %.2f", t->act[i].kind == KILN_PIPE_FWD ? "F" : "B",
				t->act[i].mb, (double)(t->c[2 * i + 1] - t->c[2 * i]) / 1e6);
	/* and every counted step's, on average: one step's figures move with
	 * the machine's load, a pass that is longer at every step does not */
	fprintf(m, "; over the %lld counted steps, mean CPU ms:", (long long)t->counted);
	for (int i = 0; i < t->n_act && t->counted; i++)
		if (t->act[i].stage == s)
			fprintf(m, " %s%d %.3f", t->act[i].kind == KILN_PIPE_FWD ? "F" : "B",
				t->act[i].mb, t->act_cpu[i] / 1e6 / (double)t->counted);
}

/* A report line, written by one of the report_ functions above into a
 * stream of its own size (the lines grow with the stages and the passes:
 * a fixed buffer cut them), logged at `level` after the run's prefix and,
 * with `note`, noted in the profile.  passes: report_passes of stage s
 * instead of line. */
static void report_line(const struct kiln_pipe_timing *t, int level, int note,
			void (*line)(const struct kiln_pipe_timing *, FILE *), int s)
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	if (m) { /* the numbers in the C locale, as every message's */
		const locale_t old = common_c_numbers_begin();
		if (line)
			line(t, m);
		else
			report_passes(t, s, m);
		common_c_numbers_end(old);
	}
	if (!m || fclose(m) || !text) {
		kiln_log(KILN_LOG_WARN, "pipeline", "%sno memory for a report line", t->who);
		free(text);
		return;
	}
	kiln_log(level, "pipeline", "%s%s", t->who, text);
	if (note && t->prof)
		kiln_profile_note(t->prof, text);
	free(text);
}

kiln_status kiln_pipe_timing_step(struct kiln_pipe_timing *t, struct kiln_device *dev, void *stream)
{
	return t ? kiln_device_host_fn(dev, stream, fold, t) : KILN_OK;
}

kiln_status kiln_pipe_timing_report(struct kiln_pipe_timing *t, double *bubble)
{
	static void (*const lines[])(const struct kiln_pipe_timing *, FILE *) = {
		report_busy, report_cpu, report_split, report_gaps, report_ends, report_smooth,
		report_shape,
	};
	*bubble = -1;
	if (!t || !t->counted)
		return KILN_OK;
	if (t->mine >= 0) {
		report_line(t, KILN_LOG_INFO, 0, report_mine, 0);
		return KILN_OK;
	}
	double sum = 0;
	for (int s = 0; s < t->P; s++)
		sum += t->busy_ns[s];
	*bubble = t->span_ns > 0 ? 1.0 - sum / ((double)t->P * t->span_ns) : 0;
	for (size_t k = 0; k < sizeof lines / sizeof lines[0]; k++)
		report_line(t, KILN_LOG_INFO, 1, lines[k], 0);
	/* at debug level: the last step's passes, a line a stage */
	for (int s = 0; s < t->P && kiln_log_get_level() >= KILN_LOG_DEBUG; s++)
		report_line(t, KILN_LOG_DEBUG, 0, NULL, s);
	return KILN_OK;
}

void kiln_pipe_timing_mine(const struct kiln_pipe_timing *t, double *ms)
{
	const double n = t && t->counted ? (double)t->counted : 0;
	ms[0] = n > 0 ? t->busy_ns[t->mine] / 1e6 / n : 0;
	ms[1] = n > 0 ? t->cpu_ns[t->mine] / 1e6 / n : 0;
	ms[2] = n > 0 ? t->span_ns / 1e6 / n : 0;
}

/* Stage 0's rank, with every stage's busy and CPU ms and span a step
 * (ms[3 s], ms[3 s + 1], ms[3 s + 2]): the pipe's bubble over the longest
 * span, and its split.  Stage 0's span is the step's where its last
 * backward ends the step; a stage 0 with nothing to compute backward (a
 * flatten alone) ends its step early and runs ahead, and its span is
 * shorter than the busiest stage's busy time. */
void kiln_pipe_timing_report_pipe(const struct kiln_pipe_timing *t, const double *ms)
{
	/* the line grows with the stages (up to KILN_PIPE_MAX_STAGES of about
	 * 40 characters each): a stream of its own size, whole */
	char *line = NULL;
	size_t len = 0;
	FILE *m;
	double busy[KILN_PIPE_MAX_STAGES], sum = 0, b, i;
	if (!t || !t->counted || t->mine != 0)
		return;
	if (!(m = open_memstream(&line, &len))) {
		kiln_log(KILN_LOG_WARN, "pipeline", "no memory for the pipe's busy line");
		return;
	}
	double span = 0;
	const locale_t old = common_c_numbers_begin(); /* (report_line) */
	fputs("pipeline busy ms/step, the pipe's ranks:", m);
	int most = 0, longest = 0;
	for (int s = 0; s < t->P; s++) {
		busy[s] = ms[3 * s];
		sum += busy[s];
		most = busy[s] > busy[most] ? s : most;
		if (ms[3 * s + 2] > span) {
			span = ms[3 * s + 2];
			longest = s;
		}
		fprintf(m, " stage %d %.3f (CPU %.3f),", s, ms[3 * s], ms[3 * s + 1]);
	}
	kiln_pipe_idle_split(busy, t->P, span, &b, &i);
	fprintf(m, " span %.3f (stage %d's); bubble %.3f (schedule %.3f) = busiest stage %d idle %.3f + imbalance %.3f",
		span, longest, span > 0 ? 1.0 - sum / ((double)t->P * span) : 0, t->theory, most, b, i);
	common_c_numbers_end(old);
	if (fclose(m) || !line) {
		kiln_log(KILN_LOG_WARN, "pipeline", "no memory for the pipe's busy line");
		free(line);
		return;
	}
	kiln_log(KILN_LOG_INFO, "pipeline", "%s", line);
	if (t->prof)
		kiln_profile_note(t->prof, line);
	free(line);
}

/* The host's name hashed (FNV-1a, 32 bits: exact in a double): ranks on
 * one host share CLOCK_MONOTONIC, so their stamps compare */
static double host_id(void)
{
	char name[256] = "";
	uint32_t h = 2166136261u;
	if (gethostname(name, sizeof name - 1))
		return 0;
	for (const char *p = name; *p; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	return (double)h;
}

int kiln_pipe_timing_passes_n(const struct kiln_pipe_timing *t)
{
	return t ? 2 + KEEP_STEPS * t->n_act * 4 : 0;
}

void kiln_pipe_timing_passes(const struct kiln_pipe_timing *t, double *out)
{
	const size_t n = (size_t)kiln_pipe_timing_passes_n(t);
	for (size_t i = 0; i < n; i++)
		out[i] = 0;
	if (!t || !t->keep)
		return;
	out[0] = host_id();
	out[1] = (double)(t->kept < KEEP_STEPS ? t->kept : KEEP_STEPS);
	for (size_t i = 2; i < n; i++)
		out[i] = t->keep[i - 2];
}

/* Stage 0's rank: the whole pipe's kept steps (every stage's passes from
 * its own rank's block of `all`) folded as one process folds its stages',
 * and reported with the same lines, each headed "the ranks' stamps: " */
void kiln_pipe_timing_report_passes(const struct kiln_pipe_timing *t, const double *all)
{
	if (!t || t->mine != 0)
		return;
	const int n = kiln_pipe_timing_passes_n(t);
	const int steps = (int)all[1];
	for (int s = 1; s < t->P; s++)
		if (all[(size_t)s * (size_t)n] != all[0] || (int)all[(size_t)s * (size_t)n + 1] != steps) {
			kiln_log(KILN_LOG_INFO, "pipeline",
				 "the ranks' stamps: stage %d's rank is on another host or kept other steps: the pipe's passes are not replayed", s);
			return;
		}
	struct kiln_pipe_timing *w = steps > 0 ? timing_new(t->P, t->act, t->n_act, t->theory) : NULL;
	if (!w)
		return;
	w->who = "the ranks' stamps: ";
	w->steps = 1; /* every kept step is counted (the first was left out) */
	for (int k = 0; k < steps; k++) {
		for (int i = 0; i < t->n_act; i++) {
			const double *v = all + (size_t)t->act[i].stage * (size_t)n + 2 +
					  ((size_t)k * (size_t)t->n_act + (size_t)i) * 4;
			for (int e = 0; e < 2; e++)
				w->t[2 * i + e] = (int64_t)v[e], w->c[2 * i + e] = (int64_t)v[2 + e];
		}
		fold(w);
	}
	double bubble;
	kiln_pipe_timing_report(w, &bubble);
	kiln_pipe_timing_free(w);
}

void kiln_pipe_timing_free(struct kiln_pipe_timing *t)
{
	if (!t)
		return;
	free(t->t);
	free(t->c);
	free(t->cpu);
	free(t->arg);
	free(t->prev);
	free(t->dep);
	free(t->dur);
	free(t->ideal);
	free(t->sm);
	free(t->act_cpu);
	free(t->ho_hist);
	free(t->keep);
	free(t);
}
