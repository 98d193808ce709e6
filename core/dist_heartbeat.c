/* core/dist_heartbeat.c - the heartbeat watchdog of a data-parallel run
 * ([dist] heartbeat, docs/distributed.md "Failures").
 *
 * Every rank runs a thread with a connection of its own to the store.
 * Every heartbeat/4 seconds it adds 1 to kiln/hb/RANK and reads every
 * peer's counter.  A peer whose counter has not moved for [dist] heartbeat
 * seconds is stopped (SIGSTOP), frozen, or cut off from rank 0 by the
 * network; the store not answering within that time means rank 0 (which
 * hosts it) or the link to its host is.  Either ends this rank through the
 * host's fatal handler (`kiln train` exits non-zero) with a message naming
 * the rank and its host name (each rank posts it as kiln/host/RANK in the
 * rendezvous, once its claim of the rank is won), long before [dist] timeout would.  The thread runs
 * outside the training loop, so a long step is no false alarm; a rank whose
 * process is alive but whose training thread is stuck is still caught only
 * by [dist] timeout.  A rank that finished sets its counter negative, and
 * its peers stop watching it.
 *
 * [dist] heartbeat may differ between ranks: each rank posts its own
 * (kiln/hb_limit/RANK, milliseconds, 0 for off) before the config check,
 * and a peer is judged by the limit it posted, not by this rank's (before
 * session 34 a rank at heartbeat = 4 called a healthy peer at 60, beating
 * every 15 s, silent after 4 s; a peer at 0 never beats and is not
 * watched for silence).  A rank that fails with its own error after the
 * rendezvous marks its counter FAILED (kiln_dist_close), and its peers'
 * watchdogs end them at their next beat naming it, whatever its
 * heartbeat, instead of calling it silent or a collective's failure
 * anonymous (session 34).
 */
#include "dist_impl.h"
#include "store.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <time.h>
#include <unistd.h>

#define DONE_MARK (INT64_C(1) << 60) /* subtracted from a finished rank's counter */
#define FAIL_MARK (INT64_C(1) << 62) /* subtracted from a failed rank's counter */
/* a counter below this is a failed rank's (a done one's is above
 * -DONE_MARK, as beats are far fewer than 2^59) */
#define FAILED_BELOW (-(DONE_MARK + DONE_MARK / 2))

struct kiln_heartbeat {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int quit, started;
	int leaving;     /* kiln_heartbeat_leave: beat, but end this rank no more (under lock) */
	struct kiln_store *q; /* the watchdog's own connection */
	int rank, world;
	int limit_ms, period_ms;
	char master[256];
	int port;
	int64_t *count;  /* each rank's last counter seen ... */
	int64_t *moved;  /* ... and when it last moved (ms; under lock) */
	int *limit;      /* each peer's own [dist] heartbeat (ms; 0: not watched) */
	int64_t beaten;  /* when this rank's last beat completed (ms; under lock) */
	char (*host)[64];
};

/* the run clock (core/run_clock.c): a job suspended whole is no silence
 * of its peers once it runs again (session 33) */
static int64_t mono_ms(void)
{
	return kiln_run_ns() / 1000000;
}

/* The peers' host names, posted in the rendezvous once each rank's claim
 * was won ("?" if unread), and their own [dist] heartbeat, posted before
 * the config check every rank passed before this thread started (unread:
 * this rank's); under the lock, as kiln_heartbeat_silent hands them to
 * the training thread. */
/* Peer r's posted [dist] heartbeat into h->limit[r] (ms; 0: off), or
 * LIMIT_UNKNOWN while it has posted none: the watchdog starts right after
 * the rendezvous, which a peer may have left a moment later than this
 * rank, before its post (kiln_dist_open); such a peer is not judged
 * until its limit is read, at a later beat. */
#define LIMIT_UNKNOWN (-1)
static void read_limit(struct kiln_heartbeat *h, int r)
{
	char key[48];
	void *v = NULL;
	int limit = LIMIT_UNKNOWN;
	snprintf(key, sizeof key, "kiln/hb_limit/%d", r);
	if (!kiln_store_check(h->q, key, &v, NULL) && v)
		limit = atoi(v) > 0 ? atoi(v) : 0;
	free(v);
	pthread_mutex_lock(&h->lock);
	h->limit[r] = limit;
	pthread_mutex_unlock(&h->lock);
}

static void read_hosts(struct kiln_heartbeat *h)
{
	for (int r = 0; r < h->world; r++) {
		char key[48], name[64] = "?";
		void *v = NULL;
		snprintf(key, sizeof key, "kiln/host/%d", r);
		if (!kiln_store_check(h->q, key, &v, NULL) && v)
			snprintf(name, sizeof name, "%s", (const char *)v);
		free(v);
		pthread_mutex_lock(&h->lock);
		memcpy(h->host[r], name, sizeof name);
		pthread_mutex_unlock(&h->lock);
		if (r != h->rank)
			read_limit(h, r);
	}
}

/* a peer's beat period: a quarter of its own [dist] heartbeat */
static int peer_period(const struct kiln_heartbeat *h, int r)
{
	return h->limit[r] / 4 > 0 ? h->limit[r] / 4 : 1;
}

#define FAIL_LOOK_MS 1000 /* how often the watchdog reads kiln/failed_rank */

#define LEFT_POST_MS 2000 /* post_left's store calls, each */

/* This rank's leaving counted (kiln/left; kiln/left_all once every rank
 * left) before the fatal handler ends the process, as kiln_dist_close
 * counts it: rank 0 waits there for every rank to leave before it stops
 * the store, and a rank ended here never reached it.  Before session 35
 * rank 0, failed at its data while rank 1 still scanned its own, waited
 * 10 s for rank 1, whose watchdog had ended it naming rank 0, before it
 * printed its own error (under kiln launch the launcher's stop came
 * first).  Only where the handler ends the process (a host with none
 * goes on, and leaves through kiln_dist_close, counted there); bounded,
 * a store cut off must not hold the end. */
static void post_left(struct kiln_heartbeat *h)
{
	int64_t n = 0;
	if (!kiln_host_fatal_ends() ||
	    kiln_store_add_within(h->q, "kiln/left", 1, &n, LEFT_POST_MS))
		return;
	if (n == h->world)
		kiln_store_set_within(h->q, "kiln/left_all", "1", 1, LEFT_POST_MS);
}

/* End this rank through the host's fatal handler with the message,
 * unless its own error path began (kiln_heartbeat_leave): decided and
 * done under the lock, so once kiln_heartbeat_leave returned no end
 * starts, and the rank tells its own error, not a peer's (review of
 * session 34: two ranks failing at once on the same bad file, one exited
 * naming the other, whose FAILED mark its watchdog read during its
 * teardown, and never printed its own).  store_up: the store answers,
 * and this rank's leaving is counted there first (post_left). */
static void end_rank(struct kiln_heartbeat *h, int store_up, const char *fmt, ...)
{
	char msg[KILN_ERROR_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&h->lock);
	if (!h->leaving) {
		if (store_up)
			post_left(h);
		kiln_host_fatal("dist", "%s", msg);
	}
	pthread_mutex_unlock(&h->lock);
}

/* Peer r failed with its own error: end this rank naming it.  Rank 0
 * hosts the store, which ends with it: it first gives the other ranks
 * two of their looks (FAIL_LOOK_MS) to read kiln/failed_rank, else those
 * that looked later found the store gone and blamed rank 0 (review of
 * session 34). */
static void peer_failed(struct kiln_heartbeat *h, int r)
{
	char said[FAILED_SAID_MAX];
	if (h->rank == 0 && h->world > 2)
		usleep(2 * FAIL_LOOK_MS * 1000);
	kiln_dist_failed_said(h->q, r, said, sizeof said);
	end_rank(h, 1, "rank %d of %d: watchdog: rank %d (host %s) failed with its own error (its log says why); ending this rank%s",
		 h->rank, h->world, r, h->host[r], said);
}

/* One beat: bump this rank's counter, read the peers'.  Returns 0, or 1
 * after reporting a silent peer or an unreachable store. */
static int beat(struct kiln_heartbeat *h)
{
	char key[48];
	int64_t v;
	snprintf(key, sizeof key, "kiln/hb/%d", h->rank);
	kiln_status st = kiln_store_add(h->q, key, 1, &v);
	/* leaving with its own error: this rank still beats (its teardown
	 * is no silence to its peers) but judges no peer any more */
	pthread_mutex_lock(&h->lock);
	const int leaving = h->leaving;
	pthread_mutex_unlock(&h->lock);
	if (leaving)
		return !!st;
	for (int r = 0; !st && r < h->world; r++) {
		if (r == h->rank || h->count[r] < 0)
			continue;
		snprintf(key, sizeof key, "kiln/hb/%d", r);
		if ((st = kiln_store_add(h->q, key, 0, &v)))
			break;
		/* a limit read only now (LIMIT_UNKNOWN until the peer's
		 * post): its clock starts here, as at a move (judged at once,
		 * a peer posted but not beaten yet was silent for this rank's
		 * whole period: review of session 34) */
		const int unknown = h->limit[r] == LIMIT_UNKNOWN;
		if (unknown)
			read_limit(h, r);
		const int64_t now = mono_ms();
		if (v < FAILED_BELOW) {
			peer_failed(h, r);
			return 1;
		}
		if (v != h->count[r] || h->limit[r] <= 0 || unknown) {
			pthread_mutex_lock(&h->lock);
			h->count[r] = v;
			h->moved[r] = now;
			pthread_mutex_unlock(&h->lock);
		} else if (now - h->moved[r] > h->limit[r]) {
			/* (the limit the peer posted: its own heartbeat) */
			end_rank(h, 1, "rank %d of %d: watchdog: rank %d (host %s) sent no heartbeat for %.1f s ([dist] heartbeat = %g s): it is stopped, frozen or unreachable; ending this rank",
				 h->rank, h->world, r, h->host[r], (now - h->moved[r]) / 1000.0,
				 h->limit[r] / 1000.0);
			return 1;
		}
	}
	/* out of memory for the store's answer (core/store.c read_reply):
	 * the connection is in step and the store is there; this beat is
	 * skipped, the next tries again (review of session 39: it said the
	 * store on rank 0 was gone) */
	if (st == KILN_ENOMEM)
		return 0;
	if (st) {
		end_rank(h, 0, "rank %d of %d: watchdog: the store on rank 0 (host %s, " KILN_AT_FMT ") is gone or did not answer within [dist] heartbeat = %g s: rank 0 or the link to its host is stopped, dead or unreachable; ending this rank (%s)",
			 h->rank, h->world, h->host[0], KILN_AT_ARG(h->master, h->port),
			 h->limit_ms / 1000.0, kiln_last_error());
		return 1;
	}
	pthread_mutex_lock(&h->lock);
	h->beaten = mono_ms();
	pthread_mutex_unlock(&h->lock);
	return 0;
}

/* One look for kiln_heartbeat_silent: the silent peers (into out, up to
 * max) and *peers, *late (ms until the first peer that missed a beat
 * would be silent; INT64_MAX: none) and *self_ms (how long ago this
 * rank's last beat got through; -1 never). */
static int silent_look(struct kiln_heartbeat *h, struct kiln_hb_silent *out,
		       int max, int *peers, int64_t *late, int64_t *self_ms)
{
	int n = 0;
	*peers = 0;
	*late = INT64_MAX;
	pthread_mutex_lock(&h->lock);
	const int64_t now = mono_ms();
	*self_ms = h->beaten ? now - h->beaten : -1;
	for (int r = 0; r < h->world; r++) {
		if (r == h->rank || h->count[r] < 0 || h->limit[r] <= 0)
			continue;
		/* its beats' gap, as this rank reads them: its period and
		 * this rank's (the two differ with the heartbeats) */
		const int64_t p = peer_period(h, r);
		const int64_t quiet = p + h->period_ms + 500;
		const int64_t age = now - h->moved[r];
		++*peers;
		/* (every silent peer counted, the first max named: past max
		 * one was taken for late, `late` negative, and the wait never
		 * ended, nor "every peer silent" with more than max peers:
		 * review of session 32) */
		if (age > quiet) {
			if (n < max) {
				out[n].rank = r;
				out[n].age_ms = age;
				memcpy(out[n].host, h->host[r], sizeof out->host);
			}
			n++;
		} else if (age > p + 500 && quiet - age < *late) {
			*late = quiet - age;
		}
	}
	pthread_mutex_unlock(&h->lock);
	return n;
}

#define SILENT_WAIT_MS 3000 /* the longest kiln_heartbeat_silent watches a late peer */

int kiln_heartbeat_silent(struct kiln_heartbeat *h, struct kiln_hb_silent *out, int max,
			  int *period_ms, int64_t *self_ms)
{
	*self_ms = -1;
	if (!h)
		return KILN_HB_OFF;
	*period_ms = h->period_ms;
	/* A peer's counter is seen to move at this rank's first read after
	 * its beat, up to a beat later: a healthy peer's every beat, or
	 * every second one when its beat and the read cross (jitter); so
	 * older than two beats and a margin, it stopped.  A peer that
	 * stopped is seen to as late as a beat after it did: at a timeout
	 * shorter than three beats it may only be late yet, so a late peer
	 * is watched until it is silent or moves, when that is due within
	 * SILENT_WAIT_MS (a long heartbeat's beats are far apart: the failed
	 * rank does not wait for them; the watchdog itself may end the rank
	 * meanwhile, naming the peer). */
	const int64_t quiet = 2 * (int64_t)h->period_ms + 500; /* (each peer's: silent_look) */
	const int64_t end = mono_ms() + SILENT_WAIT_MS;
	for (;;) {
		int peers;
		int64_t late;
		const int n = silent_look(h, out, max, &peers, &late, self_ms);
		/* its own beats late: this rank's side or the store's, it
		 * cannot tell the peers'; every peer silent at once: not one
		 * peer's doing (each said apart, session 32: both read "every
		 * rank beat") */
		if (*self_ms < 0 || *self_ms > quiet)
			return KILN_HB_SELF_LATE;
		if (n == peers && peers > 1)
			return KILN_HB_ALL_SILENT;
		if (late > end - mono_ms())
			return n < max ? n : max;
		usleep(100 * 1000);
	}
}


static int64_t mono_clock_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait ms on the condition variable (its clock monotonic), under the lock,
 * until then or a quit. */
static void wait_ms(struct kiln_heartbeat *h, int64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	int64_t ns = ts.tv_nsec + ms * 1000000;
	ts.tv_sec += (time_t)(ns / 1000000000);
	ts.tv_nsec = (long)(ns % 1000000000);
	while (!h->quit && pthread_cond_timedwait(&h->cond, &h->lock, &ts) != ETIMEDOUT)
		;
}

/* Between beats: a peer that failed with its own error (kiln_dist_close
 * posted kiln/failed_rank) ends this rank, naming it, within
 * FAIL_LOOK_MS (at its counter's FAILED mark alone, a rank at
 * heartbeat = 60 waited up to 15 s).  Returns 1 when it did. */
static int failed_look(struct kiln_heartbeat *h)
{
	void *v = NULL;
	int r = -1;
	pthread_mutex_lock(&h->lock);
	const int leaving = h->leaving;
	pthread_mutex_unlock(&h->lock);
	if (leaving)
		return 0;
	if (!kiln_store_check(h->q, "kiln/failed_rank", &v, NULL) && v)
		r = atoi(v);
	free(v);
	if (r < 0 || r >= h->world || r == h->rank)
		return 0;
	peer_failed(h, r);
	return 1;
}

static void *heartbeat_main(void *arg)
{
	struct kiln_heartbeat *h = arg;
	prctl(PR_SET_NAME, "kiln-heartbeat");
	read_hosts(h);
	pthread_mutex_lock(&h->lock);
	while (!h->quit) {
		pthread_mutex_unlock(&h->lock);
		int stop = beat(h);
		pthread_mutex_lock(&h->lock);
		if (stop)
			break;
		/* a monotonic deadline (the condition variable's clock): a
		 * wall-clock step back (NTP, chrony) held the beat for the
		 * step's length, and the peers called this rank silent */
		const int64_t next = mono_clock_ms() + h->period_ms;
		for (int64_t now; !h->quit && (now = mono_clock_ms()) < next;) {
			/* a peer's failure is looked for every FAIL_LOOK_MS
			 * between beats, which a long heartbeat spaces far */
			wait_ms(h, next - now < FAIL_LOOK_MS ? next - now : FAIL_LOOK_MS);
			if (!h->quit && mono_clock_ms() < next) {
				pthread_mutex_unlock(&h->lock);
				stop = failed_look(h);
				pthread_mutex_lock(&h->lock);
				if (stop)
					break;
			}
		}
		if (stop)
			break;
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

kiln_status kiln_heartbeat_start(const struct kiln_dist_env *env, const char *master, int port,
				 double heartbeat_s, struct kiln_heartbeat **out)
{
	*out = NULL;
	if (heartbeat_s <= 0 || env->world < 2)
		return KILN_OK;
	struct kiln_heartbeat *h = calloc(1, sizeof *h);
	kiln_status st;
	if (!h)
		return kiln_error(KILN_ENOMEM, "out of memory");
	pthread_mutex_init(&h->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* heartbeat_main's deadlines */
	pthread_cond_init(&h->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (!(h->count = calloc((size_t)env->world, sizeof *h->count)) ||
	    !(h->moved = calloc((size_t)env->world, sizeof *h->moved)) ||
	    !(h->host = calloc((size_t)env->world, sizeof *h->host)) ||
	    !(h->limit = calloc((size_t)env->world, sizeof *h->limit))) {
		kiln_heartbeat_stop(h, 0);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	h->rank = env->rank;
	h->world = env->world;
	h->limit_ms = (int)(heartbeat_s * 1000);
	h->period_ms = h->limit_ms / 4 > 0 ? h->limit_ms / 4 : 1;
	for (int r = 0; r < h->world; r++)
		h->limit[r] = h->limit_ms; /* until read_hosts reads the peers' */
	h->port = port;
	snprintf(h->master, sizeof h->master, "%s", master);
	if ((st = kiln_store_open_for(master, port, 0, env->rank, env->world, h->limit_ms,
				      "[dist] heartbeat", "heartbeat", &h->q))) {
		kiln_heartbeat_stop(h, 0);
		return st; /* (its message names "rank R's heartbeat connection") */
	}
	const int64_t now = mono_ms();
	for (int r = 0; r < h->world; r++)
		h->moved[r] = now;
	int rc = pthread_create(&h->thread, NULL, heartbeat_main, h);
	if (rc) {
		kiln_heartbeat_stop(h, 0);
		return kiln_error(KILN_EIO, "rank %d of %d: starting the heartbeat thread: %s",
				  env->rank, env->world, strerror(rc));
	}
	h->started = 1;
	*out = h;
	return KILN_OK;
}

void kiln_heartbeat_leave(struct kiln_heartbeat *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->lock);
	h->leaving = 1;
	pthread_mutex_unlock(&h->lock);
}

void kiln_heartbeat_stop(struct kiln_heartbeat *h, int finished)
{
	if (!h)
		return;
	if (h->started) {
		pthread_mutex_lock(&h->lock);
		h->quit = 1;
		pthread_cond_signal(&h->cond);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->thread, NULL);
	}
	if (h->q && finished) {
		char key[48];
		snprintf(key, sizeof key, "kiln/hb/%d", h->rank);
		kiln_store_add(h->q, key, -DONE_MARK, NULL);
	}
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
	kiln_store_close(h->q);
	free(h->count);
	free(h->moved);
	free(h->host);
	free(h->limit);
	free(h);
}

kiln_status kiln_heartbeat_post(struct kiln_store *s, int rank, double heartbeat_s)
{
	char key[48], v[24];
	const int ms = heartbeat_s > 0 ? (int)(heartbeat_s * 1000) : 0;
	const int n = snprintf(v, sizeof v, "%d", ms);
	snprintf(key, sizeof key, "kiln/hb_limit/%d", rank);
	return kiln_store_set(s, key, v, (size_t)n);
}

void kiln_heartbeat_mark_failed(struct kiln_store *s, int rank, int timeout_ms)
{
	char key[48];
	snprintf(key, sizeof key, "kiln/hb/%d", rank);
	kiln_store_add_within(s, key, -FAIL_MARK, NULL, timeout_ms);
}
