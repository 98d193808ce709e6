/* core/train_setup.c - trainer_open and trainer_close: what a run sets up
 * before its first step (the device, the data sets, the model and its
 * plans, the staging and device buffers, the schedule and clip ops, the
 * resume, out_dir's files, the loaders) and frees after its last.  The
 * same setup serves kiln_evaluate (training = 0: the [data.eval] set
 * alone).  The model and its plans are built in core/train_model.c, the
 * steps' buffers and ops (schedule, accumulation, clip) in
 * core/train_buffers.c.  See train.h. */
#include "train_setup.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* The tests' stand-ins for slow work: $var milliseconds of sleep.  In
 * tests/dist_rank_differ.sh KILN_TEST_CLOSE_DELAY_MS: a teardown after a
 * failure (a device's frees, a stream's drain: two ranks failing at
 * once); KILN_TEST_OPEN_DELAY_MS: opening the data sets (a folder of a
 * million images scanned: a peer failing meanwhile).  In
 * tests/log_rates.sh KILN_TEST_CKPT_DELAY_MS: a checkpoint's write (a
 * slow disk). */
void trainer_test_delay(const char *var)
{
	const char *v = getenv(var);
	if (v && atoi(v) > 0)
		usleep((useconds_t)atoi(v) * 1000);
}

static kiln_status open_set(struct trainer *t, const char *section, const char *split, int train,
			    struct train_set *d)
{
	kiln_status st = kiln_dataset_open(t->cfg, t->reg, section, split, train, &d->ds);
	/* (a rank's error names it, as a bad sample's does later,
	 * train_step.c: each rank opens its own copy, and a rank started by
	 * hand has no launcher to name it; before session 35 a truncated
	 * file said only its path) */
	if (st)
		return t->dist ? kiln_error_wrap(st, "rank %d of %d", t->rank, kiln_dist_world(t->dist))
			       : st;
	d->len = d->ds.len;
	d->ds.rank = t->dist ? t->rank : -1; /* (the skip warnings name it) */
	kiln_dataset_input_desc(&d->ds, &d->input);
	return KILN_OK;
}

static void close_set(struct train_set *d)
{
	kiln_loader_close(d->loader);
	d->loader = NULL;
	kiln_dataset_close(&d->ds);
}

/* The config read once, the result's starting values and the checkpoint
 * directory. */
/* An empty [run] out_dir with a key that writes into it: refused (before
 * session 34 keep_best, [log] tensorboard and csv wrote nothing, silently). */
static kiln_status out_dir_needed(const struct kiln_config *cfg, const struct kiln_train_cfg *tc)
{
	int tb = 0, csv = 0;
	kiln_config_get_bool(cfg, "log", "tensorboard", &tb);
	kiln_config_get_bool(cfg, "log", "csv", &csv);
	const struct {
		int on;
		const char *section, *key, *what;
	} keys[] = {
		{ tc->checkpoint_every != 0, "train", "checkpoint_every", "checkpoints go to out_dir/checkpoints" },
		{ tc->resume, "train", "resume", "checkpoints go to out_dir/checkpoints" },
		{ tc->keep_best != 0, "train", "keep_best", "the best checkpoints go to out_dir/checkpoints/best" },
		{ tb, "log", "tensorboard", "its event files go to out_dir" },
		{ csv, "log", "csv", "train.csv and eval.csv go to out_dir" },
	};
	for (size_t i = 0; i < KILN_ARRAY_LEN(keys); i++)
		if (keys[i].on)
			return kiln_error(KILN_ECONFIG, "%s: [%s] %s needs [run] out_dir (%s)",
					  kiln_config_where(cfg, keys[i].section, keys[i].key),
					  keys[i].section, keys[i].key, keys[i].what);
	return KILN_OK;
}

static kiln_status read_config(struct trainer *t, const struct kiln_train_cfg *tc)
{
	struct kiln_train_result *res = t->res;
	kiln_status st;
	trainer_result_none(res);
	t->tc = *tc;
	if ((st = kiln_run_cfg_read(t->cfg, &t->run)) || (st = kiln_data_cfg_read(t->cfg, &t->data)))
		return st;
	t->acc = tc->accumulate;
	t->EB = tc->eval_batch;
	if (t->EB && !t->training)
		t->B = t->EB; /* evaluation alone needs no training batch */
	else if ((st = kiln_train_cfg_batch(t->cfg, tc, t->training ? "the run starts" : "evaluating",
					    &t->B)))
		return st;
	if (!t->EB)
		t->EB = t->B;
	if (!t->training)
		return KILN_OK;
	/* (an INT8 layer refused now, not at the first forward: after
	 * open_out_dir had deleted the earlier run, session 34) */
	if ((st = kiln_config_check_training(t->cfg)))
		return st;
	if (tc->resume && tc->overwrite)
		return kiln_error(KILN_ECONFIG, "%s: [train] resume and overwrite are both set (--resume continues the run in out_dir, --overwrite deletes it): choose one",
				  kiln_config_where(t->cfg, "train", "overwrite"));
	if (*t->run.out_dir)
		snprintf(t->ckdir, sizeof t->ckdir, "%s/checkpoints", t->run.out_dir);
	else if ((st = out_dir_needed(t->cfg, tc)))
		return st;
	if (t->run.deterministic && !t->run.threads)
		return kiln_error(KILN_ECONFIG, "%s: [run] deterministic = 1 needs a fixed [run] threads (0 = all cores makes the result depend on the machine)",
				  kiln_config_where(t->cfg, "run", "deterministic"));
	return KILN_OK;
}

/* The device (and, training, the profiler and the data-parallel group). */
static kiln_status open_device(struct trainer *t)
{
	const char *devname = t->run.device;
	kiln_status st;
	if (!t->training)
		return kiln_device_open(t->reg, t->cfg, devname, 0, &t->dev);
	/* one GPU per rank: the device ordinal is the local rank (the CPU
	 * device takes any; the environment is read again, and checked, when
	 * joining) */
	struct kiln_dist_env env;
	int ordinal = !kiln_dist_env_read(&env) ? env.local_rank : 0;
	if ((st = kiln_profile_open(t->cfg, &t->prof)))
		return st;
	/* [run] devices: the pipeline's stages run beside this one's streams
	 * (core/pipe_devices.c), which then wait for theirs */
	int peers = 0;
	int64_t P = 1;
	if ((st = kiln_pipe_devices_count(t->cfg, &peers)))
		return st;
	/* with [dist] pipeline > 1 each rank runs its one stage on this
	 * device and [run] devices is unused (stage_devices warns): no peer
	 * streams to spin-wait for or plan pins around (before session 38's
	 * review the count still reached the device) */
	kiln_config_get_int(t->cfg, "dist", "pipeline", &P);
	if (P > 1)
		peers = 1;
	if ((st = kiln_device_open_peer(t->reg, t->cfg, devname, ordinal, -1, peers > 1 ? peers : 1,
					&t->dev)))
		return ordinal ? kiln_error_wrap(st, "rank %d (local rank %d): opening %s device %d",
						 env.rank, env.local_rank, devname, ordinal)
			       : st;
	/* before any prepare, so that every plan's op type is known */
	kiln_device_set_profile(t->dev, t->prof);
	/* what the device computes with (the CPU: oneDNN's ISA) */
	const char *(*describe)(void) =
		(const char *(*)(void))kiln_device_proc(t->dev, KILN_PROC_DESCRIBE);
	if (describe)
		kiln_log(KILN_LOG_INFO, "train", "device %s: %s", kiln_device_name(t->dev), describe());
	/* join the data-parallel group, if this is one */
	int own = 1;
	if ((st = kiln_dist_open(t->cfg, t->reg, t->dev, &t->dist, &own))) {
		t->dist_open_followed = !own;
		return st;
	}
	t->rank = kiln_dist_rank(t->dist);
	t->world = kiln_dist_world(t->dist);
	kiln_profile_set_rank(t->prof, t->rank);
	return trainer_pipe_layout(t);
}

/* [data], [data.eval] and [data.val] (training), or [data.eval] alone. */
static kiln_status open_sets(struct trainer *t)
{
	const int do_eval = t->tc.eval;
	kiln_status st;
	trainer_test_delay("KILN_TEST_OPEN_DELAY_MS");
	if (!t->training)
		return open_set(t, "data.eval", "test", 0, &t->test);
	if ((st = open_set(t, "data", "train", 1, &t->train)))
		return st;
	if (do_eval && (st = open_set(t, "data.eval", "test", 0, &t->test)))
		return st;
	for (int i = 0; do_eval && kiln_config_section(t->cfg, i); i++)
		t->have_val |= !strcmp(kiln_config_section(t->cfg, i), "data.val");
	if (t->have_val && (st = open_set(t, "data.val", "val", 0, &t->val)))
		return st;
	/* (a config error at the set's `size`, where one is set: the sets
	 * are read, each is whole; before session 34 exit 3, no file:line) */
	if (t->have_val && memcmp(&t->val.ds.sample, &t->train.ds.sample, sizeof t->train.ds.sample))
		return kiln_error(KILN_ECONFIG, "%s: [data.val] samples differ in shape from [data]'s: give both the same `size` (and `channels`)",
				  kiln_config_where(t->cfg, "data.val", "size"));
	if (do_eval && memcmp(&t->test.ds.sample, &t->train.ds.sample, sizeof t->train.ds.sample)) {
		char a[128], b[128];
		kiln_tensor_desc_str(&t->train.ds.sample, a, sizeof a);
		kiln_tensor_desc_str(&t->test.ds.sample, b, sizeof b);
		return kiln_error(KILN_ECONFIG, "%s: [data.eval] samples are %s but [data]'s are %s: give both the same `size` (and `channels`)",
				  kiln_config_where(t->cfg, "data.eval", "size"), b, a);
	}
	if (t->train.len < t->B)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch = %lld is larger than the %lld training samples",
				  kiln_config_where(t->cfg, "train", "batch"), (long long)t->B,
				  (long long)t->train.len);
	return KILN_OK;
}

/* out_dir (rank 0, created and locked by open_run), once every check
 * that can refuse the run has passed: a fresh run's --overwrite deletes
 * the earlier run's files, its checkpoint directory is tried (a run that
 * will write checkpoints), the loggers open: metrics.jsonl (continued by
 * a resumed run) and [log]'s, and the resolved config goes beside the
 * metrics. */
static kiln_status open_out_dir(struct trainer *t)
{
	const char *out_dir = t->run.out_dir;
	char path[4200];
	kiln_status st;
	/* (an unset variable, `run.out_dir=$OUT`, trained for hours and kept
	 * nothing, without a word, before session 50) */
	if (!*out_dir && !t->rank && t->tc.checkpoint_last)
		kiln_log(KILN_LOG_WARN, "train", "%s: [run] out_dir is empty: nothing is written (no metrics.jsonl, no checkpoint): the trained weights end with the process",
			 kiln_config_where(t->cfg, "run", "out_dir"));
	if (!*out_dir || t->rank)
		return KILN_OK;
	if (!t->tc.resume && (st = trainer_out_dir_clear(out_dir, t->ckdir, t->tc.overwrite)))
		return st;
	if ((t->tc.checkpoint_every || t->tc.checkpoint_last || t->tc.keep_best) &&
	    (st = trainer_ckdir_check(t->ckdir)))
		return st;
	/* config.ini is written last (below), but what would refuse its
	 * write (a directory or FIFO in its place) is refused before the
	 * loggers make their files (a review: the refused run left an empty
	 * metrics.jsonl and a TensorBoard file a resume then read) */
	snprintf(path, sizeof path, "%s/config.ini", out_dir);
	if ((st = kiln_run_file_check(path)))
		return st;
	/* so are [log] csv's tables, which it opens at their first record
	 * (before session 38 a directory train.csv failed the run at its
	 * first log point, config.ini and metrics.jsonl written) */
	int csv = 0;
	kiln_config_get_bool(t->cfg, "log", "csv", &csv);
	for (int i = 0; csv && i < 2; i++) {
		snprintf(path, sizeof path, "%s/%s.csv", out_dir, i ? "eval" : "train");
		if ((st = kiln_run_file_check(path)))
			return st;
	}
	st = kiln_loggers_open(t->cfg, out_dir, t->resumed, t->pos.step, &t->log);
	if (st)
		return st;
	/* the resolved config (every key, defaults filled in) beside the
	 * metrics: what this run was.  Written last, once nothing of setup
	 * can refuse the run: the loggers refuse a resume too (a train.csv
	 * they cannot continue, docs/logging.md), and before session 37 the
	 * refused run had already replaced the config.ini of the run it
	 * would have resumed (with its changed train.epochs, say) */
	snprintf(path, sizeof path, "%s/config.ini", out_dir);
	st = trainer_write_file(path, t->config_text, strlen(t->config_text));
	if (st)
		return st;
	/* the run before logged the step's checkpoint event (or was killed
	 * between the file's rename and the event: then this run logs it) */
	if (t->resumed && trainer_checkpoint_logged(out_dir, t->pos.step))
		t->logged_step = t->pos.step;
	if (t->resumed)
		trainer_jsonl(t, "{s:s, s:I, s:I, s:I}", "event", "resume", "epoch",
			      (json_int_t)t->pos.epoch + 1, "step", (json_int_t)t->pos.step, "offset",
			      (json_int_t)t->pos.offset);
	return KILN_OK;
}

/* Where the run starts: the beginning, or the newest checkpoint (every
 * rank from rank 0's state); out_dir checked (open_out_dir writes it). */
static kiln_status open_run(struct trainer *t)
{
	kiln_status st;
	t->pos = (struct kiln_ckpt_trainer){ 0, 0, 0, t->run.seed, t->world, t->B, t->train.len };
	t->ckpt_step = -1;
	t->named_step = -1;
	t->logged_step = -1;
	if (t->training && !t->tc.eval && (t->tc.keep_best || t->tc.early_stop_patience))
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] eval = 0 runs no evaluation, which %s%s%s need%s: ignored",
			 kiln_config_where(t->cfg, "train", "eval"),
			 t->tc.keep_best ? "keep_best" : "",
			 t->tc.keep_best && t->tc.early_stop_patience ? " and " : "",
			 t->tc.early_stop_patience ? "early_stop_patience" : "",
			 t->tc.keep_best && t->tc.early_stop_patience ? "" : "s");
	if (t->tc.keep_best && !(t->best = calloc((size_t)t->tc.keep_best, sizeof *t->best)))
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (*t->ckdir) {
		/* one run at a time in out_dir (rank 0 alone writes into it) */
		if (!t->rank && (st = trainer_out_dir_lock(t->run.out_dir, &t->out_lock)))
			return st;
		if (!t->rank && t->training)
			trainer_out_dir_note(t);
		/* (every rank: each writes its own profile) */
		if (t->training && (st = trainer_out_paths_check(t->ckdir, !t->rank && t->tc.keep_best &&
								 t->tc.eval, t->prof, t->run.out_dir)))
			return st;
		if (!(t->config_text = kiln_run_config_text(t->cfg, t->reg, &t->tc)))
			return KILN_EIO;
		if (!(t->versions = kiln_ckpt_versions(t->reg, t->dev)))
			return kiln_error(KILN_ENOMEM, "out of memory");
		if (t->training && *t->run.out_dir &&
		    (st = trainer_config_kept(t->run.out_dir, t->ckdir, t->cfg, t->reg)))
			return st;
		if (t->tc.resume && (st = trainer_resume(t, &t->resumed)))
			return st;
		if (t->resumed) {
			t->res->resumed_step = t->pos.step;
			trainer_resume_finished(t);
		} else if (t->training && !t->tc.resume &&
			 (st = trainer_out_dir_check(t->run.out_dir, t->ckdir, t->tc.overwrite, t->cfg)))
			return st;
		t->pos.world = t->world;
		t->pos.batch = t->B;
	}
	/* every rank starts from rank 0's state (its init, or the checkpoint
	 * all ranks read), and its gradients are averaged in buckets */
	if (t->dist && ((st = kiln_dist_attach(t->dist, t->m, t->compute)) ||
			(st = kiln_dist_broadcast_state(t->dist, t->compute)) ||
			(st = kiln_dist_zero_init(t->dist, t->compute, t->clip != NULL,
						  t->resume_file, t->resume_ck)) ||
			(st = kiln_dist_pipe_shard(t->dist, t->compute)) ||
			(*t->resume_file && kiln_dist_pipe_resumes(t->dist) &&
			 (st = kiln_dist_pipe_resume(t->dist, t->resume_file, t->resume_ck,
						     t->compute))) ||
			(st = trainer_pipe_overlap(t))))
		return st;
	kiln_ckpt_close(t->resume_ck);
	t->resume_ck = NULL;
	return trainer_clip_counts_seed(t);
}

/* Loader worker threads: [data] workers (0 = read on this thread). */
static kiln_status open_loaders(struct trainer *t)
{
	const int do_eval = !t->training || t->tc.eval;
	struct train_set *first = t->training ? &t->train : &t->test;
	int workers = t->data.workers, prefetch = (int)t->data.prefetch;
	kiln_status st;
	if (workers < 0 &&
	    (st = kiln_loader_probe(t->dev, &first->ds, t->training ? t->B : t->EB, prefetch,
				    t->copy, &workers)))
		return st;
	if (t->training && t->data.resident) {
		kiln_log(KILN_LOG_INFO, "data", "resident = 1: one batch is loaded once; every step trains on it (benchmark mode)");
		workers = 0;
	}
	if (workers <= 0)
		return KILN_OK;
	if ((t->training &&
	     (st = kiln_loader_open(t->dev, &t->train.ds, t->B, workers, prefetch, &t->train.loader))) ||
	    (do_eval &&
	     (st = kiln_loader_open(t->dev, &t->test.ds, t->EB, workers, prefetch, &t->test.loader))) ||
	    (t->have_val &&
	     (st = kiln_loader_open(t->dev, &t->val.ds, t->EB, workers, prefetch, &t->val.loader))))
		return st;
	char sz[32];
	int64_t n_order = t->have_val && t->val.len > t->test.len ? t->val.len : t->test.len;
	if (do_eval && !(t->eval_order = malloc(sizeof(int64_t) * (size_t)n_order)))
		return kiln_error(KILN_ENOMEM, "the evaluation's sample order for %lld samples (%s, 8 bytes a sample): out of memory; set %s limit to evaluate fewer (docs/memory.md)",
				  (long long)n_order,
				  kiln_bytes_str(sz, sizeof sz, (double)n_order * sizeof(int64_t)),
				  n_order == t->test.len ? "[data.eval]" : "[data.val]");
	for (int64_t i = 0; do_eval && i < n_order; i++)
		t->eval_order[i] = i;
	if (t->training)
		kiln_log(KILN_LOG_INFO, "data", "%d loader worker(s), %lld batch(es) ahead", workers,
			 (long long)prefetch);
	return KILN_OK;
}

/* The step the run ends at unless stopped sooner (a request, early
 * stopping): the steps left in the epoch it starts in (from the
 * checkpoint's offset, in this run's global batch G), then whole epochs,
 * or [train] max_steps when that comes first; saturated at INT64_MAX
 * (epochs = 1e9).  Counted here and not from the epoch and steps per
 * epoch: a resume that changed G keeps the checkpoint's step count, which
 * is then no multiple of this run's steps per epoch. */
static int64_t trainer_last_step(const struct trainer *t)
{
	const int64_t spe = t->steps_per_epoch, max_steps = t->tc.max_steps;
	int64_t left = 0;
	if (t->ep0 < t->tc.epochs) {
		const int64_t whole = t->tc.epochs - t->ep0 - 1; /* the epochs after the first */
		left = spe - t->off0 / t->G;
		left = whole > (INT64_MAX - left) / spe ? INT64_MAX : left + whole * spe;
	}
	int64_t last = t->step0 > INT64_MAX - left ? INT64_MAX : t->step0 + left;
	if (max_steps && max_steps < last)
		last = max_steps > t->step0 ? max_steps : t->step0;
	return last;
}

/* The loop's state: the epoch order buffers, the step size, where it
 * starts, what the evaluations during training evaluate. */
static kiln_status open_loop(struct trainer *t)
{
	struct kiln_train_result *res = t->res;
	t->perm = malloc(sizeof(int64_t) * (size_t)t->train.len);
	t->order = malloc(sizeof(int64_t) * (size_t)t->train.len);
	if (!t->perm || !t->order) /* (a billion samples: 16 GB) */
		return kiln_error(KILN_ENOMEM, "the epoch's sample order for %lld training samples (%s, 16 bytes a sample): out of memory; set [data] limit to train on fewer (docs/memory.md)",
				  (long long)t->train.len,
				  kiln_bytes_str((char[32]){ 0 }, 32, (double)t->train.len * 2 * sizeof(int64_t)));
	/* an optimizer step takes `acc` micro-batches of B (drop_last) */
	t->G = t->B * t->acc * t->world;
	t->steps_per_epoch = t->train.len / t->G;
	if (t->steps_per_epoch < 1)
		return kiln_error(KILN_ECONFIG, "%s: [train] batch %lld x accumulate %lld x %d rank(s) needs %lld training samples a step, more than the %lld there are",
				  kiln_config_where(t->cfg, "train", t->acc > 1 ? "accumulate" : "batch"),
				  (long long)t->B, (long long)t->acc, t->world, (long long)t->G,
				  (long long)t->train.len);
	/* (a typo'd epochs = 0 ran no step and printed a line of nulls, no
	 * word why, before session 50; Lightning says "max_epochs=0 reached") */
	if (!t->tc.epochs && !t->tc.resume && !t->rank)
		kiln_log(KILN_LOG_WARN, "train", "%s: [train] epochs = 0: no step is run: nothing is trained or evaluated, and no checkpoint written",
			 kiln_config_where(t->cfg, "train", "epochs"));
	const int64_t left_out = t->train.len - t->steps_per_epoch * t->G;
	if (left_out && !t->rank)
		kiln_log(KILN_LOG_INFO, "train", "an epoch is %lld step(s) of %lld samples (batch %lld x accumulate %lld x %d rank(s)): %lld of the %lld training samples are left out of each epoch (drop_last)",
			 (long long)t->steps_per_epoch, (long long)t->G, (long long)t->B,
			 (long long)t->acc, t->world, (long long)left_out, (long long)t->train.len);
	/* the evaluations during training: [data.val] when there is one,
	 * else [data.eval] */
	if (t->have_val)
		t->ev = (struct eval_target){ &t->val, t->pvrem, &res->val_loss, &res->val_acc,
					      &res->val_acc5, &res->val_samples, "val" };
	else
		t->ev = (struct eval_target){ &t->test, t->prem, &res->test_loss, &res->test_acc,
					      &res->test_acc5, &res->test_samples, "test" };
	/* where the run starts: 0, or the checkpoint's epoch, step and offset
	 * (offset = steps_per_epoch * G: only the epoch's evaluation is left) */
	t->ep0 = t->pos.epoch;
	t->off0 = t->pos.offset;
	t->step = t->step0 = t->interval_start = t->pos.step;
	kiln_profile_first_step(t->prof, t->step0); /* (the trace's step numbers) */
	t->last_step = trainer_last_step(t);
	t->finite_step = -1;
	t->iv_kept_step = -1;
	/* the schedule runs to last_step, known only now (before session 38
	 * it was prepared before the checkpoint was read, over epochs x this
	 * run's steps per epoch: wrong after a resume that changed the
	 * global batch) */
	kiln_status st = prep_schedule(t);
	if (st)
		return st;
	/* dropout's step is the optimizer step's (a resumed run's: the
	 * checkpoint's, so its masks are the uninterrupted run's) */
	if ((st = kiln_model_drop_set(t->m, t->step, t->compute)))
		return st;
	t->iv_t0 = kiln_now_s(); /* the first log interval starts */
	return trainer_interval_open(t);
}

/* Now, into *at; 0 (so that it chains in trainer_open's ||). */
static int stamp(double *at)
{
	*at = kiln_now_s();
	return 0;
}

/* The set-up's phases (at[i]: when phase i ended), logged at debug level:
 * what the whole run pays before its first step. */
static void log_setup_times(double t0, const double at[8])
{
	kiln_log(KILN_LOG_DEBUG, "train",
		 "set-up %.3f s: config %.3f, device %.3f, data %.3f, model %.3f, buffers %.3f, run directory %.3f, loaders %.3f, loop %.3f",
		 at[7] - t0, at[0] - t0, at[1] - at[0], at[2] - at[1], at[3] - at[2], at[4] - at[3],
		 at[5] - at[4], at[6] - at[5], at[7] - at[6]);
}

/* Every rank's data sets of the same sizes (kiln_dist_agree_sizes): the
 * same config may read another node's other copy at the same path. */
static kiln_status agree_sizes(struct trainer *t)
{
	static const char *const names[] = { "[data]", "[data.eval]", "[data.val]" };
	const int64_t n[] = { t->training ? t->train.len : 0, t->test.len,
			      t->have_val ? t->val.len : 0 };
	return kiln_dist_agree_sizes(t->dist, names, n, 3);
}

/* Every rank's data sets the same (kiln_dist_agree_data): the same sizes
 * may still be another copy's other contents; the identities cost a few
 * file opens (core/data_identity.c), paid only with several ranks. */
static kiln_status agree_data(struct trainer *t)
{
	static const char *const names[] = { "[data]", "[data.eval]", "[data.val]" };
	const struct train_set *sets[] = { &t->train, &t->test, &t->val };
	char *texts[3] = { NULL, NULL, NULL };
	size_t lens[3] = { 0, 0, 0 };
	kiln_status st = KILN_OK;
	if (kiln_dist_world(t->dist) < 2)
		return KILN_OK;
	const double t0 = kiln_now_s();
	for (int i = 0; i < 3 && !st; i++)
		if (sets[i]->ds.ops && (st = kiln_dataset_identity(&sets[i]->ds, &texts[i], &lens[i])))
			st = kiln_error_wrap(st, "rank %d of %d: %s: its identity", t->rank,
					     kiln_dist_world(t->dist), names[i]);
	const double t1 = kiln_now_s();
	if (!st)
		st = kiln_dist_agree_data(t->dist, names, texts, lens, 3);
	if (!st)
		kiln_log(KILN_LOG_DEBUG, "train", "the data sets' identities: %.2f ms to read, %.2f ms to compare",
			 1e3 * (t1 - t0), 1e3 * (kiln_now_s() - t1));
	for (int i = 0; i < 3; i++)
		free(texts[i]);
	return st;
}

kiln_status trainer_open(struct trainer *t, const struct kiln_config *cfg,
			 const struct kiln_registry *reg, const struct kiln_train_cfg *tc,
			 int training, struct kiln_train_result *res)
{
	kiln_status st;
	t->cfg = cfg;
	t->reg = reg;
	t->training = training;
	t->res = res;
	t->world = 1;
	t->out_lock = -1;
	t->t_start = kiln_now_s();
	double at[8] = { 0 };
	if ((st = read_config(t, tc)) || stamp(&at[0]) || (st = open_device(t)) || stamp(&at[1]) ||
	    (st = open_sets(t)) || (st = agree_sizes(t)) || (st = agree_data(t)) || stamp(&at[2]) || (st = build_model(t)) || stamp(&at[3]) ||
	    (st = alloc_buffers(t)) || stamp(&at[4]) || (training && (st = open_run(t))) ||
	    stamp(&at[5]) || (st = open_loaders(t)) || stamp(&at[6]) ||
	    (training && ((st = open_loop(t)) || (st = open_out_dir(t)))) || stamp(&at[7]))
		return kiln_dist_name_own(t->dist, st);
	t->t_fit0 = at[7];
	log_setup_times(t->t_start, at);
	return KILN_OK;
}

/* Device resources, in the order they may be freed: the streams drained,
 * the graphs before the plans, buffers and streams they use, the loaders'
 * workers (they use the device's staging memory) before that memory. */
static void free_device(struct trainer *t)
{
	if (t->compute)
		kiln_device_stream_sync(t->dev, t->compute);
	if (t->copy)
		kiln_device_stream_sync(t->dev, t->copy);
	/* and a pipeline's stages: after a step that failed half enqueued,
	 * the compute stream never waited for them, and their queued passes
	 * read the batch's buffers freed below (before session 48 they could
	 * run on after those frees) */
	kiln_pipe_drain(t->pipe);
	for (int s = 0; s < SLOTS; s++) {
		kiln_device_graph_free(t->dev, t->graph[s]);
		t->graph[s] = NULL;
	}
	kiln_loader_log_stats(t->train.loader, "train");
	kiln_loader_log_stats(t->test.loader, "test");
	kiln_loader_log_stats(t->val.loader, "val");
	kiln_loader_close(t->train.loader);
	kiln_loader_close(t->test.loader);
	kiln_loader_close(t->val.loader);
	t->train.loader = t->test.loader = t->val.loader = NULL;
	for (int s = 0; s < SLOTS; s++) {
		kiln_device_host_free(t->dev, t->x_host[s]);
		kiln_device_host_free(t->dev, t->y_host[s]);
		kiln_device_free(t->dev, t->x_dev[s]);
		kiln_device_free(t->dev, t->y_dev[s]);
		kiln_device_event_destroy(t->dev, t->copy_done[s]);
		kiln_device_event_destroy(t->dev, t->compute_done[s]);
	}
	kiln_device_free(t->dev, t->lr_dev);
	kiln_device_free(t->dev, t->metrics_dev);
	free(t->iv0.rank);
	free(t->iv_all);
	kiln_device_host_free(t->dev, t->metrics_host);
	kiln_device_plan_free(t->dev, t->fill_metrics);
	kiln_device_plan_free(t->dev, t->sched);
	trainer_plateau_free(t);
	kiln_device_free(t->dev, t->x_norm);
	kiln_device_free(t->dev, t->grads_more);
	kiln_device_plan_free(t->dev, t->grads_add);
	kiln_device_free(t->dev, t->seed_d);
	kiln_device_plan_free(t->dev, t->seed_op);
	kiln_device_plan_free(t->dev, t->clip);
	trainer_sums_free(t);
	kiln_device_free(t->dev, t->clip_d);
	kiln_device_host_free(t->dev, t->clip_host);
	kiln_device_plan_free(t->dev, t->fill_counts);
	kiln_device_plan_free(t->dev, t->finite);
	kiln_device_plan_free(t->dev, t->finite_buf);
	kiln_device_free(t->dev, t->finite_d);
	kiln_device_host_free(t->dev, t->finite_host);
	kiln_device_host_free(t->dev, t->scaler_host);
	for (int k = 0; k < NORM_PLANS; k++)
		kiln_device_plan_free(t->dev, t->norm_plan[k]);
}


kiln_status trainer_close(struct trainer *t, kiln_status st)
{
	st = kiln_dist_explain(t->dist, st);
	/* this rank's error, explained (the explaining reads the watchdog's
	 * view of the peers, kept until then): told first, the watchdog ends
	 * the rank no more (a peer failing at the same time marks itself
	 * FAILED during this teardown, review of session 34) */
	/* told before the teardown, which may take seconds (a device's
	 * frees, the goodbyes): a program ended meanwhile has printed it */
	char *keep = st ? kiln_strdup(kiln_last_error()) : NULL;
	if (st) {
		/* (whose failure, for `kiln launch`: out of memory is this
		 * process's own wherever it struck) */
		const int own = st == KILN_ENOMEM ||
				(t->dist ? kiln_dist_failed_own(t->dist) : !t->dist_open_followed);
		kiln_dist_leave(t->dist);
		trainer_error_told_own(st, own);
		trainer_test_delay("KILN_TEST_CLOSE_DELAY_MS");
	}
	/* the final line lost (a full disk) fails a run that succeeded */
	kiln_status lst = kiln_loggers_close(t->log);
	t->log = NULL;
	if (!st && lst) {
		st = lst;
		keep = kiln_strdup(kiln_last_error());
		trainer_error_told(st);
	}
	/* draining and freeing may report the same failure again in other
	 * words (a stream's sticky error): the message that counts is the
	 * one told (kept from before the loggers' close, which may fail too) */
	kiln_ckpt_close(t->resume_ck);
	t->resume_ck = NULL;
	if (t->dev)
		free_device(t);
	kiln_plan_free(t->pvrem);
	if (t->pipe)
		kiln_pipe_free(t->pipe);
	else
		kiln_plan_free(t->ptrain);
	/* the communicator once the pipeline's streams have drained (their
	 * destruction waits for them, and for the rank transport's sends),
	 * since their sends and receives run on it and their passes on the
	 * stage's buffers it may own (before session 30 it closed first) */
	kiln_dist_close(t->dist);
	t->dist = NULL;
	/* the evaluation plans before the stages' devices: a layer's plans
	 * may have been prepared on a stage's device, whose close frees what
	 * is left on it (the seq2seq split on ranks freed its embedding's
	 * plans twice: "double free", exit 134 after a finished run) */
	kiln_plan_free(t->peval);
	kiln_plan_free(t->prem);
	t->peval = t->prem = NULL;
	if (t->m)
		kiln_pipe_devices_close(t->m);
	kiln_model_free(t->m);
	if (t->dev) {
		kiln_device_stream_destroy(t->dev, t->compute);
		kiln_device_stream_destroy(t->dev, t->copy);
	}
	kiln_device_close(t->dev);
	kiln_profile_free(t->prof);
	t->prof = NULL;
	close_set(&t->train);
	close_set(&t->test);
	close_set(&t->val);
	free(t->eval_order);
	kiln_data_scratch_free(&t->scratch);
	free(t->config_text);
	free(t->versions);
	free(t->best);
	free(t->perm);
	free(t->order);
	/* out_dir free for the next run (evaluation's trainer, zeroed, may
	 * never have reached trainer_open: it holds no lock) */
	if (t->training && t->out_lock >= 0)
		close(t->out_lock);
	t->out_lock = -1;
	if (keep)
		kiln_error(st, "%s", keep);
	free(keep);
	return st;
}
