/* plugins/cpu/threads.c - the CPU device's OpenMP team: its starting size
 * from the affinity mask and the cgroup CPU quota, and the controller that
 * shrinks it while the process's threads wait for a CPU.
 *
 * Why: an OpenMP team is as fast as its slowest thread.  When another
 * process is busy on one of two cores, one of kiln's two threads is off the
 * CPU for a time slice (milliseconds) at a time while the other spins and
 * then sleeps at the barrier of a parallel region that lasts microseconds;
 * the step ran 3x slower than with one thread.  The kernel reports exactly
 * that waiting: the run-queue delay of each thread (schedstat).  Over an
 * interval of about 100 ms of work, the delay summed over the process's
 * threads divided by the wall time is the number of threads that on
 * average wanted a CPU and had none.  That counts the process's own
 * threads competing too (the start-up's), so a second measurement says
 * whether another process is there: the CPU time the affinity mask's CPUs
 * were busy (/proc/stat) less the process's own.  Waiting above
 * CPU_TEAM_SHRINK while others took CPU_TEAM_OTHERS CPUs steps the team
 * down at once; waiting alone is judged only after the first
 * CPU_TEAM_SETTLE intervals (the context's start-up), and for
 * CPU_TEAM_SHRINK_HOT intervals in a row (one interval a thread after
 * that).  After CPU_TEAM_PROBE_MIN calm intervals the team tries one
 * thread more (not while other processes hold the CPUs it would run on:
 * cpus_taken), after a crowded step down as soon as the others' reading
 * has stayed low (CPU_TEAM_GONE), and a probe that brings the waiting
 * back doubles the calm wait before the next (up to CPU_TEAM_PROBE_MAX
 * intervals, about 8 s).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "threads.h"
#include "../common/describe.h" /* common_numel */

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>  /* sched_getaffinity */
#include <string.h>
#include <time.h>
#include <unistd.h> /* sysconf */

/* ---- parsers --------------------------------------------------------------- */

double cpu_quota_v2(const char *cpu_max)
{
	long long quota, period;
	if (!cpu_max || sscanf(cpu_max, "%lld %lld", &quota, &period) != 2)
		return 0; /* "max PERIOD", or nothing readable: no limit */
	return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

double cpu_quota_v1(const char *quota_us, const char *period_us)
{
	long long quota, period;
	if (!quota_us || !period_us || sscanf(quota_us, "%lld", &quota) != 1 ||
	    sscanf(period_us, "%lld", &period) != 1)
		return 0;
	return quota > 0 && period > 0 ? (double)quota / (double)period : 0;
}

/* Does the comma-separated list [s, e) hold `name`? */
static int list_has(const char *s, const char *e, const char *name)
{
	size_t n = strlen(name);
	while (s < e) {
		const char *c = memchr(s, ',', (size_t)(e - s));
		if (!c)
			c = e;
		if ((size_t)(c - s) == n && !memcmp(s, name, n))
			return 1;
		s = c + 1;
	}
	return 0;
}

int cpu_cgroup_path(const char *text, const char *controller, char *out, size_t n)
{
	/* lines "ID:CONTROLLERS:PATH"; v2's is "0::PATH" */
	for (const char *l = text; l && *l;) {
		const char *end = strchr(l, '\n');
		if (!end)
			end = l + strlen(l);
		const char *c1 = memchr(l, ':', (size_t)(end - l));
		const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : NULL;
		if (c2 && (!controller ? c2 == c1 + 1 && c1 - l == 1 && *l == '0'
				       : list_has(c1 + 1, c2, controller))) {
			size_t len = (size_t)(end - c2 - 1);
			if (len + 1 > n)
				return -1;
			memcpy(out, c2 + 1, len);
			out[len] = 0;
			return 0;
		}
		l = *end ? end + 1 : end;
	}
	return -1;
}

int cpu_threads_for(int affinity, double quota)
{
	int n = affinity > 0 ? affinity : 1;
	if (quota > 0) {
		/* rounded: a thread for half a CPU or more; the controller
		 * takes it back if it only waits */
		double q = floor(quota + 0.5);
		if (q < 1)
			q = 1;
		if (q < n)
			n = (int)q;
	}
	return n;
}

/* ---- small ops run on one thread ------------------------------------------ */

/* Floating-point operations of a GEMM (2 M N K) or convolution (2 x the
 * output's elements x the sum's length C/g KH KW), in any direction; 0
 * for other ops. */
static double op_flop(const struct kiln_op *op)
{
	switch (op->type) {
	case KILN_OP_GEMM:
		return 2.0 * (double)op->i[2] * (double)op->i[3] * (double)op->i[4];
	case KILN_OP_CONV:
	case KILN_OP_CONV_BWD_DATA:
	case KILN_OP_CONV_BWD_WEIGHTS: {
		/* y (or dy) and w: CONV y = out0, w = in1; BWD_DATA dy = in0,
		 * w = in1; BWD_WEIGHTS dy = in1, dw = out0 */
		const struct kiln_tensor_desc *y = op->type == KILN_OP_CONV ? &op->out[0]
					       : op->type == KILN_OP_CONV_BWD_DATA ? &op->in[0]
										   : &op->in[1];
		const struct kiln_tensor_desc *w =
			op->type == KILN_OP_CONV_BWD_WEIGHTS ? &op->out[0] : &op->in[1];
		const int64_t o = w->ndim > 0 ? w->dims[0] : 0;
		return o > 0 ? 2.0 * (double)common_numel(y) * (double)(common_numel(w) / o) : 0;
	}
	default:
		return 0;
	}
}

int cpu_op_one_thread(const struct kiln_op *op)
{
	const double f = op_flop(op);
	return f > 0 && f < CPU_ONE_THREAD_FLOP;
}

/* ---- convolution weight gradients in blocks of the minibatch ------------- */

int cpu_conv_wsplit(const struct kiln_op *op, int threads)
{
	const char *hook = getenv("KILN_CPU_CONV_SPLIT");
	const int dt = op->in[0].dtype;
	if (threads < 2 || op->type != KILN_OP_CONV_BWD_WEIGHTS || (dt != KILN_F32 && dt != KILN_BF16) ||
	    op->in[0].ndim != 4 || cpu_op_one_thread(op) || (hook && !strcmp(hook, "0")))
		return 0;
	const int64_t N = op->in[0].dims[0];
	if (hook && *hook) {
		const long k = atol(hook);
		return k > 1 && k <= N ? (int)k : 0;
	}
	for (int k = CPU_WSPLIT_BLOCKS; k > 1; k--)
		if (N % k == 0)
			return k;
	/* no divisor: unequal blocks (the first N % K one sample larger) */
	return N / 2 < CPU_WSPLIT_BLOCKS ? (int)(N / 2) : CPU_WSPLIT_BLOCKS;
}

/* ---- GEMMs split into parts ------------------------------------------------ */

/* The shape rule: a part's length (rows, or columns when *cols is set
 * and columns are allowed) for a GEMM of CPU_SPLIT_FLOP or more, or 0. */
static int64_t split_rule(const struct kiln_op *op, int allow_cols, int *cols)
{
	const int64_t M = op->i[2], N = op->i[3];
	const double flop = 2.0 * (double)M * (double)N * (double)op->i[4];
	/* columns of op(B) and the product, about CPU_SPLIT_COLS a part (a
	 * multiple of 16, the vector); else rows of op(A) and the product,
	 * about CPU_SPLIT_ROWS (a multiple of 8, oneDNN's row block); at
	 * most CPU_SPLIT_PARTS parts.  Smaller parts run further from the
	 * core's peak (docs/PERFORMANCE.md, "A late thread"). */
	*cols = 0;
	if (flop < CPU_SPLIT_FLOP)
		return 0;
	/* a block of columns needs a helper buffer as large as the output */
	*cols = allow_cols && N >= 2 * CPU_SPLIT_COLS &&
		(double)M * (double)N * 4 <= CPU_SPLIT_COLS_BYTES;
	const int64_t all = *cols ? N : M, want = *cols ? CPU_SPLIT_COLS : CPU_SPLIT_ROWS,
		      align = *cols ? 16 : 8;
	if (all < 2 * want)
		return 0;
	int64_t parts = (all + want - 1) / want;
	if (parts > CPU_SPLIT_PARTS)
		parts = CPU_SPLIT_PARTS;
	int64_t len = (all + parts - 1) / parts;
	len = (len + align - 1) / align * align;
	return len < all ? len : 0;
}

int64_t cpu_gemm_split(const struct kiln_op *op, int threads, int *cols)
{
	const int64_t M = op->i[2], N = op->i[3];
	const char *hook = getenv("KILN_CPU_GEMM_SPLIT");
	*cols = 0;
	if (threads < 2 || op->type != KILN_OP_GEMM)
		return 0;
	/* not from preparation on unless asked for: on a quiet machine the
	 * split MLP trained at 83k samples/s against 131k unsplit, and
	 * kiln_infer's 2-thread MLP did not scale (4.0 against 2.3 ms a
	 * batch); docs/PERFORMANCE.md, "Quiet window after the merge of
	 * session 8").  "busy" splits only while the team is shrunk
	 * (cpu_gemm_split_busy). */
	if (!hook || !*hook || !strcmp(hook, "0"))
		return 0;
	if (strcmp(hook, "auto")) { /* the test hook: rows:R or cols:C */
		long long len = 0;
		if (sscanf(hook, "cols:%lld", &len) == 1)
			*cols = 1;
		else if (sscanf(hook, "rows:%lld", &len) != 1)
			len = 0;
		return len > 0 && len < (*cols ? N : M) ? len : 0;
	}
	return split_rule(op, 1, cols);
}

int64_t cpu_gemm_split_busy(const struct kiln_op *op, int threads)
{
	const char *hook = getenv("KILN_CPU_GEMM_SPLIT");
	int cols;
	/* only when asked for: with a core busy, the MLP's steady rate was
	 * 54-73k samples/s split against 70-78k on one thread, for 40% more
	 * CPU time (docs/PERFORMANCE.md, "The GEMM split chosen at run
	 * time") */
	if (threads < 2 || op->type != KILN_OP_GEMM || !hook || strcmp(hook, "busy"))
		return 0;
	return split_rule(op, 0, &cols);
}

/* ---- reading the quota -------------------------------------------------------- */

/* The first line of a file into buf; -1 when it cannot be read. */
static int read_line(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	int ok = fgets(buf, (int)n, f) != NULL;
	fclose(f);
	return ok ? 0 : -1;
}

int64_t cpu_throttled_parse(const char *text)
{
	for (const char *l = text; l && *l;) {
		long long v;
		if (sscanf(l, "throttled_time %lld", &v) == 1)
			return v;
		if (sscanf(l, "throttled_usec %lld", &v) == 1)
			return v * 1000;
		l = strchr(l, '\n');
		l = l ? l + 1 : NULL;
	}
	return -1;
}

#define DIR_MAX 4096 /* a cgroup directory's path */

/* The quota in the cgroup directory dir (v2 or v1 files); 0 for none. */
static double quota_at(const char *dir, int v2)
{
	char p[DIR_MAX + 32], a[64], b[64];
	if (v2) {
		snprintf(p, sizeof p, "%s/cpu.max", dir);
		return read_line(p, a, sizeof a) ? 0 : cpu_quota_v2(a);
	}
	snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", dir);
	if (read_line(p, a, sizeof a))
		return 0;
	snprintf(p, sizeof p, "%s/cpu.cfs_period_us", dir);
	return read_line(p, b, sizeof b) ? 0 : cpu_quota_v1(a, b);
}

/* The smallest quota from the cgroup `path` under mount point `root` up to
 * the mount's root (a parent's limit applies to its children); its
 * directory into at (size DIR_MAX). */
static double quota_up(const char *root, const char *path, int v2, char *at)
{
	char dir[DIR_MAX];
	double best = 0;
	int len = snprintf(dir, sizeof dir, "%s%s", root, path);
	if (len <= 0 || (size_t)len >= sizeof dir)
		return 0;
	size_t stop = strlen(root);
	for (;;) {
		double q = quota_at(dir, v2);
		if (q > 0 && (best == 0 || q < best)) {
			best = q;
			memcpy(at, dir, strlen(dir) + 1);
		}
		char *slash = strrchr(dir, '/');
		if (!slash || (size_t)(slash - dir) < stop)
			break;
		*slash = 0;
	}
	return best;
}

double cpu_quota_read(char *stat, size_t n)
{
	/* on the heap: 10 KiB here and quota_up's 8, inlined, on an
	 * application thread's stack (the frame cap, docs/design-notes.md) */
	struct { char text[4096], path[2048], at[DIR_MAX]; } *b = malloc(sizeof *b);
	stat[0] = 0;
	if (!b)
		return 0; /* as without /proc/self/cgroup: no quota known */
	char *const text = b->text, *const path = b->path, *const at = b->at;
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (!f) {
		free(b);
		return 0;
	}
	size_t got = fread(text, 1, sizeof b->text - 1, f);
	fclose(f);
	text[got] = 0;
	double best = 0;
	/* v2 at /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems;
	 * v1's cpu controller alone or joined with cpuacct */
	static const struct { const char *root; int v2; } cg[] = {
		{ "/sys/fs/cgroup", 1 },
		{ "/sys/fs/cgroup/unified", 1 },
		{ "/sys/fs/cgroup/cpu", 0 },
		{ "/sys/fs/cgroup/cpu,cpuacct", 0 },
	};
	for (size_t i = 0; i < sizeof cg / sizeof *cg; i++) {
		if (cpu_cgroup_path(text, cg[i].v2 ? NULL : "cpu", path, sizeof b->path))
			continue;
		double q = quota_up(cg[i].root, strcmp(path, "/") ? path : "", cg[i].v2, at);
		if (q > 0 && (best == 0 || q < best)) {
			best = q;
			snprintf(stat, n, "%s/cpu.stat", at);
		}
	}
	free(b);
	return best;
}

/* ---- the controller ------------------------------------------------------------- */

void cpu_team_init(struct cpu_team *t, int max)
{
	memset(t, 0, sizeof *t);
	t->max = t->n = t->dnn = max > 0 ? max : 1;
	t->probe_wait = CPU_TEAM_PROBE_MIN;
}

double cpu_team_others_min(int cpus)
{
	const double noise = CPU_TEAM_OTHERS_NOISE * sqrt(cpus > 1 ? (double)cpus : 1.0);
	return noise > CPU_TEAM_OTHERS ? noise : CPU_TEAM_OTHERS;
}

/* The size for the next interval (t->n), from this one's waiting. */
/* Did other processes take the CPUs a larger team would run on?  Their
 * CPUs (others_ns / wall_ns) above the mask's CPUs the team leaves free,
 * less CPU_TEAM_FREE; never when others_ns is not known. */
static int cpus_taken(const struct cpu_team *t, const struct cpu_team_sample *s)
{
	const int cpus = t->cpus > 0 ? t->cpus : t->max;
	return s->others_ns > 0 &&
	       (double)s->others_ns / (double)s->wall_ns > (double)(cpus - t->n) - CPU_TEAM_FREE;
}

/* The probe: one thread more, confirmed or undone by the next interval;
 * its trial (CPU_TEAM_PROBE_MIN intervals) gates the quick probe. */
static int step_up(struct cpu_team *t, int quick)
{
	t->n++;
	t->trial = CPU_TEAM_PROBE_MIN;
	t->quick = quick;
	t->probing = 1;
	t->calm = 0;
	t->crowd_down = 0;
	t->gone = 0;
	return t->n;
}

static int decide_size(struct cpu_team *t, const struct cpu_team_sample *s)
{
	if (s->wall_ns <= 0 || s->delay_ns < 0)
		return t->n; /* nothing measured */
	int64_t delay = s->delay_ns - (s->throttled_ns > 0 ? t->n * s->throttled_ns : 0);
	double load = delay > 0 ? (double)delay / (double)s->wall_ns : 0;
	/* the team waited while other processes took CPUs of ours: a
	 * neighbour, not the process's own start-up (threads.h) */
	const int crowded = load > CPU_TEAM_SHRINK && s->others_ns > 0 &&
			    (double)s->others_ns / (double)s->wall_ns >= cpu_team_others_min(t->cpus);
	const int trial = t->trial > 0; /* inside the last step up's trial */
	if (trial)
		t->trial--;
	if (t->intervals < CPU_TEAM_SETTLE) {
		t->intervals++; /* the context's start-up: judged only when crowded */
		if (!crowded)
			return t->n;
	}
	if (load > CPU_TEAM_SHRINK) {
		/* the step up brought the waiting back, or a quick probe's
		 * trial saw a step down: the probe failed */
		const int probe = t->probing || (trial && t->quick && t->n > 1 &&
						 (t->hot + 1 >= CPU_TEAM_SHRINK_HOT || crowded));
		if (probe)
			t->probe_wait = t->probe_wait * 2 > CPU_TEAM_PROBE_MAX ? CPU_TEAM_PROBE_MAX
									: t->probe_wait * 2;
		t->probing = 0;
		t->calm = 0;
		t->gone = 0;
		/* one busy interval alone is not contention yet: a crowded one
		 * or a probe's failure steps down at once, else
		 * CPU_TEAM_SHRINK_HOT in a row */
		if (++t->hot < CPU_TEAM_SHRINK_HOT && !probe && !crowded)
			return t->n;
		if (t->n > 1) {
			t->n--;
			/* the neighbour's leaving brings the probe, unless a
			 * probe failed or the last one had not held
			 * CPU_TEAM_PROBE_MIN intervals: the calm wait */
			t->crowd_down = crowded && t->probe_wait == CPU_TEAM_PROBE_MIN && !trial;
			t->quick = 0;
		}
		return t->n;
	}
	t->hot = 0;
	/* after a crowded step down: the others gone for GONE_RUN intervals
	 * (threads.h), calm or not.  cpus_taken can hold on a "gone" reading
	 * only from ~31 CPUs (below, GONE x others_min < 0.5 <= the free
	 * CPUs' threshold): a guard for large masks (test_quick_probe_edges) */
	if (t->crowd_down) {
		const int low = s->others_ns >= 0 && (double)s->others_ns / (double)s->wall_ns <
							     CPU_TEAM_GONE * cpu_team_others_min(t->cpus);
		t->gone = low ? t->gone + 1 : 0;
		if (t->gone >= CPU_TEAM_GONE_RUN && !cpus_taken(t, s))
			return step_up(t, 1);
	}
	if (load >= CPU_TEAM_CALM) {
		t->calm = 0; /* some waiting: hold */
		return t->n;
	}
	if (t->probing) { /* a calm interval after a step up: it held */
		t->probing = 0;
		t->probe_wait = CPU_TEAM_PROBE_MIN;
	}
	/* no step up while other processes hold the CPUs it would need:
	 * beside a busy loop the probe came back every 1-8 s and stepped
	 * down the next interval (session 45); the calm intervals still
	 * count, so it comes the interval the CPUs are free again */
	if (t->n < t->max && ++t->calm >= t->probe_wait && !cpus_taken(t, s))
		return step_up(t, 0);
	return t->n;
}

int cpu_team_decide(struct cpu_team *t, const struct cpu_team_sample *s)
{
	const int was = t->n;
	decide_size(t, s);
	t->held = t->n == was ? t->held + 1 : 0;
	/* oneDNN's plans follow a step down at once: a plan on the larger
	 * team is what waits at its barriers for a descheduled thread (with
	 * a core busy and libgomp spinning, the MLP's steps ran at a third
	 * of the 1-thread rate for the 3 intervals of the hold; a version is
	 * made once per plan and size, dnnteam.c).  A step up they follow
	 * once it held (a failed probe, one interval long, never moves them) */
	if (t->held >= CPU_TEAM_DNN_HOLD || t->n < t->dnn)
		t->dnn = t->n;
	return t->n;
}

/* ---- measuring ------------------------------------------------------------------ */

int64_t cpu_run_delay_ns(void)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	int64_t sum = 0;
	int any = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[64], line[128];
		snprintf(p, sizeof p, "/proc/self/task/%.20s/schedstat", e->d_name);
		long long run, wait;
		if (read_line(p, line, sizeof line) || sscanf(line, "%lld %lld", &run, &wait) != 2)
			continue;
		sum += wait;
		any = 1;
	}
	closedir(d);
	return any ? sum : -1;
}

int64_t cpu_self_delay_ns(void)
{
	char line[128];
	long long run, wait;
	if (read_line("/proc/thread-self/schedstat", line, sizeof line) ||
	    sscanf(line, "%lld %lld", &run, &wait) != 2)
		return -1;
	return wait;
}

/* The "cpuC" line at l, complete up to end: its CPU into *c and busy
 * ticks into *busy; 0, or -1 for another line (the total's, one with too
 * few columns). */
static int stat_line(const char *l, int *c, int64_t *busy)
{
	long long v[8] = { 0 };
	/* (the total's line has no number after "cpu": %d would skip the
	 * blanks and read its user time) */
	if (l[3] < '0' || l[3] > '9' ||
	    sscanf(l, "cpu%d %lld %lld %lld %lld %lld %lld %lld %lld", c, &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]) < 8)
		return -1;
	*busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
	return 0;
}

/* Each "cpuC" line at the top of /proc/stat's text of a CPU c < n with
 * cpus[c] set, to fn (its CPU and busy ticks); the number of lines given. */
static int stat_each(const char *text, const unsigned char *cpus, int n,
		     void (*fn)(void *, int, int64_t), void *arg)
{
	int any = 0;
	/* "cpu  ..." (all CPUs), then "cpuC user nice system idle iowait
	 * irq softirq steal guest guest_nice", then intr, ctxt, ... */
	for (const char *l = text; l && !strncmp(l, "cpu", 3);) {
		const char *end = strchr(l, '\n');
		if (!end)
			break; /* cut short: a line may have lost its digits */
		int c;
		int64_t busy;
		if (!stat_line(l, &c, &busy) && c >= 0 && c < n && cpus[c]) {
			fn(arg, c, busy);
			any++;
		}
		l = end + 1;
	}
	return any;
}

static void add_busy(void *arg, int c, int64_t busy)
{
	(void)c;
	*(int64_t *)arg += busy;
}

int64_t cpu_stat_busy(const char *text, const unsigned char *cpus, int n)
{
	int64_t sum = 0;
	return stat_each(text, cpus, n, add_busy, &sum) ? sum : -1;
}

struct busy_delta {
	int64_t *prev, wall, sum;
	unsigned char seen[CPU_STAT_CPUS];
};

static void add_delta(void *arg, int c, int64_t busy)
{
	struct busy_delta *b = arg;
	if (b->prev[c] >= 0) {
		const int64_t d = busy - b->prev[c];
		b->sum += d < 0 ? 0 : d > b->wall ? b->wall : d;
	}
	b->prev[c] = busy;
	b->seen[c] = 1;
}

int64_t cpu_stat_busy_delta(const char *text, const unsigned char *cpus, int n, int64_t *prev,
			    int64_t wall_ticks)
{
	if (n > CPU_STAT_CPUS)
		n = CPU_STAT_CPUS;
	struct busy_delta b = { .prev = prev, .wall = wall_ticks };
	const int any = stat_each(text, cpus, n, add_delta, &b);
	for (int c = 0; c < n; c++)
		if (cpus[c] && !b.seen[c])
			prev[c] = -1; /* gone: its next reading starts afresh */
	return any ? b.sum : -1;
}

static int64_t clock_ns(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* The busy ticks of the live controller's CPUs since the last read, over
 * an interval of wall_ns (-1: unknown): one read of /proc/stat, its "cpu"
 * lines up to the mask's last CPU. */
static int64_t stat_busy_read(struct cpu_team_live *l, int64_t wall_ns)
{
	if (!l->stat_text || !l->busy_prev)
		return -1;
	FILE *f = fopen("/proc/stat", "re");
	if (!f)
		return -1;
	size_t got = fread(l->stat_text, 1, l->stat_size - 1, f);
	fclose(f);
	l->stat_text[got] = 0;
	/* a tick more than the wall: a tick begun before the interval */
	return cpu_stat_busy_delta(l->stat_text, l->cpus, CPU_STAT_CPUS, l->busy_prev,
				   wall_ns / l->tick_ns + 1);
}

/* The affinity mask into l->cpus and a buffer for /proc/stat's lines up
 * to its last CPU (none: others_ns unknown, the waiting alone steers). */
static void stat_open(struct cpu_team_live *l)
{
	cpu_set_t set;
	int last = -1;
	const long hz = sysconf(_SC_CLK_TCK);
	if (hz <= 0 || sched_getaffinity(0, sizeof set, &set))
		return;
	for (int c = 0; c < CPU_STAT_CPUS && c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set))
			l->cpus[c] = 1, last = c, l->team.cpus++;
	if (last < 0)
		return;
	l->tick_ns = 1000000000 / hz;
	l->stat_size = (size_t)(last + 3) * 256; /* the total's line, cpu0..last, a margin */
	l->stat_text = malloc(l->stat_size);
	l->busy_prev = malloc(CPU_STAT_CPUS * sizeof *l->busy_prev);
	if (!l->stat_text || !l->busy_prev)
		return;
	for (int c = 0; c < CPU_STAT_CPUS; c++)
		l->busy_prev[c] = -1;
	l->start_busy = stat_busy_read(l, 0) >= 0 ? 0 : -1;
	l->start_cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

/* The throttled time of the quota's cgroup (0 without one or unreadable). */
static int64_t throttled_ns(const char *stat)
{
	char text[1024];
	if (!stat[0])
		return 0;
	FILE *f = fopen(stat, "re");
	if (!f)
		return 0;
	size_t got = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[got] = 0;
	int64_t v = cpu_throttled_parse(text);
	return v > 0 ? v : 0;
}

void cpu_team_live_init(struct cpu_team_live *l, int threads, int adapt, int watch, int flip,
			const char *stat)
{
	memset(l, 0, sizeof *l);
	cpu_team_init(&l->team, threads);
	l->size = l->dnn_size = l->team.n;
	snprintf(l->stat, sizeof l->stat, "%s", stat ? stat : "");
	l->start_throttled = throttled_ns(l->stat);
	l->start_busy = -1;
	/* without schedstat there is nothing to steer by */
	const int steer = threads > 1 && (l->start_delay = cpu_run_delay_ns()) >= 0;
	l->adapt = adapt && steer;
	l->watch = !adapt && watch && steer; /* a fixed team: the hint (threads.h) */
	l->flip = l->adapt && flip > 0 ? flip : 0;
	if (steer && !l->flip)
		stat_open(l);
	l->start_ns = now_ns();
	pthread_mutex_init(&l->lock, NULL);
}

void cpu_team_live_destroy(struct cpu_team_live *l)
{
	free(l->stat_text);
	free(l->busy_prev);
	l->stat_text = NULL;
	l->busy_prev = NULL;
	pthread_mutex_destroy(&l->lock);
}

/* The interval ending at t (under lock): its sample into *s, and the next
 * one's starting readings. */
static void team_sample(struct cpu_team_live *l, int64_t t, struct cpu_team_sample *s)
{
	const int64_t delay = cpu_run_delay_ns(), thr = throttled_ns(l->stat);
	s->wall_ns = t - l->start_ns;
	const int64_t busy = l->start_busy >= 0 ? stat_busy_read(l, s->wall_ns) : -1;
	const int64_t cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
	/* a thread that exited took its delay with it: clamp */
	s->delay_ns = delay < l->start_delay ? 0 : delay - l->start_delay;
	s->throttled_ns = thr < l->start_throttled ? 0 : thr - l->start_throttled;
	s->others_ns = -1;
	if (busy >= 0) {
		const int64_t others = busy * l->tick_ns - (cpu - l->start_cpu);
		s->others_ns = others > 0 ? others : 0;
	}
	l->start_delay = delay;
	l->start_throttled = thr;
	l->start_cpu = cpu;
	l->intervals++;
}

/* The adaptive team's decision n applied (under lock), the change told in *news. */
static void team_apply(struct cpu_team_live *l, int n, struct cpu_team_news *news)
{
	if (__atomic_exchange_n(&l->dnn_size, l->team.dnn, __ATOMIC_RELAXED) != l->team.dnn ||
	    n != l->size)
		__atomic_add_fetch(&l->changes, 1, __ATOMIC_RELAXED);
	if (n != l->size) {
		news->from = l->size;
		__atomic_store_n(&l->size, n, __ATOMIC_RELAXED);
	}
}

void cpu_team_feed(struct cpu_team_live *l, const struct cpu_team_sample *s, int64_t interval,
		   struct cpu_team_news *news)
{
	if (!l->adapt && !__atomic_load_n(&l->watch, __ATOMIC_RELAXED))
		return; /* a fixed team not (or no longer) watched */
	const int n = cpu_team_decide(&l->team, s);
	news->interval = interval;
	news->load = s->wall_ns > 0 ? (double)s->delay_ns / (double)s->wall_ns : 0;
	news->others = s->others_ns >= 0 && s->wall_ns > 0
			       ? (double)s->others_ns / (double)s->wall_ns
			       : -1;
	if (l->adapt) {
		team_apply(l, n, news);
	} else if (n < l->team.max) { /* the fixed team: told once, its size kept */
		news->fixed_waits = 1;
		__atomic_store_n(&l->watch, 0, __ATOMIC_RELAXED);
	}
}

const char *cpu_team_hint_advice(int threads_set, int deterministic)
{
	if (!threads_set)
		return "Set [plugin.cpu] adaptive = 1 to let the team shrink while the CPUs are busy";
	if (deterministic) /* deterministic = 1 needs a fixed [run] threads */
		return "Set [run] threads to fewer threads (1 waits for no other) while the CPUs are "
		       "busy";
	return "Leave [run] threads unset (0) to let the team shrink while the CPUs are busy, or "
	       "set it to 1";
}

int cpu_team_tick(struct cpu_team_live *l, struct cpu_team_news *news)
{
	memset(news, 0, sizeof *news);
	if (l->flip) { /* the test hook: both teams swap every `flip` ops */
		const int64_t k = __atomic_fetch_add(&l->ticks, 1, __ATOMIC_RELAXED);
		const int n = (k / l->flip) % 2 ? 1 : l->team.max;
		const int dnn = (k / l->flip) % 3 ? n : l->team.max;
		const int was = __atomic_exchange_n(&l->size, n, __ATOMIC_RELAXED); /* cpu_team_busy */
		if (__atomic_exchange_n(&l->dnn_size, dnn, __ATOMIC_RELAXED) != dnn || was != n)
			__atomic_add_fetch(&l->changes, 1, __ATOMIC_RELAXED);
		return n;
	}
	if (!l->adapt && !__atomic_load_n(&l->watch, __ATOMIC_RELAXED))
		return l->size;
	int64_t t = now_ns();
	if (t - __atomic_load_n(&l->start_ns, __ATOMIC_RELAXED) < CPU_TEAM_INTERVAL_NS ||
	    pthread_mutex_trylock(&l->lock))
		return __atomic_load_n(&l->size, __ATOMIC_RELAXED);
	if (t - l->start_ns >= CPU_TEAM_INTERVAL_NS &&
	    (l->adapt || l->watch)) { /* not taken by another thread meanwhile */
		struct cpu_team_sample s;
		team_sample(l, t, &s);
		cpu_team_feed(l, &s, l->intervals, news);
		__atomic_store_n(&l->start_ns, now_ns(), __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&l->lock);
	return __atomic_load_n(&l->size, __ATOMIC_RELAXED);
}
