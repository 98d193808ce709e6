/* core/checkpoint.c - checkpoint files (see checkpoint.h and
 * docs/checkpoints.md for the byte layout).
 *
 *   offset 0   header                     64 bytes
 *   offset 64  section 0: header 48 bytes, then its payload
 *              section 1 ...              (no padding between them)
 *   the file ends after the last payload: its size is the header's
 *
 * Every byte is under a CRC32C: the header's bytes 0..59 (CRC at 60), each
 * section header's bytes 0..43 (CRC at 44), each payload (CRC in its
 * section header).  So any flipped byte and any truncation is refused.
 */
#include "checkpoint.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints store device buffers as little-endian bytes: port kiln_ckpt_save first"
#endif

static const char MAGIC[8] = { 'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T' };

/* ---- little-endian fields ------------------------------------------------ */

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* File I/O goes through kiln_write_all and kiln_pread_all (internal.h),
 * which survive EINTR and short transfers. */

static kiln_status read_error(const char *path, const char *what)
{
	if (errno == 0)
		return kiln_error(KILN_EDATA, "checkpoint %s: truncated while reading %s", path, what);
	return kiln_error(KILN_EIO, "checkpoint %s: cannot read %s: %s", path, what, strerror(errno));
}

/* ---- text pieces --------------------------------------------------------- */

static char *config_text(const struct kiln_config *cfg, const struct kiln_registry *reg,
			 int defaults)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f) {
		kiln_error(KILN_ENOMEM, "out of memory");
		return NULL;
	}
	/* kiln_config_write only reads the registry */
	struct kiln_registry *r = (struct kiln_registry *)reg;
	kiln_status st = defaults ? kiln_config_write_defaults(cfg, r, f) : kiln_config_write(cfg, r, f);
	if (fclose(f) || st) {
		free(text);
		kiln_error(KILN_EIO, "cannot write the resolved config");
		return NULL;
	}
	return text;
}

char *kiln_ckpt_config_text(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	return config_text(cfg, reg, 0);
}

char *kiln_ckpt_config_defaults(const struct kiln_config *cfg, const struct kiln_registry *reg)
{
	return config_text(cfg, reg, 1);
}

char *kiln_ckpt_versions(const struct kiln_registry *reg, const struct kiln_device *dev)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	fprintf(f, "kiln = %s\nformat = %d\nplugin_abi = %d.%d\n", kiln_version(),
		KILN_CKPT_VERSION, KILN_ABI_MAJOR, KILN_ABI_MINOR);
	if (dev)
		fprintf(f, "device = %s\n", kiln_device_name(dev));
	for (int i = 0; reg && i < kiln_registry_loaded_count(reg); i++) {
		struct kiln_plugin_info pi = KILN_PLUGIN_INFO_INIT;
		kiln_registry_plugin_get(reg, i, &pi);
		if (pi.available && strcmp(pi.file, "(built-in)"))
			fprintf(f, "plugin = %s %s %u.%u %s\n", kiln_plugin_kind_name(pi.kind), pi.name,
				pi.abi_major, pi.abi_minor, pi.file);
	}
	if (fclose(f)) {
		free(text);
		return NULL;
	}
	return text;
}

/* One line per parameter: "name region offset numel dtype dims". */
static char *tensors_text(const struct kiln_model *m)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		fprintf(f, "%s %s %zu %lld %s ", p->name, p->buffer ? "buffers" : "params", p->off,
			(long long)p->numel, kiln_dtype_name(p->desc.dtype));
		for (int d = 0; d < p->desc.ndim; d++)
			fprintf(f, d ? ",%lld" : "%lld", (long long)p->desc.dims[d]);
		fprintf(f, "\n");
	}
	if (fclose(f)) {
		free(text);
		return NULL;
	}
	return text;
}

/* The "sample" section: one sample of the model's input, "DTYPE D0,D1,...\n"
 * (f32 1,28,28), so that a model can be rebuilt without its data. */
static void sample_text(const struct kiln_tensor_desc *d, char *out, size_t len)
{
	size_t n = (size_t)snprintf(out, len, "%s ", kiln_dtype_name(d->dtype));
	for (int i = 0; i < d->ndim && n < len; i++)
		n += (size_t)snprintf(out + n, len - n, i ? ",%lld" : "%lld", (long long)d->dims[i]);
	if (n < len)
		snprintf(out + n, len - n, "\n");
}

/* ---- writing ------------------------------------------------------------- */

struct wsec {
	char tag[KILN_CKPT_TAG_BYTES];
	const void *host;   /* host bytes, or */
	const void *dev;    /* device bytes, staged through the host, or */
	int from_src;       /* bytes the source reads (struct kiln_ckpt_src) */
	size_t bytes;
};

/* A device section's and a source's bytes go through one host buffer of
 * this size, piece by piece (KILN_CKPT_PIECE_BYTES). */
#define PIECE KILN_CKPT_PIECE_BYTES

static void section_header(uint8_t h[KILN_CKPT_SECTION_BYTES], const char *tag, uint64_t bytes,
			   uint32_t crc)
{
	memset(h, 0, KILN_CKPT_SECTION_BYTES);
	memcpy(h, tag, strlen(tag));
	put_u64(h + 32, bytes);
	put_u32(h + 40, crc);
	put_u32(h + 44, kiln_crc32c(0, h, 44));
}

/* Bytes [off, off + n) of section s into the host buffer `stage`. */
static kiln_status piece(const struct wsec *s, size_t off, size_t n, void *stage,
			 const struct kiln_ckpt_src *src, struct kiln_device *dev, void *stream)
{
	kiln_status st;
	if (s->from_src)
		return src->read(src->ctx, s->tag, off, stage, n);
	if ((st = kiln_device_copy_async(dev, stage, (const char *)s->dev + off, n, KILN_COPY_D2H,
					 stream)))
		return st;
	return kiln_device_stream_sync(dev, stream);
}

/* Section s's header and payload at the file's end (offset *pos): a host
 * section at once, a device or source section piece by piece through
 * `stage`, its header (whose CRC covers the payload) written again after. */
static kiln_status write_section(const char *tmp, int fd, const struct wsec *s, uint64_t *pos,
				 void *stage, const struct kiln_ckpt_src *src,
				 struct kiln_device *dev, void *stream)
{
	uint8_t sh[KILN_CKPT_SECTION_BYTES];
	uint32_t crc = 0;
	kiln_status st = KILN_OK;
	if (!s->dev && !s->from_src) {
		section_header(sh, s->tag, s->bytes, kiln_crc32c(0, s->host, s->bytes));
		if (kiln_write_all(fd, sh, sizeof sh) || kiln_write_all(fd, s->host, s->bytes))
			return kiln_error(KILN_EIO, "%s: write failed: %s", tmp, strerror(errno));
		*pos += sizeof sh + s->bytes;
		return KILN_OK;
	}
	section_header(sh, s->tag, s->bytes, 0);
	if (kiln_write_all(fd, sh, sizeof sh))
		return kiln_error(KILN_EIO, "%s: write failed: %s", tmp, strerror(errno));
	for (size_t off = 0; off < s->bytes; off += PIECE) {
		const size_t n = s->bytes - off < PIECE ? s->bytes - off : PIECE;
		if ((st = piece(s, off, n, stage, src, dev, stream)))
			return st;
		crc = kiln_crc32c(crc, stage, n);
		if (kiln_write_all(fd, stage, n))
			return kiln_error(KILN_EIO, "%s: write failed: %s", tmp, strerror(errno));
	}
	section_header(sh, s->tag, s->bytes, crc);
	/* (whole, through EINTR and a short write, as every write here:
	 * before session 36 one pwrite call, a short one an error) */
	if (kiln_pwrite_all(fd, sh, sizeof sh, *pos))
		return kiln_error(KILN_EIO, "%s: write failed: %s", tmp, strerror(errno));
	*pos += sizeof sh + s->bytes;
	return KILN_OK;
}

static kiln_status write_file(const char *tmp, int fd, const struct wsec *s, int n, int64_t step,
			      const struct kiln_ckpt_src *src, struct kiln_device *dev,
			      void *stream)
{
	uint8_t h[KILN_CKPT_HEADER_BYTES];
	uint64_t total = KILN_CKPT_HEADER_BYTES, pos = KILN_CKPT_HEADER_BYTES;
	void *stage = NULL;
	kiln_status st = KILN_OK;
	for (int i = 0; i < n; i++)
		total += KILN_CKPT_SECTION_BYTES + s[i].bytes;
	memset(h, 0, sizeof h);
	memcpy(h, MAGIC, 8);
	put_u32(h + 8, KILN_CKPT_VERSION);
	put_u32(h + 12, KILN_CKPT_HEADER_BYTES);
	put_u64(h + 16, total);
	put_u32(h + 24, (uint32_t)n);
	put_u32(h + 28, 0); /* flags */
	put_u64(h + 32, (uint64_t)step);
	put_u32(h + 60, kiln_crc32c(0, h, 60));
	if (kiln_write_all(fd, h, sizeof h))
		return kiln_error(KILN_EIO, "%s: write failed: %s", tmp, strerror(errno));
	/* device and source sections go through one staging buffer of a piece
	 * (before session 12: the largest section's size) */
	if ((st = kiln_device_host_alloc(dev, PIECE, &stage)))
		return kiln_error_wrap(st, "%s: the checkpoint's staging buffer (%d KiB)", tmp,
				       (int)(PIECE >> 10));
	for (int i = 0; i < n && !st; i++)
		st = write_section(tmp, fd, &s[i], &pos, stage, src, dev, stream);
	kiln_device_host_free(dev, stage);
	return st;
}

/* Section s: `bytes` bytes of host memory at p, tagged `tag`. */
static void host_section(struct wsec *s, const char *tag, const void *p, size_t bytes)
{
	snprintf(s->tag, sizeof s->tag, "%s", tag);
	s->host = p;
	s->bytes = bytes;
}

/* The model's state sections into s (from n on); with a source, the
 * sections it owns are its, and the optimizer's slots, which a model
 * without its whole state (m->state_d NULL) does not list, are added after
 * "buffers" at src->slot_bytes each.  Returns the new count. */
static int state_sections(struct kiln_model *m, const struct kiln_ckpt_src *src, struct wsec *s,
			  int n)
{
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	const int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	const int add = src && !m->state_d && src->slot_bytes ? m->state_slots : 0;
	for (int i = 0; i < nb; i++, n++) {
		snprintf(s[n].tag, sizeof s[n].tag, "%s", sb[i].name);
		s[n].dev = sb[i].ptr;
		s[n].bytes = sb[i].bytes;
		s[n].from_src = src && src->owns(src->ctx, sb[i].name);
		/* (the slots follow "buffers", or "params" where none) */
		const int slots_next = !strcmp(sb[i].name, "buffers") ||
				       (!strcmp(sb[i].name, "params") &&
					(i + 1 == nb || strcmp(sb[i + 1].name, "buffers")));
		if (!add || !slots_next)
			continue;
		for (int k = 0; k < add; k++) {
			n++;
			snprintf(s[n].tag, sizeof s[n].tag, "%s", m->optim_info.slot_names[k]);
			s[n].dev = NULL;
			s[n].bytes = src->slot_bytes;
			s[n].from_src = 1;
		}
	}
	return n;
}

/* The "best" section's payload for n entries (malloc'd; NULL when out of
 * memory). */
static uint8_t *best_bytes(const struct kiln_ckpt_best *e, int64_t n)
{
	uint8_t *b = malloc(8 + KILN_CKPT_BEST_ENTRY_BYTES * (size_t)n);
	if (!b)
		return NULL;
	put_u64(b, (uint64_t)n);
	for (int64_t i = 0; i < n; i++) {
		uint8_t *p = b + 8 + KILN_CKPT_BEST_ENTRY_BYTES * i;
		memcpy(p, &e[i].v, 8);
		put_u64(p + 8, (uint64_t)e[i].step);
	}
	return b;
}

kiln_status kiln_ckpt_save(const char *dir, const struct kiln_ckpt_meta *meta,
			   struct kiln_model *m, void *stream, char *path, size_t path_len)
{
	return kiln_ckpt_save_src(dir, meta, m, stream, NULL, path, path_len);
}

kiln_status kiln_ckpt_save_src(const char *dir, const struct kiln_ckpt_meta *meta,
			       struct kiln_model *m, void *stream, const struct kiln_ckpt_src *src,
			       char *path, size_t path_len)
{
	struct wsec s[14 + 2 * KILN_MAX_STATE_BUFS];
	uint8_t tr[KILN_CKPT_TRAINER_BYTES], tracked[8], ep[KILN_CKPT_EPOCH_BYTES],
		sp[KILN_CKPT_STOPPER_BYTES], owed[8], done[KILN_CKPT_EVALUATED_BYTES], cc[16],
		ds[8];
	char final[4200], tmp[4210], sample[160];
	kiln_status st;
	int n = 0;
	const char *config = meta->config ? meta->config : "";
	const char *versions = meta->versions ? meta->versions : "";
	char *tensors = tensors_text(m), *wkeys = kiln_ckpt_weights_keys(config);
	uint8_t *best = meta->best ? best_bytes(meta->best, meta->n_best) : NULL;
	if (!tensors || !wkeys || (meta->best && !best)) {
		free(tensors);
		free(wkeys);
		free(best);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	const struct kiln_ckpt_trainer *t = &meta->trainer;
	const int64_t v[7] = { t->epoch, t->step, t->offset, t->seed, t->world, t->batch, t->samples };
	for (int i = 0; i < 7; i++)
		put_u64(tr + 8 * i, (uint64_t)v[i]);
	put_u64(tracked, (uint64_t)m->tracked_base);
	memset(s, 0, sizeof s);
	host_section(&s[n++], "config", config, strlen(config));
	host_section(&s[n++], "trainer", tr, sizeof tr);
	host_section(&s[n++], "versions", versions, strlen(versions));
	host_section(&s[n++], "tensors", tensors, strlen(tensors));
	host_section(&s[n++], "weights_keys", wkeys, strlen(wkeys));
	host_section(&s[n++], "tracked", tracked, sizeof tracked);
	sample_text(&m->sample, sample, sizeof sample);
	host_section(&s[n++], "sample", sample, strlen(sample));
	if (meta->epoch) {
		memcpy(ep, &meta->epoch->loss, 8);
		memcpy(ep + 8, &meta->epoch->correct, 8);
		put_u64(ep + 16, (uint64_t)meta->epoch->samples);
		host_section(&s[n++], "epoch", ep, sizeof ep);
	}
	if (meta->stopper) {
		memcpy(sp, &meta->stopper->best, 8);
		put_u64(sp + 8, (uint64_t)meta->stopper->bad);
		put_u64(sp + 16, (uint64_t)meta->stopper->have);
		host_section(&s[n++], "stopper", sp, sizeof sp);
	}
	if (best)
		host_section(&s[n++], "best", best, 8 + KILN_CKPT_BEST_ENTRY_BYTES * (size_t)meta->n_best);
	if (meta->eval_owed) {
		put_u64(owed, (uint64_t)t->step);
		host_section(&s[n++], "eval_owed", owed, sizeof owed);
	}
	if (meta->evaluated) {
		const struct kiln_ckpt_evaluated *e = meta->evaluated;
		put_u64(done, (uint64_t)t->step);
		memcpy(done + 8, &e->loss, 8);
		memcpy(done + 16, &e->acc, 8);
		memcpy(done + 24, &e->acc5, 8);
		put_u64(done + 32, (uint64_t)e->samples);
		put_u64(done + 40, (uint64_t)e->has_test);
		memcpy(done + 48, &e->test_loss, 8);
		memcpy(done + 56, &e->test_acc, 8);
		memcpy(done + 64, &e->test_acc5, 8);
		put_u64(done + 72, (uint64_t)e->test_samples);
		host_section(&s[n++], "evaluated", done, sizeof done);
	}
	if (meta->clip_counts) {
		put_u64(cc, (uint64_t)meta->clip_counts[0]);
		put_u64(cc + 8, (uint64_t)meta->clip_counts[1]);
		host_section(&s[n++], "clip_counts", cc, sizeof cc);
	}
	if (meta->data_skipped) {
		put_u64(ds, (uint64_t)*meta->data_skipped);
		host_section(&s[n++], "data_skipped", ds, sizeof ds);
	}
	n = state_sections(m, src, s, n);
	snprintf(final, sizeof final, "%s/ckpt-%lld.kiln", dir, (long long)t->step);
	snprintf(tmp, sizeof tmp, "%s.tmp", final);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		free(tensors);
		free(wkeys);
		free(best);
		return kiln_error(KILN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
	}
	st = write_file(tmp, fd, s, n, t->step, src, m->dev, stream);
	free(tensors);
	free(wkeys);
	free(best);
	if (!st && fsync(fd))
		st = kiln_error(KILN_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
	if (close(fd) && !st)
		st = kiln_error(KILN_EIO, "%s: close failed: %s", tmp, strerror(errno));
	if (!st && rename(tmp, final))
		st = kiln_error(KILN_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
	if (st) {
		unlink(tmp);
		return st;
	}
	if ((st = kiln_fsync_dir(dir)))
		return st;
	if (path)
		snprintf(path, path_len, "%s", final);
	return KILN_OK;
}

/* ---- reading ------------------------------------------------------------- */

struct rsec {
	char tag[KILN_CKPT_TAG_BYTES];
	uint64_t off, bytes;
	uint32_t crc;
};

struct kiln_ckpt {
	char *path;
	int fd;
	uint64_t size;
	int64_t step;
	int n;
	struct rsec *s;
};

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
		if (ck->size >= 8 && kiln_pread_all(ck->fd, h, 8, 0) == 0 && memcmp(h, MAGIC, 8))
			return kiln_error(KILN_EDATA, "checkpoint %s: not a kiln checkpoint (no KILNCKPT magic)",
					  path);
		return kiln_error(KILN_EDATA, "checkpoint %s: truncated: %llu bytes, shorter than the %d-byte header",
				  path, (unsigned long long)ck->size, KILN_CKPT_HEADER_BYTES);
	}
	if (kiln_pread_all(ck->fd, h, sizeof h, 0))
		return read_error(path, "the header");
	if (memcmp(h, MAGIC, 8))
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
			st = read_error(path, "a section header");
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
			st = read_error(path, r->tag);
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

static const struct rsec *find(const struct kiln_ckpt *ck, const char *tag)
{
	for (int i = 0; i < ck->n; i++)
		if (!strcmp(ck->s[i].tag, tag))
			return &ck->s[i];
	return NULL;
}

kiln_status kiln_ckpt_find(const struct kiln_ckpt *ck, const char *tag, uint64_t *bytes)
{
	const struct rsec *r = find(ck, tag);
	if (!r)
		return kiln_error(KILN_ENOTFOUND, "checkpoint %s: no section '%s'", ck->path, tag);
	*bytes = r->bytes;
	return KILN_OK;
}

kiln_status kiln_ckpt_read(struct kiln_ckpt *ck, const char *tag, void *buf, size_t bytes)
{
	const struct rsec *r = find(ck, tag);
	if (!r)
		return kiln_error(KILN_EDATA, "checkpoint %s: no section '%s'", ck->path, tag);
	if (r->bytes != bytes)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes, expected %zu",
				  ck->path, tag, (unsigned long long)r->bytes, bytes);
	if (kiln_pread_all(ck->fd, buf, bytes, r->off))
		return read_error(ck->path, tag);
	uint32_t c = kiln_crc32c(0, buf, bytes);
	if (c != r->crc)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' changed since it was verified (checksum 0x%08x, expected 0x%08x)",
				  ck->path, tag, c, r->crc);
	return KILN_OK;
}

kiln_status kiln_ckpt_read_text(struct kiln_ckpt *ck, const char *tag, char **out)
{
	const struct rsec *r = find(ck, tag);
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

kiln_status kiln_ckpt_sample(struct kiln_ckpt *ck, struct kiln_tensor_desc *out)
{
	char *text = NULL;
	int64_t dims[KILN_MAX_DIMS];
	int dtype = -1, nd = 0, ok;
	uint64_t bytes;
	if (kiln_ckpt_find(ck, "sample", &bytes))
		return kiln_error(KILN_ENOTFOUND, "checkpoint %s has no 'sample' section (written by an older kiln)",
				  ck->path);
	kiln_status st = kiln_ckpt_read_text(ck, "sample", &text);
	if (st)
		return st;
	/* "f32 1,28,28\n" */
	char *q = strchr(text, ' '), *end = NULL;
	if (q) {
		*q++ = '\0';
		for (int t = 0; t < KILN_DTYPE_COUNT; t++)
			if (!strcmp(text, kiln_dtype_name(t)))
				dtype = t;
	}
	for (ok = dtype >= 0; ok; q = end + 1) {
		long long v = strtoll(q, &end, 10);
		ok = end != q && v > 0 && nd < KILN_MAX_DIMS && (*end == ',' || *end == '\n');
		if (ok)
			dims[nd++] = v;
		if (!ok || *end == '\n')
			break;
	}
	/* one sample past 2^31 elements (8 GiB of f32) is no input kiln
	 * trained on: refused before anything is sized by it */
	int64_t numel = 1;
	for (int d = 0; ok && d < nd; d++)
		ok = dims[d] <= ((int64_t)1 << 31) / numel && (numel *= dims[d]) <= (int64_t)1 << 31;
	if (!ok || end[1] != '\0')
		st = kiln_error(KILN_EDATA, "checkpoint %s: section 'sample' is malformed (want DTYPE D0,D1,... of at most 2^31 elements)",
				ck->path);
	else
		kiln_tensor_desc_init(out, dtype, nd, dims);
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
	if (!find(ck, "stopper"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "stopper", b, sizeof b)))
		return st;
	memcpy(&out->best, b, 8);
	const uint64_t bad = get_u64(b + 8), have = get_u64(b + 16);
	if (bad > (uint64_t)1 << 62 || have > 1 || (have && !isfinite(out->best)))
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'stopper' out of range (best %g, %llu evaluations without improvement, have %llu)",
				  ck->path, out->best, (unsigned long long)bad, (unsigned long long)have);
	out->bad = (int64_t)bad;
	out->have = (int64_t)have;
	return KILN_OK;
}

kiln_status kiln_ckpt_best_get(struct kiln_ckpt *ck, struct kiln_ckpt_best **out, int64_t *n)
{
	const struct rsec *r = find(ck, "best");
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
		if (!isfinite((*out)[i].v) || step > (uint64_t)ck->step) {
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
	if (!find(ck, "eval_owed"))
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
	if (!find(ck, "clip_counts"))
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
	if (!find(ck, "data_skipped"))
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

kiln_status kiln_ckpt_evaluated_get(struct kiln_ckpt *ck, struct kiln_ckpt_evaluated *out,
				    int *done)
{
	uint8_t b[KILN_CKPT_EVALUATED_BYTES];
	kiln_status st;
	*done = 0;
	memset(out, 0, sizeof *out);
	if (!find(ck, "evaluated"))
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

kiln_status kiln_ckpt_epoch_get(struct kiln_ckpt *ck, struct kiln_ckpt_epoch *out)
{
	uint8_t b[KILN_CKPT_EPOCH_BYTES];
	uint64_t n;
	kiln_status st;
	if (!find(ck, "epoch"))
		return KILN_ENOTFOUND;
	if ((st = kiln_ckpt_read(ck, "epoch", b, sizeof b)))
		return st;
	memcpy(&out->loss, b, 8);
	memcpy(&out->correct, b + 8, 8);
	n = get_u64(b + 16);
	if (n > (uint64_t)1 << 62)
		return kiln_error(KILN_EDATA, "checkpoint %s: epoch sample count out of range (%llu)",
				  ck->path, (unsigned long long)n);
	out->samples = (int64_t)n;
	if (!isfinite(out->correct) || out->correct < 0)
		return kiln_error(KILN_EDATA, "checkpoint %s: section 'epoch': the correct count %g is out of range (finite, >= 0)",
				  ck->path, out->correct);
	return KILN_OK;
}

int kiln_ckpt_is_checkpoint(const char *path)
{
	char kind[64];
	const char *why;
	int fd = common_open_file(path, kind, sizeof kind, &why, NULL), yes = 0;
	if (fd < 0)
		return 0;
	yes = kiln_ckpt_is_checkpoint_fd(fd);
	close(fd);
	return yes;
}

int kiln_ckpt_is_checkpoint_fd(int fd)
{
	char h[8];
	return kiln_pread_all(fd, h, sizeof h, 0) == 0 && !memcmp(h, MAGIC, 8);
}

/* The batchnorm count the checkpoint's weights stand at: its "tracked"
 * section, plus the "step" buffer's micro-steps when that is not loaded
 * with them (what).  A checkpoint of an older kiln has no "tracked": for a
 * resume (LOAD_ALL) *out is left as it is (the same init_from loaded it),
 * else it counts from 0. */
static kiln_status tracked_count(struct kiln_ckpt *ck, int what, int64_t *out)
{
	const struct rsec *step = find(ck, "step");
	uint8_t b[8];
	kiln_status st;
	/* each count is checked before the sum: INT64_MAX + the step was
	 * signed overflow (undefined) */
	const uint64_t most = (uint64_t)1 << 62;
	uint64_t v;
	if (find(ck, "tracked")) {
		if ((st = kiln_ckpt_read(ck, "tracked", b, sizeof b)))
			return st;
		if ((v = get_u64(b)) > most)
			return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
		*out = (int64_t)v;
	} else if (what == KILN_CKPT_LOAD_WEIGHTS) {
		*out = 0;
	}
	if (what == KILN_CKPT_LOAD_WEIGHTS && step && step->bytes == sizeof b) {
		if ((st = kiln_ckpt_read(ck, "step", b, sizeof b)))
			return st;
		if ((v = get_u64(b)) > most)
			return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
		*out += (int64_t)v; /* both at most 2^62: no overflow */
	}
	if (*out < 0 || *out > (int64_t)most)
		return kiln_error(KILN_EDATA, "checkpoint %s: batch count out of range", ck->path);
	return KILN_OK;
}

/* The counters among the state sections, range-checked before any byte
 * reaches the model (CRCs prove a file whole, not sane): the step counts
 * ("step", "optim.step": int64 in [0, 2^62], the optimizers' bias
 * corrections and the schedule add to them) and the loss scaler's state
 * ("amp.scaler": scale finite and > 0, its counts finite and >= 0).
 * KILN_EDATA naming the file and section. */
static kiln_status check_counters(const struct kiln_ckpt *ck, const char *name, const void *p,
				  size_t bytes)
{
	if ((!strcmp(name, "step") || !strcmp(name, "optim.step")) && bytes == 8) {
		int64_t v;
		memcpy(&v, p, 8);
		if (v < 0 || v > (int64_t)1 << 62)
			return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' = %lld is out of range [0, 2^62]",
					  ck->path, name, (long long)v);
	}
	if (!strcmp(name, "amp.scaler") && bytes == 4 * sizeof(float)) {
		float v[4];
		memcpy(v, p, sizeof v);
		for (int i = 0; i < 4; i++)
			/* (hysteresis left, value 2, went below 0 before session
			 * 29: a count below 0 acts as 0) */
			if (!isfinite(v[i]) || (v[i] < 0 && i != 2) || (i == 0 && !(v[0] > 0)))
				return kiln_error(KILN_EDATA, "checkpoint %s: section 'amp.scaler' value %d (%s) = %g is out of range (%s)",
						  ck->path, i, i ? "a count" : "the loss scale", v[i],
						  i ? "finite, >= 0" : "finite, > 0");
	}
	return KILN_OK;
}

/* The first line where a and b differ, into la/lb (for messages). */
static void first_diff(const char *a, const char *b, char *la, char *lb, size_t n)
{
	while (*a && *b) {
		size_t ka = strcspn(a, "\n"), kb = strcspn(b, "\n");
		if (ka != kb || memcmp(a, b, ka)) {
			snprintf(la, n, "%.*s", (int)ka, a);
			snprintf(lb, n, "%.*s", (int)kb, b);
			return;
		}
		a += ka + (a[ka] != 0);
		b += kb + (b[kb] != 0);
	}
	snprintf(la, n, "%.*s", (int)strcspn(a, "\n"), *a ? a : "(end)");
	snprintf(lb, n, "%.*s", (int)strcspn(b, "\n"), *b ? b : "(end)");
}

/* Compares the checkpoint's parameter table with this model's (names,
 * regions, offsets, sizes, dtypes, shapes): 0 with *differ = 0 when they
 * are equal, 0 with *differ = 1 and the first differing line of each into
 * theirs/mine (n bytes each) when not, else the error reading it. */
static kiln_status tensors_diff(struct kiln_ckpt *ck, const struct kiln_model *m,
				char *theirs_line, char *mine_line, size_t n, int *differ)
{
	char *mine = tensors_text(m), *theirs = NULL;
	kiln_status st;
	*differ = 0;
	if (!mine)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (!(st = kiln_ckpt_read_text(ck, "tensors", &theirs)) && strcmp(mine, theirs)) {
		first_diff(theirs, mine, theirs_line, mine_line, n);
		*differ = 1;
	}
	free(mine);
	free(theirs);
	return st;
}

/* The checkpoint's parameter table equals this model's; else an error
 * naming the first difference. */
static kiln_status same_model(struct kiln_ckpt *ck, const struct kiln_model *m)
{
	char a[256], b[256];
	int differ;
	kiln_status st = tensors_diff(ck, m, a, b, sizeof a, &differ);
	if (st || !differ)
		return st;
	return kiln_error(KILN_ECONFIG, "checkpoint %s holds another model: its parameter '%s', this model's '%s' (name region offset numel dtype shape)",
			  ck->path, a, b);
}

kiln_status kiln_ckpt_check_sample(struct kiln_ckpt *ck, const struct kiln_model *m)
{
	char a[256], b[256], sample[160];
	int differ;
	kiln_status st = tensors_diff(ck, m, a, b, sizeof a, &differ);
	if (st || !differ)
		return st;
	sample_text(&m->sample, sample, sizeof sample);
	sample[strcspn(sample, "\n")] = '\0';
	return kiln_error(KILN_EDATA, "checkpoint %s: its section 'sample' (input %s) does not give the model it holds (a corrupt 'sample' section, or other [layer] sections): its parameter '%s', this model's '%s' (name region offset numel dtype shape)",
			  ck->path, sample, a, b);
}

/* Section `tag`'s bytes [off, off + bytes) read into v: refused when it is
 * the parameters or the buffers and a tensor's values there are not
 * finite (kiln_model_finite_check). */
static kiln_status weights_finite(const struct kiln_ckpt *ck, const struct kiln_model *m,
				  const char *tag, size_t off, const void *v, size_t bytes)
{
	char what[4200];
	const int region = !strcmp(tag, "params") ? 0 : !strcmp(tag, "buffers") ? 1 : -1;
	if (region < 0)
		return KILN_OK;
	snprintf(what, sizeof what, "checkpoint %s", ck->path);
	return kiln_model_finite_check(m, what, region, off / sizeof(float), v,
				       bytes / sizeof(float));
}

/* After state buffer `name` was enqueued from host: when it is "step",
 * dropout's step from the same bytes (it has no section of its own): a
 * model stepped through kiln_model_step_advance, one micro-step a step,
 * draws on where it was; the trainer sets the optimizer step's after
 * loading (kiln_model_drop_set). */
static kiln_status step_to_drop(struct kiln_model *m, const char *name, const void *host,
				void *stream)
{
	if (strcmp(name, "step"))
		return KILN_OK;
	return kiln_device_copy_async(m->dev, m->drop_d, host, sizeof(int64_t), KILN_COPY_H2D,
				      stream);
}

kiln_status kiln_ckpt_load_model(struct kiln_ckpt *ck, struct kiln_model *m, void *stream, int what)
{
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	kiln_status st;
	size_t total = 0, off = 0;
	void *host = NULL;
	if ((st = same_model(ck, m)))
		return st;
	int64_t tracked = m->tracked_base;
	if ((st = tracked_count(ck, what, &tracked)))
		goto out;
	/* every wanted section present with exactly the buffer's length */
	for (int i = 0; i < nb; i++) {
		uint64_t bytes;
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if ((st = kiln_ckpt_find(ck, sb[i].name, &bytes))) {
			st = KILN_EDATA;
			goto out;
		}
		if (bytes != sb[i].bytes) {
			st = kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes but this model's %s has %zu",
					ck->path, sb[i].name, (unsigned long long)bytes, sb[i].name,
					sb[i].bytes);
			goto out;
		}
		total += sb[i].bytes;
	}
	/* read and check everything before the first byte reaches the model */
	if (total && (st = kiln_device_host_alloc(m->dev, total, &host)))
		goto out;
	for (int i = 0; i < nb; i++) {
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if ((st = kiln_ckpt_read(ck, sb[i].name, (char *)host + off, sb[i].bytes)) ||
		    (st = check_counters(ck, sb[i].name, (char *)host + off, sb[i].bytes)) ||
		    (st = weights_finite(ck, m, sb[i].name, 0, (char *)host + off, sb[i].bytes)))
			goto out;
		off += sb[i].bytes;
	}
	off = 0;
	for (int i = 0; i < nb; i++) {
		if (what == KILN_CKPT_LOAD_WEIGHTS && strcmp(sb[i].name, "params") &&
		    strcmp(sb[i].name, "buffers"))
			continue;
		if (sb[i].bytes && ((st = kiln_device_copy_async(m->dev, sb[i].ptr, (char *)host + off,
								  sb[i].bytes, KILN_COPY_H2D, stream)) ||
				    (st = step_to_drop(m, sb[i].name, (char *)host + off, stream))))
			break;
		off += sb[i].bytes;
	}
	{
		/* the host buffer must outlive the copies, even after a failure */
		kiln_status st2 = kiln_device_stream_sync(m->dev, stream);
		if (!st)
			st = st2;
	}
	if (!st)
		m->tracked_base = tracked;
out:
	kiln_device_host_free(m->dev, host);
	return st;
}

/* ---- a stage's slice (core/dist_pipe_ckpt.c) ------------------------------- */

/* Bytes [off, off + n) of section r, piece by piece through host, to the
 * device at dst (the file's checksums were verified when it was opened;
 * the parameters' and buffers' values are checked finite). */
static kiln_status range_to_device(struct kiln_ckpt *ck, const struct rsec *r, uint64_t off,
				   size_t n, void *dst, void *host, struct kiln_model *m,
				   void *stream)
{
	kiln_status st = KILN_OK;
	for (size_t at = 0; at < n && !st; at += PIECE) {
		const size_t k = n - at < PIECE ? n - at : PIECE;
		if (kiln_pread_all(ck->fd, host, k, r->off + off + at))
			return read_error(ck->path, r->tag);
		if ((st = weights_finite(ck, m, r->tag, off + at, host, k)))
			return st;
		if (!(st = kiln_device_copy_async(m->dev, (char *)dst + at, host, k, KILN_COPY_H2D,
						  stream)))
			st = kiln_device_stream_sync(m->dev, stream);
	}
	return st;
}

/* Section `tag` present with exactly `bytes`. */
static kiln_status section_of(struct kiln_ckpt *ck, const char *tag, size_t bytes,
			      const struct rsec **out)
{
	const struct rsec *r = find(ck, tag);
	if (!r)
		return kiln_error(KILN_EDATA, "checkpoint %s: no section '%s'", ck->path, tag);
	if (r->bytes != bytes)
		return kiln_error(KILN_EDATA, "checkpoint %s: section '%s' has %llu bytes but this model's %s has %zu",
				  ck->path, tag, (unsigned long long)r->bytes, tag, bytes);
	*out = r;
	return KILN_OK;
}

/* The counters ("step", "optim.step", "amp.scaler": small, every rank's
 * alike) whole, range-checked before they reach the device. */
static kiln_status load_counters(struct kiln_ckpt *ck, struct kiln_model *m, void *stream)
{
	struct kiln_state_buf sb[KILN_MAX_STATE_BUFS];
	const int nb = kiln_model_state_buffers(m, sb, KILN_MAX_STATE_BUFS);
	uint8_t b[64];
	kiln_status st = KILN_OK;
	for (int i = 0; i < nb && !st; i++) {
		const struct rsec *r;
		if (strcmp(sb[i].name, "step") && strcmp(sb[i].name, "optim.step") &&
		    strcmp(sb[i].name, "amp.scaler"))
			continue;
		if (sb[i].bytes > sizeof b)
			return kiln_error(KILN_EINTERNAL, "state buffer '%s' of %zu bytes", sb[i].name,
					  sb[i].bytes);
		if ((st = section_of(ck, sb[i].name, sb[i].bytes, &r)) ||
		    (st = kiln_ckpt_read(ck, sb[i].name, b, sb[i].bytes)) ||
		    (st = check_counters(ck, sb[i].name, b, sb[i].bytes)) ||
		    (st = kiln_device_copy_async(m->dev, sb[i].ptr, b, sb[i].bytes, KILN_COPY_H2D,
						 stream)))
			break;
		if ((st = step_to_drop(m, sb[i].name, b, stream)))
			break;
		st = kiln_device_stream_sync(m->dev, stream);
	}
	return st;
}

kiln_status kiln_ckpt_load_slot(struct kiln_ckpt *ck, struct kiln_model *m, int k, size_t lo,
				size_t hi, float *dst, void *stream)
{
	const size_t bytes = m->n_trainable * sizeof(float);
	const struct rsec *r;
	void *host = NULL;
	kiln_status st = section_of(ck, m->optim_info.slot_names[k], bytes, &r);
	if (!st && hi > lo && !(st = kiln_device_host_alloc(m->dev, PIECE, &host)))
		st = range_to_device(ck, r, lo * sizeof(float), (hi - lo) * sizeof(float), dst, host,
				     m, stream);
	kiln_device_host_free(m->dev, host);
	return st;
}

kiln_status kiln_ckpt_load_stage(struct kiln_ckpt *ck, struct kiln_model *m, void *stream,
				 size_t lo, size_t hi, float *state, int what)
{
	const size_t n = hi > lo ? hi - lo : 0;
	const struct rsec *r;
	void *host = NULL;
	kiln_status st;
	if ((st = same_model(ck, m)))
		return st;
	int64_t tracked = m->tracked_base;
	if ((st = tracked_count(ck, what, &tracked)) ||
	    (st = kiln_device_host_alloc(m->dev, PIECE, &host)))
		goto out;
	/* the stage's parameters, the buffers (whole on every rank), the
	 * stage's slice of each optimizer slot, then the counters */
	if ((st = section_of(ck, "params", m->n_elems * sizeof(float), &r)) ||
	    (st = range_to_device(ck, r, lo * sizeof(float), n * sizeof(float), m->params_d + lo,
				  host, m, stream)))
		goto out;
	if (m->n_buf_elems &&
	    ((st = section_of(ck, "buffers", m->n_buf_elems * sizeof(float), &r)) ||
	     (st = range_to_device(ck, r, 0, m->n_buf_elems * sizeof(float), m->buffers_d, host, m,
				   stream))))
		goto out;
	for (int k = 0; what == KILN_CKPT_LOAD_ALL && state && k < m->state_slots; k++)
		if ((st = section_of(ck, m->optim_info.slot_names[k], m->n_trainable * sizeof(float),
				     &r)) ||
		    (st = range_to_device(ck, r, lo * sizeof(float), n * sizeof(float),
					  state + (size_t)k * n, host, m, stream)))
			goto out;
	if (what == KILN_CKPT_LOAD_ALL && (st = load_counters(ck, m, stream)))
		goto out;
	m->tracked_base = tracked;
	kiln_model_weights_written(m);
out:
	kiln_device_host_free(m->dev, host);
	return st;
}
