/* tests/check_amp.c - mixed precision's loss scaler through kiln_train
 * ([run] precision, the amp plugin, docs/precision.md):
 *
 * - an overflow injected into the flat gradients on the device (a test
 *   hook enqueues FILL(+inf) on one element at chosen steps) skips exactly
 *   those steps and backs the scale off, with no host sync and no
 *   device-to-host copy inside the steps (the device wrapper's counters,
 *   async CPU streams);
 * - the scale grows after growth_interval finite steps: the final scale
 *   and overflow count equal the rule's reference replayed on the host;
 * - with real f16 compute, the fp16 run ends close to fp32 skipping the
 *   same steps (so the loss op multiplies by the device scale and the
 *   unscale op divides by it); from the default scale, growth reaches
 *   f16's range and real overflows are skipped and backed off too;
 * - the scaler state is the checkpoint section "amp.scaler": a run stopped
 *   at step 45 and resumed ends with the same scaler bytes and losses as
 *   the uninterrupted run;
 * - fp16_static keeps its scale; config errors name file:line;
 * - with [train] accumulate = A the f16 gradients have the headroom of
 *   batch B x A's (PyTorch's scaler.scale(loss / A)): a static scale that
 *   trains batch 64 trains 16 x accumulate 4 and 4 pipeline micro-batches
 *   of 16 (before session 37 every
 *   step of it overflowed: the loss gradient was seeded with the scale
 *   over 16 rows and the mean taken after), and dynamic scaling ends at
 *   the same scale after as many overflows, and resumes bit for bit.
 *
 * Fashion-MNIST (scripts/install-deps), 2,000 samples, a small MLP.
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include "checkpoint.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct kiln_registry *reg;

static const char *mlp_ini =
	"[run]\nseed = 5\nout_dir = %s\nprecision = %s\n"
	"[data]\nsource = idx\nlimit = 2000\nmean = 0.286\nstd = 0.353\n"
	"[data.eval]\nlimit = 2000\n"
	"[layer.flat]\ntype = flatten\n"
	"[layer.fc1]\ntype = linear\nout = 128\n[layer.r1]\ntype = relu\n"
	"[layer.fc2]\ntype = linear\nout = 10\n[layer.loss]\ntype = softmax_xent\n"
	"[train]\nepochs = 2\nbatch = 32\nlr = 0.05\nlog_every = 62\neval_batch = 500\n"
	"[plugin.cpu]\nasync = 1\n"
	"[plugin.amp]\ngrowth_interval = 10\n";

#define STEPS 124 /* 2 epochs of 2000 / 32 */

/* ---- the injection hook ------------------------------------------------ */

static const int64_t inject_at[] = { 5, 6, 40 };

struct inject {
	void *fill;       /* FILL(+inf) of one f32, prepared at the first call */
	int calls;
};

static kiln_status inject_hook(void *user, struct kiln_device *dev, void *stream, float *grads,
			       size_t n, int64_t step)
{
	struct inject *in = user;
	kiln_status st;
	in->calls++;
	if (!in->fill) {
		/* prepared during step 1: the steady-state counters start after it */
		struct kiln_op op;
		int64_t one = 1;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_FILL;
		op.n_out = 1;
		op.f[0] = INFINITY;
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
		if ((st = kiln_device_prepare(dev, &op, &in->fill, NULL)))
			return st;
	}
	for (size_t k = 0; k < sizeof inject_at / sizeof *inject_at; k++)
		if (step == inject_at[k]) {
			struct kiln_op_args a = { .out = { grads + n / 3 } };
			return kiln_device_run(dev, in->fill, &a, stream);
		}
	return KILN_OK;
}

/* The scale update rule (plugin.h, KILN_OP_SCALER_UPDATE) replayed over
 * `steps` steps with overflows at inject_at[]: final scale, tracker,
 * hysteresis left, overflows. */
static void reference(int64_t steps, double init, int interval, float out[4])
{
	float s = (float)init, tracker = 0, hyst = 1, over = 0;
	for (int64_t t = 1; t <= steps; t++) {
		int bad = 0;
		for (size_t k = 0; k < sizeof inject_at / sizeof *inject_at; k++)
			bad |= t == inject_at[k];
		if (bad) {
			over += 1, tracker = 0, hyst = hyst > 0 ? hyst - 1 : 0;
			if (hyst <= 0)
				s *= 0.5f;
		} else if (++tracker >= (float)interval) {
			s *= 2.0f, tracker = 0, hyst = 1;
		}
	}
	out[0] = s, out[1] = tracker, out[2] = hyst, out[3] = over;
}

static int train(const char *dir, const char *precision, const char *const *over,
		 struct kiln_train_result *res, struct inject *in)
{
	char ini[4096];
	struct kiln_config *cfg;
	snprintf(ini, sizeof ini, mlp_ini, dir, precision);
	ck_assert_msg(kiln_config_load_string(ini, "amp.ini", &cfg) == KILN_OK, "%s",
		      kiln_last_error());
	for (int i = 0; over && over[i]; i++)
		ck_assert_msg(kiln_config_override(cfg, over[i]) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_config_validate(cfg, reg) == KILN_OK, "%s", kiln_last_error());
	kiln_set_grad_hook(in ? inject_hook : NULL, in);
	int st = kiln_train(cfg, reg, NULL, NULL, res);
	kiln_set_grad_hook(NULL, NULL);
	kiln_config_free(cfg);
	return st;
}

static void tmpdir(char *buf, size_t n)
{
	ck_assert(test_tmpdir_make(buf, n, "amp") != NULL);
}

/* The "amp.scaler" section of a checkpoint. */
static void read_scaler(const char *path, float out[4])
{
	struct kiln_ckpt *ck;
	uint64_t bytes;
	ck_assert_msg(kiln_ckpt_open(path, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_find(ck, "amp.scaler", &bytes) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(bytes, 16);
	ck_assert(kiln_ckpt_read(ck, "amp.scaler", out, 16) == 0);
	kiln_ckpt_close(ck);
}

/* The i64 "optim.step" section of a checkpoint: optimizer steps taken. */
static int64_t read_optim_step(const char *path)
{
	struct kiln_ckpt *ck;
	uint64_t bytes;
	int64_t t;
	ck_assert_msg(kiln_ckpt_open(path, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_find(ck, "optim.step", &bytes) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(bytes, 8);
	ck_assert(kiln_ckpt_read(ck, "optim.step", &t, 8) == 0);
	kiln_ckpt_close(ck);
	return t;
}

/* ---- tests --------------------------------------------------------------- */

/* Skips, backoff and growth, on the device, counted, with no host sync,
 * over real f16 compute.  From a scale of 256 the scaled gradients stay
 * well inside f16's range, so exactly the injected steps are skipped and
 * the final state is the rule replayed over them. */
START_TEST(test_overflow_skip_backoff_growth)
{
	char dir[64];
	struct kiln_train_result r16 = KILN_TRAIN_RESULT_INIT, r32 = KILN_TRAIN_RESULT_INIT;
	struct inject in16 = { 0 }, in32 = { 0 };
	float want[4], got[4];
	TEST_REQUIRE_FASHION();
	tmpdir(dir, sizeof dir);
	const char *const ck[] = { "train.checkpoint_every=1000", "plugin.amp.init_scale=256", NULL };
	ck_assert_msg(train(dir, "fp16", ck, &r16, &in16) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r16.steps, STEPS);
	ck_assert_int_eq(in16.calls, STEPS);
	/* the injected steps, and only they, were skipped and backed off */
	ck_assert_int_eq(r16.steps_skipped, 3);
	ck_assert_int_eq(r16.overflows, 3);
	reference(STEPS, 256, 10, want);
	/* 256 -> 128 (step 5) -> 64 (6), x2 at 16, 26, 36 -> 512, /2 at 40,
	 * x2 at 50, 60, ..., 120 (8 times) -> 2^16 */
	ck_assert_float_eq(want[0], 65536.0f);
	ck_assert_msg(r16.loss_scale == want[0], "scale %g, want %g", r16.loss_scale, want[0]);
	/* no host sync, no device-to-host copy, no allocation between log points */
	ck_assert_uint_gt(r16.steady.runs, 1000);
	ck_assert_uint_eq(r16.steady.host_syncs, 0);
	ck_assert_uint_eq(r16.steady.d2h_copies, 0);
	ck_assert_uint_eq(r16.steady.allocs, 0);
	/* the state went into the final checkpoint */
	read_scaler(r16.checkpoint, got);
	ck_assert_msg(!memcmp(got, want, sizeof got), "amp.scaler {%g %g %g %g}, want {%g %g %g %g}",
		      got[0], got[1], got[2], got[3], want[0], want[1], want[2], want[3]);
	/* fp32 with the same injected overflows skips the same steps; f16
	 * activations end close to it (not bit for bit: f16 rounds) */
	ck_assert_msg(train("", "fp32", NULL, &r32, &in32) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r32.steps_skipped, 3);
	ck_assert_int_eq(r32.overflows, 0);
	ck_assert(r32.loss_scale == 1.0);
	ck_assert_msg(fabs(r16.train_loss - r32.train_loss) <= 0.05 * r32.train_loss,
		      "train loss %.9g (fp16) vs %.9g (fp32)", r16.train_loss, r32.train_loss);
	ck_assert_msg(fabs(r16.test_acc - r32.test_acc) <= 0.02, "test accuracy %g (fp16) vs %g (fp32)",
		      r16.test_acc, r32.test_acc);
	ck_assert_msg(r16.test_acc > 0.7, "test accuracy %g", r16.test_acc);
}
END_TEST

/* From the default 65536 the scale grows every 10 steps until the scaled
 * activation gradients overflow f16 (65504): real overflows, found by the
 * non-finite check, skipped and backed off like the injected ones. */
START_TEST(test_real_f16_overflow)
{
	char dir[64];
	struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
	struct inject in = { 0 };
	float want[4], got[4];
	TEST_REQUIRE_FASHION();
	tmpdir(dir, sizeof dir);
	const char *const ck[] = { "train.checkpoint_every=1000", NULL };
	ck_assert_msg(train(dir, "fp16", ck, &r, &in) == 0, "%s", kiln_last_error());
	reference(STEPS, 65536, 10, want); /* the injected overflows alone: 2^24 */
	ck_assert_float_eq(want[0], 16777216.0f);
	ck_assert_msg(r.steps_skipped > 3 && r.steps_skipped == r.overflows,
		      "%lld steps skipped, %lld overflows: want the 3 injected and real ones",
		      (long long)r.steps_skipped, (long long)r.overflows);
	ck_assert_msg(r.loss_scale < want[0] && r.loss_scale >= 65536.0,
		      "scale %g: each real overflow halves it", r.loss_scale);
	ck_assert(r.loss_scale == exp2(round(log2(r.loss_scale)))); /* a power of two */
	read_scaler(r.checkpoint, got);
	ck_assert(got[0] == (float)r.loss_scale && got[3] == (float)r.overflows);
	ck_assert_msg(r.test_acc > 0.7, "test accuracy %g", r.test_acc);
}
END_TEST

/* Stopped at step 45 and resumed: the scaler comes back from the
 * checkpoint (a fresh one would end at another scale). */
START_TEST(test_checkpoint_resume)
{
	char a[64], b[64];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	struct inject ia = { 0 }, i1 = { 0 }, i2 = { 0 };
	float sa[4], sb[4], want[4];
	TEST_REQUIRE_FASHION();
	tmpdir(a, sizeof a);
	tmpdir(b, sizeof b);
	const char *const full[] = { "train.checkpoint_every=1000", NULL };
	ck_assert_msg(train(a, "fp16", full, &ra, &ia) == 0, "%s", kiln_last_error());
	const char *const part[] = { "train.checkpoint_every=1000", "train.max_steps=45", NULL };
	ck_assert_msg(train(b, "fp16", part, &r1, &i1) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r1.steps, 45);
	read_scaler(r1.checkpoint, sb);
	reference(45, 65536, 10, want);
	ck_assert(!memcmp(sb, want, sizeof sb));
	ck_assert_float_eq(sb[0], 65536.0f); /* 131072 at 36, halved at 40 */
	const char *const rest[] = { "train.checkpoint_every=1000", "train.resume=1", NULL };
	ck_assert_msg(train(b, "fp16", rest, &r2, &i2) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 45);
	ck_assert_int_eq(r2.steps, STEPS);
	read_scaler(ra.checkpoint, sa);
	read_scaler(r2.checkpoint, sb);
	ck_assert_msg(!memcmp(sa, sb, sizeof sa), "resumed scaler {%g %g %g %g} vs {%g %g %g %g}",
		      sb[0], sb[1], sb[2], sb[3], sa[0], sa[1], sa[2], sa[3]);
	ck_assert(r2.loss_scale == ra.loss_scale);
	ck_assert(r2.test_loss == ra.test_loss && r2.test_acc == ra.test_acc);

	/* stopped at step 7, after the overflows of steps 5 and 6 backed
	 * off twice with no growth between: the hysteresis left stays at 0
	 * (before session 29 it went to -1, and every checkpoint until the
	 * next growth was refused on resume as out of range) */
	char c[64];
	struct kiln_train_result r3 = KILN_TRAIN_RESULT_INIT, r4 = KILN_TRAIN_RESULT_INIT;
	struct inject i3 = { 0 }, i4 = { 0 };
	tmpdir(c, sizeof c);
	const char *const seven[] = { "train.checkpoint_every=1000", "train.max_steps=7", NULL };
	ck_assert_msg(train(c, "fp16", seven, &r3, &i3) == 0, "%s", kiln_last_error());
	read_scaler(r3.checkpoint, sb);
	reference(7, 65536, 10, want);
	ck_assert_msg(!memcmp(sb, want, sizeof sb) && sb[2] == 0.0f && sb[3] == 2.0f,
		      "scaler at step 7 {%g %g %g %g}, want {%g %g %g %g}", sb[0], sb[1], sb[2],
		      sb[3], want[0], want[1], want[2], want[3]);
	ck_assert_msg(train(c, "fp16", rest, &r4, &i4) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r4.resumed_step, 7);
	read_scaler(r4.checkpoint, sb);
	ck_assert_msg(!memcmp(sa, sb, sizeof sa), "resumed from 7: scaler {%g %g %g %g} vs {%g %g %g %g}",
		      sb[0], sb[1], sb[2], sb[3], sa[0], sa[1], sa[2], sa[3]);
	ck_assert(r4.test_loss == ra.test_loss && r4.test_acc == ra.test_acc);
}
END_TEST

/* A skipped step is not an optimizer step: AdamW's and LAMB's step count
 * (their bias correction's t) advances only on the steps taken, as
 * PyTorch's GradScaler skips optimizer.step() (docs/precision.md).  fp16
 * with the 3 injected overflows, and fp32 skipping the same 3 steps for
 * non-finite gradients ([train] skip_nonfinite). */
START_TEST(test_skip_keeps_step_count)
{
	static const char *const opt[] = { "train.optimizer=adamw", "train.optimizer=lamb" };
	static const char *const lr[] = { "train.lr=0.001", "train.lr=0.01" };
	TEST_REQUIRE_FASHION();
	for (int k = 0; k < 2; k++)
		for (int p = 0; p < 2; p++) {
			char dir[64];
			struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
			struct inject in = { 0 };
			tmpdir(dir, sizeof dir);
			const char *const over[] = { "train.checkpoint_every=1000", "train.epochs=1",
						     lr[k], "plugin.amp.init_scale=256", opt[k], NULL };
			ck_assert_msg(train(dir, p ? "fp32" : "fp16", over, &r, &in) == 0, "%s",
				      kiln_last_error());
			ck_assert_int_eq(r.steps, STEPS / 2);
			ck_assert_int_eq(r.steps_skipped, 3);
			const int64_t t = read_optim_step(r.checkpoint);
			ck_assert_msg(t == STEPS / 2 - 3, "%s %s: optim.step %lld after %d steps, 3 skipped",
				      opt[k], p ? "fp32" : "fp16", (long long)t, STEPS / 2);
			ck_assert_msg(r.test_acc > 0.6, "%s: test accuracy %g", opt[k], r.test_acc);
		}
}
END_TEST

/* fp16_static: a constant scale, overflowing steps still skipped. */
START_TEST(test_static)
{
	struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
	struct inject in = { 0 };
	TEST_REQUIRE_FASHION();
	const char *const over[] = { "plugin.amp.loss_scale=1024", "train.epochs=1", NULL };
	ck_assert_msg(train("", "fp16_static", over, &r, &in) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r.steps, 62);
	ck_assert_int_eq(r.steps_skipped, 3);
	ck_assert(r.loss_scale == 1024.0);
	ck_assert_int_eq(r.overflows, 0); /* counted by the dynamic rule only */
}
END_TEST

/* Accumulation keeps the loss scale's headroom: the loss gradient of
 * each micro-batch of 16 is seeded with the scale / 4, as PyTorch's
 * scaler.scale(loss / 4).backward(), so its f16 logit gradients are
 * those of a batch of 64, scale / 64 x (softmax - onehot): 2^21 / 64 =
 * 32768 at most, inside f16's 65504.  Seeded with the scale over 16 rows
 * (131072 x (softmax - onehot), the mean taken after the sum) every step
 * overflows, and the run stops as diverged.  So does a pipeline of 4
 * micro-batches of 16 in 2 stages, whose stages scaled their gradient
 * slices to the mean after the last micro-batch with a loss scale (its
 * seed held 1 / 4 only without one).  Dynamic scaling from 2^21 then
 * ends where batch 64's does, after as many overflows. */
START_TEST(test_accumulate_headroom)
{
	struct kiln_train_result r[3] = { KILN_TRAIN_RESULT_INIT, KILN_TRAIN_RESULT_INIT,
					  KILN_TRAIN_RESULT_INIT };
	static const char *const shape[3][2] = { { "train.batch=64", "train.accumulate=1" },
						 { "train.batch=16", "train.accumulate=4" },
						 { "pipeline.micro_batches=4", "layer.fc2.stage=1" } };
	TEST_REQUIRE_FASHION();
	for (int k = 0; k < 3; k++) {
		const char *const over[] = { "plugin.amp.loss_scale=2097152", "train.batch=64",
					     shape[k][0], shape[k][1], "train.log_every=31", NULL };
		ck_assert_msg(train("", "fp16_static", over, &r[k], NULL) == 0, "%s %s: %s",
			      shape[k][0], shape[k][1], kiln_last_error());
		ck_assert_int_eq(r[k].steps, 62);
		ck_assert_msg(r[k].steps_skipped == 0, "%s %s: %lld of 62 steps skipped", shape[k][0],
			      shape[k][1], (long long)r[k].steps_skipped);
	}
	for (int k = 1; k < 3; k++)
		ck_assert_msg(fabs(r[0].train_loss - r[k].train_loss) <= 1e-2 * r[0].train_loss,
			      "train loss %.9g (batch 64) vs %.9g (%s %s)", r[0].train_loss,
			      r[k].train_loss, shape[k][0], shape[k][1]);
	for (int k = 0; k < 2; k++) {
		const char *const over[] = { "plugin.amp.init_scale=2097152", "train.batch=64",
					     shape[k][0], shape[k][1], "train.log_every=31", NULL };
		r[k] = (struct kiln_train_result)KILN_TRAIN_RESULT_INIT;
		ck_assert_msg(train("", "fp16", over, &r[k], NULL) == 0, "%s", kiln_last_error());
	}
	ck_assert_msg(r[0].loss_scale == r[1].loss_scale && r[0].overflows == r[1].overflows,
		      "dynamic: scale %g after %lld overflows (batch 64), %g after %lld (16 x 4)",
		      r[0].loss_scale, (long long)r[0].overflows, r[1].loss_scale,
		      (long long)r[1].overflows);
}
END_TEST

/* A checkpoint section's bytes (malloc'd; *bytes its size). */
static void *read_section(const char *path, const char *name, uint64_t *bytes)
{
	struct kiln_ckpt *ck;
	ck_assert_msg(kiln_ckpt_open(path, &ck) == 0, "%s", kiln_last_error());
	ck_assert_msg(kiln_ckpt_find(ck, name, bytes) == 0, "%s", kiln_last_error());
	void *v = malloc(*bytes);
	ck_assert(v && kiln_ckpt_read(ck, name, v, *bytes) == 0);
	kiln_ckpt_close(ck);
	return v;
}

/* With accumulate the loss seed, scale / 4, is set from the scale at
 * each step's start, so a resume (which restores the scale after the
 * seed was first set) ends with the uninterrupted run's bytes: fp16
 * from 2^23, whose real overflows move the scale before and after the
 * stop at step 20. */
START_TEST(test_accumulate_resume)
{
	char a[64], b[64];
	struct kiln_train_result ra = KILN_TRAIN_RESULT_INIT, r1 = KILN_TRAIN_RESULT_INIT;
	struct kiln_train_result r2 = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	tmpdir(a, sizeof a);
	tmpdir(b, sizeof b);
#define ACC_RUN "train.batch=16", "train.accumulate=4", "data.shuffle=1", \
		"plugin.amp.init_scale=8388608", "train.checkpoint_every=1000"
	const char *const full[] = { ACC_RUN, NULL };
	const char *const part[] = { ACC_RUN, "train.max_steps=20", NULL };
	const char *const rest[] = { ACC_RUN, "train.resume=1", NULL };
#undef ACC_RUN
	ck_assert_msg(train(a, "fp16", full, &ra, NULL) == 0, "%s", kiln_last_error());
	ck_assert_msg(train(b, "fp16", part, &r1, NULL) == 0, "%s", kiln_last_error());
	ck_assert_msg(train(b, "fp16", rest, &r2, NULL) == 0, "%s", kiln_last_error());
	ck_assert_int_eq(r2.resumed_step, 20);
	ck_assert_int_eq(ra.steps, 62);
	ck_assert_int_eq(r2.steps, 62);
	ck_assert_msg(r1.overflows > 0 && ra.overflows > r1.overflows,
		      "overflows: %lld by step 20, %lld by 62: want some on both sides",
		      (long long)r1.overflows, (long long)ra.overflows);
	static const char *const sec[] = { "params", "optim.momentum", "amp.scaler" };
	for (size_t k = 0; k < sizeof sec / sizeof *sec; k++) {
		uint64_t na, nb;
		void *va = read_section(ra.checkpoint, sec[k], &na);
		void *vb = read_section(r2.checkpoint, sec[k], &nb);
		ck_assert_msg(na == nb && !memcmp(va, vb, na), "%s: resumed at step 20 differs", sec[k]);
		free(va);
		free(vb);
	}
}
END_TEST

/* One KILN_OP_SCALER_UPDATE on the CPU device: state st after a step
 * whose finite flag is `finite`. */
static kiln_status scaler_op(struct kiln_device *dev, double backoff, int64_t interval,
			     float finite, float st[4])
{
	struct kiln_op op;
	int64_t four = 4;
	void *plan;
	float *d;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SCALER_UPDATE;
	op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &four);
	op.out[0] = op.in[0];
	op.f[0] = 2, op.f[1] = backoff;
	op.i[0] = interval, op.i[1] = 1;
	kiln_status s = kiln_device_prepare(dev, &op, &plan, NULL);
	if (s)
		return s;
	const float gate[4] = { 0, finite, 0, 0 };
	void *stream;
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	ck_assert(kiln_device_alloc(dev, 64, (void **)&d) == 0);
	ck_assert(kiln_device_copy_async(dev, d, gate, 16, KILN_COPY_H2D, stream) == 0);
	ck_assert(kiln_device_copy_async(dev, d + 8, st, 16, KILN_COPY_H2D, stream) == 0);
	struct kiln_op_args a = { .in = { d }, .out = { d + 8 } };
	ck_assert(kiln_device_run(dev, plan, &a, stream) == 0);
	ck_assert(kiln_device_copy_async(dev, st, d + 8, 16, KILN_COPY_D2H, stream) == 0);
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	kiln_device_free(dev, d);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_plan_free(dev, plan);
	return KILN_OK;
}

/* The scale update's edges (session 32): a backoff never takes the
 * scale below FLT_MIN (before, it underflowed to 0, which no later step
 * leaves: the gradients x 0 unscaled by 1/0 are NaN); growth_interval is
 * at most 2^24, where the f32 tracker still counts (before, up to 1e9
 * was accepted and any interval above 2^24 never grew). */
START_TEST(test_scaler_op_edges)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert_msg(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0, "%s", kiln_last_error());
	float st[4] = { 1e-37f, 0, 1, 0 };
	ck_assert(scaler_op(dev, 1e-6, 2000, 0, st) == 0);
	ck_assert_msg(st[0] == FLT_MIN, "scale %g after a backoff from 1e-37, want FLT_MIN", st[0]);
	ck_assert(scaler_op(dev, 0.5, 2000, 0, st) == 0);
	ck_assert_msg(st[0] == FLT_MIN, "scale %g after a backoff at FLT_MIN", st[0]);
	ck_assert(st[3] == 2.0f);
	/* ... and grows from there */
	ck_assert(scaler_op(dev, 0.5, 1, 1, st) == 0);
	ck_assert(st[0] == 2 * FLT_MIN);
	/* the largest interval is reached */
	float g[4] = { 1024, 16777215, 1, 0 };
	ck_assert(scaler_op(dev, 0.5, 16777216, 1, g) == 0);
	ck_assert_msg(g[0] == 2048 && g[1] == 0, "scale %g tracker %g at interval 2^24", g[0], g[1]);
	ck_assert_int_eq(scaler_op(dev, 0.5, 16777217, 1, g), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "[1, 2^24]"), "%s", kiln_last_error());
	kiln_device_close(dev);
	kiln_config_free(cfg);
	/* the key refuses what the op would */
	char ini[4096];
	snprintf(ini, sizeof ini, mlp_ini, "", "fp16");
	ck_assert(kiln_config_load_string(ini, "amp.ini", &cfg) == KILN_OK);
	ck_assert(kiln_config_override(cfg, "plugin.amp.growth_interval=16777217") == KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "'growth_interval' = 16777217 is out of range [1, 16777216]"),
		      "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* Bad configs name file:line; bf16 runs without a scaler. */
START_TEST(test_config_errors)
{
	struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
	TEST_REQUIRE_FASHION();
	ck_assert_int_eq(train("", "fp16_static", NULL, &r, NULL), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "amp.ini:4") && strstr(kiln_last_error(), "loss_scale"),
		      "%s", kiln_last_error());
	const char *const noskip[] = { "train.skip_nonfinite=0", NULL };
	ck_assert_int_eq(train("", "fp16", noskip, &r, NULL), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "skip_nonfinite"), "%s", kiln_last_error());
	const char *const lo[] = { "plugin.amp.min_scale=1e6", NULL };
	ck_assert_int_eq(train("", "fp16", lo, &r, NULL), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "min_scale=1e6") && strstr(kiln_last_error(), "init_scale"),
		      "%s", kiln_last_error());
	/* bf16 trains, with no loss scaling */
	ck_assert_msg(train("", "bf16", NULL, &r, NULL) == 0, "%s", kiln_last_error());
	ck_assert(r.loss_scale == 1.0 && r.steps_skipped == 0 && r.overflows == 0);
	ck_assert_msg(r.test_acc > 0.7, "bf16 test accuracy %g", r.test_acc);
	/* an unknown policy is caught by the schema, with the line */
	struct kiln_config *cfg;
	char ini[4096];
	snprintf(ini, sizeof ini, mlp_ini, "", "fp8");
	ck_assert(kiln_config_load_string(ini, "amp.ini", &cfg) == KILN_OK);
	ck_assert_int_eq(kiln_config_validate(cfg, reg), KILN_ECONFIG);
	ck_assert_msg(strstr(kiln_last_error(), "amp.ini:4"), "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_amp_suite(void)
{
	Suite *s = suite_create("amp");
	check_add_case(s, "scaler", 300, NULL, NULL, (const TTest *[]){
		test_overflow_skip_backoff_growth, test_real_f16_overflow, test_checkpoint_resume,
		test_skip_keeps_step_count, test_static, test_config_errors, test_scaler_op_edges,
		test_accumulate_headroom, test_accumulate_resume, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_amp_suite, .reg = &reg, .need_cpu = 1,
					       .need_precision = "amp", .omp_passive = 1 };
