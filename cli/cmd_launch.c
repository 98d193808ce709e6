/* cli/cmd_launch.c - `kiln launch`: start the local ranks of a data-parallel
 * run (docs/distributed.md).
 *
 *   kiln launch -n N [--nnodes M --node-rank K --master HOST:PORT] -- CMD...
 *
 * Starts N copies of CMD (usually `kiln train CONFIG`) with KILN_RANK,
 * KILN_WORLD_SIZE, KILN_LOCAL_RANK, KILN_LOCAL_WORLD_SIZE, KILN_MASTER_ADDR
 * and KILN_MASTER_PORT set: ranks K*N .. K*N+N-1 of N*M.  Each child runs
 * in its own process group (so a terminal's Ctrl-C reaches it once, through
 * us) and stops with us (PR_SET_PDEATHSIG: SIGHUP, which `kiln train` takes
 * as a stop it names).  SIGINT, SIGTERM, SIGUSR1 and SIGHUP are
 * forwarded to every rank's process group (launch_wait.c launch_rank_kill: a wrapping command's
 * children too), once per --grace seconds and at least the trainers' own 5
 * (launch_forward);
 * Ctrl-Z (SIGTSTP) stops the ranks, then the launcher (launch_suspend).
 * A rank command ended by a signal passed on (a wrapper that dies of it)
 * is no failure by itself: the launcher, the subreaper of what its ranks
 * fork, waits for the rest of its group, until it is empty and with no
 * deadline as for a direct rank, or until a repeated signal, which gives
 * it --grace s (launch_group_waits), and judges the rank by that, a
 * failure below the command only once its group is empty (launch_ended,
 * launch_group_done): a trainer's clean stop it says on the pipe
 * (LAUNCH_STOPPED_LINE), an end by the repeat is a failure, a process
 * the launcher's SIGKILL ended (it ignored both signals) is none.  A pipe whose write end only the launcher holds
 * (KILN_LAUNCH_ALIVE_FD) tells every process of the ranks when it is gone,
 * however it died.  When a rank exits non-zero or is killed, the
 * others get SIGTERM, then SIGKILL after a grace period, and `kiln launch`
 * exits with that rank's status (the first of a cause: exit_rank), naming it (and the cause of a stop not
 * the user's a rank wrote to KILN_LAUNCH_WHY_FD); with --max-restarts R it
 * starts them all again instead, up to R times, with KILN_RESTART set
 * (`kiln train` then resumes from the newest checkpoint).  Waiting for the
 * ranks, the signals passed on and the verdict: cli/launch_wait.c.
 *
 * Binding (--bind core, the default, as mpirun's for a few ranks): the
 * CPUs this launcher may run on are split into N contiguous groups and
 * local rank l is pinned to group l (sched_setaffinity before exec), so a
 * rank's compute threads and its comm stream's worker share its cores
 * instead of migrating onto the other ranks'.  With more ranks than CPUs
 * nothing is bound, nor when the ranks' [run] threads (launch_threads:
 * the command's run.threads=T, else its config file's) times the ranks
 * exceed the CPUs: a rank of more threads than its group would crowd its
 * own cores while the others' idle.  --bind none leaves the ranks free.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_* */
#endif
#include "cli.h"
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h> /* ppoll */
#include <sys/prctl.h>
#include <sys/resource.h> /* getrlimit(RLIMIT_NPROC) */
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t launch_got_signal;
static volatile sig_atomic_t signalled; /* a stop was asked for: no restart */

static void on_signal(int sig)
{
	launch_got_signal = sig;
	signalled = 1;
}

volatile sig_atomic_t launch_got_tstp; /* SIGTSTP, SIGTTIN or SIGTTOU: launch_suspend */

static void on_tstp(int sig) { launch_got_tstp = sig; }

static void launch_usage(FILE *f)
{
	fprintf(f,
		"usage: kiln launch -n N [--nnodes M --node-rank K] [--master HOST:PORT] [--grace S]\n"
		"                   [--max-restarts R] [--bind core|none] -- COMMAND...\n"
		"\n"
		"Start N local ranks of a data-parallel run, each running COMMAND (e.g.\n"
		"`kiln train run.ini`) with KILN_RANK, KILN_WORLD_SIZE, KILN_LOCAL_RANK,\n"
		"KILN_LOCAL_WORLD_SIZE, KILN_MASTER_ADDR and KILN_MASTER_PORT set.\n"
		"\n"
		"  -n, --nproc N     ranks on this machine\n"
		"  --nnodes M        machines in the run (default 1); world size N x M\n"
		"  --node-rank K     this machine's index, 0..M-1 (node 0 hosts rank 0)\n"
		"  --master H:P      where rank 0's rendezvous store listens (default on\n"
		"                    one machine: 127.0.0.1 and a free port; required with\n"
		"                    --nnodes > 1); an IPv6 address in brackets: [::1]:P\n"
		"  --grace S         seconds the other ranks get to exit after one failed\n"
		"                    (a wrapped rank's process group, after a repeated\n"
		"                    signal) before they are killed (default 10)\n"
		"  --bind core|none  core (default): pin each rank to its own share of the\n"
		"                    CPUs this launcher may use (N contiguous groups; none\n"
		"                    when there are more ranks than CPUs); none: no pinning\n"
		"  --max-restarts R  when a rank fails, start every local rank again, up to R\n"
		"                    times (default 0), with KILN_RESTART=1, 2, ... set:\n"
		"                    `kiln train` then resumes from the newest checkpoint\n"
		"\n"
		"SIGINT, SIGTERM and SIGUSR1 are passed to every rank, once: a repeat within\n"
		"--grace seconds is dropped.  After a stop every rank writes its checkpoint\n"
		"and `kiln launch` exits 0 (a rank command that dies of the signal passed on is\n"
		"judged by what its process group below it does).  SIGHUP is passed on too: the same stop, but the\n"
		"ranks name it and exit 1, as when a node's launcher is killed (its ranks'\n"
		"parent-death signal is SIGHUP).  When a rank fails, the others are stopped\n"
		"and `kiln launch` exits with its code (the first of a cause, 2 to 125, over\n"
		"a plain exit 1 or a signal), naming it.\n");
}

/* A TCP port that was free a moment ago (the store binds it next). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	int port = -1;
	if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
	    !getsockname(fd, (struct sockaddr *)&a, &al))
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}




/* An integer option of launch_args (cli_opt_int) into *out: in [lo, 2^20]. */
static int launch_int(int argc, char **argv, int *i, const char *name, int lo, int *out)
{
	long long v;
	const int r = cli_opt_int(argc, argv, i, name, lo, 1 << 20, &v);
	if (r > 0)
		*out = (int)v;
	return r;
}

/* -n N within reason, before any fork: at most 8 ranks per CPU of the
 * affinity mask (at least 64; KILN_LAUNCH_MAX_NPROC=M raises or lowers
 * it), and fewer than RLIMIT_NPROC (ulimit -u), which no setting lifts.
 * Before session 36 -n 100000 was accepted (up to 2^20) and forked until
 * fork failed, a fork storm on a shared machine.  -1 to go on, else 2. */
static int launch_nproc_ok(const struct launch_opts *o)
{
	cpu_set_t set;
	const long online = sysconf(_SC_NPROCESSORS_ONLN);
	const int ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
				   : online > 0 ? (int)online : 1;
	const char *env = getenv("KILN_LAUNCH_MAX_NPROC");
	long max = 8L * ncpu < 64 ? 64 : 8L * ncpu;
	char *end;
	struct rlimit rl;
	if (env && *env) {
		long v = strtol(env, &end, 10);
		if (*end || v < 1) {
			fprintf(stderr, "kiln launch: error: KILN_LAUNCH_MAX_NPROC='%s': expected a positive integer\n", env);
			return 2;
		}
		max = v;
	}
	if (o->nproc > max) {
		fprintf(stderr, "kiln launch: error: -n %d: more ranks than this machine takes (at most %ld%s); set KILN_LAUNCH_MAX_NPROC=%d to start them anyway\n",
			o->nproc, max, env && *env ? ": KILN_LAUNCH_MAX_NPROC" : "", o->nproc);
		if (!(env && *env))
			fprintf(stderr, "  (%ld: 8 per CPU of its %d, at least 64)\n", max, ncpu);
		return 2;
	}
	/* (root's forks are not held to it) */
	if (geteuid() != 0 && !getrlimit(RLIMIT_NPROC, &rl) && rl.rlim_cur != RLIM_INFINITY &&
	    (rlim_t)o->nproc >= rl.rlim_cur) {
		fprintf(stderr, "kiln launch: error: -n %d: the process limit (ulimit -u) is %llu: the ranks cannot all start\n",
			o->nproc, (unsigned long long)rl.rlim_cur);
		return 2;
	}
	return -1;
}

/* Read the options into *o, with the parser the other commands use
 * (cli/kiln.c: cli_opt; a loop of launch's own before session 33, whose
 * errors said "kiln launch: error: -n needs a positive integer"); returns
 * -1 to go on, else the exit code. */
static int launch_args(int argc, char **argv, struct launch_opts *o, const char **master)
{
	const char *bind = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int r;
		if (!strcmp(a, "--")) {
			o->cmd = i + 1;
			break;
		}
		/* here, not by the dispatcher: the command's own --help follows `--` */
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			launch_usage(stdout);
			return 0;
		}
		if ((r = launch_int(argc, argv, &i, "--nproc|-n", 1, &o->nproc)) ||
		    (r = launch_int(argc, argv, &i, "--nnodes", 1, &o->nnodes)) ||
		    (r = launch_int(argc, argv, &i, "--node-rank", 0, &o->node_rank)) ||
		    (r = launch_int(argc, argv, &i, "--grace", 1, &o->grace)) ||
		    (r = launch_int(argc, argv, &i, "--max-restarts", 0, &o->max_restarts)) ||
		    (r = cli_opt(argc, argv, &i, "--bind", &bind)) ||
		    (r = cli_opt(argc, argv, &i, "--master", master))) {
			if (r < 0)
				return 2;
			continue;
		}
		if (a[0] == '-')
			cli_bad_arg(a);
		else
			fprintf(stderr, "kiln: error: unexpected argument '%s': the command follows `--`\n", a);
		launch_usage(stderr);
		return 2;
	}
	if (bind && strcmp(bind, "core") && strcmp(bind, "none")) {
		fprintf(stderr, "kiln: error: --bind '%s': choose core or none\n", bind);
		return 2;
	}
	if (bind)
		o->bind = !strcmp(bind, "core");
	if (!o->nproc || o->cmd < 0 || o->cmd >= argc) {
		fprintf(stderr, "kiln launch: error: %s\n",
			!o->nproc ? "-n N is required" : "no command after `--`");
		launch_usage(stderr);
		return 2;
	}
	if (o->node_rank >= o->nnodes) {
		fprintf(stderr, "kiln launch: error: --node-rank %d with --nnodes %d (nodes are 0..%d)\n",
			o->node_rank, o->nnodes, o->nnodes - 1);
		return 2;
	}
	return launch_nproc_ok(o);
}

/* The store's address: --master HOST:PORT (an IPv6 address in brackets,
 * [::1]:PORT, passed on without them), else (one machine) 127.0.0.1 and a
 * free port.  Returns -1 to go on, else the exit code. */
static int launch_master(struct launch_opts *o, const char *master)
{
	if (master) {
		const int v6 = *master == '[';
		const char *host = master + v6, *colon = strrchr(master, ':');
		const char *end = v6 ? strchr(host, ']') : colon; /* the host's end */
		if (!colon || !end || end == host || (v6 && end + 1 != colon) ||
		    (size_t)(end - host) >= sizeof o->host || parse_int(colon + 1, 1, 65535, &o->port)) {
			fprintf(stderr, "kiln launch: error: --master '%s': expected HOST:PORT (an IPv6 address in brackets: [::1]:29500)\n",
				master);
			return 2;
		}
		memcpy(o->host, host, (size_t)(end - host));
		o->host[end - host] = 0;
	} else if (o->nnodes > 1) {
		fprintf(stderr, "kiln launch: error: --nnodes %d needs --master HOST:PORT (node 0's address, the same on every node)\n",
			o->nnodes);
		return 2;
	} else {
		snprintf(o->host, sizeof o->host, "127.0.0.1");
		if ((o->port = free_port()) < 0) {
			fprintf(stderr, "kiln launch: error: no free TCP port on 127.0.0.1: %s\n",
				strerror(errno));
			return 1;
		}
	}
	return -1;
}

/* The store's shared secret for the ranks (core/store.h): the caller's
 * KILN_STORE_TOKEN or KILN_STORE_TOKEN_FILE when set, else (one machine)
 * a fresh random one in KILN_STORE_TOKEN, which the ranks inherit.  Every
 * node of a multi-node run needs the same one: the user sets it.  Returns
 * -1 to go on, else the exit code. */
static int launch_token(const struct launch_opts *o)
{
	const char *t = getenv("KILN_STORE_TOKEN"), *f = getenv("KILN_STORE_TOKEN_FILE");
	if (o->nnodes > 1 && !(t && *t) && !(f && *f)) {
		fprintf(stderr, "kiln launch: error: --nnodes %d needs the same secret on every node: export KILN_STORE_TOKEN=$(openssl rand -hex 32) (or KILN_STORE_TOKEN_FILE=PATH, a file only you can read) before each launch\n",
			o->nnodes);
		return 2;
	}
	const int e = cli_store_token();
	if (e) {
		fprintf(stderr, "kiln launch: error: making the store's secret: %s\n", strerror(e));
		return 1;
	}
	return -1;
}

/* [run] threads of the ranks' command (for --bind core): its last word
 * run.threads=T, else [run] threads of its first word naming a readable
 * .ini file (`kiln train CONFIG`), else 0 (one thread per CPU of the
 * rank's own set, which fits any group).  A value that does not parse is
 * 0 here: the rank itself reports it. */
static long launch_threads(int argc, char **argv, const struct launch_opts *o)
{
	const char *over = NULL, *ini = NULL;
	for (int i = o->cmd + 1; i < argc; i++) {
		const char *a = argv[i];
		const size_t n = strlen(a);
		if (!strncmp(a, "run.threads=", 12))
			over = a + 12;
		else if (!ini && n > 4 && !strcmp(a + n - 4, ".ini") && !access(a, R_OK))
			ini = a;
	}
	char *end;
	long t = 0;
	if (over) {
		t = strtol(over, &end, 10);
		return *over && !*end && t > 0 ? t : 0;
	}
	struct kiln_config *cfg = NULL;
	if (ini && kiln_config_load(ini, &cfg) == KILN_OK) {
		const char *v = kiln_config_get(cfg, "run", "threads");
		if (v && *v) {
			t = strtol(v, &end, 10);
			t = !*end && t > 0 ? t : 0;
		}
	}
	kiln_config_free(cfg);
	return t;
}

/* The CPUs to share out (--bind core): this launcher's, into cpus[];
 * returns how many each rank gets, 0 for none (--bind none, more ranks
 * than CPUs, or ranks of `threads` threads each that the CPUs do not
 * hold: why[] says which); *ncpu: how many there are. */
static int launch_cpus(const struct launch_opts *o, long threads, int *cpus, int *ncpu, char *why,
		       size_t n)
{
	cpu_set_t all;
	*ncpu = 0;
	if (!o->bind) {
		snprintf(why, n, "--bind none");
		return 0;
	}
	if (sched_getaffinity(0, sizeof all, &all) == 0)
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &all))
				cpus[(*ncpu)++] = c;
	if (*ncpu < o->nproc) {
		snprintf(why, n, "more ranks than CPUs");
		return 0;
	}
	if (threads > *ncpu / o->nproc) {
		snprintf(why, n, "%d ranks of [run] threads = %ld exceed the %d CPUs", o->nproc,
			 threads, *ncpu);
		return 0;
	}
	return *ncpu / o->nproc;
}

/* KILN_RESTART in a rank's environment: which start of the job this is
 * (--max-restarts; unset on the first). */
static void launch_restart_env(const struct launch_opts *o)
{
	char v[16];
	snprintf(v, sizeof v, "%d", o->restart);
	if (o->restart)
		setenv("KILN_RESTART", v, 1);
	else
		unsetenv("KILN_RESTART");
}

/* In the child of local rank l: its environment, its CPUs (per of cpus[]
 * from l * per, none when per is 0), then exec the command. */
static void launch_rank(const struct launch_opts *o, char **argv, int l, const int *cpus, int per,
			pid_t launcher)
{
	char v[32];
	const int rank = o->node_rank * o->nproc + l;
	setpgid(0, 0);
	/* SIGHUP: `kiln train` stops as for SIGTERM, checkpoint included,
	 * but exits 1 naming the cause (its parent gone) */
	prctl(PR_SET_PDEATHSIG, SIGHUP);
	if (getppid() != launcher)
		_exit(1); /* the launcher is already gone */
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGUSR1, SIG_DFL);
	signal(SIGHUP, SIG_DFL);
	/* the launcher's own (cli/kiln.c) ignored SIGPIPE and SIGXFSZ are not
	 * the command's: a kiln rank ignores them itself, another command
	 * gets the defaults it would get without kiln launch */
	signal(SIGPIPE, SIG_DFL);
	signal(SIGXFSZ, SIG_DFL);
	snprintf(v, sizeof v, "%d", rank);
	setenv("KILN_RANK", v, 1);
	snprintf(v, sizeof v, "%d", o->nproc * o->nnodes);
	setenv("KILN_WORLD_SIZE", v, 1);
	snprintf(v, sizeof v, "%d", l);
	setenv("KILN_LOCAL_RANK", v, 1);
	snprintf(v, sizeof v, "%d", o->nproc);
	setenv("KILN_LOCAL_WORLD_SIZE", v, 1);
	setenv("KILN_MASTER_ADDR", o->host, 1);
	snprintf(v, sizeof v, "%d", o->port);
	setenv("KILN_MASTER_PORT", v, 1);
	launch_restart_env(o);
	unsetenv("KILN_LAUNCH_WHY_FD");
	const int wfd = o->why_fd[1] >= 0 ? fcntl(o->why_fd[1], F_DUPFD, 3) : -1; /* (not CLOEXEC) */
	snprintf(v, sizeof v, "%d", wfd);
	if (wfd >= 0)
		setenv("KILN_LAUNCH_WHY_FD", v, 1);
	/* the launcher's death reaches a trainer below a wrapper too, which
	 * the parent-death signal (the rank's own process only) does not */
	unsetenv("KILN_LAUNCH_ALIVE_FD");
	const int afd = o->alive_fd[0] >= 0 ? fcntl(o->alive_fd[0], F_DUPFD, 3) : -1; /* (not CLOEXEC) */
	snprintf(v, sizeof v, "%d", afd);
	if (afd >= 0)
		setenv("KILN_LAUNCH_ALIVE_FD", v, 1);
	snprintf(v, sizeof v, "%d", (int)launcher);
	setenv("KILN_LAUNCH_PID", v, 1);
	if (per) {
		cpu_set_t mine;
		CPU_ZERO(&mine);
		for (int k = 0; k < per; k++)
			CPU_SET(cpus[l * per + k], &mine);
		if (sched_setaffinity(0, sizeof mine, &mine))
			fprintf(stderr, "kiln launch: warning: rank %d not bound: %s\n", rank,
				strerror(errno));
	}
	cli_open_files_limit_restore();
	if (o->self[0]) {
		execv(o->self, argv + o->cmd);
		fprintf(stderr, "kiln launch: error: cannot run '%s' (this kiln, %s): %s\n",
			argv[o->cmd], o->self, strerror(errno));
		_exit(127);
	}
	execvp(argv[o->cmd], argv + o->cmd);
	fprintf(stderr, "kiln launch: error: cannot run '%s': %s\n", argv[o->cmd], strerror(errno));
	_exit(127);
}

/* Whether PATH (execvp's default when unset) names an existing `name`. */
static int launch_on_path(const char *name)
{
	const char *path = getenv("PATH");
	if (!path)
		path = "/bin:/usr/bin";
	for (const char *p = path;; p++) {
		const char *e = strchr(p, ':');
		const size_t dl = e ? (size_t)(e - p) : strlen(p);
		char f[4096];
		/* an empty entry is the current directory, as for execvp */
		if (snprintf(f, sizeof f, "%.*s%s%s", (int)dl, p, dl ? "/" : "", name) <
			    (int)sizeof f &&
		    !access(f, F_OK))
			return 1;
		if (!e)
			return 0;
		p = e;
	}
}

/* `kiln launch -- kiln train ...` from a build tree or an install off
 * PATH (docs/distributed.md writes it so): with no `kiln` on PATH the
 * ranks run this executable, said once (exit 127 "cannot run 'kiln'"
 * before session 33).  A `kiln` on PATH that fails to run (a script
 * whose interpreter is missing) is that error, not a silent swap. */
static void launch_self(struct launch_opts *o, char **argv)
{
	o->self[0] = 0;
	if (strcmp(argv[o->cmd], "kiln") || launch_on_path("kiln"))
		return;
	const ssize_t n = readlink("/proc/self/exe", o->self, sizeof o->self - 1);
	if (n > 0)
		o->self[n] = 0;
	else
		snprintf(o->self, sizeof o->self, "/proc/self/exe");
	fprintf(stderr, "kiln launch: no 'kiln' on PATH: the ranks run this kiln, %s\n", o->self);
}

/* Fork the local ranks into pids[]; 0, or -1 (said, the started ones
 * killed) when a fork fails. */
static int launch_spawn(const struct launch_opts *o, char **argv, pid_t *pids, const int *cpus,
			int per, pid_t me)
{
	for (int l = 0; l < o->nproc; l++) {
		pid_t p = fork();
		if (p < 0) {
			fprintf(stderr, "kiln launch: error: fork: %s\n", strerror(errno));
			for (int k = 0; k < l; k++)
				launch_rank_kill(pids[k], SIGKILL);
			return -1;
		}
		if (!p)
			launch_rank(o, argv, l, cpus, per, me);
		/* the child's own setpgid too (launch_rank): whichever runs
		 * first, the rank leads its group before a signal is passed
		 * to it (EACCES once it has exec'd: its own call ran) */
		setpgid(p, p);
		pids[l] = p;
	}
	return 0;
}

/* After the ranks ended with exit code rc: whether to start them all
 * again (--max-restarts left, a failure, no stop asked for by a signal);
 * counts the restart. */
static int launch_restart_due(struct launch_opts *o, int rc)
{
	if (!rc || signalled || o->restart >= o->max_restarts)
		return 0;
	o->restart++;
	fprintf(stderr, "kiln launch: restart %d of %d: starting ranks %d..%d again (KILN_RESTART=%d: `kiln train` resumes from the newest checkpoint)\n",
		o->restart, o->max_restarts, o->node_rank * o->nproc,
		o->node_rank * o->nproc + o->nproc - 1, o->restart);
	return 1;
}

int cmd_launch(int argc, char **argv)
{
	struct launch_opts o = { .nnodes = 1, .grace = 10, .cmd = -1, .bind = 1 };
	const char *master = NULL;
	int rc = launch_args(argc, argv, &o, &master);
	if (rc >= 0 || (rc = launch_master(&o, master)) >= 0 || (rc = launch_token(&o)) >= 0)
		return rc;
	pid_t *pids = calloc((size_t)o.nproc, sizeof *pids);
	if (!pids)
		return 1;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	struct sigaction hup;
	if (sigaction(SIGHUP, NULL, &hup) || hup.sa_handler != SIG_IGN) /* (nohup: ignored) */
		sigaction(SIGHUP, &sa, NULL);
	/* Ctrl-Z: the ranks stop too (launch_suspend); not where it is
	 * ignored (a shell without job control may ignore SIGTSTP) */
	const int stops[] = { SIGTSTP, SIGTTIN, SIGTTOU };
	for (size_t i = 0; i < sizeof stops / sizeof *stops; i++) {
		struct sigaction was, tstp;
		if (sigaction(stops[i], NULL, &was) || was.sa_handler == SIG_IGN)
			continue;
		memset(&tstp, 0, sizeof tstp);
		tstp.sa_handler = on_tstp;
		sigemptyset(&tstp.sa_mask);
		sigaction(stops[i], &tstp, NULL);
	}
	sa.sa_handler = launch_on_child; /* wakes launch_wait when a rank exits */
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	launch_self(&o, argv);
	pid_t me = getpid();
	int cpus[CPU_SETSIZE], ncpu;
	char why[96], how[128];
	const int per = launch_cpus(&o, o.bind ? launch_threads(argc, argv, &o) : 0, cpus, &ncpu, why,
				    sizeof why);
	if (per)
		snprintf(how, sizeof how, "each rank bound to %d of %d CPUs", per, ncpu);
	else
		snprintf(how, sizeof how, "ranks not bound (%s)", why);
	const int v6 = strchr(o.host, ':') != NULL;
	fprintf(stderr, "kiln launch: ranks %d..%d of %d, store %s%s%s:%d, %s: %s ...\n",
		o.node_rank * o.nproc, o.node_rank * o.nproc + o.nproc - 1, o.nproc * o.nnodes,
		v6 ? "[" : "", o.host, v6 ? "]" : "", o.port, how, argv[o.cmd]);
	if (pipe2(o.why_fd, O_CLOEXEC | O_NONBLOCK))
		o.why_fd[0] = o.why_fd[1] = -1;
	if (pipe2(o.alive_fd, O_CLOEXEC))
		o.alive_fd[0] = o.alive_fd[1] = -1;
	/* a rank's processes orphaned by its command's end (a trainer below
	 * a wrapper that died of a signal passed on) become this launcher's
	 * children: launch_wait reaps them and reads their status */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	for (;;) {
		while (o.why_fd[0] >= 0 && read(o.why_fd[0], o.why, sizeof o.why) > 0)
			; /* (an earlier start's) */
		o.why[0] = 0;
		if (launch_spawn(&o, argv, pids, cpus, per, me)) {
			rc = 1;
			break;
		}
		rc = launch_wait(&o, pids);
		if (!launch_restart_due(&o, rc))
			break;
	}
	free(pids);
	return rc;
}
