/* bench/gemm_peak.c - the GEMM throughput oneDNN reaches on this machine,
 * through kiln's cpu device (the same prepare/run path training uses):
 * square f32 GEMMs (or --m M --n N --k K --ta 1 --tb 1), best of several
 * timed runs, one JSON line: GFLOP/s of wall time and of the process's CPU
 * time (what a GEMM costs when the wall clock is another process's).
 * The CPU figure is the median's, not the best's.
 *
 * --dtype bf16: bf16 A and B, oneDNN's bf16 matmul (f32 accumulation; the
 * plugin's bf16 kernel, [plugin.cpu] bf16_gemm = bf16, not the f32 one
 * the tuner may pick) with an f32 result, or a bf16 one with --out bf16:
 * the bf16 peak the CNN's bf16 kernels are measured against. */
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_time.h"


/* element i of x: (i % 7) / 10, as f32 or bf16 (truncated: a timing
 * input) */
static void fill(void *x, int bf16, int64_t i)
{
	const float f = (float)(i % 7) * 0.1f;
	if (!bf16) {
		((float *)x)[i] = f;
		return;
	}
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	((uint16_t *)x)[i] = (uint16_t)(u >> 16);
}

int main(int argc, char **argv)
{
	int threads = 0, ta = 0, tb = 0, bf16 = 0, out_bf16 = 0;
	int64_t n = 2048, m = 0, k = 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n"))
			n = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--m"))
			m = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--k"))
			k = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--ta"))
			ta = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--tb"))
			tb = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--dtype"))
			bf16 = !strcmp(argv[i + 1], "bf16");
		else if (!strcmp(argv[i], "--out"))
			out_bf16 = !strcmp(argv[i + 1], "bf16");
	}
	out_bf16 = out_bf16 && bf16;
	const int dt = bf16 ? KILN_BF16 : KILN_F32;
	const size_t ei = bf16 ? 2 : 4, eo = out_bf16 ? 2 : 4;
	m = m > 0 ? m : n;
	k = k > 0 ? k : n;
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	setenv("GOMP_SPINCOUNT", "100000", 0);
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	char ov[64];
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	if (kiln_registry_open(NULL, &reg) || kiln_config_new(&cfg) ||
	    kiln_config_override(cfg, ov) ||
	    (bf16 && kiln_config_override(cfg, "plugin.cpu.bf16_gemm=bf16")) ||
	    kiln_config_validate(cfg, reg) ||
	    kiln_device_open(reg, cfg, "cpu", 0, &dev)) {
		fprintf(stderr, "gemm_peak: %s\n", kiln_last_error());
		return 1;
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 2;
	op.n_out = 1;
	int64_t da[2] = { ta ? k : m, ta ? m : k }, db[2] = { tb ? n : k, tb ? k : n },
		dc[2] = { m, n };
	kiln_tensor_desc_init(&op.in[0], dt, 2, da);
	kiln_tensor_desc_init(&op.in[1], dt, 2, db);
	kiln_tensor_desc_init(&op.out[0], out_bf16 ? KILN_BF16 : KILN_F32, 2, dc);
	op.i[0] = ta, op.i[1] = tb, op.i[2] = m, op.i[3] = n, op.i[4] = k;
	op.f[0] = 1.0;
	void *plan, *stream, *a, *b, *c, *ws = NULL;
	size_t wsb = 0;
	if (kiln_device_prepare(dev, &op, &plan, &wsb) || kiln_device_stream_create(dev, &stream) ||
	    kiln_device_alloc(dev, (size_t)(m * k) * ei, &a) ||
	    kiln_device_alloc(dev, (size_t)(k * n) * ei, &b) ||
	    kiln_device_alloc(dev, (size_t)(m * n) * eo, &c) || (wsb && kiln_device_alloc(dev, wsb, &ws))) {
		fprintf(stderr, "gemm_peak: %s\n", kiln_last_error());
		return 1;
	}
	for (int64_t i = 0; i < m * k; i++)
		fill(a, bf16, i);
	for (int64_t i = 0; i < k * n; i++)
		fill(b, bf16, i);
	struct kiln_op_args args = { .in = { a, b }, .out = { c }, .workspace = ws,
				     .workspace_bytes = wsb };
	/* repetitions of about 20 ms (3 runs at least) */
	const double flop = 2.0 * (double)m * (double)n * (double)k;
	int per = (int)(20e-3 * 20e9 / flop);
	per = per < 3 ? 3 : per;
	double best = 1e30, cpu[7];
	for (int rep = 0; rep < 8; rep++) {
		double t0 = now(), c0 = cpu_now();
		for (int r = 0; r < per; r++)
			kiln_device_run(dev, plan, &args, stream);
		kiln_device_stream_sync(dev, stream);
		double t = (now() - t0) / per;
		if (rep && t < best) /* the first repetition is warm-up */
			best = t;
		if (rep)
			cpu[rep - 1] = (cpu_now() - c0) / per;
	}
	qsort(cpu, 7, sizeof *cpu, cmp_double);
	printf("{\"dtype\": \"%s\", \"out\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
	       "\"ta\": %d, \"tb\": %d, \"threads\": %d, \"gflops\": %.1f, \"gflops_per_cpu_s\": %.1f}\n",
	       bf16 ? "bf16" : "f32", out_bf16 ? "bf16" : "f32", (long long)m, (long long)n,
	       (long long)k, ta, tb, threads, flop / best / 1e9,
	       flop / cpu[3] / 1e9);
	kiln_device_free(dev, a);
	kiln_device_free(dev, b);
	kiln_device_free(dev, c);
	kiln_device_free(dev, ws);
	kiln_device_plan_free(dev, plan);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return 0;
}
