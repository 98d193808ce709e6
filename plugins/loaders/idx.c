/* plugins/loaders/idx.c - the `idx` data source: MNIST-format IDX files.
 *
 * An IDX file is a big-endian header followed by the raw elements:
 *
 *   u32 magic   0x000008NN: two zero bytes, element type 0x08 (u8), NN dims
 *   u32 dims[NN]
 *   u8  data[dims[0] * ... * dims[NN-1]]
 *
 * Images are 0x00000803 (u8 [N, rows, cols]) and labels 0x00000801
 * (u8 [N]).  Both files are read whole into memory at open(), gzipped
 * ones inflated by zlib (idx_stream), so that both are read alike.  read_image() hands the
 * core the stored bytes as a u8 [rows, cols, 1] image (the trainer then
 * applies the [data] transforms); read() gives the older finished sample,
 * f32 [1, rows, cols], x = (u8/255 - mean)/std (`mean` and `std` are the
 * core's [data] keys, read here as single numbers, 0 and 1 when unset),
 * for callers of the plugin API.  Labels are i32 scalars.  Both only read
 * the loaded arrays, so they are thread-safe.
 *
 * Nothing in a file is trusted: every size is checked against what the
 * header promised, the total against IDX_MAX_BYTES and, gzipped, against
 * what the file can inflate to (IDX_GZ_RATIO times its size), bytes after
 * the promised data are an error, and buffers grow only as data actually
 * arrives, so a corrupt header cannot make open() allocate more than the
 * file holds.
 */
#include "loaders.h"
#include "idx_cache.h"
#include "../common/cache_file.h" /* common_cache_path */
#include "../common/open_file.h" /* common_open_file */
#include "../common/norm_lut.h"  /* common_norm_lut */
#include "../common/c_locale.h"  /* common_strtod */

#include <errno.h>    /* errno, ENOENT */
#include <fcntl.h>    /* open */
#include <inttypes.h> /* PRIu64, PRId64 */
#include <limits.h>   /* PATH_MAX */
#include <math.h>     /* isfinite */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* malloc, realloc, free */
#include <string.h>   /* strerror, strcmp */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* close, access */
#include <zlib.h>     /* inflate */

#define IDX_WHO "idx"
#define IDX_MAGIC_LABELS 0x00000801u /* u8, 1 dim */
#define IDX_MAGIC_IMAGES 0x00000803u /* u8, 3 dims */
#define IDX_MAX_BYTES ((uint64_t)1 << 34) /* 16 GiB: anything larger is a corrupt header */
#define IDX_FIRST_CHUNK ((uint64_t)1 << 20) /* first buffer; doubles as data arrives */
#define IDX_GZ_RATIO 1032 /* deflate inflates a byte to at most 1032 bytes */
#define IDX_CACHE_MIN ((off_t)1 << 20) /* smaller gzip files inflate in a few ms: no copy */

/* One loaded file. */
struct idx_file {
	char path[PATH_MAX];
	uint8_t *data;     /* u8 [dims[0] * ... * dims[ndim-1]] */
	uint64_t dims[3];
	int ndim;
	uint64_t bytes;
	struct idx_cache_map map; /* data lies in map when map.base is set */
};

struct idx_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	struct idx_file images; /* u8 [n, rows, cols] */
	struct idx_file labels; /* u8 [n] */
	int64_t rows, cols;
	float lut[256];         /* lut[u] = (u/255 - mean)/std */
};

/* ---- reading, gzipped or not ----------------------------------------- */

/* The file's bytes read with loaders_pread_full, which retries EINTR and
 * short reads, and inflated by zlib from that buffer when the file is gzip:
 * member after member as gzread reads them (bytes after the last member
 * that do not begin another are ignored, as gzread ignores them); a file
 * that does not start with gzip's magic is read as it is (gzread's
 * "direct" mode).  Before session 37 this was gzread, whose read() loop
 * takes EINTR for a read error (Z_ERRNO: "cannot read the image file:
 * Interrupted system call", exit 3) and drops what it had read before it. */
struct idx_stream {
	int fd;
	uint64_t off;          /* the file's next byte to read */
	int direct;            /* not gzip: the bytes as they are */
	int in_eof;            /* the file's end reached */
	int ended;             /* the last member's trailer checked, nothing follows */
	int cut;               /* the file ended inside a member */
	z_stream z;            /* (next_in, avail_in: the unread part of in) */
	unsigned char in[1 << 17];
};

/* A stream over fd (taken: closed by idx_stream_close, or here on failure). */
static kiln_status idx_stream_open(const struct kiln_host *host, int fd, const char *path,
				   const char *what, struct idx_stream **out)
{
	unsigned char m[2];
	struct idx_stream *s = calloc(1, sizeof *s);
	*out = NULL;
	if (!s) {
		close(fd);
		return host->error(KILN_ENOMEM, "%s: cannot open the %s: out of memory", path, what);
	}
	s->fd = fd;
	ssize_t r = loaders_pread_full(fd, m, 2, 0);
	if (r < 0) {
		kiln_status st = host->error(KILN_EIO, "%s: cannot read the %s: %s", path, what,
					     strerror(errno));
		close(fd);
		free(s);
		return st;
	}
	s->direct = r < 2 || m[0] != 0x1f || m[1] != 0x8b;
	if (!s->direct && inflateInit2(&s->z, 15 + 16) != Z_OK) { /* gzip only */
		close(fd);
		free(s);
		return host->error(KILN_ENOMEM, "%s: cannot open the %s: out of memory", path, what);
	}
	*out = s;
	return KILN_OK;
}

static void idx_stream_close(struct idx_stream *s)
{
	if (!s)
		return;
	if (!s->direct)
		inflateEnd(&s->z);
	close(s->fd);
	free(s);
}

/* At least `want` (1 or 2) unread input bytes in s->in unless the file
 * ends first; the unread ones are moved to the front. */
static kiln_status idx_stream_fill(const struct kiln_host *host, struct idx_stream *s,
				   unsigned want, const char *path, const char *what)
{
	while (s->z.avail_in < want && !s->in_eof) {
		if (s->z.avail_in)
			memmove(s->in, s->z.next_in, s->z.avail_in);
		s->z.next_in = s->in;
		ssize_t r = loaders_pread_full(s->fd, s->in + s->z.avail_in,
					       sizeof s->in - s->z.avail_in, s->off);
		if (r < 0)
			return host->error(KILN_EIO, "%s: cannot read the %s: %s", path, what,
					   strerror(errno));
		s->in_eof = r == 0;
		s->off += (uint64_t)r;
		s->z.avail_in += (unsigned)r;
	}
	return KILN_OK;
}

/* A member ended: the next begins (gzip's magic follows) or the stream
 * has ended (the file's end, or bytes that are not a member). */
static kiln_status idx_stream_next_member(const struct kiln_host *host, struct idx_stream *s,
					  const char *path, const char *what)
{
	kiln_status st = idx_stream_fill(host, s, 2, path, what);
	if (st)
		return st;
	if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f && s->z.next_in[1] == 0x8b)
		return inflateReset(&s->z) == Z_OK
			       ? KILN_OK
			       : host->error(KILN_EDATA, "%s: corrupt gzip stream in the %s: internal error: inflate stream corrupt",
					     path, what);
	s->ended = 1;
	return KILN_OK;
}

/* Inflate up to n bytes into buf (*got: how many). */
static kiln_status idx_stream_inflate(const struct kiln_host *host, struct idx_stream *s,
				      const char *path, const char *what, uint8_t *buf, uint64_t n,
				      uint64_t *got)
{
	kiln_status st;
	*got = 0;
	while (*got < n && !s->ended && !s->cut) {
		if ((st = idx_stream_fill(host, s, 1, path, what)))
			return st;
		if (!s->z.avail_in) {
			s->cut = 1; /* zlib's "unexpected end of file" */
			break;
		}
		uint64_t want = n - *got;
		s->z.next_out = buf + *got;
		s->z.avail_out = want > (1u << 30) ? 1u << 30 : (unsigned)want;
		int ret = inflate(&s->z, Z_NO_FLUSH);
		*got += (uint64_t)(s->z.next_out - (buf + *got));
		if (ret == Z_STREAM_END) {
			if ((st = idx_stream_next_member(host, s, path, what)))
				return st;
		} else if (ret == Z_MEM_ERROR) {
			return host->error(KILN_ENOMEM, "%s: out of memory decompressing the %s", path,
					   what);
		} else if (ret == Z_DATA_ERROR) {
			return host->error(KILN_EDATA, "%s: corrupt gzip stream in the %s: %s", path, what,
					   s->z.msg ? s->z.msg : "compressed data error");
		} else if (ret != Z_OK && ret != Z_BUF_ERROR) {
			return host->error(KILN_EDATA, "%s: corrupt gzip stream in the %s: internal error: inflate stream corrupt",
					   path, what);
		}
	}
	return KILN_OK;
}

/* Read up to n bytes into buf; *got receives how many arrived before the end
 * of the file.  A decompression or system error is an error; a plain short
 * read is not (the caller knows what it expected).  *cut is set when the
 * gzip stream itself ended early (zlib's "unexpected end of file"). */
static kiln_status idx_read_bytes(const struct kiln_host *host, struct idx_stream *s,
				  const char *path, const char *what, void *buf, uint64_t n,
				  uint64_t *got, int *cut)
{
	*got = 0;
	*cut = 0;
	if (!s->direct) {
		kiln_status st = idx_stream_inflate(host, s, path, what, buf, n, got);
		*cut = s->cut;
		return st;
	}
	ssize_t r = loaders_pread_full(s->fd, buf, (size_t)n, s->off);
	if (r < 0)
		return host->error(KILN_EIO, "%s: cannot read the %s: %s", path, what,
				   strerror(errno));
	s->off += (uint64_t)r;
	*got = (uint64_t)r;
	return KILN_OK;
}

static uint32_t idx_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Why a magic number is wrong, in words, for the error message. */
static const char *idx_magic_hint(uint32_t found, uint32_t expected)
{
	uint32_t swapped = (found >> 24) | ((found >> 8) & 0xff00u) | ((found << 8) & 0xff0000u) |
			   (found << 24);
	if (found == IDX_MAGIC_LABELS && expected == IDX_MAGIC_IMAGES)
		return " (this is an IDX label file: are `images` and `labels` swapped?)";
	if (found == IDX_MAGIC_IMAGES && expected == IDX_MAGIC_LABELS)
		return " (this is an IDX image file: are `images` and `labels` swapped?)";
	if (swapped == expected)
		return " (byte-swapped: the header was written little-endian)";
	if ((found & 0xffff0000u) == 0 && ((found >> 8) & 0xff) != 0x08)
		return " (an IDX file of another element type; only u8 (0x08) is supported)";
	if ((found & 0xffff0000u) == 0 && ((found >> 8) & 0xff) == 0x08)
		return " (an IDX u8 file with another number of dimensions)";
	return " (not an IDX file)";
}

/* Check the IDX header hdr (got bytes of it arrived; cut: the gzip stream
 * ended early) of the file `path` against `magic`, and fill f's dims and
 * ndim; *total receives the data bytes it promises.  `most` is the most
 * the file can hold (gzip's limit), UINT64_MAX when not limited. */
static kiln_status idx_check_header(const struct kiln_host *host, const char *path,
				    const char *what, const uint8_t *hdr, uint64_t got, int cut,
				    uint32_t magic, uint64_t most, uint64_t gz_size,
				    struct idx_file *f, uint64_t *total)
{
	int ndim = (int)(magic & 0xff);
	size_t hdr_bytes = 4 + 4 * (size_t)ndim;
	if (got == 0)
		return host->error(KILN_EDATA, "%s: the %s is empty (expected an IDX header of %zu bytes)",
				   path, what, hdr_bytes);
	if (got >= 4 && idx_be32(hdr) != magic) {
		uint32_t found = idx_be32(hdr);
		return host->error(KILN_EDATA, "%s: wrong magic number for an IDX %s: found 0x%08x, expected 0x%08x%s",
				   path, what, found, magic, idx_magic_hint(found, magic));
	}
	if (got < hdr_bytes)
		return host->error(KILN_EDATA, "%s: truncated header of the %s: expected %zu bytes, found %" PRIu64 "%s",
				   path, what, hdr_bytes, got, cut ? " (the gzip stream ends early)" : "");
	char dims[64];
	int dl = 0;
	for (int d = 0; d < ndim; d++)
		dl += snprintf(dims + dl, sizeof dims - (size_t)dl, "%s%u", d ? " x " : "",
			       idx_be32(hdr + 4 + 4 * d));
	*total = 1;
	f->ndim = ndim;
	for (int d = 0; d < ndim; d++) {
		f->dims[d] = idx_be32(hdr + 4 + 4 * d);
		if (f->dims[d] == 0)
			return host->error(KILN_EDATA, "%s: the %s has a zero-sized dimension %d (header dims %s)",
					   path, what, d, dims);
		/* total <= IDX_MAX_BYTES here; divide rather than multiply so the
		 * check itself cannot wrap */
		if (f->dims[d] > IDX_MAX_BYTES / *total)
			return host->error(KILN_EDATA, "%s: absurd size in the header of the %s: dims %s need more than %" PRIu64 " bytes; the header is corrupt",
					   path, what, dims, IDX_MAX_BYTES);
		*total *= f->dims[d];
	}
	/* gzipped, what the file can hold is at most IDX_GZ_RATIO times its
	 * size (deflate's limit): a header that claims more is refused now,
	 * before anything is inflated (a plain file's truncation is found by
	 * the reads, which never hold more than the file) */
	if (*total > most)
		return host->error(KILN_EDATA, "%s: the header of the %s promises %" PRIu64 " bytes (dims %s), but a gzip file of %" PRIu64 " bytes inflates to at most %" PRIu64 ": the header is corrupt or the file truncated",
				   path, what, *total, dims, gz_size, most);
	if (*total > SIZE_MAX)
		return host->error(KILN_EDATA, "%s: the %s (%" PRIu64 " bytes) does not fit this address space",
				   path, what, *total);
	return KILN_OK;
}

/* No folder for a gzip file's inflated copy (idx_cache_dir): said once
 * a process (every source opens files), and only where a file is big
 * enough to be kept: plain files and small gzip files are never cached. */
static void idx_note_no_cache(const struct kiln_host *host)
{
	static int noted;
	char why[300];
	if (!__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED)) {
		common_cache_note(why, sizeof why);
		host->log(KILN_LOG_INFO, "idx", "unzip cache: %s", why);
	}
}

/* Whether fd's file starts with gzip's magic bytes. */
static int idx_is_gzip(int fd)
{
	uint8_t m[2];
	return loaders_pread_full(fd, m, 2, 0) == 2 && m[0] == 0x1f && m[1] == 0x8b;
}

/* Serve f from the verified inflated copy of the gzip file `path` kept
 * under cache_dir: 1 when it did (fd closed), 0 when the caller inflates. */
static int idx_load_cached(const struct kiln_host *host, const char *path, uint32_t magic,
			   const char *what, const char *cache_dir, const struct stat *sb,
			   int fd, struct idx_file *f)
{
	size_t hdr_bytes = 4 + 4 * (size_t)(magic & 0xff);
	uint64_t total = 0;
	if (!idx_cache_open(host, cache_dir, path, sb, &f->map))
		return 0;
	const struct idx_cache_map *m = &f->map;
	/* the copy's bytes were checked when it was made and match its CRC;
	 * a header this role refuses falls back to inflating, which names
	 * the fault in the gzip file itself */
	if (idx_check_header(host, path, what, m->raw, m->raw_len < hdr_bytes ? m->raw_len : hdr_bytes,
			     0, magic, UINT64_MAX, 0, f, &total) ||
	    total != m->raw_len - hdr_bytes) {
		idx_cache_close(&f->map);
		return 0;
	}
	f->data = (uint8_t *)m->raw + hdr_bytes; /* read only: PROT_READ */
	f->bytes = total;
	close(fd);
	return 1;
}

/* Where an IDX file's name came from, for one that is not there
 * (loaders_no_such_file): the key's place, and for a standard name the
 * other name tried. */
struct idx_named {
	char at[PATH_MAX + 64];
	char also[PATH_MAX + 64];
};

/* Load the whole IDX file `path` into f: magic must be `magic` (which
 * fixes ndim), dims non-zero, and the data complete.  `what` names the
 * file's role ("image file") in messages; `hint` is appended to an open
 * failure (other names tried); `named` names the key for a file not there
 * (KILN_ECONFIG, exit 2; KILN_EIO before session 37).  A gzip file of at least IDX_CACHE_MIN
 * bytes is served from its inflated copy under cache_dir (NULL: none) when
 * one is valid, and leaves one there when not (no_home: cache_dir is NULL
 * because no folder could be named, said for such a file).  On failure f
 * holds nothing to free. */
/* Open the IDX file `path` for idx_load or idx_peek: *fd, its size in
 * sb->st_size; the errors idx_load's (see there). */
static kiln_status idx_open_file(const struct kiln_host *host, const char *path, const char *what,
				 const char *hint, const struct idx_named *named, int *fd,
				 struct stat *sb)
{
	char kind[64];
	const char *why;
	*fd = common_open_file(path, kind, sizeof kind, &why, &sb->st_size);
	if (*fd < 0 && loaders_missing(errno)) { /* a file the config names: exit 2 */
		char w[PATH_MAX + 100];
		snprintf(w, sizeof w, "the %s%s", what, named->also);
		return loaders_no_such_file(host, named->at, path, w);
	}
	if (*fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the %s: %s%s", path, what, why,
				   errno == EINVAL || !hint ? "" : hint);
	return KILN_OK;
}

/* Read and check the header of the IDX file behind gz (sb: its fstat):
 * hdr receives it (4 + 4 x ndim bytes), f its dims, *total the data
 * bytes it promises. */
static kiln_status idx_read_header(const struct kiln_host *host, struct idx_stream *gz,
				   const char *path, const char *what, uint32_t magic,
				   const struct stat *sb, uint8_t *hdr, struct idx_file *f,
				   uint64_t *total)
{
	uint64_t got = 0;
	int cut = 0;
	kiln_status st = idx_read_bytes(host, gz, path, what, hdr, 4 + 4 * (uint64_t)(magic & 0xff),
					&got, &cut);
	if (st)
		return st;
	uint64_t most = gz->direct ? UINT64_MAX : (uint64_t)sb->st_size * IDX_GZ_RATIO;
	return idx_check_header(host, path, what, hdr, got, cut, magic, most,
				(uint64_t)sb->st_size, f, total);
}

static kiln_status idx_load(const struct kiln_host *host, const char *path, uint32_t magic,
			    const char *what, const char *hint, const struct idx_named *named,
			    const char *cache_dir, int no_home, struct idx_file *f)
{
	int ndim = (int)(magic & 0xff);
	uint8_t hdr[4 + 4 * 3];
	size_t hdr_bytes = 4 + 4 * (size_t)ndim;
	uint64_t got = 0, total = 0;
	int cut = 0, fd;
	kiln_status st;
	struct stat sb;

	memset(f, 0, sizeof *f);
	snprintf(f->path, sizeof f->path, "%s", path);
	if ((st = idx_open_file(host, path, what, hint, named, &fd, &sb)))
		return st;
	int cache = (cache_dir || no_home) && !fstat(fd, &sb) && sb.st_size >= IDX_CACHE_MIN &&
		    idx_is_gzip(fd);
	if (cache && !cache_dir)
		idx_note_no_cache(host);
	cache = cache && cache_dir;
	if (cache && idx_load_cached(host, path, magic, what, cache_dir, &sb, fd, f))
		return KILN_OK;
	struct idx_stream *gz;
	if ((st = idx_stream_open(host, fd, path, what, &gz)))
		return st;

	/* ---- header ---- */
	if ((st = idx_read_header(host, gz, path, what, magic, &sb, hdr, f, &total)))
		goto fail;

	/* ---- data: grow the buffer only as bytes arrive ---- */
	uint64_t cap = total < IDX_FIRST_CHUNK ? total : IDX_FIRST_CHUNK;
	f->data = malloc((size_t)cap);
	if (!f->data) {
		st = host->error(KILN_ENOMEM, "%s: out of memory for the %s (%" PRIu64 " bytes)", path,
				 what, cap);
		goto fail;
	}
	uint64_t have = 0;
	for (;;) {
		if ((st = idx_read_bytes(host, gz, path, what, f->data + have, cap - have, &got,
					 &cut)))
			goto fail;
		have += got;
		if (have < cap || cap == total)
			break;
		uint64_t ncap = cap * 2 < total ? cap * 2 : total;
		uint8_t *nd = realloc(f->data, (size_t)ncap);
		if (!nd) {
			st = host->error(KILN_ENOMEM, "%s: out of memory for the %s (%" PRIu64 " bytes)",
					 path, what, ncap);
			goto fail;
		}
		f->data = nd;
		cap = ncap;
	}
	if (have < total) {
		st = host->error(KILN_EDATA, "%s: truncated data in the %s: the header promises %" PRIu64 " bytes, found %" PRIu64 "%s",
				 path, what, total, have, cut ? " (the gzip stream ends early)" : "");
		goto fail;
	}
	f->bytes = total;

	/* One more read: makes zlib check the gzip trailer (CRC and length) and
	 * tells whether anything follows the data. */
	uint8_t extra;
	if ((st = idx_read_bytes(host, gz, path, what, &extra, 1, &got, &cut)))
		goto fail;
	if (cut) {
		st = host->error(KILN_EDATA, "%s: corrupt gzip stream in the %s: it ends before its trailer",
				 path, what);
		goto fail;
	}
	if (got) {
		st = host->error(KILN_EDATA, "%s: the %s holds more than the %" PRIu64 " data bytes its header promises (trailing bytes: the header is corrupt, or another file was appended)",
				 path, what, total);
		goto fail;
	}
	idx_stream_close(gz);
	if (cache)
		idx_cache_save(host, cache_dir, path, &sb, hdr, hdr_bytes, f->data, total);
	return KILN_OK;

fail:
	free(f->data);
	f->data = NULL;
	idx_stream_close(gz);
	return st;
}

/* The folder of the inflated copies: [section] unzip_cache, else
 * $XDG_CACHE_HOME/kiln/idx (~/.cache/kiln/idx); NULL for `none` or when
 * no folder can be named (*unnamed 1: no HOME or XDG_CACHE_HOME names
 * one, which idx_note_no_cache says when a file would have been kept).
 * buf holds n bytes. */
static const char *idx_cache_dir(const struct kiln_host *host, const struct kiln_config *cfg,
				 const char *section, char *buf, size_t n, int *unnamed)
{
	const char *v = host->config_get(cfg, section, "unzip_cache");
	*unnamed = 0;
	if (v && !strcmp(v, "none"))
		return NULL;
	if (v && *v) {
		snprintf(buf, n, "%s", v);
		return buf;
	}
	if (!common_cache_path(buf, n, "idx"))
		return buf;
	*unnamed = errno == ENOENT;
	return NULL;
}

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key idx_keys[] = {
	{ "path", KILN_KEY_STR, "/usr/share/datasets/fashion-mnist", 0, 0, NULL,
	  "Directory holding the IDX files; `images` and `labels` are relative to it. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "images", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Image file (IDX u8 [N, rows, cols], gzipped or not), relative to `path` or absolute. Unset: train-images-idx3-ubyte.gz for split train, t10k-images-idx3-ubyte.gz for split test (the name without .gz when only that exists). A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "labels", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Label file (IDX u8 [N]), relative to `path` or absolute. Unset: train-labels-idx1-ubyte.gz or t10k-labels-idx1-ubyte.gz by split. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "split", KILN_KEY_ENUM, NULL, 0, 0, "train|test",
	  "Which standard file names to use when `images`/`labels` are unset. Unset: the split the run asks for (train for [data], test for [data.eval]); [data.eval] never inherits it from [data]." },
	{ "unzip_cache", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Folder where the inflated copy of a gzipped file of 1 MiB or more is kept, so later runs map it instead of inflating it again (one file per source path, used only when the source's path, size, mtime and inode match and its CRC32C checks; a corrupt or truncated copy is rebuilt with a warning). Unset: $XDG_CACHE_HOME/kiln/idx, else ~/.cache/kiln/idx; `none`: inflate on every run." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* A string key, or `fallback` when unset (also when the config was not
 * validated against the registry, so it does not know our defaults). */
static const char *idx_key_str(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *key, const char *fallback)
{
	const char *v = host->config_get(cfg, section, key);
	return v ? v : fallback;
}

/* `mean` or `std`: one number, the images having one channel ([data]'s
 * keys, which may list one per channel of 3-channel data: a count that is
 * not one is named as such). */
static kiln_status idx_key_channel(const struct kiln_host *host, const struct kiln_config *cfg,
				   const char *section, const char *key, double fallback,
				   double *out)
{
	const char *v = host->config_get(cfg, section, key), *p = v;
	int n = 0;
	if (!v) {
		*out = fallback;
		return KILN_OK;
	}
	for (;;) {
		char *end;
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		if (!*p)
			break;
		double d = common_strtod(p, &end);
		if (end == p || (*end && *end != ' ' && *end != '\t' && *end != ','))
			return host->error(KILN_ECONFIG, "%s: [%s] %s = '%s' is not a number",
					   host->config_where(cfg, section, key), section, key, v);
		if (!n++)
			*out = d;
		p = end;
	}
	if (n != 1)
		return host->error(KILN_ECONFIG, "%s: [%s] %s = '%s' gives %d values, but the idx source's images have 1 channel: give one number",
				   host->config_where(cfg, section, key), section, key, v, n);
	return KILN_OK;
}

/* Join dir and name into out unless name is absolute. */
static kiln_status idx_join(const struct kiln_host *host, const char *section, const char *key,
			    const char *dir, const char *name, char *out, size_t n)
{
	int len;
	size_t dl = strlen(dir);
	if (name[0] == '/' || !dl)
		len = snprintf(out, n, "%s", name);
	else
		len = snprintf(out, n, "%s%s%s", dir, dir[dl - 1] == '/' ? "" : "/", name);
	if (len < 0 || (size_t)len >= n)
		return host->error(KILN_ECONFIG, "[%s] %s: the path %s/%s is too long", section, key,
				   dir, name);
	return KILN_OK;
}

/* The file of `key` ("images"/"labels"): the key's value, else the split's
 * standard name (`std_gz`, or without ".gz" when only that exists).  `hint`
 * receives words for an open failure, *nd those for a file not there. */
static kiln_status idx_resolve(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *key, const char *dir,
			       const char *split, const char *std_gz, char *out, size_t n,
			       char *hint, size_t hn, struct idx_named *nd)
{
	const char *name = idx_key_str(host, cfg, section, key, NULL);
	kiln_status st;
	hint[0] = 0;
	nd->also[0] = 0;
	/* the key that named the file: its own, else path (the directory) */
	loaders_key_at(host, cfg, section, name && *name ? key : "path", nd->at, sizeof nd->at);
	if (name && *name) {
		if ((st = idx_join(host, section, key, dir, name, out, n)))
			return st;
		snprintf(hint, hn, " ([%s] %s = %s, set at %s)", section, key, name,
			 host->config_where(cfg, section, key));
		return KILN_OK;
	}
	if (!std_gz)
		return host->error(KILN_ECONFIG, "[%s] %s is not set and split '%s' has no standard file names (train or test); set %s",
				   section, key, split ? split : "(none)", key);
	if ((st = idx_join(host, section, key, dir, std_gz, out, n)))
		return st;
	if (access(out, F_OK) != 0 && errno == ENOENT) {
		char plain[PATH_MAX];
		size_t len = strlen(out);
		memcpy(plain, out, len - 3); /* std_gz ends in ".gz" */
		plain[len - 3] = 0;
		if (access(plain, F_OK) == 0) {
			snprintf(out, n, "%s", plain);
			return KILN_OK;
		}
		/* where the directory was set, as folder, tar and lmdb say */
		char wbuf[4200];
		const char *w = loaders_where_said(host, cfg, section, "path", wbuf, sizeof wbuf);
		snprintf(hint, hn, " (also tried %s; [%s] path = %s, %s; set path, or %s)", plain,
			 section, dir, w, key);
		snprintf(nd->also, sizeof nd->also, "; also tried %s; set path, or %s", plain, key);
	}
	return KILN_OK;
}

/* ---- the source ------------------------------------------------------- */

static void idx_file_free(struct idx_file *f)
{
	if (f->map.base)
		idx_cache_close(&f->map);
	else
		free(f->data);
	f->data = NULL;
}

static void idx_close(void *vctx)
{
	struct idx_ctx *c = vctx;
	if (!c)
		return;
	idx_file_free(&c->images);
	idx_file_free(&c->labels);
	free(c);
}

/* idx_open's paths and hints, on the heap: 21 KiB on the stack of a loader
 * or an application thread (the frame cap, docs/design-notes.md). */
struct idx_names {
	char img[PATH_MAX], lab[PATH_MAX], ihint[PATH_MAX + 200], lhint[PATH_MAX + 200];
	struct idx_named inamed, lnamed;
	char cache_buf[PATH_MAX];
};

/* The keys idx_open reads (mean, sd) and checks, and the files' names
 * into nm. */
static kiln_status idx_keys_read(const struct kiln_host *host, const struct kiln_config *cfg,
				 const char *section, const char *split, struct idx_names *nm,
				 double *mean_out, double *sd_out)
{
	char *const img = nm->img, *const lab = nm->lab, *const ihint = nm->ihint,
		    *const lhint = nm->lhint;
	double mean, sd;
	kiln_status st;
	const char *dir = idx_key_str(host, cfg, section, "path", idx_keys[0].def);
	split = idx_key_str(host, cfg, section, "split", split);
	if ((st = idx_key_channel(host, cfg, section, "mean", 0.0, &mean)) ||
	    (st = idx_key_channel(host, cfg, section, "std", 1.0, &sd)))
		return st;
	if (!isfinite(mean) || !isfinite(sd) || !(sd >= 1e-12))
		return host->error(KILN_ECONFIG, "%s: [%s] mean = %g, std = %g: both must be finite and std at least 1e-12",
				   host->config_where(cfg, section, "std"), section, mean, sd);
	if (!common_norm_fits(mean, sd))
		return host->error(KILN_ECONFIG, "%s: [%s] mean = %g, std = %g: (u8/255 - mean) / std is not finite in f32 (mean must be an f32 number and the normalised values within +-3.4e38)",
				   host->config_where(cfg, section, "std"), section, mean, sd);

	int train = split && !strcmp(split, "train"), test = split && !strcmp(split, "test");
	if ((st = idx_resolve(host, cfg, section, "images", dir, split,
			      train ? "train-images-idx3-ubyte.gz" : test ? "t10k-images-idx3-ubyte.gz" : NULL,
			      img, sizeof nm->img, ihint, sizeof nm->ihint, &nm->inamed)) ||
	    (st = idx_resolve(host, cfg, section, "labels", dir, split,
			      train ? "train-labels-idx1-ubyte.gz" : test ? "t10k-labels-idx1-ubyte.gz" : NULL,
			      lab, sizeof nm->lab, lhint, sizeof nm->lhint, &nm->lnamed)))
		return st;
	*mean_out = mean;
	*sd_out = sd;
	return KILN_OK;
}

static kiln_status idx_open_named(const struct kiln_host *host, const struct kiln_config *cfg,
				  const char *section, const char *split, struct idx_names *nm,
				  void **out)
{
	const char *const img = nm->img, *const lab = nm->lab;
	double mean, sd;
	kiln_status st;

	*out = NULL;
	if ((st = idx_keys_read(host, cfg, section, split, nm, &mean, &sd)))
		return st;
	struct idx_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	int no_home;
	const char *cache_dir = idx_cache_dir(host, cfg, section, nm->cache_buf,
					      sizeof nm->cache_buf, &no_home);
	if ((st = idx_load(host, img, IDX_MAGIC_IMAGES, "image file", nm->ihint, &nm->inamed, cache_dir,
			   no_home, &c->images)) ||
	    (st = idx_load(host, lab, IDX_MAGIC_LABELS, "label file", nm->lhint, &nm->lnamed, cache_dir,
			   no_home, &c->labels)))
		goto fail;
	if (c->images.dims[0] != c->labels.dims[0]) {
		st = host->error(KILN_EDATA, "count mismatch: the image file %s has %" PRIu64 " images but the label file %s has %" PRIu64 " labels",
				 img, c->images.dims[0], lab, c->labels.dims[0]);
		goto fail;
	}
	c->src.n = (int64_t)c->images.dims[0];
	c->rows = (int64_t)c->images.dims[1];
	c->cols = (int64_t)c->images.dims[2];
	int max = 0;
	int64_t at = 0; /* the first sample of the largest label */
	for (int64_t i = 0; i < c->src.n; i++)
		if (c->labels.data[i] > max) {
			max = c->labels.data[i];
			at = i;
		}
	c->src.classes = max + 1;
	/* The normalisation of every byte value, computed once (f32, as
	 * the host transforms and NORMALIZE_U8 compute it) */
	common_norm_lut(c->lut, (float)mean, (float)sd);
	host->log(KILN_LOG_INFO, IDX_WHO, "[%s] %s: %" PRId64 " samples of %" PRId64 "x%" PRId64 ", %" PRId64 " classes (labels %s: the largest, %d, first at sample %" PRId64 ")",
		  section, img, c->src.n, c->rows, c->cols, c->src.classes, lab, max, at);
	c->src.who = c->images.path;
	*out = c;
	return KILN_OK;

fail:
	idx_close(c);
	return st;
}

static kiln_status idx_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	struct idx_names *nm = malloc(sizeof *nm);
	*out = NULL;
	if (!nm)
		return host->error(KILN_ENOMEM, "out of memory");
	const kiln_status st = idx_open_named(host, cfg, section, split, nm, out);
	free(nm);
	return st;
}

static kiln_status idx_info(void *vctx, struct kiln_source_info *info)
{
	const struct idx_ctx *c = vctx;
	loaders_varying_info(vctx, info);
	loaders_fixed_info(info, KILN_F32, 1, c->rows, c->cols, (int32_t)c->rows, (int32_t)c->cols,
			   1);
	return KILN_OK;
}

/* What idx_info says after idx_open (version 5): the keys checked as
 * idx_open checks them, then the image file's header alone (a gzip
 * file's first block inflated): not its images, nor the label file,
 * which the image size needs neither of (idx_open reads both whole: 47
 * MB inflated for Fashion-MNIST's training set). */
static kiln_status idx_peek(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, struct kiln_source_info *info)
{
	struct idx_names *nm = malloc(sizeof *nm);
	struct idx_file f = { 0 };
	struct idx_stream *gz = NULL;
	struct stat sb;
	uint8_t hdr[4 + 4 * 3];
	uint64_t total;
	double mean, sd;
	int fd;
	if (!nm)
		return host->error(KILN_ENOMEM, "out of memory");
	kiln_status st = idx_keys_read(host, cfg, section, split, nm, &mean, &sd);
	if (!st && !(st = idx_open_file(host, nm->img, "image file", nm->ihint, &nm->inamed, &fd,
					&sb)) &&
	    !(st = idx_stream_open(host, fd, nm->img, "image file", &gz)))
		st = idx_read_header(host, gz, nm->img, "image file", IDX_MAGIC_IMAGES, &sb, hdr, &f,
				     &total);
	idx_stream_close(gz);
	free(nm);
	if (st)
		return st;
	const struct loaders_source none = { .host = host }; /* len, classes: not read */
	loaders_varying_info((void *)&none, info);
	loaders_fixed_info(info, KILN_F32, 1, (int64_t)f.dims[1], (int64_t)f.dims[2],
			   (int32_t)f.dims[1], (int32_t)f.dims[2], 1);
	return KILN_OK;
}

/* sample: f32 [1, rows, cols]; label: i32 [].  Either may be NULL. */
static kiln_status idx_read(void *vctx, int64_t index, void *sample, void *label)
{
	const struct idx_ctx *c = vctx;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	if (sample) {
		int64_t per = c->rows * c->cols;
		const uint8_t *src = c->images.data + index * per;
		float *dst = sample;
		for (int64_t i = 0; i < per; i++)
			dst[i] = c->lut[src[i]];
	}
	if (label)
		*(int32_t *)label = c->labels.data[index];
	return KILN_OK;
}

/* image: u8 [rows, cols, 1], the file's bytes unchanged; label: i32 []. */
static kiln_status idx_read_image(void *vctx, int64_t index, struct kiln_image *img,
				  void *label)
{
	const struct idx_ctx *c = vctx;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	size_t per = (size_t)(c->rows * c->cols);
	if (img->cap < per || !img->data) {
		uint8_t *p = realloc(img->data, per);
		if (!p)
			return c->src.host->error(KILN_ENOMEM, "out of memory");
		img->data = p;
		img->cap = per;
	}
	memcpy(img->data, c->images.data + (size_t)index * per, per);
	img->h = (int32_t)c->rows;
	img->w = (int32_t)c->cols;
	img->c = 1;
	if (label)
		*(int32_t *)label = c->labels.data[index];
	return KILN_OK;
}

/* The hint (source ops version 3): the sample's image lines and its label
 * brought towards the cache.  A shuffled epoch reads 784-byte images at
 * random offsets in a 47 MB buffer: without it, the copy above waits on
 * memory for each one in turn. */
static void idx_prefetch(void *vctx, int64_t index)
{
	const struct idx_ctx *c = vctx;
	if (index < 0 || index >= c->src.n)
		return;
	const size_t per = (size_t)(c->rows * c->cols);
	const uint8_t *p = c->images.data + (size_t)index * per;
	for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < (uintptr_t)(p + per); a += 64)
		__builtin_prefetch((const void *)a, 0, 3);
	__builtin_prefetch(c->labels.data + index, 0, 3);
}

/* The two files read (version 4): an output never replaces them. */
static void idx_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct idx_ctx *c = ctx;
	each(arg, c->images.path);
	each(arg, c->labels.path);
}

LOADERS_SOURCE_PEEK(idx, "idx",
		    "MNIST-format IDX image and label files, gzipped or not",
		    idx_keys, idx_open, idx_close, idx_info, idx_read, idx_read_image, idx_prefetch,
		    idx_files, idx_peek);
