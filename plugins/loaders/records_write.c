/* plugins/loaders/records_write.c - writing one records shard (see
 * records.h and docs/formats.md).  Built into kiln-loaders.so's neighbours
 * that write shards: the `kiln` command (kiln pack) and the tests.
 *
 * The writer streams records to the file as they come and keeps only the
 * index (16 bytes a record) in memory; the header, which needs the count
 * and the index offset, is written last over the zeroed first 64 bytes.
 */
#include "records.h"
#include "../common/write_full.h" /* common_pwrite_full */

#include <errno.h>    /* errno */
#include <inttypes.h> /* PRIu64 */
#include <stdio.h>    /* FILE, fopen, fwrite, fseek */
#include <stdlib.h>   /* malloc, realloc, free */
#include <string.h>   /* memset, memcpy, strerror */
#include <fcntl.h>    /* open */
#include <unistd.h>   /* fsync, unlink, pread */

#define REC_MAX_PIXELS ((uint64_t)1 << 28) /* as IMG_MAX_PIXELS of image.h */

struct rec_writer {
	const struct kiln_host *host;
	char *path;
	FILE *f;
	uint64_t offset;   /* bytes written so far: where the next record starts */
	uint8_t *index;    /* count x REC_INDEX_ENTRY bytes */
	uint64_t count, index_cap;
	int64_t classes;   /* max(caller's classes, max label + 1) */
	int32_t h, w, c;   /* the common size, 0 once two records differ; -1: none yet */
};

static kiln_status rec_write(struct rec_writer *w, const void *buf, size_t n)
{
	if (n && fwrite(buf, 1, n, w->f) != n)
		return w->host->error(KILN_EIO, "%s: cannot write: %s", w->path, strerror(errno));
	w->offset += n;
	return KILN_OK;
}

kiln_status rec_writer_open(const struct kiln_host *host, const char *path, int64_t classes,
			    struct rec_writer **out)
{
	*out = NULL;
	struct rec_writer *w = calloc(1, sizeof *w);
	size_t pl = strlen(path);
	if (!w || !(w->path = malloc(pl + 1))) {
		free(w);
		return host->error(KILN_ENOMEM, "out of memory");
	}
	memcpy(w->path, path, pl + 1);
	w->host = host;
	w->classes = classes > 0 ? classes : 0;
	w->h = w->w = w->c = -1;
	if (!(w->f = fopen(path, "wb"))) {
		kiln_status st = host->error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
		free(w->path);
		free(w);
		return st;
	}
	setvbuf(w->f, NULL, _IOFBF, 1u << 20);
	uint8_t zero[REC_SET_END] = { 0 }; /* the header and the set block, written by finish */
	kiln_status st = rec_write(w, zero, sizeof zero);
	if (st) {
		rec_writer_abort(w);
		return st;
	}
	*out = w;
	return KILN_OK;
}

kiln_status rec_writer_add(struct rec_writer *w, int32_t label, int32_t h, int32_t wd,
			   int32_t c, int encoding, const void *payload, size_t n)
{
	const struct kiln_host *host = w->host;
	if (label < 0)
		return host->error(KILN_EINVAL, "%s: record %" PRIu64 ": label %d is negative",
				   w->path, w->count, label);
	if (h <= 0 || wd <= 0 || (c != 1 && c != 3) || (uint64_t)h * (uint64_t)wd > REC_MAX_PIXELS)
		return host->error(KILN_EINVAL, "%s: record %" PRIu64 ": an image of %dx%dx%d cannot be stored (h, w > 0, c = 1 or 3, at most 2^28 pixels)",
				   w->path, w->count, h, wd, c);
	if (encoding < 0 || encoding >= REC_ENCODINGS)
		return host->error(KILN_EINVAL, "%s: record %" PRIu64 ": unknown encoding %d",
				   w->path, w->count, encoding);
	if (encoding == REC_RAW && n != (size_t)h * (size_t)wd * (size_t)c)
		return host->error(KILN_EINVAL, "%s: record %" PRIu64 ": raw payload of %zu bytes for a %dx%dx%d image",
				   w->path, w->count, n, h, wd, c);
	if (n > UINT32_MAX - REC_RECORD_HEADER - REC_ALIGN)
		return host->error(KILN_EINVAL, "%s: record %" PRIu64 ": payload of %zu bytes is larger than a record can hold (4 GiB)",
				   w->path, w->count, n);
	if (w->count == w->index_cap) {
		uint64_t cap = w->index_cap ? w->index_cap * 2 : 1024;
		uint8_t *p = realloc(w->index, (size_t)(cap * REC_INDEX_ENTRY));
		if (!p)
			return host->error(KILN_ENOMEM, "out of memory for the index of %s", w->path);
		w->index = p;
		w->index_cap = cap;
	}

	uint8_t hdr[REC_RECORD_HEADER];
	memset(hdr, 0, sizeof hdr);
	rec_put32(hdr + 0, (uint32_t)label);
	rec_put32(hdr + 4, (uint32_t)h);
	rec_put32(hdr + 8, (uint32_t)wd);
	hdr[12] = (uint8_t)c;
	hdr[13] = (uint8_t)encoding;
	rec_put32(hdr + 16, (uint32_t)n);
	uint32_t crc = host->crc32c(0, hdr, REC_RECORD_CRC_AT);
	rec_put32(hdr + REC_RECORD_CRC_AT, host->crc32c(crc, payload, n));

	uint64_t at = w->offset;
	uint32_t len = (uint32_t)(REC_RECORD_HEADER + n);
	static const uint8_t pad[REC_ALIGN] = { 0 };
	size_t npad = (REC_ALIGN - len % REC_ALIGN) % REC_ALIGN;
	kiln_status st;
	if ((st = rec_write(w, hdr, sizeof hdr)) || (st = rec_write(w, payload, n)) ||
	    (st = rec_write(w, pad, npad)))
		return st;

	uint8_t *e = w->index + w->count * REC_INDEX_ENTRY;
	rec_put64(e, at);
	rec_put32(e + 8, len);
	rec_put32(e + 12, 0);
	w->count++;
	if ((int64_t)label + 1 > w->classes)
		w->classes = (int64_t)label + 1;
	if (w->h < 0) {
		w->h = h, w->w = wd, w->c = c;
	} else {
		if (w->h != h || w->w != wd)
			w->h = w->w = 0;
		if (w->c != c)
			w->c = 0;
	}
	return KILN_OK;
}

uint64_t rec_writer_bytes(const struct rec_writer *w)
{
	return w->offset + w->count * REC_INDEX_ENTRY + 4;
}

uint64_t rec_writer_count(const struct rec_writer *w)
{
	return w->count;
}

static void rec_writer_free(struct rec_writer *w)
{
	free(w->index);
	free(w->path);
	free(w);
}

kiln_status rec_writer_finish(struct rec_writer *w)
{
	const struct kiln_host *host = w->host;
	kiln_status st;
	uint64_t index_at = w->offset;
	uint8_t crc[4], hdr[REC_HEADER_BYTES];

	rec_put32(crc, host->crc32c(0, w->index, (size_t)(w->count * REC_INDEX_ENTRY)));
	if ((st = rec_write(w, w->index, (size_t)(w->count * REC_INDEX_ENTRY))) ||
	    (st = rec_write(w, crc, sizeof crc)))
		goto fail;
	if (w->classes > REC_MAX_CLASSES) { /* (the reader's bound) */
		st = host->error(KILN_EINVAL, "%s: %" PRId64 " classes do not fit the header", w->path,
				 w->classes);
		goto fail;
	}

	memset(hdr, 0, sizeof hdr);
	memcpy(hdr, REC_MAGIC, 8);
	rec_put32(hdr + 8, REC_VERSION);
	rec_put32(hdr + 12, REC_HEADER_BYTES);
	rec_put64(hdr + 16, w->count);
	rec_put64(hdr + 24, index_at);
	rec_put64(hdr + 32, w->offset);
	rec_put32(hdr + 40, 0); /* flags */
	rec_put32(hdr + 44, (uint32_t)w->classes);
	rec_put32(hdr + 48, (uint32_t)(w->h > 0 ? w->h : 0));
	rec_put32(hdr + 52, (uint32_t)(w->w > 0 ? w->w : 0));
	hdr[56] = (uint8_t)(w->c > 0 ? w->c : 0);
	hdr[REC_MINOR_AT] = REC_MINOR;
	rec_put32(hdr + REC_HEADER_CRC_AT, host->crc32c(0, hdr, REC_HEADER_CRC_AT));
	/* the set block: nothing recorded (count 0) until rec_shard_stamp */
	uint8_t set[REC_SET_END - REC_SET_AT] = { 0 };
	rec_put32(set + 12, host->crc32c(0, set, REC_SET_CRC_AT - REC_SET_AT));
	if (fseek(w->f, 0, SEEK_SET) || fwrite(hdr, 1, sizeof hdr, w->f) != sizeof hdr ||
	    fwrite(set, 1, sizeof set, w->f) != sizeof set || fflush(w->f) || fsync(fileno(w->f))) {
		st = host->error(KILN_EIO, "%s: cannot write: %s", w->path, strerror(errno));
		goto fail;
	}
	if (fclose(w->f)) {
		w->f = NULL;
		st = host->error(KILN_EIO, "%s: cannot write: %s", w->path, strerror(errno));
		goto fail;
	}
	rec_writer_free(w);
	return KILN_OK;

fail:
	rec_writer_abort(w);
	return st;
}

void rec_writer_abort(struct rec_writer *w)
{
	if (!w)
		return;
	if (w->f)
		fclose(w->f);
	unlink(w->path);
	rec_writer_free(w);
}

kiln_status rec_shard_stamp(const struct kiln_host *host, const char *path, uint32_t index,
			    uint32_t count, uint32_t pack)
{
	uint8_t hdr[REC_HEADER_BYTES], set[REC_SET_END - REC_SET_AT];
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return host->error(KILN_EIO, "%s: cannot open: %s", path, strerror(errno));
	/* (a file of rec_writer_finish: its header has room for the block) */
	if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr || hdr[REC_MINOR_AT] < 1) {
		close(fd);
		return host->error(KILN_EIO, "%s: cannot record the shard's pack: not a finished shard",
				   path);
	}
	rec_put32(set + 0, index);
	rec_put32(set + 4, count);
	rec_put32(set + 8, pack);
	rec_put32(set + 12, host->crc32c(0, set, REC_SET_CRC_AT - REC_SET_AT));
	if (common_pwrite_full(fd, set, sizeof set, REC_SET_AT) || fsync(fd)) {
		kiln_status st = host->error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
		close(fd);
		return st;
	}
	if (close(fd))
		return host->error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
	return KILN_OK;
}
