/* core/optim/sgd.c - SGD with momentum (and torch.optim.SGD's dampening),
 * Nesterov, and L2 or decoupled (SGDW) weight decay: KILN_OP_SGD.  Plain
 * SGD (momentum 0) keeps no state. */
#include "optim.h"

static const struct kiln_key sgd_keys[] = {
	{ "momentum", KILN_KEY_FLOAT, "0.9", 0, 1, NULL,
	  "SGD momentum; 0 = plain SGD, which keeps no optimizer state. The default 0.9 is not torch.optim.SGD's (0): set 0 to port a PyTorch SGD without momentum." },
	{ "dampening", KILN_KEY_FLOAT, "0", 0, 1, NULL,
	  "SGD: torch.optim.SGD's dampening: from the second step on the momentum buffer is momentum x buffer + (1 - dampening) x gradient; the first step's buffer is the gradient itself, undamped, as PyTorch's. Read only with momentum > 0 (without momentum it changes nothing, as in PyTorch); with `nesterov = 1` it must be 0 (PyTorch refuses the pair too)." },
	{ "nesterov", KILN_KEY_BOOL, "0", 0, 0, NULL, "SGD: Nesterov momentum." },
	{ NULL, 0, NULL, 0, 0, NULL, NULL }
};

static kiln_status sgd_open(const struct kiln_host *h, const struct kiln_config *cfg,
			    struct kiln_optim_info *info, void **ctx)
{
	double mu, wd, damp;
	int nesterov;
	kiln_status st;
	if ((st = optim_get_float(h, cfg, sgd_keys, "momentum", &mu)) ||
	    (st = optim_get_float(h, cfg, sgd_keys, "dampening", &damp)) ||
	    (st = optim_get_float(h, cfg, sgd_keys, "weight_decay", &wd)) ||
	    (st = optim_get_bool(h, cfg, sgd_keys, "nesterov", &nesterov)))
		return st;
	if (nesterov && mu == 0)
		return h->error(KILN_ECONFIG, "%s: [train] nesterov = 1 needs momentum > 0 (as torch.optim.SGD: without it Nesterov's step is plain SGD's)",
				h->config_where(cfg, "train", "nesterov"));
	if (nesterov && damp != 0)
		return h->error(KILN_ECONFIG, "%s: [train] dampening = %g with nesterov = 1: Nesterov momentum needs dampening 0 (torch.optim.SGD refuses the pair too)",
				h->config_where(cfg, "train", "dampening"), damp);
	const char *mode = h->config_get(cfg, "train", "weight_decay_mode");
	struct fused_optim *f = fused_optim_new(h, KILN_OP_SGD);
	if (!f)
		return KILN_ENOMEM;
	f->info.state_slots = mu != 0 ? 1 : 0;
	f->info.slot_names[0] = "optim.momentum";
	f->info.shard = KILN_OPTIM_SHARD_SLICE;
	f->info.decay_modes = 1;
	f->op.i[1] = nesterov;
	f->op.f[0] = mu;
	/* L2 into the gradient, or SGDW */
	f->op.f[mode && !strcmp(mode, "decoupled") ? 2 : 1] = wd;
	/* the dampening (ABI 2.29) only where a momentum buffer reads it:
	 * the op then takes the step count (its first step is undamped) */
	if (mu != 0 && damp != 0) {
		f->op.f[3] = damp;
		f->info.needs_step = 1;
	}
	*info = f->info;
	*ctx = f;
	return KILN_OK;
}

static const struct kiln_optim_ops sgd_ops = FUSED_OPTIM_OPS(sgd_open);

OPTIM_DESCRIPTOR(kiln_optim_sgd, "sgd",
		 "SGD with momentum, Nesterov, L2 or decoupled weight decay (torch.optim.SGD)",
		 sgd_ops, sgd_keys);
