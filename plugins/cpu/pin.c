/* plugins/cpu/pin.c - a pipeline stage's CPUs ([run] bind_stages; pin.h).
 *
 * Why: two stages of one thread each on a 2-core machine, unpinned, share
 * the cores with the process's other threads (the training thread, the
 * loader's worker) as the scheduler sees fit; a stage's worker that is
 * moved to the other core, or queued behind the other stage's worker on
 * the same core, stretches that pass, and the schedule's bubble assumes
 * equal passes (docs/PERFORMANCE.md, "Session 13: pipeline pass
 * variation").
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_*, pthread_attr_setaffinity_np */
#endif
#include "pin.h"

#include "threads.h" /* cpu_threads_for, cpu_quota_read */
#include "../common/spin_rule.h" /* common_machine_full */

#include <kiln/plugin.h>

#include <sched.h>
#include <string.h>
#include <unistd.h>

int cpu_pin_plan(const int *cpus, int ncpu, int usable, int ordinal, int peers, int threads,
		 int *out)
{
	if (usable > ncpu)
		usable = ncpu;
	if (peers < 2 || threads < 1 || ordinal < 0 || usable < 1)
		return 0;
	/* every stage's team on CPUs of its own, and this one's group there */
	if ((long)peers * threads > usable || ((long)ordinal + 1) * threads > usable)
		return 0;
	for (int k = 0; k < threads; k++)
		out[k] = cpus[ordinal * threads + k];
	return threads;
}

int cpu_pin_wanted(int mode, int full)
{
	return mode == CPU_PIN_ALWAYS || (mode == CPU_PIN_AUTO && !full);
}

/* [run] bind_stages as a CPU_PIN_*; -1 for another value. */
static int bind_mode(const struct kiln_host *host, const struct kiln_config *cfg)
{
	const char *v = host->config_get(cfg, "run", "bind_stages");
	if (!v || !strcmp(v, "none")) /* unset: the schema's default, none */
		return CPU_PIN_NONE;
	return !strcmp(v, "always") ? CPU_PIN_ALWAYS : !strcmp(v, "auto") ? CPU_PIN_AUTO : -1;
}

int cpu_pin_open(const struct kiln_host *host, const struct kiln_config *cfg, int ordinal,
		 int peers, int threads, struct cpu_pin *pin)
{
	memset(pin, 0, sizeof *pin);
	if (!cfg || peers < 2)
		return KILN_OK;
	const int mode = bind_mode(host, cfg);
	if (mode < 0)
		return host->error(KILN_ECONFIG, "cpu: [run] bind_stages = %s: expected auto, always or none",
				   host->config_get(cfg, "run", "bind_stages"));
	cpu_set_t set;
	const int full = mode == CPU_PIN_AUTO && common_machine_full();
	if (!cpu_pin_wanted(mode, full)) {
		if (full)
			host->log(KILN_LOG_DEBUG, "cpu", "cpu:%d (one of %d devices side by side): workers not bound (bind_stages = auto on a full machine: load average and runnable threads at least the CPUs)",
				  ordinal, peers);
		return KILN_OK;
	}
	if (sched_getaffinity(0, sizeof set, &set))
		return KILN_OK;
	int cpus[CPU_SETSIZE], mine[CPU_SETSIZE], ncpu = 0;
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &set))
			cpus[ncpu++] = c;
	char stat[4200];
	const int usable = cpu_threads_for(ncpu, cpu_quota_read(stat, sizeof stat));
	const int n = cpu_pin_plan(cpus, ncpu, usable, ordinal, peers, threads, mine);
	_Static_assert(sizeof pin->mask >= sizeof(cpu_set_t), "cpu_pin's mask holds a cpu_set_t");
	cpu_set_t *m = (cpu_set_t *)pin->mask;
	CPU_ZERO(m);
	for (int k = 0; k < n; k++)
		CPU_SET(mine[k], m);
	pin->n = n;
	pin->first = n ? mine[0] : -1;
	if (n)
		host->log(KILN_LOG_DEBUG, "cpu", "cpu:%d (one of %d devices side by side): its workers on CPU %d%s of %d (%d usable)",
			  ordinal, peers, mine[0], n > 1 ? " and the next" : "", ncpu, usable);
	else
		host->log(KILN_LOG_DEBUG, "cpu", "cpu:%d: workers not bound (%d devices side by side x %d threads, %d usable CPUs)",
			  ordinal, peers, threads, usable);
	return KILN_OK;
}

int cpu_pin_attr(const struct cpu_pin *pin, pthread_attr_t *attr)
{
	if (!pin || !pin->n)
		return 0;
	return pthread_attr_setaffinity_np(attr, sizeof(cpu_set_t), (const cpu_set_t *)pin->mask);
}
