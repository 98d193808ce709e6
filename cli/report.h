/* cli/report.h - the pieces of `kiln report` (cli/cmd_report.c): a run's
 * metrics read into named series (report_metrics.c) and SVG line charts
 * of them (report_svg.c). */
#ifndef KILN_CLI_REPORT_H
#define KILN_CLI_REPORT_H

#include <stdio.h>

/* One curve: y against the step.  Named "EVENT.FIELD": "train.loss",
 * "train.lr", ... for metrics.jsonl's train lines, "SET.FIELD" ("test.acc",
 * "val.loss") for its eval lines; the whole name, however long (malloc'd:
 * a fixed 64 bytes cut longer ones, and two fields alike in their first 63
 * bytes became one series). */
struct report_series {
	char *name;
	int n, cap;
	double *x, *y;
};

/* The longest metrics.jsonl line read (bytes, its newline included): a
 * longer one is skipped as a bad line.  kiln's own lines are a few hundred
 * bytes; getline() read a 20 MB file without a newline whole, and jansson
 * parsed it again (session 36). */
#define REPORT_LINE_MAX (1 << 20)

/* A number of the "final" line: v, or NAN when the line lacks it or gives
 * null; null 1 for the latter (kiln writes a number that is not finite,
 * a diverged loss, as null, and the test numbers of a run without
 * evaluation: kiln report tells them from a field the line lacks). */
struct report_number {
	double v;
	int null;
};

struct report_metrics {
	int n, cap;
	struct report_series *s;
	/* the series by name: an open-addressed table of n_slot (a power of
	 * two, > 2 n) indices + 1 into s, 0 empty (report_metrics.c) */
	int *slot, n_slot;
	long lines, bad_lines;     /* read, and not a JSON object */
	long long_lines;           /* of bad_lines, those over REPORT_LINE_MAX */
	/* "resume" lines, and the train and eval lines before them whose
	 * step is past the resume's: the interrupted run's, after the
	 * checkpoint it resumed from, which the resumed run logged again
	 * (left out of the series: a run resumed at step 200 of 400 plotted
	 * 405 points before session 40) */
	long resumes, abandoned;
	/* the last resume's step: an evaluation logged again at that step
	 * (an epoch's last step, checkpointed before its evaluation, the run
	 * killed after it) replaces the interrupted run's point there */
	double resume_step;
	/* the steps of the train and eval lines kept so far, in file order
	 * (report_metrics.c: the lines a resume abandons are counted) */
	double *line_step;
	long n_line, cap_line;
	int have_final;            /* the "final" line's numbers */
	struct report_number final_epochs, final_steps, final_train_loss, final_test_acc,
		final_test_loss, final_wall_s,
		final_samples_per_s;   /* train_samples_per_s: one data-parallel rank's */
	struct report_number final_run_samples_per_s; /* samples_per_s: every rank's (session 39) */
	char why[96]; /* report_metrics_read's failure: "No such file or directory",
		       * "a FIFO (named pipe), not a regular file" */
};

/* Read RUN_DIR/metrics.jsonl (path) into m: every numeric field of every
 * train and eval line (but epoch and step) as a series against the step;
 * at a "resume" line of step S, the points past S dropped (those of the
 * run it resumed, logged after its checkpoint: the later line counts, as
 * docs/logging.md says).
 * -1 with errno and m->why when the file cannot be read (it must be a
 * regular file: a FIFO blocked open() for ever, a directory read as an
 * empty file); 0 otherwise. */
int report_metrics_read(const char *path, struct report_metrics *m);
void report_metrics_free(struct report_metrics *m);
/* The series called name, NULL when no line had it. */
const struct report_series *report_series_find(const struct report_metrics *m, const char *name);

/* Write s as HTML text (&, <, >, " and ' escaped). */
void report_html_text(FILE *f, const char *s);

/* An inline SVG line chart (id "plot-<id>") of the n series (NULL ones
 * skipped) labelled labels[i]: axes with ticks, one polyline per series and
 * one <circle class="pt" data-series="NAME"> per point, a legend. */
void report_svg_chart(FILE *f, const char *id, const char *title,
		      const struct report_series *const *series, const char *const *labels, int n);

#endif
