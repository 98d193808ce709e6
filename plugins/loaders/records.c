/* plugins/loaders/records.c - the `records` data source: kiln's own packed
 * shards (records.h, docs/formats.md), as `kiln pack` writes them.
 *
 * Every shard is mmap()ed read-only, so the page cache holds the data once
 * however many workers and processes read it (this is `cache = mmap` for
 * records: nothing is copied at open).  open() checks each shard's header
 * and index (magic, version, both CRC32Cs, that every record lies inside
 * the file); read_image() checks the record it reads (its CRC32C over
 * header and payload, label, size) before decoding it, so a flipped bit
 * anywhere is an error naming the shard and the record, never wrong pixels.
 * The source is the shards concatenated in order; after open() nothing is
 * written, so reads are thread-safe.
 *
 * Nothing in a file is trusted: offsets and lengths are checked against
 * the file's size before anything is read through them.  The files must not
 * be changed in place while they are mapped (kiln pack writes new files and
 * renames them, which is safe: a mapping keeps the old file): a shard
 * truncated under the run turns the next read past its new end into
 * SIGBUS, which library code cannot catch (it installs no signal
 * handlers), as for LMDB (docs/data.md).  Session 38 read each record with
 * pread() instead, which made truncation an error: the system call and
 * its page-cache lookup cost about 1 us a sample against 0.15 us through
 * the mapping, and the records example lost 35% of its samples/s on a
 * quiet 2-core VM (docs/PERFORMANCE.md, "session 38"), so the mapping
 * came back; the tokens source, read once a transformer step, kept
 * pread().
 */
#include "loaders.h"
#include "../common/open_file.h" /* common_open_file */
#include "../common/norm_lut.h"  /* common_norm_lut */
#include "image.h"
#include "records.h"

#include <errno.h>    /* errno, ENOENT */
#include <fcntl.h>    /* open */
#include <inttypes.h> /* PRIu64, PRId64 */
#include <limits.h>   /* PATH_MAX */
#include <stdarg.h>   /* va_list */
#include <stdio.h>    /* snprintf, vsnprintf */
#include <stdlib.h>   /* calloc, realloc, free, qsort */
#include <string.h>   /* strerror, strcmp, strlen, memcpy */
#include <sys/mman.h> /* mmap, munmap */
#include <sys/stat.h> /* stat, fstat */
#include <unistd.h>   /* close */

#define REC_WHO "records"
#define REC_MAX_PIXELS ((uint64_t)1 << 28) /* as IMG_MAX_PIXELS */

/* One mapped shard. */
struct rec_shard {
	char path[PATH_MAX];
	const uint8_t *map;    /* the whole file, PROT_READ */
	size_t size;
	const uint8_t *index;  /* count x REC_INDEX_ENTRY bytes inside map */
	uint64_t count;
	int64_t first;         /* sample index of this shard's record 0 */
	uint32_t classes;
	uint32_t h, w, c;      /* the header's common size (0: varies) */
	struct loaders_set set; /* its pack (count 0: not recorded) */
};

struct rec_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	struct rec_shard *shards;
	int nshards;
	int32_t h, w, c;        /* common over every shard, 0 when they vary */
	float lut[256];         /* lut[u] = u/255, as idx computes it */
};

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key rec_keys[] = {
	{ "path", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "A records shard (.krec), or a directory of them: for split S it reads every *.krec of the subdirectory `path/S` if that is a directory, else the files `path/S-*.krec` (the names `kiln pack` writes), in name order. Required unless `shards` is set. [data.eval] inherits a directory, never a single file (it would evaluate on the training shard). Format: docs/formats.md. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "shards", KILN_KEY_LIST, NULL, 0, 0, NULL,
	  "Shard files, read in this order (instead of searching `path`); relative names are relative to `path` when that is a directory; a name with *, ? or [ is a glob pattern (its matches in name order). A subset of a kiln pack may be listed (a directory's listing must be the whole pack), one shard twice may not. Never inherited by [data.eval]. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37), as is a pattern that matches nothing." },
	{ "split", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "The subdirectory or file-name prefix a directory `path` is searched for (`.` for the directory itself). Unset: the split the run asks for (train for [data], test for [data.eval]); [data.eval] never inherits it." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* ---- errors ------------------------------------------------------------ */

/* An error about record `rec` of shard s: "<path>: record 17 (sample
 * 100017): <reason>" (the sample number only when there are several
 * shards, where it differs). */
static kiln_status rec_fail(const struct rec_ctx *c, const struct rec_shard *s, uint64_t rec,
			    kiln_status st, const char *fmt, ...) KILN_PRINTF(5, 6);
static kiln_status rec_fail(const struct rec_ctx *c, const struct rec_shard *s, uint64_t rec,
			    kiln_status st, const char *fmt, ...)
{
	char why[512], sample[48] = "";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	if (c->nshards > 1)
		snprintf(sample, sizeof sample, " (sample %" PRId64 ")", s->first + (int64_t)rec);
	return c->src.host->error(st, "%s: record %" PRIu64 "%s: %s", s->path, rec, sample, why);
}

/* ---- opening one shard ------------------------------------------------- */

static void rec_shard_unmap(struct rec_shard *s)
{
	if (s->map)
		munmap((void *)s->map, s->size);
	s->map = NULL;
}

/* The set block of a minor-1 header (records.h) into s->set, checked:
 * its CRC, and an index below the count when one is recorded.  (What the
 * split's other shards record is loaders_set_check's, in rec_open.) */
static kiln_status rec_set_check(const struct kiln_host *host, struct rec_shard *s,
				 uint64_t index_at)
{
	const uint8_t *b = s->map + REC_SET_AT;
	if (index_at < REC_SET_END)
		return host->error(KILN_EDATA, "%s: header minor version %u has a set block at bytes %u..%u, but the index starts at %" PRIu64 ": the header is corrupt",
				   s->path, s->map[REC_MINOR_AT], REC_SET_AT, REC_SET_END - 1, index_at);
	uint32_t stored = rec_get32(b + REC_SET_CRC_AT - REC_SET_AT);
	uint32_t computed = host->crc32c(0, b, REC_SET_CRC_AT - REC_SET_AT);
	if (stored != computed)
		return host->error(KILN_EDATA, "%s: set block CRC32C mismatch (stored 0x%08x, computed 0x%08x): the shard's record of its pack is corrupt",
				   s->path, stored, computed);
	s->set.index = rec_get32(b);
	s->set.count = rec_get32(b + 4);
	s->set.pack = rec_get32(b + 8);
	if (s->set.count && (s->set.index >= s->set.count || s->set.count > REC_MAX_SHARDS))
		return host->error(KILN_EDATA, "%s: the set block says shard %u of %u (at most %d shards, index below count): it is corrupt",
				   s->path, s->set.index, s->set.count, REC_MAX_SHARDS);
	return KILN_OK;
}

/* Check the header h (the file's first min(size, REC_HEADER_BYTES) bytes)
 * of shard s (path, size): its classes and image size into s, where the
 * index starts and the record count into *index_at_out, *count_out. */
static kiln_status rec_header_check(const struct kiln_host *host, struct rec_shard *s,
				    const uint8_t *h, uint64_t *index_at_out, uint64_t *count_out)
{
	const char *p = s->path;
	uint64_t size = s->size;

	if (size >= 8 && memcmp(h, REC_MAGIC, 8)) {
		char found[40];
		for (int i = 0; i < 8; i++)
			snprintf(found + 3 * i, sizeof found - 3 * (size_t)i, "%02x%s", h[i],
				 i < 7 ? " " : "");
		return host->error(KILN_EDATA, "%s: not a kiln records shard: wrong magic (found %s, expected \"KILNREC\\0\" = 4b 49 4c 4e 52 45 43 00)",
				   p, found);
	}
	if (size < REC_HEADER_BYTES)
		return host->error(KILN_EDATA, "%s: truncated header: the file has %" PRIu64 " bytes, a records header %u",
				   p, size, REC_HEADER_BYTES);
	uint32_t version = rec_get32(h + 8);
	if (version != REC_VERSION)
		return host->error(KILN_EDATA, "%s: records format version %u is not supported: this kiln reads version %u%s",
				   p, version, REC_VERSION,
				   version > REC_VERSION && version < 256 ? " (written by a newer kiln: upgrade kiln, or re-pack with this one)" :
				   " (the header is corrupt)");
	uint32_t stored = rec_get32(h + REC_HEADER_CRC_AT);
	uint32_t computed = host->crc32c(0, h, REC_HEADER_CRC_AT);
	if (stored != computed)
		return host->error(KILN_EDATA, "%s: header CRC32C mismatch (stored 0x%08x, computed 0x%08x): the header is corrupt",
				   p, stored, computed);
	uint32_t hsize = rec_get32(h + 12), flags = rec_get32(h + 40);
	uint64_t count = rec_get64(h + 16), index_at = rec_get64(h + 24), fsize = rec_get64(h + 32);
	if (hsize != REC_HEADER_BYTES)
		return host->error(KILN_EDATA, "%s: header size %u, but version 1 headers are %u bytes",
				   p, hsize, REC_HEADER_BYTES);
	if (flags)
		return host->error(KILN_EDATA, "%s: unknown header flags 0x%08x (version 1 defines none)",
				   p, flags);
	if (fsize > size)
		return host->error(KILN_EDATA, "%s: truncated: the header promises %" PRIu64 " bytes, the file has %" PRIu64,
				   p, fsize, size);
	if (fsize < size)
		return host->error(KILN_EDATA, "%s: %" PRIu64 " bytes follow the end of the shard (%" PRIu64 " bytes, by its header): the file is corrupt or was appended to",
				   p, size - fsize, fsize);
	/* the index fills the file from index_at to its end; compare with
	 * divisions so that no corrupt value can wrap */
	if (index_at < REC_HEADER_BYTES || index_at % REC_ALIGN || index_at > size - 4 ||
	    (size - 4 - index_at) % REC_INDEX_ENTRY || (size - 4 - index_at) / REC_INDEX_ENTRY != count)
		return host->error(KILN_EDATA, "%s: the header's index offset %" PRIu64 " and record count %" PRIu64 " do not fit the file of %" PRIu64 " bytes",
				   p, index_at, count, size);
	s->classes = rec_get32(h + 44);
	s->h = rec_get32(h + 48);
	s->w = rec_get32(h + 52);
	s->c = h[56];
	if ((s->h == 0) != (s->w == 0) || (s->c != 0 && s->c != 1 && s->c != 3) ||
	    (uint64_t)s->h * s->w > REC_MAX_PIXELS)
		return host->error(KILN_EDATA, "%s: the header's image size %ux%ux%u is invalid", p,
				   s->h, s->w, s->c);
	if (count && !s->classes)
		return host->error(KILN_EDATA, "%s: the header declares 0 classes for %" PRIu64 " records",
				   p, count);
	if (s->classes > REC_MAX_CLASSES)
		return host->error(KILN_EDATA, "%s: the header declares %u classes, more than a label (i32) can name (at most %u): the header is corrupt",
				   p, s->classes, REC_MAX_CLASSES);
	*index_at_out = index_at;
	*count_out = count;
	return KILN_OK;
}

/* Check the header and the index of the mapped s; fills the rest of s. */
static kiln_status rec_shard_check(const struct kiln_host *host, struct rec_shard *s)
{
	const uint8_t *h = s->map;
	const char *p = s->path;
	uint64_t size = s->size, index_at = 0, count = 0;
	uint32_t stored, computed;
	kiln_status st = rec_header_check(host, s, h, &index_at, &count);
	if (st)
		return st;
	uint64_t first_at = REC_HEADER_BYTES; /* where records may start */
	if (h[REC_MINOR_AT] >= 1) {
		if ((st = rec_set_check(host, s, index_at)))
			return st;
		first_at = REC_SET_END;
	}
	s->index = h + index_at;
	s->count = count;
	stored = rec_get32(h + size - 4);
	computed = host->crc32c(0, s->index, (size_t)(count * REC_INDEX_ENTRY));
	if (stored != computed)
		return host->error(KILN_EDATA, "%s: index CRC32C mismatch (stored 0x%08x, computed 0x%08x): the index is corrupt",
				   p, stored, computed);
	/* every record inside the records area, in order, not overlapping */
	uint64_t end = first_at;
	for (uint64_t i = 0; i < count; i++) {
		const uint8_t *e = s->index + i * REC_INDEX_ENTRY;
		uint64_t off = rec_get64(e);
		uint32_t len = rec_get32(e + 8);
		if (off % REC_ALIGN || off < end)
			return host->error(KILN_EDATA, "%s: record %" PRIu64 ": index entry offset %" PRIu64 " is %s",
					   p, i, off, off % REC_ALIGN ? "not a multiple of 8" :
					   "inside the previous record or the header (and set block)");
		if (len < REC_RECORD_HEADER)
			return host->error(KILN_EDATA, "%s: record %" PRIu64 ": index entry length %u is shorter than a record header (%u bytes)",
					   p, i, len, REC_RECORD_HEADER);
		if (off > index_at || len > index_at - off)
			return host->error(KILN_EDATA, "%s: record %" PRIu64 ": extends past the records area (offset %" PRIu64 ", %u bytes; the index starts at %" PRIu64 ")",
					   p, i, off, len, index_at);
		end = off + len;
	}
	return KILN_OK;
}

/* The error of an mmap() that failed with ENOMEM for shard `path`, one of
 * `nshards`: each shard is one mapping, and Linux bounds a process's
 * mappings by vm.max_map_count (65530 by default), so what to raise. */
static kiln_status rec_map_enomem(const struct kiln_host *host, const char *path, size_t nshards)
{
	long max = -1;
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	if (f) {
		if (fscanf(f, "%ld", &max) != 1)
			max = -1;
		fclose(f);
	}
	char now[32] = "unknown";
	if (max >= 0)
		snprintf(now, sizeof now, "%ld", max);
	return host->error(KILN_ENOMEM, "%s: cannot map the shard: %s. Each of the split's %zu shard(s) is one memory mapping of the process: when they are many, raise vm.max_map_count (now %s) well above that count (as root: sysctl -w vm.max_map_count=262144), or pack with a larger --shard-size; else the process is out of address space (ulimit -v) or memory",
			   path, strerror(ENOMEM), nshards, now);
}

/* Open the shard `path` into *fd, its path and size into s (zeroed
 * first); `from` names the key it came from (loaders_shards_key), `at`
 * where it was set, for a shard that is not there (loaders_shards_at). */
static kiln_status rec_shard_fd(const struct kiln_host *host, const char *path, const char *from,
				const char *at, struct rec_shard *s, int *fd)
{
	off_t size;
	memset(s, 0, sizeof *s);
	if (snprintf(s->path, sizeof s->path, "%s", path) >= (int)sizeof s->path)
		return host->error(KILN_EIO, "%s: path too long", path);
	char kind[64];
	const char *why;
	*fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (*fd < 0 && loaders_missing(errno)) /* a name the config gave: exit 2 */
		return loaders_no_such_file(host, at, path, "the records shard");
	if (*fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the shard (%s): %s", path, from, why);
	kiln_status st = KILN_OK;
	if (size == 0)
		st = host->error(KILN_EDATA, "%s: the shard is empty (a records header has %u bytes)",
				 path, REC_HEADER_BYTES);
	else if ((uint64_t)size > SIZE_MAX)
		st = host->error(KILN_EIO, "%s: the shard (%lld bytes) does not fit this address space",
				 path, (long long)size);
	if (st) {
		close(*fd);
		*fd = -1;
	}
	s->size = (size_t)size;
	return st;
}

/* Map and check the shard `path`, one of the split's nshards, into s
 * (`from`, `at`: rec_shard_fd's). */
static kiln_status rec_shard_open(const struct kiln_host *host, const char *path, const char *from,
				  const char *at, size_t nshards, struct rec_shard *s)
{
	int fd;
	kiln_status st = rec_shard_fd(host, path, from, at, s, &fd);
	if (st)
		return st;
	void *m = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd); /* the mapping keeps the file */
	if (m == MAP_FAILED && errno == ENOMEM)
		return rec_map_enomem(host, path, nshards);
	if (m == MAP_FAILED)
		return host->error(KILN_EIO, "%s: cannot map the shard: %s", path, strerror(errno));
	s->map = m;
	if ((st = rec_shard_check(host, s)))
		rec_shard_unmap(s);
	return st;
}

/* ---- the source ------------------------------------------------------- */

static void rec_close(void *vctx)
{
	struct rec_ctx *c = vctx;
	if (!c)
		return;
	for (int i = 0; i < c->nshards; i++)
		rec_shard_unmap(&c->shards[i]);
	free(c->shards);
	free(c);
}

/* Shard s's records after c's: its first sample index, c's count and
 * classes, and c's image size, common over every shard (0 where they
 * differ); *sized 0 until a shard with records has set it. */
static kiln_status rec_shard_add(struct rec_ctx *c, struct rec_shard *s, int *sized)
{
	s->first = c->src.n;
	if (s->count > (uint64_t)(INT64_MAX - c->src.n))
		return c->src.host->error(KILN_EDATA, "%s: too many records", s->path);
	c->src.n += (int64_t)s->count;
	if ((int64_t)s->classes > c->src.classes)
		c->src.classes = s->classes;
	if (!s->count)
		return KILN_OK; /* an empty shard says nothing about sizes */
	if (!*sized) {
		c->h = (int32_t)s->h, c->w = (int32_t)s->w, c->c = (int32_t)s->c;
		*sized = 1;
	}
	if (c->h != (int32_t)s->h || c->w != (int32_t)s->w)
		c->h = c->w = 0;
	if (c->c != (int32_t)s->c)
		c->c = 0;
	return KILN_OK;
}

static kiln_status rec_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	struct loaders_names names = { 0 };
	kiln_status st;
	*out = NULL;
	split = host->config_get(cfg, section, "split") ? host->config_get(cfg, section, "split")
							 : split;
	if ((st = loaders_find_shards(host, cfg, section, REC_WHO, split, REC_SUFFIX, &names)))
		goto fail_names;
	struct rec_ctx *c = calloc(1, sizeof *c);
	if (!c || !(c->shards = calloc((size_t)names.n, sizeof *c->shards))) {
		free(c);
		st = host->error(KILN_ENOMEM, "out of memory");
		goto fail_names;
	}
	c->src.host = host;
	if ((st = loaders_max_pixels_key(host, cfg, section, &c->src)))
		goto fail;
	common_norm_lut(c->lut, 0.0f, 1.0f);
	int sized = 0; /* c->h, w, c hold a shard's size */
	char from[PATH_MAX + 64];
	loaders_shards_key(host, cfg, section, from, sizeof from);
	char at[PATH_MAX + 64];
	loaders_shards_at(host, cfg, section, at, sizeof at);
	for (size_t i = 0; i < names.n; i++) {
		struct rec_shard *s = &c->shards[i];
		if ((st = loaders_not_partial(host, names.v[i], REC_PARTIAL)) ||
		    (st = rec_shard_open(host, names.v[i], from, at, names.n, s)))
			goto fail;
		c->nshards++;
		if ((st = rec_shard_add(c, s, &sized)))
			goto fail;
	}
	/* (the shards' records of their pack agree: a split listed
	 * from a directory must be a whole pack) */
	if ((st = loaders_set_check(c->src.host, names.v, &c->shards[0].set, sizeof *c->shards,
				     (size_t)c->nshards, names.scanned, REC_SUFFIX)))
		goto fail;
	if (c->src.n == 0)
		c->h = c->w = c->c = 0;
	char size[64];
	if (c->h && c->c)
		snprintf(size, sizeof size, "%dx%dx%d", c->h, c->w, c->c);
	else
		snprintf(size, sizeof size, "of varying sizes");
	host->log(KILN_LOG_INFO, REC_WHO, "[%s] %s%s: %" PRId64 " samples %s in %d shard(s), %" PRId64 " classes",
		  section, c->shards[0].path, c->nshards > 1 ? " ..." : "", c->src.n, size, c->nshards,
		  c->src.classes);
	loaders_names_free(&names);
	c->src.who = c->shards[0].path;
	*out = c;
	return KILN_OK;

fail:
	rec_close(c);
fail_names:
	loaders_names_free(&names);
	return st;
}

static kiln_status rec_info(void *vctx, struct kiln_source_info *info)
{
	const struct rec_ctx *c = vctx;
	loaders_varying_info(vctx, info);
	/* read() yields f32 [c, h, w] when every image has the same size;
	 * otherwise only read_image() works (the transforms fix a size) */
	if (c->h && c->c) {
		loaders_fixed_info(info, KILN_F32, c->c, c->h, c->w, c->h, c->w, c->c);
	} else {
		info->sample.dtype = KILN_U8; /* no fixed f32 sample: see rec_read */
		info->image_h = c->h;
		info->image_w = c->w;
		info->image_c = c->c;
	}
	info->flags = KILN_SOURCE_MAPPED; /* every shard is mmapped */
	return KILN_OK;
}

/* The header of the shard `path` into s (rec_shard_open's arguments):
 * read, not mapped, and nothing past it (neither the set block nor the
 * index and records, which rec_shard_open checks). */
static kiln_status rec_shard_peek(const struct kiln_host *host, const char *path, const char *from,
				  const char *at, struct rec_shard *s)
{
	uint8_t h[REC_HEADER_BYTES];
	uint64_t index_at, count;
	int fd;
	kiln_status st = rec_shard_fd(host, path, from, at, s, &fd);
	if (st)
		return st;
	const size_t want = s->size < sizeof h ? s->size : sizeof h;
	ssize_t got = loaders_pread_full(fd, h, want, 0);
	if (got < 0)
		st = host->error(KILN_EIO, "%s: cannot read the shard's header: %s", path,
				 strerror(errno));
	else if ((size_t)got < want) /* it shrank since it was opened */
		st = host->error(KILN_EDATA, "%s: truncated header: the file has %zd bytes, a records header %u",
				 path, got, REC_HEADER_BYTES);
	else if (!(st = rec_header_check(host, s, h, &index_at, &count)))
		s->count = count;
	close(fd);
	return st;
}

/* What rec_info says after rec_open (version 5), from the shards'
 * headers: each shard's 64 bytes read and checked, none mapped, no index
 * nor record read (rec_open checks every index entry's bounds and the
 * index's CRC32C, which touches every shard's index pages). */
static kiln_status rec_peek(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, struct kiln_source_info *info)
{
	struct loaders_names names = { 0 };
	struct rec_ctx c = { .src.host = host };
	struct rec_shard *s = malloc(sizeof *s);
	char from[PATH_MAX + 64], at[PATH_MAX + 64];
	int sized = 0;
	split = host->config_get(cfg, section, "split") ? host->config_get(cfg, section, "split")
							 : split;
	kiln_status st = s ? KILN_OK : host->error(KILN_ENOMEM, "out of memory");
	if (!st && !(st = loaders_find_shards(host, cfg, section, REC_WHO, split, REC_SUFFIX,
					      &names)))
		st = loaders_max_pixels_key(host, cfg, section, &c.src);
	loaders_shards_key(host, cfg, section, from, sizeof from);
	loaders_shards_at(host, cfg, section, at, sizeof at);
	for (size_t i = 0; i < names.n && !st; i++)
		if (!(st = loaders_not_partial(host, names.v[i], REC_PARTIAL)) &&
		    !(st = rec_shard_peek(host, names.v[i], from, at, s)))
			st = rec_shard_add(&c, s, &sized);
	if (!st && c.src.n == 0)
		c.h = c.w = c.c = 0;
	if (!st)
		rec_info(&c, info);
	loaders_names_free(&names);
	free(s);
	return st;
}

/* A record of a shard, checked. */
struct rec_view {
	const struct rec_shard *s;
	uint64_t rec;          /* index in the shard */
	int32_t label;
	uint32_t h, w, c, encoding;
	const uint8_t *payload;
	uint32_t n;
};

/* Locate sample `index`, check its CRC32C and fields.  KILN_EINVAL for an
 * index out of range, KILN_EDATA for a corrupt record. */
static kiln_status rec_fetch(const struct rec_ctx *c, int64_t index, struct rec_view *v)
{
	const struct kiln_host *host = c->src.host;
	if (index < 0 || index >= c->src.n)
		return host->error(KILN_EINVAL, "%s%s: sample index %" PRId64 " is out of range: the source has %" PRId64 " samples (0..%" PRId64 ")",
				   c->nshards ? c->shards[0].path : "records",
				   c->nshards > 1 ? " ..." : "", index, c->src.n, c->src.n - 1);
	int lo = 0, hi = c->nshards - 1; /* the last shard whose first <= index */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (c->shards[mid].first <= index)
			lo = mid;
		else
			hi = mid - 1;
	}
	const struct rec_shard *s = &c->shards[lo];
	uint64_t rec = (uint64_t)(index - s->first);
	const uint8_t *e = s->index + rec * REC_INDEX_ENTRY;
	uint64_t off = rec_get64(e);
	uint32_t len = rec_get32(e + 8);
	const uint8_t *r = s->map + off; /* open() checked off + len <= index */

	v->s = s;
	v->rec = rec;
	v->n = rec_get32(r + 16);
	if (v->n != len - REC_RECORD_HEADER)
		return rec_fail(c, s, rec, KILN_EDATA, "payload length %u disagrees with the index (a record of %u bytes holds %u)",
				v->n, len, len - REC_RECORD_HEADER);
	uint32_t stored = rec_get32(r + REC_RECORD_CRC_AT);
	uint32_t computed = host->crc32c(host->crc32c(0, r, REC_RECORD_CRC_AT),
					 r + REC_RECORD_HEADER, v->n);
	if (stored != computed)
		return rec_fail(c, s, rec, KILN_EDATA, "CRC32C mismatch (stored 0x%08x, computed 0x%08x)",
				stored, computed);
	v->label = (int32_t)rec_get32(r);
	v->h = rec_get32(r + 4);
	v->w = rec_get32(r + 8);
	v->c = r[12];
	v->encoding = r[13];
	v->payload = r + REC_RECORD_HEADER;
	if (v->label < 0)
		return rec_fail(c, s, rec, KILN_EDATA, "negative label %d", v->label);
	if ((uint32_t)v->label >= s->classes)
		return rec_fail(c, s, rec, KILN_EDATA, "label %d is out of range: the shard declares %u classes",
				v->label, s->classes);
	if (!v->h || !v->w || (v->c != 1 && v->c != 3) || (uint64_t)v->h * v->w > REC_MAX_PIXELS)
		return rec_fail(c, s, rec, KILN_EDATA, "invalid image size %ux%ux%u", v->h, v->w, v->c);
	if ((s->h && (v->h != s->h || v->w != s->w)) || (s->c && v->c != s->c))
		return rec_fail(c, s, rec, KILN_EDATA, "image of %ux%ux%u in a shard of %ux%ux%u images",
				v->h, v->w, v->c, s->h, s->w, s->c);
	if (v->encoding >= REC_ENCODINGS)
		return rec_fail(c, s, rec, KILN_EDATA, "unknown encoding %u (0 raw, 1 jpeg, 2 png)",
				v->encoding);
	if (v->encoding == REC_RAW && (uint64_t)v->n != (uint64_t)v->h * v->w * v->c)
		return rec_fail(c, s, rec, KILN_EDATA, "raw payload of %u bytes for a %ux%ux%u image",
				v->n, v->h, v->w, v->c);
	return KILN_OK;
}

/* The pixels of a checked record into img (decoding JPEG and PNG). */
static kiln_status rec_pixels(const struct rec_ctx *c, const struct rec_view *v,
			      struct kiln_image *img)
{
	const struct kiln_host *host = c->src.host;
	kiln_status st;
	size_t bytes = (size_t)v->h * v->w * v->c;
	if (v->encoding == REC_RAW) {
		if ((st = img_reserve(host, img, bytes)))
			return st;
		memcpy(img->data, v->payload, bytes);
	} else {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof what, "%s: record %" PRIu64, v->s->path, v->rec);
		if ((st = img_decode(host, v->payload, v->n, what, c->src.max_pixels, img)))
			return st == KILN_ENOMEM ? st : KILN_EDATA;
		if ((uint32_t)img->h != v->h || (uint32_t)img->w != v->w ||
		    (uint32_t)img->c != v->c)
			return rec_fail(c, v->s, v->rec, KILN_EDATA, "the %s payload decodes to %dx%dx%d, the record says %ux%ux%u",
					rec_encoding_name((int)v->encoding), img->h, img->w, img->c,
					v->h, v->w, v->c);
	}
	img->h = (int32_t)v->h;
	img->w = (int32_t)v->w;
	img->c = (int32_t)v->c;
	return KILN_OK;
}

/* image: u8 [h, w, c] as packed; label: i32 []. */
static kiln_status rec_read_image(void *vctx, int64_t index, struct kiln_image *img,
				  void *label)
{
	const struct rec_ctx *c = vctx;
	struct rec_view v;
	kiln_status st;
	if ((st = rec_fetch(c, index, &v)))
		return st;
	if (img && (st = rec_pixels(c, &v, img)))
		return st;
	if (label)
		*(int32_t *)label = v.label;
	return KILN_OK;
}

/* sample: f32 [c, h, w], x = u8/255 (only when every image has one size);
 * label: i32 [].  Either may be NULL. */
static kiln_status rec_read(void *vctx, int64_t index, void *sample, void *label)
{
	const struct rec_ctx *c = vctx;
	struct rec_view v;
	kiln_status st;
	if (sample && !(c->h && c->c))
		return c->src.host->error(KILN_ENOTSUP, "%s%s: the images vary in size, so read() has no fixed sample shape; use read_image() with the [data] transforms, or kiln pack --resize to one size",
				      c->shards[0].path, c->nshards > 1 ? " ..." : "");
	if ((st = rec_fetch(c, index, &v)))
		return st;
	if (sample) {
		struct kiln_image tmp = { 0 };
		const uint8_t *px = v.payload;
		if (v.encoding != REC_RAW) {
			if ((st = rec_pixels(c, &v, &tmp))) {
				free(tmp.data);
				return st;
			}
			px = tmp.data;
		}
		size_t hw = (size_t)v.h * v.w;
		float *dst = sample;
		for (uint32_t ch = 0; ch < v.c; ch++)
			for (size_t i = 0; i < hw; i++)
				dst[ch * hw + i] = c->lut[px[i * v.c + ch]];
		free(tmp.data);
	}
	if (label)
		*(int32_t *)label = v.label;
	return KILN_OK;
}

/* The shards read (version 4): an output never replaces them. */
static void rec_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct rec_ctx *c = ctx;
	for (int i = 0; i < c->nshards; i++)
		each(arg, c->shards[i].path);
}

LOADERS_SOURCE_PEEK(records, "records",
		    "kiln's packed record shards (.krec, written by kiln pack): mmap()ed, CRC32C-checked",
		    rec_keys, rec_open, rec_close, rec_info, rec_read, rec_read_image, NULL, rec_files,
		    rec_peek);
