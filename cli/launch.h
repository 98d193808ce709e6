/* cli/launch.h - `kiln launch`'s parts shared by its files (not
 * installed): cli/cmd_launch.c parses the options and starts the ranks,
 * cli/launch_wait.c waits for them, passing signals on and judging each
 * rank's end (the overview: cmd_launch.c's head comment). */
#ifndef KILN_CLI_LAUNCH_H
#define KILN_CLI_LAUNCH_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

/* What `kiln launch` was asked for. */
struct launch_opts {
	int nproc, nnodes, node_rank, grace, bind;
	int max_restarts, restart; /* --max-restarts; this start's number (0: the first) */
	int cmd;        /* argv index of the command */
	char host[256]; /* the rendezvous store's address ... */
	int port;       /* ... and port */
	/* a pipe the ranks write the cause of a stop not the user's to
	 * (KILN_LAUNCH_WHY_FD, cli/cmd_train.c): read and write end, -1 none;
	 * the first line a rank wrote */
	int why_fd[2];
	char why[640];
	/* a pipe whose write end only this launcher holds (CLOEXEC): its
	 * read end, inherited by every process of a rank (KILN_LAUNCH_ALIVE_FD),
	 * reads end-of-file once the launcher is gone, however it died
	 * (cli/cmd_train.c: launcher_watch); -1 none */
	int alive_fd[2];
	unsigned fwd_sigs; /* the signals passed on to the ranks (1u << sig) */
	/* the rank command `kiln` with none on PATH: this executable
	 * (launch_self), else "" */
	char self[4096];
};

/* A trainer's own window for a repeated stop signal (cli/cmd_train.c,
 * KILN_STOP_GRACE_S): a repeat within it is the same stop, a later one
 * ends the trainer at once.  The launcher passes a repeat on no sooner
 * (launch_forward): with --grace under it, a repeat the trainers ignored
 * still started the --grace deadline of a wrapped trainer's group, which
 * was then SIGKILLed on its way to its stop point (before session 36). */
#define LAUNCH_TRAINER_REPEAT_S 5

/* The line a trainer writes to KILN_LAUNCH_WHY_FD, with its global rank,
 * once it stopped at the user's request with its checkpoint (exit 0;
 * cli/cmd_train.c): below a wrapping rank command its exit may be a
 * wrapper's to see, not the launcher's, which then could not tell a
 * trainer that stopped cleanly from one a repeated signal cut short
 * (launch_wait.c: launch_group_done).  Any other line is the cause of a
 * stop not the user's. */
#define LAUNCH_STOPPED_LINE "kiln-stopped "

/* The line a trainer writes to KILN_LAUNCH_WHY_FD, with its global rank
 * and its error message ("kiln-failed 1 rank 1 of 2: ...: out of
 * memory"), when it fails of its own error, not one that followed from a
 * peer's (kiln_train_failed_own), as soon as that error is final (before
 * its teardown, which tells its peers): among ranks whose exits say as
 * much (launch_wait.c: exit_rank), the launcher names the first to say
 * so, not the first it reaps, and quotes it (session 39). */
#define LAUNCH_FAILED_LINE "kiln-failed "

/* Set by cmd_launch.c's handlers: the stop signal that arrived (SIGINT,
 * SIGTERM, SIGUSR1, SIGHUP), and Ctrl-Z's (SIGTSTP, SIGTTIN, SIGTTOU);
 * taken by launch_wait. */
extern volatile sig_atomic_t launch_got_signal;
extern volatile sig_atomic_t launch_got_tstp;

/* a wait status in words ("exit status 3", "signal 15 (Terminated)") */
void launch_describe_status(int ws, char *buf, size_t n);
/* signal a rank: its process group, else its pid alone */
void launch_rank_kill(pid_t pid, int sig);
/* SIGCHLD's handler: its arrival ends launch_wait's sleep */
void launch_on_child(int sig);
/* Wait for every rank (pids[], 0 once reaped) and what is left of its
 * process group, passing signals on; the run's exit code. */
int launch_wait(struct launch_opts *o, pid_t *pids);

#endif
