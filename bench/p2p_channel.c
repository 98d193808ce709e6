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
 * Usage: bench/p2p_channel [ROUNDS]   (default 2000 round trips a size) */
#include <kiln/plugin.h>

#include "../plugins/common/shmp2p.h"
#include "../plugins/common/watchdog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

const struct kiln_host *kiln_host_table(void);

enum { RING = 1 << 20 };

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

int main(int argc, char **argv)
{
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
