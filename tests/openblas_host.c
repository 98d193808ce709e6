/* tests/openblas_host.c - `openblas_host LIB [--rlimit]`: a program that loaded
 * OpenBLAS (LIB, as a program linking libblas.so.3 has) before it opens a
 * kiln CPU device keeps that OpenBLAS as it was (plugins/cpu/openblas.c:
 * dlopen gives the cpu plugin the program's copy back).
 *
 * LIB is loaded with OPENBLAS_CORETYPE=Prescott (the kernels 0.3.21 takes
 * on a CPU it does not know), the variable then unset, as a program that
 * met an unknown CPU would be.  After kiln_device_open:
 *  - openblas_get_corename() names the core it named before (kiln did not
 *    choose again under the program's GEMMs), and, on the OpenMP build,
 *    the log advises OPENBLAS_CORETYPE=SkylakeX or Haswell;
 *  - the threads OpenBLAS's pthread build started as it loaded still run
 *    (kiln did not stop the program's pool);
 *  - a 3x4 by 4x2 cblas_sgemm of the program's gives the reference loop's
 *    numbers.
 * With --rlimit the device opens under an RLIMIT_AS that leaves it the
 * room its opening took in a child (forked after LIB loaded) and 48 MiB,
 * less than a load of OpenBLAS takes: kiln takes the program's copy, whose
 * buffers are mapped, all the same (the device line, at debug level, names
 * it on the OpenMP build; nothing says "not loaded: the address space
 * limit").  Before session 43 the limit was looked at before the program's
 * copy, and that copy was refused.
 * Exit 0 when all hold, 1 otherwise (with the reason), 77 where LIB does
 * not load or the CPU has neither AVX-512 nor AVX2 with FMA. */
#define _GNU_SOURCE
#include <kiln/kiln.h>
#include "proc_io.h" /* proc_value */

#include <dirent.h> /* /proc/self/task */
#include <dlfcn.h>
#include <malloc.h> /* mallopt: one arena */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h> /* setrlimit */
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h> /* getpid, fork, pipe */

static char logged[16384]; /* the "cpu" lines logged, one a line */

static void sink(void *user, int level, const char *who, const char *msg)
{
	(void)user, (void)level;
	if (!strcmp(who, "cpu") && strlen(logged) + strlen(msg) + 2 < sizeof logged)
		strcat(strcat(logged, msg), "\n");
}

/* the ids of this process's threads but the first, into t (at most n): their count */
static int threads(long *t, int n)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int k = 0;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' && atol(e->d_name) != (long)getpid() && k < n)
			t[k++] = atol(e->d_name);
	if (d)
		closedir(d);
	return k;
}

/* this process's address space, bytes (/proc/self/status VmSize) */
static unsigned long long vm_size(void)
{
	const long long kb = proc_value("/proc/self/status", "VmSize:");
	return kb > 0 ? (unsigned long long)kb << 10 : 0;
}

/* The address space a CPU device's opening adds to this process, as a
 * child forked now measures it (OpenBLAS shared, as it is here): 0 where
 * the child could not tell. */
static unsigned long long open_growth(void)
{
	int fd[2];
	unsigned long long d = 0;
	if (pipe(fd))
		return 0;
	const pid_t pid = fork();
	if (pid == 0) {
		struct kiln_registry *reg;
		struct kiln_device *dev;
		kiln_log_set_level(KILN_LOG_ERROR); /* (the parent's opening says it) */
		const unsigned long long v0 = vm_size();
		unsigned long long g = 0;
		if (!kiln_registry_open(NULL, &reg) && !kiln_device_open(reg, NULL, "cpu", 0, &dev))
			g = vm_size() - v0;
		(void)!write(fd[1], &g, sizeof g);
		_exit(0);
	}
	close(fd[1]);
	if (pid < 0 || read(fd[0], &d, sizeof d) != (ssize_t)sizeof d)
		d = 0;
	close(fd[0]);
	if (pid > 0)
		waitpid(pid, NULL, 0);
	return d;
}

static int fail(const char *lib, const char *what)
{
	fprintf(stderr, "openblas_host %s: %s\n", lib, what);
	fprintf(stderr, "the cpu log:\n%s", logged);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2 && (argc != 3 || strcmp(argv[2], "--rlimit"))) {
		fprintf(stderr, "usage: openblas_host LIBOPENBLAS [--rlimit]\n");
		return 2;
	}
	const char *lib = argv[1];
	const int limited = argc == 3;
	/* (one malloc arena: the threads' own 64 MiB reservations would make
	 * the room the opening needs under the limit a matter of timing) */
	mallopt(M_ARENA_MAX, 1);
	const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
					   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
				   ? "SkylakeX"
			   : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
											      : NULL;
	if (!want) {
		printf("SKIP: this CPU has neither AVX-512 nor AVX2 with FMA\n");
		return 77;
	}
	setenv("OPENBLAS_CORETYPE", "Prescott", 1);
	void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	unsetenv("OPENBLAS_CORETYPE");
	if (!h) {
		printf("SKIP: %s\n", dlerror());
		return 77;
	}
	char *(*corename)(void);
	int (*parallel)(void);
	void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int,
		      float, float *, int);
	*(void **)&corename = dlsym(h, "openblas_get_corename");
	*(void **)&parallel = dlsym(h, "openblas_get_parallel");
	*(void **)&sgemm = dlsym(h, "cblas_sgemm");
	if (!corename || !parallel || !sgemm)
		return fail(lib, "no openblas_get_corename, openblas_get_parallel or cblas_sgemm");
	char before[64];
	snprintf(before, sizeof before, "%s", corename());
	/* (measured first: the pthread build's pool is stopped and started
	 * anew around a fork, its pthread_atfork handlers) */
	const unsigned long long grow = limited ? open_growth() : 0;
	long pool[256];
	const int n_pool = threads(pool, 256); /* OpenBLAS's alone: kiln has started none */

	char what[512];
	struct rlimit was, lim;
	getrlimit(RLIMIT_AS, &was);
	unsigned long long room = 0;
	if (limited) {
		if (!grow)
			return fail(lib, "--rlimit: a child could not open the CPU device");
		room = grow + (48ULL << 20);
		lim = was;
		lim.rlim_cur = vm_size() + room;
		if (setrlimit(RLIMIT_AS, &lim))
			return fail(lib, "--rlimit: setrlimit(RLIMIT_AS) failed");
	}
	kiln_log_set_sink(sink, NULL);
	kiln_log_set_level(limited ? KILN_LOG_DEBUG : KILN_LOG_INFO);
	struct kiln_registry *reg;
	struct kiln_device *dev;
	if (kiln_registry_open(NULL, &reg) || kiln_device_open(reg, NULL, "cpu", 0, &dev)) {
		fprintf(stderr, "openblas_host: %s\n", kiln_last_error());
		return 1;
	}
	if (limited) {
		setrlimit(RLIMIT_AS, &was);
		if (strstr(logged, "address space limit")) {
			snprintf(what, sizeof what,
				 "under RLIMIT_AS %.0f MiB above the address space (what the device's "
				 "opening took, and 48), kiln refused the program's OpenBLAS for the "
				 "room a load of its own would take",
				 (double)room / 1048576.0);
			return fail(lib, what);
		}
		if (parallel() != 1 && !strstr(logged, "(OpenMP, ")) {
			snprintf(what, sizeof what,
				 "under RLIMIT_AS %.0f MiB above the address space, the device line "
				 "names no OpenBLAS", (double)room / 1048576.0);
			return fail(lib, what);
		}
	}
	if (strcmp(corename(), before)) {
		snprintf(what, sizeof what,
			 "OpenBLAS's core was %s before the CPU device opened, %s after: kiln chose "
			 "again under the program's own GEMMs",
			 before, corename());
		return fail(lib, what);
	}
	char advice[64];
	snprintf(advice, sizeof advice, "OPENBLAS_CORETYPE=%s set before the program starts", want);
	if (parallel() != 1 && !strcmp(before, "Prescott") && !strstr(logged, advice)) {
		snprintf(what, sizeof what, "the log does not advise \"%s\"", advice);
		return fail(lib, what);
	}
	for (int k = 0; k < n_pool; k++) {
		char p[64];
		struct stat st;
		snprintf(p, sizeof p, "/proc/self/task/%ld", pool[k]);
		if (stat(p, &st)) {
			snprintf(what, sizeof what,
				 "thread %ld, one of the %d OpenBLAS started as it loaded, is gone "
				 "after the CPU device opened: kiln stopped the program's pool",
				 pool[k], n_pool);
			return fail(lib, what);
		}
	}
	/* the program's GEMM: C (3x2) = A (3x4) B (4x2), row-major (101, 111: CblasRowMajor, CblasNoTrans) */
	float a[12], b[8], c[6], r[6];
	for (int i = 0; i < 12; i++)
		a[i] = (float)(i % 5) - 1.5f;
	for (int i = 0; i < 8; i++)
		b[i] = 0.25f * (float)i - 0.5f;
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 2; j++) {
			r[i * 2 + j] = 0;
			for (int k = 0; k < 4; k++)
				r[i * 2 + j] += a[i * 4 + k] * b[k * 2 + j];
		}
	sgemm(101, 111, 111, 3, 2, 4, 1.0f, a, 4, b, 2, 0.0f, c, 2);
	for (int i = 0; i < 6; i++)
		if (fabsf(c[i] - r[i]) > 1e-5f) {
			snprintf(what, sizeof what, "the program's sgemm: C[%d] = %g, the loop's %g", i,
				 c[i], r[i]);
			return fail(lib, what);
		}
	kiln_device_close(dev);
	kiln_registry_close(reg);
	printf("openblas_host %s: core %s kept, %d pool thread(s) kept, sgemm right%s", lib, before,
	       n_pool, parallel() != 1 && !strcmp(before, "Prescott") ? ", advice logged" : "");
	if (limited)
		printf("; under RLIMIT_AS %.0f MiB above the address space, shared", (double)room / 1048576.0);
	printf("\n");
	return 0;
}
