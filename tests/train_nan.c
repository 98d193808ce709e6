/* tests/train_nan.c - `kiln train` with a forced non-finite gradient, for
 * the shell tests of the non-finite check (tests/pipeline_dist.sh,
 * tests/optim_guards.sh):
 *
 *   train_nan STEP[-LAST] INI [section.key=value ...]
 *
 * trains INI with the overrides and, at optimizer step STEP (or at each of
 * steps STEP..LAST), writes NaN (or KILN_NAN_VALUE, e.g. inf) into the
 * last element of the flat gradients (or element KILN_NAN_INDEX) through
 * the gradient hook, after the backward and before the clip / non-finite
 * check, on the rank that KILN_NAN_RANK names (unset: every rank, or the
 * one process).  The last element may be alignment padding after the head
 * bias, in no parameter: the norm sees it, the optimizer does not (and
 * backward never rewrites it: every later step's norm is NaN too).
 * Plugins come from KILN_PLUGIN_PATH; KILN_LOG_LEVEL=debug logs at debug
 * level, as `kiln` does (tests/grad_sums.sh).  Exit 0 when the training
 * succeeded, 1 with kiln's error otherwise. */
#include <kiln/kiln.h>
#include <kiln/plugin.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct inject {
	int64_t step, last, index;
	void *fill;
};

static kiln_status inject_nan(void *user, struct kiln_device *dev, void *stream, float *grads,
			      size_t n, int64_t step)
{
	struct inject *in = user;
	kiln_status st;
	if (step < in->step || step > in->last || !n)
		return KILN_OK;
	if (in->index < 0 || (size_t)in->index >= n)
		in->index = (int64_t)n - 1;
	if (!in->fill) {
		struct kiln_op op;
		int64_t one = 1;
		memset(&op, 0, sizeof op);
		op.type = KILN_OP_FILL;
		op.n_out = 1;
		op.f[0] = getenv("KILN_NAN_VALUE") ? strtod(getenv("KILN_NAN_VALUE"), NULL) : NAN;
		kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
		if ((st = kiln_device_prepare(dev, &op, &in->fill, NULL)))
			return st;
	}
	struct kiln_op_args a = { .out = { grads + in->index } };
	return kiln_device_run(dev, in->fill, &a, stream);
}

int main(int argc, char **argv)
{
	struct kiln_config *cfg = NULL;
	struct kiln_registry *reg = NULL;
	struct kiln_train_result res = KILN_TRAIN_RESULT_INIT;
	struct inject in = { 0, 0, -1, NULL };
	const char *index = getenv("KILN_NAN_INDEX");
	char *end;
	const char *who = getenv("KILN_NAN_RANK"), *rank = getenv("KILN_RANK");
	kiln_status st;
	if (index)
		in.index = strtoll(index, NULL, 10);
	if (getenv("KILN_LOG_LEVEL") && !strcmp(getenv("KILN_LOG_LEVEL"), "debug"))
		kiln_log_set_level(KILN_LOG_DEBUG);
	if (argc >= 3) {
		in.step = in.last = strtoll(argv[1], &end, 10);
		if (*end == '-')
			in.last = strtoll(end + 1, &end, 10);
	}
	if (argc < 3 || in.step < 1 || in.last < in.step || *end) {
		fprintf(stderr, "usage: train_nan STEP[-LAST] INI [section.key=value ...]\n");
		return 2;
	}
	st = kiln_config_load(argv[2], &cfg);
	for (int i = 3; !st && i < argc; i++)
		st = kiln_config_override(cfg, argv[i]);
	if (!st)
		st = kiln_registry_open(NULL, &reg);
	if (!st)
		st = kiln_config_validate(cfg, reg);
	if (!st) {
		if (!who || !strcmp(who, rank ? rank : "0"))
			kiln_set_grad_hook(inject_nan, &in);
		st = kiln_train(cfg, reg, NULL, NULL, &res);
		kiln_set_grad_hook(NULL, NULL);
	}
	if (st)
		fprintf(stderr, "train_nan: %s\n", kiln_last_error());
	if (in.fill && in.last == in.step)
		fprintf(stderr, "train_nan: NaN written at step %lld\n", (long long)in.step);
	else if (in.fill)
		fprintf(stderr, "train_nan: NaN written from step %lld (to %lld)\n", (long long)in.step,
			(long long)in.last);
	kiln_config_free(cfg);
	kiln_registry_close(reg);
	return st ? 1 : 0;
}
