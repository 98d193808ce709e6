/* core/optim/optim.h - what the built-in optimizer files share: each is
 * one fused device op (KILN_OP_SGD, _ADAMW, _LAMB) behind the optimizer
 * table of plugin.h (struct kiln_optim_ops), planned and run by fused.c,
 * with its hyper-parameters read through its own key rows (the only place
 * their defaults live). */
#ifndef KILN_OPTIM_OPTIM_H
#define KILN_OPTIM_OPTIM_H

#include "../internal.h"

/* A built-in optimizer's ctx: its fused op's type and constants (f[],
 * i[1]); plan() adds the buffers' descriptors. */
struct fused_optim {
	const struct kiln_host *h;
	struct kiln_optim_info info;
	struct kiln_op op;
};

/* The ctx of a fused op of `type` for open(); NULL after host->error. */
struct fused_optim *fused_optim_new(const struct kiln_host *h, int type);

/* [train] `key` as a number or bool: the config's value, else the default
 * of its row in `keys` (the optimizer's own rows; common [train] keys
 * default through the schema). */
kiln_status optim_get_float(const struct kiln_host *h, const struct kiln_config *cfg,
			    const struct kiln_key *keys, const char *key, double *v);
kiln_status optim_get_bool(const struct kiln_host *h, const struct kiln_config *cfg,
			   const struct kiln_key *keys, const char *key, int *v);

kiln_status fused_optim_plan(void *ctx, struct kiln_device *dev, const struct kiln_optim_shape *s,
			     void **plan, size_t *workspace);
kiln_status fused_optim_step(void *ctx, struct kiln_device *dev, void *plan,
			     const struct kiln_optim_args *a, void *stream);
void fused_optim_plan_free(void *ctx, struct kiln_device *dev, void *plan);
void fused_optim_close(void *ctx);

/* The optimizer table of a built-in whose open() is `open_fn`. */
#define FUSED_OPTIM_OPS(open_fn)                                                          \
	{ .version = KILN_OPTIM_OPS_VERSION, .open = open_fn, .close = fused_optim_close,  \
	  .plan = fused_optim_plan, .step = fused_optim_step,                              \
	  .plan_free = fused_optim_plan_free }

#define OPTIM_DESCRIPTOR(var, nm, sum, opsv, keysv)                                       \
	const struct kiln_plugin var = {                                                  \
		.abi_major = KILN_ABI_MAJOR, .abi_minor = KILN_ABI_MINOR,                 \
		.kind = KILN_PLUGIN_OPTIM, .name = nm, .summary = sum, .ops = &opsv,      \
		.keys = keysv, .probe = NULL,                                             \
	}

/* Adam's and AdamW's key rows (amsgrad, beta1, beta2, eps) and open(),
 * which LAMB shares; LAMB's rows are the same but amsgrad, the first */
extern const struct kiln_key optim_adam_keys[];
#define optim_lamb_keys (&optim_adam_keys[1])
kiln_status optim_adam_open(const struct kiln_host *h, const struct kiln_config *cfg, int type,
			    struct kiln_optim_info *info, void **ctx);

#endif
