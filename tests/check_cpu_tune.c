/* tests/check_cpu_tune.c - the CPU plugin's timed kernel choices under
 * contention (plugins/cpu/tune.c, tune_choose; tune_cache.c): a bf16 GEMM
 * timed while the timing thread waits for a CPU (KILN_CPU_TUNEWAIT stands
 * for its run-queue wait; a real busy thread pinned beside it gives it) is
 * kept in the cache as provisional; a later context that finds the machine
 * busy (KILN_CPU_PROBEWAIT, the async rule's probe) keeps it, one that
 * finds it quiet times it again, confident now, at most 8 a context; a
 * provisional choice never replaces a confident one in the file.  What
 * happened is read from the plugin's log (the lines tests/cpu_tune_cache.sh
 * reads too).
 */
#include "../core/internal.h" /* first: build-config.h's _GNU_SOURCE (CPU_SET) */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include <check.h>
#include <math.h> /* INFINITY */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/syscall.h> /* SYS_gettid */
#include "check_main.h"

static struct kiln_registry *reg;

#define TIMED "ms, f32 kernel"
#define LOG_HAS(s) \
	ck_assert_msg(check_log_count(s, NULL) > 0, "log lacks \"%s\":\n%s", s, check_log_text())

/* ---- a device with the cache in path, team of dev_threads (1) ---- */
static char path[4096];
static int dev_threads = 1;

struct dev {
	struct kiln_config *cfg;
	struct kiln_device *dev;
};

static void open_dev(struct dev *d)
{
	char o[4200];
	ck_assert(kiln_config_new(&d->cfg) == 0);
	snprintf(o, sizeof o, "run.threads=%d", dev_threads);
	if (dev_threads > 0) /* 0: unset, the adaptive team of the affinity mask */
		ck_assert(kiln_config_override(d->cfg, o) == 0);
	snprintf(o, sizeof o, "plugin.cpu.tune_cache=%s", path);
	ck_assert(kiln_config_override(d->cfg, o) == 0);
	const kiln_status st = kiln_device_open(reg, d->cfg, "cpu", 0, &d->dev);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
}

static void close_dev(struct dev *d)
{
	kiln_device_close(d->dev);
	kiln_config_free(d->cfg);
}

static struct kiln_tensor_desc td2(int dt, int64_t a, int64_t b)
{
	struct kiln_tensor_desc d;
	memset(&d, 0, sizeof d);
	d.dtype = dt;
	d.ndim = b ? 2 : 1;
	d.dims[0] = a;
	d.dims[1] = b;
	return d;
}

/* Prepare (and free) a bf16 GEMM [m, k] x [n, k]^T: `auto` times it or
 * takes the kept choice. */
static void prepare_gemm(struct dev *d, int m, int n, int k)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = td2(KILN_BF16, m, k), op.in[1] = td2(KILN_BF16, n, k);
	op.out[0] = td2(KILN_BF16, m, n);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = m, op.i[3] = n, op.i[4] = k;
	op.f[0] = 1.0;
	void *plan = NULL;
	size_t ws = 0;
	const kiln_status st = kiln_device_prepare(d->dev, &op, &plan, &ws);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	kiln_device_plan_free(d->dev, plan);
}

/* M and N of one_run's GEMMs (K: 64, 80, 96, ...) */
static int gemm_mn = 32, gemm_k = 64;

/* One context: open, prepare the GEMMs of `shapes` sizes, close; the log
 * of it in check_log_text().  tune, probe: the hooks ("" unset). */
static void one_run(const char *tune, const char *probe, int shapes)
{
	if (*tune)
		setenv("KILN_CPU_TUNEWAIT", tune, 1);
	else
		unsetenv("KILN_CPU_TUNEWAIT");
	if (*probe)
		setenv("KILN_CPU_PROBEWAIT", probe, 1);
	else
		unsetenv("KILN_CPU_PROBEWAIT");
	check_log_clear();
	struct dev d;
	open_dev(&d);
	for (int s = 0; s < shapes; s++)
		prepare_gemm(&d, gemm_mn, gemm_mn, gemm_k + 16 * s);
	close_dev(&d);
}

static void setup(void)
{
	const char *t = getenv("TMPDIR");
	snprintf(path, sizeof path, "%s/check_cpu_tune-%d.bin", t && *t ? t : "/tmp", (int)getpid());
	unlink(path);
	kiln_log_set_level(KILN_LOG_INFO);
	kiln_log_set_sink(check_log_sink, NULL);
}

static void teardown(void)
{
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(KILN_LOG_INFO);
	dev_threads = 1;
	gemm_mn = 32, gemm_k = 64;
	unlink(path);
	unsetenv("KILN_CPU_TUNEWAIT");
	unsetenv("KILN_CPU_PROBEWAIT");
	unsetenv("KILN_CPU_TEAM_FLIP");
}

/* Timed waiting 0.6 s a second for a CPU (above CPU_WAIT_BUSY, 0.25):
 * provisional; busy later: kept, not timed; quiet later: timed again,
 * confident; then read confident and timed no more, even by a busy run. */
START_TEST(test_contended_provisional_retimed)
{
	one_run("0.6", "", 1);
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_int_eq(check_log_count(TIMED, "provisional (timed under contention: waited 0.60 s"), 1);
	LOG_HAS(": 1 choices timed, 1 written (1 provisional;");

	one_run("0.6", "0.6", 1);
	LOG_HAS(": 1 choices read for 1 threads (1 provisional)");
	LOG_HAS("waited 0.60 s a second for a CPU over 40 ms: busy, keeping them");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 0);
	ck_assert_int_eq(check_log_count("written", NULL), 0);

	one_run("0.1", "0.1", 1);
	LOG_HAS(": 1 choices read for 1 threads (1 provisional)");
	LOG_HAS("quiet, re-timing them");
	LOG_HAS("re-timing the cached choice");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_int_eq(check_log_count(TIMED, "provisional"), 0);
	LOG_HAS(": 1 choices timed, 1 written (0 provisional;");

	one_run("0.6", "0", 1);
	LOG_HAS(": 1 choices read for 1 threads (0 provisional)");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 0);
	ck_assert_int_eq(check_log_count("written", NULL), 0);
}
END_TEST

/* At most 8 re-timings a context: 10 provisional choices take two quiet
 * runs, 8 then 2; the third times none. */
START_TEST(test_retimes_bounded)
{
	one_run("0.6", "", 10);
	ck_assert_int_eq(check_log_count(TIMED, "provisional"), 10);
	one_run("0", "0", 10);
	LOG_HAS(": 10 choices read for 1 threads (10 provisional)");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 8);
	LOG_HAS(": 8 choices timed, 10 written (2 provisional;");
	one_run("0", "0", 10);
	ck_assert_int_eq(check_log_count(TIMED, NULL), 2);
	LOG_HAS(": 2 choices timed, 10 written (0 provisional;");
	one_run("0", "0", 10);
	LOG_HAS(": 10 choices read for 1 threads (0 provisional)");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 0);
}
END_TEST

/* Two contexts on one file: a contended one opens first and closes last;
 * the quiet one's confident choice, written meanwhile, stays. */
START_TEST(test_provisional_never_replaces_confident)
{
	struct dev a, b;
	setenv("KILN_CPU_TUNEWAIT", "0.6", 1);
	check_log_clear();
	open_dev(&a);
	prepare_gemm(&a, 32, 32, 64);
	ck_assert_int_eq(check_log_count(TIMED, "provisional"), 1);
	setenv("KILN_CPU_TUNEWAIT", "0", 1);
	open_dev(&b);
	prepare_gemm(&b, 32, 32, 64);
	close_dev(&b);
	LOG_HAS(": 1 choices timed, 1 written (0 provisional; 0 provisional");
	check_log_clear();
	close_dev(&a);
	LOG_HAS(": 1 choices timed, 1 written (0 provisional; 1 provisional of ours left out for confident ones)");
	one_run("0.6", "0", 1);
	LOG_HAS(": 1 choices read for 1 threads (0 provisional)");
	ck_assert_int_eq(check_log_count(TIMED, NULL), 0);
}
END_TEST

static volatile int spin_stop;

static void *spin_main(void *arg)
{
	pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), arg);
	while (!spin_stop)
		;
	return NULL;
}

/* No hook: a busy thread pinned on the timing thread's CPU makes it wait
 * (schedstat), about half the time, and the choice is provisional.  (That
 * a quiet timing is confident is not asserted: the test machine is
 * shared.)  A GEMM of 1024 x 1024 x 512 takes 2-5 ms (bf16, f32), so the
 * timing spans a few hundred ms, many of the scheduler's slices (256 x 256
 * x 64 took 0.02-0.04 ms: its whole timing fit in one slice, and the test
 * failed under CI when the spinner did not run within it). */
START_TEST(test_busy_thread_makes_provisional)
{
	if (access("/proc/thread-self/schedstat", R_OK))
		return; /* nothing to measure with: confident, as before */
	cpu_set_t all, one;
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
	int cpu = 0;
	while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all))
		cpu++;
	ck_assert_int_lt(cpu, CPU_SETSIZE);
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
	pthread_t spinner;
	spin_stop = 0;
	ck_assert_int_eq(pthread_create(&spinner, NULL, spin_main, &one), 0);
	usleep(20000);
	gemm_mn = 1024, gemm_k = 512;
	one_run("", "", 1);
	gemm_mn = 32, gemm_k = 64;
	spin_stop = 1;
	pthread_join(spinner, NULL);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof all, &all), 0);
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_msg(check_log_count(TIMED, "provisional (timed under contention") == 1,
		      "a busy thread on the timing thread's CPU, not provisional:\n%s", check_log_text());
	LOG_HAS(": 1 choices timed, 1 written (1 provisional;");
}
END_TEST

/* The CPUs this thread may run on: *n of them, a and b the first two. */
static void two_cpus(cpu_set_t *all, int *n, int *a, int *b)
{
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof *all, all), 0);
	*n = CPU_COUNT(all);
	*a = *b = -1;
	for (int k = 0; k < CPU_SETSIZE && *b < 0; k++)
		if (CPU_ISSET(k, all))
			*(*a < 0 ? a : b) = k;
}

/* Pin every thread of the process but this one and `skip` on cpu
 * (sched_setaffinity by tid from /proc/self/task): the OpenMP team's
 * workers, made by the first prepare; the count pinned. */
static int pin_others(int cpu, pid_t skip)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	const pid_t self = (pid_t)syscall(SYS_gettid);
	DIR *d = opendir("/proc/self/task");
	ck_assert(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		const pid_t tid = (pid_t)atoi(e->d_name);
		if (tid > 0 && tid != self && tid != skip && !sched_setaffinity(tid, sizeof one, &one))
			n++;
	}
	closedir(d);
	return n;
}

static volatile pid_t spin_tid;

static void *spin_tid_main(void *arg)
{
	spin_tid = (pid_t)syscall(SYS_gettid);
	return spin_main(arg);
}

/* No hook: a team of 2 (run.threads = 2, not adaptive: the wait alone
 * decides) with its timing thread alone on one CPU and its other thread
 * on the other CPU beside a busy thread.  The other thread waits about
 * half the time and the timing thread, sleeping at the barrier meanwhile,
 * none: its own wait, the measure before session 36, read 0.00-0.14 s a
 * second and the choice was kept confident; the process's threads' wait
 * makes it provisional. */
START_TEST(test_busy_thread_other_cpu_makes_provisional)
{
	cpu_set_t all, one;
	int ncpu, a, b;
	two_cpus(&all, &ncpu, &a, &b);
	if (access("/proc/thread-self/schedstat", R_OK) || ncpu < 2) {
		fprintf(stderr, "%s: skipped: %s\n", __func__,
			ncpu < 2 ? "fewer than 2 CPUs to run on" : "no schedstat to measure with");
		return;
	}
	dev_threads = 2;
	unsetenv("KILN_CPU_TUNEWAIT");
	unsetenv("KILN_CPU_PROBEWAIT");
	struct dev d;
	open_dev(&d);
	prepare_gemm(&d, 32, 32, 64); /* the team made, timed on a quiet pair */
	CPU_ZERO(&one);
	CPU_SET(b, &one);
	pthread_t spinner;
	spin_stop = 0;
	spin_tid = 0;
	ck_assert_int_eq(pthread_create(&spinner, NULL, spin_tid_main, &one), 0);
	while (!spin_tid)
		usleep(1000);
	ck_assert_int_ge(pin_others(b, spin_tid), 1);
	CPU_ZERO(&one);
	CPU_SET(a, &one);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
	usleep(20000);
	check_log_clear();
	prepare_gemm(&d, 1024, 1024, 512);
	spin_stop = 1;
	pthread_join(spinner, NULL);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof all, &all), 0);
	close_dev(&d);
	/* (the small GEMM's own timing, before, may be either on a shared
	 * machine: only the large one's is asserted) */
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_msg(check_log_count(TIMED, "provisional (timed under contention") == 1,
		      "a busy thread beside the team's other thread, not provisional:\n%s", check_log_text());
	LOG_HAS(": 2 choices timed, 2 written (");
}
END_TEST

/* The adaptive team changing size while an op that runs on the team is
 * timed ($KILN_CPU_TEAM_FLIP=1: 2 and 1 threads every other op; no wait
 * hook): provisional, whatever the wait, since the cache keys the choice
 * by the opening team.  The wait hook stands for the whole reading (a
 * steady team): "0" keeps it confident, as make check's caches. */
START_TEST(test_team_change_makes_provisional)
{
	cpu_set_t all;
	int ncpu, a, b;
	two_cpus(&all, &ncpu, &a, &b);
	if (ncpu < 2 || access("/proc/self/task", R_OK)) {
		fprintf(stderr, "%s: skipped: %s: no adaptive team\n", __func__,
			ncpu < 2 ? "fewer than 2 CPUs to run on" : "no schedstat");
		return;
	}
	dev_threads = 0; /* the adaptive team */
	setenv("KILN_CPU_TEAM_FLIP", "1", 1);
	gemm_mn = 256, gemm_k = 512; /* 67 MFLOP: on the team */
	one_run("", "", 1);
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_msg(check_log_count(TIMED, "provisional (timed under contention: a team of ") == 1 &&
			      check_log_count(TIMED, " threads changing size, waited ") == 1,
		      "timed on a changing team, not provisional:\n%s", check_log_text());
	LOG_HAS(": 1 choices timed, 1 written (1 provisional;");
	unlink(path);
	one_run("0", "", 1);
	ck_assert_int_eq(check_log_count(TIMED, NULL), 1);
	ck_assert_int_eq(check_log_count(TIMED, "provisional"), 0);
}
END_TEST

/* The measure (tune_choose): a 2-thread GEMM timed quietly goes by the
 * median wall times, timed under contention by the median CPU time of the
 * team's threads (their own clocks, both threads counted); the figures of
 * the choice's line are the debug line's column of that measure, and the
 * choice is the smallest of them (the first on a tie). */
static void check_measure(const char *tune, int col, const char *what)
{
	kiln_log_set_level(KILN_LOG_DEBUG);
	dev_threads = 2, gemm_mn = 256, gemm_k = 512;
	one_run(tune, "", 1);
	const char *d = strstr(check_log_text(), "median wall/team CPU ms: ");
	ck_assert_msg(d != NULL, "no debug line of the measures:\n%s", check_log_text());
	ck_assert_msg(check_log_count("team of 2, wait", NULL) == 1,
		      "the team's clocks are not both threads':\n%s", check_log_text());
	double v[3][2];
	const int got = sscanf(d, "median wall/team CPU ms: %lf/%lf, %lf/%lf, %lf/%lf", &v[0][0], &v[0][1],
			       &v[1][0], &v[1][1], &v[2][0], &v[2][1]);
	ck_assert_msg(got == 2 || got == 4 || got == 6, "%d figures in: %.200s", got, d);
	int n = got / 2;
	if (n == 1) { /* below AVX-512: both candidates the one lowp.c plan,
		       * timed once (tune.c tune_time), the tie the bf16 choice */
		LOG_HAS(", one plan timed once");
		v[1][0] = v[0][0], v[1][1] = v[0][1];
		n = 2;
	}
	/* a GEMM where oneDNN has bf16 dot products times no f32 kernel
	 * (tune.c tune_time): its two figures are the two bf16 kernels' */
	const int no_f32 = strstr(check_log_text(), "f32 kernel not timed (bf16 dot products)") != NULL;
	if (no_f32) {
		ck_assert_int_eq(n, 2);
		v[2][0] = v[1][0], v[2][1] = v[1][1];
		v[1][0] = v[1][1] = INFINITY;
		n = 3;
	}
	int best = 0;
	for (int k = 1; k < n; k++) {
		ck_assert(v[k][0] > 0 && v[k][1] > 0);
		if (v[k][col] < v[best][col])
			best = k;
	}
	char want[256];
	if (no_f32)
		snprintf(want, sizeof want, "bf16 kernel %.3f ms, f32 kernel not timed", v[0][col]);
	else
		snprintf(want, sizeof want, "bf16 kernel %.3f ms, f32 kernel %.3f ms", v[0][col], v[1][col]);
	ck_assert_msg(check_log_count(want, what) == 1, "want \"%s\" by %s:\n%s", want, what,
		      check_log_text());
	if (n == 3) {
		snprintf(want, sizeof want, "second bf16 kernel %.3f ms (", v[2][col]);
		LOG_HAS(want);
	}
	static const char *const kern[3] = { ": the bf16 kernel", ": the f32 kernel", ": the second bf16 kernel" };
	ck_assert_msg(check_log_count(TIMED, kern[best]) == 1, "want%s:\n%s", kern[best],
		      check_log_text());
}

START_TEST(test_measure_wall_when_quiet)
{
	check_measure("0", 0, "(medians of wall time)");
	ck_assert_int_eq(check_log_count(TIMED, "provisional"), 0);
}
END_TEST

/* A small op's wait is read over at least 10 ms (TUNE_WAIT_MIN_S): the
 * 32x32x64 GEMM's 31 rounds of 3 candidates take well under 1 ms. */
START_TEST(test_wait_window_small_op)
{
	kiln_log_set_level(KILN_LOG_DEBUG);
	one_run("0", "", 1);
	const char *d = strstr(check_log_text(), "s/s over ");
	ck_assert_msg(d != NULL, "no wait window in:\n%s", check_log_text());
	double ms = 0;
	ck_assert_int_eq(sscanf(d, "s/s over %lf ms", &ms), 1);
	ck_assert_msg(ms >= 10.0 && ms < 1000.0, "wait read over %.1f ms", ms);
}
END_TEST

START_TEST(test_measure_team_cpu_when_contended)
{
	check_measure("0.6", 1, "(medians of the team's CPU time)");
	ck_assert_int_eq(check_log_count(TIMED, "provisional (timed under contention: waited 0.60 s"), 1);
}
END_TEST

static Suite *make_cpu_tune_suite(void)
{
	Suite *s = suite_create("cpu_tune");
	TCase *tc = tcase_create("contention");
	tcase_set_timeout(tc, 300);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_contended_provisional_retimed);
	tcase_add_test(tc, test_retimes_bounded);
	tcase_add_test(tc, test_provisional_never_replaces_confident);
	tcase_add_test(tc, test_busy_thread_makes_provisional);
	tcase_add_test(tc, test_busy_thread_other_cpu_makes_provisional);
	tcase_add_test(tc, test_team_change_makes_provisional);
	tcase_add_test(tc, test_measure_wall_when_quiet);
	tcase_add_test(tc, test_wait_window_small_op);
	tcase_add_test(tc, test_measure_team_cpu_when_contended);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_tune_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
