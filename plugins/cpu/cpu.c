/* plugins/cpu/cpu.c - the CPU device plugin: descriptor, open/close, host
 * memory, and the prepare/run/plan_free dispatch.
 *
 * Device memory is host memory, so copies are memcpy and there is no
 * pinning.  Kernels are oneDNN (GEMM, gemm.c; convolution, conv.c;
 * pooling, pool.c) and plain C with OpenMP (ops.c, bn.c, act.c, layout.c).  With [plugin.cpu] async = 1 (or auto's
 * rule, async_auto.c) every stream gets a worker thread
 * (stream.c), so a missing event or a hidden host sync shows up here as a
 * wrong result or a hang instead of only on a GPU.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_* */
#endif
#include "cpu.h"
#include "fftconv.h" /* HAVE_FFTW */
#include "teamstart.h" /* cpu_team_start */

#include <omp.h>      /* omp_set_num_threads */
#include <stdarg.h>
#include <sched.h>
#include <stdio.h>    /* vsnprintf, snprintf */
#include <stdlib.h>   /* free, calloc */
#include <string.h>
#include <unistd.h>   /* sysconf */
#include <limits.h>   /* ULLONG_MAX */
#include <stddef.h>   /* ptrdiff_t */
#include <sys/resource.h> /* getrlimit: cpu_as_room */

#define CPU_ALIGN 64

/* ---- helpers shared by the other files -------------------------------- */

kiln_status cpu_err_msg(struct cpu_err *e, kiln_status st, const char *msg)
{
	const size_t n = strlen(msg), cap = sizeof e->msg;
	e->st = st;
	if (n < cap) {
		memcpy(e->msg, msg, n + 1);
		return st;
	}
	const size_t head = cap / 4, tail = cap - 1 - head - 3;
	memcpy(e->msg, msg, head);
	memcpy(e->msg + head, "...", 3);
	memcpy(e->msg + head + 3, msg + n - tail, tail + 1);
	return st;
}

kiln_status cpu_fail(struct cpu_err *e, kiln_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	const int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) { /* out of memory: what fits */
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof e->msg, fmt, ap);
		va_end(ap);
		e->st = st;
		return st;
	}
	cpu_err_msg(e, st, s);
	free(s);
	return st;
}

static const struct kiln_host *cpu_host; /* from kiln_plugin_init */

const struct kiln_host *cpu_plugin_host(void)
{
	return cpu_host;
}

const char *cpu_op_name(int type)
{
	/* the core's table (host version 3) */
	return common_op_name(cpu_host, type);
}

/* What the team's tick saw, logged: the adaptive team's change of size
 * (debug), or once, a fixed team whose threads waited for a CPU where the
 * adaptive team would have stepped down (info: the user chose that team
 * and can change it; threads.h, struct cpu_team_live). */
static void team_news_log(struct cpu_ctx *c, int n, const struct cpu_team_news *w)
{
	char others[64] = "";
	if (w->others >= 0)
		snprintf(others, sizeof others, "; other processes took %.2f CPUs", w->others);
	if (w->from) {
		/* Only kiln's own loops follow the team: oneDNN's kernels open
		 * their regions with the team they were created for.  Forcing
		 * those onto one thread (max-active-levels 0) hung the JIT
		 * batchnorm, whose threads meet at barriers sized at creation. */
		c->host->log(KILN_LOG_DEBUG, "cpu",
			     "team of %d -> %d threads at interval %lld (%.2f waited for a CPU%s)", w->from,
			     n, (long long)w->interval, w->load, others);
		return;
	}
	c->host->log(KILN_LOG_INFO, "cpu",
		     "the fixed team of %d threads (%s) waits for a CPU (%.2f threads on average over "
		     "interval %lld%s): each parallel region waits for a descheduled thread.  %s "
		     "(docs/PERFORMANCE.md, \"Steady under contention\")",
		     c->threads, c->threads_set ? "[run] threads is set" : "[plugin.cpu] adaptive = 0",
		     w->load, (long long)w->interval, others,
		     cpu_team_hint_advice(c->threads_set, c->deterministic));
}

kiln_status cpu_exec(struct cpu_ctx *c, const struct cpu_plan *p, const struct kiln_op_args *a,
		     struct cpu_err *e)
{
	/* The thread count is an OpenMP per-thread setting, and run() may be
	 * called from the loader's thread or a stream worker: set it where
	 * the kernel runs.  oneDNN (OpenMP build) reads the same setting.
	 * The team shrinks while its threads wait for a CPU (threads.c). */
	/* a thread's first op (a stream worker's, the loader's): its team
	 * made here, where a failure is this op's error, not libgomp's exit
	 * (teamstart.h) */
	if (cpu_team_start(c->threads, NULL, e->msg, sizeof e->msg))
		return e->st = KILN_EDEVICE;
	struct cpu_team_news news;
	const int n = cpu_team_tick(&c->team, &news);
	if (news.from || news.fixed_waits)
		team_news_log(c, n, &news);
	if (omp_get_max_threads() != n)
		omp_set_num_threads(n);
	e->st = KILN_OK;
	e->msg[0] = 0;
	const kiln_status st = p->kernel(p, a, e);
	cpu_wc_ran(p, a); /* (a failed op may have written some) */
	return st;
}

/* ---- open / close ----------------------------------------------------- */

/* The lock and condition of every CPU context of the process: a pipeline
 * stage's stream waits for events its neighbours' contexts record ([run]
 * devices = cpu:0, cpu:1), so they share one (the broadcasts of one
 * context's progress wake the waiters of all). */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
} cpu_sync = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };


/* [plugin.cpu]'s kernel choices (bf16_conv, bf16_gemm, conv_impl,
 * gemm_impl, conv_algo), from cfg (NULL: the defaults).  A timed choice
 * may differ between runs: deterministic runs take the rules instead. */
struct cpu_kernel_keys {
	int kern[2]; /* bf16_conv, bf16_gemm: CPU_KERN_* */
	int conv_impl, gemm_impl, conv_algo;
};

/* bf16_conv (i = 0) and bf16_gemm (1) into *kern */
static kiln_status cpu_kern_key(const struct kiln_host *host, const struct kiln_config *cfg, int i,
				int deterministic, int *kern)
{
	static const char *const key[2] = { "bf16_conv", "bf16_gemm" };
	const char *v = cfg ? host->config_get(cfg, "plugin.cpu", key[i]) : NULL;
	if (!v || !strcmp(v, "auto"))
		*kern = CPU_KERN_AUTO;
	else if (!strcmp(v, "bf16"))
		*kern = CPU_KERN_BF16;
	else if (!strcmp(v, "f32"))
		*kern = CPU_KERN_F32;
	else if (i == 1 && !strcmp(v, "bf16-2"))
		*kern = CPU_KERN_BF16_2;
	else
		return host->error(KILN_ECONFIG, "cpu: [plugin.cpu] %s = %s: expected auto, bf16%s or f32",
				   key[i], v, i == 1 ? ", bf16-2" : "");
	/* deterministic runs keep auto's fixed rules and otherwise the
	 * bf16 kernels, unless told otherwise */
	if (*kern == CPU_KERN_AUTO && deterministic)
		*kern = CPU_KERN_RULE;
	return KILN_OK;
}

static kiln_status cpu_kernel_keys(const struct kiln_host *host, const struct kiln_config *cfg,
				   int deterministic, struct cpu_kernel_keys *kk)
{
	kiln_status st;
	kk->conv_impl = 0;
	kk->gemm_impl = HAVE_OPENBLAS ? CPU_GEMM_RULE : 0; /* unset */
	kk->conv_algo = CPU_GEMM_RULE; /* unset (without FFTW the rule takes no FFT) */
	for (int i = 0; i < 2; i++)
		if ((st = cpu_kern_key(host, cfg, i, deterministic, &kk->kern[i])))
			return st;
	const char *ci = cfg ? host->config_get(cfg, "plugin.cpu", "conv_impl") : NULL;
	if (ci && strcmp(ci, "first") && strcmp(ci, "auto") && strcmp(ci, "1") && strcmp(ci, "2"))
		return host->error(KILN_ECONFIG, "cpu: [plugin.cpu] conv_impl = %s: expected first, auto, 1 or 2", ci);
	kk->conv_impl = !ci || !strcmp(ci, "first") ? 0 : !strcmp(ci, "auto") ? CPU_CONV_AUTO : atoi(ci);
	if (kk->conv_impl == CPU_CONV_AUTO && deterministic) /* not a timed choice */
		kk->conv_impl = 0;
	const char *gi = cfg ? host->config_get(cfg, "plugin.cpu", "gemm_impl") : NULL;
	if (gi && strcmp(gi, "rule") && strcmp(gi, "auto") && strcmp(gi, "onednn") &&
	    strcmp(gi, "openblas"))
		return host->error(KILN_ECONFIG, "cpu: [plugin.cpu] gemm_impl = %s: expected rule, auto, onednn or openblas", gi);
	if (gi && !strcmp(gi, "openblas") && cpu_openblas_check())
		return host->error(KILN_ECONFIG, "cpu: [plugin.cpu] gemm_impl = openblas: %s",
				   cpu_openblas_check());
	if (gi)
		kk->gemm_impl = !strcmp(gi, "auto")   ? CPU_CONV_AUTO
				: !strcmp(gi, "rule") ? CPU_GEMM_RULE
						      : !strcmp(gi, "openblas");
	const char *ca = cfg ? host->config_get(cfg, "plugin.cpu", "conv_algo") : NULL;
	if (ca && strcmp(ca, "rule") && strcmp(ca, "auto") && strcmp(ca, "direct") &&
	    strcmp(ca, "fft") && strcmp(ca, "winograd"))
		return host->error(KILN_ECONFIG,
				   "cpu: [plugin.cpu] conv_algo = %s: expected rule, auto, direct, fft or winograd", ca);
	if (ca && !strcmp(ca, "fft") && !HAVE_FFTW)
		return host->error(KILN_ECONFIG, "cpu: [plugin.cpu] conv_algo = fft: this build has no FFTW (configure --with-fftw; apt-get install libfftw3-dev)");
	if (ca)
		kk->conv_algo = !strcmp(ca, "auto")   ? CPU_CONV_AUTO
				: !strcmp(ca, "rule")	  ? CPU_GEMM_RULE
				: !strcmp(ca, "winograd") ? CPU_CONV_WINO
							  : !strcmp(ca, "fft");
	if (kk->conv_algo == CPU_CONV_AUTO && deterministic)
		kk->conv_algo = CPU_GEMM_RULE;
	/* the rule's choice instead of a timed one; OpenBLAS's pthread build
	 * (the alternatives' choice) is left out */
	if (kk->gemm_impl == CPU_CONV_AUTO && deterministic)
		kk->gemm_impl = CPU_GEMM_RULE;
	if (kk->gemm_impl < 0 && cpu_openblas_check())
		kk->gemm_impl = 0;
	return KILN_OK;
}

/* The opening thread's team tried (teamstart.h: made at its first op),
 * the message's buffer in a frame of its own: cpu_open's stays small
 * (cli/kiln.c's stack minimum). */
static __attribute__((noinline)) kiln_status open_team_check(const struct kiln_host *host, int threads)
{
	char msg[1536];
	if (cpu_team_check(threads, "the device's opening thread", msg, sizeof msg))
		return host->error(KILN_EDEVICE, "%s", msg);
	return KILN_OK;
}

static kiln_status cpu_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    int ordinal, const struct kiln_device_options *opts, void **out)
{
	kiln_status st;
	int64_t threads = opts->threads; /* [run] threads, from the core */
	int async = -1, async_rule = 0, deterministic = opts->deterministic, graph = 0;
	int keep_weights = 1; /* [plugin.cpu] keep_weights, unset (no config) */
	int keep_widened = 1; /* [plugin.cpu] keep_widened, unset (no config) */
	int64_t spin_us = 5000; /* [plugin.cpu] stage_spin_us, unset (no config) */
	int backoff = 1; /* [plugin.cpu] stage_backoff, unset (no config) */
	*out = NULL;
	if (ordinal < 0)
		return host->error(KILN_EINVAL, "cpu: device ordinal %d is negative", ordinal);
	/* Every ordinal is the same host memory: ranks of a multi-process CPU
	 * run each open their local rank's ordinal. */
	if (cfg) {
		if ((st = cpu_async_choice(host, cfg, opts, &async, &async_rule)))
			return st;
		st = host->config_get_int(cfg, "plugin.cpu", "stage_spin_us", &spin_us);
		if (st && st != KILN_ENOTFOUND)
			return st;
		st = host->config_get_bool(cfg, "plugin.cpu", "stage_backoff", &backoff);
		if (st && st != KILN_ENOTFOUND)
			return st;
		st = host->config_get_bool(cfg, "plugin.cpu", "graph", &graph);
		if (st && st != KILN_ENOTFOUND)
			return st;
		st = host->config_get_bool(cfg, "plugin.cpu", "keep_weights", &keep_weights);
		if (st && st != KILN_ENOTFOUND)
			return st;
		st = host->config_get_bool(cfg, "plugin.cpu", "keep_widened", &keep_widened);
		if (st && st != KILN_ENOTFOUND)
			return st;
	}
	struct cpu_kernel_keys kk;
	if ((st = cpu_kernel_keys(host, cfg, deterministic, &kk)))
		return st;
	if (threads < 0)
		return host->error(KILN_EINVAL, "cpu: threads = %lld is negative", (long long)threads);
	/* the adaptive team, with threads unset: kiln's own loops give the same
	 * bytes for any team, and oneDNN's plans change team only where they
	 * do too (dnnteam.c); a team the user set stays */
	int adapt = 1;
	if (cfg) {
		st = host->config_get_bool(cfg, "plugin.cpu", "adaptive", &adapt);
		if (st && st != KILN_ENOTFOUND)
			return st;
	}
	adapt = adapt && threads == 0;
	/* the tests' hook: both teams swap between the opening size and 1
	 * every N ops, so that a test sees the team change (threads.h) */
	const char *flip = getenv("KILN_CPU_TEAM_FLIP");
	char stat[4200] = ""; /* the quota's cgroup's cpu.stat, if any */
	if (threads == 0) {
		/* the CPUs this process may run on (kiln launch and mpirun pin
		 * ranks; taskset, cpusets), else the machine's, within the
		 * cgroup's CPU quota (containers, systemd's CPUQuota) */
		cpu_set_t set;
		long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
								     : sysconf(_SC_NPROCESSORS_ONLN);
		threads = cpu_threads_for(n > 0 ? (int)n : 1, cpu_quota_read(stat, sizeof stat));
	}
	/* the team's threads tried here, where a failure is an error naming
	 * the limit, before libgomp makes them (cpu_exec) and exits on one */
	if ((st = open_team_check(host, (int)threads)))
		return st;

	struct cpu_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "cpu: out of memory for the device context");
	c->host = host;
	cpu_async_put(c, async > 0); /* -1: no config */
	c->async_auto = async_rule;
	c->beside = cpu_async_get(c) && opts->version >= 3 && opts->peers > 1;
	c->spin_ns = c->beside ? (int64_t)spin_us * 1000 : 0;
	c->stage = opts->version >= 4 && opts->stage;
	c->backoff.off = !backoff;
	c->graph = graph;
	c->keep_weights = keep_weights;
	c->bf16_conv = kk.kern[0];
	c->bf16_gemm = kk.kern[1];
	c->conv_impl = kk.conv_impl;
	c->gemm_impl = kk.gemm_impl;
	c->conv_algo = kk.conv_algo;
	c->threads = (int)threads;
	c->threads_set = opts->threads > 0;
	c->deterministic = deterministic;
	c->lock = &cpu_sync.lock;
	c->cond = &cpu_sync.cond;
	pthread_mutex_init(&c->switch_lock, NULL);
	cpu_wshare_init(&c->wshare, host);
	if ((st = cpu_pin_open(host, cfg, ordinal, cpu_async_get(c) && opts->version >= 3 ? opts->peers : 1,
				 c->threads, &c->pin)) ||
	    (st = cpu_tune_cache_config(c, cfg)) || (st = cpu_engine_create(c))) {
		cpu_wshare_destroy(&c->wshare);
		pthread_mutex_destroy(&c->switch_lock);
		free(c);
		return st;
	}
	cpu_tune_cache_load(c);
	cpu_openblas_said(host);
	/* (no omp_set_num_threads here: the count is set where kiln's work
	 * runs, cpu_prepare and cpu_exec, and the caller's is left as it is;
	 * cpu.h, cpu_omp_enter) */
	c->wc = keep_widened ? cpu_wc_open() : NULL;
	/* a pipeline stage's team is its share of [run] threads (set by the
	 * core, pipe_devices.c, whether the user set threads or not): not
	 * watched for the hint, which would name a key the user did not set */
	const int stage = opts->version >= 3 && opts->peers > 1;
	cpu_team_live_init(&c->team, c->threads, adapt, !stage, flip ? atoi(flip) : 0, stat);
	char isa[160];
	host->log(KILN_LOG_DEBUG, "cpu", "opened ordinal %d: %s; %d threads%s, %s streams%s", ordinal,
		  cpu_dnn_isa(isa, sizeof isa), c->threads, c->team.adapt ? " (adaptive)" : "",
		  cpu_async_get(c) ? "async" : "sync",
		  c->stage ? "; a pipeline stage" : opts->version >= 3 && opts->peers > 1 ? "; the run's own device, beside its stages" : "");
	*out = c;
	return KILN_OK;
}

static void cpu_plan_free(void *ctx, void *plan);

static void cpu_close(void *ctx)
{
	struct cpu_ctx *c = ctx;
	if (!c)
		return;
	/* Streams first: their workers may still be running plans. */
	cpu_streams_destroy_all(c);
	cpu_split_destroy(c); /* the helpers, before the plans they run */
	while (c->plans)
		cpu_plan_free(c, c->plans);
	cpu_tune_cache_save(c);
	cpu_tune_free(c);
	cpu_variants_forget(c);
	cpu_wc_close(c->wc, c->host);
	/* the shared kept weights (the INT8 ones' reorders and memories)
	 * before their engine, as the plans' (review of session 39) */
	cpu_wshare_destroy(&c->wshare);
	cpu_engine_destroy(c);
	cpu_team_live_destroy(&c->team);
	pthread_mutex_destroy(&c->switch_lock);
	free(c);
}

/* ---- memory ----------------------------------------------------------- */

static kiln_status cpu_alloc(void *ctx, size_t bytes, void **ptr)
{
	struct cpu_ctx *c = ctx;
	/* Round up so vector loops over the last block stay inside it.
	 * From 2 MiB up on transparent huge pages (hugepage.c). */
	size_t n = bytes ? (bytes + CPU_ALIGN - 1) & ~(size_t)(CPU_ALIGN - 1) : CPU_ALIGN;
	kiln_status st;
	*ptr = NULL;
	if (c->graph && (st = cpu_capture_check_sync(c, NULL, NULL, "alloc")))
		return st;
	if (n < bytes || !(*ptr = cpu_huge_alloc(CPU_ALIGN, n))) {
		*ptr = NULL;
		return c->host->error(KILN_ENOMEM, "cpu: alloc of %zu bytes failed", bytes);
	}
	/* Commit the pages now, as a GPU allocation is committed: the memory
	 * a plan holds is resident from the start (what `kiln memory`
	 * predicts is what the operating system sees), and the first step
	 * takes no page faults.  Allocation is setup work, never in a step.
	 * A large one by the team, its page faults taken on every core. */
	const size_t part = (size_t)4 << 20;
	char team_msg[1536]; /* (a team that cannot start: one thread commits) */
	if (n < 2 * part || c->threads < 2 ||
	    cpu_team_start(c->threads, "the thread allocating", team_msg, sizeof team_msg)) {
		memset(*ptr, 0, n);
		return KILN_OK;
	}
	const int64_t parts = (int64_t)((n + part - 1) / part);
#pragma omp parallel for num_threads(c->threads) schedule(static)
	for (int64_t k = 0; k < parts; k++) {
		const size_t at = (size_t)k * part;
		memset((char *)*ptr + at, 0, n - at < part ? n - at : part);
	}
	return KILN_OK;
}

static void cpu_free(void *ctx, void *ptr)
{
	struct cpu_ctx *c = ctx;
	cpu_split_quiesce(c); /* a late helper may still read it */
	cpu_wc_wrote_any(1);
	cpu_wshare_freed(&c->wshare, ptr);
	cpu_huge_free(ptr);
}

/* ---- prepare / run ---------------------------------------------------- */

/* Which prepare takes each op type, and how it meets bf16/f16 tensors
 * (`native`): 0 = the f32 kernel between conversions (lowp.c); 1 = the
 * family's own bf16 kernel; 2 = dtype-generic by contract, or a low-
 * precision copy output; 3 = dtype-generic moves of any element size.
 * Sized by its rows and tied to the op count: an op appended to kiln/ops.h
 * without a row here does not compile. */
typedef kiln_status (*cpu_family_fn)(struct cpu_ctx *, struct cpu_plan *);

static const struct {
	cpu_family_fn prepare;
	int native;
} cpu_families[] = {
	[KILN_OP_GEMM] = { cpu_gemm_prepare, 1 },
	[KILN_OP_CONV] = { cpu_conv_prepare, 1 },
	[KILN_OP_CONV_BWD_DATA] = { cpu_conv_prepare, 1 },
	[KILN_OP_CONV_BWD_WEIGHTS] = { cpu_conv_prepare, 1 },
	[KILN_OP_BN_TRAIN] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_INFER] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_BWD] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_STATS] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_APPLY] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_BWD_REDUCE] = { cpu_bn_prepare, 0 },
	[KILN_OP_BN_BWD_APPLY] = { cpu_bn_prepare, 0 },
	[KILN_OP_POOL] = { cpu_pool_prepare, 1 },
	[KILN_OP_POOL_BWD] = { cpu_pool_prepare, 1 },
	[KILN_OP_ACT] = { cpu_act_prepare, 0 },
	[KILN_OP_ACT_BWD] = { cpu_act_prepare, 0 },
	[KILN_OP_DROPOUT] = { cpu_dropout_prepare, 1 },
	[KILN_OP_DROPOUT_BWD] = { cpu_dropout_prepare, 1 },
	[KILN_OP_CONCAT] = { cpu_layout_prepare, 3 },
	[KILN_OP_SPLIT] = { cpu_layout_prepare, 3 },
	[KILN_OP_REORDER] = { cpu_layout_prepare, 3 },
	[KILN_OP_RELU] = { cpu_ops_prepare, 1 },
	[KILN_OP_RELU_BWD] = { cpu_ops_prepare, 1 },
	[KILN_OP_BIAS_GRAD] = { cpu_ops_prepare, 1 },
	[KILN_OP_BIAS_ADD] = { cpu_ops_prepare, 1 },
	[KILN_OP_SCALE] = { cpu_ops_prepare, 2 },
	[KILN_OP_ADD] = { cpu_ops_prepare, 2 },
	[KILN_OP_MUL] = { cpu_ops_prepare, 2 },
	[KILN_OP_FILL] = { cpu_ops_prepare, 2 },
	[KILN_OP_CAST] = { cpu_ops_prepare, 2 },
	[KILN_OP_SGD] = { cpu_optim_prepare, 2 },
	[KILN_OP_ADAMW] = { cpu_optim_prepare, 2 },
	[KILN_OP_LAMB] = { cpu_optim_prepare, 2 },
	[KILN_OP_SOFTMAX_XENT] = { cpu_ops_prepare, 0 },
	[KILN_OP_REDUCE_SUM] = { cpu_ops_prepare, 0 },
	[KILN_OP_NORMALIZE_U8] = { cpu_ops_prepare, 0 },
	[KILN_OP_COUNTER_ADD] = { cpu_ops_prepare, 0 },
	[KILN_OP_LR_SCHEDULE] = { cpu_ops_prepare, 0 },
	[KILN_OP_GRAD_CLIP] = { cpu_ops_prepare, 0 },
	[KILN_OP_UNSCALE] = { cpu_ops_prepare, 0 },
	[KILN_OP_SCALER_UPDATE] = { cpu_ops_prepare, 0 },
	[KILN_OP_EMBEDDING] = { cpu_embedding_prepare, 0 },
	[KILN_OP_EMBEDDING_BWD] = { cpu_embedding_prepare, 0 },
	[KILN_OP_LAYERNORM] = { cpu_layernorm_prepare, 0 },
	[KILN_OP_LAYERNORM_BWD] = { cpu_layernorm_prepare, 0 },
	[KILN_OP_ATTENTION] = { cpu_attn_prepare, 0 },
	[KILN_OP_ATTENTION_BWD] = { cpu_attn_prepare, 0 },
	[KILN_OP_ATTENTION_DECODE] = { cpu_attn_prepare, 0 },
	[KILN_OP_RNN] = { cpu_rnn_prepare, 0 },
	[KILN_OP_RNN_BWD] = { cpu_rnn_prepare, 0 },
	[KILN_OP_QCONV] = { cpu_qconv_prepare, 1 },
	[KILN_OP_QLINEAR] = { cpu_qconv_prepare, 1 },
	[KILN_OP_ATTENTION_DECODE_RUN] = { cpu_attn_prepare, 0 },
	[KILN_OP_GRAD_SUMSQ] = { cpu_ops_prepare, 0 },
};
_Static_assert(sizeof cpu_families / sizeof cpu_families[0] == KILN_OP_TYPE_COUNT,
	       "every op of kiln/ops.h needs a row in cpu_families");

/* cpu_prepare's cpu_team_start, its message's buffer in a frame of its own */
static __attribute__((noinline)) kiln_status prepare_team_start(struct cpu_ctx *c)
{
	char msg[1536];
	if (cpu_team_start(c->threads, NULL, msg, sizeof msg))
		return c->host->error(KILN_EDEVICE, "%s", msg);
	return KILN_OK;
}

static kiln_status cpu_prepare_team(struct cpu_ctx *c, const struct kiln_op *op, void **plan,
				    size_t *workspace)
{
	kiln_status st;
	*plan = NULL;
	if (workspace)
		*workspace = 0;
	if (op->type <= 0 || op->type >= KILN_OP_TYPE_COUNT || !cpu_families[op->type].prepare)
		return c->host->error(KILN_ENOTSUP, "cpu: op type %d has no prepare here", op->type);
	const cpu_family_fn family = cpu_families[op->type].prepare;
	const int native = cpu_families[op->type].native;
	/* the thread's team before a prepare's reorders and timings open
	 * regions (teamstart.h) */
	if ((st = prepare_team_start(c)))
		return st;
	/* oneDNN makes its primitives for the calling thread's count: the
	 * opening team's, whatever the adaptive team is now, or one for a
	 * small op on any team (dnnteam.c) */
	const int team = cpu_op_one_thread(op) ? 1 : c->threads;
	if (omp_get_max_threads() != team)
		omp_set_num_threads(team);
	struct cpu_plan *p = calloc(1, sizeof *p);
	if (!p)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan",
				      cpu_op_name(op->type));
	p->op = *op;
	/* bf16/f16 tensors: the family's own kernel where it has one (oneDNN's
	 * bf16 GEMM and convolution, the bf16 loops), else the f32 kernel
	 * between conversions (lowp.c); f16 is always the latter, except the
	 * ops that are dtype-generic by contract */
	if (family == cpu_conv_prepare && !cpu_op_lowp(op)) {
		/* f32 convolutions: by FFT ([plugin.cpu] conv_algo), else
		 * oneDNN's first kernel, or the fastest ([plugin.cpu] conv_impl) */
		st = cpu_tune_conv_algo(c, p);
	} else if (family == cpu_gemm_prepare && !cpu_op_lowp(op)) {
		/* f32 GEMMs: oneDNN, or OpenBLAS where it is faster
		 * ([plugin.cpu] gemm_impl) */
		st = cpu_tune_gemm_impl(c, p);
	} else if (!cpu_op_lowp(op) || native == 2) {
		st = family(c, p);
	} else if (family == cpu_gemm_prepare || family == cpu_conv_prepare) {
		/* bf16 (or f16) GEMM and convolution: oneDNN's bf16 kernel or
		 * its f32 one on the widened tensors, by setting or by timing */
		st = cpu_tune_prepare(c, p, family);
	} else {
		st = KILN_ENOTSUP;
		/* 3: dtype-generic moves of any element size, f16 too */
		if ((native && !cpu_op_has(op, KILN_F16)) || native == 3)
			st = family(c, p);
		if (st == KILN_ENOTSUP) {
			cpu_plan_release(p);
			memset(p, 0, sizeof *p);
			p->op = *op;
			st = cpu_lowp_prepare(c, p, family);
		}
	}
	if (!st)
		st = cpu_variants_attach(c, p);
	if (st) {
		cpu_plan_release(p);
		free(p);
		return st;
	}
	pthread_mutex_lock(c->lock);
	COMMON_LIST_PUSH(c->plans, p);
	pthread_mutex_unlock(c->lock);
	if (workspace)
		*workspace = p->workspace;
	*plan = p;
	return KILN_OK;
}

/* The ops table's prepare: the op's plan made with kiln's thread count on
 * the calling thread, whose own count is then put back (cpu.h,
 * cpu_omp_enter). */
static kiln_status cpu_prepare(void *ctx, const struct kiln_op *op, void **plan,
			       size_t *workspace)
{
	const int caller = cpu_omp_enter();
	const kiln_status st = cpu_prepare_team(ctx, op, plan, workspace);
	cpu_omp_leave(caller);
	return st;
}

static kiln_status cpu_run(void *ctx, void *plan, const struct kiln_op_args *args,
			   void *stream)
{
	struct cpu_ctx *c = ctx;
	const struct cpu_plan *p = plan;
	COMMON_RUN_CHECK(c->host, "cpu", p, args, stream);
	cpu_tune_summary(c);
	/* a sync stream runs the kernel here, on the caller's thread */
	const int caller = cpu_omp_enter();
	const kiln_status st = cpu_stream_run(c, stream, p, args);
	cpu_omp_leave(caller);
	return st;
}

static void cpu_plan_free(void *ctx, void *plan)
{
	struct cpu_ctx *c = ctx;
	struct cpu_plan *p = plan;
	if (!p)
		return;
	pthread_mutex_lock(c->lock);
	cpu_plan_wait_idle(c, p);
	COMMON_LIST_UNLINK(c->plans, p);
	pthread_mutex_unlock(c->lock);
	cpu_split_quiesce(c);
	cpu_plan_release(p);
	free(p);
}

/* Max pooling keeps oneDNN's workspace (where each maximum was) from the
 * forward to the backward; every other plan leaves nothing. */
static size_t cpu_aux_bytes(void *ctx, void *plan)
{
	(void)ctx;
	return plan ? ((const struct cpu_plan *)plan)->aux : 0;
}

static kiln_status cpu_host_alloc(void *ctx, size_t bytes, void **ptr)
{
	return cpu_alloc(ctx, bytes, ptr);
}

static void cpu_host_free(void *ctx, void *ptr)
{
	cpu_free(ctx, ptr);
}

/* The first number in file `dir`/`name` into *v; 0 when it has none
 * ("max": no limit). */
static int read_ull(const char *dir, const char *name, unsigned long long *v)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "r");
	const int ok = f && fscanf(f, "%llu", v) == 1;
	if (f)
		fclose(f);
	return ok;
}

/* The room the memory cgroups leave this process: the least of limit
 * minus usage over its cgroup and every cgroup above it (a parent's limit
 * binds too), v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes,
 * memory.usage_in_bytes under /sys/fs/cgroup/memory); ULLONG_MAX where
 * none limits it or /proc/self/cgroup cannot be read.  A cgroup's limit
 * counts the page cache and every other process in it, and the kernel
 * kills past it without swapping: MemAvailable alone planned batch = auto
 * 54704 in a 400M cgroup and kiln train was OOM-killed (session 31). */
static unsigned long long cgroup_room(void)
{
	/* on the heap: 16 KiB of an application thread's stack (the frame
	 * cap, docs/design-notes.md) */
	struct { char text[8192], path[4096], dir[4200]; } *b = malloc(sizeof *b);
	if (!b)
		return ULLONG_MAX; /* as without /proc/self/cgroup */
	char *const text = b->text, *const path = b->path, *const dir = b->dir;
	unsigned long long room = ULLONG_MAX, lim, use;
	const char *maxf = NULL, *usef = NULL;
	dir[0] = 0;
	FILE *f = fopen("/proc/self/cgroup", "re");
	const size_t got = f ? fread(text, 1, sizeof b->text - 1, f) : 0;
	if (f)
		fclose(f);
	text[got] = 0;
	/* the lines parsed as for the CPU quota (threads.c); hybrid
	 * hierarchies have both: v1's memory controller, where there is one,
	 * is the one that limits */
	if (!cpu_cgroup_path(text, "memory", path, sizeof b->path)) {
		snprintf(dir, sizeof b->dir, "/sys/fs/cgroup/memory%s", path);
		maxf = "memory.limit_in_bytes", usef = "memory.usage_in_bytes";
	} else if (!cpu_cgroup_path(text, NULL, path, sizeof b->path)) { /* v2: 0::/path */
		snprintf(dir, sizeof b->dir, "/sys/fs/cgroup%s", path);
		maxf = "memory.max", usef = "memory.current";
	}
	while (maxf && *dir) {
		if (read_ull(dir, maxf, &lim) && read_ull(dir, usef, &use)) {
			const unsigned long long r = lim > use ? lim - use : 0;
			room = r < room ? r : room;
		}
		char *slash = strrchr(dir, '/');
		if (!slash || slash - dir <= (ptrdiff_t)strlen("/sys/fs/cgroup"))
			break;
		*slash = 0;
	}
	free(b);
	return room;
}

unsigned long long cpu_as_room(void)
{
	struct rlimit rl;
	unsigned long long pages = 0;
	if (getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY)
		return ULLONG_MAX;
	FILE *f = fopen("/proc/self/statm", "r");
	if (!f || fscanf(f, "%llu", &pages) != 1)
		pages = 0;
	if (f)
		fclose(f);
	const unsigned long long used = pages * (unsigned long long)sysconf(_SC_PAGESIZE);
	return rl.rlim_cur > used ? rl.rlim_cur - used : 0;
}

/* The device's memory is the host's: MemAvailable and MemTotal of
 * /proc/meminfo (what the kernel can hand out without swapping), or the
 * free and physical pages where there is no such file; free is at most
 * what the memory cgroups and RLIMIT_AS leave (cgroup_room, cpu_as_room). */
static kiln_status cpu_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
	unsigned long long avail = 0, total = 0, v;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "r");
	(void)ctx;
	while (f && fgets(line, sizeof line, f)) {
		if (sscanf(line, "MemAvailable: %llu kB", &v) == 1)
			avail = v * 1024;
		else if (sscanf(line, "MemTotal: %llu kB", &v) == 1)
			total = v * 1024;
	}
	if (f)
		fclose(f);
	if (!avail || !total) {
		long page = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES),
		     ph = sysconf(_SC_PHYS_PAGES);
		if (page <= 0 || av <= 0 || ph <= 0)
			return cpu_host->error(KILN_EIO, "cpu: cannot read the free memory (/proc/meminfo, sysconf)");
		avail = (unsigned long long)av * (unsigned long long)page;
		total = (unsigned long long)ph * (unsigned long long)page;
	}
	const unsigned long long cg = cgroup_room(), as = cpu_as_room();
	avail = cg < avail ? cg : avail;
	avail = as < avail ? as : avail;
	*free_bytes = (size_t)avail;
	*total_bytes = (size_t)total;
	return KILN_OK;
}

/* ---- descriptor ------------------------------------------------------- */

/* KILN_PROC_DESCRIBE: what oneDNN runs on here (the ISA, how bf16 is done). */
static const char *cpu_describe(void)
{
	static char buf[160];
	return cpu_dnn_isa(buf, sizeof buf);
}

/* KILN_PROC_WEIGHTS_CHANGED (ABI 2.15): every frozen op's kept weights
 * (wshare.c) are made again on their next run. */
static void cpu_weights_changed(void *ctx)
{
	struct cpu_ctx *c = ctx;
	cpu_wshare_written(&c->wshare, NULL, 0);
}

/* KILN_PROC_WEIGHTS_WRITTEN: those made from [ptr, ptr + bytes) alone
 * (a model's: another model's stay). */
static void cpu_weights_written(void *ctx, const void *ptr, size_t bytes)
{
	struct cpu_ctx *c = ctx;
	cpu_wshare_written(&c->wshare, ptr, bytes);
}

/* KILN_PROC_STREAMS_ASYNC: whether the streams have worker threads now */
static int cpu_streams_async(void *ctx)
{
	return cpu_async_get(ctx);
}

static void *cpu_get_proc_address(void *ctx, const char *name)
{
	(void)ctx;
	if (!strcmp(name, KILN_PROC_DESCRIBE))
		return (void *)cpu_describe;
	if (!strcmp(name, KILN_PROC_HOST_FN))
		return (void *)cpu_host_fn;
	if (!strcmp(name, KILN_PROC_HOST_FN_SKIP))
		return (void *)cpu_host_fn_skip;
	if (!strcmp(name, KILN_PROC_WORKLOAD))
		return (void *)cpu_workload;
	if (!strcmp(name, KILN_PROC_STREAMS_ASYNC))
		return (void *)cpu_streams_async;
	if (!strcmp(name, KILN_PROC_WEIGHTS_CHANGED))
		return (void *)cpu_weights_changed;
	if (!strcmp(name, KILN_PROC_WEIGHTS_WRITTEN))
		return (void *)cpu_weights_written;
	if (!strcmp(name, KILN_PROC_STREAM_SIDE))
		return (void *)cpu_stream_side;
	if (!strcmp(name, KILN_PROC_RUN_WAIT))
		return (void *)cpu_run_wait;
	return NULL;
}

static const struct kiln_device_ops cpu_ops = {
	/* cpu_open .. cpu_graph_free; host_alloc is alloc (no pinning here) */
	COMMON_DEVICE_OPS(cpu),
	/* host memory: host communicators take its buffers in place; auto
	 * prefers any accelerator (a higher score) to it */
	.traits = { .type = KILN_DEVICE_CPU, .auto_score = 10, .caps = KILN_DEVICE_HOST_MEMORY | KILN_DEVICE_PREFER_NHWC,
		    .comm = NULL },
	.aux_bytes = cpu_aux_bytes,
};

static const struct kiln_key cpu_keys[] = {
	{ "bf16_conv", KILN_KEY_ENUM, "auto", 0, 0, "auto|bf16|f32",
	  "Convolutions (forward, backward data, backward weights) of bf16 tensors: `bf16` "
	  "runs oneDNN's bf16 kernels (bf16 src, weights and dst, f32 accumulation); `f32` "
	  "runs its f32 kernels on the same bf16 tensors, converted by the layout reorders "
	  "around the kernel (the inputs are the same bf16 values, only the products are "
	  "exact in f32); `auto` times both once per shape when the op is prepared and "
	  "keeps the faster (logged), except where `conv_algo` (`rule` or `fft`) gives "
	  "the op widened to f32 the FFT at 16x16 on AVX-512 (fft16.c): it then runs by "
	  "FFT, its bf16 tensors read and written by the FFT's blocks (NCHW) or widened "
	  "into copies (NHWC), the f32 op's bits rounded once (the CNN's conv2: ~13% more "
	  "bf16 samples/s, then ~12% more reading bf16 itself, session 23); and a forward or "
	  "weight gradient of 1-4 input channels (NCHW) on AVX-512 runs by kiln's direct "
	  "kernel for a first layer (plugins/cpu/convthin.c: AVX512_BF16's dot products where "
	  "the CPU has them, f32 arithmetic on the widened values elsewhere; the CNN's conv1: "
	  "1.4x and 1.8x oneDNN's bf16 kernels, session 24), no timing.  "
	  "`[run] deterministic = 1` keeps these two rules and turns the rest of `auto` into "
	  "`bf16`, so that the kernel does not depend on a timing." },
	{ "bf16_gemm", KILN_KEY_ENUM, "auto", 0, 0, "auto|bf16|f32|bf16-2",
	  "GEMMs (linear layers) of bf16 tensors: `bf16` runs oneDNN's bf16 matmul (f32 "
	  "accumulation; the implementation oneDNN lists first, brgemm on AVX-512); "
	  "`bf16-2` the second one it lists for the shape (gemm:jit here; the first where "
	  "there is no second); `f32` widens the bf16 operands to f32 in the workspace, runs the "
	  "f32 matmul and rounds a bf16 result once; `auto` times the three once per shape when "
	  "the op is prepared and keeps the fastest (logged), the two bf16 ones alone where "
	  "oneDNN has bf16 dot products (avx512_core_bf16, AMX: there the f32 one took 2-3x "
	  "their time on every GEMM of the CNN and MLP examples, session 24). "
	  "`[run] deterministic = 1` turns `auto` into `bf16`." },
	{ "conv_impl", KILN_KEY_ENUM, NULL, 0, 0, "first|auto|1|2",
	  "Which of oneDNN's implementations runs an f32 forward convolution that keeps "
	  "no copies of its operands (evaluation and inference; in training, NHWC "
	  "convolutions too): `first` the one oneDNN lists first "
	  "(its own preference), `auto` the fastest of the first 3 distinct ones, timed once "
	  "per shape when the op is prepared (logged); `1`, `2` the second or third distinct "
	  "one (the first where there is none; for tests).  On AVX-512 oneDNN 2.6 prefers its "
	  "brgconv kernels, which its older jit kernel beats on few channels (the ResNet "
	  "example's 28x28 layers; docs/PERFORMANCE.md, issue 23, session 9).  Unset: "
	  "`auto` in the inference API's plans (kiln_infer, `kiln predict`), `first` "
	  "elsewhere.  The result then depends on that timing (the implementations round "
	  "differently: logits differ in the last bits where a busy machine's timing picks "
	  "another); `[run] deterministic = 1` turns `auto` into `first`." },
	{ "gemm_impl", KILN_KEY_ENUM, "rule", 0, 0, "rule|auto|onednn|openblas",
	  "Which library runs an f32 GEMM without bias or fused activation (a linear "
	  "layer's data and weight gradients) on one thread (a team of one, a small op, or "
	  "each part of a split GEMM; oneDNN threads the others): `onednn` oneDNN's; "
	  "`openblas` OpenBLAS's cblas_sgemm (an error where the plugin was built without "
	  "OpenBLAS, the libopenblas.so.0 loaded is its pthread build, or `ulimit -v` leaves "
	  "less than it maps as it loads: docs/memory.md); `rule` OpenBLAS "
	  "for the shapes where oneDNN 2.6's AVX2 sgemm runs at half its rate (no "
	  "transposes, 32-256 rows, K and N 128 or more, below AVX-512), oneDNN elsewhere: "
	  "a fixed rule, so the result does not depend on a timing; `auto` times both once "
	  "per shape when the op is prepared and keeps OpenBLAS where it takes at most 90% "
	  "of oneDNN's time (logged; the result then depends on that timing, as "
	  "`bf16_gemm = auto`'s does).  Without a usable OpenBLAS every setting but "
	  "`openblas` is `onednn` (docs/PERFORMANCE.md, session 16).  `[run] "
	  "deterministic = 1` turns `auto` into `rule`." },
	{ "conv_algo", KILN_KEY_ENUM, "rule", 0, 0, "rule|auto|direct|fft|winograd",
	  "How an f32 convolution (forward, data and weight gradients) is computed, and a "
	  "bf16 or f16 one that runs as the f32 op on widened copies (f16 always; bf16 below "
	  "AVX-512, where oneDNN 2.6 has no bf16 convolution, and on AVX-512 where `rule` "
	  "or `fft` gives the widened op the FFT at 16x16 with `bf16_conv = auto`: its "
	  "result is the f32 one rounded): "
	  "`direct` by oneDNN's direct kernels; `fft` by FFT where it can (stride 1, "
	  "dilation 1, one group, no residual epilogue; fused ReLU only): each plane "
	  "transformed by FFTW (at 16x16 on AVX-512, 16 planes at once by kiln's "
	  "plugins/cpu/fft16.c: ~6x FFTW's speed), the channels summed by one real GEMM per frequency, "
	  "transformed back (plugins/cpu/fftconv.c; an error where the plugin was built "
	  "without FFTW), oneDNN elsewhere; `rule` the FFT for kernels of 5x5 or more "
	  "on inputs of at most 32x32 padded, with 16 or more input and output channels, "
	  "on every ISA (the CNN example's conv2: each pass 1.4-1.6x faster than oneDNN "
	  "2.6's AVX2 kernels in NCHW, session 17; its three passes 19 against 31 ms a "
	  "step on AVX-512, session 21: docs/PERFORMANCE.md), oneDNN elsewhere: "
	  "a fixed rule, so "
	  "the result does not depend on a timing; `auto` times both once per shape when "
	  "the op is prepared and keeps the FFT where it takes at most 90% of oneDNN's "
	  "time (logged).  Under `rule` and `fft` the FFT keeps x's spectrum from the "
	  "forward for the weight gradient and dy's from that for the data gradient "
	  "(under `auto` none).  It differs from the direct result by rounding (about 1e-6 "
	  "of the output's scale: of the largest outputs of a plane, so an output much "
	  "smaller than its plane's largest loses relative precision (2.4% for "
	  "outputs of rms 0.07 in a plane whose input holds one value of 2e5); `direct` keeps each output's own "
	  "precision).  Without FFTW no setting takes the FFT (`fft` is an error).  "
	  "`[run] deterministic = 1` turns `auto` into `rule`.  The direct kernel, on a CPU "
	  "with AVX-512 (F, BW, VL), of a forward or weight gradient of 1-4 input channels "
	  "(NCHW; NHWC with one channel), stride 1, a kernel up to 7x7 (the weight gradient: "
	  "25 taps a channel) is kiln's own for a first layer, not oneDNN's "
	  "(plugins/cpu/convthin.c; the CNN's conv1: ~1.2x oneDNN's NHWC kernels, session 24; "
	  "no kept copies): `rule` and `direct` run it, `auto` times it against the FFT.  "
	  "`winograd`: a forward (bias, fused ReLU, residual epilogue) or data gradient of "
	  "f32 NHWC tensors with a 3x3 kernel, stride 1, padding 0-2, input and output "
	  "channels multiples of 16, their product at most 256 x 256, on a CPU with AVX-512 "
	  "(F, BW, VL), runs by Winograd's F(4x4, 3x3) (plugins/cpu/wino.c: 36 multiplies a "
	  "4x4 block of outputs and channel pair instead of 144; a layer's weight gradient "
	  "stays oneDNN's), everything else as `rule` (the "
	  "ResNet example's training: ~1.12x the samples/s of `rule`, session 25); `rule` and "
	  "`auto` run it in inference plans (`kiln predict`, kiln/infer.h: frozen weights, "
	  "whose transform is kept as `keep_weights` says), not in training or evaluation "
	  "plans.  It "
	  "differs from the direct result by rounding (up to ~2.5e-5 of the output's "
	  "rms, oneDNN's ~5e-6: the transforms' constants); the ResNet example's inference: "
	  "its 3x3 convolutions 1.3-1.8x oneDNN's, 1.4x the logits a second, session 25 "
	  "(docs/PERFORMANCE.md)." },
	{ "tune_cache", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "The file that keeps the kernel choices `auto` timed (`bf16_conv`, `bf16_gemm`, "
	  "`conv_impl`, `gemm_impl`, `conv_algo`) between runs, keyed by the op's shapes, dtypes, layouts and "
	  "attributes and the team's size, so a second run prepares only the chosen "
	  "kernel (a bf16 CNN's set-up: 1.2 -> 0.2 CPU-s; docs/PERFORMANCE.md, session "
	  "12).  A file written by another kiln version, plugin build, oneDNN version or "
	  "ISA, or CPU model is stale (an info line; timed again and rewritten); a damaged "
	  "one (short, bad checksum) is named in a warning and likewise rebuilt; it is "
	  "written atomically, so ranks sharing it are safe.  Unset: "
	  "`$XDG_CACHE_HOME/kiln/cpu_tune-HASH.bin`, else `~/.cache/kiln/cpu_tune-HASH.bin`, "
	  "HASH that of the kiln version, plugin build, oneDNN version and ISA and CPU "
	  "model, so each build keeps its own file; "
	  "`none`: nothing is read or written (docs/precision.md, \"Which kernel\")." },
	{ "async", KILN_KEY_BOOL, "auto", 0, 0, "auto",
	  "Run each stream on its own worker thread with real events, so ordering bugs "
	  "and hidden host syncs show up without a GPU, and a data-parallel run's "
	  "allreduce overlaps the backward.  `auto`: off for one process (nothing to "
	  "overlap); on the stage devices of `[run] devices` (the pipeline's stages "
	  "overlap; docs/pipeline.md); on a rank of a run with several ranks, once "
	  "`kiln train` has planned the step, on where the gradients are at least 4 MiB "
	  "and a rank's forward at least 256 MFLOP a step, or where the machine is busy "
	  "now (the thread that runs the rank's steps, spinning 40 ms at the plan, "
	  "waited over a quarter of the time for a CPU; not the load average, which "
	  "remembers the last minute's runs), off otherwise: a short step's "
	  "hand-offs to the workers cost more than the allreduce they hide (bench/'s "
	  "MLP, -10% quietly; docs/distributed.md item 6, docs/PERFORMANCE.md "
	  "\"Session 13: async auto rule\").  A rank the rule made sync then watches "
	  "the wait for a CPU of the thread that runs its steps and turns async for "
	  "the rest of the run once it waited over a quarter of the time for half a "
	  "second (a neighbour that started after the plan; \"Session 13: async "
	  "follows contention\").  The choice and a switch are logged at info level.  "
	  "With the streams async at open (`1`, or `auto`'s choice then) and "
	  "`[data] workers` > 0, the data loader's workers fill every batch: the "
	  "training thread only enqueues, so it fills none itself (with `workers = 0` "
	  "it reads every batch, as ever; docs/data.md; session 48)." },
	{ "adaptive", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "With `[run] threads = 0`: shrink the OpenMP team while its threads wait for a "
	  "CPU (another process busy on the same cores): by a thread in a 100 ms interval "
	  "in which 0.3 threads or more waited on average while other processes took half "
	  "a CPU or more of this process's CPUs (/proc/stat), the first interval included; "
	  "on the waiting alone only after two such intervals in a row and never on the "
	  "first (the start-up's own threads compete then); probing back "
	  "when the machine is calm, or after a step down for other processes, unless a "
	  "probe failed since or the last one had held under 10 intervals, as soon as they "
	  "read below half the crowded threshold (a quarter CPU up to 7 CPUs, more on "
	  "larger masks) for two intervals (docs/PERFORMANCE.md, "
	  "\"Steady under contention\").  Results do not "
	  "depend on it: kiln's own loops sum in a fixed order for any team, and a oneDNN "
	  "kernel moves to the smaller team only after a probe showed it gives the same "
	  "bytes there.  0 keeps the opening team (for measuring)." },
	{ "stage_spin_us", KILN_KEY_INT, "5000", 0, 1000000, NULL,
	  "With `[run] devices` (pipeline stages on CPU instances of their own): how long, "
	  "in microseconds, a stage's stream that waits for another stage's pass (a "
	  "hand-off) watches for it, yielding the core at each turn, before it sleeps. "
	  "It keeps watching only while each turn gets the core straight back (within "
	  "50 us), that is while the stage has a core to itself; once another thread or "
	  "process takes the core it sleeps, as the other stage's wake-up then preempts "
	  "sooner than a yielding watcher gets its turn back.  A sleeper's wake-up costs "
	  "tens to hundreds of microseconds, more on a virtual machine whose idle CPU "
	  "halts, and each micro-batch crosses twice (docs/PERFORMANCE.md, issue 21, "
	  "session 10).  With stage_backoff = 1, after a turn that came back late the "
	  "device's next waits sleep at once: 1 after the first late turn, then 2, 4, ... "
	  "up to 64 after each further one, the doubling starting again from 1 only after "
	  "a spin that saw the pass with every turn back at once (a spin that reaches "
	  "stage_spin_us leaves it as it was).  0: sleep at once; 100: the length of the "
	  "poll before this key." },
	{ "stage_backoff", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "With `[run] devices` and stage_spin_us > 0: after a turn of a stage's spin that "
	  "came back late, that device's next waits sleep at once instead of spinning "
	  "(1, 2, 4, ... up to 64; see stage_spin_us), since session 44: a late turn has "
	  "already cost the waiter the other thread's slice even when the pass is then "
	  "done, where a sleeper is woken with a preemption (docs/pipeline.md).  A wait for "
	  "an event of the run's own device (the step's start, after its optimizer on every "
	  "core), unlike one for a peer stage's whatever its thread count, neither sets nor "
	  "takes those skips (since session 45).  0: every "
	  "wait spins up to stage_spin_us, as before session 44 (for measuring).  Results "
	  "do not depend on it." },
	{ "graph", KILN_KEY_BOOL, "0", 0, 0, NULL,
	  "Capture the training step after a warm-up step and replay it, as [plugin.cuda] "
	  "graph = 1 does on the GPU: here the step's tasks are recorded once and issued "
	  "again, with CUDA stream capture's rules enforced (no host sync, no allocation, "
	  "no event crossing the capture boundary), so the trainer's captured path is "
	  "tested without a GPU.  No speed-up on the CPU." },
	{ "keep_weights", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "A convolution of an inference plan (frozen weights, KILN_OPF_FROZEN: `kiln "
	  "predict`, the C API of kiln/infer.h) whose kernel wants its weights in another "
	  "(blocked) layout keeps the reordered copy and reorders again only "
	  "after the core says its model's weights changed (KILN_PROC_WEIGHTS_WRITTEN; "
	  "another model's load leaves it, since session 41), with "
	  "nothing compared per run: a call reorders each weight once instead of on every "
	  "run of a batch block (docs/inference.md, batch blocking; docs/PERFORMANCE.md, "
	  "\"Session 14: frozen weights\"); a Winograd convolution's transformed weights "
	  "likewise, and an f32 linear layer's weights in its matmul's blocked layout "
	  "(oneDNN's brgemm matmul copies weights given as [out, in] into that layout on every "
	  "run: the MLP example's inference of 1,000 rows, docs/PERFORMANCE.md, \"Session 46: "
	  "the MLP's inference\"), from the second run that reads the same weights on (a call of "
	  "one run keeps no such copy).  An INT8 conv or linear (QCONV, QLINEAR) of an "
	  "inference plan keeps its quantized weights with no compare of the f32 "
	  "weights per run (0: compared every run, as in evaluation plans).  Each copy is "
	  "one per weight tensor (and kernel layout) in the device, shared by the model's "
	  "inference plans of every row count (plugins/cpu/wshare.c; the f32 ones since "
	  "session 40), and freed with the weights' memory.  Training and evaluation plans keep no copy "
	  "(their weights change between runs).  The copy costs the blocked weights once "
	  "more per such convolution or linear layer; 0 reorders on every run into the workspace (for "
	  "measuring and as the tests' reference)." },
	{ "keep_widened", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Where oneDNN has no bf16 GEMM or convolution (below AVX-512: the device line "
	  "says `bf16 none`), bf16/f16 GEMMs and convolutions run oneDNN's f32 kernels on "
	  "widened copies.  A weight of the low-precision compute copy (the one the "
	  "optimizer writes, or with `amsgrad = 1` the cast after it; under `[dist] zero = "
	  "1` the whole copy, though a rank's optimizer writes only its slice and the "
	  "allgather the rest: since session 46 also the weights across a slice's end or in "
	  "another rank's slice) that is read twice "
	  "between two writes (a layer's forward and "
	  "its data gradient) keeps its f32 copy: widened once per optimizer step, not per "
	  "op.  Any write the device sees (an op's outputs, a copy, a host function such as "
	  "a collective, a free) makes the copies it may touch stale, so the results are "
	  "bit for bit those of 0.  Costs 4 bytes per element of each such weight; no "
	  "effect where oneDNN has bf16 kernels.  0: widen on every op (the tests' "
	  "reference; docs/PERFORMANCE.md, \"Session 16: bf16 on AVX2 without widening "
	  "every call\")." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

COMMON_DEVICE_PLUGIN(cpu_host, cpu_plugin, "cpu", &cpu_ops, cpu_keys, NULL,
		     "host CPU: oneDNN GEMM, convolution and pooling, OpenMP kernels, optional async streams")
