/* plugins/common/cache_file.h - where kiln keeps files it can always
 * rebuild (the inflated IDX data, the plugin probe's answers, cuDNN's
 * autotune choices), and how it writes them so a reader never sees half a
 * file.  One copy for the core and the plugins.  Header-only: static inline.
 *
 * A cache file is never trusted: its reader checks that it describes the
 * same source (path, size, mtime) and, where its contents matter, a
 * checksum, and rebuilds it otherwise.
 */
#ifndef KILN_COMMON_CACHE_FILE_H
#define KILN_COMMON_CACHE_FILE_H

#include <dirent.h>   /* opendir: the leftovers beside a cache file */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>   /* kill(pid, 0): is a temporary's writer alive */
#include <stdio.h>    /* snprintf, rename */
#include <stdlib.h>   /* getenv */
#include <string.h>
#include <sys/stat.h> /* mkdir */
#include <sys/syscall.h> /* SYS_gettid */
#include <time.h>     /* time: a leftover's age */
#include <unistd.h>   /* write, close, unlink, getpid, syscall */

/* Whether the folder above the cache folder d (d's parent) is an existing
 * directory: kiln makes at most the cache folder and its kiln/ in it,
 * never $HOME or anything above (HOME=/nonexistent, the home of Debian's
 * system users, is absent on purpose: run as root, kiln made it). */
static inline int common_cache_base_ok(const char *d)
{
	char up[4096];
	struct stat sb;
	size_t len = strlen(d);
	while (len > 1 && d[len - 1] == '/')
		len--;
	while (len > 0 && d[len - 1] != '/')
		len--;
	while (len > 1 && d[len - 1] == '/')
		len--;
	if (!len || len >= sizeof up)
		return 0;
	memcpy(up, d, len);
	up[len] = 0;
	return !stat(up, &sb) && S_ISDIR(sb.st_mode);
}

/* $XDG_CACHE_HOME/kiln/<name>, else $HOME/.cache/kiln/<name>, into buf (n
 * bytes).  XDG_CACHE_HOME counts only when absolute (the XDG spec); the
 * folder above the cache folder ($HOME, or XDG_CACHE_HOME's parent) must
 * exist (common_cache_base_ok).  -1 when there is no such path (errno
 * ENOENT: a variable names a missing folder, common_cache_note says which;
 * else neither is set, or the path does not fit). */
static inline int common_cache_path(char *buf, size_t n, const char *name)
{
	const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	int len;
	if (x && x[0] == '/')
		len = snprintf(buf, n, "%s/kiln/%s", x, name);
	else if (h && *h)
		len = snprintf(buf, n, "%s/.cache/kiln/%s", h, name);
	else
		return errno = EINVAL, -1;
	if (len < 0 || (size_t)len >= n)
		return errno = ENAMETOOLONG, -1;
	buf[len - strlen(name) - strlen("/kiln/")] = 0; /* the cache folder */
	const int ok = common_cache_base_ok(buf);
	buf[strlen(buf)] = '/';
	return ok ? 0 : (errno = ENOENT, -1);
}

/* After common_cache_path failed with ENOENT: one line saying why no cache
 * is kept, into msg (n bytes), for a note. */
static inline void common_cache_note(char *msg, size_t n)
{
	const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	if (x && x[0] == '/')
		snprintf(msg, n, "XDG_CACHE_HOME=%.200s: the folder above it does not exist: no cache file is kept", x);
	else
		snprintf(msg, n, "HOME=%.200s is not a directory: no cache file is kept (set XDG_CACHE_HOME to keep them)",
			 h ? h : "");
}

/* mkdir -p: the directories above path, and path itself too when leaf is
 * set, each made with mode (less the umask) where missing.  -1 with errno
 * on failure.  One copy for the caches and a run's directories
 * (core/train_setup.c, core/train_ckpt.c). */
static inline int common_mkdirs(const char *path, mode_t mode, int leaf)
{
	char d[4096];
	if (strlen(path) >= sizeof d) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(d, path);
	for (char *p = d + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			if (mkdir(d, mode) && errno != EEXIST)
				return -1;
			*p = '/';
		}
	return leaf && mkdir(d, mode) && errno != EEXIST ? -1 : 0;
}

/* mkdir -p of the directories above path.  -1 with errno on failure. */
static inline int common_make_parents(const char *path)
{
	return common_mkdirs(path, 0755, 0);
}

/* Open a temporary file beside path, path.tmp.<pid>.<thread>.<k>, new
 * (O_EXCL) and unique to this call: two devices of one process, each on
 * its own thread, saving the same cache at once no longer write one file
 * (the pid alone named it).  k counts this thread's tries, past a name a
 * crashed process left.  The fd, or -1 with errno. */
static inline int common_open_tmp(const char *path, char *tmp, size_t n)
{
	const long tid = (long)syscall(SYS_gettid);
	for (int k = 0; k < 100; k++) {
		int len = snprintf(tmp, n, "%s.tmp.%ld.%ld.%d", path, (long)getpid(), tid, k);
		if (len < 0 || (size_t)len >= n) {
			errno = ENAMETOOLONG;
			return -1;
		}
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0 || errno != EEXIST)
			return fd;
	}
	return -1; /* errno EEXIST */
}

/* A temporary of common_open_tmp's older than this (its mtime: a live
 * writer's moves with each write) whose writer is gone is a leftover of
 * a process killed while saving; one older than COMMON_TMP_ABANDONED_S
 * is one whatever the pid (reused, or of another pid namespace). */
#define COMMON_TMP_STALE_S 600
#define COMMON_TMP_ABANDONED_S 86400

/* 1 when name is base.tmp.<pid>.<tid>.<k> (common_open_tmp's), with the
 * pid in *pid; else 0. */
static inline int common_tmp_name(const char *name, const char *base, long *pid)
{
	const size_t bl = strlen(base);
	if (strncmp(name, base, bl) || strncmp(name + bl, ".tmp.", 5))
		return 0;
	const char *p = name + bl + 5;
	long v[3];
	for (int i = 0; i < 3; i++) {
		if (*p < '0' || *p > '9')
			return 0;
		char *end;
		v[i] = strtol(p, &end, 10);
		p = end;
		if (*p != (i < 2 ? '.' : 0))
			return 0;
		p += i < 2;
	}
	*pid = v[0];
	return 1;
}

/* Removes the temporaries that writers killed mid-save (SIGKILL, a crash,
 * a power cut) left beside path: regular files named as common_open_tmp
 * names them for path, untouched for COMMON_TMP_STALE_S and whose pid is
 * not a live process here, or untouched for COMMON_TMP_ABANDONED_S.  A
 * live writer's temporary is newer, or its pid answers kill(pid, 0)
 * (EPERM: alive, another user's).  Nothing else in the directory is
 * looked at (bench/common.sh's plugin_probe.<cksum> are caches, not
 * temporaries).  Best effort: failures are ignored. */
static inline void common_clean_tmp(const char *path)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	if (!slash || (size_t)(slash - path) >= sizeof dir)
		return;
	memcpy(dir, path, (size_t)(slash - path));
	dir[slash - path] = 0;
	DIR *d = opendir(*dir ? dir : "/");
	if (!d)
		return;
	const time_t now = time(NULL);
	for (struct dirent *e; (e = readdir(d));) {
		long pid;
		struct stat st;
		if (!common_tmp_name(e->d_name, slash + 1, &pid) ||
		    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		const double age = difftime(now, st.st_mtime);
		const int gone = pid <= 0 || (kill((pid_t)pid, 0) && errno == ESRCH);
		if (age >= COMMON_TMP_ABANDONED_S || (age >= COMMON_TMP_STALE_S && gone))
			unlinkat(dirfd(d), e->d_name, 0);
	}
	closedir(d);
}

/* Write the n parts (part[i] of len[i] bytes) one after the other to a
 * temporary file of this call's own (common_open_tmp) and rename it over
 * path, making the parent directories first: a reader sees the old file
 * or one whole new one, also while other threads and processes save it.
 * Not synced: a cache file's reader verifies it.  -1 with errno on
 * failure (nothing is left behind); after a save, the temporaries killed
 * writers left beside path are removed (common_clean_tmp). */
static inline int common_write_atomic(const char *path, const void *const *part,
				      const size_t *len, int n)
{
	char tmp[4200];
	if (strlen(path) + 64 >= sizeof tmp) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if (common_make_parents(path))
		return -1;
	int fd = common_open_tmp(path, tmp, sizeof tmp);
	if (fd < 0)
		return -1;
	for (int i = 0; i < n; i++)
		for (size_t done = 0; done < len[i];) {
			ssize_t w = write(fd, (const char *)part[i] + done, len[i] - done);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				goto fail;
			done += (size_t)w;
		}
	if (close(fd)) {
		fd = -1;
		goto fail;
	}
	if (rename(tmp, path) == 0) {
		const int keep = errno;
		common_clean_tmp(path);
		errno = keep;
		return 0;
	}
	fd = -1;
fail:;
	int err = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	errno = err;
	return -1;
}

#endif
