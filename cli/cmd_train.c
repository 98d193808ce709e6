/* cli/cmd_train.c - `kiln train FILE [--resume] [overrides]`: train, print a
 * progress bar on a terminal (plain lines otherwise) and a final JSON line
 * of metrics on stdout.  SIGTERM and SIGUSR1 stop the run after its current
 * step with a checkpoint (exit 0); a repeat within 5 s is ignored (the same
 * stop delivered twice), a later one ends it at once. */
#include "build-config.h"
#include "cli.h"
#include <kiln/dist.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One graceful stop per process.  The first SIGTERM/SIGUSR1 asks for a
 * stop (checkpoint, exit 0); a repeat within KILN_STOP_GRACE_S seconds is
 * the same stop delivered twice (Slurm, systemd and `timeout` signal both
 * `kiln launch` and its ranks, and the launcher forwards its copy) and is
 * ignored; a later one ends the process at once. */
#define KILN_STOP_GRACE_S 5
static volatile sig_atomic_t stop_at_s; /* CLOCK_MONOTONIC s of the first, 0: none */

static void on_stop_signal(int sig)
{
	static const char first[] = "\nkiln: stop requested: finishing the current step and writing a checkpoint (a signal again after 5 s ends the process at once)\n";
	static const char again[] = "kiln: stop already requested (a repeat within 5 s is ignored)\n";
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts); /* async-signal-safe */
	long now = (long)ts.tv_sec + 1;       /* never 0 */
	const char *msg = first;
	size_t len = sizeof first - 1;
	if (stop_at_s && now - stop_at_s >= KILN_STOP_GRACE_S) {
		signal(sig, SIG_DFL);
		raise(sig);
		return;
	}
	if (stop_at_s) {
		msg = again;
		len = sizeof again - 1;
	} else {
		stop_at_s = now;
		kiln_train_request_stop();
	}
	/* write(2) is async-signal-safe; its result does not matter here */
	if (write(2, msg, len) < 0)
		return;
}

/* An unrecoverable failure on a plugin's thread (MPI's watchdog: a
 * collective that cannot be cancelled): the only way out is to end the
 * process, which ends the job (mpirun and kiln launch then stop the rest). */
static void on_fatal(const char *msg)
{
	fprintf(stderr, "kiln: error: %s\n", msg);
	fflush(stderr);
	_exit(1);
}

/* SIGTERM and SIGUSR1: on_stop_signal (one stop, repeats within the
 * grace period ignored, a later one kills). */
static void install_stop_handlers(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop_signal;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGTERM);
	sigaddset(&sa.sa_mask, SIGUSR1);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	kiln_set_fatal_handler(on_fatal);
}

struct bar {
	int tty;
	int last_pct;
	int64_t samples_per_step; /* batch x accumulate */
	int64_t epochs;
	int epoch;                /* the epoch the rate is measured over */
	int64_t step0;            /* its first step seen, and when */
	double t0, last_draw;
};

static double mono_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress(void *user, int epoch, int64_t step, int64_t steps, const char *status)
{
	struct bar *b = user;
	if (step < 0) { /* epoch summary */
		if (b->tty)
			fprintf(stderr, "\r\033[K");
		fprintf(stderr, "%s\n", status);
		b->last_pct = -1;
		return;
	}
	if (!b->tty) {
		if (status)
			fprintf(stderr, "epoch %d step %lld/%lld %s\n", epoch, (long long)step,
				(long long)steps, status);
		return;
	}
	static char last_status[128];
	if (status)
		snprintf(last_status, sizeof last_status, "%s", status);
	double now = mono_now();
	if (epoch != b->epoch) {
		b->epoch = epoch;
		b->step0 = step;
		b->t0 = now;
	}
	int pct = (int)(100 * step / (steps ? steps : 1));
	if (pct == b->last_pct && !status && now - b->last_draw < 1.0)
		return;
	b->last_pct = pct;
	b->last_draw = now;
	/* samples/s over this epoch so far, and the time the run has left */
	char rate[96] = "";
	double dt = now - b->t0;
	if (step > b->step0 && dt > 0) {
		double sps = (double)(step - b->step0) / dt;
		double left = ((double)(b->epochs - epoch) * (double)steps + (double)(steps - step)) / sps;
		snprintf(rate, sizeof rate, " %.0f samples/s ETA %d:%02d", sps * (double)b->samples_per_step,
			 (int)(left / 60), (int)left % 60);
	}
	char bar[31];
	int fill = pct * 30 / 100;
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = 0;
	fprintf(stderr, "\r\033[Kepoch %d [%s] %3d%% %lld/%lld %s%s", epoch, bar, pct, (long long)step,
		(long long)steps, last_status, rate);
	fflush(stderr);
}

const char cmd_train_usage[] =
	"usage: kiln train FILE [--resume | --overwrite] [--profile] [section.key=value ...]\n";
const char cmd_train_about[] =
	"Train the model FILE describes (see docs/config.md).  Progress goes to stderr\n"
	"(a bar on a terminal, plain lines otherwise); the last line on stdout is a JSON\n"
	"object with the final metrics (train_samples_per_s, test_acc, ...).  Metrics of\n"
	"every log point also go to [run] out_dir/metrics.jsonl.\n\n"
	"Checkpoints (docs/checkpoints.md): the run ends with one of its last step\n"
	"(train.checkpoint_last=1, the default), out_dir/checkpoints/ckpt-<step>.kiln\n"
	"with the whole training state, which `kiln eval` and `kiln export` read;\n"
	"train.checkpoint_every=N adds one every N steps, keeping the train.keep_last\n"
	"newest.  --resume (train.resume=1) continues from the newest\n"
	"usable checkpoint there, bit for bit, or starts afresh when there is none.\n"
	"A fresh run refuses an out_dir that holds an earlier run (its metrics, logs or\n"
	"checkpoints) and changes nothing; --overwrite (train.overwrite=1) deletes\n"
	"that run's files first (other files stay).\n"
	"SIGTERM or SIGUSR1 finishes the current step, writes a checkpoint and exits 0;\n"
	"a repeat within 5 s is ignored, a later one ends the process at once.\n\n"
	"--profile (= run.profile=1): time every device op, print a table of self time\n"
	"per layer and op at the end, write out_dir/profile.txt and a Chrome trace\n"
	"out_dir/trace.json (docs/profiler.md).  The device runs serialised meanwhile.\n\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

/* "KEY": V, or "KEY": null when V < 0 (not measured) */
static void print_metric(const char *key, double v)
{
	if (v < 0)
		printf("\"%s\": null, ", key);
	else
		printf("\"%s\": %.6f, ", key, v);
}

/* KILN_RESTART > 0: `kiln launch --max-restarts` started this rank again
 * after a failure, so the run resumes from its newest checkpoint (a fresh
 * start when there is none). */
static int restarted(void)
{
	const char *v = getenv("KILN_RESTART");
	if (!v || atoi(v) <= 0)
		return 0;
	fprintf(stderr, "kiln: restart %d under kiln launch: resuming from the newest checkpoint\n", atoi(v));
	return 1;
}

int cmd_train(int argc, char **argv)
{
	/* --resume, --overwrite and --profile (anywhere after FILE) are the
	 * overrides train.resume=1, train.overwrite=1 and run.profile=1,
	 * applied last */
	char **args = calloc((size_t)argc + 4, sizeof *args);
	int n = 0, want_resume = 0, want_profile = 0, want_overwrite = 0;
	if (!args) {
		fprintf(stderr, "kiln: error: out of memory\n");
		return 1;
	}
	for (int i = 0; i < argc; i++) {
		if (i > 0 && !strcmp(argv[i], "--resume"))
			want_resume = 1;
		else if (i > 0 && !strcmp(argv[i], "--overwrite"))
			want_overwrite = 1;
		else if (i > 0 && !strcmp(argv[i], "--profile"))
			want_profile = 1;
		else
			args[n++] = argv[i];
	}
	if (want_resume || restarted())
		args[n++] = "train.resume=1";
	if (want_overwrite)
		args[n++] = "train.overwrite=1";
	if (want_profile)
		args[n++] = "run.profile=1";
	if (!cli_args_ok(n, args, "train")) {
		free(args);
		return 2;
	}
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_train_result r;
	struct kiln_train_cfg tc;
	struct bar b = { .tty = isatty(2), .last_pct = -1 };
	kiln_status st = cli_load(args[1], n, args, 2, &cfg, &reg);
	if (!st)
		st = kiln_train_cfg_read(cfg, reg, &tc); /* batch = auto resolved */
	if (!st) {
		b.epochs = tc.epochs;
		b.samples_per_step = tc.batch * tc.accumulate;
	}
	install_stop_handlers();
	if (!st)
		st = kiln_train_run(cfg, reg, &tc, progress, &b, &r);
	int rc = 0;
	if (st) {
		if (b.tty)
			fprintf(stderr, "\n");
		rc = cli_fail(st);
	} else {
		printf("{\"epochs\": %d, \"steps\": %lld, \"train_loss\": %.6f, \"train_acc\": %.6f, ",
		       r.epochs, (long long)r.steps, r.train_loss, r.train_acc);
		/* not evaluated (test_loss < 0): null */
		print_metric("test_loss", r.test_loss);
		print_metric("test_acc", r.test_acc);
		printf("\"test_samples\": %lld, \"train_samples_per_s\": %.1f, "
		       "\"eval_samples_per_s\": %.1f, \"wall_s\": %.2f",
		       (long long)r.test_samples, r.train_samples_per_s, r.eval_samples_per_s, r.wall_s);
		if (r.resumed_step >= 0)
			printf(", \"resumed_step\": %lld", (long long)r.resumed_step);
		if (r.checkpoint[0]) {
			printf(", \"checkpoint\": ");
			cli_json_str(stdout, r.checkpoint);
		}
		if (r.stopped)
			printf(", \"stopped\": true");
		printf(", \"device_peak_bytes\": %zu, \"rss_growth_bytes\": %zu}\n", r.device_peak_bytes,
		       r.rss_growth_bytes);
		if (b.tty && r.stopped)
			fprintf(stderr, "\n");
		if (r.stopped && r.checkpoint[0])
			fprintf(stderr, "kiln: stopped at step %lld: checkpoint written to %s; resume with --resume\n",
				(long long)r.steps, r.checkpoint);
		else if (r.stopped)
			fprintf(stderr, "kiln: stopped at step %lld: no checkpoint written ([run] out_dir is empty)\n",
				(long long)r.steps);
		else if (r.test_acc >= 0)
			fprintf(stderr, "final test accuracy: %.2f%% (%lld samples)\n", 100 * r.test_acc,
				(long long)r.test_samples);
		if (!r.stopped && r.checkpoint[0])
			fprintf(stderr, "trained weights: %s (`kiln export %s --safetensors FILE`, with the same overrides, writes them for PyTorch)\n",
				r.checkpoint, args[1]);
	}
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(args);
	return rc;
}
