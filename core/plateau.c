/* core/plateau.c - ReduceLROnPlateau's rule (core/plateau.h): the
 * arithmetic of torch.optim.lr_scheduler.ReduceLROnPlateau.step (1.13 and
 * 2.x alike) with mode = 'min' and eps = 1e-8, so the rates are PyTorch's
 * bit for bit in double (tests/check_sched against
 * tests/data/gen_plateau_refs.py's). */
#include "plateau.h"

#include <math.h>

/* ReduceLROnPlateau's eps: a cut smaller than this is not made */
#define PLATEAU_EPS 1e-8

void kiln_plateau_init(struct kiln_plateau *p, double lr)
{
	p->lr = lr;
	p->best = INFINITY; /* mode 'min': mode_worse */
	p->bad = 0;
	p->cooldown = 0;
	p->evals = 0;
}

/* is_better(a, best), mode 'min' */
static int better(const struct kiln_plateau_cfg *c, double a, double best)
{
	return c->rel ? a < best * (1.0 - c->threshold) : a < best - c->threshold;
}

int kiln_plateau_update(const struct kiln_plateau_cfg *c, struct kiln_plateau *p, double loss)
{
	p->evals++;
	if (better(c, loss, p->best)) {
		p->best = loss;
		p->bad = 0;
	} else {
		p->bad++;
	}
	if (p->cooldown > 0) { /* in_cooldown */
		p->cooldown--;
		p->bad = 0;
	}
	if (p->bad <= c->patience)
		return 0;
	/* _reduce_lr */
	const double old = p->lr, cut = old * c->factor;
	const double next = cut > c->min_lr ? cut : c->min_lr; /* max(old * factor, min_lr) */
	int changed = 0;
	if (old - next > PLATEAU_EPS) {
		p->lr = next;
		changed = 1;
	}
	p->cooldown = c->cooldown;
	p->bad = 0;
	return changed;
}
