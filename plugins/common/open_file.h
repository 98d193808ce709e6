/* plugins/common/open_file.h - open a file to read it, refusing what is
 * not a regular file before anything can block: a FIFO's open() waits for
 * a writer forever, a device's read may never end.  One copy for the core
 * (checkpoints, init_from) and the data sources (images, shards, IDX).
 * Header-only: static inline.
 */
#ifndef KILN_COMMON_OPEN_FILE_H
#define KILN_COMMON_OPEN_FILE_H

#include <errno.h>
#include <fcntl.h>
#include <string.h>   /* strerror */
#include <sys/stat.h>
#include <unistd.h>

/* What st_mode is, for "PATH: a FIFO (named pipe), not a regular file". */
static inline const char *common_file_kind(mode_t m)
{
	return S_ISDIR(m)  ? "a directory" :
	       S_ISFIFO(m) ? "a FIFO (named pipe)" :
	       S_ISCHR(m)  ? "a character device" :
	       S_ISBLK(m)  ? "a block device" :
	       S_ISSOCK(m) ? "a socket" : "a special file";
}

/* open(path, O_RDONLY) without blocking (O_NONBLOCK, cleared again once
 * fstat() showed a regular file).  Returns the descriptor; or -1 with
 * *why = strerror(errno) (why_buf unused), or -1 with *why = "a FIFO
 * (named pipe), not a regular file" (written into why_buf, n bytes) and
 * errno = EINVAL.  *size (may be NULL) receives the file's size. */
static inline int common_open_file(const char *path, char *why_buf, size_t n, const char **why,
				   off_t *size)
{
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0 || fstat(fd, &sb)) {
		int err = errno;
		if (fd >= 0)
			close(fd);
		*why = strerror(err);
		errno = err;
		return -1;
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		if (n) {
			why_buf[0] = 0;
			strncat(why_buf, common_file_kind(sb.st_mode), n - 1);
			strncat(why_buf, ", not a regular file", n - 1 - strlen(why_buf));
		}
		*why = why_buf;
		errno = EINVAL;
		return -1;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
		int err = errno;
		close(fd);
		*why = strerror(err);
		errno = err;
		return -1;
	}
	if (size)
		*size = sb.st_size;
	return fd;
}

#endif /* KILN_COMMON_OPEN_FILE_H */
