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

static struct kiln_tensor_desc t4(int dt, int64_t a, int64_t b, int64_t c, int64_t d, int layout)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = dt, t.ndim = 4, t.layout = layout;
	t.dims[0] = a, t.dims[1] = b, t.dims[2] = c, t.dims[3] = d;
	return t;
}

/* op `type` of geometry q; x, y in dt, w in dt (f32 for the weight
 * gradient), bias f32 */
static void conv_op(struct kiln_op *op, int type, const struct conv_g *q, int nhwc, int dt)
{
	const int L = nhwc ? KILN_NHWC : KILN_NCHW;
	const int OH = (q->H + 2 * q->ph - q->dh * (q->KH - 1) - 1) / q->sh + 1;
	const int OW = (q->W + 2 * q->pw - q->dw * (q->KW - 1) - 1) / q->sw + 1;
	const struct kiln_tensor_desc x = t4(dt, q->N, q->C, q->H, q->W, L);
	const struct kiln_tensor_desc y = t4(dt, q->N, q->O, OH, OW, L);
	const struct kiln_tensor_desc w =
		t4(type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_F32 : dt, q->O, q->C / q->g, q->KH, q->KW, KILN_ROW);
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

int main(void)
{
	Suite *s = suite_create("cuda_conv");
	TCase *t = tcase_create("cudnn");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_set_timeout(t, 60);
	tcase_add_loop_test(t, test_descriptors, 0, (int)(sizeof cases / sizeof *cases));
	tcase_add_test(t, test_errors);
	suite_add_tcase(s, t);
	SRunner *r = srunner_create(s);
	srunner_run_all(r, CK_NORMAL);
	const int failed = srunner_ntests_failed(r);
	srunner_free(r);
	return failed ? 1 : 0;
}
