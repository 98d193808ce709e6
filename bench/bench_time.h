/* bench/bench_time.h - the clocks and the sort order the C benches share:
 * wall time (CLOCK_MONOTONIC), the process's and the calling thread's CPU
 * time (other processes' load does not stretch them) and doubles ascending
 * for a median by qsort. */
#ifndef KILN_BENCH_TIME_H
#define KILN_BENCH_TIME_H
#include <time.h>

static inline double bench_clock(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double now(void) { return bench_clock(CLOCK_MONOTONIC); }
static inline double cpu_now(void) { return bench_clock(CLOCK_PROCESS_CPUTIME_ID); }
static inline double thread_cpu_now(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }

static inline int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}
#endif
