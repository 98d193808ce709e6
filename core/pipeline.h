/* core/pipeline.h - pipeline parallelism (docs/pipeline.md): a model cut
 * into stages ([layer.X] stage, [model] stages), a step cut into
 * micro-batches ([pipeline] micro_batches) run in a schedule ([pipeline]
 * schedule = gpipe | 1f1b), and every tensor that crosses a stage
 * boundary sent through a stage transport.
 *
 *   pipe_stages.c    placement: each layer's stage, read and checked
 *   pipe_schedule.c  the schedules: each stage's order of forwards and
 *                    backwards, and one order that runs them all
 *   pipe_xfer.c      the planner's part: the crossing tensors of a plan
 *   pipe_run.c       the executor: micro-batch plans, transports, the
 *                    gradients accumulated per stage
 */
#ifndef KILN_PIPELINE_H
#define KILN_PIPELINE_H

#include "graph.h"

#define KILN_PIPE_MAX_STAGES 64

/* ---- placement (pipe_stages.c) ------------------------------------- */

/* Read every layer's stage into m->stage (allocated; NULL and
 * m->n_stages = 1 when the config places nothing) from [layer.X] stage
 * (default: the previous layer's, 0 for the first) or [model] stages
 * (`first, last | first, last | ...`: each stage's first and last layer,
 * in file order, tiling every layer; or `auto[:P]`, kiln_pipe_balance's
 * cut by the layers' estimated FLOPs and bytes moved).  KILN_ECONFIG
 * naming file:line when both are given, a name is unknown, stages do not
 * follow the layers' file order, a stage is empty or a layer reads a
 * later stage. */
kiln_status kiln_pipe_read_stages(struct kiln_model *m);

/* [model] stages = auto: the cut of n layers of cost[i] into P runs in
 * file order, each one layer at least, whose busiest run's sum is least;
 * of those (within 0.1% of the least), the one with the least sum of the runs' squares (the other
 * stages as even as they can be), and of equal ones the one whose later
 * stages start first (the same numbers give the same cut on every rank).
 * A negative cost counts as 0.  nocut (NULL: none): no stage starts at a
 * layer i of nocut[i] != 0, unless no cut can avoid them all (then they
 * are ignored).  stage[i]: layer i's; KILN_EINVAL when P < 1 or n < P. */
kiln_status kiln_pipe_balance(const double *cost, int n, int P, const char *nocut, int *stage);

/* One layer's estimate for [model] stages = auto, a sample: flops, its
 * forward's FLOPs; in_bytes, out_bytes: its inputs' and output's bytes;
 * param_bytes: its parameters' and buffers' bytes over the rows of a
 * micro-batch (read once a micro-batch); dx: the backward computes its
 * input's gradient; own: its parameters' gradient; epilogue: its forward
 * is another layer's epilogue (a fused ReLU: no pass of its own). */
struct kiln_pipe_layer_est {
	double flops, in_bytes, out_bytes, param_bytes;
	int dx, own, epilogue;
};

/* Its cost in FLOPs: 1 + flops (1 + dx + own) + flops_per_byte times
 * the bytes its passes move: the forward x + y + W (none for an
 * epilogue), the input's gradient dy + x + W + dx (2 x + y + W), the
 * parameters' gradient dy + x + dW read and written (x + y + 2 W);
 * flops_per_byte <= 0: FLOPs alone.  docs/pipeline.md, "Balanced stages". */
double kiln_pipe_layer_cost(const struct kiln_pipe_layer_est *l, double flops_per_byte);

/* The stage of layer i (-1: the data input, on stage 0). */
static inline int kiln_pipe_stage(const struct kiln_model *m, int i)
{
	return !m->stage || i < 0 ? 0 : m->stage[i];
}

/* The stage of parameter q: its first user's (grad_layer), where it is
 * laid out; a tensor tied across stages is that stage's, which writes
 * its gradient in place, the later users' returned to it (tie_grads). */
static inline int kiln_pipe_param_stage(const struct kiln_model *m, const struct model_param *q)
{
	return kiln_pipe_stage(m, q->grad_layer);
}

/* ---- schedules (pipe_schedule.c) ----------------------------------- */

enum { KILN_PIPE_GPIPE = 0, KILN_PIPE_1F1B = 1 };
enum { KILN_PIPE_FWD = 0, KILN_PIPE_BWD = 1 };

struct kiln_pipe_action {
	int kind;   /* KILN_PIPE_FWD or KILN_PIPE_BWD */
	int stage;
	int mb;     /* micro-batch */
	int tick;   /* time unit it runs in when every action takes one */
};

/* The schedule of P stages and M micro-batches: 2 P M actions in an order
 * that respects every dependency (a forward after the previous stage's,
 * a backward after the next stage's and its own forward), ordered by the
 * tick each runs in when every stage runs its own list (gpipe: all
 * forwards, then all backwards; 1f1b: P-1-s forwards, then one forward
 * and one backward in turn, then the remaining backwards) as early as
 * its dependencies allow, each action one unit of time.  Stage s's
 * micro-batches run forward, and backward, in order 0..M-1 in both, so
 * gradients accumulate in the same order.  early: 1f1b's extra warm-up
 * forwards on every stage but the last ([pipeline] early_forwards; 0 for
 * plain 1f1b, ignored by gpipe).  *ticks: the schedule's length;
 * *inflight: the most micro-batches forwarded but not yet backwarded on
 * stage 0 (gpipe M, 1f1b min(P + early, M)), the activation sets alive
 * at once.  out: 2 P M entries, the caller's. */
kiln_status kiln_pipe_schedule(int kind, int P, int M, int early, struct kiln_pipe_action *out,
			       int *ticks, int *inflight);
/* The activation sets schedule `act` (2 P M actions) needs where
 * micro-batch j's set is free only after stage 0's backward of j + lag
 * (the step's end past the last): at least `inflight` (lag 0). */
int kiln_pipe_sets_lagged(const struct kiln_pipe_action *act, int P, int M, int lag, int inflight);
/* The schedule's bubble: the fraction of stage-time idle, 1 - 2M/ticks
 * (gpipe and 1f1b: (P-1)/(M+P-1)). */
double kiln_pipe_bubble(int P, int M, int ticks);

/* ---- crossing tensors (pipe_xfer.c, for plan_memory.c) -------------- */

/* For a plan of a model with stages, after the in-place merges (which
 * kiln_pipe_same_stage keeps within a stage): every tensor read on a
 * later stage than its producer's gets a receive buffer there (p->xfer,
 * the readers' nodes[].xfer1).  KILN_ENOTSUP: recomputation across
 * stages, the data's gradient read across stages. */
kiln_status kiln_pipe_plan_xfers(struct kiln_plan *p);
/* ... and, after the gradient storages, their gradients' buffers: each
 * reader on the later stage writes into one there, returned to the
 * producer after that stage's backward. */
kiln_status kiln_pipe_plan_xfer_grads(struct kiln_plan *p);
/* Layer i's record a micro-batch where its weight gradient can be
 * deferred ([pipeline] defer_wgrad, core/pipe_wgrad.c; plan p's shapes),
 * else 0: core/pipe_memory.c reports them, plan_memory.c keeps what they
 * hold alive (kiln_plan.wkeep). */
size_t kiln_pipe_wgrad_record(const struct kiln_model *m, const struct kiln_plan *p, int i);
/* For plan_gradients' walk (backward order; written[store]: a writer has
 * been seen): the buffer a reader of crossing tensor e writes its
 * gradient into; at the first reader, whether e's return writes the
 * producer's gradient or adds to it. */
int kiln_pipe_xfer_grad(struct kiln_plan *p, int e, char *written);
/* Whether the storage of layer src's output and layer i are on one stage
 * (in-place merges only then). */
int kiln_pipe_same_stage(const struct kiln_plan *p, int src, int i);
/* Whether crossing tensor e of a training plan may live in memory both its
 * stages' ranks map (core/pipe_window.c): *fwd its activation (the
 * producer's storage and the receive buffer one: a storage of a layer's
 * output, not the data, that no other crossing tensor names, whose
 * gradient is returned: that return, sent after the reading stage's
 * backward, is what orders the producer's next write of the buffer after
 * the reader's last read; a frozen stage 0 returns none), *bwd its
 * gradient (the receive buffer of the gradient and the producer's gradient
 * storage one: a return that writes it, not adds, into a storage no other
 * crossing tensor names).  On every rank the same (the same plan). */
void kiln_pipe_xfer_shared(const struct kiln_plan *p, int e, int *fwd, int *bwd);

/* ---- stage transport --------------------------------------------------
 * How a crossing tensor moves from stage `from` to stage `to`: the sender
 * enqueues `send` on its stream after the producer's pass, the receiver
 * `recv` on its own before the reader's; `tag` names the message (the
 * micro-batch, the tensor, the direction) and both sides give the same
 * bytes.  Neither waits on the host.  The one in pipe_run.c (local) copies
 * within a process on a copy stream, ordered by events; across ranks a
 * communicator's point-to-point send/recv (tag -> matching order, stage
 * -> rank) is the same shape. */
struct kiln_stage_transport_ops {
	kiln_status (*send)(void *ctx, int from, int to, uint64_t tag, const void *buf,
			    size_t bytes, void *stream);
	kiln_status (*recv)(void *ctx, int from, int to, uint64_t tag, void *buf, size_t bytes,
			    void *stream);
	/* Stage `me`'s send of stag to stage `peer` and its recv of rtag from
	 * `peer` right after it, with no work of the stage between them, as
	 * one operation on `stream` whose halves progress together (the
	 * communicator's sendrecv, comm ops version 7): the stream passes it
	 * once both are done.  In the per-pair order it is the send and then
	 * the recv.  (optional: NULL means the executor calls send, then
	 * recv; the local transport has none) */
	kiln_status (*sendrecv)(void *ctx, int me, int peer, uint64_t stag, const void *sbuf,
				size_t sbytes, uint64_t rtag, void *rbuf, size_t rbytes,
				void *stream);
};
struct kiln_stage_transport {
	const struct kiln_stage_transport_ops *ops;
	void *ctx;
};

/* A message's slot among n = 2 M n_xfer (micro-batch, tensor, direction)
 * from its tag (pipe_impl.h's pipe_tag), or -1 out of range: the transports
 * keep what a message needs there, since a tag recurs only a step later. */
static inline int kiln_pipe_tag_slot(uint64_t tag, int n_xfer, int n)
{
	uint64_t j = tag >> 32, e = (tag & 0xffffffffu) >> 1;
	uint64_t i = (j * (uint64_t)n_xfer + e) * 2 + (tag & 1);
	return e < (uint64_t)n_xfer && i < (uint64_t)n ? (int)i : -1;
}

/* ---- stages on ranks (pipe_rank.c) ---------------------------------- */

/* The transport across ranks: stage s on rank rank_of[s] of communicator
 * comm (ops: its plugin's) and on rank world_of[s] of the world (what its
 * messages name), this rank's stage `mine` (its log lines name it), for
 * M micro-batches of n_xfer crossing tensors; *tr is set to it.  Sends are staged and run on a stream of the
 * transport's own, so the sender's stream never waits for its receiver. */
struct kiln_pipe_rank;
kiln_status kiln_pipe_rank_open(const struct kiln_comm_ops *ops, void *comm,
				struct kiln_device *dev, int P, int mine, const int *rank_of,
				const int *world_of, int M, int n_xfer, struct kiln_pipe_rank **out,
				struct kiln_stage_transport *tr);
/* [pipeline] sendrecv = auto on ranks of the communicator plugin named
 * `comm` (its kiln_plugin name: "gloo", "mpi", "nccl"): 1 pairs a
 * stage's send with the recv from the same stage after it. */
int kiln_pipe_pair_auto(const char *comm);
/* stream waits until every send enqueued so far has completed. */
kiln_status kiln_pipe_rank_flush(struct kiln_pipe_rank *R, void *stream);
/* Every stage's n doubles vals (n <= 4) at stage 0's rank, into all[s n ..]
 * there (stage `mine` here); the host waits.  After the last step. */
kiln_status kiln_pipe_rank_gather(struct kiln_pipe_rank *R, int P, int mine, const double *vals,
				  int n, double *all);
/* st (a failure reported after the hand-offs were enqueued: a sync's)
 * wrapped with the receive that started on the stage's stream and did not
 * finish, by stage, world rank, micro-batch and crossing tensor, where
 * one did, that stream has failed (it stopped at the receive: a receive
 * still waiting for its peer is not blamed for a failure from elsewhere)
 * and the message does not name it already; else st as it is.
 * Receives are marked on a device whose memory is the host's and which
 * runs host functions (the CPU) alone: elsewhere st as it is.  NULL R:
 * st. */
kiln_status kiln_pipe_rank_explain(struct kiln_pipe_rank *R, kiln_status st);
/* The staged evaluation's receive (core/dist_pipe_eval.c) of crossing
 * tensor e of its batch `batch` (counted from 0 in the pass) from stage
 * `from` into buf (bytes) on stream, marked in micro-batch 0's forward
 * slot of e as the step's receives are, so that kiln_pipe_rank_explain
 * names it where it fails on the stream's worker; its messages say
 * "evaluating: receiving batch B, crossing tensor e (the activation,
 * forward)".  KILN_EINTERNAL for a NULL R, and for an e without a slot
 * (training's n_xfer and the ties': an evaluation plan has training's
 * crossing tensors, kiln_pipe_eval_check) or a negative batch: never
 * unmarked. */
kiln_status kiln_pipe_rank_eval_recv(struct kiln_pipe_rank *R, int from, int e, long long batch,
				     void *buf, size_t bytes, void *stream);
/* ... and its send of crossing tensor e of batch `batch` to the later
 * stage `to`: the communicator's send on stream itself (a chain from
 * stage 0 to the last needs no staging, and never sends to the stage it
 * receives from next, so nothing pairs), its failure named "evaluating:
 * sending batch B, crossing tensor e (the activation, forward) (N bytes)
 * to stage T (rank W)", or as the receive the stream failed at.
 * KILN_EINTERNAL as above, and for a `to` not after this rank's stage. */
kiln_status kiln_pipe_rank_eval_send(struct kiln_pipe_rank *R, int to, int e, long long batch,
				     const void *buf, size_t bytes, void *stream);
void kiln_pipe_rank_free(struct kiln_pipe_rank *R);
/* The send stream drained, its status dropped (kiln_pipe_drain; R NULL:
 * nothing). */
void kiln_pipe_rank_drain(struct kiln_pipe_rank *R);
/* The crossing tensors whose buffers the ranks share (pipe_window.c):
 * shared[2 e + back] (n_xfer tensors, training's; borrowed until
 * kiln_pipe_rank_free) 1 where tensor e's activation (back 0) or gradient
 * (1) is shared; their messages are then a token, the tag, not the
 * tensor.  Every rank of the pipe must give the same.  Bit s of direct:
 * every message between this rank's stage and stage s is such a token
 * (kiln_pipe_window_direct); where the transport sends now too (send_now)
 * and no tied weight sends anything (n_xfer is all the transport's), the
 * stage's stream sends them itself, never through the send stream. */
void kiln_pipe_rank_share(struct kiln_pipe_rank *R, const unsigned char *shared, int n_xfer,
			  unsigned direct);

/* ---- crossing tensors in shared memory (pipe_window.c) -------------- */

/* Stages on ranks (P, this rank's stage mine, stage s on rank rank_of[s]
 * of comm and world_of[s] of the world): every shareable crossing tensor
 * (kiln_pipe_xfer_shared) of the K plans gets a buffer in memory every
 * rank of comm maps (map_shared, comm ops version 8, collective: every
 * rank calls this with the same plans), which both its storages in each
 * plan point to (storage.ext); shared[2 e + back] (2 n_xfer entries, the
 * caller's) says which.  A communicator without it (KILN_ENOTSUP) leaves
 * every entry 0 and returns KILN_OK (logged); other errors are returned.
 * For a device whose memory is the host's alone (the caller checks). */
kiln_status kiln_pipe_window_open(struct kiln_plan **plan, int K, const struct kiln_comm_ops *ops,
				  void *comm, int P, int mine, const int *rank_of,
				  const int *world_of, unsigned char *shared);
/* Bit s set: every crossing tensor of p between stage `mine` and stage s
 * (either way) is shared, its activation and any gradient returned
 * (shared as kiln_pipe_window_open set it). */
unsigned kiln_pipe_window_direct(const struct kiln_plan *p, int mine, const unsigned char *shared);
/* ---- a device per stage (pipe_devices.c) ---------------------------- */

/* The entries of [run] devices (`plugin:ordinal, ...`; 0 when unset).
 * KILN_ECONFIG naming file:line for a malformed list. */
kiln_status kiln_pipe_devices_count(const struct kiln_config *cfg, int *n);
/* Open [run] devices, one instance per stage of model m (stages read),
 * into m->stage_dev: the run's device plugin ([run] device, m->dev's) at
 * each ordinal, with stage s's share of the process's threads ([run]
 * threads, or the CPUs it may run on: T / P each, the first T % P one
 * more, at least 1) and told it runs beside P - 1 peers; m->dev's
 * profiler on each.  Nothing to do when the key is unset.  KILN_ECONFIG
 * naming the key for a count that is not the stages', another plugin or
 * an ordinal named twice; KILN_ENOTSUP on a device that is not the CPU. */
kiln_status kiln_pipe_devices_open(const struct kiln_registry *reg, struct kiln_model *m);
/* Close them (after every plan made on them is freed). */
void kiln_pipe_devices_close(struct kiln_model *m);

/* ---- the measured bubble (pipe_timing.c) ---------------------------- */

struct kiln_pipe_timing;
struct kiln_profile;
/* Stamps for the n_act actions `act` (borrowed) of a schedule of P stages
 * whose stage s runs on devs[s]; `theory` is its bubble, prof the
 * profiler or NULL.  *out = NULL (not an error) where a stage's device
 * has no host functions (KILN_PROC_HOST_FN: stamping would sync). */
kiln_status kiln_pipe_timing_open(struct kiln_device *const *devs, int P,
				  const struct kiln_pipe_action *act, int n_act, double theory,
				  struct kiln_profile *prof, struct kiln_pipe_timing **out);
/* Enqueue on stage stream `stream` of `dev` the stamp of action
 * `action`'s start (end = 0) or end (1).  t NULL: nothing. */
kiln_status kiln_pipe_timing_mark(struct kiln_pipe_timing *t, struct kiln_device *dev,
				  void *stream, int action, int end);
/* Stages on ranks: only `stage`'s passes are stamped here; the report
 * gives its busy time and idle share (the other ranks' clocks are not
 * here to measure the bubble with). */
void kiln_pipe_timing_only(struct kiln_pipe_timing *t, int stage);
/* Enqueue the step's fold on `stream` (after every stage joined it). */
kiln_status kiln_pipe_timing_step(struct kiln_pipe_timing *t, struct kiln_device *dev,
				  void *stream);
/* Log each stage's busy ms per step, the span and the bubble measured
 * over the steps after the first (also to the profiler's report, when
 * profiling); *bubble, or -1 when nothing was measured.  Call when the
 * streams are drained. */
kiln_status kiln_pipe_timing_report(struct kiln_pipe_timing *t, double *bubble);
void kiln_pipe_timing_free(struct kiln_pipe_timing *t);
/* Stages on ranks: this rank's stage's busy and CPU ms a step and its
 * span a step (ms[0], ms[1], ms[2]; 0 when nothing was measured). */
void kiln_pipe_timing_mine(const struct kiln_pipe_timing *t, double *ms);
/* Stages on ranks, stage 0's rank: log the pipe's bubble and its split
 * from every stage's busy and CPU ms a step (ms[3 s], ms[3 s + 1]) over
 * the longest of the stages' spans (ms[3 s + 2]). */
void kiln_pipe_timing_report_pipe(const struct kiln_pipe_timing *t, const double *ms);
/* Stages on ranks: the doubles a rank's kept passes take (the same on
 * every rank of the pipe; 0 when t is NULL), and this rank's: its host,
 * the steps kept, and the last counted steps' stamps of its stage
 * (kiln_pipe_timing_only keeps them). */
int kiln_pipe_timing_passes_n(const struct kiln_pipe_timing *t);
void kiln_pipe_timing_passes(const struct kiln_pipe_timing *t, double *out);
/* Stage 0's rank, with every rank's kiln_pipe_timing_passes (stage s's at
 * all + s n): the whole pipe replayed and reported as one process's
 * stages are (the gaps, hand-offs' latency, smooth replay, CPU times),
 * each line headed "the ranks' stamps: "; ranks on one host only (their
 * clocks compare). */
void kiln_pipe_timing_report_passes(const struct kiln_pipe_timing *t, const double *all);
/* The schedule `act` (n actions over P stages, kiln_pipe_schedule's order)
 * replayed with action i taking dur[i]: each starts as soon as its stage's
 * previous action has ended and, `handoff` later (0: instant), the action
 * it waits for (a forward: the previous stage's forward of its
 * micro-batch; a backward: the next stage's backward of it).  Returns the
 * span (-1: out of memory); busy[s] (P entries) the sum of stage s's
 * durations. */
double kiln_pipe_replay(const struct kiln_pipe_action *act, int n, const double *dur,
			double handoff, int P, double *busy);
/* The gaps of one step's stamps st (start and end of each of the n
 * actions of `act`, kiln_pipe_schedule's order) before each pass but the
 * first: measured from the later of the two ends the pass waited for (its
 * stage's previous pass, and the action kiln_pipe_replay says it waits
 * for).  Where the other stage's ended later, the gap is a hand-off's
 * latency and adds to gap[0] (cnt[0]++), and where hist is not NULL, 1 to
 * its bin of hist (KILN_PIPE_GAP_BINS: 1 us wide below 1 ms, 100 us wide
 * below 100 ms, the last one beyond); else the stage's own time between
 * passes, to gap[1] (cnt[1]++).  Nothing is added when out of memory. */
#define KILN_PIPE_GAP_BINS 2000
void kiln_pipe_gaps(const struct kiln_pipe_action *act, int n, const int64_t *st, double *gap,
		    int64_t *cnt, int64_t *hist);
/* The latency in us (its bin's lower end) below which more than a share q
 * of the n hand-offs counted in hist fell: q = 0.5 the median. */
double kiln_pipe_gap_quantile(const int64_t *hist, int64_t n, double q);
/* The idle share of P stages' time over a span in which stage s was busy
 * busy[s], 1 - sum(busy) / (P span), split: *bubble = 1 - max(busy) /
 * span, the busiest stage's idle share (its fill and drain, and any wait
 * within: what the schedule's (P-1)/(M+P-1) predicts for equal stages),
 * and *imbalance = (max(busy) - mean(busy)) / span, the other stages'
 * wait for the busiest; the two add up to the idle share. */
/* The schedule `act` replayed (as kiln_pipe_replay, instant hand-offs)
 * with smoothed passes: each at its stage's mean duration (dur[i]) among
 * its passes of its kind; when `ends`, the end passes (act[0], the step's
 * first forward, and act[n - 1], its last backward) keep their own and
 * are left out of the means.  The stages' busy times are dur's, so
 * 1 - sum(dur) / (P span) is the bubble of the stages' imbalance alone
 * (equal stages: the schedule's), and with ends that of the end passes
 * too.  Returns the span (-1: out of memory). */
double kiln_pipe_smooth(const struct kiln_pipe_action *act, int n, const double *dur, int ends);
void kiln_pipe_idle_split(const double *busy, int P, double span, double *bubble,
			  double *imbalance);

/* ---- `kiln memory` (pipe_memory.c) ---------------------------------- */

/* Print to f, for a step of `batch` rows, each stage's layers, parameter
 * bytes and the activation bytes of one micro-batch on it, and what gpipe
 * (M micro-batches alive) and 1f1b (min(P - s, M) on stage s, once each
 * stage has a device of its own) keep. */
kiln_status kiln_pipe_memory_print(struct kiln_model *m, int64_t batch, FILE *f);

/* ---- the executor (pipe_run.c) ------------------------------------- */

struct kiln_pipe;

/* Whether the config asks for a pipeline: stages placed or micro_batches
 * > 1.  KILN_ECONFIG for a bad [pipeline] key. */
kiln_status kiln_pipe_wanted(const struct kiln_config *cfg, const struct kiln_model *m,
			     int *yes);
/* Open the pipeline of model m (stages read) for a step of `batch` rows
 * that begins and ends on `stream`: a stream per stage and one for the
 * transport's copies, the micro-batch size
 * batch / micro_batches (KILN_ECONFIG when it does not divide), one plan
 * per activation set the schedule keeps alive (first: *mb_plan, which the
 * caller may summarise but not free), the transport, and the per-stage
 * gradient accumulation over `accumulate` steps ([train] accumulate: the
 * trainer calls kiln_pipe_step that many times per optimizer step).  What
 * a pipeline cannot do yet is KILN_ENOTSUP naming the key: data
 * parallelism and recompute across stages. */
kiln_status kiln_pipe_open(struct kiln_model *m, int64_t batch, int64_t accumulate, int world,
			   void *stream, struct kiln_pipe **out);
/* The micro-batch plan that summaries and `kiln memory` describe. */
/* Stages on ranks: from now on this process runs stage `mine` only, its
 * crossing tensors moved by comm's point-to-point calls (stage s on rank
 * rank_of[s] of comm, rank world_of[s] of the world, which its messages
 * name; name: the communicator plugin's, for [pipeline] sendrecv = auto;
 * its log line names the choice); the other stages' parameters here are neither
 * read nor given gradients (their gradient slices stay zero). */
kiln_status kiln_pipe_use_ranks(struct kiln_pipe *pp, const struct kiln_comm_ops *ops, void *comm,
				const char *name, int mine, const int *rank_of, const int *world_of);
/* Stages on ranks: whether this rank's stage's gradients are final at
 * the backward of each of its layers in the last micro-batch (every layer
 * accumulates in its own ops: no add after the backward), so that its
 * data-parallel buckets can start then (the loss layers' gradient seed
 * holds the mean over the micro-batches: pipe_open.c, seed_mean). */
int kiln_pipe_hookable(const struct kiln_pipe *pp);
/* ... and from now on: the stage's last micro-batch's backward runs with
 * m->grad_final set (the backward hook starts the buckets). */
void kiln_pipe_grads_by_hook(struct kiln_pipe *pp);
/* This rank's stage (-1: every stage, one process) and its slice
 * [*lo, *hi) of the flat trainable parameters. */
int kiln_pipe_mine(const struct kiln_pipe *pp, size_t *lo, size_t *hi);
/* Stage s's slice of the flat trainable parameters. */
void kiln_pipe_stage_slice(const struct kiln_pipe *pp, int s, size_t *lo, size_t *hi);
struct kiln_plan *kiln_pipe_plan0(const struct kiln_pipe *pp);
int kiln_pipe_stages(const struct kiln_pipe *pp);
int kiln_pipe_micro_batches(const struct kiln_pipe *pp);
/* Activation bytes of the plans the schedule keeps (all arenas). */
size_t kiln_pipe_arena_bytes(const struct kiln_pipe *pp);
/* One step's forwards and backwards over the batch x (rows of the
 * model's sample, as plans take them) and labels y (rows of label_bytes),
 * gradients accumulated in m->grads_d: the accumulate-th call of an
 * optimizer step leaves the mean over its accumulate x M micro-batches
 * (ready for the optimizer); the micro-step counter advanced by M. */
kiln_status kiln_pipe_step(struct kiln_pipe *pp, const void *x, const void *y, size_t label_bytes,
			   void *metrics);
/* Each stage's stream (this rank's) synchronized: after a sync of the
 * compute stream, which waited for them, their work is done already (the
 * trainer's log point; see trainer_read_metrics). */
kiln_status kiln_pipe_sync_stages(struct kiln_pipe *pp);
/* Every stage stream this process runs, the local transport's copy
 * stream (where there is one) and the rank transport's send stream,
 * drained, whatever their status (a failed stream skips its queue
 * as it drains): after a step that failed half enqueued, the stages may
 * still hold work that the trainer's stream never waited for, which reads
 * the batch's buffers and writes the transport's messages.  The teardown
 * (trainer_close's free_device, kiln_pipe_free) calls it before freeing
 * any of that (session 48). */
void kiln_pipe_drain(struct kiln_pipe *pp);
/* The measured busy times and bubble, logged (and given to the profiler):
 * before the profiler's report, once the streams are drained. */
kiln_status kiln_pipe_report(struct kiln_pipe *pp);
/* Stages on ranks: st, a failure the trainer got after this pipe's steps
 * were enqueued (a failed sync: a receive that fails on the stage's
 * stream's worker comes back there, in the communicator's words alone),
 * wrapped with the receive that started and did not finish (stage,
 * its peer's world rank, micro-batch, crossing tensor) where the stage's
 * stream failed at it; else (one process, no receive open, one still
 * under way, or one already named) st as it is
 * (kiln_pipe_rank_explain).  NULL pp: st. */
kiln_status kiln_pipe_explain(struct kiln_pipe *pp, kiln_status st);
/* Stages on ranks: the staged evaluation's receive of crossing tensor e
 * of its batch `batch` from stage `from` (kiln_pipe_rank_eval_recv),
 * explained later by kiln_pipe_explain as the step's are, and its send
 * to stage `to` (kiln_pipe_rank_eval_send).  KILN_EINTERNAL without
 * ranks, or for an e past training's crossing tensors. */
kiln_status kiln_pipe_eval_recv(struct kiln_pipe *pp, int from, int e, long long batch, void *buf,
				size_t bytes, void *stream);
kiln_status kiln_pipe_eval_send(struct kiln_pipe *pp, int to, int e, long long batch,
				const void *buf, size_t bytes, void *stream);
/* Whether staged evaluation plan p can hand its crossing tensors on
 * through pp's transport: they are training's (pp's plans') in number,
 * so each receive has a slot to be marked in.  The planner makes them so
 * (docs/pipeline.md, "Stages on ranks"); KILN_EINTERNAL, naming
 * both counts, where p has more, rather than an evaluation whose extra
 * receives would go unmarked and unexplained. */
kiln_status kiln_pipe_eval_check(const struct kiln_pipe *pp, const struct kiln_plan *p);
void kiln_pipe_free(struct kiln_pipe *pp);

#endif
