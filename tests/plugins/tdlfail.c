/* tests/plugins/tdlfail.c - kiln-tdlfail.so: references a function that no
 * library defines, so dlopen(RTLD_NOW) fails with "undefined symbol". */
#include <kiln/plugin.h>

extern const struct kiln_plugin *const *kiln_test_symbol_nobody_defines(void);

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	return kiln_test_symbol_nobody_defines();
}
