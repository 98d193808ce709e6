/* tests/plugins/shadow.c - tests/plugins/shadow/kiln-tgood.so: a second file
 * named kiln-tgood.so, in another directory, whose optim "tgood" says it is
 * the shadow.  Searched first, it must hide tests/plugins/kiln-tgood.so. */
#include <kiln/plugin.h>

static const struct kiln_optim_ops shadow_optim_ops = {
	.version = KILN_OPTIM_OPS_VERSION,
};

static const struct kiln_plugin shadow_optim = {
	.abi_major = KILN_ABI_MAJOR,
	.abi_minor = KILN_ABI_MINOR,
	.kind = KILN_PLUGIN_OPTIM,
	.name = "tgood",
	.summary = "shadow of tgood (search order test)",
	.ops = &shadow_optim_ops,
	.keys = NULL,
	.probe = NULL,
};

static const struct kiln_plugin *const shadow_plugins[] = { &shadow_optim, NULL };

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	return shadow_plugins;
}
