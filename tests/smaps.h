/* tests/smaps.h - this process's mappings as /proc/self/smaps lists them,
 * for the tests of the CPU plugin's huge-page buffers
 * (plugins/cpu/hugepage.c: tests/check_cpu_hugepage.c,
 * check_cpu_huge_alloc.c, check_cpu_wcache.c, check_cpu_wino.c,
 * check_cpu_split.c).
 *
 * A buffer's mapping advised with MADV_HUGEPAGE holds `hg` in its VmFlags
 * whatever the kernel's THP setting and however many huge pages are free
 * (AnonHugePages depends on both): the tests check the flag. */
#ifndef KILN_TESTS_SMAPS_H
#define KILN_TESTS_SMAPS_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* access */

/* one mapping: its range, VmFlags line and AnonHugePages (kB) */
struct vma {
	uintptr_t lo, hi;
	char flags[512];
	long anon_huge_kb;
};

/* 1 when VmFlags line `flags` holds the two-letter flag fl */
static inline int smaps_has_flag(const char *flags, const char *fl)
{
	for (const char *p = flags; (p = strstr(p, fl)); p += 2)
		if ((p == flags || p[-1] == ' ') && (p[2] == ' ' || p[2] == '\n' || !p[2]))
			return 1;
	return 0;
}

/* Calls fn(v, arg) for each mapping, in order; fn returns nonzero to
 * stop.  0, or -1 when /proc/self/smaps cannot be read. */
static inline int smaps_each(int (*fn)(const struct vma *v, void *arg), void *arg)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	struct vma v;
	int have = 0, stop = 0;
	if (!f)
		return -1;
	memset(&v, 0, sizeof v);
	while (!stop && fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		char dash;
		/* a mapping's first line: "lo-hi perms ..." (no key starts
		 * with hex digits and a dash) */
		if (sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-') {
			if (have)
				stop = fn(&v, arg);
			memset(&v, 0, sizeof v);
			v.lo = lo, v.hi = hi, have = 1;
		} else if (!strncmp(line, "VmFlags:", 8)) {
			snprintf(v.flags, sizeof v.flags, "%s", line + 8);
		} else if (!strncmp(line, "AnonHugePages:", 14)) {
			v.anon_huge_kb = atol(line + 14);
		}
	}
	if (have && !stop)
		fn(&v, arg);
	fclose(f);
	return 0;
}

struct smaps_find {
	uintptr_t a;
	struct vma *v;
	int found;
};

static inline int smaps_find_fn(const struct vma *v, void *arg)
{
	struct smaps_find *s = arg;
	if (s->a >= v->lo && s->a < v->hi) {
		*s->v = *v;
		s->found = 1;
	}
	return s->found;
}

/* the mapping that holds address a: 1 and *v; 0 when a is not mapped */
static inline int vma_of(const void *a, struct vma *v)
{
	struct smaps_find s = { (uintptr_t)a, v, 0 };
	memset(v, 0, sizeof *v);
	smaps_each(smaps_find_fn, &s);
	return s.found;
}

static inline int smaps_hg_fn(const struct vma *v, void *arg)
{
	if (smaps_has_flag(v->flags, "hg"))
		*(size_t *)arg += v->hi - v->lo;
	return 0;
}

/* the bytes of every mapping advised with MADV_HUGEPAGE (VmFlags hg) */
static inline size_t smaps_hg_bytes(void)
{
	size_t n = 0;
	smaps_each(smaps_hg_fn, &n);
	return n;
}

/* 1 when this kernel has transparent huge pages (else MADV_HUGEPAGE
 * fails with EINVAL and no mapping is ever hg) */
static inline int smaps_thp(void)
{
	return access("/sys/kernel/mm/transparent_hugepage", F_OK) == 0;
}

/* Whether this build is AddressSanitizer's (plugins/cpu/hugepage.c then
 * maps nothing of its own: every buffer is posix_memalign's) */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang's spelling */
#define SMAPS_ASAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) /* GCC's */
#define SMAPS_ASAN_BUILD 1
#endif

/* 1 in an AddressSanitizer build (every CPU buffer posix_memalign's there,
 * never a huge-page mapping), 0 elsewhere: for a plain `if` */
#ifdef SMAPS_ASAN_BUILD
#define SMAPS_ASAN 1
#else
#define SMAPS_ASAN 0
#endif

#endif
