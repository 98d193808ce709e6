/* cli/cmd_export.c - `kiln export CONFIG --safetensors FILE [--format F]`:
 * build CONFIG's model, load its weights, write every parameter and buffer
 * with PyTorch's names and layouts, or the GPT-2 release's
 * (docs/safetensors.md); `--onnx FILE`: its evaluation graph as an ONNX
 * model (docs/inference.md); with `--quantized Q`, the INT8 model Q in
 * ONNX's QDQ format. */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* (the lines cli_bad_arg_usage reads the options from) */
static const char export_usage_lines[] =
	"usage: kiln export CONFIG --safetensors FILE [--format pytorch|gpt2] [--checkpoint CKPT]\n"
	"                   [section.key=value ...]\n"
	"       kiln export CONFIG --onnx FILE [--checkpoint CKPT | --quantized Q]\n"
	"                   [section.key=value ...]\n";

static void export_usage(FILE *f)
{
	fprintf(f, "%s\n"
		   "Build the model CONFIG describes (the sample shape comes from the checkpoint,\n"
		   "[data] not opened, else from its [data] source),\n"
		   "load the weights of its run and write every parameter and buffer to FILE as\n"
		   "safetensors: names `<layer>.<parameter>` (conv1.weight, bn1.running_mean, plus\n"
		   "bn1.num_batches_tracked), PyTorch's layouts, so torch's\n"
		   "load_state_dict(strict=True) takes it for a module named alike.\n"
		   "--format gpt2: the GPT-2 release's layouts, as Hugging Face's GPT2LMHeadModel\n"
		   "saves them: the same names (name the layers transformer.h.0.attn.c_attn, ...,\n"
		   "as examples/gpt2_small.ini does), the weights of the linear layers named\n"
		   "c_attn, c_proj, c_fc stored [in, out] (GPT-2's Conv1D), a tied lm_head once,\n"
		   "as transformer.wte.weight; read back with [model] init_format = gpt2.\n"
		   "--onnx FILE: the evaluation graph instead, fp32, as an ONNX model (IR version 8,\n"
		   "opset 17): input \"input\" [N, ...] (images NCHW, normalised as [data] says),\n"
		   "output \"logits\" (what the loss layer reads), the weights as initializers\n"
		   "under the names above; a layer with no ONNX mapping fails, named.\n"
		   "--quantized Q (with --onnx): the INT8 model Q of `kiln quantize` (CONFIG's model\n"
		   "folded, Q's weights) in ONNX's QDQ format: each INT8 conv/linear reads its input\n"
		   "through QuantizeLinear/DequantizeLinear (the calibrated scale, u8 or i8, zero\n"
		   "point 0) and its int8 weight through DequantizeLinear (per-channel scales, axis 0).\n"
		   "The weights: those of checkpoint CKPT (--checkpoint; or a weights file, safetensors\n"
		   "or llm.c's, read as [model] init_from reads one), else of the newest usable\n"
		   "checkpoint in [run] out_dir/checkpoints (verified whole first; its layer keys\n"
		   "must be CONFIG's; [model] init_from is not read), else those of [model]\n"
		   "init_from, else, with a warning, the initial ones of [run] seed.\n"
		   "FILE must not be CONFIG, CKPT, Q, [model] init_from or any kiln checkpoint\n"
		   "(exit 2, nothing written); it is written whole or not at all.\n"
		   "Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n", export_usage_lines);
}

int cmd_export(int argc, char **argv)
{
	if (cli_wants_help(argc, argv)) {
		export_usage(stdout);
		return 0;
	}
	if (argc < 2 || argv[1][0] == '-') {
		if (argc >= 2)
			cli_bad_arg_usage(argc, argv, 1, export_usage_lines);
		export_usage(stderr);
		return 2;
	}
	const char *out = NULL, *onnx = NULL, *ckpt = NULL, *quantized = NULL;
	int format = KILN_WEIGHTS_PYTORCH, format_given = 0;
	char **over = calloc((size_t)argc, sizeof *over); /* the overrides alone */
	int n_over = 0;
	if (!over)
		return 1;
	for (int i = 2; i < argc; i++) {
		const char *fmt = NULL;
		int r;
		if ((r = cli_opt(argc, argv, &i, "--safetensors", &out)) ||
		    (r = cli_opt(argc, argv, &i, "--onnx", &onnx)) ||
		    (r = cli_opt(argc, argv, &i, "--checkpoint", &ckpt)) ||
		    (r = cli_opt(argc, argv, &i, "--quantized", &quantized)) ||
		    (r = cli_opt(argc, argv, &i, "--format", &fmt))) {
			format_given |= fmt != NULL;
			if (fmt && (format = kiln_weights_format(fmt)) < 0)
				fprintf(stderr, "kiln: error: --format '%s': expected pytorch or gpt2\n", fmt);
			if (r < 0 || format < 0) {
				free(over);
				return 2;
			}
		} else if (argv[i][0] == '-' || !strchr(argv[i], '=')) {
			cli_bad_arg_usage(argc, argv, i, export_usage_lines);
			export_usage(stderr);
			free(over);
			return 2;
		} else {
			over[n_over++] = argv[i];
		}
	}
	if (!out == !onnx || (quantized && (!onnx || ckpt))) {
		fprintf(stderr, "kiln: error: %s\n",
			!out == !onnx ? "give one of --safetensors FILE and --onnx FILE"
				      : "--quantized Q goes with --onnx FILE and no --checkpoint (Q carries the weights)");
		export_usage(stderr);
		free(over);
		return 2;
	}
	/* an empty name: refused before any work (before session 36 `--onnx=`
	 * built the model, then failed ": cannot write", exit 1) */
	if (cli_empty_out("--onnx", onnx) || cli_empty_out("--safetensors", out)) {
		free(over);
		return 2;
	}
	if (onnx && format_given) { /* ignored before session 31 */
		fprintf(stderr, "kiln: error: --format names the tensors of --safetensors FILE: --onnx ignores it (drop --format)\n");
		free(over);
		return 2;
	}
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	/* no input overwritten: CONFIG here, the checkpoint (or weights, or Q)
	 * again in kiln_export_*, with [model] init_from (before session 31
	 * `--checkpoint C --safetensors C` replaced C and exited 0) */
	const char *in[3] = { argv[1], ckpt, quantized };
	kiln_status st = cli_named_file("checkpoint", ckpt);
	if (!st)
		st = cli_named_file("--quantized", quantized);
	if (!st)
		st = kiln_output_check(onnx ? onnx : out, in, 3);
	/* nor a file of [data], opened for the sample's shape, refused there */
	kiln_output_watch(onnx ? onnx : out);
	/* option values may contain '=': pass only the overrides */
	if (!st)
		st = cli_load(argv[1], n_over, over, 0, &cfg, &reg);
	if (!st && onnx && quantized)
		st = kiln_export_onnx_quantized(cfg, reg, quantized, onnx);
	else if (!st && onnx)
		st = kiln_export_onnx(cfg, reg, ckpt, onnx);
	else if (!st)
		st = kiln_export_safetensors_as(cfg, reg, ckpt, out, format);
	int rc = 0;
	if (st)
		rc = cli_fail(st);
	else
		fprintf(stderr, "wrote %s%s\n", onnx ? onnx : out, onnx && quantized ? " (ONNX QDQ INT8, opset 17)" : onnx ? " (ONNX, opset 17)" : "");
	kiln_output_watch(NULL);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	free(over);
	return rc;
}
