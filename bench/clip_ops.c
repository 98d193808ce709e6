/* bench/clip_ops.c - GRAD_CLIP (the global norm and the scaling) on the
 * cpu device, alone, over N f32 gradients in place: the MLP's 535040
 * parameters by default; 16M and 80M take the kernel's rounds of 8M
 * elements (session 21).  Prints the least and the median wall and
 * process CPU time (user + sys, every thread's) of a run over ITERS runs,
 * in ms.
 *
 * Usage: bench/clip_ops [--iters N] [--threads T] [--n ELEMENTS] */
#include "bench_ops.h"
#include "bench_time.h"

enum { MAXIT = 1000 };

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 20, .batch = 0, .threads = 2 };
	long long n = 535040;
	for (int i = 1; i < argc; i++)
		if (!bench_opt(argc, argv, &i, &o) &&
		    !(!strcmp(argv[i], "--n") && i + 1 < argc && (n = atoll(argv[++i])) > 0)) {
			fprintf(stderr, "usage: %s [--iters N] [--threads T] [--n ELEMENTS]\n", argv[0]);
			return 2;
		}
	const int iters = o.iters < 1 ? 1 : o.iters > MAXIT ? MAXIT : o.iters;
	struct bench_cpu cpu;
	bench_cpu_open(&cpu, o.threads);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_GRAD_CLIP, op.n_in = 1, op.n_out = 2;
	const int64_t gd = n, sd = 4;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &gd);
	op.out[0] = op.in[0];
	kiln_tensor_desc_init(&op.out[1], KILN_F32, 1, &sd);
	op.i[0] = n, op.f[0] = 1e30; /* a norm never reached: no scaling pass */
	void *plan, *st;
	size_t wsb = 0;
	TRY(kiln_device_prepare(cpu.dev, &op, &plan, &wsb));
	void *g = bench_buf(cpu.dev, (size_t)n * 4);
	TRY(kiln_device_alloc(cpu.dev, 16, &st));
	const struct kiln_op_args a = { .in = { g }, .out = { g, st } };
	static double tw[MAXIT], tc[MAXIT];
	for (int it = -2; it < iters; it++) { /* two warm-up runs */
		const double w0 = now(), c0 = cpu_now();
		TRY(kiln_device_run(cpu.dev, plan, &a, cpu.stream));
		TRY(kiln_device_stream_sync(cpu.dev, cpu.stream));
		if (it >= 0)
			tw[it] = now() - w0, tc[it] = cpu_now() - c0;
	}
	qsort(tw, (size_t)iters, sizeof(double), cmp_double);
	qsort(tc, (size_t)iters, sizeof(double), cmp_double);
	printf("grad_clip n %lld, %d thread(s), %d runs: wall ms least %.3f median %.3f; CPU ms least %.3f median %.3f\n",
	       n, o.threads, iters, 1e3 * tw[0], 1e3 * tw[iters / 2], 1e3 * tc[0], 1e3 * tc[iters / 2]);
	kiln_device_plan_free(cpu.dev, plan);
	bench_cpu_close(&cpu);
	return 0;
}
