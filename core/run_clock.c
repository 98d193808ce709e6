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
 *
 * Readers take no lock: the comm plugins' wait loops read the clock per
 * poll (MPI's wait_req twice per MPI_Test), and a mutex shared with every
 * waiting thread and the ticker was contended there.  The ticker's fields
 * are published under a sequence count (a seqlock): a reader retries while
 * the ticker writes.  The clock still never steps back: the ticker reads
 * CLOCK_MONOTONIC inside its write (after the count went odd), so a reader
 * that got the old fields read its time before the ticker's, and the old
 * fields at an earlier time give at most what the new ones give later (the
 * pending lateness a reader counts is the lateness the ticker records).
 *
 * Start and stop are serialised whole by run_life, the join included: a
 * start between a stop's release of the ticker and its join re-initialised
 * the condition the old ticker waited on and overwrote its thread handle
 * (a hang, a double join).
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <time.h>

#define RUN_TICK_NS (INT64_C(100) * 1000000)   /* the ticker's period */
#define RUN_SLACK_NS (INT64_C(1000) * 1000000) /* lateness not counted as a stall */

static pthread_mutex_t run_life = PTHREAD_MUTEX_INITIALIZER; /* a whole start or stop */
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER; /* the ticker's wait, writers */
static pthread_cond_t run_cond;
static pthread_t run_thread;
static int run_users; /* under run_life */
static int run_quit;  /* under run_lock */
/* Written under run_lock inside an odd run_seq; read lock-free. */
static atomic_uint_fast64_t run_seq;
static _Atomic int64_t run_stalled; /* ns recorded as stalled */
static _Atomic int64_t run_last;    /* the ticker's last wake-up (ns; 0: no ticker) */
static _Atomic int64_t run_stall_at, run_stall_ns; /* the last stall seen: its end, its length */

/* The stall between a wake-up at `last` and now. */
static int64_t pending_stall(int64_t last, int64_t now)
{
	const int64_t late = last ? now - last - RUN_TICK_NS - RUN_SLACK_NS : 0;
	return late > 0 ? late : 0;
}

/* Writer side (caller holds run_lock): open, then close, a write. */
static void seq_open(void)
{
	const uint_fast64_t q = atomic_load_explicit(&run_seq, memory_order_relaxed);
	atomic_store_explicit(&run_seq, q + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst); /* before the fields, and the clock's read */
}

static void seq_close(void)
{
	const uint_fast64_t q = atomic_load_explicit(&run_seq, memory_order_relaxed);
	atomic_store_explicit(&run_seq, q + 1, memory_order_release);
}

void kiln_run_clock_read(int64_t *mono, int64_t *run, int64_t *stalled)
{
	uint_fast64_t q0, q1;
	int64_t now, st, last;
	do {
		q0 = atomic_load_explicit(&run_seq, memory_order_acquire);
		st = atomic_load_explicit(&run_stalled, memory_order_relaxed);
		last = atomic_load_explicit(&run_last, memory_order_relaxed);
		now = kiln_now_ns();
		atomic_thread_fence(memory_order_acquire);
		q1 = atomic_load_explicit(&run_seq, memory_order_relaxed);
	} while ((q0 & 1) || q0 != q1);
	const int64_t s = st + pending_stall(last, now);
	if (mono)
		*mono = now;
	if (run)
		*run = now - s;
	if (stalled)
		*stalled = s;
}

int64_t kiln_run_ns(void)
{
	int64_t r;
	kiln_run_clock_read(NULL, &r, NULL);
	return r;
}

int64_t kiln_run_stalled_ns(void)
{
	int64_t s;
	kiln_run_clock_read(NULL, NULL, &s);
	return s;
}

int64_t kiln_run_last_stall(int64_t *len_ns)
{
	uint_fast64_t q0, q1;
	int64_t at, len;
	do {
		q0 = atomic_load_explicit(&run_seq, memory_order_acquire);
		at = atomic_load_explicit(&run_stall_at, memory_order_relaxed);
		len = atomic_load_explicit(&run_stall_ns, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		q1 = atomic_load_explicit(&run_seq, memory_order_relaxed);
	} while ((q0 & 1) || q0 != q1);
	*len_ns = len;
	return at;
}

/* One wake-up's bookkeeping (caller holds run_lock). */
static void ticker_record(void)
{
	seq_open();
	const int64_t now = kiln_now_ns(); /* (inside the write: see the top) */
	const int64_t last = atomic_load_explicit(&run_last, memory_order_relaxed);
	const int64_t late = pending_stall(last, now);
	if (late) {
		atomic_store_explicit(&run_stalled,
				      atomic_load_explicit(&run_stalled, memory_order_relaxed) + late,
				      memory_order_relaxed);
		atomic_store_explicit(&run_stall_at, now, memory_order_relaxed);
		atomic_store_explicit(&run_stall_ns, now - last - RUN_TICK_NS, memory_order_relaxed);
	}
	atomic_store_explicit(&run_last, now, memory_order_relaxed);
	seq_close();
}

/* Set run_last (caller holds run_lock): now at the ticker's start, 0 at
 * its end. */
static void set_last(int on)
{
	seq_open();
	atomic_store_explicit(&run_last, on ? kiln_now_ns() : 0, memory_order_relaxed);
	seq_close();
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
		ticker_record();
	}
	pthread_mutex_unlock(&run_lock);
	return NULL;
}

kiln_status kiln_run_clock_start(void)
{
	kiln_status st = KILN_OK;
	pthread_mutex_lock(&run_life);
	if (run_users++ == 0) {
		/* no ticker runs (run_life): the condition is no one's */
		pthread_condattr_t ca;
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&run_cond, &ca);
		pthread_condattr_destroy(&ca);
		pthread_mutex_lock(&run_lock);
		run_quit = 0;
		set_last(1);
		pthread_mutex_unlock(&run_lock);
		const int rc = pthread_create(&run_thread, NULL, run_ticker, NULL);
		if (rc) {
			run_users = 0;
			pthread_mutex_lock(&run_lock);
			set_last(0);
			pthread_mutex_unlock(&run_lock);
			pthread_cond_destroy(&run_cond);
			st = kiln_error(KILN_EIO, "starting the run clock's thread: %s", strerror(rc));
		}
	}
	pthread_mutex_unlock(&run_life);
	return st;
}

void kiln_run_clock_stop(void)
{
	pthread_mutex_lock(&run_life);
	if (run_users == 0 || --run_users > 0) {
		pthread_mutex_unlock(&run_life);
		return;
	}
	pthread_mutex_lock(&run_lock);
	run_quit = 1;
	pthread_cond_signal(&run_cond);
	pthread_mutex_unlock(&run_lock);
	pthread_join(run_thread, NULL); /* (run_life held: no start meanwhile) */
	pthread_mutex_lock(&run_lock);
	set_last(0); /* the stalled time recorded stays: the clock goes on */
	pthread_mutex_unlock(&run_lock);
	pthread_cond_destroy(&run_cond);
	pthread_mutex_unlock(&run_life);
}
