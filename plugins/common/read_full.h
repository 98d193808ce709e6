/* plugins/common/read_full.h - a whole pread() that says how much was
 * there: the loop by which the loaders' shards (loaders_pread_full) and
 * libkiln's reads of known extent (kiln_pread_all: checkpoints, magics;
 * kiln_read_at: weights files; core/status.c; the data set's identity,
 * core/data_identity.c, since session 40's review) tell a file cut short
 * under them (0 bytes, or fewer than asked, at its new end) from a failed
 * read.  A pread() may return less than asked (a signal, a large request,
 * a network or FUSE file system) or fail with EINTR: both are retried.
 * (Reads that stop at the end whatever it is, as core/logger.c's copy of
 * a file, loop on their own: a short read there is one more block.)
 * Header-only: static inline.
 */
#ifndef KILN_COMMON_READ_FULL_H
#define KILN_COMMON_READ_FULL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

/* Read up to n bytes of fd at offset off into buf: the count read (n, or
 * fewer where the file ends first), or -1 with errno. */
static inline ssize_t common_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	size_t got = 0;
	while (got < n) {
		size_t want = n - got;
		if (want > ((size_t)1 << 30))
			want = (size_t)1 << 30;
		const ssize_t r = pread(fd, (char *)buf + got, want, (off_t)(off + got));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

#endif /* KILN_COMMON_READ_FULL_H */
