/* cli/cmd_bench.c - `kiln bench data FILE`: the loader of FILE's [data]
 * alone, samples/s and MB/s with a breakdown; a JSON line on stdout. */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void bench_usage(FILE *f)
{
	fprintf(f, "usage: kiln bench data FILE [--batches N] [section.key=value ...]\n"
		   "       kiln bench comm [--nproc N] [--max BYTES] [--runs R] (kiln bench comm --help)\n\n"
		   "Run the loader of FILE's [data] section exactly as `kiln train` would (workers,\n"
		   "prefetch, transforms, cache, copies to [run] device) for N batches of [train]\n"
		   "batch after two of warm-up (default: one epoch), with no model; the clock starts\n"
		   "once the warm-up is taken and nothing is prefetched.  Prints samples/s,\n"
		   "MB/s of staged data and where the time goes: source read + decode and transforms\n"
		   "(per sample, worker thread time), the copy to the device (per batch), and how\n"
		   "long the consumer waited.  The last line on stdout is the same as JSON.\n"
		   "Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n");
}

int cmd_bench(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "comm") && cli_wants_help(argc, argv)) {
		bench_comm_usage_print();
		return 0;
	}
	if (cli_wants_help(argc, argv)) {
		bench_usage(stdout);
		return 0;
	}
	if (argc >= 2 && !strcmp(argv[1], "comm"))
		return cmd_bench_comm(argc, argv);
	if (argc < 3 || strcmp(argv[1], "data") || argv[2][0] == '-') {
		if (argc >= 3 && argv[2][0] == '-')
			cli_bad_arg(argv[2]);
		bench_usage(stderr);
		return 2;
	}
	long long batches = 0;
	for (int i = 3; i < argc; i++) {
		const int r = cli_opt_int(argc, argv, &i, "--batches", 1, INT64_MAX, &batches);
		if (r < 0)
			return 2;
		if (!r && (argv[i][0] == '-' || !strchr(argv[i], '='))) {
			cli_bad_arg(argv[i]);
			bench_usage(stderr);
			return 2;
		}
	}
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_data_bench r;
	kiln_status st = cli_load(argv[2], argc, argv, 3, &cfg, &reg);
	if (!st)
		st = kiln_bench_data(cfg, reg, batches, &r);
	int rc = 0;
	if (st) {
		rc = cli_fail(st);
	} else {
		fprintf(stderr,
			"data: %lld batches of %lld, %d worker(s): %.0f samples/s, %.1f MB/s staged (%lld B/sample)\n"
			"  per sample: read+decode %.1f us, transforms %.1f us (worker thread time)\n"
			"  per batch:  copy to device %.1f us; consumer waited %.1f%% of the time\n",
			(long long)r.batches, (long long)r.batch, r.workers, r.samples_per_s, r.mb_per_s,
			(long long)r.sample_bytes, r.read_us, r.xform_us, r.copy_us,
			100 * r.wait_frac);
		/* the rates and times through cli_json_num: a run timed at 0 s gave
		 * printf's "inf", which no JSON parser reads */
		printf("{\"samples_per_s\": ");
		cli_json_num(stdout, "%.1f", r.samples_per_s);
		printf(", \"mb_per_s\": ");
		cli_json_num(stdout, "%.2f", r.mb_per_s);
		printf(", \"workers\": %d, \"batch\": %lld, \"batches\": %lld, \"read_us\": ", r.workers,
		       (long long)r.batch, (long long)r.batches);
		cli_json_num(stdout, "%.2f", r.read_us);
		printf(", \"xform_us\": ");
		cli_json_num(stdout, "%.2f", r.xform_us);
		printf(", \"copy_us\": ");
		cli_json_num(stdout, "%.1f", r.copy_us);
		printf(", \"wait_frac\": ");
		cli_json_num(stdout, "%.4f", r.wait_frac);
		printf(", \"skipped\": %lld}\n", (long long)r.skipped);
	}
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return rc;
}
