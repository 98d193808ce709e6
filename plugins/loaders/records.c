/* plugins/loaders/records.c - the `records` data source: kiln's own packed
 * shards (records.h, docs/formats.md), as `kiln pack` writes them.
 *
 * Every shard stays open, and a record is read with one preadv() (its
 * header onto the stack, its payload into the image's buffer): the page
 * cache holds the data once however many workers and processes read it
 * (this is `cache = mmap` for records: nothing is copied at open).  open()
 * checks each shard's header and index (magic, version, both CRC32Cs, that
 * every record lies inside the file) and keeps the index in memory;
 * read_image() checks the record it reads (its CRC32C over header and
 * payload, label, size) before decoding it, so a flipped bit anywhere is an
 * error naming the shard and the record, never wrong pixels.  The source
 * is the shards concatenated in order; after open() nothing is written, so
 * reads are thread-safe.
 *
 * Nothing in a file is trusted: offsets and lengths are checked against
 * the file's size before anything is read through them.  A shard truncated
 * while the run reads it is a short read, KILN_EDATA naming the shard and
 * the record (until session 38 the shards were mmap()ed, and a read past
 * the new end killed the process with SIGBUS); one rewritten in place
 * fails its records' CRC32Cs.  kiln pack writes new files and renames them,
 * which is safe: an open descriptor keeps the old file.
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
#include <sys/stat.h> /* fstat */
#include <sys/uio.h>  /* preadv */
#include <unistd.h>   /* close */

#define REC_WHO "records"
#define REC_MAX_PIXELS ((uint64_t)1 << 28) /* as IMG_MAX_PIXELS */

/* One open shard. */
struct rec_shard {
	char path[PATH_MAX];
	int fd;                /* open from rec_shard_open to rec_close; -1: not open */
	uint64_t size;         /* the file's bytes at open */
	uint8_t *index;        /* count x REC_INDEX_ENTRY bytes, read at open (owned) */
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

static void rec_shard_close(struct rec_shard *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	free(s->index);
	s->index = NULL;
}

/* A read of s (want bytes at off, got of them, -1: errno) that came
 * short: KILN_EIO for an error, else KILN_EDATA: the file shrank since
 * open (truncated or rewritten in place while the run reads it).  `what`
 * names the part read ("the index"); c (NULL at open) and rec, when what
 * is NULL, name the record instead. */
static kiln_status rec_short(const struct kiln_host *host, const struct rec_ctx *c,
			     const struct rec_shard *s, uint64_t rec, const char *what,
			     uint64_t off, size_t want, ssize_t got)
{
	char why[320], now[64] = "";
	struct stat sb;
	kiln_status st = got < 0 ? KILN_EIO : KILN_EDATA;
	if (got < 0)
		snprintf(why, sizeof why, "cannot read bytes %" PRIu64 "..%" PRIu64 ": %s", off,
			 off + want - 1, strerror(errno));
	else {
		if (!fstat(s->fd, &sb))
			snprintf(now, sizeof now, ", it has %lld now", (long long)sb.st_size);
		snprintf(why, sizeof why, "only %zd of its %zu bytes (at %" PRIu64 "..%" PRIu64 ") are there: the shard had %" PRIu64 " bytes when the run opened it%s (was it truncated or rewritten while the run read it?)",
			 got, want, off, off + want - 1, s->size, now);
	}
	if (!what)
		return rec_fail(c, s, rec, st, "%s", why);
	return host->error(st, "%s: %s: %s", s->path, what, why);
}

/* The set block of a minor-1 header (records.h) into s->set, checked:
 * its CRC, and an index below the count when one is recorded.  (What the
 * split's other shards record is loaders_set_check's, in rec_open.) */
static kiln_status rec_set_check(const struct kiln_host *host, struct rec_shard *s,
				 const uint8_t *h, uint64_t index_at)
{
	const uint8_t *b = h + REC_SET_AT;
	if (index_at < REC_SET_END)
		return host->error(KILN_EDATA, "%s: header minor version %u has a set block at bytes %u..%u, but the index starts at %" PRIu64 ": the header is corrupt",
				   s->path, h[REC_MINOR_AT], REC_SET_AT, REC_SET_END - 1, index_at);
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

/* The index of s (count entries and its CRC32C, from index_at to the
 * file's end) read into s->index and checked: its CRC, and every record
 * inside the records area (from first_at to index_at), in order, not
 * overlapping. */
static kiln_status rec_index_read(const struct kiln_host *host, struct rec_shard *s,
				  uint64_t index_at, uint64_t first_at)
{
	const char *p = s->path;
	const size_t bytes = (size_t)(s->size - index_at); /* entries, then the CRC */
	if (!(s->index = malloc(bytes)))
		return host->error(KILN_ENOMEM, "%s: out of memory for the index (%zu bytes)", p,
				   bytes);
	ssize_t got = loaders_pread_full(s->fd, s->index, bytes, index_at);
	if (got != (ssize_t)bytes)
		return rec_short(host, NULL, s, 0, "the index", index_at, bytes, got);
	uint32_t stored = rec_get32(s->index + bytes - 4);
	uint32_t computed = host->crc32c(0, s->index, (size_t)(s->count * REC_INDEX_ENTRY));
	if (stored != computed)
		return host->error(KILN_EDATA, "%s: index CRC32C mismatch (stored 0x%08x, computed 0x%08x): the index is corrupt",
				   p, stored, computed);
	uint64_t end = first_at;
	for (uint64_t i = 0; i < s->count; i++) {
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

/* Check the header h (its first min(size, REC_SET_END) bytes) of s, then
 * read and check its index; fills the rest of s. */
static kiln_status rec_shard_check(const struct kiln_host *host, struct rec_shard *s,
				   const uint8_t *h)
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

	uint64_t first_at = REC_HEADER_BYTES; /* where records may start */
	if (h[REC_MINOR_AT] >= 1) {
		kiln_status st = rec_set_check(host, s, h, index_at);
		if (st)
			return st;
		first_at = REC_SET_END;
	}
	s->count = count;
	return rec_index_read(host, s, index_at, first_at);
}

/* Open and check the shard `path`, one of the split's nshards, into s;
 * `from` names the key it came from (loaders_shards_key), `at` where it
 * was set, for a shard that is not there (loaders_shards_at). */
static kiln_status rec_shard_open(const struct kiln_host *host, const char *path, const char *from,
				  const char *at, size_t nshards, struct rec_shard *s)
{
	off_t size;
	kiln_status st;
	memset(s, 0, sizeof *s);
	s->fd = -1;
	if (snprintf(s->path, sizeof s->path, "%s", path) >= (int)sizeof s->path)
		return host->error(KILN_EIO, "%s: path too long", path);
	char kind[64], hint[320];
	const char *why;
	int fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (fd < 0 && loaders_missing(errno)) /* a name the config gave: exit 2 */
		return loaders_no_such_file(host, at, path, "the records shard");
	if (fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the shard (%s): %s%s", path, from, why,
				   loaders_open_hint(errno, nshards, hint, sizeof hint));
	s->fd = fd;
	s->size = (uint64_t)size;
	uint8_t h[REC_SET_END];
	const size_t want = s->size < sizeof h ? (size_t)s->size : sizeof h;
	ssize_t got;
	if (s->size == 0)
		st = host->error(KILN_EDATA, "%s: the shard is empty (a records header has %u bytes)",
				 path, REC_HEADER_BYTES);
	else if ((uint64_t)size > SIZE_MAX)
		st = host->error(KILN_EIO, "%s: the shard (%" PRIu64 " bytes) does not fit this address space",
				 path, s->size);
	else if ((got = loaders_pread_full(fd, h, want, 0)) != (ssize_t)want)
		st = rec_short(host, NULL, s, 0, "the header", 0, want, got);
	else
		st = rec_shard_check(host, s, h);
	if (st)
		rec_shard_close(s); /* (rec_close sees only the shards opened) */
	return st;
}

/* ---- the source ------------------------------------------------------- */

static void rec_close(void *vctx)
{
	struct rec_ctx *c = vctx;
	if (!c)
		return;
	for (int i = 0; i < c->nshards; i++)
		rec_shard_close(&c->shards[i]);
	free(c->shards);
	free(c);
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
		s->first = c->src.n;
		if (s->count > (uint64_t)(INT64_MAX - c->src.n)) {
			st = host->error(KILN_EDATA, "%s: too many records", s->path);
			goto fail;
		}
		c->src.n += (int64_t)s->count;
		if ((int64_t)s->classes > c->src.classes)
			c->src.classes = s->classes;
		if (!s->count)
			continue; /* an empty shard says nothing about sizes */
		if (!sized) {
			c->h = (int32_t)s->h, c->w = (int32_t)s->w, c->c = (int32_t)s->c;
			sized = 1;
		}
		if (c->h != (int32_t)s->h || c->w != (int32_t)s->w)
			c->h = c->w = 0;
		if (c->c != (int32_t)s->c)
			c->c = 0;
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
	info->flags = KILN_SOURCE_MAPPED; /* shared page cache: pread, not mmap (see the top) */
	return KILN_OK;
}

/* A record of a shard: where (rec_locate), then read and checked
 * (rec_fetch). */
struct rec_view {
	const struct rec_shard *s;
	uint64_t rec;          /* index in the shard */
	uint64_t off;          /* its bytes in the shard: off .. off + len - 1 */
	uint32_t len;
	uint32_t n;            /* its payload's bytes: len - REC_RECORD_HEADER */
	uint8_t head[REC_RECORD_HEADER];
	int32_t label;
	uint32_t h, w, c, encoding;
	const uint8_t *payload; /* the n bytes rec_fetch read (the caller's buffer) */
};

/* Where sample `index` is, from the index in memory (nothing read yet).
 * KILN_EINVAL for an index out of range. */
static kiln_status rec_locate(const struct rec_ctx *c, int64_t index, struct rec_view *v)
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
	v->s = s;
	v->rec = (uint64_t)(index - s->first);
	const uint8_t *e = s->index + v->rec * REC_INDEX_ENTRY;
	v->off = rec_get64(e);
	v->len = rec_get32(e + 8); /* open() checked off + len <= the index's offset */
	v->n = v->len - REC_RECORD_HEADER;
	return KILN_OK;
}

/* Read the record v locates with one preadv(): its header into v->head,
 * its payload into `payload` (v->n bytes); check its CRC32C and fields.
 * KILN_EDATA for a corrupt record or one the file no longer holds in full
 * (truncated while the run reads it), KILN_EIO for a read error. */
static kiln_status rec_fetch(const struct rec_ctx *c, struct rec_view *v, uint8_t *payload)
{
	const struct kiln_host *host = c->src.host;
	const struct rec_shard *s = v->s;
	const uint64_t rec = v->rec;
	struct iovec iov[2] = { { v->head, REC_RECORD_HEADER }, { payload, v->n } };
	ssize_t got;
	do
		got = preadv(s->fd, iov, 2, (off_t)v->off);
	while (got < 0 && errno == EINTR);
	if (got >= REC_RECORD_HEADER && got < (ssize_t)v->len) { /* the rest (NFS may split) */
		ssize_t more = loaders_pread_full(s->fd, payload + (got - REC_RECORD_HEADER),
						  v->len - (size_t)got, v->off + (uint64_t)got);
		got = more < 0 ? more : got + more;
	}
	if (got != (ssize_t)v->len)
		return rec_short(host, c, s, rec, NULL, v->off, v->len, got);
	const uint8_t *r = v->head;
	uint32_t n = rec_get32(r + 16);
	if (n != v->n)
		return rec_fail(c, s, rec, KILN_EDATA, "payload length %u disagrees with the index (a record of %u bytes holds %u)",
				n, v->len, v->n);
	uint32_t stored = rec_get32(r + REC_RECORD_CRC_AT);
	uint32_t computed = host->crc32c(host->crc32c(0, r, REC_RECORD_CRC_AT), payload, v->n);
	if (stored != computed)
		return rec_fail(c, s, rec, KILN_EDATA, "CRC32C mismatch (stored 0x%08x, computed 0x%08x)",
				stored, computed);
	v->label = (int32_t)rec_get32(r);
	v->h = rec_get32(r + 4);
	v->w = rec_get32(r + 8);
	v->c = r[12];
	v->encoding = r[13];
	v->payload = payload;
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
	if (v->encoding == REC_RAW && v->payload != img->data) {
		if ((st = img_reserve(host, img, bytes)))
			return st;
		memcpy(img->data, v->payload, bytes);
	} else if (v->encoding != REC_RAW) { /* (v->payload is not img->data) */
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

/* image: u8 [h, w, c] as packed; label: i32 [].  The payload is read
 * into img's own buffer: a raw image is then in place; a JPEG or PNG one
 * leaves it (the encoded bytes) for a buffer the decoder grows. */
static kiln_status rec_read_image(void *vctx, int64_t index, struct kiln_image *img,
				  void *label)
{
	const struct rec_ctx *c = vctx;
	struct kiln_image none = { 0 }, *into = img ? img : &none;
	struct rec_view v;
	kiln_status st;
	if ((st = rec_locate(c, index, &v)) || (st = img_reserve(c->src.host, into, v.n)) ||
	    (st = rec_fetch(c, &v, into->data)))
		goto out;
	if (img && v.encoding != REC_RAW) {
		struct kiln_image enc = *img; /* the decoder's img starts empty */
		img->data = NULL;
		img->cap = 0;
		st = rec_pixels(c, &v, img);
		free(enc.data);
	} else if (img) {
		st = rec_pixels(c, &v, img);
	}
	if (!st && label)
		*(int32_t *)label = v.label;
out:
	free(none.data);
	return st;
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
	uint8_t *buf = NULL; /* the payload */
	if ((st = rec_locate(c, index, &v)))
		return st;
	if (!(buf = malloc(v.n ? v.n : 1)))
		return c->src.host->error(KILN_ENOMEM, "out of memory for a record of %u bytes", v.len);
	if ((st = rec_fetch(c, &v, buf))) {
		free(buf);
		return st;
	}
	if (sample) {
		struct kiln_image tmp = { 0 };
		const uint8_t *px = v.payload;
		if (v.encoding != REC_RAW) {
			if ((st = rec_pixels(c, &v, &tmp))) {
				free(tmp.data);
				free(buf);
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
	free(buf);
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

LOADERS_SOURCE_PF(records, "records",
		  "kiln's packed record shards (.krec, written by kiln pack): CRC32C-checked",
		  rec_keys, rec_open, rec_close, rec_info, rec_read, rec_read_image, NULL, rec_files);
