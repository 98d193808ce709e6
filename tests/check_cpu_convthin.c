/* tests/check_cpu_convthin.c - the CPU device's direct convolution for few
 * input channels (plugins/cpu/convthin.c: AVX-512, a network's first
 * layer such as the Fashion-MNIST CNN's conv1, 1 -> 32 channels, 5x5):
 * CONV (bias, fused ReLU) and CONV_BWD_WEIGHTS (bias gradient,
 * accumulation), f32 and bf16, against a double-precision loop and
 * against oneDNN (the same op with KILN_CPU_CONVTHIN=0), on 1 to 4 input
 * channels, kernels 1x1 to 7x7 (3x5 and 5x3 too), padding 0..3 (more than
 * the kernel's reach too), odd sizes and rows wider than 32 (several
 * 16-wide vectors and a masked tail), output channels not a multiple of
 * 16, even kernels and 21-tap weight gradients (3x7, 7x3), batches 1..5
 * and 16; the same bytes on 1, 2 and 4 threads; a weight gradient's lanes
 * past a row's last output adding nothing even where x is inf there
 * (test_inf_tail: an unmasked tail gave NaN for taps that never meet it);
 * NHWC f32 with one input channel (a mixed stem's conv1); bf16 by
 * AVX512_BF16's dot products (within the bounds below; the same bytes on
 * 1 and 2 threads) and in f32 arithmetic (KILN_CPU_CONVTHIN=f32, and a CPU
 * without AVX512_BF16: the bytes of the f32 op on the widened tensors, the
 * forward's rounded once); which ops it takes (one "(convthin.c)" plan
 * each on a CPU with AVX-512F, BW and VL, none with KILN_CPU_CONVTHIN=0 or
 * without them; under conv_algo = fft the FFT) and which it leaves to
 * oneDNN (5 channels, stride, dilation, groups, NHWC of several channels
 * or bf16, the data gradient, kept copies (refused: KILN_ENOTSUP), a
 * residual epilogue, an 8x8 or 1x9 kernel, a weight gradient of more than
 * 25 taps, bf16_conv = bf16).
 *
 * The plan counts are checked last in each test, after every result: a
 * build or a CPU where oneDNN computes the ops still has them checked
 * against the double loop.  The bytes that only convthin promises (1 and
 * 2 threads, bf16 against f32) are compared where convthin made the
 * plans.
 *
 * Tolerance: the error is measured as max |got - ref| / rms(ref) over the
 * tensor.  f32: a sum of n products in f32 is off by about eps sqrt(n)
 * of its scale (eps = 6e-8) summed in one line, less in blocks or pairs;
 * the forward's sums have C KH KW <= 196 terms, the weight gradient's
 * N OH OW up to 12544 (conv1 at batch 16).  Measured on these shapes by
 * oneDNN (AMD EPYC, AVX-512, before convthin): 1.9e-6 for the forward;
 * 1.1e-5 for the weight gradient of conv1 at batch 16 on one thread (its
 * 12544-term sums in one line; 2.2e-6 on two), 5.3e-6 elsewhere.  The
 * bound, 2e-5, is check_cpu_fftconv's: 10x the forward's, 1.8x that one
 * weight gradient's, and far below what a wrong tap, shift, border or
 * channel gives (order 1).  bf16: the inputs are bf16 values (f32 hashes
 * rounded first), so every product is exact in f32 and the weight
 * gradient (f32 dw, db) has the f32 bound (measured 2.4e-6).  The
 * forward's y is rounded once to bf16, which moves a value by up to 2^-8
 * of itself (half a unit of an 8-bit significand); here max |y| is up to
 * 5x the rms, so rounding alone is off by up to 1.9e-2 of the rms (conv1
 * at batch 16), and a bound on the rms would be loose for most elements:
 * the error beyond each element's own rounding, max (|got - ref| - 2^-8
 * |ref|) / rms(ref) (rel_err_bf16), has the f32 bound (measured 4e-8).
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
#include "../plugins/common/half.h" /* half_f32_bf16, half_bf16_f32: the device's rounding */

static struct kiln_registry *reg;

#define TOL 2e-5

struct shape {
	int64_t N, C, H, W, O, KH, KW, ph, pw;
};
static const struct shape shapes[] = {
	/* the CNN's conv1, at batch 2 and 16 */
	{ 2, 1, 28, 28, 32, 5, 5, 2, 2 },  { 16, 1, 28, 28, 32, 5, 5, 2, 2 },
	{ 2, 3, 7, 9, 7, 3, 3, 1, 1 },     { 1, 4, 5, 5, 3, 7, 7, 3, 3 },
	{ 3, 2, 13, 11, 20, 3, 5, 1, 2 },  { 1, 4, 13, 11, 37, 5, 3, 0, 1 },
	/* padding beyond the kernel's reach: border rows and columns of
	 * the bias alone */
	{ 5, 2, 5, 5, 7, 3, 3, 3, 3 },     { 2, 1, 5, 5, 7, 1, 1, 1, 1 },
	{ 4, 3, 9, 7, 32, 1, 1, 0, 0 },    { 1, 2, 8, 8, 16, 7, 7, 0, 0 },
	/* rows of 37, 35 and 29 outputs: 16-wide vectors and a masked tail */
	{ 1, 1, 40, 37, 20, 3, 3, 1, 1 },  { 2, 3, 40, 37, 3, 7, 7, 3, 2 },
	{ 3, 4, 12, 33, 7, 5, 5, 2, 0 },
	/* even kernels (2x4, 6x4: the forward's pairs of tap rows with no
	 * single row left), a 3x7 and a 7x3 weight gradient (21 taps: its
	 * registers), padding wider than the kernel with one output channel */
	{ 2, 2, 9, 10, 5, 2, 4, 1, 0 },    { 1, 1, 10, 21, 3, 3, 7, 1, 3 },
	{ 1, 3, 12, 9, 6, 7, 3, 3, 1 },    { 1, 1, 6, 6, 1, 6, 4, 2, 2 },
};
#define N_SHAPES ((int)(sizeof shapes / sizeof *shapes))

/* the shapes the bf16 tests run: conv1 at both batches, 3 and 4
 * channels, the masked tail, an even kernel, a 3x7 */
static const int bf16_shapes[] = { 0, 1, 2, 3, 5, 11, 13, 14 };
#define N_BF16 ((int)(sizeof bf16_shapes / sizeof *bf16_shapes))

enum { F_BIAS = 1, F_RELU = 2, F_ACC = 4 };

/* One op as the test builds it.  stride, dil, groups 0 mean 1; exact: the
 * inputs are bf16 values (the bf16 op and its f32 twin); extra: flags
 * beyond fl's (KILN_OPF_KEEP, KILN_OPF_RESIDUAL: prepared only). */
struct cop {
	int t, fl;
	const struct shape *s;
	int bf16, bias16, exact, nhwc, stride, dil, groups, extra;
};

/* Whether convthin.c should take an eligible op on this CPU. */
static int avx512(void) { return conv_ref_avx512(); }

/* Whether convthin.c's bf16 runs by AVX512_BF16's dot products here
 * (else in f32 arithmetic on the widened tensors, the f32 op's bytes). */
static int bf16_dots(void) { return avx512() && __builtin_cpu_supports("avx512bf16"); }

static int64_t one(int v) { return v ? v : 1; }

static int64_t oh(const struct cop *c) { return conv_ref_osize(c->s->H, c->s->ph, c->s->KH, c->dil, c->stride); }
static int64_t ow(const struct cop *c) { return conv_ref_osize(c->s->W, c->s->pw, c->s->KW, c->dil, c->stride); }

/* The values of tensor salt: x (1), w (2), dy (3), b (4); initial outputs
 * (5, 6).  exact: rounded to bf16 values, so that a bf16 tensor holds
 * them as they are. */
static float *filled(int64_t n, uint32_t salt, int exact)
{
	float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
	ck_assert(p);
	for (int64_t i = 0; i < n; i++) {
		p[i] = test_hash_val((uint32_t)i, salt);
		if (exact)
			p[i] = half_bf16_f32(half_f32_bf16(p[i]));
	}
	return p;
}

/* c's op in *op; the salts of its inputs in sin[], its outputs' element
 * counts in nout[] (out0, out1; 0 where none). */
static void make_op(const struct cop *c, struct kiln_op *op, uint32_t sin[3], int64_t nout[2])
{
	const struct shape *s = c->s;
	const int lay = c->nhwc ? KILN_NHWC : KILN_NCHW, adt = c->bf16 ? KILN_BF16 : KILN_F32;
	const int64_t g = one(c->groups);
	const struct kiln_tensor_desc x = test_desc4(adt, s->N, s->C, s->H, s->W, lay),
				      y = test_desc4(adt, s->N, s->O, oh(c), ow(c), lay),
				      w = test_desc4(adt, s->O, s->C / g, s->KH, s->KW, KILN_NCHW),
				      dw = test_desc4(KILN_F32, s->O, s->C / g, s->KH, s->KW, KILN_NCHW);
	struct kiln_tensor_desc b;
	const int64_t bd[1] = { s->O };
	kiln_tensor_desc_init(&b, c->bias16 ? KILN_BF16 : KILN_F32, 1, bd);
	memset(op, 0, sizeof *op);
	op->type = c->t;
	op->flags = c->extra;
	op->i[0] = op->i[1] = one(c->stride);
	op->i[2] = s->ph, op->i[3] = s->pw;
	op->i[4] = op->i[5] = one(c->dil);
	op->i[6] = g;
	const int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->O * oh(c) * ow(c),
		      nw = s->O * (s->C / g) * s->KH * s->KW;
	nout[1] = 0;
	if (c->t == KILN_OP_CONV) {
		op->n_in = c->fl & F_BIAS ? 3 : 2, op->n_out = 1;
		op->in[0] = x, op->in[1] = w, op->in[2] = b, op->out[0] = y;
		sin[0] = 1, sin[1] = 2, sin[2] = 4;
		nout[0] = ny;
		if (c->fl & F_RELU) {
			op->flags |= KILN_OPF_ACT;
			op->i[KILN_OPI_ACT] = KILN_ACT_RELU;
		}
	} else if (c->t == KILN_OP_CONV_BWD_DATA) {
		op->n_in = 2, op->n_out = 1;
		op->in[0] = y, op->in[1] = w, op->out[0] = x;
		sin[0] = 3, sin[1] = 2;
		nout[0] = nx;
	} else {
		kiln_tensor_desc_init(&b, KILN_F32, 1, bd); /* db is f32 */
		op->n_in = 2, op->n_out = c->fl & F_BIAS ? 2 : 1;
		op->in[0] = x, op->in[1] = y, op->out[0] = dw, op->out[1] = b;
		sin[0] = 1, sin[1] = 3;
		nout[0] = nw, nout[1] = c->fl & F_BIAS ? s->O : 0;
		if (c->fl & F_ACC)
			op->flags |= KILN_OPF_ACCUMULATE;
	}
	if (c->extra & KILN_OPF_RESIDUAL) /* r, as y */
		op->in[op->n_in++] = y;
}

/* A cpu device on `threads` threads with the override ov (or none); off:
 * KILN_CPU_CONVTHIN=0 in the environment (2: =f32, its bf16 in f32
 * arithmetic), which the caller unsets after closing the device. */
static struct kiln_config *open_dev(int threads, const char *ov, int off, struct kiln_device **dev)
{
	return conv_dev_open(reg, threads, ov, off ? "KILN_CPU_CONVTHIN" : NULL, off == 2 ? "f32" : "0", dev);
}

/* Prepares op on dev, counting its convthin plans into *plans: the
 * status. */
static int prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan, size_t *wsb, int *plans)
{
	return conv_dev_prepare(dev, op, plan, wsb, "(convthin.c)", plans);
}

/* A device buffer holding vals (n elements) in dtype dt. */
static void *upload(struct kiln_device *dev, int dt, const float *vals, int64_t n)
{
	void *d;
	ck_assert(kiln_device_alloc(dev, (size_t)(n ? n : 1) * 4, &d) == 0);
	if (dt == KILN_BF16)
		for (int64_t i = 0; i < n; i++)
			((uint16_t *)d)[i] = half_f32_bf16(vals[i]);
	else
		memcpy(d, vals, (size_t)n * 4);
	return d;
}

/* Runs c on a cpu device (threads; override ov or none; off:
 * KILN_CPU_CONVTHIN=0); returns out0 followed by out1 (db) when there is
 * one, as f32 (a bf16 y widened), malloc'ed; *n their element count;
 * *plans the convthin plans its prepare made. */
static float *run_op(const struct cop *c, int threads, const char *ov, int off, int64_t *n,
		     int *plans)
{
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(threads, ov, off, &dev);
	struct kiln_op op;
	uint32_t sin[3];
	int64_t nout[2];
	make_op(c, &op, sin, nout);
	void *plan, *stream, *ws = NULL, *din[3] = { NULL, NULL, NULL }, *dout[2] = { NULL, NULL };
	size_t wsb = 0;
	const int pst = prepare(dev, &op, &plan, &wsb, plans);
	ck_assert_msg(pst == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	for (int k = 0; k < op.n_in; k++) {
		const int64_t ne = kiln_tensor_numel(&op.in[k]);
		float *v = filled(ne, sin[k], c->exact);
		din[k] = upload(dev, op.in[k].dtype, v, ne);
		free(v);
	}
	for (int k = 0; k < op.n_out; k++) {
		float *v = filled(nout[k], (uint32_t)(5 + k), 0);
		dout[k] = upload(dev, op.out[k].dtype, v, nout[k]);
		free(v);
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
	for (int k = 0, o = 0; k < op.n_out; o += (int)nout[k], k++)
		for (int64_t i = 0; i < nout[k]; i++)
			out[o + i] = op.out[k].dtype == KILN_BF16 ? half_bf16_f32(((uint16_t *)dout[k])[i])
								   : ((float *)dout[k])[i];
	for (int k = 0; k < 3; k++)
		kiln_device_free(dev, din[k]);
	kiln_device_free(dev, dout[0]);
	kiln_device_free(dev, dout[1]);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	unsetenv("KILN_CPU_CONVTHIN");
	return out;
}

/* The double-precision result of c (stride, dilation and groups 1) on
 * run_op's inputs. */
static double *reference(const struct cop *c, int64_t *n)
{
	const struct shape *s = c->s;
	ck_assert(one(c->stride) == 1 && one(c->dil) == 1 && one(c->groups) == 1);
	const struct conv_ref g = { s->N, s->C, s->H, s->W, s->O, s->KH, s->KW, s->ph, s->pw, c->nhwc };
	const int64_t nx = s->N * s->C * s->H * s->W, ny = s->N * s->O * oh(c) * ow(c),
		      nw = s->O * s->C * s->KH * s->KW;
	float *x = filled(nx, 1, c->exact), *w = filled(nw, 2, c->exact),
	      *dy = filled(ny, 3, c->exact), *b = filled(s->O, 4, c->exact);
	float *dw0 = filled(nw, 5, 0), *db0 = filled(s->O, 6, 0);
	const int acc = c->t == KILN_OP_CONV_BWD_WEIGHTS && (c->fl & F_ACC);
	double *r = conv_ref_run(c->t, &g, x, w, dy, c->fl & F_BIAS ? b : NULL, (c->fl & F_RELU) != 0,
				 (c->fl & F_BIAS) != 0, acc ? dw0 : NULL, acc ? db0 : NULL, n);
	free(x), free(w), free(dy), free(b), free(dw0), free(db0);
	return r;
}

/* max |got - ref| / rms(ref) */
static double rel_err(const float *got, const double *ref, int64_t n) { return conv_ref_err(got, ref, n); }

/* The same beyond a bf16 rounding of each element, max (|got - ref| -
 * 2^-8 |ref|) / rms(ref): a bf16 y rounded once from an f32 sum within
 * e of the rms gives at most e (rounding to nearest moves a value by at
 * most half a unit of its 8-bit significand, 2^-8 of itself). */
static double rel_err_bf16(const float *got, const double *ref, int64_t n)
{
	double ss = 0, worst = 0;
	for (int64_t i = 0; i < n; i++)
		ss += ref[i] * ref[i];
	const double rms = sqrt(ss / (double)n) + 1e-300;
	for (int64_t i = 0; i < n; i++) {
		const double d = fabs((double)got[i] - ref[i]) - fabs(ref[i]) / 256;
		if (!(d <= worst))
			worst = d;
	}
	return worst / rms;
}

/* rel_err against another float result (oneDNN's) */
static double rel_err_f(const float *got, const float *ref, int64_t n)
{
	double *r = malloc((size_t)n * sizeof *r);
	ck_assert(r);
	for (int64_t i = 0; i < n; i++)
		r[i] = ref[i];
	const double e = rel_err(got, r, n);
	free(r);
	return e;
}

static const char *op_str(int t)
{
	return t == KILN_OP_CONV ? "CONV" : t == KILN_OP_CONV_BWD_DATA ? "CONV_BWD_DATA" : "CONV_BWD_WEIGHTS";
}

static double maxd(double a, double b) { return a > b ? a : b; }

/* What one test measured, and the plan counts that were not the expected
 * ones (checked last: tally_check). */
struct tally {
	double ref, onednn, vs_onednn; /* worst errors: convthin's, oneDNN's, between them */
	double plain;                  /* a bf16 y's: rel_err (ref: rel_err_bf16) */
	struct conv_plans pl;          /* convthin's plans */
};

/* Records `plans` made by an op described by what, where want were
 * expected. */
static void tally_plans(struct tally *ty, int plans, int want, const char *what)
{
	conv_plans_add(&ty->pl, plans, want, what, "convthin");
}

static void tally_check(const struct tally *ty, const char *test) { conv_plans_check(&ty->pl, test, "convthin"); }

/* The convthin plans op c makes on this CPU: one, or none without
 * AVX-512F, BW and VL and for a weight gradient of more than 25 taps a
 * channel (its accumulators are registers). */
static int want_thin(const struct cop *c)
{
	return avx512() && (c->t != KILN_OP_CONV_BWD_WEIGHTS || c->s->KH * c->s->KW <= 25) &&
	       (!c->nhwc || (c->s->C == 1 && !c->bf16));
}

/* f32 op c on 1 and 2 threads and by oneDNN against the double loop and
 * each other; convthin's bytes on 1 and 2 threads equal. */
static void check_f32(const struct cop *c, int si, struct tally *ty)
{
	int64_t n1, n2, nd, nr;
	int p1, p2, p0;
	char what[160];
	snprintf(what, sizeof what, "%s flags %d shape %d%s", op_str(c->t), c->fl, si, c->nhwc ? " NHWC" : "");
	float *f1 = run_op(c, 1, NULL, 0, &n1, &p1);
	float *f2 = run_op(c, 2, NULL, 0, &n2, &p2);
	int64_t n4;
	int p4;
	float *f4 = run_op(c, 4, NULL, 0, &n4, &p4); /* more threads than cores */
	float *d = run_op(c, 2, "plugin.cpu.conv_algo=direct", 1, &nd, &p0);
	double *r = reference(c, &nr);
	ck_assert(n1 == nr && n2 == nr && nd == nr);
	const double e1 = rel_err(f1, r, nr), e2 = rel_err(f2, r, nr), ed = rel_err(d, r, nr),
		     ex = rel_err_f(f2, d, nr);
	ck_assert_msg(e1 < TOL && e2 < TOL && ed < TOL && ex < TOL,
		      "%s: off by %.3g (1 thread), %.3g (2) of the rms; oneDNN %.3g, the two apart %.3g",
		      what, e1, e2, ed, ex);
	ck_assert(n4 == nr);
	if (p1 == 1 && p2 == 1)
		ck_assert_msg(!memcmp(f1, f2, (size_t)nr * sizeof *f1),
			      "%s: other bytes on 1 and 2 threads", what);
	if (p1 == 1 && p4 == 1)
		ck_assert_msg(!memcmp(f1, f4, (size_t)nr * sizeof *f1),
			      "%s: other bytes on 1 and 4 threads", what);
	ty->ref = maxd(ty->ref, maxd(e1, e2)), ty->onednn = maxd(ty->onednn, ed);
	ty->vs_onednn = maxd(ty->vs_onednn, ex);
	tally_plans(ty, p1, want_thin(c), what);
	tally_plans(ty, p2, want_thin(c), what);
	tally_plans(ty, p0, 0, "KILN_CPU_CONVTHIN=0");
	free(f1), free(f2), free(f4), free(d), free(r);
}

/* Op type t with flags fls[0..nf) on every shape, f32. */
static void check_type_f32(int t, const int *fls, int nf)
{
	struct tally ty = { 0 };
	for (int k = 0; k < nf; k++)
		for (int si = 0; si < N_SHAPES; si++)
			for (int nhwc = 0; nhwc < 2; nhwc++) {
				/* NHWC: one input channel (an NHWC model's first
				 * layer, or an NCHW one's mixed stem); others are
				 * oneDNN's, checked by test_ineligible */
				if (nhwc && shapes[si].C != 1)
					continue;
				const struct cop c = { .t = t, .fl = fls[k], .s = &shapes[si], .nhwc = nhwc };
				check_f32(&c, si, &ty);
			}
	printf("convthin: %s f32: worst error %.3g of the rms (oneDNN %.3g, the two apart %.3g); %d of %d prepares by convthin.c\n",
	       op_str(t), ty.ref, ty.onednn, ty.vs_onednn, ty.pl.made, ty.pl.ops);
	fflush(stdout); /* before a failed check ends the test's process */
	tally_check(&ty, op_str(t));
}

START_TEST(test_forward)
{
	static const int fls[] = { 0, F_BIAS, F_BIAS | F_RELU, F_RELU };
	check_type_f32(KILN_OP_CONV, fls, 4);
}
END_TEST

START_TEST(test_bwd_weights)
{
	static const int fls[] = { 0, F_BIAS, F_BIAS | F_ACC, F_ACC };
	check_type_f32(KILN_OP_CONV_BWD_WEIGHTS, fls, 4);
}
END_TEST

/* Whether conv_algo = fft opens (the plugin has FFTW). */
static int have_fftw(void)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	ck_assert(kiln_config_new(&cfg) == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.conv_algo=fft") == 0);
	ck_assert(kiln_config_override(cfg, "plugin.cpu.tune_cache=none") == 0);
	const int ok = kiln_device_open(reg, cfg, "cpu", 0, &dev) == 0;
	if (ok)
		kiln_device_close(dev);
	kiln_config_free(cfg);
	return ok;
}

/* [plugin.cpu] conv_algo and convthin.c: it is the direct kernel, so
 * `rule` (whose FFT wants 16 input channels) and `direct` take it, `fft`
 * the FFT where it can run the op (every op here), `auto` the faster of
 * FFT and convthin.c; each within the bound of the double loop. */
START_TEST(test_conv_algo)
{
	static const char *const algo[] = { "plugin.cpu.conv_algo=rule", "plugin.cpu.conv_algo=direct",
					    "plugin.cpu.conv_algo=auto", "plugin.cpu.conv_algo=fft" };
	static const int types[] = { KILN_OP_CONV, KILN_OP_CONV_BWD_WEIGHTS };
	static const int sis[] = { 0, 3, 11 };
	const int fft = have_fftw();
	struct tally ty = { 0 };
	for (int a = 0; a < 4 - !fft; a++)
		for (int k = 0; k < 2; k++)
			for (int j = 0; j < 3; j++) {
				const struct cop c = { .t = types[k], .fl = F_BIAS, .s = &shapes[sis[j]] };
				int64_t n, nr;
				int p;
				char what[160];
				snprintf(what, sizeof what, "%s shape %d %s", op_str(c.t), sis[j], algo[a]);
				float *f = run_op(&c, 2, algo[a], 0, &n, &p);
				double *r = reference(&c, &nr);
				ck_assert(n == nr);
				const double e = rel_err(f, r, n);
				ck_assert_msg(e < TOL, "%s: off by %.3g of the rms", what, e);
				ty.ref = maxd(ty.ref, e);
				/* rule and direct: convthin.c as the direct kernel;
				 * fft: the FFT, which takes every op here; auto: the
				 * faster of the two, timed (either) */
				if (a < 2)
					tally_plans(&ty, p, want_thin(&c), what);
				else if (a == 3)
					tally_plans(&ty, p, 0, what);
				free(f), free(r);
			}
	printf("convthin: conv_algo rule, direct, auto%s: worst error %.3g of the rms; %d of %d prepares by convthin.c\n",
	       fft ? ", fft" : " (no FFTW: not fft)", ty.ref, ty.pl.made, ty.pl.ops);
	fflush(stdout);
	tally_check(&ty, "conv_algo");
}
END_TEST

/* f32 b equals a's values rounded to bf16 nearest even (widened: b is a
 * widened bf16 tensor). */
static int rounded_equal(const float *a, const float *b, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		const float r = half_bf16_f32(half_f32_bf16(a[i]));
		if (memcmp(&r, &b[i], 4))
			return 0;
	}
	return 1;
}

/* bf16 op c (bf16_conv = auto and f32) against the f32 op on the same
 * values (its twin: exact f32 inputs) byte for byte where convthin made
 * both plans, and against the double loop; oneDNN's (KILN_CPU_CONVTHIN=0,
 * and bf16_conv = bf16, which convthin leaves to it) within the same
 * bound. */
static void check_bf16(const struct cop *c, int si, struct tally *ty)
{
	/* convthin's under auto and f32; oneDNN's f32 kernel (convthin off:
	 * no timing) and its bf16 one */
	static const char *const ov[5] = { NULL, "plugin.cpu.bf16_conv=f32",
					   "plugin.cpu.bf16_conv=f32", "plugin.cpu.bf16_conv=bf16", NULL };
	/* run 4: auto with KILN_CPU_CONVTHIN=f32, convthin's bf16 in f32
	 * arithmetic (what a CPU without AVX512_BF16 runs) */
	static const int off[5] = { 0, 0, 1, 0, 2 };
	struct cop twin = *c;
	twin.bf16 = twin.bias16 = 0;
	int64_t n[5], ng, nr, n1;
	int p[5], pg, p1;
	char what[160];
	snprintf(what, sizeof what, "bf16 %s flags %d%s shape %d", op_str(c->t), c->fl,
		 c->bias16 ? " (bf16 bias)" : "", si);
	float *g = run_op(&twin, 2, NULL, 0, &ng, &pg), *f[5];
	for (int k = 0; k < 5; k++)
		f[k] = run_op(c, 2, ov[k], off[k], &n[k], &p[k]);
	float *f1 = run_op(c, 1, NULL, 0, &n1, &p1); /* auto on one thread */
	double *r = reference(c, &nr);
	const int fwd = c->t == KILN_OP_CONV;
	ck_assert(n1 == nr);
	if (p1 == 1 && p[0] == 1)
		ck_assert_msg(!memcmp(f1, f[0], (size_t)nr * sizeof *f1), "%s: other bytes on 1 and 2 threads",
			      what);
	for (int k = 0; k < 5; k++) {
		ck_assert(n[k] == nr && ng == nr);
		const double e = fwd ? rel_err_bf16(f[k], r, nr) : rel_err(f[k], r, nr),
			     plain = rel_err(f[k], r, nr);
		ck_assert_msg(e < TOL, "%s (%s%s): off by %.3g of the rms%s (%.3g in all)", what,
			      ov[k] ? ov[k] : "bf16_conv=auto",
			      off[k] == 1 ? ", KILN_CPU_CONVTHIN=0" : off[k] == 2 ? ", KILN_CPU_CONVTHIN=f32" : "",
			      e, fwd ? " beyond y's rounding" : "", plain);
		if (k < 2 || k == 4)
			ty->ref = maxd(ty->ref, e), ty->plain = maxd(ty->plain, plain);
		else
			ty->onednn = maxd(ty->onednn, e);
		/* the f32 op's bytes, rounded once (forward) or as they are:
		 * convthin's bf16 in f32 arithmetic (KILN_CPU_CONVTHIN=f32;
		 * auto on a CPU without AVX512_BF16), not its dot products
		 * (other sums) */
		const int f32_arith = k == 4 || (k == 0 && !bf16_dots());
		if (f32_arith && p[k] == 1 && pg == 1)
			ck_assert_msg(fwd ? rounded_equal(g, f[k], nr)
					  : !memcmp(g, f[k], (size_t)nr * sizeof *g),
				      "%s (%s): not the f32 op's bytes%s", what,
				      ov[k] ? ov[k] : "bf16_conv=auto", fwd ? " rounded" : "");
	}
	/* the f32 twin against the double loop, and its plan */
	const double eg = rel_err(g, r, nr);
	ck_assert_msg(eg < TOL, "%s: its f32 twin off by %.3g of the rms", what, eg);
	tally_plans(ty, pg, want_thin(c), what);
	tally_plans(ty, p[0], want_thin(c), what);
	tally_plans(ty, p1, want_thin(c), what);
	/* (bf16_conv = f32, p[1]: oneDNN's f32 kernel between its reorders,
	 * or, where it refuses the op (a bf16 bias), lowp.c's f32 op on
	 * widened copies, convthin's: its results are checked above, its
	 * plan is either) */
	tally_plans(ty, p[2], 0, "KILN_CPU_CONVTHIN=0");
	if (!c->bias16) /* (a bf16 bias: oneDNN refuses, lowp.c's f32 op runs, as p[1]) */
		tally_plans(ty, p[3], 0, "bf16_conv=bf16");
	tally_plans(ty, p[4], want_thin(c), "KILN_CPU_CONVTHIN=f32");
	for (int k = 0; k < 5; k++)
		free(f[k]);
	free(f1);
	free(g), free(r);
}

/* Op type t with flags fls[0..nf) on the bf16 shapes, the bias bf16 too
 * where bias16; the plan counts into ty, checked by the caller. */
static void check_type_bf16(int t, const int *fls, int nf, int bias16, struct tally *ty)
{
	for (int k = 0; k < nf; k++)
		for (int j = 0; j < N_BF16; j++) {
			const struct cop c = { .t = t, .fl = fls[k], .s = &shapes[bf16_shapes[j]],
					       .bf16 = 1, .exact = 1,
					       .bias16 = bias16 && (fls[k] & F_BIAS) };
			check_bf16(&c, bf16_shapes[j], ty);
		}
	if (t == KILN_OP_CONV)
		printf("convthin: %s bf16%s: worst error beyond y's rounding %.3g of the rms (oneDNN %.3g); %.3g in all; %d of %d prepares by convthin.c\n",
		       op_str(t), bias16 ? " (bf16 bias)" : "", ty->ref, ty->onednn, ty->plain, ty->pl.made,
		       ty->pl.ops);
	else
		printf("convthin: %s bf16: worst error %.3g of the rms (oneDNN %.3g); %d of %d prepares by convthin.c\n",
		       op_str(t), ty->ref, ty->onednn, ty->pl.made, ty->pl.ops);
	fflush(stdout); /* before a failed check ends the test's process */
}

START_TEST(test_forward_bf16)
{
	static const int fls[] = { 0, F_BIAS, F_BIAS | F_RELU, F_RELU };
	struct tally ty = { 0 }, ty16 = { 0 };
	check_type_bf16(KILN_OP_CONV, fls, 4, 0, &ty);
	check_type_bf16(KILN_OP_CONV, fls + 1, 2, 1, &ty16);
	tally_check(&ty, "CONV bf16");
	tally_check(&ty16, "CONV bf16 (bf16 bias)");
}
END_TEST

START_TEST(test_bwd_weights_bf16)
{
	static const int fls[] = { 0, F_BIAS, F_BIAS | F_ACC, F_ACC };
	struct tally ty = { 0 };
	check_type_bf16(KILN_OP_CONV_BWD_WEIGHTS, fls, 4, 0, &ty);
	tally_check(&ty, "CONV_BWD_WEIGHTS bf16");
}
END_TEST

/* The convthin plans c's op makes when prepared (override ov or none);
 * must_prepare: the op is one the cpu device prepares (else a refusal
 * counts as none made). */
static int plans_of(const struct cop *c, const char *ov, int must_prepare)
{
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, ov, 0, &dev);
	struct kiln_op op;
	uint32_t sin[3];
	int64_t nout[2];
	make_op(c, &op, sin, nout);
	void *plan = NULL;
	size_t wsb = 0;
	int plans;
	const int st = prepare(dev, &op, &plan, &wsb, &plans);
	ck_assert_msg(st == 0 || !must_prepare, "%s: %s", op_str(c->t), kiln_last_error());
	if (!st)
		kiln_device_plan_free(dev, plan);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	return plans;
}

/* Kept copies (KILN_OPF_KEEP): the CONV that keeps x, the weight gradient
 * that reads it and keeps dy, on one device (the second needs the
 * first's copy size); their convthin plans into plans[2]. */
static void plans_kept(const struct cop *c, int plans[2])
{
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, NULL, 0, &dev);
	struct cop cf = *c, cg = *c;
	cf.t = KILN_OP_CONV, cg.t = KILN_OP_CONV_BWD_WEIGHTS;
	cf.extra = cg.extra = KILN_OPF_KEEP;
	cf.fl = cg.fl = F_BIAS;
	struct kiln_op f, g;
	struct kiln_tensor_desc u;
	const int64_t d1[1] = { 1 };
	uint32_t sin[3];
	int64_t nout[2];
	kiln_tensor_desc_init(&u, KILN_U8, 1, d1);
	make_op(&cf, &f, sin, nout);
	make_op(&cg, &g, sin, nout);
	f.out[f.n_out++] = u;
	void *pf = NULL, *pg = NULL;
	size_t wsb;
	const int st = prepare(dev, &f, &pf, &wsb, &plans[0]);
	plans[1] = 0;
	if (want_thin(&cf)) {
		/* convthin's op: the kept one refused (KILN_ENOTSUP), so that
		 * its layer prepares its ops without copies (tune.c) */
		ck_assert_msg(st == KILN_ENOTSUP, "CONV KEEP of convthin's: %d, not KILN_ENOTSUP", st);
		kiln_device_close(dev);
		kiln_config_free(cfg);
		return;
	}
	ck_assert_msg(st == 0, "%s", kiln_last_error());
	const size_t kx = kiln_device_aux_bytes(dev, pf);
	if (kx) { /* (0: nothing kept, no reader with the flag) */
		g.in[g.n_in] = u, g.in[g.n_in++].dims[0] = (int64_t)kx;
		g.out[g.n_out++] = u;
		ck_assert_msg(prepare(dev, &g, &pg, &wsb, &plans[1]) == 0, "%s", kiln_last_error());
		kiln_device_plan_free(dev, pg);
	}
	kiln_device_plan_free(dev, pf);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

/* What convthin leaves to oneDNN: no "(convthin.c)" plan, on any CPU. */
START_TEST(test_ineligible)
{
	static const struct shape base = { 2, 2, 9, 9, 8, 3, 3, 1, 1 },
				  c5 = { 2, 5, 9, 9, 8, 3, 3, 1, 1 },
				  k8 = { 2, 2, 12, 12, 8, 8, 8, 1, 1 },
				  k19 = { 2, 2, 9, 12, 8, 1, 9, 0, 4 },
				  g2 = { 2, 4, 9, 9, 8, 3, 3, 1, 1 };
	const struct cop cases[] = {
		{ .s = &c5 },              { .s = &base, .stride = 2 }, { .s = &base, .dil = 2 },
		{ .s = &g2, .groups = 2 }, { .s = &base, .nhwc = 1 },   { .s = &k8 },
		{ .s = &k19 },
	};
	static const char *const names[] = { "5 channels", "stride 2", "dilation 2", "groups 2",
					      "NHWC", "8x8", "1x9" };
	static const int types[] = { KILN_OP_CONV, KILN_OP_CONV_BWD_WEIGHTS };
	struct tally ty = { 0 };
	char what[160];
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		for (int k = 0; k < 2; k++) {
			struct cop c = cases[i];
			c.t = types[k], c.fl = F_BIAS;
			snprintf(what, sizeof what, "%s %s", op_str(c.t), names[i]);
			tally_plans(&ty, plans_of(&c, NULL, 1), 0, what);
		}
	/* the data gradient, of conv1 too */
	const struct cop bd = { .t = KILN_OP_CONV_BWD_DATA, .s = &shapes[0] },
			 bd2 = { .t = KILN_OP_CONV_BWD_DATA, .s = &base };
	tally_plans(&ty, plans_of(&bd, NULL, 1), 0, "CONV_BWD_DATA conv1");
	tally_plans(&ty, plans_of(&bd2, NULL, 1), 0, "CONV_BWD_DATA");
	/* kept copies, of conv1 and of 2 channels */
	int kp[2];
	const struct cop k1 = { .s = &shapes[0] }, k2 = { .s = &base };
	plans_kept(&k1, kp);
	tally_plans(&ty, kp[0], 0, "CONV KEEP conv1");
	tally_plans(&ty, kp[1], 0, "CONV_BWD_WEIGHTS KEEP conv1");
	plans_kept(&k2, kp);
	tally_plans(&ty, kp[0], 0, "CONV KEEP");
	tally_plans(&ty, kp[1], 0, "CONV_BWD_WEIGHTS KEEP");
	/* a residual epilogue (oneDNN's on NHWC only: refused here) */
	const struct cop res = { .t = KILN_OP_CONV, .fl = F_BIAS, .s = &base,
				 .extra = KILN_OPF_RESIDUAL };
	tally_plans(&ty, plans_of(&res, NULL, 0), 0, "CONV RESIDUAL");
	/* bf16 NHWC (convthin's NHWC is f32 alone) */
	for (int k = 0; k < 2; k++) {
		const struct cop c = { .t = types[k], .fl = F_BIAS, .s = &shapes[0], .bf16 = 1,
				       .exact = 1, .nhwc = 1 };
		snprintf(what, sizeof what, "bf16 NHWC %s", op_str(c.t));
		tally_plans(&ty, plans_of(&c, NULL, 1), 0, what);
	}
	/* bf16 with bf16_conv = bf16: oneDNN's bf16 kernel */
	for (int k = 0; k < 2; k++) {
		const struct cop c = { .t = types[k], .fl = F_BIAS, .s = &shapes[0], .bf16 = 1,
				       .exact = 1 };
		snprintf(what, sizeof what, "bf16 %s bf16_conv=bf16", op_str(c.t));
		tally_plans(&ty, plans_of(&c, "plugin.cpu.bf16_conv=bf16", 1), 0, what);
	}
	tally_check(&ty, "ineligible");
}
END_TEST

/* A weight gradient's lanes past the row's last output add nothing: x
 * [1, 1, 3, 20], 3x3, no padding (18 outputs a row: a vector of 16 and one
 * of 2, or one of 32 in bf16), every x 1 but column 19 inf, every dy 1.
 * Taps kx = 0 and 1 never reach column 19 (their sums are 18, and db's
 * too); kx = 2 does (inf).  A kernel that read x unmasked in the tail
 * lanes, whose dy is 0, added 0 x inf = NaN to kx = 0 and 1. */
static void check_inf_tail(int bf16)
{
	static const struct shape s = { 1, 1, 3, 20, 1, 3, 3, 0, 0 };
	const struct cop c = { .t = KILN_OP_CONV_BWD_WEIGHTS, .fl = F_BIAS, .s = &s, .bf16 = bf16 };
	struct kiln_device *dev;
	struct kiln_config *cfg = open_dev(2, NULL, 0, &dev);
	struct kiln_op op;
	uint32_t sin[3];
	int64_t nout[2];
	make_op(&c, &op, sin, nout);
	void *plan, *stream, *ws = NULL;
	size_t wsb = 0;
	int plans;
	ck_assert_msg(prepare(dev, &op, &plan, &wsb, &plans) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(dev, &stream) == 0);
	float x[60], dy[18], dw[9] = { 0 }, db[1] = { 0 };
	for (int i = 0; i < 60; i++)
		x[i] = i % 20 == 19 ? INFINITY : 1.0f;
	for (int i = 0; i < 18; i++)
		dy[i] = 1.0f;
	void *dx = upload(dev, op.in[0].dtype, x, 60), *ddy = upload(dev, op.in[1].dtype, dy, 18);
	void *ddw = upload(dev, KILN_F32, dw, 9), *ddb = upload(dev, KILN_F32, db, 1);
	if (wsb)
		ck_assert(kiln_device_alloc(dev, wsb, &ws) == 0);
	struct kiln_op_args a = { .in = { dx, ddy }, .out = { ddw, ddb }, .workspace = ws,
				  .workspace_bytes = wsb };
	ck_assert_msg(kiln_device_run(dev, plan, &a, stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_sync(dev, stream) == 0);
	memcpy(dw, ddw, sizeof dw), memcpy(db, ddb, sizeof db);
	for (int ky = 0; ky < 3; ky++)
		ck_assert_msg(dw[ky * 3] == 18.0f && dw[ky * 3 + 1] == 18.0f && isinf(dw[ky * 3 + 2]),
			      "%s inf tail: dw row %d = %g %g %g, want 18 18 inf (convthin plans %d)",
			      bf16 ? "bf16" : "f32", ky, dw[ky * 3], dw[ky * 3 + 1], dw[ky * 3 + 2], plans);
	ck_assert_msg(db[0] == 18.0f, "inf tail: db %g, want 18", db[0]);
	kiln_device_free(dev, dx), kiln_device_free(dev, ddy), kiln_device_free(dev, ddw);
	kiln_device_free(dev, ddb), kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

START_TEST(test_inf_tail)
{
	check_inf_tail(0);
	check_inf_tail(1);
}
END_TEST

static Suite *make_cpu_convthin_suite(void)
{
	Suite *s = suite_create("cpu_convthin");
	check_add_case(s, "f32", 120, NULL, NULL, (const TTest *[]){
		test_forward, test_bwd_weights, test_conv_algo, NULL });
	check_add_case(s, "bf16", 120, NULL, NULL, (const TTest *[]){
		test_forward_bf16, test_bwd_weights_bf16, NULL });
	check_add_case(s, "choice", 60, NULL, NULL, (const TTest *[]){ test_ineligible, NULL });
	check_add_case(s, "edges", 60, NULL, NULL, (const TTest *[]){ test_inf_tail, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_convthin_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1 };
