/* tests/check_cpu_fftconv.c - the CPU device's convolutions by FFT
 * (plugins/cpu/fftconv.c, [plugin.cpu] conv_algo): CONV (bias, fused
 * ReLU), CONV_BWD_DATA and CONV_BWD_WEIGHTS (bias gradient, accumulation)
 * against a double-precision loop and against oneDNN's direct kernels
 * (conv_algo = direct), on odd shapes (kernels 3, 5, 7 and 3x5; padding
 * 0..3, more than the kernel's reach too; several batches), NCHW and
 * NHWC; the same bytes on 1 and 2 threads, and in both layouts at
 * 16 x 16 (test_layouts_same_bytes); the rule's choices; the key's errors;
 * kept spectra chained over two micro-batches (test_kept_chain).
 *
 * Tolerance: the error is measured as max |got - ref| / rms(ref) over the
 * tensor.  A float FFT's error grows like eps log2(n1 n2) relative to the
 * norm of the transformed planes (eps = 6e-8; n1 n2 <= 32 x 32 here: 10
 * levels, a forward and an inverse transform, then a sum over C or N
 * planes of the products), about 1e-6; oneDNN's direct sums reach a few
 * 1e-6 on sums of up to 400 terms.  Measured on these shapes (AVX2):
 * the FFT's worst 1.3e-6, oneDNN's direct kernels' 5.0e-6.  The bound,
 * 2e-5, is 15x the FFT's worst and 4x the direct kernel's, and far
 * below what a wrong sign, shift or frequency gives (order 1: a shift
 * of the wrong sign measured 4.7).
 */
#include <kiln/kiln.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_main.h"
#include "test_util.h"
#include "conv_ref.h" /* conv_ref_run, conv_ref_err */

static struct kiln_registry *reg;

#define TOL 2e-5

struct shape {
	int64_t N, C, H, W, O, KH, KW, ph, pw;
};
static const struct shape shapes[] = {
	{ 2, 3, 7, 9, 4, 3, 3, 1, 1 },   { 3, 5, 11, 6, 7, 5, 5, 2, 2 },
	{ 1, 4, 5, 5, 3, 7, 7, 3, 3 },   { 2, 3, 8, 8, 2, 3, 3, 0, 0 },
	{ 1, 2, 4, 6, 3, 3, 3, 3, 3 },   { 5, 6, 10, 13, 4, 5, 5, 0, 0 },
	{ 2, 3, 9, 7, 5, 3, 5, 1, 2 },   { 4, 16, 14, 14, 32, 5, 5, 2, 2 },
	/* NHWC tiles of 16 channels cut short (20, 37), split between threads */
	{ 3, 20, 6, 7, 37, 3, 3, 1, 1 },
	/* 16 x 16 (fft16.c on AVX-512: shape 7 too) with partial blocks
	 * of planes on every side and unequal padding */
	{ 3, 20, 12, 13, 37, 5, 3, 2, 1 },
};
#define N_SHAPES ((int)(sizeof shapes / sizeof *shapes))

enum { F_BIAS = 1, F_RELU = 2, F_ACC = 4 };

/* The cpu device's debug lines about FFT plans, and those of them by
 * fft16.c (16 x 16 transforms, 16 planes at once, on AVX-512). */
static int fft_plans, fft16_plans, fft_16x16;

static void sink(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)level;
	if (!strcmp(who, "cpu") && strstr(msg, ": FFT "))
		fft_plans++, fft16_plans += strstr(msg, "(fft16.c)") != NULL,
		fft_16x16 += strstr(msg, ": FFT 16x16") != NULL;
}

static int64_t oh(const struct shape *s) { return s->H + 2 * s->ph - s->KH + 1; }
static int64_t ow(const struct shape *s) { return s->W + 2 * s->pw - s->KW + 1; }

/* The inputs of op type t: x (salt 1), w (2), dy (3), b (4); initial
 * outputs for accumulation: dw (5), db (6). */
static float *filled(int64_t n, uint32_t salt)
{
	float *p = malloc((size_t)n * sizeof *p);
	ck_assert(p);
	for (int64_t i = 0; i < n; i++)
		p[i] = test_hash_val((uint32_t)i, salt);
	return p;
}

/* Set: run_op's NHWC activations hold the values of the NCHW run's (its
 * inputs' NCHW-order values stored NHWC, an activation output read back in
 * NCHW order), so the two layouts' results compare byte for byte. */
static int same_values;

/* p, an activation [N, C, H, W] of HW = H W pixels, from NCHW order into
 * NHWC storage (back: NHWC storage into NCHW order); p freed */
static float *permuted(float *p, const struct kiln_tensor_desc *d, int back)
{
	const int64_t N = d->dims[0], C = d->dims[1], HW = d->dims[2] * d->dims[3];
	float *q = malloc((size_t)(N * C * HW) * sizeof *q);
	ck_assert(q);
	for (int64_t n = 0; n < N; n++)
		for (int64_t c = 0; c < C; c++)
			for (int64_t k = 0; k < HW; k++) {
				const int64_t nchw = (n * C + c) * HW + k, nhwc = (n * HW + k) * C + c;
				q[back ? nchw : nhwc] = p[back ? nhwc : nchw];
			}
	free(p);
	return q;
}

/* Run op type t on a cpu device ([plugin.cpu] conv_algo = algo, threads);
 * returns out0 followed by out1 (db) when there is one, malloc'ed; *n
 * their element count; *ffts the FFT plans the prepare made. */
static float *run_op(int t, const struct shape *s, int nhwc, int fl, const char *algo, int threads,
		     int64_t *n, int *ffts)
{
	char ov[64];
	struct kiln_config *cfg;
	struct kiln_device *dev;
	ck_assert(kiln_config_new(&cfg) == 0);
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	ck_assert(kiln_config_override(cfg, ov) == 0);
	snprintf(ov, sizeof ov, "plugin.cpu.conv_algo=%s", algo);
	ck_assert(kiln_config_override(cfg, ov) == 0);
	ck_assert_msg(kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0, "%s", kiln_last_error());
	const int lay = nhwc ? KILN_NHWC : KILN_NCHW;
	const struct kiln_tensor_desc x = test_desc4(KILN_F32, s->N, s->C, s->H, s->W, lay),
				      y = test_desc4(KILN_F32, s->N, s->O, oh(s), ow(s), lay),
				      w = test_desc4(KILN_F32, s->O, s->C, s->KH, s->KW, KILN_NCHW);
	struct kiln_tensor_desc b;
	const int64_t bd[1] = { s->O };
	kiln_tensor_desc_init(&b, KILN_F32, 1, bd);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = t;
	op.i[0] = op.i[1] = 1;
	op.i[2] = s->ph, op.i[3] = s->pw;
	op.i[4] = op.i[5] = op.i[6] = 1;
	const int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->O * oh(s) * ow(s),
		      nw = s->O * s->C * s->KH * s->KW;
	float *in[3] = { NULL, NULL, NULL };
	int64_t nout[2] = { 0, 0 };
	if (t == KILN_OP_CONV) {
		op.n_in = fl & F_BIAS ? 3 : 2, op.n_out = 1;
		op.in[0] = x, op.in[1] = w, op.in[2] = b, op.out[0] = y;
		in[0] = filled(nx, 1), in[1] = filled(nw, 2), in[2] = filled(s->O, 4);
		nout[0] = ny;
		if (fl & F_RELU) {
			op.flags |= KILN_OPF_ACT;
			op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		}
	} else if (t == KILN_OP_CONV_BWD_DATA) {
		op.n_in = 2, op.n_out = 1;
		op.in[0] = y, op.in[1] = w, op.out[0] = x;
		in[0] = filled(ny, 3), in[1] = filled(nw, 2);
		nout[0] = nx;
	} else {
		op.n_in = 2, op.n_out = fl & F_BIAS ? 2 : 1;
		op.in[0] = x, op.in[1] = y, op.out[0] = w, op.out[1] = b;
		in[0] = filled(nx, 1), in[1] = filled(ny, 3);
		nout[0] = nw, nout[1] = fl & F_BIAS ? s->O : 0;
		if (fl & F_ACC)
			op.flags |= KILN_OPF_ACCUMULATE;
	}
	for (int k = 0; same_values && k < op.n_in; k++)
		if (op.in[k].ndim == 4 && op.in[k].layout == KILN_NHWC)
			in[k] = permuted(in[k], &op.in[k], 0);
	void *plan, *stream, *ws = NULL, *din[3] = { NULL, NULL, NULL }, *dout[2] = { NULL, NULL };
	size_t wsb = 0;
	fft_plans = fft16_plans = fft_16x16 = 0;
	const int level = kiln_log_get_level();
	kiln_log_set_sink(sink, NULL);
	kiln_log_set_level(KILN_LOG_DEBUG);
	const int pst = kiln_device_prepare(dev, &op, &plan, &wsb);
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(level);
	ck_assert_msg(pst == 0, "%s", kiln_last_error());
	*ffts = fft_plans;
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	for (int k = 0; k < op.n_in; k++) {
		const size_t bytes = (size_t)kiln_tensor_bytes(&op.in[k]);
		ck_assert(kiln_device_alloc(dev, bytes, &din[k]) == 0);
		memcpy(din[k], in[k], bytes);
	}
	for (int k = 0; k < op.n_out; k++) {
		ck_assert(kiln_device_alloc(dev, (size_t)nout[k] * 4, &dout[k]) == 0);
		float *init = filled(nout[k], (uint32_t)(5 + k));
		memcpy(dout[k], init, (size_t)nout[k] * 4);
		free(init);
	}
	if (wsb)
		ck_assert(kiln_device_alloc(dev, wsb, &ws) == 0);
	struct kiln_op_args a = { .in = { din[0], din[1], din[2] }, .out = { dout[0], dout[1] },
				  .workspace = ws, .workspace_bytes = wsb };
	ck_assert_msg(kiln_device_run(dev, plan, &a, stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	*n = nout[0] + nout[1];
	float *out = malloc((size_t)*n * sizeof *out);
	ck_assert(out);
	memcpy(out, dout[0], (size_t)nout[0] * 4);
	if (same_values && op.out[0].layout == KILN_NHWC) {
		float *t0 = malloc((size_t)nout[0] * 4);
		ck_assert(t0);
		memcpy(t0, out, (size_t)nout[0] * 4);
		t0 = permuted(t0, &op.out[0], 1);
		memcpy(out, t0, (size_t)nout[0] * 4);
		free(t0);
	}
	if (nout[1])
		memcpy(out + nout[0], dout[1], (size_t)nout[1] * 4);
	for (int k = 0; k < 3; k++) {
		kiln_device_free(dev, din[k]);
		free(in[k]);
	}
	kiln_device_free(dev, dout[0]);
	kiln_device_free(dev, dout[1]);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	return out;
}

/* The double-precision result of the same op (run_op's inputs). */
static double *reference(int t, const struct shape *s, int nhwc, int fl, int64_t *n)
{
	const struct conv_ref g = { s->N, s->C, s->H, s->W, s->O, s->KH, s->KW, s->ph, s->pw, nhwc };
	const int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->O * oh(s) * ow(s),
		      nw = s->O * s->C * s->KH * s->KW;
	float *x = filled(nx, 1), *w = filled(nw, 2), *dy = filled(ny, 3), *b = filled(s->O, 4);
	float *dw0 = filled(nw, 5), *db0 = filled(s->O, 6);
	const int acc = t == KILN_OP_CONV_BWD_WEIGHTS && (fl & F_ACC);
	double *r = conv_ref_run(t, &g, x, w, dy, fl & F_BIAS ? b : NULL, (fl & F_RELU) != 0,
				 (fl & F_BIAS) != 0, acc ? dw0 : NULL, acc ? db0 : NULL, n);
	free(x), free(w), free(dy), free(b), free(dw0), free(db0);
	return r;
}

/* max |got - ref| / rms(ref) */
static double rel_err(const float *got, const double *ref, int64_t n) { return conv_ref_err(got, ref, n); }

static const char *op_str(int t)
{
	return t == KILN_OP_CONV ? "CONV" : t == KILN_OP_CONV_BWD_DATA ? "CONV_BWD_DATA" : "CONV_BWD_WEIGHTS";
}

/* A 16 x 16 shape's op by FFTW's per-plane transforms too
 * (KILN_CPU_FFT_FFTW), against the same reference: the error of each
 * path.  Where the CPU has AVX-512F, BW and VL, the default plan is
 * fft16.c's. */
static double check_fftw16(int t, const struct shape *s, int nhwc, int fl, const double *r,
			   int64_t nr, int v16)
{
	int64_t n;
	int ffts;
	const int avx512 = conv_ref_avx512();
	ck_assert_msg(v16 == avx512, "%s %s: %d plans by fft16.c, on a CPU %s AVX-512F, BW and VL",
		      op_str(t), nhwc ? "NHWC" : "NCHW", v16, avx512 ? "with" : "without");
	setenv("KILN_CPU_FFT_FFTW", "1", 1);
	float *f = run_op(t, s, nhwc, fl, "fft", 2, &n, &ffts);
	unsetenv("KILN_CPU_FFT_FFTW");
	ck_assert(n == nr && ffts == 1 && fft16_plans == 0);
	const double e = rel_err(f, r, n);
	ck_assert_msg(e < TOL, "%s flags %d %s 16 x 16 by FFTW: off by %.3g of the rms", op_str(t), fl,
		      nhwc ? "NHWC" : "NCHW", e);
	free(f);
	return e;
}

/* One op on every shape and layout with flags fl: FFT against the double
 * loop and against oneDNN's direct kernel; the FFT's bytes on 1 and 2
 * threads equal; at 16 x 16, FFTW's transforms too (check_fftw16). */
static void check_op(int t, int fl)
{
	double worst = 0, worst_direct = 0, worst16 = 0, worst_fftw = 0;
	int n16 = 0; /* shape-layout runs at 16 x 16: shapes 7 and 9, both layouts */
	for (int si = 0; si < N_SHAPES; si++)
		for (int nhwc = 0; nhwc < 2; nhwc++) {
			const struct shape *s = &shapes[si];
			int64_t n, nr, nd;
			int ffts, ffts2, ffts0;
			float *f1 = run_op(t, s, nhwc, fl, "fft", 1, &n, &ffts);
			float *f2 = run_op(t, s, nhwc, fl, "fft", 2, &n, &ffts2);
			/* (the plan's own transform size, from its debug line) */
			const int v16 = fft16_plans, is16 = fft_16x16;
			float *d = run_op(t, s, nhwc, fl, "direct", 2, &nd, &ffts0);
			double *r = reference(t, s, nhwc, fl, &nr);
			ck_assert(n == nr && nd == nr);
			ck_assert_msg(ffts == 1 && ffts2 == 1 && ffts0 == 0,
				      "%s shape %d %s: %d, %d FFT plans with fft, %d with direct", op_str(t),
				      si, nhwc ? "NHWC" : "NCHW", ffts, ffts2, ffts0);
			const double e = rel_err(f1, r, n), ed = rel_err(d, r, n);
			ck_assert_msg(e < TOL, "%s flags %d shape %d %s: FFT off by %.3g of the rms (direct %.3g)",
				      op_str(t), fl, si, nhwc ? "NHWC" : "NCHW", e, ed);
			ck_assert_msg(!memcmp(f1, f2, (size_t)n * sizeof *f1),
				      "%s flags %d shape %d %s: other bytes on 1 and 2 threads", op_str(t), fl,
				      si, nhwc ? "NHWC" : "NCHW");
			worst = e > worst ? e : worst;
			worst_direct = ed > worst_direct ? ed : worst_direct;
			if (is16) {
				n16++;
				const double ef = check_fftw16(t, s, nhwc, fl, r, nr, v16);
				worst_fftw = ef > worst_fftw ? ef : worst_fftw;
				worst16 = e > worst16 ? e : worst16;
			}
			free(f1), free(f2), free(d), free(r);
		}
	ck_assert_msg(n16 == 4, "%s flags %d: %d runs planned 16 x 16, want 4 (shapes 7 and 9)",
		      op_str(t), fl, n16);
	printf("fftconv: %s flags %d: worst error %.3g of the rms (direct %.3g); 16 x 16: %.3g, by FFTW %.3g\n",
	       op_str(t), fl, worst, worst_direct, worst16, worst_fftw);
}

START_TEST(test_forward)
{
	check_op(KILN_OP_CONV, 0);
	check_op(KILN_OP_CONV, F_BIAS);
	check_op(KILN_OP_CONV, F_BIAS | F_RELU);
	check_op(KILN_OP_CONV, F_RELU);
}
END_TEST

START_TEST(test_bwd_data)
{
	check_op(KILN_OP_CONV_BWD_DATA, 0);
}
END_TEST

START_TEST(test_bwd_weights)
{
	check_op(KILN_OP_CONV_BWD_WEIGHTS, 0);
	check_op(KILN_OP_CONV_BWD_WEIGHTS, F_BIAS);
	check_op(KILN_OP_CONV_BWD_WEIGHTS, F_BIAS | F_ACC);
	check_op(KILN_OP_CONV_BWD_WEIGHTS, F_ACC);
}
END_TEST

/* At 16 x 16 by fft16.c (AVX-512) an NHWC side's planes go into the lanes
 * that the NCHW planes' rows are transposed into (the forward's x a pixel's
 * channels at once, the gradients' dy through fc_gather_lanes' tile of 16
 * samples and 16 channels): the same values give the same bytes in both
 * layouts, each op, on conv2's shape, on one whose blocks are partial
 * (shapes 7 and 9), and on shape 9 with 19 samples: dy's tiles of samples
 * 16 .. 18 (i0 = 16), gathered again when a row block's column block moves
 * on.  Where the CPU has AVX-512F, BW and VL every op-shape is compared. */
START_TEST(test_layouts_same_bytes)
{
	static const int types[3] = { KILN_OP_CONV, KILN_OP_CONV_BWD_DATA, KILN_OP_CONV_BWD_WEIGHTS };
	static const int flags[3] = { F_BIAS | F_RELU, 0, F_BIAS | F_ACC };
	const struct shape n19 = { 19, 20, 12, 13, 37, 5, 3, 2, 1 };
	const struct shape *ss[3] = { &shapes[7], &shapes[9], &n19 };
	int compared = 0;
	for (int k = 0; k < 3; k++)
		for (int si = 0; si < 3; si++) {
			int64_t n0, n1;
			int f0, f1;
			same_values = 1;
			float *a = run_op(types[k], ss[si], 0, flags[k], "fft", 2, &n0, &f0);
			const int v16a = fft16_plans;
			float *b = run_op(types[k], ss[si], 1, flags[k], "fft", 2, &n1, &f1);
			const int v16b = fft16_plans;
			same_values = 0;
			ck_assert(n0 == n1 && f0 == 1 && f1 == 1);
			if (v16a && v16b) {
				int64_t i = 0;
				while (i < n0 && !memcmp(&a[i], &b[i], sizeof *a))
					i++;
				ck_assert_msg(i == n0, "%s %s: NCHW and NHWC differ at element %lld of %lld (%.9g, %.9g)",
					      op_str(types[k]), si < 2 ? (si ? "shape 9" : "shape 7") : "19 samples",
					      (long long)i, (long long)n0, i < n0 ? (double)a[i] : 0.0,
					      i < n0 ? (double)b[i] : 0.0);
				compared++;
			}
			free(a), free(b);
		}
	printf("fftconv: NCHW against NHWC by fft16.c: %d of 9 op-shapes compared\n", compared);
	if (conv_ref_avx512())
		ck_assert_msg(compared == 9, "%d of 9 op-shapes planned by fft16.c on a CPU with AVX-512F, BW and VL",
			      compared);
	else
		printf("fftconv: not all compared: this CPU lacks AVX-512F, BW or VL (fft16.c's blocks)\n");
}
END_TEST

/* conv_algo = rule: the FFT for the CNN's conv2 (32 -> 64, 5x5, 14x14,
 * pad 2) on every ISA (below AVX-512 only until session 21), never for
 * its conv1 (one input channel) nor a 3x3 kernel; the unset key is rule. */
START_TEST(test_rule)
{
	const struct shape conv2 = { 2, 32, 14, 14, 64, 5, 5, 2, 2 },
			   conv1 = { 2, 1, 28, 28, 32, 5, 5, 2, 2 },
			   k3 = { 2, 32, 14, 14, 64, 3, 3, 1, 1 };
	static const int types[] = { KILN_OP_CONV, KILN_OP_CONV_BWD_DATA, KILN_OP_CONV_BWD_WEIGHTS };
	for (int k = 0; k < 3; k++) {
		int64_t n;
		int ffts;
		free(run_op(types[k], &conv2, 0, 0, "rule", 1, &n, &ffts));
		ck_assert_msg(ffts == 1, "%s conv2: %d FFT plans", op_str(types[k]), ffts);
		/* winograd: what wino.c does not take, as rule */
		free(run_op(types[k], &conv2, 0, 0, "winograd", 1, &n, &ffts));
		ck_assert_msg(ffts == 1, "%s conv2, conv_algo = winograd: %d FFT plans", op_str(types[k]), ffts);
		free(run_op(types[k], &conv1, 1, 0, "rule", 1, &n, &ffts));
		ck_assert_msg(ffts == 0, "%s conv1: %d FFT plans", op_str(types[k]), ffts);
		free(run_op(types[k], &k3, 0, 0, "rule", 1, &n, &ffts));
		ck_assert_msg(ffts == 0, "%s 3x3: %d FFT plans", op_str(types[k]), ffts);
	}
}
END_TEST

START_TEST(test_bad_key)
{
	struct kiln_config *cfg;
	struct kiln_device *dev = NULL;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.conv_algo=gemm") == 0);
	ck_assert(kiln_device_open(reg, cfg, "cpu", 0, &dev) != 0);
	ck_assert_msg(strstr(kiln_last_error(), "conv_algo") != NULL, "%s", kiln_last_error());
	kiln_config_free(cfg);
}
END_TEST

/* Kept spectra (KILN_OPF_KEEP) as a layer chains them, for two
 * micro-batches whose forwards both run first (x, w, dy all differ between
 * them): each weight gradient and data gradient reading its micro-batch's
 * copies gives the unkept op's bytes, with the tensors the copies replace
 * (x for the weight gradient, dy and w for the data gradient) given as
 * zeros, so a result that matches read the copies and the right ones.  A
 * kept dy whose w reference is gone is refused (an error, not a read). */
struct kchain {
	struct kiln_device *dev;
	void *stream, *ws;
	size_t wsb;
};

static void *kc_plan(struct kchain *c, const struct kiln_op *op, size_t *own)
{
	void *plan;
	size_t wsb = 0;
	ck_assert_msg(kiln_device_prepare(c->dev, op, &plan, &wsb) == 0, "%s", kiln_last_error());
	*own = wsb;
	if (wsb > c->wsb) {
		kiln_device_free(c->dev, c->ws);
		ck_assert(kiln_device_alloc(c->dev, wsb, &c->ws) == 0);
		c->wsb = wsb;
	}
	return plan;
}

static int kc_run(struct kchain *c, void *plan, const void *i0, const void *i1, const void *i2,
		  void *o0, void *o1, void *o2)
{
	struct kiln_op_args a = { .in = { i0, i1, i2 }, .out = { o0, o1, o2 }, .workspace = c->ws,
				  .workspace_bytes = c->wsb };
	int st = kiln_device_run(c->dev, plan, &a, c->stream);
	return st ? st : kiln_device_stream_sync(c->dev, c->stream);
}

static void *kc_buf(struct kchain *c, size_t bytes, const float *from)
{
	void *d;
	ck_assert(kiln_device_alloc(c->dev, bytes ? bytes : 1, &d) == 0);
	if (from)
		memcpy(d, from, bytes);
	else
		memset(d, 0, bytes);
	return d;
}

static void kept_chain(const struct shape *s, int nhwc)
{
	struct kchain c = { NULL, NULL, NULL, 0 };
	struct kiln_config *cfg;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.conv_algo=fft") == 0);
	ck_assert_msg(kiln_device_open(reg, cfg, "cpu", 0, &c.dev) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(c.dev, &c.stream) == 0);
	const int lay = nhwc ? KILN_NHWC : KILN_NCHW;
	const struct kiln_tensor_desc x = test_desc4(KILN_F32, s->N, s->C, s->H, s->W, lay),
				      y = test_desc4(KILN_F32, s->N, s->O, oh(s), ow(s), lay),
				      w = test_desc4(KILN_F32, s->O, s->C, s->KH, s->KW, KILN_NCHW);
	struct kiln_tensor_desc b, u;
	const int64_t bd[1] = { s->O }, one[1] = { 1 };
	kiln_tensor_desc_init(&b, KILN_F32, 1, bd);
	kiln_tensor_desc_init(&u, KILN_U8, 1, one);
	struct kiln_op f, g, d;
	memset(&f, 0, sizeof f);
	f.i[0] = f.i[1] = 1, f.i[2] = s->ph, f.i[3] = s->pw, f.i[4] = f.i[5] = f.i[6] = 1;
	g = d = f;
	f.type = KILN_OP_CONV, f.n_in = 3, f.n_out = 1;
	f.in[0] = x, f.in[1] = w, f.in[2] = b, f.out[0] = y;
	g.type = KILN_OP_CONV_BWD_WEIGHTS, g.n_in = 2, g.n_out = 2;
	g.in[0] = x, g.in[1] = y, g.out[0] = w, g.out[1] = b;
	d.type = KILN_OP_CONV_BWD_DATA, d.n_in = 2, d.n_out = 1;
	d.in[0] = y, d.in[1] = w, d.out[0] = x;
	size_t wpf, wpg, wpd, wkf, wkg, wkd;
	void *pf = kc_plan(&c, &f, &wpf), *pg = kc_plan(&c, &g, &wpg), *pd = kc_plan(&c, &d, &wpd);
	f.flags = g.flags = d.flags = KILN_OPF_KEEP;
	f.out[f.n_out++] = u;
	void *kf = kc_plan(&c, &f, &wkf);
	const size_t kx = kiln_device_aux_bytes(c.dev, kf);
	g.in[g.n_in] = u, g.in[g.n_in++].dims[0] = (int64_t)kx;
	g.out[g.n_out++] = u;
	void *kg = kc_plan(&c, &g, &wkg);
	const size_t kdy = kiln_device_aux_bytes(c.dev, kg);
	d.in[d.n_in] = u, d.in[d.n_in++].dims[0] = (int64_t)kdy;
	void *kd = kc_plan(&c, &d, &wkd);
	ck_assert_msg(kx > 0 && kdy > 0, "kept %zu, %zu bytes", kx, kdy);
	/* a kept op's workspace holds none of the matrices its copies hold:
	 * the forward's x and w operands (its kept output, kx bytes), the
	 * weight gradient's dy operand (its kept output but the 64-byte w
	 * reference), the data gradient's two (both of those); the weight
	 * gradient holds x's block form one frequency a thread, not all of
	 * them as unkept, so it holds less than the unkept one without A */
	ck_assert_msg(wkf + kx == wpf && wkg + kdy - 64 < wpg && wkd + kdy - 64 < wpd,
		      "workspace kept/unkept: forward %zu/%zu (kept %zu), weight gradient %zu/%zu (kept %zu), data gradient %zu/%zu",
		      wkf, wpf, kx, wkg, wpg, kdy, wkd, wpd);
	const int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->O * oh(s) * ow(s),
		      nw = s->O * s->C * s->KH * s->KW;
	void *X[2], *W[2], *DY[2], *K[2], *KD[2], *B = kc_buf(&c, (size_t)s->O * 4, NULL);
	void *zx = kc_buf(&c, (size_t)nx * 4, NULL), *zy = kc_buf(&c, (size_t)ny * 4, NULL),
	     *zw = kc_buf(&c, (size_t)nw * 4, NULL);
	void *y0 = kc_buf(&c, (size_t)ny * 4, NULL), *y1 = kc_buf(&c, (size_t)ny * 4, NULL);
	void *o0 = kc_buf(&c, (size_t)(nx > nw ? nx : nw) * 4, NULL),
	     *o1 = kc_buf(&c, (size_t)(nx > nw ? nx : nw) * 4, NULL);
	void *b0 = kc_buf(&c, (size_t)s->O * 4, NULL), *b1 = kc_buf(&c, (size_t)s->O * 4, NULL);
	for (int m = 0; m < 2; m++) {
		float *h = filled(nx, 11 + m);
		X[m] = kc_buf(&c, (size_t)nx * 4, h), free(h);
		h = filled(nw, 13 + m);
		W[m] = kc_buf(&c, (size_t)nw * 4, h), free(h);
		h = filled(ny, 15 + m);
		DY[m] = kc_buf(&c, (size_t)ny * 4, h), free(h);
		K[m] = kc_buf(&c, kx, NULL), KD[m] = kc_buf(&c, kdy, NULL);
	}
	const char *lay_s = nhwc ? "NHWC" : "NCHW";
	for (int m = 0; m < 2; m++) { /* both forwards first */
		ck_assert(kc_run(&c, kf, X[m], W[m], B, y0, K[m], NULL) == 0);
		ck_assert(kc_run(&c, pf, X[m], W[m], B, y1, NULL, NULL) == 0);
		ck_assert_msg(!memcmp(y0, y1, (size_t)ny * 4), "%s: kept forward %d's y", lay_s, m);
	}
	for (int m = 1; m >= 0; m--) { /* backwards in reverse, as gpipe */
		ck_assert(kc_run(&c, kg, zx, DY[m], K[m], o0, b0, KD[m]) == 0);
		ck_assert(kc_run(&c, pg, X[m], DY[m], NULL, o1, b1, NULL) == 0);
		ck_assert_msg(!memcmp(o0, o1, (size_t)nw * 4) && !memcmp(b0, b1, (size_t)s->O * 4),
			      "%s: micro-batch %d's kept weight gradient", lay_s, m);
	}
	for (int m = 0; m < 2; m++) { /* the data gradients after both */
		ck_assert(kc_run(&c, kd, zy, zw, KD[m], o0, NULL, NULL) == 0);
		ck_assert(kc_run(&c, pd, DY[m], W[m], NULL, o1, NULL, NULL) == 0);
		ck_assert_msg(!memcmp(o0, o1, (size_t)nx * 4), "%s: micro-batch %d's kept data gradient",
			      lay_s, m);
	}
	memset((char *)KD[0] + kdy - 64, 0, 64); /* the w reference gone */
	ck_assert_int_ne(kc_run(&c, kd, zy, zw, KD[0], o0, NULL, NULL), 0);
	ck_assert_msg(strstr(kiln_last_error(), "no w spectrum"), "%s", kiln_last_error());
	void *all[] = { X[0], X[1], W[0], W[1], DY[0], DY[1], K[0], K[1], KD[0], KD[1], B, zx, zy, zw,
			y0, y1, o0, o1, b0, b1, c.ws };
	for (size_t k = 0; k < sizeof all / sizeof *all; k++)
		kiln_device_free(c.dev, all[k]);
	void *plans[] = { pf, pg, pd, kf, kg, kd };
	for (size_t k = 0; k < sizeof plans / sizeof *plans; k++)
		kiln_device_plan_free(c.dev, plans[k]);
	kiln_device_stream_destroy(c.dev, c.stream);
	kiln_device_close(c.dev);
	kiln_config_free(cfg);
}

START_TEST(test_kept_chain)
{
	kept_chain(&shapes[7], 0);
	kept_chain(&shapes[7], 1);
	kept_chain(&shapes[8], 1);
	kept_chain(&shapes[2], 0);
	kept_chain(&shapes[9], 0);
	kept_chain(&shapes[9], 1);
}
END_TEST

/* Skip (77) when the plugin was built without FFTW: conv_algo = fft is
 * then refused when the device opens. */
static int need_fftw(void)
{
	struct kiln_registry *r;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	if (kiln_registry_open(NULL, &r) || kiln_config_new(&cfg))
		return 0; /* the suite's own checks report it */
	int rc = 0;
	if (!kiln_config_override(cfg, "plugin.cpu.conv_algo=fft")) {
		if (kiln_device_open(r, cfg, "cpu", 0, &dev) == 0)
			kiln_device_close(dev);
		else if (strstr(kiln_last_error(), "no FFTW"))
			rc = 77, printf("SKIP: %s\n", kiln_last_error());
	}
	kiln_config_free(cfg);
	kiln_registry_close(r);
	return rc;
}

static Suite *make_cpu_fftconv_suite(void)
{
	Suite *s = suite_create("cpu_fftconv");
	check_add_case(s, "passes", 300, NULL, NULL, (const TTest *[]){
		test_forward, test_bwd_data, test_bwd_weights, NULL });
	check_add_case(s, "choice", 60, NULL, NULL, (const TTest *[]){ test_rule, test_bad_key, NULL });
	check_add_case(s, "layouts", 120, NULL, NULL, (const TTest *[]){ test_layouts_same_bytes, NULL });
	check_add_case(s, "kept", 120, NULL, NULL, (const TTest *[]){ test_kept_chain, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_fftconv_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1, .setup = need_fftw };
