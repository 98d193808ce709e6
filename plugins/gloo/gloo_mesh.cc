/* plugins/gloo/gloo_mesh.cc - opening a communicator: the process's TCP
 * device, the mesh's connect through kiln's store (kiln's deadline on all
 * of it, retried after a stray connection), kiln's shared memory on one
 * node, the hierarchical leaders on several (gloo_comm.h). */
#include "gloo_comm.h"
#include "../common/c_locale.h" /* common_snprintf_c */

namespace kiln_gloo {

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

/* Best-effort reads of the store, for what this rank does without (a
 * host name for a message, an address it has a default for): host table
 * version 8's store_check, whose answer this process had no memory for
 * is not the rank's own failure (session 40: through store_add and
 * store_get it was, and a peer's failure later read as this rank's out
 * of memory); an older core's add of 0 and get otherwise. */

/* The counter key's value (0 when unset or unread). */
static int64_t counter_read(struct kiln_store *store, const char *key)
{
	int64_t n = 0;
	void *v = nullptr;
	if (H->version < 8)
		return H->store_add(store, key, 0, &n) ? 0 : n;
	if (!H->store_check(store, key, &v, nullptr) && v)
		n = std::strtoll(static_cast<const char *>(v), nullptr, 10);
	H->free(v);
	return n;
}

/* key's value (NUL-terminated, released with H->free) or NULL, read only
 * where the counter posted, set after it, says it is there: a get of a
 * key never posted waits out its timeout and breaks the connection. */
static void *posted_read(struct kiln_store *store, const char *key, const char *posted)
{
	void *v = nullptr;
	if (counter_read(store, posted) <= 0)
		return nullptr;
	if (H->version < 8)
		H->store_get(store, key, 1000, &v, nullptr);
	else
		H->store_check(store, key, &v, nullptr);
	return v;
}

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
		char key[48], posted[48];
		std::snprintf(posted, sizeof posted, "kiln/addr_set/%d", r);
		std::snprintf(key, sizeof key, "kiln/host/%d", r);
		void *v = posted_read(store, key, posted);
		out.push_back("");
		if (v && *static_cast<const char *>(v))
			out.back() = " (host " + std::string(static_cast<const char *>(v)) + ")";
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
		if (kiln_status st = H->store_get(store, key, ms, &v, &n)) {
			/* (this rank out of memory for the answer: its own
			 * failure, not the peer's silence, session 39) */
			if (due && st != KILN_ENOMEM)
				return H->error(KILN_ETIMEOUT, "gloo: rank %d of %d: %s: rank %d%s did not say whether it connected within [dist] timeout = %.1f s and %.1f s: %s",
						rank, world, what, r, host_of(hosts, r).c_str(),
						timeout_ms / 1000.0, kOutcomeSlackMs / 1000.0, H->last_error());
			return H->error(st == KILN_ENOMEM ? st : KILN_EIO, "gloo: rank %d of %d: %s: waiting for rank %d's outcome: %s",
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
	/* (the hosts' names read first, outside the connect's deadline:
	 * 2 x world store requests a rank, world^2 on the store in all,
	 * which a many-rank job's deadline should not pay for; review of
	 * session 34) */
	const std::vector<std::string> hosts = mesh_hosts(store, world, world_ranks && dl);
	const int64_t due = dl ? run_ms() + timeout_ms : 0;
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
		} catch (const StoreOom &e) {
			return H->error(KILN_ENOMEM, "gloo: rank %d of %d: %s: %s", rank, world, what,
					e.what());
		} catch (const std::exception &e) {
			ok = 0;
			why = e.what();
		}
		if (!ok && due && (run_ms() >= due || dl->expired())) {
			if (late >= 0 && dl->expired())
				why = dl->why(late, host_of(hosts, late));
			else if (late >= 0) {
				char m[160];
				common_snprintf_c(m, sizeof m, " did not post its pairs' addresses within [dist] timeout = %.1f s: ",
					      timeout_ms / 1000.0);
				why = "rank " + std::to_string(late) + host_of(hosts, late) + m + why;
			}
			return H->error(KILN_ETIMEOUT, "gloo: rank %d of %d: %s: %s", rank, world, what,
					why.c_str());
		}
		std::snprintf(key, sizeof key, "%sok%d", p, rank);
		if (kiln_status st = H->store_set(store, key, ok ? "1" : "0", 1))
			return H->error(st == KILN_ENOMEM ? st : KILN_EIO, "gloo: rank %d of %d: %s: %s", rank,
					world, what, H->last_error());
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
	c->host_fn_skip = reinterpret_cast<decltype(c->host_fn_skip)>(
		host->device_proc(dev, KILN_PROC_HOST_FN_SKIP));
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
	char key[48], posted[48];
	const char *iface = host->config_get(cfg, "plugin.gloo", "iface");
	const char *name = host->config_get(cfg, "plugin.gloo", "hostname");
	if ((iface && *iface) || (name && *name))
		return addr; /* (not used: the setting says where) */
	if (counter_read(store, "kiln/joined") <= 0)
		return addr; /* no rendezvous on this store (a test's) */
	/* (set before the counter: the get answers at once) */
	std::snprintf(posted, sizeof posted, "kiln/addr_set/%d", rank);
	std::snprintf(key, sizeof key, "kiln/addr/%d", rank);
	void *v = posted_read(store, key, posted);
	const bool got = v && *static_cast<const char *>(v);
	if (got)
		addr = static_cast<const char *>(v);
	host->free(v);
	if (got)
		return addr;
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

} // namespace kiln_gloo
