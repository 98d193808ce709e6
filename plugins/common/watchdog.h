/* plugins/common/watchdog.h - the watchdog thread of the MPI and NCCL
 * communicators, compiled into each plugin (plugins/local.mk), never
 * exported (plugins build with hidden visibility).
 *
 * A thread that wakes ten times a second (or when signalled) and calls
 * look(arg) with w->lock held; look may unlock to report (host->fatal)
 * but returns with the lock held again, nonzero to end the thread.  The
 * plugin may take w->lock itself to share state with look (NCCL's ring of
 * pending collectives). */
#ifndef KILN_PLUGINS_COMMON_WATCHDOG_H
#define KILN_PLUGINS_COMMON_WATCHDOG_H

#include <pthread.h>

#include <kiln/plugin.h>

struct watchdog {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int on, quit;
	int (*look)(void *arg);
	void *arg;
};

/* Initialise w's lock and condition (before anything takes w->lock). */
void watchdog_init(struct watchdog *w);

/* Start the thread; 0, or pthread_create's error number. */
int watchdog_start(struct watchdog *w, int (*look)(void *arg), void *arg);

/* End the thread (when started) and destroy the lock and condition. */
void watchdog_destroy(struct watchdog *w);

/* The clock of the communicators' deadlines, in nanoseconds: the core's
 * run clock (host table version 7: CLOCK_MONOTONIC less the time the
 * whole process stood still, so that a job suspended whole past [dist]
 * timeout does not fail on resume) once watchdog_use_host saw it, else
 * CLOCK_MONOTONIC. */
long long watchdog_now_ns(void);

/* Use host's run clock where it has one (comm_plugin_init calls it). */
void watchdog_use_host(const struct kiln_host *host);

#endif
