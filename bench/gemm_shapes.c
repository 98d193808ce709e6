/* bench/gemm_shapes.c - the f32 GEMMs kiln's MLP benches run, under each
 * GEMM this machine has: oneDNN's dnnl_sgemm, oneDNN's matmul primitive
 * (B plain, and B in the layout the primitive asks for with format "any",
 * reordered once outside the timing, as frozen weights would be), and the
 * cblas_sgemm of every BLAS library named on the command line (dlopen'd
 * with RTLD_LOCAL | RTLD_DEEPBIND, so that several coexist; the OpenMP
 * builds take the OpenMP team the bench sets).
 *
 *   gemm_shapes [--threads T] [--reps R] [--set mlp|blocks|cnn|infer|fft|all]
 *               [--lib NAME=/path/libX.so]...
 *
 * Shapes (row-major, kiln's Linear: W is [out, in]):
 *   mlp    batch 128, 784-512-256-10 (bench/mlp_bench.ini): per layer
 *          fwd Y = X W^T, dX = dY W (not the first layer's), dW = dY^T X;
 *   blocks 1024 x 1024 at 128, 256, 512 rows (bench/pipeline_pair.sh);
 *   cnn    the CNN's fc1 (bench/cnn_bench.ini): batch 128, 3136 -> 1024;
 *   infer  the MLP's forward GEMMs at bench/onnx.sh's batch of 1000 rows
 *          (kiln_infer's plan: Y = X W^T, W [out, in] as kiln keeps it;
 *          the plan's bias and ReLU are not here);
 *   fft    the GEMM at each frequency of the CNN's conv2 by FFT
 *          (plugins/cpu/fftconv.c, 144 a pass; each on one thread: run
 *          with --threads 1): forward, weight and data gradient, with
 *          the leading dimensions fc_gemm passes (the data gradient's
 *          A and B rows twice its M and K: "lda", "ldb" in the JSON).
 * Per shape, R rounds; each round times every candidate once (about 10 ms
 * of repeated calls) in turn, so that a neighbour's load falls on all of
 * them alike; one JSON line per shape and candidate with the median
 * GFLOP/s of wall time and of the process's CPU time times the thread
 * count (what a GEMM reaches per core when it has the cores: the figure
 * to compare on a shared machine; OMP_WAIT_POLICY=PASSIVE so that idle
 * threads do not count).  A timing tool, never run by `make check`. */
#include <oneapi/dnnl/dnnl.h>

#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_time.h"

#define MAX_LIBS 6
#define MAX_CAND (3 + MAX_LIBS)

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
			       const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

struct shape {
	const char *name;
	int ta, tb, m, n, k;
	int lda, ldb; /* the leading dimensions where the code's are not compact (0: compact) */
};

/* sh's leading dimensions: its own, or those of A and B stored compact */
static int shape_lda(const struct shape *sh) { return sh->lda ? sh->lda : sh->ta ? sh->m : sh->k; }
static int shape_ldb(const struct shape *sh) { return sh->ldb ? sh->ldb : sh->tb ? sh->k : sh->n; }

struct cand {
	const char *name;
	cblas_sgemm_fn sgemm; /* a BLAS library's; NULL: oneDNN's */
	int kind;             /* 0 dnnl_sgemm, 1 matmul plain, 2 matmul B "any" */
	dnnl_primitive_t prim;
	dnnl_memory_t a, b, c, scratch;
	void *b_any, *ws;
	double med;
};


static dnnl_engine_t eng;
static dnnl_stream_t strm;

static void md2(dnnl_memory_desc_t *md, int d0, int d1, int s0, int s1)
{
	dnnl_dims_t d = { d0, d1 }, s = { s0, s1 };
	dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_f32, s);
}

/* c's matmul primitive for sh (B in format any: kind 2), its memory
 * objects, and B reordered into the primitive's layout. */
static int matmul_make(struct cand *c, const struct shape *sh, float *a, float *b, float *out)
{
	dnnl_memory_desc_t ma, mb, mc, mbany;
	const int lda = shape_lda(sh), ldb = shape_ldb(sh);
	md2(&ma, sh->m, sh->k, sh->ta ? 1 : lda, sh->ta ? lda : 1);
	md2(&mb, sh->k, sh->n, sh->tb ? 1 : ldb, sh->tb ? ldb : 1);
	md2(&mc, sh->m, sh->n, sh->n, 1);
	dnnl_dims_t db = { sh->k, sh->n };
	dnnl_memory_desc_init_by_tag(&mbany, 2, db, dnnl_f32, dnnl_format_tag_any);
	dnnl_matmul_desc_t desc;
	dnnl_primitive_desc_t pd;
	dnnl_primitive_attr_t attr;
	dnnl_primitive_attr_create(&attr);
	dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
	if (dnnl_matmul_desc_init(&desc, &ma, c->kind == 2 ? &mbany : &mb, NULL, &mc) ||
	    dnnl_primitive_desc_create(&pd, &desc, attr, eng, NULL) ||
	    dnnl_primitive_create(&c->prim, pd))
		return 1;
	dnnl_primitive_attr_destroy(attr);
	const char *impl = "?";
	dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
	static char names[2 * 64][64];
	static int nn;
	snprintf(names[nn], 64, "%s(%s)", c->kind == 2 ? "matmul_any" : "matmul", impl);
	c->name = names[nn++ % 128];
	const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
	const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	dnnl_memory_create(&c->a, &ma, eng, a);
	dnnl_memory_create(&c->c, &mc, eng, out);
	size_t sb = smd ? dnnl_memory_desc_get_size(smd) : 0;
	c->ws = sb ? aligned_alloc(64, (sb + 63) / 64 * 64) : NULL;
	if (sb)
		dnnl_memory_create(&c->scratch, smd, eng, c->ws);
	if (c->kind == 2) {
		size_t wb = dnnl_memory_desc_get_size(wmd);
		c->b_any = aligned_alloc(64, (wb + 63) / 64 * 64);
		dnnl_memory_t src;
		dnnl_primitive_desc_t rpd;
		dnnl_primitive_t r;
		dnnl_memory_create(&src, &mb, eng, b);
		dnnl_memory_create(&c->b, wmd, eng, c->b_any);
		dnnl_reorder_primitive_desc_create(&rpd, &mb, eng, wmd, eng, NULL);
		dnnl_primitive_create(&r, rpd);
		dnnl_exec_arg_t ra[2] = { { DNNL_ARG_FROM, src }, { DNNL_ARG_TO, c->b } };
		dnnl_primitive_execute(r, strm, 2, ra);
		dnnl_stream_wait(strm);
		dnnl_primitive_destroy(r);
		dnnl_primitive_desc_destroy(rpd);
		dnnl_memory_destroy(src);
	} else {
		dnnl_memory_create(&c->b, &mb, eng, b);
	}
	dnnl_primitive_desc_destroy(pd);
	return 0;
}

static void run(struct cand *c, const struct shape *sh, const float *a, const float *b,
		float *out)
{
	const int lda = shape_lda(sh), ldb = shape_ldb(sh);
	if (c->sgemm) {
		c->sgemm(ROW_MAJOR, sh->ta ? TRANS : NO_TRANS, sh->tb ? TRANS : NO_TRANS, sh->m,
			 sh->n, sh->k, 1.0f, a, lda, b, ldb, 0.0f, out, sh->n);
	} else if (c->kind == 0) {
		dnnl_sgemm(sh->ta ? 'T' : 'N', sh->tb ? 'T' : 'N', sh->m, sh->n, sh->k, 1.0f, a, lda,
			   b, ldb, 0.0f, out, sh->n);
	} else {
		dnnl_exec_arg_t args[4] = { { DNNL_ARG_SRC, c->a },
					    { DNNL_ARG_WEIGHTS, c->b },
					    { DNNL_ARG_DST, c->c },
					    { DNNL_ARG_SCRATCHPAD, c->scratch } };
		dnnl_primitive_execute(c->prim, strm, c->scratch ? 4 : 3, args);
		dnnl_stream_wait(strm);
	}
}

int main(int argc, char **argv)
{
	int threads = 1, reps = 15;
	const char *set = "all";
	struct cand cand[MAX_CAND];
	int nlib = 0;
	const char *libname[MAX_LIBS];
	cblas_sgemm_fn libfn[MAX_LIBS];
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--threads")) {
			threads = atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--reps")) {
			reps = atoi(argv[i + 1]);
		} else if (!strcmp(argv[i], "--set")) {
			set = argv[i + 1];
		} else if (!strcmp(argv[i], "--lib") && nlib < MAX_LIBS) {
			char *eq = strchr(argv[i + 1], '=');
			if (!eq)
				return fprintf(stderr, "gemm_shapes: --lib NAME=PATH\n"), 2;
			*eq = 0;
			void *h = dlopen(eq + 1, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
			void *f = h ? dlsym(h, "cblas_sgemm") : NULL;
			if (!f)
				return fprintf(stderr, "gemm_shapes: %s: %s\n", eq + 1, dlerror()), 1;
			/* BLIS: its own thread count, not the OpenMP one */
			void (*bset)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
			if (bset)
				bset(threads);
			libname[nlib] = argv[i + 1];
			memcpy(&libfn[nlib++], &f, sizeof f);
		}
	}
	reps = reps < 3 ? 3 : reps;
	omp_set_num_threads(threads);
	dnnl_engine_create(&eng, dnnl_cpu, 0);
	dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
	struct shape shapes[] = {
		{ "mlp fc1 fwd", 0, 1, 128, 512, 784, 0, 0 },  { "mlp fc1 dW", 1, 0, 512, 784, 128, 0, 0 },
		{ "mlp fc2 fwd", 0, 1, 128, 256, 512, 0, 0 },  { "mlp fc2 dX", 0, 0, 128, 512, 256, 0, 0 },
		{ "mlp fc2 dW", 1, 0, 256, 512, 128, 0, 0 },   { "mlp fc3 fwd", 0, 1, 128, 10, 256, 0, 0 },
		{ "mlp fc3 dX", 0, 0, 128, 256, 10, 0, 0 },    { "mlp fc3 dW", 1, 0, 10, 256, 128, 0, 0 },
		{ "blk128 fwd", 0, 1, 128, 1024, 1024, 0, 0 }, { "blk128 dX", 0, 0, 128, 1024, 1024, 0, 0 },
		{ "blk128 dW", 1, 0, 1024, 1024, 128, 0, 0 },  { "blk256 fwd", 0, 1, 256, 1024, 1024, 0, 0 },
		{ "blk256 dX", 0, 0, 256, 1024, 1024, 0, 0 },  { "blk256 dW", 1, 0, 1024, 1024, 256, 0, 0 },
		{ "blk512 fwd", 0, 1, 512, 1024, 1024, 0, 0 }, { "blk512 dX", 0, 0, 512, 1024, 1024, 0, 0 },
		{ "blk512 dW", 1, 0, 1024, 1024, 512, 0, 0 },
		{ "cnn fc1 fwd", 0, 1, 128, 1024, 3136, 0, 0 }, { "cnn fc1 dX", 0, 0, 128, 3136, 1024, 0, 0 },
		{ "cnn fc1 dW", 1, 0, 1024, 3136, 128, 0, 0 },
		{ "infer fc1", 0, 1, 1000, 512, 784, 0, 0 },   { "infer fc2", 0, 1, 1000, 256, 512, 0, 0 },
		{ "infer fc3", 0, 1, 1000, 10, 256, 0, 0 },
		{ "fft fwd", 0, 0, 128, 128, 64, 0, 0 },         { "fft dW", 0, 0, 64, 64, 256, 0, 0 },
		/* fftconv.c's fc_gemm: [DXr DXi] (B x 2C) from [P | Q] (O x 2B)
		 * and the forward's B (2C x 2O), both transposed, A's rows 2B
		 * long (lda = 2M) and B's 2O (ldb = 2K); two such GEMMs a
		 * frequency, the second at Q and B's last O columns (before
		 * session 43 the bench ran it with A and B compact) */
		{ "fft dX", 1, 1, 128, 64, 64, 2 * 128, 2 * 64 },
	};
	for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
		const struct shape *sh = &shapes[s];
		/* a set runs the shapes whose names begin with its first 3 letters */
		if (strcmp(set, "all") && strncmp(sh->name, set, 3))
			continue;
		/* A: (ta ? K : M) rows of lda, B: (tb ? N : K) rows of ldb */
		const long na = (long)(sh->ta ? sh->k : sh->m) * shape_lda(sh);
		const long nb = (long)(sh->tb ? sh->n : sh->k) * shape_ldb(sh);
		float *a = aligned_alloc(64, (size_t)na * 4 + 64);
		float *b = aligned_alloc(64, (size_t)nb * 4 + 64);
		float *out = aligned_alloc(64, (size_t)sh->m * sh->n * 4 + 64);
		for (long i = 0; i < na; i++)
			a[i] = (float)(i % 7) * 0.1f;
		for (long i = 0; i < nb; i++)
			b[i] = (float)(i % 5) * 0.1f;
		int nc = 0;
		memset(cand, 0, sizeof cand);
		cand[nc++] = (struct cand){ .name = "dnnl_sgemm", .kind = 0 };
		for (int kind = 1; kind <= 2; kind++) {
			cand[nc].kind = kind;
			if (!matmul_make(&cand[nc], sh, a, b, out))
				nc++;
		}
		for (int l = 0; l < nlib; l++)
			cand[nc++] = (struct cand){ .name = libname[l], .sgemm = libfn[l] };
		const double flop = 2.0 * sh->m * sh->n * sh->k;
		int per = (int)(10e-3 * 30e9 * threads / flop);
		per = per < 2 ? 2 : per;
		double *t = calloc((size_t)(nc * reps), sizeof *t);
		double *tc = calloc((size_t)(nc * reps), sizeof *tc);
		for (int r = -1; r < reps; r++)
			for (int i = 0; i < nc; i++) {
				double t0 = now(), c0 = cpu_now();
				for (int q = 0; q < per; q++)
					run(&cand[i], sh, cand[i].kind == 2 ? cand[i].b_any : b, b, out);
				if (r >= 0) { /* round -1 is the warm-up */
					t[i * reps + r] = (now() - t0) / per;
					tc[i * reps + r] = (cpu_now() - c0) / per;
				}
			}
		for (int i = 0; i < nc; i++) {
			qsort(&t[i * reps], (size_t)reps, sizeof *t, cmp_double);
			qsort(&tc[i * reps], (size_t)reps, sizeof *tc, cmp_double);
			printf("{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"ta\": %d, \"tb\": %d, "
			       "\"lda\": %d, \"ldb\": %d, "
			       "\"threads\": %d, \"gemm\": \"%s\", \"gflops\": %.1f, \"gflops_per_cpu_s\": %.1f, "
			       "\"us\": %.1f}\n",
			       sh->name, sh->m, sh->n, sh->k, sh->ta, sh->tb, shape_lda(sh), shape_ldb(sh),
			       threads, cand[i].name,
			       flop / t[i * reps + reps / 2] / 1e9,
			       flop * threads / tc[i * reps + reps / 2] / 1e9, 1e6 * t[i * reps + reps / 2]);
			if (cand[i].prim) {
				dnnl_primitive_destroy(cand[i].prim);
				dnnl_memory_destroy(cand[i].a);
				dnnl_memory_destroy(cand[i].b);
				dnnl_memory_destroy(cand[i].c);
				dnnl_memory_destroy(cand[i].scratch);
			}
			free(cand[i].b_any);
			free(cand[i].ws);
		}
		fflush(stdout);
		free(t);
		free(tc);
		free(a);
		free(b);
		free(out);
	}
	dnnl_stream_destroy(strm);
	dnnl_engine_destroy(eng);
	return 0;
}
