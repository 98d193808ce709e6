/* tests/check_report.c - `kiln report`'s reading of metrics.jsonl
 * (cli/report_metrics.c, compiled in) into named series.
 *
 * test_long_names: field and set names far past the 63 bytes a series
 * name once held: two train fields alike in their first 80 bytes stay two
 * series (they were cut to 63 and merged into one, the points of both),
 * each with its own points; an eval set of 200 bytes gets its whole name;
 * the short names beside them are read as before.
 * test_counts: the series and points of an ordinary file (train and eval
 * lines, a line that is not JSON, a line without a step), and the final
 * line's numbers.  test_final_missing: a null or absent final number is
 * NAN, and a null one says so (kiln report shows "not finite", or "none
 * (no evaluation)" for both test numbers, not "missing" as before session
 * 40).  test_resume: a resumed run's file, the interrupted run's lines
 * past the checkpoint before the "resume" line: those points are dropped
 * (the report plotted them beside the resumed run's: 405 points for 400
 * steps before session 40), the later lines' points kept.
 * test_chart_hostile: report_svg_chart (cli/report_svg.c, compiled in) on
 * ranges that broke it: one point at step 2^53 or 2^52, two at 1e17 and
 * 1e17 + 16 (the x tick loop `t += st` stopped advancing and wrote grid
 * lines until the disk was full), losses of +-1e308 and steps of
 * +-9.9e307 (the range overflowed to inf: every point "-nan").  Each chart
 * is written within an alarm, has at most 16 ticks per axis and no "nan"
 * or "inf" in it.  test_not_regular: a FIFO or a directory as
 * metrics.jsonl is refused (a FIFO blocked). */
#include "../cli/report.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <float.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* text written to a fresh $TMPDIR/kiln-report-XXXXXX/metrics.jsonl, read
 * into m; the directory removed */
static void read_text(const char *text, struct report_metrics *m)
{
	char dir[1024], path[1100];
	ck_assert(test_tmpdir_make(dir, sizeof dir, "report") != NULL);
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	FILE *f = fopen(path, "w");
	ck_assert(f != NULL);
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(report_metrics_read(path, m), 0);
	test_tmpdir_remove(dir);
}

/* series name has n points, the step and value of point i given by x0 +
 * i * dx and y0 + i * dy */
static void has_points(const struct report_metrics *m, const char *name, int n, double x0,
		       double dx, double y0, double dy)
{
	const struct report_series *s = report_series_find(m, name);
	ck_assert_msg(s != NULL, "no series '%s'", name);
	ck_assert_str_eq(s->name, name);
	ck_assert_int_eq(s->n, n);
	for (int i = 0; i < n; i++) {
		ck_assert_double_eq(s->x[i], x0 + i * dx);
		ck_assert_double_eq(s->y[i], y0 + i * dy);
	}
}

START_TEST(test_long_names)
{
	char stem[81], set[201], a[100], b[100], text[4096], name[300];
	memset(stem, 'f', 80), stem[80] = '\0';
	memset(set, 's', 200), set[200] = '\0';
	snprintf(a, sizeof a, "%s_a", stem);
	snprintf(b, sizeof b, "%s_b", stem);
	size_t len = 0;
	for (int step = 1; step <= 3; step++)
		len += (size_t)snprintf(text + len, sizeof text - len,
					"{\"event\":\"train\",\"step\":%d,\"loss\":%d,\"%s\":%d,\"%s\":%d}\n",
					step, step, a, 10 * step, b, 100 * step);
	snprintf(text + len, sizeof text - len,
		 "{\"event\":\"eval\",\"set\":\"%s\",\"step\":3,\"acc\":0.5}\n", set);
	struct report_metrics m;
	read_text(text, &m);
	ck_assert_int_eq(m.n, 4); /* train.loss, train.A, train.B, SET.acc */
	has_points(&m, "train.loss", 3, 1, 1, 1, 1);
	snprintf(name, sizeof name, "train.%s", a);
	has_points(&m, name, 3, 1, 1, 10, 10);
	snprintf(name, sizeof name, "train.%s", b);
	has_points(&m, name, 3, 1, 1, 100, 100);
	snprintf(name, sizeof name, "%s.acc", set);
	has_points(&m, name, 1, 3, 0, 0.5, 0);
	/* a prefix of a long name is no series */
	snprintf(name, sizeof name, "train.%.57s", a);
	ck_assert_ptr_null(report_series_find(&m, name));
	report_metrics_free(&m);
}
END_TEST

START_TEST(test_counts)
{
	static const char text[] =
		"{\"event\":\"train\",\"step\":10,\"epoch\":0,\"loss\":2.5,\"lr\":0.1}\n"
		"not json\n"
		"{\"event\":\"train\",\"loss\":9}\n" /* no step: skipped */
		"{\"event\":\"train\",\"step\":20,\"epoch\":0,\"loss\":1.5,\"lr\":0.1}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":20,\"loss\":1.75,\"acc\":0.625}\n"
		"{\"event\":\"final\",\"epochs\":1,\"steps\":20,\"test_loss\":1.75,\"test_acc\":0.625,"
		"\"wall_s\":4,\"train_samples_per_s\":1000,\"samples_per_s\":2000}\n";
	struct report_metrics m;
	read_text(text, &m);
	ck_assert_int_eq(m.lines, 6);
	ck_assert_int_eq(m.bad_lines, 1);
	ck_assert_int_eq(m.n, 4); /* train.loss, train.lr, test.loss, test.acc */
	has_points(&m, "train.loss", 2, 10, 10, 2.5, -1);
	has_points(&m, "train.lr", 2, 10, 10, 0.1, 0);
	has_points(&m, "test.loss", 1, 20, 0, 1.75, 0);
	has_points(&m, "test.acc", 1, 20, 0, 0.625, 0);
	ck_assert_ptr_null(report_series_find(&m, "train.epoch"));
	ck_assert_int_eq(m.have_final, 1);
	ck_assert_double_eq(m.final_steps.v, 20);
	ck_assert_double_eq(m.final_test_acc.v, 0.625);
	ck_assert_double_eq(m.final_samples_per_s.v, 1000);
	ck_assert_double_eq(m.final_run_samples_per_s.v, 2000); /* the run's: 2 ranks */
	ck_assert_int_eq(m.resumes, 0);
	ck_assert_int_eq(m.abandoned, 0);
	report_metrics_free(&m);
}
END_TEST

/* A final line without evaluation (null test numbers), with a diverged
 * train loss (null), or lacking a field: NAN, not 0, the null ones
 * flagged (their rows say "not finite" or "none (no evaluation)", the
 * absent ones "missing"). */
START_TEST(test_final_missing)
{
	static const char text[] =
		"{\"event\":\"final\",\"epochs\":2,\"steps\":9,\"train_loss\":null,"
		"\"test_loss\":null,\"test_acc\":null}\n";
	struct report_metrics m;
	read_text(text, &m);
	ck_assert_int_eq(m.have_final, 1);
	ck_assert_double_eq(m.final_epochs.v, 2);
	ck_assert_int_eq(m.final_epochs.null, 0);
	ck_assert_double_eq(m.final_steps.v, 9);
	const struct report_number *nulls[] = { &m.final_train_loss, &m.final_test_loss,
						&m.final_test_acc },
				   *absent[] = { &m.final_wall_s, &m.final_samples_per_s,
						 &m.final_run_samples_per_s }; /* (a line before session 39) */
	for (int i = 0; i < 3; i++) {
		ck_assert(isnan(nulls[i]->v) && nulls[i]->null == 1);
		ck_assert(isnan(absent[i]->v) && absent[i]->null == 0);
	}
	report_metrics_free(&m);
}
END_TEST

/* A run of 8 steps (log_every 2) interrupted after step 6's line, resumed
 * from step 4's checkpoint: the first run's lines of step 6 (train and
 * eval) come before the resume line and are dropped; the resumed run's 6
 * and 8 count; the line of step 4 (before the checkpoint) stays.  A
 * second resume, at step 6 (from a checkpoint of the resumed run), drops
 * the resumed run's step 8 likewise. */
START_TEST(test_resume)
{
	static const char text[] =
		"{\"event\":\"train\",\"step\":2,\"loss\":2.0}\n"
		"{\"event\":\"train\",\"step\":4,\"loss\":1.5}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":4,\"loss\":1.75}\n"
		"{\"event\":\"checkpoint\",\"step\":4,\"path\":\"c/ckpt-4.kiln\"}\n"
		"{\"event\":\"train\",\"step\":6,\"loss\":99}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":6,\"loss\":99}\n"
		"{\"event\":\"resume\",\"epoch\":1,\"step\":4,\"offset\":32}\n"
		"{\"event\":\"train\",\"step\":6,\"loss\":1.0}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":6,\"loss\":1.25}\n"
		"{\"event\":\"train\",\"step\":8,\"loss\":98}\n"
		"{\"event\":\"resume\",\"epoch\":1,\"step\":6,\"offset\":48}\n"
		"{\"event\":\"train\",\"step\":8,\"loss\":0.5}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":8,\"loss\":0.75}\n";
	struct report_metrics m;
	read_text(text, &m);
	has_points(&m, "train.loss", 4, 2, 2, 2.0, -0.5);
	has_points(&m, "test.loss", 3, 4, 2, 1.75, -0.5);
	ck_assert_int_eq(m.resumes, 2);
	ck_assert_int_eq(m.abandoned, 3); /* the lines of train 6 and test 6, then train 8 */
	report_metrics_free(&m);
}
END_TEST

/* A run's "final" line, then --resume with more epochs: the result is the
 * continued run's (none while it runs), not the earlier one's; and an
 * epoch's evaluation logged again at the resume's step (its checkpoint
 * written before the evaluation, the run killed after it) is one point,
 * the later (review of session 40: the final stayed, the point doubled). */
START_TEST(test_resume_final)
{
	static const char text[] =
		"{\"event\":\"train\",\"step\":2,\"loss\":2.0}\n"
		"{\"event\":\"train\",\"step\":4,\"loss\":1.5}\n"
		"{\"event\":\"checkpoint\",\"step\":4,\"path\":\"c/ckpt-4.kiln\"}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":4,\"loss\":1.75}\n"
		"{\"event\":\"final\",\"epochs\":1,\"steps\":4,\"train_loss\":1.5}\n"
		"{\"event\":\"resume\",\"epoch\":1,\"step\":4,\"offset\":32}\n"
		"{\"event\":\"eval\",\"set\":\"test\",\"step\":4,\"loss\":1.5}\n"
		"{\"event\":\"train\",\"step\":6,\"loss\":1.0}\n";
	struct report_metrics m;
	read_text(text, &m);
	ck_assert_int_eq(m.have_final, 0);
	has_points(&m, "train.loss", 3, 2, 2, 2.0, -0.5);
	has_points(&m, "test.loss", 1, 4, 2, 1.5, 0);
	ck_assert_int_eq(m.abandoned, 1);
	report_metrics_free(&m);
}
END_TEST

/* metrics.jsonl that is not a regular file: a FIFO (open() blocked for
 * ever) and a directory (read as an empty file: an empty report, exit 0)
 * are refused saying what they are (session 33); a missing file says so. */
START_TEST(test_not_regular)
{
	char dir[1024], path[1100];
	struct report_metrics m;
	ck_assert(test_tmpdir_make(dir, sizeof dir, "report") != NULL);
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	ck_assert_int_eq(report_metrics_read(path, &m), -1);
	ck_assert_str_eq(m.why, "No such file or directory");
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	alarm(10); /* the old code blocked in open() */
	ck_assert_int_eq(report_metrics_read(path, &m), -1);
	alarm(0);
	ck_assert_str_eq(m.why, "a FIFO (named pipe), not a regular file");
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(report_metrics_read(path, &m), -1);
	ck_assert_str_eq(m.why, "a directory, not a regular file");
	ck_assert_int_eq(rmdir(path), 0);
	test_tmpdir_remove(dir);
}
END_TEST

/* the number of times needle occurs in hay */
static int count_of(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

START_TEST(test_chart_hostile)
{
	static const struct {
		int n;
		double x[2], y[2];
	} cases[] = {
		{ 1, { 9007199254740992.0 }, { 1 } },
		{ 1, { 4503599627370496.0 }, { 1 } },
		{ 2, { 1e17, 1e17 + 16 }, { 1, 2 } },
		{ 2, { 1, 2 }, { -1e308, 1e308 } },
		{ 2, { -9.9e307, 9.9e307 }, { 1, 2 } },
		{ 2, { -DBL_MAX, DBL_MAX }, { DBL_MAX, -DBL_MAX } },
		{ 1, { 0 }, { 0 } },
	};
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		double x[2], y[2];
		memcpy(x, cases[c].x, sizeof x), memcpy(y, cases[c].y, sizeof y);
		struct report_series s = { .name = "train.loss", .n = cases[c].n, .x = x, .y = y };
		const struct report_series *series[] = { &s };
		const char *labels[] = { "loss" };
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);
		ck_assert(f != NULL);
		alarm(10); /* a regression fails here, not after filling memory */
		report_svg_chart(f, "loss", "loss", series, labels, 1);
		alarm(0);
		ck_assert_int_eq(fclose(f), 0);
		const int grid = count_of(buf, "class=\"grid\"");
		ck_assert_msg(grid >= 2 && grid <= 32, "case %zu: %d grid lines", c, grid);
		ck_assert_msg(!strstr(buf, "nan") && !strstr(buf, "inf"), "case %zu: %s", c, buf);
		ck_assert_int_eq(count_of(buf, "<circle"), cases[c].n);
		free(buf);
	}
}
END_TEST

static Suite *make_report_suite(void)
{
	Suite *s = suite_create("report");
	check_add_case(s, "metrics", 0, NULL, NULL,
		       (const TTest *[]){ test_long_names, test_counts, test_final_missing, test_resume, test_resume_final,
					  NULL });
	check_add_case(s, "open", 30, NULL, NULL, (const TTest *[]){ test_not_regular, NULL });
	check_add_case(s, "chart", 30, NULL, NULL, (const TTest *[]){ test_chart_hostile, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_report_suite };
