/* tests/check_device_elementwise.c - device conformance:
 * the elementwise ops: MUL, COUNTER_ADD, LR_SCHEDULE, FILL,
 * REDUCE_SUM, SCALE, ADD, the activations and dropout.
 *
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "check_main.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- MUL, COUNTER_ADD, LR_SCHEDULE -------------------------------------- */

START_TEST(test_small_ops)
{
	struct fx f;
	fx_open(&f, _i);
	struct kiln_op op;
	void *plan;
	size_t wsb;
	/* MUL, written and accumulated */
	enum { N = 50001 };
	float *a = frandv(N), *b = frandv(N), *got = malloc(N * 4);
	void *da = dput(&f, a, N * 4), *db = dput(&f, b, N * 4), *dy = dput(&f, b, N * 4);
	for (int acc = 0; acc < 2; acc++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_MUL;
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		op.n_in = 2, op.n_out = 1;
		op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, N, 0);
		OK(kiln_device_prepare(f.dev, &op, &plan, &wsb));
		struct kiln_op_args args = { .in = { da, db }, .out = { dy } };
		OK(kiln_device_run(f.dev, plan, &args, f.s));
		dget(&f, got, dy, N * 4);
		for (int i = 0; i < N; i++) {
			float want = a[i] * b[i] + (acc ? a[i] * b[i] : 0.0f);
			NEAR(got[i], want, fabs(want), 1e-6, "MUL acc=%d [%d] = %g, want %g", acc, i,
			     got[i], want);
		}
		kiln_device_plan_free(f.dev, plan);
	}
	/* COUNTER_ADD and LR_SCHEDULE against the formulas of plugin.h */
	int64_t zero = 0, one = 1;
	void *step = dput(&f, &zero, 8), *lr = dput(&f, NULL, 4);
	/* constant, cosine and (ABI 2.30) exponential, linear, polynomial
	 * and onecycle with three_phase and linear annealing */
	enum { NSCHED = 6 };
	void *inc, *sched[NSCHED];
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_COUNTER_ADD;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
	op.i[0] = 1;
	OK(kiln_device_prepare(f.dev, &op, &inc, &wsb));
	static const int kinds[NSCHED] = { KILN_SCHED_CONSTANT,    KILN_SCHED_COSINE,
					   KILN_SCHED_EXPONENTIAL, KILN_SCHED_LINEAR,
					   KILN_SCHED_POLYNOMIAL,  KILN_SCHED_ONECYCLE };
	for (int k = 0; k < NSCHED; k++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_LR_SCHEDULE;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_I64, 1, &one);
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
		op.i[0] = kinds[k];
		op.i[1] = 100, op.i[2] = 10;
		op.f[0] = 0.1, op.f[1] = 0.001;
		if (kinds[k] == KILN_SCHED_EXPONENTIAL)
			op.f[2] = 0.97;
		if (kinds[k] == KILN_SCHED_LINEAR)
			op.i[3] = 40, op.f[2] = 0.25, op.f[3] = 0.75;
		if (kinds[k] == KILN_SCHED_POLYNOMIAL)
			op.i[3] = 50, op.f[2] = 2;
		if (kinds[k] == KILN_SCHED_ONECYCLE)
			op.f[2] = 25, op.f[3] = 1e4, op.f[4] = 0.25, op.i[5] = 1, op.i[6] = 1;
		OK(kiln_device_prepare(f.dev, &op, &sched[k], &wsb));
	}
	for (int t = 0; t < 105; t++) {
		for (int k = 0; k < NSCHED; k++) {
			struct kiln_op_args args = { .in = { step }, .out = { lr } };
			float v;
			OK(kiln_device_run(f.dev, sched[k], &args, f.s));
			dget(&f, &v, lr, 4);
			double want = 0.1;
			/* u after the warm-up, U = 90 steps of it (the length) */
			const int u = t - 10, uc = u < 90 ? u : 90;
			const double init = 0.1 / 25, fin = init / 1e4;
			if (t < 10)
				want = 0.1 * (t + 1) / 10.0;
			else if (kinds[k] == KILN_SCHED_COSINE)
				want = 0.001 + (0.1 - 0.001) * (1 + cos(M_PI * uc / 90.0)) / 2;
			else if (kinds[k] == KILN_SCHED_EXPONENTIAL)
				want = 0.1 * pow(0.97, u);
			else if (kinds[k] == KILN_SCHED_LINEAR)
				want = 0.1 * (0.25 + 0.5 * (u < 40 ? u : 40) / 40.0);
			else if (kinds[k] == KILN_SCHED_POLYNOMIAL)
				want = 0.1 * pow(1 - (u < 50 ? u : 50) / 50.0, 2);
			else if (kinds[k] == KILN_SCHED_ONECYCLE)
				/* OneCycleLR(three_phase, linear): up to lr by step
				 * 0.25 x 90 - 1 = 21.5, down to lr / 25 by 43, then
				 * to the final rate at 89 (the same line past it,
				 * where the trainer never runs it: down to < 0) */
				want = u <= 21.5 ? init + (0.1 - init) * u / 21.5
				       : u <= 43 ? 0.1 + (init - 0.1) * (u - 21.5) / 21.5
						 : init + (fin - init) * (u - 43) / 46.0;
			NEAR(v, want, fabs(want), 1e-6, "schedule %d step %d: lr %g, want %g", kinds[k], t,
			     v, want);
		}
		struct kiln_op_args args = { .out = { step } };
		OK(kiln_device_run(f.dev, inc, &args, f.s));
	}
	int64_t steps;
	dget(&f, &steps, step, 8);
	ck_assert_int_eq(steps, 105);
	/* gated (KILN_OPF_GATED, in0 f32[1]): += 3 where the gate is nonzero
	 * only, the optimizer's count of steps taken */
	{
		void *ginc, *gate = dput(&f, NULL, 4);
		const float gates[5] = { 1, 0, 1, 0.5f, 0 };
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_COUNTER_ADD;
		op.flags = KILN_OPF_GATED;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &one);
		kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
		op.i[0] = 3;
		OK(kiln_device_prepare(f.dev, &op, &ginc, &wsb));
		for (int k = 0; k < 5; k++) {
			struct kiln_op_args args = { .in = { gate }, .out = { step } };
			OK(kiln_device_copy_async(f.dev, gate, &gates[k], 4, KILN_COPY_H2D, f.s));
			OK(kiln_device_run(f.dev, ginc, &args, f.s));
		}
		dget(&f, &steps, step, 8);
		ck_assert_int_eq(steps, 105 + 3 * 3);
		kiln_device_plan_free(f.dev, ginc);
		kiln_device_free(f.dev, gate);
	}
	kiln_device_plan_free(f.dev, inc);
	for (int k = 0; k < NSCHED; k++)
		kiln_device_plan_free(f.dev, sched[k]);
	DFREE(&f, step, lr, da, db, dy);
	free(a), free(b), free(got);
	fx_close(&f);
}
END_TEST

/* ---- FILL / REDUCE_SUM / SCALE / ADD ---------------------------------- */

START_TEST(test_fill)
{
	struct fx f;
	fx_open(&f, _i);
	static const int dt[] = { KILN_F32, KILN_I32, KILN_U8, KILN_I8, KILN_I64, KILN_BF16, KILN_F16 };
	const int n = 40001;
	for (size_t k = 0; k < sizeof dt / sizeof *dt; k++) {
		size_t es = kiln_dtype_size(dt[k]);
		unsigned char *h = malloc(n * es);
		void *d = dput(&f, NULL, n * es);
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_FILL;
		op.n_out = 1;
		op.out[0] = td(dt[k], 2, 1, n);
		op.f[0] = dt[k] == KILN_I8 ? -3 : 1.5;
		void *out[1] = { d };
		OK(run_op(&f, &op, NULL, out));
		dget(&f, h, d, n * es);
		for (int i = 0; i < n; i++) {
			const unsigned char *e = h + (size_t)i * es;
			switch (dt[k]) {
			case KILN_F32: ck_assert_float_eq(((const float *)h)[i], 1.5f); break;
			case KILN_I32: ck_assert_int_eq(((const int32_t *)h)[i], 1); break;
			case KILN_I64: ck_assert_int_eq(((const int64_t *)h)[i], 1); break;
			case KILN_U8: ck_assert_uint_eq(*e, 1); break;
			case KILN_I8: ck_assert_int_eq(*(const int8_t *)e, -3); break;
			case KILN_BF16: ck_assert_uint_eq(((const uint16_t *)h)[i], 0x3fc0); break;
			case KILN_F16: ck_assert_uint_eq(((const uint16_t *)h)[i], 0x3e00); break;
			}
		}
		kiln_device_free(f.dev, d);
		free(h);
	}
	fx_close(&f);
}
END_TEST

START_TEST(test_reduce_scale_add)
{
	struct fx f;
	fx_open(&f, _i);
	static const int sizes[] = { 1, 1000, 100001 };
	for (int si = 0; si < 3; si++)
		for (int acc = 0; acc < 2; acc++) {
			const int n = sizes[si];
			size_t b = (size_t)n * 4;
			float *x = frandv((size_t)n), *y = frandv((size_t)n), *o = frandv((size_t)n);
			float *got = malloc(b), s0 = 2.5f, s;
			void *dx = dput(&f, x, b), *dy = dput(&f, y, b), *ds = dput(&f, &s0, 4);
			void *dout = dput(&f, o, b);
			struct kiln_op op;
			memset(&op, 0, sizeof op);
			op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
			op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, n, 0);

			/* REDUCE_SUM */
			op.type = KILN_OP_REDUCE_SUM;
			op.n_in = op.n_out = 1;
			op.out[0] = td(KILN_F32, 1, 1, 0);
			const void *in[2] = { dx, dy };
			void *out[1] = { ds };
			OK(run_op(&f, &op, in, out));
			dget(&f, &s, ds, 4);
			double want = acc ? s0 : 0, mag = fabs(want);
			for (int i = 0; i < n; i++)
				want += x[i], mag += fabs(x[i]);
			NEAR(s, want, mag, 1e-6, "REDUCE_SUM n=%d acc=%d: %g want %g", n, acc, s, want);

			/* SCALE */
			op.type = KILN_OP_SCALE;
			op.out[0] = td(KILN_F32, 1, n, 0);
			op.f[0] = -0.75;
			out[0] = dout;
			OK(run_op(&f, &op, in, out));
			dget(&f, got, dout, b);
			for (int i = 0; i < n; i++) {
				o[i] = (acc ? o[i] : 0.0f) + -0.75f * x[i];
				ck_assert_float_eq_tol(got[i], o[i], 1e-6);
			}

			/* ADD, then ADD in place (out0 = in0) */
			op.type = KILN_OP_ADD;
			op.n_in = 2;
			OK(run_op(&f, &op, in, out));
			dget(&f, got, dout, b);
			for (int i = 0; i < n; i++) {
				o[i] = (acc ? o[i] : 0.0f) + (x[i] + y[i]);
				ck_assert_float_eq_tol(got[i], o[i], 1e-6);
			}
			in[0] = dout;
			OK(run_op(&f, &op, in, out));
			dget(&f, got, dout, b);
			for (int i = 0; i < n; i++) {
				o[i] = (acc ? o[i] : 0.0f) + (o[i] + y[i]);
				ck_assert_float_eq_tol(got[i], o[i], 1e-5);
			}
			DFREE(&f, dx, dy, ds, dout);
			free(x), free(y), free(o), free(got);
		}
	fx_close(&f);
}
END_TEST

/* ---- activations ------------------------------------------------------ */

static double act_ref(int kind, double x, double alpha, double *deriv, double *y)
{
	double v, d;
	switch (kind) {
	case KILN_ACT_RELU: v = x > 0 ? x : 0, d = x > 0; break;
	case KILN_ACT_LEAKY_RELU: v = x > 0 ? x : alpha * x, d = x > 0 ? 1 : alpha; break;
	case KILN_ACT_GELU:
		v = 0.5 * x * (1 + erf(x / sqrt(2.0)));
		d = 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
		break;
	case KILN_ACT_GELU_TANH: { /* GPT-2's approximation, in double */
		const double k = sqrt(2 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
		v = 0.5 * x * (1 + t);
		d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
		break;
	}
	case KILN_ACT_SIGMOID: v = 1 / (1 + exp(-x)), d = v * (1 - v); break;
	default: v = tanh(x), d = 1 - v * v; break;
	}
	*deriv = d, *y = v;
	return v;
}

static void act_case(struct fx *f, int kind, int n, float alpha)
{
	size_t b = (size_t)n * 4;
	float *x = frandv((size_t)n), *dy = frandv((size_t)n), *dx0 = frandv((size_t)n);
	float *got = malloc(b), *yh = malloc(b);
	for (int i = 0; i < n; i++)
		x[i] *= 4.0f;
	void *dX = dput(f, x, b), *dYo = dput(f, NULL, b), *dDY = dput(f, dy, b);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ACT;
	op.n_in = op.n_out = 1;
	op.in[0] = op.out[0] = td(KILN_F32, 2, 1, n);
	op.i[0] = kind, op.f[0] = alpha;
	const void *in[3] = { dX };
	void *out[1] = { dYo };
	OK(run_op(f, &op, in, out));
	dget(f, yh, dYo, b);
	for (int i = 0; i < n; i++) {
		double d, y;
		act_ref(kind, x[i], alpha, &d, &y);
		NEAR(yh[i], y, fabs(y) + fabs(x[i]) * (kind == KILN_ACT_GELU || kind == KILN_ACT_GELU_TANH), 1e-5,
		     "ACT %d: y(%g) = %.7g, want %.7g", kind, x[i], yh[i], y);
	}
	for (int acc = 0; acc < 2; acc++) {
		void *dDX = dput(f, dx0, b);
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ACT_BWD;
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		op.n_in = 3, op.n_out = 1;
		op.in[0] = op.in[1] = op.in[2] = op.out[0] = td(KILN_F32, 1, n, 0);
		op.i[0] = kind, op.f[0] = alpha;
		in[0] = dX, in[1] = dDY, in[2] = dYo;
		out[0] = dDX;
		OK(run_op(f, &op, in, out));
		dget(f, got, dDX, b);
		for (int i = 0; i < n; i++) {
			double d, y;
			act_ref(kind, x[i], alpha, &d, &y);
			if (kind == KILN_ACT_SIGMOID || kind == KILN_ACT_TANH) /* from the device's y */
				d = kind == KILN_ACT_SIGMOID ? yh[i] * (1.0 - yh[i]) : 1.0 - (double)yh[i] * yh[i];
			double want = (acc ? dx0[i] : 0) + dy[i] * d;
			NEAR(got[i], want, fabs(want) + fabs(dy[i]) + (acc ? fabs(dx0[i]) : 0), 1e-5,
			     "ACT_BWD %d acc %d: dx(%g) = %.7g, want %.7g", kind, acc, x[i], got[i], want);
		}
		kiln_device_free(f->dev, dDX);
	}
	DFREE(f, dX, dYo, dDY);
	free(x), free(dy), free(dx0), free(got), free(yh);
}

START_TEST(test_act)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ACT);
	for (int kind = KILN_ACT_RELU; kind <= KILN_ACT_GELU_TANH; kind++) {
		act_case(&f, kind, 17, 0.01f);
		act_case(&f, kind, 100003, 0.2f);
	}
	fx_close(&f);
}
END_TEST

/* Activations of inputs far out (session 30: the CPU's vectorised e^x
 * took x below about -8.7e6 to garbage and below -1e30 to NaN, so the tanh
 * GELU gave -282 at x = -500, 218 at 500 and NaN at 1e12).  Forward for
 * every input, backward (dy = 1) where the derivative is finite in f32
 * (|x| < 1e19: x*x is, as in PyTorch's formula). */
START_TEST(test_act_extremes)
{
	static const float xs[] = { -1e30f, -1e12f, -1.5e7f, -1e7f, -1e4f, -580.0f, -500.0f, -88.5f,
				    88.5f,  500.0f, 580.0f,  1e4f,  1e7f,  1e12f, 1e30f };
	const int n = (int)(sizeof xs / sizeof xs[0]);
	const size_t b = sizeof xs;
	float ones[sizeof xs / sizeof xs[0]], y[sizeof xs / sizeof xs[0]], dx[sizeof xs / sizeof xs[0]];
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ACT);
	for (int i = 0; i < n; i++)
		ones[i] = 1.0f;
	for (int kind = KILN_ACT_RELU; kind <= KILN_ACT_GELU_TANH; kind++) {
		void *dX = dput(&f, xs, b), *dY = dput(&f, NULL, b), *dDY = dput(&f, ones, b);
		void *dDX = dput(&f, NULL, b);
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ACT;
		op.n_in = op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_F32, 1, n, 0);
		op.i[0] = kind, op.f[0] = 0.01f;
		OK(run_op(&f, &op, (const void *const[]){ dX }, (void *const[]){ dY }));
		dget(&f, y, dY, b);
		op.type = KILN_OP_ACT_BWD;
		op.n_in = 3;
		op.in[1] = op.in[2] = op.in[0];
		OK(run_op(&f, &op, (const void *const[]){ dX, dDY, dY }, (void *const[]){ dDX }));
		dget(&f, dx, dDX, b);
		for (int i = 0; i < n; i++) {
			double d, want;
			act_ref(kind, xs[i], 0.01, &d, &want);
			NEAR(y[i], want, fabs(want), 1e-5, "ACT %d: y(%g) = %.7g, want %.7g", kind,
			     (double)xs[i], (double)y[i], want);
			if (fabsf(xs[i]) < 1e19f)
				NEAR(dx[i], d, fabs(d), 1e-5, "ACT_BWD %d: dx(%g) = %.7g, want %.7g", kind,
				     (double)xs[i], (double)dx[i], d);
		}
		DFREE(&f, dX, dY, dDY, dDX);
	}
	fx_close(&f);
}
END_TEST

/* ---- dropout ---------------------------------------------------------- */

/* The mask plugin.h's DROPOUT defines (see plugins/cpu/act.c), computed here
 * independently: every device must match it bit for bit. */
#include <Random123/philox.h>
static int drop_ref(uint64_t seed, uint32_t layer, uint64_t step, uint64_t e, double p)
{
	philox4x32_ctr_t ctr = { { (uint32_t)e, (uint32_t)(e >> 32),
				   layer ^ (uint32_t)(step >> 32) << 16, (uint32_t)step } };
	philox4x32_key_t key = { { (uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x44524f50u } };
	philox4x32_ctr_t r = philox4x32_R(10, ctr, key);
	return (double)(r.v[0] >> 8) / 16777216.0 >= p;
}

/* Dropout of logical [N,C,H,W] x in the given layout with the counter
 * ctr = { step, row0, rstride }; returns logical y. */
static float *drop_run_ctr(struct fx *f, int bwd, const float *x, const float *y0, int N, int C,
			   int H, int W, int nhwc, double p, int64_t seed, int layer,
			   const int64_t ctr[KILN_DROP_CTR])
{
	float *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, nhwc, &k1), *dY = dput4(f, y0, N, C, H, W, nhwc, &k2);
	void *dS = dput(f, ctr, 8 * KILN_DROP_CTR);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT;
	op.flags = bwd == 2 ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = op.out[0] = td4(N, C, H, W, nhwc);
	op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
	op.i[0] = seed, op.i[1] = layer, op.f[0] = p;
	const void *in[2] = { dX, dS };
	void *out[1] = { dY };
	OK(run_op(f, &op, in, out));
	float *got = dget4(f, dY, N, C, H, W, nhwc);
	DFREE(f, dX, dY, dS);
	free(k1), free(k2);
	return got;
}

/* The same with the rows of one process's batch: { step, 0, 1 }. */
static float *drop_run(struct fx *f, int bwd, const float *x, const float *y0, int N, int C,
		       int H, int W, int nhwc, double p, int64_t seed, int layer, int64_t step)
{
	const int64_t ctr[KILN_DROP_CTR] = { step, 0, 1 };
	return drop_run_ctr(f, bwd, x, y0, N, C, H, W, nhwc, p, seed, layer, ctr);
}

START_TEST(test_dropout)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_DROPOUT);
	const int N = 4, C = 25, H = 25, W = 40; /* 100000 elements */
	const size_t n = (size_t)N * C * H * W;
	const double p = 0.3;
	const int64_t seed = 0x123456789abLL, step = 5;
	const float s = (float)(1.0 / (1.0 - p));
	float *x = frandv(n), *dy = frandv(n), *dx0 = frandv(n);
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		float *y = drop_run(&f, 0, x, x, N, C, H, W, nhwc, p, seed, 7, step);
		float *dx = drop_run(&f, 1, dy, dy, N, C, H, W, nhwc, p, seed, 7, step);
		float *dxa = drop_run(&f, 2, dy, dx0, N, C, H, W, nhwc, p, seed, 7, step);
		size_t kept = 0;
		for (size_t i = 0; i < n; i++) {
			const int keep = drop_ref((uint64_t)seed, 7, step, i, p);
			kept += keep;
			ck_assert_msg(y[i] == (keep ? x[i] * s : 0.0f), "DROPOUT %s y[%zu] = %g, keep %d x %g",
				      nhwc ? "NHWC" : "NCHW", i, y[i], keep, x[i]);
			ck_assert_msg(dx[i] == (keep ? dy[i] * s : 0.0f), "DROPOUT_BWD dx[%zu] = %g", i, dx[i]);
			/* the add may be fused (FMA): one rounding less */
			NEAR(dxa[i], dx0[i] + (keep ? (double)dy[i] * s : 0.0), fabs(dx0[i]) + fabs(dy[i] * s),
			     1e-6, "DROPOUT_BWD acc dx[%zu] = %g", i, dxa[i]);
		}
		const double frac = (double)kept / n, sig = sqrt(p * (1 - p) / n);
		ck_assert_msg(fabs(frac - (1 - p)) < 3 * sig, "kept %g, want %g +- %g", frac, 1 - p, 3 * sig);
		free(y), free(dx), free(dxa);
	}
	/* another step, another layer: another mask */
	float *y5 = drop_run(&f, 0, x, x, N, C, H, W, 0, p, seed, 7, step);
	float *y6 = drop_run(&f, 0, x, x, N, C, H, W, 0, p, seed, 7, step + 1);
	float *y8 = drop_run(&f, 0, x, x, N, C, H, W, 1, p, seed, 8, step);
	size_t same6 = 0, same8 = 0;
	for (size_t i = 0; i < n; i++)
		same6 += (y5[i] != 0) == (y6[i] != 0), same8 += (y5[i] != 0) == (y8[i] != 0);
	ck_assert_msg(same6 < n * 0.65 && same8 < n * 0.65, "masks repeat: %zu %zu of %zu", same6, same8, n);
	/* step 2^32 + 5: its own mask, the reference's (before session 38 the
	 * step was cut to 32 bits and this was step 5's mask) */
	const int64_t far = ((int64_t)1 << 32) + step;
	float *yf = drop_run(&f, 0, x, x, N, C, H, W, 0, p, seed, 7, far);
	size_t samef = 0;
	for (size_t i = 0; i < n; i++) {
		const int keep = drop_ref((uint64_t)seed, 7, (uint64_t)far, i, p);
		ck_assert_msg(yf[i] == (keep ? x[i] * s : 0.0f), "DROPOUT step 2^32 + 5 y[%zu] = %g, keep %d",
			      i, yf[i], keep);
		samef += (y5[i] != 0) == (yf[i] != 0);
	}
	ck_assert_msg(samef < n * 0.65, "step 2^32 + 5 repeats step 5's mask: %zu of %zu", samef, n);
	free(yf);
	/* p = 0 copies */
	float *y0 = drop_run(&f, 0, x, dy, N, C, H, W, 1, 0.0, seed, 7, step);
	ck_assert(!memcmp(y0, x, n * 4));
	free(y5), free(y6), free(y8), free(y0);
	free(x), free(dy), free(dx0);
	fx_close(&f);
}
END_TEST

/* bf16 DROPOUT and DROPOUT_BWD (flat): the bytes of the mask above times
 * the widened x, rounded once to nearest even, on an odd element count
 * (the threads' spans end off a multiple of 16) with NaNs (payloads and
 * signs kept), infinities (a dropped one gives NaN), subnormals and
 * products that fall halfway between two bf16 values. */
START_TEST(test_dropout_bf16)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_DROPOUT);
	const int64_t n = 100003;
	const double p = 0.5; /* s = 2: x * s is exact, so ties come from p = 0.2 below */
	uint16_t *x = malloc((size_t)n * 2), *y = malloc((size_t)n * 2);
	for (int64_t i = 0; i < n; i++)
		x[i] = h_round(frand() * 4.0f, KILN_BF16);
	static const uint16_t special[] = { 0x7fc1, 0xff81, 0x7f81, 0x7f80, 0xff80, 0x0001,
					    0x8003, 0x007f, 0x3f81, 0x3fff, 0x7f7f, 0x0000 };
	for (int64_t i = 0; i < n; i += 997)
		x[i] = special[(i / 997) % 12];
	for (int k = 0; k < 4; k++) {
		const double pk = k < 2 ? p : 0.2; /* s = 1.25: products between bf16 values */
		const int64_t step = 3 + k, seed = 0x5eed0000000 + k;
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = k & 1 ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT;
		op.n_in = 2, op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_BF16, 1, n, 0);
		op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
		op.i[0] = seed, op.i[1] = 9, op.f[0] = pk;
		const int64_t ctr[KILN_DROP_CTR] = { step, 0, 1 };
		void *dX = dput(&f, x, (size_t)n * 2), *dY = dput(&f, NULL, (size_t)n * 2),
		     *dS = dput(&f, ctr, sizeof ctr);
		const void *in[2] = { dX, dS };
		void *out[1] = { dY };
		OK(run_op(&f, &op, in, out));
		dget(&f, y, dY, (size_t)n * 2);
		DFREE(&f, dX, dY, dS);
		const float s = (float)(1.0 / (1.0 - pk));
		for (int64_t i = 0; i < n; i++) {
			const float k1 = drop_ref((uint64_t)seed, 9, (uint64_t)step, (uint64_t)i, pk) ? s : 0.0f;
			const uint16_t want = h_round(h_wide(x[i], KILN_BF16) * k1, KILN_BF16);
			/* an infinity dropped is a NaN the arithmetic makes: its sign
			 * is the hardware's (x86: 0xffc0, NVIDIA: 0x7fff) */
			const int made_nan = (x[i] & 0x7fff) == 0x7f80 && (want & 0x7fff) > 0x7f80;
			if (made_nan && strcmp(g_name, "cpu")) {
				ck_assert_msg((y[i] & 0x7fff) > 0x7f80, "bf16 p %g y[%lld] = 0x%04x: not a NaN (x 0x%04x)",
					      pk, (long long)i, y[i], x[i]);
				continue;
			}
			ck_assert_msg(y[i] == want, "bf16 %s p %g y[%lld] = 0x%04x, want 0x%04x (x 0x%04x)",
				      k & 1 ? "DROPOUT_BWD" : "DROPOUT", pk, (long long)i, y[i], want, x[i]);
		}
		/* the NaNs' bits written out, not through h_round (the devices'
		 * own rounding, half.h): kept or dropped, a NaN stays a NaN, quiet
		 * (as the f32 multiply makes it; PyTorch gives 0x7fc0), its sign
		 * and payload's top kept: 0x7f81 (signalling) -> 0x7fc1 */
		static const uint16_t nan_in[] = { 0x7fc1, 0xff81, 0x7f81 },
				      nan_out[] = { 0x7fc1, 0xffc1, 0x7fc1 };
		for (int j = 0; j < 3; j++)
			for (int64_t i = 997 * j; i < n; i += 997 * 12)
				ck_assert_msg(x[i] == nan_in[j] && y[i] == nan_out[j],
					      "bf16 p %g x[%lld] = 0x%04x: y 0x%04x, want 0x%04x", pk, (long long)i,
					      x[i], y[i], nan_out[j]);
	}
	free(x), free(y);
	fx_close(&f);
}
END_TEST

/* The masks by the global batch's rows (ABI 2.20): a slice of the batch
 * drawn with its counter's row0 and rstride gets, bit for bit, the masks
 * of the whole batch's rows row0 + n * rstride: rows [32, 64) of 64 with
 * row0 32 (accumulation's second micro-step, a pipeline's micro-batch)
 * and rank r of 2's rows r, r + 2, ... with { r, 2 } (kiln_shard's
 * interleaving), forward and backward, both layouts, rows of 105
 * elements (the counters' 16-blocks straddle the rows) and of 1003 (the
 * vector paths, NHWC's 8 channels at a time, off a multiple of 16). */
static void drop_rows_case(struct fx *f, int N, int C, int H, int W, int nhwc, int bwd)
{
	const size_t R = (size_t)C * H * W, n = (size_t)N * R;
	const double p = 0.5;
	const int64_t seed = 0x5eed1234LL, whole_ctr[KILN_DROP_CTR] = { 6, 0, 1 };
	float *x = frandv(n), *part = malloc(n * sizeof(float));
	float *whole = drop_run_ctr(f, bwd, x, x, N, C, H, W, nhwc, p, seed, 4, whole_ctr);
	/* the second half, as a micro-batch of its own */
	const int64_t half_ctr[KILN_DROP_CTR] = { 6, N / 2, 1 };
	float *half = drop_run_ctr(f, bwd, x + n / 2, x + n / 2, N / 2, C, H, W, nhwc, p, seed, 4,
				   half_ctr);
	ck_assert_msg(!memcmp(half, whole + n / 2, n / 2 * sizeof(float)),
		      "rows [%d, %d) with row0 %d: not the whole batch's (%s, %s)", N / 2, N, N / 2,
		      nhwc ? "NHWC" : "NCHW", bwd ? "backward" : "forward");
	/* rank r of 2: rows r, r + 2, ... */
	for (int r = 0; r < 2; r++) {
		for (int k = 0; k < N / 2; k++)
			memcpy(part + k * R, x + (size_t)(2 * k + r) * R, R * sizeof(float));
		const int64_t rank_ctr[KILN_DROP_CTR] = { 6, r, 2 };
		float *got = drop_run_ctr(f, bwd, part, part, N / 2, C, H, W, nhwc, p, seed, 4, rank_ctr);
		for (int k = 0; k < N / 2; k++)
			ck_assert_msg(!memcmp(got + k * R, whole + (size_t)(2 * k + r) * R, R * sizeof(float)),
				      "rank %d of 2, row %d: not row %d of the whole batch (%s, %s)", r, k,
				      2 * k + r, nhwc ? "NHWC" : "NCHW", bwd ? "backward" : "forward");
		free(got);
	}
	/* and not the old rank-blind draw: the halves' masks differ */
	size_t same = 0;
	for (size_t i = 0; i < n / 2; i++)
		same += (whole[i] != 0) == (whole[n / 2 + i] != 0);
	ck_assert_msg(same < n / 2 * 0.65, "the halves' masks repeat: %zu of %zu", same, n / 2);
	free(x), free(part), free(whole), free(half);
}

/* bf16 [N, R] DROPOUT with the counter ctr: the output's bytes. */
static uint16_t *drop_bf16_ctr(struct fx *f, const uint16_t *x, int64_t N, int64_t R,
			       const int64_t ctr[KILN_DROP_CTR])
{
	const size_t nb = (size_t)(N * R) * 2;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
	op.in[0] = op.out[0] = td(KILN_BF16, 2, N, R);
	op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
	op.i[0] = 77, op.i[1] = 5, op.f[0] = 0.5;
	void *dX = dput(f, x, nb), *dY = dput(f, NULL, nb), *dS = dput(f, ctr, 8 * KILN_DROP_CTR);
	OK(run_op(f, &op, (const void *const[]){ dX, dS }, (void *const[]){ dY }));
	uint16_t *y = malloc(nb);
	dget(f, y, dY, nb);
	DFREE(f, dX, dY, dS);
	return y;
}

START_TEST(test_dropout_rows)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_DROPOUT);
	for (int nhwc = 0; nhwc < 2; nhwc++)
		for (int bwd = 0; bwd < 2; bwd++) {
			drop_rows_case(&f, 64, 3, 5, 7, nhwc, bwd);
			drop_rows_case(&f, 8, 1003, 1, 1, nhwc, bwd);
		}
	/* bf16 storage (its own loops): rank r of 2's rows are the whole's */
	const int64_t N = 16, R = 1003;
	uint16_t *x = malloc((size_t)(N * R) * 2), *part = malloc((size_t)(N * R) * 2);
	for (int64_t i = 0; i < N * R; i++)
		x[i] = h_round(frand() + 2.0f, KILN_BF16);
	uint16_t *whole = drop_bf16_ctr(&f, x, N, R, (const int64_t[KILN_DROP_CTR]){ 3, 0, 1 });
	for (int r = 0; r < 2; r++) {
		for (int64_t k = 0; k < N / 2; k++)
			memcpy(part + k * R, x + (2 * k + r) * R, (size_t)R * 2);
		uint16_t *got = drop_bf16_ctr(&f, part, N / 2, R, (const int64_t[KILN_DROP_CTR]){ 3, r, 2 });
		for (int64_t k = 0; k < N / 2; k++)
			ck_assert_msg(!memcmp(got + k * R, whole + (2 * k + r) * R, (size_t)R * 2),
				      "bf16 rank %d of 2, row %lld: not row %lld of the whole batch", r,
				      (long long)k, (long long)(2 * k + r));
		free(got);
	}
	free(x), free(part), free(whole);
	fx_close(&f);
}
END_TEST

/* The same dropout with 1 and 2 threads: identical bytes. */
START_TEST(test_dropout_threads)
{
	const int N = 3, C = 20, H = 33, W = 33;
	const size_t n = (size_t)N * C * H * W;
	float *x = frandv(n), *y[2][2];
	for (int t = 0; t < 2; t++) {
		struct fx f;
		memset(&f, 0, sizeof f);
		OK(kiln_registry_open(NULL, &f.reg));
		OK(kiln_config_new(&f.cfg));
		OK(kiln_config_override(f.cfg, t ? "run.threads=2" : "run.threads=1"));
		OK(kiln_config_validate(f.cfg, f.reg));
		OK(kiln_device_open(f.reg, f.cfg, g_name, 0, &f.dev));
		OK(kiln_device_stream_create(f.dev, &f.s));
		if (unsupported(&f, KILN_OP_DROPOUT)) {
			fx_close(&f);
			free(x);
			return;
		}
		for (int nhwc = 0; nhwc < 2; nhwc++)
			y[t][nhwc] = drop_run(&f, 0, x, x, N, C, H, W, nhwc, 0.5, 42, 3, 11);
		fx_close(&f);
	}
	ck_assert(!memcmp(y[0][0], y[1][0], n * 4));
	ck_assert(!memcmp(y[0][1], y[1][1], n * 4));
	ck_assert(!memcmp(y[0][0], y[0][1], n * 4)); /* logical NCHW == NHWC */
	free(x), free(y[0][0]), free(y[0][1]), free(y[1][0]), free(y[1][1]);
}
END_TEST

DEVICE_SUITE(elementwise, DFX_CASE(fill), DFX_CASE(reduce_scale_add), DFX_CASE(small_ops),
	     DFX_CASE(act), DFX_CASE(act_extremes), DFX_CASE(dropout),
	     DFX_CASE(dropout_bf16), DFX_CASE(dropout_rows), DFX_ONCE(dropout_threads, 60));
