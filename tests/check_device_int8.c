/* tests/check_device_int8.c - device conformance: the INT8 inference ops
 * KILN_OP_QCONV and KILN_OP_QLINEAR (kiln/ops.h) against a reference loop
 * that quantizes the input and the weights by the contract, accumulates
 * the products exactly in int32 and then scales: sx * sw[o] * acc + b,
 * and the fused ReLU.  Both layouts, u8 and s8 inputs, groups, stride and
 * padding; inputs beyond the range saturate.
 *
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "internal.h" /* kiln_device_takes_frozen, kiln_device_weights_changed */
#include "check_main.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* round half to even, then saturate to [lo, hi] */
static int32_t qround(double v, int32_t lo, int32_t hi)
{
	double r = nearbyint(v);
	return r < lo ? lo : r > hi ? hi : (int32_t)r;
}

/* Per-row symmetric 7-bit weights wq[O][per] and their scales sw[O]. */
static void ref_weights(const float *w, int O, int per, int32_t *wq, float *sw)
{
	for (int o = 0; o < O; o++) {
		float amax = 0;
		for (int k = 0; k < per; k++)
			amax = fmaxf(amax, fabsf(w[o * per + k]));
		sw[o] = amax > 0 ? amax / 63.0f : 1.0f;
		for (int k = 0; k < per; k++)
			wq[o * per + k] = qround(w[o * per + k] / sw[o], -63, 63);
	}
}

/* x scaled to go past the quantized range at both ends (saturation), and
 * never negative for a u8 input. */
static float *input(size_t n, int is_u, float sx)
{
	float *x = frandv(n);
	for (size_t i = 0; i < n; i++)
		x[i] = (is_u ? fabsf(x[i]) : x[i]) * sx * 140.0f;
	return x;
}

static void qconv_case(struct fx *f, const struct conv_g *q, int nhwc, int is_u, int relu)
{
	const int N = q->N, C = q->C, O = q->O, H = q->H, W = q->W, KH = q->KH, KW = q->KW;
	const int Cg = C / q->g, Og = O / q->g, per = Cg * KH * KW;
	const int OH = (H + 2 * q->ph - (KH - 1) - 1) / q->sh + 1;
	const int OW = (W + 2 * q->pw - (KW - 1) - 1) / q->sw + 1;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * O * OH * OW;
	const float sx = 0.02f;
	float *x = input(nx, is_u, sx), *w = frandv((size_t)O * per), *b = frandv((size_t)O);
	float sw[64];
	int32_t *wq = malloc(sizeof(int32_t) * (size_t)O * per);
	double *want = calloc(ny, sizeof(double)), *mag = calloc(ny, sizeof(double));
	ref_weights(w, O, per, wq, sw);
	for (int n = 0; n < N; n++)
		for (int o = 0; o < O; o++)
			for (int p = 0; p < OH; p++)
				for (int r = 0; r < OW; r++) {
					int32_t acc = 0; /* exact */
					const int g = o / Og;
					for (int c = 0; c < Cg; c++)
						for (int i = 0; i < KH; i++)
							for (int j = 0; j < KW; j++) {
								int h = p * q->sh - q->ph + i, v = r * q->sw - q->pw + j;
								if (h < 0 || h >= H || v < 0 || v >= W)
									continue;
								float xv = x[(((size_t)n * C + g * Cg + c) * H + h) * W + v];
								acc += qround(xv * (float)(1.0 / sx), is_u ? 0 : -128, is_u ? 255 : 127) *
								       wq[(o * Cg + c) * KH * KW + i * KW + j];
							}
					double y = (double)sx * sw[o] * acc + (q->bias ? b[o] : 0);
					const size_t at = (((size_t)n * O + o) * OH + p) * OW + r;
					want[at] = relu && y < 0 ? 0 : y;
					/* the terms' size: the sum may cancel */
					mag[at] = fabs((double)sx * sw[o] * acc) + (q->bias ? fabs(b[o]) : 0);
				}
	struct kiln_op op;
	conv_op(&op, KILN_OP_CONV, q, OH, OW, nhwc);
	op.type = KILN_OP_QCONV;
	op.f[0] = sx, op.i[8] = is_u;
	if (relu)
		op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	float *keep;
	void *dx = dput4(f, x, N, C, H, W, nhwc, &keep), *dw = dput(f, w, sizeof(float) * O * per);
	void *db = dput(f, b, sizeof(float) * O), *dy = dput(f, NULL, sizeof(float) * ny);
	OK(run_op(f, &op, (const void *[]){ dx, dw, q->bias ? db : NULL }, (void *[]){ dy }));
	float *got = dget4(f, dy, N, O, OH, OW, nhwc);
	for (size_t i = 0; i < ny; i++)
		NEAR(got[i], want[i], mag[i], 1e-5, "QCONV %s %s%s: y[%zu] = %g, want %g",
		     nhwc ? "nhwc" : "nchw", is_u ? "u8" : "s8", relu ? " relu" : "", i, got[i], want[i]);
	DFREE(f, dx, dw, db, dy);
	free(keep), free(got), free(x), free(w), free(b), free(wq), free(want), free(mag);
}

START_TEST(test_qconv)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QCONV);
	const struct conv_g plain = { 2, 3, 8, 9, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const struct conv_g grouped = { 2, 4, 6, 8, 8, 3, 3, 2, 2, 0, 1, 1, 1, 2, 0 };
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		qconv_case(&f, &plain, nhwc, 1, 0);
		qconv_case(&f, &plain, nhwc, 0, 1);
		qconv_case(&f, &grouped, nhwc, 1, 1);
		qconv_case(&f, &grouped, nhwc, 0, 0);
	}
	fx_close(&f);
}
END_TEST

static void qlinear_case(struct fx *f, int M, int N, int K, int is_u, int relu, int bias)
{
	const float sx = 0.05f;
	float *x = input((size_t)M * K, is_u, sx), *w = frandv((size_t)N * K), *b = frandv((size_t)N);
	float sw[64];
	int32_t *wq = malloc(sizeof(int32_t) * (size_t)N * K);
	double *want = calloc((size_t)M * N, sizeof(double)), *mag = calloc((size_t)M * N, sizeof(double));
	ref_weights(w, N, K, wq, sw);
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			int32_t acc = 0;
			for (int k = 0; k < K; k++)
				acc += qround(x[m * K + k] * (float)(1.0 / sx), is_u ? 0 : -128, is_u ? 255 : 127) *
				       wq[n * K + k];
			double y = (double)sx * sw[n] * acc + (bias ? b[n] : 0);
			want[m * N + n] = relu && y < 0 ? 0 : y;
			mag[m * N + n] = fabs((double)sx * sw[n] * acc) + (bias ? fabs(b[n]) : 0);
		}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = bias ? 3 : 2, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, M, K), op.in[1] = td(KILN_F32, 2, N, K);
	op.in[2] = td(KILN_F32, 1, N, 0), op.out[0] = td(KILN_F32, 2, M, N);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = sx, op.i[8] = is_u;
	if (relu)
		op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	void *dx = dput(f, x, sizeof(float) * M * K), *dw = dput(f, w, sizeof(float) * N * K);
	void *db = dput(f, b, sizeof(float) * N), *dy = dput(f, NULL, sizeof(float) * M * N);
	OK(run_op(f, &op, (const void *[]){ dx, dw, bias ? db : NULL }, (void *[]){ dy }));
	float *got = malloc(sizeof(float) * M * N);
	dget(f, got, dy, sizeof(float) * M * N);
	for (int i = 0; i < M * N; i++)
		NEAR(got[i], want[i], mag[i], 1e-5, "QLINEAR %dx%dx%d %s%s: y[%d] = %g, want %g",
		     M, N, K, is_u ? "u8" : "s8", relu ? " relu" : "", i, got[i], want[i]);
	DFREE(f, dx, dw, db, dy);
	free(got), free(x), free(w), free(b), free(wq), free(want), free(mag);
}

START_TEST(test_qlinear)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	qlinear_case(&f, 5, 7, 33, 1, 0, 1);
	qlinear_case(&f, 16, 10, 64, 0, 1, 1);
	qlinear_case(&f, 3, 12, 9, 0, 0, 0);
	fx_close(&f);
}
END_TEST

/* An all-zero filter row quantizes with scale 1 and gives b exactly. */
START_TEST(test_qlinear_zero_row)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	float x[4] = { 1, -2, 3, 0.5f }, w[8] = { 0, 0, 0, 0, 0.5f, -1.26f, 0.2f, 0 }, b[2] = { 0.25f, 0 };
	float got[2];
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = 3, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, 1, 4), op.in[1] = td(KILN_F32, 2, 2, 4);
	op.in[2] = td(KILN_F32, 1, 2, 0), op.out[0] = td(KILN_F32, 2, 1, 2);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = 1, op.i[3] = 2, op.i[4] = 4;
	op.f[0] = 0.5; /* xq = 2, -4, 6, 1; row 1: sw 0.02, wq 25, -63, 10, 0 */
	void *dx = dput(&f, x, sizeof x), *dw = dput(&f, w, sizeof w), *db = dput(&f, b, sizeof b);
	void *dy = dput(&f, NULL, sizeof got);
	OK(run_op(&f, &op, (const void *[]){ dx, dw, db }, (void *[]){ dy }));
	dget(&f, got, dy, sizeof got);
	ck_assert_float_eq(got[0], 0.25f);
	/* acc = 50 + 252 + 60 = 362; 0.5 * 0.02 * 362 = 3.62 */
	ck_assert_float_eq_tol(got[1], 3.62f, 1e-5f);
	DFREE(&f, dx, dw, db, dy);
	fx_close(&f);
}
END_TEST

/* op's plan and its workspace (*ws NULL when it needs none). */
static void *plan_ws(struct fx *f, const struct kiln_op *op, void **ws, size_t *wsb)
{
	void *plan = NULL;
	OK(kiln_device_prepare(f->dev, op, &plan, wsb));
	if (*wsb)
		OK(kiln_device_alloc(f->dev, *wsb, ws));
	return plan;
}

/* Copy `bytes` of h to the device's d (none when d is NULL), run the plan
 * and return its one f32 output dy. */
static float run_then(struct fx *f, void *plan, const struct kiln_op_args *a, void *dy, void *d,
		      const void *h, size_t bytes)
{
	float y;
	if (d)
		OK(kiln_device_copy_async(f->dev, d, h, bytes, KILN_COPY_H2D, f->s));
	OK(kiln_device_run(f->dev, plan, a, f->s));
	dget(f, &y, dy, sizeof y);
	return y;
}

/* One plan run twice with the weights changed in place between the runs
 * (the CPU plan keeps the quantized weights): the second run quantizes
 * the new ones.  x = (1, -2, 3, 0.5), sx = 0.5: xq = (2, -4, 6, 1). */
START_TEST(test_qlinear_weights_change)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	float x[4] = { 1, -2, 3, 0.5f }, w1[4] = { 0.5f, -1.26f, 0.2f, 0 }, w2[4] = { 0, 0, 0, 0.63f };
	float got[2];
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, 1, 4), op.in[1] = td(KILN_F32, 2, 1, 4);
	op.out[0] = td(KILN_F32, 2, 1, 1);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = 1, op.i[3] = 1, op.i[4] = 4;
	op.f[0] = 0.5;
	void *dx = dput(&f, x, sizeof x), *dw = dput(&f, w1, sizeof w1), *dy = dput(&f, NULL, sizeof(float));
	void *ws = NULL;
	size_t wsb = 0;
	void *plan = plan_ws(&f, &op, &ws, &wsb);
	const struct kiln_op_args a = { .in = { dx, dw }, .out = { dy }, .workspace = ws,
					.workspace_bytes = wsb };
	got[0] = run_then(&f, plan, &a, dy, NULL, NULL, 0);
	got[1] = run_then(&f, plan, &a, dy, dw, w2, sizeof w2);
	/* w1: sw 0.02, wq (25, -63, 10, 0), acc 362: 0.5 * 0.02 * 362 = 3.62;
	 * w2: sw 0.01, wq (0, 0, 0, 63), acc 63: 0.5 * 0.01 * 63 = 0.315 */
	ck_assert_float_eq_tol(got[0], 3.62f, 1e-5f);
	ck_assert_float_eq_tol(got[1], 0.315f, 1e-6f);
	kiln_device_plan_free(f.dev, plan);
	DFREE(&f, dx, dw, dy, ws);
	fx_close(&f);
}
END_TEST

/* Frozen weights (KILN_OPF_FROZEN, ABI 2.15) on QLINEAR: the plan may
 * keep its quantized weights with nothing compared, so weights written
 * without telling the device leave a keeping device's output as it was
 * (the CPU's: no compare per run), and after KILN_PROC_WEIGHTS_CHANGED
 * the run quantizes the new ones.  A device without the procedure gets
 * no such op from the core: skipped.  The numbers as above. */
START_TEST(test_qlinear_frozen)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	if (!kiln_device_takes_frozen(f.dev)) {
		fx_close(&f);
		return;
	}
	float x[4] = { 1, -2, 3, 0.5f }, w1[4] = { 0.5f, -1.26f, 0.2f, 0 }, w2[4] = { 0, 0, 0, 0.63f };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, 1, 4), op.in[1] = td(KILN_F32, 2, 1, 4);
	op.out[0] = td(KILN_F32, 2, 1, 1);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = 1, op.i[3] = 1, op.i[4] = 4;
	op.f[0] = 0.5;
	op.flags = KILN_OPF_FROZEN;
	void *dx = dput(&f, x, sizeof x), *dw = dput(&f, w1, sizeof w1), *dy = dput(&f, NULL, sizeof(float));
	void *ws = NULL;
	size_t wsb = 0;
	void *plan = plan_ws(&f, &op, &ws, &wsb);
	const struct kiln_op_args a = { .in = { dx, dw }, .out = { dy }, .workspace = ws,
					.workspace_bytes = wsb };
	ck_assert_float_eq_tol(run_then(&f, plan, &a, dy, NULL, NULL, 0), 3.62f, 1e-5f);
	/* w2 written, the device not told: the kept w1 (a device that
	 * compares would give 0.315) */
	ck_assert_float_eq_tol(run_then(&f, plan, &a, dy, dw, w2, sizeof w2), 3.62f, 1e-5f);
	OK(kiln_device_stream_sync(f.dev, f.s));
	kiln_device_weights_changed(f.dev);
	ck_assert_float_eq_tol(run_then(&f, plan, &a, dy, NULL, NULL, 0), 0.315f, 1e-6f);
	/* and kept again: w1 written untold, still w2's */
	ck_assert_float_eq_tol(run_then(&f, plan, &a, dy, dw, w1, sizeof w1), 0.315f, 1e-6f);
	/* a plan of 2 rows made now takes the quantized weights the first
	 * made of dw (shared by a model's plans of every row count:
	 * plugins/cpu/qweights.c), w2's; one that quantized its own would
	 * give w1's 3.62.  Told, both take w1. */
	float x2[8] = { 1, -2, 3, 0.5f, 1, -2, 3, 0.5f }, y2[2];
	struct kiln_op op2 = op;
	op2.in[0] = td(KILN_F32, 2, 2, 4), op2.out[0] = td(KILN_F32, 2, 2, 1);
	op2.i[2] = 2;
	void *dx2 = dput(&f, x2, sizeof x2), *dy2 = dput(&f, NULL, sizeof y2), *ws2 = NULL;
	size_t wsb2 = 0;
	void *plan2 = plan_ws(&f, &op2, &ws2, &wsb2);
	const struct kiln_op_args a2 = { .in = { dx2, dw }, .out = { dy2 }, .workspace = ws2,
					 .workspace_bytes = wsb2 };
	ck_assert_float_eq_tol(run_then(&f, plan2, &a2, dy2, NULL, NULL, 0), 0.315f, 1e-6f);
	OK(kiln_device_stream_sync(f.dev, f.s));
	kiln_device_weights_changed(f.dev);
	ck_assert_float_eq_tol(run_then(&f, plan2, &a2, dy2, NULL, NULL, 0), 3.62f, 1e-5f);
	dget(&f, y2, dy2, sizeof y2);
	ck_assert_float_eq(y2[1], y2[0]);
	ck_assert_float_eq_tol(run_then(&f, plan, &a, dy, NULL, NULL, 0), 3.62f, 1e-5f);
	kiln_device_plan_free(f.dev, plan2);
	DFREE(&f, dx2, dy2, ws2);
	kiln_device_plan_free(f.dev, plan);
	/* an f32 GEMM takes the flag since session 46 (a linear layer's
	 * forward; its runs: check_device_gemm's frozen cases) ... */
	void *gp = NULL, *bad = NULL;
	op.type = KILN_OP_GEMM;
	op.f[0] = 1;
	OK(kiln_device_prepare(f.dev, &op, &gp, NULL));
	ck_assert_ptr_nonnull(gp);
	kiln_device_plan_free(f.dev, gp);
	/* ... but not with KILN_OPF_ACCUMULATE, nor in bf16 */
	static const char gemm_msg[] =
		"KILN_OPF_FROZEN is for CONV (without KILN_OPF_KEEP), QCONV, QLINEAR and an f32 GEMM (without KILN_OPF_ACCUMULATE)";
	op.flags = KILN_OPF_FROZEN | KILN_OPF_ACCUMULATE;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &bad, NULL), KILN_EINVAL);
	ck_assert_ptr_null(bad);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), gemm_msg));
	struct kiln_op lp = op;
	lp.flags = KILN_OPF_FROZEN;
	lp.in[0].dtype = lp.in[1].dtype = KILN_BF16;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &lp, &bad, NULL), KILN_EINVAL);
	ck_assert_ptr_null(bad);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), gemm_msg));
	/* nor an op outside the list (a ReLU) */
	struct kiln_op r;
	memset(&r, 0, sizeof r);
	r.type = KILN_OP_RELU;
	r.n_in = 1, r.n_out = 1;
	r.in[0] = td(KILN_F32, 2, 1, 4), r.out[0] = td(KILN_F32, 2, 1, 4);
	r.flags = KILN_OPF_FROZEN;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &r, &bad, NULL), KILN_EINVAL);
	ck_assert_ptr_null(bad);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), gemm_msg));
	DFREE(&f, dx, dw, dy, ws);
	fx_close(&f);
}
END_TEST

/* The same with a row longer than one of the CPU's comparison chunks
 * (64K floats, compared by the team): one weight past the first chunk
 * changes sign and the run must see it.  K = 131072, x = e_{K-1}, sx =
 * 1/64 (xq 64); w[0] = 0.63 keeps sw = 0.01 (wq 63), so y = +-0.63. */
START_TEST(test_qlinear_weights_change_far)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	const int64_t K = 131072;
	float *x = calloc((size_t)K, sizeof *x), *w = calloc((size_t)K, sizeof *w);
	ck_assert(x && w);
	x[K - 1] = 1, w[0] = 0.63f, w[K - 1] = 0.63f;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, 1, K), op.in[1] = td(KILN_F32, 2, 1, K);
	op.out[0] = td(KILN_F32, 2, 1, 1);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = 1, op.i[3] = 1, op.i[4] = K;
	op.f[0] = 1.0 / 64;
	void *dx = dput(&f, x, sizeof(float) * (size_t)K), *dw = dput(&f, w, sizeof(float) * (size_t)K);
	void *dy = dput(&f, NULL, sizeof(float)), *ws = NULL;
	size_t wsb = 0;
	void *plan = plan_ws(&f, &op, &ws, &wsb);
	const struct kiln_op_args a = { .in = { dx, dw }, .out = { dy }, .workspace = ws,
					.workspace_bytes = wsb };
	const float y1 = run_then(&f, plan, &a, dy, NULL, NULL, 0);
	w[K - 1] = -0.63f;
	const float y2 = run_then(&f, plan, &a, dy, dw, w, sizeof(float) * (size_t)K);
	ck_assert_float_eq_tol(y1, 0.63f, 1e-5f);
	ck_assert_float_eq_tol(y2, -0.63f, 1e-5f);
	kiln_device_plan_free(f.dev, plan);
	DFREE(&f, dx, dw, dy, ws);
	free(x), free(w);
	fx_close(&f);
}
END_TEST

/* The same for QCONV, whose CPU plan also keeps the reordered weights
 * and a primitive made with the output scales as constants: new weights
 * (new scales) and then a new bias alone, each run in place, in both
 * layouts.  A 1x1 convolution of one pixel, x = (1, -2), sx = 0.5 (s8):
 * xq = (2, -4). */
START_TEST(test_qconv_params_change)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QCONV);
	const struct conv_g q = { 1, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1 };
	float x[2] = { 1, -2 }, w1[2] = { 0.5f, -1.26f }, w2[2] = { 0.63f, 0 };
	float b1 = 0.25f, b2 = -1.0f, got[3];
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		struct kiln_op op;
		conv_op(&op, KILN_OP_CONV, &q, 1, 1, nhwc);
		op.type = KILN_OP_QCONV;
		op.f[0] = 0.5;
		void *dx = dput(&f, x, sizeof x), *dw = dput(&f, w1, sizeof w1);
		void *db = dput(&f, &b1, sizeof b1), *dy = dput(&f, NULL, sizeof(float));
		void *ws = NULL;
		size_t wsb = 0;
		void *plan = plan_ws(&f, &op, &ws, &wsb);
		const struct kiln_op_args a = { .in = { dx, dw, db }, .out = { dy }, .workspace = ws,
						.workspace_bytes = wsb };
		got[0] = run_then(&f, plan, &a, dy, NULL, NULL, 0);
		got[1] = run_then(&f, plan, &a, dy, dw, w2, sizeof w2);
		got[2] = run_then(&f, plan, &a, dy, db, &b2, sizeof b2);
		/* w1: sw 0.02, wq (25, -63), acc 302: 0.5 * 0.02 * 302 + 0.25 = 3.27;
		 * w2: sw 0.01, wq (63, 0), acc 126: 0.63 + 0.25 = 0.88; b2: -0.37 */
		ck_assert_float_eq_tol(got[0], 3.27f, 1e-5f);
		ck_assert_float_eq_tol(got[1], 0.88f, 1e-6f);
		ck_assert_float_eq_tol(got[2], -0.37f, 1e-6f);
		kiln_device_plan_free(f.dev, plan);
		DFREE(&f, dx, dw, db, dy, ws);
	}
	fx_close(&f);
}
END_TEST

/* ---- chained INT8 (ABI 2.8): u8 activations between the INT8 ops ------- */

/* The contract's QCONV of an already quantized input xq (layout order):
 * y[] and the size of its terms mag[] (layout order), no activation. */
static void ref_qconv_q(const int32_t *xq, const struct conv_g *q, int OH, int OW, int nhwc,
			const float *w, float sx, const float *b, double *y, double *mag)
{
	const int Cg = q->C / q->g, Og = q->O / q->g, per = Cg * q->KH * q->KW;
	float sw[64];
	int32_t *wq = malloc(sizeof(int32_t) * (size_t)q->O * per);
	ref_weights(w, q->O, per, wq, sw);
	for (int n = 0; n < q->N; n++)
		for (int o = 0; o < q->O; o++)
			for (int p = 0; p < OH; p++)
				for (int r = 0; r < OW; r++) {
					int32_t acc = 0;
					for (int c = 0; c < Cg; c++)
						for (int i = 0; i < q->KH; i++)
							for (int j = 0; j < q->KW; j++) {
								int h = p * q->sh - q->ph + i, v = r * q->sw - q->pw + j;
								if (h >= 0 && h < q->H && v >= 0 && v < q->W)
									acc += xq[at4(nhwc, q->C, q->H, q->W, n, o / Og * Cg + c, h, v)] *
									       wq[(o * Cg + c) * q->KH * q->KW + i * q->KW + j];
							}
					const size_t k = at4(nhwc, q->O, OH, OW, n, o, p, r);
					y[k] = (double)sx * sw[o] * acc + (q->bias ? b[o] : 0);
					mag[k] = fabs((double)sx * sw[o] * acc) + (q->bias ? fabs(b[o]) : 0);
				}
	free(wq);
}

/* A u8 output against the contract: sat_u8(round_half_even(relu(y) / so)),
 * exactly, except where y / so is within 1e-3 of a rounding tie (the
 * device's f32 scales may round it either way): there within 1. */
static void check_u8(const uint8_t *got, const double *y, size_t n, double so, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		const double v = (y[i] > 0 ? y[i] : 0) / so;
		const int32_t want = qround(v, 0, 255);
		const int tie = fabs(v - floor(v) - 0.5) < 1e-3;
		ck_assert_msg(got[i] == want || (tie && abs((int)got[i] - want) <= 1),
			      "%s: yq[%zu] = %d, want %d (y / so = %.6f)", what, i, got[i], want, v);
	}
}

/* QCONV f32 -> u8 (ReLU, the output's scale so), max POOL 2x2 on the u8,
 * QCONV u8 -> f32: each step against the contract, the pooling exactly,
 * in both layouts. */
START_TEST(test_qchain)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QCONV);
	const struct conv_g c1 = { 2, 8, 8, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const struct conv_g c2 = { 2, 8, 4, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const float sx = 0.02f, so = 0.03f;
	const size_t nx = 2 * 8 * 36, ny = 2 * 8 * 36, np = 2 * 8 * 9, nz = 2 * 4 * 9;
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		float *x = input(nx, 0, sx), *w1 = frandv(8 * 72), *b1 = frandv(8);
		float *w2 = frandv(4 * 72), *b2 = frandv(4);
		int32_t *xq = malloc(sizeof(int32_t) * nx), *pq = malloc(sizeof(int32_t) * np);
		double *y = calloc(ny, sizeof(double)), *mag = calloc(ny, sizeof(double));
		double *z = calloc(nz, sizeof(double)), *zmag = calloc(nz, sizeof(double));
		uint8_t y8[2 * 8 * 36], p8[2 * 8 * 9];
		float zg[2 * 4 * 9];
		for (size_t i = 0; i < nx; i++) /* x is in the layout's order already */
			xq[i] = qround(x[i] * (float)(1.0 / sx), -128, 127);
		ref_qconv_q(xq, &c1, 6, 6, nhwc, w1, sx, b1, y, mag);

		struct kiln_op op;
		conv_op(&op, KILN_OP_CONV, &c1, 6, 6, nhwc);
		op.type = KILN_OP_QCONV;
		op.f[0] = sx, op.f[1] = so;
		op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		op.out[0].dtype = KILN_U8;
		if (refused(&f, &op, "chained INT8 (QCONV's u8 output)")) {
			free(x), free(w1), free(b1), free(w2), free(b2), free(xq), free(pq);
			free(y), free(mag), free(z), free(zmag);
			break;
		}
		void *dx = dput(&f, x, sizeof(float) * nx), *dw1 = dput(&f, w1, sizeof(float) * 8 * 72);
		void *db1 = dput(&f, b1, sizeof(float) * 8), *dy = dput(&f, NULL, ny);
		OK(run_op(&f, &op, (const void *[]){ dx, dw1, db1 }, (void *[]){ dy }));
		dget(&f, y8, dy, ny);
		check_u8(y8, y, ny, so, nhwc ? "QCONV f32 -> u8 nhwc" : "QCONV f32 -> u8 nchw");

		/* max pooling of the u8, exactly */
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_POOL, op.n_in = 1, op.n_out = 1;
		const int64_t xd[4] = { 2, 8, 6, 6 }, pd[4] = { 2, 8, 3, 3 };
		kiln_tensor_desc_init(&op.in[0], KILN_U8, 4, xd);
		kiln_tensor_desc_init(&op.out[0], KILN_U8, 4, pd);
		op.in[0].layout = op.out[0].layout = nhwc ? KILN_NHWC : KILN_NCHW;
		op.i[0] = KILN_POOL_MAX, op.i[1] = op.i[2] = op.i[3] = op.i[4] = 2;
		void *dp = dput(&f, NULL, np);
		OK(run_op(&f, &op, (const void *[]){ dy }, (void *[]){ dp }));
		dget(&f, p8, dp, np);
		for (int n = 0; n < 2; n++)
			for (int c = 0; c < 8; c++)
				for (int h = 0; h < 3; h++)
					for (int v = 0; v < 3; v++) {
						int m = 0;
						for (int i = 0; i < 4; i++)
{
							const int e = y8[at4(nhwc, 8, 6, 6, n, c, 2 * h + i / 2, 2 * v + i % 2)];
							m = e > m ? e : m;
						}
						const size_t k = at4(nhwc, 8, 3, 3, n, c, h, v);
						ck_assert_msg(p8[k] == m, "u8 max pool %s [%d,%d,%d,%d] = %d, want %d",
							      nhwc ? "nhwc" : "nchw", n, c, h, v, p8[k], m);
						pq[k] = m;
					}

		/* the next QCONV reads the u8 as its quantized input (scale so) */
		ref_qconv_q(pq, &c2, 3, 3, nhwc, w2, so, b2, z, zmag);
		conv_op(&op, KILN_OP_CONV, &c2, 3, 3, nhwc);
		op.type = KILN_OP_QCONV;
		op.f[0] = so, op.i[8] = 1;
		op.in[0].dtype = KILN_U8;
		void *dw2 = dput(&f, w2, sizeof(float) * 4 * 72), *db2 = dput(&f, b2, sizeof(float) * 4);
		void *dz = dput(&f, NULL, sizeof(float) * nz);
		OK(run_op(&f, &op, (const void *[]){ dp, dw2, db2 }, (void *[]){ dz }));
		dget(&f, zg, dz, sizeof(float) * nz);
		for (size_t i = 0; i < nz; i++)
			NEAR(zg[i], z[i], zmag[i], 1e-5, "QCONV u8 -> f32 %s: z[%zu] = %g, want %g",
			     nhwc ? "nhwc" : "nchw", i, zg[i], z[i]);
		DFREE(&f, dx, dw1, db1, dy, dp, dw2, db2, dz);
		free(x), free(w1), free(b1), free(w2), free(b2), free(xq), free(pq);
		free(y), free(mag), free(z), free(zmag);
	}
	fx_close(&f);
}
END_TEST

/* QLINEAR u8 -> u8 with the ReLU and a bias, and a u8 max pool asked to
 * train (two outputs) or to average: refused. */
START_TEST(test_qlinear_chain)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QLINEAR);
	enum { M = 5, K = 40, N = 6 };
	const float sx = 0.04f, so = 0.1f;
	uint8_t x[M * K], got[M * N];
	float *w = frandv(N * K), *b = frandv(N), sw[N];
	int32_t wq[N * K];
	double y[M * N];
	for (int i = 0; i < M * K; i++)
		x[i] = (uint8_t)(frand() * 127.5f + 127.5f);
	ref_weights(w, N, K, wq, sw);
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			int32_t acc = 0;
			for (int k = 0; k < K; k++)
				acc += x[m * K + k] * wq[n * K + k];
			y[m * N + n] = (double)sx * sw[n] * acc + b[n];
		}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_QLINEAR;
	op.n_in = 3, op.n_out = 1;
	op.in[0] = td(KILN_U8, 2, M, K), op.in[1] = td(KILN_F32, 2, N, K);
	op.in[2] = td(KILN_F32, 1, N, 0), op.out[0] = td(KILN_U8, 2, M, N);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = sx, op.f[1] = so, op.i[8] = 1;
	op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	if (refused(&f, &op, "chained INT8 (QLINEAR's u8 input and output)")) {
		free(w), free(b);
		fx_close(&f);
		return;
	}
	void *dx = dput(&f, x, sizeof x), *dw = dput(&f, w, sizeof(float) * N * K);
	void *db = dput(&f, b, sizeof(float) * N), *dy = dput(&f, NULL, sizeof got);
	OK(run_op(&f, &op, (const void *[]){ dx, dw, db }, (void *[]){ dy }));
	dget(&f, got, dy, sizeof got);
	check_u8(got, y, M * N, so, "QLINEAR u8 -> u8");
	/* a u8 input must say so (i[8] = 1) */
	op.i[8] = 0;
	void *plan = NULL;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	/* u8 pooling: max, in inference only */
	const int64_t xd[4] = { 1, 4, 4, 4 }, pd[4] = { 1, 4, 2, 2 };
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_POOL, op.n_in = 1, op.n_out = 2;
	kiln_tensor_desc_init(&op.in[0], KILN_U8, 4, xd);
	kiln_tensor_desc_init(&op.out[0], KILN_U8, 4, pd);
	op.i[0] = KILN_POOL_MAX, op.i[1] = op.i[2] = op.i[3] = op.i[4] = 2;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.n_out = 1, op.i[0] = KILN_POOL_AVG;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	DFREE(&f, dx, dw, db, dy);
	free(w), free(b);
	fx_close(&f);
}
END_TEST

/* ADD's u8 output (ABI 2.10): the sum of two f32 inputs, its ReLU and the
 * quantization by 1 / so in one pass, byte for byte the contract's f32
 * steps (negative sums, saturation, ties to even), and the INT8 conv that
 * reads it gives bit for bit what it gives on the f32 ReLU output it
 * quantizes itself (the f32-between path: ADD, RELU, QCONV); refused with
 * accumulate, without a scale, on MUL. */
START_TEST(test_add_u8)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_QCONV);
	const struct conv_g c = { 2, 8, 4, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const size_t n = 2 * 8 * 25;
	const float so = 0.25f; /* 1 / so = 4 exactly: (2k + 1) / 8 ties */
	float *x0 = frandv(n), *x1 = frandv(n), *w = frandv(4 * 72), *b = frandv(4);
	uint8_t got[2 * 8 * 25];
	for (size_t i = 0; i < n; i++) {
		x0[i] *= 80.0f; /* sums past 255 * so and below 0 */
		if (i % 7 == 0) /* exact ties: x1 = 0, x0 * 4 = k + 1/2 */
			x0[i] = (float)(2 * (int)(i % 50) + 1) / 8.0f, x1[i] = 0.0f;
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ADD, op.n_in = 2, op.n_out = 1;
	const int64_t d[4] = { 2, 5, 5, 8 };
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 4, d);
	op.in[1] = op.in[0];
	op.out[0] = op.in[0];
	op.out[0].dtype = KILN_U8;
	op.f[0] = so;
	void *plan = NULL;
	if (kiln_device_prepare(f.dev, &op, &plan, NULL) == KILN_ENOTSUP) {
		ck_assert_msg(strcmp(g_name, "cpu"), "cpu must have the u8 ADD");
		printf("device '%s': skipping ADD with a u8 output\n", g_name);
		free(x0), free(x1), free(w), free(b);
		fx_close(&f);
		return;
	}
	kiln_device_plan_free(f.dev, plan);
	plan = NULL;
	void *d0 = dput(&f, x0, sizeof(float) * n), *d1 = dput(&f, x1, sizeof(float) * n);
	void *dq = dput(&f, NULL, n), *ds = dput(&f, NULL, sizeof(float) * n);
	OK(run_op(&f, &op, (const void *[]){ d0, d1 }, (void *[]){ dq }));
	dget(&f, got, dq, n);
	int ties = 0, sat = 0, zero = 0;
	for (size_t i = 0; i < n; i++) {
		const float v = (x0[i] + x1[i]) * (float)(1.0 / so);
		const int32_t want = qround(v, 0, 255);
		ties += v == floorf(v) + 0.5f, sat += want == 255, zero += v < 0;
		ck_assert_msg(got[i] == want, "ADD -> u8: y[%zu] = %d, want %d ((x0 + x1) / so = %.6f)",
			      i, got[i], want, v);
	}
	ck_assert_msg(ties > 10 && sat > 10 && zero > 10, "the cases: %d ties, %d saturated, %d negative",
		      ties, sat, zero);

	/* the f32-between path: ADD, RELU, then QCONV quantizes (u8, scale so) */
	op.out[0].dtype = KILN_F32;
	OK(run_op(&f, &op, (const void *[]){ d0, d1 }, (void *[]){ ds }));
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_RELU, op.n_in = op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 4, d);
	op.out[0] = op.in[0];
	OK(run_op(&f, &op, (const void *[]){ ds }, (void *[]){ ds }));
	float za[2 * 4 * 25], zb[2 * 4 * 25];
	void *dw = dput(&f, w, sizeof(float) * 4 * 72), *db = dput(&f, b, sizeof(float) * 4);
	void *dza = dput(&f, NULL, sizeof za), *dzb = dput(&f, NULL, sizeof zb);
	conv_op(&op, KILN_OP_CONV, &c, 5, 5, 1);
	op.type = KILN_OP_QCONV;
	op.f[0] = so, op.i[8] = 1;
	OK(run_op(&f, &op, (const void *[]){ ds, dw, db }, (void *[]){ dza }));
	op.in[0].dtype = KILN_U8;
	OK(run_op(&f, &op, (const void *[]){ dq, dw, db }, (void *[]){ dzb }));
	dget(&f, za, dza, sizeof za);
	dget(&f, zb, dzb, sizeof zb);
	ck_assert_msg(!memcmp(za, zb, sizeof za), "QCONV on ADD's u8 differs from QCONV on the f32 ReLU output");

	/* refused: accumulate, no scale, a u8 MUL */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ADD, op.n_in = 2, op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 4, d);
	op.in[1] = op.in[0];
	op.out[0] = op.in[0];
	op.out[0].dtype = KILN_U8;
	op.f[0] = so, op.flags = KILN_OPF_ACCUMULATE;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.flags = 0, op.f[0] = 0;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.f[0] = so, op.type = KILN_OP_MUL;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	DFREE(&f, d0, d1, dq, ds, dw, db, dza, dzb);
	free(x0), free(x1), free(w), free(b);
	fx_close(&f);
}
END_TEST

DEVICE_SUITE(int8, DFX_CASE(qconv), DFX_CASE(qlinear), DFX_CASE(qlinear_zero_row),
	     DFX_CASE(qlinear_weights_change), DFX_CASE(qlinear_frozen),
	     DFX_CASE(qlinear_weights_change_far), DFX_CASE(qconv_params_change), DFX_CASE(qchain),
	     DFX_CASE(qlinear_chain), DFX_CASE(add_u8));
