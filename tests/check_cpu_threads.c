/* tests/check_cpu_threads.c - the CPU device's team size
 * (plugins/cpu/threads.c, linked into this program): the cgroup quota
 * parsers, the starting team from affinity and quota, and the adaptive
 * controller's decisions on synthetic intervals (no clock, no /proc), and
 * which GEMMs and convolutions run on one thread on any team.
 */
#include "plugins/cpu/threads.h"

#include <kiln/plugin.h>

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check_main.h"

#define MS 1000000LL

/* One interval of 100 ms in which `waiting` threads on average had no CPU
 * (what other processes took not known: the waiting alone steers). */
static int feed(struct cpu_team *t, double waiting)
{
	struct cpu_team_sample s = { 100 * MS, (int64_t)(waiting * 100 * MS), 0, -1 };
	return cpu_team_decide(t, &s);
}

/* The same while other processes took `others` CPUs of the process's. */
static int feed_beside(struct cpu_team *t, double waiting, double others)
{
	struct cpu_team_sample s = { 100 * MS, (int64_t)(waiting * 100 * MS), 0,
				     (int64_t)(others * 100 * MS) };
	return cpu_team_decide(t, &s);
}

/* A team of `max` past its start-up: the first CPU_TEAM_SETTLE intervals,
 * busy ones here, leave it as it opened. */
static void team_open(struct cpu_team *t, int max)
{
	cpu_team_init(t, max);
	for (int i = 0; i < CPU_TEAM_SETTLE; i++)
		ck_assert_int_eq(feed(t, 2.0), t->max);
	ck_assert_int_eq(t->hot, 0);
}

START_TEST(test_quota_v2)
{
	ck_assert_double_eq(cpu_quota_v2("150000 100000\n"), 1.5);
	ck_assert_double_eq(cpu_quota_v2("50000 100000"), 0.5);
	ck_assert_double_eq(cpu_quota_v2("max 100000\n"), 0);
	ck_assert_double_eq(cpu_quota_v2(""), 0);
	ck_assert_double_eq(cpu_quota_v2("100000"), 0);
	ck_assert_double_eq(cpu_quota_v2("0 100000"), 0);
	ck_assert_double_eq(cpu_quota_v2(NULL), 0);
}
END_TEST

START_TEST(test_quota_v1)
{
	ck_assert_double_eq(cpu_quota_v1("150000\n", "100000\n"), 1.5);
	ck_assert_double_eq(cpu_quota_v1("-1\n", "100000\n"), 0);
	ck_assert_double_eq(cpu_quota_v1("200000", "50000"), 4);
	ck_assert_double_eq(cpu_quota_v1("x", "100000"), 0);
	ck_assert_double_eq(cpu_quota_v1("100000", NULL), 0);
}
END_TEST

START_TEST(test_throttled)
{
	ck_assert_int_eq(cpu_throttled_parse("nr_periods 9\nnr_throttled 3\nthrottled_time 1234567\n"),
			 1234567);
	ck_assert_int_eq(cpu_throttled_parse("usage_usec 5\nnr_throttled 2\nthrottled_usec 250\n"),
			 250000);
	ck_assert_int_eq(cpu_throttled_parse("usage_usec 5\nuser_usec 4\n"), -1);
	ck_assert_int_eq(cpu_throttled_parse(""), -1);
}
END_TEST

START_TEST(test_cgroup_path)
{
	char p[64];
	const char *hybrid = "9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/job/7\n0::/user.slice/x\n";
	ck_assert_int_eq(cpu_cgroup_path(hybrid, NULL, p, sizeof p), 0);
	ck_assert_str_eq(p, "/user.slice/x");
	ck_assert_int_eq(cpu_cgroup_path(hybrid, "cpu", p, sizeof p), 0);
	ck_assert_str_eq(p, "/job/7");
	/* "cpuacct" and "cpuset" are not "cpu" */
	const char *v1 = "3:cpuset:/s\n2:cpuacct:/a\n1:cpu:/c";
	ck_assert_int_eq(cpu_cgroup_path(v1, "cpu", p, sizeof p), 0);
	ck_assert_str_eq(p, "/c");
	ck_assert_int_eq(cpu_cgroup_path(v1, NULL, p, sizeof p), -1);
	/* a v1 id 10 with an empty list is not v2's "0::" */
	ck_assert_int_eq(cpu_cgroup_path("10::/x\n", NULL, p, sizeof p), -1);
	ck_assert_int_eq(cpu_cgroup_path("0::/\n", NULL, p, sizeof p), 0);
	ck_assert_str_eq(p, "/");
	ck_assert_int_eq(cpu_cgroup_path("0::/a/long/path\n", NULL, p, 8), -1);
	ck_assert_int_eq(cpu_cgroup_path("", NULL, p, sizeof p), -1);
	/* the memory controller's line (cpu.c's cgroup_room reads it first,
	 * then v2's), by the same rule: "memory" itself, not a longer name */
	ck_assert_int_eq(cpu_cgroup_path(hybrid, "memory", p, sizeof p), 0);
	ck_assert_str_eq(p, "/a/b");
	ck_assert_int_eq(cpu_cgroup_path("5:memory,hugetlb:/m\n0::/u\n", "memory", p, sizeof p), 0);
	ck_assert_str_eq(p, "/m");
	ck_assert_int_eq(cpu_cgroup_path("6:memory_x:/n\n0::/u\n", "memory", p, sizeof p), -1);
	ck_assert_int_eq(cpu_cgroup_path("0::/u\n", "memory", p, sizeof p), -1);
}
END_TEST

START_TEST(test_threads_for)
{
	ck_assert_int_eq(cpu_threads_for(2, 0), 2);
	ck_assert_int_eq(cpu_threads_for(2, 1.5), 2);
	ck_assert_int_eq(cpu_threads_for(2, 1.4), 1);
	ck_assert_int_eq(cpu_threads_for(2, 1.0), 1);
	ck_assert_int_eq(cpu_threads_for(2, 0.2), 1);
	ck_assert_int_eq(cpu_threads_for(8, 3.5), 4);
	ck_assert_int_eq(cpu_threads_for(4, 16), 4);
	ck_assert_int_eq(cpu_threads_for(0, 0), 1);
}
END_TEST

/* One busy competitor on two cores: 2 threads + it wait ~0.67 threads'
 * worth; one thread + it fit. */
START_TEST(test_shrinks_and_holds)
{
	struct cpu_team t;
	team_open(&t, 2);
	ck_assert_int_eq(feed(&t, 0.05), 2); /* quiet: nothing to do at the top */
	ck_assert_int_eq(feed(&t, 0.67), 2); /* one busy interval: not yet */
	ck_assert_int_eq(feed(&t, 0.67), 1);
	ck_assert_int_eq(feed(&t, 0.9), 1); /* never below one */
	/* between the thresholds: no change, and the calm count restarts */
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed(&t, 0.02), 1);
	ck_assert_int_eq(feed(&t, 0.2), 1);
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed(&t, 0.02), 1);
	ck_assert_int_eq(feed(&t, 0.02), 2); /* the probe */
	ck_assert_int_eq(t.probing, 1);
}
END_TEST

/* The start-up's intervals, however busy, and then one busy interval
 * alone (a burst of another process) leave the team as it is;
 * CPU_TEAM_SHRINK_HOT in a row step it down, and a calm or in-between
 * interval restarts the count.  Before session 44 the first reading above
 * CPU_TEAM_SHRINK stepped down: the MLP's start-up read 0.30-0.79 threads
 * waiting, quiet or not, and a run that stepped down there ran its whole
 * epoch on one thread (the probe waits 1 s). */
START_TEST(test_one_busy_interval_holds)
{
	struct cpu_team t;
	cpu_team_init(&t, 2);
	ck_assert_int_eq(CPU_TEAM_SETTLE, 1);
	ck_assert_int_eq(feed(&t, 0.79), 2); /* the start-up */
	ck_assert_int_eq(t.hot, 0);
	ck_assert_int_eq(feed(&t, 0.51), 2);
	ck_assert_int_eq(t.hot, 1);
	ck_assert_int_eq(feed(&t, 0.15), 2); /* between the thresholds */
	ck_assert_int_eq(t.hot, 0);
	ck_assert_int_eq(feed(&t, 0.45), 2);
	ck_assert_int_eq(feed(&t, 0.02), 2); /* calm */
	ck_assert_int_eq(feed(&t, 0.45), 2);
	ck_assert_int_eq(t.n, 2);
	ck_assert_int_eq(t.dnn, 2);
	ck_assert_int_eq(CPU_TEAM_SHRINK_HOT, 2); /* the second in a row: */
	ck_assert_int_eq(feed(&t, 0.45), 1);
	ck_assert_int_eq(t.dnn, 1);
	/* a probe back up that meets the waiting again steps down at once */
	for (int i = 0; i < CPU_TEAM_PROBE_MIN; i++)
		feed(&t, 0);
	ck_assert_int_eq(t.n, 2);
	ck_assert_int_eq(feed(&t, 0.45), 1);
}
END_TEST

/* Each failed probe doubles the calm wait before the next, up to the cap;
 * a probe that holds resets it. */
START_TEST(test_probe_backoff)
{
	struct cpu_team t;
	team_open(&t, 2);
	ck_assert_int_eq(feed(&t, 0.7), 2);
	ck_assert_int_eq(feed(&t, 0.7), 1);
	int wait = CPU_TEAM_PROBE_MIN;
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < wait - 1; i++)
			ck_assert_int_eq(feed(&t, 0), 1);
		ck_assert_int_eq(feed(&t, 0), 2);
		ck_assert_int_eq(feed(&t, 0.7), 1); /* still busy */
		wait = wait * 2 > CPU_TEAM_PROBE_MAX ? CPU_TEAM_PROBE_MAX : wait * 2;
		ck_assert_int_eq(t.probe_wait, wait);
	}
	ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MAX);
	for (int i = 0; i < CPU_TEAM_PROBE_MAX - 1; i++)
		ck_assert_int_eq(feed(&t, 0), 1);
	ck_assert_int_eq(feed(&t, 0), 2);
	ck_assert_int_eq(feed(&t, 0.01), 2); /* the competitor left */
	ck_assert_int_eq(t.probing, 0);
	ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MIN);
}
END_TEST

/* A team of 4 steps down one thread an interval and back up one a probe,
 * never above its opening size; nothing measured changes nothing. */
START_TEST(test_steps_and_bounds)
{
	struct cpu_team t;
	team_open(&t, 4);
	ck_assert_int_eq(feed(&t, 2.0), 4);
	ck_assert_int_eq(feed(&t, 2.0), 3);
	ck_assert_int_eq(feed(&t, 1.5), 2);
	ck_assert_int_eq(feed(&t, 0.5), 1);
	for (int up = 2; up <= 4; up++) {
		for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
			ck_assert_int_eq(feed(&t, 0), up - 1);
		ck_assert_int_eq(feed(&t, 0), up);
	}
	for (int i = 0; i < 3 * CPU_TEAM_PROBE_MAX; i++)
		ck_assert_int_eq(feed(&t, 0), 4);
	struct cpu_team_sample none = { 0, 5 * MS, 0, -1 }, unknown = { 100 * MS, -1, 0, -1 };
	ck_assert_int_eq(cpu_team_decide(&t, &none), 4);
	ck_assert_int_eq(cpu_team_decide(&t, &unknown), 4);
	cpu_team_init(&t, 0);
	ck_assert_int_eq(t.n, 1);
	ck_assert_int_eq(feed(&t, 0), 1);
}
END_TEST

/* A quota throttles the whole team at once: a team of 2 whose delay is
 * all throttling (2 x 40 ms in 100 ms) keeps its size; the same delay
 * without throttling, or more than the throttling explains, shrinks it. */
START_TEST(test_throttling_is_not_contention)
{
	struct cpu_team t;
	team_open(&t, 2);
	struct cpu_team_sample thr = { 100 * MS, 80 * MS, 40 * MS, -1 };
	ck_assert_int_eq(cpu_team_decide(&t, &thr), 2);
	ck_assert_int_eq(t.calm, 0); /* at the top: nothing to probe */
	/* other processes ran on the CPUs the throttled team left idle: the
	 * waiting is still the quota's */
	struct cpu_team_sample filled = { 100 * MS, 80 * MS, 40 * MS, 90 * MS };
	ck_assert_int_eq(cpu_team_decide(&t, &filled), 2);
	ck_assert_int_eq(cpu_team_decide(&t, &filled), 2);
	struct cpu_team_sample more = { 100 * MS, 130 * MS, 40 * MS, -1 }; /* 0.5 beyond */
	ck_assert_int_eq(cpu_team_decide(&t, &more), 2);
	ck_assert_int_eq(cpu_team_decide(&t, &more), 1);
	team_open(&t, 2);
	struct cpu_team_sample plain = { 100 * MS, 80 * MS, 0, -1 };
	ck_assert_int_eq(cpu_team_decide(&t, &plain), 2);
	ck_assert_int_eq(cpu_team_decide(&t, &plain), 1);
}
END_TEST

/* oneDNN's team follows a step down at once, and a step up once it has
 * held CPU_TEAM_DNN_HOLD intervals: a failed probe (one interval up)
 * never moves it. */
START_TEST(test_dnn_follows_held_size)
{
	struct cpu_team t;
	team_open(&t, 2);
	ck_assert_int_eq(t.dnn, 2);
	/* a step down: oneDNN follows at once (its plans on two threads are
	 * what waits for the descheduled one) */
	ck_assert_int_eq(feed(&t, 0.67), 2);
	ck_assert_int_eq(t.dnn, 2);
	ck_assert_int_eq(feed(&t, 0.67), 1);
	ck_assert_int_eq(t.dnn, 1);
	for (int i = 1; i <= CPU_TEAM_DNN_HOLD; i++) {
		ck_assert_int_eq(feed(&t, 0.5), 1);
		ck_assert_int_eq(t.dnn, 1);
	}
	/* a probe that brings the waiting back: oneDNN stays on one thread */
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed(&t, 0), 1);
	ck_assert_int_eq(feed(&t, 0), 2);
	ck_assert_int_eq(t.dnn, 1);
	ck_assert_int_eq(feed(&t, 0.7), 1);
	ck_assert_int_eq(t.dnn, 1);
	/* one that holds: oneDNN follows it back up */
	for (int i = 0; i < 2 * CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed(&t, 0), 1);
	ck_assert_int_eq(feed(&t, 0), 2);
	for (int i = 1; i < CPU_TEAM_DNN_HOLD; i++) {
		ck_assert_int_eq(feed(&t, 0), 2);
		ck_assert_int_eq(t.dnn, 1);
	}
	ck_assert_int_eq(feed(&t, 0), 2);
	ck_assert_int_eq(t.dnn, 2);
}
END_TEST

/* A busy loop beside the team (session 45's measurements: 0.44-0.97
 * threads waiting with the loop taking 0.6-1.0 CPUs) steps it down at the
 * context's first interval, start-up or not, and one thread an interval
 * on a larger team; the rule of session 44 waited for two busy intervals
 * after the first (the MLP's busy epoch ran 200 ms longer on two threads:
 * -9%).  A probe back up beside the loop fails at once, as before. */
START_TEST(test_crowded_steps_down_at_once)
{
	struct cpu_team t;
	cpu_team_init(&t, 2);
	if (cpu_team_others_min(1) > 1.95) {
		/* CPU_TEAM_OTHERS above these readings turns the crowded rule
		 * off: the start-up is not judged, then two busy intervals */
		ck_assert_int_eq(feed_beside(&t, 0.62, 0.91), 2);
		ck_assert_int_eq(feed_beside(&t, 0.62, 0.91), 2);
		ck_assert_int_eq(feed_beside(&t, 0.62, 0.91), 1);
		return;
	}
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.91), 1); /* the first interval */
	ck_assert_int_eq(t.dnn, 1);
	ck_assert_int_eq(feed_beside(&t, 0.01, 0.98), 1); /* one thread + the loop fit */
	/* no probe while the loop holds the other CPU (cpus_taken): 3 s */
	for (int i = 0; i < 3 * CPU_TEAM_PROBE_MIN; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.99), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 1.0 - CPU_TEAM_FREE + 0.05), 1);
	/* the neighbour leaves half a CPU free: the probe at once */
	ck_assert_int_eq(feed_beside(&t, 0.02, 1.0 - CPU_TEAM_FREE - 0.05), 2);
	ck_assert_int_eq(feed_beside(&t, 0.55, 0.70), 1);
	ck_assert_int_eq(t.probe_wait, 2 * CPU_TEAM_PROBE_MIN);
	/* a team of 2 of a 4-CPU mask: a third thread needs 1 CPU of the 2 */
	team_open(&t, 4);
	t.n = 2;
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 1.6), 2);
	ck_assert_int_eq(feed_beside(&t, 0.02, 1.6), 2);
	ck_assert_int_eq(feed_beside(&t, 0.02, 1.4), 3);
	/* a team of 4 beside two busy loops: a thread an interval */
	cpu_team_init(&t, 4);
	ck_assert_int_eq(feed_beside(&t, 1.4, 1.9), 3);
	ck_assert_int_eq(feed_beside(&t, 0.9, 1.9), 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 1.95), 2);
	/* past the start-up too: the first crowded interval, not the second */
	team_open(&t, 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.0), 2);
	ck_assert_int_eq(feed_beside(&t, 0.45, 0.8), 1);
}
END_TEST

/* What is not a neighbour holds the team as session 44's rule did: the
 * start-up's own waiting (0.30-0.79 threads, the other processes' CPU
 * time 0-0.1: /proc/stat's 10 ms ticks), a process busy in bursts (2 ms
 * of every 20 ms: 0.16-0.29 waiting, 0.1 CPUs, a burst up to 0.45), a
 * measurement of others that is unknown (-1: no /proc/stat), and others
 * below CPU_TEAM_OTHERS; waiting alone for CPU_TEAM_SHRINK_HOT intervals
 * in a row still steps down (a quota, the process's own threads). */
START_TEST(test_own_and_burst_waiting_holds)
{
	struct cpu_team t;
	cpu_team_init(&t, 2);
	ck_assert_int_eq(feed_beside(&t, 0.79, 0.08), 2); /* quiet start-up */
	ck_assert_int_eq(feed_beside(&t, 0.35, 0.0), 2);
	ck_assert_int_eq(feed_beside(&t, 0.21, 0.1), 2);
	for (int i = 0; i < 20; i++) { /* jitter, its bursts now and then */
		ck_assert_int_eq(feed_beside(&t, i % 5 ? 0.22 : 0.45, 0.11), 2);
	}
	ck_assert_int_eq(feed_beside(&t, 0.6, -1), 2); /* others unknown */
	ck_assert_int_eq(feed_beside(&t, 0.2, -1), 2);
	ck_assert_int_eq(feed_beside(&t, 0.6, CPU_TEAM_OTHERS - 0.05), 2);
	ck_assert_int_eq(feed_beside(&t, 0.1, 0.1), 2);
	/* the start-up crowded only by the process's own threads, at its
	 * first interval: not judged */
	cpu_team_init(&t, 2);
	ck_assert_int_eq(feed_beside(&t, 0.79, 0.3), 2);
	ck_assert_int_eq(t.hot, 0);
	/* the waiting alone, two intervals in a row */
	ck_assert_int_eq(feed_beside(&t, 0.5, 0.1), 2);
	ck_assert_int_eq(feed_beside(&t, 0.5, 0.1), 1);
	/* crowded but nobody waits (the team already fits): hold */
	cpu_team_init(&t, 2);
	ck_assert_int_eq(feed_beside(&t, 0.2, 0.9), 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.9), 2);
}
END_TEST

/* A neighbour that came and went in the context's first interval (a
 * process's start-up: python3's ~50 ms of a CPU read 0.5-0.9 CPUs beside
 * the MLP's start-up) steps the team down at once, and the probe comes
 * as soon as the others read below CPU_TEAM_GONE x cpu_team_others_min
 * for CPU_TEAM_GONE_RUN intervals in a row: back on two threads after
 * interval 3.  Session 45's rule waited CPU_TEAM_PROBE_MIN calm intervals
 * (1 s of the MLP's 1.3 s epoch on one thread).  A reading above the
 * threshold, or none, starts the run again. */
START_TEST(test_gone_neighbour_probes_soon)
{
	struct cpu_team t;
	ck_assert(cpu_team_others_min(2) < 0.7); /* a start-up's reading is crowded */
	ck_assert_int_eq(CPU_TEAM_GONE_RUN, 2);
	const double low = CPU_TEAM_GONE * cpu_team_others_min(2) - 0.05; /* 0.20 */
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.7), 1); /* interval 1: crowded */
	ck_assert_int_eq(feed_beside(&t, 0.05, low), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.0), 2); /* interval 3: the probe */
	ck_assert_int_eq(t.probing, 1);
	ck_assert_int_eq(t.crowd_down, 0);
	ck_assert_int_eq(t.dnn, 1); /* oneDNN follows once the size held */
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.1), 2); /* calm: it held */
	ck_assert_int_eq(t.probing, 0);
	ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MIN);
	/* the run of low readings restarts on a higher one or an unknown one */
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.7), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, low), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, CPU_TEAM_GONE * cpu_team_others_min(2) + 0.05), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, low), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, -1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, low), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, low), 2);
	/* a team of 4 stepped down twice by crowding probes one thread at a
	 * time: the first as soon as the others left, the next after the
	 * calm wait (the quick probe is the first after the step down) */
	cpu_team_init(&t, 4);
	t.cpus = 4;
	ck_assert_int_eq(feed_beside(&t, 1.4, 1.9), 3);
	ck_assert_int_eq(feed_beside(&t, 0.9, 1.9), 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 3);
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.1), 3);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.1), 4);
}
END_TEST

/* What does not bring the quick probe: a neighbour that stays (a busy
 * loop reads 0.85-1.0 CPUs beside one thread: cpus_taken and not gone,
 * so no probe at all, as in session 45), one whose readings alternate
 * around the threshold (a burst every other interval: never two low in a
 * row; the calm wait's probe comes as before), and a step down by the
 * waiting alone (the process's own threads, a quota: no neighbour to
 * leave), which keeps the calm wait. */
START_TEST(test_steady_neighbour_no_flap)
{
	struct cpu_team t;
	ck_assert(cpu_team_others_min(2) < 0.7);
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.0), 1);
	for (int i = 0; i < 5 * CPU_TEAM_PROBE_MIN; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, i % 3 ? 0.95 : 0.85), 1);
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.9), 1);
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, i % 2 ? 0.45 : 0.1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.45), 2); /* the calm wait's probe */
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.5, 0.1), 2); /* the start-up */
	ck_assert_int_eq(feed_beside(&t, 0.5, 0.1), 2);
	ck_assert_int_eq(feed_beside(&t, 0.5, 0.1), 1); /* waiting alone */
	ck_assert_int_eq(t.crowd_down, 0);
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.0), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.0), 2);
}
END_TEST

/* A quick probe that brings the waiting back steps down at once and
 * doubles the calm wait, as any failed probe: the next probe comes after
 * 2 x CPU_TEAM_PROBE_MIN calm intervals, not when the others read low
 * again; once a probe held CPU_TEAM_PROBE_MIN intervals, the next crowded
 * step down probes soon again. */
START_TEST(test_quick_probe_fails_backs_off)
{
	struct cpu_team t;
	ck_assert(cpu_team_others_min(2) < 0.7);
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.7), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 2);
	ck_assert_int_eq(feed_beside(&t, 0.6, 0.8), 1); /* the neighbour is back */
	ck_assert_int_eq(t.probe_wait, 2 * CPU_TEAM_PROBE_MIN);
	ck_assert_int_eq(t.crowd_down, 0);
	for (int i = 0; i < 2 * CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2);
	ck_assert_int_eq(feed_beside(&t, 0.6, 0.8), 1); /* failed again: 4 x */
	ck_assert_int_eq(t.probe_wait, 4 * CPU_TEAM_PROBE_MIN);
	for (int i = 0; i < 4 * CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2); /* held */
	ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MIN);
	/* a crowded step down inside the probe's first PROBE_MIN intervals
	 * brings no quick probe; once one held that long it does */
	ck_assert_int_eq(feed_beside(&t, 0.6, 0.8), 1);
	ck_assert_int_eq(t.crowd_down, 0);
	ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MIN); /* a calm wait's probe: no x 2 */
	for (int i = 0; i < CPU_TEAM_PROBE_MIN - 1; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2);
	for (int i = 0; i < CPU_TEAM_PROBE_MIN; i++)
		ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2);
	ck_assert_int_eq(feed_beside(&t, 0.6, 0.8), 1);
	ck_assert_int_eq(t.crowd_down, 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 1);
	ck_assert_int_eq(feed_beside(&t, 0.02, 0.05), 2);
}
END_TEST

/* A neighbour busy 0.9 CPU one interval in every 4: the quick probe comes
 * 2 intervals after the step down, and its step down an interval later is
 * its failure (inside its first CPU_TEAM_PROBE_MIN intervals): the calm
 * wait doubles and no quick probe follows until a probe held that long.
 * 40 intervals change the size at most 8 times (main's calm wait alone:
 * 7; a quick probe after every step down: 20, 1,1,2,2,...). */
START_TEST(test_periodic_neighbour_no_flap)
{
	struct cpu_team t;
	cpu_team_init(&t, 2);
	t.cpus = 2;
	int n = 2, changes = 0;
	for (int k = 0; k < 40; k++) {
		const int on = k % 4 == 0;
		const double waiting = n == 2 ? (on ? 0.6 : 0.02) : 0.03;
		const int m = feed_beside(&t, waiting, on ? 0.9 : 0.03);
		changes += m != n;
		n = m;
		if (k == 3) /* the quick probe came and held a calm interval */
			ck_assert_int_eq(t.probe_wait, CPU_TEAM_PROBE_MIN);
		if (k == 4) { /* back: its failure */
			ck_assert_int_eq(n, 1);
			ck_assert_int_eq(t.probe_wait, 2 * CPU_TEAM_PROBE_MIN);
			ck_assert_int_eq(t.crowd_down, 0);
		}
	}
	ck_assert_int_le(changes, 8);
	ck_assert_int_ge(changes, 4); /* the probes still come */
}
END_TEST

/* The quick probe's edges: it comes with some waiting (0.10-0.30: not
 * calm, not hot), a hot interval between two low readings starts the
 * run again, and on a mask large enough that the others' "gone" reading
 * (below 0.72 CPUs on 64) can still take the CPU a larger team needs
 * (cpus_taken: above 64 - 63 - 0.5), the probe waits for that too (a
 * guard that cannot hold below ~31 CPUs, where GONE x others_min is
 * under 0.5). */
START_TEST(test_quick_probe_edges)
{
	struct cpu_team t;
	ck_assert(CPU_TEAM_CALM < 0.2 && 0.2 < CPU_TEAM_SHRINK);
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.7), 1);
	ck_assert_int_eq(feed_beside(&t, 0.2, 0.1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.2, 0.1), 2); /* calm or not */
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 0.7), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.8, 0.1), 1); /* hot: the run restarts */
	ck_assert_int_eq(t.gone, 0);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 1);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.1), 2);
	ck_assert(CPU_TEAM_GONE * cpu_team_others_min(64) > 0.6);
	cpu_team_init(&t, 64);
	t.cpus = 64;
	ck_assert_int_eq(feed_beside(&t, 0.62, 2.0), 63);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.6), 63);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.6), 63); /* gone, but taken */
	ck_assert_int_eq(t.gone, 2);
	ck_assert_int_eq(feed_beside(&t, 0.05, 0.3), 64);
}
END_TEST

/* /proc/stat's per-CPU lines: user nice system idle iowait irq softirq
 * steal guest guest_nice; the busy ticks of the CPUs asked for. */
START_TEST(test_stat_busy)
{
	const char *text = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			   "cpu0 100 2 50 4000 20 1 2 10 5 0\n"
			   "cpu1 200 0 100 3000 10 1 1 0 0 0\n"
			   "cpu3 300 5 150 2000 20 2 3 20 0 0\n"
			   "intr 123456 1 2 3\n"
			   "ctxt 999\n"
			   "cpu9 1 1 1 1 1 1 1 1 0 0\n";
	unsigned char in[8] = { 0 };
	ck_assert_int_eq(cpu_stat_busy(text, in, 8), -1); /* none asked for */
	in[0] = 1;
	/* 100 + 2 + 50 + 1 + 2 + 10: idle, iowait and guest (within user) not */
	ck_assert_int_eq(cpu_stat_busy(text, in, 8), 165);
	in[1] = 1;
	ck_assert_int_eq(cpu_stat_busy(text, in, 8), 165 + 302);
	in[2] = 1; /* offline: no line */
	ck_assert_int_eq(cpu_stat_busy(text, in, 8), 165 + 302);
	in[0] = in[1] = in[2] = 0, in[3] = 1;
	ck_assert_int_eq(cpu_stat_busy(text, in, 8), 480);
	ck_assert_int_eq(cpu_stat_busy(text, in, 3), -1); /* CPU 3 beyond n */
	/* the total's line is not CPU 600 nor any other, and only the "cpu"
	 * lines at the top count (not cpu9 after intr): a set of all */
	unsigned char all[1024];
	memset(all, 1, sizeof all);
	ck_assert_int_eq(cpu_stat_busy(text, all, 1024), 165 + 302 + 480);
	/* a kernel without steal's column; a line cut short is not read */
	ck_assert_int_eq(cpu_stat_busy("cpu  1 1 1 1 1 1 1\ncpu0 10 1 5 90 3 2 1\n", all, 1024), 19);
	ck_assert_int_eq(cpu_stat_busy("cpu  1 1 1 1 1 1 1 1\ncpu0 10 1 5 90 3 2 1 4\ncpu1 10 1 5 9", all,
				       1024),
			 23);
	ck_assert_int_eq(cpu_stat_busy("cpu0 10 1 5\n", all, 1024), -1); /* too few columns */
	ck_assert_int_eq(cpu_stat_busy("", all, 1024), -1);
	ck_assert_int_eq(cpu_stat_busy("intr 1\ncpu0 10 1 5 90 3 2 1 4\n", all, 1024), -1);
}
END_TEST

/* Per-CPU deltas of /proc/stat's busy ticks: each clamped to [0, wall]
 * (a CPU is busy at most the interval: no tick-boundary spike, no
 * negative), a CPU whose line vanishes or appears (hotplug) counts 0 for
 * that interval, never its since-boot total. */
START_TEST(test_stat_busy_delta)
{
	int64_t prev[8];
	for (int c = 0; c < 8; c++)
		prev[c] = -1;
	unsigned char in[8] = { 1, 1, 0, 1 };
	const char *t0 = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			 "cpu0 100 2 50 4000 20 1 2 10 5 0\n"
			 "cpu1 200 0 100 3000 10 1 1 0 0 0\n"
			 "cpu2 900 0 100 3000 10 1 1 0 0 0\n"
			 "cpu3 300 5 150 2000 20 2 3 20 0 0\n"
			 "intr 1\n";
	ck_assert_int_eq(cpu_stat_busy_delta(t0, in, 8, prev, 10), 0); /* no previous reading */
	ck_assert_int_eq(prev[0], 165);
	ck_assert_int_eq(prev[2], -1); /* not in the set */
	/* cpu0 +4 (user 3, steal 1), cpu1 +30 clamped to the wall's 10,
	 * cpu3 -2 (a counter that went back) clamped to 0, cpu2 not asked */
	const char *t1 = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			 "cpu0 103 2 50 4000 20 1 2 11 5 0\n"
			 "cpu1 230 0 100 3000 10 1 1 0 0 0\n"
			 "cpu2 999 0 100 3000 10 1 1 0 0 0\n"
			 "cpu3 298 5 150 2000 20 2 3 20 0 0\n";
	ck_assert_int_eq(cpu_stat_busy_delta(t1, in, 8, prev, 10), 4 + 10 + 0);
	/* cpu1 goes offline: its line is gone, cpu0 +2 */
	const char *t2 = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			 "cpu0 105 2 50 4000 20 1 2 11 5 0\n"
			 "cpu3 298 5 150 2000 20 2 3 20 0 0\n";
	ck_assert_int_eq(cpu_stat_busy_delta(t2, in, 8, prev, 10), 2);
	ck_assert_int_eq(prev[1], -1);
	/* it comes back with a since-boot total far above: 0 this interval */
	const char *t3 = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			 "cpu0 106 2 50 4000 20 1 2 11 5 0\n"
			 "cpu1 90000 0 100 3000 10 1 1 0 0 0\n"
			 "cpu3 299 5 150 2000 20 2 3 20 0 0\n";
	ck_assert_int_eq(cpu_stat_busy_delta(t3, in, 8, prev, 1000000), 1 + 0 + 1);
	/* and counts from there on */
	const char *t4 = "cpu  600 7 300 9000 50 4 6 30 0 0\n"
			 "cpu0 106 2 50 4000 20 1 2 11 5 0\n"
			 "cpu1 90007 0 100 3000 10 1 1 0 0 0\n"
			 "cpu3 299 5 150 2000 20 2 3 20 0 0\n";
	ck_assert_int_eq(cpu_stat_busy_delta(t4, in, 8, prev, 10), 7);
	ck_assert_int_eq(cpu_stat_busy_delta("intr 1\n", in, 8, prev, 10), -1); /* none read */
	ck_assert_int_eq(prev[0], -1);
}
END_TEST

/* The others' threshold grows with the mask: /proc/stat's tick noise is
 * about 0.06 sqrt(K) CPUs an interval for K CPUs (threads.h), so on 64
 * CPUs a reading of 1.0 (one busy loop) is within 3 standard deviations
 * of the noise and is not crowded; on 2 CPUs it is (with the crowded
 * rule on: CPU_TEAM_OTHERS below 1). */
START_TEST(test_others_scale_with_mask)
{
	ck_assert(cpu_team_others_min(0) == cpu_team_others_min(1));
	ck_assert(cpu_team_others_min(2) >= CPU_TEAM_OTHERS);
	ck_assert(cpu_team_others_min(64) >= CPU_TEAM_OTHERS_NOISE * 8 - 1e-9);
	ck_assert(cpu_team_others_min(64) >= cpu_team_others_min(2));
	ck_assert(fabs(cpu_team_others_min(64) - 1.44) < 1e-9 || CPU_TEAM_OTHERS > 1.44);
	struct cpu_team t;
	cpu_team_init(&t, 2);
	t.cpus = 64;
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.0), 2); /* noise on 64 CPUs: start-up, held */
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.0), 2); /* the first busy interval */
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.0), 1); /* the second: waiting alone */
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.5), 1);
	cpu_team_init(&t, 2);
	t.cpus = 64;
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.5), CPU_TEAM_OTHERS <= 1.5 ? 1 : 2);
	cpu_team_init(&t, 2);
	t.cpus = 2;
	ck_assert_int_eq(feed_beside(&t, 0.62, 1.0), CPU_TEAM_OTHERS <= 1.0 ? 1 : 2);
}
END_TEST

/* The hint's advice names a key the user can change: with deterministic
 * = 1 (which needs a fixed [run] threads) never "unset". */
START_TEST(test_hint_advice)
{
	ck_assert_ptr_nonnull(strstr(cpu_team_hint_advice(1, 0), "Leave [run] threads unset (0)"));
	const char *det = cpu_team_hint_advice(1, 1);
	ck_assert_ptr_null(strstr(det, "unset"));
	ck_assert_ptr_null(strstr(det, "(0)"));
	ck_assert_ptr_nonnull(strstr(det, "[run] threads"));
	ck_assert_ptr_nonnull(strstr(det, "1"));
	ck_assert_ptr_nonnull(strstr(cpu_team_hint_advice(0, 0), "[plugin.cpu] adaptive = 1"));
	ck_assert_ptr_nonnull(strstr(cpu_team_hint_advice(0, 1), "[plugin.cpu] adaptive = 1"));
}
END_TEST

/* A watched fixed team fed samples (cpu_team_feed): the hint fires on the
 * interval the adaptive rule would have stepped down, once; the watch
 * ends; the team's size (kiln's and oneDNN's) never changes. */
static void fixed_feed(double waiting, double others, int want_first)
{
	struct cpu_team_live l;
	cpu_team_live_init(&l, 2, 0, 1, 0, "");
	l.watch = 1; /* as where schedstat is readable: the feed is pure */
	l.team.cpus = 2;
	int fired = 0, first = 0;
	for (int i = 1; i <= 30; i++) {
		struct cpu_team_sample s = { 100 * MS, (int64_t)(waiting * 100 * MS), 0,
					     (int64_t)(others * 100 * MS) };
		struct cpu_team_news news;
		memset(&news, 0, sizeof news);
		cpu_team_feed(&l, &s, i, &news);
		ck_assert_int_eq(news.from, 0);
		if (news.fixed_waits) {
			fired++;
			if (!first)
				first = i;
			ck_assert_int_eq(news.interval, i);
			ck_assert(fabs(news.load - waiting) < 1e-9);
		}
		ck_assert_int_eq(l.size, 2);
		ck_assert_int_eq(cpu_team_dnn(&l), 2);
		ck_assert_int_eq(cpu_team_busy(&l), 0);
		ck_assert_int_eq(cpu_team_changes(&l), 0);
	}
	ck_assert_int_eq(fired, want_first ? 1 : 0);
	ck_assert_int_eq(first, want_first);
	ck_assert_int_eq(l.watch, !want_first);
	cpu_team_live_destroy(&l);
}

START_TEST(test_fixed_team_hint)
{
	/* beside a busy loop: the first interval with the crowded rule on,
	 * else after the start-up and two busy intervals */
	fixed_feed(0.6, 1.0, cpu_team_others_min(2) <= 1.0 ? 1 : CPU_TEAM_SETTLE + CPU_TEAM_SHRINK_HOT);
	/* waiting alone: after the start-up and two busy intervals */
	fixed_feed(0.6, -1, CPU_TEAM_SETTLE + CPU_TEAM_SHRINK_HOT);
	fixed_feed(0.6, 0.1, CPU_TEAM_SETTLE + CPU_TEAM_SHRINK_HOT);
	/* quiet or jittered: never */
	fixed_feed(0.05, 0.0, 0);
	fixed_feed(0.22, 0.1, 0);
	/* an unwatched fixed team (a pipeline stage's) is never judged */
	struct cpu_team_live l;
	cpu_team_live_init(&l, 2, 0, 0, 0, "");
	ck_assert_int_eq(l.watch, 0);
	struct cpu_team_sample s = { 100 * MS, 100 * MS, 0, 100 * MS };
	for (int i = 1; i <= 5; i++) {
		struct cpu_team_news news;
		memset(&news, 0, sizeof news);
		cpu_team_feed(&l, &s, i, &news);
		ck_assert_int_eq(news.fixed_waits, 0);
	}
	ck_assert_int_eq(l.team.intervals, 0); /* not fed */
	cpu_team_live_destroy(&l);
}
END_TEST

/* A fixed team of 2 or more is watched for the hint (cpu.c logs it once
 * when the adaptive rule would have stepped down); an adaptive one adapts
 * instead, a team of one has nothing to wait for.  Where schedstat cannot
 * be read nothing is watched: that the rule says so is checked too. */
START_TEST(test_fixed_team_watched)
{
	const int steer = cpu_run_delay_ns() >= 0;
	struct cpu_team_live l;
	cpu_team_live_init(&l, 2, 0, 1, 0, "");
	ck_assert_int_eq(l.watch, steer);
	ck_assert_int_eq(l.adapt, 0);
	ck_assert_int_eq(cpu_team_busy(&l), 0);
	struct cpu_team_news news;
	ck_assert_int_eq(cpu_team_tick(&l, &news), 2);
	ck_assert_int_eq(news.from, 0);
	cpu_team_live_destroy(&l);
	cpu_team_live_init(&l, 2, 1, 1, 0, "");
	ck_assert_int_eq(l.watch, 0);
	ck_assert_int_eq(l.adapt, steer);
	cpu_team_live_destroy(&l);
	cpu_team_live_init(&l, 1, 0, 1, 0, "");
	ck_assert_int_eq(l.watch, 0);
	cpu_team_live_destroy(&l);
}
END_TEST

/* A 4-d f32 descriptor. */
static struct kiln_tensor_desc d4(int64_t a, int64_t b, int64_t c, int64_t d)
{
	return (struct kiln_tensor_desc){ .dtype = KILN_F32, .ndim = 4, .dims = { a, b, c, d } };
}

/* The small GEMMs and convolutions (oneDNN splits their sums differently
 * on 1 and 2 threads) run on one thread; the example models' large ones
 * keep the team; ops without a sum are never marked. */
START_TEST(test_one_thread_ops)
{
	struct kiln_op g = { .type = KILN_OP_GEMM };
	const int64_t gemms[][4] = { /* M N K, expected */
		{ 128, 10, 256, 1 },   /* the MLP's fc3 forward: 0.66 MFLOP */
		{ 16, 10, 784, 1 },    /* check_ckpt's 16x784 -> 10 */
		{ 784, 10, 16, 1 },    /* and its weight gradient */
		{ 128, 10, 1024, 1 },  /* the CNN's fc2 forward: 2.6 MFLOP */
		{ 128, 512, 784, 0 },  /* the MLP's fc1: 103 MFLOP */
		{ 128, 256, 512, 0 },  /* fc2: 34 MFLOP */
		{ 128, 128, 128, 0 },  /* exactly 2^22: not below the bound */
	};
	for (size_t i = 0; i < sizeof gemms / sizeof *gemms; i++) {
		g.i[2] = gemms[i][0], g.i[3] = gemms[i][1], g.i[4] = gemms[i][2];
		ck_assert_msg(cpu_op_one_thread(&g) == gemms[i][3], "GEMM %lld %lld %lld",
			      (long long)g.i[2], (long long)g.i[3], (long long)g.i[4]);
	}
	/* check_ckpt's first conv, 16 samples 1 -> 4 channels 3x3 at 28x28:
	 * 2 x 16*4*28*28 x 9 = 0.9 MFLOP in every direction */
	const struct kiln_tensor_desc x = d4(16, 1, 28, 28), w = d4(4, 1, 3, 3), y = d4(16, 4, 28, 28);
	struct kiln_op c = { .type = KILN_OP_CONV, .n_in = 2, .n_out = 1 };
	c.in[0] = x, c.in[1] = w, c.out[0] = y;
	ck_assert_int_eq(cpu_op_one_thread(&c), 1);
	c.type = KILN_OP_CONV_BWD_DATA, c.in[0] = y, c.in[1] = w, c.out[0] = x;
	ck_assert_int_eq(cpu_op_one_thread(&c), 1);
	c.type = KILN_OP_CONV_BWD_WEIGHTS, c.in[0] = x, c.in[1] = y, c.out[0] = w;
	ck_assert_int_eq(cpu_op_one_thread(&c), 1);
	/* the CNN's conv1 at batch 128, 1 -> 32 channels 5x5: 161 MFLOP */
	const struct kiln_tensor_desc X = d4(128, 1, 28, 28), W = d4(32, 1, 5, 5),
				      Y = d4(128, 32, 28, 28);
	c.type = KILN_OP_CONV_BWD_WEIGHTS, c.in[0] = X, c.in[1] = Y, c.out[0] = W;
	ck_assert_int_eq(cpu_op_one_thread(&c), 0);
	c.type = KILN_OP_CONV, c.in[0] = X, c.in[1] = W, c.out[0] = Y;
	ck_assert_int_eq(cpu_op_one_thread(&c), 0);
	/* no sum to split */
	struct kiln_op p = { .type = KILN_OP_POOL, .n_in = 1, .n_out = 1 };
	p.in[0] = x, p.out[0] = d4(16, 1, 14, 14);
	ck_assert_int_eq(cpu_op_one_thread(&p), 0);
}
END_TEST

/* Which GEMMs are split into parts and how (plugins/cpu/threads.c,
 * cpu_gemm_split): the MLP's large GEMMs by columns of about 128, a
 * narrow product by rows, small ones and a team of one not at all; the
 * parts never depend on the team's size. */
START_TEST(test_gemm_split)
{
	struct kiln_op g = { .type = KILN_OP_GEMM };
	const int64_t gemms[][6] = { /* tA M N K, expected length, columns */
		{ 0, 128, 512, 784, 128, 1 }, /* the MLP's fc1 forward: 4 parts */
		{ 0, 128, 256, 512, 128, 1 }, /* fc2: 2 parts */
		{ 1, 512, 784, 128, 112, 1 }, /* fc1's weight gradient: 7 x 112 */
		{ 0, 128, 512, 256, 128, 1 }, /* fc2's data gradient */
		{ 0, 2048, 100, 512, 128, 0 }, /* narrow: 16 parts of rows */
		{ 0, 256, 8192, 64, 512, 1 }, /* at most 16 parts */
		{ 0, 4096, 8192, 64, 256, 0 }, /* 128 MiB of output: rows */
		{ 0, 128, 10, 256, 0, 0 },    /* fc3: small */
		{ 0, 256, 200, 128, 0, 0 },   /* 13 MFLOP: below the bound */
		{ 0, 100, 200, 1000, 0, 0 },  /* too narrow and too short for 2 parts */
	};
	setenv("KILN_CPU_GEMM_SPLIT", "auto", 1); /* the shape rule */
	for (size_t i = 0; i < sizeof gemms / sizeof *gemms; i++) {
		g.i[0] = gemms[i][0], g.i[2] = gemms[i][1], g.i[3] = gemms[i][2], g.i[4] = gemms[i][3];
		for (int t = 2; t <= 8; t *= 2) {
			int cols = -1;
			const int64_t len = cpu_gemm_split(&g, t, &cols);
			ck_assert_msg(len == gemms[i][4] && (!len || cols == gemms[i][5]),
				      "GEMM %lld %lld %lld on %d threads: %lld %s", (long long)g.i[2],
				      (long long)g.i[3], (long long)g.i[4], t, (long long)len,
				      cols ? "columns" : "rows");
		}
		int cols;
		ck_assert_int_eq(cpu_gemm_split(&g, 1, &cols), 0);
	}
	/* the test hook */
	g.i[0] = 0, g.i[2] = 64, g.i[3] = 48, g.i[4] = 8;
	int cols;
	setenv("KILN_CPU_GEMM_SPLIT", "cols:16", 1);
	ck_assert_int_eq(cpu_gemm_split(&g, 2, &cols), 16);
	ck_assert_int_eq(cols, 1);
	setenv("KILN_CPU_GEMM_SPLIT", "rows:8", 1);
	ck_assert_int_eq(cpu_gemm_split(&g, 2, &cols), 8);
	ck_assert_int_eq(cols, 0);
	setenv("KILN_CPU_GEMM_SPLIT", "0", 1);
	ck_assert_int_eq(cpu_gemm_split(&g, 2, &cols), 0);
	/* off unless asked for: a 2 GFLOP GEMM is not split */
	unsetenv("KILN_CPU_GEMM_SPLIT");
	g.i[2] = g.i[3] = g.i[4] = 1024;
	ck_assert_int_eq(cpu_gemm_split(&g, 2, &cols), 0);
	setenv("KILN_CPU_GEMM_SPLIT", "auto", 1);
	ck_assert_int_gt(cpu_gemm_split(&g, 2, &cols), 0);
	unsetenv("KILN_CPU_GEMM_SPLIT");
}
END_TEST

/* The busy team's split (cpu_gemm_split_busy): with $KILN_CPU_GEMM_SPLIT
 * "busy", the shape rule in rows of about 64 only, for any GEMM the rule
 * splits, none on a team of one; none by default or with another value
 * (and "busy" is no split from preparation on); cpu_team_busy follows the
 * flip hook's team. */
START_TEST(test_gemm_split_busy)
{
	struct kiln_op g = { .type = KILN_OP_GEMM };
	const int64_t gemms[][5] = { /* tA M N K, expected rows */
		{ 0, 128, 512, 784, 64 },  /* the MLP's fc1 forward: 2 parts */
		{ 0, 128, 256, 512, 64 },  /* fc2 */
		{ 1, 512, 784, 128, 64 },  /* fc1's weight gradient: 8 parts */
		{ 1, 256, 512, 128, 64 },  /* fc2's: 4 */
		{ 0, 2048, 100, 512, 128 }, /* at most 16 parts */
		{ 0, 300, 200, 200, 64 },  /* 4 of 64 and 44 */
		{ 0, 100, 2000, 1000, 0 }, /* too short for 2 parts of rows */
		{ 0, 128, 10, 256, 0 },    /* fc3: small */
		{ 0, 256, 200, 128, 0 },   /* 13 MFLOP: below the bound */
	};
	setenv("KILN_CPU_GEMM_SPLIT", "busy", 1);
	for (size_t i = 0; i < sizeof gemms / sizeof *gemms; i++) {
		g.i[0] = gemms[i][0], g.i[2] = gemms[i][1], g.i[3] = gemms[i][2], g.i[4] = gemms[i][3];
		int cols;
		ck_assert_int_eq(cpu_gemm_split(&g, 2, &cols), 0);
		for (int t = 2; t <= 8; t *= 2)
			ck_assert_msg(cpu_gemm_split_busy(&g, t) == gemms[i][4],
				      "GEMM %lld %lld %lld on %d threads: %lld rows", (long long)g.i[2],
				      (long long)g.i[3], (long long)g.i[4], t,
				      (long long)cpu_gemm_split_busy(&g, t));
		ck_assert_int_eq(cpu_gemm_split_busy(&g, 1), 0);
	}
	g.type = KILN_OP_CONV;
	ck_assert_int_eq(cpu_gemm_split_busy(&g, 2), 0);
	g.type = KILN_OP_GEMM;
	g.i[0] = 0, g.i[2] = 128, g.i[3] = 512, g.i[4] = 784;
	const char *set[] = { "", "0", "auto", "rows:8" };
	for (int i = 0; i < 4; i++) {
		setenv("KILN_CPU_GEMM_SPLIT", set[i], 1);
		ck_assert_int_eq(cpu_gemm_split_busy(&g, 2), 0);
	}
	unsetenv("KILN_CPU_GEMM_SPLIT");
	ck_assert_int_eq(cpu_gemm_split_busy(&g, 2), 0);

	struct cpu_team_live l;
	cpu_team_live_init(&l, 2, 1, 1, 1, "");
	if (l.adapt) { /* schedstat readable: the flip swaps every op */
		for (int k = 0; k < 6; k++) {
			struct cpu_team_news news;
			const int n = cpu_team_tick(&l, &news);
			ck_assert_int_eq(n, k % 2 ? 1 : 2);
			ck_assert_int_eq(cpu_team_busy(&l), k % 2);
		}
	}
	cpu_team_live_destroy(&l);
	cpu_team_live_init(&l, 2, 0, 1, 0, ""); /* a team the user set is never busy */
	ck_assert_int_eq(cpu_team_busy(&l), 0);
	cpu_team_live_destroy(&l);
}
END_TEST

/* libgomp's spin (plugins/common/spin_rule.h, kiln's and these suites'):
 * none once the load average reaches the CPUs of the mask and as many
 * threads are runnable, else 100000. */
START_TEST(test_spin_rule)
{
	ck_assert_str_eq(common_spin_for(2.0, 2, 2), "0");
	ck_assert_str_eq(common_spin_for(15.3, 9, 2), "0");
	ck_assert_str_eq(common_spin_for(1.99, 5, 2), "100000");
	ck_assert_str_eq(common_spin_for(0.0, 1, 16), "100000");
	ck_assert_str_eq(common_spin_for(16.0, 16, 16), "0");
	/* back-to-back runs on a quiet machine: the average still high,
	 * nothing but this thread runnable */
	ck_assert_str_eq(common_spin_for(2.1, 1, 2), "100000");
	ck_assert_str_eq(common_spin_for(20.0, 15, 16), "100000");
	ck_assert_str_eq(common_spin_for(3.0, -1, 2), "0");   /* no runnable count */
	ck_assert_str_eq(common_spin_for(-1.0, 4, 2), "100000"); /* no /proc/loadavg */
	ck_assert_str_eq(common_spin_for(3.0, 4, 0), "100000"); /* no mask */
	const char *now = common_spin_count();
	ck_assert(!strcmp(now, "0") || !strcmp(now, "100000"));
}
END_TEST

/* A pipeline stage's wait for its neighbour (cpu_spin_on): up to
 * [plugin.cpu] stage_spin_us, only while each turn (a sched_yield) comes
 * back within 50 us, a core of its own; 0 never spins. */
START_TEST(test_stage_spin)
{
	const int64_t us = 1000, lim = 5000 * us;
	ck_assert(cpu_spin_on(0, 0, lim));
	ck_assert(!cpu_spin_on(20 * us, 2000 * us, lim)); /* the core went elsewhere */
	ck_assert(!cpu_spin_on(3000 * us, 51 * us, lim));
	ck_assert(cpu_spin_on(3000 * us, 49 * us, lim));
	ck_assert(cpu_spin_on(4999 * us, 1 * us, lim));
	ck_assert(!cpu_spin_on(5000 * us, 1 * us, lim)); /* the limit */
	ck_assert(!cpu_spin_on(0, 0, 0));                /* stage_spin_us = 0 */
	ck_assert(cpu_spin_on(99 * us, 1 * us, 100 * us)); /* 100: the old poll's length */
	ck_assert(!cpu_spin_on(100 * us, 0, 100 * us));
}
END_TEST

/* A stage's waits tallied by how they ended (cpu_wait_tally_add; stream.c
 * logs them as the "stage waits" line bench/pipeline.sh reads): counts,
 * the latencies' sums and maxima per ending, the late turns' length only
 * for LATE, a negative latency as 0 (the event recorded again, a later
 * generation's record overwriting done_ns, before the waiter's look),
 * NONE not counted; the lock's retaking averaged over the waits that
 * spun (cpu_wait_tally_spun), not over every wait. */
START_TEST(test_wait_tally)
{
	struct cpu_wait_tally w = { 0 };
	cpu_wait_tally_add(&w, CPU_WAIT_SEEN, 3000, 0);
	cpu_wait_tally_add(&w, CPU_WAIT_SEEN, 5000, 0);
	cpu_wait_tally_add(&w, CPU_WAIT_LATE, 70000, 120000);
	cpu_wait_tally_add(&w, CPU_WAIT_LIMIT, 40000, 999);
	cpu_wait_tally_add(&w, CPU_WAIT_SEEN, -200, 0);
	cpu_wait_tally_add(&w, CPU_WAIT_NONE, 1000000, 0);
	ck_assert_int_eq(w.n[CPU_WAIT_SEEN], 3);
	ck_assert_int_eq(w.n[CPU_WAIT_LATE], 1);
	ck_assert_int_eq(w.n[CPU_WAIT_LIMIT], 1);
	ck_assert_int_eq(w.after_ns[CPU_WAIT_SEEN], 8000);
	ck_assert_int_eq(w.after_max_ns[CPU_WAIT_SEEN], 5000);
	ck_assert_int_eq(w.after_ns[CPU_WAIT_LATE], 70000);
	ck_assert_int_eq(w.after_ns[CPU_WAIT_LIMIT], 40000);
	ck_assert_int_eq(w.turn_ns, 120000);
	ck_assert(cpu_wait_tally_lock_us(&w) == 0);
	cpu_wait_tally_spun(&w, 300);
	cpu_wait_tally_spun(&w, 100);
	cpu_wait_tally_add(&w, CPU_WAIT_BACKOFF, 9000, 0); /* no spin, no lock's retaking */
	ck_assert_int_eq(w.n[CPU_WAIT_BACKOFF], 1);
	ck_assert_int_eq(w.spins, 2);
	ck_assert_msg(fabs(cpu_wait_tally_lock_us(&w) - 0.2) < 1e-12, "lock retaken in %g us, want 0.2",
		      cpu_wait_tally_lock_us(&w));
}
END_TEST

/* The spin's back-off (cpu_spin_backoff): none until a late turn; then the
 * next 1, 2, 4, ... waits (up to CPU_SPIN_BACKOFF_MAX) sleep at once, the
 * doubling kept through a spin that reached stage_spin_us, reset only by a
 * spin that saw the event with every turn back at once (SEEN); off
 * (stage_backoff = 0): never a skip. */
START_TEST(test_spin_backoff)
{
	struct cpu_spin_backoff b = { 0 };
	ck_assert(!cpu_spin_skip(&b));
	cpu_spin_backoff(&b, CPU_WAIT_SEEN);
	ck_assert(!cpu_spin_skip(&b));
	cpu_spin_backoff(&b, CPU_WAIT_LATE);
	ck_assert(cpu_spin_skip(&b));
	ck_assert(!cpu_spin_skip(&b));
	cpu_spin_backoff(&b, CPU_WAIT_LATE);
	ck_assert(cpu_spin_skip(&b) && cpu_spin_skip(&b));
	ck_assert(!cpu_spin_skip(&b));
	cpu_spin_backoff(&b, CPU_WAIT_LIMIT); /* a long wait on a core of its own */
	ck_assert(!cpu_spin_skip(&b));
	cpu_spin_backoff(&b, CPU_WAIT_LATE);
	int n = 0;
	while (cpu_spin_skip(&b))
		n++;
	ck_assert_int_eq(n, 4);
	for (int k = 0; k < 10; k++)
		cpu_spin_backoff(&b, CPU_WAIT_LATE);
	ck_assert_int_eq(b.skip, CPU_SPIN_BACKOFF_MAX);
	cpu_spin_backoff(&b, CPU_WAIT_SEEN); /* the core is the stage's again */
	b.skip = 0;
	cpu_spin_backoff(&b, CPU_WAIT_LATE);
	ck_assert_int_eq(b.skip, 1);
	/* [plugin.cpu] stage_backoff = 0: no late turn makes a wait skip */
	struct cpu_spin_backoff off = { .off = 1 };
	for (int k = 0; k < 3; k++) {
		cpu_spin_backoff(&off, CPU_WAIT_LATE);
		ck_assert(!cpu_spin_skip(&off));
	}
}
END_TEST

/* Which stage waits the back-off learns from and applies to
 * (cpu_spin_learns): a wait on a peer stage's event (run_own = 0), not one
 * on the run's own device's (the step's start, which spans its optimizer
 * on every core); which events are which, through the core and the
 * plugin: tests/check_cpu_pin test_stage_marked. */
START_TEST(test_spin_learns)
{
	ck_assert(cpu_spin_learns(0));
	ck_assert(!cpu_spin_learns(1));
}
END_TEST

/* Which weight gradients run in blocks of the minibatch (cpu_conv_wsplit):
 * the CNN's two at batch 128 in 8, a batch of 100 in 5, batches with no
 * divisor 2..8 in min(8, N / 2) unequal blocks (127: 8, 13: 6, 11: 5), bf16
 * as f32; a team of one, a batch of one and small ops not at all; never by
 * the team's size; $KILN_CPU_CONV_SPLIT off or a number of blocks in
 * 2..N. */
START_TEST(test_conv_wsplit)
{
	struct kiln_op c = { .type = KILN_OP_CONV_BWD_WEIGHTS, .n_in = 2, .n_out = 2 };
	c.in[0] = d4(128, 32, 14, 14), c.in[1] = d4(128, 64, 14, 14), c.out[0] = d4(64, 32, 5, 5);
	unsetenv("KILN_CPU_CONV_SPLIT");
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 8);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 4), 8);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 1), 0);
	c.in[0] = d4(128, 1, 28, 28), c.in[1] = d4(128, 32, 28, 28), c.out[0] = d4(32, 1, 5, 5);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 8);
	c.in[0].dims[0] = c.in[1].dims[0] = 100;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 5);
	c.in[0].dims[0] = c.in[1].dims[0] = 127;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 8);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 4), 8);
	c.in[0].dims[0] = c.in[1].dims[0] = 13;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 6);
	c.in[0].dims[0] = c.in[1].dims[0] = 11;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 5);
	c.in[0].dims[0] = c.in[1].dims[0] = 128;
	c.in[0].dtype = c.in[1].dtype = KILN_BF16;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 8);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 1), 0);
	c.in[0].dims[0] = c.in[1].dims[0] = 127;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 8);
	c.in[0].dims[0] = c.in[1].dims[0] = 128;
	c.in[0].dtype = c.in[1].dtype = KILN_F16;
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
	c.in[0].dtype = c.in[1].dtype = KILN_F32;
	setenv("KILN_CPU_CONV_SPLIT", "0", 1);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
	setenv("KILN_CPU_CONV_SPLIT", "4", 1);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 4);
	setenv("KILN_CPU_CONV_SPLIT", "3", 1); /* unequal: 43, 43, 42 */
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 3);
	setenv("KILN_CPU_CONV_SPLIT", "129", 1);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
	unsetenv("KILN_CPU_CONV_SPLIT");
	/* a batch of one: nothing to cut */
	c.in[0] = d4(1, 32, 56, 56), c.in[1] = d4(1, 64, 56, 56), c.out[0] = d4(64, 32, 5, 5);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
	/* check_ckpt's small one runs on one thread: not split */
	c.in[0] = d4(16, 1, 28, 28), c.in[1] = d4(16, 4, 28, 28), c.out[0] = d4(4, 1, 3, 3);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
	c.type = KILN_OP_CONV;
	c.in[0] = d4(128, 32, 14, 14), c.in[1] = d4(64, 32, 5, 5), c.out[0] = d4(128, 64, 14, 14);
	ck_assert_int_eq(cpu_conv_wsplit(&c, 2), 0);
}
END_TEST

static Suite *make_cpu_threads_suite(void)
{
	Suite *s = suite_create("cpu_threads");
	check_add_case(s, "start", 0, NULL, NULL, (const TTest *[]){
		test_quota_v2, test_quota_v1, test_throttled, test_cgroup_path, test_threads_for, test_one_thread_ops, test_gemm_split, test_gemm_split_busy, test_spin_rule, test_stage_spin, test_wait_tally, test_spin_backoff, test_spin_learns, test_conv_wsplit, NULL });
	check_add_case(s, "adapt", 0, NULL, NULL, (const TTest *[]){
		test_shrinks_and_holds, test_one_busy_interval_holds, test_probe_backoff, test_steps_and_bounds,
		test_throttling_is_not_contention, test_dnn_follows_held_size, test_crowded_steps_down_at_once,
		test_own_and_burst_waiting_holds, test_gone_neighbour_probes_soon,
		test_steady_neighbour_no_flap, test_quick_probe_fails_backs_off, test_periodic_neighbour_no_flap,
		test_quick_probe_edges, test_stat_busy, test_fixed_team_watched,
		test_stat_busy_delta, test_others_scale_with_mask, test_hint_advice, test_fixed_team_hint, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_threads_suite };
