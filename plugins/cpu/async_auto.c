/* plugins/cpu/async_auto.c - [plugin.cpu] async = auto: whether a
 * context's streams get worker threads (async) or run their work on the
 * issuing thread (sync): the choice at open, the rule a data-parallel
 * rank applies when `kiln train` tells it the workload, the probe of the
 * run-queue wait the rule and the tuner read, and the watch that turns a
 * sync rank async when a neighbour starts taking its CPU.
 */
#include "cpu.h"
#include "../common/c_locale.h" /* common_strtod, common_snprintf_c */

#include <pthread.h> /* pthread_self, pthread_equal */
#include <stdio.h>   /* snprintf */
#include <stdlib.h>  /* getenv */
#include <string.h>  /* memset, strcmp */
#include <time.h>    /* clock_gettime */

/* [plugin.cpu] async: 0 or 1 as set; `auto` (the default; unset, as a
 * config without the plugin's table reads it) on where there is something
 * to overlap: the allreduce with the backward (several ranks) or pipeline
 * stages on contexts of their own (peers), off for one process.  On a
 * data-parallel rank (*rule = 1) `kiln train` then tells the workload
 * (cpu_workload), and the rule there decides. */
kiln_status cpu_async_choice(const struct kiln_host *host, const struct kiln_config *cfg,
			     const struct kiln_device_options *opts, int *async, int *rule)
{
	const char *v = host->config_get(cfg, "plugin.cpu", "async");
	*rule = 0;
	if (v && strcmp(v, "auto"))
		return host->config_get_bool(cfg, "plugin.cpu", "async", async);
	const int ranks = opts->version >= 2 && opts->ranks > 1;
	const int peers = opts->version >= 3 && opts->peers > 1;
	*async = ranks || peers;
	*rule = ranks && !peers;
	return KILN_OK;
}

/* async = auto's rule for a data-parallel rank (docs/distributed.md, item
 * 6; docs/PERFORMANCE.md, "Session 13: async auto rule", "Session 14:
 * async rule, contention now").  The overlap hides at most the allreduce
 * behind the backward, and costs each step a worker thread's hand-offs
 * and a thread beside the team: it pays where the step is long and its
 * gradients many (the fp32 CNN of bench/: 3.3 M gradients, 13 MiB, 1.8
 * GFLOP of forward a rank's step: +3% quietly), not where they are few
 * and the step short (the MLP: 0.54 M, 2.1 MiB, 69 MFLOP: -10%).  Under
 * contention it paid for both, 1.14-1.53x, and sync there can collapse
 * (the MLP 8-11x slower under a busy loop, every allreduce waiting for
 * both ranks to hold a core at once), so a rank that waits for a CPU now
 * is async whatever the model.  "Now", not the load average: that
 * remembers the last minute, and on 2 CPUs a user's previous run (a
 * benchmark's previous row) held it above half the CPUs, so a quiet
 * machine read busy (the quiet window after session 13: the DDP MLP
 * 139,169 auto against 150,653 sync).  The probe (cpu_probe_wait) spins
 * the issuing thread for CPU_PROBE_NS and reads its run-queue wait, the
 * watch's measure (below) with the watch's threshold. */
#define CPU_AUTO_GRAD_BYTES (4 << 20)
#define CPU_AUTO_FWD_FLOPS 256e6
#define CPU_PROBE_NS 40000000LL

static int64_t watch_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void cpu_wait_begin(struct cpu_wait_mark *m)
{
	m->all = 0;
	m->delay_ns = cpu_self_delay_ns();
	m->t_ns = watch_now_ns();
}

void cpu_wait_begin_all(struct cpu_wait_mark *m)
{
	m->all = 1;
	m->delay_ns = cpu_run_delay_ns();
	m->t_ns = watch_now_ns();
}

double cpu_wait_end(const struct cpu_wait_mark *m)
{
	const int64_t d1 = m->all ? cpu_run_delay_ns() : cpu_self_delay_ns(), t = watch_now_ns();
	if (m->delay_ns < 0 || d1 < 0)
		return -1;
	/* schedstat's counter only grows (a thread that exited takes its
	 * own sum with it): clamp */
	return d1 < m->delay_ns || t <= m->t_ns ? 0 : (double)(d1 - m->delay_ns) / (double)(t - m->t_ns);
}

/* Spinning, the thread wants a CPU all along, so its wait is what a step
 * would wait now. */
double cpu_probe_wait(void)
{
	const char *hook = getenv("KILN_CPU_PROBEWAIT");
	if (hook && *hook)
		return common_strtod(hook, NULL);
	struct cpu_wait_mark m;
	cpu_wait_begin(&m);
	if (m.delay_ns < 0)
		return -1;
	while (watch_now_ns() - m.t_ns < CPU_PROBE_NS)
		;
	return cpu_wait_end(&m);
}

/* 1 async, 0 sync; why (n bytes) says from what.  The model first: a big
 * one is async without a probe. */
static int cpu_async_rule(const struct kiln_workload *w, char *why, size_t n)
{
	const int big = w->grad_bytes >= CPU_AUTO_GRAD_BYTES && w->fwd_flops >= CPU_AUTO_FWD_FLOPS;
	const int len = common_snprintf_c(why, n, "%.1f MiB of gradients, %.0f MFLOP forward a step (%s 4 MiB and 256 MFLOP)",
				 (double)w->grad_bytes / 1048576.0, w->fwd_flops / 1e6,
				 big ? "both at least" : "not both");
	if (big || len < 0 || (size_t)len >= n)
		return big;
	const double wait = cpu_probe_wait();
	const int busy = wait > CPU_WAIT_BUSY;
	if (wait < 0)
		snprintf(why + len, n - (size_t)len, ", no schedstat to probe: quiet");
	else
		common_snprintf_c(why + len, n - (size_t)len, ", waited %.2f s a second for a CPU over %lld ms: %s",
			 wait, (long long)(CPU_PROBE_NS / 1000000), busy ? "busy" : "quiet");
	return busy;
}

/* ---- async = auto's watch: sync until the rank's issuing thread waits for a CPU ---- */

/* The rule's probe is taken once, at plan time: a neighbour that starts
 * later is not in it, and a rank the rule made sync then collapses (the
 * MLP 8-11x slower under a busy loop; docs/PERFORMANCE.md, "Session 13:
 * async follows contention").  So a sync rank watches what that costs it:
 * the run-queue wait of the thread that issues its work and, sync, runs
 * it (schedstat, cpu_self_delay_ns), in seconds a second of wall time,
 * over intervals of CPU_WATCH_INTERVAL_NS.  That thread alone: it is the
 * step's critical path, and the process's other threads (loader workers,
 * a communicator's) may wait for a CPU behind it without the step being
 * slower for it.
 * CPU_WATCH_HOT intervals in a row above CPU_WAIT_BUSY turn its streams
 * async for the rest of the run (one way: a sync step that has the cores
 * is 8-10% faster, an async one under a neighbour 8-11x, so the watch
 * does not gamble on the neighbour being gone).  It runs on the thread
 * that told the workload, which issues every op of a data-parallel rank,
 * at an event record: a sync stream never holds queued work and every
 * event is complete, so the streams turn async in place between any two
 * of that thread's calls (cpu_streams_set_async). */
#define CPU_WATCH_INTERVAL_NS 250000000LL
#define CPU_WATCH_HOT 2

/* Starts watching (the rule chose sync); without schedstat and without the
 * hook there is nothing to watch. */
static void watch_start(struct cpu_ctx *c)
{
	struct cpu_async_watch *w = &c->watch;
	const char *hook = getenv("KILN_CPU_RUNWAIT");
	memset(w, 0, sizeof *w);
	w->fake = hook && *hook ? common_strtod(hook, NULL) : -1;
	w->start_delay = cpu_self_delay_ns();
	if (w->fake < 0 && w->start_delay < 0) {
		c->host->log(KILN_LOG_DEBUG, "cpu", "async = auto: no schedstat, sync for the run");
		return;
	}
	w->owner = pthread_self();
	w->start_ns = w->t0_ns = watch_now_ns();
	w->on = 1;
}

/* The interval's waiting, in seconds a second (KILN_CPU_RUNWAIT: that);
 * starts the next interval.  < 0: not measured. */
static double watch_sample(struct cpu_async_watch *w, int64_t now)
{
	int64_t delay = cpu_self_delay_ns();
	/* schedstat's counter only grows; clamp all the same */
	double v = delay < 0 ? -1
		   : delay < w->start_delay ? 0
					     : (double)(delay - w->start_delay) / (double)(now - w->start_ns);
	w->start_delay = delay;
	w->start_ns = now;
	return w->fake >= 0 ? w->fake : v;
}

void cpu_async_watch(struct cpu_ctx *c)
{
	struct cpu_async_watch *w = &c->watch;
	const int64_t now = watch_now_ns();
	if (now - w->start_ns < CPU_WATCH_INTERVAL_NS || !pthread_equal(pthread_self(), w->owner))
		return;
	const double wait = watch_sample(w, now);
	w->hot = wait > CPU_WAIT_BUSY ? w->hot + 1 : 0;
	c->host->log(KILN_LOG_DEBUG, "cpu", "async = auto: the issuing thread waited %.3f s a second for a CPU (%d busy in a row)",
		     wait, w->hot);
	if (w->hot < CPU_WATCH_HOT)
		return;
	w->on = 0;
	if (cpu_streams_set_async(c, 1)) { /* stays sync, whole: say so, go on */
		c->host->log(KILN_LOG_WARN, "cpu", "async = auto: streams stay sync: %s",
			     c->host->last_error());
		return;
	}
	c->host->log(KILN_LOG_INFO, "cpu",
		     "async = auto: sync -> async streams %.1f s into the run (the issuing thread waited %.2f s a second for a CPU, %d intervals of %lld ms in a row: busy)",
		     (double)(now - w->t0_ns) / 1e9, wait, CPU_WATCH_HOT,
		     (long long)(CPU_WATCH_INTERVAL_NS / 1000000));
}

/* KILN_PROC_WORKLOAD: async = auto on a data-parallel rank follows
 * cpu_async_rule, and a sync rank then watches for contention. */
kiln_status cpu_workload(void *ctx, const struct kiln_workload *w)
{
	struct cpu_ctx *c = ctx;
	if (!w || w->version < 1)
		return c->host->error(KILN_EINVAL, "cpu: workload: %s", w ? "version 0" : "NULL");
	if (!c->async_auto || c->graph || w->ranks <= 1)
		return KILN_OK;
	char why[240];
	int on = cpu_async_rule(w, why, sizeof why);
	kiln_status st = cpu_streams_set_async(c, on);
	if (st)
		return st;
	c->host->log(KILN_LOG_INFO, "cpu", "async = auto: %s streams (%s)", on ? "async" : "sync", why);
	c->watch.on = 0; /* told again (tests/check_cpu_async): the latest rule holds */
	if (!on)
		watch_start(c);
	return KILN_OK;
}

/* KILN_PROC_RUN_WAIT: the process's threads' run-queue wait so far
 * (cpu_run_delay_ns, the adaptive team's measure); KILN_CPU_RUNWAIT=r
 * (the tests' hook, as the watch's): r seconds a second since the first
 * call, so that two readings give r whatever the interval. */
int64_t cpu_run_wait(void *ctx)
{
	static int64_t origin_ns; /* (the hook's: one per process) */
	const char *hook = getenv("KILN_CPU_RUNWAIT");
	(void)ctx;
	if (!hook || !*hook)
		return cpu_run_delay_ns();
	const int64_t now = watch_now_ns();
	int64_t t0 = 0;
	if (!__atomic_compare_exchange_n(&origin_ns, &t0, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return (int64_t)(common_strtod(hook, NULL) * (double)(now - t0));
	return 0;
}
