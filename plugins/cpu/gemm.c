/* plugins/cpu/gemm.c - KILN_OP_GEMM through the oneDNN (2.x C API) matmul
 * primitive.
 *
 *   out0[M,N] = alpha * op(in0)[M,K] op(in1)[K,N] + beta * out0 (+ in2[N])
 *
 * Everything oneDNN allocates or compiles (primitive, memory objects,
 * stream) is created in prepare; run only points the memory objects at
 * the caller's buffers and executes.  Transposes are strides of the memory
 * descriptors, so no data is moved.  alpha is the output scale, beta = 1 a
 * sum post-op.  The scratchpad is user-managed and reported as the plan's
 * workspace, so the caller owns every byte a run touches.
 *
 * Accumulation into an f32 result without bias or activation (the weight
 * gradients of a step's later micro-batches) runs oneDNN's BLAS-style
 * dnnl_sgemm with beta = 1 instead of the matmul with a sum post-op: the
 * brgemm matmul (AVX-512) loads the old result in its epilogue, tile by
 * tile of rows 4 KiB apart and without prefetch, and where that result is
 * no longer in cache (a stage's gradients between two micro-batches) the
 * loads stall: a 1024 x 1024 weight gradient of 16 rows took 0.90 ms
 * adding against 0.32 ms writing, sgemm's kernel (which prefetches C)
 * 0.34 ms adding (docs/PERFORMANCE.md, "The adding weight-gradient GEMM",
 * session 9).  No primitive, no scratchpad; oneDNN's GEMM reads the
 * calling thread's OpenMP count when it runs, as the matmul's does.
 *
 * The written weight gradient (a step's first micro-batch: A transposed,
 * beta = 0, f32, no bias or activation) runs dnnl_sgemm too, with beta = 0,
 * where its sums are the matmul's bit for bit: K (the rows) up to
 * CPU_SGEMM_WRITE_K = 383, under one of sgemm's K blocks on AVX-512 (at
 * 384 rows with 8 threads or more sgemm splits K between its threads, and
 * from 385 rows on it sums in two blocks: the two round differently).  The brgemm matmul's stores, like its loads
 * above, go to a result no longer in cache (the optimizer read the
 * gradients last) tile by tile without prefetch: the pipeline's first
 * backward of a step, which writes the gradients, was its stage's longest
 * (mirror at M = 16, mean CPU ms over 11 steps at load 10: 2.35-3.00
 * against 1.79-2.09 for the adding ones; with sgemm writing 1.56-1.59
 * against 1.65-1.79: docs/PERFORMANCE.md, "Session 45: the first
 * backward").  KILN_CPU_GEMM_WRITE_MATMUL set keeps the matmul for it
 * (the A/B hook; tests/check_device_gemm compares the two bit for bit).
 *
 * Bias: oneDNN adds the matmul bias *before* the output scale
 * (dst = alpha * (AB + bias)), but kiln's bias is not scaled.  With
 * alpha == 1 the two agree and the native bias argument is used; otherwise
 * the bias is a broadcast binary-add post-op placed after the sum.  A
 * fused activation (KILN_OPF_ACT) is an eltwise post-op after the bias.
 *
 * OpenBLAS (built with --with-openblas, its OpenMP flavour): an f32 GEMM
 * without bias or activation (the backward GEMMs of a linear layer, and a
 * forward one whose bias the layer adds itself) run on one thread has a
 * second library, cblas_sgemm on the whole op (p->conv_impl = 1), or on
 * each part of a split one; tune.c picks by cpu_gemm_openblas_rule or by
 * timing ([plugin.cpu] gemm_impl).  On AVX2 (Zen 3) oneDNN 2.6's sgemm
 * runs the data gradient of a 1024 x 1024 layer at 128 and 256 rows (no
 * transposes) at 32-33 GFLOP/s of a core against OpenBLAS's 61-62
 * (bench/gemm_shapes.c; docs/PERFORMANCE.md, "Session 16: small GEMMs on
 * AVX2").  OpenBLAS's
 * OpenMP build reads omp_get_max_threads() at each call: 1 here (a team
 * of one, or a part), so it never starts threads of its own; its pthread
 * build (a pool of its own that would fight the team) is refused when the
 * device opens (cpu_openblas_check; the library is loaded then, not with
 * the plugin: openblas.c).
 */
#include "cpu.h"
#include "dnn.h" /* cpu_dnn_primitive, cpu_dnn_warm_sgemm, cpu_dnnl_str, cpu_dnn_post_act */

#include <oneapi/dnnl/dnnl.h> /* dnnl_matmul_desc_init, dnnl_primitive_* */
#include <omp.h>
#include <stdio.h> /* snprintf */
#include <stdlib.h>
#include <string.h>

/* The objects one thread runs a split GEMM's part with: its own stream and
 * memory objects, so that the caller and the helpers run parts at once. */
struct cpu_gemm_objs {
	dnnl_stream_t stream;
	dnnl_memory_t a, b, bias, c, scratch;
};

struct cpu_gemm {
	/* The memory objects hold the current run's pointers: one run of a
	 * plan at a time, even if two streams share it. */
	pthread_mutex_t lock;
	dnnl_primitive_t prim;
	dnnl_stream_t stream;
	dnnl_memory_t a, b, bias, c, scratch; /* handles set per run */
	int bias_arg;                          /* DNNL_ARG_* the bias binds to */
	size_t scratch_bytes;
	/* split (cpu_gemm_split): n_part parts of `len` rows (or columns:
	 * cols), the last one shorter or as long; part_prim[0] runs the
	 * others, [1] the last, each on one thread; obj[2 slot + i]: thread
	 * slot's objects for part_prim[i] (slot 0 the caller, who scratches
	 * in the plan's workspace; a helper in its buffer, after its copy of
	 * the output); prim is NULL */
	struct cpu_ctx *ctx;
	int n_part, cols, slots;
	int64_t len;
	size_t out_bytes, part_ws; /* the output's and a part's scratchpad bytes */
	dnnl_primitive_t part_prim[2];
	struct cpu_gemm_objs *obj;
	int blas; /* run by dnnl_sgemm (gemm_blas_ok); prim is NULL */
	int impl; /* oneDNN's impl-th distinct implementation (plan's conv_impl; tune.c) */
	int openblas; /* run by OpenBLAS's cblas_sgemm (gemm_openblas_ok); prim is NULL */
};

/* A failed oneDNN call in prepare: status plus file:line of the call. */
#define CPU_DNNL(call)                                                                         \
	do {                                                                                   \
		dnnl_status_t s_ = (call);                                                     \
		COMMON_TRY(c->host, s_ != dnnl_success, s_ == dnnl_unimplemented, #call,        \
			   cpu_dnnl_str(s_), "cpu: GEMM M=%lld N=%lld K=%lld", (long long)M,     \
			   (long long)N, (long long)K);                                          \
	} while (0)

kiln_status cpu_engine_create(struct cpu_ctx *c)
{
	dnnl_engine_t eng = NULL;
	cpu_dnn_cache_config(c->host);
	const dnnl_status_t s = dnnl_engine_create(&eng, dnnl_cpu, 0);
	c->engine = s == dnnl_success ? eng : NULL;
	return s == dnnl_success ? KILN_OK
				 : c->host->error(KILN_EDEVICE, "cpu: %s:%d: dnnl_engine_create: %s",
						  __FILE__, __LINE__, cpu_dnnl_str(s));
}

void cpu_engine_destroy(struct cpu_ctx *c)
{
	dnnl_engine_destroy(c->engine); /* NULL is fine */
	c->engine = NULL;
}

static void gemm_objects_free(dnnl_stream_t stream, dnnl_memory_t a, dnnl_memory_t b,
			      dnnl_memory_t bias, dnnl_memory_t c, dnnl_memory_t scratch)
{
	dnnl_memory_t m[] = { a, b, bias, c, scratch };
	for (size_t i = 0; i < sizeof m / sizeof *m; i++)
		if (m[i])
			dnnl_memory_destroy(m[i]);
	if (stream)
		dnnl_stream_destroy(stream);
}

void cpu_gemm_free(struct cpu_gemm *g)
{
	if (!g)
		return;
	if (g->n_part && g->ctx) /* a late helper may still run a part */
		cpu_split_quiesce(g->ctx);
	gemm_objects_free(g->stream, g->a, g->b, g->bias, g->c, g->scratch);
	if (g->prim)
		dnnl_primitive_destroy(g->prim);
	for (int i = 0; g->obj && i < 2 * g->slots; i++) {
		struct cpu_gemm_objs *q = &g->obj[i];
		gemm_objects_free(q->stream, q->a, q->b, q->bias, q->c, q->scratch);
	}
	for (int i = 0; i < 2; i++)
		if (g->part_prim[i])
			dnnl_primitive_destroy(g->part_prim[i]);
	free(g->obj);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

int cpu_gemm_is_split(const struct cpu_gemm *g)
{
	return g && g->n_part > 0;
}

/* A 2-d f32 (or bf16) descriptor [d0,d1] with element strides s0,s1.  A dimension of
 * extent 1 is never stepped over, so its stride is rewritten to the dense
 * value: oneDNN checks strides even where they cannot matter. */
static dnnl_status_t cpu_md2(dnnl_memory_desc_t *md, int64_t d0, int64_t d1, int64_t s0,
			     int64_t s1, int dtype)
{
	if (d1 == 1)
		s1 = 1;
	if (d0 == 1)
		s0 = d1 * s1;
	dnnl_dims_t dims = { d0, d1 }, strides = { s0, s1 };
	return dnnl_memory_desc_init_by_strides(md, 2, dims, dtype == KILN_BF16 ? dnnl_bf16 : dnnl_f32,
						strides);
}

/* Point a's, b's, c's, bias's and scratch's handles at one run's buffers
 * and execute prim on stream. */
static dnnl_status_t gemm_exec(dnnl_primitive_t prim, dnnl_stream_t stream, int bias_arg,
			       dnnl_memory_t a, dnnl_memory_t b, dnnl_memory_t c,
			       dnnl_memory_t bias, dnnl_memory_t scratch, const void *pa,
			       const void *pb, void *pc, const void *pbias, void *ws)
{
	dnnl_exec_arg_t args[6];
	int n = 0;
	/* oneDNN takes non-const handles; inputs are only read. */
	dnnl_memory_set_data_handle(a, (void *)pa);
	dnnl_memory_set_data_handle(b, (void *)pb);
	dnnl_memory_set_data_handle(c, pc);
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, a };
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_WEIGHTS, b };
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_DST, c };
	if (bias) {
		dnnl_memory_set_data_handle(bias, (void *)pbias);
		args[n++] = (dnnl_exec_arg_t){ bias_arg, bias };
	}
	if (scratch) {
		dnnl_memory_set_data_handle(scratch, ws);
		args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, scratch };
	}
	dnnl_status_t s = dnnl_primitive_execute(prim, stream, n, args);
	return s == dnnl_success ? dnnl_stream_wait(stream) : s;
}

static dnnl_status_t gemm_openblas_ld(const struct kiln_op *op, const void *a, const void *b,
				      void *c, const struct kiln_op *whole);

/* Where part k of a split GEMM starts in in0, in1, in2 and out0 (bytes),
 * its length (rows or columns) and its primitive (0 or 1). */
struct part_at {
	size_t a, b, bias, c;
	int64_t len;
	int i;
};

static struct part_at part_at(const struct cpu_gemm *g, const struct kiln_op *op, int k)
{
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	const size_t at = (size_t)(k * g->len); /* the part's first row or column */
	const size_t ea = op->in[0].dtype == KILN_BF16 ? 2 : 4;
	const size_t eb = op->in[1].dtype == KILN_BF16 ? 2 : 4;
	const size_t ec = op->out[0].dtype == KILN_BF16 ? 2 : 4;
	const size_t ebias = op->n_in == 3 && op->in[2].dtype == KILN_BF16 ? 2 : 4;
	struct part_at p;
	p.i = k == g->n_part - 1;
	p.len = p.i ? (g->cols ? N : M) - (int64_t)k * g->len : g->len;
	p.a = g->cols ? 0 : at * (size_t)(ta ? 1 : K) * ea;
	p.b = g->cols ? at * (size_t)(tb ? K : 1) * eb : 0;
	p.c = at * (g->cols ? 1 : (size_t)N) * ec;
	p.bias = g->cols ? at * ebias : 0;
	return p;
}

/* Copy part k's block of the output between out and a helper's buffer
 * priv (back: from priv into out).  A block of rows is contiguous and
 * sits at the start of priv; a block of columns keeps the output's row
 * stride, at its own offset in a buffer as large as the output. */
static void part_copy(const struct cpu_gemm *g, const struct kiln_op *op, int k, char *out,
		      char *priv, int back)
{
	const struct part_at p = part_at(g, op, k);
	const size_t ec = op->out[0].dtype == KILN_BF16 ? 2 : 4, row = (size_t)op->i[3] * ec;
	if (!g->cols) {
		if (back)
			memcpy(out + p.c, priv, (size_t)p.len * row);
		else
			memcpy(priv, out + p.c, (size_t)p.len * row);
		return;
	}
	for (int64_t r = 0; r < op->i[2]; r++) {
		const size_t at = p.c + (size_t)r * row;
		if (back)
			memcpy(out + at, priv + at, (size_t)p.len * ec);
		else
			memcpy(priv + at, out + at, (size_t)p.len * ec);
	}
}

/* The job's arguments: the plan, in0, in1, in2, out0, workspace. */
static int part_run(const struct cpu_job *j, int slot, int k, void *priv)
{
	const struct cpu_plan *p = j->arg[0];
	const struct cpu_gemm *g = p->gemm;
	const struct part_at at = part_at(g, &p->op, k);
	const struct cpu_gemm_objs *o = g->obj ? &g->obj[2 * slot + at.i] : NULL;
	char *out = (char *)j->arg[4] + at.c, *ws = (char *)j->arg[5];
	if (priv) { /* a helper: into its buffer */
		if (p->op.flags & KILN_OPF_ACCUMULATE)
			part_copy(g, &p->op, k, (char *)j->arg[4], priv, 0);
		out = (char *)priv + (g->cols ? at.c : 0);
		ws = (char *)priv + g->out_bytes;
	}
	if (g->openblas) {
		/* the part as a GEMM of its own: the op's strides, its rows or
		 * columns (the output's row stride in a helper's buffer too) */
		struct kiln_op part = p->op;
		part.i[g->cols ? 3 : 2] = at.len;
		return gemm_openblas_ld(&part, (const char *)j->arg[1] + at.a,
					(const char *)j->arg[2] + at.b, out, &p->op) != dnnl_success;
	}
	return gemm_exec(g->part_prim[at.i], o->stream, g->bias_arg, o->a, o->b, o->c, o->bias,
			 o->scratch, (const char *)j->arg[1] + at.a, (const char *)j->arg[2] + at.b,
			 out, o->bias ? (const char *)j->arg[3] + at.bias : NULL,
			 ws) != dnnl_success;
}

static void part_commit(const struct cpu_job *j, int k, void *priv)
{
	const struct cpu_plan *p = j->arg[0];
	part_copy(p->gemm, &p->op, k, (char *)j->arg[4], priv, 1);
}

/* A split GEMM: the caller and the helpers take the next part not yet
 * taken; a helper that is descheduled takes fewer parts, and a part it
 * holds too long the caller runs itself (split.c).  Which thread runs a
 * part never changes its bytes. */
static int gemm_run_parts(const struct cpu_plan *p, const struct kiln_op_args *a)
{
	const struct cpu_gemm *g = p->gemm;
	struct cpu_job j = { part_run, part_commit, g->n_part,
			     { p, a->in[0], a->in[1], p->op.n_in == 3 ? a->in[2] : NULL, a->out[0],
			       a->workspace } };
	/* oneDNN's GEMM reads the calling thread's count when it runs: one,
	 * as the parts' primitives were made (a helper sets its own) */
	const int team = omp_get_max_threads();
	if (team != 1)
		omp_set_num_threads(1);
	const int bad = cpu_split_run(g->ctx, &j);
	if (team != 1)
		omp_set_num_threads(team);
	return bad;
}

/* The most rows (K) of a written weight gradient that gemm_blas runs:
 * sgemm sums K in blocks of 384 on AVX-512 (oneDNN 2.6), the brgemm matmul
 * in one pass; below a whole block the two agree bit for bit (checked at
 * 1 to 383 rows with 1-16, 32 and 64 threads).  At 384 rows with 8 threads
 * or more sgemm splits K between threads (48x128, 64x64, 128x128, 100x64
 * to 255 ...), and from 385 on it sums in two blocks: neither is the
 * matmul's bits (tests/check_device_gemm). */
#define CPU_SGEMM_WRITE_K 383

/* An f32 GEMM without bias or activation, whole (not split), that
 * gemm_blas runs: an adding one, or a written weight gradient (A
 * transposed: dY^T X) of at most CPU_SGEMM_WRITE_K rows.  The
 * environment's A/B hooks of one binary keep the matmul:
 * KILN_CPU_GEMM_SUM its sum post-op for the adding ones,
 * KILN_CPU_GEMM_WRITE_MATMUL the written ones. */
static int gemm_blas_ok(const struct kiln_op *op)
{
	if ((op->flags & KILN_OPF_ACT) || op->n_in != 2 || op->in[0].dtype != KILN_F32 ||
	    op->in[1].dtype != KILN_F32 || op->out[0].dtype != KILN_F32)
		return 0;
	if (op->flags & KILN_OPF_ACCUMULATE)
		return getenv("KILN_CPU_GEMM_SUM") == NULL;
	return op->i[0] && !op->i[1] && op->i[4] <= CPU_SGEMM_WRITE_K &&
	       getenv("KILN_CPU_GEMM_WRITE_MATMUL") == NULL;
}

/* out0 (+)= alpha op(in0) op(in1) (beta = 1 with KILN_OPF_ACCUMULATE, else
 * 0: out0 is not read), row-major: A is [M,K] (lda K) or stored [K,M] (lda
 * M), B [K,N] (ldb N) or stored [N,K] (ldb K). */
static dnnl_status_t gemm_blas(const struct kiln_op *op, const struct kiln_op_args *a)
{
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	const float beta = (op->flags & KILN_OPF_ACCUMULATE) ? 1.0f : 0.0f;
	return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, (float)op->f[0], a->in[0],
			  ta ? M : K, a->in[1], tb ? K : N, beta, a->out[0], N);
}

/* With $KILN_CPU_AFFINE=1 (cpu_affine_on; off by default), the written
 * weight gradient (A transposed, beta = 0; gemm_blas_ok) on a team of
 * T = 2..CPU_AFFINE_T threads: kiln's own split, thread t
 * running sgemm on one thread over rows [cut[t], cut[t + 1]) (multiples
 * of 16, a cache line of any row length), noted for the optimizer
 * (cpu_affine_note), so that the thread that wrote a row of the gradient
 * updates it.  oneDNN's own split of sgemm is not known and not stable.
 * Each element's sum over K (one block: K <= CPU_SGEMM_WRITE_K) is the
 * same on any rows, so the bytes are the whole sgemm's
 * (tests/affine.sh).  0 when not taken (gemm_blas runs it whole). */
static int gemm_blas_rows(const struct kiln_op *op, const struct kiln_op_args *a,
			  dnnl_status_t *out)
{
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	const int T = omp_get_max_threads();
	if ((op->flags & KILN_OPF_ACCUMULATE) || !op->i[0] || op->i[1] || T < 2 ||
	    T > CPU_AFFINE_T || M < 16 * (int64_t)T || !cpu_affine_on())
		return 0;
	int64_t cut[CPU_AFFINE_T + 1];
	dnnl_status_t st[CPU_AFFINE_T];
	for (int t = 0; t <= T; t++)
		cut[t] = t == T ? M : (M * t / T) & ~(int64_t)15;
	const float *A = a->in[0], *B = a->in[1];
	float *C = a->out[0];
	const float alpha = (float)op->f[0];
	int ran = 0;
#pragma omp parallel num_threads(T)
	{
		const int t = omp_get_thread_num();
		if (t == 0)
			ran = omp_get_num_threads();
		if (t < T) {
			const int64_t r0 = cut[t], r1 = cut[t + 1];
			/* inside the region oneDNN runs it on this thread */
			st[t] = r1 > r0 ? dnnl_sgemm('T', 'N', r1 - r0, N, K, alpha, A + r0, M, B, N,
						     0.0f, C + r0 * N, N)
					: dnnl_success;
		}
	}
	*out = dnnl_success;
	for (int t = 0; t < T; t++) {
		if (t >= ran) /* a smaller team than asked for: its rows here */
			st[t] = dnnl_sgemm('T', 'N', cut[t + 1] - cut[t], N, K, alpha, A + cut[t], M,
					   B, N, 0.0f, C + cut[t] * N, N);
		if (st[t] != dnnl_success)
			*out = st[t];
	}
	if (ran == T) {
		int64_t at[CPU_AFFINE_T + 1];
		for (int t = 0; t <= T; t++)
			at[t] = cut[t] * N;
		cpu_affine_note(C, M * N, T, at);
	}
	return 1;
}

int cpu_gemm_openblas_ok(const struct kiln_op *op)
{
	return HAVE_OPENBLAS && op->type == KILN_OP_GEMM && op->n_in == 2 &&
	       !(op->flags & KILN_OPF_ACT) && op->in[0].dtype == KILN_F32 &&
	       op->in[1].dtype == KILN_F32 && op->out[0].dtype == KILN_F32 &&
	       op->i[2] <= INT32_MAX && op->i[3] <= INT32_MAX && op->i[4] <= INT32_MAX;
}

/* The no-transpose GEMM (a linear layer's data gradient dY W) of 32 to
 * 256 rows, K and N 128 or more, below AVX-512: where oneDNN 2.6's AVX2
 * sgemm ran at half of OpenBLAS's rate (1024 x 1024 at 128 and 256 rows:
 * 32-33 against 61-62 GFLOP/s; 128 x 512 x 256: 44 against 52), and
 * where OpenBLAS did not lose (it did on 10 columns or K = 10, and at 512
 * rows the two were within 10%).  A shape rule, not a timing, so the
 * library, and a run's rounding, never depend on the machine's load. */
int cpu_gemm_openblas_rule(const struct kiln_op *op)
{
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	return cpu_gemm_openblas_ok(op) && !op->i[0] && !op->i[1] && M >= 32 && M <= 256 &&
	       N >= 128 && K >= 128 && !cpu_dnn_bf16_native();
}

/* c = alpha op(a) op(b) (+ c: KILN_OPF_ACCUMULATE) by OpenBLAS, on the
 * calling thread's OpenMP count: op's M, N, K (a part's: gemm_run_parts),
 * the leading dimensions of whole's operands. */
static dnnl_status_t gemm_openblas_ld(const struct kiln_op *op, const void *a, const void *b,
				      void *c, const struct kiln_op *whole)
{
#if HAVE_OPENBLAS
	const int ta = (int)op->i[0], tb = (int)op->i[1], M = (int)op->i[2], N = (int)op->i[3],
		  K = (int)op->i[4], WM = (int)whole->i[2], WN = (int)whole->i[3];
	cpu_openblas_sgemm(ta, tb, M, N, K, (float)op->f[0], a, ta ? WM : K, b, tb ? K : WN,
			   (op->flags & KILN_OPF_ACCUMULATE) ? 1.0f : 0.0f, c, WN);
	return dnnl_success;
#else
	(void)op, (void)a, (void)b, (void)c, (void)whole;
	return dnnl_unimplemented;
#endif
}

static dnnl_status_t gemm_openblas(const struct kiln_op *op, const struct kiln_op_args *a)
{
	return gemm_openblas_ld(op, a->in[0], a->in[1], a->out[0], op);
}

static kiln_status cpu_gemm_run(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	p = cpu_variant(p); /* and the thread count oneDNN reads */
	struct cpu_gemm *g = p->gemm;
	dnnl_status_t s;
	pthread_mutex_lock(&g->lock);
	if (g->openblas && !g->n_part)
		s = gemm_openblas(&p->op, a);
	else if (g->blas)
		s = gemm_blas_rows(&p->op, a, &s) ? s : gemm_blas(&p->op, a);
	else if (g->n_part)
		s = gemm_run_parts(p, a) ? dnnl_runtime_error : dnnl_success;
	else
		s = gemm_exec(g->prim, g->stream, g->bias_arg, g->a, g->b, g->c, g->bias,
			      g->scratch, a->in[0], a->in[1], a->out[0],
			      g->bias ? a->in[2] : NULL, a->workspace);
	pthread_mutex_unlock(&g->lock);
	if (s != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: GEMM M=%lld N=%lld K=%lld: %s:%d: %s: %s",
				(long long)p->op.i[2], (long long)p->op.i[3], (long long)p->op.i[4],
				__FILE__, __LINE__,
				g->openblas ? "cblas_sgemm" : g->blas ? "dnnl_sgemm" : "dnnl_primitive_execute",
				cpu_dnnl_str(s));
	return KILN_OK;
}

/* The memory descriptors of a GEMM primitive and its scratchpad's size. */
struct gemm_mds {
	dnnl_memory_desc_t a, b, c, bias;
	dnnl_memory_desc_t scratch; /* the primitive's own (scratch_bytes > 0) */
	size_t scratch_bytes;
};

/* Make the primitive for the first m rows and n columns of op's product
 * (all of it: m = M, n = N) with op's strides, on the calling thread's
 * OpenMP count. */
/* *pd: oneDNN's impl-th distinct implementation of desc (its reference
 * loops left out; 0 its first), or KILN_ENOTSUP, with no message, when
 * it lists fewer (bf16: brgemm, then gemm:jit on AVX-512; tune.c times
 * them). */
static kiln_status gemm_pick(const dnnl_matmul_desc_t *desc, const_dnnl_primitive_attr_t attr,
			     dnnl_engine_t engine, int impl, dnnl_primitive_desc_t *pd)
{
	dnnl_primitive_desc_iterator_t it = NULL;
	char seen[CPU_CONV_IMPLS][64];
	int n = 0;
	*pd = NULL;
	if (dnnl_primitive_desc_iterator_create(&it, desc, attr, engine, NULL) != dnnl_success)
		return KILN_ENOTSUP;
	do {
		dnnl_primitive_desc_t q = dnnl_primitive_desc_iterator_fetch(it);
		const char *name = "?";
		if (!q)
			break;
		dnnl_primitive_desc_query(q, dnnl_query_impl_info_str, 0, &name);
		int dup = !strncmp(name, "ref", 3);
		for (int k = 0; k < n && !dup; k++)
			dup = !strcmp(seen[k], name);
		if (!dup && n == impl) {
			*pd = q;
			break;
		}
		if (!dup)
			snprintf(seen[n++], sizeof seen[0], "%s", name);
		dnnl_primitive_desc_destroy(q);
	} while (n < CPU_CONV_IMPLS && dnnl_primitive_desc_iterator_next(it) == dnnl_success);
	dnnl_primitive_desc_iterator_destroy(it);
	return *pd ? KILN_OK : KILN_ENOTSUP;
}

static kiln_status gemm_prim(struct cpu_ctx *c, const struct kiln_op *op, int64_t m, int64_t n,
			     struct cpu_gemm *g, struct gemm_mds *md, dnnl_primitive_t *prim)
{
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	const float alpha = (float)op->f[0];
	const int beta = !!(op->flags & KILN_OPF_ACCUMULATE);
	const int has_bias = op->n_in == 3;
	const int act = (op->flags & KILN_OPF_ACT) != 0;
	kiln_status st = KILN_OK;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_matmul_desc_t desc;
	/* op(A)[m,k]: A is [M,K] (strides K,1) or stored [K,M] (strides 1,M). */
	CPU_DNNL(cpu_md2(&md->a, m, K, ta ? 1 : K, ta ? M : 1, op->in[0].dtype));
	/* op(B)[k,n]: B is [K,N] (strides N,1) or stored [N,K] (strides 1,K). */
	CPU_DNNL(cpu_md2(&md->b, K, n, tb ? 1 : N, tb ? K : 1, op->in[1].dtype));
	CPU_DNNL(cpu_md2(&md->c, m, n, N, 1, op->out[0].dtype));
	CPU_DNNL(cpu_md2(&md->bias, 1, n, n, 1, has_bias ? op->in[2].dtype : KILN_F32));
	const int native_bias = has_bias && alpha == 1.0f;
	CPU_DNNL(dnnl_matmul_desc_init(&desc, &md->a, &md->b, native_bias ? &md->bias : NULL, &md->c));

	CPU_DNNL(dnnl_primitive_attr_create(&attr));
	CPU_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
	if (alpha != 1.0f)
		CPU_DNNL(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha));
	if (beta || (has_bias && !native_bias) || act) {
		int idx = 0;
		CPU_DNNL(dnnl_post_ops_create(&po));
		if (beta) {
			CPU_DNNL(dnnl_post_ops_append_sum(po, 1.0f));
			idx++;
		}
		if (has_bias && !native_bias) {
			CPU_DNNL(dnnl_post_ops_append_binary(po, dnnl_binary_add, &md->bias));
			g->bias_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1;
		}
		if (act) /* the epilogue, after the bias (opcheck: no sum then) */
			CPU_DNNL(cpu_dnn_post_act(po, op));
		CPU_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
	}
	if (native_bias)
		g->bias_arg = DNNL_ARG_BIAS;

	if (g->impl > 0) {
		if ((st = gemm_pick(&desc, attr, c->engine, g->impl, &pd)))
			goto out; /* KILN_ENOTSUP: no such implementation */
	} else {
		CPU_DNNL(dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, NULL));
	}
	CPU_DNNL(cpu_dnn_primitive(prim, pd));
	const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	md->scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
	if (sp)
		md->scratch = *sp;
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(pd);
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return st;
}

/* A stream and memory objects for one run at a time of a primitive with
 * these descriptors. */
static kiln_status gemm_objects(struct cpu_ctx *c, const struct kiln_op *op,
				const struct gemm_mds *md, dnnl_stream_t *stream, dnnl_memory_t *a,
				dnnl_memory_t *b, dnnl_memory_t *bias, dnnl_memory_t *cm,
				dnnl_memory_t *scratch)
{
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	kiln_status st = KILN_OK;
	CPU_DNNL(dnnl_stream_create(stream, c->engine, dnnl_stream_default_flags));
	CPU_DNNL(dnnl_memory_create(a, &md->a, c->engine, DNNL_MEMORY_NONE));
	CPU_DNNL(dnnl_memory_create(b, &md->b, c->engine, DNNL_MEMORY_NONE));
	CPU_DNNL(dnnl_memory_create(cm, &md->c, c->engine, DNNL_MEMORY_NONE));
	if (op->n_in == 3)
		CPU_DNNL(dnnl_memory_create(bias, &md->bias, c->engine, DNNL_MEMORY_NONE));
	if (md->scratch_bytes)
		CPU_DNNL(dnnl_memory_create(scratch, &md->scratch, c->engine, DNNL_MEMORY_NONE));
out:
	return st;
}

/* The split plan: a primitive made for one thread for `len` rows (cols:
 * columns) and one for the last part's, each thread's objects for them,
 * and the helpers' buffers (cpu_gemm_split). */
static kiln_status gemm_prepare_parts(struct cpu_ctx *c, const struct kiln_op *op,
				      struct cpu_gemm *g, int64_t len, int cols)
{
	const int64_t M = op->i[2], N = op->i[3];
	const int64_t all = cols ? N : M;
	const int n = (int)((all + len - 1) / len);
	struct gemm_mds md[2];
	size_t ws = 0;
	kiln_status st = KILN_OK;
	g->slots = c->threads < CPU_POOL_MAX + 1 ? c->threads : CPU_POOL_MAX + 1;
	g->obj = calloc((size_t)(2 * g->slots), sizeof *g->obj);
	if (!g->obj)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a GEMM plan");
	g->ctx = c;
	g->n_part = n;
	g->len = len;
	g->cols = cols;
	const int team = omp_get_max_threads();
	omp_set_num_threads(1); /* the parts run on one thread each */
	for (int i = 0; i < 2 && !st; i++) {
		const int64_t l = i ? all - (int64_t)(n - 1) * len : len;
		st = gemm_prim(c, op, cols ? M : l, cols ? l : N, g, &md[i], &g->part_prim[i]);
		if (!st && (md[i].scratch_bytes + 63) / 64 * 64 > ws)
			ws = (md[i].scratch_bytes + 63) / 64 * 64;
	}
	omp_set_num_threads(team);
	for (int k = 0; k < 2 * g->slots && !st; k++) {
		struct cpu_gemm_objs *o = &g->obj[k];
		st = gemm_objects(c, op, &md[k & 1], &o->stream, &o->a, &o->b, &o->bias, &o->c,
				  &o->scratch);
	}
	/* a helper's copy of its part: rows at the start of its buffer, or
	 * columns where they are in the output (cpu_gemm_split bounds M N) */
	g->out_bytes = ((size_t)((cols ? M : len) * N) * (op->out[0].dtype == KILN_BF16 ? 2 : 4) +
			63) / 64 * 64;
	g->part_ws = ws;
	g->scratch_bytes = ws; /* the caller runs one part at a time */
	return st ? st : cpu_split_reserve(c, g->out_bytes + ws);
}

/* The split plan of the OpenBLAS candidate: gemm_prepare_parts without
 * oneDNN's objects (the parts call cblas_sgemm on one thread). */
static kiln_status gemm_openblas_parts(struct cpu_ctx *c, const struct kiln_op *op,
				       struct cpu_gemm *g, int64_t len, int cols)
{
	const int64_t M = op->i[2], N = op->i[3];
	g->slots = c->threads < CPU_POOL_MAX + 1 ? c->threads : CPU_POOL_MAX + 1;
	g->ctx = c;
	g->n_part = (int)(((cols ? N : M) + len - 1) / len);
	g->len = len;
	g->cols = cols;
	g->out_bytes = ((size_t)((cols ? M : len) * N) * 4 + 63) / 64 * 64;
	g->part_ws = g->scratch_bytes = 0;
	return cpu_split_reserve(c, g->out_bytes);
}

/* A GEMM plan's state for op, after checking its dtypes. */
static kiln_status gemm_new(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	/* f32 throughout, or bf16 A and B with an f32 or bf16 result and an
	 * f32 or bf16 bias (oneDNN accumulates in f32) */
	const int lowp = op->in[0].dtype == KILN_BF16;
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i].dtype != (lowp && i < 2 ? KILN_BF16 : KILN_F32) &&
		    !(lowp && op->in[i].dtype == KILN_BF16))
			return cpu_bad(c, op, KILN_ENOTSUP, "f32 tensors, or bf16 in0 and in1 with an f32 or bf16 bias and result");
	if (op->out[0].dtype != KILN_F32 && !(lowp && op->out[0].dtype == KILN_BF16))
		return cpu_bad(c, op, KILN_ENOTSUP, "f32 tensors, or bf16 in0 and in1 with an f32 or bf16 bias and result");
	struct cpu_gemm *g = calloc(1, sizeof *g);
	if (!g)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a GEMM plan");
	pthread_mutex_init(&g->lock, NULL);
	p->gemm = g; /* freed by the caller on failure */
	return KILN_OK;
}

/* p's GEMM (checked by gemm_new) whole (len 0) or in parts of len rows
 * (columns: cols), and p's kernel. */
static kiln_status gemm_prepare_as(struct cpu_ctx *c, struct cpu_plan *p, int64_t len, int cols)
{
	const struct kiln_op *op = &p->op;
	struct cpu_gemm *g = p->gemm;
	kiln_status st;
	g->impl = op->in[0].dtype == KILN_BF16 ? p->conv_impl : 0;
	if (op->in[0].dtype == KILN_F32 && p->conv_impl == 1) {
		/* the OpenBLAS candidate (tune.c): nothing to make; on one
		 * thread, whole or (KILN_CPU_GEMM_SPLIT) in parts as oneDNN's
		 * matmul is split, each on one thread.  Not threaded by
		 * OpenBLAS: its threads meet in spinning sched_yield loops, and
		 * on a loaded machine (load 8.5, 2 cores) the MLP at 2 threads
		 * took 8% more CPU time with it than with oneDNN's GEMMs. */
		if (!cpu_gemm_openblas_ok(op) || (!len && omp_get_max_threads() > 1) ||
		    cpu_openblas_ready(c, len ? c->threads : 1))
			return KILN_ENOTSUP;
		g->openblas = 1;
		st = len ? gemm_openblas_parts(c, op, g, len, cols) : KILN_OK;
	} else if (len) {
		st = gemm_prepare_parts(c, op, g, len, cols);
	} else if (gemm_blas_ok(op)) {
		g->blas = 1; /* nothing to make: dnnl_sgemm when it runs */
		/* but its kernels, which its first call generates: now, where
		 * `kiln memory` measures the library (with accumulate = 4 the
		 * MLP's resident peak was 25% past the prediction on AVX-512,
		 * whose brgemm matmuls warm nothing; session 37).  Every
		 * training plan has these plans, so a run at accumulate = 1,
		 * which never calls them, makes the kernels too: 6 MB resident
		 * for the MLP on AVX-512 (on AVX2 the gemm:jit matmuls made
		 * them already) */
		const dnnl_status_t s = cpu_dnn_warm_sgemm();
		st = s == dnnl_success ? KILN_OK
				       : c->host->error(KILN_EDEVICE, "cpu: GEMM M=%lld N=%lld K=%lld: %s:%d: cpu_dnn_warm_sgemm: %s",
							(long long)op->i[2], (long long)op->i[3],
							(long long)op->i[4], __FILE__, __LINE__, cpu_dnnl_str(s));
	} else {
		struct gemm_mds md;
		st = gemm_prim(c, op, op->i[2], op->i[3], g, &md, &g->prim);
		g->scratch_bytes = md.scratch_bytes;
		if (!st)
			st = gemm_objects(c, op, &md, &g->stream, &g->a, &g->b, &g->bias, &g->c,
					  &g->scratch);
	}
	if (st)
		return st;
	p->workspace = g->scratch_bytes;
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = cpu_gemm_run;
	c->host->log(KILN_LOG_DEBUG, "cpu", "GEMM M=%lld N=%lld K=%lld tA=%lld tB=%lld%s: scratchpad %zu bytes, %d parts of %lld %s",
		     (long long)op->i[2], (long long)op->i[3], (long long)op->i[4],
		     (long long)op->i[0], (long long)op->i[1],
		     g->openblas			? " (OpenBLAS)"
		     : !g->blas				? ""
		     : (op->flags & KILN_OPF_ACCUMULATE) ? " (sgemm, beta = 1)"
							 : " (sgemm, beta = 0)",
		     g->scratch_bytes, g->n_part, (long long)g->len, g->cols ? "columns" : "rows");
	return KILN_OK;
}

/* ---- frozen weights in the kernel's layout (KILN_OPF_FROZEN) ----------
 * A linear layer's f32 forward in an inference plan (`kiln predict`,
 * kiln/infer.h) reads weights that stay.  With them in the caller's layout
 * ([N, K], B transposed) oneDNN's brgemm matmul copies B into its blocked
 * layout on every run (its copy_B routine, into the scratchpad), once per
 * block of rows of each thread; with B in the layout it asks for (format
 * `any`) it reads them as they are.  So such a GEMM is a cpu_dnn plan
 * (dnn.c), as a frozen convolution is: the reorder of in1 into the kept
 * copy, run once and again only after the core says the weights changed,
 * then the matmul on the copy (the bias and the fused activation in its
 * epilogue, as gemm_prim makes them).  Unlike a convolution's, the copy
 * is made on the second run that reads the same weights: the first runs
 * the matmul on in1 as it is, which costs a one-run call (`kiln predict`
 * of one image) no copy of the weights' size (gemm_frozen_prepare).  The
 * copy is shared by the model's plans of every row count and by a plan's
 * versions for smaller teams (wshare.c); dnnteam.c's probes run the
 * matmul on in1 as it is, and tune_time.c's timings leave the copy alone
 * (cpu_dnn_w_forget).  Off with
 * [plugin.cpu] keep_weights = 0 (the plain GEMM below, copying B every
 * run): docs/PERFORMANCE.md, "Session 46: the MLP's inference". */
static int gemm_frozen_ok(const struct cpu_ctx *c, const struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	return (op->flags & KILN_OPF_FROZEN) && c->keep_weights && !p->conv_impl &&
	       !(op->flags & KILN_OPF_ACCUMULATE) && op->f[0] == 1.0 &&
	       op->in[0].dtype == KILN_F32 && op->in[1].dtype == KILN_F32 &&
	       op->out[0].dtype == KILN_F32 && (op->n_in == 2 || op->in[2].dtype == KILN_F32);
}

/* The frozen GEMM's matmuls, both with a user scratchpad and the fused
 * activation after the bias: *pd on B in format `any` (the kernel's
 * layout) and *plain on B in the caller's layout (*w), run until the plan
 * keeps the copy (below).  KILN_ENOTSUP with no message recorded when
 * oneDNN has no such matmul, or the kernel reads B in the caller's layout
 * anyway (no copy to keep), or is not the brgemm matmul (AVX-512 and up:
 * "brg:"; below it oneDNN 2.6's matmul is its sgemm, "gemm:jit", which
 * packs both operands on every call whatever their layout, and nothing
 * was measured there): the plain GEMM serves.  Another failure records
 * its message. */
static kiln_status gemm_frozen_pd(struct cpu_ctx *c, const struct kiln_op *op,
				  dnnl_memory_desc_t *a, dnnl_memory_desc_t *w, dnnl_memory_desc_t *y,
				  dnnl_memory_desc_t *bias, dnnl_primitive_desc_t *pd,
				  dnnl_primitive_desc_t *plain)
{
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	kiln_status st = KILN_OK;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_memory_desc_t wany;
	dnnl_matmul_desc_t desc, pdesc;
	dnnl_status_t s;
	const dnnl_dims_t wd = { K, N };
	*pd = *plain = NULL;
	CPU_DNNL(cpu_md2(a, M, K, ta ? 1 : K, ta ? M : 1, KILN_F32));
	CPU_DNNL(cpu_md2(w, K, N, tb ? 1 : N, tb ? K : 1, KILN_F32));
	CPU_DNNL(cpu_md2(y, M, N, N, 1, KILN_F32));
	CPU_DNNL(cpu_md2(bias, 1, N, N, 1, KILN_F32));
	CPU_DNNL(dnnl_memory_desc_init_by_tag(&wany, 2, wd, dnnl_f32, dnnl_format_tag_any));
	CPU_DNNL(dnnl_matmul_desc_init(&desc, a, &wany, op->n_in == 3 ? bias : NULL, y));
	CPU_DNNL(dnnl_matmul_desc_init(&pdesc, a, w, op->n_in == 3 ? bias : NULL, y));
	CPU_DNNL(dnnl_primitive_attr_create(&attr));
	CPU_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
	if (op->flags & KILN_OPF_ACT) { /* the epilogue, after the bias */
		CPU_DNNL(dnnl_post_ops_create(&po));
		CPU_DNNL(cpu_dnn_post_act(po, op));
		CPU_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
	}
	if ((s = dnnl_primitive_desc_create(pd, &desc, attr, c->engine, NULL)) == dnnl_unimplemented ||
	    (!s && (strncmp(cpu_dnn_impl(*pd), "brg", 3) ||
		    dnnl_memory_desc_equal(dnnl_primitive_desc_query_md(*pd, dnnl_query_weights_md, 0), w)))) {
		st = KILN_ENOTSUP;
		goto out;
	}
	CPU_DNNL(s);
	if ((s = dnnl_primitive_desc_create(plain, &pdesc, attr, c->engine, NULL)) == dnnl_unimplemented) {
		st = KILN_ENOTSUP;
		goto out;
	}
	CPU_DNNL(s);
out: /* oneDNN's destroy functions take NULL */
	if (st) {
		dnnl_primitive_desc_destroy(*pd);
		dnnl_primitive_desc_destroy(*plain);
		*pd = *plain = NULL;
	}
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return st;
}

/* p as a cpu_dnn plan of three steps: in1 reordered into the kept copy
 * (skipped while it holds the weights), the matmul reading the copy, and
 * the matmul on in1 as it is, which runs alone the first time the
 * context's frozen GEMMs read these weights (and after a notice of new
 * ones: cpu_wref_seen): a call of one run (`kiln predict` of one batch)
 * keeps no copy, and the second run with the same weights, of this plan
 * or another size's, reorders and keeps it (cpu_dnn.w_plain).
 * KILN_ENOTSUP (p left as it was): the plain GEMM serves. */
static kiln_status gemm_frozen_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int64_t M = op->i[2], N = op->i[3], K = op->i[4];
	dnnl_memory_desc_t a, w, y, bias;
	dnnl_primitive_desc_t pd = NULL, ppd = NULL, rpd = NULL;
	dnnl_primitive_attr_t rattr = NULL;
	kiln_status st = gemm_frozen_pd(c, op, &a, &w, &y, &bias, &pd, &ppd);
	if (st)
		return st;
	const dnnl_memory_desc_t *kern = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
	if ((st = cpu_dnn_new(c, p)))
		goto out;
	struct cpu_dnn *d = p->dnn;
	int m_a, m_w, m_k, m_y, m_b = -1, m_sp = -1, m_rsp = -1, m_psp = -1;
	/* the reorder's scratchpad in the workspace too, as conv.c's */
	CPU_DNNL(dnnl_primitive_attr_create(&rattr));
	CPU_DNNL(dnnl_primitive_attr_set_scratchpad_mode(rattr, dnnl_scratchpad_mode_user));
	CPU_DNNL(dnnl_reorder_primitive_desc_create(&rpd, &w, c->engine, kern, c->engine, rattr));
	CPU_DNNL(cpu_dnn_mem(c, d, &a, CPU_BIND_IN, 0, 0, &m_a));
	CPU_DNNL(cpu_dnn_mem(c, d, &w, CPU_BIND_IN, 1, 0, &m_w));
	CPU_DNNL(cpu_dnn_mem(c, d, kern, CPU_BIND_FIXED, 0, 0, &m_k));
	CPU_DNNL(cpu_dnn_mem(c, d, &y, CPU_BIND_OUT, 0, 0, &m_y));
	if (op->n_in == 3)
		CPU_DNNL(cpu_dnn_mem(c, d, &bias, CPU_BIND_IN, 2, 0, &m_b));
	/* the steps run one after the other: every scratchpad at 0 */
	if (cpu_dnn_scratch(pd))
		CPU_DNNL(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
				     CPU_BIND_WS, 0, 0, &m_sp));
	if (cpu_dnn_scratch(rpd))
		CPU_DNNL(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(rpd, dnnl_query_scratchpad_md, 0),
				     CPU_BIND_WS, 0, 0, &m_rsp));
	if (cpu_dnn_scratch(ppd))
		CPU_DNNL(cpu_dnn_mem(c, d, dnnl_primitive_desc_query_md(ppd, dnnl_query_scratchpad_md, 0),
				     CPU_BIND_WS, 0, 0, &m_psp));
	int arg[5], mem[5], n = 0;
	arg[n] = DNNL_ARG_FROM, mem[n++] = m_w;
	arg[n] = DNNL_ARG_TO, mem[n++] = m_k;
	if (m_rsp >= 0)
		arg[n] = DNNL_ARG_SCRATCHPAD, mem[n++] = m_rsp;
	d->w_step = d->n_step; /* cpu_dnn_exec skips it while the copy holds */
	CPU_DNNL(cpu_dnn_step(d, rpd, n, arg, mem));
	for (int plain = 0; plain < 2; plain++) { /* on the copy, then on in1 */
		n = 0;
		arg[n] = DNNL_ARG_SRC, mem[n++] = m_a;
		arg[n] = DNNL_ARG_WEIGHTS, mem[n++] = plain ? m_w : m_k;
		arg[n] = DNNL_ARG_DST, mem[n++] = m_y;
		if (m_b >= 0)
			arg[n] = DNNL_ARG_BIAS, mem[n++] = m_b;
		if ((plain ? m_psp : m_sp) >= 0)
			arg[n] = DNNL_ARG_SCRATCHPAD, mem[n++] = plain ? m_psp : m_sp;
		if (plain)
			d->w_plain = d->n_step;
		CPU_DNNL(cpu_dnn_step(d, plain ? ppd : pd, n, arg, mem));
	}
	cpu_dnn_w_keep(c, d, &w, kern, m_w, m_k);
	size_t ws = cpu_dnn_scratch(pd);
	if (cpu_dnn_scratch(rpd) > ws)
		ws = cpu_dnn_scratch(rpd);
	if (cpu_dnn_scratch(ppd) > ws)
		ws = cpu_dnn_scratch(ppd);
	p->workspace = ws;
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = cpu_dnn_run;
	c->host->log(KILN_LOG_DEBUG, "cpu", "GEMM M=%lld N=%lld K=%lld (frozen, %s): B kept in the kernel's layout from the second run (%zu bytes), scratchpad %zu bytes",
		     (long long)M, (long long)N, (long long)K, cpu_dnn_impl(pd),
		     (dnnl_memory_desc_get_size(kern) + 63) & ~(size_t)63, p->workspace);
out:
	dnnl_primitive_attr_destroy(rattr);
	dnnl_primitive_desc_destroy(rpd);
	dnnl_primitive_desc_destroy(ppd);
	dnnl_primitive_desc_destroy(pd);
	return st;
}

kiln_status cpu_gemm_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	int cols = 0;
	const int64_t len =
		cpu_op_one_thread(&p->op) ? 0 : cpu_gemm_split(&p->op, c->threads, &cols);
	if (!len && gemm_frozen_ok(c, p)) {
		const kiln_status fs = gemm_frozen_prepare(c, p);
		if (fs != KILN_ENOTSUP)
			return fs; /* (on failure the caller frees p->dnn) */
		cpu_dnn_free(p->dnn);
		p->dnn = NULL;
	}
	const kiln_status st = gemm_new(c, p);
	return st ? st : gemm_prepare_as(c, p, len, cols);
}

kiln_status cpu_gemm_prepare_busy(struct cpu_ctx *c, struct cpu_plan *p)
{
	const int64_t len = cpu_gemm_split_busy(&p->op, c->threads);
	if (!len)
		return KILN_ENOTSUP; /* not split: the plan's versions serve */
	const kiln_status st = gemm_new(c, p);
	return st ? st : gemm_prepare_as(c, p, len, 0);
}

