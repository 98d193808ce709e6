/* plugins/loaders/idx_cache.h - the inflated copy of a gzipped IDX file
 * (idx_cache.c), so a later run maps it instead of inflating again. */
#ifndef KILN_LOADERS_IDX_CACHE_H
#define KILN_LOADERS_IDX_CACHE_H

#include <kiln/plugin.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* A mapped cache file; raw points at the inflated IDX file inside it. */
struct idx_cache_map {
	void *base;
	size_t len;
	const uint8_t *raw;
	uint64_t raw_len;
};

/* Map the verified inflated copy of `path` (whose fstat is sb) kept under
 * dir: 1 and *m filled when it matches the source and its checksum; 0
 * otherwise (absent silently, stale with a note, corrupt or truncated with
 * a warning): the caller inflates and calls idx_cache_save. */
int idx_cache_open(const struct kiln_host *host, const char *dir, const char *path,
		   const struct stat *sb, struct idx_cache_map *m);
void idx_cache_close(struct idx_cache_map *m);

/* Keep hdr (hdr_len bytes) and data (data_len) as the inflated copy of
 * path under dir.  Best effort: a failure is a warning, never an error. */
void idx_cache_save(const struct kiln_host *host, const char *dir, const char *path,
		    const struct stat *sb, const void *hdr, size_t hdr_len, const void *data,
		    uint64_t data_len);

#endif
