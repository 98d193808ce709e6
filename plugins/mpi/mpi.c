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
 * up to 1 ms (mpi_jobs.c mpi_wait_req, paced as shmcoll's waits: shmcoll_pace).  A collective that
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
#include "mpi_comm.h"

#include "../common/comm_init.h"
#include "../common/c_locale.h" /* common_snprintf_c */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct kiln_host *H;

static const char *const wait_names[] = { "block", "yield", "sleep", "meet" }; /* by W_* */

static const char *mpi_describe(void *ctx)
{
	return ((struct mpi_comm *)ctx)->desc;
}

/* Communicators open in this process (open and split): the last close
 * finalizes MPI. */
static atomic_int n_open;

/* Every slot of c's pool free (within [dist] timeout, napping 1 ms): a
 * caller that closes before the streams its collectives are queued on
 * have drained would have their jobs run, or skipped by a failed stream,
 * on a freed communicator.  Nothing waits where they have: the core syncs
 * each such stream first.  Only with KILN_PROC_HOST_FN_SKIP: a device
 * without it keeps a skipped job's slot busy for ever, and the drain would
 * wait the whole timeout after any stream failure.  A slot's release
 * (mpi_run_job, job_skipped) is its job's last touch of c: an atomic store,
 * after which neither they nor the stream's worker read c again. */
static void jobs_drain(struct mpi_comm *c)
{
	if (!c->host_fn_skip)
		return;
	const struct timespec nap = { 0, 1000000 };
	for (int ms = 0;; ms++) {
		int busy = 0;
		for (int k = 0; k < JOBS && !busy; k++)
			busy = atomic_load_explicit(&c->jobs[k].busy, memory_order_acquire);
		if (!busy)
			return;
		if (ms >= c->timeout_ms) {
			char me[96];
			H->log(KILN_LOG_WARN, "mpi", "%s: closed with collectives still queued on a stream after %d ms ([dist] timeout)",
			       mpi_me_name(c, me, sizeof me), c->timeout_ms);
			return;
		}
		nanosleep(&nap, NULL);
	}
}

static void mpi_close(void *ctx)
{
	struct mpi_comm *c = ctx;
	if (!c)
		return;
	jobs_drain(c);
	char me[96];
	if (c->region_on)
		H->log(KILN_LOG_INFO, "mpi", "%s: %ld allreduces of the shared gradients, copy-free",
		       mpi_me_name(c, me, sizeof me), c->shm.region_calls);
	watchdog_destroy(&c->dog);
	int fin = 0;
	MPI_Finalized(&fin);
	if (!fin) {
		mpi_now_free(c);
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
	MPI_Op_create(mpi_sum_bf16, 1, &c->sum16[0]);
	MPI_Op_create(mpi_sum_f16, 1, &c->sum16[1]);
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
	const int mine = mpi_wrank(c, c->rank);
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
				mpi_me_name(c, me, sizeof me), n, s);
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
				mpi_me_name(c, me, sizeof me), color);
	const int ws = mpi_watch_call(c, K_BARRIER, 0, -1, -1);
	int rc = MPI_Comm_split(c->comm, color == KILN_COMM_NO_GROUP ? MPI_UNDEFINED : color, key,
				&nc);
	mpi_unwatch(c, ws);
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
	g->host_fn_skip = c->host_fn_skip;
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
	c->host_fn_skip = (kiln_status (*)(void *, void *, kiln_status (*)(void *), void (*)(void *),
					   void *))host->device_proc(dev, KILN_PROC_HOST_FN_SKIP);
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
	common_snprintf_c(c->desc, sizeof c->desc, "%.100s, %s, thread level %d, stream collectives wait: %s%s, watchdog at %.0f s",
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

