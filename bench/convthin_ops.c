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
#include "bench_time.h"

struct bench {
	struct kiln_device *dev;
	void *plan, *stream, *ws, *in[3], *out[2];
	size_t wsb;
	double cpu, wall;
};

static void open_op(struct bench *b, struct kiln_registry *reg, int thin, int threads,
		    const struct kiln_op *op)
{
	struct kiln_config *cfg;
	char ov[64];
	memset(b, 0, sizeof *b);
	b->cpu = b->wall = 1e30;
	TRY(kiln_config_new(&cfg));
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	TRY(kiln_config_override(cfg, ov));
	TRY(kiln_config_override(cfg, thin ? "plugin.cpu.bf16_conv=auto" : "plugin.cpu.bf16_conv=bf16"));
	setenv("KILN_CPU_CONVTHIN", thin ? "1" : "0", 1);
	TRY(kiln_device_open(reg, cfg, "cpu", 0, &b->dev));
	TRY(kiln_device_prepare(b->dev, op, &b->plan, &b->wsb));
	unsetenv("KILN_CPU_CONVTHIN");
	TRY(kiln_device_stream_create(b->dev, &b->stream));
	for (int k = 0; k < op->n_in; k++) {
		const size_t n = kiln_tensor_bytes(&op->in[k]);
		TRY(kiln_device_alloc(b->dev, n, &b->in[k]));
		for (size_t i = 0; i < n / 2; i++) /* bf16 or halves of f32: finite either way */
			((uint16_t *)b->in[k])[i] = (uint16_t)(0x3c00 + (i * 2654435761u) % 0x0400) |
						    (uint16_t)((i & 1) << 15);
	}
	for (int k = 0; k < op->n_out; k++) {
		const size_t n = kiln_tensor_bytes(&op->out[k]);
		TRY(kiln_device_alloc(b->dev, n, &b->out[k]));
		memset(b->out[k], 0, n);
	}
	if (b->wsb)
		TRY(kiln_device_alloc(b->dev, b->wsb, &b->ws));
	kiln_config_free(cfg);
}

static void run_op(struct bench *b)
{
	struct kiln_op_args a = { .in = { b->in[0], b->in[1], b->in[2] }, .out = { b->out[0], b->out[1] },
				  .workspace = b->ws, .workspace_bytes = b->wsb };
	const double c0 = cpu_now(), w0 = now();
	TRY(kiln_device_run(b->dev, b->plan, &a, b->stream));
	TRY(kiln_device_stream_sync(b->dev, b->stream));
	const double c = cpu_now() - c0, w = now() - w0;
	b->cpu = c < b->cpu ? c : b->cpu;
	b->wall = w < b->wall ? w : b->wall;
}

static void close_op(struct bench *b)
{
	for (int k = 0; k < 3; k++)
		kiln_device_free(b->dev, b->in[k]);
	for (int k = 0; k < 2; k++)
		kiln_device_free(b->dev, b->out[k]);
	kiln_device_free(b->dev, b->ws);
	kiln_device_plan_free(b->dev, b->plan);
	kiln_device_stream_destroy(b->dev, b->stream);
	kiln_device_close(b->dev);
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
		struct bench b[2];
		for (int a = 0; a < 2; a++)
			open_op(&b[a], reg, a == 0, o.threads, &op);
		for (int a = 0; a < 2; a++)
			run_op(&b[a]); /* warm-up */
		for (int it = 0; it < o.iters; it++)
			for (int a = 0; a < 2; a++)
				run_op(&b[a]);
		printf("%-12s %10.3f %10.3f %10.3f %10.3f %8.2f\n", names[pass], 1e3 * b[0].wall,
		       1e3 * b[1].wall, 1e3 * b[0].cpu, 1e3 * b[1].cpu, b[1].wall / b[0].wall);
		for (int a = 0; a < 2; a++)
			close_op(&b[a]);
	}
	kiln_registry_close(reg);
	return 0;
}
