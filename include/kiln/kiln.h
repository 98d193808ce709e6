/* kiln/kiln.h - the public API of libkiln.
 *
 * Include this from programs that drive kiln (the `kiln` command, tests,
 * embedding applications).  Plugin authors include <kiln/plugin.h>.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stdint.h>
#include <stdio.h>
#include "status.h"
#include "tensor.h"
#include "config.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "0.1.0" */
const char *kiln_version(void);

/* ---- plugin registry --------------------------------------------------
 *
 * A registry finds plugin files named kiln-*.so, in this order (the first
 * file of a given name wins): the directories of `plugin_path` (colon-
 * separated, normally [run] plugin_path), of $KILN_PLUGIN_PATH, the build
 * tree's plugin directory when libkiln itself runs from the build tree, and
 * the installed $(pkglibdir).  Each file is dlopen()ed (RTLD_NOW|RTLD_LOCAL)
 * and initialised; a file that fails is kept in the list with the reason.
 * Built-in layer types are registered as plugins of kind layer with file
 * "(built-in)".  Plugins are never unloaded before kiln_registry_close().
 * Threads: open/close from one thread; lookups are read-only afterwards.
 */
struct kiln_registry;

struct kiln_plugin_info {
	const char *file;    /* path of the .so, or "(built-in)" */
	int kind;            /* enum kiln_plugin_kind */
	const char *name;
	const char *summary;
	unsigned abi_major, abi_minor;
	int available;       /* 1 if usable here */
	const char *why;     /* reason when not available ("" otherwise) */
};

struct kiln_plugin_file {
	const char *path;
	const char *error;   /* NULL when the file loaded, else dlerror()/ABI text */
	int n_plugins;
};

/* `plugin_path` may be NULL.  On success *out is a new registry.  Failing
 * files are not an error of this call. */
kiln_status kiln_registry_open(const char *plugin_path, struct kiln_registry **out);
void kiln_registry_close(struct kiln_registry *reg);

/* The directories searched, in order (for messages and `kiln plugins`). */
int kiln_registry_dir_count(const struct kiln_registry *reg);
const char *kiln_registry_dir(const struct kiln_registry *reg, int i);

int kiln_registry_file_count(const struct kiln_registry *reg);
void kiln_registry_file_get(const struct kiln_registry *reg, int i,
			    struct kiln_plugin_file *out);
int kiln_registry_plugin_count(const struct kiln_registry *reg);
void kiln_registry_plugin_get(const struct kiln_registry *reg, int i,
			      struct kiln_plugin_info *out);

/* Find the available plugin of `kind` called `name`.  KILN_ENOTFOUND with a
 * message listing what exists (and why a same-named plugin is unavailable,
 * or which file failed to load) otherwise. */
kiln_status kiln_registry_find(const struct kiln_registry *reg, int kind, const char *name,
			       const struct kiln_plugin **out);

const char *kiln_plugin_kind_name(int kind);

/* The host table handed to plugins (static, never NULL). */
const struct kiln_host *kiln_host_table(void);

/* ---- devices ------------------------------------------------------------
 *
 * struct kiln_device wraps an opened device plugin: the wrappers below apply
 * the defaults of optional members and count host synchronisations and
 * device-to-host copies, so tests can assert that a training step has none.
 * Threads: as struct kiln_device_ops says; the counters are atomic.
 */
struct kiln_device;

struct kiln_device_counters {
	uint64_t host_syncs;  /* event_sync + stream_sync calls */
	uint64_t d2h_copies;  /* copy_async with KILN_COPY_D2H */
	uint64_t allocs;      /* alloc + host_alloc calls */
	uint64_t runs;        /* kernel launches */
};

/* Open the available device plugin `name` with [plugin.NAME] of cfg. */
kiln_status kiln_device_open(const struct kiln_registry *reg, const struct kiln_config *cfg,
			     const char *name, int ordinal, struct kiln_device **out);
void kiln_device_close(struct kiln_device *dev);
const char *kiln_device_name(const struct kiln_device *dev);
void kiln_device_counters_get(const struct kiln_device *dev, struct kiln_device_counters *c);

kiln_status kiln_device_alloc(struct kiln_device *dev, size_t bytes, void **ptr);
void kiln_device_free(struct kiln_device *dev, void *ptr);
kiln_status kiln_device_host_alloc(struct kiln_device *dev, size_t bytes, void **ptr);
void kiln_device_host_free(struct kiln_device *dev, void *ptr);
kiln_status kiln_device_stream_create(struct kiln_device *dev, void **stream);
void kiln_device_stream_destroy(struct kiln_device *dev, void *stream);
kiln_status kiln_device_event_create(struct kiln_device *dev, void **event);
void kiln_device_event_destroy(struct kiln_device *dev, void *event);
kiln_status kiln_device_copy_async(struct kiln_device *dev, void *dst, const void *src,
				   size_t bytes, int kind, void *stream);
kiln_status kiln_device_event_record(struct kiln_device *dev, void *event, void *stream);
kiln_status kiln_device_stream_wait(struct kiln_device *dev, void *stream, void *event);
kiln_status kiln_device_event_sync(struct kiln_device *dev, void *event);
kiln_status kiln_device_stream_sync(struct kiln_device *dev, void *stream);
kiln_status kiln_device_prepare(struct kiln_device *dev, const struct kiln_op *op, void **plan,
				size_t *workspace);
kiln_status kiln_device_run(struct kiln_device *dev, void *plan, const struct kiln_op_args *args,
			    void *stream);
void kiln_device_plan_free(struct kiln_device *dev, void *plan);
void *kiln_device_proc(struct kiln_device *dev, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
