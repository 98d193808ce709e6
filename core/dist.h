/* core/dist.h - the data-parallel engine inside libkiln (core/dist.c).
 *
 * One per training run when the run has more than one rank (or names a
 * communicator).  It joins the group (store + rendezvous + comm plugin),
 * broadcasts rank 0's training state, and during backward allreduces the
 * gradients in buckets on its own comm stream, each bucket as soon as the
 * backward of the last layer that writes into it has been enqueued. */
#ifndef KILN_CORE_DIST_H
#define KILN_CORE_DIST_H

#include "graph.h"
#include <kiln/dist.h>

struct kiln_dist;

/* Join the group the environment describes with [run] comm.  *out = NULL
 * (and KILN_OK) for a single process without a named communicator.  On
 * failure *own (when own is set) says whether it is this rank's own
 * (kiln_dist_failed_own; out of memory always; before the rendezvous
 * completed, nothing else: the store not reached, the rendezvous timed
 * out or stopped follow from the group's). */
kiln_status kiln_dist_open(const struct kiln_config *cfg, const struct kiln_registry *reg,
			   struct kiln_device *dev, struct kiln_dist **out, int *own);
/* After a run that ended well on this rank: drain the comm stream and
 * wait, through the store and within [dist] timeout, until every rank has
 * done so, so that no rank closes the communicator while a peer is still
 * in the last collective (Gloo fails that peer's wait with "Connection
 * closed by peer" even when its data arrived).  NULL, world 1: KILN_OK. */
kiln_status kiln_dist_finish(struct kiln_dist *d);
/* After the data sets opened: every rank posts its n sample counts
 * (names[i]: the section, "[data]"), through the store, and compares them
 * with every other rank's; ranks that read different files at the same
 * path (another node's copy) would step different epochs and meet in
 * different collectives (a hang until [dist] timeout, called a stuck
 * peer).  Any difference fails every rank at once, KILN_EDATA, naming the
 * section and each rank's count; a peer that failed or was lost before
 * posting ends the wait.  NULL, world 1: KILN_OK. */
kiln_status kiln_dist_agree_sizes(struct kiln_dist *d, const char *const *names,
				  const int64_t *n, int k);
/* After kiln_dist_agree_sizes: every rank's k data sets the same
 * (kiln_dataset_identity's texts[i], lens[i] bytes: the shapes, the
 * transforms, each file's path, size and ends) as rank 0's, through the
 * store (digests; only the first chunk that differs travels,
 * core/dist_data.c): ranks reading another copy of the same size at the
 * same path would train on other data without a word.  A difference
 * fails every rank at once, KILN_EDATA, naming the section, the first
 * rank that differs, the file (or line) and what differs; a peer that
 * failed or was lost on the way ends the wait.  NULL, world 1: KILN_OK. */
kiln_status kiln_dist_agree_data(struct kiln_dist *d, const char *const *names, char *const *texts,
				 const size_t *lens, int k);
/* How long kiln_dist_open waits before it connects (restart_wait): for
 * a rank other than 0 that `kiln launch --max-restarts` started again
 * (KILN_RESTART > 0), STORE_LINGER_MS + 1 s, so the failed run's store,
 * which serves its last clients up to STORE_LINGER_MS, is closed; else 0. */
int kiln_dist_restart_wait_ms(const struct kiln_dist_env *env);
/* This rank's own error path began (trainer_close with a failure, after
 * kiln_dist_explain, which reads the watchdog's view of the peers): its
 * heartbeat watchdog ends it no more, so the rank tells its own error
 * first, not the "rank N failed with its own error" of a peer that
 * failed at the same time and marked itself FAILED during this rank's
 * teardown (kiln_heartbeat_leave).  NULL: no-op. */
void kiln_dist_leave(struct kiln_dist *d);
/* Wait for every rank (store barrier), leave the group, free. NULL: no-op. */
void kiln_dist_close(struct kiln_dist *d);
/* Whether this rank's failure (after kiln_dist_explain) is its own: 1, the
 * failure began here (a file, the device, out of memory; an allocation of
 * this process that failed asking the store counts so whatever the
 * caller made of it), or 0, it followed from the group's (a peer lost,
 * failed or stuck, the store gone, an outcome every rank agreed on, a
 * stop asked for).  Its peers are told the former (kiln/failed_rank,
 * kiln/failed_why), and so is `kiln launch` (kiln_train_failed_own).
 * NULL or one rank: 1. */
int kiln_dist_failed_own(struct kiln_dist *d);
int kiln_dist_rank(const struct kiln_dist *d);  /* 0 for NULL */
int kiln_dist_world(const struct kiln_dist *d); /* 1 for NULL */
/* The communicator plugin's name ("gloo", "mpi", "nccl"); NULL for NULL. */
const char *kiln_dist_comm_name(const struct kiln_dist *d);

/* Move m's gradients into memory every rank's communicator reaches
 * directly (comm ops alloc_shared: kiln-mpi on one node), so that the
 * bucket allreduces need no staging copies: right after the model is made,
 * before any plan or collective.  Collective.  A communicator without such
 * memory (or ZeRO-1 with [dist] pipeline, or one rank) leaves them where they are, saying why
 * in the log; only other failures are errors.  The memory is freed when
 * the communicator closes (m->grads_foreign). */
kiln_status kiln_dist_share_grads(struct kiln_dist *d, struct kiln_model *m);
/* `kiln memory`'s guess, from cfg and the launcher's env alone, of what
 * the communicator a run of env's ranks opens ([run] comm, auto resolved
 * as kiln_dist_open does) will do: *grads_shared, whether
 * kiln_dist_share_grads will give a run without [dist] pipeline shared
 * memory for its gradients (more than one rank, all on one node, a
 * communicator with alloc_shared, its [plugin.NAME] shm and zero_copy not
 * 0: gloo's and mpi's keys; the room in /dev/shm is kiln memory's to
 * check, core/memory.c; the run logs where the gradients went);
 * *in_place, whether ZeRO-1's
 * reduce-scatters leave their pieces in the gradients (comm ops
 * reduce_scatter_in_place).  Both 0 for one rank. */
void kiln_dist_comm_guess(const struct kiln_config *cfg, const struct kiln_registry *reg,
			  struct kiln_device *dev, const struct kiln_dist_env *env,
			  int *grads_shared, int *in_place);
/* A ZeRO-1 rank's shard of the n trainable floats over `world` ranks
 * (without [dist] pipeline): the floats it updates in the buckets'
 * pieces, (n - tail) / world, besides the replicated tail every rank
 * keeps, n mod (16 x world) floats (core/dist_zero.c). */
size_t kiln_dist_zero_tail(size_t n, size_t world);
/* Set up the buckets over m's trainable gradients and hook m's backward.
 * `compute` is the stream backward runs on. */
kiln_status kiln_dist_attach(struct kiln_dist *d, struct kiln_model *m, void *compute);
/* Copy rank 0's training state (every kiln_model_state_buffers entry) to
 * all ranks; waits for it. */
kiln_status kiln_dist_broadcast_state(struct kiln_dist *d, void *compute);
/* Before an evaluation during training: rank 0's non-trained buffers
 * (batchnorm running statistics) on every data-parallel rank, which then
 * evaluates its share of the set with the model rank 0 checkpoints, as
 * PyTorch's DDP (broadcast_buffers) copies rank 0's buffers to the others
 * before a forward; without it the shares' batchnorm statistics would be
 * each rank's (its own batches'), and the set's result a mix.  Over the
 * stage group, from pipe 0's rank, where a [dist] pipeline evaluates per
 * stage (kiln_dist_pipe_eval_staged); nothing where the gather
 * (kiln_dist_pipe_gather) gave every rank pipe 0's, under [dist] sync_bn
 * (the same on every rank), without buffers or with one data-parallel
 * rank.  The other ranks keep rank 0's statistics and update them from
 * their own batches as before (core batchnorm's training forward
 * normalises by the batch's statistics: no gradient nor parameter
 * changes; a plugin layer's is_buffer state that its training forward
 * reads does change the other ranks' training: docs/plugins.md).  A collective
 * on the compute stream; a failure is the collective's.  OK for NULL d. */
kiln_status kiln_dist_eval_buffers(struct kiln_dist *d, void *compute);
/* Whether the coming backward is the one whose gradients are final (the
 * last micro-step, its layers' ops adding into the gradients: not with a
 * second buffer added after it): buckets then start during it, each
 * after its ready layer's backward (with [dist] overlap). */
void kiln_dist_overlap_next(struct kiln_dist *d, int on);
/* [dist] overlap as read when d opened (0 for NULL: one process) */
int kiln_dist_overlap(const struct kiln_dist *d);
/* After the last micro-step's backward (and accumulation's add):
 * start the buckets that have not started, and make `compute` wait for all
 * of them before the optimizer. */
kiln_status kiln_dist_finish_grads(struct kiln_dist *d, void *compute);
struct kiln_ckpt; /* checkpoint.h */
/* ZeRO-1 ([dist] zero = 1; core/dist_zero.c explains the layout).  After
 * kiln_dist_broadcast_state: allocate this rank's shard of the optimizer
 * state and prepare the optimizer over it.  The shard's values: this
 * rank's pieces of the model's whole state where it has one (freed then:
 * [dist] pipeline's model), else (kiln_model_create_sharded) zeros, or,
 * when `file` (rank 0's checkpoint, broadcast by trainer_resume) is not
 * empty, its slots read by rank 0 (from `ck`, its open checkpoint of
 * `file`, when not NULL) and broadcast one at a time through the
 * gradient buffer, so that no rank holds the whole state.  `clip`: a clip
 * or unscale op reads the whole averaged gradient before the optimizer
 * (it is then gathered back).  KILN_ECONFIG for LAMB.  No-op without
 * ZeRO. */
kiln_status kiln_dist_zero_init(struct kiln_dist *d, void *compute, int clip, const char *file,
				 struct kiln_ckpt *ck);
int kiln_dist_zero(const struct kiln_dist *d); /* 0 for NULL */
/* The optimizer step under ZeRO-1, in place of kiln_model_optim_step:
 * advance the step counter (gated by the finite flag like
 * kiln_model_optim_step's), update this rank's shard and the tail, and
 * allgather the parameters (on the comm stream with [dist] overlap: see
 * kiln_dist_zero_settle). */
kiln_status kiln_dist_zero_step(struct kiln_dist *d, const float *lr, void *compute);
/* With [dist] overlap (the default) the step's parameter allgathers run
 * on the comm stream, one completion event per bucket, and the next
 * forward waits for each bucket before the first layer that reads it (the
 * model's fwd_hook, installed by kiln_dist_zero_init).  Anything else that
 * reads the parameters (or runs a collective on `stream`) first calls
 * _settle: `stream` waits for every allgather not yet waited for.  No host
 * synchronisation; a no-op without ZeRO or when none is pending.  The
 * dist functions below that run collectives on `stream` settle
 * themselves; a captured step settles before its end, so a replay leaves
 * no allgather pending (its comm stream rejoins the capture). */
kiln_status kiln_dist_zero_settle(struct kiln_dist *d, void *stream);
/* Before a checkpoint (every rank, collective): settle the parameter
 * allgathers and (but where kiln_dist_zero_streams) gather the optimizer
 * state whole into a temporary buffer the model's state_d points at, so
 * kiln_model_state_buffers lists it as without ZeRO; _release frees it.
 * No-ops without ZeRO. */
kiln_status kiln_dist_zero_gather(struct kiln_dist *d, void *compute);
void kiln_dist_zero_release(struct kiln_dist *d);
struct kiln_ckpt_meta;
/* Whether a ZeRO-1 checkpoint streams the optimizer state instead
 * (kiln_dist_zero_save): its model was made without the whole state
 * (kiln_model_create_sharded, no [dist] pipeline).  0 for NULL. */
int kiln_dist_zero_streams(const struct kiln_dist *d);
/* When kiln_dist_zero_streams, after kiln_dist_zero_gather (which then
 * only settles) and in place of rank 0's kiln_ckpt_save (every rank,
 * collective; `st`: this rank's outcome so far): rank 0 writes
 * dir/ckpt-<step>.kiln (path as kiln_ckpt_save's) unless st failed, each
 * optimizer slot allgathered whole into the gradient buffer just before
 * the write reaches it (the state is never whole in memory); every rank
 * runs every slot's allgather whatever failed, the ranks agree on them
 * (rank 0 before its file stands: it fails, "not written", when another
 * rank's failed), and each zeroes its gradients.  Returns st, else the
 * first failure's. */
kiln_status kiln_dist_zero_save(struct kiln_dist *d, kiln_status st, const char *dir,
				const struct kiln_ckpt_meta *meta, void *compute, char *path,
				size_t path_len);
/* [dist] timing = 1: the sums since the start, over *steps optimizer
 * steps, of the exposed communication (from the end of backward on the
 * compute stream to the optimizer's start after the bucket waits) and of
 * the buckets' allreduce time on the comm stream, in seconds.  Read after
 * a sync of the compute stream.  Zeros without timing (or ZeRO). */
void kiln_dist_timing(struct kiln_dist *d, double *exposed_s, double *comm_s, int64_t *steps);
/* Copy rank 0's host bytes buf[0..bytes) to every rank's buf (through a
 * temporary device buffer; a sync point: start-up only).  `mine` is this
 * rank's own step before it (KILN_OK when none): it and the temporary
 * buffers are agreed on before the broadcast (kiln_dist_sum_agreed, `what`
 * naming the exchange), so a rank that failed alone fails every rank
 * together; a failed collective reads "rank R of W: WHAT: ...".  `mine`
 * itself for NULL d. */
kiln_status kiln_dist_broadcast_host(struct kiln_dist *d, kiln_status mine, const char *what,
				     void *buf, size_t bytes, void *compute);
/* Every rank's host bytes v[0..bytes) into all[world * bytes], in rank
 * order (the communicator's allgather over every rank, bytes as they are:
 * exact where kiln_dist_sum_host's f32 sum is not; a sync point:
 * checkpoints only), agreed on first as kiln_dist_broadcast_host.
 * all = v (and `mine` returned) for NULL d. */
kiln_status kiln_dist_allgather_host(struct kiln_dist *d, kiln_status mine, const char *what,
				     const void *v, void *all, size_t bytes, void *compute);
/* The tests' fault injection, test-only (core/dist_pipe_ckpt.c): 1 on
 * rank 0 (rank R for "STEP@R") when the environment's KILN_TEST_CKPT_FAIL
 * names `step`, a step of a checkpoint's write or of the checks around it
 * that then fails as if the device or the communicator had: "event" (the
 * comm stream's event before a pipeline's streamed write), "buffers"
 * (rank 0's receives of the stages' layer buffers), "alloc" (rank 0's
 * receive buffer of a piece), "gather" (ZeRO-1: rank 0's buffer of the
 * whole optimizer state), "params" (the parameters' non-finite check, at
 * a log point and before a checkpoint: core/train_log.c), "sums" (the read
 * of the device's metric sums for a checkpoint's, or an early-stopped
 * epoch's, training sums: trainer_metrics_peek), "sync" (a checkpoint's
 * sync of the steps queued on the device, core/train_ckpt.c), "clip"
 * (a checkpoint's read of the clip op's counts: trainer_clip_counts),
 * "best" (keep_best's list for a checkpoint: trainer_best_meta), "resume"
 * (the buffer of rank 0's resume message, every rank's: trainer_resume),
 * "resume_iv" (a rank's buffer of the log interval rank 0 resumed with;
 * rank 0 holds it already, and fails as if: resume_interval), "staged"
 * (the device and pinned host buffers of a host-staged collective,
 * kiln_dist_broadcast_host and kiln_dist_allgather_host: at a resume
 * first rank 0's message), "eval" (the load of the first batch of the rank's share of an evaluation
 * during training, core/train_eval.c eval_batch), "test" (the same of
 * [data.val]'s final test), "cut" (the read of the metric sums after a
 * stop cut an evaluation short, core/train_eval.c eval_pass_cal), "whole"
 * (the whole parameter buffer of a [dist] pipeline's gather,
 * kiln_dist_pipe_whole_agreed), "evalbuf" (the local steps before the
 * broadcast of rank 0's buffers for an evaluation, kiln_dist_eval_buffers,
 * agreed before it), "cause" (a rank's read of the cause of a stop that
 * another rank posted, trainer_dist_stop_cause_read).  Unset in any
 * real run (docs/checkpoints.md "A failed write"; tests/ckpt_fault.sh,
 * tests/agreed_fault.sh, tests/eval_fault.sh). */
int kiln_dist_ckpt_fault(const struct kiln_dist *d, const char *step);
/* kiln_dist_ckpt_fault's fault as a status: KILN_OK where `step` is not
 * the one injected (or on another rank), else KILN_EDEVICE "WHAT: failed
 * (the tests' fault: KILN_TEST_CKPT_FAIL=...)". */
kiln_status kiln_dist_ckpt_fault_at(const struct kiln_dist *d, const char *step, const char *what);
/* Sum v[0..n) over the ranks (host values; a sync point: log only).  The
 * sum is an f32 allreduce: exact for integers only up to 2^24. */
kiln_status kiln_dist_sum_host(struct kiln_dist *d, double *v, int n, void *compute);
/* kiln_dist_sum_host of v[0..n) (n <= 62) after this rank's own step `what`
 * ended in st: a rank whose step failed still takes part in the sum (its
 * peers would wait in it), with a flag that fails every rank together: st
 * here ("rank R of W: WHAT: " and its message), "rank R of W: WHAT: rank F
 * failed (its message says why)" on the others (the count of failed ranks when several); an
 * agreed failure, final (kiln_dist_explain).  v holds the sums in any
 * case the sum itself succeeded.  st itself without a communicator. */
kiln_status kiln_dist_sum_agreed(struct kiln_dist *d, kiln_status st, double *v, int n,
				 const char *what, void *compute);
/* Counts: v[0..n) (n <= 10, each in [0, 2^48)) summed over the ranks
 * exactly, whatever the total (kiln_dist_sum_host of their 8-bit limbs,
 * exact in f32 for up to 65793 ranks).  The limbs of v into
 * limbs[0..n * KILN_COUNT_LIMBS) and back, apart for the tests. */
#define KILN_COUNT_LIMBS 6
kiln_status kiln_dist_sum_counts(struct kiln_dist *d, int64_t *v, int n, void *compute);
void kiln_count_limbs(const int64_t *v, int n, double *limbs);
void kiln_count_join(const double *limbs, int n, int64_t *v);
/* A stop not the user's on this rank (kiln_train_request_stop_cause):
 * "rank R of W (node N, host H): cause" in the store, where every rank
 * reads it into out[0..n) after the stop's agreement (..._read; the last
 * posted when several ranks posted one; out unchanged when none). */
kiln_status kiln_dist_stop_cause_post(struct kiln_dist *d, const char *cause);
kiln_status kiln_dist_stop_cause_read(struct kiln_dist *d, char *out, size_t n);
/* A failed step: when the failure looks like a lost peer, say which rank
 * was lost (asking the store), keeping st. */
kiln_status kiln_dist_explain(struct kiln_dist *d, kiln_status st);

/* A failure of this rank's set-up (trainer_open), named "rank R of W: "
 * as every rank's own errors are, unless its message names this rank
 * already or is an outcome every rank agreed on (the config check's
 * verdict): rank 0's refused out_dir, a plugin of its own, ...  Not
 * KILN_EIO, KILN_ETIMEOUT, KILN_EDEVICE: kiln_dist_explain names those
 * (trainer_close).  st unchanged; nothing when d is NULL or st is KILN_OK. */
kiln_status kiln_dist_name_own(const struct kiln_dist *d, kiln_status st);

/* [dist] sync_bn = 1 (0 for NULL). */
int kiln_dist_sync_bn(const struct kiln_dist *d);
/* host->group_allreduce and group_allgather (group: a struct kiln_dist):
 * the comm stream waits for `stream`'s work so far, runs the collective,
 * and `stream` waits for it. */
kiln_status kiln_dist_group_allreduce(void *group, void *buf, size_t count, int dtype, int op,
				      void *stream);
kiln_status kiln_dist_group_allgather(void *group, const void *send, void *recv, size_t count,
				      int dtype, void *stream);

/* comm ops sendrecv (core/comm_p2p.c): ops->sendrecv where the
 * communicator has it (version 7), else a send and a recv on `stream` in
 * rank order (rank: this rank's in comm), KILN_ENOTSUP when dst != src. */
kiln_status kiln_comm_sendrecv(const struct kiln_comm_ops *ops, void *comm, int rank,
			       const void *send_buf, size_t send_count, int dst, void *recv_buf,
			       size_t recv_count, int src, int dtype, void *stream, void *done);

/* host->device_host_fn (core/device.c) and host->fatal. */
kiln_status kiln_device_host_fn(struct kiln_device *dev, void *stream, kiln_status (*fn)(void *),
				void *arg);
void kiln_host_fatal(const char *who, const char *fmt, ...) KILN_PRINTF(2, 3);
/* 1 when the program set a fatal handler (kiln_set_fatal_handler), which
 * ends the process: kiln_host_fatal does not return (the heartbeat's
 * watchdog counts its rank's leaving first). */
int kiln_host_fatal_ends(void);
/* host->device_capturing (core/device.c): 1 between capture_begin and
 * capture_end on dev. */
int kiln_device_capturing(struct kiln_device *dev);

/* [dist] pipeline = P: the communicator's split alone (the checks and the
 * two groups of kiln_dist_pipe_open below), right after joining, so that
 * the gradients' shared memory (kiln_dist_share_grads) is the stage
 * group's; kiln_dist_pipe_open then does not split again. */
kiln_status kiln_dist_pipe_split(struct kiln_dist *d, const struct kiln_config *cfg, int P);
/* [dist] pipeline = P (core/dist_pipe.c, docs/pipeline.md "Stages on
 * ranks"): the world of P x D ranks as D pipes of P stages, rank r being
 * stage r % P of pipe r / P.  Collective: splits the communicator into
 * this pipe's P ranks (*pcomm, ranked by stage) and this stage's D ranks
 * (the data-parallel group, which DDP's buckets allreduce over from now
 * on); *stage, *pipe and *D say where this rank is.  lo[s], hi[s]:
 * stage s's slice of the flat trainable buffers, for the gather.  KILN_ECONFIG naming
 * the key when the world is not a multiple of P, ZeRO-1 is on, or the
 * communicator is kiln-mpi without [plugin.mpi] thread_level = multiple
 * (the transport's sends and a stage's receives are two threads in MPI);
 * KILN_ENOTSUP when the communicator cannot split. */
kiln_status kiln_dist_pipe_open(struct kiln_dist *d, const struct kiln_config *cfg, int P,
				const size_t *lo, const size_t *hi, const struct kiln_comm_ops **ops,
				void **pcomm, int *stage, int *pipe, int *D);
/* Every rank gets each stage's training state from the stage's rank in
 * pipe 0 (world rank s): the trainable parameters and (when not held per
 * stage: kiln_dist_pipe_shard) the optimizer's state in [lo[s], hi[s])
 * of the flat buffers, and the non-trained
 * buffers of the stage's layers (m->stage).  Before a checkpoint (in
 * kiln_dist_zero_gather), an evaluation and the end of training: what is
 * written or evaluated is whole.  Collective over the world; waits for
 * it.  No-op without [dist] pipeline. */
kiln_status kiln_dist_pipe_gather(struct kiln_dist *d, void *compute);
/* After kiln_dist_broadcast_state (and kiln_dist_pipe_open): the
 * optimizer steps only this stage's slice [lo, hi) of the flat
 * trainables, and only that slice's optimizer state is kept (the model's
 * whole state freed): slots x (hi - lo) floats instead of slots x
 * n_trainable.  An optimizer that does not shard (LAMB: offsets of the
 * whole model) keeps stepping the whole model, as before (logged).
 * Then (also under ZeRO-1, which shards the state itself) the parameters
 * are cut to the stage's where the gradients were
 * (kiln_dist_pipe_cut_params).  No-op without [dist] pipeline. */
kiln_status kiln_dist_pipe_shard(struct kiln_dist *d, void *compute);
int kiln_dist_pipe_owns(const struct kiln_dist *d); /* _shard kept a slice (0 for NULL) */
/* The optimizer step when kiln_dist_pipe_owns, in place of
 * kiln_model_optim_step: the step counter advanced (gated), this stage's
 * slice updated. */
kiln_status kiln_dist_pipe_step(struct kiln_dist *d, const float *lr, void *compute);
/* Before a checkpoint (kiln_dist_zero_gather calls it; every rank): the
 * optimizer state whole on rank 0, which writes it, in a temporary buffer
 * its model's state_d points at (freed by kiln_dist_zero_release), each
 * stage's slice sent to it by the stage's rank in pipe 0 (point-to-point
 * on the world's communicator); then kiln_dist_pipe_gather. */
kiln_status kiln_dist_pipe_gather_state(struct kiln_dist *d, void *compute);
/* Before the clip / non-finite check of an optimizer step ([train]
 * clip_norm, clip_value, skip_nonfinite) with [dist] pipeline: every rank
 * of the pipe learns every stage's gradient norm (an allreduce of P
 * floats over the pipe) and writes the other stages' norms into the first
 * element of their slices, which are zero here, so that the check's norm
 * over the whole buffer is the pipe's: every stage clips by the same
 * factor, and a non-finite gradient on one stage skips the step on all.
 * kiln_dist_pipe_norms_done (after the check) zeroes those elements
 * again.  On the compute stream; no-op without [dist] pipeline. */
kiln_status kiln_dist_pipe_norms(struct kiln_dist *d, void *compute);
/* After kiln_dist_attach (and kiln_dist_zero_init), with [dist] pipeline
 * and [dist] overlap: this stage's buckets start during its last
 * micro-batch's backward (the backward hook while m->grad_final), layer by
 * layer as DDP's do; the loss layers' seed holds the mean over the
 * micro-batches (pipe_open.c seed_mean), so nothing scales them (before
 * session 37 a bucket was scaled to it first where a loss scaler kept it
 * out of the seed).  *on = 0 (nothing done) without buckets, pipeline or
 * overlap. */
kiln_status kiln_dist_pipe_overlap(struct kiln_dist *d, int *on);
kiln_status kiln_dist_pipe_norms_done(struct kiln_dist *d, void *compute);

/* A stage's parameters and gradients on its rank alone (core/dist_pipe_mem.c,
 * docs/pipeline.md "Stages on ranks").  After kiln_dist_pipe_open, before
 * anything writes a gradient: this rank's gradients become its stage's
 * slice [lo, hi) alone (after P slots for the other stages' norms), in
 * the stage group's shared memory when share (D > 1), the communicator
 * has it and ZeRO-1 is off; m->grads_d keeps the whole model's offsets.
 * Where the gradients must stay whole (an optimizer that does not shard,
 * loss scaling: logged) it does what kiln_dist_share_grads does when
 * share. */
/* At start-up, for a model made with kiln_model_create_bare after its
 * precision is open, before anything reads its parameters: with [dist]
 * pipeline, where the stage's parameters and gradients can be held alone
 * (as kiln_dist_pipe_cut_grads and _cut_params would cut them, no ZeRO-1),
 * they are allocated for the stage's slice
 * alone ([P norm slots | slice] gradients, zeroed; as _cut_grads: share)
 * and the model marked held (m->held: kiln_model_init_params draws the
 * slice, the optimizer state is the stage's, from kiln_dist_pipe_shard);
 * the cuts then find them cut.  Else kiln_model_alloc_whole (the reason
 * logged).  Without a pipeline (d NULL too): kiln_model_alloc_whole. */
kiln_status kiln_dist_pipe_hold(struct kiln_dist *d, struct kiln_model *m, int share,
				void *compute);
/* An evaluation per stage (core/dist_pipe_eval.c): 1 when this rank
 * holds its stage's parameters alone since start-up (kiln_dist_pipe_hold),
 * so that its evaluation plans are staged and run per stage instead of on
 * a gathered whole model. */
int kiln_dist_pipe_eval_staged(const struct kiln_dist *d);
/* The forward of batch `batch` (counted from 0 in the pass: what the
 * hand-offs' messages name) of staged plan p, this rank's stage's layers:
 * the crossing tensors from earlier stages' ranks received (by pp's
 * transport, kiln_pipe_eval_recv: marked, so that kiln_pipe_explain
 * names one that fails on the stream's worker), the ones later stages
 * read sent (kiln_pipe_eval_send), all on the compute stream; the last
 * stage's loss layer adds to metrics.  *own: the rank's own failure in
 * the evaluation, the layers' here or an earlier step's (set on entry:
 * the layers are not run); the hand-offs are made either way, of
 * whatever the buffers hold, so that no peer waits for this rank (the
 * evaluation's outcome agreed at its end: core/train_eval.c).  The
 * return: a hand-off's failure (the transport's). */
struct kiln_pipe;
kiln_status kiln_dist_pipe_forward(struct kiln_dist *d, struct kiln_pipe *pp, struct kiln_plan *p,
				   long long batch, const void *x, const void *labels,
				   void *metrics, void *compute, kiln_status *own);
/* After an evaluation's batches: the n metric sums (device f32) summed
 * over the pipe, so every rank reads the last stage's. */
kiln_status kiln_dist_pipe_eval_sums(struct kiln_dist *d, float *metrics, int n, void *compute);
/* n floats at p (device memory) set to zero on the compute stream,
 * waited for. */
kiln_status kiln_dist_pipe_zero(struct kiln_dist *d, float *p, size_t n, void *compute);
kiln_status kiln_dist_pipe_cut_grads(struct kiln_dist *d, struct kiln_model *m, int share,
				     void *compute);
/* In kiln_dist_pipe_shard (after the broadcast or the resume, and
 * ZeRO-1's sharding), where the gradients were cut: the parameters too,
 * unless low-precision compute, frozen parameters or a weight tied across
 * stages need them whole; logs what is held. */
kiln_status kiln_dist_pipe_cut_params(struct kiln_dist *d, void *compute);
/* In kiln_dist_pipe_gather: a whole parameter buffer (this stage's slice
 * copied in) that m->params_d points at until kiln_dist_pipe_release,
 * which waits for the compute stream and frees it (after a checkpoint or
 * an evaluation; no-op when nothing was made whole).  The copy reads the
 * slice on `compute`: the caller first orders it after the comm stream's
 * work (ZeRO-1's parameter allgathers). */
kiln_status kiln_dist_pipe_whole(struct kiln_dist *d, void *compute);
/* Every rank, before a gather's collectives: this rank's step st (its
 * kiln_dist_pipe_whole, or KILN_OK where it makes nothing whole) agreed
 * on (kiln_dist_sum_agreed, "gathering the stages' parameters"), so that
 * an allocation that failed on one rank fails every rank together (the
 * tests' fault "whole", kiln_dist_ckpt_fault, stands for it). */
kiln_status kiln_dist_pipe_whole_agreed(struct kiln_dist *d, kiln_status st, void *compute);
kiln_status kiln_dist_pipe_release(struct kiln_dist *d, void *compute);
/* For a checkpoint, which rank 0 alone writes, on ranks holding their
 * stage's alone since start-up: every stage's parameters and layer buffers
 * at rank 0 alone (its whole buffer, as kiln_dist_pipe_whole's; each stage
 * sent by its rank in pipe 0); the other ranks make nothing whole. */
kiln_status kiln_dist_pipe_gather_to0(struct kiln_dist *d, void *compute);
/* core/dist_pipe_ckpt.c.  1 when a checkpoint can be written with no rank
 * holding the whole model: stages on ranks, each holding its stage's
 * parameters and optimizer state alone (not ZeRO-1, nothing gathered). */
int kiln_dist_pipe_ckpt_streams(const struct kiln_dist *d);
/* Every rank (collective over pipe 0; the other pipes return at once):
 * rank 0 writes dir/ckpt-<step>.kiln as kiln_ckpt_save would of the whole
 * model, each stage's slice streamed to it in pieces by its rank in pipe
 * 0 (the final path into path on rank 0).  st: this rank's preparation
 * before the call (rank 0's check of the run directory), failed: agreed
 * on as the rank's own, nothing exchanged. */
kiln_status kiln_dist_pipe_ckpt_save(struct kiln_dist *d, kiln_status st, const char *dir,
				     const struct kiln_ckpt_meta *meta, void *compute, char *path,
				     size_t path_len);
/* Every rank (a collective over the world) after a checkpoint's write to
 * dir/ckpt-<step>.kiln, st this rank's outcome (rank 0's: the write's,
 * its cause the last error): the ranks sum a failure flag (one float on
 * success) and, when one failed, rank 0's cause is broadcast (1 KiB).
 * Returns on rank 0 its failure naming rank 0 and the file, on a rank
 * that failed its own message naming it and the file, on the others an
 * error naming rank 0, the file and rank 0's cause (or that a rank
 * failed); st unchanged for NULL (one process).  A failure's message is
 * then final (kiln_dist_explain leaves it), and every rank holds rank 0's
 * cause before rank 0 may exit (a trailing sum).  No allocation. */
kiln_status kiln_dist_ckpt_agree(struct kiln_dist *d, kiln_status st, const char *dir,
				 int64_t step, void *compute);
/* Every rank (a collective over the world) after a checkpoint's local
 * preparation, *st its outcome: 1 when every rank's succeeded; 0 when one
 * failed (or the sum did), and then every rank goes straight to
 * kiln_dist_ckpt_agree with *st (this rank's own outcome, its message
 * kept; the sum's failure where that failed).  1 for NULL when *st is OK. */
int kiln_dist_ckpt_ready(struct kiln_dist *d, kiln_status *st, void *compute);
/* ZeRO-1 before a checkpoint (every rank, local): the buffer
 * kiln_dist_zero_gather gathers the whole optimizer state into (the one
 * step of it that fails on one rank alone; kiln_dist_ckpt_ready agrees
 * on it before the gather's collectives).  No-op without ZeRO-1 and
 * where kiln_dist_zero_streams. */
kiln_status kiln_dist_zero_prepare(struct kiln_dist *d);
/* 1 when a [train] resume can load each rank's stage alone: it holds its
 * stage's parameters alone since start-up (kiln_dist_pipe_hold). */
int kiln_dist_pipe_resumes(const struct kiln_dist *d);
/* Every rank, after kiln_dist_pipe_shard: open and verify `file` (rank 0
 * chose it; `ck`, when not NULL, is it open and verified already: rank
 * 0's) and load this rank's stage from it (kiln_ckpt_load_stage:
 * its parameters' and optimizer slots' slice, the buffers, the counters);
 * the ranks agree on the outcome, so a rank that cannot read it names the
 * file and every other rank fails too. */
kiln_status kiln_dist_pipe_resume(struct kiln_dist *d, const char *file, struct kiln_ckpt *ck,
				   void *compute);
/* 1 when this rank holds its stage's parameters and gradients alone (and
 * they are not whole now): [*lo, *hi) of the flat buffers. */
int kiln_dist_pipe_held(const struct kiln_dist *d, size_t *lo, size_t *hi);
/* 1 when this rank's gradients are cut: *g, *n the buffer [P slots |
 * the stage's slice] that the clip and non-finite check run over (0:
 * untouched, the whole trainables). */
int kiln_dist_pipe_grad_span(const struct kiln_dist *d, float **g, size_t *n);
/* In kiln_dist_close: the model's pointers back on the allocations. */
void kiln_dist_pipe_mem_free(struct kiln_dist *d);

#endif
