/* core/probe_cache.h - the plugin probe's answers kept between runs
 * (core/probe_cache.c), keyed by each plugin file's path, size, mtime and
 * inode and by this kiln's ABI. */
#ifndef KILN_CORE_PROBE_CACHE_H
#define KILN_CORE_PROBE_CACHE_H

struct probe_cache;

/* Read the kept answers ($KILN_PROBE_CACHE, else
 * $XDG_CACHE_HOME/kiln/plugin_probe); NULL when turned off (`none`) or no
 * file can be named.  A missing or unreadable file is an empty cache. */
struct probe_cache *kiln_probe_cache_open(void);
/* What the plugin file `path` provides ("<kind>:<name>\n" per plugin),
 * when its kept answer is for the file as it is now; else NULL. */
const char *kiln_probe_cache_find(const struct probe_cache *c, const char *path);
/* Keep what `path`, which loaded in a probe child, provides. */
void kiln_probe_cache_put(struct probe_cache *c, const char *path, const char *provides);
/* Write the answers back when any was added (dropping those of files that
 * changed or vanished), then free c.  NULL is a no-op. */
void kiln_probe_cache_close(struct probe_cache *c);

#endif
