/* bench/xent_ops.c - the fused loss (SOFTMAX_XENT) on the cpu device,
 * alone: the MLP's [B,C] logits (128 x 10), labels, the metrics with top-5
 * and the rows counted (4 sums), the gradient written over the logits as
 * the trainer runs it.  A sample is REPS runs (each too short for the
 * clock alone); prints the least and the median process CPU time (user +
 * sys, every thread's) of one run over ITERS samples, in us.
 *
 * Usage: bench/xent_ops [--iters N] [--batch B] [--threads T] [--classes C] */
#include "bench_ops.h"
#include "bench_time.h"

enum { MAXIT = 1000, REPS = 200 };

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 30, .batch = 128, .threads = 1 };
	int C = 10;
	for (int i = 1; i < argc; i++)
		if (!bench_opt(argc, argv, &i, &o) &&
		    !(!strcmp(argv[i], "--classes") && i + 1 < argc && (C = atoi(argv[++i])) > 0)) {
			fprintf(stderr, "usage: %s [--iters N] [--batch B] [--threads T] [--classes C]\n", argv[0]);
			return 2;
		}
	const int iters = o.iters < 1 ? 1 : o.iters > MAXIT ? MAXIT : o.iters, B = o.batch;
	struct bench_cpu cpu;
	bench_cpu_open(&cpu, o.threads);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT, op.n_in = 2, op.n_out = 2;
	const int64_t xd[2] = { B, C }, ld = B, md = 4;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 2, xd);
	op.out[0] = op.in[0];
	kiln_tensor_desc_init(&op.in[1], KILN_I32, 1, &ld);
	kiln_tensor_desc_init(&op.out[1], KILN_F32, 1, &md);
	op.i[0] = B, op.f[0] = 1.0 / B;
	void *plan;
	size_t wsb = 0;
	TRY(kiln_device_prepare(cpu.dev, &op, &plan, &wsb));
	const size_t xb = (size_t)B * C * 4;
	void *x0 = bench_buf(cpu.dev, xb), *x = bench_buf(cpu.dev, xb), *lab, *m;
	TRY(kiln_device_alloc(cpu.dev, (size_t)B * 4, &lab));
	TRY(kiln_device_alloc(cpu.dev, 16, &m));
	for (int r = 0; r < B; r++)
		((int32_t *)lab)[r] = (r * 7) % C;
	memset(m, 0, 16);
	const struct kiln_op_args a = { .in = { x, lab }, .out = { x, m } };
	static double t[MAXIT];
	for (int it = -2; it < iters; it++) { /* two warm-up samples */
		const double c0 = cpu_now();
		for (int k = 0; k < REPS; k++) {
			memcpy(x, x0, xb); /* the gradient overwrote the logits */
			TRY(kiln_device_run(cpu.dev, plan, &a, cpu.stream));
		}
		TRY(kiln_device_stream_sync(cpu.dev, cpu.stream));
		if (it >= 0)
			t[it] = (cpu_now() - c0) / REPS;
	}
	qsort(t, (size_t)iters, sizeof(double), cmp_double);
	printf("softmax_xent [%d,%d], top-5, %d thread(s): process CPU us a run (%d samples of %d): least %.3f median %.3f\n",
	       B, C, o.threads, iters, REPS, 1e6 * t[0], 1e6 * t[iters / 2]);
	kiln_device_plan_free(cpu.dev, plan);
	bench_cpu_close(&cpu);
	return 0;
}
