/* tests/check_device_stream.c - device conformance:
 * the stream and event contract: ordering, the sticky error, the
 * sync counters, closing a device with live objects, a host function's
 * skip on a failed stream (KILN_PROC_HOST_FN_SKIP).
 *
 * The fixture, the modes and KILN_TEST_DEVICE: tests/device_fixture.h.
 */
#include "device_fixture.h"
#include "check_main.h"
#include "held_fail.h"

#include <kiln/plugin.h> /* KILN_PROC_HOST_FN_SKIP, kiln_host */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const struct kiln_host *kiln_host_table(void);

/* ---- streams and events ---------------------------------------------- */

/* Prepared elementwise op over n floats. */
static void *prep(struct fx *f, int type, int n, double f0, int flags)
{
	struct kiln_op op;
	void *plan;
	size_t ws;
	memset(&op, 0, sizeof op);
	op.type = type;
	op.flags = flags;
	op.n_in = type == KILN_OP_FILL ? 0 : type == KILN_OP_ADD ? 2 : 1;
	op.n_out = 1;
	op.in[0] = op.in[1] = op.out[0] = td(KILN_F32, 1, n, 0);
	op.f[0] = f0;
	OK(kiln_device_prepare(f->dev, &op, &plan, &ws));
	return plan;
}

static void run1(struct fx *f, void *plan, const void *in0, const void *in1, void *out,
		 void *stream)
{
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = in0, a.in[1] = in1, a.out[0] = out;
	OK(kiln_device_run(f->dev, plan, &a, stream));
}

/* Stream A builds X = 50 with a chain of adds and records an event; stream
 * B waits on it and computes Y1 = 2X (100).  A waits for B's read, adds 10
 * more and re-records the same event: B's second wait must see the new
 * generation (Y2 = 120). */
START_TEST(test_stream_order)
{
	struct fx f;
	fx_open(&f, _i);
	const int n = 1 << 18;
	size_t b = (size_t)n * 4;
	void *A = f.s, *B, *ev, *evb;
	OK(kiln_device_stream_create(f.dev, &B));
	OK(kiln_device_event_create(f.dev, &ev));
	OK(kiln_device_event_create(f.dev, &evb));
	void *X = dput(&f, NULL, b), *one = dput(&f, NULL, b), *Y1 = dput(&f, NULL, b);
	void *Y2 = dput(&f, NULL, b);
	void *fill0 = prep(&f, KILN_OP_FILL, n, 0, 0), *fill1 = prep(&f, KILN_OP_FILL, n, 1, 0);
	void *add = prep(&f, KILN_OP_ADD, n, 0, 0), *twice = prep(&f, KILN_OP_SCALE, n, 2, 0);
	float *h = malloc(b);

	run1(&f, fill0, NULL, NULL, X, A);
	run1(&f, fill1, NULL, NULL, one, A);
	for (int i = 0; i < 50; i++)
		run1(&f, add, X, one, X, A);
	OK(kiln_device_event_record(f.dev, ev, A));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	run1(&f, twice, X, NULL, Y1, B);
	/* A must not add more until B has read X */
	OK(kiln_device_event_record(f.dev, evb, B));
	OK(kiln_device_stream_wait(f.dev, A, evb));
	for (int i = 0; i < 10; i++)
		run1(&f, add, X, one, X, A);
	OK(kiln_device_event_record(f.dev, ev, A));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	run1(&f, twice, X, NULL, Y2, B);
	OK(kiln_device_stream_sync(f.dev, B));

	OK(kiln_device_copy_async(f.dev, h, Y1, b, KILN_COPY_D2H, B));
	OK(kiln_device_stream_sync(f.dev, B));
	for (int i = 0; i < n; i++)
		ck_assert_msg(h[i] == 100.0f, "Y1[%d] = %g, want 100", i, h[i]);
	OK(kiln_device_copy_async(f.dev, h, Y2, b, KILN_COPY_D2H, B));
	OK(kiln_device_event_record(f.dev, ev, B));
	OK(kiln_device_event_sync(f.dev, ev));
	for (int i = 0; i < n; i++)
		ck_assert_msg(h[i] == 120.0f, "Y2[%d] = %g, want 120", i, h[i]);

	/* An event never recorded is complete; waiting on it is a no-op. */
	void *fresh;
	OK(kiln_device_event_create(f.dev, &fresh));
	OK(kiln_device_event_sync(f.dev, fresh));
	OK(kiln_device_stream_wait(f.dev, B, fresh));
	OK(kiln_device_stream_sync(f.dev, B));
	kiln_device_event_destroy(f.dev, fresh);

	kiln_device_plan_free(f.dev, fill0);
	kiln_device_plan_free(f.dev, fill1);
	kiln_device_plan_free(f.dev, add);
	kiln_device_plan_free(f.dev, twice);
	DFREE(&f, X, one, Y1, Y2);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_event_destroy(f.dev, evb);
	kiln_device_stream_destroy(f.dev, B);
	free(h);
	fx_close(&f);
}
END_TEST

/* Async: a failed op poisons its stream.  stream_sync reports it (with the
 * op's message) and keeps reporting it; an event recorded after it and a
 * stream waiting on that event report it too; other streams are fine. */
START_TEST(test_sticky_error)
{
	struct fx f;
	fx_open(&f, 1);
	if (!f.async) {
		fx_close(&f);
		return; /* only the cpu device has a worker mode */
	}
	float x[4] = { 0 }, m[2] = { 0 };
	int32_t lab[2] = { 0, -1 };
	void *dx = dput(&f, x, sizeof x), *dl = dput(&f, lab, sizeof lab);
	void *dg = dput(&f, NULL, sizeof x), *dm = dput(&f, m, sizeof m);
	OK(kiln_device_stream_sync(f.dev, f.s));
	struct kiln_op op;
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_SOFTMAX_XENT;
	op.n_in = op.n_out = 2;
	op.in[0] = op.out[0] = td(KILN_F32, 2, 2, 2);
	op.in[1] = td(KILN_I32, 1, 2, 0);
	op.out[1] = td(KILN_F32, 1, 2, 0);
	op.i[0] = 2;
	op.f[0] = 1;
	void *plan, *B, *C, *ev;
	OK(kiln_device_prepare(f.dev, &op, &plan, NULL));
	OK(kiln_device_stream_create(f.dev, &B));
	OK(kiln_device_stream_create(f.dev, &C));
	OK(kiln_device_event_create(f.dev, &ev));
	struct kiln_op_args a;
	memset(&a, 0, sizeof a);
	a.in[0] = dx, a.in[1] = dl, a.out[0] = dg, a.out[1] = dm;
	OK(kiln_device_run(f.dev, plan, &a, f.s)); /* enqueued: the error comes later */
	OK(kiln_device_event_record(f.dev, ev, f.s));
	OK(kiln_device_stream_wait(f.dev, B, ev));
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(kiln_device_stream_sync(f.dev, f.s), KILN_EDATA);
		ck_assert_msg(strstr(kiln_last_error(), "row 1") && strstr(kiln_last_error(), "-1"),
			      "message: %s", kiln_last_error());
	}
	ck_assert_int_eq(kiln_device_event_sync(f.dev, ev), KILN_EDATA);
	ck_assert_int_eq(kiln_device_stream_sync(f.dev, B), KILN_EDATA);
	ck_assert_int_eq(kiln_device_run(f.dev, plan, &a, f.s), KILN_EDATA);
	OK(kiln_device_stream_sync(f.dev, C));
	/* the metrics were not touched by the failed run */
	OK(kiln_device_copy_async(f.dev, m, dm, sizeof m, KILN_COPY_D2H, C));
	OK(kiln_device_stream_sync(f.dev, C));
	ck_assert_float_eq(m[0], 0.0f);
	kiln_device_plan_free(f.dev, plan);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_stream_destroy(f.dev, B);
	kiln_device_stream_destroy(f.dev, C);
	DFREE(&f, dx, dl, dg, dm);
	fx_close(&f);
}
END_TEST

/* The core counts host syncs and D2H copies; enqueueing counts neither. */
START_TEST(test_counters)
{
	struct fx f;
	fx_open(&f, _i);
	struct kiln_device_counters c0, c1;
	void *ev, *d = dput(&f, NULL, 64), *fill = prep(&f, KILN_OP_FILL, 16, 3, 0);
	float h[16];
	OK(kiln_device_event_create(f.dev, &ev));
	kiln_device_counters_get(f.dev, &c0);
	run1(&f, fill, NULL, NULL, d, f.s);
	OK(kiln_device_event_record(f.dev, ev, f.s));
	kiln_device_counters_get(f.dev, &c1);
	ck_assert_uint_eq(c1.host_syncs, c0.host_syncs);
	ck_assert_uint_eq(c1.runs, c0.runs + 1);
	OK(kiln_device_event_sync(f.dev, ev));
	OK(kiln_device_copy_async(f.dev, h, d, sizeof h, KILN_COPY_D2H, f.s));
	OK(kiln_device_stream_sync(f.dev, f.s));
	kiln_device_counters_get(f.dev, &c1);
	ck_assert_uint_eq(c1.host_syncs, c0.host_syncs + 2);
	ck_assert_uint_eq(c1.d2h_copies, c0.d2h_copies + 1);
	ck_assert_float_eq(h[15], 3.0f);
	kiln_device_plan_free(f.dev, fill);
	kiln_device_event_destroy(f.dev, ev);
	kiln_device_free(f.dev, d);
	fx_close(&f);
}
END_TEST

/* Closing a device with live streams, events, plans and queued work
 * releases everything (run under valgrind to see it). */
START_TEST(test_close_live)
{
	struct fx f;
	fx_open(&f, _i);
	void *s2, *ev, *d = dput(&f, NULL, 1 << 20);
	void *fill = prep(&f, KILN_OP_FILL, 1 << 18, 1, 0);
	OK(kiln_device_stream_create(f.dev, &s2));
	OK(kiln_device_event_create(f.dev, &ev));
	for (int i = 0; i < 20; i++)
		run1(&f, fill, NULL, NULL, d, s2);
	OK(kiln_device_event_record(f.dev, ev, s2));
	OK(kiln_device_stream_wait(f.dev, f.s, ev));
	int host_mem = !strcmp(g_name, "cpu");
	if (!host_mem) {
		OK(kiln_device_stream_sync(f.dev, s2));
		kiln_device_free(f.dev, d);
	}
	kiln_device_close(f.dev);
	if (host_mem)
		free(d); /* cpu device memory is posix_memalign'd; the queued fills are done */
	kiln_config_free(f.cfg);
	kiln_registry_close(f.reg);
}
END_TEST

/* KILN_PROC_HOST_FN_SKIP (session 47): every call the device accepts ends
 * in exactly one of fn and skip.  On a healthy stream fn runs; on a
 * stream that fails (a host function held, then failing) every call
 * queued behind the failure has skip run instead, on the stream's thread,
 * by the time the stream's sync returns, or its destroy (not synced
 * first); a call on the failed stream is refused and runs neither.  A
 * device without the function (NULL) is skipped with a note; the cpu
 * device must have it. */
static atomic_int hs_ran, hs_skipped, hs_skip_here;
static pthread_t hs_caller;
static struct held_fail hs_held;

static kiln_status hs_run(void *arg)
{
	(void)arg;
	atomic_fetch_add(&hs_ran, 1);
	return KILN_OK;
}

static void hs_skip(void *arg)
{
	atomic_fetch_add(&hs_skipped, 1);
	atomic_fetch_add((atomic_int *)arg, 1);
	if (pthread_equal(pthread_self(), hs_caller))
		atomic_fetch_add(&hs_skip_here, 1);
}

typedef kiln_status (*hs_fn_t)(void *, void *, kiln_status (*)(void *), void (*)(void *), void *);

/* A stream held (held_fail.h) with n calls queued behind it, then failed */
static void hs_fail_behind(struct fx *f, hs_fn_t hfs, void *s, int n, atomic_int *count)
{
	OK(held_fail_hold(&hs_held, f->dev, s, "host_fn_skip: the planned failure"));
	for (int k = 0; k < n; k++)
		OK(hfs(NULL, s, hs_run, hs_skip, count));
	held_fail_release(&hs_held);
}

START_TEST(test_host_fn_skip)
{
	struct fx f;
	fx_open(&f, 1);
	hs_fn_t hfs = (hs_fn_t)kiln_device_proc(f.dev, KILN_PROC_HOST_FN_SKIP);
	if (!hfs || !f.async) {
		ck_assert_msg(strcmp(g_name, "cpu"), "the cpu device has no KILN_PROC_HOST_FN_SKIP");
		printf("%s: no KILN_PROC_HOST_FN_SKIP or no worker mode: not tested\n", g_name);
		fx_close(&f);
		return;
	}
	hs_caller = pthread_self();
	static atomic_int on_a, on_b;
	/* healthy: fn, never skip */
	for (int k = 0; k < 3; k++)
		OK(hfs(NULL, f.s, hs_run, hs_skip, &on_a));
	OK(kiln_device_stream_sync(f.dev, f.s));
	ck_assert_int_eq(atomic_load(&hs_ran), 3);
	ck_assert_int_eq(atomic_load(&hs_skipped), 0);
	/* failed behind 5 calls: skip for each, by the sync */
	hs_fail_behind(&f, hfs, f.s, 5, &on_a);
	ck_assert_int_eq(kiln_device_stream_sync(f.dev, f.s), KILN_EIO);
	ck_assert_int_eq(atomic_load(&hs_ran), 3);
	ck_assert_int_eq(atomic_load(&on_a), 5);
	ck_assert_int_eq(atomic_load(&hs_skip_here), 0);
	/* refused on the failed stream: neither */
	ck_assert_int_eq(hfs(NULL, f.s, hs_run, hs_skip, &on_a), KILN_EIO);
	ck_assert_msg(strstr(kiln_last_error(), "the planned failure"), "%s", kiln_last_error());
	ck_assert_int_eq(kiln_device_stream_sync(f.dev, f.s), KILN_EIO);
	ck_assert_int_eq(atomic_load(&hs_ran), 3);
	ck_assert_int_eq(atomic_load(&on_a), 5);
	/* destroyed without a sync: skip for each, by the destroy */
	void *B;
	OK(kiln_device_stream_create(f.dev, &B));
	hs_fail_behind(&f, hfs, B, 7, &on_b);
	kiln_device_stream_destroy(f.dev, B);
	ck_assert_int_eq(atomic_load(&on_b), 7);
	ck_assert_int_eq(atomic_load(&hs_ran), 3);
	ck_assert_int_eq(atomic_load(&hs_skip_here), 0);
	/* no context and no stream: refused, with a message that says so */
	ck_assert_int_eq(hfs(NULL, NULL, hs_run, hs_skip, &on_a), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "NULL stream"), "%s", kiln_last_error());
	ck_assert_int_eq(atomic_load(&hs_ran), 3);
	fx_close(&f);
}
END_TEST

DEVICE_SUITE(stream, DFX_CASE(stream_order), DFX_CASE(counters), DFX_CASE(close_live),
	     DFX_ONCE(sticky_error, 60), DFX_ONCE(host_fn_skip, 60));
