/* core/pipe_rank.c - the stage transport across ranks (docs/pipeline.md,
 * "Stages on ranks"): stage s runs on rank rank_of[s] of a communicator
 * (world rank world_of[s]: what the messages name),
 * and every crossing tensor moves by the communicator's point-to-point
 * send and recv (comm ops version 4), matched in order per pair of ranks:
 * both sides issue a pair's messages in the schedule's order.
 *
 * A send never makes the sender's stream wait for the receiver.  The
 * tensor is copied, on the sender's stream, into a staging slot of its
 * own (one per tag: micro-batch, tensor, direction), and the
 * communicator's send of that slot runs on the transport's send stream
 * after the copy.  With the send on the stage's own stream, 1f1b would
 * deadlock: stage 0 sending micro-batch 1's activation waits until stage 1
 * posts its receive, which stage 1 reaches only after sending micro-batch
 * 0's gradient, which waits for stage 0's receive behind that send.  A
 * recv runs on the receiver's stream: what reads the tensor waits for it.
 * The step's end waits for the send stream (kiln_pipe_rank_flush), so a
 * slot is free again when its tag recurs a step later.
 *
 * Sent now (a communicator with send_now, comm ops version 6, on a device
 * whose memory is the host's and which runs host functions): the stage's
 * stream itself hands the tensor to the transport when that need not wait
 * (kiln-gloo: the shared-memory channel to the peer has room for the whole
 * message), so the receiver has it as the pass ends, without a wake-up of
 * the send stream's thread and a copy on it first.  Otherwise (no room,
 * or an earlier message to that peer still queued: messages stay in
 * order) the stage's stream copies it into the slot and the send stream
 * sends it from there, waiting as it may.  The send stream gets a host
 * function per message either way, which does nothing for one already
 * sent.
 *
 * Paired (rank_sendrecv, a communicator with sendrecv, comm ops version
 * 7): where the executor's next hand-offs of a stage are a send to a
 * stage and a recv from that same stage, with no work between (1f1b's
 * steady state: an activation forward, then the gradient back from the
 * same stage), and that stage pairs the same two messages the other way
 * (core/pipe_run.c, kiln_pipe_pairs_plan), both go as one sendrecv on the
 * stage's stream, from the tensor itself: the stream waits there for the
 * recv anyway, and the two halves progress together, so neither waits for
 * the other (NCCL: one group).  No copy into the slot, no send stream in
 * between.  The pair's send must not pass an earlier message to that
 * stage still on the send stream: the stage's stream first waits for the
 * event recorded on the send stream after the last one (`last`), long
 * passed in the steady state.  That wait ends: the peer receives those
 * messages before its mirror pair, each alone (a message the send stream
 * sent is in no pair of the peer's).  Where the peer did not mirror the
 * pair (two crossing tensors each way: this pair's recv of gradient e0
 * and the peer's pair's recv of activation e0 after its send of
 * gradient e1), the two waits held each other until [dist] timeout.  On the CPU the send stream's thread is still woken once a pair,
 * as an unpaired send wakes it (pair_wake: the stage's passes keep their
 * core under load with it, not without).
 *
 * The staged evaluation (core/dist_pipe_eval.c) hands its crossing tensors
 * on through here too: its receives marked in micro-batch 0's forward
 * slots (kiln_pipe_rank_eval_recv), its sends on the stage's stream
 * (kiln_pipe_rank_eval_send: neither staged nor paired, see there), both
 * named by the evaluation's batch. */
#include "dist.h" /* kiln_device_host_fn */
#include "pipeline.h"

#include <stdatomic.h>

struct kiln_pipe_rank;

struct rank_msg {
	void *stage;   /* device memory: the tensor's copy being sent */
	size_t bytes;
	void *copied;  /* event: the copy is in stage (sent now: the attempt made;
			* paired: the pair enqueued, pair_wake) */
	void *sent;    /* event, on the send stream: the message is out */
	/* sent now: what the stage's stream sends, and whether it left the
	 * message to the send stream (written before `copied`) */
	struct kiln_pipe_rank *R;
	const void *buf;
	int from, to, deferred;
	uint64_t tag;
	/* a slot received into (the enqueuing thread's, for the marks and
	 * kiln_pipe_rank_explain): from stage rfrom, paired with the send of
	 * rsend where rpaired (rank_sendrecv); reval: the staged evaluation's
	 * (kiln_pipe_rank_eval_recv) */
	int rfrom, rto, rpaired, reval;
	uint64_t rtag, rsend;
	long long rbatch; /* reval: the evaluation's batch (its messages name it) */
	void *rstream; /* the stage's stream it was marked on (recv_failed_other) */
	uint64_t tok;  /* a shared tensor's message (kiln_pipe_rank_share): the
			* tag sent, or the one received */
};

struct kiln_pipe_rank {
	const struct kiln_comm_ops *ops;
	void *comm;
	struct kiln_device *dev;
	int rank_of[KILN_PIPE_MAX_STAGES];  /* stage s's rank in comm */
	int world_of[KILN_PIPE_MAX_STAGES]; /* ... and in the world: what messages name */
	void *send_stream, *flushed;
	int n, n_xfer, P;
	struct rank_msg *msg;
	int now; /* messages sent now where they can be (above) */
	/* per stage: messages to it left to the send stream, not yet sent */
	atomic_int queued[KILN_PIPE_MAX_STAGES];
	long n_now, n_late; /* messages sent now / by the send stream (the stage's thread's) */
	/* per stage: 1 + the slot of the last message to it given to the
	 * send stream this step, 0 none (the enqueuing thread's) */
	int last[KILN_PIPE_MAX_STAGES];
	int pairs;          /* the communicator has sendrecv */
	int mine;           /* this rank's stage (the log lines name it) */
	/* a send's failure was named on the stream (send_try, send_late):
	 * the status later calls on that stream report is that one, which
	 * rank_send must not name again as its own message's.  Never reset:
	 * a failed hand-off ends the run (the trainer returns its status and
	 * nothing steps this transport again), so nothing after it needs its
	 * own failures named; a caller that retried after a failure would
	 * have to clear it first, or its next failures would go unnamed. */
	atomic_int send_named;
	/* receives marked on the stage's stream (a device whose memory is the
	 * host's and which runs host functions: the CPU): recv_mark_begin and
	 * recv_mark_end around each, so that recv_open is 1 + the slot of the
	 * receive that started and has not finished, 0 none.  A stream stops
	 * running host functions at its first failure, so after a receive
	 * that failed on the stream's worker it stays that receive's
	 * (kiln_pipe_rank_explain). */
	int marks;
	atomic_int recv_open;
	char peers[96]; /* the other stages' world ranks, for messages */
	long n_send, n_pair; /* sends, and those paired with a recv (enqueued) */
	/* kiln_pipe_rank_share: which of training's n_shared crossing
	 * tensors' activations and gradients the ranks share (NULL: none) */
	const unsigned char *shared;
	int n_shared;
	/* per stage: every message to it is a token (send_direct) */
	unsigned char direct[KILN_PIPE_MAX_STAGES];
};

/* A message's place in the step, for errors, from its tag (pipe_impl.h's
 * pipe_tag: micro-batch, crossing tensor, direction): "micro-batch 1,
 * crossing tensor 0 (its gradient)". */
static const char *tag_name(uint64_t tag, char *buf, size_t n)
{
	snprintf(buf, n, "micro-batch %llu, crossing tensor %llu (%s)",
		 (unsigned long long)(tag >> 32), (unsigned long long)((tag & 0xffffffffu) >> 1),
		 tag & 1 ? "its gradient, backward" : "the activation, forward");
	return buf;
}

/* A staged evaluation's message (its one forward hand-off of crossing
 * tensor e, in the slot of micro-batch 0's) by the evaluation's batch:
 * "batch 17, crossing tensor 0 (the activation, forward)". */
static const char *eval_name(long long batch, uint64_t tag, char *buf, size_t n)
{
	snprintf(buf, n, "batch %lld, crossing tensor %llu (the activation, forward)", batch,
		 (unsigned long long)((tag & 0xffffffffu) >> 1));
	return buf;
}

/* A received message's name: the evaluation's by batch, else by tag. */
static const char *recv_name(const struct rank_msg *g, char *buf, size_t n)
{
	return g->reval ? eval_name(g->rbatch, g->rtag, buf, n) : tag_name(g->rtag, buf, n);
}

static kiln_status probe_ok(void *arg)
{
	(void)arg;
	return KILN_OK;
}

/* Whether stream has failed: an enqueue on a stream that stopped at a
 * failure reports it (a no-op host function, on the failure path alone).
 * The calling thread's message is kept: the probe's is dropped. */
static int stream_failed(struct kiln_pipe_rank *R, void *stream)
{
	char keep[KILN_ERROR_MAX];
	snprintf(keep, sizeof keep, "%s", kiln_last_error());
	const kiln_status st = kiln_device_host_fn(R->dev, stream, probe_ok, NULL);
	if (st)
		kiln_error(st, "%s", keep);
	return st != KILN_OK;
}

/* 1 + the slot of a receive other than own (NULL: any) that started on
 * the stage's stream (R->marks), did not finish, and whose stream has
 * failed; 0 none.  A failure that a call reports then is, in all
 * likelihood, that receive's (the stream stopped at it), which
 * kiln_pipe_rank_explain names rather than the call's own hand-off.  A
 * receive still under way (its stream not failed: waiting for its peer)
 * is not blamed for a failure that came from elsewhere. */
static int recv_failed_other(struct kiln_pipe_rank *R, const struct rank_msg *own)
{
	const int o = atomic_load_explicit(&R->recv_open, memory_order_acquire);
	if (o <= 0 || o > R->n || (own && o == (int)(own - R->msg) + 1))
		return 0;
	return stream_failed(R, R->msg[o - 1].rstream) ? o : 0;
}

static kiln_status explain_open(struct kiln_pipe_rank *R, kiln_status st, int open);

/* A failed send from stage `from` (this rank's) to stage `to` of message
 * `tag`, named by stage, world rank and the message's place in the step
 * (the communicator's own message names its ranks in comm: stage s is
 * rank s of a pipe's communicator, whatever its world rank).  Each
 * failure gets this context once, from whichever of its callers sees it
 * first: send_try and send_late name their own (on_stream) and say so in
 * R->send_named, since on a device that runs host functions on a
 * stream's thread the failure comes back later from another of
 * rank_send's calls (or at once, from kiln_device_host_fn on a device
 * that runs it inline), which then keeps that message rather than naming
 * a second, the message that happened to report it. */
static kiln_status send_failed(struct kiln_pipe_rank *R, kiln_status st, int from, int to,
			       uint64_t tag, int on_stream)
{
	char what[96];
	if (!on_stream && atomic_load_explicit(&R->send_named, memory_order_acquire))
		return st;
	int open;
	if (!on_stream && (open = recv_failed_other(R, NULL)))
		return explain_open(R, st, open);
	st = kiln_error_wrap(st, "pipeline: stage %d (rank %d) sending %s to stage %d (rank %d)",
			     from, R->world_of[from], tag_name(tag, what, sizeof what), to,
			     R->world_of[to]);
	if (on_stream)
		atomic_store_explicit(&R->send_named, 1, memory_order_release);
	return st;
}

/* On the stage's stream: the message out now if the transport need not
 * wait and nothing to that stage is queued before it, else into its slot
 * for the send stream (send_late).
 *
 * The host functions here go through kiln_device_host_fn, not the
 * device's KILN_PROC_HOST_FN_SKIP (which kiln-gloo and kiln-mpi use to
 * give a job slot back): a failed stream that passes one of them leaves
 * nothing that anyone waits for (checked in session 48).  send_try
 * skipped takes nothing (queued[] is raised only when it runs); send_late
 * skipped after a send_try that ran leaves queued[to] raised, which only
 * makes later send_try calls leave their messages to the send stream, and
 * that stream has failed (its error stops the step at
 * kiln_pipe_rank_flush, and a failed stream stays failed: the run ends);
 * send_direct and probe_ok hold nothing; recv_mark_end skipped leaves
 * recv_open naming the receive the stream stopped at, on purpose
 * (kiln_pipe_rank_explain).  The staging slots and events are R's, freed
 * with it after the send stream drained (kiln_pipe_rank_free).  A skip
 * function would be needed by a host function that hands something back
 * (a slot, a count some thread waits on): none here does. */
static kiln_status send_try(void *arg)
{
	struct rank_msg *g = arg;
	struct kiln_pipe_rank *R = g->R;
	int sent = 0;
	if (!atomic_load_explicit(&R->queued[g->to], memory_order_acquire)) {
		kiln_status st = R->ops->send_now(R->comm, g->buf, g->bytes, KILN_U8,
						  R->rank_of[g->to], 0, &sent);
		if (st)
			return send_failed(R, st, g->from, g->to, g->tag, 1);
	}
	g->deferred = !sent;
	if (sent) {
		R->n_now++;
		return KILN_OK;
	}
	R->n_late++;
	memcpy(g->stage, g->buf, g->bytes);
	atomic_fetch_add_explicit(&R->queued[g->to], 1, memory_order_release);
	return KILN_OK;
}

/* On the send stream, after send_try: a message it left, sent from its slot. */
static kiln_status send_late(void *arg)
{
	struct rank_msg *g = arg;
	struct kiln_pipe_rank *R = g->R;
	int sent = 0;
	if (!g->deferred)
		return KILN_OK;
	kiln_status st = R->ops->send_now(R->comm, g->stage, g->bytes, KILN_U8, R->rank_of[g->to],
					  1, &sent);
	atomic_fetch_sub_explicit(&R->queued[g->to], 1, memory_order_release);
	return st ? send_failed(R, st, g->from, g->to, g->tag, 1) : KILN_OK;
}

/* rank_send's way when sending now is possible (its failures named by
 * rank_send, send_try's and send_late's by themselves: send_failed) */
static kiln_status send_now_or_late(struct kiln_pipe_rank *R, struct rank_msg *g, int from,
				    int to, uint64_t tag, const void *buf, void *stream)
{
	kiln_status st;
	g->R = R, g->buf = buf, g->from = from, g->to = to, g->tag = tag;
	if ((st = kiln_device_host_fn(R->dev, stream, send_try, g)) ||
	    (st = kiln_device_event_record(R->dev, g->copied, stream)) ||
	    (st = kiln_device_stream_wait(R->dev, R->send_stream, g->copied)) ||
	    (st = kiln_device_host_fn(R->dev, R->send_stream, send_late, g)))
		return st;
	return kiln_device_event_record(R->dev, g->sent, R->send_stream);
}

static struct rank_msg *rank_slot(struct kiln_pipe_rank *R, uint64_t tag)
{
	const int i = kiln_pipe_tag_slot(tag, R->n_xfer, R->n);
	return i < 0 ? NULL : &R->msg[i];
}

void kiln_pipe_rank_share(struct kiln_pipe_rank *R, const unsigned char *shared, int n_xfer,
			  unsigned direct)
{
	R->shared = shared;
	R->n_shared = n_xfer;
	for (int s = 0; s < R->P; s++)
		R->direct[s] = R->now && n_xfer == R->n_xfer && (direct >> s & 1) && s != R->mine &&
			       R->ops->version >= 8 && R->ops->p2p_buffered &&
			       R->ops->p2p_buffered(R->comm, R->rank_of[s]) >= sizeof(uint64_t);
}

/* On the stage's stream: a token out at once, waiting only for room in
 * the transport's buffer (p2p_buffered: a shared-memory channel, where 24
 * bytes always find room in practice).  Where every message to the stage
 * is a token (R->direct), none is ever left to the send stream, so none
 * can be passed: the send stream, and the wake-up of its thread per
 * message, are not needed.  No deadlock: a send that waits for room waits
 * for the receiver's reading of earlier tokens, never for a receive to be
 * posted (which a rendezvous transport would: there R->direct is 0). */
static kiln_status send_direct(void *arg)
{
	struct rank_msg *g = arg;
	struct kiln_pipe_rank *R = g->R;
	int sent = 0;
	kiln_status st = R->ops->send_now(R->comm, &g->tok, sizeof g->tok, KILN_U8,
					  R->rank_of[g->to], 1, &sent);
	if (st)
		return send_failed(R, st, g->from, g->to, g->tag, 1);
	R->n_now++;
	return KILN_OK;
}

/* A message whose tensor the ranks share (pipe_window.c): its buffer and
 * size become its slot's token, the tag (the bytes are in place already;
 * the message says they are written, and orders the reads after the
 * writes).  Training's hand-offs only: the staged evaluation's plans
 * share nothing. */
static void as_token(struct kiln_pipe_rank *R, uint64_t tag, const void **buf, size_t *bytes)
{
	const uint64_t e = (tag & 0xffffffffu) >> 1;
	struct rank_msg *g;
	if (!R->shared || e >= (uint64_t)R->n_shared || !R->shared[2 * e + (tag & 1)] ||
	    !(g = rank_slot(R, tag)))
		return;
	g->tok = tag;
	*buf = &g->tok;
	*bytes = sizeof g->tok;
}

static kiln_status rank_send(void *ctx, int from, int to, uint64_t tag, const void *buf,
			     size_t bytes, void *stream)
{
	struct kiln_pipe_rank *R = ctx;
	struct rank_msg *g = rank_slot(R, tag);
	kiln_status st;
	char what[96];
	as_token(R, tag, &buf, &bytes);
	if (!g)
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d (rank %d) sends message %llx to stage %d (rank %d) out of range",
				  from, R->world_of[from], (unsigned long long)tag, to, R->world_of[to]);
	if (g->stage && g->bytes != bytes) {
		/* (training's sizes never change; any other caller's) the
		 * slot's last send may still read it on the send stream: the
		 * flush orders the next step's streams after it, not the host */
		if ((st = kiln_device_event_sync(R->dev, g->sent)))
			return kiln_error_wrap(st, "pipeline: stage %d (rank %d): the last send from the staging slot of %zu bytes for %s to stage %d (rank %d), before it holds %zu",
					       from, R->world_of[from], g->bytes,
					       tag_name(tag, what, sizeof what), to, R->world_of[to], bytes);
		kiln_device_free(R->dev, g->stage);
		g->stage = NULL;
	}
	if (!g->stage) { /* first use of the slot (or another size) */
		if ((st = kiln_device_alloc(R->dev, bytes ? bytes : 1, &g->stage)))
			return kiln_error_wrap(st, "pipeline: stage %d (rank %d): the staging slot of %zu bytes for %s to stage %d (rank %d)",
					       from, R->world_of[from], bytes,
					       tag_name(tag, what, sizeof what), to, R->world_of[to]);
		g->bytes = bytes;
	}
	R->n_send++;
	if (buf == &g->tok && R->direct[to]) {
		g->from = from, g->to = to, g->tag = tag;
		if ((st = kiln_device_host_fn(R->dev, stream, send_direct, g)))
			return send_failed(R, st, from, to, tag, 0);
		return KILN_OK;
	}
	R->last[to] = (int)(g - R->msg) + 1;
	if (R->now) {
		if ((st = send_now_or_late(R, g, from, to, tag, buf, stream)))
			return send_failed(R, st, from, to, tag, 0);
		return KILN_OK;
	}
	if ((st = kiln_device_copy_async(R->dev, g->stage, buf, bytes, KILN_COPY_D2D, stream)) ||
	    (st = kiln_device_event_record(R->dev, g->copied, stream)) ||
	    (st = kiln_device_stream_wait(R->dev, R->send_stream, g->copied)) ||
	    (st = R->ops->send(R->comm, g->stage, bytes, KILN_U8, R->rank_of[to], R->send_stream,
			       g->sent)))
		return send_failed(R, st, from, to, tag, 0);
	return KILN_OK;
}

/* On the stage's stream, before and after a receive (R->marks). */
static kiln_status recv_mark_begin(void *arg)
{
	struct rank_msg *g = arg;
	atomic_store_explicit(&g->R->recv_open, (int)(g - g->R->msg) + 1, memory_order_release);
	return KILN_OK;
}

static kiln_status recv_mark_end(void *arg)
{
	struct rank_msg *g = arg;
	atomic_store_explicit(&g->R->recv_open, 0, memory_order_release);
	return KILN_OK;
}

/* The receive of tag from stage `from` (into stage `to`, this rank's;
 * paired: with the send of stag; batch >= 0: the staged evaluation's, of
 * that batch) marked begun on stream, or NULL: not marked (R->marks 0, or
 * the mark's own enqueue failed, which the receive's enqueue will
 * report). */
static struct rank_msg *recv_mark(struct kiln_pipe_rank *R, int from, int to, uint64_t tag,
				  int paired, uint64_t stag, long long batch, void *stream)
{
	struct rank_msg *g = R->marks ? rank_slot(R, tag) : NULL;
	if (!g)
		return NULL;
	g->rfrom = from, g->rto = to, g->rtag = tag, g->rpaired = paired, g->rsend = stag;
	g->reval = batch >= 0;
	g->rbatch = batch;
	g->rstream = stream;
	return kiln_device_host_fn(R->dev, stream, recv_mark_begin, g) ? NULL : g;
}

/* The receive of tag from stage `from` into stage `to`'s buf, marked
 * (recv_mark), its failure named (batch >= 0: the evaluation's,
 * "evaluating: receiving batch B, ..."). */
static kiln_status recv_marked(struct kiln_pipe_rank *R, int from, int to, uint64_t tag, void *buf,
			       size_t bytes, long long batch, void *stream)
{
	char what[96];
	struct rank_msg *g = recv_mark(R, from, to, tag, 0, 0, batch, stream);
	kiln_status st = R->ops->recv(R->comm, buf, bytes, KILN_U8, R->rank_of[from], stream, NULL);
	if (!st && g)
		st = kiln_device_host_fn(R->dev, stream, recv_mark_end, g);
	int open;
	if (st && (open = recv_failed_other(R, rank_slot(R, tag))))
		return explain_open(R, st, open);
	if (st)
		return kiln_error_wrap(st, "pipeline: stage %d (rank %d) %sreceiving %s (%zu bytes) from stage %d (rank %d)",
				       to, R->world_of[to], batch >= 0 ? "evaluating: " : "",
				       batch >= 0 ? eval_name(batch, tag, what, sizeof what)
						  : tag_name(tag, what, sizeof what),
				       bytes, from, R->world_of[from]);
	return KILN_OK;
}

static kiln_status rank_recv(void *ctx, int from, int to, uint64_t tag, void *buf, size_t bytes,
			     void *stream)
{
	const void *b = buf;
	as_token(ctx, tag, &b, &bytes);
	return recv_marked(ctx, from, to, tag, (void *)b, bytes, -1, stream);
}

/* The staged evaluation's message tag: crossing tensor e in micro-batch
 * 0's forward slot (pipe_impl.h's pipe_tag), which must exist: a slot that
 * does not would leave the receive unmarked, unexplained. */
static kiln_status eval_tag(struct kiln_pipe_rank *R, const char *what, int e, long long batch,
			    uint64_t *tag)
{
	if (!R)
		return kiln_error(KILN_EINTERNAL, "pipeline: an evaluation's %s without stages on ranks",
				  what);
	*tag = (uint64_t)e << 1;
	if (e < 0 || batch < 0 || !rank_slot(R, *tag))
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d (rank %d) evaluating: %s of batch %lld, crossing tensor %d: the transport has slots for %d crossing tensors (training's)",
				  R->mine, R->world_of[R->mine], what, batch, e, R->n_xfer);
	return KILN_OK;
}

kiln_status kiln_pipe_rank_eval_recv(struct kiln_pipe_rank *R, int from, int e, long long batch,
				     void *buf, size_t bytes, void *stream)
{
	uint64_t tag = 0;
	kiln_status st = eval_tag(R, "receive", e, batch, &tag);
	return st ? st : recv_marked(R, from, R->mine, tag, buf, bytes, batch, stream);
}

/* The evaluation's send goes on the stage's stream itself, by the
 * communicator's send, neither staged nor paired (docs/pipeline.md,
 * "Stages on ranks"): its forward is a chain from stage 0 to the
 * last, so a send that waits for its receiver never holds a receive that
 * the receiver waits for (what staging prevents in 1f1b), and no stage
 * ever receives from the stage it just sent to (what pairing joins).
 * Earlier messages to the peer are out: the step's end (kiln_pipe_rank_flush)
 * made the stage's stream wait for the send stream. */
kiln_status kiln_pipe_rank_eval_send(struct kiln_pipe_rank *R, int to, int e, long long batch,
				     const void *buf, size_t bytes, void *stream)
{
	uint64_t tag = 0;
	char what[96];
	kiln_status st = eval_tag(R, "send", e, batch, &tag);
	if (st)
		return st;
	if (to <= R->mine || to >= R->P)
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d (rank %d) evaluating: a send to stage %d, not a later stage",
				  R->mine, R->world_of[R->mine], to);
	if (!(st = R->ops->send(R->comm, buf, bytes, KILN_U8, R->rank_of[to], stream, NULL)))
		return KILN_OK;
	/* (a failure the enqueue reports may be an earlier receive's, on
	 * the stage's stream: named as rank_send names it) */
	int open = recv_failed_other(R, NULL);
	if (open)
		return explain_open(R, st, open);
	return kiln_error_wrap(st, "pipeline: stage %d (rank %d) evaluating: sending %s (%zu bytes) to stage %d (rank %d)",
			       R->mine, R->world_of[R->mine], eval_name(batch, tag, what, sizeof what),
			       bytes, to, R->world_of[to]);
}

/* After a pair on the stage's stream (a device that runs host functions
 * there: the CPU), the send stream's thread woken once, as an unpaired
 * send wakes it (send_late): a host function that does nothing, after the
 * pair.  Without it a paired stage's passes stretched to 2-4x their CPU
 * time whenever other processes wanted the cores (the stage's thread
 * preempted; 974 against 2,829 samples/s unpaired, kiln-gloo, batch 256,
 * load 7); with it they run as unpaired passes do (docs/PERFORMANCE.md,
 * "Session 21: pipeline hand-offs on Zen 4").  Why a sibling thread's
 * wake-up keeps the stage's thread on its core is the scheduler's (Linux
 * 6.18 here, EEVDF with autogroups); the wake-up is measured, not derived.
 * The slot's `copied` event is free for it: a paired send does not use
 * its slot. */
static kiln_status pair_wake(struct kiln_pipe_rank *R, struct rank_msg *g, void *stream)
{
	kiln_status st;
	if ((st = kiln_device_event_record(R->dev, g->copied, stream)) ||
	    (st = kiln_device_stream_wait(R->dev, R->send_stream, g->copied)))
		return st;
	return kiln_device_host_fn(R->dev, R->send_stream, probe_ok, NULL);
}

/* A send to stage peer and the recv from it after, as one sendrecv on the
 * stage's stream (the head comment, "Paired"); only with the
 * communicator's sendrecv (R->pairs: rank_ops, not rank_alone_ops). */
static kiln_status rank_sendrecv(void *ctx, int me, int peer, uint64_t stag, const void *sbuf,
				 size_t sbytes, uint64_t rtag, void *rbuf, size_t rbytes,
				 void *stream)
{
	struct kiln_pipe_rank *R = ctx;
	kiln_status st;
	char sw[96], rw[96];
	if (!rank_slot(R, stag))
		return kiln_error(KILN_EINTERNAL, "pipeline: stage %d (rank %d) sends message %llx to stage %d (rank %d) out of range",
				  me, R->world_of[me], (unsigned long long)stag, peer, R->world_of[peer]);
	/* after the earlier messages to peer that the send stream sends
	 * (which the peer receives alone, before its half of this pair) */
	if (R->last[peer] &&
	    (st = kiln_device_stream_wait(R->dev, stream, R->msg[R->last[peer] - 1].sent)))
		return send_failed(R, st, me, peer, stag, 0);
	const void *rb = rbuf;
	as_token(R, stag, &sbuf, &sbytes);
	as_token(R, rtag, &rb, &rbytes);
	rbuf = (void *)rb;
	struct rank_msg *g = recv_mark(R, peer, me, rtag, 1, stag, -1, stream);
	st = R->ops->sendrecv(R->comm, sbuf, sbytes, R->rank_of[peer], rbuf, rbytes,
			      R->rank_of[peer], KILN_U8, stream, NULL);
	if (!st && g)
		st = kiln_device_host_fn(R->dev, stream, recv_mark_end, g);
	if (!st && R->marks)
		st = pair_wake(R, rank_slot(R, stag), stream);
	int open;
	if (st && (open = recv_failed_other(R, rank_slot(R, rtag))))
		return explain_open(R, st, open);
	if (st)
		return kiln_error_wrap(st, "pipeline: stage %d (rank %d) sending %s to and receiving %s from stage %d (rank %d)",
				       me, R->world_of[me], tag_name(stag, sw, sizeof sw),
				       tag_name(rtag, rw, sizeof rw), peer, R->world_of[peer]);
	R->n_send++;
	R->n_pair++;
	return KILN_OK;
}

static const struct kiln_stage_transport_ops rank_ops = { rank_send, rank_recv, rank_sendrecv };
/* A communicator without sendrecv (comm ops version < 7): nothing pairs,
 * so the executor holds no send and the pairs' plan has none to make. */
static const struct kiln_stage_transport_ops rank_alone_ops = { rank_send, rank_recv, NULL };

/* [pipeline] sendrecv = auto, the one place of its rule: pair on kiln-mpi
 * (1.19-1.68x the samples/s of unpaired hand-offs on a quiet machine,
 * 1.3-1.5x under load, measured when it had no send_now and each unpaired
 * send was the send stream's; session 33 gave it one) and kiln-nccl (one NCCL group is what NCCL asks of a
 * send and a recv that must progress together); not on kiln-gloo (even
 * on a quiet machine, 3-5x slower under load on its shared-memory
 * channels and on TCP alike: docs/PERFORMANCE.md, "Session 13: pipeline
 * sendrecv") nor on a communicator not measured. */
int kiln_pipe_pair_auto(const char *comm)
{
	return comm && (!strcmp(comm, "mpi") || !strcmp(comm, "nccl"));
}

kiln_status kiln_pipe_rank_open(const struct kiln_comm_ops *ops, void *comm,
				struct kiln_device *dev, int P, int mine, const int *rank_of,
				const int *world_of, int M, int n_xfer, struct kiln_pipe_rank **out,
				struct kiln_stage_transport *tr)
{
	kiln_status st;
	*out = NULL;
	if (ops->version < 4 || !ops->send || !ops->recv)
		return kiln_error(KILN_ENOTSUP, "pipeline stages on ranks need point-to-point send and recv (comm ops version 4); this communicator has version %u",
				  ops->version);
	if (P > KILN_PIPE_MAX_STAGES)
		return kiln_error(KILN_EINVAL, "pipeline: %d stages (at most %d)", P, KILN_PIPE_MAX_STAGES);
	if (mine < 0 || mine >= P)
		return kiln_error(KILN_EINVAL, "pipeline: stage %d of %d on this rank", mine, P);
	struct kiln_pipe_rank *R = calloc(1, sizeof *R);
	if (!R)
		return kiln_error(KILN_ENOMEM, "out of memory");
	R->ops = ops;
	R->comm = comm;
	R->dev = dev;
	R->mine = mine;
	R->P = P;
	memcpy(R->rank_of, rank_of, (size_t)P * sizeof *rank_of);
	memcpy(R->world_of, world_of, (size_t)P * sizeof *world_of);
	R->n_xfer = n_xfer;
	R->n = 2 * M * n_xfer;
	for (int s = 0, at = 0; s < P && at < (int)sizeof R->peers - 24; s++)
		if (s != mine)
			at += snprintf(R->peers + at, sizeof R->peers - (size_t)at, "%s%d (stage %d)",
				       at ? ", " : "", world_of[s], s);
	R->now = ops->version >= 6 && ops->send_now &&
		 (kiln_device_traits(dev)->caps & KILN_DEVICE_HOST_MEMORY) &&
		 kiln_device_proc(dev, KILN_PROC_HOST_FN);
	R->pairs = ops->version >= 7 && ops->sendrecv;
	/* (on a device with streams of its own, a host function would hold
	 * its stream; there no receive is marked) */
	R->marks = (kiln_device_traits(dev)->caps & KILN_DEVICE_HOST_MEMORY) &&
		   kiln_device_proc(dev, KILN_PROC_HOST_FN);
	if (R->n && !(R->msg = calloc((size_t)R->n, sizeof *R->msg))) {
		free(R);
		return kiln_error(KILN_ENOMEM, "out of memory");
	}
	for (int i = 0; i < R->n; i++)
		R->msg[i].R = R;
	*out = R;
	if ((st = kiln_device_stream_create(dev, &R->send_stream)) ||
	    (st = kiln_device_event_create(dev, &R->flushed)))
		return kiln_error_wrap(st, "pipeline: stage %d (rank %d): the send stream", mine,
				       world_of[mine]);
	for (int i = 0; i < R->n; i++)
		if ((st = kiln_device_event_create(dev, &R->msg[i].copied)) ||
		    (st = kiln_device_event_create(dev, &R->msg[i].sent)))
			return kiln_error_wrap(st, "pipeline: stage %d (rank %d): event %d of the %d of its messages (%d micro-batches x %d crossing tensors x 2 directions)",
					       mine, world_of[mine], i, R->n, M, n_xfer);
	*tr = (struct kiln_stage_transport){ R->pairs ? &rank_ops : &rank_alone_ops, R };
	return KILN_OK;
}

kiln_status kiln_pipe_rank_flush(struct kiln_pipe_rank *R, void *stream)
{
	kiln_status st = kiln_device_event_record(R->dev, R->flushed, R->send_stream);
	/* the next step's stages start after this stream, so after every send */
	memset(R->last, 0, sizeof R->last);
	if (!st)
		st = kiln_device_stream_wait(R->dev, stream, R->flushed);
	/* (a send's failure on the send stream named itself: send_failed;
	 * another, an enqueued send's or recv's, is the communicator's) */
	int open = st ? recv_failed_other(R, NULL) : 0;
	if (open)
		st = explain_open(R, st, open);
	else if (st && !atomic_load_explicit(&R->send_named, memory_order_acquire))
		st = kiln_error_wrap(st, "pipeline: stage %d (rank %d): at the step's end, its hand-offs with stages on ranks %s",
				     R->mine, R->world_of[R->mine], R->peers);
	return st;
}

kiln_status kiln_pipe_rank_explain(struct kiln_pipe_rank *R, kiln_status st)
{
	const int open = R && st ? recv_failed_other(R, NULL) : 0;
	return open ? explain_open(R, st, open) : st;
}

/* st wrapped with the receive in slot open - 1 (recv_failed_other's). */
static kiln_status explain_open(struct kiln_pipe_rank *R, kiln_status st, int open)
{
	const struct rank_msg *g = &R->msg[open - 1];
	char what[96], named[128], sent[128] = "";
	recv_name(g, what, sizeof what);
	/* a receive that failed where rank_recv or rank_sendrecv saw it
	 * (inline: a device that runs host functions at once) is named */
	snprintf(named, sizeof named, "receiving %s", what);
	if (strstr(kiln_last_error(), named))
		return st;
	if (g->rpaired) {
		char s[96];
		snprintf(sent, sizeof sent, " (paired with sending %s)",
			 tag_name(g->rsend, s, sizeof s));
	}
	return kiln_error_wrap(st, "pipeline: stage %d (rank %d) %sreceiving %s from stage %d (rank %d)%s: started on the stage's stream and not finished",
			       g->rto, R->world_of[g->rto], g->reval ? "evaluating: " : "", what,
			       g->rfrom, R->world_of[g->rfrom], sent);
}

/* stage 0's rank receives each other stage's n doubles in stage order on
 * the send stream; the others send theirs (nothing else is in flight) */
static kiln_status gather_run(struct kiln_pipe_rank *R, int P, int mine, int n, double *d)
{
	const size_t bytes = (size_t)n * sizeof(double);
	kiln_status st = KILN_OK;
	for (int s = 1; s < P && !st; s++) {
		if (mine == 0)
			st = R->ops->recv(R->comm, d + (size_t)s * (size_t)n, bytes, KILN_U8, R->rank_of[s],
					  R->send_stream, NULL);
		else if (mine == s)
			st = R->ops->send(R->comm, d + (size_t)s * (size_t)n, bytes, KILN_U8,
					  R->rank_of[0], R->send_stream, NULL);
	}
	if (!st)
		st = kiln_device_stream_sync(R->dev, R->send_stream);
	return st ? kiln_error_wrap(st, "pipeline: stage %d (rank %d) gathering the stages' busy times",
				    mine, R->world_of[mine])
		  : KILN_OK;
}

kiln_status kiln_pipe_rank_gather(struct kiln_pipe_rank *R, int P, int mine, const double *vals,
				  int n, double *all)
{
	const size_t bytes = (size_t)P * (size_t)n * sizeof(double);
	double *d = NULL;
	kiln_status st = kiln_device_alloc(R->dev, bytes, (void **)&d);
	if (st)
		return st;
	for (int i = 0; i < P * n; i++)
		all[i] = 0;
	for (int i = 0; i < n; i++)
		all[mine * n + i] = vals[i];
	if (!(st = kiln_device_copy_async(R->dev, d, all, bytes, KILN_COPY_H2D, R->send_stream)) &&
	    !(st = gather_run(R, P, mine, n, d)) &&
	    !(st = kiln_device_copy_async(R->dev, all, d, bytes, KILN_COPY_D2H, R->send_stream)))
		st = kiln_device_stream_sync(R->dev, R->send_stream);
	kiln_device_free(R->dev, d);
	return st;
}

void kiln_pipe_rank_drain(struct kiln_pipe_rank *R)
{
	if (R && R->send_stream)
		(void)kiln_device_stream_sync(R->dev, R->send_stream);
}

void kiln_pipe_rank_free(struct kiln_pipe_rank *R)
{
	if (!R)
		return;
	if (R->send_stream)
		kiln_device_stream_sync(R->dev, R->send_stream);
	if (R->now && (R->n_now || R->n_late))
		kiln_log(KILN_LOG_INFO, "pipeline", "stage %d (this rank): %ld crossing tensors sent by the stage's stream at once, %ld by the send stream (no room in the channel, or one queued before)",
			 R->mine, R->n_now, R->n_late);
	if (R->pairs && R->n_send)
		kiln_log(KILN_LOG_INFO, "pipeline", "stage %d (this rank): %ld of %ld crossing tensors sent paired with the recv from the same stage after them, in one sendrecv",
			 R->mine, R->n_pair, R->n_send);
	for (int i = 0; i < R->n; i++) {
		kiln_device_event_destroy(R->dev, R->msg[i].copied);
		kiln_device_event_destroy(R->dev, R->msg[i].sent);
		kiln_device_free(R->dev, R->msg[i].stage);
	}
	kiln_device_event_destroy(R->dev, R->flushed);
	kiln_device_stream_destroy(R->dev, R->send_stream);
	free(R->msg);
	free(R);
}
