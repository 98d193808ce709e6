/* core/loader.c - worker threads and the staging ring; see loader.h. */
#include "loader.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c */

#include <errno.h>
#include <pthread.h>
#include <sched.h> /* sched_getaffinity, CPU_COUNT (build-config.h: _GNU_SOURCE) */
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <sys/resource.h> /* getrusage(RUSAGE_THREAD): whether a fill blocked */
#include <time.h>
#include <unistd.h>

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY, SLOT_TAKEN };

/* The consumer-fill rule (loader.h, kiln_loader_stats): watched over the
 * batches handed out from the RULE_FROM-th of a start (the first ones read
 * a cold data set) to RULE_FROM + RULE_BATCHES, a fill must cost at most
 * RULE_SHARE of the median time between two batches in CPU and never
 * block.  The window starts again at each kiln_loader_start, and the
 * median leaves out a pause inside it (a checkpoint, a log): a loader
 * that serves evaluations of 8 batches, 200 ms of training apart, took
 * their mean gap for 25 ms and filled on the training thread, while the
 * consumer waited ~21 us a batch for data (session 45's review). */
#define RULE_FROM 4
#define RULE_BATCHES 16
#define RULE_SHARE 0.10

struct slot {
	int state;
	int64_t batch;          /* which batch it holds (or is filling) */
	int64_t rows;
	void *x;                /* host staging: rows * sample_bytes */
	int32_t *y;
	void *copied;           /* event: the device copy out of it is done */
	int copy_pending;       /* a copy was enqueued since the last fill */
	kiln_status st;         /* a worker's failure */
	int64_t skipped;        /* bad samples its fill replaced */
	char msg[KILN_ERROR_MAX]; /* its message (errors are per thread) */
};

struct kiln_loader {
	struct kiln_device *dev;
	struct kiln_dataset *d;
	size_t sample_bytes;
	int n_slots, n_workers;
	struct slot *slots;
	pthread_t *threads;
	int started;            /* threads created */
	pthread_mutex_t lock;
	pthread_cond_t work;    /* workers wait on it: a slot to fill, or stop */
	pthread_cond_t ready;   /* the consumer waits on it: a batch filled */
	int stop;
	double wait_s;          /* consumer time in kiln_loader_next */
	int64_t skipped;        /* the taken batches' slot->skipped, summed */
	/* the consumer-fill rule: may_inline is set at open (a device of host
	 * memory and no CPU left for a worker), inline_fill while the rule's
	 * windows measure a fill cheap, rule_done once it went back to the
	 * workers (for good); share is RULE_SHARE (a test's hook: loader_open);
	 * rule_k counts the batches handed out since the start, and mark_* is
	 * the window's account: the last batch's time, the gaps between
	 * batches, the fills (the workers' or the consumer's) and their cost */
	int may_inline, inline_fill, rule_done;
	double share;
	struct kiln_data_scratch scr; /* the consumer's, for its own fills */
	int64_t rule_k;
	double mark_t;
	int n_gaps;
	double gaps[RULE_BATCHES];
	int64_t mark_fills, mark_blocked;
	double mark_cpu_s;
	struct kiln_loader_stats stats;
	/* the epoch */
	int64_t epoch;
	const int64_t *order;
	int64_t n, batch, n_batches;
	int64_t next_claim, next_take;
};

static long probe_cpus(void);

/* Whether the consumer-fill rule may apply: on a device of host memory
 * (the CPU) whose compute threads take every CPU of the affinity mask
 * ([run] threads = 0, or as many), a worker has no CPU of its own: each
 * wake-up preempts a compute thread, and the team waits for it at its next
 * barrier (0.10-0.14 ms a step of the MLP's 1.6 ms, `perf sched`; at
 * times a whole 3 ms slice).  With a CPU to spare the workers cost the step
 * nothing and keep it.  Nor where the training thread is not a compute
 * thread: a data-parallel rank or a [run] devices pipeline, whose CPU
 * streams are async by default (kiln_device_alone), or a process whose
 * streams have workers of their own for another reason (an explicit
 * [plugin.cpu] async = 1: kiln_device_streams_async; before session 48
 * the rule did not see it and had the training thread fill beside them). */
static int may_fill_inline(struct kiln_device *dev)
{
	if (!(kiln_device_traits(dev)->caps & KILN_DEVICE_HOST_MEMORY) || !kiln_device_alone(dev) ||
	    kiln_device_streams_async(dev) == 1)
		return 0;
	const int threads = kiln_device_threads(dev);
	return threads <= 0 || threads >= probe_cpus();
}

/* Claim batch b into its free slot s (the lock held): whether a copy out
 * of the slot is still to be waited for. */
static int claim(struct kiln_loader *L, struct slot *s, int64_t b)
{
	L->next_claim++;
	s->state = SLOT_FILLING;
	s->batch = b;
	s->rows = L->n - b * L->batch < L->batch ? L->n - b * L->batch : L->batch;
	const int pending = s->copy_pending;
	s->copy_pending = 0;
	return pending;
}

static double thread_cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The times this thread blocked (it gave up its CPU: a lock, a read from
 * disk) or waited for a page from disk. */
static long thread_blocks(void)
{
	struct rusage ru;
	return getrusage(RUSAGE_THREAD, &ru) ? 0 : ru.ru_nvcsw + ru.ru_majflt;
}

/* A worker's fill, measured for the consumer-fill rule: its CPU time and
 * whether it blocked. */
struct fill_cost {
	double cpu_s;
	long blocks;
};

/* Fill claimed slot s with batch b (the lock not held; a worker's or the
 * consumer's scratch; cost NULL or measured): its status, and the
 * failure's message in s->msg. */
static kiln_status fill(struct kiln_loader *L, struct slot *s, int64_t b, int pending,
			struct kiln_data_scratch *scr, struct fill_cost *cost)
{
	/* the previous copy out of this slot must have finished (an
	 * event on the copy stream), or on a device of host memory the
	 * step that read the slot in place (on compute: train_step.c) */
	kiln_status st = pending ? kiln_device_staging_wait(L->dev, s->copied) : KILN_OK;
	const int64_t skipped0 = scr->skipped;
	if (!st) {
		const double c0 = cost ? thread_cpu_s() : 0;
		const long k0 = cost ? thread_blocks() : 0;
		st = kiln_dataset_read_rows(L->d, L->epoch, L->order + b * L->batch, s->rows, s->x,
					    s->y, scr);
		if (cost) {
			cost->cpu_s = thread_cpu_s() - c0;
			cost->blocks = thread_blocks() - k0;
		}
	}
	if (st)
		snprintf(s->msg, sizeof s->msg, "%s", kiln_last_error());
	s->skipped = scr->skipped - skipped0;
	return st;
}

/* Slot s filled with status st at `cost` (the lock held): ready for the
 * consumer, the cost in the rule's window. */
static void filled(struct kiln_loader *L, struct slot *s, kiln_status st,
		   const struct fill_cost *cost)
{
	L->mark_fills++;
	L->mark_cpu_s += cost->cpu_s;
	L->mark_blocked += cost->blocks > 0;
	s->st = st;
	s->state = SLOT_READY;
	pthread_cond_broadcast(&L->ready);
}

static void *worker(void *arg)
{
	struct kiln_loader *L = arg;
	struct kiln_data_scratch scr;
	prctl(PR_SET_NAME, "kiln-loader");
	memset(&scr, 0, sizeof scr);
	pthread_mutex_lock(&L->lock);
	for (;;) {
		struct slot *s = NULL;
		int64_t b = 0;
		while (!L->stop) {
			if (!L->inline_fill && L->next_claim < L->n_batches) {
				b = L->next_claim;
				s = &L->slots[b % L->n_slots];
				if (s->state == SLOT_FREE)
					break;
			}
			s = NULL;
			pthread_cond_wait(&L->work, &L->lock);
			L->stats.wakeups++;
		}
		if (L->stop)
			break;
		const int pending = claim(L, s, b);
		pthread_mutex_unlock(&L->lock);

		struct fill_cost cost = { 0, 0 };
		const kiln_status st = fill(L, s, b, pending, &scr, &cost);

		pthread_mutex_lock(&L->lock);
		L->stats.worker_fills++;
		L->stats.fill_cpu_s += cost.cpu_s;
		filled(L, s, st, &cost);
	}
	pthread_mutex_unlock(&L->lock);
	kiln_data_scratch_free(&scr);
	return NULL;
}

kiln_status kiln_loader_open(struct kiln_device *dev, struct kiln_dataset *d, int64_t max_rows,
			     int workers, int prefetch, struct kiln_loader **out)
{
	kiln_status st = KILN_OK;
	struct kiln_loader *L = calloc(1, sizeof *L);
	*out = NULL;
	if (!L)
		return kiln_error(KILN_ENOMEM, "out of memory");
	L->dev = dev;
	L->d = d;
	L->sample_bytes = d->sample_bytes;
	size_t sample_bytes = d->sample_bytes;
	L->n_workers = workers < 1 ? 1 : workers;
	/* every worker busy on one batch, `prefetch` more ready ahead */
	L->n_slots = L->n_workers + (prefetch < 1 ? 1 : prefetch);
	pthread_mutex_init(&L->lock, NULL);
	pthread_cond_init(&L->work, NULL);
	pthread_cond_init(&L->ready, NULL);
	L->may_inline = may_fill_inline(dev);
	/* tests/loader_consumer.sh's hook: a share any fill that does not
	 * block meets, so that its counts do not depend on the machine's
	 * ratio of a step to a fill */
	const char *share = getenv("KILN_TEST_LOADER_SHARE");
	L->share = share && *share ? atof(share) : RULE_SHARE;
	L->slots = calloc((size_t)L->n_slots, sizeof *L->slots);
	L->threads = calloc((size_t)L->n_workers, sizeof *L->threads);
	if (!L->slots || !L->threads) {
		st = kiln_error(KILN_ENOMEM, "the loader's %d slots: out of memory", L->n_slots);
		goto fail;
	}
	for (int i = 0; i < L->n_slots; i++) {
		struct slot *s = &L->slots[i];
		const size_t xb = (size_t)max_rows * sample_bytes, yb = (size_t)max_rows * d->label_bytes;
		if ((st = kiln_device_host_alloc(dev, xb, &s->x)) ||
		    (st = kiln_device_host_alloc(dev, yb, (void **)&s->y))) {
			/* which buffer, and the ring's whole size (it was "cpu:
			 * alloc of 401408 bytes failed" alone) */
			kiln_error_wrap(st, "the loader's staging slot %d of %d (a batch of %lld samples and labels, %zu bytes; the ring of [data] workers + prefetch slots %s)",
					i + 1, L->n_slots, (long long)max_rows, xb + yb,
					kiln_bytes_str((char[32]){ 0 }, 32, (double)(xb + yb) * L->n_slots));
			goto fail;
		}
		if ((st = kiln_device_event_create(dev, &s->copied)))
			goto fail;
	}
	for (int i = 0; i < L->n_workers; i++) {
		int rc = pthread_create(&L->threads[i], NULL, worker, L);
		if (rc) {
			/* EAGAIN: ulimit -u (threads count as processes) */
			st = kiln_error(KILN_EINTERNAL, "cannot start loader worker %d of %d: %s%s", i,
					L->n_workers, strerror(rc),
					rc == EAGAIN ? " (the limit on processes and threads, ulimit -u, or on memory)" : "");
			goto fail;
		}
		L->started++;
	}
	*out = L;
	return KILN_OK;
fail:
	kiln_loader_close(L);
	return st;
}

kiln_status kiln_loader_start(struct kiln_loader *L, int64_t epoch, const int64_t *order,
			      int64_t n, int64_t batch, int keep_last)
{
	pthread_mutex_lock(&L->lock);
	if (L->next_take < L->n_batches) {
		pthread_mutex_unlock(&L->lock);
		return kiln_error(KILN_EINTERNAL, "loader: a new epoch before the last one was consumed");
	}
	L->epoch = epoch;
	L->order = order;
	L->n = n;
	L->batch = batch;
	L->n_batches = keep_last ? (n + batch - 1) / batch : n / batch;
	L->next_claim = L->next_take = 0;
	/* the rule's window starts again: the time since the last batch
	 * was an evaluation, a checkpoint or the epoch's end */
	L->rule_k = 0;
	L->n_gaps = 0;
	if (!L->inline_fill)
		pthread_cond_broadcast(&L->work);
	pthread_mutex_unlock(&L->lock);
	return KILN_OK;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The rule's window at a batch handed out (the lock held): 1 when it holds
 * RULE_BATCHES gaps, the batches RULE_FROM .. RULE_FROM + RULE_BATCHES of
 * a start (or as many after the last window) and *gap their median. */
static int rule_window(struct kiln_loader *L, double *gap)
{
	const double now = kiln_now_s();
	if (++L->rule_k < RULE_FROM)
		return 0;
	if (L->rule_k > RULE_FROM)
		L->gaps[L->n_gaps++] = now - L->mark_t;
	L->mark_t = now;
	if (L->rule_k == RULE_FROM) {
		/* the window's account starts here (the next window's at
		 * rule_note_take) */
		L->mark_fills = L->mark_blocked = 0;
		L->mark_cpu_s = 0;
	}
	if (L->n_gaps < RULE_BATCHES)
		return 0;
	qsort(L->gaps, RULE_BATCHES, sizeof L->gaps[0], cmp_double);
	*gap = 0.5 * (L->gaps[RULE_BATCHES / 2 - 1] + L->gaps[RULE_BATCHES / 2]);
	L->n_gaps = 0;
	return 1;
}

/* What the rule saw in a window, for its debug line (logged after the
 * lock is let go). */
struct rule_seen {
	int decided;
	double cpu, gap;
	int64_t blocked, fills;
	int inline_fill;
};

/* The consumer-fill rule, at each batch handed out (the lock held): over a
 * window of RULE_BATCHES batches, the fills against the median time
 * between two batches.  The first window chooses: the workers go on (for
 * good), or the consumer fills; then every window after checks the
 * consumer's fills (measured the same way, on its thread), going back to
 * the workers for good when one blocked or cost more than the share. */
static void rule_note_take(struct kiln_loader *L, struct rule_seen *seen)
{
	const int64_t k = ++L->stats.taken;
	double gap = 0;
	seen->decided = 0;
	if (!L->may_inline || L->rule_done || !rule_window(L, &gap))
		return;
	/* the window's account, read and then reset for the next window */
	const int64_t fills = L->mark_fills, blocked = L->mark_blocked;
	const double cpu = fills ? L->mark_cpu_s / (double)fills : 0;
	const int cheap = fills >= RULE_BATCHES / 2 && !blocked && cpu <= L->share * gap;
	L->mark_fills = L->mark_blocked = 0;
	L->mark_cpu_s = 0;
	L->stats.rule_fill_s = cpu;
	L->stats.rule_gap_s = gap;
	if (cheap && L->inline_fill)
		return; /* the consumer fills on */
	*seen = (struct rule_seen){ 1, cpu, gap, blocked, fills, cheap };
	if (cheap) {
		L->inline_fill = 1;
		L->stats.inline_from = k;
		return;
	}
	/* the workers fill (again), for good: the rule has ended */
	L->rule_done = 1;
	if (L->inline_fill) {
		L->inline_fill = 0;
		L->stats.workers_from = k;
		pthread_cond_broadcast(&L->work);
	}
}

static void rule_log(const struct rule_seen *r)
{
	if (!r->decided)
		return;
	kiln_log(KILN_LOG_DEBUG, "data",
		 "loader: a batch's fill took %.1f us of CPU (%lld of %lld fills blocked), %.1f%% of the %.1f us between batches (median): %s",
		 1e6 * r->cpu, (long long)r->blocked, (long long)r->fills,
		 r->gap > 0 ? 100 * r->cpu / r->gap : 0, 1e6 * r->gap,
		 r->inline_fill ? "the training thread fills the batches from now on"
				: "the workers go on");
}

/* Before the training thread fills free slot s with batch b (the lock
 * held): s takes the buffers of the slot of batch b - 1 when that one is
 * free, as it is once the step that read it in place is done, and gives
 * it its own.  Those lines were read by that step and are still in the
 * cores' caches; s's own, last read n_slots batches ago, were not, and
 * the fill's stores waited on memory to own them (a batch of the MLP:
 * 401 KB; session 49).  Each buffer keeps its event, so a fill still
 * waits for the step that read it. */
static void take_warm_buffers(struct kiln_loader *L, struct slot *s, int64_t b)
{
	struct slot *p = &L->slots[(b + L->n_slots - 1) % L->n_slots];
	if (p == s || p->state != SLOT_FREE)
		return;
	void *x = s->x, *ev = s->copied;
	int32_t *y = s->y;
	const int pending = s->copy_pending;
	s->x = p->x, s->y = p->y, s->copied = p->copied, s->copy_pending = p->copy_pending;
	p->x = x, p->y = y, p->copied = ev, p->copy_pending = pending;
}

kiln_status kiln_loader_next(struct kiln_loader *L, const void **x, const int32_t **y,
			     int64_t *rows, int *slot)
{
	pthread_mutex_lock(&L->lock);
	if (L->next_take >= L->n_batches) {
		pthread_mutex_unlock(&L->lock);
		return kiln_error(KILN_EINTERNAL, "loader: no batch left in this epoch");
	}
	int64_t b = L->next_take;
	struct slot *s = &L->slots[b % L->n_slots];
	if (!(s->state == SLOT_READY && s->batch == b)) {
		double t0 = kiln_now_s();
		while (!(s->state == SLOT_READY && s->batch == b)) {
			if (L->inline_fill && L->next_claim == b && s->state == SLOT_FREE) {
				/* the rule's choice: fill it here, with no
				 * worker to wake (counted as data wait) */
				take_warm_buffers(L, s, b);
				const int pending = claim(L, s, b);
				pthread_mutex_unlock(&L->lock);
				struct fill_cost cost = { 0, 0 };
				const kiln_status fst = fill(L, s, b, pending, &L->scr, &cost);
				pthread_mutex_lock(&L->lock);
				L->stats.inline_fills++;
				L->stats.inline_cpu_s += cost.cpu_s;
				filled(L, s, fst, &cost);
				break;
			}
			pthread_cond_wait(&L->ready, &L->lock);
		}
		L->wait_s += kiln_now_s() - t0;
	}
	kiln_status st = s->st;
	s->state = SLOT_TAKEN;
	L->next_take++;
	L->skipped += s->skipped;
	struct rule_seen seen;
	rule_note_take(L, &seen);
	pthread_mutex_unlock(&L->lock);
	rule_log(&seen);
	if (st)
		return kiln_error(st, "%s", s->msg);
	*x = s->x;
	*y = s->y;
	*rows = s->rows;
	*slot = (int)(b % L->n_slots);
	return KILN_OK;
}

kiln_status kiln_loader_release(struct kiln_loader *L, int slot, void *stream)
{
	struct slot *s = &L->slots[slot];
	/* recorded after the copies (or in-place reads) out of the slot: a
	 * worker refilling it waits for this event */
	kiln_status st = kiln_device_event_record(L->dev, s->copied, stream);
	pthread_mutex_lock(&L->lock);
	s->copy_pending = st == KILN_OK;
	s->state = SLOT_FREE;
	/* one slot more to fill: one worker (none once the consumer fills) */
	if (!L->inline_fill)
		pthread_cond_signal(&L->work);
	pthread_mutex_unlock(&L->lock);
	return st;
}

void kiln_loader_stats(struct kiln_loader *L, struct kiln_loader_stats *out)
{
	memset(out, 0, sizeof *out);
	if (!L)
		return;
	pthread_mutex_lock(&L->lock);
	*out = L->stats;
	pthread_mutex_unlock(&L->lock);
}

void kiln_loader_log_stats(struct kiln_loader *L, const char *what)
{
	struct kiln_loader_stats k;
	if (!L)
		return;
	kiln_loader_stats(L, &k);
	kiln_log(KILN_LOG_DEBUG, "data",
		 "loader (%s): %lld batches handed out; %lld filled by the workers (%lld wake-ups, %.1f us of CPU a fill), %lld by the training thread (%.1f us of CPU a fill)",
		 what, (long long)k.taken, (long long)k.worker_fills, (long long)k.wakeups,
		 k.worker_fills ? 1e6 * k.fill_cpu_s / (double)k.worker_fills : 0.0,
		 (long long)k.inline_fills,
		 k.inline_fills ? 1e6 * k.inline_cpu_s / (double)k.inline_fills : 0.0);
}

double kiln_loader_wait_s(const struct kiln_loader *L)
{
	return L ? L->wait_s : 0;
}

int64_t kiln_loader_skipped(const struct kiln_loader *L)
{
	return L ? L->skipped : 0;
}

/* The CPUs this thread may run on (taskset, cpusets, kiln launch's
 * pinning), else the machine's: counting the machine's, `taskset -c 0`
 * timed 2 workers on its one CPU. */
static long probe_cpus(void)
{
	cpu_set_t set;
	const long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
								   : sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? n : 1;
}

int kiln_loader_auto_max(void)
{
	const long ncpu = probe_cpus();
	int w = 1;
	while (2 * w <= ncpu && 2 * w <= 32)
		w *= 2;
	return w;
}

/* The batches of B samples the probe's counts read at most: count w reads
 * 3 * (w + prefetch) + 4 of them, after those of the counts before. */
static int64_t probe_batches(int most, int prefetch, int64_t nb_max)
{
	int64_t total = 0;
	for (int w = 1; w <= most; w *= 2)
		total += 3 * (w + prefetch) + 4;
	return total < nb_max ? total : nb_max;
}

/* Sets up to this many samples probe in epoch 0's order as it is (the
 * whole permutation: at most 8 MB); a larger set probes the end of that
 * order, from its last sample backwards (kiln_rng_permutation_tail), the
 * few batches the probe reads without the whole permutation. */
#define PROBE_WHOLE_MAX ((int64_t)1 << 20)

/* The probe's sample order into *out (malloc'd, the caller frees): `need`
 * samples of epoch 0's order. */
static kiln_status probe_order(const struct kiln_dataset *d, int64_t need, int64_t **out)
{
	const int whole = d->len <= PROBE_WHOLE_MAX;
	const int64_t n = whole ? d->len : need;
	int64_t *order = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
	if (order && whole)
		kiln_rng_permutation(d->seed, 0, order, d->len);
	else if (order && kiln_rng_permutation_tail(d->seed, 0, d->len, need, order)) {
		free(order);
		order = NULL;
	}
	if (!order)
		return kiln_error(KILN_ENOMEM, "workers = auto: the probe's sample order for %lld samples (%s, 8 bytes a sample): out of memory; set [data] limit to use fewer samples, or workers = N (docs/memory.md)",
				  (long long)n,
				  kiln_bytes_str((char[32]){ 0 }, 32, (double)n * sizeof(int64_t)));
	*out = order;
	return KILN_OK;
}

/* workers = auto: time a few batches with 1, 2, 4, ... workers (up to
 * kiln_loader_auto_max: the CPUs of the affinity mask, probe_cpus) and
 * keep the smallest count within 5% of the best rate.  Each count reads
 * samples of its own while the data set has them: the ones an earlier
 * count read are warm ([data] cache = ram holds them decoded, the
 * page cache their bytes), and timing them against cold ones measured the
 * cache, not the workers (cache = ram chose 2 workers at 7x "the rate").
 * The probe's replacements of bad samples are put back and not logged:
 * the run reads those samples again, and before session 36 they were
 * counted twice and used up the 10 logged warnings.  The samples are
 * probe_order's: before session 38 the whole epoch's permutation, for a
 * few batches (10^8 samples: 800 MB and seconds). */
kiln_status kiln_loader_probe(struct kiln_device *dev, struct kiln_dataset *d, int64_t B,
			      int prefetch, void *copy_stream, int *best)
{
	const int most = kiln_loader_auto_max();
	int64_t nb_max = d->len / B;
	double best_rate = 0;
	char msg[512];
	int n = snprintf(msg, sizeof msg, "workers = auto:");
	int64_t *order = NULL;
	kiln_status st = probe_order(d, probe_batches(most, prefetch, nb_max) * B, &order);
	if (st)
		return st;
	const long long skipped0 = atomic_load(&d->skipped);
	d->skips_quiet = 1; /* (set before the workers start, read by them) */
	*best = 1;
	int64_t used = 0; /* batches of order the counts so far read */
	for (int w = 1; w <= most; w *= 2) {
		struct kiln_loader *L = NULL;
		int64_t nb = 3 * (w + prefetch) + 4;
		if (nb > nb_max)
			nb = nb_max;
		if (used + nb > nb_max) /* a small set: read from its start again */
			used = 0;
		if ((st = kiln_loader_open(dev, d, B, w, prefetch, &L)) ||
		    (st = kiln_loader_start(L, 0, order + used * B, nb * B, B, 0))) {
			kiln_loader_close(L);
			break;
		}
		double t0 = kiln_now_s();
		for (int64_t b = 0; b < nb && !st; b++) {
			const void *x;
			const int32_t *y;
			int64_t rows;
			int slot;
			if (!(st = kiln_loader_next(L, &x, &y, &rows, &slot)))
				st = kiln_loader_release(L, slot, copy_stream);
		}
		double rate = (double)(nb * B) / (kiln_now_s() - t0);
		kiln_loader_close(L);
		used += nb;
		if (st)
			break;
		n += common_snprintf_c(msg + n, sizeof msg - (size_t)n, " %d: %.0f samples/s;", w, rate);
		if (rate > best_rate * 1.05) {
			best_rate = rate;
			*best = w;
		} else {
			break; /* more threads stopped paying */
		}
	}
	free(order);
	/* (every probe worker joined by kiln_loader_close) */
	d->skips_quiet = 0;
	atomic_store(&d->skipped, skipped0);
	if (!st)
		kiln_log(KILN_LOG_INFO, "data", "%s chose %d", msg, *best);
	return st;
}

void kiln_loader_close(struct kiln_loader *L)
{
	if (!L)
		return;
	pthread_mutex_lock(&L->lock);
	L->stop = 1;
	pthread_cond_broadcast(&L->work);
	pthread_mutex_unlock(&L->lock);
	for (int i = 0; i < L->started; i++)
		pthread_join(L->threads[i], NULL);
	for (int i = 0; L->slots && i < L->n_slots; i++) {
		struct slot *s = &L->slots[i];
		if (s->copy_pending)
			kiln_device_staging_wait(L->dev, s->copied);
		kiln_device_host_free(L->dev, s->x);
		kiln_device_host_free(L->dev, s->y);
		kiln_device_event_destroy(L->dev, s->copied);
	}
	pthread_cond_destroy(&L->work);
	pthread_cond_destroy(&L->ready);
	kiln_data_scratch_free(&L->scr);
	pthread_mutex_destroy(&L->lock);
	free(L->slots);
	free(L->threads);
	free(L);
}
