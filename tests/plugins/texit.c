/* tests/plugins/texit.c - tests/plugins/exit/kiln-texit.so: its
 * kiln_plugin_init ends the process (_exit(3)), as a plugin or a library it
 * loads might.  The probe child that loads it must end, and the file be
 * blamed with what happened; it lives in a directory of its own so the
 * registry tests of tests/plugins/.libs never load it in-process. */
#include <kiln/plugin.h>
#include <unistd.h> /* _exit */

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host);
KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	(void)host;
	_exit(3);
}
