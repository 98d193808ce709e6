/* tests/plugins/kiln-tlayer.so: a layer plugin "tlayer" whose keys are of
 * every type the comparison by meaning reads (scale float, taps int, on
 * bool, window an integer list), for tests/check_ckpt.c
 * test_config_check_plugin_layer: a checkpoint's config compared with the
 * run's by the plugin's own key table.  No model is built with it: its
 * ops refuse to run.
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include "test_plugin.h"

static const struct kiln_key tlayer_keys[] = {
	{ "scale", KILN_KEY_FLOAT, "1", 0, 100, NULL, "A factor." },
	{ "taps", KILN_KEY_INT, "2", 1, 64, NULL, "A count." },
	{ "on", KILN_KEY_BOOL, "1", 0, 0, NULL, "A switch." },
	{ "window", KILN_KEY_INTS, "3", 1, 99, NULL, "Integers, read as the plugin likes." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status tlayer_infer(const struct kiln_host *host, struct kiln_layer *l)
{
	(void)l;
	return host->error(KILN_EINVAL, "tlayer: a test layer for config checks only");
}

static kiln_status tlayer_plan(const struct kiln_host *host, struct kiln_layer *l,
			       struct kiln_device *dev, size_t *workspace)
{
	(void)l, (void)dev, (void)workspace;
	return host->error(KILN_EINVAL, "tlayer: a test layer for config checks only");
}

static kiln_status tlayer_forward(const struct kiln_host *host, struct kiln_layer *l,
				  const struct kiln_layer_run *r)
{
	(void)l, (void)r;
	return host->error(KILN_EINVAL, "tlayer: a test layer for config checks only");
}

static const struct kiln_layer_ops tlayer_ops = {
	.version = KILN_LAYER_OPS_VERSION,
	.min_inputs = 1,
	.max_inputs = 1,
	.configure = NULL,
	.infer = tlayer_infer,
	.plan = tlayer_plan,
	.forward = tlayer_forward,
	.backward = NULL,
	.destroy = NULL,
};

TEST_PLUGIN(tlayer, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_LAYER, "tlayer",
	    "test layer with typed keys (tests/plugins/tlayer.c)", &tlayer_ops, tlayer_keys, NULL);

static const struct kiln_plugin *const tlayer_plugins[] = { &tlayer, NULL };

TEST_PLUGIN_INIT(tlayer_plugins)
