/* tests/check_clockstep.c - the dist heartbeat (core/dist_heartbeat.c) and
 * the MPI/NCCL communicators' watchdog (plugins/common/watchdog.c) against
 * a wall-clock step: NTP or chrony stepping a host's clock back.
 *
 * Session 31 (two hosts in network namespaces): both waited on condition
 * variables of the default clock with deadlines read from CLOCK_REALTIME.
 * A step back after a deadline was computed held the wait for the step's
 * length: the heartbeat stopped beating and after [dist] heartbeat the
 * peers ended the run ("rank 1 sent no heartbeat"), the watchdog stopped
 * looking for a collective that hangs.  Their waits are on CLOCK_MONOTONIC
 * now, which no step moves.
 *
 * The step: this program defines clock_gettime, which libkiln and the
 * watchdog compiled in here call instead of libc's (the executable comes
 * first in symbol lookup); once `skew` is set CLOCK_REALTIME reads 600 s
 * ahead of the kernel's, as a clock stepped back 600 s right after the
 * deadline was read.  A realtime wait in the kernel then lasts 600 s.
 */
#include <kiln/kiln.h>
#include <kiln/dist.h>
#include "../core/dist_impl.h" /* kiln_heartbeat_start */
#include "../plugins/common/watchdog.h"

#include <check.h>
#include "check_main.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int skew;

int clock_gettime(clockid_t c, struct timespec *ts)
{
	int r = (int)syscall(SYS_clock_gettime, c, ts);
	if (!r && c == CLOCK_REALTIME && atomic_load(&skew))
		ts->tv_sec += 600;
	return r;
}

static int looks;

static int count_look(void *arg)
{
	(void)arg;
	looks++; /* under w->lock */
	return 0;
}

/* ten looks a second, whatever the wall clock does */
START_TEST(test_watchdog_clock_step)
{
	struct watchdog w;
	atomic_store(&skew, 1);
	watchdog_init(&w);
	ck_assert_int_eq(watchdog_start(&w, count_look, NULL), 0);
	usleep(1000 * 1000);
	pthread_mutex_lock(&w.lock);
	const int n = looks;
	pthread_mutex_unlock(&w.lock);
	watchdog_destroy(&w);
	ck_assert_msg(n >= 5, "%d looks in 1 s with the wall clock stepped back (ten a second)", n);
}
END_TEST

/* [dist] heartbeat = 2 s: a beat every 0.5 s, whatever the wall clock does
 * (rank 1's counter is bumped here, so rank 0's heartbeat finds no silent
 * peer) */
START_TEST(test_heartbeat_clock_step)
{
	struct kiln_store *s0;
	struct kiln_heartbeat *h;
	int64_t v;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct kiln_dist_env env = { .rank = 0, .world = 2, .master_addr = "127.0.0.1",
				     .master_port = port, .source = "test" };
	atomic_store(&skew, 1);
	ck_assert_int_eq(kiln_heartbeat_start(&env, "127.0.0.1", port, 2.0, &h), KILN_OK);
	for (int i = 0; i < 16; i++) {
		ck_assert_int_eq(kiln_store_add(s0, "kiln/hb/1", 1, &v), KILN_OK);
		usleep(100 * 1000);
	}
	ck_assert_int_eq(kiln_store_add(s0, "kiln/hb/0", 0, &v), KILN_OK);
	kiln_heartbeat_stop(h, 1);
	kiln_store_close(s0);
	ck_assert_msg(v >= 3, "%lld beats in 1.6 s with the wall clock stepped back (one each 0.5 s)",
		      (long long)v);
}
END_TEST

static Suite *make_clockstep_suite(void)
{
	Suite *s = suite_create("clockstep");
	check_add_case(s, "clockstep", 30, NULL, NULL, (const TTest *[]){
		test_watchdog_clock_step, test_heartbeat_clock_step, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_clockstep_suite };
