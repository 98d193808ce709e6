/* tests/check_cpu_hugepage.c - the CPU device's large buffers on
 * transparent huge pages (plugins/cpu/hugepage.c, session 46).
 *
 * A buffer of 2 MiB or more that the device allocates starts on a 2 MiB
 * boundary, in a mapping of its own advised with MADV_HUGEPAGE: the
 * mapping's VmFlags in /proc/self/smaps hold `hg` (the advice, set
 * whatever the kernel's THP setting and however many huge pages are free,
 * so the test does not depend on AnonHugePages, which does); a buffer
 * below 2 MiB is not advised; a freed one is unmapped.  Where the advice
 * is refused (a seccomp filter here makes madvise(MADV_HUGEPAGE) fail
 * with EINVAL, in a child of its own) the allocation still succeeds,
 * zeroed and writable, on small pages.
 *
 * Skips (77, with the reason) on a kernel without transparent huge pages
 * (no /sys/kernel/mm/transparent_hugepage: madvise(MADV_HUGEPAGE) fails
 * with EINVAL and no mapping is ever `hg`) and in an AddressSanitizer
 * build, where the device's large buffers are posix_memalign's.
 */
#include <kiln/kiln.h>

#include <check.h>
#include <errno.h>
#include <linux/filter.h>  /* struct sock_filter, BPF_* */
#include <linux/seccomp.h> /* SECCOMP_* */
#include <stddef.h>        /* offsetof */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>  /* madvise, MADV_HUGEPAGE */
#include <sys/prctl.h> /* PR_SET_NO_NEW_PRIVS */
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check_main.h"
#include "smaps.h" /* vma_of, smaps_has_flag */

#define MIB ((size_t)1 << 20)

static struct kiln_registry *reg;

static kiln_status open_cpu(int threads, struct kiln_config **cfg, struct kiln_device **dev)
{
	char ov[32];
	kiln_status st;
	snprintf(ov, sizeof ov, "run.threads=%d", threads);
	if ((st = kiln_config_new(cfg)) || (st = kiln_config_override(*cfg, ov)) ||
	    (st = kiln_config_override(*cfg, "plugin.cpu.tune_cache=none")))
		return st;
	return kiln_device_open(reg, *cfg, "cpu", 0, dev);
}

static int all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* 9 MiB and a bit (not a whole number of huge pages; above the size the
 * device zeroes with its thread team) and 1 MiB */
START_TEST(test_large_advised)
{
	struct kiln_config *cfg;
	struct kiln_device *dev;
	ck_assert_msg(open_cpu(2, &cfg, &dev) == KILN_OK, "%s", kiln_last_error());
	const size_t big_n = 9 * MIB + 100, small_n = MIB;
	void *big = NULL, *small = NULL;
	ck_assert_msg(kiln_device_alloc(dev, big_n, &big) == KILN_OK, "%s", kiln_last_error());
	ck_assert_msg(kiln_device_alloc(dev, small_n, &small) == KILN_OK, "%s", kiln_last_error());

	ck_assert_msg((uintptr_t)big % (2 * MIB) == 0, "a 9 MiB buffer at %p: not on a 2 MiB boundary",
		      big);
	/* its 4 whole huge pages (8 MiB) advised, the 1 MiB and 100 bytes
	 * past them not (a huge page there would hold memory the buffer did
	 * not ask for) */
	struct vma v, t;
	ck_assert_msg(vma_of(big, &v), "the buffer at %p is not mapped", big);
	ck_assert_msg(v.lo <= (uintptr_t)big && v.hi >= (uintptr_t)big + 8 * MIB,
		      "the buffer's first 8 MiB [%p, +8 MiB) are not in one mapping [%#lx, %#lx)", big,
		      (unsigned long)v.lo, (unsigned long)v.hi);
	ck_assert_msg(smaps_has_flag(v.flags, "hg"), "the 9 MiB buffer's mapping is not advised: VmFlags:%s",
		      v.flags);
	const char *last = (const char *)big + big_n - 1;
	ck_assert_msg(vma_of(last, &t), "the buffer's last byte %p is not mapped", (const void *)last);
	ck_assert_msg(!smaps_has_flag(t.flags, "hg"), "the buffer's last 1 MiB was advised: VmFlags:%s",
		      t.flags);
	ck_assert_msg(all_zero(big, big_n), "the 9 MiB buffer is not zeroed");
	printf("9 MiB buffer: mapping of %lu kB, AnonHugePages %ld kB, VmFlags:%s",
	       (unsigned long)((v.hi - v.lo) >> 10), v.anon_huge_kb, v.flags);

	struct vma s;
	ck_assert_msg(vma_of(small, &s), "the 1 MiB buffer at %p is not mapped", small);
	ck_assert_msg(!smaps_has_flag(s.flags, "hg"), "a 1 MiB buffer was advised: VmFlags:%s", s.flags);

	/* freed: unmapped at once */
	kiln_device_free(dev, big);
	ck_assert_msg(!vma_of(big, &v), "the freed 9 MiB buffer is still mapped [%#lx, %#lx)",
		      (unsigned long)v.lo, (unsigned long)v.hi);
	kiln_device_free(dev, small);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}
END_TEST

/* A seccomp filter on this process: madvise(..., MADV_HUGEPAGE) fails
 * with EINVAL, every other call as before.  0, or -1 with errno. */
static int refuse_hugepage_advice(void)
{
	struct sock_filter code[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
		/* the advice's low 32 bits (little-endian) */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_HUGEPAGE, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EINVAL & SECCOMP_RET_DATA)),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = sizeof code / sizeof code[0], .filter = code };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -1;
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

/* the child's half of test_refused: "" when every check held, else why */
static void refused_child(char *why, size_t n)
{
	/* the filter works: a mapping of our own cannot be advised */
	void *m = mmap(NULL, 2 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) {
		snprintf(why, n, "mmap: %s", strerror(errno));
		return;
	}
	errno = 0;
	if (madvise(m, 2 * MIB, MADV_HUGEPAGE) != -1 || errno != EINVAL) {
		snprintf(why, n, "the filter did not refuse madvise(MADV_HUGEPAGE): %s", strerror(errno));
		return;
	}
	munmap(m, 2 * MIB);

	struct kiln_config *cfg;
	struct kiln_device *dev;
	void *big = NULL;
	const size_t big_n = 9 * MIB + 100;
	if (open_cpu(1, &cfg, &dev) || kiln_device_alloc(dev, big_n, &big)) {
		snprintf(why, n, "with the advice refused: %s", kiln_last_error());
		return;
	}
	struct vma v;
	if (!all_zero(big, big_n))
		snprintf(why, n, "with the advice refused, the buffer is not zeroed");
	else if (!vma_of(big, &v) || v.lo > (uintptr_t)big || v.hi < (uintptr_t)big + big_n)
		snprintf(why, n, "with the advice refused, the buffer [%p, +%zu) is not one mapping", big,
			 big_n);
	else if (smaps_has_flag(v.flags, "hg"))
		snprintf(why, n, "the advice was refused, yet VmFlags:%.200s", v.flags);
	else {
		memset(big, 0x5a, big_n); /* writable, every byte */
		why[0] = 0;
	}
	kiln_device_free(dev, big);
	kiln_device_close(dev);
	kiln_config_free(cfg);
}

START_TEST(test_refused)
{
	int fd[2];
	ck_assert(pipe(fd) == 0);
	fflush(NULL);
	const pid_t pid = fork();
	ck_assert(pid >= 0);
	if (pid == 0) {
		char why[512] = "";
		close(fd[0]);
		if (refuse_hugepage_advice())
			snprintf(why, sizeof why, "cannot install the seccomp filter: %s", strerror(errno));
		else
			refused_child(why, sizeof why);
		const ssize_t w = write(fd[1], why, strlen(why));
		(void)w;
		_exit(why[0] != 0);
	}
	close(fd[1]);
	char why[512];
	const ssize_t r = read(fd[0], why, sizeof why - 1);
	why[r > 0 ? r : 0] = 0;
	close(fd[0]);
	int ws = 0;
	ck_assert(waitpid(pid, &ws, 0) == pid);
	ck_assert_msg(WIFEXITED(ws), "the child died (signal %d)", WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
	ck_assert_msg(WEXITSTATUS(ws) == 0, "%s", why);
}
END_TEST

/* 77 with the reason where nothing here can be checked, else 0 */
static int hugepage_setup(void)
{
#ifdef SMAPS_ASAN_BUILD
	printf("SKIP: an AddressSanitizer build: the CPU device's large buffers are "
	       "posix_memalign's, never huge-page mappings (plugins/cpu/hugepage.c)\n");
	return 77;
#else
	if (!smaps_thp()) {
		printf("SKIP: this kernel has no transparent huge pages "
		       "(/sys/kernel/mm/transparent_hugepage: %s): madvise(MADV_HUGEPAGE) "
		       "fails, no mapping is advised\n",
		       strerror(errno));
		return 77;
	}
	return 0;
#endif
}

static Suite *make_cpu_hugepage_suite(void)
{
	Suite *s = suite_create("cpu_hugepage");
	TCase *tc = tcase_create("hugepage");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_large_advised);
	tcase_add_test(tc, test_refused);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_hugepage_suite, .reg = &reg,
					       .need_cpu = 1, .omp_passive = 1,
					       .setup = hugepage_setup };
