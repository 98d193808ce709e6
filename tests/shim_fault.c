/* tests/shim_fault.c - the LD_PRELOAD shim of the shell tests that make
 * the system fail kiln on purpose, built by tests/lib.sh's shim_build.
 * One source, each fault chosen by environment variables, none by default
 * (every call goes through unchanged).  It acts in kiln's own process only
 * (the executable kiln or lt-kiln), not in the libtool wrapper's shell or
 * in `timeout`.
 *
 * Allocations (tests/alloc_fail.sh, tests/oom_named.sh): malloc, calloc,
 * realloc (not to 0 bytes), posix_memalign, aligned_alloc and memalign
 * return "out of memory" for the SHIM_ALLOC_NTH'th allocation (1, 2, ...;
 * unset: none) counted among those that pass every filter set:
 *   SHIM_ALLOC_BYTES   of this many bytes (unset or -1: any size);
 *   SHIM_ALLOC_FROM    asked for by code in a library whose path holds
 *                      this text (dladdr of the caller: "/kiln-cpu.so");
 *   SHIM_ALLOC_DLOPEN  made inside a dlopen() of a path holding this text
 *                      (the library's loading and constructors);
 *   SHIM_ALLOC_MAIN=1  made on the process's main thread (other threads'
 *                      allocations would make the order vary from run to
 *                      run: tests/dist_config_oom.sh);
 * and SHIM_ALLOC_HIT names a file created when the failure happened (a
 * sweep over N ends at the first N that nothing reached).
 *
 * Writes (tests/short_writes.sh): SHIM_PWRITE_CUT=1 fails every other
 * pwrite()/pwrite64() of more than one byte with EINTR, the first
 * included, and lets the others write half of what they ask.
 *
 * Reads (tests/idx_eintr.sh): SHIM_READ_PATH=TEXT does the same to every
 * read(), pread() and pread64() of a file whose path holds TEXT (at least
 * one byte transferred: a read of one byte is counted, and not cut).
 *
 * Truncation (tests/st_truncate.sh): SHIM_TRUNC_PATH=TEXT cuts the file
 * whose path holds TEXT to SHIM_TRUNC_SIZE bytes (once, with truncate())
 * as kiln first maps it (mmap(), mmap64()) or reads it past byte
 * SHIM_TRUNC_PAST (a pread() or pread64() whose range ends beyond it): the
 * file rewritten in place after kiln opened it and took its size, before
 * its data is read.
 *
 * Clock (tests/json_nonfinite.sh): SHIM_CLOCK_STOP=1 stops CLOCK_MONOTONIC
 * at 1000 s: every call returns the same time.
 *
 * Opens (tests/init_from_once.sh, tests/trained_no_data.sh): each open(),
 * open64(), openat() or openat64() of a path that begins with
 * SHIM_OPEN_PREFIX is a line of SHIM_OPEN_LOG (the path); at the
 * SHIM_OPEN_AT'th of them the file is first removed (SHIM_OPEN_DO=rm) or
 * SHIM_OPEN_WITH renamed over it (SHIM_OPEN_DO=swap). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>  /* snprintf */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* glibc's own allocator: what an allocation that is not failed gets
 * (dlsym would allocate, so not the RTLD_NEXT malloc) */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static long alloc_at = 0, alloc_bytes = -1, alloc_count = 0;
static const char *alloc_from, *alloc_dlopen, *alloc_hit;
static int pwrite_cut, clock_stop, alloc_main;
static const char *read_path, *open_prefix, *trunc_path;
static long long trunc_size, trunc_past;
static __thread int in_dlopen, in_dladdr;

static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_dlopen)(const char *, int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_pread)(int, void *, size_t, off_t);
static ssize_t (*real_pread64)(int, void *, size_t, off_t);
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_clock_gettime)(clockid_t, struct timespec *);

/* the next definition of NAME, resolved once (in the constructor; lazily
 * where a library's constructor calls it before ours has run) */
#define REAL(ptr, name) ((ptr) ? (ptr) : (*(void **)&(ptr) = dlsym(RTLD_NEXT, name), (ptr)))

/* 1 where this process runs kiln's executable */
static int is_kiln(void)
{
	char exe[4096];
	const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return 0;
	exe[n] = 0;
	const char *b = strrchr(exe, '/');
	b = b ? b + 1 : exe;
	return !strcmp(b, "kiln") || !strcmp(b, "lt-kiln");
}

__attribute__((constructor)) static void shim_init(void)
{
	REAL(real_posix_memalign, "posix_memalign");
	REAL(real_dlopen, "dlopen");
	REAL(real_pwrite, "pwrite");
	REAL(real_pwrite64, "pwrite64");
	REAL(real_clock_gettime, "clock_gettime");
	REAL(real_read, "read");
	REAL(real_pread, "pread");
	REAL(real_pread64, "pread64");
	REAL(real_mmap, "mmap");
	REAL(real_mmap64, "mmap64");
	if (!is_kiln())
		return;
	const char *s;
	if ((s = getenv("SHIM_ALLOC_BYTES")))
		alloc_bytes = atol(s);
	alloc_from = getenv("SHIM_ALLOC_FROM");
	alloc_dlopen = getenv("SHIM_ALLOC_DLOPEN");
	alloc_hit = getenv("SHIM_ALLOC_HIT");
	alloc_main = (s = getenv("SHIM_ALLOC_MAIN")) && atoi(s);
	pwrite_cut = (s = getenv("SHIM_PWRITE_CUT")) && atoi(s);
	clock_stop = (s = getenv("SHIM_CLOCK_STOP")) && atoi(s);
	read_path = getenv("SHIM_READ_PATH");
	open_prefix = getenv("SHIM_OPEN_PREFIX");
	if ((trunc_path = getenv("SHIM_TRUNC_PATH"))) {
		trunc_size = (s = getenv("SHIM_TRUNC_SIZE")) ? atoll(s) : 0;
		trunc_past = (s = getenv("SHIM_TRUNC_PAST")) ? atoll(s) : 0;
	}
	if ((s = getenv("SHIM_ALLOC_NTH"))) /* last: the filters are in place */
		alloc_at = atol(s);
}

/* 1 where the allocation of n bytes asked for from ra is the one to fail */
static int alloc_fails(size_t n, void *ra)
{
	if (alloc_at <= 0 || in_dladdr || (alloc_dlopen && !in_dlopen) ||
	    (alloc_bytes >= 0 && n != (size_t)alloc_bytes) || (alloc_main && gettid() != getpid()))
		return 0;
	if (alloc_from) {
		Dl_info di;
		in_dladdr = 1; /* (dladdr may allocate) */
		const int ours = dladdr(ra, &di) && di.dli_fname && strstr(di.dli_fname, alloc_from);
		in_dladdr = 0;
		if (!ours)
			return 0;
	}
	if (__atomic_add_fetch(&alloc_count, 1, __ATOMIC_RELAXED) != alloc_at)
		return 0;
	if (alloc_hit) {
		const int fd = open(alloc_hit, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0)
			close(fd);
	}
	errno = ENOMEM;
	return 1;
}

/* (the caller's address is taken here, in the function it called) */
#define CALLER __builtin_return_address(0)

void *malloc(size_t n)
{
	return alloc_fails(n, CALLER) ? NULL : __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
	return alloc_fails(k * n, CALLER) ? NULL : __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
	return n && alloc_fails(n, CALLER) ? NULL : __libc_realloc(p, n);
}

int posix_memalign(void **p, size_t a, size_t n)
{
	if (alloc_fails(n, CALLER))
		return ENOMEM;
	return REAL(real_posix_memalign, "posix_memalign")(p, a, n);
}

void *aligned_alloc(size_t a, size_t n)
{
	return alloc_fails(n, CALLER) ? NULL : __libc_memalign(a, n);
}

void *memalign(size_t a, size_t n)
{
	return alloc_fails(n, CALLER) ? NULL : __libc_memalign(a, n);
}

void *dlopen(const char *path, int flags)
{
	const int mine = alloc_dlopen && path && strstr(path, alloc_dlopen);
	in_dlopen += mine;
	void *h = REAL(real_dlopen, "dlopen")(path, flags);
	in_dlopen -= mine;
	return h;
}

/* 1: fail this call with EINTR, every other one counted by *calls (the
 * first included); else *n halved (a byte left as it is) */
static int cut(int *calls, size_t *n)
{
	if (__atomic_fetch_add(calls, 1, __ATOMIC_RELAXED) % 2 == 0) {
		errno = EINTR;
		return 1;
	}
	if (*n > 1)
		*n /= 2;
	return 0;
}

static int pwrite_cuts(size_t *n)
{
	static int calls;
	return pwrite_cut && *n > 1 && cut(&calls, n);
}

/* fd's path into p (n bytes): 0, or -1 */
static int fd_path(int fd, char *p, size_t n)
{
	char l[64];
	snprintf(l, sizeof l, "/proc/self/fd/%d", fd);
	const ssize_t k = readlink(l, p, n - 1);
	if (k <= 0)
		return -1;
	p[k] = 0;
	return 0;
}

/* a read of fd, whose path holds SHIM_READ_PATH: cut */
static int read_cuts(int fd, size_t *n)
{
	static int calls;
	char p[4096];
	return read_path && !fd_path(fd, p, sizeof p) && strstr(p, read_path) && cut(&calls, n);
}

/* fd mapped, or read up to byte `end`: its file cut to SHIM_TRUNC_SIZE
 * bytes first, once, when its path holds SHIM_TRUNC_PATH and end is
 * past SHIM_TRUNC_PAST */
static void trunc_at(int fd, long long end)
{
	static int done;
	char p[4096];
	if (!trunc_path || fd < 0 || end <= trunc_past || fd_path(fd, p, sizeof p) ||
	    !strstr(p, trunc_path) || __atomic_exchange_n(&done, 1, __ATOMIC_RELAXED))
		return;
	if (truncate(p, (off_t)trunc_size))
		fprintf(stderr, "shim_fault: truncate %s: %s\n", p, strerror(errno));
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite_cuts(&n) ? -1 : REAL(real_pwrite, "pwrite")(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
	return pwrite_cuts(&n) ? -1 : REAL(real_pwrite64, "pwrite64")(fd, buf, n, off);
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
	if (!clock_stop || id != CLOCK_MONOTONIC)
		return REAL(real_clock_gettime, "clock_gettime")(id, ts);
	ts->tv_sec = 1000;
	ts->tv_nsec = 0;
	return 0;
}

ssize_t read(int fd, void *b, size_t n)
{
	return read_cuts(fd, &n) ? -1 : REAL(real_read, "read")(fd, b, n);
}

ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	trunc_at(fd, (long long)off + (long long)n);
	return read_cuts(fd, &n) ? -1 : REAL(real_pread, "pread")(fd, b, n, off);
}

ssize_t pread64(int fd, void *b, size_t n, off_t off)
{
	trunc_at(fd, (long long)off + (long long)n);
	return read_cuts(fd, &n) ? -1 : REAL(real_pread64, "pread64")(fd, b, n, off);
}

void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
	void *m = REAL(real_mmap, "mmap")(a, n, prot, flags, fd, off);
	if (m != MAP_FAILED)
		trunc_at(fd, (long long)off + (long long)n);
	return m;
}

void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off)
{
	void *m = REAL(real_mmap64, "mmap64")(a, n, prot, flags, fd, off);
	if (m != MAP_FAILED)
		trunc_at(fd, (long long)off + (long long)n);
	return m;
}

/* An open of path: logged, and the file removed or replaced at the
 * SHIM_OPEN_AT'th, when path begins with SHIM_OPEN_PREFIX (in kiln) */
static void open_seen(const char *path)
{
	static int opens;
	if (!open_prefix || !path || strncmp(path, open_prefix, strlen(open_prefix)))
		return;
	const int n = __atomic_add_fetch(&opens, 1, __ATOMIC_RELAXED);
	const char *log = getenv("SHIM_OPEN_LOG"), *at = getenv("SHIM_OPEN_AT");
	const char *what = getenv("SHIM_OPEN_DO"), *with = getenv("SHIM_OPEN_WITH");
	FILE *f = log ? fopen(log, "a") : NULL; /* (fopen does not come back here) */
	if (f) {
		fprintf(f, "%s\n", path);
		fclose(f);
	}
	if (!at || atoi(at) != n || !what)
		return;
	if (!strcmp(what, "rm"))
		unlink(path);
	else if (!strcmp(what, "swap") && with)
		rename(with, path);
}

/* open's mode argument is there only with O_CREAT or O_TMPFILE */
#define OPEN_SHIM(NAME, CALL, ...)                                              \
	int NAME(__VA_ARGS__, int flags, ...)                                  \
	{                                                                      \
		static int (*real)();                                          \
		mode_t mode = 0;                                               \
		if (flags & (O_CREAT | O_TMPFILE)) {                           \
			va_list ap;                                            \
			va_start(ap, flags);                                   \
			mode = va_arg(ap, mode_t);                             \
			va_end(ap);                                            \
		}                                                              \
		REAL(real, #NAME);                                             \
		open_seen(path);                                               \
		return CALL;                                                   \
	}
OPEN_SHIM(open, real(path, flags, mode), const char *path)
OPEN_SHIM(open64, real(path, flags, mode), const char *path)
OPEN_SHIM(openat, real(dirfd, path, flags, mode), int dirfd, const char *path)
OPEN_SHIM(openat64, real(dirfd, path, flags, mode), int dirfd, const char *path)
