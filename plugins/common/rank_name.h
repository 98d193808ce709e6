/* plugins/common/rank_name.h - a communicator's ranks named for messages,
 * the one formatting of every communicator plugin (kiln-mpi, kiln-gloo's
 * shmcoll and shmp2p, kiln-nccl): on a split's communicator the world
 * ranks, as the split's own ranks mean nothing to the user.  Inline: each
 * plugin compiles its own copy (only kiln_plugin_init is exported). */
#ifndef KILN_PLUGINS_COMMON_RANK_NAME_H
#define KILN_PLUGINS_COMMON_RANK_NAME_H

#include <stdio.h>

/* "WHO: rank R of W", or for a split (world_of not NULL: rank r is world
 * rank world_of[r], borrowed) "WHO: world rank X (rank R of W of a
 * split)"; who NULL: without "WHO: ".  Returns buf. */
static inline const char *shm_name_me(char *buf, size_t n, const char *who, const int *world_of,
				      int rank, int world)
{
	const char *sep = who ? ": " : "";
	if (!who)
		who = "";
	if (world_of)
		snprintf(buf, n, "%s%sworld rank %d (rank %d of %d of a split)", who, sep, world_of[rank],
			 rank, world);
	else
		snprintf(buf, n, "%s%srank %d of %d", who, sep, rank, world);
	return buf;
}

/* A peer: "rank P", or for a split "world rank X" (r >= 0; the caller
 * passes world_of NULL for an r outside the split).  Returns buf. */
static inline const char *shm_name_peer(char *buf, size_t n, const int *world_of, int r)
{
	if (world_of && r >= 0)
		snprintf(buf, n, "world rank %d", world_of[r]);
	else
		snprintf(buf, n, "rank %d", r);
	return buf;
}

#endif
