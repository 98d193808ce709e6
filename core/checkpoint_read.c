/* core/checkpoint_read.c - opening a checkpoint file (checkpoint.h; the
 * layout in checkpoint_impl.h): every CRC verified at open, then its
 * sections by tag and the trainer's records (trainer, stopper, best,
 * evaluations, epoch, counts) read and range-checked.
 */
#include "checkpoint_impl.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

const char ckpt_magic[8] = { 'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T' };

/* File I/O goes through kiln_write_all and kiln_pread_all (internal.h),
 * which survive EINTR and short transfers. */

kiln_status ckpt_read_error(const char *path, const char *what)
{
	if (errno == 0)
		return kiln_error(KILN_EDATA, "checkpoint %s: truncated while reading %s", path, what);
	return kiln_error(KILN_EIO, "checkpoint %s: cannot read %s: %s", path, what, strerror(errno));
}

const char *kiln_ckpt_path(const struct kiln_ckpt *ck) { return ck->path; }
int64_t kiln_ckpt_step(const struct kiln_ckpt *ck) { return ck->step; }
int kiln_ckpt_section_count(const struct kiln_ckpt *ck) { return ck->n; }

void kiln_ckpt_section_get(const struct kiln_ckpt *ck, int i, const char **tag, uint64_t *bytes,
			   uint32_t *crc)
{
	*tag = ck->s[i].tag;
	*bytes = ck->s[i].bytes;
	*crc = ck->s[i].crc;
}

void kiln_ckpt_close(struct kiln_ckpt *ck)
{
	if (!ck)
		return;
	if (ck->fd >= 0)
		close(ck->fd);
	free(ck->path);
	free(ck->s);
	free(ck);
}

/* A tag: 1..31 printable ASCII characters, then NULs to the end. */
static int tag_ok(const uint8_t *t)
{
	int n = 0;
	while (n < KILN_CKPT_TAG_BYTES && t[n])
		if (t[n] < 0x21 || t[n] > 0x7e || ++n == KILN_CKPT_TAG_BYTES)
			return 0;
	if (!n)
		return 0;
	for (int i = n; i < KILN_CKPT_TAG_BYTES; i++)
		if (t[i])
			return 0;
	return 1;
}

/* CRC32C of bytes [off, off + n) of fd, through buf. */
static int crc_range(int fd, uint64_t off, uint64_t n, uint8_t *buf, size_t cap, uint32_t *crc)
{
	uint32_t c = 0;
	while (n) {
		size_t k = n < cap ? (size_t)n : cap;
		if (kiln_pread_all(fd, buf, k, off))
			return -1;
		c = kiln_crc32c(c, buf, k);
		off += k;
		n -= k;
	}
	*crc = c;
	return 0;
}

static kiln_status verify(struct kiln_ckpt *ck)
{
	const char *path = ck->path;
	uint8_t h[KILN_CKPT_HEADER_BYTES];
	if (ck->size < KILN_CKPT_HEADER_BYTES) {
		if (ck->size >= 8 && kiln_pread_all(ck->fd, h, 8, 0) == 0 && memcmp(h, ckpt_magic, 8))
			return kiln_error(KILN_EDATA, "checkpoint %s: not a kiln checkpoint (no KILNCKPT magic)",
					  path);
		return kiln_error(KILN_EDATA, "checkpoint %s: truncated: %llu bytes, shorter than the %d-byte header",
				  path, (unsigned long long)ck->size, KILN_CKPT_HEADER_BYTES);
	}
	if (kiln_pread_all(ck->fd, h, sizeof h, 0))
		return ckpt_read_error(path, "the header");
	if (memcmp(h, ckpt_magic, 8))
		return kiln_error(KILN_EDATA, "checkpoint %s: not a kiln checkpoint (no KILNCKPT magic)", path);
	uint32_t version = get_u32(h + 8), stored = get_u32(h + 60), crc = kiln_crc32c(0, h, 60);
	if (version != KILN_CKPT_VERSION)
		return kiln_error(KILN_EDATA, "checkpoint %s: format version %u, but this kiln reads version %d%s",
				  path, version, KILN_CKPT_VERSION,
				  stored == crc ? " (written by a newer kiln?)"
						: " (or a corrupt header: its checksum does not match either)");
	if (stored != crc)
		return kiln_error(KILN_EDATA, "checkpoint %s: header checksum mismatch (stored 0x%08x, computed 0x%08x): the header is corrupt",
				  path, stored, crc);
	uint32_t hbytes = get_u32(h + 12), n = get_u32(h + 24), flags = get_u32(h + 28);
	uint64_t total = get_u64(h + 16), step = get_u64(h + 32);
	if (hbytes != KILN_CKPT_HEADER_BYTES)
		return kiln_error(KILN_EDATA, "checkpoint %s: header size %u, expected %d", path, hbytes,
				  KILN_CKPT_HEADER_BYTES);
	if (flags)
		return kiln_error(KILN_EDATA, "checkpoint %s: unknown flags 0x%x", path, flags);
	for (int i = 40; i < 60; i++)
		if (h[i])
			return kiln_error(KILN_EDATA, "checkpoint %s: reserved header byte %d is not zero", path, i);
	if (total > ck->size)
		return kiln_error(KILN_EDATA, "checkpoint %s: truncated: %llu of %llu bytes", path,
				  (unsigned long long)ck->size, (unsigned long long)total);
	if (total < ck->size)
		return kiln_error(KILN_EDATA, "checkpoint %s: %llu bytes, but its header says %llu (data appended?)",
				  path, (unsigned long long)ck->size, (unsigned long long)total);
	if (step > (uint64_t)INT64_MAX)
		return kiln_error(KILN_EDATA, "checkpoint %s: step %llu out of range", path,
				  (unsigned long long)step);
	ck->step = (int64_t)step;
	/* bounded by the file size before anything is allocated for them */
	if (n == 0 || n > (ck->size - KILN_CKPT_HEADER_BYTES) / KILN_CKPT_SECTION_BYTES)
		return kiln_error(KILN_EDATA, "checkpoint %s: %u sections cannot fit in %llu bytes", path, n,
				  (unsigned long long)ck->size);
	if (!(ck->s = calloc(n, sizeof *ck->s)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	const size_t cap = 1 << 20;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return kiln_error(KILN_ENOMEM, "out of memory");
	kiln_status st = KILN_OK;
	uint64_t pos = KILN_CKPT_HEADER_BYTES;
	for (uint32_t i = 0; i < n && !st; i++) {
		uint8_t sh[KILN_CKPT_SECTION_BYTES];
		struct rsec *r = &ck->s[i];
		if (ck->size - pos < KILN_CKPT_SECTION_BYTES) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section %u of %u starts at byte %llu, past the end (%llu bytes)",
					path, i, n, (unsigned long long)pos, (unsigned long long)ck->size);
			break;
		}
		if (kiln_pread_all(ck->fd, sh, sizeof sh, pos)) {
			st = ckpt_read_error(path, "a section header");
			break;
		}
		uint32_t hs = get_u32(sh + 44), hc = kiln_crc32c(0, sh, 44);
		if (hs != hc) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section %u (at byte %llu): header checksum mismatch (stored 0x%08x, computed 0x%08x): the section header is corrupt",
					path, i, (unsigned long long)pos, hs, hc);
			break;
		}
		if (!tag_ok(sh)) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section %u (at byte %llu): malformed tag", path,
					i, (unsigned long long)pos);
			break;
		}
		memcpy(r->tag, sh, KILN_CKPT_TAG_BYTES);
		r->bytes = get_u64(sh + 32);
		r->crc = get_u32(sh + 40);
		r->off = pos + KILN_CKPT_SECTION_BYTES;
		for (uint32_t j = 0; j < i; j++)
			if (!strcmp(ck->s[j].tag, r->tag)) {
				st = kiln_error(KILN_EDATA, "checkpoint %s: section '%s' appears twice", path, r->tag);
				break;
			}
		if (st)
			break;
		if (r->bytes > ck->size - r->off) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section '%s' claims %llu bytes but only %llu remain",
					path, r->tag, (unsigned long long)r->bytes,
					(unsigned long long)(ck->size - r->off));
			break;
		}
		uint32_t c;
		if (crc_range(ck->fd, r->off, r->bytes, buf, cap, &c)) {
			st = ckpt_read_error(path, r->tag);
			break;
		}
		if (c != r->crc) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section '%s' (%llu bytes at byte %llu): checksum mismatch (stored 0x%08x, computed 0x%08x): the data is corrupt",
					path, r->tag, (unsigned long long)r->bytes,
					(unsigned long long)r->off, r->crc, c);
			break;
		}
		pos = r->off + r->bytes;
	}
	free(buf);
	if (st)
		return st;
	ck->n = (int)n;
	if (pos != ck->size)
		return kiln_error(KILN_EDATA, "checkpoint %s: %llu bytes after the last section", path,
				  (unsigned long long)(ck->size - pos));
	/* what every checkpoint has */
	uint64_t b;
	if (kiln_ckpt_find(ck, "config", &b) || kiln_ckpt_find(ck, "trainer", &b))
		return KILN_EDATA;
	if (b != KILN_CKPT_TRAINER_BYTES)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'trainer' has %llu bytes, expected %d",
				  path, (unsigned long long)b, KILN_CKPT_TRAINER_BYTES);
	struct kiln_ckpt_trainer tr;
	return kiln_ckpt_trainer_get(ck, &tr);
}

/* ck->fd, open and ck->size known: verified into *out, or ck closed. */
static kiln_status open_verified(struct kiln_ckpt *ck, struct kiln_ckpt **out)
{
	kiln_status st = verify(ck);
	if (st) {
		kiln_ckpt_close(ck);
		return st;
	}
	kiln_log(KILN_LOG_DEBUG, "ckpt", "checkpoint %s: verified, %d sections", ck->path, ck->n);
	*out = ck;
	return KILN_OK;
}

static struct kiln_ckpt *ckpt_new(const char *path)
{
	struct kiln_ckpt *ck = calloc(1, sizeof *ck);
	if (ck && !(ck->path = kiln_strdup(path))) {
		free(ck);
		return NULL;
	}
	if (ck)
		ck->fd = -1;
	return ck;
}

kiln_status kiln_ckpt_open(const char *path, struct kiln_ckpt **out)
{
	struct kiln_ckpt *ck = ckpt_new(path);
	char kind[64];
	const char *why;
	off_t size = 0;
	*out = NULL;
	if (!ck)
		return kiln_error(KILN_ENOMEM, "out of memory");
	ck->fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (ck->fd < 0) {
		kiln_status st = kiln_error(KILN_EIO, "checkpoint %s: cannot open: %s", path, why);
		kiln_ckpt_close(ck);
		return st;
	}
	ck->size = (uint64_t)size;
	return open_verified(ck, out);
}

int64_t kiln_ckpt_header_step(const char *path)
{
	char kind[64];
	const char *why;
	off_t size = 0;
	uint8_t h[KILN_CKPT_HEADER_BYTES];
	int fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (fd < 0)
		return -1;
	const int bad = size < KILN_CKPT_HEADER_BYTES || kiln_pread_all(fd, h, sizeof h, 0);
	close(fd);
	/* the checks verify() makes of the header itself */
	if (bad || memcmp(h, ckpt_magic, 8) || get_u32(h + 8) != KILN_CKPT_VERSION ||
	    get_u32(h + 60) != kiln_crc32c(0, h, 60) || get_u64(h + 32) > (uint64_t)INT64_MAX)
		return -1;
	return (int64_t)get_u64(h + 32);
}

kiln_status kiln_ckpt_open_fd(const char *path, int fd, struct kiln_ckpt **out)
{
	struct kiln_ckpt *ck = ckpt_new(path);
	struct stat sb;
	*out = NULL;
	if (!ck)
		return kiln_error(KILN_ENOMEM, "out of memory");
	/* a duplicate: the same open file, whatever is at path by now */
	if ((ck->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0 || fstat(ck->fd, &sb)) {
		kiln_status st = kiln_error(KILN_EIO, "checkpoint %s: cannot open: %s", path,
					    strerror(errno));
		kiln_ckpt_close(ck);
		return st;
	}
	ck->size = (uint64_t)sb.st_size;
	return open_verified(ck, out);
}

const struct rsec *ckpt_section(const struct kiln_ckpt *ck, const char *tag)
{
	for (int i = 0; i < ck->n; i++)
		if (!strcmp(ck->s[i].tag, tag))
			return &ck->s[i];
	return NULL;
}

kiln_status kiln_ckpt_find(const struct kiln_ckpt *ck, const char *tag, uint64_t *bytes)
{
	const struct rsec *r = ckpt_section(ck, tag);
	if (!r)
		return kiln_error(KILN_ENOTFOUND, "checkpoint %s: no section '%s'", ck->path, tag);
	*bytes = r->bytes;
	return KILN_OK;
}

kiln_status kiln_ckpt_read(struct kiln_ckpt *ck, const char *tag, void *buf, size_t bytes)
{
	const struct rsec *r = ckpt_section(ck, tag);
	if (!r)
		return kiln_error(KILN_EDATA, "checkpoint %s: no section '%s'", ck->path, tag);
	if (r->bytes != bytes)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes, expected %zu",
				  ck->path, tag, (unsigned long long)r->bytes, bytes);
	if (kiln_pread_all(ck->fd, buf, bytes, r->off))
		return ckpt_read_error(ck->path, tag);
	uint32_t c = kiln_crc32c(0, buf, bytes);
	if (c != r->crc)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' changed since it was verified (checksum 0x%08x, expected 0x%08x)",
				  ck->path, tag, c, r->crc);
	return KILN_OK;
}

kiln_status kiln_ckpt_read_text(struct kiln_ckpt *ck, const char *tag, char **out)
{
	const struct rsec *r = ckpt_section(ck, tag);
	kiln_status st;
	*out = NULL;
	if (!r)
		return kiln_error(KILN_EDATA, "checkpoint %s: no section '%s'", ck->path, tag);
	/* r->bytes was bounded by the file size in verify() */
	char *t = malloc((size_t)r->bytes + 1);
	if (!t)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_ckpt_read(ck, tag, t, (size_t)r->bytes))) {
		free(t);
		return st;
	}
	t[r->bytes] = 0;
	if (strlen(t) != r->bytes) {
		free(t);
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' is not text", ck->path, tag);
	}
	*out = t;
	return KILN_OK;
}

int kiln_ckpt_sample_parse(const char *text, int end_char, struct kiln_tensor_desc *out)
{
	int64_t dims[KILN_MAX_DIMS];
	int dtype = -1, nd = 0, ok;
	const char *q = strchr(text, ' ');
	char *end = NULL;
	for (int t = 0; q && t < KILN_DTYPE_COUNT; t++) {
		const char *name = kiln_dtype_name(t);
		if (strlen(name) == (size_t)(q - text) && !strncmp(text, name, (size_t)(q - text)))
			dtype = t;
	}
	/* "f32 1,28,28" then end_char */
	for (ok = dtype >= 0, q = q ? q + 1 : NULL; ok; q = end + 1) {
		long long v = strtoll(q, &end, 10);
		ok = end != q && v > 0 && nd < KILN_MAX_DIMS && (*end == ',' || *end == end_char);
		if (ok)
			dims[nd++] = v;
		if (!ok || *end == end_char)
			break;
	}
	/* one sample past 2^31 elements (8 GiB of f32) is no input kiln
	 * trained on: refused before anything is sized by it */
	int64_t numel = 1;
	for (int d = 0; ok && d < nd; d++)
		ok = dims[d] <= ((int64_t)1 << 31) / numel && (numel *= dims[d]) <= (int64_t)1 << 31;
	if (!ok || (end_char && end[1] != '\0'))
		return -1;
	kiln_tensor_desc_init(out, dtype, nd, dims);
	return 0;
}

kiln_status kiln_ckpt_sample(struct kiln_ckpt *ck, struct kiln_tensor_desc *out)
{
	char *text = NULL;
	uint64_t bytes;
	if (kiln_ckpt_find(ck, "sample", &bytes))
		return kiln_error(KILN_ENOTFOUND, "checkpoint %s has no 'sample' section (written by an older kiln)",
				  ck->path);
	kiln_status st = kiln_ckpt_read_text(ck, "sample", &text);
	if (st)
		return st;
	if (kiln_ckpt_sample_parse(text, '\n', out))
		st = kiln_error(KILN_EDATA, "checkpoint %s: section 'sample' is malformed (want DTYPE D0,D1,... of at most 2^31 elements)",
				ck->path);
	free(text);
	return st;
}

kiln_status kiln_ckpt_trainer_get(struct kiln_ckpt *ck, struct kiln_ckpt_trainer *out)
{
	uint8_t b[KILN_CKPT_TRAINER_BYTES];
	uint64_t v[7];
	kiln_status st = kiln_ckpt_read(ck, "trainer", b, sizeof b);
	if (st)
		return st;
	for (int i = 0; i < 7; i++) {
		v[i] = get_u64(b + 8 * i);
		if (v[i] > (uint64_t)1 << 62)
			return kiln_error(KILN_EDATA, "checkpoint %s: trainer field %d out of range (%llu)",
					  ck->path, i, (unsigned long long)v[i]);
	}
	*out = (struct kiln_ckpt_trainer){ (int64_t)v[0], (int64_t)v[1], (int64_t)v[2],
					   (int64_t)v[3], (int64_t)v[4], (int64_t)v[5],
					   (int64_t)v[6] };
	/* batch x world is the global batch: a product past 2^62 would
	 * overflow where a resume multiplies them */
	if (out->world < 1 || out->batch < 1 || out->offset > out->samples ||
	    out->step != ck->step || out->batch > ((int64_t)1 << 62) / out->world)
		return kiln_error(KILN_EDATA, "checkpoint %s: inconsistent trainer state (step %lld, epoch %lld, offset %lld, batch %lld, world %lld, samples %lld)",
				  ck->path, (long long)out->step, (long long)out->epoch,
				  (long long)out->offset, (long long)out->batch, (long long)out->world,
				  (long long)out->samples);
	return KILN_OK;
}

kiln_status kiln_ckpt_stopper_get(struct kiln_ckpt *ck, struct kiln_ckpt_stopper *out)
{
	uint8_t b[KILN_CKPT_STOPPER_BYTES];
	kiln_status st;
	if (!ckpt_section(ck, "stopper"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "stopper", b, sizeof b)))
		return st;
	memcpy(&out->best, b, 8);
	const uint64_t bad = get_u64(b + 8), have = get_u64(b + 16);
	/* (a best that is not finite: a kiln before session 39 took a first
	 * NaN loss as the best; the trainer ranks it below every finite value) */
	if (bad > (uint64_t)1 << 62 || have > 1)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'stopper' out of range (best %g, %llu evaluations without improvement, have %llu)",
				  ck->path, out->best, (unsigned long long)bad, (unsigned long long)have);
	out->bad = (int64_t)bad;
	out->have = (int64_t)have;
	return KILN_OK;
}

kiln_status kiln_ckpt_best_get(struct kiln_ckpt *ck, struct kiln_ckpt_best **out, int64_t *n)
{
	const struct rsec *r = ckpt_section(ck, "best");
	uint8_t *b;
	kiln_status st = KILN_OK;
	*out = NULL;
	*n = 0;
	if (!r)
		return KILN_ENOTFOUND;
	/* (bounded by the file's size, which open checked) */
	if (r->bytes < 8 || (r->bytes - 8) % KILN_CKPT_BEST_ENTRY_BYTES)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'best' has %llu bytes, not 8 + 16 per entry",
				  ck->path, (unsigned long long)r->bytes);
	if (!(b = malloc(r->bytes)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	const uint64_t count = (r->bytes - 8) / KILN_CKPT_BEST_ENTRY_BYTES;
	if ((st = kiln_ckpt_read(ck, "best", b, r->bytes)))
		goto out;
	if (get_u64(b) != count) {
		st = kiln_error(KILN_EDATA, "checkpoint %s: section 'best' says %llu entries in room for %llu",
				ck->path, (unsigned long long)get_u64(b), (unsigned long long)count);
		goto out;
	}
	if (count && !(*out = malloc(sizeof **out * count))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (uint64_t i = 0; i < count; i++) {
		const uint8_t *p = b + 8 + KILN_CKPT_BEST_ENTRY_BYTES * i;
		const uint64_t step = get_u64(p + 8);
		memcpy(&(*out)[i].v, p, 8);
		(*out)[i].step = (int64_t)step;
		/* (a value that is not finite: a kiln before session 39 listed a
		 * NaN loss; the trainer ranks it below every finite value) */
		if (step > (uint64_t)ck->step) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section 'best': entry %llu out of range (value %g, step %llu of a checkpoint at step %lld)",
					ck->path, (unsigned long long)i, (*out)[i].v,
					(unsigned long long)step, (long long)ck->step);
			goto out;
		}
	}
	*n = (int64_t)count;
out:
	free(b);
	if (st) {
		free(*out);
		*out = NULL;
	}
	return st;
}

kiln_status kiln_ckpt_eval_owed_get(struct kiln_ckpt *ck, int *owed)
{
	uint8_t b[8];
	kiln_status st;
	*owed = 0;
	if (!ckpt_section(ck, "eval_owed"))
		return KILN_OK;
	if ((st = kiln_ckpt_read(ck, "eval_owed", b, sizeof b)))
		return st;
	if (get_u64(b) != (uint64_t)ck->step)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'eval_owed' names step %llu, the checkpoint is of step %lld",
				  ck->path, (unsigned long long)get_u64(b), (long long)ck->step);
	*owed = 1;
	return KILN_OK;
}

kiln_status kiln_ckpt_clip_counts_get(struct kiln_ckpt *ck, int64_t out[2])
{
	uint8_t b[16];
	kiln_status st;
	out[0] = out[1] = 0;
	if (!ckpt_section(ck, "clip_counts"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "clip_counts", b, sizeof b)))
		return st;
	const uint64_t skipped = get_u64(b), clipped = get_u64(b + 8);
	if (skipped > (uint64_t)ck->step || clipped > (uint64_t)ck->step)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'clip_counts' out of range (%llu steps skipped, %llu clipped, of %lld steps)",
				  ck->path, (unsigned long long)skipped, (unsigned long long)clipped,
				  (long long)ck->step);
	out[0] = (int64_t)skipped;
	out[1] = (int64_t)clipped;
	return KILN_OK;
}

kiln_status kiln_ckpt_data_skipped_get(struct kiln_ckpt *ck, int64_t *out)
{
	uint8_t b[8];
	kiln_status st;
	*out = 0;
	if (!ckpt_section(ck, "data_skipped"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "data_skipped", b, sizeof b)))
		return st;
	const uint64_t v = get_u64(b);
	if (v > INT64_MAX)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'data_skipped' out of range (%llu)",
				  ck->path, (unsigned long long)v);
	*out = (int64_t)v;
	return KILN_OK;
}

kiln_status kiln_ckpt_plateau_get(struct kiln_ckpt *ck, struct kiln_plateau *out)
{
	uint8_t b[KILN_CKPT_PLATEAU_BYTES];
	kiln_status st;
	if (!ckpt_section(ck, "plateau"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "plateau", b, sizeof b)))
		return st;
	memcpy(&out->lr, b, 8);
	memcpy(&out->best, b + 8, 8);
	const uint64_t bad = get_u64(b + 16), cool = get_u64(b + 24), evals = get_u64(b + 32);
	/* (best may be inf, before a finite loss, or NaN never: a NaN is no
	 * improvement) */
	if (!isfinite(out->lr) || out->lr < 0 || isnan(out->best) || bad > INT64_MAX ||
	    cool > INT64_MAX || evals > INT64_MAX)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'plateau' out of range (lr %g, best %g, %llu evaluations without improvement, cooldown %llu, %llu evaluations)",
				  ck->path, out->lr, out->best, (unsigned long long)bad,
				  (unsigned long long)cool, (unsigned long long)evals);
	out->bad = (int64_t)bad;
	out->cooldown = (int64_t)cool;
	out->evals = (int64_t)evals;
	return KILN_OK;
}

kiln_status kiln_ckpt_evaluated_get(struct kiln_ckpt *ck, struct kiln_ckpt_evaluated *out,
				    int *done)
{
	uint8_t b[KILN_CKPT_EVALUATED_BYTES];
	kiln_status st;
	*done = 0;
	memset(out, 0, sizeof *out);
	if (!ckpt_section(ck, "evaluated"))
		return KILN_OK;
	if ((st = kiln_ckpt_read(ck, "evaluated", b, sizeof b)))
		return st;
	const uint64_t step = get_u64(b), samples = get_u64(b + 32), has_test = get_u64(b + 40),
		       test_samples = get_u64(b + 72);
	if (step != (uint64_t)ck->step || samples > (uint64_t)1 << 62 || has_test > 1 ||
	    test_samples > (uint64_t)1 << 62)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'evaluated' out of range (step %llu of a checkpoint of step %lld, %llu samples, has_test %llu, %llu test samples)",
				  ck->path, (unsigned long long)step, (long long)ck->step,
				  (unsigned long long)samples, (unsigned long long)has_test,
				  (unsigned long long)test_samples);
	memcpy(&out->loss, b + 8, 8);
	memcpy(&out->acc, b + 16, 8);
	memcpy(&out->acc5, b + 24, 8);
	out->samples = (int64_t)samples;
	out->has_test = (int64_t)has_test;
	memcpy(&out->test_loss, b + 48, 8);
	memcpy(&out->test_acc, b + 56, 8);
	memcpy(&out->test_acc5, b + 64, 8);
	out->test_samples = (int64_t)test_samples;
	*done = 1;
	return KILN_OK;
}

/* The "interval" section's head, range-checked (b: its 80 bytes, n its
 * length). */
static kiln_status interval_head(const struct kiln_ckpt *ck, const uint8_t *b, uint64_t n,
				 struct kiln_ckpt_interval *out)
{
	const uint64_t lim = (uint64_t)1 << 62;
	const uint64_t closed = get_u64(b), start = get_u64(b + 8), samples = get_u64(b + 16),
		       rows = get_u64(b + 24), skipped = get_u64(b + 32), ep_n = get_u64(b + 56),
		       P = get_u64(b + 64), ranks = get_u64(b + 72);
	memcpy(&out->loss, b + 40, 8);
	memcpy(&out->correct, b + 48, 8);
	if (closed > 1 || start > (uint64_t)ck->step || samples < 1 || samples > lim ||
	    rows > lim || skipped > (uint64_t)ck->step || ep_n > lim || P < 1 || ranks < 1 ||
	    ranks % P || (n - KILN_CKPT_INTERVAL_BYTES) / KILN_CKPT_INTERVAL_RANK_BYTES != ranks)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'interval' out of range (closed %llu, start step %llu of a checkpoint at step %lld, %llu samples, %llu rows, %llu skipped, %llu samples before it, %llu stages, %llu ranks in %llu bytes)",
				  ck->path, (unsigned long long)closed, (unsigned long long)start,
				  (long long)ck->step, (unsigned long long)samples,
				  (unsigned long long)rows, (unsigned long long)skipped,
				  (unsigned long long)ep_n, (unsigned long long)P,
				  (unsigned long long)ranks, (unsigned long long)n);
	out->closed = (int64_t)closed;
	out->start = (int64_t)start;
	out->samples = (int64_t)samples;
	out->rows = (int64_t)rows;
	out->skipped = (int64_t)skipped;
	out->epoch_samples = (int64_t)ep_n;
	out->pipeline = (int64_t)P;
	out->ranks = (int64_t)ranks;
	return KILN_OK;
}

/* A correct count may pass the samples it counts by f32 rounding alone (a
 * token window's sample counts the share of its targets right: sums of
 * fractions); 2^-10 more is far past that, and far below a forged one. */
#define COUNT_SLACK (1.0 + 1.0 / 1024)

/* An epoch's training sums so far as a checkpoint holds them: the
 * "epoch" section's, or the "interval" section's before its interval
 * (after: its samples a rank, 0 for the epoch's). */
struct epoch_sums {
	const char *section, *what; /* the section, the sums in it (messages) */
	double loss, correct;
	uint64_t samples;            /* a rank's */
	int64_t after;               /* the samples a rank the epoch holds after them */
};

/* The trainer section's epoch and the clip op's skipped steps (0 without
 * its "clip_counts" section) of ck: what its run could have trained. */
static kiln_status trained_bounds(struct kiln_ckpt *ck, struct kiln_ckpt_trainer *tr,
				  int64_t clip[2])
{
	kiln_status st = kiln_ckpt_trainer_get(ck, tr);
	if (st || ((st = kiln_ckpt_clip_counts_get(ck, clip)) && st != KILN_ENOTFOUND))
		return st;
	return KILN_OK;
}

/* e's values against what its run could have trained (the CRCs prove a
 * file whole, not sane; the "trainer" section's tr, `skipped` steps the
 * clip op skipped for non-finite gradients by then): a rank's samples and
 * those after them no more than the epoch holds, the correct count finite,
 * >= 0 and no more than the samples it counts, the loss sum not finite
 * only where a step was skipped.  One rule for both sections (the epoch's
 * before session 41 took a NaN loss and any correct count up to 2^62). */
static kiln_status epoch_sums_sane(const struct kiln_ckpt *ck, const struct epoch_sums *e,
				   const struct kiln_ckpt_trainer *tr, int64_t skipped,
				   const char *by)
{
	/* (the samples after them past the epoch refused on their own: a room
	 * clamped to 0 took epoch_samples 0 with any interval up to 2^62) */
	const int past = e->after < 0 || e->after > tr->samples;
	const uint64_t room = past ? 0 : (uint64_t)(tr->samples - e->after);
	if (past || e->samples > room || !isfinite(e->correct) || e->correct < 0 ||
	    e->correct > (double)e->samples * COUNT_SLACK)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s': %s out of range: correct %g of %llu samples a rank (finite, >= 0, at most the samples); %llu + %lld samples a rank in an epoch of %lld",
				  ck->path, e->section, e->what, e->correct,
				  (unsigned long long)e->samples, (unsigned long long)e->samples,
				  (long long)e->after, (long long)tr->samples);
	if (!isfinite(e->loss) && skipped < 1)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s': %s: a loss sum that is not finite (%g) with no step skipped for non-finite gradients there (0 skipped by %s)",
				  ck->path, e->section, e->what, e->loss, by);
	return KILN_OK;
}

/* The interval's values against what its run could have trained: the
 * device's rows no more than the samples, each correct count no more
 * than the samples it counts, every rank's together no more than the
 * interval's samples on every rank; a loss sum not finite only where the
 * clip op skipped a step for non-finite gradients (its "clip_counts"
 * section) in the interval (its count past the interval's `skipped`) for
 * the ranks' sums; the epoch's sums before it epoch_sums_sane's, a step
 * skipped before it (`skipped` > 0) allowing a loss not finite. */
static kiln_status interval_sane(struct kiln_ckpt *ck, const struct kiln_ckpt_interval *iv)
{
	struct kiln_ckpt_trainer tr;
	int64_t clip[2];
	kiln_status st = trained_bounds(ck, &tr, clip);
	const struct epoch_sums before = { "interval", "the epoch's sums before the interval",
					   iv->loss, iv->correct, (uint64_t)iv->epoch_samples,
					   iv->samples };
	if (st || (st = epoch_sums_sane(ck, &before, &tr, iv->skipped, "its start")))
		return st;
	const double all = (double)iv->samples * (double)iv->ranks * COUNT_SLACK;
	double correct = 0;
	int finite = 1;
	for (int64_t r = 0; r < iv->ranks; r++) {
		const struct kiln_ckpt_interval_rank *e = &iv->rank[r];
		correct += (double)e->sums[1] + e->carry[1];
		finite &= isfinite(e->sums[0]) && isfinite(e->carry[0]);
		if (e->sums[2] > all)
			return kiln_error(KILN_EDATA, "checkpoint %s: section 'interval': rank %lld's top-5 correct count %g is more than the interval's %lld samples on each of %lld ranks",
					  ck->path, (long long)r, e->sums[2], (long long)iv->samples,
					  (long long)iv->ranks);
	}
	if (iv->rows > iv->samples || correct > all)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'interval': more than its run trained (%lld rows of %lld samples, correct %g of %lld samples on each of %lld ranks in it)",
				  ck->path, (long long)iv->rows, (long long)iv->samples, correct,
				  (long long)iv->samples, (long long)iv->ranks);
	if (!finite && clip[0] <= iv->skipped)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'interval': a loss sum that is not finite (a rank's, in the interval) with no step skipped for non-finite gradients there (%lld skipped by its start, %lld by the checkpoint's step)",
				  ck->path, (long long)iv->skipped, (long long)clip[0]);
	return KILN_OK;
}

kiln_status kiln_ckpt_interval_get(struct kiln_ckpt *ck, struct kiln_ckpt_interval *out)
{
	const struct rsec *r = ckpt_section(ck, "interval");
	kiln_status st;
	uint8_t *b;
	memset(out, 0, sizeof *out);
	if (!r)
		return KILN_ENOTFOUND;
	/* (bounded by the file's size, which open checked) */
	if (r->bytes < KILN_CKPT_INTERVAL_BYTES + KILN_CKPT_INTERVAL_RANK_BYTES ||
	    (r->bytes - KILN_CKPT_INTERVAL_BYTES) % KILN_CKPT_INTERVAL_RANK_BYTES)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'interval' has %llu bytes, not %d + %d per rank",
				  ck->path, (unsigned long long)r->bytes, KILN_CKPT_INTERVAL_BYTES,
				  KILN_CKPT_INTERVAL_RANK_BYTES);
	if (!(b = malloc(r->bytes)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	if ((st = kiln_ckpt_read(ck, "interval", b, r->bytes)) ||
	    (st = interval_head(ck, b, r->bytes, out)))
		goto out;
	if (!(out->rank = malloc(sizeof *out->rank * (size_t)out->ranks))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
		goto out;
	}
	for (int64_t i = 0; i < out->ranks; i++) {
		const uint8_t *p = b + KILN_CKPT_INTERVAL_BYTES + KILN_CKPT_INTERVAL_RANK_BYTES * i;
		struct kiln_ckpt_interval_rank *e = &out->rank[i];
		memcpy(e->sums, p, 12);
		memcpy(e->carry, p + 16, 16);
		if (!(e->sums[1] >= 0) || !(e->sums[2] >= 0) || !isfinite(e->sums[1]) ||
		    !isfinite(e->sums[2]) || !isfinite(e->carry[1]) || e->carry[1] < 0) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section 'interval': rank %lld's correct counts (%g, %g, carried %g) are out of range (finite, >= 0)",
					ck->path, (long long)i, e->sums[1], e->sums[2], e->carry[1]);
			goto out;
		}
	}
	st = interval_sane(ck, out);
out:
	free(b);
	if (st) {
		free(out->rank);
		out->rank = NULL;
	}
	return st;
}

kiln_status kiln_ckpt_epoch_get(struct kiln_ckpt *ck, struct kiln_ckpt_epoch *out)
{
	uint8_t b[KILN_CKPT_EPOCH_BYTES];
	kiln_status st;
	if (!ckpt_section(ck, "epoch"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "epoch", b, sizeof b)))
		return st;
	struct epoch_sums e = { "epoch", "the epoch's sums", 0, 0, get_u64(b + 16), 0 };
	struct kiln_ckpt_trainer tr;
	int64_t clip[2];
	memcpy(&e.loss, b, 8);
	memcpy(&e.correct, b + 8, 8);
	/* (a loss not finite: a step skipped by the checkpoint's, as a log
	 * point would have let it through) */
	if ((st = trained_bounds(ck, &tr, clip)) ||
	    (st = epoch_sums_sane(ck, &e, &tr, clip[0], "the checkpoint's step")))
		return st;
	*out = (struct kiln_ckpt_epoch){ e.loss, e.correct, (int64_t)e.samples };
	return KILN_OK;
}

