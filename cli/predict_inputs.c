/* cli/predict_inputs.c - what `kiln predict` reads: the image files its
 * INPUT arguments name (a file, or every .jpg/.jpeg/.png below a folder,
 * sorted), each decoded by the loaders' codec (plugins/loaders/image.c,
 * the pixels `source = folder` decodes) and transformed by
 * kiln_infer_image as [data.eval] says; and the class names of a folder
 * source (its class directories). */
#include "build-config.h"
#include "predict.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h> /* close */

#ifdef KILN_WITH_PACK
#include "image.h" /* plugins/loaders: img_decode, img_format_of_name, IMG_MAX_FILE */
#include "../plugins/common/open_file.h" /* common_open_file: no FIFO blocks */
#endif

static int names_add(struct pred_names *l, const char *s)
{
	if (l->n == l->cap) {
		size_t nc = l->cap ? 2 * l->cap : 64;
		char **v = realloc(l->v, nc * sizeof *v);
		if (!v)
			return -1;
		l->v = v;
		l->cap = nc;
	}
	if (!(l->v[l->n] = strdup(s)))
		return -1;
	l->n++;
	return 0;
}

void pred_names_free(struct pred_names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof *l);
}

static int by_strcmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of dir (no . and ..), sorted by strcmp. */
static kiln_status list_dir(const char *dir, struct pred_names *out)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	if (!d)
		return kiln_error(KILN_EIO, "%s: cannot list the directory: %s", dir, strerror(errno));
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && names_add(out, de->d_name)) {
			closedir(d);
			return kiln_error(KILN_ENOMEM, "out of memory listing %s", dir);
		}
	closedir(d);
	if (out->n > 1) /* (qsort of a NULL array is undefined, even of 0 elements) */
		qsort(out->v, out->n, sizeof *out->v, by_strcmp);
	return KILN_OK;
}

static int is_dir(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

#define PRED_MAX_DEPTH 64 /* directory levels below an INPUT folder */

/* Every image file below dir, recursively, in sorted order.  anc[0..depth)
 * are the directories above it: a link back to one of them (a loop) is
 * not followed, with a warning, as the folder source has it. */
static kiln_status walk(const char *dir, struct stat *anc, int depth, struct pred_names *files)
{
	struct pred_names ents = { 0 };
	struct stat sb;
	char p[4200];
	if (stat(dir, &sb) != 0)
		return kiln_error(KILN_EIO, "%s: cannot list the directory: %s", dir, strerror(errno));
	for (int i = 0; i < depth; i++)
		if (anc[i].st_dev == sb.st_dev && anc[i].st_ino == sb.st_ino) {
			kiln_log(KILN_LOG_WARN, "predict", "%s: a link back to a directory above it; not followed",
				 dir);
			return KILN_OK;
		}
	if (depth > PRED_MAX_DEPTH)
		return kiln_error(KILN_EDATA, "%s: more than %d directory levels", dir, PRED_MAX_DEPTH);
	anc[depth] = sb;
	kiln_status st = list_dir(dir, &ents);
	/* "photos/" as given: one slash before the name, not two */
	const size_t dl = strlen(dir);
	const char *sep = dl && dir[dl - 1] == '/' ? "" : "/";
	for (size_t i = 0; i < ents.n && !st; i++) {
		if (snprintf(p, sizeof p, "%s%s%s", dir, sep, ents.v[i]) >= (int)sizeof p)
			st = kiln_error(KILN_EIO, "%s/%s: path too long", dir, ents.v[i]);
		else if (is_dir(p))
			st = walk(p, anc, depth + 1, files);
#ifdef KILN_WITH_PACK
		else if (img_format_of_name(p) != IMG_UNKNOWN && names_add(files, p))
			st = kiln_error(KILN_ENOMEM, "out of memory");
#endif
	}
	pred_names_free(&ents);
	return st;
}

kiln_status pred_list_inputs(char **inputs, int n, struct pred_names *files)
{
	kiln_status st = KILN_OK;
	for (int i = 0; i < n && !st; i++) {
		struct stat sb, anc[PRED_MAX_DEPTH + 1];
		size_t before = files->n;
		if (stat(inputs[i], &sb) != 0)
			st = kiln_error(KILN_EUSAGE, "%s: no such file or folder%s", inputs[i],
					strchr(inputs[i], '=') ? " (taken for a file name: an override is section.key=value)" : "");
		else if (S_ISDIR(sb.st_mode) && !(st = walk(inputs[i], anc, 0, files)) && files->n == before)
			st = kiln_error(KILN_EUSAGE, "%s: no .jpg/.jpeg/.png files in the folder", inputs[i]);
		else if (!S_ISDIR(sb.st_mode) && names_add(files, inputs[i]))
			st = kiln_error(KILN_ENOMEM, "out of memory");
	}
	return st;
}

kiln_status pred_class_names(const struct kiln_config *cfg, struct pred_names *names)
{
	/* The classes the model learnt: the training split's ([data]), not
	 * [data.eval]'s, whose folders may differ (the folder source refuses
	 * an evaluation split whose classes differ, but predict reads none). */
	const char *src = kiln_config_get(cfg, "data", "source");
	const char *path = kiln_config_get(cfg, "data", "path");
	const char *split = kiln_config_get(cfg, "data", "split");
	char root[4200];
	if (!src || strcmp(src, "folder") || !path)
		return KILN_OK; /* indices */
	/* the folder source's split rule (plugins/loaders/folder.c) */
	snprintf(root, sizeof root, "%s/%s", path, split ? split : "train");
	if (!split && !is_dir(root))
		snprintf(root, sizeof root, "%s", path);
	/* the training set moved away after training (the model needs none of
	 * it: its checkpoint records the input shape): the indices, said once;
	 * before session 38 "cannot list the directory", exit 1 */
	struct stat sb;
	if (stat(root, &sb) && (errno == ENOENT || errno == ENOTDIR)) {
		kiln_log(KILN_LOG_WARN, "predict", "%s: no such directory ([data] path): the training split's class names are not known; the classes are their indices",
			 root);
		return KILN_OK;
	}
	struct pred_names ents = { 0 };
	char p[8400];
	kiln_status st = list_dir(root, &ents);
	for (size_t i = 0; i < ents.n && !st; i++) {
		snprintf(p, sizeof p, "%s/%s", root, ents.v[i]);
		if (is_dir(p) && names_add(names, ents.v[i]))
			st = kiln_error(KILN_ENOMEM, "out of memory");
	}
	pred_names_free(&ents);
	return st;
}

#ifdef KILN_WITH_PACK
/* The whole of image file `path`, malloc()ed.  What is not a regular file
 * (a FIFO, a device) is refused before open() can block, an empty or
 * larger than IMG_MAX_FILE one before it is read. */
static kiln_status read_file(const char *path, uint8_t **buf, size_t *n)
{
	char kind[64];
	const char *why;
	off_t size;
	int fd = common_open_file(path, kind, sizeof kind, &why, &size);
	if (fd < 0) /* why == kind: not a regular file, bad data */
		return kiln_error(why == kind ? KILN_EDATA : KILN_EIO, "%s: cannot open the image: %s", path, why);
	FILE *f = fdopen(fd, "rb");
	kiln_status st = KILN_OK;
	if (!f) {
		st = kiln_error(KILN_EIO, "%s: cannot open the image: %s", path, strerror(errno));
		close(fd);
		return st;
	}
	if (size == 0)
		st = kiln_error(KILN_EDATA, "%s: empty file (0 bytes): not a JPEG or PNG image", path);
	else if ((uint64_t)size > IMG_MAX_FILE)
		st = kiln_error(KILN_EDATA, "%s: %lld bytes is larger than any image kiln reads (%llu)", path,
				(long long)size, (unsigned long long)IMG_MAX_FILE);
	else if (!(*buf = malloc((size_t)size)))
		st = kiln_error(KILN_ENOMEM, "%s: out of memory for %lld bytes", path, (long long)size);
	else if ((*n = fread(*buf, 1, (size_t)size, f)) != (size_t)size)
		st = kiln_error(KILN_EIO, "%s: cannot read the image: %zu of %lld bytes", path, *n,
				(long long)size);
	fclose(f);
	return st;
}

kiln_status pred_load_image(struct kiln_infer *m, const char *path, int64_t max_pixels,
			    struct kiln_image *img, void *x)
{
	uint8_t *buf = NULL;
	size_t n = 0;
	kiln_status st = read_file(path, &buf, &n);
	if (!st)
		st = img_decode(kiln_host_table(), buf, n, path, max_pixels > 0 ? max_pixels : IMG_MAX_PIXELS,
				img);
	if (!st)
		st = kiln_infer_image(m, img, path, x);
	/* a channel count refused: the decoded one, said with the file's
	 * (an RGBA PNG is decoded to 3 channels, which alone misleads) */
	int64_t dims[KILN_MAX_DIMS];
	const char *note = st == KILN_EDATA ? img_channels_note(buf, n) : NULL;
	if (note && kiln_infer_input_shape(m, dims, NULL) == 3 && dims[0] != img->c) {
		char msg[1024];
		snprintf(msg, sizeof msg, "%s", kiln_last_error());
		st = kiln_error(st, "%s; %s", msg, note);
	}
	free(buf);
	return st;
}
#else
kiln_status pred_load_image(struct kiln_infer *m, const char *path, int64_t max_pixels,
			    struct kiln_image *img, void *x)
{
	(void)m, (void)max_pixels, (void)img, (void)x;
	return kiln_error(KILN_ENOTSUP, "%s: this kiln was built without the loaders' image codec (libturbojpeg, libpng)",
			  path);
}
#endif

/* One decoding thread's share of pred_load_images: rows first, first +
 * stride, ... until its first failure. */
struct load_share {
	struct kiln_infer *m;
	const char *const *paths;
	int64_t rows, max_pixels, first, stride;
	char *x;
	kiln_status st;
	int64_t bad;       /* the failing row */
	char msg[KILN_ERROR_MAX]; /* its message (errors are per thread) */
};

static void *load_share_run(void *arg)
{
	struct load_share *j = arg;
	struct kiln_image img = { 0 };
	const size_t in = kiln_infer_input_bytes(j->m);
	for (int64_t i = j->first; i < j->rows && !j->st; i += j->stride)
		if ((j->st = pred_load_image(j->m, j->paths[i], j->max_pixels, &img,
					     j->x + (size_t)i * in))) {
			j->bad = i;
			snprintf(j->msg, sizeof j->msg, "%s", kiln_last_error());
		}
	free(img.data);
	return NULL;
}

kiln_status pred_load_images(struct kiln_infer *m, const char *const *paths, int64_t rows,
			     int64_t max_pixels, int threads, char *x)
{
	const int T = threads < 1 ? 1 : rows < threads ? (int)rows : threads;
	struct load_share *j = calloc((size_t)(T ? T : 1), sizeof *j);
	pthread_t *tid = calloc((size_t)(T ? T : 1), sizeof *tid);
	int started = 1;
	kiln_status st = KILN_OK;
	if (!j || !tid) {
		free(j);
		free(tid);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	for (int t = 0; t < T; t++)
		j[t] = (struct load_share){ .m = m, .paths = paths, .rows = rows, .max_pixels = max_pixels,
					    .first = t, .stride = T, .x = x };
	while (started < T && !pthread_create(&tid[started], NULL, load_share_run, &j[started]))
		started++;
	if (started < T) /* no more threads: this one takes the rest */
		for (int t = started; t < T; t++)
			load_share_run(&j[t]);
	if (T)
		load_share_run(&j[0]);
	for (int t = 1; t < started; t++)
		pthread_join(tid[t], NULL);
	int first = -1;
	for (int t = 0; t < T; t++)
		if (j[t].st && (first < 0 || j[t].bad < j[first].bad))
			first = t;
	if (first >= 0)
		st = kiln_error(j[first].st, "%s", j[first].msg);
	free(j);
	free(tid);
	return st;
}
