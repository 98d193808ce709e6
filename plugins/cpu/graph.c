/* plugins/cpu/graph.c - captured steps on the CPU device ([plugin.cpu]
 * graph = 1): device ops version 3 done by recording.
 *
 * A capture records every task issued on the capturing streams (run,
 * copy, event record, stream wait, host function: struct cpu_task, the
 * run's arguments copied) instead of executing it; a launch issues the
 * recorded tasks again, in the recorded order, each on its own stream
 * (the origin's on the stream launched on).  Nothing in the recording
 * reads host state at launch time that it did not read at capture time:
 * the pointers, plans and scalars are the captured ones, exactly what a
 * CUDA graph replays.  So a trainer that captured something that varies
 * per step (a host scalar, a rotating buffer) gives different numbers
 * from a run that issues every step, and the tests see it.
 *
 * The rules of CUDA stream capture (cudaStreamBeginCapture in thread-local
 * mode) are enforced, so what passes here is capturable on the GPU:
 *   - a stream joins the capture by waiting on an event recorded in it;
 *   - a capturing stream may not wait on an event recorded outside it
 *     (cudaErrorStreamCaptureIsolation);
 *   - every joined stream's last task must be waited on by another
 *     capturing stream before the end (cudaErrorStreamCaptureUnjoined);
 *   - no stream_sync/event_sync of captured work, no device allocation
 *     while capturing (cudaErrorStreamCaptureUnsupported);
 *   - after the capture, an event whose latest record was captured may
 *     not be waited on until it is recorded for real (a launch does).
 * The first violation fails that call and invalidates the capture, so
 * capture_end fails too (as cudaStreamEndCapture does).
 */
#include "cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP_STREAMS 16

/* A recorded task and the stream it was issued on. */
struct cpu_rec {
	struct cpu_task t;
	struct cpu_stream *s;
};

struct cpu_capture {
	uint64_t id;
	struct cpu_stream *origin;
	struct cpu_stream *streams[CAP_STREAMS]; /* [0] is the origin */
	size_t cnt[CAP_STREAMS];   /* tasks recorded on each */
	int open_tail[CAP_STREAMS]; /* its last task not yet waited on */
	int n_streams;
	struct cpu_rec *rec;
	size_t n, cap;
	kiln_status failed;        /* first violation: the capture is invalid */
	char msg[400];
};

struct cpu_graph {
	struct cpu_stream *origin;
	struct cpu_rec *rec;
	size_t n;
};

/* stream.c owns struct cpu_event; these reach its capture fields. */
uint64_t *cpu_event_cap_id(struct cpu_event *ev);
struct cpu_stream **cpu_event_cap_stream(struct cpu_event *ev);
size_t *cpu_event_cap_cnt(struct cpu_event *ev);

static int cap_index(const struct cpu_capture *k, const struct cpu_stream *s)
{
	for (int i = 0; i < k->n_streams; i++)
		if (k->streams[i] == s)
			return i;
	return -1;
}

/* Record a violation (the first one is kept and invalidates the capture). */
static kiln_status violate(struct cpu_ctx *c, struct cpu_capture *k, const char *fmt, const char *what)
{
	char buf[400];
	snprintf(buf, sizeof buf, fmt, what);
	if (k && !k->failed) {
		k->failed = KILN_EINVAL;
		snprintf(k->msg, sizeof k->msg, "%s", buf);
	}
	return c->host->error(KILN_EINVAL, "cpu: %s", buf);
}

static kiln_status append(struct cpu_ctx *c, struct cpu_capture *k, struct cpu_stream *s,
			  const struct cpu_task *t)
{
	if (k->n == k->cap) {
		size_t nc = k->cap ? 2 * k->cap : 256;
		struct cpu_rec *nr = realloc(k->rec, nc * sizeof *nr);
		if (!nr)
			return c->host->error(KILN_ENOMEM, "cpu: out of memory recording a capture");
		k->rec = nr;
		k->cap = nc;
	}
	k->rec[k->n].t = *t;
	k->rec[k->n].t.gen = 0;
	k->rec[k->n].s = s;
	k->n++;
	return KILN_OK;
}

kiln_status cpu_capture_take(struct cpu_ctx *c, struct cpu_stream *s, const struct cpu_task *t,
			     int *taken)
{
	kiln_status st = KILN_OK;
	*taken = 0;
	pthread_mutex_lock(c->lock);
	struct cpu_capture *k = c->cap;
	if (!k) {
		pthread_mutex_unlock(c->lock);
		return KILN_OK;
	}
	int i = cap_index(k, s);
	uint64_t *ev_id = t->ev ? cpu_event_cap_id(t->ev) : NULL;
	if (i < 0) {
		/* a stream outside the capture joins it by waiting on an
		 * event recorded in it; anything else runs as usual */
		if (t->kind != CPU_T_WAIT || *ev_id != k->id) {
			pthread_mutex_unlock(c->lock);
			return KILN_OK;
		}
		if (k->n_streams == CAP_STREAMS) {
			pthread_mutex_unlock(c->lock);
			*taken = 1;
			return violate(c, k, "%s: more than 16 streams joined one capture", "stream_wait");
		}
		i = k->n_streams++;
		k->streams[i] = s;
		k->cnt[i] = 0;
	}
	*taken = 1;
	if (t->kind == CPU_T_WAIT) {
		if (*ev_id != k->id) {
			st = violate(c, k, "%s: a capturing stream waits on an event recorded outside the capture (CUDA: cudaErrorStreamCaptureIsolation); record it inside, or wait before capture_begin",
				     "stream_wait");
			pthread_mutex_unlock(c->lock);
			return st;
		}
		/* the recording stream's tail is joined when this waits on
		 * its latest task */
		int j = cap_index(k, *cpu_event_cap_stream(t->ev));
		if (j >= 0 && j != i && *cpu_event_cap_cnt(t->ev) == k->cnt[j])
			k->open_tail[j] = 0;
	}
	if (!(st = append(c, k, s, t))) {
		k->cnt[i]++;
		k->open_tail[i] = 1;
		if (t->kind == CPU_T_RECORD) {
			*ev_id = k->id;
			*cpu_event_cap_stream(t->ev) = s;
			*cpu_event_cap_cnt(t->ev) = k->cnt[i];
		}
	}
	pthread_mutex_unlock(c->lock);
	return st;
}

kiln_status cpu_capture_check_sync(struct cpu_ctx *c, struct cpu_stream *s, struct cpu_event *ev,
				   const char *what)
{
	kiln_status st = KILN_OK;
	pthread_mutex_lock(c->lock);
	struct cpu_capture *k = c->cap;
	uint64_t id = ev ? *cpu_event_cap_id(ev) : 0;
	if (k && s && !ev && cap_index(k, s) >= 0)
		st = violate(c, k, "%s of a capturing stream (CUDA: cudaErrorStreamCaptureUnsupported): no host synchronisation inside a captured step",
			     what);
	else if (k && ev && id == k->id)
		st = violate(c, k, "%s on an event recorded in the capture under way (CUDA: cudaErrorStreamCaptureUnsupported)",
			     what);
	else if (!k && ev && id)
		st = violate(c, NULL, "%s on an event whose latest record was captured (in a graph, not run): record it outside the capture, or launch the graph first",
			     what);
	else if (k && !s && !ev)
		st = violate(c, k, "%s while capturing (CUDA: cudaErrorStreamCaptureUnsupported): allocate before capture_begin", what);
	pthread_mutex_unlock(c->lock);
	return st;
}

kiln_status cpu_capture_begin(void *ctx, void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_capture *k = NULL;
	kiln_status st = common_capture_check(c->host, "cpu", c->graph, stream);
	if (!st && !(k = calloc(1, sizeof *k)))
		st = c->host->error(KILN_ENOMEM, "cpu: out of memory for a capture");
	if (st)
		return st;
	pthread_mutex_lock(c->lock);
	if (c->cap) {
		pthread_mutex_unlock(c->lock);
		free(k);
		return c->host->error(KILN_EINVAL, "cpu: capture_begin: a capture is under way");
	}
	k->id = ++c->cap_serial;
	k->origin = stream;
	k->streams[0] = stream;
	k->n_streams = 1;
	c->cap = k;
	pthread_mutex_unlock(c->lock);
	return KILN_OK;
}

kiln_status cpu_capture_end(void *ctx, void *stream, void **graph)
{
	struct cpu_ctx *c = ctx;
	kiln_status st = KILN_OK;
	*graph = NULL;
	pthread_mutex_lock(c->lock);
	struct cpu_capture *k = c->cap;
	if (!k || k->origin != stream) {
		pthread_mutex_unlock(c->lock);
		return c->host->error(KILN_EINVAL, "cpu: capture_end: %s",
				      k ? "not the stream the capture began on" : "no capture under way");
	}
	c->cap = NULL;
	pthread_mutex_unlock(c->lock);
	if (k->failed) {
		st = c->host->error(k->failed, "cpu: the capture is invalid: %s", k->msg);
	} else {
		for (int i = 1; i < k->n_streams && !st; i++)
			if (k->open_tail[i])
				st = c->host->error(KILN_EINVAL, "cpu: capture_end: a stream that joined the capture was not joined back: its last task is waited on by no capturing stream (CUDA: cudaErrorStreamCaptureUnjoined)");
	}
	struct cpu_graph *g = st ? NULL : calloc(1, sizeof *g);
	if (!st && !g)
		st = c->host->error(KILN_ENOMEM, "cpu: out of memory for a graph");
	if (st) {
		free(k->rec);
		free(k);
		return st;
	}
	g->origin = k->origin;
	g->rec = k->rec;
	g->n = k->n;
	free(k);
	c->host->log(KILN_LOG_DEBUG, "cpu", "captured a graph of %zu tasks", g->n);
	*graph = g;
	return KILN_OK;
}

kiln_status cpu_graph_launch(void *ctx, void *graph, void *stream)
{
	struct cpu_ctx *c = ctx;
	struct cpu_graph *g = graph;
	kiln_status st;
	if (!g || !stream)
		return c->host->error(KILN_EINVAL, "cpu: graph_launch: NULL %s", !g ? "graph" : "stream");
	/* sync streams run the kernels here, on the caller's thread: its
	 * OpenMP count put back after (cpu.h, cpu_omp_enter) */
	const int caller = cpu_omp_enter();
	st = KILN_OK;
	for (size_t i = 0; i < g->n && !st; i++) {
		const struct cpu_rec *r = &g->rec[i];
		st = cpu_issue(c, r->s == g->origin ? stream : r->s, &r->t);
	}
	cpu_omp_leave(caller);
	return st;
}

void cpu_graph_free(void *ctx, void *graph)
{
	(void)ctx;
	struct cpu_graph *g = graph;
	if (g) {
		free(g->rec);
		free(g);
	}
}
