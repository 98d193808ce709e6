/* plugins/cpu/pin.h - a pipeline stage's CPUs ([run] bind_stages): the
 * stage devices of `[run] devices = cpu:0, cpu:1` each pin their stream
 * workers (and so the OpenMP team each worker starts, which inherits its
 * mask) to a share of the process's affinity mask of their own, as
 * `kiln launch --bind core` pins each rank: cpu:K takes the K-th group of
 * `threads` CPUs of the mask.  Only when every stage's team fits: P x
 * threads at most the CPUs of the mask and of the cgroup quota, and (the
 * default, auto) the machine is not full; else the workers keep the
 * process's mask (docs/pipeline.md, "Stage threads on
 * CPUs of their own"; docs/PERFORMANCE.md, "Session 13: pipeline pass
 * variation").
 *
 * The run's own device (`[run] device`, opened beside the stages with
 * the same peer count: core/train_setup.c) goes through the same rule
 * with its thread count, so it is pinned only where P x [run] threads
 * fits the mask (threads = 2 of 8 CPUs, 2 stages: its workers on CPUs 0
 * and 1, where the stages run; they wait while the stages compute);
 * with threads = 0 (all the mask's CPUs) it never is.
 *
 * cpu_pin_plan is a pure function of its inputs (tests/check_cpu_pin.c);
 * cpu_pin_open reads the mask and the quota.
 */
#ifndef KILN_PLUGINS_CPU_PIN_H
#define KILN_PLUGINS_CPU_PIN_H

#include <pthread.h>

struct kiln_host;
struct kiln_config;

/* The CPUs of stage device `ordinal` (one of `peers` stages, `threads`
 * threads each) out of the mask's `ncpu` CPUs cpus[] (ascending), of
 * which `usable` may run at once (the cgroup quota, rounded as the team
 * is: cpu_threads_for): cpus[ordinal * threads ...] into out[], returning
 * how many (threads), or 0 to leave the workers unpinned: fewer than 2
 * peers, peers x threads more than usable, or the ordinal's group past
 * the usable CPUs. */
int cpu_pin_plan(const int *cpus, int ncpu, int usable, int ordinal, int peers, int threads,
		 int *out);

/* [run] bind_stages: none (the default), auto (pin unless the machine is full as the
 * device opens: spin_rule.h's common_machine_full, the 1-minute load
 * average and the runnable threads at least the mask's CPUs; a pinned
 * stage cannot move to a core another process left free), always. */
enum { CPU_PIN_NONE, CPU_PIN_AUTO, CPU_PIN_ALWAYS };
/* Whether `mode` pins on a machine that is `full` (1) or not (0). */
int cpu_pin_wanted(int mode, int full);

/* A context's pinning: n CPUs (0: none), applied to each stream worker
 * it starts (cpu_pin_attr). */
struct cpu_pin {
	int n;
	int first; /* the lowest of them, for the log */
	unsigned long mask[16]; /* 1024 CPUs, as cpu_set_t */
};

/* Decide a context's pinning from [run] bind_stages (above), the process's affinity mask and cgroup quota.  Not a
 * stage device (peers < 2) or no config: none.  Returns KILN_OK or
 * KILN_ECONFIG for a value it does not know. */
int cpu_pin_open(const struct kiln_host *host, const struct kiln_config *cfg, int ordinal,
		 int peers, int threads, struct cpu_pin *pin);

/* Set attr's CPU affinity to the context's pinning (nothing when none);
 * 0 or the pthread error. */
int cpu_pin_attr(const struct cpu_pin *pin, pthread_attr_t *attr);

#endif
