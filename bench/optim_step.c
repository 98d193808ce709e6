/* bench/optim_step.c - the bf16 CNN's optimizer step alone, through kiln's
 * cpu device: SGD (momentum 0.9, decoupled weight decay off, L2 5e-4) over
 * --n parameters (default 3,274,640: bench/cnn_bench.ini's model) with a
 * bf16 compute copy (--copy 0: none), as `run.precision=bf16` runs it.
 * One JSON line: the median wall ms a call and the median process CPU ms
 * a call over 9 repetitions of ~50 ms (the first one not counted).  At 1
 * thread the CPU figure is exact; at 2 the wall figure is (see
 * docs/PERFORMANCE.md, "Session 14: the bf16 peak").  A/B of two builds:
 * the same binary with KILN_PLUGIN_PATH set to each build's plugins.
 * --subnormal 1: every gradient 0 and every momentum 1e-39 (f32
 * subnormal: a dead ReLU unit's after ~800 steps of v = 0.9 v) at the
 * start of each repetition, outside the timed calls; an IEEE kernel then
 * computes on subnormals in all 20 calls (x86: a microcode assist per
 * operand), one that stores state below FLT_MIN as zero (session 45) in
 * the first only. */
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_time.h"

static int fail(void)
{
	fprintf(stderr, "optim_step: %s\n", kiln_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	int threads = 0, copy = 1, sub = 0;
	int64_t n = 3274640;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n"))
			n = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--copy"))
			copy = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--subnormal"))
			sub = atoi(argv[i + 1]);
	}
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	setenv("GOMP_SPINCOUNT", "100000", 0);
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	char ov[64];
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	if (kiln_registry_open(NULL, &reg) || kiln_config_new(&cfg) || kiln_config_override(cfg, ov) ||
	    kiln_config_validate(cfg, reg) || kiln_device_open(reg, cfg, "cpu", 0, &dev))
		return fail();
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SGD;
	op.n_in = 2;
	op.n_out = 2 + copy;
	int64_t d1[1] = { n }, one[1] = { 1 };
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, d1);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, one);
	op.out[0] = op.out[1] = op.in[0];
	kiln_tensor_desc_init(&op.out[2], KILN_BF16, 1, d1);
	op.i[0] = n;
	op.f[0] = 0.9, op.f[1] = 5e-4;
	void *plan, *stream, *g, *lr, *w, *v, *c = NULL;
	size_t wsb = 0;
	const size_t b = (size_t)n * 4;
	if (kiln_device_prepare(dev, &op, &plan, &wsb) || kiln_device_stream_create(dev, &stream) ||
	    kiln_device_alloc(dev, b, &g) || kiln_device_alloc(dev, 4, &lr) || kiln_device_alloc(dev, b, &w) ||
	    kiln_device_alloc(dev, b, &v) || (copy && kiln_device_alloc(dev, b / 2, &c)))
		return fail();
	float *gh = g, *wh = w, *vh = v, *lh = lr; /* the cpu device's memory is the host's */
	for (int64_t i = 0; i < n; i++)
		gh[i] = sub ? 0.0f : 1e-3f * (float)(i % 13 - 6), wh[i] = 0.01f * (float)(i % 17 - 8),
		vh[i] = 0;
	*lh = 1e-6f;
	struct kiln_op_args args = { .in = { g, lr }, .out = { w, v, c } };
	const int per = 20;
	double wall[9], cpu[9];
	for (int rep = 0; rep < 10; rep++) {
		for (int64_t i = 0; sub && i < n; i++)
			vh[i] = 1e-39f;
		const double t0 = now(), c0 = cpu_now();
		for (int r = 0; r < per; r++)
			if (kiln_device_run(dev, plan, &args, stream))
				return fail();
		if (kiln_device_stream_sync(dev, stream))
			return fail();
		if (rep) { /* the first repetition is warm-up */
			wall[rep - 1] = (now() - t0) / per * 1e3;
			cpu[rep - 1] = (cpu_now() - c0) / per * 1e3;
		}
	}
	qsort(wall, 9, sizeof *wall, cmp_double);
	qsort(cpu, 9, sizeof *cpu, cmp_double);
	printf("{\"op\": \"sgd\", \"n\": %lld, \"copy\": %s, \"threads\": %d, \"subnormal\": %d, "
	       "\"wall_ms\": %.3f, \"wall_min_ms\": %.3f, \"cpu_ms\": %.3f}\n",
	       (long long)n, copy ? "\"bf16\"" : "null", threads, sub, wall[4], wall[0], cpu[4]);
	kiln_device_free(dev, g), kiln_device_free(dev, lr), kiln_device_free(dev, w);
	kiln_device_free(dev, v), kiln_device_free(dev, c);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return 0;
}
