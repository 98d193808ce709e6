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
 * nothing: their stages' state is pipe 0's. */
#include "dist_impl.h"
#include "pipeline.h"
#include "checkpoint.h"

#define PIECE KILN_CKPT_PIECE_BYTES

struct pipe_src {
	struct kiln_dist *d;
	void *compute;
	float *recv;      /* rank 0: device floats of a piece, the receives' */
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
		if ((st = d->ops->recv(d->ctx, ps->recv, (b - a) * 4, KILN_U8, s, ps->compute, NULL)) ||
		    (st = kiln_device_copy_async(d->dev, dst, ps->recv, (b - a) * 4, KILN_COPY_D2H,
						 ps->compute)))
			st = kiln_error_wrap(st, "checkpoint: receiving stage %d's '%s' [%zu, %zu) from rank %d",
					     s, tag, a, b, s);
	}
	if (!st)
		st = kiln_device_stream_sync(d->dev, ps->compute);
	return st ? kiln_dist_explain(d, st) : st;
}

/* Stage s > 0's rank in pipe 0: its parts of rank 0's pieces, in the
 * order rank 0 writes them ("params", then each slot). */
static kiln_status send_slices(struct kiln_dist *d, void *compute)
{
	struct kiln_model *m = d->m;
	const int s = d->pipe_stage;
	const size_t lo = d->pipe_lo[s], hi = d->pipe_hi[s], bytes = m->n_trainable * 4;
	kiln_status st = KILN_OK;
	for (int k = -1; k < m->state_slots && !st; k++)
		for (size_t off = 0; off < bytes && !st; off += PIECE) {
			const size_t f0 = off / 4, f1 = (off + (bytes - off < PIECE ? bytes - off : PIECE)) / 4;
			const size_t a = f0 > lo ? f0 : lo, b = f1 < hi ? f1 : hi;
			if (a < b && (st = d->ops->send(d->ctx, local(d, k, a), (b - a) * 4, KILN_U8, 0,
							compute, NULL)))
				st = kiln_error_wrap(st, "checkpoint: rank %d sending stage %d's %s [%zu, %zu) to rank 0",
						     d->env.rank, s, k < 0 ? "params" : m->optim_info.slot_names[k],
						     a, b);
		}
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

kiln_status kiln_dist_pipe_ckpt_save(struct kiln_dist *d, const char *dir,
				     const struct kiln_ckpt_meta *meta, void *compute, char *path,
				     size_t path_len)
{
	struct kiln_model *m = d->m;
	const int r = d->env.rank;
	struct pipe_src ps = { d, compute, NULL, NULL };
	struct kiln_ckpt_src src = { &ps, src_owns, src_read, m->n_trainable * sizeof(float) };
	size_t live = 0, peak = 0;
	kiln_status st;
	if (r >= d->pipe_P) /* (another pipe's: pipe 0 holds the same state) */
		return KILN_OK;
	/* (point-to-point on the compute stream after the comm stream's) */
	if (d->comm_stream && ((st = kiln_device_event_record(d->dev, d->ready, d->comm_stream)) ||
			       (st = kiln_device_stream_wait(d->dev, compute, d->ready))))
		return st;
	if ((st = buffers_to_rank0(d, compute)))
		return st;
	if (r) {
		st = send_slices(d, compute);
	} else {
		if ((st = kiln_device_alloc(d->dev, PIECE, (void **)&ps.recv)))
			return st;
		st = kiln_ckpt_save_src(dir, meta, m, compute, &src, path, path_len);
		kiln_device_free(d->dev, ps.recv);
	}
	kiln_device_mem(d->dev, &live, &peak);
	if (!st)
		kiln_log(KILN_LOG_INFO, "dist", "rank %d (pipeline stage %d): checkpoint %s in pieces of %zu KiB, nothing gathered whole: device memory live %zu bytes, peak so far %zu",
			 r, d->pipe_stage, r ? "sent to rank 0" : "written", PIECE / 1024, live, peak);
	return st;
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
