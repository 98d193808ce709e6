/* plugins/gloo/gloo_jobs.cc - a collective's job, run on the comm
 * stream: Gloo's algorithms (bound, staged), kiln's shared-memory
 * collectives, the hierarchical allreduce, send, recv and sendrecv
 * (gloo.cc's top comment says how; gloo_comm.h). */
#include "gloo_comm.h"

namespace kiln_gloo {

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
	const size_t es = common_dtype_size(dt), all = n * es;
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

/* j's slot free again, told to the threads waiting for one (job_get) or
 * for all (gloo_close's jobs_drain).  Both under the lock: job_get's check
 * and wait cannot miss it, and the notify cannot follow a drain that saw
 * the slot free, returned, and let gloo_close free c (its condition
 * variable).  Nothing of c is touched after the unlock. */
static void job_release(Job *j)
{
	Comm *c = j->c;
	std::lock_guard<std::mutex> g(c->job_lock);
	j->busy.store(0, std::memory_order_release);
	c->job_freed.notify_all();
}

/* the last job run_job ran on this thread: enqueue's, where a device ran
 * it at once (sync mode) and gave its slot back */
static thread_local const Job *ran_here;

kiln_status run_job(void *arg)
{
	Job *j = static_cast<Job *>(arg);
	ran_here = j;
	kiln_status st = run_job_now(j);
	job_release(j);
	return st;
}

/* KILN_PROC_HOST_FN_SKIP's skip: the stream passed job arg without running
 * it (it had failed): its slot back, as run_job gives it */
static void job_skipped(void *arg)
{
	job_release(static_cast<Job *>(arg));
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
				    j->count * common_dtype_size(j->dtype), j->dtype, 1.0f);
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
		std::memset(j->buf, 0, j->count * common_dtype_size(j->dtype));
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
	const size_t bytes = j->count * common_dtype_size(j->dtype);
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
	const size_t es = common_dtype_size(j->dtype);
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
	const size_t es = common_dtype_size(j->dtype);
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
	size_t es = common_dtype_size(j->dtype);
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

/* A free slot of c->jobs after next_job, or NULL */
Job *job_free(Comm *c)
{
	for (int k = 0; k < kJobs; k++) {
		Job *j = &c->jobs[(c->next_job + k) % kJobs];
		if (!j->busy.load(std::memory_order_acquire)) {
			c->next_job = (c->next_job + k + 1) % kJobs;
			return j;
		}
	}
	return nullptr;
}

/* A host function that does nothing: job_get's look at a stream's health */
static kiln_status probe_noop(void *)
{
	return KILN_OK;
}

/* A slot for a collective of kind: a captured one's own, else one of
 * c->jobs.  With every slot busy the streams are behind this thread (the
 * host runs steps ahead of the device: ZeRO-1 enqueues 3-4 collectives
 * a bucket a step, 13 buckets of 5 steps passed 256): it waits for the
 * oldest to end, as a full queue would, up to [dist] timeout (a job ends
 * by then, its collective done or failed, unless the stream stopped).
 * A failed stream skips its queued jobs: where the device has
 * KILN_PROC_HOST_FN_SKIP (the CPU device) it gives their slots back as it
 * passes them (job_skipped), else they stay busy.  Every kProbe the wait
 * queues a no-op on the stream: a failed stream refuses it with its
 * sticky error, which ends the wait at once. */
Job *job_get(Comm *c, Kind kind, void *stream, kiln_status *st)
{
	if (H->version >= 6 && H->device_capturing(c->dev)) {
		try {
			c->kept.push_back(std::make_unique<Job>());
		} catch (const std::bad_alloc &) {
			*st = H->error(KILN_ENOMEM, "gloo: rank %d of %d: out of memory for a captured %s",
				       c->rank, c->world, kind_name(kind));
			return nullptr;
		}
		return job_fill(c->kept.back().get(), c, kind);
	}
	Job *j = job_free(c);
	const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(c->timeout_ms);
	while (!j) {
		{
			std::unique_lock<std::mutex> g(c->job_lock);
			const auto slice = std::min(end, std::chrono::steady_clock::now() + kProbe);
			c->job_freed.wait_until(g, slice, [c, &j] { return (j = job_free(c)) != nullptr; });
		}
		if (j || std::chrono::steady_clock::now() >= end)
			break;
		const kiln_status ps = H->device_host_fn(c->dev, stream, probe_noop, nullptr);
		if (ps) {
			*st = ps;
			return nullptr;
		}
	}
	if (j)
		return job_fill(j, c, kind);
	*st = H->error(KILN_ETIMEOUT, "gloo: rank %d of %d: %d collectives are in flight, the most a communicator holds, and none ended in %d ms ([dist] timeout): %s not enqueued",
		 c->rank, c->world, kJobs, c->timeout_ms, kind_name(kind));
	return nullptr;
}

kiln_status enqueue(Comm *c, Job *j, void *stream, void *done)
{
	ran_here = nullptr;
	kiln_status st = c->host_fn_skip ? c->host_fn_skip(nullptr, stream, run_job, job_skipped, j)
					 : H->device_host_fn(c->dev, stream, run_job, j);
	if (st) {
		/* a device that ran it at once (sync mode) gave the slot back;
		 * one that refused it (a failed stream: its sticky error) did
		 * not: given back here, under the lock and told to a waiter,
		 * as run_job does */
		if (ran_here != j)
			job_release(j);
		return st;
	}
	return done ? H->device_event_record(c->dev, done, stream) : KILN_OK;
}

} // namespace kiln_gloo
