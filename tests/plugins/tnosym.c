/* tests/plugins/tnosym.c - kiln-tnosym.so: a shared object named like a
 * plugin that exports no kiln_plugin_init, only a misspelt kiln_plugin_inti. */
#include <kiln/plugin.h>

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_inti(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_inti(const struct kiln_host *host)
{
	return NULL;
}
