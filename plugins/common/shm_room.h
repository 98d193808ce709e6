/* plugins/common/shm_room.h - whether /dev/shm has room for shared
 * objects: the communicators ask before they map (kiln-gloo, kiln-mpi),
 * and `kiln memory` asks for the shared gradients it predicts
 * (core/memory.c).  Inline: the core and each plugin hold their own. */
#ifndef KILN_COMMON_SHM_ROOM_H
#define KILN_COMMON_SHM_ROOM_H

#include <stddef.h>
#include <sys/statvfs.h>

/* Whether /dev/shm has room for `total` more bytes (64 MiB to spare):
 * the shared objects live there, and a tmpfs that runs out raises SIGBUS
 * at the first touch, so the plugins ask (and agree) before they map.
 * *have and *need in bytes for the message; a /dev/shm that cannot be
 * asked counts as room. */
static inline int shm_room(size_t total, unsigned long long *have, unsigned long long *need)
{
	struct statvfs fs;
	*need = (unsigned long long)total + (64ull << 20);
	*have = statvfs("/dev/shm", &fs) == 0 ? (unsigned long long)fs.f_bavail * fs.f_frsize : *need;
	return *have >= *need;
}

/* The bytes of a rank's shared segment of `bytes`: whole pages (4096),
 * every rank's alike. */
static inline size_t shm_segment_bytes(size_t bytes)
{
	return (bytes + 4095) / 4096 * 4096;
}

#endif
