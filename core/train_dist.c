/* core/train_dist.c - the trainer's data-parallel glue (core/dist.c does
 * the collectives): rank 0's resume reaching the other ranks, the ranks'
 * metric sums and stop requests at a log point, and the [dist] timing
 * events and summary.  Every function here is called only with t->dist
 * set, or behaves as for one process without it.  See train.h. */
#include "train.h"
#include "pipeline.h"

#include <stdio.h>

/* What rank 0 tells the other ranks about resuming: they never open the
 * checkpoint (their out_dir need not be shared); the training state
 * itself follows in kiln_dist_broadcast_state. */
struct resume_msg {
	int32_t status;  /* rank 0's kiln_status */
	int32_t found;
	struct kiln_ckpt_trainer tr;
	struct kiln_ckpt_epoch sums; /* the resumed epoch's training sums */
	struct kiln_ckpt_interval iv; /* the log interval open (its entries follow) */
	struct stopper stopper;      /* early stopping's state */
	struct kiln_plateau plateau; /* schedule = plateau's (plateau_have) */
	int32_t plateau_have;
	int64_t G_ckpt;              /* the checkpoint's global batch (its rate's lr_scale) */
	int32_t eval_owed;           /* the checkpoint's step's evaluation is owed */
	int32_t evaluated;           /* ... or done, with these numbers */
	struct kiln_ckpt_evaluated done;
	int64_t counts0[2];          /* the clip op's counts */
	int64_t skipped0;            /* the bad samples replaced before it */
	char error[KILN_ERROR_MAX]; /* rank 0's message when status != 0 */
	char path[1024];
	char file[1024]; /* per stage, or ZeRO-1's shards: the checkpoint (t->resume_file) */
};

/* After rank 0's resume message: the entries of the log interval its
 * checkpoint holds (t->iv0, whose count every rank has from it). */
static kiln_status resume_interval(struct trainer *t)
{
	struct kiln_ckpt_interval *iv = &t->iv0;
	const size_t bytes = sizeof *iv->rank * (size_t)iv->ranks;
	kiln_status st;
	if (!iv->ranks)
		return KILN_OK;
	if (!iv->rank && !(iv->rank = malloc(bytes)))
		st = kiln_error(KILN_ENOMEM, "its entries' buffer: out of memory");
	else
		st = kiln_dist_ckpt_fault_at(t->dist, "resume_iv", "its entries' buffer");
	/* (a rank whose buffer could not be allocated still takes part in
	 * the broadcast's agreement: every rank fails together) */
	return kiln_dist_broadcast_host(t->dist, st, "rank 0's log interval", iv->rank, bytes,
					t->compute);
}

/* [train] resume: restore the newest usable checkpoint of ckdir into t->m
 * and t->pos, on every rank.  *found = 0 when there is none (a fresh
 * start). */
kiln_status trainer_resume(struct trainer *t, int *found)
{
	struct resume_msg *msg;
	kiln_status st;
	*found = 0;
	if (t->world == 1)
		return trainer_resume_read(t, found);
	if (!(msg = calloc(1, sizeof *msg)))
		st = kiln_error(KILN_ENOMEM, "the message's buffer: out of memory");
	else
		st = kiln_dist_ckpt_fault_at(t->dist, "resume", "the message's buffer");
	if (!st && !t->rank) {
		msg->status = trainer_resume_read(t, found);
		msg->found = *found;
		msg->tr = t->pos;
		msg->sums = t->ep0_sums;
		msg->iv = t->iv0;
		msg->stopper = t->stopper;
		msg->plateau = t->plateau;
		msg->plateau_have = t->plateau_have;
		msg->G_ckpt = t->G_ckpt;
		msg->eval_owed = t->eval_owed;
		msg->evaluated = t->evaluated;
		msg->done = t->done;
		memcpy(msg->counts0, t->counts0, sizeof msg->counts0);
		msg->skipped0 = t->skipped0;
		if (msg->status)
			snprintf(msg->error, sizeof msg->error, "%s", kiln_last_error());
		snprintf(msg->path, sizeof msg->path, "%.1000s", t->ckdir);
		memcpy(msg->file, t->resume_file, sizeof msg->file);
	}
	/* (a rank whose buffer could not be allocated still takes part in
	 * the broadcast's agreement: every rank fails together) */
	if ((st = kiln_dist_broadcast_host(t->dist, st, "rank 0's resume", msg, sizeof *msg,
					   t->compute))) {
		free(msg);
		return st;
	}
	st = msg->status;
	if (st) {
		/* every rank has the message before rank 0 fails: its exit must
		 * not cut a peer's receive short (kiln launch then stops the
		 * others), so each rank can still name rank 0's error */
		double one = 1;
		(void)kiln_dist_sum_host(t->dist, &one, 1, t->compute);
	}
	if (t->rank && st) {
		/* the whole world and, with [dist] pipeline, this rank's stage
		 * (t->world is the data-parallel world: "rank 3 of 2" before) */
		char stage[48] = "";
		if (t->pipe_P > 1)
			snprintf(stage, sizeof stage, " (pipeline stage %d)", t->rank % t->pipe_P);
		st = kiln_error(st, "rank %d of %d%s: rank 0 could not resume: %s", t->rank,
				kiln_dist_world(t->dist), stage, msg->error);
	}
	else if (!t->rank && st)
		kiln_error(st, "%s", msg->error); /* rank 0's own message, kept */
	else if (t->rank && msg->found) {
		t->pos = msg->tr;
		/* the step rank 0's checkpoint is of, as rank 0 has it: the
		 * stop and early-stop checkpoints' "written already" tests
		 * must answer alike on every rank (their writes are collective) */
		t->ckpt_step = msg->tr.step;
		t->ep0_sums = msg->sums;
		t->iv0 = msg->iv;
		t->iv0.rank = NULL;
		t->stopper = msg->stopper;
		t->plateau = msg->plateau;
		t->plateau_have = msg->plateau_have;
		t->G_ckpt = msg->G_ckpt;
		t->eval_owed = msg->eval_owed;
		t->evaluated = msg->evaluated;
		t->done = msg->done;
		memcpy(t->counts0, msg->counts0, sizeof t->counts0);
		t->skipped0 = msg->skipped0;
		memcpy(t->resume_file, msg->file, sizeof t->resume_file);
		t->resume_file[sizeof t->resume_file - 1] = 0;
		*found = 1;
		kiln_log(KILN_LOG_INFO, "train", "rank %d: resuming from rank 0's checkpoint in %s (broadcast): epoch %lld, step %lld, sample %lld of the epoch",
			 t->rank, msg->path, (long long)msg->tr.epoch + 1, (long long)msg->tr.step,
			 (long long)msg->tr.offset);
	}
	if (!st && msg->found)
		st = resume_interval(t);
	free(msg);
	return st;
}

/* Before a stop's agreement, with this rank's request `pending`: its
 * share, 1 when it posted the cause of a stop not the user's (the first
 * time), else 0.  Summed over the ranks and nonzero, every rank reads
 * that cause into its result (trainer_dist_stop_cause_read). */
kiln_status trainer_dist_stop_cause_post(struct trainer *t, int pending, double *share)
{
	const char *cause = trainer_stop_cause();
	*share = 0;
	if (!pending || !cause || t->stop_cause_posted)
		return KILN_OK;
	t->stop_cause_posted = 1;
	*share = 1;
	return kiln_dist_stop_cause_post(t->dist, cause);
}

kiln_status trainer_dist_stop_cause_read(struct trainer *t, double posted)
{
	if (posted <= 0 || t->res->stop_cause[0])
		return KILN_OK;
	/* (KILN_TEST_CKPT_FAIL=cause@R: rank R's read failing alone) */
	kiln_status st = kiln_dist_ckpt_fault_at(t->dist, "cause", "reading the stop's cause");
	return st ? st
		  : kiln_dist_stop_cause_read(t->dist, t->res->stop_cause, sizeof t->res->stop_cause);
}

kiln_status trainer_dist_ckpt_stop(struct trainer *t, int lost)
{
	double v[2] = { lost, 0 };
	kiln_status st = KILN_OK;
	char what[48];
	/* (rank 0's request agreed on here: not again at the log point) */
	if (lost && trainer_take_stop())
		st = trainer_dist_stop_cause_post(t, 1, &v[1]);
	snprintf(what, sizeof what, "step %lld's checkpoint", (long long)t->step);
	st = kiln_dist_sum_agreed(t->dist, st, v, 2, what, t->compute);
	t->dist_stop |= v[0] > 0;
	if (!st)
		st = trainer_dist_stop_cause_read(t, v[1]);
	return st;
}

/* At a log point: the interval's loss and correct sums as every rank's
 * mean (the log shows every rank's samples), the ranks whose parameters
 * hold non-finite values (*bad: this rank's 0 or 1, then every rank's
 * count), and the stop requests: one on any rank stops all of them after
 * this same step (t->dist_stop), with its cause when it was not the
 * user's.  st: this rank's reading of them; failed, it still takes part
 * in the sums, and every rank fails (kiln_dist_sum_agreed). */
kiln_status trainer_dist_sums(struct trainer *t, kiln_status st, double *loss, double *correct,
			      double *bad)
{
	double v[5] = { *loss, *correct, trainer_take_stop(), *bad, 0 };
	char what[48];
	if (!st)
		st = trainer_dist_stop_cause_post(t, v[2] > 0, &v[4]);
	snprintf(what, sizeof what, "step %lld's log point", (long long)t->step);
	st = kiln_dist_sum_agreed(t->dist, st, v, 5, what, t->compute);
	*loss = v[0] / t->world;
	*correct = v[1] / t->world;
	t->dist_stop |= v[2] > 0;
	*bad = v[3];
	if (!st)
		st = trainer_dist_stop_cause_read(t, v[4]);
	return st;
}

/* [dist] timing: the interval's exposed communication and allreduce time
 * per step, as a metrics.jsonl `comm` event. */
void trainer_dist_comm_event(struct trainer *t)
{
	double ex, cm;
	int64_t ns;
	kiln_dist_timing(t->dist, &ex, &cm, &ns);
	if (ns <= t->comm_steps0)
		return;
	double per = 1e3 / (double)(ns - t->comm_steps0);
	trainer_jsonl(t, "{s:s, s:I, s:I, s:o, s:o}", "event", "comm", "step", (json_int_t)t->step,
		      "steps", (json_int_t)(ns - t->comm_steps0), "exposed_ms",
		      trainer_json_real((ex - t->comm_exposed0) * per), "allreduce_ms",
		      trainer_json_real((cm - t->comm_total0) * per));
	t->comm_exposed0 = ex, t->comm_total0 = cm, t->comm_steps0 = ns;
}

/* The run's [dist] timing, in the log. */
void trainer_dist_summary(const struct trainer *t)
{
	double ex, cm;
	int64_t ns;
	kiln_dist_timing(t->dist, &ex, &cm, &ns);
	if (ns)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d: over %lld steps, exposed communication %.3f ms/step, allreduce %.3f ms/step on the comm stream (%.1f%% exposed)",
			 t->rank, (long long)ns, ex / (double)ns * 1e3, cm / (double)ns * 1e3,
			 cm > 0 ? 100 * ex / cm : 0.0);
}

kiln_status trainer_pipe_layout(struct trainer *t)
{
	int64_t P = 1;
	kiln_status st = kiln_config_get_int(t->cfg, "dist", "pipeline", &P);
	if (st && st != KILN_ENOTFOUND)
		return st;
	t->drank = t->rank;
	t->pipe_P = 1;
	if (P <= 1)
		return KILN_OK;
	if (t->world % P)
		return kiln_error(KILN_ECONFIG, "%s: [dist] pipeline = %lld stages, but the world of %d rank(s) is not a multiple of it (world = pipeline x data-parallel ranks)",
				  kiln_config_where(t->cfg, "dist", "pipeline"), (long long)P, t->world);
	t->pipe_P = (int)P;
	t->drank = t->rank / t->pipe_P;
	t->world /= t->pipe_P; /* the data-parallel world: G, the sampler, the means */
	/* the groups now: the gradients' shared memory is the stage group's */
	return kiln_dist_pipe_split(t->dist, t->cfg, t->pipe_P);
}

kiln_status trainer_pipe_ranks(struct trainer *t)
{
	const int P = t->pipe_P;
	size_t lo[KILN_PIPE_MAX_STAGES], hi[KILN_PIPE_MAX_STAGES];
	int rank_of[KILN_PIPE_MAX_STAGES], world_of[KILN_PIPE_MAX_STAGES], stage, pipe, D;
	const struct kiln_comm_ops *ops;
	void *pcomm;
	kiln_status st;
	if (P <= 1)
		return KILN_OK;
	if (kiln_pipe_stages(t->pipe) != P)
		return kiln_error(KILN_ECONFIG, "%s: [dist] pipeline = %d, but the model is placed in %d stages",
				  kiln_config_where(t->cfg, "dist", "pipeline"), P,
				  kiln_pipe_stages(t->pipe));
	for (int s = 0; s < P; s++)
		kiln_pipe_stage_slice(t->pipe, s, &lo[s], &hi[s]);
	if ((st = kiln_dist_pipe_open(t->dist, t->cfg, P, lo, hi, &ops, &pcomm, &stage, &pipe, &D)))
		return st;
	for (int s = 0; s < P; s++) {
		rank_of[s] = s; /* the pipe's communicator ranks its members by stage */
		world_of[s] = pipe * P + s; /* pipe r / P, stage r % P: kiln_dist_pipe_split */
	}
	if ((st = kiln_pipe_use_ranks(t->pipe, ops, pcomm, kiln_dist_comm_name(t->dist), stage,
				      rank_of, world_of)))
		return st;
	kiln_log(KILN_LOG_INFO, "pipeline", "rank %d: stage %d of %d (layers' parameters [%zu, %zu) of %zu floats), pipe %d of %d",
		 t->rank, stage, P, lo[stage], hi[stage], t->m->n_trainable, pipe, D);
	/* the stage's gradients alone (its parameters: kiln_dist_pipe_shard);
	 * the clip and non-finite check over them */
	float *g;
	size_t gn;
	if ((st = kiln_dist_pipe_cut_grads(t->dist, t->m, t->world > 1, t->compute)))
		return st;
	if (t->clip && !t->m->scaler_d && kiln_dist_pipe_grad_span(t->dist, &g, &gn))
		return trainer_clip_over(t, gn);
	return KILN_OK;
}

kiln_status trainer_pipe_overlap(struct trainer *t)
{
	int on = 0;
	kiln_status st;
	if (!t->pipe || !t->dist || !kiln_pipe_hookable(t->pipe))
		return KILN_OK;
	if ((st = kiln_dist_pipe_overlap(t->dist, &on)))
		return st;
	if (on)
		kiln_pipe_grads_by_hook(t->pipe);
	return KILN_OK;
}
