/* tests/check_shmp2p.c - the shared-memory channel (plugins/common/shmp2p.h)
 * on its own, with rings small enough that every message size crosses the
 * piece, the ring and its wrap (check_comm's test_gloo_p2p_channel drives
 * the same code through kiln-gloo's 4 MiB rings).
 *
 * test_pieces: for rings of 1 KiB (pieces of 256 bytes), 64 KiB (16 KiB)
 * and 1 MiB (SHMP2P_PIECE, 64 KiB), two channels, a -> b and b -> a, each
 * with a sender and a receiver thread, all four at once: the senders send
 * NMSG messages of sizes around the frame, the piece and the ring (and
 * several rings long), every third by shmp2p_try_send when it goes; the
 * receivers check every byte (a value of the direction, the message's
 * number and the byte's offset, so that a piece lost, repeated, swapped
 * or taken from another message shows) and the byte past the end
 * untouched.
 * test_sleepers: the same on the 1 KiB ring with a receiver that starts
 * 50 ms late (its sender sleeps on the futex for room) and a sender that
 * starts 50 ms late (its receiver sleeps for data): both woken, every
 * byte checked.
 * test_size_mismatch: a recv of another size fails naming both counts and
 * both ranks, and the sender's next send on the channel fails too.
 * test_laps: a message that finds the ring empty starts at the next lap's
 * start (shmp2p.h, "Laps"), by shmp2p_send and shmp2p_try_send, both
 * positions there; one that finds the ring busy follows the last; with
 * restart = 0 every message follows the last; every byte checked.
 * test_node_names: a node's group of the shared-memory collectives
 * (shmcoll_name_node, kiln-gloo's hierarchical allreduce) waiting for a
 * peer whose process is gone names both by world rank, node and local
 * rank. */
#include "check_main.h"

#include "../plugins/common/shmp2p.h"
#include "../plugins/common/shmcoll.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NMSG = 20, TIMEOUT_MS = 5000 };

struct side {
	struct shmp2p c;
	int dir;          /* 0: a -> b, 1: b -> a */
	int delay_ms;     /* sleep before the first message */
	size_t ring;
	char err[256];
};

/* message m's size on a ring of `ring` bytes */
static size_t msg_bytes(size_t ring, int m)
{
	const size_t piece = ring / 4 < SHMP2P_PIECE ? ring / 4 : SHMP2P_PIECE;
	const size_t sizes[NMSG] = { 0, 1, 15, 16, 17, piece - 1, piece, piece + 1, 2 * piece + 3,
				     ring - SHMP2P_FRAME - 1, ring - SHMP2P_FRAME,
				     ring - SHMP2P_FRAME + 1, ring, ring + 1, 3 * ring + 5, 7,
				     ring / 2 + 9, 5 * piece - 1, 2 * ring - 1, 100 };
	return sizes[m];
}

static uint8_t val(int dir, int m, size_t i)
{
	return (uint8_t)(dir * 71 + m * 131 + (int)(i % 251) * 7 + (int)(i / 4093) * 3);
}

static void pause_ms(int ms)
{
	const struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000l };
	nanosleep(&ts, NULL);
}

/* message m of n bytes through b (n + 1 bytes): sends it */
static int send_one(struct side *s, int m, uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		b[i] = val(s->dir, m, i);
	const int now = m % 3 == 2 && shmp2p_try_send(&s->c, b, n);
	if (!now && shmp2p_send(&s->c, b, n)) {
		snprintf(s->err, sizeof s->err, "dir %d: send %d (%zu bytes): %s", s->dir, m, n,
			 kiln_host_table()->last_error());
		return -1;
	}
	return 0;
}

/* message m of n bytes into b (n + 1 bytes): receives and checks it */
static int recv_one(struct side *s, int m, uint8_t *b, size_t n)
{
	memset(b, 0xee, n + 1);
	if (shmp2p_recv(&s->c, b, n)) {
		snprintf(s->err, sizeof s->err, "dir %d: recv %d (%zu bytes): %s", s->dir, m, n,
			 kiln_host_table()->last_error());
		return -1;
	}
	for (size_t i = 0; i <= n; i++)
		if (b[i] != (i < n ? val(s->dir, m, i) : 0xee)) {
			snprintf(s->err, sizeof s->err, "dir %d: message %d (%zu bytes), byte %zu: %d, want %d",
				 s->dir, m, n, i, b[i], i < n ? val(s->dir, m, i) : 0xee);
			return -1;
		}
	return 0;
}

/* a thread's body: after its delay, `one` on each of the NMSG messages in
 * a buffer of its own, until one fails (its error in s->err) */
static void *each_message(struct side *s, int (*one)(struct side *, int, uint8_t *, size_t))
{
	pause_ms(s->delay_ms);
	for (int m = 0; m < NMSG; m++) {
		const size_t n = msg_bytes(s->ring, m);
		uint8_t *b = malloc(n + 1);
		if (!b) {
			snprintf(s->err, sizeof s->err, "out of memory");
			return NULL;
		}
		const int bad = one(s, m, b, n);
		free(b);
		if (bad)
			break;
	}
	return NULL;
}

static void *sender(void *arg)
{
	return each_message(arg, send_one);
}

static void *receiver(void *arg)
{
	return each_message(arg, recv_one);
}

/* both directions on a ring of `ring` bytes, all four threads at once;
 * delays: the receivers' and the senders' first sleep */
static void both_ways(size_t ring, int recv_delay_ms, int send_delay_ms)
{
	const size_t per = shmp2p_bytes(ring);
	char *mem = aligned_alloc(64, 2 * per);
	struct side s[4]; /* 0, 1: the senders of a -> b, b -> a; 2, 3: their receivers */
	pthread_t t[4];
	ck_assert_ptr_nonnull(mem);
	memset(mem, 0, 2 * per);
	memset(s, 0, sizeof s);
	for (int k = 0; k < 4; k++) {
		const int dir = k & 1, sending = k < 2;
		s[k].dir = dir, s[k].ring = ring;
		s[k].delay_ms = sending ? send_delay_ms : recv_delay_ms;
		/* a -> b is rank 0 to 1, b -> a rank 1 to 0 */
		shmp2p_init(&s[k].c, kiln_host_table(), "test", sending ? dir : 1 - dir, 2,
			    sending ? 1 - dir : dir, mem + (size_t)dir * per, ring, TIMEOUT_MS,
			    SHMP2P_SPIN_NS, NULL, NULL);
		ck_assert_int_eq(pthread_create(&t[k], NULL, sending ? sender : receiver, &s[k]), 0);
	}
	for (int k = 0; k < 4; k++)
		pthread_join(t[k], NULL);
	for (int k = 0; k < 4; k++) /* the receivers' first: a byte wrong leaves its sender timing out */
		ck_assert_msg(!s[(k + 2) % 4].err[0], "ring %zu: %s", ring, s[(k + 2) % 4].err);
	free(mem);
}

static const size_t rings[] = { 1024, 65536, 1 << 20 };

START_TEST(test_pieces)
{
	both_ways(rings[_i], 0, 0);
}
END_TEST

START_TEST(test_sleepers)
{
	both_ways(1024, 50, 0);
	both_ways(1024, 0, 50);
}
END_TEST

START_TEST(test_size_mismatch)
{
	const size_t ring = 4096, per = shmp2p_bytes(ring);
	char *mem = aligned_alloc(64, per), b[300];
	struct shmp2p tx, rx;
	memset(mem, 0, per);
	memset(b, 1, sizeof b);
	shmp2p_init(&tx, kiln_host_table(), "test", 0, 2, 1, mem, ring, TIMEOUT_MS, SHMP2P_SPIN_NS,
		    NULL, NULL);
	shmp2p_init(&rx, kiln_host_table(), "test", 1, 2, 0, mem, ring, TIMEOUT_MS, SHMP2P_SPIN_NS,
		    NULL, NULL);
	ck_assert_int_eq(shmp2p_send(&tx, b, 100), KILN_OK);
	ck_assert_int_eq(shmp2p_recv(&rx, b, 120), KILN_EINVAL);
	const char *e = kiln_host_table()->last_error();
	ck_assert_msg(strstr(e, "rank 0 sent message 1 with 100 bytes where rank 1's recv expected 120"),
		      "%s", e);
	ck_assert_int_eq(shmp2p_send(&tx, b, 10), KILN_EINVAL);
	free(mem);
}
END_TEST

/* message m of n bytes from tx to rx, sent (try: by shmp2p_try_send,
 * which must take it) and not yet received */
static void lap_send(struct shmp2p *tx, int m, size_t n, int try)
{
	uint8_t b[3000];
	ck_assert_uint_le(n, sizeof b);
	for (size_t i = 0; i < n; i++)
		b[i] = val(0, m, i);
	if (try)
		ck_assert_int_eq(shmp2p_try_send(tx, b, n), 1);
	else
		ck_assert_int_eq(shmp2p_send(tx, b, n), KILN_OK);
}

static void lap_recv(struct shmp2p *rx, int m, size_t n)
{
	uint8_t b[3000];
	ck_assert_int_eq(shmp2p_recv(rx, b, n), KILN_OK);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(b[i] == val(0, m, i), "message %d byte %zu: %d, want %d", m, i, b[i],
			      val(0, m, i));
}

/* the sender's and the receiver's positions */
#define ck_assert_pos(h, w, r)                                  \
	do {                                                    \
		ck_assert_uint_eq(atomic_load(&(h)->wpos), (w)); \
		ck_assert_uint_eq(atomic_load(&(h)->rpos), (r)); \
	} while (0)

START_TEST(test_laps)
{
	const size_t ring = 4096, per = shmp2p_bytes(ring), F = SHMP2P_FRAME;
	for (int restart = 1; restart >= 0; restart--) {
		char *mem = aligned_alloc(64, per);
		struct shmp2p tx, rx;
		memset(mem, 0, per);
		shmp2p_init(&tx, kiln_host_table(), "test", 0, 2, 1, mem, ring, TIMEOUT_MS,
			    SHMP2P_SPIN_NS, NULL, NULL);
		shmp2p_init(&rx, kiln_host_table(), "test", 1, 2, 0, mem, ring, TIMEOUT_MS,
			    SHMP2P_SPIN_NS, NULL, NULL);
		ck_assert_int_eq(tx.restart, 1); /* shmp2p_init's */
		tx.restart = rx.restart = restart;
		struct shmp2p_hdr *h = tx.h;
		lap_send(&tx, 0, 100, 0); /* at 0, a lap's start already */
		ck_assert_pos(h, F + 100, 0);
		lap_recv(&rx, 0, 100);
		ck_assert_pos(h, F + 100, F + 100);
		lap_send(&tx, 1, 200, 0); /* the ring empty: the next lap */
		const size_t a = restart ? ring : F + 100;
		ck_assert_pos(h, a + F + 200, restart ? ring : F + 100);
		lap_send(&tx, 2, 50, 1); /* busy (message 1 unread): after it */
		ck_assert_pos(h, a + 2 * F + 250, restart ? ring : F + 100);
		lap_recv(&rx, 1, 200);
		lap_recv(&rx, 2, 50);
		ck_assert_pos(h, a + 2 * F + 250, a + 2 * F + 250);
		lap_send(&tx, 3, 3000, 1); /* empty again, by try_send */
		const size_t b = restart ? 2 * ring : a + 2 * F + 250;
		ck_assert_pos(h, b + F + 3000, restart ? 2 * ring : a + 2 * F + 250);
		lap_recv(&rx, 3, 3000);
		lap_send(&tx, 4, 0, 0); /* a frame alone, then 2 messages past a lap's end */
		lap_recv(&rx, 4, 0);
		const size_t c = restart ? 3 * ring : b + F + 3000;
		ck_assert_pos(h, c + F, c + F);
		lap_send(&tx, 5, 3000, 0);
		lap_recv(&rx, 5, 3000);
		lap_send(&tx, 6, 2500, 0);
		lap_recv(&rx, 6, 2500);
		const size_t d = restart ? 5 * ring + F + 2500 : c + 3 * F + 5500;
		ck_assert_pos(h, d, d);
		free(mem);
	}
}
END_TEST

/* shmcoll's liveness check: local rank 1's process is gone */
static int local_one_gone(void *arg)
{
	(void)arg;
	return 1;
}

/* Before session 30 the message read "test: rank 0 of 2: rank 1 is gone
 * ...": the node's local ranks, unlabelled, beside messages naming world
 * ranks. */
START_TEST(test_node_names)
{
	static const int world_of[2] = { 2, 3 }; /* node 1: world ranks 2 and 3 */
	char *mem = aligned_alloc(64, 2 * SHMCOLL_SEGMENT);
	ck_assert_ptr_nonnull(mem);
	memset(mem, 0, 2 * SHMCOLL_SEGMENT);
	void *seg[2] = { mem, mem + SHMCOLL_SEGMENT };
	struct shmcoll s;
	float x[4] = { 1, 2, 3, 4 };
	ck_assert_int_eq(shmcoll_init(&s, kiln_host_table(), "test", 0, 2, seg, TIMEOUT_MS, 0, 0),
			 KILN_OK);
	shmcoll_watch(&s, local_one_gone, NULL);
	shmcoll_name_node(&s, world_of, 1);
	ck_assert_int_eq(shmcoll_allreduce(&s, SHMCOLL_SLEEP, x, 4, KILN_F32, 1.0f), KILN_EIO);
	const char *msg = kiln_host_table()->last_error();
	ck_assert_msg(strstr(msg, "test: rank 2 (node 1's local rank 0 of 2): rank 3 (node 1's local rank 1) is gone (its process ended) while this rank waited for rank 3 (node 1's local rank 1) in the shared-memory "),
		      "%s", msg);
	free(mem);
}
END_TEST

static Suite *make_shmp2p_suite(void)
{
	Suite *s = suite_create("shmp2p");
	TCase *tc = tcase_create("channel");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_pieces, 0, (int)(sizeof rings / sizeof *rings));
	tcase_add_test(tc, test_sleepers);
	tcase_add_test(tc, test_size_mismatch);
	tcase_add_test(tc, test_laps);
	tcase_add_test(tc, test_node_names);
	suite_add_tcase(s, tc);
	return s;
}

static const struct check_main check_suite = { .suite = make_shmp2p_suite };
