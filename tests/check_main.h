/* tests/check_main.h - the main() and the suite runner every Check suite
 * shares.
 *
 * A suite file includes this header once and defines, anywhere after it,
 *
 *     static const struct check_main check_suite = {
 *             .suite = make_<area>_suite,
 *             ...what main does around the run (below)...
 *     };
 *
 * main() then: points XDG_CACHE_HOME at the tests' cache (check_cache_env),
 * sets the OpenMP waiters to sleep when asked (.omp_passive,
 * as the CLI does, so 2 cores are not starved), runs .setup, opens the registry when .reg is
 * given, skips (exit 77) when a plugin the suite needs is missing, runs the
 * suite (Check's CK_RUN_SUITE / CK_RUN_CASE / CK_FORK apply), closes the
 * registry, runs .teardown.  Exit status: 0 all passed, 1 a test failed or
 * the registry did not open, 77 skipped, or what .setup returned.
 */
#ifndef KILN_TESTS_CHECK_MAIN_H
#define KILN_TESTS_CHECK_MAIN_H

#include <check.h>
#include <kiln/kiln.h>
#include "../plugins/common/spin_rule.h" /* common_omp_env_defaults: kiln's OpenMP waiting */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct check_main {
	Suite *(*suite)(void);        /* the suite (unless .run is given) */
	int (*run)(void);             /* instead of one run of .suite: returns the failures */
	struct kiln_registry **reg;   /* when set: opened before the run, closed after */
	const char *plugin_dir;       /* the registry's directory (NULL: the default search) */
	int need_cpu;                 /* skip without the cpu device */
	const char *need_precision;   /* skip without this precision plugin */
	int (*setup)(void);           /* first: a nonzero return is main's exit status */
	void (*teardown)(void);       /* last, after a run or a skip */
	int verbose;                  /* CK_VERBOSE instead of CK_NORMAL */
	int own_plugin_path;          /* unset KILN_PLUGIN_PATH: not the caller's plugins */
	int omp_passive;              /* OMP_WAIT_POLICY=PASSIVE unless the caller set it */
	int need_test_device;         /* skip without check_test_device()'s device */
	const char *need_comm;        /* and, with a test device other than cpu, this comm plugin */
};

/* The device a suite that honours $KILN_TEST_DEVICE runs on (default cpu),
 * as the device conformance suites do (tests/device_fixture.h). */
static inline const char *check_test_device(void)
{
	const char *d = getenv("KILN_TEST_DEVICE");
	return d && *d ? d : "cpu";
}

/* defined by the suite file (a tentative definition here) */
static const struct check_main check_suite;

/* Runs s once (and frees it): the number of failed tests. */
static inline int check_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, check_suite.verbose ? CK_VERBOSE : CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed;
}

/* ---- the log, captured: kiln_log_set_sink(check_log_sink, NULL) appends
 * each line as "[who] msg\n" to one buffer of the process (64 KiB; what does
 * not fit is dropped), every level the log level lets through. */
struct check_log {
	char text[1 << 16];
	size_t n;
};

static inline struct check_log *check_log(void)
{
	static struct check_log l;
	return &l;
}

static inline void check_log_sink(void *user, int level, const char *who, const char *msg)
{
	struct check_log *l = check_log();
	(void)user, (void)level;
	const int n = snprintf(l->text + l->n, sizeof l->text - l->n, "[%s] %s\n", who, msg);
	if (n > 0 && l->n + (size_t)n < sizeof l->text)
		l->n += (size_t)n;
}

static inline void check_log_clear(void)
{
	check_log()->n = 0;
	check_log()->text[0] = 0;
}

/* what was captured since the last check_log_clear */
static inline const char *check_log_text(void) { return check_log()->text; }

/* lines captured holding a, and b too when given */
static inline int check_log_count(const char *a, const char *b)
{
	int n = 0;
	for (const char *p = check_log()->text; *p;) {
		const char *e = strchr(p, '\n');
		const size_t len = e ? (size_t)(e - p) : strlen(p);
		char line[1024];
		snprintf(line, sizeof line, "%.*s", (int)len, p);
		n += strstr(line, a) && (!b || strstr(line, b));
		p += len + (e != NULL);
	}
	return n;
}

/* s captured anywhere (across lines too) */
static inline int check_log_has(const char *s) { return strstr(check_log()->text, s) != NULL; }

/* Adds test case `name` to s with its tests (a NULL-terminated list), the
 * checked fixture (setup and teardown, either NULL) and a timeout in
 * seconds (0: Check's default). */
static inline TCase *check_add_case(Suite *s, const char *name, int timeout_s, SFun setup,
				    SFun teardown, const TTest *const *tests)
{
	TCase *tc = tcase_create(name);
	if (setup || teardown)
		tcase_add_checked_fixture(tc, setup, teardown);
	if (timeout_s)
		tcase_set_timeout(tc, timeout_s);
	for (; *tests; tests++)
		tcase_add_test(tc, *tests);
	suite_add_tcase(s, tc);
	return tc;
}

/* 0 when the test device's plugin (and .need_comm's) is in a registry of
 * dir, looked for in a child process: finding a plugin loads it and runs
 * its probe, and the cuda device's probe (and kiln-nccl's) initialises the
 * CUDA driver (cudaGetDeviceCount), after which no process Check forks
 * from this one could use the GPU.  The tests load them themselves, in
 * their own processes. */
static int check_device_missing_forked(const char *dir)
{
	fflush(NULL);
	const pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		struct kiln_registry *r = NULL;
		const struct kiln_plugin *p;
		int missing = kiln_registry_open(dir, &r) ||
			      kiln_registry_find(r, KILN_PLUGIN_DEVICE, check_test_device(), &p) ||
			      (check_suite.need_comm &&
			       kiln_registry_find(r, KILN_PLUGIN_COMM, check_suite.need_comm, &p));
		if (missing)
			fprintf(stderr, "skip: %s\n", kiln_last_error());
		fflush(NULL);
		_exit(missing);
	}
	int ws = 0;
	if (waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws))
		return 1;
	return WEXITSTATUS(ws) != 0;
}

/* 0 when every plugin the suite needs is in the registry, 1 when one is
 * not (kiln_last_error says which), 2 when the test device's is not (a
 * device other than cpu is looked for in a child, which said why: above). */
static int check_plugins_missing(struct kiln_registry *r)
{
	const struct kiln_plugin *p;
	if (check_suite.need_cpu && kiln_registry_find(r, KILN_PLUGIN_DEVICE, "cpu", &p))
		return 1;
	if (check_suite.need_test_device && strcmp(check_test_device(), "cpu") &&
	    check_device_missing_forked(check_suite.plugin_dir))
		return 2;
	if (check_suite.need_test_device && !strcmp(check_test_device(), "cpu") &&
	    kiln_registry_find(r, KILN_PLUGIN_DEVICE, "cpu", &p))
		return 1;
	if (check_suite.need_precision &&
	    kiln_registry_find(r, KILN_PLUGIN_PRECISION, check_suite.need_precision, &p))
		return 1;
	return 0;
}

/* The caches kiln keeps (the CPU tune cache, the plugin probe, inflated
 * IDX data) go to the tests' own directory, never the user's
 * ($XDG_CACHE_HOME or ~/.cache): $abs_top_builddir/tests/cache, which `make
 * check` names (tests/local.mk), else (a suite run by hand)
 * $TMPDIR/kiln-tests-cache.  A test that names its own sets it after. */
static void check_cache_env(void)
{
	const char *b = getenv("abs_top_builddir"), *t = getenv("TMPDIR");
	char dir[4096];
	if (b && *b)
		snprintf(dir, sizeof dir, "%s/tests/cache", b);
	else
		snprintf(dir, sizeof dir, "%s/kiln-tests-cache", t && *t ? t : "/tmp");
	setenv("XDG_CACHE_HOME", dir, 1);
}

/* The rendezvous store's shared secret (core/store.h), which every
 * process of a suite that starts ranks itself must present: `make check`
 * exports the suite's own (tests/local.mk); a suite run by hand gets the
 * same one unless the caller set KILN_STORE_TOKEN or
 * KILN_STORE_TOKEN_FILE.  (Without it rank 0 could not open its store:
 * tests/check_comm's ranks then waited for its port until Check's
 * timeout killed them.)  Tests only: a fixed token guards nothing. */
static void check_store_env(void)
{
	const char *v = getenv("KILN_STORE_TOKEN"), *f = getenv("KILN_STORE_TOKEN_FILE");
	if (!(v && *v) && !(f && *f))
		setenv("KILN_STORE_TOKEN", "kiln-tests-0123456789abcdef", 1);
}

static int check_main_run(void)
{
	const struct check_main *m = &check_suite;
	check_cache_env();
	check_store_env();
	if (m->omp_passive)
		common_omp_env_defaults(); /* kiln's rule */
	if (m->own_plugin_path)
		unsetenv("KILN_PLUGIN_PATH");
	int rc = m->setup ? m->setup() : 0;
	if (rc)
		return rc;
	if (m->reg && kiln_registry_open(m->plugin_dir, m->reg)) {
		fprintf(stderr, "%s\n", kiln_last_error());
		rc = 1;
	} else if (m->reg && (rc = check_plugins_missing(*m->reg))) {
		if (rc == 1)
			fprintf(stderr, "skip: %s\n", kiln_last_error());
		rc = 77;
	} else {
		rc = (m->run ? m->run() : check_run(m->suite())) ? 1 : 0;
	}
	if (m->reg) {
		kiln_registry_close(*m->reg);
		*m->reg = NULL;
	}
	if (m->teardown)
		m->teardown();
	return rc;
}

int main(void)
{
	return check_main_run();
}

#endif
