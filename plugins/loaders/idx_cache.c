/* plugins/loaders/idx_cache.c - the inflated copy of a gzipped IDX file,
 * kept so that later runs map it instead of inflating it again.
 *
 * One cache file per source path, <dir>/<FNV-1a 64 of the real path>.idx:
 *
 *   struct idx_cache_head (64 bytes, this machine's byte order)
 *   char path[path_len]   the source's real path
 *   u8   raw[raw]         the inflated IDX file: its header, then its data
 *
 * It is used only when it describes the source as it is now (the same real
 * path, size, mtime and inode), its length is exactly what the head says,
 * and the CRC32C of raw matches; anything else is rebuilt from the gzip
 * file (a corrupt or truncated copy with a warning).  It is written to a
 * temporary name and renamed, so concurrent runs (ranks) each see a whole
 * file; a reader's mapping keeps the file it opened.  Only a foreign
 * writer truncating the copy in place while a run maps it can hurt that
 * run (SIGBUS at its next touch of the lost pages).  The mapping stays
 * (session 38 read the copy into memory instead, and measured it): it
 * shares the page cache among every process, where a copy read in is
 * private (47 MB for Fashion-MNIST, once per rank) and costs the copy.
 */
#include "loaders.h"
#include "idx_cache.h"
#include "../common/cache_file.h" /* common_write_atomic */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>   /* PATH_MAX */
#include <stdio.h>
#include <stdlib.h>   /* realpath */
#include <string.h>
#include <sys/mman.h> /* mmap */
#include <sys/stat.h>
#include <unistd.h>

#define IDX_CACHE_MAGIC "KILNIDX1"

struct idx_cache_head {
	char magic[8];
	uint64_t size;      /* the gzip file's st_size */
	int64_t mtime_s;    /* its st_mtim */
	int64_t mtime_ns;
	uint64_t ino;       /* its st_ino */
	uint64_t raw;       /* inflated bytes that follow the path */
	uint32_t crc;       /* CRC32C of those bytes */
	uint32_t path_len;
	uint64_t reserved;  /* 0 */
};

/* The cache file of `path` under dir into out, and path's real path into
 * real.  -1 when either cannot be formed. */
static int idx_cache_name(const char *dir, const char *path, char *real, char *out, size_t n)
{
	if (!realpath(path, real))
		return -1;
	uint64_t h = 0xcbf29ce484222325u;
	for (const unsigned char *p = (const unsigned char *)real; *p; p++)
		h = (h ^ *p) * 0x100000001b3u;
	int len = snprintf(out, n, "%s/%016" PRIx64 ".idx", dir, h);
	return len < 0 || (size_t)len >= n ? -1 : 0;
}

static void idx_cache_describe(struct idx_cache_head *h, const struct stat *sb)
{
	memset(h, 0, sizeof *h);
	memcpy(h->magic, IDX_CACHE_MAGIC, 8);
	h->size = (uint64_t)sb->st_size;
	h->mtime_s = (int64_t)sb->st_mtim.tv_sec;
	h->mtime_ns = (int64_t)sb->st_mtim.tv_nsec;
	h->ino = (uint64_t)sb->st_ino;
}

/* Why the mapped cache file m (len bytes) cannot serve the source whose
 * description is `want` and real path `real`: NULL when it can; "stale"
 * when it describes another version of the source (rebuilt quietly). */
static const char *idx_cache_reject(const struct kiln_host *host, const uint8_t *m, size_t len,
				    const struct idx_cache_head *want, const char *real)
{
	struct idx_cache_head h;
	if (len < sizeof h)
		return "shorter than its header (truncated)";
	memcpy(&h, m, sizeof h);
	if (memcmp(h.magic, IDX_CACHE_MAGIC, 8))
		return "not a kiln IDX cache file (bad magic)";
	if (h.path_len > len - sizeof h)
		return "truncated: shorter than the path its header says it holds";
	if (h.path_len != strlen(real) || memcmp(m + sizeof h, real, h.path_len))
		return "stale";
	if (h.size != want->size || h.mtime_s != want->mtime_s ||
	    h.mtime_ns != want->mtime_ns || h.ino != want->ino)
		return "stale";
	if (h.raw > len || len - sizeof h - h.path_len != h.raw)
		return "truncated or padded: its length is not what its header says";
	if (host->crc32c(0, m + sizeof h + h.path_len, (size_t)h.raw) != h.crc)
		return "corrupt: CRC32C mismatch";
	return NULL;
}

int idx_cache_open(const struct kiln_host *host, const char *dir, const char *path,
		   const struct stat *sb, struct idx_cache_map *out)
{
	char real[PATH_MAX], name[PATH_MAX + 64];
	memset(out, 0, sizeof *out);
	if (idx_cache_name(dir, path, real, name, sizeof name))
		return 0;
	int fd = open(name, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	struct stat cs;
	if (fd < 0 || fstat(fd, &cs) || !S_ISREG(cs.st_mode) || cs.st_size <= 0) {
		if (fd >= 0) {
			host->log(KILN_LOG_WARN, "idx", "%s: the cached copy of %s is empty or not a file; rebuilding it",
				  name, path);
			close(fd);
		}
		return 0;
	}
	size_t len = (size_t)cs.st_size;
	void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return 0;
	struct idx_cache_head want;
	idx_cache_describe(&want, sb);
	const char *why = idx_cache_reject(host, m, len, &want, real);
	if (why) {
		munmap(m, len);
		if (strcmp(why, "stale"))
			host->log(KILN_LOG_WARN, "idx", "%s: the cached copy of %s is %s; rebuilding it",
				  name, path, why);
		else
			host->log(KILN_LOG_INFO, "idx", "%s: the cached copy of %s is of an older version of it; rebuilding it",
				  name, path);
		return 0;
	}
	struct idx_cache_head h;
	memcpy(&h, m, sizeof h);
	out->base = m;
	out->len = len;
	out->raw = (const uint8_t *)m + sizeof h + h.path_len;
	out->raw_len = h.raw;
	host->log(KILN_LOG_DEBUG, "idx", "%s: mapped the inflated copy %s", path, name);
	return 1;
}

void idx_cache_close(struct idx_cache_map *m)
{
	if (m->base)
		munmap(m->base, m->len);
	memset(m, 0, sizeof *m);
}

void idx_cache_save(const struct kiln_host *host, const char *dir, const char *path,
		    const struct stat *sb, const void *hdr, size_t hdr_len, const void *data,
		    uint64_t data_len)
{
	/* the two paths on the heap: with common_write_atomic's, inlined, 21
	 * KiB of a loader thread's stack (the frame cap, docs/design-notes.md) */
	struct { char real[PATH_MAX], name[PATH_MAX + 64]; } *nm = malloc(sizeof *nm);
	if (!nm)
		return; /* no copy kept: the next run inflates the file again */
	char *const real = nm->real, *const name = nm->name;
	if (idx_cache_name(dir, path, real, name, sizeof nm->name)) {
		free(nm);
		return;
	}
	struct idx_cache_head h;
	idx_cache_describe(&h, sb);
	h.raw = hdr_len + data_len;
	h.path_len = (uint32_t)strlen(real);
	h.crc = host->crc32c(host->crc32c(0, hdr, hdr_len), data, (size_t)data_len);
	const void *part[4] = { &h, real, hdr, data };
	size_t len[4] = { sizeof h, h.path_len, hdr_len, (size_t)data_len };
	if (common_write_atomic(name, part, len, 4))
		host->log(KILN_LOG_WARN, "idx", "%s: cannot keep the inflated copy of %s: %s (the next run inflates it again; [data] unzip_cache names another folder, or `none`)",
			  name, path, strerror(errno));
	else
		host->log(KILN_LOG_DEBUG, "idx", "%s: kept the inflated copy of %s", path, name);
	free(nm);
}
