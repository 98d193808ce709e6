/* plugins/cpu/stream.c - streams and events of the CPU device.
 *
 * Sync mode ([plugin.cpu] async = 0): a stream is a tag; run and copy
 * execute on the calling thread and events complete when recorded.
 *
 * Async mode: each stream owns a worker thread and a FIFO of tasks.  An
 * event is a pair of generation counters: event_record bumps `target` and
 * queues a marker carrying it; the worker sets `done` when it reaches the
 * marker.  A stream_wait queues the target as of the call, so recording
 * the event again later does not move a wait that is already queued.
 *
 * Wake-ups are targeted: an idle worker sleeps on its own stream's
 * condition, which only a push to that stream signals; the context's
 * condition is broadcast only on progress someone can wait for (the
 * marker of an event that has sleepers, a stream going idle, the last
 * queued use of an event or of a plan being freed).  A broadcast per task to every thread made the
 * workers and the training thread of a busy process spend their time
 * waking up (measured with 2 Gloo ranks on 2 cores: the training thread
 * at ~65% CPU, in futex waits and wakes).
 *
 * A pipeline stage's stream (a context opened beside peers, [run]
 * devices) that reaches a wait for an event not yet complete spins on it,
 * yielding the core at each turn, before it sleeps on the condition: the
 * event is usually the neighbouring stage's pass ending, and the sleep's
 * wake-up came late by tens to hundreds of microseconds (a futex wake and
 * a reschedule per hand-off, twice per micro-batch; on a virtual machine
 * whose idle CPU halts, the wake-up of a halted CPU), which the measured
 * bubble counted.  It spins up to [plugin.cpu] stage_spin_us while each
 * turn gets the core straight back (cpu_spin_on, threads.h): a stage with
 * a core of its own waits through the fill and drain without sleeping,
 * one that shares its core sleeps at its first late turn, and after it
 * its next waits sleep at once, backing off (cpu_spin_backoff; [plugin.cpu]
 * stage_backoff = 0: no back-off).
 *
 * A side stream (KILN_PROC_STREAM_SIDE, session 49: the pipeline's
 * deferred weight gradients) has no worker: its owner's worker runs its
 * tasks, a group up to an event record at a time, when it reaches a wait
 * for an event not yet complete, and only tasks whose owner has run
 * every task pushed before them (cpu_task.after).  A side task eligible
 * in a wait was therefore pushed before that wait was, so a wait never
 * misses side work issued while it sleeps.
 *
 * Errors are sticky: the first kernel failure on a stream is kept, later
 * kernels and copies on that stream are skipped (their inputs are
 * garbage), markers still pass so nobody waits forever, and the error
 * travels through events to streams that wait on them.  Every later
 * stream_sync/event_sync that depends on it returns it.  A host function
 * queued behind the failure is skipped too; one enqueued with a skip
 * function (KILN_PROC_HOST_FN_SKIP) has that called in its place, so
 * that what it would have given back (a comm plugin's job slot) is given
 * back as the stream passes it.
 */
#include "cpu.h"
#include "teamstart.h" /* cpu_thread_limits */
#include "threads.h"

#include <errno.h> /* EAGAIN */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <time.h>

/* A stream's ring grows to hold every task enqueued since its last
 * stream_sync, up to this many, whether or not the worker has run them
 * (cpu_push): 4096 tasks of 176 bytes, 704 KiB. */
#define CPU_QUEUE_EAGER 4096

struct cpu_stream {
	struct cpu_stream *prev, *next;
	struct cpu_ctx *c;
	pthread_t thread;
	int has_thread;
	/* Ring buffer; a task stays at q[head] while it runs, so count > 0
	 * means "not idle" for stream_sync. */
	struct cpu_task *q;
	size_t cap, head, count;
	size_t pushed; /* tasks enqueued since the last stream_sync */
	int quit;
	pthread_cond_t wake; /* the worker: a task was pushed, or quit */
	char name[16];       /* its worker's: kiln-stream-N, the process's N-th */
	struct cpu_err err; /* sticky: first failure */
	/* KILN_PROC_STREAM_SIDE: a side stream (no worker) has its owner, a
	 * stream with a side has it; seq counts the tasks ever pushed, ran
	 * the tasks ever completed (a side task runs once its owner's ran
	 * reaches the owner's seq at its push: cpu_task.after) */
	struct cpu_stream *owner, *side;
	uint64_t seq, ran;
	int side_busy;    /* its worker is in its side's work (cpu_worker) */
	int side_waiters; /* side_destroy waits for side_busy to clear */
};

struct cpu_event {
	struct cpu_event *prev, *next;
	uint64_t target; /* generation of the latest record */
	uint64_t done;   /* highest generation whose marker was reached */
	int64_t done_ns; /* the clock (mono_ns) when `done` last moved, in a
			  * context beside peers (c->beside): a stage's wait
			  * tallies how late it went on (cpu_wait_tally) */
	int refs;        /* queued tasks that point at this event */
	int waiters;     /* threads asleep until it completes (event_sleep) */
	int run_own;     /* created by the run's own device, not by a
			  * pipeline stage's (!c->stage; cpu_spin_learns) */
	int side_rec;    /* last recorded on a side stream (the tally of
			  * the side's groups, cpu_worker) */
	struct cpu_err err; /* the recording stream's error when `done` was set */
	/* graph.c: the capture its latest record belongs to (0: none, a real
	 * record), the stream and that stream's recorded-task count then */
	uint64_t cap_id;
	struct cpu_stream *cap_stream;
	size_t cap_cnt;
};

/* graph.c's view of an event's capture fields */
uint64_t *cpu_event_cap_id(struct cpu_event *ev) { return &ev->cap_id; }
struct cpu_stream **cpu_event_cap_stream(struct cpu_event *ev) { return &ev->cap_stream; }
size_t *cpu_event_cap_cnt(struct cpu_event *ev) { return &ev->cap_cnt; }

/* ---- the worker ------------------------------------------------------- */

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Before sleeping on event ev (caller holds the lock): with c->spin_ns,
 * watch it reach generation gen, unlocked, yielding the core between
 * looks, for as long as cpu_spin_on says, unless the spin backs off
 * (cpu_spin_backoff: a recent late turn, with stage_backoff).  Returns
 * how the watch ended: CPU_WAIT_NONE (no wait: not beside peers, or the event was done),
 * CPU_WAIT_SEEN (seen while every turn came back at once), CPU_WAIT_LATE
 * (the last turn came back late, *late_ns long: seen then or not),
 * CPU_WAIT_LIMIT (stage_spin_us), CPU_WAIT_BACKOFF (no spin). */
static int spin_wait(struct cpu_ctx *c, const struct cpu_event *ev, uint64_t gen, int64_t *late_ns)
{
	if (!c->beside || __atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) >= gen)
		return CPU_WAIT_NONE;
	if (!c->spin_ns)
		return CPU_WAIT_LIMIT; /* stage_spin_us = 0: asleep at once */
	const int learns = cpu_spin_learns(ev->run_own);
	if (learns && cpu_spin_skip(&c->backoff))
		return CPU_WAIT_BACKOFF;
	pthread_mutex_unlock(c->lock);
	const int64_t t0 = mono_ns();
	int64_t t = t0, turn = 0;
	while (__atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) < gen && cpu_spin_on(t - t0, turn, c->spin_ns)) {
		sched_yield();
		const int64_t now = mono_ns();
		turn = now - t;
		t = now;
	}
	const int seen = __atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) >= gen;
	pthread_mutex_lock(c->lock);
	cpu_wait_tally_spun(&c->waits, mono_ns() - t);
	*late_ns = turn;
	const int how = turn >= CPU_WAIT_TURN_NS ? CPU_WAIT_LATE : seen ? CPU_WAIT_SEEN : CPU_WAIT_LIMIT;
	if (learns)
		cpu_spin_backoff(&c->backoff, how);
	else if (how == CPU_WAIT_LATE)
		c->waits.own_late++;
	return how;
}

/* Sleep until event ev reaches generation gen (caller holds the lock),
 * counted in ev->waiters, so that its record wakes the sleepers only when
 * there are some (cpu_task_done). */
static void event_sleep(struct cpu_ctx *c, struct cpu_event *ev, uint64_t gen)
{
	if (ev->done >= gen)
		return;
	ev->waiters++;
	while (ev->done < gen)
		pthread_cond_wait(c->cond, c->lock);
	ev->waiters--;
}

static void cpu_task_done(struct cpu_stream *s)
{
	struct cpu_task *t = &s->q[s->head];
	/* an event completed that someone sleeps on: a broadcast per record
	 * woke every sleeper of the process (the training thread in its
	 * step's sync, the compute stream's wait for the stages) some 130
	 * times a pipeline step at 16 micro-batches */
	int wake = t->kind == CPU_T_RECORD && t->ev->waiters;
	if (t->ev && !--t->ev->refs)
		wake = 1; /* event_destroy waits for this */
	if (t->plan && !--((struct cpu_plan *)t->plan)->refs && s->c->plan_waiters)
		wake = 1;
	s->head = (s->head + 1) % s->cap;
	s->ran++;
	if (!--s->count && !s->owner)
		wake = 1; /* stream_sync waits for this (a side's: nobody) */
	if (wake)
		pthread_cond_broadcast(s->c->cond);
}

/* An event record, run or copy task t of stream s (caller holds the
 * lock; a run or copy unlocked). */
static void exec_task(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t)
{
	if (t->kind == CPU_T_RECORD) {
		if (t->ev->done < t->gen) {
			/* only a context beside peers tallies its waits, and
			 * only peers (all beside, or none: one config, one
			 * peer count) wait on its events */
			if (c->beside)
				t->ev->done_ns = mono_ns();
			__atomic_store_n(&t->ev->done, t->gen, __ATOMIC_RELEASE);
			/* (the message only with a failure: 2 KiB) */
			if (s->err.st)
				t->ev->err = s->err;
			else
				t->ev->err.st = KILN_OK;
		}
		return;
	}
	if (s->err.st)
		return; /* skipped: an earlier task failed */
	/* Copy out: a producer may grow (move) the ring while we run
	 * unlocked. */
	struct cpu_task task = *t;
	struct cpu_err e; /* (not `= { KILN_OK, "" }`: 2 KiB zeroed per task) */
	e.st = KILN_OK;
	e.msg[0] = 0;
	pthread_mutex_unlock(c->lock);
	if (task.kind == CPU_T_RUN)
		cpu_exec(c, task.plan, &task.args, &e);
	else {
		memcpy(task.dst, task.src, task.bytes);
		cpu_wc_wrote(task.dst, task.bytes);
	}
	pthread_mutex_lock(c->lock);
	if (e.st && !s->err.st)
		s->err = e;
}

/* One group of stream s's side stream on s's worker (caller holds the
 * lock): its tasks that are ready (s has run every task pushed before
 * them), up to and including the next event record.  0: none was ready. */
static int side_run(struct cpu_ctx *c, struct cpu_stream *s)
{
	struct cpu_stream *d = s->side;
	int any = 0;
	while (d->count && d->q[d->head].after <= s->ran) {
		const int rec = d->q[d->head].kind == CPU_T_RECORD;
		exec_task(c, d, &d->q[d->head]);
		cpu_task_done(d);
		any = 1;
		if (rec)
			break;
	}
	return any;
}

static void *cpu_worker(void *arg)
{
	struct cpu_stream *s = arg;
	struct cpu_ctx *c = s->c;
	prctl(PR_SET_NAME, s->name);
	/* (its OpenMP team: made by its first op, cpu_exec, where a failure
	 * is that op's error; a copy or comm stream's worker makes none) */
	pthread_mutex_lock(c->lock);
	for (;;) {
		while (!s->count && !s->quit)
			pthread_cond_wait(&s->wake, c->lock);
		if (!s->count)
			break; /* quit and drained */
		struct cpu_task *t = &s->q[s->head];
		switch (t->kind) {
		case CPU_T_WAIT: {
			/* The wait releases the lock, and a producer may grow
			 * (move) the ring meanwhile: keep what we need, not t. */
			struct cpu_event *ev = t->ev;
			const uint64_t gen = t->gen;
			int64_t late = 0;
			/* the side's work while the event is not complete,
			 * a group at a time (KILN_PROC_STREAM_SIDE) */
			if (s->side && __atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) < gen) {
				const int64_t t0 = mono_ns();
				const int own = ev->side_rec;
				int64_t n = 0;
				s->side_busy = 1; /* the side stays (side_destroy) */
				while (__atomic_load_n(&ev->done, __ATOMIC_ACQUIRE) < gen && side_run(c, s))
					n++;
				s->side_busy = 0;
				if (s->side_waiters)
					pthread_cond_broadcast(c->cond);
				c->side_groups[own] += n;
				if (n)
					c->side_ns[own] += mono_ns() - t0;
			}
			const int how = spin_wait(c, ev, gen, &late);
			event_sleep(c, ev, gen);
			if (how != CPU_WAIT_NONE)
				cpu_wait_tally_add(&c->waits, how, mono_ns() - ev->done_ns, late);
			if (ev->err.st && !s->err.st)
				s->err = ev->err;
			break;
		}
		case CPU_T_RECORD:
		case CPU_T_RUN:
		case CPU_T_COPY:
			exec_task(c, s, t);
			break;
		case CPU_T_HOST:
			if (s->err.st) {
				/* skipped: its skip function in its place
				 * (unlocked: it may take the caller's locks) */
				void (*skip)(void *) = t->skip;
				void *sa = t->arg;
				if (skip) {
					pthread_mutex_unlock(c->lock);
					skip(sa);
					pthread_mutex_lock(c->lock);
				}
				break;
			}
			{
				kiln_status (*fn)(void *) = t->fn;
				void *fa = t->arg;
				pthread_mutex_unlock(c->lock);
				kiln_status st = fn(fa);
				cpu_wc_wrote_any(0); /* a collective, anything */
				struct cpu_err e; /* (not `= { st, "" }`: 2 KiB zeroed per task) */
				e.st = st;
				if (st)
					cpu_err_msg(&e, st, c->host->last_error());
				pthread_mutex_lock(c->lock);
				if (e.st && !s->err.st)
					s->err = e;
			}
			break;
		}
		cpu_task_done(s);
	}
	pthread_mutex_unlock(c->lock);
	return NULL;
}

/* Append a task (caller holds c->lock).  Grows the ring when full, and
 * before that when more tasks were enqueued since the last stream_sync
 * than it holds (up to CPU_QUEUE_EAGER): the size then follows what the
 * program enqueues between syncs, not how far the worker lags, so a
 * repeated step that grew it once never grows it again, however the
 * threads are scheduled (tests/check_comm: test_stream_queue_no_alloc).
 * The only allocation on the enqueue path. */
static kiln_status cpu_push(struct cpu_stream *s, const struct cpu_task *t)
{
	s->pushed++;
	if (s->count == s->cap || (s->pushed > s->cap && s->cap < CPU_QUEUE_EAGER)) {
		size_t ncap = s->cap * 2;
		struct cpu_task *nq = malloc(ncap * sizeof *nq);
		if (!nq && s->count == s->cap) {
			s->pushed--;
			return s->c->host->error(KILN_ENOMEM, "cpu: out of memory growing a stream queue to %zu tasks",
						 ncap);
		}
		if (nq) { /* (an early growth that failed waits for the next push) */
			for (size_t i = 0; i < s->count; i++)
				nq[i] = s->q[(s->head + i) % s->cap];
			free(s->q);
			s->q = nq;
			s->cap = ncap;
			s->head = 0;
			s->c->host->log(KILN_LOG_DEBUG, "cpu", "%s's queue grows to %zu tasks (%zu enqueued since its last sync, %zu not yet run)",
					s->name, ncap, s->pushed, s->count);
		}
	}
	struct cpu_task *q = &s->q[(s->head + s->count) % s->cap];
	*q = *t;
	if (s->owner)
		q->after = s->owner->seq;
	s->seq++;
	s->count++;
	if (t->ev)
		t->ev->refs++;
	if (t->plan)
		((struct cpu_plan *)t->plan)->refs++;
	pthread_cond_signal(&s->wake); /* only this stream's worker waits for it */
	return KILN_OK;
}

/* The sticky error as a host error on the calling thread. */
/* A sticky error's copy for the caller to report after it drops c->lock
 * (caller holds it): the message, 2 KiB, only with a failure, so that the
 * per-op check under the lock costs what it did with 512 bytes. */
static void err_get(struct cpu_err *to, const struct cpu_err *from)
{
	to->st = from->st;
	if (from->st)
		*to = *from;
}

static kiln_status cpu_report(struct cpu_ctx *c, const struct cpu_err *e, const char *who)
{
	return c->host->error(e->st, "%s (failed on a stream worker; reported by %s)", e->msg, who);
}

/* ---- streams ---------------------------------------------------------- */

/* Stream s's queue and worker thread (async mode). */
static kiln_status stream_start(struct cpu_ctx *c, struct cpu_stream *s)
{
	s->cap = 64;
	s->head = s->count = s->pushed = 0;
	s->q = malloc(s->cap * sizeof *s->q);
	if (!s->q)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a stream queue");
	/* a stage device's workers on its own CPUs (pin.c) */
	pthread_attr_t attr;
	const int have_attr = !pthread_attr_init(&attr);
	/* named in the order the process started its workers (compute
	 * first), so that `ps -L`, top -H and perf tell them apart */
	static int started;
	snprintf(s->name, sizeof s->name, "kiln-stream-%u",
		 (unsigned)__atomic_fetch_add(&started, 1, __ATOMIC_RELAXED) % 1000u);
	int rc = have_attr ? cpu_pin_attr(&c->pin, &attr) : 0;
	if (rc)
		c->host->log(KILN_LOG_WARN, "cpu", "stream worker not bound to CPU %d: %s", c->pin.first,
			     strerror(rc));
	rc = pthread_create(&s->thread, have_attr ? &attr : NULL, cpu_worker, s);
	if (have_attr)
		pthread_attr_destroy(&attr);
	if (rc) {
		free(s->q);
		s->q = NULL;
		char lim[1024] = "";
		if (rc == EAGAIN)
			cpu_thread_limits(lim, sizeof lim);
		return c->host->error(KILN_EDEVICE, "cpu: pthread_create for a stream worker failed: %s%s%s%s",
				      strerror(rc), *lim ? " (the limits on processes and threads: " : "", lim,
				      *lim ? "; lower [run] threads or raise the limit)" : "");
	}
	s->has_thread = 1;
	return KILN_OK;
}

/* Stream s's worker, after its queue drained (caller does not hold the lock). */
static void stream_stop(struct cpu_ctx *c, struct cpu_stream *s)
{
	pthread_mutex_lock(c->lock);
	s->quit = 1;
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(c->lock);
	if (s->has_thread)
		pthread_join(s->thread, NULL); /* drains the queue first */
	s->has_thread = 0;
}

/* KILN_CPU_TEST_CREATE_PAUSE_MS (tests/check_cpu_async's hook): a stream's
 * creation sleeps that long between reading the mode and listing the
 * stream, the window a switch on another thread must not fall into. */
static void create_pause(void)
{
	const char *ms = getenv("KILN_CPU_TEST_CREATE_PAUSE_MS");
	const long v = ms ? atol(ms) : 0;
	if (v > 0)
		nanosleep(&(struct timespec){ v / 1000, v % 1000 * 1000000 }, NULL);
}

kiln_status cpu_stream_create(void *ctx, void **out)
{
	struct cpu_ctx *c = ctx;
	*out = NULL;
	struct cpu_stream *s = calloc(1, sizeof *s);
	if (!s)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a stream");
	s->c = c;
	pthread_cond_init(&s->wake, NULL);
	kiln_status st;
	/* the mode read, the worker started and the stream listed as one
	 * step against a switch (cpu_streams_set_async) */
	pthread_mutex_lock(&c->switch_lock);
	if (cpu_async_get(c) && (st = stream_start(c, s))) {
		pthread_mutex_unlock(&c->switch_lock);
		pthread_cond_destroy(&s->wake);
		free(s);
		return st;
	}
	create_pause();
	pthread_mutex_lock(c->lock);
	COMMON_LIST_PUSH(c->streams, s);
	pthread_mutex_unlock(c->lock);
	pthread_mutex_unlock(&c->switch_lock);
	*out = s;
	return KILN_OK;
}

/* KILN_PROC_STREAM_SIDE: a stream without a worker whose tasks s's
 * worker runs while it waits (cpu_worker, side_run); in sync mode they
 * run as issued, as any stream's. */
kiln_status cpu_stream_side(void *ctx, void *stream, void **out)
{
	struct cpu_ctx *c = ctx;
	struct cpu_stream *o = stream;
	*out = NULL;
	if (!o || o->owner || o->side)
		return c->host->error(KILN_EINVAL, "cpu: stream_side: %s",
				      !o ? "NULL stream" : o->owner ? "a side stream has no side" : "the stream has a side already");
	struct cpu_stream *s = calloc(1, sizeof *s);
	if (s)
		s->q = malloc(64 * sizeof *s->q);
	if (!s || !s->q) {
		free(s);
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for a side stream");
	}
	s->c = o->c;
	s->cap = 64;
	pthread_cond_init(&s->wake, NULL);
	snprintf(s->name, sizeof s->name, "side");
	pthread_mutex_lock(o->c->lock);
	s->owner = o;
	o->side = s;
	pthread_mutex_unlock(o->c->lock);
	*out = s;
	return KILN_OK;
}

/* A side stream, once its owner's worker is not running its work: its
 * tasks not run yet dropped (their events' and plans' counts given
 * back; an event record among them completes with an error, so that a
 * wait on it fails instead of hanging), detached from its owner. */
static void side_destroy(struct cpu_stream *s)
{
	struct cpu_ctx *c = s->c;
	pthread_mutex_lock(c->lock);
	s->owner->side_waiters++;
	while (s->owner->side_busy)
		pthread_cond_wait(c->cond, c->lock);
	s->owner->side_waiters--;
	if (s->count && !s->err.st) {
		s->err.st = KILN_EINVAL;
		snprintf(s->err.msg, sizeof s->err.msg,
			 "cpu: a side stream destroyed before its work ran (its event record completes without it)");
	}
	while (s->count) {
		if (s->q[s->head].kind == CPU_T_RECORD)
			exec_task(c, s, &s->q[s->head]); /* (a record: under the lock) */
		cpu_task_done(s);
	}
	s->owner->side = NULL;
	pthread_mutex_unlock(c->lock);
	pthread_cond_destroy(&s->wake);
	free(s->q);
	free(s);
}

void cpu_stream_destroy(void *ctx, void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_stream *s = stream;
	if (!s)
		return;
	if (s->owner) {
		side_destroy(s);
		return;
	}
	/* the worker first: its queue drains, and a wait of it on the
	 * side's event runs the side's work (cpu_worker); then the side */
	pthread_mutex_lock(&c->switch_lock);
	stream_stop(c, s);
	pthread_mutex_lock(c->lock);
	COMMON_LIST_UNLINK(c->streams, s);
	pthread_mutex_unlock(c->lock);
	pthread_mutex_unlock(&c->switch_lock);
	if (s->side)
		side_destroy(s->side);
	pthread_cond_destroy(&s->wake);
	free(s->q);
	free(s);
}

/* cpu_streams_set_async's switch; the caller holds c->switch_lock */
static kiln_status streams_switch(struct cpu_ctx *c, int on)
{
	if (cpu_async_get(c) == on)
		return KILN_OK;
	struct cpu_stream *s;
	kiln_status st;
	for (s = c->streams; s; s = s->next)
		if (s->side) /* (its tasks wait for its owner's worker) */
			return c->host->error(KILN_EINVAL, "cpu: streams cannot switch to %s with a side stream open (KILN_PROC_STREAM_SIDE); destroy it first",
					      on ? "async" : "sync");
	if (!on) {
		/* each stream drained (its last error kept, sticky, as in async
		 * mode: sync mode reports the next failure on its own) */
		for (s = c->streams; s; s = s->next)
			if ((st = cpu_stream_sync(c, s)))
				return st;
		for (s = c->streams; s; s = s->next) {
			stream_stop(c, s);
			s->quit = 0;
			free(s->q);
			s->q = NULL;
			s->cap = s->head = s->count = s->pushed = 0;
		}
		cpu_async_put(c, 0);
		return KILN_OK;
	}
	/* sync mode: nothing is queued, every event is complete */
	cpu_async_put(c, 1);
	for (s = c->streams; s; s = s->next)
		if (!s->has_thread && (st = stream_start(c, s))) {
			streams_switch(c, 0); /* back to sync, whole */
			return st;
		}
	return KILN_OK;
}

kiln_status cpu_streams_set_async(struct cpu_ctx *c, int on)
{
	pthread_mutex_lock(&c->switch_lock);
	kiln_status st = streams_switch(c, on);
	pthread_mutex_unlock(&c->switch_lock);
	return st;
}

kiln_status cpu_stream_sync(void *ctx, void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_stream *s = stream;
	if (!s || s->owner)
		return c->host->error(KILN_EINVAL, "cpu: stream_sync: %s",
				      s ? "a side stream (wait on an event it records)" : "NULL stream");
	kiln_status st;
	if (c->graph && (st = cpu_capture_check_sync(c, s, NULL, "stream_sync")))
		return st;
	if (!cpu_async_get(c))
		return KILN_OK;
	pthread_mutex_lock(c->lock);
	while (s->count)
		pthread_cond_wait(c->cond, c->lock);
	s->pushed = 0;
	if (s->side) /* (its queue sized by what is issued between its owner's syncs) */
		s->side->pushed = s->side->count;
	struct cpu_err e;
	err_get(&e, &s->err);
	pthread_mutex_unlock(c->lock);
	return e.st ? cpu_report(c, &e, "stream_sync") : KILN_OK;
}

/* Run a plan whose arguments cpu_run() has checked. */
static kiln_status run_raw(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_plan *p,
			   const struct kiln_op_args *a)
{
	if (!cpu_async_get(c)) {
		struct cpu_err e;
		if (cpu_exec(c, p, a, &e))
			return c->host->error(e.st, "%s", e.msg);
		return KILN_OK;
	}
	struct cpu_task t = { .kind = CPU_T_RUN, .plan = p, .args = *a };
	pthread_mutex_lock(c->lock);
	struct cpu_err e;
	err_get(&e, &s->err);
	kiln_status st = e.st ? KILN_OK : cpu_push(s, &t);
	pthread_mutex_unlock(c->lock);
	return e.st ? cpu_report(c, &e, "run") : st;
}

/* A capture under way takes the task (graph.c), else it is issued. */
static kiln_status take_or_issue(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t)
{
	/* the stream's context orders its tasks (sync or async): a plan or
	 * event of a peer context ([run] devices' stages) may be issued on it */
	if (s && s->c)
		c = s->c;
	if (s && s->owner && (t->kind == CPU_T_WAIT || t->kind == CPU_T_HOST))
		return c->host->error(KILN_EINVAL, "cpu: a side stream takes runs, copies and event records only");
	if (c->graph) {
		int taken = 0;
		kiln_status st = cpu_capture_take(c, s, t, &taken);
		if (taken || st)
			return st;
	}
	return cpu_issue(c, s, t);
}

kiln_status cpu_stream_run(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_plan *p,
			   const struct kiln_op_args *a)
{
	struct cpu_task t = { .kind = CPU_T_RUN, .plan = p, .args = *a };
	return take_or_issue(c, s, &t);
}

kiln_status cpu_copy_async(void *ctx, void *dst, const void *src, size_t bytes, int kind,
			   void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_stream *s = stream;
	if (!s || (bytes && (!dst || !src)))
		return c->host->error(KILN_EINVAL, "cpu: copy_async of %zu bytes: NULL %s", bytes,
				      !s ? "stream" : !dst ? "destination" : "source");
	if (kind < KILN_COPY_H2D || kind > KILN_COPY_D2D)
		return c->host->error(KILN_EINVAL, "cpu: copy_async: unknown copy kind %d", kind);
	struct cpu_task t = { .kind = CPU_T_COPY, .dst = dst, .src = src, .bytes = bytes };
	return take_or_issue(c, s, &t);
}

static kiln_status copy_raw(struct cpu_ctx *c, struct cpu_stream *s, void *dst, const void *src,
			    size_t bytes)
{
	if (!cpu_async_get(c)) {
		memcpy(dst, src, bytes);
		cpu_wc_wrote(dst, bytes);
		return KILN_OK;
	}
	struct cpu_task t = { .kind = CPU_T_COPY, .dst = dst, .src = src, .bytes = bytes };
	pthread_mutex_lock(c->lock);
	struct cpu_err e;
	err_get(&e, &s->err);
	kiln_status st = e.st ? KILN_OK : cpu_push(s, &t);
	pthread_mutex_unlock(c->lock);
	return e.st ? cpu_report(c, &e, "copy_async") : st;
}

/* ---- events ----------------------------------------------------------- */

kiln_status cpu_event_create(void *ctx, void **out)
{
	struct cpu_ctx *c = ctx;
	struct cpu_event *ev = calloc(1, sizeof *ev);
	*out = NULL;
	if (!ev)
		return c->host->error(KILN_ENOMEM, "cpu: out of memory for an event");
	ev->run_own = !c->stage;
	pthread_mutex_lock(c->lock);
	COMMON_LIST_PUSH(c->events, ev);
	pthread_mutex_unlock(c->lock);
	*out = ev;
	return KILN_OK;
}

void cpu_event_destroy(void *ctx, void *event)
{
	struct cpu_ctx *c = ctx;
	struct cpu_event *ev = event;
	if (!ev)
		return;
	pthread_mutex_lock(c->lock);
	/* Queued markers and waits still point at it: let them pass. */
	while (ev->refs)
		pthread_cond_wait(c->cond, c->lock);
	COMMON_LIST_UNLINK(c->events, ev);
	pthread_mutex_unlock(c->lock);
	free(ev);
}

kiln_status cpu_event_record(void *ctx, void *event, void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_event *ev = event;
	struct cpu_stream *s = stream;
	if (!ev || !s)
		return c->host->error(KILN_EINVAL, "cpu: event_record: NULL %s", !ev ? "event" : "stream");
	if (c->watch.on)
		cpu_async_watch(c);
	struct cpu_task t = { .kind = CPU_T_RECORD, .ev = ev };
	return take_or_issue(c, s, &t);
}

static kiln_status record_raw(struct cpu_ctx *c, struct cpu_event *ev, struct cpu_stream *s)
{
	kiln_status st = KILN_OK;
	pthread_mutex_lock(c->lock);
	ev->cap_id = 0; /* a real record */
	ev->side_rec = s->owner != NULL;
	if (!cpu_async_get(c)) {
		__atomic_store_n(&ev->done, ++ev->target, __ATOMIC_RELEASE);
	} else {
		struct cpu_task t = { .kind = CPU_T_RECORD, .ev = ev, .gen = ev->target + 1 };
		if (!(st = cpu_push(s, &t)))
			ev->target++;
	}
	pthread_mutex_unlock(c->lock);
	return st;
}

kiln_status cpu_stream_wait(void *ctx, void *stream, void *event)
{
	struct cpu_ctx *c = ctx;
	struct cpu_event *ev = event;
	struct cpu_stream *s = stream;
	if (!ev || !s)
		return c->host->error(KILN_EINVAL, "cpu: stream_wait: NULL %s", !ev ? "event" : "stream");
	struct cpu_task t = { .kind = CPU_T_WAIT, .ev = ev };
	return take_or_issue(c, s, &t);
}

static kiln_status wait_raw(struct cpu_ctx *c, struct cpu_stream *s, struct cpu_event *ev)
{
	kiln_status st = KILN_OK;
	if (c->graph && (st = cpu_capture_check_sync(c, s, ev, "stream_wait")))
		return st;
	pthread_mutex_lock(c->lock);
	if (!cpu_async_get(c)) {
		/* everything of this context already happened in call order;
		 * an event of an async peer context (a pipeline stage's, [run]
		 * devices) is waited for here */
		event_sleep(c, ev, ev->target);
		struct cpu_err e;
		err_get(&e, &ev->err);
		pthread_mutex_unlock(c->lock);
		return e.st ? cpu_report(c, &e, "stream_wait") : KILN_OK;
	}
	/* A complete event that carries a failure is still queued, so the
	 * failure reaches this stream in order, after its earlier work. */
	if (ev->done < ev->target || ev->err.st) {
		struct cpu_task t = { .kind = CPU_T_WAIT, .ev = ev, .gen = ev->target };
		st = cpu_push(s, &t);
	}
	pthread_mutex_unlock(c->lock);
	return st;
}

kiln_status cpu_event_sync(void *ctx, void *event)
{
	struct cpu_ctx *c = ctx;
	struct cpu_event *ev = event;
	if (!ev)
		return c->host->error(KILN_EINVAL, "cpu: event_sync: NULL event");
	kiln_status st;
	if (c->graph && (st = cpu_capture_check_sync(c, NULL, ev, "event_sync")))
		return st;
	pthread_mutex_lock(c->lock);
	event_sleep(c, ev, ev->target);
	struct cpu_err e;
	err_get(&e, &ev->err);
	pthread_mutex_unlock(c->lock);
	return e.st ? cpu_report(c, &e, "event_sync") : KILN_OK;
}

void cpu_plan_wait_idle(struct cpu_ctx *c, struct cpu_plan *p)
{
	c->plan_waiters++;
	while (p->refs)
		pthread_cond_wait(c->cond, c->lock);
	c->plan_waiters--;
}

/* A pipeline stage's waits for its neighbours (cpu_wait_tally), logged
 * once its streams' workers are gone (a context that spun: a stage beside
 * peers, [run] devices): bench/pipeline.sh reads the line.  A stage's
 * context logs it even with no wait (on one CPU a stage can find every
 * event of its neighbour already recorded); the run's own device only
 * when it waited. */
static void wait_tally_log(const struct cpu_ctx *c)
{
	const struct cpu_wait_tally *w = &c->waits;
	const int64_t n = w->n[0] + w->n[1] + w->n[2] + w->n[3];
	if (!n && !(c->stage && c->beside))
		return;
	double mean[4];
	for (int k = 0; k < 4; k++)
		mean[k] = w->n[k] ? (double)w->after_ns[k] / 1e3 / (double)w->n[k] : 0;
	if (c->side_groups[0] + c->side_groups[1])
		c->host->log(KILN_LOG_INFO, "cpu",
			     "side stream work (deferred, threads %d): %lld groups run while waiting for another event (%.3f ms), %lld at a wait for the side's own (%.3f ms)",
			     c->threads, (long long)c->side_groups[0], (double)c->side_ns[0] / 1e6,
			     (long long)c->side_groups[1], (double)c->side_ns[1] / 1e6);
	c->host->log(KILN_LOG_INFO, "cpu",
		     "stage waits (threads %d) for another context's event: %lld; seen spinning %lld (a mean %.1f us after the record, max %.0f; the lock retaken in %.2f us), a late turn %lld (went on %.1f us after, max %.0f; the late turns %.1f us), slept at stage_spin_us %lld (woke %.1f us after, max %.0f), slept at once backing off %lld (woke %.1f us after, max %.0f); late turns on the run's own device's event, not backed off from: %lld",
		     c->threads, (long long)n, (long long)w->n[0], mean[0], (double)w->after_max_ns[0] / 1e3,
		     cpu_wait_tally_lock_us(w),
		     (long long)w->n[1], mean[1], (double)w->after_max_ns[1] / 1e3,
		     w->n[1] ? (double)w->turn_ns / 1e3 / (double)w->n[1] : 0, (long long)w->n[2], mean[2],
		     (double)w->after_max_ns[2] / 1e3, (long long)w->n[3], mean[3], (double)w->after_max_ns[3] / 1e3,
		     (long long)w->own_late);
}

void cpu_streams_destroy_all(struct cpu_ctx *c)
{
	while (c->streams)
		cpu_stream_destroy(c, c->streams);
	wait_tally_log(c);
	while (c->events)
		cpu_event_destroy(c, c->events);
}

/* KILN_PROC_HOST_FN: fn(arg) in stream order.  Sync mode calls it now; a
 * failure there is returned, on a worker it fails the stream. */
kiln_status cpu_host_fn(void *ctx, void *stream, kiln_status (*fn)(void *), void *arg)
{
	return cpu_host_fn_skip(ctx, stream, fn, NULL, arg);
}

/* KILN_PROC_HOST_FN_SKIP: cpu_host_fn, skip(arg) in fn's place where the
 * worker skips it (a failed stream, cpu_worker).  ctx NULL: the stream's. */
kiln_status cpu_host_fn_skip(void *ctx, void *stream, kiln_status (*fn)(void *),
			     void (*skip)(void *), void *arg)
{
	struct cpu_stream *s = stream;
	struct cpu_ctx *c = ctx ? ctx : s ? s->c : NULL;
	if (!s || !fn) {
		/* (ctx and stream NULL: no context, the plugin's host table) */
		const struct kiln_host *h = c ? c->host : cpu_plugin_host();
		return h->error(KILN_EINVAL, "cpu: host_fn: NULL %s", !s ? "stream" : "function");
	}
	struct cpu_task t = { .kind = CPU_T_HOST, .fn = fn, .skip = skip, .arg = arg };
	/* sync mode calls fn here, and fn may run plans (cpu.h, cpu_omp_enter) */
	const int caller = cpu_omp_enter();
	const kiln_status st = take_or_issue(c, s, &t);
	cpu_omp_leave(caller);
	return st;
}

static kiln_status host_raw(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t)
{
	if (!cpu_async_get(c)) {
		const kiln_status st = t->fn(t->arg);
		cpu_wc_wrote_any(0); /* a collective, anything */
		return st;
	}
	pthread_mutex_lock(c->lock);
	struct cpu_err e;
	err_get(&e, &s->err);
	kiln_status st = e.st ? KILN_OK : cpu_push(s, t);
	pthread_mutex_unlock(c->lock);
	return e.st ? cpu_report(c, &e, "host_fn") : st;
}

kiln_status cpu_issue(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t)
{
	switch (t->kind) {
	case CPU_T_RUN:
		return run_raw(c, s, t->plan, &t->args);
	case CPU_T_COPY:
		return copy_raw(c, s, t->dst, t->src, t->bytes);
	case CPU_T_RECORD:
		return record_raw(c, t->ev, s);
	case CPU_T_WAIT:
		return wait_raw(c, s, t->ev);
	default:
		return host_raw(c, s, t);
	}
}
