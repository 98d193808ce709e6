/* bench/wino_ops.c - the ResNet example's stride-1 3x3 convolutions (f32
 * NHWC forward with bias and ReLU, as in an inference plan: 16 -> 16 at
 * 28x28, 32 -> 32 at 14x14, 64 -> 64 at 7x7; or --shape) on the cpu device,
 * by Winograd F(4x4, 3x3) (plugins/cpu/wino.c, conv_algo = winograd) and
 * by oneDNN's fastest of its first three kernels (conv_algo = direct,
 * conv_impl = auto), interleaved: the least wall and process CPU time of a
 * run over ITERS runs, in ms, and GFLOP/s of the direct sum's 2 C O 9
 * flops an output pixel.  --residual: a residual input in the epilogue.
 *
 * Usage: bench/wino_ops [--iters N] [--batch B] [--threads T] [--residual]
 *        [--shape C,H,O,P] */
#include "bench_ops.h"

static void one_shape(struct kiln_registry *reg, const struct bench_opts *o, int C, int H, int O, int P, int res)
{
	const int OH = H + 2 * P - 2;
	struct kiln_tensor_desc bias;
	const int64_t bd[1] = { O };
	kiln_tensor_desc_init(&bias, KILN_F32, 1, bd);
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_CONV, op.n_in = 3, op.n_out = 1;
	op.in[0] = bench_d4(o->batch, C, H, H, KILN_NHWC), op.in[1] = bench_d4(O, C, 3, 3, KILN_NCHW);
	op.in[2] = bias, op.out[0] = bench_d4(o->batch, O, OH, OH, KILN_NHWC);
	op.flags = KILN_OPF_ACT | KILN_OPF_FROZEN | (res ? KILN_OPF_RESIDUAL : 0);
	op.i[KILN_OPI_ACT] = KILN_ACT_RELU;
	if (res)
		op.in[op.n_in++] = op.out[0];
	op.i[0] = op.i[1] = 1, op.i[2] = op.i[3] = P, op.i[4] = op.i[5] = op.i[6] = 1;
	static const char *const ov[2][4] = {
		{ "plugin.cpu.conv_algo=winograd", "plugin.cpu.tune_cache=none", NULL },
		{ "plugin.cpu.conv_algo=direct", "plugin.cpu.conv_impl=auto", "plugin.cpu.tune_cache=none", NULL },
	};
	struct bench_op b[2];
	for (int a = 0; a < 2; a++)
		bench_op_open(&b[a], reg, o->threads, ov[a], &op);
	for (int a = 0; a < 2; a++)
		bench_op_run(&b[a]); /* warm-up */
	for (int it = 0; it < o->iters; it++)
		for (int a = 0; a < 2; a++)
			bench_op_run(&b[a]);
	const double gf = 2.0 * C * O * 9 * OH * OH * o->batch * 1e-9;
	printf("%3d->%-3d %3dx%-3d %10.3f %10.3f %10.3f %10.3f %8.1f %8.1f %8.2f\n", C, O, H, H, 1e3 * b[0].wall,
	       1e3 * b[1].wall, 1e3 * b[0].cpu, 1e3 * b[1].cpu, gf / b[0].wall, gf / b[1].wall, b[1].wall / b[0].wall);
	for (int a = 0; a < 2; a++)
		bench_op_close(&b[a]);
}

int main(int argc, char **argv)
{
	struct bench_opts o = { .iters = 20, .batch = 16, .threads = 2 };
	int res = 0, C = 0, H = 0, O = 0, P = 1;
	for (int i = 1; i < argc; i++) {
		if (bench_opt(argc, argv, &i, &o))
			;
		else if (!strcmp(argv[i], "--residual"))
			res = 1;
		else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
			 sscanf(argv[++i], "%d,%d,%d,%d", &C, &H, &O, &P) == 4)
			;
		else {
			fprintf(stderr, "usage: %s [--iters N] [--batch B] [--threads T] [--residual] [--shape C,H,O,P]\n",
				argv[0]);
			return 2;
		}
	}
	struct kiln_registry *reg;
	TRY(kiln_registry_open(NULL, &reg));
	printf("f32 NHWC 3x3 conv forward (bias, ReLU%s), batch %d, %d thread(s), least of %d runs\n",
	       res ? ", residual" : "", o.batch, o.threads, o.iters);
	printf("%-16s %10s %10s %10s %10s %8s %8s %8s\n", "shape", "wino wall", "dnn wall", "wino cpu", "dnn cpu",
	       "wino GF", "dnn GF", "dnn/wino");
	if (C)
		one_shape(reg, &o, C, H, O, P, res);
	else {
		one_shape(reg, &o, 16, 28, 16, 1, res);
		one_shape(reg, &o, 32, 14, 32, 1, res);
		one_shape(reg, &o, 64, 7, 64, 1, res);
	}
	kiln_registry_close(reg);
	return 0;
}
