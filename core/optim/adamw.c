/* core/optim/adamw.c - AdamW exactly as torch.optim.AdamW and Adam as
 * torch.optim.Adam: both KILN_OP_ADAMW, AdamW's weight decay decoupled
 * (f[3]), Adam's added to the gradient (f[4], L2), either with amsgrad
 * (i[1], a third state slot: PyTorch's max_exp_avg_sq).  The keys and
 * open() serve LAMB too (lamb.c), which has no amsgrad row and never reads
 * the key (run_config.c warns that it is ignored). */
#include "optim.h"

/* adam's and adamw's rows; LAMB's are the same after the first
 * (optim_lamb_keys: no amsgrad) */
const struct kiln_key optim_adam_keys[] = {
	{ "amsgrad", KILN_KEY_BOOL, "0", 0, 0, NULL,
	  "adam, adamw: AMSGrad, torch.optim.Adam/AdamW(amsgrad=True): the step divides by the root of the largest second moment so far (max over the steps of the raw moment, then bias-corrected with this step's 1 - beta2^t, as PyTorch), kept as a third state tensor, `optim.max_exp_avg_sq` in checkpoints (4 more bytes per parameter; ZeRO-1 shards it). A checkpoint written without it resumes only with amsgrad = 0 (a resume compares the config). lamb ignores it (a warning)." },
	{ "beta1", KILN_KEY_FLOAT, "0.9", 0, 1, NULL,
	  "adam, adamw, lamb: decay of the first moment (below 1)." },
	{ "beta2", KILN_KEY_FLOAT, "0.999", 0, 1, NULL,
	  "adam, adamw, lamb: decay of the second moment (below 1)." },
	{ "eps", KILN_KEY_FLOAT, "1e-8", 0, 1, NULL,
	  "adam, adamw, lamb: added to the bias-corrected root of the second moment." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

kiln_status optim_adam_open(const struct kiln_host *h, const struct kiln_config *cfg, int type,
			    struct kiln_optim_info *info, void **ctx)
{
	double b1, b2, eps, wd;
	int amsgrad = 0;
	kiln_status st;
	if ((st = optim_get_float(h, cfg, optim_adam_keys, "beta1", &b1)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "beta2", &b2)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "eps", &eps)) ||
	    (st = optim_get_float(h, cfg, optim_adam_keys, "weight_decay", &wd)) ||
	    (type == KILN_OP_ADAMW &&
	     (st = optim_get_bool(h, cfg, optim_adam_keys, "amsgrad", &amsgrad))))
		return st;
	if (!(b1 < 1) || !(b2 < 1))
		return h->error(KILN_ECONFIG, "%s: [train] beta%d = %g: betas must be below 1 (the bias correction divides by 1 - beta^t)",
				h->config_where(cfg, "train", b1 < 1 ? "beta2" : "beta1"),
				b1 < 1 ? 2 : 1, b1 < 1 ? b2 : b1);
	struct fused_optim *f = fused_optim_new(h, type);
	if (!f)
		return KILN_ENOMEM;
	f->info.state_slots = 2 + (amsgrad != 0);
	f->info.slot_names[0] = "optim.exp_avg";
	f->info.slot_names[1] = "optim.exp_avg_sq";
	if (amsgrad)
		f->info.slot_names[2] = "optim.max_exp_avg_sq"; /* PyTorch's name */
	f->info.needs_step = 1;
	f->op.i[1] = amsgrad != 0;
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

/* Adam: the same op and state as AdamW, its weight decay moved from the
 * decoupled constant f[3] to the L2 one f[4] (kiln/ops.h, ABI 2.28).  It
 * reads weight_decay_mode (decay_modes) only to refuse `decoupled`, which
 * is adamw. */
static kiln_status adam_open(const struct kiln_host *h, const struct kiln_config *cfg,
			     struct kiln_optim_info *info, void **ctx)
{
	const char *mode = h->config_get(cfg, "train", "weight_decay_mode");
	const char *where = h->config_where(cfg, "train", "weight_decay_mode");
	if (mode && !strcmp(mode, "decoupled") && strcmp(where, "default"))
		return h->error(KILN_ECONFIG, "%s: [train] weight_decay_mode = decoupled with optimizer = adam: Adam's weight decay is L2, added to the gradient (torch.optim.Adam); decoupled weight decay is `optimizer = adamw`",
				where);
	kiln_status st = optim_adam_open(h, cfg, KILN_OP_ADAMW, info, ctx);
	if (st)
		return st;
	struct fused_optim *f = *ctx;
	f->op.f[4] = f->op.f[3];
	f->op.f[3] = 0;
	f->info.decay_modes = 1;
	*info = f->info;
	return KILN_OK;
}

static const struct kiln_optim_ops adamw_ops = FUSED_OPTIM_OPS(adamw_open);
static const struct kiln_optim_ops adam_ops = FUSED_OPTIM_OPS(adam_open);

OPTIM_DESCRIPTOR(kiln_optim_adamw, "adamw",
		 "AdamW with decoupled weight decay (torch.optim.AdamW)", adamw_ops,
		 optim_adam_keys);
OPTIM_DESCRIPTOR(kiln_optim_adam, "adam",
		 "Adam with L2 (coupled) weight decay (torch.optim.Adam)", adam_ops,
		 optim_adam_keys);
