/* tests/plugins/tbadabi.c - kiln-tbadabi.so: a plugin built for the next ABI
 * major, which the registry must refuse printing both ABI numbers. */
#include "test_plugin.h"

static const struct kiln_source_ops tbadabi_source_ops = {
	.version = KILN_SOURCE_OPS_VERSION,
};

TEST_PLUGIN(tbadabi_source, KILN_ABI_MAJOR + 1, 0, KILN_PLUGIN_SOURCE, "tbadabi",
	    "test plugin of a future ABI",
	    &tbadabi_source_ops, NULL, NULL);

static const struct kiln_plugin *const tbadabi_plugins[] = { &tbadabi_source, NULL };

TEST_PLUGIN_INIT(tbadabi_plugins)
