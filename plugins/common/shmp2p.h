/* plugins/common/shmp2p.h - point-to-point channels in shared memory
 * between ranks on one node (kiln-gloo's send and recv when every rank is
 * on this node: plugins/gloo/shm.h), compiled into the plugin, never
 * exported.
 *
 * A channel carries the messages of one ordered pair of ranks, from its
 * sender to its receiver: a header of three cache lines (the sender's
 * write position, the receiver's read position, a flag for a broken
 * channel) and a ring of `ring` bytes (a power of two) in memory both
 * processes map.  Positions count bytes from the channel's start and only
 * grow (64-bit: they do not wrap).  A message is a 16-byte frame (its
 * byte count and its number on the channel) followed by its bytes, written
 * into the ring as room appears and published in pieces of at most
 * SHMP2P_PIECE bytes and a quarter of the ring (shmp2p_try_send too); the
 * receiver copies out and frees all that is published, up to the
 * message's end.  So the two copies overlap (the receiver copies piece k
 * out while the sender copies piece k + 1 in), and a message longer than
 * the ring streams through it.  One sender
 * and one receiver per channel (callers
 * serialise their threads: the plugin holds a lock per channel and
 * direction); messages are matched in order, as the communicator's send
 * and recv promise.
 *
 * Laps.  A message that finds the ring empty (the receiver has consumed
 * all the sender published) starts at the next lap's start, offset 0 of
 * the ring, rather than where the last one ended: the sender moves both
 * positions there (the one write of rpos by the sender, only while the
 * receiver has nothing to copy; the receiver reloads rpos after the
 * frame's publish).  So a pipeline's hand-offs, each received before the
 * next is sent, reuse the ring's first lines, still in the caches, rather
 * than walking all of a 4 MiB ring (docs/PERFORMANCE.md, "Session 20:
 * pipeline hand-offs"); a stream of messages that keeps the ring busy
 * goes round it as before.
 *
 * Sizes: the receiver compares the frame's byte count with its own; a
 * mismatch fails the recv (KILN_EINVAL, both counts and the message's
 * number named) and marks the channel broken, so that every later send or
 * recv on it fails too, the sender's included, instead of reading a frame
 * out of the middle of a message.
 *
 * Waits.  A side that finds no data (the receiver) or no room (the sender)
 * polls for spin_ns (kiln-gloo: [plugin.gloo] p2p_spin_us, 2 us by
 * default; none when the ranks outnumber their CPUs),
 * then sleeps on a futex word in the shared header (FUTEX_WAIT, not
 * private: the peer is another process), woken by the peer's FUTEX_WAKE
 * after it publishes; the peer makes that system call only when the
 * waiter has said it sleeps.  A sleep lasts at most SHMCOLL_LOST_NS, after
 * which the waiter asks the liveness check (a peer whose process is gone:
 * KILN_EIO naming it) and the clock (past timeout_ms: KILN_ETIMEOUT naming
 * the peer).  So a descheduled peer costs no CPU while it is away, and a
 * waiter that sleeps is woken within the kernel's wake-up latency of the
 * peer's publish.  Nothing allocates. */
#ifndef KILN_PLUGINS_COMMON_SHMP2P_H
#define KILN_PLUGINS_COMMON_SHMP2P_H

#include <kiln/plugin.h>

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SHMP2P_SPIN_NS 2000ll /* polling before a waiter sleeps (bench/p2p_channel) */
#define SHMP2P_FRAME 16        /* bytes of a message's frame */
/* A piece: the most bytes the sender copies before it publishes its
 * write position and wakes a sleeping receiver: 64 KiB, so that the
 * receiver starts after 64 KiB of the sender's copy rather than a quarter
 * ring (256 KiB before session 17: 256 KiB - 2 MiB messages 10-25% faster
 * one way on a 1 MiB ring, bench/p2p_channel rate; docs/PERFORMANCE.md
 * "Session 17: the shared-memory channel's rate"). */
#define SHMP2P_PIECE ((size_t)64 << 10)
/* The largest ring a plugin gives a channel (kiln-gloo: 2 ranks, whose
 * two channels take 8 MiB; more ranks share the same 8 MiB: shm.c
 * p2p_ring): a pipeline's crossing tensor of up to 4 MiB less the frame
 * fits whole, so shmp2p_try_send takes it and the sender never waits for
 * the receiver to make room. */
#define SHMP2P_RING_MAX ((size_t)4 << 20)

struct shmp2p_hdr {
	_Alignas(64) atomic_ullong wpos; /* bytes the sender published */
	atomic_uint wfutex;               /* bumped at each publish */
	atomic_uint rsleeps;              /* the receiver sleeps on wfutex */
	uint64_t sent;                    /* messages sent (the sender's) */
	_Alignas(64) atomic_ullong rpos;  /* bytes the receiver consumed */
	atomic_uint rfutex;               /* bumped at each consume */
	atomic_uint wsleeps;              /* the sender sleeps on rfutex */
	uint64_t received;                /* messages received (the receiver's) */
	_Alignas(64) atomic_uint broken;  /* a recv refused a message: 1 */
	uint64_t bad_have, bad_want, bad_msg; /* what it refused */
};

#define SHMP2P_HDR ((sizeof(struct shmp2p_hdr) + 63) / 64 * 64)

/* The bytes a channel of `ring` bytes takes in the shared memory. */
static inline size_t shmp2p_bytes(size_t ring)
{
	return SHMP2P_HDR + ring;
}

/* One side of a channel, in this process's memory. */
struct shmp2p {
	const struct kiln_host *host;
	const char *who;          /* the plugin's name, for messages */
	int rank, world, peer;    /* this rank, and the other end's */
	int timeout_ms;
	long long spin_ns;
	struct shmp2p_hdr *h;
	char *ring;
	size_t size;              /* ring bytes, a power of two */
	size_t piece;             /* SHMP2P_PIECE, at most size / 4 (shmp2p_init) */
	const int *world_of;      /* a split's rank r is world rank world_of[r] (set by the owner after shmp2p_init, borrowed), or NULL: what messages name */
	int restart;              /* laps (the head comment): 1, as shmp2p_init sets it; 0 for measurements */
	int (*lost)(void *arg);   /* a rank whose process is gone, or -1 (may be NULL) */
	void *lost_arg;
};

/* Point c at a channel at mem (shmp2p_bytes(ring) bytes, 64-byte
 * aligned, zero before either side's first message: a new shared-memory
 * object is); ring a power of two >= 64. */
void shmp2p_init(struct shmp2p *c, const struct kiln_host *host, const char *who, int rank,
		 int world, int peer, void *mem, size_t ring, int timeout_ms, long long spin_ns,
		 int (*lost)(void *arg), void *lost_arg);

/* Send buf[0..bytes) to the peer (c: this rank's channel to it): returns
 * once the last byte is in the ring (the receiver need not have read it). */
kiln_status shmp2p_send(struct shmp2p *c, const void *buf, size_t bytes);

/* Send buf[0..bytes) now if the ring has room for the whole message and
 * its frame: 1 when it went (as shmp2p_send would have sent it), 0 when
 * nothing was sent (no room yet, a message longer than the ring, a broken
 * channel: shmp2p_send then waits or reports).  Never waits. */
int shmp2p_try_send(struct shmp2p *c, const void *buf, size_t bytes);

/* Receive the next message from the peer (c: its channel to this rank)
 * into buf, which holds `bytes`: the message must have as many. */
kiln_status shmp2p_recv(struct shmp2p *c, void *buf, size_t bytes);

#endif
