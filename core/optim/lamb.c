/* core/optim/lamb.c - LAMB (You et al. 2019): AdamW's update scaled per
 * parameter tensor by the trust ratio norm(p) / norm(update), one fused op
 * (KILN_OP_LAMB) that reads the tensor offsets.  The norms need each tensor
 * whole, so ZeRO-1 cannot shard it.  No amsgrad: optim_adam_open reads
 * the key for KILN_OP_ADAMW only, and an amsgrad set with lamb is warned
 * ignored (run_config.c). */
#include "optim.h"

static kiln_status lamb_open(const struct kiln_host *h, const struct kiln_config *cfg,
			     struct kiln_optim_info *info, void **ctx)
{
	kiln_status st = optim_adam_open(h, cfg, KILN_OP_LAMB, info, ctx);
	if (st)
		return st;
	struct fused_optim *f = *ctx;
	f->info.needs_offsets = 1;
	f->info.shard = KILN_OPTIM_SHARD_NONE;
	*info = f->info;
	return KILN_OK;
}

static const struct kiln_optim_ops lamb_ops = FUSED_OPTIM_OPS(lamb_open);

OPTIM_DESCRIPTOR(kiln_optim_lamb, "lamb",
		 "LAMB: AdamW's update scaled per tensor by the trust ratio (You et al. 2019)",
		 lamb_ops, optim_lamb_keys);
