/* tests/check_cpu_wino.c - the CPU device's f32 3x3 convolution by
 * Winograd's F(4x4, 3x3) (plugins/cpu/wino.c: AVX-512, NHWC, channels
 * multiples of 16, stride 1, padding 0..2): the forward against a
 * double-precision loop on the ResNet example's layers at batch 2 (16, 32
 * and 64 channels at 28x28, 14x14, 7x7) and on shapes that reach the
 * kernel's corners: sizes not multiples of 4 (partial tiles, outputs
 * computed and not stored), no padding, padding 2, padding unequal in rows
 * and columns, one output, 48 and 80 output channels (the GEMM's 2 + 1 and
 * 4 + 1 vector blocks), 13 samples (blocks of TB tiles and a partial
 * one); with and without the bias, the fused ReLU and the residual
 * epilogue (KILN_OPF_RESIDUAL: act(conv + b + r)); the same bytes on 1, 2
 * and 4 threads; which ops it takes (one "(wino.c)" plan each on a CPU
 * with AVX-512F, BW and VL: every eligible op under conv_algo = winograd,
 * under rule and auto only the frozen ones of inference plans; none with
 * KILN_CPU_WINO=0, under conv_algo = direct or fft, or without those
 * CPU features; a bf16 op widened to f32, bf16_conv = f32, as the f32
 * op) and which it leaves to oneDNN (NCHW, 8 input or 24 output channels,
 * 512 x 256 channels (256 x 256 taken); of the data gradient: NCHW,
 * stride 2, 512 x 256 channels, accumulation, a kept dy (refused),
 * a 5x5 kernel, stride 2, dilation 2, padding 3, two groups, a leaky
 * ReLU, kept copies); a NaN or an inf in x reaching the outputs whose
 * window covers it, a ReLU keeping the NaN; a frozen plan's kept weights
 * (wino.c's U, oneDNN's reordered copy) on huge pages, unmapped at close.
 *
 * The plan counts are checked last in each test, after every result: a
 * build or a CPU where oneDNN computes the ops still has them checked
 * against the double loop.  The bytes on 1, 2 and 4 threads are compared
 * where wino.c made the plans (oneDNN promises no such thing).
 *
 * Tolerance: the error is measured as max |got - ref| / rms(ref) over the
 * tensor (conv_ref_err).  A direct kernel's f32 sums of 9 C <= 576
 * products are off by about eps sqrt(9 C) of their scale (eps = 6e-8);
 * Winograd's are off by more: each of the 36 products of a tile and
 * channel pair is a transformed input (B^T d B: up to 16 inputs, weights
 * up to 25) times a transformed filter (G g G^T: weights 1/576 to 1),
 * summed over the channels, and the output transform (A^T m A: weights up
 * to 64 in a tile's last row and column) adds 36 such sums whose result
 * is far smaller than the largest of them, so their rounding errors,
 * relative to the largest, remain.  Measured here (AMD EPYC, AVX-512; the
 * worst of the 8 combinations of bias, ReLU and residual, 2 threads):
 * 1.7e-5, 2.2e-5 and 2.3e-5 of the rms on the ResNet layers (16, 32 and 64
 * channels), 1.4e-5 to 2.4e-5 on the other shapes of 4 or more outputs a
 * side (2.4e-5: 32 -> 64 at padding 2), 6.0e-6 on 3x4 outputs (48 -> 16,
 * no padding; a tile's fourth row unused), 4.7e-7 on one output; the same
 * transforms in float32 NumPy give 1.2e-5 on the ResNet layers, and
 * oneDNN's direct kernel (KILN_CPU_WINO=0) 3.5e-7 to 5.8e-6 on these
 * shapes.  wino.c's bytes are the same on any AVX-512 CPU (fixed sums of
 * explicit FMAs).  The bound, 1e-4, is 4.2x the worst of these, and far
 * below what a wrong transform constant or a shift of one pixel gives:
 * each of these, tried in wino.c, failed test_forward by 0.2 of the rms
 * or more (-5 in B^T as -4: 2.8, x4 - x2 as x4 + x2: 14, 8 in A^T as 7:
 * 2.7, 1/24 in G as 1/25: 0.21, a tile's input one column or one row on:
 * 6.2, 6.0, a border pixel read as inside, the residual added after the
 * ReLU: 0.35, a GEMM block of 12 tiles computing 11: 3.1).
 */
#include <kiln/kiln.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check_main.h"
#include "test_util.h"
#include "conv_ref.h" /* conv_ref_run, conv_ref_err, conv_ref_at */
#include "smaps.h"    /* smaps_hg_bytes, smaps_thp, SMAPS_ASAN */
#include "../plugins/common/half.h" /* half_f32_bf16, half_bf16_f32 */

static struct kiln_registry *reg;

#define TOL 1e-4
#define WINO "plugin.cpu.conv_algo=winograd"

struct shape {
	int64_t N, C, H, W, O, KH, KW, ph, pw;
};
static const struct shape shapes[] = {
	/* the ResNet example's 3x3 layers at batch 2 */
	{ 2, 16, 28, 28, 16, 3, 3, 1, 1 },
	{ 2, 32, 14, 14, 32, 3, 3, 1, 1 },
	{ 2, 64, 7, 7, 64, 3, 3, 1, 1 },
	/* 9x11 outputs: partial tiles in both directions; 48 outputs: the
	 * GEMM's 2 + 1 vectors */
	{ 2, 16, 9, 11, 48, 3, 3, 1, 1 },
	/* no padding (3x4 outputs), 48 input channels */
	{ 2, 48, 5, 6, 16, 3, 3, 0, 0 },
	/* padding 2 (8x8 outputs, border tiles reading little input) */
	{ 1, 32, 6, 6, 64, 3, 3, 2, 2 },
	/* one output a sample */
	{ 1, 16, 1, 1, 16, 3, 3, 1, 1 },
	/* 80 outputs: 4 + 1 vectors; 13 tiles: a block of 12 and one */
	{ 13, 16, 4, 4, 80, 3, 3, 1, 1 },
	/* 13 samples: 52 tiles, a block of 36 and one of 16 */
	{ 13, 16, 7, 7, 32, 3, 3, 1, 1 },
	/* padding 2 in rows and 0 in columns (9x8 outputs): rows and
	 * columns kept apart */
	{ 1, 16, 7, 10, 32, 3, 3, 2, 0 },
};
#define N_SHAPES ((int)(sizeof shapes / sizeof *shapes))
static const char *const shape_names[N_SHAPES] = {
	"16->16 28x28 pad 1", "32->32 14x14 pad 1", "64->64 7x7 pad 1", "16->48 9x11 pad 1",
	"48->16 5x6 pad 0",   "32->64 6x6 pad 2",   "16->16 1x1 pad 1", "16->80 4x4 pad 1 (13)",
	"16->32 7x7 pad 1 (13)", "16->32 7x10 pad 2x0",
};

enum { F_BIAS = 1, F_RELU = 2, F_RES = 4 };

/* One op as the test builds it: CONV of shape s, NHWC f32 unless nchw or
 * bf16; stride, dil, groups 0 mean 1; leaky: the fused activation a leaky
 * ReLU instead (with F_RELU); extra: flags beyond fl's (KILN_OPF_FROZEN,
 * KILN_OPF_KEEP: prepared only). */
struct cop {
	int fl;
	const struct shape *s;
	int nchw, bf16, stride, dil, groups, leaky, extra;
};

/* Whether wino.c should take an eligible op on this CPU. */
static int avx512(void) { return conv_ref_avx512(); }

static int64_t one(int v) { return v ? v : 1; }

static int64_t oh(const struct cop *c) { return conv_ref_osize(c->s->H, c->s->ph, c->s->KH, c->dil, c->stride); }
static int64_t ow(const struct cop *c) { return conv_ref_osize(c->s->W, c->s->pw, c->s->KW, c->dil, c->stride); }

/* The values of tensor salt: x (1), w (2), b (4), the initial y (5), the
 * residual r (7). */
static float *filled(int64_t n, uint32_t salt)
{
	float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
	ck_assert(p);
	for (int64_t i = 0; i < n; i++)
		p[i] = test_hash_val((uint32_t)i, salt);
	return p;
}

/* c's op in *op; the salts of its inputs in sin[]. */
static void make_op(const struct cop *c, struct kiln_op *op, uint32_t sin[4])
{
	const struct shape *s = c->s;
	const int lay = c->nchw ? KILN_NCHW : KILN_NHWC, dt = c->bf16 ? KILN_BF16 : KILN_F32;
	const int64_t g = one(c->groups);
	const struct kiln_tensor_desc x = test_desc4(dt, s->N, s->C, s->H, s->W, lay),
				      y = test_desc4(dt, s->N, s->O, oh(c), ow(c), lay),
				      w = test_desc4(dt, s->O, s->C / g, s->KH, s->KW, KILN_NCHW);
	struct kiln_tensor_desc b;
	const int64_t bd[1] = { s->O };
	kiln_tensor_desc_init(&b, dt, 1, bd);
	memset(op, 0, sizeof *op);
	op->type = KILN_OP_CONV;
	op->flags = c->extra;
	op->i[0] = op->i[1] = one(c->stride);
	op->i[2] = s->ph, op->i[3] = s->pw;
	op->i[4] = op->i[5] = one(c->dil);
	op->i[6] = g;
	op->n_in = c->fl & F_BIAS ? 3 : 2, op->n_out = 1;
	op->in[0] = x, op->in[1] = w, op->in[2] = b, op->out[0] = y;
	sin[0] = 1, sin[1] = 2, sin[2] = 4;
	if (c->fl & F_RELU) {
		op->flags |= KILN_OPF_ACT;
		op->i[KILN_OPI_ACT] = c->leaky ? KILN_ACT_LEAKY_RELU : KILN_ACT_RELU;
		op->f[KILN_OPF_ACT_ALPHA] = c->leaky ? 0.1 : 0;
	}
	if (c->fl & F_RES) { /* r, last, as y */
		op->flags |= KILN_OPF_RESIDUAL;
		sin[op->n_in] = 7;
		op->in[op->n_in++] = y;
	}
	if (c->extra & KILN_OPF_KEEP) { /* the kept copy of x: u8[1] */
		const int64_t d1[1] = { 1 };
		kiln_tensor_desc_init(&op->out[op->n_out++], KILN_U8, 1, d1);
	}
}

/* A cpu device on `threads` threads with the overrides ov (or none;
 * several split at ';'); off: KILN_CPU_WINO=0 in the environment until
 * close_dev. */
static struct kiln_config *open_dev(int threads, const char *ov, int off, struct kiln_device **dev)
{
	return conv_dev_open(reg, threads, ov, off ? "KILN_CPU_WINO" : NULL, "0", dev);
}

static void close_dev(struct kiln_device *dev, struct kiln_config *cfg, int off)
{
	kiln_device_close(dev);
	kiln_config_free(cfg);
	if (off)
		unsetenv("KILN_CPU_WINO");
}

/* Prepares op on dev, counting its wino plans into *plans: the status. */
static int prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan, size_t *wsb, int *plans)
{
	return conv_dev_prepare(dev, op, plan, wsb, "(wino.c)", plans);
}

/* A device buffer holding n floats vals. */
static void *upload(struct kiln_device *dev, const float *vals, int64_t n)
{
	void *d;
	ck_assert(kiln_device_alloc(dev, (size_t)(n ? n : 1) * 4, &d) == 0);
	memcpy(d, vals, (size_t)n * 4);
	return d;
}

/* Runs f32 c on a cpu device (threads; override ov or none; off:
 * KILN_CPU_WINO=0); x: its input, or NULL for filled(.., 1).  Returns y,
 * malloc'ed, *n its element count; *plans the wino plans its prepare
 * made; hg (or NULL): the process's bytes advised with MADV_HUGEPAGE
 * just before the run (every buffer made) and just after it. */
static float *run_op_hg(const struct cop *c, int threads, const char *ov, int off, const float *x, int64_t *n,
			int *plans, size_t hg[2])
{
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(threads, ov, off, &dev);
	struct kiln_op op;
	uint32_t sin[4];
	make_op(c, &op, sin);
	void *plan, *stream, *ws = NULL, *din[4] = { NULL, NULL, NULL, NULL };
	size_t wsb = 0;
	ck_assert_msg(prepare(dev, &op, &plan, &wsb, plans) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	for (int k = 0; k < op.n_in; k++) {
		const int64_t ne = kiln_tensor_numel(&op.in[k]);
		float *v = k == 0 && x ? NULL : filled(ne, sin[k]);
		din[k] = upload(dev, v ? v : x, ne);
		free(v);
	}
	*n = kiln_tensor_numel(&op.out[0]);
	float *y0 = filled(*n, 5);
	void *dy = upload(dev, y0, *n);
	free(y0);
	if (wsb)
		ck_assert(kiln_device_alloc(dev, wsb, &ws) == 0);
	struct kiln_op_args a = { .in = { din[0], din[1], din[2], din[3] }, .out = { dy },
				  .workspace = ws, .workspace_bytes = wsb };
	if (hg)
		hg[0] = smaps_hg_bytes();
	ck_assert_msg(kiln_device_run(dev, plan, &a, stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	if (hg)
		hg[1] = smaps_hg_bytes();
	float *out = malloc((size_t)*n * sizeof *out);
	ck_assert(out);
	memcpy(out, dy, (size_t)*n * sizeof *out);
	for (int k = 0; k < 4; k++)
		kiln_device_free(dev, din[k]);
	kiln_device_free(dev, dy);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	close_dev(dev, cfg, off);
	return out;
}

static float *run_op(const struct cop *c, int threads, const char *ov, int off, const float *x, int64_t *n,
		     int *plans)
{
	return run_op_hg(c, threads, ov, off, x, n, plans, NULL);
}

/* The double-precision y of f32 c on run_op's inputs (x: as there),
 * act(conv + b + r). */
static double *reference(const struct cop *c, const float *x, int64_t *n)
{
	const struct shape *s = c->s;
	const struct conv_ref g = { s->N, s->C, s->H, s->W, s->O, s->KH, s->KW, s->ph, s->pw, !c->nchw };
	const int64_t nx = s->N * s->C * s->H * s->W, nw = s->O * s->C * s->KH * s->KW;
	float *xf = x ? NULL : filled(nx, 1), *w = filled(nw, 2), *b = filled(s->O, 4);
	const int relu = (c->fl & F_RELU) != 0, res = (c->fl & F_RES) != 0;
	double *r = conv_ref_run(KILN_OP_CONV, &g, x ? x : xf, w, NULL, c->fl & F_BIAS ? b : NULL, relu && !res,
				 0, NULL, NULL, n);
	if (res) { /* the residual before the ReLU */
		float *rr = filled(*n, 7);
		for (int64_t i = 0; i < *n; i++) {
			r[i] += rr[i];
			if (relu && r[i] < 0)
				r[i] = 0;
		}
		free(rr);
	}
	free(xf), free(w), free(b);
	return r;
}

static double maxd(double a, double b) { return a > b ? a : b; }

/* The plan counts that were not the expected ones (checked last:
 * tally_check). */
struct tally {
	struct conv_plans pl; /* wino.c's plans */
};

/* Records `plans` made by an op described by what, where want were
 * expected. */
static void tally_plans(struct tally *ty, int plans, int want, const char *what)
{
	conv_plans_add(&ty->pl, plans, want, what, "wino");
}

static void tally_check(const struct tally *ty, const char *test) { conv_plans_check(&ty->pl, test, "wino"); }

static void flags_str(char *buf, size_t n, int fl)
{
	snprintf(buf, n, "%s%s%s", fl & F_BIAS ? " bias" : "", fl & F_RELU ? " ReLU" : "",
		 fl & F_RES ? " residual" : "");
}

/* Every shape with every combination of bias, ReLU and residual under
 * conv_algo = winograd, against the double loop. */
START_TEST(test_forward)
{
	static const int fls[] = { 0,	   F_BIAS, F_RELU, F_BIAS | F_RELU, F_RES, F_BIAS | F_RES,
				   F_RELU | F_RES, F_BIAS | F_RELU | F_RES };
	const int nf = (int)(sizeof fls / sizeof *fls);
	struct tally ty = { 0 };
	double worst = 0;
	for (int si = 0; si < N_SHAPES; si++) {
		double ws = 0;
		for (int k = 0; k < nf; k++) {
			const struct cop c = { .fl = fls[k], .s = &shapes[si] };
			int64_t n, nr;
			int p;
			char what[160], fs[64];
			flags_str(fs, sizeof fs, c.fl);
			snprintf(what, sizeof what, "%s%s", shape_names[si], fs);
			float *f = run_op(&c, 2, WINO, 0, NULL, &n, &p);
			double *r = reference(&c, NULL, &nr);
			ck_assert(n == nr);
			const double e = conv_ref_err(f, r, n);
			ck_assert_msg(e < TOL, "%s: off by %.3g of the rms (wino plans %d)", what, e, p);
			ws = maxd(ws, e);
			tally_plans(&ty, p, avx512(), what);
			free(f), free(r);
		}
		printf("wino: %s: worst error %.3g of the rms\n", shape_names[si], ws);
		worst = maxd(worst, ws);
	}
	printf("wino: forward: worst error %.3g of the rms; %d of %d prepares by wino.c\n", worst, ty.pl.made,
	       ty.pl.ops);
	fflush(stdout); /* before a failed check ends the test's process */
	tally_check(&ty, "forward");
}
END_TEST

/* The same bytes on 1, 2 and 4 threads (more threads than blocks: 3
 * blocks of 24 tiles, 64 in all; 5 of 48, 196 in all), each within the
 * bound of the double loop; both large enough for wino.c's team
 * (tiles C O >= CPU_PAR_MIN) and the device's (not one thread's op). */
START_TEST(test_threads)
{
	static const struct shape sh[] = { { 4, 32, 14, 14, 32, 3, 3, 1, 1 }, { 4, 16, 28, 28, 16, 3, 3, 1, 1 } };
	static const int threads[] = { 1, 2, 4 };
	struct tally ty = { 0 };
	for (int si = 0; si < 2; si++) {
		const struct cop c = { .fl = F_BIAS | F_RELU | F_RES, .s = &sh[si] };
		float *f[3];
		int64_t n[3], nr;
		int p[3];
		char what[160];
		double *r = reference(&c, NULL, &nr);
		for (int k = 0; k < 3; k++) {
			snprintf(what, sizeof what, "%lld->%lld %lldx%lld at batch %lld on %d threads",
				 (long long)c.s->C, (long long)c.s->O, (long long)c.s->H, (long long)c.s->W,
				 (long long)c.s->N, threads[k]);
			f[k] = run_op(&c, threads[k], WINO, 0, NULL, &n[k], &p[k]);
			ck_assert(n[k] == nr);
			const double e = conv_ref_err(f[k], r, nr);
			ck_assert_msg(e < TOL, "%s: off by %.3g of the rms", what, e);
			tally_plans(&ty, p[k], avx512(), what);
		}
		for (int k = 1; k < 3; k++)
			if (p[0] == 1 && p[k] == 1)
				ck_assert_msg(!memcmp(f[0], f[k], (size_t)nr * sizeof *f[0]),
					      "%lld->%lld %lldx%lld: other bytes on 1 and %d threads",
					      (long long)c.s->C, (long long)c.s->O, (long long)c.s->H,
					      (long long)c.s->W, threads[k]);
		for (int k = 0; k < 3; k++)
			free(f[k]);
		free(r);
	}
	tally_check(&ty, "threads");
}
END_TEST

/* The wino plans c's op makes when prepared on 2 threads (override ov or
 * none; off: KILN_CPU_WINO=0); must_prepare: the op is one the cpu
 * device prepares (else a refusal counts as none made, and *refused is
 * set when refused is not NULL). */
static int plans_of(const struct cop *c, const char *ov, int off, int must_prepare, int *refused)
{
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, ov, off, &dev);
	struct kiln_op op;
	uint32_t sin[4];
	make_op(c, &op, sin);
	void *plan = NULL;
	size_t wsb = 0;
	int plans;
	const int st = prepare(dev, &op, &plan, &wsb, &plans);
	ck_assert_msg(st == 0 || !must_prepare, "%s", kiln_last_error());
	if (refused)
		*refused = st != 0;
	if (!st)
		kiln_device_plan_free(dev, plan);
	close_dev(dev, cfg, off);
	return plans;
}

/* Which ops wino.c takes: under conv_algo = winograd every eligible op,
 * under rule (the default) and auto the frozen ones (an inference plan's),
 * under direct and fft none, with KILN_CPU_WINO=0 none; and what it leaves
 * to oneDNN under winograd, frozen too. */
/* The wino plans a CONV_BWD_DATA of shape s (layout, stride, flags: 0,
 * KILN_OPF_ACCUMULATE or KILN_OPF_KEEP with its u8 copy of dy) makes when
 * prepared under conv_algo = winograd; *st the prepare's status. */
static int bwd_plans_of(const struct shape *s, int nchw, int stride, int flags, int *st)
{
	const int lay = nchw ? KILN_NCHW : KILN_NHWC;
	const int64_t OH = conv_ref_osize(s->H, s->ph, 3, 1, stride), OW = conv_ref_osize(s->W, s->pw, 3, 1, stride);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV_BWD_DATA, op.flags = flags, op.n_in = 2, op.n_out = 1;
	op.in[0] = test_desc4(KILN_F32, s->N, s->O, OH, OW, lay);
	op.in[1] = test_desc4(KILN_F32, s->O, s->C, 3, 3, KILN_NCHW);
	op.out[0] = test_desc4(KILN_F32, s->N, s->C, s->H, s->W, lay);
	op.i[0] = op.i[1] = stride, op.i[4] = op.i[5] = op.i[6] = 1;
	op.i[2] = s->ph, op.i[3] = s->pw;
	if (flags & KILN_OPF_KEEP) { /* in2: the weight gradient's copy of dy */
		const int64_t d1[1] = { 1 };
		kiln_tensor_desc_init(&op.in[op.n_in++], KILN_U8, 1, d1);
	}
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, WINO, 0, &dev);
	void *plan = NULL;
	size_t wsb = 0;
	int plans;
	*st = prepare(dev, &op, &plan, &wsb, &plans);
	if (!*st)
		kiln_device_plan_free(dev, plan);
	close_dev(dev, cfg, 0);
	return plans;
}

START_TEST(test_rules)
{
	static const struct shape base = { 2, 16, 9, 9, 16, 3, 3, 1, 1 },
				  c8 = { 2, 8, 9, 9, 16, 3, 3, 1, 1 }, o24 = { 2, 16, 9, 9, 24, 3, 3, 1, 1 },
				  k5 = { 2, 16, 9, 9, 16, 5, 5, 2, 2 }, p3 = { 2, 16, 9, 9, 16, 3, 3, 3, 3 },
				  g2 = { 2, 32, 9, 9, 32, 3, 3, 1, 1 }, c256 = { 1, 256, 4, 4, 256, 3, 3, 1, 1 },
				  c512 = { 1, 512, 4, 4, 256, 3, 3, 1, 1 };
	const int F = KILN_OPF_FROZEN, want = avx512();
	struct tally ty = { 0 };
	const struct cop plain = { .fl = F_BIAS | F_RELU, .s = &base },
			 frozen = { .fl = F_BIAS | F_RELU, .s = &base, .extra = F },
			 frozen_res = { .fl = F_BIAS | F_RELU | F_RES, .s = &base, .extra = F };
	/* the settings */
	tally_plans(&ty, plans_of(&frozen, NULL, 0, 1, NULL), want, "frozen, conv_algo = rule (default)");
	tally_plans(&ty, plans_of(&frozen_res, NULL, 0, 1, NULL), want,
		    "frozen with a residual, conv_algo = rule (default)");
	tally_plans(&ty, plans_of(&frozen, "plugin.cpu.conv_algo=rule", 0, 1, NULL), want,
		    "frozen, conv_algo = rule");
	tally_plans(&ty, plans_of(&frozen, "plugin.cpu.conv_algo=auto", 0, 1, NULL), want,
		    "frozen, conv_algo = auto");
	tally_plans(&ty, plans_of(&plain, NULL, 0, 1, NULL), 0, "not frozen, conv_algo = rule (default)");
	tally_plans(&ty, plans_of(&plain, "plugin.cpu.conv_algo=auto", 0, 1, NULL), 0,
		    "not frozen, conv_algo = auto");
	tally_plans(&ty, plans_of(&plain, WINO, 0, 1, NULL), want, "not frozen, conv_algo = winograd");
	tally_plans(&ty, plans_of(&frozen, WINO, 0, 1, NULL), want, "frozen, conv_algo = winograd");
	tally_plans(&ty, plans_of(&plain, WINO, 1, 1, NULL), 0, "conv_algo = winograd, KILN_CPU_WINO=0");
	tally_plans(&ty, plans_of(&frozen, NULL, 1, 1, NULL), 0, "frozen, rule, KILN_CPU_WINO=0");
	tally_plans(&ty, plans_of(&frozen, "plugin.cpu.conv_algo=direct", 0, 1, NULL), 0,
		    "frozen, conv_algo = direct");
	/* channels: 256 x 256 taken, 512 x 256 not (U would stream from
	 * memory for every block of tiles) */
	const struct cop big = { .fl = F_BIAS, .s = &c256, .extra = F }, bigger = { .fl = F_BIAS, .s = &c512, .extra = F };
	tally_plans(&ty, plans_of(&big, NULL, 0, 1, NULL), want, "256 x 256 channels, frozen, rule");
	tally_plans(&ty, plans_of(&bigger, WINO, 0, 1, NULL), 0, "512 x 256 channels, winograd");
	int refused;
	const int pf = plans_of(&frozen, "plugin.cpu.conv_algo=fft", 0, 0, &refused);
	if (!refused) /* (refused: a build without FFTW) */
		tally_plans(&ty, pf, 0, "frozen, conv_algo = fft");
	/* the ops it leaves to oneDNN under winograd, frozen or not */
	const struct cop left[] = {
		{ .fl = F_BIAS, .s = &base, .nchw = 1 },
		{ .fl = F_BIAS, .s = &c8 },
		{ .fl = F_BIAS, .s = &o24 },
		{ .fl = F_BIAS, .s = &k5 },
		{ .fl = F_BIAS, .s = &base, .stride = 2 },
		{ .fl = F_BIAS, .s = &base, .dil = 2 },
		{ .fl = F_BIAS, .s = &p3 },
		{ .fl = F_BIAS, .s = &g2, .groups = 2 },
		{ .fl = F_BIAS | F_RELU, .s = &base, .leaky = 1 },
	};
	static const char *const names[] = { "NCHW",	   "8 input channels", "24 output channels",
					      "5x5",	   "stride 2",	       "dilation 2",
					      "padding 3", "groups 2",	       "leaky ReLU" };
	char what[160];
	for (size_t i = 0; i < sizeof left / sizeof *left; i++)
		for (int fz = 0; fz < 2; fz++) {
			struct cop c = left[i];
			c.extra = fz ? F : 0;
			snprintf(what, sizeof what, "%s%s", names[i], fz ? ", frozen" : "");
			/* (a leaky ReLU: the device may refuse to fuse it) */
			tally_plans(&ty, plans_of(&c, WINO, 0, !c.leaky, NULL), 0, what);
		}
	/* the data gradients it leaves under winograd: NCHW, stride 2, 512 x
	 * 256 channels, accumulation (which oneDNN may refuse too), a kept
	 * copy of dy (refused: KILN_ENOTSUP, so that the layer reads dy) */
	int st;
	tally_plans(&ty, bwd_plans_of(&base, 1, 1, 0, &st), 0, "data gradient, NCHW");
	tally_plans(&ty, bwd_plans_of(&base, 0, 2, 0, &st), 0, "data gradient, stride 2");
	tally_plans(&ty, bwd_plans_of(&c512, 0, 1, 0, &st), 0, "data gradient, 512 x 256 channels");
	tally_plans(&ty, bwd_plans_of(&base, 0, 1, KILN_OPF_ACCUMULATE, &st), 0, "data gradient, accumulate");
	tally_plans(&ty, bwd_plans_of(&base, 0, 1, KILN_OPF_KEEP, &st), 0, "data gradient, kept dy");
	ck_assert_msg(!avx512() || st == KILN_ENOTSUP, "data gradient with a kept dy under winograd: status %d, "
		      "KILN_ENOTSUP expected", st);
	tally_plans(&ty, bwd_plans_of(&base, 0, 1, 0, &st), avx512(), "data gradient");
	/* bf16 with bf16_conv = f32: the op widened to f32 (lowp.c) takes
	 * the f32 convolutions' algorithm, wino.c's as the FFT's under fft;
	 * with KILN_CPU_WINO=0 oneDNN's.  (bf16_conv = auto times oneDNN's
	 * bf16 kernel against the widened op, and bf16 runs the widened op
	 * on a CPU where oneDNN has no bf16 convolution: not counted.) */
	const struct cop b16 = { .fl = F_BIAS | F_RELU, .s = &base, .bf16 = 1 };
	tally_plans(&ty, plans_of(&b16, WINO ";plugin.cpu.bf16_conv=f32", 0, 1, NULL), want,
		    "bf16, bf16_conv = f32");
	tally_plans(&ty, plans_of(&b16, WINO ";plugin.cpu.bf16_conv=f32", 1, 1, NULL), 0,
		    "bf16, bf16_conv = f32, KILN_CPU_WINO=0");
	/* a kept copy of x (training: never frozen); a refusal is fine (the
	 * layer then prepares the op without it) */
	const struct cop keep = { .fl = F_BIAS, .s = &base, .extra = KILN_OPF_KEEP };
	tally_plans(&ty, plans_of(&keep, WINO, 0, 0, NULL), 0, "kept copy");
	printf("wino: rules: %d of %d prepares by wino.c\n", ty.pl.made, ty.pl.ops);
	fflush(stdout);
	tally_check(&ty, "rules");
}
END_TEST

/* x of c with element (n 0, h, w, channel 3) set to v. */
static float *poisoned(const struct cop *c, int64_t h, int64_t w, float v)
{
	const struct shape *s = c->s;
	float *x = filled(s->N * s->C * s->H * s->W, 1);
	x[conv_ref_at(1, s->C, s->H, s->W, 0, 3, h, w)] = v;
	return x;
}

/* A NaN or inf at x's pixel (h, w) of sample 0: the outputs whose 3x3
 * window covers it, every output channel, are NaN (a NaN: in the double
 * loop, NaN times a weight added to anything; a ReLU keeps it, max(0, v)
 * with the NaN kept, as conv_ref's v < 0 test) or not finite (an inf: the
 * double loop's inf times a weight is +-inf, or NaN for a zero weight;
 * Winograd's transforms may add +inf and -inf, NaN).  Other outputs of
 * sample 0 may be NaN too (a tile mixes 6x6 input pixels); sample 1 is the
 * double loop's within the bound. */
static void check_poison(const struct cop *c, int64_t h, int64_t w, float v, const char *what, struct tally *ty)
{
	const struct shape *s = c->s;
	float *x = poisoned(c, h, w, v);
	int64_t n, nr;
	int p;
	float *f = run_op(c, 2, WINO, 0, x, &n, &p);
	double *r = reference(c, x, &nr);
	ck_assert(n == nr);
	const int64_t OH = oh(c), OW = ow(c), per = OH * OW * s->O;
	int covered = 0;
	for (int64_t i = 0; i < OH; i++)
		for (int64_t j = 0; j < OW; j++) {
			if (h + s->ph - i < 0 || h + s->ph - i > 2 || w + s->pw - j < 0 || w + s->pw - j > 2)
				continue;
			covered++;
			for (int64_t o = 0; o < s->O; o++) {
				const float g = f[conv_ref_at(1, s->O, OH, OW, 0, o, i, j)];
				ck_assert_msg(isnan(v) ? isnan(g) : !isfinite(g),
					      "%s: y[0, %lld, %lld, %lld] = %g, want %s (wino plans %d)", what,
					      (long long)o, (long long)i, (long long)j, g,
					      isnan(v) ? "NaN" : "not finite", p);
			}
		}
	ck_assert_msg(covered > 0, "%s: no output covers the pixel", what);
	const double e = conv_ref_err(f + per, r + per, nr - per);
	ck_assert_msg(e < TOL, "%s: sample 1 off by %.3g of the rms", what, e);
	tally_plans(ty, p, avx512(), what);
	free(f), free(r), free(x);
}

START_TEST(test_nan)
{
	/* 9x9 outputs: three tile rows and columns, the last one output
	 * wide */
	static const struct shape s = { 2, 16, 9, 9, 16, 3, 3, 1, 1 };
	const struct cop relu = { .fl = F_BIAS | F_RELU | F_RES, .s = &s }, lin = { .fl = F_BIAS, .s = &s };
	struct tally ty = { 0 };
	check_poison(&relu, 4, 5, NAN, "NaN inside, ReLU and residual", &ty);
	check_poison(&lin, 8, 8, NAN, "NaN at the corner", &ty);
	check_poison(&relu, 0, 3, NAN, "NaN on the top row, ReLU and residual", &ty);
	check_poison(&lin, 4, 5, INFINITY, "inf inside", &ty);
	check_poison(&lin, 8, 0, -INFINITY, "-inf at the corner", &ty);
	tally_check(&ty, "nan");
}
END_TEST

/* A frozen bf16 conv of an inference plan with a bf16 bias (which conv.c's
 * oneDNN kernels refuse: lowp.c runs it as the f32 op on widened copies,
 * by wino.c) under the defaults, bf16_conv = auto: tune.c times its
 * candidates on scratch tensors (every value 0.25) before the first real
 * run.  The kept transform of the weights must be made again from the
 * real ones: before the fix it was made from the scratch weights and kept,
 * the output off by the order of its rms.  Checked against the double
 * loop on the bf16 values, beyond each element's own rounding to bf16
 * (2^-8 of it): the f32 bound. */
START_TEST(test_bf16_frozen)
{
	static const struct shape s = { 2, 16, 9, 9, 32, 3, 3, 1, 1 };
	const struct cop c = { .fl = F_BIAS | F_RELU, .s = &s, .bf16 = 1, .extra = KILN_OPF_FROZEN };
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, NULL, 0, &dev);
	struct kiln_op op;
	uint32_t sin[4];
	make_op(&c, &op, sin);
	void *plan, *stream, *ws = NULL, *din[3] = { NULL, NULL, NULL }, *dy;
	float *vals[3];
	size_t wsb = 0;
	int plans;
	ck_assert_msg(prepare(dev, &op, &plan, &wsb, &plans) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	for (int k = 0; k < 3; k++) {
		const int64_t ne = kiln_tensor_numel(&op.in[k]);
		vals[k] = filled(ne, sin[k]);
		ck_assert(kiln_device_alloc(dev, (size_t)ne * 2, &din[k]) == 0);
		for (int64_t i = 0; i < ne; i++) { /* the bf16 values, and the reference's */
			((uint16_t *)din[k])[i] = half_f32_bf16(vals[k][i]);
			vals[k][i] = half_bf16_f32(((uint16_t *)din[k])[i]);
		}
	}
	const int64_t n = kiln_tensor_numel(&op.out[0]);
	ck_assert(kiln_device_alloc(dev, (size_t)n * 2, &dy) == 0);
	if (wsb)
		ck_assert(kiln_device_alloc(dev, wsb, &ws) == 0);
	struct kiln_op_args a = { .in = { din[0], din[1], din[2] }, .out = { dy }, .workspace = ws,
				  .workspace_bytes = wsb };
	double worst = 0;
	for (int run = 0; run < 2; run++) {
		ck_assert_msg(kiln_device_run(dev, plan, &a, stream) == 0, "%s", kiln_last_error());
		ck_assert(kiln_device_stream_sync(dev, stream) == 0);
		const struct conv_ref g = { s.N, s.C, s.H, s.W, s.O, 3, 3, 1, 1, 1 };
		int64_t nr;
		double *ref = conv_ref_run(KILN_OP_CONV, &g, vals[0], vals[1], NULL, vals[2], 1, 0, NULL, NULL, &nr);
		ck_assert(nr == n);
		double ss = 0;
		for (int64_t i = 0; i < n; i++)
			ss += ref[i] * ref[i];
		const double rms = sqrt(ss / (double)n);
		for (int64_t i = 0; i < n; i++) {
			const double got = half_bf16_f32(((uint16_t *)dy)[i]);
			const double e = (fabs(got - ref[i]) - ldexp(fabs(ref[i]), -8)) / rms;
			if (!(e <= worst))
				worst = e;
		}
		free(ref);
	}
	printf("wino: bf16 frozen (bf16 bias, bf16_conv = auto): worst error %.3g of the rms beyond bf16's "
	       "rounding; %d wino plans\n", worst, plans);
	fflush(stdout);
	ck_assert_msg(worst <= TOL, "bf16 frozen conv: error %g of the rms beyond bf16's rounding (bound %g)", worst,
		      TOL);
	for (int k = 0; k < 3; k++) {
		kiln_device_free(dev, din[k]);
		free(vals[k]);
	}
	kiln_device_free(dev, dy);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	close_dev(dev, cfg, 0);
	/* on AVX-512 the widened op's timed candidate and the plan kept are
	 * wino.c's (the plan counts: one a candidate) */
	ck_assert_msg(!avx512() || plans >= 1, "bf16 frozen conv: %d wino plans on an AVX-512 CPU", plans);
}
END_TEST

/* A frozen plan's kept weights, made by its first run, are
 * plugins/cpu/hugepage.c's (session 47; before, the heap's, on 4 KiB
 * pages): wino.c's transformed U (36 C O floats: 5.06 MiB at 192 x 192
 * channels, two whole 2 MiB blocks) and, under KILN_CPU_WINO=0, oneDNN's
 * copy in its kernel's layout (dnn.c: 9 C O floats, 2.25 MiB at 256 x
 * 256, one block).  The run adds `want` bytes or more to the process's
 * mappings advised with MADV_HUGEPAGE (VmFlags hg; every device buffer
 * made before it), and closing the device unmaps them (the advised bytes
 * back to what they were before it opened).  Not checked (said so)
 * without AVX-512 (no wino plan), without THP, or in an AddressSanitizer
 * build (no mapping of hugepage.c's own). */
static void kept_huge(const char *what, int off, int64_t ch, size_t want)
{
	if (!avx512() || !smaps_thp() || SMAPS_ASAN) {
		printf("%s: kept weights on huge pages not checked (%s)\n", what,
		       SMAPS_ASAN ? "an AddressSanitizer build" : !avx512() ? "no AVX-512" : "no THP");
		return;
	}
	const struct shape s = { 1, ch, 8, 8, ch, 3, 3, 1, 1 };
	const struct cop c = { .fl = F_BIAS, .s = &s, .extra = KILN_OPF_FROZEN };
	const size_t before_open = smaps_hg_bytes();
	size_t hg[2];
	int64_t n;
	int plans = 0;
	free(run_op_hg(&c, 1, off ? NULL : WINO, off, NULL, &n, &plans, hg));
	const size_t before_run = hg[0], after_run = hg[1], after_close = smaps_hg_bytes();
	printf("%s: advised bytes %zu before the device, %zu before the run, %zu after it, %zu after the "
	       "close\n",
	       what, before_open, before_run, after_run, after_close);
	fflush(stdout);
	ck_assert_msg(off ? plans == 0 : plans >= 1, "%s: %d wino plans", what, plans);
	ck_assert_msg(after_run >= before_run + want, "%s: the run's kept weights added %zd advised bytes, not %zu",
		      what, (ssize_t)(after_run - before_run), want);
	ck_assert_msg(after_close <= before_open, "%s: %zu advised bytes still mapped after the close (%zu before)",
		      what, after_close, before_open);
}

START_TEST(test_kept_huge)
{
	kept_huge("wino: frozen 192 x 192, U", 0, 192, (size_t)4 << 20);
	kept_huge("oneDNN (KILN_CPU_WINO=0): frozen 256 x 256, the kernel's layout", 1, 256, (size_t)2 << 20);
}
END_TEST

/* CONV_BWD_DATA of shape s (x the forward's: dx [N, C, H, W] from dy [N,
 * O, OH, OW] and w): dx on a cpu device (threads; conv_algo ov, or
 * KILN_CPU_WINO=0 when off), malloc'ed, *n its elements, *plans the wino
 * plans. */
static float *run_bwd(const struct shape *s, int threads, const char *ov, int off, int64_t *n, int *plans)
{
	const struct conv_ref g = { s->N, s->C, s->H, s->W, s->O, 3, 3, s->ph, s->pw, 1 };
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(threads, ov, off, &dev);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV_BWD_DATA, op.n_in = 2, op.n_out = 1;
	op.in[0] = test_desc4(KILN_F32, s->N, s->O, conv_ref_oh(&g), conv_ref_ow(&g), KILN_NHWC);
	op.in[1] = test_desc4(KILN_F32, s->O, s->C, 3, 3, KILN_NCHW);
	op.out[0] = test_desc4(KILN_F32, s->N, s->C, s->H, s->W, KILN_NHWC);
	op.i[0] = op.i[1] = op.i[4] = op.i[5] = op.i[6] = 1;
	op.i[2] = s->ph, op.i[3] = s->pw;
	void *plan, *stream, *ws = NULL, *din[2], *dx;
	size_t wsb = 0;
	ck_assert_msg(prepare(dev, &op, &plan, &wsb, plans) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	for (int k = 0; k < 2; k++) {
		const int64_t ne = kiln_tensor_numel(&op.in[k]);
		float *v = filled(ne, k ? 2 : 3); /* dy (3), w (2) */
		din[k] = upload(dev, v, ne);
		free(v);
	}
	*n = kiln_tensor_numel(&op.out[0]);
	float *x0 = filled(*n, 5);
	dx = upload(dev, x0, *n);
	free(x0);
	if (wsb)
		ck_assert(kiln_device_alloc(dev, wsb, &ws) == 0);
	struct kiln_op_args a = { .in = { din[0], din[1] }, .out = { dx }, .workspace = ws, .workspace_bytes = wsb };
	ck_assert_msg(kiln_device_run(dev, plan, &a, stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	float *out = malloc((size_t)*n * sizeof *out);
	ck_assert(out);
	memcpy(out, dx, (size_t)*n * sizeof *out);
	kiln_device_free(dev, din[0]), kiln_device_free(dev, din[1]), kiln_device_free(dev, dx);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	close_dev(dev, cfg, off);
	return out;
}

/* The data gradient (conv_algo = winograd: training's layers, issue 23's
 * kernel serving the backward too) of every shape against the double
 * loop; the same bytes on 1 and 2 threads; none of it under rule (not
 * frozen: a training plan's) or with KILN_CPU_WINO=0. */
START_TEST(test_bwd_data)
{
	struct tally ty = { 0 };
	double worst = 0;
	for (int si = 0; si < N_SHAPES; si++) {
		const struct shape *s = &shapes[si];
		const struct conv_ref g = { s->N, s->C, s->H, s->W, s->O, 3, 3, s->ph, s->pw, 1 };
		int64_t n, nr, n1;
		int p, p1;
		float *got = run_bwd(s, 2, WINO, 0, &n, &p);
		float *dy = filled(s->N * s->O * conv_ref_oh(&g) * conv_ref_ow(&g), 3), *w = filled(s->O * s->C * 9, 2);
		double *ref = conv_ref_run(KILN_OP_CONV_BWD_DATA, &g, NULL, w, dy, NULL, 0, 0, NULL, NULL, &nr);
		ck_assert(nr == n);
		const double e = conv_ref_err(got, ref, n);
		printf("wino: data gradient %s: worst error %.3g of the rms\n", shape_names[si], e);
		ck_assert_msg(e <= TOL, "data gradient %s: error %g of the rms (bound %g)", shape_names[si], e, TOL);
		worst = maxd(worst, e);
		char what[160];
		snprintf(what, sizeof what, "data gradient %s, winograd", shape_names[si]);
		tally_plans(&ty, p, avx512(), what);
		if (si == 1 || si == 8) { /* several blocks: the same bytes on one thread */
			float *one = run_bwd(s, 1, WINO, 0, &n1, &p1);
			ck_assert_msg(!avx512() || !memcmp(one, got, (size_t)n * sizeof *got),
				      "data gradient %s: other bytes on 1 and 2 threads", shape_names[si]);
			free(one);
		}
		free(got), free(dy), free(w), free(ref);
	}
	const struct shape *s = &shapes[0];
	int64_t n;
	int p;
	free(run_bwd(s, 2, NULL, 0, &n, &p));
	tally_plans(&ty, p, 0, "data gradient, conv_algo = rule (default)");
	free(run_bwd(s, 2, WINO, 1, &n, &p));
	tally_plans(&ty, p, 0, "data gradient, winograd, KILN_CPU_WINO=0");
	printf("wino: data gradient: worst error %.3g of the rms; %d of %d prepares by wino.c\n", worst, ty.pl.made,
	       ty.pl.ops);
	fflush(stdout);
	tally_check(&ty, "bwd_data");
}
END_TEST

static Suite *make_cpu_wino_suite(void)
{
	Suite *s = suite_create("cpu_wino");
	check_add_case(s, "f32", 120, NULL, NULL, (const TTest *[]){ test_forward, test_threads, test_bwd_data, NULL });
	check_add_case(s, "choice", 60, NULL, NULL, (const TTest *[]){ test_rules, NULL });
	check_add_case(s, "edges", 60, NULL, NULL, (const TTest *[]){ test_nan, test_bf16_frozen, test_kept_huge, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_wino_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
