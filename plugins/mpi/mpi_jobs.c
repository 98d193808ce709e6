/* plugins/mpi/mpi_jobs.c - collectives and point to point as jobs run by
 * host functions on the caller's streams, their paced waits, and the
 * 16-bit reductions (mpi.c: "Waiting", "Reductions"). */
#include "mpi_comm.h"

#include "../common/clones.h"
#include "../common/half.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const mpi_kind_names[] = { "allreduce", "broadcast", "allgather",
					  "reduce_scatter", "barrier", "send", "recv",
					  "sendrecv" };

/* ---- 16-bit float arithmetic ------------------------------------------- */

/* b[i] = a[i] + b[i] in bf16 or f16, each sum in f32 and rounded once */
static void sum16(const uint16_t *a, uint16_t *b, int n, int bf16)
{
	for (int i = 0; i < n; i++)
		b[i] = bf16 ? half_f32_bf16(half_bf16_f32(a[i]) + half_bf16_f32(b[i]))
			    : half_f32_f16(half_f16_f32(a[i]) + half_f16_f32(b[i]));
}

/* MPI_User_function for MPI_Op_create */
void mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	sum16(in, inout, *len, 1);
}

void mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	sum16(in, inout, *len, 0);
}

/* p[0..n) *= s at the machine's vector width: the averages' pass over
 * every gradient (GCC 12 at -O2 leaves the plain loop scalar, which
 * measured 9% of a rank's CPU time in bench/overlap.sh at batch 64) */
typedef float f32x16 __attribute__((vector_size(64)));
KILN_CLONES
static void scale_f32(float *p, size_t n, float s)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		f32x16 v;
		memcpy(&v, p + i, sizeof v);
		v *= s;
		memcpy(p + i, &v, sizeof v);
	}
	for (; i < n; i++)
		p[i] *= s;
}

static void scale(void *buf, size_t n, int dt, float s)
{
	if (dt == KILN_F32) {
		scale_f32(buf, n, s);
	} else {
		uint16_t *p = buf;
		for (size_t i = 0; i < n; i++)
			p[i] = dt == KILN_BF16 ? half_f32_bf16(half_bf16_f32(p[i]) * s)
					       : half_f32_f16(half_f16_f32(p[i]) * s);
	}
}

/* ---- collectives ---------------------------------------------------------- */

kiln_status mpi_fail(struct mpi_comm *c, int rc, const char *what)
{
	char s[MPI_MAX_ERROR_STRING], me[96];
	int n = 0;
	MPI_Error_string(rc, s, &n);
	return H->error(KILN_EIO, "mpi: %s: %s failed: %.*s", mpi_me_name(c, me, sizeof me), what, n, s);
}

/* A job's MPI call failed: mpi_fail, its peers named (point to point) */
kiln_status mpi_job_fail(struct mpi_comm *c, const struct job *j, int rc, const char *what)
{
	char w[160], p[32], f[32];
	if (j->kind == K_SENDRECV)
		snprintf(w, sizeof w, "%s (sendrecv to %s, from %s)", what,
			 mpi_peer_name(c, j->root, p, sizeof p), mpi_peer_name(c, j->src, f, sizeof f));
	else if (j->kind == K_SEND || j->kind == K_RECV)
		snprintf(w, sizeof w, "%s (%s %s %s)", what, mpi_kind_names[j->kind],
			 j->kind == K_SEND ? "to" : "from", mpi_peer_name(c, j->root, p, sizeof p));
	else
		snprintf(w, sizeof w, "%s", what);
	return mpi_fail(c, rc, w);
}

/* Set by mpi_enqueue() while the device runs the host function: a collective
 * that runs then is inline on the enqueuing thread (a synchronous stream,
 * `kiln bench comm`), not on a stream worker. */
static _Thread_local int running_inline;
/* the job mpi_run_job ran inline (mpi_enqueue: its slot is given back) */
static _Thread_local const struct job *ran_inline;

/* Complete *req without holding a core: MPI_Test (which is also what
 * progresses Open MPI's nonblocking collectives, libnbc) paced as
 * shmcoll's waits are (plugins/common/shmcoll.h, SHMCOLL_SPIN), how the
 * W_* policy: back to back for c->spin_ns (block, a point-to-point wait:
 * up to SHMCOLL_SPIN_NS), then with a sched_yield() (block, yield) or a
 * c->nap sleep (sleep, meet) between tests while the core is the wait's alone,
 * up to 5 ms; then, or at once when another thread had the core, naps
 * that double from c->nap up to 1 ms (MPI has no futex to sleep on), so
 * a rank waiting on a slow peer neither spins nor yields for ever.  The
 * watchdog still bounds the whole wait. */
int mpi_wait_req(struct mpi_comm *c, int how, MPI_Request *req)
{
	struct shmcoll_pace p;
	const long long t0 = watchdog_now_ns();
	int done = 0, rc;
	shmcoll_pace_init(&p, how == W_BLOCK ? SHMCOLL_SPIN : how == W_YIELD ? SHMCOLL_YIELD
									: SHMCOLL_SLEEP,
			  0, c->spin_ns,
			  c->nap.tv_sec * 1000000000ll + c->nap.tv_nsec, 1);
	while ((rc = MPI_Test(req, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done) {
		const long long t = watchdog_now_ns();
		if (shmcoll_pace_next(&p, t, t - t0) == SHMCOLL_STEP_SLEEP)
			shmcoll_pace_nap(&p);
	}
	return rc;
}

/* K_SENDRECV (comm ops version 7): MPI_Sendrecv, or MPI_Isend and
 * MPI_Irecv (req[0], req[1]) both posted before either is waited for; a
 * half with count 0 talks to MPI_PROC_NULL (nothing). */
static int start_sendrecv(struct mpi_comm *c, struct job *j, MPI_Request *req, const char **what)
{
	const size_t es = common_dtype_size(j->dtype);
	const int sb = (int)(j->count * es), rb = (int)(j->rcount * es);
	const int dst = j->count ? j->root : MPI_PROC_NULL, src = j->rcount ? j->src : MPI_PROC_NULL;
	int rc;
	*what = req ? "MPI_Isend+MPI_Irecv" : "MPI_Sendrecv";
	if (!req)
		return MPI_Sendrecv(j->send, sb, MPI_BYTE, dst, P2P_TAG, j->buf, rb, MPI_BYTE, src,
				    P2P_TAG, c->comm, MPI_STATUS_IGNORE);
	rc = MPI_Irecv(j->buf, rb, MPI_BYTE, src, P2P_TAG, c->comm, &req[1]);
	return rc != MPI_SUCCESS ? rc
				 : MPI_Isend(j->send, sb, MPI_BYTE, dst, P2P_TAG, c->comm, &req[0]);
}

/* A reduce_scatter in place (comm ops reduce_scatter_in_place): recv is
 * send's slice of this rank.  MPI_IN_PLACE then takes the input from the
 * whole buffer and leaves this rank's result at its start, which mpi_run_job
 * moves to the slice once the collective is done. */
static int rs_in_place(const struct mpi_comm *c, const struct job *j)
{
	return j->kind == K_REDUCE_SCATTER &&
	       (const char *)j->buf == (const char *)j->send + (size_t)c->rank * j->count * common_dtype_size(j->dtype);
}

/* Run job j: the blocking MPI collective when req is NULL, else the
 * nonblocking one (MPI-3), its request in *req (K_SENDRECV: req[0] and
 * req[1]). */
static int start(struct mpi_comm *c, struct job *j, MPI_Request *req, const char **what)
{
	const size_t es = common_dtype_size(j->dtype);
	const int n = (int)j->count, bytes = (int)(j->count * es);
	MPI_Datatype t = j->dtype == KILN_F32 ? MPI_FLOAT : c->u16;
	MPI_Op op = j->dtype == KILN_F32 ? MPI_SUM : c->sum16[j->dtype == KILN_F16];
	if (j->kind == K_SENDRECV)
		return start_sendrecv(c, j, req, what);
	switch (j->kind) {
	case K_ALLREDUCE:
		*what = "MPI_Allreduce";
		return req ? MPI_Iallreduce(MPI_IN_PLACE, j->buf, n, t, op, c->comm, req)
			   : MPI_Allreduce(MPI_IN_PLACE, j->buf, n, t, op, c->comm);
	case K_BROADCAST:
		*what = "MPI_Bcast";
		return req ? MPI_Ibcast(j->buf, bytes, MPI_BYTE, j->root, c->comm, req)
			   : MPI_Bcast(j->buf, bytes, MPI_BYTE, j->root, c->comm);
	case K_ALLGATHER: {
		/* in place: this rank's slice is already in the output */
		const void *send = j->send == (char *)j->buf + (size_t)c->rank * j->count * es
					   ? MPI_IN_PLACE : j->send;
		*what = "MPI_Allgather";
		return req ? MPI_Iallgather(send, bytes, MPI_BYTE, j->buf, bytes, MPI_BYTE,
					    c->comm, req)
			   : MPI_Allgather(send, bytes, MPI_BYTE, j->buf, bytes, MPI_BYTE, c->comm);
	}
	case K_SEND:
		*what = "MPI_Send";
		return req ? MPI_Isend(j->buf, bytes, MPI_BYTE, j->root, P2P_TAG, c->comm, req)
			   : MPI_Send(j->buf, bytes, MPI_BYTE, j->root, P2P_TAG, c->comm);
	case K_RECV:
		*what = "MPI_Recv";
		return req ? MPI_Irecv(j->buf, bytes, MPI_BYTE, j->root, P2P_TAG, c->comm, req)
			   : MPI_Recv(j->buf, bytes, MPI_BYTE, j->root, P2P_TAG, c->comm,
				      MPI_STATUS_IGNORE);
	default: { /* K_REDUCE_SCATTER */
		const int in = rs_in_place(c, j);
		const void *send = in ? MPI_IN_PLACE : j->send;
		void *recv = in ? (void *)j->send : j->buf;
		*what = "MPI_Reduce_scatter_block";
		return req ? MPI_Ireduce_scatter_block(send, recv, n, t, op, c->comm, req)
			   : MPI_Reduce_scatter_block(send, recv, n, t, op, c->comm);
	}
	}
}

kiln_status mpi_run_job(void *arg)
{
	struct job *j = arg;
	struct mpi_comm *c = j->c;
	/* MPI counts are ints: reductions count elements, the rest bytes */
	const int reduces = j->kind == K_ALLREDUCE || j->kind == K_REDUCE_SCATTER;
	const size_t n = reduces ? j->count
				 : (j->count > j->rcount ? j->count : j->rcount) * common_dtype_size(j->dtype);
	kiln_status st = KILN_OK;
	const int how = running_inline ? W_BLOCK : c->wait;
	if (running_inline)
		ran_inline = j;
	const int p2p = j->kind == K_SEND || j->kind == K_RECV || j->kind == K_SENDRECV;
	const int peer = j->kind == K_SENDRECV && !j->count ? j->src : j->root;
	const int peer2 = j->kind == K_SENDRECV && j->count && j->rcount ? j->src : -1;
	if (c->shm_on && j->kind != K_BROADCAST && !p2p) {
		const float sc = reduces && j->op == KILN_REDUCE_AVG ? 1.0f / (float)c->world : 1.0f;
		const int wait = how == W_BLOCK ? SHMCOLL_SPIN : how == W_YIELD ? SHMCOLL_YIELD
										: SHMCOLL_SLEEP;
		const int ws = mpi_watch_call(c, j->kind, j->count, peer, peer2);
		st = j->kind == K_ALLREDUCE
			     ? shmcoll_allreduce(&c->shm, wait, j->buf, j->count, j->dtype, sc)
		     : j->kind == K_REDUCE_SCATTER
			     ? shmcoll_reduce_scatter(&c->shm, wait, j->send, j->buf, j->count, j->dtype, sc)
			     : shmcoll_allgather(&c->shm, wait, j->send, j->buf,
						 j->count * common_dtype_size(j->dtype));
		mpi_unwatch(c, ws);
	} else if (n > (size_t)1 << 30) {
		st = H->error(KILN_ENOTSUP, "mpi: a %s of %zu %s (at most 2^30 per call)",
			      mpi_kind_names[j->kind], n, reduces ? "elements" : "bytes");
	} else {
		/* nonblocking with a CPU-friendly wait on a stream worker,
		 * where the compute threads need the cores; blocking
		 * (Open MPI's busy poll, its lowest latency) inline.  Point
		 * to point on a stream worker is nonblocking under every
		 * policy: under block its wait polls for SHMCOLL_SPIN_NS and
		 * then yields and naps, as shmcoll's SPIN does, so a pipeline
		 * rank waiting for a slow peer does not hold a core */
		MPI_Request req[2] = { MPI_REQUEST_NULL, MPI_REQUEST_NULL };
		const char *what = "MPI_Ibarrier";
		const int paced = how == W_YIELD || how == W_SLEEP || (p2p && !running_inline);
		int rc = MPI_SUCCESS;
		const int ws = mpi_watch_call(c, j->kind, j->count, peer, peer2);
		if (how == W_MEET && !p2p) {
			/* wait (napping) until every rank has reached this
			 * collective, then run the blocking one: Open MPI's
			 * polling covers only the transfer itself */
			rc = MPI_Ibarrier(c->comm, &req[0]);
			if (rc == MPI_SUCCESS)
				rc = mpi_wait_req(c, how, &req[0]);
		}
		if (rc == MPI_SUCCESS)
			rc = start(c, j, paced ? req : NULL, &what);
		if (rc == MPI_SUCCESS && paced)
			rc = mpi_wait_req(c, how, &req[0]);
		if (rc == MPI_SUCCESS && paced)
			rc = mpi_wait_req(c, how, &req[1]); /* MPI_REQUEST_NULL but for K_SENDRECV */
		mpi_unwatch(c, ws);
		if (rc != MPI_SUCCESS)
			st = mpi_job_fail(c, j, rc, what);
		if (rc == MPI_SUCCESS && rs_in_place(c, j) && c->rank)
			memmove(j->buf, j->send, j->count * common_dtype_size(j->dtype));
		if (rc == MPI_SUCCESS && reduces && j->op == KILN_REDUCE_AVG && c->world > 1)
			scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
	}
	atomic_store_explicit(&j->busy, 0, memory_order_release);
	return st;
}

/* KILN_PROC_HOST_FN_SKIP's skip: the stream passed job arg without running
 * it (it had failed): its slot back, as mpi_run_job gives it */
static void job_skipped(void *arg)
{
	struct job *j = arg;
	atomic_store_explicit(&j->busy, 0, memory_order_release);
}

/* Take a free slot for `want` (the enqueuing thread only). */
static void job_fill(struct job *j, struct mpi_comm *c, const struct job *want)
{
	j->c = c;
	j->kind = want->kind, j->dtype = want->dtype, j->op = want->op, j->root = want->root;
	j->buf = want->buf, j->send = want->send, j->count = want->count;
	j->rcount = want->rcount, j->src = want->src;
	atomic_store_explicit(&j->busy, 1, memory_order_relaxed);
}

/* A job of its own for a collective recorded in a captured step (host
 * table version 6): replays run it with the captured pointer, so no later
 * collective may take its place; kept until close. */
static struct job *job_keep(struct mpi_comm *c, struct job want)
{
	struct job *j = calloc(1, sizeof *j);
	if (!j) {
		char me[96];
		H->error(KILN_ENOMEM, "mpi: %s: out of memory for a captured %s",
			 mpi_me_name(c, me, sizeof me), mpi_kind_names[want.kind]);
		return NULL;
	}
	job_fill(j, c, &want);
	j->next_kept = c->kept;
	c->kept = j;
	return j;
}

/* A free slot after next_job, filled for `want`, or NULL */
static struct job *job_free(struct mpi_comm *c, const struct job *want)
{
	for (int k = 0; k < JOBS; k++) {
		struct job *j = &c->jobs[(c->next_job + k) % JOBS];
		if (!atomic_load_explicit(&j->busy, memory_order_acquire)) {
			c->next_job = (c->next_job + k + 1) % JOBS;
			job_fill(j, c, want);
			return j;
		}
	}
	return NULL;
}

/* A host function that does nothing: job_get's look at a stream's health */
static kiln_status probe_noop(void *arg)
{
	(void)arg;
	return KILN_OK;
}

/* A slot for `want` on `stream`, or NULL with *st the failure.  With every
 * slot busy the streams are behind this thread (the host runs steps ahead
 * of the device: ZeRO-1 enqueues 3-4 collectives a bucket a step): it
 * waits for the oldest to end, napping 100 us between looks, up to [dist]
 * timeout (a job ends by then, its collective done or failed, unless the
 * stream stopped).  A failed stream skips its queued jobs: where the
 * device has KILN_PROC_HOST_FN_SKIP (the CPU device) it gives their slots
 * back as it passes them (job_skipped), else they stay busy.  Every 50 ms
 * the wait queues a no-op on the stream: a failed stream refuses it with
 * its sticky error, which ends the wait at once. */
static struct job *job_get(struct mpi_comm *c, struct job want, void *stream, kiln_status *st)
{
	struct job *j = job_free(c, &want);
	struct timespec t0, now;
	const struct timespec nap = { 0, 100000 };
	long probed = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (!j) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		const long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (ms >= c->timeout_ms)
			break;
		if (ms - probed >= 50) {
			probed = ms;
			*st = H->device_host_fn(c->dev, stream, probe_noop, NULL);
			if (*st)
				return NULL;
		}
		nanosleep(&nap, NULL);
		j = job_free(c, &want);
	}
	if (j)
		return j;
	char me[96];
	*st = H->error(KILN_ETIMEOUT, "mpi: %s: %d collectives are in flight, the most a communicator holds, and none ended in %d ms ([dist] timeout): %s not enqueued",
		       mpi_me_name(c, me, sizeof me), JOBS, c->timeout_ms, mpi_kind_names[want.kind]);
	return NULL;
}

kiln_status mpi_enqueue(struct mpi_comm *c, struct job want, void *stream, void *done)
{
	const int captured = H->version >= 6 && H->device_capturing(c->dev);
	kiln_status st = KILN_ENOMEM;
	struct job *j = captured ? job_keep(c, want) : job_get(c, want, stream, &st);
	if (!j)
		return st;
	running_inline = 1;
	ran_inline = NULL;
	st = c->host_fn_skip ? c->host_fn_skip(NULL, stream, mpi_run_job, job_skipped, j)
			     : H->device_host_fn(c->dev, stream, mpi_run_job, j);
	running_inline = 0;
	if (st && ran_inline != j) {
		/* refused (a failed stream: its sticky error): the slot back
		 * here; a device that ran it at once gave it back */
		atomic_store_explicit(&j->busy, 0, memory_order_release);
	}
	if (st)
		return st;
	return done ? H->device_event_record(c->dev, done, stream) : KILN_OK;
}

static int reducible(int dt)
{
	return dt == KILN_F32 || dt == KILN_BF16 || dt == KILN_F16;
}

kiln_status mpi_allreduce(void *ctx, void *buf, size_t count, int dtype, int op,
				 void *stream, void *done)
{
	if (!reducible(dtype))
		return H->error(KILN_ENOTSUP, "mpi: allreduce of dtype %d (f32, bf16, f16 only)", dtype);
	return mpi_enqueue(ctx, (struct job){ .kind = K_ALLREDUCE, .buf = buf, .count = count, .dtype = dtype, .op = op }, stream, done);
}

kiln_status mpi_broadcast(void *ctx, void *buf, size_t count, int dtype, int root,
				 void *stream, void *done)
{
	return mpi_enqueue(ctx, (struct job){ .kind = K_BROADCAST, .buf = buf, .count = count, .dtype = dtype, .root = root }, stream, done);
}

kiln_status mpi_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
				 void *stream, void *done)
{
	return mpi_enqueue(ctx, (struct job){ .kind = K_ALLGATHER, .send = send, .buf = recv, .count = count,
						 .dtype = dtype }, stream, done);
}

kiln_status mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
				      int dtype, int op, void *stream, void *done)
{
	if (!reducible(dtype))
		return H->error(KILN_ENOTSUP, "mpi: reduce_scatter of dtype %d (f32, bf16, f16 only)", dtype);
	return mpi_enqueue(ctx, (struct job){ .kind = K_REDUCE_SCATTER, .send = send, .buf = recv, .count = count,
						 .dtype = dtype, .op = op }, stream, done);
}

/* Point to point: the peer rides in the job's root. */
static kiln_status mpi_p2p(struct mpi_comm *c, int kind, void *buf, size_t count, int dtype,
			   int peer, void *stream, void *done)
{
	char me[96];
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "mpi: %s: %s %s rank %d of the communicator's %d: no such peer",
				mpi_me_name(c, me, sizeof me), mpi_kind_names[kind],
				kind == K_SEND ? "to" : "from", peer, c->world);
	return mpi_enqueue(c, (struct job){ .kind = kind, .buf = buf, .count = count, .dtype = dtype,
					.root = peer }, stream, done);
}

kiln_status mpi_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			    void *stream, void *done)
{
	return mpi_p2p(ctx, K_SEND, (void *)buf, count, dtype, peer, stream, done);
}

kiln_status mpi_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			    void *done)
{
	return mpi_p2p(ctx, K_RECV, buf, count, dtype, peer, stream, done);
}

/* comm ops version 7: one job, both halves posted before either waits */
kiln_status mpi_sendrecv(void *ctx, const void *send_buf, size_t send_count, int dst,
				void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
				void *done)
{
	struct mpi_comm *c = ctx;
	/* the core (kiln_comm_sendrecv) refused an empty call and a peer
	 * below 0 or this rank; the world's size only the communicator knows */
	char me[96];
	if ((send_count && dst >= c->world) || (recv_count && src >= c->world))
		return H->error(KILN_EINVAL, "mpi: %s: sendrecv to rank %d, from rank %d of the communicator's %d: no such peer",
				mpi_me_name(c, me, sizeof me), dst, src, c->world);
	return mpi_enqueue(c, (struct job){ .kind = K_SENDRECV, .send = send_buf, .count = send_count,
					.root = dst, .buf = recv_buf, .rcount = recv_count,
					.src = src, .dtype = dtype }, stream, done);
}

kiln_status mpi_barrier(void *ctx)
{
	struct mpi_comm *c = ctx;
	const int ws = mpi_watch_call(c, K_BARRIER, 0, -1, -1);
	int rc = MPI_Barrier(c->comm);
	mpi_unwatch(c, ws);
	return rc == MPI_SUCCESS ? KILN_OK : mpi_fail(c, rc, "MPI_Barrier");
}
