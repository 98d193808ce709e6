/* tests/check_resume_evals.c - the state around the evaluations across a
 * resume (session 31): a run cut and resumed keeps keep_best's list and
 * early stopping's count as the uninterrupted run has them.
 *
 *   keep_best     the K best (their checkpoints in best/, their "best"
 *                 events) equal the uninterrupted run's after a cut; a
 *                 file of best/ written after the resumed checkpoint is
 *                 deleted (its evaluation runs again); a checkpoint
 *                 without the list (an older kiln's) rebuilds it from the
 *                 values the best/ files hold
 *   early stop    a finished early-stopped run resumed trains no further
 *                 and writes no checkpoint
 *   finished      a finished run resumed records no evaluation again:
 *                 the epoch's, [data.val]'s final test (also after an
 *                 early stop)
 *   eval owed     a stop during an eval_every evaluation: the resumed run
 *                 evaluates that step first, so it stops where the
 *                 uninterrupted run did, with the same bytes
 *   epoch stop    an early stop at the epoch's evaluation of a
 *                 checkpoint_every step: the last checkpoint is written
 *                 after it, so a resume evaluates nothing again (session 33)
 *   clip counts   the steps skipped (fp16 overflows) and clipped go on
 *                 counting from the checkpoint's after a resume (session
 *                 33), metrics.jsonl's "clipped" too, and from a best/
 *                 checkpoint's (session 34)
 *   recheck stop  a stop during the unrecorded run again of the
 *                 evaluation that early-stopped the run leaves the
 *                 checkpoint as it was (session 34)
 *
 * Fashion-MNIST (scripts/install-deps), 640 samples of [data] limit,
 * batch 16 x accumulate 2: 20 steps an epoch, 3 epochs, about a second a
 * run.
 */
#include <kiln/kiln.h>

#include "checkpoint.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct kiln_registry *reg;

/* run directories: kiln-resev-* in $TMPDIR, removed after a passing test */
#define SCRATCH_TAG "resev"
#include "test_scratch.h"
#include "resume_rig.h"

static int stop_at; /* the step whose log point asks for a stop; 0: none */
static int epoch_lines; /* the epoch lines the progress callback got */

static char epoch_line[512]; /* the last epoch line, its "(T s, N samples/s)" cut */

static void stop_progress(void *user, int epoch, int64_t step, int64_t steps, const char *status)
{
	(void)user;
	epoch_lines += step < 0;
	if (step >= 0 && (epoch - 1) * steps + step == stop_at)
		kiln_train_request_stop();
	if (step < 0 && status) { /* an epoch's line: its timing differs between runs */
		const char *open = strstr(status, " ("), *close = open ? strchr(open, ')') : NULL;
		if (open && close)
			snprintf(epoch_line, sizeof epoch_line, "%.*s%s", (int)(open - status), status,
				 close + 1);
		else
			snprintf(epoch_line, sizeof epoch_line, "%s", status);
	}
}

/* cnn_train with a stop asked for at the log point of step stop_at */
static kiln_status train_run(const char *dir, const char *const *ov, struct kiln_train_result *res)
{
	return cnn_train(dir, ov, stop_progress, res);
}

static const char *const state_tags[] = { "params", "buffers", "optim.exp_avg",
					  "optim.exp_avg_sq", "step", "optim.step", NULL };

static void same_state(const char *a, const char *b)
{
	same_sections(a, b, state_tags, 0);
}

/* Checkpoint src copied to dst with `step` in its header (the header's
 * CRC made again; the trainer section keeps src's): the file a write of
 * that step leaves, as far as its header shows (since session 39 a file
 * whose header holds another step than its name is left alone). */
static void copy_as_step(const char *src, const char *dst, uint64_t step)
{
	size_t n;
	unsigned char *d = (unsigned char *)test_read_file(src, &n);
	ck_assert_msg(d && n >= 64, "%s", src);
	memcpy(d + 32, &step, 8);
	uint32_t crc = kiln_crc32c(0, d, 60);
	memcpy(d + 60, &crc, 4);
	FILE *f = fopen(dst, "wb");
	ck_assert(f && fwrite(d, 1, n, f) == n && fclose(f) == 0);
	free(d);
}

/* keep_best = 2 by loss, an evaluation every 7 steps (8 in 60 steps),
 * cut by max_steps = 25 and resumed: best/ and the "best" events after
 * the resume are the uninterrupted run's, and so is the last checkpoint's
 * "best" section, byte for byte (before session 31 the list started
 * empty: the resumed run kept 2 more files, 5 in all with the stray one
 * below, and logged evaluations worse than the kept ones as "best"). */
START_TEST(test_keep_best)
{
	char a[64], b[64], da[300], db[300], la[400], lb[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	const char *const full[] = { "train.keep_best=2", "train.best_metric=loss",
				     "train.eval_every=7", NULL };
	const char *const cut[] = { "train.keep_best=2", "train.best_metric=loss",
				    "train.eval_every=7", "train.max_steps=25", NULL };
	const char *const rest[] = { "train.keep_best=2", "train.best_metric=loss",
				     "train.eval_every=7", "train.resume=1", NULL };
	stop_at = 0;
	ck_assert_msg(train_run(a, full, &ra) == 0, "%s", kiln_last_error());
	ck_assert_msg(train_run(b, cut, &r1) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r1.steps, 25);
	/* a best/ file of a step after the checkpoint (as a run killed after
	 * a keep_best write leaves; 50, no evaluation point, so not written
	 * again; its header says 50: a link to ckpt-21.kiln is since session
	 * 39 a misnamed file, left alone): it goes */
	snprintf(db, sizeof db, "%s/checkpoints/best", b);
	ckpt_files(db, lb, sizeof lb);
	ck_assert_str_eq(lb, "14 21");
	snprintf(la, sizeof la, "%.290s/ckpt-21.kiln", db);
	snprintf(da, sizeof da, "%.280s/ckpt-50.kiln", db);
	copy_as_step(la, da, 50);
	ck_assert_msg(train_run(b, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 25);
	ck_assert_int_eq(r2.steps, 60);
	snprintf(da, sizeof da, "%s/checkpoints/best", a);
	ckpt_files(da, la, sizeof la);
	ckpt_files(db, lb, sizeof lb);
	ck_assert_str_eq(la, "49 56");
	ck_assert_str_eq(lb, la);
	/* the "best" events after the resume: the uninterrupted run's after
	 * step 25 */
	event_steps(a, "best", 0, la, sizeof la);
	event_steps(b, "best", 1, lb, sizeof lb);
	ck_assert_str_eq(la, "7 14 21 28 35 42 49 56");
	ck_assert_str_eq(lb, "28 35 42 49 56");
	/* the last checkpoint's list: the same bytes (entries in step order:
	 * the uninterrupted run holds 21 in the slot before 14's at step 25,
	 * the resumed one takes them in step order) */
	static const char *const best_tag[] = { "best", NULL };
	snprintf(la, sizeof la, "%s/checkpoints/ckpt-60.kiln", a);
	snprintf(lb, sizeof lb, "%s/checkpoints/ckpt-60.kiln", b);
	same_sections(la, lb, best_tag, 0);
	/* each kept file holds the list with its own entry */
	struct kiln_ckpt *ck;
	struct kiln_ckpt_best *e;
	int64_t n;
	snprintf(la, sizeof la, "%s/ckpt-56.kiln", db);
	ck_assert_msg(kiln_ckpt_open(la, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_best_get(ck, &e, &n) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(n, 2);
	ck_assert(e[0].step == 56 || e[1].step == 56);
	free(e);
	kiln_ckpt_close(ck);
}
END_TEST

/* Checkpoint `path` rewritten without its section `tag`, as an older kiln
 * wrote it (docs/checkpoints.md: the header's file size, section count
 * and CRC change; each section keeps its own CRCs). */
static void strip_section(const char *path, const char *tag)
{
	size_t n;
	uint8_t *d = (uint8_t *)test_read_file(path, &n), *o = malloc(n);
	uint32_t count, kept = 0, crc;
	uint64_t off = 64, len, size = 64;
	memcpy(&count, d + 24, 4);
	memcpy(o, d, 64);
	for (uint32_t i = 0; i < count; i++, off += 48 + len) {
		memcpy(&len, d + off + 32, 8);
		if (!strcmp((const char *)d + off, tag))
			continue;
		memcpy(o + size, d + off, 48 + len);
		size += 48 + len, kept++;
	}
	memcpy(o + 16, &size, 8);
	memcpy(o + 24, &kept, 4);
	crc = kiln_crc32c(0, o, 60);
	memcpy(o + 60, &crc, 4);
	ck_assert_uint_eq(kept, count - 1);
	FILE *f = fopen(path, "wb");
	ck_assert(f && fwrite(o, 1, size, f) == size && fclose(f) == 0);
	free(d);
	free(o);
}

/* A checkpoint without the list (an older kiln's, here the cut run's with
 * its "best" section taken out): the list is rebuilt from the values the
 * best/ files hold of themselves, and the run keeps the uninterrupted
 * run's files. */
START_TEST(test_keep_best_old_checkpoint)
{
	char a[64], b[64], d[300], la[400], lb[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	const char *const full[] = { "train.keep_best=2", "train.best_metric=loss",
				     "train.eval_every=7", NULL };
	const char *const cut[] = { "train.keep_best=2", "train.best_metric=loss",
				    "train.eval_every=7", "train.max_steps=30", NULL };
	const char *const rest[] = { "train.keep_best=2", "train.best_metric=loss",
				     "train.eval_every=7", "train.resume=1", NULL };
	stop_at = 0;
	ck_assert_msg(train_run(a, full, &ra) == 0, "%s", kiln_last_error());
	ck_assert_msg(train_run(b, cut, &r1) == 0, "%s", kiln_last_error());
	snprintf(d, sizeof d, "%s/checkpoints/ckpt-30.kiln", b);
	strip_section(d, "best");
	ck_assert_msg(train_run(b, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 30);
	snprintf(d, sizeof d, "%s/checkpoints/best", a);
	ckpt_files(d, la, sizeof la);
	snprintf(d, sizeof d, "%s/checkpoints/best", b);
	ckpt_files(d, lb, sizeof lb);
	ck_assert_str_eq(lb, la);
}
END_TEST

/* Early stopping ends the run at its third evaluation: min_delta 100 of
 * a loss near 2 makes every evaluation after the first one without
 * improvement, and patience is 2 (evaluations at 5 10 15). */
static const char *const early[] = { "train.eval_every=5", "train.early_stop_patience=2",
				     "train.early_stop_metric=loss",
				     "train.early_stop_min_delta=100", NULL };
static const char *const early_resume[] = { "train.eval_every=5", "train.early_stop_patience=2",
					    "train.early_stop_metric=loss",
					    "train.early_stop_min_delta=100", "train.resume=1", NULL };

/* A finished early-stopped run resumed (what a job script passing
 * --resume every time does): no step, no checkpoint, the run's numbers
 * and "early_stopped" again (before session 31 it trained steps 16..20,
 * stopped again at 20 and wrote ckpt-20, on every --resume). */
START_TEST(test_early_stop_finished)
{
	char a[64], ck[300], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	char line[512];
	stop_at = 0;
	ck_assert_msg(train_run(a, early, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 15);
	ck_assert_int_eq(ra.early_stopped, 1);
	snprintf(line, sizeof line, "%s", epoch_line);
	epoch_line[0] = 0;
	ck_assert_msg(train_run(a, early_resume, &r2) == 0, "%s", kiln_last_error());
	/* no epoch line: the run is complete, no step is left and no
	 * evaluation runs (before session 33 the resumed run printed the
	 * epoch's line again, with ", test loss ..." which the run's own line,
	 * eval_every's evaluation having stopped it, did not have) */
	ck_assert_msg(!epoch_line[0], "the resumed finished run printed '%s'", epoch_line);
	ck_assert_msg(!strstr(line, "test loss"), "%s", line);
	ck_assert_int_eq(r2.resumed_step, 15);
	ck_assert_int_eq(r2.steps, 15);
	ck_assert_int_eq(r2.early_stopped, 1);
	ck_assert_int_eq(r2.stopped, 0);
	ck_assert_int_eq(r2.epochs, ra.epochs);
	ck_assert(r2.train_loss == ra.train_loss && r2.train_acc == ra.train_acc);
	/* the checkpoint it resumed from is the run's newest: reported as the
	 * first run reported it (empty before the review of session 31) */
	ck_assert_str_eq(r2.checkpoint, ra.checkpoint);
	snprintf(ck, sizeof ck, "%s/checkpoints", a);
	ckpt_files(ck, l, sizeof l);
	ck_assert_str_eq(l, "15");
	event_steps(a, "train", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
	event_steps(a, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
}
END_TEST

/* dir/metrics.jsonl, open for reading (the caller closes). */
static FILE *metrics_open(const char *dir)
{
	char path[300];
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	return f;
}

/* The lines of dir/metrics.jsonl, and in *finals those of its "final"
 * events after its last resume line. */
static int jsonl_lines(const char *dir, int *finals)
{
	char line[2048];
	int n = 0;
	FILE *f = metrics_open(dir);
	*finals = 0;
	while (fgets(line, sizeof line, f)) {
		n++;
		if (!strncmp(line, "{\"event\":\"resume\",", 18))
			*finals = 0;
		*finals += !strncmp(line, "{\"event\":\"final\",", 17);
	}
	fclose(f);
	return n;
}

static const char *const per_epoch[] = { "train.epochs=2", NULL };
static const char *const per_epoch_resume[] = { "train.epochs=2", "train.resume=1", NULL };
#define VAL "data.val.images=t10k-images-idx3-ubyte.gz", \
	"data.val.labels=t10k-labels-idx1-ubyte.gz", "data.val.limit=100"
static const char *const with_val[] = { "train.epochs=2", VAL, NULL };
static const char *const with_val_resume[] = { "train.epochs=2", VAL, "train.resume=1", NULL };

/* A finished run that evaluates once per epoch (and, with [data.val], has
 * a final test), resumed twice: each resume appends its "resume" and
 * "final" lines and nothing else, with the run's numbers.  Before session
 * 32 the last checkpoint was written before the epoch's evaluation (and
 * the final test), so each resume ran and recorded them again: 4 lines a
 * resume, the epoch-2 evaluation twice, three times... */
static void finished_resumed(const char *const *ov, const char *const *ov_resume,
			     int have_val)
{
	char a[64], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	stop_at = 0;
	ck_assert_msg(train_run(a, ov, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	int finals;
	const int lines = jsonl_lines(a, &finals);
	for (int k = 1; k <= 2; k++) {
		epoch_lines = 0;
		ck_assert_msg(train_run(a, ov_resume, &r2) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(r2.resumed_step, 40);
		ck_assert_int_eq(r2.steps, 40);
		/* no step left: no epoch line (before session 33 one with
		 * "0.0 s, 0 samples/s" and the checkpoint's numbers) */
		ck_assert_int_eq(epoch_lines, 0);
		ck_assert_int_eq(r2.epochs, ra.epochs);
		ck_assert_int_eq(jsonl_lines(a, &finals), lines + 2 * k);
		ck_assert_int_eq(finals, 1);
		event_steps(a, "eval", 1, l, sizeof l);
		ck_assert_str_eq(l, "");
		event_steps(a, "checkpoint", 1, l, sizeof l);
		ck_assert_str_eq(l, "");
		ck_assert(r2.train_loss == ra.train_loss && r2.test_loss == ra.test_loss &&
			  r2.test_acc == ra.test_acc && r2.test_samples == ra.test_samples);
		ck_assert(!have_val || (r2.val_loss == ra.val_loss && r2.val_acc == ra.val_acc));
	}
	/* the first run's evaluations: one per epoch (and the final test) */
	event_steps(a, "eval", 0, l, sizeof l);
	ck_assert_str_eq(l, have_val ? "20 40 40" : "20 40");
}

START_TEST(test_finished_per_epoch)
{
	finished_resumed(per_epoch, per_epoch_resume, 0);
}
END_TEST

START_TEST(test_finished_with_val)
{
	finished_resumed(with_val, with_val_resume, 1);
}
END_TEST

/* An early-stopped run with [data.val] (patience 1: the epoch-2
 * evaluation stops it at step 40), resumed: no evaluation and no final
 * test again (before the review of session 32 checkpoint_last's
 * checkpoint came before the final test and said nothing of it: each
 * resume ran and recorded it again, a second "final test" line). */
static const char *const early_val[] = { "train.early_stop_patience=1",
					 "train.early_stop_metric=loss",
					 "train.early_stop_min_delta=100", VAL, NULL };
static const char *const early_val_resume[] = { "train.early_stop_patience=1",
						"train.early_stop_metric=loss",
						"train.early_stop_min_delta=100", VAL,
						"train.resume=1", NULL };

START_TEST(test_early_stop_with_val)
{
	char a[64], ck[300], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	stop_at = 0;
	ck_assert_msg(train_run(a, early_val, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	ck_assert_int_eq(ra.early_stopped, 1);
	int finals;
	const int lines = jsonl_lines(a, &finals);
	ck_assert_msg(train_run(a, early_val_resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 40);
	ck_assert_int_eq(r2.steps, 40);
	ck_assert_int_eq(r2.early_stopped, 1);
	ck_assert_int_eq(jsonl_lines(a, &finals), lines + 2);
	ck_assert_int_eq(finals, 1);
	event_steps(a, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
	ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc &&
		  r2.test_samples == ra.test_samples);
	/* the evaluation that stopped the run, from the checkpoint (before
	 * session 32 the resumed result had none: -1) */
	ck_assert_int_gt(ra.val_samples, 0);
	ck_assert(r2.val_loss == ra.val_loss && r2.val_acc == ra.val_acc &&
		  r2.val_acc5 == ra.val_acc5);
	ck_assert_int_eq(r2.val_samples, ra.val_samples);
	/* the first run's: the two per epoch, the final test; one checkpoint
	 * (written again after the final test, with no second event) */
	event_steps(a, "eval", 0, l, sizeof l);
	ck_assert_str_eq(l, "20 40 40");
	event_steps(a, "checkpoint", 0, l, sizeof l);
	ck_assert_str_eq(l, "40");
	snprintf(ck, sizeof ck, "%s/checkpoints", a);
	ckpt_files(ck, l, sizeof l);
	ck_assert_str_eq(l, "40");
}
END_TEST

/* The same without [data.val]: the evaluation that stopped the run is
 * [data.eval]'s, and the resumed result reports it (before the review of
 * session 32 the checkpoint held no "evaluated" section without
 * [data.val], and the resumed result's test numbers were 0). */
static const char *const early_noval[] = { "train.early_stop_patience=1",
					   "train.early_stop_metric=loss",
					   "train.early_stop_min_delta=100", NULL };
static const char *const early_noval_resume[] = { "train.early_stop_patience=1",
						  "train.early_stop_metric=loss",
						  "train.early_stop_min_delta=100", "train.resume=1",
						  NULL };

START_TEST(test_early_stop_no_val)
{
	char a[64], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	stop_at = 0;
	ck_assert_msg(train_run(a, early_noval, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.early_stopped, 1);
	ck_assert_int_gt(ra.test_samples, 0);
	int finals;
	const int lines = jsonl_lines(a, &finals);
	ck_assert_msg(train_run(a, early_noval_resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, ra.steps);
	ck_assert_int_eq(r2.early_stopped, 1);
	ck_assert_msg(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc &&
			      r2.test_samples == ra.test_samples,
		      "resumed: test loss %g acc %g samples %lld; the run's: %g %g %lld", r2.test_loss,
		      r2.test_acc, (long long)r2.test_samples, ra.test_loss, ra.test_acc,
		      (long long)ra.test_samples);
	ck_assert_int_eq(jsonl_lines(a, &finals), lines + 2);
	event_steps(a, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
}
END_TEST

/* A stop during the eval_every evaluation after step 10 (asked for at
 * its log point, so the evaluation is cut at its first batch): the stop's
 * checkpoint owes it, the resumed run evaluates step 10 first and stops
 * early at 15 with the uninterrupted run's bytes (before session 31 it
 * evaluated at 15 and 20 and stopped at 20); cut again by a stop as the
 * resumed run starts, it stays owed. */
START_TEST(test_eval_owed)
{
	char a[64], b[64], fa[300], fb[300], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	stop_at = 0;
	ck_assert_msg(train_run(a, early, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 15);
	stop_at = 10;
	ck_assert_msg(train_run(b, early, &r1) == 0, "%s", kiln_last_error());
	stop_at = 0;
	ck_assert_int_eq(r1.stopped, 1);
	ck_assert_int_eq(r1.steps, 10);
	event_steps(b, "eval", 0, l, sizeof l);
	ck_assert_str_eq(l, "5");
	/* a stop pending as the resumed run starts cuts the owed evaluation
	 * again: the stop's checkpoint, of step 10, owes it still */
	kiln_train_request_stop();
	ck_assert_msg(train_run(b, early_resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.stopped, 1);
	ck_assert_int_eq(r2.steps, 10);
	event_steps(b, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
	ck_assert_msg(train_run(b, early_resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 10);
	ck_assert_int_eq(r2.steps, 15);
	ck_assert_int_eq(r2.early_stopped, 1);
	event_steps(b, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "10 15");
	ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc);
	snprintf(fa, sizeof fa, "%s/checkpoints/ckpt-15.kiln", a);
	snprintf(fb, sizeof fb, "%s/checkpoints/ckpt-15.kiln", b);
	same_state(fa, fb);
}
END_TEST

/* An early stop at the epoch's evaluation (eval_every = 0; patience 1,
 * min_delta 100: the epoch-2 evaluation, after step 40) where step 40 is a
 * checkpoint_every step: that checkpoint was written in the step loop,
 * before the evaluation, and before session 33 it stayed the run's last
 * (checkpoint_last saw its step written): its stopper and keep_best list
 * from before the stop, no "evaluated".  Every --resume of the finished
 * run then evaluated again, rewrote best/ and appended eval and best
 * events.  Now the evaluation makes it out of date and checkpoint_last
 * writes it again (one "checkpoint" event all the same). */
static const char *const early_epoch[] = { "train.early_stop_patience=1",
					   "train.early_stop_metric=loss",
					   "train.early_stop_min_delta=100", "train.checkpoint_every=4",
					   "train.keep_best=1", "train.best_metric=loss", NULL };
static const char *const early_epoch_resume[] = { "train.early_stop_patience=1",
						  "train.early_stop_metric=loss",
						  "train.early_stop_min_delta=100",
						  "train.checkpoint_every=4", "train.keep_best=1",
						  "train.best_metric=loss", "train.resume=1", NULL };

START_TEST(test_early_stop_epoch_checkpoint)
{
	char a[64], d[300], l[400], files[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
	struct kiln_ckpt *ck;
	struct kiln_ckpt_stopper sp;
	struct kiln_ckpt_evaluated e;
	int done, finals;
	scratch_dir(a, sizeof a);
	stop_at = 0;
	ck_assert_msg(train_run(a, early_epoch, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	ck_assert_int_eq(ra.early_stopped, 1);
	snprintf(d, sizeof d, "%s/checkpoints/ckpt-40.kiln", a);
	ck_assert_msg(kiln_ckpt_open(d, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_stopper_get(ck, &sp) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_evaluated_get(ck, &e, &done) == 0, "%s", kiln_last_error());
	kiln_ckpt_close(ck);
	ck_assert_int_eq(sp.bad, 1);
	ck_assert_int_eq(done, 1);
	ck_assert(e.samples == ra.test_samples && e.loss == ra.test_loss);
	event_steps(a, "checkpoint", 0, l, sizeof l);
	ck_assert_str_eq(l, "4 8 12 16 20 24 28 32 36 40");
	snprintf(d, sizeof d, "%s/checkpoints/best", a);
	ckpt_files(d, files, sizeof files);
	const int lines = jsonl_lines(a, &finals);
	for (int k = 1; k <= 2; k++) {
		epoch_lines = 0;
		ck_assert_msg(train_run(a, early_epoch_resume, &r2) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(r2.resumed_step, 40);
		ck_assert_int_eq(r2.steps, 40);
		ck_assert_int_eq(r2.early_stopped, 1);
		ck_assert_int_eq(epoch_lines, 0);
		ck_assert_int_eq(jsonl_lines(a, &finals), lines + 2 * k);
		event_steps(a, "eval", 1, l, sizeof l);
		ck_assert_str_eq(l, "");
		event_steps(a, "best", 1, l, sizeof l);
		ck_assert_str_eq(l, "");
		ckpt_files(d, l, sizeof l);
		ck_assert_str_eq(l, files);
		ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc &&
			  r2.test_samples == ra.test_samples);
	}
}
END_TEST

/* fp16 with a loss scale that overflows at first (init_scale 1e8, growth
 * every 3 steps): some steps are skipped before and after a cut at step
 * 4.  The resumed run's counts go on from the checkpoint's ("clip_counts"):
 * its last "skipped" and its result's steps_skipped and steps_clipped are
 * the uninterrupted run's (before session 33 they restarted from 0: 6
 * where the run had 10 in the repro). */
START_TEST(test_skipped_counts)
{
	char a[64], b[64];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
#define FP16 "run.precision=fp16", "plugin.amp.init_scale=1e8", "plugin.amp.growth_interval=3", \
	"train.epochs=1"
	const char *const full[] = { FP16, NULL };
	const char *const cut[] = { FP16, "train.max_steps=4", NULL };
	const char *const rest[] = { FP16, "train.resume=1", NULL };
#undef FP16
	stop_at = 0;
	ck_assert_msg(train_run(a, full, &ra) == 0, "%s", kiln_last_error());
	ck_assert_msg(train_run(b, cut, &r1) == 0, "%s", kiln_last_error());
	ck_assert_int_gt(r1.steps_skipped, 0);
	ck_assert_int_gt(ra.steps_skipped, r1.steps_skipped);
	ck_assert_msg(train_run(b, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 4);
	ck_assert_int_eq(r2.steps_skipped, ra.steps_skipped);
	ck_assert_int_eq(r2.steps_clipped, ra.steps_clipped);
	ck_assert_int_eq(test_last_train_field(b, "skipped"), test_last_train_field(a, "skipped"));
	ck_assert_int_eq(test_last_train_field(b, "skipped"), ra.steps_skipped);
}
END_TEST

/* clip_norm 0.05 clips (nearly) every step: metrics.jsonl's "clipped"
 * counts them as the result's steps_clipped does, and a run cut at step 4
 * and resumed goes on from the checkpoint's count: its last "clipped" is
 * the uninterrupted run's (before session 34 metrics.jsonl had no
 * "clipped": the count was in the result alone). */
START_TEST(test_clipped_counts)
{
	char a[64], b[64];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(a, sizeof a);
	scratch_dir(b, sizeof b);
	const char *const full[] = { "train.clip_norm=0.05", "train.epochs=1", NULL };
	const char *const cut[] = { "train.clip_norm=0.05", "train.epochs=1", "train.max_steps=4",
				    NULL };
	const char *const rest[] = { "train.clip_norm=0.05", "train.epochs=1", "train.resume=1",
				     NULL };
	stop_at = 0;
	ck_assert_msg(train_run(a, full, &ra) == 0, "%s", kiln_last_error());
	ck_assert_msg(train_run(b, cut, &r1) == 0, "%s", kiln_last_error());
	ck_assert_int_gt(r1.steps_clipped, 0);
	ck_assert_int_eq(test_last_train_field(b, "clipped"), r1.steps_clipped);
	ck_assert_int_gt(ra.steps_clipped, r1.steps_clipped);
	ck_assert_int_eq(test_last_train_field(a, "clipped"), ra.steps_clipped);
	ck_assert_msg(train_run(b, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 4);
	ck_assert_int_eq(r2.steps_clipped, ra.steps_clipped);
	ck_assert_int_eq(test_last_train_field(b, "clipped"), ra.steps_clipped);
}
END_TEST

/* A best/ checkpoint holds the clip op's counts as of its step (its
 * "clip_counts" section): the fp16 run of test_skipped_counts with
 * keep_best = 1, its best file copied into checkpoints/ alone and
 * resumed, ends with the uninterrupted run's counts (before session 34
 * best/ files had no "clip_counts", and such a resume counted from 0). */
START_TEST(test_best_clip_counts)
{
	char a[64], d[300], l[400], src[400], dst[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	struct kiln_ckpt *ck;
	int64_t counts[2];
	scratch_dir(a, sizeof a);
#define FP16 "run.precision=fp16", "plugin.amp.init_scale=1e8", "plugin.amp.growth_interval=3", \
	"train.epochs=1", "train.eval_every=5", "train.keep_best=1", "train.best_metric=loss"
	const char *const full[] = { FP16, NULL };
	const char *const rest[] = { FP16, "train.resume=1", NULL };
#undef FP16
	stop_at = 0;
	ck_assert_msg(train_run(a, full, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_gt(ra.steps_skipped, 0);
	snprintf(d, sizeof d, "%s/checkpoints/best", a);
	ckpt_files(d, l, sizeof l);
	const int step = atoi(l);
	ck_assert_msg(step >= 5 && !strchr(l, ' '), "best/ holds '%s'", l);
	snprintf(src, sizeof src, "%s/ckpt-%d.kiln", d, step);
	ck_assert_msg(kiln_ckpt_open(src, &ck) == 0, "%s", kiln_last_error());
	kiln_status st = kiln_ckpt_clip_counts_get(ck, counts);
	kiln_ckpt_close(ck);
	ck_assert_msg(st == 0, "%s: no clip counts (status %d)", src, (int)st);
	ck_assert_int_gt(counts[0], 0);
	/* the run's own checkpoints gone: the best one is the newest */
	snprintf(d, sizeof d, "%s/checkpoints", a);
	ckpt_files(d, l, sizeof l);
	for (char *p = l; *p; p += strspn(p, " ")) {
		snprintf(dst, sizeof dst, "%s/ckpt-%d.kiln", d, atoi(p));
		ck_assert(unlink(dst) == 0);
		p += strcspn(p, " ");
	}
	snprintf(dst, sizeof dst, "%s/ckpt-%d.kiln", d, step);
	size_t n;
	char *bytes = test_read_file(src, &n);
	FILE *f = fopen(dst, "wb");
	ck_assert(f && fwrite(bytes, 1, n, f) == n && fclose(f) == 0);
	free(bytes);
	ck_assert_msg(train_run(a, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, step);
	ck_assert_int_eq(r2.steps_skipped, ra.steps_skipped);
	ck_assert_int_eq(r2.steps_clipped, ra.steps_clipped);
}
END_TEST

/* The early-stopped run with [data.val] of test_early_stop_with_val, its
 * checkpoint's "evaluated" section holding the final test's numbers but
 * none of the evaluation that stopped the run (0 samples, as a kiln
 * before session 33 wrote it after a kill): a resume runs that evaluation
 * again, unrecorded, and a stop then (asked for as it starts) leaves the
 * checkpoint as it was, byte for byte; the next resume runs it again and
 * records nothing, the final test included.  Before session 34 the stop
 * wrote the file again without "evaluated", and the next resume ran and
 * recorded the final test again (an eval event of step 40). */
START_TEST(test_early_stop_recheck_stopped)
{
	char a[64], d[300], l[400];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	struct kiln_ckpt *ck;
	struct kiln_ckpt_evaluated e;
	int done;
	size_t n0, n1;
	scratch_dir(a, sizeof a);
	stop_at = 0;
	ck_assert_msg(train_run(a, early_val, &ra) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(ra.steps, 40);
	ck_assert_int_eq(ra.early_stopped, 1);
	snprintf(d, sizeof d, "%s/checkpoints/ckpt-40.kiln", a);
	patch_u64(d, "evaluated", 32, 0); /* its samples */
	ck_assert_msg(kiln_ckpt_open(d, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_evaluated_get(ck, &e, &done) == 0, "%s", kiln_last_error());
	kiln_ckpt_close(ck);
	ck_assert(done && e.samples == 0 && e.has_test && e.test_samples == ra.test_samples);
	char *before = test_read_file(d, &n0);
	stop_at = 40; /* the progress call before the evaluation runs again */
	ck_assert_msg(train_run(a, early_val_resume, &r1) == 0, "%s", kiln_last_error());
	stop_at = 0;
	ck_assert_int_eq(r1.stopped, 1);
	ck_assert_int_eq(r1.steps, 40);
	ck_assert_str_eq(r1.checkpoint, d);
	char *after = test_read_file(d, &n1);
	ck_assert_msg(n0 == n1 && !memcmp(before, after, n0),
		      "the stop wrote %s again (%zu bytes, %zu before)", d, n1, n0);
	free(before);
	free(after);
	event_steps(a, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
	ck_assert_msg(train_run(a, early_val_resume, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.stopped, 0);
	ck_assert_int_eq(r2.early_stopped, 1);
	event_steps(a, "eval", 1, l, sizeof l);
	ck_assert_str_eq(l, "");
	ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc &&
		  r2.test_samples == ra.test_samples);
	ck_assert(r2.val_loss == ra.val_loss && r2.val_samples == ra.val_samples);
}
END_TEST

/* The mean of dir/metrics.jsonl's "train" losses (each row's interval
 * of `per_row` samples: log_every 1). */
static double train_rows_mean(const char *dir, int per_row, int *rows)
{
	char line[2048];
	double sum = 0;
	FILE *f = metrics_open(dir);
	*rows = 0;
	while (fgets(line, sizeof line, f)) {
		const char *l = strstr(line, "\"loss\":");
		if (strncmp(line, "{\"event\":\"train\",", 17) || !l)
			continue;
		sum += strtod(l + 7, NULL) * per_row;
		++*rows;
	}
	fclose(f);
	return *rows ? sum / (*rows * (double)per_row) : 0;
}

/* Early stopping (as `early`) at step 15 between two log points
 * (log_every 4: the interval of steps 13..15 open), with and without
 * [data.val] (whose final test writes the last checkpoint again): the
 * run's train_loss and train_acc are its checkpoint's "epoch" sums (480
 * samples, the 15 steps'), which a resume of the finished run reports, bit
 * for bit, and the loss is the mean of a log_every 1 run's 15 rows (to
 * f32's rounding of the rows).  Before session 40 the early-stopped run
 * averaged its log points' steps alone (1..12): train_loss 1.601775 where
 * the resume said 1.555659. */
static const char *const early_iv[] = { "train.eval_every=5", "train.early_stop_patience=2",
					"train.early_stop_metric=loss",
					"train.early_stop_min_delta=100", "train.log_every=4", NULL };
static const char *const early_iv_resume[] = { "train.eval_every=5",
					       "train.early_stop_patience=2",
					       "train.early_stop_metric=loss",
					       "train.early_stop_min_delta=100", "train.log_every=4",
					       "train.resume=1", NULL };
static const char *const early_iv_val[] = { "train.eval_every=5", "train.early_stop_patience=2",
					    "train.early_stop_metric=loss",
					    "train.early_stop_min_delta=100", "train.log_every=4",
					    VAL, NULL };
static const char *const early_iv_val_resume[] = { "train.eval_every=5",
						   "train.early_stop_patience=2",
						   "train.early_stop_metric=loss",
						   "train.early_stop_min_delta=100",
						   "train.log_every=4", VAL, "train.resume=1",
						   NULL };

START_TEST(test_early_stop_open_interval)
{
	const char *const *runs[2][2] = { { early_iv, early_iv_resume },
					  { early_iv_val, early_iv_val_resume } };
	char a[64], c[64], ck[300];
	struct kiln_train_result rc = KILN_TRAIN_RESULT_INIT;
	int rows;
	stop_at = 0;
	scratch_dir(c, sizeof c);
	ck_assert_msg(train_run(c, early, &rc) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(rc.steps, 15);
	const double ref = train_rows_mean(c, 32, &rows);
	ck_assert_int_eq(rows, 15);
	for (int v = 0; v < 2; v++) {
		struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r2 = KILN_TRAIN_RESULT_INIT;
		struct kiln_ckpt *f;
		struct kiln_ckpt_epoch e;
		scratch_dir(a, sizeof a);
		ck_assert_msg(train_run(a, runs[v][0], &ra) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(ra.steps, 15);
		ck_assert_int_eq(ra.early_stopped, 1);
		snprintf(ck, sizeof ck, "%s/checkpoints/ckpt-15.kiln", a);
		ck_assert_msg(kiln_ckpt_open(ck, &f) == 0, "%s", kiln_last_error());
		ck_assert_msg(kiln_ckpt_epoch_get(f, &e) == 0, "%s", kiln_last_error());
		kiln_ckpt_close(f);
		ck_assert_int_eq(e.samples, 480);
		ck_assert_msg(ra.train_loss == e.loss / 480 && ra.train_acc == e.correct / 480,
			      "%s: train_loss %.17g acc %.17g, its checkpoint's epoch sums %.17g %.17g",
			      v ? "with [data.val]" : "without", ra.train_loss, ra.train_acc,
			      e.loss / 480, e.correct / 480);
		ck_assert_msg(fabs(ra.train_loss - ref) < 1e-6 * ref,
			      "train_loss %.9g, the log_every 1 run's rows %.9g", ra.train_loss, ref);
		ck_assert_msg(train_run(a, runs[v][1], &r2) == 0, "%s", kiln_last_error());
		ck_assert_int_eq(r2.resumed_step, 15);
		ck_assert_int_eq(r2.early_stopped, 1);
		ck_assert_msg(r2.train_loss == ra.train_loss && r2.train_acc == ra.train_acc,
			      "%s: the resumed finished run's train_loss %.17g acc %.17g, the run's %.17g %.17g",
			      v ? "with [data.val]" : "without", r2.train_loss, r2.train_acc,
			      ra.train_loss, ra.train_acc);
	}
}
END_TEST

static Suite *make_resume_evals_suite(void)
{
	Suite *s = suite_create("resume_evals");
	check_add_case(s, "resume", 120, scratch_setup, scratch_teardown,
		       (const TTest *[]){ test_keep_best, test_keep_best_old_checkpoint,
					   test_early_stop_finished,
					   test_eval_owed, test_finished_per_epoch,
					   test_finished_with_val, test_early_stop_with_val, test_early_stop_no_val,
					   test_early_stop_epoch_checkpoint, test_skipped_counts,
					   test_clipped_counts, test_best_clip_counts,
					   test_early_stop_recheck_stopped,
					   test_early_stop_open_interval, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_resume_evals_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1,
					       .setup = test_need_fashion };
