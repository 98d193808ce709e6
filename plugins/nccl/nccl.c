/* plugins/nccl/nccl.c - the NCCL communicator (kiln-nccl.so), for the CUDA
 * device.
 *
 * Bootstrap: rank 0 makes the unique id (ncclGetUniqueId) and sets it in
 * kiln's store under "nccl/<n>/id"; the others get it, and every rank calls
 * ncclCommInitRankConfig in non-blocking mode, polling
 * ncclCommGetAsyncError until it is ready or [dist] timeout passes (then
 * ncclCommAbort and KILN_ETIMEOUT).  Each rank uses the GPU the CUDA device
 * opened (one GPU per rank: `kiln launch -n <GPUs>` with the device ordinal
 * from KILN_LOCAL_RANK is the intended use).
 *
 * Collectives are enqueued by NCCL itself on the CUDA stream behind the
 * kiln stream (the device's KILN_PROC_NATIVE_STREAM), and `done` is
 * recorded after them with the device's event_record.  Averages use
 * ncclAvg; bf16 and f16 are NCCL's own types.
 *
 * In non-blocking mode a collective call may return ncclInProgress: the
 * call then polls ncclCommGetAsyncError until it is enqueued (bounded by
 * the timeout like everything else).
 *
 * Watchdog.  After every collective a CUDA event is recorded on the
 * stream it went to, with the time, in a ring of pending collectives.  A
 * thread looks ten times a second: it pops the completed ones
 * (cudaEventQuery), and when the oldest pending one is older than [dist]
 * timeout, or ncclCommGetAsyncError reports an error (a peer died, a
 * network failure), it aborts the communicator (ncclCommAbort: NCCL's
 * kernels exit, the streams stop waiting) and reports the failure through
 * host->fatal naming the rank, the collective and its age (the CLI then
 * exits non-zero, which ends the job).  Later calls on the aborted
 * communicator fail with that message.
 *
 * Without a GPU the plugin loads and its probe says "no CUDA device".
 */
#include <kiln/plugin.h>

#include "../common/comm_init.h"
#include "../common/c_locale.h" /* common_snprintf_c */
#include "../common/rank_name.h"
#include "../common/watchdog.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const struct kiln_host *H;

#define PENDING 256

struct pending {
	cudaEvent_t ev;
	long long t_ns;
	const char *what;
	size_t count;
	int peer, peer2; /* point to point: its peers (-1: none), for messages */
};

struct nccl_comm {
	struct kiln_device *dev;
	ncclComm_t comm;
	int rank, world, timeout_ms;
	int cuda_dev;    /* the GPU the communicator is on (the watchdog's) */
	void *(*native)(void *ctx, void *stream);
	char desc[128];
	/* the watchdog, and under its lock a ring of pending collectives
	 * [head, head + n) */
	struct watchdog dog;
	int dog_dev_set;
	struct pending ring[PENDING];
	int head, n;
	atomic_int aborted;
	char why[512];   /* the abort's message (set before aborted) */
	cudaStream_t bs; /* the barrier's private stream, while it runs */
	struct kiln_store *store; /* the run's (borrowed): a split's world ranks */
	/* a split's: rank r's world rank, what messages name (split_world);
	 * NULL on the world's communicator */
	int *world_of;
};

/* rank r of c as the world knows it */
static int wrank(const struct nccl_comm *c, int r)
{
	return c->world_of && r >= 0 && r < c->world ? c->world_of[r] : r;
}

/* this rank, for messages: "rank R of W", or on a split's communicator
 * "world rank X (rank R of W of a split)" (rank_name.h) */
static const char *me_name(const struct nccl_comm *c, char *buf, size_t n)
{
	return shm_name_me(buf, n, NULL, c->world_of, c->rank, c->world);
}

/* a peer, for messages: "rank P" or "world rank X" (rank_name.h) */
static const char *peer_name(const struct nccl_comm *c, int r, char *buf, size_t n)
{
	return shm_name_peer(buf, n, r < c->world ? c->world_of : NULL, r);
}

/* a point-to-point call's peers, for messages: " with rank P" (or
 * "world rank X"), " with rank P and rank Q", "" for none (-1) */
static const char *peers_named(const struct nccl_comm *c, int peer, int peer2, char *buf,
			       size_t n)
{
	char a[24], b[24]; /* "world rank -2147483648" */
	if (peer >= 0 && peer2 >= 0 && peer2 != peer)
		snprintf(buf, n, " with %s and %s", peer_name(c, peer, a, sizeof a),
			 peer_name(c, peer2, b, sizeof b));
	else if (peer >= 0 || peer2 >= 0)
		snprintf(buf, n, " with %s", peer_name(c, peer >= 0 ? peer : peer2, a, sizeof a));
	else
		buf[0] = 0;
	return buf;
}

static kiln_status nccl_fail(ncclResult_t r, const char *what, int line)
{
	return H->error(KILN_EIO, "nccl: %s failed at plugins/nccl/nccl.c:%d: %s", what, line,
			ncclGetErrorString(r));
}

static int dtype_of(int dt, ncclDataType_t *out)
{
	switch (dt) {
	case KILN_F32: *out = ncclFloat32; return 1;
	case KILN_F16: *out = ncclFloat16; return 1;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
	case KILN_BF16: *out = ncclBfloat16; return 1;
#endif
	case KILN_I32: *out = ncclInt32; return 1;
	case KILN_I64: *out = ncclInt64; return 1;
	case KILN_I8: *out = ncclInt8; return 1;
	case KILN_U8: *out = ncclUint8; return 1;
	default: return 0;
	}
}

static cudaStream_t native(struct nccl_comm *c, void *stream)
{
	return (cudaStream_t)c->native(NULL, stream);
}

/* Before a collective: refuse on an aborted communicator. */
static kiln_status usable(struct nccl_comm *c)
{
	if (atomic_load(&c->aborted))
		return H->error(KILN_EIO, "%s", c->why);
	return KILN_OK;
}

/* Put the collective just enqueued on stream s under watch. */
static void watch(struct nccl_comm *c, cudaStream_t s, const char *what, size_t count, int peer,
		  int peer2)
{
	/* A collective captured into a CUDA graph ([plugin.cuda] graph = 1)
	 * has not run: an event recorded after it would belong to the graph,
	 * and the watchdog's cudaEventQuery of it would never see it complete
	 * (and abort a healthy communicator after the timeout).  Its replays
	 * are launched by the trainer as one graph, which this plugin does not
	 * see: they are not watched (ncclCommGetAsyncError still is). */
	enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
		return;
	pthread_mutex_lock(&c->dog.lock);
	/* full (collectives enqueued far ahead of the GPU): watch the newest
	 * in the last slot, which completes after the one it replaces */
	const int grow = c->n < PENDING;
	struct pending *p = &c->ring[(c->head + (grow ? c->n : PENDING - 1)) % PENDING];
	if (cudaEventRecord(p->ev, s) == cudaSuccess) {
		p->t_ns = watchdog_now_ns();
		p->what = what;
		p->count = count;
		p->peer = peer, p->peer2 = peer2;
		c->n += grow;
	}
	pthread_mutex_unlock(&c->dog.lock);
}

/* A call on c's non-blocking communicator that returned *r: while that is
 * ncclInProgress, poll ncclCommGetAsyncError until NCCL has taken the call
 * (*r then its result), up to the timeout (KILN_ETIMEOUT naming `what` and
 * its count of elements, 0: none). */
static kiln_status enqueued(struct nccl_comm *c, ncclResult_t *r, const char *what, size_t count)
{
	const long long t0 = watchdog_now_ns();
	while (*r == ncclInProgress) {
		ncclResult_t a = ncclInProgress;
		ncclCommGetAsyncError(c->comm, &a);
		*r = a;
		if (*r == ncclInProgress) {
			char me[96];
			if (watchdog_now_ns() - t0 > (long long)c->timeout_ms * 1000000ll)
				return count ? H->error(KILN_ETIMEOUT, "nccl: %s: %s of %zu elements was not enqueued within [dist] timeout = %.1f s",
							me_name(c, me, sizeof me), what, count,
							c->timeout_ms / 1000.0)
					     : H->error(KILN_ETIMEOUT, "nccl: %s: %s did not complete within [dist] timeout = %.1f s",
							me_name(c, me, sizeof me), what,
							c->timeout_ms / 1000.0);
			usleep(100);
		}
	}
	return KILN_OK;
}

static kiln_status finish(struct nccl_comm *c, ncclResult_t r, const char *what, size_t count,
			  int peer, int peer2,
			  void *stream, void *done)
{
	kiln_status st = enqueued(c, &r, what, count);
	if (st)
		return st;
	char me[96], with[80];
	peers_named(c, peer, peer2, with, sizeof with);
	if (r != ncclSuccess)
		return H->error(KILN_EIO, "nccl: %s: %s%s failed: %s", me_name(c, me, sizeof me), what,
				with, ncclGetErrorString(r));
	watch(c, stream ? native(c, stream) : c->bs, what, count, peer, peer2);
	return done ? H->device_event_record(c->dev, done, stream) : KILN_OK;
}

/* ---- the watchdog -------------------------------------------------------- */

/* the watchdog's look (its lock held): pop the completed collectives;
 * abort on an error or on the oldest pending one past the timeout */
static int nccl_look(void *arg)
{
	struct nccl_comm *c = arg;
	if (!c->dog_dev_set) {
		cudaSetDevice(c->cuda_dev);
		c->dog_dev_set = 1;
	}
	while (c->n && cudaEventQuery(c->ring[c->head].ev) == cudaSuccess) {
		c->head = (c->head + 1) % PENDING;
		c->n--;
	}
	ncclResult_t a = ncclSuccess;
	ncclCommGetAsyncError(c->comm, &a);
	const long long age = c->n ? watchdog_now_ns() - c->ring[c->head].t_ns : 0;
	char me[96], with[80] = "";
	me_name(c, me, sizeof me);
	if (c->n)
		peers_named(c, c->ring[c->head].peer, c->ring[c->head].peer2, with, sizeof with);
	if (a == ncclSuccess || a == ncclInProgress) {
		if (!c->n || age <= (long long)c->timeout_ms * 1000000ll)
			return 0;
		common_snprintf_c(c->why, sizeof c->why, "nccl: %s: %s%s of %zu elements did not complete within [dist] timeout = %.1f s (pending %.1f s): %s is lost or stuck; the communicator was aborted",
			 me, c->ring[c->head].what, with, c->ring[c->head].count,
			 c->timeout_ms / 1000.0, age / 1e9, *with ? "that peer" : "a rank");
	} else {
		snprintf(c->why, sizeof c->why, "nccl: %s: the communicator failed (%s)%s%s; it was aborted",
			 me, ncclGetErrorString(a), c->n ? " during " : "",
			 c->n ? c->ring[c->head].what : "");
	}
	atomic_store(&c->aborted, 1);
	pthread_mutex_unlock(&c->dog.lock);
	ncclCommAbort(c->comm);
	H->fatal("nccl", "%s", c->why);
	pthread_mutex_lock(&c->dog.lock);
	return 1; /* without a fatal handler: the calls report it */
}

enum { NCCL_ALLREDUCE, NCCL_BROADCAST, NCCL_ALLGATHER, NCCL_REDUCE_SCATTER, NCCL_SEND, NCCL_RECV };

/* One collective on the caller's stream: the communicator still usable, a dtype NCCL has (for
 * the allreduce, one of f32, bf16, f16), then NCCL's call. send is buf for the in-place ones;
 * op and root are used where they apply. */
static kiln_status collective(void *ctx, int kind, const void *send, void *buf, size_t count,
			      int dtype, int op, int root, void *stream, void *done)
{
	static const char *const what[] = { "allreduce", "broadcast", "allgather", "reduce_scatter",
					    "send", "recv" };
	static const char *const call[] = { "ncclAllReduce", "ncclBroadcast", "ncclAllGather",
					    "ncclReduceScatter", "ncclSend", "ncclRecv" };
	struct nccl_comm *c = ctx;
	const int halves_only = kind == NCCL_ALLREDUCE;
	const ncclRedOp_t rop = op == KILN_REDUCE_AVG ? ncclAvg : ncclSum;
	ncclDataType_t t;
	ncclResult_t r;
	kiln_status ust;
	if ((ust = usable(c)))
		return ust;
	if (!dtype_of(dtype, &t) ||
	    (halves_only && dtype != KILN_F32 && dtype != KILN_F16 && dtype != KILN_BF16))
		return H->error(KILN_ENOTSUP, "nccl: %s of dtype %d%s", what[kind], dtype,
				halves_only ? " (f32, bf16, f16 only)" : "");
	cudaStream_t s = native(c, stream);
	switch (kind) {
	case NCCL_ALLREDUCE:
		r = ncclAllReduce(send, buf, count, t, rop, c->comm, s);
		break;
	case NCCL_BROADCAST:
		r = ncclBroadcast(send, buf, count, t, root, c->comm, s);
		break;
	case NCCL_ALLGATHER:
		r = ncclAllGather(send, buf, count, t, c->comm, s);
		break;
	case NCCL_SEND:
	case NCCL_RECV:
		/* point to point inside a group: NCCL then never blocks on
		 * the peer's matching call (root is the peer) */
		if ((r = ncclGroupStart()) != ncclSuccess)
			break;
		r = kind == NCCL_SEND ? ncclSend(send, count, t, root, c->comm, s)
				      : ncclRecv(buf, count, t, root, c->comm, s);
		if (r == ncclSuccess || r == ncclInProgress) {
			ncclResult_t e = ncclGroupEnd();
			r = e != ncclSuccess ? e : r;
		} else {
			ncclGroupEnd();
		}
		break;
	default:
		r = ncclReduceScatter(send, buf, count, t, rop, c->comm, s);
		break;
	}
	const int p2p = kind == NCCL_SEND || kind == NCCL_RECV;
	return finish(c, r, call[kind], count, p2p ? root : -1, -1, stream, done);
}

static kiln_status nccl_allreduce(void *ctx, void *buf, size_t count, int dtype, int op,
				  void *stream, void *done)
{
	return collective(ctx, NCCL_ALLREDUCE, buf, buf, count, dtype, op, 0, stream, done);
}

static kiln_status nccl_broadcast(void *ctx, void *buf, size_t count, int dtype, int root,
				  void *stream, void *done)
{
	return collective(ctx, NCCL_BROADCAST, buf, buf, count, dtype, 0, root, stream, done);
}

static kiln_status nccl_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
				  void *stream, void *done)
{
	return collective(ctx, NCCL_ALLGATHER, send, recv, count, dtype, 0, 0, stream, done);
}

static kiln_status nccl_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
				       int dtype, int op, void *stream, void *done)
{
	return collective(ctx, NCCL_REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, done);
}

static kiln_status nccl_p2p(void *ctx, int kind, void *buf, size_t count, int dtype, int peer,
			    void *stream, void *done)
{
	struct nccl_comm *c = ctx;
	char me[96];
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "nccl: %s: %s %s rank %d of the communicator's %d: no such peer",
				me_name(c, me, sizeof me), kind == NCCL_SEND ? "send" : "recv",
				kind == NCCL_SEND ? "to" : "from", peer, c->world);
	return collective(ctx, kind, buf, buf, count, dtype, 0, peer, stream, done);
}

static kiln_status nccl_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	return nccl_p2p(ctx, NCCL_SEND, (void *)buf, count, dtype, peer, stream, done);
}

static kiln_status nccl_recv(void *ctx, void *buf, size_t count, int dtype, int peer,
			     void *stream, void *done)
{
	return nccl_p2p(ctx, NCCL_RECV, buf, count, dtype, peer, stream, done);
}

/* comm ops version 7: the send and the recv in one group.  NCCL requires
 * point-to-point calls that must progress together to share a group:
 * each in a group of its own, two ranks that send to each other before
 * receiving (1f1b's steady state) can wait on each other forever. */
static kiln_status nccl_sendrecv(void *ctx, const void *send_buf, size_t send_count, int dst,
				 void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
				 void *done)
{
	struct nccl_comm *c = ctx;
	ncclDataType_t t;
	kiln_status ust;
	if ((ust = usable(c)))
		return ust;
	/* the core (kiln_comm_sendrecv) refused an empty call and a peer
	 * below 0 or this rank; the world's size only the communicator knows */
	char me[96];
	if ((send_count && dst >= c->world) || (recv_count && src >= c->world))
		return H->error(KILN_EINVAL, "nccl: %s: sendrecv to rank %d, from rank %d of the communicator's %d: no such peer",
				me_name(c, me, sizeof me), dst, src, c->world);
	if (!dtype_of(dtype, &t))
		return H->error(KILN_ENOTSUP, "nccl: sendrecv of dtype %d", dtype);
	cudaStream_t s = native(c, stream);
	ncclResult_t r = ncclGroupStart();
	if (r != ncclSuccess)
		return finish(c, r, "ncclGroupStart", send_count + recv_count, send_count ? dst : -1,
			      recv_count ? src : -1, stream, done);
	if (send_count)
		r = ncclSend(send_buf, send_count, t, dst, c->comm, s);
	if ((r == ncclSuccess || r == ncclInProgress) && recv_count)
		r = ncclRecv(recv_buf, recv_count, t, src, c->comm, s);
	/* the group is closed whatever happened inside it */
	ncclResult_t e = ncclGroupEnd();
	if (r == ncclSuccess || r == ncclInProgress)
		r = e != ncclSuccess ? e : r;
	return finish(c, r, "ncclSend+ncclRecv", send_count + recv_count, send_count ? dst : -1,
		      recv_count ? src : -1, stream, done);
}

/* An allreduce of one float on a private stream, waited for. */
static kiln_status nccl_barrier(void *ctx)
{
	struct nccl_comm *c = ctx;
	float *d = NULL;
	cudaStream_t s;
	kiln_status ust;
	if ((ust = usable(c)))
		return ust;
	if (cudaStreamCreate(&s) != cudaSuccess)
		return H->error(KILN_EDEVICE, "nccl: barrier: cudaStreamCreate failed");
	kiln_status st = KILN_OK;
	c->bs = s;
	if (cudaMalloc((void **)&d, sizeof(float)) != cudaSuccess) {
		st = H->error(KILN_EDEVICE, "nccl: barrier: cudaMalloc failed");
	} else {
		ncclResult_t r = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c->comm, s);
		if (r != ncclSuccess && r != ncclInProgress)
			st = nccl_fail(r, "ncclAllReduce (barrier)", __LINE__);
		else if ((st = finish(c, r, "barrier", 1, -1, -1, NULL, NULL)))
			;
		else if (cudaStreamSynchronize(s) != cudaSuccess)
			st = H->error(KILN_EDEVICE, "nccl: barrier: cudaStreamSynchronize failed");
		cudaFree(d);
	}
	cudaStreamDestroy(s);
	c->bs = NULL; /* (finish falls back to it for a NULL stream: not a freed one) */
	return st;
}

static const char *nccl_describe(void *ctx)
{
	return ((struct nccl_comm *)ctx)->desc;
}

/* The end of a healthy non-blocking communicator, as nccl.h says:
 * ncclCommFinalize flushes what was issued and leaves the state
 * ncclInProgress until the ranks are quiescent; then ncclCommDestroy frees
 * the rest without blocking.  A finalize that fails or outlasts [dist]
 * timeout (a peer gone) ends in ncclCommAbort instead. */
static void comm_end(struct nccl_comm *c)
{
	ncclResult_t r = ncclCommFinalize(c->comm);
	const long long t0 = watchdog_now_ns();
	while (r == ncclInProgress) {
		if (watchdog_now_ns() - t0 > (long long)c->timeout_ms * 1000000ll)
			break;
		usleep(1000);
		ncclCommGetAsyncError(c->comm, &r);
	}
	if (r == ncclSuccess)
		ncclCommDestroy(c->comm);
	else
		ncclCommAbort(c->comm);
}

static void nccl_close(void *ctx)
{
	struct nccl_comm *c = ctx;
	if (!c)
		return;
	watchdog_destroy(&c->dog);
	if (c->comm && !atomic_load(&c->aborted))
		comm_end(c);
	for (int i = 0; i < PENDING; i++)
		if (c->ring[i].ev)
			cudaEventDestroy(c->ring[i].ev);
	free(c->world_of);
	free(c);
}

/* Wait until c->comm (made non-blocking by `what`) is ready, up to the
 * timeout, then its description, event ring and watchdog (initialised
 * here, once it is ready: nccl_close ends it).  On failure c is aborted
 * and freed. */
static kiln_status comm_ready(struct nccl_comm *c, const char *what)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		ncclResult_t a = ncclSuccess;
		ncclCommGetAsyncError(c->comm, &a);
		if (a == ncclSuccess)
			break;
		if (a != ncclInProgress) {
			ncclCommAbort(c->comm);
			free(c);
			return H->error(KILN_EIO, "nccl: %s (async) failed: %s", what, ncclGetErrorString(a));
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > c->timeout_ms) {
			const int rank = c->rank, world = c->world, ms = c->timeout_ms;
			ncclCommAbort(c->comm);
			free(c);
			return H->error(KILN_ETIMEOUT, "nccl: rank %d of %d: the communicator (%s) did not connect within %.1f s",
					rank, world, what, ms / 1000.0);
		}
		usleep(1000);
	}
	watchdog_init(&c->dog);
	int v = 0;
	ncclGetVersion(&v);
	common_snprintf_c(c->desc, sizeof c->desc, "NCCL %d.%d.%d, GPU %d, watchdog at %.0f s", v / 10000,
		 (v / 100) % 100, v % 100, c->cuda_dev, c->timeout_ms / 1000.0);
	for (int i = 0; i < PENDING; i++)
		if (cudaEventCreateWithFlags(&c->ring[i].ev, cudaEventDisableTiming) != cudaSuccess) {
			const int rank = c->rank, world = c->world;
			c->ring[i].ev = NULL;
			nccl_close(c);
			return H->error(KILN_EDEVICE, "nccl: rank %d of %d: cudaEventCreate failed", rank,
					world);
		}
	int rc = watchdog_start(&c->dog, nccl_look, c);
	if (rc) {
		nccl_close(c);
		return H->error(KILN_EIO, "nccl: starting the watchdog thread: %s", strerror(rc));
	}
	return KILN_OK;
}

static kiln_status nccl_open(const struct kiln_host *host, const struct kiln_config *cfg,
			     struct kiln_store *store, struct kiln_device *dev, int rank, int world,
			     int timeout_ms, void **out)
{
	static int generation;
	(void)cfg;
	H = host;
	*out = NULL;
	if (strcmp(host->device_name(dev), "cuda"))
		return host->error(KILN_ENOTSUP, "nccl: needs [run] device = cuda (this run's device is %s; use [run] comm = gloo or mpi)",
				   host->device_name(dev));
	struct nccl_comm *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "nccl: out of memory");
	c->dev = dev;
	c->store = store;
	c->rank = rank;
	c->world = world;
	c->timeout_ms = timeout_ms;
	/* the CUDA device opened the GPU of this rank's ordinal ([run] device
	 * = cuda follows the local rank): NCCL and the watchdog use it */
	cudaGetDevice(&c->cuda_dev);
	c->native = (void *(*)(void *, void *))host->device_proc(dev, KILN_PROC_NATIVE_STREAM);
	if (!c->native) {
		free(c);
		return host->error(KILN_ENOTSUP, "nccl: the cuda device does not expose its streams (KILN_PROC_NATIVE_STREAM)");
	}
	/* the unique id through the store */
	char key[64];
	ncclUniqueId id;
	kiln_status st;
	snprintf(key, sizeof key, "nccl/%d/id", generation++);
	if (rank == 0) {
		ncclResult_t r = ncclGetUniqueId(&id);
		if (r != ncclSuccess) {
			free(c);
			return nccl_fail(r, "ncclGetUniqueId", __LINE__);
		}
		if ((st = host->store_set(store, key, &id, sizeof id))) {
			free(c);
			return st;
		}
	} else {
		void *v = NULL;
		size_t n = 0;
		if ((st = host->store_get(store, key, timeout_ms, &v, &n))) {
			free(c);
			return st;
		}
		if (n != sizeof id) {
			host->free(v);
			free(c);
			return host->error(KILN_EIO, "nccl: the unique id in the store has %zu bytes, not %zu", n,
					   sizeof id);
		}
		memcpy(&id, v, sizeof id);
		host->free(v);
	}
	/* non-blocking init, bounded by the timeout */
	ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
	conf.blocking = 0;
	ncclResult_t r = ncclCommInitRankConfig(&c->comm, world, id, rank, &conf);
	if (r != ncclSuccess && r != ncclInProgress) {
		free(c);
		return nccl_fail(r, "ncclCommInitRankConfig", __LINE__);
	}
	if ((st = comm_ready(c, "ncclCommInitRankConfig")))
		return st;
	*out = c;
	return KILN_OK;
}

/* g, split from c (the seq-th split of this process, every rank's the
 * same): each of its ranks' world rank, which its messages name
 * (g->world_of, allocated), exchanged through the store: every member
 * posts its own under nccl/splitw/SEQ/COLOR/RANK and reads the others'. */
static kiln_status split_world(const struct nccl_comm *c, struct nccl_comm *g, int seq, int color)
{
	char key[96], v[16];
	kiln_status st;
	if (!(g->world_of = calloc((size_t)g->world, sizeof *g->world_of)))
		return H->error(KILN_ENOMEM, "nccl: out of memory");
	snprintf(key, sizeof key, "nccl/splitw/%d/%d/%d", seq, color, g->rank);
	snprintf(v, sizeof v, "%d", wrank(c, c->rank));
	if ((st = H->store_set(c->store, key, v, strlen(v))))
		return st;
	for (int r = 0; r < g->world; r++) {
		void *val = NULL;
		char me[96];
		snprintf(key, sizeof key, "nccl/splitw/%d/%d/%d", seq, color, r);
		if ((st = H->store_get(c->store, key, c->timeout_ms, &val, NULL)))
			return H->error(st, "nccl: %s: split: waiting for rank %d of group %d to post its world rank: %s",
					me_name(c, me, sizeof me), r, color, H->last_error());
		g->world_of[r] = atoi(val);
		H->free(val);
	}
	return KILN_OK;
}

/* comm ops version 5: ncclCommSplit (non-blocking, bounded by the timeout
 * as open is); the group's communicator is on the same GPU. */
static kiln_status nccl_split(void *ctx, int color, int key, void **out, int *rank, int *world)
{
	static atomic_int splits; /* this process's, numbered alike on every rank */
	struct nccl_comm *c = ctx;
	const int seq = atomic_fetch_add(&splits, 1);
	char me[96];
	*out = NULL;
	*rank = -1;
	*world = 0;
	if (color < KILN_COMM_NO_GROUP)
		return H->error(KILN_EINVAL, "nccl: %s: split color %d (>= 0, or KILN_COMM_NO_GROUP)",
				me_name(c, me, sizeof me), color);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
	kiln_status st;
	if ((st = usable(c)))
		return st;
	struct nccl_comm *g = calloc(1, sizeof *g);
	if (!g)
		return H->error(KILN_ENOMEM, "nccl: out of memory");
	g->dev = c->dev;
	g->store = c->store;
	g->cuda_dev = c->cuda_dev;
	g->native = c->native;
	g->timeout_ms = c->timeout_ms;
	ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
	conf.blocking = 0;
	ncclResult_t r = ncclCommSplit(c->comm, color == KILN_COMM_NO_GROUP ? NCCL_SPLIT_NOCOLOR : color,
				       key, &g->comm, &conf);
	/* non-blocking: NCCL runs the split as a call on the parent, which
	 * says ncclInProgress until it is done, and fills g->comm only then
	 * (NVIDIA/nccl issue 1472): wait for it, in a group or not, before the
	 * parent is used again or g->comm read */
	if (r == ncclInProgress)
		st = enqueued(c, &r, "ncclCommSplit", 0);
	if (st || r != ncclSuccess) {
		if (g->comm)
			ncclCommAbort(g->comm);
		free(g);
		return st ? st : nccl_fail(r, "ncclCommSplit", __LINE__);
	}
	if (color == KILN_COMM_NO_GROUP || !g->comm) {
		free(g);
		return KILN_OK;
	}
	g->rank = c->rank; /* for comm_ready's messages until NCCL says */
	g->world = c->world;
	if ((st = comm_ready(g, "ncclCommSplit")))
		return st;
	ncclCommUserRank(g->comm, &g->rank);
	ncclCommCount(g->comm, &g->world);
	if ((st = split_world(c, g, seq, color))) {
		nccl_close(g);
		return st;
	}
	*out = g;
	*rank = g->rank;
	*world = g->world;
	return KILN_OK;
#else
	(void)key;
	return H->error(KILN_ENOTSUP, "nccl: split needs NCCL 2.18 or later (ncclCommSplit); this kiln was built with %d.%d",
			NCCL_MAJOR, NCCL_MINOR);
#endif
}

static int nccl_probe(const struct kiln_host *host, char *why, size_t n)
{
	int count = 0;
	(void)host;
	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		snprintf(why, n, "no CUDA device%s%s", e != cudaSuccess ? " (" : "",
			 e != cudaSuccess ? cudaGetErrorString(e) : "");
		if (e != cudaSuccess && strlen(why) + 2 < n)
			strcat(why, ")");
		return 1;
	}
	return 0;
}

static const struct kiln_comm_ops nccl_ops = {
	.version = KILN_COMM_OPS_VERSION,
	.open = nccl_open,
	.close = nccl_close,
	.allreduce = nccl_allreduce,
	.broadcast = nccl_broadcast,
	.allgather = nccl_allgather,
	.reduce_scatter = nccl_reduce_scatter,
	.barrier = nccl_barrier,
	.describe = nccl_describe,
	.alloc_shared = NULL,
	.send = nccl_send,
	.recv = nccl_recv,
	.split = nccl_split,
	.send_now = NULL,
	.sendrecv = nccl_sendrecv,
	.reduce_scatter_in_place = 1, /* (ncclReduceScatter's own in-place rule) */
};

COMM_PLUGIN(nccl, "nccl", "NCCL collectives on CUDA streams (GPU tensors)", nccl_ops, NULL,
	    nccl_probe)
