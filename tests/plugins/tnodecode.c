/* tests/plugins/nodecode/kiln-tnodecode.so: the CPU device (kiln-cpu.so
 * of this build tree, CPU_SO) under the name "tnodecode", auto score 200
 * (auto picks it over cpu), whose has_op says no to ATTENTION_DECODE: a
 * stand-in for the CUDA device in tests/generate_device.sh, so that the
 * fallback and refusal of `kiln generate` run without a GPU.  Beside it,
 * "tprefill28": the CPU device as it is but for its abi_minor, 28, a
 * device built before ABI 2.31, which the core asks for no decoding
 * attention of several positions (a prompt's prefill): `kiln generate`
 * feeds the prompt a position a step on it (tests/generate_device.sh),
 * nor the dampening, amsgrad or schedules of 2.29 and 2.30: `kiln train`
 * is refused them (tests/optim_old_abi.sh); and "tnorun": the CPU device
 * under ABI 2.31 whose has_op says no to ATTENTION_DECODE_RUN, as a
 * device written for ATTENTION_DECODE alone and rebuilt against 2.31's
 * headers does: the prompt is fed a position a step on it too.
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include <kiln/plugin.h>
#include <kiln/ops.h>
#include <dlfcn.h>
#include <stdio.h>

static struct kiln_device_ops ops, ops_norun;
static struct kiln_plugin plug, plug28, plug_norun;

static int has_op(void *ctx, int type)
{
	(void)ctx;
	return type != KILN_OP_ATTENTION_DECODE;
}

static int has_op_norun(void *ctx, int type)
{
	(void)ctx;
	return type != KILN_OP_ATTENTION_DECODE_RUN;
}

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	static const struct kiln_plugin *list[] = { &plug, &plug28, &plug_norun, NULL };
	void *h = dlopen(CPU_SO, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "kiln-tnodecode: %s\n", dlerror());
		return NULL;
	}
	kiln_plugin_init_fn init = (kiln_plugin_init_fn)dlsym(h, "kiln_plugin_init");
	const struct kiln_plugin *const *l = init ? init(host) : NULL;
	if (!l || !l[0])
		return NULL;
	plug = plug28 = plug_norun = *l[0];
	plug28.name = "tprefill28";
	plug28.abi_minor = 28;
	plug28.keys = NULL;
	ops = ops_norun = *(const struct kiln_device_ops *)plug.ops;
	ops_norun.has_op = has_op_norun;
	plug_norun.ops = &ops_norun;
	plug_norun.name = "tnorun";
	plug_norun.keys = NULL;
	ops.has_op = has_op;
	ops.traits.auto_score = 200;
	plug.ops = &ops;
	plug.name = "tnodecode";
	plug.keys = NULL;
	return list;
}
