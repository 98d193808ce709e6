/* core/dist_pipe_ckpt.c - [dist] pipeline = P: a checkpoint written with
 * no rank holding the whole model (docs/pipeline.md, "Checkpoints per
 * stage"; docs/checkpoints.md).
 *
 * Rank 0 writes the file, the same bytes as kiln_ckpt_save of the whole
 * model (so a 2-stage checkpoint resumes on 1 or 4 stages): the
 * parameters and each optimizer slot go to the file in pieces of
 * KILN_CKPT_PIECE_BYTES, each piece's part in stage s's slice copied from
 * rank 0's own slice (s = 0) or received from world rank s (stage s's
 * rank in pipe 0), which sends the same pieces in the same order from its
 * own slice.  Rank 0 holds one piece more than its stage's: a device
 * buffer the receives land in and the host buffer the file is written
 * from (before session 12 it gathered every stage's parameters and
 * optimizer state whole first).  The layer buffers (batchnorm's running
 * statistics, whole on every rank) reach rank 0's first, stage by stage;
 * the counters are every rank's alike.  The other pipes' ranks send
 * nothing: their stages' state is pipe 0's.
 *
 * A failure of rank 0's write (a directory it cannot create, a full disk)
 * reaches the senders at once (session 13): before each of its parts a
 * sender receives a token from rank 0, "go" (rank 0 is about to receive
 * it), and after its last one the outcome, "done" or "abort" with rank
 * 0's message; a failed write ends in "abort" tokens to every sender in
 * place of the go tokens it still waits for.  Then every rank (every
 * pipe's) agrees on the outcome, so all return an error naming rank 0,
 * the file and the cause; the file stays as kiln_ckpt_save_src leaves it
 * (the old one intact, the temporary removed).
 *
 * That agreement, kiln_dist_ckpt_agree, is also the end of the gathered
 * write of ranks holding the whole model (core/train_ckpt.c trainer_ckpt_write:
 * DDP, ZeRO-1), one step for every multi-rank checkpoint.  Every failure
 * path ends in it (session 14): a rank's local preparation (the comm
 * stream's event here, ZeRO-1's buffer of the whole state there) is
 * agreed on first (kiln_dist_ckpt_ready), before any exchange a failed
 * rank would leave waiting; a failure of rank 0 during the exchange (its
 * receives of the layer buffers, its piece buffer, the write) ends in the
 * outcome tokens (send_outcome); and none of these steps allocates: the
 * tokens live in the communicator (d->tok_d, d->tok_h). */
#include "dist_impl.h"
#include "pipeline.h"
#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "../plugins/common/cache_file.h" /* common_mkdirs */

#define PIECE KILN_CKPT_PIECE_BYTES

/* rank 0 to a sender: before each part, after the last one (in the
 * communicator's d->tok_d / d->tok_h: no allocation) */
enum { TOKEN_BYTES = DIST_TOKEN_BYTES, TOKEN_GO = 1, TOKEN_DONE = 2, TOKEN_ABORT = 3 };
struct token {
	int32_t code;
	char msg[TOKEN_BYTES - 4]; /* TOKEN_ABORT: rank 0's message */
};

struct pipe_src {
	struct kiln_dist *d;
	void *compute;
	float *recv;      /* rank 0: device floats of a piece, the receives' */
	void *go;         /* rank 0: a device token TOKEN_GO (d->tok_d) */
	const char *fail; /* the stage whose piece failed (messages) */
};

int kiln_dist_ckpt_fault(const struct kiln_dist *d, const char *step)
{
	const char *v = getenv("KILN_TEST_CKPT_FAIL");
	const size_t n = strlen(step);
	if (!d || !v || strncmp(v, step, n) || (v[n] && v[n] != '@'))
		return 0;
	return d->env.rank == (v[n] ? atoi(v + n + 1) : 0);
}

/* The fault KILN_TEST_CKPT_FAIL injects (kiln_dist_ckpt_fault): a device
 * error of `what`. */
static kiln_status fault(const char *what)
{
	return kiln_error(KILN_EDEVICE, "%s: failed (the tests' fault: KILN_TEST_CKPT_FAIL=%s)", what,
			  getenv("KILN_TEST_CKPT_FAIL"));
}

kiln_status kiln_dist_ckpt_fault_at(const struct kiln_dist *d, const char *step, const char *what)
{
	return kiln_dist_ckpt_fault(d, step) ? fault(what) : KILN_OK;
}

/* The section's slot (-1: "params", -2: neither). */
static int slot_of(const struct kiln_model *m, const char *tag)
{
	if (!strcmp(tag, "params"))
		return -1;
	for (int k = 0; k < m->state_slots; k++)
		if (!strcmp(tag, m->optim_info.slot_names[k]))
			return k;
	return -2;
}

/* This rank's device floats of section `k` (slot_of) at the whole model's
 * float offset `at`, inside its stage's slice. */
static float *local(struct kiln_dist *d, int k, size_t at)
{
	const int s = d->pipe_stage;
	const size_t lo = d->pipe_lo[s], n = d->pipe_hi[s] > lo ? d->pipe_hi[s] - lo : 0;
	return k < 0 ? d->m->params_d + at : d->pipe_state + (size_t)k * n + (at - lo);
}

static int src_owns(void *ctx, const char *tag)
{
	struct pipe_src *ps = ctx;
	return slot_of(ps->d->m, tag) >= -1;
}

/* Rank 0: `bytes` from world rank s into device `dst`, after a go token
 * to it. */
static kiln_status take_part(struct pipe_src *ps, int s, void *dst, size_t bytes)
{
	struct kiln_dist *d = ps->d;
	kiln_status st = d->ops->send(d->ctx, ps->go, TOKEN_BYTES, KILN_U8, s, ps->compute, NULL);
	return st ? st : d->ops->recv(d->ctx, dst, bytes, KILN_U8, s, ps->compute, NULL);
}

/* Rank 0: bytes [off, off + n) of section `tag` into host: each stage's
 * part of the piece from its slice, zeros between the slices. */
static kiln_status src_read(void *ctx, const char *tag, size_t off, void *host, size_t n)
{
	struct pipe_src *ps = ctx;
	struct kiln_dist *d = ps->d;
	const int k = slot_of(d->m, tag);
	const size_t f0 = off / 4, f1 = (off + n) / 4;
	kiln_status st = KILN_OK;
	memset(host, 0, n);
	for (int s = 0; s < d->pipe_P && !st; s++) {
		const size_t a = f0 > d->pipe_lo[s] ? f0 : d->pipe_lo[s];
		const size_t b = f1 < d->pipe_hi[s] ? f1 : d->pipe_hi[s];
		float *dst = (float *)host + (a - f0);
		if (a >= b)
			continue;
		if (s == d->pipe_stage) {
			st = kiln_device_copy_async(d->dev, dst, local(d, k, a), (b - a) * 4,
						    KILN_COPY_D2H, ps->compute);
			continue;
		}
		if ((st = take_part(ps, s, ps->recv, (b - a) * 4)) ||
		    (st = kiln_device_copy_async(d->dev, dst, ps->recv, (b - a) * 4, KILN_COPY_D2H,
						 ps->compute)))
			st = kiln_error_wrap(st, "checkpoint: receiving stage %d's '%s' [%zu, %zu) from rank %d",
					     s, tag, a, b, s);
	}
	if (!st)
		st = kiln_device_stream_sync(d->dev, ps->compute);
	return st ? kiln_dist_explain(d, st) : st;
}

/* A sender: the next token from rank 0 into d->tok_h. */
static kiln_status token_recv(struct kiln_dist *d, void *compute)
{
	struct token *tok = d->tok_h;
	kiln_status st = d->ops->recv(d->ctx, d->tok_d, TOKEN_BYTES, KILN_U8, 0, compute, NULL);
	if (!st)
		st = kiln_device_copy_async(d->dev, tok, d->tok_d, TOKEN_BYTES, KILN_COPY_D2H, compute);
	if (!st)
		st = kiln_device_stream_sync(d->dev, compute);
	tok->msg[sizeof tok->msg - 1] = 0;
	return st;
}

/* A sender: `bytes` of device `src` to rank 0 after its go token (none
 * after an abort: rank 0's outcome came in its place).  what, a, b: the
 * part in messages. */
static kiln_status give_part(struct kiln_dist *d, void *compute, const void *src, size_t bytes,
			     const char *what, size_t a, size_t b)
{
	const struct token *tok = d->tok_h;
	kiln_status st = token_recv(d, compute);
	if (st)
		return kiln_error_wrap(st, "checkpoint: rank %d waiting for rank 0 to take stage %d's %s [%zu, %zu)",
				       d->env.rank, d->pipe_stage, what, a, b);
	if (tok->code == TOKEN_GO &&
	    (st = d->ops->send(d->ctx, src, bytes, KILN_U8, 0, compute, NULL)))
		return kiln_error_wrap(st, "checkpoint: rank %d sending stage %d's %s [%zu, %zu) to rank 0",
				       d->env.rank, d->pipe_stage, what, a, b);
	return KILN_OK;
}

/* Stage s > 0's rank in pipe 0: its stage's layer buffers (running
 * statistics), then its parts of rank 0's pieces in the order rank 0
 * writes them ("params", then each slot), each after rank 0's go token;
 * then rank 0's outcome (d->tok_h: TOKEN_DONE, or TOKEN_ABORT with its
 * message, whenever it comes). */
static kiln_status send_parts(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	const int s = d->pipe_stage;
	const size_t lo = d->pipe_lo[s], hi = d->pipe_hi[s], bytes = m->n_trainable * 4;
	struct token *tok = d->tok_h;
	kiln_status st = KILN_OK;
	tok->code = TOKEN_GO;
	for (int i = 0; i < m->n_params && !st && tok->code == TOKEN_GO; i++) {
		const struct model_param *q = &m->params[i];
		if (q->buffer && kiln_pipe_param_stage(m, q) == s)
			st = give_part(d, compute, m->buffers_d + q->off, (size_t)q->numel * 4, q->name,
				       0, (size_t)q->numel);
	}
	for (int k = -1; k < m->state_slots && !st && tok->code == TOKEN_GO; k++)
		for (size_t off = 0; off < bytes && !st && tok->code == TOKEN_GO; off += PIECE) {
			const size_t f0 = off / 4, f1 = (off + (bytes - off < PIECE ? bytes - off : PIECE)) / 4;
			const size_t a = f0 > lo ? f0 : lo, b = f1 < hi ? f1 : hi;
			if (a < b)
				st = give_part(d, compute, local(d, k, a), (b - a) * 4,
					       k < 0 ? "params" : m->optim_info.slot_names[k], a, b);
		}
	/* (an abort came in place of a go token: no outcome follows) */
	if (!st && tok->code == TOKEN_GO && (st = token_recv(d, compute)))
		st = kiln_error_wrap(st, "checkpoint: rank %d waiting for rank 0's outcome", d->env.rank);
	if (!st && tok->code != TOKEN_DONE && tok->code != TOKEN_ABORT)
		st = kiln_error(KILN_EIO, "checkpoint: rank %d: rank 0 sent token %d, not a checkpoint's outcome",
				d->env.rank, (int)tok->code);
	if (!st)
		st = kiln_device_stream_sync(d->dev, compute);
	return st ? kiln_dist_explain(d, st) : st;
}

/* Rank 0: every stage's layer buffers (running statistics) into its own,
 * from stage s's rank in pipe 0, each after a go token. */
static kiln_status buffers_to_rank0(struct pipe_src *ps)
{
	struct kiln_dist *d = ps->d;
	struct kiln_model *m = d->m;
	kiln_status st = KILN_OK;
	if (kiln_dist_ckpt_fault(d, "buffers"))
		return fault("checkpoint: receiving the stages' layer buffers");
	for (int i = 0; i < m->n_params && !st; i++) {
		const struct model_param *q = &m->params[i];
		const int s = kiln_pipe_param_stage(m, q);
		if (!q->buffer || !s)
			continue;
		if ((st = take_part(ps, s, m->buffers_d + q->off, (size_t)q->numel * 4)))
			st = kiln_error_wrap(st, "checkpoint: stage %d's buffer '%s' to rank 0", s, q->name);
	}
	return st ? kiln_dist_explain(d, st) : st;
}

int kiln_dist_pipe_ckpt_streams(const struct kiln_dist *d)
{
	return d && d->pipe_P && d->pipe_own && !d->zero && d->pipe_pbuf && !d->pipe_pwhole &&
	       d->m && d->m->n_elems == d->m->n_trainable && !d->m->state_d;
}

/* Rank 0: the outcome (st: TOKEN_ABORT with this rank's message, the last
 * error) to every sender, in place of the go tokens it still waits for
 * or after its last part.  No allocation: every failure path ends here. */
static kiln_status send_outcome(struct kiln_dist *d, kiln_status st, void *compute)
{
	struct token *out = d->tok_h;
	char why[TOKEN_BYTES - 4] = "";
	if (st)
		snprintf(why, sizeof why, "%s", kiln_last_error());
	/* (after the last go token's send: the host token is rewritten) */
	kiln_status st2 = kiln_device_stream_sync(d->dev, compute);
	out->code = st ? TOKEN_ABORT : TOKEN_DONE;
	snprintf(out->msg, sizeof out->msg, "%s", why);
	if (!st2)
		st2 = kiln_device_copy_async(d->dev, d->tok_d, out, TOKEN_BYTES, KILN_COPY_H2D, compute);
	for (int s = 1; s < d->pipe_P && !st2; s++)
		st2 = d->ops->send(d->ctx, d->tok_d, TOKEN_BYTES, KILN_U8, s, compute, NULL);
	if (!st2)
		st2 = kiln_device_stream_sync(d->dev, compute);
	if (st) /* (this rank's failure is the one to report) */
		return kiln_error(st, "%s", why);
	return st2;
}

/* Rank 0: the stages' layer buffers, then create dir and write the file,
 * each stage's part of a piece received after a go token to its rank;
 * then the outcome to every sender (send_outcome), whatever failed. */
static kiln_status write_file(struct kiln_dist *d, const char *dir,
			      const struct kiln_ckpt_meta *meta, void *compute, char *path,
			      size_t path_len)
{
	struct kiln_model *m = d->m;
	struct pipe_src ps = { d, compute, NULL, d->tok_d, NULL };
	struct kiln_ckpt_src src = { &ps, src_owns, src_read, m->n_trainable * sizeof(float) };
	struct token *go = d->tok_h;
	kiln_status st;
	go->code = TOKEN_GO;
	go->msg[0] = 0;
	if ((st = kiln_device_copy_async(d->dev, ps.go, go, TOKEN_BYTES, KILN_COPY_H2D, compute)) ||
	    (st = buffers_to_rank0(&ps)))
		;
	else if (kiln_dist_ckpt_fault(d, "alloc"))
		st = fault("a receive buffer of a piece");
	else if ((st = kiln_device_alloc(d->dev, PIECE, (void **)&ps.recv)))
		st = kiln_error_wrap(st, "a receive buffer of %zu KiB", (size_t)PIECE / 1024);
	else if (common_mkdirs(dir, 0777, 1))
		st = kiln_error(KILN_EIO, "%s: cannot create: %s", dir, strerror(errno));
	else
		st = kiln_ckpt_save_src(dir, meta, m, compute, &src, path, path_len);
	st = send_outcome(d, st, compute);
	kiln_device_free(d->dev, ps.recv);
	return st;
}

/* This rank in messages: "rank R" or "rank R (pipeline stage S)". */
static void who(const struct kiln_dist *d, char *buf, size_t n)
{
	if (d->pipe_P)
		snprintf(buf, n, "rank %d (pipeline stage %d)", d->env.rank, d->pipe_stage);
	else
		snprintf(buf, n, "rank %d", d->env.rank);
}

int kiln_dist_ckpt_ready(struct kiln_dist *d, kiln_status *st, void *compute)
{
	double failed = *st != KILN_OK;
	char mine[TOKEN_BYTES];
	kiln_status st2;
	if (!d)
		return !*st;
	const int64_t t0 = kiln_now_ns();
	if (*st)
		snprintf(mine, sizeof mine, "%s", kiln_last_error());
	st2 = kiln_dist_sum_host(d, &failed, 1, compute);
	kiln_log(KILN_LOG_DEBUG, "dist", "rank %d: checkpoint: preparation agreed in %.1f us (%g rank(s) failed)",
		 d->env.rank, 1e-3 * (double)(kiln_now_ns() - t0), failed);
	if (st2) {
		*st = *st ? kiln_error(*st, "%s", mine) : st2;
		return 0;
	}
	if (*st)
		*st = kiln_error(*st, "%s", mine);
	return failed == 0;
}

/* Rank 0's token to every rank (a broadcast of d->tok_h through
 * d->tok_d: no allocation). */
static kiln_status token_broadcast(struct kiln_dist *d, void *compute)
{
	kiln_status st;
	if ((st = kiln_dist_zero_settle(d, compute)) ||
	    (st = kiln_device_copy_async(d->dev, d->tok_d, d->tok_h, TOKEN_BYTES, KILN_COPY_H2D,
					 compute)) ||
	    (st = d->ops->broadcast(d->ctx, d->tok_d, TOKEN_BYTES, KILN_U8, 0, compute, NULL)) ||
	    (st = kiln_device_copy_async(d->dev, d->tok_h, d->tok_d, TOKEN_BYTES, KILN_COPY_D2H,
					 compute)) ||
	    (st = kiln_device_stream_sync(d->dev, compute)))
		return kiln_dist_explain(d, st);
	return KILN_OK;
}

kiln_status kiln_dist_ckpt_agree(struct kiln_dist *d, kiln_status st, const char *dir,
				 int64_t step, void *compute)
{
	struct token *tok;
	char mine[TOKEN_BYTES], me[64];
	double failed = st != KILN_OK;
	kiln_status st2;
	if (!d)
		return st;
	const int64_t t0 = kiln_now_ns();
	tok = d->tok_h;
	who(d, me, sizeof me);
	/* (a sender's "rank 0 could not write it" names this rank already) */
	if (st && dist_names_rank(d, kiln_last_error()))
		snprintf(mine, sizeof mine, "%s", kiln_last_error());
	else if (st)
		snprintf(mine, sizeof mine, "%s: checkpoint %s/ckpt-%lld.kiln: %s", me, dir,
			 (long long)step, kiln_last_error());
	/* rank 0's cause, the others' message when it failed */
	tok->code = st && !d->env.rank ? TOKEN_ABORT : TOKEN_DONE;
	snprintf(tok->msg, sizeof tok->msg, "%s", st && !d->env.rank ? kiln_last_error() : "");
	if ((st2 = kiln_dist_sum_host(d, &failed, 1, compute)))
		return st ? kiln_error(st, "%s", mine) : st2;
	if (failed > 0) { /* (every rank sees the same sum: all or none broadcast) */
		double ack = 0;
		st2 = token_broadcast(d, compute);
		/* every rank holds rank 0's token before rank 0 can leave (its
		 * communicator closes as it exits: the broadcast's receive
		 * failed "closed by peer"): a trailing sum, its own failure no
		 * matter to a rank that has the token */
		if (!st2)
			(void)kiln_dist_sum_host(d, &ack, 1, compute);
		d->agreed = !st2;
	}
	tok->msg[sizeof tok->msg - 1] = 0;
	kiln_log(KILN_LOG_DEBUG, "dist", "%s: checkpoint %s/ckpt-%lld.kiln: outcome agreed in %.1f us (%g rank(s) failed)",
		 me, dir, (long long)step, 1e-3 * (double)(kiln_now_ns() - t0), failed);
	if (st)
		return kiln_error(st, "%s", mine);
	if (st2 || failed == 0)
		return st2;
	if (tok->code == TOKEN_ABORT)
		return kiln_error(KILN_EIO, "%s: checkpoint %s/ckpt-%lld.kiln: rank 0 could not write it: %s",
				  me, dir, (long long)step, tok->msg);
	return kiln_error(KILN_EIO, "%s: checkpoint %s/ckpt-%lld.kiln: not written: %g other rank(s) failed (their messages say why)",
			  me, dir, (long long)step, failed);
}

/* Stage s's rank in pipe 0: ready to exchange (point-to-point on the
 * compute stream after the comm stream's collectives). */
static kiln_status pipe_prepare(struct kiln_dist *d, void *compute)
{
	kiln_status st = KILN_OK;
	if (kiln_dist_ckpt_fault(d, "event"))
		st = fault("the comm stream's event");
	else if (d->comm_stream &&
		 !(st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)))
		st = kiln_device_stream_wait(d->dev, compute, d->ready);
	return st ? kiln_error_wrap(st, "checkpoint: ordering the exchange after the comm stream") : st;
}

kiln_status kiln_dist_pipe_ckpt_save(struct kiln_dist *d, kiln_status st, const char *dir,
				     const struct kiln_ckpt_meta *meta, void *compute, char *path,
				     size_t path_len)
{
	const int r = d->env.rank;
	const long long step = meta->trainer.step;
	size_t live = 0, peak = 0;
	/* every failure from here on ends in the agreement: first each
	 * rank's local preparation, agreed on before any exchange */
	if (r < d->pipe_P && !st)
		st = pipe_prepare(d, compute);
	if (!kiln_dist_ckpt_ready(d, &st, compute) || r >= d->pipe_P)
		return kiln_dist_ckpt_agree(d, st, dir, step, compute);
	/* (another pipe's rank sends nothing: pipe 0 holds the same state) */
	if (!r)
		st = write_file(d, dir, meta, compute, path, path_len);
	else if (!(st = send_parts(d, compute)) && ((struct token *)d->tok_h)->code == TOKEN_ABORT)
		st = kiln_error(KILN_EIO, "rank %d (pipeline stage %d): checkpoint %s/ckpt-%lld.kiln: rank 0 could not write it: %s",
				r, d->pipe_stage, dir, step, ((struct token *)d->tok_h)->msg);
	kiln_device_mem(d->dev, &live, &peak);
	if ((st = kiln_dist_ckpt_agree(d, st, dir, step, compute)))
		return st;
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): checkpoint %s in pieces of %zu KiB, nothing gathered whole: device memory live %zu bytes, peak so far %zu",
		 r, d->pipe_stage, r ? "sent to rank 0" : "written", PIECE / 1024, live, peak);
	return KILN_OK;
}

int kiln_dist_pipe_resumes(const struct kiln_dist *d)
{
	return d && d->pipe_P && d->pipe_cut && d->m && d->m->held && !d->zero;
}

/* This rank's stage from `file`: its parameters and optimizer slots'
 * slice, the buffers and counters. */
static kiln_status load_own(struct kiln_dist *d, const char *file, struct kiln_ckpt *given,
			    void *compute)
{
	const int s = d->pipe_stage;
	struct kiln_ckpt *ck = given;
	kiln_status st = ck ? KILN_OK : kiln_ckpt_open(file, &ck);
	if (!st)
		st = kiln_ckpt_load_stage(ck, d->m, compute, d->pipe_lo[s], d->pipe_hi[s],
					  d->pipe_own ? d->pipe_state : NULL, KILN_CKPT_LOAD_ALL);
	if (ck != given)
		kiln_ckpt_close(ck);
	return st;
}

kiln_status kiln_dist_pipe_resume(struct kiln_dist *d, const char *file, struct kiln_ckpt *ck,
				  void *compute)
{
	const int r = d->env.rank, s = d->pipe_stage;
	size_t live = 0, peak = 0;
	kiln_status st = load_own(d, file, ck, compute), st2;
	char mine[KILN_ERROR_MAX];
	double failed = st != KILN_OK;
	if (st)
		snprintf(mine, sizeof mine, "%s", kiln_last_error());
	/* every rank learns whether one failed: none trains from a mixed state */
	if ((st2 = kiln_dist_sum_host(d, &failed, 1, compute)))
		return st ? kiln_error(st, "rank %d (pipeline stage %d): resuming the stage from %s: %s", r,
				       s, file, mine)
			  : st2;
	if (st)
		return kiln_error(st, "rank %d (pipeline stage %d): resuming the stage from %s: %s", r, s,
				  file, mine);
	if (failed > 0)
		return kiln_error(KILN_EDATA, "rank %d (pipeline stage %d): %g other rank(s) could not resume their stage from %s (their messages say why)",
				  r, s, failed, file);
	kiln_device_mem(d->dev, &live, &peak);
	kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): resumed the stage's slice [%zu, %zu) alone from %s, nothing read whole: device memory live %zu bytes, peak so far %zu",
		 r, s, d->pipe_lo[s], d->pipe_hi[s], file, live, peak);
	return KILN_OK;
}
