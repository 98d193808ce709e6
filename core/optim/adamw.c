/* core/optim/adamw.c - AdamW exactly as torch.optim.AdamW (amsgrad off):
 * KILN_OP_ADAMW.  Its keys and open() serve LAMB too (lamb.c). */
#include "optim.h"

const struct kiln_key optim_adam_keys[] = {
	{ "beta1", KILN_KEY_FLOAT, "0.9", 0, 1, NULL,
	  "adamw, lamb: decay of the first moment (below 1)." },
	{ "beta2", KILN_KEY_FLOAT, "0.999", 0, 1, NULL,
	  "adamw, lamb: decay of the second moment (below 1)." },
	{ "eps", KILN_KEY_FLOAT, "1e-8", 0, 1, NULL,
	  "adamw, lamb: added to the bias-corrected root of the second moment." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

kiln_status optim_adam_open(const struct kiln_host *h, const struct kiln_config *cfg, int type,
			    struct kiln_optim_info *info, void **ctx)
{
	double b1, b2, eps, wd;
	kiln_status st;
	if ((st = optim_get_float(h, cfg, optim_adam_keys, "beta1", &b1)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "beta2", &b2)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "eps", &eps)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "weight_decay", &wd)))
		return st;
	if (!(b1 < 1) || !(b2 < 1))
		return h->error(KILN_ECONFIG, "%s: [train] beta%d = %g: betas must be below 1 (the bias correction divides by 1 - beta^t)",
				h->config_where(cfg, "train", b1 < 1 ? "beta2" : "beta1"),
				b1 < 1 ? 2 : 1, b1 < 1 ? b2 : b1);
	struct fused_optim *f = fused_optim_new(h, type);
	if (!f)
		return KILN_ENOMEM;
	f->info.state_slots = 2;
	f->info.slot_names[0] = "optim.exp_avg";
	f->info.slot_names[1] = "optim.exp_avg_sq";
	f->info.needs_step = 1;
	f->info.shard = KILN_OPTIM_SHARD_SLICE;
	f->op.f[0] = b1;
	f->op.f[1] = b2;
	f->op.f[2] = eps;
	f->op.f[3] = wd;
	*info = f->info;
	*ctx = f;
	return KILN_OK;
}

static kiln_status adamw_open(const struct kiln_host *h, const struct kiln_config *cfg,
			      struct kiln_optim_info *info, void **ctx)
{
	return optim_adam_open(h, cfg, KILN_OP_ADAMW, info, ctx);
}

static const struct kiln_optim_ops adamw_ops = FUSED_OPTIM_OPS(adamw_open);

OPTIM_DESCRIPTOR(kiln_optim_adamw, "adamw",
		 "AdamW with decoupled weight decay (torch.optim.AdamW)", adamw_ops,
		 optim_adam_keys);
