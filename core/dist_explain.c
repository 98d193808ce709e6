/* core/dist_explain.c - what a distributed run's failure is told as: a
 * communicator's or the store's error on one rank turned into the rank
 * that failed first and why (a peer lost, stuck, closed, out of memory,
 * or this rank's own), from what the failing rank posted to the store
 * (kiln/failed_rank, kiln/failed_why) and the heartbeats
 * (docs/distributed.md, "When a rank fails").  Split out of core/dist.c
 * (session 39), unchanged.
 */
#include "dist_impl.h"
#include "store.h" /* STORE_LINGER_MS */
#include "../plugins/common/c_locale.h" /* common_snprintf_c: messages in the C locale */

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* whether a message begins with `word` (at its start or after ": ",
 * where a stream's or the caller's prefix ends) */
static int begins(const char *msg, const char *word)
{
	const size_t n = strlen(word);
	for (const char *p = msg; p; p = strstr(p, ": ")) {
		if (p != msg)
			p += 2;
		if (!strncmp(p, word, n))
			return 1;
	}
	return 0;
}

/* whether an error message is the communicator's (its plugin's messages
 * begin "NAME: ") or the store's and the rendezvous' ("store ",
 * "store: ", "rendezvous ") */
static int from_comm(const struct kiln_dist *d, const char *msg)
{
	char want[64];
	if (!msg)
		return 0;
	snprintf(want, sizeof want, "%s: ", d->plugin->name);
	return begins(msg, want) || begins(msg, "store ") || begins(msg, "store: ") ||
	       begins(msg, "rendezvous ");
}

int dist_names_rank(const struct kiln_dist *d, const char *msg)
{
	char me[32];
	const int n = snprintf(me, sizeof me, "rank %d", d->env.rank);
	return msg && !strncmp(msg, me, (size_t)n) && (msg[n] == ':' || msg[n] == ' ');
}

/* how long a communicator's or the store's failure waits for the store to
 * report a lost rank (it sees a dead process's connection close); after a
 * timeout ([dist] timeout), which is seconds, a death during it would
 * have been seen long ago: the store is asked with a short wait, and a
 * rank it has not seen leave is stuck, not lost (before session 15 a
 * stuck peer cost the whole wait) */
#define DIST_LOST_WAIT_MS 3000
#define DIST_STUCK_WAIT_MS 200

/* The store's own failure, as kiln_store_lost_rank found it (lost:
 * KILN_STORE_GONE or KILN_STORE_SILENT): this rank knows nothing of its
 * peers then, only that rank 0, which hosts the store, is gone or silent. */
static kiln_status store_failed(const struct kiln_dist *d, kiln_status st, int lost,
				const char *msg)
{
	char at[300], stage[48] = "", zero[48] = "", me[48];
	snprintf(at, sizeof at, KILN_AT_FMT, KILN_AT_ARG(d->env.master_addr, kiln_store_port(d->store)));
	/* (a message that names this rank already: said once) */
	const int n = snprintf(me, sizeof me, "rank %d of %d: ", d->env.rank, d->env.world);
	if (msg && !strncmp(msg, me, (size_t)n))
		msg += n;
	if (d->pipe_P) {
		snprintf(stage, sizeof stage, " (pipeline stage %d)", d->env.rank % d->pipe_P);
		snprintf(zero, sizeof zero, " (stage 0 of pipe 0)");
	}
	if (lost == KILN_STORE_SILENT)
		return kiln_error(st, "rank %d of %d%s: the store on rank 0%s at %s does not answer (rank 0 is stuck or stopped, or the link to its host is cut; this rank cannot tell what became of the others): %s",
				  d->env.rank, d->env.world, stage, zero, at, msg ? msg : "");
	return kiln_error(st, "rank %d of %d%s: the store on rank 0%s at %s is gone (rank 0's process exited, its host went down or the connection to it closed; this rank cannot tell what became of the others): %s",
			  d->env.rank, d->env.world, stage, zero, at, msg ? msg : "");
}

/* wait for the store to report a lost rank: 0 for this rank's own failure
 * (a file, the device: not a lost peer, the store is asked what it knows
 * already; before session 14 every such failure waited), short after a
 * timeout, DIST_LOST_WAIT_MS after a communicator's or store's error */
static int lost_wait_ms(const struct kiln_dist *d, kiln_status st, const char *msg)
{
	if (!from_comm(d, msg))
		return 0;
	return st == KILN_ETIMEOUT ? DIST_STUCK_WAIT_MS : DIST_LOST_WAIT_MS;
}

/* The peer that failed with its own error (close_mark_failed posted
 * kiln/failed_rank before its communicator closed, so a collective it
 * broke finds it), or -1. */
static int failed_peer(const struct kiln_dist *d)
{
	void *v = NULL;
	int r = -1;
	if (!kiln_store_check(d->store, "kiln/failed_rank", &v, NULL) && v)
		r = atoi(v);
	free(v);
	return r >= 0 && r < d->env.world && r != d->env.rank ? r : -1;
}

/* Why the heartbeat names no peer (kiln_heartbeat_silent's code n <= 0),
 * each case as it is (before, self-late and every-peer-silent both read
 * "every rank beat within the last X s", session 32). */
static void stuck_cannot(char *out, size_t len, int n, int period_ms, int64_t self_ms,
			 const struct kiln_hb_silent *s)
{
	const double beat = period_ms / 1000.0, quiet = (2 * period_ms + 500) / 1000.0;
	if (n == KILN_HB_OFF)
		snprintf(out, len, "no heartbeat to tell which ([dist] heartbeat = 0)");
	else if (n == KILN_HB_SELF_LATE && self_ms < 0)
		common_snprintf_c(out, len, "the heartbeat cannot tell which: this rank's own beats have not reached the store since its watchdog started (a beat every %.1f s): this rank's link or the store's host is slow or cut, so the peers' silence says nothing",
			 beat);
	else if (n == KILN_HB_SELF_LATE)
		common_snprintf_c(out, len, "the heartbeat cannot tell which: this rank's own last beat reached the store %.1f s ago (a beat every %.1f s): this rank's link or the store's host is slow or cut, so the peers' silence says nothing",
			 self_ms / 1000.0, beat);
	else if (n == KILN_HB_ALL_SILENT)
		common_snprintf_c(out, len, "the heartbeat cannot tell which: every other rank's heartbeat stopped at once (rank %d's for at least %.1f s, host %s, and the rest) while this rank's own beats reached the store (a beat every %.1f s): the network between the store's host and theirs is cut, or all of them stopped",
			 s[0].rank, s[0].age_ms / 1000.0, s[0].host, beat);
	else
		common_snprintf_c(out, len, "the heartbeat cannot tell which yet (every rank beat within the last %.1f s; a beat every %.1f s)",
			 quiet, beat);
}

/* The heartbeat's reading at a collective's timeout (kiln_heartbeat_silent). */
struct stuck_hb {
	struct kiln_hb_silent s[8];
	int n, period_ms;
	int64_t self_ms;
};

/* A collective timed out with no rank lost: the communicator names the
 * peer this rank waited for, which may be a healthy one waiting in turn
 * for the rank that stopped (Gloo's halving-doubling: a rank cut off on
 * one host was blamed as its neighbour's address, session 32).  The
 * heartbeat, which every rank beats beside its training thread, names the
 * rank that stopped when its counter has stood still for two beats and
 * more, with the host name its watchdog read at its start (asking the
 * store here cost a "?" with the store broken, a [dist] timeout a name
 * with it slow); otherwise the peer the message names is a suspect only. */
static kiln_status stuck_explain_peer(struct kiln_dist *d, kiln_status st, const char *msg,
				      const struct stuck_hb *h)
{
	char who[768] = "", cannot[400];
	size_t m = 0;
	for (int i = 0; i < h->n && m + 1 < sizeof who; i++)
		m += (size_t)common_snprintf_c(who + m, sizeof who - m, "%srank %d (host %s) sent no heartbeat for at least %.1f s",
				      i ? ", " : "", h->s[i].rank, h->s[i].host, h->s[i].age_ms / 1000.0);
	if (h->n > 0)
		return kiln_error(st, "rank %d of %d: %s while every other rank's went on (a beat every %.1f s, [dist] heartbeat): it is stuck, not lost (stopped, frozen or its link cut); a collective timed out here ([dist] timeout = %.0f s), and the peer the communicator's message names is the one this rank waited for, which may itself be waiting for %s: %s",
				  d->env.rank, d->env.world, who, h->period_ms / 1000.0, d->timeout_ms / 1000.0,
				  h->n > 1 ? "them" : "it", msg ? msg : "");
	stuck_cannot(cannot, sizeof cannot, h->n, h->period_ms, h->self_ms, h->s);
	return kiln_error(st, "rank %d of %d: a peer is stuck, not lost: a collective timed out ([dist] timeout = %.0f s) while every rank still held its connection to the store (a process stopped or frozen, or its link cut, answers nothing but has not exited); %s: the peer the communicator's message names, which this rank waited for, is a suspect, not necessarily the one that stopped (it may itself be waiting for it): %s",
			  d->env.rank, d->env.world, d->timeout_ms / 1000.0, cannot, msg ? msg : "");
}

/* A collective timed out: a silent peer the heartbeat names comes first
 * (session 33's review: a timeout soon after this process stalled skipped
 * that and said the whole job had stopped).  With none named, a stall of
 * this process within the timeout (and 2 s) before is the likely cause
 * (the job suspended whole: kiln's own waits do not count that, Gloo's
 * busy-polling pairs' and NCCL's kernels' do, docs/distributed.md "A
 * suspended job"), said as such and no peer blamed. */
static kiln_status stuck_explain(struct kiln_dist *d, kiln_status st, const char *msg)
{
	struct stuck_hb h = { .self_ms = -1 };
	h.n = kiln_heartbeat_silent(d->hb, h.s, 8, &h.period_ms, &h.self_ms);
	int64_t len = 0;
	const int64_t at = kiln_run_last_stall(&len);
	const int64_t ago = kiln_now_ns() - at;
	if (h.n > 0 || !at || ago > (int64_t)d->timeout_ms * 1000000 + INT64_C(2000000000))
		return stuck_explain_peer(d, st, msg, &h);
	char hb[400];
	if (h.n == 0)
		common_snprintf_c(hb, sizeof hb, "no peer's heartbeat stood still (a beat every %.1f s)",
			 h.period_ms / 1000.0);
	else
		stuck_cannot(hb, sizeof hb, h.n, h.period_ms, h.self_ms, h.s);
	return kiln_error(st, "rank %d of %d: a collective timed out ([dist] timeout = %.0f s) %.1f s after this process itself stood still for %.1f s (a suspended job? SIGSTOP, scontrol suspend, Ctrl-Z): the communicator's own waits may count such a time (Gloo's busy-polling pairs, [plugin.gloo] busy_poll = 1, and NCCL's kernels do; kiln's deadlines do not), so its peers may have stood still with it rather than be late; %s: %s",
			  d->env.rank, d->env.world, d->timeout_ms / 1000.0, ago / 1e9, len / 1e9, hb,
			  msg ? msg : "");
}

/* A collective failed (a connection closed, not a timeout) with no rank
 * lost: a healthy peer that waited for a stuck one gave up at its own
 * timeout and left, and its connection closed here first.  The stuck
 * rank is the one the heartbeat names (session 35's CI: rank 0 of 4 said
 * only "a collective failed" while rank 3 stood still); none named: the
 * communicator's message as it is. */
static kiln_status closed_explain(struct kiln_dist *d, kiln_status st, const char *msg)
{
	struct stuck_hb h = { .self_ms = -1 };
	h.n = kiln_heartbeat_silent(d->hb, h.s, 8, &h.period_ms, &h.self_ms);
	if (h.n <= 0)
		return kiln_error(st, "rank %d of %d: a collective failed (no rank was reported lost; a peer may be stuck or unreachable; [dist] timeout = %.0f s): %s",
				  d->env.rank, d->env.world, d->timeout_ms / 1000.0, msg ? msg : "");
	char who[768] = "";
	size_t m = 0;
	for (int i = 0; i < h.n && m + 1 < sizeof who; i++)
		m += (size_t)common_snprintf_c(who + m, sizeof who - m, "%srank %d (host %s) sent no heartbeat for at least %.1f s",
				      i ? ", " : "", h.s[i].rank, h.s[i].host, h.s[i].age_ms / 1000.0);
	return kiln_error(st, "rank %d of %d: %s while every other rank's went on (a beat every %.1f s, [dist] heartbeat): it is stuck, not lost (stopped, frozen or its link cut); a collective failed here when a peer that waited for %s gave up at its own [dist] timeout (%.0f s) and closed its connection: %s",
			  d->env.rank, d->env.world, who, h.period_ms / 1000.0, h.n > 1 ? "them" : "it",
			  d->timeout_ms / 1000.0, msg ? msg : "");
}

kiln_status kiln_dist_name_own(const struct kiln_dist *d, kiln_status st)
{
	/* (before session 36 only failures of the store, the communicator
	 * or a rank's data carried the name: rank 0's refused out_dir read
	 * "[run] out_dir ... holds an earlier run" beside rank 1's "rank 1
	 * of 2: rank 0 (host ...) failed with its own error") */
	if (!d || !st || d->env.world < 2 || d->agreed || dist_names_rank(d, kiln_last_error()))
		return st;
	/* kiln_dist_explain names these, after asking whether a peer's
	 * loss or the store's was the cause: a name here would read as
	 * explained already */
	if (st == KILN_EIO || st == KILN_ETIMEOUT || st == KILN_EDEVICE)
		return st;
	return kiln_error_wrap(st, "rank %d of %d", d->env.rank, d->env.world);
}

/* Does msg carry one of kiln_dist_explain's own explanations?  It runs
 * more than once on a failure's way out (the collective, then
 * trainer_close): "rank 1 of 3: rank 2 was lost ..." must not become
 * "... the store on rank 0 ... is gone ...: rank 1 of 3: rank 2 was lost"
 * when the store went too.  A communicator's raw message, which begins
 * "rank N of W:" as well, carries none. */
static int explained(const char *msg)
{
	static const char *const marks[] = {
		" was lost (host ", ") failed with its own error (its log says why): ",
		": the store on rank 0", "stuck, not lost",
		": a collective failed (no rank was reported lost",
		"after this process itself stood still for ",
	};
	for (size_t i = 0; msg && i < KILN_ARRAY_LEN(marks); i++)
		if (strstr(msg, marks[i]))
			return 1;
	return 0;
}

/* This process ran out of memory asking the store (kiln_store_oom): its
 * own failure, out of memory, whatever a communicator that asked made of
 * the status (an I/O error, a peer that did not say): said as this
 * rank's, no peer and not the store blamed, and its peers told
 * (close_mark_failed).  Before session 39 the allocation read as the
 * connection lost, and the rank said "the store on rank 0 ... is gone"
 * or "rank 0, which hosts the store, may have died".  Frees msg. */
static kiln_status oom_own(struct kiln_dist *d, char *msg)
{
	kiln_status st = dist_names_rank(d, msg)
				 ? kiln_error(KILN_ENOMEM, "%s", msg)
				 : kiln_error(KILN_ENOMEM, "rank %d of %d: %s", d->env.rank, d->env.world,
					      msg ? msg : "out of memory");
	d->peer_blamed = 0;
	free(msg);
	return st;
}

kiln_status kiln_dist_explain(struct kiln_dist *d, kiln_status st)
{
	if (!d || !st || (st != KILN_EIO && st != KILN_ETIMEOUT && st != KILN_EDEVICE))
		return st;
	/* a checkpoint's agreed outcome: every rank knows, its message names
	 * this rank, rank 0 and the cause (not "rank 0 was lost" when rank
	 * 0 exits first) */
	if (d->agreed && dist_names_rank(d, kiln_last_error()))
		return st;
	d->failed = 1;
	/* explained already by an earlier call on the way out (a collective
	 * on a stream worker, then its sync; dist_peer_gone's "... before
	 * the ranks compared ..."): said once, not wrapped again (nor read
	 * as the communicator's by the words it quotes of the peer's,
	 * kiln_dist_failed_said) */
	if (dist_names_rank(d, kiln_last_error()) &&
	    strstr(kiln_last_error(), ") failed with its own error (its log says why)")) {
		d->peer_blamed = 1;
		return st;
	}
	/* the store notices a dead process when its connection closes;
	 * give it a moment to have seen it (lost_wait_ms; the query sets
	 * its own message) */
	char *msg = kiln_strdup(kiln_last_error());
	if (kiln_store_oom(d->store))
		return oom_own(d, msg);
	/* a peer that failed with its own error first: no lost rank to
	 * wait for (it left saying goodbye) */
	const int failed = from_comm(d, msg) ? failed_peer(d) : -1;
	int lost = failed >= 0 ? failed : kiln_store_lost_rank(d->store, lost_wait_ms(d, st, msg));
	if (kiln_store_oom(d->store)) /* (in those questions) */
		return oom_own(d, msg);
	char host[64] = "?", key[48];
	void *v = NULL;
	snprintf(key, sizeof key, "kiln/host/%d", lost);
	if (lost >= 0 && !kiln_store_peek(d->store, key, &v, NULL) && v)
		snprintf(host, sizeof host, "%s", (const char *)v);
	free(v);
	if (lost >= 0 && msg && strstr(msg, " was lost (host "))
		st = kiln_error(st, "%s", msg); /* explained already (a stream worker's failure) */
	else if (failed >= 0) {
		char said[FAILED_SAID_MAX];
		kiln_dist_failed_said(d->store, failed, said, sizeof said);
		st = kiln_error(st, "rank %d of %d: rank %d (host %s) failed with its own error (its log says why): %s%s",
				d->env.rank, d->env.world, failed, host, msg ? msg : "", said);
	}
	else if (lost >= 0 && d->pipe_P) /* [dist] pipeline: name its stage too */
		st = kiln_error(st, "rank %d of %d (pipeline stage %d): rank %d (stage %d of pipe %d) was lost (host %s: its process exited, its host went down or its connection closed): %s",
				d->env.rank, d->env.world, d->env.rank % d->pipe_P, lost,
				lost % d->pipe_P, lost / d->pipe_P, host, msg ? msg : "");
	else if (lost >= 0)
		st = kiln_error(st, "rank %d of %d: rank %d was lost (host %s: its process exited, its host went down or its connection closed): %s",
				d->env.rank, d->env.world, lost, host, msg ? msg : "");
	/* the store's loss before a message that names this rank: the
	 * communicator's own begin "rank N of W:" too (gloo's recv from the
	 * dead stage-0 rank), and read as explained when they were not
	 * (before session 38; docs/distributed.md section 11) */
	else if ((lost == KILN_STORE_GONE || lost == KILN_STORE_SILENT) &&
		 !(dist_names_rank(d, msg) && explained(msg)))
		st = store_failed(d, st, lost, msg);
	else if (dist_names_rank(d, msg)) /* (explained already, or an agreed outcome) */
		st = kiln_error(st, "%s", msg);
	else if (from_comm(d, msg) && st == KILN_ETIMEOUT)
		st = stuck_explain(d, st, msg);
	else if (from_comm(d, msg))
		st = closed_explain(d, st, msg);
	else /* this rank's own failure (a file, the device): as it was */
		st = kiln_error(st, "rank %d of %d: %s", d->env.rank, d->env.world, msg ? msg : "");
	/* a peer's, the store's or the communicator's doing: no failure
	 * of this rank's own to tell the peers (close_mark_failed), nor the
	 * launcher (kiln_train_failed_own); a peer blamed already stays so
	 * (kiln_dist_finish's "rank N failed after the last collective",
	 * which names this rank: before session 40 it was cleared here, and
	 * the survivor said it failed of its own error) */
	d->peer_blamed = d->peer_blamed || lost >= 0 || lost == KILN_STORE_GONE ||
			 lost == KILN_STORE_SILENT || from_comm(d, msg);
	free(msg);
	return st;
}
