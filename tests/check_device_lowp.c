/* tests/check_device_lowp.c - device conformance:
 * bf16 and f16 (docs/plugins.md, "Low-precision dtypes"): GEMM,
 * elementwise ops, casts, SGD, convolution and batchnorm against f32.
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

/* ---- bf16 and f16 (docs/plugins.md, "Low-precision dtypes") ------------ */

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
 * double loop over the widened operands.  mode 1: alpha 0.5 and
 * KILN_OPF_ACCUMULATE (out0 += 0.5 A B^T + bias, out0 starting as random
 * values of its dtype); mode 2: the fused ReLU (KILN_OPF_ACT).  An f32
 * bias into a 16-bit out0 is the CUDA device's staged path (gemm.c). */
static void lp_gemm_case(struct fx *f, int dt, int M, int N, int K, int out_f32, int mode)
{
	float *aw = malloc(sizeof(float) * M * K), *bw = malloc(sizeof(float) * N * K);
	uint16_t *a = lp_rand((size_t)M * K, dt, 1, aw), *b = lp_rand((size_t)N * K, dt, 1, bw);
	float *bias = frandv((size_t)N);
	const int odt = out_f32 ? KILN_F32 : dt;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 3, op.n_out = 1;
	op.in[0] = td(dt, 2, M, K), op.in[1] = td(dt, 2, N, K), op.in[2] = td(KILN_F32, 1, N, 0);
	op.out[0] = td(odt, 2, M, N);
	op.i[0] = 0, op.i[1] = 1, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = mode == 1 ? 0.5 : 1.0;
	if (mode == 1)
		op.flags = KILN_OPF_ACCUMULATE;
	if (mode == 2)
		op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	const size_t ob = (size_t)M * N * (out_f32 ? 4 : 2);
	/* out0's starting values (mode 1 adds into them) */
	float *c0w = malloc(sizeof(float) * M * N);
	uint16_t *c0l = lp_rand((size_t)M * N, dt, 1, c0w);
	if (out_f32)
		for (int i = 0; i < M * N; i++)
			c0w[i] = frand();
	void *da = dput(f, a, (size_t)M * K * 2), *db = dput(f, b, (size_t)N * K * 2),
	     *dbias = dput(f, bias, sizeof(float) * N),
	     *dc = dput(f, out_f32 ? (void *)c0w : (void *)c0l, ob);
	const void *in[3] = { da, db, dbias };
	void *out[1] = { dc };
	if (!refused(f, &op, mode == 1 ? "GEMM alpha 0.5, accumulating, f32 bias" : mode == 2 ? "GEMM with the ReLU, f32 bias" : "GEMM, f32 bias")) {
		OK(run_op(f, &op, in, out));
		void *c = malloc(ob);
		dget(f, c, dc, ob);
		for (int i = 0; i < M; i++)
			for (int j = 0; j < N; j++) {
				double ref = 0, mag = 0;
				for (int k = 0; k < K; k++) {
					ref += (double)aw[i * K + k] * bw[j * K + k];
					mag += fabs((double)aw[i * K + k] * bw[j * K + k]);
				}
				ref = op.f[0] * ref + bias[j], mag = op.f[0] * mag + fabs(bias[j]);
				if (mode == 1)
					ref += c0w[i * N + j], mag += fabs(c0w[i * N + j]);
				if (mode == 2)
					ref = ref > 0 ? ref : 0;
				const double got = out_f32 ? ((float *)c)[i * N + j]
							   : h_wide(((uint16_t *)c)[i * N + j], dt);
				/* f32 accumulation; one rounding of the result to dt */
				const double ulp = out_f32 ? 0 : dt == KILN_F16 ? 0x1p-11 : 0x1p-8;
				ck_assert_msg(fabs(got - ref) <= ulp * fabs(ref) + 1e-5 * mag,
					      "%s GEMM %dx%dx%d (out %s, mode %d) [%d,%d]: %g, reference %g",
					      dt == KILN_F16 ? "f16" : "bf16", M, N, K, out_f32 ? "f32" : "low",
					      mode, i, j, got, ref);
			}
		free(c);
	}
	kiln_device_free(f->dev, da), kiln_device_free(f->dev, db);
	kiln_device_free(f->dev, dbias), kiln_device_free(f->dev, dc);
	free(a), free(b), free(aw), free(bw), free(bias), free(c0w), free(c0l);
}

/* Elementwise ops in dt: the result equals the f32 op on the widened
 * operands, rounded once (bit for bit).  ADD accumulating (y += x0 + x1),
 * RELU, RELU_BWD, SOFTMAX_XENT (logits and dlogits in dt). */
static void lp_elementwise(struct fx *f, int dt)
{
	const int n = 1000;
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
	void *bufs[] = { d0, d1, dy };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		kiln_device_free(f->dev, bufs[i]);
	free(w0), free(w1), free(wy), free(x0), free(x1), free(y), free(got);
}

/* SOFTMAX_XENT of R x C logits and dlogits in dt (over the logits when
 * inplace): the f32 op on the widened logits, rounded once, its metrics
 * the same bits */
static void lp_xent(struct fx *f, int dt, int R, int C, int inplace)
{
	const int n = R * C;
	float *w = malloc(sizeof(float) * n), *g32 = malloc(sizeof(float) * n);
	uint16_t *x = lp_rand(n, dt, 4, w), *got = malloc(2 * (size_t)n);
	int32_t *lab = malloc(sizeof(int32_t) * R);
	for (int r = 0; r < R; r++)
		lab[r] = (r * 7) % C;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT, op.n_in = 2, op.n_out = 2;
	op.in[0] = op.out[0] = td(dt, 2, R, C), op.in[1] = td(KILN_I32, 1, R, 0);
	op.out[1] = td(KILN_F32, 1, 3, 0);
	op.i[0] = R, op.f[0] = 1.0 / R;
	float zero[3] = { 0 }, m_lp[3], m_32[3];
	void *dx = dput(f, x, 2 * (size_t)n), *dl = dput(f, lab, sizeof(int32_t) * R);
	void *dm = dput(f, zero, sizeof zero), *dy = inplace ? dx : dput(f, NULL, 2 * (size_t)n);
	OK(run_op(f, &op, (const void *[]){ dx, dl }, (void *[]){ dy, dm }));
	dget(f, got, dy, 2 * (size_t)n);
	dget(f, m_lp, dm, sizeof m_lp);
	op.in[0] = op.out[0] = td(KILN_F32, 2, R, C);
	void *dw = dput(f, w, sizeof(float) * n), *dg = dput(f, NULL, sizeof(float) * n);
	OK(kiln_device_copy_async(f->dev, dm, zero, sizeof zero, KILN_COPY_H2D, f->s));
	OK(run_op(f, &op, (const void *[]){ dw, dl }, (void *[]){ dg, dm }));
	dget(f, g32, dg, sizeof(float) * n);
	dget(f, m_32, dm, sizeof m_32);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == h_round(g32[i], dt), "SOFTMAX_XENT %d x %d dlogits %d", R, C,
			      i);
	ck_assert_msg(m_lp[0] == m_32[0] && m_lp[1] == m_32[1] && m_lp[2] == m_32[2],
		      "SOFTMAX_XENT %d x %d metrics %g %g %g, f32 %g %g %g", R, C, m_lp[0], m_lp[1],
		      m_lp[2], m_32[0], m_32[1], m_32[2]);
	void *bufs[] = { dx, dl, dm, dw, dg, inplace ? NULL : dy };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		if (bufs[i])
			kiln_device_free(f->dev, bufs[i]);
	free(w), free(g32), free(x), free(got), free(lab);
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
/* f32 outputs rounded once to dt by the device (CUDA's [plugin.cuda]
 * conv_wgrad = lowp: dw): allowed one rounding of dt too */
static int g_lp_f32_rounded;

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
			const double ulp = lp_out >> i & 1 || g_lp_f32_rounded
						   ? (dt == KILN_F16 ? 0x1p-11 : 0x1p-8) : 0;
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
	/* (the dropout counter { step, row0, rstride }: rank 1 of 3's rows) */
	int64_t step[KILN_DROP_CTR] = { 7, 1, 3 }, nn[2] = { n, KILN_DROP_CTR }, on[2] = { N, 0 };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BIAS_GRAD, op.n_in = 1, op.n_out = 1;
	op.in[0] = td(KILN_F32, 2, R, N), op.out[0] = td(KILN_F32, 1, N, 0);
	lp_same_as_f32(f, op, dt, 1, 0, (const void *const[]){ w }, (const void *const[]){ x }, nn,
		       on, "BIAS_GRAD");
	for (int bwd = 0; bwd < 2; bwd++) {
		memset(&op, 0, sizeof op);
		op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
		op.in[0] = op.out[0] = td(KILN_F32, 2, R, N);
		op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
		op.i[0] = 1234, op.i[1] = 3, op.f[0] = 0.3;
		on[0] = n;
		lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ w, step },
			       (const void *const[]){ x, NULL }, nn, on, bwd ? "DROPOUT_BWD" : "DROPOUT");
	}
	/* NHWC DROPOUT and DROPOUT_BWD (the mask drawn by logical NCHW index:
	 * CUDA's kern_nhwc_logical, the CPU's f32 pixel rows between the
	 * conversions): f16 was compared by no suite before session 33
	 * (docs/gpu.md said the CPU refused it; it takes it through lowp.c) */
	for (int bwd = 0; bwd < 2; bwd++) {
		memset(&op, 0, sizeof op);
		op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
		op.in[0] = op.out[0] = td4(4, 5, 8, 16, 1);
		op.in[1] = td(KILN_I64, 1, KILN_DROP_CTR, 0);
		op.i[0] = 1234, op.i[1] = 3, op.f[0] = 0.3;
		int64_t dn[2] = { 4 * 5 * 8 * 16, KILN_DROP_CTR }, dno[1] = { 4 * 5 * 8 * 16 };
		lp_same_as_f32(f, op, dt, 1, 1, (const void *const[]){ w, step },
			       (const void *const[]){ x, NULL }, dn, dno,
			       bwd ? "NHWC DROPOUT_BWD" : "NHWC DROPOUT");
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

/* bf16 2x2 max pooling in training, forward (with aux) and backward, both
 * layouts, against a reference on the bf16 bits: the output is the bits of
 * the window's maximum, the first in scan order, a NaN winning (PyTorch's
 * rule, NCHW), -0 and +0 ties included; dx is dy's bits at that position and +0
 * elsewhere, the rows and columns no window covers included (dx starts as
 * garbage).  Shapes reach each row kernel: NCHW rows of 8 and more, 4 to 7
 * and fewer windows, NHWC pixels of 8 and of 5 channels. */
static void lp_pool_train(struct fx *f)
{
	/* NCHW rows of 600 values, which the CPU takes 3 output rows at a time
	 * (pool.c, max2_run_bf16: about 2,048 floats of input rows): blocks of
	 * 3, 3, 3 and 1; the others whole planes.  The planes the windows tile
	 * with rows of at most 16 windows (even H and W: [2,8,8,8] and the
	 * last five) the CPU takes 16 / OW output rows a vector (pool.c,
	 * max2_run_bf16_pairs): 4 rows of 4; the CNN's 2 of 7 (42 rows: 21
	 * vectors) and 1 of 14; 3 of 5 (9 rows); 2 of 7 where 7 rows leave
	 * the last vector one; 1 of 16.  Then: odd H with even W (7 x 8: the
	 * pairs kernel must refuse it, else dx[0,0,6,5] is not +0); OW 1
	 * (16 rows a vector: 15 rows, a partial one); 4 rows of 3 (5 rows a
	 * vector: 12 rows, a partial last one); planes enough for several
	 * threads */
	static const int shp[][4] = { { 2, 3, 9, 17 }, { 2, 8, 8, 8 },   { 1, 5, 6, 7 },  { 1, 2, 21, 600 },
				      { 2, 3, 14, 14 }, { 1, 2, 4, 28 }, { 1, 3, 6, 10 }, { 1, 1, 14, 14 },
				      { 1, 2, 2, 32 },  { 1, 3, 7, 8 },  { 3, 5, 2, 2 },  { 1, 3, 8, 6 },
				      { 8, 16, 16, 16 } };
	for (int nhwc = 0; nhwc < 2 && !unsupported(f, KILN_OP_POOL); nhwc++)
		for (size_t s = 0; s < sizeof shp / sizeof *shp; s++) {
			const int N = shp[s][0], C = shp[s][1], H = shp[s][2], W = shp[s][3];
			const int OH = H / 2, OW = W / 2;
			const size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * OH * OW;
			uint16_t *x = malloc(2 * nx), *dy = malloc(2 * ny), *y = malloc(2 * ny),
				 *dx = malloc(2 * nx);
			/* few values: ties, -0; NaNs in NCHW (NHWC runs oneDNN's bf16
			 * kernel on the CPU, which lets a NaN lose its window) */
			for (size_t e = 0; e < nx; e++)
				x[e] = !nhwc && e % 37 == 5 ? 0x7fc1 : h_round(roundf(frand() * 4) / 4, KILN_BF16);
			for (size_t e = 0; e < ny; e++)
				dy[e] = h_round(frand(), KILN_BF16);
			memset(dx, 0xff, 2 * nx);
			struct kiln_op op;
			memset(&op, 0, sizeof op);
			op.type = KILN_OP_POOL, op.n_in = 1, op.n_out = 2;
			op.in[0] = td4(N, C, H, W, nhwc), op.out[0] = td4(N, C, OH, OW, nhwc);
			op.in[0].dtype = op.out[0].dtype = KILN_BF16;
			op.i[0] = KILN_POOL_MAX, op.i[1] = op.i[2] = op.i[3] = op.i[4] = 2;
			void *plan = NULL;
			size_t wsb = 0;
			OK(kiln_device_prepare(f->dev, &op, &plan, &wsb));
			const size_t ab = aux_bytes(f, plan);
			kiln_device_plan_free(f->dev, plan);
			/* the cpu keeps the maxima's positions (aux); a device that
			 * keeps none (CUDA) reads x again in the backward (in2) */
			if (!strcmp(g_name, "cpu"))
				ck_assert_uint_gt(ab, 0);
			void *dxin = dput(f, x, 2 * nx), *dyout = dput(f, NULL, 2 * ny),
			     *daux = dput(f, NULL, ab ? ab : 64), *ddy = dput(f, dy, 2 * ny),
			     *ddx = dput(f, dx, 2 * nx);
			OK(run_op(f, &op, (const void *const[]){ dxin }, (void *const[]){ dyout, daux }));
			struct kiln_op b = op;
			b.type = KILN_OP_POOL_BWD, b.n_in = 2, b.n_out = 1;
			b.in[0] = op.out[0], b.out[0] = op.in[0], memset(&b.in[1], 0, sizeof b.in[1]);
			if (!ab)
				b.n_in = 3, b.in[2] = op.in[0];
			OK(run_op(f, &b, (const void *const[]){ ddy, daux, dxin }, (void *const[]){ ddx }));
			dget(f, y, dyout, 2 * ny);
			dget(f, dx, ddx, 2 * nx);
			char what[96];
			snprintf(what, sizeof what, "bf16 max POOL %s [%d,%d,%d,%d]", nhwc ? "NHWC" : "NCHW", N,
				 C, H, W);
			for (int n = 0; n < N; n++)
				for (int c = 0; c < C; c++)
					for (int h = 0; h < H; h++)
						for (int w = 0; w < W; w++) {
							const size_t o = at4(nhwc, C, H, W, n, c, h, w);
							int want = 0; /* dx: +0 unless the window's max */
							if (h < 2 * OH && w < 2 * OW) {
								const int i = h / 2, j = w / 2, k = (h % 2) * 2 + w % 2;
								int best = 0;
								float m = h_wide(x[at4(nhwc, C, H, W, n, c, 2 * i, 2 * j)], KILN_BF16);
								for (int t = 1; t < 4; t++) {
									const float v = h_wide(x[at4(nhwc, C, H, W, n, c, 2 * i + t / 2, 2 * j + t % 2)], KILN_BF16);
									if (v > m || v != v)
										m = v, best = t;
								}
								const size_t oy = at4(nhwc, C, OH, OW, n, c, i, j);
								if (k == 0) {
									const uint16_t wb = x[at4(nhwc, C, H, W, n, c, 2 * i + best / 2, 2 * j + best % 2)];
									ck_assert_msg(y[oy] == wb, "%s y[%d,%d,%d,%d]: %04x, want %04x",
										      what, n, c, i, j, y[oy], wb);
								}
								want = k == best ? dy[oy] : 0;
							}
							ck_assert_msg(dx[o] == want, "%s dx[%d,%d,%d,%d]: %04x, want %04x",
								      what, n, c, h, w, dx[o], want);
						}
			DFREE(f, dxin, dyout, daux, ddy, ddx);
			free(x), free(dy), free(y), free(dx);
		}
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
	float *gam = frandv(16), *bet = frandv(16), saved[32];
	for (int c = 0; c < 16; c++)
		gam[c] += 1.5f;
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

/* The device under test opened with one or two config overrides
 * (KEY=VALUE; o2 may be NULL), synchronous; fx_close closes it. */
static void lp_open(struct fx *g, const char *o1, const char *o2)
{
	memset(g, 0, sizeof *g);
	OK(kiln_registry_open(NULL, &g->reg));
	OK(kiln_config_new(&g->cfg));
	OK(kiln_config_override(g->cfg, o1));
	if (o2)
		OK(kiln_config_override(g->cfg, o2));
	OK(kiln_config_validate(g->cfg, g->reg));
	OK(kiln_device_open(g->reg, g->cfg, g_name, 0, &g->dev));
	OK(kiln_device_stream_create(g->dev, &g->s));
}

/* CUDA with [plugin.cuda] conv_wgrad = lowp: the weight gradient of bf16 /
 * f16 x and dy computed by cuDNN in that dtype and widened (PyTorch AMP's)
 * where no engine writes the f32 dw: the f32 op's dw within one rounding of
 * dt (and the accumulation order's 1e-5 of the largest), both layouts. */
static void lp_wgrad_lowp(int dt)
{
	struct fx g;
	lp_open(&g, "plugin.cuda.conv_wgrad=lowp", NULL);
	const struct conv_g q = { 4, 8, 16, 10, 10, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	const int64_t nx = 4 * 8 * 10 * 10, ny = 4 * 16 * 10 * 10, nw = 16 * 8 * 9;
	float *wx = malloc(sizeof(float) * nx), *wy = malloc(sizeof(float) * ny);
	uint16_t *hx = lp_rand(nx, dt, 1, wx), *hy = lp_rand(ny, dt, 1, wy);
	struct kiln_op op;
	g_lp_tol = 1e-5, g_lp_f32_rounded = 1;
	for (int nhwc = 0; nhwc < 2; nhwc++) {
		conv_op(&op, KILN_OP_CONV_BWD_WEIGHTS, &q, 10, 10, nhwc);
		lp_same_as_f32(&g, op, dt, 3, 0, (const void *const[]){ wx, wy },
			       (const void *const[]){ hx, hy }, (const int64_t[]){ nx, ny },
			       (const int64_t[]){ nw, 16 }, "CONV_BWD_WEIGHTS, conv_wgrad = lowp");
	}
	g_lp_tol = 0, g_lp_f32_rounded = 0;
	free(wx), free(wy), free(hx), free(hy);
	fx_close(&g);
}

START_TEST(test_lowp)
{
	struct fx f;
	fx_open(&f, _i);
	for (int k = 0; k < 2; k++) {
		const int dt = k ? KILN_F16 : KILN_BF16;
		for (int mode = 0; mode < 3; mode++) {
			lp_gemm_case(&f, dt, 33, 40, 50, 0, mode);
			lp_gemm_case(&f, dt, 16, 24, 64, 1, mode);
		}
		lp_elementwise(&f, dt);
		lp_xent(&f, dt, 20, 50, 0);
		/* a vocabulary's width (CUDA's block-a-row kernel), over the logits */
		lp_xent(&f, dt, 3, 1032, 1);
		lp_cast_sgd(&f, dt);
		lp_more(&f, dt);
		if (dt == KILN_BF16)
			lp_pool_train(&f);
		lp_conv_bn(&f, dt);
	}
	fx_close(&f);
	/* the CPU's kernels for bf16 GEMM and convolution ([plugin.cpu]
	 * bf16_gemm, bf16_conv; above: `auto`, whichever timed faster): each
	 * forced, against the same references; a GEMM's third, oneDNN's second
	 * bf16 implementation (bf16-2), beside the convolution's bf16 one */
	if (!strcmp(g_name, "cpu")) {
		static const char *const kern[] = { "bf16", "f32", "bf16" };
		static const char *const gkern[] = { "bf16", "f32", "bf16-2" };
		for (int k = 0; k < 3; k++) {
			struct fx g;
			char o1[64], o2[64];
			snprintf(o1, sizeof o1, "plugin.cpu.bf16_conv=%s", kern[k]);
			snprintf(o2, sizeof o2, "plugin.cpu.bf16_gemm=%s", gkern[k]);
			lp_open(&g, o1, o2);
			lp_gemm_case(&g, KILN_BF16, 33, 40, 50, 0, 0);
			lp_gemm_case(&g, KILN_BF16, 16, 24, 64, 1, 0);
			lp_conv_bn(&g, KILN_BF16);
			fx_close(&g);
		}
	}
	if (!strcmp(g_name, "cuda") && !_i) {
		lp_wgrad_lowp(KILN_BF16);
		lp_wgrad_lowp(KILN_F16);
	}
}
END_TEST

DEVICE_SUITE(lowp, DFX_CASE(lowp));
