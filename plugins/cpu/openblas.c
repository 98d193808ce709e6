/* plugins/cpu/openblas.c - OpenBLAS (its OpenMP build), the f32 GEMMs'
 * second library (gemm.c; fftconv.c's per-frequency GEMMs), loaded with
 * dlopen when the first CPU device opens, not with the plugin.
 *
 * Why not linked: OpenBLAS 0.3.21 maps a 128 MiB buffer for each thread
 * it counts as it loads (its constructor, gotoblas_init: the CPUs of the
 * affinity mask, or OMP_NUM_THREADS), and where RLIMIT_AS (ulimit -v)
 * refuses one it retries forever (blas_memory_alloc's loop).  Linked, that
 * was a hang inside the dlopen of kiln-cpu.so below about 350 MB on 2
 * CPUs (the probe child's and then kiln's own), before any kiln code could
 * say why.  Loaded here, the address space is looked at first: where the
 * limit leaves less than the library takes as it loads, plus the room
 * oneDNN's JIT code keeps (cpu_as_short), it is not loaded and its GEMMs
 * run on oneDNN (`gemm_impl = openblas` is then an error saying so).
 * Each thread's first OpenBLAS GEMM maps a buffer more (its pool's): under
 * RLIMIT_AS the plans that call it map the team's at prepare
 * (cpu_openblas_ready), else their GEMMs run on oneDNN too: before session
 * 41 an FFT convolution that found less in its first step hung there.
 *
 * The library is found as the linked one was: libopenblas.so.0 through
 * LD_LIBRARY_PATH, then the plugin's run path (configure's OpenMP build
 * directory; glibc's dlopen searches the DT_RUNPATH of the object that
 * calls it, this one), then ld.so's cache.
 *
 * Its kernels: OpenBLAS's DYNAMIC_ARCH build (Debian's) picks them as it
 * loads from the CPU's family and model, and one it does not know gets
 * its most generic, Prescott's (SSE3): 0.3.21 on an Emerald Rapids
 * (family 6, model 207) ran the FFT convolution's per-frequency GEMMs
 * there.  Where it reports Prescott on a CPU whose CPUID says AVX-512 or
 * AVX2 and FMA, and OPENBLAS_CORETYPE is not set, ob_core_pick has it
 * choose again as that variable makes it choose at load (SkylakeX or
 * Haswell), and the device's opening says so once, at debug level
 * (cpu_openblas_said; the device line names the core at that level too:
 * before session 43 it was an INFO line on the stderr of every command
 * that opened a CPU device, `kiln plugins` included).  A CPU it knows
 * keeps its choice, and its kernels' bits.  To choose,
 * the first CPU device's opening sets OPENBLAS_CORETYPE in the process's
 * environment for the moment OpenBLAS reads it, and unsets it again:
 * only where OpenBLAS reports Prescott, the variable is unset and the
 * library was not loaded before; an embedding program that sets
 * OPENBLAS_CORETYPE itself keeps its environment untouched.
 *
 * Where the program had already loaded libopenblas.so.0 (one linking
 * Debian's libblas.so.3 or liblapack.so.3, or -lopenblas), dlopen gives
 * that copy back: then nothing of it is changed (no core chosen again,
 * under the program's own GEMMs; no pthread pool stopped), and the
 * opening advises OPENBLAS_CORETYPE instead (ob_core_pick).  Its buffers
 * are mapped already, so RLIMIT_AS does not keep kiln from it (ob_short
 * is for a copy kiln loads).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "cpu.h"

#include <limits.h> /* ULLONG_MAX */
#include <pthread.h>
#include <sched.h>  /* sched_getaffinity, CPU_COUNT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#include <unistd.h> /* sysconf */
#if HAVE_OPENBLAS
#include <cblas.h> /* cblas_sgemm's and openblas_*'s prototypes, OPENBLAS_VERSION */
#include <dlfcn.h>
#endif

/* What OpenBLAS 0.3.21 maps for each thread's buffer as it loads: a
 * malloc of BUFFER_SIZE (128 MiB on x86-64) plus GEMM_OFFSET_A's 4 KiB,
 * which glibc maps with its own page of header: 134225920 bytes (gdb,
 * session 41). */
#define OB_BUFFER ((unsigned long long)134225920)
/* and its own mappings beside them (text, data, libgfortran): VmSize grew
 * by 39.2 MiB more than its two buffers as it loaded here (session 41) */
#define OB_LIBRARY ((unsigned long long)48 << 20)
/* left after it: the room the device keeps free for oneDNN's JIT code
 * (dnn.c, CPU_JIT_ROOM), without which no primitive is made */
#define OB_KEEP ((unsigned long long)16 << 20)

#if HAVE_OPENBLAS
static struct {
	__typeof__(cblas_sgemm) *sgemm;
	__typeof__(openblas_get_parallel) *get_parallel;
	__typeof__(openblas_get_corename) *get_corename;
	/* its buffer pool (driver/others/memory.c, exported): a free buffer,
	 * mapped where none is; given back, kept for the next */
	void *(*mem_alloc)(int procpos);
	void (*mem_free)(void *buffer);
} ob;
/* under RLIMIT_AS: the buffers in OpenBLAS's pool, free between GEMMs,
 * that cpu_openblas_ready has mapped (under ob_pool_lock) */
static int ob_pool;
static pthread_mutex_t ob_pool_lock = PTHREAD_MUTEX_INITIALIZER;
static char ob_text[640];  /* ob_why's text when it is made here */
static char ob_core[640];  /* the kernels chosen for OpenBLAS, where not its own choice, or the
			    * advice where kiln cannot choose (said once) */
static int ob_chose;       /* ob_core says what kiln chose (a debug line), not advice (INFO) */
#endif
static const char *ob_why; /* NULL: loaded and usable */
static int ob_by_limit;    /* not loaded for RLIMIT_AS's sake (said once: cpu_openblas_said) */

#if HAVE_OPENBLAS
/* The threads OpenBLAS's OpenMP build allocates a buffer for as it loads
 * (its blas_get_cpu_number): OMP_NUM_THREADS's leading number where that
 * is positive, else every CPU, at most the CPUs of the affinity mask. */
static long ob_load_threads(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_CONF);
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 &&
	    CPU_COUNT(&set) < cpus)
		cpus = CPU_COUNT(&set);
	cpus = cpus > 0 ? cpus : 1;
	const char *e = getenv("OMP_NUM_THREADS");
	const long n = e ? atol(e) : 0;
	return n > 0 && n < cpus ? n : cpus;
}

/* 1 where RLIMIT_AS leaves less than OpenBLAS takes as it loads and the
 * room oneDNN keeps (ob_text saying so), else 0 */
static int ob_short(void)
{
	const unsigned long long room = cpu_as_room();
	const long n = ob_load_threads();
	const unsigned long long need = (unsigned long long)n * OB_BUFFER + OB_LIBRARY + OB_KEEP;
	if (room == ULLONG_MAX || room >= need)
		return 0;
	snprintf(ob_text, sizeof ob_text,
		 "not loaded: the address space limit (RLIMIT_AS, ulimit -v) leaves %.0f MiB, below the %.0f MiB "
		 "the cpu plugin's BLAS (OpenBLAS) needs: 128 MiB for each of the %ld threads it counts "
		 "as it loads (the CPUs, or OMP_NUM_THREADS), %llu MiB of library and %llu MiB kept for "
		 "oneDNN's JIT code; where the limit refuses a buffer, OpenBLAS 0.3.21 retries forever "
		 "(docs/memory.md, \"Under ulimit -v\")",
		 (double)room / 1048576.0, (double)need / 1048576.0, n, OB_LIBRARY >> 20, OB_KEEP >> 20);
	return 1;
}

/* The kernels OpenBLAS's DYNAMIC_ARCH build should take on this CPU by
 * its CPUID where OpenBLAS did not know it: SkylakeX's (AVX-512 F, BW,
 * DQ, VL: what they use), Haswell's (AVX2, FMA), else NULL */
static const char *ob_core_for_cpu(void)
{
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
		return "SkylakeX";
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return "Haswell";
	return NULL;
}

/* Where OpenBLAS (h) took its Prescott kernels, as 0.3.21 does on a CPU
 * it does not know, though this one has AVX-512 or AVX2, and the user
 * did not choose (OPENBLAS_CORETYPE unset): its core chosen again
 * (gotoblas_dynamic_quit, then gotoblas_dynamic_init, which reads
 * OPENBLAS_CORETYPE as its constructor does; set for that call only, so
 * that children and later readers see the environment as it was), and
 * ob_core saying so.  Where the program loaded it before kiln (`theirs`),
 * or it is not a DYNAMIC_ARCH build (no gotoblas_dynamic_init; it names
 * its one core in capitals, "PRESCOTT", and ignores OPENBLAS_CORETYPE),
 * nothing is changed and ob_core says what would choose.  Called once,
 * before any GEMM of kiln's, by ob_load alone. */
static void ob_core_pick(void *h, int theirs)
{
	const char *want = ob_core_for_cpu();
	if (strcasecmp(ob.get_corename(), "Prescott") || getenv("OPENBLAS_CORETYPE") || !want)
		return;
	const char *isa = strcmp(want, "SkylakeX") ? "AVX2 and FMA" : "AVX-512";
	void (*quit)(void), (*init)(void);
	*(void **)&quit = dlsym(h, "gotoblas_dynamic_quit");
	*(void **)&init = dlsym(h, "gotoblas_dynamic_init");
	if (!quit || !init) {
		snprintf(ob_core, sizeof ob_core,
			 "OpenBLAS runs its Prescott (SSE3) kernels on this CPU, which has %s: this "
			 "OpenBLAS is not a DYNAMIC_ARCH build (no gotoblas_dynamic_init), so neither "
			 "kiln nor OPENBLAS_CORETYPE can choose others; one built with DYNAMIC_ARCH=1 "
			 "(Debian's libopenblas0-openmp) or for this CPU (TARGET=%s) has them "
			 "(docs/plugins.md)",
			 isa, strcmp(want, "SkylakeX") ? "HASWELL" : "SKYLAKEX");
		return;
	}
	if (theirs) {
		snprintf(ob_core, sizeof ob_core,
			 "OpenBLAS runs its Prescott (SSE3) kernels on this CPU, which has %s: the "
			 "program loaded it before kiln, so kiln leaves its kernels as they are (they "
			 "serve the program's own GEMMs too); OPENBLAS_CORETYPE=%s set before the "
			 "program starts makes it choose %s's as it loads (docs/plugins.md)",
			 isa, want, want);
		return;
	}
	setenv("OPENBLAS_CORETYPE", want, 1);
	quit();
	init();
	unsetenv("OPENBLAS_CORETYPE");
	ob_chose = 1;
	snprintf(ob_core, sizeof ob_core,
		 "OpenBLAS took its Prescott (SSE3) kernels on this CPU, which it does not know; the "
		 "CPU has %s, so kiln had it choose %s: it runs %s's kernels (OPENBLAS_CORETYPE, where "
		 "set, chooses instead: docs/plugins.md)",
		 isa, want, ob.get_corename());
}
#endif

static void ob_load(void)
{
#if HAVE_OPENBLAS
	/* the program's own copy, where it loaded one before (linked, or
	 * through libblas.so.3): kiln shares it and changes nothing of it */
	void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
	const int theirs = h != NULL;
	/* a copy to load: only where RLIMIT_AS leaves it room (the program's
	 * mapped its buffers as it loaded: before session 43 it was refused
	 * too where the limit left less than a load takes) */
	if (!h && ob_short()) {
		ob_why = ob_text;
		ob_by_limit = 1;
		return;
	}
	if (!h)
		h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
	if (h) {
		*(void **)&ob.sgemm = dlsym(h, "cblas_sgemm");
		*(void **)&ob.get_parallel = dlsym(h, "openblas_get_parallel");
		*(void **)&ob.get_corename = dlsym(h, "openblas_get_corename");
		*(void **)&ob.mem_alloc = dlsym(h, "blas_memory_alloc");
		*(void **)&ob.mem_free = dlsym(h, "blas_memory_free");
	}
	if (!h || !ob.sgemm || !ob.get_parallel || !ob.get_corename) {
		const char *e = dlerror();
		snprintf(ob_text, sizeof ob_text, "libopenblas.so.0 did not load: %s",
			 e ? e : "cblas_sgemm, openblas_get_parallel or openblas_get_corename missing");
		ob_why = ob_text;
		return; /* (h, if any, stays: nothing of it runs) */
	}
	/* 0 sequential, 1 pthreads, 2 OpenMP: the library ld.so found (the
	 * Debian alternatives may point libopenblas.so.0 at another flavour
	 * than configure found) */
	if (ob.get_parallel() == 1) {
		ob_why = "the OpenBLAS loaded is its pthread build (a thread pool of its own beside "
			 "kiln's OpenMP team): install libopenblas0-openmp, or "
			 "update-alternatives --config libopenblas.so.0-x86_64-linux-gnu";
		/* its pool, started as it loaded: each thread maps its 128 MiB
		 * buffer when it first runs, after dlopen returned (VmSize 49 ->
		 * 177 MiB in 300 ms here), and under RLIMIT_AS that mapping in
		 * the middle of oneDNN's JIT crashed it (6 of 14 runs, session
		 * 41).  Stopped now (joined: what they map is mapped when this
		 * returns), so no thread of it runs beside kiln's.  The join
		 * waits for each thread's first mapping: under an RLIMIT_AS
		 * that ob_short passed but that refuses one (a limit tighter
		 * than its estimate, OB_BUFFER and OB_LIBRARY), OpenBLAS
		 * retries that mapping forever, and this hangs.  A pool the
		 * program started (theirs) is its own: left running */
		int (*stop)(void);
		*(void **)&stop = dlsym(h, "blas_thread_shutdown_");
		if (stop && !theirs)
			stop();
	} else {
		ob_core_pick(h, theirs);
	}
#else
	ob_why = "this build has no OpenBLAS (configure --with-openblas; apt-get install "
		 "libopenblas-openmp-dev)";
#endif
}

const char *cpu_openblas_check(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, ob_load);
	return ob_why;
}

void cpu_openblas_said(const struct kiln_host *host)
{
	static int said;
	const char *no = cpu_openblas_check();
	const char *core = NULL; /* the kernels kiln chose for it, or advice (ob_core_pick) */
	int level = KILN_LOG_INFO;
#if HAVE_OPENBLAS
	core = !no && ob_core[0] ? ob_core : NULL;
	/* kiln's own choice is no news to act on: debug, beside the device
	 * line that names the core; advice (a program's own OpenBLAS, a build
	 * without DYNAMIC_ARCH) is for the user: INFO */
	if (core && ob_chose)
		level = KILN_LOG_DEBUG;
#endif
	if (!(no && ob_by_limit) && !core)
		return;
	if (__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL))
		return;
	if (core)
		host->log(level, "cpu", "%s", core);
	else
		host->log(KILN_LOG_INFO, "cpu", "OpenBLAS %s; its GEMMs run on oneDNN", ob_why);
}

/* Under RLIMIT_AS, OpenBLAS's pool holds `threads` free buffers, mapped
 * now: 0; or 1 with why (n bytes) where the limit leaves less than the
 * buffers still to map and OB_KEEP.  (Without a limit, or without the
 * pool's entry points, 0: the buffers are mapped at the first GEMMs.) */
static int ob_pool_fill(int threads, char *why, size_t n)
{
#if HAVE_OPENBLAS
	if (cpu_as_room() == ULLONG_MAX || !ob.mem_alloc || !ob.mem_free || threads > 256)
		return 0;
	pthread_mutex_lock(&ob_pool_lock);
	int st = 0;
	if (threads > ob_pool) {
		const unsigned long long room = cpu_as_room();
		const unsigned long long need = (unsigned long long)(threads - ob_pool) * OB_BUFFER + OB_KEEP;
		if (room < need) {
			snprintf(why, n,
				 "OpenBLAS's GEMM buffers for the team's %d threads (128 MiB each, %d mapped) do not fit the %.0f MiB of address space RLIMIT_AS (ulimit -v) leaves with the %llu MiB kept for oneDNN's JIT code; where the limit refuses one in a step, OpenBLAS 0.3.21 retries forever",
				 threads, ob_pool, (double)room / 1048576.0, OB_KEEP >> 20);
			st = 1;
		} else {
			void *b[256];
			for (int k = 0; k < threads; k++)
				b[k] = ob.mem_alloc(0);
			for (int k = 0; k < threads; k++)
				ob.mem_free(b[k]);
			ob_pool = threads;
		}
	}
	pthread_mutex_unlock(&ob_pool_lock);
	return st;
#else
	(void)threads, (void)why, (void)n;
	return 0;
#endif
}

const char *cpu_openblas_ready(struct cpu_ctx *c, int threads)
{
	static __thread char why[400];
	static int said;
	const char *no = cpu_openblas_check();
	if (no)
		return no;
	if (!ob_pool_fill(threads, why, sizeof why))
		return NULL;
	if (!__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL))
		c->host->log(KILN_LOG_INFO, "cpu", "%s: the GEMMs that would run on OpenBLAS run on oneDNN",
			     why);
	return why;
}

void cpu_openblas_str(char *buf, size_t n)
{
#if HAVE_OPENBLAS
	if (!cpu_openblas_check()) {
		const char *v = OPENBLAS_VERSION; /* " OpenBLAS 0.3.21 " */
		while (*v == ' ')
			v++;
		snprintf(buf, n, ", %s(OpenMP, %s)", v, ob.get_corename());
		return;
	}
#endif
	if (n)
		*buf = 0;
}

void cpu_openblas_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *a, int lda,
			const float *b, int ldb, float beta, float *c, int ldc)
{
#if HAVE_OPENBLAS
	ob.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
		 K, alpha, a, lda, b, ldb, beta, c, ldc);
#else
	(void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)a, (void)lda, (void)b;
	(void)ldb, (void)beta, (void)c, (void)ldc;
#endif
}
