/* plugins/cpu/dnnteam.c - oneDNN's plans (GEMM, convolution, pooling) on a
 * team smaller than the one they were prepared for, with the same bytes.
 *
 * oneDNN fixes a primitive's threads when it is made (its convolutions open
 * their regions with num_threads(that count); its GEMM reads the caller's
 * count when it runs), and some kernels split a sum differently for another
 * count.  Measured on Debian's oneDNN 2.6 (AVX2 here): the MLP's
 * 128x256 -> 10 matmul (K split over 2 threads) and the backward-weights
 * convolution of 16 samples, 1 -> 4 channels (minibatch split) differ in the
 * last bits between 1 and 2 threads; every other GEMM, convolution and
 * pooling of the example models gives the same bytes
 * (docs/PERFORMANCE.md, "Steady under contention").
 *
 * So when the adaptive team (threads.c) has shrunk to n threads (or grown
 * back to n and held there), below the opening team, a oneDNN plan's next
 * run first prepares the op again for n
 * threads and runs both versions once on the same pseudo-random tensors of
 * the op's shapes: identical bytes, and the plan runs on n threads whenever
 * oneDNN's team is n; different, and it keeps the opening team (marked, not
 * probed again for n).  Either way a result never depends on the team's
 * history: a run and its resume, or two runs on a machine busy at different
 * times, give the same bytes.  The versions live as long as the plan.
 *
 * What a probe found is kept for the context (struct cpu_team_verdict:
 * the op, the plan's kernel and implementation, the team), so another
 * plan of the same op prepares its version for n threads without running
 * either one again, or keeps the opening team without preparing one: the
 * outcome is a function of those alone (the kernel oneDNN lists at that
 * index for the op and team, its split of the op; the same scratch
 * values).  kiln_infer makes a plan for each new remainder size and
 * frees the last one's, so before session 41 each call of a size seen
 * before probed every oneDNN op of the model again while the team was
 * shrunk: the ResNet example called with 1, 2, ..., 15 rows in turn at 2
 * threads took 11 ms a call against 2.6 at 1 thread (now 2.4), the
 * probes' runs on the opening team meeting a descheduled thread each
 * (docs/PERFORMANCE.md, "Session 41: a new size's plan").  The verdicts
 * are kept in team_verdicts.c: a hash of their keys, at most
 * CPU_TEAM_VERDICTS of them, and none of a probe that could not run.
 *
 * The ops whose split differs are the small ones (a sum over K shared by
 * two threads because M x N is too small to share out), and a plan that
 * stays on the opening team makes every step meet a descheduled thread on
 * a busy machine.  So a GEMM or convolution below CPU_ONE_THREAD_FLOP runs
 * on one thread on any team, adaptive or not, from its preparation on: its
 * bytes never depend on the team, it needs no versions, and it never opens
 * a parallel region (at that size a second thread saves a few
 * microseconds; cpu_op_one_thread in threads.c; docs/PERFORMANCE.md,
 * "Steady with a busy core").
 */
#include "cpu.h"
#include "dnn.h"

#include <omp.h>
#include <malloc.h>
#include <stddef.h> /* offsetof */
#include <stdlib.h>
#include <string.h>

struct cpu_variants {
	struct cpu_ctx *c;
	pthread_mutex_t lock; /* making a version */
	int max;              /* the opening team, the plan's own */
	struct cpu_plan **alt; /* [max]: the version for n threads (atomic), or NULL */
	unsigned char *bad;   /* [max]: n gives other bytes (atomic) */
	/* a GEMM's busy split (cpu_gemm_split_busy), run while the team is
	 * below max: made on first use, kept when it gives the plan's bytes */
	struct cpu_plan *busy; /* (atomic) */
	int busy_none;        /* not split, or other bytes (atomic) */
};

kiln_status cpu_variants_attach(struct cpu_ctx *c, struct cpu_plan *p)
{
	if (!c->team.adapt)
		return KILN_OK; /* the team never changes */
	for (struct cpu_plan *x = p; x; x = x->inner) {
		if ((!x->gemm && !x->dnn) || cpu_op_one_thread(&x->op) || cpu_gemm_is_split(x->gemm))
			continue;
		struct cpu_variants *v = calloc(1, sizeof *v);
		if (v) {
			v->alt = calloc((size_t)c->threads, sizeof *v->alt);
			v->bad = calloc((size_t)c->threads, 1);
		}
		if (!v || !v->alt || !v->bad) {
			if (v)
				free(v->alt), free(v->bad);
			free(v);
			return c->host->error(KILN_ENOMEM, "cpu: out of memory for a %s plan",
					      cpu_op_name(p->op.type));
		}
		v->c = c;
		v->max = c->threads;
		pthread_mutex_init(&v->lock, NULL);
		x->variants = v;
	}
	return KILN_OK;
}

void cpu_variants_free(struct cpu_variants *v)
{
	if (!v)
		return;
	for (int n = 0; n < v->max; n++)
		if (v->alt[n]) {
			cpu_plan_release(v->alt[n]);
			free(v->alt[n]);
		}
	if (v->busy) {
		cpu_plan_release(v->busy);
		free(v->busy);
	}
	pthread_mutex_destroy(&v->lock);
	free(v->alt);
	free(v->bad);
	free(v);
}

/* ---- what the probes found, kept for the context (team_verdicts.c) ----- */

static void verdict_key(const struct cpu_plan *p, int n, int busy, struct cpu_team_verdict *k)
{
	memset(k, 0, sizeof *k);
	cpu_op_key(&p->op, &k->key);
	k->kern_f32 = p->kern_f32;
	k->conv_impl = p->conv_impl;
	k->n = n;
	k->busy = busy;
	cpu_team_verdict_hash(k);
}

/* What a probe of k found: 1 the same bytes, 0 other bytes (or no
 * version), -1 never probed (or forgotten: team_verdicts.c). */
static int verdict_find(struct cpu_ctx *c, const struct cpu_team_verdict *k)
{
	pthread_mutex_lock(c->lock);
	const int same = cpu_team_verdict_find(&c->verdicts, k);
	pthread_mutex_unlock(c->lock);
	return same;
}

/* Keep what the probe of k found (same < 0: it could not run, kept not;
 * out of memory: the next plan probes). */
static void verdict_keep(struct cpu_ctx *c, const struct cpu_team_verdict *k, int same)
{
	pthread_mutex_lock(c->lock);
	cpu_team_verdict_keep(&c->verdicts, k, same);
	pthread_mutex_unlock(c->lock);
}

void cpu_variants_forget(struct cpu_ctx *c) { cpu_team_verdicts_clear(&c->verdicts); }

/* ---- a plan's versions -------------------------------------------------- */

/* The family that prepares op type t. */
static kiln_status prepare_family(struct cpu_ctx *c, struct cpu_plan *q)
{
	switch (q->op.type) {
	case KILN_OP_GEMM: return cpu_gemm_prepare(c, q);
	case KILN_OP_CONV:
	case KILN_OP_CONV_BWD_DATA:
	case KILN_OP_CONV_BWD_WEIGHTS: return cpu_conv_prepare(c, q);
	case KILN_OP_POOL:
	case KILN_OP_POOL_BWD: return cpu_pool_prepare(c, q);
	default: return KILN_ENOTSUP;
	}
}

/* Run plan x on `threads` threads over scratch tensors of its op's shapes
 * (pseudo-random values, the same for every call); the outputs' bytes are
 * copied to out (size *n, set), or compared with it: 1 when equal, 0
 * when not or when the kernel failed (a verdict), -1 when it could not run
 * for want of memory (cpu_team_probe_failed). */
static int probe_run(struct cpu_ctx *c, const struct cpu_plan *x, size_t ws, int threads,
		     char **out, size_t *n)
{
	struct kiln_op_args a;
	size_t bytes[KILN_OP_MAX_OUT], total = 0;
	char *buf = cpu_scratch_args(x, ws, 1, &a, bytes);
	struct cpu_err e;
	int same = -1;
	kiln_status st;
	if (!buf)
		return -1;
	omp_set_num_threads(threads);
	/* scratch weights: a frozen conv's kept copy stays as it is */
	if ((st = cpu_dnn_w_probe(x->dnn, 1)) != KILN_OK) {
		same = cpu_team_probe_failed(st);
		goto out;
	}
	st = x->kernel(x, &a, &e);
	cpu_dnn_w_probe(x->dnn, 0);
	if (st != KILN_OK) {
		same = cpu_team_probe_failed(st);
		goto out;
	}
	for (int i = 0; i < x->op.n_out; i++)
		total += bytes[i];
	if (!*out && !(*out = malloc(total ? total : 1)))
		goto out;
	same = 1;
	for (int i = 0, off = 0; i < x->op.n_out; off += (int)bytes[i], i++) {
		if (!a.out[i])
			continue;
		if (!*n)
			memcpy(*out + off, a.out[i], bytes[i]);
		else if (memcmp(*out + off, a.out[i], bytes[i]))
			same = 0;
	}
	*n = total;
out:
	cpu_split_quiesce(c); /* a late GEMM helper may still read buf */
	cpu_huge_free(buf);
	/* the scratch tensors are as large as the op's: hand their pages back,
	 * or the probe would grow the resident peak kiln memory predicts.
	 * Scratch of 2 MiB or more was its own mapping, unmapped just above
	 * (with THP, a 2 MiB block of it was resident whole once touched:
	 * docs/memory.md); this trims only the heap's, under 2 MiB. */
	malloc_trim(0);
	return same;
}

/* A version of p's op for n threads (busy: the busy split of its GEMM),
 * when it fits p's workspace, leaves p's aux and gives p's bytes; else
 * NULL.  Whether it gives them: what an earlier plan's probe of the same
 * op, kernel and team found, else probed now and kept (*known: 1 when
 * found, 0 when probed), unless the probe could not run for want of
 * memory (the version, the scratch tensors): the next plan of the op
 * probes again.  A version that fails to prepare or to run is a verdict,
 * kept (cpu_team_probe_failed).  Under v->lock. */
static struct cpu_plan *version_for(struct cpu_variants *v, const struct cpu_plan *p, int n,
				    int busy, int *known)
{
	struct cpu_ctx *c = v->c;
	struct cpu_team_verdict k;
	verdict_key(p, n, busy, &k);
	const int found = verdict_find(c, &k);
	*known = found >= 0;
	if (!found)
		return NULL; /* other bytes: no version prepared */
	struct cpu_plan *q = calloc(1, sizeof *q);
	char *ref = NULL;
	size_t nref = 0;
	int same = -1; /* 1 the same bytes, 0 other bytes or no fit, -1 no probe */
	if (q) {
		q->op = p->op;
		q->kern_f32 = p->kern_f32;
		q->conv_impl = p->conv_impl;
		omp_set_num_threads(n);
		const kiln_status st = busy ? cpu_gemm_prepare_busy(c, q) : prepare_family(c, q);
		const int fits = st == KILN_OK && q->workspace <= p->workspace && q->aux == p->aux &&
				 q->n_in == p->n_in && q->n_out == p->n_out;
		if (fits && found > 0) {
			same = 1; /* probed before: no run */
		} else if (!fits) {
			same = st ? cpu_team_probe_failed(st) : 0;
		} else {
			/* p itself, without the versions; its list links and
			 * refs (which the issuing thread writes meanwhile under
			 * the device's lock: prepares, frees, cpu_push) not read */
			struct cpu_plan base;
			const size_t from = offsetof(struct cpu_plan, op);
			const size_t at = offsetof(struct cpu_plan, refs), past = at + sizeof p->refs;
			memcpy((char *)&base + from, (const char *)p + from, at - from);
			memcpy((char *)&base + past, (const char *)p + past, sizeof base - past);
			base.prev = base.next = NULL;
			base.refs = 1;
			base.variants = NULL;
			same = probe_run(c, &base, p->workspace, v->max, &ref, &nref);
			if (same > 0)
				same = probe_run(c, q, p->workspace, n, &ref, &nref);
		}
	}
	if (found < 0) /* (same < 0 is not kept) */
		verdict_keep(c, &k, same);
	free(ref);
	if (same <= 0 && q) {
		cpu_plan_release(q);
		free(q);
		q = NULL;
	}
	return q;
}

/* Prepare p's op for n threads and keep that version when it gives p's
 * bytes (v->alt[n]), else mark n (v->bad[n]).  Under v->lock. */
static void make_version(struct cpu_variants *v, const struct cpu_plan *p, int n)
{
	int known;
	struct cpu_plan *q = version_for(v, p, n, 0, &known);
	char s0[96], s1[96] = "";
	/* the second argument (weights, GEMM's B) too: two ops of one input
	 * (a 3x3 and a 1x1 convolution) are told apart */
	if (p->op.n_in > 1)
		cpu_desc_str(&p->op.in[1], s1, sizeof s1);
	v->c->host->log(KILN_LOG_DEBUG, "cpu", "%s %s%s%s on %d threads: %s%s", cpu_op_name(p->op.type),
			cpu_desc_str(&p->op.in[0], s0, sizeof s0), *s1 ? " by " : "", s1, n,
			q ? "the same bytes, prepared for that team"
			  : "other bytes (or no version): stays on the opening team",
			known ? " (probed before)" : " (probed)");
	if (q)
		__atomic_store_n(&v->alt[n], q, __ATOMIC_RELEASE);
	else
		__atomic_store_n(&v->bad[n], 1, __ATOMIC_RELAXED);
}

/* p's GEMM split for a busy team (v->busy), made on first use; NULL when
 * the rule does not split it or its parts give other bytes. */
static const struct cpu_plan *busy_version(struct cpu_variants *v, const struct cpu_plan *p)
{
	const struct cpu_plan *q = __atomic_load_n(&v->busy, __ATOMIC_ACQUIRE);
	if (q || __atomic_load_n(&v->busy_none, __ATOMIC_RELAXED))
		return q;
	pthread_mutex_lock(&v->lock);
	if (!v->busy && !v->busy_none) {
		const int n = omp_get_max_threads(), split = cpu_gemm_split_busy(&p->op, v->max) > 0;
		int known = 0;
		struct cpu_plan *b = split ? version_for(v, p, v->max, 1, &known) : NULL;
		omp_set_num_threads(n);
		if (split) {
			char s0[96];
			v->c->host->log(KILN_LOG_DEBUG, "cpu", "GEMM %s split for a busy team: %s%s",
					cpu_desc_str(&p->op.in[0], s0, sizeof s0),
					b ? "the same bytes, runs while the team is shrunk"
					  : "other bytes (or no version): not split",
					known ? " (probed before)" : " (probed)");
		}
		if (b)
			__atomic_store_n(&v->busy, b, __ATOMIC_RELEASE);
		else
			__atomic_store_n(&v->busy_none, 1, __ATOMIC_RELAXED);
	}
	q = v->busy;
	pthread_mutex_unlock(&v->lock);
	return q;
}

const struct cpu_plan *cpu_variant(const struct cpu_plan *p)
{
	struct cpu_variants *v = p->variants;
	if (!v) {
		/* a version itself, a team that never changes, or a small op */
		if (cpu_op_one_thread(&p->op) && omp_get_max_threads() != 1)
			omp_set_num_threads(1);
		return p;
	}
	/* a busy team: a GEMM's parts, run by this thread and a helper that
	 * never holds it (split.c), rather than one thread alone */
	if (p->gemm && cpu_team_busy(&v->c->team)) {
		const struct cpu_plan *q = busy_version(v, p);
		if (q)
			return q; /* its kernel sets the count its parts run with */
	}
	int n = cpu_team_dnn(&v->c->team);
	const struct cpu_plan *run = p;
	if (n >= 1 && n < v->max && !__atomic_load_n(&v->bad[n], __ATOMIC_RELAXED)) {
		const struct cpu_plan *q = __atomic_load_n(&v->alt[n], __ATOMIC_ACQUIRE);
		if (!q) {
			pthread_mutex_lock(&v->lock);
			if (!v->alt[n] && !v->bad[n])
				make_version(v, p, n);
			q = v->alt[n];
			pthread_mutex_unlock(&v->lock);
		}
		if (q)
			run = q;
	}
	if (run == p)
		n = v->max;
	/* oneDNN's GEMM reads the count when it runs */
	if (omp_get_max_threads() != n)
		omp_set_num_threads(n);
	return run;
}
