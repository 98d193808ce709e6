/* cli/pack_folder.c - kiln pack --format folder: the images of an
 * ImageFolder tree DIR/<split>/<class>/<index>.png|jpg, written between
 * creating DIR/<split>.folder-partial and removing it (FOLDER_PARTIAL);
 * with --force, the images an earlier pack wrote there removed first.
 * Samples are read and encoded in cli/cmd_pack.c.
 */
#include "build-config.h"
#include "pack.h"
#include "loaders.h" /* plugins/loaders: FOLDER_PARTIAL */

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h> /* mkdir */
#include <unistd.h>   /* rmdir, syncfs, close */


/* DIR/<split>/<class> into path: class directories named by the label,
 * zero-padded so that their sorted order is the label order (what the
 * folder source and torchvision's ImageFolder number classes by). */
static void folder_class_path(char *path, size_t size, const struct pack_opts *o,
			      int64_t classes, int64_t label)
{
	int digits = 1; /* of classes - 1, at most 7 (pack allows 10^6 classes) */
	for (int64_t c = classes - 1; c >= 10 && digits < 7; c /= 10)
		digits++;
	snprintf(path, size, "%s/%s/%0*d", o->out, o->split, digits, (int)label);
}

/* DIR/<split>/<class>/<index>.<ext>, its class directory made by
 * pack_folder_prepare; seen[label] set. */
kiln_status folder_add(const struct pack_opts *o, int64_t classes, int64_t index,
		       const struct item *it, uint8_t *seen)
{
	char path[4200];
	if (it->label < 0 || it->label >= classes)
		return kiln_error(KILN_EDATA, "sample %lld: label %d outside [0, %lld)",
				  (long long)index, it->label, (long long)classes);
	folder_class_path(path, sizeof path, o, classes, it->label);
	seen[it->label] = 1;
	size_t n = strlen(path);
	snprintf(path + n, sizeof path - n, "/%08lld.%s", (long long)index,
		 o->store == REC_JPEG ? "jpg" : "png");
	FILE *f = fopen(path, "wb");
	if (!f)
		return kiln_error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
	int bad = fwrite(it->payload, 1, it->n, f) != it->n;
	bad |= fclose(f) != 0;
	if (bad)
		return kiln_error(KILN_EIO, "%s: cannot write: %s", path, strerror(errno));
	return KILN_OK;
}

/* Is name digits, then `ext` ("" for none)?  The names folder_add gives
 * class directories and images. */
static int kiln_named(const char *name, const char *ext)
{
	size_t n = strspn(name, "0123456789");
	return n > 0 && !strcmp(name + n, ext);
}

/* --force: remove what an earlier pack wrote into split directory dir,
 * the images <digits>/<digits>.png|jpg and the class directories they
 * leave empty; every other file stays, counted into *kept. */
static int folder_remove_old(const char *dir, int *kept)
{
	DIR *d = opendir(dir), *c;
	struct dirent *e, *f;
	char sub[4500], file[4800];
	int removed = 0;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
		if (!kiln_named(e->d_name, "") || !(c = opendir(sub))) {
			++*kept;
			continue;
		}
		while ((f = readdir(c))) {
			if (f->d_name[0] == '.')
				continue;
			snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
			if ((kiln_named(f->d_name, ".png") || kiln_named(f->d_name, ".jpg")) && !unlink(file))
				removed++;
			else
				++*kept;
		}
		closedir(c);
		rmdir(sub); /* fails, keeping it, when a file stays */
	}
	if (d)
		closedir(d);
	return removed;
}

/* Check DIR/<split> is empty or --force given, create the marker
 * DIR/<split>.folder-partial, remove an earlier pack's images (--force) and
 * create DIR/<split> and every class directory, 0 .. classes - 1: a class
 * with no sample keeps its directory, empty, so that a reader numbering the
 * sorted directories gives every later class its label (before session 41
 * a directory was made with its class's first image: an empty middle class
 * shifted the later ones down by one).  pack_folder_done removes the
 * marker. */
kiln_status pack_folder_prepare(const struct pack_opts *o, int64_t classes)
{
	char path[4200];
	int used = 0;
	snprintf(path, sizeof path, "%s/%s", o->out, o->split);
	DIR *d = opendir(path);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d)))
			used |= e->d_name[0] != '.';
		closedir(d);
		if (used && !o->force)
			return kiln_error(KILN_EUSAGE, "%s is not empty: pass --force to replace an earlier pack's images there, or choose another --out or --split",
					  path);
	}
	/* From here until the last image is written the tree is not a whole
	 * pack (the earlier one's images going, this one's coming): the folder
	 * source refuses it while the marker exists, rather than train on the
	 * classes written so far relabelled 0, 1, ... */
	kiln_status st = pack_mark_partial(o->out, o->split, FOLDER_PARTIAL);
	if (st)
		return st;
	if (used) {
		int kept = 0, removed = folder_remove_old(path, &kept);
		if (removed)
			fprintf(stderr, "kiln pack: --force: removed %d image(s) of an earlier pack from %s\n",
				removed, path);
		if (kept)
			fprintf(stderr, "kiln pack: warning: %s keeps %d file(s) or directories kiln pack did not write (a reader of the folder may take them)\n",
				path, kept);
	}
	if (mkdir(path, 0777) && errno != EEXIST)
		return kiln_error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
	for (int64_t k = 0; k < classes; k++) {
		folder_class_path(path, sizeof path, o, classes, k);
		if (mkdir(path, 0777) && errno != EEXIST)
			return kiln_error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
	}
	return KILN_OK;
}

/* A warning naming the classes no sample had (seen[k] == 0): their
 * directories are empty, which torchvision's ImageFolder refuses unless
 * given allow_empty=True (the folder source reads them, with a warning). */
static void folder_warn_empty(const struct pack_opts *o, int64_t classes, const uint8_t *seen)
{
	char list[200] = "";
	int64_t empty = 0, named = 0;
	for (int64_t k = 0; k < classes; k++) {
		if (seen[k])
			continue;
		size_t at = strlen(list);
		if (named < 10 && at + 24 < sizeof list) {
			snprintf(list + at, sizeof list - at, "%s%lld", at ? ", " : "", (long long)k);
			named++;
		}
		empty++;
	}
	if (!empty)
		return;
	fprintf(stderr, "kiln pack: warning: %lld of %lld classes have no images (label %s%s): their directories in %s/%s are empty, so that every class keeps its label; torchvision's ImageFolder reads the tree with allow_empty=True only\n",
		(long long)empty, (long long)classes, list, empty > named ? ", ..." : "", o->out,
		o->split);
}

/* Every image is written: have them on disk (one syncfs for the whole
 * tree, where fsyncing each image and class directory would cost a sync
 * per file), then remove DIR/<split>.folder-partial, so that a power cut
 * cannot leave a marker-less tree missing images; warn of the classes
 * seen[] says had no sample. */
kiln_status pack_folder_done(const struct pack_opts *o, int64_t classes, const uint8_t *seen)
{
	folder_warn_empty(o, classes, seen);
	int fd = open(o->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || syncfs(fd)) {
		kiln_status st = kiln_error(KILN_EIO, "%s: cannot sync the images written: %s",
					    o->out, strerror(errno));
		if (fd >= 0)
			close(fd);
		return st;
	}
	close(fd);
	return pack_unmark_partial(o->out, o->split, FOLDER_PARTIAL);
}
