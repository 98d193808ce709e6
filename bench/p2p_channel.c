/* bench/p2p_channel.c - the latency of kiln-gloo's shared-memory channels
 * (plugins/common/shmp2p.h) between two processes: a ping-pong of messages
 * of each size (16 B to 1 MiB), the one-way time the median of N round
 * trips / 2, with a 20 us poll before the futex, a 2 us poll (the
 * default, [plugin.gloo] p2p_spin_us), and no poll at all (what the plugin
 * does when the ranks outnumber their CPUs).  The
 * pipeline's hand-off of the GPT example is one 128 KiB message (a
 * micro-batch's activation or its gradient; the tied lm_head gradient is
 * another 128 KiB behind the gradient).  The processes are forked, the
 * channels in an anonymous shared mapping.
 *
 * Usage: bench/p2p_channel [ROUNDS]   (default 2000 round trips a size)
 *
 * The rate of large messages (issue 21, session 17: a pipeline's crossing
 * tensors, 64 KiB to 4 MiB), with the default 2 us poll:
 *   bench/p2p_channel rate [ROUNDS [RING]]   (default 200 rounds, the ring
 *   kiln-gloo gives 2 ranks: SHMP2P_RING_MAX)
 * prints per size the ping-pong's one-way median (us) and its GB/s (a
 * hand-off the receiver waits for), a stream's GB/s (ROUNDS messages sent
 * back to back, the receiver's clock from its first to its last), and
 * memcpy's GB/s between two buffers of the size in this process (the
 * median of ROUNDS copies: the bound a copy through the ring works
 * against, which copies every byte twice, once on each core).
 *
 * A pipeline's hand-off (session 20): the receiver has waited a pass for
 * the message, the sender's core has just computed it:
 *   bench/p2p_channel handoff [ROUNDS [BYTES [PASS_US]]]   (default 200
 *   hand-offs of 1 MiB, passes of 3000 us)
 * the two processes take turns: one "computes" for PASS_US (writing its
 * buffer over and over, as a pass writes its output) and sends it, the
 * other waits in its recv; prints the median and quartiles of the time
 * from the send's start to the recv's return, on the shared monotonic
 * clock; COLD=MiB makes each pass stream over that much memory first,
 * as a pass's weights evict the ring and the receive buffer from the
 * caches; RESTART=0 sends every message where the last ended, not at a
 * lap's start (shmp2p.h, "Laps"; rate too); BIND=1 puts each process on a core of its own (0 and 1), as
 * `kiln launch` binds ranks.
 *
 * Cross-memory attach (one copy, process to process, by the kernel):
 *   bench/p2p_channel cma [ROUNDS]
 * a forked child's process_vm_writev into its parent and process_vm_readv
 * out of it, 64 KiB - 4 MiB, against memcpy in one process (medians)
 * (docs/PERFORMANCE.md "Session 20: pipeline hand-offs"). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <kiln/plugin.h>

#include "../plugins/common/shmp2p.h"
#include "../plugins/common/watchdog.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

const struct kiln_host *kiln_host_table(void);

enum { RING = 1 << 20 };
#ifndef SHMP2P_RING_MAX /* a build of shmp2p.c before session 17: 1 MiB for 2 ranks */
#define SHMP2P_RING_MAX (1 << 20)
#endif

static int cmp(const void *a, const void *b)
{
	const long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

/* n round trips of `bytes` between this process (side 0: sends first) and
 * its peer; side 0 returns the median one-way ns, the peer 0 */
static long long pingpong(struct shmp2p *out, struct shmp2p *in, int side, char *buf,
			  size_t bytes, int n, long long *t)
{
	for (int i = 0; i < n; i++) {
		const long long t0 = watchdog_now_ns();
		if (side == 0 && (shmp2p_send(out, buf, bytes) || shmp2p_recv(in, buf, bytes)))
			return -1;
		if (side == 1 && (shmp2p_recv(in, buf, bytes) || shmp2p_send(out, buf, bytes)))
			return -1;
		t[i] = watchdog_now_ns() - t0;
	}
	qsort(t, (size_t)n, sizeof *t, cmp);
	return side ? 0 : t[n / 2] / 2;
}

/* the stream: side 0 sends n messages of `bytes` back to back, side 1
 * receives them; side 1 returns the ns from the end of its first recv to
 * the end of its last (n - 1 messages' worth), side 0 0 */
static long long stream(struct shmp2p *out, struct shmp2p *in, int side, char *buf,
			size_t bytes, int n)
{
	long long t0 = 0;
	for (int i = 0; i < n; i++) {
		if (side == 0 && shmp2p_send(out, buf, bytes))
			return -1;
		if (side == 1 && shmp2p_recv(in, buf, bytes))
			return -1;
		if (i == 0)
			t0 = watchdog_now_ns();
	}
	/* a last round trip of one byte, so that side 0 does not leave early */
	if (side == 0 && shmp2p_recv(in, buf, 1))
		return -1;
	if (side == 1 && shmp2p_send(out, buf, 1))
		return -1;
	return side ? watchdog_now_ns() - t0 : 0;
}

/* the median ns of n memcpy's of `bytes` between two buffers */
static long long memcpy_ns(size_t bytes, int n, long long *t)
{
	char *a = malloc(bytes), *b = malloc(bytes);
	if (!a || !b)
		return -1;
	memset(a, 1, bytes), memset(b, 2, bytes);
	for (int i = 0; i < n; i++) {
		const long long t0 = watchdog_now_ns();
		memcpy(i & 1 ? a : b, i & 1 ? b : a, bytes);
		t[i] = watchdog_now_ns() - t0;
	}
	free(a), free(b);
	qsort(t, (size_t)n, sizeof *t, cmp);
	return t[n / 2];
}

/* COLD=MiB: a pass's working set besides its output (a GEMM's weights),
 * which evicts the ring and the receive buffer from the caches as the
 * pipeline's passes do */
static char *cold;
static size_t cold_bytes;

/* a pass: buf written over for us microseconds (the last write the
 * message's bytes), after streaming over the cold set */
static void pass(char *buf, size_t bytes, long long us, int i)
{
	const long long end = watchdog_now_ns() + us * 1000;
	if (cold)
		memset(cold, i, cold_bytes);
	do
		memset(buf, i & 0x7f, bytes);
	while (watchdog_now_ns() < end);
}

/* `handoff`: the hand-off's latency (the header); side 0 returns the
 * median ns and fills q[0], q[1] with the quartiles, side 1 0 */
static long long handoffs(struct shmp2p *out, struct shmp2p *in, int side, char *buf, char *rbuf,
			  size_t bytes, int n, long long us, long long *t, long long q[2])
{
	for (int i = 0; i < n; i++) {
		long long t0 = 0, t1;
		if ((i & 1) == side) { /* this side computes and sends, then hears the stamp */
			pass(buf, bytes, us, i);
			t0 = watchdog_now_ns();
			if (shmp2p_send(out, buf, bytes) || shmp2p_recv(in, &t1, sizeof t1))
				return -1;
			t[i] = t1 - t0;
		} else {
			if (shmp2p_recv(in, rbuf, bytes))
				return -1;
			t1 = watchdog_now_ns();
			if (rbuf[bytes - 1] != (char)(i & 0x7f) || shmp2p_send(out, &t1, sizeof t1))
				return -1;
		}
	}
	if (side) { /* side 1's half of the times to side 0 */
		for (int i = 0; i < n; i += 2)
			if (shmp2p_send(out, &t[i + 1 < n ? i + 1 : i], sizeof *t))
				return -1;
		return 0;
	}
	for (int i = 1; i < n; i += 2)
		if (shmp2p_recv(in, &t[i], sizeof *t))
			return -1;
	qsort(t, (size_t)n, sizeof *t, cmp);
	q[0] = t[n / 4], q[1] = t[3 * n / 4];
	return t[n / 2];
}

static int handoff(const struct kiln_host *h, int n, size_t bytes, long long us)
{
	const size_t per = shmp2p_bytes(SHMP2P_RING_MAX);
	char *mem = mmap(NULL, 2 * per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	char *buf = malloc(bytes), *rbuf = malloc(bytes);
	long long *t = malloc((size_t)(n + 1) * sizeof *t), q[2] = { 0, 0 };
	if (mem == MAP_FAILED || !buf || !rbuf || !t) {
		fprintf(stderr, "p2p_channel: out of memory\n");
		return 1;
	}
	memset(buf, 7, bytes), memset(rbuf, 7, bytes);
	if (getenv("COLD") && (cold_bytes = (size_t)atoll(getenv("COLD")) << 20) &&
	    !(cold = malloc(cold_bytes)))
		return 1;
	const pid_t pid = fork();
	const int side = pid == 0;
	if (getenv("BIND")) { /* each side on a core of its own, as kiln launch binds ranks */
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(side, &set);
		sched_setaffinity(0, sizeof set, &set);
	}
	struct shmp2p out, in;
	shmp2p_init(&out, h, "bench", side, 2, 1 - side, mem + (size_t)side * per, SHMP2P_RING_MAX,
		    10000, SHMP2P_SPIN_NS, NULL, NULL);
	shmp2p_init(&in, h, "bench", side, 2, 1 - side, mem + (size_t)(1 - side) * per,
		    SHMP2P_RING_MAX, 10000, SHMP2P_SPIN_NS, NULL, NULL);
#ifndef SHMP2P_NO_LAPS
	if (getenv("RESTART"))
		out.restart = in.restart = atoi(getenv("RESTART"));
#endif
	long long med = handoffs(&out, &in, side, buf, rbuf, bytes, 10, us, t, q); /* warm-up */
	if (med >= 0)
		med = handoffs(&out, &in, side, buf, rbuf, bytes, n, us, t, q);
	if (side)
		_exit(med < 0);
	int status = 0;
	waitpid(pid, &status, 0);
	if (med < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
		fprintf(stderr, "p2p_channel: the hand-offs failed: %s\n", h->last_error());
		return 1;
	}
	printf("hand-off of %zu bytes after a pass of %lld us: median %.1f us (quartiles %.1f - %.1f), %d hand-offs\n",
	       bytes, us, med / 1000.0, q[0] / 1000.0, q[1] / 1000.0, n);
	return 0;
}

/* `cma`: cross-memory attach against memcpy (the header) */
static int cma(int n)
{
	const size_t sizes[] = { 65536, 262144, 1 << 20, 4 << 20 };
	printf("   bytes  process_vm_writev us  process_vm_readv us  memcpy us (medians of %d)\n", n);
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		const size_t bytes = sizes[k];
		char *a = malloc(bytes), *b = malloc(bytes);
		long long *t = malloc((size_t)n * sizeof *t);
		if (!a || !b || !t) {
			fprintf(stderr, "p2p_channel: out of memory\n");
			return 1;
		}
		memset(a, 1, bytes), memset(b, 2, bytes);
		fflush(stdout);
		const pid_t parent = getpid(), pid = fork();
		if (pid == 0) { /* the child writes into the parent's a, reads its b */
			for (int w = 0; w < 2; w++) {
				for (int i = 0; i < n; i++) {
					struct iovec l = { w ? a : b, bytes }, r = { w ? b : a, bytes };
					const long long t0 = watchdog_now_ns();
					const ssize_t got = w ? process_vm_readv(parent, &l, 1, &r, 1, 0)
							      : process_vm_writev(parent, &l, 1, &r, 1, 0);
					t[i] = watchdog_now_ns() - t0;
					if (got != (ssize_t)bytes) {
						perror("p2p_channel: cross-memory attach");
						_exit(1);
					}
				}
				qsort(t, (size_t)n, sizeof *t, cmp);
				if (!w)
					printf("%8zu  %20.1f", bytes, t[n / 2] / 1000.0);
				else
					printf("  %19.1f", t[n / 2] / 1000.0);
			}
			fflush(stdout);
			_exit(0);
		}
		int status = 0;
		waitpid(pid, &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status))
			return 1;
		printf("  %9.1f\n", memcpy_ns(bytes, n, t) / 1000.0);
		free(a), free(b), free(t);
	}
	return 0;
}

/* `rate`: the large messages' table (the header) */
static int rate(const struct kiln_host *h, int n, size_t ring)
{
	const size_t sizes[] = { 65536, 262144, 524288, 1 << 20, 2 << 20, 4 << 20 };
	const size_t per = shmp2p_bytes(ring);
	printf("ring %zu bytes, poll %lld us, %d rounds a size\n", ring, SHMP2P_SPIN_NS / 1000, n);
	printf("   bytes  one-way us  GB/s  stream GB/s  memcpy GB/s\n");
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		const size_t bytes = sizes[k];
		char *mem = mmap(NULL, 2 * per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
				 0);
		char *buf = malloc(bytes);
		long long *t = malloc((size_t)n * sizeof *t);
		if (mem == MAP_FAILED || !buf || !t) {
			fprintf(stderr, "p2p_channel: out of memory\n");
			return 1;
		}
		memset(buf, 7, bytes);
		const pid_t pid = fork();
		const int side = pid == 0;
		struct shmp2p out, in;
		shmp2p_init(&out, h, "bench", side, 2, 1 - side, mem + (size_t)side * per, ring, 10000,
			    SHMP2P_SPIN_NS, NULL, NULL);
		shmp2p_init(&in, h, "bench", side, 2, 1 - side, mem + (size_t)(1 - side) * per, ring,
			    10000, SHMP2P_SPIN_NS, NULL, NULL);
#ifndef SHMP2P_NO_PIECE
		if (getenv("PIECE")) /* experiments: another piece (shmp2p.h SHMP2P_PIECE) */
			out.piece = in.piece = (size_t)atoll(getenv("PIECE"));
#endif
#ifndef SHMP2P_NO_LAPS
		if (getenv("RESTART")) /* experiments: 0, every message where the last ended (shmp2p.h "Laps") */
			out.restart = in.restart = atoi(getenv("RESTART"));
#endif
		/* warm-up: every page of the ring touched (a new mapping faults
		 * them in on the first lap), then the timed trips */
		const int warm = (int)(2 * ring / bytes) + 5;
		long long *tw = malloc((size_t)warm * sizeof *tw);
		long long one = tw ? pingpong(&out, &in, side, buf, bytes, warm, tw) : -1;
		free(tw);
		if (one >= 0)
			one = pingpong(&out, &in, side, buf, bytes, n, t);
		const long long st = one < 0 ? -1 : stream(&out, &in, side, buf, bytes, n);
		if (side) {
			/* the stream's time to side 0, as the round trip's last message */
			long long s = st;
			_exit(st < 0 || shmp2p_send(&out, &s, sizeof s));
		}
		long long s = -1;
		int status = 0;
		if (one >= 0 && st >= 0 && shmp2p_recv(&in, &s, sizeof s))
			s = -1;
		waitpid(pid, &status, 0);
		if (one < 0 || st < 0 || s <= 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "p2p_channel: the rate run failed: %s\n", h->last_error());
			return 1;
		}
		const long long mc = memcpy_ns(bytes, n, t);
		printf("%8zu  %10.1f  %4.2f  %11.2f  %11.2f\n", bytes, one / 1000.0,
		       (double)bytes / (double)one, (double)bytes * (n - 1) / (double)s,
		       mc > 0 ? (double)bytes / (double)mc : 0.0);
		fflush(stdout);
		free(buf), free(t);
		munmap(mem, 2 * per);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "rate")) {
		const int n = argc > 2 ? atoi(argv[2]) : 200;
		const size_t ring = argc > 3 ? (size_t)atoll(argv[3]) : (size_t)SHMP2P_RING_MAX;
		if (n < 2 || ring < 64 || (ring & (ring - 1))) {
			fprintf(stderr, "usage: %s rate [ROUNDS >= 2 [RING: a power of 2 >= 64]]\n",
				argv[0]);
			return 2;
		}
		return rate(kiln_host_table(), n, ring);
	}

	if (argc > 1 && !strcmp(argv[1], "cma"))
		return cma(argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : 200);
	if (argc > 1 && !strcmp(argv[1], "handoff")) {
		const int n = argc > 2 ? atoi(argv[2]) : 200;
		const long long bytes = argc > 3 ? atoll(argv[3]) : 1 << 20;
		const long long us = argc > 4 ? atoll(argv[4]) : 3000;
		if (n < 4 || bytes < 1 || us < 0) {
			fprintf(stderr, "usage: %s handoff [ROUNDS >= 4 [BYTES >= 1 [PASS_US >= 0]]]\n",
				argv[0]);
			return 2;
		}
		return handoff(kiln_host_table(), n, (size_t)bytes, us);
	}

	const int n = argc > 1 ? atoi(argv[1]) : 2000;
	const size_t sizes[] = { 16, 4096, 65536, 131072, 1 << 20 };
	const size_t per = shmp2p_bytes(RING);
	const struct kiln_host *h = kiln_host_table();
	if (n < 1) {
		fprintf(stderr, "usage: %s [ROUNDS >= 1]\n", argv[0]);
		return 2;
	}
	static const long long spins[] = { 20000, 2000, 0 };
	printf("one-way us, median of %d round trips / 2, by the poll before the futex:\n", n);
	printf("  bytes  poll %4lld us  poll %4lld us  no poll\n", spins[0] / 1000, spins[1] / 1000);
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		long long med[3] = { 0, 0, 0 };
		for (int w = 0; w < 3; w++) {
			/* two channels (0 -> 1, 1 -> 0), new and zero each run */
			char *mem = mmap(NULL, 2 * per, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
					 -1, 0);
			char *buf = malloc(sizes[k]);
			long long *t = malloc((size_t)n * sizeof *t);
			if (mem == MAP_FAILED || !buf || !t) {
				fprintf(stderr, "p2p_channel: out of memory\n");
				return 1;
			}
			memset(buf, 7, sizes[k]);
			const long long spin = spins[w];
			const pid_t pid = fork();
			const int side = pid == 0;
			struct shmp2p out, in;
			shmp2p_init(&out, h, "bench", side, 2, 1 - side, mem + (size_t)side * per, RING,
				    10000, spin, NULL, NULL);
			shmp2p_init(&in, h, "bench", side, 2, 1 - side, mem + (size_t)(1 - side) * per,
				    RING, 10000, spin, NULL, NULL);
			/* a few warm-up trips, then the timed ones */
			if (pingpong(&out, &in, side, buf, sizes[k], 20 < n ? 20 : n, t) < 0) {
				fprintf(stderr, "p2p_channel: %s\n", h->last_error());
				return 1;
			}
			med[w] = pingpong(&out, &in, side, buf, sizes[k], n, t);
			if (side)
				_exit(med[w] < 0);
			int status = 0;
			waitpid(pid, &status, 0);
			if (med[w] < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
				fprintf(stderr, "p2p_channel: the ping-pong failed: %s\n", h->last_error());
				return 1;
			}
			free(buf), free(t);
			munmap(mem, 2 * per);
		}
		printf("%7zu  %12.1f  %12.1f  %7.1f\n", sizes[k], med[0] / 1000.0, med[1] / 1000.0,
		       med[2] / 1000.0);
	}
	return 0;
}
