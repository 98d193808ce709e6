/* plugins/common/watchdog.c - see watchdog.h. */
#include "watchdog.h"

#include <time.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */

/* the core's run clock (host table version 7), set by comm_plugin_init */
static int64_t (*watchdog_clock)(void);

void watchdog_use_host(const struct kiln_host *host)
{
	watchdog_clock = host->version >= 7 ? host->run_ns : NULL;
}

long long watchdog_now_ns(void)
{
	if (watchdog_clock)
		return (long long)watchdog_clock();
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void *watchdog_main(void *arg)
{
	struct watchdog *w = arg;
	prctl(PR_SET_NAME, "kiln-watchdog");
	pthread_mutex_lock(&w->lock);
	while (!w->quit) {
		struct timespec ts;
		/* monotonic, the condition variable's clock (watchdog_init): a
		 * wall-clock step back stopped the looks for the step's length */
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 100000000; /* ten looks a second */
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&w->cond, &w->lock, &ts);
		if (w->quit || w->look(w->arg))
			break;
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

void watchdog_init(struct watchdog *w)
{
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &ca);
	pthread_condattr_destroy(&ca);
	w->on = w->quit = 0;
}

int watchdog_start(struct watchdog *w, int (*look)(void *arg), void *arg)
{
	w->look = look;
	w->arg = arg;
	int rc = pthread_create(&w->thread, NULL, watchdog_main, w);
	w->on = !rc;
	return rc;
}

void watchdog_destroy(struct watchdog *w)
{
	if (w->on) {
		pthread_mutex_lock(&w->lock);
		w->quit = 1;
		pthread_cond_broadcast(&w->cond);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		w->on = 0;
	}
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
}
