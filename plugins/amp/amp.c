/* plugins/amp/amp.c - the mixed-precision plugin (kiln-amp.so): one
 * precision plugin, "amp", whose policy is [run] precision (the core
 * passes it to open()) and whose loss-scaling parameters are the keys of
 * [plugin.amp].
 *
 *   policy       compute  gradients  loss scale
 *   fp32         f32      f32        none
 *   bf16         bf16     bf16       none (bf16 has f32's exponent range)
 *   fp16         f16      f16        dynamic: init_scale, x growth_factor after
 *                                    growth_interval finite steps, x backoff_factor
 *                                    (and the step skipped) on overflow, never
 *                                    below min_scale, after `hysteresis` overflows
 *   fp16_static  f16      f16        loss_scale, constant; overflowing steps skipped
 *
 * The plugin only decides; the core's trainer turns the decision into device
 * ops (KILN_OP_UNSCALE, KILN_OP_SCALER_UPDATE, the loss op's scale input),
 * so the scale lives in device memory and no step waits for the host.
 * Nothing here touches a device.
 */
#include <kiln/plugin.h>   /* the ABI: descriptors, precision ops, host table */
#include <stdlib.h>        /* calloc, free */
#include <string.h>        /* strcmp */

static const struct kiln_host *amp_host;

enum amp_policy { AMP_FP32, AMP_BF16, AMP_FP16, AMP_FP16_STATIC };

static const struct {
	const char *name;
	int dtype;
	const char *what;
} amp_policies[] = {
	[AMP_FP32] = { "fp32", KILN_F32, "f32 compute, no loss scaling" },
	[AMP_BF16] = { "bf16", KILN_BF16, "bf16 compute, f32 master weights, no loss scaling" },
	[AMP_FP16] = { "fp16", KILN_F16,
		       "f16 compute, f32 master weights, dynamic loss scaling" },
	[AMP_FP16_STATIC] = { "fp16_static", KILN_F16,
			      "f16 compute, f32 master weights, static loss scaling" },
};

struct amp_ctx {
	int policy;
	struct kiln_scaler_config sc;
};

#define AMP_SECTION "plugin.amp"

/* A float key of [plugin.amp] (the schema already checked type and range;
 * an absent key keeps *v). */
static kiln_status amp_float(const struct kiln_config *cfg, const char *key, double *v)
{
	kiln_status st = amp_host->config_get_float(cfg, AMP_SECTION, key, v);
	return st == KILN_ENOTFOUND ? KILN_OK : st;
}

static kiln_status amp_int(const struct kiln_config *cfg, const char *key, int64_t *v)
{
	kiln_status st = amp_host->config_get_int(cfg, AMP_SECTION, key, v);
	return st == KILN_ENOTFOUND ? KILN_OK : st;
}

static kiln_status amp_open(const struct kiln_host *host, const struct kiln_config *cfg,
			    const char *name, void **ctx)
{
	struct amp_ctx *c;
	kiln_status st;
	int policy = -1;
	if (!name)
		name = "fp32";
	for (int i = 0; i < (int)(sizeof amp_policies / sizeof *amp_policies); i++)
		if (!strcmp(name, amp_policies[i].name))
			policy = i;
	if (policy < 0)
		return host->error(KILN_ECONFIG, "%s: [run] precision = %s: one of fp32, bf16, fp16, fp16_static",
				   host->config_where(cfg, "run", "precision"), name);
	if (!(c = calloc(1, sizeof *c)))
		return host->error(KILN_ENOMEM, "amp: out of memory");
	c->policy = policy;
	c->sc.init_scale = 65536;
	c->sc.growth_factor = 2;
	c->sc.backoff_factor = 0.5;
	c->sc.growth_interval = 2000;
	c->sc.min_scale = 0;
	c->sc.hysteresis = 1;
	c->sc.max_scale = 0;
	if ((st = amp_float(cfg, "init_scale", &c->sc.init_scale)) ||
	    (st = amp_float(cfg, "growth_factor", &c->sc.growth_factor)) ||
	    (st = amp_float(cfg, "backoff_factor", &c->sc.backoff_factor)) ||
	    (st = amp_int(cfg, "growth_interval", &c->sc.growth_interval)) ||
	    (st = amp_float(cfg, "min_scale", &c->sc.min_scale)) ||
	    (st = amp_int(cfg, "hysteresis", &c->sc.hysteresis)))
		goto fail;
	if (c->sc.min_scale > c->sc.init_scale) {
		st = host->error(KILN_ECONFIG, "%s: [plugin.amp] min_scale = %g is above init_scale = %g",
				 host->config_where(cfg, AMP_SECTION, "min_scale"), c->sc.min_scale,
				 c->sc.init_scale);
		goto fail;
	}
	if (policy == AMP_FP16_STATIC) {
		const char *ls = host->config_get(cfg, AMP_SECTION, "loss_scale");
		if (!ls) {
			st = host->error(KILN_ECONFIG, "%s: [run] precision = fp16_static needs [plugin.amp] loss_scale = S (the constant loss scale; fp16 scales dynamically)",
					 host->config_where(cfg, "run", "precision"));
			goto fail;
		}
		if ((st = amp_float(cfg, "loss_scale", &c->sc.init_scale)))
			goto fail;
	}
	c->sc.enabled = policy == AMP_FP16 || policy == AMP_FP16_STATIC;
	c->sc.dynamic = policy == AMP_FP16;
	if (!c->sc.enabled)
		c->sc.init_scale = 1;
	*ctx = c;
	return KILN_OK;
fail:
	free(c);
	return st;
}

static void amp_close(void *ctx) { free(ctx); }

static int amp_compute_dtype(void *ctx)
{
	return amp_policies[((struct amp_ctx *)ctx)->policy].dtype;
}

/* Gradients of activations come in the compute dtype; parameter gradients
 * are accumulated into the f32 flat buffer either way. */

static kiln_status amp_scaling(void *ctx, float *init, float *growth, float *backoff,
			       int *growth_interval)
{
	const struct amp_ctx *c = ctx;
	const int dyn = c->sc.dynamic;
	*init = (float)c->sc.init_scale;
	*growth = dyn ? (float)c->sc.growth_factor : 1.0f;
	*backoff = dyn ? (float)c->sc.backoff_factor : 1.0f;
	*growth_interval = (int)c->sc.growth_interval;
	return KILN_OK;
}

static kiln_status amp_scaler(void *ctx, struct kiln_scaler_config *out)
{
	*out = ((const struct amp_ctx *)ctx)->sc;
	return KILN_OK;
}

static const char *amp_describe(void *ctx)
{
	return amp_policies[((struct amp_ctx *)ctx)->policy].what;
}

static const struct kiln_precision_ops amp_ops = {
	.version = KILN_PRECISION_OPS_VERSION,
	.open = amp_open,
	.close = amp_close,
	.compute_dtype = amp_compute_dtype,
	.scaling = amp_scaling,
	.scaler = amp_scaler,
	.describe = amp_describe,
};

static const struct kiln_key amp_keys[] = {
	{ "init_scale", KILN_KEY_FLOAT, "65536", 1, 3.0e38, NULL,
	  "precision = fp16: the loss scale of the first step (GradScaler's init_scale)." },
	{ "growth_factor", KILN_KEY_FLOAT, "2", 1, 1e6, NULL,
	  "precision = fp16: the scale is multiplied by this after `growth_interval` consecutive steps with finite gradients." },
	{ "backoff_factor", KILN_KEY_FLOAT, "0.5", 1e-6, 1, NULL,
	  "precision = fp16: the scale is multiplied by this when a step's gradients overflow (that step is skipped)." },
	{ "growth_interval", KILN_KEY_INT, "2000", 1, 16777216, NULL,
	  "precision = fp16: consecutive finite steps before the scale grows; at most 2^24 = 16777216 (the scaler counts in f32, exact up to 2^24)." },
	{ "min_scale", KILN_KEY_FLOAT, "0", 0, 3.0e38, NULL,
	  "precision = fp16: the scale never backs off below this (0: no floor but the smallest normal float, 1.17549e-38; a scale of 0 would skip every later step). A log interval of skipped steps at the floor stops the run as diverged." },
	{ "hysteresis", KILN_KEY_INT, "1", 1, 1e6, NULL,
	  "precision = fp16: overflowing steps tolerated before the scale backs off (Megatron-LM's hysteresis; 1 = GradScaler: every overflow backs off). Every overflowing step is skipped either way; the count restarts when the scale grows." },
	{ "loss_scale", KILN_KEY_FLOAT, NULL, 1, 3.0e38, NULL,
	  "precision = fp16_static: the constant loss scale S (required there). Steps whose gradients overflow are still skipped and counted." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static const struct kiln_plugin amp_plugin = {
	.abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR,
	.kind = KILN_PLUGIN_PRECISION,
	.name = "amp",
	.summary = "mixed precision: [run] precision = fp32, bf16, fp16 (dynamic loss scaling) or fp16_static; f32 master weights, loss scale and overflow flag in device memory",
	.ops = &amp_ops,
	.keys = amp_keys,
	.probe = NULL,
};

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);

const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	static const struct kiln_plugin *const list[] = { &amp_plugin, NULL };
	amp_host = host;
	return list;
}
