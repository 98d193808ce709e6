/* tests/check_cpu_gemm_impl.c - the cpu plugin's OpenBLAS f32 GEMM
 * ([plugin.cpu] gemm_impl = openblas; plugins/cpu/gemm.c) against its
 * oneDNN one (gemm_impl = onednn) and a double-precision reference loop:
 * the four transposition cases, writing and accumulating, alpha 1 and
 * 0.5, odd shapes (1 x 1 x 1 up to 130 x 67 x 257), on 1 thread, and on 2
 * split into rows or columns (KILN_CPU_GEMM_SPLIT; unsplit on 2 threads
 * OpenBLAS is not a candidate: oneDNN runs it).
 * That the OpenBLAS plan ran is read from the plugin's debug line for the
 * GEMM ("(OpenBLAS)"); a bias or fused activation keeps oneDNN even when
 * asked for OpenBLAS.  `auto` picks one of the two by timing (whichever
 * wins on this CPU, AVX2 or AVX-512): its result must match the reference
 * either way; the default, `rule`, runs OpenBLAS only on the shapes its
 * rule names, and `[run] deterministic = 1` makes `auto` that rule,
 * untimed.  Skipped (77) when the build has no OpenBLAS or the library
 * loaded is its pthread build (the device refuses gemm_impl = openblas).
 */
#include <kiln/kiln.h>
#include <kiln/plugin.h> /* KILN_COPY_H2D */

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check_main.h"
#include "../plugins/cpu/threads.h" /* CPU_ONE_THREAD_FLOP: smaller GEMMs run on one thread */

static struct kiln_registry *reg;

struct dev {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *stream;
};

/* A cpu device of `threads` with gemm_impl = impl; KILN_ECONFIG when it
 * refuses openblas. */
static kiln_status open_dev(struct dev *d, const char *impl, int threads)
{
	char o[128];
	ck_assert(kiln_config_new(&d->cfg) == 0);
	snprintf(o, sizeof o, "run.threads=%d", threads);
	ck_assert(kiln_config_override(d->cfg, o) == 0);
	snprintf(o, sizeof o, "plugin.cpu.gemm_impl=%s", impl);
	ck_assert(kiln_config_override(d->cfg, o) == 0);
	const kiln_status st = kiln_device_open(reg, d->cfg, "cpu", 0, &d->dev);
	if (st) {
		kiln_config_free(d->cfg);
		return st;
	}
	ck_assert(kiln_device_stream_create(d->dev, &d->stream) == 0);
	return KILN_OK;
}

static void close_dev(struct dev *d)
{
	kiln_device_stream_destroy(d->dev, d->stream);
	kiln_device_close(d->dev);
	kiln_config_free(d->cfg);
}

static struct kiln_tensor_desc td2(int64_t a, int64_t b)
{
	struct kiln_tensor_desc t;
	memset(&t, 0, sizeof t);
	t.dtype = KILN_F32;
	t.ndim = b ? 2 : 1;
	t.dims[0] = a;
	t.dims[1] = b;
	return t;
}

static float val(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

struct gcase {
	int ta, tb, m, n, k, acc, bias, act;
	double alpha;
};

/* c = alpha op(a) op(b) (+ c0) (+ bias) (relu) on d: the result in out. */
static void run_gemm(struct dev *d, const struct gcase *g, const float *a, const float *b,
		     const float *bias, const float *c0, float *out)
{
	const int64_t M = g->m, N = g->n, K = g->k;
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = g->bias ? 3 : 2, op.n_out = 1;
	op.in[0] = g->ta ? td2(K, M) : td2(M, K);
	op.in[1] = g->tb ? td2(N, K) : td2(K, N);
	if (g->bias)
		op.in[2] = td2(N, 0);
	op.out[0] = td2(M, N);
	op.i[0] = g->ta, op.i[1] = g->tb, op.i[2] = M, op.i[3] = N, op.i[4] = K;
	op.f[0] = g->alpha;
	op.flags = (g->acc ? KILN_OPF_ACCUMULATE : 0) | (g->act ? KILN_OPF_ACT : 0);
	op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	void *plan = NULL, *da, *db, *dc, *dbias = NULL, *ws = NULL;
	size_t wsb = 0;
	kiln_status st = kiln_device_prepare(d->dev, &op, &plan, &wsb);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert(kiln_device_alloc(d->dev, 4 * (size_t)(M * K), &da) == 0);
	ck_assert(kiln_device_alloc(d->dev, 4 * (size_t)(K * N), &db) == 0);
	ck_assert(kiln_device_alloc(d->dev, 4 * (size_t)(M * N), &dc) == 0);
	if (g->bias)
		ck_assert(kiln_device_alloc(d->dev, 4 * (size_t)N, &dbias) == 0);
	if (wsb)
		ck_assert(kiln_device_alloc(d->dev, wsb, &ws) == 0);
	ck_assert(kiln_device_copy_async(d->dev, da, a, 4 * (size_t)(M * K), KILN_COPY_H2D, d->stream) == 0);
	ck_assert(kiln_device_copy_async(d->dev, db, b, 4 * (size_t)(K * N), KILN_COPY_H2D, d->stream) == 0);
	ck_assert(kiln_device_copy_async(d->dev, dc, c0, 4 * (size_t)(M * N), KILN_COPY_H2D, d->stream) == 0);
	if (g->bias)
		ck_assert(kiln_device_copy_async(d->dev, dbias, bias, 4 * (size_t)N, KILN_COPY_H2D, d->stream) == 0);
	struct kiln_op_args args = { .in = { da, db, dbias }, .out = { dc }, .workspace = ws,
				     .workspace_bytes = wsb };
	st = kiln_device_run(d->dev, plan, &args, d->stream);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	ck_assert(kiln_device_copy_async(d->dev, out, dc, 4 * (size_t)(M * N), KILN_COPY_D2H, d->stream) == 0);
	ck_assert(kiln_device_stream_sync(d->dev, d->stream) == 0);
	kiln_device_free(d->dev, da), kiln_device_free(d->dev, db), kiln_device_free(d->dev, dc);
	kiln_device_free(d->dev, dbias), kiln_device_free(d->dev, ws);
	kiln_device_plan_free(d->dev, plan);
}

/* The case on d against the reference: |diff| <= 1e-4 (1 + |ref|) K. */
static void check_case(struct dev *d, const struct gcase *g, const char *impl, int threads)
{
	const int M = g->m, N = g->n, K = g->k;
	uint32_t s = (uint32_t)(M * 131 + N * 17 + K + g->ta * 7 + g->tb * 3);
	float *a = malloc(4 * (size_t)(M * K)), *b = malloc(4 * (size_t)(K * N));
	float *c0 = malloc(4 * (size_t)(M * N)), *out = malloc(4 * (size_t)(M * N));
	float bias[300];
	for (int i = 0; i < M * K; i++)
		a[i] = val(&s);
	for (int i = 0; i < K * N; i++)
		b[i] = val(&s);
	for (int i = 0; i < M * N; i++)
		c0[i] = val(&s);
	for (int i = 0; i < N && i < 300; i++)
		bias[i] = val(&s);
	run_gemm(d, g, a, b, bias, c0, out);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double r = 0;
			for (int q = 0; q < K; q++)
				r += (double)(g->ta ? a[q * M + i] : a[i * K + q]) *
				     (double)(g->tb ? b[j * K + q] : b[q * N + j]);
			r *= g->alpha;
			if (g->acc)
				r += c0[i * N + j];
			if (g->bias)
				r += bias[j];
			if (g->act && r < 0)
				r = 0;
			const double e = fabs((double)out[i * N + j] - r);
			ck_assert_msg(e <= 1e-4 * (1 + fabs(r)) * K,
				      "%s, %d threads: tA %d tB %d %dx%dx%d acc %d: [%d,%d] %g, reference %g",
				      impl, threads, g->ta, g->tb, M, N, K, g->acc, i, j,
				      (double)out[i * N + j], r);
		}
	free(a), free(b), free(c0), free(out);
}

static const struct gcase cases[] = {
	{ 0, 0, 37, 53, 29, 0, 0, 0, 1.0 },  { 0, 1, 37, 53, 29, 0, 0, 0, 1.0 },
	{ 1, 0, 37, 53, 29, 0, 0, 0, 1.0 },  { 1, 1, 37, 53, 29, 0, 0, 0, 1.0 },
	{ 0, 0, 1, 1, 1, 0, 0, 0, 1.0 },     { 0, 1, 130, 7, 257, 0, 0, 0, 1.0 },
	{ 1, 0, 67, 130, 9, 1, 0, 0, 1.0 },  { 0, 0, 128, 67, 66, 1, 0, 0, 0.5 },
	{ 1, 0, 10, 256, 128, 0, 0, 0, 0.5 }, { 0, 0, 128, 256, 10, 1, 0, 0, 1.0 },
	/* above CPU_ONE_THREAD_FLOP: a team's op at 2 threads */
	{ 0, 0, 128, 256, 160, 0, 0, 0, 1.0 }, { 1, 0, 256, 200, 96, 1, 0, 0, 1.0 },
	{ 0, 1, 96, 130, 200, 0, 0, 0, 1.0 },
};

/* _i: 0 one thread; 1 two (OpenBLAS only on the GEMMs small enough to
 * run on one thread: oneDNN's threads the others); 2, 3 two, split in
 * rows or columns of 16 (KILN_CPU_GEMM_SPLIT), each part OpenBLAS's */
START_TEST(test_openblas_matches_onednn)
{
	const int threads = _i ? 2 : 1;
	static const char *const split[] = { "", "", "rows:16", "cols:16" };
	struct dev ob, dn;
	if (*split[_i])
		setenv("KILN_CPU_GEMM_SPLIT", split[_i], 1);
	else
		unsetenv("KILN_CPU_GEMM_SPLIT");
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(check_log_sink, NULL);
	ck_assert_msg(open_dev(&dn, "onednn", threads) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(open_dev(&ob, "openblas", threads) == KILN_OK, "%s", kiln_last_error());
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		check_log_clear();
		check_case(&ob, &cases[i], split[_i], threads);
		const struct gcase *g = &cases[i];
		const int one = 2.0 * g->m * g->n * g->k < CPU_ONE_THREAD_FLOP;
		const int parts = _i >= 2 && !one && (_i == 2 ? g->m : g->n) > 16;
		ck_assert_msg(check_log_has("(OpenBLAS)") == (_i == 0 || one || parts),
			      "case %zu, %d threads, split %s: OpenBLAS %d:\n%s", i, threads, split[_i],
			      check_log_has("(OpenBLAS)"), check_log_text());
		if (parts)
			ck_assert_msg(check_log_has(_i == 2 ? "parts of 16 rows" : "parts of 16 columns"),
				      "case %zu not split:\n%s", i, check_log_text());
		check_log_clear();
		check_case(&dn, &cases[i], "onednn", threads);
		ck_assert_msg(!check_log_has("(OpenBLAS)"), "case %zu ran OpenBLAS under onednn:\n%s", i,
			      check_log_text());
	}
	/* a bias or a fused ReLU: oneDNN's epilogue, whatever was asked */
	const struct gcase fused[] = { { 0, 1, 33, 40, 50, 0, 1, 0, 1.0 },
				       { 0, 1, 33, 40, 50, 0, 0, 1, 1.0 } };
	for (int i = 0; i < 2; i++) {
		check_log_clear();
		check_case(&ob, &fused[i], "openblas (fused)", threads);
		ck_assert_msg(!check_log_has("(OpenBLAS)"), "fused case %d ran OpenBLAS:\n%s", i,
			      check_log_text());
	}
	close_dev(&ob);
	close_dev(&dn);
	unsetenv("KILN_CPU_GEMM_SPLIT");
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(KILN_LOG_INFO);
}
END_TEST

/* auto: whichever timed faster, correct either way */
START_TEST(test_auto_correct)
{
	struct dev d;
	kiln_log_set_level(KILN_LOG_INFO);
	kiln_log_set_sink(check_log_sink, NULL);
	ck_assert_msg(open_dev(&d, "auto", 1) == KILN_OK, "%s", kiln_last_error());
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
		check_case(&d, &cases[i], "auto", 1);
	close_dev(&d);
	kiln_log_set_sink(NULL, NULL);
}
END_TEST

/* The default (rule): OpenBLAS only on no-transpose GEMMs of 32-256 rows
 * with K, N >= 128 (and below AVX-512 only: not asserted, the ISA is the
 * machine's); [run] deterministic = 1 turns auto into that rule, untimed. */
START_TEST(test_rule_and_deterministic)
{
	struct dev r, d;
	ck_assert_msg(open_dev(&r, "rule", 1) == KILN_OK, "%s", kiln_last_error());
	ck_assert(kiln_config_new(&d.cfg) == 0);
	ck_assert(kiln_config_override(d.cfg, "run.threads=1") == 0);
	ck_assert(kiln_config_override(d.cfg, "run.deterministic=1") == 0);
	ck_assert(kiln_config_override(d.cfg, "plugin.cpu.gemm_impl=auto") == 0);
	ck_assert(kiln_config_override(d.cfg, "plugin.cpu.tune_cache=none") == 0);
	ck_assert_msg(kiln_device_open(reg, d.cfg, "cpu", 0, &d.dev) == KILN_OK, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(d.dev, &d.stream) == 0);
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(check_log_sink, NULL);
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const struct gcase *g = &cases[i];
		check_log_clear();
		check_case(&r, g, "rule", 1);
		const int ob = check_log_has("(OpenBLAS)");
		ck_assert_msg(!ob || (!g->ta && !g->tb && g->m >= 32 && g->m <= 256 && g->n >= 128 &&
				      g->k >= 128),
			      "case %zu: the rule ran OpenBLAS:\n%s", i, check_log_text());
		check_log_clear();
		check_case(&d, g, "deterministic", 1);
		ck_assert_msg(check_log_has("(OpenBLAS)") == ob && !check_log_has("implementations,"),
			      "case %zu: deterministic is not the rule (OpenBLAS %d), or timed:\n%s", i,
			      ob, check_log_text());
	}
	close_dev(&d);
	close_dev(&r);
	kiln_log_set_sink(NULL, NULL);
	kiln_log_set_level(KILN_LOG_INFO);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("cpu_gemm_impl");
	TCase *tc = tcase_create("impl");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_openblas_matches_onednn, 0, 4);
	tcase_add_test(tc, test_auto_correct);
	tcase_add_test(tc, test_rule_and_deterministic);
	suite_add_tcase(s, tc);
	return s;
}

/* 77 when the device refuses gemm_impl = openblas (no OpenBLAS here) */
static int setup(void)
{
	struct kiln_registry *r;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	if (kiln_registry_open(NULL, &r))
		return 0; /* the suite's own open reports it */
	int skip = 0;
	if (kiln_config_new(&cfg) == 0 && kiln_config_override(cfg, "plugin.cpu.gemm_impl=openblas") == 0) {
		const kiln_status st = kiln_device_open(r, cfg, "cpu", 0, &dev);
		if (st == KILN_OK)
			kiln_device_close(dev);
		else if (st == KILN_ECONFIG) {
			printf("SKIP: %s\n", kiln_last_error());
			skip = 77;
		}
		kiln_config_free(cfg);
	}
	kiln_registry_close(r);
	return skip;
}

static const struct check_main check_suite = { .suite = make_suite, .reg = &reg, .need_cpu = 1,
					       .setup = setup, .omp_passive = 1 };
