/* cli/cmd_quantize.c - `kiln quantize FILE [--checkpoint CKPT] --calibrate N
 * --out Q [--method minmax|percentile|entropy] [--percentile P]`: INT8
 * post-training quantization of a trained model (docs/inference.md,
 * "INT8"); `kiln eval FILE --quantized Q` evaluates the result. */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cmd_quantize_usage[] =
	"usage: kiln quantize FILE [--checkpoint CKPT] --calibrate N --out Q\n"
	"                     [--method minmax|percentile|entropy] [--percentile P] [section.key=value ...]\n";
const char cmd_quantize_about[] =
	"Quantize the model FILE describes, with the weights of checkpoint CKPT (default:\n"
	"the newest usable one in [run] out_dir/checkpoints), to INT8 for inference: the\n"
	"model is folded first (kiln eval --fold), its conv and linear weights become\n"
	"per-output-channel symmetric int8, and the range of every conv and linear input is\n"
	"taken from the first N full batches of [data.eval] ([train] eval_batch rows each;\n"
	"point it at training data, e.g. data.eval.split=train for idx sources) by the rule\n"
	"--method: minmax (default), percentile (--percentile P, default 99.99) or entropy\n"
	"(TensorRT's KL rule).  Q is a safetensors file (docs/formats.md, \"INT8 model\");\n"
	"evaluate it with `kiln eval FILE --quantized Q`.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

/* The value of option argv[*i] (`--opt V` or `--opt=V`), advancing *i;
 * NULL when argv[*i] is not `opt`. */
static const char *opt_value(int argc, char **argv, int *i, const char *opt, int *missing)
{
	const size_t n = strlen(opt);
	if (!strncmp(argv[*i], opt, n) && argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (strcmp(argv[*i], opt))
		return NULL;
	if (*i + 1 == argc) {
		*missing = 1;
		return NULL;
	}
	return argv[++*i];
}

int cmd_quantize(int argc, char **argv)
{
	char **args = calloc((size_t)argc + 1, sizeof *args);
	const char *ckpt = NULL, *v;
	struct kiln_quantize_opts o = { .method = "minmax", .percentile = 99.99 };
	int n = 0, missing = 0;
	if (!args) {
		fprintf(stderr, "kiln: error: out of memory\n");
		return 1;
	}
	for (int i = 0; i < argc && !missing; i++) {
		if ((v = opt_value(argc, argv, &i, "--checkpoint", &missing)))
			ckpt = v;
		else if ((v = opt_value(argc, argv, &i, "--calibrate", &missing)))
			o.batches = atoll(v);
		else if ((v = opt_value(argc, argv, &i, "--out", &missing)))
			o.out = v;
		else if ((v = opt_value(argc, argv, &i, "--method", &missing)))
			o.method = v;
		else if ((v = opt_value(argc, argv, &i, "--percentile", &missing)))
			o.percentile = atof(v);
		else if (!missing)
			args[n++] = argv[i];
	}
	if (missing || !o.out || o.batches < 1) {
		fprintf(stderr, "kiln: error: %s\n%s", missing ? "an option needs a value"
				: "quantize needs --calibrate N (N >= 1) and --out Q", cmd_quantize_usage);
		free(args);
		return 2;
	}
	if (!cli_args_ok(n, args, "quantize")) {
		free(args);
		return 2;
	}
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	kiln_status st = cli_load(args[1], n, args, 2, &cfg, &reg);
	if (!st)
		st = kiln_quantize(cfg, reg, ckpt, &o);
	int rc = st ? cli_fail(st) : 0;
	if (!st)
		printf("{\"out\": \"%s\", \"method\": \"%s\", \"calibrate_batches\": %lld}\n", o.out,
		       o.method, (long long)o.batches);
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(args);
	return rc;
}
