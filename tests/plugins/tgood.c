/* tests/plugins/tgood.c - kiln-tgood.so: a well-formed test plugin file
 * carrying three plugins, for tests/check_plugin.c and tests/cli.sh:
 *
 *   optim  "tgood"   keys slots (int 1..8, default 2), mode (fast|slow);
 *                    open() reports the configured state slots.
 *   source "tsrc"    keys count (int 1..1000, default 4); `count` samples of
 *                    f32[3], sample i = { i*10, i*10+1, i*10+2 } (+1000 for
 *                    split "test"), label i32[] = i % 2; bad_every K > 0
 *                    makes every sample i with i % K == K - 1 corrupt
 *                    (KILN_EDATA), for the on_error tests.
 *   source "tprobe"  probe fails with the reason TPROBE_WHY.
 *
 * With TGOOD_INIT_LOG set, each initialisation appends "init" to that file.
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include "test_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPROBE_WHY "no test accelerator on this machine (tprobe)"

/* ---- optim "tgood" ------------------------------------------------------ */

static const struct kiln_key tgood_keys[] = {
	{ "slots", KILN_KEY_INT, "2", 1, 8, NULL, "State slots per parameter." },
	{ "mode", KILN_KEY_ENUM, "fast", 0, 0, "fast|slow", "Update rule." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

struct tgood_ctx {
	int64_t slots;
};

static kiln_status tgood_optim_open(const struct kiln_host *host, const struct kiln_config *cfg,
				    struct kiln_optim_info *info, void **ctx)
{
	static const char *const names[8] = { "optim.t0", "optim.t1", "optim.t2", "optim.t3" };
	struct tgood_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "tgood: out of memory");
	c->slots = 2;
	kiln_status st = host->config_get_int(cfg, "plugin.tgood", "slots", &c->slots);
	if (st && st != KILN_ENOTFOUND) {
		free(c);
		return st;
	}
	info->state_slots = (int32_t)c->slots;
	for (int k = 0; k < KILN_OPTIM_MAX_SLOTS; k++)
		info->slot_names[k] = names[k];
	*ctx = c;
	return KILN_OK;
}

static void tgood_optim_close(void *ctx) { free(ctx); }

static kiln_status tgood_optim_plan(void *ctx, struct kiln_device *dev,
				    const struct kiln_optim_shape *s, void **plan, size_t *ws)
{
	*plan = NULL;
	*ws = 0;
	return KILN_OK;
}

static kiln_status tgood_optim_step(void *ctx, struct kiln_device *dev, void *plan,
				    const struct kiln_optim_args *a, void *stream)
{
	return KILN_OK;
}

static const struct kiln_optim_ops tgood_optim_ops = {
	.version = KILN_OPTIM_OPS_VERSION,
	.open = tgood_optim_open,
	.close = tgood_optim_close,
	.plan = tgood_optim_plan,
	.step = tgood_optim_step,
};

TEST_PLUGIN(tgood_optim, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_OPTIM, "tgood",
	    "test optimizer (tests/plugins/tgood.c)",
	    &tgood_optim_ops, tgood_keys, NULL);

/* ---- source "tsrc" ------------------------------------------------------ */

static const struct kiln_key tsrc_keys[] = {
	{ "count", KILN_KEY_INT, "4", 1, 1000, NULL, "Number of samples." },
	{ "bad_every", KILN_KEY_INT, "0", 0, 1000, NULL, "Every K-th sample is corrupt (0: none)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

struct tsrc_ctx {
	const struct kiln_host *host;
	int64_t count, bad_every;
	float base; /* 0 for "train", 1000 for "test" */
};

static kiln_status tsrc_source_open(const struct kiln_host *host, const struct kiln_config *cfg,
				    const char *section, const char *split, void **ctx)
{
	struct tsrc_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "tsrc: out of memory");
	c->host = host;
	c->count = 4;
	host->config_get_int(cfg, section, "bad_every", &c->bad_every);
	kiln_status st = host->config_get_int(cfg, section, "count", &c->count);
	if (st && st != KILN_ENOTFOUND) {
		free(c);
		return st;
	}
	c->base = strcmp(split, "test") ? 0.0f : 1000.0f;
	host->log(KILN_LOG_DEBUG, "tsrc", "opened [%s] split %s: %lld samples", section, split,
		  (long long)c->count);
	*ctx = c;
	return KILN_OK;
}

static void tsrc_source_close(void *ctx) { free(ctx); }

static kiln_status tsrc_source_info(void *ctx, struct kiln_source_info *info)
{
	const struct tsrc_ctx *c = ctx;
	memset(info, 0, sizeof *info);
	info->len = c->count;
	info->sample.dtype = KILN_F32;
	info->sample.ndim = 1;
	info->sample.dims[0] = 3;
	info->label.dtype = KILN_I32;
	info->label.ndim = 0;
	info->classes = 2;
	return KILN_OK;
}

static kiln_status tsrc_source_read(void *ctx, int64_t index, void *sample, void *label)
{
	const struct tsrc_ctx *c = ctx;
	if (index < 0 || index >= c->count)
		return c->host->error(KILN_EINVAL, "tsrc: sample %lld out of range [0, %lld)",
				      (long long)index, (long long)c->count);
	if (c->bad_every > 0 && index % c->bad_every == c->bad_every - 1)
		return c->host->error(KILN_EDATA, "tsrc: sample %lld is corrupt (bad_every = %lld)",
				      (long long)index, (long long)c->bad_every);
	float *x = sample; /* (3) */
	for (int j = 0; j < 3; j++)
		x[j] = c->base + (float)(index * 10 + j);
	*(int32_t *)label = (int32_t)(index % 2);
	return KILN_OK;
}

static const struct kiln_source_ops tsrc_source_ops = {
	.version = KILN_SOURCE_OPS_VERSION,
	.open = tsrc_source_open,
	.close = tsrc_source_close,
	.info = tsrc_source_info,
	.read = tsrc_source_read,
};

TEST_PLUGIN(tsrc_source, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_SOURCE, "tsrc",
	    "test source of counted samples",
	    &tsrc_source_ops, tsrc_keys, NULL);

/* ---- source "tprobe": never available ---------------------------------- */

static int tprobe_probe(const struct kiln_host *host, char *why, size_t n)
{
	snprintf(why, n, "%s", TPROBE_WHY);
	return 1;
}

TEST_PLUGIN(tprobe_source, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_SOURCE, "tprobe",
	    "test source whose probe fails",
	    &tsrc_source_ops, NULL, tprobe_probe);

static const struct kiln_plugin *const tgood_plugins[] = {
	&tgood_optim, &tsrc_source, &tprobe_source, NULL
};

/* Each initialisation appends a line to $TGOOD_INIT_LOG when it is set,
 * so tests/cli.sh can count the loads (the probe child's among them). */
static const struct kiln_plugin *const *tgood_init(const struct kiln_host *host)
{
	const char *log = getenv("TGOOD_INIT_LOG");
	FILE *f = log && *log ? fopen(log, "a") : NULL;
	if (f) {
		fputs("init\n", f);
		fclose(f);
	}
	return host->version >= 1 ? tgood_plugins : NULL;
}

TEST_PLUGIN_INIT(tgood_init(host))
