/* tests/check_cpu_pin.c - a pipeline stage device's CPUs ([run]
 * bind_stages; plugins/cpu/pin.c, linked into this program for the rule):
 * which CPUs each stage gets from the mask, the quota and the team, and,
 * through the cpu plugin, that each stage device's stream worker runs on
 * its own CPU (read back with sched_getaffinity on the worker), and keeps
 * the process's mask when the stages' teams do not fit in it.  And the
 * workers' names (kiln-stream-N, N the process's count: ps -L, perf).
 */
#include "core/internal.h" /* kiln_device_open_peer */
#include "core/dist.h"     /* kiln_device_host_fn */
#include "plugins/cpu/pin.h"
#include "plugins/common/spin_rule.h" /* common_machine_full */

#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include "check_main.h"

static struct kiln_registry *reg;

START_TEST(test_plan)
{
	const int cpus[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, odd[4] = { 1, 3, 5, 7 };
	int out[8] = { -1 };
	/* 2 stages x 1 thread on 2 CPUs: one each */
	ck_assert_int_eq(cpu_pin_plan(cpus, 2, 2, 0, 2, 1, out), 1);
	ck_assert_int_eq(out[0], 0);
	ck_assert_int_eq(cpu_pin_plan(cpus, 2, 2, 1, 2, 1, out), 1);
	ck_assert_int_eq(out[0], 1);
	/* the mask's CPUs, in its order: taskset -c 1,3,5,7 */
	ck_assert_int_eq(cpu_pin_plan(odd, 4, 4, 1, 2, 2, out), 2);
	ck_assert_int_eq(out[0], 5);
	ck_assert_int_eq(out[1], 7);
	/* the team does not fit: 2 x 2 on 2 CPUs, 2 x 1 on 1 */
	ck_assert_int_eq(cpu_pin_plan(cpus, 2, 2, 0, 2, 2, out), 0);
	ck_assert_int_eq(cpu_pin_plan(cpus, 1, 1, 0, 2, 1, out), 0);
	/* a quota of 1 CPU on a mask of 8: the stages time-share, no pinning */
	ck_assert_int_eq(cpu_pin_plan(cpus, 8, 1, 0, 2, 1, out), 0);
	/* a quota above the mask counts as the mask */
	ck_assert_int_eq(cpu_pin_plan(cpus, 2, 8, 1, 2, 1, out), 1);
	ck_assert_int_eq(out[0], 1);
	/* an ordinal whose group is past the usable CPUs */
	ck_assert_int_eq(cpu_pin_plan(cpus, 2, 2, 2, 2, 1, out), 0);
	/* not a stage device */
	ck_assert_int_eq(cpu_pin_plan(cpus, 8, 8, 0, 1, 1, out), 0);
}
END_TEST

/* The CPUs the thread that runs it may use. */
struct seen {
	cpu_set_t set;
	int ok;
};

static kiln_status read_mask(void *arg)
{
	struct seen *s = arg;
	s->ok = sched_getaffinity(0, sizeof s->set, &s->set) == 0;
	return KILN_OK;
}

/* The mask of stage device `ordinal`'s stream worker (one of `peers`,
 * `threads` each), with [run] `ov` as the config. */
static void worker_mask_of(const char *ov, int ordinal, int threads, int peers, cpu_set_t *out)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *stream;
	struct seen s = { .ok = 0 };
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.async=1") == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0); /* no file */
	if (ov)
		ck_assert(kiln_config_override(cfg, ov) == 0);
	ck_assert_msg(kiln_device_open_peer(reg, cfg, "cpu", ordinal, threads, peers, &dev) == 0, "%s",
		      kiln_last_error());
	ck_assert_msg(kiln_device_stream_create(dev, &stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_host_fn(dev, stream, read_mask, &s) == 0);
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	ck_assert(s.ok);
	*out = s.set;
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

/* The same, one of 2 peers. */
static void worker_mask(const char *ov, int ordinal, int threads, cpu_set_t *out)
{
	worker_mask_of(ov, ordinal, threads, 2, out);
}

/* The process's CPUs, ascending, into cpus[]; how many. */
static int process_cpus(int *cpus, cpu_set_t *set)
{
	int n = 0;
	ck_assert(sched_getaffinity(0, sizeof *set, set) == 0);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, set))
			cpus[n++] = c;
	return n;
}

START_TEST(test_stage_workers_pinned)
{
	int cpus[CPU_SETSIZE];
	cpu_set_t all, w;
	const int n = process_cpus(cpus, &all);
	if (n < 2) {
		fprintf(stderr, "check_cpu_pin: %d CPU in the mask: pinning not tested\n", n);
		return;
	}
	/* always: stage K's worker on the mask's K-th CPU */
	for (int k = 0; k < 2; k++) {
		worker_mask("run.bind_stages=always", k, 1, &w);
		ck_assert_int_eq(CPU_COUNT(&w), 1);
		ck_assert_msg(CPU_ISSET(cpus[k], &w), "stage %d's worker not on CPU %d", k, cpus[k]);
	}
}
END_TEST

START_TEST(test_not_pinned)
{
	int cpus[CPU_SETSIZE];
	cpu_set_t all, w;
	const int n = process_cpus(cpus, &all);
	/* bind_stages = none: the process's mask */
	worker_mask("run.bind_stages=none", 1, 1, &w);
	ck_assert(CPU_EQUAL(&w, &all));
	/* two stages of n threads each do not fit in n CPUs */
	worker_mask("run.bind_stages=always", 0, n, &w);
	ck_assert_int_eq(CPU_COUNT(&w), n);
	ck_assert(CPU_EQUAL(&w, &all));
	/* n + 1 stages of one thread: stage 1's CPU would be free, but not every stage's */
	worker_mask_of("run.bind_stages=always", 1, 1, n + 1, &w);
	ck_assert_int_eq(CPU_COUNT(&w), n);
	ck_assert(CPU_EQUAL(&w, &all));
	/* a mask of one CPU (this forked test's own) for two stages of one thread */
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpus[n - 1], &one);
	ck_assert(sched_setaffinity(0, sizeof one, &one) == 0);
	worker_mask("run.bind_stages=always", 0, 1, &w);
	ck_assert(CPU_EQUAL(&w, &one));
}
END_TEST

/* auto pins unless the machine is full (spin_rule.h's test), always
 * whenever the teams fit, none never */
START_TEST(test_mode)
{
	ck_assert(cpu_pin_wanted(CPU_PIN_AUTO, 0));
	ck_assert(!cpu_pin_wanted(CPU_PIN_AUTO, 1));
	ck_assert(cpu_pin_wanted(CPU_PIN_ALWAYS, 0));
	ck_assert(cpu_pin_wanted(CPU_PIN_ALWAYS, 1));
	ck_assert(!cpu_pin_wanted(CPU_PIN_NONE, 0));
	ck_assert(!cpu_pin_wanted(CPU_PIN_NONE, 1));
	/* the default (none): the process's mask */
	int cpus[CPU_SETSIZE];
	cpu_set_t all, w;
	const int n = process_cpus(cpus, &all);
	worker_mask(NULL, 1, 1, &w);
	ck_assert_int_eq(CPU_COUNT(&w), n);
	/* auto follows the rule: pinned exactly when the machine was not full.
	 * The device measures the load itself, between full0 and full1: a
	 * load that crossed the line and came back between them looks steady
	 * here, so a mismatch is retried; a rule that is broken mismatches on
	 * every steady try. */
	int steady = 0, agreed = 0, got = 0, want = 0;
	for (int t = 0; t < 20 && n >= 2 && !agreed; t++) {
		const int full0 = common_machine_full();
		worker_mask("run.bind_stages=auto", 1, 1, &w);
		const int full1 = common_machine_full();
		if (full0 != full1) /* the load crossed the line meanwhile */
			continue;
		steady++;
		got = CPU_COUNT(&w);
		want = full0 ? n : 1;
		agreed = got == want;
	}
	if (steady)
		ck_assert_msg(agreed, "auto pinned %d CPUs where the rule says %d, on %d steady tries",
			      got, want, steady);
}
END_TEST

START_TEST(test_bad_value)
{
	struct kiln_config *cfg;
	struct kiln_device *dev = NULL;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "run.bind_stages=core") == 0);
	ck_assert_int_eq(kiln_device_open_peer(reg, cfg, "cpu", 0, 1, 2, &dev), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "bind_stages = core: expected auto, always or none"), "%s",
		      kiln_last_error());
	ck_assert(!dev);
	kiln_config_free(cfg);
}
END_TEST

/* The name of the thread that runs it (PR_GET_NAME) */
static kiln_status read_name(void *arg)
{
	char *name = arg;
	return prctl(PR_GET_NAME, name) ? KILN_EINTERNAL : KILN_OK;
}

/* Each stream's worker is named kiln-stream-N, N counting the process's
 * workers from 0: two streams of a device get two names */
START_TEST(test_worker_named)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *st[2];
	char name[2][17] = { "", "" };
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.async=1") == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0);
	ck_assert_msg(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0, "%s", kiln_last_error());
	for (int i = 0; i < 2; i++) {
		ck_assert_msg(kiln_device_stream_create(dev, &st[i]) == 0, "%s", kiln_last_error());
		ck_assert(kiln_device_host_fn(dev, st[i], read_name, name[i]) == 0);
		ck_assert(kiln_device_stream_sync(dev, st[i]) == 0);
	}
	for (int i = 0; i < 2; i++) {
		char *end;
		ck_assert_msg(!strncmp(name[i], "kiln-stream-", 12), "worker %d named '%s'", i, name[i]);
		long n = strtol(name[i] + 12, &end, 10);
		ck_assert_msg(!*end && n >= 0, "worker %d named '%s'", i, name[i]);
	}
	ck_assert_msg(strcmp(name[0], name[1]), "two workers both named '%s'", name[0]);
	for (int i = 0; i < 2; i++)
		kiln_device_stream_destroy(dev, st[i]);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}
END_TEST

/* The device's debug lines, concatenated (cpu only) */
struct opened_said {
	char text[4096];
};

static void opened_sink(void *user, int level, const char *who, const char *msg)
{
	struct opened_said *l = user;
	size_t n = strlen(l->text);
	(void)level;
	if (!strcmp(who, "cpu") && !strncmp(msg, "opened ordinal", 14))
		snprintf(l->text + n, sizeof l->text - n, "%s\n", msg);
}

/* How the core tells an instance what it is (kiln_device_options.stage,
 * version 4): as kiln train opens them with [run] threads = 3 on 2 stages
 * (core/train_setup.c, then core/pipe_devices.c): the run's own device
 * (threads -1, its 3) is not a stage, the stages (2 and 1 threads) are,
 * whatever their sizes; a device alone is neither.  The CPU device marks
 * each event by it: a stage's wait on the run's own device's event alone
 * is exempt from the spin back-off (cpu_spin_learns; before this review
 * the rule went by width, exempting stage 1's waits on stage 0). */
START_TEST(test_stage_marked)
{
	static const struct {
		int threads, peers;
		const char *want;
	} dev[] = { { -1, 2, "; the run's own device, beside its stages" },
		    { 2, 2, "; a pipeline stage" },
		    { 1, 2, "; a pipeline stage" },
		    { -1, 1, "async streams\n" } };
	struct kiln_config *cfg;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.async=1") == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0);
	ck_assert(kiln_config_override(cfg, "run.threads=3") == 0);
	const int level = kiln_log_get_level();
	for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) {
		struct opened_said said = { "" };
		struct kiln_device *d;
		kiln_log_set_level(KILN_LOG_DEBUG);
		kiln_log_set_sink(opened_sink, &said);
		const kiln_status st = kiln_device_open_peer(reg, cfg, "cpu", 0, dev[i].threads, dev[i].peers, &d);
		kiln_log_set_sink(NULL, NULL);
		kiln_log_set_level(level);
		ck_assert_msg(st == 0, "%s", kiln_last_error());
		char threads[32];
		snprintf(threads, sizeof threads, "; %d threads", dev[i].threads < 0 ? 3 : dev[i].threads);
		ck_assert_msg(strstr(said.text, threads) && strstr(said.text, dev[i].want),
			      "opened with threads %d, peers %d: '%s', want '%s' and '%s'", dev[i].threads,
			      dev[i].peers, said.text, threads, dev[i].want);
		kiln_device_close(d);
	}
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_cpu_pin_suite(void)
{
	Suite *s = suite_create("cpu_pin");
	check_add_case(s, "pin", 60, NULL, NULL, (const TTest *[]){
		test_plan, test_stage_workers_pinned, test_mode, test_bad_value, test_not_pinned,
		test_worker_named, test_stage_marked, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_pin_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
