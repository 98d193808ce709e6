/* tests/check_device_threads.c - device conformance: the reductions kiln
 * computes itself (not oneDNN's) give the same bytes for any thread count.
 *
 * The CPU device sums over fixed chunks, planes, column blocks or rows and
 * adds the partial sums in a fixed order (plugins/cpu/cpu.h, CPU_CHUNKS),
 * so its gradient norm, bias gradients, batchnorm and layernorm statistics
 * and losses do not depend on the team (docs/training.md, "Clipping";
 * docs/config.md, `deterministic`).  Each op below runs on one input with
 * [run] threads = 1, 2, 3 and 4, every output compared byte for byte with
 * the one-thread run.  Sizes are above the plugin's parallel threshold
 * (CPU_PAR_MIN, 32768 elements) with tails that are not whole vectors or
 * blocks.  Values are the other suites' business (check_device_optim,
 * _norm, _loss, _gemm, _conv, _transformer); here only their bits.
 *
 * Session 21 wrote this on the first AVX-512 machine (the avx512f clones of
 * CPU_CLONES, 16 lanes): it checks whichever clone this CPU runs.
 */
#include "device_fixture.h"
#include "check_main.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* how a case's input or output buffer starts (outputs: before the run) */
enum fill { ZERO, RAND, POSITIVE, LABELS, CLIP_STATE, SCALE_STATE };

struct tcase {
	const char *name;
	struct kiln_op op;
	enum fill in[5], out[4];
	unsigned check; /* bit j: out[j] must not depend on the team */
	int from;       /* the fewest threads compared (0: 1) */
};

static size_t desc_bytes(const struct kiln_tensor_desc *d)
{
	size_t n = 1;
	for (int k = 0; k < d->ndim; k++)
		n *= (size_t)d->dims[k];
	return n * kiln_dtype_size(d->dtype);
}

/* a host buffer for desc d filled as `how`; labels below `classes` */
static void *host_fill(enum fill how, const struct kiln_tensor_desc *d, int64_t classes)
{
	const size_t n = desc_bytes(d) / 4;
	float *h = frandv(n);
	for (size_t i = 0; i < n; i++)
		switch (how) {
		case ZERO: h[i] = 0.0f; break;
		case RAND: break;
		case POSITIVE: h[i] = fabsf(h[i]) + 0.5f; break;
		case LABELS: ((int32_t *)h)[i] = (int32_t)((i * 7 + 3) % (size_t)classes); break;
		case CLIP_STATE: h[i] = i == 1 ? 1.0f : 0.0f; break; /* { 0, 1, 0, 0 } */
		case SCALE_STATE: h[i] = i == 0 ? 1024.0f : i == 2 ? 1.0f : 0.0f; break;
		}
	return h;
}

/* The case's outputs after one run with [run] threads = T from the host
 * buffers hin (inputs) and hout (outputs' first contents), concatenated;
 * an output not checked is left zero. */
static unsigned char *run_case(const struct tcase *c, void *const *hin, void *const *hout, int T,
			       size_t *bytes)
{
	struct fx f;
	char ov[32];
	snprintf(ov, sizeof ov, "run.threads=%d", T);
	OK(fx_try_open_with(&f, 0, ov));
	void *din[5] = { 0 }, *dout[4] = { 0 };
	size_t total = 0;
	for (int k = 0; k < c->op.n_in; k++)
		din[k] = dput(&f, hin[k], desc_bytes(&c->op.in[k]));
	for (int j = 0; j < c->op.n_out; j++) {
		dout[j] = dput(&f, hout[j], desc_bytes(&c->op.out[j]));
		total += desc_bytes(&c->op.out[j]);
	}
	OK(run_op(&f, &c->op, (const void *const *)din, dout));
	unsigned char *h = calloc(1, total), *p = h;
	for (int j = 0; j < c->op.n_out; j++) {
		if (c->check >> j & 1)
			dget(&f, p, dout[j], desc_bytes(&c->op.out[j]));
		p += desc_bytes(&c->op.out[j]);
	}
	dfree_n(&f, din, (size_t)c->op.n_in);
	dfree_n(&f, dout, (size_t)c->op.n_out);
	fx_close(&f);
	*bytes = total;
	return h;
}

static struct kiln_tensor_desc rows(int64_t R, int64_t C) { return td(KILN_F32, 2, R, C); }
static struct kiln_tensor_desc vec(int64_t n) { return td(KILN_F32, 1, n, 0); }

/* GRAD_CLIP over n elements, clipped to 10 (the scale depends on the
 * norm's bits), or UNSCALE by 1/1024 */
static struct tcase norm_case(const char *name, int type, int64_t n)
{
	struct tcase c = { name, { 0 }, { RAND, SCALE_STATE }, { RAND, CLIP_STATE }, 3, 0 };
	c.op.type = type;
	c.op.n_in = type == KILN_OP_UNSCALE ? 2 : 1, c.op.n_out = 2;
	c.op.in[0] = c.op.out[0] = vec(n);
	c.op.in[1] = c.op.out[1] = vec(4);
	c.op.i[0] = n;
	c.op.f[0] = type == KILN_OP_UNSCALE ? 0.0 : 10.0;
	return c;
}

/* BIAS_GRAD, or RELU_BWD with the bias gradient folded in (out[1]) */
static struct tcase bias_case(const char *name, int type, int64_t R, int64_t N)
{
	struct tcase c = { name, { 0 }, { RAND, RAND }, { ZERO }, 3, 0 };
	c.op.type = type;
	c.op.n_in = type == KILN_OP_BIAS_GRAD ? 1 : 2, c.op.n_out = type == KILN_OP_BIAS_GRAD ? 1 : 2;
	c.op.in[0] = c.op.in[1] = rows(R, N);
	c.op.out[0] = type == KILN_OP_BIAS_GRAD ? vec(N) : rows(R, N);
	c.op.out[1] = vec(N);
	return c;
}

/* BN_TRAIN (y, saved mean and 1/std, running statistics) or BN_BWD (dx,
 * dgamma, dbeta) over x of desc xd with C channels */
static struct tcase bn_case(const char *name, int type, struct kiln_tensor_desc xd, int64_t C)
{
	struct tcase c = { name, { 0 }, { RAND, RAND, RAND }, { ZERO, ZERO, RAND, POSITIVE }, 0xf, 0 };
	struct kiln_op *op = &c.op;
	op->type = type;
	if (type == KILN_OP_BN_TRAIN) {
		op->n_in = 3, op->n_out = 4;
		op->in[0] = op->out[0] = xd;
		op->in[1] = op->in[2] = op->out[2] = op->out[3] = vec(C);
		op->out[1] = rows(2, C);
		op->f[0] = 1e-5, op->f[1] = 0.1;
	} else {
		op->n_in = 4, op->n_out = 3;
		op->in[0] = op->in[1] = op->out[0] = xd;
		op->in[2] = op->out[1] = op->out[2] = vec(C);
		op->in[3] = rows(2, C);
		c.in[3] = POSITIVE; /* the saved mean and 1/std */
		c.check = 7;
	}
	return c;
}

START_TEST(test_reductions_threads)
{
	if (strcmp(g_name, "cpu"))
		return; /* the thread count is the CPU device's */
	struct tcase cs[] = {
		norm_case("GRAD_CLIP n=100003", KILN_OP_GRAD_CLIP, 100003),
		/* above 8M elements: two rounds of 8192 blocks (ops.c, cpu_grad_clip) */
		norm_case("GRAD_CLIP n=8400001", KILN_OP_GRAD_CLIP, 8400001),
		norm_case("UNSCALE n=100003", KILN_OP_UNSCALE, 100003),
		bias_case("BIAS_GRAD 1000x300", KILN_OP_BIAS_GRAD, 1000, 300),
		bias_case("RELU_BWD+db 1000x300", KILN_OP_RELU_BWD, 1000, 300),
		bn_case("BN_TRAIN NCHW", KILN_OP_BN_TRAIN, td4(8, 16, 19, 21, 0), 16),
		bn_case("BN_TRAIN NHWC", KILN_OP_BN_TRAIN, td4(8, 16, 19, 21, 1), 16),
		bn_case("BN_TRAIN 2-d", KILN_OP_BN_TRAIN, rows(4001, 24), 24),
		bn_case("BN_BWD NCHW", KILN_OP_BN_BWD, td4(8, 16, 19, 21, 0), 16),
		bn_case("BN_BWD NHWC", KILN_OP_BN_BWD, td4(8, 16, 19, 21, 1), 16),
		bn_case("BN_BWD 2-d", KILN_OP_BN_BWD, rows(4001, 24), 24),
		{ "LAYERNORM_BWD 2001x64", { 0 }, { RAND, RAND, POSITIVE, RAND }, { ZERO }, 7, 0 },
		{ "SOFTMAX_XENT 2001x100", { 0 }, { RAND, LABELS }, { ZERO }, 3, 0 },
		/* dw and db in fixed blocks of the minibatch from 2 threads on
		 * (convsplit.c); on 1 thread the op is oneDNN's whole, its dw
		 * summed in oneDNN's order and db in one pass (conv.c own_db):
		 * other bytes, as docs/design-notes.md says */
		{ "CONV_BWD_WEIGHTS NHWC", { 0 }, { RAND, RAND }, { ZERO }, 3, 2 },
	};
	const int nc = (int)(sizeof cs / sizeof *cs);
	struct kiln_op *ln = &cs[nc - 3].op, *xe = &cs[nc - 2].op;
	ln->type = KILN_OP_LAYERNORM_BWD;
	ln->n_in = 4, ln->n_out = 3;
	ln->in[0] = ln->in[1] = ln->out[0] = rows(2001, 64);
	ln->in[2] = rows(2001, 2);
	ln->in[3] = ln->out[1] = ln->out[2] = vec(64);
	xe->type = KILN_OP_SOFTMAX_XENT;
	xe->n_in = xe->n_out = 2;
	xe->in[0] = xe->out[0] = rows(2001, 100);
	xe->in[1] = td(KILN_I32, 1, 2001, 0);
	xe->out[1] = vec(2);
	xe->i[0] = 2001, xe->i[5] = 100;
	xe->f[0] = 1.0 / 2001;
	const struct conv_g g = { .N = 16, .C = 8, .O = 24, .H = 16, .W = 15, .KH = 3, .KW = 3, .sh = 1,
				  .sw = 1, .ph = 1, .pw = 1, .dh = 1, .dw = 1, .g = 1, .bias = 1 };
	conv_op(&cs[nc - 1].op, KILN_OP_CONV_BWD_WEIGHTS, &g, 16, 15, 1);
	for (int k = 0; k < nc; k++) {
		const struct tcase *c = &cs[k];
		void *hin[5] = { 0 }, *hout[4] = { 0 };
		for (int i = 0; i < c->op.n_in; i++)
			hin[i] = host_fill(c->in[i], &c->op.in[i], c->op.in[0].dims[1]);
		for (int j = 0; j < c->op.n_out; j++)
			hout[j] = host_fill(c->out[j], &c->op.out[j], 0);
		const int T0 = c->from ? c->from : 1;
		size_t b1, bt;
		unsigned char *one = run_case(c, hin, hout, T0, &b1);
		for (int T = T0 + 1; T <= 4; T++) {
			unsigned char *got = run_case(c, hin, hout, T, &bt);
			size_t at = 0;
			while (at < b1 && got[at] == one[at])
				at++;
			ck_assert_msg(at == b1, "%s: %d threads differ from %d at output byte %zu of %zu",
				      c->name, T, T0, at, b1);
			free(got);
		}
		free(one);
		for (int i = 0; i < 5; i++)
			free(hin[i]);
		for (int j = 0; j < 4; j++)
			free(hout[j]);
	}
}
END_TEST

DEVICE_SUITE(threads, DFX_ONCE(reductions_threads, 300));
