/* plugins/common/shm_stale.h - the names of kiln-gloo's shared-memory
 * objects, and removing those their maker left behind.  Rank 0 of a
 * group makes /dev/shm/kiln-gloo-<its pid>-<16 lowercase hex digits>
 * (with "-g" after: the region, gloo_shm_alloc) and the name goes once
 * every rank has opened it (plugins/gloo/shm.c); a rank 0 killed before
 * that (SIGKILL, a crash) left 9 MiB there until reboot (before session
 * 40).  kiln-gloo removes those of processes that are gone as it makes
 * its first (shm_stale_sweep(0, ...)), and `kiln launch` those of each
 * rank's process it reaps (shm_stale_sweep(pid, 0): its own children,
 * gone for certain).  Header-only: static inline.
 */
#ifndef KILN_COMMON_SHM_STALE_H
#define KILN_COMMON_SHM_STALE_H

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_STALE_PREFIX "kiln-gloo-"

/* The maker's pid of the object named `name` (no leading '/') if it is
 * named as kiln-gloo names them, its tag ("" or "-g", what follows the
 * digits) into *tag; else -1. */
static inline long shm_stale_pid(const char *name, const char **tag)
{
	const char *p = name + sizeof SHM_STALE_PREFIX - 1;
	if (strncmp(name, SHM_STALE_PREFIX, sizeof SHM_STALE_PREFIX - 1) ||
	    !isdigit((unsigned char)*p))
		return -1;
	const long pid = strtol(p, NULL, 10);
	while (isdigit((unsigned char)*p))
		p++;
	if (*p++ != '-' || pid <= 0 || pid > INT_MAX)
		return -1;
	for (int i = 0; i < 16; i++, p++)
		if (!isxdigit((unsigned char)*p) || isupper((unsigned char)*p))
			return -1;
	*tag = p;
	return pid;
}

/* Remove this user's objects in /dev/shm named as kiln-gloo names them
 * (tag "" or "-g") that their maker left: only_pid > 0, those of process
 * only_pid (one the caller reaped); 0, those whose process no longer
 * lives and that are at least min_age_s old (a maker in another PID
 * namespace sharing /dev/shm looks gone from here: a live run's object
 * exists for its set-up's seconds only).  Never this process's own.
 * Returns how many went. */
static inline int shm_stale_sweep(long only_pid, int min_age_s)
{
	DIR *d = opendir("/dev/shm");
	int gone = 0;
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));) {
		const char *tag;
		char name[sizeof e->d_name + 1];
		struct stat sb;
		const long pid = shm_stale_pid(e->d_name, &tag);
		if (pid < 0 || (*tag && strcmp(tag, "-g")) || pid == (long)getpid() ||
		    (only_pid > 0 && pid != only_pid) ||
		    fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) || !S_ISREG(sb.st_mode) ||
		    sb.st_uid != geteuid())
			continue;
		if (only_pid <= 0 && (time(NULL) - sb.st_mtime < min_age_s ||
				      !kill((pid_t)pid, 0) || errno != ESRCH))
			continue;
		snprintf(name, sizeof name, "/%s", e->d_name);
		gone += !shm_unlink(name);
	}
	closedir(d);
	return gone;
}

#endif
