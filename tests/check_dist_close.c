/* tests/check_dist_close.c - what a rank leaving unfinished tells its
 * peers (kiln_dist_close, close_mark_failed in core/dist.c;
 * docs/distributed.md "Failures").  A rank here is a struct kiln_dist made
 * by hand as kiln_dist_open leaves it after the rendezvous (no device, no
 * communicator), with a store connection of its own; rank 0's store is
 * hosted by this process (or, stopped, by a child).
 *
 * test_own_marks: a rank leaving with its own error posts kiln/failed_rank
 * and marks its heartbeat counter FAILED (what the other cases look for),
 * and posts its message, kiln/failed_why, which the survivors quote
 * (kiln_dist_failed_said: "; rank 1 said: data.bin: truncated"; session 39); a
 * message over 1000 bytes is posted as its first 250 and last 747 around
 * "...".
 * test_sizes_wait_no_mark: a rank whose wait for a peer's data set sizes
 * timed out (the peer late: kiln_dist_agree_sizes) marks nothing; before
 * session 34's review it marked itself FAILED, and the late peer, once
 * there, ended naming it as failed with its own error (no test then).
 * test_open_fail_no_mark: ranks 0 and 1 of 3 (kiln_dist_open) whose
 * communicator open failed (the test communicator tcommfail), rank 2 late
 * (it passed the rendezvous and the config check, by hand here, and opens
 * none): neither marks itself FAILED (review of session 34; before, the
 * first one did, and the late rank was told it had failed with its own
 * error), and kiln_dist_open says the failure is not their own (its *own
 * 0: `kiln launch` is told nothing by them, session 39).
 * test_mark_bounded: a rank whose store stopped answering (rank 0's
 * process stopped, a link cut) leaves within close_mark_failed's 5 s and
 * not a whole [dist] timeout (30 s here) later (review of session 34).
 */
#include <kiln/kiln.h>
#include <kiln/dist.h>
#include "../core/dist_impl.h"
#include "../core/store.h"

#include <check.h>
#include "check_main.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Rank `rank` of `world` past the rendezvous, connected to the store at
 * port with [dist] timeout timeout_ms; freed by kiln_dist_close. */
static struct kiln_dist *rank_at(int port, int rank, int world, int timeout_ms)
{
	struct kiln_dist *d = calloc(1, sizeof *d);
	ck_assert_ptr_nonnull(d);
	d->env.rank = rank;
	d->env.world = world;
	snprintf(d->env.master_addr, sizeof d->env.master_addr, "127.0.0.1");
	d->env.master_port = port;
	d->env.source = "test";
	d->timeout_ms = timeout_ms;
	d->joined = 1;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, rank, world, timeout_ms, &d->store),
			 KILN_OK);
	return d;
}

/* what rank r left in the store s0: *failed_rank (-1: none) and its
 * heartbeat counter */
static void marks(struct kiln_store *s0, int *failed_rank, int64_t *hb)
{
	void *v = NULL;
	ck_assert_int_eq(kiln_store_check(s0, "kiln/failed_rank", &v, NULL), KILN_OK);
	*failed_rank = v ? atoi(v) : -1;
	free(v);
	ck_assert_int_eq(kiln_store_add(s0, "kiln/hb/1", 0, hb), KILN_OK);
}

START_TEST(test_own_marks)
{
	struct kiln_store *s0;
	int failed;
	int64_t hb;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	struct kiln_dist *d = rank_at(kiln_store_port(s0), 1, 3, 5000);
	kiln_error(KILN_EDATA, "data.bin: truncated");
	ck_assert_int_eq(kiln_dist_failed_own(d), 1);
	kiln_dist_close(d);
	marks(s0, &failed, &hb);
	ck_assert_int_eq(failed, 1);
	ck_assert_int_lt(hb, -(INT64_C(1) << 61)); /* FAILED: below every done mark */
	char said[FAILED_SAID_MAX];
	kiln_dist_failed_said(s0, 1, said, sizeof said);
	ck_assert_str_eq(said, "; rank 1 said: data.bin: truncated");
	kiln_store_close(s0);

	/* a long message: its start and its end (the cause) */
	char msg[1500];
	for (int i = 0; i < 1499; i++)
		msg[i] = (char)('a' + i % 26);
	msg[1499] = 0;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	d = rank_at(kiln_store_port(s0), 1, 3, 5000);
	kiln_error(KILN_EDATA, "%s", msg);
	kiln_dist_close(d);
	void *v = NULL;
	size_t len = 0;
	ck_assert_int_eq(kiln_store_check(s0, "kiln/failed_why", &v, &len), KILN_OK);
	ck_assert_uint_eq(len, 1000);
	ck_assert_int_eq(memcmp(v, msg, 250), 0);
	ck_assert_int_eq(memcmp((char *)v + 250, "...", 3), 0);
	ck_assert_int_eq(memcmp((char *)v + 253, msg + 1499 - 747, 747), 0);
	free(v);
	kiln_store_close(s0);
}
END_TEST

START_TEST(test_sizes_wait_no_mark)
{
	struct kiln_store *s0;
	int failed;
	int64_t hb;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", 0, 1, 0, 3, 5000, &s0), KILN_OK);
	ck_assert_int_eq(kiln_store_set(s0, "kiln/data_sizes/0", "100", 3), KILN_OK);
	struct kiln_dist *d = rank_at(kiln_store_port(s0), 1, 3, 1000);
	const char *names[] = { "[data]" };
	const int64_t n[] = { 100 };
	/* rank 2 never posts: late */
	ck_assert_int_eq(kiln_dist_agree_sizes(d, names, n, 1), KILN_ETIMEOUT);
	ck_assert_ptr_nonnull(strstr(kiln_last_error(), "rank 1 of 3: waiting for rank 2's data set sizes"));
	ck_assert_int_eq(kiln_dist_failed_own(d), 0);
	kiln_dist_close(d);
	marks(s0, &failed, &hb);
	ck_assert_int_eq(failed, -1);
	ck_assert_int_eq(hb, 0);
	void *v = NULL;
	ck_assert_int_eq(kiln_store_check(s0, "kiln/failed_why", &v, NULL), KILN_OK);
	ck_assert_ptr_null(v);
	kiln_store_close(s0);
}
END_TEST

/* a TCP port on 127.0.0.1 free a moment ago */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t n = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
	    !getsockname(fd, (struct sockaddr *)&a, &n))
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* The config every rank of test_open_fail_no_mark runs (the test
 * communicator tcommfail, tests/plugins/tcommfail.c: its open fails at
 * once, the store untouched; a [dist] timeout of 2 s, no heartbeat), with
 * its registry (the test plugins' directory). */
static int open_cfg(struct kiln_registry **reg, struct kiln_config **cfg)
{
	static const char *const keys[] = { "run.comm=tcommfail", "run.threads=1", "dist.timeout=2",
					    "dist.heartbeat=0" };
	const char *top = getenv("abs_top_builddir");
	char dir[4200];
	const struct kiln_plugin *p;
	snprintf(dir, sizeof dir, "%s/tests/plugins/.libs", top && *top ? top : ".");
	if (kiln_registry_open(dir, reg) ||
	    kiln_registry_find(*reg, KILN_PLUGIN_COMM, "tcommfail", &p) || kiln_config_new(cfg))
		return -1;
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
		if (kiln_config_override(*cfg, keys[i]))
			return -1;
	/* (not validated: [run] comm names the communicators kiln ships) */
	return 0;
}

/* Rank r of 3 through kiln_dist_open, in a child: exit 0 when the open
 * failed naming the communicator and not as its own (as it must), 1
 * otherwise. */
static pid_t open_rank(int r, int port)
{
	const pid_t pid = fork();
	if (pid)
		return pid;
	char v[16];
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_dist *d = NULL;
	snprintf(v, sizeof v, "%d", r);
	setenv("KILN_RANK", v, 1);
	setenv("KILN_WORLD_SIZE", "3", 1);
	setenv("KILN_MASTER_ADDR", "127.0.0.1", 1);
	snprintf(v, sizeof v, "%d", port);
	setenv("KILN_MASTER_PORT", v, 1);
	if (open_cfg(&reg, &cfg) || kiln_device_open(reg, cfg, "cpu", 0, &dev))
		_exit(1);
	int own = -1;
	const kiln_status st = kiln_dist_open(cfg, reg, dev, &d, &own);
	if (!st)
		kiln_dist_close(d);
	_exit(st && !own && strstr(kiln_last_error(), "opening the tcommfail communicator: tcommfail: rank") ? 0 : 1);
}

START_TEST(test_open_fail_no_mark)
{
	struct kiln_registry *reg;
	struct kiln_config *cfg;
	ck_assert_msg(!open_cfg(&reg, &cfg), "the test communicator: %s", kiln_last_error());
	const int port = free_port();
	ck_assert_int_gt(port, 0);
	const pid_t r0 = open_rank(0, port), r1 = open_rank(1, port);
	/* rank 2: the rendezvous and its heartbeat's limit, as kiln_dist_open
	 * does them; then late */
	struct kiln_store *s2;
	ck_assert_int_eq(kiln_store_open("127.0.0.1", port, 0, 2, 3, 10000, &s2), KILN_OK);
	ck_assert_int_eq(kiln_store_rendezvous(s2, 2, 3, 10000), KILN_OK);
	ck_assert_int_eq(kiln_heartbeat_post(s2, 2, 0), KILN_OK);
	/* (dist_config_agree's part of a rank > 0, not exported: its verdict
	 * "" is no difference, and rank 0's, "", the run's) */
	void *v = NULL;
	size_t len = 1;
	ck_assert_int_eq(kiln_store_set(s2, "kiln/config_verdict/2", "", 0), KILN_OK);
	ck_assert_int_eq(kiln_store_get(s2, "kiln/config_verdict", 10000, &v, &len), KILN_OK);
	ck_assert_uint_eq(len, 0);
	free(v);
	v = NULL;
	/* both ranks left (kiln/left counts them after close_mark_failed);
	 * rank 0, which hosts the store, waits up to 2 s for this one */
	int64_t left = 0;
	for (int i = 0; i < 400 && left < 2; i++) {
		ck_assert_msg(!kiln_store_add(s2, "kiln/left", 0, &left), "%s", kiln_last_error());
		if (left < 2)
			usleep(20 * 1000);
	}
	ck_assert_int_eq(left, 2);
	ck_assert_int_eq(kiln_store_check(s2, "kiln/failed_rank", &v, NULL), KILN_OK);
	ck_assert_msg(!v, "rank %s, whose communicator open failed, marked itself FAILED",
		      v ? (const char *)v : "");
	for (int r = 0; r < 2; r++) {
		char key[32];
		int64_t hb = 1;
		snprintf(key, sizeof key, "kiln/hb/%d", r);
		ck_assert_int_eq(kiln_store_add(s2, key, 0, &hb), KILN_OK);
		ck_assert_int_eq(hb, 0);
	}
	kiln_store_add(s2, "kiln/left", 1, NULL);
	kiln_store_close(s2);
	int ws0, ws1;
	waitpid(r0, &ws0, 0);
	waitpid(r1, &ws1, 0);
	ck_assert_msg(WIFEXITED(ws0) && !WEXITSTATUS(ws0), "rank 0's open did not fail as it should");
	ck_assert_msg(WIFEXITED(ws1) && !WEXITSTATUS(ws1), "rank 1's open did not fail as it should");
	kiln_config_free(cfg);
	kiln_registry_close(reg);
}
END_TEST

START_TEST(test_mark_bounded)
{
	int fds[2], port = 0;
	ck_assert_int_eq(pipe(fds), 0);
	const pid_t host = fork();
	ck_assert_int_ge(host, 0);
	if (host == 0) { /* rank 0's process, hosting the store */
		struct kiln_store *s0;
		if (kiln_store_open("127.0.0.1", 0, 1, 0, 2, 30000, &s0))
			_exit(1);
		port = kiln_store_port(s0);
		if (write(fds[1], &port, sizeof port) != sizeof port)
			_exit(1);
		for (;;)
			pause();
	}
	ck_assert_int_eq(read(fds[0], &port, sizeof port), (ssize_t)sizeof port);
	struct kiln_dist *d = rank_at(port, 1, 2, 30000);
	kill(host, SIGSTOP);
	kiln_error(KILN_EDATA, "data.bin: truncated");
	const int64_t t0 = now_ms();
	kiln_dist_close(d);
	const int64_t ms = now_ms() - t0;
	kill(host, SIGKILL);
	waitpid(host, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	/* CLOSE_MARK_MS (5 s) and a margin for a loaded machine */
	ck_assert_msg(ms < 8000, "kiln_dist_close took %lld ms on a stopped store ([dist] timeout 30 s)",
		      (long long)ms);
	ck_assert_str_eq(kiln_last_error(), "data.bin: truncated");
}
END_TEST

static int token_setup(void)
{
	setenv("KILN_STORE_TOKEN", "kiln-tests-0123456789abcdef", 0);
	return 0;
}

static Suite *make_dist_close_suite(void)
{
	Suite *s = suite_create("dist_close");
	check_add_case(s, "mark", 45, NULL, NULL, (const TTest *[]){
		test_own_marks, test_sizes_wait_no_mark, test_open_fail_no_mark, test_mark_bounded,
		NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_dist_close_suite,
					       .setup = token_setup };
