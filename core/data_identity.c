/* core/data_identity.c - what an opened data set is, cheaply: the text the
 * ranks of a data-parallel run compare (kiln_dist_agree_data,
 * core/dist_data.c) so that ranks reading another copy of the same size
 * at the same path (another node's, an older version, another pack) fail
 * at once instead of training on different data without a word.
 *
 * The text is lines, the first two about the samples, then one per file
 * the source reads (ops version 4, files(): idx's two files, a pack's
 * shards, a folder's images), in the source's order:
 *   samples f32 [1,28,28] labels i32 [] classes 10
 *   transforms 28x28 crop 0 resize 0 pad 0 flip 0 mean 0.286,0,0 std 0.353,1,1
 *   fm/train-labels-idx1-ubyte<TAB>60008<TAB>1f8a2c3e<TAB>9b01d2aa
 *   fm/train-images-idx3-ubyte.gz<TAB>26421870 gzip<TAB>..<TAB>..<TAB>contents 47040016 bytes, CRC32 ..
 * a file's size and the CRC32C of its first and last DATA_ID_EDGE bytes
 * (all of a smaller file); a gzip file's (its magic, whatever its name)
 * past its header, whose time stamp and name differ between copies of
 * the same data (`gzip -n` on another day: review of session 35), then
 * its trailer's CRC32 and size of all it inflates to.  Nothing else is
 * read: a change inside a large plain file that keeps its size and both
 * ends is not seen (a gzip file's trailer sees one anywhere in its last
 * member, a kiln pack shard's first bytes hold its pack id).  Files are
 * compared, not their decoded contents: the same data gzipped on one rank
 * and plain on another differ (telling them the same would read the whole
 * plain file on every start; dist_data.c's message names the case).  Beyond DATA_ID_EDGES_MAX files only every k-th
 * file's ends are read, the others' sizes only stat'ed (an image edited
 * or encoded again almost always changes size), and beyond
 * DATA_ID_STATS_MAX every k-th is stat'ed, the others only named (which
 * costs nothing): a folder of 1.28 million images pays 4096 opens and
 * 16384 stats, not 1.28 million of either (its scan avoids even a stat,
 * folder.c).  Measured warm, two ranks on one busy 2-core machine: a
 * folder of 10,000 PNGs 170 to 270 ms, fashion-mnist's four files
 * 0.1 ms.  The transforms are the config's (which the ranks compared
 * already, dist_config.c): here as the core resolved them. */
#include "data.h"
#include "../plugins/common/read_full.h" /* common_pread_full */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* a growing text; on a failed allocation `bad` is set and text freed */
struct id_text {
	char *s;
	size_t n, cap;
	int bad;
	int64_t files;        /* listed so far */
	int64_t every_read;   /* every k-th file's ends are read, */
	int64_t every_stat;   /* every k-th's size stat'ed */
};

static void id_add(struct id_text *t, const char *fmt, ...) KILN_PRINTF(2, 3);
static void id_add(struct id_text *t, const char *fmt, ...)
{
	for (int tries = 0; !t->bad && tries < 2; tries++) {
		va_list ap;
		va_start(ap, fmt);
		int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			t->bad = 1;
		} else if (t->s && (size_t)k < t->cap - t->n) {
			t->n += (size_t)k;
			return;
		} else {
			size_t cap = (t->cap ? 2 * t->cap : 4096) + (size_t)k + 1;
			char *s = realloc(t->s, cap);
			if (!s)
				t->bad = 1;
			else {
				t->s = s;
				t->cap = cap;
			}
		}
	}
}

/* CRC32C of the bytes [at, at + n) of fd (fewer at its end); ~0u when
 * unreadable.  (The reads here go through common_pread_full, which
 * retries a short read as well as EINTR: until session 40's review they
 * had loops of their own that took a short read, on a network or FUSE
 * file system, for the file's end, and a rank's identity then differed
 * from its peers' for the same file.) */
static uint32_t edge_crc(int fd, off_t at, size_t n)
{
	unsigned char buf[DATA_ID_EDGE];
	const ssize_t k = common_pread_full(fd, buf, n, (uint64_t)at);
	return k < 0 ? ~0u : kiln_crc32c(0, buf, (size_t)k);
}

/* The length of the gzip header (RFC 1952: magic, method, flags, time
 * stamp, extra field, name, comment, header CRC) at the start of buf[0..n),
 * or 0 when buf does not begin with one whole. */
static size_t gz_header_len(const unsigned char *buf, size_t n)
{
	enum { FHCRC = 2, FEXTRA = 4, FNAME = 8, FCOMMENT = 16 };
	if (n < 10 || buf[0] != 0x1f || buf[1] != 0x8b || buf[2] != 8 || buf[3] & 0xe0)
		return 0;
	size_t at = 10;
	if (buf[3] & FEXTRA)
		at = n < at + 2 ? n + 1 : at + 2 + (buf[at] | (size_t)buf[at + 1] << 8);
	for (int f = FNAME; f <= FCOMMENT; f <<= 1) {
		const unsigned char *z = buf[3] & f && at < n ? memchr(buf + at, 0, n - at) : NULL;
		if (buf[3] & f)
			at = z ? (size_t)(z - buf) + 1 : n + 1;
	}
	at += buf[3] & FHCRC ? 2 : 0;
	return at <= n ? at : 0;
}

/* A file's bytes past an `at`-byte header: its size, the CRC32C of their
 * first and last DATA_ID_EDGE bytes; a gzip file's also the CRC32 and
 * size (mod 2^32) of all it inflates to, from its trailer (little-endian,
 * its last 8 bytes). */
static void id_bytes(struct id_text *t, const char *path, int fd, off_t size, size_t at, int gz)
{
	const off_t tail = size - (off_t)at > DATA_ID_EDGE ? size - DATA_ID_EDGE : (off_t)at;
	id_add(t, "%s	%lld%s	%08" PRIx32 "	%08" PRIx32, path, (long long)(size - (off_t)at),
	       gz ? " gzip" : "", edge_crc(fd, (off_t)at, DATA_ID_EDGE), edge_crc(fd, tail, DATA_ID_EDGE));
	unsigned char tr[8];
	if (gz && common_pread_full(fd, tr, sizeof tr, (uint64_t)(size - (off_t)sizeof tr)) ==
			  (ssize_t)sizeof tr)
		id_add(t, "	contents %" PRIu32 " bytes, CRC32 %08" PRIx32,
		       tr[4] | (uint32_t)tr[5] << 8 | (uint32_t)tr[6] << 16 | (uint32_t)tr[7] << 24,
		       tr[0] | (uint32_t)tr[1] << 8 | (uint32_t)tr[2] << 16 | (uint32_t)tr[3] << 24);
	id_add(t, "\n");
}

/* A regular file's line past its path: its size and ends; a gzip file's
 * bytes after the header (its time stamp and name: the same data
 * compressed again with `gzip -n`, or on another day, is the same; review
 * of session 35) and the trailer's CRC32 and size of its contents. */
static void id_regular(struct id_text *t, const char *path, int fd, off_t size)
{
	unsigned char head[DATA_ID_EDGE];
	const ssize_t k = common_pread_full(fd, head, sizeof head, 0);
	size_t at = k > 0 ? gz_header_len(head, (size_t)k) : 0;
	if (size < (off_t)at + 8)
		at = 0; /* (no room for a trailer: not gzip's, all of it compared) */
	id_bytes(t, path, fd, size, at, at > 0);
}

/* files(): one file's line: its path, then its size and ends, its size,
 * or nothing more, by its place (every_read, every_stat) */
static void id_file(void *arg, const char *path)
{
	struct id_text *t = arg;
	struct stat sb;
	const int64_t i = t->files++;
	if (i % t->every_read && !(i % t->every_stat) && !stat(path, &sb) && S_ISREG(sb.st_mode)) {
		id_add(t, "%s\t%lld\n", path, (long long)sb.st_size);
		return;
	}
	if (i % t->every_read) {
		id_add(t, "%s\n", path);
		return;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &sb)) {
		id_add(t, "%s\tunreadable (%s)\n", path, strerror(errno));
	} else if (!S_ISREG(sb.st_mode)) {
		id_add(t, "%s\tnot a file\n", path); /* (lmdb's environment directory) */
	} else {
		id_regular(t, path, fd, sb.st_size);
	}
	if (fd >= 0)
		close(fd);
}

static void id_count(void *arg, const char *path)
{
	(void)path;
	((struct id_text *)arg)->files++;
}

/* The first lines: the samples and labels as the source gives them, and
 * the transforms the core applies to its images. */
static void id_header(struct id_text *t, const struct kiln_dataset *d)
{
	char a[128], b[128];
	id_add(t, "samples %s labels %s classes %lld\n", kiln_tensor_desc_str(&d->sample, a, sizeof a),
	       kiln_tensor_desc_str(&d->label, b, sizeof b), (long long)d->classes);
	if (!d->use_image)
		return;
	const struct kiln_xform *x = &d->xf;
	id_add(t, "transforms %dx%dx%d crop %d resize %d pad %d scale %g,%g ratio %g,%g flip %d mean %g,%g,%g std %g,%g,%g layout %s dtype %d\n",
	       x->out_h, x->out_w, x->out_c, x->crop, x->resize, x->pad, x->scale[0], x->scale[1],
	       x->ratio[0], x->ratio[1], x->flip, x->mean[0], x->mean[1], x->mean[2], x->std[0],
	       x->std[1], x->std[2], x->nhwc ? "nhwc" : "nchw", x->out_dtype);
}

kiln_status kiln_dataset_identity(const struct kiln_dataset *d, char **text, size_t *len)
{
	struct id_text t = { .every_read = 1, .every_stat = 1 };
	const int listed = d->ops->version >= 4 && d->ops->files;
	*text = NULL;
	*len = 0;
	id_header(&t, d);
	if (listed) {
		d->ops->files(d->ctx, id_count, &t);
		t.every_read = (t.files + DATA_ID_EDGES_MAX - 1) / DATA_ID_EDGES_MAX;
		t.every_stat = (t.files + DATA_ID_STATS_MAX - 1) / DATA_ID_STATS_MAX;
		t.every_read += !t.every_read;
		t.every_stat += !t.every_stat;
		t.files = 0;
		d->ops->files(d->ctx, id_file, &t);
	} else {
		id_add(&t, "no files (the source '%s' names none)\n", d->name);
	}
	if (t.bad) {
		free(t.s);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	*text = t.s;
	*len = t.n;
	return KILN_OK;
}
