/* core/plateau.h - ReduceLROnPlateau's rule for [train] schedule =
 * plateau: the rate cut by a factor when the evaluation loss has not
 * improved for `patience` evaluations (torch.optim.lr_scheduler.
 * ReduceLROnPlateau, mode 'min', eps 1e-8), as host arithmetic in double,
 * PyTorch's order.  The trainer's glue (the device's rate, the
 * checkpoint's "plateau" section) is core/train_plateau.c. */
#ifndef KILN_CORE_PLATEAU_H
#define KILN_CORE_PLATEAU_H

#include <stdint.h>

/* [train] plateau_*: the scheduler's arguments */
struct kiln_plateau_cfg {
	double factor;    /* new lr = max(lr x factor, min_lr); 0 <= factor < 1 */
	int64_t patience; /* evaluations without improvement tolerated */
	double threshold; /* what counts as an improvement (rel: of best) */
	int rel;          /* threshold_mode: 1 rel, 0 abs */
	int64_t cooldown; /* evaluations after a cut that count no bad one */
	double min_lr;
};

/* The scheduler's state: the rate (its param group's lr), the best loss
 * (inf before the first), num_bad_epochs, cooldown_counter and
 * last_epoch (the evaluations seen). */
struct kiln_plateau {
	double lr, best;
	int64_t bad, cooldown, evals;
};

/* A fresh state at rate lr (ReduceLROnPlateau's constructor). */
void kiln_plateau_init(struct kiln_plateau *p, double lr);

/* ReduceLROnPlateau.step(loss): 1 when it cut the rate (p->lr), else 0.
 * A loss that is not finite is no improvement (NaN < best is false). */
int kiln_plateau_update(const struct kiln_plateau_cfg *c, struct kiln_plateau *p, double loss);

#endif
