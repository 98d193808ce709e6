/* plugins/cpu/tune.c - which kernel computes a bf16 convolution or GEMM,
 * and which implementation an f32 forward convolution.
 *
 * oneDNN has bf16 kernels for both, but whether they beat its f32 kernels
 * depends on the CPU: with AMX tiles they do by far; with AVX512-BF16 dot
 * products alone (oneDNN 2.6 here) they are often slower than the f32
 * kernels even counting the conversions the f32 path needs.  So each bf16
 * GEMM and convolution (forward, backward data, backward weights) has two
 * candidate plans:
 *
 *   bf16  oneDNN's bf16 primitive on the bf16 tensors (f32 accumulation);
 *   f32   oneDNN's f32 primitive on the same values widened to f32:
 *         convolutions convert in the layout reorders that run around the
 *         kernel anyway (conv.c, p->kern_f32); GEMMs widen the operands
 *         into the workspace and round a bf16 result once (lowp.c).
 *
 * and a bf16 GEMM a third:
 *
 *   bf16-2  oneDNN's second bf16 implementation of the matmul (gemm:jit
 *           beside brgemm on AVX-512; gemm.c, p->conv_impl = 1): on Zen 5
 *           at 2 threads it ran fc1's data-gradient GEMM of the bf16 CNN
 *           in 0.97 ms against brgemm's 0.97-1.6 (docs/PERFORMANCE.md,
 *           "Session 14: the bf16 peak and oneDNN's bf16 choices").
 *
 * [plugin.cpu] bf16_conv / bf16_gemm pick one, or `auto` (the default)
 * prepares them all, runs each on scratch buffers of the op's shapes (one
 * warm-up run each, then 5 to 31 interleaved timed runs, the median of
 * each one's wall time, or of its team's CPU time under contention:
 * tune_time.c) and keeps the faster.  This happens once
 * per op in prepare, never in a step; the choice is remembered per op
 * key (tune_key: what the timing depends on, so an accumulating op takes
 * the choice of its writing twin) for the context, so the training and
 * evaluation plans of one shape agree, and is logged.
 *
 * Both candidates compute with the same bf16 input values and f32
 * accumulation, so either is within the op's documented bound
 * (tests/check_device.c checks both); they differ in rounding order only.
 * `[run] deterministic = 1` turns `auto` into CPU_KERN_RULE (cpu.c): the
 * fixed rules below (kiln's first-layer kernel, the FFT at 16x16), else
 * `bf16`, so that a result never depends on a timing.
 *
 * f32 forward convolutions ([plugin.cpu] conv_impl = auto; set by the
 * inference API): oneDNN lists several implementations for one op, and
 * on AVX-512 its first (brgconv) is not always its fastest (its jit
 * kernel runs the ResNet example's 28x28, 16-channel layers in 60-75% of
 * the time).  The first CPU_CONV_IMPLS distinct ones are prepared and
 * timed the same way, the fastest kept (conv.c, p->conv_impl).  Kernels
 * differ in summation order only.
 *
 * Contention (docs/PERFORMANCE.md, "Session 14: tune cache under
 * contention"): CPU time leaves preemption out, not what a busy neighbour
 * does to caches, memory bandwidth and a hyper-thread sibling, and a choice
 * timed on a busy machine was kept (tune_cache.c) for every later run: a
 * bf16 CNN timed at load 17 took the f32 kernel for conv1's forward, 2.40
 * ms against the bf16 kernel's 1.65 on a quieter machine.  So the
 * run-queue wait of the process's threads over the timed runs
 * (cpu_wait_begin_all/end, with the async rule's threshold CPU_WAIT_BUSY;
 * the tests' hook KILN_CPU_TUNEWAIT stands for it) marks a choice timed
 * above it provisional, and so does a timing of a team op on an adaptive
 * team smaller than the context's or changing size (tune_contended: the
 * cache keys a choice by the context's team; "Session 36: the tuner while
 * the team shrinks"; tune_choose: the one rule; the wait read over at least
 * TUNE_WAIT_MIN_S, a small op's timed runs then repeated untimed).  A later context that reads a
 * provisional choice from the cache and finds the machine quiet
 * (cpu_probe_wait, once per context) times that op again, at most
 * CPU_TUNE_RETIMES of them per context so that a set-up stays short; the
 * cache never writes a provisional choice over a confident one.
 */
#include "cpu.h"
#include "dnn.h"
#include "fftconv.h" /* cpu_fftconv_ok, cpu_fftconv_rule, cpu_fftconv_prepare */
#include "convthin.h" /* cpu_convthin_bare_ok, cpu_convthin_prepare */
#include "wino.h"     /* cpu_wino_ok, cpu_wino_prepare */
#include "../common/c_locale.h" /* common_snprintf_c */

#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* memcmp, memcpy, memset */
#include <pthread.h> /* pthread_mutex_lock */

/* provisional choices from the cache one context re-times, at most */
#define CPU_TUNE_RETIMES 8

/* A choice made by timing: the op it was made for, and its outcome. */
struct cpu_choice {
	struct cpu_choice *next;
	struct kiln_op op;
	int kern_f32;  /* a bf16 op's choice, or an f32 CONV's conv_impl */
	int provisional; /* timed under contention (tune_choose) */
	int from_file;   /* read from the tune cache, not timed in this context */
	double wait;     /* the process's threads' run-queue wait while timed, s/s */
};

/* A bf16 op's choice (tune_key's value, kept in the tune cache): */
enum { TUNE_BF16, TUNE_F32, TUNE_BF16_2 };

/* Prepare p as one candidate: f32 = 0 oneDNN's bf16 kernel, 1 its f32
 * kernel on widened tensors.  A family that cannot take the bf16 tensors
 * (ENOTSUP) gets the f32 kernel between conversions (lowp.c), as every
 * other op.  Below avx512_core (cpu_dnn_bf16_native: AVX2) a convolution's
 * f32 candidate is that too: oneDNN's reorders between bf16 and f32 are
 * its reference loop there (26-170 ms a tensor of the bf16 CNN at batch
 * 16), where lowp.c's AVX2 conversion in the plain layout and oneDNN's
 * f32 JIT reorder into the blocked one take under a millisecond; the
 * values the f32 kernel reads are the same. */
static kiln_status prepare_kernel(struct cpu_ctx *c, struct cpu_plan *p,
				  kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *), int f32)
{
	const struct kiln_op op = p->op;
	kiln_status st = KILN_ENOTSUP;
	if (!(f32 && (family == cpu_gemm_prepare || !cpu_dnn_bf16_native()))) {
		p->kern_f32 = f32;
		st = family(c, p);
	}
	if (st == KILN_ENOTSUP) {
		cpu_plan_release(p);
		memset(p, 0, sizeof *p);
		p->op = op;
		st = cpu_lowp_prepare(c, p, family);
	}
	return st;
}

/* One operand of tune_key: dtype, layout, rank and the dims it has. */
static void desc_key(const struct kiln_tensor_desc *d, struct kiln_tensor_desc *k)
{
	k->dtype = d->dtype;
	k->layout = d->layout;
	k->ndim = d->ndim;
	for (int j = 0; j < d->ndim && j < KILN_MAX_DIMS; j++)
		k->dims[j] = d->dims[j];
}

/* What a timing depends on, as the key of the choice table (and of the
 * tune cache's records): the op's type, its operands' dtypes, layouts and
 * shapes (the unused slots and reserved fields zeroed), its geometry and
 * parameters (i[], f[]: strides, padding, transposes, the fused
 * activation) and its flags but KILN_OPF_ACCUMULATE and the fused
 * activation (KILN_OPF_ACT, its kind and alpha).  Accumulating adds the
 * same pass over out0 to either candidate, so it does not change which
 * is faster: the writing and the accumulating backward GEMMs and weight
 * gradients of one shape (a layer's first micro-batch and the others')
 * share one timing instead of two.  So does an activation in the
 * epilogue: a convolution whose kept-copy twin was timed with its ReLU
 * and the plain op its layer prepares without (below AVX-512, where the
 * bf16 forward keeps nothing) share one timing. */
static void tune_key(const struct kiln_op *op, struct kiln_op *key)
{
	cpu_op_key(op, key);
	key->flags = op->flags & ~(uint32_t)(KILN_OPF_ACCUMULATE | KILN_OPF_ACT);
	key->i[KILN_OPI_ACT] = 0;
	key->f[KILN_OPF_ACT_ALPHA] = 0;
}

void cpu_op_key(const struct kiln_op *op, struct kiln_op *key)
{
	memset(key, 0, sizeof *key);
	key->type = op->type;
	key->flags = op->flags;
	key->n_in = op->n_in;
	key->n_out = op->n_out;
	for (int k = 0; k < op->n_in && k < KILN_OP_MAX_IN; k++)
		desc_key(&op->in[k], &key->in[k]);
	for (int k = 0; k < op->n_out && k < KILN_OP_MAX_OUT; k++)
		desc_key(&op->out[k], &key->out[k]);
	memcpy(key->i, op->i, sizeof key->i);
	memcpy(key->f, op->f, sizeof key->f);
}

/* Whether a timing under w is provisional (tune_choose): the process's
 * threads waited for a CPU more than CPU_WAIT_BUSY (unmeasured, < 0: not
 * that), or an op that runs on the team was timed on fewer than the
 * `threads` the cache keys it under, or on a team that changed size: the
 * adaptive team shrinks under a busy neighbour, and a choice timed on one
 * thread (or on oneDNN's 2-thread kernel with one thread starved) is not
 * the 2-thread choice (docs/PERFORMANCE.md, "Session 36: the tuner while
 * the team shrinks"). */
static int tune_contended(const struct cpu_tune_cond *w, int threads)
{
	return w->wait > CPU_WAIT_BUSY || (w->team && w->team < threads) || (w->team && w->changed);
}

/* The choice rule, the one place it is: of the n candidates timed
 * (cpu_tune_time_plans; < 0 failed), the fastest, the first on a tie or a failure;
 * *provisional when timed under contention (tune_contended; `threads` the
 * context's).  By wall time when quiet, by the team's CPU time when
 * provisional; *t the figures it went by. */
static int tune_choose(const double *wall, const double *cpu, int n, const struct cpu_tune_cond *w,
		       int threads, int *provisional, const double **t)
{
	*provisional = tune_contended(w, threads);
	const double *v = *t = *provisional ? cpu : wall;
	int best = 0;
	for (int k = 1; k < n; k++)
		if (v[k] >= 0 && v[best] >= 0 && v[k] < v[best])
			best = k;
	return best;
}

/* The measure tune_choose went by, for a log line. */
static const char *measure_str(int provisional)
{
	return provisional ? "medians of the team's CPU time" : "medians of wall time";
}

/* ", provisional (...)" for a log line when p; w what the timing ran
 * under, `threads` the context's team. */
static const char *prov_str(int p, const struct cpu_tune_cond *w, int threads, char *s, size_t n)
{
	if (!p)
		return "";
	char team[64] = "";
	if (w->team && (w->team < threads || w->changed))
		snprintf(team, sizeof team, "a team of %d of %d threads%s, ", w->team, threads,
			 w->changed ? " changing size" : "");
	common_snprintf_c(s, n, ", provisional (timed under contention: %swaited %.2f s a second for a CPU)", team,
			  w->wait);
	return s;
}

/* Whether this context may re-time a provisional choice from the cache
 * now: the machine quiet (probed once per context) and fewer than
 * CPU_TUNE_RETIMES re-timed; counts the one it grants. */
static int may_retime(struct cpu_ctx *c)
{
	pthread_mutex_lock(c->lock);
	int quiet = c->tune_quiet, ok = c->tune_retimed < CPU_TUNE_RETIMES;
	pthread_mutex_unlock(c->lock);
	if (!ok)
		return 0;
	if (!quiet) { /* a 40 ms spin, once (two prepares at once: twice) */
		const double w = cpu_probe_wait();
		quiet = w > CPU_WAIT_BUSY ? 2 : 1;
		c->host->log(KILN_LOG_INFO, "cpu",
			     "tune cache: provisional choices; waited %.2f s a second for a CPU over 40 ms: %s (at most %d a run)",
			     w, quiet == 1 ? "quiet, re-timing them" : "busy, keeping them", CPU_TUNE_RETIMES);
	}
	pthread_mutex_lock(c->lock);
	c->tune_quiet = quiet;
	ok = quiet == 1 && c->tune_retimed < CPU_TUNE_RETIMES;
	c->tune_retimed += ok;
	pthread_mutex_unlock(c->lock);
	return ok;
}

/* The choice kept for op's key, or -1: none, or a provisional one read
 * from the cache that this context times again now (may_retime). */
static int find_choice(struct cpu_ctx *c, const struct kiln_op *op)
{
	struct kiln_op key;
	tune_key(op, &key);
	int f32 = -1, stale = 0, from_file = 0;
	double wait = 0;
	pthread_mutex_lock(c->lock);
	for (const struct cpu_choice *h = c->choices; h && f32 < 0; h = h->next)
		if (!memcmp(&h->op, &key, sizeof key)) {
			f32 = h->kern_f32;
			stale = h->provisional && h->from_file;
			from_file = h->from_file;
			wait = h->wait;
		}
	pthread_mutex_unlock(c->lock);
	char s0[96], s1[96];
	if (stale && may_retime(c)) {
		c->host->log(KILN_LOG_INFO, "cpu",
			     "%s %s: re-timing the cached choice %d, provisional (timed waiting %.2f s a second for a CPU)",
			     cpu_op_name(op->type), cpu_desc_str(&op->in[0], s0, sizeof s0), f32, wait);
		return -1;
	}
	/* what a run took from the cache, so runs of one benchmark can be
	 * told apart by their choices (a timed one has its own line): an f32
	 * convolution's at info (bench/onnx.sh reads them); a bf16 op's and
	 * an f32 GEMM's oneDNN (every bf16 run's, every f32 run's) at debug,
	 * counted for one info line (cpu_tune_summary) */
	const int quiet = op->in[0].dtype == KILN_BF16 ||
			  (!f32 && op->type == KILN_OP_GEMM && op->in[0].dtype == KILN_F32);
	if (f32 >= 0 && from_file) {
		c->host->log(quiet ? KILN_LOG_DEBUG : KILN_LOG_INFO, "cpu",
			     "%s %s -> %s: choice %d from the tune cache%s",
			     cpu_op_name(op->type), cpu_desc_str(&op->in[0], s0, sizeof s0),
			     cpu_desc_str(&op->out[0], s1, sizeof s1), f32, stale ? ", provisional" : "");
		if (quiet)
			__atomic_add_fetch(&c->tune_hits, 1, __ATOMIC_RELAXED);
	}
	return f32;
}

/* One info line for the choices the prepares since the last one took from
 * the tune cache with their own lines at debug (find_choice).  Called as a
 * plan runs (cpu_run): the core prepares a plan's ops, then runs them. */
void cpu_tune_summary(struct cpu_ctx *c)
{
	if (!__atomic_load_n(&c->tune_hits, __ATOMIC_RELAXED))
		return;
	const int n = __atomic_exchange_n(&c->tune_hits, 0, __ATOMIC_RELAXED);
	if (n > 0)
		c->host->log(KILN_LOG_INFO, "cpu", "%d choice%s from the tune cache %s (each at KILN_LOG_LEVEL=debug)",
			     n, n == 1 ? "" : "s", c->tune_path);
}

/* The timed choice made: candidate `best` of cand[0..n) becomes p (cand[0]
 * is p itself, the plan first prepared); every other candidate is released
 * and freed. */
static void take_candidate(struct cpu_plan *p, struct cpu_plan **cand, int n, int best)
{
	if (best) {
		cpu_plan_release(p);
		memcpy(p, cand[best], sizeof *p);
	}
	for (int k = 1; k < n; k++) {
		if (!cand[k]) /* (a GEMM's f32 one, not prepared: tune_time) */
			continue;
		if (k != best)
			cpu_plan_release(cand[k]);
		free(cand[k]);
	}
}

/* Remember op's choice (in place of a kept one of its key); timed: by this
 * context (counted for the cache), else read from the cache. */
static void keep_choice(struct cpu_ctx *c, const struct kiln_op *op, int f32, int provisional,
			double wait, int timed)
{
	struct kiln_op key;
	tune_key(op, &key);
	pthread_mutex_lock(c->lock);
	struct cpu_choice *h = c->choices;
	while (h && memcmp(&h->op, &key, sizeof key))
		h = h->next;
	if (!h && (h = calloc(1, sizeof *h))) {
		h->op = key;
		h->next = c->choices;
		c->choices = h;
	}
	if (h) { /* else only a cache: the next prepare of this shape times again */
		h->kern_f32 = f32;
		h->provisional = provisional;
		h->wait = wait;
		h->from_file = !timed;
	}
	c->tune_timed += timed;
	pthread_mutex_unlock(c->lock);
}

/* Prepare p as choice k (TUNE_*): TUNE_BF16_2, a GEMM's second bf16
 * implementation, is the first where oneDNN lists no second. */
static kiln_status prepare_choice(struct cpu_ctx *c, struct cpu_plan *p,
				  kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *), int k)
{
	if (k != TUNE_BF16_2 || family != cpu_gemm_prepare)
		return prepare_kernel(c, p, family, k == TUNE_F32);
	const struct kiln_op op = p->op;
	p->kern_f32 = 0;
	p->conv_impl = 1;
	const kiln_status st = family(c, p);
	if (st != KILN_ENOTSUP)
		return st;
	cpu_plan_release(p);
	memset(p, 0, sizeof *p);
	p->op = op;
	return prepare_kernel(c, p, family, 0);
}

/* Prepare p by family with implementation `setting` (> 0: that one, the
 * first where it has none; CPU_CONV_AUTO: the fastest of the first `max`,
 * timed once per op key and remembered; another than the first only when
 * it takes at most `margin` of the first's time).  what names the op in
 * the log line of a timing. */
static kiln_status tune_impl(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *), int setting,
			     int max, double margin, const char *what)
{
	const struct kiln_op op = p->op;
	if (setting > 0) { /* the one named, else the first */
		p->conv_impl = setting;
		const kiln_status st = family(c, p);
		if (st != KILN_ENOTSUP)
			return st;
		cpu_plan_release(p);
		memset(p, 0, sizeof *p);
		p->op = op;
		return family(c, p);
	}
	int best = find_choice(c, &op);
	if (best >= 0) {
		p->conv_impl = best;
		const kiln_status st = family(c, p);
		if (st != KILN_ENOTSUP || !best)
			return st;
		/* chosen for an op of the same key this one cannot take: the
		 * first implementation */
		cpu_plan_release(p);
		memset(p, 0, sizeof *p);
		p->op = op;
		return family(c, p);
	}
	kiln_status st = family(c, p);
	if (st)
		return st;
	struct cpu_plan *cand[CPU_CONV_IMPLS] = { p };
	int n = 1;
	for (; n < max; n++) { /* KILN_ENOTSUP: no n-th implementation */
		if (!(cand[n] = calloc(1, sizeof *cand[n])))
			break;
		cand[n]->op = op;
		cand[n]->conv_impl = n;
		if (family(c, cand[n]) != KILN_OK) {
			cpu_plan_release(cand[n]);
			free(cand[n]);
			break;
		}
	}
	double tw[CPU_CONV_IMPLS], tc[CPU_CONV_IMPLS];
	struct cpu_tune_cond w = { -1, 0, 0 };
	const double *t = tw;
	int prov = 0;
	best = 0;
	if (n > 1) {
		cpu_tune_time_plans(c, cand, n, tw, tc, &w);
		const int fast = best = tune_choose(tw, tc, n, &w, c->threads, &prov, &t);
		if (best && t[0] >= 0 && t[best] > margin * t[0])
			best = 0; /* not by enough: the first */
		char s0[96], s2[96], sp[160];
		c->host->log(KILN_LOG_INFO, "cpu",
			     "f32 %s %s -> %s: %d implementations, %.3f ms first, %.3f ms fastest (%s): implementation %d%s",
			     what, cpu_desc_str(&op.in[0], s0, sizeof s0), cpu_desc_str(&op.out[0], s2, sizeof s2),
			     n, 1e3 * t[0], 1e3 * t[fast], measure_str(prov), best,
			     prov_str(prov, &w, c->threads, sp, sizeof sp));
	}
	keep_choice(c, &op, best, prov, w.wait, 1);
	take_candidate(p, cand, n, best);
	return KILN_OK;
}

kiln_status cpu_tune_conv_impl(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (op->type != KILN_OP_CONV || (op->flags & KILN_OPF_KEEP) || !c->conv_impl)
		return cpu_conv_prepare(c, p);
	return tune_impl(c, p, cpu_conv_prepare, c->conv_impl, CPU_CONV_IMPLS, 1.0, "CONV");
}

/* Implementation 0: oneDNN (gemm.c), 1: OpenBLAS, where the op has the
 * form it takes (cpu_gemm_openblas_ok) and the build has it: by the shape
 * rule (the default), by setting, or timed (auto).  OpenBLAS
 * only where it takes at most 90% of oneDNN's time: near a tie a timing
 * (a provisional choice re-timed later, another machine's) would flip the
 * library, and with it a run's rounding, for nothing. */
kiln_status cpu_tune_gemm_impl(struct cpu_ctx *c, struct cpu_plan *p)
{
	if (!c->gemm_impl || !cpu_gemm_openblas_ok(&p->op) || cpu_openblas_check() ||
	    (c->gemm_impl == CPU_GEMM_RULE && !cpu_gemm_openblas_rule(&p->op)))
		return cpu_gemm_prepare(c, p);
	/* rule: OpenBLAS, oneDNN where it cannot (a team's op) */
	return tune_impl(c, p, cpu_gemm_prepare, c->gemm_impl == CPU_GEMM_RULE ? 1 : c->gemm_impl,
			 2, 0.9, "GEMM");
}

/* conv_algo = auto's choices are kept under the op with this in i[14]
 * (no convolution uses it), apart from conv_impl's for the same op */
#define CPU_ALGO_SALT 0x414c474f

/* tune_impl's family for conv_algo = auto: candidate 0 direct (oneDNN,
 * with conv_impl's choice), 1 the FFT */
/* convthin.c's plan of p (cpu_convthin_bare_ok); KILN_ENOTSUP for the
 * op with kept copies, so that its layer prepares its ops without them
 * and this one runs here */
static kiln_status thin_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	if (p->op.flags & KILN_OPF_KEEP)
		return cpu_bad(c, &p->op, KILN_ENOTSUP,
			       "kiln's direct convolution for few input channels keeps no copies");
	return cpu_convthin_prepare(c, p);
}

/* An f32 convolution by a direct kernel: kiln's for a first layer's few
 * input channels (convthin.h), else oneDNN's (cpu_tune_conv_impl) */
static kiln_status direct_prepare(struct cpu_ctx *c, struct cpu_plan *p)
{
	return cpu_convthin_bare_ok(&p->op) ? thin_prepare(c, p) : cpu_tune_conv_impl(c, p);
}

static kiln_status conv_algo_family(struct cpu_ctx *c, struct cpu_plan *p)
{
	const int fft = p->conv_impl;
	p->op.i[14] = 0;
	p->conv_impl = 0;
	return fft ? cpu_fftconv_prepare(c, p) : direct_prepare(c, p);
}

/* auto's choice for op (KILN_OPF_KEEP off, the kept tensors left out):
 * 1 the FFT, 0 direct; timed here when not known yet */
static int conv_algo_auto(struct cpu_ctx *c, const struct kiln_op *op, kiln_status *st)
{
	struct cpu_plan *q = calloc(1, sizeof *q);
	if (!q) {
		*st = c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan", cpu_op_name(op->type));
		return 0;
	}
	q->op = cpu_op_unkept(op);
	q->op.i[14] = CPU_ALGO_SALT;
	*st = tune_impl(c, q, conv_algo_family, CPU_CONV_AUTO, 2, 0.9, "CONV algorithm (0 direct, 1 FFT)");
	const int fft = !*st && q->fft != NULL;
	cpu_plan_release(q);
	free(q);
	return fft;
}

/* 1 where op runs by Winograd (wino.h): conv_algo = winograd, or rule
 * and auto in an inference plan (frozen weights) */
static int wino_rule(const struct cpu_ctx *c, const struct kiln_op *op)
{
	const int a = c->conv_algo;
	return cpu_wino_ok(op) &&
	       (a == CPU_CONV_WINO || ((a == CPU_GEMM_RULE || a == CPU_CONV_AUTO) && (op->flags & KILN_OPF_FROZEN)));
}

kiln_status cpu_tune_conv_algo(struct cpu_ctx *c, struct cpu_plan *p)
{
	const struct kiln_op *op = &p->op;
	if (wino_rule(c, op))
		return cpu_wino_prepare(c, p);
	/* winograd: an op with kept copies that wino.c would run bare is
	 * refused, so that its layer prepares them without (a safety net:
	 * the f32 NHWC layers wino.c takes keep none today, conv.c's
	 * kernels reading the caller's bytes; this skips the prepare of a
	 * forward the layer would throw away) */
	if (c->conv_algo == CPU_CONV_WINO && (op->flags & KILN_OPF_KEEP) && cpu_wino_bare_ok(op))
		return cpu_bad(c, op, KILN_ENOTSUP, "the Winograd convolution keeps no copies");
	if (!c->conv_algo || !cpu_fftconv_ok(op))
		return direct_prepare(c, p);
	int fft = 1;
	if (c->conv_algo == CPU_GEMM_RULE || c->conv_algo == CPU_CONV_WINO) { /* winograd: the rest as rule */
		fft = cpu_fftconv_rule(op);
	} else if (c->conv_algo == CPU_CONV_AUTO) {
		if (!(op->flags & KILN_OPF_KEEP)) {
			p->op.i[14] = CPU_ALGO_SALT;
			return tune_impl(c, p, conv_algo_family, CPU_CONV_AUTO, 2, 0.9,
					 "CONV algorithm (0 direct, 1 FFT)");
		}
		kiln_status st;
		fft = conv_algo_auto(c, op, &st);
		if (st)
			return st;
	}
	if (!fft)
		return direct_prepare(c, p);
	/* kept copies (the FFT's spectra) only where a fixed setting gives the
	 * layer's three ops all to the FFT; auto times each op alone, so a
	 * copy's writer and reader could differ: refused, and the layer's ops
	 * are prepared without them */
	if ((op->flags & KILN_OPF_KEEP) && c->conv_algo == CPU_CONV_AUTO)
		return cpu_bad(c, op, KILN_ENOTSUP, "the FFT convolution keeps no copies under conv_algo = auto");
	return cpu_fftconv_prepare(c, p);
}

void cpu_tune_free(struct cpu_ctx *c)
{
	while (c->choices) {
		struct cpu_choice *h = c->choices;
		c->choices = h->next;
		free(h);
	}
}

/* ---- kept copies of bf16 convolutions (KILN_OPF_KEEP) ----------------
 *
 * A layer's forward writes its kernel copy of x for the weight gradient,
 * which writes its copy of dy for the data gradient (conv.c).  A copy is
 * in its producer's kernel dtype (bf16, or f32 when the tuner picked the
 * f32 kernel: p->kern_f32), so a consumer may read it only when it runs
 * the same kernel dtype.  The choice is made as without kept copies: a
 * kept op takes the choice of its bare twin (the op without KEEP and the
 * kept tensors; timed here when none is known yet), so the kernels, and
 * the results, are those without kept copies.  A consumer whose choice is
 * not its producer's (the producer's bare choice in the table: every
 * entry of the producer's shapes and geometry, whatever its flags, fused
 * activation or bias, must agree) returns KILN_ENOTSUP, and the layer
 * then reads its tensor as it is (core/layers/conv.c).  A mismatched copy
 * is never read. */

static int desc_same(const struct kiln_tensor_desc *a, const struct kiln_tensor_desc *b)
{
	struct kiln_tensor_desc ka, kb;
	memset(&ka, 0, sizeof ka), memset(&kb, 0, sizeof kb);
	desc_key(a, &ka), desc_key(b, &kb);
	return !memcmp(&ka, &kb, sizeof ka);
}

/* Whether key h is the bare op of consumer op's producer: the forward of a
 * weight gradient (x, y as dy), the weight gradient of a data gradient
 * (x as dx, dy), the same geometry (i[0..6]). */
static int kept_producer(const struct kiln_op *h, const struct kiln_op *op)
{
	const int want = op->type == KILN_OP_CONV_BWD_WEIGHTS ? KILN_OP_CONV : KILN_OP_CONV_BWD_WEIGHTS;
	if (h->type != want || memcmp(h->i, op->i, 7 * sizeof op->i[0]))
		return 0;
	const struct kiln_tensor_desc *x = op->type == KILN_OP_CONV_BWD_WEIGHTS ? &op->in[0] : &op->out[0];
	const struct kiln_tensor_desc *dy = op->type == KILN_OP_CONV_BWD_WEIGHTS ? &op->in[1] : &op->in[0];
	const struct kiln_tensor_desc *hy = want == KILN_OP_CONV ? &h->out[0] : &h->in[1];
	return desc_same(&h->in[0], x) && desc_same(hy, dy);
}

/* 1 when every known choice of consumer op's producer is f32, 0 when every
 * one is bf16's, -1 when none is known or they disagree. */
static int kept_producer_choice(struct cpu_ctx *c, const struct kiln_op *op)
{
	int f32 = -1;
	pthread_mutex_lock(c->lock);
	for (const struct cpu_choice *h = c->choices; h; h = h->next)
		if (kept_producer(&h->op, op)) {
			const int k = h->kern_f32 == TUNE_F32;
			f32 = f32 < 0 || f32 == k ? k : 2;
		}
	pthread_mutex_unlock(c->lock);
	return f32 > 1 ? -1 : f32;
}

/* KILN_CPU_TUNEPICK, the tests' hook: "F,W,D" (each 0 bf16, 1 f32), the
 * choices of a bf16 CONV, CONV_BWD_WEIGHTS and CONV_BWD_DATA instead of a
 * timing, kept as one (so that a test can make a layer's ops differ).
 * 1 when it set op's. */
static int tune_pick(struct cpu_ctx *c, const struct kiln_op *op)
{
	const char *hook = getenv("KILN_CPU_TUNEPICK");
	int k[3];
	if (!hook || sscanf(hook, "%d,%d,%d", &k[0], &k[1], &k[2]) != 3)
		return 0;
	const int i = op->type == KILN_OP_CONV ? 0 : op->type == KILN_OP_CONV_BWD_WEIGHTS ? 1 : 2;
	keep_choice(c, op, k[i] ? TUNE_F32 : TUNE_BF16, 0, 0, 0);
	return 1;
}

static kiln_status tune_time(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *));

/* A bf16 op with kept copies: the kernel of its bare twin's choice
 * (setting, table, or timed now on the bare op); a consumer whose kernel
 * dtype is not its producer's: KILN_ENOTSUP. */
static kiln_status tune_kept(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *), int setting)
{
	const struct kiln_op op = p->op;
	const struct kiln_op bare = cpu_op_unkept(&op);
	int f32 = setting == CPU_KERN_F32;
	if (setting == CPU_KERN_AUTO) {
		int k = tune_pick(c, &bare) ? find_choice(c, &bare) : -1;
		if (k < 0)
			k = find_choice(c, &bare);
		if (k < 0) { /* time the bare op: its choice is kept */
			struct cpu_plan *q = calloc(1, sizeof *q);
			if (!q)
				return c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan",
						      cpu_op_name(op.type));
			q->op = bare;
			const kiln_status st = tune_time(c, q, family);
			cpu_plan_release(q);
			free(q);
			if (st)
				return st;
			k = find_choice(c, &bare);
		}
		f32 = k == TUNE_F32;
		if (op.type != KILN_OP_CONV && kept_producer_choice(c, &op) != f32) {
			c->host->log(KILN_LOG_DEBUG, "cpu",
				     "%s: the producer of its kept copy chose another kernel dtype: read as it is",
				     cpu_op_name(op.type));
			return KILN_ENOTSUP;
		}
	}
	/* below avx512_core the f32 kernel's copies are made by lowp.c's
	 * plan (kiln's conversions, then the f32 op with its kept copies),
	 * not by oneDNN's bf16 <-> f32 reorders, its reference loop there
	 * (prepare_kernel); and the bf16 choice is that plan too (oneDNN has
	 * no bf16 kernel there: prepare_kernel's fallback), so either choice
	 * keeps the f32 op's copies (the FFT's spectra under conv_algo) */
	if (!cpu_dnn_bf16_native())
		return cpu_lowp_prepare(c, p, family);
	p->kern_f32 = f32;
	return family(c, p);
}

kiln_status cpu_tune_prepare(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *))
{
	const struct kiln_op op = p->op;
	const int setting = family == cpu_gemm_prepare ? c->bf16_gemm : c->bf16_conv;
	kiln_status st;
	/* f16 has no oneDNN kernel here: always the f32 one between
	 * conversions */
	if (cpu_op_has(&op, KILN_F16))
		return cpu_lowp_prepare(c, p, family);
	/* bf16_conv = auto and the f32 op by FFT on fft16.c's transforms: the
	 * FFT, not a timing of oneDNN's two kernels (each about twice its time
	 * for the CNN's conv2): reading and writing the bf16 tensors itself
	 * where its blocks can (fftconv.c, fc_bf16_tensors: NCHW), else as the
	 * f32 op on widened copies (lowp.c); the same bits either way, kept
	 * spectra too */
	const int rules = setting == CPU_KERN_AUTO || setting == CPU_KERN_RULE;
	if (family == cpu_conv_prepare && rules && cpu_fftconv_bf16_fast(&op, c->conv_algo))
		return cpu_fftconv_ok(&op) ? cpu_fftconv_prepare(c, p) : cpu_lowp_prepare(c, p, family);
	/* and where no FFT does, a first layer's few input channels: kiln's
	 * direct kernel, reading and writing bf16 itself (convthin.h), not a
	 * timing of oneDNN's two */
	if (family == cpu_conv_prepare && rules && cpu_convthin_bare_ok(&op))
		return thin_prepare(c, p);
	if (op.flags & KILN_OPF_KEEP)
		return tune_kept(c, p, family, setting);
	if (setting == CPU_KERN_AUTO && family == cpu_conv_prepare && tune_pick(c, &op))
		return prepare_choice(c, p, family, find_choice(c, &op));
	if (setting != CPU_KERN_AUTO)
		return prepare_choice(c, p, family,
				      setting == CPU_KERN_F32 ? TUNE_F32
				      : setting == CPU_KERN_BF16_2 ? TUNE_BF16_2 : TUNE_BF16);
	int f32 = find_choice(c, &op);
	if (f32 >= 0) {
		if ((st = prepare_choice(c, p, family, f32)) == KILN_OK || f32 != TUNE_F32)
			return st;
		/* the f32 kernel, chosen for an op of the same key (tune_key:
		 * the writing one of an accumulating op), cannot take this one:
		 * the bf16 kernel, as when timing its f32 candidate fails */
		cpu_plan_release(p);
		memset(p, 0, sizeof *p);
		p->op = op;
		return prepare_kernel(c, p, family, 0);
	}
	return tune_time(c, p, family);
}

/* Time op's candidates (no choice known): p holds the bf16 one, q the f32
 * one (a GEMM's third, oneDNN's second bf16 implementation); the faster
 * kept in p and in the choice table. */
static kiln_status tune_time(struct cpu_ctx *c, struct cpu_plan *p,
			     kiln_status (*family)(struct cpu_ctx *, struct cpu_plan *))
{
	const struct kiln_op op = p->op;
	kiln_status st;
	if ((st = prepare_kernel(c, p, family, 0)))
		return st;
	/* a GEMM where oneDNN has bf16 dot products (avx512_core_bf16, AMX):
	 * its f32 candidate, the operands widened, took 2-3x the bf16
	 * kernels' time on every bf16 GEMM of the CNN and the MLP (session
	 * 24, Zen 4): not prepared or timed, the two bf16 kernels alone */
	const int no_f32 = family == cpu_gemm_prepare && cpu_dnn_bf16_dots();
	struct cpu_plan *q = no_f32 ? NULL : calloc(1, sizeof *q);
	if (!q && !no_f32)
		return KILN_OK; /* keep the bf16 kernel */
	if (q)
		q->op = op;
	if (q && prepare_kernel(c, q, family, 1) != KILN_OK) {
		/* the bf16 candidate works: keep it, and the f32 one's error
		 * message is not this prepare's */
		cpu_plan_release(q);
		free(q);
		return KILN_OK;
	}
	/* a GEMM's third: oneDNN's second bf16 implementation, where it
	 * lists one */
	struct cpu_plan *cand[3] = { p, q, NULL };
	int n = 2;
	if (family == cpu_gemm_prepare && (cand[2] = calloc(1, sizeof *cand[2]))) {
		cand[2]->op = op;
		cand[2]->conv_impl = 1;
		if (cpu_gemm_prepare(c, cand[2]) == KILN_OK) {
			n = 3;
		} else {
			cpu_plan_release(cand[2]);
			free(cand[2]);
			cand[2] = NULL;
		}
	}
	double tw[3] = { -1, -1, -1 }, tc[3] = { -1, -1, -1 };
	struct cpu_tune_cond w;
	const double *t;
	int prov;
	/* below avx512_core both candidates of a convolution or GEMM are the
	 * f32 kernel between lowp.c's conversions (prepare_kernel), and a GEMM
	 * has no second bf16 one: the same plan, timed once, and the tie kept
	 * as the bf16 choice (a convolution's kept copies, tune_kept, are then
	 * refused there rather than converted by oneDNN's reference reorders) */
	const int same = n == 2 && q && p->inner && q->inner;
	if (no_f32 && n < 3) { /* no second bf16 kernel: nothing to time */
		keep_choice(c, &op, TUNE_BF16, -1, -1, 1);
		return KILN_OK;
	}
	if (no_f32) { /* the two bf16 kernels; the f32 one failed, as it were */
		struct cpu_plan *two[2] = { p, cand[2] };
		double w2[2], c2[2];
		cpu_tune_time_plans(c, two, 2, w2, c2, &w);
		tw[0] = w2[0], tc[0] = c2[0], tw[2] = w2[1], tc[2] = c2[1];
	} else {
		cpu_tune_time_plans(c, cand, same ? 1 : n, tw, tc, &w);
	}
	if (same) {
		tw[1] = tw[0];
		tc[1] = tc[0];
	}
	int best = tune_choose(tw, tc, n, &w, c->threads, &prov, &t);
	if (same)
		best = TUNE_BF16;
	{
		static const char *const what[3] = { "bf16", "f32", "second bf16" };
		char s0[96], s1[96], s2[96], s3[48] = "", sp[160], sf[48];
		if (n == 3)
			common_snprintf_c(s3, sizeof s3, ", second bf16 kernel %.3f ms", 1e3 * t[2]);
		if (same)
			snprintf(s3, sizeof s3, ", one plan timed once");
		if (no_f32)
			snprintf(sf, sizeof sf, "not timed (bf16 dot products)");
		else
			common_snprintf_c(sf, sizeof sf, "%.3f ms", 1e3 * t[1]);
		c->host->log(KILN_LOG_INFO, "cpu",
			     "bf16 %s %s, %s -> %s: bf16 kernel %.3f ms, f32 kernel %s%s (%s): the %s kernel%s",
			     cpu_op_name(op.type), cpu_desc_str(&op.in[0], s0, sizeof s0),
			     cpu_desc_str(&op.in[1], s1, sizeof s1),
			     cpu_desc_str(&op.out[0], s2, sizeof s2), 1e3 * t[0], sf, s3,
			     measure_str(prov), what[best], prov_str(prov, &w, c->threads, sp, sizeof sp));
	}
	keep_choice(c, &op, best, prov, w.wait, 1);
	take_candidate(p, cand, n, best);
	return KILN_OK;
}

/* ---- the persistent cache's hooks (tune_cache.c) ---------------------- */

void cpu_tune_add(struct cpu_ctx *c, const struct kiln_op *op, const struct cpu_tune_val *v)
{
	keep_choice(c, op, v->choice, v->provisional, v->wait, 0);
}

int cpu_tune_each(struct cpu_ctx *c, void (*fn)(void *, const struct kiln_op *, const struct cpu_tune_val *),
		  void *arg)
{
	int n = 0;
	pthread_mutex_lock(c->lock);
	for (const struct cpu_choice *h = c->choices; h; h = h->next, n++)
		if (fn) {
			const struct cpu_tune_val v = { h->kern_f32, h->provisional, h->wait };
			fn(arg, &h->op, &v);
		}
	pthread_mutex_unlock(c->lock);
	return n;
}
