/* tests/check_cuda_sdpa.c - the CUDA device's cuDNN fused attention
 * (plugins/cuda/sdpa.c), checked by cuDNN itself on a machine without a
 * GPU, and its choice of path.
 *
 *   descriptors  cuda_sdpa_check builds every tensor and operation of the
 *                forward and backward SDPA graphs (the matmuls, the scale,
 *                the causal mask, the softmax with its stats, the
 *                backward's row sums, reshapes and dQ accumulator) and
 *                cuDNN finalizes each: dims and strides that do not chain
 *                (a matmul's inner dims, a reduction's output, a
 *                broadcast), a wrong attribute type or data type fail here.
 *                GPT-2 124M's shape, head dims 64 and 128, odd T, 1 token,
 *                causal and full, bf16 and f16.  The operation graph needs
 *                a handle (a GPU): tests/gpu/run.sh.
 *   order        the operations in the order of cuDNN's documented
 *                pattern (the frontend's SDPA nodes): the causal mask
 *                before the softmax / before the stats are subtracted
 *   notes        the verdict on an engine's numerical notes: reduced-
 *                precision reduction usable second, TF32 on f32 and
 *                non-determinism under deterministic = 1 never
 *   paths        KILN_CUDA_ATTN: kiln forces attn.cu's kernels (f32 and
 *                bf16 alike), a bad value fails open; cudnn refuses an
 *                f32 op and a dropout op naming why (before any GPU call);
 *                auto gives f32 to kiln's kernel.
 * Built only when configure found cuDNN.
 */
#include "cuda.h"
#include "dnn_be.h"
#include "attn_op.h"

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);

static struct cuda_ctx g_c;

static void setup(void)
{
	memset(&g_c, 0, sizeof g_c);
	g_c.host = kiln_host_table();
	kiln_plugin_init(g_c.host); /* the op names of messages */
}

/* B, T, C, H */
static const int64_t shapes[][4] = {
	{ 8, 1024, 768, 12 }, /* GPT-2 124M: D 64 */
	{ 2, 37, 128, 2 },    /* odd T, D 64 */
	{ 2, 37, 256, 2 },    /* D 128 */
	{ 3, 129, 512, 8 },   /* D 64, T one past a tile */
	{ 2, 1, 64, 1 },      /* one token */
};

START_TEST(test_descriptors)
{
	const int64_t *s = shapes[_i];
	for (int bwd = 0; bwd < 2; bwd++)
		for (int causal = 0; causal < 2; causal++)
			for (int dt = KILN_BF16; dt <= KILN_F16; dt++) {
				struct kiln_op op = test_attn_op(bwd, dt, s[0], s[1], s[2], s[3], causal);
				const kiln_status st = cuda_sdpa_check(&g_c, &op, NULL, 0);
				ck_assert_msg(st == KILN_OK, "B %lld T %lld C %lld H %lld bwd %d causal %d dt %d: %s",
					      (long long)s[0], (long long)s[1], (long long)s[2],
					      (long long)s[3], bwd, causal, dt, kiln_last_error());
			}
}
END_TEST

/* prepare through ops.c with KILN_CUDA_ATTN = mode: the status, the plan */
static kiln_status prepare(const char *mode, const struct kiln_op *op, struct cuda_plan *p)
{
	setenv("KILN_CUDA_ATTN", mode, 1);
	kiln_status st = cuda_dnn_open(&g_c, NULL);
	unsetenv("KILN_CUDA_ATTN");
	if (st)
		return st;
	memset(p, 0, sizeof *p);
	p->op = *op;
	st = cuda_ops_prepare(&g_c, p);
	cuda_dnn_close(&g_c);
	return st;
}

START_TEST(test_paths)
{
	struct cuda_plan p;
	struct kiln_op f32 = test_attn_op(1, KILN_F32, 2, 37, 128, 2, 1);
	struct kiln_op bf16 = test_attn_op(0, KILN_BF16, 2, 37, 128, 2, 1);
	/* kiln: attn.cu's kernels, f32 only */
	ck_assert_msg(prepare("kiln", &f32, &p) == KILN_OK, "%s", kiln_last_error());
	ck_assert(p.launch == cuda_launch_attention_bwd && !p.sdpa);
	ck_assert_uint_eq(p.workspace, 2 * 2 * 37 * 4);
	ck_assert_msg(prepare("kiln", &bf16, &p) == KILN_OK, "%s", kiln_last_error());
	ck_assert(p.launch == cuda_launch_attention && !p.sdpa && p.workspace == 0);
	struct kiln_op bad = bf16;
	bad.out[1].dtype = KILN_BF16; /* lse must be f32 (the core checks it first) */
	ck_assert_int_eq(prepare("kiln", &bad, &p), KILN_ENOTSUP);
	ck_assert_msg(strstr(kiln_last_error(), "f32 lse"), "%s", kiln_last_error());
	/* auto: f32 is kiln's kernel's */
	ck_assert_msg(prepare("auto", &f32, &p) == KILN_OK, "%s", kiln_last_error());
	ck_assert(p.launch == cuda_launch_attention_bwd);
	/* cudnn: f32 refused, the reason named, before any GPU call */
	ck_assert_int_eq(prepare("cudnn", &f32, &p), KILN_ENOTSUP);
	ck_assert_msg(strstr(kiln_last_error(), "KILN_CUDA_ATTN = cudnn") &&
		      strstr(kiln_last_error(), "f32 tensors"), "%s", kiln_last_error());
	struct kiln_op drop = bf16;
	drop.f[1] = 0.1;
	drop.n_in = 2;
	kiln_tensor_desc_init(&drop.in[1], KILN_I64, 1, (const int64_t[]){ KILN_DROP_CTR });
	ck_assert_int_eq(prepare("cudnn", &drop, &p), KILN_ENOTSUP);
	ck_assert_msg(strstr(kiln_last_error(), "dropout"), "%s", kiln_last_error());
	/* a bad value fails open, naming the variable */
	ck_assert_int_eq(prepare("fast", &f32, &p), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "KILN_CUDA_ATTN"), "%s", kiln_last_error());
}
END_TEST

/* The operations' order, against the cudnn-frontend's SDPA composite
 * nodes (scaled_dot_product_flash_attention.h: forward and backward),
 * whose graphs are the patterns cuDNN's fused engines match: the causal
 * mask comes right after the scale, before the softmax (forward) and
 * before the stats are subtracted (backward). */
START_TEST(test_order)
{
	static const char *const want[2][2] = {
		{ "matmul mul max sub exp sum log add div matmul",
		  "matmul mul index index ge select max sub exp sum log add div matmul" },
		{ "mul sum mul matmul mul sub exp reshape matmul matmul sub mul mul reshape matmul reshape matmul identity",
		  "mul sum mul matmul mul index index ge select sub exp reshape matmul matmul sub mul mul reshape matmul reshape matmul identity" },
	};
	char trace[512];
	for (int bwd = 0; bwd < 2; bwd++)
		for (int causal = 0; causal < 2; causal++) {
			struct kiln_op op = test_attn_op(bwd, KILN_BF16, 2, 37, 128, 2, causal);
			ck_assert_msg(cuda_sdpa_check(&g_c, &op, trace, sizeof trace) == KILN_OK, "%s",
				      kiln_last_error());
			ck_assert_msg(!strcmp(trace, want[bwd][causal]),
				      "bwd %d causal %d: the operations are\n  %s\nwant\n  %s", bwd,
				      causal, trace, want[bwd][causal]);
		}
}
END_TEST

/* The verdict on an engine's numerical notes (dnn_be.h): a reduced-precision
 * reduction alone leaves an engine usable second (the fused attention
 * takes it when nothing else builds), TF32 on f32 tensors and
 * non-determinism under deterministic = 1 never. */
START_TEST(test_notes)
{
	const cudnnBackendNumericalNote_t tc = CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
					  rpr = CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
					  nd = CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
					  dc = CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
	const cudnnBackendNumericalNote_t fused[] = { tc, rpr }, plain[] = { tc }, racy[] = { tc, nd };
	const cudnnBackendNumericalNote_t down[] = { dc };
	ck_assert_int_eq(cuda_dnn_notes_verdict(NULL, 0, 0, 0), DNN_NOTES_OK);
	ck_assert_int_eq(cuda_dnn_notes_verdict(plain, 1, 0, 0), DNN_NOTES_OK);
	ck_assert_int_eq(cuda_dnn_notes_verdict(fused, 2, 0, 0), DNN_NOTES_RPR);
	ck_assert_int_eq(cuda_dnn_notes_verdict(fused, 2, 0, 1), DNN_NOTES_RPR);
	ck_assert_int_eq(cuda_dnn_notes_verdict(fused, 2, 1, 0), DNN_NOTES_NO); /* TF32 on f32 */
	ck_assert_int_eq(cuda_dnn_notes_verdict(plain, 1, 1, 0), DNN_NOTES_NO);
	ck_assert_int_eq(cuda_dnn_notes_verdict(down, 1, 1, 0), DNN_NOTES_NO);
	ck_assert_int_eq(cuda_dnn_notes_verdict(down, 1, 0, 0), DNN_NOTES_OK);
	ck_assert_int_eq(cuda_dnn_notes_verdict(racy, 2, 0, 0), DNN_NOTES_OK);
	ck_assert_int_eq(cuda_dnn_notes_verdict(racy, 2, 0, 1), DNN_NOTES_NO);
}
END_TEST

static Suite *make_cuda_sdpa_suite(void)
{
	Suite *s = suite_create("cuda_sdpa");
	TCase *t = tcase_create("cudnn");
	tcase_add_checked_fixture(t, setup, NULL);
	tcase_set_timeout(t, 60);
	tcase_add_loop_test(t, test_descriptors, 0, (int)(sizeof shapes / sizeof *shapes));
	tcase_add_test(t, test_paths);
	tcase_add_test(t, test_order);
	tcase_add_test(t, test_notes);
	suite_add_tcase(s, t);
	return s;
}

static const struct check_main check_suite = { .suite = make_cuda_sdpa_suite };
