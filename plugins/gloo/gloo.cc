/* plugins/gloo/gloo.cc - the Gloo communicator (kiln-gloo.so).
 *
 * Gloo (libgloo-dev, Facebook's collective library, PyTorch's CPU backend)
 * with its TCP transport.  The plugin's interface is C (struct
 * kiln_comm_ops); this file and its neighbours are the C++ shim behind
 * it: exceptions never cross it, every Gloo failure becomes a status and
 * a message.  This file holds the ops table (kiln_plugin_init);
 * gloo_mesh.cc opens a communicator, gloo_jobs.cc runs its collectives,
 * gloo_comm.h is what they share.
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
 * of kJobs slots (a slot is free again when its host function has run,
 * or a failed stream skipped it: KILN_PROC_HOST_FN_SKIP;
 * with kJobs collectives in flight the next enqueue waits for one to end,
 * up to [dist] timeout, then fails naming the rank: never an allocation).  An allreduce (f32, f16, bf16) runs an
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
#include "gloo_comm.h"

namespace kiln_gloo {

const struct kiln_host *H;

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

/* Every slot of c's pool free (within [dist] timeout): a caller that
 * closes before the streams its collectives are queued on have drained
 * (their syncs are its to call) would have their jobs run, or skipped by a
 * failed stream (job_skipped), on a freed communicator.  Nothing waits
 * where they have: the core syncs each such stream first.  Only with
 * KILN_PROC_HOST_FN_SKIP: a device without it keeps a skipped job's slot
 * busy for ever, and the drain would wait the whole timeout after any
 * stream failure. */
static void jobs_drain(Comm *c)
{
	if (!c->host_fn_skip)
		return;
	std::unique_lock<std::mutex> g(c->job_lock);
	const bool idle = c->job_freed.wait_for(g, std::chrono::milliseconds(c->timeout_ms), [c] {
		for (const Job &j : c->jobs)
			if (j.busy.load(std::memory_order_acquire))
				return false;
		return true;
	});
	if (!idle)
		H->log(KILN_LOG_WARN, "gloo", "rank %d of %d: closed with collectives still queued on a stream after %d ms ([dist] timeout)",
		       c->rank, c->world, c->timeout_ms);
}

void gloo_close(void *ctx)
{
	Comm *c = static_cast<Comm *>(ctx);
	if (c) {
		jobs_drain(c);
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
	kiln_status st;
	Job *j = job_get(c, kind, stream, &st);
	if (!j)
		return st;
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
	kiln_status st;
	Job *j = job_get(c, K_SENDRECV, stream, &st);
	if (!j)
		return st;
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
			gloo_shm_try_send(c->shm, peer, buf, count * common_dtype_size(dtype));
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

} // namespace kiln_gloo

using kiln_gloo::H;
using kiln_gloo::gloo_keys;
using kiln_gloo::gloo_ops;

COMM_PLUGIN(gloo, "gloo", "Gloo collectives over TCP (CPU tensors; any machine)", gloo_ops,
	    gloo_keys, nullptr)
