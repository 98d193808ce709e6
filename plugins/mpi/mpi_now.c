/* plugins/mpi/mpi_now.c - send_now: sends of at most NOW_BYTES on the
 * calling thread, each from a slot of its peer's ring (mpi.c, "Sends on
 * the calling thread"). */
#include "mpi_comm.h"

#include <stdlib.h>
#include <string.h>

/* peer's ring of send_now (made on its first use; a second thread making
 * it at once keeps the first's), or NULL when out of memory */
static struct now_ring *now_ring(struct mpi_comm *c, int peer)
{
	struct now_ring *r = atomic_load_explicit(&c->now[peer], memory_order_acquire), *none = NULL;
	if (r)
		return r;
	if (!(r = calloc(1, sizeof *r)))
		return NULL;
	for (int k = 0; k < NOW_SLOTS; k++)
		r->req[k] = MPI_REQUEST_NULL;
	if (atomic_compare_exchange_strong(&c->now[peer], &none, r))
		return r;
	free(r);
	return none;
}

/* The sends of r that completed, oldest first, given back; wait = 1: the
 * oldest waited for first (paced as a point-to-point wait, watched). */
static int now_reap(struct mpi_comm *c, struct now_ring *r, int peer, int wait)
{
	int rc = MPI_SUCCESS, done = 1;
	if (wait && r->n) {
		const int ws = mpi_watch_call(c, K_SEND, NOW_BYTES, peer, -1);
		rc = mpi_wait_req(c, W_BLOCK, &r->req[r->head]);
		mpi_unwatch(c, ws);
	}
	while (rc == MPI_SUCCESS && r->n &&
	       (rc = MPI_Test(&r->req[r->head], &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && done) {
		r->head = (r->head + 1) % NOW_SLOTS;
		r->n--;
	}
	return rc;
}

/* comm ops version 6: a send on the calling thread.  At most NOW_BYTES:
 * MPI_Isend of a copy (struct now_ring), *sent = 1, waiting only when
 * NOW_SLOTS to the peer are still in flight (wait = 0: then nothing
 * sent).  Longer, wait = 1: the enqueued send's job run here (MPI_Isend
 * and a paced wait for it: its receive); wait = 0: nothing (MPI cannot
 * say whether it would wait).  MPI keeps the order of the messages to a
 * peer, which the caller's order of its sends is.  Only at
 * MPI_THREAD_MULTIPLE (below). */
kiln_status mpi_send_now(void *ctx, const void *buf, size_t count, int dtype, int peer,
				int wait, int *sent)
{
	struct mpi_comm *c = ctx;
	const size_t bytes = count * common_dtype_size(dtype);
	char me[96], p[32];
	*sent = 0;
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "mpi: %s: send to rank %d of the communicator's %d: no such peer",
				mpi_me_name(c, me, sizeof me), peer, c->world);
	/* MPI_THREAD_SERIALIZED: an MPI call here, on the caller's thread,
	 * may meet one of a stream's jobs on another (undefined in MPI), and
	 * no stream is given to send it on: wait = 0 sends nothing (the
	 * caller sends it otherwise), wait = 1 is refused, named.  (The core
	 * runs a pipeline, send_now's user, only at thread_level = multiple:
	 * core/dist_pipe.c.) */
	if (!c->multiple) {
		if (!wait)
			return KILN_OK;
		return H->error(KILN_ENOTSUP, "mpi: %s: a send to %s now, on the caller's thread, needs [plugin.mpi] thread_level = multiple (MPI_THREAD_SERIALIZED: another thread may be in MPI)",
				mpi_me_name(c, me, sizeof me), mpi_peer_name(c, peer, p, sizeof p));
	}
	if (bytes > NOW_BYTES) {
		if (!wait)
			return KILN_OK;
		struct job j = { .c = c, .kind = K_SEND, .buf = (void *)buf, .count = count,
				 .dtype = dtype, .root = peer };
		kiln_status st = mpi_run_job(&j);
		*sent = !st;
		return st;
	}
	struct now_ring *r = now_ring(c, peer);
	if (!r)
		return H->error(KILN_ENOMEM, "mpi: %s: out of memory for the sends to %s",
				mpi_me_name(c, me, sizeof me), mpi_peer_name(c, peer, p, sizeof p));
	int rc = now_reap(c, r, peer, 0);
	if (rc == MPI_SUCCESS && r->n == NOW_SLOTS) {
		if (!wait)
			return KILN_OK;
		rc = now_reap(c, r, peer, 1);
	}
	if (rc == MPI_SUCCESS) {
		const unsigned k = (r->head + r->n) % NOW_SLOTS;
		memcpy(r->bytes[k], buf, bytes);
		rc = MPI_Isend(r->bytes[k], (int)bytes, MPI_BYTE, peer, P2P_TAG, c->comm, &r->req[k]);
	}
	if (rc != MPI_SUCCESS) {
		struct job j = { .kind = K_SEND, .root = peer };
		return mpi_job_fail(c, &j, rc, "MPI_Isend");
	}
	r->n++;
	*sent = 1;
	return KILN_OK;
}

/* comm ops version 8: send_now's copies (NOW_BYTES) under
 * MPI_THREAD_MULTIPLE, which the pipeline's ranks run at
 * ([plugin.mpi] thread_level = multiple: core/dist_pipe.c) */
size_t mpi_p2p_buffered(void *ctx, int peer)
{
	const struct mpi_comm *c = ctx;
	return c->multiple && peer >= 0 && peer < c->world && peer != c->rank ? NOW_BYTES : 0;
}

/* At close: send_now's sends, which the peers' receives have completed
 * in a run that ended well.  One still in flight (a run that failed) is
 * left to MPI (MPI_Request_free) with its ring, which it may still read:
 * not freed. */
void mpi_now_free(struct mpi_comm *c)
{
	for (int q = 0; c->now && q < c->world; q++) {
		struct now_ring *r = atomic_load(&c->now[q]);
		if (r && now_reap(c, r, q, 0) == MPI_SUCCESS && !r->n) {
			free(r);
			continue;
		}
		for (unsigned k = 0; r && k < r->n; k++)
			MPI_Request_free(&r->req[(r->head + k) % NOW_SLOTS]);
	}
	free(c->now);
	c->now = NULL;
}
