/* core/store.h - what the rendezvous store's client (core/store.c) and
 * server (core/store_server.c) share: the wire format, its parser
 * (core/store_msg.c, a pure function the fuzz targets call), the token
 * and its HMAC challenge, and the server's limits.
 *
 * Wire format, both ways little-endian:
 *   greeting (server, once):  "KILNST2\n", nonce[32]
 *   request:  u8 op, u32 klen, key[klen], u32 vlen, val[vlen]
 *   response: u8 status, u32 vlen, val[vlen]
 * The greeting names the protocol: KILNST2 since session 32 (CLAIM and
 * JOIN, the server deciding who is rank r); a kiln of the KILNST1
 * protocol and a newer one in one run failed with wrong messages, now the
 * client says "not a kiln store (of this version)".
 * The first request must be AUTH with val = HMAC-SHA256(token,
 * "kiln-store-auth-v1" nonce) (OpenSSL); anything else closes the
 * connection.  A wrong MAC is answered STORE_REFUSED (val: why) before
 * the close (session 34): the client tells a refused token from a link
 * that broke during the handshake, which it retries (core/store.c,
 * store_connect).  A client before session 34 reads that answer as the
 * refusal it always reported; a server before it only closes, which a
 * client of session 34 on retries until its deadline and then names both
 * causes. */
#ifndef KILN_CORE_STORE_H
#define KILN_CORE_STORE_H

#include <kiln/status.h>

#include <stddef.h>
#include <stdint.h>

enum {
	STORE_OP_HELLO = 1,
	STORE_OP_SET = 2,
	STORE_OP_GET = 3,
	STORE_OP_CHECK = 4,
	STORE_OP_ADD = 5,
	STORE_OP_BYE = 6,
	STORE_OP_AUTH = 7,
	/* the rendezvous' own steps, which the server ties to the connection
	 * (core/store_server.c): CLAIM val = i64 rank, then who (text), then
	 * (session 33 on) a NUL and the process's claim key
	 * (STORE_CLAIM_KEY_LEN random bytes): won (STORE_OK) when no live or
	 * joined process holds the rank, or when its live holder's claim
	 * carried the same key (the same process connecting again after its
	 * connection broke: it takes the claim over), else STORE_DENIED with
	 * the holder's who, then (session 33 on) a NUL and the server's
	 * kiln_store_dead_after_ms as u32.  Both additions ride behind a
	 * NUL within KILNST2: a server before them stores the key as part of
	 * who and never takes over (a client then waits for the old claim's
	 * release); a client before them prints the denial up to the NUL and
	 * claims with no key (never taken over); JOIN val = i64 world: counted
	 * in kiln/joined once, the world-th sets kiln/all_joined; answered
	 * with the count (i64) */
	STORE_OP_CLAIM = 8,
	STORE_OP_JOIN = 9,
	/* CANCEL (session 36): sent after a request timed out (a GET parked
	 * on a key nobody set): the server drops the parked GET, if any,
	 * and answers STORE_CANCELLED, after the answer to the request if
	 * that came first, so the client reads up to it and the stream is
	 * in step again.  The one request taken while a GET is parked.  A
	 * server before it closes the connection (the client then counts
	 * it broken, as every timed-out request was before) */
	STORE_OP_CANCEL = 10,
};

/* response status */
enum { STORE_OK = 0, STORE_ABSENT = 1, STORE_REFUSED = 2, STORE_DENIED = 3, STORE_CANCELLED = 4 };

#define STORE_MAGIC "KILNST2\n"
#define STORE_MAGIC_LEN 8
#define STORE_NONCE_LEN 32
#define STORE_MAC_LEN 32
#define STORE_CLAIM_KEY_LEN 16
#define STORE_MAX_KEY 4096
/* the server's limits (docs/distributed.md, "The store") */
#define STORE_MAX_VALUE (8u << 20)    /* bytes of one value */
#define STORE_MAX_BYTES (32u << 20)   /* bytes of all keys and values */
#define STORE_MAX_KEYS 65536
#define STORE_MAX_CLIENTS 1024        /* connections at once */
/* connections that have not presented the token yet, in all and from one
 * address (ADDR, any port): a new one beyond either closes the oldest of
 * them (of that address, for the second), so idle connections never lock
 * the ranks out (1024 of them did, session 34) and one address's never
 * push another's out */
#define STORE_MAX_UNAUTH 64
#define STORE_MAX_UNAUTH_ADDR 32
/* ... but only one that has waited this long since its greeting (a rank
 * answers within milliseconds; until one has, a new connection waits in
 * the listen backlog): closing any, 128 ranks opening from one host at
 * once had 9 closed in their handshake (session 34).  It also paces an
 * address flooding the store (STORE_MAX_UNAUTH_ADDR a grace): with 1 s
 * tests/check_store's flood of 1100 took 21.5 s to connect (the backlog
 * full), and a rank queued behind a flood waits for the backlog to drain */
#ifndef STORE_UNAUTH_GRACE_MS
#define STORE_UNAUTH_GRACE_MS 200
#endif
#define STORE_LINGER_MS 3000          /* rank 0 serves peers still connected at its close */
#define STORE_TOKEN_MIN 16            /* characters */
#define STORE_TOKEN_MAX 1024
/* the server's record of the connections that failed AUTH (a wrong
 * token, none): "refused N connection(s), the last from ADDR:PORT: WHY" */
#define STORE_REFUSED_KEY "kiln/refused"
/* the server's record of the connections it closed before they presented
 * the token (none within kiln_store_auth_ms, or the oldest closed for a new one
 * beyond STORE_MAX_UNAUTH): "dropped N connection(s) that presented no
 * token, the last from ADDR:PORT: WHY" */
#define STORE_DROPPED_KEY "kiln/unauth_dropped"
/* the server's record of the claims it denied (a second process for a
 * rank): "refused N claim(s), the last: rank R by WHO (held by WHO)" */
#define STORE_CLAIMS_REFUSED_KEY "kiln/claims_refused"

/* One request as kiln_store_msg_parse finds it in a buffer: pointers into
 * that buffer (key is not NUL-terminated). */
struct kiln_store_msg {
	int op;
	const char *key;
	uint32_t klen;
	const unsigned char *val;
	uint32_t vlen;
};

/* Parse the request at buf[0..have): the bytes it takes (> 0) with *m
 * filled, 0 when more bytes are needed, -1 when it is malformed (an
 * unknown op, a key over STORE_MAX_KEY or a value over max_val bytes,
 * told as soon as the header shows it). */
long kiln_store_msg_parse(const void *buf, size_t have, uint32_t max_val,
			  struct kiln_store_msg *m);

/* kiln_store_open whose timeout_ms is that of setting ("[dist]
 * heartbeat"), which its timeouts name (kiln_store_open's: "[dist]
 * timeout").  side (NULL for rank's own connection): a side connection
 * of rank ("heartbeat", "probe"), which greets the store as no rank (-1)
 * and is named "rank R's heartbeat connection" in messages (before
 * session 36 the callers passed rank -1: "rank -1 of N"). */
struct kiln_store;
kiln_status kiln_store_open_for(const char *host, int port, int host_it, int rank, int world,
				int timeout_ms, const char *setting, const char *side,
				struct kiln_store **out);

/* Whether an allocation of this process failed in s's requests (an
 * answer it had no memory for: KILN_ENOMEM, the connection kept in step;
 * a second connection kiln_store_lost_rank could not make): sticky until
 * kiln_store_oom_clear, except that a connect whose retry made good an
 * answer it had no memory for (AUTH's, HELLO's) leaves it as it was, and
 * kiln_store_peek's reads never set it.  A failure then is this rank's
 * own, not the store's or a peer's, whatever a communicator that asked
 * the store made of its status (core/dist.c, kiln_dist_explain; session
 * 39). */
int kiln_store_oom(struct kiln_store *s);
/* Forget it: the failure it meant was recovered from (kiln_dist_open
 * succeeded; session 40: a later peer's failure was told as this rank's
 * own out of memory). */
void kiln_store_oom_clear(struct kiln_store *s);

/* A best-effort read: kiln_store_check, but an answer this process had
 * no memory for is not its failure (KILN_ENOMEM, *val NULL,
 * kiln_store_oom unchanged).  For what a caller does without (a host
 * name in a message, a failed peer's words); the host table's
 * store_check (version 8). */
kiln_status kiln_store_peek(struct kiln_store *s, const char *key, void **val, size_t *len);

/* kiln_store_set waiting at most timeout_ms for the store's answer (its
 * connection's timeout otherwise): a leaving rank's word to its peers,
 * which a store cut off must not hold for a whole [dist] timeout. */
kiln_status kiln_store_set_within(struct kiln_store *s, const char *key, const void *val,
				  size_t len, int timeout_ms);
/* kiln_store_check and kiln_store_add, likewise (close_mark_failed's
 * word to the peers, session 35). */
kiln_status kiln_store_check_within(struct kiln_store *s, const char *key, void **val, size_t *len,
				    int timeout_ms);
kiln_status kiln_store_add_within(struct kiln_store *s, const char *key, int64_t delta,
				  int64_t *out, int timeout_ms);

/* The store's shared secret, for every rank of a run: $KILN_STORE_TOKEN,
 * else the first line of the file $KILN_STORE_TOKEN_FILE (owned by this
 * user, no access for group or others).  KILN_EUSAGE saying how to set
 * one when neither is set or the token is shorter than STORE_TOKEN_MIN. */
kiln_status store_token(char *tok, size_t n);

/* mac = HMAC-SHA256(token, "kiln-store-auth-v1" nonce).  0 ok, -1 failed. */
int store_mac(const char *token, const unsigned char *nonce, unsigned char *mac);

/* Random bytes from OpenSSL's generator.  0 ok, -1 failed. */
int store_random(unsigned char *buf, size_t n);

/* How long (ms) the server takes to notice that a connection taken before
 * every rank joined went silent (its host went down, its link was cut:
 * no FIN, no RST): a quarter of the rendezvous timeout timeout_ms, between
 * 1 and 10 s.  It sets TCP keepalive (idle a third of it, probes a sixth
 * apart) and TCP_USER_TIMEOUT of it on such connections, so that a claim's
 * holder that vanished is released (the connection stayed open for ever,
 * session 32); once every rank joined both are cleared, and a silent rank
 * is the heartbeat's to name.  The client sets TCP_USER_TIMEOUT of it (of
 * its own timeout) at the rendezvous, and connects and claims again when
 * its connection breaks there (core/store.c, rendezvous_reconnect: a live
 * rank whose link blipped, session 33). */
int kiln_store_dead_after_ms(int timeout_ms);

/* How long (ms) the server waits for a new connection's token (the HMAC
 * of its greeting's nonce) before it closes it: a quarter of the
 * rendezvous timeout timeout_ms ([dist] timeout, rank 0's), between 1 and
 * 10 s.  A live client answers within milliseconds; one whose link broke
 * during the handshake connects again (core/store.c, store_connect), and
 * waits STORE_HANDSHAKE_TRY(its own kiln_store_auth_ms) for an answer
 * before it does, so the upper bound is what a broken handshake costs
 * before the retry (a fixed 10 s before session 35, under any timeout:
 * with [dist] timeout = 4 the store held a silent connection 10 s, and
 * a rank named a drop after 10 s that its 4 s rendezvous never saw). */
int kiln_store_auth_ms(int timeout_ms);
#define STORE_HANDSHAKE_TRY(auth_ms) ((auth_ms) + (auth_ms) / 2)

/* The server: a thread serving on host:port (the master address; port 0:
 * ephemeral, *bound says which) to clients that present token;
 * timeout_ms: the rendezvous' ([dist] timeout), which bounds
 * kiln_store_dead_after_ms. */
struct store_server;
kiln_status store_server_start(const char *host, int port, const char *token, int timeout_ms,
			       int *bound, struct store_server **out);
/* Stop serving: at once when no client is connected or no rank was lost;
 * after a loss, once the last client has closed or after STORE_LINGER_MS,
 * so that ranks that fail after rank 0 can still read which rank was lost
 * ("kiln/lost"). */
void store_server_stop(struct store_server *s);

#endif
