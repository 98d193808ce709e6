/* bench/fftconv_ops.c - the CNN example's conv2 (x [B,32,14,14], w
 * [64,32,5,5], pad 2) on the cpu device, each of its three passes
 * (forward with bias and fused ReLU, data gradient, weight gradient with
 * bias gradient) under [plugin.cpu] conv_algo = direct and fft,
 * interleaved: the least process CPU time (user + sys, every thread's)
 * of a run over ITERS runs, and its wall time, in ms.
 *
 * --kept: instead, the three passes of `fft` as a layer runs them with
 * kept spectra (KILN_OPF_KEEP: forward, weight gradient, data gradient,
 * each reading what the one before kept), interleaved with the same
 * passes unkept: the least process CPU time of each.
 *
 * Usage: bench/fftconv_ops [--iters N] [--batch B] [--threads T] [--nhwc]
 *        [--shape C,H,O,K,P] [--kept] */
#include "bench_ops.h"

/* b: conv_algo = algo (bench_op_open) */
static void open_op(struct bench_op *b, struct kiln_registry *reg, const char *algo, int threads,
		    const struct kiln_op *op)
{
	char ov[64];
	snprintf(ov, sizeof ov, "plugin.cpu.conv_algo=%s", algo);
	bench_op_open(b, reg, threads, (const char *const[]){ ov, NULL }, op);
}

static struct kiln_tensor_desc u8(size_t n)
{
	struct kiln_tensor_desc t;
	const int64_t d[1] = { n ? (int64_t)n : 1 };
	kiln_tensor_desc_init(&t, KILN_U8, 1, d);
	return t;
}

/* --kept: ops[3] (forward, data gradient, weight gradient) by fft, each
 * with KILN_OPF_KEEP and its kept copies on one device, run as a layer
 * does (forward, weight gradient, data gradient), against the plain ones */
static void kept_chain(struct kiln_registry *reg, int threads, int iters, const struct kiln_op *ops)
{
	struct bench_op plain[3], kept[3];
	struct kiln_op k[3];
	for (int p = 0; p < 3; p++) {
		open_op(&plain[p], reg, "fft", threads, &ops[p]);
		k[p] = ops[p];
		k[p].flags |= KILN_OPF_KEEP;
	}
	k[0].out[k[0].n_out++] = u8(0);
	open_op(&kept[0], reg, "fft", threads, &k[0]);
	const size_t kx = kiln_device_aux_bytes(kept[0].dev, kept[0].plan);
	k[2].in[k[2].n_in++] = u8(kx);
	k[2].out[k[2].n_out++] = u8(0);
	open_op(&kept[2], reg, "fft", threads, &k[2]);
	const size_t kdy = kiln_device_aux_bytes(kept[2].dev, kept[2].plan);
	if (!kx || !kdy) {
		fprintf(stderr, "fftconv_ops: the FFT keeps nothing (kept x %zu, dy %zu bytes)\n", kx, kdy);
		exit(1);
	}
	k[1].in[k[1].n_in++] = u8(kdy);
	open_op(&kept[1], reg, "fft", threads, &k[1]);
	/* the kept copies live on kept[0]'s device; one device would do,
	 * but open_op opens one a pass: the cpu device's memory is the host's */
	void *dkx, *dkdy;
	TRY(kiln_device_alloc(kept[0].dev, kx, &dkx));
	TRY(kiln_device_alloc(kept[0].dev, kdy, &dkdy));
	/* x, w, b; dy from the plain passes' inputs */
	void *x = kept[0].in[0], *w = kept[0].in[1], *bias = kept[0].in[2], *dy = kept[2].in[1];
	for (int it = 0; it <= iters; it++) {
		for (int p = 0; p < 3; p++)
			bench_op_run(&plain[p]);
		struct kiln_op_args f = { .in = { x, w, bias }, .out = { kept[0].out[0], dkx } };
		struct kiln_op_args g = { .in = { x, dy, dkx }, .out = { kept[2].out[0], kept[2].out[1], dkdy } };
		struct kiln_op_args d = { .in = { dy, w, dkdy }, .out = { kept[1].out[0] } };
		bench_op_run_args(&kept[0], &f);
		bench_op_run_args(&kept[2], &g);
		bench_op_run_args(&kept[1], &d);
		if (!it) /* warm-up */
			for (int p = 0; p < 3; p++)
				plain[p].cpu = kept[p].cpu = plain[p].wall = kept[p].wall = 1e30;
	}
	static const char *const names[3] = { "forward", "bwd_data", "bwd_weights" };
	printf("%-12s %12s %12s %12s %12s %8s\n", "pass", "fft cpu", "kept cpu", "fft wall", "kept wall",
	       "ratio");
	for (int p = 0; p < 3; p++)
		printf("%-12s %12.3f %12.3f %12.3f %12.3f %8.2f\n", names[p], 1e3 * plain[p].cpu,
		       1e3 * kept[p].cpu, 1e3 * plain[p].wall, 1e3 * kept[p].wall, plain[p].cpu / kept[p].cpu);
	printf("%-12s %12.3f %12.3f\n", "step", 1e3 * (plain[0].cpu + plain[1].cpu + plain[2].cpu),
	       1e3 * (kept[0].cpu + kept[1].cpu + kept[2].cpu));
	kiln_device_free(kept[0].dev, dkx);
	kiln_device_free(kept[0].dev, dkdy);
	for (int p = 0; p < 3; p++)
		bench_op_close(&plain[p]), bench_op_close(&kept[p]);
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 10, .batch = 128, .threads = 1 };
	int nhwc = 0, keep = 0, C = 32, H = 14, O = 64, K = 5, P = 2;
	for (int i = 1; i < argc; i++) {
		if (bench_opt(argc, argv, &i, &o))
			;
		else if (!strcmp(argv[i], "--nhwc"))
			nhwc = 1;
		else if (!strcmp(argv[i], "--kept"))
			keep = 1;
		else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
			 sscanf(argv[++i], "%d,%d,%d,%d,%d", &C, &H, &O, &K, &P) == 5)
			;
		else {
			fprintf(stderr, "usage: %s [--iters N] [--batch B] [--threads T] [--nhwc] [--shape C,H,O,K,P] [--kept]\n", argv[0]);
			return 2;
		}
	}
	const int iters = o.iters, B = o.batch, threads = o.threads;
	struct kiln_registry *reg;
	TRY(kiln_registry_open(NULL, &reg));
	const int lay = nhwc ? KILN_NHWC : KILN_NCHW, OH = H + 2 * P - K + 1;
	struct kiln_tensor_desc x = bench_d4(B, C, H, H, lay), y = bench_d4(B, O, OH, OH, lay),
				w = bench_d4(O, C, K, K, KILN_NCHW), bias;
	const int64_t bd[1] = { O };
	kiln_tensor_desc_init(&bias, KILN_F32, 1, bd);
	static const char *const names[3] = { "forward", "bwd_data", "bwd_weights" };
	static const char *const algos[2] = { "direct", "fft" };
	printf("conv x [%d,%d,%d,%d] w [%d,%d,%d,%d] pad %d %s, %d thread(s), least of %d runs\n", B, C,
	       H, H, O, C, K, K, P, nhwc ? "NHWC" : "NCHW", threads, iters);
	if (!keep)
		printf("%-12s %12s %12s %12s %12s %8s\n", "pass", "direct cpu", "fft cpu", "direct wall",
		       "fft wall", "ratio");
	struct kiln_op ops[3];
	for (int pass = 0; pass < 3; pass++) {
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.i[0] = op.i[1] = 1, op.i[2] = op.i[3] = P, op.i[4] = op.i[5] = op.i[6] = 1;
		if (pass == 0) {
			op.type = KILN_OP_CONV, op.n_in = 3, op.n_out = 1;
			op.in[0] = x, op.in[1] = w, op.in[2] = bias, op.out[0] = y;
			op.flags = KILN_OPF_ACT;
			op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		} else if (pass == 1) {
			op.type = KILN_OP_CONV_BWD_DATA, op.n_in = 2, op.n_out = 1;
			op.in[0] = y, op.in[1] = w, op.out[0] = x;
		} else {
			op.type = KILN_OP_CONV_BWD_WEIGHTS, op.n_in = 2, op.n_out = 2;
			op.in[0] = x, op.in[1] = y, op.out[0] = w, op.out[1] = bias;
		}
		ops[pass] = op;
		if (keep)
			continue;
		struct bench_op b[2];
		for (int a = 0; a < 2; a++)
			open_op(&b[a], reg, algos[a], threads, &op);
		for (int a = 0; a < 2; a++)
			bench_op_run(&b[a]); /* warm-up */
		for (int it = 0; it < iters; it++)
			for (int a = 0; a < 2; a++)
				bench_op_run(&b[a]);
		printf("%-12s %12.3f %12.3f %12.3f %12.3f %8.2f\n", names[pass], 1e3 * b[0].cpu,
		       1e3 * b[1].cpu, 1e3 * b[0].wall, 1e3 * b[1].wall, b[0].cpu / b[1].cpu);
		for (int a = 0; a < 2; a++)
			bench_op_close(&b[a]);
	}
	if (keep)
		kept_chain(reg, threads, iters, ops);
	kiln_registry_close(reg);
	return 0;
}
