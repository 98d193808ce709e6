/* plugins/cpu/threads.h - how many OpenMP threads the CPU device's kernels
 * use: the starting team from the affinity mask and the cgroup CPU quota,
 * and the controller that shrinks the team while its threads wait for a
 * CPU (another process is busy on the same cores) and probes back up.
 *
 * The parsers and the controller's decision are pure functions of their
 * inputs (tests/check_cpu_threads.c); cpu_quota_read, cpu_run_delay_ns and
 * the live controller read /proc and /sys.  Nothing here calls OpenMP:
 * cpu.c applies the size (docs/PERFORMANCE.md, "Steady under contention").
 */
#ifndef KILN_PLUGINS_CPU_THREADS_H
#define KILN_PLUGINS_CPU_THREADS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct kiln_op;

/* ---- the starting team --------------------------------------------------- */

/* CPUs allowed by a cgroup v2 cpu.max ("QUOTA PERIOD" or "max PERIOD"):
 * QUOTA / PERIOD, or 0 for no limit (also for text it cannot read). */
double cpu_quota_v2(const char *cpu_max);
/* The same from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us
 * ("-1": no limit). */
double cpu_quota_v1(const char *quota_us, const char *period_us);
/* The cgroup path of this process from the text of /proc/self/cgroup:
 * the v2 line ("0::PATH") when controller is NULL, else the v1 line whose
 * controller list holds `controller` as one of its names ("cpu" is not
 * "cpuacct"): the CPU quota's ("cpu", cpu_quota_read) and the memory
 * limit's ("memory", cpu.c's cgroup_room).  Copies PATH into out (size n,
 * without the newline); returns 0, or -1 when there is no such line or it
 * is too long. */
int cpu_cgroup_path(const char *proc_cgroup, const char *controller, char *out, size_t n);
/* The team for `affinity` CPUs under a quota of `quota` CPUs (0 = none):
 * the quota rounded to the nearest whole CPU (1.5 -> 2, 1.4 -> 1), at
 * least 1, at most the affinity count. */
int cpu_threads_for(int affinity, double quota);
/* The smallest quota on this process's cgroup path, v2 (cpu.max) or v1
 * (cpu.cfs_quota_us), walking up to the root; 0 when none limits it.
 * stat (size n) gets the path of that cgroup's cpu.stat ("" for none). */
double cpu_quota_read(char *stat, size_t n);
/* Time the cgroup was throttled by its quota, from its cpu.stat text:
 * v1's "throttled_time NS" or v2's "throttled_usec US", in ns; -1 when
 * the text has neither. */
int64_t cpu_throttled_parse(const char *cpu_stat);

/* ---- ops that run on one thread on any team ------------------------------ */

/* A GEMM or convolution (any direction) below CPU_ONE_THREAD_FLOP
 * floating-point operations (2 M N K; 2 x output elements x C/g KH KW):
 * the CPU device prepares and runs it on one thread whatever the team, so
 * that its bytes never depend on the team (oneDNN splits a small op's sum
 * differently on 1 and 2 threads: the MLP's 128x256 -> 10 forward GEMM)
 * and it never waits at a barrier for a descheduled thread (dnnteam.c).
 * 1 for such an op, 0 for a larger one or any other op. */
#define CPU_ONE_THREAD_FLOP 4194304.0
int cpu_op_one_thread(const struct kiln_op *op);

/* ---- GEMMs split into parts ---------------------------------------------- */

/* A GEMM of CPU_SPLIT_FLOP or more on a device of 2 or more threads is
 * split into parts: blocks of about CPU_SPLIT_COLS columns of the product
 * (when it has at least twice that many and its f32 output fits
 * CPU_SPLIT_COLS_BYTES: a helper computes a block of columns into a buffer
 * as large as the output), else of about CPU_SPLIT_ROWS
 * rows, at most CPU_SPLIT_PARTS of them.  Each part runs on one thread,
 * by a primitive made for one thread, and the calling thread and the
 * helpers take the next part not yet taken (gemm.c, split.c;
 * docs/PERFORMANCE.md, "A late thread does not stall the team").
 * cpu_gemm_split returns a part's length (rows, or columns when *cols is
 * set) for op on a device of `threads` threads, or 0: not split.  The
 * parts depend on the op's shape alone, never on the team's size, so a
 * product's bytes are the same on any team of 2 or more.  Off by default
 * (it cost 37% of the quiet MLP step); $KILN_CPU_GEMM_SPLIT turns it on:
 * "auto" by the shape rule below, "rows:R" or "cols:C" splits every GEMM
 * of more than R rows (C columns) into parts of R (C); unset or "0"
 * splits none ("busy": see cpu_gemm_split_busy). */
#define CPU_SPLIT_FLOP 16777216.0
#define CPU_SPLIT_COLS 128
#define CPU_SPLIT_COLS_BYTES 8388608.0 /* columns only for outputs up to 8 MiB */
#define CPU_SPLIT_ROWS 64
#define CPU_SPLIT_PARTS 16
int64_t cpu_gemm_split(const struct kiln_op *op, int threads, int *cols);
/* The split a GEMM runs with while the adaptive team is smaller than its
 * opening size (another process is busy on a core; cpu_team_busy): the
 * same rule in blocks of rows only, whose parts oneDNN computes with the
 * whole GEMM's kernel, so that they give the unsplit plan's bytes
 * (dnnteam.c checks that on each plan before using it).  A part's length
 * in rows, or 0: not split.  Off unless $KILN_CPU_GEMM_SPLIT is "busy":
 * measured under contention it cost more than it gave. */
int64_t cpu_gemm_split_busy(const struct kiln_op *op, int threads);

/* ---- convolution weight gradients in blocks of the minibatch ------------- */

/* An f32 or bf16 CONV_BWD_WEIGHTS on a device of 2 or more threads (and
 * not run on one thread: cpu_op_one_thread) is computed in K fixed blocks
 * of the minibatch: each block's dw (and db, f32 for bf16 too) by a oneDNN
 * primitive made for one thread, into an f32 partial of its own, and the
 * partials added in block order; a team of n threads runs the blocks n at
 * a time, a team of one in turn (convsplit.c).  oneDNN's own kernel splits
 * the minibatch sum by its thread count, so its bytes differ between 1 and
 * 2 threads and the op stayed on the opening team under contention
 * (docs/PERFORMANCE.md, "Issue 22, session 10"; bf16: "Session 12").  K is
 * the largest divisor of the minibatch N of at most CPU_WSPLIT_BLOCKS;
 * when N has none above 1, K = min(CPU_WSPLIT_BLOCKS, N / 2) unequal
 * blocks, the first N % K of them one sample larger; 0 (not split) for
 * N < 2.  K depends on the op's shape alone.  $KILN_CPU_CONV_SPLIT (a test
 * hook): "0" splits none, a number K in 2..N splits in K blocks. */
#define CPU_WSPLIT_BLOCKS 8
int cpu_conv_wsplit(const struct kiln_op *op, int threads);

/* ---- the adaptive team ----------------------------------------------------- */

/* One interval's measurement: wall time, the run-queue delay summed over
 * the process's threads (time runnable but not running: descheduled), the
 * time the process's cgroup was throttled by its CPU quota, and the CPU
 * time other processes (and the hypervisor: steal) took on the CPUs of the
 * process's affinity mask.  A throttled cgroup stops every thread at once,
 * which stalls no barrier: the team's share of the delay it adds
 * (n x throttled) is not counted.  others_ns is the mask's CPUs' busy time
 * in /proc/stat (user, nice, system, irq, softirq, steal) less this
 * process's own CPU time (CLOCK_PROCESS_CPUTIME_ID), 0 when that difference
 * is negative (a reading, not an unknown); -1 when not known.  The delay counts the process's own threads competing too (the
 * loader's beside the team, the JIT at start-up); others_ns does not. */
struct cpu_team_sample {
	int64_t wall_ns;
	int64_t delay_ns;
	int64_t throttled_ns;
	int64_t others_ns;
};

/* The controller's state.  `max` is the team the device opened with (oneDNN
 * primitives may run with fewer threads than at creation, never more). */
struct cpu_team {
	int max;        /* the team never grows above this */
	int n;          /* the team now */
	int calm;       /* calm intervals in a row at n */
	int probe_wait; /* calm intervals before the next step up */
	int probing;    /* the last change was a step up not yet confirmed */
	int hot;        /* intervals in a row above CPU_TEAM_SHRINK */
	int intervals;  /* intervals fed, up to CPU_TEAM_SETTLE */
	int held;       /* intervals in a row the team has kept its size */
	int dnn;        /* the team oneDNN's plans run at: n at once when n
			 * falls below it, else once n has held
			 * CPU_TEAM_DNN_HOLD intervals (re-preparing them for a
			 * new size costs a JIT and a probe, dnnteam.c) */
	int cpus;       /* CPUs of the affinity mask others_ns counts (0: 1),
			 * for the threshold cpu_team_others_min */
	int crowd_down; /* the last step down was the crowded rule's, with no
			 * failed probe since: the probe waits for the others
			 * to leave (CPU_TEAM_GONE), not for probe_wait */
	int gone;       /* intervals in a row the others read below that */
	int trial;      /* intervals left of the last step up's trial
			 * (CPU_TEAM_PROBE_MIN from the step up): a crowded
			 * step down inside it brings no quick probe */
	int quick;      /* that step up was the quick probe: a step down
			 * inside its trial is its failure (probe_wait x 2) */
};

/* Thresholds, in threads waiting for a CPU on average over an interval
 * (delay_ns / wall_ns): above SHRINK the team may lose a thread; below
 * CALM an interval is calm.  Probe waits start at PROBE_MIN intervals and
 * double after each failed probe up to PROBE_MAX. */
#define CPU_TEAM_SHRINK 0.30
#define CPU_TEAM_CALM 0.10
/* When the team steps down.  Waiting above SHRINK while other processes
 * took CPU_TEAM_OTHERS CPUs or more of the affinity mask's (others_ns /
 * wall_ns) is contention at once, from the context's first interval on:
 * the team loses a thread that interval.  Waiting above SHRINK without
 * that (our own threads competing, a competitor in short bursts, or no
 * /proc/stat) steps down only after the first SETTLE intervals and then
 * SHRINK_HOT intervals in a row (a failed probe steps down after one).
 *
 * Why two signals: the waiting alone cannot tell a neighbour from the
 * process's own start-up.  The MLP's first two intervals (plans, JIT, the
 * loader's first batches filling beside the team) read 0.30-0.79 threads
 * waiting with or without a neighbour, later ones 0.11-0.23 quiet,
 * 0.16-0.29 beside a process busy 2 ms of every 20 ms (bench/contention.sh
 * jitter); a step down on the first reading above SHRINK made a run's
 * rate depend on its first 200 ms (41-48k samples/s on one thread against
 * 66-79k on two, quiet or jittered alike), which session 44 fixed with
 * SETTLE and SHRINK_HOT (quiet 47.0k -> 68.9k, jitter 48.0k -> 67.7k,
 * medians of 12 interleaved runs) at the price of stepping down 200 ms
 * later beside a busy loop (44.9k -> 41.7k on the MLP's 1.3 s epoch).
 * The other processes' CPU time tells them apart (session 45,
 * docs/PERFORMANCE.md "Session 45"): a busy loop read 0.87-1.15 CPUs an
 * interval (beside a team of one; 1.00-1.05 in the first two intervals
 * beside two threads), where the jitter process takes 0.1 of a core and
 * the start-up's waiting is the process's own, not in it.  OTHERS lies
 * between.  /proc/stat counts whole 10 ms ticks a CPU: each CPU's
 * reading over a 100 ms interval is off by up to +-0.1 (standard
 * deviation about 0.06), so the mask's sum is off by about 0.06 sqrt(K)
 * for K CPUs: +-0.1 holds for 1-2 CPUs only, about 0.46 is one
 * standard deviation at K = 64.  The threshold is therefore
 * cpu_team_others_min(K) = max(OTHERS, OTHERS_NOISE sqrt(K)), three
 * standard deviations of that noise: OTHERS up to K = 7 (where it was
 * measured), 1.44 at K = 64 (there one busy loop alone no longer counts
 * as crowded: the waiting-alone rule steps down 200 ms later).  A value
 * of OTHERS above any reading (1e9) turns the crowded rule off: every
 * step down then waits for SETTLE and SHRINK_HOT.  Each CPU's delta is
 * clamped to the interval and a CPU going on- or offline counts nothing
 * that interval (cpu_stat_busy_delta).  Measured on a 2-CPU machine other
 * sessions' builds loaded (load 6-15): those read 0.3-1.3 CPUs themselves, so there the team
 * also steps down at the first interval beside them; a quiet machine's
 * reading is not measured yet. */
#define CPU_TEAM_OTHERS 0.50
#define CPU_TEAM_OTHERS_NOISE 0.18 /* 3 x 0.06 CPUs a sqrt(CPU) */
/* The CPUs others must take for an interval to count as crowded, for a
 * mask of `cpus` CPUs (above). */
double cpu_team_others_min(int cpus);
/* A step up waits while other processes took more than the mask's CPUs
 * the team leaves free, less FREE (cpus - n - FREE CPUs: beside a busy
 * loop on 2 CPUs a team of 1 reads 0.85-1.00 and holds; a neighbour
 * taking 0.3 of a CPU does not stop the probe). */
#define CPU_TEAM_FREE 0.5
/* After a step down the crowded rule made (and no failed probe since:
 * probe_wait is still PROBE_MIN), the team probes one thread more once
 * other processes took less than GONE x cpu_team_others_min CPUs (0.25
 * up to 7 CPUs) for GONE_RUN intervals in a row, calm or not, rather than
 * after PROBE_MIN calm intervals: a neighbour that came and went in the
 * first interval (a process's start-up, python3's ~50 ms of a CPU) cost
 * the MLP's 1.3 s epoch most of it on one thread (session 45: 48k
 * samples/s against 61-71k).  Never while cpus_taken holds, nor after a
 * step down inside the last step up's first PROBE_MIN intervals (the
 * probe had not held): a quick probe's step down there, crowded or not,
 * is its failure and doubles the calm wait, so a neighbour that comes
 * back every few intervals (busy one interval in 4) does not flap the
 * team every 2 intervals (session 46, docs/PERFORMANCE.md). */
#define CPU_TEAM_GONE 0.5
#define CPU_TEAM_GONE_RUN 2
#define CPU_TEAM_SETTLE 1
#define CPU_TEAM_SHRINK_HOT 2
#define CPU_TEAM_PROBE_MIN 10
#define CPU_TEAM_PROBE_MAX 80
/* intervals a larger team size must hold before oneDNN's plans follow it */
#define CPU_TEAM_DNN_HOLD 3
/* the length of an interval: about 100 ms of work */
#define CPU_TEAM_INTERVAL_NS 100000000LL

void cpu_team_init(struct cpu_team *t, int max);
/* Feeds one interval; returns the team for the next one (t->n). */
int cpu_team_decide(struct cpu_team *t, const struct cpu_team_sample *s);

/* Run-queue delay of every thread of this process (the second field of
 * /proc/self/task/(tid)/schedstat), summed; -1 when the kernel does not
 * report it. */
int64_t cpu_run_delay_ns(void);
/* The same of the calling thread alone (/proc/thread-self/schedstat). */
int64_t cpu_self_delay_ns(void);

/* The busy time, in clock ticks (sysconf(_SC_CLK_TCK) a second), of the
 * CPUs c < n with cpus[c] set, from the text of /proc/stat: user + nice +
 * system + irq + softirq + steal of each "cpuC" line (guest time is within
 * user; idle and iowait are not busy; a kernel without steal's column
 * counts it 0).  Reads the "cpu" lines at the top and stops at the first
 * other line or an incomplete one (text cut short).  -1 when no line of a
 * CPU in the set was read. */
int64_t cpu_stat_busy(const char *proc_stat, const unsigned char *cpus, int n);
#define CPU_STAT_CPUS 1024 /* CPUs the live controller counts, as cpu_set_t */
/* The busy ticks of the CPUs c < n with cpus[c] set since the last call,
 * from the text of /proc/stat: each CPU's own delta from prev[c], clamped
 * to [0, wall_ticks] (a CPU is busy at most the interval), summed; prev
 * gets the new readings.  A CPU with no previous reading (prev[c] < 0:
 * the first call, or its line appeared: hotplug) counts 0 this interval,
 * and a CPU of the set whose line is missing gets prev[c] = -1, so no
 * since-boot total ever enters a sum.  -1 when no line of a CPU in the
 * set was read.  Lines are read as cpu_stat_busy's. */
int64_t cpu_stat_busy_delta(const char *proc_stat, const unsigned char *cpus, int n, int64_t *prev,
			    int64_t wall_ticks);

/* ---- the live controller (one per device context) ------------------------ */

/* Kernels may start on several threads (the caller, stream workers): each
 * reads `size`; the thread that finds an interval over takes `lock` (try
 * only: the others go on) to sample and decide.  A fixed team (`adapt` 0:
 * [run] threads set, or [plugin.cpu] adaptive = 0) of 2 or more is watched
 * the same way (`watch`) with `team` as a shadow that never applies, until
 * the adaptive rule would have stepped down once: cpu_team_tick says so
 * (cpu.c logs it at info level) and the watch ends. */
struct cpu_team_live {
	int adapt;            /* 0: `size` stays the opening team ([run] threads set) */
	int watch;            /* a fixed team watched for the hint (see above) */
	int size;             /* the team kiln's own loops use now (atomic) */
	int dnn_size;         /* the team oneDNN's plans use now (atomic, dnnteam.c) */
	int flip;             /* test hook $KILN_CPU_TEAM_FLIP: every `flip` ops
			       * both teams swap between the opening size and 1 */
	int64_t ticks;        /* ops seen (atomic; with flip only) */
	int64_t changes;      /* times `size` or `dnn_size` changed (atomic):
			       * a kernel timing that saw one ran on two teams
			       * (tune_time.c) */
	int64_t start_ns;     /* the interval's start, CLOCK_MONOTONIC (atomic) */
	int64_t start_delay;  /* cpu_run_delay_ns() then (under lock) */
	int64_t start_throttled; /* the quota cgroup's throttled time then */
	int64_t start_busy;   /* 0: the mask's CPUs' busy ticks were read then (-1: unknown) */
	int64_t *busy_prev;   /* each CPU's busy ticks then (cpu_stat_busy_delta) */
	int64_t start_cpu;    /* this process's CPU time then, ns */
	int64_t tick_ns;      /* a clock tick of /proc/stat, ns */
	int64_t intervals;    /* intervals sampled (under lock) */
	char *stat_text;      /* a buffer for /proc/stat's "cpu" lines */
	size_t stat_size;     /* its size: 256 bytes a line up to the mask's last CPU */
	unsigned char cpus[CPU_STAT_CPUS]; /* the affinity mask at open */
	char stat[4200];      /* that cgroup's cpu.stat, "" without a quota */
	struct cpu_team team; /* under lock */
	pthread_mutex_t lock;
};

/* flip: the test hook (0: off), only with adapt.  watch: watch a fixed
 * team for the hint (0 for a pipeline stage, whose share the user did
 * not set). */
void cpu_team_live_init(struct cpu_team_live *l, int threads, int adapt, int watch, int flip,
			const char *stat);
void cpu_team_live_destroy(struct cpu_team_live *l);
/* What an op's tick saw: the adaptive team's change of size (from: the old
 * size, 0 for none), or a fixed team's first interval on which the
 * adaptive rule would have stepped down (fixed_waits); with either, the
 * interval's number since the context opened (1 = the first), its threads
 * waiting for a CPU and the CPUs other processes took (-1: unknown). */
struct cpu_team_news {
	int from;
	int fixed_waits;
	int64_t interval;
	double load;
	double others;
};
/* The team for the op about to run: one clock read, and once an interval
 * is over, a sample and a decision (cpu_team_feed), reported in *news. */
int cpu_team_tick(struct cpu_team_live *l, struct cpu_team_news *news);
/* One interval's sample fed to the live controller (under its lock; pure
 * but for l): the adaptive team's decision applied, or a watched fixed
 * team's shadow decided, whose first step down sets news->fixed_waits and
 * ends the watch; a fixed team's `size` never changes.  news gets the
 * interval's numbers (s is interval number `interval`). */
void cpu_team_feed(struct cpu_team_live *l, const struct cpu_team_sample *s, int64_t interval,
		   struct cpu_team_news *news);
/* The advice the fixed team's hint gives: for a team set by [run] threads
 * (threads_set) a smaller count, or unset (0) unless deterministic (which
 * needs a fixed [run] threads: then 1 or fewer threads); else
 * [plugin.cpu] adaptive = 1. */
const char *cpu_team_hint_advice(int threads_set, int deterministic);
/* 1 while the adaptive team is below its opening size: its threads waited
 * for a CPU (or the flip hook says so); a GEMM then runs its busy split
 * when there is one (cpu_gemm_split_busy, dnnteam.c). */
static inline int cpu_team_busy(const struct cpu_team_live *l)
{
	return l->adapt && __atomic_load_n(&l->size, __ATOMIC_RELAXED) < l->team.max;
}
/* How many times either team has changed size since the context opened. */
static inline int64_t cpu_team_changes(const struct cpu_team_live *l)
{
	return __atomic_load_n(&l->changes, __ATOMIC_RELAXED);
}
/* The team oneDNN's plans run at now (cpu_team.dnn, or the flip). */
static inline int cpu_team_dnn(const struct cpu_team_live *l)
{
	return __atomic_load_n(&l->dnn_size, __ATOMIC_RELAXED);
}

/* ---- a pipeline stage's wait for its neighbour ---------------------------- */

/* A turn (one sched_yield) longer than this gave the core to another
 * thread: the core is not the stage's alone, and a sleeper's wake-up
 * preempts that thread sooner than a yielding watcher gets its turn back
 * (under load the watchers saw their event a median 1.5-5 ms after it
 * completed, the sleepers woke 31-49 us after it; docs/PERFORMANCE.md,
 * issue 21, session 10). */
#define CPU_WAIT_TURN_NS 50000
/* Whether a stage's stream keeps spinning on an event it has watched for
 * spun_ns, its last turn having taken turn_ns ([plugin.cpu] stage_spin_us
 * = limit_ns / 1000): within limit_ns, while the turns come back at once. */
static inline int cpu_spin_on(int64_t spun_ns, int64_t turn_ns, int64_t limit_ns)
{
	return spun_ns < limit_ns && turn_ns < CPU_WAIT_TURN_NS;
}

/* How a stage's wait for an event not yet complete ended (stream.c's
 * spin_wait): the event seen while every turn came back at once; a turn
 * that came back late (the core went to another thread: the event seen
 * then, or a sleep after it); a sleep at stage_spin_us; a sleep at once,
 * the spin backing off (cpu_spin_backoff); NONE: no wait. */
enum { CPU_WAIT_SEEN, CPU_WAIT_LATE, CPU_WAIT_LIMIT, CPU_WAIT_BACKOFF, CPU_WAIT_NONE };
/* A context's stage waits by how they ended (under the context's lock):
 * how many, how long after the event's record the stream went on (the
 * hand-off's latency in the device), and for LATE the late turns' length.
 * Logged when the context closes (stream.c's wait_tally_log), so that a
 * hand-off's latency is told apart: a spinner's look, or a sleeper's
 * wake-up (docs/pipeline.md, "Hand-offs between stage threads"). */
struct cpu_wait_tally {
	int64_t n[4];
	int64_t after_ns[4], after_max_ns[4];
	int64_t turn_ns; /* the late turns' sum */
	int64_t spins;   /* the waits that spun (SEEN, LATE, LIMIT after a spin) */
	int64_t own_late; /* LATE waits on the run's own device's event, which
			   * the back-off did not learn from (cpu_spin_learns) */
	int64_t lock_ns; /* those spins' retaking of the lock, summed */
};
/* The spin's back-off where the core is not the stage's alone: a turn
 * that came back late cost the waiter another thread's slice (ms on a busy
 * machine) even when the event was then done, where a sleeper is woken
 * with a preemption (at load 6-8 on 2 cores the waits that spun went on
 * 3.0-6.1 ms after the record, the sleepers 0.26-2.4 ms: docs/PERFORMANCE.md,
 * session 44).  So after a late turn the context's next `skip` waits sleep
 * at once, skip doubling with each late turn (1, 2, 4, ... up to
 * CPU_SPIN_BACKOFF_MAX).  Only a SEEN spin (the event seen with every turn
 * back at once) starts the doubling again from 1; a spin that reached
 * stage_spin_us (LIMIT) leaves it as it was.  A stage with a core of its
 * own keeps spinning; one that shares its core (or a busy machine) mostly
 * sleeps, trying a spin again now and then.  off ([plugin.cpu]
 * stage_backoff = 0): never, every wait spins.  (Under the context's lock.) */
#define CPU_SPIN_BACKOFF_MAX 64
struct cpu_spin_backoff {
	int off;  /* stage_backoff = 0: no wait ever skips its spin */
	int next; /* the skip the next late turn sets */
	int skip; /* waits left to sleep at once */
};
/* Whether a stage's wait on an event feeds and follows the back-off: not
 * when the event is the run's own device's (`run_own`: created by a
 * context that is no pipeline stage, kiln_device_options.stage = 0), a
 * peer stage's always, whatever either team's size (with [run] threads =
 * 3 on 2 stages the first has 2 threads, the second 1: the second's waits
 * on the first are ordinary hand-offs).  The stages' wait for the step's
 * start spans the run's own device's optimizer, whose team takes every
 * core, so that wait's turn comes back late whether or not the stage
 * shares its core, and the back-off made the step's first hand-off a
 * sleeper's wake-up (docs/PERFORMANCE.md, sessions 44 and 45). */
static inline int cpu_spin_learns(int run_own)
{
	return !run_own;
}
/* Whether this wait sleeps at once (and counts it off). */
static inline int cpu_spin_skip(struct cpu_spin_backoff *b)
{
	if (b->skip <= 0)
		return 0;
	b->skip--;
	return 1;
}
/* A spin ended how (CPU_WAIT_*): the next waits' back-off. */
static inline void cpu_spin_backoff(struct cpu_spin_backoff *b, int how)
{
	if (b->off)
		return;
	if (how == CPU_WAIT_LATE) {
		b->next = b->next ? (2 * b->next < CPU_SPIN_BACKOFF_MAX ? 2 * b->next : CPU_SPIN_BACKOFF_MAX) : 1;
		b->skip = b->next;
	} else if (how == CPU_WAIT_SEEN) {
		b->next = 0;
	}
}

static inline void cpu_wait_tally_add(struct cpu_wait_tally *w, int how, int64_t after_ns, int64_t turn_ns)
{
	if (how < 0 || how > CPU_WAIT_BACKOFF)
		return;
	after_ns = after_ns > 0 ? after_ns : 0;
	w->n[how]++;
	w->after_ns[how] += after_ns;
	if (after_ns > w->after_max_ns[how])
		w->after_max_ns[how] = after_ns;
	if (how == CPU_WAIT_LATE)
		w->turn_ns += turn_ns;
}
/* A wait that spun: its retaking of the lock, lock_ns long. */
static inline void cpu_wait_tally_spun(struct cpu_wait_tally *w, int64_t lock_ns)
{
	w->spins++;
	w->lock_ns += lock_ns;
}
/* The mean retaking of the lock after a spin, in microseconds (0: none). */
static inline double cpu_wait_tally_lock_us(const struct cpu_wait_tally *w)
{
	return w->spins ? (double)w->lock_ns / 1e3 / (double)w->spins : 0;
}

#endif
