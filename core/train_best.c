/* core/train_best.c - [train] keep_best: the K best evaluations'
 * checkpoints in ckdir/best, chosen after each evaluation
 * (trainer_keep_best), their list in every checkpoint's "best" section
 * (trainer_best_meta), and the list and the files restored at a resume
 * (trainer_best_restore).  Rank 0 chooses for every rank; the writes are
 * train_ckpt.c's (trainer_ckpt_write).  See train.h. */
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int best_by_step(const void *a, const void *b)
{
	const struct kiln_ckpt_best *x = a, *y = b;
	return (x->step > y->step) - (x->step < y->step);
}

/* keep_best's list as the "best" section holds it (meta->best, n_best;
 * malloc'd into *out, the caller frees), with entry i (-1: none) taken
 * by value v of step t->pos.step: a best/ checkpoint holds its own entry
 * (best_restore reads it from there when a resume's checkpoint has no
 * list).  In step order, not t->best's: a resumed run's slots hold the
 * entries in another order (best_restore takes them by step), and its
 * checkpoints must be the uninterrupted run's byte for byte.  Without
 * keep_best: none. */
kiln_status trainer_best_meta(const struct trainer *t, int i, double v,
			     struct kiln_ckpt_meta *meta, struct kiln_ckpt_best **out)
{
	const int n = i == t->n_best ? t->n_best + 1 : t->n_best;
	*out = NULL;
	if (!t->tc.keep_best)
		return KILN_OK;
	kiln_status st = kiln_dist_ckpt_fault_at(t->dist, "best", "keep_best's list");
	if (st)
		return st;
	if (!(*out = calloc((size_t)t->tc.keep_best, sizeof **out)))
		return kiln_error(KILN_ENOMEM, "keep_best's list: out of memory");
	for (int j = 0; j < t->n_best; j++)
		(*out)[j] = (struct kiln_ckpt_best){ t->best[j].v, t->best[j].step };
	if (i >= 0)
		(*out)[i] = (struct kiln_ckpt_best){ v, t->pos.step };
	if (n > 1)
		qsort(*out, (size_t)n, sizeof **out, best_by_step);
	meta->best = *out;
	meta->n_best = n;
	return KILN_OK;
}

/* Rank 0: the ckpt-*.kiln.tmp in ckdir/best that a best checkpoint's write
 * killed mid-way left, removed (kiln_ckpt_prune with keep 0 deletes only
 * temporaries; the lock keeps other runs out).  Before session 33 only
 * ckdir's were, and best/'s stayed for good, a model's size each. */
void trainer_best_prune_tmp(const struct trainer *t)
{
	char dir[4300];
	if (!t->tc.keep_best)
		return;
	snprintf(dir, sizeof dir, "%s/best", t->ckdir);
	kiln_ckpt_prune(dir, 0, t->pos.step);
}

/* keep_best's place for an entry of value v (higher is better): the
 * entry of t->best it takes (a free one, or the worst, which it
 * displaces), -1 when it is not among the K best.  Ties keep the earlier;
 * a non-finite value is below every finite one (trainer_metric_beats:
 * an entry an older kiln listed, best_take), and ties with another. */
static int best_entry(const struct trainer *t, double v)
{
	int worst = 0;
	if (t->n_best < t->tc.keep_best)
		return t->n_best;
	for (int i = 1; i < t->n_best; i++)
		if (trainer_metric_beats(t->best[worst].v, t->best[i].v) ||
		    (!trainer_metric_beats(t->best[i].v, t->best[worst].v) &&
		     t->best[i].step > t->best[worst].step))
			worst = i;
	return trainer_metric_beats(v, t->best[worst].v) ? worst : -1;
}

/* keep_best's choice for an evaluation: best_entry's for its value, none
 * for a value that is not finite (a diverged evaluation's NaN loss is
 * never among the best; before session 39 it took the first entry and,
 * as nothing compares above NaN, kept it for good).  Rank 0's goes to
 * every rank in the sum that agrees on the evaluation's outcome
 * (train_eval.c eval_agree: the values agree, but a last bit of
 * difference must not split the ranks, as the write is a collective;
 * before session 42 a sum of its own here, which a rank whose
 * evaluation had failed never joined). */
int trainer_best_choice(const struct trainer *t, double loss, double acc)
{
	const double v = t->tc.best_on_loss ? -loss : acc;
	if (!t->tc.keep_best || !*t->ckdir)
		return -1;
	return isfinite(v) ? best_entry(t, v) : -1;
}

/* Entry i of t->best now the checkpoint at path (rank 0's; "" on the
 * others) of value v: the one it displaces deleted, logged (rank 0). */
static void best_done(struct trainer *t, int i, double v, const char *path)
{
	const int on_loss = t->tc.best_on_loss;
	struct best *b = &t->best[i];
	if (i == t->n_best)
		t->n_best++;
	else if (!t->rank && strcmp(b->path, path))
		unlink(b->path);
	b->v = v;
	b->step = t->pos.step;
	snprintf(b->path, sizeof b->path, "%s", path);
	if (t->rank)
		return;
	kiln_log(KILN_LOG_INFO, "train", "best %s %.4f at step %lld: %s", on_loss ? "loss" : "accuracy",
		 on_loss ? -v : v, (long long)t->pos.step, path);
	trainer_jsonl(t, "{s:s, s:I, s:o, s:o}", "event", "best", "step", (json_int_t)t->pos.step,
		      on_loss ? "loss" : "acc", trainer_json_real(on_loss ? -v : v), "path",
		      trainer_json_text(path));
}

/* keep_best: after an evaluation, checkpoint the state as entry i of the
 * K best by best_metric so far (ckdir/best/ckpt-<step>.kiln; rank 0's
 * trainer_best_choice, -1: not among them), deleting the one it
 * displaces.  Every rank (the write is trainer_ckpt_write's: streamed per
 * stage on a pipeline's ranks, as the periodic checkpoints). */
kiln_status trainer_keep_best(struct trainer *t, double loss, double acc, int i)
{
	if (!t->tc.keep_best || !*t->ckdir || i < 0)
		return KILN_OK;
	const double v = t->tc.best_on_loss ? -loss : acc;
	char dir[4300], path[4200] = "";
	/* the evaluation after its step is done: its numbers (an epoch's
	 * evaluation, at the epoch's end, would otherwise run and be recorded
	 * again by a resume from the file, and counted twice by early
	 * stopping and keep_best; an eval_every one's are the result's when
	 * no step is left).  No final test yet (has_test 0: a resume from the
	 * run's last evaluation runs it, trainer_checkpoint_resumed). */
	const struct kiln_ckpt_evaluated done = { .loss = loss, .acc = acc, .acc5 = *t->ev.acc5,
						  .samples = *t->ev.samples };
	struct kiln_ckpt_meta meta = { .config = t->config_text, .versions = t->versions,
				       .trainer = t->pos, .evaluated = &done };
	struct kiln_ckpt_best *best;
	struct trainer_ckpt_resume r;
	kiln_status st;
	snprintf(dir, sizeof dir, "%s/best", t->ckdir);
	/* the epoch's sums, early stopping's state (after this evaluation:
	 * trainer_evaluate updates it first) and the clip op's counts as of
	 * this step, as a periodic checkpoint's: a resume from a best/ file
	 * (copied into checkpoints/) goes on as the uninterrupted run did
	 * (before session 34 best/ files had no "clip_counts", before session
	 * 35 no "epoch", "stopper" or "evaluated") */
	/* (its time set aside as a periodic checkpoint's: not training) */
	const double t0 = kiln_now_s();
	/* (the list first: its allocation's failure joins the ranks' first
	 * sum, as a periodic checkpoint's) */
	st = trainer_best_meta(t, i, v, &meta, &best);
	if ((st = trainer_ckpt_resume_meta(t, st, &r, &meta))) {
		free(best);
		return st;
	}
	st = trainer_ckpt_write(t, dir, &meta, path, sizeof path);
	free(best);
	trainer_set_aside(t, t0);
	if (st)
		return st;
	if (!t->rank)
		trainer_best_prune_tmp(t);
	best_done(t, i, v, path);
	return KILN_OK;
}

/* ckdir/best/ckpt-<step>.kiln into path. */
static void best_path(const struct trainer *t, int64_t step, char *path, size_t n)
{
	/* (ckdir leaves room for a checkpoint's name: trainer_ckdir_check) */
	snprintf(path, n, "%.4150s/best/ckpt-%lld.kiln", t->ckdir, (long long)step);
}

/* The step of a best/ file name ckpt-<step>.kiln as kiln writes it; -1
 * for any other name (a .tmp, a leading zero, a sign or a space). */
static int64_t best_name_step(const char *name)
{
	int tmp = 0;
	const int64_t step = kiln_ckpt_name_step(name, &tmp);
	return step < 0 || tmp ? -1 : step;
}

/* A resume's keep_best entry (v, step) into t->best as its evaluation put
 * it there (entries taken in step order, best_entry's ties alike); the
 * file of the entry it displaces, or its own when it is not among the K
 * best, deleted.  A value that is not finite (a kiln before session 39
 * listed a NaN loss) takes a free entry and ranks below every finite
 * one: the first finite evaluation that finds the list full displaces
 * it.  A file that holds another step than its name's is not the
 * entry's (a copy or a rename; session 39): not taken, nor deleted
 * (best_prune names it). */
static void best_take(struct trainer *t, double v, int64_t step)
{
	char path[4200];
	best_path(t, step, path, sizeof path);
	if (kiln_ckpt_misnamed(path, step, KILN_LOG_DEBUG, "keep_best"))
		return;
	const int i = best_entry(t, v);
	if (i < 0) {
		kiln_log(KILN_LOG_INFO, "train", "resume: %s is not among keep_best's %lld: deleted",
			 path, (long long)t->tc.keep_best);
		unlink(path);
		return;
	}
	if (i < t->n_best)
		unlink(t->best[i].path);
	else
		t->n_best++;
	t->best[i].v = v;
	t->best[i].step = step;
	snprintf(t->best[i].path, sizeof t->best[i].path, "%s", path);
}

/* A checkpoint without a keep_best list (an older kiln's): the values the
 * files of ckdir/best up to step `upto` hold of themselves (*e, *n:
 * malloc'd), *unknown the files that hold none (an older kiln's); a file
 * holding another step than its name's is left out (named in the log). */
static void best_scan(struct trainer *t, int64_t upto, struct kiln_ckpt_best **e, int64_t *n,
		      int *unknown)
{
	char dir[4300], path[4600];
	struct dirent *d;
	int64_t cap = 0;
	*e = NULL, *n = 0, *unknown = 0;
	snprintf(dir, sizeof dir, "%s/best", t->ckdir);
	DIR *dp = opendir(dir);
	while (dp && (d = readdir(dp))) {
		const int64_t step = best_name_step(d->d_name);
		struct kiln_ckpt *ck = NULL;
		struct kiln_ckpt_best *own = NULL, *grown;
		int64_t m = 0, j = 0;
		if (step < 0 || step > upto)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, d->d_name);
		if (kiln_ckpt_misnamed(path, step, KILN_LOG_WARN, "keep_best"))
			continue;
		if (kiln_ckpt_open(path, &ck) || kiln_ckpt_best_get(ck, &own, &m))
			m = 0;
		kiln_ckpt_close(ck);
		while (j < m && own[j].step != step)
			j++;
		if (j < m && *n == cap &&
		    (grown = realloc(*e, sizeof **e * (size_t)(2 * cap + 4)))) {
			*e = grown;
			cap = 2 * cap + 4;
		}
		if (j < m && *n < cap)
			(*e)[(*n)++] = own[j];
		else
			++*unknown; /* (or out of memory: not counted) */
		free(own);
	}
	if (dp)
		closedir(dp);
}

/* Files of ckdir/best not in t->best deleted: every one when the
 * checkpoint had the list (written after it, its evaluation run again;
 * or left by a kiln before session 31, which did not resume the list),
 * else (listed 0) those after step `upto` alone. */
static void best_prune(struct trainer *t, int listed, int64_t upto)
{
	char dir[4300], path[4600];
	struct dirent *d;
	snprintf(dir, sizeof dir, "%s/best", t->ckdir);
	DIR *dp = opendir(dir);
	while (dp && (d = readdir(dp))) {
		const int64_t step = best_name_step(d->d_name);
		int kept = 0;
		for (int i = 0; i < t->n_best; i++)
			kept |= t->best[i].step == step;
		if (step < 0 || kept || (!listed && step <= upto))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, d->d_name);
		if (kiln_ckpt_misnamed(path, step, KILN_LOG_WARN, "keep_best"))
			continue;
		kiln_log(KILN_LOG_INFO, "train", "resume: %s is not among keep_best's %lld of the checkpoint: deleted",
			 path, (long long)t->tc.keep_best);
		unlink(path);
	}
	if (dp)
		closedir(dp);
}

/* keep_best's list as the resumed checkpoint left it (its "best"
 * section; before session 31 it was not saved: a resumed run started it
 * empty and kept up to K more files, logging worse evaluations as
 * "best").  A checkpoint without one: the list rebuilt from the values
 * ckdir/best's files hold of themselves, or started empty, logged. */
kiln_status trainer_best_restore(struct trainer *t, struct kiln_ckpt *ck)
{
	struct kiln_ckpt_best *e = NULL;
	int64_t n = 0;
	int unknown = 0;
	char path[4200];
	t->n_best = 0;
	/* (rank 0 chooses for every rank; stages on ranks with one pipe read
	 * the checkpoint on each rank, and only rank 0 touches best/) */
	if (!t->tc.keep_best || !*t->ckdir || t->rank)
		return KILN_OK;
	const int64_t upto = kiln_ckpt_step(ck);
	kiln_status st = kiln_ckpt_best_get(ck, &e, &n);
	const int listed = st != KILN_ENOTFOUND;
	if (listed && st)
		return st;
	if (!listed)
		best_scan(t, upto, &e, &n, &unknown);
	if (!listed)
		kiln_log(KILN_LOG_INFO, "train", "resume: %s holds no keep_best list (an older kiln wrote it): rebuilt from %lld file(s) of %s/best that hold their value%s",
			 kiln_ckpt_path(ck), (long long)n, t->ckdir,
			 unknown ? "; the others (an older kiln's) are kept, not counted" : "");
	if (n > 1)
		qsort(e, (size_t)n, sizeof *e, best_by_step);
	for (int64_t i = 0; i < n; i++) {
		best_path(t, e[i].step, path, sizeof path);
		if (access(path, F_OK))
			kiln_log(KILN_LOG_WARN, "train", "resume: keep_best's %s is gone: not counted",
				 path);
		else
			best_take(t, e[i].v, e[i].step);
	}
	free(e);
	best_prune(t, listed, upto);
	return KILN_OK;
}
