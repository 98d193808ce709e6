/* tests/check_nccl_one.c - kiln-nccl.so on a GPU: a communicator of one
 * rank (NCCL allows one; the core never opens a communicator for a world
 * of 1), opened through kiln's plugin registry with a store, as a launch
 * gives it, on the cuda device's buffers and stream.  Each collective runs
 * and its numbers are read back: allreduce (sum and average, f32 and
 * bf16), broadcast, allgather and reduce_scatter (out of place: recv,
 * filled with -1 first, must hold send), the barrier, a split into a group
 * of one (an allreduce on it) and into no group, then close.  With one
 * rank a reduction is a copy: what this shows is NCCL running on kiln's
 * streams, buffers and `done` events, not its arithmetic across ranks.
 * send and recv need a peer other than this rank: with one rank there is
 * none, and kiln-nccl refuses them (KILN_EINVAL), which is checked.
 * Exit 77 where the cuda device or kiln-nccl is not available (here, with
 * no GPU); tests/gpu/run.sh runs it in stage 1 (docs/gpu.md). */
#include <check.h>
#include "check_main.h"

#include <kiln/dist.h>
#include <kiln/plugin.h>

#define OK(x) ck_assert_msg((x) == KILN_OK, "%s failed: %s", #x, kiln_last_error())
#define N 1000 /* elements of each buffer */

static struct kiln_registry *reg; /* check_main's: the skip */
static struct kiln_device *dev;
static void *s, *done;

/* host h (bytes) to device d, on s */
static void put(void *d, const void *h, size_t bytes)
{
	OK(kiln_device_copy_async(dev, d, h, bytes, KILN_COPY_H2D, s));
}

/* device d to host h (bytes), after waiting for `done` (the collective's) */
static void get(void *h, const void *d, size_t bytes)
{
	OK(kiln_device_event_sync(dev, done));
	OK(kiln_device_copy_async(dev, h, d, bytes, KILN_COPY_D2H, s));
	OK(kiln_device_stream_sync(dev, s));
}

/* the N values of d are src's (f32), bit for bit */
static void same(const void *d, const float *src, const char *what)
{
	float got[N];
	get(got, d, sizeof got);
	for (int i = 0; i < N; i++)
		ck_assert_msg(got[i] == src[i], "%s: [%d] = %g, want %g", what, i, got[i], src[i]);
}

START_TEST(test_nccl_one)
{
	struct kiln_registry *r;
	struct kiln_config *cfg;
	struct kiln_store *store;
	const struct kiln_plugin *p;
	void *comm, *g, *a, *b;
	float h[N], neg[N];
	uint16_t h16[N], got16[N];
	for (int i = 0; i < N; i++) {
		h[i] = (float)(i % 97) * 0.25f - 12.0f; /* exact in bf16 too */
		neg[i] = -1.0f;
		uint32_t u;
		memcpy(&u, &h[i], 4);
		h16[i] = (uint16_t)(u >> 16);
	}
	OK(kiln_registry_open(NULL, &r));
	OK(kiln_config_new(&cfg));
	OK(kiln_config_validate(cfg, r));
	OK(kiln_device_open(r, cfg, "cuda", 0, &dev));
	OK(kiln_device_stream_create(dev, &s));
	OK(kiln_device_event_create(dev, &done));
	OK(kiln_device_alloc(dev, N * 4, &a));
	OK(kiln_device_alloc(dev, N * 4, &b));
	OK(kiln_store_open("127.0.0.1", 0, 1, 0, 1, 10000, &store));
	OK(kiln_registry_find(r, KILN_PLUGIN_COMM, "nccl", &p));
	const struct kiln_comm_ops *ops = p->ops;
	OK(ops->open(kiln_host_table(), cfg, store, dev, 0, 1, 20000, &comm));
	printf("kiln-nccl: %s\n", ops->describe(comm));
	ck_assert_msg(strstr(ops->describe(comm), "NCCL 2."), "%s", ops->describe(comm));

	put(a, h, sizeof h);
	OK(ops->allreduce(comm, a, N, KILN_F32, KILN_REDUCE_SUM, s, done));
	same(a, h, "allreduce sum f32");
	OK(ops->allreduce(comm, a, N, KILN_F32, KILN_REDUCE_AVG, s, done));
	same(a, h, "allreduce avg f32");
	OK(ops->broadcast(comm, a, N, KILN_F32, 0, s, done));
	same(a, h, "broadcast");
	put(b, neg, sizeof neg);
	OK(ops->allgather(comm, a, b, N, KILN_F32, s, done));
	same(b, h, "allgather");
	put(b, neg, sizeof neg);
	OK(ops->reduce_scatter(comm, a, b, N, KILN_F32, KILN_REDUCE_SUM, s, done));
	same(b, h, "reduce_scatter");
	put(b, h16, sizeof h16);
	OK(ops->allreduce(comm, b, N, KILN_BF16, KILN_REDUCE_SUM, s, done));
	get(got16, b, sizeof got16);
	ck_assert_msg(!memcmp(got16, h16, sizeof h16), "allreduce sum bf16: the values changed");
	OK(ops->barrier(comm));

	ck_assert_int_eq(ops->send(comm, a, N, KILN_F32, 0, s, NULL), KILN_EINVAL);
	ck_assert_msg(strstr(kiln_last_error(), "no such peer"), "%s", kiln_last_error());
	ck_assert_int_eq(ops->recv(comm, a, N, KILN_F32, 0, s, NULL), KILN_EINVAL);

	int rank = -5, world = -5;
	OK(ops->split(comm, 0, 0, &g, &rank, &world));
	ck_assert_ptr_nonnull(g);
	ck_assert_int_eq(rank, 0);
	ck_assert_int_eq(world, 1);
	put(a, h, sizeof h);
	OK(ops->allreduce(g, a, N, KILN_F32, KILN_REDUCE_SUM, s, done));
	same(a, h, "allreduce on the split's communicator");
	ops->close(g);
	OK(ops->split(comm, KILN_COMM_NO_GROUP, 0, &g, &rank, &world));
	ck_assert_ptr_null(g);
	ck_assert_int_eq(rank, -1);
	ck_assert_int_eq(world, 0);
	OK(ops->barrier(comm)); /* the parent usable after the splits */

	ops->close(comm);
	kiln_store_close(store);
	kiln_device_free(dev, a);
	kiln_device_free(dev, b);
	kiln_device_event_destroy(dev, done);
	kiln_device_stream_destroy(dev, s);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(r);
}
END_TEST

static Suite *make_nccl_one_suite(void)
{
	Suite *su = suite_create("nccl_one");
	check_add_case(su, "one_rank", 60, NULL, NULL, (const TTest *[]){ test_nccl_one, NULL });
	return su;
}

/* the cuda device whatever KILN_TEST_DEVICE says: NCCL needs it */
static int use_cuda(void)
{
	setenv("KILN_TEST_DEVICE", "cuda", 1);
	return 0;
}

static const struct check_main check_suite = { .suite = make_nccl_one_suite, .setup = use_cuda,
					       .reg = &reg, .need_test_device = 1,
					       .need_comm = "nccl" };
