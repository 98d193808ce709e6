/* plugins/common/spin_rule.h - how long libgomp's waiting threads spin
 * before they sleep (GOMP_SPINCOUNT), chosen as a process starts: one rule
 * for `kiln` (cli/kiln.c) and the Check suites (tests/check_main.h).
 * Header-only: static inline.
 *
 * "100000" (about 10-50 us), or "0" when the machine is oversubscribed as
 * the process starts: the 1-minute load average at least the CPUs of its
 * affinity mask, and at least that many threads runnable at that moment.  Then the team's threads are rarely on cores together and
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

#include <dlfcn.h> /* dlopen RTLD_NOLOAD: is libgomp loaded yet? */
#include <fcntl.h> /* open */
#include <stdio.h>
#include <stdlib.h> /* setenv, strtod, strtol */
#include <string.h> /* strchr */
#include <sys/syscall.h> /* SYS_sched_getaffinity */
#include <unistd.h>      /* syscall, sysconf */

/* The rule itself: the spin for a 1-minute load average `load` and
 * `running` threads runnable right now, this one included (/proc/loadavg's
 * fourth field; negative: unknown), on `cpus` CPUs.  Both must say the
 * machine is full: the average alone trails by a minute, so on a quiet
 * machine running benchmarks back to back (each run's load still in the
 * average, nothing else runnable) it turned the spin off and made the
 * 2-thread runs pay a futex wake-up per parallel region. */
static inline int common_full(double load, long running, long cpus)
{
	return load >= 0 && cpus > 0 && load >= (double)cpus && (running < 0 || running >= cpus);
}

static inline const char *common_spin_for(double load, long running, long cpus)
{
	return common_full(load, running, cpus) ? "0" : "100000";
}

/* Whether the machine is full for this process now (common_full):
 * /proc/loadavg against its affinity mask.  Costs an open and a read of
 * /proc/loadavg and a system call (some microseconds): callers in a loop
 * keep the answer a while (plugins/common/shmcoll.c). */
static inline int common_machine_full(void)
{
	double load = -1;
	long running = -1;
	/* "0.52 0.58 0.59 2/467 12345": 1-minute average, runnable/all; read
	 * with open/read and parsed by hand, which allocate nothing (the
	 * shared-memory collectives ask from their waits) */
	char text[128];
	int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, text, sizeof text - 1);
		close(fd);
		if (n > 0) {
			char *p = text, *e;
			text[n] = 0;
			load = strtod(p, &e);
			if (e == p)
				load = -1;
			for (int field = 0; field < 2 && *e; field++) { /* to the fourth */
				p = strchr(e + 1, ' ');
				e = p ? p : text + n;
			}
			if (*e == ' ') {
				running = strtol(e + 1, &p, 10);
				if (p == e + 1 || *p != '/')
					running = -1;
			}
		}
	}
	/* the affinity mask through the system call, which needs no
	 * _GNU_SOURCE of the including file (the Check suites include it late) */
	unsigned long mask[64];
	long bytes = syscall(SYS_sched_getaffinity, 0, sizeof mask, mask), cpus = 0;
	for (long i = 0; i < bytes / (long)sizeof mask[0]; i++)
		cpus += __builtin_popcountl(mask[i]);
	if (bytes <= 0)
		cpus = sysconf(_SC_NPROCESSORS_ONLN);
	return common_full(load, running, cpus);
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
