/* bench/pool_ops.c - an NHWC model's last max pooling before a flatten
 * (the CNN example's pool2: x [B,64,14,14], 2x2/2, its conv's ReLU folded)
 * on the cpu device, forward and backward, three ways, interleaved:
 *   nhwc+reorder  POOL NHWC, then the flatten's REORDER of y to NCHW (and
 *                 of dy back to NHWC before POOL_BWD): what the NHWC model runs
 *   mixed         POOL NHWC -> NCHW (ABI 2.17), which would make the flatten
 *                 a view (docs/PERFORMANCE.md, "Session 18: the NHWC CNN")
 *   nchw          the NCHW model's POOL (for reference)
 *   nhwc          the first way's POOL alone (the reorders' share)
 *   nchw-bf16     the NCHW POOL on bf16 tensors (the bf16 CNN's; its inputs
 *                 bench_buf's float fill read as bf16: the odd elements
 *                 the floats' top halves, the even ones their low halves,
 *                 arbitrary bits, NaNs among them)
 * Prints the least and the median process CPU time (user + sys, every
 * thread's) of a pass over ITERS runs, in ms.
 *
 * Usage: bench/pool_ops [--iters N] [--batch B] [--threads T] [--shape C,H] */
#include "bench_ops.h"
#include "bench_time.h"

enum { MAXOPS = 2, MAXIT = 1000, NW = 5 };

struct step { /* one op: its plan and buffers (in k aliases another op's by name) */
	void *plan, *ws;
	size_t wsb;
	void *in[3], *out[2];
};

struct way {
	const char *name;
	int n;
	struct step s[MAXOPS];
	double t[MAXIT];
};

static void prep(struct kiln_device *dev, struct step *s, const struct kiln_op *op)
{
	TRY(kiln_device_prepare(dev, op, &s->plan, &s->wsb));
	s->ws = s->wsb ? bench_buf(dev, s->wsb) : NULL;
}

/* pool forward (n_out 2, the fold) from x in layout lx to y in ly; its
 * backward; the aux between them */
static void pool_pair(struct kiln_device *dev, struct step *f, struct step *b, struct kiln_tensor_desc x,
		      struct kiln_tensor_desc y)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_POOL, op.n_in = 1, op.n_out = 2;
	op.i[0] = KILN_POOL_MAX, op.i[1] = op.i[2] = op.i[3] = op.i[4] = 2;
	op.flags = KILN_OPF_ACT, op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	op.in[0] = x, op.out[0] = y;
	prep(dev, f, &op);
	f->in[0] = bench_buf(dev, kiln_tensor_bytes(&x));
	f->out[0] = bench_buf(dev, kiln_tensor_bytes(&y));
	f->out[1] = bench_buf(dev, kiln_device_aux_bytes(dev, f->plan));
	op.type = KILN_OP_POOL_BWD, op.n_in = 3, op.n_out = 1, op.flags = 0, op.i[KILN_OPI_ACT] = 0;
	op.in[0] = y, op.in[1] = (struct kiln_tensor_desc){ 0 }, op.in[2] = x, op.out[0] = x;
	prep(dev, b, &op);
	b->in[0] = bench_buf(dev, kiln_tensor_bytes(&y));
	b->in[1] = f->out[1], b->in[2] = f->in[0];
	b->out[0] = bench_buf(dev, kiln_tensor_bytes(&x));
}

static void reorder(struct kiln_device *dev, struct step *s, struct kiln_tensor_desc from,
		    struct kiln_tensor_desc to, void *in, void *out)
{
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_REORDER, op.n_in = 1, op.n_out = 1;
	op.in[0] = from, op.out[0] = to;
	prep(dev, s, &op);
	s->in[0] = in ? in : bench_buf(dev, kiln_tensor_bytes(&from));
	s->out[0] = out ? out : bench_buf(dev, kiln_tensor_bytes(&to));
}

static double run(struct kiln_device *dev, void *stream, struct way *w, int it)
{
	const double c0 = cpu_now();
	for (int k = 0; k < w->n; k++) {
		struct step *s = &w->s[k];
		struct kiln_op_args a = { .in = { s->in[0], s->in[1], s->in[2] },
					  .out = { s->out[0], s->out[1] },
					  .workspace = s->ws, .workspace_bytes = s->wsb };
		TRY(kiln_device_run(dev, s->plan, &a, stream));
	}
	TRY(kiln_device_stream_sync(dev, stream));
	return w->t[it] = cpu_now() - c0;
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 20, .batch = 128, .threads = 1 };
	int C = 64, H = 14;
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
	const int O = H / 2;
	const struct kiln_tensor_desc xh = bench_d4(B, C, H, H, KILN_NHWC), xc = bench_d4(B, C, H, H, KILN_NCHW),
				      yh = bench_d4(B, C, O, O, KILN_NHWC), yc = bench_d4(B, C, O, O, KILN_NCHW);
	/* forward and backward of each way: 0 nhwc+reorder, 1 mixed, 2 nchw, 3 nhwc, 4 nchw-bf16 */
	struct way w[2][NW] = { { { "nhwc+reorder", 2, { { 0 } }, { 0 } }, { "mixed", 1, { { 0 } }, { 0 } },
				  { "nchw", 1, { { 0 } }, { 0 } }, { "nhwc", 1, { { 0 } }, { 0 } },
				  { "nchw-bf16", 1, { { 0 } }, { 0 } } },
				{ { "nhwc+reorder", 2, { { 0 } }, { 0 } }, { "mixed", 1, { { 0 } }, { 0 } },
				  { "nchw", 1, { { 0 } }, { 0 } }, { "nhwc", 1, { { 0 } }, { 0 } },
				  { "nchw-bf16", 1, { { 0 } }, { 0 } } } };
	pool_pair(dev, &w[0][0].s[0], &w[1][0].s[1], xh, yh);
	reorder(dev, &w[0][0].s[1], yh, yc, w[0][0].s[0].out[0], NULL);
	reorder(dev, &w[1][0].s[0], yc, yh, NULL, w[1][0].s[1].in[0]);
	pool_pair(dev, &w[0][1].s[0], &w[1][1].s[0], xh, yc);
	pool_pair(dev, &w[0][2].s[0], &w[1][2].s[0], xc, yc);
	w[0][3].s[0] = w[0][0].s[0], w[1][3].s[0] = w[1][0].s[1];
	struct kiln_tensor_desc xb = xc, yb = yc;
	xb.dtype = yb.dtype = KILN_BF16;
	pool_pair(dev, &w[0][4].s[0], &w[1][4].s[0], xb, yb);
	printf("max pool 2x2/2 x [%d,%d,%d,%d], ReLU folded, %d thread(s), process CPU ms of %d runs\n",
	       B, C, H, H, threads, iters);
	for (int it = -2; it < iters; it++) /* two warm-up runs */
		for (int p = 0; p < 2; p++)
			for (int k = 0; k < NW; k++)
				run(dev, stream, &w[p][k], it < 0 ? 0 : it);
	printf("%-9s %-14s %10s %10s\n", "pass", "way", "least", "median");
	for (int p = 0; p < 2; p++)
		for (int k = 0; k < NW; k++) {
			qsort(w[p][k].t, (size_t)iters, sizeof(double), cmp_double);
			printf("%-9s %-14s %10.3f %10.3f\n", p ? "backward" : "forward", w[p][k].name,
			       1e3 * w[p][k].t[0], 1e3 * w[p][k].t[iters / 2]);
		}
	bench_cpu_close(&cpu);
	return 0;
}
