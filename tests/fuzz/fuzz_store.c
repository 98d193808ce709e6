/* tests/fuzz/fuzz_store.c - the rendezvous store's request parser
 * (core/store.c, as it is on this branch: inside the server thread, so it
 * is reached through a socket).  Each input starts a fresh store (rank 0
 * of 1 on an ephemeral loopback port), is sent over one raw connection
 * while the replies are drained, then the connection is closed and the
 * store must still answer its own client's set and check.
 */
#include "fuzz.h"

#include <kiln/dist.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

/* A store that answers nothing for this long is hung. */
#define FUZZ_STALL_MS 10000

/* A connection to the store; a signal (libFuzzer's timer) may interrupt
 * connect, which then completes in the background. */
static int connect_local(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0) {
		perror("fuzz_store: socket");
		abort();
	}
	while (connect(fd, (struct sockaddr *)&a, sizeof a)) {
		if (errno == EISCONN)
			break;
		if (errno != EINTR && errno != EALREADY) {
			perror("fuzz_store: connect");
			abort();
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		poll(&p, 1, 100);
	}
	return fd;
}

/* Send data[0..size) while reading (and dropping) replies, then read to
 * the end: the server closes the connection after our end of input. */
static void exchange(int fd, const uint8_t *data, size_t size)
{
	size_t sent = 0;
	int open_w = 1;
	char buf[65536];
	for (;;) {
		if (open_w && sent == size) {
			shutdown(fd, SHUT_WR);
			open_w = 0;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN | (open_w ? POLLOUT : 0) };
		int r = poll(&p, 1, FUZZ_STALL_MS);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			fprintf(stderr, "fuzz_store: the store stalled for %d ms\n", FUZZ_STALL_MS);
			abort();
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
			if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
				return; /* closed (or reset) by the server */
		}
		if (open_w && (p.revents & POLLOUT)) {
			ssize_t k = send(fd, data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (k > 0)
				sent += (size_t)k;
			else if (k < 0 && errno != EAGAIN && errno != EINTR)
				open_w = 0; /* the server dropped us mid-input */
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_init();
	struct kiln_store *s = NULL;
	if (kiln_store_open("127.0.0.1", 0, 1, 0, 1, 5000, &s)) {
		fprintf(stderr, "fuzz_store: %s\n", kiln_last_error());
		abort();
	}
	int fd = connect_local(kiln_store_port(s));
	exchange(fd, data, size);
	close(fd);
	void *val = NULL;
	size_t len = 0;
	if (kiln_store_set(s, "fuzz/alive", "yes", 3) || kiln_store_check(s, "fuzz/alive", &val, &len) ||
	    !val || len != 3 || memcmp(val, "yes", 3)) {
		fprintf(stderr, "fuzz_store: the store no longer answers: %s\n", kiln_last_error());
		abort();
	}
	free(val);
	kiln_store_close(s);
	return 0;
}
