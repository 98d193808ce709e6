/* plugins/loaders/folder.c - the `folder` data source: torchvision's
 * ImageFolder layout.
 *
 *   <root>/<class>/.../<file>.{jpg,jpeg,png}
 *
 * Classes are the subdirectories of <root> (symbolic links followed,
 * hidden ones included, as os.scandir's is_dir() sees them) sorted by
 * strcmp (Python's str order for UTF-8 names); a class's index is its
 * position.  Samples are listed exactly as torchvision's make_dataset
 * does: classes in order; within a class, os.walk(followlinks=True) of
 * its directory sorted by directory path, and in each directory the file
 * names sorted.  (That is not the order of the sorted full paths: c/z.jpg
 * comes before c/b/x.jpg.)  Only .jpg, .jpeg and .png (any case) are
 * images here; torchvision also accepts .bmp .ppm .pgm .tif .tiff .webp,
 * which we skip and count in a warning.  An empty class folder keeps its
 * index; a root without class folders is an error.
 *
 * The split rule (common.c): when <path>/<split> exists it is the root, so
 * [data] path = /x reads /x/train and [data.eval] reads /x/test.  A root
 * beside a <root>.folder-partial file is refused: a `kiln pack --format
 * folder` that did not finish left it, and the tree may lack classes, so
 * the labels of those present would shift (FOLDER_PARTIAL, loaders.h).
 *
 * open() lists the tree (names only, nothing decoded); read_image() opens
 * the file, preads it whole into a per-call buffer and decodes it with
 * img_decode.  Nothing is shared but the read-only index: thread-safe.
 */
#include "loaders.h"
#include "../common/open_file.h" /* common_open_file */
#include "image.h"

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <inttypes.h> /* PRId64 */
#include <limits.h>   /* PATH_MAX */
#include <stdio.h>    /* snprintf */
#include <stdlib.h>   /* malloc, realloc, free, qsort */
#include <string.h>   /* strcmp, strerror, strlen, memcpy */
#include <strings.h>  /* strcasecmp */
#include <sys/stat.h> /* stat, fstat */
#include <unistd.h>   /* close */

#define FOLDER_WHO "folder"
#define FOLDER_MAX_DEPTH 64                 /* directory levels below a class */

struct folder_sample {
	uint64_t name; /* offset of the path relative to the root in `names` */
	int32_t label;
	int32_t reserved;
};

struct folder_ctx {
	struct loaders_source src; /* first: host, who, n, classes */
	char root[PATH_MAX];
	char *names;                /* NUL-terminated relative paths */
	size_t names_len, names_cap;
	struct folder_sample *s;    /* [n] */
	int64_t cap;
	int64_t skipped;            /* files with other image extensions */
};

/* ---- listing ---------------------------------------------------------- */

/* The entries of directory root/rel: subdirectories into dirs (as rel/name;
 * may be NULL), the rest into files (bare names; may be NULL).  stat()
 * follows links, as os.walk(followlinks=True) does; an entry stat cannot
 * reach (a dangling link) counts as a file, as in os.walk. */
static kiln_status folder_scandir(struct folder_ctx *c, const char *rel,
				  struct loaders_names *dirs, struct loaders_names *files)
{
	const struct kiln_host *host = c->src.host;
	char dir[PATH_MAX], p[PATH_MAX];
	if (*rel ? loaders_join(dir, sizeof dir, c->root, rel) :
		   snprintf(dir, sizeof dir, "%s", c->root) >= (int)sizeof dir)
		return host->error(KILN_EIO, "%s/%s: path too long", c->root, rel);
	DIR *d = opendir(dir);
	if (!d)
		return host->error(KILN_EIO, "%s: cannot list the directory: %s", dir,
				   strerror(errno));
	struct dirent *de;
	kiln_status st = KILN_OK;
	errno = 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (loaders_join(p, sizeof p, dir, de->d_name)) {
			st = host->error(KILN_EIO, "%s/%s: path too long", dir, de->d_name);
			break;
		}
		/* d_type saves a stat per file; links and unknown types need one */
		int isdir;
		if (de->d_type == DT_DIR || de->d_type == DT_REG) {
			isdir = de->d_type == DT_DIR;
		} else {
			struct stat sb;
			isdir = stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
		}
		int bad;
		if (isdir && dirs) {
			char r[PATH_MAX];
			if (*rel ? loaders_join(r, sizeof r, rel, de->d_name) :
				   snprintf(r, sizeof r, "%s", de->d_name) >= (int)sizeof r) {
				st = host->error(KILN_EIO, "%s: path too long", p);
				break;
			}
			bad = loaders_names_add(dirs, NULL, r);
		} else if (!isdir && files) {
			bad = loaders_names_add(files, NULL, de->d_name);
		} else {
			bad = 0;
		}
		if (bad) {
			st = host->error(KILN_ENOMEM, "%s: out of memory listing the directory", dir);
			break;
		}
		errno = 0;
	}
	if (!st && errno)
		st = host->error(KILN_EIO, "%s: cannot list the directory: %s", dir, strerror(errno));
	closedir(d);
	return st;
}

/* Every directory below root/rel (rel included) into out, recursively.
 * `anc` holds the (dev, ino) of the directories above, so a link back up
 * the tree is not followed forever (os.walk would loop). */
static kiln_status folder_walk(struct folder_ctx *c, const char *rel, struct stat *anc,
			       int depth, struct loaders_names *out)
{
	char dir[PATH_MAX];
	struct stat sb;
	if (loaders_join(dir, sizeof dir, c->root, rel))
		return c->src.host->error(KILN_EIO, "%s/%s: path too long", c->root, rel);
	if (stat(dir, &sb) != 0)
		return c->src.host->error(KILN_EIO, "%s: cannot open the directory: %s", dir,
				      strerror(errno));
	for (int i = 0; i < depth; i++)
		if (anc[i].st_dev == sb.st_dev && anc[i].st_ino == sb.st_ino) {
			c->src.host->log(KILN_LOG_WARN, FOLDER_WHO, "%s: a link back to a directory above it; not followed", dir);
			return KILN_OK;
		}
	if (depth >= FOLDER_MAX_DEPTH)
		return c->src.host->error(KILN_EDATA, "%s: more than %d directory levels below the class directory",
				      dir, FOLDER_MAX_DEPTH);
	anc[depth] = sb;
	if (loaders_names_add(out, NULL, rel))
		return c->src.host->error(KILN_ENOMEM, "out of memory listing %s", dir);
	struct loaders_names sub = { 0 };
	kiln_status st = folder_scandir(c, rel, &sub, NULL);
	if (!st) {
		loaders_names_sort(&sub, 0);
		for (size_t i = 0; i < sub.n && !st; i++)
			st = folder_walk(c, sub.v[i], anc, depth + 1, out);
	}
	loaders_names_free(&sub);
	return st;
}

static kiln_status folder_add(struct folder_ctx *c, const char *rel, const char *name,
			      int32_t label)
{
	size_t rl = strlen(rel), nl = strlen(name), need = rl + 1 + nl + 1;
	if (rl + 1 + nl + 1 + strlen(c->root) >= PATH_MAX)
		return c->src.host->error(KILN_EIO, "%s/%s/%s: path too long", c->root, rel, name);
	if (c->names_len + need > c->names_cap) {
		size_t nc = c->names_cap ? c->names_cap * 2 : 1 << 16;
		while (nc < c->names_len + need)
			nc *= 2;
		char *nn = realloc(c->names, nc);
		if (!nn)
			return c->src.host->error(KILN_ENOMEM, "out of memory listing %s", c->root);
		c->names = nn;
		c->names_cap = nc;
	}
	if (c->src.n == c->cap) {
		int64_t nc = c->cap ? c->cap * 2 : 1024;
		struct folder_sample *ns = realloc(c->s, (size_t)nc * sizeof *ns);
		if (!ns)
			return c->src.host->error(KILN_ENOMEM, "out of memory listing %s", c->root);
		c->s = ns;
		c->cap = nc;
	}
	c->s[c->src.n].name = c->names_len;
	c->s[c->src.n].label = label;
	c->s[c->src.n].reserved = 0;
	c->src.n++;
	memcpy(c->names + c->names_len, rel, rl);
	c->names[c->names_len + rl] = '/';
	memcpy(c->names + c->names_len + rl + 1, name, nl + 1);
	c->names_len += need;
	return KILN_OK;
}

/* Is `name` an image format torchvision reads that we do not? */
static int folder_other_image(const char *name)
{
	static const char *const ext[] = { ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp" };
	const char *dot = strrchr(name, '.');
	if (!dot)
		return 0;
	for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
		if (!strcasecmp(dot, ext[i]))
			return 1;
	return 0;
}

/* All samples of class `cls` (label `label`), in make_dataset's order. */
static kiln_status folder_scan_class(struct folder_ctx *c, const char *cls, int32_t label)
{
	struct loaders_names dirs = { 0 }, files = { 0 };
	struct stat anc[FOLDER_MAX_DEPTH];
	kiln_status st = folder_walk(c, cls, anc, 0, &dirs);
	if (st)
		goto out;
	loaders_names_sort(&dirs, 0);
	for (size_t d = 0; d < dirs.n && !st; d++) {
		loaders_names_free(&files);
		if ((st = folder_scandir(c, dirs.v[d], NULL, &files)))
			break;
		loaders_names_sort(&files, 0);
		for (size_t f = 0; f < files.n && !st; f++) {
			if (img_format_of_name(files.v[f]) != IMG_UNKNOWN)
				st = folder_add(c, dirs.v[d], files.v[f], label);
			else if (folder_other_image(files.v[f]))
				c->skipped++;
		}
	}
out:
	loaders_names_free(&dirs);
	loaders_names_free(&files);
	return st;
}

/* The class folders of `root`, sorted (the classes and their order). */
static kiln_status folder_list_classes(const struct kiln_host *host, const char *root,
				       struct loaders_names *out)
{
	struct folder_ctx t = { .src.host = host };
	if (snprintf(t.root, sizeof t.root, "%s", root) >= (int)sizeof t.root)
		return host->error(KILN_EIO, "%s: path too long", root);
	kiln_status st = folder_scandir(&t, "", out, NULL);
	if (!st)
		loaders_names_sort(out, 0);
	return st;
}

/* Whether class folder `name` of [data]'s root is a split folder, not a
 * class: the one holding the evaluation root (nest[0..nl)), test/, val/,
 * or the split [data.eval] or [data.val] names. */
static int folder_is_split(const struct kiln_host *host, const struct kiln_config *cfg,
			   const char *name, const char *nest, size_t nl)
{
	const char *e = host->config_get(cfg, "data.eval", "split"),
		   *v = host->config_get(cfg, "data.val", "split");
	return (strlen(name) == nl && !strncmp(name, nest, nl)) || !strcmp(name, "test") ||
	       !strcmp(name, "val") || (e && !strcmp(name, e)) || (v && !strcmp(name, v));
}

/* An evaluation split ([data.eval], [data.val]) labels its samples by its
 * own sorted class folders, and the model learnt [data]'s: when [data] is
 * a folder too, the two lists must be the same, else a label means
 * another class in each (test/{a,c} gives c label 1, b's in train/{a,b,c})
 * and the accuracy is silently wrong.  When [data]'s root holds ours (no
 * path/train: [data] is path itself), the folder holding ours is one of
 * [data]'s classes (torchvision lists every subdirectory), so [data]'s
 * list must be ours and then that folder, sorting last: D/{a,test,zebra}
 * against D/test/{a,zebra} gives zebra 2 in training and 1 here (before
 * session 32 a nested root was not compared at all).  Not compared: a
 * [data] that cannot be resolved, or whose root holds split folders
 * alone (`kiln eval` with only the test data present). */
/* folder_check_classes's three paths, on the heap: 12 KiB and more of a
 * loader or an application thread's stack (the frame cap,
 * docs/design-notes.md) */
struct folder_roots {
	char troot[PATH_MAX], rt[PATH_MAX], rr[PATH_MAX];
};

static kiln_status folder_check_roots(const struct kiln_host *host,
				      const struct kiln_config *cfg, const char *section,
				      const char *root, const struct loaders_names *classes,
				      struct folder_roots *p)
{
	const char *path = host->config_get(cfg, "data", "path");
	const char *ksplit = host->config_get(cfg, "data", "split");
	char *const troot = p->troot, *const rt = p->rt, *const rr = p->rr;
	int is_dir;
	if (loaders_split_root(host, cfg, "data", FOLDER_WHO, path, ksplit ? ksplit : "train",
			       ksplit != NULL, troot, sizeof p->troot, &is_dir) || !is_dir)
		return KILN_OK; /* (the message set is not returned) */
	/* compared resolved: "D/" and "./D" are D (as written, D/ against
	 * D/test was taken for two roots and refused) */
	const char *t = realpath(troot, rt) ? rt : troot, *r = realpath(root, rr) ? rr : root;
	const size_t tl = strlen(t);
	if (!strcmp(t, r))
		return KILN_OK;
	const char *nest = NULL; /* the class folder of [data] that holds ours */
	size_t nl = 0;
	if (!strncmp(r, t, tl) && (r[tl] == '/' || (tl && t[tl - 1] == '/'))) {
		nest = r + tl + (r[tl] == '/');
		nl = strcspn(nest, "/");
	}
	struct loaders_names train = { 0 };
	if (folder_list_classes(host, troot, &train)) {
		loaders_names_free(&train);
		return KILN_OK;
	}
	size_t k = 0, splits = 0;
	for (size_t j = 0; nest && j < train.n; j++)
		splits += (size_t)folder_is_split(host, cfg, train.v[j], nest, nl);
	if (nest && splits == train.n) {
		loaders_names_free(&train);
		return KILN_OK;
	}
	/* ours, then (nested) the folder holding ours: [data]'s labels */
	const size_t want = classes->n + (nest != NULL);
	while (k < train.n && k < want &&
	       (k < classes->n ? !strcmp(train.v[k], classes->v[k])
			       : strlen(train.v[k]) == nl && !strncmp(train.v[k], nest, nl)))
		k++;
	kiln_status st = KILN_OK;
	if (k < train.n || k < want)
		st = host->error(KILN_EDATA, "[%s] %s has %zu class folders and [data] %s has %zu, and class %zu is '%s' in [%s] but '%s' in [data]: a label would name another class in each; make the class folders the same (an empty folder keeps its label)%s%.*s%s",
				 section, root, classes->n, troot, train.n, k,
				 k < classes->n ? classes->v[k] : "(none)", section,
				 k < train.n ? train.v[k] : "(none)",
				 nest ? "; [data] holds it in its class folder '" : "", (int)nl,
				 nest ? nest : "",
				 nest ? "', which must sort after the others, or put [data]'s classes in its train/" : "");
	loaders_names_free(&train);
	return st;
}

static kiln_status folder_check_classes(const struct kiln_host *host,
					const struct kiln_config *cfg, const char *section,
					const char *root, const struct loaders_names *classes)
{
	const char *src = host->config_get(cfg, "data", "source");
	const char *path = host->config_get(cfg, "data", "path");
	if (!src || strcmp(src, "folder") || !path || !*path)
		return KILN_OK;
	struct folder_roots *p = malloc(sizeof *p);
	if (!p)
		return host->error(KILN_ENOMEM, "[%s] %s: out of memory", section, root);
	const kiln_status st = folder_check_roots(host, cfg, section, root, classes, p);
	free(p);
	return st;
}

/* ---- config ----------------------------------------------------------- */

static const struct kiln_key folder_keys[] = {
	{ "path", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Root directory (required) of one subdirectory per class, torchvision ImageFolder style: classes are the subdirectory names sorted, a label is its class's position, samples are listed in torchvision's order. Files: .jpg, .jpeg and .png (any case) anywhere below a class directory. When `path/split` exists it is used instead (path = /x: [data] reads /x/train, [data.eval] /x/test); [data.eval] inheriting path without such a subdirectory is an error. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ "split", KILN_KEY_STR, NULL, 0, 0, NULL,
	  "Subdirectory of `path` to read (e.g. val); it must exist. Unset: the split the run asks for (train for [data], test for [data.eval]) when that subdirectory exists, else `path` itself. A name that is not there is a config error (exit 2) naming this key and where it was set (exit 3 before session 37)." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

/* ---- the source ------------------------------------------------------- */

static void folder_close(void *vctx)
{
	struct folder_ctx *c = vctx;
	if (!c)
		return;
	free(c->names);
	free(c->s);
	free(c);
}

/* The root of [section] into c->root and its class folders, sorted, into
 * classes, checked (a directory, not a partial pack, classes there and,
 * for an evaluation split, [data]'s): what folder_open does before it
 * lists the images, and all that folder_peek does. */
static kiln_status folder_root(struct folder_ctx *c, const struct kiln_config *cfg,
			       const char *section, const char *split,
			       struct loaders_names *classes)
{
	const struct kiln_host *host = c->src.host;
	const char *path = host->config_get(cfg, section, "path");
	const char *ksplit = host->config_get(cfg, section, "split");
	int is_dir;
	kiln_status st;
	if ((st = loaders_max_pixels_key(host, cfg, section, &c->src)) ||
	    (st = loaders_split_root(host, cfg, section, FOLDER_WHO, path, ksplit ? ksplit : split,
				     ksplit != NULL, c->root, sizeof c->root, &is_dir)))
		return st;
	if (!is_dir)
		return host->error(KILN_EIO, "%s: not a directory (source folder reads a directory of class subdirectories)",
				   c->root);
	if ((st = loaders_root_not_partial(host, c->root, FOLDER_PARTIAL)) ||
	    (st = folder_scandir(c, "", classes, NULL)))
		return st;
	if (classes->n == 0)
		return host->error(KILN_EDATA, "%s: no class subdirectories (source folder expects <path>/<class>/<image>.jpg)",
				   c->root);
	if (classes->n > INT32_MAX)
		return host->error(KILN_EDATA, "%s: %zu class subdirectories", c->root, classes->n);
	loaders_names_sort(classes, 0);
	if (strcmp(section, "data"))
		return folder_check_classes(host, cfg, section, c->root, classes);
	return KILN_OK;
}

static kiln_status folder_open(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *split, void **out)
{
	kiln_status st;
	struct loaders_names classes = { 0 };
	*out = NULL;
	struct folder_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	if ((st = folder_root(c, cfg, section, split, &classes)))
		goto fail;
	c->src.classes = (int64_t)classes.n;
	int64_t empty = 0;
	for (size_t k = 0; k < classes.n; k++) {
		int64_t before = c->src.n;
		if ((st = folder_scan_class(c, classes.v[k], (int32_t)k)))
			goto fail;
		if (c->src.n == before) {
			if (!empty++)
				host->log(KILN_LOG_WARN, FOLDER_WHO, "%s/%s: class %zu has no .jpg/.jpeg/.png files",
					  c->root, classes.v[k], k);
		}
	}
	if (c->src.n == 0) {
		st = host->error(KILN_EDATA, "%s: no .jpg/.jpeg/.png files in its %zu class subdirectories",
				 c->root, classes.n);
		goto fail;
	}
	loaders_names_free(&classes);
	if (empty > 1)
		host->log(KILN_LOG_WARN, FOLDER_WHO, "%s: %" PRId64 " classes have no images", c->root,
			  empty);
	if (c->skipped)
		host->log(KILN_LOG_WARN, FOLDER_WHO, "%s: %" PRId64 " .bmp/.ppm/.pgm/.tif/.webp files skipped (only JPEG and PNG are read)",
			  c->root, c->skipped);
	host->log(KILN_LOG_INFO, FOLDER_WHO, "[%s] %s: %" PRId64 " images, %" PRId64 " classes",
		  section, c->root, c->src.n, c->src.classes);
	c->src.who = c->root;
	*out = c;
	return KILN_OK;

fail:
	loaders_names_free(&classes);
	folder_close(c);
	return st;
}

/* What loaders_varying_info says after folder_open (version 5): the
 * images vary, so nothing below the class folders is read (folder_open
 * lists every file: 1.28 million names for ImageNet's training set); the
 * root and its class folders are checked as folder_open checks them. */
static kiln_status folder_peek(const struct kiln_host *host, const struct kiln_config *cfg,
			       const char *section, const char *split, struct kiln_source_info *info)
{
	struct loaders_names classes = { 0 };
	struct folder_ctx *c = calloc(1, sizeof *c);
	if (!c)
		return host->error(KILN_ENOMEM, "out of memory");
	c->src.host = host;
	kiln_status st = folder_root(c, cfg, section, split, &classes);
	if (!st)
		loaders_varying_info(c, info);
	loaders_names_free(&classes);
	folder_close(c);
	return st;
}

/* image: u8 [h, w, c] as decoded; label: i32 []. */
static kiln_status folder_read_image(void *vctx, int64_t index, struct kiln_image *img,
				     void *label)
{
	const struct folder_ctx *c = vctx;
	const struct kiln_host *host = c->src.host;
	char p[PATH_MAX];
	kiln_status st = loaders_check_index(&c->src, index);
	if (st)
		return st;
	const struct folder_sample *s = &c->s[index];
	if (loaders_join(p, sizeof p, c->root, c->names + s->name))
		return host->error(KILN_EIO, "%s/%s: path too long", c->root, c->names + s->name);
	char kind[64];
	const char *why;
	off_t size;
	int fd = common_open_file(p, kind, sizeof kind, &why, &size);
	/* why == kind: not a regular file (a FIFO named x.png), bad data as in
	 * kiln predict, so on_error = skip applies (it was KILN_EIO, exit 1) */
	if (fd < 0)
		return host->error(why == kind ? KILN_EDATA : KILN_EIO, "%s: cannot open the image: %s",
				   p, why);
	if (size == 0)
		st = host->error(KILN_EDATA, "%s: empty file (0 bytes): not a JPEG or PNG image", p);
	else if ((uint64_t)size > IMG_MAX_FILE)
		st = host->error(KILN_EDATA, "%s: %lld bytes is larger than any image this source reads (%llu)",
				 p, (long long)size, (unsigned long long)IMG_MAX_FILE);
	else
		st = loaders_read_image(&c->src, fd, 0, (size_t)size, p, img);
	if (!st && label)
		*(int32_t *)label = s->label;
	close(fd);
	return st;
}

/* The image files read (version 4): an output never replaces one. */
static void folder_files(void *ctx, void (*each)(void *arg, const char *path), void *arg)
{
	const struct folder_ctx *c = ctx;
	char path[PATH_MAX];
	for (int64_t i = 0; i < c->src.n; i++)
		if (!loaders_join(path, sizeof path, c->root, c->names + c->s[i].name))
			each(arg, path);
}

LOADERS_SOURCE_PEEK(folder, "folder",
		    "torchvision ImageFolder: a directory of class subdirectories of JPEG and PNG files",
		    folder_keys, folder_open, folder_close, loaders_varying_info, NULL,
		    folder_read_image, NULL, folder_files, folder_peek);
