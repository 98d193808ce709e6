/* bench/c2c_latency.c - the round trip of one cache line between two CPUs:
 * how far apart the machine has put them right now.
 *
 * Two threads, pinned to CPUs A and B (--cpus A,B; default 0,1), hand a
 * counter back and forth through one 64-byte line, --iters times a round,
 * --rounds rounds; each round prints its mean round trip in ns, and the
 * last line is a JSON object with the rounds' median.  On a many-core CPU
 * a round trip inside one shared last-level cache takes tens of ns and one
 * between two such caches (AMD's CCDs, two sockets) several times that.
 * On session 48's 2-vCPU Zen 4 VM the two vCPUs alternated, for tens of
 * seconds at a time, between ~70 ns and ~340 ns, and every one-epoch MLP
 * run of kiln beside a ~340 ns reading ran at two thirds of its speed
 * (docs/PERFORMANCE.md, "Session 48: the VM's two speeds are the vCPUs'
 * distance").
 *
 * Usage: bench/c2c_latency [--cpus A,B] [--iters N] [--rounds R]
 * Exit 1, with a message, when A or B is not in the process's affinity
 * mask (`taskset -c 0 bench/c2c_latency`) or a thread cannot be pinned or
 * started; 2 on bad arguments (the same CPU twice included), before any
 * affinity check. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_ROUNDS = 1000 };

static _Alignas(64) atomic_long line;
static long iters = 100000;
static int cpu_a, cpu_b = 1;

static int pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* B's side (started on CPU B): wait for each odd value, answer with the
 * next even one */
static void *answer(void *arg)
{
	long base = *(long *)arg;
	for (long i = 0; i < iters; i++) {
		long want = base + 2 * i + 1;
		while (atomic_load_explicit(&line, memory_order_acquire) != want)
			;
		atomic_store_explicit(&line, want + 1, memory_order_release);
	}
	return NULL;
}

/* one round: its mean round trip in ns, or a negative value on failure */
static double round_ns(long base)
{
	pthread_t t;
	pthread_attr_t attr;
	cpu_set_t s;
	struct timespec t0, t1;
	atomic_store(&line, base);
	CPU_ZERO(&s);
	CPU_SET(cpu_b, &s);
	/* pinned from its start: a thread that cannot run on B is not started */
	if (pthread_attr_init(&attr) != 0)
		return -1;
	int rc = pthread_attr_setaffinity_np(&attr, sizeof s, &s);
	if (rc == 0)
		rc = pthread_create(&t, &attr, answer, &base);
	pthread_attr_destroy(&attr);
	if (rc != 0)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0; i < iters; i++) {
		atomic_store_explicit(&line, base + 2 * i + 1, memory_order_release);
		while (atomic_load_explicit(&line, memory_order_acquire) != base + 2 * i + 2)
			;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	pthread_join(t, NULL);
	return ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)iters;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int rounds = 5;
	static double ns[MAX_ROUNDS];
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cpus") == 0 && i + 1 < argc &&
		    sscanf(argv[i + 1], "%d,%d", &cpu_a, &cpu_b) == 2 && cpu_a >= 0 && cpu_b >= 0)
			i++;
		else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc && (iters = atol(argv[i + 1])) > 0)
			i++;
		else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc &&
			 (rounds = atoi(argv[i + 1])) > 0 && rounds <= MAX_ROUNDS)
			i++;
		else {
			fprintf(stderr, "usage: %s [--cpus A,B] [--iters N > 0] [--rounds 1-%d]\n",
				argv[0], MAX_ROUNDS);
			return 2;
		}
	}
	if (cpu_a == cpu_b) {
		fprintf(stderr, "c2c_latency: --cpus needs two different CPUs, not %d and %d\n", cpu_a, cpu_b);
		return 2;
	}
	/* both CPUs must be in the mask the process was given (taskset, a
	 * cpuset): pinning a thread outside it succeeds where the cpuset
	 * allows it and would measure CPUs the caller excluded */
	cpu_set_t allowed;
	if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
		perror("c2c_latency: sched_getaffinity");
		return 1;
	}
	for (int k = 0; k < 2; k++) {
		int c = k ? cpu_b : cpu_a;
		if (c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed)) {
			fprintf(stderr, "c2c_latency: CPU %d is not in this process's affinity mask "
					"(it allows %d CPU%s); choose two it allows with --cpus A,B\n",
				c, CPU_COUNT(&allowed), CPU_COUNT(&allowed) == 1 ? "" : "s");
			return 1;
		}
	}
	if (pin(cpu_a) != 0) {
		fprintf(stderr, "c2c_latency: cannot pin to CPU %d\n", cpu_a);
		return 1;
	}
	for (int r = 0; r < rounds; r++) {
		ns[r] = round_ns((long)r * 2 * iters);
		if (ns[r] < 0) {
			fprintf(stderr, "c2c_latency: cannot start a thread on CPU %d\n", cpu_b);
			return 1;
		}
		printf("round %d: %.1f ns a round trip, CPU %d <-> %d\n", r + 1, ns[r], cpu_a, cpu_b);
	}
	qsort(ns, (size_t)rounds, sizeof ns[0], cmp_double);
	printf("{\"cpus\": [%d, %d], \"iters\": %ld, \"rounds\": %d, \"round_trip_ns_median\": %.1f, "
	       "\"round_trip_ns_min\": %.1f, \"round_trip_ns_max\": %.1f}\n",
	       cpu_a, cpu_b, iters, rounds, ns[rounds / 2], ns[0], ns[rounds - 1]);
	return 0;
}
