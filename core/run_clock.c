/* core/run_clock.c - the run clock: CLOCK_MONOTONIC less the time this
 * process was not running (docs/distributed.md "A suspended job").
 *
 * A job suspended whole (`scontrol suspend`, gang scheduling, SIGSTOP of
 * every process) and continued past [dist] timeout found every pending
 * deadline of its collectives expired: on resume each rank, waiting for a
 * peer that had not run either, reported "a peer is stuck".  Deadlines
 * measured on this clock do not count such a stall.
 *
 * A ticker thread wakes every RUN_TICK_NS; a wake-up later than that by
 * more than RUN_SLACK_NS means the whole process stood still (a stopped
 * process runs none of its threads), and the lateness past the slack is
 * added to the stalled time.  A reader that looks before the ticker has
 * woken counts the pending lateness itself, so a collective resumed first
 * on its own thread already sees the stall; the ticker, waking later,
 * records the same amount, so the clock never steps back.  The slack keeps
 * a busy machine's scheduling delays out: a thread held off a core for a
 * second is late, not stopped (were it counted, a deadline moved by a
 * second).  A single stuck peer does not stall this process: its
 * deadlines run as before, so it is still named within the timeout.
 * Without the ticker (no run started it: one process) the clock is
 * CLOCK_MONOTONIC.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <time.h>

#define RUN_TICK_NS (INT64_C(100) * 1000000)   /* the ticker's period */
#define RUN_SLACK_NS (INT64_C(1000) * 1000000) /* lateness not counted as a stall */

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t run_cond;
static pthread_t run_thread;
static int run_users, run_quit;
static int64_t run_stalled; /* ns recorded as stalled (under run_lock) */
static int64_t run_last;    /* the ticker's last wake-up (ns; 0: no ticker) */
static int64_t run_stall_at, run_stall_ns; /* the last stall seen: its end, its length */

/* The stall between the ticker's last wake-up and now (under run_lock). */
static int64_t pending_stall(int64_t now)
{
	const int64_t late = run_last ? now - run_last - RUN_TICK_NS - RUN_SLACK_NS : 0;
	return late > 0 ? late : 0;
}

int64_t kiln_run_ns(void)
{
	pthread_mutex_lock(&run_lock);
	const int64_t now = kiln_now_ns();
	const int64_t r = now - run_stalled - pending_stall(now);
	pthread_mutex_unlock(&run_lock);
	return r;
}

int64_t kiln_run_stalled_ns(void)
{
	pthread_mutex_lock(&run_lock);
	const int64_t r = run_stalled + pending_stall(kiln_now_ns());
	pthread_mutex_unlock(&run_lock);
	return r;
}

int64_t kiln_run_last_stall(int64_t *len_ns)
{
	pthread_mutex_lock(&run_lock);
	const int64_t at = run_stall_at;
	*len_ns = run_stall_ns;
	pthread_mutex_unlock(&run_lock);
	return at;
}

static void *run_ticker(void *arg)
{
	(void)arg;
	prctl(PR_SET_NAME, "kiln-runclock");
	pthread_mutex_lock(&run_lock);
	while (!run_quit) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts); /* the condition's clock */
		const int64_t ns = ts.tv_nsec + RUN_TICK_NS;
		ts.tv_sec += (time_t)(ns / 1000000000);
		ts.tv_nsec = (long)(ns % 1000000000);
		while (!run_quit && pthread_cond_timedwait(&run_cond, &run_lock, &ts) != ETIMEDOUT)
			;
		const int64_t now = kiln_now_ns(), late = pending_stall(now);
		if (late) {
			run_stalled += late;
			run_stall_at = now;
			run_stall_ns = now - run_last - RUN_TICK_NS;
		}
		run_last = now;
	}
	pthread_mutex_unlock(&run_lock);
	return NULL;
}

kiln_status kiln_run_clock_start(void)
{
	kiln_status st = KILN_OK;
	pthread_mutex_lock(&run_lock);
	if (run_users++ == 0) {
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&run_cond, &ca);
		pthread_condattr_destroy(&ca);
		run_quit = 0;
		run_last = kiln_now_ns();
		const int rc = pthread_create(&run_thread, NULL, run_ticker, NULL);
		if (rc) {
			run_users = 0;
			run_last = 0;
			pthread_cond_destroy(&run_cond);
			st = kiln_error(KILN_EIO, "starting the run clock's thread: %s", strerror(rc));
		}
	}
	pthread_mutex_unlock(&run_lock);
	return st;
}

void kiln_run_clock_stop(void)
{
	pthread_mutex_lock(&run_lock);
	if (run_users == 0 || --run_users > 0) {
		pthread_mutex_unlock(&run_lock);
		return;
	}
	run_quit = 1;
	pthread_cond_signal(&run_cond);
	pthread_mutex_unlock(&run_lock);
	pthread_join(run_thread, NULL);
	pthread_mutex_lock(&run_lock);
	run_last = 0; /* the stalled time recorded stays: the clock goes on */
	pthread_cond_destroy(&run_cond);
	pthread_mutex_unlock(&run_lock);
}
