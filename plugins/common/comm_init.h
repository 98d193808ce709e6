/* plugins/common/comm_init.h: the communicators' descriptor and
 * kiln_plugin_init, kept once.
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

/* plugins/common/watchdog.c: the deadlines' clock, the core's run clock
 * where the host table has one (version 7) */
#ifdef __cplusplus
extern "C"
#endif
void watchdog_use_host(const struct kiln_host *host);

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
	if (*keep != host) /* a second load: the same table, not rewritten */
		*keep = host;
	watchdog_use_host(host);
	return list;
}

#ifdef __cplusplus
#define COMM_PLUGIN_LINKAGE extern "C"
#else
#define COMM_PLUGIN_LINKAGE
#endif

/* A communicator's descriptor <var>_plugin (ops_var: its struct
 * kiln_comm_ops; keys_var and probe_fn may be NULL), the list of it and
 * the exported kiln_plugin_init, which keeps the host table in the
 * plugin's static H.  Positional, in struct kiln_plugin's order, so that
 * C++ takes it too.  Use once, at file scope. */
#define COMM_PLUGIN(var, nm, sum, ops_var, keys_var, probe_fn)                              \
	static const struct kiln_plugin var##_plugin = {                                     \
		KILN_ABI_MAJOR, KILN_ABI_MINOR, KILN_PLUGIN_COMM, nm, sum, &ops_var, keys_var, \
		probe_fn,                                                                    \
	};                                                                                   \
	static const struct kiln_plugin *const var##_plugins[] = { &var##_plugin, NULL };   \
	COMM_PLUGIN_LINKAGE KILN_PLUGIN_EXPORT const struct kiln_plugin *const *              \
	kiln_plugin_init(const struct kiln_host *host)                                       \
	{                                                                                    \
		return comm_plugin_init(host, &H, var##_plugins);                            \
	}

#endif
