/* plugins/cpu/cpu.h - shared state of the CPU device plugin (kiln-cpu.so).
 *
 * The plugin is split by job: cpu.c (descriptor, open/close, memory,
 * prepare/run dispatch), stream.c (streams, events, the async worker),
 * ops.c (plain-C kernels), optim.c (fused optimizers), gemm.c (oneDNN matmul), dnn.c (the oneDNN plan
 * shared by conv.c and pool.c), bn.c (batch norm), act.c (activations,
 * dropout), layout.c (concat, split, reorder), embedding.c and layernorm.c
 * (the transformer ops), attn.c (fused attention).  Nothing here links libkiln:
 * the core is reached only through the host table.
 */
#ifndef KILN_CPU_H
#define KILN_CPU_H

#include "../common/clones.h"   /* KILN_CLONES */
#include "../common/describe.h" /* common_numel, common_desc_str, common_op_tensors */
#include "../common/device.h"   /* common_op_name, common_run_args_check, lists */
#include "../common/half.h"     /* half_f32_bf16, half_bf16_f32 */
#include "pin.h"                /* struct cpu_pin */
#include "threads.h"            /* struct cpu_team_live */
#include <kiln/plugin.h>      /* the ABI: ops tables, kiln_op, kiln_op_args */
#include <pthread.h>          /* worker threads, the context lock */
#include <stdint.h>
#include <stdlib.h>           /* malloc: CPU_AFFINE_FOR */
#include <string.h>           /* memset: cpu_op_unkept */

/* configure's --with-openblas (-DHAVE_OPENBLAS=1; gemm.c) */
#ifndef HAVE_OPENBLAS
#define HAVE_OPENBLAS 0
#endif

struct cpu_stream;
struct cpu_event;
struct cpu_gemm;
struct cpu_dnn;
struct cpu_choice;
struct cpu_variants;
struct cpu_split_pool;
struct cpu_wsplit;
struct cpu_fftconv;

/* How a bf16 convolution or GEMM is computed ([plugin.cpu] bf16_conv,
 * bf16_gemm): oneDNN's bf16 kernel, its f32 kernel on the widened bf16
 * tensors, or whichever of the two is faster for the op's shape, timed
 * once at prepare (tune.c). */
/* CPU_KERN_BF16_2: oneDNN's second bf16 implementation (GEMMs only);
 * CPU_KERN_RULE: auto's fixed rules alone (kiln's own kernels where they
 * apply: convthin.c, the FFT at 16x16), else oneDNN's bf16 kernel, no
 * timing: `auto` under `[run] deterministic = 1` */
enum { CPU_KERN_AUTO, CPU_KERN_BF16, CPU_KERN_F32, CPU_KERN_BF16_2, CPU_KERN_RULE };

/* Which of oneDNN's implementations runs an f32 forward convolution
 * ([plugin.cpu] conv_impl): the fastest of the first CPU_CONV_IMPLS
 * distinct ones, timed once at prepare (tune.c), else the k-th (0: the
 * first it offers). */
#define CPU_CONV_AUTO (-1)
/* [plugin.cpu] gemm_impl = rule: OpenBLAS where cpu_gemm_openblas_rule */
#define CPU_GEMM_RULE (-2)
#define CPU_CONV_IMPLS 3

/* async = auto's watch on a data-parallel rank that the rule made sync
 * (async_auto.c, cpu_async_watch): the run-queue wait of the issuing thread
 * over intervals of CPU_WATCH_INTERVAL_NS. */
struct cpu_async_watch {
	int on;             /* watching (the rule chose sync) */
	pthread_t owner;    /* the thread that told the workload: it issues */
	int64_t t0_ns;      /* when the watch began (the plan) */
	int64_t start_ns;   /* the interval's start, CLOCK_MONOTONIC */
	int64_t start_delay; /* cpu_self_delay_ns() then */
	int hot;            /* busy intervals in a row */
	double fake;        /* KILN_CPU_RUNWAIT (the tests' hook), else < 0 */
};

/* ---- wshare.c: weights kept by plans, shared by the plans that read
 * the same weights (INT8 quantized, qweights.c; oneDNN's reordered,
 * conv.c; Winograd's transformed, wino.c) ---- */
struct cpu_wkept;
/* A range of memory the core said it wrote weights into
 * (KILN_PROC_WEIGHTS_WRITTEN: a model's parameters, buffers, compute
 * copy), and the notice that said it last. */
struct cpu_wrange {
	uintptr_t lo, hi;
	uint64_t stamp;
};
/* A context's entries listed by the weights they are made from, and the
 * notices of new weights (wshare.c, "Notices"). */
struct cpu_wshare {
	pthread_mutex_t lock;
	struct cpu_wkept *head;
	const struct kiln_host *host;
	/* under lock: the notices so far (each one's stamp is the count
	 * then), the last that said every weight changed
	 * (KILN_PROC_WEIGHTS_CHANGED), and each range's last
	 * (KILN_PROC_WEIGHTS_WRITTEN) */
	uint64_t seq, all;
	struct cpu_wrange *ranges;
	int n_ranges, cap_ranges;
	/* changes whenever a stamp may (a notice; a range forgotten with
	 * its memory): written under lock, read without it (atomic) by a
	 * run whose plan read a stamp before (cpu_wref_acquire's fast path) */
	uint64_t epoch;
	/* under lock: the weights a frozen GEMM read without keeping them,
	 * and their stamp then (cpu_wref_seen) */
	struct cpu_wseen {
		const void *w;
		uint64_t stamp;
	} *seen;
	int n_seen, cap_seen;
};
void cpu_wshare_init(struct cpu_wshare *sh, const struct kiln_host *host);
void cpu_wshare_destroy(struct cpu_wshare *sh); /* after every plan is freed */
/* The memory at ptr (a cpu_alloc's, or tune_time.c's scratch tensors) is
 * freed: entries made from weights inside it are listed no more (its
 * holders keep them; one without is freed), and the notices of ranges
 * inside it are forgotten. */
void cpu_wshare_freed(struct cpu_wshare *sh, void *ptr);
/* The core wrote new weights into [ptr, ptr + bytes) (ptr NULL: anywhere,
 * KILN_PROC_WEIGHTS_CHANGED): the frozen entries made from them are made
 * again on their next run; others keep their values. */
void cpu_wshare_written(struct cpu_wshare *sh, const void *ptr, size_t bytes);
/* The calling thread runs an inner plan on converted weights (lowp.c;
 * src: the outer op's weights, whose notices the inner plan's kept
 * weights follow) until cpu_wshare_private_end: what it keeps meanwhile
 * is not shared. */
void cpu_wshare_private_begin(const void *src);
void cpu_wshare_private_end(void);

/* ---- team_verdicts.c: what dnnteam.c's probes found, kept ---- */
/* The outcome of a probe of an op's version for a smaller team: the op,
 * the plan's kernel and implementation, the team (the key: key .. busy,
 * compared as bytes, so zeroed first) and whether it gives the opening
 * team's bytes. */
struct cpu_team_verdict {
	struct cpu_team_verdict *next;  /* in its hash chain */
	struct cpu_team_verdict *newer; /* the one kept after it */
	uint64_t hash;                  /* of the key's bytes (cpu_team_verdict_hash) */
	struct kiln_op key;             /* cpu_op_key of the op */
	int kern_f32, conv_impl;        /* the plan's kernel: its version's too */
	int n, busy;                    /* the version's team; a GEMM's busy split */
	int same;                       /* 1: it gives the opening team's bytes */
};
/* At most this many kept (about 1 KB each), the oldest dropped first */
#define CPU_TEAM_VERDICTS 1024
#define CPU_TEAM_VERDICT_BUCKETS 256
/* A context's verdicts (zeroed: none), by the hash of their keys, and in
 * the order they were kept. */
struct cpu_team_verdicts {
	struct cpu_team_verdict *bucket[CPU_TEAM_VERDICT_BUCKETS];
	struct cpu_team_verdict *oldest, *newest;
	int n;
};
/* k->hash set from k's key bytes. */
void cpu_team_verdict_hash(struct cpu_team_verdict *k);
/* What the probe of k (hashed) found: 1 the same bytes, 0 other bytes,
 * -1 none kept. */
int cpu_team_verdict_find(struct cpu_team_verdicts *vs, const struct cpu_team_verdict *k);
/* Keep same (1 or 0) for k (copied), dropping the oldest at the cap;
 * same < 0 (the probe could not run: a later one may) keeps nothing. */
void cpu_team_verdict_keep(struct cpu_team_verdicts *vs, const struct cpu_team_verdict *k,
			   int same);
void cpu_team_verdicts_clear(struct cpu_team_verdicts *vs);
/* The outcome of a probe that failed with st (a version's prepare, the
 * scratch weights, a kernel): -1 (not kept: a later plan probes again)
 * for KILN_ENOMEM, which a later probe may not meet; else 0, a verdict
 * (the version is not used), kept, since a kernel that fails on the op's
 * shapes fails again (before session 42's review every failure gave -1,
 * and an op whose probe always failed was probed again by each new plan,
 * ~11 ms a plan). */
int cpu_team_probe_failed(kiln_status st);

/* One device context (one per kiln_device_open). */
struct cpu_ctx {
	const struct kiln_host *host;
	int async;          /* [plugin.cpu] async: worker thread per stream;
			     * cpu_streams_set_async may switch it mid-run
			     * (cpu_async_watch): read and written only
			     * through cpu_async_get/cpu_async_put */
	int async_auto;     /* async = auto on a data-parallel rank: the
			     * workload (KILN_PROC_WORKLOAD) may change it */
	pthread_mutex_t switch_lock; /* a switch of async (cpu_streams_set_async)
				      * and a stream's birth and death: a
				      * stream created on another thread
				      * during a switch gets its worker */
	struct cpu_async_watch watch; /* the rule chose sync: contention may
				       * still turn it async (cpu_async_watch) */
	int64_t spin_ns;    /* a pipeline stage beside peers ([run] devices): a
			     * stream's wait for an event spins up to this
			     * long before sleeping ([plugin.cpu] stage_spin_us,
			     * cpu_spin_on; stream.c), 0: it sleeps at once */
	int beside;         /* opened beside peers with its own workers: its
			     * waits are tallied (even with stage_spin_us 0) */
	int stage;          /* a pipeline stage's instance (options version 4:
			     * stage), not the run's own device: its events'
			     * waits feed the back-off (cpu_spin_learns) */
	struct cpu_wait_tally waits; /* those waits, by how they ended (under lock) */
	/* side streams' groups run by their owners (KILN_PROC_STREAM_SIDE,
	 * stream.c; under lock): [0] in a wait for another event, [1] in a
	 * wait for a side's own record; and their time */
	int64_t side_groups[2], side_ns[2];
	struct cpu_spin_backoff backoff; /* their spin's back-off (under lock) */
	int threads;        /* OpenMP threads for kernels ([run] threads, resolved) */
	int threads_set;    /* [run] threads was set: a fixed team */
	int deterministic;  /* [run] deterministic = 1 (the hint's advice) */
	struct cpu_pin pin; /* a stage device's CPUs for its stream workers
			     * ([run] bind_stages; pin.c), n = 0: none */
	struct cpu_team_live team; /* the team now, at most `threads` (threads.c) */
	struct cpu_split_pool *pool;     /* helpers for split GEMMs (split.c), made by
				    * the first such plan */
	/* [plugin.cpu] bf16_conv, bf16_gemm: which kernel computes the bf16
	 * convolutions and GEMMs (CPU_KERN_*; tune.c) */
	int bf16_conv, bf16_gemm;
	int conv_impl;      /* [plugin.cpu] conv_impl: CPU_CONV_AUTO or an index (tune.c) */
	int gemm_impl;      /* [plugin.cpu] gemm_impl: 0 onednn, 1 openblas, CPU_CONV_AUTO, CPU_GEMM_RULE */
	int conv_algo;      /* [plugin.cpu] conv_algo: 0 direct, 1 fft, CPU_CONV_WINO, CPU_CONV_AUTO,
			     * CPU_GEMM_RULE (fftconv.c, wino.c, tune.c) */
	/* the choices `auto` made, by op (tune.c; under lock) */
	struct cpu_choice *choices;
	/* what dnnteam.c's probes found, by op and team (under lock;
	 * team_verdicts.c) */
	struct cpu_team_verdicts verdicts;
	/* [plugin.cpu] tune_cache: the file the choices are kept in between
	 * runs ("": none), and how many of them it gave (tune_cache.c) */
	char tune_path[4096];
	int tune_read;
	/* choices timed by this context (new or re-timed: the cache is
	 * written when any), provisional ones from the cache re-timed (at
	 * most CPU_TUNE_RETIMES), and whether the machine was quiet when the
	 * first of those was found (0 not probed yet, 1 quiet, 2 busy; tune.c,
	 * under lock) */
	int tune_timed, tune_retimed, tune_quiet;
	/* choices prepares took from the cache since the last summary line
	 * (their own lines are debug; atomic: cpu_tune_summary) */
	int tune_hits;
	void *engine;       /* dnnl_engine_t, shared by every plan */
	/* One lock for every stream and event of the process's CPU
	 * contexts (a handful of streams; several contexts when pipeline
	 * stages each have one and wait on each other's events: cpu.c's
	 * cpu_sync); wake-ups are targeted (stream.c). */
	pthread_mutex_t *lock;
	pthread_cond_t *cond;  /* progress: an event completed, a stream went
				* idle, an event's or (when plan_waiters) a
				* plan's last queued use passed; idle workers
				* sleep on their stream's own `wake` instead */
	int plan_waiters;      /* threads in cpu_plan_wait_idle */
	struct cpu_stream *streams; /* live objects, so close() can free them */
	struct cpu_event *events;
	struct cpu_plan *plans;
	/* [plugin.cpu] graph = 1: captured steps are recorded and replayed
	 * (graph.c); cap is the capture under way (under `lock`) */
	int graph;
	/* [plugin.cpu] keep_weights: a CONV with KILN_OPF_FROZEN keeps its
	 * reordered weights (conv.c, dnn.c) or Winograd's transformed ones
	 * (wino.c), a QCONV or QLINEAR its quantized ones with no compare
	 * (qconv.c): in wshare below */
	int keep_weights;
	/* [plugin.cpu] keep_widened: the f32 copies of bf16/f16 weights that
	 * lowp.c's GEMMs and convolutions read, kept between runs (wcache.c);
	 * NULL: off, or oneDNN has bf16 kernels here */
	struct cpu_wcache *wc;
	/* the weights its frozen plans keep, shared by the plans that read
	 * the same weights: INT8 (QCONV, QLINEAR), reordered and Winograd's
	 * transformed f32 convolution weights (wshare.c) */
	struct cpu_wshare wshare;
	struct cpu_capture *cap;
	uint64_t cap_serial;
};

/* Error of a kernel run.  Kernels may run on a worker thread, where the
 * host's thread-local message would be lost, so they format into this and
 * the thread that reports the failure calls host->error with it. */
struct cpu_err {
	kiln_status st;
	/* (512 before session 33: a stream worker's copy of a collective's
	 * message, which names ranks, hosts and files, lost its end, the
	 * cause; a longer one is cut in the middle, cpu_err_msg) */
	char msg[2048];
};

kiln_status cpu_fail(struct cpu_err *e, kiln_status st, const char *fmt, ...) KILN_PRINTF(3, 4);
/* msg into e->msg whole, or, longer than the buffer, its first quarter
 * and its end (the cause, a file's name) joined by "...", as the core's
 * kiln_error keeps one: never cut silently.  Sets e->st = st. */
kiln_status cpu_err_msg(struct cpu_err *e, kiln_status st, const char *msg);

/* A prepared op: a copy of the op, the sizes its kernel needs, and the
 * kernel.  Plans are immutable after prepare except the GEMM's oneDNN
 * memory handles, which gemm.c guards with its own lock. */
struct cpu_plan {
	struct cpu_plan *prev, *next;
	struct kiln_op op;
	int64_t rows, cols;   /* kernel-specific sizes fixed at prepare */
	int64_t n;            /* element count */
	int n_in, n_out;      /* arguments run() requires to be non-NULL */
	size_t workspace;     /* bytes run() requires in args->workspace */
	kiln_status (*kernel)(const struct cpu_plan *p, const struct kiln_op_args *a,
			      struct cpu_err *e);
	int64_t sz[8];        /* more kernel-specific sizes (bn.c, layout.c) */
	struct cpu_gemm *gemm;
	struct cpu_dnn *dnn;  /* oneDNN primitives (conv.c, pool.c) */
	/* gemm or dnn with an adaptive team: the versions prepared for a
	 * smaller team (dnnteam.c) */
	struct cpu_variants *variants;
	/* a weight gradient in blocks of the minibatch (convsplit.c) */
	struct cpu_wsplit *wsplit;
	/* an f32 convolution by FFT (fftconv.c) */
	struct cpu_fftconv *fft;
	/* a frozen Winograd convolution's transformed weights (wino.c) */
	struct cpu_wino *wino;
	size_t aux;           /* aux_bytes(): state a forward leaves for its backward */
	/* bf16/f16 tensors of an op whose kernel is f32 (lowp.c): the f32 plan
	 * run in between the conversions, and where each converted tensor
	 * lives in the workspace (-1: passed through as it is). */
	struct cpu_plan *inner;
	int64_t lp_off[KILN_OP_MAX_IN + KILN_OP_MAX_OUT];
	int lp_pre;           /* bit k: output k is read too (accumulate, in place) */
	/* GEMM, CONV, CONV_BWD_DATA on the f32 kernel: the context's kept
	 * widened weights (wcache.c), NULL: widen every input on each run */
	struct cpu_wcache *wc;
	/* bf16 convolution: oneDNN's f32 kernel, the bf16 tensors converted by
	 * the reorders around it (conv.c; chosen by tune.c) */
	int kern_f32;
	/* f32 CONV, bf16 GEMM: oneDNN's conv_impl-th distinct implementation
	 * (0: its first; conv.c, gemm.c, chosen by tune.c) */
	int conv_impl;
	/* KILN_OP_QCONV/QLINEAR: the weights quantized once, kept until they
	 * change (qconv.c) */
	struct cpu_qcache *qcache;
	/* Queued async runs of this plan (under cpu_ctx.lock): plan_free
	 * waits for them instead of freeing a plan a worker will run. */
	int refs;
};

/* ---- embedding.c ---- */
/* d[0..n) += s[0..n) (vectorised; the embedding's and conv.c's bias sums) */
void cpu_add_row(float *restrict d, const float *restrict s, int64_t n);

/* ---- qconv.c ---- */
void cpu_qcache_free(struct cpu_qcache *q);

/* ---- wino.c ---- */
void cpu_wino_free(struct cpu_wino *w);
/* w's transformed weights made again on the next run (w may be NULL):
 * after runs on scratch weights (tune_time.c's timing) */
void cpu_wino_forget(struct cpu_wino *w);

/* ---- hugepage.c: the device's large buffers on transparent huge pages ---- */
#define CPU_HUGE ((size_t)2 << 20) /* x86-64's huge page: the advice's unit */
/* A buffer of `bytes` aligned to `align` (a power of two, at least
 * sizeof(void *)), or NULL.  From CPU_HUGE bytes up (align at most
 * CPU_HUGE) its own mapping, aligned to CPU_HUGE and advised with
 * MADV_HUGEPAGE (advice that fails is ignored); smaller, posix_memalign's.
 * Not zeroed.  Freed with cpu_huge_free only.  The plugin's one allocator
 * of buffers that may be large (cpu_alloc's, kept weights' copies,
 * scratch, the GEMM helpers'); a small one costs what the heap's does
 * (cpu_huge_free takes no lock for a pointer off a CPU_HUGE boundary).
 * Thread-safe, fork-safe. */
void *cpu_huge_alloc(size_t align, size_t bytes);
void cpu_huge_free(void *p);
/* The bytes usable at p (cpu_huge_alloc's, or NULL: 0): at least those
 * asked for (malloc_usable_size for the heap's) */
size_t cpu_huge_usable(void *p);

/* ---- cpu.c ---- */
const char *cpu_op_name(int type);
/* the shared helpers (plugins/common/describe.h) under the names the
 * kernels use */
static inline int64_t cpu_numel(const struct kiln_tensor_desc *d) { return common_numel(d); }
static inline char *cpu_desc_str(const struct kiln_tensor_desc *d, char *buf, size_t n)
{
	return common_desc_str(d, buf, n);
}
/* The address space RLIMIT_AS leaves this process: its soft limit less
 * VmSize (/proc/self/statm); ULLONG_MAX without a limit. */
unsigned long long cpu_as_room(void);
/* Run a plan on the calling thread with the context's thread count. */
kiln_status cpu_exec(struct cpu_ctx *c, const struct cpu_plan *p, const struct kiln_op_args *a,
		     struct cpu_err *e);

/* ---- loop helpers shared by the kernel files ---- */

/* Below this many elements a parallel region costs more than it saves. */
#define CPU_PAR_MIN 32768
/* Fixed split of reductions: sums are taken over CPU_CHUNKS ranges and the
 * range sums added in order, so results do not depend on the thread count. */
#define CPU_CHUNKS 64

#ifdef _OPENMP
#include <omp.h>
static inline int64_t cpu_thread_num(void) { return omp_get_thread_num(); }
static inline int64_t cpu_num_threads(void) { return omp_get_num_threads(); }
/* The team to open a region of n workers with: the thread's whole team
 * (omp_get_max_threads()) where that is larger and n is 2 or more, the
 * members from n on idle; else n.  libgomp ends the pool threads a smaller
 * team leaves out and creates them again at the next larger region, where
 * a failed pthread_create (a pids limit another process filled mid-run)
 * exits the process (teamstart.h; session 36 counted 2 thread creations a
 * step of a GPT whose attention had 2 (batch, head) pairs on a team of 4).
 * Waking the idle members costs no more: libgomp wakes every pool thread
 * at a region's start either way, the surplus ones to end.  A team of one
 * (if (0), num_threads(1)) leaves the pool alone. */
static inline int cpu_team_whole(int n)
{
	const int m = omp_get_max_threads();
	return n > 1 && m > n ? m : n;
}
#else
static inline int64_t cpu_thread_num(void) { return 0; }
static inline int64_t cpu_num_threads(void) { return 1; }
static inline int cpu_team_whole(int n) { return n; }
#endif

/* The OpenMP thread count is a setting of each thread (an ICV), and kiln
 * sets its own on the thread a kernel or a prepare runs on (cpu_exec,
 * cpu_prepare, dnnteam.c).  That thread may be the program's: kiln_infer,
 * kiln_train and a sync stream's run come in on it.  Every entry point that
 * runs kiln's OpenMP work there takes the count with cpu_omp_enter and puts
 * it back with cpu_omp_leave before returning, so that a program's own
 * `#pragma omp parallel` sees the team it set (before session 35 a model
 * load with [run] threads = 1 left a 2-core program at 1 thread).  The cost:
 * two reads of a thread-local value per call (omp_get_max_threads), and a
 * write only where kiln's count differs from the program's. */
#ifdef _OPENMP
static inline int cpu_omp_enter(void) { return omp_get_max_threads(); }
static inline void cpu_omp_leave(int n)
{
	if (omp_get_max_threads() != n)
		omp_set_num_threads(n);
}
#else
static inline int cpu_omp_enter(void) { return 1; }
static inline void cpu_omp_leave(int n) { (void)n; }
#endif

/* The streaming kernels are memory-bound loops that must run at the
 * machine's vector width: the plugin is built for the baseline x86-64 ISA,
 * so each inner span function is cloned for AVX-512 and AVX2 and picked at
 * load time (ifunc), and `omp simd` vectorises it whatever the -O level. */
#define CPU_CLONES KILN_CLONES /* ../common/clones.h */

/* Split [0, n) into one contiguous, 16-element aligned span per thread of
 * the team and run `body(b, e)`; one parallel region per kernel. */
#define CPU_SPANS(n, b, e, body)                                                          \
	do {                                                                              \
		const int64_t n_ = (n);                                                   \
		_Pragma("omp parallel if (n_ >= CPU_PAR_MIN)")                            \
		{                                                                         \
			const int64_t t_ = cpu_thread_num(), T_ = cpu_num_threads();      \
			int64_t b = (n_ * t_ / T_) & ~(int64_t)15;                        \
			int64_t e = t_ + 1 == T_ ? n_ : (n_ * (t_ + 1) / T_) & ~(int64_t)15; \
			if (e > b) {                                                      \
				body;                                                     \
			}                                                                 \
		}                                                                         \
	} while (0)

/* EINVAL/ENOTSUP naming the op, what is wrong and every tensor it got. */
kiln_status cpu_bad(struct cpu_ctx *c, const struct kiln_op *op, kiln_status st, const char *why);
/* 1 when every input and output of op is f32. */
int cpu_all_f32(const struct kiln_op *op);
/* op without its kept copies (ABI 2.9, KILN_OPF_KEEP): the flag off, the
 * u8 last input (the weight and data gradients) and last output (the
 * forward and the weight gradient) dropped and zeroed; op as it is when
 * it keeps none. */
static inline struct kiln_op cpu_op_unkept(const struct kiln_op *op)
{
	struct kiln_op bare = *op;
	if (!(op->flags & KILN_OPF_KEEP))
		return bare;
	bare.flags &= ~(int32_t)KILN_OPF_KEEP;
	if (op->type != KILN_OP_CONV)
		memset(&bare.in[--bare.n_in], 0, sizeof bare.in[0]);
	if (op->type != KILN_OP_CONV_BWD_DATA)
		memset(&bare.out[--bare.n_out], 0, sizeof bare.out[0]);
	return bare;
}

/* 1 for a 4-d activation stored channels-last. */
static inline int cpu_nhwc(const struct kiln_tensor_desc *d)
{
	return d->ndim == 4 && d->layout == KILN_NHWC;
}

/* ---- ops.c: fill in p->kernel and sizes for a loop kernel, or set an
 * error through host->error (EINVAL bad shape, ENOTSUP unsupported). ---- */
kiln_status cpu_ops_prepare(struct cpu_ctx *c, struct cpu_plan *p);

/* ---- optim.c: SGD, ADAMW, LAMB (same contract as cpu_ops_prepare) ---- */
kiln_status cpu_optim_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* KILN_OPF_GATED: the plan's gate input is 0 (skip the step). */
int cpu_optim_gated_off(const struct cpu_plan *p, const struct kiln_op_args *a);

/* ---- gemm.c ---- */
kiln_status cpu_gemm_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* p's GEMM in the parts of cpu_gemm_split_busy (run while the team is
 * busy, dnnteam.c); KILN_ENOTSUP when that rule does not split it. */
kiln_status cpu_gemm_prepare_busy(struct cpu_ctx *c, struct cpu_plan *p);
void cpu_gemm_free(struct cpu_gemm *g);
/* 1 when g is split (its bytes never depend on the team: no versions) */
int cpu_gemm_is_split(const struct cpu_gemm *g);
/* 1 when OpenBLAS can run op (a GEMM of f32 tensors without bias or
 * activation; the build has it): its second candidate (p->conv_impl 1) */
int cpu_gemm_openblas_ok(const struct kiln_op *op);
/* 1 for the GEMMs the fixed rule gives OpenBLAS (gemm_impl = rule) */
int cpu_gemm_openblas_rule(const struct kiln_op *op);
/* ---- OpenBLAS (openblas.c), loaded at the first call of
 * cpu_openblas_check, not with the plugin ---- */
/* NULL when the OpenBLAS gemm.c and fftconv.c call is usable (built in,
 * loaded, and not its pthread build), else why not (under RLIMIT_AS: not
 * loaded where the limit leaves less than it maps as it loads).  Its
 * first call may set OPENBLAS_CORETYPE in the environment for a moment
 * (openblas.c, ob_core_pick: only where OpenBLAS reports Prescott, the
 * variable is unset and the program had not loaded the library) */
const char *cpu_openblas_check(void);
/* NULL where a plan may run its GEMMs on OpenBLAS on `threads` threads
 * at once: cpu_openblas_check's, and under RLIMIT_AS the buffers its pool
 * maps for them (128 MiB each) mapped now, at prepare, where the limit
 * leaves room for them (c->host told once where not); else why not
 * (oneDNN runs them) */
const char *cpu_openblas_ready(struct cpu_ctx *c, int threads);
/* host told (once a process) where OpenBLAS was left unloaded for
 * RLIMIT_AS's sake, so its GEMMs run on oneDNN (INFO), or where kiln
 * chose its kernels for a CPU it does not know (debug), or advises how
 * to where it cannot (INFO) (openblas.c, ob_core_pick) */
void cpu_openblas_said(const struct kiln_host *host);
/* cblas_sgemm, row-major, op(a) transposed where ta, op(b) where tb; only
 * where cpu_openblas_check() is NULL */
void cpu_openblas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *a, int lda,
			const float *b, int ldb, float beta, float *c, int ldc);
/* ", OpenBLAS 0.3.21 (OpenMP, Zen)" where it is usable, else "": the
 * device line's and the tune cache's stamp's tail (cpu_dnn_isa) */
void cpu_openblas_str(char *buf, size_t n);

/* ---- split.c: the helpers that run a split GEMM's parts ---- */
#define CPU_POOL_MAX 15        /* helper threads */
#define CPU_POOL_PARTS 64      /* parts of one job, at most */
#define CPU_POOL_SPIN_NS 20000 /* a helper's spin for the next job before it sleeps */
#define CPU_JOB_ARGS 6
/* A job of n parts.  run computes part k on thread `slot` (0: the caller,
 * straight into the output; a helper: into its buffer priv) and returns 0;
 * commit copies a helper's part from priv into the output. */
struct cpu_job {
	int (*run)(const struct cpu_job *j, int slot, int k, void *priv);
	void (*commit)(const struct cpu_job *j, int k, void *priv);
	int n;
	const void *arg[CPU_JOB_ARGS];
};
/* Make the helpers (threads - 1 of them) if not yet made, each with a
 * buffer of at least `bytes`. */
kiln_status cpu_split_reserve(struct cpu_ctx *c, size_t bytes);
/* Run every part of job, on the caller and the helpers; the caller never
 * waits much longer than a part for a helper (it runs a late helper's part
 * itself).  Nonzero when a part's run failed. */
int cpu_split_run(struct cpu_ctx *c, const struct cpu_job *job);
/* Wait until no helper is inside a part (before memory or a plan a late
 * helper may read is freed). */
void cpu_split_quiesce(struct cpu_ctx *c);
void cpu_split_destroy(struct cpu_ctx *c);
/* ---- split.c: thread-affine spans of the optimizers ----
 * Where the two (or more) threads of a team sit on two CCDs (or sockets),
 * every cache line one thread writes and the other reads crosses between
 * their caches (docs/PERFORMANCE.md, "Session 50").  A written weight
 * gradient on a team of T threads is computed by kiln's own row split
 * (gemm.c, gemm_blas_rows): thread t writes rows [cut[t], cut[t+1]), and
 * notes that here; an optimizer over the flat buffer then gives each
 * thread the same rows of every noted gradient (and of the parameters and
 * state beside them), and splits the rest (biases, small layers) evenly.
 * A hint only moves work between threads: the update is elementwise, so
 * its bytes never depend on it.  Off unless $KILN_CPU_AFFINE is "1" (read
 * once): measured on a loaded machine it did not show the gain a model of
 * it showed (bench/affine_split.c, bench/affine_ab.sh). */
#define CPU_AFFINE_T 8      /* teams up to this size note their rows */
#define CPU_AFFINE_HINTS 64 /* hints kept (the newest) */
#define CPU_AFFINE_SPANS (2 * CPU_AFFINE_HINTS + 2)
/* 1 when $KILN_CPU_AFFINE is "1" (read once). */
int cpu_affine_on(void);
/* Thread t of T wrote elements [cut[t], cut[t + 1]) of the n f32 at `at`
 * (cut[0] = 0, cut[T] = n, nondecreasing); T <= CPU_AFFINE_T. */
void cpu_affine_note(const float *at, int64_t n, int T, const int64_t *cut);
/* The hints inside the n f32 at base, taken once for an op (every thread
 * of its team then splits by the same ones). */
struct cpu_affine_snap {
	int64_t n;
	int nh;
	struct {
		int64_t off, n, cut[CPU_AFFINE_T + 1];
		int T;
	} h[CPU_AFFINE_HINTS];
};
void cpu_affine_take(const float *base, int64_t n, struct cpu_affine_snap *s);
/* Thread t of T's spans of s's buffer: b[k], e[k] (offsets from its base),
 * k < the returned count (at most CPU_AFFINE_SPANS): its part of each hint
 * of a team of T, and its even share (CPU_SPANS's rule) of the elements
 * between them.  Every element is in exactly one thread's spans.  s NULL:
 * no hints, over n elements. */
int cpu_affine_spans(const struct cpu_affine_snap *s, int64_t n, int t, int T, int64_t *b,
		     int64_t *e);
/* CPU_SPANS over the thread-affine spans of the f32 buffer at base. */
#define CPU_AFFINE_FOR(base, n, b, e, body)                                               \
	do {                                                                              \
		const int64_t n_ = (n);                                                   \
		struct cpu_affine_snap *s_ = cpu_affine_on() ? malloc(sizeof *s_) : NULL; \
		if (s_)                                                                   \
			cpu_affine_take((base), n_, s_);                                  \
		_Pragma("omp parallel if (n_ >= CPU_PAR_MIN)")                            \
		{                                                                         \
			int64_t bs_[CPU_AFFINE_SPANS], es_[CPU_AFFINE_SPANS];             \
			const int ns_ = cpu_affine_spans(s_, n_, (int)cpu_thread_num(),     \
							 (int)cpu_num_threads(), bs_, es_); \
			for (int k_ = 0; k_ < ns_; k_++) {                                \
				const int64_t b = bs_[k_], e = es_[k_];                   \
				body;                                                     \
			}                                                                 \
		}                                                                         \
		free(s_);                                                                 \
	} while (0)
kiln_status cpu_engine_create(struct cpu_ctx *c);
/* dnn.c: "oneDNN 2.6.3, ISA avx512_core_bf16, bf16 AVX512-BF16" into buf. */
const char *cpu_dnn_isa(char *buf, size_t n);
/* dnn.c: 1 when oneDNN has bf16 kernels and JIT bf16 <-> f32 reorders on
 * this CPU (avx512_core and up), 0 on AVX2 and below. */
int cpu_dnn_bf16_native(void);
/* dnn.c: 1 when those kernels have bf16 dot products (avx512_core_bf16,
 * AMX), not emulated ones */
int cpu_dnn_bf16_dots(void);
void cpu_engine_destroy(struct cpu_ctx *c);

/* ---- dnn.c: a plan made of oneDNN primitives ---- */
void cpu_dnn_free(struct cpu_dnn *d);

/* layout.c: dst[c * ld + r] = src[r * ls + c], r < R, c < S (f32), by
 * 8 x 8 AVX2 tiles where the CPU has them (a pure copy: the same bits). */
void cpu_transpose_f32(float *dst, int64_t ld, const float *src, int64_t ls, int64_t R, int64_t S);

/* ---- conv.c, pool.c, bn.c, act.c, layout.c: prepare one family of ops
 * (same contract as cpu_ops_prepare) ---- */
kiln_status cpu_conv_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* conv.c: the op as one oneDNN convolution (never in blocks) */
kiln_status cpu_conv_prepare_whole(struct cpu_ctx *c, struct cpu_plan *p);
/* convsplit.c: a CONV_BWD_WEIGHTS in k blocks of the minibatch
 * (cpu_conv_wsplit); KILN_ENOTSUP, with no message, when the blocks'
 * kernels would read or leave kept copies in other layouts. */
kiln_status cpu_conv_wsplit_prepare(struct cpu_ctx *c, struct cpu_plan *p, int k);
void cpu_wsplit_free(struct cpu_wsplit *w);
/* qconv.c: KILN_OP_QCONV and KILN_OP_QLINEAR (oneDNN int8) */
kiln_status cpu_qconv_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_pool_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_bn_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_act_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_dropout_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_layout_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* embedding.c, layernorm.c: the transformer ops (same contract) */
kiln_status cpu_embedding_prepare(struct cpu_ctx *c, struct cpu_plan *p);
kiln_status cpu_layernorm_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* rnn.c: RNN, RNN_BWD through oneDNN's LSTM and linear-before-reset GRU */
kiln_status cpu_rnn_prepare(struct cpu_ctx *c, struct cpu_plan *p);
/* attn.c: ATTENTION, ATTENTION_BWD (fused scaled-dot-product attention),
 * ATTENTION_DECODE (one step with a key/value cache) */
kiln_status cpu_attn_prepare(struct cpu_ctx *c, struct cpu_plan *p);

/* ---- lowp.c: bf16 and f16 storage, f32 arithmetic ---- */
static inline int cpu_lowp(int dtype) { return dtype == KILN_BF16 || dtype == KILN_F16; }
/* 1 when any tensor of op is bf16 or f16. */
int cpu_op_lowp(const struct kiln_op *op);
/* 1 when any tensor of op has `dtype`. */
int cpu_op_has(const struct kiln_op *op, int dtype);
/* bf16 from f32, round to nearest even (NaN kept quiet, infinities kept),
 * and back: plugins/common/half.h, the CUDA kernels' rounding too. */
static inline uint16_t cpu_bf16_round(float f) { return half_f32_bf16(f); }
static inline float cpu_bf16_f32(uint16_t h) { return half_bf16_f32(h); }
/* y[0..n) = x converted between f32 and `dtype` (bf16, f16; f32 copies),
 * one span per thread.  f32 to bf16/f16 rounds to nearest even. */
void cpu_cvt_to_f32(float *y, const void *x, int dtype, int64_t n);
void cpu_cvt_from_f32(void *y, const float *x, int dtype, int64_t n);
/* The same on the calling thread only (inside a parallel region). */
void cpu_cvt_span_from_f32(void *y, const float *x, int dtype, int64_t n);
void cpu_cvt_to_f32_span(float *y, const void *x, int dtype, int64_t n);
/* Prepare p (an op with bf16/f16 tensors) as the f32 op of `family` with
 * its low-precision tensors converted through the workspace. */
kiln_status cpu_lowp_prepare(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *));
/* Free what a plan's prepare made (inner plans too), not the plan itself. */
void cpu_plan_release(struct cpu_plan *p);

/* ---- wcache.c: widened weights kept between runs (AVX2 bf16) ---- */
struct cpu_wcache;
/* The process's cache (one per process, counted per context), or NULL
 * where oneDNN has bf16 kernels (cpu_dnn_bf16_native) or memory is short;
 * the last cpu_wc_close frees it (logs its use at debug). */
struct cpu_wcache *cpu_wc_open(void);
void cpu_wc_close(struct cpu_wcache *w, const struct kiln_host *host);
/* The f32 copy of weight src (n elements of bf16/f16 dtype), kept from an
 * earlier run with no write since (*fill = 0), or to be widened now by the
 * caller (*fill = a ticket, nonzero: the caller converts src into it, in
 * its own parallel region with its other inputs, then calls
 * cpu_wc_filled); NULL: not a weight (outside the optimizers' compute
 * copies), read once so far, being filled by another run, or no memory:
 * the caller widens it itself (also when the copy is stale while another
 * run still reads it).  Held until cpu_wc_done: never rewritten before. */
const float *cpu_wc_get(struct cpu_wcache *w, const void *src, int dtype, int64_t n,
			unsigned *fill);
/* The caller of cpu_wc_get widened src into the copy (ticket from *fill):
 * later runs read it, unless src was written meanwhile. */
void cpu_wc_filled(struct cpu_wcache *w, const float *buf, unsigned ticket);
/* The caller of a cpu_wc_get that returned buf no longer reads it (its
 * kernel ran): once no run holds a stale copy, it may be refilled. */
void cpu_wc_done(struct cpu_wcache *w, const float *buf);
/* After p ran with a: its outputs were written (copies overlapping them
 * stale), and an optimizer's bf16/f16 last output is a compute copy, or
 * where it has none, a CAST's bf16/f16 output of its f32 params (ADAMW
 * with amsgrad). */
void cpu_wc_ran(const struct cpu_plan *p, const struct kiln_op_args *a);
/* bytes at dst were written (a copy) */
void cpu_wc_wrote(const void *dst, size_t bytes);
/* anything may have been written (a host function; freed = 1: memory
 * freed, the compute copies forgotten until an optimizer runs again) */
void cpu_wc_wrote_any(int freed);

/* ---- tune.c: bf16 or f32 kernels for a bf16 convolution or GEMM ---- */
/* Prepare p (GEMM or CONV* with bf16 tensors) with the kernel the context's
 * setting names; for `auto`, prepare both, time them on scratch buffers
 * and keep the faster (remembered per op, logged).  Same contract as
 * cpu_ops_prepare. */
kiln_status cpu_tune_prepare(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *));
/* Prepare p (an f32 CONV*) with oneDNN's first implementation, or for a
 * forward CONV without kept copies under [plugin.cpu] conv_impl = auto,
 * the fastest of its first CPU_CONV_IMPLS distinct ones (timed on scratch
 * buffers, remembered per op, logged). */
kiln_status cpu_tune_conv_impl(struct cpu_ctx *c, struct cpu_plan *p);
/* Prepare p (an f32 GEMM) with oneDNN, or under [plugin.cpu] gemm_impl
 * with OpenBLAS (1), or the faster of the two (CPU_CONV_AUTO: timed as
 * cpu_tune_conv_impl times), where cpu_gemm_openblas_ok. */
kiln_status cpu_tune_gemm_impl(struct cpu_ctx *c, struct cpu_plan *p);
/* Prepare p (an f32 CONV*) by FFT (fftconv.c) or directly (oneDNN,
 * cpu_tune_conv_impl) as [plugin.cpu] conv_algo says: by setting, by
 * cpu_fftconv_rule, or the faster of the two (CPU_CONV_AUTO, timed as
 * cpu_tune_conv_impl times).  Under auto a kept-copy op (KILN_OPF_KEEP)
 * whose bare twin goes to the FFT is refused (KILN_ENOTSUP): the layer
 * then runs without kept copies; rule and fft keep the FFT's spectra.
 * Also the inner f32 op of a bf16/f16 convolution (cpu_lowp_prepare). */
kiln_status cpu_tune_conv_algo(struct cpu_ctx *c, struct cpu_plan *p);
/* Forget the choices (close()). */
void cpu_tune_free(struct cpu_ctx *c);
/* op with its unused slots and reserved fields zeroed, whole otherwise:
 * two ops of one key are the same op (memcmp); tune.c's choice key is
 * this less the flags a timing does not depend on. */
void cpu_op_key(const struct kiln_op *op, struct kiln_op *key);
/* One kept choice, as the persistent cache stores it: the candidate, and
 * whether it was timed under contention (provisional: re-timed by a later
 * context that finds the machine quiet, never written over a confident
 * one) with the process's threads' run-queue wait then, in seconds a second
 * (< 0: not measured). */
struct cpu_tune_val {
	int choice;
	int provisional;
	double wait;
};
/* The persistent cache's hooks: remember a choice read from the file; call
 * fn on each choice (fn may be NULL), returning how many there are. */
void cpu_tune_add(struct cpu_ctx *c, const struct kiln_op *op, const struct cpu_tune_val *v);
int cpu_tune_each(struct cpu_ctx *c, void (*fn)(void *, const struct kiln_op *, const struct cpu_tune_val *),
		  void *arg);

/* ---- contention now (async_auto.c): the async rule's probe, the tune's timing ---- */
/* busy: the thread waited for a CPU more than this, in seconds a second of
 * wall time (the async rule's probe and watch, tune.c's timing) */
#define CPU_WAIT_BUSY 0.25
/* The calling thread's run-queue wait between cpu_wait_begin and
 * cpu_wait_end (schedstat, cpu_self_delay_ns), in seconds a second; < 0
 * where schedstat does not read.  From cpu_wait_begin_all: the wait of
 * every thread of the process, summed (cpu_run_delay_ns, the adaptive
 * team's measure): a thread that sleeps at a barrier while its team's
 * other thread waits for a CPU waits none itself (tune_time.c). */
struct cpu_wait_mark {
	int64_t delay_ns, t_ns;
	int all;
};
void cpu_wait_begin(struct cpu_wait_mark *m);
void cpu_wait_begin_all(struct cpu_wait_mark *m);
double cpu_wait_end(const struct cpu_wait_mark *m);
/* That wait over CPU_PROBE_NS of spinning (KILN_CPU_PROBEWAIT, the tests'
 * hook: that): what a thread that wants a CPU waits now. */
double cpu_probe_wait(void);

/* ---- tune_cache.c: the choices kept between runs -------------------- */
/* Resolve [plugin.cpu] tune_cache into c->tune_path (cfg NULL: none). */
kiln_status cpu_tune_cache_config(struct cpu_ctx *c, const struct kiln_config *cfg);
/* Read the file's choices for this team into the context (open()); a
 * stale or damaged file is logged and ignored, never an error. */
void cpu_tune_cache_load(struct cpu_ctx *c);
/* Merge the context's choices into the file, atomically, when it timed
 * any (close()); a failure is logged. */
void cpu_tune_cache_save(struct cpu_ctx *c);
/* Log how many choices the prepares since the last call took from the
 * cache with their own lines at debug, when any (tune.c; thread-safe). */
void cpu_tune_summary(struct cpu_ctx *c);
/* One buffer holding scratch tensors of p's op's shapes (max pooling's aux:
 * p->aux bytes) and ws bytes of zeroed
 * workspace, pointed to by *a: float tensors 0.25 each (random = 0, for
 * timing) or pseudo-random values, the same on every call (random = 1);
 * other dtypes zero.  out_bytes (NULL, or op->n_out entries): each
 * output's size.  The caller frees the buffer with cpu_huge_free; NULL when
 * out of memory. */
char *cpu_scratch_args(const struct cpu_plan *p, size_t ws, int random, struct kiln_op_args *a,
		       size_t *out_bytes);

/* What a timing ran under (cpu_tune_time_plans), for tune.c's tune_choose. */
struct cpu_tune_cond {
	double wait; /* run-queue wait of the process's threads, summed, s/s; < 0 not measured */
	int team;    /* the smaller of kiln's and oneDNN's adaptive teams as the timed runs
		      * began; 0 for an op that runs on one thread on any team */
	int changed; /* either team changed size from the warm-up to the last run */
};

/* Seconds of one run of each of the n plans q[] on scratch tensors of
 * q[0]'s op's shapes: wall[k] the median wall time of candidate k, cpu[k]
 * the median CPU time of the timing thread's team (both < 0 when a plan
 * failed to run), and *w what they ran under (tune_time.c). */
void cpu_tune_time_plans(struct cpu_ctx *c, struct cpu_plan *const *q, int n, double *wall,
			 double *cpu, struct cpu_tune_cond *w);

/* ---- dnnteam.c: oneDNN's plans on a smaller team, same bytes ---- */
/* With an adaptive team: give p (and its inner plans) that run oneDNN
 * primitives their table of versions.  ENOMEM on failure. */
kiln_status cpu_variants_attach(struct cpu_ctx *c, struct cpu_plan *p);
void cpu_variants_free(struct cpu_variants *v);
/* Forget the probes' outcomes kept for the context (close()). */
void cpu_variants_forget(struct cpu_ctx *c);
/* The plan to run for p at oneDNN's team now (p itself, or its version
 * for that team when it gives the same bytes, made on first use), with
 * the calling thread's OpenMP count set to that plan's team.  gemm.c's
 * and dnn.c's kernels start with it. */
const struct cpu_plan *cpu_variant(const struct cpu_plan *p);

/* ---- stream.c: the device ops members for streams and events ---- */

/* What a stream executes (and what a captured graph holds, graph.c). */
enum cpu_task_kind { CPU_T_RUN, CPU_T_COPY, CPU_T_RECORD, CPU_T_WAIT, CPU_T_HOST };

struct cpu_task {
	int kind;
	const struct cpu_plan *plan;  /* RUN */
	struct kiln_op_args args;     /* RUN: copied, the caller's is on its stack */
	void *dst;                    /* COPY */
	const void *src;
	size_t bytes;
	struct cpu_event *ev;         /* RECORD, WAIT */
	uint64_t gen;
	kiln_status (*fn)(void *);    /* HOST: KILN_PROC_HOST_FN's function */
	void (*skip)(void *);         /* HOST: KILN_PROC_HOST_FN_SKIP's, or NULL */
	void *arg;
	uint64_t after;               /* a side stream's task: runs once its
				       * owner has run this many tasks */
};

/* Issue one task on stream s as run/copy_async/event_record/stream_wait/
 * host_fn would, bypassing any capture (graph.c's replays). */
kiln_status cpu_issue(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t);
/* ---- graph.c: captured steps (device ops version 3) ---- */
/* While c->cap is set: record t (on stream s) instead of running it, or
 * refuse it as CUDA stream capture would.  *taken = 1 when recorded (or
 * refused: the status says), 0 when it runs as usual. */
kiln_status cpu_capture_take(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t,
			     int *taken);
/* stream_sync/event_sync/alloc during a capture, and waits on an event
 * whose latest record was captured: refused (the status), else 0. */
kiln_status cpu_capture_check_sync(struct cpu_ctx *c, struct cpu_stream *s,
				   struct cpu_event *ev, const char *what);
kiln_status cpu_capture_begin(void *ctx, void *stream);
kiln_status cpu_capture_end(void *ctx, void *stream, void **graph);
kiln_status cpu_graph_launch(void *ctx, void *graph, void *stream);
void cpu_graph_free(void *ctx, void *graph);

kiln_status cpu_stream_create(void *ctx, void **stream);
void cpu_stream_destroy(void *ctx, void *stream);
/* KILN_PROC_STREAM_SIDE: a side stream of `stream` (stream.c) */
kiln_status cpu_stream_side(void *ctx, void *stream, void **side);
kiln_status cpu_event_create(void *ctx, void **event);
void cpu_event_destroy(void *ctx, void *event);
/* Give every stream of c a worker thread (on = 1) or drain and stop them
 * (0), and run c that way from now on; the caller issues nothing
 * meanwhile (KILN_PROC_WORKLOAD's moment; stream.c).  Under
 * c->switch_lock, as cpu_stream_create/destroy: a stream created on
 * another thread meanwhile is started after the switch, whole. */
kiln_status cpu_streams_set_async(struct cpu_ctx *c, int on);
/* c->async, atomically: a switch (release) is seen whole by a reader
 * (acquire) on any thread, under c->lock or not. */
static inline int cpu_async_get(const struct cpu_ctx *c)
{
	return __atomic_load_n(&c->async, __ATOMIC_ACQUIRE);
}
static inline void cpu_async_put(struct cpu_ctx *c, int on)
{
	__atomic_store_n(&c->async, on, __ATOMIC_RELEASE);
}
/* async = auto after the rule chose sync: called by the thread that issues
 * the device's work, at an event record (cpu_event_record); once its
 * threads wait for a CPU, the streams turn async (async_auto.c). */
void cpu_async_watch(struct cpu_ctx *c);
/* [plugin.cpu] async at open: *async 0 or 1 as set, or auto's choice
 * from opts (ranks, peers); *rule 1 where a data-parallel rank's workload
 * decides (cpu_workload).  A config error as the host reports it. */
kiln_status cpu_async_choice(const struct kiln_host *host, const struct kiln_config *cfg,
			     const struct kiln_device_options *opts, int *async, int *rule);
/* KILN_PROC_WORKLOAD: async = auto's rule on a data-parallel rank, then
 * the watch where it chose sync (async_auto.c). */
kiln_status cpu_workload(void *ctx, const struct kiln_workload *w);
/* KILN_PROC_RUN_WAIT: the process's threads' run-queue wait so far, in
 * ns (KILN_CPU_RUNWAIT: the tests' constant rate; async_auto.c). */
int64_t cpu_run_wait(void *ctx);
kiln_status cpu_copy_async(void *ctx, void *dst, const void *src, size_t bytes, int kind,
			   void *stream);
kiln_status cpu_event_record(void *ctx, void *event, void *stream);
kiln_status cpu_stream_wait(void *ctx, void *stream, void *event);
kiln_status cpu_event_sync(void *ctx, void *event);
/* the host table kiln_plugin_init was given (a call with no context,
 * cpu_host_fn_skip's ctx NULL, sets its messages there) */
const struct kiln_host *cpu_plugin_host(void);
kiln_status cpu_host_fn(void *ctx, void *stream, kiln_status (*fn)(void *), void *arg);
kiln_status cpu_host_fn_skip(void *ctx, void *stream, kiln_status (*fn)(void *),
			     void (*skip)(void *), void *arg);
kiln_status cpu_stream_sync(void *ctx, void *stream);
/* Enqueue (async) or execute (sync) one run of a checked plan. */
kiln_status cpu_stream_run(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_plan *p,
			   const struct kiln_op_args *a);
/* Destroy every stream and event still live (close()). */
void cpu_streams_destroy_all(struct cpu_ctx *c);
/* Block until no queued task refers to plan p (caller holds c->lock). */
void cpu_plan_wait_idle(struct cpu_ctx *c, struct cpu_plan *p);

#endif /* KILN_CPU_H */
