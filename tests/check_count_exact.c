/* tests/check_count_exact.c - the trainer's counts past 2^24 (session 37).
 * The device keeps its metric sums and the clip op's counts in f32, whose
 * integers stop at 2^24 = 16777216 (an odd count no longer fits); the
 * trainer reads and resets them before they get there and adds on the
 * host, so the numbers it reports are exact far beyond.
 *
 *   eval          an evaluation of 2^24 + 2^20 samples, every prediction
 *                 right (one class), batches of 1023: accuracy exactly 1
 *                 (before: 1.000652 on 3 x 2^24 samples, 100.07%)
 *   clip counts   a run whose checkpoint says 2^24 steps clipped, resumed
 *                 for 20 more that clip: 2^24 + 20 clipped, in the result
 *                 and in metrics.jsonl (before: 16777216 at the end); the
 *                 same for steps skipped (fp16 overflows), whose count
 *                 the skip warning and the divergence check read
 *
 * Synthetic 1x1 images through one linear layer: a second or so a run
 * (the evaluation's 18 million samples a few).
 */
#include <kiln/kiln.h>

#include "checkpoint.h"
#include "internal.h" /* kiln_crc32c */

#include <check.h>
#include "check_main.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

/* run directories: kiln-count-* in $TMPDIR, removed after a passing test */
#define SCRATCH_TAG "count"
#include "test_scratch.h"
#include "ckpt_rig.h" /* patch_u64 */

#define P24 ((int64_t)1 << 24)

static const char *tiny_ini =
	"[run]\ndevice = cpu\nseed = 1\nthreads = 1\nout_dir = %s\n"
	"[data]\nsource = synthetic\nimage_size = 1 1\nclasses = %d\nsamples = %d\n"
	"[layer.flat]\ntype = flatten\n[layer.fc]\ntype = linear\nout = %d\n"
	"[layer.loss]\ntype = softmax_xent\n"
	"[train]\nlr = 0.01\nbatch = %d\n";

/* kiln_train of tiny_ini in dir (classes, training samples, batch) with
 * the overrides ov (NULL-terminated). */
static kiln_status tiny_train(const char *dir, int classes, int samples, int batch,
			      const char *const *ov, struct kiln_train_result *res)
{
	char ini[2048];
	snprintf(ini, sizeof ini, tiny_ini, dir, classes, samples, classes, batch);
	return test_train_text(reg, ini, ov, NULL, res);
}

/* One class: every prediction is right, so the accuracy is 1 whatever
 * the weights.  2^24 + 2^20 evaluation samples in batches of 1023 (odd:
 * an f32 sum past 2^24 could not hold the count exactly). */
START_TEST(test_eval_past_2p24)
{
	char d[64], n[64];
	struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
	scratch_dir(d, sizeof d);
	snprintf(n, sizeof n, "data.eval.samples=%lld", (long long)(P24 + (1 << 20)));
	const char *const ov[] = { n, "train.eval_batch=1023", "train.epochs=1", NULL };
	ck_assert_msg(tiny_train(d, 1, 4095, 4095, ov, &r) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r.test_samples, P24 + (1 << 20));
	ck_assert_msg(r.test_acc == 1.0, "test_acc %.9g", r.test_acc);
	ck_assert_msg(r.test_acc5 == 1.0, "test_acc5 %.9g", r.test_acc5);
	ck_assert_msg(r.test_loss == 0.0, "test_loss %.9g", r.test_loss);
}
END_TEST

/* dir's ckpt-2.kiln, of a run of one step an epoch, made the checkpoint
 * of that run at step 2^24 (ckpt-16777216.kiln): its header's and trainer
 * section's step, the epoch before it, the device's step counters, the
 * step of its evaluations, and "clip_counts"' skipped and clipped. */
static void to_step_2p24(const char *dir, int64_t skipped, int64_t clipped)
{
	char from[300], to[300];
	snprintf(from, sizeof from, "%s/checkpoints/ckpt-2.kiln", dir);
	snprintf(to, sizeof to, "%s/checkpoints/ckpt-%lld.kiln", dir, (long long)P24);
	ck_assert(rename(from, to) == 0);
	patch_u64(to, NULL, 32, P24);            /* the header's step */
	patch_u64(to, "trainer", 0, P24 - 1);    /* epoch (0-based; one step each) */
	patch_u64(to, "trainer", 8, P24);        /* step */
	patch_u64(to, "step", 0, P24);           /* the model's micro-steps */
	patch_u64(to, "optim.step", 0, P24);     /* the optimizer's */
	patch_u64(to, "evaluated", 0, P24);      /* the step its evaluations followed */
	patch_u64(to, "clip_counts", 0, (uint64_t)skipped);
	patch_u64(to, "clip_counts", 8, (uint64_t)clipped);
}

/* clip_norm 1e-9 clips every step: a run at step 2^24 that clipped every
 * step, resumed for 20 steps, clipped 2^24 + 20. */
START_TEST(test_clipped_past_2p24)
{
	char d[64], max[64];
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(d, sizeof d);
#define CLIP "train.clip_norm=1e-9", "train.epochs=1000000000", "train.log_every=1", \
	"train.eval_every=0"
	const char *const cut[] = { CLIP, "train.max_steps=2", NULL };
	snprintf(max, sizeof max, "train.max_steps=%lld", (long long)(P24 + 20));
	const char *const rest[] = { CLIP, max, "train.resume=1", NULL };
#undef CLIP
	ck_assert_msg(tiny_train(d, 2, 4, 4, cut, &r1) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r1.steps_clipped, 2);
	to_step_2p24(d, 0, P24);
	ck_assert_msg(tiny_train(d, 2, 4, 4, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, P24);
	ck_assert_int_eq(r2.steps, P24 + 20);
	ck_assert_int_eq(r2.steps_clipped, P24 + 20);
	ck_assert_int_eq(test_last_train_field(d, "clipped"), P24 + 20);
}
END_TEST

/* fp16 from a loss scale of 1e30: every step's scaled gradients overflow
 * and it is skipped (the scale halving, not yet low enough in 22 steps).
 * A run at step 2^24 that skipped every step, resumed for 20: 2^24 + 20
 * skipped and overflows, and each log point warns of its skipped step
 * (before: the count stayed at 2^24, so no step of the interval counted
 * as skipped, no warning, and with a scale that cannot back off no
 * divergence stop either). */
START_TEST(test_skipped_past_2p24)
{
	char d[64], max[64];
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	scratch_dir(d, sizeof d);
#define FP16 "run.precision=fp16", "plugin.amp.init_scale=1e30", "train.epochs=1000000000", \
	"train.log_every=1", "train.eval_every=0"
	const char *const cut[] = { FP16, "train.max_steps=2", NULL };
	snprintf(max, sizeof max, "train.max_steps=%lld", (long long)(P24 + 20));
	const char *const rest[] = { FP16, max, "train.resume=1", NULL };
#undef FP16
	ck_assert_msg(tiny_train(d, 2, 4, 4, cut, &r1) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r1.steps_skipped, 2);
	to_step_2p24(d, P24, 0);
	kiln_log_set_sink(check_log_sink, NULL);
	check_log_clear();
	ck_assert_msg(tiny_train(d, 2, 4, 4, rest, &r2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, P24);
	ck_assert_int_eq(r2.steps_skipped, P24 + 20);
	ck_assert_int_eq(r2.overflows, P24 + 20);
	ck_assert_int_eq(test_last_train_field(d, "skipped"), P24 + 20);
	ck_assert_int_eq(check_log_count("1 step(s) of the last 1 skipped", NULL), 20);
}
END_TEST

static Suite *make_count_exact_suite(void)
{
	Suite *s = suite_create("count_exact");
	check_add_case(s, "counts", 120, scratch_setup, scratch_teardown,
		       (const TTest *[]){ test_eval_past_2p24, test_clipped_past_2p24,
					   test_skipped_past_2p24, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_count_exact_suite, .reg = &reg,
					       .need_cpu = 1, .need_precision = "amp",
					       .omp_passive = 1 };
