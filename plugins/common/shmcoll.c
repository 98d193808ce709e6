/* plugins/common/shmcoll.c - kiln's shared-memory collectives (shmcoll.h) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* CPU_COUNT */
#endif
#include "shmcoll.h"
#include "clones.h"
#include "half.h"
#include "watchdog.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

kiln_status shmcoll_init(struct shmcoll *s, const struct kiln_host *host, const char *who,
			 int rank, int world, void *const *seg, int timeout_ms, long long spin_ns,
			 long long nap_ns)
{
	memset(s, 0, sizeof *s);
	if (world > SHMCOLL_MAXW)
		return host->error(KILN_EUSAGE, "%s: %d ranks on one node: the shared-memory collectives serve at most %d",
				   who, world, SHMCOLL_MAXW);
	s->host = host, s->who = who, s->rank = rank, s->world = world;
	s->timeout_ms = timeout_ms;
	s->grace_ns = shmcoll_grace_ns((long long)timeout_ms * 1000000ll);
	s->spin_ns = spin_ns;
	s->nap = (struct timespec){ .tv_sec = nap_ns / 1000000000ll, .tv_nsec = nap_ns % 1000000000ll };
	s->oversubscribed = -1; /* every rank's CPUs are known after the barrier */
	for (int r = 0; r < world; r++) {
		s->hdr[r] = seg[r];
		s->buf[r] = (char *)seg[r] + sizeof(struct shmcoll_hdr);
	}
	memset(seg[rank], 0, sizeof(struct shmcoll_hdr));
	/* this rank's CPUs, for oversubscribed() */
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0)
		for (int c = 0; c < 512 && c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set))
				s->hdr[rank]->cpus[c / 64] |= 1ull << (c % 64);
	return KILN_OK;
}

void shmcoll_name_world(struct shmcoll *s, const int *world_of)
{
	s->world_of = world_of;
}

void shmcoll_name_node(struct shmcoll *s, const int *world_of, int node)
{
	s->world_of = world_of;
	s->node = node + 1;
}

/* This rank for messages: "WHO: " and shm_name_me's, or in a node's
 * group (shmcoll_name_node) "WHO: rank W (node N's local rank R of L)" */
static const char *name_me(const struct shmcoll *s, char *buf, size_t n)
{
	if (!s->node)
		return shm_name_me(buf, n, s->who, s->world_of, s->rank, s->world);
	snprintf(buf, n, "%s: rank %d (node %d's local rank %d of %d)", s->who, s->world_of[s->rank],
		 s->node - 1, s->rank, s->world);
	return buf;
}

/* Peer r for messages: shm_name_peer's, or in a node's group "rank W
 * (node N's local rank R)" */
static const char *name_peer(const struct shmcoll *s, char *buf, size_t n, int r)
{
	if (!s->node)
		return shm_name_peer(buf, n, s->world_of, r);
	snprintf(buf, n, "rank %d (node %d's local rank %d)", s->world_of[r], s->node - 1, r);
	return buf;
}

void shmcoll_watch(struct shmcoll *s, int (*lost)(void *arg), void *arg)
{
	s->lost = lost;
	s->lost_arg = arg;
}

/* Whether the ranks outnumber the CPUs they may run on together (the
 * union of the affinity masks each posted at init; the machine's count
 * when none could). */
static int oversubscribed(struct shmcoll *s)
{
	if (s->oversubscribed < 0) {
		int n = 0;
		for (int w = 0; w < 8; w++) {
			uint64_t m = 0;
			for (int r = 0; r < s->world; r++)
				m |= s->hdr[r]->cpus[w];
			n += __builtin_popcountll(m);
		}
		if (!n)
			n = (int)sysconf(_SC_NPROCESSORS_ONLN);
		s->oversubscribed = n > 0 && s->world > n;
	}
	return s->oversubscribed;
}

void shmcoll_inherit(struct shmcoll *s, struct shmcoll *parent)
{
	if (oversubscribed(parent))
		s->oversubscribed = 1;
}

int shmcoll_yields(struct shmcoll *s)
{
	return oversubscribed(s);
}

/* the futex word of flag f: its value's low 32 bits */
static unsigned *flag_word(struct shmcoll_flag *f)
{
	return (unsigned *)&f->v + (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__);
}

/* Publish *f = v, and wake the ranks asleep on it, if any.  Sequentially
 * consistent store and load against the sleeper's count-then-look
 * (sleep_on): either the poster sees the sleeper or the sleeper sees v. */
static void post(struct shmcoll_flag *f, long v)
{
	atomic_store(&f->v, v);
	if (atomic_load(&f->sleepers))
		shm_futex_wake(flag_word(f));
}

/* Step 3 of a wait: sleep on f until it changes from below v, a wake-up,
 * or SHMCOLL_LOST_NS. */
static void sleep_on(struct shmcoll_flag *f, long v)
{
	atomic_fetch_add(&f->sleepers, 1);
	const long cur = atomic_load(&f->v);
	if (cur < v)
		shm_futex_wait(flag_word(f), (unsigned)cur, SHMCOLL_LOST_NS);
	atomic_fetch_sub(&f->sleepers, 1);
}

/* A nap's own lateness that still counts as a quick turn: the kernel's
 * default timer slack. */
#define NAP_SLACK_NS 50000ll

void shmcoll_pace_init(struct shmcoll_pace *p, int how, int yields, long long spin_ns,
		       long long nap_ns, unsigned every)
{
	*p = (struct shmcoll_pace){ .how = how, .yields = yields, .step = SHMCOLL_STEP_POLL,
				    .every = every ? every : 1, .spin_ns = spin_ns,
				    .nap_ns = nap_ns, .nap3_ns = nap_ns > 0 ? nap_ns : NAP_SLACK_NS };
}

/* Which step of a wait (shmcoll.h, SHMCOLL_SPIN) comes next after
 * `waited` ns, the last turn (the time since the previous look, less a
 * nap's length) having taken turn ns. */
static int next_step(const struct shmcoll_pace *p, long long waited, long long turn)
{
	if (turn >= SHMCOLL_TURN_NS)
		return SHMCOLL_STEP_SLEEP; /* the core went to another thread: it is wanted */
	if (waited < p->spin_ns)
		return SHMCOLL_STEP_POLL;
	if (p->how == SHMCOLL_SPIN && !p->yields && waited < SHMCOLL_SPIN_NS)
		return SHMCOLL_STEP_POLL;
	if (p->how == SHMCOLL_SPIN && p->yields && p->futex)
		return SHMCOLL_STEP_SLEEP; /* the peer may need this very CPU: no yield */
	if (waited < SHMCOLL_LONG_NS)
		return p->how == SHMCOLL_SLEEP ? SHMCOLL_STEP_NAP : SHMCOLL_STEP_YIELD;
	return SHMCOLL_STEP_SLEEP;
}

int shmcoll_pace_next(struct shmcoll_pace *p, long long t, long long waited)
{
	if (p->step == SHMCOLL_STEP_SLEEP)
		return p->step;
	const long long turn = p->last ? t - p->last - (p->napped ? p->nap_ns + NAP_SLACK_NS : 0) : 0;
	p->step = next_step(p, waited, turn);
	p->napped = p->step == SHMCOLL_STEP_NAP;
	if (p->step == SHMCOLL_STEP_SLEEP)
		return p->step;
	if (p->step == SHMCOLL_STEP_POLL) {
		cpu_relax();
	} else if (p->step == SHMCOLL_STEP_YIELD) {
		sched_yield();
	} else {
		const struct timespec ts = { (time_t)(p->nap_ns / 1000000000ll),
					     (long)(p->nap_ns % 1000000000ll) };
		nanosleep(&ts, NULL);
	}
	p->last = watchdog_now_ns();
	return p->step;
}

void shmcoll_pace_nap(struct shmcoll_pace *p)
{
	const struct timespec ts = { (time_t)(p->nap3_ns / 1000000000ll),
				     (long)(p->nap3_ns % 1000000000ll) };
	nanosleep(&ts, NULL);
	p->nap3_ns = p->nap3_ns * 2 < SHMCOLL_NAP_MAX_NS ? p->nap3_ns * 2 : SHMCOLL_NAP_MAX_NS;
}

/* Wait until f->v >= v (see SHMCOLL_SPIN); what names the collective.
 * *t0 is when this phase of the collective began waiting (0: not yet;
 * set at the first look at the clock): the waits for every peer of one
 * phase share it, so a phase ends within the timeout however its peers
 * arrive. */
static kiln_status wait_flag(struct shmcoll *s, int how, struct shmcoll_flag *f, long v,
			     int peer, const char *what, long long *t0)
{
	struct shmcoll_pace p;
	long long ask = 0;
	shmcoll_pace_init(&p, how, how == SHMCOLL_SPIN && oversubscribed(s), s->spin_ns,
			  s->nap.tv_sec * 1000000000ll + s->nap.tv_nsec, 256);
	p.futex = 1;
	while (atomic_load_explicit(&f->v, memory_order_acquire) < v) {
		if (shmcoll_pace_poll(&p))
			continue;
		const long long t = watchdog_now_ns();
		if (!*t0)
			*t0 = t;
		if (!ask)
			ask = *t0 + SHMCOLL_LOST_NS;
		if (s->lost && t >= ask) {
			const int gone = s->lost(s->lost_arg);
			char me[96], g[64], pn[64];
			if (gone >= 0)
				return s->host->error(KILN_EIO, "%s: %s is gone (its process ended) while this rank waited for %s in the shared-memory %s",
						      name_me(s, me, sizeof me), name_peer(s, g, sizeof g, gone),
						      name_peer(s, pn, sizeof pn, peer), what);
			ask = t + SHMCOLL_LOST_NS;
		}
		if (t - *t0 > (long long)s->timeout_ms * 1000000ll + s->grace_ns) {
			char me[96], pn[64];
			return s->host->error(KILN_ETIMEOUT, "%s: %s did not reach the shared-memory %s within [dist] timeout = %.1f s",
					      name_me(s, me, sizeof me), name_peer(s, pn, sizeof pn, peer), what,
					      s->timeout_ms / 1000.0);
		}
		if (shmcoll_pace_next(&p, t, t - *t0) == SHMCOLL_STEP_SLEEP)
			sleep_on(f, v);
	}
	return KILN_OK;
}

/* Start this rank's next round: *seq its number, the result the offset of
 * its staging buffer (seq & 1) in every rank's segment. */
static size_t next_round(struct shmcoll *s, long *seq)
{
	*seq = ++s->seq;
	return (size_t)(*seq & 1) * SHMCOLL_CHUNK;
}

/* publish this rank's arrive flag for round seq, then wait for every rank's */
static kiln_status meet(struct shmcoll *s, int how, long seq, const char *what)
{
	long long t0 = 0;
	post(&s->hdr[s->rank]->arrive, seq);
	for (int r = 0; r < s->world; r++) {
		kiln_status st;
		if (r != s->rank && (st = wait_flag(s, how, &s->hdr[r]->arrive, seq, r, what, &t0)))
			return st;
	}
	return KILN_OK;
}

/* dst[i] = scale * sum over k of src[k][i], for i < n, the sum in f32 in
 * the order of src[], 16-bit values widened and the result rounded once.
 * (Storing to a second destination in the same pass measured 1.7x slower
 * at 4 MiB than this pass and a memcpy.) */
typedef float f32x16 __attribute__((vector_size(64)));
KILN_CLONES
static void sum_f32(float *dst, const float *const *src, int ns, size_t n, float scale)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		f32x16 v, w;
		memcpy(&v, src[0] + i, sizeof v);
		for (int k = 1; k < ns; k++) {
			memcpy(&w, src[k] + i, sizeof w);
			v += w;
		}
		if (scale != 1.0f)
			v *= scale;
		memcpy(dst + i, &v, sizeof v);
	}
	for (; i < n; i++) {
		float v = src[0][i];
		for (int k = 1; k < ns; k++)
			v += src[k][i];
		if (scale != 1.0f)
			v *= scale;
		dst[i] = v;
	}
}

static void sum_16(uint16_t *dst, const uint16_t *const *src, int ns, size_t n, float scale,
		   int dt)
{
	for (size_t i = 0; i < n; i++) {
		float v = 0;
		for (int k = 0; k < ns; k++)
			v += dt == KILN_BF16 ? half_bf16_f32(src[k][i]) : half_f16_f32(src[k][i]);
		if (scale != 1.0f)
			v *= scale;
		dst[i] = dt == KILN_BF16 ? half_f32_bf16(v) : half_f32_f16(v);
	}
}

static void sum(void *dst, const void *const *src, int ns, size_t n, float scale, int dt)
{
	if (dt == KILN_F32)
		sum_f32(dst, (const float *const *)src, ns, n, scale);
	else
		sum_16(dst, (const uint16_t *const *)src, ns, n, scale, dt);
}

static size_t esize(int dt)
{
	return dt == KILN_F32 ? 4 : 2;
}

/* where part r of a round of m elements begins, in elements (r = world:
 * m): parts are whole 64-byte lines except the last, and cover m */
static size_t part_at(size_t m, size_t es, int world, int r)
{
	const size_t w = (size_t)world, line = 64 / es, per = ((m + w - 1) / w + line - 1) / line * line;
	const size_t at = per * (size_t)r;
	return at < m && r < world ? at : m;
}

void shmcoll_region(struct shmcoll *s, void *const *base, size_t bytes)
{
	for (int r = 0; r < s->world; r++)
		s->region[r] = base[r];
	s->region_bytes = bytes;
}

/* the allreduce of region bytes [off, off + count * es) (shmcoll_region) */
static kiln_status region_allreduce(struct shmcoll *s, int how, size_t off, size_t count,
				    int dtype, float scale)
{
	const size_t es = esize(dtype), block = SHMCOLL_WHOLE / es;
	const int R = s->rank, W = s->world;
	const void *src[SHMCOLL_MAXW];
	kiln_status st;
	const long seq = ++s->seq;
	s->region_calls++;
	if ((st = meet(s, how, seq, "allreduce")))
		return st;
	/* this rank's share, a block at a time: summed into its own buffer
	 * (still in cache), then copied into every other rank's */
	const size_t p0 = part_at(count, es, W, R), p1 = part_at(count, es, W, R + 1);
	for (size_t i = p0; i < p1; i += block) {
		const size_t n = p1 - i < block ? p1 - i : block, at = off + i * es;
		for (int r = 0; r < W; r++)
			src[r] = s->region[r] + at;
		sum(s->region[R] + at, src, W, n, scale, dtype);
		for (int r = 0; r < W; r++)
			if (r != R)
				memcpy(s->region[r] + at, s->region[R] + at, n * es);
	}
	long long t0 = 0;
	post(&s->hdr[R]->reduced, seq);
	for (int r = 0; r < W; r++)
		if (r != R && (st = wait_flag(s, how, &s->hdr[r]->reduced, seq, r, "allreduce", &t0)))
			return st;
	return KILN_OK;
}

kiln_status shmcoll_allreduce(struct shmcoll *s, int how, void *buf, size_t count, int dtype,
			      float scale)
{
	if (!count)
		return KILN_OK;
	const uintptr_t p = (uintptr_t)buf, base = (uintptr_t)s->region[s->rank];
	if (base && p >= base && p - base <= s->region_bytes &&
	    count * esize(dtype) <= s->region_bytes - (p - base))
		return region_allreduce(s, how, p - base, count, dtype, scale);
	const size_t es = esize(dtype), chunk = SHMCOLL_CHUNK / es;
	const int R = s->rank, W = s->world;
	const void *src[SHMCOLL_MAXW];
	kiln_status st;
	for (size_t off = 0; off < count; off += chunk) {
		const size_t n = count - off < chunk ? count - off : chunk, bytes = n * es;
		long seq;
		const size_t b = next_round(s, &seq);
		char *mine = (char *)buf + off * es, *slot = s->buf[R] + b;
		if (bytes <= SHMCOLL_WHOLE) {
			/* one flag: every rank sums the whole round */
			memcpy(slot, mine, bytes);
			if ((st = meet(s, how, seq, "allreduce")))
				return st;
			for (int r = 0; r < W; r++)
				src[r] = s->buf[r] + b;
			sum(mine, src, W, n, scale, dtype);
			continue;
		}
		const size_t p0 = part_at(n, es, W, R) * es, p1 = part_at(n, es, W, R + 1) * es;
		memcpy(slot, mine, p0);
		memcpy(slot + p1, mine + p1, bytes - p1);
		if ((st = meet(s, how, seq, "allreduce")))
			return st;
		for (int r = 0; r < W; r++)
			src[r] = r == R ? mine + p0 : s->buf[r] + b + p0;
		sum(slot + p0, src, W, (p1 - p0) / es, scale, dtype);
		memcpy(mine + p0, slot + p0, p1 - p0);
		long long t0 = 0;
		post(&s->hdr[R]->reduced, seq);
		for (int r = 0; r < W; r++) {
			if (r == R)
				continue;
			const size_t q0 = part_at(n, es, W, r) * es, q1 = part_at(n, es, W, r + 1) * es;
			if ((st = wait_flag(s, how, &s->hdr[r]->reduced, seq, r, "allreduce", &t0)))
				return st;
			memcpy(mine + q0, s->buf[r] + b + q0, q1 - q0);
		}
	}
	return KILN_OK;
}

kiln_status shmcoll_reduce_scatter(struct shmcoll *s, int how, const void *send, void *recv,
				   size_t count, int dtype, float scale)
{
	const int R = s->rank, W = s->world;
	const size_t es = esize(dtype), line = 64 / es;
	const size_t chunk = SHMCOLL_CHUNK / es / (size_t)W / line * line;
	const void *src[SHMCOLL_MAXW];
	kiln_status st;
	for (size_t off = 0; off < count; off += chunk) {
		const size_t n = count - off < chunk ? count - off : chunk, bytes = n * es;
		long seq;
		const size_t b = next_round(s, &seq);
		/* part r of the round: rank r's block's [off, off + n) */
		for (int r = 0; r < W; r++)
			if (r != R)
				memcpy(s->buf[R] + b + (size_t)r * chunk * es,
				       (const char *)send + ((size_t)r * count + off) * es, bytes);
		if ((st = meet(s, how, seq, "reduce_scatter")))
			return st;
		for (int r = 0; r < W; r++)
			src[r] = r == R ? (const char *)send + ((size_t)R * count + off) * es
					: s->buf[r] + b + (size_t)R * chunk * es;
		sum((char *)recv + off * es, src, W, n, scale, dtype);
	}
	return KILN_OK;
}

kiln_status shmcoll_allgather(struct shmcoll *s, int how, const void *send, void *recv,
			      size_t bytes)
{
	const int R = s->rank, W = s->world;
	char *out = recv;
	kiln_status st;
	if (send != out + (size_t)R * bytes)
		memcpy(out + (size_t)R * bytes, send, bytes);
	for (size_t off = 0; off < bytes; off += SHMCOLL_CHUNK) {
		const size_t n = bytes - off < SHMCOLL_CHUNK ? bytes - off : SHMCOLL_CHUNK;
		long seq;
		const size_t b = next_round(s, &seq);
		memcpy(s->buf[R] + b, out + (size_t)R * bytes + off, n);
		if ((st = meet(s, how, seq, "allgather")))
			return st;
		for (int r = 0; r < W; r++)
			if (r != R)
				memcpy(out + (size_t)r * bytes + off, s->buf[r] + b, n);
	}
	return KILN_OK;
}
