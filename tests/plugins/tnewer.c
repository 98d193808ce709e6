/* tests/plugins/tnewer.c - kiln-tnewer.so: a source built for the next ABI
 * minor of this major, whose info() fills the struct kiln_source_info of
 * that minor: this one's and a member after it, as a source of 2.21 sets
 * classes_from.  A core of an older minor allocated only its own struct,
 * so the registry must refuse the file (both ABI numbers in the message)
 * before info() can write past it. */
#include "test_plugin.h"

#include <string.h> /* memset */

/* kiln_source_info as the next minor would have it: grown at the end */
struct tnewer_info {
	struct kiln_source_info now;
	const char *later;
};

static kiln_status tnewer_info(void *ctx, struct kiln_source_info *info)
{
	struct tnewer_info *all = (struct tnewer_info *)info;
	(void)ctx;
	memset(all, 0, sizeof *all); /* past a core's own struct */
	all->now.len = 1;
	all->later = "written past an older core's struct";
	return KILN_OK;
}

static const struct kiln_source_ops tnewer_source_ops = {
	.version = KILN_SOURCE_OPS_VERSION,
	.info = tnewer_info,
};

TEST_PLUGIN(tnewer_source, KILN_ABI_MAJOR, KILN_ABI_MINOR + 1, KILN_PLUGIN_SOURCE, "tnewer",
	    "test plugin of the next ABI minor",
	    &tnewer_source_ops, NULL, NULL);

static const struct kiln_plugin *const tnewer_plugins[] = { &tnewer_source, NULL };

TEST_PLUGIN_INIT(tnewer_plugins)
