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
#include <sys/wait.h>     /* waitpid: the trial open of a GPU runs in a child */
#include <unistd.h>       /* fork, _exit */

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

/* A device other than the reference may not implement an op family yet:
 * when it refuses the family's op with KILN_ENOTSUP at prepare (an empty op:
 * a device that has the op says KILN_EINVAL), the test is skipped with a
 * printed note.  Never on cpu: the reference device implements every op. */
static int unsupported(struct fx *f, int type)
{
	if (!strcmp(g_name, "cpu"))
		return 0;
	struct kiln_op op;
	void *plan = NULL;
	memset(&op, 0, sizeof op);
	op.type = type;
	kiln_status st = kiln_device_prepare(f->dev, &op, &plan, NULL);
	if (plan)
		kiln_device_plan_free(f->dev, plan);
	if (st != KILN_ENOTSUP)
		return 0;
	printf("device '%s': skipping the tests of op type %d: %s\n", g_name, type,
	       kiln_last_error());
	fflush(stdout);
	return 1;
}

#define SKIP_UNSUPPORTED(f, type)                                                         \
	do {                                                                              \
		if (unsupported((f), (type))) {                                           \
			fx_close(f);                                                      \
			return;                                                           \
		}                                                                         \
	} while (0)

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

/* The core's op checks (core/opcheck.c), the same for every device: one
 * malformed op per family, each refused before the device sees it, with
 * the status and a message naming the device, the op and the fault.  A
 * device that does not implement a family yet says KILN_ENOTSUP instead. */
/* libkiln's op names (core/internal.h), exported for the messages */
const char *kiln_op_name(int type);

static struct kiln_tensor_desc td4(int64_t n, int64_t c, int64_t h, int64_t w, int nhwc);

START_TEST(test_op_checks)
{
	struct fx f;
	fx_open(&f, _i);
	struct kiln_op ops[16];
	struct { kiln_status st; const char *want; } exp[16];
	int n = 0;
	memset(ops, 0, sizeof ops);
#define CASE(st_, want_) (exp[n].st = (st_), exp[n].want = (want_), &ops[n++])
	struct kiln_op *o;
	o = CASE(KILN_EINVAL, "takes 3 inputs and 4 outputs, got 2 and 4");
	o->type = KILN_OP_BN_TRAIN, o->n_in = 2, o->n_out = 4;
	o = CASE(KILN_EINVAL, "more than one value per channel");
	o->type = KILN_OP_BN_TRAIN, o->n_in = 3, o->n_out = 4;
	o->in[0] = td4(1, 3, 1, 1, 0), o->out[0] = o->in[0];
	o->in[1] = o->in[2] = o->out[2] = o->out[3] = td(KILN_F32, 1, 3, 0);
	o->out[1] = td(KILN_F32, 1, 6, 0);
	o = CASE(KILN_EINVAL, "pad must be <= kernel/2");
	o->type = KILN_OP_POOL, o->n_in = 1, o->n_out = 1;
	o->in[0] = td4(1, 2, 8, 8, 0), o->out[0] = td4(1, 2, 5, 5, 0);
	o->i[0] = KILN_POOL_MAX, o->i[1] = o->i[2] = 2, o->i[3] = o->i[4] = 2, o->i[5] = o->i[6] = 2;
	o = CASE(KILN_EINVAL, "unknown activation");
	o->type = KILN_OP_ACT, o->n_in = 1, o->n_out = 1, o->i[0] = 99;
	o->in[0] = o->out[0] = td(KILN_F32, 1, 8, 0);
	o = CASE(KILN_EINVAL, "probability f[0] outside [0, 1]");
	o->type = KILN_OP_DROPOUT, o->n_in = 2, o->n_out = 1, o->f[0] = 1.5;
	o->in[0] = o->out[0] = td(KILN_F32, 1, 8, 0), o->in[1] = td(KILN_I64, 1, 1, 0);
	o = CASE(KILN_EINVAL, "do not add up");
	o->type = KILN_OP_CONCAT, o->n_in = 2, o->n_out = 1, o->i[0] = 1;
	o->in[0] = td(KILN_F32, 2, 4, 3), o->in[1] = td(KILN_F32, 2, 4, 2);
	o->out[0] = td(KILN_F32, 2, 4, 6);
	o = CASE(KILN_EINVAL, "beta1");
	o->type = KILN_OP_ADAMW, o->n_in = 3, o->n_out = 3, o->i[0] = 8, o->f[0] = 1.0;
	o->in[0] = o->out[0] = o->out[1] = o->out[2] = td(KILN_F32, 1, 8, 0);
	o->in[1] = td(KILN_F32, 1, 1, 0), o->in[2] = td(KILN_I64, 1, 1, 0);
	o = CASE(KILN_EINVAL, "offsets");
	o->type = KILN_OP_LAMB, o->n_in = 4, o->n_out = 3, o->i[0] = 8, o->f[0] = 0.9;
	o->in[0] = o->out[0] = o->out[1] = o->out[2] = td(KILN_F32, 1, 8, 0);
	o->in[1] = td(KILN_F32, 1, 1, 0), o->in[2] = td(KILN_I64, 1, 1, 0);
	o->in[3] = td(KILN_I64, 1, 1, 0);
	o = CASE(KILN_ENOTSUP, "unknown loss");
	o->type = KILN_OP_SOFTMAX_XENT, o->n_in = 2, o->n_out = 2, o->i[0] = 4, o->i[1] = 99;
	o->in[0] = o->out[0] = td(KILN_F32, 2, 4, 10), o->in[1] = td(KILN_I32, 1, 4, 0);
	o->out[1] = td(KILN_F32, 1, 2, 0);
	o = CASE(KILN_ENOTSUP, "unknown schedule");
	o->type = KILN_OP_LR_SCHEDULE, o->n_in = 1, o->n_out = 1, o->i[0] = 99;
	o->in[0] = td(KILN_I64, 1, 1, 0), o->out[0] = td(KILN_F32, 1, 1, 0);
	o = CASE(KILN_EINVAL, "backoff");
	o->type = KILN_OP_SCALER_UPDATE, o->n_in = 1, o->n_out = 1, o->i[0] = o->i[1] = 1;
	o->f[0] = 2, o->f[1] = 0;
	o->in[0] = o->out[0] = td(KILN_F32, 1, 4, 0);
	o = CASE(KILN_EINVAL, "in0 has a bad descriptor");
	o->type = KILN_OP_RELU, o->n_in = 1, o->n_out = 1;
	o->in[0] = o->out[0] = td(KILN_F32, 1, 8, 0), o->in[0].ndim = KILN_MAX_DIMS + 1;
	o = CASE(KILN_EINVAL, "out of range");
	o->type = KILN_OP_ADD, o->n_in = KILN_OP_MAX_IN + 1, o->n_out = 1;
	o = CASE(KILN_EINVAL, "casts f32 to bf16 or f16");
	o->type = KILN_OP_CAST, o->n_in = 1, o->n_out = 1;
	o->in[0] = td(KILN_I32, 1, 8, 0), o->out[0] = td(KILN_F32, 1, 8, 0);
	o = CASE(KILN_EINVAL, "the number of groups");
	o->type = KILN_OP_BN_APPLY, o->n_in = 4, o->n_out = 4;
	o = CASE(KILN_EINVAL, "bias [N] does not match");
	o->type = KILN_OP_BIAS_ADD, o->n_in = 1, o->n_out = 1;
	o->in[0] = td(KILN_F32, 1, 5, 0), o->out[0] = td(KILN_F32, 2, 4, 6);
#undef CASE
	for (int k = 0; k < n; k++) {
		if (unsupported(&f, ops[k].type))
			continue;
		void *plan = NULL;
		kiln_status st = kiln_device_prepare(f.dev, &ops[k], &plan, NULL);
		const char *msg = kiln_last_error();
		ck_assert_msg(st == exp[k].st && !plan, "case %d (op %d): status %d, want %d: %s", k,
			      ops[k].type, st, exp[k].st, msg);
		ck_assert_msg(strstr(msg, exp[k].want) && strstr(msg, g_name),
			      "case %d: message lacks '%s' or the device name: %s", k, exp[k].want, msg);
		if (ops[k].type != KILN_OP_ADD) /* the op's name, except the counts case */
			ck_assert_msg(strstr(msg, kiln_op_name(ops[k].type)),
				      "case %d: message does not name the op: %s", k, msg);
	}
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

	op.type = KILN_OP_NORMALIZE_U8; /* wrong arity and dtypes */
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "NORMALIZE_U8"), "message: %s", kiln_last_error());
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


/* ---- the fused loss against PyTorch -------------------------------------- */

/* Cross-entropy with label smoothing, MSE and BCE with logits on one-hot
 * targets: mean loss and gradient against tests/data/loss_refs.txt (torch
 * 1.13, tests/data/gen_loss_refs.py); top-1 and top-5 counts against a
 * reference loop (top-5 ties broken by index). */
START_TEST(test_losses)
{
	enum { N = 6, C = 7 };
	char path[1024], line[16384];
	/* KILN_TEST_SRCDIR: the suite run from a carried bundle (tests/gpu/run.sh),
	 * where the build's source path does not exist */
	const char *src = getenv("KILN_TEST_SRCDIR");
	snprintf(path, sizeof path, "%s/tests/data/loss_refs.txt", src && *src ? src : SRCDIR);
	FILE *fp = fopen(path, "r");
	ck_assert_msg(fp != NULL, "cannot open %s", path);
	struct fx f;
	fx_open(&f, _i);
	float x[N * C], grad[N * C], m[3];
	int32_t y[N];
	int have_x = 0, have_y = 0, cases = 0;
	while (fgets(line, sizeof line, fp)) {
		char *p = line, *end;
		if (line[0] == '#')
			continue;
		if (!strncmp(line, "LOGITS ", 7)) {
			p += 7;
			for (int i = 0; i < N * C; i++, p = end)
				x[i] = strtof(p, &end);
			have_x = 1;
			continue;
		}
		if (!strncmp(line, "LABELS ", 7)) {
			p += 7;
			for (int i = 0; i < N; i++, p = end)
				y[i] = (int32_t)strtol(p, &end, 10);
			have_y = 1;
			continue;
		}
		ck_assert(have_x && have_y);
		char kind[16];
		double e, want_loss;
		int used;
		ck_assert(sscanf(line, "%15s %lf %lf ;%n", kind, &e, &want_loss, &used) == 3);
		p = line + used;
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SOFTMAX_XENT;
		op.n_in = 2, op.n_out = 2;
		op.in[0] = op.out[0] = td(KILN_F32, 2, N, C);
		op.in[1] = td(KILN_I32, 1, N, 0);
		op.out[1] = td(KILN_F32, 1, 3, 0);
		op.i[0] = N;
		op.i[1] = !strcmp(kind, "mse") ? KILN_LOSS_MSE : !strcmp(kind, "bce") ? KILN_LOSS_BCE
										       : KILN_LOSS_XENT;
		op.f[0] = 1.0 / N;
		op.f[1] = e;
		void *plan;
		OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
		const float zero[3] = { 0, 0, 0 };
		void *dx = dput(&f, x, sizeof x), *dy = dput(&f, y, sizeof y),
		     *dg = dput(&f, NULL, sizeof grad), *dm = dput(&f, zero, sizeof zero);
		struct kiln_op_args a = { .in = { dx, dy }, .out = { dg, dm } };
		OK(kiln_device_run(f.dev, plan, &a, f.s));
		dget(&f, grad, dg, sizeof grad);
		dget(&f, m, dm, sizeof m);
		NEAR(m[0] / N, want_loss, fabs(want_loss), 1e-5, "%s e=%g: loss %.8g, PyTorch %.8g",
		     kind, e, m[0] / N, want_loss);
		for (int i = 0; i < N * C; i++, p = end) {
			double want = strtod(p, &end);
			ck_assert(end != p);
			NEAR(grad[i], want, 1e-3, 1e-4, "%s e=%g: grad[%d] = %.8g, PyTorch %.8g", kind, e,
			     i, grad[i], want);
		}
		int top1 = 0, top5 = 0;
		for (int r = 0; r < N; r++) {
			int am = 0, above = 0;
			for (int j = 1; j < C; j++)
				if (x[r * C + j] > x[r * C + am])
					am = j;
			for (int j = 0; j < C; j++)
				above += x[r * C + j] > x[r * C + y[r]] ||
					 (x[r * C + j] == x[r * C + y[r]] && j < y[r]);
			top1 += am == y[r];
			top5 += above < 5;
		}
		ck_assert_msg(m[1] == top1 && m[2] == top5, "%s: top-1 %g (want %d), top-5 %g (want %d)",
			      kind, m[1], top1, m[2], top5);
		kiln_device_plan_free(f.dev, plan);
		kiln_device_free(f.dev, dx);
		kiln_device_free(f.dev, dy);
		kiln_device_free(f.dev, dg);
		kiln_device_free(f.dev, dm);
		cases++;
	}
	fclose(fp);
	ck_assert_int_eq(cases, 5);
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


/* ---- GRAD_CLIP and the skipped step ------------------------------------- */

/* Norm clipping as clip_grad_norm_ (scale max/(norm+1e-6) when above),
 * value clamping, and a non-finite gradient: flag 0, skipped + 1, and an
 * SGD step given the flag leaves params and momentum untouched. */
START_TEST(test_grad_clip)
{
	struct fx f;
	fx_open(&f, _i);
	const int n = 100003;
	size_t b = (size_t)n * 4;
	float *g = frandv((size_t)n), *got = malloc(b), st[4];
	const float st0[4] = { 0, 1, 0, 0 }, lr = 0.1f;
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)g[i] * g[i];
	const double norm = sqrt(ss);
	void *dg = dput(&f, g, b), *dst = dput(&f, st0, 16);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GRAD_CLIP;
	op.n_in = 1, op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 1, n, 0);
	op.out[1] = td(KILN_F32, 1, 4, 0);
	op.i[0] = n;
	op.f[0] = norm / 4; /* clip to a quarter */
	op.f[1] = 0;
	void *plan;
	OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
	struct kiln_op_args a = { .in = { dg }, .out = { dg, dst } };
	OK(kiln_device_run(f.dev, plan, &a, f.s));
	dget(&f, got, dg, b);
	dget(&f, st, dst, 16);
	NEAR(st[0], norm, norm, 1e-5, "norm %g, want %g", st[0], norm);
	ck_assert(st[1] == 1.0f && st[2] == 0.0f && st[3] == 1.0f);
	const float scale = (float)(norm / 4 / (norm + 1e-6));
	for (int i = 0; i < n; i++)
		NEAR(got[i], g[i] * scale, fabs(g[i]) + 1e-3, 1e-6, "clipped g[%d] = %g, want %g", i,
		     got[i], g[i] * scale);
	kiln_device_plan_free(f.dev, plan);

	/* value clamping only */
	op.f[0] = 0;
	op.f[1] = 0.25;
	OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
	OK(kiln_device_copy_async(f.dev, dg, g, b, KILN_COPY_H2D, f.s));
	OK(kiln_device_run(f.dev, plan, &a, f.s));
	dget(&f, got, dg, b);
	for (int i = 0; i < n; i++)
		ck_assert(got[i] == (g[i] > 0.25f ? 0.25f : g[i] < -0.25f ? -0.25f : g[i]));

	/* a NaN: skipped, flag 0; SGD gated by the flag does nothing */
	g[777] = NAN;
	OK(kiln_device_copy_async(f.dev, dg, g, b, KILN_COPY_H2D, f.s));
	OK(kiln_device_run(f.dev, plan, &a, f.s));
	dget(&f, st, dst, 16);
	ck_assert_msg(st[1] == 0.0f && st[2] == 1.0f, "flag %g, skipped %g", st[1], st[2]);
	float *w = frandv((size_t)n), *v = frandv((size_t)n);
	void *dw = dput(&f, w, b), *dv = dput(&f, v, b), *dlr = dput(&f, &lr, 4);
	struct kiln_op sop;
	memset(&sop, 0, sizeof sop);
	sop.type = KILN_OP_SGD;
	sop.flags = KILN_OPF_GATED;
	sop.n_in = 3, sop.n_out = 2;
	sop.in[0] = sop.out[0] = sop.out[1] = td(KILN_F32, 1, n, 0);
	sop.in[1] = sop.in[2] = td(KILN_F32, 1, 1, 0);
	sop.i[0] = n;
	sop.f[0] = 0.9;
	void *splan;
	OK(kiln_device_prepare(f.dev, &sop, &splan, NULL));
	struct kiln_op_args sa = { .in = { dg, dlr, (float *)dst + 1 }, .out = { dw, dv } };
	OK(kiln_device_run(f.dev, splan, &sa, f.s));
	dget(&f, got, dw, b);
	ck_assert(!memcmp(got, w, b));
	dget(&f, got, dv, b);
	ck_assert(!memcmp(got, v, b));
	kiln_device_plan_free(f.dev, splan);
	kiln_device_plan_free(f.dev, plan);
	kiln_device_free(f.dev, dg);
	kiln_device_free(f.dev, dst);
	kiln_device_free(f.dev, dw);
	kiln_device_free(f.dev, dv);
	kiln_device_free(f.dev, dlr);
	free(g), free(got), free(w), free(v);
	fx_close(&f);
}
END_TEST

/* ---- mixed precision: UNSCALE, SCALER_UPDATE, the scaled loss --------- */

/* UNSCALE is GRAD_CLIP on g / s: at s = 1 both give the same bits; at a
 * power of two s the unscaled gradients are exactly g * (1/s) and the norm
 * that of the unscaled ones; values whose squares overflow f32 before
 * unscaling still give a finite norm; an infinity or a NaN skips (flag 0,
 * skipped + 1, gradients untouched). */
static void unscale_run(struct fx *f, int type, int n, const float *g, float s, double clip,
			float *got, float st[4])
{
	const float st0[4] = { 0, 1, 0, 0 }, sc[4] = { s, 0, 1, 0 };
	size_t b = (size_t)n * 4;
	void *dg = dput(f, g, b), *dst = dput(f, st0, 16), *dsc = dput(f, sc, 16);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = type;
	op.n_in = type == KILN_OP_UNSCALE ? 2 : 1, op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 1, n, 0);
	op.in[1] = op.out[1] = td(KILN_F32, 1, 4, 0);
	op.i[0] = n;
	op.f[0] = clip;
	const void *in[2] = { dg, dsc };
	void *out[2] = { dg, dst };
	OK(run_op(f, &op, in, out));
	dget(f, got, dg, b);
	dget(f, st, dst, 16);
	kiln_device_free(f->dev, dg);
	kiln_device_free(f->dev, dst);
	kiln_device_free(f->dev, dsc);
}

START_TEST(test_unscale)
{
	struct fx f;
	fx_open(&f, _i);
	const int n = 100003;
	const size_t b = (size_t)n * 4;
	float *g = frandv((size_t)n), *gs = malloc(b), *got = malloc(b), *ref = malloc(b);
	float st[4], rst[4];
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)g[i] * g[i];
	const double norm = sqrt(ss);
	/* s = 1: bit-identical to GRAD_CLIP, with and without clipping */
	for (int c = 0; c < 2; c++) {
		const double clip = c ? norm / 3 : 0;
		unscale_run(&f, KILN_OP_GRAD_CLIP, n, g, 1, clip, ref, rst);
		unscale_run(&f, KILN_OP_UNSCALE, n, g, 1, clip, got, st);
		ck_assert(!memcmp(got, ref, b));
		ck_assert(!memcmp(st, rst, sizeof st));
	}
	/* s = 65536: exact unscaling, the unscaled norm */
	for (int i = 0; i < n; i++)
		gs[i] = g[i] * 65536.0f;
	unscale_run(&f, KILN_OP_UNSCALE, n, gs, 65536.0f, 0, got, st);
	ck_assert(!memcmp(got, g, b));
	NEAR(st[0], norm, norm, 1e-5, "norm %g, want %g", st[0], norm);
	ck_assert(st[1] == 1.0f && st[2] == 0.0f && st[3] == 0.0f);
	/* with clipping to a quarter of the unscaled norm */
	unscale_run(&f, KILN_OP_UNSCALE, n, gs, 65536.0f, norm / 4, got, st);
	const float c4 = (float)(norm / 4 / (norm + 1e-6));
	for (int i = 0; i < n; i++)
		NEAR(got[i], g[i] * c4, fabs(g[i]) + 1e-3, 1e-6, "clipped g[%d] = %g, want %g", i,
		     got[i], g[i] * c4);
	ck_assert(st[1] == 1.0f && st[3] == 1.0f);
	/* s = 2^100, |g s| up to 1.3e30: their squares overflow f32, the
	 * unscaled ones do not */
	const float big = 0x1p100f;
	for (int i = 0; i < n; i++)
		gs[i] = g[i] * big;
	unscale_run(&f, KILN_OP_UNSCALE, n, gs, big, 0, got, st);
	ck_assert_msg(st[1] == 1.0f, "finite gradients flagged non-finite (norm %g)", st[0]);
	NEAR(st[0], norm, norm, 1e-5, "norm %g, want %g", st[0], norm);
	ck_assert(!memcmp(got, g, b));
	/* an overflow (inf) and a NaN: skipped, gradients left as they were */
	for (int k = 0; k < 2; k++) {
		memcpy(gs, g, b);
		gs[k ? 5 : n - 1] = k ? NAN : INFINITY;
		unscale_run(&f, KILN_OP_UNSCALE, n, gs, 1024.0f, 1.0, got, st);
		ck_assert_msg(st[1] == 0.0f && st[2] == 1.0f && st[3] == 0.0f,
			      "flag %g skipped %g clipped %g", st[1], st[2], st[3]);
		ck_assert(!memcmp(got, gs, b));
	}
	free(g), free(gs), free(got), free(ref);
	fx_close(&f);
}
END_TEST

/* The reference of KILN_OP_SCALER_UPDATE (plugin.h), one step. */
static void scaler_ref(float st[4], int finite, double growth, double backoff, double lo,
		       double hi, int interval, int hyst)
{
	if (finite) {
		st[1] += 1;
		if (st[1] >= (float)interval) {
			const float g = (float)((double)st[0] * growth);
			if (isfinite(g) && (hi <= 0 || g <= hi))
				st[0] = g;
			st[1] = 0;
			st[2] = (float)hyst;
		}
	} else {
		st[3] += 1;
		st[1] = 0;
		st[2] -= 1;
		if (st[2] <= 0) {
			const double s = (double)st[0] * backoff;
			st[0] = (float)(s > lo ? s : lo);
		}
	}
}

/* 200 steps of a pseudo-random overflow pattern against the reference,
 * for GradScaler's rule (hysteresis 1) and with hysteresis 3, a minimum
 * and a maximum scale; the expected values of the first steps spelled out;
 * and growth past f32's range refused. */
START_TEST(test_scaler_update)
{
	struct fx f;
	fx_open(&f, _i);
	static const struct {
		double growth, backoff, lo, hi;
		int interval, hyst;
		float init;
	} cfgs[] = {
		{ 2, 0.5, 0, 0, 4, 1, 65536 },
		{ 2, 0.25, 8, 1 << 20, 3, 3, 1024 },
		{ 2, 0.5, 0, 0, 1, 1, 0x1p126f },
	};
	for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; c++) {
		float gate[4] = { 0, 1, 0, 0 }, st[4], ref[4] = { cfgs[c].init, 0, (float)cfgs[c].hyst, 0 };
		void *dgate = dput(&f, gate, 16), *dst = dput(&f, ref, 16);
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SCALER_UPDATE;
		op.n_in = op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_F32, 1, 4, 0);
		op.f[0] = cfgs[c].growth, op.f[1] = cfgs[c].backoff;
		op.f[2] = cfgs[c].lo, op.f[3] = cfgs[c].hi;
		op.i[0] = cfgs[c].interval, op.i[1] = cfgs[c].hyst;
		void *plan;
		OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
		uint32_t r = 12345;
		for (int k = 0; k < 200; k++) {
			r = r * 1103515245u + 12345u;
			const int finite = c == 2 || (r >> 16) % 5 != 0; /* 1 in 5 overflows */
			gate[1] = finite ? 1.0f : 0.0f;
			OK(kiln_device_copy_async(f.dev, dgate, gate, 16, KILN_COPY_H2D, f.s));
			struct kiln_op_args a = { .in = { dgate }, .out = { dst } };
			OK(kiln_device_run(f.dev, plan, &a, f.s));
			dget(&f, st, dst, 16);
			scaler_ref(ref, finite, cfgs[c].growth, cfgs[c].backoff, cfgs[c].lo,
				   cfgs[c].hi, cfgs[c].interval, cfgs[c].hyst);
			ck_assert_msg(!memcmp(st, ref, 16),
				      "config %zu step %d: state {%g %g %g %g}, want {%g %g %g %g}", c, k,
				      st[0], st[1], st[2], st[3], ref[0], ref[1], ref[2], ref[3]);
			if (c == 0 && k == 3) /* 4 steps: grown once or backed off */
				ck_assert(st[0] == 131072.0f || st[3] > 0);
		}
		if (c == 2) /* 2^127 grows no further: 2^128 is not finite */
			ck_assert_float_eq(st[0], 0x1p127f);
		if (c == 1) {
			ck_assert(st[0] >= 8.0f && st[0] <= (float)(1 << 20));
			ck_assert_float_eq(st[3], ref[3]);
		}
		/* hand-checked sequence for GradScaler's rule: overflow halves,
		 * 4 finite steps double */
		if (c == 0) {
			const float s0[4] = { 1024, 0, 1, 0 };
			static const int flags[7] = { 0, 1, 1, 1, 1, 0, 1 };
			static const float want[7] = { 512, 512, 512, 512, 1024, 512, 512 };
			OK(kiln_device_copy_async(f.dev, dst, s0, 16, KILN_COPY_H2D, f.s));
			for (int k = 0; k < 7; k++) {
				gate[1] = (float)flags[k];
				OK(kiln_device_copy_async(f.dev, dgate, gate, 16, KILN_COPY_H2D, f.s));
				struct kiln_op_args a = { .in = { dgate }, .out = { dst } };
				OK(kiln_device_run(f.dev, plan, &a, f.s));
				dget(&f, st, dst, 16);
				ck_assert_msg(st[0] == want[k], "step %d: scale %g, want %g", k, st[0],
					      want[k]);
			}
			ck_assert_float_eq(st[3], 2.0f);
			ck_assert_float_eq(st[1], 1.0f);
		}
		kiln_device_plan_free(f.dev, plan);
		kiln_device_free(f.dev, dgate);
		kiln_device_free(f.dev, dst);
	}
	/* bad parameters are refused at prepare */
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SCALER_UPDATE;
	op.n_in = op.n_out = 1;
	op.in[0] = op.out[0] = td(KILN_F32, 1, 4, 0);
	op.f[0] = 2, op.f[1] = 1.5, op.i[0] = 10, op.i[1] = 1;
	void *plan = NULL;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	fx_close(&f);
}
END_TEST

/* The loss scale input of SOFTMAX_XENT: dlogits = f[0] s (...), the
 * metrics unscaled: the same bits as f[0] multiplied by s on the host. */
START_TEST(test_xent_loss_scale)
{
	struct fx f;
	fx_open(&f, _i);
	const int N = 37, C = 11;
	const size_t b = (size_t)N * C * 4;
	float *x = frandv((size_t)N * C), *g0 = malloc(b), *g1 = malloc(b);
	float m0[3], m1[3], zero[3] = { 0, 0, 0 }, s = 4096.0f;
	int32_t lab[37];
	for (int r = 0; r < N; r++)
		lab[r] = (r * 5 + 1) % C;
	for (int kind = 0; kind < 3; kind++) {
		void *dx = dput(&f, x, b), *dl = dput(&f, lab, sizeof lab), *ds = dput(&f, &s, 4);
		void *dg = dput(&f, NULL, b), *dm = dput(&f, zero, 12);
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SOFTMAX_XENT;
		op.n_in = 3, op.n_out = 2;
		op.in[0] = op.out[0] = td(KILN_F32, 2, N, C);
		op.in[1] = td(KILN_I32, 1, N, 0);
		op.in[2] = td(KILN_F32, 1, 1, 0);
		op.out[1] = td(KILN_F32, 1, 3, 0);
		op.i[0] = N - 2;
		op.i[1] = kind;
		op.f[0] = 1.0 / (N - 2);
		op.f[1] = kind ? 0 : 0.1;
		const void *in[3] = { dx, dl, ds };
		void *out[2] = { dg, dm };
		OK(run_op(&f, &op, in, out));
		dget(&f, g1, dg, b);
		dget(&f, m1, dm, 12);
		OK(kiln_device_copy_async(f.dev, dm, zero, 12, KILN_COPY_H2D, f.s));
		op.n_in = 2;
		op.f[0] = 1.0 / (N - 2) * s;
		OK(run_op(&f, &op, in, out));
		dget(&f, g0, dg, b);
		dget(&f, m0, dm, 12);
		ck_assert_msg(!memcmp(g0, g1, b), "loss %d: scaled gradients differ", kind);
		ck_assert(!memcmp(m0, m1, sizeof m0));
		kiln_device_free(f.dev, dx);
		kiln_device_free(f.dev, dl);
		kiln_device_free(f.dev, ds);
		kiln_device_free(f.dev, dg);
		kiln_device_free(f.dev, dm);
	}
	free(x), free(g0), free(g1);
	fx_close(&f);
}
END_TEST

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
	void *inc, *sched[2];
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_COUNTER_ADD;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.out[0], KILN_I64, 1, &one);
	op.i[0] = 1;
	OK(kiln_device_prepare(f.dev, &op, &inc, &wsb));
	for (int k = 0; k < 2; k++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_LR_SCHEDULE;
		op.n_in = op.n_out = 1;
		kiln_tensor_desc_init(&op.in[0], KILN_I64, 1, &one);
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
		op.i[0] = k ? KILN_SCHED_COSINE : KILN_SCHED_CONSTANT;
		op.i[1] = 100, op.i[2] = 10;
		op.f[0] = 0.1, op.f[1] = 0.001;
		OK(kiln_device_prepare(f.dev, &op, &sched[k], &wsb));
	}
	for (int t = 0; t < 105; t++) {
		for (int k = 0; k < 2; k++) {
			struct kiln_op_args args = { .in = { step }, .out = { lr } };
			float v;
			OK(kiln_device_run(f.dev, sched[k], &args, f.s));
			dget(&f, &v, lr, 4);
			double want = 0.1;
			if (t < 10)
				want = 0.1 * (t + 1) / 10.0;
			else if (k) {
				int u = t - 10 < 90 ? t - 10 : 90;
				want = 0.001 + (0.1 - 0.001) * (1 + cos(M_PI * u / 90.0)) / 2;
			}
			NEAR(v, want, want, 1e-6, "schedule %d step %d: lr %g, want %g", k, t, v, want);
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
	kiln_device_plan_free(f.dev, sched[0]);
	kiln_device_plan_free(f.dev, sched[1]);
	kiln_device_free(f.dev, step);
	kiln_device_free(f.dev, lr);
	kiln_device_free(f.dev, da);
	kiln_device_free(f.dev, db);
	kiln_device_free(f.dev, dy);
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
			kiln_device_free(f.dev, dx);
			kiln_device_free(f.dev, dy);
			kiln_device_free(f.dev, ds);
			kiln_device_free(f.dev, dout);
			free(x), free(y), free(o), free(got);
		}
	fx_close(&f);
}
END_TEST

/* ---- convolutional ops: shared helpers -------------------------------- */

/* Reference tensors are kept in logical NCHW order; the device gets them in
 * the op's layout. */
static struct kiln_tensor_desc td4(int64_t n, int64_t c, int64_t h, int64_t w, int nhwc)
{
	struct kiln_tensor_desc d;
	int64_t dims[4] = { n, c, h, w };
	kiln_tensor_desc_init(&d, KILN_F32, 4, dims);
	d.layout = nhwc ? KILN_NHWC : KILN_NCHW;
	return d;
}

/* Stored offset of logical element (n, c, h, w) of [N, C, H, W]. */
static size_t at4(int nhwc, int C, int H, int W, int n, int c, int h, int w)
{
	return nhwc ? (((size_t)n * H + h) * W + w) * C + c : (((size_t)n * C + c) * H + h) * W + w;
}

/* NCHW <-> stored order of a [N, C, H, W] tensor; to_stored 1: logical in
 * src, stored out. */
static void restore(float *dst, const float *src, int N, int C, int H, int W, int nhwc,
		    int to_stored)
{
	size_t i = 0;
	for (int n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			for (int h = 0; h < H; h++)
				for (int w = 0; w < W; w++, i++) {
					size_t s = at4(nhwc, C, H, W, n, c, h, w);
					if (to_stored)
						dst[s] = src[i];
					else
						dst[i] = src[s];
				}
}

/* Device copy of logical [N,C,H,W] data h in the stored order. */
static void *dput4(struct fx *f, const float *h, int N, int C, int H, int W, int nhwc,
		   float **keep)
{
	size_t n = (size_t)N * C * H * W;
	float *s = malloc(n * 4);
	restore(s, h, N, C, H, W, nhwc, 1);
	*keep = s; /* freed by the caller after the next sync */
	return dput(f, s, n * 4);
}

/* Logical [N,C,H,W] copy of device data d. */
static float *dget4(struct fx *f, const void *d, int N, int C, int H, int W, int nhwc)
{
	size_t n = (size_t)N * C * H * W;
	float *s = malloc(n * 4), *l = malloc(n * 4);
	dget(f, s, d, n * 4);
	restore(l, s, N, C, H, W, nhwc, 0);
	free(s);
	return l;
}

/* The device's aux_bytes for a prepared plan. */
static size_t aux_bytes(struct fx *f, void *plan)
{
	return kiln_device_aux_bytes(f->dev, plan);
}

/* ---- convolution ------------------------------------------------------ */

struct conv_g {
	int N, C, O, H, W, KH, KW, sh, sw, ph, pw, dh, dw, g, bias;
};

static void conv_op(struct kiln_op *op, int type, const struct conv_g *q, int OH, int OW,
		    int nhwc)
{
	memset(op, 0, sizeof *op);
	op->type = type;
	struct kiln_tensor_desc x = td4(q->N, q->C, q->H, q->W, nhwc);
	struct kiln_tensor_desc y = td4(q->N, q->O, OH, OW, nhwc);
	struct kiln_tensor_desc w = td4(q->O, q->C / q->g, q->KH, q->KW, 0);
	w.layout = KILN_ROW;
	struct kiln_tensor_desc b = td(KILN_F32, 1, q->O, 0);
	if (type == KILN_OP_CONV) {
		op->n_in = q->bias ? 3 : 2, op->n_out = 1;
		op->in[0] = x, op->in[1] = w, op->in[2] = b, op->out[0] = y;
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		op->n_in = 2, op->n_out = 1;
		op->in[0] = y, op->in[1] = w, op->out[0] = x;
	} else {
		op->n_in = 2, op->n_out = q->bias ? 2 : 1;
		op->in[0] = x, op->in[1] = y, op->out[0] = w, op->out[1] = b;
	}
	op->i[0] = q->sh, op->i[1] = q->sw, op->i[2] = q->ph, op->i[3] = q->pw;
	op->i[4] = q->dh, op->i[5] = q->dw, op->i[6] = q->g;
}

static void conv_case(struct fx *f, const struct conv_g *q, int nhwc)
{
	const int N = q->N, C = q->C, O = q->O, H = q->H, W = q->W, KH = q->KH, KW = q->KW;
	const int Cg = C / q->g, Og = O / q->g;
	const int OH = (H + 2 * q->ph - q->dh * (KH - 1) - 1) / q->sh + 1;
	const int OW = (W + 2 * q->pw - q->dw * (KW - 1) - 1) / q->sw + 1;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * O * OH * OW;
	const size_t nw = (size_t)O * Cg * KH * KW;
	float *x = frandv(nx), *w = frandv(nw), *b = frandv((size_t)O), *dy = frandv(ny);
	double *y = calloc(ny, 8), *ym = calloc(ny, 8), *dx = calloc(nx, 8), *dxm = calloc(nx, 8);
	double *dw = calloc(nw, 8), *dwm = calloc(nw, 8), *db = calloc((size_t)O, 8);
	double *dbm = calloc((size_t)O, 8);

	/* the 7-loop definition, every product visited once for all three */
	for (int n = 0; n < N; n++)
		for (int o = 0; o < O; o++)
			for (int oh = 0; oh < OH; oh++)
				for (int ow = 0; ow < OW; ow++) {
					const size_t yi = (((size_t)n * O + o) * OH + oh) * OW + ow;
					const int g = o / Og;
					for (int cg = 0; cg < Cg; cg++)
						for (int kh = 0; kh < KH; kh++)
							for (int kw = 0; kw < KW; kw++) {
								int ih = oh * q->sh - q->ph + kh * q->dh;
								int iw = ow * q->sw - q->pw + kw * q->dw;
								if (ih < 0 || ih >= H || iw < 0 || iw >= W)
									continue;
								int c = g * Cg + cg;
								size_t xi = (((size_t)n * C + c) * H + ih) * W + iw;
								size_t wi = (((size_t)o * Cg + cg) * KH + kh) * KW + kw;
								y[yi] += (double)x[xi] * w[wi];
								ym[yi] += fabs((double)x[xi] * w[wi]);
								dx[xi] += (double)dy[yi] * w[wi];
								dxm[xi] += fabs((double)dy[yi] * w[wi]);
								dw[wi] += (double)dy[yi] * x[xi];
								dwm[wi] += fabs((double)dy[yi] * x[xi]);
							}
					if (q->bias) {
						y[yi] += b[o], ym[yi] += fabs(b[o]);
						db[o] += dy[yi], dbm[o] += fabs(dy[yi]);
					}
				}

	float *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, nhwc, &k1), *dDY = dput4(f, dy, N, O, OH, OW, nhwc, &k2);
	void *dW = dput(f, w, nw * 4), *dB = dput(f, b, (size_t)O * 4);
	void *dY = dput(f, NULL, ny * 4), *dDX = dput(f, NULL, nx * 4);
	void *dDW = dput(f, NULL, nw * 4), *dDB = dput(f, NULL, (size_t)O * 4);
	struct kiln_op op;
	char tag[160];
	snprintf(tag, sizeof tag,
		 "%s N%d C%d O%d %dx%d k%dx%d s%d,%d p%d,%d d%d,%d g%d bias%d", nhwc ? "NHWC" : "NCHW",
		 N, C, O, H, W, KH, KW, q->sh, q->sw, q->ph, q->pw, q->dh, q->dw, q->g, q->bias);

	conv_op(&op, KILN_OP_CONV, q, OH, OW, nhwc);
	const void *in[3] = { dX, dW, dB };
	void *out[2] = { dY };
	OK(run_op(f, &op, in, out));
	float *got = dget4(f, dY, N, O, OH, OW, nhwc);
	for (size_t i = 0; i < ny; i++)
		NEAR(got[i], y[i], ym[i], 1e-4, "CONV %s: y[%zu] = %.7g, want %.7g", tag, i, got[i], y[i]);
	free(got);

	conv_op(&op, KILN_OP_CONV_BWD_DATA, q, OH, OW, nhwc);
	in[0] = dDY, in[1] = dW, out[0] = dDX;
	OK(run_op(f, &op, in, out));
	got = dget4(f, dDX, N, C, H, W, nhwc);
	for (size_t i = 0; i < nx; i++)
		NEAR(got[i], dx[i], dxm[i], 1e-4, "CONV_BWD_DATA %s: dx[%zu] = %.7g, want %.7g", tag, i,
		     got[i], dx[i]);
	free(got);
	op.flags = KILN_OPF_ACCUMULATE; /* refused: the caller adds from scratch */
	void *plan;
	ck_assert_int_eq(kiln_device_prepare(f->dev, &op, &plan, NULL), KILN_ENOTSUP);

	conv_op(&op, KILN_OP_CONV_BWD_WEIGHTS, q, OH, OW, nhwc);
	in[0] = dX, in[1] = dDY, out[0] = dDW, out[1] = dDB;
	OK(run_op(f, &op, in, out));
	got = malloc(nw * 4);
	dget(f, got, dDW, nw * 4);
	for (size_t i = 0; i < nw; i++)
		NEAR(got[i], dw[i], dwm[i], 1e-4, "CONV_BWD_WEIGHTS %s: dw[%zu] = %.7g, want %.7g", tag,
		     i, got[i], dw[i]);
	if (q->bias) {
		dget(f, got, dDB, (size_t)O * 4);
		for (int o = 0; o < O; o++)
			NEAR(got[o], db[o], dbm[o], 1e-4, "CONV_BWD_WEIGHTS %s: db[%d] = %.7g, want %.7g",
			     tag, o, got[o], db[o]);
	}
	free(got);

	void *d[] = { dX, dDY, dW, dB, dY, dDX, dDW, dDB };
	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		kiln_device_free(f->dev, d[i]);
	free(x), free(w), free(b), free(dy), free(y), free(ym), free(dx), free(dxm);
	free(dw), free(dwm), free(db), free(dbm), free(k1), free(k2);
}

START_TEST(test_conv)
{
	/* N C O H W KH KW sh sw ph pw dh dw g bias */
	static const struct conv_g cases[] = {
		{ 1, 3, 5, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 },
		{ 3, 4, 6, 13, 13, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1 },   /* stride 2, groups 2 */
		{ 3, 4, 8, 13, 13, 5, 5, 1, 1, 2, 2, 1, 1, 1, 0 },   /* 5x5, pad 2, no bias */
		{ 2, 6, 4, 13, 13, 3, 3, 1, 1, 2, 2, 2, 2, 2, 1 },   /* dilation 2, groups 2 */
		{ 3, 8, 16, 7, 7, 1, 1, 2, 2, 0, 0, 1, 1, 1, 1 },    /* 1x1 stride 2 */
		{ 1, 16, 32, 13, 13, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1 }, /* blocked-friendly channels */
		{ 2, 3, 4, 7, 13, 3, 5, 2, 1, 1, 2, 1, 1, 1, 1 },    /* rectangular everything */
		{ 2, 8, 8, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1 },   /* depthwise */
		{ 3, 32, 64, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 }, /* bigger: threads, reorders */
	};
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_CONV);
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
		for (int nhwc = 0; nhwc < 2; nhwc++)
			conv_case(&f, &cases[k], nhwc);
	fx_close(&f);
}
END_TEST

START_TEST(test_conv_errors)
{
	struct fx f;
	void *plan;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_CONV);
	struct conv_g q = { 2, 4, 6, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	struct kiln_op op;
	conv_op(&op, KILN_OP_CONV, &q, 6, 7, 0); /* OH should be 7 */
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "CONV"), "message: %s", kiln_last_error());
	q.g = 4; /* O = 6 is not a multiple of 4 groups */
	conv_op(&op, KILN_OP_CONV, &q, 7, 7, 0);
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	q.g = 1;
	conv_op(&op, KILN_OP_CONV, &q, 7, 7, 0);
	op.out[0].layout = KILN_NHWC; /* mixed layouts */
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	fx_close(&f);
}
END_TEST

/* ---- pooling ---------------------------------------------------------- */

struct pool_g {
	int N, C, H, W, kind, KH, KW, sh, sw, ph, pw, cip;
};

static void pool_op(struct kiln_op *op, int bwd, const struct pool_g *q, int OH, int OW, int nhwc)
{
	memset(op, 0, sizeof *op);
	op->type = bwd ? KILN_OP_POOL_BWD : KILN_OP_POOL;
	struct kiln_tensor_desc x = td4(q->N, q->C, q->H, q->W, nhwc);
	struct kiln_tensor_desc y = td4(q->N, q->C, OH, OW, nhwc);
	if (bwd) {
		op->n_in = 3, op->n_out = 1;
		op->in[0] = y, op->in[1] = td(KILN_U8, 1, 1, 0), op->in[2] = x, op->out[0] = x;
	} else {
		op->n_in = 1, op->n_out = 2;
		op->in[0] = x, op->out[0] = y, op->out[1] = td(KILN_U8, 1, 1, 0);
	}
	op->i[0] = q->kind, op->i[1] = q->KH, op->i[2] = q->KW, op->i[3] = q->sh, op->i[4] = q->sw;
	op->i[5] = q->ph, op->i[6] = q->pw, op->i[7] = q->cip;
}

static void pool_case(struct fx *f, const struct pool_g *q, int nhwc)
{
	const int N = q->N, C = q->C, H = q->H, W = q->W;
	const int OH = (H + 2 * q->ph - q->KH) / q->sh + 1, OW = (W + 2 * q->pw - q->KW) / q->sw + 1;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
	float *x = frandv(nx), *dy = frandv(ny);
	double *y = calloc(ny, 8), *dx = calloc(nx, 8), *ym = calloc(ny, 8);
	for (int nc = 0; nc < N * C; nc++)
		for (int oh = 0; oh < OH; oh++)
			for (int ow = 0; ow < OW; ow++) {
				const size_t yi = ((size_t)nc * OH + oh) * OW + ow;
				double s = 0, sa = 0, mx = -INFINITY;
				size_t am = 0;
				int cnt = 0;
				for (int kh = 0; kh < q->KH; kh++)
					for (int kw = 0; kw < q->KW; kw++) {
						int ih = oh * q->sh - q->ph + kh, iw = ow * q->sw - q->pw + kw;
						if (ih < 0 || ih >= H || iw < 0 || iw >= W)
							continue;
						size_t xi = ((size_t)nc * H + ih) * W + iw;
						s += x[xi], sa += fabs(x[xi]), cnt++;
						if (x[xi] > mx)
							mx = x[xi], am = xi;
					}
				if (q->kind == KILN_POOL_MAX) {
					y[yi] = mx;
					dx[am] += dy[yi];
				} else {
					const int div = q->cip ? q->KH * q->KW : cnt;
					y[yi] = s / div;
					ym[yi] = sa / div;
					for (int kh = 0; kh < q->KH; kh++)
						for (int kw = 0; kw < q->KW; kw++) {
							int ih = oh * q->sh - q->ph + kh;
							int iw = ow * q->sw - q->pw + kw;
							if (ih >= 0 && ih < H && iw >= 0 && iw < W)
								dx[((size_t)nc * H + ih) * W + iw] += (double)dy[yi] / div;
						}
				}
			}
	char tag[160];
	snprintf(tag, sizeof tag, "%s %s N%d C%d %dx%d k%dx%d s%d,%d p%d,%d cip%d",
		 nhwc ? "NHWC" : "NCHW", q->kind == KILN_POOL_MAX ? "max" : "avg", N, C, H, W, q->KH,
		 q->KW, q->sh, q->sw, q->ph, q->pw, q->cip);

	/* forward with aux kept for the backward */
	struct kiln_op op;
	void *fplan, *bplan, *ws = NULL, *aux = NULL;
	size_t wsb = 0, bwsb = 0;
	pool_op(&op, 0, q, OH, OW, nhwc);
	OK(kiln_device_prepare(f->dev, &op, &fplan, &wsb));
	const size_t ab = aux_bytes(f, fplan);
	if (q->kind == KILN_POOL_AVG)
		ck_assert_uint_eq(ab, 0);
	pool_op(&op, 1, q, OH, OW, nhwc);
	OK(kiln_device_prepare(f->dev, &op, &bplan, &bwsb));
	if (bwsb > wsb)
		wsb = bwsb;
	float *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, nhwc, &k1), *dDY = dput4(f, dy, N, C, OH, OW, nhwc, &k2);
	void *dY = dput(f, NULL, ny * 4), *dDX = dput(f, NULL, nx * 4);
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	if (ab)
		OK(kiln_device_alloc(f->dev, ab, &aux));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dX, a.out[0] = dY, a.out[1] = aux, a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, fplan, &a, f->s));
	memset(&a, 0, sizeof a);
	a.in[0] = dDY, a.in[1] = aux, a.in[2] = dX, a.out[0] = dDX;
	a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, bplan, &a, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));

	float *got = dget4(f, dY, N, C, OH, OW, nhwc);
	for (size_t i = 0; i < ny; i++)
		NEAR(got[i], y[i], fabs(y[i]) + ym[i], 1e-5, "POOL %s: y[%zu] = %.7g, want %.7g", tag, i, got[i],
		     y[i]);
	free(got);
	got = dget4(f, dDX, N, C, H, W, nhwc);
	for (size_t i = 0; i < nx; i++)
		NEAR(got[i], dx[i], fabs(dx[i]) + 1, 1e-5, "POOL_BWD %s: dx[%zu] = %.7g, want %.7g", tag,
		     i, got[i], dx[i]);
	free(got);
	kiln_device_plan_free(f->dev, fplan);
	kiln_device_plan_free(f->dev, bplan);
	void *d[] = { dX, dDY, dY, dDX, ws, aux };
	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		kiln_device_free(f->dev, d[i]);
	free(x), free(dy), free(y), free(dx), free(ym), free(k1), free(k2);
}

START_TEST(test_pool)
{
	/* N C H W kind KH KW sh sw ph pw cip */
	static const struct pool_g cases[] = {
		{ 3, 5, 13, 13, KILN_POOL_MAX, 3, 3, 2, 2, 1, 1, 0 },
		{ 1, 4, 7, 7, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 }, /* floor drops a row */
		{ 2, 16, 13, 13, KILN_POOL_MAX, 3, 3, 1, 1, 1, 1, 0 },
		{ 2, 3, 7, 13, KILN_POOL_MAX, 3, 5, 2, 1, 1, 2, 0 },
		{ 3, 5, 13, 13, KILN_POOL_AVG, 3, 3, 1, 1, 1, 1, 1 },
		{ 3, 5, 13, 13, KILN_POOL_AVG, 3, 3, 1, 1, 1, 1, 0 },
		{ 2, 6, 13, 13, KILN_POOL_AVG, 5, 5, 2, 2, 2, 2, 0 },
		{ 2, 6, 13, 13, KILN_POOL_AVG, 5, 5, 2, 2, 2, 2, 1 },
		{ 3, 24, 7, 7, KILN_POOL_AVG, 7, 7, 1, 1, 0, 0, 1 }, /* global average */
		{ 8, 32, 32, 32, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 }, /* threads */
	};
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_POOL);
	for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
		for (int nhwc = 0; nhwc < 2; nhwc++)
			pool_case(&f, &cases[k], nhwc);
	fx_close(&f);
}
END_TEST

/* ---- batch normalisation ---------------------------------------------- */

/* x is [N, C, H, W] (dims4) or 2-d [N, C] (H = W = 1, ndim2). */
static void bn_case(struct fx *f, int N, int C, int H, int W, int nhwc, int ndim2)
{
	const size_t n = (size_t)N * C * H * W;
	const int M = N * H * W;
	const double eps = 1e-5, mom = 0.1;
	float *x = frandv(n), *dy = frandv(n), *gamma = frandv((size_t)C), *beta = frandv((size_t)C);
	float *rm = frandv((size_t)C), *rv = malloc((size_t)C * 4);
	for (size_t i = 0; i < n; i++) /* per-channel offsets: the variance must not cancel */
		x[i] = 3.0f + (float)((i / ((size_t)H * W)) % C) + 2.0f * x[i];
	for (int c = 0; c < C; c++)
		rv[c] = 0.5f + 0.25f * (float)c;
	double *mean = calloc((size_t)C, 8), *var = calloc((size_t)C, 8), *inv = calloc((size_t)C, 8);
	double *sdy = calloc((size_t)C, 8), *sdyx = calloc((size_t)C, 8), *sabs = calloc((size_t)C, 8);
#define XI(nn, c, hw) ((((size_t)(nn) * C + (c)) * H * W) + (hw))
	for (int c = 0; c < C; c++) {
		for (int nn = 0; nn < N; nn++)
			for (int hw = 0; hw < H * W; hw++)
				mean[c] += x[XI(nn, c, hw)];
		mean[c] /= M;
		for (int nn = 0; nn < N; nn++)
			for (int hw = 0; hw < H * W; hw++) {
				double d = x[XI(nn, c, hw)] - mean[c];
				var[c] += d * d;
				sdy[c] += dy[XI(nn, c, hw)];
				sdyx[c] += dy[XI(nn, c, hw)] * d;
				/* the saved mean is f32: its rounding scales with |mean| */
				sabs[c] += fabs(dy[XI(nn, c, hw)]) * (fabs(d) + fabs(mean[c]));
			}
		var[c] /= M;
		inv[c] = 1.0 / sqrt(var[c] + eps);
	}
	char tag[96];
	snprintf(tag, sizeof tag, "%s [%d,%d,%d,%d]", ndim2 ? "2-d" : nhwc ? "NHWC" : "NCHW", N, C, H, W);

	struct kiln_tensor_desc xd = ndim2 ? td(KILN_F32, 2, N, C) : td4(N, C, H, W, nhwc);
	struct kiln_tensor_desc cd = td(KILN_F32, 1, C, 0), sd = td(KILN_F32, 2, 2, C);
	float *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, nhwc, &k1), *dDY = dput4(f, dy, N, C, H, W, nhwc, &k2);
	void *dG = dput(f, gamma, (size_t)C * 4), *dB = dput(f, beta, (size_t)C * 4);
	void *dRM = dput(f, rm, (size_t)C * 4), *dRV = dput(f, rv, (size_t)C * 4);
	void *dY = dput(f, NULL, n * 4), *dS = dput(f, NULL, (size_t)C * 8);
	void *dDX = dput(f, NULL, n * 4), *dDG = dput(f, NULL, (size_t)C * 4);
	void *dDB = dput(f, NULL, (size_t)C * 4);

	/* training */
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_TRAIN;
	op.n_in = 3, op.n_out = 4;
	op.in[0] = op.out[0] = xd;
	op.in[1] = op.in[2] = op.out[2] = op.out[3] = cd;
	op.out[1] = sd;
	op.f[0] = eps, op.f[1] = mom;
	const void *in[5] = { dX, dG, dB };
	void *out[4] = { dY, dS, dRM, dRV };
	OK(run_op(f, &op, in, out));
	float *got = dget4(f, dY, N, C, H, W, nhwc), *hs = malloc((size_t)C * 8);
	for (size_t i = 0; i < n; i++) {
		int c = (int)((i / ((size_t)H * W)) % C);
		double want = (x[i] - mean[c]) * inv[c] * gamma[c] + beta[c];
		NEAR(got[i], want, fabs(want) + 1, 1e-5, "BN_TRAIN %s: y[%zu] = %.7g, want %.7g", tag, i,
		     got[i], want);
	}
	dget(f, hs, dS, (size_t)C * 8);
	float *hrm = malloc((size_t)C * 4), *hrv = malloc((size_t)C * 4);
	dget(f, hrm, dRM, (size_t)C * 4);
	dget(f, hrv, dRV, (size_t)C * 4);
	for (int c = 0; c < C; c++) {
		double wrm = (1 - mom) * rm[c] + mom * mean[c];
		double wrv = (1 - mom) * rv[c] + mom * var[c] * M / (M - 1);
		NEAR(hs[c], mean[c], fabs(mean[c]), 1e-5, "BN_TRAIN %s: mean[%d] %g want %g", tag, c, hs[c], mean[c]);
		NEAR(hs[C + c], inv[c], fabs(inv[c]), 1e-5, "BN_TRAIN %s: invstd[%d] %g want %g", tag, c, hs[C + c], inv[c]);
		NEAR(hrm[c], wrm, fabs(wrm), 1e-5, "BN_TRAIN %s: running_mean[%d] %g want %g", tag, c, hrm[c], wrm);
		NEAR(hrv[c], wrv, fabs(wrv), 1e-5, "BN_TRAIN %s: running_var[%d] %g want %g", tag, c, hrv[c], wrv);
	}
	free(got);

	/* backward from the saved statistics */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_BWD;
	op.n_in = 4, op.n_out = 3;
	op.in[0] = op.in[1] = op.out[0] = xd;
	op.in[2] = op.out[1] = op.out[2] = cd;
	op.in[3] = sd;
	in[0] = dX, in[1] = dDY, in[2] = dG, in[3] = dS;
	out[0] = dDX, out[1] = dDG, out[2] = dDB;
	OK(run_op(f, &op, in, out));
	got = dget4(f, dDX, N, C, H, W, nhwc);
	for (size_t i = 0; i < n; i++) {
		int c = (int)((i / ((size_t)H * W)) % C);
		double xh = (x[i] - mean[c]) * inv[c];
		double want = gamma[c] * inv[c] / M * (M * dy[i] - sdy[c] - xh * sdyx[c] * inv[c]);
		NEAR(got[i], want, fabs(gamma[c] * inv[c]) * (fabs(dy[i]) + 1), 1e-5,
		     "BN_BWD %s: dx[%zu] = %.7g, want %.7g", tag, i, got[i], want);
	}
	dget(f, hrm, dDG, (size_t)C * 4);
	dget(f, hrv, dDB, (size_t)C * 4);
	for (int c = 0; c < C; c++) {
		NEAR(hrm[c], sdyx[c] * inv[c], sabs[c] * inv[c], 1e-5,
		     "BN_BWD %s: dgamma[%d] %g want %g", tag, c, hrm[c], sdyx[c] * inv[c]);
		NEAR(hrv[c], sdy[c], fabs(sdy[c]) + M * 1e-2, 1e-5, "BN_BWD %s: dbeta[%d] %g want %g", tag,
		     c, hrv[c], sdy[c]);
	}
	free(got);

	/* inference with the (original) running statistics */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_INFER;
	op.n_in = 5, op.n_out = 1;
	op.in[0] = op.out[0] = xd;
	op.in[1] = op.in[2] = op.in[3] = op.in[4] = cd;
	op.f[0] = eps;
	void *dRM0 = dput(f, rm, (size_t)C * 4), *dRV0 = dput(f, rv, (size_t)C * 4);
	in[0] = dX, in[1] = dG, in[2] = dB, in[3] = dRM0, in[4] = dRV0;
	out[0] = dY;
	OK(run_op(f, &op, in, out));
	got = dget4(f, dY, N, C, H, W, nhwc);
	for (size_t i = 0; i < n; i++) {
		int c = (int)((i / ((size_t)H * W)) % C);
		double want = (x[i] - rm[c]) / sqrt(rv[c] + eps) * gamma[c] + beta[c];
		NEAR(got[i], want, fabs(want) + 1, 1e-5, "BN_INFER %s: y[%zu] = %.7g, want %.7g", tag, i,
		     got[i], want);
	}
	free(got);
#undef XI
	void *d[] = { dX, dDY, dG, dB, dRM, dRV, dY, dS, dDX, dDG, dDB, dRM0, dRV0 };
	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		kiln_device_free(f->dev, d[i]);
	free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(mean), free(var);
	free(inv), free(sdy), free(sdyx), free(sabs), free(hs), free(hrm), free(hrv), free(k1), free(k2);
}

/* SyncBatchNorm's ops: the batch of N samples is cut into G groups of
 * N/G (the ranks); each group's BN_STATS, gathered, feed every group's
 * BN_APPLY, and the groups' BN_BWD_REDUCE sums, added, feed BN_BWD_APPLY.
 * y, the saved statistics, the running statistics and dx must equal
 * batch normalisation of the whole batch (computed here in double, the
 * tolerances of bn_case); dgamma and dbeta of the groups must add up to
 * the whole batch's.  G = 1 is BN_TRAIN and BN_BWD split in two. */
static void bn_sync_case(struct fx *f, int N, int C, int H, int W, int nhwc, int ndim2, int G)
{
	const int Ng = N / G, HW = H * W;
	const size_t n = (size_t)N * C * HW, ng = (size_t)Ng * C * HW;
	const int M = N * HW;
	const double eps = 1e-5, mom = 0.1;
	float *x = frandv(n), *dy = frandv(n), *gamma = frandv((size_t)C), *beta = frandv((size_t)C);
	float *rm = frandv((size_t)C), *rv = malloc((size_t)C * 4);
	for (size_t i = 0; i < n; i++) /* per-channel and per-group offsets */
		x[i] = 3.0f + (float)((i / (size_t)HW) % C) + (float)(i / ng) + 2.0f * x[i];
	for (int c = 0; c < C; c++)
		rv[c] = 0.5f + 0.25f * (float)c;
	double *mean = calloc((size_t)C, 8), *var = calloc((size_t)C, 8), *inv = calloc((size_t)C, 8);
	double *sdy = calloc((size_t)C, 8), *sdyx = calloc((size_t)C, 8), *sabs = calloc((size_t)C, 8);
#define XI(nn, c, hw) ((((size_t)(nn) * C + (c)) * HW) + (hw))
	for (int c = 0; c < C; c++) {
		for (int nn = 0; nn < N; nn++)
			for (int hw = 0; hw < HW; hw++)
				mean[c] += x[XI(nn, c, hw)];
		mean[c] /= M;
		for (int nn = 0; nn < N; nn++)
			for (int hw = 0; hw < HW; hw++) {
				double d = x[XI(nn, c, hw)] - mean[c];
				var[c] += d * d;
				sdy[c] += dy[XI(nn, c, hw)];
				sdyx[c] += dy[XI(nn, c, hw)] * d;
				sabs[c] += fabs(dy[XI(nn, c, hw)]) * (fabs(d) + fabs(mean[c]));
			}
		var[c] /= M;
		inv[c] = 1.0 / sqrt(var[c] + eps);
	}
#undef XI
	char tag[96];
	snprintf(tag, sizeof tag, "%s [%d,%d,%d,%d] in %d group(s)",
		 ndim2 ? "2-d" : nhwc ? "NHWC" : "NCHW", N, C, H, W, G);
	struct kiln_tensor_desc xd = ndim2 ? td(KILN_F32, 2, Ng, C) : td4(Ng, C, H, W, nhwc);
	struct kiln_tensor_desc cd = td(KILN_F32, 1, C, 0), sd = td(KILN_F32, 2, 2, C);
	struct kiln_tensor_desc gd = td(KILN_F32, 2, 2 * G, C);
	void *dX[8], *dDY[8], *dY[8], *dDX[8], *dS[8], *dRM[8], *dRV[8], *dDG[8], *dDB[8], *dP[8];
	float *keep[16];
	void *dG = dput(f, gamma, (size_t)C * 4), *dB = dput(f, beta, (size_t)C * 4);
	void *dAll = dput(f, NULL, (size_t)G * C * 8), *dSum = dput(f, NULL, (size_t)C * 8);
	float *hall = malloc((size_t)G * C * 8), *hsum = calloc((size_t)C * 2, 4);
	float *hp = malloc((size_t)C * 8);
	struct kiln_op op;
	const void *in[6];
	void *out[4];
	for (int g = 0; g < G; g++) {
		dX[g] = dput4(f, x + g * ng, Ng, C, H, W, nhwc, &keep[2 * g]);
		dDY[g] = dput4(f, dy + g * ng, Ng, C, H, W, nhwc, &keep[2 * g + 1]);
		dY[g] = dput(f, NULL, ng * 4), dDX[g] = dput(f, NULL, ng * 4);
		dS[g] = dput(f, NULL, (size_t)C * 8), dP[g] = dput(f, NULL, (size_t)C * 8);
		dRM[g] = dput(f, rm, (size_t)C * 4), dRV[g] = dput(f, rv, (size_t)C * 4);
		dDG[g] = dput(f, NULL, (size_t)C * 4), dDB[g] = dput(f, NULL, (size_t)C * 4);
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_STATS;
		op.n_in = 1, op.n_out = 1;
		op.in[0] = xd, op.out[0] = sd;
		in[0] = dX[g], out[0] = dS[g];
		OK(run_op(f, &op, in, out));
		dget(f, hall + (size_t)g * 2 * C, dS[g], (size_t)C * 8); /* the allgather */
	}
	OK(kiln_device_copy_async(f->dev, dAll, hall, (size_t)G * C * 8, KILN_COPY_H2D, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
	for (int g = 0; g < G; g++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_APPLY;
		op.n_in = 4, op.n_out = 4;
		op.in[0] = op.out[0] = xd;
		op.in[1] = op.in[2] = op.out[2] = op.out[3] = cd;
		op.in[3] = gd, op.out[1] = sd;
		op.i[0] = G, op.f[0] = eps, op.f[1] = mom;
		in[0] = dX[g], in[1] = dG, in[2] = dB, in[3] = dAll;
		out[0] = dY[g], out[1] = dS[g], out[2] = dRM[g], out[3] = dRV[g];
		OK(run_op(f, &op, in, out));
		float *got = dget4(f, dY[g], Ng, C, H, W, nhwc);
		for (size_t i = 0; i < ng; i++) {
			int c = (int)((i / (size_t)HW) % C);
			double xi = x[g * ng + i], want = (xi - mean[c]) * inv[c] * gamma[c] + beta[c];
			NEAR(got[i], want, fabs(want) + 1, 1e-5, "BN_APPLY %s: group %d y[%zu] = %.7g, want %.7g",
			     tag, g, i, got[i], want);
		}
		free(got);
		float *hs = malloc((size_t)C * 8), *hrm = malloc((size_t)C * 4), *hrv = malloc((size_t)C * 4);
		dget(f, hs, dS[g], (size_t)C * 8);
		dget(f, hrm, dRM[g], (size_t)C * 4);
		dget(f, hrv, dRV[g], (size_t)C * 4);
		for (int c = 0; c < C; c++) {
			double wrm = (1 - mom) * rm[c] + mom * mean[c];
			double wrv = (1 - mom) * rv[c] + mom * var[c] * M / (M - 1);
			NEAR(hs[c], mean[c], fabs(mean[c]), 1e-5, "BN_APPLY %s: mean[%d] %g want %g", tag, c, hs[c], mean[c]);
			NEAR(hs[C + c], inv[c], fabs(inv[c]), 1e-5, "BN_APPLY %s: invstd[%d] %g want %g", tag, c, hs[C + c], inv[c]);
			NEAR(hrm[c], wrm, fabs(wrm), 1e-5, "BN_APPLY %s: running_mean[%d] %g want %g", tag, c, hrm[c], wrm);
			NEAR(hrv[c], wrv, fabs(wrv), 1e-5, "BN_APPLY %s: running_var[%d] %g want %g", tag, c, hrv[c], wrv);
		}
		free(hs), free(hrm), free(hrv);
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_BWD_REDUCE;
		op.n_in = 3, op.n_out = 3;
		op.in[0] = op.in[1] = xd, op.in[2] = sd;
		op.out[0] = op.out[1] = cd, op.out[2] = sd;
		in[0] = dX[g], in[1] = dDY[g], in[2] = dS[g];
		out[0] = dDG[g], out[1] = dDB[g], out[2] = dP[g];
		OK(run_op(f, &op, in, out));
		dget(f, hp, dP[g], (size_t)C * 8); /* the allreduce */
		float *hg = malloc((size_t)C * 4), *hb = malloc((size_t)C * 4);
		dget(f, hg, dDG[g], (size_t)C * 4);
		dget(f, hb, dDB[g], (size_t)C * 4);
		for (int c = 0; c < 2 * C; c++) {
			ck_assert_msg(hp[c] == (c < C ? hg[c] : hb[c - C]),
				      "BN_BWD_REDUCE %s: out2[%d] %g is not out%d[%d] %g", tag, c, hp[c],
				      c < C ? 0 : 1, c % C, c < C ? hg[c] : hb[c - C]);
			hsum[c] += hp[c];
		}
		free(hg), free(hb);
	}
	for (int c = 0; c < C; c++) {
		NEAR(hsum[c], sdyx[c] * inv[c], sabs[c] * inv[c], 1e-5,
		     "BN_BWD_REDUCE %s: sum of dgamma[%d] %g want %g", tag, c, hsum[c], sdyx[c] * inv[c]);
		NEAR(hsum[C + c], sdy[c], fabs(sdy[c]) + M * 1e-2, 1e-5,
		     "BN_BWD_REDUCE %s: sum of dbeta[%d] %g want %g", tag, c, hsum[C + c], sdy[c]);
	}
	OK(kiln_device_copy_async(f->dev, dSum, hsum, (size_t)C * 8, KILN_COPY_H2D, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
	for (int g = 0; g < G; g++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_BWD_APPLY;
		op.n_in = 5, op.n_out = 1;
		op.in[0] = op.in[1] = op.out[0] = xd;
		op.in[2] = cd, op.in[3] = op.in[4] = sd;
		op.i[0] = G;
		in[0] = dX[g], in[1] = dDY[g], in[2] = dG, in[3] = dS[g], in[4] = dSum;
		out[0] = dDX[g];
		OK(run_op(f, &op, in, out));
		float *got = dget4(f, dDX[g], Ng, C, H, W, nhwc);
		for (size_t i = 0; i < ng; i++) {
			int c = (int)((i / (size_t)HW) % C);
			double xi = x[g * ng + i], dyi = dy[g * ng + i];
			double xh = (xi - mean[c]) * inv[c];
			double want = gamma[c] * inv[c] / M * (M * dyi - sdy[c] - xh * sdyx[c] * inv[c]);
			NEAR(got[i], want, fabs(gamma[c] * inv[c]) * (fabs(dyi) + 1), 1e-5,
			     "BN_BWD_APPLY %s: group %d dx[%zu] = %.7g, want %.7g", tag, g, i, got[i], want);
		}
		free(got);
	}
	for (int g = 0; g < G; g++) {
		void *d[] = { dX[g], dDY[g], dY[g], dDX[g], dS[g], dP[g], dRM[g], dRV[g], dDG[g], dDB[g] };
		for (size_t i = 0; i < sizeof d / sizeof *d; i++)
			kiln_device_free(f->dev, d[i]);
		free(keep[2 * g]), free(keep[2 * g + 1]);
	}
	kiln_device_free(f->dev, dG), kiln_device_free(f->dev, dB);
	kiln_device_free(f->dev, dAll), kiln_device_free(f->dev, dSum);
	free(x), free(dy), free(gamma), free(beta), free(rm), free(rv), free(mean), free(var);
	free(inv), free(sdy), free(sdyx), free(sabs), free(hall), free(hsum), free(hp);
}

START_TEST(test_bn_sync)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_BN_STATS);
	for (int nhwc = 0; nhwc < 2; nhwc++)
		for (int G = 1; G <= 4; G *= 2) {
			bn_sync_case(&f, 4, 5, 7, 7, nhwc, 0, G);
			bn_sync_case(&f, 8, 6, 30, 30, nhwc, 0, G); /* parallel paths */
		}
	bn_sync_case(&f, 8, 6, 1, 1, 0, 1, 2);
	bn_sync_case(&f, 1000, 40, 1, 1, 0, 1, 4);
	fx_close(&f);
}
END_TEST

START_TEST(test_bn)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_BN_TRAIN);
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		bn_case(&f, 3, 5, 7, 7, nhwc, 0);
		bn_case(&f, 1, 4, 13, 13, nhwc, 0);
		bn_case(&f, 3, 16, 1, 1, nhwc, 0);
		bn_case(&f, 8, 6, 30, 30, nhwc, 0); /* parallel paths */
		bn_case(&f, 100, 70, 1, 1, nhwc, 0);
	}
	bn_case(&f, 7, 6, 1, 1, 0, 1);
	bn_case(&f, 1000, 40, 1, 1, 0, 1);
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
		NEAR(yh[i], y, fabs(y) + fabs(x[i]) * (kind == KILN_ACT_GELU), 1e-5,
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
	kiln_device_free(f->dev, dX);
	kiln_device_free(f->dev, dYo);
	kiln_device_free(f->dev, dDY);
	free(x), free(dy), free(dx0), free(got), free(yh);
}

START_TEST(test_act)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_ACT);
	for (int kind = KILN_ACT_RELU; kind <= KILN_ACT_TANH; kind++) {
		act_case(&f, kind, 17, 0.01f);
		act_case(&f, kind, 100003, 0.2f);
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
	philox4x32_ctr_t ctr = { { (uint32_t)e, (uint32_t)(e >> 32), layer, (uint32_t)step } };
	philox4x32_key_t key = { { (uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x44524f50u } };
	philox4x32_ctr_t r = philox4x32_R(10, ctr, key);
	return (double)(r.v[0] >> 8) / 16777216.0 >= p;
}

/* Dropout of logical [N,C,H,W] x in the given layout; returns logical y. */
static float *drop_run(struct fx *f, int bwd, const float *x, const float *y0, int N, int C,
		       int H, int W, int nhwc, double p, int64_t seed, int layer, int64_t step)
{
	float *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, nhwc, &k1), *dY = dput4(f, y0, N, C, H, W, nhwc, &k2);
	void *dS = dput(f, &step, 8);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT;
	op.flags = bwd == 2 ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = 2, op.n_out = 1;
	op.in[0] = op.out[0] = td4(N, C, H, W, nhwc);
	op.in[1] = td(KILN_I64, 1, 1, 0);
	op.i[0] = seed, op.i[1] = layer, op.f[0] = p;
	const void *in[2] = { dX, dS };
	void *out[1] = { dY };
	OK(run_op(f, &op, in, out));
	float *got = dget4(f, dY, N, C, H, W, nhwc);
	kiln_device_free(f->dev, dX);
	kiln_device_free(f->dev, dY);
	kiln_device_free(f->dev, dS);
	free(k1), free(k2);
	return got;
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
	/* p = 0 copies */
	float *y0 = drop_run(&f, 0, x, dy, N, C, H, W, 1, 0.0, seed, 7, step);
	ck_assert(!memcmp(y0, x, n * 4));
	free(y5), free(y6), free(y8), free(y0);
	free(x), free(dy), free(dx0);
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

/* ---- concat / split / reorder ----------------------------------------- */

/* Concat parts of extents ext[0..k) along dim d of a [N,C,H,W] (or 2-d
 * [N,C]) tensor, then split it back, every other part accumulating. */
static void concat_case(struct fx *f, const int *dims, int ndim, int nhwc, int d, const int *ext,
			int k)
{
	int full[4] = { dims[0], dims[1], ndim == 4 ? dims[2] : 1, ndim == 4 ? dims[3] : 1 };
	full[d] = 0;
	for (int j = 0; j < k; j++)
		full[d] += ext[j];
	const size_t nw = (size_t)full[0] * full[1] * full[2] * full[3];
	float *part[6], *keep[6], *whole = malloc(nw * 4), *acc0[6];
	void *dpart[6], *dpart2[6];
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONCAT;
	op.n_in = k, op.n_out = 1;
	op.i[0] = d;
	op.out[0] = ndim == 4 ? td4(full[0], full[1], full[2], full[3], nhwc) : td(KILN_F32, 2, full[0], full[1]);
	int off = 0;
	for (int j = 0; j < k; j++) {
		int pd[4] = { full[0], full[1], full[2], full[3] };
		pd[d] = ext[j];
		const size_t np = (size_t)pd[0] * pd[1] * pd[2] * pd[3];
		part[j] = frandv(np);
		acc0[j] = frandv(np);
		op.in[j] = ndim == 4 ? td4(pd[0], pd[1], pd[2], pd[3], nhwc) : td(KILN_F32, 2, pd[0], pd[1]);
		dpart[j] = dput4(f, part[j], pd[0], pd[1], pd[2], pd[3], nhwc, &keep[j]);
		/* reference: part j's element (a,b,c,e) is whole's with dim d shifted */
		size_t i = 0;
		for (int a = 0; a < pd[0]; a++)
			for (int b = 0; b < pd[1]; b++)
				for (int c = 0; c < pd[2]; c++)
					for (int e = 0; e < pd[3]; e++, i++) {
						int q[4] = { a, b, c, e };
						q[d] += off;
						whole[(((size_t)q[0] * full[1] + q[1]) * full[2] + q[2]) * full[3] + q[3]] = part[j][i];
					}
		off += ext[j];
	}
	void *dW = dput(f, NULL, nw * 4);
	void *out[4] = { dW };
	OK(run_op(f, &op, (const void *const *)dpart, out));
	float *got = dget4(f, dW, full[0], full[1], full[2], full[3], nhwc && ndim == 4);
	ck_assert_msg(!memcmp(got, whole, nw * 4), "CONCAT %s d=%d k=%d", nhwc ? "NHWC" : "NCHW", d, k);
	free(got);
	if (k <= KILN_OP_MAX_OUT) {
		/* SPLIT back: parts 0, 2 add into acc0, the others are written */
		struct kiln_op sp;
		memset(&sp, 0, sizeof sp);
		sp.type = KILN_OP_SPLIT;
		sp.n_in = 1, sp.n_out = k;
		sp.in[0] = op.out[0];
		for (int j = 0; j < k; j++)
			sp.out[j] = op.in[j];
		sp.i[0] = d, sp.i[1] = 5;
		float *keep2[6];
		for (int j = 0; j < k; j++) {
			int pd[4] = { full[0], full[1], full[2], full[3] };
			pd[d] = ext[j];
			dpart2[j] = dput4(f, acc0[j], pd[0], pd[1], pd[2], pd[3], nhwc && ndim == 4, &keep2[j]);
		}
		const void *in[1] = { dW };
		OK(run_op(f, &sp, in, dpart2));
		for (int j = 0; j < k; j++) {
			int pd[4] = { full[0], full[1], full[2], full[3] };
			pd[d] = ext[j];
			const size_t np = (size_t)pd[0] * pd[1] * pd[2] * pd[3];
			got = dget4(f, dpart2[j], pd[0], pd[1], pd[2], pd[3], nhwc && ndim == 4);
			for (size_t i = 0; i < np; i++) {
				float want = (5 >> j) & 1 ? acc0[j][i] + part[j][i] : part[j][i];
				ck_assert_msg(got[i] == want, "SPLIT %s d=%d part %d [%zu] = %g, want %g",
					      nhwc ? "NHWC" : "NCHW", d, j, i, got[i], want);
			}
			free(got);
			kiln_device_free(f->dev, dpart2[j]);
			free(keep2[j]);
		}
	}
	for (int j = 0; j < k; j++) {
		kiln_device_free(f->dev, dpart[j]);
		free(part[j]), free(keep[j]), free(acc0[j]);
	}
	kiln_device_free(f->dev, dW);
	free(whole);
}

START_TEST(test_concat_split)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_CONCAT);
	static const int dims[4] = { 3, 5, 7, 13 }, big[4] = { 2, 64, 17, 17 };
	static const int ext3[3] = { 1, 4, 2 }, ext6[6] = { 2, 1, 3, 1, 5, 2 }, ext2[2] = { 64, 32 };
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		for (int d = 0; d < 4; d++)
			concat_case(&f, dims, 4, nhwc, d, ext3, 3);
		concat_case(&f, dims, 4, nhwc, 1, ext6, 6);
		concat_case(&f, big, 4, nhwc, 1, ext2, 2);
		concat_case(&f, big, 4, nhwc, 0, ext3, 3); /* few long rows */
	}
	concat_case(&f, dims, 2, 0, 0, ext3, 3);
	concat_case(&f, dims, 2, 0, 1, ext3, 3);
	fx_close(&f);
}
END_TEST

static void reorder_case(struct fx *f, int N, int C, int H, int W, int from, int to, int acc)
{
	const size_t n = (size_t)N * C * H * W;
	float *x = frandv(n), *y0 = frandv(n), *k1, *k2;
	void *dX = dput4(f, x, N, C, H, W, from, &k1), *dY = dput4(f, y0, N, C, H, W, to, &k2);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_REORDER;
	op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = op.n_out = 1;
	op.in[0] = td4(N, C, H, W, from);
	op.out[0] = td4(N, C, H, W, to);
	const void *in[1] = { dX };
	void *out[1] = { dY };
	OK(run_op(f, &op, in, out));
	float *got = dget4(f, dY, N, C, H, W, to);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(got[i] == (acc ? y0[i] + x[i] : x[i]), "REORDER %d->%d acc %d [%zu] = %g",
			      from, to, acc, i, got[i]);
	kiln_device_free(f->dev, dX);
	kiln_device_free(f->dev, dY);
	free(x), free(y0), free(got), free(k1), free(k2);
}

START_TEST(test_reorder)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_REORDER);
	for (int from = 0; from < 2; from++)
		for (int to = 0; to < 2; to++)
			for (int acc = 0; acc < 2; acc++) {
				reorder_case(&f, 3, 5, 7, 13, from, to, acc);
				reorder_case(&f, 1, 1, 1, 1, from, to, acc);
				reorder_case(&f, 4, 40, 15, 15, from, to, acc);
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

/* ---- bf16 and f16 (docs/plugins.md, "Low-precision dtypes") ------------ */

static uint16_t h_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float h_wide(uint16_t h, int dt)
{
	if (dt == KILN_F16) {
		_Float16 x;
		memcpy(&x, &h, 2);
		return (float)x;
	}
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t h_round(float f, int dt)
{
	if (dt == KILN_F16) {
		_Float16 x = (_Float16)f;
		uint16_t h;
		memcpy(&h, &x, 2);
		return h;
	}
	return h_bf16(f);
}

/* n random values in dtype dt (x 'scale'), and their f32 widening */
static uint16_t *lp_rand(size_t n, int dt, float scale, float *wide)
{
	uint16_t *h = malloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		h[i] = h_round(frand() * scale, dt);
		wide[i] = h_wide(h[i], dt);
	}
	return h;
}

/* GEMM out0[M,N] = A B^T + bias with bf16 (native) or f16 (converted)
 * operands, out0 in the low dtype or f32 (weight gradients), against a
 * double loop over the widened operands. */
static void lp_gemm_case(struct fx *f, int dt, int M, int N, int K, int out_f32)
{
	float *aw = malloc(sizeof(float) * M * K), *bw = malloc(sizeof(float) * N * K);
	uint16_t *a = lp_rand((size_t)M * K, dt, 1, aw), *b = lp_rand((size_t)N * K, dt, 1, bw);
	float *bias = frandv((size_t)N);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 3, op.n_out = 1;
	op.in[0] = td(dt, 2, M, K), op.in[1] = td(dt, 2, N, K), op.in[2] = td(KILN_F32, 1, N, 0);
	op.out[0] = td(out_f32 ? KILN_F32 : dt, 2, M, N);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = M, op.i[3] = N, op.i[4] = K, op.f[0] = 1.0;
	const size_t ob = (size_t)M * N * (out_f32 ? 4 : 2);
	void *da = dput(f, a, (size_t)M * K * 2), *db = dput(f, b, (size_t)N * K * 2),
	     *dbias = dput(f, bias, sizeof(float) * N), *dc = dput(f, NULL, ob);
	const void *in[3] = { da, db, dbias };
	void *out[1] = { dc };
	OK(run_op(f, &op, in, out));
	void *c = malloc(ob);
	dget(f, c, dc, ob);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double ref = bias[j], mag = fabs(bias[j]);
			for (int k = 0; k < K; k++) {
				ref += (double)aw[i * K + k] * bw[j * K + k];
				mag += fabs((double)aw[i * K + k] * bw[j * K + k]);
			}
			const double got = out_f32 ? ((float *)c)[i * N + j]
						   : h_wide(((uint16_t *)c)[i * N + j], dt);
			/* f32 accumulation; one rounding of the result to dt */
			const double ulp = out_f32 ? 0 : dt == KILN_F16 ? 0x1p-11 : 0x1p-8;
			ck_assert_msg(fabs(got - ref) <= ulp * fabs(ref) + 1e-5 * mag,
				      "%s GEMM %dx%dx%d (out %s) [%d,%d]: %g, reference %g",
				      dt == KILN_F16 ? "f16" : "bf16", M, N, K, out_f32 ? "f32" : "low",
				      i, j, got, ref);
		}
	kiln_device_free(f->dev, da), kiln_device_free(f->dev, db);
	kiln_device_free(f->dev, dbias), kiln_device_free(f->dev, dc);
	free(a), free(b), free(aw), free(bw), free(bias), free(c);
}

/* Elementwise ops in dt: the result equals the f32 op on the widened
 * operands, rounded once (bit for bit).  ADD accumulating (y += x0 + x1),
 * RELU, RELU_BWD, SOFTMAX_XENT (logits and dlogits in dt). */
static void lp_elementwise(struct fx *f, int dt)
{
	const int n = 1000, R = 20, C = 50;
	float *w0 = malloc(sizeof(float) * n), *w1 = malloc(sizeof(float) * n),
	      *wy = malloc(sizeof(float) * n);
	uint16_t *x0 = lp_rand(n, dt, 4, w0), *x1 = lp_rand(n, dt, 4, w1), *y = lp_rand(n, dt, 4, wy);
	uint16_t *got = malloc(2 * n);
	struct kiln_op op;
	/* ADD, accumulate */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ADD, op.flags = KILN_OPF_ACCUMULATE, op.n_in = 2, op.n_out = 1;
	op.in[0] = op.in[1] = op.out[0] = td(dt, 1, n, 0);
	void *d0 = dput(f, x0, 2 * n), *d1 = dput(f, x1, 2 * n), *dy = dput(f, y, 2 * n);
	const void *in[3] = { d0, d1, NULL };
	void *out[2] = { dy, NULL };
	OK(run_op(f, &op, in, out));
	dget(f, got, dy, 2 * n);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == h_round(wy[i] + (w0[i] + w1[i]), dt), "ADD %d: %g vs %g", i,
			      h_wide(got[i], dt), wy[i] + (w0[i] + w1[i]));
	/* RELU then RELU_BWD (dx = y > 0 ? dy : 0), exact */
	op.type = KILN_OP_RELU, op.flags = 0, op.n_in = 1;
	OK(run_op(f, &op, in, out));
	dget(f, got, dy, 2 * n);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == (w0[i] < 0 ? 0 : x0[i]), "RELU %d", i);
	op.type = KILN_OP_RELU_BWD, op.n_in = 2;
	OK(run_op(f, &op, in, out));
	dget(f, got, dy, 2 * n);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == (w0[i] > 0 ? x1[i] : 0), "RELU_BWD %d", i);
	/* SOFTMAX_XENT: the f32 op on the widened logits, rounded */
	int32_t lab[20];
	for (int r = 0; r < R; r++)
		lab[r] = (r * 7) % C;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT, op.n_in = 2, op.n_out = 2;
	op.in[0] = op.out[0] = td(dt, 2, R, C), op.in[1] = td(KILN_I32, 1, R, 0);
	op.out[1] = td(KILN_F32, 1, 3, 0);
	op.i[0] = R, op.f[0] = 1.0 / R;
	float zero[3] = { 0 }, m_lp[3], m_32[3], *g32 = malloc(sizeof(float) * n);
	void *dl = dput(f, lab, sizeof lab), *dm = dput(f, zero, sizeof zero);
	const void *xin[2] = { d0, dl };
	void *xout[2] = { dy, dm };
	OK(run_op(f, &op, xin, xout));
	dget(f, got, dy, 2 * n);
	dget(f, m_lp, dm, sizeof m_lp);
	op.in[0] = op.out[0] = td(KILN_F32, 2, R, C);
	void *dw = dput(f, w0, sizeof(float) * n), *dg = dput(f, NULL, sizeof(float) * n);
	OK(kiln_device_copy_async(f->dev, dm, zero, sizeof zero, KILN_COPY_H2D, f->s));
	const void *xin32[2] = { dw, dl };
	void *xout32[2] = { dg, dm };
	OK(run_op(f, &op, xin32, xout32));
	dget(f, g32, dg, sizeof(float) * n);
	dget(f, m_32, dm, sizeof m_32);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == h_round(g32[i], dt), "SOFTMAX_XENT dlogits %d", i);
	ck_assert(m_lp[0] == m_32[0] && m_lp[1] == m_32[1] && m_lp[2] == m_32[2]);
	void *bufs[] = { d0, d1, dy, dl, dm, dw, dg };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(f->dev, bufs[i]);
	free(w0), free(w1), free(wy), free(x0), free(x1), free(y), free(got), free(g32);
}

/* CAST both ways (round to nearest even, f16 overflow to inf), and SGD's
 * compute-copy output: round(params after the step), a gated-off step
 * leaving both. */
static void lp_cast_sgd(struct fx *f, int dt)
{
	const int n = 777;
	float *p = frandv(n), *g = frandv(n), lr = 0.1f, after[777], back[777];
	p[0] = 1.0f + 0x1p-9f;  /* a bf16 tie: rounds to even (1.0) */
	p[1] = 70000.0f;        /* past f16's range: inf */
	uint16_t cp[777];
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CAST, op.n_in = op.n_out = 1;
	op.in[0] = td(KILN_F32, 1, n, 0), op.out[0] = td(dt, 1, n, 0);
	void *dp = dput(f, p, sizeof(float) * n), *dc = dput(f, NULL, 2 * n),
	     *dg = dput(f, g, sizeof(float) * n), *dlr = dput(f, &lr, sizeof lr),
	     *db = dput(f, NULL, sizeof(float) * n);
	const void *in[2] = { dp, dg };
	void *out[2] = { dc, NULL };
	OK(run_op(f, &op, in, out));
	dget(f, cp, dc, 2 * n);
	for (int i = 0; i < n; i++)
		ck_assert_msg(cp[i] == h_round(p[i], dt), "CAST to %d: element %d", dt, i);
	ck_assert(dt == KILN_F16 ? isinf(h_wide(cp[1], dt)) : h_wide(cp[0], dt) == 1.0f);
	op.in[0] = op.out[0], op.out[0] = td(KILN_F32, 1, n, 0);
	in[0] = dc, out[0] = db;
	OK(run_op(f, &op, in, out));
	dget(f, back, db, sizeof(float) * n);
	for (int i = 0; i < n; i++)
		ck_assert(!memcmp(&back[i], &(float){ h_wide(cp[i], dt) }, 4));
	/* SGD (no momentum) with the copy */
	p[1] = 0.5f;
	OK(kiln_device_copy_async(f->dev, dp, p, sizeof(float) * n, KILN_COPY_H2D, f->s));
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SGD, op.n_in = 2, op.n_out = 2;
	op.in[0] = td(KILN_F32, 1, n, 0), op.in[1] = td(KILN_F32, 1, 1, 0);
	op.out[0] = op.in[0], op.out[1] = td(dt, 1, n, 0);
	op.i[0] = n;
	in[0] = dg, in[1] = dlr, out[0] = dp, out[1] = dc;
	OK(run_op(f, &op, in, out));
	dget(f, after, dp, sizeof(float) * n);
	dget(f, cp, dc, 2 * n);
	for (int i = 0; i < n; i++) {
		ck_assert_msg(fabsf(after[i] - (p[i] - lr * g[i])) <= 1e-6f, "SGD %d", i);
		ck_assert_msg(cp[i] == h_round(after[i], dt), "SGD copy %d", i);
	}
	void *bufs[] = { dp, dc, dg, dlr, db };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(f->dev, bufs[i]);
	free(p), free(g);
}

/* Run `op` (its tensors described in dt where lp_in/lp_out bits say) with
 * lp inputs given as dt bits, then the same op in f32 on the widened
 * inputs; the dt outputs must equal the f32 ones rounded, the f32 outputs
 * be equal, bit for bit.  in32[i]: f32 data (widened) or raw bytes of a
 * non-float input, inlp[i]: dt bits for lp inputs; n_el: element counts. */
/* 0: bit for bit.  Else the products (GEMM, convolution) accumulate in
 * another order than the f32 kernel: |got - ref| <= one rounding of dt
 * + g_lp_tol * max |ref| of the output. */
static double g_lp_tol;

static void lp_same_as_f32(struct fx *f, struct kiln_op op, int dt, int lp_in, int lp_out,
			   const void *const *in32, const void *const *inlp, const int64_t *in_n,
			   const int64_t *out_n, const char *what)
{
	void *din[KILN_OP_MAX_IN] = { 0 }, *dout[KILN_OP_MAX_OUT] = { 0 };
	void *dref[KILN_OP_MAX_OUT] = { 0 }, *dinr[KILN_OP_MAX_IN] = { 0 };
	for (int i = 0; i < op.n_in; i++) {
		const size_t es = kiln_dtype_size(op.in[i].dtype);
		if (lp_in >> i & 1) {
			op.in[i].dtype = dt;
			din[i] = dput(f, inlp[i], 2 * (size_t)in_n[i]);
			dinr[i] = dput(f, in32[i], 4 * (size_t)in_n[i]);
		} else {
			din[i] = dinr[i] = dput(f, in32[i], es * (size_t)in_n[i]);
		}
	}
	struct kiln_op op32 = op;
	for (int i = 0; i < op.n_in; i++)
		if (lp_in >> i & 1)
			op32.in[i].dtype = KILN_F32;
	for (int i = 0; i < op.n_out; i++) {
		dout[i] = dput(f, NULL, 4 * (size_t)out_n[i]);
		dref[i] = dput(f, NULL, 4 * (size_t)out_n[i]);
		if (lp_out >> i & 1)
			op.out[i].dtype = dt;
	}
	OK(run_op(f, &op, (const void *const *)din, dout));
	OK(run_op(f, &op32, (const void *const *)dinr, dref));
	for (int i = 0; i < op.n_out; i++) {
		const size_t nb = 4 * (size_t)out_n[i];
		float *ref = malloc(nb);
		void *got = malloc(nb);
		dget(f, ref, dref[i], nb);
		dget(f, got, dout[i], nb);
		double mx = 0;
		for (int64_t e = 0; e < out_n[i]; e++)
			mx = fmax(mx, fabs(ref[e]));
		for (int64_t e = 0; e < out_n[i] && g_lp_tol > 0; e++) {
			const double g = lp_out >> i & 1 ? h_wide(((uint16_t *)got)[e], dt)
							 : ((float *)got)[e];
			const double ulp = lp_out >> i & 1 ? (dt == KILN_F16 ? 0x1p-11 : 0x1p-8) : 0;
			ck_assert_msg(fabs(g - ref[e]) <= ulp * fabs(ref[e]) + g_lp_tol * mx,
				      "%s %s out%d[%lld]: %g, f32 op %g", what,
				      dt == KILN_F16 ? "f16" : "bf16", i, (long long)e, g, ref[e]);
		}
		for (int64_t e = 0; e < out_n[i] && g_lp_tol == 0; e++) {
			if (lp_out >> i & 1)
				ck_assert_msg(((uint16_t *)got)[e] == h_round(ref[e], dt),
					      "%s %s out%d[%lld]: %g, f32 op rounded %g", what,
					      dt == KILN_F16 ? "f16" : "bf16", i, (long long)e,
					      h_wide(((uint16_t *)got)[e], dt), ref[e]);
			else if (op.out[i].dtype == KILN_F32)
				ck_assert_msg(!memcmp((float *)got + e, ref + e, 4),
					      "%s out%d[%lld]: %g vs f32 op %g", what, i, (long long)e,
					      ((float *)got)[e], ref[e]);
		}
		free(ref), free(got);
		kiln_device_free(f->dev, dout[i]), kiln_device_free(f->dev, dref[i]);
	}
	for (int i = 0; i < op.n_in; i++) {
		if (dinr[i] != din[i])
			kiln_device_free(f->dev, dinr[i]);
		kiln_device_free(f->dev, din[i]);
	}
}

/* BIAS_GRAD (bf16 rows into f32), DROPOUT (forward and backward), max and
 * average POOL forward (non-overlapping windows, both layouts) against
 * the f32 ops. */
static void lp_more(struct fx *f, int dt)
{
	const int R = 64, N = 40, n = R * N;
	float *w = malloc(sizeof(float) * n);
	uint16_t *x = lp_rand(n, dt, 2, w);
	int64_t step = 7, nn[2] = { n, 1 }, on[2] = { N, 0 };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BIAS_GRAD, op.n_in = 1, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, R, N), op.out[0] = td(KILN_F32, 1, N, 0);
	lp_same_as_f32(f, op, dt, 1, 0, (const void *const[]){ w }, (const void *const[]){ x }, nn,
		       on, "BIAS_GRAD");
	for (int bwd = 0; bwd < 2; bwd++) {
		memset(&op, 0, sizeof op);
		op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_F32, 2, R, N), op.in[1] = td(KILN_I64, 1, 1, 0);
		op.i[0] = 1234, op.i[1] = 3, op.f[0] = 0.3;
		on[0] = n;
		lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ w, &step },
			       (const void *const[]){ x, NULL }, nn, on, bwd ? "DROPOUT_BWD" : "DROPOUT");
	}
	/* (a device without pooling yet skips it) */
	for (int nhwc = 0; nhwc < 2 && !unsupported(f, KILN_OP_POOL); nhwc++)
		for (int kind = 0; kind < 2; kind++) {
			memset(&op, 0, sizeof op);
			op.type = KILN_OP_POOL, op.n_in = 1, op.n_out = 1;
			op.in[0] = td4(4, 5, 8, 16, nhwc), op.out[0] = td4(4, 5, 4, 8, nhwc);
			op.i[0] = kind, op.i[1] = op.i[2] = op.i[3] = op.i[4] = 2, op.i[7] = 1;
			int64_t pn[1] = { 4 * 5 * 8 * 16 }, po[1] = { 4 * 5 * 4 * 8 };
			lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ w },
				       (const void *const[]){ x }, pn, po, kind ? "avg POOL" : "max POOL");
		}
	/* REORDER NCHW -> NHWC in dt (a move), and f32 -> dt (the plan's input
	 * conversion: reordered and rounded) */
	for (int mixed = 0; mixed < 2; mixed++) {
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_REORDER, op.n_in = 1, op.n_out = 1;
		op.in[0] = td4(4, 5, 8, 16, 0), op.out[0] = td4(4, 5, 8, 16, 1);
		int64_t rn[1] = { n };
		lp_same_as_f32(f, op, dt, !mixed, 1, (const void *const[]){ w },
			       (const void *const[]){ x }, rn, rn, mixed ? "REORDER f32 in" : "REORDER");
	}
	free(w), free(x);
}

/* Convolution forward, backward data and backward weights (f32 weight
 * and bias gradients), both layouts; batchnorm training forward and
 * backward (f32 statistics); GELU and its backward; the bias add (f32
 * bias into dt rows); SCALE and MUL; CONCAT; AdamW's compute copy. */
static void lp_conv_bn(struct fx *f, int dt)
{
	const struct conv_g q = { 4, 8, 16, 10, 10, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const int64_t nx = 4 * 8 * 10 * 10, ny = 4 * 16 * 10 * 10, nw = 16 * 8 * 9;
	float *wx = malloc(sizeof(float) * nx), *wy = malloc(sizeof(float) * ny),
	      *ww = malloc(sizeof(float) * nw), *bias = frandv(16);
	uint16_t *hx = lp_rand(nx, dt, 1, wx), *hy = lp_rand(ny, dt, 1, wy), *hw = lp_rand(nw, dt, 0.3f, ww);
	struct kiln_op op;
	/* native bf16 kernels accumulate in their own order; f16 (converted)
	 * runs the f32 kernel itself: exact on the cpu.  Other devices'
	 * low-precision engines (cuDNN's tensor cores) accumulate in their own
	 * order for both. */
	g_lp_tol = dt == KILN_BF16 || strcmp(g_name, "cpu") ? 1e-5 : 0;
	/* (a device without convolution or batch norm yet skips them) */
	const int no_conv = unsupported(f, KILN_OP_CONV), no_bn = unsupported(f, KILN_OP_BN_TRAIN);
	for (int nhwc = 0; nhwc < 2 && !no_conv; nhwc++) {
		conv_op(&op, KILN_OP_CONV, &q, 10, 10, nhwc);
		lp_same_as_f32(f, op, dt, 3, 1, (const void *const[]){ wx, ww, bias },
			       (const void *const[]){ hx, hw, NULL }, (const int64_t[]){ nx, nw, 16 },
			       (const int64_t[]){ ny }, "CONV");
		conv_op(&op, KILN_OP_CONV_BWD_DATA, &q, 10, 10, nhwc);
		lp_same_as_f32(f, op, dt, 3, 1, (const void *const[]){ wy, ww },
			       (const void *const[]){ hy, hw }, (const int64_t[]){ ny, nw },
			       (const int64_t[]){ nx }, "CONV_BWD_DATA");
		conv_op(&op, KILN_OP_CONV_BWD_WEIGHTS, &q, 10, 10, nhwc);
		lp_same_as_f32(f, op, dt, 3, 0, (const void *const[]){ wx, wy },
			       (const void *const[]){ hx, hy }, (const int64_t[]){ nx, ny },
			       (const int64_t[]){ nw, 16 }, "CONV_BWD_WEIGHTS");
	}
	g_lp_tol = 0;
	/* batchnorm over [4, 16, 10, 10]: x, y, dy, dx in dt; the rest f32 */
	float *gam = frandv(16), *bet = frandv(16), rm[16] = { 0 }, rv[16], saved[32];
	for (int c = 0; c < 16; c++)
		rv[c] = 1, gam[c] += 1.5f;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_TRAIN, op.n_in = 3, op.n_out = 4;
	op.in[0] = op.out[0] = td4(4, 16, 10, 10, 0);
	op.in[1] = op.in[2] = op.out[2] = op.out[3] = td(KILN_F32, 1, 16, 0);
	op.out[1] = td(KILN_F32, 2, 2, 16);
	op.f[0] = 1e-5, op.f[1] = 0.1;
	if (!no_bn)
	lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ wy, gam, bet },
		       (const void *const[]){ hy, NULL, NULL }, (const int64_t[]){ ny, 16, 16 },
		       (const int64_t[]){ ny, 32, 16, 16 }, "BN_TRAIN");
	for (int c = 0; c < 16; c++) /* a mean and 1/std for the backward */
		saved[c] = 0.01f * c, saved[16 + c] = 1.0f + 0.05f * c;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_BWD, op.n_in = 4, op.n_out = 3;
	op.in[0] = op.in[1] = op.out[0] = td4(4, 16, 10, 10, 0);
	op.in[2] = op.out[1] = op.out[2] = td(KILN_F32, 1, 16, 0);
	op.in[3] = td(KILN_F32, 2, 2, 16);
	op.f[0] = 1e-5;
	if (!no_bn)
	lp_same_as_f32(f, op, dt, 3, 1, (const void *const[]){ wy, wy, gam, saved },
		       (const void *const[]){ hy, hy, NULL, NULL },
		       (const int64_t[]){ ny, ny, 16, 32 }, (const int64_t[]){ ny, 16, 16 }, "BN_BWD");
	(void)rm;
	/* GELU forward and backward */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ACT, op.n_in = 1, op.n_out = 1, op.i[0] = KILN_ACT_GELU;
	op.in[0] = op.out[0] = td(KILN_F32, 1, ny, 0);
	lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ wy }, (const void *const[]){ hy },
		       (const int64_t[]){ ny }, (const int64_t[]){ ny }, "ACT gelu");
	op.type = KILN_OP_ACT_BWD, op.n_in = 3;
	op.in[1] = op.in[2] = op.in[0];
	lp_same_as_f32(f, op, dt, 7, 1, (const void *const[]){ wy, wy, wy },
		       (const void *const[]){ hy, hy, hy }, (const int64_t[]){ ny, ny, ny },
		       (const int64_t[]){ ny }, "ACT_BWD gelu");
	/* BIAS_ADD: rows [ny/16, 16] in dt += f32 bias (in place: out0 read) */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BIAS_ADD, op.n_in = 1, op.n_out = 1;
	op.in[0] = td(KILN_F32, 1, 16, 0), op.out[0] = td(KILN_F32, 2, ny / 16, 16);
	{
		void *dyl = dput(f, hy, 2 * (size_t)ny), *dyr = dput(f, wy, 4 * (size_t)ny),
		     *db = dput(f, bias, 4 * 16);
		struct kiln_op o32 = op;
		op.out[0].dtype = dt;
		OK(run_op(f, &op, (const void *const[]){ db }, (void *const[]){ dyl }));
		OK(run_op(f, &o32, (const void *const[]){ db }, (void *const[]){ dyr }));
		uint16_t *g = malloc(2 * (size_t)ny);
		float *r = malloc(4 * (size_t)ny);
		dget(f, g, dyl, 2 * (size_t)ny);
		dget(f, r, dyr, 4 * (size_t)ny);
		for (int64_t e = 0; e < ny; e++)
			ck_assert_msg(g[e] == h_round(r[e], dt), "BIAS_ADD %lld", (long long)e);
		free(g), free(r);
		kiln_device_free(f->dev, dyl), kiln_device_free(f->dev, dyr), kiln_device_free(f->dev, db);
	}
	/* SCALE (accumulating) and MUL */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_MUL, op.n_in = 2, op.n_out = 1;
	op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, nx, 0);
	lp_same_as_f32(f, op, dt, 3, 1, (const void *const[]){ wx, wx }, (const void *const[]){ hx, hx },
		       (const int64_t[]){ nx, nx }, (const int64_t[]){ nx }, "MUL");
	/* CONCAT of x and x along channels (a move) */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONCAT, op.n_in = 2, op.n_out = 1, op.i[0] = 1;
	op.in[0] = op.in[1] = td4(4, 8, 10, 10, 1), op.out[0] = td4(4, 16, 10, 10, 1);
	lp_same_as_f32(f, op, dt, 3, 1, (const void *const[]){ wx, wx }, (const void *const[]){ hx, hx },
		       (const int64_t[]){ nx, nx }, (const int64_t[]){ 2 * nx }, "CONCAT");
	/* AdamW writes round(p) into its compute copy */
	{
		const int n = 300;
		float *p = frandv(n), *g = frandv(n), lr = 0.01f, zero[300] = { 0 }, after[300];
		int64_t t = 1;
		uint16_t cp[300];
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_ADAMW, op.n_in = 3, op.n_out = 4;
		op.in[0] = td(KILN_F32, 1, n, 0), op.in[1] = td(KILN_F32, 1, 1, 0);
		op.in[2] = td(KILN_I64, 1, 1, 0);
		op.out[0] = op.out[1] = op.out[2] = op.in[0], op.out[3] = td(dt, 1, n, 0);
		op.i[0] = n, op.f[0] = 0.9, op.f[1] = 0.999, op.f[2] = 1e-8, op.f[3] = 0.01;
		void *dg = dput(f, g, 4 * n), *dl = dput(f, &lr, 4), *dt1 = dput(f, &t, 8),
		     *dp = dput(f, p, 4 * n), *dm = dput(f, zero, 4 * n), *dv = dput(f, zero, 4 * n),
		     *dc = dput(f, NULL, 2 * n);
		OK(run_op(f, &op, (const void *const[]){ dg, dl, dt1 }, (void *const[]){ dp, dm, dv, dc }));
		dget(f, after, dp, 4 * n);
		dget(f, cp, dc, 2 * n);
		for (int i = 0; i < n; i++) {
			ck_assert_msg(after[i] != p[i], "ADAMW did not step %d", i);
			ck_assert_msg(cp[i] == h_round(after[i], dt), "ADAMW copy %d", i);
		}
		void *bufs[] = { dg, dl, dt1, dp, dm, dv, dc };
		for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
			kiln_device_free(f->dev, bufs[i]);
		free(p), free(g);
	}
	free(wx), free(wy), free(ww), free(bias), free(hx), free(hy), free(hw), free(gam), free(bet);
}

START_TEST(test_lowp)
{
	struct fx f;
	fx_open(&f, _i);
	for (int k = 0; k < 2; k++) {
		const int dt = k ? KILN_F16 : KILN_BF16;
		lp_gemm_case(&f, dt, 33, 40, 50, 0);
		lp_gemm_case(&f, dt, 16, 24, 64, 1);
		lp_elementwise(&f, dt);
		lp_cast_sgd(&f, dt);
		lp_more(&f, dt);
		lp_conv_bn(&f, dt);
	}
	fx_close(&f);
	/* the CPU's two kernels for bf16 GEMM and convolution ([plugin.cpu]
	 * bf16_gemm, bf16_conv; above: `auto`, whichever timed faster): each
	 * forced, against the same references */
	if (!strcmp(g_name, "cpu")) {
		static const char *const kern[] = { "bf16", "f32" };
		for (int k = 0; k < 2; k++) {
			struct fx g;
			char o1[64], o2[64];
			memset(&g, 0, sizeof g);
			snprintf(o1, sizeof o1, "plugin.cpu.bf16_conv=%s", kern[k]);
			snprintf(o2, sizeof o2, "plugin.cpu.bf16_gemm=%s", kern[k]);
			OK(kiln_registry_open(NULL, &g.reg));
			OK(kiln_config_new(&g.cfg));
			OK(kiln_config_override(g.cfg, o1));
			OK(kiln_config_override(g.cfg, o2));
			OK(kiln_config_validate(g.cfg, g.reg));
			OK(kiln_device_open(g.reg, g.cfg, g_name, 0, &g.dev));
			OK(kiln_device_stream_create(g.dev, &g.s));
			lp_gemm_case(&g, KILN_BF16, 33, 40, 50, 0);
			lp_gemm_case(&g, KILN_BF16, 16, 24, 64, 1);
			lp_conv_bn(&g, KILN_BF16);
			fx_close(&g);
		}
	}
}
END_TEST

/* ---- LAMB and the 1-based step count ----------------------------------- */

/* LAMB over 5 tensors (one empty, one spanning several of a device's
 * reduction chunks), with a weight-decay multiplier and a bf16 compute
 * copy, two steps, against a double loop of plugin.h's formula; then a
 * step count of 0 (LAMB and AdamW): EINVAL, nothing changed. */
START_TEST(test_lamb)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_LAMB);
	const int64_t T = 5, off[6] = { 0, 100, 100, 9100, 9137, 20000 }, n = 20000;
	const double b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
	float *g = frandv(n), *p = frandv(n), *dm = malloc(4 * n), lr = 0.01f;
	float *m = calloc(n, 4), *v = calloc(n, 4), *got = malloc(4 * n);
	double *rp = malloc(8 * n), *rm = calloc(n, 8), *rv = calloc(n, 8), *u = malloc(8 * n);
	uint16_t *cp = malloc(2 * n);
	for (int64_t i = 0; i < n; i++)
		rp[i] = p[i], dm[i] = (i % 3) ? 1.0f : 0.0f;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_LAMB, op.n_in = 5, op.n_out = 4;
	op.in[0] = td(KILN_F32, 1, n, 0), op.in[1] = td(KILN_F32, 1, 1, 0);
	op.in[2] = td(KILN_I64, 1, 1, 0), op.in[3] = td(KILN_I64, 1, T + 1, 0), op.in[4] = op.in[0];
	op.out[0] = op.out[1] = op.out[2] = op.in[0], op.out[3] = td(KILN_BF16, 1, n, 0);
	op.i[0] = n, op.f[0] = b1, op.f[1] = b2, op.f[2] = eps, op.f[3] = wd;
	void *dg = dput(&f, g, 4 * n), *dl = dput(&f, &lr, 4), *doff = dput(&f, off, sizeof off),
	     *dd = dput(&f, dm, 4 * n), *dp = dput(&f, p, 4 * n), *dmm = dput(&f, m, 4 * n),
	     *dv = dput(&f, v, 4 * n), *dc = dput(&f, NULL, 2 * n), *dt = dput(&f, NULL, 8);
	for (int64_t t = 1; t <= 2; t++) {
		OK(kiln_device_copy_async(f.dev, dt, &t, 8, KILN_COPY_H2D, f.s));
		OK(run_op(&f, &op, (const void *const[]){ dg, dl, dt, doff, dd },
			  (void *const[]){ dp, dmm, dv, dc }));
		const double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);
		for (int64_t k = 0; k < T; k++) {
			double pp = 0, uu = 0;
			for (int64_t i = off[k]; i < off[k + 1]; i++) {
				rm[i] = b1 * rm[i] + (1 - b1) * g[i];
				rv[i] = b2 * rv[i] + (1 - b2) * (double)g[i] * g[i];
				u[i] = (rm[i] / c1) / (sqrt(rv[i]) / sqrt(c2) + eps) + wd * dm[i] * rp[i];
				pp += rp[i] * rp[i], uu += u[i] * u[i];
			}
			const double r = pp > 0 && uu > 0 ? sqrt(pp) / sqrt(uu) : 1.0;
			for (int64_t i = off[k]; i < off[k + 1]; i++)
				rp[i] -= lr * r * u[i];
		}
	}
	dget(&f, got, dp, 4 * n);
	dget(&f, cp, dc, 2 * n);
	for (int64_t i = 0; i < n; i++) {
		NEAR(got[i], rp[i], fabs(rp[i]), 1e-5, "LAMB p[%lld] = %g, reference %g", (long long)i,
		     got[i], rp[i]);
		ck_assert_msg(cp[i] == h_bf16(got[i]), "LAMB copy %lld", (long long)i);
	}
	/* step count 0: EINVAL, at the run or the next sync (a device's
	 * stream error is sticky: each case on a device of its own) */
	const int64_t zero = 0;
	for (int adam = 0; adam < 2; adam++) {
		struct fx e;
		fx_open(&e, _i);
		struct kiln_op z = op;
		if (adam) {
			z.type = KILN_OP_ADAMW, z.n_in = 3, z.n_out = 3;
		}
		void *eg = dput(&e, g, 4 * n), *el = dput(&e, &lr, 4), *et = dput(&e, &zero, 8),
		     *eo = dput(&e, off, sizeof off), *ep = dput(&e, p, 4 * n),
		     *em = dput(&e, m, 4 * n), *ev = dput(&e, v, 4 * n), *ec = dput(&e, NULL, 2 * n);
		OK(kiln_device_stream_sync(e.dev, e.s));
		const kiln_status st =
			adam ? run_op(&e, &z, (const void *const[]){ eg, el, et }, (void *const[]){ ep, em, ev })
			     : run_op(&e, &z, (const void *const[]){ eg, el, et, eo, eg },
				      (void *const[]){ ep, em, ev, ec });
		ck_assert_int_eq(st, KILN_EINVAL);
		ck_assert_msg(strstr(kiln_last_error(), "1-based"), "%s", kiln_last_error());
		fx_close(&e);
	}
	void *bufs[] = { dg, dl, doff, dd, dp, dmm, dv, dc, dt };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(f.dev, bufs[i]);
	free(g), free(p), free(dm), free(m), free(v), free(got), free(rp), free(rm), free(rv), free(u);
	free(cp);
	fx_close(&f);
}
END_TEST

static Suite *make_device_suite(void)
{
	Suite *s = suite_create("device");
	struct {
		const char *name;
		const TTest *fn;
	} cases[] = {
		{ "gemm", test_gemm },
		{ "gemm_errors", test_gemm_errors },
		{ "op_checks", test_op_checks },
		{ "bias", test_bias },
		{ "relu", test_relu },
		{ "softmax_xent", test_softmax_xent },
		{ "softmax_bad_label", test_softmax_bad_label },
		{ "losses", test_losses },
		{ "sgd", test_sgd },
		{ "grad_clip", test_grad_clip },
		{ "unscale", test_unscale },
		{ "scaler_update", test_scaler_update },
		{ "xent_loss_scale", test_xent_loss_scale },
		{ "fill", test_fill },
		{ "reduce_scale_add", test_reduce_scale_add },
		{ "small_ops", test_small_ops },
		{ "conv", test_conv },
		{ "conv_errors", test_conv_errors },
		{ "pool", test_pool },
		{ "bn", test_bn },
		{ "bn_sync", test_bn_sync },
		{ "act", test_act },
		{ "dropout", test_dropout },
		{ "concat_split", test_concat_split },
		{ "reorder", test_reorder },
		{ "stream_order", test_stream_order },
		{ "counters", test_counters },
		{ "close_live", test_close_live },
		{ "lowp", test_lowp },
		{ "lamb", test_lamb },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		TCase *tc = tcase_create(cases[i].name);
		tcase_set_timeout(tc, 120);
		tcase_add_loop_test(tc, cases[i].fn, 0, 2); /* _i: 0 sync, 1 async */
		suite_add_tcase(s, tc);
	}
	TCase *tc = tcase_create("dropout_threads");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_dropout_threads);
	suite_add_tcase(s, tc);
	tc = tcase_create("sticky_error");
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

	/* Skip (77) when the device cannot be opened here.  A GPU runtime
	 * must not be initialised in a process that forks afterwards (CUDA is
	 * not fork-safe, and Check forks every test), so for any device but
	 * the cpu the trial open happens in a child of its own. */
	if (!strcmp(g_name, "cpu")) {
		struct fx f;
		if (fx_try_open(&f, 0)) {
			printf("device '%s' not available, skipping: %s\n", g_name, kiln_last_error());
			return 77;
		}
		fx_close(&f);
	} else {
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0) {
			struct fx f;
			if (fx_try_open(&f, 0)) {
				printf("device '%s' not available, skipping: %s\n", g_name,
				       kiln_last_error());
				fflush(stdout);
				_exit(77);
			}
			fx_close(&f);
			_exit(0);
		}
		int ws = 0;
		if (waitpid(pid, &ws, 0) < 0 || !WIFEXITED(ws)) {
			printf("device '%s': the trial open crashed\n", g_name);
			return 1;
		}
		if (WEXITSTATUS(ws))
			return WEXITSTATUS(ws);
		printf("device '%s' is available: running the conformance suite on it\n", g_name);
	}

	SRunner *sr = srunner_create(make_device_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
