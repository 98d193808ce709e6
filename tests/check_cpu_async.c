/* tests/check_cpu_async.c - [plugin.cpu] async = auto on a data-parallel
 * rank (plugins/cpu/async_auto.c, cpu_async_rule; stream.c, cpu_streams_set_async):
 * the device opens async (the open's rule: several ranks), then the
 * step's workload (KILN_PROC_WORKLOAD, ABI 2.14) decides.  A host function
 * on a stream tells which: sync streams run it on the calling thread, async
 * ones on a worker.  bench/'s MLP's workload (2.0 MiB of gradients, 69
 * MFLOP a step) turns the streams sync, after the work already queued
 * ran; its CNN's (12.5 MiB, 1.8 GFLOP) turns them async again, with
 * events between streams ordering the work; a busy machine keeps them
 * async for the MLP: busy now, the issuing thread's run-queue wait over a
 * 40 ms spin ($KILN_CPU_PROBEWAIT stands for it, and a real busy thread
 * pinned beside this one gives it), not the load average (main's
 * $KILN_CPU_LOADAVG, high and ignored); `async = 0` set is not changed by
 * any workload.  A stream created on another thread while a workload
 * switches the streams async gets its worker too.
 */
#include "../core/internal.h" /* first: build-config.h's _GNU_SOURCE (CPU_SET) */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check_main.h"
#include "../core/dist.h"

static struct kiln_registry *reg;

static const struct kiln_workload mlp = { .version = KILN_WORKLOAD_VERSION, .ranks = 2,
					  .batch = 64, .grad_elems = 535818,
					  .grad_bytes = 535818 * 4, .fwd_flops = 68584064.0 };
static const struct kiln_workload cnn = { .version = KILN_WORKLOAD_VERSION, .ranks = 2,
					  .batch = 64, .grad_elems = 3274634,
					  .grad_bytes = 3274634 * 4, .fwd_flops = 1784562304.0 };

struct probe {
	pthread_t who;   /* the thread that ran it */
	int sleep_ms;    /* before it marks */
	int *mark;       /* set to `value` */
	int value;
	const int *seen_from; /* read into seen */
	int seen;
};

static kiln_status probe_fn(void *arg)
{
	struct probe *p = arg;
	p->who = pthread_self();
	if (p->sleep_ms)
		usleep((useconds_t)p->sleep_ms * 1000);
	if (p->seen_from)
		p->seen = __atomic_load_n(p->seen_from, __ATOMIC_ACQUIRE);
	if (p->mark)
		__atomic_store_n(p->mark, p->value, __ATOMIC_RELEASE);
	return KILN_OK;
}

/* Poll until *flag == want, giving up after 20 s (a broken build fails,
 * not hangs); then sleep sleep_ms.  seen: *flag at the end. */
struct poll {
	const int *flag;
	int want, sleep_ms, seen;
};

static kiln_status poll_fn(void *arg)
{
	struct poll *p = arg;
	for (int i = 0; i < 20000 && __atomic_load_n(p->flag, __ATOMIC_ACQUIRE) != p->want; i++)
		usleep(1000);
	if (p->sleep_ms)
		usleep((useconds_t)p->sleep_ms * 1000);
	p->seen = __atomic_load_n(p->flag, __ATOMIC_ACQUIRE);
	return KILN_OK;
}

/* 1: stream s ran a host function on the calling thread (sync streams). */
static int runs_here(struct kiln_device *dev, void *s)
{
	struct probe p = { 0 };
	ck_assert_int_eq(kiln_device_host_fn(dev, s, probe_fn, &p), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_sync(dev, s), KILN_OK);
	return pthread_equal(p.who, pthread_self());
}

static struct kiln_config *cfg; /* the open device's */

static void close_rank(struct kiln_device *dev)
{
	kiln_device_close(dev);
	kiln_config_free(cfg);
	cfg = NULL;
}

static struct kiln_device *open_rank(const char *override)
{
	struct kiln_device *dev;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "run.threads=1") == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0);
	if (override)
		ck_assert(kiln_config_override(cfg, override) == 0);
	/* a rank of 2 (the device reads the world size at open) */
	setenv("KILN_RANK", "0", 1);
	setenv("KILN_WORLD_SIZE", "2", 1);
	kiln_status st = kiln_device_open(reg, cfg, "cpu", 0, &dev);
	unsetenv("KILN_RANK");
	unsetenv("KILN_WORLD_SIZE");
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	return dev;
}

START_TEST(test_auto_follows_workload)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank(NULL);
	void *a, *b, *ev;
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_create(dev, &b), KILN_OK);
	ck_assert_int_eq(kiln_device_event_create(dev, &ev), KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "opened sync on a rank of 2");

	/* work queued before the MLP's workload has run when it returns */
	int mark = 0;
	struct probe slow = { .sleep_ms = 50, .mark = &mark, .value = 1 };
	ck_assert_int_eq(kiln_device_host_fn(dev, a, probe_fn, &slow), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_int_eq(__atomic_load_n(&mark, __ATOMIC_ACQUIRE), 1);
	ck_assert_msg(runs_here(dev, a) && runs_here(dev, b), "the MLP's workload left async streams");
	ck_assert_int_eq(kiln_device_event_record(dev, ev, a), KILN_OK);
	ck_assert_int_eq(kiln_device_event_sync(dev, ev), KILN_OK);

	/* the CNN's: async again, an event orders b after a's slow work */
	ck_assert_int_eq(kiln_device_workload(dev, &cnn), KILN_OK);
	ck_assert_msg(!runs_here(dev, a) && !runs_here(dev, b), "the CNN's workload left sync streams");
	mark = 0;
	struct probe late = { .sleep_ms = 50, .mark = &mark, .value = 7 };
	struct probe after = { .seen_from = &mark };
	ck_assert_int_eq(kiln_device_host_fn(dev, a, probe_fn, &late), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, ev, a), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_wait(dev, b, ev), KILN_OK);
	ck_assert_int_eq(kiln_device_host_fn(dev, b, probe_fn, &after), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_sync(dev, b), KILN_OK);
	ck_assert_int_eq(after.seen, 7);

	/* the MLP on a busy machine: its issuing thread waited 0.3 s a second
	 * for a CPU (above 0.25); at 0.2 it is quiet */
	setenv("KILN_CPU_PROBEWAIT", "0.3", 1);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "busy: the MLP's workload turned the streams sync");
	setenv("KILN_CPU_PROBEWAIT", "0.2", 1);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_msg(runs_here(dev, a), "quiet again: the MLP's workload left async streams");
	/* a load average from runs gone by (main's hook for it: 1000) is not
	 * busy: the machine is quiet now */
	setenv("KILN_CPU_LOADAVG", "1000", 1);
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	ck_assert_int_eq(kiln_device_workload(dev, &cnn), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_msg(runs_here(dev, a), "a high load average but quiet now: the MLP's workload left async streams");
	unsetenv("KILN_CPU_LOADAVG");

	kiln_device_event_destroy(dev, ev);
	kiln_device_stream_destroy(dev, a);
	kiln_device_stream_destroy(dev, b);
	close_rank(dev);
}
END_TEST

static atomic_int spin_stop; /* atomic: a TSan build runs this test clean */

static void *spin_main(void *arg)
{
	const cpu_set_t *one = arg;
	pthread_setaffinity_np(pthread_self(), sizeof *one, one);
	while (!atomic_load(&spin_stop))
		;
	return NULL;
}

/* The probe for real: a busy thread on this thread's CPU makes the MLP's
 * rank wait for it (about half the time) and go async, with the load
 * average hook saying quiet (main: sync). */
START_TEST(test_probe_sees_busy_thread)
{
	unsetenv("KILN_CPU_PROBEWAIT");
	setenv("KILN_CPU_LOADAVG", "0", 1);
	cpu_set_t all, one;
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
	int cpu = 0;
	while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all))
		cpu++;
	ck_assert_int_lt(cpu, CPU_SETSIZE);
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	struct kiln_device *dev = open_rank(NULL);
	void *a;
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
	pthread_t spinner;
	atomic_store(&spin_stop, 0);
	ck_assert_int_eq(pthread_create(&spinner, NULL, spin_main, &one), 0);
	usleep(20000);
	kiln_status st = kiln_device_workload(dev, &mlp);
	atomic_store(&spin_stop, 1);
	pthread_join(spinner, NULL);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof all, &all), 0);
	ck_assert_int_eq(st, KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "a busy thread on this CPU: the MLP's workload turned the streams sync");
	kiln_device_stream_destroy(dev, a);
	unsetenv("KILN_CPU_LOADAVG");
	close_rank(dev);
}
END_TEST

struct creator {
	struct kiln_device *dev;
	void *stream;
	kiln_status st;
};

static void *create_main(void *arg)
{
	struct creator *cr = arg;
	cr->st = kiln_device_stream_create(cr->dev, &cr->stream);
	return NULL;
}

/* A stream created on another thread during a switch to async gets its
 * worker: the creation reads the mode, then (the hook) sleeps 300 ms
 * before listing the stream; the CNN's workload switches 100 ms in. */
START_TEST(test_create_during_switch)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank(NULL);
	void *a;
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_msg(runs_here(dev, a), "the MLP's workload left async streams");
	struct creator cr = { .dev = dev };
	pthread_t t;
	setenv("KILN_CPU_TEST_CREATE_PAUSE_MS", "300", 1);
	ck_assert_int_eq(pthread_create(&t, NULL, create_main, &cr), 0);
	usleep(100000);
	unsetenv("KILN_CPU_TEST_CREATE_PAUSE_MS"); /* read already */
	ck_assert_int_eq(kiln_device_workload(dev, &cnn), KILN_OK);
	pthread_join(t, NULL);
	ck_assert_int_eq(cr.st, KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "the CNN's workload left sync streams");
	ck_assert_msg(!runs_here(dev, cr.stream), "the stream created during the switch has no worker");
	kiln_device_stream_destroy(dev, cr.stream);
	kiln_device_stream_destroy(dev, a);
	close_rank(dev);
}
END_TEST

/* async set: no workload changes it */
START_TEST(test_set_is_kept)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank("plugin.cpu.async=0");
	void *a;
	ck_assert_ptr_nonnull(kiln_device_proc(dev, KILN_PROC_WORKLOAD));
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &cnn), KILN_OK);
	ck_assert_msg(runs_here(dev, a), "async = 0 turned async by a workload");
	kiln_device_stream_destroy(dev, a);
	close_rank(dev);
	dev = open_rank("plugin.cpu.async=1");
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "async = 1 turned sync by a workload");
	kiln_device_stream_destroy(dev, a);
	close_rank(dev);
}
END_TEST

/* a failure with a message of 3000 bytes whose end names a file (the
 * cause: a collective's message names ranks, hosts and files) */
static kiln_status long_fail_fn(void *arg)
{
	(void)arg;
	char pad[2900];
	memset(pad, 'x', sizeof pad - 1);
	pad[sizeof pad - 1] = 0;
	return kiln_error(KILN_EIO, "head of the message: %s: /data/run/shard-000123.bin: short read", pad);
}

/* A host function that failed on an async stream's worker: the stream's
 * sync reports its message with its start and its end (the file's name),
 * cut in the middle with "..." (before session 33 cpu_err's 512 bytes
 * kept the first 511 and lost the end). */
START_TEST(test_long_message_kept)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank("plugin.cpu.async=1");
	void *a;
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_msg(!runs_here(dev, a), "async = 1: the host function ran on this thread");
	ck_assert_int_eq(kiln_device_host_fn(dev, a, long_fail_fn, NULL), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_sync(dev, a), KILN_EIO);
	const char *m = kiln_last_error();
	ck_assert_msg(strstr(m, "head of the message: xxx"), "%s", m);
	ck_assert_msg(strstr(m, "...xxx"), "the cut is not marked: %s", m);
	ck_assert_msg(strstr(m, "xxx: /data/run/shard-000123.bin: short read"), "the end is lost: %s", m);
	kiln_device_stream_destroy(dev, a);
	close_rank(dev);
}
END_TEST

/* KILN_PROC_STREAM_SIDE (session 49, [pipeline] defer_wgrad): a side
 * stream's work runs on its stream's worker while that waits for an event
 * not yet complete, a group (up to an event record) at a time, in the
 * order issued, none before the stream's work issued before it; a wait
 * on the side's own event runs what is left; a side takes no waits. */
START_TEST(test_side_stream)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank("plugin.cpu.async=1");
	void *a, *b, *side, *ev, *sev;
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_create(dev, &b), KILN_OK);
	ck_assert_int_eq(kiln_device_event_create(dev, &ev), KILN_OK);
	ck_assert_int_eq(kiln_device_event_create(dev, &sev), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_side(dev, a, &side), KILN_OK);
	int go = 0, flag = 0, flag_seen = -1, one = 1, two = 2, three = 3, dst = 0;
	/* b: once everything is issued, 100 ms (a is in its first wait by
	 * then: the side must not run there), its event; then until the
	 * side's second group ran (dst == 2: only a's second wait can run
	 * it), its event again */
	struct poll slow1 = { .flag = &go, .want = 1, .sleep_ms = 100 }, slow2 = { .flag = &dst, .want = 2 };
	ck_assert_int_eq(kiln_device_host_fn(dev, b, poll_fn, &slow1), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, ev, b), KILN_OK);
	ck_assert_int_eq(kiln_device_host_fn(dev, b, poll_fn, &slow2), KILN_OK);
	/* a: once everything is issued (the side's work below is queued), a
	 * wait for b's first event, then flag = 5 */
	struct poll gate = { .flag = &go, .want = 1 };
	ck_assert_int_eq(kiln_device_host_fn(dev, a, poll_fn, &gate), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_wait(dev, a, ev), KILN_OK);
	struct probe setf = { .mark = &flag, .value = 5 };
	ck_assert_int_eq(kiln_device_host_fn(dev, a, probe_fn, &setf), KILN_OK);
	/* the side, two groups: flag read and dst = 1; then dst = 2 (none of
	 * it in a's first wait, which was issued before it) */
	ck_assert_int_eq(kiln_device_copy_async(dev, &flag_seen, &flag, sizeof flag, KILN_COPY_D2D, side),
			 KILN_OK);
	ck_assert_int_eq(kiln_device_copy_async(dev, &dst, &one, sizeof dst, KILN_COPY_D2D, side), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, sev, side), KILN_OK);
	ck_assert_int_eq(kiln_device_copy_async(dev, &dst, &two, sizeof dst, KILN_COPY_D2D, side), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, sev, side), KILN_OK);
	/* a waits for b's second event: the side runs meanwhile */
	ck_assert_int_eq(kiln_device_event_record(dev, ev, b), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_wait(dev, a, ev), KILN_OK);
	__atomic_store_n(&go, 1, __ATOMIC_RELEASE);
	ck_assert_int_eq(kiln_device_stream_sync(dev, a), KILN_OK);
	ck_assert_int_eq(flag_seen, 5); /* after a's earlier work */
	ck_assert_int_eq(slow2.seen, 2); /* both groups, in order, while a waited */
	ck_assert_int_eq(kiln_device_stream_sync(dev, b), KILN_OK);
	/* the rest, at a wait on the side's event (a has nothing else to wait for) */
	ck_assert_int_eq(kiln_device_copy_async(dev, &dst, &three, sizeof dst, KILN_COPY_D2D, side), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, sev, side), KILN_OK);
	ck_assert_int_eq(dst, 2);
	ck_assert_int_eq(kiln_device_stream_wait(dev, a, sev), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_sync(dev, a), KILN_OK);
	ck_assert_int_eq(dst, 3);
	ck_assert_int_eq(kiln_device_stream_wait(dev, side, ev), KILN_EINVAL);
	kiln_device_stream_destroy(dev, side);
	kiln_device_stream_destroy(dev, a);
	kiln_device_stream_destroy(dev, b);
	kiln_device_event_destroy(dev, ev);
	kiln_device_event_destroy(dev, sev);
	close_rank(dev);
}
END_TEST

/* A side stream's teardown: destroying its owner runs the owner's queued
 * wait on the side's event first (the side's work with it), then drops
 * the side; a side destroyed on its own completes its pending event
 * record with an error (a wait on it fails, not hangs); the streams do
 * not switch sync while a side is open. */
START_TEST(test_side_teardown)
{
	setenv("KILN_CPU_PROBEWAIT", "0", 1);
	struct kiln_device *dev = open_rank(NULL);
	void *a, *side, *sev;
	ck_assert_int_eq(kiln_device_workload(dev, &cnn), KILN_OK); /* async */
	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_event_create(dev, &sev), KILN_OK);
	int one = 1, two = 2, dst = 0;
	struct probe busy = { .sleep_ms = 50 };
	ck_assert_int_eq(kiln_device_stream_side(dev, a, &side), KILN_OK);
	ck_assert_int_eq(kiln_device_host_fn(dev, a, probe_fn, &busy), KILN_OK);
	ck_assert_int_eq(kiln_device_copy_async(dev, &dst, &one, sizeof dst, KILN_COPY_D2D, side), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, sev, side), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_wait(dev, a, sev), KILN_OK);
	kiln_device_stream_destroy(dev, a); /* (the side with it) */
	ck_assert_int_eq(dst, 1);
	ck_assert_int_eq(kiln_device_event_sync(dev, sev), KILN_OK);

	ck_assert_int_eq(kiln_device_stream_create(dev, &a), KILN_OK);
	ck_assert_int_eq(kiln_device_stream_side(dev, a, &side), KILN_OK);
	ck_assert_int_eq(kiln_device_workload(dev, &mlp), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "side stream"), "%s", kiln_last_error());
	ck_assert_msg(!runs_here(dev, a), "the streams switched sync with a side open");
	ck_assert_int_eq(kiln_device_copy_async(dev, &dst, &two, sizeof dst, KILN_COPY_D2D, side), KILN_OK);
	ck_assert_int_eq(kiln_device_event_record(dev, sev, side), KILN_OK);
	kiln_device_stream_destroy(dev, side);
	ck_assert_int_eq(kiln_device_event_sync(dev, sev), KILN_EINVAL);
	ck_assert_int_eq(dst, 1);
	kiln_device_stream_destroy(dev, a);
	kiln_device_event_destroy(dev, sev);
	close_rank(dev);
}
END_TEST

static Suite *make_cpu_async_suite(void)
{
	Suite *s = suite_create("cpu_async");
	TCase *tc = tcase_create("auto");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_auto_follows_workload);
	tcase_add_test(tc, test_set_is_kept);
	tcase_add_test(tc, test_probe_sees_busy_thread);
	tcase_add_test(tc, test_create_during_switch);
	tcase_add_test(tc, test_long_message_kept);
	tcase_add_test(tc, test_side_stream);
	tcase_add_test(tc, test_side_teardown);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_async_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
