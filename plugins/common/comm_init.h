/* plugins/common/comm_init.h: the communicators' kiln_plugin_init, kept once.
 *
 * kiln-mpi, kiln-nccl and kiln-gloo each export one plugin and call host
 * entries that came with host table version 4 (kiln ABI 1.3: fatal,
 * alloc_shared's contract); an older core gets KILN_EABI and both numbers.
 * C and C++ (kiln-gloo).
 */
#ifndef KILN_PLUGINS_COMMON_COMM_INIT_H
#define KILN_PLUGINS_COMMON_COMM_INIT_H

#include <stddef.h>

#include <kiln/plugin.h>

/* Checks host's version; on success stores host in *keep (the plugin's
 * borrowed pointer, valid until unload) and returns list (NULL-terminated,
 * static), else reports and returns NULL. */
static inline const struct kiln_plugin *const *
comm_plugin_init(const struct kiln_host *host, const struct kiln_host **keep,
		 const struct kiln_plugin *const *list)
{
	if (host->version < 4) {
		host->error(KILN_EABI,
			    "%s: needs host table version 4 (kiln ABI 1.3), the core offers %u",
			    list[0]->name, host->version);
		return NULL;
	}
	*keep = host;
	return list;
}

#endif
