/* core/graph.h - the model (layers + flat parameter buffers) and its plans
 * (one per batch size and mode, each with its own activation arena). */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "internal.h"

#define KILN_MAX_LAYERS 1024

struct model_layer {
	char *name;    /* "fc1" */
	char *section; /* "layer.fc1" */
	const struct kiln_plugin *type;
	char *file;    /* the plugin file type came from; NULL: built-in */
	int n_in;
	int in[KILN_LAYER_MAX_INPUTS]; /* producer index, -1 = the data */
	int trainable;
	int n_params;
	int pidx[KILN_LAYER_MAX_PARAMS]; /* model_param index of the layer's k-th */
	/* weight tying (core/tie.c): [layer.X] tie = Y makes X's `weight`
	 * Y's tensor.  tie: Y's index in X, else -1.  tie_slot: the slot of
	 * the layer's shared weight (tied, or tied to), else -1.  tie_grad:
	 * >= 0 when this layer's backward writes that weight's gradient at
	 * m->tie_grads_d + tie_grad, for tie_add to add it in after the
	 * backward of the tensor's grad_layer; -1: in place. */
	int tie, tie_slot;
	int64_t tie_grad;
	void *tie_add;
};

struct model_param {
	char name[160];               /* "fc1.weight" */
	struct kiln_tensor_desc desc;
	int init;
	int64_t fan_in;
	int layer;
	int trainable;
	int buffer;                   /* 1: non-trained state, in the buffers region */
	int nonneg;                   /* KILN_PARAM_NONNEG: values must be >= 0 */
	int slot;                     /* k: the layer's k-th parameter */
	int grad_layer;               /* the layer whose backward completes the
				       * gradient: `layer`, or for a tied tensor
				       * its lowest-indexed user (core/tie.c) */
	size_t off;                   /* elements into params (or buffers) */
	int64_t numel;
	int given;                    /* loaded from a file since the last
				       * kiln_model_init_params: not drawn */
};

struct kiln_model {
	const struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_tensor_desc sample; /* one sample, no batch dim */
	int n_layers;
	struct model_layer *layers;
	int loss_layer;
	int n_params;
	struct model_param *params;
	size_t n_elems;      /* all parameters */
	size_t n_trainable;  /* leading elements the optimizer updates */
	size_t n_buf_elems;  /* the buffers region (batchnorm running stats) */
	float *params_d, *grads_d, *buffers_d;
	float *tie_grads_d;  /* the gradients of the tied tensors' other users (core/tie.c) */
	size_t n_tie_elems;
	int grads_foreign;   /* grads_d is the communicator's (kiln_dist_share_grads): not freed here */
	/* bare: created without params_d, grads_d and state_d yet
	 * (kiln_model_create_bare).  held: a pipeline stage's rank created
	 * with its stage's slice alone (core/dist_pipe_mem.c): params_d and
	 * grads_d keep the whole model's offsets but address [held_lo,
	 * held_hi) only, state_d is NULL (the dist holds the stage's), and
	 * the dist owns the allocations until kiln_dist_pipe_mem_free */
	int bare, held;
	size_t held_lo, held_hi;
	/* created for inference (kiln_model_create_infer): params_d without
	 * grads_d, state_d and tie_grads_d; a training plan is refused */
	int weights_only;
	/* created without state_d (kiln_model_create_sharded): ZeRO-1's
	 * ranks each allocate their shard of it (core/dist_zero.c) */
	int state_sharded;
	int layout;          /* KILN_NCHW or KILN_NHWC, from [model] layout */
	int fuse;            /* [run] fuse: activations into the layer before */
	uint64_t seed;
	int64_t *step_d;     /* device i64[1]: micro-steps done (batchnorm's
			      * num_batches_tracked; the "step" checkpointed) */
	void *step_plan;     /* COUNTER_ADD of 1 (step_d, drop_d and opt_step_d) */
	/* dropout's counter, device i64[KILN_DROP_CTR] = { optimizer steps,
	 * row0, rstride } (kiln/ops.h DROPOUT), in step_d's allocation: the
	 * training plans' layers read it (a pipeline's, a copy per micro-
	 * batch: core/pipe_run.c).  Row n of a micro-step's batch is row
	 * row0 + n * rstride of the optimizer step's global batch; the
	 * trainer sets the layout (kiln_model_drop_layout: rank r of W holds
	 * global rows r, r + W, ..., micro-step j from row j * drop_rows) and
	 * the step (kiln_model_drop_set, from the trainer's step on resume:
	 * no checkpoint section) */
	int64_t *drop_d;
	int64_t drop_row0, drop_rstride; /* micro-step 0's (default 0, 1) */
	int64_t drop_rows, drop_acc;     /* global rows per micro-step, micro-steps per step */
	void *drop_rows_plan[2];         /* COUNTER_ADD of drop_rows, of -(drop_acc-1) * drop_rows */
	int64_t tracked_base; /* batchnorm num_batches_tracked loaded with the weights */
	/* The optimizer ([train] optimizer and its keys), chosen and its
	 * buffers allocated at create; kiln_model_optim_prepare fills them. */
	const struct kiln_optim_ops *optim; /* [train] optimizer's table (core/optim/) */
	void *optim_ctx;
	const char *optim_name;
	struct kiln_optim_info optim_info;
	int state_slots;     /* f32 state per trainable element (optim_info's):
			      * SGD 1 (0 without momentum), AdamW and LAMB 2 */
	float *state_d;      /* [state_slots][n_trainable], NULL when no slots */
	float *wd_mult_d;    /* f32[n_trainable]: 0 for [train] no_decay parameters,
			      * else 1; NULL without patterns (no groups) or
			      * before kiln_model_optim_prepare; a rank holding
			      * its stage alone (held) has [held_lo, held_hi)
			      * only, wd_mult_buf being its allocation */
	float *wd_mult_buf;
	int wd_groups;       /* [train] no_decay has patterns: wd_mult_d comes */
	int64_t *offsets_d;  /* needs_offsets (LAMB): i64[T+1], the T trainable tensors' starts, then n_trainable */
	int64_t n_tensors;   /* T: trainable parameter tensors */
	int64_t *opt_step_d; /* device i64[1]: optimizer steps taken (Adam's t) */
	void *opt_step_plan; /* gated COUNTER_ADD of 1 on opt_step_d (with step_ok_d:
			      * a skipped step is not counted), else NULL */
	void *optim_plan;
	void *optim_ws;      /* the optimizer's workspace, the most any of its
			      * plans asks for (LAMB), optim_ws_bytes */
	size_t optim_ws_bytes;
	/* gradient accumulation ([train] accumulate, a pipeline's micro-
	 * batches): backward writes the parameter gradients to grad_out_d
	 * (NULL: grads_d itself), or with grad_accum adds them into it (the
	 * layers' dw_accum, ABI 2.9: beta = 1 in their weight-gradient ops;
	 * only where kiln_model_grad_accum_ok says every layer can) */
	float *grad_out_d;
	int grad_accum;
	/* device f32[1] set before kiln_model_optim_prepare: the optimizer
	 * step happens only when it is nonzero (KILN_OP_GRAD_CLIP's flag) */
	const float *step_ok_d;
	/* mixed precision (core/precision.c): [run] precision's policy and
	 * its loss scaler.  scaler_d: device f32[4] (scale, growth tracker,
	 * hysteresis left, overflowing steps), NULL without loss scaling;
	 * loss layers multiply their gradient by scaler_d[0] (or by seed_d,
	 * below: it / the micro-batches a step averages). */
	const struct kiln_precision_ops *prec_ops;
	void *prec_ctx;
	struct kiln_scaler_config scaler;
	float *scaler_d;
	void *scaler_plan;   /* KILN_OP_SCALER_UPDATE, dynamic scaling only */
	/* data-parallel training (core/dist.c): called after the backward of
	 * layer i has been enqueued on `stream` (every layer, in backward
	 * order), so gradient buckets can start their allreduce.  NULL: none. */
	kiln_status (*bwd_hook)(void *user, int layer, void *stream);
	void *bwd_user;
	/* set while the backward being issued is an optimizer step's last
	 * accumulation of a pipeline stage's gradients (its last micro-batch,
	 * kiln_pipe_grads_by_hook): the hook may start their collectives */
	int grad_final;
	/* ... and before layer i's forward ops are issued on `stream` (every
	 * forward, training or evaluation, layers in order), so ZeRO-1 can
	 * make the stream wait for the parameter allgathers layer i reads;
	 * layer = n_layers before an op that reads every parameter (the
	 * compute copy's refresh).  NULL: none. */
	kiln_status (*fwd_hook)(void *user, int layer, void *stream);
	void *fwd_user;
	/* Low-precision compute (docs/precision.md): the dtype of activations,
	 * their gradients and the weights layers read (KILN_F32, KILN_BF16,
	 * KILN_F16).  Not f32: params_c is the compute copy of params_d
	 * (n_elems elements of cdtype, same offsets), written by the optimizer
	 * op in its pass and by pcast_plan (a CAST of every parameter) before
	 * the next forward whenever the f32 parameters may have changed
	 * outside it (init, loading, a checkpoint, kiln_model_param_get):
	 * pcopy_stale. */
	int cdtype;
	void *params_c;
	void *pcast_plan;
	int pcopy_stale;
	/* Counts the writes into the parameters outside the optimizer's step
	 * (each sets pcopy_stale too: kiln_model_weights_written); a frozen
	 * plan (kiln_plan_opts.frozen) tells its device when it changed since
	 * the plan's last run (KILN_PROC_WEIGHTS_CHANGED). */
	uint64_t wgen;
	/* wgen + 1 when a frozen plan last told the device (0: never): once
	 * per write for all the model's plans, a plan made after the write
	 * included, since a device may share what it made of the weights
	 * between plans (the CPU's INT8 weights, plugins/cpu/qweights.c) */
	uint64_t wgen_told;
	/* [dist] sync_bn: the data-parallel group (a struct kiln_dist,
	 * host->group_* 's handle) and its size, set before the training plan
	 * is made; layers then see kiln_layer.sync_ranks = group_ranks and,
	 * in training runs, kiln_layer_run.group.  0 / NULL: none. */
	void *group;
	int group_ranks;
	/* pipeline stages (core/pipeline.h): stage[i] of layer i, NULL when
	 * the config places nothing (one stage) */
	int *stage;
	int n_stages;
	/* [model] stages = auto (pipe_stages.c): each layer's estimated cost
	 * (FLOPs a sample, forward and backward, and stage_fpb FLOPs a byte
	 * moved: kiln_pipe_layer_cost), counted once and kept, so every later
	 * read cuts the same; NULL until then */
	double *stage_cost;
	double stage_fpb;    /* [model] stages_flops_per_byte they counted */
	int stage_said;      /* the auto cut has been logged */
	int recompute_said;  /* [layer.X] recompute = 1 that recomputes nothing
			      * has been said (plan.c) */
	int plan_staged;     /* plans made now are a pipeline's (pipe_run.c) */
	int plan_wkeep;      /* ... whose deferred weight gradients read the
			      * plan's own buffers ([pipeline] defer_wgrad = 1,
			      * core/pipe_wgrad.c): kiln_plan.wkeep */
	/* set by the trainer on its model: its plans that do not train are
	 * evaluations, whose loss layer adds sums and the rows it counted
	 * (kiln_layer.eval_sums, ABI 2.27; kiln_plan_eval_counts) */
	int eval_counted;
	/* set while the trainer makes its training plan with [train]
	 * accumulate > 1, or a pipeline its plans (pipe_open.c): device
	 * f32[1], the loss scale / (micro-batches x accumulate)
	 * (kiln_model_seed_open), that their loss layers multiply their
	 * gradient seed by instead of scaler_d[0], so that the gradients
	 * come out as the step's mean with no scale pass after the last
	 * micro-batch; NULL: none */
	const float *seed_d;
	int64_t seed_n;      /* that n while seed_d is set (its messages) */
	/* [run] devices: stage s's device instance (core/pipe_devices.c;
	 * the pipeline's), NULL when every stage runs on dev */
	struct kiln_device **stage_dev;
};

/* core/graph_params.c: the initial value of element e of p under seed
 * (PyTorch's default init for p->init, a pure function of (seed, layer,
 * slot, e): any e below 2^60), and elements [e0, e0 + n) of them into
 * v (caller's, n floats), the same numbers drawn 16 at a time. */
float kiln_param_init_value(const struct model_param *p, uint64_t seed, int64_t e);
void kiln_param_init_run(const struct model_param *p, uint64_t seed, int64_t e0, int64_t n,
			 float *v);

/* core/tie.c, weight tying.  Read every [layer.X] tie (layer indices
 * into tie, KILN_ECONFIG naming file:line); before the layers are
 * inferred. */
kiln_status kiln_model_read_ties(struct kiln_model *m);
struct plan_node;
/* Find the tied `weight` slots in the inferred layers (tie_slot) and
 * check that each pair matches in shape, dtype and trainable; before the
 * parameters are laid out, which leaves X's tied slot to ... */
kiln_status kiln_model_tie_slots(struct kiln_model *m, const struct plan_node *nodes);
/* Layer i's tied slot, at the layout: the tensor's Y (whose name and
 * initial values it has) where i is the group's first user in layer
 * order, else -1 (it reads the tensor laid out there).  The tensor sits
 * with its first user's parameters: a pipeline stage's are contiguous and
 * the tensor is the stage's of that user (its grad_layer; pipeline.h). */
int kiln_model_tie_owner(const struct kiln_model *m, int i);
/* ... this: point it at Y's tensor, set grad_layer and the gradient
 * slices (tie_grad, n_tie_elems). */
void kiln_model_tie_link(struct kiln_model *m);
/* Allocate tie_grads_d and prepare the adds; after the model's buffers. */
kiln_status kiln_model_tie_prepare(struct kiln_model *m);
void kiln_model_tie_free(struct kiln_model *m);
/* Where layer i's backward writes the gradient of its slot k (NULL:
 * frozen), given the gradient buffer of this micro-step. */
float *kiln_model_grad_dst(const struct kiln_model *m, float *grads, int i, int k);
/* Enqueue, after layer i's backward, the adds of the other users'
 * gradients of the tied tensors whose grad_layer is i. */
kiln_status kiln_model_tie_grads(struct kiln_model *m, int i, void *stream);
/* The parameter whose alias `name` is ("X.weight" of a tied X), else -1. */
int kiln_model_tie_alias(const struct kiln_model *m, const char *name);
/* core/plan_run.c.  1 when the backward can add every parameter gradient
 * into the buffer (grad_accum, kiln_layer_run.dw_accum) on the micro-steps
 * after an optimizer step's first: every layer with trainable parameters
 * was built for ABI 2.9 or later (a built-in one always is), and no user
 * of a tied weight that writes it beside (tie_grad) has another trainable
 * parameter (one dw_accum covers all of a layer's).  0: the caller writes
 * beside the gradients and adds. */
int kiln_model_grad_accum_ok(const struct kiln_model *m);

/* core/precision.c.  Open [run] precision's policy (the amp plugin) and,
 * when it scales the loss, allocate and set the scaler state; before any
 * plan is made (loss layers plan with the scale input) and before a
 * checkpoint is restored.  Waits for the stream.  fp32 without the amp
 * plugin is no policy at all. */
kiln_status kiln_model_precision_open(struct kiln_model *m, const struct kiln_registry *reg,
				      void *stream);
/* [run] precision's compute dtype alone, for a model that is never
 * trained (generation, `kiln eval`, `kiln predict` and the inference API):
 * the policy opened and the dtype set as kiln_model_precision_open does,
 * no loss scaler (before session 41 `kiln generate`, before session 42
 * eval and predict, under fp16 allocated one and logged its scale, which
 * nothing read).  Freed by kiln_model_precision_close. */
kiln_status kiln_model_compute_open(struct kiln_model *m, const struct kiln_registry *reg);
/* The unscale op (KILN_OP_UNSCALE over the trainable gradients, clipping
 * with clip_norm / clip_value; the caller owns *unscale, NULL without
 * loss scaling) and, for dynamic scaling, the model's scale update. */
kiln_status kiln_model_precision_prepare(struct kiln_model *m, double clip_norm,
					 double clip_value, void **unscale);
/* Enqueue the scale update after an optimizer step; gate is the unscale
 * op's state f32[4].  Nothing without dynamic scaling. */
kiln_status kiln_model_precision_update(struct kiln_model *m, const float *gate, void *stream);
/* The loss layers' gradient seed for a step that is the mean over n
 * micro-batches ([train] accumulate, a pipeline's micro-batches x
 * accumulate), PyTorch's scaler.scale(loss / n).backward(): device
 * f32[1], the loss scale (1 without scaling) / n, which a training plan
 * made while m->seed_d points at it multiplies its loss gradient by.
 * Every micro-batch's gradient is then its share of the mean from the
 * start, so low-precision gradients have the headroom PyTorch's have (a
 * mean taken after the sum left them n times larger: an fp16 loss scale
 * n times smaller fit) and no pass scales the sum.  After
 * kiln_model_precision_open.  n <= 1: *seed = *plan = NULL.  Without
 * loss scaling the seed is written once (waits for the stream), and
 * *plan is NULL; with it *plan is the op that sets the seed from the
 * scale, which kiln_model_seed_update enqueues before each optimizer
 * step's first forward (the scale moves after the optimizer, and a
 * resume restores it).  The caller frees both (kiln_device_free,
 * kiln_device_plan_free). */
kiln_status kiln_model_seed_open(struct kiln_model *m, int64_t n, void *stream, float **seed,
				 void **plan);
/* seed = scaler_d[0] / n on the stream; nothing when plan is NULL. */
kiln_status kiln_model_seed_update(const struct kiln_model *m, float *seed, void *plan,
				   void *stream);
/* Free what kiln_model_precision_open and _prepare made; idempotent. */
void kiln_model_precision_close(struct kiln_model *m);

/* core/optim/optim.c, for kiln_model_create and kiln_model_free: find
 * [train] optimizer in reg and open it (its keys checked, KILN_ECONFIG
 * naming file:line); allocate the optimizer's device buffers but its
 * state (kiln_model_alloc_whole's); free them, the plan and the
 * optimizer. */
kiln_status kiln_model_optim_configure(struct kiln_model *m, const struct kiln_registry *reg);
kiln_status kiln_model_optim_alloc(struct kiln_model *m);
/* kiln_model_create without the parameters', gradients' and optimizer
 * state's buffers (m->bare): before anything reads them the caller gives
 * them, kiln_model_alloc_whole's or a stage's slice alone
 * (kiln_dist_pipe_hold).  Ownership as kiln_model_create's. */
kiln_status kiln_model_create_bare(const struct kiln_config *cfg, const struct kiln_registry *reg,
				   struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				   struct kiln_model **out);
/* kiln_model_create without the optimizer state's buffer (state_d
 * NULL, m->state_sharded): for ZeRO-1, whose ranks each allocate their
 * shard of the state alone (kiln_dist_zero_init), so that the whole
 * state is never held.  Ownership as kiln_model_create's. */
kiln_status kiln_model_create_sharded(const struct kiln_config *cfg, const struct kiln_registry *reg,
				      struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				      struct kiln_model **out);
/* A model that never trains (inference, evaluation, export): the
 * parameters' and buffers' device memory without the gradients', the
 * optimizer state's and the tied weights' gradients' (m->weights_only; its
 * training plans are refused, kiln_model_param_get's grad is NULL, a
 * checkpoint loads into it with KILN_CKPT_LOAD_WEIGHTS alone).  With pre,
 * pre->check(pre->arg, m) is called once the parameter table (names,
 * offsets, sizes, dtypes, shapes) is laid out and before any device memory
 * is allocated: a nonzero status fails the creation with it
 * (kiln_trained_open: a checkpoint's table, so that a corrupt "sample"
 * section is refused before its shapes are allocated).  pre may be NULL.
 * Ownership as kiln_model_create's. */
struct kiln_model_precheck {
	kiln_status (*check)(void *arg, const struct kiln_model *m);
	void *arg;
};
kiln_status kiln_model_create_infer(const struct kiln_config *cfg, const struct kiln_registry *reg,
				    struct kiln_device *dev, const struct kiln_tensor_desc *sample,
				    const struct kiln_model_precheck *pre, struct kiln_model **out);
/* A bare model's whole buffers, as kiln_model_create allocates them
 * (the optimizer state's but where m->state_sharded). */
kiln_status kiln_model_alloc_whole(struct kiln_model *m);
/* A failed allocation (st) for the model's parameters, said in the
 * model's terms: `the model's WHAT (BYTES, FLOATS floats; the largest
 * tensor 'NAME' SHAPE)` (BYTES in GiB from 1 GiB up, else in bytes; a
 * shape typed wrong, `out = 1000000000`, shows as the largest tensor).
 * Returns st, the message wrapped around the device's. */
kiln_status kiln_model_alloc_failed(const struct kiln_model *m, kiln_status st, const char *what,
				    size_t bytes, size_t floats);
void kiln_model_optim_free(struct kiln_model *m);
/* core/graph.c: a weights-only model's parameters and buffers freed on its
 * device (after stream is waited for), its layers and parameter table
 * kept: what folding reads once the weights are copied to host memory
 * (kiln_infer_fold_read).  Nothing may plan or run m afterwards; free it
 * with kiln_model_free. */
kiln_status kiln_model_weights_free(struct kiln_model *m, void *stream);
/* core/graph.c: enqueue step_d's advance alone (one micro-step or
 * pipeline micro-batch done: batchnorm's count). */
kiln_status kiln_model_count_advance(struct kiln_model *m, void *stream);
/* Enqueue drop_d's step advance alone (a pipeline's optimizer step). */
kiln_status kiln_model_drop_step(struct kiln_model *m, void *stream);
/* core/graph.c: dropout's counter (drop_d).  The layout of this process's
 * rows in the optimizer step's global batch: micro-step 0's row n is
 * global row row0 + n * rstride, micro-step j's rows follow `rows` global
 * rows later, `acc` micro-steps a step (prepares the counter's ops; call
 * before kiln_model_init_params). */
kiln_status kiln_model_drop_layout(struct kiln_model *m, int64_t row0, int64_t rstride,
				   int64_t rows, int64_t acc);
/* drop_d = { step, row0, rstride } through the host, synchronously (start-
 * up and resume: step = optimizer steps taken). */
kiln_status kiln_model_drop_set(struct kiln_model *m, int64_t step, void *stream);
/* Enqueue drop_d's advance after micro-step j: the next micro-step's rows,
 * or after the last one back to micro-step 0's and on to the next step. */
kiln_status kiln_model_drop_advance(struct kiln_model *m, int64_t j, void *stream);

/* Enqueue the advance of the optimizer's step count (opt_step_d) by one,
 * gated by step_ok_d when a finite flag gates the step (a skipped step is
 * not counted); before the optimizer op, which reads the 1-based number of
 * the step it takes.  kiln_model_optim_step and ZeRO-1's sharded step
 * (core/dist.c) both advance it through this. */
kiln_status kiln_model_opt_step_advance(struct kiln_model *m, void *stream);
/* The optimizer's plan for n trainable floats (the whole range, or a
 * ZeRO-1 piece); m->optim_ws grows to the largest workspace asked for. */
kiln_status kiln_model_optim_plan(struct kiln_model *m, size_t n, void **plan);
void kiln_model_optim_plan_free(struct kiln_model *m, void *plan);
/* Enqueue a plan's step over [lo, lo + n) of the flat buffers: gradients
 * at grads, state slot s at state + s*stride (NULL: no slots). */
kiln_status kiln_model_optim_run(struct kiln_model *m, void *plan, const float *grads, size_t lo,
				 float *state, size_t stride, const float *lr, void *stream);

/* One device buffer that defines training state: what a checkpoint saves
 * and restores, and a broadcast copies to every rank. */
struct kiln_state_buf {
	const char *name;    /* static: see kiln_model_state_buffers */
	void *ptr;           /* device memory, owned by the model */
	size_t bytes;
};

/* The model's training-state buffers, at most `max` of them into out[]
 * (out may be NULL when max is 0); returns how many there are.  Names, in
 * this order, each listed only when it has bytes:
 *   "params"            f32, every parameter (trainable first), padded
 *   "buffers"           f32, non-trained state (batchnorm running stats)
 *   "optim.momentum"    f32[n_trainable], SGD with momentum
 *   "optim.exp_avg"     f32[n_trainable], AdamW/LAMB first moment
 *   "optim.exp_avg_sq"  f32[n_trainable], AdamW/LAMB second moment
 *   "step"              i64[1], micro-steps done (dropout's counter)
 *   "optim.step"        i64[1], optimizer steps done (bias correction)
 *   "amp.scaler"        f32[4], the loss scaler (scale, growth tracker,
 *                       hysteresis left, overflows), with loss scaling only
 * Pointers are valid from kiln_model_create until kiln_model_free.
 * kiln_model_init_params sets params, buffers and step; kiln_model_optim_
 * prepare zeroes the optimizer's: restore a checkpoint after both. */
int kiln_model_state_buffers(struct kiln_model *m, struct kiln_state_buf *out, int max);

/* kiln_model_init_params for a model whose params and buffers regions a
 * loader writes whole next (kiln_ckpt_load_model, kiln_quant_load,
 * kiln_infer_fold_weights), or whose weights nobody reads (its shape is
 * what the caller wants): the step counter at 0, nothing drawn or
 * written, so the regions hold undefined values until that load. */
kiln_status kiln_model_init_loaded(struct kiln_model *m, void *stream);

/* The first non-finite value (NaN or inf) of v[0..n), a host copy of the
 * model's parameters (region 0) or buffers (1) from element `off` on: the
 * index into m->params of the tensor holding it, *at its element in that
 * tensor; -1 when every tensor's values there are finite (the padding
 * between tensors is not read). */
int kiln_model_nonfinite(const struct kiln_model *m, int region, size_t off, const float *v,
			 size_t n, int64_t *at);
/* Weights loaded from `file` (a checkpoint, a weights file) refused when
 * kiln_model_nonfinite finds a value, or a tensor that must be >= 0
 * (KILN_PARAM_NONNEG: a running variance) holds a negative one: KILN_EDATA
 * naming the file, the tensor and the element (a fused ReLU would turn a
 * NaN model's outputs finite). */
kiln_status kiln_model_finite_check(const struct kiln_model *m, const char *file, int region,
				    size_t off, const float *v, size_t n);

struct plan_node {
	struct kiln_layer l;
	const struct kiln_layer_ops *ops;
	int ystore;  /* storage of the output; -1 = the data input, -2 = none */
	int gstore;  /* storage of the output's gradient; -2 = none */
	int sstore;  /* storage kept from forward to backward; -2 = none */
	/* Gradient checkpointing: a recomputed output is freed after its
	 * forward readers and computed again (into rstore, with its saved
	 * state in rsstore) just before the backward first needs it; -2 =
	 * not recomputed (backward reads ystore/sstore).  Views carry their
	 * root's rstore. */
	int rstore, rsstore;
	int trig;    /* recomputed before the backward of this layer; -1 = not */
	int pos_r, pos_b; /* schedule positions of the recomputation and the
			   * backward (the forward's is the layer index) */
	int dx_accum[KILN_LAYER_MAX_INPUTS];
	int dx_on[KILN_LAYER_MAX_INPUTS];
	/* input k crosses a stage boundary: 1 + its index in p->xfer, else 0 */
	int xfer1[KILN_LAYER_MAX_INPUTS];
	int planned;
	size_t ws;   /* the workspace the layer's plan asked (plan_layers) */
};

/* Whether a layer computes in the model's low-precision compute dtype
 * cdtype (bf16, f16): it reads or writes activations of it (a linear
 * layer on f32 converts its input and writes cdtype; an lstm and a gru,
 * f32 only, and an embedding, a lookup writing f32, neither).  Such a
 * layer's matrix products run in cdtype, from the compute copy of its
 * weights (plan_run.c; the multiple-of-8 warning, graph_params.c). */
static inline int kiln_node_low_precision(const struct plan_node *nd, int cdtype)
{
	return cdtype != KILN_F32 && (nd->l.in[0].dtype == cdtype || nd->l.out.dtype == cdtype);
}

/* The compute copy of the parameters (see struct kiln_model): enqueue its
 * refresh when it is stale. */
kiln_status kiln_model_params_sync(struct kiln_model *m, void *stream);
/* A frozen plan whose model's weights were written since its last run
 * tells its device (plan_run.c; before the run's first op). */
void kiln_plan_frozen_sync(struct kiln_plan *p);

/* New values in the f32 parameters or buffers, written outside the
 * optimizer's step (init, loading, a checkpoint, a pointer handed out):
 * the compute copy is stale, and frozen plans tell their device before
 * their next run (kiln_plan_frozen_sync). */
static inline void kiln_model_weights_written(struct kiln_model *m)
{
	m->pcopy_stale = 1;
	m->wgen++;
}

struct storage {
	size_t bytes, off;
	int start, end;   /* schedule positions, inclusive */
	void *ext;        /* not NULL: the bytes are here, not at off in the arena
			   * (a crossing tensor the stages' ranks share:
			   * core/pipe_window.c).  Only this storage moves:
			   * the others packed into its arena bytes (at other
			   * times of the schedule) stay there */
};

/* One step of a training plan's schedule: the forward of every layer in
 * order (positions 0..n-1), then backwards in reverse order, each preceded
 * by the recomputations it triggers. */
enum { PEV_FWD = 0, PEV_RECOMPUTE = 1, PEV_BWD = 2 };
struct plan_event {
	int kind, layer;
};

/* A tensor read on a later stage than its producer's (core/pipe_xfer.c):
 * sent after stage `from`'s forward into a receive buffer on stage `to`;
 * its gradient, written on stage `to`, returned after that stage's
 * backward into the producer's gradient (written, or added when another
 * return or reader wrote it first: gadd). */
struct plan_xfer {
	int from, to;
	int src;        /* the producer's storage (-1: the data input x) */
	int recv;       /* the receive buffer on stage `to` */
	int gsrc;       /* the producer's gradient storage, -2: none */
	int grecv;      /* the gradient stage `to` writes, -2: none */
	int gadd;       /* the return adds into gsrc: through gtmp */
	int gtmp;       /* where an adding return lands before the add */
	size_t bytes;
	int dtype;      /* the tensor's (and its gradient's) element type */
};

struct kiln_plan {
	struct kiln_model *m;
	int64_t batch;
	int training, input_grad, keep_all;
	struct plan_node *nodes;
	int data_gstore;     /* gradient of the data input, -2 = none */
	int data_store;      /* storage of the reordered data input, -1 = x itself */
	void *in_reorder;    /* NCHW data -> NHWC arena copy, or NULL */
	struct kiln_tensor_desc data_desc; /* the data input as layers see it */
	int n_store, store_cap;    /* storages used / allocated */
	struct storage *store;
	int n_pos;                 /* schedule length: 2n + recomputations */
	struct plan_event *sched;
	int n_segments;            /* [train] recompute segments; 0 = none */
	int n_recomputed;          /* layers whose output is recomputed */
	size_t arena_bytes, ws_bytes;
	void *arena, *ws;
	void *in_cast;       /* data input -> the compute dtype (CAST), or NULL */
	/* decode plans (kiln_plan_opts.decode, core/generate.c): the cache
	 * length (0: not a decode plan), the loss layer's input (the logits)
	 * and, during kiln_plan_decode, the device i32[1] position */
	int64_t decode;
	int logits;          /* kiln_plan_opts.logits: an inference plan */
	/* kiln_plan_opts.frozen on a device that takes it: the layers set
	 * KILN_OPF_FROZEN; wgen is the model's wgen the device last saw */
	int frozen;
	uint64_t wgen;
	int logits_layer;
	const void *pos;
	/* the layers whose forwards run: all (m->n_layers), or those up to
	 * the last that keeps state in a prefill plan of its state alone
	 * (kiln_model_plan_prefill, logits 0): the others have no storage
	 * nor workspace (their [T, V] logits were planned, never computed,
	 * before session 45) */
	int runs;
	/* pipelines (core/pipe_xfer.c, pipe_run.c): the crossing tensors;
	 * the dropout counter this plan's layers read (NULL: m->drop_d) */
	int staged;          /* cut at the model's stages (m->plan_staged) */
	int wkeep;           /* a staged training plan whose deferrable layers'
			      * input, output, saved state and output gradient
			      * live to the schedule's end (m->plan_wkeep;
			      * plan_memory.c, plan_wkeep) */
	struct plan_xfer *xfer;
	int n_xfer, xfer_cap;
	int64_t *step_d;
	const float *seed_d; /* m->seed_d when the plan was made: the loss
			      * layers' seed scale (NULL: m->scaler_d's) */
};

/* The device that runs layer i (-1: the data input) of plan p: its
 * stage's in a pipeline's plans when stages have devices of their own
 * ([run] devices, core/pipe_devices.c), else the model's. */
static inline struct kiln_device *kiln_plan_dev(const struct kiln_plan *p, int i)
{
	const struct kiln_model *m = p->m;
	if (!p->staged || !m->stage_dev)
		return m->dev;
	return m->stage_dev[!m->stage || i < 0 ? 0 : m->stage[i]];
}

/* Byte offsets in the arena and parameter buffers are 64-byte aligned. */
#define KILN_ARENA_ALIGN 64
static inline size_t kiln_align_up(size_t n)
{
	return (n + KILN_ARENA_ALIGN - 1) & ~(size_t)(KILN_ARENA_ALIGN - 1);
}

/* core/graph.c and graph_infer.c, for the planner.  The index of layer
 * `name` among the first `upto` layers, -2 when there is none. */
int kiln_model_find_layer(const struct kiln_model *m, int upto, const char *name);
/* core/graph.c.  The loss layer's `classes` ([layer.loss] classes of
 * softmax_xent: the first N logits are classes, the rest a padded
 * vocabulary's columns the loss never trains), 0 when it sets none (every
 * logit a class). */
int64_t kiln_model_loss_classes(const struct kiln_model *m);
/* The data input as layers see it: [batch, sample...], 4-d inputs in the
 * model's layout, the compute dtype. */
void kiln_model_data_desc(const struct kiln_model *m, int64_t batch, struct kiln_tensor_desc *d);
/* [model] layout resolved for dev (KILN_NCHW or KILN_NHWC): `auto` follows
 * the device's KILN_DEVICE_PREFER_NHWC trait. */
int32_t kiln_model_layout(const struct kiln_config *cfg, const struct kiln_device *dev);
/* [run] fuse resolved into *out: 0 or 1 as written, or `auto` (the
 * default): 1 where cpu is set (a device of type cpu, whose epilogues
 * the tests check), 0 elsewhere.  KILN_ECONFIG naming file:line for a
 * value that is neither. */
kiln_status kiln_model_fuse(const struct kiln_config *cfg, int cpu, int *out);
/* What [run] fuse on against off may change on the CPU in a run of p's
 * model (docs/config.md, fuse), whatever p fused: NULL when nothing (its
 * fusable activations are ReLUs of kiln's layers, whose fused and unfused
 * results are the same bits), else a phrase naming the first cause, in
 * buf[n]: a conv of one input channel in NCHW whose ReLU a maxpool alone
 * reads (core/graph_infer.c mixed_stem runs it NHWC when fused, its weight
 * gradient summed in another order), with eval (the run evaluates) a
 * linear or conv whose GELU an evaluation plan fuses (oneDNN's epilogue
 * rounds otherwise, in f32 too), a plugin's layer offered an activation. */
const char *kiln_plan_fuse_differs(const struct kiln_plan *p, int eval, char *buf, size_t n);
/* 1 + the enum kiln_act of the activation that layer i's ops may take as
 * their epilogue in a plan that fuses `fuse` (kiln_model_infer's), were
 * [run] fuse on; 0: none. */
int kiln_model_act_after(const struct kiln_model *m, int i, int fuse);
/* The only layer that reads layer i's output, else -1 (none, or several). */
int kiln_model_only_consumer(const struct kiln_model *m, int i);
/* Configure and infer every layer for the data input `data` (the batch
 * first: kiln_model_data_desc) into nodes[] (the caller's, n_layers of
 * them, zeroed), with kiln_layer.decode_len = decode; with [run] fuse,
 * the activations `fuse` allows join the layer before them (none; ReLU,
 * for plans with a backward; ReLU and GELU); KILN_ECONFIG naming
 * file:line. */
enum { KILN_FUSE_NONE = 0, KILN_FUSE_RELU = 1, KILN_FUSE_ALL = 2 };
kiln_status kiln_model_infer(struct kiln_model *m, const struct kiln_tensor_desc *data,
			     int64_t decode, int fuse, struct plan_node *nodes);
/* Destroy what the layer's plan made (dev: the device it planned on, NULL
 * when it was never planned); the node itself stays the caller's. */
void kiln_plan_node_free(struct plan_node *n, struct kiln_device *dev);

/* core/plan_memory.c.  The layer whose output storage layer i's output
 * is (views followed to their input's; -1: the data input). */
int kiln_plan_root_y(const struct plan_node *nodes, const struct kiln_model *m, int i);
/* core/plan_memory.c: what a memory plan cannot run (KILN_EINTERNAL or
 * KILN_ECONFIG naming it; kiln_plan_memory's last step): among others a
 * storage referenced (a layer's output, gradient, saved state, the data
 * input's, a crossing tensor's) that a merge emptied. */
kiln_status kiln_plan_check(struct kiln_plan *p);
/* Append a storage of `bytes` living from schedule
 * position start to end (grows p->store); KILN_ENOMEM. */
kiln_status kiln_plan_new_store(struct kiln_plan *p, size_t bytes, int start, int end);
/* Schedule, storages, lifetimes, in-place merges, gradient write/accumulate
 * decisions and the arena size of plan p with S recompute segments (0:
 * none), after the layers' device ops are prepared.  May run several times
 * on one plan; storages past the first `base` are laid out again each time.
 * wants_grad[i]: layer i's output needs a gradient. */
kiln_status kiln_plan_memory(struct kiln_plan *p, int S, const int *wants_grad, int base);

/* The storage layer i's output (i = -1: the data input) is read from in
 * the forward pass ... */
static inline int kiln_plan_fwd_store(const struct kiln_plan *p, int i)
{
	return i < 0 ? p->data_store : p->nodes[i].ystore;
}

/* ... and in the recomputation and backward passes: the recomputed copy
 * when there is one. */
static inline int kiln_plan_late_store(const struct kiln_plan *p, int i)
{
	if (i < 0)
		return p->data_store;
	return p->nodes[i].rstore >= 0 ? p->nodes[i].rstore : p->nodes[i].ystore;
}

/* core/plan_run.c.  The address of storage `store` of plan p (-1: the
 * data input x, other negatives: NULL). */
void *kiln_plan_store_ptr(const struct kiln_plan *p, int store, const void *x);
/* core/plan.c.  1 when evaluation plan p's loss layer adds the rows it
 * counted, metrics[3]: the trainer asked it to (kiln_layer.eval_sums, on
 * m->eval_counted's plans that do not train) and its plan said it does
 * (kiln_layer.eval_counted, ABI 2.27: the built-in softmax_xent, or a
 * plugin's that sets it); 0 otherwise (an evaluation then divides its
 * per-sample sums by its samples, as before 2.27). */
int kiln_plan_eval_counts(const struct kiln_plan *p);
/* Whether every layer of decode plan p that keeps state from step to step
 * lays it out by row (kiln_layer.decode_caches, ABI 2.26), so that
 * kiln_plan_decode_copy_rows can fill its rows. */
int kiln_plan_decode_rows_copyable(const struct kiln_plan *p);
/* Whether every layer of decode plan p that keeps state keeps it a
 * position apiece (kiln_layer.decode_pos_bytes > 0), so that a position
 * fed again is rewritten and positions past those copied are left behind:
 * a prompt's prefill, whose runs may be padded and repeat positions, is
 * made only then (a running state, decode_pos_bytes 0, would take the
 * pads and repeats in). */
int kiln_plan_decode_by_position(const struct kiln_plan *p);
/* Enqueue on stream the copy of positions 0..n-1 of row 0 of decode plan
 * src's caches (src of one row or more, of the same model and decode
 * length as dst; 1 <= n <= that length) into every row of dst: each row
 * of dst then holds the positions src's row 0 held (kiln_generate_samples'
 * prompt, fed once); *bytes: the bytes written (a layer that gives no
 * kiln_layer.decode_pos_bytes has its rows copied whole).  KILN_ENOTSUP
 * when a layer does not lay its caches out by row (nothing copied). */
kiln_status kiln_plan_decode_copy_rows(struct kiln_plan *dst, const struct kiln_plan *src, int64_t n,
				       void *stream, size_t *bytes);
/* core/plan.c.  A decode plan of one row (`decode` positions in all, as
 * kiln_plan_opts.decode) whose runs take `positions` tokens at once, T =
 * positions (a prompt's prefill, core/generate.c).  logits 1: run by
 * kiln_plan_decode, its logits [1, T, V] (kiln_plan_logits; the tests);
 * 0: run by kiln_plan_decode_state alone, which ends at the last layer
 * that keeps state: the layers after it (the final layer norm, the
 * lm_head) get no storage nor workspace, so the plan holds no [T, V]
 * logits (kiln_plan_decode and kiln_plan_logits refuse it, KILN_EINVAL).
 * KILN_ENOTSUP where a layer that keeps state, or one not built in that
 * runs, did not set kiln_layer.decode_runs (ABI 2.31), or the device refuses
 * ATTENTION_DECODE_RUN: the caller feeds the positions a step each. */
kiln_status kiln_model_plan_prefill(struct kiln_model *m, int64_t decode, int64_t positions,
				    int logits, struct kiln_plan **out);
/* core/generate.c.  The most positions generator g prefills a run
 * (PREFILL_MAX unless set; a prompt longer is fed in runs of the largest
 * power of two at most n): tests set a few to check the runs of a long
 * prompt on a short context, and 1 (or 0) to feed prompts a step a
 * position, the way before session 43. */
void kiln_generator_prefill_max(struct kiln_generator *g, int64_t n);
/* core/generate.c.  Whether generator g holds its prefill plan for the
 * next prompt of its run length (1, kiln_generator_new's) or frees it
 * after every prompt (0: kiln_generator_open's under [run] memory_limit;
 * tests set it to check that path without a config). */
void kiln_generator_prefill_keep(struct kiln_generator *g, int keep);
/* core/plan_run.c.  Enqueue a run of decode plan p on tokens (device
 * i32[batch, T]) at positions pos (device i32[T], pos[t] = pos[0] + t,
 * the caches holding positions 0..pos[0]-1), as far as its state goes:
 * the forwards up to the last layer that keeps state from run to run
 * (the attention's caches); those after it (the logits') do not run, so
 * the plan's output is not written. */
kiln_status kiln_plan_decode_state(struct kiln_plan *p, const void *tokens, const void *pos,
				   void *stream);
/* A pipeline stage's passes (core/pipe_run.c): the forwards of layers
 * lo..hi-1 (lo = 0: after the compute copy's refresh and the input
 * conversion), and their backwards, each after the recomputations it
 * triggers (a pipeline's plan recomputes within a stage only; KILN_EINTERNAL
 * when the range's events are not one run of the schedule). */
kiln_status kiln_plan_forward_range(struct kiln_plan *p, int lo, int hi, const void *x,
				    const void *labels, void *metrics, void *stream);
/* Deferred weight gradients ([pipeline] defer_wgrad, core/pipe_wgrad.c):
 * layer i with off[i] != SIZE_MAX runs its backward split: the input's
 * gradient on the stage's stream, the parameters' on `side` (the stream's
 * KILN_PROC_STREAM_SIDE), from copies of its input, output (where the
 * layer reads it) and output's gradient at rec + off[i], with workspace
 * ws (plan_run.c, run_split). */
struct kiln_wdefer {
	void *side;
	void *ws;
	size_t ws_bytes;
	char *rec;
	const size_t *off;
};
kiln_status kiln_plan_backward_range(struct kiln_plan *p, int lo, int hi, const void *x,
				     const void *labels, void *metrics, void *stream,
				     const struct kiln_wdefer *df);

/* core/summary.c.  The summary of plan p (kiln_model_summary), whose ops
 * were prepared between kiln_device_flops_record(dev, 1) and (dev, 0);
 * forgets the device's notes.  A training plan with synchronised batchnorm
 * across ranks gets no FLOPs (no_flops: its forward would call the group). */
kiln_status kiln_plan_summary(struct kiln_plan *p, struct kiln_summary *out);
/* ... and that summary as [summary] log lines at KILN_LOG_INFO (nothing
 * when the log level is lower). */
kiln_status kiln_plan_summary_log(struct kiln_plan *p);
/* A summary made by kiln_plan_summary, logged as kiln_plan_summary_log
 * logs one. */
kiln_status kiln_summary_log(const struct kiln_summary *s);

/* core/trained.c.  The weights a command names (--checkpoint F, the C
 * API's `weights`), opened once: `path` (borrowed) a kiln checkpoint,
 * verified whole and its weights keys checked against cfg
 * (kiln_ckpt_open_weights_fd: ck), or else a weights file (safetensors or
 * llm.c's, told apart by its first bytes) left open (file) for
 * kiln_given_load, so that the file told apart is the file read; path
 * NULL: the newest usable checkpoint of [run] out_dir/checkpoints (ck;
 * NULL when there is none, dir naming where it was looked for, "" with no
 * out_dir).  A path that cannot be opened is KILN_EIO ("checkpoint F:
 * cannot open: ...").  Close with kiln_given_close (also after a failed
 * open). */
/* A weights file open to be read (a kiln checkpoint, llm.c's model
 * file, else safetensors), told apart by its first bytes when it was
 * opened, and what fstat() saw then: the reads that follow trust no
 * second look (before session 40 kiln_given_load looked at the magic
 * again, and a file rewritten in place into a checkpoint between a
 * command's open and load was loaded as one without the check of its
 * config), and refuse a file changed since (kiln_read_at). */
enum { KILN_WEIGHTS_IS_SAFETENSORS, KILN_WEIGHTS_IS_CHECKPOINT, KILN_WEIGHTS_IS_LLMC };
struct kiln_weights_file {
	int fd;           /* borrowed */
	const char *path; /* borrowed: names the file in messages */
	int kind;         /* KILN_WEIGHTS_IS_* */
	struct kiln_file_seen seen;
};
struct kiln_ckpt;
struct kiln_safetensors;
struct kiln_given {
	const char *path;
	struct kiln_ckpt *ck; /* a checkpoint, or NULL */
	/* a weights file (file.fd >= 0: its own descriptor, closed by
	 * kiln_given_close), or file.fd -1 */
	struct kiln_weights_file file;
	char dir[4200];       /* path NULL: the checkpoint directory looked in */
	/* an INT8 model (--quantized Q, kiln_quant_open's), set by the
	 * caller, borrowed, not closed here: the model's input sample it
	 * records (kiln_quant_sample; its weights are the caller's to read),
	 * or NULL */
	const struct kiln_safetensors *qf;
	/* the device to open in [run] device's place (set by the caller:
	 * `kiln generate` on the CPU device where `auto` chose one without
	 * decoding), or NULL */
	const char *device;
};
kiln_status kiln_given_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			    const char *path, struct kiln_given *g);
void kiln_given_close(struct kiln_given *g);
/* The weights file of g (file.fd >= 0) into m, as [model] init_from reads
 * one, as the kind g->file was told at open (no second look at its first
 * bytes); a failure says it is no checkpoint either. */
kiln_status kiln_given_load(struct kiln_model *m, const struct kiln_given *g, void *stream);

/* A model with its weights, as `kiln export` and
 * `kiln generate` load it: [run] device opened, the model built for the
 * sample shape training read (the checkpoint's record, or g->qf's, [data]
 * not opened unless the watched output exists, kiln_output_watch, for its
 * guard; else [data]'s, its source's peek where it has one:
 * kiln_dataset_peek), then the
 * weights of `checkpoint` (kiln_given_open's: NULL, the newest usable one
 * in [run] out_dir/checkpoints), a kiln checkpoint or a weights file
 * (safetensors or llm.c's, read as [model] init_from reads one, in its
 * place; `kiln predict|eval|export|generate --checkpoint F.safetensors`),
 * else [run] seed and [model]
 * init_from (with a warning; need_trained: init_from alone, as trained
 * weights, KILN_ECONFIG when there is none); need_trained < 0: no
 * weights at all (undefined values, nothing drawn), no checkpoint or
 * init_from looked for (the model's shape is what the caller wants:
 * `kiln eval --quantized`).  A checkpoint's weights are not drawn first
 * either (kiln_model_init_loaded).  `verb` begins the log
 * line naming them ("exporting").  Close with
 * kiln_trained_close (also after a failed open). */
struct kiln_trained {
	struct kiln_device *dev;
	struct kiln_model *m;
	void *stream;
	struct kiln_tensor_desc sample;
};
kiln_status kiln_trained_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			      const char *checkpoint, const char *verb, int need_trained,
			      struct kiln_trained *t);
/* The same with the weights of g, open already (borrowed: `kiln eval
 * --fold` and `kiln quantize` read g again once folded; unused when
 * need_trained < 0). */
kiln_status kiln_trained_open_given(const struct kiln_config *cfg,
				    const struct kiln_registry *reg, const struct kiln_given *g,
				    const char *verb, int need_trained, struct kiln_trained *t);
/* A warning when [section]'s sample (data) is not the one the checkpoint's
 * model was trained on (trained), saying which one is used (data_used:
 * [section]'s, as `kiln eval` evaluates its samples; else the
 * checkpoint's: no caller since session 38, when export, predict and
 * generate stopped opening [data] to compare). */
void kiln_trained_sample_warn(const char *section, const struct kiln_tensor_desc *data,
			      const struct kiln_tensor_desc *trained, int data_used);
void kiln_trained_close(struct kiln_trained *t);
/* core/weights.c: IEEE half to float (subnormals, infinities, NaNs). */
float kiln_half_to_float(uint16_t h);

/* Room for every kiln_model_state_buffers() entry (a checkpoint section
 * each). */
#define KILN_MAX_STATE_BUFS 16

/* The model's names resolved without building it (`kiln config`): at
 * least one [layer.NAME], each type known, each input, tie and [model]
 * stages name a layer (stages = auto: not placed).  KILN_ECONFIG naming
 * file:line, as kiln_model_create would. */
kiln_status kiln_model_check_names(const struct kiln_config *cfg, const struct kiln_registry *reg);

#endif
