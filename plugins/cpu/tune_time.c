/* plugins/cpu/tune_time.c - timing candidate plans for the tuner (tune.c):
 * scratch tensors of an op's shapes, interleaved timed runs, the median
 * wall time and the team's CPU time of each candidate, and what the runs
 * ran under (the run-queue wait, the adaptive team).  Why each measure is
 * what it is: tune.c's opening comment and the comments below.
 */
#include "cpu.h"
#include "dnn.h"  /* cpu_dnn_w_forget */
#include "wino.h" /* cpu_wino_forget */
#include "../common/c_locale.h" /* common_strtod, common_snprintf_c */

#include <stdlib.h>  /* getenv */
#include <string.h>  /* memset */
#include <time.h>    /* clock_gettime */
#include <omp.h>     /* omp_get_thread_num */
#include <pthread.h> /* pthread_getcpuclockid */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t elem_size(int dtype)
{
	switch (dtype) {
	case KILN_BF16:
	case KILN_F16: return 2;
	case KILN_I8:
	case KILN_U8: return 1;
	case KILN_I64: return 8;
	default: return 4;
	}
}

/* Bytes of argument i (inputs, then outputs) of plan p: the tensor's, or
 * for max pooling's aux (out1 of POOL, in1 of POOL_BWD; no shape in the
 * op) and a convolution's kept copy the plan's aux bytes. */
static size_t arg_bytes(const struct cpu_plan *p, int i)
{
	const struct kiln_op *op = &p->op;
	if (p->aux && ((op->type == KILN_OP_POOL && i == op->n_in + 1) ||
		       (op->type == KILN_OP_POOL_BWD && i == 1)))
		return p->aux;
	/* a convolution's kept copy (KILN_OPF_KEEP: its last output) */
	if (p->aux && (op->flags & KILN_OPF_KEEP) && i == op->n_in + op->n_out - 1)
		return p->aux;
	const struct kiln_tensor_desc *d = i < op->n_in ? &op->in[i] : &op->out[i - op->n_in];
	return (size_t)cpu_numel(d) * elem_size(d->dtype);
}

char *cpu_scratch_args(const struct cpu_plan *p, size_t ws, int random, struct kiln_op_args *a,
		       size_t *out_bytes)
{
	const struct kiln_op *op = &p->op;
	size_t off[KILN_OP_MAX_IN + KILN_OP_MAX_OUT], total = 0;
	char *buf = NULL;
	memset(a, 0, sizeof *a);
	for (int i = 0; i < op->n_in + op->n_out; i++) {
		off[i] = total;
		if (out_bytes && i >= op->n_in)
			out_bytes[i - op->n_in] = arg_bytes(p, i);
		total += (arg_bytes(p, i) + 63) & ~(size_t)63;
	}
	if (!(buf = cpu_huge_alloc(64, total + ws + 64)))
		return NULL;
	/* timing: small exact values (0.25 in every dtype the ops take here):
	 * no denormal or infinity slows a kernel down, accumulation stays
	 * finite; random: values in [-1, 1) with every mantissa bit set at
	 * random (an LCG), so that sums taken in another order round
	 * differently (values with few bits would sum exactly in any order) */
	uint32_t h = 12345;
	for (int i = 0; i < op->n_in + op->n_out; i++) {
		const struct kiln_tensor_desc *d = i < op->n_in ? &op->in[i] : &op->out[i - op->n_in];
		const size_t bytes = arg_bytes(p, i);
		const int64_t m = (int64_t)(bytes / elem_size(d->dtype));
		char *x = buf + off[i];
		if (bytes == (size_t)cpu_numel(d) * elem_size(d->dtype) &&
		    (d->dtype == KILN_BF16 || d->dtype == KILN_F16 || d->dtype == KILN_F32)) {
			for (int64_t e = 0; e < m; e++) {
				h = h * 1664525u + 1013904223u;
				const float f = random ? (float)((int32_t)h >> 7) * 0x1p-24f : 0.25f;
				if (d->dtype == KILN_F32)
					((float *)x)[e] = f;
				else if (d->dtype == KILN_BF16)
					((uint16_t *)x)[e] = cpu_bf16_round(f);
				else
					((uint16_t *)x)[e] = random ? 0x3400 ^ (uint16_t)(h >> 22) : 0x3400;
			}
		} else {
			memset(x, 0, bytes);
		}
		if (i < op->n_in)
			a->in[i] = x;
		else
			a->out[i - op->n_in] = x;
	}
	memset(buf + total, 0, ws);
	a->workspace = ws ? buf + total : NULL;
	a->workspace_bytes = ws;
	return buf;
}

/* The clock's reading, seconds. */
static double clock_s(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The timing thread's OpenMP team, whose CPU time cpu_tune_time_plans sums: at most
 * TUNE_TEAM threads' CPU clocks, the timing thread's first. */
#define TUNE_TEAM 64
struct tune_team {
	clockid_t id[TUNE_TEAM];
	int n;
};

/* Each thread's own clock, not CLOCK_PROCESS_CPUTIME_ID: on this kernel
 * that adds another thread's time only at a timer tick (HZ = 250) or a
 * switch, so a 2-thread op of 1-10 ms read anywhere from its calling
 * thread's time alone to that plus 4 ms of its worker's (docs/PERFORMANCE.md,
 * "Session 14: the tuner's measure"); a thread's own clock is exact. */
static void tune_team_get(struct tune_team *tm)
{
	int n = 0;
	tm->n = 0;
	if (pthread_getcpuclockid(pthread_self(), &tm->id[0]))
		return;
#pragma omp parallel
	{
		const int k = omp_get_thread_num();
		clockid_t id;
		if (k > 0 && k < TUNE_TEAM && !pthread_getcpuclockid(pthread_self(), &id))
			tm->id[k] = id;
		else if (k > 0 && k < TUNE_TEAM)
			tm->id[k] = tm->id[0]; /* cannot happen; counted twice then */
#pragma omp single
		n = omp_get_num_threads();
	}
	tm->n = n < 1 ? 1 : n > TUNE_TEAM ? TUNE_TEAM : n;
}

/* The team's CPU time, seconds. */
static double tune_team_s(const struct tune_team *tm)
{
	double s = 0;
	for (int k = 0; k < tm->n; k++)
		s += clock_s(tm->id[k]);
	return s;
}

/* The median of v[0..n) (sorts v). */
static double median(double *v, int n)
{
	for (int i = 1; i < n; i++) /* insertion sort: n <= TUNE_ROUNDS */
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			const double t = v[j];
			v[j] = v[j - 1], v[j - 1] = t;
		}
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define TUNE_ROUNDS 31
/* The least window the run-queue wait is read over (cpu_tune_time_plans), s: the
 * timed runs of a small op (31 rounds of 3 candidates of 10-50 us: 1-5 ms)
 * fit between two of the scheduler's slices on a busy core (~3-4 ms here),
 * so their wait read 0 or a whole slice; 10 ms holds a few. */
#define TUNE_WAIT_MIN_S 0.010

/* The process's threads' run-queue wait over the timed runs, in seconds a
 * second, into w (< 0 not measured).  KILN_CPU_TUNEWAIT, the tests' hook,
 * stands for the whole reading: that wait, on a steady team of the
 * context's size (make check sets it to 0 so that a test's cache stays
 * confident on a loaded machine, where the adaptive team shrinks too). */
static void tune_wait(struct cpu_ctx *c, const struct cpu_wait_mark *m, struct cpu_tune_cond *w)
{
	const char *hook = getenv("KILN_CPU_TUNEWAIT");
	if (!hook || !*hook) {
		w->wait = cpu_wait_end(m);
		return;
	}
	w->wait = common_strtod(hook, NULL);
	w->team = w->team ? c->threads : 0;
	w->changed = 0;
}

/* Seconds of one run of each of the n plans q[] on scratch tensors of
 * op's shapes (both < 0 when a plan failed to run), and *w what they ran
 * under: the run-queue wait of every thread of the process (tune_wait;
 * the timing thread's alone read 0.00-0.14 s/s while a busy loop starved
 * its team's other thread: it sleeps at the barrier, and sleeping is no
 * wait), over the timed runs (5 to
 * 31, which interleave the candidates so that a load spike hits each),
 * and the adaptive team then (struct cpu_tune_cond):
 * wall[k] the median of candidate k's wall times, cpu[k] the median of the
 * CPU time its runs took on the timing thread's OpenMP team (each
 * thread's exact clock: tune_team_get).  tune_choose takes the wall
 * times on a quiet machine, what a step will take; the team's CPU time
 * under contention, which leaves out each thread's preemptions.  Process
 * CPU time, taken before, read a 2-thread op's worker at timer ticks only
 * and picked against the wall clock in 3 of 6 of the bf16 CNN's 2-thread
 * choices; the minimum of wall times, before that, flipped the choice on
 * a loaded machine (one lucky run decides; docs/PERFORMANCE.md, "Issue
 * 23, session 10", "Session 14: the tuner's measure"). */
void cpu_tune_time_plans(struct cpu_ctx *c, struct cpu_plan *const *q, int n, double *wall,
			 double *cpu, struct cpu_tune_cond *w)
{
	struct kiln_op_args a;
	struct cpu_wait_mark m;
	size_t ws = 0;
	/* the team: a change counted from before the warm-up (cpu_exec ticks
	 * the adaptive team), its size read as the timed runs begin */
	const int64_t changes = cpu_team_changes(&c->team);
	w->wait = -1;
	w->team = w->changed = 0;
	double rw[CPU_CONV_IMPLS > 3 ? CPU_CONV_IMPLS : 3][TUNE_ROUNDS];
	double rc[CPU_CONV_IMPLS > 3 ? CPU_CONV_IMPLS : 3][TUNE_ROUNDS];
	struct tune_team tm;
	for (int k = 0; k < n; k++) {
		wall[k] = cpu[k] = -1;
		if (q[k]->workspace > ws)
			ws = q[k]->workspace;
	}
	char *buf = cpu_scratch_args(q[0], ws, 0, &a, NULL);
	if (!buf)
		return;

	struct cpu_err e;
	double first = 0;
	for (int k = 0; k < n; k++) { /* warm-up: first-touch, caches, JIT */
		const double t0 = now_s();
		if (cpu_exec(c, q[k], &a, &e) != KILN_OK)
			goto out;
		const double dt = now_s() - t0;
		if (dt > first)
			first = dt;
	}
	/* at least 5 rounds, more for short ops: about 30 ms per candidate */
	int rounds = first > 0 ? (int)(0.03 / first) : TUNE_ROUNDS;
	rounds = rounds < 5 ? 5 : rounds > TUNE_ROUNDS ? TUNE_ROUNDS : rounds;
	tune_team_get(&tm);
	if (!cpu_op_one_thread(&q[0]->op)) {
		const int k = __atomic_load_n(&c->team.size, __ATOMIC_RELAXED), d = cpu_team_dnn(&c->team);
		w->team = k < d ? k : d;
	}
	cpu_wait_begin_all(&m);
	const double start = now_s();
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < n; k++) {
			const double w0 = now_s(), c0 = tune_team_s(&tm);
			if (cpu_exec(c, q[k], &a, &e) != KILN_OK)
				goto out;
			rc[k][r] = tune_team_s(&tm) - c0;
			rw[k][r] = now_s() - w0;
		}
	/* a small op: more (untimed) rounds until the wait's window is
	 * TUNE_WAIT_MIN_S */
	double window;
	while ((window = now_s() - start) < TUNE_WAIT_MIN_S)
		for (int k = 0; k < n; k++)
			if (cpu_exec(c, q[k], &a, &e) != KILN_OK)
				goto out;
	w->changed = cpu_team_changes(&c->team) != changes;
	tune_wait(c, &m, w);
	for (int k = 0; k < n; k++) {
		wall[k] = median(rw[k], rounds);
		cpu[k] = median(rc[k], rounds);
	}
	{ /* both measures, for a check on a quiet machine (debug level) */
		char s0[96], s1[160] = "";
		size_t len = 0;
		for (int k = 0; k < n && len < sizeof s1; k++) {
			const int got = common_snprintf_c(s1 + len, sizeof s1 - len, "%s%.3f/%.3f", k ? ", " : "",
							  1e3 * wall[k], 1e3 * cpu[k]);
			len += got > 0 ? (size_t)got : sizeof s1;
		}
		c->host->log(KILN_LOG_DEBUG, "cpu",
			     "timed %s %s: %d candidates x %d runs, team of %d, wait %.2f s/s over %.1f ms; median wall/team CPU ms: %s; adaptive team %d of %d%s",
			     cpu_op_name(q[0]->op.type), cpu_desc_str(&q[0]->op.in[0], s0, sizeof s0), n, rounds,
			     tm.n, w->wait, 1e3 * window, s1, w->team, c->threads,
			     w->changed ? ", changed meanwhile" : "");
	}
out:
	cpu_split_quiesce(c); /* a late GEMM helper may still read buf */
	/* a frozen conv timed as it runs (its weights reordered once, or
	 * Winograd's transformed once, into entries listed under the scratch
	 * weights: wshare.c), but from scratch weights: those entries are
	 * listed no more, and the first real run takes the plan's anew */
	cpu_wshare_freed(&c->wshare, buf);
	cpu_huge_free(buf);
	for (int k = 0; k < n; k++)
		for (const struct cpu_plan *x = q[k]; x; x = x->inner) {
			cpu_dnn_w_forget(x->dnn);
			cpu_wino_forget(x->wino);
		}
}
