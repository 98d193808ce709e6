/* cli/cmd_memory.c - `kiln memory FILE [overrides]`: what training FILE
 * will allocate, from the plans alone, before any step. */
#include "build-config.h"
#include "cli.h"

#include <stdio.h>

const char cmd_memory_usage[] =
	"usage: kiln memory FILE [section.key=value ...]\n";
const char cmd_memory_about[] =
	"Build the model, training and evaluation plans FILE describes (as `kiln train`\n"
	"would, train.batch=N to try another batch) and print, before any step, the bytes\n"
	"of parameters, gradients, optimizer state, batchnorm buffers, activations (the\n"
	"lifetime-packed arena, and per layer: output, saved for backward, gradient),\n"
	"workspace and input buffers, the total, and the layer whose forward or backward\n"
	"holds the most activations.  The last line on stdout is the same as JSON.\n"
	"Under a launcher's variables (KILN_RANK and KILN_WORLD_SIZE, or `kiln launch -n N\n"
	"-- kiln memory FILE`) one rank's: with [dist] zero = 1 its shard of the optimizer\n"
	"state and its pieces of the gradients, the gradients in the communicator's shared\n"
	"memory (host memory) where the run puts them (docs/memory.md).\n"
	"Exit codes: 0 ok, 1 failure, 2 usage or config error, 3 data error.\n";

int cmd_memory(int argc, char **argv)
{
	if (!cli_args_ok(argc, argv, cmd_memory_usage))
		return 2;
	struct kiln_config *cfg;
	struct kiln_registry *reg;
	struct kiln_memory r = KILN_MEMORY_INIT;
	kiln_status st = cli_load(argv[1], argc, argv, 2, &cfg, &reg);
	if (!st) /* resolves batch = auto */
		st = kiln_memory_report(cfg, reg, stdout, &r);
	int rc = 0;
	if (st)
		rc = cli_fail(st);
	else
		printf("{\"batch\": %lld, \"params\": %zu, \"grads\": %zu, \"optim_state\": %zu, "
		       "\"buffers\": %zu, \"activations\": %zu, \"activations_unpacked\": %zu, "
		       "\"workspace\": %zu, \"eval\": %zu, \"inputs\": %zu, \"other\": %zu, \"total\": %zu, "
		       "\"peak_live\": %zu, \"recompute_segments\": %d, \"recomputed\": %d, \"host\": %zu, \"library\": %zu, \"cache\": %zu}\n",
		       (long long)r.batch, r.params, r.grads, r.optim_state, r.buffers, r.activations,
		       r.activations_unpacked, r.workspace, r.eval, r.inputs, r.other, r.total, r.peak_live,
		       r.recompute_segments, r.recomputed, r.host, r.library, r.cache);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return rc;
}
