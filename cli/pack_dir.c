/* cli/pack_dir.c - the steps kiln pack takes on its output directory for
 * every format (records, folder and tokens: cli/cmd_pack.c,
 * cli/pack_tokens.c): sync it, mark a split as being written, remove what
 * a killed pack left, compute the pack's id and hold the directory's lock
 * (cli.h documents each).
 */
#include "build-config.h"
#include "cli.h"

#include <dirent.h>   /* opendir, readdir */
#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <sys/file.h> /* flock */
#include <stdio.h>
#include <string.h>
#include <unistd.h>   /* fsync, unlink */


kiln_status pack_sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd)) {
		kiln_status st = kiln_error(KILN_EIO, "%s: cannot sync the directory: %s", dir,
					    strerror(errno));
		if (fd >= 0)
			close(fd);
		return st;
	}
	close(fd);
	return KILN_OK;
}

kiln_status pack_mark_partial(const char *dir, const char *split, const char *partial)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s%s", dir, split, partial);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot create: %s", path, strerror(errno));
	close(fd);
	return pack_sync_dir(dir);
}

kiln_status pack_unmark_partial(const char *dir, const char *split, const char *partial)
{
	char path[4200];
	kiln_status st = pack_sync_dir(dir); /* the shards' names first */
	snprintf(path, sizeof path, "%s/%s%s", dir, split, partial);
	if (!st && unlink(path))
		st = kiln_error(KILN_EIO, "%s: cannot remove: %s", path, strerror(errno));
	return st ? st : pack_sync_dir(dir);
}

int pack_remove_stale_tmp(const char *dir, const char *split, const char *suffix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char tmp_suffix[64], path[4200];
	size_t sl = strlen(split);
	int n = 0;
	snprintf(tmp_suffix, sizeof tmp_suffix, "%s.tmp", suffix);
	size_t xl = strlen(tmp_suffix);
	while (d && (de = readdir(d))) {
		const char *name = de->d_name;
		size_t l = strlen(name);
		if (strncmp(name, split, sl) || name[sl] != '-' || l < sl + 1 + xl ||
		    strcmp(name + l - xl, tmp_suffix))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, name);
		n += !unlink(path);
	}
	if (d)
		closedir(d);
	if (n)
		fprintf(stderr, "kiln pack: removed %d stale %s/%s-*%s file(s) of an interrupted pack\n",
			n, dir, split, tmp_suffix);
	return n;
}

uint32_t pack_id(uint32_t content, const uint64_t *sizes, int n)
{
	const struct kiln_host *host = kiln_host_table();
	uint32_t id = content;
	for (int k = 0; k < n; k++) {
		unsigned char b[8];
		for (int i = 0; i < 8; i++)
			b[i] = (unsigned char)(sizes[k] >> (8 * i));
		id = host->crc32c(id, b, sizeof b);
	}
	return id;
}

kiln_status pack_lock_out(const char *dir)
{
	/* O_RDONLY on a directory: flock needs no write access.  The fd is
	 * kept until exit (the lock with it), CLOEXEC for the children. */
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return kiln_error(KILN_EIO, "--out %s: cannot open: %s", dir, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		const int e = errno;
		close(fd);
		if (e == EWOULDBLOCK)
			return kiln_error(KILN_EUSAGE, "--out %s: another kiln pack is writing there (it holds the directory's lock): wait for it to end, or choose another --out",
					  dir);
		/* a file system without flock (some FUSE ones): packed as
		 * before the lock existed */
		fprintf(stderr, "kiln pack: warning: --out %s: cannot lock (%s): a second pack into it meanwhile would not be refused\n",
			dir, strerror(e));
	}
	return KILN_OK;
}
