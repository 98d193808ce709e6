/* plugins/cpu/dnn.c - a plan made of a short sequence of oneDNN primitives
 * (weight reorder, convolution, reorder back; pooling), shared by conv.c
 * and pool.c.
 *
 * prepare creates every oneDNN object: the primitives, one memory object
 * per tensor they touch, a stream.  Each memory object is bound to where
 * its bytes live at run time: an input or output of the op, or an offset
 * into the caller's workspace (scratchpad, reordered weights).  run only
 * points the memory objects at those bytes and executes the steps in order.
 */
#include "dnn.h"

#include <limits.h> /* ULLONG_MAX */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The address space kept free for oneDNN's JIT code while a primitive is
 * made.  Each kernel's code goes in a buffer of its own, mapped, and
 * oneDNN 2.6 (Xbyak built without exceptions) does not check the mapping:
 * where RLIMIT_AS refuses it, it writes the code through NULL (SIGSEGV in
 * dnnl_primitive_create: batch = auto under ulimit -v, session 40).  The
 * most one primitive's making grew VmSize here: 4 MiB (ResNet-50's 1x1
 * brgconv, AVX-512), 2.4 MiB (seq2seq's brgemm RNN), 1.9 MiB (the MLP's
 * and CNN's matmuls). */
#define CPU_JIT_ROOM ((unsigned long long)16 << 20)

/* why the last primitive of this thread was not made (jit_room), for
 * cpu_dnnl_str; empty when it was */
static __thread char jit_short[256];

int cpu_as_short(const char *whose, char *why, size_t n)
{
	const unsigned long long room = cpu_as_room();
	if (room >= CPU_JIT_ROOM) {
		if (n)
			why[0] = 0;
		return 0;
	}
	snprintf(why, n,
		 "out of address space: %.1f MiB left under RLIMIT_AS (ulimit -v), less than the %llu MiB kept free for %s (raise the limit, or lower [train] batch)",
		 (double)room / 1048576.0, CPU_JIT_ROOM >> 20, whose);
	return 1;
}

/* Whether the address space has CPU_JIT_ROOM left (always, without an
 * RLIMIT_AS); if not, the reason in jit_short. */
static int jit_room(void)
{
	return !cpu_as_short("oneDNN's JIT code", jit_short, sizeof jit_short);
}

const char *cpu_dnnl_str(dnnl_status_t s)
{
	if (s == dnnl_out_of_memory && jit_short[0])
		return jit_short;
	static const char *const names[] = {
		[dnnl_success] = "success",
		[dnnl_out_of_memory] = "out of memory",
		[dnnl_invalid_arguments] = "invalid arguments",
		[dnnl_unimplemented] = "unimplemented",
		[dnnl_iterator_ends] = "iterator ends",
		[dnnl_runtime_error] = "runtime error",
		[dnnl_not_required] = "not required",
	};
	const int n = (int)(sizeof names / sizeof names[0]);
	return (int)s >= 0 && (int)s < n && names[s] ? names[s] : "unknown status";
}

kiln_status cpu_dnn_new(struct cpu_ctx *c, struct cpu_plan *p)
{
	struct cpu_dnn *d = calloc(1, sizeof *d);
	if (!d)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan",
				      cpu_op_name(p->op.type));
	pthread_mutex_init(&d->lock, NULL);
	p->dnn = d; /* freed by cpu_plan_free / the failed prepare */
	dnnl_status_t s = dnnl_stream_create(&d->stream, c->engine, dnnl_stream_default_flags);
	if (s != dnnl_success)
		return c->host->error(KILN_EDEVICE, "cpu: %s: %s:%d: dnnl_stream_create: %s",
				      cpu_op_name(p->op.type), __FILE__, __LINE__, cpu_dnnl_str(s));
	return KILN_OK;
}

void cpu_dnn_free(struct cpu_dnn *d)
{
	if (!d)
		return;
	for (int i = 0; i < d->n_step; i++)
		if (d->step[i].prim)
			dnnl_primitive_destroy(d->step[i].prim);
	for (int i = 0; i < d->n_mem; i++)
		if (d->mem[i])
			dnnl_memory_destroy(d->mem[i]);
	if (d->stream)
		dnnl_stream_destroy(d->stream);
	pthread_mutex_destroy(&d->lock);
	cpu_wref_drop(&d->w_ref);
	cpu_huge_free(d->w_tmp);
	cpu_huge_free(d->zero_state);
	free(d);
}

dnnl_status_t cpu_dnn_mem(struct cpu_ctx *c, struct cpu_dnn *d, const dnnl_memory_desc_t *md,
			  int kind, int idx, size_t off, int *out)
{
	if (d->n_mem == CPU_DNN_MEMS)
		return dnnl_out_of_memory;
	dnnl_status_t s = dnnl_memory_create(&d->mem[d->n_mem], md, c->engine, DNNL_MEMORY_NONE);
	if (s != dnnl_success)
		return s;
	d->bind[d->n_mem] = (struct cpu_bind){ .kind = kind, .idx = idx, .off = off };
	*out = d->n_mem++;
	return dnnl_success;
}

dnnl_status_t cpu_dnn_step(struct cpu_dnn *d, const_dnnl_primitive_desc_t pd, int n_arg,
			   const int *arg, const int *mem)
{
	if (d->n_step == CPU_DNN_STEPS || n_arg > CPU_DNN_ARGS)
		return dnnl_out_of_memory;
	struct cpu_dnn_step *st = &d->step[d->n_step];
	dnnl_status_t s = cpu_dnn_primitive(&st->prim, pd);
	if (s != dnnl_success)
		return s;
	d->n_step++;
	st->n_arg = n_arg;
	for (int i = 0; i < n_arg; i++) {
		st->arg[i] = arg[i];
		st->mem[i] = mem[i];
	}
	return dnnl_success;
}

/* oneDNN's f32 GEMM (behind the "gemm:jit" matmul, convolution and inner
 * product; matmul runs on it on AVX2 CPUs, where oneDNN 2.6 has no brgemm
 * matmul) generates its kernels on its first call, not when a primitive is
 * made: in a step, where `kiln memory` (which measures the library's memory
 * while it makes the plans) cannot see them; ~1.8 MiB of JIT code and
 * ~1.8 MiB of library text on an AVX2 EPYC.  One small sgemm when such a
 * primitive is made moves that to prepare time, in every process alike
 * (8x8x8: a 1-row or 1-column product takes the GEMV path, which makes only
 * a few kernels). */
static void warm_sgemm(void)
{
	float a[64] = { 0 }, b[64] = { 0 }, c[64];
	(void)dnnl_sgemm('N', 'N', 8, 8, 8, 1.0f, a, 8, b, 8, 0.0f, c, 8);
}

const char *cpu_dnn_impl(const_dnnl_primitive_desc_t pd)
{
	const char *impl = NULL;
	if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
		return "?";
	return impl;
}

dnnl_status_t cpu_dnn_warm_sgemm(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	static int warm; /* (atomic) */
	if (__atomic_load_n(&warm, __ATOMIC_ACQUIRE))
		return dnnl_success;
	if (!jit_room())
		return dnnl_out_of_memory;
	pthread_once(&once, warm_sgemm);
	__atomic_store_n(&warm, 1, __ATOMIC_RELEASE);
	return dnnl_success;
}

/* oneDNN's primitive cache (1024 primitives by default) keeps every
 * primitive made, and its JIT code, after the plans that made it are
 * freed: batch = auto's predictions (core/memory.c) left 8 MiB of address
 * space mapped per batch tried (the MLP), which RSS does not show; under
 * RLIMIT_AS that is room the run then lacks.  Off there, unless the
 * environment sets its capacity.  Process-wide, as the cache is. */
static int cache_off, cache_said;
static void cache_off_under_rlimit(void)
{
	if (cpu_as_room() == ULLONG_MAX || getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") ||
	    getenv("DNNL_PRIMITIVE_CACHE_CAPACITY"))
		return;
	cache_off = dnnl_set_primitive_cache_capacity(0) == dnnl_success;
}

/* After pd's primitive is made: when it runs on oneDNN's own GEMM, that
 * GEMM's kernels (cpu_dnn_primitive). */
static dnnl_status_t dnn_warm(const_dnnl_primitive_desc_t pd)
{
	if (strncmp(cpu_dnn_impl(pd), "gemm:", 5))
		return dnnl_success;
	/* a bf16 "gemm:jit" primitive runs oneDNN's bf16 GEMM, whose
	 * kernels the f32 one does not make (and which has no public entry
	 * to warm): an sgemm would only cost its ~25 ms of JIT at set-up
	 * (the bf16 CNN's, a 2-core Zen 4, session 25) */
	const dnnl_memory_desc_t *src = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
	if (src && src->data_type == dnnl_bf16)
		return dnnl_success;
	return cpu_dnn_warm_sgemm();
}

void cpu_dnn_cache_config(const struct kiln_host *host)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, cache_off_under_rlimit);
	if (cache_off && !__atomic_exchange_n(&cache_said, 1, __ATOMIC_ACQ_REL))
		host->log(KILN_LOG_DEBUG, "cpu", "RLIMIT_AS (ulimit -v) is set: oneDNN's primitive cache is off (its JIT code is address space that no plan holds and nothing frees; ONEDNN_PRIMITIVE_CACHE_CAPACITY sets it)");
}

dnnl_status_t cpu_dnn_primitive(dnnl_primitive_t *prim, const_dnnl_primitive_desc_t pd)
{
	*prim = NULL;
	if (!jit_room())
		return dnnl_out_of_memory;
	dnnl_status_t s = dnnl_primitive_create(prim, pd);
	if (s != dnnl_success)
		return s;
	if ((s = dnn_warm(pd)) != dnnl_success) {
		dnnl_primitive_destroy(*prim);
		*prim = NULL;
	}
	return s;
}

size_t cpu_dnn_scratch(const_dnnl_primitive_desc_t pd)
{
	const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
	return md ? dnnl_memory_desc_get_size(md) : 0;
}

void *cpu_dnn_handle(const struct cpu_dnn *d, int m, const struct kiln_op_args *a)
{
	const struct cpu_bind *b = &d->bind[m];
	/* oneDNN takes non-const handles; inputs are only read. */
	return b->kind == CPU_BIND_IN    ? (void *)a->in[b->idx]
	       : b->kind == CPU_BIND_OUT ? a->out[b->idx]
					 : (char *)a->workspace + b->off;
}

kiln_status cpu_dnn_run(const struct cpu_plan *p, const struct kiln_op_args *a,
			struct cpu_err *e)
{
	return cpu_dnn_exec(cpu_variant(p), a, e); /* the version for oneDNN's team now */
}

/* ---- kept weights (conv.c: a CONV with KILN_OPF_FROZEN) ---------------
 * The weights in the kernel's layout, one copy per weight tensor and
 * layout, shared by the plans that read them (wshare.c, the kind
 * dnn_w_kind): a model's plans of every row count, and a plan's versions
 * for smaller teams (dnnteam.c) where the kernel's layout is the same.
 * Before session 40 each plan kept its own copy, reordered on its first
 * run: every new remainder size of kiln_infer reordered every such weight
 * again, and held a second copy while the full batch's plan held one. */

struct cpu_dnn_wkept {
	struct cpu_wkept base;
	struct cpu_dnn_wkey k;
	void *kern; /* the weights in the kernel's layout (64-byte aligned) */
};

static struct cpu_wkept *dnn_w_make(const void *key, int frozen, int *lib)
{
	const struct cpu_dnn_wkey *k = key;
	const size_t bytes = (dnnl_memory_desc_get_size(&k->kern) + 63) & ~(size_t)63;
	struct cpu_dnn_wkept *x = calloc(1, sizeof *x);
	(void)frozen, (void)lib;
	if (x && !(x->kern = cpu_huge_alloc(64, bytes ? bytes : 64))) {
		free(x);
		return NULL;
	}
	if (x)
		x->k = *k;
	return x ? &x->base : NULL;
}

static void dnn_w_free(struct cpu_wkept *e)
{
	cpu_huge_free(((struct cpu_dnn_wkept *)e)->kern);
	free(e);
}

/* The same bytes for the same weights: the same layouts (and dtypes)
 * before and after the reorder, which moves (or widens) each value as
 * it is, whichever reorder implementation a plan got. */
static int dnn_w_same_key(const struct cpu_wkept *e, const void *key)
{
	const struct cpu_dnn_wkey *a = &((const struct cpu_dnn_wkept *)e)->k, *b = key;
	return dnnl_memory_desc_equal(&a->user, &b->user) && dnnl_memory_desc_equal(&a->kern, &b->kern);
}

static const struct cpu_wkind dnn_w_kind = {
	.what = "reordered weights",
	.same_key = dnn_w_same_key,
	.make = dnn_w_make,
	.free = dnn_w_free,
	.holds = NULL, /* frozen only */
};

void cpu_dnn_w_keep(struct cpu_ctx *c, struct cpu_dnn *d, const dnnl_memory_desc_t *user,
		    const dnnl_memory_desc_t *kern, int w_user, int w_mem)
{
	int lib;
	d->w_key = (struct cpu_dnn_wkey){ .user = *user, .kern = *kern, .host = c->host };
	d->w_kern_bytes = (dnnl_memory_desc_get_size(kern) + 63) & ~(size_t)63;
	d->w_user = w_user;
	d->w_mem = w_mem;
	d->w_on = 1;
	/* frozen: no entry until the first run (cannot fail here) */
	(void)cpu_wref_init(&d->w_ref, c, &dnn_w_kind, &d->w_key, 1, &lib);
}

void cpu_dnn_w_forget(struct cpu_dnn *d)
{
	if (!d || !d->w_on)
		return;
	pthread_mutex_lock(&d->lock);
	cpu_wref_detach(&d->w_ref);
	pthread_mutex_unlock(&d->lock);
}

kiln_status cpu_dnn_w_probe(struct cpu_dnn *d, int begin)
{
	if (!d || !d->w_on)
		return KILN_OK;
	pthread_mutex_lock(&d->lock);
	kiln_status st = KILN_OK;
	if (begin) { /* (a frozen GEMM's probe runs its plain matmul: no w_tmp) */
		if (!d->w_plain && !d->w_tmp && !(d->w_tmp = cpu_huge_alloc(64, d->w_kern_bytes)))
			st = KILN_ENOMEM;
		else
			d->w_probe++;
	} else if (d->w_probe && !--d->w_probe) {
		cpu_huge_free(d->w_tmp);
		d->w_tmp = NULL;
	}
	pthread_mutex_unlock(&d->lock);
	return st;
}

/* The kept weights for a run with arguments a (under d->lock): w_mem
 * pointed at the copy, *skip the step that need not run (their reorder,
 * when the copy holds them: no look at in[1], the frozen flag says its
 * values stay), else -1 and *fill 1 (the copy is made by this run, held to
 * write; cpu_dnn_w_done after).  *held: the copy is locked.  A probe's
 * scratch weights go to w_tmp and leave the copy alone. */
static kiln_status w_take(const struct cpu_plan *p, const struct kiln_op_args *a, int *skip,
			  int *fill, int *held, struct cpu_err *e)
{
	struct cpu_dnn *d = p->dnn;
	int lib;
	*skip = -1, *fill = 0, *held = 0;
	if (!d->w_on)
		return KILN_OK;
	if (d->w_probe) {
		dnnl_memory_set_data_handle(d->mem[d->w_mem], d->w_tmp);
		return KILN_OK;
	}
	if (cpu_wref_acquire(&d->w_ref, cpu_dnn_handle(d, d->w_user, a), NULL, fill, &lib))
		return cpu_fail(e, KILN_ENOMEM, "cpu: %s: out of memory for the kept weights (%zu bytes)",
				cpu_op_name(p->op.type), d->w_kern_bytes);
	*held = 1;
	dnnl_memory_set_data_handle(d->mem[d->w_mem], ((struct cpu_dnn_wkept *)d->w_ref.e)->kern);
	if (!*fill)
		*skip = d->w_step;
	return KILN_OK;
}

/* After the run (status s) of a w_take that said held. */
static void w_done(const struct cpu_plan *p, dnnl_status_t s, int fill)
{
	struct cpu_dnn *d = p->dnn;
	if (fill && s == dnnl_success) {
		cpu_wref_filled(&d->w_ref);
		d->w_key.host->log(KILN_LOG_DEBUG, "cpu", "%s: weights reordered into the kernel's layout (%zu bytes; frozen: kept until the weights change, shared by the plans that read them)",
				   cpu_op_name(p->op.type), d->w_kern_bytes);
	}
	cpu_wref_release(&d->w_ref);
}

kiln_status cpu_dnn_exec(const struct cpu_plan *p, const struct kiln_op_args *a,
			 struct cpu_err *e)
{
	struct cpu_dnn *d = p->dnn;
	dnnl_status_t s = dnnl_success;
	dnnl_exec_arg_t args[CPU_DNN_ARGS];
	int skip, fill, held;
	/* The memory objects hold the current run's pointers: one run of a
	 * plan at a time, even if two streams share it. */
	pthread_mutex_lock(&d->lock);
	for (int i = 0; i < d->n_mem; i++)
		if (d->bind[i].kind != CPU_BIND_FIXED)
			dnnl_memory_set_data_handle(d->mem[i], cpu_dnn_handle(d, i, a));
	/* a frozen GEMM's weights read for the first time, or a probe's
	 * scratch weights: its matmul on them as they are, alone (gemm.c);
	 * kept from the next run on */
	const void *w = d->w_plain ? cpu_dnn_handle(d, d->w_user, a) : NULL;
	const int plain = d->w_plain && (d->w_probe || (!(d->w_ref.e && d->w_ref.w_at == w) &&
							!cpu_wref_seen(&d->w_ref, w)));
	kiln_status ws = KILN_OK;
	if (plain)
		skip = fill = held = 0;
	else
		ws = w_take(p, a, &skip, &fill, &held, e);
	if (ws) {
		pthread_mutex_unlock(&d->lock);
		return ws;
	}
	for (int k = 0; k < d->n_step && s == dnnl_success; k++) {
		if (plain ? k != d->w_plain : k == skip || (d->w_plain && k == d->w_plain))
			continue;
		const struct cpu_dnn_step *st = &d->step[k];
		for (int i = 0; i < st->n_arg; i++)
			args[i] = (dnnl_exec_arg_t){ st->arg[i], d->mem[st->mem[i]] };
		s = dnnl_primitive_execute(st->prim, d->stream, st->n_arg, args);
	}
	if (s == dnnl_success)
		s = dnnl_stream_wait(d->stream);
	if (held)
		w_done(p, s, fill);
	pthread_mutex_unlock(&d->lock);
	if (s != dnnl_success)
		return cpu_fail(e, KILN_EDEVICE, "cpu: %s: %s:%d: dnnl_primitive_execute: %s",
				cpu_op_name(p->op.type), __FILE__, __LINE__, cpu_dnnl_str(s));
	return KILN_OK;
}

/* ---- the instruction set oneDNN dispatches to ---------------------------
 * dnnl_get_effective_cpu_isa() is the widest ISA oneDNN's JIT kernels will
 * use on this CPU (capped by ONEDNN_MAX_CPU_ISA); bf16 kernels exist from
 * avx512_core (emulated with f32 arithmetic), natively from
 * avx512_core_bf16 (AVX512-BF16 dot products) and with tiles from
 * avx512_core_amx.  For `kiln plugins` and the run log, and the tune
 * cache's stamp; OpenBLAS's version and kernel set follow where gemm.c
 * may use it (its choices are kept in that cache too). */
const char *cpu_dnn_isa(char *buf, size_t n)
{
	const dnnl_version_t *v = dnnl_version();
	const char *isa = "unknown", *bf16 = "none";
	switch ((int)dnnl_get_effective_cpu_isa()) {
	case dnnl_cpu_isa_sse41: isa = "sse41"; break;
	case dnnl_cpu_isa_avx: isa = "avx"; break;
	case dnnl_cpu_isa_avx2: isa = "avx2"; break;
	case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
	case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; bf16 = "emulated (f32 FMA)"; break;
	case dnnl_cpu_isa_avx512_core_vnni:
		isa = "avx512_core_vnni";
		bf16 = "emulated (f32 FMA)";
		break;
	case dnnl_cpu_isa_avx512_core_bf16:
		isa = "avx512_core_bf16";
		bf16 = "AVX512-BF16";
		break;
	case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; bf16 = "AMX tiles"; break;
	default: break;
	}
	char ob[96];
	cpu_openblas_str(ob, sizeof ob); /* the f32 GEMMs' other library, if any */
	snprintf(buf, n, "oneDNN %d.%d.%d, ISA %s, bf16 %s%s", v->major, v->minor, v->patch, isa,
		 bf16, ob);
	return buf;
}

/* 1 when oneDNN has bf16 kernels here (avx512_core and up: its bf16
 * convolutions and GEMMs, and the JIT reorders that convert bf16 <-> f32
 * in a blocked layout); 0 below (AVX2): it has no bf16 convolution but its
 * reference loops, and its reorders between bf16 and f32 run as its
 * `simple:any` loop, 100-160 ms for a [16,32,28,28] activation at 2 threads
 * where kiln's AVX2 conversion plus its f32 JIT reorder take well under 1
 * (docs/PERFORMANCE.md, "Session 15: bf16 on an AVX2 CPU"). */
int cpu_dnn_bf16_native(void)
{
	switch ((int)dnnl_get_effective_cpu_isa()) {
	case dnnl_cpu_isa_avx512_core:
	case dnnl_cpu_isa_avx512_core_vnni:
	case dnnl_cpu_isa_avx512_core_bf16:
	case dnnl_cpu_isa_avx512_core_amx: return 1;
	default: return 0;
	}
}

int cpu_dnn_bf16_dots(void)
{
	switch ((int)dnnl_get_effective_cpu_isa()) {
	case dnnl_cpu_isa_avx512_core_bf16:
	case dnnl_cpu_isa_avx512_core_amx: return 1;
	default: return 0;
	}
}

dnnl_status_t cpu_dnn_post_act(dnnl_post_ops_t po, const struct kiln_op *op)
{
	static const dnnl_alg_kind_t alg[] = {
		[KILN_ACT_RELU] = dnnl_eltwise_relu,         [KILN_ACT_LEAKY_RELU] = dnnl_eltwise_relu,
		[KILN_ACT_GELU] = dnnl_eltwise_gelu_erf,     [KILN_ACT_SIGMOID] = dnnl_eltwise_logistic,
		[KILN_ACT_TANH] = dnnl_eltwise_tanh,         [KILN_ACT_GELU_TANH] = dnnl_eltwise_gelu_tanh,
	};
	const int64_t kind = op->i[KILN_OPI_ACT];
	const float slope = kind == KILN_ACT_LEAKY_RELU ? (float)op->f[KILN_OPF_ACT_ALPHA] : 0.0f;
	return dnnl_post_ops_append_eltwise(po, 1.0f, alg[kind], slope, 0.0f);
}
