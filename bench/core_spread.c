/* bench/core_spread.c - how much the same fixed work costs on each core of
 * this machine, step by step: the floor under a pipeline's bubble.
 *
 * A pipeline of P stages on P cores pays, every step, for its slowest
 * stage (docs/pipeline.md, the `spread` column of the ranks' timing
 * lines).  This bench takes kiln out of it: P processes, one pinned to
 * each of cores 0..P-1, run the same calibrated work ("passes" of about
 * --pass-ms each, --passes a step, --steps steps, all starting together)
 * and report each step's CPU time (CLOCK_THREAD_CPUTIME_ID: what the core
 * gave the thread, preemption excluded) and its spread across the
 * processes, (max - min) / mean, as pipe_timing.c computes it for stages.
 *
 * Kernels (--kernel): fma (8 dependent multiply-add chains in registers:
 * the core's latency-bound speed), fmatp (12 independent AVX2 FMA chains
 * where the CPU has them: the FMA units at full throughput, which a
 * hyper-thread sibling on the host would share), l2 (sums over 128 KiB: the core and
 * its private caches), l3 (sums over 4 MiB: the shared last-level cache),
 * mem (sums over 64 MiB: the memory system).
 *
 * Usage: bench/core_spread [--procs P] [--kernel fma|fmatp|l2|l3|mem] [--pass-ms T]
 *                          [--passes M] [--steps S]
 * Prints one line per kernel run: each process's median step CPU ms, the
 * per-step spread's median and 90th percentile, and the wall/CPU ratio. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bench_time.h"

enum { MAX_PROCS = 16, MAX_STEPS = 1000 };

static volatile float sink;

#if defined(__x86_64__)
#include <immintrin.h>
/* 12 independent 8-wide FMA chains: two FMA pipes kept full */
__attribute__((target("avx2,fma"))) static void fma_throughput(void)
{
	__m256 a[12];
	const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
	for (int j = 0; j < 12; j++)
		a[j] = _mm256_set1_ps((float)j);
	for (int i = 0; i < 1024; i++)
		for (int j = 0; j < 12; j++)
			a[j] = _mm256_fmadd_ps(a[j], m, c);
	__m256 s = a[0];
	for (int j = 1; j < 12; j++)
		s = _mm256_add_ps(s, a[j]);
	sink = _mm256_cvtss_f32(s);
}
static int have_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
static void fma_throughput(void) {}
static int have_fma(void) { return 0; }
#endif

/* one unit of work of the chosen kernel over buf (n floats) */
static void unit(const char *kernel, const float *buf, size_t n)
{
	if (!strcmp(kernel, "fmatp") && have_fma()) {
		fma_throughput();
		return;
	}
	if (!strncmp(kernel, "fma", 3)) {
		float a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
		for (int i = 0; i < 4096; i++)
			for (int j = 0; j < 8; j++)
				a[j] = a[j] * 0.999999f + 1e-7f;
		sink = a[0] + a[7];
		return;
	}
	float s[8] = { 0 };
	for (size_t i = 0; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			s[j] += buf[i + j];
	sink = s[0] + s[7];
}

static void pin(int core)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(core, &set);
	if (sched_setaffinity(0, sizeof set, &set))
		perror("core_spread: sched_setaffinity");
}

/* one process: wait for start, run steps of passes of units, write each
 * step's CPU and wall seconds to fd */
static void worker(int core, int fd, const char *kernel, const float *buf, size_t n,
		   long units, int passes, int steps, double start)
{
	pin(core);
	while (now() < start)
		;
	for (int s = 0; s < steps; s++) {
		const double c0 = thread_cpu_now(), w0 = now();
		for (int p = 0; p < passes; p++)
			for (long u = 0; u < units; u++)
				unit(kernel, buf, n);
		const double r[2] = { thread_cpu_now() - c0, now() - w0 };
		if (write(fd, r, sizeof r) != (ssize_t)sizeof r)
			_exit(1);
	}
	_exit(0);
}

static double pct(double *v, int n, double q)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return v[(int)(q * (n - 1) + 0.5)];
}

int main(int argc, char **argv)
{
	int procs = 2, passes = 8, steps = 30;
	double pass_ms = 20;
	const char *kernel = "fma";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--procs"))
			procs = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--kernel"))
			kernel = argv[i + 1];
		else if (!strcmp(argv[i], "--pass-ms"))
			pass_ms = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--passes"))
			passes = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--steps"))
			steps = atoi(argv[i + 1]);
		else {
			fprintf(stderr, "core_spread: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (procs < 1 || procs > MAX_PROCS || steps < 1 || steps > MAX_STEPS || passes < 1 ||
	    (strcmp(kernel, "fma") && strcmp(kernel, "fmatp") && strcmp(kernel, "l2") && strcmp(kernel, "l3") &&
	     strcmp(kernel, "mem"))) {
		fprintf(stderr, "core_spread: bad --procs/--steps/--passes/--kernel\n");
		return 2;
	}
	const size_t n = !strcmp(kernel, "mem")	 ? (64u << 20) / 4
			 : !strcmp(kernel, "l3") ? (4u << 20) / 4
						 : (128u << 10) / 4;
	float *buf = malloc(n * sizeof *buf);
	if (!buf)
		return 1;
	for (size_t i = 0; i < n; i++)
		buf[i] = (float)(i % 13);
	/* calibrate on core 0: units for one pass of pass_ms of CPU */
	pin(0);
	long units = 1;
	for (;;) {
		const double c0 = thread_cpu_now();
		for (long u = 0; u < units; u++)
			unit(kernel, buf, n);
		const double dt = thread_cpu_now() - c0;
		if (dt > 0.05) {
			units = (long)((double)units * pass_ms * 1e-3 / dt) + 1;
			break;
		}
		units *= 2;
	}
	int fds[MAX_PROCS];
	const double start = now() + 0.2;
	for (int p = 0; p < procs; p++) {
		int pf[2];
		if (pipe(pf))
			return 1;
		const pid_t pid = fork();
		if (pid == 0) {
			close(pf[0]);
			worker(p, pf[1], kernel, buf, n, units, passes, steps, start);
		}
		close(pf[1]);
		fds[p] = pf[0];
	}
	static double cpu[MAX_PROCS][MAX_STEPS], wall[MAX_PROCS][MAX_STEPS];
	for (int p = 0; p < procs; p++)
		for (int s = 0; s < steps; s++) {
			double r[2];
			if (read(fds[p], r, sizeof r) != (ssize_t)sizeof r) {
				fprintf(stderr, "core_spread: process %d died\n", p);
				return 1;
			}
			cpu[p][s] = r[0], wall[p][s] = r[1];
		}
	while (wait(NULL) > 0)
		;
	static double spread[MAX_STEPS], ratio[MAX_STEPS * MAX_PROCS], med[MAX_PROCS][MAX_STEPS];
	for (int s = 0; s < steps; s++) {
		double lo = 1e30, hi = 0, sum = 0;
		for (int p = 0; p < procs; p++) {
			lo = cpu[p][s] < lo ? cpu[p][s] : lo;
			hi = cpu[p][s] > hi ? cpu[p][s] : hi;
			sum += cpu[p][s];
			ratio[s * procs + p] = wall[p][s] / cpu[p][s];
		}
		spread[s] = 100 * (hi - lo) / (sum / procs);
	}
	printf("kernel %s, %d processes on cores 0-%d, %d steps of %d passes of %.0f ms:",
	       kernel, procs, procs - 1, steps, passes, pass_ms);
	for (int p = 0; p < procs; p++) {
		memcpy(med[p], cpu[p], (size_t)steps * sizeof(double));
		const double lo = pct(med[p], steps, 0), hi = pct(med[p], steps, 1);
		printf(" core %d %.1f ms [%.1f-%.1f];", p, 1e3 * pct(med[p], steps, 0.5), 1e3 * lo,
		       1e3 * hi);
	}
	const double sp50 = pct(spread, steps, 0.5), sp90 = pct(spread, steps, 0.9);
	printf(" spread a step median %.1f%%, p90 %.1f%%; wall/CPU median %.3f\n", sp50, sp90,
	       pct(ratio, steps * procs, 0.5));
	free(buf);
	return 0;
}
