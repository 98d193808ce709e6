/* tests/check_device_gemm.c - device conformance:
 * GEMM (with the core's op checks and its errors, and fused activations),
 * bias and ReLU (and the ReLU backward's folded bias gradient).
 *
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "internal.h" /* kiln_op_abi_minor */
#include "check_main.h"

#include <kiln/plugin.h> /* KILN_ABI_MINOR */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GEMM ------------------------------------------------------------- */

/* An f32 GEMM op: out0[M,N] (+= with beta) alpha op(in0) op(in1) (+ in2[N] with bias). */
static void gemm_f32(struct kiln_op *op, int M, int N, int K, int ta, int tb, float alpha,
		     int beta, int bias)
{
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_GEMM;
	op->flags = beta ? KILN_OPF_ACCUMULATE : 0;
	op->n_in = bias ? 3 : 2;
	op->n_out = 1;
	op->in[0] = ta ? td(KILN_F32, 2, K, M) : td(KILN_F32, 2, M, K);
	op->in[1] = tb ? td(KILN_F32, 2, N, K) : td(KILN_F32, 2, K, N);
	op->in[2] = td(KILN_F32, 1, N, 0);
	op->out[0] = td(KILN_F32, 2, M, N);
	op->i[0] = ta, op->i[1] = tb, op->i[2] = M, op->i[3] = N, op->i[4] = K;
	op->f[0] = alpha;
}

static void gemm_case(struct fx *f, int M, int N, int K, int ta, int tb, float alpha, int beta,
		      int bias)
{
	float *A = frandv((size_t)M * K), *B = frandv((size_t)K * N), *C0 = frandv((size_t)M * N);
	float *Bi = frandv((size_t)N), *C = malloc((size_t)M * N * sizeof *C);
	struct kiln_op op;
	gemm_f32(&op, M, N, K, ta, tb, alpha, beta, bias);

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
	DFREE(f, dA, dB, dBi, dC);
	free(A), free(B), free(C0), free(Bi), free(C);
}

/* act(x) of enum kiln_act in double: the references of the fused cases */
static double act_ref(int kind, double x)
{
	switch (kind) {
	case KILN_ACT_RELU: return x > 0 ? x : 0;
	case KILN_ACT_LEAKY_RELU: return x > 0 ? x : 0.1 * x;
	case KILN_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
	case KILN_ACT_SIGMOID: return 1 / (1 + exp(-x));
	case KILN_ACT_TANH: return tanh(x);
	default: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
	}
}

/* An f32 GEMM C[M,N] = op(A) op(B) (+ bias) with an activation `kind`
 * applied when flags has KILN_OPF_ACT: the op both fused-epilogue cases
 * below run. */
static struct kiln_op gemm_act_op(int M, int N, int K, int ta, int tb, int bias, int32_t flags, int kind)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.flags = flags;
	op.n_in = bias ? 3 : 2;
	op.n_out = 1;
	op.in[0] = ta ? td(KILN_F32, 2, K, M) : td(KILN_F32, 2, M, K);
	op.in[1] = tb ? td(KILN_F32, 2, N, K) : td(KILN_F32, 2, K, N);
	op.in[2] = td(KILN_F32, 1, N, 0);
	op.out[0] = td(KILN_F32, 2, M, N);
	op.i[0] = ta, op.i[1] = tb, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.i[KILN_OPI_ACT] = kind;
	op.f[0] = 1;
	return op;
}

/* GEMM with a fused activation (KILN_OPF_ACT, ABI 2.3): out0 =
 * act(op(A) op(B) + bias).  ReLU must fuse on every device; another kind a
 * device may refuse (KILN_ENOTSUP: the layer then runs an ACT after it). */
static void gemm_act_case(struct fx *f, int M, int N, int K, int ta, int tb, int bias, int kind)
{
	float *A = frandv((size_t)M * K), *B = frandv((size_t)K * N), *Bi = frandv((size_t)N);
	float *C = calloc((size_t)M * N, sizeof *C);
	struct kiln_op op = gemm_act_op(M, N, K, ta, tb, bias, KILN_OPF_ACT, kind);
	op.f[KILN_OPF_ACT_ALPHA] = 0.1;
	void *dA = dput(f, A, (size_t)M * K * 4), *dB = dput(f, B, (size_t)K * N * 4);
	void *dBi = dput(f, Bi, (size_t)N * 4), *dC = dput(f, C, (size_t)M * N * 4);
	const void *in[3] = { dA, dB, dBi };
	void *out[1] = { dC };
	kiln_status st = run_op(f, &op, in, out);
	ck_assert_msg(st == KILN_OK || (st == KILN_ENOTSUP && kind != KILN_ACT_RELU),
		      "fused GEMM act %d: status %d (%s)", kind, st, kiln_last_error());
	if (!st)
		dget(f, C, dC, (size_t)M * N * 4);
	for (int m = 0; !st && m < M; m++)
		for (int n = 0; n < N; n++) {
			double s = bias ? Bi[n] : 0, mag = bias ? fabs(Bi[n]) : 0;
			for (int k = 0; k < K; k++) {
				double a = ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
				double b = tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n];
				s += a * b;
				mag += fabs(a * b);
			}
			NEAR(C[m * N + n], act_ref(kind, s), mag, 1e-5,
			     "fused GEMM M=%d N=%d K=%d tA=%d tB=%d bias=%d act=%d: C[%d,%d] = %.7g, want %.7g",
			     M, N, K, ta, tb, bias, kind, m, n, C[m * N + n], act_ref(kind, s));
		}
	DFREE(f, dA, dB, dBi, dC);
	free(A), free(B), free(Bi), free(C);
}

START_TEST(test_gemm_act)
{
	static const int sz[] = { 1, 7, 129 };
	struct fx f;
	fx_open(&f, _i);
	for (int kind = KILN_ACT_RELU; kind <= KILN_ACT_GELU_TANH; kind++)
		for (int mi = 0; mi < 3; mi++)
			for (int t = 0; t < 4; t++)
				for (int bias = 0; bias < 2; bias++)
					gemm_act_case(&f, sz[mi], sz[2 - mi], 33, t & 1, t >> 1, bias, kind);
	fx_close(&f);
}
END_TEST

/* A frozen GEMM (KILN_OPF_FROZEN: a linear layer's forward in an
 * inference plan; the CPU device keeps its weights in the matmul's
 * blocked layout from the second run that reads them, with the bias and
 * the activation in the matmul's epilogue: plugins/cpu/gemm.c) gives the
 * bytes of the same GEMM without the flag, on each of four runs (the
 * first on the weights as they are, the second reorders and keeps them,
 * the others read the copy), then, after new weights written in place
 * and told (kiln_device_weights_written), the new weights' bytes: for
 * either transpose, with and without bias and fused ReLU. */
static void gemm_frozen_case(struct fx *f, int M, int N, int K, int ta, int tb, int bias, int act)
{
	float *A = frandv((size_t)M * K), *B = frandv((size_t)K * N), *B2 = frandv((size_t)K * N);
	float *Bi = frandv((size_t)N), *want = calloc((size_t)M * N, 4), *got = calloc((size_t)M * N, 4);
	struct kiln_op op = gemm_act_op(M, N, K, ta, tb, bias, act ? KILN_OPF_ACT : 0, KILN_ACT_RELU);
	struct kiln_op fop = op;
	fop.flags |= KILN_OPF_FROZEN;
	const size_t bb = (size_t)K * N * 4, cb = (size_t)M * N * 4;
	void *dA = dput(f, A, (size_t)M * K * 4), *dB = dput(f, B, bb), *dBi = dput(f, Bi, (size_t)N * 4);
	void *dC = dput(f, NULL, cb), *dF = dput(f, NULL, cb), *ws = NULL, *fws = NULL;
	void *plan = NULL, *fplan = NULL;
	size_t wsb = 0, fwsb = 0;
	OK(kiln_device_prepare(f->dev, &op, &plan, &wsb));
	OK(kiln_device_prepare(f->dev, &fop, &fplan, &fwsb));
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	if (fwsb)
		OK(kiln_device_alloc(f->dev, fwsb, &fws));
	const struct kiln_op_args a = { .in = { dA, dB, dBi }, .out = { dC }, .workspace = ws,
					.workspace_bytes = wsb };
	const struct kiln_op_args fa = { .in = { dA, dB, dBi }, .out = { dF }, .workspace = fws,
					 .workspace_bytes = fwsb };
	for (int w = 0; w < 2; w++) {
		if (w) { /* new weights in place, told as the core tells */
			OK(kiln_device_copy_async(f->dev, dB, B2, bb, KILN_COPY_H2D, f->s));
			OK(kiln_device_stream_sync(f->dev, f->s));
			kiln_device_weights_written(f->dev, (const void *const[]){ dB }, &bb, 1);
		}
		OK(kiln_device_run(f->dev, plan, &a, f->s));
		dget(f, want, dC, cb);
		for (int r = 0; r < 4; r++) {
			OK(kiln_device_run(f->dev, fplan, &fa, f->s));
			dget(f, got, dF, cb);
			ck_assert_msg(!memcmp(got, want, cb),
				      "frozen GEMM M=%d N=%d K=%d tA=%d tB=%d bias=%d relu=%d, weights %d, run %d: other bytes than the GEMM without the flag (C[0] %.9g, want %.9g)",
				      M, N, K, ta, tb, bias, act, w + 1, r + 1, got[0], want[0]);
		}
	}
	/* and the new weights' values (the plain GEMM's, checked above) */
	ck_assert_msg(memcmp(B, B2, bb), "B and B2 equal: no test");
	kiln_device_plan_free(f->dev, plan);
	kiln_device_plan_free(f->dev, fplan);
	DFREE(f, dA, dB, dBi, dC, dF, ws, fws);
	free(A), free(B), free(B2), free(Bi), free(want), free(got);
}

START_TEST(test_gemm_frozen)
{
	struct fx f;
	fx_open(&f, _i);
	if (!kiln_device_takes_frozen(f.dev)) {
		fx_close(&f);
		return;
	}
	static const int rows[] = { 1, 7, 129 };
	for (int mi = 0; mi < 3; mi++)
		for (int t = 0; t < 4; t++)
			for (int ba = 0; ba < 4; ba++)
				gemm_frozen_case(&f, rows[mi], 96, 70, t & 1, t >> 1, ba & 1, ba >> 1);
	fx_close(&f);
}
END_TEST

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

/* A stage's weight gradient over a step's micro-batches (linear's dW,
 * core/layers/linear.c): dW[N,K] = dy[R,N]^T x[R,K] written by the first
 * micro-batch, then added (KILN_OPF_ACCUMULATE) by the others, R rows
 * each.  Against the sum in double, and on the cpu device against the
 * matmul's sum post-op it used before session 9 (KILN_CPU_GEMM_SUM; now
 * dnnl_sgemm with beta = 1, plugins/cpu/gemm.c): equal to float
 * tolerance. */
static float *dw_steps(struct fx *f, int N, int K, int R, int steps, const float *dy,
		       const float *x)
{
	float *dw = malloc((size_t)N * K * sizeof *dw);
	void *dW = dput(f, NULL, (size_t)N * K * 4);
	for (int s = 0; s < steps; s++) {
		struct kiln_op op; /* dy [R,N] read transposed, x [R,K] */
		gemm_f32(&op, N, K, R, 1, 0, 1.0f, s > 0, 0);
		void *dY = dput(f, dy + (size_t)s * R * N, (size_t)R * N * 4);
		void *dX = dput(f, x + (size_t)s * R * K, (size_t)R * K * 4);
		const void *in[2] = { dY, dX };
		void *out[1] = { dW };
		OK(run_op(f, &op, in, out));
		DFREE(f, dY, dX);
	}
	dget(f, dw, dW, (size_t)N * K * 4);
	DFREE(f, dW);
	return dw;
}

START_TEST(test_gemm_dw_accum)
{
	static const int shape[][4] = { { 1024, 1024, 16, 4 }, { 129, 1587, 32, 3 }, { 7, 33, 1, 3 } };
	struct fx f;
	fx_open(&f, _i);
	for (size_t c = 0; c < sizeof shape / sizeof *shape; c++) {
		const int N = shape[c][0], K = shape[c][1], R = shape[c][2], S = shape[c][3];
		float *dy = frandv((size_t)S * R * N), *x = frandv((size_t)S * R * K);
		float *got = dw_steps(&f, N, K, R, S, dy, x), *sum = NULL;
		if (!strcmp(g_name, "cpu")) { /* the matmul's sum post-op */
			setenv("KILN_CPU_GEMM_SUM", "1", 1);
			sum = dw_steps(&f, N, K, R, S, dy, x);
			unsetenv("KILN_CPU_GEMM_SUM");
		}
		for (int n = 0; n < N; n++)
			for (int k = 0; k < K; k++) {
				double want = 0, mag = 0;
				for (int r = 0; r < S * R; r++) {
					const double p = (double)dy[(size_t)r * N + n] * x[(size_t)r * K + k];
					want += p;
					mag += fabs(p);
				}
				const float g = got[(size_t)n * K + k];
				NEAR(g, want, mag, 1e-5,
				     "dW %dx%d, %d micro-batches of %d rows: [%d,%d] = %.7g, want %.7g", N,
				     K, S, R, n, k, g, want);
				if (sum)
					NEAR(g, sum[(size_t)n * K + k], mag, 1e-6,
					     "dW %dx%d, %d micro-batches of %d rows: [%d,%d] = %.7g, the sum post-op's %.7g",
					     N, K, S, R, n, k, g, sum[(size_t)n * K + k]);
			}
		free(dy), free(x), free(got), free(sum);
	}
	fx_close(&f);
}
END_TEST

/* The written weight gradient (linear's dW of a step's first micro-batch:
 * dy[R,N]^T x[R,K], beta = 0).  On the cpu device dnnl_sgemm with beta = 0
 * up to 383 rows (plugins/cpu/gemm.c, CPU_SGEMM_WRITE_K; session 45: the
 * brgemm matmul's stores to a result the optimizer had read last made the
 * pipeline's first backward of a step its stage's longest): bit for bit
 * the matmul it ran before (KILN_CPU_GEMM_WRITE_MATMUL), at 1 to 383 rows
 * and the mirror model's widths (bench/pipeline.sh), on the fixture's
 * team and on one of 8 threads; NaN in the output before the run is not
 * read (beta = 0).  prepare says which kernel ran (its debug line): sgemm
 * to 383 rows, the matmul from 384 (where sgemm splits K between 8 threads
 * or more: 128x128 and 64x255 differ; from 385 its K blocks round
 * differently), and on every device the result is the sum in double. */
struct gemm_said {
	char text[4096];
};

static void gemm_said_sink(void *user, int level, const char *who, const char *msg)
{
	struct gemm_said *l = user;
	(void)level;
	if (!strcmp(who, "cpu") && !strncmp(msg, "GEMM M=", 7))
		snprintf(l->text, sizeof l->text, "%s", msg); /* the latest */
}

/* dW written (R rows) with every output element NaN before; the
 * prepare's GEMM line in said (cpu) */
static float *dw_write(struct fx *f, int N, int K, int R, const float *dy, const float *x,
		       struct gemm_said *said)
{
	const size_t n = (size_t)N * K;
	float *dw = malloc(n * sizeof *dw);
	for (size_t i = 0; i < n; i++)
		dw[i] = NAN;
	void *dW = dput(f, dw, n * 4), *dY = dput(f, dy, (size_t)R * N * 4),
	     *dX = dput(f, x, (size_t)R * K * 4);
	struct kiln_op op;
	gemm_f32(&op, N, K, R, 1, 0, 1.0f, 0, 0);
	const void *in[2] = { dY, dX };
	void *out[1] = { dW };
	const int level = kiln_log_get_level();
	said->text[0] = 0;
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(gemm_said_sink, said);
	const kiln_status st = run_op(f, &op, in, out);
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	OK(st);
	dget(f, dw, dW, n * 4);
	DFREE(f, dW, dY, dX);
	return dw;
}

/* One written dW of R rows on f: the kernel its prepare names (cpu), the
 * sum in double, and (cpu, sgemm) the matmul's bits. */
static void dw_write_check(struct fx *f, int N, int K, int R, const char *team)
{
	const int cpu = !strcmp(g_name, "cpu"), sgemm = R <= 383;
	float *dy = frandv((size_t)R * N), *x = frandv((size_t)R * K), *mm = NULL;
	struct gemm_said said, said_mm;
	float *got = dw_write(f, N, K, R, dy, x, &said);
	if (cpu) {
		setenv("KILN_CPU_GEMM_WRITE_MATMUL", "1", 1);
		mm = dw_write(f, N, K, R, dy, x, &said_mm);
		unsetenv("KILN_CPU_GEMM_WRITE_MATMUL");
		ck_assert_msg(!sgemm == !strstr(said.text, "(sgemm, beta = 0)"),
			      "dW %dx%d of %d rows (%s): %s, want %s", N, K, R, team, said.text,
			      sgemm ? "sgemm" : "the matmul");
		ck_assert_msg(!strstr(said_mm.text, "sgemm"),
			      "dW %dx%d of %d rows (%s) with KILN_CPU_GEMM_WRITE_MATMUL: %s", N, K, R,
			      team, said_mm.text);
	}
	for (int n = 0; n < N; n++)
		for (int k = 0; k < K; k++) {
			double want = 0, mag = 0;
			for (int r = 0; r < R; r++) {
				const double p = (double)dy[(size_t)r * N + n] * x[(size_t)r * K + k];
				want += p;
				mag += fabs(p);
			}
			const float g = got[(size_t)n * K + k];
			NEAR(g, want, mag, 1e-5, "dW %dx%d of %d rows (%s) written: [%d,%d] = %.7g, want %.7g",
			     N, K, R, team, n, k, g, want);
		}
	if (mm)
		ck_assert_msg(!memcmp(got, mm, (size_t)N * K * sizeof *got),
			      "dW %dx%d of %d rows (%s): %s's bits are not the matmul's", N, K, R, team,
			      sgemm ? "sgemm" : "the matmul (KILN_CPU_GEMM_WRITE_MATMUL)");
	free(dy), free(x), free(got), free(mm);
}

START_TEST(test_gemm_dw_write)
{
	/* N (the layer's outputs), K (its inputs), R (rows) */
	static const int shape[][3] = { { 1024, 1024, 16 }, { 16, 1024, 16 }, { 1024, 16, 16 },
					{ 1024, 1024, 64 }, { 129, 1587, 32 }, { 7, 33, 1 },
					{ 300, 77, 383 }, { 300, 77, 384 }, { 300, 77, 385 },
					{ 128, 128, 383 }, { 128, 128, 384 }, { 64, 255, 384 },
					{ 64, 96, 1000 } };
	/* at 384 rows sgemm splits K between 8 threads or more: a team of 8
	 * (on any machine: the threads may share cores) */
	static const int wide[][3] = { { 128, 128, 383 }, { 64, 255, 383 }, { 128, 128, 384 },
				       { 64, 255, 384 }, { 48, 128, 384 }, { 64, 64, 384 } };
	/* the environment's A/B hook keeps the matmul for every written dW:
	 * nothing here to compare */
	if (!strcmp(g_name, "cpu") && getenv("KILN_CPU_GEMM_WRITE_MATMUL")) {
		printf("test_gemm_dw_write: skipped, KILN_CPU_GEMM_WRITE_MATMUL is set\n");
		return;
	}
	struct fx f;
	fx_open(&f, _i);
	for (size_t c = 0; c < sizeof shape / sizeof *shape; c++)
		dw_write_check(&f, shape[c][0], shape[c][1], shape[c][2], "the fixture's team");
	fx_close(&f);
	if (_i || strcmp(g_name, "cpu"))
		return;
	OK(fx_try_open_with(&f, 0, "run.threads=8"));
	for (size_t c = 0; c < sizeof wide / sizeof *wide; c++)
		dw_write_check(&f, wide[c][0], wide[c][1], wide[c][2], "8 threads");
	fx_close(&f);
}
END_TEST

/* The core's op table (core/opcheck.c op_rows): every type of kiln/ops.h
 * has a name and the ABI 2 minor that added it, the minors never decrease
 * by type (ops are appended), none is newer than this ABI, and every op
 * after BN_BWD_APPLY, the last of 2.0, came with a later minor: a row with
 * minor 0 there would have the core ask an old device's has_op about an op
 * it never knew (kiln_device_has_op). */
START_TEST(test_op_abi_minors)
{
	unsigned prev = 0;
	for (int t = 1; t < KILN_OP_TYPE_COUNT; t++) {
		const unsigned m = kiln_op_abi_minor(t);
		ck_assert_msg(strcmp(kiln_op_name(t), "unknown op") != 0, "op %d has no name", t);
		ck_assert_msg(m >= prev && m <= KILN_ABI_MINOR,
			      "%s (%d): minor %u after %u, ABI minor %u", kiln_op_name(t), t, m, prev,
			      (unsigned)KILN_ABI_MINOR);
		ck_assert_msg(t <= KILN_OP_BN_BWD_APPLY || m > 0, "%s (%d): minor 0, after 2.0's ops",
			      kiln_op_name(t), t);
		prev = m;
	}
	ck_assert_uint_eq(kiln_op_abi_minor(KILN_OP_BN_BWD_APPLY), 0);
	ck_assert_uint_eq(kiln_op_abi_minor(KILN_OP_EMBEDDING), 1);
	ck_assert_uint_eq(kiln_op_abi_minor(KILN_OP_RNN), 5);
	ck_assert_uint_eq(kiln_op_abi_minor(KILN_OP_GRAD_SUMSQ), 32);
	ck_assert_uint_eq(kiln_op_abi_minor(0), UINT_MAX);
	ck_assert_uint_eq(kiln_op_abi_minor(KILN_OP_TYPE_COUNT), UINT_MAX);
}
END_TEST

/* The core's op checks (core/opcheck.c), the same for every device: one
 * malformed op per family, each refused before the device sees it, with
 * the status and a message naming the device, the op and the fault.  A
 * device that does not implement a family yet says KILN_ENOTSUP instead. */
START_TEST(test_op_checks)
{
	struct fx f;
	fx_open(&f, _i);
	struct kiln_op ops[20];
	struct { kiln_status st; const char *want; } exp[20];
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
	o->in[0] = o->out[0] = td(KILN_F32, 1, 8, 0), o->in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
	o = CASE(KILN_EINVAL, "must be i64[3] { step, row0, rstride }");
	o->type = KILN_OP_DROPOUT, o->n_in = 2, o->n_out = 1, o->f[0] = 0.5;
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
	/* a well-formed LAMB asking for amsgrad (ADAMW's i[1]) is refused,
	 * not run as plain LAMB (session 43) */
	o = CASE(KILN_EINVAL, "has no amsgrad: i[1] = 1");
	o->type = KILN_OP_LAMB, o->n_in = 4, o->n_out = 3, o->i[0] = 8, o->i[1] = 1;
	o->f[0] = 0.9, o->f[1] = 0.999, o->f[2] = 1e-6;
	o->in[0] = o->out[0] = o->out[1] = o->out[2] = td(KILN_F32, 1, 8, 0);
	o->in[1] = td(KILN_F32, 1, 1, 0), o->in[2] = td(KILN_I64, 1, 1, 0);
	o->in[3] = td(KILN_I64, 1, 2, 0);
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
		DFREE(f, dX, dg);
	}
	DFREE(f, dY, db);
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
		DFREE(f, dDy, dDx);
	}
	DFREE(f, dX, dYo);
	free(x), free(dy), free(dx0), free(got);
}

/* RELU_BWD with the bias gradient in its pass (out1, ABI 2.9) against the
 * two ops it folds, RELU_BWD then BIAS_GRAD of what it wrote: dx and db
 * equal bit for bit (the same selects, the same row order of the sums),
 * also when dx accumulates (db sums only the new mask) and with an inf dy
 * where y == 0 (a select gives 0).  A device without the fold refuses it
 * with KILN_ENOTSUP (never the cpu); a wrong out1 is refused by the core. */
static void relu_db_case(struct fx *f, int R, int N)
{
	const size_t n = (size_t)R * N, b = n * 4;
	float *y = frandv(n), *dy = frandv(n), *dx0 = frandv(n);
	float *got = malloc(b), *want = malloc(b), *gdb = malloc((size_t)N * 4);
	float *wdb = malloc((size_t)N * 4);
	for (size_t i = 0; i < n; i++) {
		y[i] = y[i] > 0 ? y[i] : 0.0f; /* a ReLU's output */
		if (y[i] == 0 && i % 7 == 0)
			dy[i] = INFINITY;
	}
	void *dY = dput(f, y, b), *dDy = dput(f, dy, b);
	struct kiln_op op, og;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_RELU_BWD;
	op.n_in = 2, op.n_out = 2;
	op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 2, R, N);
	op.out[1] = td(KILN_F32, 1, N, 0);
	memset(&og, 0, sizeof og);
	og.type = KILN_OP_BIAS_GRAD;
	og.n_in = og.n_out = 1;
	og.in[0] = td(KILN_F32, 2, R, N);
	og.out[0] = td(KILN_F32, 1, N, 0);
	for (int acc = 0; acc < 2; acc++) {
		/* folded: dx (=|+=) mask, db = its column sums */
		void *dDx = dput(f, dx0, b), *dDb = dput(f, dx0, (size_t)N * 4);
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		op.n_out = 2;
		kiln_status st = run_op(f, &op, (const void *[]){ dY, dDy }, (void *[]){ dDx, dDb });
		ck_assert_msg(st == KILN_OK || (st == KILN_ENOTSUP && strcmp(g_name, "cpu")),
			      "RELU_BWD with db: status %d (%s)", st, kiln_last_error());
		if (st) {
			DFREE(f, dDx, dDb);
			break;
		}
		dget(f, got, dDx, b);
		dget(f, gdb, dDb, (size_t)N * 4);
		/* unfolded: the mask alone (written), its BIAS_GRAD, then dx again */
		void *dM = dput(f, NULL, b), *dWb = dput(f, NULL, (size_t)N * 4);
		op.flags = 0;
		op.n_out = 1;
		OK(run_op(f, &op, (const void *[]){ dY, dDy }, (void *[]){ dM }));
		OK(run_op(f, &og, (const void *[]){ dM }, (void *[]){ dWb }));
		dget(f, wdb, dWb, (size_t)N * 4);
		void *dX2 = dput(f, dx0, b);
		op.flags = acc ? KILN_OPF_ACCUMULATE : 0;
		OK(run_op(f, &op, (const void *[]){ dY, dDy }, (void *[]){ dX2 }));
		dget(f, want, dX2, b);
		ck_assert_int_eq(memcmp(got, want, b), 0);
		ck_assert_int_eq(memcmp(gdb, wdb, (size_t)N * 4), 0);
		for (int j = 0; j < N; j++) { /* and the numbers themselves */
			double s = 0, mag = 0;
			for (int r = 0; r < R; r++) {
				const size_t i = (size_t)r * N + j;
				s += y[i] > 0 ? dy[i] : 0, mag += y[i] > 0 ? fabs(dy[i]) : 0;
				ck_assert_float_eq(got[i], (acc ? dx0[i] : 0.0f) + (y[i] > 0 ? dy[i] : 0.0f));
			}
			NEAR(gdb[j], s, mag, 1e-6, "RELU_BWD db R=%d N=%d acc=%d col %d: %g want %g", R,
			     N, acc, j, gdb[j], s);
		}
		DFREE(f, dDx, dDb, dM, dWb, dX2);
	}
	/* out1 must be f32 [N], N the innermost dimension */
	void *plan;
	op.flags = 0;
	op.n_out = 2;
	op.out[1] = td(KILN_F32, 1, N + 1, 0);
	ck_assert_int_eq(kiln_device_prepare(f->dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "bias gradient"), "message: %s", kiln_last_error());
	DFREE(f, dY, dDy);
	free(y), free(dy), free(dx0), free(got), free(want), free(gdb), free(wdb);
}

START_TEST(test_relu)
{
	struct fx f;
	fx_open(&f, _i);
	relu_case(&f, 17);
	relu_case(&f, 100003);
	relu_db_case(&f, 5, 3);
	relu_db_case(&f, 128, 512); /* parallel, full column blocks */
	relu_db_case(&f, 300, 77);  /* two full blocks and a tail */
	fx_close(&f);
}
END_TEST

DEVICE_SUITE(gemm, DFX_CASE(gemm), DFX_CASE(gemm_act), DFX_CASE(gemm_frozen), DFX_CASE(gemm_errors), DFX_CASE(op_checks),
	     DFX_ONCE(op_abi_minors, 10), DFX_CASE(bias), DFX_CASE(relu), DFX_CASE(gemm_dw_accum),
	     DFX_CASE(gemm_dw_write));
