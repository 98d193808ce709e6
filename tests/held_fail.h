/* tests/held_fail.h - a stream held and then failed, for the tests of
 * what happens to the work queued behind a failure: a host function,
 * first on the stream, waits until it is let go and then fails the stream
 * with a message of the test's (KILN_EIO).  tests/check_comm.c (a
 * communicator's job slots, its close), tests/mpi_coll.c (the MPI pool)
 * and tests/check_device_stream.c (KILN_PROC_HOST_FN_SKIP).
 *
 *	struct held_fail h;
 *	held_fail_hold(&h, dev, stream, "the planned failure");
 *	... enqueue work behind it ...
 *	held_fail_release(&h);            (now), or
 *	held_fail_release_after(&h, us);  (a thread, us later) ...
 *	held_fail_join(&h);
 */
#ifndef KILN_TESTS_HELD_FAIL_H
#define KILN_TESTS_HELD_FAIL_H
#include <kiln/kiln.h>
#include <kiln/plugin.h> /* kiln_host_table */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

struct held_fail {
	atomic_int go;      /* set: the host function fails the stream */
	unsigned hold_us;   /* held_fail_release_after's delay */
	int thread;         /* a release thread to join */
	pthread_t rel;
	char msg[200];      /* the failure's message */
};

/* the stream's task: held until h->go, then the failure */
static inline kiln_status held_fail_fn(void *arg)
{
	struct held_fail *h = arg;
	while (!atomic_load(&h->go))
		usleep(200);
	return kiln_host_table()->error(KILN_EIO, "%s", h->msg);
}

/* Holds stream s of dev with h (its failure's message printf's fmt): the
 * host function's enqueue's status.  h must outlive the stream's run of
 * it. */
static inline __attribute__((format(printf, 4, 5))) kiln_status
held_fail_hold(struct held_fail *h, struct kiln_device *dev, void *s, const char *fmt, ...)
{
	va_list ap;
	atomic_store(&h->go, 0);
	h->thread = 0;
	va_start(ap, fmt);
	vsnprintf(h->msg, sizeof h->msg, fmt, ap);
	va_end(ap);
	return kiln_host_table()->device_host_fn(dev, s, held_fail_fn, h);
}

/* Lets the stream go: it fails */
static inline void held_fail_release(struct held_fail *h)
{
	atomic_store(&h->go, 1);
}

static inline void *held_fail_release_thread(void *arg)
{
	struct held_fail *h = arg;
	usleep(h->hold_us);
	held_fail_release(h);
	return NULL;
}

/* Lets the stream go from a thread, us microseconds after its start: 0,
 * or -1 where the thread could not start (the stream let go now). */
static inline int held_fail_release_after(struct held_fail *h, unsigned us)
{
	h->hold_us = us;
	h->thread = !pthread_create(&h->rel, NULL, held_fail_release_thread, h);
	if (!h->thread)
		held_fail_release(h);
	return h->thread ? 0 : -1;
}

/* Waits for the release thread (if any): the stream let go */
static inline void held_fail_join(struct held_fail *h)
{
	if (h->thread)
		pthread_join(h->rel, NULL);
	h->thread = 0;
}

/* Whether the stream was let go */
static inline int held_fail_released(struct held_fail *h)
{
	return atomic_load(&h->go);
}
#endif
