/* bench/mpi_raw.c - the raw-MPI baseline of `kiln bench comm`: MPI_Allreduce
 * (in place, f32 sum) called directly, same sizes, iteration counts and
 * median as `kiln bench comm --rank`.  mpirun -np N bench/mpi_raw [MAX_BYTES]
 * [THREAD_LEVEL [nb[:SLEEP_US]]]: single (MPI_Init, the default), funneled,
 * serialized (what kiln-mpi asks for) or multiple (MPI_Init_thread with that
 * level): Open MPI 4.1's small-message latency depends on it.  `nb` times
 * MPI_Iallreduce (Open MPI's libnbc) completed by an MPI_Test loop, with a
 * SLEEP_US nanosleep between tests when given: kiln-mpi's `wait = sleep`
 * path, without kiln. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int rank, world, provided = MPI_THREAD_SINGLE;
	const char *tl = argc > 2 ? argv[2] : "single";
	const int level = !strcmp(tl, "funneled") ? MPI_THREAD_FUNNELED
			  : !strcmp(tl, "serialized") ? MPI_THREAD_SERIALIZED
			  : !strcmp(tl, "multiple") ? MPI_THREAD_MULTIPLE : -1;
	if (level < 0 && strcmp(tl, "single")) {
		fprintf(stderr, "mpi_raw: thread level '%s': single, funneled, serialized or multiple\n", tl);
		return 2;
	}
	if (level < 0)
		MPI_Init(&argc, &argv);
	else
		MPI_Init_thread(&argc, &argv, level, &provided);
	const char *nb = argc > 3 ? argv[3] : NULL;
	if (nb && strncmp(nb, "nb", 2)) {
		fprintf(stderr, "mpi_raw: '%s': nb or nb:SLEEP_US\n", nb);
		return 2;
	}
	const long nap_us = nb && nb[2] == ':' ? atol(nb + 3) : 0;
	const struct timespec nap = { nap_us / 1000000, nap_us % 1000000 * 1000 };
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	size_t max = argc > 1 ? (size_t)atoll(argv[1]) : (size_t)256 << 20;
	float *buf = calloc(max / 4, 4);
	if (!rank)
		printf("# raw MPI, %d ranks, thread level %s (provided %d), %s\n# %10s %12s %12s\n", world, tl, provided,
		       nb ? nb : "MPI_Allreduce", "bytes", "time_us", "busbw_GBps");
	for (size_t bytes = 4096; bytes <= max; bytes *= 4) {
		int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 20 : 5;
		double t[200];
		for (int w = 0; w < 3; w++)
			MPI_Allreduce(MPI_IN_PLACE, buf, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		for (int i = 0; i < iters; i++) {
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			if (nb) {
				MPI_Request req;
				int done = 0;
				MPI_Iallreduce(MPI_IN_PLACE, buf, (int)(bytes / 4), MPI_FLOAT, MPI_SUM,
					       MPI_COMM_WORLD, &req);
				while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
					if (nap_us)
						nanosleep(&nap, NULL);
			} else {
				MPI_Allreduce(MPI_IN_PLACE, buf, (int)(bytes / 4), MPI_FLOAT, MPI_SUM,
					      MPI_COMM_WORLD);
			}
			t[i] = MPI_Wtime() - t0;
		}
		qsort(t, (size_t)iters, sizeof *t, cmp);
		double med = t[iters / 2];
		if (!rank)
			printf("  %10zu %12.1f %12.3f\n", bytes, med * 1e6,
			       (double)bytes / med * 2.0 * (world - 1) / world / 1e9);
		fflush(stdout);
	}
	free(buf);
	MPI_Finalize();
	return 0;
}
