/* plugins/mpi/mpi.c - the MPI communicator (kiln-mpi.so), on Open MPI.
 *
 * For runs started by mpirun or srun: rank and world come from MPI itself
 * (and must agree with the environment the core read).  MPI_Init_thread
 * asks for MPI_THREAD_SERIALIZED ([plugin.mpi] thread_level = multiple
 * asks for MPI_THREAD_MULTIPLE): collectives run as host functions on the
 * caller's streams (host->device_host_fn: the CPU device's stream
 * workers), barrier on the training thread, but never two at once: the
 * core orders every collective after the previous one through events
 * (buckets on the comm stream, log-point sums, ZeRO and broadcasts on the
 * compute stream after waiting for the comm stream).  Buffers must be host memory: the
 * plugin refuses devices other than cpu.
 *
 * Waiting.  Open MPI's blocking collectives busy-poll shared memory while
 * the peers are still computing, so a collective on the comm stream's
 * worker holds a core while it waits.  By default ([plugin.mpi] wait =
 * auto) that is what runs: on a quiet 2-core machine it gave the lowest
 * exposed communication and the fastest 2-rank DDP step (docs/PERFORMANCE.md
 * part 6); with ZeRO-1, whose overlapped collectives spin longer, auto is
 * yield.  The other policies run a collective on a stream worker as the
 * nonblocking one (MPI_Iallreduce, ...) completed by MPI_Test with a
 * sched_yield() (yield) or a nap (sleep) between tests, or (meet) a
 * napping MPI_Ibarrier before the blocking call: less CPU when the cores
 * are oversubscribed, at the price of slower progress.  Point-to-point
 * sends, recvs and sendrecvs on a stream worker are nonblocking under
 * every policy, block included (MPI_Isend/MPI_Irecv; Open MPI 4 has no
 * MPI_Isendrecv), their MPI_Test loop polling back to back for up to
 * SHMCOLL_SPIN_NS under block: a pipeline rank waiting for a slow peer
 * does not hold a core (docs/PERFORMANCE.md, "Session 13: point-to-point
 * waits").  Past 5 ms, or once
 * another thread had the core, every one of them naps, the naps doubling
 * up to 1 ms (wait_req, paced as shmcoll's waits: shmcoll_pace).  A collective that
 * runs inline on the enqueuing thread (a synchronous stream: `kiln bench
 * comm`) always blocks ([plugin.mpi] wait, spin_us, sleep_us, nbc_ring).
 *
 * Sends on the calling thread (comm ops send_now, p2p_buffered; session
 * 33): a message of at most NOW_BYTES, the pipeline's 8-byte hand-off
 * tokens, is copied and sent by MPI_Isend at once, its completion tested
 * later (struct now_ring), so the stage's stream sends its tokens itself
 * and the send stream's thread is not woken per message.  That needs
 * MPI_THREAD_MULTIPLE (thread_level = multiple, which [dist] pipeline on
 * kiln-mpi requires): p2p_buffered is 0 without it.
 *
 * Timeouts.  An MPI collective cannot be cancelled.  A watchdog thread
 * watches the one in progress; past [dist] timeout it reports the error
 * through host->fatal, and the CLI ends the process (mpirun then ends the
 * job).  The plugin itself never exits.
 *
 * Reductions: MPI_SUM on MPI_FLOAT for f32; for bf16 and f16 a
 * user-defined MPI_Op over 16-bit elements (widen, add, round).  Averages
 * are sums scaled by 1/world on the same thread.
 */
#include <kiln/plugin.h>

#include "../common/clones.h"
#include "../common/half.h"
#include "../common/shmcoll.h"
#include "../common/comm_init.h"
#include "../common/watchdog.h"

#include <mpi.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct kiln_host *H;

/* One enqueued collective: a slot of the communicator's pool, taken by the
 * thread that enqueues and given back by the host function that runs it
 * (nothing is allocated per collective; more than JOBS in flight is an
 * error). */
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
static const char *const wait_names[] = { "block", "yield", "sleep", "meet" };

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
static const char *const kind_names[] = { "allreduce", "broadcast", "allgather",
					  "reduce_scatter", "barrier", "send", "recv",
					  "sendrecv" };
/* the tag of kiln's point-to-point messages (matched in order per pair) */
#define P2P_TAG 0x6b70

/* ---- 16-bit float arithmetic ------------------------------------------- */

/* b[i] = a[i] + b[i] in bf16 or f16, each sum in f32 and rounded once */
static void sum16(const uint16_t *a, uint16_t *b, int n, int bf16)
{
	for (int i = 0; i < n; i++)
		b[i] = bf16 ? half_f32_bf16(half_bf16_f32(a[i]) + half_bf16_f32(b[i]))
			    : half_f32_f16(half_f16_f32(a[i]) + half_f16_f32(b[i]));
}

/* MPI_User_function for MPI_Op_create */
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	sum16(in, inout, *len, 1);
}

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt)
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

static size_t dtype_size(int dt)
{
	switch (dt) {
	case KILN_F32: case KILN_I32: return 4;
	case KILN_BF16: case KILN_F16: return 2;
	case KILN_I64: return 8;
	default: return 1;
	}
}

/* ---- names in messages ---------------------------------------------------- */

/* rank r of c as the world knows it */
static int wrank(const struct mpi_comm *c, int r)
{
	return c->world_of && r >= 0 && r < c->world ? c->world_of[r] : r;
}

/* this rank, for messages: "rank R of W", or on a split's communicator
 * "world rank X (rank R of W of a split)" (the group's ranks mean nothing
 * to the user) */
static const char *me_name(const struct mpi_comm *c, char *buf, size_t n)
{
	return shm_name_me(buf, n, NULL, c->world_of, c->rank, c->world);
}

/* a peer, for messages: "rank P" or "world rank X" */
static const char *peer_name(const struct mpi_comm *c, int r, char *buf, size_t n)
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
		at += snprintf(buf + at, n - (size_t)at, "%s %d", r ? "," : "", wrank(c, r));
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
		me_name(c, me, sizeof me);
		peer_name(c, atomic_load(&w->peer), p, sizeof p);
		peer_name(c, from, f, sizeof f);
		if (kind == K_SENDRECV && from >= 0 && from != atomic_load(&w->peer))
			H->fatal("mpi", "mpi: %s: MPI sendrecv to %s and from %s did not complete within [dist] timeout = %.1f s: %s or %s is lost or stuck; ending this rank",
				 me, p, f, c->timeout_ms / 1000.0, p, f);
		else if (kind == K_SEND || kind == K_RECV || kind == K_SENDRECV)
			H->fatal("mpi", "mpi: %s: MPI %s %s %s of %lld elements did not complete within [dist] timeout = %.1f s: %s is lost or stuck; ending this rank",
				 me, kind_names[kind], kind == K_RECV ? "from" : "to", p,
				 (long long)atomic_load(&w->count), c->timeout_ms / 1000.0, p);
		else
			H->fatal("mpi", "mpi: %s: MPI %s%s of %lld elements did not complete within [dist] timeout = %.1f s: a rank is lost or stuck; ending this rank",
				 me, kind_names[atomic_load(&w->what)], members(c, all, sizeof all),
				 (long long)atomic_load(&w->count), c->timeout_ms / 1000.0);
		/* without a fatal handler: report once, keep watching (a new
		 * call in the slot meanwhile keeps its start) */
		atomic_compare_exchange_strong(&w->started_ns, &t0, 0);
		pthread_mutex_lock(&c->dog.lock);
	}
}

/* the watchdog's look (its lock held): report a call in progress once it
 * is older than the timeout */
static int mpi_look(void *arg)
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
static int watch(struct mpi_comm *c, int kind, size_t count, int peer, int peer2)
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

static void unwatch(struct mpi_comm *c, int slot)
{
	if (slot < 0)
		return;
	atomic_store(&c->watch[slot].started_ns, 0);
	atomic_store(&c->watch[slot].busy, 0);
}

/* Whether `yes` holds on every rank (collective: every rank calls it at
 * the same point); a failed MPI_Allreduce counts as no. */
static int every_rank(const struct mpi_comm *c, int yes)
{
	int all = 0;
	return MPI_Allreduce(&yes, &all, 1, MPI_INT, MPI_MIN, c->comm) == MPI_SUCCESS && all;
}

/* Map kiln's shared-memory collectives' segments (plugins/common/shmcoll.h)
 * in an MPI_Win_allocate_shared window when every rank shares this node;
 * else leave them off, *why saying why.  Collective: every rank calls it
 * at open. */
static void mpi_shm_setup(struct mpi_comm *c, char *why, size_t n)
{
	MPI_Comm node;
	int nsize = 0;
	if (MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
	    MPI_SUCCESS) {
		snprintf(why, n, "MPI_Comm_split_type failed");
		return;
	}
	MPI_Comm_size(node, &nsize);
	if (!every_rank(c, nsize == c->world && c->world <= SHMCOLL_MAXW)) {
		MPI_Comm_free(&node);
		snprintf(why, n, c->world > SHMCOLL_MAXW ? "more than 64 ranks" : "the ranks span several nodes");
		return;
	}
	/* Open MPI backs the window with a file in /dev/shm; on a full one
	 * MPI_Win_allocate_shared fails on some ranks while the others wait
	 * inside it for them (a deadlock, found in session 31): ask for room
	 * first and agree, so that no rank calls it unless every rank may */
	unsigned long long have, need;
	const int room = shm_room((SHMCOLL_SEGMENT + 64) * (size_t)c->world, &have, &need);
	if (!every_rank(c, room)) {
		MPI_Comm_free(&node);
		if (room)
			snprintf(why, n, "another rank's /dev/shm lacks the %llu MiB wanted for the collectives' segments",
				 need >> 20);
		else
			snprintf(why, n, "/dev/shm has %llu MiB free, %llu MiB wanted for the collectives' segments",
				 have >> 20, need >> 20);
		return;
	}
	void *mem = NULL;
	/* disp_unit is no alignment: Open MPI packs the segments 8-byte
	 * aligned, so each is 64 bytes longer and its start rounded up to the
	 * 64 shmcoll_hdr needs (found by UBSan in session 30: the ranks'
	 * flags shared cache lines) */
	const int ok = MPI_Win_allocate_shared((MPI_Aint)SHMCOLL_SEGMENT + 64, 64, MPI_INFO_NULL,
					       node, &mem, &c->shm_win) == MPI_SUCCESS;
	MPI_Comm_free(&node);
	if (!every_rank(c, ok)) {
		if (ok)
			MPI_Win_free(&c->shm_win);
		snprintf(why, n, "MPI_Win_allocate_shared failed on a rank");
		return;
	}
	/* one node, split with key 0: the node's ranks are c->comm's */
	void *seg[SHMCOLL_MAXW];
	for (int r = 0; r < c->world; r++) {
		MPI_Aint sz = 0;
		int unit = 0;
		MPI_Win_shared_query(c->shm_win, r, &sz, &unit, &seg[r]);
		seg[r] = (void *)(((uintptr_t)seg[r] + 63) & ~(uintptr_t)63);
	}
	kiln_status st = shmcoll_init(&c->shm, H, "mpi", c->rank, c->world, seg, c->timeout_ms,
				      c->spin_ns, c->nap.tv_sec * 1000000000ll + c->nap.tv_nsec);
	MPI_Barrier(c->comm);
	c->shm_on = st == KILN_OK;
}

static void mpi_shm_teardown(struct mpi_comm *c)
{
	if (c->region_on)
		MPI_Win_free(&c->region_win);
	if (c->shm_on)
		MPI_Win_free(&c->shm_win);
	c->shm_on = c->region_on = 0;
}

static kiln_status shared_window(struct mpi_comm *c, size_t bytes, int keyed, const char *what,
				 void **base);

/* comm ops version 3: the memory of one MPI_Win_allocate_shared window
 * (each rank's segment page-aligned: alloc_shared_noncontig), declared to
 * the shared-memory collectives as their region (shmcoll_region) */
static kiln_status mpi_alloc_shared(void *ctx, size_t bytes, void **ptr)
{
	struct mpi_comm *c = ctx;
	*ptr = NULL;
	if (!c->shm_on)
		return H->error(KILN_ENOTSUP, "mpi: no shared memory (%s)", c->shm_why);
	if (c->region_on)
		return H->error(KILN_ENOTSUP, "mpi: the shared buffer was given already");
	/* watched: a rank that failed before this call never joins it (it
	 * waits in close's collectives instead), and the watchdog ends this
	 * one after [dist] timeout rather than let both wait forever */
	void *base[SHMCOLL_MAXW];
	const int ws = watch(c, K_BARRIER, 0, -1, -1);
	kiln_status st = shared_window(c, bytes, 1, "the shared gradients", base);
	unwatch(c, ws);
	if (st)
		return st;
	shmcoll_region(&c->shm, base, (bytes + 4095) / 4096 * 4096);
	*ptr = base[c->rank];
	return KILN_OK;
}

/* comm ops version 8: the same window, every rank's segment given, not
 * declared to the collectives */
static kiln_status mpi_map_shared(void *ctx, size_t bytes, void **base)
{
	struct mpi_comm *c = ctx;
	for (int r = 0; r < c->world; r++)
		base[r] = NULL;
	if (!c->shm_on)
		return H->error(KILN_ENOTSUP, "mpi: no shared memory (%s)", c->shm_why);
	if (c->region_on)
		return H->error(KILN_ENOTSUP, "mpi: the shared buffer was given already");
	const int ws = watch(c, K_BARRIER, 0, -1, -1);
	kiln_status st = shared_window(c, bytes, 0, "the mapped buffers", base);
	unwatch(c, ws);
	return st;
}

/* One MPI_Win_allocate_shared window of bytes a rank, zeroed, every
 * rank's segment into base[]; keyed: [plugin.mpi] zero_copy may refuse it */
static kiln_status shared_window(struct mpi_comm *c, size_t bytes, int keyed, const char *what,
				 void **base)
{
	/* every rank's zero_copy, agreed: ranks configured apart do not
	 * wait for each other in different calls */
	if (keyed && !every_rank(c, c->zero_copy))
		return H->error(KILN_ENOTSUP, "mpi: [plugin.mpi] zero_copy = 0%s",
				c->zero_copy ? " on another rank" : "");
	const size_t size = shm_segment_bytes(bytes);
	/* Open MPI backs the window with a file in /dev/shm: a tmpfs without
	 * room for every rank's segment would end the process with SIGBUS at
	 * the first touch, so ask for room first (and agree on the answer) */
	unsigned long long have, need;
	const int room = shm_room(size * (size_t)c->world, &have, &need);
	if (!every_rank(c, room))
		return room ? H->error(KILN_ENOTSUP, "mpi: another rank's /dev/shm lacks the %llu MiB wanted for %s",
				       need >> 20, what)
			    : H->error(KILN_ENOTSUP, "mpi: /dev/shm has %llu MiB free, %llu MiB wanted for %s",
				       have >> 20, need >> 20, what);
	MPI_Info info;
	void *mem = NULL;
	MPI_Info_create(&info);
	MPI_Info_set(info, "alloc_shared_noncontig", "true");
	const int ok = MPI_Win_allocate_shared((MPI_Aint)size, 64, info, c->comm, &mem,
					       &c->region_win) == MPI_SUCCESS;
	MPI_Info_free(&info);
	if (!every_rank(c, ok)) {
		if (ok)
			MPI_Win_free(&c->region_win);
		return H->error(KILN_ENOTSUP, "mpi: MPI_Win_allocate_shared of %zu bytes failed on a rank",
				size);
	}
	for (int r = 0; r < c->world; r++) {
		MPI_Aint sz = 0;
		int unit = 0;
		MPI_Win_shared_query(c->region_win, r, &sz, &unit, &base[r]);
	}
	memset(mem, 0, size);
	MPI_Barrier(c->comm);
	c->region_on = 1;
	return KILN_OK;
}

/* ---- collectives ---------------------------------------------------------- */

static kiln_status mpi_fail(struct mpi_comm *c, int rc, const char *what)
{
	char s[MPI_MAX_ERROR_STRING], me[96];
	int n = 0;
	MPI_Error_string(rc, s, &n);
	return H->error(KILN_EIO, "mpi: %s: %s failed: %.*s", me_name(c, me, sizeof me), what, n, s);
}

/* A job's MPI call failed: mpi_fail, its peers named (point to point) */
static kiln_status job_fail(struct mpi_comm *c, const struct job *j, int rc, const char *what)
{
	char w[160], p[32], f[32];
	if (j->kind == K_SENDRECV)
		snprintf(w, sizeof w, "%s (sendrecv to %s, from %s)", what,
			 peer_name(c, j->root, p, sizeof p), peer_name(c, j->src, f, sizeof f));
	else if (j->kind == K_SEND || j->kind == K_RECV)
		snprintf(w, sizeof w, "%s (%s %s %s)", what, kind_names[j->kind],
			 j->kind == K_SEND ? "to" : "from", peer_name(c, j->root, p, sizeof p));
	else
		snprintf(w, sizeof w, "%s", what);
	return mpi_fail(c, rc, w);
}

/* Set by enqueue() while the device runs the host function: a collective
 * that runs then is inline on the enqueuing thread (a synchronous stream,
 * `kiln bench comm`), not on a stream worker. */
static _Thread_local int running_inline;

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
static int wait_req(struct mpi_comm *c, int how, MPI_Request *req)
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
	const size_t es = dtype_size(j->dtype);
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
 * whole buffer and leaves this rank's result at its start, which run_job
 * moves to the slice once the collective is done. */
static int rs_in_place(const struct mpi_comm *c, const struct job *j)
{
	return j->kind == K_REDUCE_SCATTER &&
	       (const char *)j->buf == (const char *)j->send + (size_t)c->rank * j->count * dtype_size(j->dtype);
}

/* Run job j: the blocking MPI collective when req is NULL, else the
 * nonblocking one (MPI-3), its request in *req (K_SENDRECV: req[0] and
 * req[1]). */
static int start(struct mpi_comm *c, struct job *j, MPI_Request *req, const char **what)
{
	const size_t es = dtype_size(j->dtype);
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

static kiln_status run_job(void *arg)
{
	struct job *j = arg;
	struct mpi_comm *c = j->c;
	/* MPI counts are ints: reductions count elements, the rest bytes */
	const int reduces = j->kind == K_ALLREDUCE || j->kind == K_REDUCE_SCATTER;
	const size_t n = reduces ? j->count
				 : (j->count > j->rcount ? j->count : j->rcount) * dtype_size(j->dtype);
	kiln_status st = KILN_OK;
	const int how = running_inline ? W_BLOCK : c->wait;
	const int p2p = j->kind == K_SEND || j->kind == K_RECV || j->kind == K_SENDRECV;
	const int peer = j->kind == K_SENDRECV && !j->count ? j->src : j->root;
	const int peer2 = j->kind == K_SENDRECV && j->count && j->rcount ? j->src : -1;
	if (c->shm_on && j->kind != K_BROADCAST && !p2p) {
		const float sc = reduces && j->op == KILN_REDUCE_AVG ? 1.0f / (float)c->world : 1.0f;
		const int wait = how == W_BLOCK ? SHMCOLL_SPIN : how == W_YIELD ? SHMCOLL_YIELD
										: SHMCOLL_SLEEP;
		const int ws = watch(c, j->kind, j->count, peer, peer2);
		st = j->kind == K_ALLREDUCE
			     ? shmcoll_allreduce(&c->shm, wait, j->buf, j->count, j->dtype, sc)
		     : j->kind == K_REDUCE_SCATTER
			     ? shmcoll_reduce_scatter(&c->shm, wait, j->send, j->buf, j->count, j->dtype, sc)
			     : shmcoll_allgather(&c->shm, wait, j->send, j->buf,
						 j->count * dtype_size(j->dtype));
		unwatch(c, ws);
	} else if (n > (size_t)1 << 30) {
		st = H->error(KILN_ENOTSUP, "mpi: a %s of %zu %s (at most 2^30 per call)",
			      kind_names[j->kind], n, reduces ? "elements" : "bytes");
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
		const int ws = watch(c, j->kind, j->count, peer, peer2);
		if (how == W_MEET && !p2p) {
			/* wait (napping) until every rank has reached this
			 * collective, then run the blocking one: Open MPI's
			 * polling covers only the transfer itself */
			rc = MPI_Ibarrier(c->comm, &req[0]);
			if (rc == MPI_SUCCESS)
				rc = wait_req(c, how, &req[0]);
		}
		if (rc == MPI_SUCCESS)
			rc = start(c, j, paced ? req : NULL, &what);
		if (rc == MPI_SUCCESS && paced)
			rc = wait_req(c, how, &req[0]);
		if (rc == MPI_SUCCESS && paced)
			rc = wait_req(c, how, &req[1]); /* MPI_REQUEST_NULL but for K_SENDRECV */
		unwatch(c, ws);
		if (rc != MPI_SUCCESS)
			st = job_fail(c, j, rc, what);
		if (rc == MPI_SUCCESS && rs_in_place(c, j) && c->rank)
			memmove(j->buf, j->send, j->count * dtype_size(j->dtype));
		if (rc == MPI_SUCCESS && reduces && j->op == KILN_REDUCE_AVG && c->world > 1)
			scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
	}
	atomic_store_explicit(&j->busy, 0, memory_order_release);
	return st;
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
			 me_name(c, me, sizeof me), kind_names[want.kind]);
		return NULL;
	}
	job_fill(j, c, &want);
	j->next_kept = c->kept;
	c->kept = j;
	return j;
}

static struct job *job_get(struct mpi_comm *c, struct job want)
{
	for (int k = 0; k < JOBS; k++) {
		struct job *j = &c->jobs[(c->next_job + k) % JOBS];
		if (!atomic_load_explicit(&j->busy, memory_order_acquire)) {
			c->next_job = (c->next_job + k + 1) % JOBS;
			job_fill(j, c, &want);
			return j;
		}
	}
	char me[96];
	H->error(KILN_EINTERNAL, "mpi: %s: %d collectives are in flight, the most a communicator holds: %s not enqueued",
		 me_name(c, me, sizeof me), JOBS, kind_names[want.kind]);
	return NULL;
}

static kiln_status enqueue(struct mpi_comm *c, struct job want, void *stream, void *done)
{
	const int captured = H->version >= 6 && H->device_capturing(c->dev);
	struct job *j = captured ? job_keep(c, want) : job_get(c, want);
	if (!j)
		return captured ? KILN_ENOMEM : KILN_EINTERNAL;
	running_inline = 1;
	kiln_status st = H->device_host_fn(c->dev, stream, run_job, j);
	running_inline = 0;
	if (st) {
		/* a device that ran it at once gave the slot back; one that
		 * refused it did not */
		atomic_store_explicit(&j->busy, 0, memory_order_release);
		return st;
	}
	return done ? H->device_event_record(c->dev, done, stream) : KILN_OK;
}

static int reducible(int dt)
{
	return dt == KILN_F32 || dt == KILN_BF16 || dt == KILN_F16;
}

static kiln_status mpi_allreduce(void *ctx, void *buf, size_t count, int dtype, int op,
				 void *stream, void *done)
{
	if (!reducible(dtype))
		return H->error(KILN_ENOTSUP, "mpi: allreduce of dtype %d (f32, bf16, f16 only)", dtype);
	return enqueue(ctx, (struct job){ .kind = K_ALLREDUCE, .buf = buf, .count = count, .dtype = dtype, .op = op }, stream, done);
}

static kiln_status mpi_broadcast(void *ctx, void *buf, size_t count, int dtype, int root,
				 void *stream, void *done)
{
	return enqueue(ctx, (struct job){ .kind = K_BROADCAST, .buf = buf, .count = count, .dtype = dtype, .root = root }, stream, done);
}

static kiln_status mpi_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
				 void *stream, void *done)
{
	return enqueue(ctx, (struct job){ .kind = K_ALLGATHER, .send = send, .buf = recv, .count = count,
						 .dtype = dtype }, stream, done);
}

static kiln_status mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
				      int dtype, int op, void *stream, void *done)
{
	if (!reducible(dtype))
		return H->error(KILN_ENOTSUP, "mpi: reduce_scatter of dtype %d (f32, bf16, f16 only)", dtype);
	return enqueue(ctx, (struct job){ .kind = K_REDUCE_SCATTER, .send = send, .buf = recv, .count = count,
						 .dtype = dtype, .op = op }, stream, done);
}

/* Point to point: the peer rides in the job's root. */
static kiln_status mpi_p2p(struct mpi_comm *c, int kind, void *buf, size_t count, int dtype,
			   int peer, void *stream, void *done)
{
	char me[96];
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "mpi: %s: %s %s rank %d of the communicator's %d: no such peer",
				me_name(c, me, sizeof me), kind_names[kind],
				kind == K_SEND ? "to" : "from", peer, c->world);
	return enqueue(c, (struct job){ .kind = kind, .buf = buf, .count = count, .dtype = dtype,
					.root = peer }, stream, done);
}

static kiln_status mpi_send(void *ctx, const void *buf, size_t count, int dtype, int peer,
			    void *stream, void *done)
{
	return mpi_p2p(ctx, K_SEND, (void *)buf, count, dtype, peer, stream, done);
}

static kiln_status mpi_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
			    void *done)
{
	return mpi_p2p(ctx, K_RECV, buf, count, dtype, peer, stream, done);
}

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
		const int ws = watch(c, K_SEND, NOW_BYTES, peer, -1);
		rc = wait_req(c, W_BLOCK, &r->req[r->head]);
		unwatch(c, ws);
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
static kiln_status mpi_send_now(void *ctx, const void *buf, size_t count, int dtype, int peer,
				int wait, int *sent)
{
	struct mpi_comm *c = ctx;
	const size_t bytes = count * dtype_size(dtype);
	char me[96], p[32];
	*sent = 0;
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "mpi: %s: send to rank %d of the communicator's %d: no such peer",
				me_name(c, me, sizeof me), peer, c->world);
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
				me_name(c, me, sizeof me), peer_name(c, peer, p, sizeof p));
	}
	if (bytes > NOW_BYTES) {
		if (!wait)
			return KILN_OK;
		struct job j = { .c = c, .kind = K_SEND, .buf = (void *)buf, .count = count,
				 .dtype = dtype, .root = peer };
		kiln_status st = run_job(&j);
		*sent = !st;
		return st;
	}
	struct now_ring *r = now_ring(c, peer);
	if (!r)
		return H->error(KILN_ENOMEM, "mpi: %s: out of memory for the sends to %s",
				me_name(c, me, sizeof me), peer_name(c, peer, p, sizeof p));
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
		return job_fail(c, &j, rc, "MPI_Isend");
	}
	r->n++;
	*sent = 1;
	return KILN_OK;
}

/* comm ops version 8: send_now's copies (NOW_BYTES) under
 * MPI_THREAD_MULTIPLE, which the pipeline's ranks run at
 * ([plugin.mpi] thread_level = multiple: core/dist_pipe.c) */
static size_t mpi_p2p_buffered(void *ctx, int peer)
{
	const struct mpi_comm *c = ctx;
	return c->multiple && peer >= 0 && peer < c->world && peer != c->rank ? NOW_BYTES : 0;
}

/* At close: send_now's sends, which the peers' receives have completed
 * in a run that ended well.  One still in flight (a run that failed) is
 * left to MPI (MPI_Request_free) with its ring, which it may still read:
 * not freed. */
static void now_free(struct mpi_comm *c)
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

/* comm ops version 7: one job, both halves posted before either waits */
static kiln_status mpi_sendrecv(void *ctx, const void *send_buf, size_t send_count, int dst,
				void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
				void *done)
{
	struct mpi_comm *c = ctx;
	/* the core (kiln_comm_sendrecv) refused an empty call and a peer
	 * below 0 or this rank; the world's size only the communicator knows */
	char me[96];
	if ((send_count && dst >= c->world) || (recv_count && src >= c->world))
		return H->error(KILN_EINVAL, "mpi: %s: sendrecv to rank %d, from rank %d of the communicator's %d: no such peer",
				me_name(c, me, sizeof me), dst, src, c->world);
	return enqueue(c, (struct job){ .kind = K_SENDRECV, .send = send_buf, .count = send_count,
					.root = dst, .buf = recv_buf, .rcount = recv_count,
					.src = src, .dtype = dtype }, stream, done);
}

static kiln_status mpi_barrier(void *ctx)
{
	struct mpi_comm *c = ctx;
	const int ws = watch(c, K_BARRIER, 0, -1, -1);
	int rc = MPI_Barrier(c->comm);
	unwatch(c, ws);
	return rc == MPI_SUCCESS ? KILN_OK : mpi_fail(c, rc, "MPI_Barrier");
}

static const char *mpi_describe(void *ctx)
{
	return ((struct mpi_comm *)ctx)->desc;
}

/* Communicators open in this process (open and split): the last close
 * finalizes MPI. */
static atomic_int n_open;

static void mpi_close(void *ctx)
{
	struct mpi_comm *c = ctx;
	if (!c)
		return;
	char me[96];
	if (c->region_on)
		H->log(KILN_LOG_INFO, "mpi", "%s: %ld allreduces of the shared gradients, copy-free",
		       me_name(c, me, sizeof me), c->shm.region_calls);
	watchdog_destroy(&c->dog);
	int fin = 0;
	MPI_Finalized(&fin);
	if (!fin) {
		now_free(c);
		mpi_shm_teardown(c); /* collective, as MPI_Finalize is */
		MPI_Op_free(&c->sum16[0]);
		MPI_Op_free(&c->sum16[1]);
		MPI_Type_free(&c->u16);
		if (c->sub)
			MPI_Comm_free(&c->comm);
		if (atomic_fetch_sub(&n_open, 1) == 1)
			MPI_Finalize();
	}
	/* (MPI finalized before now_free: nothing is in flight) */
	for (int q = 0; c->now && q < c->world; q++)
		free(atomic_load(&c->now[q]));
	free(c->now);
	while (c->kept) {
		struct job *j = c->kept;
		c->kept = j->next_kept;
		free(j);
	}
	free(c->world_of);
	free(c);
}

/* What every communicator of c->comm makes for itself (open, split): the
 * 16-bit reductions, kiln's shared memory where the ranks share a node,
 * the watchdog.  Collective.  On failure c is closed. */
static kiln_status comm_setup(struct mpi_comm *c)
{
	int level = 0;
	atomic_fetch_add(&n_open, 1);
	watchdog_init(&c->dog);
	MPI_Query_thread(&level);
	c->multiple = level == MPI_THREAD_MULTIPLE;
	MPI_Type_contiguous(2, MPI_BYTE, &c->u16);
	MPI_Type_commit(&c->u16);
	MPI_Op_create(sum_bf16, 1, &c->sum16[0]);
	MPI_Op_create(sum_f16, 1, &c->sum16[1]);
	snprintf(c->shm_why, sizeof c->shm_why, "[plugin.mpi] shm = 0");
	if (c->use_shm)
		mpi_shm_setup(c, c->shm_why, sizeof c->shm_why);
	int rc = watchdog_start(&c->dog, mpi_look, c);
	if (rc) {
		mpi_close(c);
		return H->error(KILN_EIO, "mpi: starting the watchdog thread: %s", strerror(rc));
	}
	if (!(c->now = calloc((size_t)c->world, sizeof *c->now))) {
		mpi_close(c);
		return H->error(KILN_ENOMEM, "mpi: out of memory");
	}
	return KILN_OK;
}

/* g, split from c: each of its ranks' world rank (c's world rank of it),
 * which its messages name (g->world_of, allocated).  Collective over g. */
static kiln_status split_world(const struct mpi_comm *c, struct mpi_comm *g)
{
	const int mine = wrank(c, c->rank);
	if (!(g->world_of = malloc((size_t)g->world * sizeof *g->world_of)))
		return H->error(KILN_ENOMEM, "mpi: out of memory");
	const int rc = MPI_Allgather(&mine, 1, MPI_INT, g->world_of, 1, MPI_INT, g->comm);
	if (rc != MPI_SUCCESS) {
		char s[MPI_MAX_ERROR_STRING], me[96];
		int n = 0;
		MPI_Error_string(rc, s, &n);
		free(g->world_of);
		g->world_of = NULL;
		return H->error(KILN_EIO, "mpi: %s: MPI_Allgather of the split group's world ranks failed: %.*s",
				me_name(c, me, sizeof me), n, s);
	}
	return KILN_OK;
}

/* comm ops version 5: MPI_Comm_split of c's communicator; the group's
 * communicator waits as c does and sets up its own shared memory. */
static kiln_status mpi_split(void *ctx, int color, int key, void **out, int *rank, int *world)
{
	struct mpi_comm *c = ctx;
	MPI_Comm nc = MPI_COMM_NULL;
	*out = NULL;
	*rank = -1;
	*world = 0;
	char me[96];
	if (color < KILN_COMM_NO_GROUP)
		return H->error(KILN_EINVAL, "mpi: %s: split color %d (>= 0, or KILN_COMM_NO_GROUP)",
				me_name(c, me, sizeof me), color);
	const int ws = watch(c, K_BARRIER, 0, -1, -1);
	int rc = MPI_Comm_split(c->comm, color == KILN_COMM_NO_GROUP ? MPI_UNDEFINED : color, key,
				&nc);
	unwatch(c, ws);
	if (rc != MPI_SUCCESS)
		return mpi_fail(c, rc, "MPI_Comm_split");
	if (nc == MPI_COMM_NULL)
		return KILN_OK;
	struct mpi_comm *g = calloc(1, sizeof *g);
	if (!g) {
		MPI_Comm_free(&nc);
		return H->error(KILN_ENOMEM, "mpi: out of memory");
	}
	MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
	MPI_Comm_rank(nc, &g->rank);
	MPI_Comm_size(nc, &g->world);
	g->comm = nc;
	g->sub = 1;
	g->dev = c->dev;
	g->timeout_ms = c->timeout_ms;
	g->wait = c->wait;
	g->spin_ns = c->spin_ns;
	g->nap = c->nap;
	g->use_shm = c->use_shm;
	g->zero_copy = c->zero_copy;
	kiln_status st = split_world(c, g);
	if (st) {
		MPI_Comm_free(&g->comm);
		free(g);
		return st;
	}
	if ((st = comm_setup(g)))
		return st;
	if (g->shm_on)
		shmcoll_name_world(&g->shm, g->world_of);
	/* (the group's ranks share the CPUs with the other groups') */
	if (g->shm_on && c->shm_on)
		shmcoll_inherit(&g->shm, &c->shm);
	snprintf(g->desc, sizeof g->desc, "%.400s; group %d of MPI_Comm_split: rank %d of %d",
		 c->desc, color, g->rank, g->world);
	*out = g;
	*rank = g->rank;
	*world = g->world;
	return KILN_OK;
}

/* libnbc's MPI_Iallreduce algorithm: 1 is the ring (mpi_open) */
#define NBC_ALG "OMPI_MCA_coll_libnbc_iallreduce_algorithm"

static kiln_status mpi_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    struct kiln_store *store, struct kiln_device *dev, int rank, int world,
			    int timeout_ms, void **out)
{
	int inited = 0, provided = 0, r, w;
	(void)store;
	const char *tl = host->config_get(cfg, "plugin.mpi", "thread_level");
	const int want = tl && !strcmp(tl, "multiple") ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
	H = host;
	*out = NULL;
	if (strcmp(host->device_name(dev), "cpu"))
		return host->error(KILN_ENOTSUP, "mpi: collectives on host memory only, and [run] device = %s keeps its tensors elsewhere: use [run] comm = nccl",
				   host->device_name(dev));
	MPI_Initialized(&inited);
	/* Open MPI reads its parameters from OMPI_MCA_* at MPI_Init: kiln's
	 * defaults go there without overwriting the user's (mpirun --mca,
	 * -x, the environment) */
	int nbc_ring = 1, mca_user = getenv(NBC_ALG) != NULL;
	host->config_get_bool(cfg, "plugin.mpi", "nbc_ring", &nbc_ring);
	if (!inited && nbc_ring)
		setenv(NBC_ALG, "1", 0);
	if (!inited && MPI_Init_thread(NULL, NULL, want, &provided) != MPI_SUCCESS)
		return host->error(KILN_EIO, "mpi: MPI_Init_thread failed (was this process started by mpirun or srun?)");
	if (!inited && provided < MPI_THREAD_SERIALIZED)
		return host->error(KILN_ENOTSUP, "mpi: the MPI library offers thread level %d; kiln needs MPI_THREAD_SERIALIZED or better",
				   provided);
	/* failures come back as return codes (which every call here checks),
	 * not as Open MPI's default abort of the job */
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &r);
	MPI_Comm_size(MPI_COMM_WORLD, &w);
	if (r != rank || w != world)
		return host->error(KILN_EUSAGE, "mpi: MPI says rank %d of %d but the environment said rank %d of %d: start kiln with mpirun/srun alone (not inside kiln launch)",
				   r, w, rank, world);
	struct mpi_comm *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "mpi: out of memory");
	c->dev = dev;
	c->rank = r;
	c->world = w;
	c->timeout_ms = timeout_ms;
	c->comm = MPI_COMM_WORLD;
	/* auto: block, but yield under ZeRO-1, whose overlapped
	 * reduce-scatters and allgathers spin longer (PERFORMANCE.md part 6) */
	const char *wait = host->config_get(cfg, "plugin.mpi", "wait");
	int64_t zero = 0;
	host->config_get_int(cfg, "dist", "zero", &zero);
	c->wait = zero == 1 ? W_YIELD : W_BLOCK;
	for (int k = 0; k < 4; k++)
		if (wait && !strcmp(wait, wait_names[k]))
			c->wait = k;
	int64_t spin_us = 0, sleep_us = 0;
	host->config_get_int(cfg, "plugin.mpi", "spin_us", &spin_us);
	host->config_get_int(cfg, "plugin.mpi", "sleep_us", &sleep_us);
	c->spin_ns = spin_us * 1000;
	c->nap = (struct timespec){ .tv_sec = sleep_us / 1000000, .tv_nsec = sleep_us % 1000000 * 1000 };
	c->use_shm = 1;
	host->config_get_bool(cfg, "plugin.mpi", "shm", &c->use_shm);
	c->zero_copy = 1;
	host->config_get_bool(cfg, "plugin.mpi", "zero_copy", &c->zero_copy);
	kiln_status st = comm_setup(c);
	if (st)
		return st;
	char lib[MPI_MAX_LIBRARY_VERSION_STRING];
	int n = 0;
	MPI_Get_library_version(lib, &n);
	char *nl = strchr(lib, ',');
	if (nl)
		*nl = 0;
	char how[160] = "";
	if (c->wait != W_BLOCK)
		snprintf(how, sizeof how, " after %lld us of polling", (long long)spin_us);
	if (c->wait == W_SLEEP || c->wait == W_MEET)
		snprintf(how + strlen(how), sizeof how - strlen(how), ", %lld us naps", (long long)sleep_us);
	if (c->wait == W_YIELD || c->wait == W_SLEEP) {
		const char *alg = getenv(NBC_ALG);
		snprintf(how + strlen(how), sizeof how - strlen(how), ", iallreduce algorithm %s (%s)",
			 alg ? alg : "Open MPI's choice", mca_user ? "the user's" : alg ? "kiln's" : "default");
	}
	char shm_how[200];
	if (c->shm_on)
		snprintf(shm_how, sizeof shm_how, "kiln's shared-memory allreduce, reduce_scatter and allgather (%zu KiB rounds)",
			 SHMCOLL_CHUNK >> 10);
	else
		snprintf(shm_how, sizeof shm_how, "MPI's collectives (kiln's shared memory off: %s)", c->shm_why);
	snprintf(c->desc, sizeof c->desc, "%.100s, %s, thread level %d, stream collectives wait: %s%s, watchdog at %.0f s",
		 lib, shm_how, inited ? -1 : provided, wait_names[c->wait], how, timeout_ms / 1000.0);
	*out = c;
	return KILN_OK;
}

static int mpi_probe(const struct kiln_host *host, char *why, size_t n)
{
	(void)host;
	(void)why;
	(void)n;
	return 0;
}

static const struct kiln_comm_ops mpi_ops = {
	.version = KILN_COMM_OPS_VERSION,
	.open = mpi_open,
	.close = mpi_close,
	.allreduce = mpi_allreduce,
	.broadcast = mpi_broadcast,
	.allgather = mpi_allgather,
	.reduce_scatter = mpi_reduce_scatter,
	.barrier = mpi_barrier,
	.describe = mpi_describe,
	.alloc_shared = mpi_alloc_shared,
	.send = mpi_send,
	.recv = mpi_recv,
	.split = mpi_split,
	.send_now = mpi_send_now,
	.sendrecv = mpi_sendrecv,
	.map_shared = mpi_map_shared,
	.p2p_buffered = mpi_p2p_buffered,
	.reduce_scatter_in_place = 1, /* (MPI_IN_PLACE: rs_in_place) */
};

static const struct kiln_key mpi_keys[] = {
	{ "thread_level", KILN_KEY_ENUM, "serialized", 0, 0, "serialized|multiple",
	  "The thread support asked of MPI_Init_thread: `serialized` (MPI_THREAD_SERIALIZED, enough: kiln never runs two collectives at once) or `multiple` (MPI_THREAD_MULTIPLE, which makes Open MPI lock inside every call)." },
	{ "wait", KILN_KEY_ENUM, "auto", 0, 0, "auto|block|yield|sleep|meet",
	  "How a collective run by a stream worker (the comm stream's bucket allreduces, overlapped with backward; the log-point sums) waits for the other ranks. `auto` (default): `block`, or `yield` with [dist] zero = 1 (what measured fastest for each on a quiet 2-core machine). `block`: Open MPI's blocking collective, which busy-polls shared memory: the lowest exposed communication and the fastest 2-rank step on a quiet machine (docs/PERFORMANCE.md, part 6), though it holds a core while it waits. `yield`: the nonblocking collective (MPI_Iallreduce, ...) and MPI_Test, back to back for `spin_us`, then with sched_yield() between tests (a free core keeps polling, a busy one goes to the compute threads). `sleep`: the same with a `sleep_us` nap between tests. Either lasts up to 5 ms, and only while the core is the wait's alone; then the wait naps, from `sleep_us` doubling to 1 ms (docs/distributed.md, \"Waiting\"); Open MPI progresses a nonblocking collective only inside MPI_Test, so each nap adds up to its length per protocol round. `meet`: an MPI_Ibarrier tested with naps, then the blocking collective (Open MPI's polling covers only the transfer). Collectives that run inline (synchronous streams, `kiln bench comm`) and the barrier always block. Measurements: docs/PERFORMANCE.md, part 6." },
	{ "spin_us", KILN_KEY_INT, "20", 0, 1000000, NULL,
	  "With `wait = yield`, `sleep` or `meet`: microseconds of back-to-back MPI_Test calls before the first pause." },
	{ "sleep_us", KILN_KEY_INT, "50", 1, 1000000, NULL,
	  "With `wait = sleep` or `meet`: microseconds each pause between MPI_Test calls sleeps (nanosleep; the kernel's timer slack, 50 us by default, comes on top) during a wait's first 5 ms, and the first of the naps that double up to 1 ms after them (with `yield` too)." },
	{ "shm", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "When every rank runs on one node: allreduce, reduce_scatter and allgather run as kiln's own shared-memory collectives (an MPI_Win_allocate_shared window, 256 KiB rounds, sums in rank order in f32 so every rank gets the same bits), faster than Open MPI's at 4 KiB-1 MiB on 2 ranks (docs/PERFORMANCE.md, part 7); the barrier and broadcasts stay MPI's. 0: MPI's collectives throughout. Ranks on several nodes always use MPI's." },
	{ "zero_copy", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "With `shm` on: give the core shared memory for the gradients of a DDP run (comm ops alloc_shared), so that each bucket's allreduce sums every rank's share straight from every rank's gradients into every rank's, with no staging copies (3-4x faster than the staged path on 2 ranks, docs/PERFORMANCE.md part 7). 0: the gradients stay in the device's memory and go through the staging buffers. With [dist] zero = 1 too (not beside [dist] pipeline): its reduce-scatters read the gradients there, through the staging buffers." },
	{ "nbc_ring", KILN_KEY_BOOL, "1", 0, 0, NULL,
	  "Before MPI_Init, set OMPI_MCA_coll_libnbc_iallreduce_algorithm = 1 (libnbc's ring) unless the environment already sets it (mpirun --mca and -x win). Open MPI's own choice for an in-place MPI_Iallreduce is the binomial tree (reduce to rank 0, then broadcast: two sequential full-size transfers), 1.4-2.8x slower than the ring at 1-4 MiB on 2 ranks (docs/PERFORMANCE.md, part 6). Matters only with `wait` = `yield` or `sleep`. 0: leave Open MPI's choice." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

COMM_PLUGIN(mpi, "mpi", "MPI collectives (Open MPI; CPU tensors; start with mpirun or srun)", mpi_ops,
	    mpi_keys, mpi_probe)
