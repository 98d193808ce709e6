/* tests/plugins/tbadabi.c - kiln-tbadabi.so: a plugin built for the next ABI
 * major, which the registry must refuse printing both ABI numbers. */
#include <kiln/plugin.h>

static const struct kiln_source_ops tbadabi_source_ops = {
	.version = KILN_SOURCE_OPS_VERSION,
};

static const struct kiln_plugin tbadabi_source = {
	.abi_major = KILN_ABI_MAJOR + 1,
	.abi_minor = 0,
	.kind = KILN_PLUGIN_SOURCE,
	.name = "tbadabi",
	.summary = "test plugin of a future ABI",
	.ops = &tbadabi_source_ops,
	.keys = NULL,
	.probe = NULL,
};

static const struct kiln_plugin *const tbadabi_plugins[] = { &tbadabi_source, NULL };

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	return tbadabi_plugins;
}
