/* cli/cmd_export.c - `kiln export CONFIG --safetensors FILE`: build CONFIG's
 * model, load its weights, write every parameter and buffer with PyTorch's
 * names and layouts (docs/safetensors.md). */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void export_usage(FILE *f)
{
	fprintf(f, "usage: kiln export CONFIG --safetensors FILE [--checkpoint CKPT] [section.key=value ...]\n\n"
		   "Build the model CONFIG describes (the sample shape comes from its [data] source),\n"
		   "initialise it as `kiln train` would ([run] seed, then [model] init_from) and write\n"
		   "every parameter and buffer to FILE as safetensors: names `<layer>.<parameter>`\n"
		   "(conv1.weight, bn1.running_mean, plus bn1.num_batches_tracked), PyTorch's layouts,\n"
		   "so torch's load_state_dict(strict=True) takes it for a module named alike.\n"
		   "--checkpoint CKPT: the weights (parameters and buffers) of a checkpoint written\n"
		   "by `kiln train` (verified whole first; it must be of this model).\n"
		   "Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n");
}

int cmd_export(int argc, char **argv)
{
	if (cli_wants_help(argc, argv)) {
		export_usage(stdout);
		return 0;
	}
	if (argc < 2 || argv[1][0] == '-') {
		export_usage(stderr);
		return 2;
	}
	const char *out = NULL, *ckpt = NULL;
	char **over = calloc((size_t)argc, sizeof *over); /* the overrides alone */
	int n_over = 0;
	if (!over)
		return 1;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--safetensors") && i + 1 < argc) {
			out = argv[++i];
		} else if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc) {
			ckpt = argv[++i];
		} else if (argv[i][0] == '-' || !strchr(argv[i], '=')) {
			fprintf(stderr, "kiln: error: unexpected argument '%s'\n", argv[i]);
			export_usage(stderr);
			free(over);
			return 2;
		} else {
			over[n_over++] = argv[i];
		}
	}
	if (!out) {
		fprintf(stderr, "kiln: error: --safetensors FILE is required\n");
		export_usage(stderr);
		free(over);
		return 2;
	}
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	/* option values may contain '=': pass only the overrides */
	kiln_status st = cli_load(argv[1], n_over, over, 0, &cfg, &reg);
	if (!st)
		st = kiln_export_safetensors(cfg, reg, ckpt, out);
	int rc = 0;
	if (st)
		rc = cli_fail(st);
	else
		fprintf(stderr, "wrote %s\n", out);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	free(over);
	return rc;
}
