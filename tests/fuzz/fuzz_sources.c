/* tests/fuzz/fuzz_sources.c - the file readers of kiln-loaders.so
 * (plugins/loaders): the first input byte picks the reader and the file
 * the rest becomes, the source is opened through its ops as a run opens
 * it, and its first samples are read.
 *
 *   (byte 0 & 127) % 6   the rest is
 *   0            an IDX image file (labels: 2 valid ones)
 *   1            an IDX label file (images: 2 valid 2x2 ones)
 *   2            a gzipped IDX image file (labels: 2 valid ones)
 *   3            a records shard (records.c); with bit 128 of byte 0 set,
 *                its CRCs are recomputed first (docs/formats.md), so the
 *                search reaches what lies behind them
 *   4            a WebDataset .tar shard (tar.c)
 *   5            a token shard (tokens.c), context 4
 */
#include "fuzz.h"
#include "loaders.h"

#include <kiln/plugin.h>

/* Samples read at most, and the largest sample or label read. */
#define FUZZ_SAMPLES 16
#define FUZZ_MAX_BYTES (1u << 22)

static const uint8_t idx_labels[] = { 0, 0, 8, 1, 0, 0, 0, 2, 1, 0 };
static const uint8_t idx_images[] = { 0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2,
				      1, 2, 3, 4, 5, 6, 7, 8 };

/* The config of reader `kind` for the files written; NULL when it cannot
 * be made. */
static struct kiln_config *source_config(int kind, const char *path)
{
	static const char *const source[] = { "idx", "idx", "idx", "records", "tar", "tokens" };
	struct kiln_config *cfg = NULL;
	char o[1200];
	if (kiln_config_new(&cfg))
		return NULL;
	snprintf(o, sizeof o, "data.source=%s", source[kind]);
	kiln_config_override(cfg, o);
	if (kind <= 2) {
		snprintf(o, sizeof o, "data.path=%s", fuzz_dir);
		kiln_config_override(cfg, o);
		kiln_config_override(cfg, kind == 2 ? "data.images=images.gz" : "data.images=images");
		kiln_config_override(cfg, "data.labels=labels");
	} else {
		snprintf(o, sizeof o, "data.path=%s", kind == 4 ? fuzz_dir : path);
		kiln_config_override(cfg, o);
	}
	if (kind == 5)
		kiln_config_override(cfg, "data.context=4");
	return cfg;
}

/* Recompute the CRCs of the records shard f[0..n): header, set block,
 * index, and every record the index places inside the file. */
static void fix_record_crcs(uint8_t *f, size_t n)
{
	uint32_t (*crc)(uint32_t, const void *, size_t) = kiln_host_table()->crc32c;
	if (n < 64)
		return;
	fuzz_put32(f + 60, crc(0, f, 60));
	if (f[57] >= 1 && n >= 80) /* the set block of a minor-1 header */
		fuzz_put32(f + 76, crc(0, f + 64, 12));
	uint64_t count = fuzz_get_le(f + 16, 8), ioff = fuzz_get_le(f + 24, 8);
	if (ioff > n || count > (n - ioff) / 16 || n - ioff - 16 * count < 4)
		return;
	fuzz_put32(f + ioff + 16 * count, crc(0, f + ioff, 16 * count));
	for (uint64_t i = 0; i < count; i++) {
		const uint8_t *e = f + ioff + 16 * i;
		uint64_t off = fuzz_get_le(e, 8), len = fuzz_get_le(e + 8, 4);
		if (len < 24 || off > n || len > n - off)
			continue;
		fuzz_put32(f + off + 20, crc(crc(0, f + off, 20), f + off + 24, len - 24));
	}
}

/* Write the input (and the valid partner file of an IDX case): the path. */
static const char *write_input(int kind, const uint8_t *data, size_t size)
{
	static const char *const name[] = { "images", "labels", "images.gz", "shard.rec",
					    "shard.tar", "shard.bin" };
	if (kind == 0 || kind == 2)
		fuzz_file("labels", idx_labels, sizeof idx_labels);
	if (kind == 1)
		fuzz_file("images", idx_images, sizeof idx_images);
	return fuzz_file(name[kind], data, size);
}

static size_t desc_bytes(const struct kiln_tensor_desc *d)
{
	size_t n = kiln_dtype_size(d->dtype);
	for (int i = 0; i < d->ndim; i++) {
		if (d->dims[i] < 0 || (d->dims[i] && n > FUZZ_MAX_BYTES / (size_t)d->dims[i]))
			return FUZZ_MAX_BYTES + 1;
		n *= (size_t)d->dims[i];
	}
	return n;
}

/* Read the first samples of an open source. */
static void read_samples(const struct kiln_source_ops *ops, void *ctx)
{
	struct kiln_source_info info;
	memset(&info, 0, sizeof info);
	if (ops->info(ctx, &info))
		return;
	int64_t n = info.len < FUZZ_SAMPLES ? info.len : FUZZ_SAMPLES;
	if (ops->read_image) {
		struct kiln_image img = { 0 };
		int32_t label;
		for (int64_t i = 0; i < n; i++)
			fuzz_report("read_image", ops->read_image(ctx, i, &img, &label));
		free(img.data);
		return;
	}
	size_t sb = desc_bytes(&info.sample), lb = desc_bytes(&info.label);
	if (!ops->read || sb > FUZZ_MAX_BYTES || lb > FUZZ_MAX_BYTES)
		return;
	void *sample = malloc(sb ? sb : 1), *label = malloc(lb ? lb : 1);
	for (int64_t i = 0; sample && label && i < n; i++)
		fuzz_report("read", ops->read(ctx, i, sample, label));
	free(sample);
	free(label);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct kiln_plugin *const plugin[] = {
		&loaders_idx_plugin, &loaders_idx_plugin, &loaders_idx_plugin,
		&loaders_records_plugin, &loaders_tar_plugin, &loaders_tokens_plugin
	};
	if (!size)
		return 0;
	int kind = (data[0] & 127) % 6;
	uint8_t *file = malloc(size);
	if (!file)
		return 0;
	memcpy(file, data + 1, size - 1);
	if (kind == 3 && (data[0] & 128))
		fix_record_crcs(file, size - 1);
	const char *path = write_input(kind, file, size - 1);
	free(file);
	struct kiln_config *cfg = source_config(kind, path);
	const struct kiln_source_ops *ops = plugin[kind]->ops;
	void *ctx = NULL;
	if (cfg && !fuzz_report("open", ops->open(kiln_host_table(), cfg, "data", "train", &ctx))) {
		read_samples(ops, ctx);
		ops->close(ctx);
	}
	kiln_config_free(cfg);
	return 0;
}
