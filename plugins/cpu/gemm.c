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
 * Bias: oneDNN adds the matmul bias *before* the output scale
 * (dst = alpha * (AB + bias)), but kiln's bias is not scaled.  With
 * alpha == 1 the two agree and the native bias argument is used; otherwise
 * the bias is a broadcast binary-add post-op placed after the sum.  A
 * fused activation (KILN_OPF_ACT) is an eltwise post-op after the bias.
 */
#include "cpu.h"
#include "dnn.h" /* cpu_dnn_warm, cpu_dnnl_str, cpu_dnn_post_act */

#include <oneapi/dnnl/dnnl.h> /* dnnl_matmul_desc_init, dnnl_primitive_* */
#include <stdlib.h>

struct cpu_gemm {
	/* The memory objects hold the current run's pointers: one run of a
	 * plan at a time, even if two streams share it. */
	pthread_mutex_t lock;
	dnnl_primitive_t prim;
	dnnl_stream_t stream;
	dnnl_memory_t a, b, bias, c, scratch; /* handles set per run */
	int bias_arg;                          /* DNNL_ARG_* the bias binds to */
	size_t scratch_bytes;
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

void cpu_gemm_free(struct cpu_gemm *g)
{
	if (!g)
		return;
	dnnl_memory_t m[] = { g->a, g->b, g->bias, g->c, g->scratch };
	for (size_t i = 0; i < sizeof m / sizeof *m; i++)
		if (m[i])
			dnnl_memory_destroy(m[i]);
	if (g->prim)
		dnnl_primitive_destroy(g->prim);
	if (g->stream)
		dnnl_stream_destroy(g->stream);
	pthread_mutex_destroy(&g->lock);
	free(g);
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

static kiln_status cpu_gemm_run(const struct cpu_plan *p, const struct kiln_op_args *a,
				struct cpu_err *e)
{
	p = cpu_variant(p); /* and the thread count oneDNN reads */
	struct cpu_gemm *g = p->gemm;
	dnnl_exec_arg_t args[6];
	int n = 0;
	dnnl_status_t s;
	pthread_mutex_lock(&g->lock);
	/* oneDNN takes non-const handles; inputs are only read. */
	dnnl_memory_set_data_handle(g->a, (void *)a->in[0]);
	dnnl_memory_set_data_handle(g->b, (void *)a->in[1]);
	dnnl_memory_set_data_handle(g->c, a->out[0]);
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, g->a };
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_WEIGHTS, g->b };
	args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_DST, g->c };
	if (g->bias) {
		dnnl_memory_set_data_handle(g->bias, (void *)a->in[2]);
		args[n++] = (dnnl_exec_arg_t){ g->bias_arg, g->bias };
	}
	if (g->scratch) {
		dnnl_memory_set_data_handle(g->scratch, a->workspace);
		args[n++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, g->scratch };
	}
	s = dnnl_primitive_execute(g->prim, g->stream, n, args);
	if (s == dnnl_success)
		s = dnnl_stream_wait(g->stream);
	pthread_mutex_unlock(&g->lock);
	if (s != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: GEMM M=%lld N=%lld K=%lld: %s:%d: dnnl_primitive_execute: %s",
				(long long)p->op.i[2], (long long)p->op.i[3], (long long)p->op.i[4],
				__FILE__, __LINE__, cpu_dnnl_str(s));
	return KILN_OK;
}

kiln_status cpu_gemm_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	const int64_t ta = op->i[0], tb = op->i[1], M = op->i[2], N = op->i[3], K = op->i[4];
	const float alpha = (float)op->f[0];
	const int beta = !!(op->flags & KILN_OPF_ACCUMULATE);
	const int has_bias = op->n_in == 3;
	const int act = (op->flags & KILN_OPF_ACT) != 0;
	kiln_status st = KILN_OK;

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

	dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_primitive_desc_t pd = NULL;
	dnnl_matmul_desc_t desc;
	/* op(A)[m,k]: A is [M,K] (strides K,1) or stored [K,M] (strides 1,M). */
	CPU_DNNL(cpu_md2(&a_md, M, K, ta ? 1 : K, ta ? M : 1, op->in[0].dtype));
	/* op(B)[k,n]: B is [K,N] (strides N,1) or stored [N,K] (strides 1,K). */
	CPU_DNNL(cpu_md2(&b_md, K, N, tb ? 1 : N, tb ? K : 1, op->in[1].dtype));
	CPU_DNNL(cpu_md2(&c_md, M, N, N, 1, op->out[0].dtype));
	CPU_DNNL(cpu_md2(&bias_md, 1, N, N, 1, has_bias ? op->in[2].dtype : KILN_F32));
	const int native_bias = has_bias && alpha == 1.0f;
	CPU_DNNL(dnnl_matmul_desc_init(&desc, &a_md, &b_md, native_bias ? &bias_md : NULL, &c_md));

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
			CPU_DNNL(dnnl_post_ops_append_binary(po, dnnl_binary_add, &bias_md));
			g->bias_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1;
		}
		if (act) /* the epilogue, after the bias (opcheck: no sum then) */
			CPU_DNNL(cpu_dnn_post_act(po, op));
		CPU_DNNL(dnnl_primitive_attr_set_post_ops(attr, po));
	}
	if (native_bias)
		g->bias_arg = DNNL_ARG_BIAS;

	CPU_DNNL(dnnl_primitive_desc_create(&pd, &desc, attr, c->engine, NULL));
	CPU_DNNL(dnnl_primitive_create(&g->prim, pd));
	cpu_dnn_warm(pd);
	const dnnl_memory_desc_t *sp_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	g->scratch_bytes = sp_md ? dnnl_memory_desc_get_size(sp_md) : 0;
	CPU_DNNL(dnnl_stream_create(&g->stream, c->engine, dnnl_stream_default_flags));
	CPU_DNNL(dnnl_memory_create(&g->a, &a_md, c->engine, DNNL_MEMORY_NONE));
	CPU_DNNL(dnnl_memory_create(&g->b, &b_md, c->engine, DNNL_MEMORY_NONE));
	CPU_DNNL(dnnl_memory_create(&g->c, &c_md, c->engine, DNNL_MEMORY_NONE));
	if (has_bias)
		CPU_DNNL(dnnl_memory_create(&g->bias, &bias_md, c->engine, DNNL_MEMORY_NONE));
	if (g->scratch_bytes)
		CPU_DNNL(dnnl_memory_create(&g->scratch, sp_md, c->engine, DNNL_MEMORY_NONE));

	p->workspace = g->scratch_bytes;
	p->n_in = op->n_in;
	p->n_out = 1;
	p->kernel = cpu_gemm_run;
	c->host->log(KILN_LOG_DEBUG, "cpu", "GEMM M=%lld N=%lld K=%lld tA=%lld tB=%lld: scratchpad %zu bytes",
		     (long long)M, (long long)N, (long long)K, (long long)ta, (long long)tb,
		     g->scratch_bytes);
out: /* oneDNN's destroy functions take NULL */
	dnnl_primitive_desc_destroy(pd);
	dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return st;
}
