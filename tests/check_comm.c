/* tests/check_comm.c - the hot path of the Gloo communicator allocates
 * nothing.  Two ranks are two forked processes, each with its own
 * CPU device (async streams: collectives run on the stream workers, as in
 * training), store client and Gloo communicator.  A step is what a
 * training step asks of the communicator: three gradient buckets
 * allreduced (average, f32), a sync_bn-style allgather, a ZeRO-style
 * in-place allgather and an f32 reduce_scatter, each on the stream with a
 * done event, then a stream sync; and what goes past the bound
 * algorithms: bf16 and f16 allreduces, an in-place allgather of 5.6 MB
 * (ZeRO-1's parameters; through the staging area in three pieces, the
 * last one partial), and NMANY small buffers allreduced, more than the
 * plugin binds (128).  After 3 warm-up steps (which bind
 * Gloo's algorithms to the buffers), every malloc, calloc, realloc and
 * aligned allocation of each rank's whole process (this executable defines them
 * over glibc's, so libstdc++'s operator new, Gloo and its TCP thread are
 * counted too) is counted during 20 steps: the count must be 0.  Every
 * step's results are checked against the values the two ranks put in.
 */
#include <kiln/kiln.h>
#include <kiln/dist.h>
#include <kiln/plugin.h>

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const struct kiln_host *kiln_host_table(void);

/* ---- counting allocator ------------------------------------------------ */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_int counting;
static atomic_long counted;

static inline void note(void)
{
	if (atomic_load_explicit(&counting, memory_order_relaxed))
		atomic_fetch_add(&counted, 1);
}

void *malloc(size_t n) { note(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { note(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { note(); return __libc_realloc(p, n); }
void *aligned_alloc(size_t a, size_t n) { note(); return __libc_memalign(a, n); }
void *memalign(size_t a, size_t n) { note(); return __libc_memalign(a, n); }
int posix_memalign(void **p, size_t a, size_t n)
{
	note();
	*p = __libc_memalign(a, n);
	return *p ? 0 : ENOMEM;
}

/* ---- two ranks --------------------------------------------------------- */

enum { NB = 3, AG = 64, RS = 1024, WARM = 3, STEPS = 20, N16 = 3000, BIG = 700000,
       NMANY = 132, MANY = 8 };
static const size_t bucket_n[NB] = { 300, 50000, 4096 };

static int port_pipe[2];

static uint16_t to_bf16(float f) /* exact for the small integers used here */
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t to_f16(float f)
{
	_Float16 x = (_Float16)f;
	uint16_t h;
	memcpy(&h, &x, 2);
	return h;
}

static float from_f16(uint16_t h)
{
	_Float16 x;
	memcpy(&x, &h, 2);
	return (float)x;
}

struct rank_ctx {
	int rank, busy;
	long allocs;
	char err[512];
};

#define TRY(x)                                                                            \
	do {                                                                              \
		if ((x) != KILN_OK) {                                                     \
			snprintf(r->err, sizeof r->err, "rank %d: %s: %s", r->rank, #x,   \
				 kiln_last_error());                                      \
			goto out;                                                         \
		}                                                                         \
	} while (0)

static void *rank_main(void *arg)
{
	struct rank_ctx *r = arg;
	struct kiln_registry *reg = NULL;
	struct kiln_config *cfg = NULL;
	struct kiln_device *dev = NULL;
	struct kiln_store *store = NULL;
	const struct kiln_plugin *p;
	const struct kiln_comm_ops *ops = NULL;
	void *comm = NULL, *s = NULL, *done = NULL;
	float *b[NB] = { 0 }, *ag_send = NULL, *ag_recv = NULL, *z = NULL, *rs_send = NULL,
	      *rs_recv = NULL;
	float *h = NULL, *big = NULL, *many = NULL;
	uint16_t *bf = NULL, *hf = NULL;
	const int R = r->rank, W = 2;
	const float v = (float)(R + 1); /* rank 0 puts 1s, rank 1 2s */
	TRY(kiln_registry_open(NULL, &reg));
	TRY(kiln_config_new(&cfg));
	TRY(kiln_config_override(cfg, "plugin.cpu.async=1"));
	TRY(kiln_config_override(cfg, "run.threads=1"));
	if (r->busy)
		TRY(kiln_config_override(cfg, "plugin.gloo.busy_poll=1"));
	TRY(kiln_config_validate(cfg, reg));
	TRY(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	TRY(kiln_device_stream_create(dev, &s));
	TRY(kiln_device_event_create(dev, &done));
	if (R == 0) {
		TRY(kiln_store_open("127.0.0.1", 0, 1, 0, W, 10000, &store));
		int pt = kiln_store_port(store);
		if (write(port_pipe[1], &pt, sizeof pt) != sizeof pt)
			snprintf(r->err, sizeof r->err, "rank 0: cannot pass the port");
	} else {
		int pt = 0;
		if (read(port_pipe[0], &pt, sizeof pt) != sizeof pt) {
			snprintf(r->err, sizeof r->err, "rank 1: no port from rank 0");
			goto out;
		}
		TRY(kiln_store_open("127.0.0.1", pt, 0, R, W, 10000, &store));
	}
	TRY(kiln_store_rendezvous(store, R, W, 10000));
	TRY(kiln_registry_find(reg, KILN_PLUGIN_COMM, "gloo", &p));
	ops = p->ops;
	TRY(ops->open(kiln_host_table(), cfg, store, dev, R, W, 10000, &comm));
	for (int i = 0; i < NB; i++)
		TRY(kiln_device_alloc(dev, bucket_n[i] * 4, (void **)&b[i]));
	TRY(kiln_device_alloc(dev, AG * 4, (void **)&ag_send));
	TRY(kiln_device_alloc(dev, W * AG * 4, (void **)&ag_recv));
	TRY(kiln_device_alloc(dev, W * AG * 4, (void **)&z));
	TRY(kiln_device_alloc(dev, W * RS * 4, (void **)&rs_send));
	TRY(kiln_device_alloc(dev, RS * 4, (void **)&rs_recv));
	TRY(kiln_device_alloc(dev, (size_t)W * BIG * 4, (void **)&big));
	TRY(kiln_device_alloc(dev, NMANY * MANY * 4, (void **)&many));
	TRY(kiln_device_alloc(dev, N16 * 2, (void **)&bf));
	TRY(kiln_device_alloc(dev, N16 * 2, (void **)&hf));
	h = __libc_malloc(W * RS * 4 + 50000 * 4);
	for (int step = 0; step < WARM + STEPS; step++) {
		if (step == WARM)
			atomic_store(&counting, 1);
		/* the CPU device's memory is host memory: fill it directly */
		for (int i = 0; i < NB; i++)
			for (size_t k = 0; k < bucket_n[i]; k++)
				b[i][k] = v * (float)(k % 7 + step);
		for (int k = 0; k < AG; k++)
			ag_send[k] = v * (float)(k + step), z[R * AG + k] = -v * (float)k;
		for (int k = 0; k < W * RS; k++)
			rs_send[k] = v * (float)(k % 5);
		for (int k = 0; k < N16; k++)
			bf[k] = to_bf16(v * (float)(k % 7 + step)), hf[k] = to_f16(v * (float)(k % 5 + step));
		for (int k = 0; k < BIG; k++)
			big[(size_t)R * BIG + k] = v * (float)(k % 1000 + step);
		for (int k = 0; k < NMANY * MANY; k++)
			many[k] = v * (float)(k + step);
		for (int i = 0; i < NB; i++)
			TRY(ops->allreduce(comm, b[i], bucket_n[i], KILN_F32, KILN_REDUCE_AVG, s, done));
		TRY(ops->allgather(comm, ag_send, ag_recv, AG, KILN_F32, s, done));
		TRY(ops->allgather(comm, z + R * AG, z, AG, KILN_F32, s, done));
		TRY(ops->reduce_scatter(comm, rs_send, rs_recv, RS, KILN_F32, KILN_REDUCE_SUM, s, done));
		TRY(ops->allreduce(comm, bf, N16, KILN_BF16, KILN_REDUCE_AVG, s, done));
		TRY(ops->allreduce(comm, hf, N16, KILN_F16, KILN_REDUCE_SUM, s, done));
		TRY(ops->allgather(comm, big + (size_t)R * BIG, big, BIG, KILN_F32, s, done));
		for (int i = 0; i < NMANY; i++)
			TRY(ops->allreduce(comm, many + i * MANY, MANY, KILN_F32, KILN_REDUCE_SUM, s,
					   done));
		TRY(kiln_device_stream_sync(dev, s));
		/* averages of 1x and 2x: 1.5x; sums 3x */
		for (int i = 0; i < NB; i++)
			for (size_t k = 0; k < bucket_n[i]; k++)
				if (b[i][k] != 1.5f * (float)(k % 7 + step)) {
					snprintf(r->err, sizeof r->err, "rank %d step %d: bucket %d [%zu] = %g, want %g",
						 R, step, i, k, b[i][k], 1.5 * (double)(k % 7 + step));
					goto out;
				}
		for (int q = 0; q < W; q++)
			for (int k = 0; k < AG; k++)
				if (ag_recv[q * AG + k] != (float)(q + 1) * (float)(k + step) ||
				    z[q * AG + k] != -(float)(q + 1) * (float)k) {
					snprintf(r->err, sizeof r->err, "rank %d step %d: allgather slice %d [%d] wrong",
						 R, step, q, k);
					goto out;
				}
		for (int k = 0; k < RS; k++)
			if (rs_recv[k] != 3.0f * (float)((R * RS + k) % 5)) {
				snprintf(r->err, sizeof r->err, "rank %d step %d: reduce_scatter [%d] = %g", R,
					 step, k, rs_recv[k]);
				goto out;
			}
		for (int k = 0; k < N16; k++)
			if (from_bf16(bf[k]) != 1.5f * (float)(k % 7 + step) ||
			    from_f16(hf[k]) != 3.0f * (float)(k % 5 + step)) {
				snprintf(r->err, sizeof r->err, "rank %d step %d: bf16/f16 [%d] = %g, %g", R,
					 step, k, from_bf16(bf[k]), from_f16(hf[k]));
				goto out;
			}
		for (int q = 0; q < W; q++)
			for (int k = 0; k < BIG; k++)
				if (big[(size_t)q * BIG + k] != (float)(q + 1) * (float)(k % 1000 + step)) {
					snprintf(r->err, sizeof r->err, "rank %d step %d: big allgather slice %d [%d] = %g",
						 R, step, q, k, big[(size_t)q * BIG + k]);
					goto out;
				}
		for (int k = 0; k < NMANY * MANY; k++)
			if (many[k] != 3.0f * (float)(k + step)) {
				snprintf(r->err, sizeof r->err, "rank %d step %d: buffer %d of %d [%d] = %g", R,
					 step, k / MANY, NMANY, k % MANY, many[k]);
				goto out;
			}
	}
	atomic_store(&counting, 0);
	r->allocs = atomic_load(&counted);
	/* no rank closes its pairs before both have stopped counting (a
	 * peer's close is an EOF whose error Gloo's event loop allocates);
	 * the barrier's own failure would be that EOF, after the count */
	(void)ops->barrier(comm);
out:
	atomic_store(&counting, 0);
	if (comm)
		ops->close(comm);
	for (int i = 0; i < NB; i++)
		if (dev)
			kiln_device_free(dev, b[i]);
	if (dev) {
		kiln_device_free(dev, ag_send), kiln_device_free(dev, ag_recv), kiln_device_free(dev, z);
		kiln_device_free(dev, rs_send), kiln_device_free(dev, rs_recv);
		kiln_device_free(dev, big), kiln_device_free(dev, many);
		kiln_device_free(dev, bf), kiln_device_free(dev, hf);
		kiln_device_event_destroy(dev, done);
		kiln_device_stream_destroy(dev, s);
		kiln_device_close(dev);
	}
	free(h);
	if (store)
		kiln_store_close(store);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return NULL;
}

/* _i = 0: Gloo's event loop; 1: [plugin.gloo] busy_poll (synchronous
 * pairs, every collective old-style) */
START_TEST(test_gloo_no_alloc)
{
	struct kiln_registry *reg;
	const struct kiln_plugin *p;
	ck_assert_int_eq(kiln_registry_open(NULL, &reg), KILN_OK);
	int have = kiln_registry_find(reg, KILN_PLUGIN_COMM, "gloo", &p) == KILN_OK;
	kiln_registry_close(reg);
	if (!have) {
		printf("gloo plugin not built: skipped\n");
		return;
	}
	struct rank_ctx rc[2];
	int res[2][2];
	pid_t pid[2];
	ck_assert_int_eq(pipe(port_pipe), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(pipe(res[i]), 0);
		if (!(pid[i] = fork())) {
			memset(&rc[i], 0, sizeof rc[i]);
			rc[i].rank = i;
			rc[i].busy = _i;
			rc[i].allocs = -1;
			alarm(50);
			rank_main(&rc[i]);
			_exit(write(res[i][1], &rc[i], sizeof rc[i]) == sizeof rc[i] ? 0 : 1);
		}
		ck_assert_int_gt(pid[i], 0);
	}
	for (int i = 0; i < 2; i++) {
		int status;
		memset(&rc[i], 0, sizeof rc[i]);
		close(res[i][1]);
		if (read(res[i][0], &rc[i], sizeof rc[i]) != sizeof rc[i])
			snprintf(rc[i].err, sizeof rc[i].err, "rank %d died without a result", i);
		waitpid(pid[i], &status, 0);
	}
	ck_assert_msg(!*rc[0].err && !*rc[1].err, "%s %s", rc[0].err, rc[1].err);
	for (int i = 0; i < 2; i++) {
		printf("gloo%s rank %d: %ld heap allocations in %d steady-state steps (%d collectives each)\n",
		       _i ? " (busy_poll)" : "", i, rc[i].allocs, STEPS, NB + 6 + NMANY);
		ck_assert_msg(rc[i].allocs == 0,
			      "rank %d: %ld heap allocations during %d steady-state steps of collectives (want 0)",
			      i, rc[i].allocs, STEPS);
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("comm");
	TCase *tc = tcase_create("gloo");
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_gloo_no_alloc, 0, 2);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
