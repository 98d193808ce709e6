/* core/probe_cache.c - what the plugin probe learnt, kept between runs.
 *
 * Finding a plugin that no file is named after (the `idx` source of
 * kiln-loaders.so) loads every plugin file in a child process
 * (core/registry_probe.c).  That loads every library they link, cuDNN and cuBLAS
 * included, about 0.13 CPU-s on a machine without a GPU.  The answers
 * depend only on the files, so they are kept in one text file, by default
 * $XDG_CACHE_HOME/kiln/plugin_probe ($KILN_PROBE_CACHE names another file,
 * or `none`), a line per plugin file:
 *
 *   kiln-probe <abi> <size> <mtime_s> <mtime_ns> <ino> <path>\t<kind>:<name> ...
 *
 * An answer is used only when the file's size, mtime and inode and this
 * kiln's ABI are the ones recorded; only files whose loading succeeded are
 * recorded (a file that failed or crashed is probed, and reported, every
 * time).  Lines that do not parse are ignored; lines of files that changed
 * or vanished are dropped when the file is rewritten (atomically).
 */
#include "internal.h"
#include "probe_cache.h"
#include "../plugins/common/cache_file.h" /* common_cache_path, common_write_atomic */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROBE_TAG "kiln-probe"

struct probe_entry {
	char *path;
	char *provides; /* "<kind>:<name>\n" per plugin, as the probe reports */
	uint64_t size, ino;
	int64_t mtime_s, mtime_ns;
};

struct probe_cache {
	char file[PATH_MAX];
	struct probe_entry *e;
	int n, cap;
	int dirty;
};

/* This kiln's ABI, which an answer must have been given to. */
static const char *probe_abi(void)
{
	static char abi[32];
	if (!abi[0])
		snprintf(abi, sizeof abi, "%d.%d/%d", KILN_ABI_MAJOR, KILN_ABI_MINOR,
			 KILN_HOST_VERSION);
	return abi;
}

/* Whether entry e describes the file at e->path as it is now. */
static int probe_entry_current(const struct probe_entry *e)
{
	struct stat sb;
	return !stat(e->path, &sb) && (uint64_t)sb.st_size == e->size &&
	       (int64_t)sb.st_mtim.tv_sec == e->mtime_s &&
	       (int64_t)sb.st_mtim.tv_nsec == e->mtime_ns && (uint64_t)sb.st_ino == e->ino;
}

static void probe_entry_free(struct probe_entry *e)
{
	free(e->path);
	free(e->provides);
}

/* Add an entry (taking path and provides); replaces one of the same path. */
static int probe_add(struct probe_cache *c, struct probe_entry *e)
{
	for (int i = 0; i < c->n; i++)
		if (!strcmp(c->e[i].path, e->path)) {
			probe_entry_free(&c->e[i]);
			c->e[i] = *e;
			return 0;
		}
	struct probe_entry *ne = kiln_grow(c->e, c->n, &c->cap, sizeof *ne, 16);
	if (!ne)
		return -1;
	c->e = ne;
	c->e[c->n++] = *e;
	return 0;
}

/* One line (without its newline) into an entry; -1 when it does not parse
 * or was written for another ABI. */
static int probe_parse(char *line, struct probe_entry *e)
{
	char abi[32];
	int at = 0;
	memset(e, 0, sizeof *e);
	if (sscanf(line, PROBE_TAG " %31s %" SCNu64 " %" SCNd64 " %" SCNd64 " %" SCNu64 " %n", abi,
		   &e->size, &e->mtime_s, &e->mtime_ns, &e->ino, &at) != 5 || !at ||
	    strcmp(abi, probe_abi()))
		return -1;
	char *path = line + at, *tab = strchr(path, '\t');
	if (!tab || tab == path || path[0] != '/')
		return -1;
	*tab = 0;
	/* the list: words "<kind>:<name>" back to the probe's lines */
	size_t len = strlen(tab + 1);
	if (!(e->path = kiln_strdup(path)) || !(e->provides = malloc(len + 2)))
		goto fail;
	char *out = e->provides;
	char *save = NULL;
	for (char *w = strtok_r(tab + 1, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
		int kind;
		char name[256];
		if (sscanf(w, "%d:%255s", &kind, name) != 2)
			goto fail;
		out += sprintf(out, "%s\n", w);
	}
	*out = 0;
	return 0;
fail:
	probe_entry_free(e);
	return -1;
}

struct probe_cache *kiln_probe_cache_open(void)
{
	const char *env = getenv("KILN_PROBE_CACHE");
	if (env && !strcmp(env, "none"))
		return NULL;
	struct probe_cache *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	if (env && *env)
		snprintf(c->file, sizeof c->file, "%s", env);
	else if (common_cache_path(c->file, sizeof c->file, "plugin_probe")) {
		static int noted; /* once a process: every registry opens one */
		char why[300];
		if (errno == ENOENT && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED)) {
			common_cache_note(why, sizeof why);
			kiln_log(KILN_LOG_INFO, "core", "plugin probe cache: %s", why);
		}
		free(c);
		return NULL;
	}
	FILE *f = fopen(c->file, "re");
	char line[PATH_MAX + 4096];
	while (f && fgets(line, sizeof line, f)) {
		size_t l = strlen(line);
		struct probe_entry e;
		if (!l || line[l - 1] != '\n')
			continue; /* a cut line: ignored */
		line[l - 1] = 0;
		if (!probe_parse(line, &e) && probe_add(c, &e))
			probe_entry_free(&e);
	}
	if (f)
		fclose(f);
	return c;
}

const char *kiln_probe_cache_find(const struct probe_cache *c, const char *path)
{
	for (int i = 0; c && i < c->n; i++)
		if (!strcmp(c->e[i].path, path))
			return probe_entry_current(&c->e[i]) ? c->e[i].provides : NULL;
	return NULL;
}

void kiln_probe_cache_put(struct probe_cache *c, const char *path, const char *provides)
{
	struct stat sb;
	struct probe_entry e = { 0 };
	if (!c || path[0] != '/' || strpbrk(path, "\t\n") || stat(path, &sb))
		return;
	/* the names must survive the line format: no blanks in a name */
	for (const char *p = provides; *p; p++)
		if (*p == ' ' || *p == '\t')
			return;
	e.size = (uint64_t)sb.st_size;
	e.mtime_s = (int64_t)sb.st_mtim.tv_sec;
	e.mtime_ns = (int64_t)sb.st_mtim.tv_nsec;
	e.ino = (uint64_t)sb.st_ino;
	if (!(e.path = kiln_strdup(path)) || !(e.provides = kiln_strdup(provides)) ||
	    probe_add(c, &e)) {
		probe_entry_free(&e);
		return;
	}
	c->dirty = 1;
}

/* The file's text: every entry still current, one line each. */
static char *probe_text(const struct probe_cache *c, size_t *len)
{
	size_t cap = 1;
	for (int i = 0; i < c->n; i++)
		cap += strlen(c->e[i].path) + strlen(c->e[i].provides) + 160;
	char *buf = malloc(cap), *out = buf;
	if (!buf)
		return NULL;
	for (int i = 0; i < c->n; i++) {
		const struct probe_entry *e = &c->e[i];
		if (!probe_entry_current(e))
			continue;
		out += sprintf(out, PROBE_TAG " %s %" PRIu64 " %" PRId64 " %" PRId64 " %" PRIu64 " %s\t",
			       probe_abi(), e->size, e->mtime_s, e->mtime_ns, e->ino, e->path);
		for (const char *p = e->provides; *p; p++)
			*out++ = *p == '\n' && p[1] ? ' ' : *p;
		if (out[-1] != '\n')
			*out++ = '\n';
	}
	*len = (size_t)(out - buf);
	return buf;
}

void kiln_probe_cache_close(struct probe_cache *c)
{
	if (!c)
		return;
	size_t len = 0;
	char *text = c->dirty ? probe_text(c, &len) : NULL;
	if (text) {
		const void *part[1] = { text };
		if (common_write_atomic(c->file, part, &len, 1))
			kiln_log(KILN_LOG_DEBUG, "plugins", "cannot keep the probe's answers in %s: %s",
				 c->file, strerror(errno));
		free(text);
	}
	for (int i = 0; i < c->n; i++)
		probe_entry_free(&c->e[i]);
	free(c->e);
	free(c);
}
