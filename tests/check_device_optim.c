/* tests/check_device_optim.c - device conformance:
 * the optimizer ops: SGD (and its dampening), ADAMW (AdamW's decoupled and
 * Adam's L2 weight decay, amsgrad), LAMB, GRAD_CLIP (and its block sums,
 * GRAD_SUMSQ) and the mixed-precision UNSCALE and SCALER_UPDATE.
 *
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "internal.h" /* kiln_op_grad_clip, kiln_op_grad_sumsq */
#include "check_main.h"

#include <float.h> /* FLT_MAX */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	DFREE(f, dw, dv, dlr, dg);
	free(w), free(v), free(got);
}

DFX_TEST(sgd)
{
	sgd_case(f, 1000, 0.9f, 1e-4f, 0, 1);
	sgd_case(f, 1000, 0.9f, 1e-4f, 1, 1);
	sgd_case(f, 70001, 0.5f, 0.01f, 1, 1);
	sgd_case(f, 33, 0.0f, 0.0f, 0, 0);
}

/* ---- SGD's dampening (ABI 2.29) ------------------------------------------ */

/* SGD with a dampening f[3] over n elements, the step count t as in2 and
 * the multiplier d (has_d) as in3, five steps from step t0 (t0 = 1: a
 * fresh momentum buffer, zero; t0 > 1: a resumed one, v0 random) against
 * a double loop of kiln/ops.h's formula: at t = 1 the buffer is the
 * gradient, undamped (torch.optim.SGD's clone), after that mu*v +
 * (1 - dampening)*g.  A kernel that damped the first step, or took the
 * first step from v == 0 rather than from t, or read the step count as
 * the multiplier, fails. */
static void sgd_damp_case(struct fx *f, int n, float mu, float damp, int nesterov, int has_d,
			  int64_t t0)
{
	enum { STEPS = 5 };
	const size_t b = (size_t)n * 4;
	const float lrs[STEPS] = { 0.1f, 0.05f, 0.2f, 0.01f, 0.08f };
	const double l2 = 0.01;
	float *w = frandv((size_t)n), *v = t0 > 1 ? frandv((size_t)n) : calloc((size_t)n, 4);
	float *dm = malloc(b), *got = malloc(b);
	double *rw = malloc(8 * (size_t)n), *rv = malloc(8 * (size_t)n);
	for (int i = 0; i < n; i++) {
		dm[i] = (i % 3) ? 1.0f : 0.0f;
		rw[i] = w[i], rv[i] = v[i];
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SGD;
	op.n_in = 3 + has_d, op.n_out = 2;
	op.in[0] = op.out[0] = op.out[1] = op.in[3] = td(KILN_F32, 1, n, 0);
	op.in[1] = td(KILN_F32, 1, 1, 0);
	op.in[2] = td(KILN_I64, 1, 1, 0);
	op.i[0] = n, op.i[1] = nesterov;
	op.f[0] = mu, op.f[1] = l2, op.f[3] = damp;
	void *dw = dput(f, w, b), *dv = dput(f, v, b), *dd = dput(f, dm, b), *dg = dput(f, NULL, b),
	     *dl = dput(f, NULL, 4), *dt = dput(f, NULL, 8);
	for (int s = 0; s < STEPS; s++) {
		const int64_t t = t0 + s;
		float *g = frandv((size_t)n);
		OK(kiln_device_copy_async(f->dev, dt, &t, 8, KILN_COPY_H2D, f->s));
		OK(kiln_device_copy_async(f->dev, dl, &lrs[s], 4, KILN_COPY_H2D, f->s));
		OK(kiln_device_copy_async(f->dev, dg, g, b, KILN_COPY_H2D, f->s));
		OK(run_op(f, &op, (const void *const[]){ dg, dl, dt, dd }, (void *const[]){ dw, dv }));
		for (int i = 0; i < n; i++) {
			const double d = has_d ? dm[i] : 1, gi = g[i] + l2 * d * rw[i];
			rv[i] = t == 1 ? gi : mu * rv[i] + (1.0 - damp) * gi;
			rw[i] -= lrs[s] * (nesterov ? gi + mu * rv[i] : rv[i]);
		}
		free(g);
	}
	dget(f, got, dw, b);
	for (int i = 0; i < n; i++)
		NEAR(got[i], rw[i], fabs(rw[i]) + 1.0, 1e-6, "SGD dampening %g mu %g nesterov %d d %d from t %lld: w[%d] = %.8g, want %.8g",
		     damp, mu, nesterov, has_d, (long long)t0, i, got[i], rw[i]);
	dget(f, got, dv, b);
	for (int i = 0; i < n; i++)
		NEAR(got[i], rv[i], fabs(rv[i]) + 1.0, 1e-6, "SGD dampening %g from t %lld: v[%d] = %.8g, want %.8g",
		     damp, (long long)t0, i, got[i], rv[i]);
	DFREE(f, dw, dv, dd, dg, dl, dt);
	free(w), free(v), free(dm), free(got), free(rw), free(rv);
}

DFX_TEST(sgd_dampening)
{
	sgd_damp_case(f, 1000, 0.9f, 0.5f, 0, 0, 1);
	sgd_damp_case(f, 70001, 0.9f, 0.1f, 0, 1, 1);
	sgd_damp_case(f, 1000, 0.5f, 0.3f, 1, 1, 1);
	sgd_damp_case(f, 1000, 0.9f, 0.5f, 0, 1, 3); /* resumed: v0 != 0, t > 1 */
	/* a step count below 1 is refused (the count is 1-based) */
	{
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SGD, op.n_in = 3, op.n_out = 2;
		op.in[0] = op.out[0] = op.out[1] = td(KILN_F32, 1, 8, 0);
		op.in[1] = td(KILN_F32, 1, 1, 0), op.in[2] = td(KILN_I64, 1, 1, 0);
		op.i[0] = 8, op.f[0] = 0.9, op.f[3] = 0.5;
		const int64_t zero = 0;
		void *dw = dput(f, NULL, 32), *dv = dput(f, NULL, 32), *dg = dput(f, NULL, 32),
		     *dl = dput(f, NULL, 4), *dt = dput(f, &zero, 8);
		ck_assert_int_eq(run_op(f, &op, (const void *const[]){ dg, dl, dt }, (void *const[]){ dw, dv }),
				 KILN_EINVAL);
		ck_assert_msg(strstr(kiln_last_error(), "step count 0"), "%s", kiln_last_error());
		DFREE(f, dw, dv, dg, dl, dt);
	}
}

/* the scalar reference of f32 -> bf16: nearest even, a NaN made quiet */
static uint16_t ref_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* One SGD step of n elements run twice on the same w, v, g: without and
 * with a bf16 compute copy (the fused update-and-round loop of the CPU
 * plugin, session 15).  w and v must be the same bytes both times, and
 * the copy the scalar rounding of each updated w.  w holds ties of the
 * rounding, subnormals, infinities and NaNs; g holds non-finite values
 * too (the step itself is not gated here). */
static void sgd_copy_case(struct fx *f, int n, float mu, int nesterov, int with_d)
{
	const size_t b = (size_t)n * 4;
	float *w = frandv((size_t)n), *v = frandv((size_t)n), *g = frandv((size_t)n);
	float *d = frandv((size_t)n), *w1 = malloc(b), *w2 = malloc(b), *v1 = malloc(b), *v2 = malloc(b);
	uint16_t *cp = malloc((size_t)n * 2);
	const float lr = 0.05f;
	for (int i = 0; i < n; i++) {
		const uint32_t tie = 0x3f808000u + ((uint32_t)i << 16); /* halfway between two bf16 */
		switch (i % 11) {
		case 3: memcpy(&w[i], &tie, 4); g[i] = 0.0f; break;
		case 5: w[i] = 1e-39f * (float)(i % 7); break; /* subnormal */
		case 7: if (i % 5 == 0) g[i] = NAN; break;
		case 9: if (i % 3 == 0) w[i] = (i & 1) ? INFINITY : -INFINITY; break;
		case 10: if (i % 13 == 0) g[i] = INFINITY; break;
		}
		d[i] = (i % 4) ? 1.0f : 0.5f;
	}
	for (int copy = 0; copy < 2; copy++) {
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_SGD;
		op.n_in = with_d ? 3 : 2;
		op.n_out = (mu != 0.0f ? 2 : 1) + copy;
		op.in[0] = op.out[0] = op.out[1] = td(KILN_F32, 1, n, 0);
		op.in[1] = td(KILN_F32, 1, 1, 0);
		op.in[2] = op.in[0];
		op.out[op.n_out - 1] = copy ? td(KILN_BF16, 1, n, 0) : op.out[0];
		op.i[0] = n, op.i[1] = nesterov;
		op.f[0] = mu, op.f[1] = 1e-4, op.f[2] = 0.01;
		void *dw = dput(f, w, b), *dv = dput(f, v, b), *dg = dput(f, g, b), *dl = dput(f, &lr, 4);
		void *dd = dput(f, d, b), *dc = dput(f, NULL, (size_t)n * 2);
		void *out[3] = { dw, mu != 0.0f ? dv : dc, dc };
		OK(run_op(f, &op, (const void *const[]){ dg, dl, dd }, out));
		dget(f, copy ? w2 : w1, dw, b);
		dget(f, copy ? v2 : v1, dv, b);
		if (copy)
			dget(f, cp, dc, (size_t)n * 2);
		DFREE(f, dw, dv, dg, dl, dd, dc);
	}
	ck_assert_msg(memcmp(w1, w2, b) == 0, "SGD n=%d mu=%g nesterov=%d d=%d: w differs with the bf16 copy",
		      n, mu, nesterov, with_d);
	ck_assert_msg(memcmp(v1, v2, b) == 0, "SGD n=%d: momentum differs with the bf16 copy", n);
	int nonfinite = 0;
	for (int i = 0; i < n; i++) {
		nonfinite += !isfinite(w2[i]);
		ck_assert_msg(cp[i] == ref_bf16(w2[i]), "SGD n=%d: copy[%d] = 0x%04x, w %.9g rounds to 0x%04x", n,
			      i, cp[i], w2[i], ref_bf16(w2[i]));
	}
	if (n >= 100)
		ck_assert_int_gt(nonfinite, 0); /* the non-finite lanes were exercised */
	free(w), free(v), free(g), free(d), free(w1), free(w2), free(v1), free(v2), free(cp);
}

/* tails (n below and across a vector, the 4096-element block, a thread's
 * span), momentum or not, Nesterov, a weight-decay multiplier */
DFX_TEST(sgd_copy)
{
	const int ns[] = { 1, 7, 17, 100, 4095, 4097, 70001 };
	for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
		sgd_copy_case(f, ns[k], 0.9f, 0, 0);
		sgd_copy_case(f, ns[k], 0.9f, 1, 1);
		sgd_copy_case(f, ns[k], 0.0f, 0, (int)(k & 1));
	}
}


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

	/* a norm equal to max_norm: clip_grad_norm_ multiplies by
	 * min(1, max_norm / (norm + 1e-6)) = 5 / 5.000001 all the same:
	 * torch 1.13 [3, 4] -> [2.99999928, 3.99999905] (its factor in f32),
	 * kiln [2.99999952, 3.99999928] (the factor in double, rounded once);
	 * before session 42 kiln scaled only a norm above max_norm: [3, 4] */
	{
		const float g34[2] = { 3, 4 }, s0[4] = { 0, 1, 0, 0 };
		float c34[2];
		struct kiln_op o2 = op;
		o2.in[0] = o2.out[0] = td(KILN_F32, 1, 2, 0);
		o2.i[0] = 2, o2.f[0] = 5;
		void *d34 = dput(&f, g34, 8), *ds = dput(&f, s0, 16);
		OK(run_op(&f, &o2, (const void *const[]){ d34 }, (void *const[]){ d34, ds }));
		dget(&f, c34, d34, 8);
		dget(&f, st, ds, 16);
		const float k = (float)(5.0 / (5.0 + 1e-6));
		ck_assert_msg(c34[0] == 3 * k && c34[1] == 4 * k && st[3] == 1.0f,
			      "norm = max_norm 5: got %.9g %.9g (clipped %g), want %.9g %.9g (1)", c34[0],
			      c34[1], st[3], 3 * k, 4 * k);
		DFREE(&f, d34, ds);
	}

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
	DFREE(&f, dg, dst, dw, dv, dlr);
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
	DFREE(f, dg, dst, dsc);
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

/* the gradients' L2 norm in double */
static double norm_ref(const float *g, int n, float mul)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)(g[i] * mul) * (g[i] * mul);
	return sqrt(ss);
}

/* Finite gradients whose squares overflow f32 (session 39): before, the
 * f32 sums of squares went inf and the op flagged them non-finite (the
 * step skipped), where GradScaler's found_inf checks the elements.  Now:
 *  - elements up to 3e19 (in a whole block and in the short last one):
 *    flag 1, nothing skipped, the true norm, the gradients untouched;
 *  - with clip_norm (1, and 1e30 above the norm): the gradients become 0,
 *    as clip_grad_norm_'s, whose f32 norm is inf (factor 1 / (inf + 1e-6));
 *  - no square overflowing but the sum above FLT_MAX (elements of 6e17):
 *    clipped to 0 alike (before: scaled by 1 / 3.4e19, not PyTorch's);
 *  - UNSCALE at s = 4 of those gradients: the unscaled ones, flag 1;
 *  - a NaN or an inf among them: flag 0, skipped, untouched;
 *  - a norm above FLT_MAX (3e38, -3e38): recorded as FLT_MAX, flag 1. */
START_TEST(test_grad_clip_overflow)
{
	struct fx f;
	fx_open(&f, _i);
	const int n = 5000; /* 4 whole blocks of 1024 and a short one */
	const size_t b = (size_t)n * 4;
	float *g = frandv((size_t)n), *gs = malloc(b), *got = malloc(b), st[4];
	g[10] = 1e19f, g[1500] = 3e19f, g[4900] = -2.5e19f;
	const double norm = norm_ref(g, n, 1);
	unscale_run(&f, KILN_OP_GRAD_CLIP, n, g, 1, 0, got, st);
	ck_assert_msg(st[1] == 1.0f && st[2] == 0.0f && st[3] == 0.0f,
		      "finite gradients up to 3e19: flag %g skipped %g clipped %g (norm %g)", st[1],
		      st[2], st[3], st[0]);
	NEAR(st[0], norm, norm, 1e-6, "norm %g, want %g", st[0], norm);
	ck_assert(!memcmp(got, g, b));
	for (int c = 0; c < 2; c++) {
		unscale_run(&f, KILN_OP_GRAD_CLIP, n, g, 1, c ? 1e30 : 1.0, got, st);
		ck_assert_msg(st[1] == 1.0f && st[2] == 0.0f && st[3] == 1.0f,
			      "clip %g: flag %g skipped %g clipped %g", c ? 1e30 : 1.0, st[1], st[2],
			      st[3]);
		for (int i = 0; i < n; i++)
			ck_assert_msg(got[i] == 0.0f, "clip %g: g[%d] = %g, want 0 (clip_grad_norm_'s f32 norm is inf)",
				      c ? 1e30 : 1.0, i, got[i]);
	}
	for (int i = 0; i < n; i++)
		gs[i] = (float)(i % 3 - 1 + 0.5) * 4e17f; /* -2e17, 2e17, 6e17 */
	const double mid = norm_ref(gs, n, 1), block = norm_ref(gs, 1024, 1);
	ck_assert(mid * mid > FLT_MAX && block * block < FLT_MAX); /* (every block alike) */
	unscale_run(&f, KILN_OP_GRAD_CLIP, n, gs, 1, 1.0, got, st);
	NEAR(st[0], mid, mid, 1e-6, "norm %g, want %g", st[0], mid);
	ck_assert(st[1] == 1.0f && st[3] == 1.0f);
	for (int i = 0; i < n; i++)
		ck_assert_msg(got[i] == 0.0f, "sum of squares %g above FLT_MAX: g[%d] = %g, want 0",
			      mid * mid, i, got[i]);
	for (int i = 0; i < n; i++)
		gs[i] = g[i] * 4.0f;
	unscale_run(&f, KILN_OP_UNSCALE, n, gs, 4.0f, 0, got, st);
	ck_assert_msg(st[1] == 1.0f && st[2] == 0.0f, "UNSCALE: flag %g skipped %g", st[1], st[2]);
	NEAR(st[0], norm, norm, 1e-6, "UNSCALE: norm %g, want %g", st[0], norm);
	ck_assert(!memcmp(got, g, b));
	for (int k = 0; k < 2; k++) {
		memcpy(gs, g, b);
		gs[1501] = k ? NAN : -INFINITY;
		unscale_run(&f, KILN_OP_GRAD_CLIP, n, gs, 1, 1.0, got, st);
		ck_assert_msg(st[1] == 0.0f && st[2] == 1.0f && st[3] == 0.0f,
			      "%s beside 3e19: flag %g skipped %g clipped %g", k ? "NaN" : "-inf", st[1],
			      st[2], st[3]);
		ck_assert(!memcmp(got, gs, b));
	}
	const float two[2] = { 3e38f, -3e38f };
	unscale_run(&f, KILN_OP_GRAD_CLIP, 2, two, 1, 0, got, st);
	ck_assert_msg(st[0] == FLT_MAX && st[1] == 1.0f, "norm %g flag %g, want FLT_MAX and 1", st[0],
		      st[1]);
	free(g), free(gs), free(got);
	fx_close(&f);
}
END_TEST

/* The cpu device's norm in its own order (plugins/cpu/ops.c sumsq_span):
 * chunks of 65536 elements, each summed over blocks of 1024 in L f32
 * lanes (lane l: the block's elements l, l + L, ...; the last len % L
 * into lane 0), the lanes added 0..L-1 in f32, the blocks and then the
 * chunks in double.  No multiply-add is fused (-ffp-contract=off, since
 * session 21): the AVX-512 clone's lanes take v * v rounded, as AVX2's. */
static double cpu_norm_order(const float *g, int n, float mul, int L)
{
	double total = 0;
	for (int c = 0; c < n; c += 65536) {
		const int ce = c + 65536 < n ? c + 65536 : n;
		double acc = 0;
		for (int b = c; b < ce; b += 1024) {
			const int e = b + 1024 < ce ? b + 1024 : ce, full = b + (e - b) / L * L;
			float lane[16] = { 0 }, part = 0;
			for (int i = b; i < e; i++) {
				volatile float v = g[i] * mul, sq = v * v;
				float *t = &lane[i < full ? (i - b) % L : 0];
				*t += sq;
			}
			for (int l = 0; l < L; l++)
				part += lane[l];
			acc += part;
		}
		total += acc;
	}
	return sqrt(total);
}

/* The f32 lanes of the cpu device's norm loops on this CPU (cpu_norm_order's
 * L): 16 with AVX-512, 8 with AVX2; 0 on another device, and for the
 * portable clone, whose vector width is the compiler's (no order to check). */
static int norm_lanes(void)
{
	if (strcmp(g_name, "cpu"))
		return 0;
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") ? 16 : __builtin_cpu_supports("avx2") ? 8 : 0;
}

/* n gradients of magnitudes apart (each a frandv value times 0.37 to
 * 4.81 by its index mod 13): a sum in another order shows in the bits */
static float *apart_grads(int n)
{
	float *g = frandv((size_t)n);
	for (int k = 0; k < n; k++)
		g[k] *= (float)(1 + k % 13) * 0.37f;
	return g;
}

/* The norm type (GRAD_CLIP at s = 1, UNSCALE at s) gives over g[0, n) on
 * f: cpu_norm_order's in L lanes, bit for bit; got receives the
 * gradients after the op. */
static void norm_order_same(struct fx *f, int type, int n, const float *g, float s, int L, float *got)
{
	float st[4];
	unscale_run(f, type, n, g, s, 0, got, st);
	const float want = (float)cpu_norm_order(g, n, 1.0f / s, L);
	ck_assert_msg(!memcmp(&st[0], &want, 4), "%s n %d, s %g (%d lanes): norm %a, want %a",
		      kiln_op_name(type), n, (double)s, L, (double)st[0], (double)want);
}

/* The cpu device's GRAD_CLIP and UNSCALE norm, bit for bit, in the order
 * its AVX2 (8 lanes) or AVX-512 (16 lanes; first run on a Zen 4 in session
 * 21) loops take: lengths with whole and short blocks and chunks (535040:
 * the Fashion-MNIST MLP's parameters), s = 1 and 3.  A
 * dropped, doubled or misplaced block or tail moves the f32 norm. */
DFX_TEST(grad_clip_order)
{
	const int L = norm_lanes();
	if (!L)
		return;
	static const int ns[] = { 7, 1000, 4096, 4100, 9000, 65536 + 5000, 100003, 535040 };
	float *g = apart_grads(535040), *got = malloc(535040 * 4);
	for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
		norm_order_same(f, KILN_OP_GRAD_CLIP, ns[k], g, 1.0f, L, got);
		norm_order_same(f, KILN_OP_UNSCALE, ns[k], g, 3.0f, L, got);
	}
	free(g), free(got);
}

/* Above 64M elements (2^26 + 5 blocks: 1025 chunks of 65536, past the
 * 1024 chunk sums the kernel kept before session 21, which then took
 * chunks of n / 1024 + 1 = 65542 elements, other blocks): the order above,
 * bit for bit, with the default team and 3 threads (the fixture's modes),
 * through the kernel's rounds of 8M elements.  Whole blocks of whole
 * vectors, so the lanes' tail rule plays no part; AVX-512's clone adds
 * unfused (-ffp-contract=off).  The old chunks moved only the double
 * total's last bits: the f32 norm here came out the same on that code. */
DFX_TEST(grad_clip_big)
{
	const int L = norm_lanes();
	if (!L)
		return;
	const int n = (1 << 26) + 5 * 1024;
	float *g = apart_grads(n), *got = malloc((size_t)n * 4);
	norm_order_same(f, KILN_OP_GRAD_CLIP, n, g, 1.0f, L, got);
	ck_assert(!memcmp(got, g, (size_t)n * 4));
	free(g), free(got);
}

/* ---- the gradients' check where backward makes them (ABI 2.32) ------- */

/* GRAD_CLIP over g[0, n) (f[0] clip, f[1] value): out grads and state.
 * With blocks (cuts[0] = 0 < ... < cuts[nc] = nb, the ranges of the
 * layers as the trainer lays them), GRAD_SUMSQ over each range, the last
 * first (as backward completes them), into block sums first filled with
 * NaN (a block no range wrote skips the step), then GRAD_CLIP given them;
 * without (cuts NULL), GRAD_CLIP's one pass. */
static void clip_sums_run(struct fx *f, int n, const float *g, const int64_t *cuts, int nc,
			  double clip, double value, float *got, float st[4])
{
	const int64_t nb = (n + 1023) / 1024;
	const float st0[4] = { 0, 1, 0, 0 };
	const size_t b = (size_t)n * 4;
	float *nan = malloc((size_t)nb * 4);
	for (int64_t k = 0; k < nb; k++)
		nan[k] = NAN;
	void *dg = dput(f, g, b), *dst = dput(f, st0, 16), *ds = dput(f, nan, (size_t)nb * 4);
	struct kiln_op op;
	for (int r = cuts ? nc - 1 : -1; r >= 0; r--) {
		kiln_op_grad_sumsq(&op, n, cuts[r], cuts[r + 1]);
		OK(run_op(f, &op, (const void *const[]){ dg }, (void *const[]){ ds }));
	}
	kiln_op_grad_clip(&op, n);
	op.n_in = cuts ? 2 : 1;
	op.in[1] = td(KILN_F32, 1, nb, 0);
	op.f[0] = clip, op.f[1] = value;
	OK(run_op(f, &op, (const void *const[]){ dg, ds }, (void *const[]){ dg, dst }));
	dget(f, got, dg, b);
	dget(f, st, dst, 16);
	DFREE(f, dg, dst, ds);
	free(nan);
}

/* g's GRAD_CLIP given GRAD_SUMSQ's block sums against its one pass: the
 * same gradients and state, bit for bit; returns the state. */
static void clip_sums_same(struct fx *f, int n, const float *g, const int64_t *cuts, int nc,
			   double clip, double value, const char *what, float st[4])
{
	const size_t b = (size_t)n * 4;
	float *got = malloc(b), *want = malloc(b), wst[4];
	clip_sums_run(f, n, g, NULL, 0, clip, value, want, wst);
	clip_sums_run(f, n, g, cuts, nc, clip, value, got, st);
	ck_assert_msg(!memcmp(st, wst, 16),
		      "%s (clip %g, value %g): state %a %g %g %g given the sums, %a %g %g %g without",
		      what, clip, value, (double)st[0], st[1], st[2], st[3], (double)wst[0], wst[1],
		      wst[2], wst[3]);
	for (int i = 0; i < n; i++)
		ck_assert_msg(!memcmp(&got[i], &want[i], 4), "%s (clip %g, value %g): g[%d] %a, want %a",
			      what, clip, value, i, (double)got[i], (double)want[i]);
	free(got), free(want);
}

/* The Fashion-MNIST MLP's 535,818 gradients (784-512-256-10, no padding
 * between its tensors), its three layers' block ranges as the trainer
 * lays them (core/train_gradsums.c: a block two layers share goes with
 * the lower one, whose backward ends later): fc1 blocks [0, 393), fc2
 * [393, 521), fc3 [521, 524) (the last block 266 elements).  GRAD_CLIP
 * given the sums is GRAD_CLIP: finite gradients with every clipping mode;
 * a NaN, +inf or -inf at each layer's first and last element (flag 0,
 * skipped 1, the gradients left as they are); finite elements of 3e19,
 * whose squares overflow f32 (flag 1: finite; clip_norm 1 zeroes them),
 * at the same places. */
START_TEST(test_grad_sumsq)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_GRAD_SUMSQ);
	const int n = 535818;
	const int64_t cuts[] = { 0, 393, 521, 524 };
	/* fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc3.weight, fc3.bias */
	const int ends[][2] = { { 0, 401919 }, { 401920, 533247 }, { 533248, n - 1 } };
	float *g = apart_grads(n), *h = malloc((size_t)n * 4), st[4];
	double ss = 0;
	for (int k = 0; k < n; k++)
		ss += (double)g[k] * g[k];
	const double clips[][2] = { { 0, 0 }, { sqrt(ss) / 4, 0 }, { 0, 0.25 }, { sqrt(ss) / 4, 0.25 } };
	for (size_t c = 0; c < sizeof clips / sizeof *clips; c++) {
		clip_sums_same(&f, n, g, cuts, 3, clips[c][0], clips[c][1], "finite", st);
		ck_assert(st[1] == 1.0f && st[2] == 0.0f);
	}
	static const float bad[] = { NAN, INFINITY, -INFINITY, 3e19f };
	for (int l = 0; l < 3; l++)
		for (int e = 0; e < 2; e++)
			for (size_t v = 0; v < sizeof bad / sizeof *bad; v++) {
				char what[96];
				const int at = ends[l][e];
				memcpy(h, g, (size_t)n * 4);
				h[at] = bad[v];
				snprintf(what, sizeof what, "fc%d's %s element (g[%d]) %g", l + 1,
					 e ? "last" : "first", at, (double)bad[v]);
				clip_sums_same(&f, n, h, cuts, 3, 0, 0, what, st);
				const int finite = isfinite(bad[v]);
				ck_assert_msg(st[1] == (float)finite && st[2] == (float)!finite,
					      "%s: flag %g skipped %g", what, st[1], st[2]);
				if (finite) /* clip_grad_norm_'s f32 norm inf: zeroed */
					clip_sums_same(&f, n, h, cuts, 3, 1.0, 0, what, st);
			}
	free(g), free(h);
	fx_close(&f);
}
END_TEST

/* GRAD_SUMSQ writes its blocks alone (a short last block too), as
 * GRAD_CLIP sums them: a block's sum on its own is the norm's square of
 * that block (GRAD_CLIP over the block's elements alone); the blocks
 * past i[2] and before i[1] keep what they held.  Ranges outside the
 * blocks are refused, and sums or gradients not f32 (GRAD_CLIP's too). */
START_TEST(test_grad_sumsq_range)
{
	struct fx f;
	fx_open(&f, _i);
	SKIP_UNSUPPORTED(&f, KILN_OP_GRAD_SUMSQ);
	const int n = 5000, nb = 5; /* 4 whole blocks, one of 904 */
	float *g = frandv((size_t)n), sums[5], st[4];
	const float keep = 12345.0f;
	for (int k = 0; k < nb; k++)
		sums[k] = keep;
	void *dg = dput(&f, g, (size_t)n * 4), *ds = dput(&f, sums, sizeof sums);
	struct kiln_op op;
	kiln_op_grad_sumsq(&op, n, 2, 5);
	OK(run_op(&f, &op, (const void *const[]){ dg }, (void *const[]){ ds }));
	dget(&f, sums, ds, sizeof sums);
	ck_assert(sums[0] == keep && sums[1] == keep);
	for (int k = 2; k < nb; k++) {
		const int len = k == 4 ? n - 4096 : 1024;
		float *got = malloc((size_t)len * 4);
		clip_sums_run(&f, len, g + k * 1024, NULL, 0, 0, 0, got, st);
		const float want = st[0] * st[0];
		/* (the norm is the root of the sum, rounded: compare within it) */
		ck_assert_msg(fabsf(sums[k] - want) <= want * 1e-6f, "block %d: sum %g, want %g", k,
			      (double)sums[k], (double)want);
		free(got);
	}
	void *plan = NULL;
	op.i[1] = 3, op.i[2] = 6;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.i[1] = 3, op.i[2] = 2;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	/* f32 gradients and sums alone (core/opcheck.c), as GRAD_CLIP's sums */
	op.i[1] = 2, op.i[2] = 5;
	op.out[0].dtype = KILN_BF16;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	op.out[0].dtype = KILN_F32, op.in[0].dtype = KILN_BF16;
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	kiln_op_grad_clip(&op, n);
	op.n_in = 2;
	op.in[1] = td(KILN_BF16, 1, nb, 0);
	ck_assert_int_eq(kiln_device_prepare(f.dev, &op, &plan, NULL), KILN_EINVAL);
	kiln_clear_error();
	DFREE(&f, dg, ds);
	free(g);
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
		st[2] = st[2] > 0 ? st[2] - 1 : 0; /* (no count below 0) */
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
		DFREE(&f, dgate, dst);
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

/* ---- ADAMW: AdamW's decoupled and Adam's L2 weight decay --------------- */

/* ADAMW over n f32 elements: inputs g, lr, t and (has_d) d; outputs p, m,
 * v and (amsgrad, ABI 2.29) vmax. */
static struct kiln_op adamw_op(int64_t n, int has_d, int amsgrad, double b1, double b2,
			       double eps, double wd, double l2)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_ADAMW, op.n_in = 3 + has_d, op.n_out = 3 + amsgrad;
	op.in[0] = td(KILN_F32, 1, n, 0), op.in[1] = td(KILN_F32, 1, 1, 0);
	op.in[2] = td(KILN_I64, 1, 1, 0), op.in[3] = op.in[0];
	op.out[0] = op.out[1] = op.out[2] = op.out[3] = op.in[0];
	op.i[0] = n, op.i[1] = amsgrad;
	op.f[0] = b1, op.f[1] = b2, op.f[2] = eps, op.f[3] = wd, op.f[4] = l2;
	return op;
}

/* One step t of kiln/ops.h's ADAMW in double over n elements: p, m, v
 * and vx (amsgrad's largest v, or NULL) updated from g, d (NULL: 1), lr
 * and the op's constants f[]. */
static void adamw_ref(double *p, double *m, double *v, double *vx, const float *g,
		      const float *d, int64_t n, double lr, int64_t t, const double *f)
{
	const double b1 = f[0], b2 = f[1], eps = f[2], wd = f[3], l2 = f[4];
	const double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);
	for (int64_t i = 0; i < n; i++) {
		const double di = d ? d[i] : 1, gi = g[i] + l2 * di * p[i];
		m[i] = b1 * m[i] + (1 - b1) * gi;
		v[i] = b2 * v[i] + (1 - b2) * gi * gi;
		if (vx)
			vx[i] = vx[i] > v[i] ? vx[i] : v[i];
		p[i] = p[i] * (1 - lr * wd * di) - (lr / c1) * m[i] / (sqrt(vx ? vx[i] : v[i]) / sqrt(c2) + eps);
	}
}

/* ADAMW over n elements against a double loop of kiln/ops.h's formula
 * (adamw_ref), in four cases: (wd, l2) = (0.01, 0), AdamW (f[3]), and (0,
 * 0.01), Adam (f[4], ABI 2.28: g + l2*d*p before the moments), each with
 * and without the weight-decay multiplier d.  Without amsgrad: three steps
 * with new gradients and lrs, beta2 0.99.  With amsgrad (i[1] = 1, out3
 * vmax, ABI 2.29): six steps whose gradients shrink (x0.2 a step) and
 * beta2 0.9, so the second moment falls well below its running maximum;
 * vmax is checked too, and the same steps without amsgrad end elsewhere
 * (the case can fail). */
static void adam_cases(struct fx *f, int amsgrad)
{
	enum { MAX_STEPS = 6 };
	const int steps = amsgrad ? 6 : 3;
	const int64_t n = 20000;
	const double b1 = 0.9, b2 = amsgrad ? 0.9 : 0.99, eps = 1e-6, shrink = amsgrad ? 0.2 : 1;
	const float lrs[MAX_STEPS] = { 0.01f, 0.005f, 0.02f, 0.01f, 0.015f, 0.01f };
	float *dm = malloc(4 * n), *got = malloc(4 * n), *z = calloc(n, 4);
	double *rp = malloc(8 * n), *rm = malloc(8 * n), *rv = malloc(8 * n), *rx = malloc(8 * n);
	double *qp = malloc(8 * n), *qm = malloc(8 * n), *qv = malloc(8 * n);
	for (int64_t i = 0; i < n; i++)
		dm[i] = (i % 3) ? 1.0f : 0.0f;
	for (int c = 0; c < 4; c++) {
		const double wd = c < 2 ? 0.01 : 0, l2 = c < 2 ? 0 : 0.01;
		const int has_d = c % 2;
		float *p = frandv(n);
		const struct kiln_op op = adamw_op(n, has_d, amsgrad, b1, b2, eps, wd, l2);
		void *dp = dput(f, p, 4 * n), *dmm = dput(f, z, 4 * n), *dv = dput(f, z, 4 * n),
		     *dx = dput(f, z, 4 * n), *dd = dput(f, dm, 4 * n), *dg = dput(f, NULL, 4 * n),
		     *dl = dput(f, NULL, 4), *dt = dput(f, NULL, 8);
		for (int64_t i = 0; i < n; i++)
			rp[i] = qp[i] = p[i], rm[i] = rv[i] = rx[i] = qm[i] = qv[i] = 0;
		double scale = 1;
		for (int64_t t = 1; t <= steps; t++, scale *= shrink) {
			float *g = frandv(n);
			for (int64_t i = 0; i < n; i++)
				g[i] *= (float)scale;
			const float lr = lrs[t - 1];
			OK(kiln_device_copy_async(f->dev, dt, &t, 8, KILN_COPY_H2D, f->s));
			OK(kiln_device_copy_async(f->dev, dl, &lr, 4, KILN_COPY_H2D, f->s));
			OK(kiln_device_copy_async(f->dev, dg, g, 4 * n, KILN_COPY_H2D, f->s));
			OK(run_op(f, &op, (const void *const[]){ dg, dl, dt, dd },
				  (void *const[]){ dp, dmm, dv, dx }));
			adamw_ref(rp, rm, rv, amsgrad ? rx : NULL, g, has_d ? dm : NULL, n, lr, t, op.f);
			/* the same without amsgrad */
			adamw_ref(qp, qm, qv, NULL, g, has_d ? dm : NULL, n, lr, t, op.f);
			free(g);
		}
		dget(f, got, dp, 4 * n);
		int64_t apart = 0;
		for (int64_t i = 0; i < n; i++) {
			NEAR(got[i], rp[i], fabs(rp[i]), 1e-5, "amsgrad %d case %d (wd %g, l2 %g, d %d): p[%lld] = %.8g, reference %.8g",
			     amsgrad, c, wd, l2, has_d, (long long)i, got[i], rp[i]);
			apart += fabs(qp[i] - rp[i]) > 1e-3 * (fabs(rp[i]) + 1e-3);
		}
		if (amsgrad) {
			ck_assert_msg(apart > n / 10, "amsgrad case %d: only %lld of %lld elements away from Adam's", c,
				      (long long)apart, (long long)n);
			dget(f, got, dx, 4 * n);
			for (int64_t i = 0; i < n; i++)
				NEAR(got[i], rx[i], fabs(rx[i]), 1e-5, "amsgrad case %d: vmax[%lld] = %.8g, reference %.8g",
				     c, (long long)i, got[i], rx[i]);
		}
		DFREE(f, dp, dmm, dv, dx, dd, dg, dl, dt);
		free(p);
	}
	free(dm), free(got), free(z), free(rp), free(rm), free(rv), free(rx), free(qp), free(qm),
		free(qv);
}

DFX_TEST(adam)
{
	if (unsupported(f, KILN_OP_ADAMW))
		return;
	adam_cases(f, 0);
}

/* ---- ADAMW's amsgrad (ABI 2.29) ------------------------------------------ */

/* adam_cases with amsgrad; and vmax fills the op's outputs: a compute copy
 * beside it is refused. */
DFX_TEST(amsgrad)
{
	if (unsupported(f, KILN_OP_ADAMW))
		return;
	adam_cases(f, 1);
	struct kiln_op op = adamw_op(16, 0, 1, 0.9, 0.999, 1e-8, 0, 0);
	void *plan = NULL;
	op.out[3] = td(KILN_BF16, 1, 16, 0);
	ck_assert_int_eq(kiln_device_prepare(f->dev, &op, &plan, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "no compute copy"), "%s", kiln_last_error());
}

/* ---- optimizer state below FLT_MIN (session 45) ------------------------ */

/* The ops whose state the rule covers (kiln/ops.h, "Optimizer state below
 * FLT_MIN"): SGD (plain, Nesterov, with a dampening), ADAMW (and
 * amsgrad's vmax), LAMB. */
enum sub_kind { SUB_SGD, SUB_NESTEROV, SUB_DAMP, SUB_ADAMW, SUB_AMSGRAD, SUB_LAMB, SUB_KINDS };
static const char *const sub_name[SUB_KINDS] = { "SGD", "SGD nesterov", "SGD dampening",
						 "ADAMW", "ADAMW amsgrad", "LAMB" };

/* x as the cpu device stores new state: a zero of its sign below FLT_MIN */
static float sub_flush(float x)
{
	return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

/* The op of `kind` over n elements, every weight decay 0 (so a gradient
 * g = +0 leaves g' = +0 and an element whose state is zero keeps its
 * weight), the Adam family's eps `eps`; the number of state outputs in
 * *ns. */
static struct kiln_op sub_op(int kind, int64_t n, double eps, int *ns)
{
	struct kiln_op op;
	if (kind >= SUB_ADAMW && kind <= SUB_AMSGRAD) {
		*ns = 2 + (kind == SUB_AMSGRAD);
		return adamw_op(n, 0, kind == SUB_AMSGRAD, 0.9, 0.999, eps, 0, 0);
	}
	memset(&op, 0, sizeof op);
	op.in[0] = op.out[0] = op.out[1] = op.out[2] = td(KILN_F32, 1, n, 0);
	op.in[1] = td(KILN_F32, 1, 1, 0), op.in[2] = td(KILN_I64, 1, 1, 0);
	op.i[0] = n;
	if (kind == SUB_LAMB) {
		*ns = 2;
		op.type = KILN_OP_LAMB, op.n_in = 4, op.n_out = 3;
		op.in[3] = td(KILN_I64, 1, 3, 0); /* two tensors */
		op.f[0] = 0.9, op.f[1] = 0.999, op.f[2] = eps;
		return op;
	}
	*ns = 1;
	op.type = KILN_OP_SGD, op.n_in = kind == SUB_DAMP ? 3 : 2, op.n_out = 2;
	op.i[1] = kind == SUB_NESTEROV;
	op.f[0] = 0.9, op.f[3] = kind == SUB_DAMP ? 0.5 : 0;
	return op;
}

/* The new state of element i in f32, in the cpu kernels' order of
 * operations (plugins/cpu/optim.c, no contraction on either side), from
 * the stored state s[k][i] and g = g[i] (+0 or not zero, so that the
 * weight-decay terms, 0 * p, leave it as it is): the IEEE results r[k],
 * before any flush.  amsgrad's vmax takes the stored v (flushed with
 * `flush`). */
static void sub_ref(int kind, int flush, float *const *s, const float *g, int64_t i, float r[3])
{
	if (kind <= SUB_DAMP) {
		/* SGD: mu*v + g, or with a dampening (t > 1) mu*v + (1 - 0.5)*g */
		const float mu = (float)0.9, omd = (float)(1.0 - 0.5);
		r[0] = kind == SUB_DAMP ? mu * s[0][i] + omd * g[i] : mu * s[0][i] + g[i];
		return;
	}
	const float b1 = (float)0.9, b2 = (float)0.999, omb1 = (float)(1.0 - 0.9),
		    omb2 = (float)(1.0 - 0.999);
	r[0] = b1 * s[0][i] + omb1 * g[i];
	r[1] = b2 * s[1][i] + omb2 * g[i] * g[i];
	if (kind == SUB_AMSGRAD) {
		const float v = flush ? sub_flush(r[1]) : r[1];
		r[2] = s[2][i] >= v ? s[2][i] : v;
	}
}

/* Starting state and gradients in four classes of elements (i % 4):
 *   0  g = +0 (a dead unit), state 1..40 x FLT_MIN: decays into the
 *      subnormal range over the steps (v, beta2 0.999: 1..1.02 x FLT_MIN);
 *      the weight tiny (~1e-33), so a subnormal step would move it;
 *   1  |g| 0.5..1.5e-20 (g*g subnormal, (1-beta2)*g*g not 0), state 0:
 *      Adam's v subnormal at once;
 *   2  g and state ordinary (|x| up to 1): the IEEE result, bit for bit;
 *   3  g = +0, state already subnormal, 0.005..0.5 x FLT_MIN (a
 *      checkpoint of an older kiln), the weight tiny.
 * (With eps = 0 the IEEE update of each class is finite.) */
static void sub_init(int64_t n, int ns, float *w, float *const *s, float *g)
{
	for (int64_t i = 0; i < n; i++) {
		const int c = (int)(i % 4);
		const float sg = frand() < 0 ? -1.0f : 1.0f;
		const float u = fabsf(frand());
		w[i] = c == 0 || c == 3 ? sg * (1 + u) * 1e-33f : frand();
		g[i] = c == 1 ? sg * (0.5f + u) * 1e-20f : c == 2 ? frand() : 0.0f;
		for (int k = 0; k < ns; k++) {
			/* a second moment (and vmax) is never negative */
			const float sk = k > 0 ? 1.0f : sg;
			s[k][i] = c == 0   ? sk * FLT_MIN * (k > 0 ? 1 + 0.02f * u : 1 + 39 * u)
				  : c == 1 ? 0.0f
				  : c == 2 ? (k > 0 ? fabsf(frand()) : frand())
					   : sk * FLT_MIN * (0.01f + u) * 0.5f;
		}
	}
}

/* STEPS steps of `kind` over n elements; after each one every stored state
 * element is checked against sub_ref's r: on the cpu device exactly
 * sub_flush(r) (a zero of r's sign where |r| < FLT_MIN, r elsewhere); on
 * another device, which may keep subnormals, that or r within rounding.
 * On cpu an element whose state is all zero and whose g is +0 keeps its
 * weight bit for bit: the update read the stored zeros.  The IEEE loop's
 * subnormal results are counted: the case fails when too few were made
 * for it to tell the rule.  eps0 (the Adam family): eps = 0, below
 * which no device may flush (kiln/ops.h: a flushed v would divide by 0),
 * so the state is r itself, bit for bit on cpu, and every weight finite. */
static void subnormal_case(struct fx *f, int kind, int64_t n, int eps0)
{
	enum { STEPS = 30 };
	const int cpu = !strcmp(g_name, "cpu");
	int ns;
	const struct kiln_op op = sub_op(kind, n, eps0 ? 0.0 : 1e-8, &ns);
	const size_t b = (size_t)n * 4;
	const int64_t t = 5, off[3] = { 0, n / 3, n };
	const float lr = 0.1f;
	float *w = malloc(b), *w0 = malloc(b), *g = malloc(b), *s[3], *got[3];
	void *dw, *dg, *ds[3] = { NULL, NULL, NULL };
	int64_t made = 0, kept = 0;
	for (int k = 0; k < 3; k++)
		s[k] = calloc((size_t)n, 4), got[k] = malloc(b);
	sub_init(n, ns, w, s, g);
	dw = dput(f, w, b), dg = dput(f, g, b);
	for (int k = 0; k < ns; k++)
		ds[k] = dput(f, s[k], b);
	void *dl = dput(f, &lr, 4), *dt = dput(f, &t, 8), *doff = dput(f, off, sizeof off);
	const void *in[4] = { dg, dl, dt, doff };
	void *out[4] = { dw, ds[0], ds[1], ds[2] };
	for (int step = 0; step < STEPS; step++) {
		memcpy(w0, w, b);
		OK(run_op(f, &op, in, out));
		dget(f, w, dw, b);
		for (int k = 0; k < ns; k++)
			dget(f, got[k], ds[k], b);
		for (int64_t i = 0; i < n; i++) {
			float r[3];
			sub_ref(kind, !eps0, s, g, i, r);
			if (eps0 && !isfinite(w[i]))
				ck_abort_msg("%s eps 0 n %lld step %d: w[%lld] (class %d, g %a) %a",
					     sub_name[kind], (long long)n, step + 1, (long long)i,
					     (int)(i % 4), (double)g[i], (double)w[i]);
			for (int k = 0; k < ns; k++) {
				const float want = eps0 ? r[k] : sub_flush(r[k]), have = got[k][i];
				made += sub_flush(r[k]) != r[k];
				/* (ck_abort only on a failure: a passing ck_assert
				 * writes to Check's pipe, millions of times here) */
				if (cpu && memcmp(&have, &want, 4))
					ck_abort_msg("%s eps %g n %lld step %d: state %d [%lld] (class %d) stored %a, want %a (the IEEE result %a)",
						     sub_name[kind], eps0 ? 0.0 : 1e-8, (long long)n, step + 1, k, (long long)i,
						     (int)(i % 4), (double)have, (double)want, (double)r[k]);
				if (!cpu && have != want &&
				    !(fabs((double)have - r[k]) <= 1e-6 * fabs(r[k]) + 1e-44))
					ck_abort_msg("%s step %d: state %d [%lld] %a, want %a or about %a",
						     sub_name[kind], step + 1, k, (long long)i, (double)have,
						     (double)want, (double)r[k]);
			}
		}
		/* the next step's reference starts from the stored state */
		for (int k = 0; k < ns; k++)
			memcpy(s[k], got[k], b);
		for (int64_t i = 0; cpu && i < n; i++) {
			int zero = g[i] == 0.0f;
			for (int k = 0; k < ns; k++)
				zero &= s[k][i] == 0.0f;
			if (!zero)
				continue;
			kept++;
			if (memcmp(&w[i], &w0[i], 4))
				ck_abort_msg("%s step %d: w[%lld] %a moved to %a with its state 0",
					     sub_name[kind], step + 1, (long long)i, (double)w0[i], (double)w[i]);
		}
	}
	ck_assert_msg(made > n / 4, "%s: only %lld subnormal results in %d steps of %lld elements",
		      sub_name[kind], (long long)made, STEPS, (long long)n);
	ck_assert_msg(!cpu || eps0 || kept > n / 8, "%s: only %lld element-steps with state 0 and g 0",
		      sub_name[kind], (long long)kept);
	for (int k = 0; k < ns; k++)
		kiln_device_free(f->dev, ds[k]);
	DFREE(f, dw, dg, dl, dt, doff);
	free(w), free(w0), free(g);
	for (int k = 0; k < 3; k++)
		free(s[k]), free(got[k]);
}

/* Every optimizer op, n across a vector's and a 4096-element block's tail
 * (4099) and over the parallel threshold (70001: a span per thread). */
DFX_TEST(subnormal_state)
{
	/* which clone the cpu plugin's resolvers took (the CPU they see:
	 * tests/optim_subnormal_avx2.sh runs this under valgrind's, AVX2) */
	__builtin_cpu_init();
	printf("subnormal_state: the cpu clone %s\n", __builtin_cpu_supports("avx512f") ? "avx512f"
						      : __builtin_cpu_supports("avx2")  ? "avx2"
											 : "default");
	fflush(stdout);
	for (int kind = 0; kind < SUB_KINDS; kind++) {
		if (kind >= SUB_ADAMW && unsupported(f, kind == SUB_LAMB ? KILN_OP_LAMB : KILN_OP_ADAMW))
			continue;
		subnormal_case(f, kind, 4099, 0);
		subnormal_case(f, kind, 70001, 0);
		if (kind >= SUB_ADAMW) { /* eps = 0: the state kept IEEE */
			subnormal_case(f, kind, 4099, 1);
			subnormal_case(f, kind, 70001, 1);
		}
	}
}

DEVICE_SUITE(optim, DFX_CASE(sgd), DFX_CASE(sgd_dampening), DFX_CASE(sgd_copy), DFX_CASE(grad_clip), DFX_CASE(unscale), DFX_CASE(grad_clip_overflow), DFX_CASE(grad_clip_order), DFX_CASE(grad_clip_big), DFX_CASE(grad_sumsq), DFX_CASE(grad_sumsq_range), DFX_CASE(scaler_update),
	     DFX_CASE(adam), DFX_CASE(amsgrad), DFX_CASE(lamb), DFX_CASE(subnormal_state));
