/* tests/check_rng.c - counter-based draws whose coordinates pass 32 bits
 * (session 38), without allocating what such runs would:
 *
 *  - initial weights: element e of a tensor is a function of e whole; a
 *    tensor over 2^32 elements (an embedding of 2^32 + 1) no longer
 *    repeats its first values from element 2^32, and every element below
 *    2^32 draws what it drew before (the PyTorch-match tests' weights);
 *    kiln_param_init_run across the 2^32 boundary is the per-element
 *    draw bit for bit;
 *  - dropout: the CPU device's counter (plugins/cpu/philox.h) takes the
 *    step whole; step s + 2^32 no longer draws step s's mask, and steps
 *    below 2^32 draw the masks they drew before;
 *  - kiln_rng_permutation_tail: the last k entries of an epoch's order
 *    without the whole permutation (the workers = auto probe's order).
 */
#include <check.h>
#include "check_main.h"
#include "graph.h"                  /* struct model_param, kiln_param_init_* */
#include <kiln/ops.h>               /* KILN_DROP_CTR */
#include "../plugins/cpu/philox.h" /* cpu_drop_init, CPU_DROP_SCALE */
#include <Random123/philox.h>       /* the masks' reference */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TWO32 ((int64_t)1 << 32)

static struct model_param param(int init, int layer, int slot, int64_t fan_in)
{
	struct model_param p;
	memset(&p, 0, sizeof p);
	p.init = init, p.layer = layer, p.slot = slot, p.fan_in = fan_in;
	p.numel = TWO32 + 4096; /* (never allocated) */
	return p;
}

/* What main drew for element e < 2^32: the counter (layer << 4 | slot, e). */
static float init_before(const struct model_param *p, uint64_t seed, uint32_t e)
{
	const uint64_t key = (uint64_t)p->layer << 4 | (uint64_t)p->slot;
	if (p->init == KILN_INIT_NORMAL) {
		float u[4];
		kiln_rng_uniform4(seed, KILN_RNG_INIT, key, e, u);
		return 0.02f * sqrtf(-2.0f * logf(1.0f - u[0])) * cosf(6.2831853f * u[1]);
	}
	const float bound = 1.0f / sqrtf((float)p->fan_in);
	return (2.0f * kiln_rng_uniform(seed, KILN_RNG_INIT, key, e) - 1.0f) * bound;
}

START_TEST(test_init_past_2_32)
{
	const int inits[3] = { KILN_INIT_KAIMING_UNIFORM, KILN_INIT_BIAS_UNIFORM, KILN_INIT_NORMAL };
	const struct model_param p = param(inits[_i], 3, 1, 512);
	const uint64_t seed = 0x5eed5eedull;
	/* below 2^32: the values drawn before, bit for bit */
	const int64_t low[6] = { 0, 1, 17, 123456789, TWO32 - 2, TWO32 - 1 };
	for (int k = 0; k < 6; k++) {
		const float a = kiln_param_init_value(&p, seed, low[k]);
		const float b = init_before(&p, seed, (uint32_t)low[k]);
		ck_assert_msg(!memcmp(&a, &b, 4), "init %d element %lld: %a, before %a", inits[_i],
			      (long long)low[k], a, b);
	}
	/* past 2^32: not element e - 2^32 again (equal floats by chance: 64
	 * uniform draws of 2^24 values, a collision once in 2^18) */
	int same = 0;
	for (int64_t e = 0; e < 64; e++) {
		const float lo = kiln_param_init_value(&p, seed, e);
		const float hi = kiln_param_init_value(&p, seed, TWO32 + e);
		const float hi2 = kiln_param_init_value(&p, seed, 2 * TWO32 + e);
		same += lo == hi || hi == hi2 || lo == hi2;
	}
	ck_assert_msg(same == 0, "init %d: %d of 64 elements past 2^32 repeat element e - 2^32",
		      inits[_i], same);
	/* a run across 2^32 (the one init_region draws a tensor with) is the
	 * per-element draw, on both sides */
	enum { N = 100 };
	float v[N];
	kiln_param_init_run(&p, seed, TWO32 - 37, N, v);
	for (int k = 0; k < N; k++) {
		const float want = kiln_param_init_value(&p, seed, TWO32 - 37 + k);
		ck_assert_msg(!memcmp(&v[k], &want, 4), "init %d run element 2^32 - 37 + %d: %a, want %a",
			      inits[_i], k, v[k], want);
	}
}
END_TEST

/* Random123's mask bit for element g at `step` under ops.h's counter. */
static int drop_keep(uint64_t seed, uint32_t layer, uint64_t step, uint64_t g, uint32_t thr)
{
	philox4x32_ctr_t c = { { (uint32_t)g, (uint32_t)(g >> 32),
				 layer ^ (uint32_t)(step >> 32) << 16, (uint32_t)step } };
	philox4x32_key_t k = { { (uint32_t)seed, (uint32_t)(seed >> 32) ^ 0x44524f50u } };
	return (philox4x32_R(10, c, k).v[0] >> 8) >= thr;
}

START_TEST(test_drop_step_past_2_32)
{
	const uint64_t seed = 0x123456789abcdefull;
	const int64_t layer = 11;
	/* below 2^32 the counter's word 2 is the layer, as before */
	const int64_t low[4] = { 0, 5, 0x7fffffff, TWO32 - 1 };
	for (int k = 0; k < 4; k++)
		ck_assert_uint_eq(cpu_drop_word2(layer, low[k]), (uint32_t)layer);
	const int64_t steps[4] = { 5, TWO32 + 5, 2 * TWO32 + 5, ((int64_t)1 << 47) + 5 };
	enum { N = 4096 };
	static float k[4][N];
	for (int s = 0; s < 4; s++) {
		const int64_t ctr[KILN_DROP_CTR] = { steps[s], 0, 1 };
		const struct drop d = cpu_drop_init(seed, layer, ctr, 0.5);
		for (int64_t e = 0; e < N; e++) {
			CPU_DROP_SCALE(k[s][e], e, d);
			ck_assert_int_eq(k[s][e] != 0.0f,
					 drop_keep(seed, (uint32_t)layer, (uint64_t)steps[s], (uint64_t)e, d.thr));
		}
	}
	/* each step its own mask: about half the elements agree, not all */
	for (int a = 0; a < 4; a++)
		for (int b = a + 1; b < 4; b++) {
			int same = 0;
			for (int e = 0; e < N; e++)
				same += (k[a][e] != 0) == (k[b][e] != 0);
			ck_assert_msg(same < N * 0.6, "step %llx and %llx: %d of %d mask bits agree",
				      (unsigned long long)steps[a], (unsigned long long)steps[b], same, N);
		}
}
END_TEST

/* kiln_rng_permutation_tail is the end of kiln_rng_permutation's order,
 * backwards, for any k (k > n: all of it). */
START_TEST(test_permutation_tail)
{
	static const int64_t ns[5] = { 1, 2, 17, 1000, 100003 };
	for (int c = 0; c < 5; c++) {
		const int64_t n = ns[c];
		int64_t *perm = malloc(sizeof(int64_t) * (size_t)n);
		int64_t *tail = malloc(sizeof(int64_t) * (size_t)(n + 3));
		ck_assert(perm && tail);
		for (uint64_t ep = 0; ep < 3; ep++) {
			kiln_rng_permutation(0xabcdefull, ep, perm, n);
			const int64_t ks[4] = { 0, 1, n / 3 + 1, n + 3 };
			for (int q = 0; q < 4; q++) {
				memset(tail, 0xff, sizeof(int64_t) * (size_t)(n + 3));
				ck_assert_int_eq(kiln_rng_permutation_tail(0xabcdefull, ep, n, ks[q], tail), 0);
				const int64_t k = ks[q] < n ? ks[q] : n;
				for (int64_t t = 0; t < k; t++)
					ck_assert_msg(tail[t] == perm[n - 1 - t],
						      "n %lld epoch %llu k %lld: tail[%lld] = %lld, perm[%lld] = %lld",
						      (long long)n, (unsigned long long)ep, (long long)ks[q],
						      (long long)t, (long long)tail[t], (long long)(n - 1 - t),
						      (long long)perm[n - 1 - t]);
				ck_assert_int_eq(tail[k], -1); /* nothing past min(k, n) */
			}
		}
		free(perm), free(tail);
	}
	/* k or n below 0: nothing, at once (before session 38's review a k
	 * below 0 looped forever growing its table) */
	int64_t none[2] = { -7, -7 };
	ck_assert_int_eq(kiln_rng_permutation_tail(1, 0, 5, -1, none), 0);
	ck_assert_int_eq(kiln_rng_permutation_tail(1, 0, -3, 2, none), 0);
	ck_assert(none[0] == -7 && none[1] == -7);
}
END_TEST

static Suite *make_rng_suite(void)
{
	Suite *s = suite_create("rng");
	TCase *tc = tcase_create("init");
	tcase_add_loop_test(tc, test_init_past_2_32, 0, 3);
	suite_add_tcase(s, tc);
	check_add_case(s, "dropout", 30, NULL, NULL, (const TTest *[]){ test_drop_step_past_2_32, NULL });
	check_add_case(s, "permutation", 60, NULL, NULL, (const TTest *[]){ test_permutation_tail, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_rng_suite };
