/* plugins/common/write_full.h - a whole pwrite() for code that cannot link
 * libkiln's kiln_pwrite_all (core/internal.h): the loaders' records writer,
 * which kiln-loaders.so and the CLI's libimage_records.la both hold, and
 * kiln pack's token shards (cli/pack_tokens.c, outside libkiln).  A
 * pwrite() may write less than asked (a full disk part way, a signal) or
 * fail with EINTR: one call compared with the size called either a lost
 * write (session 36).  Header-only: static inline.
 */
#ifndef KILN_COMMON_WRITE_FULL_H
#define KILN_COMMON_WRITE_FULL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

/* Write all n bytes of buf at offset off of fd, retrying EINTR and short
 * writes: 0, or -1 with errno (EIO for a pwrite that wrote nothing, so
 * that strerror says something). */
static inline int common_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	const char *p = buf;
	while (n) {
		const ssize_t k = pwrite(fd, p, n, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = EIO;
			return -1;
		}
		p += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

#endif /* KILN_COMMON_WRITE_FULL_H */
