/* plugins/common/spin_rule.h - how long libgomp's waiting threads spin
 * before they sleep (GOMP_SPINCOUNT), chosen as a process starts: one rule
 * for `kiln` (cli/kiln.c) and the Check suites (tests/check_main.h).
 * Header-only: static inline.
 *
 * "100000" (libgomp's spin of that many `pause`s: 2.6 ms, 26 ns a
 * `pause`, measured on session 50's VM, AMD EPYC Zen 4; docs/PERFORMANCE.md,
 * session 50), or "0" when the machine is oversubscribed as the process
 * starts: the 1-minute load average at least the CPUs of its affinity mask,
 * and at least that many threads runnable at that moment.  Then the team's
 * threads are rarely on cores together and
 * each barrier spins against a descheduled partner before it sleeps: at
 * load 15 the MLP burnt 7-8x the CPU and ran 6-12x slower than with 0
 * (docs/PERFORMANCE.md, "The whole run").  libgomp reads the variable once,
 * when it loads, so a run keeps the choice of its start.
 *
 * common_omp_env_defaults applies the rule (and OMP_WAIT_POLICY=PASSIVE)
 * where the user set neither; `kiln` calls it first thing and
 * kiln_registry_open calls it before any plugin loads libgomp, so a
 * program embedding kiln (kiln_infer) gets the same waiting as the CLI.
 */
#ifndef KILN_COMMON_SPIN_RULE_H
#define KILN_COMMON_SPIN_RULE_H

#include "c_locale.h" /* common_c_numbers_begin: /proc/loadavg's '.' */
#include <dlfcn.h> /* dlopen RTLD_NOLOAD: is libgomp loaded yet? */
#include <stdio.h>
#include <stdlib.h> /* setenv */
#include <sys/syscall.h> /* SYS_sched_getaffinity */
#include <unistd.h>      /* syscall, sysconf */

/* The rule itself: the spin for a 1-minute load average `load` and
 * `running` threads runnable right now, this one included (/proc/loadavg's
 * fourth field; negative: unknown), on `cpus` CPUs.  Both must say the
 * machine is full: the average alone trails by a minute, so on a quiet
 * machine running benchmarks back to back (each run's load still in the
 * average, nothing else runnable) it turned the spin off and made the
 * 2-thread runs pay a futex wake-up per parallel region. */
static inline const char *common_spin_for(double load, long running, long cpus)
{
	const int full = load >= 0 && cpus > 0 && load >= (double)cpus &&
			 (running < 0 || running >= cpus);
	return full ? "0" : "100000";
}

/* Is the machine full for this process now (the rule's test above:
 * /proc/loadavg against its affinity mask)?  Also what `[run] bind_stages
 * = auto` asks before it pins a pipeline stage's threads (plugins/cpu/pin.c). */
static inline int common_machine_full(void)
{
	double load = -1;
	long running = -1, total;
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		/* "0.52 0.58 0.59 2/467 12345": 1-minute average, runnable/all */
		const locale_t old = common_c_numbers_begin(); /* '.', whatever the application's locale */
		int got = fscanf(f, "%lf %*f %*f %ld/%ld", &load, &running, &total);
		common_c_numbers_end(old);
		if (got < 1)
			load = -1;
		if (got < 3)
			running = -1;
		fclose(f);
	}
	/* the affinity mask through the system call, which needs no
	 * _GNU_SOURCE of the including file (the Check suites include it late) */
	unsigned long mask[64];
	long bytes = syscall(SYS_sched_getaffinity, 0, sizeof mask, mask), cpus = 0;
	for (long i = 0; i < bytes / (long)sizeof mask[0]; i++)
		cpus += __builtin_popcountl(mask[i]);
	if (bytes <= 0)
		cpus = sysconf(_SC_NPROCESSORS_ONLN);
	return *common_spin_for(load, running, cpus) == '0';
}

/* The spin for this process now. */
static inline const char *common_spin_count(void)
{
	return common_machine_full() ? "0" : "100000";
}

/* Where unset, OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT by the rule:
 * waiters spin briefly, then sleep.  Sleeping at once (PASSIVE alone)
 * costs a futex wake-up per parallel region, which made the MLP step 1.7x
 * slower; spinning forever (ACTIVE) starves the loader and stream workers
 * on 2 cores.  A user's own values win.  Does nothing once libgomp is in
 * the process (it has read them already), so a program's own OpenMP
 * settings are never changed under it.  Modifies the environment:
 * not thread-safe against another thread's getenv/setenv. */
static inline void common_omp_env_defaults(void)
{
	void *gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (gomp) {
		dlclose(gomp); /* drops the reference NOLOAD took */
		return;
	}
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	setenv("GOMP_SPINCOUNT", common_spin_count(), 0);
}

#endif
