/* core/checkpoint_write.c - writing a checkpoint file (checkpoint.h;
 * the layout in checkpoint_impl.h and docs/checkpoints.md): the text
 * sections (config, versions, tensors, sample) and the sections' bytes,
 * from the host, the device or a source, each under its CRC32C, to a
 * temporary file renamed into place.
 */
#include "checkpoint_impl.h"
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

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
char *ckpt_tensors_text(const struct kiln_model *m)
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
void kiln_ckpt_sample_text(const struct kiln_tensor_desc *d, char *out, size_t len)
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
	memcpy(h, ckpt_magic, 8);
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

/* The "interval" section's payload (malloc'd, *n its length; NULL when
 * out of memory). */
static uint8_t *interval_bytes(const struct kiln_ckpt_interval *iv, size_t *n)
{
	*n = KILN_CKPT_INTERVAL_BYTES + KILN_CKPT_INTERVAL_RANK_BYTES * (size_t)iv->ranks;
	uint8_t *b = calloc(1, *n);
	if (!b)
		return NULL;
	const int64_t head[5] = { iv->closed, iv->start, iv->samples, iv->rows, iv->skipped };
	for (int i = 0; i < 5; i++)
		put_u64(b + 8 * i, (uint64_t)head[i]);
	memcpy(b + 40, &iv->loss, 8);
	memcpy(b + 48, &iv->correct, 8);
	put_u64(b + 56, (uint64_t)iv->epoch_samples);
	put_u64(b + 64, (uint64_t)iv->pipeline);
	put_u64(b + 72, (uint64_t)iv->ranks);
	for (int64_t r = 0; r < iv->ranks; r++) {
		uint8_t *p = b + KILN_CKPT_INTERVAL_BYTES + KILN_CKPT_INTERVAL_RANK_BYTES * r;
		memcpy(p, iv->rank[r].sums, 12); /* then 4 zero bytes */
		memcpy(p + 16, iv->rank[r].carry, 16);
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
	struct wsec s[16 + 2 * KILN_MAX_STATE_BUFS];
	uint8_t tr[KILN_CKPT_TRAINER_BYTES], tracked[8], ep[KILN_CKPT_EPOCH_BYTES],
		sp[KILN_CKPT_STOPPER_BYTES], owed[8], done[KILN_CKPT_EVALUATED_BYTES], cc[16],
		ds[8], pl[KILN_CKPT_PLATEAU_BYTES];
	char final[4200], tmp[4210], sample[160];
	kiln_status st;
	int n = 0;
	const char *config = meta->config ? meta->config : "";
	const char *versions = meta->versions ? meta->versions : "";
	char *tensors = ckpt_tensors_text(m), *wkeys = kiln_ckpt_weights_keys(config);
	uint8_t *best = meta->best ? best_bytes(meta->best, meta->n_best) : NULL;
	size_t iv_n = 0;
	uint8_t *iv = meta->interval ? interval_bytes(meta->interval, &iv_n) : NULL;
	if (!tensors || !wkeys || (meta->best && !best) || (meta->interval && !iv)) {
		free(tensors);
		free(wkeys);
		free(best);
		free(iv);
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
	kiln_ckpt_sample_text(&m->sample, sample, sizeof sample);
	host_section(&s[n++], "sample", sample, strlen(sample));
	if (meta->epoch) {
		memcpy(ep, &meta->epoch->loss, 8);
		memcpy(ep + 8, &meta->epoch->correct, 8);
		put_u64(ep + 16, (uint64_t)meta->epoch->samples);
		host_section(&s[n++], "epoch", ep, sizeof ep);
	}
	if (iv)
		host_section(&s[n++], "interval", iv, iv_n);
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
	if (meta->plateau) {
		memcpy(pl, &meta->plateau->lr, 8);
		memcpy(pl + 8, &meta->plateau->best, 8);
		put_u64(pl + 16, (uint64_t)meta->plateau->bad);
		put_u64(pl + 24, (uint64_t)meta->plateau->cooldown);
		put_u64(pl + 32, (uint64_t)meta->plateau->evals);
		host_section(&s[n++], "plateau", pl, sizeof pl);
	}
	n = state_sections(m, src, s, n);
	snprintf(final, sizeof final, "%s/ckpt-%lld.kiln", dir, (long long)t->step);
	snprintf(tmp, sizeof tmp, "%s.tmp", final);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		free(tensors);
		free(wkeys);
		free(best);
		free(iv);
		return kiln_error(KILN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
	}
	st = write_file(tmp, fd, s, n, t->step, src, m->dev, stream);
	free(tensors);
	free(wkeys);
	free(best);
	free(iv);
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
