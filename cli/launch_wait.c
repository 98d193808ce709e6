/* cli/launch_wait.c - `kiln launch` waiting for its ranks: signals passed
 * on to their process groups (once per --grace s), Ctrl-Z, a rank's end
 * judged (a wrapper ended by a stop passed on is judged by its group, once
 * empty; a repeated signal gives it --grace s), a
 * failure stopping the others, the verdict.  See cmd_launch.c's head
 * comment and docs/distributed.md, "kiln launch". */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cli.h"    /* cli_now_s */
#include "launch.h"
#include "../plugins/common/shm_stale.h" /* shm_stale_sweep: a dead rank 0's kiln-gloo object */

#include <errno.h>
#include <poll.h> /* ppoll */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void launch_describe_status(int ws, char *buf, size_t n)
{
	if (WIFEXITED(ws))
		snprintf(buf, n, "exit status %d", WEXITSTATUS(ws));
	else if (WIFSIGNALED(ws))
		snprintf(buf, n, "signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
	else
		snprintf(buf, n, "status %d", ws);
}

/* Signal a rank: its whole process group (each rank leads its own,
 * launch_rank and launch_spawn), so that what a wrapping rank command
 * (`sh -c`, `timeout`, a profiler) forked gets it too, as a terminal's
 * Ctrl-C reaches a whole foreground job; before session 33 only the
 * rank's pid did, and a wrapper that passed nothing on (a shell's trap, a
 * shell that dies of it) left the trainer below it running with no stop
 * and no checkpoint.  Else the rank alone (a group already gone).  A
 * trainer that gets the signal from both its wrapper and the group takes
 * it once (cli/cmd_train.c: a repeat within 5 s is the same stop). */
void launch_rank_kill(pid_t pid, int sig)
{
	if (kill(-pid, sig))
		kill(pid, sig);
}

/* One local rank's end, as launch_wait follows it. */
struct rank_end {
	int by_stop;   /* its command ended by a signal the launcher passed on ... */
	int leader_ws; /* ... with this status: its outcome is then its group's */
	double stop_at; /* ... at this time; whether the user was told how to
			 * end a wait that went on --grace s past it
			 * (launch_group_hint) */
	int hinted;
	int clean;     /* a process of its group below its command exited 0
			* (its verdict once the group is empty; no end of
			* the wait: launch_group_waits) */
	/* a process of its group below its command that failed meanwhile
	 * (the failure that says most, exit_rank): judged once the group is
	 * empty (launch_group_done), not at once: it may be a helper beside
	 * the trainer (a cleanup trap's exit 1) */
	int below_failed, below_ws;
	pid_t below_pid;
	/* processes of its group the launcher's SIGKILL ended (launch_groups_left:
	 * they outlived the repeated signal, ignoring it): no failure of
	 * their own; the rank stopped if a process below exited 0 */
	int n_killed;
	/* its command died of the repeated signal passed on (it still ran
	 * then), and its trainer's clean stop was said (LAUNCH_STOPPED_LINE,
	 * launch_read_pipe) */
	int leader_cut, said_stopped;
	/* what is left of its group once every rank's command ended: when
	 * it is killed (0: no deadline yet, launch_groups_left), and
	 * whether it was */
	double until;
	int killed;
	/* its trainer said it failed of its own error (LAUNCH_FAILED_LINE):
	 * the how-manieth rank to say so (1, 2, ...; 0: it did not), and its
	 * message (malloc'd) */
	int said_own;
	char *said;
};

/* launch_wait's state. */
struct launch_state {
	int alive, failed, fail_status, first;
	int owns; /* ranks that said they failed of their own error so far */
	int forwards; /* signals passed on so far (launch_forward) */
	int stopping; /* launch_fail stopped the other ranks (SIGTERM, kill_at) */
	double kill_at, fwd_at;
	struct rank_end *end;
	/* each rank's process group (its first pid: launch_spawn), 0 once
	 * it is gone: what signals passed on reach once its command ended */
	pid_t *pgid;
	/* the ranks' pipe (KILN_LAUNCH_WHY_FD): a line not yet whole */
	char line[640];
	size_t have;
};

/* Pass the signal that arrived on to every rank (s->pgid[]: each rank's
 * process group, 0 once gone; its command may have ended before the
 * trainer below it), once: a repeat within
 * --grace seconds, and at least LAUNCH_TRAINER_REPEAT_S, of the last one
 * passed on is dropped (Slurm, systemd and
 * `timeout` signal the launcher and, or twice, its group; each rank stops
 * gracefully on the first, cli/cmd_train.c), a later one is passed on
 * (the ranks then end at once).  s->fwd_at: when one was last passed on.
 * A repeat passed on also ends the no-deadline wait for the groups of
 * ranks whose command died of the stop (launch_group_waits): what is left
 * of them gets --grace s, then SIGKILL (launch_groups_left), since a
 * process there that ignores the signal (a shell's `&` job ignores
 * SIGINT, a `trap '' TERM`) would outlive any number of them; before
 * session 35 the launcher waited for it for ever. */
static void launch_forward(struct launch_opts *o, struct launch_state *s)
{
	int sig = launch_got_signal;
	launch_got_signal = 0;
	double now = cli_now_s();
	const int window = o->grace > LAUNCH_TRAINER_REPEAT_S ? o->grace : LAUNCH_TRAINER_REPEAT_S;
	if (s->fwd_at && now - s->fwd_at < window) {
		fprintf(stderr, "kiln launch: %s again within %d s: already passed on, ignored\n",
			strsignal(sig), window);
		return;
	}
	s->fwd_at = now;
	s->forwards++;
	o->fwd_sigs |= 1u << sig;
	fprintf(stderr, "kiln launch: passing %s to every rank\n", strsignal(sig));
	for (int l = 0; l < o->nproc; l++)
		if (s->pgid[l])
			launch_rank_kill(s->pgid[l], sig);
	for (int l = 0; l < o->nproc && s->forwards > 1; l++)
		if (s->pgid[l] && s->end[l].by_stop && !s->end[l].until)
			fprintf(stderr, "kiln launch: %s again: what is left of rank %d's process group (its command ended by the first) gets %d s, then SIGKILL\n",
				strsignal(sig), o->node_rank * o->nproc + l, o->grace);
}

/* Ctrl-Z (SIGTSTP; SIGTTIN, SIGTTOU) for the launcher, which alone is in
 * the terminal's foreground process group: the ranks, each in a group of
 * its own, would train on (before session 32 they did).  Stop them
 * (SIGSTOP), then this process by the same signal at its default action;
 * once it is continued (fg, bg, SIGCONT), continue them.  In an orphaned
 * process group the kernel stops nobody by SIGTSTP: raise() returns at
 * once and the ranks go on. */
static void launch_suspend(const struct launch_opts *o, const pid_t *groups)
{
	const int sig = launch_got_tstp;
	struct sigaction dfl, mine;
	sigset_t one;
	launch_got_tstp = 0;
	fprintf(stderr, "kiln launch: %s: stopping the ranks too (fg or bg continues them)\n",
		sig == SIGTSTP ? "SIGTSTP (Ctrl-Z)" : sig == SIGTTIN ? "SIGTTIN" : "SIGTTOU");
	/* the rank's whole group (rank_kill; groups[]: launch_forward) */
	for (int l = 0; l < o->nproc; l++)
		if (groups[l])
			launch_rank_kill(groups[l], SIGSTOP);
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, &mine);
	sigemptyset(&one);
	sigaddset(&one, sig);
	sigprocmask(SIG_UNBLOCK, &one, NULL);
	raise(sig); /* stopped here until continued */
	sigprocmask(SIG_BLOCK, &one, NULL);
	sigaction(sig, &mine, NULL);
	for (int l = 0; l < o->nproc; l++)
		if (groups[l])
			launch_rank_kill(groups[l], SIGCONT);
}

/* SIGCHLD's handler: nothing to do; its arrival ends launch_sleep's
 * ppoll (the default disposition, ignore, would not) */
void launch_on_child(int sig) { (void)sig; }

/* Sleep until a signal arrives (a rank's exit: SIGCHLD; SIGINT, SIGTERM,
 * SIGUSR1) or the deadline (0: none) passes.  The caller blocks those
 * signals (launch_wait) and ppoll unblocks them (to `open`) only while it
 * sleeps, so one that came since the caller last looked ends the sleep at
 * once instead of being lost. */
static void launch_sleep(double deadline, const sigset_t *open)
{
	struct timespec ts, *tp = NULL;
	if (deadline) {
		double left = deadline - cli_now_s();
		if (left <= 0)
			return;
		ts.tv_sec = (time_t)left;
		ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
		tp = &ts;
	}
	(void)ppoll(NULL, 0, tp, open); /* EINTR: a signal, the point */
}

/* One whole line from the ranks' pipe: a trainer's clean stop
 * (LAUNCH_STOPPED_LINE and its global rank) marks its local rank's end, a
 * failure of its own (LAUNCH_FAILED_LINE, its rank and message) is
 * counted for it (the first said only), any other is the cause of a stop
 * not the user's, the first into o->why. */
static void launch_pipe_line(struct launch_opts *o, struct launch_state *s, const char *line)
{
	const size_t n = strlen(LAUNCH_STOPPED_LINE), f = strlen(LAUNCH_FAILED_LINE);
	if (!strncmp(line, LAUNCH_STOPPED_LINE, n)) {
		const int l = atoi(line + n) - o->node_rank * o->nproc;
		if (l >= 0 && l < o->nproc)
			s->end[l].said_stopped = 1;
	} else if (!strncmp(line, LAUNCH_FAILED_LINE, f)) {
		char *e;
		const long l = strtol(line + f, &e, 10) - (long)o->node_rank * o->nproc;
		/* (a rank's number, then a space or the end: not a stray line) */
		const int number = e != line + f && (*e == ' ' || !*e);
		if (number && l >= 0 && l < o->nproc && !s->end[l].said_own) {
			s->end[l].said_own = ++s->owns;
			s->end[l].said = strdup(*e == ' ' ? e + 1 : e); /* (NULL: unquoted) */
		}
	} else if (!o->why[0]) {
		snprintf(o->why, sizeof o->why, "%s", line);
	}
}

/* What the ranks wrote to the launcher's pipe (non-blocking) so far:
 * each whole line to launch_pipe_line; read before every reap, so that
 * a trainer's line, written before it exits, is read by its end. */
static void launch_read_pipe(struct launch_opts *o, struct launch_state *s)
{
	if (o->why_fd[0] < 0)
		return;
	for (;;) {
		if (s->have == sizeof s->line - 1) { /* (a line too long: cut) */
			launch_pipe_line(o, s, s->line);
			s->have = 0;
		}
		const ssize_t k = read(o->why_fd[0], s->line + s->have, sizeof s->line - 1 - s->have);
		if (k <= 0)
			return;
		s->have += (size_t)k;
		s->line[s->have] = 0;
		char *nl;
		while ((nl = strchr(s->line, '\n'))) {
			*nl = 0;
			launch_pipe_line(o, s, s->line);
			s->have -= (size_t)(nl + 1 - s->line);
			memmove(s->line, nl + 1, s->have + 1);
		}
	}
}

/* A rank's exit that says why better than another's: an exit code of the
 * rank's own, 2 to 125 (2 usage or config, 3 data, 4 the run directory
 * lost mid-run, docs/training.md), names the cause; a plain failure
 * (exit 1: the usual end of a rank whose peer went away, or that stopped
 * with the others after rank 0's cause), a signal or a shell's 126 and up
 * follow from it.  Before session 34 only 2 and 3 counted: a run whose
 * directory was lost ended rank 0 with 4 and the others with 1, and the
 * launcher returned whichever it reaped first. */
static int exit_rank(int ws)
{
	return WIFEXITED(ws) && WEXITSTATUS(ws) >= 2 && WEXITSTATUS(ws) <= 125 ? 2 : 1;
}

/* Reap one ended child, if any: its pid (0: none) and status, and its
 * process group, read while it is a zombie (a rank's trainer below a
 * wrapper that died is this launcher's child: PR_SET_CHILD_SUBREAPER). */
static pid_t launch_reap(int *ws, pid_t *pgid)
{
	siginfo_t si;
	memset(&si, 0, sizeof si);
	if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) || !si.si_pid)
		return 0;
	*pgid = getpgid(si.si_pid);
	return waitpid(si.si_pid, ws, 0);
}

/* Whether local rank l's failure (status ws) says more than the one named
 * so far (s->failed): an exit that names a cause over one that follows
 * from one (exit_rank); between those alike, a rank whose trainer said it
 * failed of its own error over one that did not, the first to say so over
 * a later one (LAUNCH_FAILED_LINE); else the first reaped stays.  Before
 * session 39 the first reaped of two exits 1 was named: rank 0, which
 * read rank 1's failure in the store and exited at once, while rank 1
 * was still in its teardown (7 of 220 failed runs of a sweep over rank
 * 1's allocations of any size, as tests/dist_config_oom.sh's of 1 byte;
 * tests/launch_wait.sh 2d). */
static int says_more(const struct launch_opts *o, const struct launch_state *s, int l, int ws)
{
	const int a = exit_rank(ws), b = exit_rank(s->fail_status);
	if (a != b)
		return a > b;
	const int mine = s->end[l].said_own;
	const int theirs = s->end[s->failed - o->node_rank * o->nproc].said_own;
	return mine && (!theirs || mine < theirs);
}

/* Local rank l failed with status ws (pid p): name it; the first failure
 * that says most (says_more) is the one returned, a later one that says
 * more replaces it.  The first with stop_others stops the other ranks
 * (SIGTERM, SIGKILL after --grace); one without (launch_group_done: a
 * failure beside a clean exit in a group stopping) does not. */
static void launch_fail(const struct launch_opts *o, struct launch_state *s, pid_t *pids, int l,
			pid_t p, int ws, const char *what, int stop_others)
{
	char why[96];
	const int rank = o->node_rank * o->nproc + l;
	const int stop = stop_others && !s->stopping;
	/* a stop passed on already: the others stop by it (or fail at
	 * their next collective without this rank, naming it), and a
	 * SIGTERM 5 s or more after it would end them at once, unexplained
	 * (cli/cmd_train.c; before session 36): only the --grace deadline */
	const int term = stop && !o->fwd_sigs;
	launch_describe_status(ws, why, sizeof why);
	if (s->failed < 0 || says_more(o, s, l, ws)) {
		char then[160] = "";
		if (s->alive && term)
			snprintf(then, sizeof then, "; stopping the other ranks");
		else if (s->alive && stop)
			snprintf(then, sizeof then, "; the other ranks, stopping already by the signal passed on, get %d s, then SIGKILL",
				 o->grace);
		fprintf(stderr, "kiln launch: rank %d (%s %d) failed with %s%s\n", rank, what, (int)p,
			why, then);
		/* a later rank's own cause is what the first failure (its
		 * peer gone) followed from */
		if (s->failed >= 0)
			s->first = s->failed;
		s->failed = rank;
		s->fail_status = ws;
	}
	if (!stop)
		return;
	s->stopping = 1;
	for (int k = 0; k < o->nproc && term; k++)
		if (s->pgid[k])
			launch_rank_kill(s->pgid[k], SIGTERM);
	s->kill_at = cli_now_s() + o->grace;
}

/* Child p of status ws ended, of process group g: a rank's command
 * (pids[l]) or a process of a rank's group below it (a trainer under a
 * wrapper).  A command that died of a signal this launcher passed on
 * (a plain `sh -c` without exec dies of SIGTERM) is no failure by
 * itself: its rank's outcome is what its group below it does (before
 * session 34 it was "failed with signal 15" while the trainer below
 * wrote its checkpoint and exited 0). */
static void launch_ended(const struct launch_opts *o, struct launch_state *s, pid_t *pids, pid_t p,
			 int ws, pid_t g)
{
	const int ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
	const int fwd = WIFSIGNALED(ws) && WTERMSIG(ws) < 32 && (o->fwd_sigs & 1u << WTERMSIG(ws));
	for (int l = 0; l < o->nproc; l++) {
		struct rank_end *e = &s->end[l];
		if (pids[l] == p) {
			pids[l] = 0;
			s->alive--;
			/* (a group already empty: nothing below it stopped,
			 * the command itself ended by the signal) */
			if (fwd && s->pgid[l] && !(kill(-s->pgid[l], 0) && errno == ESRCH)) {
				e->by_stop = 1;
				e->leader_ws = ws;
				e->leader_cut = s->forwards > 1;
				e->stop_at = cli_now_s();
				fprintf(stderr, "kiln launch: rank %d's command (pid %d) ended by %s, which this launcher passed on: waiting for the rest of its process group (a trainer below it stops with its checkpoint where the ranks agree on the stop)\n",
					o->node_rank * o->nproc + l, (int)p, strsignal(WTERMSIG(ws)));
			} else if (!ok) {
				launch_fail(o, s, pids, l, p, ws, "pid", 1);
			}
			return;
		}
		/* (after a stop passed on, whether or not the command has
		 * ended yet: a helper's trap may exit before the wrapper dies,
		 * and that exit was lost, its rank reported stopped cleanly,
		 * session 35's merge) */
		if (!s->pgid[l] || s->pgid[l] != g || !(e->by_stop || o->fwd_sigs))
			continue;
		/* ended by the repeat passed on (a trainer ends at once by a
		 * repeat LAUNCH_TRAINER_REPEAT_S after its stop), or by this
		 * launcher's SIGKILL of what outlived it (ignoring the signal);
		 * before session 36 the first counted as no failure (the rank
		 * "stopped" beside a helper's exit 0, its trainer cut short),
		 * the second as one ("failed with signal 9" after trainers
		 * that had stopped cleanly) */
		const int cut = fwd && s->forwards > 1;
		const int killed = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL && e->killed;
		if (ok) {
			e->clean = 1;
		} else if (killed) {
			e->n_killed++;
		} else if (!fwd || cut) { /* the trainer below, or a helper, failed */
			if (!e->below_failed || exit_rank(ws) > exit_rank(e->below_ws)) {
				e->below_ws = ws;
				e->below_pid = p;
			}
			e->below_failed = 1;
			char why[96];
			launch_describe_status(ws, why, sizeof why);
			fprintf(stderr, "kiln launch: rank %d: pid %d of its process group ended with %s after the %s passed on%s: judged once the group is empty\n",
				o->node_rank * o->nproc + l, (int)p, why, cut ? "repeated signal" : "stop",
				cut ? " (it had not stopped by then: no checkpoint of its own)" : "");
		}
		return;
	}
}

/* A rank whose group ended (or was killed): its outcome, when its
 * command died of a signal passed on (launch_ended).  A process below the
 * command that failed fails the rank with its status, judged only now:
 * before session 35 the first such exit failed the rank at once and the
 * other ranks, still on their way to the agreed stop point, were killed
 * --grace s later without a checkpoint, though it was a helper's (a
 * cleanup trap exiting 1 on the SIGTERM) and the trainer stopped fine.
 * With a process below that exited 0 too (perhaps the trainer) the
 * other ranks are not stopped: they already stop by the signal passed on,
 * and a SIGTERM more than 5 s after it would end them at once
 * (cli/cmd_train.c), a SIGKILL --grace s on without their checkpoint. */
static void launch_group_done(const struct launch_opts *o, struct launch_state *s, pid_t *pids,
			      int l)
{
	struct rank_end *e = &s->end[l];
	const pid_t g = s->pgid[l];
	s->pgid[l] = 0;
	if (!e->by_stop)
		return;
	e->by_stop = 0;
	if (e->below_failed) {
		launch_fail(o, s, pids, l, e->below_pid, e->below_ws, "its process group's pid",
			    !e->clean);
		return;
	}
	/* the trainer said it stopped cleanly: what the repeat or the kill
	 * ended after it was not the trainer (a wrapper that died once its
	 * trainer exited, a helper that ignored the signal) */
	if (e->said_stopped && !(e->clean && !e->killed)) {
		fprintf(stderr, "kiln launch: rank %d stopped: its trainer stopped with its checkpoint at the signal this launcher passed on%s\n",
			o->node_rank * o->nproc + l,
			e->killed ? "; what was left of its process group, ignoring the signal, was killed" : "");
		return;
	}
	if (e->said_stopped) {
		fprintf(stderr, "kiln launch: rank %d stopped: its command ended by %s, which this launcher passed on, and the processes below it exited 0\n",
			o->node_rank * o->nproc + l, strsignal(WTERMSIG(e->leader_ws)));
		return;
	}
	/* its command ran until the repeat ended it: the trainer below it
	 * was still on its way to its stop point (a helper's exit 0 beside
	 * it says nothing of it) */
	if (e->leader_cut) {
		launch_fail(o, s, pids, l, g, e->leader_ws, "pid", 1);
		return;
	}
	if (e->clean && !e->killed) {
		fprintf(stderr, "kiln launch: rank %d stopped: its command ended by %s, which this launcher passed on, and the processes below it exited 0\n",
			o->node_rank * o->nproc + l, strsignal(WTERMSIG(e->leader_ws)));
		return;
	}
	/* killed after a process below exited 0 and none failed: what was
	 * killed had outlived the repeated signal, ignoring it (a trainer
	 * ends by it at once), so the trainer's was the exit 0 */
	if (e->clean && e->n_killed) {
		fprintf(stderr, "kiln launch: rank %d stopped: its command ended by %s, which this launcher passed on, a process below it exited 0, and %d that ignored the signal %s killed\n",
			o->node_rank * o->nproc + l, strsignal(WTERMSIG(e->leader_ws)), e->n_killed,
			e->n_killed > 1 ? "were" : "was");
		return;
	}
	/* nothing below it stopped cleanly: ended by the signal, before it
	 * could stop (kiln train before its first step), or killed */
	launch_fail(o, s, pids, l, g, e->leader_ws, "pid", 1);
}

/* Whether what is left of rank l's process group is waited for with no
 * deadline, as a rank's own `kiln train` is: its command died of a stop
 * this launcher passed on and no rank failed, until the group is empty.
 * The trainer below takes the stop at the next point where the ranks
 * agree on one (a log point, the epoch's end), which may be far more
 * than --grace away: before this rule (session 34) its group was killed
 * --grace s after the wrapper died, before it wrote its checkpoint.  A
 * process of the group that exits 0 says nothing of the trainer: which
 * one is the trainer the launcher cannot tell (a profiler's child, a
 * helper the wrapper started, `sh -c 'kiln train ...; true'`), so the
 * whole group is waited for, and it counts as stopped cleanly only once
 * empty (launch_group_done); before session 35 such an early exit 0
 * brought back the --grace deadline and the trainer was killed before its
 * checkpoint.  A process of the group that outlives the trainer (one that
 * ignores the signal) is waited for as a hung direct trainer is: until a
 * repeated signal passed on, after which the group gets --grace s, then
 * SIGKILL (launch_forward); a failure of a rank that stopped the others
 * (launch_fail) brings back the deadline too.  A failure below a command
 * that died of the stop does not: it is judged once its group is empty
 * (launch_group_done). */
static int launch_group_waits(const struct launch_state *s, int l)
{
	const struct rank_end *e = &s->end[l];
	return e->by_stop && !s->stopping && s->forwards < 2;
}

/* Rank l's group, waited for with no deadline, still runs --grace s after
 * its command died of the stop: say once that it is waited for and that a
 * signal again ends the wait, as the trainer may be far from its stop
 * point, or done while a helper that ignores the signal keeps the group
 * going for as long as it runs (launch_forward). */
static void launch_group_hint(const struct launch_opts *o, struct rank_end *e, int l, double now)
{
	if (e->hinted || now < e->stop_at + o->grace)
		return;
	e->hinted = 1;
	fprintf(stderr, "kiln launch: rank %d's process group still runs %d s after its command ended: waiting for it to stop (a signal again gives it %d s, then SIGKILL)\n",
		o->node_rank * o->nproc + l, o->grace, o->grace);
}

/* Once every rank's command ended: wait (up to --grace s, or without a
 * deadline: launch_group_waits) for what is left of their process
 * groups, then SIGKILL it, and give up on a group still there 2 s after.
 * Returns 1 while any group is left to wait for. */
static int launch_groups_left(const struct launch_opts *o, struct launch_state *s, pid_t *pids)
{
	int left = 0, due = 0, due_stop = 0;
	const double now = cli_now_s();
	for (int l = 0; l < o->nproc; l++) {
		struct rank_end *e = &s->end[l];
		if (!s->pgid[l])
			continue;
		if (kill(-s->pgid[l], 0) && errno == ESRCH) {
			launch_group_done(o, s, pids, l);
			continue;
		}
		left++;
		if (launch_group_waits(s, l)) {
			launch_group_hint(o, e, l, now);
			continue;
		}
		if (!e->until)
			e->until = now + o->grace;
		if (now < e->until)
			continue;
		if (e->killed) { /* (killed a while ago and still there: given up) */
			launch_group_done(o, s, pids, l);
			left--;
		} else {
			due++;
			due_stop += e->by_stop;
		}
	}
	if (!due)
		return left > 0;
	if (due > due_stop)
		fprintf(stderr, "kiln launch: %d rank(s)' process groups still ran %d s after their commands ended: killing them\n",
			due - due_stop, o->grace);
	if (due_stop)
		fprintf(stderr, "kiln launch: %d rank(s)' process groups, waited for since their commands ended by the stop, still ran %d s after a repeated signal or a rank's failure: killing them\n",
			due_stop, o->grace);
	for (int l = 0; l < o->nproc; l++) {
		struct rank_end *e = &s->end[l];
		if (s->pgid[l] && e->until && now >= e->until && !e->killed) {
			kill(-s->pgid[l], SIGKILL);
			e->killed = 1;
			e->until = now + 2;
		}
	}
	return 1;
}

/* The blocked signals launch_wait takes between sleeps, into *block. */
static void launch_blocked(sigset_t *block)
{
	static const int sigs[] = { SIGCHLD, SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU };
	sigemptyset(block);
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaddset(block, sigs[i]);
}

/* The last line, for a run that failed: which rank, and why (its own
 * words where its trainer said them: LAUNCH_FAILED_LINE). */
static int launch_verdict(struct launch_opts *o, struct launch_state *s)
{
	char why[96];
	launch_describe_status(s->fail_status, why, sizeof why);
	launch_read_pipe(o, s);
	const char *said = s->end[s->failed - o->node_rank * o->nproc].said;
	char quote[sizeof s->line + 32] = "";
	if (said)
		snprintf(quote, sizeof quote, "; rank %d said: %s", s->failed, said);
	if (s->first < 0 && o->why[0])
		fprintf(stderr, "kiln launch: error: rank %d stopped (%s), not at the user's request: %s\n",
			s->failed, why, o->why);
	else if (s->first >= 0)
		fprintf(stderr, "kiln launch: error: rank %d failed (%s); rank %d, which ended first, followed from it%s\n",
			s->failed, why, s->first, quote);
	else
		fprintf(stderr, "kiln launch: error: rank %d failed (%s)%s\n", s->failed, why, quote);
	return WIFEXITED(s->fail_status) ? WEXITSTATUS(s->fail_status) : 1;
}

/* Wait for every rank (pids[], 0 once reaped) and then for what is left
 * of its process group (up to --grace s; a trainer below a wrapper that
 * died of a stop passed on, as long as a direct rank: launch_groups_left),
 * passing on signals; when one fails,
 * SIGTERM the others and SIGKILL them after the grace period.  Asleep
 * between events (launch_sleep), not polling, except while waiting for
 * groups (a process below a rank's command is not always this one's
 * child).  Returns the exit code: the failed rank's status that says
 * most (exit_rank; the first of those), else 0. */
int launch_wait(struct launch_opts *o, pid_t *pids)
{
	const int nproc = o->nproc;
	struct launch_state s = { .alive = nproc, .failed = -1, .first = -1 };
	struct rank_end end[nproc];
	pid_t pgid[nproc];
	sigset_t block, open;
	memset(end, 0, sizeof end);
	memcpy(pgid, pids, sizeof pgid);
	s.end = end;
	s.pgid = pgid;
	o->fwd_sigs = 0;
	launch_blocked(&block);
	sigprocmask(SIG_BLOCK, &block, &open);
	while (s.alive || launch_groups_left(o, &s, pids)) {
		if (launch_got_tstp)
			launch_suspend(o, pgid);
		if (launch_got_signal)
			launch_forward(o, &s);
		int ws;
		launch_read_pipe(o, &s);
		pid_t g = -1, p = launch_reap(&ws, &g);
		if (p > 0) {
			/* what a rank's process that is gone made in /dev/shm
			 * and could not unlink (kiln-gloo's object, killed
			 * before every rank had opened it: 9 MiB until reboot
			 * before session 40) */
			shm_stale_sweep(p, 0);
			launch_ended(o, &s, pids, p, ws, g);
			continue;
		}
		if (s.kill_at && cli_now_s() >= s.kill_at) {
			fprintf(stderr, "kiln launch: the other ranks did not exit within %d s: killing them\n",
				o->grace);
			for (int l = 0; l < nproc; l++)
				if (pgid[l])
					launch_rank_kill(pgid[l], SIGKILL);
			s.kill_at = 0;
		}
		if (launch_got_signal || launch_got_tstp)
			continue;
		/* groups: a look every 50 ms (their processes' ends need
		 * not reach this one as SIGCHLD) */
		double until = s.kill_at;
		if (!s.alive && (!until || until > cli_now_s() + 0.05))
			until = cli_now_s() + 0.05;
		launch_sleep(until, &open);
	}
	sigprocmask(SIG_SETMASK, &open, NULL);
	const int rc = s.failed < 0 ? 0 : launch_verdict(o, &s);
	for (int l = 0; l < nproc; l++)
		free(end[l].said);
	return rc;
}

