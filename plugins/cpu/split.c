/* plugins/cpu/split.c - the helpers that run the parts of a split GEMM
 * beside the calling thread, and never make it wait for a late one.
 *
 * Why: an OpenMP region ends when every thread of its team has arrived.
 * With another process busy on one of the two cores, kiln's second thread
 * is off its CPU for a time slice (milliseconds) at a time, and a GEMM of
 * 0.1-0.5 ms then waits for it: the adaptive team (threads.c) shrinks to
 * one thread and the half core the busy CPU still gives is lost.
 *
 * Here the calling thread (the master) publishes a job of n parts, wakes
 * the helpers and takes parts itself; a helper takes the next part not yet
 * taken.  A helper computes its part into a buffer of its own and copies
 * it into the output only if the master has not taken the part back: once
 * no part is left to take, the master waits about one part's time for the
 * helpers' parts, then runs each one still unfinished itself, straight
 * into the output.  So the master never waits longer than a part for a
 * descheduled helper, and a helper that wakes up late finds its part taken
 * and drops its copy (a part's bytes are the same whoever runs it: the
 * same primitive on the same inputs).
 *
 * A late helper may still be reading the inputs after the master has
 * returned; every device free and plan free first waits for the helpers
 * to be between parts (cpu_split_quiesce), so what it reads stays mapped.
 *
 * The job word packs the job's generation (high 32 bits) and the next part
 * to take (low 32): a helper takes part k with one compare-and-swap of
 * (gen, k) -> (gen, k + 1), which fails once the master has published a
 * newer job.  A part's state packs the generation too.
 */
#define _GNU_SOURCE
#include "cpu.h"

#include <errno.h>
#include <omp.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <time.h>
#include <unistd.h>

enum { PART_PENDING = 1, PART_STOLEN, PART_COMMITTING, PART_DONE };

struct cpu_split_pool {
	int n_help;
	pthread_t th[CPU_POOL_MAX];
	void *buf[CPU_POOL_MAX]; /* each helper's output copy and scratchpad */
	size_t buf_bytes;
	pthread_mutex_t lock;    /* one job at a time (trylock; else the caller runs it alone) */
	uint64_t word;           /* gen << 32 | next part (atomic) */
	uint32_t gen32;          /* the futex the helpers sleep on: the generation */
	int sleepers;            /* helpers asleep on gen32 (atomic) */
	int busy;                /* helpers inside a part (atomic) */
	int stop;                /* close: the helpers exit (atomic) */
	long late_us;            /* the test hook $KILN_CPU_POOL_LATE_US: a helper
				  * sleeps this long in each part it takes, and
				  * the caller lets a helper take the first */
	struct cpu_job job[2];   /* by generation parity (fields read atomically) */
	uint64_t *state;         /* [CPU_POOL_PARTS]: gen << 8 | PART_* (atomic) */
};

static long futex(uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, addr, op, val, NULL, NULL, 0);
}

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* A helper's copy of the job of generation gen (it may be stale: the
 * caller's compare-and-swap on the word tells). */
static void job_load(const struct cpu_split_pool *P, uint32_t gen, struct cpu_job *j)
{
	const struct cpu_job *s = &P->job[gen & 1];
	j->run = __atomic_load_n(&s->run, __ATOMIC_RELAXED);
	j->commit = __atomic_load_n(&s->commit, __ATOMIC_RELAXED);
	j->n = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
	for (int i = 0; i < CPU_JOB_ARGS; i++)
		j->arg[i] = __atomic_load_n(&s->arg[i], __ATOMIC_RELAXED);
}

/* Take the next part of generation gen: its index, or -1 when none is
 * left or a newer job has been published. */
static int take(struct cpu_split_pool *P, uint32_t gen, int n)
{
	uint64_t v = __atomic_load_n(&P->word, __ATOMIC_ACQUIRE);
	for (;;) {
		if ((uint32_t)(v >> 32) != gen || (int)(uint32_t)v >= n)
			return -1;
		if (__atomic_compare_exchange_n(&P->word, &v, v + 1, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return (int)(uint32_t)v;
	}
}

/* One helper's parts of the job of generation gen. */
static void help(struct cpu_split_pool *P, int slot, uint32_t gen)
{
	struct cpu_job j;
	job_load(P, gen, &j);
	for (;;) {
		__atomic_add_fetch(&P->busy, 1, __ATOMIC_SEQ_CST);
		const int k = take(P, gen, j.n);
		if (k < 0) {
			__atomic_sub_fetch(&P->busy, 1, __ATOMIC_RELEASE);
			return;
		}
		if (P->late_us) /* the test hook: a helper descheduled in its part */
			usleep((useconds_t)P->late_us);
		const int ok = j.run(&j, slot, k, P->buf[slot - 1]) == 0;
		uint64_t want = (uint64_t)gen << 8 | PART_PENDING;
		if (ok && __atomic_compare_exchange_n(&P->state[k], &want,
						      (uint64_t)gen << 8 | PART_COMMITTING, 0,
						      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			j.commit(&j, k, P->buf[slot - 1]);
			__atomic_store_n(&P->state[k], (uint64_t)gen << 8 | PART_DONE, __ATOMIC_RELEASE);
		}
		/* else the master took it back (or a failed run: the master
		 * runs it and reports) */
		__atomic_sub_fetch(&P->busy, 1, __ATOMIC_RELEASE);
	}
}

struct helper_arg {
	struct cpu_split_pool *P;
	int slot;
	uint32_t seen; /* the generation when it was made: it helps with the next */
};

static void *helper_main(void *arg)
{
	struct helper_arg a = *(struct helper_arg *)arg;
	free(arg);
	struct cpu_split_pool *P = a.P;
	prctl(PR_SET_NAME, "kiln-gemm-split");
	omp_set_num_threads(1); /* oneDNN's GEMM reads it: one thread a part */
	uint32_t seen = a.seen;
	while (!__atomic_load_n(&P->stop, __ATOMIC_ACQUIRE)) {
		/* spin a little (the next GEMM of a step comes within tens
		 * of microseconds), then sleep */
		uint32_t g = __atomic_load_n(&P->gen32, __ATOMIC_ACQUIRE);
		const int64_t t0 = mono_ns();
		for (int i = 1; g == seen; i++) {
			relax();
			g = __atomic_load_n(&P->gen32, __ATOMIC_ACQUIRE);
			if (!(i & 63) && mono_ns() - t0 > CPU_POOL_SPIN_NS)
				break;
		}
		if (g == seen) {
			__atomic_add_fetch(&P->sleepers, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&P->gen32, __ATOMIC_SEQ_CST) == seen &&
			    !__atomic_load_n(&P->stop, __ATOMIC_SEQ_CST))
				futex(&P->gen32, FUTEX_WAIT_PRIVATE, seen);
			__atomic_sub_fetch(&P->sleepers, 1, __ATOMIC_SEQ_CST);
			continue;
		}
		seen = g;
		help(P, a.slot, g);
	}
	return NULL;
}

/* Each helper's buffer to at least `bytes` (no late helper still in a
 * part), and the helpers made (threads - 1).  Under P->lock. */
static kiln_status grow(struct cpu_ctx *c, struct cpu_split_pool *P, size_t bytes)
{
	if (bytes > P->buf_bytes) {
		cpu_split_quiesce(c);
		for (int i = 0; i < P->n_help; i++) {
			void *b = cpu_huge_alloc(4096, bytes);
			if (!b)
				return c->host->error(KILN_ENOMEM, "cpu: out of memory for the GEMM helpers (%zu bytes)",
						      bytes);
			cpu_huge_free(P->buf[i]);
			P->buf[i] = b;
		}
		P->buf_bytes = bytes;
	}
	const int want = c->threads - 1 < CPU_POOL_MAX ? c->threads - 1 : CPU_POOL_MAX;
	while (P->n_help < want) {
		struct helper_arg *a = malloc(sizeof *a);
		void *b = a ? cpu_huge_alloc(4096, P->buf_bytes ? P->buf_bytes : 4096) : NULL;
		if (!b) {
			free(a);
			return c->host->error(KILN_ENOMEM, "cpu: out of memory for the GEMM helpers");
		}
		P->buf[P->n_help] = b;
		*a = (struct helper_arg){ P, P->n_help + 1, __atomic_load_n(&P->gen32, __ATOMIC_ACQUIRE) };
		if (pthread_create(&P->th[P->n_help], NULL, helper_main, a)) {
			free(a);
			cpu_huge_free(b);
			P->buf[P->n_help] = NULL;
			break; /* fewer helpers: the caller runs more parts */
		}
		P->n_help++;
	}
	return KILN_OK;
}

kiln_status cpu_split_reserve(struct cpu_ctx *c, size_t bytes)
{
	struct cpu_split_pool *P = c->pool;
	if (c->threads < 2)
		return KILN_OK;
	if (!P) {
		P = calloc(1, sizeof *P);
		if (!P || !(P->state = calloc(CPU_POOL_PARTS, sizeof *P->state))) {
			if (P)
				free(P);
			return c->host->error(KILN_ENOMEM, "cpu: out of memory for the GEMM helpers");
		}
		pthread_mutex_init(&P->lock, NULL);
		const char *late = getenv("KILN_CPU_POOL_LATE_US");
		P->late_us = late ? atol(late) : 0;
		c->pool = P;
	}
	bytes = (bytes + 4095) / 4096 * 4096;
	/* no job meanwhile (another stream's GEMM runs alone) */
	pthread_mutex_lock(&P->lock);
	kiln_status st = grow(c, P, bytes);
	pthread_mutex_unlock(&P->lock);
	return st;
}

void cpu_split_quiesce(struct cpu_ctx *c)
{
	struct cpu_split_pool *P = c->pool;
	if (!P)
		return;
	while (__atomic_load_n(&P->busy, __ATOMIC_ACQUIRE))
		sched_yield();
}

void cpu_split_destroy(struct cpu_ctx *c)
{
	struct cpu_split_pool *P = c->pool;
	if (!P)
		return;
	__atomic_store_n(&P->stop, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&P->gen32, 1, __ATOMIC_SEQ_CST);
	futex(&P->gen32, FUTEX_WAKE_PRIVATE, INT32_MAX);
	for (int i = 0; i < P->n_help; i++) {
		pthread_join(P->th[i], NULL);
		cpu_huge_free(P->buf[i]);
	}
	pthread_mutex_destroy(&P->lock);
	free(P->state);
	free(P);
	c->pool = NULL;
}

/* Every part on the calling thread, in order. */
static int run_alone(const struct cpu_job *j)
{
	int bad = 0;
	for (int k = 0; k < j->n; k++)
		if (j->run(j, 0, k, NULL))
			bad = 1;
	return bad;
}

int cpu_split_run(struct cpu_ctx *c, const struct cpu_job *job)
{
	struct cpu_split_pool *P = c->pool;
	if (!P || !P->n_help || job->n > CPU_POOL_PARTS || pthread_mutex_trylock(&P->lock))
		return run_alone(job);
	const uint32_t gen = (uint32_t)(__atomic_load_n(&P->word, __ATOMIC_RELAXED) >> 32) + 1;
	struct cpu_job *s = &P->job[gen & 1];
	__atomic_store_n(&s->run, job->run, __ATOMIC_RELAXED);
	__atomic_store_n(&s->commit, job->commit, __ATOMIC_RELAXED);
	__atomic_store_n(&s->n, job->n, __ATOMIC_RELAXED);
	for (int i = 0; i < CPU_JOB_ARGS; i++)
		__atomic_store_n(&s->arg[i], job->arg[i], __ATOMIC_RELAXED);
	for (int k = 0; k < job->n; k++)
		__atomic_store_n(&P->state[k], (uint64_t)gen << 8 | PART_PENDING, __ATOMIC_RELAXED);
	__atomic_store_n(&P->word, (uint64_t)gen << 32, __ATOMIC_RELEASE);
	__atomic_store_n(&P->gen32, gen, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&P->sleepers, __ATOMIC_SEQ_CST))
		futex(&P->gen32, FUTEX_WAKE_PRIVATE, INT32_MAX);

	if (P->late_us) { /* the test hook: an idle helper takes the first part */
		const int64_t t0 = mono_ns();
		while (!(uint32_t)__atomic_load_n(&P->word, __ATOMIC_ACQUIRE) &&
		       !__atomic_load_n(&P->busy, __ATOMIC_ACQUIRE) && mono_ns() - t0 < 1000000000)
			sched_yield();
	}
	int bad = 0, k;
	int64_t part_ns = 0;
	while ((k = take(P, gen, job->n)) >= 0) {
		const int64_t t0 = mono_ns();
		if (job->run(job, 0, k, NULL))
			bad = 1;
		__atomic_store_n(&P->state[k], (uint64_t)gen << 8 | PART_DONE, __ATOMIC_RELEASE);
		part_ns = mono_ns() - t0;
	}
	/* The helpers' parts: wait about one part's time (the last one the
	 * master ran) for each, then take it back. */
	const int64_t until = mono_ns() + part_ns;
	for (k = 0; k < job->n; k++) {
		uint64_t v;
		for (int spins = 1;; spins++) {
			v = __atomic_load_n(&P->state[k], __ATOMIC_ACQUIRE);
			if (v == ((uint64_t)gen << 8 | PART_DONE))
				break;
			uint64_t want = (uint64_t)gen << 8 | PART_PENDING;
			if (v == want && mono_ns() >= until &&
			    __atomic_compare_exchange_n(&P->state[k], &want,
							(uint64_t)gen << 8 | PART_STOLEN, 0,
							__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
				if (job->run(job, 0, k, NULL))
					bad = 1;
				break;
			}
			/* pending and young, or being copied in: a helper
			 * descheduled while it copies needs this CPU */
			if (spins % 4096)
				relax();
			else
				sched_yield();
		}
	}
	pthread_mutex_unlock(&P->lock);
	return bad;
}

/* ---- thread-affine spans (cpu.h) ----------------------------------------- */

struct affine_hint {
	uintptr_t at; /* 0: free */
	int64_t n;
	int T;
	int64_t cut[CPU_AFFINE_T + 1];
};

static struct {
	pthread_mutex_t lock;
	struct affine_hint h[CPU_AFFINE_HINTS];
	int next; /* the slot a new range takes when none is free */
} affine = { PTHREAD_MUTEX_INITIALIZER, { { 0 } }, 0 };

int cpu_affine_on(void)
{
	static int on = -1;
	int v = __atomic_load_n(&on, __ATOMIC_RELAXED);
	if (v < 0) {
		const char *s = getenv("KILN_CPU_AFFINE");
		v = s && !strcmp(s, "1");
		__atomic_store_n(&on, v, __ATOMIC_RELAXED);
	}
	return v;
}

void cpu_affine_note(const float *at, int64_t n, int T, const int64_t *cut)
{
	const uintptr_t a = (uintptr_t)at, z = a + (uintptr_t)n * sizeof(float);
	if (T < 2 || T > CPU_AFFINE_T || n <= 0)
		return;
	pthread_mutex_lock(&affine.lock);
	int slot = -1;
	/* the same range again (every step): refresh it; a range it overlaps
	 * (memory reused by another tensor) is dropped */
	for (int i = 0; i < CPU_AFFINE_HINTS; i++) {
		struct affine_hint *h = &affine.h[i];
		if (!h->at)
			continue;
		if (h->at == a && h->n == n) {
			slot = i;
			continue;
		}
		if (h->at < z && a < h->at + (uintptr_t)h->n * sizeof(float))
			h->at = 0;
	}
	for (int i = 0; slot < 0 && i < CPU_AFFINE_HINTS; i++)
		if (!affine.h[i].at)
			slot = i;
	if (slot < 0) {
		slot = affine.next;
		affine.next = (affine.next + 1) % CPU_AFFINE_HINTS;
	}
	struct affine_hint *h = &affine.h[slot];
	if (h->at != a || h->n != n || h->T != T || memcmp(h->cut, cut, (size_t)(T + 1) * sizeof *cut)) {
		h->at = a;
		h->n = n;
		h->T = T;
		memcpy(h->cut, cut, (size_t)(T + 1) * sizeof *cut);
	}
	pthread_mutex_unlock(&affine.lock);
}

/* Thread t of T's even share of [b0, e0) (CPU_SPANS's rule, 16-element
 * boundaries): appended to b, e at *k when not empty. */
static void even_share(int64_t b0, int64_t e0, int t, int T, int64_t *b, int64_t *e, int *k)
{
	const int64_t n = e0 - b0;
	const int64_t x = t ? b0 + ((n * t / T) & ~(int64_t)15) : b0;
	const int64_t y = t + 1 == T ? e0 : b0 + ((n * (t + 1) / T) & ~(int64_t)15);
	if (y > x) {
		b[*k] = x;
		e[*k] = y;
		(*k)++;
	}
}

void cpu_affine_take(const float *base, int64_t n, struct cpu_affine_snap *s)
{
	const uintptr_t a = (uintptr_t)base, z = a + (uintptr_t)n * sizeof(float);
	s->n = n;
	s->nh = 0;
	if (!cpu_affine_on())
		return;
	pthread_mutex_lock(&affine.lock);
	/* the hints inside the buffer, at whole elements from base, in
	 * address order (the table's ranges never overlap) */
	for (int i = 0; i < CPU_AFFINE_HINTS; i++) {
		const struct affine_hint *h = &affine.h[i];
		if (!h->at || h->at < a || h->at + (uintptr_t)h->n * sizeof(float) > z ||
		    (h->at - a) % sizeof(float))
			continue;
		const int64_t o = (int64_t)((h->at - a) / sizeof(float));
		int j = s->nh++;
		for (; j > 0 && s->h[j - 1].off > o; j--)
			s->h[j] = s->h[j - 1];
		s->h[j].off = o;
		s->h[j].n = h->n;
		s->h[j].T = h->T;
		memcpy(s->h[j].cut, h->cut, sizeof h->cut);
	}
	pthread_mutex_unlock(&affine.lock);
}

int cpu_affine_spans(const struct cpu_affine_snap *s, int64_t n, int t, int T, int64_t *b,
		     int64_t *e)
{
	int k = 0;
	int64_t at = 0;
	if (!s) {
		even_share(0, n, t, T, b, e, &k);
		return k;
	}
	/* thread t's part of each hint of a team of T, and an even share of
	 * each gap between them (the other hints' elements included) */
	for (int j = 0; j <= s->nh; j++) {
		if (j < s->nh && s->h[j].T != T)
			continue;
		const int64_t gap_end = j < s->nh ? s->h[j].off : s->n;
		if (gap_end > at)
			even_share(at, gap_end, t, T, b, e, &k);
		if (j == s->nh)
			break;
		const int64_t x = s->h[j].off + s->h[j].cut[t], y = s->h[j].off + s->h[j].cut[t + 1];
		if (y > x) {
			b[k] = x;
			e[k] = y;
			k++;
		}
		at = s->h[j].off + s->h[j].n;
	}
	return k;
}
