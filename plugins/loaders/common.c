/* plugins/loaders/common.c - helpers the file-backed sources share: full
 * preads, the split-directory rule, finding shard files.  See loaders.h. */
#include "loaders.h"
#include "image.h" /* IMG_MAX_PIXELS */
#include "../common/read_full.h" /* common_pread_full */

#include <inttypes.h>

#include <ctype.h>    /* isspace */
#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno, EINTR */
#include <glob.h>     /* glob: shards patterns */
#include <limits.h>   /* PATH_MAX */
#include <stddef.h>   /* ptrdiff_t */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* malloc, realloc, free, qsort */
#include <string.h>   /* memcpy, memset, strcmp, strerror, strlen */
#include <sys/resource.h> /* getrlimit(RLIMIT_NOFILE): loaders_open_hint */
#include <sys/stat.h> /* stat */
#include <unistd.h>   /* pread, access */

ssize_t loaders_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	return common_pread_full(fd, buf, n, off);
}

/* The words after "each shard stays open": the limit to raise, and where
 * the hard one is set when the soft one is at it (raising ulimit -n past
 * it fails; session 38's review). */
static void nofile_advice(const struct rlimit *rl, char *buf, size_t n)
{
	if (rl->rlim_cur == rl->rlim_max)
		snprintf(buf, n, "ulimit -n %llu is the hard limit: raise that (limits.conf nofile, systemd LimitNOFILE=, docker --ulimit nofile=)",
			 (unsigned long long)rl->rlim_cur);
	else if (rl->rlim_max == RLIM_INFINITY)
		snprintf(buf, n, "raise ulimit -n, now %llu, hard limit unlimited",
			 (unsigned long long)rl->rlim_cur);
	else
		snprintf(buf, n, "raise ulimit -n, now %llu, hard limit %llu",
			 (unsigned long long)rl->rlim_cur, (unsigned long long)rl->rlim_max);
}

const char *loaders_open_hint(int err, size_t nshards, char *buf, size_t n)
{
	struct rlimit rl;
	char advice[192];
	if (err != EMFILE || getrlimit(RLIMIT_NOFILE, &rl))
		return "";
	nofile_advice(&rl, advice, sizeof advice);
	snprintf(buf, n, " (each of the split's %zu shard(s) stays open while the run reads it: %s)",
		 nshards, advice);
	return buf;
}

int loaders_fd_headroom(int top_fd, size_t nshards, char *buf, size_t n)
{
	struct rlimit rl;
	char advice[192];
	if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur >= (rlim_t)top_fd + 1 + LOADERS_FD_HEADROOM)
		return 0;
	nofile_advice(&rl, advice, sizeof advice);
	snprintf(buf, n, "the split's %zu shard(s) stay open while the run reads them and leave %lld of ulimit -n %llu's descriptors (the highest open is %d), fewer than the %d the run needs besides (checkpoints, logs, the device, the communicator): %s",
		 nshards, (long long)rl.rlim_cur - top_fd - 1, (unsigned long long)rl.rlim_cur, top_fd,
		 LOADERS_FD_HEADROOM, advice);
	return 1;
}

kiln_status loaders_read_image(const struct loaders_source *src, int fd, uint64_t off, size_t n,
			       const char *what, struct kiln_image *img)
{
	const struct kiln_host *host = src->host;
	uint8_t *buf = malloc(n ? n : 1);
	if (!buf)
		return host->error(KILN_ENOMEM, "%s: out of memory for %zu bytes", what, n);
	kiln_status st;
	const ssize_t got = loaders_pread_full(fd, buf, n, off);
	if (got < 0)
		st = host->error(KILN_EIO, "%s: cannot read: %s", what, strerror(errno));
	else if ((size_t)got < n)
		st = host->error(KILN_EDATA, "%s: truncated: %zd of %zu bytes (the file shrank since it was listed)",
				 what, got, n);
	else
		st = img_decode(host, buf, n, what, src->max_pixels, img);
	free(buf);
	return st;
}

void loaders_names_free(struct loaders_names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof *l);
}

int loaders_names_add(struct loaders_names *l, const char *dir, const char *name)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		char **v = realloc(l->v, cap * sizeof *v);
		if (!v)
			return -1;
		l->v = v;
		l->cap = cap;
	}
	size_t dl = dir && name[0] != '/' ? strlen(dir) : 0, nl = strlen(name);
	char *p = malloc(dl + nl + 2);
	if (!p)
		return -1;
	if (dl)
		snprintf(p, dl + nl + 2, "%s%s%s", dir, dir[dl - 1] == '/' ? "" : "/", name);
	else
		memcpy(p, name, nl + 1);
	l->v[l->n++] = p;
	return 0;
}

static int loaders_names_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void loaders_names_sort(struct loaders_names *l, size_t from)
{
	if (l->n - from > 1) /* qsort(NULL, 0, ...) is undefined */
		qsort(l->v + from, l->n - from, sizeof *l->v, loaders_names_cmp);
}

int loaders_join(char *out, size_t n, const char *dir, const char *name)
{
	size_t dl = strlen(dir);
	int len = snprintf(out, n, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", name);
	return len < 0 || (size_t)len >= n;
}

/* Whether section's key, set at w (config_where), is [data]'s, inherited
 * ([data.eval] and [data.val] take the keys they do not set from [data],
 * core/config_get.c): config_where then gives the very string of the
 * [data] entry.  Said so in the messages: "f.ini:6: [data.eval] path"
 * named a line of [data] as [data.eval]'s (before session 38). */
static int key_inherited(const struct kiln_host *host, const struct kiln_config *cfg,
			 const char *section, const char *key, const char *w)
{
	return strcmp(w, "default") && strcmp(section, "data") &&
	       w == host->config_where(cfg, "data", key);
}

const char *loaders_where_said(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *key, char *out, size_t n)
{
	const char *w = host->config_where(cfg, section, key);
	if (!strcmp(w, "default"))
		snprintf(out, n, "the default");
	else if (key_inherited(host, cfg, section, key, w))
		snprintf(out, n, "inherited from [data] %s, set at %s", key, w);
	else
		snprintf(out, n, "set at %s", w);
	return out;
}

void loaders_key_at(const struct kiln_host *host, const struct kiln_config *cfg,
		    const char *section, const char *key, char *out, size_t n)
{
	const char *w = host->config_where(cfg, section, key);
	if (!strcmp(w, "default"))
		snprintf(out, n, "[%s] %s (the default)", section, key);
	else if (key_inherited(host, cfg, section, key, w))
		snprintf(out, n, "%s: [data] %s (inherited by [%s])", w, key, section);
	else
		snprintf(out, n, "%s: [%s] %s", w, section, key);
}

kiln_status loaders_no_such_file(const struct kiln_host *host, const char *at, const char *path,
				 const char *what)
{
	/* a relative name is the working directory's, not the config's: said
	 * (before session 50 `kiln train examples/x.ini` run from another
	 * directory named data/x "no such file" with no word of where) */
	char cwd[PATH_MAX], rel[PATH_MAX + 64] = "";
	if (path[0] != '/' && getcwd(cwd, sizeof cwd))
		snprintf(rel, sizeof rel, "%sa relative name is read from the working directory, %s",
			 what ? "; " : "", cwd);
	return host->error(KILN_ENOTFOUND, "%s: %s: no such file%s%s%s%s", at, path,
			   what || *rel ? " (" : "", what ? what : "", rel, what || *rel ? ")" : "");
}

/* Whether every name of a `shards` list is absolute: then `path`, the
 * directory of relative names, is not read. */
static int shards_all_absolute(const char *list)
{
	if (!list || !*list)
		return 0;
	for (const char *p = list; *p;) {
		while (*p == ',' || isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		if (*p != '/')
			return 0;
		while (*p && *p != ',' && !isspace((unsigned char)*p))
			p++;
	}
	return 1;
}

kiln_status loaders_path_is_dir(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, const char *who, const char *path, int *is_dir)
{
	struct stat sb;
	char w[4200];
	*is_dir = 0;
	if (!path || !*path)
		return KILN_OK;
	if (stat(path, &sb) != 0) {
		/* a path set but missing beside a shards list of absolute
		 * files names nothing that is read (it worked before session 33) */
		const int err = errno;
		if (err == ENOENT && shards_all_absolute(host->config_get(cfg, section, "shards")))
			return KILN_OK;
		if (loaders_missing(err)) {
			char at[4400], what[64];
			loaders_key_at(host, cfg, section, "path", at, sizeof at);
			snprintf(what, sizeof what, "the %s data", who);
			return loaders_no_such_file(host, at, path, what);
		}
		errno = err;
		return host->error(KILN_EIO, "%s: cannot open the %s data ([%s] path, %s): %s", path,
				   who, section, loaders_where_said(host, cfg, section, "path", w, sizeof w),
				   strerror(errno));
	}
	*is_dir = S_ISDIR(sb.st_mode);
	return KILN_OK;
}

void loaders_shards_at(const struct kiln_host *host, const struct kiln_config *cfg,
		       const char *section, char *out, size_t n)
{
	const char *list = host->config_get(cfg, section, "shards");
	loaders_key_at(host, cfg, section, list && *list ? "shards" : "path", out, n);
}

void loaders_shards_key(const struct kiln_host *host, const struct kiln_config *cfg,
			const char *section, char *out, size_t n)
{
	const char *list = host->config_get(cfg, section, "shards");
	const char *key = list && *list ? "shards" : "path";
	char w[4200];
	snprintf(out, n, "[%s] %s, %s", section, key, loaders_where_said(host, cfg, section, key, w, sizeof w));
}

/* The split the core asks `section` for (core/train_setup.c): only that
 * one may fall back to path itself. */
static const char *loaders_own_split(const char *section)
{
	return !strcmp(section, "data.eval") ? "test" : !strcmp(section, "data.val") ? "val" : "train";
}

kiln_status loaders_split_root(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *who, const char *path,
			       const char *split, int split_is_key, char *out, size_t n,
			       int *is_dir)
{
	*is_dir = 0;
	if (!path || !*path)
		return host->error(KILN_ECONFIG, "[%s] path is not set: source %s needs it (%s)",
				   section, who,
				   !strcmp(who, "folder") ? "the directory of class subdirectories" :
				   !strcmp(who, "tar") ? "a directory of .tar shards or one .tar file; or set shards" :
				   "the LMDB environment, a directory or a data file");
	int path_dir;
	kiln_status st = loaders_path_is_dir(host, cfg, section, who, path, &path_dir);
	if (st)
		return st;
	if (path_dir && split && *split && !strchr(split, '/')) {
		char sub[4096];
		struct stat ss;
		if (loaders_join(sub, sizeof sub, path, split))
			return host->error(KILN_ECONFIG, "[%s] path: %s/%s is too long", section, path,
					   split);
		if (stat(sub, &ss) == 0) {
			if (snprintf(out, n, "%s", sub) >= (int)n)
				return host->error(KILN_ECONFIG, "[%s] path: %s is too long", section, sub);
			*is_dir = S_ISDIR(ss.st_mode);
			return KILN_OK;
		}
		/* a split named that is not there: the config's (or the
		 * command line's) error, exit 2, as a missing path */
		const int err = errno;
		char at[4400], what[4400 + 64];
		if (split_is_key && loaders_missing(err)) {
			loaders_key_at(host, cfg, section, "split", at, sizeof at);
			snprintf(what, sizeof what, "split '%s' of [%s] path %s", split, section, path);
			return loaders_no_such_file(host, at, sub, what);
		}
		if (split_is_key)
			return host->error(KILN_EIO, "%s: cannot open split '%s' ([%s] split, set at %s): %s",
					   sub, split, section, host->config_where(cfg, section, "split"),
					   strerror(err));
		if (strcmp(split, loaders_own_split(section)))
			return host->error(loaders_missing(err) ? KILN_EUSAGE : KILN_EIO, "%s: cannot open split '%s' of [%s] path %s: %s (a split named on the command line must exist; only [%s]'s own, %s, falls back to path itself; set [%s] split = . to read path itself)",
					   sub, split, section, path, strerror(err), section,
					   loaders_own_split(section), section);
	} else if (split_is_key && split && *split) {
		return host->error(KILN_ECONFIG, "%s: [%s] split = %s needs path to be a directory holding %s/; %s is not one",
				   host->config_where(cfg, section, "split"), section, split, split, path);
	}
	/* [data.eval] inherits path from [data] (config.c): the pointer is the
	 * very string of the [data] entry exactly when it is inherited. */
	if ((!strcmp(section, "data.eval") || !strcmp(section, "data.val")) &&
	    host->config_get(cfg, "data", "path") == path)
		return host->error(KILN_ECONFIG, "[%s] path is inherited from [data] (%s: [data] path = %s) and %s/%s does not exist: %s would read the training data; set [%s] path, put the splits in %s/train and %s/%s, or %s",
				   section, host->config_where(cfg, "data", "path"), path, path, split && *split ? split : "test",
				   !strcmp(section, "data.eval") ? "evaluation" : "validation", section,
				   path, path, loaders_own_split(section),
				   !strcmp(section, "data.eval") ? "set [train] eval = 0" : "remove [data.val]");
	if (snprintf(out, n, "%s", path) >= (int)n)
		return host->error(KILN_ECONFIG, "[%s] path: %s is too long", section, path);
	*is_dir = path_dir;
	return KILN_OK;
}

kiln_status loaders_out_of_range(const struct kiln_host *host, const char *who,
				 const char *what, int64_t v, int64_t n, int64_t last)
{
	return host->error(KILN_EINVAL, "%s: %s %" PRId64 " is out of range: the source has %" PRId64 " samples (0..%" PRId64 ")",
			   who, what, v, n, last);
}

kiln_status loaders_varying_info(void *ctx, struct kiln_source_info *info)
{
	const struct loaders_source *src = ctx;
	memset(info, 0, sizeof *info);
	info->len = src->n;
	/* image sizes vary: sample stays ndim 0 and image_h/w/c 0 */
	info->label.dtype = KILN_I32;
	info->label.layout = KILN_ROW;
	info->label.ndim = 0;
	info->classes = src->classes;
	return KILN_OK;
}

void loaders_sequence_info(const struct loaders_source *src, int64_t T, struct kiln_source_info *info)
{
	memset(info, 0, sizeof *info);
	info->len = src->n;
	/* plugins do not link libkiln: the descriptors by hand */
	info->sample.dtype = info->label.dtype = KILN_I32;
	info->sample.layout = info->label.layout = KILN_ROW;
	info->sample.ndim = info->label.ndim = 1;
	info->sample.dims[0] = info->label.dims[0] = T;
	info->classes = src->classes;
}

void loaders_fixed_info(struct kiln_source_info *info, int dtype, int64_t d0, int64_t d1,
			int64_t d2, int32_t h, int32_t w, int32_t ch)
{
	info->sample.dtype = dtype;
	info->sample.layout = KILN_ROW;
	info->sample.ndim = 3;
	info->sample.dims[0] = d0;
	info->sample.dims[1] = d1;
	info->sample.dims[2] = d2;
	info->image_h = h;
	info->image_w = w;
	info->image_c = ch;
}

kiln_status loaders_check_index(const struct loaders_source *src, int64_t index)
{
	if (index < 0 || index >= src->n)
		return loaders_out_of_range(src->host, src->who, "sample index", index, src->n,
					    src->n - 1);
	return KILN_OK;
}

kiln_status loaders_classes_key(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, int64_t *classes)
{
	kiln_status st = host->config_get_int(cfg, section, "classes", classes);
	if (st == KILN_ENOTFOUND)
		*classes = 0;
	else if (st)
		return st;
	if (*classes < 0 || *classes > INT32_MAX)
		return host->error(KILN_ECONFIG, "%s: [%s] classes = %" PRId64 ": 0 (from the labels) or a class count",
				   host->config_where(cfg, section, "classes"), section, *classes);
	return KILN_OK;
}

kiln_status loaders_max_pixels_key(const struct kiln_host *host, const struct kiln_config *cfg,
				   const char *section, struct loaders_source *src)
{
	kiln_status st = host->config_get_int(cfg, section, "max_image_pixels", &src->max_pixels);
	if (st == KILN_ENOTFOUND)
		src->max_pixels = IMG_MAX_PIXELS;
	else if (st)
		return st;
	if (src->max_pixels < 1 || src->max_pixels > IMG_MAX_PIXELS)
		return host->error(KILN_ECONFIG, "%s: [%s] max_image_pixels = %" PRId64 ": 1 .. %" PRId64,
				   host->config_where(cfg, section, "max_image_pixels"), section,
				   src->max_pixels, (int64_t)IMG_MAX_PIXELS);
	return KILN_OK;
}

/* ---- finding the shards (records, tokens) ------------------------------ */

/* Append dir/name (or name alone when dir is NULL or name absolute). */
static kiln_status names_add(const struct kiln_host *host, struct loaders_names *l,
			     const char *dir, const char *name)
{
	if (loaders_names_add(l, dir, name))
		return host->error(KILN_ENOMEM, "out of memory");
	return KILN_OK;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* strcmp, but where both names have a run of digits the runs compare by
 * their numbers: train-99999 before train-100000, which %05d names reach
 * past 99999 shards (strcmp put train-100000 between train-10000 and
 * train-10001); names equal so (train-1, train-01) by strcmp. */
static int shard_names_cmp(const void *a, const void *b)
{
	const char *x = *(char *const *)a, *y = *(char *const *)b;
	const char *const x0 = x, *const y0 = y;
	while (*x && *y) {
		if (*x >= '0' && *x <= '9' && *y >= '0' && *y <= '9') {
			x += strspn(x, "0");
			y += strspn(y, "0");
			const size_t nx = strspn(x, "0123456789"), ny = strspn(y, "0123456789");
			const int c = nx != ny ? (nx < ny ? -1 : 1) : strncmp(x, y, nx);
			if (c)
				return c;
			x += nx, y += ny;
		} else if (*x != *y) {
			break;
		} else {
			x++, y++;
		}
	}
	const int c = (unsigned char)*x - (unsigned char)*y;
	return c ? c : strcmp(x0, y0);
}

void loaders_shards_sort(struct loaders_names *l, size_t from)
{
	if (l->n - from > 1)
		qsort(l->v + from, l->n - from, sizeof *l->v, shard_names_cmp);
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

static int cmp_long(const void *a, const void *b)
{
	const long x = *(const long *)a, y = *(const long *)b;
	return (x > y) - (x < y);
}

/* name's kiln pack number: name is STEM-DIGITS then suffix, the digits at
 * least 5; *stem (its length *sl) and *width (the digits') set.  -1 when
 * the name is of another form. */
static long pack_number(const char *name, const char *suffix, size_t *sl, size_t *width)
{
	const size_t n = strlen(name), k = strlen(suffix);
	if (!ends_with(name, suffix))
		return -1;
	size_t d = n - k; /* the digits end here */
	size_t b = d;
	while (b > 0 && name[b - 1] >= '0' && name[b - 1] <= '9')
		b--;
	if (d - b < 5 || d - b > 9 || b < 2 || name[b - 1] != '-')
		return -1;
	*sl = b - 1, *width = d - b;
	return strtol(name + b, NULL, 10);
}

kiln_status loaders_shards_contiguous(const struct kiln_host *host, char *const *v, size_t n,
				      const char *suffix)
{
	if (n < 1)
		return KILN_OK;
	const char *first = base_name(v[0]);
	size_t sl0 = 0, w0 = 0, sl, w;
	for (size_t i = 0; i < n; i++) {
		const char *name = base_name(v[i]);
		if (pack_number(name, suffix, &sl, &w) < 0)
			return KILN_OK;
		if (!i)
			sl0 = sl, w0 = w;
		else if (sl != sl0 || memcmp(name, first, sl))
			return KILN_OK; /* two stems */
		if (w < w0)
			w0 = w;
	}
	if (w0 != 5 && w0 != 6)
		return KILN_OK;
	for (size_t i = 0; i < n; i++) {
		const char *name = base_name(v[i]);
		/* past 10^w0 - 1, %0*d gives more digits, never a leading 0 */
		if (pack_number(name, suffix, &sl, &w) >= 0 && w > w0 && name[sl + 1] == '0')
			return KILN_OK;
	}
	/* the numbers, sorted: a gap inside lo .. hi is a shard lost from the
	 * run (deleted, or not copied).  The run may start above 0 and end
	 * anywhere: a held-out directory of data-000900 .. data-000999, one
	 * shard copied for a smoke test, or 1-based numbering are whole. */
	long *k = malloc(n * sizeof *k);
	if (!k)
		return host->error(KILN_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		k[i] = pack_number(base_name(v[i]), suffix, &sl, &w);
	qsort(k, n, sizeof *k, cmp_long);
	long miss = -1;
	for (size_t i = 1; i < n && miss < 0; i++)
		if (k[i] > k[i - 1] + 1)
			miss = k[i - 1] + 1;
	const long lo = k[0], hi = k[n - 1];
	free(k);
	if (miss < 0)
		return KILN_OK;
	return host->error(KILN_EDATA, "%.*s%.*s-%0*ld%s is missing: the split's %zu shards are numbered %0*ld .. %0*ld as kiln pack numbers them (%s, ...), but this one is not there (deleted, or not copied); restore it, or list the shards to read in `shards`",
			   (int)(first - v[0]), v[0], (int)sl0, first, (int)w0, miss, suffix, n,
			   (int)w0, lo, (int)w0, hi, first);
}

/* ---- the pack a shard records (loaders_set_check) ---------------------- */

/* A shard's record and its place in the order read, sorted by
 * loaders_set_check (by pack, count, index; no global state, so that
 * sources may open on several threads). */
struct set_at {
	struct loaders_set s;
	size_t i;
};

static int set_cmp(const void *a, const void *b)
{
	const struct loaders_set *x = &((const struct set_at *)a)->s,
				 *y = &((const struct set_at *)b)->s;
	if (x->pack != y->pack)
		return x->pack < y->pack ? -1 : 1;
	if (x->count != y->count)
		return x->count < y->count ? -1 : 1;
	return (x->index > y->index) - (x->index < y->index);
}

/* The name kiln pack gave shard `k` of the pack `like` belongs to:
 * like's directory and stem, k in like's digits; "shard k" when like's
 * name is not of kiln pack's form. */
static void set_shard_name(const char *like, const char *suffix, uint32_t k, char *out, size_t n)
{
	const char *name = base_name(like);
	size_t sl, w;
	if (pack_number(name, suffix, &sl, &w) < 0)
		snprintf(out, n, "shard %u (of the pack %s belongs to)", k, like);
	else
		snprintf(out, n, "%.*s-%0*u%s", (int)(name - like + (ptrdiff_t)sl), like, (int)w, k,
			 suffix);
}

/* The split's shards (whole) all of one pack, every index there. */
static kiln_status set_check_whole(const struct kiln_host *host, char *const *paths,
				   const struct set_at *o, size_t n, const char *suffix)
{
	const struct loaders_set *a = &o[0].s, *z = &o[n - 1].s;
	if (a->pack != z->pack || a->count != z->count) {
		/* (sorted: the first and the last differ when any two do) */
		const char *pa = paths[o[0].i], *pz = paths[o[n - 1].i];
		if (!a->count)
			return host->error(KILN_EDATA, "%s records no pack (an older kiln's or another tool's shard) but %s is shard %u of a pack of %u: the directory mixes shards of two packs; pack the split again, or list the shards to read in `shards`",
					   pa, pz, z->index, z->count);
		return host->error(KILN_EDATA, "%s (shard %u of %u, pack %08x) and %s (shard %u of %u, pack %08x) are of two different packs: the directory mixes them; pack the split again, or list the shards to read in `shards`",
				   pa, a->index, a->count, a->pack, pz, z->index, z->count, z->pack);
	}
	if (n == a->count)
		return KILN_OK; /* distinct indexes below count: all of them */
	uint32_t miss = 0, more = 0, first = UINT32_MAX;
	for (size_t i = 0, k = 0; k < a->count; k++) {
		if (i < n && o[i].s.index == k) {
			i++;
			continue;
		}
		if (first == UINT32_MAX)
			first = (uint32_t)k;
		miss++;
	}
	more = miss - 1;
	char name[PATH_MAX + 64], count[64] = "";
	set_shard_name(paths[o[0].i], suffix, first, name, sizeof name);
	if (more)
		snprintf(count, sizeof count, " (and %u more shard(s))", more);
	return host->error(KILN_EDATA, "%s%s is missing: the split's shards record a pack of %u shard(s) (%s is shard %u of them), but %zu are here (deleted, or not copied; a missing last shard leaves no gap in the numbers); restore it, or list the shards to read in `shards`",
			   name, count, a->count, paths[o[0].i], a->index, n);
}

kiln_status loaders_set_check(const struct kiln_host *host, char *const *paths,
			      const struct loaders_set *sets, size_t stride, size_t n, int whole,
			      const char *suffix)
{
#define SET(i) (*(const struct loaders_set *)((const char *)sets + (i) * stride))
	size_t recorded = 0;
	for (size_t i = 0; i < n; i++)
		recorded += SET(i).count > 0;
	if (!recorded || (!whole && recorded < 2))
		return KILN_OK;
	struct set_at *o = malloc(n * sizeof *o);
	if (!o)
		return host->error(KILN_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		o[i] = (struct set_at){ SET(i), i };
#undef SET
	qsort(o, n, sizeof *o, set_cmp);
	kiln_status st = KILN_OK;
	for (size_t i = 1; i < n && !st; i++) {
		const struct set_at *x = &o[i - 1], *y = &o[i];
		if (y->s.count && !set_cmp(x, y))
			st = host->error(KILN_EDATA, "%s and %s are the same shard %u of a pack of %u (pack %08x): one file read twice (listed twice, or copied under two names); read each once",
					 paths[x->i < y->i ? x->i : y->i], paths[x->i < y->i ? y->i : x->i],
					 x->s.index, x->s.count, x->s.pack);
	}
	if (!st && whole)
		st = set_check_whole(host, paths, o, n, suffix);
	free(o);
	return st;
}

/* The regular files of dir whose names start with `prefix` and end in
 * `suffix`, in shard order (loaders_shards_sort). */
static kiln_status scan_dir(const struct kiln_host *host, const char *dir, const char *prefix,
			    const char *suffix, struct loaders_names *out)
{
	DIR *d = opendir(dir);
	if (!d)
		return host->error(KILN_EIO, "%s: cannot list the directory: %s", dir, strerror(errno));
	struct dirent *de;
	kiln_status st = KILN_OK;
	size_t pl = strlen(prefix);
	size_t first = out->n;
	while ((de = readdir(d))) {
		const char *name = de->d_name;
		if (name[0] == '.' || strncmp(name, prefix, pl) || !ends_with(name, suffix))
			continue;
		if ((st = names_add(host, out, dir, name)))
			break;
		struct stat sb;
		if (stat(out->v[out->n - 1], &sb) || !S_ISREG(sb.st_mode)) {
			free(out->v[--out->n]); /* a directory or dangling link named *.suffix */
			continue;
		}
	}
	closedir(d);
	if (!st) {
		loaders_shards_sort(out, first);
		st = loaders_shards_contiguous(host, out->v + first, out->n - first, suffix);
		out->scanned = 1;
	}
	return st;
}

/* One name of the `shards` list: a glob pattern (*, ?, [) expands to the
 * files it matches, in shard order, and must match one; a plain name is
 * taken as it is (opening it reports a missing file). */
static kiln_status add_listed(const struct kiln_host *host, struct loaders_names *out,
			      const char *dir, const char *name, const char *at)
{
	if (!strpbrk(name, "*?["))
		return names_add(host, out, dir, name);
	char pat[PATH_MAX];
	if (loaders_join(pat, sizeof pat, dir && name[0] != '/' ? dir : "", name))
		return host->error(KILN_ECONFIG, "shards: the pattern %s is too long", name);
	const char *p = dir && name[0] != '/' ? pat : name;
	glob_t g;
	int r = glob(p, 0, NULL, &g);
	if (r == GLOB_NOMATCH || (r == 0 && g.gl_pathc == 0)) {
		globfree(&g);
		/* the config's error, exit 2, as a missing file it names
		 * (KILN_EIO, exit 3, before session 37) */
		return host->error(KILN_ENOTFOUND, "%s: %s: no file matches this shards pattern",
				   at, p);
	}
	if (r) {
		globfree(&g);
		return host->error(KILN_EIO, "%s: cannot expand the shards pattern", p);
	}
	kiln_status st = KILN_OK;
	const size_t first = out->n;
	for (size_t i = 0; i < g.gl_pathc && !st; i++)
		st = names_add(host, out, NULL, g.gl_pathv[i]);
	globfree(&g);
	if (!st)
		loaders_shards_sort(out, first);
	return st;
}

/* The `shards` list: comma-separated, spaces around names ignored; at:
 * where it was set (loaders_key_at). */
static kiln_status parse_list(const struct kiln_host *host, const char *list, const char *dir,
			      const char *at, struct loaders_names *out)
{
	kiln_status st;
	const char *p = list;
	while (*p) {
		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		const char *q = p;
		while (*q && *q != ',')
			q++;
		const char *e = q;
		while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		if (e > p) {
			char name[PATH_MAX];
			if ((size_t)(e - p) >= sizeof name)
				return host->error(KILN_ECONFIG, "shards: a name is too long");
			memcpy(name, p, (size_t)(e - p));
			name[e - p] = 0;
			if ((st = add_listed(host, out, dir, name, at)))
				return st;
		}
		p = q;
	}
	return KILN_OK;
}

kiln_status loaders_find_shards(const struct kiln_host *host, const struct kiln_config *cfg,
				const char *section, const char *who, const char *split,
				const char *suffix, struct loaders_names *out)
{
	const char *path = host->config_get(cfg, section, "path");
	const char *list = host->config_get(cfg, section, "shards");
	struct stat sb;
	int is_dir;
	kiln_status st = loaders_path_is_dir(host, cfg, section, who, path, &is_dir);
	if (st)
		return st;

	if (list && *list) {
		char at[4400];
		loaders_key_at(host, cfg, section, "shards", at, sizeof at);
		if ((st = parse_list(host, list, is_dir ? path : NULL, at, out)))
			return st;
		if (!out->n)
			return host->error(KILN_ECONFIG, "%s: [%s] shards names no file",
					   host->config_where(cfg, section, "shards"), section);
		return KILN_OK;
	}
	if (!path || !*path)
		return host->error(KILN_ECONFIG, "[%s] source = %s needs `path` (a %s shard or a directory of them) or `shards`",
				   section, who, suffix);
	if (!is_dir) {
		/* [data.eval] inherits `path` from [data]; when that is one shard,
		 * evaluating on it would evaluate on the training file.  (An
		 * inherited value is the very string [data] holds.) */
		if (strcmp(section, "data") && path == host->config_get(cfg, "data", "path"))
			return host->error(KILN_ECONFIG, "[%s] inherits path = %s (one shard) from [data] (%s): evaluation would read the training file; set [%s] path or shards, or make path a directory with train and test shards",
					   section, path, host->config_where(cfg, "data", "path"),
					   section);
		return names_add(host, out, NULL, path);
	}

	/* a directory: path/<split>/ if it is one, else path/<split>-*<suffix> */
	const char *sp = split && *split ? split : ".";
	char sub[PATH_MAX];
	if (loaders_join(sub, sizeof sub, path, sp))
		return host->error(KILN_ECONFIG, "[%s] path: %s/%s is too long", section, path, sp);
	if (stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		if ((st = scan_dir(host, sub, "", suffix, out)))
			return st;
		if (!out->n)
			return host->error(KILN_EIO, "%s: no *%s shards in this directory ([%s] path = %s, split %s)",
					   sub, suffix, section, path, sp);
		return KILN_OK;
	}
	char prefix[256];
	snprintf(prefix, sizeof prefix, "%s-", sp);
	if ((st = scan_dir(host, path, prefix, suffix, out)))
		return st;
	/* a split the config's key names that is not there is its typo (exit
	 * 2, as the folder source's: loaders_split_root); the run's own split
	 * missing is the data's (before session 37 both were KILN_EIO) */
	const char *key = host->config_get(cfg, section, "split");
	if (!out->n && key && split && !strcmp(key, split)) {
		char at[4400], what[PATH_MAX + 128];
		loaders_key_at(host, cfg, section, "split", at, sizeof at);
		snprintf(what, sizeof what, "the split's directory, or %s-*%s shards", sub, suffix);
		return loaders_no_such_file(host, at, sub, what);
	}
	if (!out->n)
		return host->error(KILN_EIO, "%s: no shards for split '%s': neither %s/ nor %s-*%s exists; set [%s] path or shards, or split",
				   path, sp, sub, sub, suffix, section);
	return KILN_OK;
}

kiln_status loaders_not_partial(const struct kiln_host *host, const char *shard,
				const char *partial)
{
	const char *dash = strrchr(shard, '-'), *slash = strrchr(shard, '/');
	char m[PATH_MAX];
	if (!dash || (slash && dash < slash) ||
	    snprintf(m, sizeof m, "%.*s%s", (int)(dash - shard), shard, partial) >= (int)sizeof m ||
	    access(m, F_OK))
		return KILN_OK;
	return host->error(KILN_EDATA, "%s: the kiln pack that wrote this split did not finish (%s exists), so its shards may be incomplete or mix two packs: run the pack again with --force",
			   shard, m);
}

kiln_status loaders_root_not_partial(const struct kiln_host *host, const char *root,
				     const char *partial)
{
	char m[PATH_MAX], real[PATH_MAX];
	/* the marker is beside the root's real directory: a root written as
	 * `.`, `x/..`, `root/.` or through a link names it (before the review
	 * of session 32 the text was used: `path = .` inside the split looked
	 * for ./.folder-partial and missed ../train.folder-partial) */
	const char *r = realpath(root, real) ? real : root;
	size_t l = strlen(r);
	while (l > 1 && (r[l - 1] == '/' || (r[l - 1] == '.' && r[l - 2] == '/')))
		l -= r[l - 1] == '/' ? 1 : 2;
	if (snprintf(m, sizeof m, "%.*s%s", (int)l, r, partial) >= (int)sizeof m ||
	    access(m, F_OK))
		return KILN_OK;
	return host->error(KILN_EDATA, "%s: the kiln pack that wrote this folder did not finish (%s exists), so it may hold only some of the samples, and its class folders then give other labels: run the pack again with --force",
			   root, m);
}
