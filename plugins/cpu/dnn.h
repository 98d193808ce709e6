/* plugins/cpu/dnn.h - the oneDNN plan shared by conv.c and pool.c (see
 * dnn.c).  Only files that include oneDNN include this. */
#ifndef KILN_CPU_DNN_H
#define KILN_CPU_DNN_H

#include "cpu.h"
#include "wshare.h"               /* struct cpu_wref: the kept weights */
#include <oneapi/dnnl/dnnl.h> /* dnnl_* */

#define CPU_DNN_MEMS 24
#define CPU_DNN_STEPS 6
#define CPU_DNN_ARGS 16 /* rnn.c's backward: 16 */

/* Where a memory object's bytes are at run time.  CPU_BIND_FIXED: the
 * plan's own bytes, pointed to once at prepare and never moved (qconv.c's
 * cached int8 weights, bias and scales). */
enum { CPU_BIND_IN = 0, CPU_BIND_OUT = 1, CPU_BIND_WS = 2, CPU_BIND_FIXED = 3 };

struct cpu_bind {
	int kind;   /* CPU_BIND_* */
	int idx;    /* in[idx] / out[idx] */
	size_t off; /* CPU_BIND_WS: byte offset into the workspace */
};

struct cpu_dnn_step {
	dnnl_primitive_t prim;
	int n_arg;
	int arg[CPU_DNN_ARGS]; /* DNNL_ARG_* */
	int mem[CPU_DNN_ARGS]; /* index into cpu_dnn.mem */
};

struct cpu_dnn {
	pthread_mutex_t lock; /* one run at a time: the handles are shared */
	dnnl_stream_t stream;
	int n_mem, n_step;
	dnnl_memory_t mem[CPU_DNN_MEMS];
	struct cpu_bind bind[CPU_DNN_MEMS];
	struct cpu_dnn_step step[CPU_DNN_STEPS];
	int64_t sz[28]; /* rnn.c: sizes and byte offsets fixed at prepare (R_N) */
	/* conv.c's kept weights (a CONV with KILN_OPF_FROZEN whose kernel
	 * wants another layout than the caller's): step w_step (w_on) is the
	 * weights' reorder from memory object w_user (in[1]) into w_mem
	 * (CPU_BIND_FIXED), pointed at the kept copy of w_ref (struct
	 * cpu_dnn_wkept: wshare.c shares it between the plans that read the
	 * same weights in the same layout, a model's plans of every row
	 * count), skipped while the copy holds them (cpu_dnn_exec).  While
	 * w_probe (dnnteam.c's probe runs on scratch tensors) runs reorder
	 * into w_tmp and leave the kept copy alone. */
	int w_on, w_step, w_user, w_mem, w_probe;
	/* gemm.c's frozen GEMM: step w_plain (0: none; never the first
	 * step) is the matmul on in[1] as it is, run alone where the
	 * weights were not read before (cpu_wref_seen: no copy made), else
	 * every step but that one */
	int w_plain;
	size_t w_kern_bytes;
	struct cpu_dnn_wkey {
		dnnl_memory_desc_t user, kern; /* the caller's layout, the kernel's */
		const struct kiln_host *host;  /* (not compared) */
	} w_key;
	struct cpu_wref w_ref;
	void *w_tmp; /* (w_tmp and zero_state: cpu_huge_alloc's) */
	/* rnn.c's zero initial state (h0, c0; CPU_BIND_FIXED), or NULL */
	void *zero_state;
};

const char *cpu_dnnl_str(dnnl_status_t s);

/* A failed oneDNN call in a prepare function that has `st`, `c`, `p` and
 * an `out:` label: status (ENOTSUP for unimplemented) plus file:line. */
#define CPU_DNN_TRY(call)                                                                      \
	do {                                                                                   \
		dnnl_status_t s_ = (call);                                                     \
		COMMON_TRY(c->host, s_ != dnnl_success, s_ == dnnl_unimplemented, #call,        \
			   cpu_dnnl_str(s_), "cpu: %s %s", cpu_op_name(p->op.type), geom);       \
	} while (0)

/* p->dnn with a stream. */
kiln_status cpu_dnn_new(struct cpu_ctx *c, struct cpu_plan *p);
/* A memory object of md bound as described; *out its index. */
dnnl_status_t cpu_dnn_mem(struct cpu_ctx *c, struct cpu_dnn *d, const dnnl_memory_desc_t *md,
			  int kind, int idx, size_t off, int *out);
/* Append a primitive made from pd and its argument list. */
dnnl_status_t cpu_dnn_step(struct cpu_dnn *d, const_dnnl_primitive_desc_t pd, int n_arg,
			   const int *arg, const int *mem);
/* *prim made from pd (dnnl_primitive_create), and when it runs on
 * oneDNN's own GEMM ("gemm:" implementations) that GEMM's kernels
 * generated now.  Every primitive the plugin makes is made here: under
 * RLIMIT_AS (ulimit -v) only with CPU_JIT_ROOM of address space left,
 * else dnnl_out_of_memory, cpu_dnnl_str saying why (oneDNN 2.6 writes
 * through the NULL of a JIT code buffer it could not map: SIGSEGV). */
dnnl_status_t cpu_dnn_primitive(dnnl_primitive_t *prim, const_dnnl_primitive_desc_t pd);
/* Once per process, at the first device's open: under RLIMIT_AS,
 * oneDNN's primitive cache off (dnn.c, cache_off_under_rlimit). */
void cpu_dnn_cache_config(const struct kiln_host *host);
/* The GEMM's kernels for a plan that calls dnnl_sgemm itself (the adding
 * GEMM, plugins/cpu/gemm.c; the FFT convolution's per-frequency GEMMs,
 * fftconv.c): once per process, with the same check.  dnnl_sgemm makes
 * every kernel it has at its first call, whatever the shape and
 * transposes (~5.4 MiB of code in 3 mappings on AVX-512, session 41). */
dnnl_status_t cpu_dnn_warm_sgemm(void);
/* 1 where RLIMIT_AS (ulimit -v) leaves less than CPU_JIT_ROOM (16 MiB) of
 * address space, why (n bytes) saying so, naming whose need the room is
 * kept for ("oneDNN's JIT code"); else 0 (why empty).  For the libraries
 * that do not survive a refused mapping: oneDNN 2.6's JIT writes through
 * NULL (SIGSEGV), FFTW's planner aborts (fftwf_malloc_plain's assertion). */
int cpu_as_short(const char *whose, char *why, size_t n);
/* Append the op's fused activation (KILN_OPF_ACT: kind i[KILN_OPI_ACT],
 * alpha f[KILN_OPF_ACT_ALPHA]) to po as an eltwise post-op. */
dnnl_status_t cpu_dnn_post_act(dnnl_post_ops_t po, const struct kiln_op *op);
/* The name of pd's implementation ("brg:avx2", "gemm:jit", ...): "?"
 * when oneDNN does not say.  Lives as long as pd. */
const char *cpu_dnn_impl(const_dnnl_primitive_desc_t pd);
/* Bytes of pd's scratchpad (user mode). */
size_t cpu_dnn_scratch(const_dnnl_primitive_desc_t pd);
/* The kernel of every cpu_dnn plan: cpu_dnn_exec of cpu_variant(p). */
kiln_status cpu_dnn_run(const struct cpu_plan *p, const struct kiln_op_args *a,
			struct cpu_err *e);
/* dnnteam.c's probe of d's plan on scratch tensors: begin (1) keeps the
 * kept weights out of the runs until end (0).  KILN_ENOMEM when the
 * scratch copy cannot be had. */
kiln_status cpu_dnn_w_probe(struct cpu_dnn *d, int begin);
/* d's kept weights (if any) are taken anew on the next run (after runs
 * on scratch tensors, tune_time.c).  d may be NULL. */
void cpu_dnn_w_forget(struct cpu_dnn *d);
/* d keeps its weights (conv.c): memory objects w_user (the caller's,
 * user) and w_mem (the kernel's layout, kern), the reorder step between
 * them w_step; frozen: shared (wshare.c), else made on every run. */
void cpu_dnn_w_keep(struct cpu_ctx *c, struct cpu_dnn *d, const dnnl_memory_desc_t *user,
		    const dnnl_memory_desc_t *kern, int w_user, int w_mem);
/* Run plan p's steps as they are (p is the version to run; a CONV's
 * kept weights reordered only when in[1]'s bytes changed). */
kiln_status cpu_dnn_exec(const struct cpu_plan *p, const struct kiln_op_args *a,
			 struct cpu_err *e);
/* Where memory object m of d points in a run with arguments a (its
 * CPU_BIND_FIXED bytes are not asked for). */
void *cpu_dnn_handle(const struct cpu_dnn *d, int m, const struct kiln_op_args *a);

/* conv.c: the layouts the kernel of p's convolution reads x (src) and
 * y (dst or diff_dst) in, made for the calling thread's OpenMP count. */
kiln_status cpu_conv_act_layouts(struct cpu_ctx *c, const struct cpu_plan *p,
				 dnnl_memory_desc_t *x, dnnl_memory_desc_t *y);

#endif /* KILN_CPU_DNN_H */
