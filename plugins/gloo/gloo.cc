/* plugins/gloo/gloo.cc - the Gloo communicator (kiln-gloo.so).
 *
 * Gloo (libgloo-dev, Facebook's collective library, PyTorch's CPU backend)
 * with its TCP transport.  The plugin's interface is C (struct
 * kiln_comm_ops); this file is the C++ shim behind it: exceptions never
 * cross it, every Gloo failure becomes a status and a message.
 *
 * Bootstrap: Gloo's rendezvous::Store interface is implemented on kiln's
 * store (host->store_*), under keys "gloo/<n>/...", and a full mesh of TCP
 * pairs is connected with the run's timeout.
 *
 * Timeouts: the pairs' own is a year, and kiln's deadline (deadline.h)
 * times every Gloo operation, connects included, on the core's run clock,
 * closing the pairs when [dist] timeout passes: a job suspended whole
 * outlives it (session 34; before, Gloo's clock counted the suspension).
 * Busy-polling pairs keep Gloo's timeout.
 *
 * Streams: Gloo works on host memory and blocks the calling thread, so
 * every collective is a host function enqueued on the caller's stream
 * (host->device_host_fn): on the CPU device's async streams it runs on the
 * stream's worker, in order with the kernels around it, and the training
 * thread goes on enqueueing.  A failure there fails the stream.  Device
 * buffers must be host memory: the plugin refuses devices other than cpu.
 *
 * Reductions: f32 through gloo::sum<float>; f16 through gloo::float16;
 * bf16 with a reduce function of ours (widen, add, round to nearest even).
 * Averages are sums scaled by 1/world in the same host function.
 *
 * Every collective is one of Gloo's old-style algorithms (the classes
 * bound to their buffers at construction), which work on the busy-polling
 * pairs of [plugin.gloo] busy_poll = 1 too (Gloo's synchronous mode: the
 * comm stream's worker reads the sockets itself instead of waiting for the
 * event-loop thread to wake it; that mode has no unbound buffers).
 *
 * The hot path allocates nothing.  Jobs come from a per-communicator pool
 * of kJobs slots (a slot is free again when its host function has run;
 * more than kJobs collectives in flight is an error naming the rank, never
 * an allocation).  An allreduce (f32, f16, bf16) runs an
 * AllreduceHalvingDoubling bound to its buffer, made on the buffer's first allreduce and kept (kBound buffers: the
 * gradient buckets and the few small buffers a training step reduces have
 * fixed addresses); past kBound buffers an allreduce is copied piece by
 * piece through a staging area whose algorithms are made once per size
 * (struct Stage).  Allgathers always go through the staging area
 * (AllgatherRings).  reduce_scatter of f32 is Gloo's
 * ReduceScatterHalvingDoubling (the new-style API has no reduce_scatter)
 * bound to a scratch buffer of its own the input is copied into (it
 * reduces in place there and leaves this rank's slice at its start), one
 * per count (ZeRO-1's buckets have one or two); bf16 and f16, and every
 * dtype on a world that is not a power of two, are an allreduce of a
 * scratch copy (Gloo's reduce-scatter run back to back on 3 ranks summed
 * wrongly).  Broadcast (start-up only) is a
 * BroadcastOneToAll made per call.  tests/check_comm counts every malloc
 * of the process during steady-state collectives.
 *
 * One node.  When every rank runs on this node ([plugin.gloo] shm = 1, the
 * default), allreduce, reduce_scatter and allgather run as kiln's own
 * shared-memory collectives instead (plugins/common/shmcoll.h on a POSIX
 * shared-memory object; setup, fallback and the lost-peer check in
 * shm.h); broadcast and barrier stay Gloo's, over the same TCP mesh.
 */
#include <kiln/plugin.h>

#include "../common/comm_init.h"
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

namespace {

const struct kiln_host *H;

/* ---- kiln's store as Gloo's --------------------------------------------- */

class KilnStore : public gloo::rendezvous::Store {
public:
	KilnStore(struct kiln_store *s, std::string prefix, int timeout_ms)
		: s_(s), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

	void set(const std::string &key, const std::vector<char> &data) override
	{
		if (H->store_set(s_, (prefix_ + key).c_str(), data.data(), data.size()))
			throw std::runtime_error(H->last_error());
	}
	std::vector<char> get(const std::string &key) override
	{
		void *v = nullptr;
		size_t n = 0;
		if (H->store_get(s_, (prefix_ + key).c_str(), timeout_ms_, &v, &n))
			throw std::runtime_error(H->last_error());
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
			if (H->store_get(s_, (prefix_ + k).c_str(), ms, &v, nullptr))
				throw std::runtime_error(H->last_error());
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
std::chrono::milliseconds wait_limit(const Comm *c)
{
	return c->due ? kiln_gloo::kGlooTimeout : std::chrono::milliseconds(c->timeout_ms);
}

size_t dtype_size(int dt)
{
	switch (dt) {
	case KILN_F32: case KILN_I32: return 4;
	case KILN_BF16: case KILN_F16: return 2;
	case KILN_I64: return 8;
	default: return 1;
	}
}

inline float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	std::memcpy(&f, &u, 4);
	return f;
}

inline uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	std::memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1);          /* round to nearest even */
	return (uint16_t)(u >> 16);
}

void sum_bf16(void *c, const void *a, const void *b, size_t n)
{
	uint16_t *o = static_cast<uint16_t *>(c);
	const uint16_t *x = static_cast<const uint16_t *>(a), *y = static_cast<const uint16_t *>(b);
	for (size_t i = 0; i < n; i++)
		o[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

/* buf[0..n) *= s in dtype */
void scale(void *buf, size_t n, int dt, float s)
{
	if (dt == KILN_F32) {
		float *p = static_cast<float *>(buf);
		for (size_t i = 0; i < n; i++)
			p[i] *= s;
	} else if (dt == KILN_BF16) {
		uint16_t *p = static_cast<uint16_t *>(buf);
		for (size_t i = 0; i < n; i++)
			p[i] = f32_to_bf16(bf16_to_f32(p[i]) * s);
	} else {
		gloo::float16 *p = static_cast<gloo::float16 *>(buf);
		for (size_t i = 0; i < n; i++)
			p[i] = gloo::cpu_float2half_rn(gloo::cpu_half2float(p[i]) * s);
	}
}

void bf16_acc(uint16_t *x, const uint16_t *y, size_t n)
{
	sum_bf16(x, x, y, n);
}

const gloo::ReductionFunction<uint16_t> bf16_sum_fn(gloo::SUM, &bf16_acc);

/* A halving-doubling sum of n elements of dt at p, bound to p. */
std::unique_ptr<gloo::Algorithm> make_sum(Comm *c, void *p, size_t n, int dt)
{
	if (dt == KILN_F32)
		return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceHalvingDoubling<float>(
			c->ctx, std::vector<float *>{ static_cast<float *>(p) }, (int)n));
	if (dt == KILN_F16)
		return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceHalvingDoubling<gloo::float16>(
			c->ctx, std::vector<gloo::float16 *>{ static_cast<gloo::float16 *>(p) }, (int)n));
	return std::unique_ptr<gloo::Algorithm>(new gloo::AllreduceHalvingDoubling<uint16_t>(
		c->ctx, std::vector<uint16_t *>{ static_cast<uint16_t *>(p) }, (int)n, &bf16_sum_fn));
}

/* the staged size for a piece of `bytes` (<= kPiece): its ladder index */
int ladder(size_t bytes)
{
	int l = 0;
	while (l + 1 < kLadder && (kPiece >> (l + 1)) >= bytes)
		l++;
	return l;
}

/* The sum of (buf, n) of dt through the staging area, piece by piece. */
void allreduce_staged(Comm *c, void *buf, size_t n, int dt)
{
	Stage &s = c->stage;
	const size_t es = dtype_size(dt), all = n * es;
	const int d = dt == KILN_F32 ? 0 : dt == KILN_F16 ? 1 : 2;
	if (s.red.empty())
		s.red.assign(kPiece, 0);
	for (size_t off = 0; off < all; off += kPiece) {
		const size_t bytes = std::min(kPiece, all - off);
		const int l = ladder(bytes);
		const size_t size = kPiece >> l;
		if (!s.ar[d][l])
			s.ar[d][l] = make_sum(c, s.red.data(), size / es, dt);
		char *p = static_cast<char *>(buf) + off;
		std::memcpy(s.red.data(), p, bytes);
		std::memset(s.red.data() + bytes, 0, size - bytes);
		s.ar[d][l]->run();
		std::memcpy(p, s.red.data(), bytes);
	}
}

/* The sum of (buf, n) of dt: the algorithms bound to it, made on its first
 * use while fewer than kBound buffers are bound; else staged. */
void allreduce_sum(Comm *c, void *buf, size_t n, int dt)
{
	Bound *a = nullptr;
	if (n == 0)
		return;
	std::lock_guard<std::mutex> g(c->bound_lock);
	for (int i = 0; i < c->n_bound && !a; i++)
		if (c->bound[i].buf == buf && c->bound[i].count == n && c->bound[i].dtype == dt)
			a = &c->bound[i];
	if (!a && c->n_bound < kBound && n <= (size_t)INT32_MAX) {
		a = &c->bound[c->n_bound++];
		a->buf = buf;
		a->count = n;
		a->dtype = dt;
		a->algo = make_sum(c, buf, n, dt);
	}
	if (!a)
		return allreduce_staged(c, buf, n, dt);
	a->algo->run();
}

/* The allgather of `bytes` per rank from send into recv (in place when
 * send is recv's slice of this rank) through the staging area. */
void allgather_staged(Comm *c, const void *send, void *recv, size_t bytes)
{
	std::lock_guard<std::mutex> g(c->bound_lock);
	Stage &s = c->stage;
	const size_t W = (size_t)c->world;
	if (s.in.empty()) {
		s.in.assign(kPiece, 0);
		s.out[0].assign(W * kPiece, 0);
		s.out[1].assign(W * kPiece, 0);
	}
	const char *in = static_cast<const char *>(send);
	char *out = static_cast<char *>(recv);
	for (size_t off = 0; off < bytes; off += kPiece) {
		const size_t n = std::min(kPiece, bytes - off);
		const int l = ladder(n), k = s.flip;
		const size_t size = kPiece >> l;
		s.flip ^= 1;
		if (!s.ag[k][l])
			s.ag[k][l].reset(new gloo::AllgatherRing<char>(
				c->ctx, std::vector<const char *>{ s.in.data() }, s.out[k].data(), (int)size));
		std::memcpy(s.in.data(), in + off, n);
		s.ag[k][l]->run();
		for (size_t q = 0; q < W; q++)
			std::memcpy(out + q * bytes + off, s.out[k].data() + q * size, n);
	}
}

/* The f32 reduce_scatter of j through the algorithm bound for its count,
 * made on first use; false past kBound counts. */
bool reduce_scatter_f32(Comm *c, Job *j)
{
	const size_t all = j->count * (size_t)c->world;
	BoundRs *b = nullptr;
	if (all > (size_t)INT32_MAX)
		return false;
	{
		std::lock_guard<std::mutex> g(c->bound_lock);
		for (int i = 0; i < c->n_rs && !b; i++)
			if (c->rs[i].count == j->count)
				b = &c->rs[i];
		if (!b && c->n_rs < kBound) {
			b = &c->rs[c->n_rs++];
			b->count = j->count;
			b->buf.assign(all, 0.0f);
			std::vector<int> elems((size_t)c->world, (int)j->count);
			b->algo.reset(new gloo::ReduceScatterHalvingDoubling<float>(
				c->ctx, std::vector<float *>{ b->buf.data() }, (int)all, elems));
		}
	}
	if (!b)
		return false;
	std::memcpy(b->buf.data(), j->send, all * sizeof(float));
	b->algo->run();
	std::memcpy(j->buf, b->buf.data(), j->count * sizeof(float));
	if (j->op == KILN_REDUCE_AVG)
		scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
	return true;
}

const char *kind_name(Kind k)
{
	switch (k) {
	case K_ALLREDUCE: return "allreduce";
	case K_BROADCAST: return "broadcast";
	case K_ALLGATHER: return "allgather";
	case K_SEND: return "send";
	case K_RECV: return "recv";
	case K_SENDRECV: return "sendrecv";
	default: return "reduce_scatter";
	}
}

kiln_status run_job_now(Job *j);

/* rank r of c's world rank */
int wrank(const Comm *c, int r)
{
	return c->world_of.empty() || r < 0 || r >= (int)c->world_of.size() ? r : c->world_of[(size_t)r];
}

/* A split group's failed job, its error said again with the world ranks
 * of this rank and its peer (the message itself, Gloo's or shm's, names
 * ranks within the group): "gloo: world rank 2 (rank 0 of 2 of a split):
 * recv from world rank 3: gloo: rank 0 of 2: recv from rank 1 ...". */
kiln_status world_named(const Job *j, kiln_status st)
{
	const Comm *c = j->c;
	if (!st || c->world_of.empty())
		return st;
	char who[96], what[160];
	std::snprintf(who, sizeof who, "gloo: world rank %d (rank %d of %d of a split)", wrank(c, c->rank),
		      c->rank, c->world);
	if (j->kind == K_SENDRECV)
		std::snprintf(what, sizeof what, "sendrecv to world rank %d, from world rank %d",
			      wrank(c, j->root), wrank(c, j->src));
	else if (j->kind == K_SEND || j->kind == K_RECV)
		std::snprintf(what, sizeof what, "%s %s world rank %d", kind_name(j->kind),
			      j->kind == K_SEND ? "to" : "from", wrank(c, j->root));
	else {
		/* a collective: every member's world rank, in group order */
		int at = std::snprintf(what, sizeof what, "%s among world ranks", kind_name(j->kind));
		for (int r = 0; r < c->world && at < (int)sizeof what - 16; r++)
			at += std::snprintf(what + at, sizeof what - (size_t)at, "%s %d", r ? "," : "",
					    wrank(c, r));
		if (at < (int)sizeof what - 16)
			std::snprintf(what + at, sizeof what - (size_t)at, " (its ranks 0..%d below, in that order)", c->world - 1);
	}
	return H->error(st, "%s: %s: %s", who, what, H->last_error());
}

kiln_status run_job(void *arg)
{
	Job *j = static_cast<Job *>(arg);
	kiln_status st = run_job_now(j);
	j->busy.store(0, std::memory_order_release);
	return st;
}

/* j through kiln's shared-memory collectives (one at a time: the lock is
 * for collectives enqueued on different streams); averages scaled once,
 * by shmcoll, before rounding */
kiln_status run_shm(Comm *c, Job *j)
{
	const float sc = j->op == KILN_REDUCE_AVG ? 1.0f / (float)c->world : 1.0f;
	std::lock_guard<std::mutex> g(c->bound_lock);
	switch (j->kind) {
	case K_ALLREDUCE:
		return gloo_shm_run(c->shm, GLOO_SHM_ALLREDUCE, nullptr, j->buf, j->count, j->dtype, sc);
	case K_REDUCE_SCATTER:
		return gloo_shm_run(c->shm, GLOO_SHM_REDUCE_SCATTER, j->send, j->buf, j->count,
				    j->dtype, sc);
	default: /* K_ALLGATHER */
		return gloo_shm_run(c->shm, GLOO_SHM_ALLGATHER, j->send, j->buf,
				    j->count * dtype_size(j->dtype), j->dtype, 1.0f);
	}
}

/* The hierarchical allreduce of j (several nodes): the node's sum in
 * shared memory, the nodes' sum over Gloo among their first ranks, and that
 * total back to every rank of the node by a second shared-memory sum to
 * which the others bring zeros (scaled there once, so every rank gets the
 * same bits).  Gloo's exceptions go to the caller. */
kiln_status run_hier(Comm *c, Job *j)
{
	const float sc = j->op == KILN_REDUCE_AVG ? 1.0f / (float)c->world : 1.0f;
	std::lock_guard<std::mutex> g(c->bound_lock);
	kiln_status st;
	if (c->node_shm && (st = gloo_shm_run(c->node_shm, GLOO_SHM_ALLREDUCE, nullptr, j->buf,
					      j->count, j->dtype, 1.0f)))
		return st;
	if (c->lead) {
		kiln_gloo::Watched w(c->lead->due.get());
		allreduce_sum(c->lead, j->buf, j->count, j->dtype);
	}
	else
		std::memset(j->buf, 0, j->count * dtype_size(j->dtype));
	if (c->node_shm)
		return gloo_shm_run(c->node_shm, GLOO_SHM_ALLREDUCE, nullptr, j->buf, j->count, j->dtype,
				    sc);
	if (sc != 1.0f)
		scale(j->buf, j->count, j->dtype, sc);
	return KILN_OK;
}

/* A send or recv (peer j->root) through a Gloo unbound buffer on the
 * pair's own slot: messages between two ranks are matched in order.  The
 * wait is bounded by the run's timeout; Gloo throws on a closed pair. */
void run_p2p(Comm *c, Job *j)
{
	constexpr uint64_t kP2pSlot = 0x6b696c6e70327000ull; /* "kilnp2p" */
	const size_t bytes = j->count * dtype_size(j->dtype);
	auto ub = c->ctx->createUnboundBuffer(j->buf, bytes);
	const auto limit = wait_limit(c);
	kiln_gloo::Watched w(c->due.get(), ub.get());
	bool done;
	if (j->kind == K_SEND) {
		ub->send(j->root, kP2pSlot);
		done = ub->waitSend(nullptr, limit);
	} else {
		ub->recv(j->root, kP2pSlot);
		done = ub->waitRecv(nullptr, limit);
	}
	/* (a wait the deadline aborted returns false) */
	if (w.finish() || !done)
		throw std::runtime_error(c->due ? c->due->why(j->root) : "the wait was aborted");
}

/* K_SENDRECV over Gloo's TCP: both unbound buffers posted before either
 * is waited for (the same slot as run_p2p: one order per pair). */
void run_sendrecv_tcp(Comm *c, Job *j)
{
	constexpr uint64_t kP2pSlot = 0x6b696c6e70327000ull; /* run_p2p's */
	const size_t es = dtype_size(j->dtype);
	const auto limit = wait_limit(c);
	std::unique_ptr<gloo::transport::UnboundBuffer> sb, rb;
	if (j->rcount)
		rb = c->ctx->createUnboundBuffer(j->buf, j->rcount * es);
	if (j->count)
		sb = c->ctx->createUnboundBuffer(const_cast<void *>(j->send), j->count * es);
	kiln_gloo::Watched w(c->due.get(), rb.get(), sb.get());
	if (rb)
		rb->recv(j->src, kP2pSlot);
	if (sb)
		sb->send(j->root, kP2pSlot);
	/* (a wait the deadline aborted returns false) */
	if (rb && !rb->waitRecv(nullptr, limit))
		throw std::runtime_error(c->due ? c->due->why(j->src) : "the wait was aborted");
	if (sb && !sb->waitSend(nullptr, limit))
		throw std::runtime_error(c->due ? c->due->why(j->root) : "the wait was aborted");
	if (w.finish())
		throw std::runtime_error(c->due->why(-1));
}

/* K_SENDRECV on the shared-memory channels: the send goes now if the
 * channel has room for all of it, else on the communicator's send worker
 * while this thread receives (the channel's ring is smaller than a large
 * message: a send before the recv on both ranks would wait forever). */
kiln_status run_sendrecv_shm(Comm *c, Job *j)
{
	const size_t es = dtype_size(j->dtype);
	if (!j->count)
		return gloo_shm_recv(c->shm, j->src, j->buf, j->rcount * es);
	if (!j->rcount)
		return gloo_shm_send(c->shm, j->root, j->send, j->count * es);
	if (gloo_shm_try_send(c->shm, j->root, j->send, j->count * es))
		return gloo_shm_recv(c->shm, j->src, j->buf, j->rcount * es);
	try {
		if (!c->sender) {
			c->sender.reset(new SendWorker);
			SendWorker *w = c->sender.get();
			w->t = std::thread([w] { w->loop(); });
		}
	} catch (const std::exception &e) {
		c->sender.reset();
		return H->error(KILN_EIO, "gloo: rank %d of %d: sendrecv: no thread for the send to rank %d: %s",
				c->rank, c->world, j->root, e.what());
	}
	c->sender->post(c->shm, j->root, j->send, j->count * es);
	kiln_status rst = gloo_shm_recv(c->shm, j->src, j->buf, j->rcount * es);
	kiln_status sst = c->sender->finish();
	if (sst && !rst)
		return H->error(sst, "%s", c->sender->why.c_str());
	return rst;
}

kiln_status run_job_raw(Job *j);

/* j on the calling thread; a split group's error names world ranks */
kiln_status run_job_now(Job *j)
{
	return world_named(j, run_job_raw(j));
}

kiln_status run_job_raw(Job *j)
{
	Comm *c = j->c;
	size_t es = dtype_size(j->dtype);
	const bool p2p = j->kind == K_SEND || j->kind == K_RECV || j->kind == K_SENDRECV;
	if (c->shm && j->kind != K_BROADCAST && !p2p)
		return run_shm(c, j);
	if (j->kind == K_SENDRECV && gloo_shm_p2p(c->shm))
		return run_sendrecv_shm(c, j);
	if (p2p && gloo_shm_p2p(c->shm)) /* the shared-memory channels (shm.h) */
		return j->kind == K_SEND ? gloo_shm_send(c->shm, j->root, j->buf, j->count * es)
					 : gloo_shm_recv(c->shm, j->root, j->buf, j->count * es);
	try {
		/* kiln's deadline on the collectives' Gloo waits (p2p's watch
		 * their unbound buffers themselves; the hierarchical allreduce
		 * the leaders' communicator) */
		kiln_gloo::Watched w(p2p || (j->kind == K_ALLREDUCE && c->nd.on) ? nullptr : c->due.get());
		switch (j->kind) {
		case K_SEND:
		case K_RECV:
			run_p2p(c, j);
			break;
		case K_SENDRECV:
			run_sendrecv_tcp(c, j);
			break;
		case K_ALLREDUCE:
			if (c->nd.on)
				return run_hier(c, j);
			if (c->world > 1)
				allreduce_sum(c, j->buf, j->count, j->dtype);
			if (j->op == KILN_REDUCE_AVG && c->world > 1)
				scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
			break;
		case K_BROADCAST: {
			if (c->world == 1)
				break;
			/* old-style, made for the call: start-up only */
			gloo::BroadcastOneToAll<char> b(c->ctx, std::vector<char *>{ static_cast<char *>(j->buf) },
							j->count * es, j->root);
			b.run();
			break;
		}
		case K_ALLGATHER:
			if (c->world == 1)
				std::memmove(j->buf, j->send, j->count * es);
			else
				allgather_staged(c, j->send, j->buf, j->count * es);
			break;
		case K_REDUCE_SCATTER: {
			/* Gloo's ReduceScatterHalvingDoubling run back to back
			 * (ZeRO-1's buckets) on a world that is not a power of
			 * two gave wrong sums (3 ranks, tests/dist_zero.sh) */
			if (j->dtype == KILN_F32 && c->world > 1 && !(c->world & (c->world - 1)) &&
			    reduce_scatter_f32(c, j))
				break;
			/* bf16, f16 (and f32 past kBound counts or on a world
			 * that is not a power of two): an allreduce
			 * of a copy, this rank's slice kept (the scratch grows
			 * on first use only) */
			size_t all = j->count * (size_t)c->world * es;
			if (c->scratch.size() < all)
				c->scratch.resize(all);
			std::memcpy(c->scratch.data(), j->send, all);
			if (c->world > 1)
				allreduce_sum(c, c->scratch.data(), j->count * (size_t)c->world, j->dtype);
			std::memcpy(j->buf, c->scratch.data() + (size_t)c->rank * j->count * es,
				    j->count * es);
			if (j->op == KILN_REDUCE_AVG && c->world > 1)
				scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
			break;
		}
		}
		/* (done as the deadline passed: the pairs are closed all the same) */
		if (w.finish())
			throw std::runtime_error(c->due->why(-1));
	} catch (const std::exception &e) {
		const char *w = e.what();
		/* (kiln's deadline closed the pairs: their messages say so) */
		const bool expired = (c->due && c->due->expired()) ||
				     (c->lead && c->lead->due && c->lead->due->expired());
		bool timeout = expired || std::strstr(w, "imed out") || std::strstr(w, "imeout");
		std::string why;
		if (expired && !std::strstr(w, "kiln's deadline")) { /* (Gloo's "pair closure") */
			why = (c->due && c->due->expired() ? c->due : c->lead->due)
				      ->why(j->kind == K_SEND || j->kind == K_RECV ? j->root : -1);
			w = why.c_str();
		}
		if (j->kind == K_SENDRECV)
			return H->error(timeout ? KILN_ETIMEOUT : KILN_EIO,
					"gloo: rank %d of %d: sendrecv to rank %d, from rank %d, of %zu and %zu elements failed: %s",
					c->rank, c->world, j->root, j->src, j->count, j->rcount, w);
		if (p2p)
			return H->error(timeout ? KILN_ETIMEOUT : KILN_EIO,
					"gloo: rank %d of %d: %s %s rank %d of %zu elements failed: %s",
					c->rank, c->world, kind_name(j->kind),
					j->kind == K_SEND ? "to" : "from", j->root, j->count, w);
		return H->error(timeout ? KILN_ETIMEOUT : KILN_EIO,
				"gloo: rank %d of %d: %s of %zu elements failed: %s", c->rank, c->world,
				kind_name(j->kind), j->count, w);
	}
	return KILN_OK;
}

/* A free job slot (the enqueuing thread only), or NULL with the error set. */
Job *job_fill(Job *j, Comm *c, Kind kind)
{
	j->busy.store(1, std::memory_order_relaxed);
	j->c = c;
	j->kind = kind;
	j->buf = nullptr;
	j->send = nullptr;
	j->count = j->rcount = 0;
	j->dtype = j->op = j->root = j->src = 0;
	return j;
}

Job *job_get(Comm *c, Kind kind)
{
	if (H->version >= 6 && H->device_capturing(c->dev)) {
		try {
			c->kept.push_back(std::make_unique<Job>());
		} catch (const std::bad_alloc &) {
			H->error(KILN_ENOMEM, "gloo: rank %d of %d: out of memory for a captured %s",
				 c->rank, c->world, kind_name(kind));
			return nullptr;
		}
		return job_fill(c->kept.back().get(), c, kind);
	}
	for (int k = 0; k < kJobs; k++) {
		Job *j = &c->jobs[(c->next_job + k) % kJobs];
		if (!j->busy.load(std::memory_order_acquire)) {
			c->next_job = (c->next_job + k + 1) % kJobs;
			return job_fill(j, c, kind);
		}
	}
	H->error(KILN_EINTERNAL, "gloo: rank %d of %d: %d collectives are in flight, the most a communicator holds: %s not enqueued",
		 c->rank, c->world, kJobs, kind_name(kind));
	return nullptr;
}

kiln_status enqueue(Comm *c, Job *j, void *stream, void *done)
{
	kiln_status st = H->device_host_fn(c->dev, stream, run_job, j);
	if (st) {
		/* a device that ran it at once gave the slot back; one that
		 * refused it (NULL arguments, which we never pass) did not */
		j->busy.store(0, std::memory_order_release);
		return st;
	}
	return done ? H->device_event_record(c->dev, done, stream) : KILN_OK;
}

/* ---- ops table ---------------------------------------------------------- */

kiln_status hier_open(Comm *c, std::shared_ptr<gloo::transport::Device> device,
		      struct kiln_store *store, const char *space, char *why, size_t n);

/* A fresh key space per communicator ("<n>", a split's group "<n>c<color>"):
 * every rank opens its communicators, and splits them, in the same order. */
int next_space()
{
	static std::atomic<int> next_generation{ 0 };
	return next_generation.fetch_add(1);
}

/* The process's TCP device for an address setting ("iface:eth0",
 * "host:127.0.0.1"): one per process, shared by every communicator that
 * opens with it (the world's, a pipeline's splits, the hierarchical
 * leaders').  A Gloo tcp::Device is an epoll loop and its thread (which
 * wakes every 10 ms even when idle) plus the address its pairs listen on;
 * the pairs and their sockets belong to each communicator's context, so a
 * pair that times out or closes closes alone.  The registry holds weak
 * references: the contexts (and their pairs) hold the device, and it ends,
 * its thread joined, when the last communicator using it closes.  Keyed by
 * process id too, so a child forked after an open makes its own (the
 * parent's loop thread does not exist in the child).  Throws as
 * CreateDevice does. */
std::shared_ptr<gloo::transport::Device> shared_device(const std::string &iface,
						       const std::string &hostname)
{
	static std::mutex lock;
	static auto *devices = new std::vector<std::pair<std::string, std::weak_ptr<gloo::transport::Device>>>;
	const std::string key = std::to_string((long)getpid()) + (iface.empty() ? " host:" + hostname
									       : " iface:" + iface);
	std::lock_guard<std::mutex> g(lock);
	auto d = std::find_if(devices->begin(), devices->end(),
			      [&](const auto &e) { return e.first == key; });
	if (d != devices->end())
		if (auto dev = d->second.lock())
			return dev;
	gloo::transport::tcp::attr attr;
	if (iface.empty())
		attr.hostname = hostname;
	else
		attr.iface = iface;
	auto dev = gloo::transport::tcp::CreateDevice(attr);
	if (d != devices->end())
		d->second = dev;
	else
		devices->emplace_back(key, dev);
	return dev;
}

/* Gloo's TCP pairs (this Gloo, 2022) take the first connection their
 * listening socket accepts as the peer's, with no handshake: anything else
 * that connects in that window (a port scan, a monitoring probe, a dying
 * rank of another job on the host whose peer's port this pair reuses)
 * fails the connect with "Connection closed by peer" on one rank and
 * "Connection refused" on another.  So each attempt's outcome goes through
 * the store, and when any rank's failed, every rank tries again with fresh
 * pairs (new ports, new keys: prefix tryK/), up to MESH_TRIES times; the
 * message of the last failure otherwise.
 *
 * Where kiln's deadline watches the pairs, the whole of it (every try's
 * connects, store waits and outcomes) ends within [dist] timeout of the
 * run clock, and the outcomes' waits kOutcomeSlackMs after (the peers'
 * deadlines began a little later or earlier): a link cut while the mesh
 * connected had rank 1 fail after 6 timeouts and rank 0 after 12 (5 for
 * a pair's connect, Gloo's bound, then 6 and 10 s more for the outcome of
 * a peer in such a connect; session 34).  A rank past the deadline does
 * not post its outcome (its store may be the link that is cut, where the
 * post would wait the timeout again); its peers are past theirs too, or
 * end when their outcome waits do, naming it. */
enum { MESH_TRIES = 4 };
constexpr int kOutcomeSlackMs = 5000;

/* plugins/common/watchdog.c: the run clock (host table version 7) */
extern "C" long long watchdog_now_ns(void);

static int64_t run_ms() { return (int64_t)watchdog_now_ns() / 1000000; }

/* " (host NAME)" of each rank of a mesh of world ranks, as the
 * rendezvous posted them (kiln/host/R), read before the mesh connects (a
 * store get that timed out leaves the connection broken: no reading them
 * afterwards).  Only where kiln/addr_set/R, a counter posted after the
 * host name, says so (an add of 0 does not wait): a get of a key never
 * posted (a test's store, no rendezvous) would break the connection. */
static std::vector<std::string> mesh_hosts(struct kiln_store *store, int world, bool world_ranks)
{
	std::vector<std::string> out;
	if (!world_ranks)
		return out;
	for (int r = 0; r < world; r++) {
		void *v = nullptr;
		size_t n = 0;
		int64_t posted = 0;
		char key[48];
		std::snprintf(key, sizeof key, "kiln/addr_set/%d", r);
		out.push_back("");
		if (H->store_add(store, key, 0, &posted) || posted <= 0)
			continue;
		std::snprintf(key, sizeof key, "kiln/host/%d", r);
		if (!H->store_get(store, key, 1000, &v, &n) && v && n)
			out.back() = " (host " + std::string(static_cast<const char *>(v), strnlen(static_cast<const char *>(v), n)) + ")";
		H->free(v);
	}
	return out;
}

static std::string host_of(const std::vector<std::string> &hosts, int r)
{
	return r >= 0 && r < (int)hosts.size() ? hosts[(size_t)r] : std::string();
}

/* Wait for every rank's outcome of try p (*bad: the first that failed,
 * else -1), each up to wait_ms; KILN_OK or the error naming the rank. */
static kiln_status mesh_outcomes(struct kiln_store *store, const char *p, int rank, int world,
				 const char *what, int64_t due, int wait_ms, int timeout_ms,
				 const std::vector<std::string> &hosts, int *bad)
{
	*bad = -1;
	for (int r = 0; r < world; r++) {
		void *v = nullptr;
		size_t n = 0;
		char key[128];
		std::snprintf(key, sizeof key, "%sok%d", p, r);
		/* (with a deadline: until it passes and the slack) */
		const int ms = due ? (int)std::max<int64_t>(due + kOutcomeSlackMs - run_ms(), 1) : wait_ms;
		if (H->store_get(store, key, ms, &v, &n)) {
			if (due)
				return H->error(KILN_ETIMEOUT, "gloo: rank %d of %d: %s: rank %d%s did not say whether it connected within [dist] timeout = %.1f s and %.1f s: %s",
						rank, world, what, r, host_of(hosts, r).c_str(),
						timeout_ms / 1000.0, kOutcomeSlackMs / 1000.0, H->last_error());
			return H->error(KILN_EIO, "gloo: rank %d of %d: %s: waiting for rank %d's outcome: %s",
					rank, world, what, r, H->last_error());
		}
		if ((n != 1 || *(const char *)v != '1') && *bad < 0)
			*bad = r;
		H->free(v);
	}
	return KILN_OK;
}

/* world_ranks: the mesh's ranks are the world's (messages name their
 * hosts). */
static kiln_status connect_mesh(struct kiln_store *store, const char *prefix, int rank, int world,
				int timeout_ms, std::shared_ptr<gloo::transport::Device> &device,
				std::shared_ptr<KilnContext> *out, const char *what, kiln_gloo::Deadline *dl,
				bool world_ranks)
{
	std::string why;
	/* busy-polling pairs (no deadline): a peer may be in a pair's
	 * connect, which this Gloo bounds by 5 timeouts, waiting for a rank
	 * that failed fast: its outcome comes after that */
	const int outcome_ms = timeout_ms > (INT_MAX - 10000) / 6 ? INT_MAX : 6 * timeout_ms + 10000;
	const int64_t due = dl ? run_ms() + timeout_ms : 0;
	const std::vector<std::string> hosts = mesh_hosts(store, world, world_ranks && dl);
	int k = 0;
	for (; k < MESH_TRIES; k++) {
		char p[96], key[128];
		std::snprintf(p, sizeof p, "%stry%d/", prefix, k);
		std::shared_ptr<KilnContext> ctx;
		int ok = 1, late = -1;
		const int64_t left = due ? std::max<int64_t>(due - run_ms(), 1) : timeout_ms;
		try {
			KilnStore ks(store, p, (int)std::min<int64_t>(left, timeout_ms));
			ctx = std::make_shared<KilnContext>(rank, world);
			/* the pairs' own timeout: none to speak of where kiln's
			 * deadline watches them (deadline.h) */
			ctx->setTimeout(dl ? kiln_gloo::kGlooTimeout : std::chrono::milliseconds(timeout_ms));
			if (dl)
				dl->reset();
			ctx->connect_pairs(ks, device, dl, left, &late);
		} catch (const std::exception &e) {
			ok = 0;
			why = e.what();
		}
		if (!ok && due && (run_ms() >= due || dl->expired())) {
			if (late >= 0 && dl->expired())
				why = dl->why(late, host_of(hosts, late));
			else if (late >= 0) {
				char m[160];
				std::snprintf(m, sizeof m, " did not post its pairs' addresses within [dist] timeout = %.1f s: ",
					      timeout_ms / 1000.0);
				why = "rank " + std::to_string(late) + host_of(hosts, late) + m + why;
			}
			return H->error(KILN_ETIMEOUT, "gloo: rank %d of %d: %s: %s", rank, world, what,
					why.c_str());
		}
		std::snprintf(key, sizeof key, "%sok%d", p, rank);
		if (H->store_set(store, key, ok ? "1" : "0", 1))
			return H->error(KILN_EIO, "gloo: rank %d of %d: %s: %s", rank, world, what,
					H->last_error());
		int bad;
		kiln_status st = mesh_outcomes(store, p, rank, world, what, due, outcome_ms, timeout_ms,
					       hosts, &bad);
		if (st)
			return st;
		if (bad < 0) {
			*out = ctx;
			return KILN_OK;
		}
		if (due && run_ms() >= due) {
			k++;
			break; /* (no time for another try) */
		}
		if (k + 1 < MESH_TRIES && ok)
			H->log(KILN_LOG_WARN, "gloo", "rank %d of %d: %s failed on rank %d: trying again with new pairs (attempt %d of %d)",
			       rank, world, what, bad, k + 2, (int)MESH_TRIES);
		else if (k + 1 < MESH_TRIES)
			H->log(KILN_LOG_WARN, "gloo", "rank %d of %d: %s failed here (%s): trying again with new pairs (attempt %d of %d)",
			       rank, world, what, why.c_str(), k + 2, (int)MESH_TRIES);
	}
	return H->error(KILN_EIO, "gloo: rank %d of %d: %s failed %d times: %s", rank, world, what,
			k, why.empty() ? "another rank's connect failed" : why.c_str());
}

/* Open rank `rank` of a communicator of `world` ranks whose store keys lie
 * under gloo/<space>/ (and gloo/shm/<space>/, gloo/hier/<space>/); its
 * pairs listen on addr unless [plugin.gloo] iface or hostname says. */
kiln_status comm_open(const struct kiln_host *host, const struct kiln_config *cfg,
		      struct kiln_store *store, struct kiln_device *dev, int rank, int world,
		      int timeout_ms, const char *space, const std::string &addr, bool world_ranks,
		      Comm **out)
{
	*out = nullptr;
	std::unique_ptr<Comm> c(new Comm);
	c->dev = dev;
	c->rank = rank;
	c->world = world;
	c->timeout_ms = timeout_ms;
	c->cfg = cfg;
	c->store = store;
	c->addr = addr;
	const char *hostname = host->config_get(cfg, "plugin.gloo", "hostname");
	const char *iface = host->config_get(cfg, "plugin.gloo", "iface");
	std::shared_ptr<gloo::transport::Device> device;
	host->config_get_bool(cfg, "plugin.gloo", "busy_poll", &c->busy);
	if (!c->busy && world > 1) { /* (a world of one waits for no one) */
		kiln_status st;
		c->due.reset(new kiln_gloo::Deadline(host, rank, world, timeout_ms, "rank"));
		if ((st = c->due->start()))
			return st;
	}
	try {
		device = shared_device(iface && *iface ? iface : "",
				       hostname && *hostname ? hostname : addr);
		char prefix[64];
		std::snprintf(prefix, sizeof prefix, "gloo/%s/", space);
		kiln_status st = connect_mesh(store, prefix, rank, world, timeout_ms, device, &c->ctx,
					      "connecting the TCP mesh", c->due.get(), world_ranks);
		if (st)
			return st;
		/* every rank makes it here, so its slot is the same on all */
		c->barrier.reset(new gloo::BarrierAllToAll(c->ctx));
		if (c->busy)
			for (int i = 0; i < world; i++)
				if (i != rank)
					c->ctx->getPair(i)->setSync(true, true);
		std::snprintf(c->desc, sizeof c->desc, "gloo %d.%d.%d, tcp %s%s", GLOO_VERSION_MAJOR,
			      GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, device->str().c_str(),
			      c->busy ? ", busy-polling pairs" : "");
	} catch (const std::exception &e) {
		return host->error(KILN_EIO, "gloo: rank %d of %d: connecting the TCP mesh failed: %s",
				   rank, world, e.what());
	}
	/* one node: kiln's shared-memory collectives (shm.h); any reason not
	 * to falls back to Gloo's, saying why */
	int use_shm = 1, use_p2p = 1;
	char *why = c->shm_why;
	std::snprintf(why, sizeof c->shm_why, "[plugin.gloo] shm = 0");
	host->config_get_bool(cfg, "plugin.gloo", "shm", &use_shm);
	host->config_get_bool(cfg, "plugin.gloo", "shm_p2p", &use_p2p);
	c->zero_copy = 1;
	host->config_get_bool(cfg, "plugin.gloo", "zero_copy", &c->zero_copy);
	if (use_shm) {
		char prefix[64];
		std::snprintf(prefix, sizeof prefix, "gloo/shm/%s/", space);
		kiln_status st = gloo_shm_open(host, store, prefix, rank, world, timeout_ms, use_p2p, &c->shm,
					       why, sizeof c->shm_why);
		if (st)
			return st;
		int64_t spin_us = 2;
		host->config_get_int(cfg, "plugin.gloo", "p2p_spin_us", &spin_us);
		if (gloo_shm_p2p(c->shm))
			gloo_shm_p2p_spin(c->shm, (long long)spin_us * 1000);
	}
	int hier = 1;
	host->config_get_bool(cfg, "plugin.gloo", "hierarchical", &hier);
	char hwhy[320] = "[plugin.gloo] hierarchical = 0";
	if (use_shm && hier && !c->shm) {
		kiln_status st = hier_open(c.get(), device, store, space, hwhy, sizeof hwhy);
		if (st)
			return st;
	}
	const size_t at = std::strlen(c->desc);
	if (c->nd.on)
		std::snprintf(c->desc + at, sizeof c->desc - at,
			      ", hierarchical allreduce: kiln's shared memory within node %d of %d (%d ranks), Gloo between the nodes' first ranks; Gloo's reduce_scatter and allgather (%s)",
			      c->nd.node, c->nd.nodes, c->nd.local_world, why);
	else if (c->shm && gloo_shm_p2p(c->shm))
		std::snprintf(c->desc + at, sizeof c->desc - at,
			      ", kiln's shared-memory allreduce, reduce_scatter and allgather (%zu KiB rounds), send and recv (%zu KiB channels)",
			      gloo_shm_chunk() >> 10, gloo_shm_p2p(c->shm) >> 10);
	else if (c->shm)
		std::snprintf(c->desc + at, sizeof c->desc - at,
			      ", kiln's shared-memory allreduce, reduce_scatter and allgather (%zu KiB rounds); Gloo's send and recv (%s)",
			      gloo_shm_chunk() >> 10,
			      use_p2p ? "more than 16 ranks" : "[plugin.gloo] shm_p2p = 0");
	else
		std::snprintf(c->desc + at, sizeof c->desc - at,
			      ", Gloo's collectives (kiln's shared memory off: %s%s%s)", why,
			      use_shm && hier ? "; no hierarchical allreduce: " : "",
			      use_shm && hier ? hwhy : "");
	*out = c.release();
	return KILN_OK;
}

/* The pairs' address without [plugin.gloo] iface or hostname: the one this
 * rank's store connection leaves from, which the rendezvous posts as
 * kiln/addr/RANK (kiln/dist.h), an address of this host the other ranks
 * reach.  Until session 31 it was 127.0.0.1, and ranks on several hosts
 * retried their connects for minutes naming no setting.  Read only once
 * kiln/addr_set/RANK says it is there (a counter: store_add of 0 does not
 * wait): a get of an address the rendezvous did not post waited out the
 * whole [dist] timeout and left the store connection broken (session
 * 32).  127.0.0.1 otherwise, said when a rendezvous ran (kiln/joined > 0):
 * only ranks on this host reach it. */
static std::string default_addr(const struct kiln_host *host, const struct kiln_config *cfg,
				struct kiln_store *store, int rank, int world)
{
	std::string addr = "127.0.0.1";
	int64_t joined = 0, posted = 0;
	char key[48];
	void *v = nullptr;
	const char *iface = host->config_get(cfg, "plugin.gloo", "iface");
	const char *name = host->config_get(cfg, "plugin.gloo", "hostname");
	if ((iface && *iface) || (name && *name))
		return addr; /* (not used: the setting says where) */
	std::snprintf(key, sizeof key, "kiln/addr_set/%d", rank);
	if (host->store_add(store, "kiln/joined", 0, &joined) || joined <= 0)
		return addr; /* no rendezvous on this store (a test's) */
	if (!host->store_add(store, key, 0, &posted) && posted > 0) {
		/* set before the counter: the get answers at once */
		std::snprintf(key, sizeof key, "kiln/addr/%d", rank);
		const bool got = !host->store_get(store, key, 1000, &v, nullptr) && v &&
				 *(const char *)v;
		if (got)
			addr = (const char *)v;
		host->free(v);
		if (got)
			return addr;
	}
	host->log(KILN_LOG_WARN, "gloo", "rank %d of %d: the rendezvous posted no address for this rank (kiln/addr/%d): the pairs listen on 127.0.0.1, which only ranks on this host reach; set [plugin.gloo] iface or hostname when the ranks span hosts",
		  rank, world, rank);
	return addr;
}

kiln_status gloo_open(const struct kiln_host *host, const struct kiln_config *cfg,
		      struct kiln_store *store, struct kiln_device *dev, int rank, int world,
		      int timeout_ms, void **out)
{
	if (H != host) // ranks as threads: the same table, not rewritten
		H = host;
	*out = nullptr;
	if (std::strcmp(host->device_name(dev), "cpu"))
		return host->error(KILN_ENOTSUP, "gloo: collectives on host memory only, and [run] device = %s keeps its tensors elsewhere: use [run] comm = nccl",
				   host->device_name(dev));
	char space[32];
	std::snprintf(space, sizeof space, "%d", next_space());
	Comm *c = nullptr;
	kiln_status st = comm_open(host, cfg, store, dev, rank, world, timeout_ms, space,
				   default_addr(host, cfg, store, rank, world), true, &c);
	*out = c;
	return st;
}

/* Several nodes ([plugin.gloo] hierarchical): each node's shared memory
 * and the leaders' communicator over `device`, or nothing (c->nd.on = 0,
 * why set).  Collective. */
kiln_status hier_open(Comm *c, std::shared_ptr<gloo::transport::Device> device,
		      struct kiln_store *store, const char *space, char *why, size_t n)
{
	char prefix[64];
	std::snprintf(prefix, sizeof prefix, "gloo/hier/%s/", space);
	kiln_status st = gloo_shm_open_node(H, store, prefix, c->rank, c->world, c->timeout_ms,
					    &c->nd, &c->node_shm, why, n);
	if (st || !c->nd.on || c->nd.local_rank)
		return st;
	c->lead = new Comm;
	c->lead->dev = c->dev;
	c->lead->rank = c->nd.node;
	c->lead->world = c->nd.nodes;
	c->lead->timeout_ms = c->timeout_ms;
	c->lead->due.reset(new kiln_gloo::Deadline(H, c->nd.node, c->nd.nodes, c->timeout_ms,
						 "the first rank of node"));
	if ((st = c->lead->due->start()))
		return st;
	char what[96];
	std::snprintf(prefix, sizeof prefix, "gloo/hier/%s/lead/", space);
	std::snprintf(what, sizeof what, "connecting the nodes' first ranks (rank %d of %d, node %d of %d)",
		      c->rank, c->world, c->nd.node, c->nd.nodes);
	return connect_mesh(store, prefix, c->nd.node, c->nd.nodes, c->timeout_ms, device,
			    &c->lead->ctx, what, c->lead->due.get(), false);
}

/* comm ops version 3: the gradients in shared memory (shm.h) */
kiln_status gloo_alloc_shared(void *ctx, size_t bytes, void **ptr)
{
	Comm *c = static_cast<Comm *>(ctx);
	*ptr = nullptr;
	if (!c->shm)
		return H->error(KILN_ENOTSUP, "gloo: no shared memory (%s)", c->shm_why);
	return gloo_shm_alloc(c->shm, bytes, c->zero_copy, ptr);
}

/* comm ops version 8: buffers every rank maps (shm.h) */
kiln_status gloo_map_shared(void *ctx, size_t bytes, void **base)
{
	Comm *c = static_cast<Comm *>(ctx);
	for (int r = 0; r < c->world; r++)
		base[r] = nullptr;
	if (!c->shm)
		return H->error(KILN_ENOTSUP, "gloo: no shared memory (%s)", c->shm_why);
	return gloo_shm_map(c->shm, bytes, base);
}

/* comm ops version 8: a shared-memory channel holds a message up to its
 * ring less a frame without the receive posted (shmp2p.c); TCP none */
size_t gloo_p2p_buffered(void *ctx, int peer)
{
	Comm *c = static_cast<Comm *>(ctx);
	return peer >= 0 && peer < c->world && peer != c->rank ? gloo_shm_p2p_buffered(c->shm) : 0;
}

void gloo_close(void *ctx)
{
	Comm *c = static_cast<Comm *>(ctx);
	if (c) {
		c->sender.reset(); /* its thread sends on c->shm */
		gloo_shm_close(c->shm);
		gloo_shm_close(c->node_shm);
		delete c->lead;
	}
	delete c;
}

/* One collective queued on the comm stream: a job carrying the call's arguments (send is
 * nullptr for the in-place ones, op and root 0 where they do not apply). */
kiln_status submit(void *ctx, Kind kind, const void *send, void *buf, size_t count, int dtype,
		   int op, int root, void *stream, void *done)
{
	Comm *c = static_cast<Comm *>(ctx);
	Job *j = job_get(c, kind);
	if (!j)
		return KILN_EINTERNAL;
	j->send = send;
	j->buf = buf;
	j->count = count;
	j->dtype = dtype;
	j->op = op;
	j->root = root;
	return enqueue(c, j, stream, done);
}

kiln_status gloo_allreduce(void *ctx, void *buf, size_t count, int dtype, int op, void *stream,
			   void *done)
{
	if (dtype != KILN_F32 && dtype != KILN_BF16 && dtype != KILN_F16)
		return H->error(KILN_ENOTSUP, "gloo: allreduce of dtype %d (f32, bf16, f16 only)", dtype);
	return submit(ctx, K_ALLREDUCE, nullptr, buf, count, dtype, op, 0, stream, done);
}

kiln_status gloo_broadcast(void *ctx, void *buf, size_t count, int dtype, int root, void *stream,
			   void *done)
{
	return submit(ctx, K_BROADCAST, nullptr, buf, count, dtype, 0, root, stream, done);
}

kiln_status gloo_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
			   void *stream, void *done)
{
	return submit(ctx, K_ALLGATHER, send, recv, count, dtype, 0, 0, stream, done);
}

kiln_status gloo_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, int dtype,
				int op, void *stream, void *done)
{
	if (dtype != KILN_F32 && dtype != KILN_BF16 && dtype != KILN_F16)
		return H->error(KILN_ENOTSUP, "gloo: reduce_scatter of dtype %d (f32, bf16, f16 only)",
				dtype);
	return submit(ctx, K_REDUCE_SCATTER, send, recv, count, dtype, op, 0, stream, done);
}

/* Point to point: peer rides in the job's root. */
kiln_status gloo_p2p(void *ctx, Kind kind, void *buf, size_t count, int dtype, int peer,
		     void *stream, void *done)
{
	Comm *c = static_cast<Comm *>(ctx);
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "gloo: rank %d of %d: %s %s rank %d: no such peer",
				c->rank, c->world, kind_name(kind), kind == K_SEND ? "to" : "from",
				peer);
	return submit(ctx, kind, nullptr, buf, count, dtype, 0, peer, stream, done);
}

kiln_status gloo_send(void *ctx, const void *buf, size_t count, int dtype, int peer, void *stream,
		      void *done)
{
	return gloo_p2p(ctx, K_SEND, const_cast<void *>(buf), count, dtype, peer, stream, done);
}

kiln_status gloo_recv(void *ctx, void *buf, size_t count, int dtype, int peer, void *stream,
		      void *done)
{
	return gloo_p2p(ctx, K_RECV, buf, count, dtype, peer, stream, done);
}

/* comm ops version 7: one job, its send and recv progressing together
 * (run_sendrecv_shm, run_sendrecv_tcp). */
kiln_status gloo_sendrecv(void *ctx, const void *send_buf, size_t send_count, int dst,
			  void *recv_buf, size_t recv_count, int src, int dtype, void *stream,
			  void *done)
{
	Comm *c = static_cast<Comm *>(ctx);
	/* the core (kiln_comm_sendrecv) refused an empty call and a peer
	 * below 0 or this rank; the world's size only the communicator knows */
	if ((send_count && dst >= c->world) || (recv_count && src >= c->world))
		return H->error(KILN_EINVAL, "gloo: rank %d of %d: sendrecv to rank %d, from rank %d: no such peer",
				c->rank, c->world, dst, src);
	Job *j = job_get(c, K_SENDRECV);
	if (!j)
		return KILN_EINTERNAL;
	j->send = send_buf;
	j->count = send_count;
	j->root = dst;
	j->buf = recv_buf;
	j->rcount = recv_count;
	j->src = src;
	j->dtype = dtype;
	return enqueue(c, j, stream, done);
}

/* comm ops version 6: a send on the calling thread.  wait = 0: into the
 * shared-memory channel if it has room now, else nothing (*sent = 0; over
 * TCP always nothing: a Gloo send cannot say that it would wait). */
kiln_status gloo_send_now(void *ctx, const void *buf, size_t count, int dtype, int peer, int wait,
			  int *sent)
{
	Comm *c = static_cast<Comm *>(ctx);
	*sent = 0;
	if (peer < 0 || peer >= c->world || peer == c->rank)
		return H->error(KILN_EINVAL, "gloo: rank %d of %d: send to rank %d: no such peer",
				c->rank, c->world, peer);
	if (!wait) {
		*sent = gloo_shm_p2p(c->shm) &&
			gloo_shm_try_send(c->shm, peer, buf, count * dtype_size(dtype));
		return KILN_OK;
	}
	Job j;
	job_fill(&j, c, K_SEND);
	j.buf = const_cast<void *>(buf);
	j.count = count;
	j.dtype = dtype;
	j.root = peer;
	kiln_status st = run_job_now(&j);
	*sent = !st;
	return st;
}

kiln_status gloo_barrier(void *ctx)
{
	Comm *c = static_cast<Comm *>(ctx);
	if (c->world == 1)
		return KILN_OK;
	try {
		/* old-style, like the bound collectives, and made once with
		 * the mesh (comm_open).  A message for a slot with no buffer
		 * registered yet leaves Gloo's event loop spinning on EPOLLIN,
		 * holding the pair's lock, until this rank registers one (a
		 * new-style barrier's receive, or a BarrierAllToAll made per
		 * call: the peer's notice came before this rank made its
		 * buffers).  With the rank's threads bound to one CPU shared
		 * with other work, the registration then waited on that lock
		 * past the 60 s read timeout (kiln bench comm under load 15). */
		kiln_gloo::Watched w(c->due.get());
		c->barrier->run();
		if (w.finish())
			throw std::runtime_error(c->due->why(-1));
	} catch (const std::exception &e) {
		const bool expired = c->due && c->due->expired();
		return H->error(expired ? KILN_ETIMEOUT : KILN_EIO, "gloo: rank %d of %d: barrier failed: %s",
				c->rank, c->world, expired ? c->due->why(-1).c_str() : e.what());
	}
	return KILN_OK;
}

/* comm ops version 5: every rank posts its color and key under
 * gloo/split/<n>/<rank>, reads every other's, and the ranks of its color
 * (ordered by key, then rank) connect a communicator of their own under
 * gloo/<n>c<color>/. */
kiln_status gloo_split(void *ctx, int color, int key, void **out, int *rank, int *world)
{
	Comm *c = static_cast<Comm *>(ctx);
	const int n = next_space();
	*out = nullptr;
	*rank = -1;
	*world = 0;
	if (color < KILN_COMM_NO_GROUP)
		return H->error(KILN_EINVAL, "gloo: rank %d of %d: split color %d (>= 0, or KILN_COMM_NO_GROUP)",
				c->rank, c->world, color);
	char k[64], v[64];
	std::snprintf(k, sizeof k, "gloo/split/%d/%d", n, c->rank);
	std::snprintf(v, sizeof v, "%d %d", color, key);
	kiln_status st = H->store_set(c->store, k, v, std::strlen(v));
	if (st)
		return st;
	std::vector<std::pair<int, int>> group; /* (key, rank) of my color */
	for (int r = 0; r < c->world; r++) {
		void *val = nullptr;
		int cr = 0, kr = 0;
		std::snprintf(k, sizeof k, "gloo/split/%d/%d", n, r);
		if ((st = H->store_get(c->store, k, c->timeout_ms, &val, nullptr)))
			return H->error(st, "gloo: rank %d of %d: split: waiting for rank %d's color: %s",
					c->rank, c->world, r, H->last_error());
		const int ok = std::sscanf(static_cast<const char *>(val), "%d %d", &cr, &kr) == 2;
		H->free(val);
		if (!ok)
			return H->error(KILN_EIO, "gloo: rank %d of %d: split: rank %d posted no color",
					c->rank, c->world, r);
		if (cr == color && color != KILN_COMM_NO_GROUP)
			group.emplace_back(kr, r);
	}
	if (color == KILN_COMM_NO_GROUP)
		return KILN_OK;
	std::sort(group.begin(), group.end());
	int me = 0;
	while (group[(size_t)me].second != c->rank)
		me++;
	char space[32];
	std::snprintf(space, sizeof space, "%dc%d", n, color);
	Comm *g = nullptr;
	if ((st = comm_open(H, c->cfg, c->store, c->dev, me, (int)group.size(), c->timeout_ms, space,
			    c->addr, false, &g)))
		return H->error(st, "gloo: rank %d of %d: split into group %d (rank %d of %zu): %s",
				c->rank, c->world, color, me, group.size(), H->last_error());
	/* (the group's ranks share the CPUs with the other groups') */
	if (g->shm && c->shm)
		gloo_shm_inherit(g->shm, c->shm);
	if (g->shm) {
		const size_t at = std::strlen(g->desc);
		std::snprintf(g->desc + at, sizeof g->desc - at, "; group %d of a split: rank %d of %zu, %s",
			      color, me, group.size(),
			      gloo_shm_yields(g->shm) ? "its shared-memory waits yield (the ranks outnumber their CPUs)"
						      : "its shared-memory waits spin, then sleep when long");
	}
	for (const auto &m : group)
		g->world_of.push_back(wrank(c, m.second));
	*out = g;
	*rank = me;
	*world = (int)group.size();
	return KILN_OK;
}

const char *gloo_describe(void *ctx)
{
	return static_cast<Comm *>(ctx)->desc;
}

const struct kiln_comm_ops gloo_ops = {
	/* .version = */ KILN_COMM_OPS_VERSION,
	/* .open = */ gloo_open,
	/* .close = */ gloo_close,
	/* .allreduce = */ gloo_allreduce,
	/* .broadcast = */ gloo_broadcast,
	/* .allgather = */ gloo_allgather,
	/* .reduce_scatter = */ gloo_reduce_scatter,
	/* .barrier = */ gloo_barrier,
	/* .describe = */ gloo_describe,
	/* .alloc_shared = */ gloo_alloc_shared,
	/* .send = */ gloo_send,
	/* .recv = */ gloo_recv,
	/* .split = */ gloo_split,
	/* .send_now = */ gloo_send_now,
	/* .sendrecv = */ gloo_sendrecv,
	/* .map_shared = */ gloo_map_shared,
	/* .p2p_buffered = */ gloo_p2p_buffered,
	/* .reduce_scatter_in_place = */ 1, /* (every path reads its input first) */
};

const struct kiln_key gloo_keys[] = {
	{ "hostname", KILN_KEY_STR, "", 0, 0, nullptr,
	  "Address this rank's Gloo pairs listen on, as the other ranks reach it (multi-node: the node's name or address on the fast network); empty = the address this rank's connection to the rendezvous store leaves from (127.0.0.1 on one machine with the default master address)." },
	{ "iface", KILN_KEY_STR, "", 0, 0, nullptr,
	  "Network interface whose address the pairs listen on (e.g. `eth0`); overrides `hostname`." },
	{ "busy_poll", KILN_KEY_BOOL, "0", 0, 0, nullptr,
	  "Put the TCP pairs in Gloo's synchronous busy-polling mode: the thread running a collective (the comm stream's worker) reads the sockets itself, spinning, instead of sleeping until Gloo's event-loop thread has read the data and woken it. Removes a thread wake-up per message, so an allreduce overlapped with a busy backward is much faster when a core is free for the spinning, and much slower when the machine is oversubscribed. Such pairs keep Gloo's own timeout, which counts a time in which the whole job stood still (docs/distributed.md, \"A suspended job\"). 0: Gloo's default (event loop); kiln times each wait on the run clock." },
	{ "shm", KILN_KEY_BOOL, "1", 0, 0, nullptr,
	  "When every rank runs on one node (the same host name and boot id): allreduce, reduce_scatter and allgather run as kiln's own shared-memory collectives (a POSIX shared-memory object, 256 KiB rounds, sums in rank order in f32 so every rank gets the same bits; a wait spins up to 5 ms while its core is its own, then sleeps: docs/distributed.md, \"Waiting\"), faster than Gloo's TCP loopback at every size (docs/PERFORMANCE.md, part 7b); a rank whose process ends is noticed within about 20 ms and named. Broadcasts and the barrier stay Gloo's, and `busy_poll` applies to them only. 0: Gloo's collectives throughout. Ranks on several nodes always use Gloo's." },
	{ "shm_p2p", KILN_KEY_BOOL, "1", 0, 0, nullptr,
	  "With `shm` on (every rank on one node) and at most 16 ranks: point-to-point send and recv (a pipeline's crossing tensors) go through a shared-memory channel per ordered pair of ranks (a ring of 4 MiB for 2 ranks, 1 MiB for 3, less beyond: 8 MiB in all; messages in order, sizes checked; a waiting side polls `p2p_spin_us`, none when the ranks outnumber their CPUs, then yields while its core is free, up to 5 ms of waiting, then sleeps on a futex the other side wakes), instead of a Gloo buffer per message over TCP loopback (docs/distributed.md). A rank whose process ends is noticed within about 20 ms and named. 0: Gloo's send and recv." },
	{ "p2p_spin_us", KILN_KEY_INT, "2", 0, 1000000, nullptr,
	  "With `shm_p2p`: microseconds a send or recv on a shared-memory channel polls for its peer before it yields (up to 5 ms of waiting, while its core is free) and then sleeps on the futex (0: no polling). Polling only pays when the peer answers within it: on 2 busy CPUs a 20 us poll made a message's one-way time 25-29 us against 4-6 us without one (bench/p2p_channel, docs/PERFORMANCE.md). No polling while the ranks outnumber their CPUs." },
	{ "hierarchical", KILN_KEY_BOOL, "1", 0, 0, nullptr,
	  "With `shm` on and the ranks on several nodes, some with two or more: every allreduce sums in kiln's shared memory among each node's ranks, then over Gloo's TCP among the nodes' first ranks, and shares the total back through shared memory, so each node sends its data across the network once instead of once per rank (docs/distributed.md, \"Several machines\"). Reduce-scatter, allgather, broadcasts and the barrier stay Gloo's over every rank. 0: Gloo's allreduce over every rank." },
	{ "zero_copy", KILN_KEY_BOOL, "1", 0, 0, nullptr,
	  "With `shm` on: give the core shared memory for the gradients of a DDP run (comm ops alloc_shared: a second POSIX shared-memory object, unlinked once mapped), so that each bucket's allreduce sums every rank's share straight from every rank's gradients into every rank's, with no staging copies (docs/distributed.md). 0: the gradients stay in the device's memory and go through the staging buffers. With [dist] zero = 1 too (not beside [dist] pipeline): its reduce-scatters read the gradients there, through the staging buffers." },
	{ nullptr, 0, nullptr, 0, 0, nullptr, nullptr }
};

} // namespace

COMM_PLUGIN(gloo, "gloo", "Gloo collectives over TCP (CPU tensors; any machine)", gloo_ops,
	    gloo_keys, nullptr)
