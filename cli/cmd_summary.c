/* cli/cmd_summary.c - `kiln summary FILE [--batch N] [overrides]`: the
 * model FILE describes, layer by layer (output shape, parameters, forward
 * FLOPs) and in total, like torchinfo's summary (docs/report.md, "kiln summary"). */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cmd_summary_usage[] =
	"usage: kiln summary FILE [--batch N] [section.key=value ...]\n";
const char cmd_summary_about[] =
	"Build the model FILE describes (as `kiln train` would; nothing is trained or\n"
	"allocated for activations) and print, like torchinfo: per layer its output shape\n"
	"for a batch of N samples (default 1), its parameters (all, trainable, frozen) and\n"
	"the FLOPs of its forward in evaluation mode, counted from the device ops the layer\n"
	"prepares (a multiply-add is 2 FLOPs); then the totals, the batchnorm buffers and\n"
	"the parameters' size.  The last line on stdout is the totals as JSON.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

/* --batch N among argv[2..] (0 when absent, -1 when malformed); the
 * other arguments must be overrides. */
static int64_t batch_arg(int argc, char **argv)
{
	long long batch = 0;
	for (int i = 2; i < argc; i++) {
		const int r = cli_opt_int(argc, argv, &i, "--batch", 1, INT64_MAX, &batch);
		if (r < 0)
			return -1;
		if (!r && (argv[i][0] == '-' || !strchr(argv[i], '='))) {
			cli_bad_arg_usage(argc, argv, i, cmd_summary_usage);
			fputs(cmd_summary_usage, stderr);
			return -1;
		}
	}
	return batch;
}

int cmd_summary(int argc, char **argv)
{
	if (argc < 2 || argv[1][0] == '-') {
		if (argc >= 2)
			cli_bad_arg_usage(argc, argv, 1, cmd_summary_usage);
		fputs(cmd_summary_usage, stderr);
		return 2;
	}
	const int64_t batch = batch_arg(argc, argv);
	if (batch < 0)
		return 2;
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_summary s;
	kiln_status st = cli_load(argv[1], argc, argv, 2, &cfg, &reg);
	if (!st)
		st = kiln_summary_report(cfg, reg, batch ? batch : 1, stdout, &s);
	int rc = 0;
	if (st)
		rc = cli_fail(st);
	else {
		printf("{\"batch\": %lld, \"layers\": %d, \"params\": %lld, \"trainable\": %lld, \"frozen\": %lld, "
		       "\"buffers\": %lld, \"flops\": ",
		       (long long)s.batch, s.n_layers, (long long)s.params, (long long)s.trainable,
		       (long long)s.frozen, (long long)s.buffers);
		cli_json_num(stdout, "%.0f", s.flops); /* JSON has no inf */
		printf(", \"param_mib\": ");
		cli_json_num(stdout, "%.4f", s.param_mib);
		printf("}\n");
	}
	if (!st)
		kiln_summary_free(&s);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return rc;
}
