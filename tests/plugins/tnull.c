/* tests/plugins/tnull.c - kiln-tnull.so: kiln_plugin_init fails, setting its
 * reason through host->error as the ABI asks. */
#include <kiln/plugin.h>

#define TNULL_WHY "tnull: refusing to initialise (test)"

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	host->error(KILN_EPLUGIN, "%s", TNULL_WHY);
	return NULL;
}
