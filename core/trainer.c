/* core/trainer.c - the training loop behind `kiln train`: epochs of steps,
 * each followed by its log point, evaluation and checkpoint, as the calls
 * train.h lists (setup, step, logging, evaluation, checkpoints and the
 * distributed glue each live in their own file). */
#include "train.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Set from signal handlers: a lock-free atomic is async-signal-safe. */
static atomic_int stop_flag;
static const char *_Atomic stop_cause; /* the last request's cause (NULL: the user's) */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "kiln_train_request_stop needs a lock-free int");
_Static_assert(ATOMIC_POINTER_LOCK_FREE == 2, "kiln_train_request_stop_cause needs a lock-free pointer");

void kiln_train_request_stop(void)
{
	atomic_store(&stop_cause, NULL); /* (an earlier run's cause is not this stop's) */
	atomic_store(&stop_flag, 1);
}

void kiln_train_request_stop_cause(const char *cause)
{
	atomic_store(&stop_cause, cause);
	atomic_store(&stop_flag, 1);
}

const char *trainer_stop_cause(void)
{
	return atomic_load(&stop_cause);
}

int trainer_take_stop(void)
{
	return atomic_exchange(&stop_flag, 0);
}

int kiln_stop_pending(void)
{
	return atomic_load(&stop_flag);
}

/* The program's error hook (kiln_set_error_hook): fn and user under one
 * mutex, so that a call gets the pair of one kiln_set_error_hook, never
 * one's fn with another's user (before session 37 two plain globals,
 * which a reset on one thread while a run failed on another could mix, or
 * leave a NULL user under the new fn).  Each call in progress is listed
 * (its record on its own stack) with the generation of the pair it took,
 * so that kiln_set_error_hook returns only once no other thread is still
 * in a hook it replaced: the program may then free the old user.  The
 * calls are made outside the mutex (a hook may print, take seconds, or
 * set the hook itself; its own thread's calls are not waited for). */
struct hook_call {
	uint64_t gen;
	pthread_t self;
	struct hook_call *next;
};
static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_left = PTHREAD_COND_INITIALIZER;
static kiln_error_hook_fn error_fn;
static void *error_user;
static uint64_t hook_gen;        /* kiln_set_error_hook calls so far */
static struct hook_call *in_hook; /* the calls in progress */

/* fork(): the child has only the forking thread, so the other threads'
 * calls in progress are dropped there (their hooks never end in it: its
 * kiln_set_error_hook waited for ever, session 37's review), and the
 * mutex is taken around the fork so that the child's is never held by a
 * thread it lacks. */
static void hook_fork_prepare(void)
{
	pthread_mutex_lock(&hook_mu);
}

static void hook_fork_parent(void)
{
	pthread_mutex_unlock(&hook_mu);
}

static void hook_fork_child(void)
{
	struct hook_call **p = &in_hook;
	while (*p)
		if (pthread_equal((*p)->self, pthread_self()))
			p = &(*p)->next;
		else
			*p = (*p)->next;
	pthread_cond_init(&hook_left, NULL);
	pthread_mutex_unlock(&hook_mu);
}

static pthread_once_t hook_fork_once = PTHREAD_ONCE_INIT;

static void hook_fork_register(void)
{
	pthread_atfork(hook_fork_prepare, hook_fork_parent, hook_fork_child);
}

/* Whether another thread is still in a hook of a generation before gen;
 * *mine: whether this thread is in a hook itself. */
static int hook_older_running(uint64_t gen, int *mine)
{
	int other = 0;
	*mine = 0;
	for (const struct hook_call *c = in_hook; c; c = c->next)
		if (pthread_equal(c->self, pthread_self()))
			*mine = 1;
		else if (c->gen < gen)
			other = 1;
	return other;
}

void kiln_set_error_hook(kiln_error_hook_fn fn, void *user)
{
	int mine;
	pthread_once(&hook_fork_once, hook_fork_register);
	pthread_mutex_lock(&hook_mu);
	error_fn = fn;
	error_user = user;
	const uint64_t gen = ++hook_gen;
	/* set from inside a hook, it does not wait: two hooks on two threads
	 * each setting the hook would wait for each other for ever */
	while (hook_older_running(gen, &mine) && !mine)
		pthread_cond_wait(&hook_left, &hook_mu);
	pthread_mutex_unlock(&hook_mu);
}

/* kiln_train_failed_own's answer: the last failure told on this thread */
static _Thread_local int told_own = 1;

int kiln_train_failed_own(void) { return told_own; }

kiln_status trainer_error_told(kiln_status st) { return trainer_error_told_own(st, 1); }

kiln_status trainer_error_told_own(kiln_status st, int own)
{
	if (!st)
		return st;
	told_own = own;
	pthread_once(&hook_fork_once, hook_fork_register);
	pthread_mutex_lock(&hook_mu);
	const kiln_error_hook_fn fn = error_fn;
	void *const user = error_user;
	struct hook_call me = { hook_gen, pthread_self(), in_hook };
	if (fn)
		in_hook = &me;
	pthread_mutex_unlock(&hook_mu);
	if (!fn)
		return st;
	fn(user, st, kiln_last_error());
	pthread_mutex_lock(&hook_mu);
	struct hook_call **p = &in_hook;
	while (*p && *p != &me)
		p = &(*p)->next;
	if (*p) /* (a child forked in the hook: its list starts anew) */
		*p = me.next;
	pthread_cond_broadcast(&hook_left);
	pthread_mutex_unlock(&hook_mu);
	return st;
}

kiln_grad_hook_fn trainer_grad_fn;
void *trainer_grad_user;

void kiln_set_grad_hook(kiln_grad_hook_fn fn, void *user)
{
	trainer_grad_fn = fn;
	trainer_grad_user = user;
}

/* Another epoch: within [train] epochs and max_steps, no early stop.  A
 * resumed epoch always runs: with its steps done, or past epochs or
 * max_steps (both may be lowered on resume), or the run stopped early
 * already (trainer_resume_finished), it still has its line and evaluation
 * left, the checkpoint's numbers. */
static int epoch_runs(const struct trainer *t)
{
	const int64_t max_steps = t->tc.max_steps;
	if (t->ep == t->ep0 && t->off0 > 0)
		return 1;
	return t->ep < t->tc.epochs && !t->stop_early && (!max_steps || t->step < max_steps);
}

static int step_runs(const struct trainer *t)
{
	return t->k < t->steps_per_epoch && t->ep < t->tc.epochs &&
	       (!t->tc.max_steps || t->step < t->tc.max_steps);
}

/* An epoch's order: the permutation drawn from (seed, epoch), this rank's
 * share of it from where the epoch starts (a resumed one at the
 * checkpoint's offset), handed to the loader workers. */
static kiln_status epoch_begin(struct trainer *t)
{
	const int64_t ep = t->ep, n = t->train.len;
	t->ep_t0 = kiln_now_s();
	t->ep_aside_s = 0;
	t->ep_loss = t->ep_correct = 0;
	t->carry_loss = t->carry_correct = 0;
	t->since = t->since_seeded = t->ep_samples = 0;
	kiln_status st;
	if (ep == t->ep0 && t->off0 > 0) { /* resumed: the sums up to the checkpoint */
		t->ep_loss = t->ep0_sums.loss;
		t->ep_correct = t->ep0_sums.correct;
		t->ep_samples = t->ep0_sums.samples;
		/* ... of which the log interval open there goes on */
		if ((st = trainer_interval_seed(t)))
			return st;
	}
	if (t->data.shuffle)
		kiln_rng_permutation((uint64_t)t->run.seed, (uint64_t)ep, t->perm, n);
	else
		for (int64_t i = 0; i < n; i++)
			t->perm[i] = i;
	int64_t start = ep == t->ep0 ? t->off0 : 0;
	t->k0 = start / t->G;
	/* the loader's epoch: the steps this epoch will take */
	int64_t ep_steps = t->steps_per_epoch - t->k0, left = t->tc.max_steps - t->step;
	if (t->tc.max_steps && left < ep_steps)
		ep_steps = left > 0 ? left : 0;
	/* this rank's share of the epoch's order from `start`: interleaved,
	 * equal length, drop_last */
	kiln_shard(t->perm, n, start, t->drank, t->world, 1, t->order);
	t->res_x = NULL; /* resident: evaluation reused the slots; load anew */
	t->epoch = ep;
	if (t->train.loader)
		return kiln_loader_start(t->train.loader, ep, t->order, ep_steps * t->acc * t->B,
					 t->B, 0);
	return KILN_OK;
}

/* An epoch's end: its line, with its evaluation.  A resume with no step
 * left prints none unless an evaluation ran now (it would say "0.0 s, 0
 * samples/s" and repeat the checkpoint's numbers); its numbers still go
 * to the result. */
static kiln_status epoch_end(struct trainer *t)
{
	char msg[300];
	const int64_t evals = t->evals;
	kiln_status st = trainer_epoch_summary(t, msg, sizeof msg);
	if (!st)
		st = trainer_epoch_eval(t, msg, sizeof msg);
	if (!st && t->eval_cut) /* a stop: the resumed run gives the epoch its line */
		return trainer_checkpoint_stop(t);
	if (!st)
		trainer_epoch_report(t, t->no_step_left && t->step == t->step0 &&
					t->evals == evals ? NULL : msg);
	return st;
}

static int eval_point(const struct trainer *t)
{
	return t->tc.eval && t->tc.eval_every && t->step % t->tc.eval_every == 0;
}

/* The eval_every evaluation after step t->step (an evaluation point).
 * Cut short by a stop, it is owed: the stop's checkpoint says so, and the
 * resumed run runs it first (eval_owed_run). */
static kiln_status eval_at_point(struct trainer *t)
{
	kiln_status st = trainer_evaluate(t, (t->k + 1) * t->G, 1, TRAINER_EVAL_POINT);
	t->eval_owed = !st && t->eval_cut;
	return st;
}

/* A resumed run's first act when its checkpoint owes the eval_every
 * evaluation of its step (t->eval_owed, the checkpoint's "eval_owed"):
 * that evaluation, recorded, so early stopping and keep_best see every
 * evaluation the uninterrupted run did (before session 31 it was dropped
 * for good: a resumed run stopped early 7 steps after the uninterrupted
 * one, with other weights), as epoch_end runs a cut closing one again.
 * Cut again, the stop's checkpoint (of the same step) owes it again.
 * Done, the checkpoint of this step is out of date (it owes it, its
 * stopper is older): an early stop now writes checkpoint_last's again. */
static kiln_status eval_owed_run(struct trainer *t)
{
	kiln_status st;
	t->k = t->k0; /* (the stop's checkpoint is at the epoch's offset k0 x G) */
	if (!t->tc.eval) {
		kiln_log(KILN_LOG_WARN, "train", "resume: the checkpoint owes the evaluation after step %lld, which [train] eval = 0 does not run",
			 (long long)t->step);
		t->eval_owed = 0;
		return KILN_OK;
	}
	kiln_log(KILN_LOG_INFO, "train", "resume: the evaluation after step %lld, which a stop cut short, first",
		 (long long)t->step);
	/* work a stop now ends with a checkpoint (of this step, again), as
	 * after a step: the caller hears of it as of a step (`kiln train`
	 * said "nothing to checkpoint; the process ends within 5 s" and then
	 * wrote one, racing its 5 s timer; session 32) */
	trainer_progress(t, t->k0, NULL);
	if ((st = trainer_evaluate(t, t->off0, 1, TRAINER_EVAL_POINT)))
		return st;
	if (t->eval_cut)
		return trainer_checkpoint_stop(t);
	t->eval_owed = 0;
	t->ckpt_step = -1;
	return KILN_OK;
}

/* kiln_train_run into the library's own result (res: whole, its size
 * this library's). */
static kiln_status train_run(const struct kiln_config *cfg, const struct kiln_registry *reg,
			     const struct kiln_train_cfg *tc, kiln_progress_fn progress, void *user,
			     struct kiln_train_result *res)
{
	struct trainer T = { .progress = progress, .user = user }, *t = &T;
	kiln_train_cfg_warn_unread(cfg, tc);
	kiln_status st = trainer_open(t, cfg, reg, tc, 1, res);
	if (!st)
		st = trainer_checkpoint_resumed(t);
	for (t->ep = t->ep0; !st && epoch_runs(t); t->ep++) {
		st = epoch_begin(t);
		if (!st && t->eval_owed)
			st = eval_owed_run(t);
		for (t->k = t->k0; !st && !t->stop_early && !t->stopping && step_runs(t); t->k++) {
			if ((st = trainer_step(t)) || (st = trainer_log_point(t)))
				break;
			if (t->prof)
				kiln_profile_step(t->prof, 0);
			if (eval_point(t) && (st = eval_at_point(t)))
				break;
			if (t->stop_early || (st = trainer_checkpoint_point(t)) || t->stopping)
				break;
		}
		if (!st && !t->stopping)
			st = epoch_end(t);
		if (!st && t->stopping) {
			kiln_log(KILN_LOG_INFO, "train", "stopped on request after step %lld",
				 (long long)t->step);
			break;
		}
	}
	if (!st)
		st = trainer_checkpoint_last(t);
	if (!st && !(st = trainer_final_test(t)) && !(st = trainer_checkpoint_end(t)))
		st = trainer_finish(t);
	/* stages on ranks: a receive that failed on the stage's stream's
	 * worker came back from whichever sync came next, in the
	 * communicator's words alone; the pipe names it */
	st = kiln_pipe_explain(t->pipe, st);
	return trainer_close(t, st);
}

/* The run into a result of this library's size, copied into the caller's
 * as far as its size goes (kiln/kiln.h, struct kiln_train_result). */
kiln_status kiln_train_run(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   const struct kiln_train_cfg *tc, kiln_progress_fn progress, void *user,
			   struct kiln_train_result *res)
{
	/* a failure before train_run told the program's hook here, as
	 * trainer_close tells a later one (before session 37 not at all) */
	if (!cfg || !reg || !tc)
		return trainer_error_told(
			kiln_null_arg("kiln_train_run", !cfg ? "cfg" : !reg ? "reg" : "tc"));
	struct kiln_train_result full = { 0 };
	struct kiln_train_cfg tc_full;
	kiln_status st = trainer_result_check(res, "kiln_train_run");
	if (st)
		return trainer_error_told(st);
	/* tc as this library's struct (kiln/kiln.h, struct kiln_train_cfg) */
	if ((st = kiln_train_cfg_in(cfg, tc, "kiln_train_run", &tc_full)))
		trainer_error_told(st);
	else
		st = train_run(cfg, reg, &tc_full, progress, user, &full);
	trainer_result_out(res, &full);
	return st;
}

kiln_status kiln_train(const struct kiln_config *cfg, const struct kiln_registry *reg,
		       kiln_progress_fn progress, void *user, struct kiln_train_result *res)
{
	if (!cfg || !reg)
		return trainer_error_told(kiln_null_arg("kiln_train", !cfg ? "cfg" : "reg"));
	struct kiln_train_cfg tc;
	kiln_status st = trainer_result_check(res, "kiln_train");
	if (st)
		return trainer_error_told(st);
	if ((st = kiln_train_cfg_fill(cfg, reg, &tc))) {
		/* as a run that fails later leaves it (-1: no evaluation ran,
		 * no resume); before session 35 all zeros, a test loss of 0 */
		struct kiln_train_result none;
		trainer_result_none(&none);
		trainer_result_out(res, &none);
		return trainer_error_told(st);
	}
	return kiln_train_run(cfg, reg, &tc, progress, user, res);
}
