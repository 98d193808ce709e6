/* plugins/gloo/shm.h - kiln-gloo's one-node path: kiln's shared-memory
 * collectives (plugins/common/shmcoll.h) on a POSIX shared-memory object,
 * in C behind an opaque handle so that the plugin's C++ files can call them.
 * Compiled into kiln-gloo.so only, never exported.
 *
 * Setup (gloo_shm_open, collective: every rank calls it at open, in the
 * same order as its other communicators):
 *  1. each rank posts its host identity (gethostname and
 *     /proc/sys/kernel/random/boot_id) under <prefix>host/<rank> and reads
 *     every other's: the path is taken only when all are equal and there
 *     are at most SHMCOLL_MAXW ranks;
 *  2. rank 0 creates the object (shm_open O_CREAT|O_EXCL, mode 0600, a
 *     name of its pid and 64 random bits, world x SHMCOLL_SEGMENT bytes)
 *     and posts its name under <prefix>name; the others open and map it,
 *     only an object of that name pattern owned by this user with mode 0600;
 *     every rank takes a POSIX write lock (fcntl F_SETLK) on byte <rank>
 *     of the object and keeps the descriptor open;
 *  3. a store barrier (counters under <prefix>), after which every rank
 *     shm_unlinks the name (ENOENT ignored), so a crash leaves nothing in
 *     /dev/shm; each checks that every peer's lock is visible and zeroes
 *     its header (shmcoll_init);
 *  4. a second store barrier: no rank's first collective reaches a header
 *     before its owner zeroed it.
 * A failure at 2-4 on any rank (its reason posted under <prefix>why/...)
 * makes every rank fall back to Gloo with that reason; only a barrier that
 * times out (a rank lost during setup) or a store error fails the open.
 *
 * Lost peers.  The kernel drops a process's POSIX locks when it ends,
 * however it ends (SIGKILL too), and forked children do not inherit them:
 * a wait longer than SHMCOLL_LOST_NS asks, every SHMCOLL_LOST_NS, whether
 * each peer's byte is still locked (fcntl F_GETLK, a system call, no
 * allocation) and fails naming the first peer whose lock is gone. */
#ifndef KILN_PLUGINS_GLOO_SHM_H
#define KILN_PLUGINS_GLOO_SHM_H

#include <kiln/plugin.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct gloo_shm;

/* Steps 1-4 above; prefix: the communicator's store key space (e.g.
 * "gloo/shm/0/"); p2p: the object holds point-to-point channels too
 * (gloo_shm_send, beyond the collectives' segments, every rank's ends set
 * up at step 3).  KILN_OK with *out the path, or *out = NULL and why[0..n)
 * the reason it is off; else the error (host->error set). */
kiln_status gloo_shm_open(const struct kiln_host *host, struct kiln_store *store,
			  const char *prefix, int rank, int world, int timeout_ms, int p2p,
			  struct gloo_shm **out, char *why, size_t n);

/* Point to point ([plugin.gloo] shm_p2p): a channel for each ordered pair
 * of ranks (plugins/common/shmp2p.h: a ring in the object, messages in
 * order, sizes checked, a bounded spin then a futex sleep, a lost peer
 * named) when there are at most GLOO_SHM_P2P_MAXW ranks; rings of
 * SHMP2P_RING_MAX (4 MiB), halved until the channels take at most 8 MiB (a
 * container's /dev/shm may hold 64 MiB). */
#define GLOO_SHM_P2P_MAXW 16
/* The channels' ring bytes, or 0: g has none (NULL g: 0). */
size_t gloo_shm_p2p(const struct gloo_shm *g);
/* The largest message a channel holds whole without its receive (the ring
 * less a frame: shmp2p.c); 0 without channels (comm ops p2p_buffered). */
size_t gloo_shm_p2p_buffered(const struct gloo_shm *g);
/* How long the channels' waits poll before they sleep on the futex (after
 * open: SHMP2P_SPIN_NS; none while the ranks outnumber their CPUs). */
void gloo_shm_p2p_spin(struct gloo_shm *g, long long ns);
/* Send buf[0..bytes) to rank peer, or receive the next message from it
 * (which must have `bytes`), through the channels (gloo_shm_p2p(g) != 0);
 * one thread at a time per peer and direction (a lock). */
kiln_status gloo_shm_send(struct gloo_shm *g, int peer, const void *buf, size_t bytes);
kiln_status gloo_shm_recv(struct gloo_shm *g, int peer, void *buf, size_t bytes);
/* gloo_shm_send if it need not wait (shmp2p_try_send): 1 sent, 0 not. */
int gloo_shm_try_send(struct gloo_shm *g, int peer, const void *buf, size_t bytes);

enum { GLOO_SHM_ALLREDUCE, GLOO_SHM_REDUCE_SCATTER, GLOO_SHM_ALLGATHER };

/* One collective (SHMCOLL_SPIN waits; a node's group: see above), as shmcoll_allreduce (buf in
 * place), shmcoll_reduce_scatter (send -> buf, count per rank) or
 * shmcoll_allgather (send -> buf, count bytes per rank; dtype unused);
 * scale multiplies the sums (1/world for averages).  One at a time. */
kiln_status gloo_shm_run(struct gloo_shm *g, int kind, const void *send, void *buf, size_t count,
			 int dtype, float scale);

/* comm ops alloc_shared (collective): a second object, world x `bytes`
 * (rounded up to pages) made and shared as in steps 2-3 (store keys
 * <prefix>region/, <prefix>failed/3.., a room check of /dev/shm first),
 * declared to the collectives as their region; *ptr is this rank's part.
 * want = 0 ([plugin.gloo] zero_copy = 0) takes part in the agreement and
 * makes every rank say no.
 * KILN_ENOTSUP naming the reason when any rank cannot (the same on every
 * rank), or given already; other errors from the store.  Unmapped by
 * gloo_shm_close. */
kiln_status gloo_shm_alloc(struct gloo_shm *g, size_t bytes, int want, void **ptr);

/* comm ops map_shared (collective): the same object as gloo_shm_alloc's
 * (one or the other, once), not declared to the collectives; base[r] (world
 * entries) is rank r's part.  Errors as gloo_shm_alloc's. */
kiln_status gloo_shm_map(struct gloo_shm *g, size_t bytes, void **base);

/* Where this rank is among several nodes (gloo_shm_open_node). */
struct gloo_node {
	int on;                      /* the hierarchical path is taken */
	int node, nodes;             /* this rank's node (numbered in order of
				      * their first rank) of how many */
	int local_rank, local_world; /* this rank among its node's */
};

/* Several nodes, the hierarchical path (collective): each rank posts its
 * host identity under <prefix>host/<rank> and reads every other's; when
 * the ranks span several nodes and some node has two or more of them,
 * the ranks of each node open kiln's shared memory among themselves as
 * gloo_shm_open does (prefix <prefix>node/<node>/, local ranks), and all
 * agree (a store barrier) that every node did; the node's waits spin
 * 20 us, then nap 50 us, then sleep on a futex (SHMCOLL_SLEEP: the wait
 * for the first rank's network allreduce is long).  KILN_OK with nd->on and
 * *out this node's collectives (NULL on a node of one rank), or nd->on = 0
 * and why[0..n) the reason it is off; else the error. */
kiln_status gloo_shm_open_node(const struct kiln_host *host, struct kiln_store *store,
			       const char *prefix, int rank, int world, int timeout_ms,
			       struct gloo_node *nd, struct gloo_shm **out, char *why, size_t n);

/* SHMCOLL_CHUNK, the bytes per round and rank (for the description). */
size_t gloo_shm_chunk(void);

/* g is a split group of parent's ranks: its waits yield when parent's
 * ranks outnumber their CPUs (shmcoll_inherit). */
void gloo_shm_inherit(struct gloo_shm *g, struct gloo_shm *parent);
/* Whether g's waits yield rather than spin (shmcoll_yields). */
int gloo_shm_yields(struct gloo_shm *g);

/* Unmap, release the lock and free (NULL: nothing). */
void gloo_shm_close(struct gloo_shm *g);

#ifdef __cplusplus
}
#endif
#endif
