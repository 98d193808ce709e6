/* tests/check_store.c - the rendezvous store and the environment parser
 * (kiln/dist.h), on loopback with ephemeral ports:
 *
 * - set/get/check/add round trips; a get parks until another client sets
 *   the key; values carry embedded NULs;
 * - a get of a key nobody sets times out with KILN_ETIMEOUT in about the
 *   time asked, and the connection serves the next requests (session 36);
 * - a rendezvous of 3 where only 2 arrive times out naming the missing rank;
 * - a client that dies (no goodbye) is reported as the lost rank, one that
 *   closes cleanly is not;
 * - connecting where nothing listens times out naming host:port;
 * - connecting where SYNs are dropped (a full accept queue) ends within
 *   the timeout naming the address's error, and at once on a stop;
 * - rank/world/master from KILN_*, torchrun, Slurm and Open MPI variables,
 *   and clear errors for malformed ones;
 * - a client with a wrong token, none, a short one or a token file others
 *   can read is refused (rank 0's rendezvous timeout names the wrong
 *   token's connection), a raw client that skips the token is cut off;
 * - a process refused at the rendezvous ("rank 1 joined twice") that dies
 *   without a goodbye is not recorded as the real rank lost, nor is one
 *   that dies before its claim is decided, and neither writes rank 1's
 *   keys (session 32);
 * - a rank that dies while the others wait at the rendezvous gives its
 *   claim back: started again, it joins them (session 32);
 * - which restarted ranks wait for the failed run's store to close;
 * - a store of the protocol before session 32 (greeting KILNST1) is "not
 *   a kiln store (of this version)"; connections taken before every rank
 *   joined have TCP keepalive and TCP_USER_TIMEOUT, after it not; the
 *   count of refused claims is the server's, whatever a client set the
 *   key to (session 32's review);
 * - a refused claim names the store's figure for a silent holder's
 *   release, not the refused process's own; a rank whose connection
 *   broke on its side at the rendezvous connects and claims again, taking
 *   its claim over (session 33);
 * - a rank whose link fails during the token handshake connects again
 *   and gets in; a wrong token is refused at once, and a store that only
 *   closes (before session 34) is tried until the timeout, which names
 *   both causes; 1100 idle connections without the token neither lock a
 *   rank out nor blank rank 0's naming of the missing rank, and 300 ranks
 *   opening at once from one address are not closed as idle (session 34);
 * - a value over 8 MiB and sets beyond 32 MiB in all are refused;
 * - a store that never answers: calls end after the store's timeout;
 * - the request parser (kiln_store_msg_parse) on partial, complete and
 *   malformed input.
 */
#include <kiln/kiln.h>
#include <kiln/dist.h>
#include "../core/store.h"
#ifndef STORE_UNAUTH_GRACE_MS /* (core/store.h before its fix) */
#define STORE_UNAUTH_GRACE_MS 200
#endif
#include "../core/dist.h" /* kiln_dist_restart_wait_ms */
#ifndef STORE_CLAIMS_REFUSED_KEY /* (core/store.h before session 32) */
#define STORE_CLAIMS_REFUSED_KEY "kiln/claims_refused"
#endif

#include <check.h>
#include "check_main.h"
#include "test_util.h"
#include <arpa/inet.h>
#include <dlfcn.h> /* RTLD_NEXT (_GNU_SOURCE: build-config.h) */
#include <netdb.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(test_set_get_add)
{
	struct kiln_store *s0, *s1;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	ck_assert_int_gt(port, 0);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "a", "x\0y", 3), KILN_OK);
	void *v;
	size_t n;
	ck_assert_int_eq(kiln_store_get(s1, "a", 1000, &v, &n), KILN_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(memcmp(v, "x\0y", 3), 0);
	free(v);
	ck_assert_int_eq(kiln_store_check(s1, "nope", &v, &n), KILN_OK);
	ck_assert_ptr_null(v);
	int64_t c;
	ck_assert_int_eq(kiln_store_add(s0, "ctr", 5, &c), KILN_OK);
	ck_assert_int_eq(c, 5);
	ck_assert_int_eq(kiln_store_add(s1, "ctr", -2, &c), KILN_OK);
	ck_assert_int_eq(c, 3);
	/* a large value */
	size_t big = 3u << 20;
	char *b = malloc(big);
	for (size_t i = 0; i < big; i++)
		b[i] = (char)(i * 7);
	ck_assert_int_eq(kiln_store_set(s1, "big", b, big), KILN_OK);
	ck_assert_int_eq(kiln_store_get(s0, "big", 1000, &v, &n), KILN_OK);
	ck_assert_uint_eq(n, big);
	ck_assert_int_eq(memcmp(v, b, big), 0);
	free(v);
	free(b);
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

/* An add beyond int64 drops that client and leaves the counter as it was
 * (it was signed overflow in the server). */
START_TEST(test_add_overflow)
{
	struct kiln_store *s0, *s1;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", kiln_store_port(s0), 0, 1, 2, 5000, &s1),
			 KILN_OK);
	int64_t c;
	ck_assert_int_eq(kiln_store_add(s0, "ctr", INT64_MAX, &c), KILN_OK);
	ck_assert_int_eq(c, INT64_MAX);
	ck_assert_int_ne(kiln_store_add(s1, "ctr", 1, &c), KILN_OK);
	void *v;
	size_t n;
	ck_assert_int_eq(kiln_store_check(s0, "ctr", &v, &n), KILN_OK);
	ck_assert_str_eq(v, "9223372036854775807");
	free(v);
	ck_assert_int_eq(kiln_store_add(s0, "ctr", INT64_MIN, &c), KILN_OK);
	ck_assert_int_eq(c, -1);
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

struct later {
	int port;
	int delay_ms;
};

static void *set_later(void *arg)
{
	struct later *l = arg;
	struct kiln_store *s;
	if (kiln_store_open("127.0.0.1", l->port, 0, 1, 2, 5000, &s))
		return NULL;
	usleep((useconds_t)l->delay_ms * 1000);
	kiln_store_set(s, "late", "42", 2);
	kiln_store_close(s);
	return NULL;
}

START_TEST(test_get_waits)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	struct later l = { kiln_store_port(s0), 300 };
	pthread_t th;
	double t0 = now();
	pthread_create(&th, NULL, set_later, &l);
	void *v;
	size_t n;
	const char *keys[] = { "late" };
	ck_assert_int_eq(kiln_store_wait(s0, keys, 1, 5000), KILN_OK);
	ck_assert_int_eq(kiln_store_get(s0, "late", 5000, &v, &n), KILN_OK);
	ck_assert_double_ge(now() - t0, 0.25);
	ck_assert_str_eq(v, "42");
	free(v);
	pthread_join(th, NULL);
	/* a clean close is not a loss */
	ck_assert_int_eq(kiln_store_lost_rank(s0, 200), -1);
	/* polling gives up without breaking the connection, and names the
	 * first key that exists */
	const char *two[] = { "absent", "late" };
	int which = 7;
	ck_assert_int_eq(kiln_store_poll(s0, two, 1, 50, &which, &v), KILN_ETIMEOUT);
	ck_assert_int_eq(which, -1);
	ck_assert_ptr_null(v);
	ck_assert_int_eq(kiln_store_poll(s0, two, 2, 1000, &which, &v), KILN_OK);
	ck_assert_int_eq(which, 1);
	ck_assert_str_eq(v, "42");
	free(v);
	kiln_store_close(s0);
}
END_TEST

START_TEST(test_get_timeout)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 1, 5000, &s0), KILN_OK);
	void *v;
	double t0 = now();
	ck_assert_int_eq(kiln_store_get(s0, "never", 400, &v, NULL), KILN_ETIMEOUT);
	double dt = now() - t0;
	ck_assert_double_ge(dt, 0.35);
	ck_assert_double_le(dt, 3.0);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "'never' was not set within 0.4 s"));
	kiln_store_close(s0);
}
END_TEST

/* A get that timed out (a peer's key not set in time) leaves the
 * connection usable: the rank can still post its failure and leaving and
 * say goodbye, so the store records no loss; the key set afterwards is
 * read, the cancelled get's answer not taken for a later request's.
 * Before session 36 the timeout broke the connection: every later
 * request failed "the connection failed earlier" and its close, without
 * goodbye, was recorded as the rank lost. */
START_TEST(test_get_timeout_in_step)
{
	struct kiln_store *s0, *s1;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", kiln_store_port(s0), 0, 1, 2, 5000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "kiln/world", "2", 1), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "kiln/all_joined", "1", 1), KILN_OK);
	void *v;
	size_t n;
	int64_t left = 0;
	ck_assert_int_eq(kiln_store_get(s1, "never", 200, &v, NULL), KILN_ETIMEOUT);
	ck_assert_msg(kiln_store_add(s1, "kiln/left", 1, &left) == KILN_OK, "after a timed-out get: %s",
		      kiln_last_error());
	ck_assert_int_eq(left, 1);
	/* set now, then read: the value, not the cancelled get's answer */
	ck_assert_int_eq(kiln_store_set(s0, "never", "late", 4), KILN_OK);
	ck_assert_int_eq(kiln_store_get(s1, "never", 2000, &v, &n), KILN_OK);
	ck_assert_str_eq(v, "late");
	free(v);
	ck_assert_int_eq(kiln_store_get(s1, "absent", 100, &v, NULL), KILN_ETIMEOUT);
	ck_assert_int_eq(kiln_store_get(s1, "never", 2000, &v, &n), KILN_OK);
	ck_assert_uint_eq(n, 4);
	free(v);
	kiln_store_close(s1);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 300), KILN_STORE_NONE_LOST);
	kiln_store_close(s0);
}
END_TEST

static void *join_rank2(void *arg)
{
	struct kiln_store *s;
	int port = *(int *)arg;
	if (!kiln_store_open("127.0.0.1", port, 0, 2, 3, 5000, &s)) {
		/* still waiting when rank 0 (800 ms) asks who came: a rank
		 * that has left releases its claim and its kiln/joined/2 */
		kiln_store_rendezvous(s, 2, 3, 2500);
		kiln_store_close(s);
	}
	return NULL;
}

START_TEST(test_rendezvous_timeout)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	pthread_t th;
	pthread_create(&th, NULL, join_rank2, &port);
	double t0 = now();
	ck_assert_int_eq(kiln_store_rendezvous(s0, 0, 3, 800), KILN_ETIMEOUT);
	ck_assert_double_le(now() - t0, 5.0);
	const char *msg = kiln_last_error();
	ck_assert_msg(strstr(msg, "rendezvous timed out") && strstr(msg, "rank 1 never arrived"),
		      "message: %s", msg);
	pthread_join(th, NULL);
	kiln_store_close(s0);
}
END_TEST

START_TEST(test_rendezvous_ok)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	pid_t kids[2];
	for (int r = 1; r <= 2; r++) {
		if (!(kids[r - 1] = fork())) {
			struct kiln_store *s;
			if (kiln_store_open("127.0.0.1", port, 0, r, 3, 5000, &s) ||
			    kiln_store_rendezvous(s, r, 3, 5000))
				_exit(1);
			kiln_store_close(s);
			_exit(0);
		}
	}
	ck_assert_int_eq(kiln_store_rendezvous(s0, 0, 3, 5000), KILN_OK);
	for (int r = 0; r < 2; r++) {
		int ws;
		waitpid(kids[r], &ws, 0);
		ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
	}
	kiln_store_close(s0);
}
END_TEST

/* Rank 0 of `world` at the rendezvous, in a thread: its status and how
 * long it took. */
struct r0 {
	struct kiln_store *s;
	int world, timeout_ms;
	kiln_status st;
	double dt;
	char msg[512];
};

static void *rank0_rendezvous(void *arg)
{
	struct r0 *a = arg;
	double t0 = now();
	a->st = kiln_store_rendezvous(a->s, 0, a->world, a->timeout_ms);
	a->dt = now() - t0;
	snprintf(a->msg, sizeof a->msg, "%s", a->st ? kiln_last_error() : "");
	return NULL;
}

/* A rank twice, and another world size (session 29, multi-node runs on one
 * host): a second process claiming rank 1 after the rendezvous is refused
 * at once naming both processes (it went on with the finished run's keys:
 * hung in Gloo's connect or, when it died, failed the real rank 1);
 * a rank of world 2 joining rank 0's world 3 is refused at once naming
 * both sizes, and rank 0 hears of it then, not at its timeout (the join
 * counter reached 2 and the ranks waited out [dist] timeout for keys
 * named after neither). */
START_TEST(test_rendezvous_refusals)
{
	struct kiln_store *s0, *s1, *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	struct r0 a = { .s = s0, .world = 2, .timeout_ms = 5000 };
	pthread_t th;
	pthread_create(&th, NULL, rank0_rendezvous, &a);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s1, 1, 2, 5000), KILN_OK);
	pthread_join(th, NULL);
	ck_assert_msg(a.st == KILN_OK, "%s", a.msg);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s2), KILN_OK);
	double t0 = now();
	ck_assert_int_eq(kiln_store_rendezvous(s2, 1, 2, 5000), KILN_ECONFIG);
	ck_assert_double_le(now() - t0, 2.0);
	const char *msg = kiln_last_error();
	ck_assert_msg(strstr(msg, "rank 1 joined twice: this process (host ") &&
			      strstr(msg, ") and one before it (host ") &&
			      strstr(msg, "or a rank restarted while the previous run's store still answered, or its host went down before every rank joined (the store gives such a rank's claim back within about 1 s of its going: start it again after that)"),
		      "message: %s", msg);
	kiln_store_close(s2);
	/* the refused process dies without a goodbye (killed, or its exit
	 * path failed): the store must not record the real rank 1 lost, which
	 * failed the healthy run (session 31) */
	pid_t kid = fork();
	if (!kid) {
		struct kiln_store *s3;
		if (kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s3) ||
		    kiln_store_rendezvous(s3, 1, 2, 5000) != KILN_ECONFIG)
			_exit(1);
		_exit(0); /* no goodbye */
	}
	int ws;
	ck_assert_int_eq(waitpid(kid, &ws, 0), kid);
	ck_assert_int_eq(ws, 0);
	ck_assert_int_eq(kiln_store_lost_rank(s1, 300), KILN_STORE_NONE_LOST);
	kiln_store_close(s1);
	kiln_store_close(s0);

	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	port = kiln_store_port(s0);
	struct r0 b = { .s = s0, .world = 3, .timeout_ms = 8000 };
	pthread_create(&th, NULL, rank0_rendezvous, &b);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s1, 1, 2, 8000), KILN_ECONFIG);
	msg = kiln_last_error();
	ck_assert_msg(strstr(msg, "rank 1's world size is 2 but rank 0's is 3: start every node with the same --nnodes and -n"),
		      "message: %s", msg);
	pthread_join(th, NULL);
	ck_assert_int_eq(b.st, KILN_ECONFIG);
	ck_assert_msg(strstr(b.msg, "the rendezvous failed: rank 1's world size is 2 but rank 0's is 3"),
		      "rank 0: %s", b.msg);
	ck_assert_double_le(b.dt, 4.0);
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

/* Finding 1 of session 32: a process that has not won its claim of a
 * rank is not that rank.  A second rank 1 killed after its connection
 * said HELLO as rank 1 but before its claim was decided was recorded as
 * the real rank 1 lost ("kiln/lost"), and the healthy run failed; a
 * refused one writes none of rank 1's keys (its host name replaced the
 * real rank's, which the watchdog's and a loss's messages name). */
START_TEST(test_claim_before_win)
{
	struct kiln_store *s0, *s1;
	void *v = NULL;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct r0 a = { .s = s0, .world = 2, .timeout_ms = 5000 };
	pthread_t th;
	pthread_create(&th, NULL, rank0_rendezvous, &a);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s1, 1, 2, 5000), KILN_OK);
	pthread_join(th, NULL);
	ck_assert_msg(a.st == KILN_OK, "%s", a.msg);
	/* the real rank 1 on another host, as its peers know it */
	ck_assert_int_eq(kiln_store_set(s1, "kiln/host/1", "node-one", 8), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s1, "kiln/addr/1", "10.0.0.2", 9), KILN_OK);
	for (int refused = 0; refused < 2; refused++) {
		pid_t kid = fork();
		if (!kid) {
			struct kiln_store *s;
			if (kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s))
				_exit(1);
			/* killed before (0) or after (1) its claim was denied */
			if (refused && kiln_store_rendezvous(s, 1, 2, 5000) != KILN_ECONFIG)
				_exit(2);
			_exit(0); /* no goodbye */
		}
		int ws;
		ck_assert_int_eq(waitpid(kid, &ws, 0), kid);
		ck_assert_int_eq(ws, 0);
		ck_assert_msg(kiln_store_lost_rank(s1, 300) == KILN_STORE_NONE_LOST,
			      "a second rank 1 that died %s its claim was denied was taken for rank 1 lost",
			      refused ? "after" : "before");
	}
	ck_assert_int_eq(kiln_store_check(s1, "kiln/host/1", &v, NULL), KILN_OK);
	ck_assert_str_eq(v, "node-one");
	free(v);
	ck_assert_int_eq(kiln_store_check(s1, "kiln/addr/1", &v, NULL), KILN_OK);
	ck_assert_str_eq(v, "10.0.0.2");
	free(v);
	ck_assert_int_eq(kiln_store_check(s1, STORE_CLAIMS_REFUSED_KEY, &v, NULL), KILN_OK);
	ck_assert_msg(v && strstr(v, "refused 1 claim(s), the last: rank 1 by host "), "%s",
		      v ? (char *)v : "(none)");
	free(v);
	/* the count is the server's own (session 32's review): it parsed the
	 * key's text back past "refused ", and a client that set the key to
	 * one byte had the server read past that value; one that set "refused
	 * 41" had it count on from 41 */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(kiln_store_set(s1, STORE_CLAIMS_REFUSED_KEY, i ? "refused 41" : "x",
						i ? 10 : 1), KILN_OK);
		struct kiln_store *s;
		ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s), KILN_OK);
		ck_assert_int_eq(kiln_store_rendezvous(s, 1, 2, 5000), KILN_ECONFIG);
		kiln_store_close(s);
		ck_assert_int_eq(kiln_store_check(s1, STORE_CLAIMS_REFUSED_KEY, &v, NULL), KILN_OK);
		ck_assert_msg(v && !strncmp(v, i ? "refused 3 claim(s), the last: rank 1 by host "
						 : "refused 2 claim(s), the last: rank 1 by host ",
					    45),
			      "after the key was set to '%s': %s", i ? "refused 41" : "x",
			      v ? (char *)v : "(none)");
		free(v);
	}
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

/* Finding 2 of session 32: rank 1 of 3 dies while ranks 0 and 1 wait for
 * rank 2 at the rendezvous, and is started again: the claim its first
 * process held is released when that process's connection closes before
 * every rank joined, so the new rank 1 joins and the rendezvous completes
 * (before, the new process was "rank 1 joined twice" and every waiting
 * rank failed with it).  A rank lost after the rendezvous is still lost. */
static pid_t rank_child(int port, int rank, int world, int linger)
{
	pid_t kid = fork();
	if (!kid) {
		struct kiln_store *s;
		if (kiln_store_open("127.0.0.1", port, 0, rank, world, 5000, &s) ||
		    kiln_store_rendezvous(s, rank, world, 15000))
			_exit(1);
		if (linger)
			pause(); /* killed by the test: no goodbye */
		kiln_store_close(s);
		_exit(0);
	}
	return kid;
}

START_TEST(test_claim_released)
{
	struct kiln_store *s0;
	void *v = NULL;
	int ws;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct r0 a = { .s = s0, .world = 3, .timeout_ms = 15000 };
	pthread_t th;
	pthread_create(&th, NULL, rank0_rendezvous, &a);
	pid_t first = rank_child(port, 1, 3, 0);
	/* rank 1 has joined (posted who it is) and waits for rank 2 */
	ck_assert_int_eq(kiln_store_get(s0, "kiln/joined/1", 5000, &v, NULL), KILN_OK);
	free(v);
	kill(first, SIGKILL);
	ck_assert_int_eq(waitpid(first, &ws, 0), first);
	pid_t again = rank_child(port, 1, 3, 1);
	pid_t two = rank_child(port, 2, 3, 0);
	ck_assert_int_eq(waitpid(two, &ws, 0), two);
	ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank 2's rendezvous failed");
	pthread_join(th, NULL);
	ck_assert_msg(a.st == KILN_OK, "rank 0: %s", a.msg);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 100), KILN_STORE_NONE_LOST);
	/* every rank joined: the restarted rank 1's death is a loss */
	kill(again, SIGKILL);
	ck_assert_int_eq(waitpid(again, &ws, 0), again);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 3000), 1);
	kiln_store_close(s0);
}
END_TEST

/* Rank 3 of 4 joins s0's store on port (a rendezvous that rank 0's
 * keys say is complete), says it is ready, and is killed (no goodbye):
 * the store records it lost. */
static void kill_rank3(struct kiln_store *s0, int port)
{
	ck_assert_int_eq(kiln_store_set(s0, "kiln/world", "4", 2), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "kiln/all_joined", "1", 1), KILN_OK);
	pid_t kid = fork();
	if (!kid) {
		struct kiln_store *s;
		if (kiln_store_open("127.0.0.1", port, 0, 3, 4, 5000, &s) ||
		    kiln_store_rendezvous(s, 3, 4, 5000))
			_exit(1);
		kiln_store_set(s, "ready", "1", 1);
		pause(); /* killed below: no goodbye */
		_exit(0);
	}
	void *v;
	ck_assert_int_eq(kiln_store_get(s0, "ready", 5000, &v, NULL), KILN_OK);
	free(v);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
}

START_TEST(test_lost_rank)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 4, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	kill_rank3(s0, port);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 3000), 3);
	kiln_store_close(s0);
}
END_TEST

/* Rank 0 failing first closes its store while a survivor is still
 * connected: the server keeps serving it (STORE_LINGER_MS), so the
 * survivor names the rank that died (3), not rank 0 ("the store is gone");
 * and it stops as soon as the survivor leaves. */
static void *close_host(void *arg)
{
	kiln_store_close(arg);
	return NULL;
}

START_TEST(test_lost_after_host)
{
	struct kiln_store *s0, *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 4, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 2, 4, 5000, &s2), KILN_OK);
	kill_rank3(s0, port);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 3000), 3);
	pthread_t t;
	const double t0 = now();
	ck_assert_int_eq(pthread_create(&t, NULL, close_host, s0), 0);
	usleep(300 * 1000); /* rank 0 has said goodbye and is stopping */
	ck_assert_int_eq(kiln_store_lost_rank(s2, 3000), 3);
	kiln_store_close(s2);
	pthread_join(t, NULL);
	ck_assert_msg(now() - t0 < STORE_LINGER_MS / 1000.0, "the host lingered %.2f s after its last client left",
		      now() - t0);
}
END_TEST

/* With no rank lost, rank 0's store stops at once though a peer is still
 * connected (a stopped rank, say): nothing to tell it. */
START_TEST(test_host_close_no_loss)
{
	struct kiln_store *s0, *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", kiln_store_port(s0), 0, 1, 2, 5000, &s2), KILN_OK);
	const double t0 = now();
	kiln_store_close(s0);
	ck_assert_msg(now() - t0 < STORE_LINGER_MS / 2000.0, "the host lingered %.2f s with no rank lost",
		      now() - t0);
	kiln_store_close(s2);
}
END_TEST

START_TEST(test_nobody_listens)
{
	struct kiln_store *s0, *s;
	/* a port that was just free */
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 1, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	kiln_store_close(s0);
	double t0 = now();
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 500, &s), KILN_ETIMEOUT);
	ck_assert_double_le(now() - t0, 3.0);
	char want[64];
	snprintf(want, sizeof want, "127.0.0.1:%d", port);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), want));
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "rank 1 of 2"));
}
END_TEST

static void clear_env(void)
{
	static const char *const vars[] = {
		"KILN_RANK", "KILN_WORLD_SIZE", "KILN_LOCAL_RANK", "KILN_LOCAL_WORLD_SIZE",
		"KILN_MASTER_ADDR", "KILN_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
		"LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
		"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_RANK",
		"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"
	};
	for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
		unsetenv(vars[i]);
}

START_TEST(test_env)
{
	struct kiln_dist_env e;
	clear_env();
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_int_eq(e.world, 1);
	ck_assert_str_eq(e.source, "none");
	ck_assert_str_eq(e.master_addr, "127.0.0.1");
	ck_assert_int_eq(e.master_port, 29500);

	setenv("RANK", "3", 1);
	setenv("WORLD_SIZE", "8", 1);
	setenv("LOCAL_RANK", "1", 1);
	setenv("MASTER_ADDR", "node7", 1);
	setenv("MASTER_PORT", "1234", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_int_eq(e.rank, 3);
	ck_assert_int_eq(e.world, 8);
	ck_assert_int_eq(e.local_rank, 1);
	ck_assert_str_eq(e.master_addr, "node7");
	ck_assert_int_eq(e.master_port, 1234);

	/* KILN_* wins */
	setenv("KILN_RANK", "0", 1);
	setenv("KILN_WORLD_SIZE", "2", 1);
	setenv("KILN_MASTER_PORT", "999", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_str_eq(e.source, "KILN_*");
	ck_assert_int_eq(e.world, 2);
	ck_assert_int_eq(e.master_port, 999);

	clear_env();
	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "6", 1);
	setenv("SLURM_LOCALID", "1", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_str_eq(e.source, "Slurm");
	ck_assert_int_eq(e.rank, 5);
	ck_assert_int_eq(e.local_rank, 1);

	clear_env();
	setenv("OMPI_COMM_WORLD_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_str_eq(e.source, "Open MPI");
	ck_assert_int_eq(e.rank, 1);

	clear_env();
	setenv("KILN_RANK", "2", 1);
	setenv("KILN_WORLD_SIZE", "2", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "KILN_RANK=2 with KILN_WORLD_SIZE=2"));
	setenv("KILN_RANK", "x", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "KILN_RANK='x'"));
	/* a local rank beyond the node's ranks (before session 30: taken) */
	clear_env();
	setenv("RANK", "3", 1);
	setenv("WORLD_SIZE", "4", 1);
	setenv("LOCAL_RANK", "2", 1);
	setenv("LOCAL_WORLD_SIZE", "2", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_msg(strstr(kiln_last_error(), "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2: the local rank must be below the local world size"),
		      "%s", kiln_last_error());
	setenv("LOCAL_WORLD_SIZE", "0", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	unsetenv("LOCAL_WORLD_SIZE");
	setenv("LOCAL_RANK", "4", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_msg(strstr(kiln_last_error(), "LOCAL_RANK=4 with LOCAL_WORLD_SIZE unset (taken as WORLD_SIZE=4)"),
		      "%s", kiln_last_error());
	setenv("LOCAL_RANK", "1", 1);
	setenv("LOCAL_WORLD_SIZE", "2", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_int_eq(e.local_world, 2);
	clear_env();
	setenv("RANK", "0", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "WORLD_SIZE is not"));
	clear_env();
	setenv("MASTER_PORT", "70000", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "MASTER_PORT='70000'"));
}
END_TEST

/* kiln_dist_open's wait before a restarted rank connects (core/dist.c
 * restart_wait): a rank other than 0 that kiln launch --max-restarts
 * started again (KILN_RESTART > 0) waits past the failed run's store's
 * linger (else, restarted at once by its own launcher, it joined that
 * store, whose keys said the rendezvous was done, and hung in Gloo's
 * connect: 6 of 10 two-node restarts, /work/scratch/s29/rr); rank 0,
 * which hosts the new store, and a first start do not wait.  The
 * two-node restart itself is a race of 30-60 s a try, not a test. */
START_TEST(test_restart_wait)
{
	struct kiln_dist_env e;
	clear_env();
	unsetenv("KILN_RESTART");
	setenv("KILN_RANK", "1", 1);
	setenv("KILN_WORLD_SIZE", "2", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_int_eq(kiln_dist_restart_wait_ms(&e), 0); /* a first start */
	setenv("KILN_RESTART", "0", 1);
	ck_assert_int_eq(kiln_dist_restart_wait_ms(&e), 0);
	setenv("KILN_RESTART", "2", 1);
	ck_assert_int_eq(kiln_dist_restart_wait_ms(&e), STORE_LINGER_MS + 1000);
	ck_assert_int_gt(kiln_dist_restart_wait_ms(&e), STORE_LINGER_MS);
	setenv("KILN_RANK", "0", 1);
	ck_assert_int_eq(kiln_dist_env_read(&e), KILN_OK);
	ck_assert_int_eq(kiln_dist_restart_wait_ms(&e), 0); /* rank 0 hosts the new store */
	unsetenv("KILN_RESTART");
	clear_env();
}
END_TEST

/* ---- the token, the limits, the timeout, the parser ------------------- */

#define TOKEN_A "kiln-tests-0123456789abcdef"

/* A raw TCP connection to 127.0.0.1:port. */
static int raw_connect(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	return fd;
}

/* Read n bytes (0) or see the connection close first (-1). */
static int raw_read(int fd, void *buf, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t k = read(fd, (char *)buf + got, n - got);
		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

/* A TCP listener on a free port of 127.0.0.1 (*port), its accept queue
 * `backlog` long. */
static int loopback_listener(int backlog, int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
	ck_assert_int_eq(listen(lfd, backlog), 0);
	ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
	*port = ntohs(a.sin_port);
	return lfd;
}

START_TEST(test_token_refused)
{
	struct kiln_store *s0, *s1;
	setenv("KILN_STORE_TOKEN", TOKEN_A, 1);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	int port = kiln_store_port(s0);
	/* a wrong token */
	setenv("KILN_STORE_TOKEN", "kiln-tests-a-wrong-token", 1);
	double t0 = now();
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_EIO);
	ck_assert_msg(strstr(kiln_last_error(), "refused this process's token: every rank needs the same KILN_STORE_TOKEN"), "%s",
		      kiln_last_error());
	/* at once: the store says so (session 34), not a close the client
	 * would take for a broken link and try again until its timeout */
	ck_assert_msg(now() - t0 < 4, "a wrong token took %.1f s to be refused", now() - t0);
	/* ... which rank 0 names at its rendezvous' timeout: the refused
	 * connection, its address and why (before session 30 only "rank 1
	 * never arrived") */
	setenv("KILN_STORE_TOKEN", TOKEN_A, 1);
	ck_assert_int_eq(kiln_store_rendezvous(s0, 0, 2, 800), KILN_ETIMEOUT);
	const char *msg = kiln_last_error();
	ck_assert_msg(strstr(msg, "rank 1 never arrived") &&
			      strstr(msg, "; the store refused 1 connection(s), the last from 127.0.0.1:") &&
			      strstr(msg, ": a wrong token (every rank needs the same KILN_STORE_TOKEN)"),
		      "message: %s", msg);
	/* none, a short one */
	unsetenv("KILN_STORE_TOKEN");
	unsetenv("KILN_STORE_TOKEN_FILE");
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "KILN_STORE_TOKEN"));
	setenv("KILN_STORE_TOKEN", "short", 1);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_EUSAGE);
	unsetenv("KILN_STORE_TOKEN");
	/* a token file others may read is refused; mode 600 is taken */
	char path[1024];
	int fd = test_tmpfile_make(path, sizeof path, "token");
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, TOKEN_A "\n", sizeof TOKEN_A), (ssize_t)sizeof TOKEN_A);
	close(fd);
	setenv("KILN_STORE_TOKEN_FILE", path, 1);
	chmod(path, 0644);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_EUSAGE);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "only you can read"));
	chmod(path, 0600);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	kiln_store_close(s1);
	unlink(path);
	unsetenv("KILN_STORE_TOKEN_FILE");
	setenv("KILN_STORE_TOKEN", TOKEN_A, 1);
	/* a raw client that skips the token: closed at its first request,
	 * its set not done */
	fd = raw_connect(port);
	unsigned char g[40], req[] = { 2, 1, 0, 0, 0, 'k', 1, 0, 0, 0, 'v' }, r[5];
	ck_assert_int_eq(raw_read(fd, g, sizeof g), 0);
	ck_assert_int_eq(memcmp(g, "KILNST2\n", 8), 0); /* (the protocol of session 32) */
	ck_assert_int_eq(write(fd, req, sizeof req), (ssize_t)sizeof req);
	ck_assert_int_eq(raw_read(fd, r, sizeof r), -1);
	close(fd);
	void *v;
	ck_assert_int_eq(kiln_store_check(s0, "k", &v, NULL), KILN_OK);
	ck_assert_ptr_null(v);
	ck_assert_int_eq(kiln_store_lost_rank(s0, 100), -1);
	kiln_store_close(s0);
}
END_TEST

START_TEST(test_limits)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 1, 5000, &s0), KILN_OK);
	size_t big = 7u << 20;
	char *b = calloc(1, (64u << 20) + 1);
	ck_assert_ptr_nonnull(b);
	/* a value over 8 MiB is refused before it is sent */
	ck_assert_int_eq(kiln_store_set(s0, "huge", b, 64u << 20), KILN_EINVAL);
	/* 32 MiB in all: the fifth 7 MiB value is refused, the store goes on */
	char key[16];
	for (int i = 0; i < 5; i++) {
		snprintf(key, sizeof key, "v%d", i);
		ck_assert_int_eq(kiln_store_set(s0, key, b, big), i < 4 ? KILN_OK : KILN_EIO);
	}
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "limits"));
	/* replacing a value by a smaller one is allowed */
	ck_assert_int_eq(kiln_store_set(s0, "v0", "x", 1), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "v4", b, big), KILN_OK);
	free(b);
	kiln_store_close(s0);
}
END_TEST

/* A store that greets (with mute_magic), takes the token and HELLO, then
 * never answers. */
static const char *mute_magic = STORE_MAGIC;
static void *mute_store(void *arg)
{
	int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
	unsigned char g[40] = { 0 }, buf[256], ok[5] = { 0 };
	memcpy(g, mute_magic, 8);
	if (fd < 0)
		return NULL;
	/* AUTH is 9 + 32 bytes, HELLO 9 + 8 */
	if (write(fd, g, sizeof g) != sizeof g || raw_read(fd, buf, 41) || write(fd, ok, 5) != 5 ||
	    raw_read(fd, buf, 17) || write(fd, ok, 5) != 5)
		return NULL;
	while (read(fd, buf, sizeof buf) > 0)
		;
	close(fd);
	return NULL;
}

START_TEST(test_timeout_honoured)
{
	/* [dist] timeout = 2 s: a set, a check and an add the store never
	 * answers end with KILN_ETIMEOUT naming 2000 ms (they waited 60 s),
	 * after 2 s.  Each op asserted whole: the message's exact text (not a
	 * substring of it, which a wrong figure around it could still hold)
	 * and the time it took (a message naming the timeout after a wait of
	 * another length passed before session 48).  The bound, 10 s, leaves
	 * a loaded CI 8 s (a 1.5 s bound elsewhere saw 6.74 s at load 12)
	 * and stays below what a deadline at 6x the timeout waits (12 s), so
	 * that one fails too; 2 s an op, 6 s in all. */
	const char *const ops[] = { "set", "check", "add" };
	int port, lfd = loopback_listener(4, &port);
	for (int i = 0; i < 3; i++) {
		pthread_t th;
		pthread_create(&th, NULL, mute_store, &lfd);
		struct kiln_store *s;
		ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 2000, &s), KILN_OK);
		void *v = NULL;
		size_t n = 0;
		int64_t sum = 0;
		const double t0 = now();
		const kiln_status st = i == 0 ? kiln_store_set(s, "k", "v", 1)
				     : i == 1 ? kiln_store_check(s, "k", &v, &n)
					      : kiln_store_add(s, "k", 1, &sum);
		const double dt = now() - t0;
		ck_assert_msg(st == KILN_ETIMEOUT, "%s: status %d: %s", ops[i], st, kiln_last_error());
		char want[160];
		snprintf(want, sizeof want, "store 127.0.0.1:%d: no answer for 'k' within 2000 ms ([dist] timeout)", port);
		ck_assert_msg(!strcmp(kiln_last_error(), want), "%s: \"%s\", expected \"%s\"", ops[i],
			      kiln_last_error(), want);
		/* the deadline's 2 s (poll may wake a tick early), not 12 or 60 */
		ck_assert_msg(dt > 1.99 && dt < 10.0, "%s: KILN_ETIMEOUT after %.3f s, expected 2 s", ops[i], dt);
		ck_assert_ptr_null(v);
		kiln_store_close(s);
		pthread_join(th, NULL);
	}
	close(lfd);
}
END_TEST

/* Session 32 changed the protocol (CLAIM, JOIN: the server decides who is
 * rank r) but kept the greeting "KILNST1": a new rank at an old store got
 * as far as its claim and failed "connection lost ... may have died; or it
 * refused this client's token", an old rank at a new store was never
 * recorded lost.  The greeting is "KILNST2" now: a store of the old
 * protocol is "not a kiln store (of this version)" at once. */
START_TEST(test_old_protocol)
{
	int port, lfd = loopback_listener(4, &port);
	mute_magic = "KILNST1\n";
	pthread_t th;
	pthread_create(&th, NULL, mute_store, &lfd);
	struct kiln_store *s = NULL;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 2000, &s), KILN_EIO);
	char want[160];
	snprintf(want, sizeof want, "store 127.0.0.1:%d: what answers there is not a kiln store (of this version)",
		 port);
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());
	pthread_join(th, NULL);
	close(lfd);
	mute_magic = STORE_MAGIC;
}
END_TEST

/* The server's socket for the client socket fd (same process: the server
 * is a thread of it): the descriptor whose peer is fd's local address. */
static int server_side(int fd)
{
	struct sockaddr_in me, peer;
	socklen_t l = sizeof me;
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&me, &l), 0);
	for (int i = 0; i < 4096; i++) {
		l = sizeof peer;
		if (i != fd && !getpeername(i, (struct sockaddr *)&peer, &l) &&
		    peer.sin_family == AF_INET && peer.sin_port == me.sin_port)
			return i;
	}
	return -1;
}

static int sockopt(int fd, int level, int name)
{
	int v = -1;
	socklen_t l = sizeof v;
	ck_assert_int_eq(getsockopt(fd, level, name, &v, &l), 0);
	return v;
}

/* Finding 2 of session 32's review: a claim's holder whose host went down
 * or whose link was cut before every rank joined closes nothing, and the
 * server, which only answers, never wrote to it: the connection and the
 * claim stayed for ever, a restarted rank was refused and the others
 * waited out [dist] timeout.  Connections taken before kiln/all_joined
 * have TCP keepalive and TCP_USER_TIMEOUT within kiln_store_dead_after_ms of
 * the rendezvous timeout (a quarter, 1 to 10 s); at kiln/all_joined both
 * go off (a silent rank is the heartbeat's then), also for later
 * connections.  (The cut itself: tests/store_netns.sh, as root.) */
START_TEST(test_keepalive)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_dead_after_ms(300000), 10000);
	ck_assert_int_eq(kiln_store_dead_after_ms(20000), 5000);
	ck_assert_int_eq(kiln_store_dead_after_ms(2000), 1000);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 20000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	unsigned char g[40];
	int fd = raw_connect(port);
	ck_assert_int_eq(raw_read(fd, g, sizeof g), 0); /* taken: greeted */
	int sfd = server_side(fd);
	ck_assert_int_ge(sfd, 0);
	ck_assert_int_eq(sockopt(sfd, SOL_SOCKET, SO_KEEPALIVE), 1);
	ck_assert_int_eq(sockopt(sfd, IPPROTO_TCP, TCP_KEEPIDLE), 1);
	ck_assert_int_eq(sockopt(sfd, IPPROTO_TCP, TCP_KEEPINTVL), 1);
	ck_assert_int_eq(sockopt(sfd, IPPROTO_TCP, TCP_KEEPCNT), 3);
	ck_assert_int_eq(sockopt(sfd, IPPROTO_TCP, TCP_USER_TIMEOUT), 5000);
	/* every rank joined: off, for this connection and a later one */
	ck_assert_int_eq(kiln_store_set(s0, "kiln/all_joined", "1", 1), KILN_OK);
	ck_assert_int_eq(sockopt(sfd, SOL_SOCKET, SO_KEEPALIVE), 0);
	ck_assert_int_eq(sockopt(sfd, IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
	int fd2 = raw_connect(port);
	ck_assert_int_eq(raw_read(fd2, g, sizeof g), 0);
	sfd = server_side(fd2);
	ck_assert_int_ge(sfd, 0);
	ck_assert_int_eq(sockopt(sfd, SOL_SOCKET, SO_KEEPALIVE), 0);
	close(fd2);
	close(fd);
	kiln_store_close(s0);
}
END_TEST

/* The store's host itself gone or stopped (session 15): a rank asking
 * which rank was lost hears KILN_STORE_GONE or KILN_STORE_SILENT, not
 * rank 0 as if the store had seen rank 0 die (before: 0); after a request
 * broke its connection (a get that timed out) the question goes over a
 * fresh one, so a store still serving is not taken for gone. */
static pid_t host_store(int *port)
{
	int p[2];
	ck_assert_int_eq(pipe(p), 0);
	pid_t kid = fork();
	if (!kid) {
		struct kiln_store *s;
		close(p[0]);
		if (kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s))
			_exit(1);
		int bound = kiln_store_port(s);
		if (write(p[1], &bound, sizeof bound) != (ssize_t)sizeof bound)
			_exit(1);
		pause(); /* killed or stopped by the test */
		_exit(0);
	}
	close(p[1]);
	ck_assert_int_eq(read(p[0], port, sizeof *port), (ssize_t)sizeof *port);
	close(p[0]);
	return kid;
}

START_TEST(test_store_gone)
{
	int port;
	struct kiln_store *s1;
	pid_t kid = host_store(&port);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	/* a get that times out breaks the stream: still the store answers */
	void *v;
	ck_assert_int_eq(kiln_store_get(s1, "never", 100, &v, NULL), KILN_ETIMEOUT);
	ck_assert_int_eq(kiln_store_lost_rank(s1, 100), KILN_STORE_NONE_LOST);
	/* stopped: silent, within about LOST_ASK_MS (2 s), not the store's 5 s */
	kill(kid, SIGSTOP);
	double t0 = now();
	ck_assert_int_eq(kiln_store_lost_rank(s1, 100), KILN_STORE_SILENT);
	ck_assert_msg(now() - t0 < 4.5, "asking a stopped store took %.1f s", now() - t0);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	ck_assert_int_eq(kiln_store_lost_rank(s1, 100), KILN_STORE_GONE);
	kiln_store_close(s1);
	/* killed with the connection intact: gone */
	kid = host_store(&port);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 5000, &s1), KILN_OK);
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	ck_assert_int_eq(kiln_store_lost_rank(s1, 3000), KILN_STORE_GONE);
	kiln_store_close(s1);
}
END_TEST

START_TEST(test_parse)
{
	struct kiln_store_msg m;
	unsigned char req[] = { 2, 1, 0, 0, 0, 'k', 2, 0, 0, 0, 'v', 'w' };
	for (size_t n = 0; n < sizeof req; n++)
		ck_assert_int_eq(kiln_store_msg_parse(req, n, 100, &m), 0);
	ck_assert_int_eq(kiln_store_msg_parse(req, sizeof req, 100, &m), (long)sizeof req);
	ck_assert_int_eq(m.op, 2);
	ck_assert_uint_eq(m.klen, 1);
	ck_assert_uint_eq(m.vlen, 2);
	ck_assert_int_eq(memcmp(m.val, "vw", 2), 0);
	/* a value over the limit is told from the header alone */
	ck_assert_int_eq(kiln_store_msg_parse(req, 10, 1, &m), -1);
	req[0] = 99;
	ck_assert_int_eq(kiln_store_msg_parse(req, 1, 100, &m), -1);
	unsigned char longkey[] = { 3, 0xff, 0xff, 0, 0 };
	ck_assert_int_eq(kiln_store_msg_parse(longkey, sizeof longkey, 100, &m), -1);
}
END_TEST

/* The store out of descriptors (session 30): its accept fails with
 * EMFILE, which it said nowhere; the rank waiting for its greeting timed
 * out naming [dist] timeout even for the heartbeat's connection.  Now the
 * store logs the cause with the limit once and serves the connection when
 * descriptors are back; a greeting that does not come names the setting
 * whose time ran out. */
static pthread_mutex_t emfile_lock = PTHREAD_MUTEX_INITIALIZER;
static char emfile_log[4096];

static void emfile_capture(void *user, int level, const char *who, const char *msg)
{
	(void)user;
	pthread_mutex_lock(&emfile_lock);
	if (level <= KILN_LOG_WARN)
		snprintf(emfile_log + strlen(emfile_log), sizeof emfile_log - strlen(emfile_log),
			 "[%s] %s\n", who, msg);
	pthread_mutex_unlock(&emfile_lock);
}

START_TEST(test_accept_emfile)
{
	struct kiln_store *s0;
	kiln_log_set_sink(emfile_capture, NULL);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 5000, &s0), KILN_OK);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)kiln_store_port(s0)) };
	/* the lowest free descriptor is the last one allowed: the store's
	 * accept finds none */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct rlimit old, rl;
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
	rl = old;
	rl.rlim_cur = (rlim_t)fd + 1;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	char want[128];
	snprintf(want, sizeof want, "[dist] the rendezvous store cannot take a connection: %s (ulimit -n %d)",
		 strerror(EMFILE), fd + 1);
	int seen = 0;
	for (int i = 0; i < 300 && !seen; i++) {
		usleep(10000);
		pthread_mutex_lock(&emfile_lock);
		seen = strstr(emfile_log, want) != NULL;
		pthread_mutex_unlock(&emfile_lock);
	}
	ck_assert_msg(seen, "'%s' not logged: '%s'", want, emfile_log);
	/* descriptors back: the queued connection gets its greeting */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
	unsigned char g[8];
	struct timeval tv = { .tv_sec = 5 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	ck_assert_int_eq(read(fd, g, sizeof g), (ssize_t)sizeof g);
	ck_assert_int_eq(memcmp(g, STORE_MAGIC, 8), 0);
	close(fd);
	kiln_store_close(s0);
	kiln_log_set_sink(NULL, NULL);
	pthread_mutex_lock(&emfile_lock);
	ck_assert_ptr_eq(strstr(strstr(emfile_log, want) + strlen(want), "cannot take"), NULL); /* said once */
	pthread_mutex_unlock(&emfile_lock);

	/* a listener that never accepts: the heartbeat's connection names
	 * [dist] heartbeat */
	int lport, lfd = loopback_listener(4, &lport);
	struct kiln_store *s;
	ck_assert_int_eq(kiln_store_open_for("127.0.0.1", lport, 0, 1, 2, 300,
					     "[dist] heartbeat", "heartbeat", &s), KILN_ETIMEOUT);
	ck_assert_msg(strstr(kiln_last_error(), "no answer for '(greeting)' within 300 ms ([dist] heartbeat): the store did not take the connection"),
		      "%s", kiln_last_error());
	close(lfd);
	/* nothing there: named as rank 1's heartbeat connection, within its
	 * limit (before session 36 "rank -1 of 2"; its warning while the
	 * handshake breaks says "until [dist] heartbeat", not [dist] timeout) */
	ck_assert_int_eq(kiln_store_open_for("127.0.0.1", lport, 0, 1, 2, 300,
					     "[dist] heartbeat", "heartbeat", &s), KILN_ETIMEOUT);
	ck_assert_msg(strstr(kiln_last_error(), "rank 1's heartbeat connection: cannot reach the rendezvous store at 127.0.0.1:") &&
		      strstr(kiln_last_error(), " within 0.3 s ("),
		      "%s", kiln_last_error());
}
END_TEST

/* A master address that drops SYNs (a host behind a router that is down, a
 * firewall's DROP rule; session 31, network namespaces): connect() waited
 * out the kernel's SYN retries, ~130 s, whatever [dist] timeout said, and
 * a stop did not end it.  On loopback a listener whose accept queue is
 * full drops SYNs the same way (Linux).  Now the open ends within its
 * timeout naming the address and its error, and a stop ends it at once. */
static int full_listener(int *port, int *filler)
{
	int lfd = loopback_listener(0, port); /* a queue of one */
	*filler = raw_connect(*port); /* never accepted: later SYNs are dropped */
	return lfd;
}

static void *stop_later(void *arg)
{
	(void)arg;
	usleep(300 * 1000);
	kiln_train_request_stop();
	return NULL;
}

START_TEST(test_connect_dropped)
{
	int port, filler, lfd = full_listener(&port, &filler);
	struct kiln_store *s;
	double t0 = now();
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 1500, &s), KILN_ETIMEOUT);
	const double dt = now() - t0;
	ck_assert_msg(dt >= 1.4 && dt <= 2.5, "the open took %.2f s (timeout 1.5 s)", dt);
	char want[160];
	snprintf(want, sizeof want, "cannot reach the rendezvous store at 127.0.0.1:%d within 1.5 s (127.0.0.1:%d: %s)",
		 port, port, strerror(ETIMEDOUT));
	ck_assert_msg(strstr(kiln_last_error(), want), "%s", kiln_last_error());

	/* a stop (SIGTERM: kiln launch stopping the ranks) ends the wait */
	pthread_t th;
	pthread_create(&th, NULL, stop_later, NULL);
	t0 = now();
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 20000, &s), KILN_EIO);
	ck_assert_double_le(now() - t0, 1.0);
	ck_assert_msg(strstr(kiln_last_error(), "rank 1 of 2: a stop was requested (a signal) while connecting to the rendezvous store"),
		      "%s", kiln_last_error());
	pthread_join(th, NULL);
	close(filler);
	close(lfd);
}
END_TEST

/* Finding 2 of session 33: a refused claim's "gives such a rank's claim
 * back within about N s" is the store's figure (rank 0's [dist] timeout:
 * 40 s, 10 s), sent with the refusal, not the refused process's own
 * (4 s, 1 s), which it computed before. */
START_TEST(test_refusal_store_figure)
{
	struct kiln_store *s0, *s1, *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 40000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct r0 a = { .s = s0, .world = 2, .timeout_ms = 40000 };
	pthread_t th;
	pthread_create(&th, NULL, rank0_rendezvous, &a);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 4000, &s1), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s1, 1, 2, 4000), KILN_OK);
	pthread_join(th, NULL);
	ck_assert_msg(a.st == KILN_OK, "%s", a.msg);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 4000, &s2), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s2, 1, 2, 4000), KILN_ECONFIG);
	const char *msg = kiln_last_error();
	ck_assert_msg(strstr(msg, "(the store gives such a rank's claim back within about 10 s of its going: start it again after that)"),
		      "message: %s", msg);
	kiln_store_close(s2);
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

/* A relay between the ranks and the store: cutting it closes the ranks'
 * sockets only, the store's side stays open, so the store still holds a
 * rank whose connection broke on the rank's side (a link blip the rank's
 * TCP noticed first). */
/* cut: close the rank's side of every connection so far; mute: drop what
 * the store sends on the connections so far (mute_n); hup: then end the
 * rank's reading of them (SHUT_WR), its sending left open, as a link that
 * failed one way: the rank's close of them reaches the store. */
/* cut_auth: the rank's side of the first cut_auth connections is closed
 * at the rank's first bytes (its token's answer), as a link that failed
 * during the token handshake. */
struct relay {
	int lfd, port, to, cut, stop, n, mute_n, hup, cut_auth;
	int fd[8][2]; /* [rank side, store side], -1 closed */
	pthread_mutex_t mu;
};

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	char buf[65536];
	for (;;) {
		struct pollfd pf[17];
		pthread_mutex_lock(&r->mu);
		if (r->stop) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		for (int i = 0; r->cut && i < r->n; i++)
			if (r->fd[i][0] >= 0) {
				close(r->fd[i][0]);
				r->fd[i][0] = -1;
			}
		r->cut = 0;
		for (int i = 0; r->hup && i < r->mute_n; i++)
			if (r->fd[i][0] >= 0)
				shutdown(r->fd[i][0], SHUT_WR);
		r->hup = 0;
		pf[0] = (struct pollfd){ .fd = r->lfd, .events = POLLIN };
		for (int i = 0; i < r->n; i++)
			for (int j = 0; j < 2; j++)
				pf[1 + 2 * i + j] = (struct pollfd){ .fd = r->fd[i][j], .events = POLLIN };
		const int n = 1 + 2 * r->n;
		pthread_mutex_unlock(&r->mu);
		if (poll(pf, (nfds_t)n, 20) <= 0)
			continue;
		pthread_mutex_lock(&r->mu);
		for (int i = 0; i < r->n; i++)
			for (int j = 0; j < 2; j++) {
				if (r->fd[i][j] < 0 || !(pf[1 + 2 * i + j].revents & (POLLIN | POLLHUP | POLLERR)))
					continue;
				ssize_t k = read(r->fd[i][j], buf, sizeof buf);
				if (k > 0 && j == 1 && i < r->mute_n)
					continue; /* (muted: dropped) */
				if (k > 0 && j == 0 && i < r->cut_auth) {
					close(r->fd[i][0]); /* (the store's side stays) */
					r->fd[i][0] = -1;
					continue;
				}
				if (k > 0 && r->fd[i][!j] >= 0 && write(r->fd[i][!j], buf, (size_t)k) == k)
					continue;
				if (k > 0)
					continue; /* (to a cut side: dropped) */
				for (int x = 0; x < 2; x++)
					if (r->fd[i][x] >= 0) {
						close(r->fd[i][x]);
						r->fd[i][x] = -1;
					}
			}
		if ((pf[0].revents & POLLIN) && r->n < 8) {
			int c = accept(r->lfd, NULL, NULL);
			if (c >= 0) {
				r->fd[r->n][0] = c;
				r->fd[r->n][1] = raw_connect(r->to);
				r->n++;
			}
		}
		pthread_mutex_unlock(&r->mu);
	}
	return NULL;
}

static void relay_start(struct relay *r, int to, pthread_t *th)
{
	*r = (struct relay){ .to = to };
	pthread_mutex_init(&r->mu, NULL);
	r->lfd = loopback_listener(8, &r->port);
	pthread_create(th, NULL, relay_main, r);
}

/* Wait (5 s at most) until the store counts ranks 0 and 1 joined. */
static void relay_wait_joined(struct kiln_store *q)
{
	void *v = NULL;
	for (int i = 0; i < 500 && (!kiln_store_check(q, "kiln/joined", &v, NULL) && (!v || strcmp(v, "2"))); i++) {
		free(v);
		v = NULL;
		usleep(10000);
	}
	ck_assert_msg(v && !strcmp(v, "2"), "ranks 0 and 1 did not join");
	free(v);
}

/* Rank 1 connected again through the relay, and the store recorded no
 * rank lost and refused no claim. */
static void relay_rejoined(struct relay *rl, struct kiln_store *q)
{
	void *v = NULL;
	ck_assert_int_ge(rl->n, 2);
	ck_assert_int_eq(kiln_store_lost_rank(q, 300), KILN_STORE_NONE_LOST);
	ck_assert_int_eq(kiln_store_check(q, STORE_CLAIMS_REFUSED_KEY, &v, NULL), KILN_OK);
	ck_assert_msg(!v, "a claim was refused: %s", (char *)v);
}

/* End the relay's thread th and close its sockets. */
static void relay_stop(struct relay *rl, pthread_t th)
{
	pthread_mutex_lock(&rl->mu);
	rl->stop = 1;
	pthread_mutex_unlock(&rl->mu);
	pthread_join(th, NULL);
	for (int i = 0; i < rl->n; i++)
		for (int j = 0; j < 2; j++)
			if (rl->fd[i][j] >= 0)
				close(rl->fd[i][j]);
	close(rl->lfd);
}

/* A host name that resolves to two addresses, the first refusing (the
 * store and the relay listen on 127.0.0.1 only): getaddrinfo interposed
 * for libkiln (the executable's definition wins), the real one for every
 * other name. */
#define TWO_ADDRS "kiln-two-addrs.test"

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
		struct addrinfo **res)
{
	int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
		(int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(
			RTLD_NEXT, "getaddrinfo");
	if (!node || strcmp(node, TWO_ADDRS))
		return real(node, service, hints, res);
	struct addrinfo h = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
			      .ai_flags = AI_NUMERICHOST }, *a = NULL, *b = NULL;
	int rc = real("127.0.0.2", service, &h, &a);
	if (rc)
		return rc;
	if ((rc = real("127.0.0.1", service, &h, &b))) {
		freeaddrinfo(a);
		return rc;
	}
	struct addrinfo *t = a;
	while (t->ai_next)
		t = t->ai_next;
	t->ai_next = b; /* (glibc's freeaddrinfo frees node by node) */
	*res = a;
	return 0;
}

/* Rank 1 of 3 through the relay, in a thread. */
struct r1 {
	const char *host;
	int port;
	kiln_status st;
	char msg[512];
};

static void *rank1_relayed(void *arg)
{
	struct r1 *a = arg;
	struct kiln_store *s;
	a->st = kiln_store_open(a->host, a->port, 0, 1, 3, 10000, &s);
	if (!a->st)
		a->st = kiln_store_rendezvous(s, 1, 3, 10000);
	snprintf(a->msg, sizeof a->msg, "%s", a->st ? kiln_last_error() : "");
	if (!a->st)
		kiln_store_close(s);
	return NULL;
}

/* Finding 1 of session 33: a live rank's connection breaks on its side
 * while it waits at the rendezvous, the store still holding it: the rank
 * connects again and claims again with its claim key, takes its claim and
 * join over, and the rendezvous completes, no rank lost, no claim refused
 * (before: the rank failed "connection lost", the others timed out).  (A
 * link cut long enough for the store to drop and release the rank:
 * tests/store_blip.sh, as root.)  Through a host name whose first address
 * refuses (the review of session 33: the reconnect ended at that refusal,
 * "rank 0 is gone", where the first connect had gone on to the second). */
static void claim_again_case(const char *host)
{
	struct kiln_store *s0, *q, *s2;
	/* the warning of the rendezvous that connected again names the break,
	 * not the lost connection's hint that rank 0 may have died (it has
	 * just answered; before: the hint, misleading, session 33's notes) */
	emfile_log[0] = 0;
	kiln_log_set_sink(emfile_capture, NULL);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 10000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct relay rl;
	pthread_t th0, th1, thr;
	relay_start(&rl, port, &thr);
	struct r0 a = { .s = s0, .world = 3, .timeout_ms = 10000 };
	struct r1 b = { .host = host, .port = rl.port };
	pthread_create(&th0, NULL, rank0_rendezvous, &a);
	pthread_create(&th1, NULL, rank1_relayed, &b);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, -1, 3, 5000, &q), KILN_OK);
	relay_wait_joined(q);
	pthread_mutex_lock(&rl.mu);
	rl.cut = 1;
	pthread_mutex_unlock(&rl.mu);
	usleep(300000);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 2, 3, 10000, &s2), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s2, 2, 3, 10000), KILN_OK);
	pthread_join(th0, NULL);
	pthread_join(th1, NULL);
	ck_assert_msg(a.st == KILN_OK, "rank 0: %s", a.msg);
	ck_assert_msg(b.st == KILN_OK, "rank 1: %s", b.msg);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_msg(strstr(emfile_log, "connected again, joining again") &&
			      strstr(emfile_log, "connection lost") &&
			      !strstr(emfile_log, "may have died"),
		      "the reconnect's warning: %s", emfile_log);
	relay_rejoined(&rl, q);
	relay_stop(&rl, thr);
	kiln_store_close(s2);
	kiln_store_close(q);
	kiln_store_close(s0);
}

START_TEST(test_claim_again)
{
	claim_again_case("127.0.0.1");
}
END_TEST

START_TEST(test_claim_again_two_addrs)
{
	claim_again_case(TWO_ADDRS);
}
END_TEST

/* Session 33's review: rank 1's connection fails one way after every
 * rank joined (the store's answers, kiln/all_joined among them, lost; its
 * own sending still works).  The rank connects again and must claim on
 * the new connection before it closes the old one: closed first, its FIN
 * reached the store first, which recorded rank 1 lost (every rank had
 * joined) and refused its claim again. */
START_TEST(test_claim_again_old_open)
{
	struct kiln_store *s0, *q, *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 10000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	struct relay rl;
	pthread_t th0, th1, thr;
	relay_start(&rl, port, &thr);
	struct r0 a = { .s = s0, .world = 3, .timeout_ms = 10000 };
	struct r1 b = { .host = "127.0.0.1", .port = rl.port };
	pthread_create(&th0, NULL, rank0_rendezvous, &a);
	pthread_create(&th1, NULL, rank1_relayed, &b);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, -1, 3, 5000, &q), KILN_OK);
	relay_wait_joined(q);
	pthread_mutex_lock(&rl.mu);
	rl.mute_n = rl.n;
	pthread_mutex_unlock(&rl.mu);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 2, 3, 10000, &s2), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s2, 2, 3, 10000), KILN_OK);
	pthread_join(th0, NULL);
	ck_assert_msg(a.st == KILN_OK, "rank 0: %s", a.msg);
	pthread_mutex_lock(&rl.mu);
	rl.hup = 1; /* every rank joined: rank 1 now reads EOF */
	pthread_mutex_unlock(&rl.mu);
	pthread_join(th1, NULL);
	ck_assert_msg(b.st == KILN_OK, "rank 1: %s", b.msg);
	relay_rejoined(&rl, q);
	relay_stop(&rl, thr);
	kiln_store_close(s2);
	kiln_store_close(q);
	kiln_store_close(s0);
}
END_TEST

/* Finding 1 of session 34: the link fails during the token handshake (the
 * rank's AUTH is lost, its connection closed).  The rank connects again
 * and gets in (before: "refused this process's token" at once, and the
 * rank gave up while rank 0 waited out [dist] timeout). */
START_TEST(test_auth_cut)
{
	struct kiln_store *s0, *s1;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 10000, &s0), KILN_OK);
	struct relay rl;
	pthread_t thr;
	relay_start(&rl, kiln_store_port(s0), &thr);
	pthread_mutex_lock(&rl.mu);
	rl.cut_auth = 1;
	pthread_mutex_unlock(&rl.mu);
	emfile_log[0] = 0;
	kiln_log_set_sink(emfile_capture, NULL);
	const double t0 = now();
	kiln_status st = kiln_store_open("127.0.0.1", rl.port, 0, 1, 2, 10000, &s1);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_msg(st == KILN_OK, "rank 1: %s", kiln_last_error());
	ck_assert_msg(now() - t0 < 8, "the retry took %.1f s", now() - t0);
	ck_assert_int_eq(rl.n, 2);
	ck_assert_msg(strstr(emfile_log, "the connection closed during the token handshake") &&
			      strstr(emfile_log, "connecting again until [dist] timeout"),
		      "log: %s", emfile_log);
	void *v = NULL;
	ck_assert_int_eq(kiln_store_set(s1, "k", "v", 1), KILN_OK);
	ck_assert_int_eq(kiln_store_check(s0, "k", &v, NULL), KILN_OK);
	ck_assert_str_eq(v, "v");
	free(v);
	kiln_store_close(s1);
	relay_stop(&rl, thr);
	kiln_store_close(s0);
}
END_TEST

/* A store before session 34 answers a wrong token by closing: the client
 * tries again until its timeout, then names both causes. */
static int closer_stop, closer_n;
static void *closing_store(void *arg)
{
	int lfd = *(int *)arg;
	unsigned char g[40] = { 0 }, buf[64];
	memcpy(g, STORE_MAGIC, 8);
	while (!__atomic_load_n(&closer_stop, __ATOMIC_SEQ_CST)) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };
		if (poll(&pf, 1, 50) <= 0)
			continue;
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			continue;
		if (write(fd, g, sizeof g) == (ssize_t)sizeof g && !raw_read(fd, buf, 41))
			__atomic_add_fetch(&closer_n, 1, __ATOMIC_SEQ_CST);
		close(fd);
	}
	return NULL;
}

START_TEST(test_auth_old_store)
{
	int port, lfd = loopback_listener(4, &port);
	pthread_t th;
	pthread_create(&th, NULL, closing_store, &lfd);
	struct kiln_store *s = NULL;
	const double t0 = now();
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 1500, &s), KILN_EIO);
	const double dt = now() - t0;
	__atomic_store_n(&closer_stop, 1, __ATOMIC_SEQ_CST);
	pthread_join(th, NULL);
	close(lfd);
	ck_assert_msg(strstr(kiln_last_error(), ": the connection closed during the token handshake: the link to it failed, or a store of a kiln before session 34 refused this process's token"),
		      "%s", kiln_last_error());
	ck_assert_msg(dt > 1.3 && dt < 6, "gave up after %.1f s", dt);
	ck_assert_int_ge(closer_n, 2);
}
END_TEST

/* Finding 2 of session 34: 1100 idle connections that never present the
 * token while rank 0 waits.  Before, they held the store's 1024 slots,
 * rank 1 was closed at the door ("connection lost ... may have died")
 * and rank 0's timeout named no rank (its question went over a fresh
 * connection, closed too).  Now the oldest of them is closed for each new
 * one (64 at most, 32 from one address), which the store says once and
 * counts; rank 1 gets in, and rank 0 names the missing rank. */
START_TEST(test_idle_flood)
{
	enum { FLOOD = 1100 };
	struct rlimit rl;
	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 4096 && rl.rlim_max >= 4096) {
		rl.rlim_cur = 4096;
		ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	ck_assert_msg(rl.rlim_cur >= 2 * FLOOD + 64, "ulimit -n %llu is too low for the test",
		      (unsigned long long)rl.rlim_cur);
	struct kiln_store *s0, *s1;
	emfile_log[0] = 0;
	kiln_log_set_sink(emfile_capture, NULL);
	/* (40 s: the store waits 10 s for a token, kiln_store_auth_ms) */
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 40000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	/* 8 idle ones from another address first: never closed for the
	 * flood from 127.0.0.1 (32 from one address at most) */
	int other[8];
	unsigned char g[40];
	for (int i = 0; i < 8; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002) },
				   to = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		other[i] = socket(AF_INET, SOCK_STREAM, 0);
		ck_assert_int_eq(bind(other[i], (struct sockaddr *)&a, sizeof a), 0);
		ck_assert_int_eq(connect(other[i], (struct sockaddr *)&to, sizeof to), 0);
		ck_assert_int_eq(raw_read(other[i], g, sizeof g), 0);
	}
	const double t_other = now();
	static int fl[FLOOD];
	for (int i = 0; i < FLOOD; i++)
		fl[i] = raw_connect(port);
	/* (asked within the store's 10 s for a token, which closes them too:
	 * not asked on a machine too slow for that) */
	const double flood_s = now() - t_other;
	if (flood_s >= 8)
		fprintf(stderr, "test_idle_flood: 1100 connections took %.1f s: the other address's not checked\n",
			flood_s);
	for (int i = 0; i < 8 && flood_s < 8; i++) {
		errno = 0;
		ck_assert_msg(recv(other[i], g, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN,
			      "a connection from 127.0.0.2 was closed for the flood from 127.0.0.1");
	}
	/* rank 0's timeout names rank 1 and the connections closed */
	ck_assert_int_eq(kiln_store_rendezvous(s0, 0, 2, 1500), KILN_ETIMEOUT);
	char msg[2048];
	snprintf(msg, sizeof msg, "%s", kiln_last_error());
	ck_assert_msg(strstr(msg, "but rank 1 never arrived") &&
			      strstr(msg, "; the store dropped ") &&
			      strstr(msg, " connection(s) that presented no token, the last from 127.0.0.1:"),
		      "rank 0: %s", msg);
	/* rank 1 gets in */
	kiln_status st = kiln_store_open("127.0.0.1", port, 0, 1, 2, 10000, &s1);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_msg(st == KILN_OK, "rank 1: %s", kiln_last_error());
	ck_assert_int_eq(kiln_store_set(s1, "k", "v", 1), KILN_OK);
	ck_assert_msg(strstr(emfile_log, "the store is at its connection limit (64 connections that have not presented the token, 32 from one address)"),
		      "log: %s", emfile_log);
	for (int i = 0; i < 8; i++)
		close(other[i]);
	for (int i = 0; i < FLOOD; i++)
		close(fl[i]);
	kiln_store_close(s1);
	kiln_store_close(s0);
}
END_TEST

/* The same, made certain: 32 connections from 127.0.0.1 whose token is
 * (as far as the store knows) on its way, then a rank from there.  Before
 * the fix the rank's connection closed the oldest at once (0.0 s old);
 * now the rank waits in the listen backlog until the oldest has waited
 * STORE_UNAUTH_GRACE_MS, and only that one is closed. */
START_TEST(test_young_kept)
{
	struct kiln_store *s0, *s1;
	int fd[STORE_MAX_UNAUTH_ADDR];
	unsigned char g[40];
	emfile_log[0] = 0;
	kiln_log_set_sink(emfile_capture, NULL);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 10000, &s0), KILN_OK);
	const int port = kiln_store_port(s0);
	double t0 = 0;
	for (int i = 0; i < STORE_MAX_UNAUTH_ADDR; i++) {
		fd[i] = raw_connect(port);
		ck_assert_int_eq(raw_read(fd[i], g, sizeof g), 0); /* taken: greeted */
		if (!i)
			t0 = now();
	}
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 1, 2, 10000, &s1), KILN_OK);
	const double waited = now() - t0;
	ck_assert_msg(waited >= 0.9 * STORE_UNAUTH_GRACE_MS / 1000.0,
		      "the rank got in %.3f s after the oldest connection: it was closed younger than %d ms",
		      waited, STORE_UNAUTH_GRACE_MS);
	ck_assert_int_eq(recv(fd[0], g, 1, MSG_DONTWAIT), 0); /* the oldest closed */
	for (int i = 1; i < STORE_MAX_UNAUTH_ADDR; i++) {
		errno = 0;
		ck_assert_msg(recv(fd[i], g, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "connection %d closed", i);
	}
	kiln_store_close(s1);
	kiln_store_close(s0);
	kiln_log_set_sink(NULL, NULL);
	for (int i = 0; i < STORE_MAX_UNAUTH_ADDR; i++)
		close(fd[i]);
	ck_assert_msg(strstr(emfile_log, "the store is at its connection limit (64 connections that have not presented the token, 32 from one address)") &&
			      !strstr(emfile_log, "[dist]"),
		      "log: %s", emfile_log);
}
END_TEST

/* Ranks starting together from one host: the store took one connection
 * per poll round and closed the oldest without the token as soon as 32
 * waited from one address, however young, so ranks whose token was on its
 * way were closed as idle (session 34's review: 9 of 128 processes, 24 of
 * 300 threads; they connected again, warning of a broken link).  Now only
 * a connection that waited STORE_UNAUTH_GRACE_MS is closed: none is, and
 * nothing is said. */
enum { BURST = 300 };
static pthread_barrier_t burst_bar;
static int burst_port, burst_failed;

static void *burst_rank(void *arg)
{
	struct kiln_store *s;
	pthread_barrier_wait(&burst_bar);
	kiln_status st = kiln_store_open("127.0.0.1", burst_port, 0, (int)(long)arg, BURST, 20000, &s);
	if (st) {
		__atomic_add_fetch(&burst_failed, 1, __ATOMIC_SEQ_CST);
		return NULL;
	}
	usleep(200000); /* all of them connected at once */
	kiln_store_close(s);
	return NULL;
}

START_TEST(test_burst_open)
{
	struct kiln_store *s0;
	static pthread_t th[BURST];
	emfile_log[0] = 0;
	kiln_log_set_sink(emfile_capture, NULL);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, BURST, 20000, &s0), KILN_OK);
	burst_port = kiln_store_port(s0);
	burst_failed = 0;
	ck_assert_int_eq(pthread_barrier_init(&burst_bar, NULL, BURST - 1), 0);
	for (long i = 1; i < BURST; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, burst_rank, (void *)i), 0);
	for (int i = 1; i < BURST; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&burst_bar);
	void *v = NULL;
	size_t n = 0;
	ck_assert_int_eq(kiln_store_check(s0, STORE_DROPPED_KEY, &v, &n), KILN_OK);
	ck_assert_msg(!v, "%s: %.*s", STORE_DROPPED_KEY, (int)n, v ? (char *)v : "");
	kiln_store_close(s0);
	kiln_log_set_sink(NULL, NULL);
	ck_assert_int_eq(burst_failed, 0);
	ck_assert_msg(!emfile_log[0], "logged: %s", emfile_log);
}
END_TEST

/* Finding 3 of session 35: the store's wait for a token follows rank 0's
 * [dist] timeout (a quarter, 1 to 10 s): at 4 s, a connection that reads
 * its greeting and answers nothing is closed after 1 s, and counted so
 * (before, after 10 s whatever the timeout). */
START_TEST(test_auth_wait)
{
	struct kiln_store *s0;
	ck_assert_int_eq(kiln_store_auth_ms(4000), 1000);
	ck_assert_int_eq(kiln_store_auth_ms(20000), 5000);
	ck_assert_int_eq(kiln_store_auth_ms(300000), 10000);
	ck_assert_int_eq(kiln_store_auth_ms(100), 1000);
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 2, 4000, &s0), KILN_OK);
	int fd = raw_connect(kiln_store_port(s0));
	unsigned char g[40], b;
	ck_assert_int_eq(raw_read(fd, g, sizeof g), 0);
	const double t0 = now();
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	ck_assert_int_eq(poll(&pf, 1, 6000), 1);
	const double dt = now() - t0;
	ck_assert_msg(read(fd, &b, 1) == 0 && dt > 0.8 && dt < 3,
		      "a connection without the token closed after %.1f s, expected 1 s", dt);
	close(fd);
	void *v = NULL;
	size_t n = 0;
	ck_assert_int_eq(kiln_store_check(s0, STORE_DROPPED_KEY, &v, &n), KILN_OK);
	ck_assert_msg(v && strstr(v, ": it presented no token within 1.0 s"), "%s: %.*s",
		      STORE_DROPPED_KEY, (int)n, v ? (char *)v : "");
	free(v);
	kiln_store_close(s0);
}
END_TEST

static Suite *make_store_suite(void)
{
	Suite *s = suite_create("store");
	check_add_case(s, "store", 30, NULL, NULL, (const TTest *[]){
		test_set_get_add, test_add_overflow, test_get_waits, test_get_timeout, test_get_timeout_in_step, test_rendezvous_timeout,
		test_rendezvous_ok, test_rendezvous_refusals, test_claim_before_win, test_claim_released, test_lost_rank, test_lost_after_host, test_host_close_no_loss, test_nobody_listens, test_env, test_restart_wait,
		test_token_refused, test_limits, test_timeout_honoured, test_parse, test_old_protocol, test_keepalive, test_store_gone, test_accept_emfile, test_connect_dropped, test_refusal_store_figure,
		test_claim_again, test_claim_again_two_addrs, test_claim_again_old_open,
		test_auth_cut, test_auth_old_store, test_idle_flood, test_burst_open, test_young_kept,
		test_auth_wait, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_store_suite };
