/* tests/check_resume_best.c - a run resumed from a keep_best checkpoint
 * (a best/ file copied into checkpoints/ of a fresh run directory, the
 * way docs/checkpoints.md describes) goes on as the uninterrupted run did
 * (session 35; before it best/ files had no "epoch", "stopper" or
 * "evaluated" section, so such a resume started early stopping's count
 * afresh, averaged its epoch's train loss over the steps after the resume
 * alone, and ran and recorded again the epoch's evaluation it was written
 * after).
 *
 *   eval every    a best/ file of an eval_every evaluation mid-epoch:
 *                 the resumed run stops early at the uninterrupted run's
 *                 step, with its train loss, evaluations and bytes
 *   epoch eval    a best/ file of an epoch's evaluation: not run again,
 *                 the epoch lines, stop and keep_best list as the
 *                 uninterrupted run's
 *   final test    a best/ file of the run's last evaluation with
 *                 [data.val]: the resume runs the final test once and
 *                 writes the checkpoint again with it, so a second resume
 *                 records nothing
 *
 * Fashion-MNIST (scripts/install-deps), 640 samples of [data] limit,
 * batch 16 x accumulate 2: 20 steps an epoch, about a second a run.
 */
#include <kiln/kiln.h>

#include "checkpoint.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct kiln_registry *reg;

/* run directories: kiln-resbest-* in $TMPDIR, removed after a passing test */
#define SCRATCH_TAG "resbest"
#include "test_scratch.h"
#include "resume_rig.h"

/* the epoch lines the progress callback got, their "(T s, N samples/s)"
 * cut (it differs between runs), one a line */
static char epoch_lines[2048];

static void lines_progress(void *user, int epoch, int64_t step, int64_t steps, const char *status)
{
	(void)user, (void)epoch, (void)steps;
	if (step >= 0 || !status)
		return;
	const char *open = strstr(status, " ("), *close = open ? strchr(open, ')') : NULL;
	size_t len = strlen(epoch_lines);
	if (open && close)
		snprintf(epoch_lines + len, sizeof epoch_lines - len, "%.*s%s\n",
			 (int)(open - status), status, close + 1);
	else
		snprintf(epoch_lines + len, sizeof epoch_lines - len, "%s\n", status);
}

/* cnn_train with epoch_lines started empty */
static kiln_status train_run(const char *dir, const char *const *ov, struct kiln_train_result *res)
{
	epoch_lines[0] = 0;
	return cnn_train(dir, ov, lines_progress, res);
}

/* everything but the config (which names the run directory) */
static const char *const resume_tags[] = { "trainer", "params", "buffers", "optim.exp_avg",
					   "optim.exp_avg_sq", "step", "optim.step", "epoch",
					   "stopper", "best", "eval_owed", "evaluated",
					   "clip_counts", NULL };

static void copy_file(const char *src, const char *dst)
{
	size_t n;
	char *bytes = test_read_file(src, &n);
	ck_assert_msg(bytes != NULL, "%s", src);
	FILE *f = fopen(dst, "wb");
	ck_assert_msg(f && fwrite(bytes, 1, n, f) == n && fclose(f) == 0, "%s", dst);
	free(bytes);
}

/* A fresh run directory b resuming from run a's best/ckpt-<step>.kiln:
 * the file as b's only checkpoint, and a's best/ as b's (the resume keeps
 * the files its list names, deletes the others). */
static void resume_dir_from_best(const char *a, const char *b, int step)
{
	char src[400], dst[400], l[400];
	snprintf(dst, sizeof dst, "%s/checkpoints", b);
	ck_assert(mkdir(dst, 0777) == 0);
	snprintf(dst, sizeof dst, "%s/checkpoints/best", b);
	ck_assert(mkdir(dst, 0777) == 0);
	snprintf(src, sizeof src, "%s/checkpoints/best", a);
	ckpt_files(src, l, sizeof l);
	for (char *p = l; *p; p += strspn(p, " ")) {
		snprintf(src, sizeof src, "%s/checkpoints/best/ckpt-%d.kiln", a, atoi(p));
		snprintf(dst, sizeof dst, "%s/checkpoints/best/ckpt-%d.kiln", b, atoi(p));
		copy_file(src, dst);
		p += strcspn(p, " ");
	}
	snprintf(src, sizeof src, "%s/checkpoints/best/ckpt-%d.kiln", a, step);
	snprintf(dst, sizeof dst, "%s/checkpoints/ckpt-%d.kiln", b, step);
	copy_file(src, dst);
}

/* An evaluation every 5 steps, early stopping that never sees an
 * improvement (min_delta 100, patience 2: it stops at the third, after
 * step 15, in epoch 1), keep_best = 3 by loss: best/ holds all three.
 * Resumed from best/ckpt-5.kiln, the run stops at 15 too, with the
 * uninterrupted run's epoch line, train loss, evaluations and final
 * checkpoint.  Before session 35 the file had no "stopper": the resumed
 * run took its evaluation at 10 as its first best and stopped at 20; and
 * no "epoch": its train loss averaged steps 6..15 alone. */
START_TEST(test_best_eval_every)
{
	char a[64], b[64], d[300], fa[300], fb[300], l[400], lines[2048];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	const char *const run[] = { "train.eval_every=5", "train.early_stop_patience=2",
				    "train.early_stop_metric=loss", "train.early_stop_min_delta=100",
				    "train.keep_best=3", "train.best_metric=loss", NULL };
	const char *const resume[] = { "train.eval_every=5", "train.early_stop_patience=2",
				       "train.early_stop_metric=loss",
				       "train.early_stop_min_delta=100", "train.keep_best=3",
				       "train.best_metric=loss", "train.resume=1", NULL };
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	ck_assert_msg(train_run(a, run, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 15);
	ck_assert_int_eq(ra.early_stopped, 1);
	snprintf(lines, sizeof lines, "%s", epoch_lines);
	snprintf(d, sizeof d, "%s/checkpoints/best", a);
	ckpt_files(d, l, sizeof l);
	ck_assert_str_eq(l, "5 10 15");
	resume_dir_from_best(a, b, 5);
	ck_assert_msg(train_run(b, resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 5);
	ck_assert_int_eq(r2.steps, ra.steps);
	ck_assert_int_eq(r2.early_stopped, 1);
	ck_assert_str_eq(epoch_lines, lines);
	ck_assert_msg(r2.train_loss == ra.train_loss && r2.train_acc == ra.train_acc,
		      "resumed: train loss %.9g acc %.9g; the run's: %.9g %.9g", r2.train_loss,
		      r2.train_acc, ra.train_loss, ra.train_acc);
	ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc);
	event_steps(b, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "10 15");
	event_steps(b, "best", 1, l, sizeof l);
	ck_assert_str_eq(l, "10 15");
	snprintf(fa, sizeof fa, "%s/checkpoints/ckpt-15.kiln", a);
	snprintf(fb, sizeof fb, "%s/checkpoints/ckpt-15.kiln", b);
	same_sections(fa, fb, resume_tags, 1);
	/* the best/ files the resumed run wrote: the uninterrupted run's */
	snprintf(fa, sizeof fa, "%s/checkpoints/best/ckpt-10.kiln", a);
	snprintf(fb, sizeof fb, "%s/checkpoints/best/ckpt-10.kiln", b);
	same_sections(fa, fb, resume_tags, 1);
}
END_TEST

/* An evaluation per epoch (eval_every = 0), patience 1 with no
 * improvement possible: the epoch-2 evaluation stops the run at step 40;
 * keep_best = 2 by loss keeps both.  Resumed from best/ckpt-20.kiln
 * (written after the epoch-1 evaluation, at the epoch's end): that
 * evaluation is not run again, and the epoch lines, the stop, the
 * evaluations and keep_best's list are the uninterrupted run's.  Before
 * session 35 the file had no "evaluated" or "stopper": the resume ran
 * and recorded the epoch-1 evaluation again (a second eval event of 20),
 * and with no "epoch" its epoch-1 line said "train loss 0.0000". */
START_TEST(test_best_epoch_eval)
{
	char a[64], b[64], fa[300], fb[300], l[400], lines[2048];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	const char *const run[] = { "train.early_stop_patience=1", "train.early_stop_metric=loss",
				    "train.early_stop_min_delta=100", "train.keep_best=2",
				    "train.best_metric=loss", NULL };
	const char *const resume[] = { "train.early_stop_patience=1",
				       "train.early_stop_metric=loss",
				       "train.early_stop_min_delta=100", "train.keep_best=2",
				       "train.best_metric=loss", "train.resume=1", NULL };
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	ck_assert_msg(train_run(a, run, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	ck_assert_int_eq(ra.early_stopped, 1);
	snprintf(lines, sizeof lines, "%s", epoch_lines);
	resume_dir_from_best(a, b, 20);
	ck_assert_msg(train_run(b, resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 20);
	ck_assert_int_eq(r2.steps, 40);
	ck_assert_int_eq(r2.early_stopped, 1);
	ck_assert_str_eq(epoch_lines, lines);
	ck_assert(r2.train_loss == ra.train_loss && r2.test_loss == ra.test_loss &&
		  r2.test_acc == ra.test_acc && r2.test_samples == ra.test_samples);
	event_steps(b, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "40");
	snprintf(fa, sizeof fa, "%s/checkpoints/ckpt-40.kiln", a);
	snprintf(fb, sizeof fb, "%s/checkpoints/ckpt-40.kiln", b);
	same_sections(fa, fb, resume_tags, 1);
}
END_TEST

/* [data.val], 2 epochs, keep_best = 2 by loss: best/ckpt-40.kiln is
 * written after the run's last evaluation, before the final test.
 * Resumed from it, the run takes no step, runs the final test (the
 * uninterrupted run's numbers) and writes the checkpoint again with them,
 * so a second resume records nothing (without it, every resume ran and
 * recorded the final test again). */
#define VAL "data.val.images=t10k-images-idx3-ubyte.gz", \
	"data.val.labels=t10k-labels-idx1-ubyte.gz", "data.val.limit=100"
START_TEST(test_best_final_test)
{
	char a[64], b[64], fa[300], fb[300], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	const char *const run[] = { "train.epochs=2", VAL, "train.keep_best=2",
				    "train.best_metric=loss", NULL };
	const char *const resume[] = { "train.epochs=2", VAL, "train.keep_best=2",
				       "train.best_metric=loss", "train.resume=1", NULL };
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	ck_assert_msg(train_run(a, run, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	ck_assert_int_gt(ra.test_samples, 0);
	resume_dir_from_best(a, b, 40);
	for (int k = 1; k <= 2; k++) {
		ck_assert_msg(train_run(b, resume, &r2) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(r2.resumed_step, 40);
		ck_assert_int_eq(r2.steps, 40);
		ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc &&
			  r2.test_samples == ra.test_samples);
		ck_assert(r2.val_loss == ra.val_loss && r2.val_acc == ra.val_acc);
		/* the final test's eval event, the first time alone */
		event_steps(b, "eval", 1, l, sizeof l);
		ck_assert_str_eq(l, k == 1 ? "40" : "");
	}
	snprintf(fa, sizeof fa, "%s/checkpoints/ckpt-40.kiln", a);
	snprintf(fb, sizeof fb, "%s/checkpoints/ckpt-40.kiln", b);
	same_sections(fa, fb, resume_tags, 1);
}
END_TEST
#undef VAL

static Suite *make_resume_best_suite(void)
{
	Suite *s = suite_create("resume_best");
	check_add_case(s, "resume", 120, scratch_setup, scratch_teardown,
		       (const TTest *[]){ test_best_eval_every, test_best_epoch_eval,
					   test_best_final_test, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_resume_best_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1,
					       .setup = test_need_fashion };
