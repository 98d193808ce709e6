/* tests/check_cpu_split.c - the CPU device's split GEMMs (plugins/cpu/
 * gemm.c, split.c): a large GEMM's parts, run by the calling thread and a
 * helper, give the right product (against a double-precision reference);
 * its bytes are the same on teams of 2, 3 and 4 threads and whoever runs
 * which part; and a helper that is late in every part it takes
 * ($KILN_CPU_POOL_LATE_US, a helper descheduled mid-part) does not hold
 * the caller: it runs those parts itself, in about the time of the GEMM.
 * With $KILN_CPU_GEMM_SPLIT=busy, the adaptive team's GEMMs run in parts
 * of rows only while the team is shrunk, with the whole GEMM's bytes
 * ($KILN_CPU_TEAM_FLIP shrinks it every other op).  A helper's buffer of
 * 2 MiB or more is on huge pages (plugins/cpu/hugepage.c), unmapped at
 * the close.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity */
#endif
#include <kiln/kiln.h>

#include <check.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check_main.h"
#include "test_util.h"
#include "smaps.h" /* smaps_hg_bytes, smaps_thp, SMAPS_ASAN */

static struct kiln_registry *reg;

struct gemm {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *plan, *stream, *a, *b, *bias, *c, *ws;
	size_t wsb;
	int64_t M, N, K;
};

static float val(uint32_t i, uint32_t salt) { return test_hash_val(i, salt); }

/* A GEMM on a cpu device of `threads` threads: C[M,N] = op(A) op(B) + bias
 * (+ C when beta), A and B filled from val(); C starts as val(salt 3). */
static void gemm_open(struct gemm *g, int threads, int64_t M, int64_t N, int64_t K, int ta,
		      int tb, int beta)
{
	char ov[64];
	memset(g, 0, sizeof *g);
	g->M = M, g->N = N, g->K = K;
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	ck_assert(kiln_config_new(&g->cfg) == 0);
	ck_assert(kiln_config_override(g->cfg, ov) == 0);
	ck_assert_msg(kiln_device_open(reg, g->cfg, "cpu", 0, &g->dev) == 0, "%s", kiln_last_error());
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.flags = beta ? KILN_OPF_ACCUMULATE : 0;
	op.n_in = 3;
	op.n_out = 1;
	const int64_t da[2] = { ta ? K : M, ta ? M : K }, db[2] = { tb ? N : K, tb ? K : N },
		      dc[2] = { M, N }, dbias[1] = { N };
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 2, da);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 2, db);
	kiln_tensor_desc_init(&op.in[2], KILN_F32, 1, dbias);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 2, dc);
	op.i[0] = ta, op.i[1] = tb, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = 1.0;
	ck_assert_msg(kiln_device_prepare(g->dev, &op, &g->plan, &g->wsb) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(g->dev, &g->stream) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)(M * K) * 4, &g->a) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)(K * N) * 4, &g->b) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)N * 4, &g->bias) == 0);
	ck_assert(kiln_device_alloc(g->dev, (size_t)(M * N) * 4, &g->c) == 0);
	if (g->wsb)
		ck_assert(kiln_device_alloc(g->dev, g->wsb, &g->ws) == 0);
	for (int64_t i = 0; i < M * K; i++)
		((float *)g->a)[i] = val((uint32_t)i, 1);
	for (int64_t i = 0; i < K * N; i++)
		((float *)g->b)[i] = val((uint32_t)i, 2);
	for (int64_t i = 0; i < N; i++)
		((float *)g->bias)[i] = val((uint32_t)i, 4);
}

/* Run it `times` times from C = val(salt 3); the seconds of the slowest. */
static double gemm_run(struct gemm *g, int times)
{
	struct kiln_op_args args = { .in = { g->a, g->b, g->bias }, .out = { g->c },
				     .workspace = g->ws, .workspace_bytes = g->wsb };
	double worst = 0;
	for (int t = 0; t < times; t++) {
		for (int64_t i = 0; i < g->M * g->N; i++)
			((float *)g->c)[i] = val((uint32_t)i, 3);
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ck_assert_msg(kiln_device_run(g->dev, g->plan, &args, g->stream) == 0, "%s",
			      kiln_last_error());
		ck_assert(kiln_device_stream_sync(g->dev, g->stream) == 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
		worst = s > worst ? s : worst;
	}
	return worst;
}

static void gemm_close(struct gemm *g)
{
	kiln_device_free(g->dev, g->a);
	kiln_device_free(g->dev, g->b);
	kiln_device_free(g->dev, g->bias);
	kiln_device_free(g->dev, g->c);
	kiln_device_free(g->dev, g->ws);
	kiln_device_plan_free(g->dev, g->plan);
	kiln_device_stream_destroy(g->dev, g->stream);
	kiln_device_close(g->dev);
	kiln_config_free(g->cfg);
}

/* The product against a double-precision reference, relative to the sum
 * of the terms' magnitudes.  ck_abort_msg on a mismatch only: Check
 * records every ck_assert it passes. */
static void check_product(const struct gemm *g, int ta, int tb, int beta)
{
	const float *A = g->a, *B = g->b, *C = g->c, *bias = g->bias;
	const int64_t M = g->M, N = g->N, K = g->K;
	for (int64_t m = 0; m < M; m++)
		for (int64_t n = 0; n < N; n++) {
			double s = bias[n] + (beta ? val((uint32_t)(m * N + n), 3) : 0), mag = fabs(s);
			for (int64_t k = 0; k < K; k++) {
				const double x = (double)(ta ? A[k * M + m] : A[m * K + k]) *
						 (double)(tb ? B[n * K + k] : B[k * N + n]);
				s += x;
				mag += fabs(x);
			}
			if (!(fabs(C[m * N + n] - s) <= 1e-5 * mag + 1e-6))
				ck_abort_msg("M=%lld N=%lld K=%lld tA=%d tB=%d beta=%d: C[%lld,%lld] = %.7g, want %.7g",
				      (long long)M, (long long)N, (long long)K, ta, tb, beta,
				      (long long)m, (long long)n, C[m * N + n], s);
		}
}

/* shapes split by columns (3 parts of 112, 112, 96) and by rows (5 parts:
 * 4 of 64 and 44) */
static const int64_t shapes[][3] = { { 96, 320, 300 }, { 300, 200, 200 } };

START_TEST(test_split_product)
{
	for (int s = 0; s < 2; s++)
		for (int t = 0; t < 8; t++) {
			struct gemm g;
			gemm_open(&g, 2, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1,
				  t >> 2);
			gemm_run(&g, 3);
			check_product(&g, t & 1, (t >> 1) & 1, t >> 2);
			gemm_close(&g);
		}
}
END_TEST

/* The bytes of shape s (tA, tB, beta from t) on a team of `threads`. */
static float *bytes_on(int threads, int s, int t)
{
	struct gemm g;
	const size_t n = (size_t)(shapes[s][0] * shapes[s][1]);
	float *out = malloc(n * sizeof *out);
	gemm_open(&g, threads, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1, t >> 2);
	gemm_run(&g, 5);
	memcpy(out, g.c, n * sizeof *out);
	gemm_close(&g);
	return out;
}

START_TEST(test_split_bytes_any_team)
{
	for (int s = 0; s < 2; s++)
		for (int t = 0; t < 8; t += 3) {
			float *two = bytes_on(2, s, t);
			for (int threads = 3; threads <= 4; threads++) {
				float *other = bytes_on(threads, s, t);
				ck_assert_msg(!memcmp(two, other, sizeof(float) * (size_t)(shapes[s][0] * shapes[s][1])),
					      "shape %d case %d: other bytes on %d threads than on 2", s, t,
					      threads);
				free(other);
			}
			free(two);
		}
}
END_TEST

/* A helper that sleeps 2 s in every part it takes: the caller runs those
 * parts itself and returns in far less than that (under 1 s even on a
 * machine at load 25, where a run took 0.41 s against a 0.3 s sleep), with the same
 * bytes; the late helper's copies are dropped (the product stays right
 * after it wakes). */
START_TEST(test_late_helper)
{
	for (int s = 0; s < 2; s++) {
		const int t = 4; /* accumulate: a dropped copy must not add twice */
		const size_t bytes = sizeof(float) * (size_t)(shapes[s][0] * shapes[s][1]);
		float *want = bytes_on(2, s, t);
		setenv("KILN_CPU_POOL_LATE_US", "2000000", 1);
		struct gemm g;
		gemm_open(&g, 2, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, (t >> 1) & 1, t >> 2);
		unsetenv("KILN_CPU_POOL_LATE_US");
		const double worst = gemm_run(&g, 3);
		ck_assert_msg(worst < 1.0, "shape %d: a run took %.3f s: the caller waited for the late helper",
			      s, worst);
		ck_assert(!memcmp(want, g.c, bytes));
		struct timespec nap = { 2, 100000000 }; /* the helper wakes, finds its part taken */
		nanosleep(&nap, NULL);
		ck_assert(!memcmp(want, g.c, bytes));
		check_product(&g, t & 1, (t >> 1) & 1, t >> 2);
		gemm_close(&g);
		free(want);
	}
}
END_TEST

/* The debug lines of the cpu device that say a busy split was made. */
struct busy_log {
	int same, other;
};

static void busy_sink(void *user, int level, const char *who, const char *msg)
{
	struct busy_log *l = user;
	(void)level;
	if (strcmp(who, "cpu") || !strstr(msg, "split for a busy team"))
		return;
	if (strstr(msg, "the same bytes"))
		l->same++;
	else
		l->other++;
}

/* The run-time choice (plugins/cpu/dnnteam.c, cpu_gemm_split_busy): with
 * $KILN_CPU_GEMM_SPLIT=busy and the adaptive team (run.threads = 0), a
 * GEMM runs whole while the team is at its opening size and in parts of
 * rows while it is shrunk.  The flip hook shrinks and restores the team
 * every op: each run gives the bytes of the fixed 2-thread team's whole
 * GEMM, the product is right, and the busy split was made and kept. */
START_TEST(test_busy_split_same_bytes)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) < 2)
		return; /* run.threads = 0 opens one thread: nothing adapts */
	/* the MLP's fc1 forward (2 parts of 64 rows) and weight gradient
	 * (8 parts), and 5 parts of a shape whose last part is shorter */
	static const int64_t busy[][5] = { { 128, 512, 784, 0, 1 }, { 512, 784, 128, 1, 0 },
					   { 300, 200, 200, 0, 0 } };
	setenv("KILN_CPU_GEMM_SPLIT", "busy", 1);
	for (int s = 0; s < 3; s++)
		for (int beta = 0; beta < 2; beta++) {
			const int64_t M = busy[s][0], N = busy[s][1], K = busy[s][2];
			const int ta = (int)busy[s][3], tb = (int)busy[s][4];
			const size_t bytes = sizeof(float) * (size_t)(M * N);
			struct gemm g;
			gemm_open(&g, 2, M, N, K, ta, tb, beta); /* threads set: whole */
			gemm_run(&g, 1);
			float *want = malloc(bytes);
			memcpy(want, g.c, bytes);
			gemm_close(&g);

			struct busy_log log = { 0, 0 };
			const int level = kiln_log_get_level();
			kiln_log_set_sink(busy_sink, &log);
			kiln_log_set_level(KILN_LOG_DEBUG);
			setenv("KILN_CPU_TEAM_FLIP", "1", 1);
			gemm_open(&g, 0, M, N, K, ta, tb, beta);
			unsetenv("KILN_CPU_TEAM_FLIP");
			for (int r = 0; r < 6; r++) { /* whole, split, whole, ... */
				gemm_run(&g, 1);
				ck_assert_msg(!memcmp(want, g.c, bytes),
					      "%lld %lld %lld beta %d, run %d: other bytes than the whole GEMM's",
					      (long long)M, (long long)N, (long long)K, beta, r);
			}
			check_product(&g, ta, tb, beta);
			gemm_close(&g);
			kiln_log_set_sink(NULL, NULL);
			kiln_log_set_level(level);
			/* decided once; on AVX-512 oneDNN's sgemm gives these
			 * parts the whole's bytes, so they split; on AVX2 its
			 * blocking depends on M and the parts' bytes differ,
			 * so the GEMM stays whole (the bytes above equal
			 * either way) */
			__builtin_cpu_init();
			const int avx512 = __builtin_cpu_supports("avx512f");
			ck_assert_msg(log.same + log.other == 1 && (!avx512 || log.same == 1),
				      "%lld %lld %lld: busy split made %d times with the same bytes, %d with other (AVX-512: %d)",
				      (long long)M, (long long)N, (long long)K, log.same, log.other, avx512);
			free(want);
		}
}
END_TEST

/* The advised (MADV_HUGEPAGE) bytes of a device buffer of b bytes: its
 * whole 2 MiB blocks, from 2 MiB up (plugins/cpu/hugepage.c) */
static size_t hg_whole(size_t b)
{
	const size_t huge = (size_t)2 << 20;
	return b < huge ? 0 : ((b + 4095) & ~(size_t)4095) & ~(huge - 1);
}

/* The helper's buffer (split.c) is hugepage.c's (session 47; before,
 * posix_memalign's, on 4 KiB pages): a GEMM of 2048 x 1024 in parts of
 * 1024 rows ($KILN_CPU_GEMM_SPLIT=rows:1024) gives the helper a buffer of
 * a part (4 MiB and the part's scratch): the prepare adds its two whole
 * 2 MiB blocks or more to the process's advised mappings (VmFlags hg)
 * beside the device buffers' own, the product is right, and the close
 * unmaps it.  Not checked (said so) without THP or in an
 * AddressSanitizer build. */
START_TEST(test_helper_buffer_huge)
{
	if (!smaps_thp() || SMAPS_ASAN) {
		printf("split: the helper's buffer on huge pages not checked (%s)\n",
		       SMAPS_ASAN ? "an AddressSanitizer build" : "no THP");
		return;
	}
	const int64_t M = 2048, N = 1024, K = 16;
	const size_t h0 = smaps_hg_bytes();
	setenv("KILN_CPU_GEMM_SPLIT", "rows:1024", 1);
	struct gemm g;
	gemm_open(&g, 2, M, N, K, 0, 0, 0);
	setenv("KILN_CPU_GEMM_SPLIT", "auto", 1);
	const size_t h1 = smaps_hg_bytes();
	const size_t dev = hg_whole((size_t)(M * K) * 4) + hg_whole((size_t)(K * N) * 4) +
			   hg_whole((size_t)(M * N) * 4) + hg_whole(g.wsb);
	gemm_run(&g, 1);
	check_product(&g, 0, 0, 0);
	gemm_close(&g);
	const size_t h2 = smaps_hg_bytes();
	printf("split: advised bytes %zu before, %zu with the plan (device buffers %zu of them), %zu after "
	       "the close\n",
	       h0, h1, dev, h2);
	ck_assert_msg(h1 >= h0 + dev + ((size_t)4 << 20),
		      "the helper's 4 MiB buffer is not advised: %zu advised bytes more, %zu of them the device "
		      "buffers'",
		      h1 - h0, dev);
	ck_assert_msg(h2 <= h0, "%zu advised bytes still mapped after the close (%zu before)", h2, h0);
}
END_TEST

static Suite *make_cpu_split_suite(void)
{
	Suite *s = suite_create("cpu_split");
	check_add_case(s, "split", 60, NULL, NULL, (const TTest *[]){
		test_split_product, test_split_bytes_any_team, test_late_helper,
		test_busy_split_same_bytes, test_helper_buffer_huge, NULL });
	return s;
}

/* the split is off unless asked for (plugins/cpu/threads.h) */
static int split_on(void)
{
	setenv("KILN_CPU_GEMM_SPLIT", "auto", 0);
	return 0;
}

static const struct check_main check_suite = { .suite = make_cpu_split_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1,
					       .setup = split_on };
