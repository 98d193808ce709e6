/* core/train_setup.h - the steps of trainer_open (core/train_setup.c)
 * that live in files of their own (not installed): the model and its
 * plans (core/train_model.c), the buffers and ops of the steps
 * (core/train_buffers.c). */
#ifndef KILN_TRAIN_SETUP_H
#define KILN_TRAIN_SETUP_H

#include "train.h"

/* train_model.c.  The model and its plans: training's (batch B) and the
 * evaluation's (EB, at most the data, and the last partial batch's);
 * every set's labels and token ids checked against them. */
kiln_status build_model(struct trainer *t);

/* train_buffers.c.  Clipping and the non-finite check ([train]
 * clip_norm, clip_value, skip_nonfinite), before optim_prepare; the
 * staging ring, device slots, metric sums and, training, the schedule and
 * the accumulation buffers. */
kiln_status prep_clip(struct trainer *t);
kiln_status alloc_buffers(struct trainer *t);
/* train_buffers.c.  Training: the learning-rate schedule's op (t->sched),
 * over the run's last step: after open_loop has set t->G, step0 and
 * last_step. */
kiln_status prep_schedule(struct trainer *t);

#endif
