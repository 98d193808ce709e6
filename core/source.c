/* core/source.c - a data source opened outside the trainer (kiln pack,
 * tools, tests): the same registry lookup, open and checks as the
 * trainer's, behind a small handle; see kiln.h. */
#include "internal.h"

#include <stdio.h>
#include <sys/stat.h>

/* kiln_source_open's walk over the source's files: the first one that is
 * the watched output (kiln_output_watch) stops it.  The output is stat'ed
 * once, before the walk (`out`), and each file once in it (before the
 * review of session 34 the output was stat'ed again for each file, even
 * when absent: 200,000 to 400,000 stats for a folder of 200,000 images,
 * whose scan avoids even one by d_type).  Names cannot narrow it down soundly: a hard
 * link to the output may have any name in any directory of its file
 * system, and a bind mount shows the same file under another path with no
 * link at all, so only (st_dev, st_ino) decides. */
struct files_check {
	char reader[64];
	struct stat out;
	kiln_status st;
};

static void file_checked(void *arg, const char *path)
{
	struct files_check *fc = arg;
	if (!fc->st)
		fc->st = kiln_output_same_check(&fc->out, path, fc->reader);
}

/* The source's files against the watched output: KILN_EUSAGE when one is
 * it.  Nothing watched, or no output there yet (the usual case: a new
 * export), no file can be it, and the files are not even listed. */
static kiln_status files_checked(struct kiln_source *s)
{
	struct files_check fc = { .st = KILN_OK };
	if (s->ops->version < 4 || !s->ops->files || !kiln_output_watched_stat(&fc.out))
		return KILN_OK;
	snprintf(fc.reader, sizeof fc.reader, "[%s]", s->section);
	s->ops->files(s->ctx, file_checked, &fc);
	return fc.st;
}

kiln_status kiln_source_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *section, const char *split, struct kiln_source **out)
{
	return kiln_source_open_named(cfg, reg, section, split, out, NULL);
}

/* The source plugin [section] source names, *p; section one of the data
 * sections.  `who` names the caller in the message of a bad section. */
static kiln_status source_plugin(const struct kiln_config *cfg, const struct kiln_registry *reg,
				 const char *section, const char *who, const struct kiln_plugin **p)
{
	const char *name = kiln_config_get(cfg, section, "source");
	if (strcmp(section, "data") && strcmp(section, "data.eval") && strcmp(section, "data.val"))
		return kiln_error(KILN_EINVAL, "%s: section '%s' is not data, data.eval or data.val",
				  who, section);
	if (!name || !*name)
		return kiln_error(KILN_ECONFIG, "[%s] source is not set", section);
	if (kiln_registry_find(reg, KILN_PLUGIN_SOURCE, name, p))
		return kiln_error_wrap(KILN_ECONFIG, "%s: [%s] source",
				       kiln_config_where(cfg, section, "source"), section);
	return KILN_OK;
}

/* A plugin's failed open (or peek) as the core reports it: a file the
 * config names that is not there is the config's error, exit 2 (*missing
 * set; KILN_EDATA, exit 3, before session 37), unreadable data KILN_EDATA
 * (exit 3). */
static kiln_status source_open_failed(kiln_status st, int *missing)
{
	if (st == KILN_ENOTFOUND && missing)
		*missing = 1;
	return st == KILN_ENOTFOUND ? KILN_ECONFIG : st == KILN_EIO ? KILN_EDATA : st;
}

kiln_status kiln_source_open_named(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *section, const char *split, struct kiln_source **out,
				   int *missing)
{
	if (missing)
		*missing = 0;
	if (!cfg || !reg || !section || !out)
		return kiln_null_arg("kiln_source_open", !cfg ? "cfg" : !reg ? "reg" : !section ? "section" : "out");
	const struct kiln_plugin *p;
	int64_t limit = 0;
	kiln_status st;

	*out = NULL;
	if ((st = source_plugin(cfg, reg, section, "kiln_source_open", &p)))
		return st;
	struct kiln_source *s = calloc(1, sizeof *s);
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->ops = p->ops;
	s->name = p->name;
	snprintf(s->section, sizeof s->section, "%s", section);
	if ((st = s->ops->open(kiln_host_table(), cfg, section, split, &s->ctx))) {
		free(s);
		return source_open_failed(st, missing);
	}
	memset(&s->info, 0, sizeof s->info); /* fields past the plugin's version stay 0 */
	if ((st = s->ops->info(s->ctx, &s->info))) {
		kiln_source_close(s);
		return st;
	}
	if ((st = files_checked(s))) {
		kiln_source_close(s);
		return st;
	}
	kiln_config_get_int(cfg, section, "limit", &limit);
	if (limit > 0 && limit < s->info.len) {
		kiln_log(KILN_LOG_INFO, "data", "[%s] limit = %lld: the first %lld of the source's %lld samples",
			 section, (long long)limit, (long long)limit, (long long)s->info.len);
		s->info.len = limit;
	} else if (limit > s->info.len) {
		kiln_log(KILN_LOG_INFO, "data", "[%s] limit = %lld is more than the source's %lld samples: all %lld are used",
			 section, (long long)limit, (long long)s->info.len, (long long)s->info.len);
	}
	*out = s;
	return KILN_OK;
}

kiln_status kiln_source_peek(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *section, const char *split, const struct kiln_plugin **plugin,
			     struct kiln_source_info *info, int *missing, int *peeked)
{
	const struct kiln_plugin *p;
	struct stat out;
	*missing = *peeked = 0;
	memset(info, 0, sizeof *info);
	kiln_status st = source_plugin(cfg, reg, section, "kiln_source_peek", &p);
	if (st)
		return st;
	*plugin = p;
	const struct kiln_source_ops *ops = p->ops;
	/* an output that exists already: the open compares it with every
	 * file of the set (files_checked), which a peek does not list */
	if (ops->version < 5 || !ops->peek || kiln_output_watched_stat(&out))
		return KILN_OK;
	st = ops->peek(kiln_host_table(), cfg, section, split, info);
	if (st == KILN_ENOTSUP) { /* it cannot tell: the caller opens the set */
		memset(info, 0, sizeof *info);
		return KILN_OK;
	}
	*peeked = 1;
	info->len = info->classes = 0; /* not told by a peek */
	info->classes_from = NULL;
	return st ? source_open_failed(st, missing) : KILN_OK;
}

void kiln_source_close(struct kiln_source *s)
{
	if (!s)
		return;
	if (s->ctx)
		s->ops->close(s->ctx);
	free(s);
}

size_t kiln_source_info(const struct kiln_source *s, struct kiln_source_info *info, size_t size)
{
	/* (the caller's struct may be an older minor's, smaller: kiln.h; a
	 * NULL source zeroes it, a NULL info writes nothing) */
	const size_t n = size < sizeof(struct kiln_source_info) ? size : sizeof(struct kiln_source_info);
	if (!info)
		return 0;
	if (!s) {
		memset(info, 0, n); /* (documented: kiln/kiln.h) */
		return n;
	}
	memcpy(info, &s->info, n);
	return n;
}

const char *kiln_source_name(const struct kiln_source *s)
{
	return s ? s->name : NULL;
}

int kiln_source_has_images(const struct kiln_source *s)
{
	return s && s->ops->version >= 2 && s->ops->read_image != NULL;
}

kiln_status kiln_source_read_image(struct kiln_source *s, int64_t index, struct kiln_image *img,
				   int32_t *label)
{
	if (!kiln_source_has_images(s))
		return kiln_error(KILN_ENOTSUP, "[%s] source '%s' has no read_image (it yields tensors, not images)",
				  s->section, s->name);
	if (index < 0 || index >= s->info.len)
		return kiln_error(KILN_EINVAL, "[%s] sample index %lld is out of range (0..%lld)",
				  s->section, (long long)index, (long long)s->info.len - 1);
	return s->ops->read_image(s->ctx, index, img, label);
}
