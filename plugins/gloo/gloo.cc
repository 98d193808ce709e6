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
 * reduce_scatter of f32 is Gloo's ReduceScatterHalvingDoubling (the
 * old-style algorithm API: the new-style one has no reduce_scatter): the
 * input is copied into a scratch buffer the algorithm is bound to (it
 * reduces in place there and leaves this rank's slice at its start), and
 * that slice is copied out; the bound
 * algorithm is kept while the count stays the same (ZeRO-1 calls it with
 * one count every step), since binding registers buffers with every pair.
 * bf16 and f16 are an allreduce of the scratch buffer and a copy.
 * allgather may be in place (send == recv + rank * count): then Gloo
 * takes this rank's slice from the output.
 *
 * [plugin.gloo] busy_poll = 1 puts the pairs in Gloo's synchronous
 * busy-polling mode (the comm stream's worker reads the sockets itself
 * instead of waiting for the event-loop thread to wake it); that mode has
 * no unbound buffers, so every collective is then old-style (made per
 * call where it is not bound).
 *
 * The hot path allocates nothing.  Jobs come from a per-communicator pool
 * of kJobs slots (a slot is free again when its host function has run;
 * more than kJobs collectives in flight is an error naming the rank, never
 * an allocation).  An f32 allreduce runs an old-style
 * AllreduceHalvingDoubling bound to its buffer and count, built on the
 * buffer's first allreduce and kept (kBound of them: the gradient buckets
 * and the few small buffers a training step reduces have fixed addresses),
 * so after the first step no allocation happens for it; past kBound bound
 * buffers, and for bf16/f16, Gloo's new-style calls run, which allocate
 * inside Gloo.  Broadcast (start-up only) is an old-style
 * BroadcastOneToAll made per call.  Allgathers of up to 4 MiB in
 * all (sync_bn's statistics) are bound the same way, an old-style
 * AllgatherRing per (send, recv, bytes) writing into two staging buffers
 * of its own in turn (see BoundAg); larger ones (ZeRO-1's parameters)
 * are Gloo's new-style allgather.  tests/check_comm counts every
 * malloc of the process during steady-state collectives.
 */
#include <kiln/plugin.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/broadcast_one_to_all.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
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
	void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &t) override
	{
		for (const auto &k : keys) {
			void *v = nullptr;
			if (H->store_get(s_, (prefix_ + k).c_str(), (int)t.count(), &v, nullptr))
				throw std::runtime_error(H->last_error());
			H->free(v);
		}
	}

private:
	struct kiln_store *s_;
	std::string prefix_;
	int timeout_ms_;
};

/* ---- the communicator --------------------------------------------------- */

enum Kind { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER };

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
	uint32_t tag;
	std::atomic<int> busy{ 0 };
};

constexpr int kJobs = 256;  /* collectives in flight per communicator */
constexpr int kBound = 128; /* f32 allreduce buffers with a bound algorithm */

struct Bound {
	float *buf;
	size_t count;
	std::unique_ptr<gloo::AllreduceHalvingDoubling<float>> algo;
};

/* an allgather of (send, recv, bytes per rank), bound to two staging
 * buffers of its own used in turn: AllgatherRing's first send writes into
 * the peer's output without waiting for it, so the output must be memory
 * nobody else uses between runs (the caller's recv may be a layer's
 * scratch), and a peer one run ahead must not overwrite the output being
 * copied out (it cannot be two ahead: each run needs this rank) */
struct BoundAg {
	const char *send;
	char *recv;
	size_t bytes;
	int flip;
	std::vector<char> stage[2];
	std::unique_ptr<gloo::AllgatherRing<char>> algo[2];
};
constexpr size_t kBoundAgMax = (size_t)4 << 20; /* bytes x world, larger: unbound */

struct Comm {
	struct kiln_device *dev;
	int rank, world, timeout_ms;
	std::shared_ptr<gloo::rendezvous::Context> ctx;
	std::atomic<uint32_t> tag{ 1 };
	std::vector<char> scratch; /* reduce_scatter; used on the stream only */
	/* f32 reduce_scatter: the algorithm bound to rs_buf, for rs_count */
	std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
	std::vector<float> rs_buf;
	size_t rs_count = 0;
	char desc[160];
	Job jobs[kJobs];
	int next_job = 0;
	/* bound f32 allreduces (host functions only; the lock is for
	 * collectives enqueued on different streams) */
	std::mutex bound_lock;
	Bound bound[kBound];
	int n_bound = 0;
	BoundAg bound_ag[kBound];
	int n_bound_ag = 0;
	/* [plugin.gloo] busy_poll: the pairs are in Gloo's synchronous
	 * busy-polling mode, which has no unbound buffers: every collective
	 * is an old-style algorithm then (made per call where not bound) */
	int busy = 0;
};

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

/* An old-style allreduce made for this call (busy-polling pairs). */
void allreduce_old(Comm *c, void *buf, size_t n, int dt)
{
	if (dt == KILN_F32)
		gloo::AllreduceHalvingDoubling<float>(c->ctx, std::vector<float *>{ static_cast<float *>(buf) },
						      (int)n).run();
	else if (dt == KILN_F16)
		gloo::AllreduceHalvingDoubling<gloo::float16>(
			c->ctx, std::vector<gloo::float16 *>{ static_cast<gloo::float16 *>(buf) }, (int)n).run();
	else
		gloo::AllreduceHalvingDoubling<uint16_t>(
			c->ctx, std::vector<uint16_t *>{ static_cast<uint16_t *>(buf) }, (int)n,
			&bf16_sum_fn).run();
}

void allreduce_now(Comm *c, void *buf, size_t n, int dt, uint32_t tag)
{
	if (c->busy)
		return allreduce_old(c, buf, n, dt);
	gloo::AllreduceOptions o(c->ctx);
	o.setTag(tag);
	o.setTimeout(std::chrono::milliseconds(c->timeout_ms));
	if (dt == KILN_F32) {
		o.setOutput(static_cast<float *>(buf), n);
		o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
			&gloo::sum<float>));
	} else if (dt == KILN_F16) {
		o.setOutput(static_cast<gloo::float16 *>(buf), n);
		o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(
			&gloo::sum<gloo::float16>));
	} else {
		o.setOutput(static_cast<uint16_t *>(buf), n);
		o.setReduceFunction(&sum_bf16);
	}
	gloo::allreduce(o);
}

/* The f32 allreduce of (buf, n): the bound algorithm, made on first use. */
void allreduce_f32(Comm *c, float *buf, size_t n, uint32_t tag)
{
	gloo::AllreduceHalvingDoubling<float> *a = nullptr;
	{
		std::lock_guard<std::mutex> g(c->bound_lock);
		for (int i = 0; i < c->n_bound && !a; i++)
			if (c->bound[i].buf == buf && c->bound[i].count == n)
				a = c->bound[i].algo.get();
		if (!a && c->n_bound < kBound && n <= (size_t)INT32_MAX) {
			Bound &b = c->bound[c->n_bound];
			b.algo.reset(new gloo::AllreduceHalvingDoubling<float>(
				c->ctx, std::vector<float *>{ buf }, (int)n));
			b.buf = buf;
			b.count = n;
			a = b.algo.get();
			c->n_bound++;
		}
	}
	if (a)
		a->run();
	else
		allreduce_now(c, buf, n, KILN_F32, tag);
}

/* An allgather of `bytes` per rank from send into recv: the bound ring,
 * made on first use; false past kBound of them. */
bool allgather_bound(Comm *c, const void *send, void *recv, size_t bytes)
{
	BoundAg *b = nullptr;
	const char *in = static_cast<const char *>(send);
	char *out = static_cast<char *>(recv);
	const size_t all = bytes * (size_t)c->world;
	if (all > kBoundAgMax)
		return false;
	{
		std::lock_guard<std::mutex> g(c->bound_lock);
		for (int i = 0; i < c->n_bound_ag && !b; i++)
			if (c->bound_ag[i].send == in && c->bound_ag[i].recv == out &&
			    c->bound_ag[i].bytes == bytes)
				b = &c->bound_ag[i];
		if (!b && c->n_bound_ag < kBound) {
			b = &c->bound_ag[c->n_bound_ag];
			for (int k = 0; k < 2; k++) {
				b->stage[k].assign(all, 0);
				b->algo[k].reset(new gloo::AllgatherRing<char>(
					c->ctx, std::vector<const char *>{ in }, b->stage[k].data(),
					(int)bytes));
			}
			b->send = in;
			b->recv = out;
			b->bytes = bytes;
			b->flip = 0;
			c->n_bound_ag++;
		}
	}
	if (!b)
		return false;
	const int k = b->flip;
	b->flip ^= 1;
	b->algo[k]->run();
	std::memcpy(out, b->stage[k].data(), all);
	return true;
}

const char *kind_name(Kind k)
{
	switch (k) {
	case K_ALLREDUCE: return "allreduce";
	case K_BROADCAST: return "broadcast";
	case K_ALLGATHER: return "allgather";
	default: return "reduce_scatter";
	}
}

kiln_status run_job_now(Job *j);

kiln_status run_job(void *arg)
{
	Job *j = static_cast<Job *>(arg);
	kiln_status st = run_job_now(j);
	j->busy.store(0, std::memory_order_release);
	return st;
}

kiln_status run_job_now(Job *j)
{
	Comm *c = j->c;
	size_t es = dtype_size(j->dtype);
	try {
		switch (j->kind) {
		case K_ALLREDUCE:
			if (c->world > 1 && j->dtype == KILN_F32)
				allreduce_f32(c, static_cast<float *>(j->buf), j->count, j->tag);
			else if (c->world > 1)
				allreduce_now(c, j->buf, j->count, j->dtype, j->tag);
			if (j->op == KILN_REDUCE_AVG && c->world > 1)
				scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
			break;
		case K_BROADCAST: {
			if (c->world == 1)
				break;
			/* old-style, made for the call: start-up only, and
			 * it works on busy-polling pairs too */
			gloo::BroadcastOneToAll<char> b(c->ctx, std::vector<char *>{ static_cast<char *>(j->buf) },
							j->count * es, j->root);
			b.run();
			break;
		}
		case K_ALLGATHER: {
			if (c->world == 1) {
				std::memmove(j->buf, j->send, j->count * es);
				break;
			}
			if (allgather_bound(c, j->send, j->buf, j->count * es))
				break;
			if (c->busy) {
				gloo::AllgatherRing<char>(c->ctx, std::vector<const char *>{ static_cast<const char *>(j->send) },
							  static_cast<char *>(j->buf), (int)(j->count * es)).run();
				break;
			}
			gloo::AllgatherOptions o(c->ctx);
			o.setTag(j->tag);
			o.setTimeout(std::chrono::milliseconds(c->timeout_ms));
			if (j->send != static_cast<char *>(j->buf) + (size_t)c->rank * j->count * es)
				o.setInput(const_cast<char *>(static_cast<const char *>(j->send)),
					   j->count * es);
			o.setOutput(static_cast<char *>(j->buf), j->count * es * (size_t)c->world);
			gloo::allgather(o);
			break;
		}
		case K_REDUCE_SCATTER: {
			if (j->dtype == KILN_F32 && c->world > 1) {
				size_t all = j->count * (size_t)c->world;
				if (!c->rs || c->rs_count != j->count) {
					c->rs.reset();
					c->rs_buf.assign(all, 0.0f);
					std::vector<int> elems((size_t)c->world, (int)j->count);
					c->rs.reset(new gloo::ReduceScatterHalvingDoubling<float>(
						c->ctx, std::vector<float *>{ c->rs_buf.data() }, (int)all,
						elems));
					c->rs_count = j->count;
				}
				std::memcpy(c->rs_buf.data(), j->send, all * sizeof(float));
				c->rs->run();
				/* the algorithm leaves this rank's slice at the
				 * start of its buffer */
				std::memcpy(j->buf, c->rs_buf.data(), j->count * sizeof(float));
				if (j->op == KILN_REDUCE_AVG)
					scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
				break;
			}
			size_t all = j->count * (size_t)c->world * es;
			c->scratch.resize(all);
			std::memcpy(c->scratch.data(), j->send, all);
			if (c->world > 1)
				allreduce_now(c, c->scratch.data(), j->count * (size_t)c->world, j->dtype,
					      j->tag);
			std::memcpy(j->buf, c->scratch.data() + (size_t)c->rank * j->count * es,
				    j->count * es);
			if (j->op == KILN_REDUCE_AVG && c->world > 1)
				scale(j->buf, j->count, j->dtype, 1.0f / (float)c->world);
			break;
		}
		}
	} catch (const std::exception &e) {
		const char *w = e.what();
		bool timeout = std::strstr(w, "imed out") || std::strstr(w, "imeout");
		return H->error(timeout ? KILN_ETIMEOUT : KILN_EIO,
				"gloo: rank %d of %d: %s of %zu elements failed: %s", c->rank, c->world,
				kind_name(j->kind), j->count, w);
	}
	return KILN_OK;
}

/* A free job slot (the enqueuing thread only), or NULL with the error set. */
Job *job_get(Comm *c, Kind kind)
{
	for (int k = 0; k < kJobs; k++) {
		Job *j = &c->jobs[(c->next_job + k) % kJobs];
		if (!j->busy.load(std::memory_order_acquire)) {
			c->next_job = (c->next_job + k + 1) % kJobs;
			j->busy.store(1, std::memory_order_relaxed);
			j->c = c;
			j->kind = kind;
			j->buf = nullptr;
			j->send = nullptr;
			j->count = 0;
			j->dtype = j->op = j->root = 0;
			return j;
		}
	}
	H->error(KILN_EINTERNAL, "gloo: rank %d of %d: %d collectives are in flight, the most a communicator holds: %s not enqueued",
		 c->rank, c->world, kJobs, kind_name(kind));
	return nullptr;
}

kiln_status enqueue(Comm *c, Job *j, void *stream, void *done)
{
	j->tag = c->tag.fetch_add(1);
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

kiln_status gloo_open(const struct kiln_host *host, const struct kiln_config *cfg,
		      struct kiln_store *store, struct kiln_device *dev, int rank, int world,
		      int timeout_ms, void **out)
{
	H = host;
	*out = nullptr;
	if (std::strcmp(host->device_name(dev), "cpu"))
		return host->error(KILN_ENOTSUP, "gloo: collectives on host memory only, and [run] device = %s keeps its tensors elsewhere: use [run] comm = nccl",
				   host->device_name(dev));
	std::unique_ptr<Comm> c(new Comm);
	c->dev = dev;
	c->rank = rank;
	c->world = world;
	c->timeout_ms = timeout_ms;
	const char *hostname = host->config_get(cfg, "plugin.gloo", "hostname");
	const char *iface = host->config_get(cfg, "plugin.gloo", "iface");
	try {
		gloo::transport::tcp::attr attr;
		if (iface && *iface)
			attr.iface = iface;
		else
			attr.hostname = hostname && *hostname ? hostname : "127.0.0.1";
		auto device = gloo::transport::tcp::CreateDevice(attr);
		/* a fresh key space per communicator: every rank opens its
		 * communicators in the same order */
		static std::atomic<int> generation{ 0 };
		char prefix[64];
		std::snprintf(prefix, sizeof prefix, "gloo/%d/", generation.fetch_add(1));
		KilnStore ks(store, prefix, timeout_ms);
		c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
		c->ctx->setTimeout(std::chrono::milliseconds(timeout_ms));
		c->ctx->connectFullMesh(ks, device);
		host->config_get_bool(cfg, "plugin.gloo", "busy_poll", &c->busy);
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
	*out = c.release();
	return KILN_OK;
}

void gloo_close(void *ctx)
{
	delete static_cast<Comm *>(ctx);
}

kiln_status gloo_allreduce(void *ctx, void *buf, size_t count, int dtype, int op, void *stream,
			   void *done)
{
	if (dtype != KILN_F32 && dtype != KILN_BF16 && dtype != KILN_F16)
		return H->error(KILN_ENOTSUP, "gloo: allreduce of dtype %d (f32, bf16, f16 only)", dtype);
	Job *j = job_get(static_cast<Comm *>(ctx), K_ALLREDUCE);
	if (!j)
		return KILN_EINTERNAL;
	j->buf = buf;
	j->count = count;
	j->dtype = dtype;
	j->op = op;
	return enqueue(static_cast<Comm *>(ctx), j, stream, done);
}

kiln_status gloo_broadcast(void *ctx, void *buf, size_t count, int dtype, int root, void *stream,
			   void *done)
{
	Job *j = job_get(static_cast<Comm *>(ctx), K_BROADCAST);
	if (!j)
		return KILN_EINTERNAL;
	j->buf = buf;
	j->count = count;
	j->dtype = dtype;
	j->root = root;
	return enqueue(static_cast<Comm *>(ctx), j, stream, done);
}

kiln_status gloo_allgather(void *ctx, const void *send, void *recv, size_t count, int dtype,
			   void *stream, void *done)
{
	Job *j = job_get(static_cast<Comm *>(ctx), K_ALLGATHER);
	if (!j)
		return KILN_EINTERNAL;
	j->send = send;
	j->buf = recv;
	j->count = count;
	j->dtype = dtype;
	return enqueue(static_cast<Comm *>(ctx), j, stream, done);
}

kiln_status gloo_reduce_scatter(void *ctx, const void *send, void *recv, size_t count, int dtype,
				int op, void *stream, void *done)
{
	if (dtype != KILN_F32 && dtype != KILN_BF16 && dtype != KILN_F16)
		return H->error(KILN_ENOTSUP, "gloo: reduce_scatter of dtype %d (f32, bf16, f16 only)",
				dtype);
	Job *j = job_get(static_cast<Comm *>(ctx), K_REDUCE_SCATTER);
	if (!j)
		return KILN_EINTERNAL;
	j->send = send;
	j->buf = recv;
	j->count = count;
	j->dtype = dtype;
	j->op = op;
	return enqueue(static_cast<Comm *>(ctx), j, stream, done);
}

kiln_status gloo_barrier(void *ctx)
{
	Comm *c = static_cast<Comm *>(ctx);
	if (c->world == 1)
		return KILN_OK;
	try {
		/* old-style, like the bound collectives: a new-style barrier's
		 * message arriving before this rank posts its receive leaves
		 * Gloo's event loop spinning on EPOLLIN until it does */
		gloo::BarrierAllToAll(c->ctx).run();
	} catch (const std::exception &e) {
		return H->error(KILN_EIO, "gloo: rank %d of %d: barrier failed: %s", c->rank, c->world,
				e.what());
	}
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
};

const struct kiln_key gloo_keys[] = {
	{ "hostname", KILN_KEY_STR, "", 0, 0, nullptr,
	  "Address this rank's Gloo pairs listen on, as the other ranks reach it (multi-node: the node's name or address on the fast network); empty = 127.0.0.1 (one machine)." },
	{ "iface", KILN_KEY_STR, "", 0, 0, nullptr,
	  "Network interface whose address the pairs listen on (e.g. `eth0`); overrides `hostname`." },
	{ "busy_poll", KILN_KEY_BOOL, "0", 0, 0, nullptr,
	  "Put the TCP pairs in Gloo's synchronous busy-polling mode: the thread running a collective (the comm stream's worker) reads the sockets itself, spinning, instead of sleeping until Gloo's event-loop thread has read the data and woken it. Removes a thread wake-up per message, so an allreduce overlapped with a busy backward is much faster when a core is free for the spinning, and much slower when the machine is oversubscribed. 0: Gloo's default (event loop)." },
	{ nullptr, 0, nullptr, 0, 0, nullptr, nullptr }
};

const struct kiln_plugin gloo_plugin = {
	/* .abi_major = */ KILN_ABI_MAJOR,
	/* .abi_minor = */ KILN_ABI_MINOR,
	/* .kind = */ KILN_PLUGIN_COMM,
	/* .name = */ "gloo",
	/* .summary = */ "Gloo collectives over TCP (CPU tensors; any machine)",
	/* .ops = */ &gloo_ops,
	/* .keys = */ gloo_keys,
	/* .probe = */ nullptr,
};

const struct kiln_plugin *const gloo_plugins[] = { &gloo_plugin, nullptr };

} // namespace

extern "C" KILN_PLUGIN_EXPORT const struct kiln_plugin *const *
kiln_plugin_init(const struct kiln_host *host)
{
	if (host->version < 4) {
		host->error(KILN_EABI, "gloo: needs host table version 4 (kiln ABI 1.3), the core offers %u",
			    host->version);
		return nullptr;
	}
	H = host;
	return gloo_plugins;
}
