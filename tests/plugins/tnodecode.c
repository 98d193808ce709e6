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
 * headers does: the prompt is fed a position a step on it too; and
 * "tnosums": the CPU device under ABI 2.32 whose prepare answers
 * KILN_EINVAL for GRAD_SUMSQ, as an outside 2.32 device without the op
 * and without has_op may: `kiln train` keeps GRAD_CLIP's one pass on it
 * (tests/grad_sums.sh); and "tknown31": the CPU device under ABI 2.31
 * with a has_op that knows 2.31's op types (KILN_OP_TYPE_COUNT was 53)
 * and says on stderr when it is asked about another, as a has_op that
 * indexes a table by its own count would read past it: the core asks it
 * about no op after 2.31's (before session 45 `kiln train` asked it about
 * GRAD_SUMSQ, 53; tests/grad_sums.sh); and "tnornn24": the CPU device
 * under ABI 2.24 whose has_op says no to RNN and RNN_BWD, as a device
 * without the recurrent ops: a recurrent layer with `last = 1` (2.25) is
 * refused as RNN not implemented, not as built before 2.25 (before the
 * fix of session 45 it was; tests/rnn_last.sh).
 *
 * Not installed, not in the default search path (check_LTLIBRARIES).
 */
#include <kiln/plugin.h>
#include <kiln/ops.h>
#include <dlfcn.h>
#include <stdio.h>

static struct kiln_device_ops ops, ops_norun, ops_nosums, ops_known31, ops_nornn;
static struct kiln_plugin plug, plug28, plug_norun, plug_nosums, plug_known31, plug_nornn;
static const struct kiln_host *host0;
static kiln_status (*cpu_prepare)(void *, const struct kiln_op *, void **, size_t *);

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

static int has_op_nornn(void *ctx, int type)
{
	(void)ctx;
	return type != KILN_OP_RNN && type != KILN_OP_RNN_BWD;
}

/* 2.31's op types, KILN_OP_GEMM .. KILN_OP_ATTENTION_DECODE_RUN (52) */
static int has_op_known31(void *ctx, int type)
{
	(void)ctx;
	if (type <= 0 || type > KILN_OP_ATTENTION_DECODE_RUN) {
		fprintf(stderr, "tknown31: has_op asked about op type %d, which ABI 2.31 does not have\n",
			type);
		return 0;
	}
	return 1;
}

static kiln_status prepare_nosums(void *ctx, const struct kiln_op *op, void **plan, size_t *ws)
{
	if (op->type == KILN_OP_GRAD_SUMSQ) {
		return host0->error(KILN_EINVAL, "tnosums: GRAD_SUMSQ: bad op");
	}
	return cpu_prepare(ctx, op, plan, ws);
}

KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(const struct kiln_host *host)
{
	static const struct kiln_plugin *list[] = { &plug, &plug28, &plug_norun, &plug_nosums,
						    &plug_known31, &plug_nornn, NULL };
	void *h = dlopen(CPU_SO, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "kiln-tnodecode: %s\n", dlerror());
		return NULL;
	}
	kiln_plugin_init_fn init = (kiln_plugin_init_fn)dlsym(h, "kiln_plugin_init");
	const struct kiln_plugin *const *l = init ? init(host) : NULL;
	if (!l || !l[0])
		return NULL;
	host0 = host;
	plug = plug28 = plug_norun = plug_nosums = plug_known31 = plug_nornn = *l[0];
	plug28.name = "tprefill28";
	plug28.abi_minor = 28;
	plug28.keys = NULL;
	ops = *(const struct kiln_device_ops *)plug.ops;
	ops_norun = ops_nosums = ops_known31 = ops_nornn = ops;
	ops_nornn.has_op = has_op_nornn;
	plug_nornn.ops = &ops_nornn;
	plug_nornn.name = "tnornn24";
	plug_nornn.abi_minor = 24;
	plug_nornn.keys = NULL;
	ops_known31.has_op = has_op_known31;
	plug_known31.ops = &ops_known31;
	plug_known31.name = "tknown31";
	plug_known31.abi_minor = 31;
	plug_known31.keys = NULL;
	cpu_prepare = ops_nosums.prepare;
	ops_nosums.prepare = prepare_nosums;
	ops_nosums.has_op = NULL;
	plug_nosums.ops = &ops_nosums;
	plug_nosums.name = "tnosums";
	plug_nosums.keys = NULL;
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
