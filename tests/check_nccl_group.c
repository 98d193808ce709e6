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
 * case: that is the deadlock of issue 21 item 2 on GPUs. */
#include <check.h>
#include "check_main.h"

#include "../plugins/nccl/nccl.c"

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
static int async_polls; /* ncclCommGetAsyncError calls */

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
	ncalls = depth = async_polls = 0;
	send_result = end_result = ncclSuccess;
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
	(void)comm;
	*r = ++async_polls < 3 ? ncclInProgress : ncclSuccess;
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
 * collectives, the watchdog's thread): reaching one is a failure. */
#define UNUSED_CALL(ret, name, ...)                                                               \
	ret name(__VA_ARGS__)                                                                     \
	{                                                                                         \
		ck_abort_msg("%s called", #name);                                                 \
		abort();                                                                          \
	}
UNUSED_CALL(ncclResult_t, ncclCommAbort, ncclComm_t c)
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
UNUSED_CALL(ncclResult_t, ncclCommSplit, ncclComm_t c, int color, int key, ncclComm_t *out,
	    ncclConfig_t *cfg)
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
	/* (version 8 adds map_shared and p2p_buffered: host memory, not NCCL's) */
	ck_assert_int_eq(nccl_ops.version, 8);
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
	return s;
}

static const struct check_main check_suite = { .suite = make_nccl_suite };
