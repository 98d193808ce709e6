/* plugins/common/shmcoll.h - kiln's shared-memory collectives for ranks on
 * one node, compiled into the communicators that use them (kiln-mpi and
 * kiln-gloo; plugins/local.mk), never exported.
 *
 * The plugin maps the segments (an MPI_Win_allocate_shared window, or a
 * POSIX shared-memory object): one per rank, SHMCOLL_SEGMENT bytes, 64-byte
 * aligned, every rank's visible to every rank; it zeroes its own before
 * any rank's first collective (a barrier between).  The collectives then
 * synchronise through flags in the segments alone.
 *
 * Layout and protocol.  A segment is a header of two flags and two staging
 * buffers of SHMCOLL_CHUNK bytes.  A collective runs in rounds of at most
 * SHMCOLL_CHUNK bytes per rank; round s uses buffer s & 1:
 *   1. copy the part of this rank's data the others need into its buffer,
 *      then publish arrive = s (release);
 *   2. wait until every rank's arrive >= s (acquire);
 *   3. allreduce: reduce this rank's 1/world part of the round from every
 *      rank's buffer in rank order (its own part from its own memory),
 *      write it to its buffer and its output, publish reduced = s, and copy
 *      the other parts from their owners' buffers once their reduced >= s.
 *      Rounds of at most SHMCOLL_WHOLE bytes skip the second flag: every
 *      rank sums the whole round itself, in rank order.
 * A rank writes buffer b again at round s + 2 only after every rank
 * published arrive >= s + 1, which each does only after its last read of
 * round s: two buffers need no other synchronisation.  Sums are taken in
 * rank order in f32 (16-bit values widened, the result rounded once,
 * averages scaled before rounding), so every rank gets the same bits, and
 * the same inputs give the same bits again.
 *
 * Threads: one collective at a time per struct shmcoll (the callers'
 * streams order them); every rank must issue the same collectives in the
 * same order, as with MPI.  Errors: KILN_ETIMEOUT (with the host's
 * message) when a peer has not arrived shmcoll_grace_ns() after timeout_ms;
 * the plugin's own watchdog normally reports first.  KILN_EIO naming the
 * rank when the plugin's liveness check (shmcoll_watch) reports a peer
 * lost.  Nothing allocates. */
#ifndef KILN_PLUGINS_COMMON_SHMCOLL_H
#define KILN_PLUGINS_COMMON_SHMCOLL_H

#include <kiln/plugin.h>
#include "rank_name.h"
#include "shm_room.h" /* shm_room: before the plugins map */

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* a polling wait's pause between looks (shmcoll.c, shmp2p.c) */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* FUTEX_WAIT on a word another process shares (not FUTEX_PRIVATE), for at
 * most ns: returns at a wake-up, at the timeout, or at once when *w != v
 * (shmcoll.c, shmp2p.c) */
static inline void shm_futex_wait(void *w, unsigned v, long long ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ll), (long)(ns % 1000000000ll) };
	(void)syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}

/* wake every process sleeping on w */
static inline void shm_futex_wake(void *w)
{
	(void)syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#define SHMCOLL_CHUNK ((size_t)256 << 10) /* bytes per round and rank (PERFORMANCE.md part 7) */
#define SHMCOLL_WHOLE ((size_t)16 << 10)  /* rounds up to this size: one flag */
#define SHMCOLL_MAXW 64                   /* ranks the engine serves */
/* How long past [dist] timeout a wait goes on before it fails itself
 * (shmcoll.grace_ns, shmcoll_init's default): kiln-mpi's watchdog (which
 * looks ten times a second) reports a stuck collective first, at the
 * timeout, in its words.  Half the timeout, between 1 s (ten of the
 * watchdog's looks, on a loaded machine) and 5 s.  kiln-gloo has no
 * watchdog and sets no grace (since session 30; before, a stuck peer cost
 * it 1.5x the timeout: 4.8 s for 3 s).  A dead peer is not waited for:
 * shmcoll.lost names it within SHMCOLL_LOST_NS. */
#define SHMCOLL_GRACE_MIN_NS 1000000000ll
#define SHMCOLL_GRACE_MAX_NS 5000000000ll
static inline long long shmcoll_grace_ns(long long timeout_ns)
{
	const long long g = timeout_ns / 2;
	return g < SHMCOLL_GRACE_MIN_NS ? SHMCOLL_GRACE_MIN_NS
	       : g > SHMCOLL_GRACE_MAX_NS ? SHMCOLL_GRACE_MAX_NS : g;
}
#define SHMCOLL_LOST_NS 20000000ll        /* a wait asks shmcoll.lost this often */

/* A flag and the ranks asleep on it (futex on the flag's low 32 bits):
 * the poster makes the wake-up system call only when sleepers > 0. */
struct shmcoll_flag {
	_Alignas(64) atomic_long v;
	atomic_uint sleepers;
};

struct shmcoll_hdr {
	struct shmcoll_flag arrive;
	struct shmcoll_flag reduced;
	_Alignas(64) uint64_t cpus[8]; /* the CPUs (0-511) this rank may run on */
};

#define SHMCOLL_SEGMENT (sizeof(struct shmcoll_hdr) + 2 * SHMCOLL_CHUNK)

/* How a rank waits for the others (shmcoll.c, wait_flag), in three steps:
 *   1. polls with a pause instruction between them: SPIN for up to
 *      SHMCOLL_SPIN_NS (spin_ns with more ranks than the CPUs they may run
 *      on together: the union of their affinity masks, as mpirun binds
 *      each rank to a core of its own, a cpuset limits them all), YIELD
 *      and SLEEP for spin_ns;
 *   2. then a sched_yield() (SPIN, YIELD) or a nap (SLEEP) between polls,
 *      up to SHMCOLL_LONG_NS of waiting; not for SPIN when the ranks
 *      outnumber their CPUs and the wait has a futex (wait_flag: `futex`
 *      in shmcoll_pace): a yield beside other runnable threads gives the
 *      CPU to each of them for its slice (3.7-6.9 ms per 4 KiB allreduce,
 *      2 ranks and 2 busy loops on one CPU), a futex sleep to the peer
 *      the scheduler wakes (54-77 us);
 *   3. then sleeps on the flag (futex on its low 32 bits, the sleepers
 *      counted in the flag's line, so that the poster makes the wake-up
 *      system call only when someone sleeps) in naps of SHMCOLL_LOST_NS,
 *      asking the liveness check and the clock.
 * Steps 1 and 2 last only while the core is the wait's alone: a look at
 * the clock (every 256 polls, each yield or nap) that finds more than
 * SHMCOLL_TURN_NS gone (beyond a nap and its timer slack) means another
 * thread ran on it, and the wait goes to step 3 at once.  Spinning on
 * while a peer waited for a CPU held the core that peer needed: under two
 * busy loops the 2-rank check_comm made ~130 collectives a second against
 * ~8,000 idle, and a futex sleeper is woken sooner than a spinner gets its
 * core back (docs/PERFORMANCE.md, "Session 12: shared-memory waits under
 * load"). */
enum { SHMCOLL_SPIN, SHMCOLL_YIELD, SHMCOLL_SLEEP };
#define SHMCOLL_SPIN_NS 5000000ll  /* SPIN's step 1 at most */
#define SHMCOLL_LONG_NS 5000000ll  /* steps 1 and 2 at most */
#define SHMCOLL_TURN_NS 50000ll    /* a turn longer: another thread had the core */

/* One wait's pace through those steps, for any wait that looks at a
 * condition in a loop: shmcoll's flags, and kiln-mpi's MPI_Test loop,
 * which has no futex to sleep on and naps instead (shmcoll_pace_nap).
 *   shmcoll_pace_init(&p, how, yields, spin_ns, &nap, every);
 *   while (!done()) {
 *           if (shmcoll_pace_poll(&p)) continue;   (a pause, no clock)
 *           t = watchdog_now_ns(); ... the caller's timeout checks ...
 *           if (shmcoll_pace_next(&p, t, t - t0) == SHMCOLL_STEP_SLEEP)
 *                   sleep on the condition, or shmcoll_pace_nap(&p);
 *   }
 * `every`: polls between looks at the clock (a power of 2: 256 for a
 * flag's load, 1 for an MPI_Test, whose progress engine takes longer than
 * a look at the clock); `yields`: SPIN polls only spin_ns (the ranks
 * outnumber their CPUs). */
enum { SHMCOLL_STEP_POLL, SHMCOLL_STEP_YIELD, SHMCOLL_STEP_NAP, SHMCOLL_STEP_SLEEP };
#define SHMCOLL_NAP_MAX_NS 1000000ll /* shmcoll_pace_nap's longest nap */

struct shmcoll_pace {
	int how, yields, step, napped;
	int futex;                   /* the caller sleeps on a futex at step 3 */
	unsigned every, k;
	long long spin_ns, nap_ns;   /* step 2's nap */
	long long nap3_ns;           /* shmcoll_pace_nap's next nap */
	long long last;              /* when the last pause ended (0: none yet) */
};

void shmcoll_pace_init(struct shmcoll_pace *p, int how, int yields, long long spin_ns,
		       long long nap_ns, unsigned every);

/* A poll between looks at the clock: 1 when it paused (the caller looks
 * at its condition again), 0 when the clock is due (shmcoll_pace_next). */
static inline int shmcoll_pace_poll(struct shmcoll_pace *p)
{
	if (p->step == SHMCOLL_STEP_POLL && (++p->k & (p->every - 1))) {
		cpu_relax();
		return 1;
	}
	return 0;
}

/* The next step at t, `waited` ns into the wait: pauses for steps 1 and 2
 * (a poll's pause, a yield, a nap) and returns which; for step 3 returns
 * SHMCOLL_STEP_SLEEP at once, the caller's to take (once there, a wait
 * stays there). */
int shmcoll_pace_next(struct shmcoll_pace *p, long long t, long long waited);

/* Step 3 without a futex: a nap of nap_ns at first, twice as long at each
 * call up to SHMCOLL_NAP_MAX_NS, so that a wait past step 2 wakes at most
 * ~1,000 times a second while it adds at most about the nap's length
 * (the time already slept, and 1 ms) to its end. */
void shmcoll_pace_nap(struct shmcoll_pace *p);

struct shmcoll {
	const struct kiln_host *host;
	const char *who;               /* the plugin's name, for messages */
	int rank, world, timeout_ms;
	long long grace_ns;            /* a wait fails timeout_ms + this after it began */
	int oversubscribed;            /* more ranks than the CPUs they may run on; -1: not known yet */
	long long spin_ns;
	struct timespec nap;
	long seq;                      /* the last round this rank started */
	const int *world_of;           /* shmcoll_name_world's or _node's, or NULL */
	int node;                      /* shmcoll_name_node's node + 1; 0: none */
	int (*lost)(void *arg);        /* shmcoll_watch's check, or NULL */
	void *lost_arg;
	struct shmcoll_hdr *hdr[SHMCOLL_MAXW];
	char *buf[SHMCOLL_MAXW];
	char *region[SHMCOLL_MAXW];    /* a shared buffer every rank maps (shmcoll_region) */
	size_t region_bytes;
	long region_calls;             /* allreduces that took the region's copy-free path */
};

/* Point s at the mapped segments (seg[r]: rank r's) and zero this rank's;
 * the caller then makes every rank wait for every other (a barrier) before
 * the first collective.  KILN_EUSAGE beyond SHMCOLL_MAXW ranks. */
kiln_status shmcoll_init(struct shmcoll *s, const struct kiln_host *host, const char *who,
			 int rank, int world, void *const *seg, int timeout_ms, long long spin_ns,
			 long long nap_ns);

/* Declare a buffer every rank has mapped: base[r] is rank r's, `bytes`
 * each (64-byte aligned).  An allreduce of a range of it (at the same
 * offset on every rank) then moves no data through the staging buffers:
 * after every rank has arrived, each sums its 1/world share of the range
 * from every rank's buffer, in rank order, and writes the result into
 * every rank's buffer; it returns once every rank has written its share.
 * Same bits as the staged path.  One region; a second replaces the first. */
void shmcoll_region(struct shmcoll *s, void *const *base, size_t bytes);

/* s serves a split's group (comm ops split) whose rank r is world rank
 * world_of[r] (borrowed for s's life): its messages name world ranks
 * ("mpi: world rank 2 (rank 0 of 2 of a split): world rank 3 is gone"),
 * as the group's ranks mean nothing to the user.  NULL: the ranks are
 * the world's. */
void shmcoll_name_world(struct shmcoll *s, const int *world_of);
/* s serves node `node`'s ranks (kiln-gloo's hierarchical allreduce),
 * whose local rank r is world rank world_of[r] (borrowed for s's life):
 * its messages name "rank W (node N's local rank R of L)" and "rank W
 * (node N's local rank R)", as the node's setup does. */
void shmcoll_name_node(struct shmcoll *s, const int *world_of, int node);

/* For messages: shm_name_me and shm_name_peer (rank_name.h, included above). */

/* Give the waits a liveness check: a wait that has lasted SHMCOLL_LOST_NS
 * calls lost(arg), and again every SHMCOLL_LOST_NS, on the waiting thread;
 * it returns a rank whose process is gone, or -1.  The wait then fails
 * with KILN_EIO naming that rank instead of spinning until the timeout
 * (for ranks no launcher stops when one dies: torchrun, Slurm).  lost must
 * not allocate and should cost microseconds.  Call after shmcoll_init;
 * without it (kiln-mpi: mpirun ends the job) only the timeout applies. */
void shmcoll_watch(struct shmcoll *s, int (*lost)(void *arg), void *arg);

/* s serves a group split from parent's ranks (comm ops split), on the
 * same CPUs as all of them: when parent's ranks outnumber their CPUs, s's
 * waits yield as parent's do, though s's own ranks may not outnumber them
 * (2 of 4 ranks on 2 CPUs: the group's spinning wait held a CPU that the
 * other group's ranks needed, and each of a staged allreduce's rounds
 * could wait out a time slice; docs/PERFORMANCE.md, issue 21 session 8).
 * Call after both have met (their CPUs posted). */
void shmcoll_inherit(struct shmcoll *s, struct shmcoll *parent);
/* Whether s's waits yield the CPU between polls (its ranks, or its
 * parent's, outnumber their CPUs) rather than spin. */
int shmcoll_yields(struct shmcoll *s);


/* buf[0..count) of dtype (KILN_F32, KILN_BF16, KILN_F16) summed over the
 * ranks and multiplied by scale, in place (without staging when buf lies
 * in the region: every rank's must then lie at the same offset). */
kiln_status shmcoll_allreduce(struct shmcoll *s, int how, void *buf, size_t count, int dtype,
			      float scale);

/* recv[0..count) = scale * sum over ranks of their send[rank * count ..
 * + count). */
kiln_status shmcoll_reduce_scatter(struct shmcoll *s, int how, const void *send, void *recv,
				   size_t count, int dtype, float scale);

/* recv[r * bytes .. + bytes) = rank r's send, for every r; in place when
 * send is this rank's block of recv. */
kiln_status shmcoll_allgather(struct shmcoll *s, int how, const void *send, void *recv,
			      size_t bytes);

#endif
