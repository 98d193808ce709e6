/* tests/check_cpu_huge_alloc.c - the CPU plugin's one allocator of large
 * buffers (plugins/cpu/hugepage.c, linked into this program) on its own:
 *
 * - fork: a child forked while another thread allocates and frees large
 *   buffers (the list's lock held a good part of the time: 1024 mappings
 *   listed, each free scans them) allocates and frees a large buffer of
 *   its own and finds the parent's listed ones.  Without the lock taken
 *   around fork (pthread_atfork), a child forked while the other thread
 *   held it hangs in its first allocation (killed here after 10 s);
 * - the heap's pointers, a small buffer's and one on a 2 MiB boundary
 *   (which the list is searched for), freed and measured as the heap's.
 *
 * Skips (77) in an AddressSanitizer build, where every buffer is
 * posix_memalign's and there is no list nor lock.
 */
#include "plugins/cpu/cpu.h"

#include <check.h>
#include <malloc.h> /* malloc_usable_size */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check_main.h"
#include "smaps.h" /* vma_of, SMAPS_ASAN_BUILD */

#define LIVE 1024  /* large buffers listed while the children fork */
#define FORKS 300  /* children */
#define WAIT_MS 10000 /* a child's whole life, far above its milliseconds */

static volatile int stop;

/* large buffers made and freed until stop */
static void *churn(void *arg)
{
	long *n = arg;
	while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE)) {
		void *p = cpu_huge_alloc(64, CPU_HUGE);
		cpu_huge_free(p);
		__atomic_add_fetch(n, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

/* the child: a large buffer made, written and freed; the parent's first
 * listed buffer still listed.  Its exit status: 0, or what failed. */
static void child(void *first)
{
	void *p = cpu_huge_alloc(64, 3 * CPU_HUGE);
	if (!p)
		_exit(2);
	((char *)p)[3 * CPU_HUGE - 1] = 1;
	const int listed = cpu_huge_usable(first) == CPU_HUGE;
	cpu_huge_free(p);
	_exit(listed ? 0 : 3);
}

START_TEST(test_fork)
{
	static void *live[LIVE];
	for (int i = 0; i < LIVE; i++) {
		live[i] = cpu_huge_alloc(64, CPU_HUGE);
		ck_assert_msg(live[i] && (uintptr_t)live[i] % CPU_HUGE == 0, "buffer %d: %p", i, live[i]);
	}
	long made = 0;
	pthread_t th;
	stop = 0;
	ck_assert(pthread_create(&th, NULL, churn, &made) == 0);
	while (!__atomic_load_n(&made, __ATOMIC_RELAXED))
		usleep(100);
	int hung = 0, failed = 0, last = 0, forks = 0;
	for (; forks < FORKS && !hung && !failed; forks++) {
		fflush(NULL);
		const pid_t pid = fork();
		ck_assert(pid >= 0);
		if (!pid)
			child(live[0]);
		int ws = 0, ms = 0;
		pid_t w;
		while (!(w = waitpid(pid, &ws, WNOHANG)) && ms < WAIT_MS)
			usleep(1000), ms++;
		if (!w) { /* hung: the lock held for ever */
			kill(pid, SIGKILL);
			ck_assert(waitpid(pid, &ws, 0) == pid);
			hung = 1;
		} else if (w != pid || WIFSIGNALED(ws))
			failed = w != pid ? -1 : 128 + WTERMSIG(ws);
		else if (WEXITSTATUS(ws))
			failed = WEXITSTATUS(ws);
		last = ws;
	}
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	printf("%d children forked while %ld large buffers were made and freed\n", forks, made);
	ck_assert_msg(!hung, "child %d of %d still running after %d ms: it hung in its allocation "
			     "(the list's lock held at the fork)",
		      forks, FORKS, WAIT_MS);
	ck_assert_msg(!failed, "child %d: %d (2: no buffer, 3: the parent's not listed, 128 + a signal; %#x)",
		      forks, failed, last);
	for (int i = 0; i < LIVE; i++)
		cpu_huge_free(live[i]);
	struct vma v;
	/* nothing maps between the frees and this (the churn thread is done) */
	ck_assert_msg(!vma_of(live[0], &v), "the freed buffer at %p is still mapped [%#lx, %#lx)",
		      live[0], (unsigned long)v.lo, (unsigned long)v.hi);
}
END_TEST

/* the heap's: a small buffer and one on a 2 MiB boundary (not listed) */
START_TEST(test_heap_pointers)
{
	void *small = cpu_huge_alloc(64, 1000), *on = NULL;
	ck_assert_ptr_nonnull(small);
	ck_assert_uint_eq(cpu_huge_usable(small), malloc_usable_size(small));
	ck_assert_uint_ge(cpu_huge_usable(small), 1000);
	cpu_huge_free(small);
	ck_assert(posix_memalign(&on, CPU_HUGE, 4096) == 0);
	ck_assert_uint_eq(cpu_huge_usable(on), malloc_usable_size(on));
	cpu_huge_free(on); /* free()'s, or glibc aborts on a bad pointer */
	cpu_huge_free(NULL);
	ck_assert_uint_eq(cpu_huge_usable(NULL), 0);
}
END_TEST

static int huge_alloc_setup(void)
{
#ifdef SMAPS_ASAN_BUILD
	printf("SKIP: an AddressSanitizer build: plugins/cpu/hugepage.c lists and locks "
	       "nothing there (every buffer posix_memalign's)\n");
	return 77;
#else
	return 0;
#endif
}

static Suite *make_cpu_huge_alloc_suite(void)
{
	Suite *s = suite_create("cpu_huge_alloc");
	TCase *tc = tcase_create("huge_alloc");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_fork);
	tcase_add_test(tc, test_heap_pointers);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_huge_alloc_suite,
					       .setup = huge_alloc_setup };
