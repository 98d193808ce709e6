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
	"--method: minmax (default), percentile (--percentile P, default 99.99; with that\n"
	"method only) or entropy (TensorRT's KL rule).  Q is a safetensors file\n"
	"(docs/formats.md, \"INT8 model\"), never a kiln checkpoint (refused, exit 2);\n"
	"evaluate it with `kiln eval FILE --quantized Q`.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

/* --percentile P: 0 when v is a number in (0, 100]. */
static int percentile_arg(const char *v, double *out)
{
	char *end;
	*out = strtod(v, &end);
	if (end == v || *end || !(*out > 0 && *out <= 100)) {
		fprintf(stderr, "kiln: error: --percentile '%s': expected a number in (0, 100]\n", v);
		return -1;
	}
	return 0;
}

/* The JSON line: the batches calibration ran (the file records them; fewer
 * than --calibrate when [data.eval] has fewer: before session 29 the
 * requested count was printed). */
static int print_result(const struct kiln_quantize_opts *o)
{
	struct kiln_safetensors *f;
	kiln_status st = kiln_safetensors_open(o->out, &f);
	if (st)
		return cli_fail(st);
	const char *ran = kiln_safetensors_meta(f, "kiln.calibrate_batches");
	printf("{\"out\": ");
	cli_json_str(stdout, o->out);
	printf(", \"method\": \"%s\", \"calibrate_batches\": %lld}\n", o->method,
	       ran ? atoll(ran) : -1LL);
	kiln_safetensors_close(f);
	return 0;
}

int cmd_quantize(int argc, char **argv)
{
	char **args = calloc((size_t)argc + 1, sizeof *args);
	const char *ckpt = NULL, *v = NULL;
	struct kiln_quantize_opts o = { .method = "minmax", .percentile = 99.99 };
	long long batches = 0;
	int n = 0, bad = 0, pct_given = 0;
	if (!args) {
		fprintf(stderr, "kiln: error: out of memory\n");
		return 1;
	}
	for (int i = 0; i < argc && !bad; i++) {
		int r = 0;
		if (i > 0 && ((r = cli_opt(argc, argv, &i, "--checkpoint", &ckpt)) ||
			      (r = cli_opt_int(argc, argv, &i, "--calibrate", 1, INT64_MAX, &batches)) ||
			      (r = cli_opt(argc, argv, &i, "--out", &o.out)) ||
			      (r = cli_opt(argc, argv, &i, "--method", &o.method)) ||
			      (r = cli_opt(argc, argv, &i, "--percentile", &v)))) {
			bad = r < 0 || (v && percentile_arg(v, &o.percentile));
			pct_given |= v != NULL;
		} else
			args[n++] = argv[i];
		v = NULL;
	}
	o.batches = batches;
	if (bad) /* the option is named */
		fputs(cmd_quantize_usage, stderr);
	else if (!cli_args_ok(n, args, cmd_quantize_usage))
		bad = 1;
	else if (!o.out || o.batches < 1) {
		fprintf(stderr, "kiln: error: quantize needs --calibrate N (N >= 1) and --out Q\n%s",
			cmd_quantize_usage);
		bad = 1;
	} else if (pct_given && strcmp(o.method, "percentile")) {
		/* ignored silently before session 29 */
		fprintf(stderr, "kiln: error: --percentile is the percentile method's: --method %s ignores it (pass --method percentile, or drop --percentile)\n%s",
			o.method, cmd_quantize_usage);
		bad = 1;
	}
	if (bad) {
		free(args);
		return 2;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	/* Q is not FILE nor CKPT (kiln_quantize checks the checkpoint it
	 * picks, and refuses any other checkpoint) */
	kiln_status st = cli_named_file("checkpoint", ckpt);
	if (!st)
		st = kiln_output_check(o.out, (const char *[]){ args[1], ckpt }, 2);
	/* nor a file of the calibration data, refused as it opens */
	kiln_output_watch(o.out);
	if (!st)
		st = cli_load(args[1], n, args, 2, &cfg, &reg);
	if (!st)
		st = kiln_quantize(cfg, reg, ckpt, &o);
	int rc = st ? cli_fail(st) : 0;
	if (!st)
		rc = print_result(&o);
	kiln_output_watch(NULL);
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(args);
	return rc;
}
