/* tests/mpi_coll.c - the MPI communicator's collectives, element by
 * element: one rank of `mpirun -np N tests/mpi_coll [KEY=VALUE...]`
 * (tests/mpi_coll.sh starts it with 2, 3 and 4 ranks, with kiln's
 * shared-memory collectives on and off, on async and synchronous
 * streams).  Every rank fills its buffers with values it can compute for
 * every other rank, so each checks the whole result on its own:
 *   - allreduce (sum, avg) of f32, bf16 and f16 at counts around the
 *     engine's boundaries (one-flag rounds up to 16 KiB, 256 KiB rounds,
 *     a partial last round, parts that are not whole cache lines);
 *   - reduce_scatter and allgather (in place and not; the plugin must say
 *     reduce_scatter_in_place, comm ops version 9);
 *   - 200 small allreduces back to back between large ones (the two
 *     staging buffers' reuse);
 *   - with shared memory (comm ops alloc_shared, [plugin.mpi] zero_copy =
 *     1): allreduces of slices of the shared buffer (no staging), every
 *     dtype, at offsets as DDP's buckets have them, interleaved with
 *     staged ones; with zero_copy = 0 alloc_shared must say KILN_ENOTSUP.
 * With [plugin.mpi] shm = 1 the results must equal, bit for bit, the sum
 * in rank order in f32 (16-bit values widened, averages scaled, then
 * rounded once: plugins/common/shmcoll.h); with shm = 0 (Open MPI's
 * order, 16-bit sums rounded at each step) they must be within a few
 * units in the last place of it.  Exit 0 when every check passed; 1 with
 * each failure printed, naming rank, collective, dtype, count and index.
 * Then sub-communicators (split): a sum and p2p within each group.
 * Last, sendrecv (comm ops version 7): every rank sends 3 MiB to the next
 * and receives 3 MiB from the one before at once (a ring shift, past any
 * eager limit: a blocking send first would wait for ever), twice, then a
 * one-sided sendrecv in order with plain p2p between ranks 0 and 1; and,
 * at thread_level = serialized, send_now sends nothing (wait = 0) or
 * refuses (wait = 1).
 *
 * `tests/mpi_coll --wait [KEY=VALUE...]` (2 ranks, a stream worker, wait
 * = yield or sleep) runs only test_wait_cpu: rank 0 waits WAIT_US for
 * rank 1 in a recv, a sendrecv and a broadcast, and must sleep rather
 * than test (or yield) the whole time; `--wait-p2p` the recv and the
 * sendrecv alone (for wait = block, whose collectives block).
 *
 * `tests/mpi_coll --pool [KEY=VALUE...]` (async streams) runs only
 * test_pool_failed: the communicator's job pool on a stream that fails
 * (session 47; [dist] timeout POOL_TIMEOUT_MS here).  A host function
 * holds the stream; POOL allreduces queued behind it take every slot of
 * the pool, and the next one waits for a slot while a thread lets the
 * host function fail the stream POOL_HOLD_US later.  That wait must end
 * with the stream's error well within the timeout (the stream skips the
 * jobs and gives their slots back; before session 46 it slept the whole
 * timeout).  Then POOL + 44 allreduces on a
 * new stream must run (before session 47 the skipped jobs kept their
 * slots for good: the first waited the whole timeout and failed, "256
 * collectives are in flight"), their results checked. */
#include <kiln/kiln.h>
#include <kiln/dist.h>
#include <kiln/plugin.h>

#include "../plugins/common/half.h"
#include "held_fail.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const struct kiln_host *kiln_host_table(void);

static int R, W, exact, fails;
static struct kiln_device *dev;
static const struct kiln_comm_ops *ops;
static void *comm, *stream, *done;

#define TRY(x)                                                                             \
	do {                                                                               \
		if ((x) != KILN_OK) {                                                      \
			fprintf(stderr, "rank %d: %s: %s\n", R, #x, kiln_last_error());    \
			exit(2);                                                           \
		}                                                                          \
	} while (0)

static const char *dt_name(int dt)
{
	return dt == KILN_F32 ? "f32" : dt == KILN_BF16 ? "bf16" : "f16";
}

/* rank r's element i, as f32 (exactly representable in dt) */
static float value(int dt, int r, size_t i)
{
	const unsigned h = (unsigned)(i * 2654435761u + (unsigned)r * 40503u) % 2001u;
	const float v = ((float)h - 1000.0f) * 0.00123f + (float)r * 0.0101f;
	return dt == KILN_F32 ? v : dt == KILN_BF16 ? half_bf16_f32(half_f32_bf16(v))
						     : half_f16_f32(half_f32_f16(v));
}

static void put(void *p, int dt, size_t i, float v)
{
	if (dt == KILN_F32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = dt == KILN_BF16 ? half_f32_bf16(v) : half_f32_f16(v);
}

static float get(const void *p, int dt, size_t i)
{
	return dt == KILN_F32 ? ((const float *)p)[i]
	       : dt == KILN_BF16 ? half_bf16_f32(((const uint16_t *)p)[i])
				 : half_f16_f32(((const uint16_t *)p)[i]);
}

/* the reference: element i summed over the ranks in rank order in f32,
 * scaled, rounded once to dt */
static float reference(int dt, size_t i, float scale)
{
	float v = value(dt, 0, i);
	for (int r = 1; r < W; r++)
		v += value(dt, r, i);
	if (scale != 1.0f)
		v *= scale;
	uint16_t h;
	put(&h, dt, 0, v);
	return dt == KILN_F32 ? v : get(&h, dt, 0);
}

/* whether got is the reference: bit for bit (shm), or within 4 units of
 * dt's precision of the sum's magnitude (Open MPI's order) */
static int agrees(int dt, float got, float want, float mag)
{
	if (exact)
		return memcmp(&got, &want, 4) == 0;
	const float eps = dt == KILN_F32 ? 0x1p-23f : dt == KILN_BF16 ? 0x1p-8f : 0x1p-11f;
	return fabsf(got - want) <= 4.0f * eps * (mag + 1e-3f) * (float)W;
}

static void check(const char *what, int dt, size_t count, size_t i, float got, float want,
		  float mag)
{
	if (agrees(dt, got, want, mag))
		return;
	if (fails++ < 20)
		printf("FAIL rank %d of %d: %s %s count %zu: [%zu] = %.9g, want %.9g\n", R, W, what,
		       dt_name(dt), count, i, (double)got, (double)want);
}

static float magnitude(int dt, size_t i)
{
	float m = 0;
	for (int r = 0; r < W; r++)
		m += fabsf(value(dt, r, i));
	return m;
}

static void sync_stream(void)
{
	TRY(kiln_device_stream_sync(dev, stream));
}

static void test_allreduce(void *buf, int dt, size_t count, int op)
{
	const float scale = op == KILN_REDUCE_AVG ? 1.0f / (float)W : 1.0f;
	for (size_t i = 0; i < count; i++)
		put(buf, dt, i, value(dt, R, i));
	TRY(ops->allreduce(comm, buf, count, dt, op, stream, done));
	sync_stream();
	for (size_t i = 0; i < count; i++)
		check(op == KILN_REDUCE_AVG ? "allreduce avg" : "allreduce sum", dt, count, i,
		      get(buf, dt, i), reference(dt, i, scale), magnitude(dt, i) * scale);
}

static void test_reduce_scatter(void *send, void *recv, int dt, size_t count, int op, int in_place)
{
	const float scale = op == KILN_REDUCE_AVG ? 1.0f / (float)W : 1.0f;
	for (size_t i = 0; i < count * (size_t)W; i++)
		put(send, dt, i, value(dt, R, i));
	if (in_place)
		recv = (char *)send + (size_t)R * count * (dt == KILN_F32 ? 4 : 2);
	TRY(ops->reduce_scatter(comm, send, recv, count, dt, op, stream, done));
	sync_stream();
	for (size_t i = 0; i < count; i++) {
		const size_t g = (size_t)R * count + i;
		check(in_place ? "reduce_scatter in place" : "reduce_scatter", dt, count, i,
		      get(recv, dt, i), reference(dt, g, scale),
		      magnitude(dt, g) * scale);
	}
}

static void test_allgather(void *send, void *recv, int dt, size_t count, int in_place)
{
	const size_t es = dt == KILN_F32 ? 4 : 2;
	char *mine = in_place ? (char *)recv + (size_t)R * count * es : send;
	memset(recv, 0xff, count * (size_t)W * es);
	for (size_t i = 0; i < count; i++)
		put(mine, dt, i, value(dt, R, i));
	TRY(ops->allgather(comm, mine, recv, count, dt, stream, done));
	sync_stream();
	for (int r = 0; r < W; r++)
		for (size_t i = 0; i < count; i++) {
			const float got = get(recv, dt, (size_t)r * count + i), want = value(dt, r, i);
			if (memcmp(&got, &want, 4) && fails++ < 20)
				printf("FAIL rank %d of %d: allgather%s %s count %zu: rank %d's [%zu] = %.9g, want %.9g\n",
				       R, W, in_place ? " in place" : "", dt_name(dt), count, r, i,
				       (double)got, (double)want);
		}
}

/* comm ops version 5: split into color R % 2 ranked by -R (the higher
 * world rank first); within each group a sum of (R + 1) * (i + 1) and,
 * between group ranks 0 and 1, a send each way of the world rank's
 * pattern, checked exactly; the group is closed before the parent. */
static void test_split(float *x, size_t n)
{
	void *g = NULL;
	int gr = -1, gw = 0;
	float want = 0;
	TRY(ops->split(comm, R % 2, -R, &g, &gr, &gw));
	int members[64], nm = 0; /* the group in its rank order */
	for (int r = W - 1; r >= 0; r--)
		if (r % 2 == R % 2 && nm < 64)
			members[nm++] = r, want += (float)(r + 1);
	if (!g || gw != nm || members[gr] != R) {
		printf("FAIL rank %d: split gave group rank %d of %d (want %d ranks)\n", R, gr, gw, nm);
		fails++;
		return;
	}
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(R + 1) * (float)(i + 1);
	TRY(ops->allreduce(g, x, n, KILN_F32, KILN_REDUCE_SUM, stream, done));
	sync_stream();
	for (size_t i = 0; i < n; i++)
		check("split allreduce", KILN_F32, n, i, x[i], want * (float)(i + 1), 0);
	if (gw >= 2 && gr < 2) {
		const int peer = 1 - gr;
		for (size_t i = 0; i < n; i++)
			x[i] = (float)R * 1000.0f + (float)i;
		float *y = x + n;
		if (gr == 0) {
			TRY(ops->send(g, x, n, KILN_F32, peer, stream, NULL));
			TRY(ops->recv(g, y, n, KILN_F32, peer, stream, done));
		} else {
			TRY(ops->recv(g, y, n, KILN_F32, peer, stream, NULL));
			TRY(ops->send(g, x, n, KILN_F32, peer, stream, done));
		}
		sync_stream();
		for (size_t i = 0; i < n; i++)
			check("split p2p", KILN_F32, n, i, y[i],
			      (float)members[peer] * 1000.0f + (float)i, 0);
	}
	ops->close(g);
}

/* comm ops version 7 (see the top) */
enum { SRN = (3 << 18) + 77 };

static float sr_val(int from, int m, size_t i)
{
	return (float)(from * 100000 + m * 1000) + (float)(i % 991) * 0.25f;
}

static void sr_expect(const char *what, const float *y, int from, int m)
{
	for (size_t i = 0; i < SRN; i++)
		if (y[i] != sr_val(from, m, i)) {
			if (fails++ < 20)
				printf("FAIL rank %d of %d: %s: [%zu] = %.9g, want %.9g\n", R, W, what, i,
				       (double)y[i], (double)sr_val(from, m, i));
			return;
		}
}

/* test_sendrecv's checks; x, y: SRN floats each */
static void sendrecv_run(float *x, float *y)
{
	const int dst = (R + 1) % W, src = (R + W - 1) % W;
	if (ops->version < 7 || !ops->sendrecv) {
		printf("FAIL rank %d: no sendrecv (comm ops version %u)\n", R, ops->version);
		fails++;
		return;
	}
	for (int m = 0; m < 2; m++) {
		for (size_t i = 0; i < SRN; i++)
			x[i] = sr_val(R, m, i), y[i] = -1.0f;
		TRY(ops->sendrecv(comm, x, SRN, dst, y, SRN, src, KILN_F32, stream, done));
		TRY(kiln_device_event_sync(dev, done));
		sr_expect("sendrecv ring", y, src, m);
	}
	if (R > 1)
		return;
	for (size_t i = 0; i < SRN; i++)
		x[i] = sr_val(R, 2, i), y[i] = -1.0f;
	if (R == 0) { /* a plain send, then a sendrecv with no recv */
		TRY(ops->send(comm, x, 10, KILN_F32, 1, stream, NULL));
		TRY(ops->sendrecv(comm, x + 10, SRN - 10, 1, NULL, 0, -1, KILN_F32, stream, done));
	} else { /* a sendrecv with no send, then a plain recv */
		TRY(ops->sendrecv(comm, NULL, 0, -1, y, 10, 0, KILN_F32, stream, NULL));
		TRY(ops->recv(comm, y + 10, SRN - 10, KILN_F32, 0, stream, done));
	}
	sync_stream();
	if (R == 1)
		sr_expect("one-sided sendrecv between send and recv", y, 0, 2);
}

/* send_now (comm ops version 6) at thread_level = serialized (the
 * default): an MPI call on the caller's thread could meet a stream's job
 * on another (undefined under MPI_THREAD_SERIALIZED), so wait = 0 sends
 * nothing and wait = 1 is refused, naming the setting (session 33's
 * review: it called MPI_Isend there).  Rank 0 only: nothing is sent. */
static void test_send_now_serialized(void)
{
	if (R != 0 || ops->version < 6 || !ops->send_now)
		return;
	float x = 1.0f;
	int sent = -1;
	kiln_status st = ops->send_now(comm, &x, 1, KILN_F32, 1, 0, &sent);
	if ((st != KILN_OK || sent != 0) && fails++ < 20)
		printf("FAIL rank 0: send_now wait = 0 at serialized: status %d, sent %d (want 0, 0)\n", st, sent);
	sent = -1;
	st = ops->send_now(comm, &x, 1, KILN_F32, 1, 1, &sent);
	if ((st != KILN_ENOTSUP || sent != 0 || !strstr(kiln_last_error(), "thread_level = multiple")) &&
	    fails++ < 20)
		printf("FAIL rank 0: send_now wait = 1 at serialized: status %d, sent %d, '%s' (want KILN_ENOTSUP naming thread_level = multiple)\n",
		       st, sent, st ? kiln_last_error() : "");
}

static void test_sendrecv(void)
{
	float *x = NULL, *y = NULL;
	TRY(kiln_device_alloc(dev, SRN * 4, (void **)&x));
	TRY(kiln_device_alloc(dev, SRN * 4, (void **)&y));
	sendrecv_run(x, y);
	kiln_device_free(dev, x);
	kiln_device_free(dev, y);
}

/* Rank 1 sleeps WAIT_US before its send to rank 0, then before a
 * broadcast it roots; rank 0's waits (the stream worker's MPI_Test loop)
 * must take at most WAIT_CPU_US of its process's CPU time each (the
 * worker, the main thread's stream sync, MPI's own threads).  A wait that
 * tests or yields the whole time takes ~WAIT_US on a free core; a napping
 * one took 13-19 ms here and 37 ms on a loaded CI machine (its ~500 naps
 * of up to 1 ms each wake MPI_Test), so the bound is a fifth of the wait.
 * Round 0 of each runs without the sleep (both ranks warm). */
enum { WAIT_US = 500000, WAIT_CPU_US = 100000, WAITN = 1000 };

static long cpu_now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static double wall_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_wait_cpu(float *x, int kinds)
{
	static const char *const names[] = { "recv", "sendrecv", "broadcast" };
	for (int kind = 0; kind < kinds; kind++)
		for (int round = 0; round < 2; round++) {
			for (int i = 0; i < WAITN; i++)
				x[i] = R == 1 ? (float)(i * 3 + kind) : -1.0f;
			if (round && R == 1)
				usleep(WAIT_US);
			const double t0 = wall_now_s();
			const long c0 = cpu_now_us();
			if (kind == 0 && R == 0)
				TRY(ops->recv(comm, x, WAITN, KILN_F32, 1, stream, done));
			else if (kind == 0)
				TRY(ops->send(comm, x, WAITN, KILN_F32, 0, stream, done));
			else if (kind == 1) /* rank 1 sends x[WAITN..] back to rank 0 */
				TRY(ops->sendrecv(comm, R ? x : x + WAITN, WAITN, 1 - R,
						  R ? x + WAITN : x, WAITN, 1 - R, KILN_F32, stream, done));
			else
				TRY(ops->broadcast(comm, x, WAITN, KILN_F32, 1, stream, done));
			sync_stream();
			const long cpu = cpu_now_us() - c0;
			const double wall = wall_now_s() - t0;
			for (int i = 0; i < WAITN; i++)
				if (x[i] != (float)(i * 3 + kind) && fails++ < 20)
					printf("FAIL rank %d: %s: [%d] = %g, want %d\n", R, names[kind], i,
					       (double)x[i], i * 3 + kind);
			if (!round || R != 0)
				continue;
			printf("rank 0 waited %.3f s for rank 1 in a %s, on %.1f ms of CPU time\n", wall,
			       names[kind], cpu / 1e3);
			if (wall < WAIT_US * 0.8e-6 && fails++ < 20)
				printf("FAIL rank 0: the %s took %.3f s: it did not wait for rank 1's %d us\n",
				       names[kind], wall, WAIT_US);
			if (cpu > WAIT_CPU_US && fails++ < 20)
				printf("FAIL rank 0: %ld us of CPU time waiting %.3f s for rank 1's %s (want <= %d us)\n",
				       cpu, wall, names[kind], WAIT_CPU_US);
		}
}

/* --pool (see the top): the pool's size (mpi_comm.h, JOBS) */
enum { POOL = 256, POOL_N = 64, POOL_TIMEOUT_MS = 5000, POOL_HOLD_US = 300000 };

static struct held_fail pool_held; /* the stream's first task (held_fail.h) */

static void test_pool_failed(float *x)
{
	for (int i = 0; i < POOL_N; i++)
		x[i] = (float)i;
	TRY(held_fail_hold(&pool_held, dev, stream, "rank %d: the planned failure of the stream", R));
	for (int k = 0; k < POOL; k++)
		TRY(ops->allreduce(comm, x, POOL_N, KILN_F32, KILN_REDUCE_AVG, stream, NULL));
	/* the pool is full: this one waits for a slot until the stream fails */
	if (held_fail_release_after(&pool_held, POOL_HOLD_US)) {
		fprintf(stderr, "rank %d: pthread_create failed\n", R);
		exit(2);
	}
	const double t0 = wall_now_s();
	kiln_status st = ops->allreduce(comm, x, POOL_N, KILN_F32, KILN_REDUCE_AVG, stream, NULL);
	const double waited = wall_now_s() - t0;
	held_fail_join(&pool_held);
	printf("rank %d: the allreduce waiting for a slot ended after %.3f s: %s\n", R, waited,
	       st ? kiln_last_error() : "enqueued");
	if (!st || !strstr(kiln_last_error(), "planned failure")) {
		printf("FAIL rank %d: the enqueue on the failed stream: status %d, want the stream's error\n",
		       R, (int)st);
		fails++;
	}
	if (waited > POOL_HOLD_US * 1e-6 + 1.5) {
		printf("FAIL rank %d: the wait for a slot on the failed stream took %.3f s ([dist] timeout %d ms; want the failure within 1.5 s)\n",
		       R, waited, POOL_TIMEOUT_MS);
		fails++;
	}
	if (!kiln_device_stream_sync(dev, stream)) {
		printf("FAIL rank %d: the failed stream synced without its error\n", R);
		fails++;
	}
	/* a new stream: every slot is free again */
	void *s2 = NULL;
	TRY(kiln_device_stream_create(dev, &s2));
	const double t1 = wall_now_s();
	for (int k = 0; k < POOL + 44; k++)
		if ((st = ops->allreduce(comm, x, POOL_N, KILN_F32, KILN_REDUCE_AVG, s2, NULL))) {
			printf("FAIL rank %d: allreduce %d of %d on a new stream after the failed one: %s\n",
			       R, k + 1, POOL + 44, kiln_last_error());
			fails++;
			break;
		}
	TRY(kiln_device_stream_sync(dev, s2));
	printf("rank %d: %d allreduces on a new stream in %.3f s\n", R, POOL + 44, wall_now_s() - t1);
	for (int i = 0; i < POOL_N; i++)
		if (x[i] != (float)i && fails++ < 20)
			printf("FAIL rank %d: after the allreduces on the new stream [%d] = %g, want %d\n", R, i,
			       (double)x[i], i);
	kiln_device_stream_destroy(dev, s2);
}

int main(int argc, char **argv)
{
	struct kiln_dist_env env;
	struct kiln_registry *reg = NULL;
	struct kiln_config *cfg = NULL;
	const struct kiln_plugin *p;
	kiln_log_set_level(KILN_LOG_INFO); /* the plugin's count of copy-free allreduces at close */
	TRY(kiln_dist_env_read(&env));
	R = env.rank, W = env.world;
	TRY(kiln_registry_open(NULL, &reg));
	TRY(kiln_config_new(&cfg));
	TRY(kiln_config_override(cfg, "run.threads=1"));
	/* --wait-p2p: the recv and sendrecv only (the collective blocks
	 * under wait = block) */
	const int p2p_only = argc > 1 && !strcmp(argv[1], "--wait-p2p");
	const int pool_only = argc > 1 && !strcmp(argv[1], "--pool");
	const int wait_only = p2p_only || (argc > 1 && !strcmp(argv[1], "--wait"));
	for (int i = 1 + (wait_only || pool_only); i < argc; i++)
		TRY(kiln_config_override(cfg, argv[i]));
	TRY(kiln_config_validate(cfg, reg));
	TRY(kiln_device_open(reg, cfg, "cpu", 0, &dev));
	TRY(kiln_device_stream_create(dev, &stream));
	TRY(kiln_device_event_create(dev, &done));
	TRY(kiln_registry_find(reg, KILN_PLUGIN_COMM, "mpi", &p));
	ops = p->ops;
	TRY(ops->open(kiln_host_table(), cfg, NULL, dev, R, W, pool_only ? POOL_TIMEOUT_MS : 30000, &comm));
	const char *desc = ops->describe(comm);
	exact = strstr(desc, "kiln's shared-memory") != NULL;
	if (R == 0)
		printf("%d ranks: %s\n", W, desc);
	/* counts: one element; a partial line; a whole one; the one-flag
	 * limit (16 KiB of f32) and one past it; one 256 KiB round of f32;
	 * two rounds and a bit; several rounds, odd */
	static const size_t counts[] = { 1, 7, 16, 4096, 4097, 65536, 2 * 65536 + 13, 300001 };
	const size_t ncounts = sizeof counts / sizeof *counts, max = 300001;
	void *a = NULL, *b = NULL;
	TRY(kiln_device_alloc(dev, max * 4 * (size_t)W, &a));
	TRY(kiln_device_alloc(dev, max * 4 * (size_t)W, &b));
	char *sh = NULL;
	if (wait_only) {
		test_wait_cpu(a, p2p_only ? 2 : 3);
		goto end;
	}
	if (pool_only) {
		test_pool_failed(a);
		goto end;
	}
	static const int dts[] = { KILN_F32, KILN_BF16, KILN_F16 };
	if (ops->version < 9 || !ops->reduce_scatter_in_place) {
		printf("FAIL rank %d: mpi does not say reduce_scatter_in_place (comm ops version %u)\n",
		       R, ops->version);
		fails++;
	}
	for (int d = 0; d < 3; d++)
		for (size_t k = 0; k < ncounts; k++) {
			const size_t n = counts[k];
			test_allreduce(a, dts[d], n, KILN_REDUCE_SUM);
			test_allreduce(a, dts[d], n, KILN_REDUCE_AVG);
			test_reduce_scatter(a, b, dts[d], n, k & 1 ? KILN_REDUCE_AVG : KILN_REDUCE_SUM, 0);
			test_reduce_scatter(a, NULL, dts[d], n, k & 1 ? KILN_REDUCE_SUM : KILN_REDUCE_AVG, 1);
			test_allgather(a, b, dts[d], n, 0);
			test_allgather(NULL, b, dts[d], n, 1);
		}
	/* the staging buffers' reuse: small rounds back to back (both
	 * parities), between multi-round ones, enqueued before any wait */
	test_allreduce(a, KILN_F32, 300001, KILN_REDUCE_SUM);
	for (int k = 0; k < 200; k++) {
		float *v = (float *)b + (size_t)k * 8;
		for (size_t i = 0; i < 7; i++)
			v[i] = value(KILN_F32, R, i + (size_t)k);
		TRY(ops->allreduce(comm, v, 7, KILN_F32, KILN_REDUCE_SUM, stream, NULL));
	}
	sync_stream();
	for (int k = 0; k < 200; k++)
		for (size_t i = 0; i < 7; i++) {
			float want = value(KILN_F32, 0, i + (size_t)k);
			for (int r = 1; r < W; r++)
				want += value(KILN_F32, r, i + (size_t)k);
			check("back-to-back allreduce", KILN_F32, 7, (size_t)k * 8 + i,
			      ((float *)b)[(size_t)k * 8 + i], want, 8.0f * (float)W);
		}
	test_allreduce(a, KILN_F32, 2 * 65536 + 13, KILN_REDUCE_AVG);
	/* the shared buffer */
	kiln_status st = ops->version >= 3 && ops->alloc_shared
				 ? ops->alloc_shared(comm, max * 4 + 4096, (void **)&sh)
				 : KILN_ENOTSUP;
	if (R == 0)
		printf("alloc_shared: %s\n", st ? kiln_last_error() : "given");
	if (st && st != KILN_ENOTSUP) {
		printf("FAIL rank %d: alloc_shared: %s\n", R, kiln_last_error());
		fails++;
	}
	if (!st) {
		for (size_t i = 0; i < max * 4 + 4096; i++)
			if (sh[i] && fails++ < 20)
				printf("FAIL rank %d: alloc_shared's memory is not zeroed at %zu\n", R, i);
		for (int d = 0; d < 3; d++)
			for (size_t k = 0; k < ncounts; k++) {
				/* a bucket's slice: a multiple of 16 floats in */
				char *at = sh + (k % 3) * 1024;
				test_allreduce(at, dts[d], counts[k], KILN_REDUCE_SUM);
				test_allreduce(at, dts[d], counts[k], KILN_REDUCE_AVG);
				test_allreduce(a, dts[d], counts[k], KILN_REDUCE_SUM);
			}
	}
	test_split((float *)a, 1000);
	test_sendrecv();
	const char *tl = kiln_config_get(cfg, "plugin.mpi", "thread_level");
	if (!tl || strcmp(tl, "multiple"))
		test_send_now_serialized();
end:
	TRY(ops->barrier(comm));
	kiln_device_free(dev, a);
	kiln_device_free(dev, b);
	ops->close(comm);
	kiln_device_event_destroy(dev, done);
	kiln_device_stream_destroy(dev, stream);
	kiln_device_close(dev);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	printf("rank %d of %d: %s%s, %d failures\n", R, W, exact ? "shared memory (bit for bit)" : "MPI",
	       sh ? ", and the shared buffer" : "", fails);
	return fails ? 1 : 0;
}
