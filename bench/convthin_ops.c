/* bench/convthin_ops.c - a first layer's convolution (the CNN example's
 * conv1: x [B,1,28,28], w [32,1,5,5], pad 2) on the cpu device, forward
 * (bias, fused ReLU) and weight gradient (bias gradient), by kiln's
 * direct kernel for few input channels (plugins/cpu/convthin.c) and by
 * oneDNN (KILN_CPU_CONVTHIN=0 when the plan is made), interleaved: the
 * least wall time and process CPU time (every thread's) of a run over
 * ITERS runs, in ms.  --bf16: bf16 activations and weights (the bf16
 * CNN's conv1; oneDNN's bf16 kernel, `bf16_conv = bf16`, against it).
 *
 * Usage: bench/convthin_ops [--iters N] [--batch B] [--threads T] [--bf16]
 *        [--nhwc] [--shape C,H,O,K,P] */
#include "bench_ops.h"

/* b: kiln's kernel (thin) or oneDNN's (KILN_CPU_CONVTHIN=0 while the plan
 * is made; bf16: its bf16 kernel, bf16_conv = bf16) */
static void open_op(struct bench_op *b, struct kiln_registry *reg, int thin, int threads,
		    const struct kiln_op *op)
{
	setenv("KILN_CPU_CONVTHIN", thin ? "1" : "0", 1);
	bench_op_open(b, reg, threads,
		      (const char *const[]){ thin ? "plugin.cpu.bf16_conv=auto" : "plugin.cpu.bf16_conv=bf16",
					     NULL },
		      op);
	unsetenv("KILN_CPU_CONVTHIN");
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 20, .batch = 128, .threads = 2 };
	int bf16 = 0, nhwc = 0, C = 1, H = 28, O = 32, K = 5, P = 2;
	for (int i = 1; i < argc; i++) {
		if (bench_opt(argc, argv, &i, &o))
			;
		else if (!strcmp(argv[i], "--bf16"))
			bf16 = 1;
		else if (!strcmp(argv[i], "--nhwc"))
			nhwc = 1;
		else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
			 sscanf(argv[++i], "%d,%d,%d,%d,%d", &C, &H, &O, &K, &P) == 5)
			;
		else {
			fprintf(stderr, "usage: %s [--iters N] [--batch B] [--threads T] [--bf16] [--nhwc] [--shape C,H,O,K,P]\n",
				argv[0]);
			return 2;
		}
	}
	struct kiln_registry *reg;
	TRY(kiln_registry_open(NULL, &reg));
	const int lay = nhwc ? KILN_NHWC : KILN_NCHW, OH = H + 2 * P - K + 1, dt = bf16 ? KILN_BF16 : KILN_F32;
	struct kiln_tensor_desc x = bench_d4(o.batch, C, H, H, lay), y = bench_d4(o.batch, O, OH, OH, lay),
				w = bench_d4(O, C, K, K, KILN_NCHW), bias, dw = w;
	x.dtype = y.dtype = w.dtype = dt;
	const int64_t bd[1] = { O };
	kiln_tensor_desc_init(&bias, KILN_F32, 1, bd);
	printf("conv x [%d,%d,%d,%d] w [%d,%d,%d,%d] pad %d %s %s, %d thread(s), least of %d runs\n",
	       o.batch, C, H, H, O, C, K, K, P, nhwc ? "NHWC" : "NCHW", bf16 ? "bf16" : "f32", o.threads,
	       o.iters);
	printf("%-12s %10s %10s %10s %10s %8s\n", "pass", "thin wall", "dnn wall", "thin cpu", "dnn cpu",
	       "dnn/thin");
	static const char *const names[2] = { "forward", "bwd_weights" };
	for (int pass = 0; pass < 2; pass++) {
		struct kiln_op op;
		memset(&op, 0, sizeof op);
		op.i[0] = op.i[1] = 1, op.i[2] = op.i[3] = P, op.i[4] = op.i[5] = op.i[6] = 1;
		if (pass == 0) {
			op.type = KILN_OP_CONV, op.n_in = 3, op.n_out = 1;
			op.in[0] = x, op.in[1] = w, op.in[2] = bias, op.out[0] = y;
			op.flags = KILN_OPF_ACT;
			op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
		} else {
			dw.dtype = KILN_F32;
			op.type = KILN_OP_CONV_BWD_WEIGHTS, op.n_in = 2, op.n_out = 2;
			op.in[0] = x, op.in[1] = y, op.out[0] = dw, op.out[1] = bias;
		}
		struct bench_op b[2];
		for (int a = 0; a < 2; a++)
			open_op(&b[a], reg, a == 0, o.threads, &op);
		for (int a = 0; a < 2; a++)
			bench_op_run(&b[a]); /* warm-up */
		for (int it = 0; it < o.iters; it++)
			for (int a = 0; a < 2; a++)
				bench_op_run(&b[a]);
		printf("%-12s %10.3f %10.3f %10.3f %10.3f %8.2f\n", names[pass], 1e3 * b[0].wall,
		       1e3 * b[1].wall, 1e3 * b[0].cpu, 1e3 * b[1].cpu, b[1].wall / b[0].wall);
		for (int a = 0; a < 2; a++)
			bench_op_close(&b[a]);
	}
	kiln_registry_close(reg);
	return 0;
}
