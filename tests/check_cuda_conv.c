/* tests/check_cuda_conv.c - the CUDA device's cuDNN convolution
 * descriptors, checked by cuDNN itself on a machine without a GPU.
 *
 * cuDNN's backend API validates a tensor, a convolution and a convolution
 * operation when they are finalized, before any handle or GPU is involved
 * (shapes, strides, data types, attribute types).  cuda_dnn_conv_check
 * (plugins/cuda/cudnn.c) builds exactly the descriptors a plan is built
 * from, stopping before the operation graph (which needs a handle), so
 * every convolution shape of the conformance suite is checked here, in both
 * layouts and the three dtypes, and so are the errors kiln must report as
 * KILN_EINVAL.  Built only when configure found cuDNN.
 */
#include "cuda.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <stdio.h>
#include <string.h>

const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);

static struct cuda_ctx g_c;

static void setup(void)
{
	memset(&g_c, 0, sizeof g_c);
	g_c.host = kiln_host_table();
	kiln_plugin_init(g_c.host); /* the op names of messages */
}

struct conv_g {
	int N, C, O, H, W, KH, KW, sh, sw, ph, pw, dh, dw, g, bias;
};

/* op `type` of geometry q; x, y in dt, w in dt (f32 for the weight
 * gradient), bias f32 */
static void conv_op(struct kiln_op *op, int type, const struct conv_g *q, int nhwc, int dt)
{
	const int L = nhwc ? KILN_NHWC : KILN_NCHW;
	const int OH = (q->H + 2 * q->ph - q->dh * (q->KH - 1) - 1) / q->sh + 1;
	const int OW = (q->W + 2 * q->pw - q->dw * (q->KW - 1) - 1) / q->sw + 1;
	const struct kiln_tensor_desc x = test_desc4(dt, q->N, q->C, q->H, q->W, L);
	const struct kiln_tensor_desc y = test_desc4(dt, q->N, q->O, OH, OW, L);
	const struct kiln_tensor_desc w =
		test_desc4(type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : dt, q->O, q->C / q->g, q->KH,
			   q->KW, KILN_ROW);
	struct kiln_tensor_desc b;
	memset(&b, 0, sizeof b);
	b.dtype = KILN_F32, b.ndim = 1, b.dims[0] = q->O;
	memset(op, 0, sizeof *op);
	op->type = type;
	op->i[0] = q->sh, op->i[1] = q->sw, op->i[2] = q->ph, op->i[3] = q->pw;
	op->i[4] = q->dh, op->i[5] = q->dw, op->i[6] = q->g;
	if (type == KILN_OP_CONV) {
		op->n_in = 2 + q->bias, op->n_out = 1;
		op->in[0] = x, op->in[1] = w, op->in[2] = b, op->out[0] = y;
	} else if (type == KILN_OP_CONV_BWD_DATA) {
		op->n_in = 2, op->n_out = 1;
		op->in[0] = y, op->in[1] = w, op->out[0] = x;
	} else {
		op->n_in = 2, op->n_out = 1 + q->bias;
		op->in[0] = x, op->in[1] = y, op->out[0] = w, op->out[1] = b;
	}
}

/* the conformance suite's convolutions (tests/check_device.c), and
 * ResNet-50's stem and a bottleneck's 3x3 */
static const struct conv_g cases[] = {
	{ 1, 3, 5, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 },
	{ 3, 4, 6, 13, 13, 3, 3, 2, 2, 1, 1, 1, 1, 2, 1 },
	{ 3, 4, 8, 13, 13, 5, 5, 1, 1, 2, 2, 1, 1, 1, 0 },
	{ 2, 6, 4, 13, 13, 3, 3, 1, 1, 2, 2, 2, 2, 2, 1 },
	{ 3, 8, 16, 7, 7, 1, 1, 2, 2, 0, 0, 1, 1, 1, 1 },
	{ 1, 16, 32, 13, 13, 3, 3, 2, 2, 0, 0, 1, 1, 1, 1 },
	{ 2, 3, 4, 7, 13, 3, 5, 2, 1, 1, 2, 1, 1, 1, 1 },
	{ 2, 8, 8, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1 },
	{ 3, 32, 64, 13, 13, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 },
	{ 4, 16, 16, 10, 10, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 },
	{ 256, 3, 64, 224, 224, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0 },
	{ 256, 64, 64, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0 },
};

START_TEST(test_descriptors)
{
	static const int types[] = { KILN_OP_CONV, KILN_OP_CONV_BWD_DATA, KILN_OP_CONV_BWD_WEIGHTS };
	static const int dts[] = { KILN_F32, KILN_BF16, KILN_F16 };
	const struct conv_g *q = &cases[_i];
	struct kiln_op op;
	for (int t = 0; t < 3; t++)
		for (int nhwc = 0; nhwc < 2; nhwc++)
			for (int k = 0; k < 3; k++) {
				conv_op(&op, types[t], q, nhwc, dts[k]);
				const int fused_too = types[t] == KILN_OP_CONV && q->bias;
				for (int fused = 0; fused <= fused_too; fused++) {
					const kiln_status st = cuda_dnn_conv_check(&g_c, &op, fused);
					ck_assert_msg(st == KILN_OK, "case %d type %d %s dt %d fused %d: %s",
						      _i, types[t], nhwc ? "NHWC" : "NCHW", dts[k], fused,
						      kiln_last_error());
				}
				/* [plugin.cuda] conv_wgrad = lowp's graph: dw in x's dtype */
				if (types[t] == KILN_OP_CONV_BWD_WEIGHTS && dts[k] != KILN_F32) {
					op.out[0].dtype = dts[k];
					ck_assert_msg(cuda_dnn_conv_check(&g_c, &op, 0) == KILN_OK,
						      "case %d %s dt %d, dw in x's dtype: %s", _i,
						      nhwc ? "NHWC" : "NCHW", dts[k], kiln_last_error());
				}
			}
}
END_TEST

/* What kiln must refuse as KILN_EINVAL naming the op: cuDNN's BAD_PARAM
 * (a wrong output size, groups that do not divide O), and the layouts. */
START_TEST(test_errors)
{
	struct conv_g q = { 2, 4, 6, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1 };
	struct kiln_op op;
	conv_op(&op, KILN_OP_CONV, &q, 0, KILN_F32);
	op.out[0].dims[2] = 6; /* OH should be 7 */
	ck_assert_int_eq(cuda_dnn_conv_check(&g_c, &op, 0), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "CONV"), "message: %s", kiln_last_error());
	ck_assert_msg(strstr(kiln_last_error(), "BAD_PARAM"), "message: %s", kiln_last_error());
	q.g = 4; /* O = 6 is not a multiple of 4 groups */
	conv_op(&op, KILN_OP_CONV, &q, 0, KILN_F32);
	ck_assert_int_eq(cuda_dnn_conv_check(&g_c, &op, 0), KILN_EINVAL);
	q.g = 1;
	conv_op(&op, KILN_OP_CONV_BWD_DATA, &q, 0, KILN_F32);
	op.out[0].layout = KILN_NHWC; /* mixed layouts */
	ck_assert_int_eq(cuda_dnn_conv_check(&g_c, &op, 0), KILN_EINVAL);
	/* the conformance suite's probe: an empty op is EINVAL, not ENOTSUP */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV;
	ck_assert_int_eq(cuda_dnn_conv_check(&g_c, &op, 0), KILN_EINVAL);
}
END_TEST

/* ops.c's prepare on the host (this program links it): the layout ops'
 * plans.  cuda.c allocates sz[3] bytes of device scratch for every plan
 * whose prepare sets it (the reductions' block partials), so an op that
 * needs none must leave it 0; CONCAT, SPLIT and REORDER keep their element
 * size in cols, where kernels.cu reads it. */
static void prep_layout(struct kiln_op *op, int type, int dt)
{
	const int64_t part[2] = { 2, 3 }, whole[2] = { 2, 6 };
	memset(op, 0, sizeof *op);
	op->type = type;
	if (type == KILN_OP_REORDER) {
		op->n_in = op->n_out = 1;
		op->in[0] = test_desc4(dt, 2, 3, 4, 5, KILN_NCHW);
		op->out[0] = test_desc4(dt, 2, 3, 4, 5, KILN_NHWC);
		return;
	}
	const int split = type == KILN_OP_SPLIT;
	struct kiln_tensor_desc *w = split ? &op->in[0] : &op->out[0];
	struct kiln_tensor_desc *pt = split ? op->out : op->in;
	op->n_in = split ? 1 : 2;
	op->n_out = split ? 2 : 1;
	op->i[0] = 1;
	kiln_tensor_desc_init(w, dt, 2, whole);
	kiln_tensor_desc_init(&pt[0], dt, 2, part);
	kiln_tensor_desc_init(&pt[1], dt, 2, part);
}

START_TEST(test_layout_plans)
{
	static const int types[] = { KILN_OP_CONCAT, KILN_OP_SPLIT, KILN_OP_REORDER };
	static const int dts[] = { KILN_F32, KILN_BF16, KILN_U8, KILN_I64 };
	static const int64_t es[] = { 4, 2, 1, 8 };
	for (int t = 0; t < 3; t++)
		for (int k = 0; k < 4; k++) {
			struct cuda_plan p;
			memset(&p, 0, sizeof p);
			prep_layout(&p.op, types[t], dts[k]);
			ck_assert_msg(cuda_ops_prepare(&g_c, &p) == KILN_OK, "type %d dt %d: %s",
				      types[t], dts[k], kiln_last_error());
			ck_assert_msg(p.sz[3] == 0, "type %d dt %d: asks for %lld bytes of scratch",
				      types[t], dts[k], (long long)p.sz[3]);
			ck_assert_int_eq(p.cols, es[k]);
			ck_assert_ptr_nonnull(p.launch);
		}
	/* REORDER's geometry: 2 samples of a [3, 20] NCHW matrix */
	struct cuda_plan p;
	memset(&p, 0, sizeof p);
	prep_layout(&p.op, KILN_OP_REORDER, KILN_F32);
	ck_assert_int_eq(cuda_ops_prepare(&g_c, &p), KILN_OK);
	ck_assert_int_eq(p.sz[0], 2);
	ck_assert_int_eq(p.sz[1], 3);
	ck_assert_int_eq(p.sz[2], 20);
	ck_assert_int_eq(p.n, 120);
}
END_TEST

static struct kiln_tensor_desc tdesc(int dt, int ndim, const int64_t *dims, int layout)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = dt, t.ndim = ndim, t.layout = layout;
	for (int i = 0; i < ndim; i++)
		t.dims[i] = dims[i];
	return t;
}

/* cuda_dnn_prepare of op (no GPU is touched for BN and pooling) */
static kiln_status dnn_prepare(const struct kiln_op *op)
{
	struct cuda_plan p;
	memset(&p, 0, sizeof p);
	p.op = *op;
	return cuda_dnn_prepare(&g_c, &p);
}

/* The batch-norm kernels read and write x, y, dy and dx in x's dtype and
 * every per-channel tensor as f32: prepare must refuse any other mix
 * (an f32 y beside a bf16 x was taken and written as bf16). */
START_TEST(test_bn_dtypes)
{
	const int64_t x4[4] = { 2, 3, 4, 4 }, x2[2] = { 2, 3 }, c1[1] = { 3 }, c2[2] = { 2, 3 };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_TRAIN, op.n_in = 3, op.n_out = 4;
	op.f[0] = 1e-5, op.f[1] = 0.1;
	op.in[0] = tdesc(KILN_BF16, 4, x4, KILN_NCHW);
	op.in[1] = op.in[2] = tdesc(KILN_F32, 1, c1, KILN_ROW);
	op.out[0] = tdesc(KILN_BF16, 4, x4, KILN_NCHW);
	op.out[1] = tdesc(KILN_F32, 2, c2, KILN_ROW);
	op.out[2] = op.out[3] = tdesc(KILN_F32, 1, c1, KILN_ROW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_OK);
	op.out[0].dtype = KILN_F32; /* y f32, x bf16 */
	ck_assert_int_eq(dnn_prepare(&op), KILN_ENOTSUP);
	op.out[0].dtype = KILN_BF16;
	op.in[1].dtype = KILN_BF16; /* gamma */
	ck_assert_int_eq(dnn_prepare(&op), KILN_ENOTSUP);

	/* BN_BWD on 2-d x: dy f32 beside a bf16 x; saved [2, C] in bf16 */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_BWD, op.n_in = 4, op.n_out = 3;
	op.in[0] = op.in[1] = tdesc(KILN_BF16, 2, x2, KILN_ROW);
	op.in[2] = tdesc(KILN_F32, 1, c1, KILN_ROW);
	op.in[3] = tdesc(KILN_F32, 2, c2, KILN_ROW);
	op.out[0] = tdesc(KILN_BF16, 2, x2, KILN_ROW);
	op.out[1] = op.out[2] = tdesc(KILN_F32, 1, c1, KILN_ROW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_OK);
	op.in[1].dtype = KILN_F32;
	ck_assert_int_eq(dnn_prepare(&op), KILN_ENOTSUP);
	op.in[1].dtype = KILN_BF16;
	op.in[3].dtype = KILN_BF16;
	ck_assert_int_eq(dnn_prepare(&op), KILN_ENOTSUP);

	/* BN_STATS' out0 and BN_BWD_REDUCE's out0 are f32 statistics */
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_STATS, op.n_in = 1, op.n_out = 1;
	op.in[0] = tdesc(KILN_F16, 4, x4, KILN_NHWC);
	op.out[0] = tdesc(KILN_F32, 2, c2, KILN_ROW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_OK);
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_BN_BWD_REDUCE, op.n_in = 3, op.n_out = 3;
	op.in[0] = op.in[1] = tdesc(KILN_F16, 4, x4, KILN_NHWC);
	op.in[2] = tdesc(KILN_F32, 2, c2, KILN_ROW);
	op.out[0] = op.out[1] = tdesc(KILN_F32, 1, c1, KILN_ROW);
	op.out[2] = tdesc(KILN_F32, 2, c2, KILN_ROW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_OK);
}
END_TEST

/* Max pooling's backward recomputes each window's maximum from in2 with
 * dx's geometry: an in2 of another shape or layout would be read out of
 * bounds, so prepare refuses it. */
START_TEST(test_pool_bwd_x)
{
	const int64_t xd[4] = { 1, 2, 6, 6 }, yd[4] = { 1, 2, 3, 3 }, xs[4] = { 1, 2, 6, 5 };
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_POOL_BWD, op.n_in = 3, op.n_out = 1;
	op.i[0] = KILN_POOL_MAX, op.i[1] = op.i[2] = 2, op.i[3] = op.i[4] = 2;
	op.in[0] = tdesc(KILN_F32, 4, yd, KILN_NCHW);
	op.in[2] = tdesc(KILN_F32, 4, xd, KILN_NCHW);
	op.out[0] = tdesc(KILN_F32, 4, xd, KILN_NCHW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_OK);
	op.in[2] = tdesc(KILN_F32, 4, xs, KILN_NCHW);
	ck_assert_int_eq(dnn_prepare(&op), KILN_EINVAL);
	op.in[2] = tdesc(KILN_F32, 4, xd, KILN_NHWC);
	ck_assert_int_eq(dnn_prepare(&op), KILN_EINVAL);
}
END_TEST

/* The slices of a per-channel (or per-column) sum: NCHW planes as before
 * (M / 4096, 1..64); rows (NHWC, [N, C], the column sums) about 1,024
 * blocks of 32 channels, slices of at least 64 rows, 1..1024 slices. */
START_TEST(test_slices)
{
	ck_assert_int_eq(cuda_chan_slices(100, 64, 0), 1);
	ck_assert_int_eq(cuda_chan_slices(4096 * 10, 64, 0), 10);
	ck_assert_int_eq(cuda_chan_slices(802816, 64, 0), 64);
	/* ResNet-50's layer1 batch norms (N 256, 56 x 56): 2 and 8 tiles */
	ck_assert_int_eq(cuda_chan_slices(802816, 64, 1), 512);
	ck_assert_int_eq(cuda_chan_slices(802816, 256, 1), 128);
	/* GPT-2's layernorm and bias gradients, 8,192 rows: 24 and 96 tiles */
	ck_assert_int_eq(cuda_chan_slices(8192, 768, 1), 43);
	ck_assert_int_eq(cuda_chan_slices(8192, 3072, 1), 11);
	/* few rows: at least 64 a slice; one slice under 128 */
	ck_assert_int_eq(cuda_chan_slices(200, 8, 1), 3);
	ck_assert_int_eq(cuda_chan_slices(127, 8, 1), 1);
	ck_assert_int_eq(cuda_chan_slices(1, 1, 1), 1);
	ck_assert_int_eq(cuda_chan_slices(0, 5, 1), 1);
	for (int64_t M = 1; M < 5000000; M = M * 3 + 1)
		for (int64_t C = 1; C < 5000; C = C * 5 + 3) {
			const int k = cuda_chan_slices(M, C, 1);
			ck_assert(k >= 1 && k <= 1024);
			ck_assert(k == 1 || M / k >= 64);
		}
}
END_TEST

/* A config not validated against the registry has no [plugin.cuda]
 * defaults: open keeps its own (it failed with KILN_ENOTFOUND and no
 * message). */
START_TEST(test_open_unvalidated)
{
	struct kiln_config *cfg = NULL;
	ck_assert_int_eq(kiln_config_new(&cfg), KILN_OK);
	ck_assert_msg(cuda_dnn_open(&g_c, cfg) == KILN_OK, "%s", kiln_last_error());
	cuda_dnn_close(&g_c);
	ck_assert_int_eq(kiln_config_override(cfg, "plugin.cuda.workspace_mb=x"), KILN_OK);
	ck_assert_int_eq(cuda_dnn_open(&g_c, cfg), KILN_ECONFIG); /* a bad value still fails */
	cuda_dnn_close(&g_c);
	kiln_config_free(cfg);
}
END_TEST

static Suite *make_cuda_conv_suite(void)
{
	Suite *s = suite_create("cuda_conv");
	TCase *t = tcase_create("cudnn");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_set_timeout(t, 60);
	tcase_add_loop_test(t, test_descriptors, 0, (int)(sizeof cases / sizeof *cases));
	tcase_add_test(t, test_errors);
	tcase_add_test(t, test_bn_dtypes);
	tcase_add_test(t, test_pool_bwd_x);
	tcase_add_test(t, test_open_unvalidated);
	tcase_add_test(t, test_slices);
	suite_add_tcase(s, t);
	check_add_case(s, "ops", 0, setup, NULL, (const TTest *[]){ test_layout_plans, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cuda_conv_suite };
