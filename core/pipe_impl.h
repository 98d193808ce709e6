/* core/pipe_impl.h - the pipeline executor's private state, shared by
 * core/pipe_open.c (opening, the local transport, freeing) and
 * core/pipe_run.c (the step, the hand-offs, evaluation's transfers). */
#ifndef KILN_PIPE_IMPL_H
#define KILN_PIPE_IMPL_H

#include "pipeline.h"


/* A message's slot is fixed by its tag (micro-batch, tensor, direction),
 * with events of its own: an event recorded again on another stream while
 * an earlier record is pending could complete the wrong wait, and a tag
 * recurs only a step later, after the stages have joined. */
struct local_msg {
	const void *buf;
	size_t bytes;
	void *sent, *copied;
	int used;
};

struct local_tr {
	struct kiln_device *dev;   /* the copy stream's (stage 0's) */
	struct kiln_device **sdev; /* each stage's, NULL: all dev */
	void *copy;          /* the copy stream (NULL: on the receiver's) */
	int n, n_xfer;       /* slots: micro-batches x tensors x 2 */
	struct local_msg *msg;
};

struct kiln_pipe {
	struct kiln_model *m;
	struct kiln_device *dev;
	void *stream;                /* the trainer's compute stream */
	/* each stage's stream (concurrent where the device runs streams
	 * concurrently: CPU async = 1, CUDA); the step starts after `start`
	 * on the compute stream and the compute stream waits for each
	 * stage's `done`; fdone/bdone[k * P + s]: stage s's forward/backward
	 * of plan k done, which the next stage's pass waits for */
	void *sst[KILN_PIPE_MAX_STAGES], *done[KILN_PIPE_MAX_STAGES], *start;
	void **fdone, **bdone;
	int P, M, K, kind, ticks;
	int early;                   /* [pipeline] early_forwards (1f1b) */
	int A, a;                    /* [train] accumulate: steps per optimizer step, this one's */
	int64_t mb;                  /* micro-batch rows */
	struct kiln_plan **plan;     /* K: one per activation set alive */
	int64_t *steps_d;            /* K dropout counters (kiln/ops.h DROPOUT's
				      * { step, row0, rstride }), 8 i64 apart */
	int64_t *rows_d;             /* A * M: micro-batch j of accumulation
				      * step a's row0, at a * M + j */
	int *slot;                   /* M: the micro-batch's plan */
	char *busy;                  /* K */
	struct kiln_pipe_action *act;
	int lo[KILN_PIPE_MAX_STAGES], hi[KILN_PIPE_MAX_STAGES]; /* layers */
	size_t glo[KILN_PIPE_MAX_STAGES], ghi[KILN_PIPE_MAX_STAGES]; /* trainable slice */
	void *gadd[KILN_PIPE_MAX_STAGES];
	float *grads_more;           /* micro-batches 1.. write here, where a layer
				      * cannot add in its ops (NULL: they add) */
	float **tie;                 /* K: each plan's gradients of tied weights' other users */
	void **xadd;                 /* per crossing tensor: the gradient return's add */
	/* stages on ranks, per crossing tensor that is the data (a stage
	 * whose output is its input, or a view of it: a flatten): the
	 * micro-batch's slice copied here on the stage's stream before it is
	 * sent, since the batch's buffer alternates between steps and the
	 * transport may read the source it was given after the training
	 * thread has enqueued the next step's (pipe_rank.c's send_try reads
	 * its slot's buffer when it runs); made before the first step
	 * (data_buffers), NULL: none */
	void **xdata;
	int n_xdata;
	struct kiln_stage_transport tr;
	struct local_tr local;
	/* stages on ranks (pipe_rank.c): this rank's stage, -1 for all */
	int mine;
	struct kiln_pipe_rank *rk;
	/* kiln_pipe_grads_by_hook: the last micro-batch's backward of this
	 * rank's stage runs with m->grad_final set */
	int hook_final;
	struct kiln_pipe_timing *timing; /* the measured bubble, NULL: none */
	int cur;                     /* the action being issued */
	float *seed_d;               /* the loss layers' seed scale (seed_mean),
				      * NULL: one micro-batch a step, no mean */
	void *seed_op;               /* seed_d = the loss scale / (M x A), at
				      * each optimizer step's start; NULL
				      * without loss scaling */
	int pair;                    /* [pipeline] sendrecv, resolved */
	int zero_copy;               /* [pipeline] zero_copy on a device of host
				      * memory: 1 in one process (share_local),
				      * 2 with stages on ranks (pipe_window.c) */
	unsigned char *shared;       /* which crossing tensors the ranks share,
				      * 2 a tensor (kiln_pipe_window_open) */
	int pair_auto;               /* sendrecv = auto: kiln_pipe_use_ranks
				      * resolves it (kiln_pipe_pair_auto) */
	/* a transport with sendrecv: this rank's last send, held until its
	 * stage's next hand-off (a recv from the same stage pairs with it)
	 * or its next work (xsend, xrecv, xflush) */
	struct {
		int on, from, to;
		uint64_t tag;
		const void *buf;
		size_t bytes;
		void *stream;
	} held;
	/* which sends go paired (kiln_pipe_pairs_plan): pair_with[slot of a send's
	 * tag] = 1 + the slot of the recv it pairs with, 0 alone; n_pair_slots
	 * slots of n_pair_msgs crossing tensors (the ties' included), as the
	 * rank transport's (kiln_pipe_tag_slot).  NULL: nothing pairs. */
	int *pair_with;
	int n_pair_msgs, n_pair_slots;
	/* [pipeline] defer_wgrad (core/pipe_wgrad.c): defer 0 until the first
	 * step decides, 1 on, -1 off; defer_set: written 1 (a warning where
	 * it cannot); wg: the deferred layers and their stages' rings */
	int defer, defer_set;
	struct pipe_wgrad *wg;
	/* defer_wgrad = 1 where the pipeline can at open: the deferred passes
	 * read the plans' own buffers (kiln_plan.wkeep), so a micro-batch's
	 * plan is free for the next only after stage 0's backward of the
	 * micro-batch P - 1 later (kiln_pipe_step), and K counts that */
	int wkeep;
	/* defer_wgrad = auto (want): on while the process waits for a CPU,
	 * re-checked every KILN_PIPE_WAUTO_STEPS steps (kiln_pipe_wgrad_step):
	 * the last reading of the run-queue wait (ns) and its wall time, the
	 * steps since, the busy / quiet readings in a row, the step count */
	struct {
		int want, on, steps, hot, cold;
		int64_t wait_ns, t_ns, step;
	} wauto;
};

/* A message's tag: micro-batch mb, crossing tensor e (the ties' after
 * training's), back 1 for its gradient (kiln_pipe_tag_slot's inverse). */
static inline uint64_t pipe_tag(int mb, int e, int back)
{
	return (uint64_t)mb << 32 | (uint64_t)e << 1 | (uint64_t)back;
}

/* Stage s's device: its own ([run] devices) or the model's. */
static inline struct kiln_device *sdev(const struct kiln_pipe *pp, int s)
{
	return pp->m->stage_dev ? pp->m->stage_dev[s] : pp->dev;
}

/* The n-th (from 0) tied user on another stage than its tensor's owner:
 * its layer, or -1 past the last; *su, *so its stage and the owner's
 * (core/pipe_run.c). */
int pipe_tie_user(const struct kiln_pipe *pp, int n, int *su, int *so);

/* Stages on ranks with [pipeline] sendrecv on a transport with sendrecv:
 * which of every stage's sends pair with the recv after them
 * (pp->pair_with), from the schedule and the crossing tensors alone, so
 * the same on every rank: those whose step cannot deadlock
 * (core/pipe_pairs.c); n_tie: the tied tensors crossing ranks
 * (pipe_tie_user).  This rank's sends left alone for that are logged. */
kiln_status kiln_pipe_pairs_plan(struct kiln_pipe *pp, int n_tie);

/* core/pipe_wgrad.c: stage s's backward of micro-batch j, its linear
 * layers' weight gradients deferred to its side stream where the
 * pipeline can ([pipeline] defer_wgrad); the stage's stream waiting for
 * all of them (at the step's end); the resources; their bytes (the
 * inputs' records, *ws the workspaces). */
kiln_status kiln_pipe_wgrad_backward(struct kiln_pipe *pp, struct kiln_plan *p, int s, int j,
				     const void *x, const void *y, void *metrics);
kiln_status kiln_pipe_wgrad_drain(struct kiln_pipe *pp, int s);
/* At a step's start, before its first pass: the first step decides
 * whether the pipeline can defer; with defer_wgrad = auto, every
 * KILN_PIPE_WAUTO_STEPS steps the run-queue wait of the process's threads
 * since the last reading (KILN_PROC_RUN_WAIT) turns it on after
 * KILN_PIPE_WAUTO_IN_A_ROW readings in a row above KILN_PIPE_WAUTO_BUSY
 * seconds a second, off after as many below. */
kiln_status kiln_pipe_wgrad_step(struct kiln_pipe *pp);
/* At open, before the plans: 1 where defer_wgrad = 1 and nothing known
 * yet rules the split out (the plans then keep what it reads; its
 * ring of copies stays for auto). */
int kiln_pipe_wgrad_keep(const struct kiln_pipe *pp);
/* defer_wgrad = auto's reading: the seconds a second waited since the
 * last good reading (*last_wait ns at *last_t ns), which W (ns waited so
 * far) at T replaces; 0 where W < 0 (unreadable: the last kept) or W
 * dropped (threads exited). */
double kiln_pipe_wauto_rate(int64_t *last_wait, int64_t *last_t, int64_t w, int64_t t);
#define KILN_PIPE_WAUTO_STEPS 4
#define KILN_PIPE_WAUTO_IN_A_ROW 2
#define KILN_PIPE_WAUTO_BUSY 0.25
/* ... after stage s's backward of micro-batch j has sent its inputs'
 * gradients: its stream waits for the weight gradients of micro-batch
 * j - (P - 1 - s), so that at most P - 1 - s are left to run later (the
 * last stage none: each right after its gradients are sent) */
kiln_status kiln_pipe_wgrad_after(struct kiln_pipe *pp, int s, int j);
void kiln_pipe_wgrad_free(struct kiln_pipe *pp);
size_t kiln_pipe_wgrad_bytes(const struct kiln_pipe *pp, size_t *ws);

#endif
