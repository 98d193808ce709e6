/* tests/check_profile.c - the profiler ([run] profile = 1) on a tiny CNN
 * trained on Fashion-MNIST: the trace is valid Trace Event Format with a
 * slice for every layer's forward and backward and for the optimizer, no
 * two slices of one track overlap, the table's rows add up to its total,
 * and profiling changes no number of the run. */
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include "../core/internal.h" /* KILN_PHASE_DATA */
#include "../core/profile.h"
#include <jansson.h>
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct kiln_registry *reg;

static const char *const layers[] = { "c1", "bn", "r1", "p1", "c2", "r2", "flat", "fc", "loss" };
#define N_LAYERS (sizeof layers / sizeof layers[0])

static const char *cnn_ini =
	"[run]\nseed = 3\nout_dir = %s\nprofile = %d\nprofile_steps = %d\n"
	"[data]\nsource = idx\nlimit = 640\nmean = 0.286\nstd = 0.353\nworkers = %d\n"
	"[data.eval]\nlimit = 200\n[model]\nlayout = %s\n"
	"[layer.c1]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n"
	"[layer.bn]\ntype = batchnorm\n[layer.r1]\ntype = relu\n"
	"[layer.p1]\ntype = maxpool\nkernel = 2\n"
	"[layer.c2]\ntype = conv\nout = 8\nkernel = 3\npadding = 1\n"
	"[layer.r2]\ntype = relu\n[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = 1\nbatch = 32\nmax_steps = 10\nlr = 0.05\nlog_every = 4\n"
	"eval_batch = 64\n[plugin.cpu]\nasync = %d\n";

/* run directories: kiln-profile-* in $TMPDIR, removed after a passing test */
#define SCRATCH_TAG "profile"
#include "test_scratch.h"

/* over: a command-line override ("" for none) */
static void train(const char *dir, int profile, int steps, int workers, const char *layout,
		  int async, const char *over, struct kiln_train_result *res)
{
	char ini[4096];
	struct kiln_config *cfg;
	snprintf(ini, sizeof ini, cnn_ini, dir, profile, steps, workers, layout, async);
	ck_assert_msg(kiln_config_load_string(ini, "profile.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	ck_assert(!*over || kiln_config_override(cfg, over) == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_train(cfg, reg, NULL, NULL, res) == KILN_OK, "%s", kiln_last_error());
	kiln_config_free(cfg);
}

/* ---- trace.json ---------------------------------------------------------- */

struct slice {
	int tid;
	double ts, dur;
};

static int by_tid_ts(const void *a, const void *b)
{
	const struct slice *x = a, *y = b;
	if (x->tid != y->tid)
		return x->tid - y->tid;
	return x->ts < y->ts ? -1 : x->ts > y->ts;
}

static void check_trace(const char *dir, int trace_steps)
{
	char path[4200];
	json_error_t err;
	snprintf(path, sizeof path, "%s/trace.json", dir);
	json_t *root = json_load_file(path, 0, &err);
	ck_assert_msg(root != NULL, "%s:%d: %s", path, err.line, err.text);
	json_t *evs = json_object_get(root, "traceEvents");
	ck_assert(json_is_array(evs));
	size_t n = json_array_size(evs), nx = 0;
	struct slice *sl = calloc(n, sizeof *sl);
	int fwd[N_LAYERS] = { 0 }, bwd[N_LAYERS] = { 0 }, sgd = 0, steps = 0, max_step = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(evs, i);
		const char *ph = json_string_value(json_object_get(e, "ph"));
		ck_assert(ph != NULL);
		if (strcmp(ph, "X"))
			continue;
		const char *name = json_string_value(json_object_get(e, "name"));
		const char *cat = json_string_value(json_object_get(e, "cat"));
		json_t *ts = json_object_get(e, "ts"), *dur = json_object_get(e, "dur");
		ck_assert_msg(name && cat && json_is_number(ts) && json_is_number(dur),
			      "event %zu lacks name, cat, ts or dur", i);
		ck_assert_int_eq(json_integer_value(json_object_get(e, "pid")), 1);
		ck_assert(json_is_integer(json_object_get(e, "tid")));
		struct slice *s = &sl[nx++];
		s->tid = (int)json_integer_value(json_object_get(e, "tid"));
		s->ts = json_number_value(ts);
		s->dur = json_number_value(dur);
		ck_assert_msg(s->ts >= 0 && s->dur >= 0, "%s: ts %g dur %g", name, s->ts, s->dur);
		json_t *args = json_object_get(e, "args");
		int step = (int)json_integer_value(json_object_get(args, "step"));
		max_step = step > max_step ? step : max_step;
		const char *layer = json_string_value(json_object_get(args, "layer"));
		const char *op = json_string_value(json_object_get(args, "op"));
		if (!strcmp(cat, "step"))
			steps++;
		for (size_t l = 0; layer && l < N_LAYERS; l++)
			if (!strcmp(layer, layers[l]) && !op) { /* the layer track's slice */
				fwd[l] += !strcmp(cat, "forward");
				bwd[l] += !strcmp(cat, "backward");
			}
		if (!strcmp(cat, "optimizer") && op && !strcmp(op, "sgd"))
			sgd++;
	}
	for (size_t l = 0; l < N_LAYERS; l++) {
		ck_assert_msg(fwd[l] == trace_steps, "layer %s: %d forward slices, want %d",
			      layers[l], fwd[l], trace_steps);
		ck_assert_msg(bwd[l] == trace_steps, "layer %s: %d backward slices, want %d",
			      layers[l], bwd[l], trace_steps);
	}
	ck_assert_int_eq(sgd, trace_steps);
	ck_assert_int_eq(steps, trace_steps);
	ck_assert_int_eq(max_step, trace_steps);
	/* a track is a sequence: no slice starts before the previous ended
	 * (ts and dur are exact to the nanosecond in the file) */
	qsort(sl, nx, sizeof *sl, by_tid_ts);
	for (size_t i = 1; i < nx; i++)
		if (sl[i].tid == sl[i - 1].tid)
			ck_assert_msg(sl[i - 1].ts + sl[i - 1].dur <= sl[i].ts + 1e-6,
				      "track %d: slice at %.3f us ends at %.3f, after the next starts at %.3f",
				      sl[i].tid, sl[i - 1].ts, sl[i - 1].ts + sl[i - 1].dur, sl[i].ts);
	free(sl);
	json_decref(root);
}

/* ---- profile.txt ---------------------------------------------------------- */

/* Rows between the two rules: ... calls total_ms mean_us pct median_us
 * min_us (the host row has "-" for calls, mean, median and min); then the
 * total line.  A row starts with
 * each of want[], none with any of absent[]. */
static void check_table(const char *dir, const char *const *want, int n_want,
			const char *const *absent, int n_absent)
{
	char path[4200], line[512];
	snprintf(path, sizeof path, "%s/profile.txt", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "no %s", path);
	int rules = 0, rows = 0, found[8] = { 0 };
	double sum_ms = 0, sum_pct = 0, total_ms = -1, host_ms = -1, prev_ms = INFINITY;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '-') {
			rules++;
			continue;
		}
		if (rules == 0 || rules > 2)
			continue;
		char *tok[16];
		int nt = 0;
		char copy[512];
		snprintf(copy, sizeof copy, "%s", line);
		for (char *t = strtok(copy, " \n"); t && nt < 16; t = strtok(NULL, " \n"))
			tok[nt++] = t;
		ck_assert_msg(nt >= 7, "short table line: %s", line);
		double ms = atof(tok[nt - 5]), pct = atof(tok[nt - 3]);
		double med = atof(tok[nt - 2]), min = atof(tok[nt - 1]);
		if (rules == 2) {
			ck_assert_str_eq(tok[0], "total");
			ck_assert_msg(min > 0 && min <= med, "step min %.1f us, median %.1f: %s", min,
				      med, line);
			total_ms = ms;
			ck_assert_double_eq_tol(pct, 100, 1e-9);
			break;
		}
		if (!strcmp(tok[0], "(host)")) {
			host_ms = ms;
		} else {
			/* sorted by total, descending */
			ck_assert_msg(ms <= prev_ms, "row out of order: %s", line);
			prev_ms = ms;
			const int calls = atoi(tok[nt - 6]);
			ck_assert_msg(calls > 0, "row without calls: %s", line);
			/* the fastest call is no slower than the median, nor than
			 * the mean (to the printed 0.1 us and 0.0005 ms) */
			ck_assert_msg(min >= 0 && min <= med &&
				      min * calls <= ms * 1e3 + 0.5 + 0.05 * calls,
				      "min %.1f us, median %.1f us, %d calls in %.3f ms: %s", min, med,
				      calls, ms, line);
			/* "label op pass" with single spaces */
			char key[512] = "";
			for (int k = 0; k < nt - 6; k++)
				snprintf(key + strlen(key), sizeof key - strlen(key), "%s%s",
					 k ? " " : "", tok[k]);
			for (int w = 0; w < n_want; w++)
				found[w] |= strstr(key, want[w]) == key;
			for (int w = 0; w < n_absent; w++)
				ck_assert_msg(strstr(key, absent[w]) != key, "a row starts with '%s': %s",
					      absent[w], line);
		}
		sum_ms += ms;
		sum_pct += pct;
		rows++;
	}
	fclose(f);
	ck_assert_int_eq(rules, 2);
	ck_assert_msg(rows > 10, "%d rows", rows);
	ck_assert_msg(total_ms > 0, "no total line");
	ck_assert_msg(host_ms >= 0, "untracked host time %.3f ms < 0: rows overlap", host_ms);
	/* rounding: 0.0005 ms and 0.005 % per row */
	ck_assert_msg(fabs(sum_ms - total_ms) <= 0.0005 * rows + 1e-6,
		      "rows add up to %.3f ms, the total says %.3f", sum_ms, total_ms);
	ck_assert_msg(fabs(sum_pct - 100) <= 0.005 * rows + 1e-6, "rows add up to %.2f %%",
		      sum_pct);
	for (int w = 0; w < n_want; w++)
		ck_assert_msg(found[w], "no row starting with '%s'", want[w]);
}

/* The calls of the table's row "label op pass" in dir/profile.txt, and
 * the steps the table counts (*steps). */
static int row_calls(const char *dir, const char *row, int *steps)
{
	char path[4200], line[512];
	int calls = -1;
	snprintf(path, sizeof path, "%s/profile.txt", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "no %s", path);
	ck_assert(fgets(line, sizeof line, f) && sscanf(line, "%d step(s)", steps) == 1);
	while (fgets(line, sizeof line, f)) {
		char a[64], b[64], c[64];
		int n;
		if (sscanf(line, "%63s %63s %63s %d", a, b, c, &n) == 4) {
			char key[200];
			snprintf(key, sizeof key, "%s %s %s", a, b, c);
			if (!strcmp(key, row))
				calls = n;
		}
	}
	fclose(f);
	return calls;
}

/* The CPU device reads the batch where the loader (or the inline read)
 * put it: the input's only copy a step is the labels' (x's too in the
 * second step, before the trainer knows its steps are not captured). */
static void check_x_in_place(const char *dir)
{
	int steps = 0;
	const int calls = row_calls(dir, "input copy_h2d data", &steps);
	ck_assert_int_gt(steps, 2);
	ck_assert_msg(calls >= steps && calls <= steps + 1,
		      "%d input copies in %d steps: x copied into device memory", calls, steps);
}

/* Profiled and plain runs train the same numbers. */
static void check_same(const struct kiln_train_result *a, const struct kiln_train_result *b)
{
	ck_assert_int_eq(a->steps, b->steps);
	ck_assert_msg(a->train_loss == b->train_loss, "train loss %.9g vs %.9g", a->train_loss,
		      b->train_loss);
	ck_assert(a->train_acc == b->train_acc);
	ck_assert_msg(a->test_loss == b->test_loss, "test loss %.9g vs %.9g", a->test_loss,
		      b->test_loss);
	ck_assert(a->test_acc == b->test_acc);
}

/* Asynchronous streams (the CPU device's async = 1): the profiler's syncs
 * make the slices the ops' own times.  Unfused: the ReLUs' own ops. */
static const char unfused[] = "run.fuse=0";
START_TEST(test_profile_cnn)
{
	char dir[1024];
	struct kiln_train_result on = KILN_TRAIN_RESULT_INIT, off = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	scratch_dir(dir, sizeof dir);
	train(dir, 1, 4, 1, "nchw", 1, unfused, &on);
	ck_assert_int_eq(on.steps, 10);
	check_trace(dir, 4);
	static const char *const want[] = { "c2 conv forward", "c2 conv_bwd_data backward",
					    "optimizer sgd optimizer",
					    "schedule lr_schedule optimizer",
					    "data wait loader data", "input copy_h2d data",
					    "r2 relu forward", "r1 relu_bwd backward" };
	check_table(dir, want, 8, NULL, 0);
	check_x_in_place(dir);
	train("", 0, 4, 1, "nchw", 1, unfused, &off);
	check_same(&on, &off);
	ck_assert_uint_eq(off.steady.host_syncs, 0); /* profiling off: no sync in a step */
}
END_TEST

/* Synchronous device, inline reads (workers = 0), channels-last (flatten
 * reorders to NCHW), and profile_steps = 0: the table only, no trace. */
START_TEST(test_profile_inline_nhwc)
{
	char dir[1024], path[4200];
	struct kiln_train_result on = KILN_TRAIN_RESULT_INIT, off = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	scratch_dir(dir, sizeof dir);
	train(dir, 1, 0, 0, "nhwc", 0, "", &on);
	static const char *const want[] = { "data read inline data", "flat reorder forward",
					    "input copy_h2d data" };
	/* [run] fuse = auto: on the CPU the ReLUs are the epilogues of bn and
	 * c2, views with no op of their own */
	static const char *const absent[] = { "r1 ", "r2 " };
	check_table(dir, want, 3, absent, 2);
	check_x_in_place(dir);
	snprintf(path, sizeof path, "%s/trace.json", dir);
	ck_assert_msg(access(path, F_OK) != 0, "profile_steps = 0 wrote %s", path);
	train("", 0, 0, 0, "nhwc", 0, "", &off);
	check_same(&on, &off);
}
END_TEST

/* core/profile.h (exported as every kiln_ symbol) */
struct kiln_profile;
kiln_status kiln_profile_open(const struct kiln_config *cfg, struct kiln_profile **out);
void kiln_profile_free(struct kiln_profile *p);
void kiln_profile_step(struct kiln_profile *p, int begin);
void kiln_profile_span(struct kiln_profile *p, const char *label, const char *what, int pass,
		       int track, int64_t t0, int64_t t1);
void kiln_profile_note(struct kiln_profile *p, const char *line);
kiln_status kiln_profile_report(struct kiln_profile *p, const char *out_dir);

/* A note (the pipeline's lines after the table) is written whole: a
 * "pipeline gaps" line of 16 stages is about 600 characters, which the
 * 256 of each note's slot cut before. */
START_TEST(test_profile_long_note)
{
	char dir[1024], path[4200], note[1024], got[4096];
	struct kiln_config *cfg;
	struct kiln_profile *p = NULL;
	scratch_dir(dir, sizeof dir);
	ck_assert(kiln_config_load_string("[run]\nprofile = 1\n", "note.ini", &cfg) == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_profile_open(cfg, &p) == KILN_OK && p, "%s", kiln_last_error());
	for (int i = 0; i < 2; i++) { /* a warm-up step, then one counted */
		kiln_profile_step(p, 1);
		kiln_profile_step(p, 0);
	}
	int k = snprintf(note, sizeof note, "pipeline gaps ms/step:");
	for (int st = 0; st < 16; st++)
		k += snprintf(note + k, sizeof note - (size_t)k,
			      " stage %d waits 1.%03d fwd 2.%03d bwd,", st, st, st);
	snprintf(note + k, sizeof note - (size_t)k, " end");
	ck_assert_int_gt((int)strlen(note), 500);
	kiln_profile_note(p, "a short note");
	kiln_profile_note(p, note);
	ck_assert_msg(kiln_profile_report(p, dir) == KILN_OK, "%s", kiln_last_error());
	kiln_profile_free(p);
	kiln_config_free(cfg);
	snprintf(path, sizeof path, "%s/profile.txt", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	int whole = 0, shortn = 0;
	while (fgets(got, sizeof got, f)) {
		got[strcspn(got, "\n")] = 0;
		whole += !strcmp(got, note);
		shortn += !strcmp(got, "a short note");
	}
	fclose(f);
	ck_assert_msg(whole == 1 && shortn == 1,
		      "%s: the %zu-character note written %d times whole, the short one %d",
		      path, strlen(note), whole, shortn);
}
END_TEST

/* The log's profile lines that start with the label below, whole. */
static const char *long_label;
static int label_logged;

static void label_sink(void *user, int level, const char *who, const char *msg)
{
	(void)user;
	(void)level;
	if (!strcmp(who, "profile") && !strncmp(msg, long_label, strlen(long_label)) &&
	    strstr(msg + strlen(long_label), " wait "))
		label_logged++;
}

/* A table row of a layer whose name is longer than a line's 512
 * characters, and than a log message's 2048, is written and logged whole,
 * its figures after it. */
START_TEST(test_profile_long_label)
{
	char dir[1024], path[1100], label[2100], got[4096];
	struct kiln_config *cfg;
	struct kiln_profile *p = NULL;
	scratch_dir(dir, sizeof dir);
	for (size_t i = 0; i < sizeof label - 1; i++)
		label[i] = (char)('a' + i % 26);
	label[sizeof label - 1] = 0;
	ck_assert(kiln_config_load_string("[run]\nprofile = 1\n", "label.ini", &cfg) == KILN_OK);
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_profile_open(cfg, &p) == KILN_OK && p, "%s", kiln_last_error());
	for (int i = 0; i < 2; i++) { /* a warm-up step, then one counted */
		kiln_profile_step(p, 1);
		kiln_profile_span(p, label, "wait", KILN_PHASE_DATA, KILN_PROF_TRACK_WAIT, 1000000,
				  3000000);
		kiln_profile_step(p, 0);
	}
	long_label = label;
	label_logged = 0;
	kiln_log_set_sink(label_sink, NULL);
	kiln_status st = kiln_profile_report(p, dir);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert_int_eq(label_logged, 1);
	kiln_profile_free(p);
	kiln_config_free(cfg);
	snprintf(path, sizeof path, "%s/profile.txt", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	int rows = 0;
	while (fgets(got, sizeof got, f)) {
		long long calls = 0;
		double ms = 0;
		/* "LABEL  wait  data  1  2.000 ..." */
		if (!strncmp(got, label, strlen(label)) &&
		    sscanf(got + strlen(label), " wait data %lld %lf", &calls, &ms) == 2) {
			ck_assert_int_eq(calls, 1);
			ck_assert_double_eq_tol(ms, 2.0, 1e-9);
			rows++;
		}
	}
	fclose(f);
	ck_assert_msg(rows == 1, "%s: the row of a %zu-character layer name found whole %d times", path,
		      strlen(label), rows);
}
END_TEST

/* The row "LABEL op data" of dir/profile.txt: its calls, total (ms),
 * mean, median and min (us); 0 when not found. */
static int read_row(const char *dir, const char *label, long long *calls, double *v)
{
	char path[1100], line[512], a[64], b[64], c[64];
	int found = 0;
	snprintf(path, sizeof path, "%s/profile.txt", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "no %s", path);
	while (fgets(line, sizeof line, f)) {
		double pct, w[4];
		long long k;
		if (sscanf(line, "%63s %63s %63s %lld %lf %lf %lf %lf %lf", a, b, c, &k, &w[0],
			   &w[1], &pct, &w[2], &w[3]) == 9 &&
		    !strcmp(a, label) && !strcmp(b, "op") && !strcmp(c, "data")) {
			*calls = k;
			memcpy(v, w, sizeof w);
			found++;
		}
	}
	fclose(f);
	return found == 1;
}

/* One step before the report: warm-up (not counted) spans of 1 s, then
 * the counted ones, each row's durations (us) from its list. */
static struct kiln_profile *feed(struct kiln_config **cfg, const char *const *labels,
				 const int64_t *const *us, const int *n, int rows)
{
	struct kiln_profile *p = NULL;
	ck_assert(kiln_config_load_string("[run]\nprofile = 1\nprofile_steps = 0\n", "med.ini",
					  cfg) == KILN_OK);
	ck_assert_msg(kiln_config_validate(*cfg, reg) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_profile_open(*cfg, &p) == KILN_OK && p, "%s", kiln_last_error());
	kiln_profile_step(p, 1);
	for (int r = 0; r < rows; r++)
		kiln_profile_span(p, labels[r], "op", KILN_PHASE_DATA, KILN_PROF_TRACK_WAIT, 0,
				  1000000000);
	kiln_profile_step(p, 0);
	kiln_profile_step(p, 1);
	int64_t t = 0;
	for (int r = 0; r < rows; r++)
		for (int i = 0; i < n[r]; i++) {
			kiln_profile_span(p, labels[r], "op", KILN_PHASE_DATA, KILN_PROF_TRACK_WAIT,
					  t, t + us[r][i] * 1000);
			t += us[r][i] * 1000;
		}
	kiln_profile_step(p, 0);
	return p;
}

/* A few preempted calls (2 and 8 ms among 0.5 ms ones) move the mean, not
 * the median; an even count's median is the mean of the middle two. */
START_TEST(test_profile_median)
{
	char dir[1024];
	struct kiln_config *cfg;
	static const int64_t odd[] = { 520, 2000, 500, 8000, 510 }, even[] = { 300, 100, 400, 200 };
	static const char *const labels[] = { "odd", "even" };
	const int64_t *const us[] = { odd, even };
	const int n[] = { 5, 4 };
	scratch_dir(dir, sizeof dir);
	struct kiln_profile *p = feed(&cfg, labels, us, n, 2);
	ck_assert_msg(kiln_profile_report(p, dir) == KILN_OK, "%s", kiln_last_error());
	kiln_profile_free(p);
	kiln_config_free(cfg);
	long long calls;
	double v[4]; /* total ms, mean, median, min us */
	ck_assert(read_row(dir, "odd", &calls, v));
	ck_assert_int_eq(calls, 5);
	ck_assert_double_eq_tol(v[0], 11.530, 1e-9);
	ck_assert_double_eq_tol(v[1], 2306.0, 1e-9);
	ck_assert_double_eq_tol(v[2], 520.0, 1e-9);
	ck_assert_double_eq_tol(v[3], 500.0, 1e-9);
	ck_assert(read_row(dir, "even", &calls, v));
	ck_assert_int_eq(calls, 4);
	ck_assert_double_eq_tol(v[1], 250.0, 1e-9);
	ck_assert_double_eq_tol(v[2], 250.0, 1e-9);
	ck_assert_double_eq_tol(v[3], 100.0, 1e-9);
}
END_TEST

/* Past the sample's cap (1024 a row) the median is a reservoir sample's:
 * 3000 calls of 500 us with every tenth 5 ms, then one of 400 us; the min
 * is over every call. */
START_TEST(test_profile_median_sampled)
{
	enum { N = 3001 };
	char dir[1024];
	struct kiln_config *cfg;
	static int64_t many[N];
	for (int i = 0; i < N - 1; i++)
		many[i] = i % 10 == 9 ? 5000 : 500;
	many[N - 1] = 400;
	static const char *const labels[] = { "many" };
	const int64_t *const us[] = { many };
	const int n[] = { N };
	scratch_dir(dir, sizeof dir);
	struct kiln_profile *p = feed(&cfg, labels, us, n, 1);
	ck_assert_msg(kiln_profile_report(p, dir) == KILN_OK, "%s", kiln_last_error());
	kiln_profile_free(p);
	kiln_config_free(cfg);
	long long calls;
	double v[4];
	ck_assert(read_row(dir, "many", &calls, v));
	ck_assert_int_eq(calls, N);
	ck_assert_double_eq_tol(v[1], (2700 * 500.0 + 300 * 5000.0 + 400) / N, 0.051);
	ck_assert_double_eq_tol(v[2], 500.0, 1e-9);
	ck_assert_double_eq_tol(v[3], 400.0, 1e-9);
}
END_TEST

static Suite *make_profile_suite(void)
{
	Suite *s = suite_create("profile");
	check_add_case(s, "cnn", 300, scratch_setup, scratch_teardown, (const TTest *[]){
		test_profile_cnn, test_profile_inline_nhwc, NULL });
	check_add_case(s, "notes", 60, scratch_setup, scratch_teardown, (const TTest *[]){
		test_profile_long_note, test_profile_long_label, test_profile_median,
		test_profile_median_sampled, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_profile_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
