/* core/out_file.c - writing a command's output file without losing another:
 * kiln_output_check, the refusal of an output that is one of the command's
 * inputs or a kiln checkpoint (`kiln export`, `kiln predict --logits`,
 * `kiln quantize --out`: before session 31 export and predict overwrote
 * the checkpoint they read and exited 0), and kiln_file_write, the
 * all-or-nothing write through a temporary file that the safetensors and
 * ONNX writers share (before session 31 a failed ONNX write removed the
 * previous good export).
 *
 * A writer killed by a signal mid-write cannot remove its temporary
 * path.kiln-tmp<pid>.<n>, and no handler is installed to (a library's
 * signal handlers would be the program's): the next write of the same
 * path removes those whose process is gone, kill(pid, 0) failing with
 * ESRCH (before session 32 they stayed for good, a model's size each), and
 * those of this process's own pid last written before its first write (a
 * container's PID 1 killed and started again: the pid is alive, the
 * writer is not).  Only the user's own regular files of exactly that name
 * go.  A live writer's, or one whose pid another process has taken since,
 * stays.  A pid is one PID namespace's: a writer of the same path on
 * another machine (a shared file system) or in another container at that
 * very moment can lose its temporary, and its write then fails, the file
 * at path whole. */
#include "internal.h"
#include "checkpoint.h" /* kiln_ckpt_is_checkpoint */

#include <dirent.h>  /* opendir, readdir: stale temporaries */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h> /* pthread_once: this process's first write */
#include <signal.h>  /* kill(pid, 0): is a temporary's writer alive */
#include <time.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status kiln_output_check(const char *out, const char *const *inputs, int n)
{
	struct stat o, in;
	if (!out || stat(out, &o))
		return KILN_OK; /* nothing there yet: nothing to lose */
	for (int i = 0; i < n; i++)
		if (inputs[i] && *inputs[i] && !stat(inputs[i], &in) && in.st_dev == o.st_dev &&
		    in.st_ino == o.st_ino)
			return kiln_error(KILN_EUSAGE, "the output %s is the file %s, which this command reads: choose another file",
					  out, inputs[i]);
	/* not an input: the newest checkpoint of out_dir, found later, is a
	 * checkpoint too, and only training writes one */
	if (kiln_ckpt_is_checkpoint(out))
		return kiln_error(KILN_EUSAGE, "the output %s is a kiln checkpoint, which would be overwritten: choose another file",
				  out);
	return KILN_OK;
}

/* kiln_output_watch's file: set by the command before it opens any data,
 * read by kiln_source_open as it opens each source. */
static char watched[4096];

void kiln_output_watch(const char *out)
{
	snprintf(watched, sizeof watched, "%s", out ? out : "");
}

int kiln_output_watched_stat(struct stat *o)
{
	return *watched && !stat(watched, o);
}

kiln_status kiln_output_same_check(const struct stat *o, const char *path, const char *reader)
{
	struct stat in;
	if (path && !stat(path, &in) && in.st_dev == o->st_dev && in.st_ino == o->st_ino)
		return kiln_error(KILN_EUSAGE, "the output %s is the file %s, which %s reads: choose another file",
				  watched, path, reader);
	return KILN_OK;
}

kiln_status kiln_output_read_check(const char *path, const char *reader)
{
	struct stat o;
	if (!kiln_output_watched_stat(&o))
		return KILN_OK; /* no output yet: nothing to lose */
	return kiln_output_same_check(&o, path, reader);
}

/* fill's bytes into fp, then fp closed, fsynced first when `sync` (a
 * regular file about to be renamed into place); 0 or the first errno. */
static int write_stream(FILE *fp, kiln_file_fill fill, void *ctx, int sync)
{
	errno = 0; /* (not an earlier call's: the caller's stat of a new file) */
	int err = fill(fp, ctx);
	if (!err && sync && (fflush(fp) || fsync(fileno(fp))))
		err = errno ? errno : EIO;
	if (fclose(fp) && !err)
		err = errno ? errno : EIO;
	return err;
}

kiln_status kiln_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot open the directory to fsync it: %s", dir,
				  strerror(errno));
	int rc = fsync(fd);
	int e = errno;
	close(fd);
	/* some file systems cannot fsync a directory (EINVAL): nothing to do */
	if (rc && e != EINVAL)
		return kiln_error(KILN_EIO, "%s: fsync failed: %s", dir, strerror(e));
	return KILN_OK;
}

kiln_status kiln_run_file_check(const char *path)
{
	struct stat sb;
	FILE *f;
	if (stat(path, &sb) || S_ISREG(sb.st_mode))
		return KILN_OK;
	kiln_status st = kiln_fopen_regular(path, "w", "write", &f);
	if (!st)
		fclose(f); /* a character device: written straight to */
	return st;
}

/* kiln_fsync_dir of the directory holding `path` (the rename made
 * durable), its error dropped: the file is in place either way. */
static void sync_parent(const char *path)
{
	char *dir = strdup(path);
	if (!dir)
		return;
	char *slash = strrchr(dir, '/');
	(void)kiln_fsync_dir(slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".");
	free(dir);
}

#define TMP_TAG ".kiln-tmp" /* base TMP_TAG <pid>.<n>: kiln's name, not a user's */
/* The name of session 32's first temporaries, base.tmp<pid>.<n>: an older
 * kiln killed mid-write left them, and they are recognised too (under the
 * same rules: the user's own regular file, its writer's pid gone), else
 * they stayed for good, a model's size each.  (A user's own file of
 * exactly that name beside the output, its digits a gone pid's, goes as
 * well: the price of cleaning up after the older kiln.) */
#define OLD_TMP_TAG ".tmp"

/* The pid of name when it is base followed by tag, digits (at most 9), a
 * dot and digits; 0 when it is not. */
static long tagged_pid(const char *name, const char *base, const char *tag)
{
	size_t bl = strlen(base), tl = strlen(tag);
	if (strncmp(name, base, bl) || strncmp(name + bl, tag, tl))
		return 0;
	const char *p = name + bl + tl;
	size_t pd = strspn(p, "0123456789");
	if (!pd || pd > 9 || p[pd] != '.' || !p[pd + 1] ||
	    strspn(p + pd + 1, "0123456789") != strlen(p + pd + 1))
		return 0;
	return strtol(p, NULL, 10);
}

/* The pid of a temporary of write_replacing's named base.kiln-tmp<pid>.<n>
 * (or an older kiln's base.tmp<pid>.<n>; name a file of base's
 * directory), or 0 when name is not one. */
static long temporary_pid(const char *name, const char *base)
{
	long pid = tagged_pid(name, base, TMP_TAG);
	return pid ? pid : tagged_pid(name, base, OLD_TMP_TAG);
}

/* When this process first wrote through a temporary: one of its own
 * pid last written before then is an earlier process's (a PID 1 again). */
static struct timespec first_write;
static pthread_once_t first_write_once = PTHREAD_ONCE_INIT;
static void first_write_take(void) { clock_gettime(CLOCK_REALTIME, &first_write); }

/* (by 2 s and more: a file's mtime comes from the kernel's coarse clock,
 * or a file server's, which may read earlier than this process's clock:
 * another thread's temporary made just after the first write stays) */
static int before_first_write(const struct stat *sb)
{
	return sb->st_mtim.tv_sec < first_write.tv_sec - 2;
}

/* Remove the temporaries of target that writers killed mid-write left:
 * base.kiln-tmp<pid>.<n> beside it, this user's regular files, whose
 * process is gone (kill: ESRCH; EPERM is another user's live process), or
 * of this pid but older than this process's first write.  Best effort:
 * the write goes on whatever happens here. */
static void remove_stale_temporaries(const char *target)
{
	const char *slash = strrchr(target, '/'), *base = slash ? slash + 1 : target;
	char *dir = slash ? strndup(target, slash == target ? 1 : (size_t)(slash - target))
			  : strdup(".");
	DIR *d = dir ? opendir(dir) : NULL;
	struct dirent *e;
	struct stat sb;
	pthread_once(&first_write_once, first_write_take);
	while (d && (e = readdir(d))) {
		long pid = temporary_pid(e->d_name, base);
		if (pid <= 0 || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(sb.st_mode) || sb.st_uid != geteuid())
			continue;
		if (pid == (long)getpid() ? !before_first_write(&sb)
					  : !kill((pid_t)pid, 0) || errno != ESRCH)
			continue;
		if (!unlinkat(dirfd(d), e->d_name, 0))
			kiln_log(KILN_LOG_INFO, "core", "removed %s/%s, the temporary of a write of %s that was killed (%s %ld%s)",
				 dir, e->d_name, target, pid == (long)getpid() ? "an earlier process of this pid," : "process",
				 pid, pid == (long)getpid() ? " as this one's, written before it started writing" : " is gone");
	}
	if (d)
		closedir(d);
	free(dir);
}

/* Write to `target` (a regular file, or none yet) through a temporary
 * target.kiln-tmp<pid>.<n> in its directory, created exclusively (never a file
 * or link already there), given the target's permission bits (a private
 * 0600 export stays private; a new file gets 0666 less the umask, as
 * fopen), fsynced and renamed over it, the directory fsynced: the old file
 * stays whole until then; 0 or an errno (the temporary removed). The
 * target's hard links keep the old file, and its owner is the writer's.
 * Killed writers' temporaries of target go first. */
static int write_replacing(const char *target, kiln_file_fill fill, void *ctx)
{
	static atomic_uint serial; /* two threads of one process: other names */
	struct stat sb;
	size_t tn = strlen(target) + 48;
	char *tmp = malloc(tn);
	if (!tmp)
		return ENOMEM;
	remove_stale_temporaries(target);
	const int had = !stat(target, &sb);
	int fd = -1, err = 0;
	for (int tries = 0; fd < 0 && tries < 100; tries++) {
		snprintf(tmp, tn, "%s" TMP_TAG "%ld.%u", target, (long)getpid(),
			 atomic_fetch_add(&serial, 1));
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	FILE *fp = NULL;
	if (fd < 0)
		err = errno;
	else if (had && fchmod(fd, sb.st_mode & 07777))
		err = errno;
	else if (!(fp = fdopen(fd, "wb")))
		err = errno;
	if (err) {
		if (fd >= 0) {
			close(fd);
			unlink(tmp);
		}
		free(tmp);
		return err;
	}
	err = write_stream(fp, fill, ctx, 1);
	if (!err && rename(tmp, target))
		err = errno;
	if (err)
		unlink(tmp);
	else
		sync_parent(target);
	free(tmp);
	return err;
}

int kiln_file_write(const char *path, kiln_file_fill fill, void *ctx)
{
	/* what `path` names decides how: a symlink's target is replaced, not
	 * the link (one that cannot be resolved is an error: written straight
	 * to, a failure would leave the target cut short); a device or FIFO
	 * (/dev/stdout), or a dangling link, is written straight to, and the
	 * target a failed write through a dangling link made is removed */
	struct stat sb, lsb;
	char *real = NULL;
	int link = !lstat(path, &lsb) && S_ISLNK(lsb.st_mode), exists = !stat(path, &sb), err;
	if (link && exists && S_ISREG(sb.st_mode) && !(real = realpath(path, NULL))) {
		err = errno;
	} else if (exists ? S_ISREG(sb.st_mode) : !link) {
		err = write_replacing(real ? real : path, fill, ctx);
	} else {
		FILE *fp = fopen(path, "wb");
		err = fp ? write_stream(fp, fill, ctx, 0) : errno;
		if (err && fp && !exists && (real = realpath(path, NULL)))
			unlink(real);
	}
	free(real);
	return err;
}
