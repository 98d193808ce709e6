/* tests/check_nccl_group.c - kiln-nccl's point-to-point calls on the host,
 * without a GPU: plugins/nccl/nccl.c is compiled into this test against
 * the real nccl.h and cuda_runtime_api.h, and this file defines every
 * NCCL and CUDA function it calls, recording what it is asked (no
 * libnccl, no libcudart).  What is checked is the calls' structure:
 *   - sendrecv (comm ops version 7) is ncclGroupStart, ncclSend, ncclRecv,
 *     ncclGroupEnd: both inside one group (NCCL's rule for p2p calls that
 *     must progress together), with the caller's buffers, counts, NCCL
 *     dtype, peers and native stream, and one watched entry;
 *   - a one-sided sendrecv (a count 0) has only its half in the group;
 *   - a failing ncclSend still closes the group and fails with KILN_EIO
 *     naming the call; ncclInProgress from ncclGroupEnd (a non-blocking
 *     communicator) is polled through ncclCommGetAsyncError to success;
 *   - bad peers, an empty call and an unknown dtype make no NCCL call
 *     (through kiln_comm_sendrecv, which checks what the core can);
 *   - send and recv stay one group each (comm ops version 4).
 * A sendrecv made of two groups (a send's, then a recv's) fails the first
 * case: that is the deadlock of issue 21 item 2 on GPUs.
 *
 * And split (comm ops version 5) on the non-blocking parent, which NCCL
 * treats as a call on the parent: ncclInProgress until the parent's
 * ncclCommGetAsyncError says otherwise, the new communicator filled only
 * then (NVIDIA/nccl issue 1472; the fake does the same):
 *   - a rank in no group still waits for the parent to finish the split;
 *   - a group's split waits for the parent before reading the new
 *     communicator, then for the new one (comm_ready): when that fails or
 *     times out, it is aborted, and every watchdog lock initialised is
 *     destroyed;
 *   - a parent that fails the split fails it with KILN_EIO. */
#include <check.h>
#include "check_main.h"

/* the watchdog's initialisations and destructions in nccl.c, counted */
#include "../plugins/common/watchdog.h"
static int dog_inits, dog_destroys;
#define watchdog_init(w) (dog_inits++, watchdog_init(w))
#define watchdog_destroy(w) (dog_destroys++, watchdog_destroy(w))
#include "../plugins/nccl/nccl.c"
#undef watchdog_init
#undef watchdog_destroy

#include <stdarg.h>

const struct kiln_host *kiln_host_table(void);
/* core/comm_p2p.c (core/dist.h, exported as every kiln_ symbol) */
kiln_status kiln_comm_sendrecv(const struct kiln_comm_ops *ops, void *comm, int rank,
			       const void *send_buf, size_t send_count, int dst, void *recv_buf,
			       size_t recv_count, int src, int dtype, void *stream, void *done);

/* ---- the recording NCCL and CUDA -------------------------------------- */

#define NLOG 32
static char calls[NLOG][160];
static int ncalls, depth;
static ncclResult_t send_result = ncclSuccess, end_result = ncclSuccess;
static int async_polls; /* ncclCommGetAsyncError calls on the parent */
/* the split: its result, the parent's state once its third poll is past
 * ncclInProgress, the new communicator's state, and where to put it when
 * the parent finishes (NULL: it was filled at the call, or none) */
#define CHILD ((ncclComm_t)0xc41d)
static ncclResult_t split_result, parent_final, child_state;
static int split_fill_now, child_polls;
static ncclComm_t *split_pending;

static void rec(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (ncalls < NLOG)
		vsnprintf(calls[ncalls++], sizeof calls[0], fmt, ap);
	va_end(ap);
}

static void log_reset(void)
{
	ncalls = depth = async_polls = child_polls = split_fill_now = 0;
	send_result = end_result = split_result = parent_final = child_state = ncclSuccess;
	split_pending = NULL;
	dog_inits = dog_destroys = 0;
}

ncclResult_t ncclGroupStart(void)
{
	rec("GroupStart");
	depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
	rec("GroupEnd");
	depth--;
	return end_result;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
		      cudaStream_t s)
{
	(void)comm;
	rec("Send %p %zu t%d peer %d stream %p depth %d", buf, count, (int)t, peer, (void *)s, depth);
	return send_result;
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
		      cudaStream_t s)
{
	(void)comm;
	rec("Recv %p %zu t%d peer %d stream %p depth %d", buf, count, (int)t, peer, (void *)s, depth);
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r)
{
	if (comm == CHILD) {
		child_polls++;
		*r = child_state;
		return ncclSuccess;
	}
	*r = ++async_polls < 3 ? ncclInProgress : parent_final;
	if (*r == ncclSuccess && split_pending) {
		*split_pending = CHILD;
		split_pending = NULL;
	}
	return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *out,
			   ncclConfig_t *cfg)
{
	(void)comm;
	rec("Split color %d key %d blocking %d", color, key, cfg->blocking);
	*out = NULL;
	if (color != NCCL_SPLIT_NOCOLOR && split_fill_now)
		*out = CHILD;
	else if (color != NCCL_SPLIT_NOCOLOR)
		split_pending = out;
	return split_result;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	rec("Abort %s", comm == CHILD ? "child" : "parent");
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
	return r == ncclInternalError ? "internal error (recorded)" : "recorded";
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *cs)
{
	(void)s;
	*cs = cudaStreamCaptureStatusNone;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	(void)e, (void)s;
	return cudaSuccess;
}

/* Called only by the paths this test does not take (open, close, the
 * collectives, a split's communicator made ready, the watchdog's thread):
 * reaching one is a failure. */
#define UNUSED_CALL(ret, name, ...)                                                               \
	ret name(__VA_ARGS__)                                                                     \
	{                                                                                         \
		ck_abort_msg("%s called", #name);                                                 \
		abort();                                                                          \
	}
UNUSED_CALL(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *c, int n, ncclUniqueId id, int r,
	    ncclConfig_t *cfg)
UNUSED_CALL(ncclResult_t, ncclAllReduce, const void *s, void *r, size_t n, ncclDataType_t t,
	    ncclRedOp_t op, ncclComm_t c, cudaStream_t st)
UNUSED_CALL(ncclResult_t, ncclBroadcast, const void *s, void *r, size_t n, ncclDataType_t t,
	    int root, ncclComm_t c, cudaStream_t st)
UNUSED_CALL(ncclResult_t, ncclAllGather, const void *s, void *r, size_t n, ncclDataType_t t,
	    ncclComm_t c, cudaStream_t st)
UNUSED_CALL(ncclResult_t, ncclReduceScatter, const void *s, void *r, size_t n, ncclDataType_t t,
	    ncclRedOp_t op, ncclComm_t c, cudaStream_t st)
UNUSED_CALL(ncclResult_t, ncclGetUniqueId, ncclUniqueId *id)
UNUSED_CALL(ncclResult_t, ncclCommFinalize, ncclComm_t c)
UNUSED_CALL(ncclResult_t, ncclCommDestroy, ncclComm_t c)
UNUSED_CALL(ncclResult_t, ncclGetVersion, int *v)
UNUSED_CALL(ncclResult_t, ncclCommUserRank, const ncclComm_t c, int *r)
UNUSED_CALL(ncclResult_t, ncclCommCount, const ncclComm_t c, int *n)
UNUSED_CALL(cudaError_t, cudaEventQuery, cudaEvent_t e)
UNUSED_CALL(cudaError_t, cudaStreamSynchronize, cudaStream_t s)
UNUSED_CALL(cudaError_t, cudaStreamCreate, cudaStream_t *s)
UNUSED_CALL(cudaError_t, cudaStreamDestroy, cudaStream_t s)
UNUSED_CALL(cudaError_t, cudaMalloc, void **p, size_t n)
UNUSED_CALL(cudaError_t, cudaFree, void *p)
UNUSED_CALL(cudaError_t, cudaSetDevice, int d)
UNUSED_CALL(cudaError_t, cudaGetDevice, int *d)
UNUSED_CALL(cudaError_t, cudaGetDeviceCount, int *n)
UNUSED_CALL(const char *, cudaGetErrorString, cudaError_t e)
UNUSED_CALL(cudaError_t, cudaEventDestroy, cudaEvent_t e)
UNUSED_CALL(cudaError_t, cudaEventCreate, cudaEvent_t *e)
UNUSED_CALL(cudaError_t, cudaEventCreateWithFlags, cudaEvent_t *e, unsigned f)

/* ---- a communicator of 4 ranks, this one rank 1 ------------------------- */

static struct nccl_comm C;
static char kiln_stream; /* the kiln stream handle; its native stream: */
#define NATIVE ((void *)0x5eed)

static void *native_of(void *ctx, void *stream)
{
	(void)ctx;
	ck_assert_ptr_eq(stream, &kiln_stream);
	return NATIVE;
}

static void comm_setup(void)
{
	H = kiln_host_table();
	memset(&C, 0, sizeof C);
	C.rank = 1, C.world = 4, C.timeout_ms = 2000;
	C.native = native_of;
	watchdog_init(&C.dog);
	log_reset();
}

static void comm_teardown(void)
{
	watchdog_destroy(&C.dog);
}

static void expect_calls(const char *const *want, int n)
{
	for (int i = 0; i < n && i < ncalls; i++)
		ck_assert_msg(!strcmp(calls[i], want[i]), "call %d: '%s', want '%s'", i, calls[i],
			      want[i]);
	ck_assert_msg(ncalls == n, "%d NCCL calls, want %d (last: '%s')", ncalls, n,
		      ncalls ? calls[ncalls - 1] : "");
}

static char sbuf[64], rbuf[64];

START_TEST(test_sendrecv_one_group)
{
	char s[160], r[160];
	snprintf(s, sizeof s, "Send %p 100 t%d peer 2 stream %p depth 1", (void *)sbuf,
		 (int)ncclFloat32, NATIVE);
	snprintf(r, sizeof r, "Recv %p 50 t%d peer 0 stream %p depth 1", (void *)rbuf,
		 (int)ncclFloat32, NATIVE);
	const char *want[] = { "GroupStart", s, r, "GroupEnd" };
	/* (version 8 adds map_shared and p2p_buffered: host memory, not NCCL's;
	 * version 9 reduce_scatter_in_place) */
	ck_assert_int_eq(nccl_ops.version, 9);
	ck_assert_ptr_eq(nccl_ops.sendrecv, nccl_sendrecv);
	ck_assert_ptr_null(nccl_ops.map_shared);
	ck_assert_ptr_null(nccl_ops.p2p_buffered);
	ck_assert_int_eq(nccl_sendrecv(&C, sbuf, 100, 2, rbuf, 50, 0, KILN_F32, &kiln_stream, NULL),
			 KILN_OK);
	expect_calls(want, 4);
	ck_assert_int_eq(depth, 0);
	ck_assert_int_eq(C.n, 1); /* one pending entry for the watchdog */
	ck_assert_str_eq(C.ring[C.head].what, "ncclSend+ncclRecv");
	ck_assert_uint_eq(C.ring[C.head].count, 150);
}
END_TEST

/* _i 0: no recv half; 1: no send half (the other's rank not looked at) */
START_TEST(test_sendrecv_one_sided)
{
	char one[160];
	if (_i == 0)
		snprintf(one, sizeof one, "Send %p 7 t%d peer 3 stream %p depth 1", (void *)sbuf,
			 (int)ncclBfloat16, NATIVE);
	else
		snprintf(one, sizeof one, "Recv %p 9 t%d peer 3 stream %p depth 1", (void *)rbuf,
			 (int)ncclBfloat16, NATIVE);
	const char *want[] = { "GroupStart", one, "GroupEnd" };
	kiln_status st = _i == 0 ? nccl_sendrecv(&C, sbuf, 7, 3, rbuf, 0, -5, KILN_BF16,
						  &kiln_stream, NULL)
				 : nccl_sendrecv(&C, sbuf, 0, 99, rbuf, 9, 3, KILN_BF16,
						  &kiln_stream, NULL);
	ck_assert_msg(st == KILN_OK, "%s", kiln_last_error());
	expect_calls(want, 3);
}
END_TEST

START_TEST(test_sendrecv_send_fails)
{
	char s[160];
	snprintf(s, sizeof s, "Send %p 4 t%d peer 0 stream %p depth 1", (void *)sbuf,
		 (int)ncclUint8, NATIVE);
	const char *want[] = { "GroupStart", s, "GroupEnd" }; /* no recv; the group closed */
	send_result = ncclInternalError;
	ck_assert_int_eq(nccl_sendrecv(&C, sbuf, 4, 0, rbuf, 4, 0, KILN_U8, &kiln_stream, NULL),
			 KILN_EIO);
	ck_assert_msg(strstr(kiln_last_error(), "ncclSend+ncclRecv with rank 0 failed") &&
			      strstr(kiln_last_error(), "internal error (recorded)"),
		      "%s", kiln_last_error());
	expect_calls(want, 3);
	ck_assert_int_eq(depth, 0);
	ck_assert_int_eq(C.n, 0);
}
END_TEST

START_TEST(test_sendrecv_in_progress)
{
	end_result = ncclInProgress;
	ck_assert_int_eq(nccl_sendrecv(&C, sbuf, 4, 0, rbuf, 4, 2, KILN_I32, &kiln_stream, NULL),
			 KILN_OK);
	ck_assert_int_eq(ncalls, 4);
	ck_assert_int_eq(async_polls, 3); /* in progress twice, then done */
	ck_assert_int_eq(C.n, 1);
}
END_TEST

START_TEST(test_sendrecv_refused)
{
	struct {
		size_t sc, rc;
		int dst, src, dtype;
		kiln_status st;
		const char *msg;
	} bad[] = {
		{ 1, 1, 1, 0, KILN_F32, KILN_EINVAL, "no such peer" },  /* to itself */
		{ 1, 1, 0, 4, KILN_F32, KILN_EINVAL, "no such peer" },  /* past the world */
		{ 1, 0, -1, 0, KILN_F32, KILN_EINVAL, "no such peer" }, /* a send half's rank */
		{ 0, 0, 0, 2, KILN_F32, KILN_EINVAL, "nothing to send or receive" },
		{ 1, 1, 0, 2, 999, KILN_ENOTSUP, "sendrecv of dtype 999" },
	};
	/* through the core's kiln_comm_sendrecv, the plugin's only caller: it
	 * refuses the empty call and the peers below 0 or this rank, kiln-nccl
	 * a peer past its world and the dtype */
	for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
		kiln_status st = kiln_comm_sendrecv(&nccl_ops, &C, C.rank, sbuf, bad[k].sc, bad[k].dst,
						    rbuf, bad[k].rc, bad[k].src, bad[k].dtype,
						    &kiln_stream, NULL);
		ck_assert_msg(st == bad[k].st && strstr(kiln_last_error(), bad[k].msg),
			      "case %zu: %d '%s'", k, (int)st, kiln_last_error());
	}
	ck_assert_int_eq(ncalls, 0);
}
END_TEST

/* send and recv (comm ops version 4) stay one group each */
START_TEST(test_send_recv_own_groups)
{
	char s[160], r[160];
	snprintf(s, sizeof s, "Send %p 3 t%d peer 2 stream %p depth 1", (void *)sbuf,
		 (int)ncclInt64, NATIVE);
	snprintf(r, sizeof r, "Recv %p 3 t%d peer 2 stream %p depth 1", (void *)rbuf,
		 (int)ncclInt64, NATIVE);
	const char *want[] = { "GroupStart", s, "GroupEnd", "GroupStart", r, "GroupEnd" };
	ck_assert_int_eq(nccl_send(&C, sbuf, 3, KILN_I64, 2, &kiln_stream, NULL), KILN_OK);
	ck_assert_int_eq(nccl_recv(&C, rbuf, 3, KILN_I64, 2, &kiln_stream, NULL), KILN_OK);
	expect_calls(want, 6);
}
END_TEST

/* ---- split on the non-blocking parent ---------------------------------- */

/* A rank in no group: ncclCommSplit said ncclInProgress, so the parent is
 * polled until the split is done (twice in progress, then success) before
 * split returns and the parent can be used again. */
START_TEST(test_split_no_group_waits)
{
	void *out = &C;
	int rank = 5, world = 5;
	split_result = ncclInProgress;
	ck_assert_int_eq(nccl_split(&C, KILN_COMM_NO_GROUP, 0, &out, &rank, &world), KILN_OK);
	ck_assert_ptr_null(out);
	ck_assert_int_eq(rank, -1);
	ck_assert_int_eq(world, 0);
	ck_assert_int_eq(async_polls, 3);
	const char *want[] = { "Split color -1 key 0 blocking 0" };
	expect_calls(want, 1);
	ck_assert_int_eq(dog_inits, dog_destroys);
}
END_TEST

/* A group's split whose new communicator then fails (_i 0: filled at the
 * call; 1: filled when the parent finishes, as NCCL does) or never becomes
 * ready (2): KILN_EIO or KILN_ETIMEOUT, the new communicator aborted, the
 * parent polled to the end of the split first, no watchdog left
 * initialised. */
START_TEST(test_split_group_fails)
{
	static const struct {
		int fill_now;
		ncclResult_t child;
		kiln_status st;
		const char *msg;
	} v[] = {
		{ 1, ncclInternalError, KILN_EIO, "ncclCommSplit (async) failed: internal error (recorded)" },
		{ 0, ncclInternalError, KILN_EIO, "ncclCommSplit (async) failed: internal error (recorded)" },
		{ 1, ncclInProgress, KILN_ETIMEOUT, "the communicator (ncclCommSplit) did not connect within 0.1 s" },
	};
	void *out = &C;
	int rank = 5, world = 5;
	C.timeout_ms = 100;
	split_result = ncclInProgress;
	split_fill_now = v[_i].fill_now;
	child_state = v[_i].child;
	const kiln_status st = nccl_split(&C, 2, 7, &out, &rank, &world);
	ck_assert_msg(st == v[_i].st && strstr(kiln_last_error(), v[_i].msg), "%d '%s'", (int)st,
		      kiln_last_error());
	ck_assert_ptr_null(out);
	ck_assert_int_eq(async_polls, 3);
	ck_assert_int_ge(child_polls, 1);
	const char *want[] = { "Split color 2 key 7 blocking 0", "Abort child" };
	expect_calls(want, 2);
	ck_assert_msg(dog_inits == dog_destroys, "%d watchdog_init, %d watchdog_destroy", dog_inits,
		      dog_destroys);
}
END_TEST

/* The parent fails the split: KILN_EIO naming ncclCommSplit and NCCL's
 * reason; there is no new communicator to abort. */
START_TEST(test_split_parent_fails)
{
	void *out = &C;
	int rank = 5, world = 5;
	split_result = ncclInProgress;
	parent_final = ncclInternalError;
	ck_assert_int_eq(nccl_split(&C, 0, 0, &out, &rank, &world), KILN_EIO);
	ck_assert_msg(strstr(kiln_last_error(), "ncclCommSplit failed") &&
			      strstr(kiln_last_error(), "internal error (recorded)"),
		      "%s", kiln_last_error());
	ck_assert_ptr_null(out);
	ck_assert_int_eq(async_polls, 3);
	const char *want[] = { "Split color 0 key 0 blocking 0" };
	expect_calls(want, 1);
	ck_assert_int_eq(dog_inits, dog_destroys);
}
END_TEST

static Suite *make_nccl_suite(void)
{
	Suite *s = suite_create("nccl_group");
	TCase *tc = tcase_create("p2p");
	tcase_add_checked_fixture(tc, comm_setup, comm_teardown);
	tcase_add_test(tc, test_sendrecv_one_group);
	tcase_add_loop_test(tc, test_sendrecv_one_sided, 0, 2);
	tcase_add_test(tc, test_sendrecv_send_fails);
	tcase_add_test(tc, test_sendrecv_in_progress);
	tcase_add_test(tc, test_sendrecv_refused);
	tcase_add_test(tc, test_send_recv_own_groups);
	suite_add_tcase(s, tc);
	tc = tcase_create("split");
	tcase_add_checked_fixture(tc, comm_setup, comm_teardown);
	tcase_add_test(tc, test_split_no_group_waits);
	tcase_add_loop_test(tc, test_split_group_fails, 0, 3);
	tcase_add_test(tc, test_split_parent_fails);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_nccl_suite };
