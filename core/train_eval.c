/* core/train_eval.c - evaluation: one pass over a set with the trainer's
 * pipeline (loader workers, remainder plan, device normalisation);
 * trainer_evaluate, the one place an evaluation during training is
 * recorded, kept (keep_best) and watched (early stopping); and
 * kiln_evaluate (`kiln eval`), which opens the same trainer for a
 * checkpoint's weights.  See train.h. */
#include "train.h"

#include <stdio.h>

/* One pass over e->set: loss, accuracy and top-5 into e's results. */
static kiln_status eval_pass(struct trainer *t, const struct eval_target *e)
{
	struct train_set *d = e->set;
	const int64_t eb = t->EB;
	kiln_status st;
	int64_t *idx = malloc(sizeof(int64_t) * (size_t)eb);
	double ls, c;
	if (!idx)
		return kiln_error(KILN_ENOMEM, "out of memory");
	trainer_phase(t, KILN_PHASE_EVAL, 1);
	/* the metrics may hold a partial training interval: flush it */
	if ((st = trainer_read_metrics(t, &ls, &c, NULL)))
		goto out;
	t->epoch = 0; /* evaluation has no random transforms */
	if (d->loader && (st = kiln_loader_start(d->loader, 0, t->eval_order, d->len, eb, 1)))
		goto out;
	for (int64_t off = 0; off < d->len; off += eb) {
		int64_t rows = d->len - off < eb ? d->len - off : eb;
		int s;
		void *xd;
		for (int64_t i = 0; i < rows; i++)
			idx[i] = off + i;
		if ((st = trainer_load_batch(t, d, idx, rows, &s, &xd)))
			goto out;
		struct kiln_plan *p = rows == eb ? t->peval : e->rem;
		if ((st = kiln_plan_forward(p, xd, t->y_dev[s], t->metrics_dev, t->compute)) ||
		    (st = kiln_device_event_record(t->dev, t->compute_done[s], t->compute)))
			goto out;
	}
	double c5 = 0;
	if ((st = trainer_read_metrics(t, &ls, &c, &c5)))
		goto out;
	*e->loss = ls / (double)d->len;
	*e->acc = c / (double)d->len;
	*e->acc5 = c5 / (double)d->len;
	*e->samples = d->len;
out:
	trainer_phase(t, KILN_PHASE_EVAL, 0);
	free(idx);
	return st;
}

/* Early stopping: after an evaluation, 1 when the run should stop. */
static int stopper_update(struct trainer *t, double loss, double acc)
{
	const struct kiln_train_cfg *tc = &t->tc;
	struct stopper *sp = &t->stopper;
	if (!tc->early_stop_patience)
		return 0;
	double v = tc->early_stop_on_loss ? -loss : acc;
	if (!sp->have || v > sp->best + tc->early_stop_min_delta) {
		sp->best = v;
		sp->have = 1;
		sp->bad = 0;
		return 0;
	}
	return ++sp->bad >= tc->early_stop_patience;
}

/* An evaluation during training, on the run's evaluation set (t->ev),
 * after step t->step; offset: the global sample offset into the epoch it
 * stands at.  log: its own log line.  record (an evaluation point): its
 * metrics.jsonl line, keep_best, early stopping (t->stop_early). */
kiln_status trainer_evaluate(struct trainer *t, int64_t offset, int log, int record)
{
	const struct eval_target *e = &t->ev;
	double t0 = kiln_now_s();
	kiln_status st = eval_pass(t, e);
	if (st)
		return st;
	t->res->eval_samples_per_s = (double)e->set->len / (kiln_now_s() - t0);
	t->iv_aside_s += kiln_now_s() - t0; /* not the log interval's training time */
	/* evaluation syncs are log points too */
	trainer_counters_mark(t);
	if (log)
		kiln_log(KILN_LOG_INFO, "train", "step %lld: %s loss %.4f acc %.4f top-5 %.4f",
			 (long long)t->step, e->name, *e->loss, *e->acc, *e->acc5);
	if (!record)
		return KILN_OK;
	trainer_eval_record(t, e, t->ep + 1);
	t->pos.epoch = t->ep;
	t->pos.step = t->step;
	t->pos.offset = offset;
	if ((st = trainer_keep_best(t, *e->loss, *e->acc)))
		return st;
	t->stop_early = stopper_update(t, *e->loss, *e->acc);
	return KILN_OK;
}

/* At an epoch's end: the epoch's evaluation, appended to its line msg
 * (per epoch; or, with eval_every, after the run's last step when that
 * was not an evaluation point; an early stop evaluated already). */
kiln_status trainer_epoch_eval(struct trainer *t, char *msg, size_t n)
{
	const struct kiln_train_cfg *tc = &t->tc;
	const int64_t step = t->step;
	int last_step = t->ep + 1 == tc->epochs || (tc->max_steps && step >= tc->max_steps);
	size_t len = strlen(msg);
	if (!tc->eval || t->stop_early || (tc->eval_every && !(last_step && step % tc->eval_every)))
		return KILN_OK;
	kiln_status st = trainer_evaluate(t, t->steps_per_epoch * t->G, 0, !tc->eval_every);
	if (!st)
		snprintf(msg + len, n - len, ", %s loss %.4f acc %.4f top-5 %.4f", t->ev.name,
			 *t->ev.loss, *t->ev.acc, *t->ev.acc5);
	return st;
}

/* With [data.val]: the test set, once, with the final weights. */
kiln_status trainer_final_test(struct trainer *t)
{
	struct kiln_train_result *res = t->res;
	const struct eval_target e = { &t->test, t->prem, &res->test_loss, &res->test_acc,
				       &res->test_acc5, &res->test_samples, "test" };
	kiln_status st;
	if (!t->have_val || t->stopping)
		return KILN_OK;
	if ((st = eval_pass(t, &e)))
		return st;
	kiln_log(KILN_LOG_INFO, "train", "final test loss %.4f acc %.4f top-5 %.4f", res->test_loss,
		 res->test_acc, res->test_acc5);
	trainer_eval_record(t, &e, 0);
	return KILN_OK;
}

/* The checkpoint to evaluate (kiln_ckpt_open_weights): `checkpoint`, or
 * the newest usable one of [run] out_dir; an error when there is none. */
static kiln_status open_checkpoint(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *checkpoint, struct kiln_ckpt **ck)
{
	char dir[4200];
	kiln_status st = kiln_ckpt_open_weights(cfg, reg, checkpoint, ck, dir, sizeof dir);
	if (!st && !*ck && !*dir)
		st = kiln_error(KILN_EUSAGE, "no checkpoint given and [run] out_dir is empty");
	else if (!st && !*ck)
		st = kiln_error(KILN_ENOTFOUND, "%s: no checkpoint to evaluate (`kiln train` writes one after its last step; or give --checkpoint CKPT)",
				dir);
	return st;
}

/* `kiln eval --checkpoint`: the weights of a checkpoint (params and
 * buffers) evaluated on [data.eval], with the trainer's pipeline. */
kiln_status kiln_evaluate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, struct kiln_train_result *res)
{
	struct trainer T = { 0 }, *t = &T;
	struct kiln_train_cfg tc;
	struct kiln_ckpt *ck = NULL;
	kiln_status st;
	memset(res, 0, sizeof *res);
	res->test_loss = res->test_acc = -1;
	res->resumed_step = -1;
	/* the checkpoint first: verifying it is cheap, and it must hold the
	 * model this config describes */
	if ((st = kiln_train_cfg_read(cfg, NULL, &tc)) ||
	    (st = open_checkpoint(cfg, reg, checkpoint, &ck)) ||
	    (st = trainer_open(t, cfg, reg, &tc, 0, res)) ||
	    (st = kiln_ckpt_load_model(ck, t->m, t->compute, KILN_CKPT_LOAD_WEIGHTS)))
		goto out;
	checkpoint = kiln_ckpt_path(ck);
	kiln_log(KILN_LOG_INFO, "eval", "%s: the weights of step %lld", checkpoint,
		 (long long)kiln_ckpt_step(ck));
	const struct eval_target e = { &t->test, t->prem, &res->test_loss, &res->test_acc,
				       &res->test_acc5, &res->test_samples, "test" };
	double t0 = kiln_now_s();
	if ((st = eval_pass(t, &e)))
		goto out;
	res->wall_s = kiln_now_s() - t0;
	res->eval_samples_per_s = (double)t->test.len / res->wall_s;
	res->steps = kiln_ckpt_step(ck);
	res->data_skipped = atomic_load(&t->test.ds.skipped);
	snprintf(res->checkpoint, sizeof res->checkpoint, "%s", checkpoint);
	st = kiln_device_stream_sync(t->dev, t->compute);
out:
	st = trainer_close(t, st);
	kiln_ckpt_close(ck);
	return st;
}
