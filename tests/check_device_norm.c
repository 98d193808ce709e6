/* tests/check_device_norm.c - device conformance:
 * batch normalisation, local and synchronised across a group.
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

/* Batchnorm with the fused ReLU (KILN_OPF_ACT, ABI 2.3) against the same
 * device's plain ops: BN_TRAIN and BN_INFER give max(y, 0); BN_BWD with
 * in4 = that y gives what the plain BN_BWD gives for dy * (y > 0).  Every
 * comparison is elementwise, so the buffers stay in the stored order.  A
 * device may refuse the flag (KILN_ENOTSUP: the layer runs an ACT). */
/* h into device buffer d, synchronously (h may change after) */
static void hput(struct fx *f, void *d, const void *h, size_t bytes)
{
	OK(kiln_device_copy_async(f->dev, d, h, bytes, KILN_COPY_H2D, f->s));
	OK(kiln_device_stream_sync(f->dev, f->s));
}

static kiln_status bn_pair(struct fx *f, struct kiln_op *op, const void *const *in,
			   void *const *out, int fused)
{
	op->flags = fused ? KILN_OPF_ACT : 0;
	op->i[KILN_OPI_ACT] = KILN_ACT_RELU;
	return run_op(f, op, in, out);
}

static void bn_act_case(struct fx *f, int N, int C, int H, int W, int nhwc)
{
	const size_t n = (size_t)N * C * H * W;
	float *x = frandv(n), *dy = frandv(n), *g = frandv((size_t)C), *b = frandv((size_t)C);
	float *rv = frandv((size_t)C), *y[2], *dx[2], *dg[2], *db[2];
	for (int c = 0; c < C; c++)
		rv[c] = 1.5f + rv[c];
	struct kiln_tensor_desc xd = td4(N, C, H, W, nhwc), cd = td(KILN_F32, 1, C, 0);
	void *dX = dput(f, x, n * 4), *dG = dput(f, g, (size_t)C * 4), *dB = dput(f, b, (size_t)C * 4);
	void *dRV = dput(f, rv, (size_t)C * 4), *dY = dput(f, NULL, n * 4);
	void *dS = dput(f, NULL, (size_t)C * 8), *dR[2] = { dput(f, NULL, (size_t)C * 4),
							    dput(f, NULL, (size_t)C * 4) };
	void *dDY = dput(f, NULL, n * 4), *dYF = dput(f, NULL, n * 4), *dDX = dput(f, NULL, n * 4);
	void *dDG = dput(f, NULL, (size_t)C * 4), *dDB = dput(f, NULL, (size_t)C * 4);
	struct kiln_op op;
	kiln_status st = KILN_OK;
	for (int fused = 0; fused < 2 && !st; fused++) {
		/* training: y; then the backward of dy through the ReLU */
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_TRAIN;
		op.n_in = 3, op.n_out = 4;
		op.in[0] = op.out[0] = xd;
		op.in[1] = op.in[2] = op.out[2] = op.out[3] = cd;
		op.out[1] = td(KILN_F32, 2, 2, C);
		op.f[0] = 1e-5, op.f[1] = 0.1;
		const void *in[5] = { dX, dG, dB };
		void *out[4] = { dY, dS, dR[0], dR[1] };
		if ((st = bn_pair(f, &op, in, out, fused)))
			break;
		dget(f, y[fused] = malloc(n * 4), dY, n * 4);
		if (!fused) { /* the plain ReLU's y, and dy through it */
			float *m = malloc(n * 4);
			for (size_t i = 0; i < n; i++)
				y[0][i] = y[0][i] > 0 ? y[0][i] : 0, m[i] = y[0][i] > 0 ? dy[i] : 0;
			hput(f, dDY, m, n * 4);
			hput(f, dYF, y[0], n * 4);
			free(m);
		} else {
			hput(f, dDY, dy, n * 4);
		}
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_BN_BWD;
		op.n_in = 4 + fused, op.n_out = 3;
		op.in[0] = op.in[1] = op.in[4] = op.out[0] = xd;
		op.in[2] = op.out[1] = op.out[2] = cd;
		op.in[3] = td(KILN_F32, 2, 2, C);
		const void *bin[5] = { dX, dDY, dG, dS, dYF };
		void *bout[3] = { dDX, dDG, dDB };
		if ((st = bn_pair(f, &op, bin, bout, fused)))
			break;
		dget(f, dx[fused] = malloc(n * 4), dDX, n * 4);
		dget(f, dg[fused] = malloc((size_t)C * 4), dDG, (size_t)C * 4);
		dget(f, db[fused] = malloc((size_t)C * 4), dDB, (size_t)C * 4);
	}
	ck_assert_msg(st == KILN_OK || st == KILN_ENOTSUP, "fused batchnorm: %s", kiln_last_error());
	for (size_t i = 0; !st && i < n; i++) {
		NEAR(y[1][i], y[0][i], fabs(y[0][i]), 1e-6, "BN_TRAIN+relu y[%zu] %g, want %g", i,
		     y[1][i], y[0][i]);
		NEAR(dx[1][i], dx[0][i], fabs(dx[0][i]), 1e-6, "BN_BWD+relu dx[%zu] %g, want %g", i,
		     dx[1][i], dx[0][i]);
	}
	for (int c = 0; !st && c < C; c++) {
		NEAR(dg[1][c], dg[0][c], fabs(dg[0][c]), 1e-6, "BN_BWD+relu dgamma[%d]", c);
		NEAR(db[1][c], db[0][c], fabs(db[0][c]), 1e-6, "BN_BWD+relu dbeta[%d]", c);
	}
	if (!st) {
		free(y[0]), free(y[1]), free(dx[0]), free(dx[1]);
		free(dg[0]), free(dg[1]), free(db[0]), free(db[1]);
	}
	void *d[] = { dX, dG, dB, dRV, dY, dS, dR[0], dR[1], dDY, dYF, dDX, dDG, dDB };
	for (size_t i = 0; i < sizeof d / sizeof *d; i++)
		kiln_device_free(f->dev, d[i]);
	free(x), free(dy), free(g), free(b), free(rv);
}

START_TEST(test_bn_act)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_BN_TRAIN);
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		bn_act_case(&f, 3, 5, 7, 7, nhwc);
		bn_act_case(&f, 8, 6, 30, 30, nhwc); /* parallel paths */
	}
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

DEVICE_SUITE(norm, DFX_CASE(bn), DFX_CASE(bn_act), DFX_CASE(bn_sync));
