/* bench/drop_ops.c - the CNN example's dropouts on the cpu device, alone,
 * the ways interleaved:
 *   fwd, bwd        DROPOUT and DROPOUT_BWD of fc1's [B,1024] (p 0.4), x
 *                   and y apart, as the layer runs them
 *   fwd in place    the forward with y = x
 *   nhwc, nchw      DROPOUT of an NHWC (rows of C strided channels:
 *                   drop_nhwc) and an NCHW [B,C,H,W] activation (a
 *                   dropout before conv2: C,H 32,14)
 * Prints the least and the median process CPU time (user + sys, every
 * thread's) of a pass over ITERS runs, in ms.
 *
 * Usage: bench/drop_ops [--iters N] [--batch B] [--threads T] [--shape C,H] */
#include "bench_ops.h"
#include "bench_time.h"

enum { MAXIT = 1000, NW = 5 };

struct way {
	const char *name;
	void *plan, *x, *y;
	double t[MAXIT];
};

/* a DROPOUT (bwd: DROPOUT_BWD) of t; x and y its own buffers (y = x: in place) */
static void way(struct kiln_device *dev, struct way *w, const char *name, struct kiln_tensor_desc t,
		int bwd, int in_place)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = bwd ? KILN_OP_DROPOUT_BWD : KILN_OP_DROPOUT, op.n_in = 2, op.n_out = 1;
	op.in[0] = op.out[0] = t;
	kiln_tensor_desc_init(&op.in[1], KILN_I64, 1, &(int64_t){ KILN_DROP_CTR });
	op.i[0] = 1, op.i[1] = 11, op.f[0] = 0.4;
	size_t wsb = 0;
	TRY(kiln_device_prepare(dev, &op, &w->plan, &wsb));
	w->name = name;
	w->x = bench_buf(dev, kiln_tensor_bytes(&t));
	w->y = in_place ? w->x : bench_buf(dev, kiln_tensor_bytes(&t));
}

static void run(struct kiln_device *dev, void *stream, struct way *w, const void *step, int it)
{
	const struct kiln_op_args a = { .in = { w->x, step }, .out = { w->y } };
	const double c0 = cpu_now();
	TRY(kiln_device_run(dev, w->plan, &a, stream));
	TRY(kiln_device_stream_sync(dev, stream));
	w->t[it] = cpu_now() - c0;
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 30, .batch = 128, .threads = 1 };
	int C = 32, H = 14;
	for (int i = 1; i < argc; i++)
		if (!bench_opt(argc, argv, &i, &o) &&
		    !(!strcmp(argv[i], "--shape") && i + 1 < argc && sscanf(argv[++i], "%d,%d", &C, &H) == 2)) {
			fprintf(stderr, "usage: %s [--iters N] [--batch B] [--threads T] [--shape C,H]\n", argv[0]);
			return 2;
		}
	int iters = o.iters;
	const int B = o.batch, threads = o.threads;
	iters = iters < 1 ? 1 : iters > MAXIT ? MAXIT : iters;
	struct bench_cpu cpu;
	bench_cpu_open(&cpu, threads);
	struct kiln_device *dev = cpu.dev;
	void *stream = cpu.stream;
	void *step;
	/* the counter { step, row0, rstride }: one process's rows */
	TRY(kiln_device_alloc(dev, 8 * KILN_DROP_CTR, &step));
	memcpy(step, (int64_t[KILN_DROP_CTR]){ 5, 0, 1 }, 8 * KILN_DROP_CTR);
	struct kiln_tensor_desc flat, act;
	const int64_t fd[2] = { B, 1024 }, ad[4] = { B, C, H, H };
	kiln_tensor_desc_init(&flat, KILN_F32, 2, fd);
	kiln_tensor_desc_init(&act, KILN_F32, 4, ad);
	static struct way w[NW];
	way(dev, &w[0], "fwd", flat, 0, 0);
	way(dev, &w[1], "bwd", flat, 1, 0);
	way(dev, &w[2], "fwd in place", flat, 0, 1);
	act.layout = KILN_NHWC;
	way(dev, &w[3], "nhwc", act, 0, 0);
	act.layout = KILN_NCHW;
	way(dev, &w[4], "nchw", act, 0, 0);
	printf("dropout p 0.4: [%d,1024]; [%d,%d,%d,%d]; %d thread(s), process CPU ms of %d runs\n", B, B, C,
	       H, H, threads, iters);
	for (int it = -2; it < iters; it++) /* two warm-up runs */
		for (int k = 0; k < NW; k++)
			run(dev, stream, &w[k], step, it < 0 ? 0 : it);
	printf("%-14s %10s %10s\n", "way", "least", "median");
	for (int k = 0; k < NW; k++) {
		qsort(w[k].t, (size_t)iters, sizeof(double), cmp_double);
		printf("%-14s %10.3f %10.3f\n", w[k].name, 1e3 * w[k].t[0], 1e3 * w[k].t[iters / 2]);
	}
	bench_cpu_close(&cpu);
	return 0;
}
