/* core/train.h - the trainer's state and the calls its loop is made of.
 *
 * kiln_train (trainer.c) reads like llm.c's main:
 *   trainer_open       setup: device, data, model, plans, buffers, resume  (train_setup.c;
 *                      the model and plans in train_model.c, the buffers in train_buffers.c)
 *   trainer_step       one optimizer step: micro-steps, optimizer          (train_step.c)
 *   trainer_log_point  metrics read back, progress, the loggers            (train_log.c)
 *   trainer_evaluate   evaluation, keep_best, early stopping               (train_eval.c)
 *   trainer_checkpoint a checkpoint after a step                           (train_ckpt.c)
 *   trainer_close      drain and free                                      (train_setup.c)
 * with the distributed glue (resume broadcast, the ranks' sums at a log
 * point) in train_dist.c.  kiln_evaluate (train_eval.c) opens the same
 * trainer for evaluation only.
 *
 * One step (DESIGN.md section 4):
 *   host:    assemble batch into staging slot s (waits only for slot s's
 *            previous copy to finish: backpressure, never for compute)
 *   copy:    waits compute_done[s] -> copy x, y into device slot s -> copy_done[s]
 *   compute: waits copy_done[s] -> forward -> backward -> fused optimizer -> compute_done[s]
 * On a device of host memory (the CPU) the compute stream reads x where the
 * host assembled it, without the copy (train_step.c, read_in_place): the
 * staging slot is then free once the step that read it is, an event on
 * compute (the one wait for compute; a CPU device without async streams has
 * run the step by then).
 * Metrics (loss sum, correct count) accumulate on the device and are read
 * back every log_every steps and at epoch ends: the only host syncs.
 * With [run] profile = 1 the steps are bracketed for core/profile.c, which
 * then times (and serialises) every op of a step; see profile.h.
 *
 * Checkpoints (core/checkpoint.h) are written after a step: every
 * checkpoint_every steps, after the run's last step, and when a stop was
 * requested (kiln_train_request_stop, from SIGTERM/SIGUSR1).  Each records
 * the epoch and the global sample offset into the epoch's order, so a
 * resumed run redraws the epoch's permutation from (seed, epoch), takes
 * its share from that offset and continues bit-for-bit.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include "graph.h"
#include "checkpoint.h"
#include "data.h"
#include "loader.h"
#include "profile.h"
#include "dist.h"
#include "run_config.h"
#include "logger.h"
#include "pipeline.h"
#include "plateau.h"

#include <jansson.h>
#include <math.h> /* isfinite */

#define SLOTS 2

/* transform_on = device: u8 batches normalised by a device op, one plan
 * per row count */
#define NORM_PLANS 6

/* A data set the trainer reads. */
struct train_set {
	struct kiln_dataset ds;
	int64_t len;               /* after [data] limit */
	struct kiln_loader *loader; /* worker threads, or NULL: read inline */
	struct kiln_tensor_desc input; /* one sample as the model takes it */
	/* 1 + the loader slot whose x the compute stream reads in place
	 * (trainer_load_batch), released at the next batch's load; 0: none */
	int held;
};

/* keep_best: one of the K best evaluations' checkpoints in ckdir/best */
struct best {
	double v;
	int64_t step;
	char path[4200];
};

/* Early stopping ([train] early_stop_patience, early_stop_metric,
 * early_stop_min_delta) over the evaluations. */
struct stopper {
	int64_t bad;
	double best;
	int have;
};

/* Whether metric value v (higher is better: a loss negated) beats w, for
 * early stopping and keep_best: a value that is not finite (a diverged
 * evaluation's NaN or infinite loss) beats none, and every finite one
 * beats it. */
static inline int trainer_metric_beats(double v, double w)
{
	return isfinite(v) && (!isfinite(w) || v > w);
}

/* An evaluation set with its plans and where its results go. */
struct eval_target {
	struct train_set *set;
	struct kiln_plan *rem;     /* the last partial batch's plan, or NULL */
	double *loss, *acc, *acc5;
	int64_t *samples;
	const char *name;          /* "test" or "val" */
};

struct trainer {
	/* the config, read once */
	const struct kiln_config *cfg;
	const struct kiln_registry *reg;
	struct kiln_run_cfg run;
	struct kiln_train_cfg tc;
	struct kiln_data_cfg data;
	int training;              /* 0: kiln_evaluate's trainer (evaluation only) */
	int64_t B, EB, acc;        /* batch, evaluation batch (at most the data), accumulate */
	struct kiln_train_result *res;
	kiln_progress_fn progress;
	void *user;
	/* data and plans */
	struct train_set train, test, val;
	int have_val;              /* the config has [data.val] */
	struct kiln_plan *ptrain, *peval, *prem, *pvrem;
	struct kiln_pipe *pipe;    /* [pipeline]/stages: ptrain is its first plan */
	struct eval_target ev;     /* the evaluations during training: val, else test */
	/* device */
	struct kiln_device *dev;
	struct kiln_model *m;
	void *compute, *copy;
	void *copy_done[SLOTS], *compute_done[SLOTS];
	int slot_used[SLOTS];
	int slot_in_place[SLOTS];  /* x_host[s] read in place by the compute stream */
	void *x_host[SLOTS], *y_host[SLOTS];
	void *x_dev[SLOTS], *y_dev[SLOTS];
	size_t x_bytes, sample_bytes;
	size_t label_bytes;        /* one sample's labels: 4 (a class) or 4 T (tokens) */
	float *lr_dev, *metrics_dev;
	float *metrics_host;       /* f32[16]: [0..2] the metric sums, [3] the lr,
				    * [8..9] an int64 (opt_steps_taken) */
	void *fill_metrics, *sched;
	/* [train] schedule = plateau (train_plateau.c): ReduceLROnPlateau's
	 * arguments and state (plateau_have: restored from the checkpoint),
	 * the device's f32 rate [0] and warm-up factor [1], their host copy,
	 * the MUL of the two into lr_dev; NULL plateau_mul: another schedule */
	struct kiln_plateau_cfg plateau_cfg;
	struct kiln_plateau plateau;
	int plateau_have;
	float *plateau_d, *plateau_host;
	void *plateau_mul;
	/* the samples the device's metric sums have counted since they were
	 * last read and reset: kept at most TRAINER_METRIC_ROWS (exact f32
	 * counts; trainer_metrics_room) */
	int64_t metric_rows;
	int64_t step_counter;      /* slot rotation */
	int64_t *eval_order;       /* 0, 1, 2, ... for the evaluation loader */
	struct kiln_loggers *log;  /* metrics.jsonl and [log]'s (rank 0), or NULL */
	struct kiln_data_scratch scratch; /* reads on this thread (workers = 0) */
	int64_t epoch;             /* of the batches being read */
	void *x_norm;              /* transform_on = device: f32 input */
	float *grads_more;         /* accumulate > 1 where a layer cannot add in its ops
				    * (kiln_model_grad_accum_ok): micro-steps 2.. write here */
	void *grads_add;           /* grads_d += grads_more */
	/* accumulate > 1 (no pipeline): the loss layers' gradient seed,
	 * the loss scale / accumulate (kiln_model_seed_open), and with loss
	 * scaling the op that sets it from the scale at each step's start */
	float *seed_d;
	void *seed_op;
	void *clip;                /* KILN_OP_GRAD_CLIP, or NULL */
	/* the same taking the gradients' block sums, summed in the backward
	 * where their layers complete them (core/train_gradsums.c): the
	 * ranges, each a KILN_OP_GRAD_SUMSQ, those run this step, the sums
	 * f32[ceil(n_trainable / 1024)]; NULL / 0 where not */
	void *clip_sums;
	struct grad_sums_range *sums;
	int n_sums, sums_run;
	int sums_said; /* the first step taking them logged (debug) */
	float *sums_d;
	float *clip_d;             /* its state f32[4]: norm, finite, skipped, clipped */
	float *clip_host;
	/* the steps skipped and clipped so far, exact: clip_d[2..3] are
	 * added here and reset to 0 at each read of the metrics (an f32 count
	 * stops at 2^24 = 16777216; trainer_read_metrics); fill_counts
	 * zeroes those two floats */
	int64_t clip_total[2];
	void *fill_counts;
	/* the clip op's count of non-finite norms at the last log point: the
	 * steps skipped with skip_nonfinite, taken without (res->steps_skipped
	 * counts only the skipped ones) */
	int64_t nonfinite_seen;
	float *scaler_host;        /* the loss scaler's state, read at log points */
	/* the parameters' non-finite check (core/train_log.c): GRAD_CLIP
	 * clipping nothing over this rank's finite_n parameters, its state
	 * f32[4] ([1] the finite flag), the step it last passed */
	void *finite;
	size_t finite_n;
	/* the same over the batchnorm running statistics (the buffers
	 * region; a rank holding its pipeline stage alone skips them), its
	 * state f32[4] at finite_d + 4 */
	void *finite_buf;
	float *finite_d, *finite_host;
	int64_t finite_step;
	size_t norm_bytes;
	int64_t norm_rows[NORM_PLANS];
	const struct train_set *norm_of[NORM_PLANS]; /* each data set has its mean/std */
	void *norm_plan[NORM_PLANS];
	struct kiln_profile *prof;  /* [run] profile = 1, else NULL */
	/* checkpoints */
	char ckdir[4200];          /* [run] out_dir/checkpoints, "" without out_dir */
	int out_lock;              /* out_dir/.kiln.lock held (rank 0 training); -1: none */
	int out_watch;             /* out_dev/out_ino: what out_dir's lock (or, unlocked,
				    * out_dir) was when taken (trainer_out_dir_watch) */
	dev_t out_dev;
	ino_t out_ino;
	char out_lost[700];        /* the stop cause of a run directory lost mid-run */
	char *config_text;         /* resolved config, stored in each checkpoint */
	char *versions;
	struct kiln_ckpt_trainer pos; /* where the run stands (trainer section) */
	int resumed;
	/* [train] resume per stage ([dist] pipeline, kiln_dist_pipe_resumes):
	 * the checkpoint rank 0 chose, each rank's stage loaded from it after
	 * the optimizer is sharded (open_run); "": loaded whole by rank 0 */
	char resume_file[1024];
	/* rank 0's open checkpoint of resume_file, verified by
	 * trainer_resume_read, for those loads (read once: before session 30
	 * rank 0 opened and verified the file again there); closed after */
	struct kiln_ckpt *resume_ck;
	int64_t ckpt_step;         /* step of the last checkpoint written; -1: none */
	int64_t named_step;        /* step of the checkpoint res->checkpoint names; -1: none */
	/* step of the last "checkpoint" event this process logged (-1: none):
	 * a checkpoint written again (after an evaluation that changed what
	 * it holds, or with the numbers of the evaluations after its step)
	 * logs none unless this process has not logged that step's yet (a
	 * resume of a run killed between its write and the event) */
	int64_t logged_step;
	/* a resume with no step left (the run complete, or stopped early):
	 * its epoch's line is not printed unless an evaluation runs in it
	 * (trainer_checkpoint_resumed, epoch_end) */
	int no_step_left;
	int64_t evals;             /* evaluations this process ran */
	/* the clip op's counts (clip_d[2..3]: steps skipped, clipped) the
	 * resumed checkpoint holds ("clip_counts"), the start of clip_total
	 * (trainer_clip_counts_seed) */
	int64_t counts0[2];
	/* the bad samples replaced ([data] on_error = skip) before the
	 * resumed checkpoint ("data_skipped"): the run's count goes on from it */
	int64_t skipped0;
	struct kiln_ckpt_epoch ep0_sums; /* the resumed epoch's sums before the checkpoint */
	/* the log interval across a checkpoint (core/train_interval.c): the
	 * resumed checkpoint's "interval" section (iv0; ranks 0: none; its
	 * entries malloc'd), seeded by the resumed epoch's start; the interval
	 * kept for the checkpoints of step iv_kept_step (-1: none), this
	 * rank's: the one a log point that max_steps alone put there closed,
	 * or the one open at an early stop's step (its sums taken with the
	 * epoch's, end_sums); every rank's entries gathered for a checkpoint
	 * (iv_all, ranks x stages, malloc'd when the loop opens) */
	struct kiln_ckpt_interval iv0, iv_kept;
	struct kiln_ckpt_interval_rank iv_kept_mine;
	int64_t iv_kept_step;
	struct kiln_ckpt_interval_rank *iv_all;
	/* keep_best: the K best evaluations' checkpoints in ckdir/best, in
	 * every checkpoint's "best" section; rank 0's alone is read (it
	 * chooses for every rank, trainer_keep_best), so a resume restores it
	 * on rank 0 only (train_best.c trainer_best_restore) */
	int n_best;
	struct best *best;
	/* data-parallel training (core/dist.c): NULL for one process */
	struct kiln_dist *dist;
	/* kiln_dist_open failed, not of this rank's own doing (its *own;
	 * trainer_close tells kiln_train_failed_own) */
	int dist_open_followed;
	int rank, world;
	/* [dist] pipeline = P > 1 (pipe_P): world above is the data-parallel
	 * world D (world ranks / P), drank this rank's pipe (its data shard);
	 * otherwise drank = rank */
	int drank, pipe_P;
	int dist_stop;             /* every rank agreed to stop */
	int stop_cause_posted;     /* this rank's stop cause is in the store */
	/* [dist] timing: the sums at the previous log point */
	double comm_exposed0, comm_total0;
	int64_t comm_steps0;
	/* captured steps (device ops version 3): 0 undecided (before the
	 * first step after the warm-up), 1 captured, -1 issued every step;
	 * one graph per input slot (its x and y buffers are fixed) */
	int eval_staged;     /* evaluation plans run per stage (kiln_dist_pipe_forward) */
	int graph_mode;
	void *graph[SLOTS];
	/* the loop: an optimizer step takes G samples over all ranks */
	int64_t *perm, *order;     /* the epoch's permutation, this rank's share */
	int64_t G, steps_per_epoch;
	int64_t G_ckpt;            /* a resume's checkpoint's global batch (0: none):
				    * schedule = plateau's rate follows lr_scale from it to G */
	int64_t ep0, off0;         /* where the run starts: epoch, global sample offset */
	int64_t ep, k, k0;         /* epoch, step of the epoch, the epoch's first */
	int64_t step, step0, interval_start; /* optimizer steps done: now, at the start, at the last log */
	int64_t last_step;         /* the step the run ends at, unless stopped sooner
				    * (kiln_train_progress_steps; trainer_last_step) */
	int stopping, stop_early;
	int eval_cut;              /* a stop cut the last evaluation short (eval_stop) */
	/* the last evaluation's failure is final: agreed (the sum of the
	 * ranks' shares after the pass, eval_shares_sum, or eval_stop's), or
	 * in a collective (a pipeline's hand-offs, its sums over the pipe,
	 * the gather of the stages' parameters, the broadcast of rank 0's
	 * batchnorm statistics): returned as it is, not agreed on again
	 * (train_eval.c eval_agree) */
	int eval_no_agree;
	/* the eval_every evaluation after step t->step is owed: a stop cut it
	 * short; the stop's checkpoint says so ("eval_owed") and the resumed
	 * run runs it before its first step (trainer.c eval_owed_run) */
	int eval_owed;
	/* the run's last checkpoint is followed by evaluations it records
	 * (CKPT_END_EVALS: the epoch's recorded one and [data.val]'s final
	 * test after the last step; CKPT_END_TEST: [data.val]'s final test
	 * after an early stop's checkpoint_last, which without [data.val] is
	 * written once, with the stopping evaluation's numbers): written at
	 * the step as any (or, in
	 * a resume that takes no step, the checkpoint it started from, which
	 * lacks them: trainer_checkpoint_resumed), then again after them by
	 * trainer_checkpoint_end, with their numbers
	 * ("evaluated"), at end_pos, with the training sums taken at the step
	 * (end_sums: the evaluations reuse the device's metric sums).  Before
	 * session 32 it was written before them only, and a resume of the
	 * finished run recorded them again; session 32 first wrote it after
	 * them only, and a failure during them lost it. */
	int ckpt_end;
#define CKPT_END_EVALS 1
#define CKPT_END_TEST 2
	struct kiln_ckpt_trainer end_pos;
	struct kiln_ckpt_epoch end_sums;
	/* resumed from such a checkpoint: the evaluations after its step are
	 * recorded (their numbers in `done`), not run again while the run
	 * takes no step */
	int evaluated;
	struct kiln_ckpt_evaluated done;
	int res_slot;
	void *res_x;               /* resident = 1: the one batch's device input */
	double timed_s;
	int64_t timed_samples;
	struct kiln_device_counters c_prev, c_now;
	int have_prev;
	/* the log interval's clock: its start, the time set aside in it
	 * (evaluations, histograms, checkpoint writes: not training,
	 * trainer_set_aside), the data wait at its start; the data read on
	 * this thread (workers = 0) */
	double iv_t0, iv_aside_s, iv_wait0, read_s;
	/* this epoch's start, the time set aside in it (as iv_aside_s) and
	 * its sums at the last log point */
	double ep_t0, ep_aside_s, ep_loss, ep_correct;
	/* this rank's training sums an evaluation read off the device
	 * between two log points (the metrics hold one set of sums), added
	 * back at the next read (interval_sums, epoch_sums) */
	double carry_loss, carry_correct;
	int64_t since, ep_samples;
	/* of since, the samples a resume seeded from the checkpoint's open
	 * interval (train_interval.c): this process did not train them, so
	 * the first row's samples_per_s leaves them out; 0 after a log point */
	int64_t since_seeded;
	struct stopper stopper;
	size_t rss0;
	/* when trainer_open began, and when it ended (the first step may
	 * start): setup_s and fit_s of the final metrics line */
	double t_start, t_fit0;
};

/* Profiling: the phase the host is in, and what the device ops that
 * follow belong to (NULL: nothing). */
static inline void trainer_phase(const struct trainer *t, int ph, int begin)
{
	if (t->prof)
		kiln_profile_phase(t->prof, ph, begin);
}

static inline void trainer_label(const struct trainer *t, const char *name, int pass)
{
	if (t->prof)
		kiln_profile_label(name, pass);
}

/* train_setup.c: everything a run needs, for training (training = 1,
 * with res and tc: the loop's state too) or for evaluation only (the
 * [data.eval] set, its plans and loader; kiln_evaluate: its caller loads
 * every weight next, so none is drawn, kiln_model_init_loaded).  trainer_close
 * frees what was set up (any part may be missing) after draining the
 * streams; it returns st, keeping its message. */
kiln_status trainer_open(struct trainer *t, const struct kiln_config *cfg,
			 const struct kiln_registry *reg, const struct kiln_train_cfg *tc,
			 int training, struct kiln_train_result *res);
kiln_status trainer_close(struct trainer *t, kiln_status st);
/* A fresh run's out_dir (core/out_dir.c): KILN_EUSAGE, naming a file,
 * when it holds an earlier run's files (metrics, logs, checkpoints in
 * ckdir) and overwrite is 0, nothing changed.  With overwrite, or in the
 * default out_dir (runs/latest), _clear deletes them (rank 0, logged)
 * once every check that can refuse the run has passed; _check refuses
 * (KILN_EUSAGE, nothing changed) when cfg's [model] init_from is one of
 * them (the same file: device and inode, whatever its path). */
kiln_status trainer_out_dir_check(const char *out_dir, const char *ckdir, int overwrite,
				  const struct kiln_config *cfg);
/* Any run's out_dir (fresh or resumed): KILN_EUSAGE, nothing changed,
 * when the config file cfg was loaded from is one of the files a run
 * deletes or writes there (out_dir/config.ini: the same file, device and
 * inode), unless that file is in resolved form itself (a run's own
 * config.ini, run again: `kiln train runs/x/config.ini --resume` loses no
 * word of the user's).  Before session 50 `kiln train config.ini
 * run.out_dir=.` deleted the user's config.ini as an earlier run's and
 * wrote the resolved config in its place. */
kiln_status trainer_config_kept(const char *out_dir, const char *ckdir,
				const struct kiln_config *cfg, const struct kiln_registry *reg);
kiln_status trainer_out_dir_clear(const char *out_dir, const char *ckdir, int overwrite);
/* A training run's out_dir, created, and locked for this process
 * (out_dir/.kiln.lock, flock, held until *fd is closed) before it is
 * looked at: KILN_EIO naming it when another kiln holds it.  A file
 * system without locks: logged, *fd -1, the run goes on. */
kiln_status trainer_out_dir_lock(const char *out_dir, int *fd);
/* The checkpoint directory of a run that will write checkpoints, created
 * (with its parents) at the start: KILN_EIO naming it when it cannot be
 * created or written (a file in its place), not after the training. */
kiln_status trainer_ckdir_check(const char *ckdir);
/* Rank 0, out_dir locked: remember what its lock file is, for
 * trainer_out_dir_watch. */
void trainer_out_dir_note(struct trainer *t);
/* Rank 0, at each log point and checkpoint: is out_dir still the one this
 * run locked (its .kiln.lock the same file)?  When it was removed,
 * renamed or replaced mid-run (before session 33 the run went on writing
 * into the unlinked files, recreated only checkpoints/, and exited 0):
 * the error logged naming it, out_dir recreated with the lock,
 * config.ini and metrics.jsonl (its lines so far copied from the removed
 * file, kiln_loggers_carry, then continued), res->out_dir_lost set and a
 * stop requested with that cause, so that the checkpoint of the stop goes
 * into the recreated directory and `kiln train` exits 4 (seen at a
 * checkpoint point's write, that checkpoint is the stop's: checkpoint_at,
 * trainer_dist_ckpt_stop).  An error only
 * when it cannot be recreated (or another kiln holds it by then). */
kiln_status trainer_out_dir_watch(struct trainer *t);
/* Before anything is changed: KILN_EIO naming the path when what the run
 * writes later is blocked, so that it is refused at its start, not after
 * the training (before session 33): a file in the way of ckdir/best (best:
 * keep_best with evaluations), a directory named profile.txt or trace.json
 * (prof: the profiler, NULL when off). */
kiln_status trainer_out_paths_check(const char *ckdir, int best, const struct kiln_profile *prof,
				    const char *out_dir);
/* Write path whole or not at all (kiln_file_write: a temporary, fsynced,
 * renamed over path, the directory fsynced; an old path stays intact when
 * the disk is full); KILN_EIO naming it. */
kiln_status trainer_write_file(const char *path, const char *text, size_t n);

/* train_result.c: the caller's result (kiln_train_run, kiln_evaluate_ex).
 * KILN_EINVAL naming fn when res is NULL or its size cannot hold `size`
 * (not set); then nothing may be written to it. */
kiln_status trainer_result_check(const struct kiln_train_result *res, const char *fn);
/* full's first res->size bytes (all of full when res is larger: a newer
 * header's) into res, checked before; res->size the bytes written. */
void trainer_result_out(struct kiln_train_result *res, const struct kiln_train_result *full);
/* The result of a run before anything ran (a training run's start, and
 * kiln_train's when reading [train] fails): every member 0 but test and
 * val loss and acc -1 (none ran), resumed_step -1 (no resume) and
 * loss_scale 1 (no scaling), as kiln/kiln.h documents them. */
void trainer_result_none(struct kiln_train_result *res);

/* train_step.c */
kiln_status trainer_load_batch(struct trainer *t, struct train_set *d, const int64_t *idx,
			       int64_t rows, int *slot_out, void **x_out);
kiln_status trainer_step(struct trainer *t);
kiln_status trainer_norm_plan(struct trainer *t, struct train_set *d, int64_t rows, int prep,
			      int *kout);

/* train_log.c */
kiln_status trainer_clip_counts(struct trainer *t, int64_t out[2]);
kiln_status trainer_data_skipped(struct trainer *t, int64_t *out);
kiln_status trainer_clip_counts_seed(struct trainer *t);
/* The most samples the device's metric sums count between two reads:
 * 2^24, past which an f32 count stops growing (an odd count no longer
 * fits).  The sums are f32 by the loss op's contract (kiln/ops.h
 * KILN_OP_SOFTMAX_XENT); the trainer reads and resets them before they
 * would count more (trainer_metrics_room) and adds on the host, in double
 * (before session 37 an evaluation of 2^25 samples at eval_batch 1 said
 * 50% accuracy where it was 100%). */
#define TRAINER_METRIC_ROWS ((int64_t)1 << 24)
/* Room in the device's metric sums for a training step's `rows` more
 * samples: when they would count more than TRAINER_METRIC_ROWS, they are
 * read and reset first (a host sync, once per 2^24 samples), their loss
 * and correct sums added into *ls, *c.  (An evaluation does the same
 * with its pipeline's sums: core/train_eval.c.) */
kiln_status trainer_metrics_room(struct trainer *t, int64_t rows, double *ls, double *c);
kiln_status trainer_read_metrics(struct trainer *t, double *loss_sum, double *correct,
				 double *correct5);
/* The device's metric sums copied into t->metrics_host[0..3) as they are
 * (not reset: a checkpoint's sync point; the next log point still reads
 * them).  A local step: trainer_epoch_sums, its one caller, carries its
 * failure into the ranks' sum.  KILN_TEST_CKPT_FAIL's "sums" (test-only,
 * core/dist.h) fails it. */
kiln_status trainer_metrics_peek(struct trainer *t);
/* A metrics.jsonl event: the object json_pack makes of fmt and its
 * arguments (each real through trainer_json_real, whose NULL, as any
 * other value's, jansson refuses), handed to the loggers; an object that
 * cannot be made is left out with a warning giving jansson's reason. */
void trainer_jsonl(struct trainer *t, const char *fmt, ...);
/* A real for a JSON record: null when it is not finite (a diverged
 * loss), as metrics.jsonl's train and eval records have it (JSON has no
 * NaN or infinity, and json_real refuses them).  New reference; NULL out
 * of memory. */
json_t *trainer_json_real(double v);
/* A path or other text of the system for a JSON record: the string, its
 * bytes that are not UTF-8 (a Latin-1 out_dir) each U+FFFD (JSON is
 * UTF-8, and json_pack's "s" fails on them: the record was dropped
 * unsaid before session 37).  New reference; NULL out of memory. */
json_t *trainer_json_text(const char *s);
void trainer_counters_mark(struct trainer *t);
void trainer_counters_take(struct trainer *t);
/* Work since t0 (kiln_now_s) that is not training (an evaluation,
 * histograms, a checkpoint's write) set aside: left out of the log
 * interval's and the epoch's time, so that the train lines' and the
 * epoch's samples/s are the steps' rate (docs/logging.md; before session
 * 40 a checkpoint's write counted, and an eval_every evaluation in the
 * epoch's).  Returns the seconds set aside. */
double trainer_set_aside(struct trainer *t, double t0);
kiln_status trainer_log_point(struct trainer *t);
/* The progress callback (when there is one) with (t->ep + 1, step,
 * steps_per_epoch, status), kiln_train_progress_steps answering for t
 * meanwhile. */
void trainer_progress(struct trainer *t, int64_t step, const char *status);
/* Before a checkpoint of the state after step t->pos.step (every rank):
 * KILN_EDATA naming the first parameter that holds non-finite values,
 * unless that step's log point checked them; a rank's failure to check
 * fails every rank (kiln_dist_sum_agreed). */
kiln_status trainer_params_finite(struct trainer *t);
void trainer_eval_record(struct trainer *t, const struct eval_target *e, int64_t epoch);
/* An epoch's training numbers into t->res and the start of its line into
 * msg (n bytes).  Every rank: an epoch an early stop ended between two
 * log points has its sums so far with the interval still open
 * (trainer_epoch_sums: a collective), as its checkpoint holds them and a
 * resume of it reports them (before, the sums of its log points alone:
 * train_loss 1.601775 where the resumed finished run said 1.555659). */
kiln_status trainer_epoch_summary(struct trainer *t, char *msg, size_t n);
void trainer_epoch_report(struct trainer *t, const char *msg);
kiln_status trainer_finish(struct trainer *t);

/* train_eval.c */
/* What an evaluation during training is (trainer_evaluate's `record`):
 * a run again of one recorded before (nothing written), the one after
 * the run's last step that is no eval_every point (its eval record
 * alone: metrics.jsonl, [log]'s tables and event file), or an evaluation
 * point (per epoch, or every eval_every steps: its record, keep_best and
 * early stopping, and the checkpoint position). */
enum { TRAINER_EVAL_AGAIN, TRAINER_EVAL_LOGGED, TRAINER_EVAL_POINT };
kiln_status trainer_evaluate(struct trainer *t, int64_t offset, int log, int record);
/* Whether the evaluation of t->ev follows the run's last step `step` as
 * the epoch's evaluation does (trainer_epoch_eval): per epoch, or with
 * eval_every when `step` is no evaluation point. */
int trainer_closing_eval(const struct trainer *t, int64_t step);
kiln_status trainer_epoch_eval(struct trainer *t, char *msg, size_t n);
int trainer_stop_numbers_missing(const struct trainer *t);
kiln_status trainer_final_test(struct trainer *t);

/* train_ckpt.c */
/* The training sums of the epoch so far into *out: those of its log
 * points plus the device's of the steps since the last one (read, not
 * reset: the next log line still covers its whole interval; left in
 * t->metrics_host for trainer_interval_meta), every rank's mean.  Every
 * rank (a collective): a rank whose read failed still takes part in the
 * sum, and every rank fails together (kiln_dist_sum_agreed; `what`
 * names the step for the message: "step 4's checkpoint"); st, the
 * caller's own local step before it, joins the sum the same way (the read
 * skipped when it failed). */
kiln_status trainer_epoch_sums(struct trainer *t, kiln_status st, const char *what,
			       struct kiln_ckpt_epoch *out);
kiln_status trainer_checkpoint_point(struct trainer *t);
kiln_status trainer_checkpoint_last(struct trainer *t);
kiln_status trainer_checkpoint_stop(struct trainer *t);
kiln_status trainer_checkpoint_end(struct trainer *t);
kiln_status trainer_checkpoint_resumed(struct trainer *t);
/* Whether out_dir/metrics.jsonl (its last MiB) holds the "checkpoint"
 * event of step: a resumed run's first write of its step logs none then. */
int trainer_checkpoint_logged(const char *out_dir, int64_t step);
/* train_best.c: keep_best's choice for an evaluation of (loss, acc): the
 * entry of its list the evaluation's checkpoint takes, -1 none (or no
 * keep_best, no out_dir); rank 0's is every rank's (train_eval.c
 * eval_agree carries it).  trainer_keep_best writes that checkpoint,
 * entry i (-1: nothing), on every rank. */
int trainer_best_choice(const struct trainer *t, double loss, double acc);
kiln_status trainer_keep_best(struct trainer *t, double loss, double acc, int i);
/* train_plateau.c: [train] schedule = plateau.  _cfg reads its keys;
 * _prepare (prep_schedule) its state at lr (or the checkpoint's), the
 * device's rate and the MUL; _run, after the schedule op in a step, lr =
 * warm-up factor x rate; _eval, at an evaluation point, ReduceLROnPlateau's
 * step on rank 0's loss; _free at close. */
kiln_status trainer_plateau_cfg(const struct kiln_config *cfg, struct kiln_plateau_cfg *c);
kiln_status trainer_plateau_prepare(struct trainer *t, double lr, double rescale);
kiln_status trainer_plateau_run(struct trainer *t);
kiln_status trainer_plateau_eval(struct trainer *t, double loss);
void trainer_plateau_free(struct trainer *t);
/* train_ckpt.c: what every checkpoint holds for a resume besides the
 * state, the position and the lists (the periodic, final and keep_best
 * ones alike: a run resumed from a best/ file goes on as from any), in
 * storage the caller holds while it writes */
struct trainer_ckpt_resume {
	struct kiln_ckpt_epoch sums;   /* the epoch's training sums so far */
	struct kiln_ckpt_interval interval; /* the log interval open, if any */
	struct kiln_ckpt_stopper stopper; /* early stopping's best and count */
	struct kiln_plateau plateau;   /* schedule = plateau's state */
	int64_t counts[2];             /* the clip op's steps skipped, clipped */
	int64_t data_skipped;          /* bad samples replaced so far */
};
/* st: the caller's own local step before it (a failure joins the ranks'
 * first sum, and every rank fails together) */
kiln_status trainer_ckpt_resume_meta(struct trainer *t, kiln_status st,
				     struct trainer_ckpt_resume *r, struct kiln_ckpt_meta *meta);
/* train_ckpt.c: write t's state as a checkpoint in dir (every rank takes
 * part: streamed stages, ZeRO-1's gather; the outcome agreed), the path
 * written into path on rank 0 */
kiln_status trainer_ckpt_write(struct trainer *t, const char *dir,
			       const struct kiln_ckpt_meta *meta, char *path, size_t n);
/* train_setup.c: the tests' stand-in for slow work: $var milliseconds of
 * sleep (KILN_TEST_OPEN_DELAY_MS, KILN_TEST_CLOSE_DELAY_MS,
 * KILN_TEST_CKPT_DELAY_MS: each checkpoint's write) */
void trainer_test_delay(const char *var);
/* train_best.c: keep_best's list into meta (entry i, -1: none, taken by
 * value v of this step), malloc'd into *out (NULL after a failure, which
 * the caller joins into the ranks' first sum: trainer_ckpt_resume_meta's
 * st, taken after it); the temporaries a killed
 * best write left in ckdir/best removed (rank 0); the list and its files
 * restored from a resumed checkpoint */
kiln_status trainer_best_meta(const struct trainer *t, int i, double v,
			      struct kiln_ckpt_meta *meta, struct kiln_ckpt_best **out);
void trainer_best_prune_tmp(const struct trainer *t);
kiln_status trainer_best_restore(struct trainer *t, struct kiln_ckpt *ck);
kiln_status trainer_resume_read(struct trainer *t, int *found);
/* train_resume_batch.c: a resume's checkpoint position tr in this run's
 * global batch (batch x accumulate x ranks; a complete epoch's offset
 * moved to this run's end of it), refused (KILN_EDATA) where its offset
 * is no whole number of this run's steps; what another global batch, or
 * another split of it (batch, accumulate, ranks, micro_batches: saved,
 * the checkpoint's config text), changes is logged */
kiln_status trainer_resume_batch(struct trainer *t, const char *path, const char *saved,
				 struct kiln_ckpt_trainer *tr);
void trainer_resume_finished(struct trainer *t);

/* train_interval.c: the log interval open at a checkpoint (the
 * "interval" section, checkpoint.h).  _open (the loop's open step):
 * t->iv_all, room for every rank's entry, allocated before any
 * checkpoint's collective.  _meta (every rank: a collective when one is
 * open; right after trainer_epoch_sums, whose read of the device's sums
 * it uses, or, after the run's last step (t->ckpt_end), with what _keep
 * kept): the interval at the checkpoint of step `step` into *iv, its
 * entries every rank's (in t->iv_all), *out pointing at it, or NULL when
 * none is open.  _closing (at a log point, before its sums are read:
 * `early`, a log point max_steps alone put there) and _closed (after
 * the read) keep the interval that log point closes; _keep (after
 * trainer_epoch_sums, at an early stop's end_sums) the one open then,
 * for the checkpoints written after evaluations that reuse the device's
 * sums.  _read (at a resume, where the checkpoint is read): the section
 * into t->iv0, checked against the "epoch" section's sums ep.  _seed
 * (every rank, the resumed epoch's start): the device's sums and the
 * interval's counts from t->iv0, unless the run has no step left. */
kiln_status trainer_interval_open(struct trainer *t);
kiln_status trainer_interval_meta(struct trainer *t, int64_t step, struct kiln_ckpt_interval *iv,
				  const struct kiln_ckpt_interval **out);
void trainer_interval_closing(struct trainer *t, int early);
void trainer_interval_closed(struct trainer *t, int early);
void trainer_interval_keep(struct trainer *t);
kiln_status trainer_interval_read(struct trainer *t, struct kiln_ckpt *ck,
				  const struct kiln_ckpt_trainer *tr, const struct kiln_ckpt_epoch *ep);
kiln_status trainer_interval_seed(struct trainer *t);

/* train_dist.c */
kiln_status trainer_resume(struct trainer *t, int *found);
/* core/train_dist.c, [dist] pipeline = P: the layout (t->pipe_P, the
 * data-parallel world and this rank's pipe), right after joining; then,
 * once the pipeline is open, its stages on the ranks. */
kiln_status trainer_pipe_layout(struct trainer *t);
kiln_status trainer_pipe_ranks(struct trainer *t);
/* t->clip as GRAD_CLIP over n floats ([train] clip_norm, clip_value; the
 * previous plan freed): the trainables, or a stage's cut gradients. */
kiln_status trainer_clip_over(struct trainer *t, size_t n);
/* core/train_gradsums.c: after the training plan (one process, no
 * pipeline), the gradients' block sums taken in the backward where they
 * can be (t->clip_sums, the model's backward hook); nothing else
 * changes.  trainer_sums_taken: whether this step's backward summed every
 * block (then t->clip_sums with t->sums_d replaces t->clip), and the
 * count starts again.  trainer_sums_free: all of it, the hook removed. */
kiln_status trainer_sums_open(struct trainer *t);
int trainer_sums_taken(struct trainer *t);
void trainer_sums_free(struct trainer *t);
/* ... and once the buckets are laid: a stage's buckets start during its
 * last micro-batch's backward where its gradients are final there */
kiln_status trainer_pipe_overlap(struct trainer *t);
kiln_status trainer_dist_sums(struct trainer *t, kiln_status st, double *loss, double *correct,
			      double *bad);
kiln_status trainer_dist_stop_cause_post(struct trainer *t, int pending, double *share);
kiln_status trainer_dist_stop_cause_read(struct trainer *t, double posted);
/* Every rank, after a checkpoint written at a checkpoint point (a
 * collective: one sum of two numbers): lost, rank 0's finding that the
 * run directory was lost at that write (trainer_out_dir_watch), stops
 * every rank after this step (t->dist_stop) with its cause, not at the
 * next log point as other stop requests (before session 34 the loss
 * waited for it too). */
kiln_status trainer_dist_ckpt_stop(struct trainer *t, int lost);
void trainer_dist_comm_event(struct trainer *t);
void trainer_dist_summary(const struct trainer *t);

/* trainer.c: the stop request (consumed), the test hook on the gradients */
int trainer_take_stop(void);
/* the cause of a stop not the user's (kiln_train_request_stop_cause), NULL */
const char *trainer_stop_cause(void);
extern kiln_grad_hook_fn trainer_grad_fn;
/* The call's final error to the program's hook (kiln_set_error_hook), if
 * any: by trainer_close before the teardown, and by each public entry
 * point (kiln_train, kiln_train_run, kiln_evaluate, kiln_evaluate_ex,
 * kiln_quantize) for a failure before it reaches trainer_close, so that
 * every failing call tells it once.  Nothing for KILN_OK.  Returns st. */
kiln_status trainer_error_told(kiln_status st);
/* trainer_error_told of a failure that followed from another rank's
 * (own 0: kiln_dist_failed_own) or is this process's own (1: what
 * trainer_error_told says of every failure), which kiln_train_failed_own
 * gives in the hook and after it */
kiln_status trainer_error_told_own(kiln_status st, int own);
extern void *trainer_grad_user;

#endif /* KILN_TRAIN_H */
