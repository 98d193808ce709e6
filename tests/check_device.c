/* tests/check_device.c - device conformance suite.
 *
 * Runs every device op against straightforward reference loops, plus the
 * stream/event contract.  The device is $KILN_TEST_DEVICE (default "cpu");
 * the suite exits 77 (skipped) when that device is not available here.
 * Each test runs twice (loop index = mode): mode 0 is the default config;
 * mode 1, on the cpu device, sets [plugin.cpu] async = 1 and [run]
 * threads = 3, so every stream has its own worker thread.
 *
 * Tests touch device memory only through copies, so they also hold for a
 * device whose memory the host cannot read.
 */
#include <check.h>        /* Suite, TCase, ck_assert_* */
#include <kiln/kiln.h>    /* registry, config, device wrappers */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_name = "cpu";

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s failed: %s", #x, kiln_last_error())

/* ---- fixture ---------------------------------------------------------- */

struct fx {
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *s;    /* the stream every helper uses */
	int async;  /* worker threads: cpu in mode 1 */
};

static kiln_status fx_try_open(struct fx *f, int mode)
{
	kiln_status st;
	memset(f, 0, sizeof *f);
	if ((st = kiln_registry_open(NULL, &f->reg)) || (st = kiln_config_new(&f->cfg)))
		return st;
	if (mode && !strcmp(g_name, "cpu")) {
		if ((st = kiln_config_override(f->cfg, "plugin.cpu.async=1")) ||
		    (st = kiln_config_override(f->cfg, "run.threads=3")))
			return st;
		f->async = 1;
	}
	if ((st = kiln_config_validate(f->cfg, f->reg)) ||
	    (st = kiln_device_open(f->reg, f->cfg, g_name, 0, &f->dev)))
		return st;
	return kiln_device_stream_create(f->dev, &f->s);
}

static void fx_open(struct fx *f, int mode) { OK(fx_try_open(f, mode)); }

static void fx_close(struct fx *f)
{
	kiln_device_stream_destroy(f->dev, f->s);
	kiln_device_close(f->dev);
	kiln_config_free(f->cfg);
	kiln_registry_close(f->reg);
}

/* ---- helpers ---------------------------------------------------------- */

/* Device buffer of `bytes`, filled from `h` when h is not NULL.  h must stay
 * unchanged until the next sync of f->s. */
static void *dput(struct fx *f, const void *h, size_t bytes)
{
	void *d;
	OK(kiln_device_alloc(f->dev, bytes, &d));
	if (h)
		OK(kiln_device_copy_async(f->dev, d, h, bytes, KILN_COPY_H2D, f->s));
	return d;
}

static void dget(struct fx *f, void *h, const void *d, size_t bytes)
{
	OK(kiln_device_copy_async(f->dev, h, d, bytes, KILN_COPY_D2H, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
}

static struct kiln_tensor_desc td(int dtype, int ndim, int64_t d0, int64_t d1)
{
	struct kiln_tensor_desc d;
	int64_t dims[2] = { d0, d1 };
	kiln_tensor_desc_init(&d, dtype, ndim, dims);
	return d;
}

/* Prepare, run once on f->s with a workspace of the size asked for, sync,
 * free.  Returns the first failing status (prepare, run or sync). */
static kiln_status run_op(struct fx *f, const struct kiln_op *op, const void *const *in,
			  void *const *out)
{
	void *plan = NULL, *ws = NULL;
	size_t wsb = 0;
	kiln_status st = kiln_device_prepare(f->dev, op, &plan, &wsb);
	if (st)
		return st;
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	for (int i = 0; i < op->n_in; i++)
		a.in[i] = in[i];
	for (int i = 0; i < op->n_out; i++)
		a.out[i] = out[i];
	a.workspace = ws;
	a.workspace_bytes = wsb;
	st = kiln_device_run(f->dev, plan, &a, f->s);
	if (!st)
		st = kiln_device_stream_sync(f->dev, f->s);
	kiln_device_plan_free(f->dev, plan);
	kiln_device_free(f->dev, ws);
	return st;
}

static uint64_t g_rng = 88172645463325252ull;
/* Uniform in [-1, 1). */
static float frand(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (float)((g_rng >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

static float *frandv(size_t n)
{
	float *v = malloc(n * sizeof *v);
	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

/* |got - want| within rel of the magnitude that produced want. */
#define NEAR(got, want, mag, rel, ...)                                                    \
	ck_assert_msg(fabs((double)(got) - (double)(want)) <= (rel) * ((mag) + 1e-3),     \
		      __VA_ARGS__)

/* ---- GEMM ------------------------------------------------------------- */

static void gemm_case(struct fx *f, int M, int N, int K, int ta, int tb, float alpha, int beta,
		      int bias)
{
	float *A = frandv((size_t)M * K), *B = frandv((size_t)K * N), *C0 = frandv((size_t)M * N);
	float *Bi = frandv((size_t)N), *C = malloc((size_t)M * N * sizeof *C);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.flags = beta ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = bias ? 3 : 2;
	op.n_out = 1;
	op.in[0] = ta ? td(KILN_F32, 2, K, M) : td(KILN_F32, 2, M, K);
	op.in[1] = tb ? td(KILN_F32, 2, N, K) : td(KILN_F32, 2, K, N);
	op.in[2] = td(KILN_F32, 1, N, 0);
	op.out[0] = td(KILN_F32, 2, M, N);
	op.i[0] = ta, op.i[1] = tb, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = alpha;

	void *dA = dput(f, A, (size_t)M * K * 4), *dB = dput(f, B, (size_t)K * N * 4);
	void *dBi = dput(f, Bi, (size_t)N * 4), *dC = dput(f, C0, (size_t)M * N * 4);
	const void *in[3] = { dA, dB, dBi };
	void *out[1] = { dC };
	OK(run_op(f, &op, in, out));
	dget(f, C, dC, (size_t)M * N * 4);

	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double s = 0, mag = 0;
			for (int k = 0; k < K; k++) {
				double a = ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
				double b = tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n];
				s += a * b;
				mag += fabs(a * b);
			}
			double want = alpha * s + (beta ? C0[m * N + n] : 0) + (bias ? Bi[n] : 0);
			mag = fabs(alpha) * mag + (beta ? fabs(C0[m * N + n]) : 0) +
			      (bias ? fabs(Bi[n]) : 0);
			NEAR(C[m * N + n], want, mag, 1e-5,
			     "GEMM M=%d N=%d K=%d tA=%d tB=%d alpha=%g beta=%d bias=%d: C[%d,%d] = %.7g, want %.7g",
			     M, N, K, ta, tb, alpha, beta, bias, m, n, C[m * N + n], want);
		}
	kiln_device_free(f->dev, dA);
	kiln_device_free(f->dev, dB);
	kiln_device_free(f->dev, dBi);
	kiln_device_free(f->dev, dC);
	free(A), free(B), free(C0), free(Bi), free(C);
}

START_TEST(test_gemm)
{
	static const int sz[] = { 1, 7, 129 };
	struct fx f;
	fx_open(&f, _i);
	for (int mi = 0; mi < 3; mi++)
		for (int ni = 0; ni < 3; ni++)
			for (int ki = 0; ki < 3; ki++)
				for (int t = 0; t < 4; t++)
					for (int v = 0; v < 8; v++)
						gemm_case(&f, sz[mi], sz[ni], sz[ki], t & 1, t >> 1,
							  v & 1 ? 0.5f : 1.0f, (v >> 1) & 1, v >> 2);
	fx_close(&f);
}
END_TEST

START_TEST(test_gemm_errors)
{
	struct fx f;
	void *plan;
	fx_open(&f, _i);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, 4, 5);
	op.in[1] = td(KILN_F32, 2, 6, 3); /* K mismatch: 18 != 5*3 */
	op.out[0] = td(KILN_F32, 2, 4, 3);
	op.i[2] = 4, op.i[3] = 3, op.i[4] = 5, op.f[0] = 1;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_ptr_null(plan);
	ck_assert_msg(strstr(kiln_last_error(), "f32[6, 3]"), "message: %s", kiln_last_error());

	op.type = KILN_OP_NORMALIZE_U8;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_ENOTSUP);
	op.type = 99;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_ENOTSUP);
	op.type = KILN_OP_RELU; /* f32 in, i32 out */
	op.n_in = 1, op.n_out = 1;
	op.in[0] = td(KILN_F32, 1, 8, 0);
	op.out[0] = td(KILN_I32, 1, 8, 0);
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_ENOTSUP);
	ck_assert_msg(strstr(kiln_last_error(), "RELU"), "message: %s", kiln_last_error());
	fx_close(&f);
}
END_TEST

/* ---- bias ------------------------------------------------------------- */

static void bias_case(struct fx *f, int R, int N)
{
	float *Y = frandv((size_t)R * N), *b = frandv((size_t)N), *db0 = frandv((size_t)N);
	float *got = malloc((size_t)R * N * 4);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BIAS_ADD;
	op.n_in = op.n_out = 1;
	op.in[0] = td(KILN_F32, 1, N, 0);
	op.out[0] = td(KILN_F32, 2, R, N);
	void *dY = dput(f, Y, (size_t)R * N * 4), *db = dput(f, b, (size_t)N * 4);
	const void *in[1] = { db };
	void *out[1] = { dY };
	OK(run_op(f, &op, in, out));
	dget(f, got, dY, (size_t)R * N * 4);
	for (int i = 0; i < R * N; i++)
		ck_assert_float_eq(got[i], Y[i] + b[i % N]);

	/* BIAS_GRAD of Y (original values) into db, write then accumulate */
	for (int acc = 0; acc < 2; acc++) {
		void *dX = dput(f, Y, (size_t)R * N * 4), *dg = dput(f, db0, (size_t)N * 4);
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BIAS_GRAD;
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		op.n_in = op.n_out = 1;
		op.in[0] = td(KILN_F32, 2, R, N);
		op.out[0] = td(KILN_F32, 1, N, 0);
		const void *gin[1] = { dX };
		void *gout[1] = { dg };
		OK(run_op(f, &op, gin, gout));
		dget(f, got, dg, (size_t)N * 4);
		for (int j = 0; j < N; j++) {
			double s = acc ? db0[j] : 0, mag = fabs(s);
			for (int r = 0; r < R; r++)
				s += Y[r * N + j], mag += fabs(Y[r * N + j]);
			NEAR(got[j], s, mag, 1e-6, "BIAS_GRAD R=%d N=%d acc=%d col %d: %g want %g", R,
			     N, acc, j, got[j], s);
		}
		kiln_device_free(f->dev, dX);
		kiln_device_free(f->dev, dg);
	}
	kiln_device_free(f->dev, dY);
	kiln_device_free(f->dev, db);
	free(Y), free(b), free(db0), free(got);
}

START_TEST(test_bias)
{
	struct fx f;
	fx_open(&f, _i);
	bias_case(&f, 1, 1);
	bias_case(&f, 37, 13);
	bias_case(&f, 700, 130); /* parallel path, two column blocks */
	fx_close(&f);
}
END_TEST

/* ---- ReLU ------------------------------------------------------------- */

static void relu_case(struct fx *f, int n)
{
	size_t b = (size_t)n * 4;
	float *x = frandv((size_t)n), *dy = frandv((size_t)n), *dx0 = frandv((size_t)n);
	float *got = malloc(b);
	void *dX = dput(f, x, b), *dYo = dput(f, NULL, b);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_RELU;
	op.n_in = op.n_out = 1;
	op.in[0] = op.out[0] = td(KILN_F32, 2, 1, n);
	const void *in[2] = { dX };
	void *out[1] = { dYo };
	OK(run_op(f, &op, in, out));
	dget(f, got, dYo, b);
	for (int i = 0; i < n; i++)
		ck_assert_float_eq(got[i], x[i] > 0 ? x[i] : 0.0f);
	/* in place */
	out[0] = dX;
	OK(run_op(f, &op, in, out));
	dget(f, got, dX, b);
	for (int i = 0; i < n; i++)
		ck_assert_float_eq(got[i], x[i] > 0 ? x[i] : 0.0f);

	/* backward from y = relu(x) (now in dX), write then accumulate */
	for (int acc = 0; acc < 2; acc++) {
		void *dDy = dput(f, dy, b), *dDx = dput(f, dx0, b);
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_RELU_BWD;
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		op.n_in = 2, op.n_out = 1;
		op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, n, 0);
		const void *bin[2] = { dX, dDy };
		void *bout[1] = { dDx };
		OK(run_op(f, &op, bin, bout));
		dget(f, got, dDx, b);
		for (int i = 0; i < n; i++)
			ck_assert_float_eq(got[i], (acc ? dx0[i] : 0.0f) + (x[i] > 0 ? dy[i] : 0.0f));
		kiln_device_free(f->dev, dDy);
		kiln_device_free(f->dev, dDx);
	}
	kiln_device_free(f->dev, dX);
	kiln_device_free(f->dev, dYo);
	free(x), free(dy), free(dx0), free(got);
}

START_TEST(test_relu)
{
	struct fx f;
	fx_open(&f, _i);
	relu_case(&f, 17);
	relu_case(&f, 100003);
	fx_close(&f);
}
END_TEST

/* ---- softmax cross-entropy ------------------------------------------- */

static void xent_case(struct fx *f, int N, int C, int valid, float spread)
{
	float *x = frandv((size_t)N * C), *g = malloc((size_t)N * C * 4);
	int32_t *lab = malloc((size_t)N * 4);
	float m0[2] = { 1.5f, 2.0f }, m[2];
	for (int i = 0; i < N * C; i++)
		x[i] *= spread;
	for (int r = 0; r < N; r++) {
		lab[r] = (int32_t)((r * 7 + 3) % C);
		if (r % 3 == 0) /* make some rows correct */
			x[r * C + lab[r]] = spread * 2;
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT;
	op.n_in = op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 2, N, C);
	op.in[1] = td(KILN_I32, 1, N, 0);
	op.out[1] = td(KILN_F32, 1, 2, 0);
	op.i[0] = valid;
	op.f[0] = 1.0 / valid;
	void *dx = dput(f, x, (size_t)N * C * 4), *dl = dput(f, lab, (size_t)N * 4);
	void *dg = dput(f, x, (size_t)N * C * 4), *dm = dput(f, m0, sizeof m0);
	const void *in[2] = { dx, dl };
	void *out[2] = { dg, dm };
	OK(run_op(f, &op, in, out));
	dget(f, g, dg, (size_t)N * C * 4);
	dget(f, m, dm, sizeof m);

	double loss = 0, correct = 0;
	for (int r = 0; r < N; r++) {
		const float *xr = x + r * C;
		if (r >= valid) {
			for (int j = 0; j < C; j++)
				ck_assert_msg(g[r * C + j] == 0.0f, "masked row %d has gradient %g", r,
					      g[r * C + j]);
			continue;
		}
		double mx = xr[0], s = 0;
		int am = 0;
		for (int j = 1; j < C; j++)
			if (xr[j] > mx)
				mx = xr[j], am = j;
		for (int j = 0; j < C; j++)
			s += exp(xr[j] - mx);
		loss += log(s) - (xr[lab[r]] - mx);
		correct += am == lab[r];
		for (int j = 0; j < C; j++) {
			double want = (exp(xr[j] - mx) / s - (j == lab[r])) / valid;
			NEAR(g[r * C + j], want, 1.0 / valid, 1e-5, "dlogits[%d,%d] = %g, want %g", r,
			     j, g[r * C + j], want);
		}
	}
	NEAR(m[0], m0[0] + loss, m0[0] + loss, 1e-5, "loss sum %g, want %g", m[0], m0[0] + loss);
	ck_assert_float_eq(m[1], m0[1] + correct);
	kiln_device_free(f->dev, dx);
	kiln_device_free(f->dev, dl);
	kiln_device_free(f->dev, dg);
	kiln_device_free(f->dev, dm);
	free(x), free(g), free(lab);
}

START_TEST(test_softmax_xent)
{
	struct fx f;
	fx_open(&f, _i);
	xent_case(&f, 9, 5, 7, 3.0f);
	xent_case(&f, 4, 1, 4, 1.0f);
	xent_case(&f, 6, 10, 6, 200.0f); /* large logits: needs the max shift */
	xent_case(&f, 300, 200, 257, 5.0f);
	fx_close(&f);
}
END_TEST

/* A label outside [0,C) is KILN_EDATA naming the row: from run() in sync
 * mode, from the next stream_sync in async mode. */
START_TEST(test_softmax_bad_label)
{
	struct fx f;
	fx_open(&f, _i);
	const int N = 5, C = 10;
	float x[50] = { 0 }, m[2] = { 0 };
	int32_t lab[5] = { 1, 2, 3, 12, 4 };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT;
	op.n_in = op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 2, N, C);
	op.in[1] = td(KILN_I32, 1, N, 0);
	op.out[1] = td(KILN_F32, 1, 2, 0);
	op.i[0] = N;
	op.f[0] = 1;
	void *dx = dput(&f, x, sizeof x), *dl = dput(&f, lab, sizeof lab);
	void *dg = dput(&f, NULL, sizeof x), *dm = dput(&f, m, sizeof m);
	const void *in[2] = { dx, dl };
	void *out[2] = { dg, dm };
	ck_assert_int_eq(run_op(&f, &op, in, out), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "row 3") && strstr(kiln_last_error(), "12"),
		      "message: %s", kiln_last_error());
	/* masked out, the bad row is not read */
	op.i[0] = 3;
	if (!f.async) {
		OK(run_op(&f, &op, in, out));
		dget(&f, m, dm, sizeof m);
		ck_assert_float_eq(m[1], 0.0f); /* all-zero logits: argmax 0, labels 1..3 */
	}
	kiln_device_free(f.dev, dx);
	kiln_device_free(f.dev, dl);
	kiln_device_free(f.dev, dg);
	kiln_device_free(f.dev, dm);
	fx_close(&f);
}
END_TEST

/* ---- SGD -------------------------------------------------------------- */

static void sgd_case(struct fx *f, int n, float mu, float wd, int nesterov, int with_state)
{
	enum { STEPS = 4 };
	size_t b = (size_t)n * 4;
	float *w = frandv((size_t)n), *v = calloc((size_t)n, 4), *got = malloc(b);
	float *grads[STEPS];
	float lrs[STEPS] = { 0.1f, 0.05f, 0.2f, 0.01f };
	void *dw = dput(f, w, b), *dv = dput(f, v, b), *dlr = dput(f, NULL, 4), *dg = dput(f, NULL, b);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SGD;
	op.n_in = 2;
	op.n_out = with_state ? 2 : 1;
	op.in[0] = op.out[0] = op.out[1] = td(KILN_F32, 1, n, 0);
	op.in[1] = td(KILN_F32, 1, 1, 0);
	op.i[0] = n, op.i[1] = nesterov;
	op.f[0] = mu, op.f[1] = wd;
	void *plan;
	size_t wsb;
	OK(kiln_device_prepare(f->dev, &op, &plan, &wsb));
	ck_assert_uint_eq(wsb, 0);
	for (int s = 0; s < STEPS; s++) {
		grads[s] = frandv((size_t)n);
		/* lr lives in device memory: a new value per step, no prepare */
		OK(kiln_device_copy_async(f->dev, dlr, &lrs[s], 4, KILN_COPY_H2D, f->s));
		OK(kiln_device_copy_async(f->dev, dg, grads[s], b, KILN_COPY_H2D, f->s));
		struct kiln_op_args a;
		memset(&a, 0, sizeof a);
		a.in[0] = dg, a.in[1] = dlr, a.out[0] = dw, a.out[1] = dv;
		OK(kiln_device_run(f->dev, plan, &a, f->s));
		/* the next step's copy into dg must wait for this run: the
		 * stream orders them, no sync needed */
	}
	dget(f, got, dw, b);
	for (int s = 0; s < STEPS; s++)
		for (int i = 0; i < n; i++) {
			float g = grads[s][i] + wd * w[i];
			float vi = with_state ? mu * v[i] + g : g;
			v[i] = vi;
			w[i] -= lrs[s] * (nesterov ? g + mu * vi : vi);
		}
	for (int i = 0; i < n; i++)
		/* the device may fuse multiply-adds (FMA): allow for rounding
		 * relative to the size of the terms, not of a small result */
		NEAR(got[i], w[i], fabs(w[i]) + 1.0, 1e-6, "SGD mu=%g wd=%g nesterov=%d: w[%d] = %.8g, want %.8g",
		     mu, wd, nesterov, i, got[i], w[i]);
	if (with_state) {
		dget(f, got, dv, b);
		for (int i = 0; i < n; i++)
			NEAR(got[i], v[i], fabs(v[i]) + 1.0, 1e-6, "SGD momentum[%d] = %g, want %g", i, got[i], v[i]);
	}
	kiln_device_plan_free(f->dev, plan);
	for (int s = 0; s < STEPS; s++)
		free(grads[s]);
	kiln_device_free(f->dev, dw);
	kiln_device_free(f->dev, dv);
	kiln_device_free(f->dev, dlr);
	kiln_device_free(f->dev, dg);
	free(w), free(v), free(got);
}

START_TEST(test_sgd)
{
	struct fx f;
	fx_open(&f, _i);
	sgd_case(&f, 1000, 0.9f, 1e-4f, 0, 1);
	sgd_case(&f, 1000, 0.9f, 1e-4f, 1, 1);
	sgd_case(&f, 70001, 0.5f, 0.01f, 1, 1);
	sgd_case(&f, 33, 0.0f, 0.0f, 0, 0);
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
			kiln_device_free(f.dev, dx);
			kiln_device_free(f.dev, dy);
			kiln_device_free(f.dev, ds);
			kiln_device_free(f.dev, dout);
			free(x), free(y), free(o), free(got);
		}
	fx_close(&f);
}
END_TEST

/* ---- streams and events ---------------------------------------------- */

/* Prepared elementwise op over n floats. */
static void *prep(struct fx *f, int type, int n, double f0, int flags)
{
	struct kiln_op op;
	void *plan;
	size_t ws;
	memset(&op, 0, sizeof op);
	op.type = type;
	op.flags = flags;
	op.n_in = type == KILN_OP_FILL ? 0 : type == KILN_OP_ADD ? 2 : 1;
	op.n_out = 1;
	op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, n, 0);
	op.f[0] = f0;
	OK(kiln_device_prepare(f->dev, &op, &plan, &ws));
	return plan;
}

static void run1(struct fx *f, void *plan, const void *in0, const void *in1, void *out,
		 void *stream)
{
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = in0, a.in[1] = in1, a.out[0] = out;
	OK(kiln_device_run(f->dev, plan, &a, stream));
}

/* Stream A builds X = 50 with a chain of adds and records an event; stream
 * B waits on it and computes Y1 = 2X (100).  A waits for B's read, adds 10
 * more and re-records the same event: B's second wait must see the new
 * generation (Y2 = 120). */
START_TEST(test_stream_order)
{
	struct fx f;
	fx_open(&f, _i);
	const int n = 1 << 18;
	size_t b = (size_t)n * 4;
	void *A = f.s, *B, *ev, *evb;
	OK(kiln_device_stream_create(f.dev, &B));
	OK(kiln_device_event_create(f.dev, &ev));
	OK(kiln_device_event_create(f.dev, &evb));
	void *X = dput(&f, NULL, b), *one = dput(&f, NULL, b), *Y1 = dput(&f, NULL, b);
	void *Y2 = dput(&f, NULL, b);
	void *fill0 = prep(&f, KILN_OP_FILL, n, 0, 0), *fill1 = prep(&f, KILN_OP_FILL, n, 1, 0);
	void *add = prep(&f, KILN_OP_ADD, n, 0, 0), *twice = prep(&f, KILN_OP_SCALE, n, 2, 0);
	float *h = malloc(b);

	run1(&f, fill0, NULL, NULL, X, A);
	run1(&f, fill1, NULL, NULL, one, A);
	for (int i = 0; i < 50; i++)
		run1(&f, add, X, one, X, A);
	OK(kiln_device_event_record(f.dev, ev, A));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	run1(&f, twice, X, NULL, Y1, B);
	/* A must not add more until B has read X */
	OK(kiln_device_event_record(f.dev, evb, B));
	OK(kiln_device_stream_wait(f.dev, A, evb));
	for (int i = 0; i < 10; i++)
		run1(&f, add, X, one, X, A);
	OK(kiln_device_event_record(f.dev, ev, A));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	run1(&f, twice, X, NULL, Y2, B);
	OK(kiln_device_stream_sync(f.dev, B));

	OK(kiln_device_copy_async(f.dev, h, Y1, b, KILN_COPY_D2H, B));
	OK(kiln_device_stream_sync(f.dev, B));
	for (int i = 0; i < n; i++)
		ck_assert_msg(h[i] == 100.0f, "Y1[%d] = %g, want 100", i, h[i]);
	OK(kiln_device_copy_async(f.dev, h, Y2, b, KILN_COPY_D2H, B));
	OK(kiln_device_event_record(f.dev, ev, B));
	OK(kiln_device_event_sync(f.dev, ev));
	for (int i = 0; i < n; i++)
		ck_assert_msg(h[i] == 120.0f, "Y2[%d] = %g, want 120", i, h[i]);

	/* An event never recorded is complete; waiting on it is a no-op. */
	void *fresh;
	OK(kiln_device_event_create(f.dev, &fresh));
	OK(kiln_device_event_sync(f.dev, fresh));
	OK(kiln_device_stream_wait(f.dev, B, fresh));
	OK(kiln_device_stream_sync(f.dev, B));
	kiln_device_event_destroy(f.dev, fresh);

	kiln_device_plan_free(f.dev, fill0);
	kiln_device_plan_free(f.dev, fill1);
	kiln_device_plan_free(f.dev, add);
	kiln_device_plan_free(f.dev, twice);
	kiln_device_free(f.dev, X);
	kiln_device_free(f.dev, one);
	kiln_device_free(f.dev, Y1);
	kiln_device_free(f.dev, Y2);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_event_destroy(f.dev, evb);
	kiln_device_stream_destroy(f.dev, B);
	free(h);
	fx_close(&f);
}
END_TEST

/* Async: a failed op poisons its stream.  stream_sync reports it (with the
 * op's message) and keeps reporting it; an event recorded after it and a
 * stream waiting on that event report it too; other streams are fine. */
START_TEST(test_sticky_error)
{
	struct fx f;
	fx_open(&f, 1);
	if (!f.async) {
		fx_close(&f);
		return; /* only the cpu device has a worker mode */
	}
	float x[4] = { 0 }, m[2] = { 0 };
	int32_t lab[2] = { 0, -1 };
	void *dx = dput(&f, x, sizeof x), *dl = dput(&f, lab, sizeof lab);
	void *dg = dput(&f, NULL, sizeof x), *dm = dput(&f, m, sizeof m);
	OK(kiln_device_stream_sync(f.dev, f.s));
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT;
	op.n_in = op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 2, 2, 2);
	op.in[1] = td(KILN_I32, 1, 2, 0);
	op.out[1] = td(KILN_F32, 1, 2, 0);
	op.i[0] = 2;
	op.f[0] = 1;
	void *plan, *B, *C, *ev;
	OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
	OK(kiln_device_stream_create(f.dev, &B));
	OK(kiln_device_stream_create(f.dev, &C));
	OK(kiln_device_event_create(f.dev, &ev));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dx, a.in[1] = dl, a.out[0] = dg, a.out[1] = dm;
	OK(kiln_device_run(f.dev, plan, &a, f.s)); /* enqueued: the error comes later */
	OK(kiln_device_event_record(f.dev, ev, f.s));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(kiln_device_stream_sync(f.dev, f.s), KILN_EDATA);
		ck_assert_msg(strstr(kiln_last_error(), "row 1") && strstr(kiln_last_error(), "-1"),
			      "message: %s", kiln_last_error());
	}
	ck_assert_int_eq(kiln_device_event_sync(f.dev, ev), KILN_EDATA);
	ck_assert_int_eq(kiln_device_stream_sync(f.dev, B), KILN_EDATA);
	ck_assert_int_eq(kiln_device_run(f.dev, plan, &a, f.s), KILN_EDATA);
	OK(kiln_device_stream_sync(f.dev, C));
	/* the metrics were not touched by the failed run */
	OK(kiln_device_copy_async(f.dev, m, dm, sizeof m, KILN_COPY_D2H, C));
	OK(kiln_device_stream_sync(f.dev, C));
	ck_assert_float_eq(m[0], 0.0f);
	kiln_device_plan_free(f.dev, plan);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_stream_destroy(f.dev, B);
	kiln_device_stream_destroy(f.dev, C);
	kiln_device_free(f.dev, dx);
	kiln_device_free(f.dev, dl);
	kiln_device_free(f.dev, dg);
	kiln_device_free(f.dev, dm);
	fx_close(&f);
}
END_TEST

/* The core counts host syncs and D2H copies; enqueueing counts neither. */
START_TEST(test_counters)
{
	struct fx f;
	fx_open(&f, _i);
	struct kiln_device_counters c0, c1;
	void *ev, *d = dput(&f, NULL, 64), *fill = prep(&f, KILN_OP_FILL, 16, 3, 0);
	float h[16];
	OK(kiln_device_event_create(f.dev, &ev));
	kiln_device_counters_get(f.dev, &c0);
	run1(&f, fill, NULL, NULL, d, f.s);
	OK(kiln_device_event_record(f.dev, ev, f.s));
	kiln_device_counters_get(f.dev, &c1);
	ck_assert_uint_eq(c1.host_syncs, c0.host_syncs);
	ck_assert_uint_eq(c1.runs, c0.runs + 1);
	OK(kiln_device_event_sync(f.dev, ev));
	OK(kiln_device_copy_async(f.dev, h, d, sizeof h, KILN_COPY_D2H, f.s));
	OK(kiln_device_stream_sync(f.dev, f.s));
	kiln_device_counters_get(f.dev, &c1);
	ck_assert_uint_eq(c1.host_syncs, c0.host_syncs + 2);
	ck_assert_uint_eq(c1.d2h_copies, c0.d2h_copies + 1);
	ck_assert_float_eq(h[15], 3.0f);
	kiln_device_plan_free(f.dev, fill);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_free(f.dev, d);
	fx_close(&f);
}
END_TEST

/* Closing a device with live streams, events, plans and queued work
 * releases everything (run under valgrind to see it). */
START_TEST(test_close_live)
{
	struct fx f;
	fx_open(&f, _i);
	void *s2, *ev, *d = dput(&f, NULL, 1 << 20);
	void *fill = prep(&f, KILN_OP_FILL, 1 << 18, 1, 0);
	OK(kiln_device_stream_create(f.dev, &s2));
	OK(kiln_device_event_create(f.dev, &ev));
	for (int i = 0; i < 20; i++)
		run1(&f, fill, NULL, NULL, d, s2);
	OK(kiln_device_event_record(f.dev, ev, s2));
	OK(kiln_device_stream_wait(f.dev, f.s, ev));
	int host_mem = !strcmp(g_name, "cpu");
	if (!host_mem) {
		OK(kiln_device_stream_sync(f.dev, s2));
		kiln_device_free(f.dev, d);
	}
	kiln_device_close(f.dev);
	if (host_mem)
		free(d); /* cpu device memory is posix_memalign'd; the queued fills are done */
	kiln_config_free(f.cfg);
	kiln_registry_close(f.reg);
}
END_TEST

/* ---- suite ------------------------------------------------------------ */

static Suite *make_device_suite(void)
{
	Suite *s = suite_create("device");
	struct {
		const char *name;
		const TTest *fn;
	} cases[] = {
		{ "gemm", test_gemm },
		{ "gemm_errors", test_gemm_errors },
		{ "bias", test_bias },
		{ "relu", test_relu },
		{ "softmax_xent", test_softmax_xent },
		{ "softmax_bad_label", test_softmax_bad_label },
		{ "sgd", test_sgd },
		{ "fill", test_fill },
		{ "reduce_scale_add", test_reduce_scale_add },
		{ "stream_order", test_stream_order },
		{ "counters", test_counters },
		{ "close_live", test_close_live },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_set_timeout(tc, 120);
		tcase_add_loop_test(tc, cases[i].fn, 0, 2); /* _i: 0 sync, 1 async */
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("sticky_error");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_sticky_error);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *name = getenv("KILN_TEST_DEVICE");
	if (name && *name)
		g_name = name;

	/* Skip (77) when the device cannot be opened here. */
	struct fx f;
	if (fx_try_open(&f, 0)) {
		printf("device '%s' not available, skipping: %s\n", g_name, kiln_last_error());
		return 77;
	}
	fx_close(&f);

	SRunner *sr = srunner_create(make_device_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
