/* cli/pack_folder.c - kiln pack --format folder: the images of an
 * ImageFolder tree DIR/<split>/<class>/<index>.png|jpg, written between
 * creating DIR/<split>.folder-partial and removing it (FOLDER_PARTIAL);
 * with --force, the images an earlier pack wrote there removed first.  A
 * class's directory is made with its first image, those of the classes
 * no sample had after the last image.  Samples are read and encoded in
 * cli/cmd_pack.c.
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

/* Make directory path (there already: fine, an earlier pack's kept by
 * --force, or a file, which the image's fopen then names). */
static kiln_status folder_mkdir(const char *path)
{
	if (mkdir(path, 0777) && errno != EEXIST)
		return kiln_error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
	return KILN_OK;
}

/* DIR/<split>/<class>/<index>.<ext>; the class's directory made first
 * when seen[label] is 0 (its first image), and seen[label] set.  (Before
 * session 42 pack_folder_prepare made every class's directory before
 * the first image: 10^6 classes took about 150 s, with no progress.) */
kiln_status folder_add(const struct pack_opts *o, int64_t classes, int64_t index,
		       const struct item *it, uint8_t *seen)
{
	char path[4200];
	kiln_status st;
	if (it->label < 0 || it->label >= classes)
		return kiln_error(KILN_EDATA, "sample %lld: label %d outside [0, %lld)",
				  (long long)index, it->label, (long long)classes);
	folder_class_path(path, sizeof path, o, classes, it->label);
	if (!seen[it->label] && (st = folder_mkdir(path)))
		return st;
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
 * create DIR/<split>; the class directories come with their first images
 * (folder_add) and, for the classes with none, at the end
 * (pack_folder_done), which removes the marker. */
kiln_status pack_folder_prepare(const struct pack_opts *o)
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
	return folder_mkdir(path);
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

/* The directory of every class no sample had (seen[k] == 0), empty: a
 * reader numbering the sorted directories then gives every later class
 * its label (before session 41 none was made: an empty middle class
 * shifted the later ones down by one).  On a terminal, a line of
 * progress at the first and every half second after, as the images'
 * (cli/cmd_pack.c): 10^6 of them take minutes. */
static kiln_status folder_make_empty(const struct pack_opts *o, int64_t classes,
				     const uint8_t *seen, int tty)
{
	char path[4200];
	int64_t empty = 0, made = 0;
	kiln_status st = KILN_OK;
	for (int64_t k = 0; k < classes; k++)
		empty += !seen[k];
	double last_print = cli_now_s();
	for (int64_t k = 0; k < classes && !st; k++) {
		if (seen[k])
			continue;
		folder_class_path(path, sizeof path, o, classes, k);
		st = folder_mkdir(path);
		made++;
		const double t = cli_now_s();
		if (tty && (made == 1 || t - last_print > 0.5)) {
			fprintf(stderr, "\r\033[Kmade %lld/%lld directories of the classes with no images",
				(long long)made, (long long)empty);
			last_print = t;
		}
	}
	if (tty) /* (the images' line too: the warning starts its own) */
		fprintf(stderr, "\r\033[K");
	return st;
}

/* Every image is written: make the directories of the classes seen[]
 * says had no sample, and warn of them; have everything on disk (one
 * syncfs for the whole tree, where fsyncing each image and class
 * directory would cost a sync per file), then remove
 * DIR/<split>.folder-partial, so that a power cut cannot leave a
 * marker-less tree missing images. */
kiln_status pack_folder_done(const struct pack_opts *o, int64_t classes, const uint8_t *seen,
			     int tty)
{
	kiln_status st = folder_make_empty(o, classes, seen, tty);
	if (st)
		return st;
	folder_warn_empty(o, classes, seen);
	int fd = open(o->out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || syncfs(fd)) {
		st = kiln_error(KILN_EIO, "%s: cannot sync the images written: %s", o->out,
				strerror(errno));
		if (fd >= 0)
			close(fd);
		return st;
	}
	close(fd);
	return pack_unmark_partial(o->out, o->split, FOLDER_PARTIAL);
}
