/* plugins/cpu/hugepage.c - the CPU device's large buffers on transparent
 * huge pages (session 46).
 *
 * Where the kernel's THP setting is `madvise` (the usual default), an
 * anonymous mapping gets 2 MiB pages only where it is advised with
 * MADV_HUGEPAGE, and glibc's malloc advises nothing: every buffer the
 * device allocates (activations, parameters, gradients, optimizer state,
 * the arena, workspaces) was on 4 KiB pages, one TLB entry per 4 KiB of a
 * GEMM's or an optimizer pass's stream.  cpu_huge_alloc maps a buffer of 2
 * MiB or more itself, its start on a 2 MiB boundary, and advises it; the
 * advice is only advice: where it fails (THP built out, a seccomp filter)
 * or the kernel has no huge page free, the buffer is the same memory on
 * small pages, and the allocation never fails because of it.
 *
 * No more memory than before: the mapping is the bytes asked for rounded
 * up to a page (the 2 MiB of alignment slack is unmapped at once), and
 * the last part of it short of a whole 2 MiB stays on small pages (a huge
 * page there would be memory the buffer did not ask for).  A buffer below
 * 2 MiB is posix_memalign's, as every buffer was before.
 *
 * The mappings are listed (address, length) so that cpu_huge_free knows
 * what to unmap and frees everything else with free().  The list holds
 * every live mapping: cpu_alloc's large buffers and every kept weight copy
 * of 2 MiB or more, so a large frozen model lists hundreds.  A buffer is
 * listed when it is made: at setup, except a widened bf16 weight's copy
 * (wcache.c, made at the weight's second read, in a step, once) and the
 * split GEMM's helper buffers (made again larger when a larger GEMM
 * comes, once per growth); it is unlisted when it is freed, mostly at
 * teardown.  A free (and cpu_huge_usable) of a pointer on a 2 MiB
 * boundary scans the list linearly under the lock: freeing n mappings
 * costs n^2 / 2 compares, a fraction of a millisecond for hundreds; none
 * of this is per step.
 * A mapping starts on a 2 MiB boundary, so a pointer off one is the
 * heap's: it is freed (or measured) without the lock or the list, and a
 * small buffer costs what posix_memalign and free cost (session 47: every
 * aligned buffer of the plugin comes from here, the kept weights'
 * copies and the GEMM helpers' buffers too, not only cpu_alloc's).
 *
 * fork(): the child has only the forking thread.  Were another thread
 * inside the list's lock at that moment, the child's lock would stay
 * held for ever and its first large allocation or free would hang.  kiln
 * itself forks only where no buffer of this file is touched after it
 * (`kiln launch` before any device, the registry's probe children, which
 * load plugin files and exit), but a program that embeds libkiln may fork
 * with a device open and use the CPU device in the child (a data-loading
 * worker, a test runner): the lock is taken around every fork, as
 * core/trainer.c does for its hook lock, so the child's is free and its
 * list (the same mappings, copied) right.
 *
 * Under AddressSanitizer every buffer is posix_memalign's, the large ones
 * too: a mapping of our own would have no redzones (an overrun past a
 * buffer's end would go unseen into the page's rest) and no leak check.
 * tests/check_cpu_hugepage skips in such a build.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#endif
#include "cpu.h"

#include <malloc.h>   /* malloc_usable_size */
#include <pthread.h>
#include <stdint.h>   /* uintptr_t */
#include <stdlib.h>   /* posix_memalign, realloc, free */
#include <sys/mman.h> /* mmap, munmap, madvise */
#include <unistd.h>   /* sysconf */

#if defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang's spelling */
#define CPU_HUGE_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) /* GCC's */
#define CPU_HUGE_ASAN 1
#endif

#ifndef CPU_HUGE_ASAN
struct huge_map {
	void *p;
	size_t len; /* mapped bytes: a whole number of pages */
};

static pthread_mutex_t huge_lock = PTHREAD_MUTEX_INITIALIZER;
static struct huge_map *huge_maps; /* [huge_n], the live mappings */
static size_t huge_n, huge_cap;

static void huge_fork_prepare(void) { pthread_mutex_lock(&huge_lock); }
static void huge_fork_parent(void) { pthread_mutex_unlock(&huge_lock); }
/* (the forking thread took it in prepare: its copy in the child is this
 * thread's to release) */
static void huge_fork_child(void) { pthread_mutex_unlock(&huge_lock); }

static pthread_once_t huge_fork_once = PTHREAD_ONCE_INIT;

static void huge_fork_register(void)
{
	/* (glibc drops these when the plugin is unloaded) */
	pthread_atfork(huge_fork_prepare, huge_fork_parent, huge_fork_child);
}

/* (p, len) listed: 0, or -1 when the list cannot grow */
static int huge_list(void *p, size_t len)
{
	int rc = 0;
	pthread_once(&huge_fork_once, huge_fork_register);
	pthread_mutex_lock(&huge_lock);
	if (huge_n == huge_cap) {
		const size_t cap = huge_cap ? 2 * huge_cap : 64;
		struct huge_map *m = realloc(huge_maps, cap * sizeof *m);
		if (m) {
			huge_maps = m;
			huge_cap = cap;
		}
	}
	if (huge_n < huge_cap)
		huge_maps[huge_n++] = (struct huge_map){ p, len };
	else
		rc = -1;
	pthread_mutex_unlock(&huge_lock);
	return rc;
}

/* p's mapped length, taken off the list when `take`; 0 when p is not
 * listed (at once, without the lock, when p is off a 2 MiB boundary:
 * the heap's) */
static size_t huge_find(const void *p, int take)
{
	size_t len = 0;
	if (!p || ((uintptr_t)p & (CPU_HUGE - 1)))
		return 0;
	pthread_once(&huge_fork_once, huge_fork_register);
	pthread_mutex_lock(&huge_lock);
	for (size_t i = 0; i < huge_n; i++)
		if (huge_maps[i].p == p) {
			len = huge_maps[i].len;
			if (take)
				huge_maps[i] = huge_maps[--huge_n];
			break;
		}
	pthread_mutex_unlock(&huge_lock);
	return len;
}

/* A mapping of len bytes (whole pages) starting on a CPU_HUGE boundary,
 * listed and advised; NULL when it cannot be made (the caller falls back
 * to the heap). */
static void *huge_map(size_t len)
{
	if (len > SIZE_MAX - CPU_HUGE)
		return NULL;
	const size_t span = len + CPU_HUGE;
	char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	char *p = (char *)(((uintptr_t)m + CPU_HUGE - 1) & ~(uintptr_t)(CPU_HUGE - 1));
	/* the slack before and after the aligned range, back at once */
	if (p > m)
		munmap(m, (size_t)(p - m));
	if (m + span > p + len)
		munmap(p + len, (size_t)(m + span - (p + len)));
	if (huge_list(p, len)) {
		munmap(p, len);
		return NULL;
	}
	/* Only whole 2 MiB blocks: a huge page over the tail would hold
	 * memory past the buffer.  The result is ignored: THP may be built
	 * out (EINVAL) or refused; the mapping is good without it. */
	const size_t whole = len & ~(CPU_HUGE - 1);
	(void)madvise(p, whole, MADV_HUGEPAGE);
	return p;
}

#endif /* !CPU_HUGE_ASAN */

void *cpu_huge_alloc(size_t align, size_t bytes)
{
	void *p = NULL;
#ifndef CPU_HUGE_ASAN
	if (bytes >= CPU_HUGE && align <= CPU_HUGE) {
		const long pg = sysconf(_SC_PAGESIZE);
		const size_t page = pg > 0 ? (size_t)pg : 4096;
		const size_t len = (bytes + page - 1) & ~(page - 1);
		if (len >= bytes && (p = huge_map(len)))
			return p;
	}
#endif
	return posix_memalign(&p, align, bytes ? bytes : align) ? NULL : p;
}

size_t cpu_huge_usable(void *p)
{
#ifndef CPU_HUGE_ASAN
	const size_t len = huge_find(p, 0);
	if (len)
		return len;
#endif
	return malloc_usable_size(p);
}

void cpu_huge_free(void *p)
{
#ifndef CPU_HUGE_ASAN
	const size_t len = huge_find(p, 1);
	if (len) {
		munmap(p, len);
		return;
	}
#endif
	free(p);
}
