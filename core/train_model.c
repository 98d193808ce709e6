/* core/train_model.c - the model and its plans (build_model): the model
 * created as the run needs it (whole, bare for a pipeline's stages, or
 * with a ZeRO-1 shard of the state), the streams, its training
 * preparation (precision, initial parameters, clip, optimizer, sync_bn),
 * training's and the evaluation's plans, the checks of every set's
 * labels and token ids against the logits and embeddings, and the
 * workload told to the device.  Part of trainer_open
 * (core/train_setup.c); see train_setup.h.
 */
#include "train_setup.h"

#include <stdio.h>
#include <string.h>


/* The streams and the slots' events. */
static kiln_status open_streams(struct trainer *t)
{
	kiln_status st;
	if ((st = kiln_device_stream_create(t->dev, &t->compute)) ||
	    (st = kiln_device_stream_create(t->dev, &t->copy)))
		return st;
	if (t->prof) {
		kiln_profile_stream_name(t->prof, t->compute, "compute stream");
		kiln_profile_stream_name(t->prof, t->copy, "copy stream");
		kiln_log(KILN_LOG_INFO, "profile",
			 "profiling: every device op of a step is synchronised and timed (the device runs serialised)");
	}
	for (int s = 0; s < SLOTS; s++)
		if ((st = kiln_device_event_create(t->dev, &t->copy_done[s])) ||
		    (st = kiln_device_event_create(t->dev, &t->compute_done[s])))
			return st;
	return KILN_OK;
}

/* Training: precision, the parameters' buffers (a stage's rank: its
 * stage's alone where it can, kiln_dist_pipe_hold), initial parameters,
 * clip, optimizer, sync_bn. */
static kiln_status prepare_training(struct trainer *t)
{
	kiln_status st;
	if ((st = kiln_model_precision_open(t->m, t->reg, t->compute)) ||
	    /* (a stage's rank: its stage alone, whatever [model] init_from
	     * holds, each loader writing the slice alone: kiln_weights_load,
	     * init_from_checkpoint; [train] resume: kiln_dist_pipe_resume.
	     * Before session 39 an llm.c file made the model whole, probed
	     * by an open of its own before the load opened it again) */
	    (t->m->bare && (st = kiln_dist_pipe_hold(t->dist, t->m, t->world > 1, t->compute))) ||
	    (t->m->scaler_d &&
	     (st = kiln_device_host_alloc_named(t->dev, 64, (void **)&t->scaler_host,
						"the loss scaler's state, its host copy"))) ||
	    /* init_from first: kiln_model_init_params draws only what it lacks */
	    (st = kiln_model_init_from(t->m, t->compute)) ||
	    (st = kiln_model_init_params(t->m, (uint64_t)t->run.seed, t->compute)) ||
	    (st = prep_clip(t)) ||
	    (st = kiln_model_optim_prepare(t->m, t->compute)))
		return st;
	if (kiln_dist_sync_bn(t->dist) && t->world > 1) {
		/* [dist] sync_bn: batchnorm layers take the global batch's statistics */
		t->m->group = t->dist;
		t->m->group_ranks = t->world;
		kiln_log(KILN_LOG_INFO, "dist", "sync_bn: batch statistics over the %d %s batches",
			 t->world, t->pipe_P > 1 ? "data-parallel ranks' (the stage's)" : "ranks'");
	}
	return KILN_OK;
}

/* The training plan (no pipeline: kiln_pipe_open makes its own).  With
 * [train] accumulate = A > 1 its loss layers seed their gradient with
 * the loss scale / A (1 / A without loss scaling; kiln_model_seed_open),
 * PyTorch's scaler.scale(loss / A).backward(): each micro-step adds its
 * share of the mean, and nothing scales the sum.  Before session 37 the
 * seed was the scale alone and a pass scaled the summed gradients by
 * 1 / A, which left every low-precision gradient of a micro-step A
 * times PyTorch's: an fp16 loss scale that trained at batch B x A
 * overflowed at batch B x accumulate A (and dynamic scaling settled A
 * times lower, after more skipped steps).  For a power-of-two A f32's
 * numbers are the same bits; for others the rounding is PyTorch's. */
static kiln_status plan_train(struct trainer *t)
{
	kiln_status st;
	if ((st = kiln_model_seed_open(t->m, t->acc, t->compute, &t->seed_d, &t->seed_op)))
		return st;
	t->m->seed_d = t->seed_d;
	t->m->seed_n = t->acc;
	st = kiln_model_plan(t->m, t->B, 1, &t->ptrain);
	t->m->seed_d = NULL;
	return st;
}

/* The training plan's summary (rank 0 logs it) and what it says one step
 * holds, told to the device (KILN_PROC_WORKLOAD: the CPU's async = auto
 * follows it; not for a pipeline, whose stages keep their own streams). */
static kiln_status tell_workload(struct trainer *t)
{
	struct kiln_summary s;
	const int tell = !t->pipe && t->pipe_P <= 1;
	if (!tell && t->rank) {
		kiln_device_flops_count(t->dev, NULL); /* forget the notes */
		return KILN_OK;
	}
	if (kiln_plan_summary(t->ptrain, &s)) {
		if (t->rank == 0)
			kiln_log(KILN_LOG_WARN, "core", "no model summary: %s", kiln_last_error());
		return KILN_OK;
	}
	kiln_status st = KILN_OK;
	if (t->rank == 0 && kiln_summary_log(&s))
		kiln_log(KILN_LOG_WARN, "core", "no model summary: %s", kiln_last_error());
	if (tell) {
		const struct kiln_workload w = {
			.version = KILN_WORKLOAD_VERSION,
			.ranks = t->world,
			.batch = t->B,
			.grad_elems = s.trainable,
			.grad_bytes = s.trainable * (int64_t)sizeof(float), /* f32 gradients */
			.fwd_flops = s.no_flops ? 0.0 : s.flops,
		};
		st = kiln_device_workload(t->dev, &w);
	}
	kiln_summary_free(&s);
	return st;
}

/* The model and its plans: training's (batch B) and the evaluation's
 * (EB, at most the data, and the last partial batch's). */
/* Every label of set (each set the run reads: training's, [data.eval]'s,
 * [data.val]'s) must have a logit row, and every row a label; every label
 * a logit (and a class the loss counts). */
/* Where the logits' width is set: the `out` of the layer the loss reads
 * (a linear's, a conv's), else the loss layer's type line (before session
 * 34 always the latter, though the mistake was an `out`). */
static const char *logits_where(const struct trainer *t)
{
	const struct model_layer *loss = &t->m->layers[t->m->loss_layer];
	const int src = loss->n_in > 0 ? loss->in[0] : -1;
	if (src >= 0 && kiln_config_get(t->cfg, t->m->layers[src].section, "out"))
		return kiln_config_where(t->cfg, t->m->layers[src].section, "out");
	return kiln_config_where(t->cfg, loss->section, "type");
}

static kiln_status check_labels(struct trainer *t, const struct train_set *set)
{
	struct kiln_plan *p = t->training ? t->ptrain : t->peval;
	const struct kiln_tensor_desc *lg = &p->nodes[t->m->loss_layer].l.in[0];
	const int64_t outs = lg->dims[lg->ndim - 1]; /* [B, C] or [B, T, V] */
	int64_t rows = 1; /* a sample's rows of logits: 1, or T */
	for (int k = 1; k + 1 < lg->ndim; k++)
		rows *= lg->dims[k];
	if (rows != set->ds.label_elems) {
		char shape[96];
		int n = snprintf(shape, sizeof shape, "[batch");
		for (int k = 1; k < lg->ndim && n < (int)sizeof shape - 24; k++)
			n += snprintf(shape + n, sizeof shape - (size_t)n, ", %lld", (long long)lg->dims[k]);
		snprintf(shape + n, sizeof shape - (size_t)n, "]");
		return kiln_error(KILN_ECONFIG, "%s: the loss layer '%s' reads logits %s, %lld row(s) of classes a sample, but the data [%s] has %lld label(s) a sample%s: the logits need one row per label ([batch, classes] for a class label, [batch, tokens, vocab] for token labels)",
				  kiln_config_where(t->cfg, t->m->layers[t->m->loss_layer].section, "type"),
				  t->m->layers[t->m->loss_layer].name, shape, (long long)rows,
				  set->ds.section, (long long)set->ds.label_elems,
				  set->ds.label_elems > 1 ? " (tokens)" : "");
	}
	/* the loss layer's own `classes` (a padded vocabulary: fewer than
	 * the logits) is what a label must be below */
	const char *lsec = t->m->layers[t->m->loss_layer].section;
	const int64_t lc = kiln_model_loss_classes(t->m);
	int64_t ign = -1;
	if (kiln_config_get(t->cfg, lsec, "ignore_index"))
		kiln_config_get_int(t->cfg, lsec, "ignore_index", &ign);
	/* the largest label is the ignore_index (a padding class past the
	 * real ones): what the others reach is not known here; the loss op
	 * names any outside [0, classes) */
	if (ign >= 0 && ign == set->ds.classes - 1)
		return KILN_OK;
	/* a source that scanned its labels names the largest, which is in
	 * the data: a corrupt file as likely as too few classes (before
	 * session 38 the tokens source gave its `vocab`, a padded one too,
	 * and the advice, to count the padding as classes, was wrong) */
	if (lc > 0 && lc < outs && lc < set->ds.classes && set->ds.info.classes_from)
		return kiln_error(KILN_ECONFIG, "%s: the loss layer '%s' counts %lld classes but the data [%s] has a label %lld (the largest, at %s): a label must be below classes; check the data, or set classes = %lld if it is a class",
				  kiln_config_where(t->cfg, lsec, "classes"),
				  t->m->layers[t->m->loss_layer].name, (long long)lc, set->ds.section,
				  (long long)set->ds.classes - 1, set->ds.info.classes_from,
				  (long long)set->ds.classes);
	if (lc > 0 && lc < outs && lc < set->ds.classes)
		return kiln_error(KILN_ECONFIG, "%s: the loss layer '%s' counts %lld classes but the data [%s] has %lld: set classes = %lld (or 0: every logit a class)",
				  kiln_config_where(t->cfg, lsec, "classes"),
				  t->m->layers[t->m->loss_layer].name, (long long)lc, set->ds.section,
				  (long long)set->ds.classes, (long long)set->ds.classes);
	if (outs < set->ds.classes) {
		/* the labels' file where the source has one (idx): a corrupt
		 * one is as likely as a wrong `out`.  The set's own only: an
		 * evaluation set without `labels` reads its own files, never
		 * [data]'s training labels, which it would name wrongly */
		const char *sec = set->ds.section, *lab = kiln_config_get(t->cfg, sec, "labels");
		char from[4400] = "";
		if (lab && *lab)
			snprintf(from, sizeof from, " (labels = %s, %s: its largest label is %lld)", lab,
				 kiln_config_where(t->cfg, sec, "labels"),
				 (long long)set->ds.classes - 1);
		else if (set->ds.info.classes_from)
			snprintf(from, sizeof from, " (the largest label, %lld, is at %s)",
				 (long long)set->ds.classes - 1, set->ds.info.classes_from);
		return kiln_error(KILN_ECONFIG, "%s: the model has %lld outputs but the data [%s] has %lld classes%s: set out = %lld on the last layer, or check the labels",
				  logits_where(t),
				  (long long)outs, set->ds.section, (long long)set->ds.classes, from,
				  (long long)set->ds.classes);
	}
	return KILN_OK;
}

/* Token ids (i32 samples) of set must be rows of every embedding that
 * reads them: an id past an embedding's vocab fails in its forward, naming a
 * position in the batch, where the data's vocabulary says so now. */
static kiln_status check_token_vocab(struct trainer *t, const struct train_set *set)
{
	/* (token windows: their labels are the next tokens, so the labels'
	 * classes are the ids' vocabulary; class labels of i32 samples say
	 * nothing of the ids) */
	if (set->ds.sample.dtype != KILN_I32 || set->ds.classes <= 0 ||
	    set->ds.label_elems <= 1)
		return KILN_OK;
	for (int i = 0; i < t->m->n_layers; i++) {
		const struct model_layer *L = &t->m->layers[i];
		int64_t v = 0;
		if (strcmp(L->type->name, "embedding") || L->n_in < 1 || L->in[0] >= 0 ||
		    kiln_config_get_int(t->cfg, L->section, "vocab", &v) || v >= set->ds.classes)
			continue;
		/* the shard and place of the largest id, where the source knows
		 * it (ABI 2.21): one corrupt shard is as likely as a wrong vocab */
		char at[4400] = "";
		if (set->ds.info.classes_from)
			snprintf(at, sizeof at, ", the largest at %s", set->ds.info.classes_from);
		return kiln_error(KILN_ECONFIG, "%s: layer '%s' (embedding) has vocab = %lld but the data [%s] has token ids up to %lld (a vocabulary of %lld%s): set vocab = %lld",
				  kiln_config_where(t->cfg, L->section, "vocab"), L->name, (long long)v,
				  set->ds.section, (long long)set->ds.classes - 1,
				  (long long)set->ds.classes, at, (long long)set->ds.classes);
	}
	return KILN_OK;
}

/* [run] devices: a device instance per stage in one process.  With
 * [dist] pipeline each rank runs one stage, on [run] device with all its
 * threads: the devices are not opened, and rank 0 says so (before
 * session 38 each rank opened every stage's and ran its own on one with
 * a 1/P share of its threads, silently; the numbers are the same). */
static kiln_status stage_devices(struct trainer *t)
{
	int n = 0;
	kiln_status st;
	if (t->pipe_P <= 1)
		return kiln_pipe_devices_open(t->reg, t->m);
	if ((st = kiln_pipe_devices_count(t->cfg, &n)))
		return st;
	if (n && t->rank == 0)
		kiln_log(KILN_LOG_WARN, "pipeline", "%s: [run] devices (%d) is not used with [dist] pipeline = %d: each rank runs its stage on [run] device with all its threads (docs/pipeline.md)",
			 kiln_config_where(t->cfg, "run", "devices"), n, t->pipe_P);
	return KILN_OK;
}

kiln_status build_model(struct trainer *t)
{
	const int do_eval = !t->training || t->tc.eval;
	struct train_set *first = t->training ? &t->train : &t->test;
	kiln_status st;
	if (t->training)
		kiln_rss(&t->rss0, NULL, 1);
	/* (t->world: the data-parallel world; [dist] pipeline equal to the
	 * world averages nothing, so its gradients need no shared memory) */
	/* (stages on ranks: the buffers of the parameters come in
	 * prepare_training, the stage's alone where they can) */
	/* (ZeRO-1 without stages: no whole optimizer state, each rank makes
	 * its shard, kiln_dist_zero_init) */
	/* (evaluation alone: the weights, no gradients nor optimizer state,
	 * which an evaluation's checkpoint load skips, KILN_CKPT_LOAD_WEIGHTS) */
	if ((st = !t->training ? kiln_model_create_infer(t->cfg, t->reg, t->dev, &first->input, NULL,
							 &t->m)
		  : (t->pipe_P > 1		? kiln_model_create_bare
		     : kiln_dist_zero(t->dist) ? kiln_model_create_sharded
					       : kiln_model_create)(t->cfg, t->reg, t->dev,
								    &first->input, &t->m)))
		return st;
	/* its plans that do not train are evaluations: the loss layer adds
	 * the rows it counted, by which core/train_eval.c divides */
	t->m->eval_counted = 1;
	/* (and with stages: each rank makes its shard of its stage's state,
	 * kiln_dist_zero_init; before session 30 the whole model's state was
	 * made at start-up, the shard cut from it) */
	if (t->training && t->pipe_P > 1 && kiln_dist_zero(t->dist))
		t->m->state_sharded = 1;
	/* ([dist] pipeline: the stage's, kiln_dist_pipe_cut_grads) */
	if ((t->training && t->world > 1 && t->pipe_P <= 1 &&
	     (st = kiln_dist_share_grads(t->dist, t->m))) ||
	    (st = open_streams(t)))
		return st;
	if (t->training) {
		/* dropout draws by the global batch's rows: this rank's are
		 * drank, drank + world, ... (kiln_shard's interleaving), the
		 * micro-steps' B * world rows apart (core/trainer.c) */
		if ((st = kiln_model_drop_layout(t->m, t->drank, t->world, t->B * t->world, t->acc)) ||
		    (st = prepare_training(t)))
			return st;
		int pipe = 0;
		if ((st = kiln_pipe_wanted(t->cfg, t->m, &pipe)))
			return st;
		kiln_device_flops_record(t->dev, 1); /* the ops' FLOPs, for the summary */
		if ((st = stage_devices(t)))
			return st;
		if (pipe && !(st = kiln_pipe_open(t->m, t->B, t->acc, t->world, t->compute, &t->pipe))) {
			t->ptrain = kiln_pipe_plan0(t->pipe);
			t->graph_mode = -1; /* issued op by op */
			st = trainer_pipe_ranks(t);
		} else if (!pipe && t->pipe_P > 1) {
			st = kiln_error(KILN_ECONFIG, "%s: [dist] pipeline = %d, but the model has one stage: place layers with [layer.X] stage or [model] stages",
					kiln_config_where(t->cfg, "dist", "pipeline"), t->pipe_P);
		} else if (!pipe) {
			/* (the gradients' check in the backward: a plan's) */
			st = plan_train(t);
			if (!st)
				st = trainer_sums_open(t);
		}
		kiln_device_flops_record(t->dev, 0);
		if (st)
			return st;
	}
	/* evaluation alone: [run] precision's compute dtype, as training's
	 * evaluation has it (the weights, loaded later, are cast then), and
	 * no loss scaler, which nothing would read (before session 42 fp16
	 * allocated one and logged its scale); the caller (eval_open) loads
	 * every weight after trainer_open: none is drawn */
	if (!t->training && ((st = kiln_model_compute_open(t->m, t->reg)) ||
			     (st = kiln_model_init_loaded(t->m, t->compute))))
		return st;
	if (do_eval) {
		if (t->EB > t->test.len)
			t->EB = t->test.len;
		/* (a stage's rank holding its stage's alone evaluates per stage:
		 * core/dist_pipe_eval.c) */
		t->m->plan_staged = t->eval_staged = t->training && kiln_dist_pipe_eval_staged(t->dist);
		if ((st = kiln_model_plan(t->m, t->EB, 0, &t->peval)) ||
		    (t->test.len % t->EB &&
		     (st = kiln_model_plan(t->m, t->test.len % t->EB, 0, &t->prem))) ||
		    (t->have_val && t->val.len % t->EB &&
		     (st = kiln_model_plan(t->m, t->val.len % t->EB, 0, &t->pvrem))))
			return st;
		t->m->plan_staged = 0;
		/* (their receives marked in training's slots: never past them) */
		if (t->eval_staged &&
		    ((st = kiln_pipe_eval_check(t->pipe, t->peval)) ||
		     (t->prem && (st = kiln_pipe_eval_check(t->pipe, t->prem))) ||
		     (t->pvrem && (st = kiln_pipe_eval_check(t->pipe, t->pvrem)))))
			return st;
	}
	/* every set the run reads, the evaluation's too: an eval label past
	 * the outputs trained a whole epoch, then failed in the loss op's
	 * forward naming no file (session 33) */
	const struct train_set *const sets[] = { first, t->training && do_eval ? &t->test : NULL,
						 t->have_val ? &t->val : NULL };
	for (size_t i = 0; i < KILN_ARRAY_LEN(sets); i++)
		if (sets[i] && ((st = check_labels(t, sets[i])) || (st = check_token_vocab(t, sets[i]))))
			return st;
	if (t->training)
		kiln_log(KILN_LOG_INFO, "core",
			 "model: %d parameters tensors, %zu floats; activation arena %.2f MiB (%.2f MiB without lifetime packing)",
			 kiln_model_param_count(t->m), kiln_model_param_elems(t->m),
			 (double)kiln_plan_arena_bytes(t->ptrain) / 1048576.0,
			 (double)kiln_plan_naive_bytes(t->ptrain) / 1048576.0);
	return t->training ? tell_workload(t) : KILN_OK;
}
