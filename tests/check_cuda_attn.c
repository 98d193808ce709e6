/* tests/check_cuda_attn.c - the host-only logic of the CUDA device's fused
 * attention through cuDNN (plugins/cuda/attn_map.c), on any machine:
 *
 *   layout    every element of cuDNN's [B,H,T,D] views (q, k, v, their
 *             transposes, o / dO, stats, the scores and their transpose,
 *             dq_acc) addresses the element kiln's [B,T,3C] qkv, [B,T,C]
 *             y and [B,H,T] lse put there (the address formulas of
 *             attn.cu and kiln/ops.h), for odd T and several head counts;
 *             the byte alignments of the offset views
 *   support   the decision between cuDNN and kiln's kernel: each refusal
 *             with its reason (f32, dropout, accumulation, compute
 *             capability, cuDNN version, head dim), and the shapes cuDNN
 *             takes (GPT-2's D = 64, D = 128, odd T)
 *   mode      KILN_CUDA_ATTN's values and a bad one
 *   key       the plan cache's key tells apart every property of the graph
 *   workspace the backward's softmax_sum and dq_acc after cuDNN's part,
 *             aligned, not overlapping
 */
#include "attn_map.h"
#include "attn_op.h"

#include <check.h>
#include "check_main.h"
#include <stdio.h>
#include <string.h>

/* An ATTENTION (bwd 0) or ATTENTION_BWD op of qkv [B,T,3C], H heads, causal */
static struct kiln_op attn(int bwd, int dt, int64_t B, int64_t T, int64_t C, int64_t H)
{
	return test_attn_op(bwd, dt, B, T, C, H, 1);
}

START_TEST(test_layout)
{
	static const int64_t shapes[][4] = { /* B, T, C, H */
		{ 2, 37, 128, 2 }, { 1, 5, 24, 3 }, { 3, 1, 64, 1 }, { 2, 9, 256, 2 } };
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		const int64_t B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], H = shapes[s][3];
		const int64_t D = C / H;
		struct kiln_op op = attn(1, KILN_BF16, B, T, C, H);
		struct cuda_sdpa_geom g;
		char why[200];
		ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
		ck_assert(g.bwd && g.D == D && g.esize == 2 && g.causal && g.scale == 0.125);
		const struct cuda_sdpa_view *part[3] = { &g.q, &g.k, &g.v };
		const struct cuda_sdpa_view *tr[3] = { NULL, &g.kt, &g.vt };
		for (int64_t b = 0; b < B; b++)
			for (int64_t h = 0; h < H; h++)
				for (int64_t t = 0; t < T; t++)
					for (int64_t d = 0; d < D; d++) {
						const int64_t tok = (b * T + t) * C + h * D + d;
						for (int k = 0; k < 3; k++) {
							/* attn.cu's ATTN_QKV + k*C */
							const int64_t want = (b * T + t) * 3 * C + k * C + h * D + d;
							ck_assert_int_eq(cuda_sdpa_at(part[k], b, h, t, d), want);
							if (tr[k]) /* [B,H,D,T] */
								ck_assert_int_eq(cuda_sdpa_at(tr[k], b, h, d, t), want);
						}
						ck_assert_int_eq(cuda_sdpa_at(&g.o, b, h, t, d), tok);
						ck_assert_int_eq(cuda_sdpa_at(&g.dq_acc, b, h, t, d),
								 ((b * H + h) * T + t) * D + d);
					}
		for (int64_t b = 0; b < B; b++)
			for (int64_t h = 0; h < H; h++)
				for (int64_t i = 0; i < T; i++) {
					ck_assert_int_eq(cuda_sdpa_at(&g.stats, b, h, i, 0), (b * H + h) * T + i);
					for (int64_t j = 0; j < T; j++) {
						const int64_t e = ((b * H + h) * T + i) * T + j;
						ck_assert_int_eq(cuda_sdpa_at(&g.s, b, h, i, j), e);
						ck_assert_int_eq(cuda_sdpa_at(&g.st, b, h, j, i), e);
					}
				}
		ck_assert_int_eq(g.kt.dims[2], D);
		ck_assert_int_eq(g.kt.dims[3], T);
		ck_assert_int_eq(g.stats.dims[3], 1);
	}
}
END_TEST

START_TEST(test_align)
{
	struct cuda_sdpa_geom g;
	char why[200];
	/* bf16, C = 128: k at 256 bytes, v at 512: 16-byte aligned */
	struct kiln_op op = attn(0, KILN_BF16, 2, 7, 128, 2);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	ck_assert_int_eq(g.q.align, 16);
	ck_assert_int_eq(g.k.align, 16);
	ck_assert_int_eq(g.v.align, 16);
	/* bf16, C = 12 (D = 4): k at 24 bytes (8), v at 48 (16) */
	op = attn(0, KILN_BF16, 1, 3, 12, 3);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	ck_assert_int_eq(g.k.align, 8);
	ck_assert_int_eq(g.v.align, 16);
	ck_assert_int_eq(g.kt.align, 8);
	/* f16, C = 3: k at 6 bytes (2) */
	op = attn(0, KILN_F16, 1, 3, 3, 1);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	ck_assert_int_eq(g.k.align, 2);
	ck_assert_int_eq(g.v.align, 4);
}
END_TEST

START_TEST(test_geom_errors)
{
	struct cuda_sdpa_geom g;
	char why[200] = "";
	struct kiln_op op = attn(0, KILN_BF16, 1, 4, 12, 3);
	op.i[0] = 5;
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), -1);
	ck_assert_msg(strstr(why, "heads"), "%s", why);
	op = attn(0, KILN_I32, 1, 4, 12, 3);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), -1);
	ck_assert_msg(strstr(why, "floating"), "%s", why);
	op = attn(0, KILN_BF16, 1, 4, 12, 3);
	op.type = KILN_OP_GEMM;
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), -1);
}
END_TEST

/* the decision for op on an H200 (9.0) with cuDNN 9.19.0: 1, or 0 with
 * the reason, which must contain want */
static void decide(const struct kiln_op *op, int cc, size_t ver, const char *want)
{
	struct cuda_sdpa_geom g;
	char why[200] = "";
	ck_assert_int_eq(cuda_sdpa_geom(op, &g, why, sizeof why), 0);
	const int ok = cuda_sdpa_supported(&g, cc, ver, why, sizeof why);
	if (!want)
		ck_assert_msg(ok == 1, "refused: %s", why);
	else
		ck_assert_msg(ok == 0 && strstr(why, want), "want '%s', got %d '%s'", want, ok, why);
}

START_TEST(test_support)
{
	/* taken: GPT-2 124M (C 768, 12 heads: D 64), D 128, odd T, f16, fwd and bwd */
	for (int bwd = 0; bwd < 2; bwd++) {
		struct kiln_op op = attn(bwd, KILN_BF16, 8, 1024, 768, 12);
		decide(&op, 90, 91900, NULL);
		op = attn(bwd, KILN_BF16, 2, 37, 256, 2);
		decide(&op, 90, 91900, NULL);
		op = attn(bwd, KILN_F16, 3, 129, 512, 8);
		decide(&op, 80, 90000, NULL);
		op.i[1] = 0; /* not causal */
		decide(&op, 100, 91002, NULL);
	}
	/* kiln's side (also with the device not asked: cc < 0) */
	struct kiln_op op = attn(0, KILN_F32, 2, 37, 128, 2);
	decide(&op, 90, 91900, "f32");
	decide(&op, -1, 0, "f32");
	op = attn(0, KILN_BF16, 2, 37, 128, 2);
	decide(&op, -1, 0, NULL);
	op = attn(0, KILN_BF16, 2, 37, 128, 2);
	op.f[1] = 0.1;
	decide(&op, 90, 91900, "dropout");
	op = attn(1, KILN_BF16, 2, 37, 128, 2);
	op.flags = KILN_OPF_ACCUMULATE;
	decide(&op, 90, 91900, "accumulating");
	/* cuDNN's */
	op = attn(0, KILN_BF16, 2, 37, 128, 2);
	decide(&op, 75, 91900, "7.5");
	decide(&op, 90, 8907, "cuDNN 8907");
	decide(&op, 90, 91000, "9.10.0");
	decide(&op, 90, 91001, "9.10.0");
	op = attn(0, KILN_BF16, 2, 37, 24, 2); /* D 12 */
	decide(&op, 90, 91900, "head dim 12");
	op = attn(0, KILN_BF16, 2, 37, 272, 1); /* D 272 */
	decide(&op, 90, 91900, "head dim 272");
	op = attn(0, KILN_BF16, 2, 37, 136, 1); /* D 136: a multiple of 8 over 128 */
	decide(&op, 90, 91900, "head dim 136");
}
END_TEST

START_TEST(test_mode)
{
	char why[200] = "";
	ck_assert_int_eq(cuda_attn_mode(NULL, why, sizeof why), CUDA_ATTN_AUTO);
	ck_assert_int_eq(cuda_attn_mode("", why, sizeof why), CUDA_ATTN_AUTO);
	ck_assert_int_eq(cuda_attn_mode("auto", why, sizeof why), CUDA_ATTN_AUTO);
	ck_assert_int_eq(cuda_attn_mode("cudnn", why, sizeof why), CUDA_ATTN_CUDNN);
	ck_assert_int_eq(cuda_attn_mode("kiln", why, sizeof why), CUDA_ATTN_KILN);
	ck_assert_int_eq(cuda_attn_mode("cuDNN", why, sizeof why), -1);
	ck_assert_msg(strstr(why, "KILN_CUDA_ATTN") && strstr(why, "cuDNN"), "%s", why);
}
END_TEST

START_TEST(test_key)
{
	struct cuda_sdpa_geom g;
	char why[200], k0[256], k1[256];
	struct kiln_op op = attn(0, KILN_BF16, 8, 1024, 768, 12);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	cuda_sdpa_key(&g, k0, sizeof k0);
	ck_assert_str_eq(k0, "SDPA fwd bf16 B 8 T 1024 H 12 D 64 causal 1 scale 0.125");
	/* each property changes the key */
	for (int k = 0; k < 7; k++) {
		struct kiln_op o = op;
		switch (k) {
		case 0: o = attn(1, KILN_BF16, 8, 1024, 768, 12); break;
		case 1: o = attn(0, KILN_F16, 8, 1024, 768, 12); break;
		case 2: o = attn(0, KILN_BF16, 4, 1024, 768, 12); break;
		case 3: o = attn(0, KILN_BF16, 8, 1023, 768, 12); break;
		case 4: o = attn(0, KILN_BF16, 8, 1024, 768, 6); break;
		case 5: o.i[1] = 0; break;
		case 6: o.f[0] = 0.1; break;
		}
		ck_assert_int_eq(cuda_sdpa_geom(&o, &g, why, sizeof why), 0);
		cuda_sdpa_key(&g, k1, sizeof k1);
		ck_assert_msg(strcmp(k0, k1), "change %d kept the key %s", k, k1);
	}
	/* the same op, the same key */
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	cuda_sdpa_key(&g, k1, sizeof k1);
	ck_assert_str_eq(k0, k1);
}
END_TEST

START_TEST(test_workspace)
{
	struct cuda_sdpa_geom g;
	char why[200];
	size_t os, od;
	struct kiln_op op = attn(0, KILN_BF16, 2, 37, 128, 2);
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	ck_assert_uint_eq(cuda_sdpa_workspace(&g, 1000, &os, &od), 1000);
	op = attn(1, KILN_BF16, 2, 37, 128, 2); /* rows 2*2*37 = 148, D 64 */
	ck_assert_int_eq(cuda_sdpa_geom(&op, &g, why, sizeof why), 0);
	const size_t total = cuda_sdpa_workspace(&g, 1000, &os, &od);
	ck_assert_uint_eq(os, 1024);
	ck_assert_uint_eq(od, 1024 + 768); /* 148*4 = 592 up to 768 */
	ck_assert_uint_eq(total, od + 148 * 64 * 4);
	ck_assert_uint_eq(cuda_sdpa_workspace(&g, 0, &os, &od), 768 + 148 * 64 * 4);
	ck_assert_uint_eq(os, 0);
}
END_TEST

static Suite *make_cuda_attn_suite(void)
{
	Suite *s = suite_create("cuda_attn");
	check_add_case(s, "map", 60, NULL, NULL, (const TTest *[]){
		test_layout, test_align, test_geom_errors, test_support, test_mode, test_key,
		test_workspace, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cuda_attn_suite };
