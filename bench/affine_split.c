/* bench/affine_split.c - what the thread-affine update of session 50 saves
 * where the two threads sit on two CCDs: the MLP's (bench/mlp_bench.ini,
 * batch 128, 784-512-256-10) weight gradients and SGD-momentum update on
 * 2 OpenMP threads, the two ways kiln can split them, alternating in
 * blocks of 16 iterations (the first 4 of a block, where the lines move
 * to the other way's owners, not counted) so that both meet the same
 * placement and load:
 *   old  dW = dY^T X by oneDNN's threaded dnnl_sgemm (its own split), the
 *        update over halves of the flat buffer (CPU_SPANS);
 *   new  dW by kiln's row split (each thread sgemm on half the rows:
 *        plugins/cpu/gemm.c, gemm_blas_rows), the update giving each
 *        thread the rows it wrote (CPU_AFFINE_FOR).
 * Each iteration runs fc1's forward GEMM first (oneDNN's matmul reading
 * W1, as the step's next forward does), then the two dW and the update.
 * Before each block the two threads ping-pong a cache line 200 times
 * (bench/c2c_latency's measure, in process): the median round trip
 * classifies the block (fast < 200 ns <= two CCDs < 500 ns <= busy).
 * Prints, per class and way, the iterations and the median us of the
 * update and of the two dW GEMMs.  A model of kiln's split (the same
 * partitions, not kiln's code), never run by `make check`.
 *
 *   affine_split [--iters N]     (default 6000; about 3 ms each) */
#include <oneapi/dnnl/dnnl.h>

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../plugins/common/clones.h" /* KILN_CLONES: the update at the plugin's width */

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static float *buf(size_t n, unsigned seed)
{
	float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)((i * 2654435761u + seed) % 2001) / 1000.0f - 1.0f;
	return p;
}

/* the flat buffer: fc1.w, fc1.b, fc2.w, fc2.b, fc3.w, fc3.b */
enum { W1 = 0, B1 = 401408, W2 = 401920, B2 = 532992, W3 = 533248, NP = 535818 };

KILN_CLONES static void sgd(float *w, float *v, const float *g, int64_t b, int64_t e)
{
#pragma omp simd
	for (int64_t i = b; i < e; i++) {
		v[i] = 0.9f * v[i] + g[i];
		w[i] -= 0.01f * v[i];
	}
}

/* dW [M,N] = dY^T X, dY [K,M], X [K,N]: whole (oneDNN's split) or rows */
static void dw(int rows, const float *dy, const float *x, float *c, int64_t M, int64_t N, int64_t K)
{
	if (!rows) {
		dnnl_sgemm('T', 'N', M, N, K, 1.0f, dy, M, x, N, 0.0f, c, N);
		return;
	}
#pragma omp parallel num_threads(2)
	{
		const int64_t t = omp_get_thread_num(), r0 = t ? M / 2 : 0, r1 = t ? M : M / 2;
		dnnl_sgemm('T', 'N', r1 - r0, N, K, 1.0f, dy + r0, M, x, N, 0.0f, c + r0 * N, N);
	}
}

/* the ping-pong: median round trip (ns) of 200 between the two threads */
static double pingpong(void)
{
	static volatile int line[32] __attribute__((aligned(64)));
	double rt[200];
#pragma omp parallel num_threads(2)
	{
		const int t = omp_get_thread_num();
		for (int i = 0; i < 200; i++) {
			const double t0 = now_us();
			if (t == 0) {
				line[0] = 2 * i + 1;
				while (line[0] != 2 * i + 2)
					;
				rt[i] = (now_us() - t0) * 1e3;
			} else {
				while (line[0] != 2 * i + 1)
					;
				line[0] = 2 * i + 2;
			}
		}
	}
	line[0] = 0;
	for (int i = 1; i < 200; i++) /* insertion sort */
		for (int j = i; j > 0 && rt[j - 1] > rt[j]; j--) {
			const double x = rt[j];
			rt[j] = rt[j - 1];
			rt[j - 1] = x;
		}
	return rt[100];
}

static int cmp(const void *a, const void *b)
{
	const float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static float median(float *v, int n)
{
	if (!n)
		return 0;
	qsort(v, (size_t)n, sizeof *v, cmp);
	return v[n / 2];
}

/* fc1's forward Y1 = X W1^T (+ b1, ReLU) by oneDNN's matmul on 2 threads */
static dnnl_primitive_t fwd;
static dnnl_stream_t strm;
static dnnl_memory_t mx, mw, my, mb, ms;
static void fwd_make(dnnl_engine_t eng, float *x, float *w, float *b, float *y)
{
	dnnl_memory_desc_t a, bw, c, bb;
	dnnl_dims_t da = { 128, 784 }, sa = { 784, 1 }, dbw = { 784, 512 }, sbw = { 1, 784 },
		    dc = { 128, 512 }, sc = { 512, 1 }, dbb = { 1, 512 }, sbb = { 512, 1 };
	dnnl_memory_desc_init_by_strides(&a, 2, da, dnnl_f32, sa);
	dnnl_memory_desc_init_by_strides(&bw, 2, dbw, dnnl_f32, sbw);
	dnnl_memory_desc_init_by_strides(&c, 2, dc, dnnl_f32, sc);
	dnnl_memory_desc_init_by_strides(&bb, 2, dbb, dnnl_f32, sbb);
	dnnl_matmul_desc_t d;
	dnnl_matmul_desc_init(&d, &a, &bw, &bb, &c);
	dnnl_primitive_attr_t attr;
	dnnl_post_ops_t po;
	dnnl_primitive_attr_create(&attr);
	dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
	dnnl_post_ops_create(&po);
	dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
	dnnl_primitive_attr_set_post_ops(attr, po);
	dnnl_primitive_desc_t pd;
	if (dnnl_primitive_desc_create(&pd, &d, attr, eng, NULL) != dnnl_success) {
		fprintf(stderr, "affine_split: no matmul\n");
		exit(1);
	}
	dnnl_primitive_create(&fwd, pd);
	const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	const size_t sb = sp ? dnnl_memory_desc_get_size(sp) : 0;
	dnnl_memory_create(&mx, &a, eng, x);
	dnnl_memory_create(&mw, &bw, eng, w);
	dnnl_memory_create(&my, &c, eng, y);
	dnnl_memory_create(&mb, &bb, eng, b);
	if (sb)
		dnnl_memory_create(&ms, sp, eng, aligned_alloc(64, (sb + 63) / 64 * 64));
	dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
}

static void fwd_run(void)
{
	dnnl_exec_arg_t args[5] = { { DNNL_ARG_SRC, mx }, { DNNL_ARG_WEIGHTS, mw },
				    { DNNL_ARG_DST, my }, { DNNL_ARG_BIAS, mb }, { DNNL_ARG_SCRATCHPAD, ms } };
	dnnl_primitive_execute(fwd, strm, ms ? 5 : 4, args);
	dnnl_stream_wait(strm);
}

int main(int argc, char **argv)
{
	int iters = 6000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: affine_split [--iters N]\n");
			return 2;
		}
	}
	omp_set_num_threads(2);
	dnnl_engine_t eng;
	dnnl_engine_create(&eng, dnnl_cpu, 0);
	float *w = buf(NP, 1), *v = buf(NP, 2), *g = buf(NP, 3);
	float *x = buf(128 * 784, 4), *dy1 = buf(128 * 512, 5), *y1 = buf(128 * 512, 6),
	      *dy2 = buf(128 * 256, 7);
	memset(v, 0, NP * sizeof *v);
	fwd_make(eng, x, w + W1, w + B1, y1);
	/* [class][way]: the update's and the dW GEMMs' times */
	float *t_up[3][2], *t_dw[3][2];
	int n[3][2] = { { 0 } };
	for (int c = 0; c < 3; c++)
		for (int k = 0; k < 2; k++) {
			t_up[c][k] = malloc((size_t)iters * sizeof(float));
			t_dw[c][k] = malloc((size_t)iters * sizeof(float));
		}
	int cls = 0;
	for (int it = 0; it < iters; it++) {
		if (it % 16 == 0) {
			const double ns = pingpong();
			cls = ns < 200 ? 0 : ns < 500 ? 1 : 2;
		}
		const int way = (it / 16) & 1; /* blocks of 16 of each way */
		fwd_run();
		const double t0 = now_us();
		dw(way, dy1, x, g + W1, 512, 784, 128);
		dw(way, dy2, y1, g + W2, 256, 512, 128);
		const double t1 = now_us();
		/* the biases and fc3: small, the same either way */
#pragma omp parallel num_threads(2)
		{
			const int64_t t = omp_get_thread_num();
			if (!way) {
				sgd(w, v, g, t ? NP / 2 / 16 * 16 : 0, t ? NP : NP / 2 / 16 * 16);
			} else {
				/* the rows each thread wrote, the rest in halves */
				sgd(w, v, g, W1 + t * 256 * 784, W1 + (t + 1) * 256 * 784);
				sgd(w, v, g, B1 + t * 256, B1 + (t + 1) * 256);
				sgd(w, v, g, W2 + t * 128 * 512, W2 + (t + 1) * 128 * 512);
				sgd(w, v, g, B2 + t * 128, B2 + (t + 1) * 128);
				sgd(w, v, g, W3 + t * 1280, t ? NP : W3 + 1280);
			}
		}
		const double t2 = now_us();
		if (it >= 64 && it % 16 >= 4) { /* warm; a block's first 4 move the lines */
			t_up[cls][way][n[cls][way]] = (float)(t2 - t1);
			t_dw[cls][way][n[cls][way]++] = (float)(t1 - t0);
		}
	}
	static const char *name[3] = { "fast (< 200 ns)", "two CCDs (200-500 ns)", "busy (>= 500 ns)" };
	for (int c = 0; c < 3; c++)
		printf("{\"placement\": \"%s\", \"iters_old\": %d, \"iters_new\": %d, \"update_us_old\": %.1f, "
		       "\"update_us_new\": %.1f, \"dw_us_old\": %.1f, \"dw_us_new\": %.1f}\n",
		       name[c], n[c][0], n[c][1], median(t_up[c][0], n[c][0]), median(t_up[c][1], n[c][1]),
		       median(t_dw[c][0], n[c][0]), median(t_dw[c][1], n[c][1]));
	return 0;
}
