/* tests/check_sched.c - the device's learning-rate schedule op
 * (KILN_OP_LR_SCHEDULE) against PyTorch's schedulers, step by step:
 * tests/data/sched_refs.txt holds the rates torch 1.13's LinearLR +
 * SequentialLR warmup, CosineAnnealingLR, StepLR, MultiStepLR and OneCycleLR
 * give, and since session 43 ExponentialLR, LinearLR, PolynomialLR and
 * OneCycleLR's three_phase and anneal_strategy = 'linear'
 * (tests/data/gen_sched_refs.py).  Also the trainer's lr_scale. */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include <check.h>
#include "check_main.h"
#include "internal.h" /* kiln_parse_milestones */
#include "plateau.h"  /* kiln_plateau_update: schedule = plateau's rule */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

/* kiln's [train] schedule names, in KILN_SCHED_* order */
static const char *const kinds[] = { "constant", "cosine",      "step",   "multistep",
				     "onecycle", "exponential", "linear", "polynomial" };

/* The CPU device, a stream, and the schedule op's device buffers: the
 * step it reads, the rate it writes */
struct sched_fixture {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *stream;
	int64_t *step_d;
	float *lr_d;
};

static void sched_fixture_open(struct sched_fixture *x)
{
	ck_assert(kiln_config_new(&x->cfg) == 0);
	ck_assert_msg(kiln_device_open(reg, x->cfg, "cpu", 0, &x->dev) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(x->dev, &x->stream) == 0);
	ck_assert(kiln_device_alloc(x->dev, 64, (void **)&x->step_d) == 0);
	ck_assert(kiln_device_alloc(x->dev, 64, (void **)&x->lr_d) == 0);
}

static void sched_fixture_close(struct sched_fixture *x)
{
	kiln_device_free(x->dev, x->step_d);
	kiln_device_free(x->dev, x->lr_d);
	kiln_device_stream_destroy(x->dev, x->stream);
	kiln_device_close(x->dev);
	kiln_config_free(x->cfg);
}

/* An LR_SCHEDULE op of kind (KILN_SCHED_*): i64[1] step in, f32[1] rate
 * out, every parameter 0 */
static void sched_op(struct kiln_op *op, int kind)
{
	int64_t one = 1;
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_LR_SCHEDULE;
	op->n_in = op->n_out = 1;
	kiln_tensor_desc_init(&op->in[0], KILN_I64, 1, &one);
	kiln_tensor_desc_init(&op->out[0], KILN_F32, 1, &one);
	op->i[0] = kind;
}

/* The schedule op's rate at step t (plan prepared on x's device) */
static float sched_at(struct sched_fixture *x, void *plan, int64_t t)
{
	struct kiln_op_args a = { .in = { x->step_d }, .out = { x->lr_d } };
	float got;
	ck_assert(kiln_device_copy_async(x->dev, x->step_d, &t, 8, KILN_COPY_H2D, x->stream) == 0);
	ck_assert(kiln_device_run(x->dev, plan, &a, x->stream) == 0);
	ck_assert(kiln_device_copy_async(x->dev, &got, x->lr_d, 4, KILN_COPY_D2H, x->stream) == 0);
	ck_assert(kiln_device_stream_sync(x->dev, x->stream) == 0);
	return got;
}

START_TEST(test_schedules_vs_pytorch)
{
	char path[1024], line[65536];
	snprintf(path, sizeof path, "%s/tests/data/sched_refs.txt", SRCDIR);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	struct sched_fixture x;
	sched_fixture_open(&x);
	int cases = 0;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#')
			continue;
		char name[64], kind[32], anneal[16];
		int T, W, n, three;
		double base, lr_min, gamma, pct, div, fdiv, start, end, power;
		long step_size, iters;
		ck_assert(sscanf(line, "%63s %31s %d %d %lf %lf %ld %lf %lf %lf %lf %lf %lf %ld %lf %d %15s%n",
				 name, kind, &T, &W, &base, &lr_min, &step_size, &gamma, &pct, &div,
				 &fdiv, &start, &end, &iters, &power, &three, anneal, &n) == 17);
		struct kiln_op op;
		sched_op(&op, -1);
		for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
			if (!strcmp(kind, kinds[k]))
				op.i[0] = k;
		ck_assert_msg(op.i[0] >= 0, "%s: schedule %s unknown", name, kind);
		op.i[1] = T, op.i[2] = W, op.i[3] = step_size;
		op.f[0] = base, op.f[1] = lr_min, op.f[2] = gamma, op.f[3] = fdiv, op.f[4] = pct;
		if (op.i[0] == KILN_SCHED_ONECYCLE) {
			op.f[2] = div;
			op.i[5] = three;
			op.i[6] = !strcmp(anneal, "linear");
		} else if (op.i[0] == KILN_SCHED_LINEAR) {
			op.i[3] = iters, op.f[2] = start, op.f[3] = end;
		} else if (op.i[0] == KILN_SCHED_POLYNOMIAL) {
			op.i[3] = iters, op.f[2] = power;
		}
		char *p = line + n;
		if (op.i[0] == KILN_SCHED_MULTISTEP) {
			op.i[3] = 0;
			char *q;
			for (long m; (m = strtol(p, &q, 10)), q != p; p = q)
				op.i[4 + op.i[3]++] = m;
		}
		p = strchr(p, ';');
		ck_assert(p != NULL);
		p++;
		void *plan;
		ck_assert_msg(kiln_device_prepare(x.dev, &op, &plan, NULL) == 0, "%s: %s", name,
			      kiln_last_error());
		double worst = 0;
		for (int64_t t = 0; t < T; t++) {
			char *q;
			double want = strtod(p, &q);
			ck_assert_msg(q != p, "%s: %d rates expected", name, T);
			p = q;
			const float got = sched_at(&x, plan, t);
			double rel = fabs(got - want) / fmax(fabs(want), 1e-12);
			worst = fmax(worst, rel);
			ck_assert_msg(rel < 2e-6, "%s step %lld: lr %.9g, PyTorch %.9g", name, (long long)t,
				      got, want);
		}
		printf("schedule %-15s %3d steps: max rel diff vs PyTorch %.2e\n", name, T, worst);
		kiln_device_plan_free(x.dev, plan);
		cases++;
	}
	fclose(f);
	ck_assert_int_ge(cases, 24);
	sched_fixture_close(&x);
}
END_TEST

/* Bad parameters are refused at prepare. */
START_TEST(test_schedule_bad)
{
	struct sched_fixture x;
	sched_fixture_open(&x);
	struct kiln_device *dev = x.dev;
	struct kiln_op op;
	void *plan;
	sched_op(&op, KILN_SCHED_STEP); /* step_size 0 */
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	op.i[0] = KILN_SCHED_ONECYCLE; /* pct_start 0 */
	op.f[2] = 25, op.f[3] = 1e4;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	/* pct_start x (T - W) = 1: a rise of 0 steps, whose first rate is
	 * 0/0 (OneCycleLR: ZeroDivisionError); before session 32 a NaN lr */
	op.i[1] = 12, op.i[2] = 2, op.f[4] = 0.1;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "pct_start x max(T - W, 1) != 1"), "%s",
		      kiln_last_error());
	/* run only from step 3 on (i[4] > W = 2: a resume past the rise):
	 * prepared, its rates OneCycleLR's falling phase (session 40) */
	op.i[4] = 3;
	ck_assert_msg(kiln_device_prepare(dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
	kiln_device_plan_free(dev, plan);
	op.i[4] = 2;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	op.i[4] = 0;
	op.i[1] = 13; /* 0.1 x 11: a rise of 0.1 step, its first rate lr / div_factor */
	ck_assert_msg(kiln_device_prepare(dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
	kiln_device_plan_free(dev, plan);
	/* onecycle's three_phase and anneal_strategy are 0 or 1 */
	op.i[5] = 2;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	op.i[5] = 1, op.i[6] = -1;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_EINVAL);
	op.i[5] = op.i[6] = 0;
	/* session 43's: LinearLR's and PolynomialLR's total_iters >= 1 (they
	 * divide by it), LinearLR's factors in its ranges, a power >= 0 */
	static const struct {
		int kind;
		int64_t iters;
		double f2, f3;
		int ok;
	} sc[] = {
		{ KILN_SCHED_LINEAR, 5, 1.0 / 3, 1, 1 },   { KILN_SCHED_LINEAR, 0, 1.0 / 3, 1, 0 },
		{ KILN_SCHED_LINEAR, 5, 0, 1, 0 },         { KILN_SCHED_LINEAR, 5, 1.5, 1, 0 },
		{ KILN_SCHED_LINEAR, 5, 0.5, -0.1, 0 },    { KILN_SCHED_LINEAR, 5, 0.5, 1.1, 0 },
		{ KILN_SCHED_LINEAR, 5, 1, 0, 1 },         { KILN_SCHED_POLYNOMIAL, 5, 1, 0, 1 },
		{ KILN_SCHED_POLYNOMIAL, 0, 1, 0, 0 },     { KILN_SCHED_POLYNOMIAL, 5, -1, 0, 0 },
		{ KILN_SCHED_POLYNOMIAL, 5, NAN, 0, 0 },   { KILN_SCHED_EXPONENTIAL, 0, 0.9, 0, 1 },
		{ KILN_SCHED_EXPONENTIAL, 0, -0.5, 0, 0 }, { KILN_SCHED_EXPONENTIAL, 0, INFINITY, 0, 0 },
	};
	for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++) {
		op.i[0] = sc[k].kind, op.i[3] = sc[k].iters, op.f[2] = sc[k].f2, op.f[3] = sc[k].f3;
		kiln_status st = kiln_device_prepare(dev, &op, &plan, NULL);
		ck_assert_msg(st == (sc[k].ok ? KILN_OK : KILN_EINVAL),
			      "case %zu: schedule %d, i[3] %lld, f[2] %g, f[3] %g: status %d (%s)", k,
			      sc[k].kind, (long long)sc[k].iters, sc[k].f2, sc[k].f3, st,
			      kiln_last_error());
		if (!st)
			kiln_device_plan_free(dev, plan);
	}
	op.i[0] = 9;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_ENOTSUP);
	op.i[0] = 8;
	ck_assert_int_eq(kiln_device_prepare(dev, &op, &plan, NULL), KILN_ENOTSUP);
	sched_fixture_close(&x);
}
END_TEST

/* A repeated milestone applies gamma once per occurrence, as PyTorch's
 * MultiStepLR (a Counter of milestones; closed form base * gamma ^
 * bisect_right(milestones, epoch)): "5, 5, 12" gives base, then base *
 * gamma^2 from step 5, base * gamma^3 from step 12.  kiln refused it as
 * not ascending before session 34, and took ",,," as no milestones and
 * 99999999999999999999 as INT64_MAX. */
START_TEST(test_multistep_milestones)
{
	int64_t m[KILN_MAX_MILESTONES];
	ck_assert_int_eq(kiln_parse_milestones("5, 5, 12", m), 3);
	ck_assert(m[0] == 5 && m[1] == 5 && m[2] == 12);
	ck_assert_int_eq(kiln_parse_milestones("3 6", m), 2);
	ck_assert_int_eq(kiln_parse_milestones("", m), 0);
	ck_assert_int_eq(kiln_parse_milestones(" ", m), 0);
	static const struct {
		const char *v;
		int want;
	} bad[] = {
		{ ",,,", KILN_MILESTONES_EMPTY }, { "5,", KILN_MILESTONES_EMPTY },
		{ ",5", KILN_MILESTONES_EMPTY },  { "5,,6", KILN_MILESTONES_EMPTY },
		{ "5, ,6", KILN_MILESTONES_EMPTY },
		{ "99999999999999999999", KILN_MILESTONES_RANGE },
		{ "6, 5", KILN_MILESTONES_ORDER }, { "-1", KILN_MILESTONES_FORM },
		{ "5x", KILN_MILESTONES_FORM },    { "1,2,3,4,5,6,7,8,9,10,11,12,13", KILN_MILESTONES_MANY },
	};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
		ck_assert_msg(kiln_parse_milestones(bad[k].v, m) == bad[k].want, "'%s': %d, expected %d",
			      bad[k].v, kiln_parse_milestones(bad[k].v, m), bad[k].want);

	struct sched_fixture x;
	void *plan;
	sched_fixture_open(&x);
	struct kiln_op op;
	sched_op(&op, KILN_SCHED_MULTISTEP);
	op.i[1] = 20, op.i[2] = 0;
	op.i[3] = kiln_parse_milestones("5, 5, 12", op.i + 4);
	op.f[0] = 0.3, op.f[2] = 0.5;
	ck_assert_msg(kiln_device_prepare(x.dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
	for (int64_t t = 0; t < 20; t++) {
		const float want = t < 5 ? 0.3f : t < 12 ? 0.075f : 0.0375f;
		const float got = sched_at(&x, plan, t);
		ck_assert_msg(got == want, "step %lld: lr %.9g, MultiStepLR %.9g", (long long)t, got, want);
	}
	kiln_device_plan_free(x.dev, plan);
	sched_fixture_close(&x);
}
END_TEST

/* schedule = plateau's rule (core/plateau.c) against torch's
 * ReduceLROnPlateau, stepped with the same losses: every rate equal bit
 * for bit (tests/data/plateau_refs.txt, tests/data/gen_plateau_refs.py).
 * Cases: patience 0 and 1, rel and abs thresholds, cooldown, min_lr, a
 * cut under eps (1e-8) not made, factor 0; NaN and inf losses. */
START_TEST(test_plateau_vs_pytorch)
{
	char path[1024], line[65536];
	snprintf(path, sizeof path, "%s/tests/data/plateau_refs.txt", SRCDIR);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	int cases = 0, cuts = 0;
	while (fgets(line, sizeof line, f)) {
		if (line[0] == '#')
			continue;
		char name[64], mode[8];
		double lr;
		struct kiln_plateau_cfg c;
		struct kiln_plateau p;
		long patience, cooldown;
		int n;
		ck_assert(sscanf(line, "%63s %lf %lf %ld %lf %7s %ld %lf ;%n", name, &lr, &c.factor,
				 &patience, &c.threshold, mode, &cooldown, &c.min_lr, &n) == 8);
		c.patience = patience, c.cooldown = cooldown, c.rel = !strcmp(mode, "rel");
		kiln_plateau_init(&p, lr);
		char *q = line + n, *end;
		int k = 0;
		for (double loss; (loss = strtod(q, &end)), end != q; k++) {
			q = end;
			double want = strtod(q, &end);
			ck_assert_msg(end != q, "%s: a loss without its rate", name);
			q = end;
			const double was = p.lr;
			cuts += kiln_plateau_update(&c, &p, loss);
			ck_assert_msg(p.lr == want, "%s: after loss %d (%g): lr %.17g, ReduceLROnPlateau %.17g (was %.17g)",
				      name, k + 1, loss, p.lr, want, was);
		}
		ck_assert_msg(k >= 20, "%s: %d losses", name, k);
		cases++;
	}
	fclose(f);
	ck_assert_int_ge(cases, 8);
	ck_assert_int_ge(cuts, 20); /* (the rates do move) */
}
END_TEST

/* LinearLR's end: never below 0, and from total_iters on exactly base x
 * end_factor.  Session 43's closed form f2 + (f3 - f2) x m / i3 rounded
 * below 0 at m = i3 with end_factor 0 (start 0.1, 101 iterations: lr
 * -1.39e-17 from step 101 on; PyTorch's +1.4e-17), which the relative
 * comparison against PyTorch (over fmax(|want|, 1e-12)) let pass. */
START_TEST(test_linear_end)
{
	static const struct {
		double base, start, end;
		int64_t iters, W;
	} sc[] = {
		{ 1.0, 0.1, 0, 101, 0 },  { 0.02, 0.1, 0, 101, 3 }, { 0.3, 1.0 / 3, 0, 7, 0 },
		{ 1.0, 0.7, 0, 299, 0 },  { 0.5, 0.9, 0.05, 25, 2 }, { 1.0, 0.3, 0.1, 3, 0 },
	};
	struct sched_fixture x;
	sched_fixture_open(&x);
	for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++) {
		struct kiln_op op;
		int64_t W = sc[k].W, I = sc[k].iters, T = W + I + 5;
		void *plan;
		sched_op(&op, KILN_SCHED_LINEAR);
		op.i[1] = T, op.i[2] = W, op.i[3] = I;
		op.f[0] = sc[k].base, op.f[2] = sc[k].start, op.f[3] = sc[k].end;
		ck_assert_msg(kiln_device_prepare(x.dev, &op, &plan, NULL) == 0, "%s", kiln_last_error());
		for (int64_t t = 0; t < T; t++) {
			const float got = sched_at(&x, plan, t);
			ck_assert_msg(got >= 0, "case %zu step %lld: lr %.9g < 0", k, (long long)t,
				      got);
			if (t - W >= I)
				ck_assert_msg(got == (float)(sc[k].base * sc[k].end),
					      "case %zu step %lld: lr %.9g, want base x end_factor %.9g",
					      k, (long long)t, got, sc[k].base * sc[k].end);
		}
		kiln_device_plan_free(x.dev, plan);
	}
	sched_fixture_close(&x);
}
END_TEST

static Suite *make_sched_suite(void)
{
	Suite *s = suite_create("sched");
	check_add_case(s, "sched", 0, NULL, NULL,
		       (const TTest *[]){ test_schedules_vs_pytorch, test_schedule_bad,
					  test_multistep_milestones, test_plateau_vs_pytorch,
					  test_linear_end, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_sched_suite, .reg = &reg };
