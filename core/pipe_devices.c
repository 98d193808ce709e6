/* core/pipe_devices.c - [run] devices: one device instance per pipeline
 * stage in one process (`cpu:0, cpu:1`), each with its share of the
 * process's threads, so that the stages run at the same time.  The
 * stages' plans prepare and run their layers on their stage's instance
 * (kiln_plan_dev); the transport copies between them on a copy stream
 * ordered by events (pipe_run.c).  docs/pipeline.md. */
#include "pipeline.h"

#include <sched.h> /* sched_getaffinity, CPU_COUNT (build-config.h: _GNU_SOURCE) */
#include <unistd.h>

struct stage_device {
	char plugin[32];
	int ordinal;
};

/* [run] devices as a list of `plugin[:ordinal]` (*n = 0 when empty). */
static kiln_status read_devices(const struct kiln_config *cfg, struct stage_device *d, int *n)
{
	const char *v = kiln_config_get(cfg, "run", "devices");
	*n = 0;
	while (v && *v) {
		char item[64];
		size_t len = strcspn(v, ",");
		const char *next = v[len] ? v + len + 1 : v + len;
		while (len && (*v == ' ' || *v == '\t'))
			v++, len--;
		while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
			len--;
		if (!len || len >= sizeof item || *n == KILN_PIPE_MAX_STAGES)
			return kiln_error(KILN_ECONFIG, "%s: [run] devices: expected a list of up to %d `device:ordinal` entries (cpu:0, cpu:1)",
					  kiln_config_where(cfg, "run", "devices"), KILN_PIPE_MAX_STAGES);
		memcpy(item, v, len);
		item[len] = 0;
		char *colon = strchr(item, ':'), *end = NULL;
		long ord = 0;
		if (colon) {
			*colon = 0;
			ord = strtol(colon + 1, &end, 10);
		}
		if ((colon && (end == colon + 1 || *end || ord < 0 || ord > 1024)) || !*item ||
		    strlen(item) >= sizeof d->plugin)
			return kiln_error(KILN_ECONFIG, "%s: [run] devices: '%s' is not `device:ordinal` (cpu:0)",
					  kiln_config_where(cfg, "run", "devices"), item);
		snprintf(d[*n].plugin, sizeof d->plugin, "%s", item);
		d[(*n)++].ordinal = (int)ord;
		v = next;
	}
	return KILN_OK;
}

kiln_status kiln_pipe_devices_count(const struct kiln_config *cfg, int *n)
{
	struct stage_device d[KILN_PIPE_MAX_STAGES];
	return read_devices(cfg, d, n);
}

/* Stage s's share of T threads: T / P, the first T % P stages one more,
 * at least 1. */
static int thread_share(int T, int P, int s)
{
	int n = T / P + (s < T % P);
	return n > 0 ? n : 1;
}

/* [run] threads, or (0) the CPUs this process may run on. */
static kiln_status process_threads(const struct kiln_config *cfg, int *T)
{
	int64_t t = 0;
	kiln_status st = kiln_config_get_int(cfg, "run", "threads", &t);
	if (st && st != KILN_ENOTFOUND)
		return st;
	if (!t) {
		cpu_set_t set;
		long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
								     : sysconf(_SC_NPROCESSORS_ONLN);
		t = n > 0 ? n : 1;
	}
	*T = (int)t;
	return KILN_OK;
}

kiln_status kiln_pipe_devices_open(const struct kiln_registry *reg, struct kiln_model *m)
{
	const struct kiln_config *cfg = m->cfg;
	struct stage_device d[KILN_PIPE_MAX_STAGES];
	int n = 0, T = 0;
	kiln_status st;
	if ((st = read_devices(cfg, d, &n)) || !n)
		return st;
	const char *where = kiln_config_where(cfg, "run", "devices");
	if (n < 2 || n != m->n_stages)
		return kiln_error(KILN_ECONFIG, "%s: [run] devices names %d devices for %d pipeline stages: one per stage, two or more ([layer.X] stage, [model] stages)",
				  where, n, m->n_stages);
	for (int s = 0; s < n; s++) {
		if (strcmp(d[s].plugin, kiln_device_name(m->dev)))
			return kiln_error(KILN_ECONFIG, "%s: [run] devices: stage %d's '%s' is not the run's device '%s' ([run] device)",
					  where, s, d[s].plugin, kiln_device_name(m->dev));
		if (kiln_device_traits(m->dev)->type != KILN_DEVICE_CPU)
			return kiln_error(KILN_ENOTSUP, "%s: [run] devices = %s:%d...: a device per stage is written for the CPU only; on a GPU each stage's parameters and arenas would need their own device's memory (not written yet, docs/pipeline.md)",
					  where, d[s].plugin, d[s].ordinal);
		for (int r = 0; r < s; r++)
			if (d[r].ordinal == d[s].ordinal)
				return kiln_error(KILN_ECONFIG, "%s: [run] devices: %s:%d is named twice (stages %d and %d)",
						  where, d[s].plugin, d[s].ordinal, r, s);
	}
	if ((st = process_threads(cfg, &T)))
		return st;
	if (!(m->stage_dev = calloc((size_t)n, sizeof *m->stage_dev)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int s = 0; s < n; s++) {
		const int share = thread_share(T, n, s);
		if ((st = kiln_device_open_peer(reg, cfg, d[s].plugin, d[s].ordinal, share, n,
						&m->stage_dev[s])))
			return kiln_error_wrap(st, "pipeline stage %d's device %s:%d", s, d[s].plugin,
					       d[s].ordinal);
		/* (not profiled op by op: the profiler's per-op timing would
		 * run the stages in turn; docs/pipeline.md) */
		kiln_log(KILN_LOG_INFO, "pipeline", "stage %d on %s:%d, %d of %d threads", s,
			 d[s].plugin, d[s].ordinal, share, T);
	}
	return KILN_OK;
}

void kiln_pipe_devices_close(struct kiln_model *m)
{
	for (int s = 0; m->stage_dev && s < m->n_stages; s++)
		kiln_device_close(m->stage_dev[s]);
	free(m->stage_dev);
	m->stage_dev = NULL;
}
