/* core/status.c - thread-local error messages, the log sink, the clock and
 * small I/O and array helpers. */
#include "internal.h"
#include "../plugins/common/c_locale.h" /* common_vsnprintf_c */
#include "../plugins/common/read_full.h" /* common_pread_full: kiln_read_at */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdint.h> /* SIZE_MAX */
#include <sys/resource.h> /* getrlimit: kiln_vm */
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- errors ----------------------------------------------------------- */

/* Room for a message naming two paths of PATH_MAX (a rename's); a longer
 * one keeps its start and its end, the cause, around "..." (set_message). */
static _Thread_local char err_msg[KILN_ERROR_MAX];

const char *kiln_last_error(void) { return err_msg; }

void kiln_clear_error(void) { err_msg[0] = 0; }

/* err_msg = s, its middle replaced by "..." when s does not fit. */
static void set_message(const char *s)
{
	size_t n = strlen(s);
	if (n < KILN_ERROR_MAX) {
		memmove(err_msg, s, n + 1);
		return;
	}
	size_t head = KILN_ERROR_MAX / 4, tail = KILN_ERROR_MAX - 1 - head - 3;
	memmove(err_msg, s, head);
	memcpy(err_msg + head, "...", 3);
	memmove(err_msg + head + 3, s + n - tail, tail + 1);
}

/* fmt formatted into a malloc()ed string, NULL when out of memory.
 * Numbers in the C locale, as in every message (kiln_vlog): an
 * application's setlocale(LC_ALL, "") does not turn "lr 0.1" into
 * "lr 0,1" in kiln's English, nor a value quoted from a config. */
static char *format_message(const char *fmt, va_list ap)
{
	va_list aq;
	va_copy(aq, ap);
	int n = common_vsnprintf_c(NULL, 0, fmt, aq);
	va_end(aq);
	char *s = n < 0 ? NULL : malloc((size_t)n + 1);
	if (s)
		common_vsnprintf_c(s, (size_t)n + 1, fmt, ap);
	return s;
}

kiln_status kiln_verror(kiln_status st, const char *fmt, va_list ap)
{
	/* The message may be built from the previous one (kiln_error_wrap),
	 * so format into a temporary first. */
	char *s = format_message(fmt, ap);
	set_message(s ? s : "out of memory (formatting an error message)");
	free(s);
	return st;
}

kiln_status kiln_error(kiln_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_verror(st, fmt, ap);
	va_end(ap);
	return st;
}

kiln_status kiln_null_arg(const char *fn, const char *arg)
{
	return kiln_error(KILN_EINVAL, "%s: %s is NULL", fn, arg);
}

kiln_status kiln_error_wrap(kiln_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *head = format_message(fmt, ap);
	va_end(ap);
	if (!head)
		return st; /* out of memory: the cause alone */
	/* a message that already starts with the same context ("layer 'x'"
	 * before "layer 'x' (conv): ...") keeps it once */
	size_t n = strlen(head);
	if (!(n && !strncmp(err_msg, head, n) &&
	      (!err_msg[n] || err_msg[n] == ':' || err_msg[n] == ' '))) {
		char *s = malloc(n + 2 + strlen(err_msg) + 1);
		if (s) {
			sprintf(s, "%s: %s", head, err_msg);
			set_message(s);
			free(s);
		}
	}
	free(head);
	return st;
}

const char *kiln_status_name(kiln_status st)
{
	switch (st) {
	case KILN_OK: return "KILN_OK";
	case KILN_EINVAL: return "KILN_EINVAL";
	case KILN_ENOMEM: return "KILN_ENOMEM";
	case KILN_EIO: return "KILN_EIO";
	case KILN_ECONFIG: return "KILN_ECONFIG";
	case KILN_EUSAGE: return "KILN_EUSAGE";
	case KILN_EDATA: return "KILN_EDATA";
	case KILN_ENOTSUP: return "KILN_ENOTSUP";
	case KILN_EPLUGIN: return "KILN_EPLUGIN";
	case KILN_EABI: return "KILN_EABI";
	case KILN_ENOTFOUND: return "KILN_ENOTFOUND";
	case KILN_ETIMEOUT: return "KILN_ETIMEOUT";
	case KILN_EDEVICE: return "KILN_EDEVICE";
	case KILN_EINTERNAL: return "KILN_EINTERNAL";
	}
	return "KILN_E(unknown)";
}

int kiln_status_exit_code(kiln_status st)
{
	switch (st) {
	case KILN_OK: return 0;
	case KILN_ECONFIG:
	case KILN_EUSAGE: return 2;
	case KILN_EDATA: return 3;
	default: return 1;
	}
}

/* ---- logging ---------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_log_fn log_sink;
static void *log_user;
static int log_level = KILN_LOG_INFO;

static void default_sink(void *user, int level, const char *who, const char *msg)
{
	static const char *const tag[] = { "error: ", "warning: ", "", "debug: " };
	(void)user;
	fprintf(stderr, "[%s] %s%s\n", who, tag[level & 3], msg);
}

void kiln_log_set_sink(kiln_log_fn fn, void *user)
{
	pthread_mutex_lock(&log_lock);
	log_sink = fn;
	log_user = user;
	pthread_mutex_unlock(&log_lock);
}

void kiln_log_set_level(int level) { log_level = level; }
int kiln_log_get_level(void) { return log_level; }

void kiln_vlog(int level, const char *who, const char *fmt, va_list ap)
{
	char small[2048], *msg = small;
	va_list again;
	if (level > log_level)
		return;
	/* a message past the stack buffer is formatted again, whole, into
	 * one of its size (out of memory: the cut one) */
	va_copy(again, ap);
	const int len = common_vsnprintf_c(small, sizeof small, fmt, ap); /* (format_message) */
	if (len >= (int)sizeof small && (msg = malloc((size_t)len + 1)))
		common_vsnprintf_c(msg, (size_t)len + 1, fmt, again);
	else
		msg = small;
	va_end(again);
	size_t n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = 0;
	pthread_mutex_lock(&log_lock);
	(log_sink ? log_sink : default_sink)(log_user, level, who ? who : "kiln", msg);
	pthread_mutex_unlock(&log_lock);
	if (msg != small)
		free(msg);
}

void kiln_log(int level, const char *who, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	kiln_vlog(level, who, fmt, ap);
	va_end(ap);
}

/* The sizes of /proc/self/status named keys[i] ("VmRSS"), in bytes, into
 * *out[i] where out[i] is not NULL; 0 where unknown. */
static void proc_status_bytes(const char *const *keys, size_t **out, int n)
{
	char line[256];
	unsigned long long kb;
	for (int i = 0; i < n; i++)
		if (out[i])
			*out[i] = 0;
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof line, f))
		for (int i = 0; i < n; i++) {
			const size_t k = strlen(keys[i]);
			if (out[i] && !strncmp(line, keys[i], k) && line[k] == ':' &&
			    sscanf(line + k + 1, " %llu kB", &kb) == 1)
				*out[i] = (size_t)kb * 1024;
		}
	if (f)
		fclose(f);
}

void kiln_rss(size_t *now, size_t *peak, int reset)
{
	FILE *f;
	if (reset && (f = fopen("/proc/self/clear_refs", "w"))) {
		fputs("5", f); /* restart VmHWM at the current VmRSS (Linux 4.0+) */
		fclose(f);
	}
	proc_status_bytes((const char *const[]){ "VmRSS", "VmHWM" }, (size_t *[]){ now, peak }, 2);
}

void kiln_vm(size_t *now, size_t *limit)
{
	struct rlimit rl;
	proc_status_bytes((const char *const[]){ "VmSize" }, (size_t *[]){ now }, 1);
	if (limit)
		*limit = getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY ||
				 rl.rlim_cur > SIZE_MAX
			 ? SIZE_MAX
			 : (size_t)rl.rlim_cur;
}

int64_t kiln_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int kiln_io_all(int fd, int how, const void *buf, size_t n, uint64_t off)
{
	const char *p = buf;
	while (n) {
		ssize_t k = how == KILN_IO_PWRITE ? pwrite(fd, p, n, (off_t)off)
			    : how == KILN_IO_SEND ? send(fd, p, n, MSG_NOSIGNAL)
						  : write(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = 0;
			return -1;
		}
		p += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

int kiln_pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	const ssize_t got = common_pread_full(fd, buf, n, off);
	if (got == (ssize_t)n)
		return 0;
	if (got >= 0)
		errno = 0; /* the file ended first */
	return -1;
}

static int64_t mtime_ns(const struct stat *sb)
{
	return (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
}

kiln_status kiln_file_seen_fd(int fd, const char *path, struct kiln_file_seen *seen)
{
	struct stat sb;
	if (fstat(fd, &sb))
		return kiln_error(KILN_EIO, "%s: cannot stat: %s", path, strerror(errno));
	seen->size = (uint64_t)sb.st_size;
	seen->mtime_ns = mtime_ns(&sb);
	return KILN_OK;
}

/* "1700000000.123456789" for t ns since the epoch, into buf. */
static const char *ns_text(int64_t t, char *buf, size_t n)
{
	snprintf(buf, n, "%lld.%09lld", (long long)(t / 1000000000), (long long)(t % 1000000000));
	return buf;
}

kiln_status kiln_read_at(int fd, const char *path, const struct kiln_file_seen *seen,
			 const char *what, void *buf, size_t n, uint64_t off)
{
	const ssize_t got = common_pread_full(fd, buf, n, off);
	struct stat sb;
	char now[64] = "", t0[32], t1[32];
	if (got < 0)
		return kiln_error(KILN_EIO, "%s: cannot read %s (bytes %llu..%llu): %s", path, what,
				  (unsigned long long)off, (unsigned long long)(off + n - 1),
				  strerror(errno));
	const int stat_ok = !fstat(fd, &sb);
	if (got != (ssize_t)n) {
		if (stat_ok)
			snprintf(now, sizeof now, ", it has %lld now", (long long)sb.st_size);
		return kiln_error(KILN_EDATA, "%s: %s (bytes %llu..%llu): only %zd of %zu bytes are there: the file had %llu bytes when kiln opened it%s (was it truncated or rewritten while kiln read it?)",
				  path, what, (unsigned long long)off, (unsigned long long)(off + n - 1),
				  got, n, (unsigned long long)seen->size, now);
	}
	if (!stat_ok)
		return kiln_error(KILN_EIO, "%s: cannot stat after reading %s: %s", path, what,
				  strerror(errno));
	/* read whole, but from the file kiln opened?  (a rewrite in place
	 * to at least the old size reads in full, old bytes or new) */
	if ((uint64_t)sb.st_size != seen->size || mtime_ns(&sb) != seen->mtime_ns)
		return kiln_error(KILN_EDATA, "%s: changed while kiln read it (%s): it had %llu bytes, modified at %s, when kiln opened it, and has %lld bytes, modified at %s, now (rewritten in place?); run again once it is written whole (a writer that renames a new file over it, as kiln's do, is safe)",
				  path, what, (unsigned long long)seen->size,
				  ns_text(seen->mtime_ns, t0, sizeof t0), (long long)sb.st_size,
				  ns_text(mtime_ns(&sb), t1, sizeof t1));
	return KILN_OK;
}

/* What a file that is not a regular one is, for an error. */
static const char *file_kind(mode_t m)
{
	return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

kiln_status kiln_fopen_regular(const char *path, const char *mode, const char *verb, FILE **out)
{
	const int rw = strchr(mode, '+') ? O_RDWR : O_WRONLY;
	const int flags = mode[0] == 'r' ? O_RDONLY : mode[0] == 'w' ? rw | O_CREAT | O_TRUNC :
			  O_RDWR | O_CREAT | O_APPEND;
	struct stat sb;
	*out = NULL;
	/* O_NONBLOCK: opening a FIFO waits for its other end otherwise */
	int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0666);
	if (fd < 0 && errno == ENXIO && !stat(path, &sb)) /* a FIFO no one reads */
		return kiln_error(KILN_EIO, "%s: cannot %s: it is %s, not a regular file", path, verb,
				  file_kind(sb.st_mode));
	if (fd < 0)
		return kiln_error(KILN_EIO, "%s: cannot %s: %s", path, verb, strerror(errno));
	/* read: a pipe too (`kiln train <(...)`); written: a character
	 * device too (/dev/null, /dev/full) */
	if (fstat(fd, &sb) ||
	    !(S_ISREG(sb.st_mode) || (mode[0] == 'r' ? S_ISFIFO(sb.st_mode) : S_ISCHR(sb.st_mode)))) {
		close(fd);
		return kiln_error(KILN_EIO, "%s: cannot %s: it is %s, not a regular file", path, verb,
				  file_kind(sb.st_mode));
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) || !(*out = fdopen(fd, mode))) {
		int err = errno;
		close(fd);
		/* (fdopen's FILE is allocated: no memory is not a config error) */
		return kiln_error(err == ENOMEM ? KILN_ENOMEM : KILN_EIO, "%s: cannot %s: %s", path,
				  verb, strerror(err));
	}
	return KILN_OK;
}

void *kiln_grow(void *arr, int n, int *cap, size_t size, int first)
{
	if (n < *cap)
		return arr;
	int c = *cap ? *cap * 2 : first;
	void *p = realloc(arr, (size_t)c * size);
	if (p)
		*cap = c;
	return p;
}
