/* tests/plugins/tcommfail.c - kiln-tcommfail.so: a comm plugin "tcommfail"
 * whose open fails at once, KILN_EIO, as a mesh's connect fails for a
 * peer late or gone, the store untouched (Gloo's own failures of that
 * kind mostly come from a store wait that timed out, which leaves the
 * rank's store connection broken and hides what kiln_dist_close would
 * tell the peers).  For tests/check_dist_close (test_open_fail_no_mark).
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include "test_plugin.h"

static const struct kiln_host *H;

static kiln_status tcommfail_open(const struct kiln_host *host, const struct kiln_config *cfg,
				  struct kiln_store *store, struct kiln_device *dev, int rank,
				  int world, int timeout_ms, void **ctx)
{
	*ctx = NULL;
	return host->error(KILN_EIO, "tcommfail: rank %d of %d: connecting: a peer is late (test)",
			   rank, world);
}

static void tcommfail_close(void *ctx) { (void)ctx; }

static kiln_status tcommfail_allreduce(void *ctx, void *buf, size_t count, int dtype, int op,
				       void *stream, void *done)
{
	return H->error(KILN_EINTERNAL, "tcommfail: never opened");
}

static kiln_status tcommfail_broadcast(void *ctx, void *buf, size_t count, int dtype, int root,
				       void *stream, void *done)
{
	return H->error(KILN_EINTERNAL, "tcommfail: never opened");
}

static const struct kiln_comm_ops tcommfail_ops = {
	.version = 1,
	.open = tcommfail_open,
	.close = tcommfail_close,
	.allreduce = tcommfail_allreduce,
	.broadcast = tcommfail_broadcast,
	.allgather = NULL,
	.reduce_scatter = NULL,
	.barrier = NULL,
};

TEST_PLUGIN(tcommfail_comm, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_COMM, "tcommfail",
	    "test communicator whose open fails", &tcommfail_ops, NULL, NULL);

static const struct kiln_plugin *const tcommfail_plugins[] = { &tcommfail_comm, NULL };

static const struct kiln_plugin *const *tcommfail_init(const struct kiln_host *host)
{
	H = host;
	return tcommfail_plugins;
}

TEST_PLUGIN_INIT(tcommfail_init(host))
