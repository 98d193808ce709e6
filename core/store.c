/* core/store.c - the rendezvous store: a TCP key-value service hosted by
 * rank 0 (kiln/dist.h).
 *
 * Wire format, both ways little-endian:
 *   request:  u8 op, u32 klen, key[klen], u32 vlen, val[vlen]
 *   response: u8 status (0 found/ok, 1 absent), u32 vlen, val[vlen]
 * Each client has at most one request outstanding.  A GET of an absent key
 * parks the client until some SET makes the key exist; timeouts are the
 * client's business (it stops waiting and drops the connection).  A client
 * whose connection closes after HELLO but without BYE has died: the server
 * records it under "kiln/lost" (the first such rank, decimal) and
 * "kiln/lost/<rank>", so the survivors can name it.
 */
#include "internal.h"
#include <kiln/dist.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OP_HELLO = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_ADD = 5, OP_BYE = 6 };
#define MAX_KEY 4096
#define MAX_VAL (64u << 20)

/* ---- server -------------------------------------------------------------- */

struct kv {
	char *key;
	char *val;
	uint32_t len;
};

struct client {
	int fd;
	int rank;          /* from HELLO, -1 before */
	int bye;
	unsigned char *buf; /* the request being received */
	size_t have, cap;
	char *waiting;     /* GET parked on this key, or NULL */
};

struct server {
	int lfd, wake[2];
	pthread_t thread;
	struct kv *kv;
	size_t n_kv, cap_kv;
	struct client *cl;
	size_t n_cl, cap_cl;
};

struct kiln_store {
	int fd;
	int port;
	char host[256];
	int broken;        /* a request failed midway: the stream is out of step */
	int call_ms;       /* how long a set, check or add waits: the open's timeout */
	pthread_mutex_t lock;
	struct server *srv;
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

static struct kv *kv_find(struct server *s, const char *key)
{
	for (size_t i = 0; i < s->n_kv; i++)
		if (!strcmp(s->kv[i].key, key))
			return &s->kv[i];
	return NULL;
}

static int reply(int fd, int status, const void *val, uint32_t len)
{
	unsigned char h[5];
	h[0] = (unsigned char)status;
	put32(h + 1, len);
	return kiln_send_all(fd, h, 5) || (len && kiln_send_all(fd, val, len)) ? -1 : 0;
}

static int kv_set(struct server *s, const char *key, const void *val, uint32_t len)
{
	struct kv *e = kv_find(s, key);
	char *v = malloc((size_t)len + 1);
	if (!v)
		return -1;
	memcpy(v, val, len);
	v[len] = 0;
	if (!e) {
		if (s->n_kv == s->cap_kv) {
			size_t nc = s->cap_kv ? 2 * s->cap_kv : 64;
			struct kv *n = realloc(s->kv, nc * sizeof *n);
			if (!n) {
				free(v);
				return -1;
			}
			s->kv = n;
			s->cap_kv = nc;
		}
		e = &s->kv[s->n_kv++];
		if (!(e->key = kiln_strdup(key))) {
			s->n_kv--;
			free(v);
			return -1;
		}
	} else {
		free(e->val);
	}
	e->val = v;
	e->len = len;
	/* wake the clients parked on it */
	for (size_t i = 0; i < s->n_cl; i++) {
		struct client *c = &s->cl[i];
		if (c->waiting && !strcmp(c->waiting, key)) {
			free(c->waiting);
			c->waiting = NULL;
			reply(c->fd, 0, e->val, e->len);
		}
	}
	return 0;
}

static void client_drop(struct server *s, size_t i)
{
	struct client *c = &s->cl[i];
	int rank = c->bye ? -1 : c->rank;
	close(c->fd);
	free(c->buf);
	free(c->waiting);
	s->cl[i] = s->cl[--s->n_cl];
	if (rank >= 0) {
		char key[64], v[24];
		int n = snprintf(v, sizeof v, "%d", rank);
		snprintf(key, sizeof key, "kiln/lost/%d", rank);
		kv_set(s, key, v, (uint32_t)n);
		if (!kv_find(s, "kiln/lost"))
			kv_set(s, "kiln/lost", v, (uint32_t)n);
	}
}

/* Handle the complete request in c->buf; -1 drops the client. */
static int handle(struct server *s, struct client *c)
{
	const unsigned char *b = c->buf;
	uint32_t klen = get32(b + 1), vlen = get32(b + 5 + klen);
	char key[MAX_KEY + 1];
	const unsigned char *val = b + 9 + klen;
	memcpy(key, b + 5, klen);
	key[klen] = 0;
	switch (b[0]) {
	case OP_HELLO: {
		int64_t r = 0;
		if (vlen == 8)
			memcpy(&r, val, 8);
		c->rank = (int)r;
		return reply(c->fd, 0, NULL, 0);
	}
	case OP_BYE:
		c->bye = 1;
		return reply(c->fd, 0, NULL, 0);
	case OP_SET:
		if (kv_set(s, key, val, vlen))
			return -1;
		return reply(c->fd, 0, NULL, 0);
	case OP_GET:
	case OP_CHECK: {
		struct kv *e = kv_find(s, key);
		if (e)
			return reply(c->fd, 0, e->val, e->len);
		if (b[0] == OP_CHECK)
			return reply(c->fd, 1, NULL, 0);
		return (c->waiting = kiln_strdup(key)) ? 0 : -1;
	}
	case OP_ADD: {
		struct kv *e = kv_find(s, key);
		int64_t d = 0, v = e ? strtoll(e->val, NULL, 10) : 0;
		char txt[24];
		if (vlen == 8)
			memcpy(&d, val, 8);
		v += d;
		int n = snprintf(txt, sizeof txt, "%lld", (long long)v);
		if (kv_set(s, key, txt, (uint32_t)n))
			return -1;
		return reply(c->fd, 0, &v, 8);
	}
	}
	return -1;
}

/* Read what is there; handle a request once complete.  -1: drop. */
static int client_read(struct server *s, struct client *c)
{
	unsigned char tmp[65536];
	ssize_t k = recv(c->fd, tmp, sizeof tmp, 0);
	if (k < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (k <= 0)
		return -1;
	if (c->have + (size_t)k > c->cap) {
		size_t nc = c->cap ? c->cap : 4096;
		while (nc < c->have + (size_t)k)
			nc *= 2;
		unsigned char *n = realloc(c->buf, nc);
		if (!n)
			return -1;
		c->buf = n;
		c->cap = nc;
	}
	memcpy(c->buf + c->have, tmp, (size_t)k);
	c->have += (size_t)k;
	for (;;) {
		if (c->have < 9)
			return 0;
		uint32_t klen = get32(c->buf + 1);
		if (klen > MAX_KEY)
			return -1;
		if (c->have < 9 + (size_t)klen)
			return 0;
		uint32_t vlen = get32(c->buf + 5 + klen);
		if (vlen > MAX_VAL)
			return -1;
		size_t need = 9 + (size_t)klen + vlen;
		if (c->have < need)
			return 0;
		if (c->waiting || handle(s, c))
			return -1; /* a request while parked breaks the protocol */
		memmove(c->buf, c->buf + need, c->have - need);
		c->have -= need;
	}
}

static void *server_main(void *arg)
{
	struct server *s = arg;
	struct pollfd *pf = NULL;
	size_t cap = 0;
	for (;;) {
		size_t n = 2 + s->n_cl;
		if (n > cap) {
			struct pollfd *np = realloc(pf, n * 2 * sizeof *np);
			if (!np)
				break;
			pf = np;
			cap = n * 2;
		}
		pf[0] = (struct pollfd){ .fd = s->wake[0], .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
		for (size_t i = 0; i < s->n_cl; i++)
			pf[2 + i] = (struct pollfd){ .fd = s->cl[i].fd, .events = POLLIN };
		if (poll(pf, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pf[0].revents)
			break;
		/* clients first (indices shift as they drop: walk backwards) */
		for (size_t i = s->n_cl; i-- > 0;)
			if (pf[2 + i].revents && client_read(s, &s->cl[i]))
				client_drop(s, i);
		if (pf[1].revents & POLLIN) {
			int fd = accept(s->lfd, NULL, NULL);
			if (fd >= 0) {
				int one = 1;
				setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
				if (s->n_cl == s->cap_cl) {
					size_t nc = s->cap_cl ? 2 * s->cap_cl : 16;
					struct client *ncl = realloc(s->cl, nc * sizeof *ncl);
					if (!ncl) {
						close(fd);
						continue;
					}
					s->cl = ncl;
					s->cap_cl = nc;
				}
				s->cl[s->n_cl++] = (struct client){ .fd = fd, .rank = -1 };
			}
		}
	}
	free(pf);
	return NULL;
}

static void server_free(struct server *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n_cl; i++) {
		close(s->cl[i].fd);
		free(s->cl[i].buf);
		free(s->cl[i].waiting);
	}
	for (size_t i = 0; i < s->n_kv; i++) {
		free(s->kv[i].key);
		free(s->kv[i].val);
	}
	free(s->cl);
	free(s->kv);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->wake[0] >= 0) {
		close(s->wake[0]);
		close(s->wake[1]);
	}
	free(s);
}

static kiln_status server_start(int port, struct server **out, int *bound)
{
	struct server *s = calloc(1, sizeof *s);
	struct sockaddr_in6 a;
	socklen_t al = sizeof a;
	int one = 1, zero = 0;
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->wake[0] = s->wake[1] = -1;
	s->lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0) {
		server_free(s);
		return kiln_error(KILN_EIO, "store: socket: %s", strerror(errno));
	}
	setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(s->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
	memset(&a, 0, sizeof a);
	a.sin6_family = AF_INET6;
	a.sin6_addr = in6addr_any;
	a.sin6_port = htons((uint16_t)port);
	if (bind(s->lfd, (struct sockaddr *)&a, sizeof a) || listen(s->lfd, 256) ||
	    getsockname(s->lfd, (struct sockaddr *)&a, &al)) {
		kiln_status st = kiln_error(KILN_EIO, "store: cannot listen on port %d: %s (another run on this port? set KILN_MASTER_PORT / MASTER_PORT)",
					    port, strerror(errno));
		server_free(s);
		return st;
	}
	*bound = ntohs(a.sin6_port);
	if (pipe2(s->wake, O_CLOEXEC)) {
		server_free(s);
		return kiln_error(KILN_EIO, "store: pipe: %s", strerror(errno));
	}
	int rc = pthread_create(&s->thread, NULL, server_main, s);
	if (rc) {
		server_free(s);
		return kiln_error(KILN_EIO, "store: pthread_create: %s", strerror(rc));
	}
	*out = s;
	return KILN_OK;
}

static void server_stop(struct server *s)
{
	if (!s)
		return;
	if (write(s->wake[1], "x", 1) != 1) {
		/* the thread then only ends with the process */
	}
	pthread_join(s->thread, NULL);
	server_free(s);
}

/* ---- client -------------------------------------------------------------- */

static int64_t now_ms(void) { return kiln_now_ns() / 1000000; }

/* Receive exactly n bytes before the deadline (ms; < 0: none). 0 ok,
 * -1 closed/error, -2 timeout. */
static int recv_all(int fd, void *buf, size_t n, int64_t deadline)
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
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		int r = poll(&pf, 1, wait);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			continue; /* the deadline check above ends it */
		ssize_t k = recv(fd, p, n, 0);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0)
			return -1;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

/* One request/response.  *val malloc'd (NUL-terminated) when wanted.
 * *status: 0 found, 1 absent. */
static kiln_status request(struct kiln_store *s, int op, const char *key, const void *val,
			   uint32_t vlen, int timeout_ms, int *status, void **out, size_t *out_len)
{
	size_t klen = strlen(key);
	unsigned char h[9], rh[5];
	kiln_status st = KILN_OK;
	if (klen > MAX_KEY)
		return kiln_error(KILN_EINVAL, "store: key of %zu bytes (at most %d)", klen, MAX_KEY);
	if (out)
		*out = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->broken) {
		pthread_mutex_unlock(&s->lock);
		return kiln_error(KILN_EIO, "store %s:%d: the connection failed earlier", s->host,
				  s->port);
	}
	h[0] = (unsigned char)op;
	put32(h + 1, (uint32_t)klen);
	unsigned char v4[4];
	put32(v4, vlen);
	int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	if (kiln_send_all(s->fd, h, 5) || kiln_send_all(s->fd, key, klen) || kiln_send_all(s->fd, v4, 4) ||
	    (vlen && kiln_send_all(s->fd, val, vlen))) {
		s->broken = 1;
		st = kiln_error(KILN_EIO, "store %s:%d: connection lost (rank 0, which hosts the store, may have died)",
				s->host, s->port);
		goto out;
	}
	int r = recv_all(s->fd, rh, 5, deadline);
	uint32_t rlen = r ? 0 : get32(rh + 1);
	char *rv = NULL;
	if (!r && rlen > MAX_VAL)
		r = -1;
	if (!r && !(rv = malloc((size_t)rlen + 1)))
		r = -1;
	if (!r && rlen)
		r = recv_all(s->fd, rv, rlen, deadline);
	if (r) {
		free(rv);
		s->broken = 1;
		if (r == -2)
			st = kiln_error(KILN_ETIMEOUT, "store %s:%d: no answer for '%s' within %d ms",
					s->host, s->port, key, timeout_ms);
		else
			st = kiln_error(KILN_EIO, "store %s:%d: connection lost (rank 0, which hosts the store, may have died)",
					s->host, s->port);
		goto out;
	}
	rv[rlen] = 0;
	*status = rh[0];
	if (out) {
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

static int connect_to(const char *host, int port, int64_t deadline, char *why, size_t n)
{
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	snprintf(why, n, "nothing answered");
	for (;;) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
		int rc = getaddrinfo(host, ps, &hints, &ai);
		if (rc) {
			snprintf(why, n, "cannot resolve '%s': %s", host, gai_strerror(rc));
		} else {
			for (struct addrinfo *p = ai; p; p = p->ai_next) {
				int fd = socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
				if (fd < 0)
					continue;
				if (!connect(fd, p->ai_addr, p->ai_addrlen)) {
					int one = 1;
					setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
					freeaddrinfo(ai);
					return fd;
				}
				snprintf(why, n, "%s", strerror(errno));
				close(fd);
			}
			freeaddrinfo(ai);
		}
		if (now_ms() >= deadline)
			return -1;
		usleep(50000); /* rank 0 may not be listening yet */
	}
}

kiln_status kiln_store_open(const char *host, int port, int host_it, int rank, int world,
			    int timeout_ms, struct kiln_store **out)
{
	struct kiln_store *s = calloc(1, sizeof *s);
	kiln_status st;
	char why[512];
	*out = NULL;
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->host, sizeof s->host, "%s", host_it ? "127.0.0.1" : host);
	s->port = port;
	s->call_ms = timeout_ms;
	if (host_it && (st = server_start(port, &s->srv, &s->port))) {
		kiln_store_close(s);
		return st;
	}
	s->fd = connect_to(s->host, s->port, now_ms() + timeout_ms, why, sizeof why);
	if (s->fd < 0) {
		st = kiln_error(KILN_ETIMEOUT, "rank %d of %d: cannot reach the rendezvous store at %s:%d within %.1f s (%s): is rank 0 running, and are the master address and port right?",
				rank, world, host, port, timeout_ms / 1000.0, why);
		kiln_store_close(s);
		return st;
	}
	int status;
	int64_t r = rank;
	if ((st = request(s, OP_HELLO, "", &r, 8, timeout_ms, &status, NULL, NULL))) {
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
	if (s->fd >= 0) {
		int status;
		request(s, OP_BYE, "", NULL, 0, 1000, &status, NULL, NULL);
		close(s->fd);
	}
	server_stop(s->srv);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

int kiln_store_port(const struct kiln_store *s) { return s ? s->port : 0; }

kiln_status kiln_store_set(struct kiln_store *s, const char *key, const void *val, size_t len)
{
	int status;
	if (len > MAX_VAL)
		return kiln_error(KILN_EINVAL, "store: value of %zu bytes for '%s'", len, key);
	return request(s, OP_SET, key, val, (uint32_t)len, s->call_ms, &status, NULL, NULL);
}

kiln_status kiln_store_get(struct kiln_store *s, const char *key, int timeout_ms, void **val,
			   size_t *len)
{
	int status;
	kiln_status st = request(s, OP_GET, key, NULL, 0, timeout_ms, &status, val, len);
	if (st == KILN_ETIMEOUT)
		return kiln_error(KILN_ETIMEOUT, "store: '%s' was not set within %.1f s", key,
				  timeout_ms / 1000.0);
	return st;
}

kiln_status kiln_store_check(struct kiln_store *s, const char *key, void **val, size_t *len)
{
	int status;
	kiln_status st = request(s, OP_CHECK, key, NULL, 0, s->call_ms, &status, val, len);
	if (!st && status) {
		free(*val);
		*val = NULL;
		if (len)
			*len = 0;
	}
	return st;
}

kiln_status kiln_store_add(struct kiln_store *s, const char *key, int64_t delta, int64_t *out)
{
	int status;
	void *v;
	size_t n;
	kiln_status st = request(s, OP_ADD, key, &delta, 8, s->call_ms, &status, &v, &n);
	if (st)
		return st;
	if (n == 8 && out)
		memcpy(out, v, 8);
	free(v);
	return KILN_OK;
}

kiln_status kiln_store_wait(struct kiln_store *s, const char *const *keys, int n, int timeout_ms)
{
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

kiln_status kiln_store_rendezvous(struct kiln_store *s, int rank, int world, int timeout_ms)
{
	char key[64];
	int64_t n;
	kiln_status st;
	snprintf(key, sizeof key, "kiln/joined/%d", rank);
	if ((st = kiln_store_set(s, key, "1", 1)) || (st = kiln_store_add(s, "kiln/joined", 1, &n)))
		return st;
	if (n == world && (st = kiln_store_set(s, "kiln/all_joined", "1", 1)))
		return st;
	void *v;
	st = kiln_store_get(s, "kiln/all_joined", timeout_ms, &v, NULL);
	if (!st) {
		free(v);
		return KILN_OK;
	}
	if (st != KILN_ETIMEOUT)
		return st;
	/* which ranks never came?  (a fresh connection: this one timed out) */
	struct kiln_store *q = NULL;
	char missing[512] = "";
	size_t m = 0;
	int count = 0;
	if (!kiln_store_open(s->host, s->port, 0, -1, world, 2000, &q)) {
		for (int r = 0; r < world && m + 16 < sizeof missing; r++) {
			snprintf(key, sizeof key, "kiln/joined/%d", r);
			if (!kiln_store_check(q, key, &v, NULL) && !v) {
				m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%d", m ? ", " : "", r);
				count++;
			}
			free(v);
		}
		kiln_store_close(q);
	}
	return kiln_error(KILN_ETIMEOUT, "rendezvous timed out after %.1f s: rank %d of %d waited at %s:%d but %s%s%s never arrived ([dist] timeout; check that every rank was started with the same world size and master address)",
			  timeout_ms / 1000.0, rank, world, s->host, s->port,
			  count ? (count > 1 ? "ranks " : "rank ") : "some ranks", missing,
			  count ? "" : "");
}

kiln_status kiln_store_poll(struct kiln_store *s, const char *const *keys, int n, int timeout_ms,
			    int *which, void **val)
{
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

int kiln_store_lost_rank(struct kiln_store *s, int wait_ms)
{
	static const char *const lost[] = { "kiln/lost" };
	int which;
	void *v = NULL;
	kiln_status st = kiln_store_poll(s, lost, 1, wait_ms, &which, &v);
	if (st == KILN_ETIMEOUT)
		return -1;
	if (st)
		return 0; /* the store is gone: so is rank 0 */
	int r = atoi(v);
	free(v);
	return r;
}
