/* bench/conv_layouts.c - what oneDNN's f32 convolution costs on this CPU for
 * each convolution of the ResNet example (batch 1000, Fashion-MNIST
 * 28x28), under the choices an inference plan could make:
 *
 *   nhwc             the activations channels-last, as kiln's inference
 *                    plan binds them today; bias + ReLU post-op
 *   nhwc+sum         the same with a sum post-op before the ReLU (the
 *                    residual Add + ReLU fused into the block's second conv)
 *   blocked          activations `any` (oneDNN picks, nChw8c on AVX2) with
 *                    bias + ReLU: the layout ONNX Runtime keeps (NCHWc)
 *   blocked+sum      the same with the sum post-op
 *   nhwc+add         nhwc with a binary add post-op of a whole nhwc tensor
 *                    (the residual read from its own buffer: what kiln's
 *                    KILN_OPF_RESIDUAL runs) before the ReLU
 *   wino             blocked, oneDNN's Winograd algorithm (3x3 stride 1
 *                    only; AVX-512); "-" where oneDNN has none
 *
 * forward_inference, weights in the kernel's own layout (reordered once,
 * untimed); activations are already in the layout measured (no reorders
 * timed).  Each cell is the least process CPU time (user + sys, every
 * thread's) of ITERS calls, so the load of other processes inflates it
 * less than wall time; the last row sums a column over the ResNet's nine
 * convolutions and gives its GFLOP/s.
 *
 * Usage: bench/conv_layouts [--iters N] [--batch B]   (threads: OMP_NUM_THREADS) */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(call)                                                                              \
	do {                                                                                   \
		dnnl_status_t s_ = (call);                                                     \
		if (s_ != dnnl_success) {                                                      \
			fprintf(stderr, "conv_layouts: %s:%d: %s: status %d\n", __FILE__,      \
				__LINE__, #call, (int)s_);                                     \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

enum { V_NHWC, V_NHWC_SUM, V_BLOCKED, V_BLOCKED_SUM, V_NHWC_ADD, V_WINO, N_VARIANT };
static const char *const variant_name[N_VARIANT] = { "nhwc", "nhwc+sum", "blocked", "blocked+sum",
						     "nhwc+add", "wino" };

/* The ResNet example's convolutions: in channels, in size, out channels,
 * kernel, stride (padding kernel / 2). */
static const struct conv_shape {
	const char *layer;
	int C, H, O, K, S;
} shapes[] = {
	{ "stem", 1, 28, 16, 3, 1 },     { "s1_conv1", 16, 28, 16, 3, 1 },
	{ "s1_conv2", 16, 28, 16, 3, 1 }, { "s2_conv1", 16, 28, 32, 3, 2 },
	{ "s2_conv2", 32, 14, 32, 3, 1 }, { "s2_down", 16, 28, 32, 1, 2 },
	{ "s3_conv1", 32, 14, 64, 3, 2 }, { "s3_conv2", 64, 7, 64, 3, 1 },
	{ "s3_down", 32, 14, 64, 1, 2 },
};
#define N_SHAPE (int)(sizeof shapes / sizeof shapes[0])

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static double cpu_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* A memory object of md with deterministic values in [-0.5, 0.5). */
static dnnl_memory_t filled(const dnnl_memory_desc_t *md)
{
	dnnl_memory_t m;
	void *h;
	TRY(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE));
	TRY(dnnl_memory_get_data_handle(m, &h));
	const size_t n = dnnl_memory_desc_get_size(md) / sizeof(float);
	for (size_t i = 0; i < n; i++)
		((float *)h)[i] = (float)((i * 7919) % 97) / 97.0f - 0.5f;
	return m;
}

/* The primitive descriptor of one convolution in variant v. */
static dnnl_primitive_desc_t conv_pd(const struct conv_shape *s, int N, int v)
{
	const int P = s->K / 2, OH = (s->H + 2 * P - s->K) / s->S + 1;
	const dnnl_format_tag_t tag = v == V_BLOCKED || v == V_BLOCKED_SUM || v == V_WINO
					      ? dnnl_format_tag_any
					      : dnnl_nhwc;
	dnnl_dims_t xd = { N, s->C, s->H, s->H }, yd = { N, s->O, OH, OH };
	dnnl_dims_t wd = { s->O, s->C, s->K, s->K }, bd = { s->O };
	dnnl_dims_t strides = { s->S, s->S }, pad = { P, P };
	dnnl_memory_desc_t x, y, w, b;
	dnnl_convolution_desc_t desc;
	dnnl_primitive_attr_t attr;
	dnnl_post_ops_t po;
	dnnl_primitive_desc_t pd;
	TRY(dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, tag));
	TRY(dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_f32, tag));
	TRY(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any));
	TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a));
	TRY(dnnl_convolution_forward_desc_init(&desc, dnnl_forward_inference,
					       v == V_WINO ? dnnl_convolution_winograd : dnnl_convolution_direct,
					       &x, &w, &b, &y, strides, pad, pad));
	TRY(dnnl_primitive_attr_create(&attr));
	TRY(dnnl_post_ops_create(&po));
	if (v == V_NHWC_SUM || v == V_BLOCKED_SUM)
		TRY(dnnl_post_ops_append_sum(po, 1.0f));
	if (v == V_NHWC_ADD)
		TRY(dnnl_post_ops_append_binary(po, dnnl_binary_add, &y));
	TRY(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
	TRY(dnnl_primitive_attr_set_post_ops(attr, po));
	dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
	if (st != dnnl_success && v == V_WINO)
		pd = NULL; /* no Winograd kernel for this shape */
	else
		TRY(st);
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return pd;
}

/* Least CPU ms of iters calls of one convolution in variant v; impl gets
 * the implementation oneDNN chose. */
static double conv_ms(const struct conv_shape *s, int N, int v, int iters, char *impl, size_t n)
{
	dnnl_primitive_desc_t pd = conv_pd(s, N, v);
	dnnl_primitive_t prim;
	const char *str = "?";
	if (!pd) {
		snprintf(impl, n, "-");
		return -1;
	}
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &str);
	snprintf(impl, n, "%s", str);
	TRY(dnnl_primitive_create(&prim, pd));
	const dnnl_query_t q[4] = { dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
				    dnnl_query_weights_md };
	const int arg[4] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS };
	dnnl_exec_arg_t args[5];
	const int n_args = v == V_NHWC_ADD ? 5 : 4;
	for (int k = 0; k < 4; k++)
		args[k] = (dnnl_exec_arg_t){ arg[k], filled(dnnl_primitive_desc_query_md(pd, q[k], k == 3 ? 1 : 0)) };
	if (v == V_NHWC_ADD) /* the residual: y's shape and layout */
		args[4] = (dnnl_exec_arg_t){ DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
					     filled(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0)) };
	double best = 1e300;
	for (int r = -2; r < iters; r++) { /* two warm-up calls */
		const double t0 = cpu_ms();
		TRY(dnnl_primitive_execute(prim, stream, n_args, args));
		TRY(dnnl_stream_wait(stream));
		const double t = cpu_ms() - t0;
		if (r >= 0 && t < best)
			best = t;
	}
	for (int k = 0; k < n_args; k++)
		dnnl_memory_destroy(args[k].memory);
	dnnl_primitive_destroy(prim);
	dnnl_primitive_desc_destroy(pd);
	return best;
}

int main(int argc, char **argv)
{
	int iters = 5, N = 1000;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--iters"))
			iters = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--batch"))
			N = atoi(argv[i + 1]);
	}
	if (iters < 1 || N < 1) {
		fprintf(stderr, "usage: bench/conv_layouts [--iters N] [--batch B]\n");
		return 2;
	}
	TRY(dnnl_engine_create(&engine, dnnl_cpu, 0));
	TRY(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
	double sum[N_VARIANT] = { 0 }, gflop = 0;
	printf("# bench/conv_layouts --iters %d --batch %d: least CPU ms per call\n", iters, N);
	printf("%-9s %7s", "layer", "GFLOP");
	for (int v = 0; v < N_VARIANT; v++)
		printf(" %11s", variant_name[v]);
	printf("  kernels\n");
	for (int i = 0; i < N_SHAPE; i++) {
		const struct conv_shape *s = &shapes[i];
		const int OH = (s->H + 2 * (s->K / 2) - s->K) / s->S + 1;
		const double gf = 2.0 * N * OH * OH * s->O * s->C * s->K * s->K * 1e-9;
		char impl[N_VARIANT][64];
		gflop += gf;
		printf("%-9s %7.2f", s->layer, gf);
		double ms[N_VARIANT];
		for (int v = 0; v < N_VARIANT; v++) {
			ms[v] = conv_ms(s, N, v, iters, impl[v], sizeof impl[v]);
			if (ms[v] < 0) { /* no Winograd: the blocked direct one counts in the sum */
				sum[v] += ms[V_BLOCKED];
				printf(" %11s", "-");
				continue;
			}
			sum[v] += ms[v];
			printf(" %11.2f", ms[v]);
		}
		printf("  %s / %s / %s / %s / %s\n", impl[V_NHWC], impl[V_NHWC_SUM], impl[V_BLOCKED],
		       impl[V_NHWC_ADD], impl[V_WINO]);
		fflush(stdout);
	}
	printf("%-9s %7.2f", "total", gflop);
	for (int v = 0; v < N_VARIANT; v++)
		printf(" %11.2f", sum[v]);
	printf("\n%-9s %7s", "GFLOP/s", "");
	for (int v = 0; v < N_VARIANT; v++)
		printf(" %11.1f", gflop / sum[v] * 1e3);
	printf("\n");
	dnnl_stream_destroy(stream);
	dnnl_engine_destroy(engine);
	return 0;
}
