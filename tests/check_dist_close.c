/* tests/check_dist_close.c - what a rank leaving unfinished tells its
 * peers (kiln_dist_close, close_mark_failed in core/dist.c;
 * docs/distributed.md "Failures").  A rank here is a struct kiln_dist made
 * by hand as kiln_dist_open leaves it after the rendezvous (no device, no
 * communicator), with a store connection of its own; rank 0's store is
 * hosted by this process (or, stopped, by a child).
 *
 * test_own_marks: a rank leaving with its own error posts kiln/failed_rank
 * and marks its heartbeat counter FAILED (what the other cases look for).
 * test_sizes_wait_no_mark: a rank whose wait for a peer's data set sizes
 * timed out (the peer late: kiln_dist_agree_sizes) marks nothing; before
 * session 34's review it marked itself FAILED, and the late peer, once
 * there, ended naming it as failed with its own error (no test then).
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
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	kiln_dist_close(d);
	marks(s0, &failed, &hb);
	ck_assert_int_eq(failed, 1);
	ck_assert_int_lt(hb, -(INT64_C(1) << 61)); /* FAILED: below every done mark */
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
	kiln_dist_close(d);
	marks(s0, &failed, &hb);
	ck_assert_int_eq(failed, -1);
	ck_assert_int_eq(hb, 0);
	kiln_store_close(s0);
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
		test_own_marks, test_sizes_wait_no_mark, test_mark_bounded, NULL });
	return s;
}

static const struct check_main check_suite = { .suite = make_dist_close_suite,
					       .setup = token_setup };
