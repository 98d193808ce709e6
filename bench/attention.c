/* bench/attention.c - forward + backward time of the fused attention ops
 * (KILN_OP_ATTENTION, _BWD) on the cpu device, causal, f32, no dropout.
 * bench/pytorch_attention.py times the same in PyTorch (explicit ops).
 *
 * Usage: bench/attention THREADS B T C H [REPEATS]
 * Prints the median and the minimum of REPEATS (default 20) forward+backward
 * pairs, after two warm-up pairs, and of the forward alone; and the process's
 * CPU time per timed pair (user + sys of all its threads: the figure a loaded
 * machine leaves nearly intact at THREADS 1).
 */
#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_time.h"

#define CHECK(x)                                                                          \
	do {                                                                              \
		if ((x) != KILN_OK) {                                                     \
			fprintf(stderr, "%s: %s\n", #x, kiln_last_error());               \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: bench/attention THREADS B T C H [REPEATS]\n");
		return 2;
	}
	setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
	const int64_t B = atoll(argv[2]), T = atoll(argv[3]), C = atoll(argv[4]), H = atoll(argv[5]);
	const int reps = argc > 6 ? atoi(argv[6]) : 20;
	char thr[64];
	snprintf(thr, sizeof thr, "run.threads=%s", argv[1]);
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *s;
	CHECK(kiln_registry_open(NULL, &reg));
	CHECK(kiln_config_new(&cfg));
	CHECK(kiln_config_override(cfg, thr));
	CHECK(kiln_config_validate(cfg, reg));
	CHECK(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	CHECK(kiln_device_stream_create(dev, &s));

	const int64_t dq[3] = { B, T, 3 * C }, dy[3] = { B, T, C }, dl[3] = { B, H, T };
	struct kiln_tensor_desc qkv, y, lse;
	kiln_tensor_desc_init(&qkv, KILN_F32, 3, dq);
	kiln_tensor_desc_init(&y, KILN_F32, 3, dy);
	kiln_tensor_desc_init(&lse, KILN_F32, 3, dl);
	struct kiln_op f, b;
	memset(&f, 0, sizeof f);
	f.type = KILN_OP_ATTENTION, f.n_in = 1, f.n_out = 2;
	f.in[0] = qkv, f.out[0] = y, f.out[1] = lse;
	f.i[0] = H, f.i[1] = 1, f.f[0] = 1.0 / sqrt((double)(C / H));
	b = f;
	b.type = KILN_OP_ATTENTION_BWD, b.n_in = 4, b.n_out = 1;
	b.in[0] = b.in[2] = y, b.in[1] = qkv, b.in[3] = lse, b.out[0] = qkv;
	void *pf, *pb, *ws, *dQ, *dY, *dL, *dDY, *dG;
	size_t wf, wb;
	CHECK(kiln_device_prepare(dev, &f, &pf, &wf));
	CHECK(kiln_device_prepare(dev, &b, &pb, &wb));
	const size_t nq = (size_t)(B * T * 3 * C), ny = (size_t)(B * T * C);
	float *h = malloc(nq * 4);
	for (size_t i = 0; i < nq; i++)
		h[i] = (float)sin(0.731 * (double)i);
	CHECK(kiln_device_alloc(dev, wf > wb ? wf : wb, &ws));
	CHECK(kiln_device_alloc(dev, nq * 4, &dQ));
	CHECK(kiln_device_alloc(dev, ny * 4, &dY));
	CHECK(kiln_device_alloc(dev, (size_t)(B * H * T) * 4, &dL));
	CHECK(kiln_device_alloc(dev, ny * 4, &dDY));
	CHECK(kiln_device_alloc(dev, nq * 4, &dG));
	CHECK(kiln_device_copy_async(dev, dQ, h, nq * 4, KILN_COPY_H2D, s));
	CHECK(kiln_device_copy_async(dev, dDY, h, ny * 4, KILN_COPY_H2D, s));
	CHECK(kiln_device_stream_sync(dev, s));
	struct kiln_op_args af = { .in = { dQ }, .out = { dY, dL }, .workspace = ws,
				   .workspace_bytes = wf };
	struct kiln_op_args ab = { .in = { dDY, dQ, dY, dL }, .out = { dG }, .workspace = ws,
				   .workspace_bytes = wb };
	double *tf = malloc(sizeof(double) * (size_t)(reps + 2)), *tb = malloc(sizeof(double) * (size_t)(reps + 2));
	double c0 = 0;
	for (int r = 0; r < reps + 2; r++) {
		if (r == 2)
			c0 = cpu_now();
		double t0 = now();
		CHECK(kiln_device_run(dev, pf, &af, s));
		CHECK(kiln_device_stream_sync(dev, s));
		double t1 = now();
		CHECK(kiln_device_run(dev, pb, &ab, s));
		CHECK(kiln_device_stream_sync(dev, s));
		tf[r] = t1 - t0;
		tb[r] = now() - t0;
	}
	const double cpu = (cpu_now() - c0) / reps;
	qsort(tf + 2, (size_t)reps, sizeof *tf, cmp_double);
	qsort(tb + 2, (size_t)reps, sizeof *tb, cmp_double);
	printf("kiln attention B=%lld T=%lld C=%lld H=%lld threads=%s: fwd+bwd %.3f ms (fwd %.3f ms), median of %d; min %.3f ms (fwd %.3f ms); CPU %.3f ms a pair\n",
	       (long long)B, (long long)T, (long long)C, (long long)H, argv[1], tb[2 + reps / 2] * 1e3,
	       tf[2 + reps / 2] * 1e3, reps, tb[2] * 1e3, tf[2] * 1e3, cpu * 1e3);
	void *bufs[] = { ws, dQ, dY, dL, dDY, dG };
	for (int i = 0; i < 6; i++)
		kiln_device_free(dev, bufs[i]);
	kiln_device_plan_free(dev, pf);
	kiln_device_plan_free(dev, pb);
	kiln_device_stream_destroy(dev, s);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	free(h), free(tf), free(tb);
	return 0;
}
