/* cli/cmd_eval.c - `kiln eval FILE [--checkpoint CKPT] [overrides]`: load a
 * checkpoint's weights (parameters and buffers) into the model FILE
 * describes and evaluate it on [data.eval]; a JSON line of loss and
 * accuracy on stdout. */
#include "build-config.h"
#include "cli.h"
#include "../plugins/common/c_locale.h" /* common_nan_plain: "nan", not "-nan" */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cmd_eval_usage[] =
	"usage: kiln eval FILE [--checkpoint CKPT] [--fold] [--quantized Q] [section.key=value ...]\n";
const char cmd_eval_about[] =
	"Evaluate the parameters and buffers of checkpoint CKPT (a ckpt-<step>.kiln file\n"
	"written by `kiln train`; default: the newest usable one in [run]\n"
	"out_dir/checkpoints) on FILE's [data.eval].  The checkpoint is verified\n"
	"completely first, and the keys that shape its tensors (the [layer.*] keys;\n"
	"not [model] init_from or layout) must equal FILE's.  CKPT may be a weights\n"
	"file instead (safetensors or llm.c's model file, read as [model] init_from\n"
	"reads one; step -1).  A [data.eval] whose samples differ from those the\n"
	"checkpoint's model was trained on is warned of (its samples are evaluated).\n"
	"stdout gets one JSON line: checkpoint, step, test_loss, test_acc, test_samples,\n"
	"eval_samples_per_s.\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error (or another model),\n"
	"3 data error (a corrupt checkpoint, or one holding NaN or inf weights).\n"
	"--fold evaluates the inference graph (docs/inference.md, Folding): each\n"
	"batchnorm folded into the conv or linear before it, dropout removed, bias and\n"
	"activation in the layer's epilogue ([run] fuse = 1).\n"
	"--quantized Q evaluates the INT8 model Q written by `kiln quantize` (no checkpoint\n"
	"is read; --checkpoint with it is refused): FILE's model folded, its conv and linear\n"
	"layers on the INT8 ops.  The keys that shape Q's tensors (as for a checkpoint) must\n"
	"equal those of the config Q records.\n";

int cmd_eval(int argc, char **argv)
{
	char **args = calloc((size_t)argc + 1, sizeof *args);
	const char *ckpt = NULL;
	struct kiln_eval_opts opts = { 0 };
	int n = 0;
	if (!args) {
		fprintf(stderr, "kiln: error: out of memory\n");
		return 1;
	}
	for (int i = 0; i < argc; i++) {
		int r;
		if (i > 0 && ((r = cli_opt(argc, argv, &i, "--checkpoint", &ckpt)) ||
			      (r = cli_opt(argc, argv, &i, "--quantized", &opts.quantized)))) {
			if (r < 0) {
				free(args);
				return 2;
			}
		} else if (!strcmp(argv[i], "--fold")) {
			opts.fold = 1;
		} else {
			args[n++] = argv[i];
		}
	}
	if (!cli_args_ok(n, args, cmd_eval_usage)) {
		free(args);
		return 2;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	struct kiln_train_result r = KILN_TRAIN_RESULT_INIT;
	kiln_status st = cli_named_file("checkpoint", ckpt);
	if (!st)
		st = cli_named_file("--quantized", opts.quantized);
	if (!st)
		st = cli_load(args[1], n, args, 2, &cfg, &reg);
	if (!st)
		st = kiln_evaluate_ex(cfg, reg, ckpt, &opts, &r);
	int rc = 0;
	if (st) {
		rc = cli_fail(st);
	} else {
		printf("{\"checkpoint\": ");
		cli_json_str(stdout, r.checkpoint);
		/* a non-finite loss (diverged weights, a hostile normalisation)
		 * is null: before session 36 a bare inf or -nan made the line
		 * not JSON */
		printf(", \"step\": %lld, \"test_loss\": ", (long long)r.steps);
		cli_json_num(stdout, "%.6f", r.test_loss);
		printf(", \"test_acc\": ");
		cli_json_num(stdout, "%.6f", r.test_acc);
		printf(", \"test_samples\": %lld, \"eval_samples_per_s\": ", (long long)r.test_samples);
		cli_json_num(stdout, "%.1f", r.eval_samples_per_s);
		printf("}\n");
		if (r.steps >= 0)
			fprintf(stderr, "test loss %.4f acc %.2f%% (%lld samples; checkpoint of step %lld)\n",
				common_nan_plain(r.test_loss), common_nan_plain(100 * r.test_acc), (long long)r.test_samples,
				(long long)r.steps);
		else /* a weights file, or a quantized one without its step */
			fprintf(stderr, "test loss %.4f acc %.2f%% (%lld samples; the weights of %s)\n",
				common_nan_plain(r.test_loss), common_nan_plain(100 * r.test_acc), (long long)r.test_samples,
				r.checkpoint);
	}
	kiln_registry_close(reg);
	kiln_config_free(cfg);
	free(args);
	return rc;
}
