/* tests/oot/oot.c - an out-of-tree plugin, built by tests/oot.sh against the
 * *installed* headers only (pkg-config --cflags kiln), as a third party
 * would: one file, -fvisibility=hidden, one exported kiln_plugin_init.
 *
 * source "ootsrc": OOT_LEN samples of f32[4]; sample i holds
 * (i + j/4) * scale for j = 0..3, label i32[] = i % 3.  Key: scale.
 */
#include <kiln/plugin.h>

#include <stdlib.h>
#include <string.h>

#define OOT_LEN 10

static const struct kiln_key oot_keys[] = {
	{ "scale", KILN_KEY_FLOAT, "1", 0, 1000, NULL, "Multiplies every value." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

struct oot_ctx {
	const struct kiln_host *host;
	double scale;
};

static kiln_status oot_source_open(const struct kiln_host *host, const struct kiln_config *cfg,
				   const char *section, const char *split, void **ctx)
{
	struct oot_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "ootsrc: out of memory");
	c->host = host;
	c->scale = 1.0;
	kiln_status st = host->config_get_float(cfg, section, "scale", &c->scale);
	if (st && st != KILN_ENOTFOUND) {
		free(c);
		return st;
	}
	*ctx = c;
	return KILN_OK;
}

static void oot_source_close(void *ctx) { free(ctx); }

static kiln_status oot_source_info(void *ctx, struct kiln_source_info *info)
{
	memset(info, 0, sizeof *info);
	info->len = OOT_LEN;
	info->sample.dtype = KILN_F32;
	info->sample.ndim = 1;
	info->sample.dims[0] = 4;
	info->label.dtype = KILN_I32;
	info->classes = 3;
	return KILN_OK;
}

static kiln_status oot_source_read(void *ctx, int64_t index, void *sample, void *label)
{
	const struct oot_ctx *c = ctx;
	if (index < 0 || index >= OOT_LEN)
		return c->host->error(KILN_EINVAL, "ootsrc: sample %lld out of range",
				      (long long)index);
	float *x = sample; /* (4) */
	for (int j = 0; j < 4; j++)
		x[j] = (float)(((double)index + j / 4.0) * c->scale);
	*(int32_t *)label = (int32_t)(index % 3);
	return KILN_OK;
}

static const struct kiln_source_ops oot_source_ops = {
	.version = KILN_SOURCE_OPS_VERSION,
	.open = oot_source_open,
	.close = oot_source_close,
	.info = oot_source_info,
	.read = oot_source_read,
};

static const struct kiln_plugin oot_source = {
	.abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR,
	.kind = KILN_PLUGIN_SOURCE,
	.name = "ootsrc",
	.summary = "out-of-tree test source",
	.ops = &oot_source_ops,
	.keys = oot_keys,
	.probe = NULL,
};

static const struct kiln_plugin *const oot_plugins[] = { &oot_source, NULL };

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	return oot_plugins;
}
