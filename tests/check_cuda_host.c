/* tests/check_cuda_host.c - the CUDA device's pure pieces (plugins/cuda/
 * kern.h) on the host, on any machine: the kernels call exactly these
 * functions, so what can be checked without a GPU is checked here.
 *
 *   - bf16 rounding: equal, bit for bit, to the CPU device's CAST;
 *   - the dropout mask (kern_drop_setup, kern_drop_scale, the NHWC
 *     logical index and kern_drop_global's rows of the global batch):
 *     equal, bit for bit, to the CPU device's DROPOUT in both layouts and
 *     for several counters' rows, so the GPU's masks are the CPU's;
 *   - CONCAT/SPLIT and REORDER geometry: a host loop over the geometry
 *     gives the CPU device's outputs;
 *   - LAMB's piece slots are distinct and within the workspace, and the
 *     tensor search agrees with a linear scan, empty tensors included;
 *   - the bad-data record's messages and statuses;
 *   - the INT8 ops (plugins/cuda/qkern.h): the weights' and the input's
 *     quantization, the padded im2col, an int32 GEMM per group as
 *     cuBLASLt computes it and the epilogue, run here element by element,
 *     equal the CPU device's QCONV and QLINEAR in both layouts, u8 and s8,
 *     groups, stride, padding, dilation and the fused ReLU.
 */
#include <check.h>
#include "check_main.h"
#include <kiln/kiln.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../plugins/cuda/kern.h"
#include "../plugins/cuda/qkern.h"

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s failed: %s", #x, kiln_last_error())

/* ---- the CPU device, the reference -------------------------------------- */

struct cpu {
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *s;
};

static void cpu_open(struct cpu *c)
{
	memset(c, 0, sizeof *c);
	OK(kiln_registry_open(NULL, &c->reg));
	OK(kiln_config_new(&c->cfg));
	OK(kiln_config_validate(c->cfg, c->reg));
	OK(kiln_device_open(c->reg, c->cfg, "cpu", 0, &c->dev));
	OK(kiln_device_stream_create(c->dev, &c->s));
}

static void cpu_close(struct cpu *c)
{
	kiln_device_stream_destroy(c->dev, c->s);
	kiln_device_close(c->dev);
	kiln_config_free(c->cfg);
	kiln_registry_close(c->reg);
}

/* Run op on the cpu device: host inputs in[k] of in_b[k] bytes, outputs
 * read back into out[k] (out_b[k] bytes; their initial contents are
 * copied in first, for accumulating ops). */
static void cpu_run(struct cpu *c, const struct kiln_op *op, const void *const *in,
		    const size_t *in_b, void *const *out, const size_t *out_b)
{
	void *din[KILN_OP_MAX_IN] = { 0 }, *dout[KILN_OP_MAX_OUT] = { 0 }, *plan = NULL, *ws = NULL;
	size_t wsb = 0;
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	for (int k = 0; k < op->n_in; k++) {
		OK(kiln_device_alloc(c->dev, in_b[k], &din[k]));
		OK(kiln_device_copy_async(c->dev, din[k], in[k], in_b[k], KILN_COPY_H2D, c->s));
		a.in[k] = din[k];
	}
	for (int k = 0; k < op->n_out; k++) {
		OK(kiln_device_alloc(c->dev, out_b[k], &dout[k]));
		OK(kiln_device_copy_async(c->dev, dout[k], out[k], out_b[k], KILN_COPY_H2D, c->s));
		a.out[k] = dout[k];
	}
	OK(kiln_device_prepare(c->dev, op, &plan, &wsb));
	if (wsb)
		OK(kiln_device_alloc(c->dev, wsb, &ws));
	a.workspace = ws, a.workspace_bytes = wsb;
	OK(kiln_device_run(c->dev, plan, &a, c->s));
	for (int k = 0; k < op->n_out; k++)
		OK(kiln_device_copy_async(c->dev, out[k], dout[k], out_b[k], KILN_COPY_D2H, c->s));
	OK(kiln_device_stream_sync(c->dev, c->s));
	kiln_device_plan_free(c->dev, plan);
	kiln_device_free(c->dev, ws);
	for (int k = 0; k < op->n_in; k++)
		kiln_device_free(c->dev, din[k]);
	for (int k = 0; k < op->n_out; k++)
		kiln_device_free(c->dev, dout[k]);
}

static struct kiln_tensor_desc desc(int dtype, int ndim, const int64_t *dims, int nhwc)
{
	struct kiln_tensor_desc d;
	kiln_tensor_desc_init(&d, dtype, ndim, dims);
	d.layout = ndim == 4 ? (nhwc ? KILN_NHWC : KILN_NCHW) : d.layout;
	return d;
}

static uint32_t g_seed = 12345;
static float frand(void)
{
	g_seed = g_seed * 1664525u + 1013904223u;
	return (float)((g_seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* ---- bf16 ----------------------------------------------------------------- */

START_TEST(test_bf16_round)
{
	struct cpu c;
	cpu_open(&c);
	enum { n = 4096 };
	float *x = malloc(sizeof(float) * n);
	uint16_t *y = calloc(n, 2);
	for (int i = 0; i < n; i++)
		x[i] = frand() * powf(2.0f, (float)(i % 60) - 30.0f);
	x[0] = 1.0f + 0x1p-8f;           /* a tie: to even (1.0) */
	x[1] = 1.0f + 0x1p-8f + 0x1p-7f; /* a tie: to even (up) */
	x[2] = INFINITY, x[3] = -INFINITY, x[4] = NAN, x[5] = 3.4e38f, x[6] = -0.0f;
	x[7] = 1e-40f;                   /* subnormal */
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	const int64_t dims[1] = { n };
	op.type = KILN_OP_CAST, op.n_in = op.n_out = 1;
	op.in[0] = desc(KILN_F32, 1, dims, 0), op.out[0] = desc(KILN_BF16, 1, dims, 0);
	cpu_run(&c, &op, (const void *const[]){ x }, (const size_t[]){ sizeof(float) * n },
		(void *const[]){ y }, (const size_t[]){ 2 * n });
	for (int i = 0; i < n; i++) {
		ck_assert_msg(kern_bf16_round(x[i]) == y[i], "bf16(%a): kern %04x, cpu %04x", x[i],
			      kern_bf16_round(x[i]), y[i]);
		if (!isnan(x[i]))
			ck_assert(kern_bf16_f32(y[i]) == (float)kern_bf16_f32(kern_bf16_round(x[i])));
	}
	ck_assert_uint_eq(kern_bf16_round(x[0]), 0x3f80);
	ck_assert_uint_eq(kern_bf16_round(x[1]), 0x3f82);
	ck_assert(isnan(kern_bf16_f32(kern_bf16_round(NAN))));
	free(x), free(y);
	cpu_close(&c);
}
END_TEST

/* ---- dropout ------------------------------------------------------------- */

START_TEST(test_dropout_mask)
{
	struct cpu c;
	cpu_open(&c);
	const int64_t dims[4] = { 3, 7, 5, 9 }, n = 3 * 7 * 5 * 9, C = 7, HW = 45;
	const double ps[3] = { 0.3, 0.5, 0.9 };
	float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
	for (int64_t i = 0; i < n; i++)
		x[i] = frand() + 2.0f; /* nonzero: a zero output is a drop */
	/* { step, row0, rstride }: one process; rows [2, 5) of a micro-batch;
	 * rank 2 of 3 with a row0 whose rows' indices pass 2^32 */
	static const int64_t ctrs[3][KILN_DROP_CTR] = { { 0x100000007LL, 0, 1 }, /* past 2^32: the whole step counts */
							{ 5, 2, 1 },
							{ 9, 4600000 * 3 + 2, 3 } };
	for (int nhwc = 0; nhwc < 2; nhwc++)
		for (int pi = 0; pi < 3 * 3; pi++) {
			const int64_t *ctr = ctrs[pi / 3];
			struct kiln_op op;
			memset(&op, 0, sizeof op);
			op.type = KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
			op.in[0] = op.out[0] = desc(KILN_F32, 4, dims, nhwc);
			op.in[1] = desc(KILN_I64, 1, (const int64_t[]){ KILN_DROP_CTR }, 0);
			op.i[0] = 0x123456789abcdefLL, op.i[1] = 11, op.f[0] = ps[pi % 3];
			memset(y, 0, sizeof(float) * n);
			cpu_run(&c, &op, (const void *const[]){ x, ctr },
				(const size_t[]){ sizeof(float) * n, 8 * KILN_DROP_CTR },
				(void *const[]){ y }, (const size_t[]){ sizeof(float) * n });
			struct kern_drop d;
			kern_drop_setup(&op, &d);
			int64_t kept = 0;
			for (int64_t i = 0; i < n; i++) {
				const int64_t e = nhwc ? kern_nhwc_logical(i, C, HW) : i;
				const uint64_t g = kern_drop_global((uint64_t)e, n / dims[0], ctr[1], ctr[2]);
				const float k = kern_drop_scale(&d, (uint64_t)ctr[0], g);
				ck_assert_msg(!memcmp(&y[i], &(float){ x[i] * k }, 4),
					      "%s p %g counter %d element %lld: cpu %a, kern %a",
					      nhwc ? "NHWC" : "NCHW", ps[pi % 3], pi / 3, (long long)i, y[i],
					      x[i] * k);
				kept += k != 0;
			}
			ck_assert(kept > 0 && kept < n);
		}
	/* the NHWC map against the definition */
	for (int64_t nn = 0, i = 0; nn < 3; nn++)
		for (int64_t hw = 0; hw < HW; hw++)
			for (int64_t ch = 0; ch < C; ch++, i++)
				ck_assert_int_eq(kern_nhwc_logical(i, C, HW), (nn * C + ch) * HW + hw);
	free(x), free(y);
	cpu_close(&c);
}
END_TEST

/* ---- concat / split / reorder --------------------------------------------- */

/* CONCAT of 3 parts along d of a [2, 6, 3, 4]-ish whole in a layout,
 * against a host loop over kern_cat_geom; then SPLIT back, exact. */
static void cat_case(struct cpu *c, int ndim, int d, int nhwc)
{
	int64_t whole[4] = { 2, 9, 3, 4 }, ext[3] = { 2, 3, 4 }, parts[3][4];
	whole[d] = 9;
	int64_t nw = 1;
	for (int i = 0; i < ndim; i++)
		nw *= whole[i];
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONCAT, op.n_in = 3, op.n_out = 1, op.i[0] = d;
	op.out[0] = desc(KILN_F32, ndim, whole, nhwc);
	float *in[3], *ref = malloc(sizeof(float) * nw), *got = calloc(nw, sizeof(float));
	size_t inb[3];
	for (int k = 0; k < 3; k++) {
		memcpy(parts[k], whole, sizeof whole);
		parts[k][d] = ext[k];
		op.in[k] = desc(KILN_F32, ndim, parts[k], nhwc);
		const int64_t np = nw / 9 * ext[k];
		in[k] = malloc(sizeof(float) * np);
		inb[k] = sizeof(float) * np;
		for (int64_t i = 0; i < np; i++)
			in[k][i] = (float)(k * 1000 + i);
	}
	struct kern_cat g;
	ck_assert_int_eq(kern_cat_geom(&op, &g), 0);
	ck_assert_int_eq(g.outer * g.row, nw);
	for (int64_t o = 0; o < g.outer; o++)
		for (int k = 0; k < 3; k++)
			for (int64_t r = 0; r < g.chunk[k]; r++)
				ref[o * g.row + g.off[k] + r] = in[k][o * g.chunk[k] + r];
	cpu_run(c, &op, (const void *const *)in, inb, (void *const[]){ got },
		(const size_t[]){ sizeof(float) * nw });
	ck_assert_msg(!memcmp(ref, got, sizeof(float) * nw), "CONCAT ndim %d d %d %s", ndim, d,
		      nhwc ? "NHWC" : "NCHW");
	/* SPLIT: the same geometry from the split op */
	struct kiln_op sp = op;
	sp.type = KILN_OP_SPLIT, sp.n_in = 1, sp.n_out = 3, sp.in[0] = op.out[0];
	for (int k = 0; k < 3; k++)
		sp.out[k] = op.in[k];
	struct kern_cat g2;
	ck_assert_int_eq(kern_cat_geom(&sp, &g2), 0);
	ck_assert(g.outer == g2.outer && g.row == g2.row && g.parts == g2.parts);
	for (int k = 0; k < 3; k++)
		ck_assert(g.chunk[k] == g2.chunk[k] && g.off[k + 1] == g2.off[k + 1]);
	for (int k = 0; k < 3; k++)
		free(in[k]);
	free(ref), free(got);
}

START_TEST(test_cat_geom)
{
	struct cpu c;
	cpu_open(&c);
	for (int d = 0; d < 4; d++)
		for (int nhwc = 0; nhwc < 2; nhwc++)
			cat_case(&c, 4, d, nhwc);
	cat_case(&c, 2, 0, 0);
	cat_case(&c, 2, 1, 0);
	cat_case(&c, 3, 2, 0);
	struct kiln_op op;
	struct kern_cat g;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONCAT, op.n_in = 1, op.n_out = 1, op.i[0] = 2;
	op.out[0] = desc(KILN_F32, 2, (const int64_t[]){ 2, 3 }, 0);
	ck_assert_int_eq(kern_cat_geom(&op, &g), -1); /* d outside the dims */
	cpu_close(&c);
}
END_TEST

START_TEST(test_reorder_geom)
{
	struct cpu c;
	cpu_open(&c);
	const int64_t dims[4] = { 3, 5, 4, 7 }, n = 3 * 5 * 4 * 7;
	float *x = malloc(sizeof(float) * n), *got = calloc(n, sizeof(float)),
	      *ref = malloc(sizeof(float) * n);
	for (int64_t i = 0; i < n; i++)
		x[i] = (float)i;
	for (int to_nhwc = 0; to_nhwc < 2; to_nhwc++) {
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_REORDER, op.n_in = op.n_out = 1;
		op.in[0] = desc(KILN_F32, 4, dims, !to_nhwc), op.out[0] = desc(KILN_F32, 4, dims, to_nhwc);
		int64_t N, R, S;
		kern_reorder_geom(&op.in[0], &op.out[0], &N, &R, &S);
		ck_assert_int_eq(N * R * S, n);
		ck_assert_int_eq(R, to_nhwc ? 5 : 28);
		/* the kernels' transpose: dst[n][s][r] = src[n][r][s] */
		for (int64_t b = 0; b < N; b++)
			for (int64_t r = 0; r < R; r++)
				for (int64_t s = 0; s < S; s++)
					ref[b * R * S + s * R + r] = x[b * R * S + r * S + s];
		cpu_run(&c, &op, (const void *const[]){ x }, (const size_t[]){ sizeof(float) * n },
			(void *const[]){ got }, (const size_t[]){ sizeof(float) * n });
		ck_assert_msg(!memcmp(ref, got, sizeof(float) * n), "REORDER to %s",
			      to_nhwc ? "NHWC" : "NCHW");
		/* same layout: no transpose */
		kern_reorder_geom(&op.in[0], &op.in[0], &N, &R, &S);
		ck_assert_int_eq(R, 0);
	}
	free(x), free(got), free(ref);
}
END_TEST

/* ---- LAMB ------------------------------------------------------------------ */

START_TEST(test_lamb_slots)
{
	/* tensors of random sizes, some empty, some spanning many chunks */
	for (int trial = 0; trial < 50; trial++) {
		const int64_t T = 1 + trial % 17;
		int64_t off[18];
		off[0] = 0;
		for (int64_t k = 0; k < T; k++) {
			const int r = (int)((frand() + 1.0f) * 8);
			const int64_t len = r == 0 ? 0 : r < 4 ? r * 7 : r * 1500 + trial * 97;
			off[k + 1] = off[k] + len;
		}
		const int64_t n = off[T];
		if (n == 0)
			continue;
		const int64_t slots = kern_lamb_slots(n, T);
		char *used = calloc((size_t)slots, 1);
		/* every piece (chunk c, tensor k) as the kernels walk them */
		for (int64_t ch = 0; ch < kern_lamb_chunks(n); ch++) {
			const int64_t b = ch * KERN_LAMB_CHUNK;
			const int64_t e = b + KERN_LAMB_CHUNK < n ? b + KERN_LAMB_CHUNK : n;
			for (int64_t k = kern_tensor_of(off, T, b); k < T && off[k] < e; k++) {
				const int64_t lo = off[k] > b ? off[k] : b, hi = off[k + 1] < e ? off[k + 1] : e;
				if (hi <= lo)
					continue;
				ck_assert(ch + k < slots);
				ck_assert_msg(!used[ch + k], "slot %lld used twice", (long long)(ch + k));
				used[ch + k] = 1;
				/* k_lamb_norms visits it too */
				ck_assert(ch >= off[k] / KERN_LAMB_CHUNK && ch <= (off[k + 1] - 1) / KERN_LAMB_CHUNK);
			}
		}
		/* every element lies in exactly the tensor the search names */
		for (int64_t e = 0; e < n; e += 1 + e / 3) {
			int64_t lin = 0;
			while (off[lin + 1] <= e)
				lin++;
			ck_assert_int_eq(kern_tensor_of(off, T, e), lin);
		}
		free(used);
	}
	/* the workspace holds the slots and the steps */
	ck_assert(kern_lamb_workspace(100000, 7) >= (size_t)kern_lamb_slots(100000, 7) * 16 + 7 * 4);
}
END_TEST

/* ---- the bad-data record ---------------------------------------------------- */

START_TEST(test_err_message)
{
	char buf[256];
	ck_assert_int_eq(kern_err_message(kern_err_key_label(17, -3), 10, KERN_ERR_LABEL,
					  "SOFTMAX_XENT", buf, sizeof buf), KILN_EDATA);
	ck_assert_str_eq(buf, "cuda: SOFTMAX_XENT: label -3 of row 17 is outside [0, 10)");
	/* an embedding id: the CPU device's message, "cuda" for "cpu" */
	ck_assert_int_eq(kern_err_message(kern_err_key_label(1, 5), 5, KERN_ERR_INDEX, "EMBEDDING",
					  buf, sizeof buf), KILN_EDATA);
	ck_assert_str_eq(buf, "cuda: EMBEDDING: index 5 at position 1 is outside [0, 5)");
	ck_assert_int_eq(kern_err_message(kern_err_key_other(KERN_ERR_STEP), 0, KERN_ERR_STEP, "ADAMW",
					  buf, sizeof buf), KILN_EINVAL);
	ck_assert(strstr(buf, "ADAMW: step count 0; it is 1-based"));
	ck_assert_int_eq(kern_err_message(kern_err_key_other(KERN_ERR_OFFSETS), 4, KERN_ERR_OFFSETS,
					  "LAMB", buf, sizeof buf), KILN_EINVAL);
	ck_assert(strstr(buf, "entry 4"));
	/* a label error of any row sorts before every other error, and the
	 * smaller row first */
	ck_assert(kern_err_key_label(INT32_MAX, -1) < kern_err_key_other(KERN_ERR_STEP));
	ck_assert(kern_err_key_label(3, 99) < kern_err_key_label(4, 0));
	ck_assert(kern_err_key_other(KERN_ERR_OFFSETS) != ~0ull);
}
END_TEST

/* ---- INT8 (qkern.h) --------------------------------------------------------- */

/* What qops.c's launch does, on the host, with qkern.h's functions: the
 * weights quantized into their padded rows (a filter's scale from its max
 * |w|, its sum for the u8 shift), the padded im2col, per group the int32
 * GEMM acc[row][n] = sum_k xq[row][k] wq[n][k] that cuBLASLt computes,
 * and the epilogue. */
static void q_host(const struct kiln_op *op, const float *x, const float *w, const float *b,
		   float *y)
{
	struct cuda_qgeom g;
	qkern_geom(op, &g);
	const int64_t per = g.c / g.groups * g.kh * g.kw, rows = g.n * g.oh * g.ow;
	int8_t *wq = calloc((size_t)(g.groups * g.ogp * g.kp), 1);
	int8_t *xq = malloc((size_t)(g.groups * g.rowsp * g.kp));
	int32_t *acc = calloc((size_t)(g.groups * g.rowsp * g.ogp), sizeof(int32_t));
	float *sc = malloc(sizeof(float) * (size_t)g.o);
	int32_t *wsum = calloc((size_t)g.o, sizeof(int32_t));
	for (int64_t o = 0; o < g.o; o++) {
		float amax = 0;
		for (int64_t k = 0; k < per; k++)
			amax = fmaxf(amax, fabsf(w[o * per + k]));
		const float sw = qkern_wscale(amax);
		for (int64_t k = 0; k < per; k++) {
			const int q = qkern_wq(w[o * per + k], sw);
			wq[qkern_wrow(&g, o) * g.kp + k] = (int8_t)q;
			wsum[o] += q;
		}
		sc[o] = g.sx * sw;
	}
	for (int64_t e = 0; e < g.groups * g.rowsp * g.kp; e++)
		xq[e] = qkern_im2col(x, &g, e);
	for (int64_t grp = 0; grp < g.groups; grp++)
		for (int64_t r = 0; r < g.rowsp; r++)
			for (int64_t n = 0; n < g.ogp; n++) {
				int32_t a = 0;
				for (int64_t k = 0; k < g.kp; k++)
					a += xq[(grp * g.rowsp + r) * g.kp + k] *
					     wq[(grp * g.ogp + n) * g.kp + k];
				acc[(grp * g.rowsp + r) * g.ogp + n] = a;
			}
	for (int64_t e = 0; e < rows * g.o; e++)
		y[e] = qkern_out(acc, sc, wsum, b, &g, e);
	free(wq), free(xq), free(acc), free(sc), free(wsum);
}

/* One op on the cpu device and through q_host: equal within 1e-6 of the
 * size of the terms (the same int32 sums; the f32 epilogue may differ by a
 * rounding where the CPU's kernel halves the weights and doubles them back). */
static void q_case(struct cpu *c, struct kiln_op *op, int64_t nx, int64_t nw, int64_t ny)
{
	float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)nw);
	float b[64], *want = calloc((size_t)ny, sizeof(float)), *got = malloc(sizeof(float) * (size_t)ny);
	const float sx = (float)op->f[0];
	for (int64_t i = 0; i < nx; i++) /* past the quantized range at both ends */
		x[i] = frand() * sx * 140.0f + (op->i[8] ? sx * 120.0f : 0.0f);
	for (int64_t i = 0; i < nw; i++)
		w[i] = frand();
	for (int k = 0; k < 64; k++)
		b[k] = frand();
	const size_t in_b[3] = { sizeof(float) * (size_t)nx, sizeof(float) * (size_t)nw, sizeof b };
	cpu_run(c, op, (const void *[]){ x, w, b }, in_b, (void *[]){ want },
		(const size_t[]){ sizeof(float) * (size_t)ny });
	q_host(op, x, w, op->n_in == 3 ? b : NULL, got);
	for (int64_t i = 0; i < ny; i++)
		ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-6f * (fabsf(want[i]) + 1.0f),
			      "%s y[%lld]: qkern %.9g, cpu device %.9g",
			      op->type == KILN_OP_QCONV ? "QCONV" : "QLINEAR", (long long)i, got[i],
			      want[i]);
	free(x), free(w), free(want), free(got);
}

START_TEST(test_int8_maps)
{
	struct cpu c;
	cpu_open(&c);
	/* QCONV: N, C, H, W, O, K, stride, pad, dilation, groups */
	static const int cv[][10] = { { 2, 3, 9, 7, 8, 3, 1, 1, 1, 1 }, { 2, 4, 8, 8, 6, 3, 2, 0, 1, 2 },
				      { 1, 6, 7, 9, 6, 3, 1, 2, 2, 3 }, { 3, 16, 5, 5, 10, 1, 1, 0, 1, 1 } };
	for (int k = 0; k < 4; k++)
		for (int v = 0; v < 4; v++) {
			const int *q = cv[k], nhwc = v & 1, u8 = v >> 1;
			const int64_t OH = (q[2] + 2 * q[7] - q[8] * (q[5] - 1) - 1) / q[6] + 1;
			const int64_t OW = (q[3] + 2 * q[7] - q[8] * (q[5] - 1) - 1) / q[6] + 1;
			struct kiln_op op;
			memset(&op, 0, sizeof op);
			op.type = KILN_OP_QCONV, op.n_in = v == 3 ? 2 : 3, op.n_out = 1;
			op.in[0] = desc(KILN_F32, 4, (const int64_t[]){ q[0], q[1], q[2], q[3] }, nhwc);
			op.in[1] = desc(KILN_F32, 4, (const int64_t[]){ q[4], q[1] / q[9], q[5], q[5] }, 0);
			op.in[2] = desc(KILN_F32, 1, (const int64_t[]){ q[4] }, 0);
			op.out[0] = desc(KILN_F32, 4, (const int64_t[]){ q[0], q[4], OH, OW }, nhwc);
			op.i[0] = op.i[1] = q[6], op.i[2] = op.i[3] = q[7], op.i[4] = op.i[5] = q[8];
			op.i[6] = q[9], op.i[8] = u8, op.f[0] = 0.02;
			if (k & 1)
				op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
			q_case(&c, &op, (int64_t)q[0] * q[1] * q[2] * q[3],
			       (int64_t)q[4] * (q[1] / q[9]) * q[5] * q[5], (int64_t)q[0] * q[4] * OH * OW);
		}
	/* QLINEAR: M, N, K (N not a multiple of 4, M of 4, K of 16) */
	static const int ln[][3] = { { 5, 7, 33 }, { 16, 10, 64 }, { 3, 12, 9 } };
	for (int k = 0; k < 3; k++)
		for (int u8 = 0; u8 < 2; u8++) {
			struct kiln_op op;
			memset(&op, 0, sizeof op);
			op.type = KILN_OP_QLINEAR, op.n_in = k == 2 ? 2 : 3, op.n_out = 1;
			op.in[0] = desc(KILN_F32, 2, (const int64_t[]){ ln[k][0], ln[k][2] }, 0);
			op.in[1] = desc(KILN_F32, 2, (const int64_t[]){ ln[k][1], ln[k][2] }, 0);
			op.in[2] = desc(KILN_F32, 1, (const int64_t[]){ ln[k][1] }, 0);
			op.out[0] = desc(KILN_F32, 2, (const int64_t[]){ ln[k][0], ln[k][1] }, 0);
			op.i[1] = 1, op.i[2] = ln[k][0], op.i[3] = ln[k][1], op.i[4] = ln[k][2];
			op.i[8] = u8, op.f[0] = 0.05;
			if (k == 1)
				op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
			q_case(&c, &op, (int64_t)ln[k][0] * ln[k][2], (int64_t)ln[k][1] * ln[k][2],
			       (int64_t)ln[k][0] * ln[k][1]);
		}
	cpu_close(&c);
}
END_TEST

static Suite *make_cuda_host_suite(void)
{
	Suite *s = suite_create("cuda_host");
	check_add_case(s, "kern", 60, NULL, NULL,
		       (const TTest *[]){ test_bf16_round, test_dropout_mask, test_cat_geom,
					  test_reorder_geom, test_lamb_slots, test_err_message,
					  test_int8_maps, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cuda_host_suite };
