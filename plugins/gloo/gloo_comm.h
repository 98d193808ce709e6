/* plugins/gloo/gloo_comm.h - what the files of kiln-gloo.so share
 * (private): kiln's store as Gloo's, the mesh's context, the
 * communicator (struct Comm) and its jobs, and the steps each file
 * holds:
 *   gloo.cc       the ops table: open, close, the collectives' entry
 *                 points, split, describe (kiln_plugin_init)
 *   gloo_jobs.cc  a collective's job: Gloo's algorithms, kiln's shared
 *                 memory, the hierarchical allreduce, send and recv, run
 *                 on the comm stream
 *   gloo_mesh.cc  opening a communicator: the TCP device, the mesh's
 *                 connect (kiln's deadline on all of it), shared memory,
 *                 the hierarchical leaders
 * Everything here has hidden visibility (-fvisibility=hidden): the .so
 * exports kiln_plugin_init alone.
 */
#ifndef KILN_PLUGINS_GLOO_GLOO_COMM_H
#define KILN_PLUGINS_GLOO_GLOO_COMM_H

#include <kiln/plugin.h>

#include "../common/comm_init.h"
#include "../common/describe.h"
#include "deadline.h"
#include "shm.h"

#include <gloo/barrier_all_to_all.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/broadcast_one_to_all.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace kiln_gloo {

/* the host table (gloo.cc; kiln_plugin_init sets it) */
extern const struct kiln_host *H;

/* ---- kiln's store as Gloo's --------------------------------------------- */

/* A store request's failure this process had no memory for (KILN_ENOMEM:
 * its answer's allocation): this rank's own, said at once (connect_mesh),
 * not a try of the mesh that failed and waits for the others' outcomes
 * for [dist] timeout (session 39). */
struct StoreOom : std::runtime_error {
	using std::runtime_error::runtime_error;
};

/* Throw a store request's failure st (its message H->last_error()). */
[[noreturn]] static inline void store_throw(kiln_status st)
{
	if (st == KILN_ENOMEM)
		throw StoreOom(H->last_error());
	throw std::runtime_error(H->last_error());
}

class KilnStore : public gloo::rendezvous::Store {
public:
	KilnStore(struct kiln_store *s, std::string prefix, int timeout_ms)
		: s_(s), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

	void set(const std::string &key, const std::vector<char> &data) override
	{
		if (kiln_status st = H->store_set(s_, (prefix_ + key).c_str(), data.data(), data.size()))
			store_throw(st);
	}
	std::vector<char> get(const std::string &key) override
	{
		void *v = nullptr;
		size_t n = 0;
		if (kiln_status st = H->store_get(s_, (prefix_ + key).c_str(), timeout_ms_, &v, &n))
			store_throw(st);
		std::vector<char> out(static_cast<char *>(v), static_cast<char *>(v) + n);
		H->free(v);
		return out;
	}
	void wait(const std::vector<std::string> &keys) override
	{
		wait(keys, std::chrono::milliseconds(timeout_ms_));
	}
	/* (at most [dist] timeout: Gloo passes its context's timeout,
	 * kGlooTimeout where a Deadline watches the pairs) */
	void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &t) override
	{
		const int ms = t.count() < timeout_ms_ ? (int)t.count() : timeout_ms_;
		for (const auto &k : keys) {
			void *v = nullptr;
			if (kiln_status st = H->store_get(s_, (prefix_ + k).c_str(), ms, &v, nullptr))
				store_throw(st);
			H->free(v);
		}
	}

private:
	struct kiln_store *s_;
	std::string prefix_;
	int timeout_ms_;
};

/* Gloo's rendezvous context, its full mesh connected by connect_pairs:
 * connectFullMesh's steps, but with the transport context handed to the
 * Deadline before the pairs connect, so that kiln's deadline ends a
 * connect too (the pairs' own timeout is kGlooTimeout there). */
class KilnContext : public gloo::rendezvous::Context {
public:
	using gloo::rendezvous::Context::Context;

	/* Throws as connectFullMesh does; dl may be NULL (Gloo's timeout
	 * bounds the connects: busy-polling pairs), else the pairs must
	 * connect within span_ms of the run clock.  *late: the peer whose
	 * pair was connecting when kiln's deadline closed the pairs. */
	void connect_pairs(gloo::rendezvous::Store &store, std::shared_ptr<gloo::transport::Device> &dev,
			   kiln_gloo::Deadline *dl, int64_t span_ms, int *late)
	{
		*late = -1;
		auto t = dev->createContext(rank, size);
		t->setTimeout(getTimeout());
		std::vector<char> mine;
		for (int i = 0; i < size; i++)
			if (i != rank) {
				auto b = t->createPair(i)->address().bytes();
				mine.insert(mine.end(), b.begin(), b.end());
			}
		store.set(std::to_string(rank), mine);
		if (dl)
			dl->watch(t);
		const int slot = dl ? dl->begin(span_ms, true) : -1;
		int i = -1;
		try {
			for (i = 0; i < size; i++) {
				if (i == rank)
					continue;
				/* rank i's addresses, one per rank but i, in rank order */
				const std::vector<char> all = store.get(std::to_string(i));
				const size_t n = all.size() / (size_t)(size - 1);
				const size_t at = (size_t)(rank > i ? rank - 1 : rank) * n;
				t->getPair(i)->connect(std::vector<char>(all.begin() + (long)at,
									 all.begin() + (long)(at + n)));
			}
		} catch (const StoreOom &) { /* (this rank's own: as it is) */
			if (dl)
				dl->end(slot);
			throw;
		} catch (...) {
			/* (the peer whose addresses or connect this rank
			 * waited for: a pair's connect waits until its peer's
			 * side is connected too; kiln's deadline closed the
			 * pairs: its message) */
			*late = i < size ? i : -1;
			if (dl && dl->end(slot))
				throw std::runtime_error(dl->why(*late));
			throw;
		}
		if (dl && dl->end(slot))
			throw std::runtime_error(dl->why(-1));
		device_ = dev;
		transportContext_ = t;
	}
};

/* ---- the communicator --------------------------------------------------- */

enum Kind { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_SEND, K_RECV, K_SENDRECV };

struct Comm;

/* One enqueued collective: a slot of Comm::jobs, taken by the thread that
 * enqueues (the one driving training) and given back by the host function
 * that runs it. */
struct Job {
	Comm *c;
	Kind kind;
	void *buf;
	const void *send;
	size_t count;
	int dtype, op, root;
	/* K_SENDRECV: the recv half (into buf, rcount elements from rank
	 * src); send, count and root are the send half */
	size_t rcount;
	int src;
	std::atomic<int> busy{ 0 };
};

constexpr int kJobs = 256;  /* collectives in flight per communicator */
/* job_get's slice of its wait for a slot, between looks at the stream */
constexpr std::chrono::milliseconds kProbe{50};
constexpr int kBound = 128; /* allreduce buffers with an algorithm bound to them */
/* The staging area of unbound collectives holds kPiece bytes per rank.
 * (Bound allreduces are one algorithm each: cut into 1 MiB or 256 KiB
 * pieces, run back to back, they were 1.5-5x slower at 1-4 MiB on TCP
 * loopback, each run waiting for the peer's wake-up.) */
constexpr size_t kPiece = (size_t)1 << 20;
constexpr int kLadder = 9; /* staged sizes kPiece >> 0 .. kPiece >> 8 (4 KiB) */

/* an allreduce bound to (buf, count, dtype) */
struct Bound {
	void *buf;
	size_t count;
	int dtype;
	std::unique_ptr<gloo::Algorithm> algo;
};

/* Collectives on buffers that have no algorithm of their own go through a
 * staging area with algorithms bound to it, made on first use of each
 * size (the same on every rank: collectives are issued in the same order)
 * and kept, so no call allocates.  A piece of `bytes` is padded to the
 * smallest staged size that holds it (powers of two from 4 KiB to
 * kPiece); the pad is zero for reductions and ignored by allgathers.
 * Allgathers alternate two output areas: AllgatherRing's first send lands
 * in the peer's output without a handshake, so a peer one run ahead must
 * not overwrite the output being copied out (it cannot be two ahead: each
 * run needs this rank). */
struct Stage {
	std::vector<char> red;          /* kPiece: allreduce pieces */
	std::unique_ptr<gloo::Algorithm> ar[3][kLadder]; /* [f32, f16, bf16][size] */
	std::vector<char> in;           /* kPiece: this rank's allgather piece */
	std::vector<char> out[2];       /* world x kPiece each */
	std::unique_ptr<gloo::Algorithm> ag[2][kLadder];
	int flip = 0;
};

/* an f32 reduce_scatter of `count` floats per rank: the input is copied
 * into buf, reduced there in place, this rank's slice left at its start */
struct BoundRs {
	size_t count;
	std::vector<float> buf;
	std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> algo;
};

/* The thread that runs the send half of a sendrecv whose message does not
 * fit the channel's ring while the stream's thread receives
 * (run_sendrecv_shm): started at the first such sendrecv, then kept, a
 * condition variable handing it each send, until close (a std::thread
 * made and joined per sendrecv cost a clone and an exit each time). */
struct SendWorker {
	std::mutex m;
	std::condition_variable cv;
	std::thread t;
	bool stop = false, queued = false, finished = false;
	struct gloo_shm *shm = nullptr;
	int peer = 0;
	const void *buf = nullptr;
	size_t bytes = 0;
	kiln_status st = KILN_OK;
	std::string why; /* st's message */

	void loop()
	{
		std::unique_lock<std::mutex> lk(m);
		for (;;) {
			cv.wait(lk, [this] { return stop || queued; });
			if (stop)
				return;
			queued = false;
			lk.unlock();
			const kiln_status r = gloo_shm_send(shm, peer, buf, bytes);
			std::string w = r && H->last_error ? H->last_error() : "";
			lk.lock();
			st = r, why = std::move(w), finished = true;
			cv.notify_all();
		}
	}
	/* hand it a send (one at a time: the stream orders the jobs) */
	void post(struct gloo_shm *g, int to, const void *b, size_t n)
	{
		std::lock_guard<std::mutex> lk(m);
		shm = g, peer = to, buf = b, bytes = n, finished = false, queued = true;
		cv.notify_all();
	}
	/* wait for it; its status (the message in why) */
	kiln_status finish()
	{
		std::unique_lock<std::mutex> lk(m);
		cv.wait(lk, [this] { return finished; });
		return st;
	}
	~SendWorker()
	{
		if (t.joinable()) {
			{
				std::lock_guard<std::mutex> lk(m);
				stop = true;
			}
			cv.notify_all();
			t.join();
		}
	}
};

struct Comm {
	struct kiln_device *dev;
	int rank, world, timeout_ms;
	/* what split needs to open a group: the run's config and store */
	const struct kiln_config *cfg;
	struct kiln_store *store;
	std::string addr; /* the pairs' address without iface or hostname (gloo_open) */
	std::shared_ptr<KilnContext> ctx;
	/* the barrier, made with the mesh (gloo_barrier): its buffers stay
	 * registered, so a peer's early notice always has a buffer to land in */
	std::unique_ptr<gloo::BarrierAllToAll> barrier;
	std::vector<char> scratch; /* reduce_scatter of bf16/f16; used on the stream only */
	/* f32 reduce_scatters: algorithms bound to a buffer of their own, one
	 * per count (ZeRO-1's buckets have one or two) */
	BoundRs rs[kBound];
	int n_rs = 0;
	char desc[512];
	/* kiln's shared-memory collectives (every rank on this node), or
	 * NULL: Gloo's */
	struct gloo_shm *shm = nullptr;
	char shm_why[320] = "";  /* why shm is null */
	std::unique_ptr<SendWorker> sender; /* run_sendrecv_shm's, once needed */
	int zero_copy = 1;       /* [plugin.gloo] zero_copy */
	Job jobs[kJobs];
	int next_job = 0;
	/* the device's KILN_PROC_HOST_FN_SKIP (comm_open; NULL: none): a
	 * stream that skips a job (it failed) gives its slot back (job_skipped) */
	kiln_status (*host_fn_skip)(void *ctx, void *stream, kiln_status (*fn)(void *),
				    void (*skip)(void *), void *arg) = nullptr;
	/* a job's end, told to an enqueuing thread that found every slot
	 * busy (job_get waits for one: the streams may be far behind) */
	std::mutex job_lock;
	std::condition_variable job_freed;
	/* jobs of collectives recorded in captured steps: replays run them
	 * through the captured pointer, so they are never reused (host table
	 * version 6); freed with the communicator */
	std::vector<std::unique_ptr<Job>> kept;
	/* bound allreduces and the staging area (host functions only; the
	 * lock is for collectives enqueued on different streams) */
	std::mutex bound_lock;
	Bound bound[kBound];
	int n_bound = 0;
	Stage stage;
	/* [plugin.gloo] busy_poll: the pairs are in Gloo's synchronous
	 * busy-polling mode (every collective here is an old-style
	 * algorithm, which works on such pairs) */
	int busy = 0;
	/* several nodes ([plugin.gloo] hierarchical): allreduces sum in
	 * kiln's shared memory among this node's ranks (node_shm; NULL on a
	 * node of one rank), then over Gloo among the nodes' first ranks
	 * (lead, a communicator of its own; NULL on the others) */
	struct gloo_node nd = {};
	struct gloo_shm *node_shm = nullptr;
	struct Comm *lead = nullptr;
	/* a split's group: its ranks' world ranks (the ranks of the
	 * communicator the first split was made of), which its errors name;
	 * empty on a communicator of the world */
	std::vector<int> world_of;
	/* kiln's deadline on the pairs' waits (deadline.h); NULL on
	 * busy-polling pairs, which keep Gloo's timeout, and on a world of
	 * one.  Last: destroyed
	 * first, its thread joined before the pairs go. */
	std::unique_ptr<kiln_gloo::Deadline> due;
};

/* How long a Gloo wait on c's pairs may take: unbounded where kiln's
 * deadline watches them (it aborts the wait), else [dist] timeout. */
inline std::chrono::milliseconds wait_limit(const Comm *c)
{
	return c->due ? kGlooTimeout : std::chrono::milliseconds(c->timeout_ms);
}

/* ---- gloo_jobs.cc ---- */
void scale(void *buf, size_t n, int dt, float s);
const char *kind_name(Kind k);
int wrank(const Comm *c, int r);
kiln_status world_named(const Job *j, kiln_status st);
kiln_status run_job(void *arg);
kiln_status run_job_now(Job *j);
Job *job_fill(Job *j, Comm *c, Kind kind);
/* A slot for `kind` on `stream`, or nullptr with *st the failure (a full
 * pool waits up to [dist] timeout, failing at once if the stream failed) */
Job *job_get(Comm *c, Kind kind, void *stream, kiln_status *st);
/* j on stream (its slot given back when it runs, is skipped or is
 * refused), `done` recorded after it */
kiln_status enqueue(Comm *c, Job *j, void *stream, void *done);

/* ---- gloo_mesh.cc ---- */
int next_space();
kiln_status comm_open(const struct kiln_host *host, const struct kiln_config *cfg,
		      struct kiln_store *store, struct kiln_device *dev, int rank, int world,
		      int timeout_ms, const char *space, const std::string &addr, bool world_ranks,
		      Comm **out);
kiln_status gloo_open(const struct kiln_host *host, const struct kiln_config *cfg,
		      struct kiln_store *store, struct kiln_device *dev, int rank, int world,
		      int timeout_ms, void **out);

} // namespace kiln_gloo

#endif
