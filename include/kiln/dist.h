/* kiln/dist.h - distributed training: the rendezvous store and the
 * process-group environment.
 *
 * The store is a small TCP key-value service hosted by rank 0 (a thread of
 * that process) that every rank, rank 0 included, talks to as a client.
 * Comm plugins bootstrap through it (Gloo exchanges its pair addresses,
 * NCCL its unique id), the core uses it for the rendezvous and to learn
 * which rank was lost when a collective fails.  Values are byte strings;
 * `add` treats a key as a decimal integer counter.
 *
 * Threads: one store may be used from several threads (requests are
 * serialised).  Nothing here exits or prints; failures return a status and
 * set the message (kiln_last_error()).  A request whose answer this
 * process has no memory for fails with KILN_ENOMEM ("store HOST:PORT: out
 * of memory for the answer to KEY") and leaves the connection usable
 * (before session 39: KILN_EIO, "connection lost", as if rank 0 had died,
 * and the connection broken).
 */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kiln_store;

/* Where this process stands in the group, from the environment. */
struct kiln_dist_env {
	int rank, world, local_rank, local_world;
	char master_addr[256];  /* host name or address of rank 0's store */
	int master_port;
	const char *source;     /* "KILN_*", "torchrun", "Slurm", "Open MPI" or "none" */
};

/* Read rank, world size, local rank and the store's address from, in
 * order: KILN_RANK/KILN_WORLD_SIZE/KILN_LOCAL_RANK/KILN_LOCAL_WORLD_SIZE/
 * KILN_MASTER_ADDR/KILN_MASTER_PORT; torchrun's RANK/WORLD_SIZE/LOCAL_RANK/
 * LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT; Slurm's SLURM_PROCID/
 * SLURM_NTASKS/SLURM_LOCALID; Open MPI's OMPI_COMM_WORLD_RANK/_SIZE/
 * _LOCAL_RANK/_LOCAL_SIZE.  The address falls back to KILN_MASTER_ADDR,
 * MASTER_ADDR, then 127.0.0.1, the port to KILN_MASTER_PORT, MASTER_PORT,
 * then 29500.  No variable set: rank 0 of 1 (source "none").  KILN_EUSAGE
 * naming the variable when one is malformed or rank >= world. */
kiln_status kiln_dist_env_read(struct kiln_dist_env *env);

/* NULL arguments (kiln/kiln.h): KILN_EINVAL ("FUNCTION: ARG is NULL") for
 * the store's handle, keys and result pointers; a value pointer only with
 * len > 0, keys only with n > 0; *len and add's *out may be NULL. */

/* Open the store of a group of `world` ranks at host:port.  Rank 0
 * (`host_it`) listens on host:port (0: an ephemeral port, see
 * kiln_store_port) only, and serves in a thread; every rank then
 * connects, retrying until timeout_ms has passed (KILN_ETIMEOUT naming
 * host:port), and proves it holds the run's token (an HMAC-SHA256 of the
 * server's random challenge): $KILN_STORE_TOKEN, else the file
 * $KILN_STORE_TOKEN_FILE (owned by this user, mode 600); KILN_EUSAGE when
 * there is none, KILN_EIO at once when the store refuses it; a connection
 * that closes or goes silent during that handshake is made again until
 * timeout_ms (a warning says so).  timeout_ms also
 * bounds every later call that takes no timeout of its own ([dist]
 * timeout).  Limits (a value at most 8 MiB, 32 MiB and 65536 keys in
 * all): docs/distributed.md, "The store".  The caller frees *out with
 * kiln_store_close. */
kiln_status kiln_store_open(const char *host, int port, int host_it, int rank, int world,
			    int timeout_ms, struct kiln_store **out);
/* Say goodbye (a rank that leaves cleanly is not reported lost), close the
 * connection, and on rank 0 stop the server.  NULL is a no-op. */
void kiln_store_close(struct kiln_store *s);
/* The port the store listens on (rank 0) or was reached at. */
int kiln_store_port(const struct kiln_store *s);

/* Set key to val[0..len) (replacing any value); KILN_EIO when the store's
 * limits refuse it. */
kiln_status kiln_store_set(struct kiln_store *s, const char *key, const void *val, size_t len);
/* Wait up to timeout_ms for key to exist and return a malloc'd copy of its
 * value (NUL-terminated beyond len; the caller frees).  KILN_ETIMEOUT. */
kiln_status kiln_store_get(struct kiln_store *s, const char *key, int timeout_ms, void **val,
			   size_t *len);
/* Non-blocking get: *val = NULL (and KILN_OK) when key does not exist. */
kiln_status kiln_store_check(struct kiln_store *s, const char *key, void **val, size_t *len);
/* Add delta to the integer at key (absent = 0) and return the new value. */
kiln_status kiln_store_add(struct kiln_store *s, const char *key, int64_t delta, int64_t *out);
/* Wait up to timeout_ms for the first of keys[0..n) that exists, polling
 * (kiln_store_check with growing pauses, up to 50 ms), so that giving up
 * leaves the connection usable, which a timed-out get does not: *which =
 * its index and *val its malloc'd value (the caller frees), or KILN_ETIMEOUT
 * with *which = -1 and *val = NULL. */
kiln_status kiln_store_poll(struct kiln_store *s, const char *const *keys, int n, int timeout_ms,
			    int *which, void **val);
/* Wait up to timeout_ms (in all) for every key of keys[0..n) to exist. */
kiln_status kiln_store_wait(struct kiln_store *s, const char *const *keys, int n, int timeout_ms);

/* The rendezvous: every rank announces itself and waits until all `world`
 * have.  First it claims its rank: KILN_ECONFIG ("rank R joined twice",
 * naming both processes) when another process holds it, and then this
 * process alone fails; only a won claim makes the connection rank R's
 * (its death after every rank joined is "rank R was lost") and posts
 * kiln/joined/R, kiln/host/R and kiln/addr/R.  A claim whose connection
 * closes before every rank joined is released, so the rank can join
 * again.  When this rank's own connection breaks meanwhile (a link blip;
 * the store dropped it), it connects and claims again, taking over the
 * claim the store may still hold for it (session 33; a warning says so).
 * timeout_ms bounds the whole of it.  On timeout, KILN_ETIMEOUT lists the
 * ranks that never arrived (and the claims the store refused). */
kiln_status kiln_store_rendezvous(struct kiln_store *s, int rank, int world, int timeout_ms);

/* The first rank the store saw leave without saying goodbye after every
 * rank joined (its connection closed: the process died), waiting up to wait_ms for one to
 * be reported; -1 (KILN_STORE_NONE_LOST) when none was, every other rank
 * still holding its connection (a peer that failed to answer is then
 * stuck, not dead); KILN_STORE_GONE when the store's connection is closed
 * (rank 0, which hosts it, died or its host went down: the caller cannot
 * know about any other rank); KILN_STORE_SILENT when the store answered
 * nothing within 2 s (or the store's timeout, if shorter): rank 0 is
 * stopped or the link to it is cut.  Each read of the store is bounded
 * so, whatever the store's timeout.  (Before session 15 a gone store
 * returned 0, as if rank 0 were a lost peer the store had seen.)  An
 * answer this process had no memory for is no sign of the store's loss:
 * -1 then (before session 39, KILN_STORE_GONE). */
#define KILN_STORE_NONE_LOST (-1)
#define KILN_STORE_GONE (-2)
#define KILN_STORE_SILENT (-3)
int kiln_store_lost_rank(struct kiln_store *s, int wait_ms);

/* The program's answer to an unrecoverable failure on a thread that
 * cannot return a status (a comm plugin's watchdog, through host->fatal):
 * `kiln` exits non-zero.  The message is the failure's.  NULL: log only. */
void kiln_set_fatal_handler(void (*fn)(const char *msg));

#ifdef __cplusplus
}
#endif
#endif /* KILN_DIST_H */
