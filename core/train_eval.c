/* core/train_eval.c - evaluation: one pass over a set with the trainer's
 * pipeline (loader workers, remainder plan, device normalisation), each
 * data-parallel rank's share of the set (eval_share), the shares' sums
 * added and the outcome agreed by the ranks (eval_shares_sum); rank 0's
 * decisions taken to every rank (eval_agree); trainer_evaluate, the one
 * place an evaluation during training is recorded, kept (keep_best) and
 * watched (early stopping); and
 * kiln_evaluate (`kiln eval`), which opens the same trainer for a
 * checkpoint's weights.  See train.h. */
#include "train.h"
#include "infer_passes.h"
#include "quant.h"
#include "../plugins/common/c_locale.h" /* common_snprintf_c, common_nan_plain */

#include <stdio.h>

/* Calibration (kiln_quantize): the plan of the full batches, the rows to
 * cover, and a call after each batch's forward. */
struct eval_calib {
	struct kiln_plan *full;
	int64_t max_rows;
	kiln_status (*each)(void *user, struct kiln_plan *p, const void *x, int64_t rows,
			    void *stream);
	void *user;
};

/* How often (in batches) the data-parallel ranks agree on a stop during
 * an evaluation: a host allreduce of one number each time. */
#define EVAL_STOP_EVERY 16

/* The values of an evaluation's sums over the ranks during its pass:
 * eval_stop's (a stop requested, its cause posted) and eval_shares_sum's
 * (the ranks' shares of the set's sums, EVAL_SHARE_N of them), as many in
 * both, so that a rank whose pass failed, which goes straight to
 * eval_shares_sum, meets its peers in whichever of them they reach next
 * (kiln_dist_sum_agreed: the failure flag, then every rank fails
 * together). */
#define EVAL_SHARE_N (4 * (KILN_COUNT_LIMBS + 1))
#define EVAL_SUM_N (2 + EVAL_SHARE_N)

/* e's numbers for a line of the log, after `before`: "<before>NAME loss
 * L acc A top-5 T", a NaN as nan (common_nan_plain; "-nan" before
 * session 40). */
static void eval_text(char *buf, size_t n, const char *before, const struct eval_target *e)
{
	common_snprintf_c(buf, n, "%s%s loss %.4f acc %.4f top-5 %.4f", before, e->name,
			  common_nan_plain(*e->loss), common_nan_plain(*e->acc),
			  common_nan_plain(*e->acc5));
}

/* Whether a stop requested (a signal) while a training run evaluates e
 * ends the pass before batch b (*stop): unrecorded (t->eval_cut), the
 * stop's checkpoint following at once instead of after the whole set.
 * The evaluations during training (t->ev) only: the final test comes
 * after the last step's checkpoint (written at the step, and again after
 * the test with its numbers), and a stop then lets the run finish.
 * Data-parallel ranks (each evaluates its share of the set, eval_share,
 * but every rank goes through as many batches as the largest share has,
 * so all reach batch b of their pass) agree every EVAL_STOP_EVERY batches,
 * a stop on any rank stopping all (t->dist_stop, as at log points); so
 * do the P x D ranks of [dist] pipeline evaluating the gathered model
 * (eval_gathered: each its own share, as data-parallel ranks; session
 * 45, before which such an evaluation ran to its end), and those
 * evaluating per stage (t->eval_staged; session 46, before which it ran
 * to its end): each pipe's stages go through the nb batches of the
 * pipe's share together, and a batch's hand-offs are a chain from stage
 * 0 to the last within kiln_dist_pipe_forward, so every rank stopping
 * before the same batch b cuts none.
 * The sum is agreed (`what` names the evaluation): a peer whose pass
 * failed joins it from eval_shares_sum, and every rank fails here naming it;
 * its failure is final (t->eval_no_agree).  Per stage a failed rank goes
 * on with its hand-offs (eval_batch) and joins these sums with its
 * failure `own` (a peer waiting here for it while it waited in a hand-off
 * would hang both), which ends every rank's pass at b. */
static kiln_status eval_stop(struct trainer *t, const struct eval_target *e, int64_t b,
			     const char *what, kiln_status own, int *stop)
{
	*stop = 0;
	if (!t->training || e != &t->ev)
		return KILN_OK;
	if (!t->dist) {
		*stop = kiln_stop_pending();
		return KILN_OK;
	}
	/* (agreed at the log point before this evaluation: every rank's) */
	if (!t->dist_stop && b % EVAL_STOP_EVERY == 0) {
		double any[EVAL_SUM_N] = { kiln_stop_pending(), 0 }; /* (no share's sums) */
		kiln_status st = trainer_dist_stop_cause_post(t, any[0] > 0, &any[1]);
		if ((st = kiln_dist_sum_agreed(t->dist, st ? st : own, any, EVAL_SUM_N, what,
					       t->compute))) {
			t->eval_no_agree = 1;
			return st;
		}
		/* (the stop agreed before the cause's read, which can fail on
		 * one rank alone: a rank failing it takes the stop with its
		 * peers, and per stage meets them in the cut's sum with its
		 * failure instead of going on to batch b's hand-offs, which
		 * held them there until [dist] timeout) */
		t->dist_stop = any[0] > 0;
		*stop = t->dist_stop;
		if ((st = trainer_dist_stop_cause_read(t, any[1])))
			return kiln_error_wrap(st, "rank %d of %d: %s: agreeing on a stop", t->rank,
					       kiln_dist_world(t->dist), what);
	}
	*stop = t->dist_stop;
	return KILN_OK;
}

/* The evaluation's sums on the device (every stage's, [dist] pipeline
 * per stage: the loss layer's, on the last stage, the others' zero) read
 * and reset, added into sums[4] (loss, correct, top-5, rows counted: the
 * loss layer's metrics[3], kiln_layer.eval_sums; copied to the host's
 * float 4, which nothing else uses, as trainer_read_metrics copies the
 * others and then resets all four).  A rank whose pass failed (*own)
 * still joins the stages' sum over the pipe (its peers wait in it) and
 * reads nothing.  The return: a failure of that sum, or per stage of the
 * read (the sync also reports the transport's failures on the stream),
 * which no agreement follows; a failed read elsewhere is the rank's own
 * (*own). */
static kiln_status eval_sums_take(struct trainer *t, double sums[4], kiln_status *own)
{
	double ls = 0, c = 0, c5 = 0;
	kiln_status st;
	if (t->eval_staged &&
	    (st = kiln_dist_pipe_eval_sums(t->dist, t->metrics_dev, 4, t->compute)))
		return st;
	if (*own)
		return KILN_OK;
	if ((st = kiln_device_copy_async(t->dev, t->metrics_host + 4, t->metrics_dev + 3,
					 sizeof(float), KILN_COPY_D2H, t->compute)) ||
	    (st = trainer_read_metrics(t, &ls, &c, &c5)))
		return t->eval_staged ? st : (*own = st, KILN_OK);
	sums[0] += ls, sums[1] += c, sums[2] += c5, sums[3] += t->metrics_host[4];
	return KILN_OK;
}

/* Whether every rank evaluates the whole model on its own: [dist]
 * pipeline = P whose stages' parameters are gathered for an evaluation
 * (a rank that does not hold its stage's alone from start-up: ZeRO-1,
 * loss scaling, low-precision compute, frozen parameters, a weight tied
 * across stages, an optimizer that reads whole tensors; docs/pipeline.md
 * "Parameters and gradients per stage"), not evaluating per stage
 * (t->eval_staged, core/dist_pipe_eval.c).  Every rank then holds pipe
 * 0's parameters and layer buffers (kiln_dist_pipe_gather). */
static int eval_gathered(const struct trainer *t)
{
	return t->pipe_P > 1 && !t->eval_staged;
}

/* The samples [*lo, *hi) of a set of len samples that this rank
 * evaluates in batches of eb, and the most batches of any rank's share
 * (*nb, which every rank's pass goes through: eval_stop).  With
 * data-parallel ranks (t->world > 1) the set's batches are dealt out in
 * contiguous runs, rank r of the D evaluating ranks taking batches
 * [nb r / D, nb (r + 1) / D) of the nb = ceil(len / eb): every sample
 * once, no padding nor repeat (PyTorch's DistributedSampler pads a set to
 * a multiple of the ranks), the last rank's run holding the set's last,
 * partial batch (the remainder plan's rows), a run of none where the set
 * has fewer batches than ranks.  The evaluating ranks: the data-parallel
 * ones (r = t->drank); with [dist] pipeline = P per stage the D pipes,
 * each pipe's stages sharing its share, and on the gathered model
 * (eval_gathered) every one of the P x D ranks (r = t->rank: each holds
 * the whole model; before session 44 the pipe's P ranks each evaluated
 * the pipe's share, P times the work).  Before session 43 every rank
 * evaluated the whole set, D times the work.  Calibrating (cal): the
 * whole set. */
static void eval_share(const struct trainer *t, int64_t len, int64_t eb, int sharded,
		       int64_t *lo, int64_t *hi, int64_t *nb)
{
	const int whole = eval_gathered(t);
	const int64_t all = (len + eb - 1) / eb;
	const int64_t D = !sharded ? 1 : whole ? (int64_t)t->world * t->pipe_P : t->world;
	const int64_t r = !sharded ? 0 : whole ? t->rank : t->drank;
	const int64_t b0 = all * r / D, b1 = all * (r + 1) / D;
	*lo = b0 * eb;
	*hi = b1 * eb < len ? b1 * eb : len;
	*nb = (all + D - 1) / D;
}

/* The set's sums[4] (loss, correct, top-5, rows counted) as values of the
 * ranks' sum (an f32 allreduce, kiln_dist_sum_host), v[EVAL_SHARE_N]:
 * each as the 8-bit limbs of its whole part, exact for any total below
 * 2^48 (kiln_count_limbs: the counts, and the correct counts, stay exact
 * integers past f32's 2^24, as one rank's sums, session 37, are), and
 * its fraction (an f32 sum of fractions below 1: off by at most ranks x
 * 2^-24 of the total's units); a sum that is negative, not finite or from
 * 2^48 on goes whole in the fraction's place (f32's rounding, its integer
 * part too: docs/distributed.md says so; a NaN stays NaN). */
static void share_encode(const double sums[4], double *v)
{
	for (int i = 0; i < 4; i++) {
		double *l = v + i * (KILN_COUNT_LIMBS + 1);
		const int whole = isfinite(sums[i]) && sums[i] >= 0 && sums[i] < 0x1p48;
		const int64_t w = whole ? (int64_t)sums[i] : 0;
		kiln_count_limbs(&w, 1, l);
		l[KILN_COUNT_LIMBS] = whole ? sums[i] - (double)w : sums[i];
	}
}

static void share_decode(const double *v, double sums[4])
{
	for (int i = 0; i < 4; i++) {
		const double *l = v + i * (KILN_COUNT_LIMBS + 1);
		int64_t w;
		kiln_count_join(l, 1, &w);
		sums[i] = (double)w + l[KILN_COUNT_LIMBS];
	}
}

/* After this rank's share of the pass (own: its outcome, its message the
 * last error), with a communicator: the shares' sums[4] summed over the
 * ranks into sums, every rank's, in the one sum that agrees on the
 * outcome (kiln_dist_sum_agreed: a rank that failed fails every rank, and
 * is final, t->eval_no_agree).  Under [dist] pipeline per stage every
 * rank of a pipe holds the pipe's sums (summed over the pipe): stage 0's
 * rank gives them, the others zeros; on the gathered model each rank
 * gives its own share's (eval_share).  The values are EVAL_SUM_N as
 * eval_stop's, which a peer may be in. */
static kiln_status eval_shares_sum(struct trainer *t, kiln_status own, double sums[4],
				   const char *what)
{
	double v[EVAL_SUM_N] = { 0 };
	const double none[4] = { 0, 0, 0, 0 };
	share_encode(t->eval_staged && t->rank % t->pipe_P ? none : sums, v + 2);
	kiln_status st = kiln_dist_sum_agreed(t->dist, own, v, EVAL_SUM_N, what, t->compute);
	if (!st)
		share_decode(v + 2, sums);
	return st;
}

/* e's results from the set's sums[4] over its len samples, evaluated
 * through plan p: each sum over the rows counted (a sample, or a token
 * row; ignore_index's left out), divided by their count, as PyTorch's
 * CrossEntropyLoss(reduction = 'sum') summed over the loader and divided
 * by the targets not ignored (0 / 0, NaN, when every target is ignored:
 * said once per evaluation).  A loss layer that does not say it counts
 * (kiln_layer.eval_counted: one built before ABI 2.27, or rebuilt
 * unchanged) writes per-sample sums, divided by len.  A count of 0 under
 * nonzero sums is the layer's error (it said it counts and did not). */
static kiln_status eval_results(struct trainer *t, const struct eval_target *e,
				const struct kiln_plan *p, const double sums[4], int64_t len)
{
	const int counts = kiln_plan_eval_counts(p);
	const double n = counts ? sums[3] : (double)len;
	const char *sec = !strcmp(e->name, "val") ? "data.val" : "data.eval";
	const struct model_layer *L = &t->m->layers[t->m->loss_layer];
	if (counts && n == 0 && (sums[0] != 0 || sums[1] != 0))
		return kiln_error(KILN_EINVAL, "loss layer '%s' (type %s%s%s) said it counts the rows of an evaluation (kiln_layer.eval_counted) but counted none of [%s]'s %lld samples while its loss sum is %g and its correct count %g",
				  L->name, L->type->name, L->file ? ", from " : "", L->file ? L->file : "",
				  sec, (long long)len, sums[0], sums[1]);
	if (counts && n == 0 && len > 0)
		kiln_log(KILN_LOG_WARN, "train", "every target of [%s] is ignore_index: its %lld samples count no target, so the %s evaluation's loss and accuracy are nan",
			 sec, (long long)len, e->name);
	*e->loss = sums[0] / n;
	*e->acc = sums[1] / n;
	*e->acc5 = sums[2] / n;
	*e->samples = len;
	return KILN_OK;
}

/* Batch b of the set (rows rows: the samples idx; first: the first of
 * this rank's share) loaded and through its
 * plan's forward (cal's full plan and call, when calibrating).  A failure
 * of the rank's own step (the tests' fault, the load, the forward, the
 * call) is *own; with [dist] pipeline per stage (t->eval_staged) the rank
 * then still makes the batch's hand-offs, and those of every later batch
 * (*own set on entry: no load, no layer run; x the first input slot,
 * whatever it holds), so that no stage waits for it in a receive: the
 * tensors it hands on mean nothing, and the evaluation fails on every
 * rank at its end (eval_shares_sum).  The return: a failure of the hand-offs
 * (the pipeline's transport), which no agreement follows.  The tests'
 * fault (KILN_TEST_CKPT_FAIL, core/dist.h): "eval" fails the load of the
 * first batch of the rank's share of an evaluation during training,
 * "test" the final test's. */
static kiln_status eval_batch(struct trainer *t, const struct eval_target *e,
			      const struct eval_calib *cal, const int64_t *idx, int64_t rows,
			      int64_t b, int first, kiln_status *own)
{
	struct kiln_plan *p = rows < t->EB ? e->rem : cal ? cal->full : t->peval;
	void *xd = t->x_dev[0];
	kiln_status st = KILN_OK;
	int s = 0;
	if (!*own && first)
		*own = kiln_dist_ckpt_fault_at(t->dist, e == &t->ev ? "eval" : "test",
					       "loading batch 0");
	if (!*own)
		*own = trainer_load_batch(t, e->set, idx, rows, &s, &xd);
	if (t->eval_staged)
		st = kiln_dist_pipe_forward(t->dist, t->pipe, p, (long long)b, xd, t->y_dev[s],
					    t->metrics_dev, t->compute, own);
	else if (!*own)
		*own = kiln_plan_forward(p, xd, t->y_dev[s], t->metrics_dev, t->compute);
	if (!st && !*own && cal)
		*own = cal->each(cal->user, p, xd, rows, t->compute);
	if (!st && !*own)
		*own = kiln_device_event_record(t->dev, t->compute_done[s], t->compute);
	return st;
}

/* One pass over e->set (or the first cal->max_rows of it, through
 * cal->full, calling cal->each; cal NULL: the whole set, no call): loss,
 * accuracy and top-5 into e's results.  With data-parallel ranks each
 * evaluates its share (eval_share) and the shares' sums are summed over
 * the ranks (eval_shares_sum), so that every rank has the whole set's
 * results.  `what` names the evaluation in the ranks' messages
 * (eval_stop).  A failure of this rank's own step ends its pass (per
 * stage: after its hand-offs, eval_batch) and meets its peers in that
 * sum, which fails every rank together; that, and a failure in a
 * collective, is final (t->eval_no_agree).  Without a communicator the
 * failure is returned as it is. */
static kiln_status eval_pass_cal(struct trainer *t, const struct eval_target *e,
				 const struct eval_calib *cal, const char *what)
{
	struct train_set *d = e->set;
	const int64_t eb = t->EB;
	const int64_t len = cal && cal->max_rows < d->len ? cal->max_rows : d->len;
	kiln_status st = KILN_OK, own = KILN_OK;
	int agreed = 0;
	char *own_msg = NULL;
	int64_t *idx = malloc(sizeof(int64_t) * (size_t)eb), lo, hi, nb;
	double ls, c, sums[4] = { 0, 0, 0, 0 };
	eval_share(t, len, eb, t->dist && !cal, &lo, &hi, &nb);
	trainer_phase(t, KILN_PHASE_EVAL, 1);
	if (!idx)
		own = kiln_error(KILN_ENOMEM, "rank %d: the evaluation's batch indices: out of memory",
				 t->rank);
	/* the metrics may hold a partial training interval: kept aside for
	 * the next log point (before session 28 they were dropped while its
	 * samples still counted: an eval_every off the log points lowered
	 * the logged loss and accuracy) */
	if (!own && !(own = trainer_read_metrics(t, &ls, &c, NULL)))
		t->carry_loss += ls, t->carry_correct += c;
	t->epoch = 0; /* evaluation has no random transforms */
	if (!own && d->loader && hi > lo)
		own = kiln_loader_start(d->loader, 0, t->eval_order + lo, hi - lo, eb, 1);
	/* (per stage a failed rank goes on with its hand-offs alone; every
	 * rank through nb batches, its own share's first: eval_stop) */
	for (int64_t b = 0; b < nb && (!own || t->eval_staged); b++) {
		const int64_t off = lo + b * eb;
		const int64_t rows = off >= hi ? 0 : hi - off < eb ? hi - off : eb;
		int stop = 0;
		/* (per stage also a rank whose pass failed, its cause the
		 * message of the agreement: eval_stop) */
		if (own && own_msg)
			own = kiln_error(own, "%s", own_msg);
		if (!own || t->eval_staged) {
			const kiln_status sst = eval_stop(t, e, b, what, own, &stop);
			if (sst && t->eval_no_agree) { /* agreed: every rank's pass ends here */
				st = sst;
				own = KILN_OK;
				goto out;
			}
			if (sst) /* (its own: per stage its hand-offs go on) */
				own = sst;
			if (own && !t->eval_staged)
				break;
		}
		if (stop) {
			/* the partial sums dropped: the checkpoint's epoch sums
			 * read the metrics next (every rank cut: agreed on
			 * here, since session 43; a failed read before left its
			 * peers to go on to the stop's checkpoint); a failed
			 * rank (per stage) fails every rank in that sum */
			if (!own)
				own = kiln_dist_ckpt_fault_at(t->dist, "cut", "reading the metric sums after a stop cut the evaluation");
			if (!own)
				own = trainer_read_metrics(t, &ls, &c, NULL);
			t->eval_cut = 1;
			if (!own)
				kiln_log(KILN_LOG_INFO, "train", "stop requested: the %s evaluation after step %lld ends after %lld of its %lld samples, not recorded%s",
					 e->name, (long long)t->step,
					 (long long)(b * eb < hi - lo ? b * eb : hi - lo), (long long)(hi - lo),
					 hi - lo < len ? " (this rank's share of the set's)" : "");
			double v[EVAL_SUM_N] = { 0 };
			st = t->dist ? kiln_dist_sum_agreed(t->dist, own, v, EVAL_SUM_N, what, t->compute)
				     : own;
			own = KILN_OK;
			goto out;
		}
		if (!rows)
			continue;
		for (int64_t i = 0; idx && i < rows; i++)
			idx[i] = off + i;
		/* a set of more than 2^24 rows counted (samples, or token
		 * rows) is summed in parts, each count exact (before session
		 * 37 its accuracy went past 100%, or stopped at 2^24 correct) */
		const int64_t counted = rows * d->ds.label_elems;
		if (t->metric_rows > 0 && t->metric_rows + counted > TRAINER_METRIC_ROWS &&
		    (st = eval_sums_take(t, sums, &own)))
			goto out;
		t->metric_rows += counted;
		if ((st = eval_batch(t, e, cal, idx, rows, off / eb, !b, &own)))
			goto out;
		/* (its message kept whole past the hand-offs that follow) */
		if (own && !own_msg)
			own_msg = kiln_strdup(kiln_last_error());
	}
	if ((!own || t->eval_staged) && (st = eval_sums_take(t, sums, &own)))
		goto out;
	if (own && own_msg) /* (the agreement's message: this rank's cause) */
		own = kiln_error(own, "%s", own_msg);
	if (t->dist && !t->eval_no_agree) {
		/* the outcome agreed (every rank's, final; not after
		 * eval_stop's sum failed, agreed there) */
		st = eval_shares_sum(t, own, sums, what);
		own = KILN_OK;
		agreed = 1;
		if (st)
			goto out;
	}
	if (!own)
		own = eval_results(t, e, cal ? cal->full : t->peval, sums, len);
out:
	trainer_phase(t, KILN_PHASE_EVAL, 0);
	free(idx);
	/* (eval_results' failure after the sum: the same on every rank) */
	if (st || (own && agreed))
		t->eval_no_agree = 1;
	else if (own && own_msg)
		st = kiln_error(own, "%s", own_msg);
	else
		st = own;
	free(own_msg);
	return st;
}

static kiln_status eval_pass(struct trainer *t, const struct eval_target *e, const char *what)
{
	return eval_pass_cal(t, e, NULL, what);
}

/* ... during training: [dist] pipeline, every stage's current parameters
 * on every rank first (gathered, released after), unless it runs per
 * stage (core/dist_pipe_eval.c); and rank 0's batchnorm running
 * statistics on every data-parallel rank (kiln_dist_eval_buffers: each
 * rank's share is evaluated with the model rank 0 checkpoints).  A failed
 * gather or broadcast, a collective, is not agreed on again
 * (t->eval_no_agree). */
static kiln_status eval_now(struct trainer *t, const struct eval_target *e, const char *what)
{
	kiln_status st = t->eval_staged ? KILN_OK : kiln_dist_pipe_gather(t->dist, t->compute);
	if (!st)
		st = kiln_dist_eval_buffers(t->dist, t->compute);
	t->eval_no_agree = st != KILN_OK;
	if (!st)
		st = eval_pass(t, e, what);
	if (!st) /* (held per stage again) */
		st = kiln_dist_pipe_release(t->dist, t->compute);
	return st;
}

/* After an evaluation (st: its outcome on this rank), every rank with a
 * communicator: the pass's outcome was agreed in its sum of the ranks'
 * shares (eval_shares_sum), so that a rank whose pass failed alone (a bad
 * sample in its share of the set, its device, the tests' "eval@R") fails
 * every rank together, the failed one naming its cause, the others "rank
 * R of W: WHAT: rank F failed (its message says why)"
 * (kiln_dist_sum_agreed; before session 42 it returned, and its peers
 * waited in their next collective until [dist] timeout, or learnt of it
 * from its process's exit, "rank 1 is gone"): such a failure, or one in
 * a collective (t->eval_no_agree), is returned as it is.  After a pass
 * that succeeded, one sum of three values takes rank 0's early-stopping
 * decision *stop, keep_best choice *best (-1: none) and loss *loss (for
 * schedule = plateau; every rank's is the same sum of the shares) to every rank
 * (every rank has the same results, but keep_best's list is rank 0's
 * alone), with the outcome of what followed the pass (the release of a
 * gathered pipeline model).  Before session 43 both rode on the one sum
 * after the pass, which now must come before the decisions: it makes the
 * results they are made from. */
static kiln_status eval_agree(struct trainer *t, kiln_status st, const char *what, int *stop,
			      int *best, double *loss)
{
	double v[3] = { t->rank ? 0 : *stop, t->rank ? 0 : *best + 1.0, t->rank ? 0 : *loss };
	if (!t->dist || t->eval_no_agree)
		return st;
	if ((st = kiln_dist_sum_agreed(t->dist, st, v, 3, what, t->compute)))
		return st;
	*stop = v[0] > 0;
	*best = (int)v[1] - 1;
	*loss = v[2];
	return KILN_OK;
}

/* Early stopping: after an evaluation, 1 when the run should stop.  A
 * value that is not finite (a diverged evaluation's NaN loss) is no
 * improvement and never the best, and any finite one improves on a best
 * that is not (trainer_metric_beats: a kiln before session 39 took a
 * first NaN as the best, which nothing improves on, and stopped
 * `patience` evaluations later whatever the losses). */
static int stopper_update(struct trainer *t, double loss, double acc)
{
	const struct kiln_train_cfg *tc = &t->tc;
	struct stopper *sp = &t->stopper;
	if (!tc->early_stop_patience)
		return 0;
	double v = tc->early_stop_on_loss ? -loss : acc;
	if (sp->have ? trainer_metric_beats(v, sp->best + tc->early_stop_min_delta) : isfinite(v)) {
		sp->best = v;
		sp->have = 1;
		sp->bad = 0;
		return 0;
	}
	return ++sp->bad >= tc->early_stop_patience;
}

/* An evaluation during training, on the run's evaluation set (t->ev),
 * after step t->step; offset: the global sample offset into the epoch it
 * stands at.  log: its own log line.  record (train.h, TRAINER_EVAL_*):
 * AGAIN nothing; LOGGED its eval record (metrics.jsonl, [log]'s tables
 * and event file); POINT (an evaluation point) that, keep_best and early
 * stopping (t->stop_early). */
kiln_status trainer_evaluate(struct trainer *t, int64_t offset, int log, int record)
{
	const struct eval_target *e = &t->ev;
	double t0 = kiln_now_s();
	char what[48];
	int stop = 0, best = -1;
	snprintf(what, sizeof what, "step %lld's evaluation", (long long)t->step);
	kiln_status st = eval_now(t, e, what);
	if (t->eval_cut) /* (every rank cut it at the same batch: eval_stop) */
		return st;
	/* early stopping's count before keep_best's write: a best/ file
	 * holds the state after its evaluation, as the periodic checkpoint
	 * of an eval_every step does (before session 35 keep_best came
	 * first); both before the record, for the ranks' agreement (neither
	 * logs: the record's lines come as they did) */
	if (!st && record == TRAINER_EVAL_POINT) {
		stop = stopper_update(t, *e->loss, *e->acc);
		best = trainer_best_choice(t, *e->loss, *e->acc);
	}
	/* rank 0's decisions on every rank: keep_best's list is rank 0's
	 * alone (and before session 43 their evaluations could differ in a
	 * last bit, or more: batchnorm's running statistics are each rank's
	 * without sync_bn), and a rank that stopped alone, or wrote a best/
	 * file alone, left the others waiting in a collective until [dist]
	 * timeout */
	double loss0 = *e->loss;
	if ((st = eval_agree(t, st, what, &stop, &best, &loss0)))
		return st;
	/* schedule = plateau's step, on rank 0's loss (every rank's rate
	 * alike), before keep_best's write as early stopping's count */
	if (record == TRAINER_EVAL_POINT && (st = trainer_plateau_eval(t, loss0)))
		return st;
	t->res->eval_samples_per_s = (double)e->set->len / trainer_set_aside(t, t0);
	t->evals++;
	/* evaluation syncs are log points too */
	trainer_counters_mark(t);
	if (log) {
		char line[200];
		eval_text(line, sizeof line, "", e);
		kiln_log(KILN_LOG_INFO, "train", "step %lld: %s", (long long)t->step, line);
	}
	if (record == TRAINER_EVAL_AGAIN)
		return KILN_OK;
	trainer_eval_record(t, e, t->ep + 1);
	if (record == TRAINER_EVAL_LOGGED)
		return KILN_OK;
	t->pos.epoch = t->ep;
	t->pos.step = t->step;
	t->pos.offset = offset;
	t->stop_early = stop;
	if ((st = trainer_keep_best(t, *e->loss, *e->acc, best)))
		return st;
	/* a checkpoint of this step written before it (checkpoint_every's at
	 * an epoch's last step, before the epoch's evaluation) holds the
	 * stopper and keep_best list from before it: out of date, so an early
	 * stop now writes checkpoint_last's (before session 33 it did not,
	 * and every --resume of the finished run evaluated again, rewrote
	 * best/ and appended its eval and best events) */
	t->ckpt_step = -1;
	return KILN_OK;
}

int trainer_closing_eval(const struct trainer *t, int64_t step)
{
	return t->tc.eval && (!t->tc.eval_every || step % t->tc.eval_every);
}

/* A resumed run that early stopping ended (trainer_resume_finished) whose
 * checkpoint lacks the numbers of the evaluation that stopped it (no
 * "evaluated" section, or one with 0 samples as kilns before session 33
 * wrote after such a kill), none of them run yet in this process. */
int trainer_stop_numbers_missing(const struct trainer *t)
{
	return t->resumed && t->stop_early && t->tc.eval && t->step == t->step0 &&
	       (!t->evaluated || !t->done.samples) && *t->ev.samples <= 0;
}

/* At an epoch's end: the epoch's evaluation, appended to its line msg
 * (per epoch; or, with eval_every, after the run's last step when that
 * was not an evaluation point; an early stop evaluated already). */
kiln_status trainer_epoch_eval(struct trainer *t, char *msg, size_t n)
{
	const struct kiln_train_cfg *tc = &t->tc;
	const int64_t step = t->step;
	int last_step = t->ep + 1 >= tc->epochs || (tc->max_steps && step >= tc->max_steps);
	size_t len = strlen(msg);
	/* whether the epoch's line shows an evaluation: not when one at an
	 * eval_every point (which logged its own line) or an early stop's
	 * was the last */
	const int on_line = !t->stop_early && !(tc->eval_every && !(last_step && step % tc->eval_every));
	if (!tc->eval)
		return KILN_OK;
	if (t->evaluated && step == t->step0 && t->done.samples) {
		/* resumed from the run's last checkpoint, written after this
		 * evaluation: its numbers, not a second record of it (before
		 * the early stop's return: that evaluation is this one, and
		 * the result's val numbers would stay unset); on the line only
		 * where the run printed them (before session 33 always: an
		 * early-stopped run resumed added ", test loss ...") */
		*t->ev.loss = t->done.loss, *t->ev.acc = t->done.acc, *t->ev.acc5 = t->done.acc5;
		*t->ev.samples = t->done.samples;
		if (on_line)
			eval_text(msg + len, n - len, ", ", &t->ev);
		return KILN_OK;
	}
	kiln_status st;
	if (trainer_stop_numbers_missing(t)) {
		/* the evaluation that stopped the run, which its checkpoint
		 * lacks the numbers of (the run killed before they were
		 * written, or an older kiln's: session 33): run again for them,
		 * not recorded again (its run recorded it: its eval event, its
		 * keep_best file and early stopping's count) */
		kiln_log(KILN_LOG_INFO, "train", "resume: the checkpoint lacks the numbers of the evaluation after step %lld that stopped the run: evaluating again (not recorded again)",
			 (long long)step);
		/* (work a stop now ends with a checkpoint, as eval_owed_run's:
		 * the caller hears of it as of a step) */
		trainer_progress(t, t->k0, NULL);
		if (!(st = trainer_evaluate(t, t->pos.offset, 0, TRAINER_EVAL_AGAIN)) && !t->eval_cut &&
		    on_line)
			eval_text(msg + len, n - len, ", ", &t->ev);
		return st;
	}
	if (!on_line)
		return KILN_OK;
	/* with eval_every, the evaluation after a last step that is no
	 * evaluation point is logged (before session 39 it was on the line
	 * and in the result alone: metrics.jsonl, eval.csv and TensorBoard
	 * ended at the last eval_every point), but neither kept (keep_best)
	 * nor watched (early stopping): a run resumed from this step with a
	 * larger max_steps or more epochs goes on as the uninterrupted run,
	 * which evaluates no such step, and its best/ files and stopper
	 * state must be that run's (docs/training.md) */
	st = trainer_evaluate(t, t->steps_per_epoch * t->G, 0,
			      tc->eval_every ? TRAINER_EVAL_LOGGED : TRAINER_EVAL_POINT);
	if (!st)
		eval_text(msg + len, n - len, ", ", &t->ev);
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
	if (t->evaluated && t->step == t->step0 && t->done.has_test) {
		/* the run's last checkpoint was written after it: done */
		res->test_loss = t->done.test_loss, res->test_acc = t->done.test_acc;
		res->test_acc5 = t->done.test_acc5, res->test_samples = t->done.test_samples;
		return KILN_OK;
	}
	/* (a rank whose test failed alone fails every rank: the pass's sum,
	 * eval_shares_sum; no collective follows the test in every run to
	 * carry it) */
	int stop = 0, best = -1;
	double loss0 = 0;
	if ((st = eval_agree(t, eval_now(t, &e, "the final test"), "the final test", &stop, &best,
			     &loss0)))
		return st;
	char line[200];
	eval_text(line, sizeof line, "final ", &e);
	kiln_log(KILN_LOG_INFO, "train", "%s", line);
	trainer_eval_record(t, &e, 0);
	return KILN_OK;
}

/* The weights to evaluate (kiln_given_open, opened once): `checkpoint`,
 * a kiln checkpoint or a weights file, or the newest usable checkpoint of
 * [run] out_dir; an error when there is none: a config error naming
 * out_dir and where it was set (exit 2, as `kiln generate` says "no
 * trained weights", and a missing --checkpoint is; KILN_ENOTFOUND, exit
 * 1, before session 37).  Close g also after a failure. */
static kiln_status open_checkpoint(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   const char *checkpoint, struct kiln_given *g)
{
	kiln_status st = kiln_given_open(cfg, reg, checkpoint, g);
	if (st || g->ck || g->file.fd >= 0)
		return st;
	if (!*g->dir)
		return kiln_error(KILN_EUSAGE, "no checkpoint given and [run] out_dir is empty");
	const char *w = kiln_config_where(cfg, "run", "out_dir");
	const int def = !strcmp(w, "default");
	return kiln_error(KILN_ECONFIG, "%s%s[run] out_dir%s: %s: no checkpoint to evaluate (`kiln train` writes one after its last step; or give --checkpoint CKPT)",
			  def ? "" : w, def ? "" : ": ", def ? " (the default)" : "", g->dir);
}

/* `kiln eval --fold`: the folded config of the model of g's weights
 * (*fcfg, the caller's) and that model, open with those weights in *tr
 * (need_trained < 0: the config's model's shape, no weights read);
 * flags: kiln_infer_fold_config_ex's (the residual adds, f32 only). */
static kiln_status fold_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const struct kiln_given *g, int need_trained, int flags,
			     struct kiln_trained *tr, struct kiln_config **fcfg)
{
	int n = 0;
	kiln_status st = kiln_trained_open_given(cfg, reg, g, "folding", need_trained, tr);
	if (!st)
		st = kiln_infer_fold_config_ex(tr->m, (struct kiln_registry *)reg, flags, fcfg, &n);
	if (!st)
		kiln_log(KILN_LOG_INFO, "eval", "folded: %d layers removed (batchnorm into conv/linear, dropout%s), [run] fuse = 1",
			 n, flags & KILN_FOLD_RESIDUAL ? ", residual add into conv" : "");
	return st;
}

/* `kiln eval --quantized Q`: the folded config of cfg's model with Q's
 * int8 keys (*fcfg) and Q open (*qf), both the caller's. */
static kiln_status quant_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *path, struct kiln_config **fcfg,
			      struct kiln_safetensors **qf)
{
	struct kiln_trained tr = { 0 };
	kiln_status st = kiln_quant_need_fp32(cfg, "an INT8 model computes in fp32");
	if (!st)
		st = kiln_quant_open(path, qf);
	/* (no weights read: Q's input sample, else [data]'s, session 39) */
	const struct kiln_given none = { .file.fd = -1, .qf = *qf };
	if (!st)
		st = kiln_quant_config_check(*qf, cfg, reg);
	if (!st)
		st = fold_open(cfg, reg, &none, -1, KILN_FOLD_INT8, &tr, fcfg);
	kiln_trained_close(&tr);
	if (!st && (st = kiln_quant_config(*fcfg, *qf)))
		st = kiln_error_wrap(st, "%s", path);
	return st;
}

/* `kiln eval --checkpoint`: the weights of a checkpoint (params and
 * buffers) evaluated on [data.eval], with the trainer's pipeline. */
kiln_status kiln_evaluate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, struct kiln_train_result *res)
{
	/* a failure before evaluate() told the program's hook here, as
	 * trainer_close tells a later one (before session 37 not at all) */
	if (!cfg || !reg)
		return trainer_error_told(kiln_null_arg("kiln_evaluate", !cfg ? "cfg" : "reg"));
	const struct kiln_eval_opts none = { 0 };
	kiln_status st = trainer_result_check(res, "kiln_evaluate");
	return st ? trainer_error_told(st) : kiln_evaluate_ex(cfg, reg, checkpoint, &none, res);
}

/* The model to evaluate, open in t with the weights of g, a checkpoint's
 * or a weights file's (as [model] init_from reads one), folded when
 * o->fold says. */
static kiln_status eval_open_given(struct trainer *t, const struct kiln_config *cfg,
				   const struct kiln_registry *reg, const struct kiln_given *g,
				   const struct kiln_eval_opts *o, const struct kiln_train_cfg *tc,
				   struct kiln_train_result *res, struct kiln_config **fcfg)
{
	const char *checkpoint = g->ck ? kiln_ckpt_path(g->ck) : g->path;
	struct kiln_trained tr = { 0 };
	kiln_status st;
	snprintf(res->checkpoint, sizeof res->checkpoint, "%s", checkpoint);
	if (o->fold && (st = fold_open(cfg, reg, g, 1, o->no_residual ? 0 : KILN_FOLD_RESIDUAL, &tr,
				       fcfg)))
		return st;
	/* the trained weights to host memory and off the device before the
	 * folded model is built: never both held (session 38) */
	struct kiln_fold_host *h = NULL;
	if (*fcfg && ((st = kiln_infer_fold_read(tr.m, tr.stream, &h)) ||
		      (st = kiln_model_weights_free(tr.m, tr.stream)))) {
		kiln_infer_fold_host_free(h);
		kiln_trained_close(&tr);
		return st;
	}
	if (!(st = trainer_open(t, *fcfg ? *fcfg : cfg, reg, tc, 0, res)))
		st = *fcfg ? kiln_infer_fold_write(tr.m, h, t->m, t->compute)
		     : g->ck ? kiln_ckpt_load_model(g->ck, t->m, t->compute, KILN_CKPT_LOAD_WEIGHTS)
			     : kiln_given_load(t->m, g, t->compute);
	kiln_infer_fold_host_free(h);
	struct kiln_tensor_desc trained;
	if (!st && g->ck && !kiln_ckpt_sample(g->ck, &trained))
		kiln_trained_sample_warn("data.eval", &t->test.input, &trained, 1);
	kiln_trained_close(&tr);
	snprintf(res->checkpoint, sizeof res->checkpoint, "%s", checkpoint); /* trainer_open cleared it */
	return st;
}

/* The model to evaluate, open in t with its weights: the checkpoint's
 * (*ck, *step), a weights file's (step -1), folded (o->fold), or a
 * quantized file's (o->quantized). */
static kiln_status eval_open(struct trainer *t, const struct kiln_config *cfg,
			     const struct kiln_registry *reg, const char *checkpoint,
			     const struct kiln_eval_opts *o, struct kiln_train_result *res,
			     struct kiln_ckpt **ck, int64_t *step, struct kiln_config **fcfg)
{
	struct kiln_train_cfg tc;
	struct kiln_safetensors *qf = NULL;
	kiln_status st;
	if ((st = kiln_train_cfg_fill(cfg, NULL, &tc)))
		return st;
	if (o->quantized) {
		const char *v;
		if ((st = kiln_quant_no_weights(o->quantized, checkpoint)) ||
		    (st = quant_open(cfg, reg, o->quantized, fcfg, &qf)) ||
		    (st = trainer_open(t, *fcfg, reg, &tc, 0, res)) ||
		    (st = kiln_quant_load(t->m, qf, t->compute)))
			st = kiln_error_wrap(st, "%s", o->quantized);
		*step = (v = qf ? kiln_safetensors_meta(qf, "kiln.step") : NULL) ? atoll(v) : -1;
		snprintf(res->checkpoint, sizeof res->checkpoint, "%s", o->quantized); /* after trainer_open */
		kiln_safetensors_close(qf);
		return st;
	}
	/* the weights first, opened once: verifying a checkpoint is cheap,
	 * and it must hold the model this config describes (a weights file:
	 * as [model] init_from reads one, no step) */
	struct kiln_given g;
	if (!(st = open_checkpoint(cfg, reg, checkpoint, &g))) {
		*step = g.ck ? kiln_ckpt_step(g.ck) : -1;
		st = eval_open_given(t, cfg, reg, &g, o, &tc, res, fcfg);
	}
	*ck = g.ck; /* (the caller's: closed after the evaluation) */
	g.ck = NULL;
	kiln_given_close(&g);
	return st;
}

/* kiln_evaluate_ex into the library's own result (res: whole). */
static kiln_status evaluate(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    const char *checkpoint, const struct kiln_eval_opts *o,
			    struct kiln_train_result *res)
{
	struct trainer T = { 0 }, *t = &T;
	struct kiln_ckpt *ck = NULL;
	struct kiln_config *fcfg = NULL;
	int64_t step = -1;
	kiln_status st;
	/* nothing ran yet: no test nor val evaluation (-1), whatever fails
	 * (before session 36 val_loss and val_acc were left 0, a loss) */
	trainer_result_none(res);
	if ((st = eval_open(t, cfg, reg, checkpoint, o, res, &ck, &step, &fcfg)))
		goto out;
	if (step >= 0)
		kiln_log(KILN_LOG_INFO, "eval", "%s: the weights of step %lld", res->checkpoint,
			 (long long)step);
	const struct eval_target e = { &t->test, t->prem, &res->test_loss, &res->test_acc,
				       &res->test_acc5, &res->test_samples, "test" };
	double t0 = kiln_now_s();
	if ((st = eval_pass(t, &e, "the evaluation")))
		goto out;
	res->wall_s = kiln_now_s() - t0;
	res->eval_samples_per_s = (double)t->test.len / res->wall_s;
	res->steps = step;
	res->data_skipped = atomic_load(&t->test.ds.skipped);
	st = kiln_device_stream_sync(t->dev, t->compute);
out:
	st = trainer_close(t, st);
	kiln_ckpt_close(ck);
	kiln_config_free(fcfg);
	return st;
}

/* The evaluation into a result of this library's size, copied into the
 * caller's as far as its size goes (kiln/kiln.h, struct
 * kiln_train_result). */
kiln_status kiln_evaluate_ex(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const char *checkpoint, const struct kiln_eval_opts *o,
			     struct kiln_train_result *res)
{
	if (!cfg || !reg)
		return trainer_error_told(kiln_null_arg("kiln_evaluate_ex", !cfg ? "cfg" : "reg"));
	struct kiln_train_result full = { 0 };
	const struct kiln_eval_opts none = { 0 };
	kiln_status st = trainer_result_check(res, "kiln_evaluate_ex");
	if (st)
		return trainer_error_told(st);
	/* NULL opts: kiln_evaluate's (a crash in eval_open before session 37) */
	st = evaluate(cfg, reg, checkpoint, o ? o : &none, &full);
	trainer_result_out(res, &full);
	return st;
}

/* ---- kiln quantize ------------------------------------------------------ */

static kiln_status calib_each(void *user, struct kiln_plan *p, const void *x, int64_t rows,
			      void *stream)
{
	return kiln_quant_calib_batch(user, p, x, rows, stream);
}

/* The calibration pass: the first o->batches full batches of [data.eval]
 * through a keep_all plan of t's (folded) model, observed into q. */
static kiln_status calibrate(struct trainer *t, const struct kiln_quantize_opts *o,
			     struct kiln_quant_calib *q)
{
	const struct kiln_plan_opts po = { .keep_all = 1 };
	struct kiln_plan *full = NULL;
	double loss, acc, acc5;
	int64_t n;
	const int64_t rows = (t->test.len / t->EB < o->batches ? t->test.len / t->EB : o->batches) * t->EB;
	if (rows < 1)
		return kiln_error(KILN_EUSAGE, "calibration needs a full batch of [train] eval_batch = %lld rows; [data.eval] has %lld",
				  (long long)t->EB, (long long)t->test.len);
	kiln_status st = kiln_model_plan_ex(t->m, t->EB, &po, &full);
	const struct eval_target e = { &t->test, NULL, &loss, &acc, &acc5, &n, "calibration" };
	const struct eval_calib cal = { full, rows, calib_each, q };
	if (!st)
		st = eval_pass_cal(t, &e, &cal, "the calibration");
	if (!st)
		kiln_log(KILN_LOG_INFO, "quantize", "calibrated on %lld batches, %lld samples (fp32 folded: loss %.4f acc %.4f)",
			 (long long)(rows / t->EB), (long long)n, common_nan_plain(loss),
			 common_nan_plain(acc));
	if (!st && rows / t->EB < o->batches)
		kiln_log(KILN_LOG_WARN, "quantize", "%lld calibration batches asked for; [data.eval] has %lld full batches of %lld rows, all of them used",
			 (long long)o->batches, (long long)(rows / t->EB), (long long)t->EB);
	if (full)
		kiln_device_stream_sync(t->dev, t->compute);
	kiln_plan_free(full);
	return st;
}

kiln_status kiln_quantize(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  const char *checkpoint, const struct kiln_quantize_opts *o)
{
	if (!cfg || !reg || !o)
		return trainer_error_told(
			kiln_null_arg("kiln_quantize", !cfg ? "cfg" : !reg ? "reg" : "opts"));
	struct trainer T = { 0 }, *t = &T;
	struct kiln_train_result res;
	struct kiln_ckpt *ck = NULL;
	struct kiln_config *fcfg = NULL;
	struct kiln_quant_calib *q = NULL;
	/* the adds stay layers: their ranges go into the INT8 model */
	const struct kiln_eval_opts fold = { .fold = 1, .no_residual = 1 };
	int64_t step = -1;
	char *config = NULL;
	/* minmax by default: the only rule within 0.5 points of fp32 on every
	 * example model measured (docs/PERFORMANCE.md, session 9) */
	const char *mname = o->method ? o->method : "minmax";
	const int method = kiln_quant_method_parse(mname);
	kiln_status st;
	memset(&res, 0, sizeof res);
	if (method < 0 || o->batches < 1 || !(o->percentile > 0 && o->percentile <= 100) || !o->out)
		return trainer_error_told(kiln_error(KILN_EUSAGE, "quantize: method minmax|percentile|entropy (got %s), batches >= 1 (got %lld), percentile in (0, 100] (got %g), an output file",
				  mname, (long long)o->batches, o->percentile));
	if ((st = kiln_quant_need_fp32(cfg, "kiln quantize calibrates on f32 activations, and an INT8 model computes in fp32")))
		return trainer_error_told(st);
	if ((st = eval_open(t, cfg, reg, checkpoint, &fold, &res, &ck, &step, &fcfg)) ||
	    /* neither the checkpoint quantized nor another (before session
	     * 29 either was overwritten silently) */
	    (st = kiln_output_check(o->out, (const char *[]){ res.checkpoint }, 1)) ||
	    (st = kiln_quant_calib_new(t->m, &q)) || (st = calibrate(t, o, q)) ||
	    (st = (config = kiln_ckpt_config_text(cfg, reg)) ? KILN_OK : KILN_ENOMEM) ||
	    (st = kiln_quant_write(q, t->m, t->compute, method, o->percentile, step, config,
				   o->out)))
		goto out;
	kiln_log(KILN_LOG_INFO, "quantize", "%s: INT8 model of %s (step %lld), %s ranges", o->out,
		 res.checkpoint, (long long)step, mname);
out:
	st = trainer_close(t, st);
	kiln_quant_calib_free(q);
	kiln_ckpt_close(ck);
	kiln_config_free(fcfg);
	free(config);
	return st;
}
