/* core/store.c - the rendezvous store's client: every rank's connection
 * to the store rank 0 hosts (kiln/dist.h; the wire format and the token's
 * challenge in core/store.h, the server in core/store_server.c).  Every
 * call is bounded by the timeout the store was opened with ([dist]
 * timeout) unless it takes its own.
 */
#include "internal.h"
#include "store.h"
#include <kiln/dist.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

struct kiln_store {
	int fd;
	int port;
	int timeout_ms;    /* of every call that takes none */
	char setting[40];  /* the setting timeout_ms comes from, for errors */
	char who[64];      /* "rank R of W" or "rank R's heartbeat connection" */
	char host[256];
	char token[STORE_TOKEN_MAX + 1];
	int broken;        /* a request failed midway: the stream is out of step */
	int oom;           /* an answer's allocation failed (kiln_store_oom) */
	int old_fd;        /* the broken rendezvous connection, until the claim again (-1) */
	unsigned char claim_key[STORE_CLAIM_KEY_LEN]; /* this process's, for a claim again (rendezvous_claim) */
	pthread_mutex_t lock;
	struct store_server *srv;
};

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- client -------------------------------------------------------------- */

/* the run clock (core/run_clock.c): a wait resumed after the whole job
 * was suspended counts only the time it ran (session 33) */
static int64_t now_ms(void) { return kiln_run_ns() / 1000000; }

/* Send (out) or receive exactly n bytes before the deadline (ms; < 0:
 * none). 0 ok, -1 closed/error, -2 timeout. */
static int xfer(int fd, void *buf, size_t n, int64_t deadline, int out)
{
	char *p = buf;
	while (n) {
		int wait = -1;
		if (deadline >= 0) {
			int64_t left = deadline - now_ms();
			if (left <= 0)
				return -2;
			wait = left > 1000000 ? 1000000 : (int)left;
		}
		struct pollfd pf = { .fd = fd, .events = out ? POLLOUT : POLLIN };
		int r = poll(&pf, 1, wait);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			continue; /* the deadline check above ends it */
		ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT)
				: recv(fd, p, n, MSG_DONTWAIT);
		if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* Send the request's bytes (xfer's result). */
static int send_request(struct kiln_store *s, int op, const char *key, size_t klen,
			const void *val, uint32_t vlen, int64_t deadline)
{
	unsigned char h[5], v4[4];
	h[0] = (unsigned char)op;
	put32(h + 1, (uint32_t)klen);
	put32(v4, vlen);
	int r = xfer(s->fd, h, 5, deadline, 1);
	if (!r)
		r = xfer(s->fd, (void *)key, klen, deadline, 1);
	if (!r)
		r = xfer(s->fd, v4, 4, deadline, 1);
	if (!r && vlen)
		r = xfer(s->fd, (void *)val, vlen, deadline, 1);
	return r;
}

/* What a lost connection may mean, in its error (wire_error); left out
 * of the warning of a rendezvous that connected again (rank 0 is alive
 * then, and the token was taken). */
#define STORE_LOST_HINT " (rank 0, which hosts the store, may have died; or it refused this client's token)"

/* The error of a request that failed on the wire (xfer's r). */
static kiln_status wire_error(const struct kiln_store *s, int r, const char *key, int timeout_ms)
{
	/* no greeting: the server took no connection (rank 0's log says
	 * why when accept failed: too many open files) */
	if (r == -2)
		return kiln_error(KILN_ETIMEOUT, "store " KILN_AT_FMT ": no answer for '%s' within %d ms (%s)%s",
				  KILN_AT_ARG(s->host, s->port), key, timeout_ms, s->setting,
				  strcmp(key, "(greeting)") ? "" : ": the store did not take the connection (rank 0's log says why if it could not)");
	return kiln_error(KILN_EIO, "store " KILN_AT_FMT ": connection lost" STORE_LOST_HINT,
			  KILN_AT_ARG(s->host, s->port));
}

/* how long a client waits for the store to answer its CANCEL, and for
 * the rest of an answer whose first byte came: short, the store is
 * alive and answers at once (it answered this connection before) */
#define RESYNC_MS 2000

/* Wait for the answer's first byte before the deadline (xfer's result):
 * a timeout before it leaves the stream in step for a CANCEL (resync),
 * one in the middle of an answer does not. */
static int reply_ready(int fd, int64_t deadline)
{
	for (;;) {
		int64_t left = deadline < 0 ? 1000000 : deadline - now_ms();
		if (left <= 0)
			return -2;
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		int r = poll(&pf, 1, left > 1000000 ? 1000000 : (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r > 0)
			return 0;
	}
}

/* read_reply's result where the answer came whole but this process had
 * no memory for its value (xfer's codes are 0, -1 and -2) */
#define XFER_NOMEM (-3)

/* Read and drop n bytes of an answer before the deadline (xfer's
 * result): the value this process had no memory for, so that the
 * stream stays in step. */
static int skip_bytes(int fd, uint32_t n, int64_t deadline)
{
	char sink[256];
	int r = 0;
	while (!r && n) {
		const uint32_t k = n < sizeof sink ? n : (uint32_t)sizeof sink;
		r = xfer(fd, sink, k, deadline, 0);
		n -= k;
	}
	return r;
}

/* One answer's header and value (malloc'd, NUL-terminated, into *rv)
 * before the deadline: xfer's result, or XFER_NOMEM where the value's
 * allocation failed (its bytes read and dropped: the connection in
 * step, rh and *len the answer's).  Before session 39 that failure read
 * as the connection lost: a rank whose own allocation failed blamed
 * rank 0 ("rank 0, which hosts the store, may have died") and, its
 * connection broken, could not tell its peers that it had failed. */
static int read_reply(int fd, int64_t deadline, unsigned char rh[5], char **rv, size_t *len)
{
	*rv = NULL;
	*len = 0;
	int r = xfer(fd, rh, 5, deadline, 0);
	uint32_t rlen = r ? 0 : get32(rh + 1);
	if (!r && rlen > STORE_MAX_VALUE)
		r = -1;
	if (!r && !(*rv = malloc((size_t)rlen + 1))) {
		*len = rlen;
		r = skip_bytes(fd, rlen, deadline);
		return r ? r : XFER_NOMEM;
	}
	if (!r && rlen)
		r = xfer(fd, *rv, rlen, deadline, 0);
	if (r) {
		free(*rv);
		*rv = NULL;
	} else {
		(*rv)[rlen] = 0;
		*len = rlen;
	}
	return r;
}

/* After a GET that timed out with none of its answer read: CANCEL it
 * and read up to the store's STORE_CANCELLED (past the request's own
 * answer, had it come meanwhile), so that the connection serves the
 * rank's next requests.  Before session 36 every timed-out request broke
 * the connection: a rank whose wait for a peer's key timed out (a
 * communicator's open, a config verdict) could post nothing after, not
 * its failure (kiln/failed), not its leaving (kiln/left, which rank 0
 * waits for) nor its goodbye, so rank 0 took it for lost.  0 in step,
 * else xfer's error (the connection is then broken). */
static int resync(struct kiln_store *s)
{
	const int ms = s->timeout_ms < RESYNC_MS ? s->timeout_ms : RESYNC_MS;
	const int64_t deadline = now_ms() + (ms > 0 ? ms : 1);
	int r = send_request(s, STORE_OP_CANCEL, "", 0, NULL, 0, deadline);
	for (int n = 0; !r && n < 2; n++) { /* the request's answer, then the cancel's */
		unsigned char rh[5];
		char *rv;
		size_t len;
		if ((r = read_reply(s->fd, deadline, rh, &rv, &len)) && r != XFER_NOMEM)
			break;
		r = 0; /* (an answer this process had no memory for: in step) */
		free(rv);
		if (rh[0] == STORE_CANCELLED)
			return 0;
	}
	return r ? r : -1;
}

/* or'd into request's op: a best-effort read (kiln_store_peek), whose
 * answer this process had no memory for is KILN_ENOMEM all the same but
 * not its failure (no kiln_store_oom) */
#define REQ_PEEK 0x100

/* Set or clear s->oom (kiln_store_oom). */
static void oom_put(struct kiln_store *s, int oom)
{
	pthread_mutex_lock(&s->lock);
	s->oom = oom;
	pthread_mutex_unlock(&s->lock);
}

/* One request/response.  *val malloc'd (NUL-terminated) when wanted.
 * *status: STORE_OK, STORE_ABSENT; a refusal is an error.  A GET that
 * timed out before any answer (its key not set in time) leaves the
 * connection in step (resync), and so does an answer this process had no
 * memory for (KILN_ENOMEM, kiln_store_oom unless op has REQ_PEEK); any
 * other failure on the wire breaks it. */
static kiln_status request(struct kiln_store *s, int op, const char *key, const void *val,
			   uint32_t vlen, int timeout_ms, int *status, void **out, size_t *out_len)
{
	const int peek = op & REQ_PEEK;
	op &= ~REQ_PEEK;
	size_t klen = strlen(key);
	unsigned char rh[5];
	kiln_status st = KILN_OK;
	if (klen > STORE_MAX_KEY)
		return kiln_error(KILN_EINVAL, "store: key of %zu bytes (at most %d)", klen, STORE_MAX_KEY);
	if (out)
		*out = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->broken) {
		pthread_mutex_unlock(&s->lock);
		return kiln_error(KILN_EIO, "store " KILN_AT_FMT ": the connection failed earlier", KILN_AT_ARG(s->host, s->port));
	}
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	char *rv = NULL;
	size_t rlen = 0;
	int r = send_request(s, op, key, klen, val, vlen, deadline);
	const int early = r; /* the request itself did not go out */
	if (!r)
		r = reply_ready(s->fd, deadline);
	const int none = r; /* no byte of the answer came */
	if (!r) { /* the answer began: the rest is on its way */
		const int64_t rest = now_ms() + RESYNC_MS;
		r = read_reply(s->fd, deadline < 0 || deadline > rest ? deadline : rest, rh, &rv, &rlen);
	}
	if (r == XFER_NOMEM) { /* this process's failure, not the store's */
		s->oom |= !peek;
		st = kiln_error(KILN_ENOMEM, "store " KILN_AT_FMT ": out of memory for its answer to '%s' (%zu byte%s)",
				KILN_AT_ARG(s->host, s->port), key, rlen + 1, rlen ? "s" : "");
		goto out;
	}
	if (r) {
		/* only a GET parks: another request without an answer means a
		 * silent store, not worth a CANCEL's wait */
		if (early || none != -2 || op != STORE_OP_GET || resync(s))
			s->broken = 1;
		st = wire_error(s, r, key, timeout_ms);
		goto out;
	}
	*status = rh[0];
	if (*status == STORE_REFUSED) {
		st = kiln_error(KILN_EIO, "store " KILN_AT_FMT " refused to set '%s': %s", KILN_AT_ARG(s->host, s->port), key,
				rv);
		free(rv);
	} else if (out) {
		*out = rv;
		if (out_len)
			*out_len = rlen;
	} else {
		free(rv);
	}
out:
	pthread_mutex_unlock(&s->lock);
	return st;
}

/* ---- connecting ------------------------------------------------------------
 * connect() itself waits for the kernel's SYN retries (~130 s on Linux)
 * where the master's address drops packets (a host behind a dead router, a
 * firewall's DROP): a rank held that long whatever [dist] timeout said, and
 * a stop (SIGTERM) did not end it.  So each address is tried with a
 * non-blocking connect polled until a deadline, in turns: every address
 * getaddrinfo gives gets a slice of at most CONNECT_SLICE_MS a turn (the
 * slice doubles for two turns, to 4 s: a slow link still gets long tries), a dead
 * first address cannot starve a live second one, and the turns go round
 * until the caller's deadline. */
#define CONNECT_SLICE_MS 1000
#define CONNECT_STOP_MS 100 /* how often a wait looks for a stop request */

/* Wait up to slice ms for fd's non-blocking connect: 0 connected, else the
 * errno it failed with (ETIMEDOUT: no answer in the slice; EINTR: a stop
 * was requested and stoppable is set). */
static int connect_wait(int fd, int64_t slice, int stoppable)
{
	const int64_t end = now_ms() + slice;
	for (;;) {
		int64_t left = end - now_ms();
		if (left <= 0)
			return ETIMEDOUT;
		if (stoppable && kiln_stop_pending())
			return EINTR;
		struct pollfd pf = { .fd = fd, .events = POLLOUT };
		int r = poll(&pf, 1, left < CONNECT_STOP_MS ? (int)left : CONNECT_STOP_MS);
		if (r < 0 && errno != EINTR)
			return errno;
		if (r <= 0)
			continue;
		int err = 0;
		socklen_t len = sizeof err;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len))
			return errno;
		return err;
	}
}

/* One try at one address for at most slice ms: the connected fd, or -1
 * with *err set. */
static int connect_one(const struct addrinfo *p, int64_t slice, int stoppable, int *err)
{
	int fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol);
	if (fd < 0) {
		*err = errno;
		return -1;
	}
	*err = connect(fd, p->ai_addr, p->ai_addrlen) ? errno : 0;
	/* EINTR (a signal of the application's): the connection goes on
	 * in the background, as with EINPROGRESS */
	if (*err == EINPROGRESS || *err == EINTR)
		*err = connect_wait(fd, slice, stoppable);
	int flags = fcntl(fd, F_GETFL);
	if (*err || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
		*err = *err ? *err : errno;
		close(fd);
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* "host:port: error" for one address, appended to why (at most n). */
static void connect_note(char *why, size_t n, const struct addrinfo *p, int err)
{
	char h[NI_MAXHOST] = "?", sv[NI_MAXSERV] = "?";
	getnameinfo(p->ai_addr, p->ai_addrlen, h, sizeof h, sv, sizeof sv, NI_NUMERICHOST | NI_NUMERICSERV);
	size_t m = strlen(why);
	if (m + 1 < n)
		snprintf(why + m, n - m, "%s%s%s%s:%s: %s", m ? "; " : "", strchr(h, ':') ? "[" : "", h,
			 strchr(h, ':') ? "]" : "", sv, err == EINTR ? "stopped" : strerror(err));
}

/* connect_to's flags: CONNECT_STOPPABLE, a stop request ends the wait at
 * once (the caller checks kiln_stop_pending); without, the deadline does
 * (a failed rank's last questions to the store, asked while it stops).
 * CONNECT_AGAIN, a connection lost at the rendezvous made again
 * (rendezvous_reconnect): tries of at most CONNECT_SLICE_MS even to one
 * address (a link that comes back answers the next try's SYN, not the
 * kernel's next retry of one long try, seconds later), and a turn whose
 * every address refused (nothing listens: rank 0 is gone) ends it.  (One
 * refusal did, and a name resolving to several addresses, the store
 * bound to the second, failed "rank 0 is gone" where the first connect
 * had worked.) */
#define CONNECT_STOPPABLE 1
#define CONNECT_AGAIN 2
/* CONNECT_SLICED: CONNECT_AGAIN's short tries without its end at a
 * refusal (a connection made again after the token handshake broke:
 * rank 0 may not listen yet at the first, store_connect) */
#define CONNECT_SLICED 4

/* A connected socket to host:port before deadline (ms), or -1 with why
 * naming each address tried and its last error (flags: above). */
static int connect_to(const char *host, int port, int64_t deadline, int flags, char *why,
		      size_t n)
{
	const int stoppable = flags & CONNECT_STOPPABLE;
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	snprintf(why, n, "nothing answered");
	for (int turn = 0;; turn++) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
		int rc = getaddrinfo(host, ps, &hints, &ai), naddr = 0, refused = 0;
		if (rc)
			snprintf(why, n, "cannot resolve '%s': %s", host, gai_strerror(rc));
		else
			why[0] = 0;
		for (struct addrinfo *p = ai; p; p = p->ai_next)
			naddr++;
		/* 1, 2, then 4 s at most a turn: a dead address never holds a
		 * live one back longer (growing on, a rank 0 that started a
		 * minute late met 64 s turns on the dead one) */
		const int64_t most = flags & (CONNECT_AGAIN | CONNECT_SLICED) ? CONNECT_SLICE_MS
				     : naddr > 1 ? (int64_t)CONNECT_SLICE_MS << (turn < 2 ? turn : 2) : INT64_MAX;
		for (struct addrinfo *p = ai; p && !(stoppable && kiln_stop_pending()); p = p->ai_next) {
			int64_t left = deadline - now_ms();
			int err, fd = connect_one(p, left < 1 ? 1 : left < most ? left : most, stoppable, &err);
			if (fd >= 0) {
				freeaddrinfo(ai);
				return fd;
			}
			connect_note(why, n, p, err);
			refused += err == ECONNREFUSED;
		}
		if (ai)
			freeaddrinfo(ai);
		/* every address refused: nothing listens (one refusing of a name
		 * with several is not the store's: it binds one of them) */
		if ((flags & CONNECT_AGAIN) && naddr && refused == naddr)
			return -1;
		if (now_ms() >= deadline || (stoppable && kiln_stop_pending())) {
			if (!why[0])
				snprintf(why, n, "stopped before any answer");
			return -1;
		}
		usleep(50000); /* rank 0 may not be listening yet */
	}
}

/* The greeting's nonce answered with the token's MAC (core/store.h).
 * *brk (when set) = 2 where no greeting came, 1 where the handshake
 * broke after it (the connection closed or
 * went silent: a link that failed, the store closing the oldest of its
 * connections without the token), which store_connect tries again, not
 * a refusal: a store of session 34 on says STORE_REFUSED before it
 * closes on a wrong token.  (Every close after AUTH was "refused this
 * process's token", and the rank gave up: a 11 s link outage at that
 * moment failed a rank with the right token, session 34.) */
static kiln_status authenticate(struct kiln_store *s, int64_t deadline, int timeout_ms, int *brk)
{
	unsigned char g[STORE_MAGIC_LEN + STORE_NONCE_LEN], mac[STORE_MAC_LEN];
	int r = xfer(s->fd, g, sizeof g, deadline, 0), status = -1;
	int dummy;
	brk = brk ? brk : &dummy;
	*brk = r != 0 ? 2 : 0; /* (2: no greeting at all) */
	if (r)
		return wire_error(s, r, "(greeting)", timeout_ms);
	if (memcmp(g, STORE_MAGIC, STORE_MAGIC_LEN))
		return kiln_error(KILN_EIO, "store " KILN_AT_FMT ": what answers there is not a kiln store (of this version)",
				  KILN_AT_ARG(s->host, s->port));
	if (store_mac(s->token, g + STORE_MAGIC_LEN, mac))
		return kiln_error(KILN_EIO, "store: HMAC-SHA256 failed (OpenSSL)");
	const int64_t left = deadline - now_ms();
	kiln_status st = request(s, STORE_OP_AUTH, "", mac, STORE_MAC_LEN,
				 left < 1 ? 1 : left < timeout_ms ? (int)left : timeout_ms, &status, NULL, NULL);
	if (st && status == STORE_REFUSED)
		return kiln_error(KILN_EIO, "store " KILN_AT_FMT " refused this process's token: every rank needs the same KILN_STORE_TOKEN (or KILN_STORE_TOKEN_FILE)",
				  KILN_AT_ARG(s->host, s->port));
	*brk = st != KILN_OK; /* (request's status stays -1 on the wire's failure) */
	if (st == KILN_ENOMEM) /* (its own words: not the link's failure) */
		return st;
	if (st)
		return kiln_error(st, "store " KILN_AT_FMT ": the connection %s during the token handshake: the link to it failed, or a store of a kiln before session 34 refused this process's token (it closes without saying so: every rank needs the same KILN_STORE_TOKEN or KILN_STORE_TOKEN_FILE)",
				  KILN_AT_ARG(s->host, s->port),
				  st == KILN_ETIMEOUT ? "went silent" : "closed");
	return KILN_OK;
}

/* How long one try of store_connect waits for the handshake: the store
 * drops a connection that has not presented the token in
 * kiln_store_auth_ms of rank 0's [dist] timeout, so an answer not there
 * well after it is not coming (the store's close lost on a link that
 * failed); a fresh connection may get one.  This process's own timeout
 * estimates rank 0's (a rank-local key: where they differ, a try ends
 * early, and connects again, or late, within the deadline still). */
#define HANDSHAKE_TRY_MS(s) STORE_HANDSHAKE_TRY(kiln_store_auth_ms((s)->timeout_ms))

/* Connect s to its store and authenticate (HELLO for r: the rank, -1 for
 * a side connection, kiln_store_open_for's side) before deadline,
 * again as long as the handshake broke (authenticate's *brk;
 * tries CONNECT_SLICE_MS short after the first, so a link that came back
 * answers the next SYN).  A refused token, another protocol or a stop
 * ends it at once; at the deadline, the last break's error (what went
 * wrong, not the deadline cutting the next try short).  again:
 * rendezvous_reconnect's (CONNECT_AGAIN: every address refusing ends it,
 * with the addresses' errors alone). */
static kiln_status store_connect_tries(struct kiln_store *s, int64_t r, int64_t deadline,
				       int again)
{
	char why[512], last[1024] = "";
	kiln_status last_st = KILN_OK;
	for (int tries = 0;; tries++) {
		s->fd = connect_to(s->host, s->port, deadline,
				   CONNECT_STOPPABLE | (tries ? CONNECT_SLICED : 0) | (again ? CONNECT_AGAIN : 0),
				   why, sizeof why);
		if (s->fd < 0 && last_st && !kiln_stop_pending() && now_ms() >= deadline)
			return kiln_error(last_st, "%s", last);
		if (s->fd < 0 && again)
			return kiln_error(KILN_EIO, "%s", why);
		if (s->fd < 0 && kiln_stop_pending())
			return kiln_error(KILN_EIO, "%s: a stop was requested (a signal) while connecting to the rendezvous store at " KILN_AT_FMT " (%s)",
					  s->who, KILN_AT_ARG(s->host, s->port), why);
		if (s->fd < 0)
			return kiln_error(KILN_ETIMEOUT, "%s: cannot reach the rendezvous store at " KILN_AT_FMT " within %.1f s (%s): is rank 0 running, and are the master address and port right?",
					  s->who, KILN_AT_ARG(s->host, s->port), s->timeout_ms / 1000.0, why);
		const int64_t try_end = now_ms() + HANDSHAKE_TRY_MS(s);
		int brk = 0, status;
		s->broken = 0;
		kiln_status st = authenticate(s, try_end < deadline ? try_end : deadline, s->timeout_ms, &brk);
		if (!st && (st = request(s, STORE_OP_HELLO, "", &r, 8, s->timeout_ms, &status, NULL, NULL)))
			brk = 1;
		if (!st)
			return KILN_OK;
		/* no goodbye on it: its own failure (after a silent peer's,
		 * another timeout) would replace this one's message */
		s->broken = 1;
		if (last_st && st == KILN_ETIMEOUT && now_ms() >= deadline)
			return kiln_error(last_st, "%s", last);
		if (!brk || now_ms() >= deadline || kiln_stop_pending())
			return st;
		/* (this try's bound, not [dist] timeout; no greeting at all keeps
		 * its own message: what listens there sent nothing, a store or
		 * not, session 35's CI) */
		if (st == KILN_ETIMEOUT && brk != 2)
			st = kiln_error(KILN_ETIMEOUT, "store " KILN_AT_FMT ": no answer to the token handshake within %.1f s of connecting (the store drops a connection without the token after a quarter of rank 0's [dist] timeout, 1 to 10 s, %.1f s by this rank's: the link to it may have failed)",
					KILN_AT_ARG(s->host, s->port), HANDSHAKE_TRY_MS(s) / 1000.0,
					kiln_store_auth_ms(s->timeout_ms) / 1000.0);
		last_st = st;
		snprintf(last, sizeof last, "%s", kiln_last_error());
		if (!tries)
			kiln_log(KILN_LOG_WARN, "dist", "%s: %s: connecting again until %s", s->who,
				 kiln_last_error(), s->setting);
		close(s->fd);
		s->fd = -1;
		usleep(100000);
	}
}

/* store_connect_tries, after which kiln_store_oom is as it was before,
 * or set where the tries ended out of memory: an answer this process had
 * no memory for on a try that a later one made good (AUTH's, HELLO's) was
 * recovered from.  Before session 40 it stayed set, and a peer's failure
 * much later was told as this rank's own out of memory (and posted as
 * kiln/failed_rank). */
static kiln_status store_connect(struct kiln_store *s, int64_t r, int64_t deadline, int again)
{
	const int oom = kiln_store_oom(s);
	const kiln_status st = store_connect_tries(s, r, deadline, again);
	oom_put(s, oom || st == KILN_ENOMEM);
	return st;
}

kiln_status kiln_store_open(const char *host, int port, int host_it, int rank, int world,
			    int timeout_ms, struct kiln_store **out)
{
	if (!host || !out)
		return kiln_null_arg("kiln_store_open", !host ? "host" : "out");
	return kiln_store_open_for(host, port, host_it, rank, world, timeout_ms, "[dist] timeout",
				   NULL, out);
}

kiln_status kiln_store_open_for(const char *host, int port, int host_it, int rank, int world,
				int timeout_ms, const char *setting, const char *side,
				struct kiln_store **out)
{
	struct kiln_store *s = calloc(1, sizeof *s);
	kiln_status st;
	*out = NULL;
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->fd = s->old_fd = -1;
	s->timeout_ms = timeout_ms;
	snprintf(s->setting, sizeof s->setting, "%s", setting);
	if (side)
		snprintf(s->who, sizeof s->who, "rank %d's %s connection", rank, side);
	else
		snprintf(s->who, sizeof s->who, "rank %d of %d", rank, world);
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->host, sizeof s->host, "%s", host);
	s->port = port;
	if ((st = store_token(s->token, sizeof s->token)) ||
	    (host_it && (st = store_server_start(host, port, s->token, timeout_ms, &s->port,
						 &s->srv)))) {
		kiln_store_close(s);
		return st;
	}
	if ((st = store_connect(s, side ? -1 : rank, now_ms() + timeout_ms, 0))) {
		kiln_store_close(s);
		return st;
	}
	*out = s;
	return KILN_OK;
}

void kiln_store_close(struct kiln_store *s)
{
	if (!s)
		return;
	if (s->fd >= 0 && !s->broken) {
		int status;
		request(s, STORE_OP_BYE, "", NULL, 0, s->timeout_ms < 1000 ? s->timeout_ms : 1000,
			&status, NULL, NULL);
	}
	if (s->fd >= 0)
		close(s->fd);
	if (s->old_fd >= 0)
		close(s->old_fd);
	store_server_stop(s->srv);
	OPENSSL_cleanse(s->token, sizeof s->token);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

int kiln_store_port(const struct kiln_store *s) { return s ? s->port : 0; }

int kiln_store_oom(struct kiln_store *s)
{
	if (!s)
		return 0;
	pthread_mutex_lock(&s->lock);
	const int oom = s->oom;
	pthread_mutex_unlock(&s->lock);
	return oom;
}

void kiln_store_oom_clear(struct kiln_store *s)
{
	if (s)
		oom_put(s, 0);
}

kiln_status kiln_store_set(struct kiln_store *s, const char *key, const void *val, size_t len)
{
	if (!s || !key || (len && !val))
		return kiln_null_arg("kiln_store_set", !s ? "s" : !key ? "key" : "val");
	int status;
	if (len > STORE_MAX_VALUE)
		return kiln_error(KILN_EINVAL, "store: value of %zu bytes for '%s' (at most %u)", len, key,
				  STORE_MAX_VALUE);
	return request(s, STORE_OP_SET, key, val, (uint32_t)len, s->timeout_ms, &status, NULL, NULL);
}

kiln_status kiln_store_set_within(struct kiln_store *s, const char *key, const void *val,
				  size_t len, int timeout_ms)
{
	int status;
	if (len > STORE_MAX_VALUE)
		return kiln_error(KILN_EINVAL, "store: value of %zu bytes for '%s' (at most %u)", len, key,
				  STORE_MAX_VALUE);
	if (timeout_ms > s->timeout_ms)
		timeout_ms = s->timeout_ms;
	return request(s, STORE_OP_SET, key, val, (uint32_t)len, timeout_ms, &status, NULL, NULL);
}

kiln_status kiln_store_get(struct kiln_store *s, const char *key, int timeout_ms, void **val,
			   size_t *len)
{
	if (!s || !key || !val)
		return kiln_null_arg("kiln_store_get", !s ? "s" : !key ? "key" : "val");
	int status;
	kiln_status st = request(s, STORE_OP_GET, key, NULL, 0, timeout_ms, &status, val, len);
	if (st == KILN_ETIMEOUT)
		return kiln_error(KILN_ETIMEOUT, "store: '%s' was not set within %.1f s", key,
				  timeout_ms / 1000.0);
	return st;
}

kiln_status kiln_store_check(struct kiln_store *s, const char *key, void **val, size_t *len)
{
	if (!s || !key || !val)
		return kiln_null_arg("kiln_store_check", !s ? "s" : !key ? "key" : "val");
	return kiln_store_check_within(s, key, val, len, s->timeout_ms);
}

/* kiln_store_check_within's and kiln_store_peek's request (op:
 * STORE_OP_CHECK, with REQ_PEEK or not). */
static kiln_status check(struct kiln_store *s, int op, const char *key, void **val, size_t *len,
			 int timeout_ms)
{
	int status;
	if (timeout_ms > s->timeout_ms)
		timeout_ms = s->timeout_ms;
	kiln_status st = request(s, op, key, NULL, 0, timeout_ms, &status, val, len);
	if (!st && status) {
		free(*val);
		*val = NULL;
		if (len)
			*len = 0;
	}
	return st;
}

kiln_status kiln_store_check_within(struct kiln_store *s, const char *key, void **val, size_t *len,
				    int timeout_ms)
{
	return check(s, STORE_OP_CHECK, key, val, len, timeout_ms);
}

kiln_status kiln_store_peek(struct kiln_store *s, const char *key, void **val, size_t *len)
{
	if (!s || !key || !val)
		return kiln_null_arg("kiln_store_peek", !s ? "s" : !key ? "key" : "val");
	return check(s, STORE_OP_CHECK | REQ_PEEK, key, val, len, s->timeout_ms);
}

kiln_status kiln_store_add(struct kiln_store *s, const char *key, int64_t delta, int64_t *out)
{
	if (!s || !key)
		return kiln_null_arg("kiln_store_add", !s ? "s" : "key");
	return kiln_store_add_within(s, key, delta, out, s->timeout_ms);
}

kiln_status kiln_store_add_within(struct kiln_store *s, const char *key, int64_t delta,
				  int64_t *out, int timeout_ms)
{
	int status;
	void *v;
	size_t n;
	if (timeout_ms > s->timeout_ms)
		timeout_ms = s->timeout_ms;
	kiln_status st = request(s, STORE_OP_ADD, key, &delta, 8, timeout_ms, &status, &v, &n);
	if (st)
		return st;
	if (n == 8 && out)
		memcpy(out, v, 8);
	free(v);
	return KILN_OK;
}

kiln_status kiln_store_wait(struct kiln_store *s, const char *const *keys, int n, int timeout_ms)
{
	if (!s || (n > 0 && !keys))
		return kiln_null_arg("kiln_store_wait", !s ? "s" : "keys");
	int64_t deadline = now_ms() + timeout_ms;
	for (int i = 0; i < n; i++) {
		void *v;
		int64_t left = deadline - now_ms();
		kiln_status st = kiln_store_get(s, keys[i], left > 0 ? (int)left : 0, &v, NULL);
		if (st)
			return st;
		free(v);
	}
	return KILN_OK;
}

/* Wait for every rank to join: polled in short slices (a get that timed
 * out would break the connection), so that a stop requested meanwhile
 * (SIGTERM, SIGINT: `kiln launch` stopping the ranks after one failed at
 * start-up) ends the wait at once instead of after [dist] timeout.
 * KILN_OK, KILN_ETIMEOUT, or the stop's KILN_EIO. */
/* Wait for `want` (its value into *val when val is set), or for a rank to
 * find the rendezvous broken (a rank twice, another world size:
 * rendezvous_refuse), in slices that see a stop request. */
static kiln_status rendezvous_wait(struct kiln_store *s, const char *want, int timeout_ms,
				   void **val)
{
	const char *const key[] = { want, "kiln/rendezvous_failed" };
	const int64_t end = now_ms() + timeout_ms;
	for (;;) {
		int which;
		void *v = NULL;
		int64_t left = end - now_ms();
		int slice = left < 200 ? (int)(left > 0 ? left : 0) : 200;
		kiln_status st = kiln_store_poll(s, key, 2, slice, &which, &v);
		if (!st && which == 1) {
			st = kiln_error(KILN_ECONFIG, "the rendezvous failed: %s", (const char *)v);
			free(v);
			return st;
		}
		if (!st && val)
			*val = v;
		else
			free(v);
		if (st != KILN_ETIMEOUT)
			return st;
		if (kiln_stop_pending())
			return kiln_error(KILN_EIO, "a stop was requested (a signal) while waiting at the rendezvous");
		if (now_ms() >= end)
			return KILN_ETIMEOUT;
	}
}

/* The rendezvous cannot complete as asked: said to the ranks waiting in
 * it (rendezvous_wait polls the key) and returned as this rank's error. */
static kiln_status rendezvous_refuse(struct kiln_store *s, const char *msg)
{
	(void)kiln_store_set(s, "kiln/rendezvous_failed", msg, strlen(msg) + 1);
	return kiln_error(KILN_ECONFIG, "%s", msg);
}

/* Rank 0 posts its world size; every other rank's must be the same (two
 * nodes launched with another --nnodes or -n joined one count and hung
 * until the timeout, naming neither). */
static kiln_status rendezvous_world(struct kiln_store *s, int rank, int world, int timeout_ms)
{
	char w[32], msg[256];
	int n = snprintf(w, sizeof w, "%d", world);
	if (!rank)
		return kiln_store_set(s, "kiln/world", w, (size_t)n + 1);
	void *v = NULL;
	kiln_status st = rendezvous_wait(s, "kiln/world", timeout_ms, &v);
	if (st)
		return st; /* (KILN_ETIMEOUT: the caller names who never came) */
	const int w0 = atoi((const char *)v);
	free(v);
	if (w0 == world)
		return KILN_OK;
	snprintf(msg, sizeof msg, "rank %d's world size is %d but rank 0's is %d: start every node with the same --nnodes and -n (every rank with the same WORLD_SIZE)",
		 rank, world, w0);
	return rendezvous_refuse(s, msg);
}

/* The address this rank's store connection leaves from, as kiln/addr/RANK:
 * an address of this host the others reach (they reach rank 0's by the
 * same network), which kiln-gloo listens on when neither [plugin.gloo]
 * iface nor hostname is set.  Its 127.0.0.1 default held every multi-node
 * run without them in minutes of retries naming no setting (session 31).
 * Then kiln/addr_set/RANK = 1, a counter a plugin reads without waiting
 * (host->store_check; before host table version 8, which has none, an
 * add of 0): kiln-gloo's get
 * of an address never posted waited out [dist] timeout and broke its
 * store connection (session 32). */
static kiln_status post_addr(struct kiln_store *s, int rank)
{
	struct sockaddr_storage a;
	socklen_t al = sizeof a;
	char h[NI_MAXHOST], key[48];
	kiln_status st;
	if (getsockname(s->fd, (struct sockaddr *)&a, &al) ||
	    getnameinfo((struct sockaddr *)&a, al, h, sizeof h, NULL, 0, NI_NUMERICHOST))
		return KILN_OK; /* none posted: kiln-gloo keeps 127.0.0.1 */
	snprintf(key, sizeof key, "kiln/addr/%d", rank);
	if ((st = kiln_store_set(s, key, h, strlen(h) + 1)))
		return st;
	snprintf(key, sizeof key, "kiln/addr_set/%d", rank);
	return kiln_store_add(s, key, 1, NULL);
}

/* This host's name as kiln/host/RANK, which the heartbeat's and a lost
 * rank's messages name (posted once the claim is won: an intruder's name
 * replaced the real rank's before session 32). */
static kiln_status post_host(struct kiln_store *s, int rank)
{
	char key[48], name[64] = "";
	if (gethostname(name, sizeof name - 1))
		snprintf(name, sizeof name, "?");
	snprintf(key, sizeof key, "kiln/host/%d", rank);
	return kiln_store_set(s, key, name, strlen(name));
}

/* The refusal of rank's claim for this process (who): the holder's who
 * (v, up to its NUL) and, from a store of session 33 on, after the NUL the
 * store's own kiln_store_dead_after_ms (u32): rank 0's [dist] timeout
 * decides when a silent holder's claim is given back, not this process's
 * (before, this process's own timeout gave the figure, wrong where the
 * two differ); an older store's refusal has none, and the estimate from
 * this process's timeout says so. */
static kiln_status claim_refused(int rank, const char *who, const char *v, size_t vn,
				 int timeout_ms)
{
	const size_t hl = v ? strnlen(v, vn) : 0;
	const int store_says = v && vn == hl + 1 + 4;
	const double secs = (store_says ? (int)get32((const unsigned char *)v + hl + 1)
					: kiln_store_dead_after_ms(timeout_ms)) / 1000.0;
	return kiln_error(KILN_ECONFIG, "rank %d joined twice: this process (%s) and one before it (%s): two launches with the same --node-rank, or a rank restarted while the previous run's store still answered, or its host went down before every rank joined (the store gives such a rank's claim back within about %.0f s of its going%s: start it again after that)",
			  rank, who, v ? v : "?", secs,
			  store_says ? "" : ", by this process's [dist] timeout: rank 0's decides");
}

/* Claim rank `rank` for this process (who: "host H, pid P"): KILN_OK when
 * won, KILN_ECONFIG naming both processes when another holds it.  The
 * server decides and ties the rank to this connection only when won, so
 * a refused process is never taken for the rank: not when it dies (it is
 * not "lost"), not for its keys (it writes none of the rank's).  The claim
 * carries this process's claim key (core/store.h), with which a claim
 * again on a new connection (`again`: rendezvous_reconnect) takes over
 * the one the store still holds for the broken connection; a store
 * before session 33 denies it, with this process's own claim as the
 * holder's, until it has noticed that connection's loss: asked again
 * every 200 ms until end. */
static kiln_status rendezvous_claim(struct kiln_store *s, int rank, const char *who, int again,
				    int64_t end)
{
	unsigned char val[8 + 320 + 1 + STORE_CLAIM_KEY_LEN];
	const size_t wl = strlen(who) < 319 ? strlen(who) : 319;
	const uint32_t vl = (uint32_t)(8 + wl + 1 + STORE_CLAIM_KEY_LEN);
	int64_t r = rank;
	memcpy(val, &r, 8);
	memcpy(val + 8, who, wl);
	val[8 + wl] = 0;
	memcpy(val + 9 + wl, s->claim_key, STORE_CLAIM_KEY_LEN);
	for (;;) {
		int status = 0;
		void *v = NULL;
		size_t vn = 0;
		kiln_status st = request(s, STORE_OP_CLAIM, "", val, vl, s->timeout_ms, &status, &v, &vn);
		if (st || status == STORE_OK) {
			free(v);
			return st;
		}
		/* an older store keeps the whole claim, key included, as the
		 * holder's who and denies it back: this process's own (a store
		 * of session 33 on sends its figure there, and takes a live
		 * holder's own key over) */
		if (again && v && vn == vl - 8 && !memcmp(v, val + 8, vl - 8) && now_ms() < end &&
		    !kiln_stop_pending()) {
			free(v);
			usleep(200000);
			continue;
		}
		/* the holder is alive, or joined a rendezvous that completed:
		 * this process alone is refused; the ranks waiting go on (a
		 * restarted rank whose predecessor left before every rank
		 * joined finds the claim released and is not here) */
		st = claim_refused(rank, who, v, vn, s->timeout_ms);
		free(v);
		return st;
	}
}

/* Count this rank in (JOIN): the world-th sets kiln/all_joined. */
static kiln_status rendezvous_join(struct kiln_store *s, int world)
{
	int64_t w = world;
	int status = 0;
	void *v = NULL;
	kiln_status st = request(s, STORE_OP_JOIN, "", &w, 8, s->timeout_ms, &status, &v, NULL);
	free(v);
	return st;
}

/* The store connection's TCP_USER_TIMEOUT (0: the kernel's default):
 * on at the rendezvous, kiln_store_dead_after_ms of this process's
 * timeout, so that a request unanswered over a link gone silent fails
 * then (and rendezvous_reconnect tries again) instead of at [dist]
 * timeout or at the link's return; off after it, where a silent store is
 * the heartbeat's to name. */
static void store_user_timeout(const struct kiln_store *s, int ms)
{
	const unsigned int u = ms > 0 ? (unsigned int)ms : 0;
	if (s->fd >= 0)
		setsockopt(s->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &u, sizeof u);
}

/* ms left until end (0 when past). */
static int left_ms(int64_t end)
{
	const int64_t l = end - now_ms();
	return l > 0 ? (l < INT32_MAX ? (int)l : INT32_MAX) : 0;
}

/* s's connection broke at the rendezvous: no answer over a link gone
 * silent (store_user_timeout), or closed by the store, which dropped it
 * after the link was silent kiln_store_dead_after_ms (and gave the claim
 * back).  The rank is alive: connect again and authenticate before end,
 * then the caller claims again (session 33: before, such a rank failed,
 * "connection lost", or waited on its dead connection, and every other
 * rank timed out: "rank r never arrived").  KILN_OK (a warning says so),
 * else the error, the lost connection's first: nothing listens any more
 * (rank 0 is gone), or nothing answered before end. */
static kiln_status rendezvous_reconnect(struct kiln_store *s, int rank, int world, int64_t end)
{
	char lost[512];
	snprintf(lost, sizeof lost, "%s", kiln_last_error());
	/* The old connection stays open until the claim on the new one
	 * (rendezvous_steps closes it): closed first, its FIN, where it can
	 * still send, reached the store before the claim again, which then,
	 * every rank joined, recorded this rank lost and refused its claim
	 * again as a second process's ("joined twice"). */
	if (s->old_fd >= 0)
		close(s->old_fd);
	s->old_fd = s->fd;
	s->fd = -1;
	/* (a handshake that breaks again is tried again: store_connect) */
	if (store_connect(s, rank, end, 1)) {
		s->broken = 1; /* no goodbye on it */
		return kiln_error(KILN_EIO, "%s; connecting again: %s", lost, kiln_last_error());
	}
	store_user_timeout(s, kiln_store_dead_after_ms(s->timeout_ms));
	char *hint = strstr(lost, STORE_LOST_HINT);
	if (hint)
		*hint = 0;
	kiln_log(KILN_LOG_WARN, "dist", "rank %d of %d: the connection to the rendezvous store at " KILN_AT_FMT " broke (%s): connected again, joining again",
		 rank, world, KILN_AT_ARG(s->host, s->port), lost);
	return KILN_OK;
}

/* The rendezvous' steps on s's connection, until end: claim (again:
 * rendezvous_claim), post this rank's keys, compare world sizes, join,
 * wait for every rank.  Each step may be done again on a new connection
 * (the keys are the same, a join counted once: the store's). */
static kiln_status rendezvous_steps(struct kiln_store *s, int rank, int world, const char *who,
				    int again, int64_t end)
{
	char key[64];
	kiln_status st;
	st = rendezvous_claim(s, rank, who, again, end);
	if (s->old_fd >= 0) { /* claimed again (or not): the broken one goes */
		close(s->old_fd);
		s->old_fd = -1;
	}
	if (st)
		return st;
	snprintf(key, sizeof key, "kiln/joined/%d", rank);
	if ((st = kiln_store_set(s, key, who, strlen(who) + 1)) || (st = post_host(s, rank)) ||
	    (st = post_addr(s, rank)) || (st = rendezvous_world(s, rank, world, left_ms(end))) ||
	    (st = rendezvous_join(s, world)))
		return st;
	return rendezvous_wait(s, "kiln/all_joined", left_ms(end), NULL);
}

/* A timed-out rendezvous' questions to the store (on q): the ranks that
 * never joined (into missing, *count of them), and the store's records of
 * refused tokens, connections closed before their token and refused
 * claims (into refused, each "; the store ..."). */
static void rendezvous_missing(struct kiln_store *q, int world, char *missing, size_t mn,
			       int *count, char *refused, size_t rn)
{
	static const char *const recs[][2] = {
		/* a node started with another token is refused at the door */
		{ STORE_REFUSED_KEY, " (every rank needs the same KILN_STORE_TOKEN)" },
		/* the link failed at the handshake, or idle connections filled it */
		{ STORE_DROPPED_KEY, "" },
		/* and a node launched twice with one --node-rank at the claim */
		{ STORE_CLAIMS_REFUSED_KEY, "" },
	};
	char key[64];
	size_t m = 0;
	void *v;
	for (int r = 0; r < world && m + 16 < mn; r++) {
		snprintf(key, sizeof key, "kiln/joined/%d", r);
		if (!kiln_store_check(q, key, &v, NULL) && !v) {
			m += (size_t)snprintf(missing + m, mn - m, "%s%d", m ? ", " : "", r);
			++*count;
		}
		free(v);
	}
	for (size_t i = 0; i < sizeof recs / sizeof *recs; i++) {
		const size_t rl = strlen(refused);
		if (!kiln_store_check(q, recs[i][0], &v, NULL) && v && rl + 1 < rn)
			snprintf(refused + rl, rn - rl, "; the store %s%s", (const char *)v, recs[i][1]);
		free(v);
	}
}

kiln_status kiln_store_rendezvous(struct kiln_store *s, int rank, int world, int timeout_ms)
{
	if (!s)
		return kiln_null_arg("kiln_store_rendezvous", "s");
	char who[320];
	kiln_status st;
	const int64_t end = now_ms() + timeout_ms;
	/* one process a rank: the first to claim it joins; a second (two
	 * launches with the same --node-rank, or a restarted rank that
	 * reached the previous run's store) is refused at once */
	char host[256] = "?";
	if (gethostname(host, sizeof host - 1))
		snprintf(host, sizeof host, "?");
	snprintf(who, sizeof who, "host %s, pid %ld", host, (long)getpid());
	if (store_random(s->claim_key, sizeof s->claim_key))
		return kiln_error(KILN_EIO, "rank %d of %d: no random bytes for the claim (OpenSSL)", rank,
				  world);
	store_user_timeout(s, kiln_store_dead_after_ms(s->timeout_ms));
	st = rendezvous_steps(s, rank, world, who, 0, end);
	/* its connection broke, the rank alive: again, on a new one */
	while (st && s->broken && now_ms() < end && !kiln_stop_pending() &&
	       !(st = rendezvous_reconnect(s, rank, world, end)))
		st = rendezvous_steps(s, rank, world, who, 1, end);
	store_user_timeout(s, 0);
	if (st && st != KILN_ETIMEOUT)
		return kiln_error_wrap(st, "rank %d of %d", rank, world);
	if (!st)
		return KILN_OK;
	/* which ranks never came?  Asked on this rank's own connection where
	 * it still works (rendezvous_wait's slices leave it in step): a fresh
	 * one may be refused, the store full of idle connections, and the
	 * answer was "some ranks", naming none (session 34) */
	struct kiln_store *q = s->broken ? NULL : s;
	char missing[512] = "", refused[1280] = "";
	int count = 0;
	if (!q && kiln_store_open_for(s->host, s->port, 0, rank, world, 2000, "the probe's 2 s limit", "probe", &q))
		q = NULL;
	if (q)
		rendezvous_missing(q, world, missing, sizeof missing, &count, refused, sizeof refused);
	if (q && q != s)
		kiln_store_close(q);
	return kiln_error(KILN_ETIMEOUT, "rendezvous timed out after %.1f s: rank %d of %d waited at " KILN_AT_FMT " but %s%s never arrived ([dist] timeout; check that every rank was started with the same world size and master address)%s",
			  timeout_ms / 1000.0, rank, world, KILN_AT_ARG(s->host, s->port),
			  count ? (count > 1 ? "ranks " : "rank ") : "some ranks", missing, refused);
}

kiln_status kiln_store_poll(struct kiln_store *s, const char *const *keys, int n, int timeout_ms,
			    int *which, void **val)
{
	if (!s || (n > 0 && !keys) || !which || !val)
		return kiln_null_arg("kiln_store_poll", !s ? "s" : !which ? "which" : !val ? "val" : "keys");
	const int64_t end = now_ms() + timeout_ms;
	useconds_t nap = 500;
	*which = -1;
	*val = NULL;
	for (;;) {
		for (int i = 0; i < n; i++) {
			kiln_status st = kiln_store_check(s, keys[i], val, NULL);
			if (st)
				return st;
			if (*val) {
				*which = i;
				return KILN_OK;
			}
		}
		if (now_ms() >= end)
			return kiln_error(KILN_ETIMEOUT, "store: none of '%s'%s set within %.1f s",
					  n ? keys[0] : "", n > 1 ? " ..." : "", timeout_ms / 1000.0);
		usleep(nap);
		if (nap < 50000)
			nap *= 2;
	}
}

/* how long each of kiln_store_lost_rank's reads waits for the store's
 * answer: short, as the caller has failed already (a store that answers
 * nothing for this long is silent: rank 0 stopped or its link cut) */
#define LOST_ASK_MS 2000

/* This process ran out of memory asking s's store (kiln_store_oom): its
 * own failure, not the store's loss; the store's loss cannot be told
 * then, and none is reported (KILN_STORE_NONE_LOST). */
static int lost_oom(struct kiln_store *s)
{
	oom_put(s, 1);
	return KILN_STORE_NONE_LOST;
}

/* A second connection to s's store, for a question s cannot ask any more
 * (an earlier request broke its stream: a get that timed out waiting for a
 * peer's key, say): 0 and *q, or KILN_STORE_GONE (nothing accepts the
 * connection, or it closes) or KILN_STORE_SILENT (no greeting within ask
 * ms), or lost_oom's.  The caller closes *q. */
static int reconnect(struct kiln_store *s, int ask, struct kiln_store **q)
{
	char why[256];
	struct kiln_store *n = calloc(1, sizeof *n);
	*q = NULL;
	if (!n)
		return lost_oom(s);
	pthread_mutex_init(&n->lock, NULL);
	n->timeout_ms = ask;
	n->port = s->port;
	snprintf(n->host, sizeof n->host, "%s", s->host);
	memcpy(n->token, s->token, sizeof n->token);
	const int64_t deadline = now_ms() + ask;
	n->fd = connect_to(n->host, n->port, deadline, 0, why, sizeof why);
	kiln_status st = n->fd < 0 ? KILN_EIO : authenticate(n, deadline, ask, NULL);
	if (st) {
		n->broken = 1; /* no goodbye */
		kiln_store_close(n);
		return st == KILN_ENOMEM ? lost_oom(s) : st == KILN_ETIMEOUT ? KILN_STORE_SILENT : KILN_STORE_GONE;
	}
	*q = n;
	return 0;
}

int kiln_store_lost_rank(struct kiln_store *s, int wait_ms)
{
	const int64_t end = now_ms() + wait_ms;
	const int ask = s->timeout_ms < LOST_ASK_MS ? s->timeout_ms : LOST_ASK_MS;
	useconds_t nap = 500;
	struct kiln_store *q = NULL;
	pthread_mutex_lock(&s->lock);
	const int broken = s->broken;
	pthread_mutex_unlock(&s->lock);
	if (broken) {
		const int why = reconnect(s, ask, &q);
		if (why)
			return why;
		int r = kiln_store_lost_rank(q, wait_ms);
		if (kiln_store_oom(q))
			r = lost_oom(s);
		kiln_store_close(q);
		return r;
	}
	for (;;) {
		int status = 0;
		void *v = NULL;
		kiln_status st = request(s, STORE_OP_CHECK, "kiln/lost", NULL, 0, ask, &status, &v,
					 NULL);
		if (st == KILN_ETIMEOUT)
			return KILN_STORE_SILENT; /* rank 0 alive but not answering */
		if (st == KILN_ENOMEM)
			return KILN_STORE_NONE_LOST; /* (request set s->oom) */
		if (st)
			return KILN_STORE_GONE; /* rank 0, its host or the link to it */
		if (!status && v) {
			const int r = atoi(v);
			free(v);
			return r;
		}
		free(v);
		if (now_ms() >= end)
			return KILN_STORE_NONE_LOST;
		usleep(nap);
		if (nap < 50000)
			nap *= 2;
	}
}
