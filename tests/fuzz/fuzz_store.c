/* tests/fuzz/fuzz_store.c - the rendezvous store's request parser
 * (core/store.c, as it is on this branch: inside the server thread, so it
 * is reached through a socket).  Each input starts a fresh store (rank 0
 * of 1 on an ephemeral loopback port), is sent over one raw connection
 * while the replies are drained, then the connection is closed and the
 * store must still answer its own client's set and check.
 *
 * The input's first byte chooses (and is not sent): odd, the harness first
 * answers the greeting's challenge (AUTH with the MAC of its nonce under
 * $KILN_STORE_TOKEN, which fuzz_init sets), so the rest reaches SET, ADD,
 * CLAIM and JOIN (the server drops a connection whose first request is
 * anything else: without it every input ended at the AUTH check, sessions
 * 25-33); even, the rest is sent as it is, a stranger's first bytes to the
 * greeting and AUTH parser, the part a network reaches without the token
 * (always authenticating left it unfuzzed, session 33).  store_mac comes
 * from core/store_msg.c, compiled in (libkiln exports only kiln_*).
 */
#include "fuzz.h"
#include "store.h" /* the wire format, store_mac */

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

/* Read or write all n bytes of buf on fd (a signal may interrupt). */
static void all(int fd, int writing, void *buf, size_t n, const char *what)
{
	for (size_t done = 0; done < n;) {
		ssize_t k = writing ? send(fd, (char *)buf + done, n - done, MSG_NOSIGNAL) :
				      recv(fd, (char *)buf + done, n - done, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			fprintf(stderr, "fuzz_store: %s: %s\n", what, k ? strerror(errno) : "closed");
			abort();
		}
		done += (size_t)k;
	}
}

/* Read the greeting, answer its nonce with AUTH(store_mac(token, nonce))
 * and read the store's OK: the connection is then past authentication. */
static void authenticate(int fd)
{
	unsigned char g[STORE_MAGIC_LEN + STORE_NONCE_LEN], ok[5];
	unsigned char req[9 + STORE_MAC_LEN] = { STORE_OP_AUTH, 0, 0, 0, 0, STORE_MAC_LEN, 0, 0, 0 };
	all(fd, 0, g, sizeof g, "the greeting");
	if (memcmp(g, STORE_MAGIC, STORE_MAGIC_LEN) ||
	    store_mac(getenv("KILN_STORE_TOKEN"), g + STORE_MAGIC_LEN, req + 9)) {
		fprintf(stderr, "fuzz_store: not a store greeting, or no MAC\n");
		abort();
	}
	all(fd, 1, req, sizeof req, "AUTH");
	all(fd, 0, ok, sizeof ok, "AUTH's answer");
	if (ok[0] != STORE_OK) {
		fprintf(stderr, "fuzz_store: the store refused the token\n");
		abort();
	}
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
	const int auth = size > 0 && (data[0] & 1);
	if (auth)
		authenticate(fd);
	if (size > 0)
		data++, size--;
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
