/* plugins/common/shmp2p.c - point-to-point channels in shared memory (shmp2p.h) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shmp2p.h"
#include "shmcoll.h" /* SHMCOLL_LOST_NS, shmcoll_pace, shm_futex_* */
#include "watchdog.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void shmp2p_init(struct shmp2p *c, const struct kiln_host *host, const char *who, int rank,
		 int world, int peer, void *mem, size_t ring, int timeout_ms, long long spin_ns,
		 int (*lost)(void *arg), void *lost_arg)
{
	memset(c, 0, sizeof *c);
	c->host = host, c->who = who;
	c->rank = rank, c->world = world, c->peer = peer;
	c->timeout_ms = timeout_ms;
	c->spin_ns = spin_ns;
	c->h = mem;
	c->ring = (char *)mem + SHMP2P_HDR;
	c->size = ring;
	c->piece = ring / 4 < SHMP2P_PIECE ? ring / 4 : SHMP2P_PIECE;
	c->lost = lost, c->lost_arg = lost_arg;
	c->restart = 1;
}

/* after publishing: bump the peer's futex word, wake it if it sleeps (the
 * sequentially consistent order of publish, bump and the look at *sleeps
 * against the sleeper's flag, look at the word and look at the position
 * means a sleeper either sees the publish or is woken) */
static void notify(atomic_uint *word, atomic_uint *sleeps)
{
	atomic_fetch_add(word, 1);
	if (atomic_load(sleeps))
		shm_futex_wake(word);
}

/* the error of a broken channel (a recv refused a message's size) */
static kiln_status broken(struct shmp2p *c, int sending)
{
	const struct shmp2p_hdr *h = c->h;
	char me[96], p[32], snd[32], rcv[32];
	return c->host->error(KILN_EINVAL, "%s: %s %s: %s sent message %llu with %llu bytes where %s's recv expected %llu; the channel is unusable",
			      shm_name_me(me, sizeof me, c->who, c->world_of, c->rank, c->world),
			      sending ? "send to" : "recv from",
			      shm_name_peer(p, sizeof p, c->world_of, c->peer),
			      shm_name_peer(snd, sizeof snd, c->world_of, sending ? c->rank : c->peer),
			      (unsigned long long)h->bad_msg, (unsigned long long)h->bad_have,
			      shm_name_peer(rcv, sizeof rcv, c->world_of, sending ? c->peer : c->rank),
			      (unsigned long long)h->bad_want);
}

/* Wait until *pos >= target, paced as shmcoll's waits (shmcoll.h,
 * SHMCOLL_SPIN; shmcoll_pace as YIELD): poll spin_ns, then a sched_yield()
 * between looks up to SHMCOLL_LONG_NS while the core is the wait's alone,
 * then (or at once when another thread had the core) sleep on *word
 * (saying so in *sleeps) in naps of SHMCOLL_LOST_NS, asking the liveness
 * check and the clock after each.  sending: this side is the sender (for
 * messages); bytes: the message's. */
static kiln_status wait_pos(struct shmp2p *c, atomic_ullong *pos, unsigned long long target,
			    atomic_uint *word, atomic_uint *sleeps, int sending, size_t bytes)
{
	struct shmcoll_pace p;
	long long t0 = 0;
	shmcoll_pace_init(&p, SHMCOLL_YIELD, 0, c->spin_ns, 0, 64);
	for (;;) {
		if (atomic_load_explicit(pos, memory_order_acquire) >= target)
			return KILN_OK;
		if (shmcoll_pace_poll(&p))
			continue;
		const long long t = watchdog_now_ns();
		if (!t0)
			t0 = t;
		if (shmcoll_pace_next(&p, t, t - t0) == SHMCOLL_STEP_SLEEP)
			break;
	}
	for (;;) {
		atomic_store(sleeps, 1);
		const unsigned v = atomic_load(word);
		if (atomic_load(pos) >= target) {
			atomic_store(sleeps, 0);
			return KILN_OK;
		}
		if (atomic_load_explicit(&c->h->broken, memory_order_acquire)) {
			atomic_store(sleeps, 0);
			return broken(c, sending);
		}
		shm_futex_wait(word, v, SHMCOLL_LOST_NS);
		atomic_store(sleeps, 0);
		if (atomic_load_explicit(pos, memory_order_acquire) >= target)
			return KILN_OK;
		const long long t = watchdog_now_ns();
		const int gone = c->lost ? c->lost(c->lost_arg) : -1;
		char me[96], pn[32], g[32];
		if (gone >= 0)
			return c->host->error(KILN_EIO, "%s: %s %s of %zu bytes: %s is gone (its process ended)",
					      shm_name_me(me, sizeof me, c->who, c->world_of, c->rank, c->world),
					      sending ? "send to" : "recv from",
					      shm_name_peer(pn, sizeof pn, c->world_of, c->peer), bytes,
					      shm_name_peer(g, sizeof g, c->world_of, gone));
		if (t - t0 > (long long)c->timeout_ms * 1000000ll)
			return c->host->error(KILN_ETIMEOUT, "%s: %s %s of %zu bytes: %s did not %s within [dist] timeout = %.1f s",
					      shm_name_me(me, sizeof me, c->who, c->world_of, c->rank, c->world),
					      sending ? "send to" : "recv from",
					      shm_name_peer(pn, sizeof pn, c->world_of, c->peer), bytes, pn,
					      sending ? "make room (receive)" : "send",
					      c->timeout_ms / 1000.0);
	}
}

/* the read position at which the ring has room for bytes up to end */
static unsigned long long room_at(const struct shmp2p *c, unsigned long long end)
{
	return end > c->size ? end - c->size : 0;
}

/* ring[at .. at + n) = src, wrapping */
static void ring_put(struct shmp2p *c, unsigned long long at, const void *src, size_t n)
{
	const size_t o = (size_t)at & (c->size - 1), first = n < c->size - o ? n : c->size - o;
	memcpy(c->ring + o, src, first);
	memcpy(c->ring, (const char *)src + first, n - first);
}

static void ring_get(struct shmp2p *c, unsigned long long at, void *dst, size_t n)
{
	const size_t o = (size_t)at & (c->size - 1), first = n < c->size - o ? n : c->size - o;
	memcpy(dst, c->ring + o, first);
	memcpy((char *)dst + first, c->ring, n - first);
}

/* Where a message that starts at w goes: at the next lap's start when
 * the ring is empty (the receiver consumed all, rpos == w) and w is inside
 * a lap, with both positions moved there (shmp2p.h, "Laps"); else at w.
 * The receiver writes rpos only after copying what the sender published,
 * and finds the move when it reloads rpos after the frame's publish. */
static unsigned long long lap_start(struct shmp2p *c, unsigned long long w)
{
	if (!c->restart || !(w & (c->size - 1)) ||
	    atomic_load_explicit(&c->h->rpos, memory_order_acquire) != w)
		return w;
	w = (w | (c->size - 1)) + 1;
	atomic_store_explicit(&c->h->rpos, w, memory_order_seq_cst);
	return w;
}

kiln_status shmp2p_send(struct shmp2p *c, const void *buf, size_t bytes)
{
	struct shmp2p_hdr *h = c->h;
	const size_t piece = c->piece;
	unsigned long long w = atomic_load_explicit(&h->wpos, memory_order_relaxed);
	uint64_t frame[2] = { bytes, h->sent + 1 };
	kiln_status st;
	if (atomic_load_explicit(&h->broken, memory_order_acquire))
		return broken(c, 1);
	w = lap_start(c, w);
	/* the frame, published with the first piece */
	if ((st = wait_pos(c, &h->rpos, room_at(c, w + SHMP2P_FRAME), &h->rfutex, &h->wsleeps, 1,
			   bytes)))
		return st;
	ring_put(c, w, frame, SHMP2P_FRAME);
	w += SHMP2P_FRAME;
	size_t done = 0;
	do {
		const size_t want = bytes - done < piece ? bytes - done : piece;
		/* room for `want` bytes: the receiver read up to w + want - size */
		if ((st = wait_pos(c, &h->rpos, room_at(c, w + want), &h->rfutex, &h->wsleeps, 1, bytes)))
			return st;
		ring_put(c, w, (const char *)buf + done, want);
		w += want, done += want;
		atomic_store_explicit(&h->wpos, w, memory_order_seq_cst);
		notify(&h->wfutex, &h->rsleeps);
	} while (done < bytes);
	h->sent++;
	return KILN_OK;
}

int shmp2p_try_send(struct shmp2p *c, const void *buf, size_t bytes)
{
	struct shmp2p_hdr *h = c->h;
	unsigned long long w = atomic_load_explicit(&h->wpos, memory_order_relaxed);
	uint64_t frame[2] = { bytes, h->sent + 1 };
	if (bytes > c->size - SHMP2P_FRAME || atomic_load_explicit(&h->broken, memory_order_acquire))
		return 0;
	w = lap_start(c, w);
	const unsigned long long end = w + SHMP2P_FRAME + bytes;
	if (atomic_load_explicit(&h->rpos, memory_order_acquire) < room_at(c, end))
		return 0;
	/* the room is there: publish piece by piece all the same, so that a
	 * receiver already waiting copies piece k out while this copies k + 1 */
	ring_put(c, w, frame, SHMP2P_FRAME);
	size_t done = 0;
	do {
		const size_t n = bytes - done < c->piece ? bytes - done : c->piece;
		ring_put(c, w + SHMP2P_FRAME + done, (const char *)buf + done, n);
		done += n;
		atomic_store_explicit(&h->wpos, w + SHMP2P_FRAME + done, memory_order_seq_cst);
		notify(&h->wfutex, &h->rsleeps);
	} while (done < bytes);
	h->sent++;
	return 1;
}

kiln_status shmp2p_recv(struct shmp2p *c, void *buf, size_t bytes)
{
	struct shmp2p_hdr *h = c->h;
	unsigned long long r = atomic_load_explicit(&h->rpos, memory_order_relaxed);
	uint64_t frame[2];
	kiln_status st;
	if (atomic_load_explicit(&h->broken, memory_order_acquire))
		return broken(c, 0);
	if ((st = wait_pos(c, &h->wpos, r + SHMP2P_FRAME, &h->wfutex, &h->rsleeps, 0, bytes)))
		return st;
	/* the sender may have moved rpos to a lap's start (lap_start) before
	 * it published this frame */
	r = atomic_load_explicit(&h->rpos, memory_order_acquire);
	ring_get(c, r, frame, SHMP2P_FRAME);
	if (frame[0] != bytes || frame[1] != h->received + 1) {
		h->bad_have = frame[0], h->bad_want = bytes, h->bad_msg = frame[1];
		atomic_store(&h->broken, 1);
		notify(&h->rfutex, &h->wsleeps); /* a sender waiting for room fails too */
		char me[96], p[32];
		if (frame[1] != h->received + 1)
			return c->host->error(KILN_EINTERNAL, "%s: recv from %s: message %llu arrived where message %llu was due",
					      shm_name_me(me, sizeof me, c->who, c->world_of, c->rank, c->world),
					      shm_name_peer(p, sizeof p, c->world_of, c->peer),
					      (unsigned long long)frame[1],
					      (unsigned long long)h->received + 1);
		return broken(c, 0);
	}
	r += SHMP2P_FRAME;
	size_t done = 0;
	while (done < bytes) {
		/* whatever the sender published, up to the message's end (a cap
		 * of a piece here measured slower: bench/p2p_channel, session 17) */
		if ((st = wait_pos(c, &h->wpos, r + 1, &h->wfutex, &h->rsleeps, 0, bytes)))
			return st;
		const unsigned long long have = atomic_load_explicit(&h->wpos, memory_order_acquire) - r;
		const size_t n = have < bytes - done ? (size_t)have : bytes - done;
		ring_get(c, r, (char *)buf + done, n);
		r += n, done += n;
		atomic_store_explicit(&h->rpos, r, memory_order_seq_cst);
		notify(&h->rfutex, &h->wsleeps);
	}
	if (!bytes) { /* the frame alone: consume it */
		atomic_store_explicit(&h->rpos, r, memory_order_seq_cst);
		notify(&h->rfutex, &h->wsleeps);
	}
	h->received++;
	return KILN_OK;
}
