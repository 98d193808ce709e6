/* tests/check_cpu_wcache.c - the widened-weight cache's handing out of
 * copies (plugins/cpu/wcache.c, linked into this program): a copy is
 * widened once and read until a write; a stale copy that a run still reads
 * is never given out to be refilled in place (the run that asks widens into
 * its own workspace) until every reader is done (cpu_wc_done); and, on
 * threads, readers never see a copy being rewritten.  The cache is opened
 * here on any machine (cpu_dnn_bf16_native stubbed to "no bf16 kernels").
 * A large weight's copy is plugins/cpu/hugepage.c's (linked in too): on
 * a 2 MiB boundary, advised with MADV_HUGEPAGE, unmapped at the close.
 * Built with -fsanitize=thread, the threaded case is the race check (from
 * the top of a built tree; session 16's scheme, which refilled a copy under
 * its readers, is reported there):
 *   gcc -g -O1 -fsanitize=thread -I. -Iinclude -Iplugins/cpu plugins/cpu/wcache.c \
 *     plugins/cpu/hugepage.c tests/check_cpu_wcache.c .libs/libkiln.so -Wl,-rpath,$PWD/.libs \
 *     $(pkg-config --cflags --libs check) -lpthread -lm -o /tmp/wc && /tmp/wc
 */
#include "plugins/cpu/cpu.h"

#include <kiln/plugin.h>

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include "check_main.h"
#include "smaps.h" /* vma_of, smaps_has_flag */

/* wcache.c's one dependency outside itself: AVX2, no oneDNN bf16 */
int cpu_dnn_bf16_native(void) { return 0; }

#define NW 4096 /* elements of the weight */

static uint16_t weight[2 * NW]; /* the compute copy: two weights of NW */

static void quiet_log(int level, const char *who, const char *fmt, ...)
{
	(void)level, (void)who, (void)fmt;
}

static const struct kiln_host test_host = { .log = quiet_log };

/* an SGD's run whose last output is the bf16 compute copy `weight` */
static void optimizer_ran(void)
{
	struct cpu_plan p = { 0 };
	p.op.type = KILN_OP_SGD;
	p.op.n_in = 2, p.op.n_out = 2;
	p.op.out[0] = (struct kiln_tensor_desc){ .dtype = KILN_F32, .ndim = 1, .dims = { 2 * NW } };
	p.op.out[1] = (struct kiln_tensor_desc){ .dtype = KILN_BF16, .ndim = 1, .dims = { 2 * NW } };
	static float master[2 * NW];
	struct kiln_op_args a = { .out = { master, weight } };
	cpu_wc_ran(&p, &a);
}

/* ADAMW with amsgrad (ABI 2.29): its four f32 outputs (params, m, v,
 * vmax) leave no room for the compute copy; when cast = 1, the CAST of its
 * params into `weight` after it (core/optim/fused.c), else a CAST of
 * another f32 buffer of the same size (an activation) */
static void amsgrad_ran(int cast)
{
	static float master[2 * NW], m[2 * NW], v[2 * NW], vmax[2 * NW], other[2 * NW];
	struct cpu_plan p = { 0 };
	const struct kiln_tensor_desc f32 = { .dtype = KILN_F32, .ndim = 1, .dims = { 2 * NW } };
	p.op.type = KILN_OP_ADAMW;
	p.op.i[1] = 1;
	p.op.n_in = 3, p.op.n_out = 4;
	for (int k = 0; k < 4; k++)
		p.op.out[k] = f32;
	struct kiln_op_args a = { .out = { master, m, v, vmax } };
	cpu_wc_ran(&p, &a);
	struct cpu_plan c = { 0 };
	c.op.type = KILN_OP_CAST;
	c.op.n_in = c.op.n_out = 1;
	c.op.in[0] = f32;
	c.op.out[0] = (struct kiln_tensor_desc){ .dtype = KILN_BF16, .ndim = 1, .dims = { 2 * NW } };
	struct kiln_op_args ca = { .in = { cast ? master : other }, .out = { weight } };
	cpu_wc_ran(&c, &ca);
}

/* the weights set to i & 255 (element i), the cache opened */
static struct cpu_wcache *wc_open(void)
{
	for (int i = 0; i < 2 * NW; i++)
		weight[i] = half_f32_bf16((float)(i & 255));
	struct cpu_wcache *w = cpu_wc_open();
	ck_assert_ptr_nonnull(w);
	return w;
}

/* the widening lowp.c does for a ticket */
static void widen(float *y, const uint16_t *x)
{
	for (int i = 0; i < NW; i++)
		y[i] = half_bf16_f32(x[i]);
}

START_TEST(test_refill_waits_for_readers)
{
	struct cpu_wcache *w = wc_open();
	unsigned t = 7;
	/* before an optimizer wrote it, nothing is a weight */
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	ck_assert_uint_eq(t, 0);
	optimizer_ran();
	/* read once: no buffer yet; twice: a copy to fill */
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	const float *fill = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_nonnull(fill);
	ck_assert_uint_ne(t, 0);
	/* while it is filled, another run widens itself */
	unsigned t2 = 7;
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t2));
	widen((float *)fill, weight);
	cpu_wc_filled(w, fill, t);
	/* kept: read by two runs at once (hits, no ticket) */
	const float *a = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(a, fill);
	ck_assert_uint_eq(t, 0);
	ck_assert_float_eq(a[NW - 1], 255.0f);
	/* a host function: every copy stale while the filler and `a` read it */
	cpu_wc_wrote_any(0);
	for (int k = 0; k < 3; k++) { /* not refilled under them */
		ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
		ck_assert_uint_eq(t, 0);
	}
	cpu_wc_done(w, fill); /* the filler's kernel ran */
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	cpu_wc_done(w, a); /* the last reader */
	/* now the same buffer is refilled in place */
	const float *r = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(r, fill);
	ck_assert_uint_ne(t, 0);
	/* a write of the weight during the fill: the fill is not kept */
	cpu_wc_wrote(weight + 10, 2);
	widen((float *)r, weight);
	cpu_wc_filled(w, r, t);
	cpu_wc_done(w, r);
	r = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(r, fill);
	ck_assert_uint_ne(t, 0); /* refilled, not a hit */
	widen((float *)r, weight);
	cpu_wc_filled(w, r, t);
	cpu_wc_done(w, r);
	/* a write elsewhere (the other weight) leaves this copy valid */
	cpu_wc_wrote(weight + NW, 2);
	r = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(r, fill);
	ck_assert_uint_eq(t, 0);
	cpu_wc_done(w, r);
	cpu_wc_close(w, &test_host);
}
END_TEST

/* With amsgrad the compute copy is written by a CAST of the optimizer's
 * params, not by the optimizer op (its last output is vmax, f32): the
 * copy is a weight all the same, kept from its second read; a CAST into
 * the same bytes from f32 that is no optimizer's params (an activation)
 * makes nothing a weight.  Before session 44 neither did the params' CAST:
 * a bf16 run with amsgrad below avx512_core widened every weight on
 * every read. */
START_TEST(test_amsgrad_copy_cast)
{
	struct cpu_wcache *w = wc_open();
	unsigned t = 7;
	amsgrad_ran(0);
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	ck_assert_uint_eq(t, 0);
	amsgrad_ran(1);
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	const float *fill = cpu_wc_get(w, weight + NW, KILN_BF16, NW, &t);
	ck_assert_ptr_null(fill); /* (the other weight: read once) */
	fill = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_msg(fill != NULL, "the amsgrad run's compute copy, read twice, is not kept");
	ck_assert_uint_ne(t, 0);
	widen((float *)fill, weight);
	cpu_wc_filled(w, fill, t);
	cpu_wc_done(w, fill);
	const float *r = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(r, fill);
	ck_assert_uint_eq(t, 0); /* a hit */
	ck_assert_float_eq(r[NW - 1], 255.0f);
	cpu_wc_done(w, r);
	/* the next step: the CAST rewrites the copy, stale until widened again */
	amsgrad_ran(1);
	r = cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_eq(r, fill);
	ck_assert_uint_ne(t, 0);
	widen((float *)r, weight);
	cpu_wc_filled(w, r, t);
	cpu_wc_done(w, r);
	cpu_wc_close(w, &test_host);
}
END_TEST

/* ---- threads: readers, fillers and a host function at once ---- */

#define READERS 3
#define ROUNDS 4000

struct rd_state {
	struct cpu_wcache *w;
	int bad;         /* elements read that were not the weight */
	int hits, fills; /* copies read kept / widened by this thread */
};

static void *reader(void *arg)
{
	struct rd_state *s = arg;
	for (int k = 0; k < ROUNDS; k++) {
		unsigned t;
		const float *c = cpu_wc_get(s->w, weight, KILN_BF16, NW, &t);
		if (!c)
			continue; /* widens into its workspace: nothing shared */
		if (t) { /* rewritten in place: a reader would see the NaNs */
			float *y = (float *)c;
			for (int i = 0; i < NW; i++)
				y[i] = NAN;
			widen(y, weight);
			cpu_wc_filled(s->w, c, t);
			s->fills++;
		} else {
			s->hits++;
		}
		for (int i = 0; i < NW; i += 7)
			s->bad += c[i] != (float)(i & 255);
		cpu_wc_done(s->w, c);
	}
	return NULL;
}

static volatile int host_stop;

/* a communicator's host function: marks everything stale, writes nothing */
static void *host_fn(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&host_stop, __ATOMIC_ACQUIRE))
		cpu_wc_wrote_any(0);
	return NULL;
}

START_TEST(test_threads_never_read_a_refill)
{
	struct cpu_wcache *w = wc_open();
	optimizer_ran();
	/* the copy's buffer made before the host function starts (it resets
	 * the count of reads that makes one): the threads only refill it */
	unsigned t;
	ck_assert_ptr_null(cpu_wc_get(w, weight, KILN_BF16, NW, &t));
	float *c = (float *)cpu_wc_get(w, weight, KILN_BF16, NW, &t);
	ck_assert_ptr_nonnull(c);
	widen(c, weight);
	cpu_wc_filled(w, c, t);
	cpu_wc_done(w, c);
	struct rd_state s[READERS];
	pthread_t th[READERS], h;
	host_stop = 0;
	ck_assert_int_eq(pthread_create(&h, NULL, host_fn, NULL), 0);
	for (int r = 0; r < READERS; r++) {
		s[r] = (struct rd_state){ .w = w };
		ck_assert_int_eq(pthread_create(&th[r], NULL, reader, &s[r]), 0);
	}
	int bad = 0, hits = 0, fills = 0;
	for (int r = 0; r < READERS; r++) {
		pthread_join(th[r], NULL);
		bad += s[r].bad, hits += s[r].hits, fills += s[r].fills;
	}
	__atomic_store_n(&host_stop, 1, __ATOMIC_RELEASE);
	pthread_join(h, NULL);
	ck_assert_int_eq(bad, 0);
	/* the refills happened, and were read */
	ck_assert_msg(fills > 0, "no copy refilled by the threads (%d kept copies read)", hits);
	cpu_wc_close(w, &test_host);
}
END_TEST

/* A weight of 1.5 Mi bf16 elements: its widened copy (6 MiB of f32) is
 * hugepage.c's (session 47; before, posix_memalign's, on 4 KiB pages): on
 * a 2 MiB boundary, in a mapping advised with MADV_HUGEPAGE (VmFlags hg,
 * where the kernel has THP), unmapped when the cache closes.  In an
 * AddressSanitizer build, the heap's (hugepage.c maps nothing there). */
#define NL ((int64_t)3 << 19)

START_TEST(test_large_copy_huge)
{
	uint16_t *big = calloc((size_t)NL, sizeof *big);
	float *master = calloc((size_t)NL, sizeof *master);
	ck_assert(big && master);
	struct cpu_wcache *w = cpu_wc_open();
	ck_assert_ptr_nonnull(w);
	struct cpu_plan p = { 0 };
	p.op.type = KILN_OP_SGD;
	p.op.n_in = 2, p.op.n_out = 2;
	p.op.out[0] = (struct kiln_tensor_desc){ .dtype = KILN_F32, .ndim = 1, .dims = { NL } };
	p.op.out[1] = (struct kiln_tensor_desc){ .dtype = KILN_BF16, .ndim = 1, .dims = { NL } };
	struct kiln_op_args a = { .out = { master, big } };
	cpu_wc_ran(&p, &a);
	unsigned t;
	ck_assert_ptr_null(cpu_wc_get(w, big, KILN_BF16, NL, &t));
	float *c = (float *)cpu_wc_get(w, big, KILN_BF16, NL, &t);
	ck_assert_ptr_nonnull(c);
	ck_assert_uint_ne(t, 0);
	for (int64_t i = 0; i < NL; i++) /* (every byte writable) */
		c[i] = half_bf16_f32(big[i]);
	struct vma v;
	ck_assert_msg(vma_of(c, &v), "the copy at %p is not mapped", (void *)c);
#ifndef SMAPS_ASAN_BUILD
	ck_assert_msg((uintptr_t)c % CPU_HUGE == 0, "the 6 MiB copy at %p: not on a 2 MiB boundary",
		      (void *)c);
	ck_assert_msg(v.lo <= (uintptr_t)c && v.hi >= (uintptr_t)c + (size_t)NL * 4,
		      "the copy [%p, +6 MiB) is not one mapping [%#lx, %#lx)", (void *)c,
		      (unsigned long)v.lo, (unsigned long)v.hi);
	if (smaps_thp())
		ck_assert_msg(smaps_has_flag(v.flags, "hg"), "the 6 MiB copy is not advised: VmFlags:%s",
			      v.flags);
#endif
	cpu_wc_filled(w, c, t);
	cpu_wc_done(w, c);
	cpu_wc_close(w, &test_host);
#ifndef SMAPS_ASAN_BUILD
	ck_assert_msg(!vma_of(c, &v), "the closed cache's copy is still mapped [%#lx, %#lx)",
		      (unsigned long)v.lo, (unsigned long)v.hi);
#endif
	free(big);
	free(master);
}
END_TEST

static Suite *make_cpu_wcache_suite(void)
{
	Suite *s = suite_create("cpu_wcache");
	check_add_case(s, "wcache", 60, NULL, NULL, (const TTest *[]){
		test_refill_waits_for_readers, test_amsgrad_copy_cast, test_threads_never_read_a_refill,
		test_large_copy_huge, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_cpu_wcache_suite };
