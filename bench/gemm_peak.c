/* bench/gemm_peak.c - the GEMM throughput oneDNN reaches on this machine,
 * through kiln's cpu device (the same prepare/run path training uses):
 * square f32 GEMMs, best of several timed runs, one JSON line. */
#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	int threads = 0;
	int64_t n = 2048;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--threads"))
			threads = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n"))
			n = atoll(argv[i + 1]);
	}
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	setenv("GOMP_SPINCOUNT", "100000", 0);
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	char ov[64];
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	if (kiln_registry_open(NULL, &reg) || kiln_config_new(&cfg) ||
	    kiln_config_override(cfg, ov) || kiln_config_validate(cfg, reg) ||
	    kiln_device_open(reg, cfg, "cpu", 0, &dev)) {
		fprintf(stderr, "gemm_peak: %s\n", kiln_last_error());
		return 1;
	}
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GEMM;
	op.n_in = 2;
	op.n_out = 1;
	int64_t d[2] = { n, n };
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 2, d);
	op.in[1] = op.out[0] = op.in[0];
	op.i[2] = op.i[3] = op.i[4] = n;
	op.f[0] = 1.0;
	void *plan, *stream, *a, *b, *c, *ws = NULL;
	size_t wsb = 0, bytes = (size_t)(n * n) * 4;
	if (kiln_device_prepare(dev, &op, &plan, &wsb) || kiln_device_stream_create(dev, &stream) ||
	    kiln_device_alloc(dev, bytes, &a) || kiln_device_alloc(dev, bytes, &b) ||
	    kiln_device_alloc(dev, bytes, &c) || (wsb && kiln_device_alloc(dev, wsb, &ws))) {
		fprintf(stderr, "gemm_peak: %s\n", kiln_last_error());
		return 1;
	}
	for (int64_t i = 0; i < n * n; i++)
		((float *)a)[i] = ((float *)b)[i] = (float)(i % 7) * 0.1f;
	struct kiln_op_args args = { .in = { a, b }, .out = { c }, .workspace = ws,
				     .workspace_bytes = wsb };
	double best = 1e30;
	for (int rep = 0; rep < 7; rep++) {
		double t0 = now();
		for (int k = 0; k < 3; k++)
			kiln_device_run(dev, plan, &args, stream);
		kiln_device_stream_sync(dev, stream);
		double t = (now() - t0) / 3;
		if (rep && t < best) /* the first repetition is warm-up */
			best = t;
	}
	printf("{\"n\": %lld, \"threads\": %d, \"gflops\": %.1f}\n", (long long)n, threads,
	       2.0 * (double)n * (double)n * (double)n / best / 1e9);
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
