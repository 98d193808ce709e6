/* core/store_server.c - the rendezvous store's server: a thread of rank 0
 * serving the key-value map to the ranks (core/store.h, kiln/dist.h).
 *
 * It listens on the master address only (127.0.0.1 for one machine).  A
 * client first gets a greeting with a fresh random nonce and must answer
 * with the token's HMAC of it within kiln_store_auth_ms of rank 0's
 * [dist] timeout (auth_ms); until then nothing
 * else is accepted.  A wrong HMAC is answered STORE_REFUSED, then
 * closed; a connection silent that long, or the oldest without the token
 * once STORE_MAX_UNAUTH (STORE_MAX_UNAUTH_ADDR from its address) are
 * waiting and it has waited STORE_UNAUTH_GRACE_MS, is closed and counted under STORE_DROPPED_KEY (a client tries
 * that again).  Each client has at most one request outstanding.  A
 * GET of an absent key parks the client until some SET makes the key
 * exist; timeouts are the client's business.  Sockets are non-blocking:
 * a reply waits in the client's own output buffer, and a client with
 * output pending is not read from, so one that never reads holds only its
 * one reply and never stops the thread.  Values over STORE_MAX_VALUE close
 * the connection; sets beyond STORE_MAX_KEYS keys or STORE_MAX_BYTES in
 * all are refused (STORE_REFUSED).  A connection is rank r's only once
 * its CLAIM of r was won (HELLO's rank is not taken: a second process
 * for a rank, killed before its claim was denied, was recorded as the
 * real rank lost).  The holder's connection closing before
 * "kiln/all_joined" releases the claim (its keys are removed, its JOIN
 * uncounted), so a restarted rank r joins the ranks still waiting (a
 * holder whose host went down or whose link was cut closes nothing: TCP
 * keepalive and TCP_USER_TIMEOUT, on until every rank joined, end its
 * connection within kiln_store_dead_after_ms; a live holder whose link
 * came back claims again: claim_takeover, or a plain won claim once it
 * was released); after
 * it, a close without BYE is a death: the server records it under
 * "kiln/lost" (the first such rank, decimal) and "kiln/lost/<rank>", so
 * the survivors can name it.  Asked to stop after a rank was lost while
 * clients are still connected (rank 0 failing first), it serves them
 * until they close, at most STORE_LINGER_MS: a survivor that notices the
 * loss after rank 0 did still reads the lost rank's number, not "the
 * store is gone".
 */
#include "internal.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/prctl.h> /* prctl(PR_SET_NAME): the thread's name in ps, top and perf */
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h> /* getrlimit: the ulimit -n an EMFILE hit */
#include <sys/socket.h>
#include <unistd.h>

struct kv {
	char *key;
	char *val;
	uint32_t len;
};

struct client {
	int fd;
	int rank;            /* the rank whose CLAIM it won, -1 none */
	int joined;          /* counted in kiln/joined (JOIN) */
	int has_key;         /* its CLAIM carried a claim key (claim_parse) */
	unsigned char key[STORE_CLAIM_KEY_LEN]; /* which a CLAIM taking its rank over shows */
	int bye, authed;
	int closing;         /* its token was refused: closed once the answer is sent */
	int64_t auth_by;     /* ms: dropped when not authenticated by then */
	char peer[96];       /* its address, "ADDR:PORT" */
	char addr[64];       /* ADDR alone (STORE_MAX_UNAUTH_ADDR) */
	unsigned char nonce[STORE_NONCE_LEN];
	unsigned char *buf;  /* the request being received */
	size_t have, cap;
	unsigned char *out;  /* output not yet sent */
	size_t out_off, out_len;
	char *waiting;       /* GET parked on this key, or NULL */
};

struct store_server {
	int lfd, wake[2];
	pthread_t thread;
	char token[STORE_TOKEN_MAX + 1];
	struct kv *kv;
	size_t n_kv, cap_kv, bytes;
	struct client *cl;
	size_t n_cl, cap_cl;
	long long n_refused; /* connections that failed AUTH */
	long long n_dropped; /* connections closed before AUTH (STORE_DROPPED_KEY) */
	int unauth_told;     /* "at its limit of ... no token" was logged */
	int full_told;       /* "at its limit of 1024 ..." was logged (its own
			      * flag: the first did not hide it) */
	long long n_claims_refused; /* claims denied: the server's own count (a
				     * client may SET STORE_CLAIMS_REFUSED_KEY to
				     * anything; parsing it back read past a short
				     * value, session 32) */
	int dead_after_ms;        /* kiln_store_dead_after_ms of the rendezvous timeout */
	int auth_ms;              /* kiln_store_auth_ms of it: the token's wait */
	int all_joined;           /* kiln/all_joined is set: keepalive is off */
	int accept_err;           /* the errno accept4 last failed with, told once */
	int64_t accept_again_at;  /* after EMFILE/ENFILE: when to try again (ms) */
};

static int64_t now_ms(void) { return kiln_now_ns() / 1000000; }

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static struct kv *kv_find(struct store_server *s, const char *key)
{
	for (size_t i = 0; i < s->n_kv; i++)
		if (!strcmp(s->kv[i].key, key))
			return &s->kv[i];
	return NULL;
}

/* Queue bytes for the client (sent as its socket takes them). -1: no memory. */
static int queue(struct client *c, const void *p, size_t n)
{
	unsigned char *o = realloc(c->out, c->out_len + n);
	if (!o)
		return -1;
	memcpy(o + c->out_len, p, n);
	c->out = o;
	c->out_len += n;
	return 0;
}

static int reply(struct client *c, int status, const void *val, uint32_t len)
{
	unsigned char h[5];
	h[0] = (unsigned char)status;
	put32(h + 1, len);
	return queue(c, h, 5) || (len && queue(c, val, len)) ? -1 : 0;
}

/* Send what the socket takes now.  -1: the connection failed. */
static int flush_out(struct client *c)
{
	while (c->out_off < c->out_len) {
		ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (k <= 0)
			return -1;
		c->out_off += (size_t)k;
	}
	free(c->out);
	c->out = NULL;
	c->out_off = c->out_len = 0;
	return 0;
}

/* A connection's keepalive (on: until every rank joined).  Before, a
 * claim's holder whose host went down or whose link was cut is noticed
 * within s->dead_after_ms (probes unanswered, or a reply unacknowledged:
 * TCP_USER_TIMEOUT), and its claim released (client_drop); without it the
 * connection stayed open, as the server writes only answers, and a rank
 * started again was refused while the others waited out [dist] timeout
 * (session 32).  After, a silent rank is the heartbeat's to name, not a
 * loss after a few seconds of a flaky link. */
static void client_keepalive(const struct store_server *s, int fd, int on)
{
	const int ka = on, idle = s->dead_after_ms / 3000 > 0 ? s->dead_after_ms / 3000 : 1,
		  intvl = s->dead_after_ms / 6000 > 0 ? s->dead_after_ms / 6000 : 1, cnt = 3;
	const unsigned int user = on ? (unsigned int)s->dead_after_ms : 0;
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &ka, sizeof ka);
	if (on) {
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof user);
}

/* kiln/all_joined was just set: every connection's keepalive off. */
static void all_joined_now(struct store_server *s)
{
	s->all_joined = 1;
	for (size_t i = 0; i < s->n_cl; i++)
		client_keepalive(s, s->cl[i].fd, 0);
}

/* Set key; `own`: the server's own records (lost ranks, counters'
 * text), which the limits do not refuse.  0 ok, 1 refused (a limit), -1
 * out of memory. */
static int kv_set(struct store_server *s, const char *key, const void *val, uint32_t len, int own)
{
	struct kv *e = kv_find(s, key);
	size_t klen = strlen(key);
	size_t grow = (size_t)len + (e ? 0 : klen) - (e ? e->len : 0);
	if (!own && ((!e && s->n_kv >= STORE_MAX_KEYS) ||
		     (e && len > e->len && s->bytes + grow > STORE_MAX_BYTES) ||
		     (!e && s->bytes + grow > STORE_MAX_BYTES)))
		return 1;
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
		s->bytes += klen;
	} else {
		s->bytes -= e->len;
		free(e->val);
	}
	e->val = v;
	e->len = len;
	s->bytes += len;
	if (!s->all_joined && !strcmp(key, "kiln/all_joined"))
		all_joined_now(s);
	/* wake the clients parked on it */
	for (size_t i = 0; i < s->n_cl; i++) {
		struct client *c = &s->cl[i];
		if (c->waiting && !strcmp(c->waiting, key)) {
			free(c->waiting);
			c->waiting = NULL;
			if (reply(c, STORE_OK, e->val, e->len))
				return -1;
		}
	}
	return 0;
}

/* Remove key (a released claim's records); nothing when absent. */
static void kv_del(struct store_server *s, const char *key)
{
	struct kv *e = kv_find(s, key);
	if (!e)
		return;
	s->bytes -= strlen(e->key) + e->len;
	free(e->key);
	free(e->val);
	*e = s->kv[--s->n_kv];
}

/* kiln/joined's count (0 when unset). */
static int64_t joined_count(struct store_server *s)
{
	struct kv *e = kv_find(s, "kiln/joined");
	return e ? strtoll(e->val, NULL, 10) : 0;
}

static int set_count(struct store_server *s, const char *key, int64_t v)
{
	char txt[24];
	int n = snprintf(txt, sizeof txt, "%lld", (long long)v);
	return kv_set(s, key, txt, (uint32_t)n, 1);
}

/* Rank `rank`'s holder left before every rank joined (died, or exited on
 * a failure of its own): its claim and what it posted under its rank go,
 * and its JOIN is uncounted, so a process started again for the rank
 * joins the ranks still waiting instead of being refused as a second one
 * (every waiting rank failed "rank 1 joined twice" before session 32). */
static void claim_release(struct store_server *s, int rank, int joined)
{
	static const char *const keys[] = { "kiln/claim/%d", "kiln/joined/%d", "kiln/addr/%d",
					    "kiln/addr_set/%d", "kiln/host/%d" };
	char key[64];
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		snprintf(key, sizeof key, keys[i], rank);
		kv_del(s, key);
	}
	if (joined)
		set_count(s, "kiln/joined", joined_count(s) - 1);
	if (rank) /* (rank 0's own leaving ends this store) */
		kiln_log(KILN_LOG_INFO, "store", "rank %d left before every rank had joined: its claim is released (a process started again as rank %d may join)",
			 rank, rank);
}

static void client_free(struct client *c)
{
	close(c->fd);
	free(c->buf);
	free(c->out);
	free(c->waiting);
}

static void client_drop(struct store_server *s, size_t i)
{
	struct client *c = &s->cl[i];
	const int all = s->all_joined; /* (kiln/all_joined is set: kv_set) */
	const int held = c->rank, joined = c->joined;
	int rank = c->bye || !c->authed || !all ? -1 : c->rank;
	client_free(c);
	s->cl[i] = s->cl[--s->n_cl];
	if (held >= 0 && !all)
		claim_release(s, held, joined);
	if (rank >= 0) {
		char key[64], v[24];
		int n = snprintf(v, sizeof v, "%d", rank);
		snprintf(key, sizeof key, "kiln/lost/%d", rank);
		kv_set(s, key, v, (uint32_t)n, 1);
		if (!kv_find(s, "kiln/lost"))
			kv_set(s, "kiln/lost", v, (uint32_t)n, 1);
	}
}

/* A connection that failed AUTH: counted under STORE_REFUSED_KEY (the
 * count, the last one's address and why), which the rendezvous' timeout
 * names (a node started with another KILN_STORE_TOKEN otherwise only
 * "never arrived"); the first is logged at once. */
static void auth_refused(struct store_server *s, const struct client *c, const char *why)
{
	char v[256];
	int n = snprintf(v, sizeof v, "refused %lld connection(s), the last from %s: %s",
			 ++s->n_refused, c->peer, why);
	kv_set(s, STORE_REFUSED_KEY, v, (uint32_t)(n < (int)sizeof v ? n : (int)sizeof v - 1), 1);
	if (s->n_refused == 1)
		kiln_log(KILN_LOG_WARN, "store", "refused a connection from %s: %s (every rank needs the same KILN_STORE_TOKEN; further refusals are counted, not logged)",
			 c->peer, why);
}

/* A connection closed before it presented the token: none within
 * auth_ms (a link that broke during the handshake: the client of
 * session 34 on connects again), or the oldest such closed for a new one
 * (accept_client).  Not a refusal (its token was never seen): counted
 * under STORE_DROPPED_KEY, which the rendezvous' timeout names, the
 * first logged. */
static void unauth_dropped(struct store_server *s, const struct client *c, const char *why)
{
	char v[256];
	int n = snprintf(v, sizeof v, "dropped %lld connection(s) that presented no token, the last from %s: %s",
			 ++s->n_dropped, c->peer, why);
	kv_set(s, STORE_DROPPED_KEY, v, (uint32_t)(n < (int)sizeof v ? n : (int)sizeof v - 1), 1);
	if (s->n_dropped == 1)
		kiln_log(KILN_LOG_WARN, "store", "closed a connection from %s that presented no token: %s (further ones are counted under %s, not logged)",
			 c->peer, why, STORE_DROPPED_KEY);
}

/* AUTH: the token's MAC of this client's nonce, else it is dropped. */
static int handle_auth(struct store_server *s, struct client *c, const struct kiln_store_msg *m)
{
	unsigned char mac[STORE_MAC_LEN];
	if (m->op != STORE_OP_AUTH || m->vlen != STORE_MAC_LEN) {
		auth_refused(s, c, "it sent no token (not a kiln store client of this version)");
		return -1;
	}
	if (store_mac(s->token, c->nonce, mac) || CRYPTO_memcmp(mac, m->val, STORE_MAC_LEN)) {
		/* said before the close (closing: client_turn), so that the
		 * client knows its token was refused: a close alone is also
		 * what a link that broke during the handshake looks like, which
		 * it retries (the two were one, "refused this process's token",
		 * before session 34) */
		static const char why[] = "a wrong token";
		auth_refused(s, c, why);
		c->closing = 1;
		return reply(c, STORE_REFUSED, why, sizeof why - 1);
	}
	c->authed = 1;
	return reply(c, STORE_OK, NULL, 0);
}

/* A set's answer: kv_set's r (0 done, 1 refused: the reason, -1 drop). */
static int set_reply(struct client *c, int r, const void *val, uint32_t len)
{
	static const char why[] = "the store's limits are reached (65536 keys, 32 MiB in all)";
	if (r < 0)
		return -1;
	return r ? reply(c, STORE_REFUSED, why, sizeof why - 1) : reply(c, STORE_OK, val, len);
}

/* A CLAIM's value (core/store.h): the rank, who (text, up to a NUL),
 * then, from a client of session 33 on, the NUL and the process's claim
 * key.  -1: malformed. */
static int claim_parse(const struct kiln_store_msg *m, int64_t *r, char *who, size_t wn,
		       unsigned char *key, int *has_key)
{
	if (m->vlen < 8)
		return -1;
	memcpy(r, m->val, 8);
	if (*r < 0 || *r > INT32_MAX)
		return -1;
	const unsigned char *t = m->val + 8, *nul = memchr(t, 0, m->vlen - 8);
	const size_t tl = nul ? (size_t)(nul - t) : m->vlen - 8;
	const size_t wl = tl < wn - 1 ? tl : wn - 1;
	memcpy(who, t, wl);
	who[wl] = 0;
	*has_key = nul && m->vlen - 8 - tl - 1 == STORE_CLAIM_KEY_LEN;
	if (*has_key)
		memcpy(key, nul + 1, STORE_CLAIM_KEY_LEN);
	return 0;
}

/* The live connection that holds rank r's claim other than c, or NULL. */
static struct client *claim_holder(struct store_server *s, const struct client *c, int64_t r)
{
	for (size_t i = 0; i < s->n_cl; i++)
		if (&s->cl[i] != c && s->cl[i].rank == r)
			return &s->cl[i];
	return NULL;
}

/* The holder h's process claims its rank again on a new connection c (its
 * old one broke on its side, a link blip, before the server noticed): c
 * takes the claim and the join over; h is shut down, and its close
 * releases nothing and is no loss (its rank is -1 now).  Without this,
 * the rank was refused as a second process for itself, or, had every
 * other rank joined meanwhile, lost when h's close came. */
static void claim_takeover(struct client *c, struct client *h, int64_t r)
{
	c->rank = (int)r;
	c->joined = h->joined;
	h->rank = -1;
	h->joined = 0;
	shutdown(h->fd, SHUT_RDWR); /* (dropped at its next turn: it reads EOF) */
	kiln_log(KILN_LOG_INFO, "store", "rank %lld connected again (the same process, from %s): its previous connection is closed",
		 (long long)r, c->peer);
}

/* CLAIM: won when nobody holds the rank (kiln/claim/R holds the winner's
 * who), or when the live holder is the same process (its claim key:
 * claim_takeover); a denial answers the holder's who, then a NUL and the
 * store's kiln_store_dead_after_ms (u32), which the refused process's
 * message names (its own [dist] timeout may differ from rank 0's, which
 * this store's is; clients before session 33 print up to the NUL), and
 * is counted under STORE_CLAIMS_REFUSED_KEY, which the rendezvous'
 * timeout names. */
static int handle_claim(struct store_server *s, struct client *c, const struct kiln_store_msg *m)
{
	int64_t r = -1;
	char key[64], who[320], note[800];
	unsigned char ckey[STORE_CLAIM_KEY_LEN];
	int has_key = 0;
	if (c->rank >= 0 || claim_parse(m, &r, who, sizeof who, ckey, &has_key))
		return -1;
	snprintf(key, sizeof key, "kiln/claim/%lld", (long long)r);
	const struct kv *e = kv_find(s, key);
	struct client *h = e ? claim_holder(s, c, r) : NULL;
	if (h && has_key && h->has_key && !CRYPTO_memcmp(h->key, ckey, sizeof ckey)) {
		claim_takeover(c, h, r);
	} else if (e) {
		unsigned char h5[5], d[4];
		int k = snprintf(note, sizeof note, "refused %lld claim(s), the last: rank %lld by %s (held by %s)",
				 ++s->n_claims_refused, (long long)r, who, e->val);
		h5[0] = STORE_DENIED;
		put32(h5 + 1, e->len + 1 + (uint32_t)sizeof d);
		put32(d, (uint32_t)s->dead_after_ms);
		/* (e->val ends in a NUL: kv_set) */
		if (queue(c, h5, sizeof h5) || queue(c, e->val, e->len + 1) || queue(c, d, sizeof d))
			return -1;
		kv_set(s, STORE_CLAIMS_REFUSED_KEY, note,
		       (uint32_t)(k < (int)sizeof note ? k : (int)sizeof note - 1), 1);
		return 0;
	} else if (kv_set(s, key, who, (uint32_t)strlen(who), 1)) {
		return -1;
	}
	c->rank = (int)r;
	c->has_key = has_key;
	memcpy(c->key, ckey, sizeof ckey);
	return reply(c, STORE_OK, NULL, 0);
}

/* JOIN (after a won claim): counted once; the world-th sets
 * kiln/all_joined in the same step, so no release can come between. */
static int handle_join(struct store_server *s, struct client *c, const struct kiln_store_msg *m)
{
	int64_t world = 0;
	if (m->vlen != 8 || c->rank < 0)
		return -1;
	memcpy(&world, m->val, 8);
	int64_t n = joined_count(s);
	if (!c->joined) {
		c->joined = 1;
		if (set_count(s, "kiln/joined", ++n))
			return -1;
		if (n == world && kv_set(s, "kiln/all_joined", "1", 1, 1))
			return -1;
	}
	return reply(c, STORE_OK, &n, 8);
}

/* Handle one request; -1 drops the client. */
static int handle(struct store_server *s, struct client *c, const struct kiln_store_msg *m)
{
	char key[STORE_MAX_KEY + 1];
	memcpy(key, m->key, m->klen);
	key[m->klen] = 0;
	if (!c->authed)
		return handle_auth(s, c, m);
	switch (m->op) {
	case STORE_OP_HELLO: /* its rank is a claim's to give (handle_claim) */
		return reply(c, STORE_OK, NULL, 0);
	case STORE_OP_CLAIM:
		return handle_claim(s, c, m);
	case STORE_OP_JOIN:
		return handle_join(s, c, m);
	case STORE_OP_CANCEL: /* the client gave up on its request */
		free(c->waiting);
		c->waiting = NULL;
		return reply(c, STORE_CANCELLED, NULL, 0);
	case STORE_OP_BYE:
		c->bye = 1;
		return reply(c, STORE_OK, NULL, 0);
	case STORE_OP_SET:
		return set_reply(c, kv_set(s, key, m->val, m->vlen, 0), NULL, 0);
	case STORE_OP_GET:
	case STORE_OP_CHECK: {
		struct kv *e = kv_find(s, key);
		if (e)
			return reply(c, STORE_OK, e->val, e->len);
		if (m->op == STORE_OP_CHECK)
			return reply(c, STORE_ABSENT, NULL, 0);
		return (c->waiting = kiln_strdup(key)) ? 0 : -1;
	}
	case STORE_OP_ADD: {
		struct kv *e = kv_find(s, key);
		int64_t d = 0, v = e ? strtoll(e->val, NULL, 10) : 0;
		char txt[24];
		if (m->vlen == 8)
			memcpy(&d, m->val, 8);
		if (__builtin_add_overflow(v, d, &v))
			return -1; /* beyond int64: drop the client, keep the counter */
		int n = snprintf(txt, sizeof txt, "%lld", (long long)v);
		return set_reply(c, kv_set(s, key, txt, (uint32_t)n, !!e), &v, 8);
	}
	}
	return -1;
}

/* Handle the complete requests buffered, while nothing is queued to send
 * and no GET is parked but for a CANCEL of it.  -1: drop. */
static int client_work(struct store_server *s, struct client *c)
{
	size_t off = 0;
	int r = 0;
	while (!c->out_len && !c->closing && off < c->have) {
		struct kiln_store_msg m;
		long need = kiln_store_msg_parse(c->buf + off, c->have - off,
						 c->authed ? STORE_MAX_VALUE : STORE_MAC_LEN, &m);
		if (need < 0 || (need > 0 && c->waiting && m.op != STORE_OP_CANCEL)) {
			r = -1; /* malformed, or a request while parked */
			break;
		}
		if (!need)
			break;
		if (handle(s, c, &m)) {
			r = -1;
			break;
		}
		off += (size_t)need;
	}
	memmove(c->buf, c->buf + off, c->have - off);
	c->have -= off;
	return r;
}

/* Read what is there (up to the request being received and 64 KiB), then
 * handle what is complete.  -1: drop. */
static int client_read(struct store_server *s, struct client *c)
{
	if (c->have + 65536 > c->cap) {
		size_t nc = c->cap ? c->cap : 65536;
		while (nc < c->have + 65536)
			nc *= 2;
		unsigned char *n = realloc(c->buf, nc);
		if (!n)
			return -1;
		c->buf = n;
		c->cap = nc;
	}
	ssize_t k = recv(c->fd, c->buf + c->have, 65536, 0);
	if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (k <= 0)
		return -1;
	c->have += (size_t)k;
	return client_work(s, c);
}

/* A failed accept, said once per cause: the client that waits gets no
 * greeting and times out, without knowing why.  Out of descriptors, the
 * listener rests STORE_ACCEPT_REST_MS (the pending connection stays
 * queued; polling it again at once would spin). */
#define STORE_ACCEPT_REST_MS 100
static void accept_failed(struct store_server *s, int err)
{
	if (err == EMFILE || err == ENFILE)
		s->accept_again_at = now_ms() + STORE_ACCEPT_REST_MS;
	if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED ||
	    err == s->accept_err)
		return;
	s->accept_err = err;
	struct rlimit rl;
	char lim[64] = "";
	if (err == EMFILE && !getrlimit(RLIMIT_NOFILE, &rl))
		snprintf(lim, sizeof lim, " (ulimit -n %llu)", (unsigned long long)rl.rlim_cur);
	kiln_log(KILN_LOG_ERROR, "dist", "the rendezvous store cannot take a connection: %s%s: the rank waiting on it gets no answer",
		 strerror(err), lim);
}

/* The index of the unauthenticated connection that waited longest, of
 * address addr (NULL: of any), and how many there are (*n); -1: none. */
static long unauth_oldest(const struct store_server *s, const char *addr, int *n)
{
	long o = -1;
	*n = 0;
	for (size_t i = 0; i < s->n_cl; i++) {
		const struct client *c = &s->cl[i];
		if (c->authed || c->closing || (addr && strcmp(c->addr, addr)))
			continue;
		++*n;
		if (o < 0 || c->auth_by < s->cl[o].auth_by)
			o = (long)i;
	}
	return o;
}

/* "The store is at its connection limit", said once a run per limit
 * (*told: that limit's flag). */
static void limit_told(int *told, const char *what, const char *peer)
{
	if (*told)
		return;
	*told = 1;
	kiln_log(KILN_LOG_WARN, "store", "the store is at its connection limit (%s): %s (said once; a rank whose connection closed before it presented the token connects again)",
		 what, peer);
}

/* Connection i (-1: none) has waited STORE_UNAUTH_GRACE_MS without the
 * token: it may be closed for a new one. */
static int unauth_stale(const struct store_server *s, long i, int64_t now)
{
	return i >= 0 && now - (s->cl[i].auth_by - s->auth_ms) >= STORE_UNAUTH_GRACE_MS;
}

/* Whether a new connection, from whatever address, could meet a limit of
 * connections without the token (STORE_MAX_UNAUTH, or STORE_MAX_CLIENTS
 * with one of them there: the oldest; STORE_MAX_UNAUTH_ADDR: an address's
 * oldest) whose candidate is not stale yet: then it waits in the listen
 * backlog (the listener rests STORE_UNAUTH_REST_MS; a rank presenting its
 * token makes room too).  A rank whose greeting went out has often not
 * answered only because the server has not read it yet: closing it
 * (session 34: 9 of 128 processes opening from one host at once were)
 * took the young for the idle. */
#define STORE_UNAUTH_REST_MS 10
static int unauth_wait(struct store_server *s)
{
	int n_all, n;
	const int64_t now = now_ms();
	const long o = unauth_oldest(s, NULL, &n_all);
	int wait = o >= 0 && (n_all >= STORE_MAX_UNAUTH || s->n_cl >= STORE_MAX_CLIENTS) &&
		   !unauth_stale(s, o, now);
	for (size_t i = 0; i < s->n_cl && !wait; i++) {
		if (s->cl[i].authed || s->cl[i].closing)
			continue;
		const long oa = unauth_oldest(s, s->cl[i].addr, &n);
		wait = n >= STORE_MAX_UNAUTH_ADDR && !unauth_stale(s, oa, now);
	}
	if (wait)
		s->accept_again_at = now + STORE_UNAUTH_REST_MS;
	return wait;
}

/* Make room for a new connection from addr: past STORE_MAX_UNAUTH_ADDR
 * unauthenticated ones from addr, or STORE_MAX_UNAUTH in all, the oldest
 * (of addr first) is closed, stale by then (unauth_wait): a new
 * connection is never refused for idle ones (1024 idle connections held
 * every slot, and a rank was closed silently at the door, session 34),
 * and a rank, which presents its token within milliseconds of the
 * greeting, is past them by then.  0: room; -1: STORE_MAX_CLIENTS
 * authenticated connections, none to close. */
static int unauth_room(struct store_server *s, const char *addr, const char *peer)
{
	int n_addr, n_all;
	long o = unauth_oldest(s, addr, &n_addr);
	if (n_addr < STORE_MAX_UNAUTH_ADDR)
		o = unauth_oldest(s, NULL, &n_all);
	else
		n_all = STORE_MAX_UNAUTH;
	if ((n_all >= STORE_MAX_UNAUTH || s->n_cl >= STORE_MAX_CLIENTS) && unauth_stale(s, o, now_ms())) {
		char what[160];
		snprintf(what, sizeof what, "%d connections that have not presented the token, %d from one address",
			 STORE_MAX_UNAUTH, STORE_MAX_UNAUTH_ADDR);
		limit_told(&s->unauth_told, what, "the oldest is closed for each new one");
		unauth_dropped(s, &s->cl[o], "closed for a newer one (the store's limit of connections that have not presented the token)");
		client_drop(s, (size_t)o);
	}
	if (s->n_cl < STORE_MAX_CLIENTS)
		return 0;
	char note[160];
	snprintf(note, sizeof note, "a new connection is closed, the first from %s", peer);
	limit_told(&s->full_told, "1024 connections, each with the token", note);
	return -1;
}

static void accept_client(struct store_server *s)
{
	struct sockaddr_storage sa;
	socklen_t sl = sizeof sa;
	char host[64] = "?", serv[16] = "?";
	if (unauth_wait(s))
		return;
	int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		accept_failed(s, errno);
		return;
	}
	s->accept_err = 0;
	getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, serv, sizeof serv,
		    NI_NUMERICHOST | NI_NUMERICSERV);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (!s->all_joined)
		client_keepalive(s, fd, 1);
	char peer[96];
	snprintf(peer, sizeof peer, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, serv);
	struct client *ncl = s->cl;
	if (unauth_room(s, host, peer) ||
	    (s->n_cl == s->cap_cl &&
	     !(ncl = realloc(s->cl, (s->cap_cl ? 2 * s->cap_cl : 16) * sizeof *ncl)))) {
		close(fd);
		return;
	}
	if (s->n_cl == s->cap_cl)
		s->cap_cl = s->cap_cl ? 2 * s->cap_cl : 16;
	s->cl = ncl;
	struct client *c = &s->cl[s->n_cl];
	*c = (struct client){ .fd = fd, .rank = -1, .auth_by = now_ms() + s->auth_ms };
	snprintf(c->peer, sizeof c->peer, "%s", peer);
	snprintf(c->addr, sizeof c->addr, "%s", host);
	if (store_random(c->nonce, sizeof c->nonce) || queue(c, STORE_MAGIC, STORE_MAGIC_LEN) ||
	    queue(c, c->nonce, sizeof c->nonce) || flush_out(c)) {
		client_free(c);
		return;
	}
	s->n_cl++;
}

/* One client's turn after poll: send, read, or drop it (then the last
 * client moves into slot i). */
static void client_turn(struct store_server *s, size_t i, short rev, int64_t now)
{
	struct client *c = &s->cl[i];
	int bad = (!c->authed && now >= c->auth_by) || ((rev & (POLLERR | POLLNVAL)) != 0);
	if (!c->authed && !c->closing && now >= c->auth_by) {
		char why[64];
		snprintf(why, sizeof why, "it presented no token within %.1f s", s->auth_ms / 1000.0);
		unauth_dropped(s, c, why);
	}
	if (!bad && (rev & (POLLOUT | POLLHUP)) && c->out_len)
		bad = flush_out(c) || (!c->out_len && client_work(s, c));
	if (!bad && (rev & (POLLIN | POLLHUP)) && !c->out_len)
		bad = client_read(s, c);
	if (!bad && c->closing) /* refused: closed once its answer is out */
		bad = flush_out(c) || !c->out_len;
	if (bad)
		client_drop(s, i);
}

static void *server_main(void *arg)
{
	struct store_server *s = arg;
	struct pollfd *pf = NULL;
	prctl(PR_SET_NAME, "kiln-store");
	size_t cap = 0;
	int64_t linger_until = -1; /* stopping: serve the clients left until then */
	for (;;) {
		size_t n = 2 + s->n_cl;
		if (n > cap) {
			struct pollfd *np = realloc(pf, n * 2 * sizeof *np);
			if (!np)
				break;
			pf = np;
			cap = n * 2;
		}
		pf[0] = (struct pollfd){ .fd = linger_until < 0 ? s->wake[0] : -1, .events = POLLIN };
		const int64_t rest = s->accept_again_at - now_ms();
		pf[1] = (struct pollfd){ .fd = rest > 0 ? -1 : s->lfd, .events = POLLIN };
		for (size_t i = 0; i < s->n_cl; i++)
			pf[2 + i] = (struct pollfd){ .fd = s->cl[i].fd,
						     .events = s->cl[i].out_len ? POLLOUT : POLLIN };
		int wait = rest > 0 ? (int)rest : 1000;
		if (linger_until >= 0) {
			const int64_t left = linger_until - now_ms();
			if (s->n_cl == 0 || left <= 0)
				break;
			wait = left < wait ? (int)left : wait;
		}
		if (poll(pf, n, wait) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pf[0].revents) {
			/* only a run that lost a rank has something to tell the
			 * clients left; a stopped peer (no loss recorded) would
			 * only hold rank 0's exit back */
			if (s->n_cl == 0 || !kv_find(s, "kiln/lost"))
				break;
			linger_until = now_ms() + STORE_LINGER_MS;
		}
		/* clients first (indices shift as they drop: walk backwards) */
		const int64_t now = now_ms();
		for (size_t i = s->n_cl; i-- > 0;)
			client_turn(s, i, pf[2 + i].revents, now);
		if (pf[1].revents & POLLIN)
			accept_client(s);
	}
	free(pf);
	return NULL;
}

static void server_free(struct store_server *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n_cl; i++)
		client_free(&s->cl[i]);
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
	OPENSSL_cleanse(s->token, sizeof s->token);
	free(s);
}

/* Listen on host:port (the first address it resolves to). */
static kiln_status server_listen(struct store_server *s, const char *host, int port, int *bound)
{
	char ps[16];
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
	struct sockaddr_storage a;
	socklen_t al = sizeof a;
	int one = 1;
	snprintf(ps, sizeof ps, "%d", port);
	int rc = getaddrinfo(host, ps, &hints, &ai);
	if (rc)
		return kiln_error(KILN_EIO, "store: cannot resolve the master address '%s': %s", host,
				  gai_strerror(rc));
	s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->lfd < 0) {
		freeaddrinfo(ai);
		return kiln_error(KILN_EIO, "store: socket: %s", strerror(errno));
	}
	setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s->lfd, ai->ai_addr, ai->ai_addrlen) || listen(s->lfd, 256) ||
	    getsockname(s->lfd, (struct sockaddr *)&a, &al)) {
		freeaddrinfo(ai);
		return kiln_error(KILN_EIO, "store: cannot listen on " KILN_AT_FMT ": %s (another run on this port? set KILN_MASTER_PORT / MASTER_PORT; is %s an address of this machine?)",
				  KILN_AT_ARG(host, port), strerror(errno), host);
	}
	freeaddrinfo(ai);
	*bound = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
					       : ((struct sockaddr_in *)&a)->sin_port);
	return KILN_OK;
}

kiln_status store_server_start(const char *host, int port, const char *token, int timeout_ms,
			       int *bound, struct store_server **out)
{
	struct store_server *s = calloc(1, sizeof *s);
	kiln_status st;
	if (!s)
		return kiln_error(KILN_ENOMEM, "out of memory");
	s->lfd = s->wake[0] = s->wake[1] = -1;
	snprintf(s->token, sizeof s->token, "%s", token);
	s->dead_after_ms = kiln_store_dead_after_ms(timeout_ms);
	s->auth_ms = kiln_store_auth_ms(timeout_ms);
	if ((st = server_listen(s, host, port, bound))) {
		server_free(s);
		return st;
	}
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

void store_server_stop(struct store_server *s)
{
	if (!s)
		return;
	/* retried when an application's signal (a handler without
	 * SA_RESTART) cuts it short: without the byte the join waits forever */
	ssize_t w;
	while ((w = write(s->wake[1], "x", 1)) < 0 && errno == EINTR)
		;
	if (w != 1) {
		/* the thread then only ends with the process */
	}
	pthread_join(s->thread, NULL);
	server_free(s);
}
