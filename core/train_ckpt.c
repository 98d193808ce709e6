/* core/train_ckpt.c - the trainer's checkpoints: one after a step (every
 * checkpoint_every steps, after the run's last step, when a stop was
 * requested), keep_best's after an evaluation (its list: train_best.c),
 * and the resume from the newest usable one.  The file format is checkpoint.h's; rank 0's resume
 * reaches the other ranks through train_dist.c.  See train.h. */
#include "train.h"
#include "config_diff.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../plugins/common/cache_file.h" /* common_mkdirs */

kiln_status trainer_epoch_sums(struct trainer *t, kiln_status st, const char *what,
			       struct kiln_ckpt_epoch *out)
{
	double v[2] = { 0, 0 };
	if (!st)
		st = trainer_metrics_peek(t);
	if (!st) {
		v[0] = t->metrics_host[0] + t->carry_loss;
		v[1] = t->metrics_host[1] + t->carry_correct;
	}
	/* (a failed read still joins the sum: before, it returned first and
	 * left the other ranks waiting there) */
	if ((st = kiln_dist_sum_agreed(t->dist, st, v, 2, what, t->compute)))
		return st;
	if (t->dist)
		v[0] /= t->world, v[1] /= t->world;
	out->loss = t->ep_loss + v[0];
	out->correct = t->ep_correct + v[1];
	out->samples = t->ep_samples + t->since;
	return KILN_OK;
}

/* A resume's epoch sums in this run's units.  The checkpoint holds them
 * per rank (the ranks' sums averaged, the samples one rank trained) of the
 * run that wrote it; another world size trains another share a rank: the
 * sums scaled to this run's share of the epoch's samples so far (tr's
 * offset over the ranks), else the new ranks' sums would be added to
 * another share's (the epoch's loss off after a resume from 1 rank on 2). */
static void epoch_sums_rescale(struct trainer *t, const struct kiln_ckpt_trainer *tr)
{
	struct kiln_ckpt_epoch *e = &t->ep0_sums;
	const int64_t share = tr->offset / (t->world > 0 ? t->world : 1);
	if (e->samples <= 0 || share == e->samples)
		return;
	const double f = (double)share / (double)e->samples;
	kiln_log(KILN_LOG_INFO, "train", "resume: the epoch's sums so far cover %lld samples a rank where the checkpoint's run trained %lld (%lld ranks now, the checkpoint's %lld): scaled by %g",
		 (long long)share, (long long)e->samples, (long long)t->world, (long long)tr->world, f);
	e->loss *= f;
	e->correct *= f;
	e->samples = share;
}

/* Every rank: write the state to dir/ckpt-<step>.kiln (meta's step), the
 * one path of the periodic, final and keep_best checkpoints.  Stages on
 * ranks: each stage's slice streamed to rank 0, which writes, nothing
 * gathered whole (core/dist_pipe_ckpt.c).  Otherwise ZeRO-1's shards and
 * the stages are gathered and rank 0 writes for all (the state is the
 * same on every rank).  Either way the ranks then agree on the outcome
 * (kiln_dist_ckpt_agree): a failure of rank 0's write (a directory it
 * cannot create, a full disk) is an error on every rank naming rank 0,
 * the file and the cause.  The path written into path on rank 0. */
kiln_status trainer_ckpt_write(struct trainer *t, const char *dir,
			      const struct kiln_ckpt_meta *meta, char *path, size_t n)
{
	kiln_status st, st2;
	trainer_test_delay("KILN_TEST_CKPT_DELAY_MS"); /* (tests/log_rates.sh: a slow disk) */
	/* a diverged state is not written: the last good checkpoint stays
	 * the newest */
	if ((st = trainer_params_finite(t)))
		return st;
	/* (stages on ranks: the run directory checked here too, as below;
	 * before session 34 only at log points, and rank 0's write recreated
	 * checkpoints/ alone) */
	if (kiln_dist_pipe_ckpt_streams(t->dist))
		return kiln_dist_pipe_ckpt_save(t->dist, t->rank ? KILN_OK : trainer_out_dir_watch(t),
						dir, meta, t->compute, path, n);
	/* every failure ends in the agreement: the local step first, agreed on
	 * before the gather's collectives */
	st = kiln_dist_zero_prepare(t->dist);
	if (!kiln_dist_ckpt_ready(t->dist, &st, t->compute)) {
		kiln_dist_zero_release(t->dist);
		return kiln_dist_ckpt_agree(t->dist, st, dir, meta->trainer.step, t->compute);
	}
	if ((st = kiln_dist_zero_gather(t->dist, t->compute)))
		;
	/* (the run directory removed mid-run: recreated first, not just its
	 * checkpoints/ as the mkdir below did before session 33) */
	else if (!t->rank && (st = trainer_out_dir_watch(t)))
		;
	else if (!t->rank && common_mkdirs(dir, 0777, 1))
		st = kiln_error(KILN_EIO, "%s: cannot create: %s", dir, strerror(errno));
	else if (!t->rank && !kiln_dist_zero_streams(t->dist) &&
		 (st = kiln_ckpt_save(dir, meta, t->m, t->compute, path, n)) && !t->res->out_dir_lost &&
		 !trainer_out_dir_watch(t) && t->res->out_dir_lost && !common_mkdirs(dir, 0777, 1))
		/* the run directory renamed or removed during the write (its
		 * temporary went with it, the rename failed: ENOENT, a CI run
		 * of session 34): the loss seen now, the checkpoint written
		 * again into the recreated directory, the run stopping with
		 * exit 4 as for a loss seen before the write */
		st = kiln_ckpt_save(dir, meta, t->m, t->compute, path, n);
	/* (ZeRO-1 without stages: every rank takes part in the write) */
	if (kiln_dist_zero_streams(t->dist))
		st = kiln_dist_zero_save(t->dist, st, dir, meta, t->compute, path, n);
	kiln_dist_zero_release(t->dist);
	st2 = kiln_dist_pipe_release(t->dist, t->compute);
	return kiln_dist_ckpt_agree(t->dist, st ? st : st2, dir, meta->trainer.step, t->compute);
}

static void checkpoint_done(struct trainer *t, const char *path, int again, double secs);
static kiln_status end_mark(struct trainer *t, int what);

/* Evaluations the run records follow its last step `step`: the epoch's
 * ([train] eval, eval_every = 0), eval_every's when `step` is no
 * evaluation point (trainer_closing_eval; before session 39 not recorded,
 * so not followed by a checkpoint with its numbers), or [data.val]'s final
 * test. */
static int evals_follow_last(const struct trainer *t, int64_t step)
{
	return trainer_closing_eval(t, step) || t->have_val;
}


/* Write a checkpoint of the state after the step that ended t->pos (a host
 * sync point), then delete all but the keep_last newest.  evaluated: the
 * evaluations after the step are done, their numbers (NULL: not). */
/* The epoch's sums, early stopping's state and the clip op's counts into
 * r, pointed to from meta: one place for what a resume reads of any
 * checkpoint, so keep_best's carry it as the periodic ones do (before
 * session 35 best/ files had no "epoch" or "stopper": a run resumed from
 * one started early stopping's count afresh, and stopped 5 steps after
 * the uninterrupted run, and its epoch's train loss averaged the steps
 * after the resume alone).  Every rank: the sums are a collective; after
 * the run's last step (ckpt_end) the ones taken there, as the evaluations
 * since have used the device's sums. */
kiln_status trainer_ckpt_resume_meta(struct trainer *t, kiln_status st,
				     struct trainer_ckpt_resume *r, struct kiln_ckpt_meta *meta)
{
	char what[48];
	double none = 0;
	snprintf(what, sizeof what, "step %lld's checkpoint", (long long)meta->trainer.step);
	r->sums = t->end_sums;
	/* (st, the caller's local step, and the clip op's read of its counts
	 * join the first sum, one of no values after the run's last step,
	 * whose sums were taken then: before, a rank whose read failed
	 * returned before the data's skipped count and left its peers there) */
	if (!st)
		st = trainer_clip_counts(t, r->counts);
	if ((st = t->ckpt_end ? kiln_dist_sum_agreed(t->dist, st, &none, 0, what, t->compute)
			      : trainer_epoch_sums(t, st, what, &r->sums)) ||
	    (st = trainer_interval_meta(t, meta->trainer.step, &r->interval, &meta->interval)) ||
	    (st = trainer_data_skipped(t, &r->data_skipped)))
		return st;
	r->stopper = (struct kiln_ckpt_stopper){ t->stopper.best, t->stopper.bad, t->stopper.have };
	meta->epoch = &r->sums;
	meta->stopper = t->tc.early_stop_patience ? &r->stopper : NULL;
	r->plateau = t->plateau;
	meta->plateau = t->plateau_mul ? &r->plateau : NULL;
	meta->clip_counts = t->clip ? r->counts : NULL;
	meta->data_skipped = t->train.ds.on_error == KILN_ON_ERROR_SKIP || r->data_skipped
				     ? &r->data_skipped
				     : NULL;
	return KILN_OK;
}

static kiln_status checkpoint(struct trainer *t, const struct kiln_ckpt_evaluated *evaluated,
			      char *path, size_t n)
{
	struct trainer_ckpt_resume r;
	struct kiln_ckpt_best *best;
	struct kiln_ckpt_meta meta = { .config = t->config_text, .versions = t->versions,
				       .trainer = t->pos, .eval_owed = t->eval_owed,
				       .evaluated = evaluated };
	/* the steps queued on the device are done first: their time is the
	 * steps', the rest the write's, set aside (a sync point anyway); its
	 * failure joins the ranks' first sum (before, this rank returned and
	 * left the others waiting in it).  KILN_TEST_CKPT_FAIL's "sync" fails it */
	kiln_status st = kiln_device_stream_sync(t->dev, t->compute);
	if (!st)
		st = kiln_dist_ckpt_fault_at(t->dist, "sync", "the device's queued steps");
	const double t0 = kiln_now_s();
	/* keep_best's list too (its allocation: before session 41 it came
	 * after the sums and left the other ranks in the write's collectives) */
	best = NULL;
	if (!st)
		st = trainer_best_meta(t, -1, 0, &meta, &best);
	/* every rank: the sums are a collective, and so is the write */
	if ((st = trainer_ckpt_resume_meta(t, st, &r, &meta))) {
		free(best);
		return st;
	}
	t->ckpt_step = t->pos.step;
	st = trainer_ckpt_write(t, t->ckdir, &meta, path, n);
	free(best);
	const double secs = trainer_set_aside(t, t0);
	if (!st)
		t->named_step = t->pos.step;
	if (t->rank) /* (rank 0 names the checkpoints it writes) */
		path[0] = 0;
	if (st || t->rank)
		return st;
	/* (the run's last checkpoint written again with the numbers of the
	 * evaluations after its step, trainer_checkpoint_end) */
	checkpoint_done(t, path, evaluated && t->ckpt_end, secs);
	return KILN_OK;
}


/* Rank 0, a checkpoint written: logged, the old ones pruned.  The
 * "checkpoint" event once a step: a file written again (the run's last,
 * again: `again`; or after an evaluation that changed its stopper or
 * keep_best list, trainer_evaluate) logs none when that step's is logged;
 * a resumed process's first write of the step it resumed at logs it
 * unless metrics.jsonl has it (trainer_checkpoint_logged), as the run
 * that wrote it may have been killed between its rename and its event
 * (and its prune: pruning twice deletes nothing more; before session 33
 * the rewrite neither pruned nor logged, and such a kill left an extra
 * checkpoint for good).  Its "checkpoint_s": the seconds the write took
 * (secs: the state's sums, gather and file), which the train lines'
 * samples_per_s leave out (session 40). */
static void checkpoint_done(struct trainer *t, const char *path, int again, double secs)
{
	if (again)
		kiln_log(KILN_LOG_INFO, "train", "checkpoint %s again, with the numbers of the evaluations after step %lld",
			 path, (long long)t->pos.step);
	else
		kiln_log(KILN_LOG_INFO, "train", "checkpoint %s (epoch %lld, step %lld)", path,
			 (long long)t->pos.epoch + 1, (long long)t->pos.step);
	kiln_ckpt_prune(t->ckdir, t->tc.keep_last, t->pos.step);
	trainer_best_prune_tmp(t);
	if (t->logged_step == t->pos.step)
		return;
	t->logged_step = t->pos.step;
	trainer_jsonl(t, "{s:s, s:I, s:o, s:o}", "event", "checkpoint", "step",
		      (json_int_t)t->pos.step, "path", trainer_json_text(path), "checkpoint_s",
		      trainer_json_real(secs));
}

/* The read of trainer_checkpoint_logged: metrics.jsonl's last bytes (a
 * checkpoint event is the last line or near it when a run is killed). */
#define LOGGED_TAIL (1 << 20)

int trainer_checkpoint_logged(const char *out_dir, int64_t step)
{
	char path[4200], needle[96];
	snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
	FILE *f = fopen(path, "rb");
	if (!f)
		return 0;
	char *buf = NULL;
	long size = -1;
	if (!fseek(f, 0, SEEK_END) && (size = ftell(f)) > 0 &&
	    !fseek(f, size > LOGGED_TAIL ? size - LOGGED_TAIL : 0, SEEK_SET))
		buf = malloc(LOGGED_TAIL + 1);
	size_t n = buf ? fread(buf, 1, LOGGED_TAIL, f) : 0;
	fclose(f);
	if (!buf)
		return 0;
	buf[n] = 0;
	/* trainer_jsonl's compact form; the step's digits then a non-digit */
	const int k = snprintf(needle, sizeof needle, "\"event\":\"checkpoint\",\"step\":%lld",
			       (long long)step);
	int found = 0;
	for (const char *p = buf; !found && (p = strstr(p, needle)); p += k)
		found = p[k] < '0' || p[k] > '9';
	free(buf);
	return found;
}

/* The checkpoint of the state after step t->step, at sample offset of
 * epoch t->ep (a host sync point), or a stop's warning without out_dir. */
static kiln_status checkpoint_at(struct trainer *t, int64_t offset)
{
	kiln_status st;
	t->pos.epoch = t->ep;
	t->pos.step = t->step;
	t->pos.offset = offset;
	if (!*t->ckdir) {
		if (t->stopping)
			kiln_log(KILN_LOG_WARN, "train", "stop requested: [run] out_dir is empty, so no checkpoint is written");
		return KILN_OK;
	}
	/* a host sync point like a log point: not steady state */
	trainer_counters_take(t);
	const int lost0 = t->res->out_dir_lost;
	if ((st = checkpoint(t, NULL, t->res->checkpoint, sizeof t->res->checkpoint)))
		return st;
	/* the run directory lost, seen at this write (rank 0): the run stops
	 * here, its checkpoint this one in the recreated directory (before
	 * session 34 at the next step's, or under [dist] the next log point) */
	const int lost = !lost0 && t->res->out_dir_lost;
	if (t->dist && (st = trainer_dist_ckpt_stop(t, lost)))
		return st;
	if (t->dist ? t->dist_stop : lost && trainer_take_stop())
		t->stopping = 1;
	trainer_counters_mark(t);
	return KILN_OK;
}

/* After step t->step: a checkpoint every checkpoint_every steps, after the
 * run's last one (checkpoint_last, or checkpoint_every set), and when a
 * stop was requested (t->stopping; the ranks agree on a stop at log
 * points, each reads its own signal at a different moment). */
kiln_status trainer_checkpoint_point(struct trainer *t)
{
	const struct kiln_train_cfg *tc = &t->tc;
	const int64_t step = t->step, every = tc->checkpoint_every;
	int final = (tc->max_steps && step == tc->max_steps) ||
		    (t->ep + 1 == tc->epochs && t->k + 1 == t->steps_per_epoch);
	t->stopping = t->dist ? t->dist_stop : trainer_take_stop();
	if (!t->stopping && !(every && step % every == 0) &&
	    !(final && (every || tc->checkpoint_last)))
		return KILN_OK;
	/* the run's last step, followed by evaluations it records: its
	 * checkpoint now, as at any step, and again after them with their
	 * numbers (trainer_checkpoint_end), so a failure during them (a bad
	 * image, a full disk, a kill) still leaves the run's last checkpoint
	 * (session 32 had deferred it, and lost it on such a failure) */
	if (final && !t->stopping && *t->ckdir && evals_follow_last(t, step)) {
		/* (end_mark's copy of the sums is a host sync: the steady
		 * state's counters taken before it, checkpoint_at's mark after) */
		trainer_counters_take(t);
		kiln_status st = end_mark(t, CKPT_END_EVALS);
		trainer_counters_mark(t);
		if (!st && !(st = checkpoint_at(t, (t->k + 1) * t->G)))
			t->end_pos = t->pos;
		return st;
	}
	return checkpoint_at(t, (t->k + 1) * t->G);
}

/* The checkpoint about to be written (checkpoint_point's of the run's last
 * step, checkpoint_last's of an early stop) is written again after the
 * evaluations that follow (`what`): the training sums taken now
 * (end_sums), and the log interval open (an early stop's), as those
 * evaluations reuse the device's metric sums. */
static kiln_status end_mark(struct trainer *t, int what)
{
	char step[48];
	snprintf(step, sizeof step, "step %lld's checkpoint", (long long)t->step);
	kiln_status st = trainer_epoch_sums(t, KILN_OK, step, &t->end_sums);
	if (!st)
		trainer_interval_keep(t);
	t->ckpt_end = st ? 0 : what;
	return st;
}

/* After the run's last evaluations: the run's last checkpoint written
 * again (the same file, atomically replaced, on every rank as any write)
 * with their numbers (the "evaluated" section), so a resume of the
 * finished run records none of them again; not after a stop (an
 * evaluation cut short is owed, not done: the file written at the step
 * stays). */
kiln_status trainer_checkpoint_end(struct trainer *t)
{
	const struct kiln_train_result *res = t->res;
	if (!t->ckpt_end || t->stopping)
		return KILN_OK;
	const int on_val = t->have_val;
	/* an early stop's (CKPT_END_TEST) evaluation is the one that stopped
	 * the run: its numbers too, for the resumed run's result (a resume
	 * whose checkpoint lacked them ran it again, unrecorded:
	 * trainer_epoch_eval) */
	const int epoch_eval = (t->ckpt_end == CKPT_END_EVALS &&
				trainer_closing_eval(t, t->end_pos.step)) ||
			       (t->ckpt_end == CKPT_END_TEST && t->stop_early && t->tc.eval &&
				*t->ev.samples > 0);
	const struct kiln_ckpt_evaluated e = {
		.loss = *t->ev.loss, .acc = *t->ev.acc, .acc5 = *t->ev.acc5,
		.samples = epoch_eval ? *t->ev.samples : 0,
		.has_test = on_val, .test_loss = on_val ? res->test_loss : 0,
		.test_acc = on_val ? res->test_acc : 0, .test_acc5 = on_val ? res->test_acc5 : 0,
		.test_samples = on_val ? res->test_samples : 0,
	};
	t->pos = t->end_pos;
	/* (after the run's last step nothing is steady state: marked, not
	 * taken, so the evaluations before are not counted either) */
	kiln_status st = checkpoint(t, &e, t->res->checkpoint, sizeof t->res->checkpoint);
	trainer_counters_mark(t);
	return st;
}

/* A resumed run with no step left (t->no_step_left): early stopping ended
 * it (trainer_resume_finished said so), or its last step is done
 * (`final`), or [train] epochs was lowered below the checkpoint's; the
 * latter two said here, as the early stop's is (before session 33 such a
 * resume said nothing, and printed its epoch's line with "0.0 s, 0
 * samples/s"). */
static void resume_complete(struct trainer *t, int final)
{
	const struct kiln_train_cfg *tc = &t->tc;
	const int past = t->pos.epoch + 1 > tc->epochs;
	t->no_step_left = t->stop_early || final || past;
	if (t->stop_early || !t->no_step_left || t->rank)
		return;
	if (tc->max_steps && t->pos.step >= tc->max_steps)
		kiln_log(KILN_LOG_INFO, "train", "resume: the run is complete: no step is left (step %lld, [train] max_steps %lld)",
			 (long long)t->pos.step, (long long)tc->max_steps);
	else
		kiln_log(KILN_LOG_INFO, "train", "resume: the run is complete: no step is left (step %lld, epoch %lld of [train] epochs %lld)",
			 (long long)t->pos.step, (long long)t->pos.epoch + 1, (long long)tc->epochs);
}

/* A resumed run, before its first step: when its checkpoint is of the
 * run's last step (or of an early stop) and the evaluations after that
 * step are not recorded in it (no "evaluated": the run that wrote it
 * failed or was stopped during them), this run does them now, without a
 * step, and writes the checkpoint again after them, saying so, as the run
 * that wrote it would have (else each further resume recorded them
 * again).  Its sums: the checkpoint's (no step trains). */
kiln_status trainer_checkpoint_resumed(struct trainer *t)
{
	const struct kiln_train_cfg *tc = &t->tc;
	const int64_t step = t->pos.step;
	const int final = (tc->max_steps && step >= tc->max_steps) ||
			  (t->pos.epoch + 1 >= tc->epochs &&
			   t->pos.offset >= t->steps_per_epoch * t->G);
	if (!t->resumed || !*t->ckdir)
		return KILN_OK;
	resume_complete(t, final);
	/* (an early stop's "evaluated" with no numbers of the evaluation
	 * that stopped the run: a kiln before session 33 wrote it so after a
	 * kill between its two writes; that evaluation runs again,
	 * trainer_epoch_eval, and the file is written again with them) */
	/* (a best/ file's "evaluated" holds its evaluation alone, no final
	 * test: one of the run's last evaluation, or of the one that stopped
	 * it early, resumed, runs [data.val]'s final test and is written
	 * again with it, as the run's last checkpoint was) */
	const int test_owed = t->have_val && !t->done.has_test && (final || t->stop_early);
	/* (a section without the numbers of the evaluation after the run's
	 * last step: a kiln before session 39 wrote an eval_every run's so,
	 * [data.val]'s, which did not record it; it runs and is recorded
	 * now, and the file written again with them) */
	const int closing_owed = final && !t->stop_early && trainer_closing_eval(t, step) &&
				 !t->done.samples;
	if (t->evaluated && !test_owed && !closing_owed &&
	    !(t->stop_early && tc->eval && !t->done.samples))
		return KILN_OK;
	if (t->stop_early && (t->have_val || tc->eval))
		t->ckpt_end = CKPT_END_TEST;
	else if (!t->stop_early && final && evals_follow_last(t, step))
		t->ckpt_end = CKPT_END_EVALS;
	else
		return KILN_OK;
	t->end_sums = t->ep0_sums;
	t->end_pos = t->pos;
	return KILN_OK;
}

/* A stop that cut the evaluation after an epoch's steps short (t->k one
 * past the last step; every rank, eval_stop): the checkpoint at the
 * epoch's offset so far, unless this run wrote that step's already (the
 * step a run resumed at is written again: its result names a checkpoint).
 * A resumed early-stopped run takes no step: the stop cut the unrecorded
 * run again of the evaluation that stopped it (trainer_epoch_eval), and
 * the checkpoint it resumed from stays as it was (the result names it
 * already, trainer_resume_read).  Before session 34 it was written again
 * without its "evaluated" section, and a file whose section held the
 * final test's numbers (has_test) lost them: the next resume ran and
 * recorded the final test again. */
kiln_status trainer_checkpoint_stop(struct trainer *t)
{
	trainer_take_stop();
	t->stopping = 1;
	if (t->resumed && t->stop_early && t->step == t->step0)
		return KILN_OK;
	if (t->ckpt_step == t->step && t->step > t->step0)
		return KILN_OK;
	return checkpoint_at(t, t->k * t->G);
}

/* After the loop: an early stop's checkpoint_last (the evaluation that
 * stopped the run set t->pos), unless that step has one already (one
 * written before that evaluation is out of date: trainer_evaluate). */
kiln_status trainer_checkpoint_last(struct trainer *t)
{
	kiln_status st;
	if (!t->stop_early || t->stopping || !t->tc.checkpoint_last || !*t->ckdir ||
	    t->ckpt_step == t->step || t->ckpt_end) /* (ckpt_end: written at the step) */
		return KILN_OK;
	/* without [data.val] the evaluation that stopped the run is the last
	 * after its step: its numbers in this write, the only one (before
	 * session 33 the file was written again with them, and a kill
	 * between the two writes lost them for good: every resume reported
	 * null) */
	if (!t->have_val && t->tc.eval) {
		const struct kiln_ckpt_evaluated e = {
			.loss = *t->ev.loss, .acc = *t->ev.acc, .acc5 = *t->ev.acc5,
			.samples = *t->ev.samples > 0 ? *t->ev.samples : 0,
		};
		if (!(st = checkpoint(t, &e, t->res->checkpoint, sizeof t->res->checkpoint)))
			t->end_pos = t->pos;
		return st;
	}
	/* with it, written again after [data.val]'s final test, saying so
	 * (before, a resume of the early-stopped run recorded it again) */
	if (t->have_val && (st = end_mark(t, CKPT_END_TEST)))
		return st;
	if (!(st = checkpoint(t, NULL, t->res->checkpoint, sizeof t->res->checkpoint)))
		t->end_pos = t->pos;
	return st;
}


/* The state around the evaluations as the checkpoint left it: early
 * stopping's best and patience (before session 28 a resumed run started
 * them afresh and stopped elsewhere), keep_best's list (rank 0's; no
 * other rank reads it), an eval_every evaluation a stop cut short (owed:
 * the other ranks have it from rank 0, trainer_resume). */
static kiln_status evals_restore(struct trainer *t, struct kiln_ckpt *ck)
{
	struct kiln_ckpt_stopper sp;
	memset(&t->stopper, 0, sizeof t->stopper);
	/* schedule = plateau's state (session 43; a checkpoint without it, of
	 * another schedule or an older kiln, starts it afresh at lr) */
	t->plateau_have = 0;
	kiln_status st = kiln_ckpt_plateau_get(ck, &t->plateau);
	if (!st)
		t->plateau_have = 1;
	else if (st != KILN_ENOTFOUND)
		return st;
	st = kiln_ckpt_eval_owed_get(ck, &t->eval_owed);
	if (!st)
		st = kiln_ckpt_evaluated_get(ck, &t->done, &t->evaluated);
	if (st)
		return st;
	st = kiln_ckpt_stopper_get(ck, &sp);
	if (!st) {
		t->stopper.best = sp.best;
		t->stopper.bad = sp.bad;
		t->stopper.have = (int)sp.have;
	} else if (st != KILN_ENOTFOUND) {
		return st;
	}
	return trainer_best_restore(t, ck);
}

/* The bad samples replaced before the checkpoint (t->skipped0): written
 * with on_error = skip since session 36 (before, a resumed run's end
 * counted the skips after the resume alone); a checkpoint without it (an
 * older kiln's, or the run's with on_error = fail) counts from 0, said
 * when this run skips. */
static kiln_status data_skipped_restore(struct trainer *t, struct kiln_ckpt *ck)
{
	kiln_status st = kiln_ckpt_data_skipped_get(ck, &t->skipped0);
	if (st != KILN_ENOTFOUND)
		return st;
	if (t->train.ds.on_error == KILN_ON_ERROR_SKIP)
		kiln_log(KILN_LOG_INFO, "data", "resume: %s holds no count of bad samples skipped (an older kiln wrote it, or on_error was fail): the count at the end of the run is of the ones after this resume",
			 kiln_ckpt_path(ck));
	return KILN_OK;
}

/* The clip op's counts the checkpoint holds (t->counts0, seeded into the
 * device's by trainer_clip_counts_seed); a checkpoint without them (an
 * older kiln's) counts from 0 again, said. */
static kiln_status clip_counts_restore(struct trainer *t, struct kiln_ckpt *ck)
{
	kiln_status st = kiln_ckpt_clip_counts_get(ck, t->counts0);
	if (st != KILN_ENOTFOUND)
		return st;
	if (t->clip)
		kiln_log(KILN_LOG_INFO, "train", "resume: %s holds no clip counts (an older kiln wrote it): the steps skipped and clipped (metrics.jsonl's \"skipped\" and \"clipped\", the result's, and a dynamic fp16 scale's overflows, which are its skipped steps) count from this resume on",
			 kiln_ckpt_path(ck));
	return KILN_OK;
}

/* [run] fuse as the checkpoint's run resolved it: its text's value v[0..n)
 * (v NULL: the key is absent, written before a7cf504 added fusion: 0),
 * `auto` by the device its versions name (the current one's type where
 * they name none).  -1: not a value of fuse. */
static int saved_fuse(const char *v, int n, struct kiln_ckpt *ck, int cpu_now)
{
	static const char *const word[] = { "0", "false", "no", "off", "1", "true", "yes", "on" };
	if (!v)
		return 0;
	for (size_t i = 0; i < KILN_ARRAY_LEN(word); i++)
		if (strlen(word[i]) == (size_t)n && !strncasecmp(v, word[i], (size_t)n))
			return i >= 4;
	if (n != 4 || strncmp(v, "auto", 4))
		return -1;
	char *ver = NULL;
	struct kiln_kv *kv = NULL;
	int nkv = 0, cpu = cpu_now;
	if (!kiln_ckpt_read_text(ck, "versions", &ver) && !kiln_kv_parse(ver, &kv, &nkv)) {
		const struct kiln_kv *d = kiln_kv_lookup(kv, nkv, "", "device");
		if (d && d->val)
			cpu = d->val_n == 3 && !memcmp(d->val, "cpu", 3);
	}
	free(kv);
	free(ver);
	return cpu;
}

/* What [run] fuse changes in this run on the CPU, into buf[n] (NULL:
 * nothing).  [train] batch = auto chooses the batch by the plans' memory,
 * which fusing changes (a fused activation is a view, its output no
 * storage of its own), so a resume would pick another batch. */
static const char *fuse_differs(const struct trainer *t, char *buf, size_t n)
{
	if (t->tc.batch_auto) {
		snprintf(buf, n, "[train] batch = auto chooses the batch by the plans' memory, which fusing changes");
		return buf;
	}
	return kiln_plan_fuse_differs(t->ptrain, t->peval != NULL, buf, n);
}

/* [run] fuse, which kiln_ckpt_config_check leaves to the trainer (it needs
 * the device and the plan): equal as resolved (`auto` on a CPU is 1), or
 * changed on the CPU in a run that fusing changes no bit of (fuse_differs:
 * a warning saying what was checked, the run continues as it would have),
 * else refused naming the override that restores the checkpoint's
 * (session 35: a checkpoint of a kiln before session 8, whose default
 * was 0, was refused "[run] fuse is '0' in the checkpoint but 'auto'
 * here" with no word of the default's change; until f35u a model whose
 * evaluations fuse GELU, or with batch = auto, was said to continue as
 * it would have, and its evaluations differed in the last digits). */
static kiln_status resume_fuse(struct trainer *t, const char *path, const char *saved,
			       struct kiln_ckpt *ck)
{
	struct kiln_kv *kv = NULL;
	int nkv = 0;
	if (kiln_kv_parse(saved, &kv, &nkv))
		return KILN_ENOMEM;
	const struct kiln_kv *e = kiln_kv_lookup(kv, nkv, "run", "fuse");
	const int cpu = kiln_device_traits(t->dev)->type == KILN_DEVICE_CPU;
	const int was = saved_fuse(e ? e->val : NULL, e && e->val ? e->val_n : 0, ck, cpu);
	const int now = t->m->fuse;
	const char *cur = kiln_config_get(t->cfg, "run", "fuse"), *where = kiln_config_where(t->cfg, "run", "fuse");
	char sv[80];
	snprintf(sv, sizeof sv, e && e->val ? "'%.*s'" : "absent (nothing fused)", e && e->val ? e->val_n : 0,
		 e && e->val ? e->val : "");
	free(kv);
	if (was == now)
		return KILN_OK;
	char why[200], buf[400];
	snprintf(why, sizeof why, "%s", !strcmp(where, "default") ? "the default, `auto` (on for the CPU) since session 8; 0 before" : where);
	const char *differs = !cpu ? "fused epilogues on this device equal the unfused ops up to float rounding only"
			      : !t->ptrain ? "the run has no training plan to check"
			      : fuse_differs(t, buf, sizeof buf);
	if (was >= 0 && !differs) {
		kiln_log(KILN_LOG_WARN, "train", "resume: [run] fuse is %s in the checkpoint but '%s' here (%s): on the CPU this run's fused ReLUs compute the unfused bits, %s, no conv of one input channel runs NHWC and [train] batch is not `auto` (docs/config.md, fuse), so the run continues as it would have",
			 sv, cur ? cur : "", why,
			 t->peval ? "its evaluations fuse no GELU" : "it evaluates nothing (where a GELU would be fused)");
		return KILN_OK;
	}
	char hint[80] = "Restore it"; /* (a value no kiln writes: -1) */
	if (was >= 0)
		snprintf(hint, sizeof hint, "Resume with run.fuse=%d (what the checkpoint's run did)", was);
	return kiln_error(KILN_ECONFIG, "cannot resume from %s with a changed config: [run] fuse is %s in the checkpoint but '%s' here (%s), and %s. %s, or start a new run in another [run] out_dir (docs/checkpoints.md)",
			  path, sv, cur ? cur : "", why, differs ? differs : "that value is none a kiln writes", hint);
}

/* Rank 0 (or the only process): find, verify and load the newest
 * checkpoint of t->ckdir into t->m and t->pos.  *found = 0 when there is
 * none (a fresh start). */
kiln_status trainer_resume_read(struct trainer *t, int *found)
{
	const int64_t samples = t->train.len;
	struct kiln_ckpt *ck = NULL;
	struct kiln_ckpt_trainer tr;
	char *saved = NULL, *defaults = NULL;
	kiln_status st = kiln_ckpt_newest(t->ckdir, &ck);
	*found = 0;
	if (st)
		return st;
	if (!ck) {
		kiln_log(KILN_LOG_INFO, "train", "resume: no checkpoint in %s; starting from the beginning",
			 t->ckdir);
		return KILN_OK;
	}
	const char *path = kiln_ckpt_path(ck);
	if (!(defaults = kiln_ckpt_config_defaults(t->cfg, t->reg))) {
		st = KILN_EIO;
		goto out;
	}
	if ((st = kiln_ckpt_read_text(ck, "config", &saved)) ||
	    (st = kiln_ckpt_config_check(path, saved, t->config_text, NULL, defaults, t->cfg)) ||
	    (st = resume_fuse(t, path, saved, ck)) ||
	    (st = kiln_ckpt_trainer_get(ck, &tr)))
		goto out;
	if (tr.samples != samples) {
		st = kiln_error(KILN_EDATA, "cannot resume from %s: it was taken with %lld training samples per epoch, [data] now has %lld (the data set changed)",
				path, (long long)tr.samples, (long long)samples);
		goto out;
	}
	/* the checkpoint's offset in this run's global batch, and what
	 * another batch, accumulate or world size changes */
	if ((st = trainer_resume_batch(t, path, saved, &tr)))
		goto out;
	/* (stages on ranks: each rank loads its stage, kiln_dist_pipe_resume;
	 * ZeRO-1's model has no whole optimizer state: the rest here, the
	 * slots in kiln_dist_zero_init) */
	const int sharded = t->m->state_sharded;
	if ((kiln_dist_pipe_resumes(t->dist) || sharded) &&
	    strlen(path) >= sizeof t->resume_file) {
		st = kiln_error(KILN_ECONFIG, "%s: path too long to resume %s", path,
				sharded ? "the optimizer state's shards" : "per stage");
		goto out;
	}
	if (kiln_dist_pipe_resumes(t->dist) || sharded)
		snprintf(t->resume_file, sizeof t->resume_file, "%s", path);
	if (!kiln_dist_pipe_resumes(t->dist) &&
	    (st = kiln_ckpt_load_model(ck, t->m, t->compute, KILN_CKPT_LOAD_ALL)))
		goto out;
	t->pos = tr;
	t->ckpt_step = tr.step;
	/* a resume within an epoch: its training sums so far */
	memset(&t->ep0_sums, 0, sizeof t->ep0_sums);
	int have_ep = 1;
	if (tr.offset && (st = kiln_ckpt_epoch_get(ck, &t->ep0_sums))) {
		if (st != KILN_ENOTFOUND)
			goto out;
		st = KILN_OK;
		have_ep = 0;
		kiln_log(KILN_LOG_INFO, "train", "resume: %s holds no epoch sums (an older kiln wrote it): epoch %lld's train loss and accuracy will average the steps after the resume only",
			 path, (long long)tr.epoch + 1);
	}
	/* ... and the log interval open at its step (before the sums are
	 * scaled to another world size: the interval is checked against
	 * them as written) */
	if (tr.offset && (st = trainer_interval_read(t, ck, &tr, have_ep ? &t->ep0_sums : NULL)))
		goto out;
	epoch_sums_rescale(t, &tr);
	if ((st = evals_restore(t, ck)) || (st = clip_counts_restore(t, ck)) ||
	    (st = data_skipped_restore(t, ck)))
		goto out;
	*found = 1;
	/* the run's newest checkpoint until it writes one: what a resume that
	 * has nothing left to do (past its last epoch, or early-stopped)
	 * reports as its "checkpoint".  Rank 0's alone, as the checkpoints
	 * it writes: a stage's rank reading its own (kiln_dist_pipe_resumes)
	 * names none, as the ranks rank 0 broadcast to (trainer_resume; before
	 * session 44 it kept this name past later checkpoints, named_step
	 * following them, and printed it as its "trained weights") */
	if (!t->rank) {
		snprintf(t->res->checkpoint, sizeof t->res->checkpoint, "%s", path);
		t->named_step = tr.step;
	}
	kiln_log(KILN_LOG_INFO, "train", "resuming from %s: epoch %lld, step %lld, sample %lld of the epoch",
		 path, (long long)tr.epoch + 1, (long long)tr.step, (long long)tr.offset);
	if (*t->resume_file) { /* (kept for the per-stage or sharded load) */
		t->resume_ck = ck;
		ck = NULL;
	}
out:
	free(saved);
	free(defaults);
	kiln_ckpt_close(ck);
	return st;
}

/* Every rank, after a resume (the stopper is rank 0's, trainer_resume): a
 * checkpoint of a run that early stopping ended (its count at
 * early_stop_patience: checkpoint_last's after the stop) finishes the run
 * as a resume past its last epoch does: the resumed epoch's line and the
 * early stop's, no step, no checkpoint (before session 31 nothing set
 * t->stop_early, and each --resume trained on to the next evaluation,
 * which stopped it again with one more checkpoint). */
void trainer_resume_finished(struct trainer *t)
{
	const int64_t patience = t->tc.early_stop_patience;
	t->stop_early = patience && t->stopper.bad >= patience;
	if (t->stop_early && !t->rank)
		kiln_log(KILN_LOG_INFO, "train", "resume: the run stopped early at step %lld (%lld evaluations without improvement, early_stop_patience %lld): no step is left",
			 (long long)t->pos.step, (long long)t->stopper.bad, (long long)patience);
}
