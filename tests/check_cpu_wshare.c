/* tests/check_cpu_wshare.c - the CPU device's kept weights shared between
 * plans (plugins/cpu/wshare.c, session 40): what inference plans (frozen
 * weights, KILN_OPF_FROZEN) make of their weights, one copy per weight
 * tensor and key, listed under the weights' address and freed with their
 * memory (cpu_free's hook, cpu_wshare_freed).
 *
 * The model (NHWC, 8 x 24 x 24 samples): an 8 -> 32 3x3 conv (oneDNN,
 * its weights reordered into a blocked layout: conv.c/dnn.c's kind), a
 * 32 -> 32 3x3 conv (Winograd on AVX-512: wino.c's kind; else oneDNN's),
 * a 1x1 conv (oneDNN), max pooling and an INT8 linear (int8_scale: a
 * QLINEAR, qweights.c's kind).
 *
 * two_models: two such models (other seeds) on one CPU device, frozen
 * plans of 4, 3, 2 and 1 rows each, all alive at once:
 *  - every call's logits are, bit for bit, those of a fresh device and
 *    model with one plan of that size and [plugin.cpu] keep_weights = 0
 *    (nothing kept, nothing shared);
 *  - a model's plans of every size make its kept weights once: the first
 *    plan's run makes one entry and one fill per kept weight, the other
 *    sizes none (the debug log; before session 40 each f32 plan made its
 *    own copy, and each INT8 plan an entry at prepare);
 *  - one model's load makes no other model's kept weights again (the
 *    core tells the device which memory it wrote: KILN_PROC_WEIGHTS_WRITTEN;
 *    before session 41 one count served the device, so B's first run made
 *    A's again on A's next run, and a model made later all of them);
 *  - model A freed: its entries are unlisted and freed with its weights'
 *    memory (the free hook), B's plans still give B's bits, and a model
 *    made afterwards with A's seed gives A's bits with entries of its
 *    own;
 *  - B's weights written anew (A's seed's): B's kept weights are made
 *    again, once, and its plans give A's bits; the other model's stay.
 *
 * param_write: a read-only get and runs keep the kept weights (made by
 * the first run alone); get, run, write through the pointers,
 * kiln_model_params_written, run: the written weights' logits, the kept
 * weights made again once (session 42; see the case).
 *
 * team_sizes: the adaptive team shrunk every other op
 * ($KILN_CPU_TEAM_FLIP=1), plans of every size made, run and freed in
 * turn as kiln_infer makes them, three rounds: every call's logits are
 * those of a fixed team of the same size with nothing kept, and each
 * oneDNN op's version for the small team is probed (both run on scratch
 * tensors: plugins/cpu/dnnteam.c) in the first round alone; the plans of
 * the later rounds, of sizes seen before, take what the probes found
 * (before session 41 every new plan probed again).
 *
 * team_linear: the same on a model of f32 linear layers (flatten, a
 * 4608 -> 512 linear, ReLU, 512 -> 10): an inference plan's f32 GEMM is
 * frozen (KILN_OPF_FROZEN, plugins/cpu/gemm.c, session 46) and on
 * AVX-512 keeps its weights reordered into the matmul's layout from
 * their second run on, shared by the plans of every size and by their
 * versions for the small team.  Every call's logits on the flipping team
 * are those of a fixed team with nothing kept (keep_weights = 0: the
 * plain GEMM on [out, in]), the GEMMs' kept weights made in the first
 * round alone, and the 4608 -> 512 GEMM (above CPU_ONE_THREAD_FLOP at one
 * row) has a version for the small team. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_getaffinity_np */
#endif
#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <kiln/kiln.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_registry *reg;

#define C_IN 8
#define HW 24
#define ROWS 4       /* the largest plan */
#define CLASSES 10
#define SAMPLE (C_IN * HW * HW)

/* the model's config: [run] threads, [plugin.cpu] keep_weights, adaptive */
static const char model_ini[] =
	"[run]\ndevice = cpu\nseed = 3\nthreads = %d\n[data]\nsource = synthetic\n"
	"[model]\nlayout = nhwc\n"
	"[plugin.cpu]\nconv_impl = first\nkeep_weights = %d\nadaptive = %d\n"
	"[layer.c1]\ntype = conv\nout = 32\nkernel = 3\npadding = 1\n[layer.r1]\ntype = relu\n"
	"[layer.c2]\ntype = conv\nout = 32\nkernel = 3\npadding = 1\n[layer.r2]\ntype = relu\n"
	"[layer.c3]\ntype = conv\nout = 32\nkernel = 1\n[layer.r3]\ntype = relu\n"
	"[layer.pool]\ntype = maxpool\nkernel = 2\n[layer.flat]\ntype = flatten\n"
	"[layer.fc]\ntype = linear\nout = 10\nint8_scale = 0.05\n"
	"[layer.loss]\ntype = softmax_xent\n";

/* team_linear's model, its config as model_ini's: f32 linear layers; fc1
 * is 2 x 4608 x 512 flop a row, a team's even at one row */
#define MLP_HIDDEN 512
static const char mlp_ini[] =
	"[run]\ndevice = cpu\nseed = 3\nthreads = %d\n[data]\nsource = synthetic\n"
	"[plugin.cpu]\nkeep_weights = %d\nadaptive = %d\n"
	"[layer.flat]\ntype = flatten\n[layer.fc1]\ntype = linear\nout = 512\n"
	"[layer.r1]\ntype = relu\n[layer.fc2]\ntype = linear\nout = 10\n"
	"[layer.loss]\ntype = softmax_xent\n";

/* ---- the device's debug lines, counted -------------------------------- */

static struct {
	int fills;   /* kept weights made (reordered, transformed, quantized) */
	int entries; /* kept entries made */
	int unlisted, freed; /* by the free hook */
	/* dnnteam.c's versions of an op for a team (its debug line), those
	 * whose bytes an earlier probe told, and the distinct ops and teams
	 * (the line up to " (probed": the op, its input's and its weights'
	 * shapes, the team; c2 and c3 share their input) */
	int versions, probed_before, n_ops;
	char ops[64][256];
	/* frozen GEMMs (gemm.c): plans that keep their weights, the kept
	 * weights made, and the versions for a team of 1 with the same bytes
	 * of fc1's GEMM (B of MLP_HIDDEN rows) */
	int gemm_frozen, gemm_fills, gemm_small;
} seen;

/* A version's line: counted, and its op and team listed once. */
static void count_version(const char *msg)
{
	seen.versions++;
	if (strstr(msg, "(probed before)"))
		seen.probed_before++;
	const char *end = strstr(msg, " (probed");
	const size_t n = end ? (size_t)(end - msg) : strlen(msg);
	for (int i = 0; i < seen.n_ops; i++)
		if (strlen(seen.ops[i]) == n && !strncmp(seen.ops[i], msg, n))
			return;
	if (seen.n_ops < 64 && n < sizeof seen.ops[0])
		memcpy(seen.ops[seen.n_ops], msg, n), seen.ops[seen.n_ops++][n] = 0;
}

static void count_sink(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)level, (void)who;
	if (strstr(msg, "weights reordered into the kernel's layout") ||
	    strstr(msg, "Winograd-transformed weights made") || strstr(msg, "weights quantized (frozen"))
		seen.fills++;
	if (strstr(msg, "kept weights: a new entry of"))
		seen.entries++;
	if (strstr(msg, " threads: the same bytes") || strstr(msg, " threads: other bytes"))
		count_version(msg);
	if (!strncmp(msg, "GEMM M=", 7) && strstr(msg, " (frozen, "))
		seen.gemm_frozen++;
	if (!strncmp(msg, "GEMM: weights reordered into the kernel's layout", 48))
		seen.gemm_fills++;
	char by[40];
	snprintf(by, sizeof by, " by f32[%d,", MLP_HIDDEN);
	if (!strncmp(msg, "GEMM ", 5) && strstr(msg, by) &&
	    strstr(msg, " on 1 threads: the same bytes"))
		seen.gemm_small++;
	int u, f;
	if (sscanf(msg, "kept weights: %d entries made from freed memory listed no more, %d of them freed",
		   &u, &f) == 2)
		seen.unlisted += u, seen.freed += f;
}

/* ---- models and their logits ------------------------------------------ */

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *stream;
	float *x; /* device: ROWS samples */
};

/* A deterministic value in [-1, 1) from i. */
static float noise(uint32_t i)
{
	uint32_t h = (i + 1) * 2654435761u;
	h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
	return (float)(h % 20001) / 10000.0f - 1.0f;
}

/* The model of config fmt (model_ini or mlp_ini); keep: [plugin.cpu]
 * keep_weights; adapt: [plugin.cpu] adaptive, with [run] threads unset
 * (1) or 2 (0: adaptive or not, the count unset). */
static void rig_open_team(struct rig *r, const char *fmt, int keep, int adapt, int threads)
{
	char ini[1024];
	static float h[ROWS * SAMPLE];
	ck_assert((size_t)snprintf(ini, sizeof ini, fmt, threads, keep, adapt) < sizeof ini);
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	ck_assert_msg(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev) == 0, "%s", kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->stream) == 0);
	ck_assert(kiln_device_alloc(r->dev, sizeof h, (void **)&r->x) == 0);
	for (uint32_t i = 0; i < ROWS * SAMPLE; i++)
		h[i] = noise(i);
	TEST_H2D(r, r->x, h, sizeof h);
}

static void rig_open(struct rig *r, int keep) { rig_open_team(r, model_ini, keep, 0, 2); }

static void rig_close(struct rig *r)
{
	void *bufs[] = { r->x };
	test_rig_free_bufs(r->dev, r->stream, bufs, 1);
	test_rig_close_device(r->dev, r->stream, r->cfg);
}

static struct kiln_model *model_new(struct rig *r, uint64_t seed)
{
	const int64_t dims[3] = { C_IN, HW, HW };
	struct kiln_tensor_desc sample;
	struct kiln_model *m;
	kiln_tensor_desc_init(&sample, KILN_F32, 3, dims);
	ck_assert_msg(kiln_model_create(r->cfg, reg, r->dev, &sample, &m) == 0, "%s", kiln_last_error());
	ck_assert(kiln_model_init_params(m, seed, r->stream) == 0);
	return m;
}

static struct kiln_plan *plan_new(struct kiln_model *m, int64_t rows)
{
	const struct kiln_plan_opts o = { .logits = 1, .frozen = 1 }; /* kiln_infer's */
	struct kiln_plan *p;
	ck_assert_msg(kiln_model_plan_ex(m, rows, &o, &p) == 0, "%s", kiln_last_error());
	return p;
}

/* rows rows of r->x through p: the logits into out [rows][CLASSES]. */
static void run(struct rig *r, struct kiln_plan *p, int64_t rows, float *out)
{
	void *logits;
	struct kiln_tensor_desc d;
	ck_assert_msg(kiln_plan_forward(p, r->x, NULL, NULL, r->stream) == 0, "%s", kiln_last_error());
	ck_assert(kiln_plan_logits(p, &logits, &d) == 0);
	ck_assert_int_eq(kiln_tensor_numel(&d), rows * CLASSES);
	TEST_D2H(r, out, logits, sizeof(float) * (size_t)(rows * CLASSES));
}

/* The logits of `rows` rows of a fresh device and model (config fmt) of
 * seed, one plan, nothing kept (keep_weights = 0), on a fixed team of
 * `threads` (0: the count the adaptive team opens with). */
static void reference_team(const char *fmt, uint64_t seed, int64_t rows, int threads, float *out)
{
	struct rig r;
	rig_open_team(&r, fmt, 0, 0, threads);
	struct kiln_model *m = model_new(&r, seed);
	struct kiln_plan *p = plan_new(m, rows);
	run(&r, p, rows, out);
	kiln_device_stream_sync(r.dev, r.stream);
	kiln_plan_free(p);
	kiln_model_free(m);
	rig_close(&r);
}

static void reference(uint64_t seed, int64_t rows, float *out)
{
	reference_team(model_ini, seed, rows, 2, out);
}

/* ---- the cases --------------------------------------------------------- */

#define NSIZE 4
static const int64_t sizes[NSIZE] = { 4, 3, 2, 1 };
static const uint64_t seed_a = 7, seed_b = 8;

/* The plans of every size of model m, run in turn against the
 * references ref[k] (a failure names the model and size). */
static void run_all(struct rig *r, struct kiln_plan **p, float (*ref)[ROWS * CLASSES],
		    const char *what)
{
	float got[ROWS * CLASSES];
	for (int k = 0; k < NSIZE; k++) {
		run(r, p[k], sizes[k], got);
		ck_assert_msg(!memcmp(got, ref[k], sizeof(float) * (size_t)(sizes[k] * CLASSES)),
			      "%s, %lld rows: the logits differ from a fresh model's without kept weights", what,
			      (long long)sizes[k]);
	}
}

START_TEST(test_two_models)
{
	static float ref_a[NSIZE][ROWS * CLASSES], ref_b[NSIZE][ROWS * CLASSES];
	for (int k = 0; k < NSIZE; k++) {
		reference(seed_a, sizes[k], ref_a[k]);
		reference(seed_b, sizes[k], ref_b[k]);
	}
	ck_assert_msg(memcmp(ref_a[0], ref_b[0], sizeof ref_a[0]), "two seeds, the same logits: no test");

	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(count_sink, NULL);
	struct rig r;
	rig_open(&r, 1);
	struct kiln_model *a = model_new(&r, seed_a), *b = model_new(&r, seed_b);
	struct kiln_plan *pa[NSIZE], *pb[NSIZE];
	for (int k = 0; k < NSIZE; k++)
		pa[k] = plan_new(a, sizes[k]), pb[k] = plan_new(b, sizes[k]);
	ck_assert_msg(seen.entries == 0, "%d kept entries made by prepares (the first run makes them)",
		      seen.entries);

	/* A's plans: the first one's run makes each kept weight once */
	float got[ROWS * CLASSES];
	run(&r, pa[0], sizes[0], got);
	const int kept = seen.fills;
	ck_assert_msg(kept >= 3, "%d kept weights made: the model has 3 convolutions and an INT8 linear", kept);
	ck_assert_int_eq(seen.entries, kept);
	run_all(&r, pa, ref_a, "model A");
	ck_assert_msg(seen.fills == kept && seen.entries == kept,
		      "model A's plans of 4 sizes made %d kept weights in %d entries, %d expected (one per weight)",
		      seen.fills, seen.entries, kept);
	/* B's: as many, its own */
	run_all(&r, pb, ref_b, "model B");
	ck_assert_msg(seen.fills == 2 * kept && seen.entries == 2 * kept,
		      "model B's plans of 4 sizes: %d kept weights made in all, in %d entries, %d expected",
		      seen.fills, seen.entries, 2 * kept);
	/* both in turn: the same bits, nothing made again (B's load told the
	 * device of B's memory alone) */
	for (int k = NSIZE - 1; k >= 0; k--) {
		run_all(&r, pa, ref_a, "model A beside B");
		run_all(&r, pb, ref_b, "model B beside A");
	}
	ck_assert_int_eq(seen.entries, 2 * kept);
	ck_assert_msg(seen.fills == 2 * kept,
		      "models A and B in turn: %d kept weights made, %d expected (B's load made A's again)",
		      seen.fills, 2 * kept);

	/* A freed: its entries with its weights' memory; B unchanged */
	kiln_device_stream_sync(r.dev, r.stream);
	for (int k = 0; k < NSIZE; k++)
		kiln_plan_free(pa[k]);
	seen.unlisted = seen.freed = 0;
	kiln_model_free(a);
	ck_assert_msg(seen.unlisted == kept && seen.freed == kept,
		      "model A freed: %d of its entries unlisted, %d freed, %d expected", seen.unlisted,
		      seen.freed, kept);
	run_all(&r, pb, ref_b, "model B after A was freed");
	/* a model of A's seed made now: A's bits, from entries of its own */
	struct kiln_model *c = model_new(&r, seed_a);
	for (int k = 0; k < NSIZE; k++)
		pa[k] = plan_new(c, sizes[k]);
	const int before = seen.entries, fills = seen.fills;
	run_all(&r, pa, ref_a, "a model of A's seed made after A was freed");
	run_all(&r, pb, ref_b, "model B beside it");
	ck_assert_int_eq(seen.entries - before, kept);
	ck_assert_msg(seen.fills - fills == kept,
		      "a model made beside B: %d kept weights made, %d expected (its own; B's stay)",
		      seen.fills - fills, kept);
	/* B's weights written anew, with A's seed's: B's made again, once,
	 * from the new values; the other model's stay */
	ck_assert(kiln_model_init_params(b, seed_a, r.stream) == 0);
	const int refill = seen.fills;
	run_all(&r, pb, ref_a, "model B with A's seed's weights");
	run_all(&r, pa, ref_a, "the model of A's seed beside it");
	ck_assert_msg(seen.fills - refill == kept,
		      "model B's weights written: %d kept weights made, %d expected (B's alone, once)",
		      seen.fills - refill, kept);
	ck_assert_int_eq(seen.entries - before, kept);
	printf("cpu_wshare: %d kept weights a model, made once for its plans of 4 sizes and again "
	       "only when its own weights are written; its entries freed with it; the bits of "
	       "nothing kept\n", kept);
	fflush(stdout);

	kiln_device_stream_sync(r.dev, r.stream);
	for (int k = 0; k < NSIZE; k++)
		kiln_plan_free(pa[k]), kiln_plan_free(pb[k]);
	kiln_model_free(c);
	kiln_model_free(b);
	rig_close(&r);
	kiln_log_set_sink(NULL, NULL);
}
END_TEST

#define MAX_PARAMS 16

/* src's parameters and buffers written through dst[], the pointers
 * kiln_model_param_get handed out for another model of the same config
 * earlier (the caller's writes of an embedding program). */
static void write_through(struct rig *r, const struct kiln_param_info *dst, struct kiln_model *src)
{
	for (int i = 0; i < kiln_model_param_count(src); i++) {
		struct kiln_param_info ps;
		kiln_model_param_get(src, i, &ps);
		const size_t bytes = sizeof(float) * (size_t)kiln_tensor_numel(&ps.desc);
		float *h = malloc(bytes);
		ck_assert_str_eq(dst[i].name, ps.name);
		ck_assert(h != NULL);
		TEST_D2H(r, h, ps.param, bytes);
		TEST_H2D(r, dst[i].param, h, bytes);
		free(h);
	}
}

/* param_write: an embedding program gets the pointers of a model's
 * weights (kiln_model_param_get) and runs a frozen plan several times:
 * the kept weights are made by the first run alone, as with no get (a
 * first version of session 42 counted a write before every forward from
 * the get on, so every run made them again: 2.1x the time a run).  Then
 * it writes other weights through the pointers, calls
 * kiln_model_params_written and runs again: the logits are a fresh
 * model's with the written weights, the kept weights made again once
 * (before session 42 a write after a run was not seen: the first run's
 * kept weights served on). */
START_TEST(test_param_write)
{
	float ref_a[ROWS * CLASSES], ref_b[ROWS * CLASSES], got[ROWS * CLASSES];
	reference(seed_a, ROWS, ref_a);
	reference(seed_b, ROWS, ref_b);
	ck_assert_msg(memcmp(ref_a, ref_b, sizeof ref_a), "two seeds, the same logits: no test");

	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(count_sink, NULL);
	struct rig r;
	rig_open(&r, 1);
	struct kiln_model *a = model_new(&r, seed_a), *b = model_new(&r, seed_b),
			  *c = model_new(&r, seed_a);
	struct kiln_param_info pa[MAX_PARAMS]; /* the program's pointers, got once */
	ck_assert_int_le(kiln_model_param_count(a), MAX_PARAMS);
	for (int i = 0; i < kiln_model_param_count(a); i++)
		kiln_model_param_get(a, i, &pa[i]);
	struct kiln_plan *p = plan_new(a, ROWS);
	const int fills0 = seen.fills;
	run(&r, p, ROWS, got);
	ck_assert_msg(!memcmp(got, ref_a, sizeof got), "before the write: not the weights' logits");
	const int kept = seen.fills - fills0;
	ck_assert_msg(kept >= 3, "%d kept weights made: the model has 3 convolutions and an INT8 linear", kept);

	/* the pointers only read: later runs keep the kept weights */
	const int read_only = seen.fills;
	for (int k = 0; k < 3; k++) {
		run(&r, p, ROWS, got);
		ck_assert_msg(!memcmp(got, ref_a, sizeof got), "run %d after a read-only get", k);
	}
	ck_assert_msg(seen.fills - read_only == 0,
		      "3 runs after a read-only kiln_model_param_get made %d kept weights, 0 expected "
		      "(the first run made them: a get counts one write, not one a run)",
		      seen.fills - read_only);

	/* get, run, write, kiln_model_params_written, run: the written
	 * weights' logits, the kept weights made again once */
	write_through(&r, pa, b);
	kiln_model_params_written(a);
	const int written = seen.fills;
	run(&r, p, ROWS, got);
	ck_assert_msg(!memcmp(got, ref_b, sizeof got),
		      "weights written through kiln_model_param_get's pointers after a run, then "
		      "kiln_model_params_written: the next run's logits are %s",
		      !memcmp(got, ref_a, sizeof got) ? "the old weights' (kept weights made before the write)"
						       : "neither the old nor the new weights'");
	/* and again: A's seed's weights back */
	write_through(&r, pa, c);
	kiln_model_params_written(a);
	run(&r, p, ROWS, got);
	ck_assert_msg(!memcmp(got, ref_a, sizeof got), "the second write: not its weights' logits");
	for (int k = 0; k < 2; k++) {
		run(&r, p, ROWS, got);
		ck_assert_msg(!memcmp(got, ref_a, sizeof got), "run %d after the second write", k);
	}
	ck_assert_msg(seen.fills - written == 2 * kept,
		      "two writes, each with kiln_model_params_written, and 4 runs made %d kept weights, "
		      "%d expected (once a write)", seen.fills - written, 2 * kept);
	printf("cpu_wshare: a read-only kiln_model_param_get keeps the %d kept weights (made by the "
	       "first run alone); weights written through its pointers after a run, then "
	       "kiln_model_params_written, give the written weights' logits, the kept weights made "
	       "again once a write\n", kept);
	fflush(stdout);

	kiln_device_stream_sync(r.dev, r.stream);
	kiln_plan_free(p);
	kiln_model_free(c);
	kiln_model_free(b);
	kiln_model_free(a);
	rig_close(&r);
	kiln_log_set_sink(NULL, NULL);
}
END_TEST

/* 1 when the adaptive team can shrink here (2 CPUs or more to run on),
 * else says why the case is skipped */
static int team_can_shrink(const char *fn, int *cpus)
{
	cpu_set_t all;
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof all, &all), 0);
	*cpus = CPU_COUNT(&all);
	if (*cpus < 2) /* the team opens with one thread: it never shrinks */
		fprintf(stderr, "%s: skipped: fewer than 2 CPUs to run on: no adaptive team\n", fn);
	return *cpus >= 2;
}

/* The model of config fmt and seed_a on an adaptive team flipping
 * between its opening size (cpus) and 1 every `flip` ops
 * ($KILN_CPU_TEAM_FLIP: oneDNN's team is the small one at the ops k
 * whose k / flip is odd and no multiple of 3, k counted over all runs),
 * kept weights on: its plans of every size made, run `runs` times and
 * freed in turn as kiln_infer makes them, three rounds, every call's
 * logits a fixed team's with nothing kept; after round 0, *fills0 =
 * seen.gemm_fills (the debug lines counted from the start). */
static void team_rounds(const char *fmt, const char *flip, int cpus, int runs, int *fills0)
{
	static float ref[NSIZE][ROWS * CLASSES];
	for (int k = 0; k < NSIZE; k++)
		reference_team(fmt, seed_a, sizes[k], 0, ref[k]);

	memset(&seen, 0, sizeof seen);
	kiln_log_set_level(KILN_LOG_DEBUG);
	kiln_log_set_sink(count_sink, NULL);
	setenv("KILN_CPU_TEAM_FLIP", flip, 1); /* read as the device opens */
	struct rig r;
	rig_open_team(&r, fmt, 1, 1, 0);
	unsetenv("KILN_CPU_TEAM_FLIP");
	struct kiln_model *m = model_new(&r, seed_a);
	float got[ROWS * CLASSES];
	for (int round = 0; round < 3; round++) {
		for (int k = 0; k < NSIZE; k++) { /* kiln_infer's remainder plans */
			struct kiln_plan *p = plan_new(m, sizes[k]);
			for (int i = 0; i < runs; i++) {
				run(&r, p, sizes[k], got);
				ck_assert_msg(!memcmp(got, ref[k], sizeof(float) * (size_t)(sizes[k] * CLASSES)),
					      "round %d, %lld rows, run %d on a team flipping between %d threads and 1 every %s ops: the logits differ from a fixed team's with nothing kept",
					      round, (long long)sizes[k], i, cpus, flip);
			}
			kiln_device_stream_sync(r.dev, r.stream);
			kiln_plan_free(p);
		}
		if (!round)
			*fills0 = seen.gemm_fills;
	}
	kiln_model_free(m);
	rig_close(&r);
	kiln_log_set_sink(NULL, NULL);
}

START_TEST(test_team_sizes)
{
	int cpus, fills0;
	if (!team_can_shrink(__func__, &cpus))
		return;
	team_rounds(model_ini, "1", cpus, 1, &fills0);
	/* each op and team probed once: the versions of the later plans of
	 * that op (a size seen before) are told by it */
	const int probed = seen.versions - seen.probed_before;
	ck_assert_msg(seen.versions > seen.n_ops,
		      "%d versions of %d ops for the small team: no op's version made twice, no test",
		      seen.versions, seen.n_ops);
	ck_assert_msg(probed == seen.n_ops,
		      "%d versions of oneDNN ops for the small team in 12 plans, of %d ops and teams: %d probed (ran on both teams), %d expected (one probe each)",
		      seen.versions, seen.n_ops, probed, seen.n_ops);
	printf("cpu_wshare: %d versions of %d oneDNN ops for the small team in 12 plans of 4 sizes, one probe an op; the bits of a fixed team\n",
	       seen.versions, seen.n_ops);
	fflush(stdout);
}
END_TEST

/* oneDNN's matmul is its brgemm one (AVX-512 with BW and VL, as
 * tests/infer_wreorder.sh asks /proc/cpuinfo): a frozen f32 GEMM keeps
 * its weights there alone (gemm.c, gemm_frozen_pd) */
static int cpu_brgemm(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
	return 0;
#endif
}

START_TEST(test_team_linear)
{
	int cpus, fills0;
	if (!team_can_shrink(__func__, &cpus))
		return;
	/* 3 runs a plan: a frozen GEMM's first run with new weights reads
	 * them as they are, the next reorders and keeps them.  The team
	 * flips every 2 ops: a run is 2 GEMMs, so with a flip every op fc1
	 * would always be op k even, on the opening team */
	team_rounds(mlp_ini, "2", cpus, 3, &fills0);
	ck_assert_msg(seen.gemm_small >= 1,
		      "fc1's GEMM has no version for a team of 1 with the same bytes (%d versions of %d ops): the frozen GEMM never ran on the small team, no test",
		      seen.versions, seen.n_ops);
	if (cpu_brgemm()) {
		ck_assert_msg(seen.gemm_frozen >= 1 && fills0 >= 1,
			      "AVX-512: %d frozen GEMM plans, %d kept weights made in round 0: fc1's GEMM does not keep its weights",
			      seen.gemm_frozen, fills0);
		ck_assert_msg(seen.gemm_fills == fills0,
			      "the GEMMs' kept weights made %d times in round 0, %d in rounds 1 and 2 (0 expected: the plans of every size and their versions for the small team share them)",
			      fills0, seen.gemm_fills - fills0);
	} else {
		ck_assert_int_eq(seen.gemm_frozen, 0);
		ck_assert_int_eq(seen.gemm_fills, 0);
	}
	printf("cpu_wshare: f32 linear layers on a team flipping between %d threads and 1, 12 plans of 4 sizes run 3 times: the bytes of a fixed team with nothing kept; %d frozen GEMM plans, their kept weights made %d times (round 0 alone), fc1's GEMM's version for 1 thread %d times\n",
	       cpus, seen.gemm_frozen, seen.gemm_fills, seen.gemm_small);
	fflush(stdout);
}
END_TEST

static Suite *make_cpu_wshare_suite(void)
{
	Suite *s = suite_create("cpu_wshare");
	TCase *t = tcase_create("two_models");
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_two_models);
	suite_add_tcase(s, t);
	t = tcase_create("param_write");
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_param_write);
	suite_add_tcase(s, t);
	t = tcase_create("team_sizes");
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_team_sizes);
	suite_add_tcase(s, t);
	t = tcase_create("team_linear");
	tcase_set_timeout(t, 120);
	tcase_add_test(t, test_team_linear);
	suite_add_tcase(s, t);
	return s;
}

static const struct check_main check_suite = {
	.suite = make_cpu_wshare_suite,
	.reg = &reg,
	.need_cpu = 1,
	.omp_passive = 1,
};
