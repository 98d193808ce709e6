/* core/dist_impl.h - what core/dist.c (joining the group, DDP's buckets)
 * and core/dist_zero.c (ZeRO-1) share: the communicator's state and its
 * gradient buckets. */
#ifndef KILN_DIST_IMPL_H
#define KILN_DIST_IMPL_H

#include "dist.h"

struct bucket {
	size_t lo, hi;    /* elements of the flat gradient buffer */
	/* ZeRO-1: this rank's piece [lo + rank*c, lo + (rank+1)*c) of the
	 * bucket, at zoff in its compact shard (zgrad, zstate); the
	 * optimizer over c floats (own_plan: freed with this bucket) */
	size_t c, zoff;
	void *plan;
	int own_plan;
	int ready_layer;  /* complete after this layer's backward */
	void *done;       /* event: the allreduce finished (comm stream) */
	int started;
	/* ZeRO-1: the first layer whose forward reads a parameter in
	 * [lo, hi) (n_layers: none, padding only); gdone: the event of the
	 * bucket's parameter allgather, which the next forward waits for
	 * before that layer while gpending */
	int need_layer;
	void *gdone;
	int gpending;
	/* [dist] timing: when the comm stream began and ended its allreduce
	 * (host clock, seconds; written by host functions on that stream),
	 * and when the parameter allgather ended (ZeRO-1) */
	double t0, t1, tg;
	struct stamp { struct kiln_dist *d; int b, end; } s0, s1, sg, sw;
};

struct kiln_heartbeat;

struct kiln_dist {
	struct kiln_dist_env env;
	struct kiln_store *store;
	struct kiln_heartbeat *hb; /* [dist] heartbeat's watchdog (NULL: off) */
	const struct kiln_plugin *plugin;
	const struct kiln_comm_ops *ops;
	void *ctx;
	/* [dist] pipeline = P (core/dist_pipe.c): the gradients' communicator
	 * (this stage's D ranks; NULL: ctx) and this pipe's P ranks */
	void *gctx, *pctx;
	int pipe_P, pipe_D;
	size_t *pipe_lo, *pipe_hi; /* each stage's slice of the trainables */
	int pipe_stage;
	/* the gradient norm's agreement over the pipe (kiln_dist_pipe_norms):
	 * GRAD_CLIP over this stage's slice, device f32 [P norms | 4 state | P
	 * zeros] */
	void *pipe_measure;
	float *pipe_norms;
	int pipe_norms_new; /* not zeroed yet */
	/* the optimizer over this stage's slice alone (kiln_dist_pipe_shard):
	 * its state [state_slots][hi - lo] (NULL: no slots) and its plan;
	 * pipe_own: set up, the whole-model state freed */
	float *pipe_state;
	void *pipe_plan;
	int pipe_own;
	/* the stage's parameters and gradients alone (core/dist_pipe_mem.c):
	 * pipe_cut: m->grads_d is pipe_gbuf [P norm slots | hi - lo] shifted
	 * to the whole model's offsets, and (pipe_pbuf) m->params_d the
	 * stage's hi - lo; pipe_pwhole: the whole parameters a gather made,
	 * until kiln_dist_pipe_release */
	int pipe_cut;
	float *pipe_gbuf, *pipe_pbuf, *pipe_pwhole;
	/* the buckets start during the stage's last micro-batch's backward
	 * (m->grad_final; the loss seed holds the mean: kiln_dist_pipe_overlap) */
	int pipe_overlap;
	/* buckets started, and of those by the backward hook (during the
	 * backward; logged at close, every layout: what tests assert) */
	int64_t starts, hooked;
	struct kiln_device *dev;
	struct kiln_model *m;
	void *comm_stream;
	void *ready;      /* event on the compute stream, reused per bucket */
	struct bucket *b;
	int n_b;
	double bucket_mb;
	int overlap, overlap_now;
	int sync_bn;      /* [dist] sync_bn: layers' collectives (host->group_*) */
	void *sync_done;  /* event on the comm stream: a layer's collective done */
	int timeout_ms;
	float *scratch_d;  /* device f32[64]: host sums */
	float *scratch_h;
	/* a checkpoint's token (rank 0 to a sender, the outcome's broadcast),
	 * device and host, DIST_TOKEN_BYTES each: allocated with the
	 * communicator so that no failure path of a checkpoint needs an
	 * allocation (core/dist_pipe_ckpt.c) */
	void *tok_d, *tok_h;
	int failed;       /* a collective failed: do not wait for peers */
	int agreed;       /* every rank agreed on a checkpoint's failure
			   * (or kiln_dist_sum_agreed's): its message
			   * final (kiln_dist_explain), rank 0 still
			   * leaves last (kiln_dist_close) */
	int finished;     /* kiln_dist_finish met every rank */
	int peer_blamed;  /* kiln_dist_explain blamed a peer, the store or the
			   * communicator: no failure of this rank's own
			   * (unless this process ran out of memory asking
			   * the store: kiln_dist_failed_own) */
	char *why;        /* the failure's message as kiln_dist_leave found
			   * it (malloc'd): kiln/failed_why (close_mark_failed) */
	int run_clock;    /* kiln_run_clock_start succeeded (kiln_dist_close stops it) */
	int joined;       /* this process completed the rendezvous: only
			   * then is a failure of its the run's (a process
			   * refused at the door, "rank 1 joined twice", that
			   * said "rank 1 failed" failed the healthy run it
			   * tried to join) */
	/* ZeRO-1 ([dist] zero = 1): this rank owns the optimizer state of
	 * 1/world of every bucket (zc floats in all), and the tail
	 * [zwc, n_trainable) (zt < 16*world floats) is replicated */
	int zero, zero_gather;  /* zero_gather: the averaged gradient is
				 * gathered back whole (a clip or the
				 * non-finite check reads all of it) */
	size_t zc, zt, zwc;
	float *zstate;          /* [state_slots][zc + zt]: pieces, then the tail */
	float *zgrad;           /* f32[zc]: this rank's averaged pieces (NULL
				 * where the communicator reduce-scatters in
				 * place: dist_zero_piece) */
	void *ztplan;           /* the optimizer over the tail */
	void *zt_done;          /* event: the tail's allreduce finished */
	float *zfull;           /* the whole state while a checkpoint is taken */
	int zpending;           /* some bucket's parameter allgather is not yet
				 * waited for on the compute stream */
	/* [dist] timing = 1: host functions stamp, on the streams, when the
	 * backward ended (compute), when each bucket's allreduce ran (comm)
	 * and when the optimizer could start (compute, after the waits); the
	 * last one adds the step into the sums.  No synchronisation added. */
	int timing;
	double t_bwd_end;
	double sum_exposed, sum_comm;  /* seconds, over sum_steps steps */
	int64_t sum_steps;
	int64_t early, runs;  /* bucket collectives begun before the backward
			       * ended (overlapped), of all */
	struct stamp s_bwd, s_opt;
	/* ZeRO-1's parameter allgathers: when the compute stream reached the
	 * first reader of the parameters after them (the next forward), and
	 * how many of them completed after that (overlapped), of all */
	double t_read;
	int read_stamped;
	int64_t glate, gruns;
	struct stamp s_read;
};

enum { DIST_TOKEN_BYTES = 1024 };

/* core/dist.c: 1 when msg begins with this rank's name ("rank R: ", "rank
 * R (pipeline stage S): ", "rank R of W: "): a message not to prefix
 * with it again. */
int dist_names_rank(const struct kiln_dist *d, const char *msg);


/* core/dist.c: after this rank copied its share of the whole optimizer
 * state on `compute`, wait for the copies and free the whole state and
 * the whole-model optimizer plan (ZeRO-1, a pipeline stage on ranks) */
kiln_status dist_drop_whole_state(struct kiln_dist *d, void *compute);
/* core/dist_config.c: wait (within [dist] timeout) for key, which a
 * peer posts: *val its value (malloc'd, NUL-terminated), or NULL with
 * *who the peer that failed with its own error (*lost 0) or was lost
 * (*lost 1) first, as the store names it (else *who = -1). */
kiln_status dist_peer_read(struct kiln_dist *d, const char *key, void **val, int *who, int *lost);
/* The peer dist_peer_read named, failed or lost `before` ("the ranks
 * compared their data set sizes"), as kiln_dist_explain and the watchdog
 * name it: KILN_EIO, the peer blamed. */
kiln_status dist_peer_gone(struct kiln_dist *d, int who, int lost, const char *before);
/* core/dist.c: what rank r, the peer that failed with its own error
 * first, posted as its message (kiln/failed_why, close_mark_failed),
 * asked on s: "; rank R said: MESSAGE" into out (at most n), else ""
 * (none posted: a rank of a kiln before session 39, or one that could
 * not post it).  The survivors' "rank R ... failed with its own error
 * (its log says why)" end with it (session 39). */
void kiln_dist_failed_said(struct kiln_store *s, int r, char *out, size_t n);
#define FAILED_SAID_MAX 1100 /* kiln_dist_failed_said's out: the message's 1000 bytes and more */
/* core/dist_config.c: every rank's resolved config (and kiln) against rank
 * 0's, through the store, before the communicator opens: KILN_ECONFIG on
 * every rank, naming the first rank and key that differ, both values. */
kiln_status dist_config_agree(struct kiln_dist *d, const struct kiln_config *cfg,
			      const struct kiln_registry *reg);
/* core/dist.c: free the buckets (and the optimizer plans they own) */
void dist_free_buckets(struct kiln_dist *d);
/* core/dist.c: [dist] timing's host function stamping a bucket's
 * collective (arg: a struct stamp) */
kiln_status dist_stamp_bucket(void *arg);
/* core/dist_zero.c: allgather every bucket's pieces (this rank's from
 * `mine`, NULL: already in place) into `full` on `stream`; params: the
 * parameters (the next forward waits for them), else the gradients */
kiln_status dist_zero_allgather(struct kiln_dist *d, const float *mine, float *full, void *stream,
				int params);

/* core/dist.c: whether ZeRO-1's reduce-scatters leave their pieces in
 * place in the gradients: the communicator says reduce_scatter_in_place
 * (comm ops version 9), and the environment's KILN_TEST_RS_SEPARATE
 * (test-only, tests/dist_zero.sh) does not take it for an older one,
 * whose pieces get a buffer of their own (zgrad). */
int dist_rs_in_place(const struct kiln_comm_ops *ops);

/* core/dist_zero.c: slot k of this rank's ZeRO-1 group's optimizer state
 * whole into `full` (the whole model's layout; with [dist] pipeline the
 * stage's slice of it) on `compute`: the pieces allgathered (every rank
 * of the group takes part), the tail copied. */
kiln_status dist_zero_gather_slot(struct kiln_dist *d, int k, float *full, void *compute);

/* core/dist_zero.c: where bucket b's reduce-scatter leaves this rank's
 * averaged piece: zgrad + zoff, or in place in the gradients (lo + rank x
 * c) where the communicator says reduce_scatter_in_place */
float *dist_zero_piece(const struct kiln_dist *d, const struct bucket *b);

/* core/dist_zero.c: the communicator ZeRO-1's collectives run on: the
 * world's, or with [dist] pipeline the stage group's */
void *dist_zero_comm(const struct kiln_dist *d);

/* core/dist_heartbeat.c ([dist] heartbeat; the host names it reports
 * are kiln/host/RANK, which kiln_store_rendezvous posts).  Start the
 * watchdog thread on its own connection to the store at master:port; *out = NULL (KILN_OK) when heartbeat_s <= 0 or one rank.
 * A silent peer or an unanswering store ends the process through the
 * host's fatal handler, naming the rank and its host. */
kiln_status kiln_heartbeat_start(const struct kiln_dist_env *env, const char *master, int port,
				 double heartbeat_s, struct kiln_heartbeat **out);
/* What kiln_heartbeat_silent found besides silent peers (> 0) or none (0:
 * every peer beat within two beats and 0.5 s, and so did this rank). */
enum {
	KILN_HB_OFF = -1,        /* no watchdog (h NULL: [dist] heartbeat = 0) */
	KILN_HB_SELF_LATE = -2,  /* this rank's own beats are late: its link or the
				  * store's host, it cannot tell the peers' */
	KILN_HB_ALL_SILENT = -3, /* every peer (two or more) silent at once while
				  * this rank's beats got through: the network
				  * between the store's host and theirs, or all
				  * stopped; no one peer to name */
};
/* A silent peer: its rank, how long its counter stood still, and its host
 * name as the watchdog read it ("?" when unread). */
struct kiln_hb_silent {
	int rank;
	int64_t age_ms;
	char host[64];
};
/* The peers whose heartbeat counter this rank's watchdog has not seen
 * move for more than two beats and 0.5 s (a healthy one's moves every
 * beat, [dist] heartbeat / 4): up to max of them in out[] (their hosts
 * from the watchdog's own reading, so the caller asks the store nothing:
 * a broken or slow store cost a "?" or a [dist] timeout a name); a peer
 * that missed a beat but not two yet is watched until it moves or is
 * silent, when that is due within 3 s.  Returns their count, 0 when none,
 * or KILN_HB_OFF, KILN_HB_SELF_LATE (*self_ms: how long ago this rank's
 * last beat got through, -1 never), KILN_HB_ALL_SILENT (out[] filled as
 * for a count).  *period_ms: the beat period.  For a collective that
 * timed out (kiln_dist_explain): Gloo names the peer it waited for, which
 * may itself wait for the rank that stopped.  Thread-safe. */
int kiln_heartbeat_silent(struct kiln_heartbeat *h, struct kiln_hb_silent *out, int max,
			  int *period_ms, int64_t *self_ms);
/* This rank's own error path began, its error explained (kiln_dist_leave):
 * from now on the watchdog still beats, so the peers do not call the
 * teardown silence, but reads no peer (kiln_heartbeat_silent's view stands
 * still) and ends this rank no more (a peer's FAILED mark, silence, the store
 * gone), so the rank tells its own error, not a peer's that failed at the
 * same time.  Once it returns no watchdog end starts.  NULL: no-op. */
void kiln_heartbeat_leave(struct kiln_heartbeat *h);
/* End the thread; finished: mark this rank done so its peers stop
 * watching it.  NULL: no-op. */
void kiln_heartbeat_stop(struct kiln_heartbeat *h, int finished);
/* Post this rank's [dist] heartbeat (kiln/hb_limit/RANK, ms, 0: off)
 * before the config check: the peers' watchdogs judge its silence by it,
 * the key being one that may differ between ranks. */
kiln_status kiln_heartbeat_post(struct kiln_store *s, int rank, double heartbeat_s);
/* Mark this rank's heartbeat counter FAILED (its own error, after the
 * rendezvous): every peer's watchdog ends its rank at its next beat,
 * naming this one (whatever this rank's own heartbeat, 0 included).
 * Waits at most timeout_ms for the store (kiln_store_add_within). */
void kiln_heartbeat_mark_failed(struct kiln_store *s, int rank, int timeout_ms);

#endif
