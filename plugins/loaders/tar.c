/* plugins/loaders/tar.c - the `tar` data source: WebDataset shards.
 *
 * A shard is a tar archive (POSIX ustar, GNU, or pax) whose members are
 * grouped into samples by WebDataset's rule: the key of a member is its
 * path up to the first dot of its basename, the extension what follows
 * that dot (lower-cased), and consecutive members with the same key form
 * one sample:
 *
 *   n01440764/00001.jpg  \
 *   n01440764/00001.cls   > sample n01440764/00001
 *   n01440764/00001.json /  (other extensions are ignored)
 *
 * A sample's image is its .jpg, else .jpeg, else .png member (the order
 * of to_tuple("jpg;jpeg;png")); its label the .cls member, a decimal
 * integer in ASCII (surrounding whitespace allowed).  A sample without
 * either, or with a duplicate extension, is an error at open.  Members
 * whose basename has no dot (or starts with one) belong to no sample and
 * are skipped, as WebDataset does; so are directories, links and every
 * other member type.
 *
 * Our decision: indexed access instead of streaming.  WebDataset streams
 * shards and shuffles in a buffer, so the order of a run depends on the
 * number of workers and on the buffer size.  Here open() scans every
 * shard's headers once (512-byte blocks, skipping member data by offset:
 * only the headers and the few bytes of .cls members are read) and keeps
 * an index of (shard, offset, size, label) per sample; read_image() preads
 * the image member directly.  So the shuffle is a global permutation of
 * all samples, and the samples of a step are the same for any worker
 * count, rank count or resume point, exactly as for every other source.
 * The price is one open() per read and a random-access read pattern, which
 * local disks and page caches serve well.
 *
 * Samples are numbered shards first (in the order of `shards`, or sorted
 * by name for a directory), then in member order within a shard.
 *
 * Nothing in an archive is trusted: every header's checksum is verified,
 * every size checked against the file size, long names (GNU 'L', pax
 * path=) and pax sizes bounded; a truncated archive, a bad checksum or a
 * member past the end of the file is KILN_EDATA naming the shard and the
 * header's offset.  A shard must end with the end-of-archive zero block(s):
 * an archive cut at a member boundary is truncated, not short.
 */
#include "loaders.h"
#include "../common/open_file.h" /* common_open_file */
#include "image.h"

#include <ctype.h>    /* isspace, isdigit, tolower */
#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <inttypes.h> /* PRId64, PRIu64 */
#include <limits.h>   /* PATH_MAX */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* malloc, realloc, free, qsort */
#include <string.h>   /* memcmp, memcpy, strcmp, strerror, strlen */
#include <sys/stat.h> /* fstat, stat */
#include <unistd.h>   /* close */

#define TAR_WHO "tar"
#define TAR_BLOCK 512
#define TAR_MAX_LONGNAME (64u << 10) /* GNU 'L' member: a path, not a file */
#define TAR_MAX_PAX (1u << 20)       /* pax 'x' extended header */
#define TAR_MAX_CLS 64               /* bytes of a .cls member */
#define TAR_MAX_IMAGE ((uint64_t)1 << 30)

/* One sample of the index: 24 bytes + its image member's name. */
struct tar_sample {
	uint64_t off;   /* offset of the image member's data in its shard */
	uint64_t size;  /* bytes of the image member */
	uint64_t name;  /* offset of the image member's name in `names` */
	uint32_t shard;
	int32_t label;
};

struct tar_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	char **shards;             /* [n_shards] paths */
	int64_t n_shards;
	char *names;               /* NUL-terminated image member names */
	size_t names_len, names_cap;
	struct tar_sample *s;      /* [n] */
	int64_t cap;
};

/* The sample being assembled while scanning a shard. */
struct tar_group {
	char *key;              /* malloc()ed; NULL before the first member */
	size_t key_cap;
	uint64_t first;         /* header offset of its first member */
	int img;                /* priority of the image found (0 jpg, 1 jpeg, 2 png), -1 none */
	int seen[3];            /* image extensions seen */
	uint64_t img_off, img_size;
	char *img_name;         /* malloc()ed */
	int has_cls;
	int32_t label;
};

/* ---- helpers ---------------------------------------------------------- */

static kiln_status tar_oom(const struct kiln_host *host, const char *path)
{
	return host->error(KILN_ENOMEM, "%s: out of memory indexing the shard", path);
}

/* A copy of s[0..n) as a C string; NULL when out of memory. */
static char *tar_strndup(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, s, n);
		d[n] = 0;
	}
	return d;
}

/* The numeric header field f[0..n): octal digits (leading spaces or NULs
 * allowed, ended by a space or NUL), or GNU base-256 when the first byte
 * has its high bit set.  Returns 0, or -1 when the field is not a number
 * or not below 2^63. */
static int tar_number(const uint8_t *f, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;
	if (f[0] & 0x80) {
		if (f[0] != 0x80) /* negative or a value beyond 2^63 */
			return -1;
		for (i = 1; i < n; i++) {
			if (v >> 55)
				return -1;
			v = v << 8 | f[i];
		}
		*out = v;
		return 0;
	}
	while (i < n && (f[i] == ' ' || f[i] == 0))
		i++;
	if (i == n) { /* all blank: zero */
		*out = 0;
		return 0;
	}
	size_t digits = 0;
	for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
		if (v >> 60)
			return -1;
		v = v << 3 | (uint64_t)(f[i] - '0');
	}
	if (!digits)
		return -1;
	for (; i < n; i++)
		if (f[i] != ' ' && f[i] != 0)
			return -1;
	*out = v;
	return 0;
}

/* The checksum check: the field holds the sum of the header's bytes with
 * the field itself counted as spaces (unsigned; some old tars summed signed
 * chars, accepted too). */
static int tar_checksum_ok(const uint8_t *h, uint64_t *stored, uint64_t *computed)
{
	uint64_t u = 0;
	int64_t sg = 0;
	for (int i = 0; i < TAR_BLOCK; i++) {
		uint8_t b = i >= 148 && i < 156 ? ' ' : h[i];
		u += b;
		sg += (int8_t)b;
	}
	*computed = u;
	if (tar_number(h + 148, 8, stored))
		return 0;
	return *stored == u || (sg >= 0 && *stored == (uint64_t)sg);
}

/* Parse a pax extended header's records "<len> <key>=<value>\n": path=
 * into *path (malloc()ed), size= into *size.  Returns 0, or -1 when a
 * record is malformed. */
static int tar_pax(const char *buf, size_t n, char **path, int64_t *size)
{
	size_t at = 0;
	while (at < n) {
		if (buf[at] == 0) /* padding NULs after the last record */
			break;
		size_t len = 0, i = at;
		while (i < n && buf[i] >= '0' && buf[i] <= '9') {
			if (len > n)
				return -1;
			len = len * 10 + (size_t)(buf[i] - '0');
			i++;
		}
		if (i == at || i >= n || buf[i] != ' ' || len > n - at || len < (i - at) + 3 ||
		    buf[at + len - 1] != '\n')
			return -1;
		const char *kv = buf + i + 1, *end = buf + at + len - 1;
		const char *eq = memchr(kv, '=', (size_t)(end - kv));
		if (!eq)
			return -1;
		size_t kl = (size_t)(eq - kv);
		const char *v = eq + 1;
		size_t vl = (size_t)(end - v);
		if (kl == 4 && !memcmp(kv, "path", 4)) {
			if (!vl || memchr(v, 0, vl))
				return -1;
			free(*path);
			if (!(*path = tar_strndup(v, vl)))
				return -1;
		} else if (kl == 4 && !memcmp(kv, "size", 4)) {
			int64_t s = 0;
			if (!vl)
				return -1;
			for (size_t k = 0; k < vl; k++) {
				if (v[k] < '0' || v[k] > '9' || s > (INT64_MAX - 9) / 10)
					return -1;
				s = s * 10 + (v[k] - '0');
			}
			*size = s;
		}
		at += len;
	}
	return 0;
}

/* A .cls member's text as a label: a decimal integer, whitespace around
 * it allowed.  Returns 0, -1 when not a number, -2 when negative or too
 * large for an i32. */
static int tar_parse_label(const char *t, size_t n, int32_t *out)
{
	size_t i = 0;
	int neg = 0;
	int64_t v = 0;
	while (i < n && isspace((unsigned char)t[i]))
		i++;
	if (i < n && (t[i] == '+' || t[i] == '-'))
		neg = t[i++] == '-';
	size_t d0 = i;
	for (; i < n && isdigit((unsigned char)t[i]); i++)
		if ((v = v * 10 + (t[i] - '0')) > INT32_MAX)
			return -2;
	if (i == d0)
		return -1;
	while (i < n && isspace((unsigned char)t[i]))
		i++;
	if (i != n)
		return -1;
	if (neg && v)
		return -2;
	*out = (int32_t)v;
	return 0;
}

/* ---- the index -------------------------------------------------------- */

static kiln_status tar_add(struct tar_ctx *c, const char *shard, uint32_t si,
			   const struct tar_group *g)
{
	size_t nl = strlen(g->img_name) + 1;
	if (c->names_len + nl > c->names_cap) {
		size_t nc = c->names_cap ? c->names_cap * 2 : 1 << 16;
		while (nc < c->names_len + nl)
			nc *= 2;
		char *nn = realloc(c->names, nc);
		if (!nn)
			return tar_oom(c->src.host, shard);
		c->names = nn;
		c->names_cap = nc;
	}
	if (c->src.n == c->cap) {
		int64_t nc = c->cap ? c->cap * 2 : 1024;
		struct tar_sample *ns = realloc(c->s, (size_t)nc * sizeof *ns);
		if (!ns)
			return tar_oom(c->src.host, shard);
		c->s = ns;
		c->cap = nc;
	}
	struct tar_sample *s = &c->s[c->src.n++];
	s->off = g->img_off;
	s->size = g->img_size;
	s->name = c->names_len;
	s->shard = si;
	s->label = g->label;
	memcpy(c->names + c->names_len, g->img_name, nl);
	c->names_len += nl;
	return KILN_OK;
}

/* Close the group being assembled: it must have an image and a label. */
static kiln_status tar_flush(struct tar_ctx *c, const char *shard, uint32_t si,
			     struct tar_group *g)
{
	if (!g->key)
		return KILN_OK;
	if (g->img < 0)
		return c->src.host->error(KILN_EDATA, "%s: sample %s (member at offset %" PRIu64 ") has no .jpg, .jpeg or .png member",
				      shard, g->key, g->first);
	if (!g->has_cls)
		return c->src.host->error(KILN_EDATA, "%s: sample %s (member at offset %" PRIu64 ") has no .cls member (its label)",
				      shard, g->key, g->first);
	kiln_status st = tar_add(c, shard, si, g);
	free(g->key);
	free(g->img_name);
	g->key = NULL;
	g->img_name = NULL;
	return st;
}

/* One regular member `name` whose data is size bytes at `data` (its header
 * at data - 512) of shard fd. */
static kiln_status tar_member(struct tar_ctx *c, const char *shard, uint32_t si, int fd,
			      const char *name, uint64_t data, uint64_t size, struct tar_group *g)
{
	const struct kiln_host *host = c->src.host;
	uint64_t hdr = data - TAR_BLOCK;
	const char *base = strrchr(name, '/');
	base = base ? base + 1 : name;
	const char *dot = strchr(base, '.');
	if (!dot || dot == base) /* no key: WebDataset skips it */
		return KILN_OK;
	size_t kl = (size_t)(dot - name);
	char ext[16];
	size_t el = strlen(dot + 1);
	if (el >= sizeof ext)
		el = sizeof ext - 1; /* a long extension is none we know */
	for (size_t i = 0; i < el; i++)
		ext[i] = (char)tolower((unsigned char)dot[1 + i]);
	ext[el] = 0;
	kiln_status st;

	if (!g->key || strlen(g->key) != kl || memcmp(g->key, name, kl)) {
		if ((st = tar_flush(c, shard, si, g)))
			return st;
		if (!(g->key = tar_strndup(name, kl)))
			return tar_oom(host, shard);
		g->first = hdr;
		g->img = -1;
		g->seen[0] = g->seen[1] = g->seen[2] = 0;
		g->has_cls = 0;
	}
	int prio = !strcmp(ext, "jpg") ? 0 : !strcmp(ext, "jpeg") ? 1 : !strcmp(ext, "png") ? 2 : -1;
	if (prio >= 0) {
		if (g->seen[prio])
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): sample %s has two .%s members",
					   shard, name, hdr, g->key, ext);
		g->seen[prio] = 1;
		if (size == 0)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): empty image",
					   shard, name, hdr);
		if (size > TAR_MAX_IMAGE)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): %" PRIu64 " bytes is larger than any image this source reads",
					   shard, name, hdr, size);
		if (g->img < 0 || prio < g->img) {
			char *nm = tar_strndup(name, strlen(name));
			if (!nm)
				return tar_oom(host, shard);
			free(g->img_name);
			g->img_name = nm;
			g->img = prio;
			g->img_off = data;
			g->img_size = size;
		}
	} else if (!strcmp(ext, "cls")) {
		char t[TAR_MAX_CLS];
		if (g->has_cls)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): sample %s has two .cls members",
					   shard, name, hdr, g->key);
		if (size > TAR_MAX_CLS)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): a label of %" PRIu64 " bytes is not a class number",
					   shard, name, hdr, size);
		ssize_t r = loaders_pread_full(fd, t, (size_t)size, data);
		if (r < 0)
			return host->error(KILN_EIO, "%s: cannot read member %s (offset %" PRIu64 "): %s",
					   shard, name, hdr, strerror(errno));
		if ((uint64_t)r < size)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): truncated", shard,
					   name, hdr);
		int e = tar_parse_label(t, (size_t)size, &g->label);
		if (e)
			return host->error(KILN_EDATA, "%s: member %s (offset %" PRIu64 "): label '%.*s' is %s",
					   shard, name, hdr, (int)size, t,
					   e == -1 ? "not a decimal integer" : "out of range (0..2147483647)");
		g->has_cls = 1;
	}
	return KILN_OK;
}

/* The member name of header h: ustar prefix "/" name, into name[n]. */
static const char *tar_header_name(const uint8_t *h, char *name, size_t n)
{
	size_t nl = strnlen((const char *)h, 100), pl = 0;
	if (!memcmp(h + 257, "ustar\0", 6))
		pl = strnlen((const char *)h + 345, 155);
	if (pl)
		snprintf(name, n, "%.*s/%.*s", (int)pl, (const char *)h + 345, (int)nl, (const char *)h);
	else
		snprintf(name, n, "%.*s", (int)nl, (const char *)h);
	return name;
}

/* A GNU long-name ('L') or pax ('x') header at off, its `size` bytes of
 * data after it: read them (into *buf, grown as needed) and set the next
 * member's *longname (owned, replaced) and, from pax, *paxsize. */
static kiln_status tar_ext_header(const struct kiln_host *host, const char *path, int fd,
				  char type, uint64_t off, uint64_t size, char **buf,
				  char **longname, int64_t *paxsize)
{
	if (size > (type == 'L' ? TAR_MAX_LONGNAME : TAR_MAX_PAX))
		return host->error(KILN_EDATA, "%s: %s header at offset %" PRIu64 " of %" PRIu64 " bytes is too large",
				   path, type == 'L' ? "GNU long-name" : "pax", off, size);
	char *nb = realloc(*buf, (size_t)size + 1);
	if (!nb)
		return tar_oom(host, path);
	*buf = nb;
	ssize_t r = loaders_pread_full(fd, nb, (size_t)size, off + TAR_BLOCK);
	if (r < 0)
		return host->error(KILN_EIO, "%s: cannot read the header data at offset %" PRIu64 ": %s",
				   path, off, strerror(errno));
	if ((uint64_t)r < size)
		return host->error(KILN_EDATA, "%s: truncated header data at offset %" PRIu64, path, off);
	nb[size] = 0;
	if (type == 'L') {
		size_t len = strlen(nb);
		if (!len)
			return host->error(KILN_EDATA, "%s: empty GNU long name at offset %" PRIu64, path,
					   off);
		free(*longname);
		if (!(*longname = tar_strndup(nb, len)))
			return tar_oom(host, path);
	} else if (tar_pax(nb, (size_t)size, longname, paxsize)) {
		return host->error(KILN_EDATA, "%s: malformed pax header at offset %" PRIu64, path, off);
	}
	return KILN_OK;
}

/* Open shard `path` into *fd, its size *size; at: where its name was set
 * (loaders_shards_at), for one that is not there. */
static kiln_status tar_shard_fd(const struct kiln_host *host, const char *path, const char *at,
				int *fd, off_t *size)
{
	char kind[64];
	const char *why;
	*fd = common_open_file(path, kind, sizeof kind, &why, size);
	if (*fd < 0 && loaders_missing(errno)) /* a name the config gave: exit 2 */
		return loaders_no_such_file(host, at, path, "the tar shard");
	if (*fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the shard: %s", path, why);
	return KILN_OK;
}

/* Index shard `path` (number si); at: tar_shard_fd's. */
static kiln_status tar_scan(struct tar_ctx *c, const char *path, uint32_t si, const char *at)
{
	const struct kiln_host *host = c->src.host;
	uint8_t h[TAR_BLOCK];
	struct tar_group g = { 0 };
	char *longname = NULL; /* from a GNU 'L' or pax header, for the next member */
	int64_t paxsize = -1;  /* from a pax header, for the next member */
	char *buf = NULL;
	int64_t before = c->src.n;
	off_t shard_size;
	int fd;
	kiln_status st = tar_shard_fd(host, path, at, &fd, &shard_size);
	if (st)
		return st;
	uint64_t fsz = (uint64_t)shard_size, off = 0;
	for (;;) {
		if (off == fsz) {
			st = host->error(KILN_EDATA, "%s: truncated: the archive ends at offset %" PRIu64 " without its end-of-archive block",
					 path, off);
			goto out;
		}
		if (fsz - off < TAR_BLOCK) {
			st = host->error(KILN_EDATA, "%s: truncated: %" PRIu64 " bytes at offset %" PRIu64 " where a 512-byte header should be",
					 path, fsz - off, off);
			goto out;
		}
		ssize_t r = loaders_pread_full(fd, h, TAR_BLOCK, off);
		if (r < 0) {
			st = host->error(KILN_EIO, "%s: cannot read the header at offset %" PRIu64 ": %s",
					 path, off, strerror(errno));
			goto out;
		}
		if (r < TAR_BLOCK) {
			st = host->error(KILN_EDATA, "%s: truncated header at offset %" PRIu64, path, off);
			goto out;
		}
		int zero = 1;
		for (int i = 0; i < TAR_BLOCK && zero; i++)
			zero = h[i] == 0;
		if (zero)
			break; /* end of archive; what follows is padding */

		uint64_t stored, computed, size;
		if (!tar_checksum_ok(h, &stored, &computed)) {
			st = host->error(KILN_EDATA, "%s: bad header checksum at offset %" PRIu64 " (stored %.8s, computed %" PRIo64 "): corrupt or not a tar file",
					 path, off, (const char *)h + 148, computed);
			goto out;
		}
		if (tar_number(h + 124, 12, &size)) {
			st = host->error(KILN_EDATA, "%s: bad size field in the header at offset %" PRIu64,
					 path, off);
			goto out;
		}
		if (paxsize >= 0)
			size = (uint64_t)paxsize;
		uint64_t data = off + TAR_BLOCK;
		/* the name, for messages and keys: ustar prefix "/" name */
		char name[256 + 2];
		const char *nm = longname ? longname : tar_header_name(h, name, sizeof name);
		if (size > fsz - data) {
			st = host->error(KILN_EDATA, "%s: member %s (header at offset %" PRIu64 "): its %" PRIu64 " bytes run past the end of the file (%" PRIu64 " bytes): truncated",
					 path, nm, off, size, fsz);
			goto out;
		}
		char type = (char)h[156];
		if (type == 'L' || type == 'x') {
			if ((st = tar_ext_header(host, path, fd, type, off, size, &buf, &longname, &paxsize)))
				goto out;
		} else if (type == 'K' || type == 'g') {
			/* long link name, global pax header: nothing we use */
		} else {
			if (type == '0' || type == '\0' || type == '7') {
				if ((st = tar_member(c, path, si, fd, nm, data, size, &g)))
					goto out;
			}
			/* directories, links, devices, ...: no data we read */
			free(longname);
			longname = NULL;
			paxsize = -1;
		}
		off = data + (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
		if (off > fsz) /* the padding of the last member is missing */
			off = fsz;
	}
	if ((st = tar_flush(c, path, si, &g)))
		goto out;
	if (c->src.n == before)
		host->log(KILN_LOG_WARN, TAR_WHO, "%s: no samples in this shard", path);
out:
	free(g.key);
	free(g.img_name);
	free(longname);
	free(buf);
	close(fd);
	return st;
}

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key tar_keys[] = {
	{ "path", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "A directory of .tar shards (read in sorted name order) or one .tar file, WebDataset convention: a sample is the members `KEY.jpg` (or .jpeg, .png) and `KEY.cls` (the class number in ASCII decimal). When `path/split` exists it is used instead (path = /x: [data] reads /x/train, [data.eval] /x/test); [data.eval] inheriting path without such a subdirectory is an error. With `shards` set: the directory relative shard names are resolved in. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "shards", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "The shards to read, in this order: .tar files separated by commas or spaces, relative to `path` (when it is a directory) or absolute. Never inherited by [data.eval]. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "split", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Subdirectory of `path` to read (e.g. val); it must exist. Unset: the split the run asks for when that subdirectory exists, else `path` itself. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "classes", KILN_KEY_INT, "0", 0, 2147483647.0, NULL,
	  "Number of classes; every label must be below it. 0: the largest label + 1." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static int tar_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static kiln_status tar_add_shard(struct tar_ctx *c, const char *p, int64_t *cap)
{
	if (c->n_shards == *cap) {
		int64_t nc = *cap ? *cap * 2 : 16;
		char **ns = realloc(c->shards, (size_t)nc * sizeof *ns);
		if (!ns)
			return c->src.host->error(KILN_ENOMEM, "out of memory");
		c->shards = ns;
		*cap = nc;
	}
	if (!(c->shards[c->n_shards] = tar_strndup(p, strlen(p))))
		return c->src.host->error(KILN_ENOMEM, "out of memory");
	c->n_shards++;
	return KILN_OK;
}

/* The .tar files of directory `dir`, sorted. */
static kiln_status tar_list_dir(struct tar_ctx *c, const char *dir, int64_t *cap)
{
	DIR *d = opendir(dir);
	if (!d)
		return c->src.host->error(KILN_EIO, "%s: cannot list the directory of shards: %s", dir,
				      strerror(errno));
	struct dirent *de;
	kiln_status st = KILN_OK;
	char p[PATH_MAX];
	while ((de = readdir(d)) && !st) {
		size_t l = strlen(de->d_name);
		if (l <= 4 || strcmp(de->d_name + l - 4, ".tar"))
			continue;
		if (loaders_join(p, sizeof p, dir, de->d_name))
			st = c->src.host->error(KILN_EIO, "%s/%s: path too long", dir, de->d_name);
		else
			st = tar_add_shard(c, p, cap);
	}
	closedir(d);
	if (st)
		return st;
	if (!c->n_shards)
		return c->src.host->error(KILN_EDATA, "%s: no .tar shards in this directory", dir);
	qsort(c->shards, (size_t)c->n_shards, sizeof *c->shards, tar_cmp);
	/* no gap check (loaders_shards_contiguous): kiln pack writes no tar;
	 * WebDataset shards are numbered by other tools, 1-based or a subset */
	return KILN_OK;
}

/* ---- the source ------------------------------------------------------- */

static void tar_close(void *vctx)
{
	struct tar_ctx *c = vctx;
	if (!c)
		return;
	for (int64_t i = 0; i < c->n_shards; i++)
		free(c->shards[i]);
	free(c->shards);
	free(c->names);
	free(c->s);
	free(c);
}

/* The shard files of [section] into c->shards (names only: nothing is
 * opened), and the keys tar_open checks: [section] classes into *classes. */
static kiln_status tar_shards(struct tar_ctx *c, const struct kiln_config *cfg,
			      const char *section, const char *split, int64_t *classes)
{
	const struct kiln_host *host = c->src.host;
	kiln_status st;
	int64_t cap = 0;
	char root[PATH_MAX];
	int is_dir = 0;
	const char *path = host->config_get(cfg, section, "path");
	const char *shards = host->config_get(cfg, section, "shards");
	const char *ksplit = host->config_get(cfg, section, "split");
	if ((st = loaders_classes_key(host, cfg, section, classes)) ||
	    (st = loaders_max_pixels_key(host, cfg, section, &c->src)))
		return st;
	if (shards && *shards) {
		/* explicit list; relative names are relative to path (a directory) */
		if ((st = loaders_path_is_dir(host, cfg, section, TAR_WHO, path, &is_dir)))
			return st;
		const char *base = is_dir ? path : NULL;
		for (const char *p = shards; *p;) {
			while (*p == ',' || isspace((unsigned char)*p))
				p++;
			size_t l = 0;
			while (p[l] && p[l] != ',' && !isspace((unsigned char)p[l]))
				l++;
			if (!l)
				break;
			char one[PATH_MAX], full[PATH_MAX];
			if (l >= sizeof one)
				return host->error(KILN_ECONFIG, "[%s] shards: a name of %zu characters is too long", section, l);
			memcpy(one, p, l);
			one[l] = 0;
			if (one[0] != '/' && base ? loaders_join(full, sizeof full, base, one) :
			    snprintf(full, sizeof full, "%s", one) >= (int)sizeof full)
				return host->error(KILN_ECONFIG, "[%s] shards: the path of %s is too long", section, one);
			if ((st = tar_add_shard(c, full, &cap)))
				return st;
			p += l;
		}
		if (!c->n_shards)
			return host->error(KILN_ECONFIG, "%s: [%s] shards is empty",
					   host->config_where(cfg, section, "shards"), section);
	} else {
		if ((st = loaders_split_root(host, cfg, section, TAR_WHO, path, ksplit ? ksplit : split,
					     ksplit != NULL, root, sizeof root, &is_dir)))
			return st;
		if (is_dir)
			st = tar_list_dir(c, root, &cap);
		else
			st = tar_add_shard(c, root, &cap);
		if (st)
			return st;
	}
	if (c->n_shards > UINT32_MAX)
		return host->error(KILN_ECONFIG, "[%s]: %" PRId64 " shards are too many", section,
				   c->n_shards);
	return KILN_OK;
}

static kiln_status tar_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, void **out)
{
	kiln_status st;
	int64_t classes = 0;
	*out = NULL;
	struct tar_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	if ((st = tar_shards(c, cfg, section, split, &classes)))
		goto fail;
	char at[PATH_MAX + 64];
	loaders_shards_at(host, cfg, section, at, sizeof at);
	for (int64_t i = 0; i < c->n_shards; i++)
		if ((st = tar_scan(c, c->shards[i], (uint32_t)i, at)))
			goto fail;
	if (c->src.n == 0) {
		st = host->error(KILN_EDATA, "%s%s: no samples (no members named <key>.jpg|.jpeg|.png with <key>.cls)",
				 c->shards[0], c->n_shards > 1 ? " and the other shards" : "");
		goto fail;
	}
	/* a label at or past [data] classes is a bad sample, found when read
	 * (data.on_error = skip skips it), as records and LMDB do */
	int32_t max = 0;
	for (int64_t i = 0; i < c->src.n; i++)
		if (c->s[i].label > max)
			max = c->s[i].label;
	c->src.classes = classes ? classes : (int64_t)max + 1;
	host->log(KILN_LOG_INFO, TAR_WHO, "[%s] %s: %" PRId64 " samples in %" PRId64 " shard%s, %" PRId64 " classes",
		  section, c->shards[0], c->src.n, c->n_shards, c->n_shards == 1 ? "" : "s", c->src.classes);
	c->src.who = c->shards[0];
	*out = c;
	return KILN_OK;

fail:
	tar_close(c);
	return st;
}

/* What loaders_varying_info says after tar_open (version 5): the images
 * vary, so the shards are named (a directory listed) and opened, as
 * tar_open opens them, but not read (tar_open reads every member's header
 * of every shard to index them). */
static kiln_status tar_peek(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *section, const char *split, struct kiln_source_info *info)
{
	int64_t classes = 0;
	char at[PATH_MAX + 64];
	off_t size;
	int fd;
	struct tar_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	kiln_status st = tar_shards(c, cfg, section, split, &classes);
	loaders_shards_at(host, cfg, section, at, sizeof at);
	for (int64_t i = 0; i < c->n_shards && !st; i++)
		if (!(st = tar_shard_fd(host, c->shards[i], at, &fd, &size)))
			close(fd);
	if (!st)
		loaders_varying_info(c, info);
	tar_close(c);
	return st;
}

/* image: u8 [h, w, c] as decoded; label: i32 []. */
static kiln_status tar_read_image(void *vctx, int64_t index, struct kiln_image *img,
				  void *label)
{
	const struct tar_ctx *c = vctx;
	const struct kiln_host *host = c->src.host;
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	const struct tar_sample *s = &c->s[index];
	const char *shard = c->shards[s->shard], *name = c->names + s->name;
	uint64_t hdr = s->off - TAR_BLOCK;
	char kind[64];
	const char *why;
	int fd = common_open_file(shard, kind, sizeof kind, &why, NULL);
	if (fd < 0)
		return host->error(KILN_EIO, "%s: cannot open the shard: %s", shard, why);
	char what[PATH_MAX + 300];
	snprintf(what, sizeof what, "%s: member %s (offset %" PRIu64 ")", shard, name, hdr);
	if (s->label >= c->src.classes) {
		close(fd);
		return host->error(KILN_EDATA, "%s: label %d is out of range: classes = %" PRId64, what,
				   s->label, c->src.classes);
	}
	st = loaders_read_image(&c->src, fd, s->off, (size_t)s->size, what, img);
	if (!st && label)
		*(int32_t *)label = s->label;
	close(fd);
	return st;
}

/* The shards read (version 4): an output never replaces them. */
static void tar_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct tar_ctx *c = ctx;
	for (int64_t i = 0; i < c->n_shards; i++)
		each(arg, c->shards[i]);
}

LOADERS_SOURCE_PEEK(tar, "tar",
		    "WebDataset .tar shards (KEY.jpg or .png with KEY.cls), indexed for random access",
		    tar_keys, tar_open, tar_close, loaders_varying_info, NULL, tar_read_image, NULL,
		    tar_files, tar_peek);
