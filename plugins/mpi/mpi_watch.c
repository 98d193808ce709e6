/* plugins/mpi/mpi_watch.c - names in messages, and the watchdog over the
 * MPI calls in progress (a slot per thread in MPI; mpi.c "Timeouts"). */
#include "mpi_comm.h"

#include <pthread.h>
#include <stdio.h>

/* ---- names in messages ---------------------------------------------------- */

/* rank r of c as the world knows it */
int mpi_wrank(const struct mpi_comm *c, int r)
{
	return c->world_of && r >= 0 && r < c->world ? c->world_of[r] : r;
}

/* this rank, for messages: "rank R of W", or on a split's communicator
 * "world rank X (rank R of W of a split)" (the group's ranks mean nothing
 * to the user) */
const char *mpi_me_name(const struct mpi_comm *c, char *buf, size_t n)
{
	return shm_name_me(buf, n, NULL, c->world_of, c->rank, c->world);
}

/* a peer, for messages: "rank P" or "world rank X" */
const char *mpi_peer_name(const struct mpi_comm *c, int r, char *buf, size_t n)
{
	return shm_name_peer(buf, n, r < c->world ? c->world_of : NULL, r);
}

/* a split's members, for a collective's message: " among world ranks 1,
 * 3" (in the group's rank order); "" on the world's communicator */
static const char *members(const struct mpi_comm *c, char *buf, size_t n)
{
	int at = 0;
	buf[0] = 0;
	if (!c->world_of)
		return buf;
	at = snprintf(buf, n, " among world ranks");
	for (int r = 0; r < c->world && at < (int)n - 16; r++)
		at += snprintf(buf + at, n - (size_t)at, "%s %d", r ? "," : "", mpi_wrank(c, r));
	return buf;
}

/* ---- the watchdog -------------------------------------------------------- */

static void mpi_look_slot(struct mpi_comm *c, struct mpi_watch *w)
{
	long long t0 = atomic_load(&w->started_ns);
	if (t0 && watchdog_now_ns() - t0 > (long long)c->timeout_ms * 1000000ll) {
		pthread_mutex_unlock(&c->dog.lock);
		const int kind = atomic_load(&w->what);
		const int from = atomic_load(&w->peer2);
		char me[96], p[32], f[32], all[160];
		mpi_me_name(c, me, sizeof me);
		mpi_peer_name(c, atomic_load(&w->peer), p, sizeof p);
		mpi_peer_name(c, from, f, sizeof f);
		if (kind == K_SENDRECV && from >= 0 && from != atomic_load(&w->peer))
			H->fatal("mpi", "mpi: %s: MPI sendrecv to %s and from %s did not complete within [dist] timeout = %.1f s: %s or %s is lost or stuck; ending this rank",
				 me, p, f, c->timeout_ms / 1000.0, p, f);
		else if (kind == K_SEND || kind == K_RECV || kind == K_SENDRECV)
			H->fatal("mpi", "mpi: %s: MPI %s %s %s of %lld elements did not complete within [dist] timeout = %.1f s: %s is lost or stuck; ending this rank",
				 me, mpi_kind_names[kind], kind == K_RECV ? "from" : "to", p,
				 (long long)atomic_load(&w->count), c->timeout_ms / 1000.0, p);
		else
			H->fatal("mpi", "mpi: %s: MPI %s%s of %lld elements did not complete within [dist] timeout = %.1f s: a rank is lost or stuck; ending this rank",
				 me, mpi_kind_names[atomic_load(&w->what)], members(c, all, sizeof all),
				 (long long)atomic_load(&w->count), c->timeout_ms / 1000.0);
		/* without a fatal handler: report once, keep watching (a new
		 * call in the slot meanwhile keeps its start) */
		atomic_compare_exchange_strong(&w->started_ns, &t0, 0);
		pthread_mutex_lock(&c->dog.lock);
	}
}

/* the watchdog's look (its lock held): report a call in progress once it
 * is older than the timeout */
int mpi_look(void *arg)
{
	struct mpi_comm *c = arg;
	for (int i = 0; i < MPI_WATCH_SLOTS; i++)
		mpi_look_slot(c, &c->watch[i]);
	return 0;
}
/* Watch the calling thread's MPI call (peer, peer2: a point-to-point
 * call's ranks for the message, else -1): its slot, for unwatch, or -1
 * unwatched when every slot is taken (more threads of one communicator
 * in MPI at once than kiln runs: MPI_WATCH_SLOTS). */
int mpi_watch_call(struct mpi_comm *c, int kind, size_t count, int peer, int peer2)
{
	for (int i = 0; i < MPI_WATCH_SLOTS; i++) {
		struct mpi_watch *w = &c->watch[i];
		int free_ = 0;
		if (!atomic_compare_exchange_strong(&w->busy, &free_, 1))
			continue;
		atomic_store(&w->what, kind);
		atomic_store(&w->count, (long long)count);
		atomic_store(&w->peer, peer);
		atomic_store(&w->peer2, peer2);
		atomic_store(&w->started_ns, watchdog_now_ns());
		return i;
	}
	return -1;
}

void mpi_unwatch(struct mpi_comm *c, int slot)
{
	if (slot < 0)
		return;
	atomic_store(&c->watch[slot].started_ns, 0);
	atomic_store(&c->watch[slot].busy, 0);
}
