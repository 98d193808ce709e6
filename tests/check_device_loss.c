/* tests/check_device_loss.c - device conformance:
 * the losses: softmax cross-entropy (with a loss scale), smoothed
 * cross-entropy, MSE and BCE against PyTorch.
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

/* ---- softmax cross-entropy ------------------------------------------- */

/* SOFTMAX_XENT of N rows of C f32 logits, the first `valid` counted,
 * gradient scale f0: in0 logits, in1 i32 labels; out0 dlogits, out1 the
 * [loss, correct] sums added into */
static void xent_op(struct kiln_op *op, int N, int C, int valid, double f0)
{
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_SOFTMAX_XENT;
	op->n_in = op->n_out = 2;
	op->in[0] = op->out[0] = td(KILN_F32, 2, N, C);
	op->in[1] = td(KILN_I32, 1, N, 0);
	op->out[1] = td(KILN_F32, 1, 2, 0);
	op->i[0] = valid;
	op->f[0] = f0;
}

/* K > 0: only the first K columns are classes (i[5], ABI 2.4); inplace:
 * the gradient is written over the logits (out0 = in0, ABI 2.4). */
static void xent_case(struct fx *f, int N, int C, int valid, float spread, int K, int inplace)
{
	const int k = K ? K : C;
	float *x = frandv((size_t)N * C), *g = malloc((size_t)N * C * 4);
	int32_t *lab = malloc((size_t)N * 4);
	float m0[2] = { 1.5f, 2.0f }, m[2];
	for (int i = 0; i < N * C; i++)
		x[i] *= spread;
	for (int i = 0; i < N * C; i++) /* padding above every class */
		if (i % C >= k)
			x[i] = 3 * spread;
	for (int r = 0; r < N; r++) {
		lab[r] = (int32_t)((r * 7 + 3) % k);
		if (r % 3 == 0) /* make some rows correct */
			x[r * C + lab[r]] = spread * 2;
	}
	struct kiln_op op;
	xent_op(&op, N, C, valid, 1.0 / valid);
	op.i[5] = K;
	void *dx = dput(f, x, (size_t)N * C * 4), *dl = dput(f, lab, (size_t)N * 4);
	void *dg = inplace ? dx : dput(f, x, (size_t)N * C * 4), *dm = dput(f, m0, sizeof m0);
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
		for (int j = 1; j < k; j++)
			if (xr[j] > mx)
				mx = xr[j], am = j;
		for (int j = 0; j < k; j++)
			s += exp(xr[j] - mx);
		loss += log(s) - (xr[lab[r]] - mx);
		correct += am == lab[r];
		for (int j = 0; j < C; j++) {
			double want = j < k ? (exp(xr[j] - mx) / s - (j == lab[r])) / valid : 0.0;
			NEAR(g[r * C + j], want, 1.0 / valid, 1e-5, "dlogits[%d,%d] = %g, want %g", r,
			     j, g[r * C + j], want);
		}
	}
	NEAR(m[0], m0[0] + loss, m0[0] + loss, 1e-5, "loss sum %g, want %g", m[0], m0[0] + loss);
	ck_assert_float_eq(m[1], m0[1] + correct);
	if (!inplace)
		DFREE(f, dg);
	DFREE(f, dx, dl, dm);
	free(x), free(g), free(lab);
}

DFX_TEST(softmax_xent)
{
	xent_case(f, 9, 5, 7, 3.0f, 0, 0);
	xent_case(f, 4, 1, 4, 1.0f, 0, 0);
	xent_case(f, 6, 10, 6, 200.0f, 0, 0); /* large logits: needs the max shift */
	xent_case(f, 300, 200, 257, 5.0f, 0, 0);
	/* ABI 2.4: over the logits, padded classes (their logits the largest,
	 * so counting them would show), both */
	xent_case(f, 300, 200, 257, 5.0f, 0, 1);
	xent_case(f, 9, 40, 7, 3.0f, 33, 0);
	xent_case(f, 300, 200, 257, 5.0f, 150, 1);
	/* a vocabulary's width: the CUDA device's block-a-row kernel from 1024
	 * classes in rows of a multiple of 8 elements; padded classes, over
	 * the logits, more rows than its blocks (1024), and a width it leaves
	 * to the warp-a-row kernel */
	xent_case(f, 37, 2056, 30, 5.0f, 0, 0);
	xent_case(f, 37, 2056, 30, 5.0f, 1500, 1);
	xent_case(f, 1100, 1024, 1090, 4.0f, 0, 1);
	xent_case(f, 5, 1027, 5, 5.0f, 0, 0);
}

/* A vocabulary's width with the options: label smoothing, ignore_index
 * (i[2] = 1, its row count in m[3]), padded classes, top-5 with ties, and
 * the maximum twice in a row (the first index is the prediction): against
 * a double-precision loop.  The CUDA device's block-a-row kernel splits a
 * row over threads and warps, 8 elements a load; the ties lie in
 * different threads, and at C = 8200 also in one thread's successive
 * loads (elements 2048 and 4096 apart). */
static void xent_wide_case(struct fx *f, int C, int K)
{
	enum { N = 6 };
	const double eps = 0.1;
	const int far = K > 4200 ? 4096 : 891; /* row 0's second maximum: 9 + far */
	float *x = frandv((size_t)N * C), *g = malloc(sizeof(float) * N * C), m[4] = { 0, 0, 0, 0 };
	int32_t lab[N] = { 9 + far, 9, -100, 5, K - 1, 700 };
	for (int i = 0; i < N * C; i++)
		x[i] = i % C >= K ? 50.0f : 4 * x[i];
	/* row 0: the maximum twice (predicted 9, labelled 9 + far), and once
	 * more past it, 2048 on; row 1: predicted and labelled 9 */
	x[0 * C + 9] = x[0 * C + 9 + far] = x[0 * C + 9 + far / 2] = 30;
	x[1 * C + 9] = x[1 * C + 1000] = 30;
	/* row 3: the label the maximum, tied by 3 logits before it and 3 after
	 * (rank 3: in the top 5; counting every tie would give 6) */
	for (int j = 0; j < 7; j++)
		x[3 * C + (j < 3 ? j : j == 3 ? 5 : 596 + j)] = 20;
	/* row 5: tied by 5 logits before it (rank 5: not in the top 5;
	 * ignoring ties would give 0) */
	for (int j = 0; j < 6; j++)
		x[5 * C + (j == 5 ? 700 : 10 + 137 * j)] = 20;
	struct kiln_op op;
	xent_op(&op, N, C, N, 1.0 / N);
	op.out[1] = td(KILN_F32, 1, 4, 0);
	op.i[2] = 1, op.i[3] = -100, op.i[5] = K;
	op.f[1] = eps;
	void *dx = dput(f, x, sizeof(float) * N * C), *dl = dput(f, lab, sizeof lab);
	void *dg = dput(f, NULL, sizeof(float) * N * C), *dm = dput(f, m, sizeof m);
	OK(run_op(f, &op, (const void *[]){ dx, dl }, (void *[]){ dg, dm }));
	dget(f, g, dg, sizeof(float) * N * C);
	dget(f, m, dm, sizeof m);
	const int counted = N - 1;
	double loss = 0;
	int top1 = 0, top5 = 0;
	for (int r = 0; r < N; r++) {
		const float *xr = x + (size_t)r * C;
		if (lab[r] == -100) {
			for (int j = 0; j < C; j++)
				ck_assert_msg(g[r * C + j] == 0.0f, "ignored row: dlogits[%d] = %g", j,
					      g[r * C + j]);
			continue;
		}
		double mx = xr[0], s = 0, xs = 0;
		int am = 0, above = 0;
		for (int j = 1; j < K; j++)
			if (xr[j] > mx)
				mx = xr[j], am = j;
		for (int j = 0; j < K; j++) {
			s += exp(xr[j] - mx);
			xs += xr[j] - mx;
			above += xr[j] > xr[lab[r]] || (xr[j] == xr[lab[r]] && j < lab[r]);
		}
		loss += (1 - eps) * (log(s) - (xr[lab[r]] - mx)) + eps * (log(s) - xs / K);
		top1 += am == lab[r];
		top5 += above < 5;
		for (int j = 0; j < C; j++) {
			const double t = j == lab[r] ? 1 - eps + eps / K : eps / K;
			const double want = j < K ? (exp(xr[j] - mx) / s - t) / counted : 0.0;
			NEAR(g[r * C + j], want, 1.0 / counted, 1e-5, "C %d: dlogits[%d,%d] = %g, want %g",
			     C, r, j, g[r * C + j], want);
		}
	}
	/* the test's own premises: row 1 the one prediction, rows 0, 1, 3 in the top 5 */
	ck_assert_int_eq(top1, 1);
	ck_assert_int_eq(top5, 3);
	NEAR(m[0], loss, loss, 1e-5, "C %d: loss sum %g, want %g", C, m[0], loss);
	ck_assert_msg(m[1] == top1 && m[2] == top5 && m[3] == counted,
		      "C %d: top-1 %g (want %d), top-5 %g (want %d), rows %g (want %d)", C, m[1], top1,
		      m[2], top5, m[3], counted);
	DFREE(f, dx, dl, dg, dm);
	free(x), free(g);
}

DFX_TEST(xent_wide)
{
	xent_wide_case(f, 1040, 1030);
	xent_wide_case(f, 8200, 8195); /* more than one round of loads a thread */
}

/* Non-finite logits, as PyTorch's cross_entropy: a NaN logit (not the
 * label's) makes its row's loss and every gradient of the row NaN (the
 * CPU device clamped it to e^-88 until session 22, hiding it); a -inf
 * logit is a class of probability 0: the loss stays finite, its gradient
 * 0.  Rows: 0 NaN at column 3 (row 1 finite beside it, checked too), the
 * NaN first in its row (the maximum's scan starts there), -inf at 2. */
static void nonfinite_case(struct fx *f, int C)
{
	enum { N = 3 };
	const size_t bytes = sizeof(float) * N * (size_t)C;
	float *x = malloc(bytes), *g = malloc(bytes);
	for (int at = 0; at < 3; at++) {
		float m0[2] = { 0, 0 }, m[2];
		int32_t lab[N] = { 1, 4, 5 };
		for (int i = 0; i < N * C; i++)
			x[i] = frand() * 2;
		/* wide: the NaN first in a thread's share of the row (CUDA's
		 * block-a-row kernel: 8 elements a load) */
		const int r = at == 1 ? 2 : 0, j = at == 0 ? (C > 8 ? 296 : 3) : at == 1 ? 0 : 2;
		x[r * C + j] = at < 2 ? NAN : -INFINITY;
		struct kiln_op op;
		xent_op(&op, N, C, N, 1.0);
		void *dx = dput(f, x, bytes), *dl = dput(f, lab, sizeof lab);
		void *dg = dput(f, NULL, bytes), *dm = dput(f, m0, sizeof m0);
		OK(run_op(f, &op, (const void *[]){ dx, dl }, (void *[]){ dg, dm }));
		dget(f, g, dg, bytes);
		dget(f, m, dm, sizeof m);
		double loss = 0;
		for (int q = 0; q < N; q++) {
			const float *xr = x + q * C;
			if (at < 2 && q == r) {
				for (int k = 0; k < C; k++)
					ck_assert_msg(g[q * C + k] != g[q * C + k],
						      "NaN at [%d,%d]: dlogits[%d,%d] = %g, want NaN", r, j, q,
						      k, g[q * C + k]);
				continue;
			}
			double mx = -INFINITY, s = 0;
			for (int k = 0; k < C; k++)
				mx = xr[k] > mx ? xr[k] : mx;
			for (int k = 0; k < C; k++)
				s += exp(xr[k] - mx);
			loss += log(s) - (xr[lab[q]] - mx);
			for (int k = 0; k < C; k++) {
				const double want = exp(xr[k] - mx) / s - (k == lab[q]);
				NEAR(g[q * C + k], want, 1.0, 1e-5, "case %d dlogits[%d,%d] = %g, want %g", at,
				     q, k, g[q * C + k], want);
			}
		}
		if (at < 2)
			ck_assert_msg(m[0] != m[0], "case %d: loss sum %g, want NaN", at, m[0]);
		else
			NEAR(m[0], loss, loss, 1e-5, "-inf logit: loss sum %g, want %g", m[0], loss);
		DFREE(f, dx, dl, dg, dm);
	}
	free(x), free(g);
}

DFX_TEST(xent_nonfinite)
{
	nonfinite_case(f, 7);
	nonfinite_case(f, 1040);
}

/* A label outside [0,C) is KILN_EDATA naming the row: from run() in sync
 * mode, from the next stream_sync in async mode. */
static void bad_label_case(struct fx *f, int C)
{
	enum { N = 5 };
	float *x = calloc((size_t)N * C, sizeof(float)), m[2] = { 0 };
	int32_t lab[N] = { 1, 2, 3, C + 2, 4 };
	char want[32];
	snprintf(want, sizeof want, "%d", C + 2);
	struct kiln_op op;
	xent_op(&op, N, C, N, 1.0);
	const size_t bytes = sizeof(float) * (size_t)N * C;
	void *dx = dput(f, x, bytes), *dl = dput(f, lab, sizeof lab);
	void *dg = dput(f, NULL, bytes), *dm = dput(f, m, sizeof m);
	const void *in[2] = { dx, dl };
	void *out[2] = { dg, dm };
	ck_assert_int_eq(run_op(f, &op, in, out), KILN_EDATA);
	ck_assert_msg(strstr(kiln_last_error(), "row 3") && strstr(kiln_last_error(), want),
		      "message: %s", kiln_last_error());
	/* masked out, the bad row is not read */
	op.i[0] = 3;
	if (!f->async) {
		OK(run_op(f, &op, in, out));
		dget(f, m, dm, sizeof m);
		ck_assert_float_eq(m[1], 0.0f); /* all-zero logits: argmax 0, labels 1..3 */
	}
	DFREE(f, dx, dl, dg, dm);
	free(x);
}

DFX_TEST(softmax_bad_label)
{
	bad_label_case(f, 10);
}

/* the same over a vocabulary's width (CUDA's block-a-row kernel) */
DFX_TEST(softmax_bad_label_wide)
{
	bad_label_case(f, 1032);
}


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
		xent_op(&op, N, C, N, 1.0 / N);
		op.out[1] = td(KILN_F32, 1, 3, 0);
		op.i[1] = !strcmp(kind, "mse") ? KILN_LOSS_MSE : !strcmp(kind, "bce") ? KILN_LOSS_BCE
										       : KILN_LOSS_XENT;
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
		DFREE(&f, dx, dy, dg, dm);
		cases++;
	}
	fclose(fp);
	ck_assert_int_eq(cases, 5);
	fx_close(&f);
}
END_TEST

/* The loss scale input of SOFTMAX_XENT: dlogits = f[0] s (...), the
 * metrics unscaled: the same bits as f[0] multiplied by s on the host. */
static void loss_scale_case(struct fx *f, int C)
{
	enum { N = 37 };
	const size_t b = (size_t)N * C * 4;
	float *x = frandv((size_t)N * C), *g0 = malloc(b), *g1 = malloc(b);
	float m0[3], m1[3], zero[3] = { 0, 0, 0 }, s = 4096.0f;
	int32_t lab[37];
	for (int r = 0; r < N; r++)
		lab[r] = (r * 5 + 1) % C;
	for (int kind = 0; kind < 3; kind++) {
		void *dx = dput(f, x, b), *dl = dput(f, lab, sizeof lab), *ds = dput(f, &s, 4);
		void *dg = dput(f, NULL, b), *dm = dput(f, zero, 12);
		struct kiln_op op;
		xent_op(&op, N, C, N - 2, 1.0 / (N - 2));
		op.n_in = 3;
		op.in[2] = td(KILN_F32, 1, 1, 0);
		op.out[1] = td(KILN_F32, 1, 3, 0);
		op.i[1] = kind;
		op.f[1] = kind ? 0 : 0.1;
		const void *in[3] = { dx, dl, ds };
		void *out[2] = { dg, dm };
		OK(run_op(f, &op, in, out));
		dget(f, g1, dg, b);
		dget(f, m1, dm, 12);
		OK(kiln_device_copy_async(f->dev, dm, zero, 12, KILN_COPY_H2D, f->s));
		op.n_in = 2;
		op.f[0] = 1.0 / (N - 2) * s;
		OK(run_op(f, &op, in, out));
		dget(f, g0, dg, b);
		dget(f, m0, dm, 12);
		ck_assert_msg(!memcmp(g0, g1, b), "loss %d: scaled gradients differ", kind);
		ck_assert(!memcmp(m0, m1, sizeof m0));
		DFREE(f, dx, dl, ds, dg, dm);
	}
	free(x), free(g0), free(g1);
}

DFX_TEST(xent_loss_scale)
{
	loss_scale_case(f, 11);
	loss_scale_case(f, 1032); /* a vocabulary's width (CUDA's block-a-row kernel) */
}

DEVICE_SUITE(loss, DFX_CASE(softmax_xent), DFX_CASE(xent_wide), DFX_CASE(softmax_bad_label),
	     DFX_CASE(softmax_bad_label_wide), DFX_CASE(losses),
	     DFX_CASE(xent_loss_scale), DFX_CASE(xent_nonfinite));
