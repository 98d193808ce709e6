/* core/train_plateau.c - [train] schedule = plateau in the trainer:
 * ReduceLROnPlateau (core/plateau.c's rule) on the loss of each
 * evaluation point (eval_every's or the epoch's; [data.val]'s when there
 * is one, as early stopping's), rank 0's loss on every rank
 * (train_eval.c, eval_agree).  The rate lives on the device as an f32
 * the step multiplies the schedule op's warm-up factor by (KILN_OP_MUL:
 * lr = factor x plateau rate, the factor (t + 1) / warmup in the warm-up,
 * 1 after), written from the host at an evaluation that cuts it, so a
 * step reads no host value and a captured step replays the current rate.
 * The state is the checkpoint's "plateau" section (train_ckpt.c), so a
 * resumed run, however it stopped, goes on with the uninterrupted run's
 * rates. */
#include "train_setup.h"

#include <math.h>
#include <string.h>

/* [train] plateau_* into *c (their checks: kiln_train_cfg_read,
 * core/run_config.c). */
kiln_status trainer_plateau_cfg(const struct kiln_config *cfg, struct kiln_plateau_cfg *c)
{
	const char *mode = NULL;
	kiln_status st;
	memset(c, 0, sizeof *c);
	if ((st = kiln_config_get_float(cfg, "train", "plateau_factor", &c->factor)) ||
	    (st = kiln_config_get_int(cfg, "train", "plateau_patience", &c->patience)) ||
	    (st = kiln_config_get_float(cfg, "train", "plateau_threshold", &c->threshold)) ||
	    (st = kiln_config_get_str(cfg, "train", "plateau_threshold_mode", &mode)) ||
	    (st = kiln_config_get_int(cfg, "train", "plateau_cooldown", &c->cooldown)) ||
	    (st = kiln_config_get_float(cfg, "train", "plateau_min_lr", &c->min_lr)))
		return st;
	c->rel = !mode || strcmp(mode, "abs");
	return KILN_OK;
}

/* The device's rate from the host's state (a copy on the compute
 * stream: the next step's MUL reads it after) */
static kiln_status plateau_upload(struct trainer *t)
{
	t->plateau_host[0] = (float)t->plateau.lr;
	return kiln_device_copy_async(t->dev, t->plateau_d, t->plateau_host, sizeof(float),
				      KILN_COPY_H2D, t->compute);
}

/* From prep_schedule, with schedule = plateau: its keys, its state (the
 * checkpoint's, t->plateau_have, or a fresh one at lr: [train] lr as
 * lr_scale scales it), the device's rate and the MUL that applies it.
 * rescale: lr_scale's factor in this run's global batch over the
 * checkpoint's (1 unless a resume changed the global batch with lr_scale
 * set): the checkpoint's rate is scaled by it, as every other schedule's
 * base follows the new global batch (min_lr, as written, is not scaled,
 * nor does the rescaled rate stop at it: ReduceLROnPlateau applies
 * min_lr at a cut only). */
kiln_status trainer_plateau_prepare(struct trainer *t, double lr, double rescale)
{
	struct kiln_op op;
	int64_t one = 1;
	kiln_status st;
	if ((st = trainer_plateau_cfg(t->cfg, &t->plateau_cfg)))
		return st;
	if (t->plateau_have && rescale != 1.0) {
		if (!t->rank)
			kiln_log(KILN_LOG_INFO, "train", "resume: schedule = plateau: the global batch changes from %lld to %lld with lr_scale = %s: the checkpoint's lr %.9g x %.9g = %.9g",
				 (long long)t->G_ckpt, (long long)t->G, t->tc.lr_scale,
				 t->plateau.lr, rescale, t->plateau.lr * rescale);
		t->plateau.lr *= rescale;
	}
	if (!t->plateau_have)
		kiln_plateau_init(&t->plateau, lr);
	else if (!t->rank)
		kiln_log(KILN_LOG_INFO, "train", "resume: schedule = plateau at lr %.9g (best loss %.9g, %lld evaluation(s) without improvement, cooldown %lld, %lld evaluation(s) seen)",
			 t->plateau.lr, t->plateau.best, (long long)t->plateau.bad,
			 (long long)t->plateau.cooldown, (long long)t->plateau.evals);
	memset(&op, 0, sizeof op);
	op.type = KILN_OP_MUL;
	op.n_in = 2;
	op.n_out = 1;
	kiln_tensor_desc_init(&op.in[0], KILN_F32, 1, &one);
	kiln_tensor_desc_init(&op.in[1], KILN_F32, 1, &one);
	kiln_tensor_desc_init(&op.out[0], KILN_F32, 1, &one);
	if ((st = kiln_device_alloc_named(t->dev, 64, (void **)&t->plateau_d,
					  "schedule = plateau's rate and warm-up factor")) ||
	    (st = kiln_device_host_alloc_named(t->dev, 64, (void **)&t->plateau_host,
					       "schedule = plateau's rate, its host copy")) ||
	    (st = kiln_device_prepare(t->dev, &op, &t->plateau_mul, NULL)))
		return st;
	return plateau_upload(t);
}

/* After the schedule op (which wrote the warm-up factor into
 * t->plateau_d[1]): lr = factor x rate. */
kiln_status trainer_plateau_run(struct trainer *t)
{
	struct kiln_op_args a = { .in = { t->plateau_d + 1, t->plateau_d }, .out = { t->lr_dev } };
	return kiln_device_run(t->dev, t->plateau_mul, &a, t->compute);
}

/* An evaluation point's loss (rank 0's, on every rank): ReduceLROnPlateau's
 * step; a cut is logged (rank 0) and written to the device. */
kiln_status trainer_plateau_eval(struct trainer *t, double loss)
{
	const double was = t->plateau.lr;
	if (!t->plateau_mul || !kiln_plateau_update(&t->plateau_cfg, &t->plateau, loss))
		return KILN_OK;
	if (!t->rank)
		kiln_log(KILN_LOG_INFO, "train", "step %lld: schedule = plateau: %s loss %.6g, no improvement on %.6g for %lld evaluation(s): lr %.9g -> %.9g",
			 (long long)t->step, t->ev.name, loss, t->plateau.best,
			 (long long)t->plateau_cfg.patience + 1, was, t->plateau.lr);
	return plateau_upload(t);
}

void trainer_plateau_free(struct trainer *t)
{
	kiln_device_plan_free(t->dev, t->plateau_mul);
	kiln_device_free(t->dev, t->plateau_d);
	kiln_device_host_free(t->dev, t->plateau_host);
}
