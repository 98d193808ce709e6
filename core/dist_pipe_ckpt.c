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
 * write of ranks holding the whole model (core/train_ckpt.c ckpt_write:
 * DDP, ZeRO-1), one step for every multi-rank checkpoint. */
#include "dist_impl.h"
#include "pipeline.h"
#include "checkpoint.h"

#include <errno.h>
#include <stdio.h>

#include "../plugins/common/cache_file.h" /* common_mkdirs */

#define PIECE KILN_CKPT_PIECE_BYTES

/* rank 0 to a sender: before each part, after the last one */
enum { TOKEN_BYTES = 1024, TOKEN_GO = 1, TOKEN_DONE = 2, TOKEN_ABORT = 3 };
struct token {
	int32_t code;
	char msg[TOKEN_BYTES - 4]; /* TOKEN_ABORT: rank 0's message */
};

struct pipe_src {
	struct kiln_dist *d;
	void *compute;
	float *recv;      /* rank 0: device floats of a piece, the receives' */
	void *go;         /* rank 0: a device token TOKEN_GO */
	const char *fail; /* the stage whose piece failed (messages) */
};

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
		if ((st = d->ops->send(d->ctx, ps->go, TOKEN_BYTES, KILN_U8, s, ps->compute, NULL)) ||
		    (st = d->ops->recv(d->ctx, ps->recv, (b - a) * 4, KILN_U8, s, ps->compute, NULL)) ||
		    (st = kiln_device_copy_async(d->dev, dst, ps->recv, (b - a) * 4, KILN_COPY_D2H,
						 ps->compute)))
			st = kiln_error_wrap(st, "checkpoint: receiving stage %d's '%s' [%zu, %zu) from rank %d",
					     s, tag, a, b, s);
	}
	if (!st)
		st = kiln_device_stream_sync(d->dev, ps->compute);
	return st ? kiln_dist_explain(d, st) : st;
}

/* A sender: the next token from rank 0 into *tok (tok_d: its device
 * buffer). */
static kiln_status token_recv(struct kiln_dist *d, void *tok_d, struct token *tok, void *compute)
{
	kiln_status st = d->ops->recv(d->ctx, tok_d, TOKEN_BYTES, KILN_U8, 0, compute, NULL);
	if (!st)
		st = kiln_device_copy_async(d->dev, tok, tok_d, TOKEN_BYTES, KILN_COPY_D2H, compute);
	if (!st)
		st = kiln_device_stream_sync(d->dev, compute);
	tok->msg[sizeof tok->msg - 1] = 0;
	return st;
}

/* Stage s > 0's rank in pipe 0: its parts of rank 0's pieces, in the
 * order rank 0 writes them ("params", then each slot), each after rank
 * 0's go token; then rank 0's outcome (*tok: TOKEN_DONE, or TOKEN_ABORT
 * with its message, whenever it comes). */
static kiln_status send_slices(struct kiln_dist *d, void *compute, void *tok_d, struct token *tok)
{
	struct kiln_model *m = d->m;
	const int s = d->pipe_stage;
	const size_t lo = d->pipe_lo[s], hi = d->pipe_hi[s], bytes = m->n_trainable * 4;
	kiln_status st = KILN_OK;
	tok->code = TOKEN_GO;
	for (int k = -1; k < m->state_slots && !st && tok->code == TOKEN_GO; k++)
		for (size_t off = 0; off < bytes && !st && tok->code == TOKEN_GO; off += PIECE) {
			const size_t f0 = off / 4, f1 = (off + (bytes - off < PIECE ? bytes - off : PIECE)) / 4;
			const size_t a = f0 > lo ? f0 : lo, b = f1 < hi ? f1 : hi;
			if (a >= b)
				continue;
			if ((st = token_recv(d, tok_d, tok, compute)))
				st = kiln_error_wrap(st, "checkpoint: rank %d waiting for rank 0 to take stage %d's %s [%zu, %zu)",
						     d->env.rank, s, k < 0 ? "params" : m->optim_info.slot_names[k],
						     a, b);
			else if (tok->code == TOKEN_GO &&
				 (st = d->ops->send(d->ctx, local(d, k, a), (b - a) * 4, KILN_U8, 0,
						    compute, NULL)))
				st = kiln_error_wrap(st, "checkpoint: rank %d sending stage %d's %s [%zu, %zu) to rank 0",
						     d->env.rank, s, k < 0 ? "params" : m->optim_info.slot_names[k],
						     a, b);
		}
	/* (an abort came in place of a go token: no outcome follows) */
	if (!st && tok->code == TOKEN_GO &&
	    (st = token_recv(d, tok_d, tok, compute)))
		st = kiln_error_wrap(st, "checkpoint: rank %d waiting for rank 0's outcome", d->env.rank);
	if (!st && tok->code != TOKEN_DONE && tok->code != TOKEN_ABORT)
		st = kiln_error(KILN_EIO, "checkpoint: rank %d: rank 0 sent token %d, not a checkpoint's outcome",
				d->env.rank, (int)tok->code);
	if (!st)
		st = kiln_device_stream_sync(d->dev, compute);
	return st ? kiln_dist_explain(d, st) : st;
}

/* Every stage's layer buffers (running statistics) into rank 0's, from
 * stage s's rank in pipe 0. */
static kiln_status buffers_to_rank0(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	const int r = d->env.rank;
	kiln_status st = KILN_OK;
	for (int i = 0; i < m->n_params && !st; i++) {
		const struct model_param *q = &m->params[i];
		const int s = kiln_pipe_stage(m, q->layer);
		float *b = m->buffers_d + q->off;
		if (!q->buffer || !s || (r && r != s))
			continue;
		st = r ? d->ops->send(d->ctx, b, (size_t)q->numel * 4, KILN_U8, 0, compute, NULL)
		       : d->ops->recv(d->ctx, b, (size_t)q->numel * 4, KILN_U8, s, compute, NULL);
		if (st)
			st = kiln_error_wrap(st, "checkpoint: stage %d's buffer '%s' to rank 0", s, q->name);
	}
	return st ? kiln_dist_explain(d, st) : st;
}

int kiln_dist_pipe_ckpt_streams(const struct kiln_dist *d)
{
	return d && d->pipe_P && d->pipe_own && !d->zero && d->pipe_pbuf && !d->pipe_pwhole &&
	       d->m && d->m->n_elems == d->m->n_trainable && !d->m->state_d;
}

/* Rank 0: create dir and write the file, each stage's part of a piece
 * received after a go token to its rank; then one token to every sender:
 * the outcome (st: TOKEN_ABORT with this rank's message, which stays the
 * last error: kiln_dist_ckpt_agree names rank 0 and the file). */
static kiln_status write_file(struct kiln_dist *d, const char *dir,
			      const struct kiln_ckpt_meta *meta, void *compute, char *path,
			      size_t path_len)
{
	struct kiln_model *m = d->m;
	struct pipe_src ps = { d, compute, NULL, NULL, NULL };
	struct kiln_ckpt_src src = { &ps, src_owns, src_read, m->n_trainable * sizeof(float) };
	static const struct token go = { TOKEN_GO, "" };
	struct token out = { TOKEN_DONE, "" };
	kiln_status st, st2 = KILN_OK;
	/* the token's buffer first and alone: without the piece's, the
	 * senders still get the abort (without this 1 KiB, nothing can reach
	 * them and they wait for [dist] timeout) */
	if ((st = kiln_device_alloc(d->dev, TOKEN_BYTES, &ps.go)))
		return st;
	if ((st = kiln_device_alloc(d->dev, PIECE, (void **)&ps.recv)))
		st = kiln_error_wrap(st, "a receive buffer of %zu KiB", (size_t)PIECE / 1024);
	else if ((st = kiln_device_copy_async(d->dev, ps.go, &go, TOKEN_BYTES, KILN_COPY_H2D,
					      compute)))
		;
	else if (common_mkdirs(dir, 0777, 1))
		st = kiln_error(KILN_EIO, "%s: cannot create: %s", dir, strerror(errno));
	else
		st = kiln_ckpt_save_src(dir, meta, m, compute, &src, path, path_len);
	/* the outcome to every sender (the go token's buffer, after the last
	 * go: the stream orders them), with the cause */
	if (st) {
		out.code = TOKEN_ABORT;
		snprintf(out.msg, sizeof out.msg, "%s", kiln_last_error());
	}
	st2 = kiln_device_stream_sync(d->dev, compute);
	if (!st2)
		st2 = kiln_device_copy_async(d->dev, ps.go, &out, TOKEN_BYTES, KILN_COPY_H2D, compute);
	for (int s = 1; s < d->pipe_P && !st2; s++)
		st2 = d->ops->send(d->ctx, ps.go, TOKEN_BYTES, KILN_U8, s, compute, NULL);
	if (!st2)
		st2 = kiln_device_stream_sync(d->dev, compute);
	if (st && st2) /* (this rank's failure is the one to report) */
		kiln_error(st, "%s", out.msg);
	kiln_device_free(d->dev, ps.recv);
	kiln_device_free(d->dev, ps.go);
	return st ? st : st2;
}

/* This rank in messages: "rank R" or "rank R (pipeline stage S)". */
static void who(const struct kiln_dist *d, char *buf, size_t n)
{
	if (d->pipe_P)
		snprintf(buf, n, "rank %d (pipeline stage %d)", d->env.rank, d->pipe_stage);
	else
		snprintf(buf, n, "rank %d", d->env.rank);
}

kiln_status kiln_dist_ckpt_agree(struct kiln_dist *d, kiln_status st, const char *dir,
				 int64_t step, void *compute)
{
	struct token tok = { TOKEN_DONE, "" };
	char mine[TOKEN_BYTES], me[64];
	double failed = st != KILN_OK;
	kiln_status st2;
	if (!d)
		return st;
	const int64_t t0 = kiln_now_ns();
	who(d, me, sizeof me);
	if (st && !d->env.rank)
		snprintf(mine, sizeof mine, "%s: checkpoint %s/ckpt-%lld.kiln: %s", me, dir,
			 (long long)step, kiln_last_error());
	else if (st)
		snprintf(mine, sizeof mine, "%s", kiln_last_error());
	/* rank 0's cause, the others' message when it failed */
	if (st && !d->env.rank) {
		tok.code = TOKEN_ABORT;
		snprintf(tok.msg, sizeof tok.msg, "%s", kiln_last_error());
	}
	if ((st2 = kiln_dist_sum_host(d, &failed, 1, compute)))
		return st ? kiln_error(st, "%s", mine) : st2;
	if (failed > 0) /* (every rank sees the same sum: all or none broadcast) */
		st2 = kiln_dist_broadcast_host(d, &tok, sizeof tok, compute);
	tok.msg[sizeof tok.msg - 1] = 0;
	kiln_log(KILN_LOG_DEBUG, "dist", "%s: checkpoint %s/ckpt-%lld.kiln: outcome agreed in %.1f us (%g rank(s) failed)",
		 me, dir, (long long)step, 1e-3 * (double)(kiln_now_ns() - t0), failed);
	if (st)
		return kiln_error(st, "%s", mine);
	if (st2 || failed == 0)
		return st2;
	if (tok.code == TOKEN_ABORT)
		return kiln_error(KILN_EIO, "%s: checkpoint %s/ckpt-%lld.kiln: rank 0 could not write it: %s",
				  me, dir, (long long)step, tok.msg);
	return kiln_error(KILN_EIO, "%s: checkpoint %s/ckpt-%lld.kiln: not written: %g other rank(s) failed (their messages say why)",
			  me, dir, (long long)step, failed);
}

kiln_status kiln_dist_pipe_ckpt_save(struct kiln_dist *d, const char *dir,
				     const struct kiln_ckpt_meta *meta, void *compute, char *path,
				     size_t path_len)
{
	const int r = d->env.rank;
	const long long step = meta->trainer.step;
	size_t live = 0, peak = 0;
	void *tok_d = NULL;
	struct token *tok = NULL;
	kiln_status st = KILN_OK;
	/* (another pipe's rank sends nothing: pipe 0 holds the same state) */
	if (r >= d->pipe_P)
		return kiln_dist_ckpt_agree(d, KILN_OK, dir, step, compute);
	/* (point-to-point on the compute stream after the comm stream's) */
	if (d->comm_stream && ((st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)) ||
			       (st = kiln_device_stream_wait(d->dev, compute, d->ready))))
		return st;
	if ((st = buffers_to_rank0(d, compute)))
		return st;
	if (!r) {
		st = write_file(d, dir, meta, compute, path, path_len);
	} else if (!(tok = calloc(1, sizeof *tok))) {
		st = kiln_error(KILN_ENOMEM, "out of memory");
	} else if (!(st = kiln_device_alloc(d->dev, TOKEN_BYTES, &tok_d)) &&
		   !(st = send_slices(d, compute, tok_d, tok)) && tok->code == TOKEN_ABORT) {
		st = kiln_error(KILN_EIO, "rank %d (pipeline stage %d): checkpoint %s/ckpt-%lld.kiln: rank 0 could not write it: %s",
				r, d->pipe_stage, dir, step, tok->msg);
	}
	kiln_device_free(d->dev, tok_d);
	free(tok);
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
static kiln_status load_own(struct kiln_dist *d, const char *file, void *compute)
{
	const int s = d->pipe_stage;
	struct kiln_ckpt *ck = NULL;
	kiln_status st = kiln_ckpt_open(file, &ck);
	if (!st)
		st = kiln_ckpt_load_stage(ck, d->m, compute, d->pipe_lo[s], d->pipe_hi[s],
					  d->pipe_own ? d->pipe_state : NULL, KILN_CKPT_LOAD_ALL);
	kiln_ckpt_close(ck);
	return st;
}

kiln_status kiln_dist_pipe_resume(struct kiln_dist *d, const char *file, void *compute)
{
	const int r = d->env.rank, s = d->pipe_stage;
	size_t live = 0, peak = 0;
	kiln_status st = load_own(d, file, compute), st2;
	char mine[1024];
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
