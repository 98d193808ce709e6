/* tests/plugins/shadow.c - tests/plugins/shadow/kiln-tgood.so: a second file
 * named kiln-tgood.so, in another directory, whose optim "tgood" says it is
 * the shadow.  Searched first, it must hide tests/plugins/kiln-tgood.so. */
#include "test_plugin.h"

static const struct kiln_optim_ops shadow_optim_ops = {
	.version = KILN_OPTIM_OPS_VERSION,
};

TEST_PLUGIN(shadow_optim, KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_OPTIM, "tgood",
	    "shadow of tgood (search order test)",
	    &shadow_optim_ops, NULL, NULL);

static const struct kiln_plugin *const shadow_plugins[] = { &shadow_optim, NULL };

TEST_PLUGIN_INIT(shadow_plugins)
