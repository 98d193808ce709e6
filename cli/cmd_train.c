/* cli/cmd_train.c - `kiln train FILE [overrides]`: train, print a progress
 * bar on a terminal (plain lines otherwise) and a final JSON line of
 * metrics on stdout. */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct bar {
	int tty;
	int last_pct;
};

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
	int pct = (int)(100 * step / (steps ? steps : 1));
	if (pct == b->last_pct && !status)
		return;
	b->last_pct = pct;
	char bar[31];
	int fill = pct * 30 / 100;
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = 0;
	fprintf(stderr, "\r\033[Kepoch %d [%s] %3d%% %lld/%lld %s", epoch, bar, pct, (long long)step,
		(long long)steps, last_status);
	fflush(stderr);
}

int cmd_train(int argc, char **argv)
{
	if (cli_wants_help(argc, argv)) {
		printf("usage: kiln train FILE [--profile] [section.key=value ...]\n\n"
		       "Train the model FILE describes (see docs/config.md).  Progress goes to stderr\n"
		       "(a bar on a terminal, plain lines otherwise); the last line on stdout is a JSON\n"
		       "object with the final metrics (train_samples_per_s, test_acc, ...).  Metrics of\n"
		       "every log point also go to [run] out_dir/metrics.jsonl.\n"
		       "--profile (= run.profile=1): time every device op, print a table of self time\n"
		       "per layer and op at the end, write out_dir/profile.txt and a Chrome trace\n"
		       "out_dir/trace.json (docs/profiler.md).  The device runs serialised meanwhile.\n"
		       "Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n");
		return 0;
	}
	/* --profile (anywhere) is the override run.profile=1, applied last */
	static char profile_on[] = "run.profile=1";
	int n = 0, profile = 0;
	for (int i = 0; i < argc; i++) {
		if (i > 0 && !strcmp(argv[i], "--profile"))
			profile = 1;
		else
			argv[n++] = argv[i];
	}
	if (profile)
		argv[n++] = profile_on;
	argc = n;
	if (!cli_args_ok(argc, argv, "train"))
		return 2;
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_train_result r;
	struct bar b = { isatty(2), -1 };
	kiln_status st = cli_load(argv[1], argc, argv, 2, &cfg, &reg);
	if (!st)
		st = kiln_train(cfg, reg, progress, &b, &r);
	int rc = 0;
	if (st) {
		if (b.tty)
			fprintf(stderr, "\n");
		rc = cli_fail(st);
	} else {
		printf("{\"epochs\": %d, \"steps\": %lld, \"train_loss\": %.6f, \"train_acc\": %.6f, "
		       "\"test_loss\": %.6f, \"test_acc\": %.6f, \"test_samples\": %lld, "
		       "\"train_samples_per_s\": %.1f, \"eval_samples_per_s\": %.1f, \"wall_s\": %.2f}\n",
		       r.epochs, (long long)r.steps, r.train_loss, r.train_acc, r.test_loss, r.test_acc,
		       (long long)r.test_samples, r.train_samples_per_s, r.eval_samples_per_s, r.wall_s);
		if (r.test_acc >= 0)
			fprintf(stderr, "final test accuracy: %.2f%% (%lld samples)\n", 100 * r.test_acc,
				(long long)r.test_samples);
	}
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	return rc;
}
