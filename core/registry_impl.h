/* core/registry_impl.h - the plugin registry's private state, shared by
 * core/registry.c (search path, loading, lookups) and core/registry_probe.c
 * (the child processes that tell which file provides what). */
#ifndef KILN_REGISTRY_IMPL_H
#define KILN_REGISTRY_IMPL_H

#include "internal.h"

#include <sys/types.h>

struct loaded_file {
	char *path;
	char *error;
	void *handle;
	int n_plugins;
	int tried;       /* load_file ran (or the probe refused it) */
	char *provides;  /* from the probe: "<kind>:<name>\n" per plugin; NULL: not probed */
	int probed_ok;   /* a probe child loaded and initialised it (worth keeping) */
	int oom;         /* its load failed for lack of memory (or its message did) */
};

struct reg_plugin {
	const struct kiln_plugin *p;
	int file;        /* index into files, -1 for built-ins */
	int available;
	char why[256];
};

struct kiln_registry {
	char **dirs;
	int n_dirs;
	struct loaded_file *files;
	int n_files, cap_files;
	struct reg_plugin *plugins;
	int n_plugins, cap_plugins;
	/* probe children that finished their list but were still exiting
	 * (unmapping what they loaded) when the parent went on: reaped at
	 * close */
	pid_t *exiting;
	int n_exiting;
};
/* A message allocated from a printf format (NULL when out of memory). */
char *reg_dupf(const char *fmt, ...) KILN_PRINTF(1, 2);

/* Fill files[].provides for every file not yet loaded or known: from the
 * probe cache, else by loading them in child processes (core/registry_probe.c).
 * A file whose loading ends its child gets its error set and is never
 * loaded in this process. */
void reg_probe_files(struct kiln_registry *reg);

#endif
