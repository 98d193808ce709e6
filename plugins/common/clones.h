/* plugins/common/clones.h: KILN_CLONES, one function body compiled for
 * AVX-512, AVX2 and the baseline x86-64 ISA, the copy picked when the
 * object is loaded (GCC's target_clones: an ifunc and its resolver).
 *
 * The plugins are built for the baseline ISA; their memory-bound loops (the
 * CPU device's streaming kernels, the shared-memory collectives' sums) must
 * still run at the machine's vector width, hence the clones.
 *
 * Off under AddressSanitizer and ThreadSanitizer: GCC instruments the
 * resolver too, and in an executable that links the function itself (the
 * tests that build plugins/common/shmcoll.c in, e.g. check_shmp2p and
 * check_comm) the dynamic loader runs the resolver while relocating, before
 * the sanitizer's runtime is initialised: the process dies before main
 * (TSan: SIGSEGV in the resolver; ASan: "tsd_key_inited" from
 * asan_posix.cpp).  A sanitizer build is about finding bugs, not speed, so
 * it runs the baseline copy.  KILN_CLONES_OK says whether clones are made
 * (for a file with clones of other targets: plugins/cpu/lowp.c). */
#ifndef KILN_PLUGINS_COMMON_CLONES_H
#define KILN_PLUGINS_COMMON_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
	!defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define KILN_CLONES_OK 1
#define KILN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_CLONES_OK 0
#define KILN_CLONES
#endif

#endif
