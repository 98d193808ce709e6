/* core/train_resume_batch.c - what a resume with another split of the
 * global batch changes: [train] batch, [train] accumulate, the world size
 * and [pipeline] micro_batches may each change on resume (core/resume.c
 * safe_keys).  The checkpoint's offset must be whole steps of this run's
 * global batch G = batch x accumulate x ranks; a changed G changes the
 * steps per epoch, the schedule's length and lr_scale's rate (warned); an
 * unchanged G split another way (batch 16 x accumulate 1 -> 8 x 2, or 2
 * ranks -> 1 rank x accumulate 2) keeps them, and the run continues as it
 * would have up to float rounding, but where the micro-batches (the
 * samples one forward sees) change: batchnorm's statistics and a loss's
 * mean over the targets it counts are per micro-batch (warned).  See
 * train.h, docs/checkpoints.md. */
#include "train.h"
#include "config_diff.h"

#include <stdio.h>
#include <stdlib.h>

/* [sec] key of the checkpoint's config text `saved` as an integer, or def
 * where the text lacks it; -1 where it is no integer. */
static int64_t saved_int(const char *saved, const char *sec, const char *key, int64_t def)
{
	struct kiln_kv *v = NULL;
	int n = 0;
	int64_t x = def;
	if (!kiln_kv_parse(saved, &v, &n)) {
		const struct kiln_kv *e = kiln_kv_lookup(v, n, sec, key);
		char buf[32], *end;
		if (e && e->val) {
			snprintf(buf, sizeof buf, "%.*s", e->val_n < 31 ? e->val_n : 31, e->val);
			x = strtoll(buf, &end, 10);
			if (end == buf || *end)
				x = -1;
		}
	}
	free(v);
	return x;
}

/* The checkpoint's run's split of its global batch. */
struct split {
	int64_t batch, acc, world, M; /* per rank; accumulate; ranks; micro_batches */
};

/* What is per micro-batch in a model with batchnorm (bn) or a
 * softmax_xent loss (xent). */
static const char *per_micro_batch(int bn, int xent)
{
	return bn && xent ? "batchnorm's batch statistics and the loss's mean over the targets it counts are"
	       : bn       ? "batchnorm's batch statistics are"
			  : "the loss's mean over the targets it counts is";
}

/* A resume whose micro-batches (the samples each forward of a rank sees
 * at once: [train] batch / [pipeline] micro_batches rows, each rank taking
 * every world-th sample of a step's, core/trainer.c epoch_begin) differ
 * from the checkpoint's run's: by their rows (a changed batch or
 * micro_batches), or by the ranks that share a step's samples (another
 * world size: a rank's micro-batch of the same rows holds other samples;
 * accumulate alone changes neither, so 1 process batch 16 x accumulate 1
 * -> 16 x 2 keeps them).  Batchnorm's batch statistics (and how its
 * running statistics move) and a loss's mean over the targets it counts
 * (ignored ones left out) are per micro-batch, so a model with either
 * continues on another path: said here, not refused (before session 32
 * nothing was said; the ResNet example resumed at step 5 with
 * micro_batches 4 -> 1 ended step 10 at test accuracy 0.170 against the
 * uninterrupted run's 0.123; before session 40 a world size changed at
 * the same rows, 2 ranks x 16 -> 1 x 16 x accumulate 2, said nothing). */
static int micro_batch_warn(const struct trainer *t, const struct split *s)
{
	int bn = t->m->n_buf_elems > 0, xent = 0;
	int64_t M = 1;
	kiln_config_get_int(t->cfg, "pipeline", "micro_batches", &M);
	for (int i = 0; i < t->m->n_layers; i++)
		xent |= !strcmp(t->m->layers[i].type->name, "softmax_xent");
	if (s->M < 1 || M < 1 || (!bn && !xent))
		return 0;
	const char *tail = bn ? "" : " where targets are ignored (with none ignored, only the rounding changes)";
	if (s->batch * M != t->B * s->M)
		kiln_log(KILN_LOG_WARN, "train", "resume: a micro-batch changes from %lld rows (batch %lld / micro_batches %lld on each of %lld rank(s)) to %lld (%lld / %lld on %d): %s per micro-batch, so the run will not continue as it would have%s",
			 (long long)(s->batch / s->M), (long long)s->batch, (long long)s->M,
			 (long long)s->world, (long long)(t->B / M), (long long)t->B, (long long)M,
			 t->world, per_micro_batch(bn, xent), tail);
	else if (s->world == t->world)
		return 0;
	else
		kiln_log(KILN_LOG_WARN, "train", "resume: a micro-batch stays %lld rows (batch %lld / micro_batches %lld), but a step's samples are shared by %d rank(s), the checkpoint's run's by %lld (each rank takes every world-th sample of a step's): the micro-batches hold other samples, and %s per micro-batch, so the run will not continue as it would have%s",
			 (long long)(t->B / M), (long long)t->B, (long long)M, t->world,
			 (long long)s->world, per_micro_batch(bn, xent), tail);
	return 1;
}

/* The global batch changed (G0 -> G), or only its split: said (warned:
 * micro_batch_warn said what the micro-batches' change does). */
static void global_batch_note(const struct trainer *t, const struct split *s, int64_t G0,
			      int64_t G, int warned)
{
	if (G0 != G) {
		kiln_log(KILN_LOG_WARN, "train", "resume: the global batch changes from %lld (batch %lld x accumulate %lld x %lld rank(s)) to %lld (%lld x %lld x %d): the run will not continue as it would have (the steps per epoch, the LR schedule's length, and the base lr where [train] lr_scale is set, follow the new batch)",
			 (long long)G0, (long long)s->batch, (long long)s->acc, (long long)s->world,
			 (long long)G, (long long)t->B, (long long)t->acc, t->world);
		return;
	}
	if (s->acc == t->acc)
		return; /* (another world at the same global batch: batch moved) */
	kiln_log(KILN_LOG_INFO, "train", "resume: [train] accumulate changes from %lld to %lld at the same global batch %lld (batch %lld x accumulate %lld x %lld rank(s) -> %lld x %lld x %d): the steps per epoch, the LR schedule and lr_scale's rate are the checkpoint's run's, and the run continues as it would have up to float rounding (the micro-batches' gradients are added in another order)%s",
		 (long long)s->acc, (long long)t->acc, (long long)G, (long long)s->batch,
		 (long long)s->acc, (long long)s->world, (long long)t->B, (long long)t->acc,
		 t->world, warned ? ", bar what the micro-batches' change above does" : "");
}

kiln_status trainer_resume_batch(struct trainer *t, const char *path, const char *saved,
				 struct kiln_ckpt_trainer *tr)
{
	const int64_t samples = t->train.len;
	/* (an older checkpoint's text without the key: its default, 1, and
	 * [pipeline] micro_batches' too) */
	const struct split s = { tr->batch, saved_int(saved, "train", "accumulate", 1), tr->world,
				 saved_int(saved, "pipeline", "micro_batches", 1) };
	/* the offset is global (any world size), in whole steps of this run:
	 * batch x accumulate x world samples each */
	const int64_t G = t->B * t->acc * t->world;
	int64_t G0;
	if (s.acc < 1 || __builtin_mul_overflow(tr->batch * tr->world, s.acc, &G0))
		return kiln_error(KILN_EDATA, "cannot resume from %s: its config's [train] accumulate is no number of micro-batches a step (batch %lld x %lld rank(s))",
				  path, (long long)tr->batch, (long long)tr->world);
	/* an epoch the checkpoint's run finished (its last step's checkpoint,
	 * offset = the samples its global batch used): ended in this run's
	 * steps too, whatever its global batch (refused before session 31:
	 * a finished run could not be extended with another batch; until
	 * session 40 G0 took this run's accumulate) */
	if (G != G0 && tr->offset > 0 && tr->offset == samples / G0 * G0) {
		kiln_log(KILN_LOG_INFO, "train", "resume: the checkpoint's epoch %lld was complete (%lld samples in steps of %lld); it stays complete in steps of %lld",
			 (long long)tr->epoch + 1, (long long)tr->offset, (long long)G0, (long long)G);
		tr->offset = samples / G * G;
	}
	if (tr->offset % G || tr->offset > samples / G * G)
		return kiln_error(KILN_EDATA, "cannot resume from %s: it stopped at sample %lld of an epoch with batch %lld x accumulate %lld x %lld rank(s), which this run (batch %lld x accumulate %lld x %d rank(s) = %lld samples a step) cannot continue: keep the global batch a divisor of the offset",
				  path, (long long)tr->offset, (long long)tr->batch, (long long)s.acc,
				  (long long)tr->world, (long long)t->B, (long long)t->acc, t->world,
				  (long long)G);
	if (tr->world != t->world)
		kiln_log(KILN_LOG_INFO, "train", "resume: the checkpoint was written by %lld rank(s), this run has %d; the data continue at global sample %lld",
			 (long long)tr->world, t->world, (long long)tr->offset);
	global_batch_note(t, &s, G0, G, micro_batch_warn(t, &s));
	t->G_ckpt = G0;
	return KILN_OK;
}
