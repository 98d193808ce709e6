/* bench/bf16_ops.c - what oneDNN offers for the bf16 CNN's heaviest ops
 * (issue 22): conv2 (5x5, 32 -> 64 channels, 14x14, pad 2) forward, data
 * gradient and weight gradient, and fc1's three GEMMs (3136 -> 1024), at
 * batch 128, each under every choice oneDNN takes for bf16:
 *
 *   conv  activations nchw / nhwc / any (oneDNN's blocked choice, nChw16c
 *         here) with weights `any`; every implementation oneDNN lists for
 *         the primitive descriptor (dnnl_primitive_desc_iterator_next,
 *         oneDNN 2.6's way to the next one; its reference loops left out);
 *         the weight gradient with an f32 (kiln's) or a bf16 dw, and on the
 *         whole batch or on blocks of --block samples (convsplit.c's
 *         blocks: the time of one block times N / block)
 *   fc1   oneDNN's matmul with each operand as kiln binds it (the weights
 *         [1024, 3136], read transposed by the forward) or pre-transposed,
 *         or `any` (oneDNN's packed weights: the reorder into them, which a
 *         training step would pay each step, is timed on its own row), every
 *         implementation listed
 *   peak  a square bf16 matmul (f32 result) of --n, every implementation:
 *         the bf16 peak the rows are a fraction of
 *
 * Activation reorders are not timed in the conv rows (the `reorder` rows
 * give what an nchw tensor's reorder into the kernel's layout costs).
 * Each cell is the process CPU time (every thread's) a call takes: the
 * least over --iters rounds of a round's mean (>= 50 CPU ms of calls, after
 * two warm-up calls), so another process's load inflates it less than wall
 * time; GFLOP/s is per CPU second (2 x MACs / CPU time): at 2 threads a
 * quiet op's wall GFLOP/s is up to twice it.  At 1 thread the CPU figure is
 * exact; at 2 it counts OpenMP's spinning and waiting on a loaded machine,
 * so the wall columns (the least wall time of one call, times N / block for
 * the blocks) are the 2-thread figures: each a best case.
 *
 * Usage: OMP_NUM_THREADS=T bench/bf16_ops [--iters N] [--batch B] [--block b] [--n S]
 *        [--only OP]   (the rows of ops whose name starts with OP: peak, fc1, conv2, reorder) */
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRY(call)                                                                              \
	do {                                                                                   \
		dnnl_status_t s_ = (call);                                                     \
		if (s_ != dnnl_success) {                                                      \
			fprintf(stderr, "bf16_ops: %s:%d: %s: status %d\n", __FILE__, __LINE__, \
				#call, (int)s_);                                               \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int iters = 3;
static const char *only = ""; /* --only: the rows whose op starts so */

static double cpu_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* A memory object of md, every 16-bit half 0x3e80 (bf16 0.25; f32 ~0.25):
 * no denormal, finite sums. */
static dnnl_memory_t filled(const dnnl_memory_desc_t *md)
{
	dnnl_memory_t m;
	void *h;
	TRY(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_ALLOCATE));
	TRY(dnnl_memory_get_data_handle(m, &h));
	const size_t n = dnnl_memory_desc_get_size(md) / 2;
	for (size_t i = 0; i < n; i++)
		((uint16_t *)h)[i] = 0x3e80;
	return m;
}

/* An argument of a primitive: its DNNL_ARG_* and the query of its md. */
struct arg {
	int arg;
	dnnl_query_t q;
	int idx;
};

/* CPU ms a call of pd's primitive on the n args: the least over `iters`
 * rounds of the mean over a round of calls that takes >= 50 CPU ms.  Not
 * the least of single calls: the kernel adds the time of a thread that
 * runs on another CPU to the process's clock at its ticks (4 ms at
 * HZ=250), so a 2 ms call of 2 threads may read as 1 thread's time. */
static double wall_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* the least wall ms of one call in the last time_pd (the call that ran
 * when this process had its cores: a loaded machine's best case) */
static double last_wall;

static double time_pd(dnnl_primitive_desc_t pd, const struct arg *a, int n)
{
	dnnl_primitive_t prim;
	dnnl_exec_arg_t args[8];
	int k = 0;
	for (int i = 0; i < n; i++) {
		const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, a[i].q, a[i].idx);
		if (!md || !md->ndims)
			continue;
		args[k++] = (dnnl_exec_arg_t){ a[i].arg, filled(md) };
	}
	TRY(dnnl_primitive_create(&prim, pd));
	double t0 = cpu_ms();
	for (int r = 0; r < 2; r++) /* warm-up */
		TRY(dnnl_primitive_execute(prim, stream, k, args));
	TRY(dnnl_stream_wait(stream));
	int calls = (int)(50.0 / ((cpu_ms() - t0) / 2 + 1e-3)) + 1;
	double best = 1e300;
	last_wall = 1e300;
	for (int r = 0; r < iters; r++) {
		t0 = cpu_ms();
		for (int c = 0; c < calls; c++) {
			const double w0 = wall_ms();
			TRY(dnnl_primitive_execute(prim, stream, k, args));
			TRY(dnnl_stream_wait(stream));
			const double w = wall_ms() - w0;
			last_wall = w < last_wall ? w : last_wall;
		}
		const double t = (cpu_ms() - t0) / calls;
		if (t < best)
			best = t;
	}
	for (int i = 0; i < k; i++)
		dnnl_memory_destroy(args[i].memory);
	dnnl_primitive_destroy(prim);
	return best;
}

/* A short name of md's layout: its format tag among a few, else "blk". */
static const char *layout(const dnnl_memory_desc_t *md)
{
	static const struct {
		dnnl_format_tag_t tag;
		const char *name;
	} tags[] = { { dnnl_nchw, "nchw" },       { dnnl_nhwc, "nhwc" },     { dnnl_nChw16c, "nChw16c" },
		     { dnnl_nChw8c, "nChw8c" },   { dnnl_ab, "ab" },         { dnnl_ba, "ba" },
		     { dnnl_oihw, "oihw" },       { dnnl_OIhw16i16o, "OIhw16i16o" },
		     { dnnl_OIhw8i16o2i, "OIhw8i16o2i" }, { dnnl_hwio, "hwio" } };
	for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
		dnnl_memory_desc_t t;
		if (dnnl_memory_desc_init_by_tag(&t, md->ndims, md->dims, md->data_type, tags[i].tag) ==
			    dnnl_success &&
		    dnnl_memory_desc_equal(&t, md))
			return tags[i].name;
	}
	return "blk";
}

/* Every implementation oneDNN lists for desc (its reference loops left
 * out), each timed: one row each. */
static void each_impl(const char *op, const char *variant, const void *desc,
		      dnnl_primitive_desc_t hint, const struct arg *a, int n, double gflop,
		      double mult, dnnl_query_t show)
{
	dnnl_primitive_desc_iterator_t it;
	if (strncmp(op, only, strlen(only)))
		return;
	if (dnnl_primitive_desc_iterator_create(&it, desc, NULL, engine, hint) != dnnl_success) {
		printf("%-10s %-22s %-36s %9s\n", op, variant, "(none)", "-");
		return;
	}
	char seen[16][64];
	int n_seen = 0;
	do {
		dnnl_primitive_desc_t pd = dnnl_primitive_desc_iterator_fetch(it);
		if (!pd)
			break;
		const char *name = "?";
		dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
		int dup = !strncmp(name, "ref", 3);
		for (int k = 0; k < n_seen && !dup; k++)
			dup = !strcmp(seen[k], name);
		if (!dup && n_seen < 16) {
			snprintf(seen[n_seen++], sizeof seen[0], "%s", name);
			const double ms = time_pd(pd, a, n) * mult;
			printf("%-10s %-22s %-28s %-11s %9.3f %8.1f %9.3f %8.1f\n", op, variant, name,
			       layout(dnnl_primitive_desc_query_md(pd, show, 0)), ms, gflop / ms * 1e3,
			       last_wall * mult, gflop / (last_wall * mult) * 1e3);
			fflush(stdout);
		}
		dnnl_primitive_desc_destroy(pd);
	} while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
	dnnl_primitive_desc_iterator_destroy(it);
}

/* conv2 at batch N in activation layout tag (any: oneDNN's), every op. */
static void conv2(int N, int block, dnnl_format_tag_t tag, const char *tname)
{
	const int C = 32, H = 14, O = 64, K = 5, P = 2;
	const double gflop = 2.0 * N * H * H * O * C * K * K * 1e-9;
	dnnl_dims_t wd = { O, C, K, K }, bd = { O }, st = { 1, 1 }, pad = { P, P };
	dnnl_memory_desc_t w, wf, b;
	TRY(dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_bf16, dnnl_format_tag_any));
	TRY(dnnl_memory_desc_init_by_tag(&wf, 4, wd, dnnl_f32, dnnl_format_tag_any));
	TRY(dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_a));
	char v[64];
	for (int pass = 0; pass < 2; pass++) {
		/* pass 0: the whole batch; 1: blocks of `block` (weight gradient) */
		const int n = pass ? block : N;
		if (pass && (block <= 0 || block >= N))
			break;
		const double mult = (double)N / n;
		dnnl_dims_t xd = { n, C, H, H }, yd = { n, O, H, H };
		dnnl_memory_desc_t x, y;
		TRY(dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_bf16, tag));
		TRY(dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_bf16, tag));
		dnnl_convolution_desc_t fd, dd, wgd;
		dnnl_primitive_desc_t hint;
		TRY(dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
						       &x, &w, &b, &y, st, pad, pad));
		TRY(dnnl_primitive_desc_create(&hint, &fd, NULL, engine, NULL));
		if (!pass) {
			const struct arg fa[] = { { DNNL_ARG_SRC, dnnl_query_src_md, 0 },
						  { DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0 },
						  { DNNL_ARG_BIAS, dnnl_query_weights_md, 1 },
						  { DNNL_ARG_DST, dnnl_query_dst_md, 0 } };
			each_impl("conv2.fwd", tname, &fd, NULL, fa, 4, gflop, 1, dnnl_query_src_md);
			TRY(dnnl_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &x, &w,
								     &y, st, pad, pad));
			const struct arg da[] = { { DNNL_ARG_DIFF_SRC, dnnl_query_diff_src_md, 0 },
						  { DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0 },
						  { DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0 } };
			each_impl("conv2.bwdd", tname, &dd, hint, da, 3, gflop, 1, dnnl_query_diff_src_md);
		}
		const struct arg wa[] = { { DNNL_ARG_SRC, dnnl_query_src_md, 0 },
					  { DNNL_ARG_DIFF_DST, dnnl_query_diff_dst_md, 0 },
					  { DNNL_ARG_DIFF_WEIGHTS, dnnl_query_diff_weights_md, 0 },
					  { DNNL_ARG_DIFF_BIAS, dnnl_query_diff_weights_md, 1 } };
		for (int wdt = 0; wdt < 2; wdt++) { /* dw f32 (kiln's), bf16 */
			snprintf(v, sizeof v, "%s dw%s%s", tname, wdt ? "bf16" : "f32",
				 pass ? " mb" : "");
			if (pass)
				snprintf(v + strlen(v), sizeof v - strlen(v), "%d", n);
			TRY(dnnl_convolution_backward_weights_desc_init(&wgd, dnnl_convolution_direct, &x,
									wdt ? &w : &wf, &b, &y, st,
									pad, pad));
			each_impl("conv2.bwdw", v, &wgd, hint, wa, 4, gflop, mult, dnnl_query_src_md);
		}
		dnnl_primitive_desc_destroy(hint);
	}
}

/* md [d0, d1] of dt, row-major (t = 0) or its transpose's bytes (t = 1),
 * or `any` (t = 2). */
static void mat(dnnl_memory_desc_t *md, int64_t d0, int64_t d1, dnnl_data_type_t dt, int t)
{
	dnnl_dims_t d = { d0, d1 };
	TRY(dnnl_memory_desc_init_by_tag(md, 2, d, dt,
					 t == 2 ? dnnl_format_tag_any : t ? dnnl_ba : dnnl_ab));
}

static const char *tname(int t) { return t == 2 ? "any" : t ? "T" : "N"; }

/* One matmul C[M,N] = A[M,K] B[K,N], A and B stored as ta / tb say. */
static void matmul(const char *op, int64_t M, int64_t N, int64_t K, int ta, int tb,
		   dnnl_data_type_t cdt, const char *note)
{
	dnnl_memory_desc_t a, b, c;
	dnnl_matmul_desc_t d;
	char v[64];
	mat(&a, M, K, dnnl_bf16, ta);
	mat(&b, K, N, dnnl_bf16, tb);
	mat(&c, M, N, cdt, 0);
	TRY(dnnl_matmul_desc_init(&d, &a, &b, NULL, &c));
	snprintf(v, sizeof v, "A%s B%s C%s%s", tname(ta), tname(tb), cdt == dnnl_f32 ? "f32" : "bf16",
		 note);
	const struct arg ma[] = { { DNNL_ARG_SRC, dnnl_query_src_md, 0 },
				  { DNNL_ARG_WEIGHTS, dnnl_query_weights_md, 0 },
				  { DNNL_ARG_DST, dnnl_query_dst_md, 0 } };
	each_impl(op, v, &d, NULL, ma, 3, 2.0 * M * N * K * 1e-9, 1,
		  tb == 2 ? dnnl_query_weights_md : dnnl_query_src_md);
}

/* A bf16 reorder of [d0,d1,...] from one layout into another: its CPU ms. */
static void reorder_row(const char *what, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to)
{
	dnnl_primitive_desc_t pd;
	if (strncmp("reorder", only, strlen(only)))
		return;
	TRY(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL));
	const struct arg ra[] = { { DNNL_ARG_FROM, dnnl_query_src_md, 0 },
				  { DNNL_ARG_TO, dnnl_query_dst_md, 0 } };
	const char *name = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
	const double ms = time_pd(pd, ra, 2);
	printf("%-10s %-22s %-28s %-11s %9.3f %8s %9.3f\n", "reorder", what, name, layout(to), ms,
	       "-", last_wall);
	dnnl_primitive_desc_destroy(pd);
}

int main(int argc, char **argv)
{
	int N = 128, block = 16, S = 1024;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--iters"))
			iters = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--batch"))
			N = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--block"))
			block = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--n"))
			S = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--only"))
			only = argv[i + 1];
	}
	if (iters < 1 || N < 1 || S < 1) {
		fprintf(stderr, "usage: bench/bf16_ops [--iters N] [--batch B] [--block b] [--n S] [--only OP]\n");
		return 2;
	}
	TRY(dnnl_engine_create(&engine, dnnl_cpu, 0));
	TRY(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
	const char *omp = getenv("OMP_NUM_THREADS");
	printf("# bench/bf16_ops --iters %d --batch %d --block %d --n %d, OMP_NUM_THREADS=%s: "
	       "least CPU ms a call, GFLOP per CPU second\n",
	       iters, N, block, S, omp ? omp : "(unset)");
	printf("%-10s %-22s %-28s %-11s %9s %8s %9s %8s\n", "op", "variant", "implementation", "layout",
	       "cpu_ms", "GFLOP/s", "wall_ms", "GFLOP/s");
	matmul("peak", S, S, S, 0, 0, dnnl_f32, "");
	matmul("peak", S, S, S, 0, 2, dnnl_f32, "");
	/* fc1: x[N,3136], W[1024,3136] (kiln's), dy[N,1024] */
	matmul("fc1.fwd", N, 1024, 3136, 0, 1, dnnl_bf16, " (kiln)");
	matmul("fc1.fwd", N, 1024, 3136, 0, 0, dnnl_bf16, " (W^T kept)");
	matmul("fc1.fwd", N, 1024, 3136, 0, 2, dnnl_bf16, " (packed)");
	matmul("fc1.bwdd", N, 3136, 1024, 0, 0, dnnl_bf16, " (kiln)");
	matmul("fc1.bwdd", N, 3136, 1024, 0, 1, dnnl_bf16, " (W^T kept)");
	matmul("fc1.bwdd", N, 3136, 1024, 0, 2, dnnl_bf16, " (packed)");
	matmul("fc1.bwdw", 1024, 3136, N, 1, 0, dnnl_f32, " (kiln)");
	matmul("fc1.bwdw", 1024, 3136, N, 0, 0, dnnl_f32, " (dy^T kept)");
	matmul("fc1.bwdw", 1024, 3136, N, 1, 2, dnnl_f32, " (x packed)");
	{
		dnnl_memory_desc_t from, to;
		mat(&from, 1024, 3136, dnnl_bf16, 0);
		mat(&to, 1024, 3136, dnnl_bf16, 1);
		reorder_row("fc1 W -> W^T", &from, &to);
	}
	conv2(N, block, dnnl_nchw, "nchw");
	conv2(N, block, dnnl_nhwc, "nhwc");
	conv2(N, block, dnnl_format_tag_any, "any");
	{
		dnnl_dims_t xd = { N, 32, 14, 14 }, yd = { N, 64, 14, 14 };
		dnnl_memory_desc_t f, t;
		TRY(dnnl_memory_desc_init_by_tag(&f, 4, xd, dnnl_bf16, dnnl_nchw));
		TRY(dnnl_memory_desc_init_by_tag(&t, 4, xd, dnnl_bf16, dnnl_nChw16c));
		reorder_row("conv2 x nchw->16c", &f, &t);
		TRY(dnnl_memory_desc_init_by_tag(&f, 4, yd, dnnl_bf16, dnnl_nchw));
		TRY(dnnl_memory_desc_init_by_tag(&t, 4, yd, dnnl_bf16, dnnl_nChw16c));
		reorder_row("conv2 dy nchw->16c", &f, &t);
		reorder_row("conv2 y 16c->nchw", &t, &f);
	}
	dnnl_stream_destroy(stream);
	dnnl_engine_destroy(engine);
	return 0;
}
