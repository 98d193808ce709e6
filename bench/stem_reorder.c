/* bench/stem_reorder.c - what the reorders around the Fashion-MNIST CNN's
 * first convolution (conv1: 1 -> 32 channels, 5x5, pad 2, 28x28, bias +
 * ReLU) cost on this CPU against the convolution itself, and against the
 * memory's own rate (issue 22, docs/PERFORMANCE.md "Session 15: the CNN's
 * reorders").  Each row is oneDNN through the same calls as
 * plugins/cpu/conv.c:
 *
 *   fwd blocked      forward_training, x plain NCHW (one channel: NHWC's
 *                    bytes too), y `any` (oneDNN picks nChw8c on AVX2),
 *                    then the reorder of y to plain NCHW: an NCHW model's
 *                    conv1 in kiln today
 *   fwd nchw         y bound plain NCHW: no reorder, oneDNN's gemm kernel
 *   fwd nhwc         x and y plain NHWC: an NHWC model's conv1
 *   memcpy           one copy of y's bytes (12.8 MB at batch 128): the
 *                    floor any pass over y costs
 *   bwdw nhwc        the weight gradient of one block of 16 samples (how
 *                    convsplit.c splits it) with x and dy NHWC, after the
 *                    reorder of dy from plain NCHW: an NCHW model's conv1
 *                    (conv.c's `flat1`)
 *   bwdw nchw        the same with dy bound plain NCHW (oneDNN's gemm
 *                    kernel, no reorder)
 *
 * Each cell is the least process CPU time (user + sys, all threads) per
 * call over 5 repetitions of ITERS calls, so other processes' load
 * inflates it less than wall time.  The bias gradient is left out of the
 * weight gradients (kiln sums it itself for these kernels).
 *
 * Usage: bench/stem_reorder [--iters N] [--batch B]   (threads: OMP_NUM_THREADS) */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(call)                                                                              \
	do {                                                                                   \
		dnnl_status_t s_ = (call);                                                     \
		if (s_ != dnnl_success) {                                                      \
			fprintf(stderr, "stem_reorder: %s:%d: %s: status %d\n", __FILE__,      \
				__LINE__, #call, (int)s_);                                     \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

enum { C_OUT = 32, HW = 28, K = 5, PAD = 2, WBLOCK = 16, REPS = 5 };

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int iters = 20;

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

static void act(dnnl_memory_desc_t *md, int n, int c, dnnl_format_tag_t tag)
{
	dnnl_dims_t d = { n, c, HW, HW };
	TRY(dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32, tag));
}

/* Least CPU ms per call of primitive p with its arguments. */
static double time_prim(dnnl_primitive_t p, int nargs, const dnnl_exec_arg_t *args)
{
	double best = 1e30;
	TRY(dnnl_primitive_execute(p, stream, nargs, args)); /* first touch */
	TRY(dnnl_stream_wait(stream));
	for (int r = 0; r < REPS; r++) {
		const double t0 = cpu_ms();
		for (int i = 0; i < iters; i++)
			TRY(dnnl_primitive_execute(p, stream, nargs, args));
		TRY(dnnl_stream_wait(stream));
		const double t = (cpu_ms() - t0) / iters;
		best = t < best ? t : best;
	}
	return best;
}

/* A reorder primitive from -> to and its timing. */
static double time_reorder(const dnnl_memory_desc_t *from, dnnl_memory_t mf,
			   const dnnl_memory_desc_t *to, dnnl_memory_t mt)
{
	dnnl_primitive_desc_t pd;
	dnnl_primitive_t p;
	TRY(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL));
	TRY(dnnl_primitive_create(&p, pd));
	const dnnl_exec_arg_t a[2] = { { DNNL_ARG_FROM, mf }, { DNNL_ARG_TO, mt } };
	const double t = time_prim(p, 2, a);
	dnnl_primitive_destroy(p);
	dnnl_primitive_desc_destroy(pd);
	return t;
}

static void conv_desc(dnnl_convolution_desc_t *d, const dnnl_memory_desc_t *x,
		      const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *b,
		      const dnnl_memory_desc_t *y)
{
	dnnl_dims_t strides = { 1, 1 }, pad = { PAD, PAD };
	TRY(dnnl_convolution_forward_desc_init(d, dnnl_forward_training, dnnl_convolution_direct, x,
					       w, b, y, strides, pad, pad));
}

/* The forward with x and y in xt, yt (y `any`: then also y's reorder to
 * plain NCHW); prints one row. */
static void forward(const char *name, int N, dnnl_format_tag_t xt, dnnl_format_tag_t yt)
{
	dnnl_memory_desc_t x, y, yu, w, b;
	dnnl_dims_t wd = { C_OUT, 1, K, K }, bd = { C_OUT };
	act(&x, N, 1, xt);
	act(&y, N, C_OUT, yt);
	act(&yu, N, C_OUT, dnnl_nchw);
	TRY(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any));
	TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a));
	dnnl_convolution_desc_t desc;
	conv_desc(&desc, &x, &w, &b, &y);
	dnnl_primitive_attr_t attr;
	dnnl_post_ops_t po;
	TRY(dnnl_primitive_attr_create(&attr));
	TRY(dnnl_post_ops_create(&po));
	TRY(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
	TRY(dnnl_primitive_attr_set_post_ops(attr, po));
	dnnl_primitive_desc_t pd;
	TRY(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL));
	const dnnl_memory_desc_t *yk = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
	const dnnl_memory_desc_t *wk = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
	dnnl_memory_t mx = filled(&x), mw = filled(wk), mb = filled(&b), my = filled(yk);
	dnnl_primitive_t p;
	TRY(dnnl_primitive_create(&p, pd));
	const dnnl_exec_arg_t a[4] = { { DNNL_ARG_SRC, mx }, { DNNL_ARG_WEIGHTS, mw },
				       { DNNL_ARG_BIAS, mb }, { DNNL_ARG_DST, my } };
	const double tc = time_prim(p, 4, a);
	double tr = 0;
	if (yt == dnnl_format_tag_any && !dnnl_memory_desc_equal(yk, &yu)) {
		dnnl_memory_t mu = filled(&yu);
		tr = time_reorder(yk, my, &yu, mu);
		dnnl_memory_destroy(mu);
	}
	const char *impl = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
	printf("%-14s %-14s %9.3f %9.3f %9.3f\n", name, impl, tc, tr, tc + tr);
	dnnl_primitive_destroy(p);
	dnnl_primitive_desc_destroy(pd);
	dnnl_memory_destroy(mx), dnnl_memory_destroy(mw), dnnl_memory_destroy(mb);
	dnnl_memory_destroy(my);
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
}

/* The weight gradient of one block of WBLOCK samples with x and dy in tag
 * (NHWC: after the reorder of dy from plain NCHW); prints one row with
 * the per-batch figures (N / WBLOCK blocks). */
static void bwd_weights(const char *name, int N, dnnl_format_tag_t tag)
{
	dnnl_memory_desc_t x, y, yu, w, b;
	dnnl_dims_t wd = { C_OUT, 1, K, K }, bd = { C_OUT };
	act(&x, WBLOCK, 1, tag);
	act(&y, WBLOCK, C_OUT, tag);
	act(&yu, WBLOCK, C_OUT, dnnl_nchw);
	TRY(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any));
	TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a));
	dnnl_convolution_desc_t fdesc, desc;
	conv_desc(&fdesc, &x, &w, &b, &y);
	dnnl_primitive_desc_t hint, pd;
	TRY(dnnl_primitive_desc_create(&hint, &fdesc, NULL, engine, NULL));
	dnnl_dims_t strides = { 1, 1 }, pad = { PAD, PAD };
	TRY(dnnl_convolution_backward_weights_desc_init(&desc, dnnl_convolution_direct, &x, &w, NULL,
							&y, strides, pad, pad));
	TRY(dnnl_primitive_desc_create(&pd, &desc, NULL, engine, hint));
	const dnnl_memory_desc_t *wk = dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
	const dnnl_memory_desc_t *sk = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	dnnl_memory_t mx = filled(&x), mw = filled(wk), my = filled(&y), ms = filled(sk);
	dnnl_primitive_t p;
	TRY(dnnl_primitive_create(&p, pd));
	const dnnl_exec_arg_t a[4] = { { DNNL_ARG_SRC, mx }, { DNNL_ARG_DIFF_WEIGHTS, mw },
				       { DNNL_ARG_DIFF_DST, my }, { DNNL_ARG_SCRATCHPAD, ms } };
	const double blocks = (double)N / WBLOCK;
	const double tc = time_prim(p, 4, a) * blocks;
	double tr = 0;
	if (!dnnl_memory_desc_equal(&y, &yu)) {
		dnnl_memory_t mu = filled(&yu);
		tr = time_reorder(&yu, mu, &y, my) * blocks;
		dnnl_memory_destroy(mu);
	}
	const char *impl = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
	printf("%-14s %-14s %9.3f %9.3f %9.3f\n", name, impl, tc, tr, tc + tr);
	dnnl_primitive_destroy(p);
	dnnl_primitive_desc_destroy(pd);
	dnnl_primitive_desc_destroy(hint);
	dnnl_memory_destroy(mx), dnnl_memory_destroy(mw), dnnl_memory_destroy(my);
	dnnl_memory_destroy(ms);
}

/* One copy of y's bytes. */
static void copy_row(int N)
{
	const size_t n = (size_t)N * C_OUT * HW * HW;
	float *a = aligned_alloc(64, n * sizeof *a), *b = aligned_alloc(64, n * sizeof *b);
	if (!a || !b) {
		fprintf(stderr, "stem_reorder: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++)
		a[i] = (float)(i % 97), b[i] = 0.0f;
	double best = 1e30;
	for (int r = 0; r < REPS; r++) {
		const double t0 = cpu_ms();
		for (int i = 0; i < iters; i++) {
			memcpy(b, a, n * sizeof *a);
			a[i] = b[n - 1 - (size_t)i]; /* keeps the copies */
		}
		const double t = (cpu_ms() - t0) / iters;
		best = t < best ? t : best;
	}
	printf("%-14s %-14s %9.3f %9.3f %9.3f\n", "memcpy y", "libc", best, 0.0, best);
	free(a), free(b);
}

int main(int argc, char **argv)
{
	int N = 128;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			N = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: stem_reorder [--iters N] [--batch B]\n");
			return 2;
		}
	}
	if (iters < 1 || N < WBLOCK || N % WBLOCK) {
		fprintf(stderr, "stem_reorder: --iters >= 1, --batch a multiple of %d\n", WBLOCK);
		return 2;
	}
	TRY(dnnl_engine_create(&engine, dnnl_cpu, 0));
	TRY(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
	printf("conv1 of the Fashion-MNIST CNN, batch %d, least CPU ms per call of %d x %d\n", N,
	       REPS, iters);
	printf("%-14s %-14s %9s %9s %9s\n", "row", "kernel", "op ms", "reorder", "total");
	forward("fwd blocked", N, dnnl_nchw, dnnl_format_tag_any);
	forward("fwd nchw", N, dnnl_nchw, dnnl_nchw);
	forward("fwd nhwc", N, dnnl_nhwc, dnnl_nhwc);
	copy_row(N);
	bwd_weights("bwdw nhwc", N, dnnl_nhwc);
	bwd_weights("bwdw nchw", N, dnnl_nchw);
	dnnl_stream_destroy(stream);
	dnnl_engine_destroy(engine);
	return 0;
}
