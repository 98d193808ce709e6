/* tests/check_device_conv.c - device conformance:
 * convolution (and its fused ReLU), pooling, concat / split and reorder,
 * in both layouts.
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

/* ---- convolution ------------------------------------------------------ */

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

	/* the fused ReLU (KILN_OPF_ACT): y = max(conv + b, 0) in one op.  The
	 * CPU must fuse it (its layout reorders once refused the post-op and
	 * every fused conv fell back to a separate pass); a device may refuse
	 * it (KILN_ENOTSUP: the layer then runs an ACT after it) */
	op.flags = KILN_OPF_ACT;
	op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	kiln_status st = run_op(f, &op, in, out);
	ck_assert_msg(st == KILN_OK || (st == KILN_ENOTSUP && strcmp(g_name, "cpu")),
		      "CONV + ReLU %s on %s: status %d (%s)", tag, g_name, st, kiln_last_error());
	got = st ? NULL : dget4(f, dY, N, O, OH, OW, nhwc);
	for (size_t i = 0; got && i < ny; i++)
		NEAR(got[i], y[i] > 0 ? y[i] : 0, ym[i], 1e-4, "CONV + ReLU %s: y[%zu] = %.7g, want %.7g",
		     tag, i, got[i], y[i] > 0 ? y[i] : 0);
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
	/* ABI 2.9: accumulated (dw += ..., db += ...) equals written, then
	 * added: twice the written gradients.  A device may refuse it (the
	 * layer then adds from scratch); the CPU adds through its reorder. */
	float *once = malloc((nw + (size_t)O) * 4);
	dget(f, once, dDW, nw * 4);
	dget(f, once + nw, dDB, (size_t)O * 4);
	op.flags = KILN_OPF_ACCUMULATE;
	st = run_op(f, &op, in, out);
	ck_assert_msg(st == KILN_OK || (st == KILN_ENOTSUP && strcmp(g_name, "cpu")),
		      "CONV_BWD_WEIGHTS accumulated %s on %s: status %d (%s)", tag, g_name, st,
		      kiln_last_error());
	if (!st) {
		dget(f, got, dDW, nw * 4);
		for (size_t i = 0; i < nw; i++)
			NEAR(got[i], 2.0 * once[i], 2.0 * dwm[i], 1e-6,
			     "CONV_BWD_WEIGHTS accumulated %s: dw[%zu] = %.7g, want %.7g", tag, i, got[i],
			     2.0 * once[i]);
		dget(f, got, dDB, (size_t)O * 4);
		for (int o = 0; q->bias && o < O; o++)
			NEAR(got[o], 2.0 * once[nw + o], 2.0 * dbm[o], 1e-6,
			     "CONV_BWD_WEIGHTS accumulated %s: db[%d] = %.7g, want %.7g", tag, o, got[o],
			     2.0 * once[nw + o]);
	}
	free(once);
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
		{ 4, 1, 32, 14, 14, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1 },  /* one input channel (a stem) */
		/* the CPU's NHWC bias gradient summed by kiln over 25 chunks of
		 * rows (the last one partial), threaded */
		{ 8, 1, 32, 28, 28, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1 },
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

/* ---- kept copies (KILN_OPF_KEEP, ABI 2.9) ------------------------------ */

/* The bytes op keeps (its aux_bytes), or -1 when the device refuses it. */
static long kept_bytes(struct fx *f, const struct kiln_op *op)
{
	void *plan;
	if (kiln_device_prepare(f->dev, op, &plan, NULL) != KILN_OK)
		return -1;
	const long n = (long)aux_bytes(f, plan);
	kiln_device_plan_free(f->dev, plan);
	return n;
}

/* n floats of device memory d against want: equal up to rounding order */
static void same_as(struct fx *f, const void *d, const float *want, size_t n, const char *what,
		    const char *tag)
{
	float *got = malloc(n * 4);
	dget(f, got, d, n * 4);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-5f * (fabsf(want[i]) + 1.0f),
			      "kept %s %s: [%zu] = %.9g, without %.9g", what, tag, i, got[i], want[i]);
	free(got);
}

/* The layer's three ops with their kept copies give what they give without:
 * the CONV keeps x, the weight gradient reads it (its x input zeroed, so a
 * copy not read would show) and keeps dy, the data gradient reads that (its
 * dy zeroed).  The CPU keeps both for blocked NCHW channels (want_kept).
 * may_refuse: the CPU may refuse the kept CONV (KILN_ENOTSUP, the layer then
 * prepares without), as its first-layer kernel does for a few input
 * channels on AVX-512 (plugins/cpu/convthin.c). */
static void kept_case(struct fx *f, const struct conv_g *q, int nhwc, int want_kept, int may_refuse)
{
	const int N = q->N, C = q->C, O = q->O, H = q->H, W = q->W;
	const int OH = (H + 2 * q->ph - q->dh * (q->KH - 1) - 1) / q->sh + 1;
	const int OW = (W + 2 * q->pw - q->dw * (q->KW - 1) - 1) / q->sw + 1;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * O * OH * OW;
	const size_t nw = (size_t)O * (C / q->g) * q->KH * q->KW;
	float *x = frandv(nx), *w = frandv(nw), *b = frandv((size_t)O), *dy = frandv(ny);
	float *y0 = malloc(ny * 4), *dx0 = malloc(nx * 4), *dw0 = malloc(nw * 4), *db0 = malloc((size_t)O * 4);
	void *dX = dput(f, x, nx * 4), *dDY = dput(f, dy, ny * 4), *dW = dput(f, w, nw * 4);
	void *dB = dput(f, b, (size_t)O * 4), *dY = dput(f, NULL, ny * 4), *dDX = dput(f, NULL, nx * 4);
	void *dDW = dput(f, NULL, nw * 4), *dDB = dput(f, NULL, (size_t)O * 4);
	float *zeros = calloc(nx > ny ? nx : ny, 4);
	void *z = dput(f, zeros, (nx > ny ? nx : ny) * 4); /* an input not to be read */
	char tag[96];
	snprintf(tag, sizeof tag, "%s N%d C%d O%d %dx%d k%dx%d g%d", nhwc ? "NHWC" : "NCHW", N, C, O, H,
		 W, q->KH, q->KW, q->g);
	struct kiln_op fw, bw, bd;
	conv_op(&fw, KILN_OP_CONV, q, OH, OW, nhwc);
	conv_op(&bw, KILN_OP_CONV_BWD_WEIGHTS, q, OH, OW, nhwc);
	conv_op(&bd, KILN_OP_CONV_BWD_DATA, q, OH, OW, nhwc);
	OK(run_op(f, &fw, (const void *[]){ dX, dW, dB }, (void *[]){ dY }));
	OK(run_op(f, &bw, (const void *[]){ dX, dDY }, (void *[]){ dDW, dDB }));
	OK(run_op(f, &bd, (const void *[]){ dDY, dW }, (void *[]){ dDX }));
	dget(f, y0, dY, ny * 4), dget(f, dx0, dDX, nx * 4), dget(f, dw0, dDW, nw * 4);
	dget(f, db0, dDB, (size_t)O * 4);

	fw.flags = bw.flags = bd.flags = KILN_OPF_KEEP;
	fw.out[fw.n_out++] = td(KILN_U8, 1, 1, 0);
	const long kx = kept_bytes(f, &fw);
	ck_assert_msg(kx >= 0 || strcmp(g_name, "cpu") ||
			      (may_refuse && strstr(kiln_last_error(), "keeps no copies")),
		      "CONV keep %s: %s", tag, kiln_last_error());
	ck_assert_msg(!want_kept || kx > 0, "CONV keep %s: nothing kept", tag);
	if (kx > 0) {
		void *dKX = dput(f, NULL, (size_t)kx), *dKDY = NULL;
		OK(run_op(f, &fw, (const void *[]){ dX, dW, dB }, (void *[]){ dY, dKX }));
		same_as(f, dY, y0, ny, "y", tag);
		bw.in[bw.n_in++] = td(KILN_U8, 1, kx, 0);
		bw.out[bw.n_out++] = td(KILN_U8, 1, 1, 0);
		const long kdy = kept_bytes(f, &bw);
		ck_assert_msg(kdy >= 0, "CONV_BWD_WEIGHTS keep %s: %s", tag, kiln_last_error());
		ck_assert_msg(!want_kept || kdy > 0, "CONV_BWD_WEIGHTS keep %s: nothing kept", tag);
		dKDY = dput(f, NULL, kdy > 0 ? (size_t)kdy : 1);
		OK(run_op(f, &bw, (const void *[]){ z, dDY, dKX }, (void *[]){ dDW, dDB, dKDY }));
		same_as(f, dDW, dw0, nw, "dw", tag);
		same_as(f, dDB, db0, (size_t)O, "db", tag);
		if (kdy > 0) {
			bd.in[bd.n_in++] = td(KILN_U8, 1, kdy, 0);
			OK(run_op(f, &bd, (const void *[]){ z, dW, dKDY }, (void *[]){ dDX }));
			same_as(f, dDX, dx0, nx, "dx", tag);
			bd.in[2] = td(KILN_U8, 1, kdy + 64, 0); /* not the copy's size */
			void *plan;
			ck_assert_int_eq(kiln_device_prepare(f->dev, &bd, &plan, NULL), KILN_EINVAL);
		}
		DFREE(f, dKX, dKDY);
	}
	DFREE(f, dX, dDY, dW, dB, dY, dDX, dDW, dDB, z);
	free(x), free(w), free(b), free(dy), free(y0), free(dx0), free(dw0), free(db0), free(zeros);
}

START_TEST(test_conv_keep)
{
	/* N C O H W KH KW sh sw ph pw dh dw g bias */
	static const struct conv_g cnn2 = { 4, 32, 64, 14, 14, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1 };
	static const struct conv_g g2 = { 3, 16, 32, 13, 13, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1 };
	static const struct conv_g c1 = { 3, 1, 8, 9, 9, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1 };
	struct fx f;
	/* oneDNN's kept copies: the CPU's FFT (conv_algo = rule's choice for
	 * conv2 on AVX2) keeps none and refuses the flag */
	OK(fx_try_open_with(&f, _i, "plugin.cpu.conv_algo=direct"));
	SKIP_UNSUPPORTED(&f, KILN_OP_CONV);
	const int cpu = !strcmp(g_name, "cpu");
	kept_case(&f, &cnn2, 0, cpu, 0); /* the CNN's conv2: blocked x and dy */
	kept_case(&f, &cnn2, 1, 0, 0);
	kept_case(&f, &g2, 0, cpu, 0); /* stride 2, groups */
	kept_case(&f, &c1, 0, 0, cpu); /* one input channel: x stays plain, or convthin.c's */
	/* the flag elsewhere, and a CONV that keeps without its output */
	struct kiln_op op;
	void *plan;
	conv_op(&op, KILN_OP_CONV, &cnn2, 14, 14, 0);
	op.flags = KILN_OPF_KEEP;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.type = KILN_OP_RELU;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	fx_close(&f);
	/* the CPU's FFT keeps spectra (x's for the weight gradient, dy's for
	 * the data gradient), in both layouts; a build without FFTW refuses
	 * conv_algo = fft */
	if (!cpu)
		return;
	if (fx_try_open_with(&f, _i, "plugin.cpu.conv_algo=fft") != KILN_OK) {
		ck_assert_msg(strstr(kiln_last_error(), "no FFTW") != NULL, "%s", kiln_last_error());
		return;
	}
	kept_case(&f, &cnn2, 0, 1, 0);
	kept_case(&f, &cnn2, 1, 1, 0);
	fx_close(&f);
}
END_TEST

/* oneDNN 2.6 has bf16 convolutions other than its reference loops from
 * avx512_core up (emulated there, AVX512-BF16 above); below it, only those */
static int onednn_bf16_conv(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

/* bf16 kept copies (CPU): the copy is in its producer's kernel dtype (bf16,
 * or f32 where tune.c picked the f32 kernel), so a consumer reads it only
 * when its own kernel dtype is the same.  KILN_CPU_TUNEPICK (tune.c, the
 * tests' hook) sets the three ops' choices: with equal ones the kept ops
 * give the plain ops' results bit for bit (the inputs they should read
 * from the copies zeroed); with different ones the consumer refuses
 * (KILN_ENOTSUP: the layer then reads its tensor as it is), never
 * KILN_EINVAL nor a wrong read.  fft16 0: with KILN_CPU_FFT_FFTW set, so
 * that the picks choose oneDNN's kernels for this conv2 on AVX-512 too;
 * fft16 1: without, where on AVX-512F, BW and VL bf16_conv = auto runs the
 * three by FFT on fft16.c's blocks, which read and write the bf16 tensors
 * (the picks unread; the copies are the FFT's spectra, as lowp.c's). */
static void kept_bf16_case(struct fx *f, const struct conv_g *q, const char *pick, int fft16)
{
	const int N = q->N, C = q->C, O = q->O, H = q->H, W = q->W;
	const int OH = (H + 2 * q->ph - q->dh * (q->KH - 1) - 1) / q->sh + 1;
	const int OW = (W + 2 * q->pw - q->dw * (q->KW - 1) - 1) / q->sw + 1;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * O * OH * OW;
	const size_t nw = (size_t)O * (C / q->g) * q->KH * q->KW;
	const int fk = pick[0] == '1', wk = pick[2] == '1', dk = pick[4] == '1';
	setenv("KILN_CPU_TUNEPICK", pick, 1);
	if (!fft16)
		setenv("KILN_CPU_FFT_FFTW", "1", 1);
	uint16_t *x = malloc(nx * 2), *w = malloc(nw * 2), *dy = malloc(ny * 2);
	for (size_t i = 0; i < nx; i++)
		x[i] = h_bf16(frand());
	for (size_t i = 0; i < nw; i++)
		w[i] = h_bf16(frand());
	for (size_t i = 0; i < ny; i++)
		dy[i] = h_bf16(frand());
	float *b = frandv((size_t)O);
	const size_t out_b = ny * 2 + nx * 2 + nw * 4 + (size_t)O * 4;
	char *want = malloc(out_b), *got = malloc(out_b);
	void *dX = dput(f, x, nx * 2), *dDY = dput(f, dy, ny * 2), *dW = dput(f, w, nw * 2);
	void *dB = dput(f, b, (size_t)O * 4), *dY = dput(f, NULL, ny * 2), *dDX = dput(f, NULL, nx * 2);
	void *dDW = dput(f, NULL, nw * 4), *dDB = dput(f, NULL, (size_t)O * 4);
	uint16_t *zeros = calloc(nx > ny ? nx : ny, 2);
	void *z = dput(f, zeros, (nx > ny ? nx : ny) * 2);
	struct kiln_op fw, bw, bd;
	conv_op(&fw, KILN_OP_CONV, q, OH, OW, 0);
	conv_op(&bw, KILN_OP_CONV_BWD_WEIGHTS, q, OH, OW, 0);
	conv_op(&bd, KILN_OP_CONV_BWD_DATA, q, OH, OW, 0);
	fw.in[0].dtype = fw.in[1].dtype = fw.out[0].dtype = KILN_BF16;
	bw.in[0].dtype = bw.in[1].dtype = KILN_BF16;
	bd.in[0].dtype = bd.in[1].dtype = bd.out[0].dtype = KILN_BF16;
	OK(run_op(f, &fw, (const void *[]){ dX, dW, dB }, (void *[]){ dY }));
	OK(run_op(f, &bw, (const void *[]){ dX, dDY }, (void *[]){ dDW, dDB }));
	OK(run_op(f, &bd, (const void *[]){ dDY, dW }, (void *[]){ dDX }));
	dget(f, want, dY, ny * 2), dget(f, want + ny * 2, dDX, nx * 2);
	dget(f, want + ny * 2 + nx * 2, dDW, nw * 4), dget(f, want + ny * 2 + nx * 2 + nw * 4, dDB, (size_t)O * 4);

	fw.flags = bw.flags = bd.flags = KILN_OPF_KEEP;
	fw.out[fw.n_out++] = td(KILN_U8, 1, 1, 0);
	void *dKX = NULL, *dKDY = NULL, *plan;
	const long kx = kept_bytes(f, &fw);
	/* no oneDNN bf16 convolution but its reference loops (below
	 * avx512_core): either pick is lowp.c's f32 op, computed as
	 * [plugin.cpu] conv_algo says, so its copies are that op's
	 * (oneDNN's blocked f32 x, or the FFT's spectrum: conv2 under the
	 * rule), of a size this test does not predict */
	/* (fft16.c: AVX-512F, BW and VL, which onednn_bf16_conv asks too) */
	const int lowp = !onednn_bf16_conv() || fft16;
	if (lowp)
		ck_assert_msg(kx > 0, "bf16 CONV keep, picks %s, no bf16 kernel: kept %ld (%s)", pick, kx,
			      kiln_last_error());
	else
		ck_assert_msg(kx == (long)(nx * (fk ? 4 : 2)), "bf16 CONV keep, picks %s: kept %ld bytes, want %zu (%s)",
			      pick, kx, nx * (fk ? 4 : 2), kiln_last_error());
	dKX = dput(f, NULL, (size_t)kx);
	OK(run_op(f, &fw, (const void *[]){ dX, dW, dB }, (void *[]){ dY, dKX }));
	bw.in[bw.n_in++] = td(KILN_U8, 1, kx, 0);
	bw.out[bw.n_out++] = td(KILN_U8, 1, 1, 0);
	if (wk != fk) { /* the copy is in another dtype than this kernel's */
		ck_assert_int_eq(kiln_device_prepare(f->dev, &bw, &plan, NULL), KILN_ENOTSUP);
		goto out;
	}
	const long kdy = kept_bytes(f, &bw);
	ck_assert_msg(lowp ? kdy > 0 : kdy == (long)(ny * (wk ? 4 : 2)),
		      "bf16 CONV_BWD_WEIGHTS keep, picks %s: kept %ld (%s)", pick, kdy, kiln_last_error());
	dKDY = dput(f, NULL, (size_t)kdy);
	OK(run_op(f, &bw, (const void *[]){ z, dDY, dKX }, (void *[]){ dDW, dDB, dKDY }));
	bd.in[bd.n_in++] = td(KILN_U8, 1, kdy, 0);
	if (dk != wk) {
		ck_assert_int_eq(kiln_device_prepare(f->dev, &bd, &plan, NULL), KILN_ENOTSUP);
	} else {
		OK(run_op(f, &bd, (const void *[]){ z, dW, dKDY }, (void *[]){ dDX }));
		dget(f, got, dY, ny * 2), dget(f, got + ny * 2, dDX, nx * 2);
		dget(f, got + ny * 2 + nx * 2, dDW, nw * 4), dget(f, got + ny * 2 + nx * 2 + nw * 4, dDB, (size_t)O * 4);
		/* y and dx bit for bit; dw and db (f32 sums over the batch)
		 * to rounding: on AVX2 oneDNN's weight-gradient kernel sums
		 * a kept (blocked) input in another order than a plain one
		 * (5e-7 relative here; bit for bit on AVX-512) */
		const size_t nyx = ny * 2 + nx * 2;
		ck_assert_msg(!memcmp(got, want, nyx), "bf16 kept copies, picks %s: y or dx differ from the plain ops'", pick);
		const float *gw = (const float *)(got + nyx), *ww = (const float *)(want + nyx);
		float scale = 0, diff = 0;
		for (size_t i = 0; i < nw + (size_t)O; i++) {
			scale = fmaxf(scale, fabsf(ww[i]));
			diff = fmaxf(diff, fabsf(gw[i] - ww[i]));
		}
		ck_assert_msg(diff <= 1e-5f * scale, "bf16 kept copies, picks %s: dw or db differ from the plain ops' by %g (max %g)",
			      pick, (double)diff, (double)scale);
	}
	DFREE(f, dKDY);
out:
	unsetenv("KILN_CPU_TUNEPICK");
	unsetenv("KILN_CPU_FFT_FFTW");
	DFREE(f, dX, dDY, dW, dB, dY, dDX, dDW, dDB, z, dKX);
	free(x), free(w), free(b), free(dy), free(want), free(got), free(zeros);
}

START_TEST(test_conv_keep_bf16)
{
	/* N C O H W KH KW sh sw ph pw dh dw g bias: the bf16 CNN's conv2 */
	static const struct conv_g cnn2 = { 4, 32, 64, 14, 14, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1 };
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_CONV);
	if (strcmp(g_name, "cpu")) { /* the hook and the kept dtypes are the CPU's */
		fx_close(&f);
		return;
	}
	static const char *const picks[] = { "0,0,0", "1,1,1", "0,1,0", "1,0,0", "0,0,1", "1,1,0" };
	for (size_t i = 0; i < sizeof picks / sizeof *picks; i++)
		kept_bf16_case(&f, &cnn2, picks[i], 0);
	kept_bf16_case(&f, &cnn2, "0,0,0", 1);
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

/* Pooling's forward (dX -> dY, the argmax into aux) then its backward
 * (dDY -> dDX), on one workspace, and wait. */
static void pool_fwd_bwd(struct fx *f, void *fplan, void *bplan, void *dX, void *dDY, void *dY,
			 void *dDX, void *aux, void *ws, size_t wsb)
{
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dX, a.out[0] = dY, a.out[1] = aux, a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, fplan, &a, f->s));
	memset(&a, 0, sizeof a);
	a.in[0] = dDY, a.in[1] = aux, a.in[2] = dX, a.out[0] = dDX;
	a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, bplan, &a, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
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
	pool_fwd_bwd(f, fplan, bplan, dX, dDY, dY, dDX, aux, ws, wsb);

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
		/* NCHW rows in vectors of 8 (OW 14, the CNN's, and 9: the last
		 * vector overlaps) and 4 (OW 7 and 5), odd sizes dropping a
		 * column and a row */
		{ 2, 3, 28, 28, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 },
		{ 1, 2, 9, 19, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 },
		{ 2, 5, 14, 14, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 },
		{ 2, 3, 10, 11, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 },
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

/* 2x2 stride-2 max pooling's rule for ties and NaN (PyTorch's): the first
 * maximum in the window's row-major order wins, and a NaN wins over any
 * number, the last NaN if there are more (PyTorch's `val > max ||
 * isnan(val)` scan); the backward sends the whole
 * gradient to that one position.  Channel c's windows are pattern c % 3's:
 * pattern 0's windows tie, pattern 1's hold a NaN after a larger number,
 * pattern 2's two NaNs.  The two windows of a channel repeat REP times
 * along the row (rep 1: 2 windows, NCHW's scalar loop; 3 and 7: 6 and 14,
 * its vectors of 4 and 8).  C channels: 3 (NHWC's scalar loop), 11 and 16
 * (its vectors of 8 channels, the last overlapping at 11). */
enum { RULE_P = 3, RULE_MAXC = 16, RULE_H = 2, RULE_MAXREP = 7, RULE_MAXW = 4 * RULE_MAXREP };
static void pool_rule_case(struct fx *f, int nhwc, int rep, int C)
{
	enum { N = 1, H = RULE_H };
	const int W = 4 * rep, OW = 2 * rep;
	/* [pattern][h][w]: window j is columns 2j, 2j+1 of both rows */
	static const float x4[RULE_P][H][4] = {
		{ { 1, 1, 7, 2 }, { 1, 1, 7, 7 } },
		{ { 0, 5, -1, 4 }, { NAN, 6, 3, NAN } },
		{ { NAN, 2, 1, NAN }, { NAN, 9, NAN, 1 } },
	};
	/* the winning position (h, w) of each output (c, j), j < 2 */
	static const int win[RULE_P][2][2] = { { { 0, 0 }, { 0, 2 } }, { { 1, 0 }, { 1, 3 } },
					       { { 1, 0 }, { 1, 2 } } };
	float x[RULE_MAXC][H][RULE_MAXW], dy[RULE_MAXC * RULE_MAXW / 2];
	for (int c = 0; c < C; c++)
		for (int h = 0; h < H; h++)
			for (int w = 0; w < W; w++)
				x[c][h][w] = x4[c % RULE_P][h][w % 4];
	for (int i = 0; i < C * OW; i++)
		dy[i] = (float)(i + 1);
	float xd[RULE_MAXC * H * RULE_MAXW]; /* x without the unused columns */
	for (int c = 0; c < C; c++)
		for (int h = 0; h < H; h++)
			memcpy(&xd[(c * H + h) * W], x[c][h], (size_t)W * sizeof(float));
	const struct pool_g q = { N, C, H, W, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 };
	struct kiln_op op;
	void *fplan, *bplan, *ws = NULL, *aux = NULL;
	size_t wsb = 0, bwsb = 0;
	pool_op(&op, 0, &q, 1, OW, nhwc);
	OK(kiln_device_prepare(f->dev, &op, &fplan, &wsb));
	pool_op(&op, 1, &q, 1, OW, nhwc);
	OK(kiln_device_prepare(f->dev, &op, &bplan, &bwsb));
	wsb = bwsb > wsb ? bwsb : wsb;
	float *k1, *k2;
	void *dX = dput4(f, xd, N, C, H, W, nhwc, &k1), *dDY = dput4(f, dy, N, C, 1, OW, nhwc, &k2);
	void *dY = dput(f, NULL, (size_t)C * OW * 4), *dDX = dput(f, NULL, (size_t)C * H * W * 4);
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	OK(kiln_device_alloc(f->dev, aux_bytes(f, fplan), &aux));
	pool_fwd_bwd(f, fplan, bplan, dX, dDY, dY, dDX, aux, ws, wsb);
	float *y = dget4(f, dY, N, C, 1, OW, nhwc), *dx = dget4(f, dDX, N, C, H, W, nhwc);
	for (int c = 0; c < C; c++)
		for (int j = 0; j < OW; j++) {
			const int wh = win[c % RULE_P][j % 2][0], ww = win[c % RULE_P][j % 2][1] + 4 * (j / 2);
			const float want = x[c][wh][ww], got = y[c * OW + j];
			ck_assert_msg(want != want ? got != got : got == want,
				      "%s max pool (rep %d, C %d) c%d window %d: %g, want %g",
				      nhwc ? "NHWC" : "NCHW", rep, C, c, j, got, want);
			for (int h = 0; h < H; h++)
				for (int w = 2 * j; w < 2 * j + 2; w++) {
					const int at = h == wh && w == ww;
					ck_assert_msg(dx[(c * H + h) * W + w] == (at ? dy[c * OW + j] : 0.0f),
						      "%s max pool backward (rep %d) c%d h%d w%d: %g",
						      nhwc ? "NHWC" : "NCHW", rep, c, h, w, dx[(c * H + h) * W + w]);
				}
		}
	kiln_device_plan_free(f->dev, fplan);
	kiln_device_plan_free(f->dev, bplan);
	void *d[] = { dX, dDY, dY, dDX, ws, aux };
	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		kiln_device_free(f->dev, d[i]);
	free(y), free(dx), free(k1), free(k2);
}

START_TEST(test_pool_rule)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_POOL);
	static const int reps[] = { 1, 3, 7 }, chans[] = { 3, 11, 16 };
	for (int nhwc = 0; nhwc < 2; nhwc++)
		for (size_t r = 0; r < sizeof reps / sizeof *reps; r++)
			for (size_t k = 0; k < sizeof chans / sizeof *chans; k++)
				pool_rule_case(&f, nhwc, reps[r], chans[k]);
	fx_close(&f);
}
END_TEST

/* The ReLU folded into 2x2 max pooling (ABI 2.16: POOL with KILN_OPF_ACT,
 * ReLU): the folded forward and backward against the unfolded ones, POOL,
 * RELU_BWD of dy by y (dy * (y > 0)), POOL_BWD, bit for bit: y and dx.  x is
 * a ReLU's output: positive values, zeros of both signs (oneDNN's ReLU
 * writes -0 for a negative input), NaNs; so some windows hold no positive
 * value (their gradient is cut) and some a NaN.  dt: f32, or bf16 (NCHW:
 * kiln's kernel; the device may refuse a bf16 fold in NHWC). */
static void *fold_put(struct fx *f, const float *h, size_t n, int N, int C, int H, int W, int nhwc,
		      int dt)
{
	if (dt == KILN_F32) {
		float *keep;
		void *d = dput4(f, h, N, C, H, W, nhwc, &keep);
		OK(kiln_device_stream_sync(f->dev, f->s)); /* the copy read keep */
		free(keep);
		return d;
	}
	uint16_t *b = malloc(n * 2); /* NCHW: the stored order is the logical one */
	for (size_t i = 0; i < n; i++)
		b[i] = h_bf16(h[i]);
	void *d = dput(f, b, n * 2);
	OK(kiln_device_stream_sync(f->dev, f->s));
	free(b);
	return d;
}

static void fold_case(struct fx *f, int N, int C, int H, int W, int nhwc, int dt)
{
	const int OH = H / 2, OW = W / 2, es = dt == KILN_F32 ? 4 : 2;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
	const struct pool_g q = { N, C, H, W, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 };
	float *x = frandv(nx), *dy = frandv(ny);
	for (size_t i = 0; i < nx; i++)
		x[i] = i % 53 == 7 ? NAN : x[i] > 0.5f ? x[i] : i % 3 ? 0.0f : -0.0f;
	char tag[96];
	snprintf(tag, sizeof tag, "%s %s [%d,%d,%d,%d]", nhwc ? "NHWC" : "NCHW",
		 dt == KILN_F32 ? "f32" : "bf16", N, C, H, W);
	struct kiln_op op, rop;
	void *ffold, *fplain, *bplan, *rplan;
	size_t wsb = 0, w = 0;
	pool_op(&op, 0, &q, OH, OW, nhwc);
	op.in[0].dtype = op.out[0].dtype = dt;
	op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	kiln_status st = kiln_device_prepare(f->dev, &op, &ffold, &w);
	if (st == KILN_ENOTSUP && (dt != KILN_F32 || strcmp(g_name, "cpu"))) {
		free(x), free(dy);
		return; /* refused: the layer masks apart (bf16 NHWC on the CPU, CUDA) */
	}
	ck_assert_msg(st == KILN_OK, "%s: the CPU refused the fold: %s", tag, kiln_last_error());
	wsb = w > wsb ? w : wsb;
	op.flags = 0, op.i[KILN_OPI_ACT] = 0;
	OK(kiln_device_prepare(f->dev, &op, &fplain, &w));
	wsb = w > wsb ? w : wsb;
	ck_assert_uint_eq(aux_bytes(f, ffold), aux_bytes(f, fplain));
	pool_op(&op, 1, &q, OH, OW, nhwc);
	op.in[0].dtype = op.in[2].dtype = op.out[0].dtype = dt;
	OK(kiln_device_prepare(f->dev, &op, &bplan, &w));
	wsb = w > wsb ? w : wsb;
	memset(&rop, 0, sizeof rop);
	rop.type = KILN_OP_RELU_BWD, rop.n_in = 2, rop.n_out = 1;
	rop.in[0] = rop.in[1] = rop.out[0] = td4(N, C, OH, OW, nhwc);
	rop.in[0].dtype = rop.in[1].dtype = rop.out[0].dtype = dt;
	OK(kiln_device_prepare(f->dev, &rop, &rplan, &w));
	wsb = w > wsb ? w : wsb;
	const size_t ab = aux_bytes(f, ffold);
	void *dX = fold_put(f, x, nx, N, C, H, W, nhwc, dt), *ws = NULL, *aux = NULL;
	void *dY[2], *dDX[2], *dDY[2];
	for (int k = 0; k < 2; k++) {
		dY[k] = dput(f, NULL, ny * es), dDX[k] = dput(f, NULL, nx * es);
		dDY[k] = fold_put(f, dy, ny, N, C, OH, OW, nhwc, dt);
	}
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	OK(kiln_device_alloc(f->dev, ab, &aux));
	/* folded: the POOL keeps the mask in aux, then POOL_BWD */
	pool_fwd_bwd(f, ffold, bplan, dX, dDY[0], dY[0], dDX[0], aux, ws, wsb);
	/* unfolded: POOL, dy masked by y in place, POOL_BWD */
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dX, a.out[0] = dY[1], a.out[1] = aux, a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, fplain, &a, f->s));
	memset(&a, 0, sizeof a);
	a.in[0] = dY[1], a.in[1] = dDY[1], a.out[0] = dDY[1], a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, rplan, &a, f->s));
	memset(&a, 0, sizeof a);
	a.in[0] = dDY[1], a.in[1] = aux, a.in[2] = dX, a.out[0] = dDX[1];
	a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(f->dev, bplan, &a, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
	unsigned char *h[2][2];
	for (int k = 0; k < 2; k++) {
		h[k][0] = malloc(ny * es), h[k][1] = malloc(nx * es);
		dget(f, h[k][0], dY[k], ny * es);
		dget(f, h[k][1], dDX[k], nx * es);
	}
	ck_assert_msg(!memcmp(h[0][0], h[1][0], ny * es), "%s: the folded POOL's y differs", tag);
	ck_assert_msg(!memcmp(h[0][1], h[1][1], nx * es), "%s: the folded POOL_BWD's dx differs", tag);
	/* the fold cut something: some window of x held no positive value */
	size_t kept = 0;
	for (size_t i = 0; i < nx; i++) {
		float v;
		if (dt == KILN_F32)
			memcpy(&v, h[0][1] + 4 * i, 4);
		else {
			uint16_t b;
			memcpy(&b, h[0][1] + 2 * i, 2);
			v = h_wide(b, KILN_BF16);
		}
		kept += v != 0.0f;
	}
	ck_assert_msg(kept > 0 && kept < ny, "%s: %zu of %zu windows pass a gradient", tag, kept, ny);
	for (int k = 0; k < 2; k++) {
		free(h[k][0]), free(h[k][1]);
		kiln_device_free(f->dev, dY[k]), kiln_device_free(f->dev, dDX[k]);
		kiln_device_free(f->dev, dDY[k]);
	}
	void *pl[] = { ffold, fplain, bplan, rplan };
	for (size_t i = 0; i < sizeof pl / sizeof *pl; i++)
		kiln_device_plan_free(f->dev, pl[i]);
	kiln_device_free(f->dev, dX), kiln_device_free(f->dev, ws), kiln_device_free(f->dev, aux);
	free(x), free(dy);
}

START_TEST(test_pool_relu_fold)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_POOL);
	/* the CNN's (NCHW rows of 14 and 7: vectors of 8 and 4), odd sizes
	 * dropping a row and a column, 2 windows a row (the scalar loop),
	 * NHWC channels by 8 (the vector backward) and not, enough for the
	 * threads */
	static const int shapes[][4] = { { 2, 3, 28, 28 }, { 2, 16, 14, 14 }, { 1, 2, 9, 19 },
					 { 2, 5, 10, 11 }, { 1, 3, 5, 4 }, { 1, 8, 6, 6 },
					 { 8, 32, 32, 32 } };
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
		for (int nhwc = 0; nhwc < 2; nhwc++)
			for (int b = 0; b < 2; b++)
				fold_case(&f, shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], nhwc && !b,
					  b ? KILN_BF16 : KILN_F32);
	/* only where it is exact: the overlapping, padded windows (oneDNN's
	 * kernel) refuse it, and the layer masks apart */
	if (!strcmp(g_name, "cpu")) {
		const struct pool_g q = { 2, 3, 13, 13, KILN_POOL_MAX, 3, 3, 2, 2, 1, 1, 0 };
		struct kiln_op op;
		void *plan = NULL;
		pool_op(&op, 0, &q, 7, 7, 0);
		op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_ENOTSUP);
	}
	fx_close(&f);
}
END_TEST

/* Max pooling NHWC -> NCHW (ABI 2.17: conv1's NHWC output pooled into an
 * NCHW model) against the NHWC pooling, bit for bit: y (the NHWC one's
 * transposed), dx (from the same logical dy), with the folded ReLU
 * (relu = 1) and without, training and inference.  x as fold_case's: a
 * ReLU's output with zeros of both signs and NaNs. */
static void mixed_case(struct fx *f, int N, int C, int H, int W, int relu)
{
	const int OH = H / 2, OW = W / 2;
	const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
	const struct pool_g q = { N, C, H, W, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 };
	float *x = frandv(nx), *dy = frandv(ny), *keep;
	for (size_t i = 0; i < nx; i++)
		x[i] = i % 53 == 7 ? NAN : x[i] > 0.5f ? x[i] : i % 3 ? 0.0f : -0.0f;
	char tag[96];
	snprintf(tag, sizeof tag, "NHWC -> NCHW%s [%d,%d,%d,%d]", relu ? " relu" : "", N, C, H, W);
	/* [k]: 0 NHWC -> NHWC, 1 NHWC -> NCHW; [k][0] forward, [1] backward, [2] inference */
	void *plan[2][3];
	size_t wsb = 0, w = 0;
	for (int k = 0; k < 2; k++)
		for (int b = 0; b < 3; b++) {
			struct kiln_op op;
			pool_op(&op, b == 1, &q, OH, OW, 1);
			struct kiln_tensor_desc *y = b == 1 ? &op.in[0] : &op.out[0];
			y->layout = k ? KILN_NCHW : KILN_NHWC;
			if (b == 0 && relu)
				op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
			if (b == 2)
				op.n_out = 1;
			kiln_status st = kiln_device_prepare(f->dev, &op, &plan[k][b], &w);
			/* refused: the core plans in one layout (CUDA), or runs the
			 * ReLU apart where the device folds none into the pooling */
			if ((k || (b == 0 && relu)) && st == KILN_ENOTSUP && strcmp(g_name, "cpu")) {
				printf("device '%s': skipping %s: %s\n", g_name, tag, kiln_last_error());
				for (int j = 0; j < b; j++)
					kiln_device_plan_free(f->dev, plan[k][j]);
				for (int j = 0; j < 3 && k; j++)
					kiln_device_plan_free(f->dev, plan[0][j]);
				free(x), free(dy);
				return;
			}
			ck_assert_msg(st == KILN_OK, "%s: prepare %d/%d: %s", tag, k, b, kiln_last_error());
			wsb = w > wsb ? w : wsb;
		}
	const size_t ab = aux_bytes(f, plan[0][0]);
	ck_assert_uint_eq(aux_bytes(f, plan[1][0]), ab);
	void *dX = dput4(f, x, N, C, H, W, 1, &keep), *ws = NULL, *aux = NULL;
	OK(kiln_device_stream_sync(f->dev, f->s));
	free(keep);
	void *dY[2], *dDX[2], *dDY[2], *dYI[2];
	for (int k = 0; k < 2; k++) {
		dY[k] = dput(f, NULL, ny * 4), dDX[k] = dput(f, NULL, nx * 4), dYI[k] = dput(f, NULL, ny * 4);
		dDY[k] = dput4(f, dy, N, C, OH, OW, !k, &keep);
		OK(kiln_device_stream_sync(f->dev, f->s));
		free(keep);
	}
	if (wsb)
		OK(kiln_device_alloc(f->dev, wsb, &ws));
	OK(kiln_device_alloc(f->dev, ab ? ab : 1, &aux));
	float *h[2][3];
	for (int k = 0; k < 2; k++) {
		pool_fwd_bwd(f, plan[k][0], plan[k][1], dX, dDY[k], dY[k], dDX[k], aux, ws, wsb);
		struct kiln_op_args a;
		memset(&a, 0, sizeof a);
		a.in[0] = dX, a.out[0] = dYI[k], a.workspace = ws, a.workspace_bytes = wsb;
		OK(kiln_device_run(f->dev, plan[k][2], &a, f->s));
		OK(kiln_device_stream_sync(f->dev, f->s));
		h[k][0] = malloc(ny * 4), h[k][1] = malloc(nx * 4), h[k][2] = malloc(ny * 4);
		dget(f, h[k][0], dY[k], ny * 4);
		dget(f, h[k][1], dDX[k], nx * 4);
		dget(f, h[k][2], dYI[k], ny * 4);
	}
	/* the NHWC y in NCHW order */
	for (int b = 0; b < 3; b += 2) {
		float *t = malloc(ny * 4);
		for (int n = 0; n < N; n++)
			for (int c = 0; c < C; c++)
				for (int i = 0; i < OH * OW; i++)
					t[((size_t)n * C + c) * OH * OW + i] = h[0][b][((size_t)n * OH * OW + i) * C + c];
		ck_assert_msg(!memcmp(t, h[1][b], ny * 4), "%s: the %s y differs from the NHWC pooling's", tag,
			      b ? "inference" : "training");
		free(t);
	}
	ck_assert_msg(!memcmp(h[0][1], h[1][1], nx * 4), "%s: dx differs from the NHWC pooling's", tag);
	size_t nz = 0;
	for (size_t i = 0; i < nx; i++)
		nz += h[1][1][i] != 0.0f;
	ck_assert_msg(nz > 0 && nz <= ny, "%s: %zu of %zu windows pass a gradient", tag, nz, ny);
	for (int k = 0; k < 2; k++) {
		for (int b = 0; b < 3; b++)
			free(h[k][b]), kiln_device_plan_free(f->dev, plan[k][b]);
		kiln_device_free(f->dev, dY[k]), kiln_device_free(f->dev, dDX[k]);
		kiln_device_free(f->dev, dDY[k]), kiln_device_free(f->dev, dYI[k]);
	}
	kiln_device_free(f->dev, dX), kiln_device_free(f->dev, ws), kiln_device_free(f->dev, aux);
	free(x), free(dy);
}

START_TEST(test_pool_mixed_layout)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_POOL);
	/* the CNN's pool1 (C by 8: the vector backward), C not by 8, odd sizes
	 * dropping a row and a column, enough for the threads; the CPU's 8 x 8
	 * tiles (8 <= C <= 64, OW >= 8): the last column tile overlapping (OW
	 * 14, 18), the last channel block overlapping (C 12, 9, 60), OW
	 * exactly 8 with an odd W, C 64, and beside them the scratch row's
	 * shapes (C 7, 72; OW 3 and 7; the NHWC CNN's pool2, C 64 and OW 7; C
	 * 20, the scalar backward rows; C 72 with an odd W) */
	static const int shapes[][4] = { { 2, 32, 28, 28 }, { 2, 3, 10, 11 }, { 1, 5, 9, 19 },
					 { 1, 8, 6, 6 },    { 8, 32, 32, 32 }, { 2, 12, 20, 36 },
					 { 1, 9, 17, 17 },  { 3, 16, 8, 16 },  { 1, 7, 16, 16 },
					 { 2, 24, 14, 15 }, { 1, 64, 6, 18 },  { 1, 60, 5, 20 },
					 { 1, 72, 4, 16 }, { 3, 64, 14, 14 }, { 4, 20, 10, 6 },
					 { 2, 72, 6, 9 } };
	for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++)
		for (int relu = 0; relu < 2; relu++)
			mixed_case(&f, shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], relu);
	/* the CPU's kiln kernel only: oneDNN's windows are refused, bf16 too */
	if (!strcmp(g_name, "cpu")) {
		const struct pool_g q3 = { 2, 3, 13, 13, KILN_POOL_MAX, 3, 3, 2, 2, 1, 1, 0 };
		const struct pool_g q2 = { 2, 3, 12, 12, KILN_POOL_MAX, 2, 2, 2, 2, 0, 0, 0 };
		struct kiln_op op;
		void *plan = NULL;
		pool_op(&op, 0, &q3, 7, 7, 1);
		op.out[0].layout = KILN_NCHW;
		ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_ENOTSUP);
		pool_op(&op, 0, &q2, 6, 6, 1);
		op.out[0].layout = KILN_NCHW;
		op.in[0].dtype = op.out[0].dtype = KILN_BF16; /* f32 only (ABI 2.17): refused */
		ck_assert_int_ne(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_OK);
	}
	fx_close(&f);
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
	DFREE(f, dX, dY);
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
				/* the CNN's flatten: 8 x 8 tiles and both edges */
				reorder_case(&f, 2, 64, 7, 7, from, to, acc);
			}
	/* H x W = 2,099,601 pixels: NHWC -> NCHW has more than 65535 tiles of
	 * 32 pixels (the CUDA kernel's grid.y limit; before session 32 it did
	 * not launch there), and back */
	for (int acc = 0; acc < 2; acc++) {
		reorder_case(&f, 1, 1, 1449, 1449, 1, 0, acc);
		reorder_case(&f, 1, 1, 1449, 1449, 0, 1, acc);
	}
	fx_close(&f);
}
END_TEST

DEVICE_SUITE(conv, DFX_CASE(conv), DFX_CASE(conv_errors), DFX_CASE(conv_keep), DFX_CASE(conv_keep_bf16), DFX_CASE(pool),
	     DFX_CASE(pool_rule), DFX_CASE(pool_relu_fold), DFX_CASE(pool_mixed_layout),
	     DFX_CASE(concat_split),
	     DFX_CASE(reorder));
