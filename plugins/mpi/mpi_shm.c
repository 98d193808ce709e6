/* plugins/mpi/mpi_shm.c - the MPI_Win_allocate_shared windows of kiln's
 * shared-memory collectives (plugins/common/shmcoll.h) and of the shared
 * gradients (comm ops alloc_shared, map_shared). */
#include "mpi_comm.h"

#include <stdio.h>
#include <string.h>

/* Whether `yes` holds on every rank (collective: every rank calls it at
 * the same point); a failed MPI_Allreduce counts as no. */
static int every_rank(const struct mpi_comm *c, int yes)
{
	int all = 0;
	return MPI_Allreduce(&yes, &all, 1, MPI_INT, MPI_MIN, c->comm) == MPI_SUCCESS && all;
}

/* Map kiln's shared-memory collectives' segments (plugins/common/shmcoll.h)
 * in an MPI_Win_allocate_shared window when every rank shares this node;
 * else leave them off, *why saying why.  Collective: every rank calls it
 * at open. */
void mpi_shm_setup(struct mpi_comm *c, char *why, size_t n)
{
	MPI_Comm node;
	int nsize = 0;
	if (MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
	    MPI_SUCCESS) {
		snprintf(why, n, "MPI_Comm_split_type failed");
		return;
	}
	MPI_Comm_size(node, &nsize);
	if (!every_rank(c, nsize == c->world && c->world <= SHMCOLL_MAXW)) {
		MPI_Comm_free(&node);
		snprintf(why, n, c->world > SHMCOLL_MAXW ? "more than 64 ranks" : "the ranks span several nodes");
		return;
	}
	/* Open MPI backs the window with a file in /dev/shm; on a full one
	 * MPI_Win_allocate_shared fails on some ranks while the others wait
	 * inside it for them (a deadlock, found in session 31): ask for room
	 * first and agree, so that no rank calls it unless every rank may */
	unsigned long long have, need;
	const int room = shm_room((SHMCOLL_SEGMENT + 64) * (size_t)c->world, &have, &need);
	if (!every_rank(c, room)) {
		MPI_Comm_free(&node);
		if (room)
			snprintf(why, n, "another rank's /dev/shm lacks the %llu MiB wanted for the collectives' segments",
				 need >> 20);
		else
			snprintf(why, n, "/dev/shm has %llu MiB free, %llu MiB wanted for the collectives' segments",
				 have >> 20, need >> 20);
		return;
	}
	void *mem = NULL;
	/* disp_unit is no alignment: Open MPI packs the segments 8-byte
	 * aligned, so each is 64 bytes longer and its start rounded up to the
	 * 64 shmcoll_hdr needs (found by UBSan in session 30: the ranks'
	 * flags shared cache lines) */
	const int ok = MPI_Win_allocate_shared((MPI_Aint)SHMCOLL_SEGMENT + 64, 64, MPI_INFO_NULL,
					       node, &mem, &c->shm_win) == MPI_SUCCESS;
	MPI_Comm_free(&node);
	if (!every_rank(c, ok)) {
		if (ok)
			MPI_Win_free(&c->shm_win);
		snprintf(why, n, "MPI_Win_allocate_shared failed on a rank");
		return;
	}
	/* one node, split with key 0: the node's ranks are c->comm's */
	void *seg[SHMCOLL_MAXW];
	for (int r = 0; r < c->world; r++) {
		MPI_Aint sz = 0;
		int unit = 0;
		MPI_Win_shared_query(c->shm_win, r, &sz, &unit, &seg[r]);
		seg[r] = (void *)(((uintptr_t)seg[r] + 63) & ~(uintptr_t)63);
	}
	kiln_status st = shmcoll_init(&c->shm, H, "mpi", c->rank, c->world, seg, c->timeout_ms,
				      c->spin_ns, c->nap.tv_sec * 1000000000ll + c->nap.tv_nsec);
	MPI_Barrier(c->comm);
	c->shm_on = st == KILN_OK;
}

void mpi_shm_teardown(struct mpi_comm *c)
{
	if (c->region_on)
		MPI_Win_free(&c->region_win);
	if (c->shm_on)
		MPI_Win_free(&c->shm_win);
	c->shm_on = c->region_on = 0;
}

static kiln_status shared_window(struct mpi_comm *c, size_t bytes, int keyed, const char *what,
				 void **base);

/* comm ops version 3: the memory of one MPI_Win_allocate_shared window
 * (each rank's segment page-aligned: alloc_shared_noncontig), declared to
 * the shared-memory collectives as their region (shmcoll_region) */
kiln_status mpi_alloc_shared(void *ctx, size_t bytes, void **ptr)
{
	struct mpi_comm *c = ctx;
	*ptr = NULL;
	if (!c->shm_on)
		return H->error(KILN_ENOTSUP, "mpi: no shared memory (%s)", c->shm_why);
	if (c->region_on)
		return H->error(KILN_ENOTSUP, "mpi: the shared buffer was given already");
	/* watched: a rank that failed before this call never joins it (it
	 * waits in close's collectives instead), and the watchdog ends this
	 * one after [dist] timeout rather than let both wait forever */
	void *base[SHMCOLL_MAXW];
	const int ws = mpi_watch_call(c, K_BARRIER, 0, -1, -1);
	kiln_status st = shared_window(c, bytes, 1, "the shared gradients", base);
	mpi_unwatch(c, ws);
	if (st)
		return st;
	shmcoll_region(&c->shm, base, (bytes + 4095) / 4096 * 4096);
	*ptr = base[c->rank];
	return KILN_OK;
}

/* comm ops version 8: the same window, every rank's segment given, not
 * declared to the collectives */
kiln_status mpi_map_shared(void *ctx, size_t bytes, void **base)
{
	struct mpi_comm *c = ctx;
	for (int r = 0; r < c->world; r++)
		base[r] = NULL;
	if (!c->shm_on)
		return H->error(KILN_ENOTSUP, "mpi: no shared memory (%s)", c->shm_why);
	if (c->region_on)
		return H->error(KILN_ENOTSUP, "mpi: the shared buffer was given already");
	const int ws = mpi_watch_call(c, K_BARRIER, 0, -1, -1);
	kiln_status st = shared_window(c, bytes, 0, "the mapped buffers", base);
	mpi_unwatch(c, ws);
	return st;
}

/* One MPI_Win_allocate_shared window of bytes a rank, zeroed, every
 * rank's segment into base[]; keyed: [plugin.mpi] zero_copy may refuse it */
static kiln_status shared_window(struct mpi_comm *c, size_t bytes, int keyed, const char *what,
				 void **base)
{
	/* every rank's zero_copy, agreed: ranks configured apart do not
	 * wait for each other in different calls */
	if (keyed && !every_rank(c, c->zero_copy))
		return H->error(KILN_ENOTSUP, "mpi: [plugin.mpi] zero_copy = 0%s",
				c->zero_copy ? " on another rank" : "");
	const size_t size = shm_segment_bytes(bytes);
	/* Open MPI backs the window with a file in /dev/shm: a tmpfs without
	 * room for every rank's segment would end the process with SIGBUS at
	 * the first touch, so ask for room first (and agree on the answer) */
	unsigned long long have, need;
	const int room = shm_room(size * (size_t)c->world, &have, &need);
	if (!every_rank(c, room))
		return room ? H->error(KILN_ENOTSUP, "mpi: another rank's /dev/shm lacks the %llu MiB wanted for %s",
				       need >> 20, what)
			    : H->error(KILN_ENOTSUP, "mpi: /dev/shm has %llu MiB free, %llu MiB wanted for %s",
				       have >> 20, need >> 20, what);
	MPI_Info info;
	void *mem = NULL;
	MPI_Info_create(&info);
	MPI_Info_set(info, "alloc_shared_noncontig", "true");
	const int ok = MPI_Win_allocate_shared((MPI_Aint)size, 64, info, c->comm, &mem,
					       &c->region_win) == MPI_SUCCESS;
	MPI_Info_free(&info);
	if (!every_rank(c, ok)) {
		if (ok)
			MPI_Win_free(&c->region_win);
		return H->error(KILN_ENOTSUP, "mpi: MPI_Win_allocate_shared of %zu bytes failed on a rank",
				size);
	}
	for (int r = 0; r < c->world; r++) {
		MPI_Aint sz = 0;
		int unit = 0;
		MPI_Win_shared_query(c->region_win, r, &sz, &unit, &base[r]);
	}
	memset(mem, 0, size);
	MPI_Barrier(c->comm);
	c->region_on = 1;
	return KILN_OK;
}
