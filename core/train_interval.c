/* core/train_interval.c - the log interval across a checkpoint: what a
 * checkpoint between two log points holds of the interval the next log
 * point closes (the "interval" section, checkpoint.h), and a resumed
 * run's start from it.  Each rank's device sums are f32 and its carried
 * sums f64: the resumed run seeds them as they were, so that its first
 * train line averages the whole interval and its epoch's sums round as
 * the uninterrupted run's (before session 39 the device's sums started at
 * 0 after a resume: the first line covered the steps after it alone, and
 * the epoch's train_loss differed in the last bits).  See train.h. */
#include "train.h"

#include <stdio.h>

/* The processes of the run: the data-parallel ranks x the stages. */
static int64_t ranks_total(const struct trainer *t)
{
	return (int64_t)t->world * (t->pipe_P > 0 ? t->pipe_P : 1);
}

/* The interval iv was written by a run of this one's ranks and stages. */
static int same_layout(const struct trainer *t, const struct kiln_ckpt_interval *iv)
{
	return iv->ranks && iv->ranks == ranks_total(t) &&
	       iv->pipeline == (t->pipe_P > 0 ? t->pipe_P : 1);
}

/* This rank's interval as it stands, but its device sums (the caller's:
 * t->metrics_host once read). */
static void interval_now(const struct trainer *t, struct kiln_ckpt_interval *iv,
			 struct kiln_ckpt_interval_rank *mine)
{
	*iv = (struct kiln_ckpt_interval){
		.start = t->interval_start, .samples = t->since, .rows = t->metric_rows,
		.skipped = t->nonfinite_seen, .loss = t->ep_loss, .correct = t->ep_correct,
		.epoch_samples = t->ep_samples, .pipeline = t->pipe_P > 0 ? t->pipe_P : 1,
		.ranks = ranks_total(t),
	};
	memset(mine, 0, sizeof *mine); /* (its padding too: it travels as bytes) */
	mine->carry[0] = t->carry_loss;
	mine->carry[1] = t->carry_correct;
}

/* The interval iv of another number of data-parallel ranks (or of
 * stages) in this run's layout, into *out and this rank's entry *mine:
 * the old ranks' samples and sums, which this run's do not split alike,
 * as a whole (every old rank's sums added, in f64) in rank 0's carried
 * sums, the counts this run's share (the epoch's sums scaled as
 * epoch_sums_rescale scales them), so the first line still averages the
 * whole interval, in other rounding.  0 when that share is no whole
 * number of samples a rank (a global batch changed with the world). */
static int rescaled(const struct trainer *t, const struct kiln_ckpt_interval *iv,
		    struct kiln_ckpt_interval *out, struct kiln_ckpt_interval_rank *mine)
{
	const int64_t D0 = iv->ranks / iv->pipeline, D1 = t->world;
	int64_t n, e;
	if (__builtin_mul_overflow(iv->samples, D0, &n) ||
	    __builtin_mul_overflow(iv->epoch_samples, D0, &e) || n % D1 || e % D1)
		return 0;
	double sum[2] = { 0, 0 };
	for (int64_t r = 0; r < iv->ranks; r++)
		for (int i = 0; i < 2; i++)
			sum[i] += (double)iv->rank[r].sums[i] + iv->rank[r].carry[i];
	const double f = (double)D0 / (double)D1;
	*out = (struct kiln_ckpt_interval){
		.closed = iv->closed, .start = iv->start, .samples = n / D1, .rows = 0,
		.skipped = iv->skipped, .loss = iv->loss * f, .correct = iv->correct * f,
		.epoch_samples = e / D1, .pipeline = t->pipe_P > 0 ? t->pipe_P : 1,
		.ranks = ranks_total(t),
	};
	memset(mine, 0, sizeof *mine);
	mine->carry[0] = t->rank ? 0 : sum[0];
	mine->carry[1] = t->rank ? 0 : sum[1];
	return 1;
}

kiln_status trainer_interval_open(struct trainer *t)
{
	if (!(t->iv_all = calloc((size_t)ranks_total(t), sizeof *t->iv_all)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	return KILN_OK;
}

void trainer_interval_closing(struct trainer *t, int early)
{
	if (early)
		interval_now(t, &t->iv_kept, &t->iv_kept_mine);
}

/* The interval kept for the checkpoints of step t->step, its device sums
 * those in t->metrics_host. */
static void kept(struct trainer *t)
{
	/* (the sums read, f32 as the device had them) */
	memcpy(t->iv_kept_mine.sums, t->metrics_host, sizeof t->iv_kept_mine.sums);
	t->iv_kept_step = t->step;
}

void trainer_interval_closed(struct trainer *t, int early)
{
	if (!early)
		return;
	kept(t);
	t->iv_kept.closed = 1;
}

void trainer_interval_keep(struct trainer *t)
{
	if (t->since <= 0 || t->iv_kept_step == t->step)
		return;
	interval_now(t, &t->iv_kept, &t->iv_kept_mine);
	kept(t);
}

kiln_status trainer_interval_meta(struct trainer *t, int64_t step, struct kiln_ckpt_interval *iv,
				  const struct kiln_ckpt_interval **out)
{
	struct kiln_ckpt_interval_rank mine;
	kiln_status st;
	*out = NULL;
	/* (the same on every rank: the collective below is every rank's;
	 * nothing before it can fail on one rank alone: t->iv_all was
	 * allocated when the loop opened, and the device's sums were read
	 * by trainer_epoch_sums, whose failure every rank shares; before,
	 * a rank whose read or allocation here failed left the others
	 * waiting in the allgather) */
	if (t->no_step_left && step == t->step0 && t->iv0.ranks) {
		/* a resume with no step left writes its checkpoint again (the
		 * evaluations after its step): the interval it resumed with,
		 * which it did not seed (trainer_interval_seed), kept for a
		 * later resume that trains on; on another layout in this
		 * run's, as the file's "trainer" and "epoch" sections are
		 * (before session 40 dropped), unless it is no whole share
		 * of this run's ranks (a resume would start it afresh) */
		if (same_layout(t, &t->iv0)) {
			*iv = t->iv0;
			*out = iv;
			return KILN_OK;
		}
		if (!rescaled(t, &t->iv0, iv, &mine) ||
		    iv->epoch_samples + iv->samples != t->ep0_sums.samples)
			return KILN_OK;
	} else if (t->iv_kept_step == step) {
		*iv = t->iv_kept;
		mine = t->iv_kept_mine;
	} else if (t->since > 0 && !t->ckpt_end) {
		interval_now(t, iv, &mine);
		memcpy(mine.sums, t->metrics_host, sizeof mine.sums);
	} else {
		return KILN_OK;
	}
	char what[96];
	snprintf(what, sizeof what, "the log interval's sums for step %lld's checkpoint",
		 (long long)step);
	if ((st = kiln_dist_allgather_host(t->dist, KILN_OK, what, &mine, t->iv_all, sizeof mine,
					   t->compute)))
		return st;
	iv->rank = t->iv_all;
	*out = iv;
	return KILN_OK;
}

kiln_status trainer_interval_read(struct trainer *t, struct kiln_ckpt *ck,
				  const struct kiln_ckpt_trainer *tr, const struct kiln_ckpt_epoch *ep)
{
	struct kiln_ckpt_interval *iv = &t->iv0;
	free(iv->rank);
	kiln_status st = kiln_ckpt_interval_get(ck, iv);
	if (st == KILN_ENOTFOUND)
		return KILN_OK;
	if (st)
		return st;
	/* (the two sections of one writer: the epoch's sums are the
	 * interval's and those before it) */
	int64_t w;
	if (!ep || (uint64_t)iv->epoch_samples + (uint64_t)iv->samples != (uint64_t)ep->samples ||
	    __builtin_mul_overflow(tr->world, iv->pipeline, &w) || w != iv->ranks) {
		st = kiln_error(KILN_EDATA, "checkpoint %s: section 'interval' (%lld + %lld samples a rank, %lld ranks in %lld stage(s)) does not match section 'epoch' (%lld samples) and 'trainer' (%lld ranks)",
				kiln_ckpt_path(ck), (long long)iv->epoch_samples, (long long)iv->samples,
				(long long)iv->ranks, (long long)iv->pipeline,
				(long long)(ep ? ep->samples : -1), (long long)tr->world);
		free(iv->rank);
		memset(iv, 0, sizeof *iv);
	}
	return st;
}

/* The interval iv into this run's state, this rank's entry e: the
 * device's sums and the carried ones, the interval's counts, the epoch's
 * sums before it. */
static kiln_status seed(struct trainer *t, const struct kiln_ckpt_interval *iv,
			const struct kiln_ckpt_interval_rank *e)
{
	memcpy(t->metrics_host, e->sums, sizeof e->sums);
	kiln_status st = kiln_device_copy_async(t->dev, t->metrics_dev, t->metrics_host,
						sizeof e->sums, KILN_COPY_H2D, t->compute);
	if (st || (st = kiln_device_stream_sync(t->dev, t->compute)))
		return st;
	t->carry_loss = e->carry[0];
	t->carry_correct = e->carry[1];
	t->since = t->since_seeded = iv->samples;
	t->metric_rows = iv->rows;
	t->ep_loss = iv->loss;
	t->ep_correct = iv->correct;
	t->ep_samples = iv->epoch_samples;
	return KILN_OK;
}

kiln_status trainer_interval_seed(struct trainer *t)
{
	const struct kiln_ckpt_interval *iv = &t->iv0;
	struct kiln_ckpt_interval r;
	struct kiln_ckpt_interval_rank mine;
	kiln_status st;
	/* (no step left, in the run or in the epoch, whose end is a log point
	 * only after a step: the epoch's sums are the checkpoint's, the
	 * interval in them, as a log point at the last step would have added
	 * it) */
	if (!iv->ranks || t->no_step_left || t->off0 / t->G >= t->steps_per_epoch)
		return KILN_OK;
	if (same_layout(t, iv)) {
		/* the same ranks and stages: each rank's own sums, as they were */
		st = seed(t, iv, &iv->rank[t->rank]);
	} else if (!rescaled(t, iv, &r, &mine)) {
		if (!t->rank)
			kiln_log(KILN_LOG_INFO, "train", "resume: the log interval open at the checkpoint (%lld samples on each of %lld rank(s)) is no whole share of %d ranks: the first train line after the resume averages the steps after it alone",
				 (long long)iv->samples, (long long)(iv->ranks / iv->pipeline), t->world);
		return KILN_OK;
	} else {
		if (!t->rank)
			kiln_log(KILN_LOG_INFO, "train", "resume: the log interval open at the checkpoint (steps %lld..%lld, %lld rank(s) in %lld stage(s)) goes on over %lld rank(s) in %d stage(s): its sums whole, in other rounding",
				 (long long)iv->start + 1, (long long)t->step, (long long)iv->ranks,
				 (long long)iv->pipeline, (long long)ranks_total(t), t->pipe_P > 0 ? t->pipe_P : 1);
		st = seed(t, &r, &mine);
	}
	if (st)
		return st;
	t->interval_start = iv->start;
	if (t->clip)
		t->nonfinite_seen = iv->skipped;
	return KILN_OK;
}
