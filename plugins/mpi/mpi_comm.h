/* plugins/mpi/mpi_comm.h - the MPI communicator's private parts, shared by
 * its files (not installed):
 *
 *   mpi.c        open, split, close, the plugin's table and keys
 *   mpi_jobs.c   collectives and point to point as jobs on the caller's
 *                streams, their waits, the 16-bit reductions
 *   mpi_now.c    send_now: small sends on the calling thread
 *   mpi_shm.c    kiln's shared-memory collectives' windows
 *   mpi_watch.c  names in messages and the watchdog over MPI calls
 *
 * The overview (waiting, timeouts, reductions) is mpi.c's head comment.
 * Everything here is called with the communicator's rules of mpi.c:
 * never two collectives at once on one communicator; MPI calls from
 * several threads only at MPI_THREAD_MULTIPLE (c->multiple). */
#ifndef KILN_PLUGIN_MPI_COMM_H
#define KILN_PLUGIN_MPI_COMM_H

#include <kiln/plugin.h>

#include "../common/describe.h"
#include "../common/shmcoll.h"
#include "../common/watchdog.h"

#include <mpi.h>

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* the host table (mpi_open keeps it; hidden: PLUGIN_CFLAGS) */
extern const struct kiln_host *H;

/* One enqueued collective: a slot of the communicator's pool, taken by the
 * thread that enqueues and given back by the host function that runs it
 * (nothing is allocated per collective; with JOBS in flight the next
 * waits for a slot, mpi_jobs.c's job_get). */
struct mpi_comm;

struct job {
	struct mpi_comm *c;
	int kind, dtype, op, root;
	void *buf;
	const void *send;
	size_t count;
	/* K_SENDRECV: the recv half (buf, from rank src, rcount elements);
	 * send, count and root are the send half */
	size_t rcount;
	int src;
	atomic_int busy;
	struct job *next_kept; /* a captured job's link in mpi_comm.kept */
};
#define JOBS 256

/* How a collective that runs on a stream worker waits ([plugin.mpi] wait). */
enum { W_BLOCK, W_YIELD, W_SLEEP, W_MEET };

/* Threads of one communicator in an MPI call at once, each watched
 * (struct mpi_watch): a pipeline rank's stage stream and send stream, and
 * a training thread's barrier; more go unwatched. */
#define MPI_WATCH_SLOTS 4

struct mpi_comm {
	struct kiln_device *dev;
	int rank, world, timeout_ms;
	/* every call's communicator: c->comm, or a split's (sub: it
	 * is freed by close, which leaves MPI initialised) */
	MPI_Comm comm;
	int sub;
	/* a split's: rank r's world rank, what messages name (split_world);
	 * NULL on the world's communicator */
	int *world_of;
	int use_shm;               /* [plugin.mpi] shm */
	int wait;                  /* W_* */
	long long spin_ns;         /* MPI_Test without a pause for this long first */
	struct timespec nap;       /* W_SLEEP's pause between MPI_Test calls */
	MPI_Op sum16[2]; /* [0] bf16, [1] f16 */
	MPI_Datatype u16;
	struct watchdog dog;
	/* What the watchdog watches: a slot per thread in an MPI call at
	 * once (the stage's stream and the send stream of a pipeline rank,
	 * send_now on either; one slot shared, a send_now's unwatch un-watched
	 * a worker's hung receive). */
	struct mpi_watch {
		atomic_int busy;         /* the slot is a thread's (watch to unwatch) */
		atomic_llong started_ns; /* 0: no call in progress (or reported) */
		atomic_int what;         /* its kind, for the message */
		atomic_llong count;
		atomic_int peer;  /* a send's or recv's other rank, for the message */
		atomic_int peer2; /* a sendrecv's source (-1: none), likewise */
	} watch[MPI_WATCH_SLOTS];
	char desc[640];
	struct job jobs[JOBS];
	int next_job;
	/* the device's KILN_PROC_HOST_FN_SKIP (mpi_open; NULL: none): a stream
	 * that skips a job (it failed) gives its slot back */
	kiln_status (*host_fn_skip)(void *ctx, void *stream, kiln_status (*fn)(void *),
				    void (*skip)(void *), void *arg);
	struct job *kept; /* jobs of captured steps, replayed until close */
	int shm_on;          /* kiln's shared-memory collectives (every rank on this node) */
	MPI_Win shm_win;     /* their segments */
	struct shmcoll shm;
	char shm_why[128];   /* why shm_on is 0 */
	int zero_copy;       /* [plugin.mpi] zero_copy */
	int region_on;       /* alloc_shared gave region_win's memory */
	MPI_Win region_win;
	/* send_now's small messages in flight, by peer (world entries, each
	 * made by its first send_now: now_ring); multiple: MPI_THREAD_MULTIPLE,
	 * which p2p_buffered needs (the stage's stream and the send stream
	 * both send) */
	struct now_ring *_Atomic *now;
	int multiple;
};

/* send_now's messages of at most NOW_BYTES (p2p_buffered): each copied
 * into a slot of its peer's ring and sent by MPI_Isend from there, so
 * that neither the call nor its caller's buffer waits for the receive;
 * a slot is free again once its MPI_Test says the send completed.  With
 * NOW_SLOTS in flight to one peer, the next waits for the oldest: the
 * receive of an earlier message, which p2p_buffered's contract allows.
 * (MPI_Bsend would need the process's one attached buffer, and refuses,
 * MPI_ERR_BUFFER, rather than waits when it is full.) */
#define NOW_BYTES 64
#define NOW_SLOTS 32
struct now_ring {
	MPI_Request req[NOW_SLOTS];
	unsigned char bytes[NOW_SLOTS][NOW_BYTES];
	unsigned head, n; /* the oldest in flight; how many */
};

enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER, K_SEND, K_RECV,
       K_SENDRECV };
extern const char *const mpi_kind_names[]; /* by K_*, for messages */
/* the tag of kiln's point-to-point messages (matched in order per pair) */
#define P2P_TAG 0x6b70

/* ---- mpi_watch.c: names in messages, the watchdog ------------------------ */

/* rank r of c as the world knows it */
int mpi_wrank(const struct mpi_comm *c, int r);
/* this rank, for messages: "rank R of W", or on a split's communicator
 * "world rank X (rank R of W of a split)" */
const char *mpi_me_name(const struct mpi_comm *c, char *buf, size_t n);
/* a peer, for messages: "rank P" or "world rank X" */
const char *mpi_peer_name(const struct mpi_comm *c, int r, char *buf, size_t n);
/* the watchdog's look (watchdog_start's callback; its lock held) */
int mpi_look(void *arg);
/* Watch the calling thread's MPI call (kind K_*; peer, peer2: a point to
 * point call's ranks for the message, else -1): its slot for mpi_unwatch,
 * or -1 (unwatched) when every slot is taken. */
int mpi_watch_call(struct mpi_comm *c, int kind, size_t count, int peer, int peer2);
void mpi_unwatch(struct mpi_comm *c, int slot);

/* ---- mpi_shm.c ----------------------------------------------------------- */

/* kiln's shared-memory collectives on when every rank shares this node;
 * else off, *why saying why.  Collective (open and split). */
void mpi_shm_setup(struct mpi_comm *c, char *why, size_t n);
/* collective, before MPI_Finalize */
void mpi_shm_teardown(struct mpi_comm *c);
kiln_status mpi_alloc_shared(void *ctx, size_t bytes, void **ptr);
kiln_status mpi_map_shared(void *ctx, size_t bytes, void **base);

/* ---- mpi_jobs.c ---------------------------------------------------------- */

/* MPI_User_functions of the 16-bit sums (MPI_Op_create: comm_setup) */
void mpi_sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt);
void mpi_sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt);
/* an MPI call's failure as kiln's error, this rank named (mpi_job_fail:
 * a point to point job's peers too) */
kiln_status mpi_fail(struct mpi_comm *c, int rc, const char *what);
kiln_status mpi_job_fail(struct mpi_comm *c, const struct job *j, int rc, const char *what);
/* complete *req as the W_* policy `how` waits (paced, never a core held
 * for long) */
int mpi_wait_req(struct mpi_comm *c, int how, MPI_Request *req);
/* run job arg (struct job *) now, on the calling thread */
kiln_status mpi_run_job(void *arg);
/* a job on stream (device_host_fn), `done` recorded after it */
kiln_status mpi_enqueue(struct mpi_comm *c, struct job want, void *stream, void *done);
kiln_status mpi_allreduce(void *ctx, void *buf, size_t count, int dtype, int op, void *stream,
			  void *done);
kiln_status mpi_broadcast(void *ctx, void *buf, size_t count, int dtype, int root, void *stream,
			  void *done);
kiln_status mpi_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
			  void *stream, void *done);
kiln_status mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, int dtype,
			       int op, void *stream, void *done);
kiln_status mpi_send(void *ctx, const void *buf, size_t count, int dtype, int peer, void *stream,
		     void *done);
kiln_status mpi_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
		     void *done);
kiln_status mpi_sendrecv(void *ctx, const void *send_buf, size_t send_count, int dst,
			 void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
			 void *done);
kiln_status mpi_barrier(void *ctx);

/* ---- mpi_now.c ----------------------------------------------------------- */

kiln_status mpi_send_now(void *ctx, const void *buf, size_t count, int dtype, int peer, int wait,
			 int *sent);
size_t mpi_p2p_buffered(void *ctx, int peer);
/* at close: the rings of send_now freed (or left to MPI when in flight) */
void mpi_now_free(struct mpi_comm *c);

#endif
