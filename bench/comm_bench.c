/* bench/comm_bench.c - allreduce latency and bus bandwidth of a kiln
 * communicator, one rank per process (start it with `kiln launch -n N` for
 * gloo, `mpirun -np N` for mpi):
 *
 *   comm_bench COMM [MAX_BYTES]
 *
 * Rank 0 prints, per size from 4 KiB to MAX_BYTES (default 256 MiB), the
 * median time of an in-place f32 sum allreduce through the plugin's ops on
 * a synchronous CPU-device stream and busbw = algbw x 2(n-1)/n, the
 * nccl-tests convention.  Same sizes and iteration counts as mpi_raw.c and
 * torch_comm.py, so bench/comm.sh prints them side by side. */
#include <kiln/kiln.h>
#include <kiln/plugin.h>
#include <kiln/dist.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static int die(const char *what)
{
	fprintf(stderr, "comm_bench: %s: %s\n", what, kiln_last_error());
	return 1;
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "gloo";
	size_t max = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)256 << 20;
	struct kiln_dist_env env;
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_store *store;
	const struct kiln_plugin *p;
	void *ctx, *stream;
	if (kiln_dist_env_read(&env))
		return die("environment");
	if (kiln_registry_open(NULL, &reg) || kiln_config_load_string("[run]\nthreads = 1\n", "comm_bench", &cfg) ||
	    kiln_device_open(reg, cfg, "cpu", 0, &dev) || kiln_device_stream_create(dev, &stream))
		return die("setup");
	if (kiln_registry_find(reg, KILN_PLUGIN_COMM, name, &p))
		return die(name);
	const struct kiln_comm_ops *ops = p->ops;
	if (kiln_store_open(env.master_addr, env.master_port, env.rank == 0, env.rank, env.world,
			    60000, &store) ||
	    kiln_store_rendezvous(store, env.rank, env.world, 60000) ||
	    ops->open(kiln_host_table(), cfg, store, dev, env.rank, env.world, 60000, &ctx))
		return die("open");
	float *buf;
	if (kiln_device_alloc(dev, max, (void **)&buf))
		return die("alloc");
	memset(buf, 0, max);
	if (env.rank == 0)
		printf("# kiln-%s, %d ranks\n# %10s %12s %12s\n", name, env.world, "bytes", "time_us",
		       "busbw_GBps");
	for (size_t bytes = 4096; bytes <= max; bytes *= 4) {
		int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 20 : 5;
		double t[200];
		for (int w = 0; w < 3; w++)
			ops->allreduce(ctx, buf, bytes / 4, KILN_F32, KILN_REDUCE_SUM, stream, NULL);
		for (int i = 0; i < iters; i++) {
			ops->barrier(ctx);
			double t0 = now();
			if (ops->allreduce(ctx, buf, bytes / 4, KILN_F32, KILN_REDUCE_SUM, stream, NULL) ||
			    kiln_device_stream_sync(dev, stream))
				return die("allreduce");
			t[i] = now() - t0;
		}
		qsort(t, (size_t)iters, sizeof *t, cmp);
		double med = t[iters / 2];
		double busbw = (double)bytes / med * 2.0 * (env.world - 1) / env.world / 1e9;
		if (env.rank == 0)
			printf("  %10zu %12.1f %12.3f\n", bytes, med * 1e6, busbw);
		fflush(stdout);
	}
	kiln_device_free(dev, buf);
	ops->close(ctx);
	kiln_store_close(store);
	return 0;
}
